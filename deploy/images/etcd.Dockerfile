# The etcd image (default cairn-etcd:latest) of the compose deployment: Debian's etcd-server
# (and etcdctl, for the health check) on the offline base, packages from Debian's mirror (apt
# inside the build, as the toolchain image); nothing is pulled from a registry. Orchestrator
# replicas keep their membership leases in it ([orchestrator.cluster]); it holds nothing else,
# so its data directory may be a tmpfs. User etcd (uid/gid 10003), data in /var/lib/etcd.
# The entry point (etcd-entrypoint.sh) runs etcd with the arguments given and, when asked,
# turns etcd's authentication on so that one certificate identity alone may use it.
ARG BASE_IMAGE=cairn-base:bookworm
FROM ${BASE_IMAGE}
ARG CAIRN_BUILD=""
LABEL cairn.build=${CAIRN_BUILD}
ENV ETCDCTL_API=3 LANG=C.UTF-8
RUN set -eu; \
    export DEBIAN_FRONTEND=noninteractive; \
    echo force-unsafe-io > /etc/dpkg/dpkg.cfg.d/cairn-unsafe-io; \
    apt-get update -qq; \
    apt-get install -y -qq --no-install-recommends etcd-server etcd-client >/dev/null; \
    rm -f /etc/dpkg/dpkg.cfg.d/cairn-unsafe-io; \
    apt-get clean; \
    rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin /var/cache/apt/archives/*.deb \
        /var/log/apt /var/log/dpkg.log; \
    groupadd --gid 10003 cairn-etcd; \
    useradd --uid 10003 --gid 10003 --home-dir /var/lib/etcd --no-create-home \
        --shell /usr/sbin/nologin cairn-etcd; \
    install -d -o 10003 -g 10003 -m 0700 /var/lib/etcd; \
    etcd --version >/dev/null && etcdctl version >/dev/null
COPY etcd-entrypoint.sh /usr/local/bin/cairn-etcd
USER 10003:10003
HEALTHCHECK --interval=5s --timeout=3s --start-period=10s --retries=3 \
    CMD etcdctl --endpoints=http://127.0.0.1:2379 endpoint health >/dev/null || exit 1
ENTRYPOINT ["/usr/local/bin/cairn-etcd"]
