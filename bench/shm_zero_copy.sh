#!/usr/bin/env bash
# SPDX-License-Identifier: MIT (see LICENSE)
# Shared-memory all-reduce against this machine's memcpy: staged buffers (the user's buffer copied
# through the transport's region) and registered ones (ddp_comm_mem_alloc: peers' buffers read in
# place), in the same run, interleaved, with a single-thread memcpy of each size between them.
#   bench/shm_zero_copy.sh            (ZC_ROUNDS=5 ZC_RANKS="2 4" ZC_MIN=256K ZC_MAX=256M ZC_ITERS=10)
# Each round runs, for each p, ddp-bench in place, float sum, staged then registered (the order
# flips every round), and memcpy; the table gives each cell's median over the rounds: busbw
# (GB/s, nccl-tests' definition), memcpy GB/s, and the ratios busbw / memcpy and registered /
# staged. ZC_JSON_DIR keeps the raw JSON (default: a temporary directory, removed).
set -uo pipefail
cd "$(dirname "$0")/.."
rounds=${ZC_ROUNDS:-5}
ranks=${ZC_RANKS:-2 4}
lo=${ZC_MIN:-256K}
hi=${ZC_MAX:-256M}
iters=${ZC_ITERS:-10}
make -s build/ddp-bench >/dev/null || exit 1
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

echo "# $(date -u +%FT%TZ) $(nproc) CPUs; $rounds rounds; p = $ranks; $lo .. $hi; $iters iterations per size"
for r in $(seq 1 "$rounds"); do
  if [ $((r % 2)) = 1 ]; then order="0 1"; else order="1 0"; fi
  for p in $ranks; do
    for reg in $order; do
      build/ddp-bench -N "$p" --transport shm -o all_reduce -b "$lo" -e "$hi" -f 2 -n "$iters" -w 3 \
        --inplace 1 -c 1 --registered "$reg" -J "$out/r$r.p$p.reg$reg.json" >/dev/null 2>"$tmp/err" ||
        { echo "round $r p=$p registered=$reg failed:"; tail -3 "$tmp/err"; }
    done
    "$tmp/memcpy_bw" "$lob" "$hib" >"$out/r$r.p$p.memcpy"
  done
done

python3 - "$out" "$rounds" "$ranks" <<'EOF'
import json, os, statistics, sys
out, rounds, ranks = sys.argv[1], int(sys.argv[2]), [int(x) for x in sys.argv[3].split()]
def med(v): return statistics.median(v) if v else float('nan')
print("| p | bytes | memcpy GB/s | staged busbw | registered busbw | staged / memcpy | registered / memcpy | registered / staged |")
print("|---:|---:|---:|---:|---:|---:|---:|---:|")
for p in ranks:
    cells = {}
    for r in range(1, rounds + 1):
        for reg in (0, 1):
            f = os.path.join(out, "r%d.p%d.reg%d.json" % (r, p, reg))
            if not os.path.exists(f): continue
            for row in json.load(open(f))["results"]:
                if row.get("wrong"): print("WRONG RESULTS: round %d p=%d registered=%d bytes %d" % (r, p, reg, row["bytes"]))
                cells.setdefault(row["bytes"], {}).setdefault(reg, []).append(row["busbw_GBs"])
        f = os.path.join(out, "r%d.p%d.memcpy" % (r, p))
        if os.path.exists(f):
            for line in open(f):
                n, g = line.split()
                cells.setdefault(int(n), {}).setdefault("memcpy", []).append(float(g))
    for n in sorted(cells):
        c = cells[n]
        m, s, g = med(c.get("memcpy", [])), med(c.get(0, [])), med(c.get(1, []))
        print("| %d | %d | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f |" % (p, n, m, s, g, s / m, g / m, g / s))
EOF
