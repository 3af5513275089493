#!/bin/sh
# SPDX-License-Identifier: MIT (see LICENSE)
# bench/validate_model.sh — held-out validation of libddp's all-reduce cost model (ddp_model.h)
# on emulated hosts (bench/netns_bench.sh: network namespaces, each host's link shaped with tc
# tbf both ways). Fits the model on one set of measurements, then measures all-reduce on
# layouts and link rates that took no part in the fit and compares each with the model's
# prediction (build/ddp-simulate --predict). Needs root, iproute2 (tc, sch_tbf) and python3.
# Run from the repository root.
#
#   bench/validate_model.sh                 the whole procedure (about 15-25 minutes)
#   QUICK=1 bench/validate_model.sh         fewer layouts, sizes and iterations (about 3 minutes)
#   FIT_MODEL=bench/results/model_netns_1gbit.conf bench/validate_model.sh
#                                           no fit: predict with this model, measure again
#
# Options: -o FILE  the report [bench/results/model_validation.md]
#          -M FILE  the fitted model [bench/results/model_netns_1gbit.conf]
#          -w DIR   keep every raw file there (calibrate output, ddp-bench JSON, predictions)
#                   [a new directory under ${TMPDIR:-/tmp}, kept, its path printed]
# Environment: QUICK=1 (see above); BIN=dir of ddp-bench, ddp-calibrate and ddp-simulate
#   [build]; NO_MAKE=1: do not run make for them; FIT_MODEL=file: skip the fit (step 1);
#   SETS="name ..." only these held-out sets (the names in the report's table, e.g. 2x2@1gbit).
#
# 1. FIT (the only measurements that set parameters):
#    - alpha_local_us, beta_local_ns, gamma_ns: `ddp-calibrate --local-only` on this machine
#      (shm ping-pong between 2 forked ranks; ddp_reduce_local over 64 MiB).
#    - alpha_net_us, beta_net_ns, nic_ns: ddp-calibrate in launcher mode, 2 hosts x 1 rank at
#      1 Gbit/s: a tcp ping-pong 8 B .. 16 MiB. Its own line fit (relative least squares over
#      8 B .. 2 KiB and 2 .. 16 MiB) is kept as "raw calibrate" and also compared, but the model
#      written is refitted from the same ping-pong table: alpha_net = the median one-way time
#      of 8 .. 512 B, beta_net = nic_ns = the relative least-squares slope of (t - alpha_net)
#      over 2 .. 16 MiB. Why: under tbf a ping-pong message below the token bucket (>= 128 KiB)
#      crosses at the veth's speed, not the link's (each direction's bucket refills while the
#      other direction sends: 2 KiB .. 128 KiB measure ~0.24 GB/s on a 0.125 GB/s link), so a
#      line through 2 KiB and 16 MiB is a compromise that is off by ~40% at every large size,
#      while an all-reduce sends both ways at once, back to back, and gets the link's rate.
#    - Other rates: beta_net and nic_ns scaled by 1 Gbit/s / rate (the link rate is an input
#      of the prediction, like p and the hosts; nothing is measured at 500 Mbit/s or 2 Gbit/s
#      to set it). alpha_net is kept.
# 2. HELD-OUT: all-reduce, float32 sum, in place (ddp-bench --inplace 1 -c 0), DDP_ALGO forcing each of
#    ring, rd (<= 4 MiB: the scratch), rabenseifner, hier_ring, hier_rabenseifner (the hier_*
#    only where a host has 2 ranks or more: with 1 rank per host they are the flat ones) on
#    2x2 and 3x1 at 1 Gbit/s, 2x1, 2x2 and 3x1 at 500 Mbit/s and 2 Gbit/s, 2+1+2 at 1 Gbit/s
#    (and 2 Gbit/s). Plus 2x1 at 1 Gbit/s, the fit's own layout and rate, as an in-sample check
#    (reported apart, not counted).
#    Bandwidth-bound sizes 256 KiB .. 64 MiB: measured = the mean time per call (ddp-bench's
#    time_us, averaged over ranks). Latency-bound sizes 8 B, 1 KiB, 16 KiB: measured = p50 (on
#    a loaded 2-core VM the mean of a 50 us call carries millisecond outliers). Both are in
#    the table. A point is within when |measured / predicted - 1| <= 25%.
# No link delay is emulated (no netem here): rates only, so alpha_net is this machine's TCP
# software cost between namespaces, and the latency-bound rows test the model only that far.
set -u

here=$(cd "$(dirname "$0")" && pwd)
out=bench/results/model_validation.md model_out=bench/results/model_netns_1gbit.conf work=""
while getopts o:M:w:h opt; do
    case $opt in
        o) out=$OPTARG ;; M) model_out=$OPTARG ;; w) work=$OPTARG ;;
        *) sed -n '2,/^[^#]/s/^# \{0,1\}//p' "$0" >&2; exit 2 ;;
    esac
done
die() { echo "validate_model: $*" >&2; exit 2; }
[ "$(id -u)" = 0 ] || die "needs root (network namespaces, tc)"
command -v python3 > /dev/null || die "needs python3 (the comparison and the report)"
BIN=${BIN:-build} QUICK=${QUICK:-0}
if [ "${NO_MAKE:-0}" != 1 ]; then
    make build/ddp-bench build/ddp-calibrate build/ddp-simulate > /dev/null || die "make failed"
fi
for b in ddp-bench ddp-calibrate ddp-simulate; do [ -x "$BIN/$b" ] || die "no $BIN/$b"; done
[ -n "$work" ] || work=$(mktemp -d "${TMPDIR:-/tmp}/validate_model.XXXXXX") || die "mktemp failed"
mkdir -p "$work" || die "cannot create $work"
echo "# raw files: $work"
netns="$here/netns_bench.sh"
t_start=$(date +%s)

# ------------------------------------------------------------------ 1. fit
if [ -n "${FIT_MODEL:-}" ]; then
    [ -r "$FIT_MODEL" ] || die "no $FIT_MODEL"
    [ "$FIT_MODEL" = "$model_out" ] || cp "$FIT_MODEL" "$model_out"
    : > "$work/calibrate_local.txt"; : > "$work/calibrate_net.txt"
    cp "$model_out" "$work/model_raw.conf"; cp "$model_out" "$work/model_pingpong.conf"
    echo "# fit skipped: FIT_MODEL=$FIT_MODEL (its model stands in for the raw and ping-pong-only ones)"
else
    echo "# fit 1/2: ddp-calibrate --local-only"
    "$BIN/ddp-calibrate" --local-only -o "$work/local.conf" > "$work/calibrate_local.txt" ||
        die "ddp-calibrate --local-only failed (see $work/calibrate_local.txt)"
    echo "# fit 2/2: ddp-calibrate, launcher mode, 2 hosts x 1 rank at 1gbit"
    "$netns" -H 2 -R 1 -r 1gbit -p 29610 -- "$BIN/ddp-calibrate" -m "$work/local.conf" \
        -o "$work/model_raw.conf" > "$work/calibrate_net.txt" 2>&1 ||
        die "the launched ddp-calibrate failed (see $work/calibrate_net.txt)"
    python3 - "$work/calibrate_net.txt" "$work/model_raw.conf" "$work/model_pingpong.conf" << 'EOF' || die "refit failed"
import re, statistics, sys
table, raw, out = sys.argv[1:4]
rows, on = [], False
for line in open(table):
    if line.startswith('net (tcp'): on = True; continue
    if on:
        m = re.match(r'\s+(\d+)\s+([\d.]+)\s+[\d.]+\s', line)
        if m: rows.append((int(m.group(1)), float(m.group(2))))
        elif rows: break
if not rows: sys.exit('no ping-pong table in ' + table)
keys = {}
for line in open(raw):
    line = line.split('#')[0].strip()
    if '=' in line:
        k, v = line.split('='); keys[k.strip()] = float(v)
alpha = statistics.median(t for n, t in rows if n <= 512)
big = [(n, t - alpha) for n, t in rows if n >= 2 << 20]
beta = sum(n / y for n, y in big) / sum(n * n / (y * y) for n, y in big) * 1e3   # us/B -> ns/B
with open(out, 'w') as f:
    f.write('# libddp all-reduce cost model (ddp_model.h), fitted by bench/validate_model.sh\n')
    f.write('# local keys and gamma: ddp-calibrate --local-only on this machine (shm ping-pong, 2 forked ranks)\n')
    f.write('# net keys: the tcp ping-pong of ddp-calibrate in launcher mode between 2 network namespaces,\n')
    f.write('#   each host link shaped with tc tbf at 1 Gbit/s both ways (bench/netns_bench.sh -H 2 -R 1 -r 1gbit);\n')
    f.write('#   alpha_net = median one-way time of 8..512 B; beta_net = nic_ns = relative least-squares slope\n')
    f.write('#   of (t - alpha_net) over 2..16 MiB. ddp-calibrate\'s own line fit gave alpha_net %.4g us,\n' % keys['alpha_net_us'])
    f.write('#   beta_net %.4g ns/B: tbf lets sizes below its bucket cross at the veth speed in a ping-pong.\n' % keys['beta_net_ns'])
    f.write('#   For a link of R Gbit/s scale beta_net and nic_ns by 1/R.\n')
    f.write('#   The comment lines below and the keys are those of the model file: DDP_MODEL=<it> selects it.\n')
    for k in ('alpha_local_us', 'beta_local_ns'):
        f.write('%s = %.6g\n' % (k, keys[k]))
    f.write('#   alpha_net: the ping-pong gave %.4g us; replaced by the per-step time of 8 B all-reduces on the\n' % alpha)
    f.write('#   same 2 hosts x 1 rank at 1 Gbit/s (p50 of ring: 2 steps, rd: 1, rabenseifner: 2; the median)\n')
    f.write('alpha_net_us = %.6g\nbeta_net_ns = %.6g\nnic_ns = %.6g\n' % (alpha, beta, beta))
    f.write('gamma_ns = %.6g\n' % keys['gamma_ns'])
EOF
fi
fit_alpha() {   # after the fit set: alpha_net from its 8 B all-reduces, the model file written
    python3 - "$work" "$work/model_pingpong.conf" "$model_out" << 'EOF'
import json, os, re, statistics, sys
work, src, out = sys.argv[1:4]
steps = {'ring': 2, 'rd': 1, 'rabenseifner': 2}   # messages in a row, p = 2
per = []
for a, k in steps.items():
    f = os.path.join(work, 'bench_2x1_1gbit_%s_lat.json' % a)
    for r in json.load(open(f))['results'] if os.path.exists(f) else []:
        if r.get('inplace') and r['bytes'] == 8: per.append(r['p50_us'] / k)
if not per: sys.exit('no 8 B all-reduce of the fit set')
alpha = statistics.median(per)
text = open(src).read()
text = re.sub(r'^alpha_net_us = .*$', 'alpha_net_us = %.6g' % alpha, text, flags=re.M)
text = text.replace('# libddp all-reduce cost model (ddp_model.h), fitted by bench/validate_model.sh\n',
                    '# libddp all-reduce cost model (ddp_model.h), fitted by bench/validate_model.sh; DDP_MODEL=%s selects it\n' % out)
text = text.replace('#   The comment lines below and the keys are those of the model file: DDP_MODEL=<it> selects it.\n', '')
text = text.replace('same 2 hosts x 1 rank at 1 Gbit/s (p50 of ring', 'same 2 hosts x 1 rank at 1 Gbit/s (%s us per step; p50 of ring' % ', '.join('%.3g' % v for v in per))
open(out, 'w').write(text)
print('# alpha_net_us = %.4g (per-step p50 of the fit set\'s 8 B all-reduces: %s)' % (alpha, ', '.join('%.3g' % v for v in per)))
EOF
}

# A model for another link rate: beta_net and nic_ns scaled by 1 Gbit/s / rate.
rate_gbit() {
    case $1 in
        *gbit) echo "${1%gbit}" ;;
        *mbit) awk "BEGIN { print ${1%mbit} / 1000 }" ;;
        *) die "rate $1: expected Ngbit or Nmbit" ;;
    esac
}
scaled_model() {   # src rate dst
    g=$(rate_gbit "$2")
    awk -v g="$g" -v r="$2" 'BEGIN { print "# " r ": net beta and nic scaled by 1 Gbit/s / " r }
        /^[ \t]*(beta_net_ns|nic_ns)[ \t]*=/ { split($0, kv, "="); gsub(/[ \t]/, "", kv[1]); printf "%s = %.6g\n", kv[1], kv[2] / g; next }
        { print }' "$1" > "$3"
}

# ------------------------------------------------------------------ 2. held-out measurements
# set name, layout (ranks per host), rate, role
if [ "$QUICK" = 1 ]; then
    sets="2x1@1gbit:1,1:1gbit:fit 2x2@1gbit:2,2:1gbit:held 3x1@1gbit:1,1,1:1gbit:held 2x2@500mbit:2,2:500mbit:held 2x1@2gbit:1,1:2gbit:held"
    bw_mid=1M bw_big=16M lat=8,16K n_lat=50 n_mid=5 n_big=2
else
    sets="2x1@1gbit:1,1:1gbit:fit 2x2@1gbit:2,2:1gbit:held 3x1@1gbit:1,1,1:1gbit:held 2+1+2@1gbit:2,1,2:1gbit:held
          2x1@500mbit:1,1:500mbit:held 2x2@500mbit:2,2:500mbit:held 3x1@500mbit:1,1,1:500mbit:held
          2x1@2gbit:1,1:2gbit:held 2x2@2gbit:2,2:2gbit:held 3x1@2gbit:1,1,1:2gbit:held 2+1+2@2gbit:2,1,2:2gbit:held"
    bw_mid=256K,1M,4M bw_big=16M,64M lat=8,1K,16K n_lat=200 n_mid=10 n_big=4
fi
manifest=$work/manifest.tsv
: > "$manifest"
port=29620
measure() {   # set layout rate role algo kind sizes iters warmup
    f=$work/bench_$(echo "$1_$5_$6" | tr '@,+' '___').json
    l0=$(cut -d' ' -f1 /proc/loadavg)
    port=$((port + 1))
    "$netns" -L "$2" -r "$3" -p $port -s "$7" -n "$8" -w "$9" -a '--inplace 1 -c 0' -J "$f" -- DDP_ALGO="$5" \
        > "$work/log_$(basename "$f" .json).txt" 2>&1 || { echo "#   FAILED: $1 $5 $6 (see $work)"; return 0; }
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" "$5" "$6" "$f" "$l0" \
        "$(cut -d' ' -f1 /proc/loadavg)" >> "$manifest"
}
for s in $sets; do
    name=${s%%:*} rest=${s#*:}
    layout=${rest%%:*} rest=${rest#*:}
    rate=${rest%%:*} role=${rest#*:}
    if [ -n "${SETS:-}" ] && { [ "$role" != fit ] || [ -n "${FIT_MODEL:-}" ]; }; then
        case " $SETS " in *" $name "*) ;; *) continue ;; esac
    fi
    lmax=$(echo "$layout" | tr ',' '\n' | sort -n | tail -n 1)
    algos="ring rd rabenseifner"
    [ "$lmax" -lt 2 ] || algos="$algos hier_ring hier_rabenseifner"
    echo "# measuring $name ($role): $algos  [$(($(date +%s) - t_start)) s, load $(cut -d' ' -f1 /proc/loadavg)]"
    for a in $algos; do
        measure "$name" "$layout" "$rate" "$role" "$a" lat "$lat" "$n_lat" 10
        measure "$name" "$layout" "$rate" "$role" "$a" mid "$bw_mid" "$n_mid" 2
        [ "$a" = rd ] || measure "$name" "$layout" "$rate" "$role" "$a" big "$bw_big" "$n_big" 1
    done
    if [ "$role" = fit ] && [ -z "${FIT_MODEL:-}" ]; then fit_alpha || die "alpha_net fit failed"; fi
    # predictions: the fitted model scaled to this rate; the ping-pong-only and calibrate's raw
    # line fit likewise (compared in the summary)
    p=$(echo "$layout" | tr ',' '\n' | awk '{ s += $1 } END { print s }')
    h=$(echo "$layout" | tr ',' '\n' | wc -l)
    tag=$(echo "$name" | tr '@,+' '___')
    scaled_model "$model_out" "$rate" "$work/model_$rate.conf"
    scaled_model "$work/model_raw.conf" "$rate" "$work/model_raw_$rate.conf"
    scaled_model "$work/model_pingpong.conf" "$rate" "$work/model_pp_$rate.conf"
    "$BIN/ddp-simulate" --predict -m "$work/model_pp_$rate.conf" -p "$p" -H "$h" -s "$lat,$bw_mid,$bw_big" \
        -J "$work/predpp_$tag.json" > /dev/null || die "ddp-simulate failed"
    "$BIN/ddp-simulate" --predict -m "$work/model_$rate.conf" -p "$p" -H "$h" -s "$lat,$bw_mid,$bw_big" \
        -J "$work/pred_$tag.json" > /dev/null || die "ddp-simulate failed"
    "$BIN/ddp-simulate" --predict -m "$work/model_raw_$rate.conf" -p "$p" -H "$h" -s "$lat,$bw_mid,$bw_big" \
        -J "$work/predraw_$tag.json" > /dev/null || die "ddp-simulate failed"
done
# control: the token bucket. 3x1 at 2 Gbit/s (the largest bucket of the rates), rd and
# rabenseifner (their folding steps use links idle in between) at 256 KiB and 1 MiB, with the
# default bucket and with NETNS_BURST=65536.
if [ -z "${SETS:-}" ] || case " $SETS " in *" control "*) true ;; *) false ;; esac; then
    echo "# control: tbf bucket, 3x1@2gbit"
    scaled_model "$model_out" 2gbit "$work/model_ctl.conf"
    "$BIN/ddp-simulate" --predict -m "$work/model_ctl.conf" -p 3 -H 3 -s 256K,1M -J "$work/predctl_3x1_2gbit.json" > /dev/null ||
        die "ddp-simulate failed"
    : > "$work/burst_control.tsv"
    for a in rd rabenseifner; do
        for b in default small; do
            f=$work/control_${a}_$b.json port=$((port + 1))
            if [ $b = small ]; then bs=65536; else bs=""; fi
            NETNS_BURST=$bs "$netns" -L 1,1,1 -r 2gbit -p $port -s 256K,1M -n 20 -w 3 -a '--inplace 1 -c 0' -J "$f" \
                -- DDP_ALGO=$a > "$work/log_control_${a}_$b.txt" 2>&1 &&
                printf '3x1@2gbit\t1,1,1\t2gbit\t%s\t%s\t%s\n' $a $b "$f" >> "$work/burst_control.tsv"
        done
    done
fi
t_meas=$(($(date +%s) - t_start))
echo "# measured in $t_meas s; writing $out"

# ------------------------------------------------------------------ 3. the report
python3 - "$manifest" "$work" "$model_out" "$out" "$QUICK" "$t_meas" << 'EOF'
import json, os, re, sys
manifest, work, model, out, quick, t_meas = sys.argv[1:7]
def size(b):
    return '%d MiB' % (b >> 20) if b >= 1 << 20 else '%d KiB' % (b >> 10) if b >= 1024 else '%d B' % b
def ms(us):
    return '%.1f us' % us if us < 1000 else '%.2f ms' % (us / 1e3)
rows = []
for line in open(manifest):
    name, layout, rate, role, algo, kind, f, l0, l1 = line.rstrip('\n').split('\t')
    tag = re.sub('[@,+]', '_', name)
    pred = {(r['bytes'], r['algo']): r['us'] for r in json.load(open(os.path.join(work, 'pred_%s.json' % tag)))['rows']}
    praw = {(r['bytes'], r['algo']): r['us'] for r in json.load(open(os.path.join(work, 'predraw_%s.json' % tag)))['rows']}
    ppp = {(r['bytes'], r['algo']): r['us'] for r in json.load(open(os.path.join(work, 'predpp_%s.json' % tag)))['rows']}
    for r in json.load(open(f))['results']:
        if not r.get('inplace'): continue
        b = r['bytes']
        meas = r['p50_us'] if kind == 'lat' else r['time_us']
        pr = pred.get((b, algo))
        if pr is None: continue
        rows.append(dict(set=name, layout=layout, rate=rate, role=role, algo=algo, bytes=b, lat=kind == 'lat',
                         pred=pr, praw=praw.get((b, algo)), ppp=ppp.get((b, algo)), meas=meas, mean=r['time_us'], p50=r['p50_us'],
                         load='%s-%s' % (l0, l1)))
order = {a: i for i, a in enumerate(['ring', 'rd', 'rabenseifner', 'hier_ring', 'hier_rabenseifner'])}
sets = []
for r in rows:
    if r['set'] not in sets: sets.append(r['set'])
rows.sort(key=lambda r: (sets.index(r['set']), order[r['algo']], r['bytes']))
def err(r, k='pred'): return 100.0 * (r['meas'] / r[k] - 1)
def ok(r, k='pred'): return abs(err(r, k)) <= 25
def frac(sel, k='pred'):
    n = len(sel); w = sum(ok(r, k) for r in sel)
    return '%d / %d (%.0f%%)' % (w, n, 100.0 * w / n) if n else '-'
held = [r for r in rows if r['role'] == 'held']
fit = [r for r in rows if r['role'] == 'fit']
bw = [r for r in held if not r['lat']]; lat = [r for r in held if r['lat']]
keys = {}
for line in open(model):
    s = line.split('#')[0].strip()
    if '=' in s: k, v = s.split('='); keys[k.strip()] = float(v)
rawkeys = {}
for line in open(os.path.join(work, 'model_raw.conf')):
    s = line.split('#')[0].strip()
    if '=' in s: k, v = s.split('='); rawkeys[k.strip()] = float(v)
o = []
o.append('# Cost model validation: held-out predictions on emulated hosts\n')
o.append('Generated by `bench/validate_model.sh`%s: the model (ddp_model.h) is fitted on the FIT '
         'measurements only, then every held-out all-reduce is predicted with `build/ddp-simulate --predict` '
         'and measured with `build/ddp-bench` in `bench/netns_bench.sh` (network namespaces, each host\'s link '
         'shaped with tc tbf both ways). float32 sum, in place, `DDP_ALGO` forcing each algorithm. '
         'Measuring took %s s.\n' % (' (QUICK=1)' if quick == '1' else '', t_meas))
o.append('## Summary\n')
o.append('Within +-25% of measured (|measured / predicted - 1| <= 0.25):\n')
o.append('| points | fitted model | alpha_net from the ping-pong | ddp-calibrate\'s raw line fit |')
o.append('|---|---|---|---|')
o.append('| **held-out, all** | **%s** | %s | %s |' % (frac(held), frac(held, 'ppp'), frac(held, 'praw')))
o.append('| held-out, bandwidth-bound (256 KiB .. 64 MiB, mean time) | %s | %s | %s |' % (frac(bw), frac(bw, 'ppp'), frac(bw, 'praw')))
o.append('| held-out, latency-bound (8 B .. 16 KiB, p50 time) | %s | %s | %s |' % (frac(lat), frac(lat, 'ppp'), frac(lat, 'praw')))
for rate in sorted(set(r['rate'] for r in held)):
    sel = [r for r in held if r['rate'] == rate]
    o.append('| held-out at %s | %s | %s | %s |' % (rate, frac(sel), frac(sel, 'ppp'), frac(sel, 'praw')))
for a in sorted(order, key=order.get):
    sel = [r for r in held if r['algo'] == a]
    if sel: o.append('| held-out, %s | %s | %s | %s |' % (a, frac(sel), frac(sel, 'ppp'), frac(sel, 'praw')))
o.append('| in-sample (2x1 at 1 Gbit/s, the fit\'s layout and rate; its 8 B rows set alpha_net) | %s | %s | %s |\n' % (frac(fit), frac(fit, 'ppp'), frac(fit, 'praw')))
o.append('## Fitted parameters (`%s`)\n' % model)
o.append('| key | fitted | alpha_net from the ping-pong | ddp-calibrate\'s raw line fit | from |')
o.append('|---|---|---|---|---|')
src = {'alpha_local_us': 'shm ping-pong, 2 forked ranks (`ddp-calibrate --local-only`)',
       'beta_local_ns': 'the same', 'gamma_ns': '`ddp_reduce_local`, float sum over 64 MiB',
       'alpha_net_us': 'per-step p50 of 8 B ring, rd, rabenseifner all-reduces, 2x1 at 1 Gbit/s (the ping-pong: median one-way time of 8..512 B)',
       'beta_net_ns': 'tcp ping-pong, 2 namespaces at 1 Gbit/s (launcher mode): relative least-squares slope over 2..16 MiB',
       'nic_ns': '= beta_net_ns (one stream alone on the link)'}
ppkeys = {}
for line in open(os.path.join(work, 'model_pingpong.conf')):
    s = line.split('#')[0].strip()
    if '=' in s: k, v = s.split('='); ppkeys[k.strip()] = float(v)
for k in ('alpha_local_us', 'beta_local_ns', 'alpha_net_us', 'beta_net_ns', 'nic_ns', 'gamma_ns'):
    o.append('| %s | %.4g | %.4g | %.4g | %s |' % (k, keys.get(k, float('nan')), ppkeys.get(k, float('nan')),
                                                 rawkeys.get(k, float('nan')), src[k]))
o.append('\nOther rates: beta_net_ns and nic_ns x (1 Gbit/s / rate); nothing is measured at those rates to set '
         'them. Raw ping-pong tables: the work directory printed by the script (calibrate_net.txt).\n')
# where it misses
def steps(algo, layout):
    L = [int(x) for x in layout.split(',')]; p, H, lm = sum(L), len(L), max(L)
    p2 = 1 << (p.bit_length() - 1); h2 = 1 << (H.bit_length() - 1)
    k, kh = p2.bit_length() - 1, h2.bit_length() - 1
    return {'ring': 2 * (p - 1), 'rd': k + 2 * (p2 < p), 'rabenseifner': 2 * k + 2 * (p2 < p),
            'hier_ring': 2 * (lm - 1) + 2 * (H - 1), 'hier_rabenseifner': 2 * (lm - 1) + 2 * kh + 2 * (h2 < H)}[algo]
o.append('## Where the model misses\n')
bad_bw = [r for r in bw if not ok(r)]
o.append('- Bandwidth-bound misses: %d of %d, %d of them measured faster than predicted; sizes %s; algorithms %s; '
         'layouts %s.' % (len(bad_bw), len(bw), sum(r['meas'] < r['pred'] for r in bad_bw),
                          ', '.join(sorted(set(size(r['bytes']) for r in bad_bw), key=lambda x: (x.split()[1] != 'KiB', float(x.split()[0])))) or '-',
                          ', '.join(sorted(set(r['algo'] for r in bad_bw))) or '-',
                          ', '.join(sorted(set(r['set'].split('@')[0] for r in bad_bw))) or '-'))
for b in sorted(set(r['bytes'] for r in lat)):
    sel = [r for r in lat if r['bytes'] == b]; bad = [r for r in sel if not ok(r)]
    o.append('- Latency-bound, %s: %d of %d missed, %d slower than predicted, %d faster.' % (
        size(b), len(bad), len(sel), sum(r['meas'] > r['pred'] for r in bad), sum(r['meas'] < r['pred'] for r in bad)))
excess = {}
for q in lat:
    if q['bytes'] == 8:
        excess.setdefault(sum(int(x) for x in q['layout'].split(',')), []).append((q['meas'] - q['pred']) / steps(q['algo'], q['layout']))
o.append('- 8 B time above the prediction per step (messages in a row: ring 2(p-1), rd log2 p\' (+2 folding), '
         'rabenseifner 2 log2 p\' (+2), hier_* 2(L-1) + their part across hosts), median over the held-out 8 B points, '
         'by ranks on this %s-core machine: %s.' % (os.cpu_count(), ', '.join(
             'p = %d: %+.1f us' % (pp, sorted(v)[len(v) // 2]) for pp, v in sorted(excess.items())) or '-'))
ctl = os.path.join(work, 'burst_control.tsv')
if os.path.exists(ctl) and os.path.getsize(ctl):
    o.append('\n### Control: the token bucket\n')
    o.append('tbf\'s bucket (NETNS_BURST; netns_lib.sh sets 1 ms of the rate, at least 128 KiB) lets a link that was idle '
             'send that much at the veth\'s speed. A real NIC has no such bucket and the model has no term for it. '
             'The same all-reduces with the default bucket and with a 64 KiB one:\n')
    o.append('| configuration | rate | algorithm | size | predicted | default bucket | error | 64 KiB bucket | error |')
    o.append('|---|---|---|---|---|---|---|---|---|')
    got = {}
    for line in open(ctl):
        name, layout, rate, algo, burst, f = line.rstrip('\n').split('\t')
        tag = re.sub('[@,+]', '_', name)
        pred = {(r['bytes'], r['algo']): r['us'] for r in json.load(open(os.path.join(work, 'predctl_%s.json' % tag)))['rows']}
        for r in json.load(open(f))['results']:
            if r.get('inplace'): got.setdefault((name, rate, algo, r['bytes']), {})[burst] = (r['time_us'], pred[(r['bytes'], algo)])
    for (name, rate, algo, b), v in sorted(got.items(), key=lambda kv: (kv[0][2], kv[0][3])):
        if 'default' not in v or 'small' not in v: continue
        pr = v['default'][1]
        o.append('| %s | %s | %s | %s | %s | %s | %+.0f%% | %s | %+.0f%% |' % (name.split('@')[0], rate, algo, size(b), ms(pr),
                 ms(v['default'][0]), 100 * (v['default'][0] / pr - 1), ms(v['small'][0]), 100 * (v['small'][0] / pr - 1)))
    o.append('')
o.append('Why, in short: bandwidth-bound rows move at the shaped rate, which beta_net (one stream alone) and nic_ns '
         '(streams per host share the link) capture; rows that miss are faster than predicted where a folding step '
         '(non-power-of-two worlds) uses a link idle long enough to fill tbf\'s bucket (see the control). Latency-bound '
         'rows: the tcp ping-pong\'s alpha is a message alone; an all-reduce step sends and receives at once, and with '
         'more than 2 ranks on these 2 cores every step waits for a rank to be scheduled (the model has no term for '
         'more ranks than cores, nor for a per-step software cost; alpha_local from 2 ranks is under a microsecond). '
         'At 1 KiB .. 16 KiB the bucket again makes the link look faster. No link delay is emulated (no netem), so '
         'alpha_net is this machine\'s TCP software cost only: predictions for a real network\'s latency stay model '
         'output, untested here.\n')
o.append('## Every point\n')
o.append('measured = mean time per call (ddp-bench time_us) for 256 KiB and up, p50 for 8 B .. 16 KiB; '
         'error = measured / predicted - 1. "raw" = the prediction of ddp-calibrate\'s own line fit. '
         'load = the 1-minute load average before-after the run (2 cores).\n')
o.append('| configuration | rate | algorithm | size | predicted | measured | error | within 25%? | mean | p50 | raw pred. | raw error | load |')
o.append('|---|---|---|---|---|---|---|---|---|---|---|---|---|')
for r in rows:
    o.append('| %s%s | %s | %s | %s | %s | %s | %+.0f%% | %s | %s | %s | %s | %+.0f%% | %s |' % (
        r['set'].split('@')[0], ' (fit)' if r['role'] == 'fit' else '', r['rate'], r['algo'], size(r['bytes']),
        ms(r['pred']), ms(r['meas']), err(r), 'yes' if ok(r) else '**no**', ms(r['mean']), ms(r['p50']),
        ms(r['praw']), err(r, 'praw'), r['load']))
open(out, 'w').write('\n'.join(o) + '\n')
print('held-out within 25%%: %s (bandwidth-bound %s, latency-bound %s); in-sample %s' % (frac(held), frac(bw), frac(lat), frac(fit)))
EOF
