#!/usr/bin/env bash
# Builds the pathguard fuzz targets (CI calls this). On stable the targets build as plain
# binaries linked with libFuzzer but without coverage instrumentation, so they compile and run
# but do not fuzz effectively; real fuzzing needs nightly:
#   cargo +nightly fuzz run validate        (from crates/pathguard, with cargo-fuzz installed)
# With FUZZ_SECONDS=N set, the built target also runs for N seconds on an empty corpus.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$here/../../../target}/pathguard-fuzz"
cargo build --manifest-path "$here/Cargo.toml" --bins
if [[ -n "${FUZZ_SECONDS:-}" ]]; then
    corpus="$(mktemp -d)"
    trap 'rm -rf "$corpus"' EXIT
    "$CARGO_TARGET_DIR/debug/validate" -max_total_time="$FUZZ_SECONDS" -max_len=2048 "$corpus"
fi
