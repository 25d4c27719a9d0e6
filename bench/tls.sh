#!/usr/bin/env bash
# What mutual TLS costs: a plaintext and a TLS artifact-store (release, loopback, same scratch
# filesystem) measured side by side by `store_load tls`, then the orchestrator's write_file
# chain on a plaintext store+orchestrator pair and on an mTLS pair, in one session.
# Usage: bash bench/tls.sh [SIZE_BYTES] [NODES]   (defaults 1 GiB, 1000; scratch under $BENCH_DIR or /tmp)
set -euo pipefail
cd "$(dirname "$0")/.."
SIZE="${1:-1073741824}"
NODES="${2:-1000}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target}"
cargo build --release -q -p cairn-artifact-store -p cairn-orchestrator -p cairn-cli -p cairn-bench
BIN="$CARGO_TARGET_DIR/release"

. bench/scratch.sh
scratch tls-bench

tls_stores "$SIZE"
echo "command: bash bench/tls.sh $SIZE $NODES  ($(date -u +%Y-%m-%dT%H:%MZ), $(df -T "$WORK" | awk 'NR==2{print $2}') scratch)"
"$BIN/store_load" tls --plain-addr "http://127.0.0.1:$PLAIN" --tls-addr "127.0.0.1:$TLS" --tls-dir "$WORK/pki" --file "$WORK/input.bin" --pids "${PIDS[0]}" "${PIDS[1]}"
rm -f "$WORK/input.bin"

# The write_file chain: one orchestrator per store, each dialling its store as the store is served.
OP="$(port)"; OT="$(port)"
RUST_LOG=warn "$BIN/cairn-orchestrator" --listen "127.0.0.1:$OP" --store-addr "127.0.0.1:$PLAIN" --ingest-addr "" & PIDS+=($!)
RUST_LOG=warn "$BIN/cairn-orchestrator" --listen "127.0.0.1:$OT" --store-addr "127.0.0.1:$TLS" --ingest-addr "" --tls-dir "$WORK/pki" & PIDS+=($!)
wait_port "$OP"; wait_port "$OT"
for round in 1 2; do
  echo "# round $round: plaintext"
  "$BIN/orchestrator_load" --orch "http://127.0.0.1:$OP" --store "http://127.0.0.1:$PLAIN" --nodes "$NODES" --repeat 3 --only write --scratch "$WORK"
  echo "# round $round: mutual TLS"
  "$BIN/orchestrator_load" --orch "127.0.0.1:$OT" --store "127.0.0.1:$TLS" --nodes "$NODES" --repeat 3 --only write --tls-dir "$WORK/pki" --scratch "$WORK"
done
