# SPDX-License-Identifier: MIT (see LICENSE)
# bench/bench_lib.sh — shell helpers shared by compare.sh and knobs.sh (bash; source it).
# shellcheck shell=bash
# The machine is small (2 cores) and shared, so every run records how much CPU other processes
# used meanwhile; the summaries prefer the undisturbed runs.

HZ=$(getconf CLK_TCK)

# All CPUs' busy jiffies since boot: user nice system irq softirq (not idle, iowait, steal).
# With tick accounting a softirq tick is also charged to the interrupted process's stime, so
# this is comparable to what /usr/bin/time reports for our own processes.
jiffies_busy() {
    local _cpu a b c _d _e f g _rest
    read -r _cpu a b c _d _e f g _rest < /proc/stat
    echo $((a + b + c + f + g))
}

# Cores busy over one second (everything on the machine).
busy_cores() {
    local j0 j1
    j0=$(jiffies_busy)
    sleep 1
    j1=$(jiffies_busy)
    awk -v j="$((j1 - j0))" -v hz="$HZ" 'BEGIN { printf "%.2f\n", j / hz }'
}

# wait_idle MAX_S: until the machine has been quiet (< 0.15 cores busy) for 3 s in a row, or
# MAX_S seconds passed (then it says so and returns 1).
wait_idle() {
    local max=$1 waited=0 quiet=0 b
    [ "$max" -gt 0 ] || return 0
    while [ "$waited" -lt "$max" ]; do
        b=$(busy_cores)
        waited=$((waited + 1))
        if awk -v b="$b" 'BEGIN { exit !(b < 0.15) }'; then
            quiet=$((quiet + 1))
            [ "$quiet" -ge 3 ] && return 0
        else
            quiet=0
            [ $((waited % 15)) -eq 1 ] && echo "== other load: $b cores busy; waiting ($waited/$max s)"
        fi
    done
    echo "== warning: the machine stayed busy for $max s; measuring anyway"
    return 1
}

# run NAME command...: output into $RAW/NAME.txt (and the terminal unless QUIET=1); into
# $RAW/NAME.load "elapsed_s own_cores other_cores": CPU of the run (all its processes, from
# GNU time, which counts waited-for children) and of everything else meanwhile (/proc/stat
# minus ours). A failure is appended to FAILED, not fatal.
FAILED=""
run() {
    local name=$1 rc j0 j1 e u s
    shift
    [ "${QUIET:-0}" = 1 ] || echo "== $name: $*"
    j0=$(jiffies_busy)
    if [ "${QUIET:-0}" = 1 ]; then
        /usr/bin/time -o "$RAW/$name.time" -f "%e %U %S" "$@" > "$RAW/$name.txt" 2>&1
        rc=$?
    else
        /usr/bin/time -o "$RAW/$name.time" -f "%e %U %S" "$@" 2>&1 | tee "$RAW/$name.txt"
        rc=${PIPESTATUS[0]}
    fi
    j1=$(jiffies_busy)
    read -r e u s < <(tail -1 "$RAW/$name.time")
    awk -v e="$e" -v u="$u" -v s="$s" -v j="$((j1 - j0))" -v hz="$HZ" 'BEGIN {
        if (e < 0.001) e = 0.001
        o = (j / hz - u - s) / e; if (o < 0) o = 0
        printf "%.3f %.3f %.3f\n", e, (u + s) / e, o }' > "$RAW/$name.load"
    read -r e u s < "$RAW/$name.load"
    echo "# $name: ${e} s; it used $u cores, other processes $s cores meanwhile"
    if [ "$rc" -ne 0 ]; then
        echo "== $name FAILED (exit status $rc)"
        [ "${QUIET:-0}" = 1 ] && tail -5 "$RAW/$name.txt"
        FAILED="$FAILED $name"
        rm -f "$RAW/$name.json"
    fi
    return 0
}
