# The toolchain sandbox image (default cairn-toolchain:latest): the sandbox image's layout plus
# what building code needs: python3 with pip and venv, nodejs and npm, build-essential (gcc,
# g++, make, libc headers), git and curl. A request or graph node picks it by name (`image:`);
# the runner's allowed_images must list it. Built on the offline base (build-base.sh) with
# packages from Debian's mirror (apt inside the build); nothing is pulled from a registry.
# Same user (sandbox, uid/gid 10001) and /input /output /workspace /tmpfs as sandbox.Dockerfile,
# so the runner treats both alike. One RUN: the legacy builder commits a layer per instruction.
ARG BASE_IMAGE=cairn-base:bookworm
FROM ${BASE_IMAGE}

# --no-install-recommends, the base's dpkg rules (no docs, man pages, locales) and the
# trimmed apt lists keep it small; the last line checks that
# each tool answers (python3 -m venv needs ensurepip, which python3-venv brings).
RUN set -eu; \
    export DEBIAN_FRONTEND=noninteractive; \
    apt-get update; \
    apt-get install -y --no-install-recommends \
        python3 python3-pip python3-venv nodejs npm build-essential make git curl \
        ca-certificates bash coreutils zip unzip tar gzip procps findutils grep sed passwd; \
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

# As in the sandbox image. pip's version check would reach out to PyPI on every call.
ENV HOME=/home/sandbox \
    LANG=C.UTF-8 \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    NPM_CONFIG_UPDATE_NOTIFIER=false

WORKDIR /workspace
USER 10001:10001
CMD ["sleep", "infinity"]
