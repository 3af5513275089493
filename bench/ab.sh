#!/usr/bin/env bash
# SPDX-License-Identifier: MIT (see LICENSE)
# A/B two builds of ddp-bench in one sitting, interleaved round by round (A B A B ...), so both
# meet the same machine state: e.g. before and after a refactor.
#   bench/ab.sh OLD_DDP_BENCH NEW_DDP_BENCH [ROUNDS]      (knobs: AB_CONFIGS, AB_SIZES, AB_ITERS, AB_OPS)
# AB_OPS: the collectives (ddp-bench -o names, space-separated; default all_reduce).
# Prints, per configuration and size, the median over rounds of each build's time per call
# (p50 up to 64 KiB, mean above, as docs/performance.md's tables) and new/old: < 1 means the new is faster.
set -euo pipefail
old=$1 new=$2 rounds=${3:-5}
configs=${AB_CONFIGS:-"tcp:2 shm:2 tcp:4"}
sizes=${AB_SIZES:-8,4K,64K,1M,16M}
iters=${AB_ITERS:-40}
ops=${AB_OPS:-all_reduce}
out=$(mktemp -d)
# A build from before ddp-bench took nccl-tests' letters spells ranks, transport and in place
# -p, -t, -i: each binary gets the spelling its --help offers (the new one prints it on stdout).
spelling() { if "$1" --help 2> /dev/null | grep -q -- '--transport'; then echo new; else echo old; fi; }
declare -A spell=([old]=$(spelling "$old") [new]=$(spelling "$new"))
for r in $(seq 1 "$rounds"); do
  for cfg in $configs; do
    t=${cfg%%:*} p=${cfg##*:}
    for op in $ops; do
      for which in old new; do
        bin=$old; [ $which = new ] && bin=$new
        if [ "${spell[$which]}" = new ]; then args=(-N "$p" --transport "$t" --inplace 1)
        else args=(-p "$p" -t "$t" -i 1); fi
        "$bin" "${args[@]}" -o "$op" -s "$sizes" -n "$iters" -w 5 -c 0 -J "$out/$which.$op.$t.$p.$r.json" >/dev/null 2>&1
      done
    done
  done
done
python3 - "$out" "$rounds" "$ops" $configs <<'PY'
import json, sys, statistics, glob, os
out, rounds, ops, configs = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(), sys.argv[4:]
def t_us(row): return row['p50_us'] if row['bytes'] <= 65536 else row['time_us']
print('| collective | transport, p | size | old us | new us | new/old |')
print('|---|---|---:|---:|---:|---:|')
for op in ops:
  for cfg in configs:
    t, p = cfg.split(':')
    per = {}
    for which in ('old', 'new'):
        for f in glob.glob(os.path.join(out, f'{which}.{op}.{t}.{p}.*.json')):
            for row in json.load(open(f))['results']:
                per.setdefault((row['bytes'], which), []).append(t_us(row))
    for b in sorted({k[0] for k in per}):
        if (b, 'old') not in per or (b, 'new') not in per: continue
        o, n = statistics.median(per[(b, 'old')]), statistics.median(per[(b, 'new')])
        size = f'{b >> 20} MiB' if b >= 1 << 20 else f'{b >> 10} KiB' if b >= 1024 else f'{b} B'
        print(f'| {op} | {t}, {p} | {size} | {o:.2f} | {n:.2f} | {n / o:.2f} |')
PY
