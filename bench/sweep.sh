#!/usr/bin/env bash
# SPDX-License-Identifier: MIT (see LICENSE)
# bench/sweep.sh — what `make bench` runs: ddp-bench over 8 B .. 64 MiB for p = 2 and 4, the four
# ring collectives (COLLS="reduce gather scatter" or, out of place, COLLS="all_to_all sendrecv"
# PLACEMENT=out for the others), every transport compiled in; one JSON per run and SVG charts.
#
#   make bench                        (builds build/ddp-bench and build/svg_chart, then this)
#   COLLS=all_reduce NP=4 bench/sweep.sh      (a subset; every knob below)
#
# Writes, under OUT (default bench/results):
#   <collective>_<transport>_p<N>.json   ddp-bench -J (schema: bench/README.md)
#   <collective>_<transport>_p<N>.txt    its nccl-tests-style table
#   busbw.svg                            all_reduce busbw by size, a line per transport and p
#   busbw_<collective>.svg               the same for each collective
# A run whose check fails (#wrong > 0) still writes its JSON and is drawn ("wrong results!" in
# the legend); the script goes on with the others and exits 1 at the end.
#
# Environment (defaults):
#   COLLS="all_reduce reduce_scatter all_gather broadcast"  NP="2 4"
#   TRANSPORTS=<ddp-bench --list-transports>   MINBYTES=8 MAXBYTES=64M FACTOR=2
#   ITERS=1000 WARMUP=2 TARGET_S=0.1 DTYPE=float OP=sum PLACEMENT=in (chart: in|out|both)
#   BENCH=build/ddp-bench CHART=build/svg_chart OUT=bench/results
# Timing: with these defaults each size costs about TARGET_S per placement, or 10 calls when a
# call takes longer (--target-seconds never goes below 10); the whole sweep is 2-4 minutes on a 2-core machine
# for two transports. Needs bash and coreutils only (no python, no gnuplot).
set -u
cd "$(dirname "$0")/.." || exit 2
COLLS=${COLLS:-all_reduce reduce_scatter all_gather broadcast}
NP=${NP:-2 4}
MINBYTES=${MINBYTES:-8}
MAXBYTES=${MAXBYTES:-64M}
FACTOR=${FACTOR:-2}
ITERS=${ITERS:-1000}
WARMUP=${WARMUP:-2}
TARGET_S=${TARGET_S:-0.1}
DTYPE=${DTYPE:-float}
OP=${OP:-sum}
PLACEMENT=${PLACEMENT:-in}
BENCH=${BENCH:-build/ddp-bench}
CHART=${CHART:-build/svg_chart}
OUT=${OUT:-bench/results}

for tool in "$BENCH" "$CHART"; do
    [ -x "$tool" ] || { echo "sweep.sh: $tool is missing: run 'make bench' (or make $tool)" >&2; exit 2; }
done
TRANSPORTS=${TRANSPORTS:-$("$BENCH" --list-transports)}
# nccl (device buffers) only where a GPU is: elsewhere it would only measure its refusal
if ! nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then TRANSPORTS=$(echo "$TRANSPORTS" | grep -vx nccl); fi
[ -n "$TRANSPORTS" ] || { echo "sweep.sh: no transport compiled into $BENCH" >&2; exit 2; }
mkdir -p "$OUT"

failed=""
t_start=$(date +%s)
echo "== ddp-bench sweep: collectives [$COLLS], transports [${TRANSPORTS//$'\n'/ }], p [$NP]," \
     "$MINBYTES..$MAXBYTES x$FACTOR, $DTYPE $OP, $(nproc) cores"
for coll in $COLLS; do
    for tr in $TRANSPORTS; do
        for p in $NP; do
            name="${coll}_${tr}_p${p}"
            echo "== $name"
            t0=$(date +%s)
            # --target-seconds: big sizes get 10 timed calls, small ones about TARGET_S of them
            # (at most ITERS)
            "$BENCH" -N "$p" --transport "$tr" --coll "$coll" -d "$DTYPE" --op "$OP" -b "$MINBYTES" \
                -e "$MAXBYTES" -f "$FACTOR" -n "$ITERS" -w "$WARMUP" --target-seconds "$TARGET_S" -c 1 -L "make bench" \
                -J "$OUT/$name.json" > "$OUT/$name.txt"
            rc=$?
            # the table's busbw column and footer, so the log shows progress
            grep -E '^# (Out of bounds|Avg bus bandwidth  )' "$OUT/$name.txt" | sed 's/^/   /'
            echo "   ($(( $(date +%s) - t0 )) s, exit $rc)"
            [ "$rc" = 0 ] || failed="$failed $name"
        done
    done
done

# Charts: every collective that has results, one line per transport and world size.
chart_rc=0
for coll in $COLLS; do
    files=()
    for tr in $TRANSPORTS; do
        for p in $NP; do
            [ -s "$OUT/${coll}_${tr}_p${p}.json" ] && files+=("$OUT/${coll}_${tr}_p${p}.json")
        done
    done
    [ ${#files[@]} -gt 0 ] || continue
    "$CHART" -P "$PLACEMENT" -o "$OUT/busbw_$coll.svg" "${files[@]}" || chart_rc=1
    [ "$coll" = all_reduce ] && { cp "$OUT/busbw_$coll.svg" "$OUT/busbw.svg" || chart_rc=1; }
done
echo "== $(( $(date +%s) - t_start )) s; results in $OUT/ (charts: $(cd "$OUT" && ls -- *.svg 2>/dev/null | tr '\n' ' '))"
if [ -n "$failed" ]; then
    echo "== FAILED (a call failed or #wrong > 0; see the .txt files):$failed" >&2
    exit 1
fi
exit $chart_rc
