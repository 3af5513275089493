#!/usr/bin/env bash
# SPDX-License-Identifier: MIT (see LICENSE)
# bench/compare.sh — `make compare`: libddp's all-reduce next to Open MPI's and Gloo's, measured
# side by side in one run (issue 3).
#
#   bench/compare.sh [out.json]        (default bench/results/compare.json; the markdown table
#                                       goes next to it as compare.md)
#
# Builds into build/compare/: the libddp bench (bench/ddp_bench.c if it builds, else
# bench/allreduce_bench.c; -O2, as a user of the header compiles), the Open MPI peer
# (bench/mpi_allreduce_bench.c, mpicc) and the Gloo peer (bench/gloo_bench.cc, g++ -lgloo). Then,
# for p = 2 and 4, REPEATS rounds (more while some configuration has fewer than MIN_CLEAN
# undisturbed runs, up to MAX_ROUNDS and TIME_BUDGET seconds) of, interleaved, the order rotated
# each round so drifting background load hits all alike:
#   ddp_tcp    libddp over its TCP transport (--transport tcp where the bench lists transports)
#   ddp_shm    libddp over shared memory (--transport shm), when the bench has transports/ddp_shm.h in it
#   mpi_tcp    Open MPI: --mca pml ob1 --mca btl self,tcp --mca btl_tcp_if_include lo
#   mpi_vader  Open MPI: --mca pml ob1 --mca btl self,vader (its shared-memory path)
#   gloo_tcp   Gloo: gloo::allreduce (a ring) over Gloo's TCP transport on 127.0.0.1
# all float sum, in place, the same sizes, iterations and method (bench/bench_common.h); every
# Open MPI run with --mca mpi_yield_when_idle 1 (ranks outnumber cores here). Also one TCP
# loopback stream (bench/tcp_stream.c, the limit a TCP ring can reach) and one 256 MiB peak-RSS
# run per implementation at p = 2. bench/compare_summary.py then prints one table per world size
# (busbw and latency of each, ratios libddp/peer) from the medians of the undisturbed runs, and
# writes the JSON and the markdown. Raw outputs stay in build/compare_raw/.
#
# Environment (defaults keep the whole run under ~10 minutes on 2 cores):
#   SIZES=8,4K,64K,1M,16M,64M NP="2 4" REPEATS=2
#   MIN_CLEAN=1 MAX_ROUNDS=4 TIME_BUDGET=300   extra rounds (after REPEATS) until every
#                        configuration has MIN_CLEAN undisturbed runs, while the rounds so far
#                        took less than TIME_BUDGET seconds
#   ITERS=1000 WARMUP=10 TARGET_S=0.5   per size: up to ITERS timed calls, about TARGET_S s
#   WAIT_IDLE=60         first wait up to this many seconds for other load to go (0: don't)
#   WAIT_ROUND=15        and up to this many before each later round
#   CLEAN_CORES=0.25     a run during which others used more CPU than this is "disturbed"
#   IMPLS="ddp_tcp ddp_shm mpi_tcp mpi_vader gloo_tcp"   a subset to run
#   LOOPBACK=1 MEM=1     the loopback stream and the peak-RSS runs (0: skip)
#   LIBDDP_REF=HEAD      measure the library headers of this commit (extracted into build/) instead
#                        of the working tree, so the result names exactly what was measured
#   GLOO_BENCH_ARGS="-A AllreduceHalvingDoubling"   extra gloo_bench flags (another algorithm)
#   CC=cc CXX=g++ MPICC=mpicc    DDP_* knobs are passed through to libddp, GLOO_* to Gloo.
# Needs: bash, GNU time (/usr/bin/time), awk, a C compiler, python3 (the table), and for the
# peers: apt-get install -y libopenmpi-dev openmpi-bin libgloo-dev (a missing peer is skipped).
# Flag variables ($CFLAGS_USER, $COMMON, ...) are split into words on purpose.
# shellcheck disable=SC2086
set -eu
cd "$(dirname "$0")/.."
NEEDS="make compare needs: apt-get install -y libopenmpi-dev openmpi-bin libgloo-dev"

# What the user chose, for the "command" line of the results (before the defaults fill in).
shq() {   # a shell word: as is when safe, else in single quotes
    case $1 in
    '' | *[!A-Za-z0-9_.,:/+=@%-]*) printf "'%s'" "${1//\'/\'\\\'\'}" ;;
    *) printf '%s' "$1" ;;
    esac
}
CMD_ENV=""
for v in SIZES NP REPEATS MIN_CLEAN MAX_ROUNDS TIME_BUDGET ITERS WARMUP TARGET_S WAIT_IDLE \
         WAIT_ROUND CLEAN_CORES IMPLS LOOPBACK MEM LIBDDP_REF CC CXX MPICC; do
    [ -n "${!v+x}" ] && CMD_ENV="$CMD_ENV $v=$(shq "${!v}")"
done
for v in $(env | grep -oE '^(DDP|GLOO)_[A-Za-z0-9_]+' | grep -v '^DDP_JOB_SECRET$' || true); do
    CMD_ENV="$CMD_ENV $v=$(shq "${!v}")"
done
if [ -n "${MAKELEVEL:-}" ]; then COMMAND="${CMD_ENV# } make compare"
else COMMAND="${CMD_ENV# } bench/compare.sh${*:+ $*}"; fi
COMMAND=${COMMAND# }

OUT=${1:-bench/results/compare.json}
SIZES=${SIZES:-8,4K,64K,1M,16M,64M}
NP=${NP:-2 4}
REPEATS=${REPEATS:-2}
MIN_CLEAN=${MIN_CLEAN:-1}
MAX_ROUNDS=${MAX_ROUNDS:-4}
TIME_BUDGET=${TIME_BUDGET:-300}
ITERS=${ITERS:-1000}
WARMUP=${WARMUP:-10}
TARGET_S=${TARGET_S:-0.5}
WAIT_IDLE=${WAIT_IDLE:-60}
WAIT_ROUND=${WAIT_ROUND:-15}
CLEAN_CORES=${CLEAN_CORES:-0.25}
IMPLS=${IMPLS:-ddp_tcp ddp_shm mpi_tcp mpi_vader gloo_tcp}
LOOPBACK=${LOOPBACK:-1}
MEM=${MEM:-1}
CC=${CC:-cc}
CXX=${CXX:-g++}
MPICC=${MPICC:-mpicc}
[ "$MAX_ROUNDS" -ge "$REPEATS" ] || MAX_ROUNDS=$REPEATS

if ! command -v python3 > /dev/null; then
    echo "make compare: python3 is missing, and it prints the table: apt-get install -y python3" >&2
    exit 1
fi
for t in /usr/bin/time:time awk:gawk getconf:libc-bin "$CC:gcc"; do
    command -v "${t%%:*}" > /dev/null || { echo "make compare: ${t%%:*} is missing: apt-get install -y ${t##*:}" >&2; exit 1; }
done
. bench/bench_lib.sh

# What a user of a header-only C library typically compiles with: -O2, no -march.
CFLAGS_USER="-std=c99 -O2 -Wall -Wextra -Wpedantic -Werror"
CXXFLAGS_GLOO="-std=c++17 -O2 -Wall -Wextra"
MPI_COMMON="--allow-run-as-root --oversubscribe --mca pml ob1 --mca mpi_yield_when_idle 1"
MPIRUN_TCP="$MPI_COMMON --mca btl self,tcp --mca btl_tcp_if_include lo"
MPIRUN_VADER="$MPI_COMMON --mca btl self,vader"

BIN=build/compare
RAW=build/compare_raw
mkdir -p "$BIN"
rm -rf "$RAW"
mkdir -p "$RAW"

INC="-I."
if [ -n "${LIBDDP_REF:-}" ]; then
    rm -rf build/libddp_ref
    mkdir -p build/libddp_ref
    git archive "$LIBDDP_REF" 'ddp*.h' transports | tar -x -C build/libddp_ref
    LIBDDP_REF=$(git rev-parse "$LIBDDP_REF")
    INC="-Ibuild/libddp_ref -I."
fi
export LIBDDP_REF

# ---- build; a peer that is missing or does not build is skipped (MISSING / BUILD_FAILED) ----
MISSING=""
BUILD_FAILED=""
# build_named NAME command...: 0 if it built; its output in $RAW/build_NAME.log, shown on failure
build_named() {
    local n=$1
    shift
    echo "+ $*"
    "$@" > "$RAW/build_$n.log" 2>&1 && return 0
    tail -20 "$RAW/build_$n.log"
    return 1
}
echo "== build"
DDPB="" DDPB_SRC=""
if [ -f bench/ddp_bench.c ]; then
    if build_named ddp $CC $CFLAGS_USER $INC -pthread bench/ddp_bench.c -o "$BIN/ddp-bench" -lm; then
        DDPB=$BIN/ddp-bench DDPB_SRC=bench/ddp_bench.c
    else
        echo "== bench/ddp_bench.c does not build (above); trying bench/allreduce_bench.c"
    fi
fi
if [ -z "$DDPB" ] && [ -f bench/allreduce_bench.c ]; then
    build_named ddp_old $CC $CFLAGS_USER $INC -pthread bench/allreduce_bench.c -o "$BIN/allreduce_bench" -lm &&
        DDPB=$BIN/allreduce_bench DDPB_SRC=bench/allreduce_bench.c
fi
[ -n "$DDPB" ] || { echo "make compare: the libddp benchmark does not build" >&2; exit 1; }
# --transport exists where the bench lists its transports (ddp-bench); allreduce_bench is TCP only.
DDP_TRANSPORTS=$("$DDPB" --list-transports 2> /dev/null || true)
DDP_T_TCP=""
echo "$DDP_TRANSPORTS" | grep -qx tcp && DDP_T_TCP="--transport tcp"
HAVE_SHM=0
echo "$DDP_TRANSPORTS" | grep -qx shm && HAVE_SHM=1
if [ "$HAVE_SHM" = 0 ] && [ -f transports/ddp_shm.h ]; then
    echo "== transports/ddp_shm.h exists but $DDPB_SRC has no shm transport: libddp over shm is not measured"
fi

MPIB=""
if ! command -v "$MPICC" > /dev/null || ! command -v mpirun > /dev/null; then
    MISSING="$MISSING mpi"
    echo "== Open MPI not found ($MPICC / mpirun): skipping it. $NEEDS"
elif build_named mpi "$MPICC" $CFLAGS_USER bench/mpi_allreduce_bench.c -o "$BIN/mpi_allreduce_bench" -lm; then
    MPIB=$BIN/mpi_allreduce_bench
else
    BUILD_FAILED="$BUILD_FAILED mpi"
    echo "== bench/mpi_allreduce_bench.c does not build (above): skipping Open MPI"
fi

GLOOB=""
if ! command -v "$CXX" > /dev/null; then
    MISSING="$MISSING gloo"
    echo "== no C++ compiler ($CXX) for the Gloo peer: skipping Gloo. $NEEDS g++"
elif ! printf '#include <gloo/allreduce.h>\n' | "$CXX" -std=c++17 -x c++ -fsyntax-only - 2> /dev/null; then
    MISSING="$MISSING gloo"
    echo "== Gloo not found (<gloo/allreduce.h>): skipping Gloo. $NEEDS"
elif build_named gloo "$CXX" $CXXFLAGS_GLOO bench/gloo_bench.cc -o "$BIN/gloo_bench" -lgloo -pthread -lm; then
    GLOOB=$BIN/gloo_bench
else
    BUILD_FAILED="$BUILD_FAILED gloo"
    echo "== bench/gloo_bench.cc does not build (above): skipping Gloo"
fi
if [ -z "$MPIB" ] && [ -z "$GLOOB" ]; then
    echo "make compare: no peer to compare with (missing:${MISSING:- none}; did not build:${BUILD_FAILED:- none})." >&2
    echo "$NEEDS" >&2
    exit 1
fi

# The configurations that can run here, in IMPLS order.
CONFIGS=""
for c in $IMPLS; do
    case $c in
    ddp_tcp) ok=1 ;;
    ddp_shm) ok=$HAVE_SHM ;;
    mpi_tcp|mpi_vader) ok=$([ -n "$MPIB" ] && echo 1 || echo 0) ;;
    gloo_tcp) ok=$([ -n "$GLOOB" ] && echo 1 || echo 0) ;;
    *) echo "make compare: unknown configuration '$c' in IMPLS" >&2; exit 2 ;;
    esac
    [ "$ok" = 1 ] && CONFIGS="$CONFIGS $c"
done
CONFIGS=${CONFIGS# }
[ -n "$CONFIGS" ] || { echo "make compare: nothing to run (IMPLS=$IMPLS)" >&2; exit 1; }
echo "== configurations: $CONFIGS (libddp bench: $DDPB_SRC)"

if [ "$LOOPBACK" = 1 ] && [ -f bench/tcp_stream.c ]; then
    build_named tcp_stream $CC $CFLAGS_USER bench/tcp_stream.c -o "$BIN/tcp_stream" -lm || LOOPBACK=0
else
    LOOPBACK=0
fi

wait_idle "$WAIT_IDLE" || true
BUSY_BEFORE=$(busy_cores)
LOAD_BEFORE=$(cut -d' ' -f1-3 /proc/loadavg)
echo "== before: $BUSY_BEFORE cores busy, loadavg $LOAD_BEFORE"
T_START=$(date +%s)
DATE=$(date -u +%Y-%m-%dT%H:%M:%SZ)
# No -o: every bench defaults to all_reduce with sum (ddp-bench's -o also names the collective).
COMMON="-s $SIZES -n $ITERS -w $WARMUP --target-seconds $TARGET_S -d float --inplace 1"

[ "$LOOPBACK" = 1 ] && run tcp_stream "./$BIN/tcp_stream" -b 64K -e 64M -f 4 -t 1G -J "$RAW/tcp_stream.json"

# run_config CONFIG P NAME [extra args]: one run of CONFIG at P ranks, raw files $RAW/NAME.*
run_config() {
    local c=$1 p=$2 name=$3
    shift 3
    case $c in
    ddp_tcp) run "$name" "./$DDPB" -N "$p" $DDP_T_TCP "$@" -L O2 -J "$RAW/$name.json" ;;
    ddp_shm) run "$name" "./$DDPB" -N "$p" --transport shm "$@" -L O2 -J "$RAW/$name.json" ;;
    mpi_tcp) run "$name" mpirun $MPIRUN_TCP -np "$p" "./$MPIB" "$@" -L O2 -J "$RAW/$name.json" ;;
    mpi_vader) run "$name" mpirun $MPIRUN_VADER -np "$p" "./$MPIB" "$@" -L O2 -J "$RAW/$name.json" ;;
    gloo_tcp) run "$name" "./$GLOOB" -N "$p" ${GLOO_BENCH_ARGS:-} "$@" -L O2 -J "$RAW/$name.json" ;;
    esac
}
# clean_runs CONFIG P: how many runs of CONFIG at P so far were undisturbed
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
read -r -a CFG <<< "$CONFIGS"
r=1
while :; do
    [ "$r" -gt 1 ] && { wait_idle "$WAIT_ROUND" || true; }
    for p in $NP; do
        for k in "${!CFG[@]}"; do
            c=${CFG[$(((k + r - 1) % ${#CFG[@]}))]}
            run_config "$c" "$p" "${c}_p${p}_r$r" $COMMON
        done
    done
    [ "$r" -ge "$MAX_ROUNDS" ] && break
    if [ "$r" -ge "$REPEATS" ]; then
        enough=1
        for p in $NP; do
            for c in $CONFIGS; do
                [ "$(clean_runs "$c" "$p")" -ge "$MIN_CLEAN" ] || enough=0
            done
        done
        [ "$enough" = 1 ] && break
        if [ $(($(date +%s) - T_START)) -ge "$TIME_BUDGET" ]; then
            echo "== round $r: some configuration has fewer than $MIN_CLEAN undisturbed runs, but the"
            echo "   time budget ($TIME_BUDGET s) is spent: no more rounds (medians of disturbed runs get '!')"
            break
        fi
        echo "== round $r: fewer than $MIN_CLEAN undisturbed runs of some configuration; another round"
    fi
    r=$((r + 1))
done
ROUNDS=$r
if [ "$MEM" = 1 ]; then
    for c in $CONFIGS; do
        run_config "$c" 2 "${c}_mem_p2" --mem
    done
fi

BUSY_AFTER=$(busy_cores)
LOAD_AFTER=$(cut -d' ' -f1-3 /proc/loadavg)
T_END=$(date +%s)
if [ -n "$FAILED" ]; then echo "== failed runs:$FAILED"; fi
mkdir -p "$(dirname "$OUT")"
export CLEAN_CORES ROUNDS FAILED RAW OUT NP REPEATS MIN_CLEAN MAX_ROUNDS SIZES ITERS WARMUP TARGET_S \
       CFLAGS_USER CXXFLAGS_GLOO MPIRUN_TCP MPIRUN_VADER BUSY_BEFORE BUSY_AFTER LOAD_BEFORE LOAD_AFTER \
       T_START T_END DATE CC CXX MPICC CONFIGS MISSING BUILD_FAILED DDPB_SRC DDP_T_TCP COMMAND NEEDS
python3 bench/compare_summary.py
