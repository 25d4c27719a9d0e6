#!/usr/bin/env bash
# Builds ingest's parser fuzz target on stable Rust and runs it over the seeds (CI calls this).
# Target dir: $CARGO_TARGET_DIR/ingest-fuzz (or fuzz/target when CARGO_TARGET_DIR is unset).
#
# The plain build links libFuzzer without coverage instrumentation: it runs, but blindly.
# FUZZ_SECONDS=N also builds a coverage-instrumented copy (the sanitizer-coverage passes
# cargo-fuzz uses, minus -Zsanitizer, which needs nightly; safe Rust needs no ASan) and fuzzes it
# for N seconds with the grammar's dictionary; a crash exits non-zero and leaves the input in
# fuzz/artifacts/parse/. With nightly and cargo-fuzz: cd services/ingest && cargo +nightly fuzz run parse
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
base="${CARGO_TARGET_DIR:-$here/target}"

CARGO_TARGET_DIR="$base/ingest-fuzz" cargo build --manifest-path "$here/Cargo.toml" --bins
# Each seed must pass (no mutation without instrumentation worth the time here).
"$base/ingest-fuzz/debug/parse" "$here"/seeds/*

if [[ -n "${FUZZ_SECONDS:-}" ]]; then
    host="$(rustc -vV | sed -n 's/^host: //p')"
    # --target keeps RUSTFLAGS away from build scripts.
    CARGO_TARGET_DIR="$base/ingest-fuzz-cov" \
    RUSTFLAGS="-Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4 \
-Cllvm-args=-sanitizer-coverage-inline-8bit-counters -Cllvm-args=-sanitizer-coverage-pc-table \
-Cllvm-args=-sanitizer-coverage-trace-compares --cfg fuzzing -Cdebug-assertions -Coverflow-checks" \
        cargo build --release --manifest-path "$here/Cargo.toml" --bins --target "$host"
    mkdir -p "$here/corpus/parse" "$here/artifacts/parse"
    cp -n "$here"/seeds/* "$here/corpus/parse/" 2>/dev/null || true
    "$base/ingest-fuzz-cov/$host/release/parse" -max_total_time="$FUZZ_SECONDS" -max_len=65536 \
        -dict="$here/parse.dict" -artifact_prefix="$here/artifacts/parse/" "$here/corpus/parse"
fi
