#!/usr/bin/env bash
# Rebuild time of the service image (deploy/images/service.Dockerfile) after the cairn binary
# changed, side by side in one run: the Dockerfile as it was (binary COPY first, then user
# creation and metadata; from git 3e7989b) against the current order (binary last), and the
# current order with an unstripped binary. Each build gets a binary that differs (a nonce ELF
# note), so nothing after the COPY can come from the cache. Needs Docker and cairn-base.
#
# Usage: bench/images.sh [BINARY]   (default $CARGO_TARGET_DIR/debug/cairn)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export DOCKER_BUILDKIT=0
BIN="${1:-${CARGO_TARGET_DIR:-$HOME/.cache/cairn-target}/debug/cairn}"
W="$(mktemp -d)"
trap 'rm -rf "$W"; docker rmi cairn-bench:old cairn-bench:new cairn-bench:unstripped >/dev/null 2>&1 || true' EXIT
mkdir "$W/ctx"
git show 3e7989b:deploy/images/service.Dockerfile >"$W/old.Dockerfile"
cp deploy/images/service.Dockerfile "$W/new.Dockerfile"
ms() { date +%s%3N; }
build() { # dockerfile tag strip -> ms
    date +%s%N >"$W/nonce"
    objcopy --add-section .note.bench="$W/nonce" "$BIN" "$W/raw"
    if [ "$3" = 1 ]; then strip --strip-debug -o "$W/ctx/cairn" "$W/raw"; else cp "$W/raw" "$W/ctx/cairn"; fi
    chmod 0755 "$W/ctx/cairn"
    local t; t=$(ms)
    docker build -q --build-arg BASE_IMAGE=cairn-base:bookworm --build-arg CAIRN_BINARY=cairn \
        -f "$1" -t "$2" "$W/ctx" >/dev/null 2>"$W/err" || { cat "$W/err" >&2; exit 1; }
    echo $(( $(ms) - t ))
}
build "$W/old.Dockerfile" cairn-bench:old 1 >/dev/null   # prime the caches
build "$W/new.Dockerfile" cairn-bench:new 1 >/dev/null
build "$W/new.Dockerfile" cairn-bench:unstripped 0 >/dev/null
strip --strip-debug -o "$W/stripped" "$BIN"
echo "binary $(stat -c %s "$BIN") bytes, stripped $(stat -c %s "$W/stripped") bytes"
for i in 1 2 3; do
    echo "round $i: old order $(build "$W/old.Dockerfile" cairn-bench:old 1) ms," \
        "new order $(build "$W/new.Dockerfile" cairn-bench:new 1) ms," \
        "new order unstripped $(build "$W/new.Dockerfile" cairn-bench:unstripped 0) ms" \
        "(load $(cut -d' ' -f1 /proc/loadavg))"
done
docker images --format '{{.Repository}}:{{.Tag}} {{.Size}}' | grep cairn-bench
