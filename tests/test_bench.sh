#!/bin/sh
# SPDX-License-Identifier: MIT (see LICENSE)
# tests/test_bench.sh — ddp-bench (bench/ddp_bench.c), its chart writer and the `make bench`
# script, end to end with tiny sizes. Run from the repository root (prove tests/test_bench.sh);
# prints TAP. Uses build/ddp-bench and build/svg_chart when they are newer than their sources,
# else compiles private copies. Every run is bounded by timeout; the file takes a few seconds.
set -u

CC=${CC:-cc}
CFLAGS_T="-std=c99 -O2 -Wall -Wextra -Wpedantic -Werror -I."
tmp=$(mktemp -d "${TMPDIR:-/tmp}/bench_test.XXXXXX") || { echo "Bail out! mktemp failed"; exit 1; }
trap 'rm -rf "$tmp"' EXIT
unset DDP_BENCH_CORRUPT DDP_TRANSPORT RANK WORLD_SIZE OMPI_COMM_WORLD_RANK OMPI_COMM_WORLD_SIZE \
      PMI_RANK PMI_SIZE
T="timeout -k 2 30"

. "$(dirname "$0")/tap.sh"   # ok, notok, check, why
# newer TARGET SOURCES...: TARGET exists and is newer than every source
newer() { t=$1; shift; [ -x "$t" ] || return 1; for s in "$@"; do [ "$t" -nt "$s" ] || return 1; done; }

# --- build ----------------------------------------------------------------------------------
B=build/ddp-bench
C=build/svg_chart
build_bench() {
    # shellcheck disable=SC2046
    newer "$B" bench/ddp_bench.c bench/bench_common.h $(ls ddp*.h transports/*.h) && return 0
    B=$tmp/ddp-bench
    $CC $CFLAGS_T bench/ddp_bench.c -o "$B" -pthread -lm 2> "$tmp/why"
}
build_chart() {
    newer "$C" bench/svg_chart.c && return 0
    C=$tmp/svg_chart
    $CC $CFLAGS_T bench/svg_chart.c -o "$C" -lm 2> "$tmp/why"
}
check "ddp-bench builds (C99, -Wall -Wextra -Wpedantic -Werror)" build_bench
check "svg_chart builds (C99, -Wall -Wextra -Wpedantic -Werror)" build_chart
[ -x "$B" ] && [ -x "$C" ] || { echo "Bail out! no ddp-bench or svg_chart"; exit 1; }

TRANSPORTS=$($B --list-transports)
list_ok() {
    echo "$TRANSPORTS" | grep -qx tcp || { why "--list-transports: '$TRANSPORTS'"; return 1; }
    if [ -e transports/ddp_shm.h ]; then
        echo "$TRANSPORTS" | grep -qx shm || { why "ddp_shm.h exists but shm is not listed"; return 1; }
    fi
}
check "--list-transports names every transport compiled in ($(echo $TRANSPORTS))" list_ok

# run NAME ARGS...: ddp-bench ARGS with its stdout in $tmp/NAME.out, exit status in $rc
run() { name=$1; shift; $T "$B" "$@" > "$tmp/$name.out" 2> "$tmp/$name.err"; rc=$?; }
# run_env VAR=VALUE NAME ARGS...: the same with VAR set for that run only (a VAR=VALUE prefix on a
# shell function would outlive the call in some shells)
run_env() { e=$1; name=$2; shift 2; $T env "$e" "$B" "$@" > "$tmp/$name.out" 2> "$tmp/$name.err"; rc=$?; }
# rows FILE: the data rows (not comments)
rows() { grep -v '^#' "$1"; }
# col FILE K: the K-th field of every row
col() { rows "$1" | awk -v k="$2" '{ print $k }'; }

# --- a clean run: nccl-tests' layout, #wrong 0, exit 0 ----------------------------------------
clean_ok() {
    run clean -N 2 --transport tcp -o all_reduce -b 8 -e 64K -f 8 -n 5 -w 1 -c 1 -d float -J "$tmp/clean.json"
    [ "$rc" = 0 ] || { why "exit $rc"; cat "$tmp/clean.err" >> "$tmp/why"; return 1; }
    for w in size count type redop root time algbw busbw '#wrong' out-of-place in-place p50 p99; do
        grep '^#' "$tmp/clean.out" | grep -q -- "$w" || { why "header lacks '$w'"; return 1; }
    done
    grep -q '^# Out of bounds values : 0 OK$' "$tmp/clean.out" || { why "no '# Out of bounds values : 0 OK'"; return 1; }
    grep -q '^# Avg bus bandwidth    : ' "$tmp/clean.out" || { why "no '# Avg bus bandwidth' footer"; return 1; }
    grep -q 'averaged over ranks' "$tmp/clean.out" || { why "the header does not say how time is averaged"; return 1; }
    # size count type redop root | time algbw busbw #wrong (out-of-place) | the same (in-place)
    [ "$(rows "$tmp/clean.out" | wc -l)" = 5 ] || { why "want 5 rows (8 B .. 32 KiB x8)"; return 1; }
    bad=$(rows "$tmp/clean.out" | awk '$3 != "float" || $4 != "sum" || $5 != -1 || $9 != 0 || $13 != 0')
    [ -z "$bad" ] || { why "rows with wrong fields: $bad"; return 1; }
}
check "clean run: nccl-tests header/rows/footer, #wrong 0 in both placements, exit 0" clean_ok

# --- the corrupted result is seen ---------------------------------------------------------------
# corrupt_ok NAME [cols=FIELDS] ARGS...: the #wrong fields to look at (default 9 13: out-of-place
# and in-place; all_to_all and sendrecv have only the out-of-place one, field 9)
corrupt_ok() {
    name=corrupt_$1; shift
    cols="9 13"
    case $1 in cols=*) cols=${1#cols=}; shift ;; esac
    DDP_BENCH_CORRUPT=1 $T "$B" "$@" > "$tmp/$name.out" 2> "$tmp/$name.err"; rc=$?
    [ "$rc" != 0 ] || { why "exit status 0 with a corrupted result"; return 1; }
    grep -Eq '^# Out of bounds values : [1-9][0-9]* FAILED$' "$tmp/$name.out" ||
        { why "no '# Out of bounds values : N FAILED'"; grep '^# Out' "$tmp/$name.out" >> "$tmp/why"; return 1; }
    # one element of rank 0's (the root's) result per checked call: #wrong is exactly 1 in every row
    bad=$(rows "$tmp/$name.out" | awk -v cols="$cols" \
        'BEGIN { n = split(cols, c, " ") } { for (k = 1; k <= n; k++) if ($c[k] != 1) { print; next } }')
    [ -z "$bad" ] || { why "rows without #wrong 1: $bad"; return 1; }
}
check "DDP_BENCH_CORRUPT=1: all_reduce #wrong 1 per row, '# Out of bounds values : N FAILED', exit != 0" \
    corrupt_ok ar -N 2 --transport tcp -o all_reduce -s 8,4K -n 2 -w 0
check "DDP_BENCH_CORRUPT=1: all_gather (int8) the same" corrupt_ok ag -N 3 --transport tcp -o all_gather -d int8 -s 96,4K -n 2 -w 0
check "DDP_BENCH_CORRUPT=1: broadcast (bfloat16) the same" corrupt_ok bc -N 2 --transport tcp -o broadcast -d bf16 -s 64 -n 2 -w 0 -r 1
check "DDP_BENCH_CORRUPT=1: reduce (root 2 of 3, max) the same" \
    corrupt_ok red -N 3 --transport tcp -o reduce --op max -r 2 -s 96,4K -n 2 -w 0
check "DDP_BENCH_CORRUPT=1: all_to_all (p=3, out-of-place only) the same" \
    corrupt_ok a2a cols=9 -N 3 --transport tcp -o all_to_all -s 96,4K -n 2 -w 0
check "DDP_BENCH_CORRUPT=1: gather, scatter (int32, root 1 of 3), sendrecv the same" eval \
    'corrupt_ok ga -N 3 --transport tcp -o gather -d int32 -r 1 -s 96,4K -n 1 -w 0 &&
     corrupt_ok sc -N 3 --transport tcp -o scatter -d int32 -r 1 -s 96,4K -n 1 -w 0 &&
     corrupt_ok sr cols=9 -N 3 --transport tcp -o sendrecv -s 96,4K -n 1 -w 0'

# --- every collective at p = 1, 2, 3 on every transport, checked ---------------------------------
# --transport nccl (device buffers) runs against the fake NCCL and CUDA runtime (tests/fake_nccl): no GPU here.
FAKE=build/fake_nccl
if echo "$TRANSPORTS" | grep -qx nccl; then
    if make -s --no-print-directory $FAKE/libnccl.so.2 $FAKE/libcudart.so.13 > /dev/null 2>&1; then
        export DDP_NCCL_LIBRARY="$PWD/$FAKE/libnccl.so.2" DDP_CUDART_LIBRARY="$PWD/$FAKE/libcudart.so.13"
    else
        TRANSPORTS=$(echo "$TRANSPORTS" | grep -vx nccl)
        n=$((n + 1)); echo "ok $n # skip --transport nccl: the fake NCCL does not build here"
    fi
fi
for tr in $TRANSPORTS; do
    for coll in all_reduce reduce_scatter all_gather broadcast; do
        for p in 1 2 3; do
            coll_ok() {
                run "c_${tr}_${coll}_$p" -N "$p" --transport "$tr" -o "$coll" -r $(($p - 1)) -s 8,100,4K,40K -n 2 -w 1
                f="$tmp/c_${tr}_${coll}_$p.out"
                [ "$rc" = 0 ] || { why "exit $rc:"; cat "$f" "$tmp/c_${tr}_${coll}_$p.err" | tail -8 >> "$tmp/why"; return 1; }
                grep -q '^# Out of bounds values : 0 OK$' "$f" || { why "not '0 OK'"; return 1; }
                [ "$(rows "$f" | wc -l)" = 4 ] || { why "want 4 rows"; return 1; }
            }
            check "$coll p=$p over $tr: every element right, both placements" coll_ok
        done
    done
    # the collectives added later (ddp_reduce ... ddp_send/recv in a group): p = 1 and 3
    for coll in reduce gather scatter all_to_all sendrecv; do
        for p in 1 3; do
            check "$coll p=$p over $tr: every element right" coll_ok
        done
    done
done

# --- every dtype and op of reduce, other dtypes of the rest (p = 3, the last rank the root) -----
dtypes_ok() {
    set -- int8 uint8 int32 uint32 int64 uint64 half float double bfloat16
    for op in sum prod max min avg; do
        for dt in "$@"; do
            run "r_${op}_$dt" -N 3 --transport tcp -o reduce --op "$op" -d "$dt" -r 2 -s 100,4K -n 1 -w 0
            [ "$rc" = 0 ] || { why "reduce $op $dt: exit $rc"; tail -3 "$tmp/r_${op}_$dt.err" >> "$tmp/why"; return 1; }
        done
    done
    for coll in gather scatter all_to_all sendrecv; do
        for dt in int8 half bfloat16 double; do
            run "d_${coll}_$dt" -N 3 --transport tcp -o "$coll" -d "$dt" -r 2 -s 100,4K -n 1 -w 0
            [ "$rc" = 0 ] || { why "$coll $dt: exit $rc"; tail -3 "$tmp/d_${coll}_$dt.err" >> "$tmp/why"; return 1; }
        done
    done
}
check "reduce: every dtype x every op right at p=3 root 2; gather/scatter/all_to_all/sendrecv in 4 dtypes" dtypes_ok

# --- all_to_all and sendrecv have no in-place form: out-of-place columns only, -i 1 refused ------
no_inplace_ok() {
    for coll in all_to_all sendrecv; do
        run "ni_$coll" -N 2 --transport tcp -o "$coll" -s 64 -n 1 -w 0
        [ "$rc" = 0 ] || { why "$coll: exit $rc"; return 1; }
        grep -q "^# in-place: not run, $coll has no in-place form" "$tmp/ni_$coll.out" ||
            { why "$coll: the header does not say in-place is not run"; return 1; }
        grep -q 'in-place lat' "$tmp/ni_$coll.out" && { why "$coll: in-place columns printed"; return 1; }
        # size count type redop root | time algbw busbw #wrong | p50 p99
        [ "$(rows "$tmp/ni_$coll.out" | awk '{ print NF }')" = 11 ] || { why "$coll: want 11 fields"; return 1; }
        run "ni1_$coll" -N 2 --transport tcp -o "$coll" -s 64 -n 1 -w 0 --inplace 1
        [ "$rc" = 2 ] || { why "$coll --inplace 1: exit $rc, want 2"; return 1; }
    done
}
check "all_to_all, sendrecv: in-place not run (said in the header), --inplace 1 refused" no_inplace_ok

# --- sizes and counts as nccl-tests counts them --------------------------------------------------
geometry_ok() {
    run ag4 -N 4 --transport tcp -o all_gather -s 1K -n 1 -w 0
    set -- $(rows "$tmp/ag4.out")
    [ "$1 $2 $4 $5" = "1024 64 none -1" ] || { why "all_gather p=4 1K: got '$1 $2 $4 $5', want '1024 64 none -1'"; return 1; }
    run rs3 -N 3 --transport tcp -o reduce_scatter -s 1K -n 1 -w 0
    set -- $(rows "$tmp/rs3.out")
    [ "$1 $2 $4" = "1020 85 sum" ] || { why "reduce_scatter p=3 1K: got '$1 $2 $4', want '1020 85 sum'"; return 1; }
    run bc3 -N 3 --transport tcp -o broadcast -r 2 -d double -s 1K -n 1 -w 0
    set -- $(rows "$tmp/bc3.out")
    [ "$1 $2 $3 $4 $5" = "1024 128 double none 2" ] || { why "broadcast: got '$1 $2 $3 $4 $5'"; return 1; }
    # nccl-tests: reduce and sendrecv count = size; gather, scatter, alltoall count = size / p
    for want in "reduce 1024 256 sum 2" "gather 1020 85 none 2" "scatter 1020 85 none 2" \
                "all_to_all 1020 85 none -1" "sendrecv 1024 256 none -1"; do
        set -- $want
        coll=$1; w="$2 $3 $4 $5"
        run "g_$coll" -N 3 --transport tcp -o "$coll" -r 2 -s 1K -n 1 -w 0
        set -- $(rows "$tmp/g_$coll.out")
        [ "$1 $2 $4 $5" = "$w" ] || { why "$coll p=3 1K: got '$1 $2 $4 $5', want '$w'"; return 1; }
    done
}
check "size = biggest buffer, count = the call's count (per rank where NCCL's is), redop none, root" geometry_ok

# --- busbw factors (nccl-tests doc/PERFORMANCE.md) ---------------------------------------------
factor_ok() {
    for pair in all_reduce:1.500000 reduce_scatter:0.750000 all_gather:0.750000 broadcast:1.000000 \
                reduce:1.000000 gather:0.750000 scatter:0.750000 all_to_all:0.750000 sendrecv:1.000000; do
        coll=${pair%%:*}; want=${pair#*:}
        run "f_$coll" -N 4 --transport tcp -o "$coll" -s 64K -n 3 -w 1 -J "$tmp/f_$coll.json"
        grep -q "\"busbw_factor\": $want" "$tmp/f_$coll.json" || { why "$coll: busbw_factor is not $want"; return 1; }
        # every row's busbw = algbw * factor
        bad=$(tr ',{}' '\n\n\n' < "$tmp/f_$coll.json" | awk -v f="$want" '
            /"algbw_GBs"/ { split($0, a, ": "); alg = a[2] }
            /"busbw_GBs"/ { split($0, b, ": "); d = b[2] - alg * f; if (d < 0) d = -d; if (d > 1e-5 + 1e-5 * b[2]) print alg, b[2] }')
        [ -z "$bad" ] || { why "$coll: busbw != algbw * $want: $bad"; return 1; }
    done
}
check "busbw = algbw x 2(p-1)/p, (p-1)/p, (p-1)/p, 1; reduce 1, gather/scatter/all_to_all (p-1)/p, sendrecv 1 at p=4 (JSON)" factor_ok

# --- JSON --------------------------------------------------------------------------------------
json_ok() {
    j=$tmp/clean.json
    [ -s "$j" ] || { why "no JSON file"; return 1; }
    for k in '"schema": "ddp-bench/1"' '"collective": "all_reduce"' '"impl": "libddp"' \
             '"transport": "tcp"' '"nranks": 2' '"dtype": "float"' '"op": "sum"' '"date": "' \
             '"host": {"name": ' '"nproc": ' '"placements": \["out-of-place", "in-place"\]' \
             '"wrong": 0' '"results": \['; do
        grep -q "$k" "$j" || { why "JSON lacks $k"; return 1; }
    done
    for k in placement inplace bytes count iters time_us algbw_GBs busbw_GBs p50_us p99_us cpu_cores wrong; do
        [ "$(grep -c "\"$k\": " "$j")" -ge 10 ] || { why "JSON rows lack \"$k\""; return 1; }
    done
    [ "$(grep -c '"placement": "in-place"' "$j")" = 5 ] || { why "want 5 in-place rows"; return 1; }
    if command -v python3 > /dev/null 2>&1; then
        python3 -c 'import json, sys; d = json.load(open(sys.argv[1])); assert len(d["results"]) == 10' "$j" \
            2>> "$tmp/why" || { why "python3 cannot load it"; return 1; }
    fi
}
check "-J: one JSON file with the run's header and a row per size and placement" json_ok

# --- options -------------------------------------------------------------------------------------
options_ok() {
    run only_in -N 2 --transport tcp -s 64 -n 1 -w 0 --inplace 1 -o max
    [ "$rc" = 0 ] || { why "--inplace 1 -o max: exit $rc"; return 1; }
    grep -q 'out-of-place' "$tmp/only_in.out" && { why "--inplace 1 still prints out-of-place"; return 1; }
    [ "$(col "$tmp/only_in.out" 4)" = max ] || { why "-o max (nccl-tests' redop flag) not taken"; return 1; }
    run op_long -N 1 -o reduce_scatter --op min -s 64 -n 1 -w 0
    [ "$(col "$tmp/op_long.out" 4)" = min ] || { why "--op min not taken"; return 1; }
    run bad_o -o nonsense
    [ "$rc" = 2 ] || { why "-o nonsense: exit $rc, want 2"; return 1; }
    run bad_t --transport nonsense -N 1
    [ "$rc" = 2 ] || { why "--transport nonsense: exit $rc, want 2"; return 1; }
    run nocheck -N 2 --transport tcp -s 64 -n 1 -w 0 -c 0
    [ "$rc" = 0 ] && grep -q 'N/A' "$tmp/nocheck.out" || { why "-c 0: exit $rc or no N/A"; return 1; }
}
check "--inplace 1, -o as redop, --op, bad -o/--transport refused (exit 2), -c 0 prints N/A" options_ok

# --- the command line follows nccl-tests' and the usual conventions ------------------------------
help_ok() {
    run help --help
    [ "$rc" = 0 ] || { why "--help: exit $rc, want 0"; return 1; }
    grep -q '^usage: ' "$tmp/help.out" || { why "--help: no usage on stdout"; return 1; }
    [ -s "$tmp/help.err" ] && { why "--help wrote to stderr"; return 1; }
    for w in --minbytes --maxbytes --stepfactor --stepbytes --iters --warmup_iters --agg_iters \
             --check --op --datatype --root --average --timeout --output_file --nthreads --ngpus \
             --parallel_init --transport --nranks --inplace --mem --target-seconds --version; do
        grep -q -- "$w" "$tmp/help.out" || { why "--help does not mention $w"; return 1; }
    done
    run h -h
    [ "$rc" = 0 ] && grep -q '^usage: ' "$tmp/h.out" || { why "-h: exit $rc or no usage on stdout"; return 1; }
}
check "--help and -h: the usage on stdout, nothing on stderr, exit 0" help_ok
version_ok() {
    maj=$(sed -n 's/^#define DDP_VERSION_MAJOR \([0-9]*\).*/\1/p' ddp_base.h)
    min=$(sed -n 's/^#define DDP_VERSION_MINOR \([0-9]*\).*/\1/p' ddp_base.h)
    run version --version
    [ "$rc" = 0 ] || { why "--version: exit $rc"; return 1; }
    [ "$(cat "$tmp/version.out")" = "ddp-bench (libddp) $maj.$min" ] ||
        { why "--version said '$(cat "$tmp/version.out")', want 'ddp-bench (libddp) $maj.$min'"; return 1; }
}
check "--version prints 'ddp-bench (libddp) X.Y' from ddp_base.h, exit 0" version_ok
bad_option_ok() {
    run bad_opt --no-such-option
    [ "$rc" = 2 ] || { why "exit $rc, want 2"; return 1; }
    grep -q "no-such-option" "$tmp/bad_opt.err" && grep -q '^usage: ' "$tmp/bad_opt.err" ||
        { why "stderr lacks the option or the usage"; return 1; }
    [ -s "$tmp/bad_opt.out" ] && { why "wrote to stdout"; return 1; }
    run stray -N 1 stray_word
    [ "$rc" = 2 ] || { why "a stray argument: exit $rc, want 2"; return 1; }
}
check "an unknown option or a stray word: the message and the usage on stderr, exit 2" bad_option_ok
# sizes_ok NAME ARGS...: 8, 16, 32, 64 bytes, each checked
sizes_ok() {
    name=$1; shift
    run "$name" -N 2 -n 1 -w 0 "$@"
    [ "$rc" = 0 ] || { why "exit $rc"; tail -3 "$tmp/$name.err" >> "$tmp/why"; return 1; }
    [ "$(col "$tmp/$name.out" 1 | tr '\n' ' ')" = "8 16 32 64 " ] ||
        { why "sizes $(col "$tmp/$name.out" 1 | tr '\n' ' '), want 8 16 32 64"; return 1; }
    grep -q '^# Out of bounds values : 0 OK$' "$tmp/$name.out" || { why "not '0 OK'"; return 1; }
}
check "-b8 -e64 (values joined to the letters) runs 8 .. 64 B" sizes_ok joined -b8 -e64
check "--minbytes 8 --maxbytes 64 runs 8 .. 64 B" sizes_ok long --minbytes 8 --maxbytes 64
check "--minbytes=8 --maxbytes=64 --stepfactor=2 runs 8 .. 64 B" sizes_ok long_eq --minbytes=8 --maxbytes=64 --stepfactor=2
linear_ok() {
    run linear -N 2 -b 8 -e 64 -i 16 -n 1 -w 0
    [ "$rc" = 0 ] && [ "$(col "$tmp/linear.out" 1 | tr '\n' ' ')" = "8 24 40 56 " ] ||
        { why "exit $rc, sizes $(col "$tmp/linear.out" 1 | tr '\n' ' '), want 8 24 40 56"; return 1; }
    grep -q 'step: 16(bytes)' "$tmp/linear.out" || { why "header does not say step: 16(bytes)"; return 1; }
}
check "-i 16 is nccl-tests' --stepbytes: linear steps 8, 24, 40, 56" linear_ok
threads_ok() {
    run t2 -t 2
    [ "$rc" = 2 ] || { why "-t 2: exit $rc, want 2"; return 1; }
    grep -q -- '--nranks' "$tmp/t2.err" && grep -q 'thread' "$tmp/t2.err" ||
        { why "-t 2 does not explain (threads, --nranks): $(cat "$tmp/t2.err")"; return 1; }
    run tt -t tcp
    [ "$rc" = 2 ] && grep -q -- '--transport' "$tmp/tt.err" || { why "-t tcp: exit $rc or no pointer to --transport"; return 1; }
    run g2 -g 2
    [ "$rc" = 2 ] && grep -q 'one device per rank' "$tmp/g2.err" || { why "-g 2: exit $rc or no explanation"; return 1; }
    run t1 -t 1 -g 1 -p 1 -z 1 -y 0 -G 0 -C 0 -N 2 -s 8 -n 1 -w 0
    [ "$rc" = 0 ] || { why "-t 1 -g 1 -p 1 -z 1 -y 0 -G 0 -C 0: exit $rc"; return 1; }
    for a in "-z 0" "-y 1" "-G 1" "-C 1"; do
        # shellcheck disable=SC2086
        run refused $a
        [ "$rc" = 2 ] && [ -s "$tmp/refused.err" ] || { why "$a: exit $rc, want 2 with a reason"; return 1; }
    done
}
check "-t 2 and -g 2 fail saying what libddp does instead; -t/-g 1, -p, -z 1, -y/-G/-C 0 accepted; -z 0, -y/-G/-C 1 refused" threads_ok
transport_ok() {
    run tr_tcp -N 2 --transport tcp -s 8 -n 1 -w 0
    [ "$rc" = 0 ] && grep -q '^# libddp all_reduce: nranks 2, transport tcp (requested tcp)' "$tmp/tr_tcp.out" ||
        { why "--transport tcp: exit $rc, $(head -1 "$tmp/tr_tcp.out")"; return 1; }
    run_env DDP_TRANSPORT=tcp env_tcp -N 2 -s 8 -n 1 -w 0
    [ "$rc" = 0 ] && grep -q '^# libddp all_reduce: nranks 2, transport tcp (requested tcp)' "$tmp/env_tcp.out" ||
        { why "DDP_TRANSPORT=tcp: exit $rc, $(head -1 "$tmp/env_tcp.out")"; return 1; }
    echo "$TRANSPORTS" | grep -qx shm || return 0
    run_env DDP_TRANSPORT=shm env_shm -N 2 -s 8 -n 1 -w 0
    [ "$rc" = 0 ] && grep -q '^# libddp all_reduce: nranks 2, transport shm (requested shm)' "$tmp/env_shm.out" ||
        { why "DDP_TRANSPORT=shm: exit $rc, $(head -1 "$tmp/env_shm.out")"; return 1; }
    run_env DDP_TRANSPORT=shm env_over -N 2 --transport tcp -s 8 -n 1 -w 0
    grep -q 'transport tcp (requested tcp)' "$tmp/env_over.out" || { why "--transport tcp does not win over DDP_TRANSPORT=shm"; return 1; }
}
check "--transport tcp works; DDP_TRANSPORT=tcp / =shm pick that transport; --transport wins over it" transport_ok
nccl_letters_ok() {
    run agg -N 2 -s 8,4K -n 2 -w 1 -m 3 -a 3 -T 7 -F "$tmp/rows.csv" -J "$tmp/agg.json"
    [ "$rc" = 0 ] || { why "exit $rc"; tail -3 "$tmp/agg.err" >> "$tmp/why"; return 1; }
    grep -q 'agg iters: 3' "$tmp/agg.out" || { why "-m 3 not in the header"; return 1; }
    grep -q 'max over ranks' "$tmp/agg.out" || { why "-a 3 not in the header"; return 1; }
    grep -q 'DDP_TIMEOUT_MS=7000' "$tmp/agg.out" || { why "-T 7 did not reach the ranks as DDP_TIMEOUT_MS=7000"; return 1; }
    grep -q '"agg_iters": 3' "$tmp/agg.json" || { why "JSON lacks agg_iters 3"; return 1; }
    [ "$(head -1 "$tmp/rows.csv")" = "size,count,type,redop,root,placement,time_us,algbw_GBs,busbw_GBs,wrong,p50_us,p99_us" ] ||
        { why "-F: bad CSV header"; return 1; }
    [ "$(wc -l < "$tmp/rows.csv")" = 5 ] || { why "-F: want 4 rows (2 sizes x 2 placements)"; return 1; }
    for a in 0 1 2; do
        run "avg$a" -N 2 -s 8 -n 1 -w 0 -a "$a"
        [ "$rc" = 0 ] || { why "-a $a: exit $rc"; return 1; }
    done
    run avg4 -a 4
    [ "$rc" = 2 ] || { why "-a 4: exit $rc, want 2"; return 1; }
}
check "-m agg_iters, -a average, -T timeout (DDP_TIMEOUT_MS), -F CSV: as nccl-tests' letters" nccl_letters_ok

# --- the chart ---------------------------------------------------------------------------------
chart_ok() {
    $T "$C" -o "$tmp/c.svg" "$tmp/clean.json" "$tmp/f_all_reduce.json=custom <label>" 2> "$tmp/why" || return 1
    for k in '<svg ' '<polyline' 'libddp tcp p=2' 'custom &lt;label&gt;' '>8B<' '>1K<' '>64K<' \
             'bus bandwidth' 'message size' '</svg>'; do
        grep -q -- "$k" "$tmp/c.svg" || { why "SVG lacks $k"; return 1; }
    done
    [ "$(grep -c '<polyline' "$tmp/c.svg")" = 2 ] || { why "want 2 lines"; return 1; }
    echo '{"results": 3}' > "$tmp/bad.json"
    $T "$C" -o "$tmp/bad.svg" "$tmp/bad.json" 2> /dev/null && { why "accepted a file without a results array"; return 1; }
    return 0
}
check "svg_chart: a line per file, legend labels (escaped), size labels, axis titles" chart_ok

# --- make bench's script, tiny --------------------------------------------------------------------
sweep_ok() {
    COLLS="all_reduce broadcast" NP=2 TRANSPORTS=tcp MAXBYTES=1K FACTOR=8 TARGET_S=0.01 WARMUP=1 \
        BENCH=$B CHART=$C OUT=$tmp/res $T bash bench/sweep.sh > "$tmp/sweep.out" 2>&1 ||
        { why "sweep.sh failed"; tail -5 "$tmp/sweep.out" >> "$tmp/why"; return 1; }
    for f in all_reduce_tcp_p2.json all_reduce_tcp_p2.txt broadcast_tcp_p2.json busbw.svg \
             busbw_all_reduce.svg busbw_broadcast.svg; do
        [ -s "$tmp/res/$f" ] || { why "no $f"; return 1; }
    done
}
check "bench/sweep.sh (make bench) writes <coll>_<transport>_p<N>.json and busbw.svg" sweep_ok

# --- the Open MPI peer builds from the same header and checks alike (skipped without mpicc) ----
if command -v mpicc > /dev/null 2>&1 && command -v mpirun > /dev/null 2>&1; then
    mpi_ok() {
        mpicc -std=c99 -O2 -Wall -Wextra -Wpedantic -Werror bench/mpi_allreduce_bench.c \
            -o "$tmp/mpi_bench" -lm 2> "$tmp/why" || return 1
        for coll in all_reduce reduce_scatter all_gather broadcast reduce gather scatter all_to_all sendrecv; do
            $T mpirun --allow-run-as-root --oversubscribe -np 3 --mca pml ob1 --mca btl self,tcp \
                --mca btl_tcp_if_include lo --mca mpi_yield_when_idle 1 "$tmp/mpi_bench" -o "$coll" \
                -r 1 -s 96,4K -n 1 -w 0 > "$tmp/mpi_$coll.out" 2>&1 || { why "$coll: exit $?"; tail -5 "$tmp/mpi_$coll.out" >> "$tmp/why"; return 1; }
            grep -q '^# Out of bounds values : 0 OK$' "$tmp/mpi_$coll.out" || { why "$coll: not 0 OK"; return 1; }
        done
    }
    check "mpi_allreduce_bench: every collective at p=3 (root 1), both placements where there are two, every element right" mpi_ok
else
    n=$((n + 1)); echo "ok $n # skip no mpicc/mpirun (apt-get install openmpi-bin libopenmpi-dev)"
fi

echo "1..$n"
