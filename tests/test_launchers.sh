#!/bin/sh
# SPDX-License-Identifier: MIT (see LICENSE)
# tests/test_launchers.sh — one libddp binary (tests/launch_probe.c) under every launcher, for
# real: none (a world of one), torchrun's default mode (its agent's c10d store), a TCPStore
# served from Python, two mpirun jobs at once, two srun jobs at once, and a rank of another job
# reaching a job's store. Run from the repository root (prove tests/test_launchers.sh); prints
# TAP. Each job gets its own token; launch_probe fails when its communicator holds a rank of
# another job (tokens differ) or the wrong ranks, so "never a mixed communicator" is checked by
# every rank of every run. Launchers that are not installed are skipped with the reason
# (.ci/run installs python3-torch and openmpi-bin and sets up ../shared/slurm-local).
set -u
CC=${CC:-cc}
P=build/launch_probe
PY=/usr/bin/python3
ROUNDS=${LAUNCH_ROUNDS:-4}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/launch_test.XXXXXX") || { echo "Bail out! mktemp failed"; exit 1; }
trap 'rm -rf "$tmp"; [ -n "${SRV:-}" ] && kill "$SRV" 2>/dev/null' EXIT
. "$(dirname "$0")/tap.sh"
# Nothing of the caller's launcher may leak into the runs.
unset RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE MASTER_ADDR MASTER_PORT DDP_JOB_SECRET DDP_JOB_ID \
      OMPI_COMM_WORLD_RANK OMPI_COMM_WORLD_SIZE PMI_RANK PMI_SIZE SLURM_PROCID SLURM_NTASKS \
      SLURM_JOB_ID SLURM_STEP_ID TORCHELASTIC_USE_AGENT_STORE TORCHELASTIC_RUN_ID DDP_TRANSPORT
export DDP_TIMEOUT_MS=60000

have_torch() { [ -x "$PY" ] && "$PY" -c 'import torch.distributed' 2>/dev/null; }
# oks FILE N: FILE has N "launch_probe: ok" lines
oks() { [ "$(grep -c 'launch_probe: ok' "$1")" -eq "$2" ] || { why "$(cat "$1")"; return 1; }; }

echo "1..9"
mkdir -p build
# The implementation (tcp, shm): build/libddp.o when make built it after every change to the
# headers (make test does), else compiled here with the probe.
impl=tests/libddp.c
[ -f build/libddp.o ] && [ -z "$(find tests/libddp.c ./*.h transports/*.h -newer build/libddp.o)" ] && impl=build/libddp.o
if ! $CC -std=c99 -O2 -Wall -Wextra -Wpedantic -Werror -I. -DT_IMPL_SHM=1 tests/launch_probe.c $impl -o $P -pthread -lm 2> "$tmp/why"; then
    notok "build launch_probe"; sed 's/^/#   /' "$tmp/why"; exit 1
fi
ok "build launch_probe"

# --- no launcher: a world of one; two at once never collide (each store on its own port)
none() {
    timeout 60 $P 101 1 > "$tmp/n1" 2>&1 & a=$!
    timeout 60 $P 102 1 > "$tmp/n2" 2>&1 & b=$!
    wait $a && wait $b && oks "$tmp/n1" 1 && oks "$tmp/n2" 1
}
check "no launcher: a world of one (two at once)" none

# --- torchrun, default mode: ranks are clients of its agent's c10d TCPStore on MASTER_PORT
torchrun_default() {
    port=$(free_port)
    # --redirects/--tee: Debian's torch 1.13 on Python 3.11 crashes in its own log handling without them
    timeout 120 "$PY" -m torch.distributed.run --nproc_per_node 2 --master_port "$port" --no_python \
        --redirects 1 --tee 1 $P 201 2 > "$tmp/tr" 2>&1 || { why "$(tail -20 "$tmp/tr")"; return 1; }
    oks "$tmp/tr" 2
}
if have_torch; then check "torchrun --nproc_per_node 2 (its agent store, not --standalone)" torchrun_default
else ok "torchrun # SKIP no python3-torch at $PY"; fi

# --- a TCPStore served from Python; libddp ranks rendezvous through it (c10d protocol)
py_store() {
    "$PY" -c '
import sys, datetime
import torch.distributed as d
s = d.TCPStore("127.0.0.1", 0, None, True, datetime.timedelta(seconds=60), wait_for_workers=False)
print(s.port, flush=True)
sys.stdin.read()' < "$tmp/fifo" > "$tmp/port" 2> "$tmp/pyerr" &
    SRV=$!
    exec 9> "$tmp/fifo"
    i=0; while [ ! -s "$tmp/port" ] && [ $i -lt 300 ]; do sleep 0.1; i=$((i + 1)); done
    port=$(cat "$tmp/port")
    [ -n "$port" ] || { why "python TCPStore did not start: $(cat "$tmp/pyerr")"; return 1; }
    for r in 0 1; do
        RANK=$r WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port TORCHELASTIC_USE_AGENT_STORE=True \
            timeout 60 $P 301 2 > "$tmp/ps$r" 2>&1 &
        eval "pid$r=\$!"
    done
    wait $pid0; r0=$?; wait $pid1; r1=$?
    exec 9>&-; wait $SRV 2>/dev/null; SRV=
    [ $r0 = 0 ] && [ $r1 = 0 ] && oks "$tmp/ps0" 1 && oks "$tmp/ps1" 1 || { why "$(cat "$tmp/ps0" "$tmp/ps1")"; return 1; }
}
mkfifo "$tmp/fifo"
if have_torch; then check "a torch.distributed.TCPStore served from Python: 2 libddp ranks use it" py_store
else ok "python TCPStore # SKIP no python3-torch at $PY"; fi

# --- a rank of another job reaches this job's store (same port by chance): refused, naming both
other_job() {
    port=$(free_port)
    RANK=0 WORLD_SIZE=2 MASTER_PORT=$port DDP_JOB_ID=job-a timeout 60 $P 401 2 > "$tmp/a0" 2>&1 & a0=$!
    RANK=1 WORLD_SIZE=2 MASTER_PORT=$port DDP_JOB_ID=job-b DDP_TIMEOUT_MS=30000 timeout 60 $P 402 2 > "$tmp/b1" 2>&1
    rb=$?
    RANK=1 WORLD_SIZE=2 MASTER_PORT=$port DDP_JOB_ID=job-a timeout 60 $P 401 2 > "$tmp/a1" 2>&1; ra=$?
    wait $a0; r0=$?
    [ $rb != 0 ] && grep -q "job-a" "$tmp/b1" && grep -q "job-b" "$tmp/b1" || { why "job b's rank: rc $rb: $(cat "$tmp/b1")"; return 1; }
    [ $ra = 0 ] && [ $r0 = 0 ] && oks "$tmp/a0" 1 && oks "$tmp/a1" 1
}
check "a rank of another job is refused naming both jobs; the job then completes" other_job

# --- two mpirun jobs at once, no MASTER_PORT: each job's port comes from its identity
MPIRUN="mpirun --allow-run-as-root --oversubscribe -np 2"
two_mpirun() {
    k=0
    while [ $k -lt $ROUNDS ]; do
        # Open MPI's own session directories race when two mpiruns start at once ("orte_session_dir
        # failed"): each job gets its own base.
        mkdir -p "$tmp/o1" "$tmp/o2"
        OMPI_MCA_orte_tmpdir_base="$tmp/o1" timeout 120 $MPIRUN $P $((500 + 2 * k)) 2 > "$tmp/m1" 2>&1 & a=$!
        OMPI_MCA_orte_tmpdir_base="$tmp/o2" timeout 120 $MPIRUN $P $((501 + 2 * k)) 2 > "$tmp/m2" 2>&1 & b=$!
        wait $a; ra=$?; wait $b; rb=$?
        [ $ra = 0 ] && [ $rb = 0 ] && oks "$tmp/m1" 2 && oks "$tmp/m2" 2 ||
            { why "round $k: rc $ra $rb"; why "$(cat "$tmp/m1" "$tmp/m2")"; return 1; }
        k=$((k + 1))
    done
}
if command -v mpirun > /dev/null; then check "two mpirun -np 2 jobs at once, $ROUNDS rounds: all correct, never mixed" two_mpirun
else ok "two mpirun jobs # SKIP no mpirun (apt-get install openmpi-bin)"; fi

# --- two srun jobs at once (../shared/slurm-local): port from the job id, master from the node list
two_srun() {
    k=0
    while [ $k -lt $ROUNDS ]; do
        timeout 120 srun -n 2 $P $((600 + 2 * k)) 2 > "$tmp/s1" 2>&1 & a=$!
        timeout 120 srun -n 2 $P $((601 + 2 * k)) 2 > "$tmp/s2" 2>&1 & b=$!
        wait $a; ra=$?; wait $b; rb=$?
        [ $ra = 0 ] && [ $rb = 0 ] && oks "$tmp/s1" 2 && oks "$tmp/s2" 2 ||
            { why "round $k: rc $ra $rb"; why "$(cat "$tmp/s1" "$tmp/s2")"; return 1; }
        k=$((k + 1))
    done
}
if command -v srun > /dev/null && timeout 10 sinfo -h > /dev/null 2>&1; then
    check "two srun -n 2 jobs at once, $ROUNDS rounds: all correct, never mixed" two_srun
else ok "two srun jobs # SKIP no Slurm here (sudo bash ../shared/slurm-local/setup.sh)"; fi

# --- ddprun (the project's own launcher) for completeness
ddprun_job() {
    [ -x build/ddprun ] || $CC -std=c99 -O2 tools/ddprun.c -o build/ddprun -pthread || return 1
    timeout 60 build/ddprun -n 3 $P 701 3 > "$tmp/d" 2>&1 && oks "$tmp/d" 3
}
check "ddprun -n 3" ddprun_job

# --- Slurm's variables without Slurm: the port from the job id, the master from the node list
slurm_env() {
    for r in 0 1; do
        SLURM_PROCID=$r SLURM_NTASKS=2 SLURM_JOB_ID=4242 SLURM_STEP_ID=7 SLURM_STEP_NODELIST='localhost' \
            DDP_DEBUG=INFO timeout 60 $P 901 2 > "$tmp/se$r" 2>&1 &
        eval "pid$r=\$!"
    done
    wait $pid0; r0=$?; wait $pid1; r1=$?
    [ $r0 = 0 ] && [ $r1 = 0 ] && oks "$tmp/se0" 1 && oks "$tmp/se1" 1 &&
        grep -q "derived from the job's identity slurm:4242.7" "$tmp/se0" &&
        grep -q "master localhost: the first host of Slurm's node list" "$tmp/se0" ||
        { why "$(cat "$tmp/se0" "$tmp/se1")"; return 1; }
}
check "Slurm's variables, no MASTER_*: port from the job id, master from the node list" slurm_env
