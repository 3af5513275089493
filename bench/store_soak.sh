# SPDX-License-Identifier: MIT (see LICENSE)
# bench/store_soak.sh — the store's rendezvous run again and again: build/store-bench with N
# clients (default 16,384, the most this machine's 20,000 descriptors per process allow), R
# times in a row (default 20), no pause between runs (TIME_WAIT sockets of earlier runs stay;
# the bench's clients connect from fresh loopback addresses each run). Counts hangs (the bench
# exits 3 when clients are not done 10 s after their bound, and a run the outer timeout kills
# counts too) and runs with failed clients; prints each run's time and the median.
#
#   bash bench/store_soak.sh [RUNS] [CLIENTS] [PROCESSES]      (make store-soak)
set -u
runs=${1:-20}
n=${2:-16384}
p=${3:-32}
bench=${STORE_BENCH:-build/store-bench}
hangs=0 failed=0 times=""
for i in $(seq 1 "$runs"); do
    tw=$(ss -tan state time-wait 2>/dev/null | tail -n +2 | wc -l)
    out=$(timeout -k 5 120 "$bench" -n "$n" -p "$p" -t 60000 2>&1)
    rc=$?
    line=$(printf '%s\n' "$out" | grep '^store-bench: .* clients in' | tail -1)
    t=$(printf '%s\n' "$line" | sed -n 's/.* after \([0-9.]*\) s .*/\1/p')
    case $rc in
        0) times="$times $t"; verdict=ok ;;
        3|124|137) hangs=$((hangs + 1)); verdict=HANG
                   printf '%s\n' "$out" | grep -E 'HANG|clients [0-9]+-[0-9]+:' | head -5 ;;
        *) failed=$((failed + 1)); verdict="failed (exit $rc)"
           printf '%s\n' "$out" | grep '^store-bench: client' | head -3 ;;
    esac
    echo "store-soak: run $i of $runs: ${t:-?} s, $verdict (TIME_WAIT sockets before: $tw)"
done
median=$(printf '%s\n' $times | sort -n | awk '{a[NR]=$1} END {if (NR) print (NR % 2 ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2); else print "-"}')
max=$(printf '%s\n' $times | sort -n | tail -1)
echo "store-soak: $runs runs of $n clients ($p processes): $hangs hangs, $failed with failed clients; median ${median} s, slowest ${max:--} s"
[ "$hangs" -eq 0 ] && [ "$failed" -eq 0 ]
