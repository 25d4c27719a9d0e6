#!/usr/bin/env bash
# Many runs at once on one orchestrator: R runs of a 10-node graph (write_file and condition)
# submitted together and followed to their end, for each R, beside the same runs one after
# another; the orchestrator's resident memory sampled throughout (release builds, loopback).
# Usage: bash bench/concurrent_runs.sh [R,...] [MAX_PARALLEL_RUNS]   (defaults 100,1000 and the
# orchestrator's default; scratch under $BENCH_DIR or /tmp)
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS="${1:-100,1000}"
PARALLEL="${2:-}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target}"
cargo build --release -q -p cairn-artifact-store -p cairn-orchestrator -p cairn-bench
BIN="$CARGO_TARGET_DIR/release"

WORK="$(mktemp -d -p "${BENCH_DIR:-/tmp}" cairn-concurrent-bench.XXXXXX)"
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
  rm -rf "$WORK"
}
trap cleanup EXIT
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_port() { for _ in $(seq 100); do (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return; sleep 0.1; done; echo "port $1 never opened" >&2; exit 1; }

SP="$(port)"; OP="$(port)"
RUST_LOG=warn "$BIN/cairn-artifact-store" --data-root "$WORK/data" --listen "127.0.0.1:$SP" & PIDS+=($!)
wait_port "$SP"
EXTRA=()
[ -n "$PARALLEL" ] && EXTRA+=(--set "max_parallel_runs=$PARALLEL")
RUST_LOG=warn "$BIN/cairn-orchestrator" --listen "127.0.0.1:$OP" --store-addr "127.0.0.1:$SP" --ingest-addr "" "${EXTRA[@]}" & OPID=$!; PIDS+=($OPID)
wait_port "$OP"
echo "command: bash bench/concurrent_runs.sh $RUNS $PARALLEL  ($(date -u +%Y-%m-%dT%H:%MZ), $(nproc) cores, $(df -T "$WORK" | awk 'NR==2{print $2}') scratch)"
"$BIN/orchestrator_load" --orch "http://127.0.0.1:$OP" --store "http://127.0.0.1:$SP" --concurrent "$RUNS" --orch-pid "$OPID"
