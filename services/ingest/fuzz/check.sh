#!/usr/bin/env bash
# Builds ingest's fuzz target on stable Rust and fuzzes it for FUZZ_SECONDS (default 60).
# The build uses the same sanitizer-coverage passes as cargo-fuzz (stable rustc accepts them;
# only -Zsanitizer=address needs nightly), so the run is coverage-guided. A crash leaves its
# input in fuzz/artifacts/ and fails this script. `cargo +nightly fuzz run parse` also works.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
export CARGO_TARGET_DIR="$here/target"
triple="$(rustc -vV | sed -n 's/^host: //p')"
mkdir -p "$here/corpus/parse" "$here/artifacts/parse"
cp -n "$here"/seeds/* "$here/corpus/parse/" 2>/dev/null || true

# The plain stable build must work (what CI checks first).
cargo build --manifest-path "$here/Cargo.toml" --bin parse

RUSTFLAGS="-Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4 \
-Cllvm-args=-sanitizer-coverage-inline-8bit-counters -Cllvm-args=-sanitizer-coverage-pc-table \
-Cllvm-args=-sanitizer-coverage-trace-compares -Cdebug-assertions -Coverflow-checks" \
    cargo build --release --manifest-path "$here/Cargo.toml" --target "$triple" --bin parse
bin="$CARGO_TARGET_DIR/$triple/release/parse"

"$bin" "$here"/seeds/*
"$bin" -max_total_time="${FUZZ_SECONDS:-60}" -max_len=65536 -dict="$here/parse.dict" \
    -artifact_prefix="$here/artifacts/parse/" "$here/corpus/parse" 2>&1 | tail -n 3
echo "fuzz check: ok (${FUZZ_SECONDS:-60} s coverage-guided, no crash)"
