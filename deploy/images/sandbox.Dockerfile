# The sandbox image (default cairn-sandbox:latest): where untrusted, model-written code runs.
# Built on the offline base (build-base.sh) by default; with a registry, pass
#   --build-arg BASE_IMAGE=debian:bookworm-slim
# and the missing packages are installed with apt. Nothing here needs BuildKit.
# The unprivileged user every run uses is sandbox, uid/gid 10001 (the runner passes --user 10001).
# Few instructions on purpose: with the legacy builder each one costs a container commit
# (about 2 s on this fuse-overlayfs engine); the label
# cairn.build comes from build-images.sh.
ARG BASE_IMAGE=cairn-base:bookworm
FROM ${BASE_IMAGE}

# Install only what the base lacks: on cairn-base everything is present and nothing touches
# the network; on debian:bookworm-slim python3, git, zip, ... come from apt.
# /input is root's (staged read-only by the runner); /output, /workspace, /tmpfs and the home
# belong to the sandbox user. The last line checks the tools a run relies on answer.
RUN set -eu; \
    packages="python3 bash coreutils git zip unzip tar gzip ca-certificates procps findutils grep sed passwd"; \
    missing=""; \
    for p in $packages; do dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"; done; \
    if [ -n "$missing" ]; then \
        echo "installing:$missing"; \
        export DEBIAN_FRONTEND=noninteractive; \
        apt-get update; \
        apt-get install -y --no-install-recommends $missing; \
        rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin /var/cache/apt/archives/*.deb; \
    fi; \
    groupadd --gid 10001 sandbox; \
    useradd --uid 10001 --gid 10001 --home-dir /home/sandbox --create-home \
        --shell /bin/bash sandbox; \
    mkdir -p /input /output /workspace /tmpfs; \
    chown root:root /input; chmod 0755 /input; \
    chown 10001:10001 /output /workspace /tmpfs /home/sandbox; \
    chmod 0755 /output /workspace /tmpfs /home/sandbox; \
    python3 -c 'import sys' && git --version >/dev/null && zip -v >/dev/null && unzip -v >/dev/null

# Unbuffered Python so output written before a timeout or kill is not lost in a buffer;
# no .pyc files written next to code (the root filesystem is read-only at run time).
ENV HOME=/home/sandbox \
    LANG=C.UTF-8 \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1

WORKDIR /workspace
USER 10001:10001
CMD ["sleep", "infinity"]
