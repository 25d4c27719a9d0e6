#!/usr/bin/env bash
# Mutation testing of the security- and durability-critical code (cargo-mutants): each mutant
# is a small change to a check (a condition inverted, a body replaced by a default); a mutant
# that no test fails on ("missed") is a check a broken change could pass. Not part of
# scripts/test.sh; docs/testing.md has the scopes, the last result and the survivors' reasons.
#
#   bash scripts/mutants.sh              # every scope below, one after the other
#   bash scripts/mutants.sh pathguard server-access   # some scopes
#   bash scripts/mutants.sh --list       # the scopes and their files
#
# Needs cargo-mutants and cargo-nextest (`cargo install cargo-mutants --locked`). One mutant at
# a time (-j1: the machine has 2 cores); each mutant runs only the tests of its own package.
# Results go to $CAIRN_MUTANTS_OUT/<scope>/mutants.out (default target/mutants under the
# build dir): missed.txt, caught.txt, timeout.txt, unviable.txt. CAIRN_MUTANTS_ARGS adds
# cargo-mutants options, e.g. "--iterate" to test again only what the last run missed.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

# Its own build dir: mutated copies of the tree build there, never in the one the tests and
# other checkouts share (a mutant's build would evict theirs). Kept between runs.
export CARGO_TARGET_DIR="${CAIRN_MUTANTS_TARGET:-$HOME/.cache/cairn-mutants-target}"
out_root="${CAIRN_MUTANTS_OUT:-$CARGO_TARGET_DIR/mutants}"
# Seconds a mutant's tests may take before it counts as a timeout (a hang is caught too).
timeout="${CAIRN_MUTANTS_TIMEOUT:-120}"

# scope  package  files (globs relative to the workspace root)
scopes=(
    "pathguard|pathguard|crates/pathguard/src/*.rs"
    "server-access|cairn-server|crates/server/src/access.rs"
    "server-tls|cairn-server|crates/server/src/tls.rs crates/server/src/caller.rs"
    "contain|cairn-contain|crates/contain/src/*.rs"
    "store|cairn-artifact-store|services/artifact-store/src/write.rs services/artifact-store/src/events.rs services/artifact-store/src/deferred.rs services/artifact-store/src/access.rs services/artifact-store/src/publication.rs"
    "store-client|cairn-store-client|crates/store-client/src/lib.rs"
    "orchestrator-auth|cairn-orchestrator|services/orchestrator/src/auth/*.rs"
    "console-guard|cairn-console|crates/console/src/guard.rs"
    "agents-providers|cairn-agents|crates/agents/src/providers.rs"
    "sandbox-isolation|cairn-sandbox-runner|services/sandbox-runner/src/backend/local.rs"
)

# What each mutant of a scope runs, where the package's whole suite would be too slow (a
# mutant rebuilds every test binary selected, and runs them): cargo-mutants options, among
# them `-C` (cargo: the test targets built) and `--cargo-test-arg` (a nextest filter). Any
# other scope runs every test of its package. docs/testing.md says why each choice suffices.
declare -A narrow=(
    [store]="-F access\.rs|publication\.rs:.*Boot::|deferred\.rs|Publication>?::(finish|drop)|RunLogs::(defer_dir_sync|start_publication|append_fenced)|(replace|in)\scommit\b|write\.rs:.*(\bpublish\b|fence_ticket|publish_now) -E PendingDirs::lock -C --lib -C --test=files_test"
    [store-client]="-F is_publication_unproven|Store::(put|unproven_of|append_events_fenced|write_again|forget_claim)\b|UnprovenGuard"
    [orchestrator-auth]="-F auth/mod\.rs|JwtVerifier::(verify|caller)|algorithm_of|\bstrings\b|same_bytes|TokensFile::find|tokens\.rs:.*\bhash\b -C --lib -C --test=auth_test -C --test=jwt_test --cargo-test-arg=-E --cargo-test-arg=not(kind(lib))|test(/^auth::/)"
    [console-guard]="-C --lib -C --test=console_auth_test"
    [sandbox-isolation]="-F (Base::(minimal_root|check_reachable|probe|namespace_args|command)|close_inherited_fds_on_exec|rlimits) -C --lib -C --test=process_test --cargo-test-arg=-E --cargo-test-arg=test(/environ|secret|^backend::local::/)"
)

if [ "${1:-}" = "--list" ]; then
    for s in "${scopes[@]}"; do
        IFS='|' read -r name package files <<<"$s"
        printf '%-18s %-22s %s\n' "$name" "$package" "$files"
        if [ -n "${narrow[$name]:-}" ]; then
            printf '%-18s %-22s %s\n' "" "" "only: ${narrow[$name]}"
        fi
    done
    exit 0
fi

command -v cargo-mutants >/dev/null || {
    echo "cargo-mutants is not installed: cargo install cargo-mutants --locked" >&2
    exit 2
}

wanted=("$@")
status=0
for s in "${scopes[@]}"; do
    IFS='|' read -r name package files <<<"$s"
    if [ "${#wanted[@]}" -gt 0 ] && ! printf '%s\n' "${wanted[@]}" | grep -qx "$name"; then
        continue
    fi
    args=(--package "$package" --jobs 1 --timeout "$timeout" --build-timeout 900
        --test-tool nextest --output "$out_root/$name" --no-shuffle)
    for f in $files; do args+=(--file "$f"); done
    # read -a splits on blanks without globbing the filters' parentheses and stars.
    read -r -a only <<<"${narrow[$name]:-}"
    args+=("${only[@]}")
    # shellcheck disable=SC2206 # options are words
    args+=(${CAIRN_MUTANTS_ARGS:-})
    mkdir -p "$out_root/$name"
    printf '\n== mutants: %s (%s) ==\n' "$name" "$files"
    start=$(date +%s)
    # Exit 2: some mutants were missed; 3: some timed out; both are reported below.
    cargo mutants "${args[@]}" || status=1
    echo "-- $name: $(($(date +%s) - start)) s"
    for kind in missed timeout; do
        f="$out_root/$name/mutants.out/$kind.txt"
        if [ -s "$f" ]; then
            echo "-- $name $kind:"
            cat "$f"
        fi
    done
done
exit "$status"
