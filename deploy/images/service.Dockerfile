# The service image (default cairn:latest): the prebuilt `cairn` binary on the offline base;
# one image for every service, the command picks which (`cairn serve <service> ...`).
# Nothing is compiled here: build the binary first (cargo build --release -p cairn) on a
# Debian bookworm host (the binary links the host's glibc; the base is bookworm too), then
#   deploy/images/build-images.sh --service            (context = just the binary)
# or by hand from the repository root (the context then holds target/: slow):
#   DOCKER_BUILDKIT=0 docker build -f deploy/images/service.Dockerfile -t cairn:latest .
# User cairn, uid/gid 10002 (not the sandbox's 10001), home and data directory /var/lib/cairn
# (mount a volume there: the artifact-store's data root). Services listen on 7070 (cairn's
# default port) inside the container. Few instructions on purpose: with the legacy builder each
# one costs a container commit (about 2 s on this fuse-overlayfs engine); the label
# cairn.build comes from build-images.sh.
ARG BASE_IMAGE=cairn-base:bookworm
FROM ${BASE_IMAGE}

# Path of the binary inside the build context.
ARG CAIRN_BINARY=target/release/cairn
COPY ${CAIRN_BINARY} /usr/local/bin/cairn
RUN set -eu; \
    chmod 0755 /usr/local/bin/cairn; \
    /usr/local/bin/cairn --help >/dev/null; \
    groupadd --gid 10002 cairn; \
    useradd --uid 10002 --gid 10002 --home-dir /var/lib/cairn --create-home \
        --shell /usr/sbin/nologin cairn; \
    mkdir -p /etc/cairn; \
    chmod 0750 /var/lib/cairn

# CAIRN_HEALTH_ADDR: what the health check dials (grpc.health.v1); set it when a service
# listens elsewhere (docker run -e CAIRN_HEALTH_ADDR=127.0.0.1:PORT).
ENV CAIRN_HEALTH_ADDR=127.0.0.1:7070 \
    LANG=C.UTF-8
WORKDIR /var/lib/cairn
USER 10002:10002

# Assumes the subcommand `cairn health --addr HOST:PORT`: exit 0 only when the server answers
# SERVING on grpc.health.v1, non-zero otherwise. Shell form so $CAIRN_HEALTH_ADDR is expanded.
HEALTHCHECK --interval=10s --timeout=3s --start-period=10s --retries=3 \
    CMD cairn health --addr "$CAIRN_HEALTH_ADDR" || exit 1

ENTRYPOINT ["/usr/local/bin/cairn"]
# Compose / Kubernetes give the service, e.g. ["serve", "artifact-store", "--listen", "0.0.0.0:7070"].
CMD ["--help"]
