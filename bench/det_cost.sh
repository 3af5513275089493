#!/usr/bin/env bash
# SPDX-License-Identifier: MIT (see LICENSE)
# bench/det_cost.sh — what the deterministic reduction mode (DDP_DETERMINISTIC=1: every element
# summed in rank order) costs: ddp-bench's bus bandwidth with the mode off and on, run
# interleaved round by round (off on off on ...) so that both meet the same machine state, then
# per collective, transport, world size and size the median over rounds of each and on/off.
#   bench/det_cost.sh [ROUNDS]            (default 3; build/ddp-bench must be built: make build/ddp-bench)
# Knobs: DET_CONFIGS ("tcp:2 tcp:4 shm:2 shm:4"), DET_OPS ("all_reduce reduce_scatter"),
# DET_SIZES (4K,16K,64K,256K,1M,4M,16M,64M), DET_TARGET_S (0.1: about that much timed work per
# size), DET_ITERS (200: at most that many calls per size), DDP_BENCH (build/ddp-bench).
# At p <= 2 the mode changes nothing (two ranks' sum is the same in either order), so the p = 2
# rows show how far this machine's noise alone moves on/off.
# Time columns: p50 per call up to 64 KiB, the mean above (medians over rounds), for latency.
# In place, float, sum, -c 0 (no check: the mode's bits are test_deterministic's business).
# It also says whether the mode was active: a short traced run must name the deterministic
# algorithm ("no" on a libddp without the mode: then on/off only measures noise).
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
bench=${DDP_BENCH:-build/ddp-bench}
configs=${DET_CONFIGS:-"tcp:2 tcp:4 shm:2 shm:4"}
ops=${DET_OPS:-"all_reduce reduce_scatter"}
sizes=${DET_SIZES:-4K,16K,64K,256K,1M,4M,16M,64M}
target=${DET_TARGET_S:-0.1}
iters=${DET_ITERS:-200}
[ -x "$bench" ] || { echo "det_cost.sh: $bench not found (make build/ddp-bench)" >&2; exit 2; }
# shellcheck source=bench/bench_lib.sh
. bench/bench_lib.sh
out=$(mktemp -d "${TMPDIR:-/tmp}/det_cost.XXXXXX")
trap 'rm -rf "$out"' EXIT
unset DDP_DETERMINISTIC DDP_ALGO DDP_SEGMENT_BYTES DDP_TRACE

echo "== $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) cores, $rounds rounds, configs $configs, ops $ops, sizes $sizes"
for r in $(seq 1 "$rounds"); do
  echo "== round $r: $(busy_cores) cores busy before it"
  for cfg in $configs; do
    t=${cfg%%:*} p=${cfg##*:}
    for op in $ops; do
      for mode in off on; do
        det=0; [ $mode = on ] && det=1
        DDP_DETERMINISTIC=$det "$bench" -N "$p" --transport "$t" -o "$op" -d float -o sum -s "$sizes" \
          -n "$iters" -w 3 --target-seconds "$target" -c 0 --inplace 1 -J "$out/$mode.$op.$t.$p.$r.json" \
          > "$out/$mode.$op.$t.$p.$r.txt" 2>&1 || { echo "ddp-bench failed:"; cat "$out/$mode.$op.$t.$p.$r.txt"; exit 1; }
      done
    done
  done
done

# Was the mode active? A traced all-reduce at p = 3 (the mode changes nothing at p <= 2, where
# both orders give the same bits) names the algorithm that ran.
DDP_DETERMINISTIC=1 DDP_TRACE="$out/trace.%r.json" "$bench" -N 3 --transport tcp -o all_reduce -s 1M -n 3 -w 1 -c 1 \
  > "$out/trace.txt" 2>&1 || true
if grep -qi deterministic "$out"/trace.*.json 2> /dev/null; then active=yes; else active="no (the mode is a no-op in this build)"; fi
echo "== mode active (DDP_DETERMINISTIC=1, p = 3 traced all-reduce names a deterministic algorithm): $active"

python3 - "$out" "$ops" $configs <<'PY'
import json, sys, statistics, glob, os
out, ops, configs = sys.argv[1], sys.argv[2].split(), sys.argv[3:]
def size(b): return f'{b >> 20} MiB' if b >= 1 << 20 else f'{b >> 10} KiB' if b >= 1024 else f'{b} B'
# time: p50 up to 64 KiB, the mean above (as ab.sh and docs/performance.md's tables)
def t_us(row): return row['p50_us'] if row['bytes'] <= 65536 else row['time_us']
print('| collective | transport, p | size | busbw off GB/s | busbw on GB/s | on/off | time off us | time on us | rounds |')
print('|---|---|---:|---:|---:|---:|---:|---:|---:|')
summary = []
for op in ops:
    for cfg in configs:
        t, p = cfg.split(':')
        per, tim = {}, {}
        for mode in ('off', 'on'):
            for f in glob.glob(os.path.join(out, f'{mode}.{op}.{t}.{p}.*.json')):
                for row in json.load(open(f))['results']:
                    per.setdefault((row['bytes'], mode), []).append(row['busbw_GBs'])
                    tim.setdefault((row['bytes'], mode), []).append(t_us(row))
        big = []
        for b in sorted({k[0] for k in per}):
            if (b, 'off') not in per or (b, 'on') not in per: continue
            o, n = statistics.median(per[(b, 'off')]), statistics.median(per[(b, 'on')])
            ratio = n / o if o > 0 else float('nan')
            if b >= 1 << 20: big.append(ratio)
            to, tn = statistics.median(tim[(b, 'off')]), statistics.median(tim[(b, 'on')])
            print(f'| {op} | {t}, {p} | {size(b)} | {o:.3f} | {n:.3f} | {ratio:.2f} | {to:.1f} | {tn:.1f} | {len(per[(b, "off")])} |')
        if big: summary.append((op, t, p, min(big), statistics.median(big)))
print()
print('| collective | transport, p | on/off at >= 1 MiB: lowest | median |')
print('|---|---|---:|---:|')
for op, t, p, lo, med in summary:
    print(f'| {op} | {t}, {p} | {lo:.2f} | {med:.2f} |')
PY
