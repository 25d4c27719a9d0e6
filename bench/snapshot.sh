#!/usr/bin/env bash
# Session snapshot benchmark: two cairn-sandbox-runner processes with the gvisor backend on
# loopback (A and B); per round a cold OpenSession on A (the baseline), a detached Python
# process holding MIB MiB, PauseSession on A, ResumeSession on B; then fork xFORKS on B
# (bench/src/bin/session_load.rs). Needs root, runsc and the image.
# Usage: bash bench/snapshot.sh [RUNS] [MIB] [FORKS]   (defaults 5, 100, 10)
# CAIRN_BENCH_PROFILE=dev uses debug binaries (no release build).
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS="${1:-5}"
MIB="${2:-100}"
FORKS="${3:-10}"
IMAGE="${CAIRN_BENCH_IMAGE:-cairn-sandbox:latest}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target}"
PROFILE="${CAIRN_BENCH_PROFILE:-release}"
cargo build --profile "$PROFILE" -q -p cairn-sandbox-runner -p cairn-bench --bin cairn-sandbox-runner --bin session_load
BIN="$CARGO_TARGET_DIR/$([ "$PROFILE" = dev ] && echo debug || echo "$PROFILE")"

. bench/scratch.sh
scratch snapshot-bench

start() { # NAME: starts a gvisor runner, sets ADDR
  local p
  p="$(port)"
  RUST_LOG=warn "$BIN/cairn-sandbox-runner" --listen "127.0.0.1:$p" --backend gvisor \
    --image "$IMAGE" --work-root "$WORK/$1" --runner-id "bench-$1-$$" \
    --set max_concurrent_runs=24 --set max_sessions=24 --set max.memory_bytes=1073741824 \
    --set defaults.memory_bytes=1073741824 >"$WORK/$1.log" 2>&1 &
  PIDS+=($!)
  wait_port "$p"
  ADDR="127.0.0.1:$p"
}
start a; A="$ADDR"
start b; B="$ADDR"
echo "command: bash bench/snapshot.sh $RUNS $MIB $FORKS  (profile $PROFILE; $(date -u +%Y-%m-%dT%H:%MZ); $(nproc) cores; $(runsc --version | head -1))"
echo
"$BIN/session_load" --a "$A" --b "$B" --runs "$RUNS" --mib "$MIB" --forks "$FORKS"
