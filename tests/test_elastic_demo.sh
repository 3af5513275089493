#!/bin/sh
# SPDX-License-Identifier: MIT (see LICENSE)
# tests/test_elastic_demo.sh — the elastic MLP demo (examples/train_mlp_elastic.c) under
# `build/ddprun -n 4 --elastic 3`, end to end, with fixed kills (its DDP_DEMO_KILL=RANK:STEP
# hook: the rank SIGKILLs itself mid-backward, a bucket in flight). Run from the repository root
# (prove tests/test_elastic_demo.sh); prints TAP. Builds build/train_mlp_elastic and
# build/ddprun through make.
#   - tcp, rank 0 killed at step 100 (mid epoch 2): the store is ddprun's, so the others go on;
#     the new rank 0 (launched as rank 1) prints PASS: replicas identical on 3 ranks, every
#     sample of epoch 2 used by exactly one applied step, weights equal to the single-process
#     replay, accuracy reached; ddprun says DEGRADED and exits 0.
#   - shm, rank 3 (the last) killed at step 511, the last step of the last epoch: the rest of the
#     epoch is re-sharded into a full and a short step; PASS as above.
#   - growing back (--max-restarts 1: ddprun starts a replacement that joins): tcp, rank 0 killed
#     at step 100; shm, rank 1 (a middle one) killed at step 300 (mid epoch 5): the 3 survivors
#     shrink, then grow back to 4 at a step boundary and send the replacement the state; PASS
#     with 4 identical replicas, every sample of every epoch used as PyTorch lays it out (the
#     grow's re-shard included), the single-process replay equal; ddprun says RECOVERED, 4 of 4.
#   - a kill that never happens (a step past the run's end): the demo must FAIL (no rank lost),
#     so a PASS above is not the plain run's.
# Every run is bounded (120 s); no time is assumed otherwise. ~10 s on a busy 2-core machine.
set -u

CXX=${CXX:-g++}
D=build/ddprun
M=build/train_mlp_elastic
tmp=$(mktemp -d "${TMPDIR:-/tmp}/elastic_demo_test.XXXXXX") || { echo "Bail out! mktemp failed"; exit 1; }
trap 'rm -rf "$tmp"' EXIT
unset DDP_DEMO_KILL DDP_DEMO_KILL_FILE DDP_TRANSPORT DDP_JOB_SECRET RANK WORLD_SIZE MASTER_ADDR MASTER_PORT

echo "1..7"
. "$(dirname "$0")/tap.sh"   # ok, notok, check, why

build() { make -s "$M" "$D" > "$tmp/why" 2>&1; }
check "make builds build/train_mlp_elastic (C99, -Wall -Wextra -Wpedantic -Wshadow -Werror) and build/ddprun" build
[ -x "$M" ] && [ -x "$D" ] || { echo "Bail out! no $M or $D"; exit 1; }

if command -v "$CXX" > /dev/null 2>&1; then
    cxx() { "$CXX" -x c++ -std=c++17 -Wall -Wextra -Wpedantic -Wshadow -Werror -I. -Iexamples -fsyntax-only \
            examples/train_mlp_elastic.c > "$tmp/why" 2>&1; }
    check "examples/train_mlp_elastic.c compiles as C++17 (-Wall -Wextra -Wpedantic -Wshadow -Werror)" cxx
else
    ok "# SKIP no C++ compiler ($CXX)"
fi

# run NAME TRANSPORT RANK:STEP [DDPRUN OPTIONS]: the demo on 4 ranks, --elastic 3; output in
# $tmp/NAME.out, exit status in $tmp/NAME.rc.
run() {
    run_name=$1 run_tp=$2 run_kill=$3
    shift 3
    mkdir -p "$tmp/$run_name.d"
    TMPDIR="$tmp/$run_name.d" DDP_TRANSPORT=$run_tp DDP_DEMO_KILL=$run_kill DDP_DEMO_KILL_FILE="$tmp/$run_name.d/kill" \
        timeout -k 2 120 "$D" -n 4 --elastic 3 "$@" "$M" > "$tmp/$run_name.out" 2>&1
    echo $? > "$tmp/$run_name.rc"
}
# has NAME PATTERN: the output of run NAME has a line matching the extended regex PATTERN.
has() { grep -Eq "$2" "$tmp/$1.out" || { why "no line matching '$2' in:"; cat "$tmp/$1.out" >> "$tmp/why"; return 1; }; }
rc_is() { [ "$(cat "$tmp/$1.rc")" "$2" 0 ] || { why "exit status $(cat "$tmp/$1.rc")"; cat "$tmp/$1.out" >> "$tmp/why"; return 1; }; }

# passed NAME EPOCH LAUNCHED_RANK_OF_NEW_0 LOST_RANK
passed() {
    rc_is "$1" -eq &&
        has "$1" "^\[rank $3\] train_mlp_elastic: RESULT kill=[0-9]+:[0-9]+ seen_ms=[0-9.]+ first_step_ms=[0-9.]+ accuracy=[0-9.]+ identical=yes samples=ok replay=equal PASS$" &&
        has "$1" "^\[rank $3\] replicas bitwise identical on all 3 ranks: yes$" &&
        has "$1" "^\[rank $3\] single-process replay of the applied steps: max relative difference [0-9.e+-]+ in [A-Za-z0-9]+ \(limit 1e-05\): equal$" &&
        has "$1" "^\[rank $3\] epoch $2 \(the failure's\) sample accounting: every sample used by exactly one applied step \(0 lost, 0 repeated" &&
        has "$1" "^\[rank $3\] first step on the shrunk communicator \(3 ranks\) completed [0-9.]+ ms after the kill$" &&
        has "$1" "^ddprun: DEGRADED: the job finished with 3 of 4 ranks" &&
        has "$1" "^ddprun: +rank $4 .*killed by SIGKILL"
}

run rank0 tcp 0:100
check "tcp, rank 0 killed at step 100 (epoch 2, a bucket in flight): 3 ranks finish, identical, every sample once, PASS, exit 0" \
    passed rank0 2 1 0

# grown NAME EPOCH LAUNCHED_RANK_OF_NEW_0 LOST_RANK: passed, but back at 4 ranks through a replacement
grown() {
    rc_is "$1" -eq &&
        has "$1" "^\[rank $3\] train_mlp_elastic: RESULT kill=[0-9]+:[0-9]+ seen_ms=[0-9.]+ first_step_ms=[0-9.]+ grown=4 join_to_full_ms=[0-9.]+ accuracy=[0-9.]+ identical=yes samples=ok replay=equal PASS$" &&
        has "$1" "^\[rank $3\] replicas bitwise identical on all 4 ranks: yes$" &&
        has "$1" "^\[rank $3\] single-process replay of the applied steps: max relative difference [0-9.e+-]+ in [A-Za-z0-9]+ \(limit 1e-05\): equal$" &&
        has "$1" "^\[rank $3\] epoch $2 \(the failure's\) sample accounting: every sample used by exactly one applied step \(0 lost, 0 repeated" &&
        has "$1" "^\[rank $3\] sample accounting, all 8 epochs: ok$" &&
        has "$1" "^\[rank $3\] timeline \(ms after the kill\): replacement started [0-9.]+, admitted \(grown to 4 ranks\) [0-9.]+, state received" &&
        has "$1" "^ddprun: RECOVERED: the job finished at full size, 4 of 4 ranks" &&
        has "$1" "^ddprun: REPLACED rank $4 "
}

run grow0 tcp 0:100 --max-restarts 1
check "tcp, rank 0 killed at step 100, --max-restarts 1: shrink to 3, the replacement joins, 4 finish identical, every sample once, PASS, RECOVERED" \
    grown grow0 2 1 0

run growmid shm 1:300 --max-restarts 1
check "shm, a middle rank killed at step 300, --max-restarts 1: shrink to 3, grow back to 4, identical, every sample once, PASS, RECOVERED" \
    grown growmid 5 0 1

run last shm 3:511
check "shm, the last rank killed at the last step: the epoch's rest re-sharded (a short step), identical, every sample once, PASS" \
    passed last 8 0 3

run never tcp 1:100000
never() { rc_is never -ne && has never "no rank was lost" && has never "^ddprun: FAILED" && has never "train_mlp_elastic: RESULT .* FAIL$"; }
check "a kill that never happens (step past the end): the demo says no rank was lost, FAIL, exit non-zero" never
