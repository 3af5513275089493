#!/usr/bin/env bash
# SPDX-License-Identifier: MIT (see LICENSE)
# bench/knobs.sh — libddp's run-time knobs, one at a time from the defaults, at p = 2 and 4.
#
#   bench/knobs.sh [knobs.json]          (default bench/knobs.json)
#
# Settings (each alone; every other knob at its default):
#   DDP_SEGMENT_BYTES  128K 512K(default) 2M   pipeline segment of the ring
#   DDP_SPIN_US        0 20 50(default) 200    poll this long before sleeping in poll(2)
#   DDP_SOCKET_BUFSIZE 0(default) 4M           0 = Linux autotuning; else SO_SNDBUF/SO_RCVBUF
#   DDP_ALGO           auto(default) ring      ring for every size (no recursive doubling)
# Runs are interleaved over the settings, REPEATS rounds (drifting background load hits every
# setting alike). The table gives, per size, the median busbw in GB/s (for 8 B: the time in us)
# over the undisturbed rounds, and marks with * the best value of each knob per size.
# Environment: REPEATS=3 SIZES=8,64K,1M,16M,64M ITERS=1000 WARMUP=10 TARGET_S=0.3 NP="2 4"
#   SUMMARY_ONLY=1 (re-make the table from build/knobs_raw; LIBDDP_VERSION names what was run)
#   WAIT_IDLE=120 CLEAN_CORES=0.25 SETTINGS="default VAR=value ..." (overrides the list; join
#   several knobs of one setting with commas: DDP_SEGMENT_BYTES=128K,DDP_SPIN_US=200)
set -eu
cd "$(dirname "$0")/.."
OUT=${1:-bench/knobs.json}
REPEATS=${REPEATS:-3}
SIZES=${SIZES:-8,64K,1M,16M,64M}
ITERS=${ITERS:-1000}
WARMUP=${WARMUP:-10}
TARGET_S=${TARGET_S:-0.3}
NP=${NP:-2 4}
CC=${CC:-cc}
WAIT_IDLE=${WAIT_IDLE:-120}
SETTINGS=${SETTINGS:-"default DDP_SEGMENT_BYTES=128K DDP_SEGMENT_BYTES=2M DDP_SPIN_US=0 DDP_SPIN_US=20 DDP_SPIN_US=200 DDP_SOCKET_BUFSIZE=4M DDP_ALGO=ring"}
. bench/bench_lib.sh

mkdir -p build
RAW=build/knobs_raw
if [ "${SUMMARY_ONLY:-0}" != 1 ]; then rm -rf "$RAW"; mkdir -p "$RAW"; fi
if [ -z "${LIBDDP_VERSION:-}" ]; then
    LIBDDP_VERSION="$(git log -1 --format='%h %s' 2>/dev/null || echo unknown)"
    if ! git diff --quiet HEAD -- 'ddp*.h' transports 2>/dev/null; then
        LIBDDP_VERSION="$LIBDDP_VERSION (+ uncommitted changes)"
    fi
fi
echo "== libddp: $LIBDDP_VERSION"
if [ "${SUMMARY_ONLY:-0}" != 1 ]; then
set -x
$CC -std=c99 -O2 -Wall -Wextra -Wpedantic -Werror -I. -pthread bench/ddp_bench.c \
    -o build/ddp-bench -lm
set +x
unset DDP_SEGMENT_BYTES DDP_SPIN_US DDP_SOCKET_BUFSIZE
wait_idle "$WAIT_IDLE" || true
echo "== loadavg before: $(cut -d' ' -f1-3 /proc/loadavg)"
QUIET=1
r=1
while [ "$r" -le "$REPEATS" ]; do
    for s in $SETTINGS; do
        for p in $NP; do
            envset=()
            [ "$s" != default ] && IFS=, read -r -a envset <<< "$s"
            name=${s//=/_}
            name=${name//,/+}
            run "${name}_p${p}_r$r" env "${envset[@]}" ./build/ddp-bench -N "$p" --inplace 1 --transport "${TRANSPORT:-tcp}" \
                -s "$SIZES" -n "$ITERS" -w "$WARMUP" --target-seconds "$TARGET_S" -L "$s" -J "$RAW/${name}_p${p}_r$r.json"
        done
    done
    r=$((r + 1))
done
echo "== loadavg after: $(cut -d' ' -f1-3 /proc/loadavg)"
if [ -n "$FAILED" ]; then echo "== failed runs:$FAILED"; fi
fi   # SUMMARY_ONLY

export RAW OUT NP SETTINGS REPEATS LIBDDP_VERSION
python3 - <<'EOF'
import glob, json, os, re, statistics
raw, out = os.environ["RAW"], os.environ["OUT"]
settings = os.environ["SETTINGS"].split()
nps = [int(x) for x in os.environ["NP"].split()]
clean_cores = float(os.environ.get("CLEAN_CORES", "0.25"))
clean, every, loads = {}, {}, {}
for path in glob.glob(raw + "/*.json"):
    d = json.load(open(path))
    name = os.path.basename(path)[:-5]
    m = re.match(r"(.*)_p(\d+)_r\d+$", name)
    other = float(open(os.path.join(raw, name + ".load")).read().split()[2])
    loads[name] = other
    for r in d["results"]:
        k = (m.group(1), int(m.group(2)), r["bytes"])
        every.setdefault(k, []).append(r)
        if other <= clean_cores:
            clean.setdefault(k, []).append(r)
sizes = sorted({k[2] for k in every})
key = lambda s: s.replace("=", "_").replace(",", "+")
knob = lambda s: None if s == "default" else "combination" if "," in s else s.split("=")[0]
def human(b):
    for suf, n in (("M", 1 << 20), ("K", 1 << 10)):
        if b >= n and b % n == 0: return "%d%s" % (b // n, suf)
    return "%dB" % b
def rows(s, p, b):
    k = (key(s), p, b)
    return (clean[k], False) if k in clean else (every.get(k), True)
def value(s, p, b):
    rs, dist = rows(s, p, b)
    if not rs: return None, dist
    return statistics.median(r["time_us"] if b <= 8 else r["busbw_GBs"] for r in rs), dist
lines, table = [], {}
knobs = sorted({knob(s) for s in settings if knob(s)})
for p in nps:
    lines.append("p=%d: busbw in GB/s (8 B: time in us), median of the undisturbed rounds of %s "
                 "('!': all disturbed); * = best value of that knob at that size"
                 % (p, os.environ["REPEATS"]))
    lines.append("%-24s" % "setting" + "".join("%11s" % human(b) for b in sizes))
    best = {}
    for b in sizes:
        for kn in knobs:
            sc = []
            for s in settings:
                if knob(s) in (kn, None):
                    rs, _ = rows(s, p, b)
                    if rs: sc.append((statistics.median(r["time_us"] for r in rs), s))
            if sc: best[(kn, b)] = min(sc)[1]
    for s in settings:
        cells = ""
        for b in sizes:
            v, dist = value(s, p, b)
            if v is None: cells += "%11s" % "-"; continue
            table["%s p=%d %d" % (s, p, b)] = v
            mine = [knob(s)] if knob(s) else knobs
            star = "*" if any(best.get((kn, b)) == s for kn in mine) else " "
            cells += ("%9.2f" if b <= 8 else "%9.3f") % v + ("!" if dist else " ") + star
        lines.append("%-24s" % s + cells)
    lines.append("")
lines.append("libddp: " + os.environ["LIBDDP_VERSION"])
lines.append("other load per run (cores; > %.2f = disturbed): " % clean_cores +
             " ".join("%s=%.2f" % kv for kv in sorted(loads.items())))
text = "\n".join(lines)
print(text)
json.dump({"libddp": os.environ["LIBDDP_VERSION"], "settings": settings, "nranks": nps, "sizes": sizes, "median": table, "text": text,
           "other_load": loads,
           "raw": {"%s p=%d %d" % k: v for k, v in every.items()}}, open(out, "w"), indent=1)
print("wrote " + out)
EOF
