#!/usr/bin/env bash
# Builds every cairn image that is missing or out of date, with no registry by default:
#   1. the base image (build-base.sh: debootstrap + docker import; skipped when present),
#   2. the sandbox image (sandbox.Dockerfile; skipped when present, built from the same
#      Dockerfile and on the same base image: both are recorded in its label cairn.build),
#   3. the toolchain image (toolchain.Dockerfile: the sandbox layout plus pip, venv, node, npm,
#      gcc, make, git, curl from Debian's mirror; skipped the same way), unless --no-toolchain,
#   4. the service image (service.Dockerfile), only with --service and a built `cairn` binary,
#      and the etcd image of the compose deployment (etcd.Dockerfile: Debian's etcd-server
#      from Debian's mirror; skipped when built).
#
# Usage: build-images.sh [--force] [--service] [--no-toolchain]
#   --force          rebuild everything (the base image too, no build cache)
#   --service        also build the service image from $CAIRN_BINARY
#   --no-toolchain   leave the toolchain image out (its first build downloads ~100 MiB of
#                    packages from Debian's mirror)
# Environment:
#   CAIRN_BASE_IMAGE      base image                 (default cairn-base:bookworm)
#   CAIRN_BASE_SOURCE     debootstrap | registry     (default debootstrap; registry = docker pull
#                                                     $CAIRN_BASE_IMAGE, e.g. debian:bookworm-slim)
#   CAIRN_SANDBOX_IMAGE   sandbox image              (default cairn-sandbox:latest)
#   CAIRN_TOOLCHAIN_IMAGE toolchain image            (default cairn-toolchain:latest)
#   CAIRN_TOOLCHAIN       0: same as --no-toolchain   (default 1)
#   CAIRN_SERVICE_IMAGE   service image              (default cairn:latest)
#   CAIRN_ETCD_IMAGE      etcd image (with --service) (default cairn-etcd:latest)
#   CAIRN_BINARY          the cairn binary to package (default target/release/cairn, then
#                                                     $CARGO_TARGET_DIR/release/cairn)
#   CAIRN_STRIP           1 (default): package the binary without debug info, which goes to
#                         $CAIRN_DEBUG_FILE (split-debug.sh); 0: package the binary as it is
#   CAIRN_DEBUG_FILE      where the debug info goes      (default: the binary's path + .debug;
#                                                     none: discard it)
#   plus those of build-base.sh (CAIRN_DEBIAN_MIRROR, CAIRN_DEBIAN_SUITE).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"

export CAIRN_BASE_IMAGE="${CAIRN_BASE_IMAGE:-cairn-base:bookworm}"
BASE_SOURCE="${CAIRN_BASE_SOURCE:-debootstrap}"
SANDBOX_IMAGE="${CAIRN_SANDBOX_IMAGE:-cairn-sandbox:latest}"
TOOLCHAIN_IMAGE="${CAIRN_TOOLCHAIN_IMAGE:-cairn-toolchain:latest}"
SERVICE_IMAGE="${CAIRN_SERVICE_IMAGE:-cairn:latest}"
ETCD_IMAGE="${CAIRN_ETCD_IMAGE:-cairn-etcd:latest}"
# The daemon here (docker.io 20.10) has no buildx; the Dockerfiles need nothing from BuildKit.
export DOCKER_BUILDKIT="${DOCKER_BUILDKIT:-0}"

FORCE=0
SERVICE=0
TOOLCHAIN="${CAIRN_TOOLCHAIN:-1}"
for arg in "$@"; do
    case "$arg" in
        --force) FORCE=1 ;;
        --service) SERVICE=1 ;;
        --no-toolchain) TOOLCHAIN=0 ;;
        -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
        *) printf 'build-images: error: unknown argument %s (expected --force, --service, --no-toolchain, --help)\n' "$arg" >&2; exit 2 ;;
    esac
done

say() { printf 'build-images: %s\n' "$*"; }
die() { printf 'build-images: error: %s\n' "$*" >&2; exit 1; }
now_ms() { date +%s%3N; }
label_of() { docker image inspect -f "{{index .Config.Labels \"$2\"}}" "$1" 2>/dev/null || true; }

command -v docker >/dev/null 2>&1 || die "docker CLI not found"
docker info >/dev/null 2>&1 || die "the Docker engine does not answer (docker info failed)"

total_start=$(now_ms)

# 1. Base image.
step_start=$(now_ms)
case "$BASE_SOURCE" in
    debootstrap)
        if [ "$FORCE" -eq 1 ]; then "$HERE/build-base.sh" --force; else "$HERE/build-base.sh"; fi
        ;;
    registry)
        if [ "$FORCE" -eq 1 ] || ! docker image inspect "$CAIRN_BASE_IMAGE" >/dev/null 2>&1; then
            say "pulling $CAIRN_BASE_IMAGE"
            docker pull "$CAIRN_BASE_IMAGE" \
                || die "could not pull $CAIRN_BASE_IMAGE; with no registry, leave CAIRN_BASE_SOURCE unset (debootstrap)"
        else
            say "$CAIRN_BASE_IMAGE already present"
        fi
        ;;
    *) die "CAIRN_BASE_SOURCE must be debootstrap or registry, not '$BASE_SOURCE'" ;;
esac
base_id="$(docker image inspect -f '{{.Id}}' "$CAIRN_BASE_IMAGE")" \
    || die "base image $CAIRN_BASE_IMAGE is missing after step 1"
say "base $CAIRN_BASE_IMAGE ready ($(( $(now_ms) - step_start )) ms)"

# Builds image $1 from Dockerfile $2 with context $3 unless an image with content hash $4 on
# the same base image already exists (both recorded in the label cairn.build). Extra args go
# to docker build.
build_if_changed() {
    local image="$1" dockerfile="$2" context="$3" hash="$4"; shift 4
    local started
    # One label (each --label is one more ~2 s commit with the legacy builder).
    local build="content=sha256:$hash base=$base_id"
    if [ "$FORCE" -eq 0 ] && [ "$(label_of "$image" cairn.build)" = "$build" ]; then
        say "$image is up to date (content sha256 ${hash:0:12}, same base), skipping"
        return 0
    fi
    local old_id new_id
    old_id="$(docker image inspect -f '{{.Id}}' "$image" 2>/dev/null || true)"
    started=$(now_ms)
    say "building $image from $(basename "$dockerfile") on $CAIRN_BASE_IMAGE"
    # No --pull: FROM must resolve to the local base image, never to a registry.
    # Output is kept for a failure only (the legacy builder also warns that it is deprecated).
    local cache=()
    [ "$FORCE" -eq 1 ] && cache=(--no-cache)
    # A Dockerfile that declares ARG CAIRN_BUILD sets the label itself (early, where a step is
    # cheap); --label appends a step after the last instruction.
    local label=(--label "cairn.build=$build")
    grep -q '^ARG CAIRN_BUILD' "$dockerfile" && label=(--build-arg "CAIRN_BUILD=$build")
    if ! docker build "${cache[@]+"${cache[@]}"}" \
            --build-arg "BASE_IMAGE=$CAIRN_BASE_IMAGE" \
            "${label[@]}" \
            "$@" -f "$dockerfile" -t "$image" "$context" >"$work/build.log" 2>&1; then
        tail -n 40 "$work/build.log" >&2
        die "docker build of $image failed (rerun: DOCKER_BUILDKIT=0 docker build -f $dockerfile --build-arg BASE_IMAGE=$CAIRN_BASE_IMAGE $context)"
    fi
    say "built $image ($(( $(now_ms) - started )) ms)"
    built=1
    # The image it replaced is now untagged: remove it unless a container still uses it.
    new_id="$(docker image inspect -f '{{.Id}}' "$image")"
    if [ -n "$old_id" ] && [ "$old_id" != "$new_id" ] \
        && [ "$(docker image inspect -f '{{len .RepoTags}}' "$old_id" 2>/dev/null)" = "0" ]; then
        docker rmi "$old_id" >/dev/null 2>&1 || true
    fi
}

# 2. Sandbox image: its content is the Dockerfile alone; it copies nothing, so the build
# context is an empty directory.
work="$(mktemp -d "${TMPDIR:-/tmp}/cairn-images.XXXXXX")"
trap 'rm -rf "$work"' EXIT
ctx="$work/context"
mkdir "$ctx"
build_if_changed "$SANDBOX_IMAGE" "$HERE/sandbox.Dockerfile" "$ctx" \
    "$(sha256sum <"$HERE/sandbox.Dockerfile" | cut -d' ' -f1)"

# 3. Toolchain image: the same, its packages from Debian's mirror (apt inside the build).
if [ "$TOOLCHAIN" != 0 ]; then
    build_if_changed "$TOOLCHAIN_IMAGE" "$HERE/toolchain.Dockerfile" "$ctx" \
        "$(sha256sum <"$HERE/toolchain.Dockerfile" | cut -d' ' -f1)"
    say "toolchain $TOOLCHAIN_IMAGE: $(( $(docker image inspect -f '{{.Size}}' "$TOOLCHAIN_IMAGE") / 1024 / 1024 )) MiB"
else
    say "toolchain image left out (--no-toolchain or CAIRN_TOOLCHAIN=0)"
fi

# 4. Service image: its content is the Dockerfile plus the binary; the context holds only the
# binary (never the whole repository or target/).
if [ "$SERVICE" -eq 1 ]; then
    binary="${CAIRN_BINARY:-}"
    if [ -z "$binary" ]; then
        for candidate in "$REPO/target/release/cairn" "${CARGO_TARGET_DIR:-$REPO/target}/release/cairn"; do
            if [ -x "$candidate" ]; then binary="$candidate"; break; fi
        done
    fi
    [ -n "$binary" ] && [ -x "$binary" ] \
        || die "no cairn binary found (cargo build --release -p cairn, or set CAIRN_BINARY=PATH)"
    # Debug info is most of a release binary's size (bench/RESULTS.md, "Binary size"), and
    # every byte is sent to the daemon and committed in a layer; the symbol table stays, so
    # backtraces still name functions. The debug info is kept beside the binary
    # (split-debug.sh: <binary>.debug, linked by .gnu_debuglink) for debuggers and symbolizers.
    # CAIRN_STRIP=0 packages the binary as it is.
    debug_file="${CAIRN_DEBUG_FILE:-$binary.debug}"
    if [ "${CAIRN_STRIP:-1}" != 0 ] && [ "$debug_file" = none ] && command -v strip >/dev/null 2>&1; then
        strip --strip-debug -o "$ctx/cairn" "$binary" || die "strip --strip-debug $binary failed (CAIRN_STRIP=0 skips it)"
    elif [ "${CAIRN_STRIP:-1}" != 0 ] && command -v objcopy >/dev/null 2>&1; then
        # The link names cairn.debug, the name the packaged binary's debug file goes by.
        "$HERE/split-debug.sh" "$binary" "$ctx/cairn" "$work/cairn.debug" >/dev/null \
            || die "split-debug.sh $binary failed (CAIRN_STRIP=0 skips it)"
        mv -f "$work/cairn.debug" "$debug_file" || die "cannot write $debug_file (CAIRN_DEBUG_FILE=none discards it)"
        say "debug info of $binary in $debug_file"
    else
        cp "$binary" "$ctx/cairn"
    fi
    chmod 0755 "$ctx/cairn"
    built=0
    build_if_changed "$SERVICE_IMAGE" "$HERE/service.Dockerfile" "$ctx" \
        "$(cat "$HERE/service.Dockerfile" "$ctx/cairn" | sha256sum | cut -d' ' -f1)" \
        --build-arg CAIRN_BINARY=cairn
    # The binary must start in the image (glibc of the build host vs the base's).
    if [ "$built" -eq 1 ] && ! docker run --rm --network none "$SERVICE_IMAGE" --help >"$work/help.log" 2>&1; then
        tail -n 20 "$work/help.log" >&2
        docker rmi "$SERVICE_IMAGE" >/dev/null 2>&1 || true
        die "the cairn binary does not start in $SERVICE_IMAGE (build it on Debian bookworm); image removed"
    fi
    cp "$HERE/etcd-entrypoint.sh" "$ctx/etcd-entrypoint.sh"
    build_if_changed "$ETCD_IMAGE" "$HERE/etcd.Dockerfile" "$ctx" \
        "$(cat "$HERE/etcd.Dockerfile" "$HERE/etcd-entrypoint.sh" | sha256sum | cut -d' ' -f1)"
fi

say "done in $(( $(now_ms) - total_start )) ms"
