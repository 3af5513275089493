#!/bin/sh
# SPDX-License-Identifier: MIT (see LICENSE)
# tests/test_bench_compare.sh — the machine's limits in `make compare`: bench/compare_summary.py
# on canned raw results (the share of each libddp configuration's limit, paired per round, in the
# table, the markdown and the JSON), and the two limit programs (bench/mem_limit.c, bench/tcp_stream.c
# --bidir) with tiny sizes. Run from the repository root (prove tests/test_bench_compare.sh);
# prints TAP. Every run is bounded by timeout; the file takes a few seconds.
set -u

CC=${CC:-cc}
CFLAGS_T="-std=c99 -O2 -Wall -Wextra -Wpedantic -Werror -I."
tmp=$(mktemp -d "${TMPDIR:-/tmp}/bench_compare_test.XXXXXX") || { echo "Bail out! mktemp failed"; exit 1; }
trap 'rm -rf "$tmp"' EXIT
T="timeout -k 2 60"

# shellcheck source=tests/tap.sh
. "$(dirname "$0")/tap.sh"   # ok, notok, check, why
command -v python3 > /dev/null || { echo "1..0 # SKIP python3 is missing (compare_summary.py is python)"; exit 0; }

# --- canned raw results: p = 2, two rounds, 1 MiB and 4 KiB ---------------------------------
# The shares are chosen so that pairing per round differs from dividing the medians:
#   ddp_shm:     round 1 4 / memcpy 10 = 0.40, round 2 18 / 20 = 0.90 -> median 0.65 (7 / 15 would be 0.73)
#   ddp_shm_reg: 8 / 10 = 0.80, 19 / 20 = 0.95 -> 0.88 (0.875)
#   ddp_tcp:     1.0 / bidir 2.0 = 0.50, 1.5 / 2.5 = 0.60 -> 0.55
raw=$tmp/raw
mkdir -p "$raw"
bench_json() {   # NAME BUSBW_1MIB: a ddp-bench JSON with rows at 4 KiB and 1 MiB
    cat > "$raw/$1.json" << EOF
{"bench": "ddp-bench", "description": "libddp test", "collective": "all_reduce", "nranks": 2,
 "results": [
  {"bytes": 4096, "busbw_GBs": 0.5, "time_us": 10.0, "p50_us": 10.0, "p99_us": 12.0, "inplace": 1, "wrong": 0},
  {"bytes": 1048576, "busbw_GBs": $2, "time_us": 100.0, "p50_us": 100.0, "p99_us": 120.0, "inplace": 1, "wrong": 0}]}
EOF
    echo "1.0 1.0 0.0" > "$raw/$1.load"
}
mem_json() {   # NAME MEMCPY ADD
    printf '{"bench": "mem_limit", "mode": "mem_limit", "results": [{"bytes": 1048576, "memcpy_GBs": %s, "add_GBs": %s}]}\n' \
        "$2" "$3" > "$raw/$1.json"
    echo "1.0 1.0 0.0" > "$raw/$1.load"
}
tcp_json() {   # NAME GBS_PER_DIRECTION
    printf '{"bench": "tcp_stream", "mode": "bidir", "bidir": [{"bytes": 1048576, "GBs_per_direction": %s}]}\n' \
        "$2" > "$raw/$1.json"
    echo "1.0 1.0 0.0" > "$raw/$1.load"
}
bench_json ddp_shm_p2_r1 4.0
bench_json ddp_shm_p2_r2 18.0
bench_json ddp_shm_reg_p2_r1 8.0
bench_json ddp_shm_reg_p2_r2 19.0
bench_json ddp_tcp_p2_r1 1.0
bench_json ddp_tcp_p2_r2 1.5
mem_json limit_mem_p2_r1 10.0 7.0
mem_json limit_mem_p2_r2 20.0 9.0
tcp_json limit_tcp_p2_r1 2.0
tcp_json limit_tcp_p2_r2 2.5

summarize() {   # RAWDIR OUTDIR: compare_summary.py's terminal output in OUTDIR/summary.txt
    mkdir -p "$2"
    RAW=$1 OUT=$2/compare.json NP=2 ROUNDS=2 LIMIT_S=0.2 LIMIT_SIZES=1M $T python3 bench/compare_summary.py \
        > "$2/summary.txt" 2>&1
}
runs_ok() {
    summarize "$raw" "$tmp/out" || { why "compare_summary.py failed:"; tail -5 "$tmp/out/summary.txt" >> "$tmp/why"; return 1; }
}
check "compare_summary.py runs on canned results with limits" runs_ok

# share_row TEXT: the 1 MiB row of the share table
share_row() { awk '/^Share of the machine/ { s = 1 } s && $1 == "1MiB" { print; exit }' "$tmp/out/summary.txt"; }
table_ok() {
    row=$(share_row)
    [ -n "$row" ] || { why "no 'Share of the machine's limit' table with a 1MiB row"; return 1; }
    # size | memcpy a+b tcp2way | tcp GB/s share | shm GB/s share | shm reg GB/s share
    # shellcheck disable=SC2046 # the row's fields
    set -- $(echo "$row" | tr -d '|!')
    [ "$2 $3 $4" = "15.00 8.000 2.250" ] || why "limits (memcpy a+b tcp2way) '$2 $3 $4', expected medians '15.00 8.000 2.250'"
    [ "$6" = 0.55 ] || why "libddp tcp share '$6', expected 0.55 (1.0/2.0 and 1.5/2.5)"
    [ "$8" = 0.65 ] || why "libddp shm share '$8', expected 0.65 (per round 0.40 and 0.90; 0.73 would be median/median)"
    [ "${10}" = 0.88 ] || why "libddp shm reg share '${10}', expected 0.88"
    grep -q '/tcp2way' "$tmp/out/summary.txt" || why "the header does not name the tcp limit (/tcp2way)"
    [ ! -s "$tmp/why" ] || { why "row: $row"; return 1; }
}
check "the share table: limits and libddp shm, shm reg, tcp over them, paired per round" table_ok

scale_ok() {
    for w in "memcpy, one thread" "c = a + b" "both directions at once"; do
        grep "^For scale, beside every round" "$tmp/out/summary.txt" | grep -q "$w" ||
            why "no 'For scale' line with '$w'"
    done
    [ ! -s "$tmp/why" ]
}
check "the 'For scale' lines name memcpy, a+b and the loopback both ways" scale_ok

json_ok() {
    if ! python3 - "$tmp/out/compare.json" > "$tmp/json.txt" 2>&1 << 'EOF'
import json, sys
d = json.load(open(sys.argv[1]))
rounds = d["limits"]["per_round"]
assert [(r["nranks"], r["round"]) for r in rounds] == [(2, 1), (2, 2)], rounds
assert rounds[0]["memcpy"]["GBs"]["1048576"] == 10.0 and rounds[1]["bidir"]["GBs"]["1048576"] == 2.5, rounds
assert rounds[1]["add"]["GBs"]["1048576"] == 9.0, rounds
row = [r for r in d["tables"]["2"] if r["bytes"] == 1048576][0]
sh = row["shares"]
assert abs(sh["ddp_shm/memcpy"]["share"] - 0.65) < 1e-9, sh
assert abs(sh["ddp_shm_reg/memcpy"]["share"] - 0.875) < 1e-9, sh
assert abs(sh["ddp_tcp/bidir"]["share"] - 0.55) < 1e-9, sh
assert row["limits"]["memcpy"]["GBs"] == 15.0, row["limits"]
assert "Share of the machine's limit" in d["markdown"], "markdown"
EOF
    then
        why "$(tail -3 "$tmp/json.txt")"
        return 1
    fi
}
check "the JSON carries the limits per round and the shares per size" json_ok

# A 4 KiB row has no limit (the limits start at 64 KiB): no share, and no failure.
small_ok() {
    awk '/^Share of the machine/ { s = 1 } s && $1 == "4KiB" { f = 1 } END { exit f }' "$tmp/out/summary.txt" ||
        { why "a share row for 4 KiB, where no limit was measured"; return 1; }
}
check "sizes without a limit get no share row" small_ok

# Without limit files (an old run, LIMITS=0) the summary is what it was: no share table.
old_ok() {
    mkdir -p "$tmp/raw_old"
    cp "$raw"/ddp_* "$tmp/raw_old/"
    summarize "$tmp/raw_old" "$tmp/out_old" || { why "compare_summary.py failed without limits"; return 1; }
    ! grep -q "Share of the machine" "$tmp/out_old/summary.txt" || { why "a share table without limits"; return 1; }
    grep -q "libddp shm" "$tmp/out_old/summary.txt" || { why "no libddp shm column"; return 1; }
}
check "without limit runs: the peer tables alone, as before" old_ok

# A disturbed limit run (others used 1 core meanwhile) is not the median when an undisturbed one exists.
disturbed_ok() {
    mkdir -p "$tmp/raw_dist"
    cp "$raw"/* "$tmp/raw_dist/"
    echo "1.0 1.0 1.0" > "$tmp/raw_dist/limit_mem_p2_r2.load"
    summarize "$tmp/raw_dist" "$tmp/out_dist" || { why "compare_summary.py failed"; return 1; }
    row=$(awk '/^Share of the machine/ { s = 1 } s && $1 == "1MiB" { print; exit }' "$tmp/out_dist/summary.txt")
    [ -n "$row" ] || { why "no share table with a 1MiB row"; return 1; }
    # shellcheck disable=SC2046 # the row's fields
    set -- $(echo "$row" | tr -d '|')
    [ "$2" = 10.00 ] || why "memcpy '$2' with round 2 disturbed, expected round 1's 10.00"
    # shm: round 1 4 / 10; round 2's own limit (20) was disturbed: 18 / the undisturbed median 10
    [ "$8" = 1.10 ] || why "libddp shm share '$8', expected 1.10 (0.40 and 18 / 10 = 1.80)"
    [ ! -s "$tmp/why" ] || { why "row: $row"; return 1; }
}
check "a disturbed limit run is left out of the limit's median and of the shares" disturbed_ok

# --- the limit programs, tiny ---------------------------------------------------------------
build_ok() {
    # shellcheck disable=SC2086 # CC and CFLAGS_T are lists of words
    $CC $CFLAGS_T bench/mem_limit.c -o "$tmp/mem_limit" 2> "$tmp/why" &&
        $CC $CFLAGS_T bench/tcp_stream.c -o "$tmp/tcp_stream" -lm 2>> "$tmp/why"
}
check "mem_limit and tcp_stream build (C99, -Wall -Wextra -Wpedantic -Werror)" build_ok

mem_ok() {
    $T "$tmp/mem_limit" -s 64K,1M -t 0.01 -J "$tmp/mem.json" > "$tmp/mem.out" 2>&1 ||
        { why "mem_limit failed: $(tail -2 "$tmp/mem.out")"; return 1; }
    python3 -c '
import json, sys
d = json.load(open(sys.argv[1]))
r = d["results"]
assert [x["bytes"] for x in r] == [65536, 1048576], r
assert all(x["memcpy_GBs"] > 0 and x["add_GBs"] > 0 and x["memcpy_calls"] >= 2 for x in r), r
' "$tmp/mem.json" 2> "$tmp/py.err" || { why "mem_limit JSON: $(tail -1 "$tmp/py.err")"; return 1; }
}
check "mem_limit -s 64K,1M: memcpy and a+b GB/s per size in its JSON" mem_ok

bidir_ok() {
    $T "$tmp/tcp_stream" --bidir -s 64K,1M -T 0.01 -J "$tmp/bidir.json" > "$tmp/bidir.out" 2>&1 ||
        { why "tcp_stream --bidir failed: $(tail -2 "$tmp/bidir.out")"; return 1; }
    python3 -c '
import json, sys
d = json.load(open(sys.argv[1]))
r = d["bidir"]
assert d["mode"] == "bidir" and [x["bytes"] for x in r] == [65536, 1048576], d
assert all(x["GBs_per_direction"] > 0 and x["bytes_per_direction"] >= 2 * x["bytes"] for x in r), r
' "$tmp/bidir.json" 2> "$tmp/py.err" || { why "tcp_stream --bidir JSON: $(tail -1 "$tmp/py.err")"; return 1; }
}
check "tcp_stream --bidir -s 64K,1M: GB/s per direction per size in its JSON" bidir_ok

bad_ok() {
    "$tmp/mem_limit" -s 64K,x > /dev/null 2>&1; a=$?
    "$tmp/tcp_stream" --bidir -s ,1M > /dev/null 2>&1; b=$?
    "$tmp/tcp_stream" -s 1M > /dev/null 2>&1; c=$?
    [ "$a $b $c" = "2 2 2" ] || { why "exit statuses '$a $b $c' for bad size lists, expected '2 2 2'"; return 1; }
}
check "a malformed size list is refused (exit 2)" bad_ok

echo "1..$n"
