#!/usr/bin/env bash
# SPDX-License-Identifier: MIT (see LICENSE)
# Shared-memory all-reduce against this machine's memcpy: staged buffers (the user's buffer copied
# through the transport's region) and registered ones (ddp_comm_mem_alloc: peers' buffers read in
# place), in the same run, interleaved, with a single-thread memcpy of each size between them.
#   bench/shm_zero_copy.sh    (ZC_ROUNDS=5 ZC_RANKS="2 4" ZC_MIN=256K ZC_MAX=256M ZC_ITERS=10
#                              ZC_INPLACE=1 ZC_TOUCH=0 ZC_B_ENV=)
# Each round runs, for each p, ddp-bench, float sum, staged then registered (the order flips
# every round), and memcpy; once a round, bench/mem_limit.c -x 1 gives the cross-core copy rate
# (bytes one core wrote, copied out by another: below ~16 MiB a one-thread memcpy runs from its
# own core's cache, which no exchange between cores reaches, so x-core is the fair yardstick
# there). ZC_INPLACE=1: in place; 0: out of place, send and receive buffers both plain memory
# (staged) or both from ddp_comm_mem_alloc (registered). ZC_TOUCH=1: ddp-bench --touch 1 (each
# rank rewrites its input before every timed call, untimed, as a training step writes its
# gradients; 0: back-to-back calls, whose buffers stay where the last call left them). ZC_B_ENV="VAR=value ...": a third
# column, registered with those variables set (e.g. an earlier default against the current one);
# ZC_B_BIN=<ddp-bench>: column B runs that binary (e.g. one built from an earlier commit).
# The table gives each cell's median over the rounds: busbw (GB/s, nccl-tests' definition),
# memcpy and x-core GB/s, and ratios. ZC_JSON_DIR keeps the raw JSON (default: a temporary
# directory, removed).
set -uo pipefail
cd "$(dirname "$0")/.."
rounds=${ZC_ROUNDS:-5}
ranks=${ZC_RANKS:-2 4}
lo=${ZC_MIN:-256K}
hi=${ZC_MAX:-256M}
iters=${ZC_ITERS:-10}
inplace=${ZC_INPLACE:-1}
touch=${ZC_TOUCH:-0}
benv=${ZC_B_ENV:-}
bbin=${ZC_B_BIN:-}
[ -n "$bbin" ] && [ -z "$benv" ] && benv="ZC_B_BIN=$bbin"
make -s build/ddp-bench >/dev/null || exit 1
mkdir -p build
cc -std=c99 -O2 -I. bench/mem_limit.c -o build/mem_limit -pthread || exit 1
tmp=$(mktemp -d "${TMPDIR:-/tmp}/zc.XXXXXX")
out=${ZC_JSON_DIR:-$tmp}
mkdir -p "$out"
trap 'rm -rf "$tmp"' EXIT

# memcpy of n bytes, one thread, warm buffers: the median of 9 timed copies, GB/s per size.
cat >"$tmp/memcpy_bw.c" <<'EOF'
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
static int cmp(const void *a, const void *b) { double x = *(const double *)a, y = *(const double *)b; return x < y ? -1 : x > y; }
int main(int argc, char **argv) {
    size_t lo = strtoull(argv[1], NULL, 10), hi = strtoull(argv[2], NULL, 10), n;
    char *s = malloc(hi), *d = malloc(hi);
    if (!s || !d || argc < 3) return 1;
    memset(s, 1, hi);
    memset(d, 2, hi);
    for (n = lo; n <= hi; n *= 2) {
        double t[9];
        int i, reps = (int)(((size_t)64 << 20) / n) + 1, k;
        for (i = 0; i < 9; i++) {
            double t0 = now();
            for (k = 0; k < reps; k++) { memcpy(d, s, n); __asm__ __volatile__("" ::: "memory"); }
            t[i] = (now() - t0) / reps;
        }
        qsort(t, 9, sizeof t[0], cmp);
        printf("%zu %.3f\n", n, n / t[4] / 1e9);
    }
    return 0;
}
EOF
cc -O2 -o "$tmp/memcpy_bw" "$tmp/memcpy_bw.c" || exit 1
bytes() { python3 -c "import sys; s=sys.argv[1]; m={'K':1<<10,'M':1<<20,'G':1<<30}; print(int(s[:-1])*m[s[-1]] if s[-1] in m else int(s))" "$1"; }
lob=$(bytes "$lo")
hib=$(bytes "$hi")

sizes=$(python3 -c "import sys; lo, hi = int(sys.argv[1]), int(sys.argv[2]); v = []
while lo <= hi: v.append(str(lo)); lo *= 2
print(','.join(v))" "$lob" "$hib")

echo "# $(date -u +%FT%TZ) $(nproc) CPUs; $rounds rounds; p = $ranks; $lo .. $hi; $iters iterations per size;" \
     "$([ "$inplace" = 1 ] && echo in place || echo out of place); touch $touch${benv:+; column B: registered with $benv}"
variants="0 1"
[ -n "$benv" ] && variants="0 1 2"
for r in $(seq 1 "$rounds"); do
  order=$variants
  [ $((r % 2)) = 0 ] && order=$(echo "$variants" | tr ' ' '\n' | tac | tr '\n' ' ')
  for p in $ranks; do
    for v in $order; do
      reg=1; envs=""
      [ "$v" = 0 ] && reg=0
      bin=build/ddp-bench
      [ "$v" = 2 ] && envs=$benv && bin=${bbin:-build/ddp-bench}
      # shellcheck disable=SC2086
      env $envs "$bin" -N "$p" --transport shm -o all_reduce -b "$lo" -e "$hi" -f 2 -n "$iters" -w 3 \
        --inplace "$inplace" --touch "$touch" -c 1 --registered "$reg" -J "$out/r$r.p$p.v$v.json" >/dev/null 2>"$tmp/err" ||
        { echo "round $r p=$p variant $v failed:"; tail -3 "$tmp/err"; }
    done
    "$tmp/memcpy_bw" "$lob" "$hib" >"$out/r$r.p$p.memcpy"
  done
  build/mem_limit -s "$sizes" -t 0.2 -x 1 >"$out/r$r.xcore" 2>"$tmp/err" || { echo "mem_limit failed:"; tail -3 "$tmp/err"; }
done

python3 - "$out" "$rounds" "$ranks" "$benv" <<'EOF'
import json, os, statistics, sys
out, rounds, ranks, benv = sys.argv[1], int(sys.argv[2]), [int(x) for x in sys.argv[3].split()], sys.argv[4]
def med(v): return statistics.median(v) if v else float('nan')
def div(a, b): return a / b if b == b and b else float('nan')
head = "| p | bytes | memcpy GB/s | x-core GB/s | staged busbw | registered busbw |"
if benv: head += " B busbw |"
head += " staged / x-core | registered / x-core | staged / memcpy | registered / memcpy | registered / staged |"
if benv: head += " B / staged | registered / B |"
print(head)
print("|" + "---:|" * (head.count("|") - 1))
xc = {}
for r in range(1, rounds + 1):
    f = os.path.join(out, "r%d.xcore" % r)
    if os.path.exists(f):
        for line in open(f):
            w = line.split()
            if w and not w[0].startswith("#"): xc.setdefault(int(w[0]), []).append(float(w[3]))
for p in ranks:
    cells = {}
    for r in range(1, rounds + 1):
        for v in (0, 1, 2):
            f = os.path.join(out, "r%d.p%d.v%d.json" % (r, p, v))
            if not os.path.exists(f): continue
            for row in json.load(open(f))["results"]:
                if row.get("wrong"): print("WRONG RESULTS: round %d p=%d variant %d bytes %d" % (r, p, v, row["bytes"]))
                cells.setdefault(row["bytes"], {}).setdefault(v, []).append(row["busbw_GBs"])
        f = os.path.join(out, "r%d.p%d.memcpy" % (r, p))
        if os.path.exists(f):
            for line in open(f):
                n, g = line.split()
                cells.setdefault(int(n), {}).setdefault("memcpy", []).append(float(g))
    for n in sorted(cells):
        c = cells[n]
        m, x, s, g, b = (med(c.get("memcpy", [])), med(xc.get(n, [])), med(c.get(0, [])),
                         med(c.get(1, [])), med(c.get(2, [])))
        line = "| %d | %d | %.2f | %.2f | %.2f | %.2f |" % (p, n, m, x, s, g)
        if benv: line += " %.2f |" % b
        line += " %.2f | %.2f | %.2f | %.2f | %.2f |" % (div(s, x), div(g, x), div(s, m), div(g, m), div(g, s))
        if benv: line += " %.2f | %.2f |" % (div(b, s), div(g, b))
        print(line)
EOF
