#!/usr/bin/env bash
# Builds the pathguard fuzz target on stable Rust (CI calls this). Target dir:
# $CARGO_TARGET_DIR/pathguard-fuzz (or fuzz/target when CARGO_TARGET_DIR is unset).
#
# The plain build links libFuzzer without coverage instrumentation: it runs, but blindly.
# FUZZ_SECONDS=N also builds a coverage-instrumented copy (the sancov flags cargo-fuzz passes,
# minus -Zsanitizer, which needs nightly; safe Rust needs no ASan) and fuzzes it for N seconds;
# a crash exits non-zero and leaves the input in ./crash-*. With nightly and cargo-fuzz:
#   cd crates/pathguard && cargo +nightly fuzz run validate
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
base="${CARGO_TARGET_DIR:-$here/target}"

CARGO_TARGET_DIR="$base/pathguard-fuzz" cargo build --manifest-path "$here/Cargo.toml" --bins

if [[ -n "${FUZZ_SECONDS:-}" ]]; then
    host="$(rustc -vV | sed -n 's/^host: //p')"
    # --target keeps RUSTFLAGS away from build scripts.
    CARGO_TARGET_DIR="$base/pathguard-fuzz-cov" \
    RUSTFLAGS="-Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4 \
-Cllvm-args=-sanitizer-coverage-inline-8bit-counters -Cllvm-args=-sanitizer-coverage-pc-table \
-Cllvm-args=-sanitizer-coverage-trace-compares --cfg fuzzing -Cdebug-assertions -Copt-level=3" \
        cargo build --manifest-path "$here/Cargo.toml" --bins --target "$host"
    corpus="$(mktemp -d)"
    trap 'rm -rf "$corpus"' EXIT
    "$base/pathguard-fuzz-cov/$host/debug/validate" -max_total_time="$FUZZ_SECONDS" -max_len=2048 "$corpus"
fi
