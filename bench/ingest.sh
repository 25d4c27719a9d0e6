#!/usr/bin/env bash
# Ingest benchmark: parser throughput on a generated 100 MB document with 10,000 blocks next to
# `openssl dgst -sha256` of the same file; end-to-end Ingest of 2,000 small blocks through
# release cairn-ingest + cairn-artifact-store on loopback next to the same writes sent straight
# to the store; and aider-chat's fence-to-files parser on the same 100 MB document (venv in
# bench/.venv, created on first run). Prints the Markdown recorded in bench/RESULTS.md.
# Usage: bash bench/ingest.sh [BYTES] [BLOCKS]   (scratch under $BENCH_DIR or /tmp)
set -euo pipefail
cd "$(dirname "$0")/.."
BYTES="${1:-100000000}"
BLOCKS="${2:-10000}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target}"
cargo build --release -q -p cairn-artifact-store -p cairn-ingest -p cairn-bench
BIN="$CARGO_TARGET_DIR/release"

WORK="$(mktemp -d -p "${BENCH_DIR:-/tmp}" cairn-ingest-bench.XXXXXX)"
PIDS=()
cleanup() {
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; done
  rm -rf "$WORK"
}
trap cleanup EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_port() { for _ in $(seq 100); do (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0; sleep 0.1; done; echo "port $1 never opened" >&2; return 1; }

echo "command: bash bench/ingest.sh $BYTES $BLOCKS  ($(date -u +%Y-%m-%dT%H:%MZ))"
echo "machine: $(nproc) cores, $(awk '/MemTotal/{printf "%.0f GiB", $2/1048576}' /proc/meminfo), $(sed -n 's/^model name\s*: //p' /proc/cpuinfo | head -1); scratch $(df -T "$WORK" | awk 'NR==2{print $2}')"
echo
"$BIN/ingest_load" gen --out "$WORK/doc.md" --bytes "$BYTES" --blocks "$BLOCKS" >/dev/null

echo "### Parser throughput ($(du -m "$WORK/doc.md" | cut -f1) MiB, $BLOCKS blocks; median of 5)"
echo
echo "| what | throughput | notes |"
echo "|---|---|---|"
"$BIN/ingest_load" parse --file "$WORK/doc.md" --reps 5 --dump "$WORK/ours.json"

VENV=bench/.venv
if [ ! -x "$VENV/bin/python" ] || ! "$VENV/bin/python" -c 'import aider' 2>/dev/null; then
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q aider-chat >/dev/null 2>&1 || echo "(aider-chat did not install)"
fi
if "$VENV/bin/python" -c 'import aider' 2>/dev/null; then
  "$VENV/bin/python" bench/python/ingest_peer.py "$WORK/doc.md" "$WORK/ours.json" 3
else
  echo "| aider-chat | not installed | peer comparison skipped |"
fi
echo

SPORT="$(free_port)"
RUST_LOG=warn "$BIN/cairn-artifact-store" --data-root "$WORK/data" --listen "127.0.0.1:$SPORT" &
PIDS+=($!)
wait_port "$SPORT"
IPORT="$(free_port)"
RUST_LOG=warn "$BIN/cairn-ingest" --listen "127.0.0.1:$IPORT" --store-addr "http://127.0.0.1:$SPORT" --max-blocks 2000 &
PIDS+=($!)
wait_port "$IPORT"
echo "### End-to-end ingest (release services on loopback; median of 5)"
echo
echo "| what | time | rate / share |"
echo "|---|---|---|"
"$BIN/ingest_load" e2e --ingest-addr "http://127.0.0.1:$IPORT" --store-addr "http://127.0.0.1:$SPORT" --blocks 2000 --reps 5
