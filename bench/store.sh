#!/usr/bin/env bash
# Artifact-store benchmark: a release cairn-artifact-store on loopback, measured next to its
# baselines (dd conv=fsync, openssl dgst -sha256, a plain write+fsync+rename loop) in one run.
# Usage: bash bench/store.sh [SIZE_BYTES]   (default 1 GiB; scratch under $BENCH_DIR or /tmp)
set -euo pipefail
cd "$(dirname "$0")/.."
SIZE="${1:-1073741824}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target}"
cargo build --release -q -p cairn-artifact-store -p cairn-bench
BIN="$CARGO_TARGET_DIR/release"

WORK="$(mktemp -d -p "${BENCH_DIR:-/tmp}" cairn-store-bench.XXXXXX)"
STORE_PID=""
PC_PID=""
cleanup() {
  for pid in $STORE_PID $PC_PID; do kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; done
  rm -rf "$WORK"
}
trap cleanup EXIT

"$BIN/store_load" gen --out "$WORK/input.bin" --size "$SIZE"
PORT="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')"
PC_PORT="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')"
RUST_LOG=warn "$BIN/cairn-artifact-store" --data-root "$WORK/data" --listen "127.0.0.1:$PORT" &
STORE_PID=$!
# A second store writing large bodies through the page cache, for the side-by-side row.
CAIRN_ARTIFACT_STORE_DIRECT_IO=false RUST_LOG=warn "$BIN/cairn-artifact-store" --data-root "$WORK/data-pc" --listen "127.0.0.1:$PC_PORT" &
PC_PID=$!
for p in "$PORT" "$PC_PORT"; do
  for _ in $(seq 100); do
    (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null && break
    sleep 0.1
  done
done
echo "command: bash bench/store.sh $SIZE  ($(date -u +%Y-%m-%dT%H:%MZ), $(df -T "$WORK" | awk 'NR==2{print $2}') scratch)"
"$BIN/store_load" all --addr "http://127.0.0.1:$PORT" --page-cache-addr "http://127.0.0.1:$PC_PORT" --file "$WORK/input.bin" --work "$WORK"
