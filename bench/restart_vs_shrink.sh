#!/usr/bin/env bash
# SPDX-License-Identifier: MIT (see LICENSE)
# bench/restart_vs_shrink.sh [RUNS] — what one lost rank costs the MLP demo
# (examples/train_mlp_elastic.c, 4 ranks, tcp) four ways, RUNS times each, a rank killed at
# step KILL_STEP (default 200; the rank varies, 0 included):
#   shrink          build/ddprun -n 4 --elastic 3: the survivors shrink and go on, no restart
#   grow            build/ddprun -n 4 --elastic 3 --max-restarts 1: the same, then ddprun's
#                   replacement joins and the members grow back to 4 (the state from them)
#   ddprun restart  build/ddprun -n 4 --max-restarts 1, DDP_DEMO_NO_SHRINK=1: every rank is
#                   stopped and the job starts again (a plain trainer, torchrun's answer)
#   torchrun        /usr/bin/python3 -m torch.distributed.run --nproc_per_node 4 --max_restarts 1
#                   --monitor_interval MONITOR (default 0.1 s; torchrun's own default is 5 s),
#                   DDP_DEMO_NO_SHRINK=1 (--redirects 1 --tee 1: Debian's torch 1.13 on Python
#                   3.11 crashes in its log handling without them); skipped where torch is missing
# and prints per way the pause: from the kill (the demo's kill file) to the first completed step
# afterwards (shrink, grow: on the shrunk communicator; restart: of the new attempt,
# DDP_DEMO_STEP_LOG), median and max; for grow also the kill to the first step at full size
# (4 ranks again) and the replacement's start to it. A restart also redoes the steps since its last checkpoint (the demo keeps none:
# all KILL_STEP of them; the step time is printed, to price a checkpoint interval).
set -u
runs=${1:-5}
kill_step=${KILL_STEP:-200}
monitor=${MONITOR:-0.1}
D=build/ddprun
M=build/train_mlp_elastic
[ -x "$D" ] && [ -x "$M" ] || { echo "restart_vs_shrink: make build/ddprun build/train_mlp_elastic first" >&2; exit 2; }
tmp=$(mktemp -d "${TMPDIR:-/tmp}/restart_vs_shrink.XXXXXX") || exit 2
trap 'rm -rf "$tmp"' EXIT
export DDP_TRANSPORT=tcp

# ms between the kill and the first step of attempt 1 (restart ways); empty if either is missing
pause_restart() {
    awk -v k="$(cat "$1/kill" 2>/dev/null)" '$1 == "first_step" && $2 == 1 && k != "" { printf "%.1f\n", ($3 - k) * 1000 }' "$1/steps"
}

: > "$tmp/times"
# The step time: a run without a kill, its training time over its steps (512).
DDP_DEMO_STEP_LOG="$tmp/clean.steps" "$D" -n 4 "$M" > "$tmp/clean.out" 2>&1 & pid=$!
s0=$(date +%s.%N); wait $pid; s1=$(date +%s.%N)
echo "clean run (no kill): $(awk -v a="$s0" -v b="$s1" 'BEGIN { printf "%.2f s", b - a }') for 512 steps, init included"

i=1
while [ "$i" -le "$runs" ]; do
    r=$(( (i - 1) % 4 ))
    for way in shrink grow ddprun torchrun; do
        d="$tmp/$way.$i"; mkdir -p "$d"
        export DDP_DEMO_KILL=$r:$kill_step DDP_DEMO_KILL_FILE="$d/kill" DDP_DEMO_STEP_LOG="$d/steps"
        case $way in
        shrink)
            timeout -k 5 120 "$D" -n 4 --elastic 3 "$M" > "$d/out" 2>&1
            ms=$(sed -n 's/.*RESULT .*first_step_ms=\([0-9.]*\).*/\1/p' "$d/out") ;;
        grow)
            timeout -k 5 120 "$D" -n 4 --elastic 3 --max-restarts 1 "$M" > "$d/out" 2>&1
            ms=$(sed -n 's/.*RESULT .*first_step_ms=\([0-9.]*\).*/\1/p' "$d/out")
            full=$(sed -n 's/.*first step at full size \([0-9.]*\);.*/\1/p' "$d/out")
            jf=$(sed -n 's/.*RESULT .*join_to_full_ms=\([0-9.]*\).*/\1/p' "$d/out")
            [ -n "$full" ] && echo "grow_full $full" >> "$tmp/times"
            [ -n "$jf" ] && echo "grow_join $jf" >> "$tmp/times" ;;
        ddprun)
            DDP_DEMO_NO_SHRINK=1 timeout -k 5 120 "$D" -n 4 --max-restarts 1 "$M" > "$d/out" 2>&1
            ms=$(pause_restart "$d") ;;
        torchrun)
            /usr/bin/python3 -c 'import torch' 2>/dev/null || continue
            DDP_DEMO_NO_SHRINK=1 timeout -k 5 120 /usr/bin/python3 -m torch.distributed.run --nproc_per_node 4 \
                --master_port $((20000 + (i * 37 + $$) % 20000)) --max_restarts 1 --monitor_interval "$monitor" \
                --redirects 1 --tee 1 --no_python "$M" > "$d/out" 2>&1
            ms=$(pause_restart "$d") ;;
        esac
        if [ -n "$ms" ]; then echo "$way $ms" >> "$tmp/times"; echo "run $i $way: kill=$r:$kill_step pause ${ms} ms"
        else echo "run $i $way: kill=$r:$kill_step no measurement (output: $(tail -n 3 "$d/out" | tr '\n' ' ' | cut -c1-300))"; fi
    done
    i=$((i + 1))
done
unset DDP_DEMO_KILL DDP_DEMO_KILL_FILE DDP_DEMO_STEP_LOG
for way in shrink grow grow_full grow_join ddprun torchrun; do
    awk -v w="$way" '$1 == w { print $2 }' "$tmp/times" | sort -n |
        awk -v w="$way" '{ v[NR] = $1 } END { if (NR == 0) { print w ": no measurement"; exit }
                         m = NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2
                         what = w == "grow_full" ? "kill -> first step at full size" : w == "grow_join" ? \
                                "replacement start -> first step at full size" : "kill -> first step after it"
                         printf "%-9s %s: median %.1f ms, max %.1f ms (%d runs)\n", w, what, m, v[NR], NR }'
done
