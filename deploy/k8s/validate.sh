#!/usr/bin/env bash
# Renders every kustomization of deploy/k8s (base and each overlay) and validates the result:
#   1. renders with `kubectl kustomize` (kustomize v5, built into kubectl; `kustomize build`
#      where only the standalone kustomize is installed);
#   2. checks cairn's deployment rules (tools/rules.py: security contexts, `cairn health` exec
#      probes and a TLS Secret per service, resources, default-deny NetworkPolicies,
#      single-replica store, ...);
#   3. validates every object against the Kubernetes OpenAPI schemas, strict (unknown fields
#      are errors), with the PyPI package kubernetes-validate for each pinned version.
# The Python tools run in a venv created on first use (needs PyPI once). No cluster is needed.
#
# Usage: deploy/k8s/validate.sh [--venv]     (--venv: set up the venv, print its python, exit)
# Environment:
#   CAIRN_K8S_PYENV     the venv                        (default $HOME/.cache/cairn-pyenv-k8s)
#   CAIRN_K8S_VERSIONS  Kubernetes versions to check    (default "1.28.0 1.37.0": the oldest
#                                                        supported and the newest known)
#   CAIRN_K8S_OUT       keep the rendered YAML here     (default: a temporary directory)
# Exit status: 0 valid, 1 invalid or failed, 3 no renderer (neither kubectl nor kustomize).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
VENV="${CAIRN_K8S_PYENV:-$HOME/.cache/cairn-pyenv-k8s}"
VERSIONS="${CAIRN_K8S_VERSIONS:-1.28.0 1.37.0}"
# Pinned: its bundled schemas are what "valid" means here.
PIN="kubernetes-validate==1.37.0"

say() { printf 'validate: %s\n' "$*"; }
die() { printf 'validate: error: %s\n' "$*" >&2; exit 1; }

# One setup at a time (tests run this script in parallel); the lock is released at exit.
mkdir -p "$(dirname "$VENV")"
exec 9>"$VENV.lock"
flock 9
if [ ! -x "$VENV/bin/python" ] || ! "$VENV/bin/python" -c 'import kubernetes_validate, yaml' 2>/dev/null \
    || [ "$("$VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("kubernetes-validate"))' 2>/dev/null)" != "${PIN#*==}" ]; then
    say "creating $VENV ($PIN, from PyPI)" >&2  # stdout of --venv is the python path alone
    python3 -m venv "$VENV" || die "python3 -m venv $VENV failed (apt-get install python3-venv)"
    "$VENV/bin/pip" install -q --disable-pip-version-check "$PIN" \
        || die "pip install $PIN failed (PyPI is needed once to set up $VENV)"
fi
flock -u 9
PY="$VENV/bin/python"
if [ "${1:-}" = "--venv" ]; then
    printf '%s\n' "$PY"
    exit 0
fi
[ $# -eq 0 ] || die "unknown argument $1 (expected --venv or nothing)"

if command -v kubectl >/dev/null 2>&1 && kubectl kustomize --help >/dev/null 2>&1; then
    render=(kubectl kustomize)
elif command -v kustomize >/dev/null 2>&1; then
    render=(kustomize build)
else
    printf 'validate: error: neither kubectl (kubectl kustomize) nor kustomize is installed; nothing rendered\n' >&2
    exit 3
fi

if [ -n "${CAIRN_K8S_OUT:-}" ]; then
    OUT="$CAIRN_K8S_OUT"
    mkdir -p "$OUT"
else
    OUT="$(mktemp -d "${TMPDIR:-/tmp}/cairn-k8s.XXXXXX")"
    trap 'rm -rf "$OUT"' EXIT
fi

targets=(base)
for d in "$HERE"/overlays/*/; do
    [ -f "$d/kustomization.yaml" ] && targets+=("overlays/$(basename "$d")")
done

for target in "${targets[@]}"; do
    name="${target//\//-}"
    rendered="$OUT/$name.yaml"
    "${render[@]}" "$HERE/$target" >"$rendered" || die "$target: ${render[*]} failed"
    count="$(grep -c '^kind:' "$rendered" || true)"
    [ "$count" -gt 0 ] || die "$target: ${render[*]} rendered no objects"
    "$PY" "$HERE/tools/rules.py" "$rendered" \
        || die "$target: breaks cairn's deployment rules (see above)"
    for version in $VERSIONS; do
        "$VENV/bin/kubernetes-validate" --strict --quiet -k "$version" "$rendered" \
            || die "$target: not valid for Kubernetes $version (strict)"
    done
    say "$target: $count objects rendered (${render[*]}), rules kept, schema-valid (strict) for Kubernetes $VERSIONS"
done
say "ok"
