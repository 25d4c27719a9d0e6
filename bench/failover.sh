#!/usr/bin/env bash
# Orchestrator replica failover: three replicas (debug builds) over a real etcd on loopback,
# kill -9 of the one driving a long run, and the time from the kill to the first event another
# replica records for that run (services/orchestrator/tests/cluster_test.rs prints it). With
# the defaults operators get (lease_ttl_s = 5, handover_ms = 1000), REPEAT times (default 3).
# Usage: bash bench/failover.sh [REPEAT]
set -euo pipefail
cd "$(dirname "$0")/.."
REPEAT="${1:-3}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target}"
export CAIRN_TEST_LEASE_TTL_S=5 CAIRN_TEST_HANDOVER_MS=1000
for i in $(seq "$REPEAT"); do
  cargo nextest run -p cairn-orchestrator --locked -E 'binary(cluster_test) & test(killed)' \
      --no-capture 2>&1 | grep -E '^failover:' || { echo "run $i failed" >&2; exit 1; }
done
