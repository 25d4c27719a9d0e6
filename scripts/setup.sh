#!/usr/bin/env bash
# Sets up a machine (Debian bookworm, as root) to build and test cairn; safe to run again.
#   1. apt-get installs only the packages that are missing (no apt-get update otherwise);
#   2. fetches axe-core once (the console's accessibility test) into ~/.cache/cairn-axe, and
#      Debian 13's runsc once into /opt/cairn-runsc/trixie (sessions are tested on both);
#   3. checks that the Docker engine answers;
#   4. builds the images (deploy/images/build-images.sh: skips what is already built; prints
#      how long each build took). The toolchain image's first build fetches its packages from
#      Debian's mirror; CAIRN_TOOLCHAIN=0 leaves it out (its Docker tests then SKIP, or fail
#      under CAIRN_REQUIRE_DOCKER=1).
# Does not install Docker or the Rust toolchain.
#
# Usage: scripts/setup.sh [--force]   (--force rebuilds the images)
# Environment:
#   CAIRN_AXE_JS             where axe.min.js goes   (default $HOME/.cache/cairn-axe/axe.min.js)
#   CAIRN_NEWER_RUNSC        where Debian 13's runsc goes (default /opt/cairn-runsc/trixie/runsc)
#   CAIRN_REQUIRE_DOCKER=1   fail when Docker does not answer (CI); otherwise warn and go on
#                            without images (the local sandbox backend still works)
#   plus those of deploy/images/build-images.sh (CAIRN_BASE_IMAGE, CAIRN_SANDBOX_IMAGE, ...)
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/.." && pwd)"

# debootstrap + debian-archive-keyring: the offline base image; bubblewrap: the local sandbox
# backend; runsc: the gvisor sandbox backend; etcd-server: orchestrator replicas (their tests start an etcd); protobuf-compiler + libprotobuf-dev: the etcd-client crate's build script (cairn's own protos compile with protox); python3-venv: benchmark peers (bench/); chromium + chromium-driver: the web
# console's browser test (crates/console/tests/console_browser_test.rs); the rest: image
# builds, tests, packing.
readonly PACKAGES=(
    debootstrap debian-archive-keyring bubblewrap runsc etcd-server protobuf-compiler libprotobuf-dev
    python3 python3-venv
    chromium chromium-driver
    openssl ca-certificates git zip unzip tar gzip coreutils procps
)

BUILD_ARGS=()
for arg in "$@"; do
    case "$arg" in
        --force) BUILD_ARGS+=(--force) ;;
        -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
        *) printf 'setup: error: unknown argument %s (expected --force or --help)\n' "$arg" >&2; exit 2 ;;
    esac
done

say() { printf 'setup: %s\n' "$*"; }
warn() { printf 'setup: WARNING: %s\n' "$*" >&2; }
die() { printf 'setup: error: %s\n' "$*" >&2; exit 1; }

# 1. Packages: one dpkg-query for all of them; a package counts only when fully installed.
missing=()
installed="$(dpkg-query -W -f='${Package} ${db:Status-Status}\n' "${PACKAGES[@]}" 2>/dev/null || true)"
for p in "${PACKAGES[@]}"; do
    grep -qx "$p installed" <<<"$installed" || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
    [ "$(id -u)" -eq 0 ] || die "missing packages (${missing[*]}); run as root to install them"
    say "installing: ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
    say "packages present: ${PACKAGES[*]}"
fi

# 2. axe-core (accessibility checks of the console's browser test), once into a cache. No npm
# registry is needed: the PyPI wheel axe-playwright-python bundles axe.min.js. Both the wheel
# and the script are pinned by sha256; a present, matching file is left alone.
AXE_VERSION="4.12.1"
AXE_WHEEL="axe-playwright-python==0.1.8"
AXE_WHEEL_SHA256="fdd263c998388f1a8e67cad02677e612d946248bd44d163be5e8650ea31f95f8"
AXE_SHA256="84494fec757e4710dc751c8d7a636e457f4532f08f85c86dc9070133fbff53bc"
AXE_FILE="${CAIRN_AXE_JS:-$HOME/.cache/cairn-axe/axe.min.js}"
if [ -f "$AXE_FILE" ] && [ "$(sha256sum "$AXE_FILE" | cut -d' ' -f1)" = "$AXE_SHA256" ]; then
    say "axe-core $AXE_VERSION present ($AXE_FILE)"
else
    axe_tmp="$(mktemp -d)"
    if python3 -m pip download -q --no-deps --disable-pip-version-check "$AXE_WHEEL" -d "$axe_tmp" >/dev/null 2>&1; then
        wheel="$(ls "$axe_tmp"/*.whl)"
        [ "$(sha256sum "$wheel" | cut -d' ' -f1)" = "$AXE_WHEEL_SHA256" ] \
            || die "$AXE_WHEEL: the wheel's sha256 is not the pinned one"
        mkdir -p "$(dirname "$AXE_FILE")"
        python3 -c 'import sys, zipfile; sys.stdout.buffer.write(zipfile.ZipFile(sys.argv[1]).read("axe_playwright_python/axe.min.js"))' \
            "$wheel" >"$AXE_FILE.tmp"
        [ "$(sha256sum "$AXE_FILE.tmp" | cut -d' ' -f1)" = "$AXE_SHA256" ] \
            || { rm -f "$AXE_FILE.tmp"; die "axe.min.js of $AXE_WHEEL: sha256 is not the pinned one"; }
        mv "$AXE_FILE.tmp" "$AXE_FILE"
        say "axe-core $AXE_VERSION fetched into $AXE_FILE"
    else
        warn "could not download $AXE_WHEEL from PyPI: the console's accessibility test will SKIP (fail under CAIRN_REQUIRE_BROWSER=1)"
    fi
    rm -rf "$axe_tmp"
fi

# 2b. prometheus_client: the metrics test parses /metrics with Prometheus's own Python parser.
PROM_CLIENT="prometheus_client==0.26.0"
if python3 -c 'import prometheus_client' >/dev/null 2>&1; then
    say "python prometheus_client present"
elif python3 -m pip install -q --disable-pip-version-check "$PROM_CLIENT" >/dev/null 2>&1 \
    || python3 -m pip install -q --disable-pip-version-check --break-system-packages "$PROM_CLIENT" >/dev/null 2>&1; then
    say "python $PROM_CLIENT installed"
else
    warn "could not install $PROM_CLIENT from PyPI: the metrics test will SKIP (fail under CAIRN_REQUIRE_DOCKER=1)"
fi

# 2c. A second, newer runsc (Debian 13's) beside the system's: the session snapshot tests run
# on both, and a runner may be pointed at it (`[sandbox_runner] runsc`). Fetched with apt
# from Debian's mirror through lists of its own (the signed Release checked with this
# machine's Debian keyring), unpacked, never installed over the system's.
NEWER_RUNSC="${CAIRN_NEWER_RUNSC:-/opt/cairn-runsc/trixie/runsc}"
if [ -x "$NEWER_RUNSC" ]; then
    say "newer runsc present ($("$NEWER_RUNSC" --version 2>/dev/null | head -1))"
elif [ "$(id -u)" -eq 0 ]; then
    apt_dir="$(mktemp -d)"
    mkdir -p "$apt_dir/lists/partial" "$apt_dir/cache/archives/partial"
    echo 'deb http://deb.debian.org/debian trixie main' >"$apt_dir/sources.list"
    apt_opts=(-o "Dir::Etc::SourceList=$apt_dir/sources.list" -o Dir::Etc::SourceParts=/dev/null
        -o "Dir::State::Lists=$apt_dir/lists" -o "Dir::Cache=$apt_dir/cache")
    if apt-get -qq "${apt_opts[@]}" update >/dev/null 2>&1 \
        && (cd "$apt_dir" && apt-get -qq "${apt_opts[@]}" download runsc >/dev/null 2>&1) \
        && dpkg-deb -x "$apt_dir"/runsc_*.deb "$apt_dir/x"; then
        mkdir -p "$(dirname "$NEWER_RUNSC")"
        install -m 0755 "$apt_dir/x/usr/bin/runsc" "$NEWER_RUNSC"
        say "newer runsc fetched into $NEWER_RUNSC ($("$NEWER_RUNSC" --version | head -1))"
    else
        warn "could not fetch Debian 13's runsc: its session snapshot tests will SKIP (fail under CAIRN_REQUIRE_DOCKER=1)"
    fi
    rm -rf "$apt_dir"
fi

# 3. Docker.
docker_problem=""
if ! command -v docker >/dev/null 2>&1; then
    docker_problem="the docker CLI is not installed (apt-get install docker.io)"
elif ! timeout 20 docker info >/dev/null 2>&1; then
    docker_problem="the Docker engine does not answer (docker info failed: is dockerd running and may this user reach /var/run/docker.sock?)"
fi
if [ -n "$docker_problem" ]; then
    if [ "${CAIRN_REQUIRE_DOCKER:-0}" = "1" ]; then
        die "$docker_problem; CAIRN_REQUIRE_DOCKER=1 requires Docker"
    fi
    warn "$docker_problem"
    warn "continuing without images: Docker tests will SKIP and the sandbox runner will use its local backend"
    exit 0
fi
say "Docker answers (server $(docker version -f '{{.Server.Version}}' 2>/dev/null || echo unknown))"

# 4. Images.
"$REPO/deploy/images/build-images.sh" "${BUILD_ARGS[@]+"${BUILD_ARGS[@]}"}"
say "ready"
