# The toolchain sandbox image (default cairn-toolchain:latest): the sandbox image's layout plus
# what building code needs: python3 with pip and venv, nodejs and npm, build-essential (gcc,
# g++, make, libc headers), git and curl. A request or graph node picks it by name (`image:`);
# the runner's allowed_images must list it. Built on the offline base (build-base.sh) with
# packages from Debian's mirror (apt inside the build); nothing is pulled from a registry.
# Same user (sandbox, uid/gid 10001), directories and environment as sandbox.Dockerfile, so the
# runner treats both alike.
#
# Instruction order is about build time: the legacy builder makes and commits a container for
# every instruction, which costs 15-40 s once the image holds the toolchain's ~450 MB (the
# engine's overlay diff walks every file) against ~2 s on the base. So the metadata comes
# first, on the base, and only USER follows the one RUN. The label build-images.sh records
# comes in as CAIRN_BUILD for the same reason (a --label would be one more step at the end).
ARG BASE_IMAGE=cairn-base:bookworm
FROM ${BASE_IMAGE}
ARG CAIRN_BUILD=""
LABEL cairn.build=${CAIRN_BUILD}

# As in the sandbox image; pip's version check and npm's update notice would reach out to the
# network on every call.
ENV HOME=/home/sandbox \
    LANG=C.UTF-8 \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    NPM_CONFIG_UPDATE_NOTIFIER=false
WORKDIR /workspace
CMD ["sleep", "infinity"]

# --no-install-recommends, the base's dpkg rules (no docs, man pages, locales) and the removed
# apt lists keep it small; dpkg's force-unsafe-io (no fsync per file, as Debian's own container
# images do) keeps unpacking ~400 packages quick on an overlay file system. The last line checks
# that each tool answers (python3 -m venv needs ensurepip, which python3-venv brings).
RUN set -eu; \
    export DEBIAN_FRONTEND=noninteractive; \
    t0=$(date +%s); \
    echo force-unsafe-io > /etc/dpkg/dpkg.cfg.d/cairn-unsafe-io; \
    apt-get update -qq; \
    apt-get install -y -qq --no-install-recommends \
        python3 python3-pip python3-venv nodejs npm build-essential make git curl \
        ca-certificates bash coreutils zip unzip tar gzip procps findutils grep sed passwd \
        >/dev/null; \
    echo "toolchain: apt-get install took $(( $(date +%s) - t0 ))s"; \
    rm -f /etc/dpkg/dpkg.cfg.d/cairn-unsafe-io; \
    apt-get clean; \
    rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin /var/cache/apt/archives/*.deb \
        /var/log/apt /var/log/dpkg.log; \
    groupadd --gid 10001 sandbox; \
    useradd --uid 10001 --gid 10001 --home-dir /home/sandbox --create-home \
        --shell /bin/bash sandbox; \
    mkdir -p /input /output /workspace /tmpfs; \
    chown root:root /input; chmod 0755 /input; \
    chown 10001:10001 /output /workspace /tmpfs /home/sandbox; \
    chmod 0755 /output /workspace /tmpfs /home/sandbox; \
    python3 -m pip --version >/dev/null && python3 -m venv --help >/dev/null \
        && node --version >/dev/null && npm --version >/dev/null && gcc --version >/dev/null \
        && make --version >/dev/null && git --version >/dev/null && curl --version >/dev/null

USER 10001:10001
