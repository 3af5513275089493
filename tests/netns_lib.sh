# SPDX-License-Identifier: MIT (see LICENSE)
# tests/netns_lib.sh — emulated hosts for libddp: network namespaces on a Linux bridge, each
# with its own link into a "switch" namespace, optionally rate-limited like a real NIC. Sourced
# (POSIX sh) by tests/test_netns.sh and bench/netns_bench.sh; not run by itself. Needs root and
# iproute2; tc (and the kernel's tbf qdisc) only for netns_shape.
#
#   netns_layout SPEC       ranks per host, host-major: "2,1,2" = ranks 0-1 on host 1, rank 2
#                           on host 2, ranks 3-4 on host 3. Sets NETNS_NHOSTS, NETNS_WORLD.
#   netns_host_of R         host index (1-based) of rank R;  netns_local_rank R: its index there
#   netns_ranks_on H        how many ranks host H has
#   netns_create PREFIX N   the switch namespace PREFIXsw (bridge br0, ports h1..hN) and hosts
#                           PREFIXh1..PREFIXhN, each with eth0 = 10.77.0.H/24. On failure:
#                           returns 1, the reason in $netns_why (callers skip or bail out).
#   netns_ns H              the namespace of host H;  netns_addr H: its address
#   netns_shape RATE        tbf at RATE on both directions of every host's link (see below)
#   netns_qdisc_stats       one line per shaped interface: bytes sent, drops, overlimits
#   netns_destroy           kills whatever runs in our namespaces and deletes them (idempotent;
#                           call it from the caller's EXIT trap)
#
# Nothing is created in the calling namespace: the bridge lives in the switch namespace, so two
# runs (different PREFIX, e.g. with $$ in it) cannot collide, and addresses can repeat.

NETNS_SUBNET=10.77.0
NETNS_SW="" NETNS_HOSTS="" NETNS_LAYOUT="" NETNS_NHOSTS=0 NETNS_WORLD=0
netns_why=""

netns_layout() {
    NETNS_LAYOUT=$(printf '%s' "$1" | tr ',' ' ')
    NETNS_NHOSTS=0 NETNS_WORLD=0
    for _k in $NETNS_LAYOUT; do
        case $_k in ''|*[!0-9]*|0) netns_why="bad layout '$1': want ranks per host, e.g. 2,1,2"; return 1 ;; esac
        NETNS_NHOSTS=$((NETNS_NHOSTS + 1)) NETNS_WORLD=$((NETNS_WORLD + _k))
    done
    [ "$NETNS_NHOSTS" -gt 0 ] || { netns_why="empty layout"; return 1; }
    [ "$NETNS_NHOSTS" -le 250 ] || { netns_why="at most 250 hosts"; return 1; }
}

# Sets _h (host) and _l (local rank) of rank $1.
_netns_place() {
    _h=0 _first=0
    for _k in $NETNS_LAYOUT; do
        _h=$((_h + 1))
        if [ "$1" -lt $((_first + _k)) ]; then _l=$(($1 - _first)); return 0; fi
        _first=$((_first + _k))
    done
    _l=-1
    return 1
}
netns_host_of() { _netns_place "$1"; echo "$_h"; }
netns_local_rank() { _netns_place "$1"; echo "$_l"; }
# shellcheck disable=SC2086 # the layout is a list of words
netns_ranks_on() { printf '%s\n' $NETNS_LAYOUT | sed -n "${1}p"; }

netns_ns() { echo "${NETNS_PREFIX}h$1"; }
netns_addr() { echo "$NETNS_SUBNET.$1"; }

netns_create() {
    NETNS_PREFIX=$1
    NETNS_SW="${1}sw" NETNS_HOSTS=""
    _err=$(mktemp "${TMPDIR:-/tmp}/netns_err.XXXXXX") || { netns_why="mktemp failed"; return 1; }
    _netns_create_steps "$2"
    _rc=$?
    [ $_rc = 0 ] || netns_why="$netns_why: $(head -1 "$_err")"
    rm -f "$_err"
    return $_rc
}
_netns_create_steps() {
    ip netns add "$NETNS_SW" 2> "$_err" || { netns_why="ip netns add failed"; return 1; }
    ip netns exec "$NETNS_SW" true 2> "$_err" || { netns_why="ip netns exec failed"; return 1; }
    ip -n "$NETNS_SW" link add br0 type bridge 2> "$_err" || { netns_why="no bridge support"; return 1; }
    ip -n "$NETNS_SW" link set br0 up 2> "$_err" || { netns_why="bridge does not come up"; return 1; }
    _h=1
    while [ $_h -le "$1" ]; do
        _ns=$(netns_ns $_h)
        ip netns add "$_ns" 2> "$_err" || { netns_why="ip netns add $_ns failed"; return 1; }
        NETNS_HOSTS="$NETNS_HOSTS $_ns"
        ip -n "$NETNS_SW" link add name "h$_h" type veth peer name eth0 netns "$_ns" 2> "$_err" ||
            { netns_why="no veth support"; return 1; }
        { ip -n "$NETNS_SW" link set "h$_h" master br0 up &&
          ip -n "$_ns" link set lo up &&
          ip -n "$_ns" addr add "$(netns_addr $_h)/24" dev eth0 &&
          ip -n "$_ns" link set eth0 up; } 2> "$_err" || { netns_why="setting up host $_h failed"; return 1; }
        _h=$((_h + 1))
    done
}

# Token bucket on both ends of each host's link: eth0's egress (host -> switch) and the switch
# port's egress (switch -> host), so a host sends and receives at RATE at most, as through a
# NIC of that speed; traffic between two hosts crosses two such links, as through a switch.
#   burst: 1 ms of tokens at RATE, at least 128 KiB. veth hands tbf whole GSO super-packets of
#     up to 64 KiB: with a bucket about that size tbf has to split them and waits for a nearly
#     full bucket each time, and TCP got half the rate (1 Gbit/s, 64 KiB: 0.06 GB/s of 0.125);
#     from 96 KiB up it gets all the link can carry. The rest is headroom for a timer that
#     fires late (tokens that a full bucket cannot hold are rate lost for good). 1 ms at
#     1 Gbit/s is 125 KB: still a small burst, about one switch port's share of its buffer.
#   latency 20 ms: the queue (tbf's limit) holds 20 ms of data at RATE: more than a TCP window
#     needs here (no propagation delay, and TCP small queues caps what one socket keeps in a
#     qdisc), so streams are not cut by tail drops; short enough that a queue that does build
#     up is not hidden as seconds of latency.
# Measured (all_reduce of 4 and 64 MiB, 2 hosts x 1 rank, 1 Gbit/s): 0.119-0.120 GB/s busbw,
# 95.5% of RATE, which is all of it: tbf counts Ethernet frames, and a 1514-byte frame carries
# 1448 bytes of TCP payload (95.6%): bench/results/netns_1gbit.md. At 100 Mbit/s (128 KiB
# burst) 16 MiB all-reduces got 93%. NETNS_BURST (bytes) and NETNS_LATENCY (e.g. 5ms) override.
netns_shape() {
    _bits=$(_netns_rate_bits "$1") || { netns_why="bad rate '$1' (want e.g. 100mbit, 1gbit)"; return 1; }
    _burst=$((_bits / 8 / 1000))
    [ $_burst -ge 131072 ] || _burst=131072
    _burst=${NETNS_BURST:-$_burst} _lat=${NETNS_LATENCY:-20ms}
    _h=1
    for _ns in $NETNS_HOSTS; do
        if ! ip netns exec "$_ns" tc qdisc replace dev eth0 root tbf rate "$1" burst "$_burst" latency "$_lat" ||
           ! ip netns exec "$NETNS_SW" tc qdisc replace dev "h$_h" root tbf rate "$1" burst "$_burst" latency "$_lat"; then
            netns_why="tc qdisc tbf failed on host $_h (no sch_tbf in this kernel?)"
            return 1
        fi
        _h=$((_h + 1))
    done
}
# A tc rate ("1gbit", "100mbit", "2.5gbit", "500kbit", "125mbps" = bytes) in bits per second.
_netns_rate_bits() {
    printf '%s\n' "$1" | awk '{
        v = $0; u = v; sub(/^[0-9.]+/, "", v); n = substr(u, 1, length(u) - length(v)); u = tolower(v)
        if (n == "" ) exit 1
        m["bit"] = 1; m["kbit"] = 1e3; m["mbit"] = 1e6; m["gbit"] = 1e9; m["tbit"] = 1e12
        m["bps"] = 8; m["kbps"] = 8e3; m["mbps"] = 8e6; m["gbps"] = 8e9
        if (!(u in m)) exit 1
        printf "%.0f\n", n * m[u] }'
}

netns_qdisc_stats() {
    _h=1
    for _ns in $NETNS_HOSTS; do
        for _side in up down; do
            if [ $_side = up ]; then _s=$(ip netns exec "$_ns" tc -s qdisc show dev eth0 2>/dev/null)
            else _s=$(ip netns exec "$NETNS_SW" tc -s qdisc show dev "h$_h" 2>/dev/null); fi
            printf '%s\n' "$_s" | awk -v h=$_h -v side=$_side '
                / Sent / { for (i = 1; i <= NF; i++) { if ($i == "Sent") b = $(i + 1); if ($i == "(dropped") d = $(i + 1); if ($i == "overlimits") o = $(i + 1) } }
                END { sub(/,/, "", d); if (b != "") printf "host %d %s: %s bytes, dropped %s, overlimits %s\n", h, side == "up" ? "-> switch" : "<- switch", b, d, o }'
        done
        _h=$((_h + 1))
    done
}

netns_destroy() {
    for _ns in $NETNS_HOSTS $NETNS_SW; do
        for _p in $(ip netns pids "$_ns" 2>/dev/null); do kill -9 "$_p" 2>/dev/null; done
        ip netns del "$_ns" 2>/dev/null
    done
    NETNS_HOSTS="" NETNS_SW=""
}
