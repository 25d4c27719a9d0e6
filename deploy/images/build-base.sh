#!/usr/bin/env bash
# Builds the offline base image (default cairn-base:bookworm) without any container registry:
# debootstrap a Debian minbase rootfs from Debian's own package mirror, trim it, and
# `docker import` it. Every other cairn image builds FROM this one (ARG BASE_IMAGE).
#
# Usage: build-base.sh [--force]
#   --force   rebuild even when the image already exists
# Environment:
#   CAIRN_BASE_IMAGE      image name:tag to create     (default cairn-base:bookworm)
#   CAIRN_DEBIAN_MIRROR   Debian mirror URL            (default: the one apt on this host uses,
#                                                       else http://deb.debian.org/debian)
#   CAIRN_DEBIAN_SUITE    Debian suite                 (default bookworm)
#   CAIRN_BASE_TMPFS      1: build in a tmpfs when >3 GiB of memory is free (default); 0: on disk
set -euo pipefail

readonly PACKAGES="python3,bash,coreutils,git,zip,unzip,tar,gzip,ca-certificates,procps,findutils,grep,sed"

IMAGE="${CAIRN_BASE_IMAGE:-cairn-base:bookworm}"
SUITE="${CAIRN_DEBIAN_SUITE:-bookworm}"
FORCE=0

say() { printf 'build-base: %s\n' "$*"; }
die() { printf 'build-base: error: %s\n' "$*" >&2; exit 1; }

for arg in "$@"; do
    case "$arg" in
        --force) FORCE=1 ;;
        -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
        *) die "unknown argument '$arg' (expected --force or --help)" ;;
    esac
done

# The Debian mirror apt already uses on this host (deb822 `URIs:` or one-line `deb URL suite`),
# ignoring security/updates archives and non-Debian repositories.
host_debian_mirror() {
    local files=() f
    for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources; do
        [ -r "$f" ] && files+=("$f")
    done
    [ "${#files[@]}" -gt 0 ] || return 0
    awk '
        /^[[:space:]]*#/ { next }
        /^[[:space:]]*URIs:/ { for (i = 2; i <= NF; i++) print $i; next }
        /^[[:space:]]*deb[[:space:]]/ {
            for (i = 2; i <= NF; i++) if ($i !~ /^\[/ && $i !~ /\]$/) { print $i; break }
        }
    ' "${files[@]}" | grep -E '^https?://[^ ]*/debian/?$' | head -n1 | sed 's#/$##'
}

MIRROR="${CAIRN_DEBIAN_MIRROR:-$(host_debian_mirror)}"
MIRROR="${MIRROR:-http://deb.debian.org/debian}"

command -v docker >/dev/null 2>&1 || die "docker CLI not found"
docker info >/dev/null 2>&1 || die "the Docker engine does not answer (docker info failed); start it and retry"

if [ "$FORCE" -eq 0 ] && docker image inspect "$IMAGE" >/dev/null 2>&1; then
    say "$IMAGE already exists, skipping (use --force to rebuild)"
    exit 0
fi

[ "$(id -u)" -eq 0 ] || die "must run as root (debootstrap creates device nodes and chroots); try: sudo $0 $*"
command -v debootstrap >/dev/null 2>&1 || die "debootstrap is not installed; run scripts/setup.sh or: apt-get install debootstrap"

WORK="$(mktemp -d "${TMPDIR:-/var/tmp}/cairn-base.XXXXXX")"
ROOTFS="$WORK/rootfs"
mkdir "$ROOTFS"

# Unmount anything debootstrap left mounted (an interrupted second stage leaves proc/sys
# mounted) before deleting, and never cross into another filesystem while deleting.
cleanup() {
    local mounts
    mounts="$(awk -v w="$WORK" 'index($2, w "/") == 1 { print $2 }' /proc/mounts | sort -r)"
    if [ -n "$mounts" ]; then
        while IFS= read -r m; do umount -l "$m" 2>/dev/null || true; done <<<"$mounts"
    fi
    rm -rf --one-file-system "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

started=$(date +%s)
# Build in memory when there is room: dpkg fsyncs every file and deleting a tree on a
# discard-mounted disk is slow; a tmpfs needs neither (the rootfs peaks near 400 MiB).
# Falls back to the disk where mounting is not allowed (e.g. an unprivileged CI container).
mem_avail_kib="$(awk '/^MemAvailable:/ { print $2 }' /proc/meminfo 2>/dev/null || echo 0)"
if [ "${CAIRN_BASE_TMPFS:-1}" = "1" ] && [ "${mem_avail_kib:-0}" -gt $(( 3 * 1024 * 1024 )) ] \
    && mount -t tmpfs -o size=1g,mode=0755,dev,exec,suid cairn-base "$ROOTFS" 2>/dev/null; then
    say "building in a tmpfs at $ROOTFS (CAIRN_BASE_TMPFS=0 to build on disk)"
fi
say "debootstrap $SUITE (minbase) from $MIRROR into $ROOTFS"
if ! debootstrap --variant=minbase --include="$PACKAGES" "$SUITE" "$ROOTFS" "$MIRROR" \
        >"$WORK/debootstrap.log" 2>&1; then
    tail -n 30 "$WORK/debootstrap.log" >&2
    [ -r "$ROOTFS/debootstrap/debootstrap.log" ] && tail -n 30 "$ROOTFS/debootstrap/debootstrap.log" >&2
    die "debootstrap failed (mirror $MIRROR, suite $SUITE); set CAIRN_DEBIAN_MIRROR to a reachable Debian mirror"
fi

say "debootstrap done in $(( $(date +%s) - started ))s; trimming docs, man pages, locales, apt lists and caches"
rm -rf "${ROOTFS:?}"/usr/share/doc/* "${ROOTFS:?}"/usr/share/man/* "${ROOTFS:?}"/usr/share/info/* \
       "${ROOTFS:?}"/usr/share/lintian "${ROOTFS:?}"/usr/share/linda \
       "${ROOTFS:?}"/var/lib/apt/lists/* "${ROOTFS:?}"/var/cache/apt/*.bin \
       "${ROOTFS:?}"/var/cache/apt/archives/*.deb "${ROOTFS:?}"/var/cache/debconf/*-old \
       "${ROOTFS:?}"/var/log/* "${ROOTFS:?}"/tmp/* "${ROOTFS:?}"/var/tmp/* "${ROOTFS:?}"/dev/* \
       "${ROOTFS:?}"/debootstrap
find "$ROOTFS"/usr/share/locale -mindepth 1 -maxdepth 1 ! -name locale.alias -exec rm -rf {} +
# Keep later installs (derived images) as small: the same rules official slim images use.
cat >"$ROOTFS/etc/dpkg/dpkg.cfg.d/cairn-nodoc" <<'EOF'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/info/*
path-exclude /usr/share/locale/*
path-include /usr/share/locale/locale.alias
EOF
cat >"$ROOTFS/etc/apt/apt.conf.d/cairn-clean" <<'EOF'
APT::Install-Recommends "false";
DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/*.bin || true"; };
EOF
# Host identity copied in by debootstrap; Docker bind-mounts its own over these files.
: >"$ROOTFS/etc/resolv.conf"
: >"$ROOTFS/etc/hostname"
[ -e "$ROOTFS/etc/machine-id" ] && : >"$ROOTFS/etc/machine-id"

old_id="$(docker image inspect -f '{{.Id}}' "$IMAGE" 2>/dev/null || true)"
say "importing into Docker as $IMAGE"
tar --numeric-owner -C "$ROOTFS" -c . | docker import \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV LANG=C.UTF-8' \
    --change 'CMD ["bash"]' \
    --change "LABEL cairn.base.suite=$SUITE" \
    --change "LABEL cairn.base.packages=$PACKAGES" \
    - "$IMAGE" >/dev/null \
    || die "docker import of the rootfs as $IMAGE failed"

# The image this one replaced (--force) is now untagged: remove it unless something uses it
# (images built on it keep it until they are rebuilt).
if [ -n "$old_id" ] && [ "$(docker image inspect -f '{{len .RepoTags}}' "$old_id" 2>/dev/null)" = "0" ]; then
    docker rmi "$old_id" >/dev/null 2>&1 || true
fi

elapsed=$(( $(date +%s) - started ))
size="$(docker image inspect -f '{{.Size}}' "$IMAGE")"
say "built $IMAGE ($(( size / 1024 / 1024 )) MiB) in ${elapsed}s"
