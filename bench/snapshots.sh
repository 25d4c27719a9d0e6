#!/usr/bin/env bash
# Session snapshots on the gvisor backend, through the CLI against two served runners (A, B)
# and one artifact-store on loopback: a session whose detached Python process holds 100 MiB
# (random bytes, so every page is real) is paused on A into the store, resumed on B, and
# forked 10 times on B; side by side in the same run with a cold session open on B. Prints
# each figure with its target, the snapshot's size and the store's throughput for it.
# Needs root, runsc (apt-get install runsc) and the image.
# Usage: bash bench/snapshots.sh [ROUNDS] [IMAGE]   (defaults 3, cairn-sandbox:latest)
# CAIRN_BENCH_PROFILE=dev uses debug binaries; CAIRN_BENCH_BIN=DIR uses the binaries in DIR
# (cairn, cairn-sandbox-runner, cairn-artifact-store) without building. CAIRN_BENCH_RUNSC=PATH
# runs the runners on that runsc (default: runsc on PATH); CAIRN_BENCH_RUNNER_LOG=info keeps
# the runners' timings of each checkpoint and restore in their logs, printed at the end.
# CAIRN_BENCH_RUNNER_SET="KEY=VALUE ..." passes more settings to both runners (e.g.
# gvisor_checkpoint_compression=none).
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS="${1:-3}"
IMAGE="${2:-cairn-sandbox:latest}"
PLATFORM="${CAIRN_BENCH_GVISOR_PLATFORM:-ptrace}"
RUNSC="${CAIRN_BENCH_RUNSC:-$(command -v runsc)}"
RUNNER_LOG="${CAIRN_BENCH_RUNNER_LOG:-warn}"
RUNNER_SET=()
for kv in ${CAIRN_BENCH_RUNNER_SET:-}; do RUNNER_SET+=(--set "$kv"); done
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target}"
PROFILE="${CAIRN_BENCH_PROFILE:-release}"
if [ -n "${CAIRN_BENCH_BIN:-}" ]; then
  BIN="$CAIRN_BENCH_BIN"
else
  cargo build --profile "$PROFILE" -q -p cairn-cli -p cairn-sandbox-runner -p cairn-artifact-store \
    --bin cairn --bin cairn-sandbox-runner --bin cairn-artifact-store
  BIN="$CARGO_TARGET_DIR/$([ "$PROFILE" = dev ] && echo debug || echo "$PROFILE")"
fi

. bench/scratch.sh
scratch snapshot-bench

STORE="$(port)"
RUST_LOG=warn "$BIN/cairn-artifact-store" --data-root "$WORK/store" --listen "127.0.0.1:$STORE" \
  >"$WORK/store.log" 2>&1 & PIDS+=($!)
wait_port "$STORE"
runner() { # NAME: starts a gvisor runner, sets ADDR (not in a subshell: PIDS must keep it)
  local p
  p="$(port)"
  RUST_LOG="$RUNNER_LOG" "$BIN/cairn-sandbox-runner" --listen "127.0.0.1:$p" --backend gvisor \
    --image "$IMAGE" --pool-size 0 --work-root "$WORK/$1" --runner-id "bench-$1-$$" \
    --set max_concurrent_runs=24 --set "gvisor_platform=$PLATFORM" --set "runsc=$RUNSC" "${RUNNER_SET[@]}" \
    >"$WORK/$1.log" 2>&1 &
  PIDS+=($!)
  wait_port "$p"
  ADDR="127.0.0.1:$p"
}
runner a; A="$ADDR"; runner b; B="$ADDR"

cli() { # ADDR ARGS...: `cairn sandbox session ARGS --json` against runner ADDR
  local addr="$1"; shift
  "$BIN/cairn" --sandbox-addr "$addr" --store-addr "127.0.0.1:$STORE" --project bench --json \
    sandbox session "$@"
}
field() { python3 -c 'import json,sys; v=json.load(sys.stdin)[sys.argv[1]]; print(" ".join(v) if isinstance(v, list) else v)' "$1"; }
now_ms() { date +%s%3N; }
median() { sort -n | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }

HOLD='import os, time
b = bytearray(os.urandom(1 << 20)) * 100
n = 0
while True:
    n += 1
    # Replaced whole, never seen half-written (a reader between truncate and write would
    # read nothing).
    open("/workspace/counter.tmp", "w").write(str(n))
    os.replace("/workspace/counter.tmp", "/workspace/counter")
    time.sleep(0.05)'

echo "command: bash bench/snapshots.sh $ROUNDS $IMAGE  (profile $PROFILE; platform $PLATFORM; $(date -u +%Y-%m-%dT%H:%MZ); $(nproc) cores; $RUNSC: $("$RUNSC" --version | head -1))"
echo
: >"$WORK/cold"; : >"$WORK/pause"; : >"$WORK/resume"; : >"$WORK/fork"; : >"$WORK/bytes"
for round in $(seq "$ROUNDS"); do
  # Baseline: a cold session on B (open ms as the CLI reports it).
  cold="$(cli "$B" open)"; echo "$cold" | field ms >>"$WORK/cold"
  cli "$B" close "$(echo "$cold" | field session_id)" >/dev/null

  id="$(cli "$A" open | field session_id)"
  cli "$A" exec "$id" --detach -- "python3 -c '$HOLD'" >/dev/null
  for _ in $(seq 100); do
    [ "$(cli "$A" exec "$id" -- 'cat /workspace/counter 2>/dev/null || echo 0' | field stdout)" -gt 2 ] && break
    sleep 0.1
  done
  paused="$(cli "$A" pause "$id")"
  snap="$(echo "$paused" | field snapshot)"
  [ "$(echo "$paused" | field memory)" = True ] || { echo "round $round: the snapshot holds no memory: $paused" >&2; exit 1; }
  echo "$paused" | field ms >>"$WORK/pause"
  echo "$paused" | field bytes >>"$WORK/bytes"

  resumed="$(cli "$B" resume "$snap")"
  echo "$resumed" | field ms >>"$WORK/resume"
  rid="$(echo "$resumed" | field session_id)"
  # The process goes on from its counter (not from 0).
  c1="$(cli "$B" exec "$rid" -- 'cat /workspace/counter' | field stdout)"; sleep 0.3
  c2="$(cli "$B" exec "$rid" -- 'cat /workspace/counter' | field stdout)"
  [ "$c2" -gt "$c1" ] || { echo "round $round: the resumed counter does not go on ($c1, $c2)" >&2; exit 1; }
  cli "$B" close "$rid" >/dev/null

  t0="$(now_ms)"
  forks="$(cli "$B" fork "$snap" --count 10 | field sessions)"
  echo $(( $(now_ms) - t0 )) >>"$WORK/fork"
  [ "$(echo "$forks" | wc -w)" = 10 ] || { echo "round $round: fork made $(echo "$forks" | wc -w) sessions" >&2; exit 1; }
  for f in $forks; do cli "$B" close "$f" >/dev/null; done
  echo "round $round: cold open $(tail -1 "$WORK/cold") ms, pause $(tail -1 "$WORK/pause") ms ($(tail -1 "$WORK/bytes") bytes), resume on B $(tail -1 "$WORK/resume") ms (counter $c1 -> $c2), fork x10 $(tail -1 "$WORK/fork") ms"
done

COLD="$(median <"$WORK/cold")"; PAUSE="$(median <"$WORK/pause")"; RESUME="$(median <"$WORK/resume")"
FORK="$(median <"$WORK/fork")"; BYTES="$(median <"$WORK/bytes")"
ratio() { python3 -c "import sys; print(f'{float(sys.argv[1]) / float(sys.argv[2]):.2f}')" "$1" "$2"; }
verdict() { python3 -c "import sys; print('met' if float(sys.argv[1]) <= float(sys.argv[2]) else 'missed')" "$1" "$2"; }
echo
echo "| measurement (median of $ROUNDS) | cairn | cold session open, same run | ratio | target |"
echo "|---|---|---|---|---|"
echo "| pause, 100 MiB process (runsc checkpoint + files, into the store) | $PAUSE ms | $COLD ms | $(ratio "$PAUSE" "$COLD") | <= 500 ms: $(verdict "$PAUSE" 500) |"
echo "| resume on another runner (from the store) | $RESUME ms | $COLD ms | $(ratio "$RESUME" "$COLD") | <= 500 ms: $(verdict "$RESUME" 500) |"
echo "| fork x10 (wall, CLI) | $FORK ms | $COLD ms | $(ratio "$FORK" "$COLD") | <= 3000 ms: $(verdict "$FORK" 3000) |"
echo
echo "- snapshot size: $BYTES bytes ($(python3 -c "print(f'{$BYTES / (1 << 20):.1f}')") MiB); store throughput while pausing: $(python3 -c "print(f'{$BYTES / (1 << 20) / ($PAUSE / 1000):.0f}')") MiB/s of snapshot per second of pause"
if [ "$RUNNER_LOG" != warn ]; then
  echo
  echo "runner timings (ms):"
  grep -h -E 'session snapshot made|snapshot resumed|snapshot checked|restored sandbox runs' "$WORK/a.log" "$WORK/b.log" \
    | sed -E 's/\x1b\[[0-9;]*m//g; s/^.*(INFO|DEBUG) [^ ]+: //' || true
fi
