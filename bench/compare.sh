#!/usr/bin/env bash
# SPDX-License-Identifier: MIT (see LICENSE)
# bench/compare.sh — `make compare`: libddp's all-reduce next to Open MPI's and Gloo's, and next to
# this machine's own limits (memcpy, a+b, TCP loopback both ways), measured side by side in one run.
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
#   ddp_shm_reg  the same with the bench's buffers from ddp_comm_mem_alloc (--registered 1: buffers
#              the same-host ranks map), when the bench's --help lists --registered
#   ddp_x      libddp with the flags in LIBDDP_X_ARGS (one extra configuration of your choice; only
#              when IMPLS names it)
#   mpi_tcp    Open MPI: --mca pml ob1 --mca btl self,tcp --mca btl_tcp_if_include lo
#   mpi_vader  Open MPI: --mca pml ob1 --mca btl self,vader (its shared-memory path)
#   gloo_tcp   Gloo: gloo::allreduce (a ring) over Gloo's TCP transport on 127.0.0.1
#   limits     (at every p of every round, in the rotation too) the machine's limits at the sizes
#              >= 64 KiB, each about LIMIT_S seconds: bench/mem_limit.c (memcpy and c = a + b with
#              libddp's float sum kernel, one thread) and, when a TCP configuration of libddp runs,
#              bench/tcp_stream.c --bidir (both directions at once on one loopback connection)
# all float sum, in place, the same sizes, iterations and method (bench/bench_common.h); every
# Open MPI run with --mca mpi_yield_when_idle 1 (ranks outnumber cores here). Also one TCP
# loopback stream (bench/tcp_stream.c, by message size; when a TCP configuration runs) and one
# 256 MiB peak-RSS run per implementation at p = 2. bench/compare_summary.py then prints one table
# per world size (busbw and latency of each, ratios libddp/peer) from the medians of the
# undisturbed runs, and one of the shares of the machine's limits (libddp shm busbw / memcpy,
# libddp tcp busbw / loopback both ways, per round, then the median), and writes the JSON and the
# markdown. Raw outputs stay in build/compare_raw/.
#
# The shared-memory share alone, p = 2 and 4, 1 MiB .. 256 MiB, 5 rounds (a few minutes):
#   IMPLS="ddp_shm ddp_shm_reg" SIZES=1M,4M,16M,64M,256M NP="2 4" REPEATS=5 make compare
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
#   IMPLS="ddp_tcp ddp_shm mpi_tcp mpi_vader gloo_tcp"   a subset to run (ddp_shm_reg is added
#                        after ddp_shm when the bench has --registered); a peer not named is not built
#   LIBDDP_X_ARGS="--transport shm -T 30"   ddp-bench's flags for ddp_x (besides -N and the sweep);
#                        its limit is the loopback both ways when they name tcp, else memcpy
#   LIMITS=1 LIMIT_S=0.2 the limits beside every round, seconds per kernel and size (0: skip)
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
         WAIT_ROUND CLEAN_CORES IMPLS LIBDDP_X_ARGS LIMITS LIMIT_S LOOPBACK MEM LIBDDP_REF CC CXX MPICC; do
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
IMPLS_GIVEN=${IMPLS:+1}
IMPLS=${IMPLS:-ddp_tcp ddp_shm mpi_tcp mpi_vader gloo_tcp}
LIBDDP_X_ARGS=${LIBDDP_X_ARGS:-}
LIMITS=${LIMITS:-1}
LIMIT_S=${LIMIT_S:-0.2}
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

# --registered: ddp_comm_mem_alloc'd buffers (a bench from before it has no such flag)
HAVE_REG=0
"$DDPB" --help 2> /dev/null | grep -q -- '--registered' && HAVE_REG=1
if [ -z "$IMPLS_GIVEN" ] && [ "$HAVE_REG" = 1 ] && [ "$HAVE_SHM" = 1 ]; then
    IMPLS=${IMPLS/ddp_shm/ddp_shm ddp_shm_reg}
fi
# named IMPL: IMPLS names it
named() { case " $IMPLS " in *" $1 "*) return 0 ;; esac; return 1; }
WANT_PEER=0
if named mpi_tcp || named mpi_vader || named gloo_tcp; then WANT_PEER=1; fi
MPIB=""
if ! named mpi_tcp && ! named mpi_vader; then
    :   # not asked for: not built
elif ! command -v "$MPICC" > /dev/null || ! command -v mpirun > /dev/null; then
    MISSING="$MISSING mpi"
    echo "== Open MPI not found ($MPICC / mpirun): skipping it. $NEEDS"
elif build_named mpi "$MPICC" $CFLAGS_USER bench/mpi_allreduce_bench.c -o "$BIN/mpi_allreduce_bench" -lm; then
    MPIB=$BIN/mpi_allreduce_bench
else
    BUILD_FAILED="$BUILD_FAILED mpi"
    echo "== bench/mpi_allreduce_bench.c does not build (above): skipping Open MPI"
fi

GLOOB=""
if ! named gloo_tcp; then
    :
elif ! command -v "$CXX" > /dev/null; then
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
if [ "$WANT_PEER" = 1 ] && [ -z "$MPIB" ] && [ -z "$GLOOB" ]; then
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
    ddp_shm_reg)
        ok=$((HAVE_SHM * HAVE_REG))
        [ "$ok" = 1 ] || echo "== ddp_shm_reg: $DDPB_SRC has no --registered (or no shm transport): not measured" ;;
    ddp_x)
        [ -n "$LIBDDP_X_ARGS" ] || { echo "make compare: IMPLS names ddp_x but LIBDDP_X_ARGS is empty" >&2; exit 2; }
        ok=1 ;;
    mpi_tcp|mpi_vader) ok=$([ -n "$MPIB" ] && echo 1 || echo 0) ;;
    gloo_tcp) ok=$([ -n "$GLOOB" ] && echo 1 || echo 0) ;;
    *) echo "make compare: unknown configuration '$c' in IMPLS" >&2; exit 2 ;;
    esac
    [ "$ok" = 1 ] && CONFIGS="$CONFIGS $c"
done
CONFIGS=${CONFIGS# }
[ -n "$CONFIGS" ] || { echo "make compare: nothing to run (IMPLS=$IMPLS)" >&2; exit 1; }
echo "== configurations: $CONFIGS (libddp bench: $DDPB_SRC)"

# The limits: memcpy and a+b for every configuration; the TCP loopback (the stream by message
# size, and both ways at once beside every round) where a TCP configuration of libddp runs.
TCP_RUNS=0
for c in $CONFIGS; do
    case $c in
    ddp_tcp) TCP_RUNS=1 ;;
    ddp_x) case " $LIBDDP_X_ARGS " in *tcp*) TCP_RUNS=1 ;; esac ;;
    esac
done
# to_bytes 64K: 65536 (0 when it is not a size)
to_bytes() {
    local v=$1 m=1
    case $v in
    *[kK]) m=1024 v=${v%?} ;;
    *[mM]) m=1048576 v=${v%?} ;;
    *[gG]) m=1073741824 v=${v%?} ;;
    esac
    case $v in '' | *[!0-9]*) echo 0 ;; *) echo $((v * m)) ;; esac
}
LIMIT_SIZES=""
for s in ${SIZES//,/ }; do
    [ "$(to_bytes "$s")" -ge 65536 ] && LIMIT_SIZES="$LIMIT_SIZES,$s"
done
LIMIT_SIZES=${LIMIT_SIZES#,}
if [ "$LIMITS" = 1 ] && [ -z "$LIMIT_SIZES" ]; then
    echo "== no size >= 64 KiB in SIZES: no limits measured"
    LIMITS=0
fi
MEM_LIMIT=0 TCP_LIMIT=0
if [ "$LIMITS" = 1 ]; then
    build_named mem_limit $CC $CFLAGS_USER $INC bench/mem_limit.c -o "$BIN/mem_limit" -lm && MEM_LIMIT=1
    [ "$TCP_RUNS" = 1 ] && TCP_LIMIT=1
fi
[ "$TCP_RUNS" = 1 ] || LOOPBACK=0
if [ "$LOOPBACK" = 1 ] || [ "$TCP_LIMIT" = 1 ]; then
    if [ ! -f bench/tcp_stream.c ] || ! build_named tcp_stream $CC $CFLAGS_USER bench/tcp_stream.c -o "$BIN/tcp_stream" -lm; then
        LOOPBACK=0 TCP_LIMIT=0
    fi
fi
[ "$MEM_LIMIT" = 1 ] || [ "$TCP_LIMIT" = 1 ] || LIMITS=0

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
    ddp_shm_reg) run "$name" "./$DDPB" -N "$p" --transport shm --registered 1 "$@" -L O2 -J "$RAW/$name.json" ;;
    ddp_x) run "$name" "./$DDPB" -N "$p" $LIBDDP_X_ARGS "$@" -L O2 -J "$RAW/$name.json" ;;
    esac
}
# run_limits P R: the machine's limits beside round R at P ranks (raw files $RAW/limit_*_pP_rR.*)
run_limits() {
    [ "$MEM_LIMIT" = 1 ] &&
        run "limit_mem_p$1_r$2" "./$BIN/mem_limit" -s "$LIMIT_SIZES" -t "$LIMIT_S" -J "$RAW/limit_mem_p$1_r$2.json"
    [ "$TCP_LIMIT" = 1 ] &&
        run "limit_tcp_p$1_r$2" "./$BIN/tcp_stream" --bidir -s "$LIMIT_SIZES" -T "$LIMIT_S" -J "$RAW/limit_tcp_p$1_r$2.json"
    return 0
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
[ "$LIMITS" = 1 ] && CFG+=(limits)
r=1
while :; do
    [ "$r" -gt 1 ] && { wait_idle "$WAIT_ROUND" || true; }
    for p in $NP; do
        for k in "${!CFG[@]}"; do
            c=${CFG[$(((k + r - 1) % ${#CFG[@]}))]}
            if [ "$c" = limits ]; then run_limits "$p" "$r"
            else run_config "$c" "$p" "${c}_p${p}_r$r" $COMMON; fi
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
       T_START T_END DATE CC CXX MPICC CONFIGS MISSING BUILD_FAILED DDPB_SRC DDP_T_TCP COMMAND NEEDS \
       LIMIT_S LIMIT_SIZES LIBDDP_X_ARGS
python3 bench/compare_summary.py
