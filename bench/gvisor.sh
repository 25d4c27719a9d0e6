#!/usr/bin/env bash
# gVisor backend benchmark: python `print(1)` through two release cairn-sandbox-runner processes
# with the gvisor backend on loopback (cold, and with a pool of CAIRN_BENCH_POOL waiting
# sandboxes, default 4), each interleaved with raw `docker run --rm --network none IMAGE
# python3 -c` and raw `runsc --platform=P --network=none do python3 -c` in the same run; then
# 20 concurrent gvisor runs vs 20 concurrent raw
# `docker run --rm`. Needs root, runsc (apt-get install runsc) and the image.
# Usage: bash bench/gvisor.sh [RUNS] [IMAGE]   (defaults 30, cairn-sandbox:latest)
# CAIRN_BENCH_PROFILE=dev uses debug binaries (no release build). CAIRN_BENCH_RUNNER=PATH
# measures that cairn-sandbox-runner binary instead of this tree's (e.g. another commit's).
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS="${1:-30}"
IMAGE="${2:-cairn-sandbox:latest}"
POOL="${CAIRN_BENCH_POOL:-4}"
PLATFORM="${CAIRN_BENCH_GVISOR_PLATFORM:-ptrace}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target}"
PROFILE="${CAIRN_BENCH_PROFILE:-release}"
cargo build --profile "$PROFILE" -q -p cairn-sandbox-runner -p cairn-bench --bin cairn-sandbox-runner --bin sandbox_load
BIN="$CARGO_TARGET_DIR/$([ "$PROFILE" = dev ] && echo debug || echo "$PROFILE")"
RUNNER="${CAIRN_BENCH_RUNNER:-$BIN/cairn-sandbox-runner}"

. bench/scratch.sh
scratch gvisor-bench

start() { # NAME POOL: starts a gvisor runner, sets ADDR
  local name="$1" pool="$2" p
  p="$(port)"
  RUST_LOG=warn "$RUNNER" --listen "127.0.0.1:$p" --backend gvisor \
    --image "$IMAGE" --pool-size "$pool" --work-root "$WORK/$name" --runner-id "bench-$name-$$" \
    --set max_concurrent_runs=24 --set "gvisor_platform=$PLATFORM" >"$WORK/$name.log" 2>&1 &
  PIDS+=($!)
  for _ in $(seq 100); do (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null && break; sleep 0.1; done
  ADDR="127.0.0.1:$p"
}
start gvisor 0; GV="$ADDR"
start gvisorpool "$POOL"; GVPOOL="$ADDR"

echo "command: bash bench/gvisor.sh $RUNS $IMAGE  (runner $RUNNER; profile $PROFILE; pool_size $POOL; platform $PLATFORM; $(date -u +%Y-%m-%dT%H:%MZ); $(nproc) cores; $(runsc --version | head -1); docker $(docker version -f '{{.Server.Version}}'))"
echo
"$BIN/sandbox_load" --gvisor "$GV" --gvisor-pool "$GVPOOL" --image "$IMAGE" --runs "$RUNS" --pool "$POOL" --gvisor-platform "$PLATFORM"

# After SIGTERM: sandboxes in runsc's state and runsc processes left (want 0 and 0).
for i in 0 1; do kill "${PIDS[$i]}"; wait "${PIDS[$i]}" 2>/dev/null || true; done
LEFT="$(cat <(runsc --root "$WORK/gvisor/gvisor/state" list --quiet) <(runsc --root "$WORK/gvisorpool/gvisor/state" list --quiet) | wc -l)"
LEFT_PROCS="$( (grep -l -s "$WORK/gvisor[p/]" /proc/[0-9]*/cmdline || true) | wc -l)"
echo
echo "- gvisor runners after SIGTERM: $LEFT sandboxes in runsc state and $LEFT_PROCS runsc processes left"
