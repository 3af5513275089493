#!/usr/bin/env bash
# SPDX-License-Identifier: MIT (see LICENSE)
# ddp-status on a large job on this host (make scale): N ranks under build/ddprun (tcp), every
# rank's health thread on; rank N/2 sleeps SLEEP_S in user code before its 6th all-reduce, so the
# others wait for it there; once they do, ddp-status is asked ROUNDS times (wall time of each
# answer, the verdict); then rank N/2 + 1 is stopped (SIGSTOP) and ddp-status asked again (a rank
# not answering costs ddp-status its --wait-ms, 1 s); SIGCONT, and the job ends.
#   bench/status_scale.sh [N] [ROUNDS]        (default 1024 5; SLEEP_S=90)
set -uo pipefail
cd "$(dirname "$0")/.."
n=${1:-1024} rounds=${2:-5} sleep_s=${SLEEP_S:-90}
busy=$((n / 2)) stop=$((n / 2 + 1))
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
tmp=$(mktemp -d "${TMPDIR:-/tmp}/status_scale.XXXXXX")
job=
cleanup() { [ -n "$job" ] && kill -CONT -- -"$job" 2>/dev/null; [ -n "$job" ] && kill -- -"$job" 2>/dev/null; rm -rf "$tmp"; }
trap cleanup EXIT
export DDP_JOB_SECRET=$(od -An -tx1 -N16 /dev/urandom | tr -d ' \n')
t0=$(date +%s.%N)
setsid env DDP_TRANSPORT=tcp DDP_TIMEOUT_MS=600000 build/ddprun -n "$n" --no-prefix build/health_rank 6 "$busy" 5 sleep $((sleep_s * 1000)) \
    > "$tmp/job.out" 2>&1 &
job=$!
# every rank but the busy one at step 5: they wait in the all-reduce that follows
for _ in $(seq 1 1200); do
    [ "$(grep -c ': at 5$' "$tmp/job.out")" -ge "$n" ] && break
    sleep 0.5
done
echo "$(grep -c ': at 5$' "$tmp/job.out") of $n ranks at step 5, $(echo "$(date +%s.%N) - $t0" | bc) s after the start"
pid0=$(sed -n 's/^rank 0: pid //p' "$tmp/job.out")
store=$(tr '\0' '\n' < "/proc/$pid0/environ" | sed -n 's/^DDP_LAUNCHER_STORE=//p')
sleep 3   # a few periods: every rank's status shows its wait
ask() {
    for r in $(seq 1 "$rounds"); do
        a=$(date +%s%N); build/ddp-status "$store" > "$tmp/status.$r" 2>&1; rc=$?; b=$(date +%s%N)
        echo "ddp-status, $n ranks, $1: $(( (b - a) / 1000000 )) ms, exit $rc; $(grep '^verdict' "$tmp/status.$r" | cut -c1-220)"
    done
}
ask "rank $busy in user code"
pid=$(sed -n "s/^rank $stop: pid //p" "$tmp/job.out")
kill -STOP "$pid"
sleep 2
ask "rank $stop stopped"
kill -CONT "$pid"
wait "$job"; rc=$?
echo "the job ended: exit $rc, $(grep -c ': done$' "$tmp/job.out") of $n ranks done, $(echo "$(date +%s.%N) - $t0" | bc) s"
