#!/bin/sh
# SPDX-License-Identifier: MIT (see LICENSE)
# tests/test_ddprun_elastic.sh — the store outlives any rank under ddprun, and ddprun --elastic
# MIN keeps a job going while MIN ranks remain. Run from the repository root (prove
# tests/test_ddprun_elastic.sh); prints TAP. Builds build/ddprun (when missing or older than its
# sources) and build/ddprun_store_survives (tests/ddprun_helpers/ddprun_store_survives.c).
#
#   - ddprun -n 3 --elastic 2: rank 0 is killed (SIGKILL) after the rendezvous; ranks 1 and 2
#     then set, add and get through the communicator's store (ddprun's), which must work; ddprun
#     logs the loss (rank, how, when), lets the others finish, exits 0 and says DEGRADED.
#   - ddprun -n 4 --elastic 3: rank 3 fails (tolerated: 3 remain), then rank 2 (2 < 3): the job
#     is stopped as without --elastic, the summary names rank 2 and the earlier loss of rank 3,
#     and ddprun exits with rank 2's code.
#   - without --elastic a failed rank still stops the job (as before).
#   - no ddprun (as under mpirun or srun: rank 0 hosts the store): rank 0 killed, the others' next
#     store call fails with an error saying the store was hosted by rank 0 and is gone, and so
#     does the call after it, at once (not after DDP_TIMEOUT_MS, 10 minutes, of reconnecting:
#     the 60 s bound of the wait would end the check first).
# No time is assumed: each step waits for what the last one leads to (a file, a log line, an
# exit), every wait bounded (60 s: other tests may run beside).
set -u

CC=${CC:-cc}
D=build/ddprun
P=build/ddprun_store_survives
tmp=$(mktemp -d "${TMPDIR:-/tmp}/ddprun_elastic.XXXXXX") || { echo "Bail out! mktemp failed"; exit 1; }
pids=
cleanup() {
    for p in $pids; do kill -KILL "$p" 2>/dev/null; done
    rm -rf "$tmp"
}
trap cleanup EXIT

echo "1..15"
. "$(dirname "$0")/tap.sh"   # ok, notok, check, why, free_port

mkdir -p build
build_ddprun() {
    fresh=1
    for f in tools/ddprun.c ddp_base.h ddp_socket.h ddp_auth.h ddp_store*.h; do [ "$D" -nt "$f" ] || fresh=0; done
    if [ -x "$D" ] && [ $fresh = 1 ]; then return 0; fi
    $CC -std=c99 -O2 -Wall -Wextra -Wpedantic -Werror tools/ddprun.c -o "$D" -pthread 2> "$tmp/why"
}
build_prog() {
    fresh=1
    for f in ddp*.h transports/ddp_tcp.h tests/ddprun_helpers/ddprun_store_survives.c; do [ "$P" -nt "$f" ] || fresh=0; done
    if [ -x "$P" ] && [ $fresh = 1 ]; then return 0; fi
    $CC -std=c99 -O1 -Wall -Wextra -Wpedantic -Werror -I. tests/ddprun_helpers/ddprun_store_survives.c -o "$P" \
        -pthread -lm 2> "$tmp/why"
}
check "build/ddprun builds" build_ddprun
check "build/ddprun_store_survives builds" build_prog
[ -x "$D" ] && [ -x "$P" ] || { echo "Bail out! nothing to run"; exit 1; }

# wait_file FILE: until FILE exists and is not empty. wait_grep PATTERN FILE: until FILE has a
# line matching PATTERN. wait_gone PID: until PID has exited (our child: then `wait` reaps it).
wait_file() { i=0; while [ ! -s "$1" ] && [ $i -lt 6000 ]; do sleep 0.01; i=$((i + 1)); done
              [ -s "$1" ] || { why "no $1 within 60 s"; return 1; }; }
wait_grep() { i=0; while ! grep -q "$1" "$2" 2>/dev/null && [ $i -lt 6000 ]; do sleep 0.01; i=$((i + 1)); done
              grep -q "$1" "$2" || { why "no line matching '$1' in $2 within 60 s"; return 1; }; }
wait_gone() { i=0; while kill -0 "$1" 2>/dev/null && [ "$(ps -o stat= -p "$1" | cut -c1)" != Z ] && [ $i -lt 6000 ]; do
                  sleep 0.01; i=$((i + 1)); done
              kill -0 "$1" 2>/dev/null && [ "$(ps -o stat= -p "$1" | cut -c1)" != Z ] && { why "pid $1 still running after 60 s"; return 1; }
              return 0; }
# finish PID: waits for our child PID (bounded) and writes its exit status to $tmp/rc.
finish() { wait_gone "$1" || return 1; wait "$1"; echo $? > "$tmp/rc"; }
show() { why "exit status $(cat "$tmp/rc" 2>/dev/null); stdout:"; sed 's/^/  /' "$1.out" >> "$tmp/why"
         why "stderr:"; sed 's/^/  /' "$1.err" >> "$tmp/why"; }

# --- 3-7: rank 0 killed under ddprun --elastic 2 ----------------------------------------------
E=$tmp/e
mkdir -p "$E"
kill_rank0() {
    "$D" -n 3 --elastic 2 "$P" "$E" > "$E.out" 2> "$E.err" &
    dpid=$!; pids="$pids $dpid"
    wait_file "$E/pid.0" && wait_file "$E/pid.1" && wait_file "$E/pid.2" || { show "$E"; return 1; }
    kill -KILL "$(cat "$E/pid.0")" || return 1
    wait_grep '^ddprun: LOST: rank 0 ' "$E.err" || { show "$E"; return 1; }
    touch "$E/go"
    finish "$dpid" || { show "$E"; return 1; }
}
check "ddprun -n 3 --elastic 2: rank 0 killed after the rendezvous, ddprun logs it, the others go on" kill_rank0
survivors_store() {
    grep -q '^\[rank 1\] rank 1: store ok after rank 0 was lost' "$E.out" &&
        grep -q '^\[rank 2\] rank 2: store ok after rank 0 was lost' "$E.out" || { show "$E"; return 1; }
}
check "after rank 0's death ranks 1 and 2 set, add and get through the store (ddprun's, not rank 0's)" survivors_store
lost_line() {
    grep '^ddprun: LOST: rank 0 ' "$E.err" | grep -q 'was killed by SIGKILL (signal 9) at [0-9:.]* UTC, [0-9.]* s into the attempt; --elastic 2: 2 of 3 ranks remain' ||
        { show "$E"; return 1; }
}
check "the LOST line names rank 0, SIGKILL, when, and 2 of 3 ranks remaining" lost_line
degraded() {
    [ "$(cat "$tmp/rc")" = 0 ] && grep -q '^ddprun: DEGRADED: the job finished with 2 of 3 ranks' "$E.err" &&
        grep -q '^ddprun:   rank 0 (local rank 0, pid [0-9]*) was killed by SIGKILL' "$E.err" &&
        ! grep -q '^ddprun: FAILED' "$E.err" || { show "$E"; return 1; }
}
check "ddprun exits 0 (the others exited 0) and its summary says DEGRADED, naming rank 0" degraded
min_env() {
    cnt=$(grep -c "DDP_ELASTIC_MIN_RANKS=2\$" "$E.out")
    [ "$cnt" = 3 ] || { why "$cnt of 3 ranks saw DDP_ELASTIC_MIN_RANKS=2"; show "$E"; return 1; }
}
check "every rank sees DDP_ELASTIC_MIN_RANKS=2" min_env

# --- 8-10: below the minimum --------------------------------------------------------------------
B=$tmp/b
mkdir -p "$B"
rank='echo $$ > "$1/pid.$RANK"; case $RANK in 3) exit 7 ;; 2) while [ ! -e "$1/go.2" ]; do sleep 0.01; done; exit 5 ;;
      *) exec sleep 600 ;; esac'
below_min() {
    "$D" -n 4 --elastic 3 sh -c "$rank" rank "$B" > "$B.out" 2> "$B.err" &
    dpid=$!; pids="$pids $dpid"
    wait_grep '^ddprun: LOST: rank 3 ' "$B.err" || { show "$B"; return 1; }
    wait_file "$B/pid.2" || return 1
    touch "$B/go.2"
    finish "$dpid" || { show "$B"; return 1; }
}
check "ddprun -n 4 --elastic 3: rank 3 fails (lost, 3 remain), then rank 2 (2 remain): ddprun ends" below_min
below_summary() {
    [ "$(cat "$tmp/rc")" = 5 ] &&
        grep -q '^ddprun: FAILED: rank 2 (local rank 2, pid [0-9]*) exited with code 5; SIGTERM sent to the 2 ranks still running' "$B.err" &&
        grep -q '^ddprun: --elastic 3: after losing rank 2 only 2 of 4 ranks were left, below the minimum' "$B.err" ||
        { show "$B"; return 1; }
}
check "below the minimum: the usual FAILED summary names rank 2, the others are stopped, exit 5" below_summary
below_lost() {
    grep -q '^ddprun:   rank 3 (local rank 3, pid [0-9]*) exited with code 7 at' "$B.err" && ! grep -q DEGRADED "$B.err" ||
        { show "$B"; return 1; }
}
check "the summary also names rank 3, lost earlier" below_lost

# --- 11-12: without --elastic, as before ---------------------------------------------------------
F=$tmp/f
mkdir -p "$F"
not_elastic() {
    "$D" -n 3 sh -c 'if [ "$RANK" = 1 ]; then exit 4; fi; exec sleep 600' > "$F.out" 2> "$F.err" &
    dpid=$!; pids="$pids $dpid"
    finish "$dpid" || { show "$F"; return 1; }
    [ "$(cat "$tmp/rc")" = 4 ] && grep -q '^ddprun: FAILED: rank 1 ' "$F.err" && ! grep -q 'LOST' "$F.err" || { show "$F"; return 1; }
}
check "without --elastic a failed rank still stops the job (FAILED, its exit code)" not_elastic
env_plain() {
    "$D" -n 1 sh -c 'echo "min=${DDP_ELASTIC_MIN_RANKS-unset} store=$DDP_LAUNCHER_STORE"' > "$F.env" 2>&1 || { why "exit $?"; return 1; }
    grep -qx '\[rank 0\] min=unset store=127\.0\.0\.1:[0-9][0-9]*' "$F.env" || { why "got: $(cat "$F.env")"; return 1; }
}
check "without --elastic no DDP_ELASTIC_MIN_RANKS; DDP_LAUNCHER_STORE is ddprun's store on 127.0.0.1" env_plain

# --- 13-15: no ddprun: rank 0 hosts the store, and its loss is told clearly -----------------------
M=$tmp/m
mkdir -p "$M"
no_launcher() {
    port=$(free_port) || { why "no free port"; return 1; }
    mp=
    for r in 0 1 2; do
        env -u DDP_LAUNCHER_STORE -u DDP_ELASTIC_MIN_RANKS RANK=$r WORLD_SIZE=3 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
            "$P" "$M" > "$M/out.$r" 2> "$M/err.$r" &
        mp="$mp $!"; pids="$pids $!"
    done
    set -- $mp
    wait_file "$M/pid.0" && wait_file "$M/pid.1" && wait_file "$M/pid.2" || return 1
    kill -KILL "$1" && wait_gone "$1" || return 1
    touch "$M/go"
    finish "$2" || return 1
    cp "$tmp/rc" "$M/rc.1"
    finish "$3" || return 1
    cp "$tmp/rc" "$M/rc.2"
}
check "no launcher (as mpirun): 3 ranks, rank 0 killed after the rendezvous; ranks 1 and 2 end" no_launcher
no_launcher_fail() {
    [ "$(cat "$M/rc.1")" = 1 ] && [ "$(cat "$M/rc.2")" = 1 ] ||
        { why "exit status $(cat "$M/rc.1") and $(cat "$M/rc.2"), expected 1"; cat "$M"/err.* >> "$tmp/why"; return 1; }
}
check "ranks 1 and 2 fail (their store is gone with rank 0)" no_launcher_fail
no_launcher_msg() {
    for r in 1 2; do
        grep "^rank $r: store failed after rank 0 was lost:" "$M/err.$r" |
            grep -q 'was hosted by rank 0, which is gone.*launched without ddprun' &&
            grep "^rank $r: the next store call failed too:" "$M/err.$r" | grep -q 'was hosted by rank 0, which is gone' ||
            { why "rank $r:"; sed 's/^/  /' "$M/err.$r" >> "$tmp/why"; return 1; }
    done
}
check "their error says the store was hosted by rank 0, which is gone (and why: no ddprun); so does the next call, at once" no_launcher_msg
