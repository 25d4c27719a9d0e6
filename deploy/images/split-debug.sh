#!/usr/bin/env bash
# Splits a binary into a stripped binary and a separate debug file, linked by .gnu_debuglink
# (gdb, lldb, perf and addr2line find the debug file beside the binary or under
# /usr/lib/debug/.build-id). The symbol table stays in the binary, so backtraces still name
# functions; file and line numbers need the debug file.
#
# Usage: split-debug.sh BINARY [STRIPPED [DEBUG]]
#   BINARY     the binary as built (cargo build --release -p cairn-cli: target/release/cairn)
#   STRIPPED   where the stripped binary goes      (default: BINARY itself, in place)
#   DEBUG      where the debug info goes           (default: BINARY.debug)
# Prints one line: the sizes of BINARY, STRIPPED and DEBUG in bytes.
set -euo pipefail

die() { printf 'split-debug: error: %s\n' "$*" >&2; exit 1; }
[ $# -ge 1 ] && [ $# -le 3 ] || die "usage: split-debug.sh BINARY [STRIPPED [DEBUG]]"
binary="$1"
stripped="${2:-$1}"
debug="${3:-$1.debug}"
[ -f "$binary" ] || die "$binary: no such file"
command -v objcopy >/dev/null 2>&1 || die "objcopy not found (apt-get install binutils)"

before=$(stat -c %s "$binary")
tmp="$(mktemp -d "${TMPDIR:-/tmp}/split-debug.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
name="$(basename "$debug")"
objcopy --only-keep-debug "$binary" "$tmp/$name" || die "objcopy --only-keep-debug $binary failed"
# The link records the debug file's name and CRC, so it is made from the file as it will be.
(cd "$tmp" && objcopy --strip-debug --add-gnu-debuglink="$name" "$binary" "$tmp/stripped") \
    || die "objcopy --strip-debug $binary failed"
mv -f "$tmp/$name" "$debug"
mv -f "$tmp/stripped" "$stripped"
chmod 0755 "$stripped"
printf 'split-debug: %s %s bytes -> %s %s bytes + %s %s bytes\n' \
    "$binary" "$before" "$stripped" "$(stat -c %s "$stripped")" "$debug" "$(stat -c %s "$debug")"
