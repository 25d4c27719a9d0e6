# The service image (default cairn:latest): the prebuilt `cairn` binary on the offline base;
# one image for every service, the command picks which (`cairn serve <service> ...`).
# Nothing is compiled here: build the binary first (cargo build --release -p cairn-cli) on a
# Debian bookworm host (the binary links the host's glibc; the base is bookworm too), then
#   deploy/images/build-images.sh --service            (context = just the binary)
# or by hand from the repository root (the context then holds target/: slow):
#   DOCKER_BUILDKIT=0 docker build -f deploy/images/service.Dockerfile -t cairn:latest .
# User cairn, uid/gid 10002 (not the sandbox's 10001), home and data directory /var/lib/cairn
# (mount a volume there: the artifact-store's data root). Services listen on 7070 (cairn's
# default port) inside the container.
# Order matters for rebuild time: with the legacy builder every instruction is a container
# commit (about 2 s on this fuse-overlayfs engine), so everything that does not depend on the
# binary comes first and stays cached; a new binary costs the COPY and the label
# (cairn.build, added by build-images.sh), which also checks `cairn --help` in the result.
ARG BASE_IMAGE=cairn-base:bookworm
FROM ${BASE_IMAGE}

# No skeleton files in the home: it is the store's data root, and a new named volume mounted
# there starts as a copy of it (owner included).
RUN set -eu; \
    groupadd --gid 10002 cairn; \
    useradd --uid 10002 --gid 10002 --home-dir /var/lib/cairn --no-create-home \
        --shell /usr/sbin/nologin cairn; \
    install -d -o 10002 -g 10002 -m 0750 /var/lib/cairn; \
    mkdir -p /etc/cairn

# CAIRN_HEALTH_ADDR: what the health check dials (grpc.health.v1); set it when a service
# listens elsewhere (docker run -e CAIRN_HEALTH_ADDR=127.0.0.1:PORT).
ENV CAIRN_HEALTH_ADDR=127.0.0.1:7070 \
    LANG=C.UTF-8
WORKDIR /var/lib/cairn
USER 10002:10002

# `cairn health --addr HOST:PORT` exits 0 only when the server answers SERVING on
# grpc.health.v1. Shell form so $CAIRN_HEALTH_ADDR is expanded.
HEALTHCHECK --interval=10s --timeout=3s --start-period=10s --retries=3 \
    CMD cairn health --addr "$CAIRN_HEALTH_ADDR" || exit 1

ENTRYPOINT ["/usr/local/bin/cairn"]
# Compose / Kubernetes give the service, e.g. ["serve", "artifact-store", "--listen", "0.0.0.0:7070"].
CMD ["--help"]

# Path of the binary inside the build context; its mode (0755) comes from the context (a chmod
# here would copy the binary into one more layer).
ARG CAIRN_BINARY=target/release/cairn
COPY ${CAIRN_BINARY} /usr/local/bin/cairn
