#!/bin/sh
# SPDX-License-Identifier: MIT (see LICENSE)
# tests/test_ddprun.sh — the launcher tools/ddprun.c, end to end. Run from the repository root
# (prove tests/test_ddprun.sh); prints TAP. Builds build/ddprun when it is missing or older than
# its source, and build/ddprun_allreduce (a libddp program) for the integration checks.
# Ranks are small shell scripts; every wait here is bounded, and the whole file takes ~10 s.
set -u

CC=${CC:-cc}
CFLAGS_T="-std=c99 -O2 -Wall -Wextra -Wpedantic -Werror"
D=build/ddprun
H=tests/ddprun_helpers
tmp=$(mktemp -d "${TMPDIR:-/tmp}/ddprun_test.XXXXXX") || { echo "Bail out! mktemp failed"; exit 1; }
trap 'rm -rf "$tmp"' EXIT
ulimit -c 0 2>/dev/null # the SIGSEGV check must not write a core file
unset OMP_NUM_THREADS DDP_JOB_SECRET TORCH_NCCL_ASYNC_ERROR_HANDLING

echo "1..34"
. "$(dirname "$0")/tap.sh"   # ok, notok, check, why
now() { date +%s.%N; }
# elapsed_below T0 T1 LIMIT: the ranks below would otherwise sleep 60 s, so LIMIT is 30 s: far
# from both, whatever else runs on the machine.
elapsed_below() { awk -v a="$1" -v b="$2" -v lim="$3" 'BEGIN { exit !(b - a < lim) }'; }
elapsed() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", b - a }'; }
# A broken ddprun that never stops its ranks must fail a check, not wait out the ranks' minute.
T="timeout -k 2 50"   # far above a run beside other tests, below the ranks' 60 s sleeps
# running PID: true while PID is a live process (a zombie, killed but not yet reaped by init,
# does not count).
running() {
    [ -n "$1" ] && kill -0 "$1" 2>/dev/null || return 1
    st=$(ps -o stat= -p "$1" 2>/dev/null) || return 0
    case $st in Z*) return 1 ;; esac
}
# gone PID: PID stops running within 10 s (a signal is delivered asynchronously).
gone() { i=0; while running "$1" && [ $i -lt 200 ]; do sleep 0.05; i=$((i + 1)); done; ! running "$1"; }
# Waits (at most 60 s: other tests may run beside) until FILE exists.
wait_for() { i=0; while [ ! -e "$1" ] && [ $i -lt 1200 ]; do sleep 0.05; i=$((i + 1)); done; [ -e "$1" ]; }

mkdir -p build
# --- 1: build ------------------------------------------------------------------------------
build_ddprun() {
    fresh=1
    for f in tools/ddprun.c ddp_base.h ddp_socket.h ddp_auth.h ddp_store*.h; do [ "$D" -nt "$f" ] || fresh=0; done
    if [ -x "$D" ] && [ $fresh = 1 ]; then return 0; fi
    $CC $CFLAGS_T tools/ddprun.c -o "$D" -pthread 2> "$tmp/why"
}
check "build/ddprun builds (C99, -Wall -Wextra -Wpedantic -Werror)" build_ddprun
[ -x "$D" ] || { echo "Bail out! no build/ddprun"; exit 1; }

# --- 2-6: command line ------------------------------------------------------------------------
help_ok() {
    "$D" --help > "$tmp/help" 2>&1 || { why "--help exited $?"; return 1; }
    for s in NAME SYNOPSIS DESCRIPTION OPTIONS ENVIRONMENT "EXIT STATUS" EXAMPLES; do
        grep -q "^$s\$" "$tmp/help" || { why "--help has no $s section"; return 1; }
    done
    for o in --nproc-per-node --nnodes --node-rank --master-addr --master-port --max-restarts \
             --grace-period --no-prefix --log-dir; do
        grep -q -- "$o" "$tmp/help" || { why "--help does not mention $o"; return 1; }
    done
}
check "--help prints a manual (NAME ... EXAMPLES, every option) and exits 0" help_ok

# bad ARGS...: exit 2, exactly two lines on stderr: "ddprun: <error>" and the usage line.
bad() {
    "$D" "$@" > "$tmp/bad.out" 2> "$tmp/bad.err"
    rc=$?
    [ $rc -eq 2 ] || { why "ddprun $*: exit $rc, want 2"; cat "$tmp/bad.err" >> "$tmp/why"; return 1; }
    [ "$(wc -l < "$tmp/bad.err")" -eq 2 ] && head -1 "$tmp/bad.err" | grep -q '^ddprun: ' &&
        sed -n 2p "$tmp/bad.err" | grep -q '^usage: ddprun ' && [ ! -s "$tmp/bad.out" ] ||
        { why "ddprun $*: want one error line and the usage line on stderr, got:"; cat "$tmp/bad.err" >> "$tmp/why"; return 1; }
}
check "unknown flag: one-line error + usage, exit 2" bad --bogus-flag -n 2 true
check "bad values: -n 0, -n x, --grace-period -1, --node-rank 2 of --nnodes 2: exit 2" \
    sh -c "'$D' -n 0 true 2>/dev/null; [ \$? -eq 2 ] && '$D' -n x true 2>/dev/null; [ \$? -eq 2 ] &&
           '$D' --grace-period -1 true 2>/dev/null; [ \$? -eq 2 ] &&
           '$D' --nnodes 2 --node-rank 2 --master-port 1234 true 2>/dev/null; [ \$? -eq 2 ]"
check "missing program, missing value, --nnodes 2 without --master-port: exit 2" \
    sh -c "'$D' -n 2 2>/dev/null; [ \$? -eq 2 ] && '$D' -n 2>/dev/null; [ \$? -eq 2 ] &&
           '$D' --nnodes 2 true 2>/dev/null; [ \$? -eq 2 ]"
version_ok() {
    want=$(sed -n 's/^#define DDP_VERSION_\(MAJOR\|MINOR\) \([0-9]*\).*/\2/p' ddp_base.h | paste -sd. -)
    got=$("$D" --version 2> "$tmp/why") || { why "--version exited $?"; return 1; }
    why "--version printed '$got'; ddp_base.h says $want"
    case $got in "ddprun (libddp) $want"*) return 0 ;; esac
    return 1
}
check "--version prints libddp's version (ddp_base.h) on stdout and exits 0" version_ok
np_ok() {
    "$D" -np 2 sh -c 'echo "np $RANK of $WORLD_SIZE"' > "$tmp/np2" 2>&1 || { why "exit $?"; cat "$tmp/np2" >> "$tmp/why"; return 1; }
    cat "$tmp/np2" > "$tmp/why"
    grep -qxF '[rank 0] np 0 of 2' "$tmp/np2" && grep -qxF '[rank 1] np 1 of 2' "$tmp/np2"
}
check "-np 2 (mpirun's spelling) means -n 2" np_ok
bad_line=$("$D" --nnodes=2 --nproc_per_node=2 true 2>&1 | head -1)
case $bad_line in
    *"--master-port"*) ok "torchrun spellings (--nproc_per_node=2) are accepted; the error names the fix" ;;
    *) notok "torchrun spellings (--nproc_per_node=2) are accepted; the error names the fix"; echo "#   got: $bad_line" ;;
esac

# --- 7-10: environment contract ---------------------------------------------------------------
# expect FILE RANK NAME=VALUE...: rank RANK's line NAME=VALUE is in FILE (prefixed output).
expect() {
    f=$1; r=$2; shift 2
    for kv in "$@"; do
        grep -qxF "[rank $r] $kv" "$f" || why "rank $r: want '$kv', got '$(grep -F "[rank $r] ${kv%%[= ]*}" "$f" | head -1)'"
    done
}
env_single() {
    "$D" -n 3 sh $H/print_env.sh > "$tmp/env1" 2> "$tmp/env1.err" || { why "exit $?"; cat "$tmp/env1.err" >> "$tmp/why"; return 1; }
    for r in 0 1 2; do
        expect "$tmp/env1" $r RANK=$r LOCAL_RANK=$r WORLD_SIZE=3 LOCAL_WORLD_SIZE=3 GROUP_RANK=0 \
            GROUP_WORLD_SIZE=1 ROLE_RANK=$r ROLE_WORLD_SIZE=3 ROLE_NAME=default MASTER_ADDR=127.0.0.1 \
            TORCHELASTIC_RESTART_COUNT=0 TORCHELASTIC_MAX_RESTARTS=0 TORCHELASTIC_USE_AGENT_STORE=False \
            TORCH_NCCL_ASYNC_ERROR_HANDLING=1 OMP_NUM_THREADS=1
    done
    # Shared by all ranks, and well-formed: port, run id (a UUID), secret (32 hex digits).
    for v in MASTER_PORT TORCHELASTIC_RUN_ID DDP_JOB_SECRET; do
        [ "$(grep "^\[rank [0-9]\] $v=" "$tmp/env1" | sed 's/^\[rank [0-9]\] //' | sort -u | wc -l)" -eq 1 ] ||
            why "$v differs between ranks or is missing"
    done
    grep -q '^\[rank 0\] MASTER_PORT=[1-9][0-9]*$' "$tmp/env1" || why "MASTER_PORT is not a port number"
    grep -Eq '^\[rank 0\] TORCHELASTIC_RUN_ID=[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$' "$tmp/env1" ||
        why "TORCHELASTIC_RUN_ID is not a random UUID"
    grep -Eq '^\[rank 0\] DDP_JOB_SECRET=[0-9a-f]{32}$' "$tmp/env1" || why "DDP_JOB_SECRET is not 32 hex digits"
    [ ! -s "$tmp/why" ]
}
check "env contract, -n 3: every torchrun variable + DDP_JOB_SECRET, right values on every rank" env_single

env_multi() {
    "$D" -n 2 --nnodes 2 --node-rank 1 --master-addr 127.0.0.1 --master-port 29999 --role trainer \
        --max-restarts 3 sh $H/print_env.sh > "$tmp/env2" 2> "$tmp/env2.err" || { why "exit $?"; return 1; }
    for lr in 0 1; do
        r=$((2 + lr))
        expect "$tmp/env2" $r RANK=$r LOCAL_RANK=$lr WORLD_SIZE=4 LOCAL_WORLD_SIZE=2 GROUP_RANK=1 \
            GROUP_WORLD_SIZE=2 ROLE_RANK=$r ROLE_WORLD_SIZE=4 ROLE_NAME=trainer MASTER_ADDR=127.0.0.1 \
            MASTER_PORT=29999 TORCHELASTIC_RESTART_COUNT=0 TORCHELASTIC_MAX_RESTARTS=3 \
            TORCHELASTIC_RUN_ID=none TORCHELASTIC_USE_AGENT_STORE=False OMP_NUM_THREADS=1 \
            "DDP_JOB_SECRET unset"
    done
    [ ! -s "$tmp/why" ]
}
check "env contract, --nnodes 2 --node-rank 1 -n 2: RANK = 1*2 + LOCAL_RANK, given port, no invented secret" env_multi

env_kept() {
    OMP_NUM_THREADS=7 DDP_JOB_SECRET=s3cret TORCH_NCCL_ASYNC_ERROR_HANDLING=0 \
        "$D" -n 2 --nnodes 2 --node-rank 0 --master-port 29998 --rdzv-id job42 sh $H/print_env.sh > "$tmp/env3" 2>&1 ||
        { why "exit $?"; return 1; }
    expect "$tmp/env3" 1 OMP_NUM_THREADS=7 DDP_JOB_SECRET=s3cret TORCH_NCCL_ASYNC_ERROR_HANDLING=0 TORCHELASTIC_RUN_ID=job42
    "$D" -n 1 sh $H/print_env.sh > "$tmp/env4" 2>&1 || { why "-n 1: exit $?"; return 1; }
    expect "$tmp/env4" 0 "OMP_NUM_THREADS unset"
    [ ! -s "$tmp/why" ]
}
check "env: user's OMP_NUM_THREADS/DDP_JOB_SECRET kept; OMP_NUM_THREADS left unset for -n 1" env_kept

build_helper() {
    for f in ddp*.h transports/ddp_tcp.h $H/ddprun_allreduce.c; do
        [ build/ddprun_allreduce -nt $f ] || {
            $CC $CFLAGS_T -I. $H/ddprun_allreduce.c -o build/ddprun_allreduce -pthread -lm 2> "$tmp/why"
            return
        }
    done
}
allreduce_job() {
    "$D" -n 4 build/ddprun_allreduce > "$tmp/ar.out" 2> "$tmp/ar.err" || { why "exit $?"; cat "$tmp/ar.err" >> "$tmp/why"; return 1; }
    [ "$(grep -c 'sum 10 (want 10)' "$tmp/ar.out")" -eq 4 ] || { cat "$tmp/ar.out" >> "$tmp/why"; return 1; }
}
if build_helper; then
    check "libddp program under ddprun -n 4: ddp_comm_init_env + all_reduce (port, secret work)" allreduce_job
else
    notok "libddp program under ddprun -n 4: ddp_comm_init_env + all_reduce (port, secret work)"
    sed 's/^/#   /' "$tmp/why"
fi

# Bound like mpirun's default binding (each rank its own core), the ranks are not more than the
# CPUs: each sees 1 CPU in its own mask, but the job has 2 on this host.
pinned_ranks() {
    if [ "$(nproc 2>/dev/null || echo 1)" -lt 2 ] || ! command -v taskset > /dev/null 2>&1; then
        return 0
    fi
    DDP_DEBUG=INFO "$D" -n 2 sh -c 'exec taskset -c $RANK build/ddprun_allreduce' > "$tmp/pin.out" 2>&1 ||
        { why "exit $?"; cat "$tmp/pin.out" >> "$tmp/why"; return 1; }
    grep 'wait policy' "$tmp/pin.out" > "$tmp/why"
    [ "$(grep -c '2 ranks on this host, 2 CPUs for them (their affinity masks together; 1 for this rank)' "$tmp/pin.out")" -eq 2 ]
}
check "ranks bound to one core each (taskset): 2 ranks, 2 CPUs for them, not oversubscribed" pinned_ranks

# --- 11-12: free port ---------------------------------------------------------------------------
two_jobs() {
    "$D" -n 2 sh -c 'echo "port $MASTER_PORT"; sleep 1' > "$tmp/p1" 2>&1 &
    p1=$!
    "$D" -n 2 sh -c 'echo "port $MASTER_PORT"; sleep 1' > "$tmp/p2" 2>&1 &
    p2=$!
    wait $p1; r1=$?
    wait $p2; r2=$?
    a=$(sed -n 's/^\[rank 0\] port //p' "$tmp/p1"); b=$(sed -n 's/^\[rank 0\] port //p' "$tmp/p2")
    why "exits $r1 $r2, ports '$a' '$b'"
    [ $r1 -eq 0 ] && [ $r2 -eq 0 ] && [ -n "$a" ] && [ -n "$b" ] && [ "$a" != "$b" ] && [ "$a" != 29500 ]
}
check "no --master-port: ddprun picks a free port; two concurrent jobs get different ones" two_jobs

two_libddp_jobs() {
    [ -x build/ddprun_allreduce ] || { why "no build/ddprun_allreduce"; return 1; }
    "$D" -n 3 build/ddprun_allreduce > "$tmp/j1" 2>&1 &
    p1=$!
    "$D" -n 3 build/ddprun_allreduce > "$tmp/j2" 2>&1 &
    p2=$!
    wait $p1; r1=$?
    wait $p2; r2=$?
    [ $r1 -eq 0 ] && [ $r2 -eq 0 ] || { why "exits $r1 $r2"; cat "$tmp/j1" "$tmp/j2" >> "$tmp/why"; return 1; }
}
check "two concurrent libddp jobs on one host both rendezvous (own port, own secret)" two_libddp_jobs

# --- 13-17: fail-fast ---------------------------------------------------------------------------
fail_fast() {
    t0=$(now)
    $T "$D" -n 4 sh -c 'echo $$ > '"$tmp"'/ff.pid.$RANK
        if [ "$RANK" = 2 ]; then echo "first words" >&2; sleep 0.2; echo "last words of rank two" >&2; exit 3; fi
        if [ "$RANK" = 0 ]; then sleep 60 & echo $! > '"$tmp"'/ff.pid.child; wait; fi
        exec sleep 60' > "$tmp/ff.out" 2> "$tmp/ff.err"
    rc=$?
    t1=$(now)
    why "exit $rc after $(elapsed "$t0" "$t1") s; stderr:"
    cat "$tmp/ff.err" >> "$tmp/why"
    [ $rc -eq 3 ] && elapsed_below "$t0" "$t1" 30 || return 1   # the others sleep 60 s
    for r in 0 1 3 child; do # the sleeping ranks must be gone, not orphaned; so must rank 0's child
        running "$(cat "$tmp/ff.pid.$r")" && { why "rank $r (sleep 60) is still running"; return 1; }
    done
    return 0
}
check "fail-fast: rank 2 exits 3 while others sleep 60 -> ddprun exits 3 within 30 s; ranks and their children gone" fail_fast
summary_ok() {
    [ "$(grep -c '^ddprun: FAILED' "$tmp/ff.err")" -eq 1 ] || { why "want exactly one FAILED summary"; return 1; }
    grep '^ddprun: FAILED' "$tmp/ff.err" | grep -q 'rank 2 .*exited with code 3' || { why "summary does not name rank 2 and code 3"; return 1; }
    sed -n '/^ddprun: FAILED/,$p' "$tmp/ff.err" | grep -qxF '[rank 2] last words of rank two' || { why "summary lacks the last stderr line"; return 1; }
}
check "fail-fast summary: one FAILED line naming rank 2 and code 3, then its last stderr lines" summary_ok

segv() {
    $T "$D" -n 3 sh -c 'if [ "$RANK" = 1 ]; then echo dying >&2; kill -SEGV $$; fi; exec sleep 60' > /dev/null 2> "$tmp/sg.err"
    rc=$?
    cat "$tmp/sg.err" > "$tmp/why"
    [ $rc -eq 139 ] && grep '^ddprun: FAILED' "$tmp/sg.err" | grep -q 'rank 1 .*SIGSEGV'
}
check "a rank killed by SIGSEGV: summary names the signal, ddprun exits 128+11" segv

grace() {
    t0=$(now)
    # rank 0 fails only once rank 1 ignores SIGTERM (a busy machine may start it late)
    $T "$D" -n 2 --grace-period 0.5 sh -c 'trap "" TERM
        if [ "$RANK" = 0 ]; then
            i=0; while [ ! -e '"$tmp"'/gr.ready ] && [ $i -lt 600 ]; do sleep 0.05; i=$((i + 1)); done
            exit 5
        fi
        echo $$ > '"$tmp"'/gr.pid; touch '"$tmp"'/gr.ready; sleep 60' > /dev/null 2> "$tmp/gr.err"
    rc=$?
    t1=$(now)
    why "exit $rc after $(elapsed "$t0" "$t1") s"
    cat "$tmp/gr.err" >> "$tmp/why"
    [ $rc -eq 5 ] && elapsed_below "$t0" "$t1" 30 && grep -q 'grace period and got SIGKILL' "$tmp/gr.err" &&
        ! running "$(cat "$tmp/gr.pid")"
}
check "grace period: a rank ignoring SIGTERM gets SIGKILL after --grace-period 0.5" grace

exec_fail() {
    "$D" -n 2 ./no/such/program > /dev/null 2> "$tmp/ex.err"
    rc=$?
    cat "$tmp/ex.err" > "$tmp/why"
    [ $rc -eq 127 ] && grep -q "cannot run './no/such/program'" "$tmp/ex.err"
}
check "a program that cannot be run: exit 127 and the reason in the summary" exec_fail

# --- 18-20: signals to ddprun ------------------------------------------------------------------
# forward SIG NUM: start 3 ranks that trap SIG, send SIG to ddprun, every rank must see it, and
# the rank's background child must not outlive the job (a non-interactive shell starts it with
# SIGINT ignored, so for INT it is ddprun's clean-up that ends it).
forward() {
    sig=$1 want=$((128 + $2))
    rm -f "$tmp"/ready.* "$tmp"/got.*
    # A background job of this script starts with SIGINT ignored, and ddprun keeps an ignored
    # signal ignored (as nohup users expect); undo that here, as an interactive shell would.
    env --default-signal="$sig" "$D" -n 3 sh -c 'trap "echo \$RANK > '"$tmp"'/got.\$RANK; exit 0" '"$sig"'
        sleep 60 & echo $! > '"$tmp"'/fw.child.$RANK; touch '"$tmp"'/ready.$RANK; wait' > /dev/null 2> "$tmp/fw.err" &
    pid=$!
    for r in 0 1 2; do wait_for "$tmp/ready.$r" || { why "rank $r never started"; kill -KILL $pid; return 1; }; done
    t0=$(now)
    kill -$sig $pid
    wait $pid
    rc=$?
    t1=$(now)
    why "exit $rc after $(elapsed "$t0" "$t1") s"
    cat "$tmp/fw.err" >> "$tmp/why"
    for r in 0 1 2; do [ -e "$tmp/got.$r" ] || { why "rank $r did not see SIG$sig"; return 1; }; done
    for r in 0 1 2; do gone "$(cat "$tmp/fw.child.$r")" || { why "rank $r's child outlived the job"; return 1; }; done
    [ $rc -eq $want ] && elapsed_below "$t0" "$t1" 30 && grep -q "^ddprun: got SIG$sig" "$tmp/fw.err"
}
if env --default-signal=INT true 2>/dev/null; then
    check "SIGTERM to ddprun reaches every rank, nothing left behind; ddprun exits 128+15" forward TERM 15
    check "SIGINT to ddprun reaches every rank, nothing left behind; exits 128+2" forward INT 2
else
    ok "# SKIP env --default-signal (coreutils >= 8.31) is missing"
    ok "# SKIP env --default-signal (coreutils >= 8.31) is missing"
fi

hup_ignored() { # as under nohup: SIGHUP ignored at start stays ignored, the job runs to its end
    ( trap '' HUP; exec "$D" -n 2 sh -c 'touch '"$tmp"'/hup.ready.$RANK; sleep 0.5; echo "done $RANK"' ) \
        > "$tmp/hup.out" 2>&1 &
    pid=$!
    for r in 0 1; do wait_for "$tmp/hup.ready.$r" || { why "rank $r never started"; return 1; }; done
    kill -HUP $pid
    wait $pid
    rc=$?
    why "exit $rc"
    cat "$tmp/hup.out" >> "$tmp/why"
    [ $rc -eq 0 ] && grep -qxF '[rank 0] done 0' "$tmp/hup.out" && grep -qxF '[rank 1] done 1' "$tmp/hup.out"
}
check "SIGHUP ignored when ddprun starts (nohup) stays ignored by ddprun and ranks" hup_ignored

term_ignored() {
    rm -f "$tmp"/ready.*
    "$D" -n 2 --grace-period 0.5 sh -c 'trap "" TERM; echo $$ > '"$tmp"'/ti.pid.$RANK; touch '"$tmp"'/ready.$RANK; sleep 60' \
        > /dev/null 2> "$tmp/ti.err" &
    pid=$!
    for r in 0 1; do wait_for "$tmp/ready.$r" || { why "rank $r never started"; kill -KILL $pid; return 1; }; done
    t0=$(now)
    kill -TERM $pid
    wait $pid
    rc=$?
    t1=$(now)
    why "exit $rc after $(elapsed "$t0" "$t1") s"
    cat "$tmp/ti.err" >> "$tmp/why"
    [ $rc -eq 143 ] && elapsed_below "$t0" "$t1" 30 && grep -q 'got SIGKILL' "$tmp/ti.err" &&
        ! running "$(cat "$tmp/ti.pid.0")" && ! running "$(cat "$tmp/ti.pid.1")"
}
check "SIGTERM to ddprun, ranks ignore it: SIGKILL after the grace period, no rank left" term_ignored

# --- 21-22: restarts ----------------------------------------------------------------------------
flaky='echo "attempt $TORCHELASTIC_RESTART_COUNT of max $TORCHELASTIC_MAX_RESTARTS"
    if [ "$RANK" = 1 ] && [ "$TORCHELASTIC_RESTART_COUNT" = 0 ]; then echo "flaky failure" >&2; exit 1; fi
    sleep 0.2'
restart_ok() {
    $T "$D" -n 3 --max-restarts 1 sh -c "$flaky" > "$tmp/rs.out" 2> "$tmp/rs.err"
    rc=$?
    why "exit $rc"
    cat "$tmp/rs.out" "$tmp/rs.err" >> "$tmp/why"
    [ $rc -eq 0 ] && grep -q 'restarting all 3 ranks (restart 1 of 1)' "$tmp/rs.err" &&
        [ "$(grep -c 'attempt 1 of max 1' "$tmp/rs.out")" -eq 3 ] && ! grep -q FAILED "$tmp/rs.err"
}
check "--max-restarts 1: rank fails on attempt 0, group restarts with TORCHELASTIC_RESTART_COUNT=1, exit 0" restart_ok
restart_none() {
    $T "$D" -n 3 --max-restarts 0 sh -c "$flaky" > /dev/null 2> "$tmp/rs0.err"
    rc=$?
    why "exit $rc"
    cat "$tmp/rs0.err" >> "$tmp/why"
    [ $rc -eq 1 ] && grep -q '^ddprun: FAILED: rank 1 ' "$tmp/rs0.err" && ! grep -q restarting "$tmp/rs0.err"
}
check "--max-restarts 0: the same failure ends the job (exit 1, summary)" restart_none

# --- 23-27: output ------------------------------------------------------------------------------
prefix_ok() {
    "$D" -n 2 sh -c 'echo "out $RANK"; echo "err $RANK" >&2; printf "partial $RANK"' > "$tmp/px.out" 2> "$tmp/px.err" ||
        { why "exit $?"; return 1; }
    for r in 0 1; do
        grep -qxF "[rank $r] out $r" "$tmp/px.out" && grep -qxF "[rank $r] partial $r" "$tmp/px.out" &&
            grep -qxF "[rank $r] err $r" "$tmp/px.err" || { cat "$tmp/px.out" "$tmp/px.err" >> "$tmp/why"; return 1; }
    done
}
check "prefix: '[rank N] ' on stdout and stderr lines; an unfinished last line is flushed" prefix_ok

whole_lines() {
    # 4 ranks write 300 lines of 3000 characters each as fast as they can, into one pipe.
    "$D" -n 4 sh -c 'x=$(printf "%3000s" "" | tr " " "$RANK"); i=0
        while [ $i -lt 300 ]; do echo "$x"; i=$((i + 1)); done' > "$tmp/wl.out" 2>&1 || { why "exit $?"; return 1; }
    # A good line: "[rank R] " and 3000 copies of the digit R, nothing else.
    bad=$(awk '{ r = substr($0, 7, 1); body = substr($0, 10)
                 if (substr($0, 1, 6) != "[rank " || substr($0, 8, 2) != "] " || length(body) != 3000 ||
                     gsub(r, "", body) != 3000) bad++ } END { print bad + 0 }' "$tmp/wl.out")
    total=$(wc -l < "$tmp/wl.out")
    why "$total lines, $bad not whole or mixed with another rank's text"
    [ "$total" -eq 1200 ] && [ "$bad" -eq 0 ]
}
check "4 ranks x 300 lines of 3000 bytes: every line whole, never mixed with another rank's" whole_lines

no_prefix() {
    "$D" -n 2 --no-prefix sh -c 'echo "plain $RANK"' > "$tmp/np.out" 2>&1 || { why "exit $?"; return 1; }
    cat "$tmp/np.out" > "$tmp/why"
    grep -qx 'plain 0' "$tmp/np.out" && grep -qx 'plain 1' "$tmp/np.out" && ! grep -q '\[rank' "$tmp/np.out"
}
check "--no-prefix: lines passed on as they are" no_prefix

one_prefix() {
    "$D" -n 2 sh -c 'echo "[ddp rank $RANK] WARN own"; echo "[ddp rank 7] WARN other" >&2' > "$tmp/op" 2>&1 ||
        { why "exit $?"; return 1; }
    cat "$tmp/op" > "$tmp/why"
    grep -qxF '[ddp rank 0] WARN own' "$tmp/op" && grep -qxF '[ddp rank 1] WARN own' "$tmp/op" &&
        grep -qxF '[rank 0] [ddp rank 7] WARN other' "$tmp/op" && ! grep -qF '[rank 0] [ddp rank 0]' "$tmp/op"
}
check "one prefix per line: a line libddp already prefixed with its own rank gets no second one" one_prefix
# A rank printing a line every 0.5 s with printf (no fflush): its first line must reach ddprun's
# stdout while it runs, not when it exits. The rank runs until the test has seen that line (or 30
# s passed) and creates the flag file: no timing is assumed either way.
streams_lines() {
    $CC $CFLAGS_T $H/print_slowly.c -o "$tmp/print_slowly" 2> "$tmp/why" || return 1
    $T "$D" -n 1 "$tmp/print_slowly" "$tmp/flag" > "$tmp/slow.out" 2> "$tmp/slow.err" &
    pid=$!
    i=0
    while ! grep -qxF '[rank 0] line 1' "$tmp/slow.out" && [ $i -lt 600 ]; do sleep 0.05; i=$((i + 1)); done
    seen=$(grep -c '' "$tmp/slow.out")
    touch "$tmp/flag"
    wait $pid
    rc=$?
    why "ddprun exit $rc; lines on ddprun's stdout before the rank was released: $seen (want >= 1); all output:"
    cat "$tmp/slow.out" "$tmp/slow.err" >> "$tmp/why"
    [ $rc -eq 0 ] && [ "$seen" -ge 1 ] && grep -qxF '[rank 0] done' "$tmp/slow.out"
}
check "a rank's printf lines reach ddprun's stdout as they are printed (stdout is a pseudo-terminal)" streams_lines
no_pty_ok() {
    "$D" -n 1 --no-pty sh -c '[ -t 1 ] && echo tty || echo pipe' > "$tmp/nopty" 2>&1 &&
        "$D" -n 1 sh -c '[ -t 1 ] && echo tty || echo pipe' >> "$tmp/nopty" 2>&1
    cat "$tmp/nopty" > "$tmp/why"
    [ "$(cat "$tmp/nopty")" = "$(printf '[rank 0] pipe\n[rank 0] tty')" ]
}
check "--no-pty gives the rank's stdout a pipe; by default it is a terminal" no_pty_ok

log_dir() {
    "$D" -n 2 --log-dir "$tmp/logs/sub" sh -c 'echo "out $RANK"; echo "err $RANK" >&2' > "$tmp/ld.out" 2>&1 ||
        { why "exit $?"; return 1; }
    for r in 0 1; do
        [ "$(cat "$tmp/logs/sub/rank_$r.out")" = "out $r" ] && [ "$(cat "$tmp/logs/sub/rank_$r.err")" = "err $r" ] ||
            { why "rank $r files: '$(cat "$tmp/logs/sub/rank_$r.out" "$tmp/logs/sub/rank_$r.err" 2>&1)'"; return 1; }
    done
    [ ! -s "$tmp/ld.out" ] || { why "console got output without --tee:"; cat "$tmp/ld.out" >> "$tmp/why"; return 1; }
}
check "--log-dir D: D/rank_N.out and D/rank_N.err per rank, unprefixed; nothing on the console" log_dir

log_tee() {
    $T "$D" -n 2 --log-dir "$tmp/logs2" --tee sh -c 'echo "out $RANK"; echo "err $RANK" >&2; [ $RANK = 0 ] || exit 4' \
        > "$tmp/lt.out" 2> "$tmp/lt.err"
    rc=$?
    why "exit $rc"
    cat "$tmp/lt.out" "$tmp/lt.err" >> "$tmp/why"
    [ $rc -eq 4 ] && grep -qxF '[rank 1] out 1' "$tmp/lt.out" && [ "$(cat "$tmp/logs2/rank_1.err")" = "err 1" ] &&
        sed -n '/^ddprun: FAILED/,$p' "$tmp/lt.err" | grep -qxF '[rank 1] err 1'
}
check "--log-dir with --tee: files and console; the failure summary still shows stderr lines" log_tee
