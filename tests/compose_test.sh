#!/usr/bin/env bash
# The docker compose end-to-end tests (tests/tests/compose_test.rs), as an operator or CI runs
# them: builds the debug `cairn` binary (a release build takes too long on 2 cores; the image
# build strips its debug info), then runs the tests, which build the images (deploy/images,
# offline), bring deploy/compose up under their own project names, drive it from the host with
# the CLI and gRPC, and take it down again. Docker is required (CAIRN_REQUIRE_DOCKER=1) unless
# the caller sets CAIRN_REQUIRE_DOCKER=0 (the tests then SKIP where Docker is missing).
#
# Usage: tests/compose_test.sh [TEST-NAME-FILTER]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/cairn-target}"
export CAIRN_REQUIRE_DOCKER="${CAIRN_REQUIRE_DOCKER:-1}"
start=$(date +%s)
cargo build -q -p cairn-cli --locked
export CAIRN_BIN="$CARGO_TARGET_DIR/debug/cairn"
built=$(date +%s)
status=0
cargo test -q -p cairn-e2e --locked --test compose_test -- --nocapture --test-threads 2 "$@" || status=$?
end=$(date +%s)
printf 'compose_test: cairn build %ss, tests (with their build) %ss, total %ss\n' \
    $((built - start)) $((end - built)) $((end - start))
exit "$status"
