#!/bin/sh
# Entry point of the etcd image: runs etcd with the arguments given. With CAIRN_ETCD_ONLY_USER
# set (etcd serving mutual TLS with --client-cert-auth, its certificate, key and CA in
# CAIRN_ETCD_TLS_DIR as etcd.pem, etcd.key, ca.pem), it first makes that certificate identity
# (etcd names users by the certificate's common name) the only user with access, read-write
# under CAIRN_ETCD_PREFIX, and turns etcd's authentication on: every other certificate of the
# CA is then refused. The root user gets a random password nobody keeps. /tmp/cairn-etcd-ready
# appears once this is done (the health check waits for it).
set -eu
rm -f /tmp/cairn-etcd-ready
etcd "$@" &
pid=$!
trap 'kill -TERM "$pid" 2>/dev/null' TERM INT
if [ -n "${CAIRN_ETCD_ONLY_USER:-}" ]; then
    dir="${CAIRN_ETCD_TLS_DIR:-/etc/cairn/pki}"
    prefix="${CAIRN_ETCD_PREFIX:-/cairn/orchestrator/}"
    ctl() {
        etcdctl --endpoints=https://127.0.0.1:2379 --cacert="$dir/ca.pem" \
            --cert="$dir/etcd.pem" --key="$dir/etcd.key" --command-timeout=5s "$@" >/dev/null
    }
    until ctl endpoint health 2>/dev/null; do
        kill -0 "$pid" 2>/dev/null || { wait "$pid"; exit 1; }
        sleep 0.2
    done
    # Before authentication is on, any certificate of the CA may administer etcd.
    if ctl user list 2>/dev/null; then
        role="cairn-$CAIRN_ETCD_ONLY_USER"
        ctl user add root --new-user-password="$(head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n')"
        ctl user grant-role root root
        ctl role add "$role"
        ctl role grant-permission "$role" readwrite "$prefix" --prefix=true
        ctl user add "$CAIRN_ETCD_ONLY_USER" --no-password
        ctl user grant-role "$CAIRN_ETCD_ONLY_USER" "$role"
        ctl auth enable
        echo "etcd: authentication on; only \`$CAIRN_ETCD_ONLY_USER\` may use $prefix" >&2
    fi
fi
touch /tmp/cairn-etcd-ready
status=0
wait "$pid" || status=$?
# A signal interrupts the first wait: wait for etcd itself to stop.
if kill -0 "$pid" 2>/dev/null; then wait "$pid" || status=$?; fi
exit "$status"
