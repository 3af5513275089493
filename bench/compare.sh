#!/usr/bin/env bash
# bench/compare.sh — libddp all-reduce next to Open MPI and the machine's TCP loopback limit,
# measured side by side in one run (issue 2, "Benchmark").
#
#   bench/compare.sh [results.json]          (default bench/results.json)
#
# Builds into build/ and runs: tcp_stream (loopback and memory references), reduce_bench (the
# reduction kernels, -O2 and -O3 -march=native); REPEATS (or more, see MIN_CLEAN) rounds of
# libddp and Open MPI at p = 2 and p = 4, interleaved so drifting background load hits both
# alike; libddp built with -O3 -march=native at p = 2 and 4 (one round); the 256 MiB peak-RSS
# run (-m) for libddp at p = 2 and 4 and for MPI at p = 2. Then prints the summary table
# (bench/compare_summary.py: medians over the rounds that other processes did not disturb) and
# writes it, with every raw result, to the JSON file. Raw outputs stay in build/compare_raw/.
#
# Environment:
#   REPEATS=3 SIZES=8,64K,1M,16M,64M NP="2 4"
#   MIN_CLEAN=2 MAX_ROUNDS=8   after REPEATS rounds, go on (up to MAX_ROUNDS) until every
#                        configuration has MIN_CLEAN undisturbed rounds
#   ITERS=1000 WARMUP=10 TARGET_S=0.5   per size: up to ITERS timed calls, about TARGET_S s
#   WAIT_IDLE=120        first wait up to this many seconds for other load to go (0: don't)
#   WAIT_ROUND=30        and up to this many before each later round
#   CLEAN_CORES=0.25     a run during which others used more CPU than this is "disturbed"
#   LIBDDP_REF=HEAD      measure the library headers of this commit (extracted into build/) instead
#                        of the working tree, so the result names exactly what was measured
#   CC=cc MPICC=mpicc    DDP_* knobs are passed through to libddp.
# Needs: bash, GNU time (/usr/bin/time), awk, a C compiler, python3 (the summary),
#        Open MPI: apt-get install -y openmpi-bin libopenmpi-dev
set -eu
cd "$(dirname "$0")/.."
OUT=${1:-bench/results.json}
REPEATS=${REPEATS:-3}
SIZES=${SIZES:-8,64K,1M,16M,64M}
ITERS=${ITERS:-1000}
WARMUP=${WARMUP:-10}
TARGET_S=${TARGET_S:-0.5}
NP=${NP:-2 4}
CC=${CC:-cc}
MPICC=${MPICC:-mpicc}
WAIT_IDLE=${WAIT_IDLE:-120}
WAIT_ROUND=${WAIT_ROUND:-30}
MIN_CLEAN=${MIN_CLEAN:-2}
MAX_ROUNDS=${MAX_ROUNDS:-8}
CLEAN_CORES=${CLEAN_CORES:-0.25}
. bench/bench_lib.sh

# What a user of a header-only C library typically compiles with (the README's line): -O2 and
# no -march, so the binary runs on any x86-64. The -O3 -march=native build is the upper bound.
CFLAGS_USER="-std=c99 -O2 -Wall -Wextra -Wpedantic -Werror"
CFLAGS_NATIVE="-std=c99 -O3 -march=native -Wall -Wextra -Wpedantic -Werror"
MPIRUN_FLAGS="--allow-run-as-root --oversubscribe --mca pml ob1 --mca btl self,tcp \
--mca btl_tcp_if_include lo --mca mpi_yield_when_idle 1"

mkdir -p build
RAW=build/compare_raw
rm -rf "$RAW"
mkdir -p "$RAW"

INC="-I."
if [ -n "${LIBDDP_REF:-}" ]; then
    rm -rf build/libddp_ref
    mkdir -p build/libddp_ref
    git archive "$LIBDDP_REF" ddp.h ddp_ring.h transports | tar -x -C build/libddp_ref
    LIBDDP_REF=$(git rev-parse "$LIBDDP_REF")
    INC="-Ibuild/libddp_ref -I."
fi
export LIBDDP_REF
echo "== build"
set -x
$CC $CFLAGS_USER $INC -pthread bench/allreduce_bench.c -o build/allreduce_bench -lm
$CC $CFLAGS_NATIVE $INC -pthread bench/allreduce_bench.c -o build/allreduce_bench_native -lm
$CC $CFLAGS_USER bench/tcp_stream.c -o build/tcp_stream -lm
$CC $CFLAGS_USER $INC -pthread bench/reduce_bench.c -o build/reduce_bench -lm
$CC $CFLAGS_NATIVE $INC -pthread bench/reduce_bench.c -o build/reduce_bench_native -lm
$MPICC $CFLAGS_USER bench/mpi_allreduce_bench.c -o build/mpi_allreduce_bench -lm
set +x

wait_idle "$WAIT_IDLE" || true
BUSY_BEFORE=$(busy_cores)
LOAD_BEFORE=$(cut -d' ' -f1-3 /proc/loadavg)
echo "== before: $BUSY_BEFORE cores busy, loadavg $LOAD_BEFORE"
T_START=$(date +%s)
COMMON="-s $SIZES -n $ITERS -w $WARMUP -T $TARGET_S -d float -o sum"

run tcp_stream ./build/tcp_stream -b 64K -e 64M -f 4 -t 1G -J "$RAW/tcp_stream.json"
run reduce_O2 ./build/reduce_bench -t 0.2
run reduce_native ./build/reduce_bench_native -t 0.2
# clean_runs IMPL P: how many rounds of IMPL at P so far were undisturbed
clean_runs() {
    local n=0 f o
    for f in "$RAW/$1_p$2_r"*.load; do
        [ -e "$f" ] || continue
        [ -e "${f%.load}.json" ] || continue
        read -r _ _ o < "$f"
        awk -v o="$o" -v c="$CLEAN_CORES" 'BEGIN { exit !(o <= c) }' && n=$((n + 1))
    done
    echo "$n"
}
r=1
while :; do
    [ "$r" -gt 1 ] && { wait_idle "$WAIT_ROUND" || true; }
    for p in $NP; do
        run "ddp_p${p}_r$r" ./build/allreduce_bench -p "$p" $COMMON -L O2 -J "$RAW/ddp_p${p}_r$r.json"
        # shellcheck disable=SC2086
        run "mpi_p${p}_r$r" mpirun $MPIRUN_FLAGS -np "$p" ./build/mpi_allreduce_bench $COMMON \
            -L O2 -J "$RAW/mpi_p${p}_r$r.json"
    done
    [ "$r" -ge "$MAX_ROUNDS" ] && break
    if [ "$r" -ge "$REPEATS" ]; then
        enough=1
        for p in $NP; do
            for impl in ddp mpi; do
                [ "$(clean_runs $impl "$p")" -ge "$MIN_CLEAN" ] || enough=0
            done
        done
        [ "$enough" = 1 ] && break
        echo "== round $r: fewer than $MIN_CLEAN undisturbed runs of some configuration; another round"
    fi
    r=$((r + 1))
done
ROUNDS=$r
for p in $NP; do
    run "ddpnative_p${p}_r1" ./build/allreduce_bench_native -p "$p" $COMMON -L "O3 -march=native" \
        -J "$RAW/ddpnative_p${p}_r1.json"
done
for p in $NP; do
    run "ddp_mem_p$p" ./build/allreduce_bench -p "$p" -m -J "$RAW/ddp_mem_p$p.json"
done
# shellcheck disable=SC2086
run mpi_mem_p2 mpirun $MPIRUN_FLAGS -np 2 ./build/mpi_allreduce_bench -m -J "$RAW/mpi_mem_p2.json"

BUSY_AFTER=$(busy_cores)
LOAD_AFTER=$(cut -d' ' -f1-3 /proc/loadavg)
T_END=$(date +%s)
if [ -n "$FAILED" ]; then echo "== failed runs:$FAILED"; fi
export CLEAN_CORES ROUNDS FAILED RAW OUT NP REPEATS SIZES ITERS WARMUP TARGET_S CFLAGS_USER CFLAGS_NATIVE MPIRUN_FLAGS \
       BUSY_BEFORE BUSY_AFTER LOAD_BEFORE LOAD_AFTER T_START T_END CC MPICC
python3 bench/compare_summary.py
