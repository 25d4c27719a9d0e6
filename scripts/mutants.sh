#!/usr/bin/env bash
# Mutation testing of the security- and durability-critical code (cargo-mutants): each mutant
# is a small change to a check (a condition inverted, a body replaced by a default); a mutant
# that no test fails on ("missed") is a check a broken change could pass. Not part of
# scripts/test.sh; docs/testing.md has the scopes, the last result and the survivors' reasons.
#
#   bash scripts/mutants.sh --changed [BASE]   # only the lines this branch changed (the habit)
#   bash scripts/mutants.sh store-commit orchestrator-auth   # whole scopes
#   bash scripts/mutants.sh store              # both store scopes (store-write, store-commit)
#   bash scripts/mutants.sh                    # every scope below, one after the other
#   bash scripts/mutants.sh --list             # the scopes, their files and filters
#
# Each scope finishes within 30 minutes on 2 cores once its build dir is warm (docs/testing.md
# has the figures); the whole sweep is those scopes one after the other, or one CI job each.
#
# --changed mutates only the lines of the scopes' files that differ from where this branch
# left BASE (default main; committed and uncommitted changes, new files too), in the scopes
# those files belong to. --skip-baseline leaves out the run of the unmutated tests (do so only
# when they just passed on this tree: a failing baseline would count every mutant caught).
#
# Needs cargo-mutants and cargo-nextest (`cargo install cargo-mutants --locked`). One mutant at
# a time (in place: one checkout, 2 cores); each mutant runs only the tests of its own package
# (or the narrower set below).
#
# Mutants are made in a checkout kept for this script alone (CAIRN_MUTANTS_CHECKOUT, default
# ~/.cache/cairn-mutants-checkout, a detached git worktree), never in yours: each run resets
# it to your HEAD plus your uncommitted changes and mutates it in place (`--in-place`), with
# its own build dir (CAIRN_MUTANTS_TARGET, default ~/.cache/cairn-mutants-target) kept between
# runs, so only the crates a change or a mutant touches are built again. A run stopped
# half-way may leave a mutant in that checkout; the next run resets it.
# Results go to $CAIRN_MUTANTS_OUT/<scope>/mutants.out (default <build dir>/mutants):
# missed.txt, caught.txt, timeout.txt, unviable.txt. CAIRN_MUTANTS_ARGS adds cargo-mutants
# options, e.g. "--iterate" to test again only what the last run of the scope did not catch.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

# Its own build dir: never the one the tests and other checkouts share (a mutant's build would
# evict theirs).
export CARGO_TARGET_DIR="${CAIRN_MUTANTS_TARGET:-$HOME/.cache/cairn-mutants-target}"
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"
out_root="${CAIRN_MUTANTS_OUT:-$CARGO_TARGET_DIR/mutants}"
checkout="${CAIRN_MUTANTS_CHECKOUT:-$HOME/.cache/cairn-mutants-checkout}"
# Seconds a mutant's tests may take before it counts as a timeout (a hang is caught too).
timeout="${CAIRN_MUTANTS_TIMEOUT:-120}"

# scope  package  files (globs relative to the workspace root)
scopes=(
    "pathguard|pathguard|crates/pathguard/src/*.rs"
    "server-access|cairn-server|crates/server/src/access.rs"
    "server-tls|cairn-server|crates/server/src/tls.rs crates/server/src/caller.rs"
    "contain|cairn-contain|crates/contain/src/*.rs"
    "store-write|cairn-artifact-store|services/artifact-store/src/write.rs services/artifact-store/src/access.rs services/artifact-store/src/publication.rs"
    "store-commit|cairn-artifact-store|services/artifact-store/src/events.rs services/artifact-store/src/deferred.rs"
    "store-client|cairn-store-client|crates/store-client/src/lib.rs"
    "orchestrator-auth|cairn-auth|crates/auth/src/*.rs"
    "console-guard|cairn-console|crates/console/src/guard.rs"
    "agents-providers|cairn-agents|crates/agents/src/providers.rs"
    "sandbox-isolation|cairn-sandbox-runner|services/sandbox-runner/src/backend/local.rs"
    "sandbox-containers|cairn-sandbox-runner|services/sandbox-runner/src/backend/docker_config.rs services/sandbox-runner/src/backend/gvisor_spec.rs"
)

# What each mutant of a scope runs, where the package's whole suite would be too slow (a
# mutant rebuilds every test binary selected, and runs them): cargo-mutants options, among
# them `-C` (cargo: the test targets built) and `--cargo-test-arg` (a nextest filter). Any
# other scope runs every test of its package. docs/testing.md says why each choice suffices.
store_only="-F access\.rs|publication\.rs:.*Boot::|deferred\.rs|Publication>?::(finish|drop)|RunLogs::(defer_dir_sync|sync_dir_now|start_publication|append_fenced)|(replace|in)\scommit\b|write\.rs:.*(\bpublish\b|fence_ticket|publish_now) -E PendingDirs::lock -C --lib -C --test=files_test"
declare -A narrow=(
    [store-write]="$store_only"
    [store-commit]="$store_only"
    [server-tls]="-C --lib -C --test=access_layer_test"
    [store-client]="-F is_publication_unproven|Store::(put|unproven_of|append_events_fenced|write_again|forget_claim)\b|UnprovenGuard"
    [console-guard]="-C --lib -C --test=console_auth_test"
    [sandbox-containers]="-C --lib"
    [sandbox-isolation]="-F (Base::(minimal_root|check_reachable|probe|namespace_args|command)|close_inherited_fds_on_exec|rlimits) -C --lib -C --test=process_test --cargo-test-arg=-E --cargo-test-arg=test(/environ|secret|^backend::local::/)"
)

# Names for several scopes at once.
declare -A groups=([store]="store-write store-commit")

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; }

list=0 changed=0 skip_baseline=0 base=main
wanted=()
is_scope() {
    local s
    for s in "${scopes[@]}"; do [ "${s%%|*}" = "$1" ] && return 0; done
    return 1
}
while [ $# -gt 0 ]; do
    case "$1" in
    --list) list=1 ;;
    --changed)
        changed=1
        if [ $# -gt 1 ] && [[ "$2" != -* ]] && ! is_scope "$2" && [ -z "${groups[$2]:-}" ]; then
            base="$2"
            shift
        fi
        ;;
    --skip-baseline) skip_baseline=1 ;;
    -h | --help) usage; exit 0 ;;
    -*) echo "unknown option $1 (see --help)" >&2; exit 2 ;;
    *)
        if [ -n "${groups[$1]:-}" ]; then
            read -r -a members <<<"${groups[$1]}"
            wanted+=("${members[@]}")
        else
            is_scope "$1" || { echo "no scope named $1 (--list shows them)" >&2; exit 2; }
            wanted+=("$1")
        fi
        ;;
    esac
    shift
done

if [ "$list" = 1 ]; then
    for s in "${scopes[@]}"; do
        IFS='|' read -r name package files <<<"$s"
        printf '%-18s %-22s %s\n' "$name" "$package" "$files"
        if [ -n "${narrow[$name]:-}" ]; then
            printf '%-18s %-22s %s\n' "" "" "only: ${narrow[$name]}"
        fi
    done
    for g in "${!groups[@]}"; do printf '%-18s %s\n' "$g" "the scopes ${groups[$g]}"; done
    exit 0
fi

command -v cargo-mutants >/dev/null || {
    echo "cargo-mutants is not installed: cargo install cargo-mutants --locked" >&2
    exit 2
}

# The changes to test: from where this branch left BASE to the working tree, new files too.
# One diff per scope, of its files only (read before the checkout is touched).
declare -A diffs=()
if [ "$changed" = 1 ]; then
    fork=$(git merge-base "$base" HEAD) || {
        echo "--changed $base: no such branch or commit here" >&2
        exit 2
    }
    mkdir -p "$out_root"
    for s in "${scopes[@]}"; do
        IFS='|' read -r name package files <<<"$s"
        # shellcheck disable=SC2086 # the globs are git pathspecs here
        d=$(git diff "$fork" -- $files
            for f in $(git ls-files --others --exclude-standard -- $files); do
                git diff --no-index /dev/null "$f" || true
            done)
        if [ -n "$d" ]; then
            mkdir -p "$out_root/$name"
            printf '%s\n' "$d" >"$out_root/$name/changed.diff"
            diffs[$name]="$out_root/$name/changed.diff"
        fi
    done
    if [ "${#diffs[@]}" = 0 ]; then
        echo "no file of any scope changed since $base ($fork): nothing to mutate"
        exit 0
    fi
fi

# The checkout the mutants are made in: this tree's HEAD and uncommitted changes, nothing else
# (a mutant a stopped run left behind is reset first).
head=$(git rev-parse HEAD)
if ! git -C "$checkout" rev-parse --git-dir >/dev/null 2>&1; then
    mkdir -p "$(dirname "$checkout")"
    git worktree add --detach -q "$checkout" "$head"
fi
git -C "$checkout" reset -q --hard
git -C "$checkout" clean -q -fd
git -C "$checkout" checkout -q --detach "$head"
git diff --binary HEAD | git -C "$checkout" apply --allow-empty
git ls-files -z --others --exclude-standard | tar --null -T - -cf - | tar -C "$checkout" -xmf -

status=0
for s in "${scopes[@]}"; do
    IFS='|' read -r name package files <<<"$s"
    if [ "${#wanted[@]}" -gt 0 ] && ! printf '%s\n' "${wanted[@]}" | grep -qx "$name"; then
        continue
    fi
    if [ "$changed" = 1 ] && [ -z "${diffs[$name]:-}" ]; then
        continue
    fi
    args=(--package "$package" --timeout "$timeout" --build-timeout 900 --profile mutants
        --test-tool nextest --output "$out_root/$name" --no-shuffle --in-place)
    for f in $files; do args+=(--file "$f"); done
    # read -a splits on blanks without globbing the filters' parentheses and stars.
    read -r -a only <<<"${narrow[$name]:-}"
    args+=("${only[@]}")
    [ "$changed" = 1 ] && args+=(--in-diff "${diffs[$name]}")
    [ "$skip_baseline" = 1 ] && args+=(--baseline skip)
    # shellcheck disable=SC2206 # options are words
    args+=(${CAIRN_MUTANTS_ARGS:-})
    mkdir -p "$out_root/$name"
    printf '\n== mutants: %s (%s%s) ==\n' "$name" "$files" "${diffs[$name]:+, lines changed since $base}"
    start=$(date +%s)
    # Exit 2: some mutants were missed; 3: some timed out; both are reported below.
    (cd "$checkout" && cargo mutants "${args[@]}") || status=1
    echo "-- $name: $(($(date +%s) - start)) s"
    for kind in missed timeout; do
        f="$out_root/$name/mutants.out/$kind.txt"
        if [ -s "$f" ]; then
            echo "-- $name $kind:"
            cat "$f"
        fi
    done
done
if grep -rl --include='*.rs' 'changed by cargo-mutants' "$checkout" 2>/dev/null; then
    echo "a mutant was left in $checkout (the next run resets it)" >&2
fi
exit "$status"
