#!/bin/sh
# SPDX-License-Identifier: MIT (see LICENSE)
# bench/powersgd_bench.sh — PowerSGD (ddp_powersgd.h) against uncompressed training on two
# models: the MLP demo (examples/train_mlp.c, DDP_POWERSGD_RANK) and a wide MLP with 1024 x 1024
# matrices (examples/train_wide.c, -r). Three parts, each writing CSV into the output directory
# and a summary table to stdout:
#   curves   loss curves, uncompressed and PowerSGD rank 1, 2, 4, same steps and seed, p = 2 and
#            4 on this host (build/ddprun): curves_mlp.csv (per epoch), curves_wide.csv (per
#            step), final losses in curves_summary.csv
#   wire     bytes on the wire per step, MEASURED, and step time on emulated hosts with a
#            1 Gbit/s link each (bench/netns_bench.sh -H 2 and 4, one rank per host, -r 1gbit):
#            wide.csv from train_wide's interface counters (eth0 of each host namespace, over
#            the timed steps), mlp.csv from the tbf counters of every host's link over the whole
#            demo run (setup included). Needs root. Each configuration runs REPS times, the
#            configurations interleaved; busy_cores says how loaded the machine was meanwhile.
#   all      both (default)
#
#   bench/powersgd_bench.sh [-o DIR] [-n STEPS] [-t STEPS] [-R REPS] [-H "2 4"] [-r "0 1 2 4"] [PART]
#     -o results directory [bench/results/powersgd]   -n train_wide steps for the curves [300]
#     -t train_wide steps for the timed runs [120; the first start + 5 untimed]
#     -R repetitions of each timed run [3]
#     -H host counts (= world sizes) ["2 4"]            -r ranks to compare, 0 = uncompressed ["0 1 2 4"]
#     -s PowerSGD start step [10] (both models)
# Builds build/train_mlp, build/train_wide and build/ddprun through make (MLP=, WIDE= override
# the binaries). Run from the repository root.
set -u

out=bench/results/powersgd steps=300 tsteps=120 reps=3 hosts="2 4" ranks="0 1 2 4" start=10
while getopts o:n:t:R:H:r:s:h opt; do
    case $opt in
        o) out=$OPTARG ;; n) steps=$OPTARG ;; t) tsteps=$OPTARG ;; R) reps=$OPTARG ;;
        H) hosts=$OPTARG ;; r) ranks=$OPTARG ;; s) start=$OPTARG ;;
        *) sed -n '2,/^[^#]/s/^# \{0,1\}//p' "$0" >&2; exit 2 ;;
    esac
done
shift $((OPTIND - 1))
part=${1:-all}
case $part in curves|wire|all) ;; *) echo "powersgd_bench: unknown part '$part'" >&2; exit 2 ;; esac

MLP=${MLP:-build/train_mlp} WIDE=${WIDE:-build/train_wide} D=build/ddprun
make -s build/ddprun build/train_mlp build/train_wide || exit 1
mkdir -p "$out" || exit 1
tmp=$(mktemp -d "${TMPDIR:-/tmp}/powersgd_bench.XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT
unset DDP_POWERSGD_RANK DDP_POWERSGD_START DDP_DEMO_SKIP_ALLREDUCE
T="timeout -k 5 600"

# field NAME FILE: NAME=value from train_wide's RESULT line
field() { sed -n "s/.*RESULT.* $1=\([^ ]*\).*/\1/p" "$2" | head -1; }

curves() {
    echo "model,p,rank,epoch,loss" > "$out/curves_mlp.csv"
    echo "model,p,rank,step,loss" > "$out/curves_wide.csv"
    echo "model,p,rank,final_loss,eval_loss,accuracy" > "$out/curves_summary.csv"
    for p in $hosts; do
        for r in $ranks; do
            # the MLP demo: 8 epochs, loss per epoch (mean over all ranks' samples)
            $T env DDP_POWERSGD_RANK="$r" DDP_POWERSGD_START="$start" "$D" -n "$p" "$MLP" > "$tmp/m.out" 2>&1 ||
                { echo "powersgd_bench: train_mlp p=$p rank=$r failed:" >&2; tail -5 "$tmp/m.out" >&2; return 1; }
            sed -n "s/^\[rank 0\] epoch \([0-9]*\)\/[0-9]*  *loss \([0-9.]*\).*/mlp,$p,$r,\1,\2/p" "$tmp/m.out" >> "$out/curves_mlp.csv"
            loss=$(sed -n 's/^\[rank 0\] epoch 8\/8  *loss \([0-9.]*\).*/\1/p' "$tmp/m.out")
            acc=$(sed -n 's/^\[rank 0\] epoch 8\/8 .*accuracy *\([0-9.]*\)%.*/\1/p' "$tmp/m.out")
            echo "mlp,$p,$r,$loss,,$acc" >> "$out/curves_summary.csv"
            # the wide MLP: per-step loss
            $T "$D" -n "$p" "$WIDE" -n "$steps" -r "$r" -s "$start" -c "$tmp/w.csv" > "$tmp/w.out" 2>&1 ||
                { echo "powersgd_bench: train_wide p=$p rank=$r failed:" >&2; tail -5 "$tmp/w.out" >&2; return 1; }
            sed 1d "$tmp/w.csv" | sed "s/^/wide,$p,$r,/" >> "$out/curves_wide.csv"
            echo "wide,$p,$r,$(field final_loss "$tmp/w.out"),$(field eval_loss "$tmp/w.out"),$(field eval_acc "$tmp/w.out")" >> "$out/curves_summary.csv"
        done
    done
    echo "# final losses (mlp: epoch 8's loss and accuracy %; wide: mean training loss of the last 10% of $steps steps, held-out loss and accuracy)"
    column -t -s, "$out/curves_summary.csv" 2>/dev/null || cat "$out/curves_summary.csv"
}

wire() {
    [ "$(id -u)" = 0 ] || { echo "powersgd_bench: wire needs root (network namespaces)" >&2; return 1; }
    echo "model,hosts,rank,rep,step_ms_mean,step_ms_median,finish_ms_mean,tx_bytes_per_step,rx_bytes_per_step,elems_sent_per_step,elems_full_per_step,final_loss,busy_cores" > "$out/wide.csv"
    echo "model,hosts,rank,rep,steps,train_s,step_ms,wire_bytes_per_step_per_host,busy_cores" > "$out/mlp.csv"
    for h in $hosts; do
        for rep in $(seq 1 "$reps"); do
            for r in $ranks; do   # the configurations interleaved: a slow phase of the machine hits all
                j0=$(busy_jiffies) s0=$(date +%s.%N)
                bench/netns_bench.sh -H "$h" -R 1 -r 1gbit -T 300 -q -- "$WIDE" -n "$tsteps" -W $((start + 5)) -r "$r" -s "$start" > "$tmp/w.out" 2>&1 ||
                    { echo "powersgd_bench: netns train_wide H=$h rank=$r failed:" >&2; tail -5 "$tmp/w.out" >&2; return 1; }
                busy=$(busy_since "$j0" "$s0")
                echo "wide,$h,$r,$rep,$(field step_ms_mean "$tmp/w.out"),$(field step_ms_median "$tmp/w.out"),$(field finish_ms_mean "$tmp/w.out"),$(field tx_bytes_per_step "$tmp/w.out"),$(field rx_bytes_per_step "$tmp/w.out"),$(field elems_sent_per_step "$tmp/w.out"),$(field elems_full_per_step "$tmp/w.out"),$(field final_loss "$tmp/w.out"),$busy" >> "$out/wide.csv"
                # the demo: 8 epochs of ceil(ceil(8192 / h) / 32) steps; bytes from tbf (whole run)
                j0=$(busy_jiffies) s0=$(date +%s.%N)
                bench/netns_bench.sh -H "$h" -R 1 -r 1gbit -T 300 -- DDP_POWERSGD_RANK="$r" DDP_POWERSGD_START="$start" "$MLP" > "$tmp/m.out" 2>&1 ||
                    { echo "powersgd_bench: netns train_mlp H=$h rank=$r failed:" >&2; tail -5 "$tmp/m.out" >&2; return 1; }
                nsteps=$(( 8 * ( ( (8192 + h - 1) / h + 31) / 32 ) ))
                train_s=$(sed -n 's/^train_mlp: trained in \([0-9.]*\) s.*/\1/p' "$tmp/m.out")
                bytes=$(awk -v h="$h" -v n="$nsteps" '/^# tbf: host [0-9]+ -> switch:/ { s += $7 } END { printf "%.0f", s / h / n }' "$tmp/m.out")
                echo "mlp,$h,$r,$rep,$nsteps,$train_s,$(awk -v t="$train_s" -v n="$nsteps" 'BEGIN { printf "%.3f", 1e3 * t / n }'),$bytes,$(busy_since "$j0" "$s0")" >> "$out/mlp.csv"
            done
        done
    done
    echo "# wide MLP on 1 Gbit/s links (median over $reps runs of each run's median step time; bytes: each host's eth0, per step)"
    summarise "$out/wide.csv" 6 8
    echo "# MLP demo on 1 Gbit/s links (median over $reps runs; bytes: tbf counters, whole run / steps, per host)"
    summarise "$out/mlp.csv" 7 8
}

# busy_jiffies: every CPU's busy time since boot (user nice system irq softirq), in jiffies;
# busy_since J0 T0: the cores busy on average since then (this run's ranks and everything else
# on the shared machine: a run with more than its own share was disturbed).
busy_jiffies() { awk '/^cpu / { print $2 + $3 + $4 + $7 + $8; exit }' /proc/stat; }
busy_since() {
    awk -v j0="$1" -v t0="$2" -v j1="$(busy_jiffies)" -v t1="$(date +%s.%N)" -v hz="$(getconf CLK_TCK)" \
        'BEGIN { printf "%.2f", (j1 - j0) / hz / (t1 - t0) }'
}

# summarise CSV TIMECOL BYTESCOL: per (hosts, rank) the median, min and max of TIMECOL over the
# repetitions, the median of BYTESCOL, and the speed-up and traffic ratio against rank 0.
summarise() {
    awk -F, -v tc="$2" -v bc="$3" 'NR > 1 { k = $2 "," $3; t[k] = t[k] " " $tc; b[k] = b[k] " " $bc; if (!(k in seen)) { seen[k] = 1; order[++n] = k } }
        function med(s,   a, m, i, j, x) { m = split(s, a, " "); for (i = 2; i <= m; i++) { x = a[i]; for (j = i - 1; j >= 1 && a[j] + 0 > x + 0; j--) a[j + 1] = a[j]; a[j + 1] = x }
                                         lo = a[1]; hi = a[m]; return m % 2 ? a[(m + 1) / 2] : (a[m / 2] + a[m / 2 + 1]) / 2 }
        END { printf "%-6s %-5s %10s %18s %14s %8s %10s\n", "hosts", "rank", "step_ms", "(min..max)", "bytes/step", "speedup", "traffic"
              for (i = 1; i <= n; i++) { split(order[i], kk, ","); mt = med(t[order[i]]); l = lo; hh = hi; mb = med(b[order[i]])
                  if (kk[2] == 0) { bt[kk[1]] = mt; bb[kk[1]] = mb }
                  printf "%-6s %-5s %10.2f %18s %14.0f %7.2fx %9.1fx\n", kk[1], kk[2], mt, "(" l ".." hh ")", mb,
                         bt[kk[1]] / mt, (mb > 0 ? bb[kk[1]] / mb : 0) } }' "$1"
}

case $part in
    curves) curves ;;
    wire) wire ;;
    all) curves && wire ;;
esac
