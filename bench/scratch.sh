# Sourced by the bench scripts: `scratch NAME` makes the scratch directory $WORK (under
# $BENCH_DIR or /tmp) and, at exit, kills the processes in PIDS and removes it; `port` prints a
# free loopback port; `wait_port PORT` waits up to 10 s for something to listen there.
PIDS=()
scratch() {
  WORK="$(mktemp -d -p "${BENCH_DIR:-/tmp}" "cairn-$1.XXXXXX")"
  trap cleanup EXIT
}
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
  rm -rf "$WORK"
}
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_port() { for _ in $(seq 100); do (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return; sleep 0.1; done; echo "port $1 never opened" >&2; exit 1; }

# `tls_stores SIZE`: a PKI in $WORK/pki, an input file $WORK/input.bin of SIZE bytes, and two
# release artifact-stores on the same scratch filesystem, plaintext on $PLAIN (PIDS[0]) and
# mutual TLS on $TLS (PIDS[1]). Needs $BIN (the release binaries) and `scratch` first.
tls_stores() {
  "$BIN/cairn" certs init --out "$WORK/pki" >/dev/null 2>&1
  "$BIN/store_load" gen --out "$WORK/input.bin" --size "$1"
  PLAIN="$(port)"; TLS="$(port)"
  RUST_LOG=warn "$BIN/cairn-artifact-store" --data-root "$WORK/plain" --listen "127.0.0.1:$PLAIN" & PIDS+=($!)
  RUST_LOG=warn "$BIN/cairn-artifact-store" --data-root "$WORK/tls" --listen "127.0.0.1:$TLS" --tls-dir "$WORK/pki" & PIDS+=($!)
  wait_port "$PLAIN"; wait_port "$TLS"
}
