#!/usr/bin/env bash
# A Python grpcio client generated from proto/ talks to `cairn up`: the contract works for
# other teams' clients, not only ours. Creates its venv once (PyPI), then runs client_test.py.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/cairn-target}"
VENV="${CAIRN_PYENV:-$HOME/.cache/cairn-pyenv}"
if [ ! -x "$VENV/bin/python" ] || ! "$VENV/bin/python" -c 'import grpc, grpc_tools, grpc_status' 2>/dev/null; then
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install -q --disable-pip-version-check 'grpcio>=1.60' 'grpcio-tools>=1.60' \
        'grpcio-status>=1.60'  # google.rpc.Status / ErrorInfo of refusals (googleapis-common-protos)
fi
WORK="$(mktemp -d)"
trap 'kill "${PID:-0}" 2>/dev/null || true; rm -rf "$WORK"' EXIT
"$VENV/bin/python" -m grpc_tools.protoc -I "$REPO/proto" --python_out="$WORK" --grpc_python_out="$WORK" \
    "$REPO"/proto/cairn/v1/*.proto
cargo build -q -p cairn-cli --locked
PORT="$("$VENV/bin/python" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')"
"$CARGO_TARGET_DIR/debug/cairn" --data-root "$WORK/data" up --listen "127.0.0.1:$PORT" 2>"$WORK/cairn.log" &
PID=$!
PYTHONPATH="$WORK" "$VENV/bin/python" "$REPO/tests/python/client_test.py" "127.0.0.1:$PORT" || {
    echo "--- cairn up log ---"; cat "$WORK/cairn.log"; exit 1; }
