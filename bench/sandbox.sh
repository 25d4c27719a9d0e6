#!/usr/bin/env bash
# Sandbox-runner benchmark: python `print(1)` through four release cairn-sandbox-runner
# processes on loopback (docker cold, docker warm pool, local backend cold, local backend with
# its pool of waiting sandboxes; both pools of CAIRN_BENCH_POOL, default 4), side by side in one run
# with raw `docker run --rm`, raw `docker exec`, a bare `python3 -c`, 20/50 concurrent runs vs
# 20 concurrent raw `docker run --rm`, and the llm-sandbox package (PyPI) on the same image.
# Usage: bash bench/sandbox.sh [RUNS] [IMAGE]   (defaults 30, cairn-sandbox:latest)
#        CAIRN_BENCH_ONLY=throughput CAIRN_BENCH_POOL=20 bash bench/sandbox.sh
#          (only the 20/50 concurrent runs, docker runners with default admission settings)
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS="${1:-30}"
IMAGE="${2:-cairn-sandbox:latest}"
POOL="${CAIRN_BENCH_POOL:-4}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target}"
# CAIRN_BENCH_PROFILE=dev: debug binaries (when a release build is out of reach; say so with
# the figures).
if [ "${CAIRN_BENCH_PROFILE:-release}" = dev ]; then
  cargo build -q -p cairn-sandbox-runner -p cairn-bench --bin cairn-sandbox-runner --bin sandbox_load
  BIN="$CARGO_TARGET_DIR/debug"
else
  cargo build --release -q -p cairn-sandbox-runner -p cairn-bench --bin cairn-sandbox-runner --bin sandbox_load
  BIN="$CARGO_TARGET_DIR/release"
fi

WORK="$(mktemp -d -p "${BENCH_DIR:-/tmp}" cairn-sandbox-bench.XXXXXX)"
chmod 711 "$WORK"  # the local backend runs bwrap as the sandbox user, which must reach its work_root
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
  # The runners remove their containers on SIGTERM; this only catches one that died first.
  for name in cold warm local localpool; do
    docker ps -aq --filter "label=cairn.runner_id=bench-$name-$$" | xargs -r docker rm -f >/dev/null 2>&1 || true
  done
  rm -rf "$WORK"
}
trap cleanup EXIT

port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
start() { # NAME BACKEND POOL: starts a runner, sets ADDR (not in a subshell: PIDS must keep it)
  local name="$1" backend="$2" pool="$3" p
  p="$(port)"
  RUST_LOG=warn "$BIN/cairn-sandbox-runner" --listen "127.0.0.1:$p" --backend "$backend" \
    --image "$IMAGE" --pool-size "$pool" --work-root "$WORK/$name" --runner-id "bench-$name-$$" \
    >"$WORK/$name.log" 2>&1 &
  PIDS+=($!)
  for _ in $(seq 100); do (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null && break; sleep 0.1; done
  ADDR="127.0.0.1:$p"
}
start cold docker 0; COLD="$ADDR"
start warm docker "$POOL"; WARM="$ADDR"
if [ "${CAIRN_BENCH_ONLY:-}" = throughput ]; then
  echo "command: CAIRN_BENCH_ONLY=throughput CAIRN_BENCH_POOL=$POOL bash bench/sandbox.sh  (${CAIRN_BENCH_PROFILE:-release} build; $(date -u +%Y-%m-%dT%H:%MZ); $(nproc) cores; docker $(docker version -f '{{.Server.Version}}'); load $(cut -d' ' -f1 /proc/loadavg))"
  "$BIN/sandbox_load" --cold "$COLD" --warm "$WARM" --image "$IMAGE" --pool "$POOL" --throughput-only
  exit 0
fi
start local local 0; LOCAL="$ADDR"
start localpool local "$POOL"; LOCALPOOL="$ADDR"

echo "command: bash bench/sandbox.sh $RUNS $IMAGE  (pool_size $POOL; $(date -u +%Y-%m-%dT%H:%MZ); $(nproc) cores; docker $(docker version -f '{{.Server.Version}}'))"
echo
"$BIN/sandbox_load" --cold "$COLD" --warm "$WARM" --local "$LOCAL" --local-pool "$LOCALPOOL" --image "$IMAGE" --runs "$RUNS" --pool "$POOL"

# The local runners after SIGTERM: task directories and sandbox processes left (want 0 and 0).
echo
READY_DIRS="$(ls "$WORK/localpool/tasks" | wc -l)"
for i in 2 3; do kill "${PIDS[$i]}"; wait "${PIDS[$i]}" 2>/dev/null || true; done
LEFT_DIRS="$(cat <(ls "$WORK/local/tasks") <(ls "$WORK/localpool/tasks") | wc -l)"
# (the bracket keeps grep's own command line from matching)
LEFT_PROCS="$( (grep -l -s "$WORK/local[p/]" /proc/[0-9]*/cmdline || true) | wc -l)"
echo "- local runners: $READY_DIRS waiting-sandbox directories before SIGTERM; after it, $LEFT_DIRS task directories and $LEFT_PROCS sandbox processes left"

if ! bench/.venv/bin/python -c 'import llm_sandbox' 2>/dev/null; then
  [ -x bench/.venv/bin/python ] || python3 -m venv bench/.venv
  bench/.venv/bin/pip install -q 'llm-sandbox[docker]==0.3.46'
fi
echo
echo "| path | runs | p50 ms | p95 ms |"
echo "|---|---:|---:|---:|"
bench/.venv/bin/python bench/python/llm_sandbox_bench.py "$IMAGE" "$RUNS"
