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

. bench/scratch.sh
scratch concurrent-bench

SP="$(port)"; OP="$(port)"
RUST_LOG=warn "$BIN/cairn-artifact-store" --data-root "$WORK/data" --listen "127.0.0.1:$SP" & PIDS+=($!)
wait_port "$SP"
EXTRA=()
[ -n "$PARALLEL" ] && EXTRA+=(--set "max_parallel_runs=$PARALLEL")
RUST_LOG=warn "$BIN/cairn-orchestrator" --listen "127.0.0.1:$OP" --store-addr "127.0.0.1:$SP" --ingest-addr "" "${EXTRA[@]}" & OPID=$!; PIDS+=($OPID)
wait_port "$OP"
echo "command: bash bench/concurrent_runs.sh $RUNS $PARALLEL  ($(date -u +%Y-%m-%dT%H:%MZ), $(nproc) cores, $(df -T "$WORK" | awk 'NR==2{print $2}') scratch)"
"$BIN/orchestrator_load" --orch "http://127.0.0.1:$OP" --store "http://127.0.0.1:$SP" --concurrent "$RUNS" --orch-pid "$OPID"
