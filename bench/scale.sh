#!/usr/bin/env bash
# SPDX-License-Identifier: MIT (see LICENSE)
# Init + first all-reduce of N ranks on this host (make scale): the curve in docs/performance.md.
#   bench/scale.sh [N ...]          (default 64 128 256 512 1024; SCALE_TRANSPORTS="tcp auto";
#                                    auto stops at SCALE_SHM_MAX=1024 ranks; SCALE_BIN, default
#                                    build/ddp-scale: another build of it, for before/after runs)
# Each row: the wall time of the whole build/ddprun run (start, rendezvous, connect, one float
# all-reduce, one 1 MiB all-reduce, destroy, exit) and rank 0's report of the slowest rank.
set -uo pipefail
cd "$(dirname "$0")/.."
sizes=${*:-64 128 256 512 1024}
transports=${SCALE_TRANSPORTS:-tcp auto}
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
printf '| ranks | transport | wall s | slowest init s | slowest first all_reduce s | result |\n|---:|---|---:|---:|---:|---|\n'
for t in $transports; do
  for n in $sizes; do
    # Shared memory joins one region per host (a handshake per rank) and connects the pairs that
    # talk; builds before it connected every pair: SCALE_SHM_MAX=256 keeps those to minutes.
    if [ "$t" != tcp ] && [ "$n" -gt "${SCALE_SHM_MAX:-1024}" ]; then continue; fi
    t0=$(date +%s.%N)
    out=$(DDP_TRANSPORT=$t DDP_TIMEOUT_MS=${SCALE_TIMEOUT_MS:-300000} timeout 900 build/ddprun -n "$n" --no-prefix "${SCALE_BIN:-build/ddp-scale}" 2>&1)
    rc=$?
    t1=$(date +%s.%N)
    line=$(printf '%s\n' "$out" | grep '^ddp-scale:' | tail -1)
    init=$(printf '%s' "$line" | sed -n 's/.*slowest init \([0-9.]*\) s.*/\1/p')
    ar=$(printf '%s' "$line" | sed -n 's/.*first all_reduce \([0-9.]*\) s.*/\1/p')
    via=$(printf '%s' "$line" | sed -n 's/.*rank 1: \([a-z]*\);.*/\1/p')
    res=ok; [ $rc = 0 ] && printf '%s' "$line" | grep -q 'sums right' || res="FAILED (rc $rc): $(printf '%s\n' "$out" | grep -v '^ddp-scale' | tail -2 | tr '\n' ' ' | cut -c1-200)"
    printf '| %d | %s (%s) | %.1f | %s | %s | %s |\n' "$n" "$t" "${via:-?}" "$(echo "$t1 - $t0" | bc)" "${init:--}" "${ar:--}" "$res"
  done
done
