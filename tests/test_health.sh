#!/bin/sh
# SPDX-License-Identifier: MIT (see LICENSE)
# tests/test_health.sh — the health thread and ddp-status on a real job: 4 ranks on this host
# (build/health_rank, all-reduces in a loop; rank 0 serves the store), asked with build/ddp-status
# while one rank is in a known state. Run from the repository root (prove tests/test_health.sh);
# prints TAP. DDP_HEARTBEAT_TIMEOUT_MS=2000 and a collective timeout of 120 s in both cases:
#   1. rank 2 stops itself (SIGSTOP) before an all-reduce the others wait in: ddp-status names
#      it as not answering and the others as waiting for it in that call (the same number on
#      the three, past rank 2's last); after SIGCONT, 3 s later, the job ends well: a stopped process
#      (its host still acknowledging) does not cut the timeout short;
#   2. rank 1 sleeps 6 s in user code (3 heartbeat timeouts) before an all-reduce: ddp-status
#      says it is in user code and answering while the others wait for it; the job ends well,
#      and rank 0's metrics file (DDP_METRICS) reads back with Prometheus' text parser.
# No time is assumed: each step waits for what the last leads to (a line, a verdict), every wait
# bounded (60 s), and ddp-status is asked again until the state it must report is there.
set -u

S=build/ddp-status
R=build/health_rank
tmp=$(mktemp -d "${TMPDIR:-/tmp}/health_test.XXXXXX") || { echo "Bail out! mktemp failed"; exit 1; }
pids=
cleanup() {
    for p in $pids; do kill -CONT "$p" 2>/dev/null; kill -KILL "$p" 2>/dev/null; done
    rm -rf "$tmp"
}
trap cleanup EXIT
unset DDP_HEALTH DDP_HEALTH_PERIOD_MS DDP_METRICS DDP_DEBUG DDP_TRANSPORT DDP_LAUNCHER_STORE \
      RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE MASTER_ADDR MASTER_PORT DDP_TIMEOUT_MS
PY=
for p in "${PYTHON:-}" /usr/bin/python3 python3; do
    [ -n "$p" ] && "$p" -c 'import json' 2>/dev/null && { PY=$p; break; }
done

echo "1..7"
. "$(dirname "$0")/tap.sh"   # ok, notok, check, why
[ -x "$S" ] && [ -x "$R" ] || { echo "Bail out! build $S and $R first (make $S $R)"; exit 1; }
[ -n "$PY" ] || { echo "Bail out! no python3 (the port and the JSON checks)"; exit 1; }
diag() { sed 's/^/#   /' "$@"; }
secret=$(od -An -tx1 -N16 /dev/urandom | tr -d ' \n')
export DDP_JOB_SECRET=$secret

# start CASE ARGS...: 4 ranks of build/health_rank on a free port, output in $tmp/CASE.R.out.
start() {
    c=$1; shift
    port=$("$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    pids=
    for r in 0 1 2 3; do
        env RANK=$r WORLD_SIZE=4 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port DDP_TIMEOUT_MS=120000 \
            DDP_HEARTBEAT_TIMEOUT_MS=2000 ${EXTRA_ENV:-} "$R" "$@" > "$tmp/$c.$r.out" 2> "$tmp/$c.$r.err" &
        pids="$pids $!"
    done
}
# wait_for FILE PATTERN: until a line of FILE matches (60 s at most).
wait_for() {
    i=0
    while [ $i -lt 600 ]; do grep -q "$2" "$1" 2>/dev/null && return 0; sleep 0.1; i=$((i + 1)); done
    why "no '$2' in $1 within 60 s"; return 1
}
# finish: every rank's exit status into rc_R.
finish() {
    r=0
    for p in $pids; do wait "$p"; eval "rc_$r=$?"; r=$((r + 1)); done
    pids=
}
all_done() {
    for r in 0 1 2 3; do
        eval "rc=\$rc_$r"
        [ "$rc" = 0 ] && grep -q "rank $r: done" "$tmp/$1.$r.out" ||
            { why "rank $r exited $rc:"; tail -3 "$tmp/$1.$r.out" "$tmp/$1.$r.err" >> "$tmp/why"; }
    done
    [ ! -s "$tmp/why" ]
}
# ask CASE WANT...: ddp-status (text and JSON) until the verdict has every WANT (30 tries); the
# last answer in $tmp/CASE.status, $tmp/CASE.json, its time in ms in $tmp/CASE.ms.
ask() {
    c=$1; shift
    i=0
    while [ $i -lt 30 ]; do
        t0=$(date +%s%3N)
        "$S" "127.0.0.1:$port" > "$tmp/$c.status" 2>&1
        echo $(($(date +%s%3N) - t0)) > "$tmp/$c.ms"
        "$S" "127.0.0.1:$port" --json > "$tmp/$c.json" 2>&1
        miss=
        for w in "$@"; do grep '^verdict:' "$tmp/$c.status" | grep -qF "$w" || miss="$miss [$w]"; done
        [ -z "$miss" ] && return 0
        sleep 0.3; i=$((i + 1))
    done
    why "the verdict never said$miss; the last answer:"; cat "$tmp/$c.status" >> "$tmp/why"
    return 1
}

# --- 1: a stopped rank ----------------------------------------------------------------------
start stop 60 2 20 stop
stopped() {
    for r in 0 1 2 3; do wait_for "$tmp/stop.$r.out" "rank $r: at 20" || return 1; done
    i=0
    while [ "$(awk '{print $3}' "/proc/$pid2/stat" 2>/dev/null)" != T ]; do
        sleep 0.1; i=$((i + 1)); [ $i -lt 600 ] || { why "rank 2 (pid $pid2) never stopped"; return 1; }
    done
}
wait_for "$tmp/stop.2.out" "rank 2: pid " > /dev/null 2>&1
pid2=$(sed -n 's/^rank 2: pid //p' "$tmp/stop.2.out")
check "stop: rank 2 stopped itself before step 20's all-reduce, the others reached it" stopped
t_stop=$(date +%s%3N)
check "stop: ddp-status names rank 2 as not answering, ranks 0, 1, 3 waiting for it in an all-reduce" \
    ask stop "rank 2 is not answering" "ranks 0, 1, 3 wait for it in all_reduce #"
diag "$tmp/stop.status"
echo "# ddp-status answered in $(cat "$tmp/stop.ms") ms (4 ranks, one stopped)"
right_call() {
    "$PY" - "$tmp/stop.json" <<'PYEOF' >> "$tmp/why"
import json, sys
j = json.load(open(sys.argv[1]))
r = {x["rank"]: x for x in j["ranks"]}
bad = []
if r[2].get("answering") is not False: bad.append("rank 2 answering=%r" % r[2].get("answering"))
call = r[0].get("seq")
for k in (0, 1, 3):
    if r[k].get("state") != "call" or r[k].get("kind") != "all_reduce" or r[k].get("seq") != call:
        bad.append("rank %d: state %r kind %r seq %r, want call all_reduce %r" % (k, r[k].get("state"), r[k].get("kind"), r[k].get("seq"), call))
    if r[k].get("peer") not in (2, -1): bad.append("rank %d waits on rank %r" % (k, r[k].get("peer")))
if r[2].get("state") in ("call", "user") and r[2].get("seq", 0) >= call: bad.append("rank 2 got to #%r" % r[2].get("seq"))
if ("#%d" % call) not in j["verdict"]: bad.append("verdict %r does not say #%d" % (j["verdict"], call))
print("\n".join(bad))
sys.exit(1 if bad else 0)
PYEOF
}
check "stop: ranks 0, 1, 3 are in the same all-reduce, one rank 2 never entered (ddp-status --json)" right_call
# the stop lasts past the heartbeat timeout (2 s) before SIGCONT
while [ $(($(date +%s%3N) - t_stop)) -lt 3000 ]; do sleep 0.2; done
kill -CONT "$pid2"
finish
check "stop: after SIGCONT (stopped > 3 s, heartbeat timeout 2 s) every rank finishes, exit 0" all_done stop

# --- 2: a rank in user code -------------------------------------------------------------------
EXTRA_ENV="DDP_METRICS=$tmp/m.%r.prom DDP_METRICS_PERIOD_MS=200"
start user 40 1 20 sleep 6000
EXTRA_ENV=
check "user code: rank 1 is in user code, ddp-status says so (answering), ranks 0, 2, 3 wait for it" \
    ask user "rank 1 is in user code since" "(answering); ranks 0, 2, 3 wait for it in all_reduce #"
diag "$tmp/user.status"
finish
check "user code: 6 s in user code (3 heartbeat timeouts): no early error, every rank exit 0" all_done user
metrics() {
    [ -s "$tmp/m.0.prom" ] || { why "no $tmp/m.0.prom"; return 1; }
    "$PY" tests/metrics_check.py "$tmp/m.0.prom" --rank 0 'ddp_info{size=4}=1' 'ddp_communicator_failed=0' >> "$tmp/why" 2>&1
}
if "$PY" -c 'import prometheus_client' 2>/dev/null; then
    check "user code: rank 0's metrics file parses with Prometheus' text parser (tests/metrics_check.py)" metrics
else
    ok "user code: metrics file # SKIP no prometheus_client for $PY"
fi
