#!/bin/sh
# SPDX-License-Identifier: MIT (see LICENSE)
# tests/test_ddprun_replace.sh — ddprun --elastic MIN --max-restarts N: a lost rank is replaced by
# a process started into the running job (DDP_ELASTIC_JOIN=1), up to N replacements in all. Run
# from the repository root (prove tests/test_ddprun_replace.sh); prints TAP. Builds build/ddprun
# when it is missing or older than its sources. The ranks are tests/ddprun_helpers/replace_rank.sh
# (a plan per rank: exit, or wait for a file and exit), not libddp programs: what is checked here
# is the launcher's side.
#
#   - -n 3 --elastic 2 --max-restarts 2, rank 1 fails (leaving a child that holds its output
#     open): ddprun logs LOST, then REPLACED and starts a replacement in slot 1 with the lost
#     rank's environment (same RANK, LOCAL_RANK, store, secret, run id, restart count) plus
#     DDP_ELASTIC_JOIN=1 and DDP_ELASTIC_REPLACEMENT=1; the lost rank's leftover output still
#     comes out; every process ends with 0: exit 0 and a RECOVERED (full size) summary.
#   - -n 3 --elastic 2 --max-restarts 1, rank 2 fails, its replacement fails too: the second loss
#     is a plain --elastic loss (NOT REPLACED: the budget is used up); DEGRADED, exit 0, and the
#     summary says the budget ran out.
#   - -n 3 --elastic 2 --max-restarts 1, rank 2 replaced, rank 1 lost (no budget left), then rank
#     0: below the minimum, the job ends with rank 0's code; the group is not restarted.
#   - without --elastic, --max-restarts restarts the whole group (no replacement); --max-restarts
#     -1, and --elastic --max-restarts on several hosts, are refused.
# No time is assumed: each step waits for what the last one leads to (a file, a log line, an
# exit), every wait bounded (60 s: other tests may run beside).
set -u

CC=${CC:-cc}
D=build/ddprun
R=tests/ddprun_helpers/replace_rank.sh
tmp=$(mktemp -d "${TMPDIR:-/tmp}/ddprun_replace.XXXXXX") || { echo "Bail out! mktemp failed"; exit 1; }
pids=
cleanup() {
    for p in $pids; do kill -KILL "$p" 2>/dev/null; done
    rm -rf "$tmp"
}
trap cleanup EXIT
unset DDP_JOB_SECRET DDP_ELASTIC_JOIN DDP_ELASTIC_REPLACEMENT

echo "1..23"
. "$(dirname "$0")/tap.sh"   # ok, notok, check, why

mkdir -p build
build_ddprun() {
    fresh=1
    for f in tools/ddprun.c ddp_base.h ddp_socket.h ddp_auth.h ddp_store*.h; do [ "$D" -nt "$f" ] || fresh=0; done
    if [ -x "$D" ] && [ $fresh = 1 ]; then return 0; fi
    $CC -std=c99 -O2 -Wall -Wextra -Wpedantic -Werror tools/ddprun.c -o "$D" -pthread 2> "$tmp/why"
}
check "build/ddprun builds" build_ddprun
[ -x "$D" ] || { echo "Bail out! nothing to run"; exit 1; }

# wait_grep PATTERN FILE: until FILE has a line matching PATTERN. wait_gone PID: until PID has
# exited (our child: then `wait` reaps it). finish DIR PID: waits for our child PID (bounded),
# writes its exit status to DIR.rc; on a timeout tells the ranks to give up (DIR/abort).
wait_grep() { i=0; while ! grep -q "$1" "$2" 2>/dev/null && [ $i -lt 6000 ]; do sleep 0.01; i=$((i + 1)); done
              grep -q "$1" "$2" || { why "no line matching '$1' in $2 within 60 s"; return 1; }; }
wait_gone() { i=0; while kill -0 "$1" 2>/dev/null && [ "$(ps -o stat= -p "$1" | cut -c1)" != Z ] && [ $i -lt 6000 ]; do
                  sleep 0.01; i=$((i + 1)); done
              kill -0 "$1" 2>/dev/null && [ "$(ps -o stat= -p "$1" | cut -c1)" != Z ] && { why "pid $1 still running after 60 s"; return 1; }
              return 0; }
finish() { wait_gone "$2" || { : > "$1/abort"; return 1; }; wait "$2"; echo $? > "$1.rc"; }
show() { why "exit status $(cat "$1.rc" 2>/dev/null); stdout:"; sed 's/^/  /' "$1.out" >> "$tmp/why"
         why "stderr:"; sed 's/^/  /' "$1.err" >> "$tmp/why"; }
# has FILE PATTERN: FILE has a line matching PATTERN (a basic regular expression), else says so.
has() { grep -q -- "$2" "$1" 2>/dev/null || { why "no line matching '$2' in $(basename "$1")"; return 1; }; }
hasnt() { ! grep -q -- "$2" "$1" 2>/dev/null || { why "a line matching '$2' in $(basename "$1")"; return 1; }; }
give_up() { : > "$1/abort"; show "$1"; return 1; }

# --- 2-9: a lost rank replaced; the job ends at full size -----------------------------------------
A=$tmp/a
mkdir -p "$A"
replaced() {
    "$D" -n 3 --elastic 2 --max-restarts 2 sh "$R" "$A" 1=bgexit:3 r1=exit:0 0=after:leftover.done:0 \
        2=after:leftover.done:0 > "$A.out" 2> "$A.err" &
    dpid=$!; pids="$pids $dpid"
    wait_grep '^ddprun: REPLACED rank 1 ' "$A.err" || give_up "$A" || return 1
    finish "$A" "$dpid" || { show "$A"; return 1; }
}
check "ddprun -n 3 --elastic 2 --max-restarts 2: rank 1 fails, ddprun starts a replacement, the job ends" replaced
a_exit() {
    [ "$(cat "$A.rc" 2>/dev/null)" = 0 ] && has "$A.err" '^ddprun: RECOVERED: the job finished at full size, 3 of 3 ranks (each exited 0), after 1 replacement; exit status 0$' &&
        hasnt "$A.err" 'DEGRADED\|FAILED\|restarting' || { show "$A"; return 1; }
}
check "every process exited 0: ddprun exits 0, its summary says RECOVERED (full size, 1 replacement)" a_exit
a_live() {
    p=$(cat "$A/pid.1" 2>/dev/null) && q=$(cat "$A/pid.r1" 2>/dev/null) || { why "no pid.1 or pid.r1"; return 1; }
    has "$A.err" "^ddprun: LOST: rank 1 (local rank 1, pid $p) exited with code 3 at [0-9:.]* UTC, [0-9.]* s into the attempt; --elastic 2: 2 of 3 ranks remain, the job goes on\$" &&
        has "$A.err" "^ddprun: REPLACED rank 1 (pid $p, lost at [0-9:.]* UTC): replacement pid $q started (1 of 2), joining the running job (DDP_ELASTIC_JOIN=1); 3 of 3 ranks\$" &&
        [ "$(grep -n '^ddprun: LOST: rank 1 ' "$A.err" | cut -d: -f1)" -lt "$(grep -n '^ddprun: REPLACED' "$A.err" | cut -d: -f1)" ] ||
        { show "$A"; return 1; }
}
check "live: LOST names rank 1, then REPLACED names its pid, the replacement's pid and 1 of 2" a_live
a_env() {
    has "$A/env.r1" '^DDP_ELASTIC_JOIN=1$' && has "$A/env.r1" '^DDP_ELASTIC_REPLACEMENT=1$' &&
        has "$A/env.r1" '^RANK=1$' && has "$A/env.r1" '^LOCAL_RANK=1$' && has "$A/env.r1" '^TORCHELASTIC_RESTART_COUNT=0$' &&
        has "$A/env.r1" '^DDP_LAUNCHER_STORE=127\.0\.0\.1:[0-9][0-9]*$' || return 1
}
check "the replacement sees DDP_ELASTIC_JOIN=1, DDP_ELASTIC_REPLACEMENT=1, RANK=1, LOCAL_RANK=1, restart count 0" a_env
a_same_env() {
    [ -e "$A/env.r1" ] || { why "no env.r1: no replacement was started"; return 1; }
    grep -v '^DDP_ELASTIC_JOIN=\|^DDP_ELASTIC_REPLACEMENT=' "$A/env.r1" > "$A/env.r1.rest"
    diff "$A/env.1" "$A/env.r1.rest" > "$A/env.diff" || { why "environments differ:"; cat "$A/env.diff" >> "$tmp/why"; return 1; }
    hasnt "$A/env.0" '^DDP_ELASTIC_JOIN\|^DDP_ELASTIC_REPLACEMENT' && hasnt "$A/env.1" '^DDP_ELASTIC_JOIN\|^DDP_ELASTIC_REPLACEMENT'
}
check "otherwise its environment is the lost rank's (same store, secret, run id); the first ranks have no DDP_ELASTIC_*JOIN" a_same_env
a_summary() {
    p=$(cat "$A/pid.1" 2>/dev/null) && q=$(cat "$A/pid.r1" 2>/dev/null) || { why "no pid file: no replacement was started"; return 1; }
    has "$A.err" '^ddprun: lost earlier, the job going on (--elastic 2): 1 loss$' &&
        has "$A.err" "^ddprun:   rank 1 (local rank 1, pid $p) exited with code 3 at [0-9:.]* UTC, [0-9.]* s into the attempt; replaced by pid $q (replacement 1)\$" &&
        has "$A.err" '^ddprun: replacements (--max-restarts 2): 1 of 2 used$' &&
        has "$A.err" "^ddprun:   replacement 1: rank 1 (local rank 1), pid $q, started [0-9.]* s into the attempt in place of pid $p; exited with code 0\$" ||
        { show "$A"; return 1; }
}
check "the summary lists the loss and one line for the replacement (which exited 0)" a_summary
a_output() {
    p=$(cat "$A/pid.1" 2>/dev/null) && q=$(cat "$A/pid.r1" 2>/dev/null) || { why "no pid file: no replacement was started"; return 1; }
    has "$A.out" "^\[rank 1\] r1 here (pid $q)\$" && has "$A.out" "^\[rank 1\] 1 here (pid $p)\$" || { show "$A"; return 1; }
}
check "the replacement's output is labelled with its slot's rank, [rank 1]" a_output
a_leftover() {
    p=$(cat "$A/pid.1" 2>/dev/null) || { why "no pid file: no replacement was started"; return 1; }
    has "$A.out" "^\[rank 1\] leftover of pid $p\$" || { show "$A"; return 1; }
}
check "what the lost rank left running still writes through ddprun after the replacement started" a_leftover

# --- 10-14: the budget runs out; a replacement that fails in turn ----------------------------------
B=$tmp/b
mkdir -p "$B"
budget() {
    "$D" -n 3 --elastic 2 --max-restarts 1 sh "$R" "$B" 2=exit:3 r1=exit:5 0=after:go:0 1=after:go:0 \
        > "$B.out" 2> "$B.err" &
    dpid=$!; pids="$pids $dpid"
    wait_grep '^ddprun: NOT REPLACED rank 2 ' "$B.err" || give_up "$B" || return 1
    : > "$B/go"
    finish "$B" "$dpid" || { show "$B"; return 1; }
}
check "ddprun -n 3 --elastic 2 --max-restarts 1: rank 2 fails, is replaced, the replacement fails too" budget
b_live() {
    p=$(cat "$B/pid.2" 2>/dev/null) && q=$(cat "$B/pid.r1" 2>/dev/null) || { why "no pid.2 or pid.r1"; return 1; }
    has "$B.err" "^ddprun: REPLACED rank 2 (pid $p, lost at [0-9:.]* UTC): replacement pid $q started (1 of 1)" &&
        has "$B.err" "^ddprun: LOST: rank 2 (local rank 2, pid $q) exited with code 5 at .*; --elastic 2: 2 of 3 ranks remain, the job goes on\$" &&
        has "$B.err" "^ddprun: NOT REPLACED rank 2 (pid $q, lost at [0-9:.]* UTC): the 1 replacement of --max-restarts 1 is used up; the job goes on with 2 of 3 ranks\$" &&
        [ "$(grep -c '^ddprun: REPLACED' "$B.err")" = 1 ] || { show "$B"; return 1; }
}
check "live: REPLACED (1 of 1), then the replacement LOST and NOT REPLACED (budget used up)" b_live
b_exit() {
    [ "$(cat "$B.rc" 2>/dev/null)" = 0 ] && has "$B.err" '^ddprun: DEGRADED: the job finished with 2 of 3 ranks (each exited 0); exit status 0$' &&
        hasnt "$B.err" 'RECOVERED\|FAILED\|restarting' || { show "$B"; return 1; }
}
check "the others exited 0: ddprun exits 0, DEGRADED with 2 of 3 ranks" b_exit
b_summary() {
    p=$(cat "$B/pid.2" 2>/dev/null) && q=$(cat "$B/pid.r1" 2>/dev/null) || { why "no pid file: no replacement was started"; return 1; }
    has "$B.err" '^ddprun: lost earlier, the job going on (--elastic 2): 2 losses$' &&
        has "$B.err" "^ddprun:   rank 2 (local rank 2, pid $p) exited with code 3 at .*; replaced by pid $q (replacement 1)\$" &&
        has "$B.err" "^ddprun:   rank 2 (local rank 2, pid $q) exited with code 5 at .*; not replaced: no replacement was left\$" &&
        has "$B.err" '^ddprun: replacements (--max-restarts 1): 1 of 1 used; the budget ran out, 1 later loss was not replaced$' &&
        has "$B.err" "^ddprun:   replacement 1: rank 2 (local rank 2), pid $q, started [0-9.]* s into the attempt in place of pid $p; lost in turn at [0-9:.]* UTC\$" ||
        { show "$B"; return 1; }
}
check "the summary: both losses, the replacement lost in turn, the budget ran out" b_summary
b_env() {
    has "$B/env.r1" '^RANK=2$' && has "$B/env.r1" '^DDP_ELASTIC_REPLACEMENT=1$' && [ ! -e "$B/env.r2" ] ||
        { why "a second replacement started"; return 1; }
}
check "one replacement only, in slot 2 (RANK=2)" b_env

# --- 15-19: below the minimum after the budget: the job ends, not restarted ---------------------------
C=$tmp/c
mkdir -p "$C"
below() {
    "$D" -n 3 --elastic 2 --max-restarts 1 sh "$R" "$C" 2=exit:3 1=after:env.r1:4 0=after:go.0:6 \
        > "$C.out" 2> "$C.err" &
    dpid=$!; pids="$pids $dpid"
    wait_grep '^ddprun: NOT REPLACED rank 1 ' "$C.err" || give_up "$C" || return 1
    : > "$C/go.0"
    finish "$C" "$dpid" || { show "$C"; return 1; }
}
check "--elastic 2 --max-restarts 1: rank 2 replaced, rank 1 lost (no budget), then rank 0 fails" below
c_failed() {
    [ "$(cat "$C.rc" 2>/dev/null)" = 6 ] &&
        has "$C.err" '^ddprun: FAILED: rank 0 (local rank 0, pid [0-9]*) exited with code 6; SIGTERM sent to the 1 rank still running$' &&
        has "$C.err" '^ddprun: --elastic 2: after losing rank 0 only 1 of 3 ranks were left, below the minimum (under --elastic the group is not restarted: --max-restarts counts replacements)$' ||
        { show "$C"; return 1; }
}
check "below the minimum: FAILED names rank 0, the replacement is stopped, exit 6" c_failed
c_no_restart() {
    hasnt "$C.err" 'restarting' && hasnt "$C.err" '(attempt ' && [ "$(grep -c ' here (pid' "$C.out")" = 4 ] &&
        hasnt "$C/env.0" '^TORCHELASTIC_RESTART_COUNT=[^0]' || { show "$C"; return 1; }
}
check "the group is not restarted (4 processes in all: 3 ranks and 1 replacement)" c_no_restart
c_summary() {
    q=$(cat "$C/pid.r1" 2>/dev/null) || { why "no pid file: no replacement was started"; return 1; }
    has "$C.err" '^ddprun:   rank 2 (local rank 2, pid [0-9]*) exited with code 3 at .*; replaced by pid '"$q"' (replacement 1)$' &&
        has "$C.err" '^ddprun:   rank 1 (local rank 1, pid [0-9]*) exited with code 4 at .*; not replaced: no replacement was left$' &&
        has "$C.err" "^ddprun:   replacement 1: rank 2 (local rank 2), pid $q, started .*; was killed by SIGTERM (signal 15)\$" ||
        { show "$C"; return 1; }
}
check "the summary lists both losses and the replacement (stopped with the job)" c_summary
c_stopped() {
    q=$(cat "$C/pid.r1" 2>/dev/null) || { why "no pid.r1: no replacement was started"; return 1; }
    ! kill -0 "$q" 2>/dev/null || { why "the replacement (pid $q) still runs"; return 1; }
}
check "the replacement is not left running" c_stopped

# --- 20-23: without --elastic, --max-restarts restarts the group; the command line ---------------------
F=$tmp/f
mkdir -p "$F"
whole_group() {
    timeout -k 2 60 "$D" -n 2 --max-restarts 1 sh -c 'env | sort > "$1/env.$RANK.$TORCHELASTIC_RESTART_COUNT"
        if [ "$RANK" = 1 ] && [ "$TORCHELASTIC_RESTART_COUNT" = 0 ]; then exit 3; fi' rank "$F" > "$F.out" 2> "$F.err"
    echo $? > "$F.rc"
    [ "$(cat "$F.rc" 2>/dev/null)" = 0 ] && has "$F.err" 'restarting all 2 ranks (restart 1 of 1)' && hasnt "$F.err" 'REPLACED' &&
        [ -e "$F/env.0.1" ] && [ -e "$F/env.1.1" ] && ! cat "$F"/env.* | grep -q '^DDP_ELASTIC_JOIN' ||
        { show "$F"; return 1; }
}
check "without --elastic, --max-restarts 1 restarts the whole group (no replacement, no DDP_ELASTIC_JOIN)" whole_group
help_text() {
    "$D" --help > "$tmp/help" 2>&1 || { why "--help exited $?"; return 1; }
    has "$tmp/help" 'DDP_ELASTIC_JOIN' && has "$tmp/help" 'DDP_ELASTIC_REPLACEMENT' && has "$tmp/help" 'replacement'
}
check "--help tells of replacements and DDP_ELASTIC_JOIN, DDP_ELASTIC_REPLACEMENT" help_text
negative() {
    "$D" --elastic 1 --max-restarts -1 -n 2 true > /dev/null 2> "$tmp/neg.err"
    rc=$?
    [ $rc = 2 ] && has "$tmp/neg.err" 'max-restarts' || { why "exit $rc"; cat "$tmp/neg.err" >> "$tmp/why"; return 1; }
}
check "--max-restarts -1 is refused (exit 2)" negative
several_hosts() {
    "$D" --nnodes 2 --node-rank 0 --master-port 29500 --elastic 1 --max-restarts 1 -n 1 true > /dev/null 2> "$tmp/nn.err"
    rc=$?
    [ $rc = 2 ] && has "$tmp/nn.err" 'one host only' || { why "exit $rc"; cat "$tmp/nn.err" >> "$tmp/why"; return 1; }
}
check "--elastic with --max-restarts on several hosts is refused, as --elastic is (exit 2)" several_hosts
