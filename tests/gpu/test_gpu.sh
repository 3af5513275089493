#!/usr/bin/env bash
# SPDX-License-Identifier: MIT (see LICENSE)
# tests/gpu/test_gpu.sh — `make test-gpu`: libddp's NCCL transport on real GPUs, as one command
# that ends within TEST_GPU_SECONDS (default 360).
#
#   make test-gpu              (bash tests/gpu/test_gpu.sh)
#   make test-gpu DRY=1        (bash tests/gpu/test_gpu.sh --dry-run): the libraries it finds and
#                              every command it would run; nothing runs, nothing is written
#
# What runs, with the real NCCL and CUDA runtime (binaries, logs and summary.txt in build/gpu/):
#   1. build: test_nccl, test_nccl_rooted, ddp-bench, ddprun and nccl-raw, compiled into build/gpu/ in
#      parallel without -Werror (a newer compiler may warn: the warnings go to the logs and the
#      summary, and the run goes on); the fake NCCL of tests/fake_nccl is not used.
#   2. the device matrices (test_nccl and test_nccl_rooted with T_DEVICE_REAL=1) at each world size p:
#      1, 2, 3 on one GPU, where the ranks share the GPU as NCCL "hosts" of their own (a distinct
#      NCCL_HOSTID per rank through T_DEVICE_HOSTID, NCCL_SOCKET_IFNAME=lo); 1, 2, G on G GPUs,
#      one rank per GPU.
#   3. test_nccl's scenarios in real mode (T_NCCL_SCENARIOS_ONLY=1; DDP_TEST_ONLY selects).
#   4. all_reduce at each p: nccl-raw (ncclAllReduce alone, GPU-event and host-synchronised
#      times) and ddp-bench --transport nccl (libddp), the same sizes, each rank a process under ddprun.
#   Each step runs under `timeout`; a step that no longer fits the time left is not started. The
#   summary (build/gpu/summary.txt, copied to $OUT when set, with the logs as a tarball) gives
#   the machine, the libraries, TAP counts per step, what NCCL or libddp said where something
#   failed or declined, and the benchmark tables with their ratios.
#
# Libraries, exported as DDP_CUDART_LIBRARY and DDP_NCCL_LIBRARY (absolute paths), the first
# found of: the variables themselves; LD_LIBRARY_PATH; the loader's cache (ldconfig -p);
# $CUDA_HOME and /usr/local/cuda (lib64, lib, targets/*/lib); Python environments (each python3
# on PATH, $VIRTUAL_ENV, $CONDA_PREFIX, /opt/*/.venv, /opt/*/venv, /opt/conda): the lib/ folders
# of the packages nvidia.nccl, nvidia.cu13, nvidia.cuda_runtime, nvidia.cu12 and torch/lib.
# Versioned names only (libcudart.so.13, libcudart.so.12, libnccl.so.2): an unversioned
# libcudart.so is a development link that may point anywhere.
#
# Knobs: TEST_GPU_SECONDS (360), TEST_GPU_RANKS (world sizes, "1 2 3" on one GPU),
# TEST_GPU_SIZES ("-b 16 -e 256M -f 4"), TEST_GPU_ITERS ("-n 20 -w 5"), DDP_TEST_ONLY (the
# scenarios), NCCL_DEBUG (INFO, into build/gpu/nccl/), CC, OUT. Test hooks replacing the
# search's sources: TEST_GPU_LDCONFIG (a command), TEST_GPU_CUDA_DIRS, TEST_GPU_PYTHONS,
# TEST_GPU_NVIDIA_SMI.
# No GPU (nvidia-smi missing, or listing none): one line, exit 0. Exit status 1 when a check
# failed, a step failed or timed out, or a benchmark counted wrong values.

set -u
cd "$(dirname "$0")/../.." || exit 2
B=build/gpu
T_START=$(date +%s)
TOTAL=${TEST_GPU_SECONDS:-360}
DEADLINE=$((T_START + TOTAL))
CC=${CC:-cc}
SIZES=${TEST_GPU_SIZES:--b 16 -e 256M -f 4}
ITERS=${TEST_GPU_ITERS:--n 20 -w 5}
SMI=${TEST_GPU_NVIDIA_SMI:-nvidia-smi}
CFLAGS_GPU="-std=c99 -O2 -g -Wall -Wextra -Wpedantic -Wshadow -I."
unset RANK WORLD_SIZE LOCAL_RANK OMPI_COMM_WORLD_RANK OMPI_COMM_WORLD_SIZE PMI_RANK PMI_SIZE

DRY=${DRY:-0}
case $DRY in '' | 0 | no | false) DRY=0 ;; *) DRY=1 ;; esac
for a in "$@"; do
    case $a in
    --dry-run) DRY=1 ;;
    -h | --help) sed -n '3,/^$/s/^# \{0,1\}//p' "$0"; exit 0 ;;
    *) echo "test_gpu.sh: unknown argument '$a' (--dry-run, --help)" >&2; exit 2 ;;
    esac
done
say() { echo "test-gpu: $*"; }

# ---- GPUs ---------------------------------------------------------------------------------
G=0 GPU_WHY="" SMI_L=""
count_gpus() {
    local n
    if ! command -v "$SMI" > /dev/null 2>&1; then GPU_WHY="$SMI not found"; return 1; fi
    SMI_L=$(timeout 30 "$SMI" -L 2>&1)
    G=$(printf '%s\n' "$SMI_L" | grep -c '^GPU [0-9]')
    if [ "$G" -lt 1 ]; then
        GPU_WHY="$SMI -L lists none${SMI_L:+: $(printf '%s\n' "$SMI_L" | head -n 1)}"
        return 1
    fi
    if [ -n "${CUDA_VISIBLE_DEVICES+x}" ]; then
        n=$(printf '%s\n' "$CUDA_VISIBLE_DEVICES" | tr ',' '\n' | grep -c .)
        [ "$n" -lt 1 ] && { GPU_WHY="CUDA_VISIBLE_DEVICES is empty"; G=0; return 1; }
        [ "$n" -lt "$G" ] && G=$n
    fi
    return 0
}

# ---- libraries ----------------------------------------------------------------------------
case $(uname -m) in x86_64) ARCH_TAG=x86-64 ;; aarch64) ARCH_TAG=AArch64 ;; *) ARCH_TAG="" ;; esac
if [ -n "${TEST_GPU_LDCONFIG+x}" ]; then LDC=$($TEST_GPU_LDCONFIG -p 2> /dev/null)
else LDC=$(ldconfig -p 2> /dev/null || /sbin/ldconfig -p 2> /dev/null); fi
CUDA_DIRS=${TEST_GPU_CUDA_DIRS-${CUDA_HOME:-} /usr/local/cuda}
PY_DIRS="" PY_DONE=0

# abs FILE: FILE with its folder made absolute; the file name stays (a soname link is kept)
abs() { printf '%s/%s\n' "$(cd "$(dirname "$1")" && pwd -P)" "$(basename "$1")"; }
# ldcache NAME: NAME's path in the loader's cache, this machine's architecture first
ldcache() {
    printf '%s\n' "$LDC" | awk -v n="$1" -v tag="$ARCH_TAG" '
        $1 == n { if (tag == "" || index($0, "," tag ")")) { print $NF; done = 1; exit } if (first == "") first = $NF }
        END { if (!done && first != "") print first }'
}
pythons() {
    local d n p
    # shellcheck disable=SC2086  # a list of paths
    if [ -n "${TEST_GPU_PYTHONS+x}" ]; then printf '%s\n' $TEST_GPU_PYTHONS; return; fi
    {
        printf '%s\n' "${PATH:-}" | tr ':' '\n' | while IFS= read -r d; do
            for n in python3 python; do [ -n "$d" ] && [ -x "$d/$n" ] && echo "$d/$n"; done
        done
        for p in ${VIRTUAL_ENV:+"$VIRTUAL_ENV/bin/python3"} ${CONDA_PREFIX:+"$CONDA_PREFIX/bin/python3"} \
                 /opt/*/.venv/bin/python3 /opt/*/venv/bin/python3 /opt/conda/bin/python3 \
                 ${HOME:+"$HOME/.venv/bin/python3"}; do
            [ -x "$p" ] && echo "$p"
        done
    } | awk '!seen[$0]++'   # one venv's python3 links to the system's, yet sees other packages
}
# Each Python's package folders, "python<TAB>package<TAB>lib folder" (asked once, when needed).
python_dirs() {
    local py
    [ "$PY_DONE" = 1 ] && return
    PY_DONE=1
    while IFS= read -r py; do
        [ -n "$py" ] || continue
        PY_DIRS="$PY_DIRS$(timeout 20 "$py" - 2> /dev/null << 'EOF' | sed "s|^|$py	|"
import importlib.util, os
for name in ("nvidia.nccl", "nvidia.cu13", "nvidia.cuda_runtime", "nvidia.cu12", "torch"):
    try:
        spec = importlib.util.find_spec(name)
    except Exception:
        spec = None
    for d in (spec.submodule_search_locations or []) if spec else []:
        print(name + "\t" + os.path.join(d, "lib"))
EOF
)
"
    done << EOF
$(pythons)
EOF
}
# find VAR NAMES...: PICK = the first of NAMES in the sources above, PICK_WHY = where from
find_lib() {
    local var=$1 val name d h py pkg dir
    shift
    PICK="" PICK_WHY=""
    eval "val=\${$var:-}"
    if [ -n "$val" ]; then
        case $val in
        */*) if [ -f "$val" ]; then PICK=$(abs "$val"); PICK_WHY="$var is set"
             else PICK_WHY="$var=$val: no such file"; fi ;;
        *) PICK=$(ldcache "$val")
           if [ -n "$PICK" ]; then PICK_WHY="$var=$val, found by ldconfig -p"
           else PICK_WHY="$var=$val: not in the loader's cache (ldconfig -p)"; fi ;;
        esac
        return
    fi
    for name; do
        while IFS= read -r d; do
            [ -n "$d" ] && [ -f "$d/$name" ] && { PICK=$(abs "$d/$name"); PICK_WHY="LD_LIBRARY_PATH ($d)"; return; }
        done << EOF
$(printf '%s\n' "${LD_LIBRARY_PATH:-}" | tr ':' '\n')
EOF
    done
    for name; do
        PICK=$(ldcache "$name")
        [ -n "$PICK" ] && { PICK_WHY="the loader's cache (ldconfig -p: $name)"; return; }
    done
    for h in $CUDA_DIRS; do
        for d in "$h/lib64" "$h/lib" "$h"/targets/*/lib; do
            for name; do
                [ -f "$d/$name" ] && { PICK=$(abs "$d/$name"); PICK_WHY="CUDA install $h"; return; }
            done
        done
    done
    python_dirs
    for name; do
        while IFS='	' read -r py pkg dir; do
            [ -n "$dir" ] && [ -f "$dir/$name" ] && { PICK=$(abs "$dir/$name"); PICK_WHY="Python environment of $py (package $pkg)"; return; }
        done << EOF
$PY_DIRS
EOF
    done
    PICK_WHY="not found (looked in: LD_LIBRARY_PATH, ldconfig -p, ${CUDA_DIRS:-no CUDA folders}, the Python environments of: $(pythons | tr '\n' ' '))"
}
# describe PATH: PATH, and the file its links end at (its version is in the name)
describe() {
    local t
    t=$(readlink -f "$1" 2> /dev/null)
    if [ -n "$t" ] && [ "$t" != "$1" ]; then echo "$1 (-> $(basename "$t"))"; else echo "$1"; fi
}

# ---- steps --------------------------------------------------------------------------------
ORDER=()
declare -A R_DESC R_RES R_SECS R_PASS R_FAIL R_SKIP R_P R_SAID
KEEP=0 FAILED=0 CUR=""   # CUR: the timeout processes running now (the trap stops them)

# q ARGS...: the arguments as one shell-quoted line
q() {
    local a out=""
    for a; do
        case $a in
        '' | *[!A-Za-z0-9_./=:,+@%-]*) out="$out '$(printf '%s' "$a" | sed "s/'/'\\\\''/g")'" ;;
        *) out="$out $a" ;;
        esac
    done
    printf '%s\n' "${out# }"
}

# step ID KIND P DESC LIMIT NEED CMD...: runs CMD under timeout, stdout to build/gpu/ID.log,
# stderr to ID.err, NCCL's debug output to nccl/ID.<pid>.log. Not started when fewer than 10 s
# are left beyond KEEP (the time held back for the steps after it) or when NEED was not built.
step() {
    local id=$1 kind=$2 p=$3 desc=$4 lim=$5 need=$6 left t0 rc
    shift 6
    ORDER+=("$id")
    R_P[$id]=$p R_DESC[$id]=$desc R_SECS[$id]=0
    if [ "$DRY" = 1 ]; then
        printf '  [%s, up to %s s]\n    %s\n' "$desc${p:+ p=$p}" "$lim" "$(q "$@")"
        return 0
    fi
    if [ -n "$need" ] && [ ! -x "$B/$need" ]; then R_RES[$id]="not run: $need did not build"; FAILED=1; return 1; fi
    left=$((DEADLINE - $(date +%s) - KEEP))
    if [ "$left" -lt 10 ]; then R_RES[$id]="not run: out of time (TEST_GPU_SECONDS=$TOTAL)"; return 1; fi
    [ "$lim" -gt "$left" ] && lim=$left
    say "$desc${p:+ p=$p} (up to $lim s)"
    q "$@" > "$B/$id.cmd"
    R_RES[$id]="interrupted"
    t0=$(date +%s)
    # in the background, so that Ctrl-C reaches the trap now, not when the step ends
    NCCL_DEBUG_FILE="$PWD/$B/nccl/$id.%p.log" timeout -k 5 "$lim" "$@" > "$B/$id.log" 2> "$B/$id.err" < /dev/null &
    CUR=$!
    wait "$CUR"
    rc=$?
    CUR=""
    R_SECS[$id]=$(($(date +%s) - t0))
    case $rc in
    0) R_RES[$id]=ok ;;
    124 | 137) R_RES[$id]="TIMED OUT (limit $lim s)" ;;
    *) R_RES[$id]="exit $rc" ;;
    esac
    [ "$rc" != 0 ] && [ "$kind" != info ] && FAILED=1   # nvidia-smi or -V failing is no check failing
    [ "$kind" = tap ] && tap_count "$id"
    return $rc
}

# TAP counts of a step's stdout; a "not ok" fails the run, so does a TAP run without its plan.
tap_count() {
    local f=$B/$1.log
    R_SKIP[$1]=$(grep -cE '^ok [0-9]+.*# *SKIP' "$f")
    R_PASS[$1]=$(($(grep -cE '^ok [0-9]+' "$f") - R_SKIP[$1]))
    R_FAIL[$1]=$(grep -cE '^not ok [0-9]+' "$f")
    grep -qE '^1\.\.0 *# *SKIP' "$f" && R_SKIP[$1]=$((R_SKIP[$1] + 1))
    [ "${R_FAIL[$1]}" -gt 0 ] && FAILED=1
    if [ "${R_RES[$1]}" = ok ] && ! grep -qE '^1\.\.[0-9]+' "$f"; then R_RES[$1]="no TAP plan"; FAILED=1; fi
    if [ "${R_RES[$1]}" = ok ] && grep -qE '^1\.\.0' "$f"; then R_RES[$1]="ok: no checks ran"; fi
    return 0
}

# What NCCL or libddp answered: NCCL's WARN lines, init and decline messages, failed checks.
# A step that failed without a WARN (a hang) gets the last line NCCL logged in a few processes.
said() {
    local id=$1 all=$2 f
    {
        cat "$B/nccl/$id".*.log 2> /dev/null | grep 'NCCL WARN' | sed 's/^.*NCCL WARN/NCCL WARN:/'
        if [ "$all" = 1 ] && ! grep -qs 'NCCL WARN' "$B/nccl/$id".*.log; then
            # shellcheck disable=SC2012  # our own file names: ID.PID.log
            for f in $(ls -t "$B/nccl/$id".*.log 2> /dev/null | head -n 3); do
                echo "NCCL's last line (${f##*/}): $(tail -n 1 "$f")"
            done
        fi
        if [ "$all" = 1 ]; then
            grep -hE '^not ok|^# .*(init|declin|fail|error|NCCL)|^Bail out' "$B/$id.log" 2> /dev/null
            grep -hiE 'warn|error|fail|declin|abort|timed out|^(\[rank [0-9]+\] )?(nccl-raw|ddp-bench|ddprun):' "$B/$id.err" 2> /dev/null
        else
            grep -hiE '^# .*declin|^1\.\.0 *# *SKIP' "$B/$id.log" 2> /dev/null
        fi
    } | sed -e 's/^\[rank [0-9]*\] //' -e 's/^\(.\{300\}\).*/\1 .../' | awk '!seen[$0]++' | head -n 8
}

# ---- benchmark table ----------------------------------------------------------------------
# bench_table P: nccl-raw's rows (events and host-synchronised) joined with ddp-bench's JSON
# rows (out of place) by size; ratios are ddp-bench's algbw over the raw ones (from the times,
# which keep their precision at sizes where GB/s rounds to 0).
bench_table() {
    local p=$1
    awk -v raw="$B/raw$p.log" -v js="$B/bench_ddp_p$p.json" '
        function val(s, k,   r) {
            if (!match(s, "\"" k "\": -?[0-9.eE+-]+")) return ""
            r = substr(s, RSTART, RLENGTH); sub(/^[^:]*: /, "", r); return r
        }
        function human(b) {
            if (b >= 1073741824 && b % 1073741824 == 0) return (b / 1073741824) " GiB"
            if (b >= 1048576 && b % 1048576 == 0) return (b / 1048576) " MiB"
            if (b >= 1024 && b % 1024 == 0) return (b / 1024) " KiB"
            return b " B"
        }
        function add(b) { if (!(b in seen)) { seen[b] = 1; order[++n] = b } }
        function ratio(a, b) { return (a != "" && b != "" && b + 0 > 0) ? sprintf("%.2f", a / b) : "-" }   # times: raw / ddp
        function or(v) { return v == "" ? "-" : v }
        BEGIN {
            while ((getline l < raw) > 0) {
                sub(/^\[rank [0-9]+\] /, "", l)
                if (split(l, a, " ") == 7 && a[1] ~ /^[0-9]+$/) { add(a[1]); rt[a[1]] = a[4]; rg[a[1]] = a[5]; ht[a[1]] = a[6]; hg[a[1]] = a[7] }
            }
            while ((getline l < js) > 0) {
                if (l !~ /"placement": "out-of-place"/) continue
                b = val(l, "bytes"); add(b); dt[b] = val(l, "time_us"); dg[b] = val(l, "algbw_GBs"); dw[b] = val(l, "wrong")
            }
            if (!n) { print "    (no rows: see the logs)"; exit }
            printf "    %9s | %10s %8s | %10s %8s | %10s %8s %6s | %8s %8s\n", "size", "raw-ev us", "GB/s",
                   "raw-host us", "GB/s", "ddp us", "GB/s", "wrong", "ddp/host", "ddp/ev"
            for (i = 1; i <= n; i++) {
                b = order[i]
                printf "    %9s | %10s %8s | %10s %8s | %10s %8s %6s | %8s %8s\n", human(b), or(rt[b]), or(rg[b]),
                       or(ht[b]), or(hg[b]), (dt[b] == "" ? "-" : sprintf("%.2f", dt[b])),
                       (dg[b] == "" ? "-" : sprintf("%.3f", dg[b])), or(dw[b]), ratio(ht[b], dt[b]), ratio(rt[b], dt[b])
            }
        }'
}

bench_wrong() {   # the wrong values ddp-bench counted at P (empty: no JSON)
    grep -o '"wrong": [0-9-]*' "$B/bench_ddp_p$1.json" 2> /dev/null | head -n 1 | sed 's/.*: //'
}

# ---- summary ------------------------------------------------------------------------------
write_summary() {
    local f=$B/summary.txt id p w out
    {
        echo "libddp make test-gpu: $(date -u '+%Y-%m-%d %H:%M UTC'), $(hostname), $(nproc) CPUs, $(uname -r)"
        echo
        echo "machine"
        printf '%s\n' "$SMI_L" | sed 's/^/  /'
        [ -s "$B/smi.log" ] && sed 's/^/  /' "$B/smi.log"
        [ -s "$B/versions.log" ] && sed 's/^/  /' "$B/versions.log"
        echo "  CUDA runtime: $(describe "$CUDART") [$CUDART_WHY]"
        echo "  NCCL:         $(describe "$NCCL") [$NCCL_WHY]"
        echo "  compiler: $($CC --version 2> /dev/null | head -n 1); flags: $CFLAGS_GPU (no -Werror)"
        echo "  world sizes: $PLIST$([ "$G" = 1 ] && echo " on one GPU (ranks as NCCL hosts: NCCL_HOSTID per rank, NCCL_SOCKET_IFNAME=${NCCL_SOCKET_IFNAME:-lo})")"
        echo "  time: $(($(date +%s) - T_START)) s of TEST_GPU_SECONDS=$TOTAL"
        echo
        echo "steps (checks = TAP lines of the binary's output)"
        printf '  %-34s %5s %5s %5s %5s  %s\n' step pass fail skip secs result
        for id in "${ORDER[@]}"; do
            printf '  %-34s %5s %5s %5s %5s  %s\n' "${R_DESC[$id]}${R_P[$id]:+ p=${R_P[$id]}}" "${R_PASS[$id]:-}" \
                "${R_FAIL[$id]:-}" "${R_SKIP[$id]:-}" "${R_SECS[$id]}" "${R_RES[$id]:-?}"
        done
        for id in "${ORDER[@]}"; do
            case ${R_RES[$id]:-} in ok | "ok: no checks ran") w=$([ "${R_FAIL[$id]:-0}" -gt 0 ] && echo 1 || echo 0) ;; "not run"*) continue ;; *) w=1 ;; esac
            R_SAID[$id]=$(said "$id" "$w")
            if [ -n "${R_SAID[$id]}" ]; then
                echo
                echo "  ${R_DESC[$id]}${R_P[$id]:+ p=${R_P[$id]}} (${R_RES[$id]}; $B/$id.log, .err, nccl/$id.*):"
                printf '%s\n' "${R_SAID[$id]}" | sed 's/^/    /'
            fi
        done
        echo
        echo "all_reduce, float32 sum, out of place, $SIZES $ITERS; algbw = size / time, GB = 1e9 B."
        echo "raw-ev: nccl-raw, cudaEventRecord around back-to-back calls (what NCCL can do); raw-host:"
        echo "nccl-raw, each call then cudaStreamSynchronize, host clock (how ddp-bench times a call);"
        echo "ddp: ddp-bench --transport nccl (enqueue + ddp_comm_device_synchronize per call). Times are means"
        echo "over ranks. ddp/host = the library's overhead, ddp/ev = against NCCL's ceiling."
        for p in $PLIST; do
            echo
            echo "  p = $p (nccl-raw: ${R_RES[raw$p]:-not run}; ddp-bench: ${R_RES[ddp$p]:-not run})"
            bench_table "$p"
        done
    } > "$f"
    if [ -n "${OUT:-}" ] && [ -d "${OUT:-}" ]; then
        out=$(cd "$OUT" && pwd -P)
        cp "$f" "$out/summary.txt"
        (cd "$B" && shopt -s nullglob && tar -czf "$out/test-gpu-logs.tar.gz" -- *.txt *.log *.err *.cmd *.json nccl) 2> /dev/null
    fi
}

# ---- main ---------------------------------------------------------------------------------
if ! count_gpus; then
    if [ "$DRY" = 0 ]; then say "skipped: no GPU here ($GPU_WHY)"; exit 0; fi
    say "dry run: no GPU here ($GPU_WHY); the plan below is for one GPU"
    G=1
fi
if [ -n "${TEST_GPU_RANKS:-}" ]; then PLIST=$TEST_GPU_RANKS
elif [ "$G" -eq 1 ]; then PLIST="1 2 3"
else PLIST=$(printf '%s\n' 1 2 "$G" | sort -n -u | tr '\n' ' '); PLIST=${PLIST% }; fi
PMAX=$(printf '%s\n' "$PLIST" | tr ' ' '\n' | sort -n | tail -n 1)

find_lib DDP_CUDART_LIBRARY libcudart.so.13 libcudart.so.12
CUDART=$PICK CUDART_WHY=$PICK_WHY
find_lib DDP_NCCL_LIBRARY libnccl.so.2
NCCL=$PICK NCCL_WHY=$PICK_WHY
say "CUDA runtime: ${CUDART:+$(describe "$CUDART")} [$CUDART_WHY]"
say "NCCL:         ${NCCL:+$(describe "$NCCL")} [$NCCL_WHY]"
export DDP_CUDART_LIBRARY=$CUDART DDP_NCCL_LIBRARY=$NCCL
export NCCL_DEBUG=${NCCL_DEBUG:-INFO}
one_gpu_env=()   # several ranks on one GPU: each its own NCCL host, over loopback sockets
[ "$G" = 1 ] && one_gpu_env=(NCCL_SOCKET_IFNAME="${NCCL_SOCKET_IFNAME:-lo}")

if [ "$DRY" = 1 ]; then
    say "dry run: $G GPU$([ "$G" = 1 ] || echo s), world sizes $PLIST; would run, in this order, each under timeout -k 5 LIMIT"
    echo "  export DDP_CUDART_LIBRARY=$(q "$CUDART") DDP_NCCL_LIBRARY=$(q "$NCCL") NCCL_DEBUG=$NCCL_DEBUG"
    echo "  (and per step NCCL_DEBUG_FILE=$PWD/$B/nccl/STEP.%p.log; stdout to $B/STEP.log, stderr to STEP.err)"
else
    rm -rf "$B"
    if [ -z "$CUDART" ] || [ -z "$NCCL" ]; then
        mkdir -p "$B"
        R_RES[libs]="no library"; ORDER=(libs); R_DESC[libs]="find libcudart and libnccl"; R_SECS[libs]=0; R_P[libs]=""
        PLIST=""; write_summary
        say "FAILED: a GPU is here but no CUDA runtime or NCCL was found; see $B/summary.txt"
        exit 1
    fi
    mkdir -p "$B/nccl"
    # shellcheck disable=SC2086  # CUR is a list of pids
    trap '[ -n "$CUR" ] && kill -TERM $CUR 2> /dev/null; wait; write_summary; say "interrupted; summary in $B/summary.txt"; exit 130' INT TERM
fi

# 1. build, in parallel
KEEP=150
build_one() {   # NAME SOURCE: the compiler's command line
    # test_nccl links libddp's implementation (tests/libddp.c, its transports: tcp, shm, nccl).
    local impl=""
    [ "$1" = test_nccl ] && impl=" tests/libddp.c -DT_IMPL_SHM=1 -DT_IMPL_NCCL=1"
    echo "$CC $CFLAGS_GPU $2 -o $B/$1$impl -pthread -lm -ldl"
}
BUILDS="test_nccl:tests/test_nccl.c test_nccl_rooted:tests/test_nccl_rooted.c ddp-bench:bench/ddp_bench.c nccl-raw:bench/nccl_raw.c ddprun:tools/ddprun.c"
if [ "$DRY" = 1 ]; then
    echo "  [build, in parallel, up to 120 s]"
    for b in $BUILDS; do echo "    $(build_one "${b%%:*}" "${b#*:}")"; done
else
    lim=$((DEADLINE - $(date +%s) - KEEP)); [ "$lim" -gt 120 ] && lim=120
    say "building into $B (up to $lim s)"
    pids=""
    for b in $BUILDS; do
        name=${b%%:*}
        cmd=$(build_one "$name" "${b#*:}")
        echo "$cmd" > "$B/build_$name.cmd"
        # shellcheck disable=SC2086  # the command line is ours, words split on purpose
        (t0=$(date +%s); timeout -k 5 "$lim" $cmd > "$B/build_$name.log" 2>&1; echo "$? $(($(date +%s) - t0))" > "$B/build_$name.rc") &
        pids="$pids $!"
    done
    CUR=$pids
    # shellcheck disable=SC2086
    wait $pids
    CUR=""
    for b in $BUILDS; do
        name=${b%%:*} id=build_$name
        read -r rc secs < "$B/$id.rc" 2> /dev/null || { rc=1 secs=0; }
        ORDER+=("$id"); R_P[$id]="" R_SECS[$id]=$secs
        nw=$(grep -c 'warning:' "$B/$id.log")
        R_DESC[$id]="build $name"
        case $rc in
        0) R_RES[$id]="ok$([ "$nw" -gt 0 ] && echo ", $nw warnings")" ;;
        124 | 137) R_RES[$id]="TIMED OUT (limit $lim s)"; FAILED=1 ;;
        *) R_RES[$id]="FAILED (exit $rc)"; FAILED=1 ;;
        esac
        # what the compiler said goes to the summary (said() reads .err)
        grep -E 'error|warning' "$B/$id.log" > "$B/$id.err"
    done
fi

# 2. what is here: the GPUs, driver, NCCL and CUDA runtime versions
KEEP=170
step smi info "" "nvidia-smi" 20 "" "$SMI" --query-gpu=index,name,driver_version,memory.total,compute_cap --format=csv,noheader
[ "$DRY" = 0 ] && [ -s "$B/smi.err" ] && [ ! -s "$B/smi.log" ] &&
    step smi2 info "" "nvidia-smi (fewer fields)" 20 "" "$SMI" --query-gpu=index,name,driver_version,memory.total --format=csv,noheader
[ "$DRY" = 0 ] && [ -s "$B/smi2.log" ] && cp "$B/smi2.log" "$B/smi.log"
step versions info "" "nccl-raw -V (libraries, versions)" 30 nccl-raw "$B/nccl-raw" -V

# 3. the device matrices, by world size
KEEP=170
for p in $PLIST; do
    hostid=()
    [ "$G" = 1 ] && [ "$p" -gt 1 ] && hostid=(T_DEVICE_HOSTID="gpu-m$p" "${one_gpu_env[@]}")
    lim1=$([ "$p" = 1 ] && echo 45 || echo 90)
    lim2=$([ "$p" = 1 ] && echo 35 || echo 60)
    step "m1p$p" tap "$p" "test_nccl device matrix" "$lim1" test_nccl \
        env T_DEVICE_REAL=1 T_DEVICE_RANKS="$p" "${hostid[@]}" DDP_TEST_ONLY="device matrix tcp p=$p" "$B/test_nccl"
    step "m2p$p" tap "$p" "test_nccl_rooted device matrix" "$lim2" test_nccl_rooted \
        env T_DEVICE_REAL=1 T_DEVICE_RANKS="$p" "${hostid[@]}" DDP_TEST_ONLY="device matrix tcp p=$p" "$B/test_nccl_rooted"
done

# 4. test_nccl's scenarios (the fault and stream cases), real mode
KEEP=85
scen_env=(T_DEVICE_REAL=1 T_DEVICE_RANKS="$PMAX" T_NCCL_SCENARIOS_ONLY=1)
[ "$G" = 1 ] && [ "$PMAX" -gt 1 ] && scen_env+=(T_DEVICE_HOSTID=gpu-s "${one_gpu_env[@]}")
if [ -n "${DDP_TEST_ONLY:-}" ]; then scen_env+=(DDP_TEST_ONLY="$DDP_TEST_ONLY"); else scen_env=(-u DDP_TEST_ONLY "${scen_env[@]}"); fi
step scen tap "$PMAX" "test_nccl scenarios" 120 test_nccl env "${scen_env[@]}" "$B/test_nccl"

# 5. all_reduce: nccl-raw against ddp-bench --transport nccl, one rank per process under ddprun
KEEP=45
for p in $PLIST; do
    rank=("$B/ddprun" -n "$p") benv=(DDP_TIMEOUT_MS=30000)
    # shellcheck disable=SC2016  # $RANK is each rank's, expanded by its own shell
    [ "$G" = 1 ] && [ "$p" -gt 1 ] && rank+=(sh -c 'NCCL_HOSTID=gpu-b-h$RANK exec "$0" "$@"') benv+=("${one_gpu_env[@]}")
    # shellcheck disable=SC2086  # SIZES and ITERS are lists of options
    step "raw$p" bench "$p" "bench nccl-raw" 40 nccl-raw env "${benv[@]}" "${rank[@]}" "$B/nccl-raw" $SIZES $ITERS
    # shellcheck disable=SC2086
    step "ddp$p" bench "$p" "bench ddp-bench --transport nccl" 60 ddp-bench env "${benv[@]}" "${rank[@]}" \
        "$B/ddp-bench" --transport nccl -o all_reduce -d float --inplace 0 -c 1 $SIZES $ITERS -J "$B/bench_ddp_p$p.json"
    if [ "$DRY" = 0 ]; then
        w=$(bench_wrong "$p")
        [ -n "$w" ] && [ "$w" != 0 ] && { R_RES[ddp$p]="${R_RES[ddp$p]}, $w wrong"; FAILED=1; }
    fi
    KEEP=5
done

if [ "$DRY" = 1 ]; then
    say "dry run: nothing was run; a real run writes $B/summary.txt (and a copy to \$OUT)"
    exit 0
fi
write_summary
cat "$B/summary.txt"
if [ "$FAILED" = 1 ]; then say "FAILED (see above; logs in $B/)"; exit 1; fi
say "passed; summary in $B/summary.txt"
exit 0
