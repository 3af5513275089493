#!/bin/sh
# SPDX-License-Identifier: MIT (see LICENSE)
# bench/netns_bench.sh — libddp across emulated hosts: each host is a network namespace whose
# link into a bridge is rate-limited both ways (tc tbf), so ranks on one host use shared memory
# and ranks on different hosts share that host's "NIC". Runs build/ddp-bench as every rank (or
# any command that reads the launcher environment), prints rank 0's output, and can keep rank
# 0's JSON. Needs root and iproute2 (tests/netns_lib.sh sets the hosts up). Run from the
# repository root.
#
#   bench/netns_bench.sh -H 2 -R 1 -r 1gbit -s 1M,4M,16M,64M -J out.json
#   bench/netns_bench.sh -H 2 -R 2 -r 1gbit -o all_reduce -s 8,1K,64K -- DDP_ALGO=hier_ring
#   bench/netns_bench.sh -L 2,1,2 -r 10gbit -a '-d bfloat16 -w 2 -c 0'
#   bench/netns_bench.sh -H 2 -R 2 -r 1gbit -- DDP_ALGO=ring build/ddp-calibrate -v
#
# Options (defaults in brackets):
#   -H hosts, -R ranks per host   [2, 1]   or -L list: ranks per host, e.g. 2,1,2
#   -r rate      tc rate of each host's link, each direction [1gbit]; "none": unshaped veth
#   -o coll      ddp-bench -o [all_reduce];  -s sizes: ddp-bench -s [8,...,64M: -b 8 -e 64M]
#   -n iters     ddp-bench -n [20];  -w warmup: ddp-bench -w [3]
#   -J file      rank 0's JSON (ddp-bench -J);  -a 'args': more ddp-bench arguments
#   -B program   the ddp-bench to run [build/ddp-bench] (another build, to compare)
#   -T seconds   hard limit on the run (every rank runs under `timeout`) [600]
#   -p port      the master's port on host 1 [29500]
#   -l dir       keep every rank's stdout and stderr there (rank<R>.out, .err) [a temporary dir]
#   -q           only rank 0's output (no setup lines, no qdisc statistics)
#   -A           every rank's output, each line prefixed "[rank R] " (rank 0's only by default)
# After --: NAME=VALUE words are put into every rank's environment (DDP_ALGO=hier_ring,
# DDP_TIMEOUT_MS=...; no spaces in a VALUE); the first other word starts the command every rank runs instead of
# ddp-bench (it is given RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE MASTER_ADDR MASTER_PORT
# DDP_JOB_SECRET, as from torchrun; -o -s -n -w -J -a are then not used).
#
# Ranks are numbered host-major: host 1 has ranks 0 .. R-1 (rank 0 serves the store at
# 10.77.0.1), host 2 the next ones, and so on. Exit status: 0 when every rank exited 0; else
# 1, with the tail of each failed rank's output. Every namespace, and whatever still runs in
# one, is removed at exit, also on failure or Ctrl-C.
set -u

here=$(dirname "$0")
# shellcheck source=tests/netns_lib.sh
. "$here/../tests/netns_lib.sh"

usage() { sed -n '2,/^[^#]/s/^# \{0,1\}//p' "$0" >&2; exit 2; }
die() { echo "netns_bench: $*" >&2; exit 2; }

hosts=2 per=1 layout="" rate=1gbit coll=all_reduce sizes="" iters=20 warmup=3 json="" extra=""
limit=600 port=29500 logdir="" quiet=0 all=0 bench=build/ddp-bench
while getopts H:R:L:r:o:s:n:w:J:a:B:T:p:l:qAh opt; do
    case $opt in
        H) hosts=$OPTARG ;; R) per=$OPTARG ;; L) layout=$OPTARG ;; r) rate=$OPTARG ;;
        o) coll=$OPTARG ;; s) sizes=$OPTARG ;; n) iters=$OPTARG ;; w) warmup=$OPTARG ;;
        J) json=$OPTARG ;; a) extra=$OPTARG ;; B) bench=$OPTARG ;; T) limit=$OPTARG ;; p) port=$OPTARG ;;
        l) logdir=$OPTARG ;; q) quiet=1 ;; A) all=1 ;; *) usage ;;
    esac
done
shift $((OPTIND - 1))
[ $# -eq 0 ] || [ "$1" != -- ] || shift   # getopts stops after "--" and leaves it out, or not
envs=""
while [ $# -gt 0 ]; do
    case $1 in
        *=*) case ${1%%=*} in ''|*[!A-Za-z0-9_]*) break ;; esac
             envs="$envs $1"; shift ;;
        *) break ;;
    esac
done

if [ -z "$layout" ]; then
    case $hosts$per in *[!0-9]*) die "-H and -R take numbers" ;; esac
    if [ "$hosts" -lt 1 ] || [ "$per" -lt 1 ]; then die "-H and -R must be at least 1"; fi
    layout=$(yes "$per" | head -n "$hosts" | paste -sd, -)
fi
netns_layout "$layout" || die "$netns_why"
case $limit in ''|*[!0-9]*) die "-T takes whole seconds" ;; esac

[ "$(id -u)" = 0 ] || die "needs root (network namespaces, a bridge, tc)"
command -v ip > /dev/null || die "no ip command (apt-get install -y iproute2)"
command -v timeout > /dev/null || die "no timeout command (coreutils)"
[ "$rate" = none ] || command -v tc > /dev/null || die "no tc command (iproute2)"
if [ $# -eq 0 ]; then
    [ -x "$bench" ] || die "no $bench: make build/ddp-bench (run from the repository root)"
    label="netns: layout $layout (ranks per host), link $rate each way per host${envs:+,$envs}"
    set -- "$bench" -o "$coll" -n "$iters" -w "$warmup" -L "$label"
    if [ -n "$sizes" ]; then set -- "$@" -s "$sizes"; else set -- "$@" -b 8 -e 64M; fi
    [ -z "$json" ] || set -- "$@" -J "$json"
    # shellcheck disable=SC2086 # -a is a list of words
    [ -z "$extra" ] || set -- "$@" $extra
fi

say() { [ $quiet = 1 ] || echo "$@"; }
tmp=$(mktemp -d "${TMPDIR:-/tmp}/netns_bench.XXXXXX") || die "mktemp failed"
[ -n "$logdir" ] || logdir=$tmp/logs
mkdir -p "$logdir" || die "cannot create $logdir"
cleanup() {
    netns_destroy
    rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 1' HUP INT TERM

netns_create "ddpb$$" "$NETNS_NHOSTS" || die "$netns_why"
if [ "$rate" != none ]; then netns_shape "$rate" || die "$netns_why"; fi
say "# hosts: $NETNS_NHOSTS, ranks per host: $layout (world $NETNS_WORLD, host-major), link: $rate each way per host"
say "# env:${envs:- (none)}"
say "# every rank runs: $*"

# One rank: its launcher environment, inside its host's namespace, under a hard timeout; its exit
# status lands in rank<R>.rc (the script polls those files: a plain sh cannot wait for "any").
secret=$(od -An -tx1 -N16 /dev/urandom | tr -d ' \n')
r=0
while [ $r -lt "$NETNS_WORLD" ]; do
    h=$(netns_host_of $r)
    (
        # shellcheck disable=SC2086 # $envs is a list of NAME=VALUE words
        env -u DDP_HOST_ID RANK=$r WORLD_SIZE="$NETNS_WORLD" LOCAL_RANK="$(netns_local_rank $r)" \
            LOCAL_WORLD_SIZE="$(netns_ranks_on "$h")" MASTER_ADDR="$(netns_addr 1)" MASTER_PORT="$port" \
            DDP_JOB_SECRET="$secret" $envs \
            timeout -k 5 "$limit" ip netns exec "$(netns_ns "$h")" "$@" \
            > "$logdir/rank$r.out" 2> "$logdir/rank$r.err"
        echo $? > "$tmp/rank$r.rc"
    ) &
    r=$((r + 1))
done

# Until every rank has ended; the first failure ends the others (they would only wait for it).
failed=""
while :; do
    done_n=0
    for r in $(seq 0 $((NETNS_WORLD - 1))); do
        [ -s "$tmp/rank$r.rc" ] || continue
        done_n=$((done_n + 1))
        rc=$(cat "$tmp/rank$r.rc")
        if [ "$rc" != 0 ] && [ -z "$failed" ]; then
            failed=$r
            for ns in $NETNS_HOSTS; do
                for p in $(ip netns pids "$ns" 2>/dev/null); do kill "$p" 2>/dev/null; done
            done
        fi
    done
    [ $done_n -eq "$NETNS_WORLD" ] && break
    sleep 0.2
done
wait

if [ $all = 1 ]; then
    for r in $(seq 0 $((NETNS_WORLD - 1))); do sed "s/^/[rank $r] /" "$logdir/rank$r.out"; done
else
    cat "$logdir/rank0.out"
fi
status=0
for r in $(seq 0 $((NETNS_WORLD - 1))); do
    rc=$(cat "$tmp/rank$r.rc")
    [ "$rc" = 0 ] && continue
    status=1
    case $rc in 124|137) what="killed by the hard timeout (-T $limit)" ;; 143) what="ended after rank $failed failed" ;; *) what="exit $rc" ;; esac
    echo "# rank $r (host $(netns_host_of "$r")): $what" >&2
    for f in out err; do tail -n 5 "$logdir/rank$r.$f" | sed "s/^/#   $f: /" >&2; done
done
if [ "$rate" != none ] && [ $quiet = 0 ]; then netns_qdisc_stats | sed 's/^/# tbf: /'; fi
[ -z "$json" ] || [ ! -s "$json" ] || say "# rank 0's JSON: $json"
exit $status
