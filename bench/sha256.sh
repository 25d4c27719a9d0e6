#!/usr/bin/env bash
# In-process SHA-256 next to OpenSSL on the same core: `openssl speed -evp sha256` (per user CPU
# second) on 1 MiB blocks before and after the criterion benchmark crates/sha256/benches/sha256.rs (sha2, aws-lc as
# cairn-sha256, ring; per CPU second of the thread), each implementation's rate divided by OpenSSL's mean of the two.
# Usage: bash bench/sha256.sh   (prints the Markdown rows recorded in bench/RESULTS.md)
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target}"
cargo bench -q -p cairn-sha256 --bench sha256 --no-run 2>/dev/null
openssl_mbs() {
  openssl speed -evp sha256 -bytes 1048576 -seconds 3 2>/dev/null \
    | awk '$1=="sha256"{sub(/k$/,"",$2); printf "%.0f", $2/1000}'
}
echo "command: bash bench/sha256.sh  ($(date -u +%Y-%m-%dT%H:%MZ), load $(cut -d' ' -f1 /proc/loadavg))"
echo "machine: $(nproc) cores, $(sed -n 's/^model name\s*: //p' /proc/cpuinfo | head -1), $(grep -qw sha_ni /proc/cpuinfo && echo SHA-NI || echo 'no SHA-NI'), $(openssl version | cut -d' ' -f1-2)"
BEFORE="$(openssl_mbs)"
cargo bench -q -p cairn-sha256 --bench sha256 -- --warm-up-time 1 --measurement-time 4 >/dev/null
AFTER="$(openssl_mbs)"
echo
echo "| implementation, 1 MiB blocks | in-process | \`openssl speed -evp sha256\` (before / after) | ratio | target |"
echo "|---|---|---|---|---|"
for imp in sha2 aws-lc ring; do
  python3 - "$CARGO_TARGET_DIR/criterion/sha256/$imp/1048576/new/estimates.json" "$imp" "$BEFORE" "$AFTER" <<'PY'
import json, sys
est, imp, before, after = sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4])
ns = json.load(open(est))["median"]["point_estimate"]
mbs = 1048576 / ns * 1000
base = (before + after) / 2
ratio = mbs / base
verdict = "met" if ratio >= 0.95 else "**missed**"
print(f"| {imp} | {mbs:.0f} MB/s | {base:.0f} MB/s ({before:.0f} / {after:.0f}) | {ratio:.2f} | >= 0.95: {verdict} |")
PY
done
