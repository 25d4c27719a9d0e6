#!/usr/bin/env bash
# Run history benchmark: ListRuns first page (release cairn-artifact-store + cairn-orchestrator
# on loopback) at each size, with the walk ListRuns used to do (List of .cairn/runs + Get of
# every state.json, by the bench client against the same store) beside it; then ReadEvents of
# the last 100 events of a 1,000,000-event log with the seek index and with a scan; and finding
# the runs to resume at start-up (ListRunSummaries `unfinished`, 1 run in 100 not final) with
# the walk it replaced.
# Run directories are written straight into the data root before the store starts (gRPC would
# take longer than the measurement); the store builds its indexes from them.
# Usage: bash bench/runs.sh [SIZES] [EVENTS]   (default "1000 10000 100000" 1000000; scratch
# under $BENCH_DIR or /tmp). WALKS_AT_100000 (default 1) sets how many walks are timed there.
set -euo pipefail
cd "$(dirname "$0")/.."
SIZES="${1:-1000 10000 100000}"
EVENTS="${2:-1000000}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target}"
cargo build --release -q -p cairn-artifact-store -p cairn-orchestrator -p cairn-bench
BIN="$CARGO_TARGET_DIR/release"

WORK="$(mktemp -d -p "${BENCH_DIR:-/tmp}" cairn-runs-bench.XXXXXX)"
PIDS=()
stop_all() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
  PIDS=()
}
trap 'stop_all; rm -rf "$WORK"' EXIT
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_port() { for _ in $(seq 300); do (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return; sleep 0.1; done; echo "port $1 never opened" >&2; exit 1; }
# Waits until a process has used no CPU for 2 s (the orchestrator's start-up resume scan).
wait_idle() {
  local last now
  last=$(awk '{print $14+$15}' "/proc/$1/stat")
  while sleep 2; do
    now=$(awk '{print $14+$15}' "/proc/$1/stat")
    [ "$now" = "$last" ] && return
    last=$now
  done
}

echo "# command: bash bench/runs.sh \"$SIZES\" $EVENTS  ($(date -u +%Y-%m-%dT%H:%MZ), $(nproc) cores, $(df -T "$WORK" | awk 'NR==2{print $2}') scratch)"
for N in $SIZES; do
  DATA="$WORK/data-$N"
  "$BIN/runs_load" gen-runs --data-root "$DATA" --runs "$N"
  sync
  SP="$(port)"
  RUST_LOG=warn "$BIN/cairn-artifact-store" --data-root "$DATA" --listen "127.0.0.1:$SP" &
  PIDS+=($!)
  wait_port "$SP"
  # No index on disk yet: the first query waits for the store to build it from the run dirs.
  "$BIN/runs_load" first-query --store "http://127.0.0.1:$SP" --label "built (none on disk)"
  OP="$(port)"
  RUST_LOG=warn "$BIN/cairn-orchestrator" --listen "127.0.0.1:$OP" --store-addr "127.0.0.1:$SP" --ingest-addr "" &
  OPID=$!
  PIDS+=($OPID)
  wait_port "$OP"
  wait_idle "$OPID"
  WALKS=5
  [ "$N" -ge 100000 ] && WALKS="${WALKS_AT_100000:-1}"
  "$BIN/runs_load" list --store "http://127.0.0.1:$SP" --orch "http://127.0.0.1:$OP" --walks "$WALKS"
  # What an orchestrator's start-up (and a replica's adoption) asks: the runs to resume.
  "$BIN/runs_load" unfinished --store "http://127.0.0.1:$SP" --walks "$WALKS"
  stop_all
  # Restarted over its own index: the start-up load only checks each run directory.
  RUST_LOG=warn "$BIN/cairn-artifact-store" --data-root "$DATA" --listen "127.0.0.1:$SP" &
  PIDS+=($!)
  wait_port "$SP"
  "$BIN/runs_load" first-query --store "http://127.0.0.1:$SP" --label "checked (restart)"
  stop_all
  rm -rf "$DATA"
done

DATA="$WORK/data-events"
"$BIN/runs_load" gen-events --data-root "$DATA" --run big --events "$EVENTS"
"$BIN/runs_load" gen-events --data-root "$DATA" --run big-scan --events "$EVENTS"
# The scan run's seek index is a symlink, which the store never follows: its reads scan.
ln -s /dev/null "$DATA/projects/bench/.cairn/runs/big-scan/events.idx"
sync
SP="$(port)"
RUST_LOG=error "$BIN/cairn-artifact-store" --data-root "$DATA" --listen "127.0.0.1:$SP" &
PIDS+=($!)
wait_port "$SP"
"$BIN/runs_load" tail --store "http://127.0.0.1:$SP" --run big --scan-run big-scan --events "$EVENTS" --iters "${TAIL_ITERS:-200}"
