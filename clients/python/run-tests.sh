#!/usr/bin/env bash
# The Python client's checks: its generated code matches proto/, mypy --strict on the package
# and its examples, and pytest against `cairn up` (started by the tests). Creates its
# virtualenv once under ~/.cache (PyPI), installs the package from this directory into it.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/cairn-target}"
VENV="${CAIRN_PYCLIENT_VENV:-$HOME/.cache/cairn-pyclient-venv}"
PY="$VENV/bin/python"
# The test tools; grpcio-tools only to check the generated code (the package does not need it).
TOOLS=(pytest mypy grpc-stubs types-protobuf grpcio-tools==1.85.1)
if [ ! -x "$PY" ] || ! "$PY" -c 'import pytest, mypy, grpc_tools' 2>/dev/null; then
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install -q --disable-pip-version-check "${TOOLS[@]}"
fi
# A regular (not editable) install from a copy, as `pip install ./clients/python` does.
BUILD="$(mktemp -d)"
trap 'rm -rf "$BUILD"' EXIT
cp -r "$HERE/pyproject.toml" "$HERE/README.md" "$HERE/src" "$BUILD/"
"$VENV/bin/pip" install -q --disable-pip-version-check --force-reinstall --no-deps "$BUILD"
"$VENV/bin/pip" install -q --disable-pip-version-check "$BUILD"   # its dependencies, once
cargo build -q -p cairn-cli --locked
cd "$HERE"
"$PY" gen_stubs.py --check
"$VENV/bin/mypy" --strict src/cairn_client examples
"$PY" -m pytest -q -p no:cacheprovider tests "$@"
