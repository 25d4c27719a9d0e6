#!/usr/bin/env bash
# The whole test suite of cairn, as CI runs it (.ci/run calls exactly this).
#   1. scripts/setup.sh: missing apt packages, the offline sandbox images;
#   2. formatting and clippy (warnings are errors);
#   3. every Rust test (cargo nextest, the workspace);
#   4. the fuzz targets still build;
#   5. the Python grpcio client against `cairn up` (tests/python).
# CAIRN_REQUIRE_DOCKER=1 makes the Docker tests mandatory (CI sets it).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/cairn-target}"
export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"
step() { printf '\n== %s ==\n' "$*"; }

step "setup"
bash scripts/setup.sh

step "fmt"
cargo fmt --all -- --check

step "clippy"
cargo clippy --workspace --all-targets --locked -- -D warnings

step "tests"
cargo nextest run --workspace --locked --profile ci --no-fail-fast

step "fuzz targets build"
for check in crates/pathguard/fuzz/check.sh services/ingest/fuzz/check.sh; do
    [ -f "$check" ] && bash "$check"
done

step "python grpc client"
bash tests/python/run.sh

step "all tests passed"
