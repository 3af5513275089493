#!/bin/sh
# SPDX-License-Identifier: MIT (see LICENSE)
# A rank for tests/test_ddprun_replace.sh (ddprun --elastic --max-restarts: a lost rank replaced
# by a process that joins the running job). It records what ddprun gave it, then acts as the
# test's plan says for it.
#
#   replace_rank.sh DIR WHO=ACTION...
#
# WHO is this process: its RANK for a rank started with the job, rK for the K-th replacement
# (DDP_ELASTIC_REPLACEMENT=K). It writes DIR/pid.WHO (its pid) and then DIR/env.WHO (its
# environment, sorted), each whole (written aside, then renamed). ACTION:
#   exit:N          exit N at once
#   after:FILE:N    wait until DIR/FILE exists, then exit N
#   bgexit:N        leave a child behind, holding the rank's stdout and stderr, and exit N; the
#                   child waits for DIR/env.r1, writes "leftover of pid P" to stdout, then
#                   creates DIR/leftover.done and exits
# A process the plan does not name waits for DIR/end and exits 0. Every wait ends after 60 s
# (exit 99), or at once when DIR/abort exists or DIR is gone (exit 98: the test gave up).
d=$1
shift
if [ -n "${DDP_ELASTIC_REPLACEMENT-}" ]; then who=r$DDP_ELASTIC_REPLACEMENT; else who=$RANK; fi
echo $$ > "$d/.pid.$who" && mv "$d/.pid.$who" "$d/pid.$who"
env | sort > "$d/.env.$who" && mv "$d/.env.$who" "$d/env.$who"
echo "$who here (pid $$)"

wait_for() {
    i=0
    while [ ! -e "$d/$1" ]; do
        [ -e "$d/abort" ] || [ ! -d "$d" ] && exit 98
        i=$((i + 1))
        [ $i -gt 6000 ] && exit 99
        sleep 0.01
    done
}

action=after:end:0
for w in "$@"; do
    case $w in "$who="*) action=${w#*=} ;; esac
done
case $action in
    exit:*) exit "${action#exit:}" ;;
    after:*)
        rest=${action#after:}
        wait_for "${rest%:*}"
        exit "${rest##*:}" ;;
    bgexit:*)
        ( wait_for env.r1; echo "leftover of pid $$"; : > "$d/leftover.done" ) &
        exit "${action#bgexit:}" ;;
    *) echo "replace_rank.sh: unknown action '$action'" >&2; exit 97 ;;
esac
