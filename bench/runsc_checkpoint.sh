#!/usr/bin/env bash
# runsc alone: how long `runsc checkpoint` and `runsc restore` take for a sandbox whose first
# process holds 100 MiB of random bytes, beside a cold `runsc run` in the same round, for each
# runsc given; and whether a process started through `runsc exec` lives on after the restore
# (a session's commands start that way). No cairn code runs: this tells which runsc a runner
# should use and what the runner's own pipeline adds on top (bench/snapshots.sh).
# Needs root and the image (its root file system is exported once into the scratch directory).
# Usage: bash bench/runsc_checkpoint.sh [ROUNDS] RUNSC [RUNSC...]   (a RUNSC may be
#   PATH:FLAGS, e.g. /opt/runsc:--compression=none, the flags going to `runsc checkpoint`)
# CAIRN_BENCH_IMAGE (default cairn-sandbox:latest); CAIRN_BENCH_GVISOR_PLATFORM (ptrace).
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS="${1:-3}"; shift || true
[ "$#" -gt 0 ] || set -- "$(command -v runsc)"
IMAGE="${CAIRN_BENCH_IMAGE:-cairn-sandbox:latest}"
PLATFORM="${CAIRN_BENCH_GVISOR_PLATFORM:-ptrace}"

. bench/scratch.sh
scratch runsc-checkpoint

mkdir -p "$WORK/bundle/rootfs" "$WORK/w"
chmod 777 "$WORK/w"
cid="$(docker create "$IMAGE" true)"
docker export "$cid" | tar -x -C "$WORK/bundle/rootfs"
docker rm "$cid" >/dev/null
cat >"$WORK/w/hold.py" <<'EOF'
import os, time
b = bytearray(os.urandom(1 << 20)) * 100
n = 0
while True:
    n += 1
    open("/w/count.tmp", "w").write(str(n))
    os.replace("/w/count.tmp", "/w/count")
    time.sleep(0.02)
EOF
python3 - "$WORK" <<'EOF'
import json, sys
work = sys.argv[1]
spec = {
    "ociVersion": "1.0.0",
    "process": {"args": ["python3", "-c", "import time\nwhile True: time.sleep(1)"],
                "cwd": "/", "env": ["PATH=/usr/local/bin:/usr/bin:/bin"],
                "user": {"uid": 10001, "gid": 10001}, "terminal": False},
    "root": {"path": work + "/bundle/rootfs", "readonly": True},
    "hostname": "bench",
    "mounts": [{"destination": "/proc", "type": "proc", "source": "proc"},
               {"destination": "/tmp", "type": "tmpfs", "source": "tmpfs"},
               {"destination": "/w", "type": "bind", "source": work + "/w", "options": ["rbind", "rw"]}],
    "linux": {"namespaces": [{"type": t} for t in ("pid", "ipc", "uts", "mount", "network")]},
}
json.dump(spec, open(work + "/bundle/config.json", "w"))
EOF

ms_since() { echo $(( ($(date +%s%N) - $1) / 1000000 )); }
status() { "$R" $G state "$1" 2>/dev/null | python3 -c 'import json,sys; print(json.load(sys.stdin)["status"])' 2>/dev/null || true; }
until_running() { while [ "$(status "$1")" != running ]; do sleep 0.005; done; }
count() { cat "$WORK/w/count" 2>/dev/null || echo 0; }

echo "command: bash bench/runsc_checkpoint.sh $ROUNDS $*  ($IMAGE; platform $PLATFORM; $(date -u +%Y-%m-%dT%H:%MZ); $(nproc) cores)"
echo
echo "| runsc | round | cold run to running | checkpoint | image | restore to running | exec'd process after restore |"
echo "|---|---|---|---|---|---|---|"
for entry in "$@"; do
  R="${entry%%:*}"; FLAGS=""; [ "$entry" != "$R" ] && FLAGS="${entry#*:}"
  for round in $(seq "$ROUNDS"); do
    S="$WORK/state"; IMG="$WORK/img"; rm -rf "$S" "$IMG"; mkdir -p "$S" "$IMG"; rm -f "$WORK/w/count"
    G="--root=$S --platform=$PLATFORM --ignore-cgroups --network=none"
    id="bench$round$$"
    t0="$(date +%s%N)"
    "$R" $G run --detach --bundle "$WORK/bundle" "$id" </dev/null >/dev/null 2>&1
    until_running "$id"
    cold="$(ms_since "$t0")"
    # The process holding the memory starts as a session command does: through runsc exec.
    "$R" $G exec --user 10001:10001 "$id" sh -c 'setsid python3 /w/hold.py </dev/null >/dev/null 2>&1 &'
    for _ in $(seq 200); do [ "$(count)" -gt 20 ] && break; sleep 0.05; done
    t0="$(date +%s%N)"
    # shellcheck disable=SC2086
    "$R" $G checkpoint $FLAGS --image-path="$IMG" "$id" >/dev/null
    ckpt="$(ms_since "$t0")"
    at="$(count)"
    "$R" $G delete --force "$id" >/dev/null 2>&1 || true
    t0="$(date +%s%N)"
    "$R" $G restore --detach --bundle "$WORK/bundle" --image-path="$IMG" "$id" </dev/null >/dev/null 2>&1 &
    until_running "$id"
    restore="$(ms_since "$t0")"
    sleep 1
    after="$(count)"
    lives="dead (counter $at -> $after)"
    [ "$after" -gt "$((at + 10))" ] && lives="lives (counter $at -> $after)"
    echo "| $("$R" --version | head -1 | awk '{print $3}') $FLAGS | $round | $cold ms | $ckpt ms | $(du -sb "$IMG" | cut -f1) B | $restore ms | $lives |"
    "$R" $G kill "$id" KILL >/dev/null 2>&1 || true
    sleep 0.2
    "$R" $G delete --force "$id" >/dev/null 2>&1 || true
    wait
  done
done
