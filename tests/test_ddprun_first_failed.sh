#!/bin/sh
# SPDX-License-Identifier: MIT (see LICENSE)
# tests/test_ddprun_first_failed.sh — ddprun's summary names the rank that failed first, by the
# order the ranks exited, not by their numbers. Run from the repository root (prove
# tests/test_ddprun_first_failed.sh); prints TAP. Builds build/ddprun when it is missing or
# older than its source.
#
# Two ranks fail while ddprun cannot look (it is stopped, SIGSTOP), so that its next look finds
# both gone: rank 1 first (code 3), then, once rank 1 is a zombie, rank 0 (code 4). ddprun is then
# continued and must name rank 1 and exit 3; and the other way round, rank 0 then rank 1. No time
# is assumed: each step waits for the state the previous one leads to (a file, a process state),
# every wait bounded.
set -u

CC=${CC:-cc}
D=build/ddprun
tmp=$(mktemp -d "${TMPDIR:-/tmp}/ddprun_first.XXXXXX") || { echo "Bail out! mktemp failed"; exit 1; }
dpid=
cleanup() {
    [ -n "$dpid" ] && { kill -CONT "$dpid"; kill -KILL "$dpid"; } 2>/dev/null
    rm -rf "$tmp"
}
trap cleanup EXIT

echo "1..5"
. "$(dirname "$0")/tap.sh"   # ok, notok, check, why

mkdir -p build
build_ddprun() {
    fresh=1
    for f in tools/ddprun.c ddp_base.h ddp_socket.h ddp_auth.h ddp_store*.h; do [ "$D" -nt "$f" ] || fresh=0; done
    if [ -x "$D" ] && [ $fresh = 1 ]; then return 0; fi
    $CC -std=c99 -O2 -Wall -Wextra -Wpedantic -Werror tools/ddprun.c -o "$D" -pthread 2> "$tmp/why"
}
check "build/ddprun builds" build_ddprun
[ -x "$D" ] || { echo "Bail out! no build/ddprun"; exit 1; }

# state PID: the first letter of ps's STAT (R, S, T stopped, Z zombie), or nothing once gone.
state() { ps -o stat= -p "$1" 2>/dev/null | cut -c1; }
# until_state PID S: waits (at most 10 s) until PID is in state S.
until_state() { i=0; while [ "$(state "$1")" != "$2" ] && [ $i -lt 1000 ]; do sleep 0.01; i=$((i + 1)); done
                [ "$(state "$1")" = "$2" ] || { why "pid $1 is in state '$(state "$1")', not $2"; return 1; }; }
# until_file FILE: waits (at most 10 s) until FILE exists.
until_file() { i=0; while [ ! -s "$1" ] && [ $i -lt 1000 ]; do sleep 0.01; i=$((i + 1)); done
               [ -s "$1" ] || { why "no $1"; return 1; }; }

# Each rank writes its pid, waits for its go file, and fails: rank 1 with code 3, rank 0 with 4.
rank='echo $$ > "$1/pid.$RANK"; while [ ! -e "$1/go.$RANK" ]; do sleep 0.01; done; exit $((4 - RANK))'

# both_fail_unseen FIRST SECOND: rank FIRST exits, then rank SECOND, while ddprun is stopped.
both_fail_unseen() {
    rm -f "$tmp"/pid.* "$tmp"/go.* "$tmp/rc"
    "$D" -n 2 sh -c "$rank" rank "$tmp" > "$tmp/out" 2> "$tmp/err" &
    dpid=$!
    until_file "$tmp/pid.0" && until_file "$tmp/pid.1" || return 1
    kill -STOP "$dpid" && until_state "$dpid" T || return 1
    touch "$tmp/go.$1" && until_state "$(cat "$tmp/pid.$1")" Z || return 1   # FIRST has exited
    touch "$tmp/go.$2" && until_state "$(cat "$tmp/pid.$2")" Z || return 1   # then SECOND
    kill -CONT "$dpid"
    i=0; while kill -0 "$dpid" 2>/dev/null && [ "$(state "$dpid")" != Z ] && [ $i -lt 2000 ]; do
        sleep 0.01; i=$((i + 1)); done
    wait "$dpid"
    echo $? > "$tmp/rc"
    dpid=
}
# names RANK CODE: ddprun exited CODE and its summary names RANK with CODE.
names() {
    rc=$(cat "$tmp/rc" 2>/dev/null)
    why "exit status $rc; stderr:"
    sed 's/^/  /' "$tmp/err" >> "$tmp/why"
    [ "$rc" = "$2" ] && grep '^ddprun: FAILED' "$tmp/err" | grep -q "rank $1 .*exited with code $2"
}
check "ranks 1 then 0 fail while ddprun is stopped; ddprun, continued, ends" both_fail_unseen 1 0
check "the summary names rank 1 (exited first, code 3), not rank 0 (code 4); ddprun exits 3" names 1 3
check "ranks 0 then 1 fail while ddprun is stopped; ddprun, continued, ends" both_fail_unseen 0 1
check "the summary names rank 0 (exited first, code 4), not rank 1 (code 3); ddprun exits 4" names 0 4
