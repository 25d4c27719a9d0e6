#!/usr/bin/env bash
# Orchestrator benchmark: the same N-node graphs (default 1,000) on cairn (release
# cairn-artifact-store + cairn-orchestrator on loopback) and on LangGraph with its SQLite
# checkpointer (durability "sync"), in one session. Prints one JSON line per system/scenario.
# Usage: bash bench/orchestrator.sh [NODES] [REPEAT]   (scratch under $BENCH_DIR or /tmp)
# LangGraph comes from PyPI into bench/.venv (created on first use).
set -euo pipefail
cd "$(dirname "$0")/.."
NODES="${1:-1000}"
REPEAT="${2:-3}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target}"
cargo build --release -q -p cairn-artifact-store -p cairn-orchestrator -p cairn-bench
BIN="$CARGO_TARGET_DIR/release"
if [ ! -x bench/.venv/bin/python ]; then
  python3 -m venv bench/.venv
  bench/.venv/bin/pip install -q langgraph langgraph-checkpoint-sqlite
fi

. bench/scratch.sh
scratch orch-bench

SP="$(port)"
RUST_LOG=warn "$BIN/cairn-artifact-store" --data-root "$WORK/data" --listen "127.0.0.1:$SP" &
PIDS+=($!)
wait_port "$SP"
OP="$(port)"
RUST_LOG=warn "$BIN/cairn-orchestrator" --listen "127.0.0.1:$OP" --store-addr "127.0.0.1:$SP" --ingest-addr "" &
PIDS+=($!)
wait_port "$OP"

echo "# command: bash bench/orchestrator.sh $NODES $REPEAT  ($(date -u +%Y-%m-%dT%H:%MZ), $(nproc) cores, $(df -T "$WORK" | awk 'NR==2{print $2}') scratch)"
"$BIN/orchestrator_load" --orch "http://127.0.0.1:$OP" --store "http://127.0.0.1:$SP" --nodes "$NODES" --repeat "$REPEAT" --scratch "$WORK"
"$BIN/orchestrator_load" --orch "http://127.0.0.1:$OP" --store "http://127.0.0.1:$SP" --nodes $((NODES / 10)) --repeat 1
mkdir -p "$WORK/langgraph"
bench/.venv/bin/python bench/python/langgraph_peer.py --nodes "$NODES" --repeat "$REPEAT" --work "$WORK/langgraph"
bench/.venv/bin/python bench/python/langgraph_peer.py --nodes $((NODES / 10)) --repeat 1 --work "$WORK/langgraph"
