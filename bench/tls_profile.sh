#!/usr/bin/env bash
# Where mutual TLS spends its CPU on a large Put: one `cairn store put` of SIZE bytes to a
# plaintext store and one to a TLS store (release, loopback, same scratch filesystem), each
# with `perf record` of the store and of the client, then the symbols whose samples grew most
# from plaintext to TLS, per process. Needs `perf` (Debian: linux-perf).
# Usage: bash bench/tls_profile.sh [SIZE_BYTES]   (default 1 GiB; scratch under $BENCH_DIR or /tmp)
set -euo pipefail
cd "$(dirname "$0")/.."
SIZE="${1:-1073741824}"
command -v perf >/dev/null || { echo "perf is not installed (apt-get install linux-perf)" >&2; exit 1; }
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target}"
cargo build --release -q -p cairn-artifact-store -p cairn-cli -p cairn-bench
BIN="$CARGO_TARGET_DIR/release"

. bench/scratch.sh
scratch tls-profile

tls_stores "$SIZE"
echo "command: bash bench/tls_profile.sh $SIZE  ($(date -u +%Y-%m-%dT%H:%MZ), load average $(cut -d' ' -f1 /proc/loadavg))"

for side in plain tls; do
  if [ "$side" = plain ]; then addr="127.0.0.1:$PLAIN"; tls=(); store="${PIDS[0]}"
  else addr="127.0.0.1:$TLS"; tls=(--tls-dir "$WORK/pki"); store="${PIDS[1]}"; fi
  # A first Put warms the page cache and the store; the second is profiled.
  "$BIN/cairn" store --addr "$addr" "${tls[@]}" put --overwrite "$WORK/input.bin" workspace/warm.bin >/dev/null
  perf record -q -F 2999 -o "$WORK/$side.store.data" -p "$store" 2>/dev/null & rec=$!
  sleep 0.3
  perf stat -x, -e page-faults -o "$WORK/$side.faults" \
    perf record -q -F 2999 -o "$WORK/$side.client.data" -- \
    "$BIN/cairn" store --addr "$addr" "${tls[@]}" put --overwrite "$WORK/input.bin" workspace/big.bin >/dev/null 2>&1
  kill -INT "$rec"; wait "$rec" || true
  echo "$side: client page faults $(grep page-faults "$WORK/$side.faults" | cut -d, -f1)"
done

python3 - "$WORK" <<'EOF'
import subprocess, sys
work = sys.argv[1]

def samples(path):
    out = subprocess.run(["perf", "report", "-i", path, "-n", "--sort", "sym", "--stdio"],
                         capture_output=True, text=True).stdout
    counts = {}
    for line in out.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        parts = line.split()
        try:
            counts[" ".join(parts[3:])[:80]] = int(parts[1])
        except (IndexError, ValueError):
            pass
    return counts

for who in ("store", "client"):
    plain, tls = samples(f"{work}/plain.{who}.data"), samples(f"{work}/tls.{who}.data")
    p, t = sum(plain.values()), sum(tls.values())
    print(f"\n{who}: {p} samples plaintext, {t} with TLS ({(t - p) / p * 100:+.1f}%)")
    grown = sorted(set(plain) | set(tls), key=lambda k: plain.get(k, 0) - tls.get(k, 0))
    for k in grown[:10]:
        print(f"  {plain.get(k, 0):6d} {tls.get(k, 0):6d} {tls.get(k, 0) - plain.get(k, 0):+6d}  {k}")
EOF
