#!/bin/sh
# SPDX-License-Identifier: MIT (see LICENSE)
# examples/elastic_demo.sh RUNS — `make elastic-demo`: the elastic MLP demo
# (examples/train_mlp_elastic.c) RUNS times on 4 ranks under
# `build/ddprun --elastic 3 --max-restarts 1`, over tcp and shared memory in turn (DDP_TRANSPORT).
# Each run kills a rank drawn at random (any of the 4, rank 0 included) at a step drawn at random
# among the first 384 of the run's 512 (8 epochs of 64 steps on 4 ranks: the last two epochs
# leave the replacement time to come in before the job ends), through the demo's
# DDP_DEMO_KILL=RANK:STEP hook (the rank SIGKILLs itself mid-backward, which stands for ddprun
# or the machine killing it; the line printed gives the exact rank and step to replay a run).
# The 3 others shrink and go on; ddprun starts a replacement, which joins; the members grow back
# to 4 at a step boundary and send it the state. A run passes when the demo prints PASS (4
# replicas bitwise identical, every sample of every epoch used exactly as PyTorch's sampler lays
# it out, the weights equal to a single-process replay), ddprun says the job finished RECOVERED
# at 4 of 4 ranks, and everything exits 0. Prints each run's line, then the PASS count and the
# median and max time from the kill to the first completed step on the shrunk communicator and
# from the replacement's start to its first step at full size (all runs, and per transport).
# Exits 1 if any run failed (its whole output is kept in build/elastic-demo-fail-N.log). Run
# from the repository root, after make builds build/train_mlp_elastic and build/ddprun.
set -u

runs=${1:-1}
D=build/ddprun
M=build/train_mlp_elastic
STEPS=384
[ -x "$D" ] && [ -x "$M" ] || { echo "elastic-demo: build $D and $M first (make elastic-demo does)" >&2; exit 2; }
tmp=$(mktemp -d "${TMPDIR:-/tmp}/elastic_demo.XXXXXX") || exit 2
trap 'rm -rf "$tmp"' EXIT

rnd() { od -An -N4 -tu4 /dev/urandom | tr -d ' '; }

i=1 pass=0
: > "$tmp/times"
while [ "$i" -le "$runs" ]; do
    if [ $((i % 2)) = 1 ]; then tp=tcp; else tp=shm; fi
    r=$(($(rnd) % 4)) s=$(($(rnd) % STEPS))
    mkdir -p "$tmp/run$i"
    TMPDIR="$tmp/run$i" DDP_TRANSPORT=$tp DDP_DEMO_KILL=$r:$s DDP_DEMO_KILL_FILE="$tmp/run$i/kill" \
        timeout -k 5 120 "$D" -n 4 --elastic 3 --max-restarts 1 "$M" > "$tmp/out" 2>&1
    rc=$?
    line=$(sed -n 's/^\[rank [0-9]*\] train_mlp_elastic: RESULT //p' "$tmp/out")
    if [ $rc = 0 ] && [ "${line##* }" = PASS ] &&
       grep -q '^ddprun: RECOVERED: the job finished at full size, 4 of 4 ranks' "$tmp/out"; then
        pass=$((pass + 1))
        ms=$(echo "$line" | sed -n 's/.*first_step_ms=\([0-9.]*\).*/\1/p')
        jms=$(echo "$line" | sed -n 's/.*join_to_full_ms=\([0-9.]*\).*/\1/p')
        echo "$tp $ms $jms" >> "$tmp/times"
        echo "run $i/$runs $tp: $line"
    else
        cp "$tmp/out" "build/elastic-demo-fail-$i.log"
        echo "run $i/$runs $tp: kill=$r:$s FAIL (exit status $rc; ${line:-no RESULT line}); output in build/elastic-demo-fail-$i.log:"
        tail -n 25 "$tmp/out" | sed 's/^/    /'
    fi
    rm -rf "$tmp/run$i"
    i=$((i + 1))
done

# stat FILTER COLUMN: "median X ms, max Y ms (n runs)" of the times in COLUMN (2: kill -> shrunk
# step, 3: replacement start -> first step at full size) of the runs whose transport matches.
stat() {
    awk -v f="$1" -v c="$2" '$1 ~ f { print $c }' "$tmp/times" | sort -n |
        awk '{ v[NR] = $1 } END { if (NR == 0) { print "no passing run"; exit }
                                  m = NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2
                                  printf "median %.1f ms, max %.1f ms (%d runs)\n", m, v[NR], NR }'
}
echo "elastic-demo: $pass of $runs runs PASS"
echo "elastic-demo: kill -> first step on the shrunk communicator: $(stat . 2)"
echo "elastic-demo:   tcp: $(stat tcp 2); shm: $(stat shm 2)"
echo "elastic-demo: replacement start -> first step at full size (4 ranks): $(stat . 3)"
echo "elastic-demo:   tcp: $(stat tcp 3); shm: $(stat shm 3)"
[ "$pass" = "$runs" ]
