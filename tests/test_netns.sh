#!/bin/sh
# SPDX-License-Identifier: MIT (see LICENSE)
# tests/test_netns.sh — libddp across real network hops: three "hosts" made of network
# namespaces on a Linux bridge (issue 14). Run from the repository root (prove
# tests/test_netns.sh); prints TAP. Needs root, `ip` (iproute2) with working `ip netns`, and
# for the packet-loss case `nft` (apt-get install -y nftables); elsewhere it skips.
#
#   switch namespace: bridge br0, ports h1 h2 h3 (veth)
#   host 1 (10.77.0.1): ranks 0 and 1, rank 0 serves the store    host 2 (10.77.0.2): ranks 2, 3
#   host 3 (10.77.0.3): rank 4
#
# Each rank is build/netns_rank (tests/netns_rank.c, compiled here with the Makefile's flags)
# started by hand with RANK WORLD_SIZE MASTER_ADDR MASTER_PORT DDP_JOB_SECRET, transport auto:
#   1. every collective at sizes 0 .. 1 MiB gives exact results on every rank, and the
#      transport per peer is shm inside a namespace and tcp across (the host identity includes
#      the network namespace);
#   2. 1% packet loss each way on host 2's link (nftables in the switch; no netem needed): 200
#      all-reduces of 64 KiB are all exact, data segments were lost both ways, and their
#      senders resent them (why this cannot fail by chance: at the loss section below);
#   3. a late link: host 3's port comes up 5 s after its rank started; the rank must keep trying
#      the master and join;
#   4. a silent host: the same cut with a collective timeout of 60 s; the health threads'
#      heartbeats find it within DDP_HEARTBEAT_TIMEOUT_MS=3000 and name it unreachable;
#   4b. a cut link: host 2's bridge port goes down while the ranks loop over all-reduces
#      (DDP_TIMEOUT_MS=3000); every rank returns an error instead of hanging, and the connected
#      hosts' messages name a rank of the cut host as the stuck one;
#   5. the hierarchical and Rabenseifner all-reduces (issue 18): on 2 hosts x 2 ranks and on 3
#      hosts with 2+1+2 ranks, for DDP_ALGO = hier_ring hier_rd hier_rabenseifner rabenseifner
#      auto, netns_rank's matrix (dtype x op x count 0 1 3 7 1001 65537 and one past 1 MiB, in
#      and out of place; all_reduce, and under auto every collective) is exact on every rank,
#      every rank holds the same bits, and the trace (DDP_TRACE) shows that the all-reduces ran
#      the algorithm asked for.
# Names carry the shell's pid, so parallel runs cannot collide; nothing is created in the
# calling namespace, and the namespaces (with the bridge and the ranks in them) go at exit.
# Every rank runs under a hard `timeout`: the test cannot hang. The namespaces are made by
# tests/netns_lib.sh (shared with bench/netns_bench.sh). 40-50 s on 2 quiet cores, ~85 s beside
# a CPU hog (the hierarchical matrix is 10 runs of 2-4 s each).
#
#   NETNS_LOSS_PERCENT=P   section 2's loss rate, an integer 0-100 (default 1). 0 is for
#                          seeing the loss check fail: it must say that nothing was dropped.
set -u

CC=${CC:-cc}
R=build/netns_rank
TIMEOUT_MS=3000
ALGOS="hier_ring hier_rd hier_rabenseifner rabenseifner auto"
LOSS_PCT=${NETNS_LOSS_PERCENT:-1}
case $LOSS_PCT in
    ''|*[!0-9]*) echo "Bail out! NETNS_LOSS_PERCENT='$LOSS_PCT': want an integer 0-100"; exit 1 ;;
esac
[ "$LOSS_PCT" -le 100 ] || { echo "Bail out! NETNS_LOSS_PERCENT=$LOSS_PCT: want an integer 0-100"; exit 1; }
# shellcheck source=tests/netns_lib.sh
. "$(dirname "$0")/netns_lib.sh"
tmp=$(mktemp -d "${TMPDIR:-/tmp}/netns_test.XXXXXX") || { echo "Bail out! mktemp failed"; exit 1; }
rank_pids=""
# The ranks of a run still going (interrupted), then anything left in our namespaces.
cleanup() {
    for p in $rank_pids; do kill "$p" 2>/dev/null; done
    netns_destroy
    rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 1' HUP INT TERM
unset DDP_HOST_ID DDP_TRANSPORT DDP_SOCKET_IFNAME DDP_TIMEOUT_MS DDP_DEBUG DDP_JOB_SECRET \
      LOCAL_RANK LOCAL_WORLD_SIZE RANK WORLD_SIZE MASTER_ADDR MASTER_PORT

skip_all() { echo "1..0 # SKIP $1"; exit 0; }
[ "$(id -u)" = 0 ] || skip_all "needs root (network namespaces and a bridge)"
command -v ip > /dev/null || skip_all "no ip command (apt-get install -y iproute2)"
command -v timeout > /dev/null || skip_all "no timeout command (coreutils)"

# --- the hosts: every step must work, else this machine cannot run the test ------------------
netns_create "ddpt$$" 3 || skip_all "$netns_why"
NSS=$NETNS_SW NS1=$(netns_ns 1) NS2=$(netns_ns 2) NS3=$(netns_ns 3)

echo "1..$((15 + 2 * $(echo $ALGOS | wc -w)))"
. "$(dirname "$0")/tap.sh"   # ok, notok, check, why
now_ms() { date +%s%3N; }
diag() { sed 's/^/#   /' "$@"; }

# The ranks per host of the next start (host-major numbering): 2+2+1 except in section 5.
use_layout() { netns_layout "$1"; WORLD=$NETNS_WORLD; }
use_layout 2,2,1
# host_of RANK: the namespace of a rank.
host_of() { netns_ns "$(netns_host_of "$1")"; }
secret=$(od -An -tx1 -N16 /dev/urandom | tr -d ' \n')

# start CASE PORT LIMIT_S ENV... -- ARGS...: every rank of the world in its namespace, in the
# background, output in $tmp/CASE.RANK.{out,err}; pids in $rank_pids (rank order). LIMIT_S only
# ends a hang: it is far above what a case takes on a busy machine (other tests run beside).
start() {
    c=$1 port=$2 lim=$3; shift 3
    envs=""
    while [ $# -gt 0 ] && [ "$1" != -- ]; do envs="$envs $1"; shift; done
    shift
    rank_pids=""
    for r in $(seq 0 $((WORLD - 1))); do
        # shellcheck disable=SC2086 # $envs is a list of NAME=VALUE words
        env RANK=$r WORLD_SIZE=$WORLD MASTER_ADDR=10.77.0.1 MASTER_PORT=$port DDP_JOB_SECRET=$secret $envs \
            timeout -k 2 "$lim" ip netns exec "$(host_of $r)" "$R" "$@" \
            > "$tmp/$c.$r.out" 2> "$tmp/$c.$r.err" &
        rank_pids="$rank_pids $!"
    done
}
# finish: waits for the ranks of the last start; their exit codes in rc_0 .. rc_<WORLD-1>.
finish() {
    r=0
    for p in $rank_pids; do wait "$p" 2>/dev/null; eval "rc_$r=$?"; r=$((r + 1)); done
    rank_pids=""
}
rc_of() { eval "echo \$rc_$1"; }

# --- 1: build --------------------------------------------------------------------------------
mkdir -p build
build() {
    # up to date: newer than its source and every header
    [ -x "$R" ] && [ -z "$(find tests/netns_rank.c tests/*.h ./*.h transports/*.h -newer "$R" 2>/dev/null)" ] && return 0
    $CC -std=c99 -O2 -Wall -Wextra -Wpedantic -Werror -I. -DT_IMPL_SHM=1 tests/netns_rank.c tests/libddp.c -o "$R" -pthread -lm \
        2> "$tmp/cc.err" && return 0
    why "$CC failed, want a clean build; its first messages:"
    head -8 "$tmp/cc.err" >> "$tmp/why"
    return 1
}
check "tests/netns_rank.c builds (C99, -Wall -Wextra -Wpedantic -Werror)" build
[ -x "$R" ] || { echo "Bail out! no $R"; exit 1; }

# --- 2-4: collectives across the bridge --------------------------------------------------------
t0=$(now_ms)
start coll 29501 180 -- coll
finish
echo "# collectives: $(($(now_ms) - t0)) ms"
coll_exit() {
    for r in $(seq 0 $((WORLD - 1))); do
        [ "$(rc_of $r)" = 0 ] || { why "rank $r exited $(rc_of $r), want 0 (124/137: killed by the hard timeout)"
                                   grep -v ' PASS ' "$tmp/coll.$r.out" | grep -v ' via ' | head -5 >> "$tmp/why"
                                   head -5 "$tmp/coll.$r.err" >> "$tmp/why"; }
    done
    [ ! -s "$tmp/why" ]
}
check "5 ranks on 3 hosts (2+2+1): init over the bridge, every rank exits 0" coll_exit
coll_pass() {
    grep ' PASS ' "$tmp/coll.0.out" | sed 's/^rank [0-9]*: //' > "$tmp/pass0"
    npass=$(wc -l < "$tmp/pass0")
    [ "$npass" -ge 40 ] || why "rank 0 reported $npass checks passed, want >= 40"
    for r in $(seq 0 $((WORLD - 1))); do
        grep ' FAIL ' "$tmp/coll.$r.out" | head -5 >> "$tmp/why"
        grep ' PASS ' "$tmp/coll.$r.out" | sed 's/^rank [0-9]*: //' | cmp -s - "$tmp/pass0" ||
            why "rank $r did not pass the same checks as rank 0 ($(grep -c " PASS " "$tmp/coll.$r.out") PASS lines, rank 0: $npass)"
    done
    grep -q '^PASS barrier$' "$tmp/pass0" || why "no PASS for the final barrier"
    [ ! -s "$tmp/why" ]
}
check "all_reduce (float32/int32, sum/avg, 0..1 MiB), broadcast (every root), all_gather, reduce_scatter: exact on every rank" coll_pass
coll_transport() {
    for r in $(seq 0 $((WORLD - 1))); do
        for p in $(seq 0 $((WORLD - 1))); do
            [ "$p" = "$r" ] && continue
            want=tcp; [ "$(host_of $r)" = "$(host_of $p)" ] && want=shm
            got=$(sed -n "s/^rank $r: peer $p via //p" "$tmp/coll.$r.out")
            [ "$got" = "$want" ] || why "rank $r to rank $p: via '$got', want $want"
        done
    done
    [ ! -s "$tmp/why" ]
}
check "transport per peer: shm within a namespace, tcp across namespaces (never shm across)" coll_transport

# --- 5-14: hierarchical and Rabenseifner all-reduces (issue 18) ------------------------------
# One run of `netns_rank matrix` per (layout, DDP_ALGO), with DDP_TRACE on: all_reduce only
# (DDP_ALGO chooses nothing else), and every collective under auto. One TAP line for all of it: every rank exits 0 having passed its whole matrix; the hash files (one line per
# case whose result every rank holds) are the same on every rank; and the all-reduces with
# count > 0 ran the algorithm asked for ("algorithm" of the trace's all_reduce events; auto may
# pick any, its mix is printed). 2 hosts x 2 ranks: two slices, each all-reduced across hosts by
# the ranks of one local index. 2+1+2 on 3 hosts: hosts of different sizes, and a host of one
# rank that is every slice's member there.
# want_algo ALGO: the trace's names DDP_ALGO=ALGO may run, one a line (hier_rd turns to
# Rabenseifner across hosts when a slice outgrows the scratch, as ddp_comm_dispatch.h documents).
want_algo() {
    case $1 in
        hier_ring) echo "hierarchical (ring across hosts)" ;;
        hier_rd) printf '%s\n' "hierarchical (recursive doubling across hosts)" "hierarchical (rabenseifner across hosts)" ;;
        hier_rabenseifner) echo "hierarchical (rabenseifner across hosts)" ;;
        rabenseifner) echo "rabenseifner" ;;
    esac
}
# algos_of CASE RANK: "N name" per all-reduce algorithm in that rank's trace (count > 0 only).
algos_of() {
    sed -n 's/.*"name":"all_reduce".*"count":\([0-9]*\),.*"algorithm":"\([^"]*\)".*/\1|\2/p' "$tmp/$1.trace.$2.json" 2>/dev/null |
        awk -F'|' '$1 != 0 { print $2 }' | sort | uniq -c | sed 's/^ *//'
}
matrix_ok() {
    c=$1 algo=$2
    for r in $(seq 0 $((WORLD - 1))); do
        [ "$(rc_of $r)" = 0 ] || why "rank $r exited $(rc_of $r), want 0 (124/137: killed by the hard timeout)"
        grep -q ' PASS matrix: ' "$tmp/$c.$r.out" 2>/dev/null && continue
        grep ' FAIL ' "$tmp/$c.$r.out" | head -4 >> "$tmp/why"
        grep -v ' WARN ' "$tmp/$c.$r.err" | head -3 >> "$tmp/why"
    done
    [ ! -s "$tmp/why" ] || return 1
    nh=$(wc -l < "$tmp/$c.hash.0")
    [ "$nh" -ge 400 ] || why "rank 0 hashed $nh results, want >= 400"
    for r in $(seq 1 $((WORLD - 1))); do
        cmp -s "$tmp/$c.hash.0" "$tmp/$c.hash.$r" && continue
        why "rank $r's results are not rank 0's bits (< rank 0, > rank $r):"
        diff "$tmp/$c.hash.0" "$tmp/$c.hash.$r" | grep '^[<>]' | head -4 >> "$tmp/why"
    done
    want_algo "$algo" > "$tmp/want"
    for r in $(seq 0 $((WORLD - 1))); do
        algos_of "$c" $r > "$tmp/algos"
        [ -s "$tmp/algos" ] || { why "rank $r: no all_reduce in its trace ($tmp/$c.trace.$r.json)"; continue; }
        [ $r = 0 ] && echo "# $c: rank 0's all-reduces (count > 0): $(paste -sd, "$tmp/algos" | sed 's/,/, /g')"
        [ -s "$tmp/want" ] || continue
        if cut -d' ' -f2- "$tmp/algos" | grep -vxF -f "$tmp/want" > "$tmp/other"; then
            why "rank $r: DDP_ALGO=$algo, but all-reduces ran: $(paste -sd, "$tmp/algos" | sed 's/,/, /g')"
        fi
    done
    [ ! -s "$tmp/why" ]
}
mport=29510
for lay in 2,2 2,1,2; do
    use_layout $lay
    for algo in $ALGOS; do
        c=m$(echo $lay | tr -d ,)_$algo colls=all_reduce what="all_reduce"
        [ $algo = auto ] && colls="" what="every collective"
        t0=$(now_ms)
        start "$c" $mport 90 DDP_ALGO=$algo "DDP_TRACE=$tmp/$c.trace.%r.json" -- matrix "$tmp/$c.hash" $colls
        finish
        echo "# $c: $(($(now_ms) - t0)) ms"
        mport=$((mport + 1))
        check "DDP_ALGO=$algo, $NETNS_NHOSTS hosts with $(echo $lay | tr , +) ranks: $what x dtype x op x count exact, the same bits on every rank, all-reduces by $algo" \
            matrix_ok "$c" $algo
    done
done
use_layout 2,2,1

# --- 15-17: packet loss on host 2's link --------------------------------------------------------
# The switch loses LOSS_PCT% of the frames on host 2's port each way, at random (nftables'
# bridge family in the switch namespace; numgen random, as this nft has no "meta random"), as a
# bad cable would. Neither end's TCP hears of a loss there, so each data segment lost must be
# sent again by its sender, which counts it in its namespace's RetransSegs (/proc/net/snmp):
# host 2 for what it sent, hosts 1 and 3 for what they sent it.
#   This once dropped in host 2's own input and output hooks and read host 2's RetransSegs
# alone. An output-hook drop is no loss to TCP: the verdict comes back as the send's error, and
# what TCP does then varies (one stream, ~140 segments dropped so: RetransSegs +0, +1, +203,
# +1017 over four runs; dropped at the receiver's input hook: +154, +196, about one a loss).
# Host 2's count came from side effects (lost ACKs, tail-loss probes: 5-34 a run, 0 with
# outgoing drops only), so it could come up 0 by chance, and the `not ok` line said nothing.
#   Counted each way: every frame, the TCP segments that carry data (IP length over 80: a bare
# ACK's IP and TCP headers, every option included, take at most 20 + 60 bytes), and the lost of
# both. Offload is cut to one segment a packet (gso_max_segs 1), so a frame is one wire-sized
# segment: 200 all-reduces of 64 KiB make 12,641-12,847 data segments each way (18 runs, quiet
# and beside CPU hogs); left to offload, a direction carried ~680 packets (0.99^680 = 1e-3). At
# p% the chance that N segments lose none is (1 - p/100)^N: 0.99^12,641 = 7e-56. The check wants
# N >= loss_min_data, from where that chance is below 1e-9 (2,062 at 1%), so it fails for a
# cause (offload back, traffic gone), not by chance. A lost data segment raises its sender's
# RetransSegs for certain: the results were exact, so the data got through later, which only a
# retransmission can do (had the lost segment been one, it was counted already); measured,
# resent >= lost every run. Only the teardown's few segments after the last all-reduce may be
# resent after the count is read; all of a direction's ~127 losses landing there has no chance
# worth writing down.
LOSS_N=200
loss_chains() {   # DIR (out, in): that direction's counters and chains
    cat <<NFT
    counter $1_frames { }
    counter $1_data { }
    counter $1_frames_lost { }
    counter $1_data_lost { }
    chain $1 {
        counter name $1_frames
        ip protocol tcp ip hdrlength 5 ip length > 80 counter name $1_data
        numgen random mod 100 < $LOSS_PCT jump $1_lose
    }
    chain $1_lose {
        counter name $1_frames_lost
        ip protocol tcp ip hdrlength 5 ip length > 80 counter name $1_data_lost
        drop
    }
NFT
}
load_loss() {
    { echo "table bridge ddploss {"
      loss_chains out; loss_chains in
      printf '    chain forward {\n        type filter hook forward priority 0; policy accept;\n'
      printf '        iifname "h2" jump out\n        oifname "h2" jump in\n    }\n}\n'
    } | ip netns exec "$NSS" nft -f - 2> "$tmp/nft.err"
}
# nft_count NAME: the packets of counter NAME in $tmp/nft (nft's listing of the table)
nft_count() { awk -v c="$1" '$1 == "counter" && $2 == c { f = 1; next } f && $1 == "packets" { print $2; exit }' "$tmp/nft"; }
# retrans H: host H's TCP RetransSegs (segments its TCP has sent again, since boot)
retrans() {
    ip netns exec "$(netns_ns "$1")" awk '/^Tcp:/ && !c { for (i = 1; i <= NF; i++) if ($i == "RetransSegs") c = i; next }
                                         /^Tcp:/ { print $c }' /proc/net/snmp
}
# loss_min_data: the fewest data segments a direction may carry, where losing none at
# LOSS_PCT% has a chance below 1e-9 (0 at 0%: then the check fails on "0 lost").
loss_min_data() {
    awk -v p="$LOSS_PCT" 'BEGIN { if (p == 0) { print 0; exit } if (p == 100) { print 1; exit }
                                  n = log(1e-9) / log(1 - p / 100); print (n == int(n)) ? n : int(n) + 1 }'
}
d_rules="$LOSS_PCT% loss: the switch drops $LOSS_PCT% of host 2's frames each way (nftables bridge family, numgen random mod 100 < $LOSS_PCT)"
d_exact="$LOSS_PCT% loss: $LOSS_N all-reduces of 64 KiB (5 ranks, 3 hosts), each exact on every rank"
d_lost="$LOSS_PCT% loss: data segments were lost both ways, and their senders resent them (TCP RetransSegs)"
loss_skip=""
if ! command -v nft > /dev/null; then loss_skip="no nft (apt-get install -y nftables)"
elif ! load_loss; then loss_skip="nft cannot load the ruleset (no nf_tables bridge family in this kernel?): $(head -1 "$tmp/nft.err")"
fi
if [ -n "$loss_skip" ]; then
    for d in "$d_rules" "$d_exact" "$d_lost"; do ok "$d # SKIP $loss_skip"; done
else
    ok "$d_rules"
    # One wire-sized segment a packet, so that the counts are segments (see above).
    gso_refused=""
    for h in 1 2 3; do ip -n "$(netns_ns $h)" link set dev eth0 gso_max_segs 1 2>/dev/null || gso_refused="$gso_refused $h"; done
    resent1=$(retrans 1) resent2=$(retrans 2) resent3=$(retrans 3)
    t0=$(now_ms)
    start loss 29503 300 DDP_TIMEOUT_MS=30000 -- loss $LOSS_N
    finish
    echo "# loss: $LOSS_N all-reduces in $(($(now_ms) - t0)) ms"
    loss_ok() {
        for r in $(seq 0 $((WORLD - 1))); do
            [ "$(rc_of $r)" = 0 ] || why "rank $r exited $(rc_of $r), want 0 (124/137: killed by the hard timeout)"
            grep -q " PASS $LOSS_N all_reduces" "$tmp/loss.$r.out" && continue
            why "rank $r printed no 'PASS $LOSS_N all_reduces'; it printed:"
            grep -v ' via ' "$tmp/loss.$r.out" | head -3 >> "$tmp/why"
        done
        [ ! -s "$tmp/why" ]
    }
    check "$d_exact" loss_ok
    lost_and_resent() {
        ip netns exec "$NSS" nft list table bridge ddploss > "$tmp/nft" 2> "$tmp/nft.err" ||
            { why "nft list table bridge ddploss failed: $(head -1 "$tmp/nft.err")"; return 1; }
        min=$(loss_min_data)
        for dir in out in; do
            frames=$(nft_count ${dir}_frames) data=$(nft_count ${dir}_data)
            frames_lost=$(nft_count ${dir}_frames_lost) data_lost=$(nft_count ${dir}_data_lost)
            if [ $dir = out ]; then way="host 2 -> switch" by="host 2" resent=$(($(retrans 2) - resent2))
            else way="switch -> host 2" by="hosts 1 and 3" resent=$(($(retrans 1) + $(retrans 3) - resent1 - resent3)); fi
            case "$frames.$data.$frames_lost.$data_lost" in
                *[!0-9.]*|.*|*..*|*.) why "$way: nft's listing lacks a counter (${dir}_frames '$frames', ${dir}_data '$data', ${dir}_frames_lost '$frames_lost', ${dir}_data_lost '$data_lost')"; continue ;;
            esac
            none=$(awk -v p="$LOSS_PCT" -v n="$data" 'BEGIN { printf "%.1e", (1 - p / 100) ^ n }')
            echo "# $way: $data_lost of $data data segments lost ($frames_lost of $frames frames), $resent segments resent by $by; P(no data segment lost) = $none"
            if [ "$data" -lt "$min" ]; then
                why "$way: only $data data segments, want >= $min, where losing none at $LOSS_PCT% has a chance below 1e-9 (${gso_refused:+gso_max_segs 1 refused on host$gso_refused; }segmentation offload back?)"
            elif [ "$data_lost" -eq 0 ]; then
                why "$way: 0 of $data data segments lost, want >= 1 at $LOSS_PCT% (chance of none: $none)"
            elif [ "$resent" -le 0 ]; then
                why "$way: $data_lost of $data data segments lost, but $by resent $resent segments (TCP RetransSegs), want >= 1"
            fi
        done
        [ ! -s "$tmp/why" ]
    }
    check "$d_lost" lost_and_resent
    ip netns exec "$NSS" nft delete table bridge ddploss
fi

# --- 18: a host whose link comes up late -------------------------------------------------------
# Host 3's port is down when its rank starts and comes up 5 s later, well within the timeout:
# its rank must keep trying the master and join. Meanwhile its connect() fails with "No route
# to host" (ARP gives up after ~3 s): transient, retried (only a name that does not resolve is
# final).
for ns in $NS1 $NS2 $NS3; do ip -n "$ns" neigh flush dev eth0 2>/dev/null; done
ip -n "$NSS" link set h3 down
start late 29504 120 DDP_TIMEOUT_MS=20000 -- loss 20
sleep 5
ip -n "$NSS" link set h3 up
set -- $rank_pids
wait "$5"; rc_late=$?
[ $rc_late = 0 ] || kill $1 $2 $3 $4 2>/dev/null   # rank 4 gave up: the others need not wait
finish
late_ok() {
    for r in $(seq 0 $((WORLD - 1))); do
        [ $r = 4 ] && rc=$rc_late || rc=$(rc_of $r)
        [ "$rc" = 0 ] && grep -q ' PASS 20 all_reduces' "$tmp/late.$r.out" && continue
        [ $r = 4 ] || [ $rc_late = 0 ] || continue   # killed above
        why "rank $r exited $rc, want 0 and 'PASS 20 all_reduces' (124/137: killed by the hard timeout); it printed:"
        grep -v ' via ' "$tmp/late.$r.out" | head -2 >> "$tmp/why"
    done
    [ ! -s "$tmp/why" ]
}
check "late link: host 3 up 5 s after its rank started: it joins, 20 all-reduces exact" late_ok
for ns in $NS1 $NS2 $NS3; do ip -n "$ns" neigh flush dev eth0 2>/dev/null; done

# --- 19-20: a silent host, found by the heartbeats -------------------------------------------
# The same cut with a collective timeout of 60 s and DDP_HEARTBEAT_TIMEOUT_MS=3000: the health
# threads' links see nothing acknowledged for 3 s, so the neighbours of host 2's ranks (rank 1
# for rank 2, rank 4 for rank 3) give them up as unreachable and every connected rank fails
# within the heartbeat bound (3 s + a period + the failure's spread), not the 60 s timeout; so do
# the cut host's ranks (their links to ranks 1 and 4 fail the same way).
HB_MS=3000
start hb 29503 150 DDP_TIMEOUT_MS=60000 DDP_HEARTBEAT_TIMEOUT_MS=$HB_MS -- cut
warm_case() {
    i=0
    while [ $i -lt 900 ]; do
        w=0
        for r in $(seq 0 $((WORLD - 1))); do grep -q ' looping' "$tmp/$1.$r.out" 2>/dev/null && w=$((w + 1)); done
        [ $w -eq $WORLD ] && return 0
        sleep 0.1; i=$((i + 1))
    done
    why "only $w of $WORLD ranks got through 50 all-reduces within 90 s"
    return 1
}
check "silent host: all 5 ranks looping (heartbeat bound ${HB_MS} ms, collective timeout 60 s)" warm_case hb
sleep 1.5   # the heartbeat links are up one period after init; the loop warmed past that
t_cut=$(now_ms)
ip -n "$NSS" link set h2 down
finish
ip -n "$NSS" link set h2 up
echo "# silent host: every rank ended $(($(now_ms) - t_cut)) ms after the cut"
for r in $(seq 0 $((WORLD - 1))); do
    echo "# rank $r (host $(netns_host_of $r)) exit $(rc_of $r):"
    grep -E ' (ERROR|FAIL)' "$tmp/hb.$r.out" | cut -c1-400 | diag
done
# Each connected rank (0, 1, 4) returned an error within the bound + 12 s (a busy machine's
# spread; the collective timeout is 60 s), naming rank 2 or 3 as unreachable.
hb_named() {
    for r in 0 1 4; do
        rc=$(rc_of $r)
        [ "$rc" = 2 ] || { why "rank $r exited $rc, want 2 (an error returned)"; continue; }
        t=$(sed -n 's/^rank [0-9]*: ERROR at \([0-9]*\) ms.*/\1/p' "$tmp/hb.$r.out")
        [ -n "$t" ] && [ $((t - t_cut)) -lt $((HB_MS + 12000)) ] ||
            why "rank $r returned its error ${t:+$((t - t_cut)) ms }after the cut, want < $((HB_MS + 12000)) ms"
        grep ' ERROR ' "$tmp/hb.$r.out" | grep -qE 'rank [23] is unreachable' ||
            why "rank $r: the error does not name rank 2 or 3 as unreachable: $(grep ' ERROR ' "$tmp/hb.$r.out" | cut -c1-300)"
    done
    [ ! -s "$tmp/why" ]
}
check "silent host: ranks 0, 1, 4 fail within the heartbeat bound (+12 s), naming rank 2 or 3 as unreachable" hb_named
hb_cut_side() {
    for r in 2 3; do
        rc=$(rc_of $r)
        [ "$rc" = 2 ] || { why "rank $r exited $rc, want 2 (an error returned)"; continue; }
        t=$(sed -n 's/^rank [0-9]*: ERROR at \([0-9]*\) ms.*/\1/p' "$tmp/hb.$r.out")
        [ -n "$t" ] && [ $((t - t_cut)) -lt $((HB_MS + 12000)) ] ||
            why "rank $r returned its error ${t:+$((t - t_cut)) ms }after the cut, want < $((HB_MS + 12000)) ms"
    done
    [ ! -s "$tmp/why" ]
}
check "silent host: ranks 2, 3 (the cut host) fail within the heartbeat bound (+12 s) too" hb_cut_side

# --- 19-22: a cut link (last: host 2 stays cut off) ------------------------------------------
# Host 2's bridge port goes down, as a pulled cable: host 2 keeps its address and routes, and
# nobody gets a reset; only the timeout can tell.
start cut 29502 120 DDP_TIMEOUT_MS=$TIMEOUT_MS -- cut
warm() {
    i=0
    while [ $i -lt 900 ]; do
        w=0
        for r in $(seq 0 $((WORLD - 1))); do grep -q ' looping' "$tmp/cut.$r.out" 2>/dev/null && w=$((w + 1)); done
        [ $w -eq $WORLD ] && return 0
        sleep 0.1; i=$((i + 1))
    done
    why "only $w of $WORLD ranks got through 50 all-reduces within 90 s"
    for r in $(seq 0 $((WORLD - 1))); do tail -2 "$tmp/cut.$r.out" "$tmp/cut.$r.err" >> "$tmp/why" 2>/dev/null; done
    return 1
}
check "cut link: all 5 ranks looping over all-reduces (50 done) before the cut" warm
sleep 0.3
t_cut=$(now_ms)
ip -n "$NSS" link set h2 down
finish
echo "# cut: every rank ended $(($(now_ms) - t_cut)) ms after the cut (DDP_TIMEOUT_MS=$TIMEOUT_MS)"
for r in $(seq 0 $((WORLD - 1))); do
    t=$(sed -n 's/^rank [0-9]*: ERROR at \([0-9]*\) ms.*/\1/p' "$tmp/cut.$r.out")
    echo "# rank $r (host $(netns_host_of $r)) exit $(rc_of $r)${t:+, error $((t - t_cut)) ms after the cut}:"
    grep -E ' (ERROR|FAIL|destroy|no error)' "$tmp/cut.$r.out" | diag
    grep -v '^\[ddp rank [0-9]*\] [0-9TZ:.-]* *WARN' "$tmp/cut.$r.err" | head -3 | diag
done
# errored R...: each rank R exited 2 (a collective returned an error) and its ERROR line came
# within the timeout + 15 s of the cut (the stuck-rank search adds up to timeout/2).
errored() {
    for r in "$@"; do
        rc=$(rc_of $r)
        [ "$rc" = 2 ] || { why "rank $r exited $rc, want 2 (an error returned; 124/137: it hung and the hard timeout killed it; 3: no error in 100 s)"; continue; }
        t=$(sed -n 's/^rank [0-9]*: ERROR at \([0-9]*\) ms.*/\1/p' "$tmp/cut.$r.out")
        [ -n "$t" ] || { why "rank $r printed no ERROR line"; continue; }
        [ $((t - t_cut)) -lt $((TIMEOUT_MS + 15000)) ] ||
            why "rank $r returned its error $((t - t_cut)) ms after the cut, want < $((TIMEOUT_MS + 15000))"
    done
    [ ! -s "$tmp/why" ]
}
check "cut link: ranks 0, 1, 4 (connected hosts) each return an error within timeout + 15 s" errored 0 1 4
# The connected hosts must blame the cut host: "stuck rank: 2" or "stuck rank: 3".
names_cut() {
    for r in 0 1 4; do
        line=$(grep ' ERROR ' "$tmp/cut.$r.out")
        case $line in
            *"stuck rank: 2"*|*"stuck rank: 3"*) ;;
            "") why "rank $r: no error message" ;;
            *) why "rank $r: the message does not say 'stuck rank: 2' or 'stuck rank: 3': $line" ;;
        esac
    done
    [ ! -s "$tmp/why" ]
}
check "cut link: every connected rank's message names a rank of the cut host (stuck rank: 2 or 3)" names_cut
check "cut link: ranks 2, 3 (the cut host) return an error too, within timeout + 15 s, no hang" errored 2 3

