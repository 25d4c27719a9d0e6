#!/usr/bin/env bash
# The main job: a real example run with every service embedded in one process, the Docker
# sandbox (or the local bubblewrap one where Docker is missing) and the replay LLM provider,
# so it needs no LLM and no network.
#
# A replayed agent writes a document with code fences -> ingest turns them into a small Python
# project in workspace/ -> sandbox_run runs its tests -> a gate asks for approval (approved here
# non-interactively with --approve-gates) -> a report lands in docs/.
#
# Usage: scripts/example.sh [--interactive]
#   --interactive   stop at the gate; approve it yourself with the printed `cairn gate approve`.
# Environment: CAIRN_DATA_ROOT (default ./.cairn-data), CAIRN_PROJECT (default hello).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/cairn-target}"
export CAIRN_DATA_ROOT="${CAIRN_DATA_ROOT:-$PWD/.cairn-data}"
export CAIRN_PROJECT="${CAIRN_PROJECT:-hello}"

# The example runs in the sandbox image; the toolchain image (minutes to build the first time)
# is left out unless CAIRN_TOOLCHAIN=1.
CAIRN_TOOLCHAIN="${CAIRN_TOOLCHAIN:-0}" bash scripts/setup.sh
cargo build -q -p cairn-cli --locked
CAIRN="$CARGO_TARGET_DIR/debug/cairn"

APPROVE=(--approve-gates)
[ "${1:-}" = "--interactive" ] && APPROVE=()

"$CAIRN" run examples/hello/graph.yaml "${APPROVE[@]}"

echo
echo "== files of project $CAIRN_PROJECT (data root $CAIRN_DATA_ROOT) =="
"$CAIRN" store ls -r workspace
"$CAIRN" store ls -r docs
echo
echo "Inspect: $CAIRN store get <path>   |   $CAIRN runs list   |   $CAIRN store events <run>"
