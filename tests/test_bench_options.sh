#!/bin/sh
# SPDX-License-Identifier: MIT (see LICENSE)
# tests/test_bench_options.sh — the command line of the small benchmark tools (bench/bench_cli.h:
# ddp-overlap, ddp-async, ddp-scale, ddp-kill-detect, store-bench, guess-bench, ddp-state-transfer,
# straggler-bench) follows ddp-bench's conventions. Run from the repository root (prove tests/test_bench_options.sh);
# prints TAP. Per tool: --help prints the usage to stdout and exits 0; --version prints "<tool>
# (libddp) X.Y" (ddp_base.h's version) and exits 0; an unknown option and a stray argument exit 2
# with why and the usage on stderr, nothing on stdout; a bad value is refused the same way written
# "-p0" and "--nranks 0". Nothing is measured: no tool runs a benchmark here. Uses build/<tool> when
# it is newer than its sources, else compiles a private copy (-O0, the tools in parallel).
set -u

CC=${CC:-cc}
CFLAGS_T="-std=c99 -O0 -Wall -Wextra -Wpedantic -Wshadow -Werror -I."
tmp=$(mktemp -d "${TMPDIR:-/tmp}/bench_options.XXXXXX") || { echo "Bail out! mktemp failed"; exit 1; }
trap 'rm -rf "$tmp"' EXIT
unset RANK WORLD_SIZE
T="timeout -k 2 20"

# tool source "bad value, short form attached" "the same, long form"
TOOLS='ddp-overlap ddp_overlap -p0 --nranks 0
ddp-async ddp_async -k0 --ops 0
ddp-scale ddp_scale - -
ddp-kill-detect kill_detect -p2 --nranks 2
store-bench store_bench -n0 --clients 0
guess-bench guess_bench -p0 --port 0
ddp-state-transfer state_transfer -p1 --nranks 1
straggler-bench straggler_bench -p1 --nranks 1'

echo "1..$(( $(printf '%s\n' "$TOOLS" | wc -l) * 5 ))"
. "$(dirname "$0")/tap.sh"   # ok, notok, check, why

version=$(sed -n 's/^#define DDP_VERSION_\(MAJOR\|MINOR\) \([0-9]*\).*/\2/p' ddp_base.h | paste -sd. -)
# newer TARGET SOURCES...: TARGET exists and is newer than every source
newer() { t=$1; shift; [ -x "$t" ] || return 1; for s in "$@"; do [ "$t" -nt "$s" ] || return 1; done; }

# Private copies of the stale ones, all at once; $tmp/bin.TOOL names the binary each check runs.
printf '%s\n' "$TOOLS" > "$tmp/tools"
while read -r tool src _; do
    # shellcheck disable=SC2046
    if newer "build/$tool" "bench/$src.c" bench/bench_cli.h bench/bench_fork.h $(ls ddp*.h transports/*.h); then
        echo "build/$tool" > "$tmp/bin.$tool"
    else
        echo "$tmp/$tool" > "$tmp/bin.$tool"
        $CC $CFLAGS_T "bench/$src.c" -o "$tmp/$tool" -pthread -lm > "$tmp/$tool.cc" 2>&1 &
    fi
done < "$tmp/tools"
wait

# bin TOOL: the binary to run.
bin() { cat "$tmp/bin.$1"; }

built() {
    [ -x "$(bin "$1")" ] && return 0
    why "no binary: $(head -c 300 "$tmp/$1.cc" 2>/dev/null)"
    return 1
}
help_ok() {
    $T "$(bin "$1")" --help < /dev/null > "$tmp/out" 2> "$tmp/err"; rc=$?
    [ $rc -eq 0 ] || { why "--help exited $rc"; return 1; }
    [ ! -s "$tmp/err" ] || { why "--help wrote to stderr: $(head -c 200 "$tmp/err")"; return 1; }
    head -1 "$tmp/out" | grep -q "^usage: $1 " || { why "stdout does not start with 'usage: $1': $(head -c 200 "$tmp/out")"; return 1; }
    grep -q -- '--help' "$tmp/out" && grep -q -- '--version' "$tmp/out" || { why "the usage lists no --help or --version"; return 1; }
}
version_ok() {
    $T "$(bin "$1")" --version < /dev/null > "$tmp/out" 2> "$tmp/err"; rc=$?
    got=$(cat "$tmp/out")
    [ $rc -eq 0 ] && [ "$got" = "$1 (libddp) $version" ] && [ ! -s "$tmp/err" ] ||
        { why "--version: exit $rc, printed '$got', want '$1 (libddp) $version'"; return 1; }
}
# refused TOOL ARGS...: exit 2, nothing on stdout, the usage on stderr after one line of why.
refused() {
    tool=$1; shift
    $T "$(bin "$tool")" "$@" < /dev/null > "$tmp/out" 2> "$tmp/err"; rc=$?
    [ $rc -eq 2 ] && [ ! -s "$tmp/out" ] && head -1 "$tmp/err" | grep -q "^$tool: " ||
        { why "$tool $*: exit $rc (want 2), stdout $(wc -c < "$tmp/out") bytes, stderr: $(head -c 200 "$tmp/err")"; return 1; }
}
usage_refused() {
    refused "$@" && sed -n 2p "$tmp/err" | grep -q "^usage: $1 " || { why "$1: no usage after the error line"; return 1; }
}
errors_ok() { usage_refused "$1" --no-such-option && usage_refused "$1" -Q && usage_refused "$1" stray; }
# bad_value TOOL SHORT LONG: both forms are parsed as the option with its value, and refused.
bad_value() {
    [ "$2" = - ] && return 0   # no option with a value
    refused "$1" "$2" && grep -q "^$1: bad value '[0-9]*' for -./--" "$tmp/err" &&
        refused "$1" $3 && grep -q "^$1: bad value '[0-9]*' for -./--" "$tmp/err" ||
        { why "$1 $2 / $3: not refused as a bad value: $(head -c 200 "$tmp/err")"; return 1; }
}

while read -r tool src short long; do
    check "$tool builds (bench/$src.c, C99, -Wall -Wextra -Wpedantic -Wshadow -Werror)" built "$tool"
    check "$tool --help: the usage on stdout, exit 0" help_ok "$tool"
    check "$tool --version: '$tool (libddp) $version', exit 0" version_ok "$tool"
    check "$tool: an unknown option (long, short) or a stray argument: why + usage on stderr, exit 2" errors_ok "$tool"
    if [ "$short" = - ]; then ok "$tool takes no option with a value"
    else check "$tool $short and $long: the same bad value, both forms parsed, exit 2" bad_value "$tool" "$short" "$long"; fi
done < "$tmp/tools"
