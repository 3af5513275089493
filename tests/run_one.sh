#!/bin/sh
# SPDX-License-Identifier: MIT (see LICENSE)
# tests/run_one.sh — runs one test program for prove (`prove --exec tests/run_one.sh`), in its
# own scratch directory: TMPDIR is a fresh directory under the caller's TMPDIR (or /tmp), removed
# when the program ends, so what a test or libddp writes there (logs, traces, flight-recorder
# dumps) never outlives it and never meets what a test running beside it writes.
# The flavour's settings come from the program's path, so every make target runs it the same way:
#   build/san/*, build/fake_nccl_san/*   ASan+UBSan, leaks checked; the C tests at fewer world
#                                        sizes (DDP_TEST_QUICK: the plain run covers 1..8)
#   build/tsan/*, build/fake_nccl_tsan/* TSan, halting at the first report; the NCCL tests run
#                                        their scenarios only (T_NCCL_SCENARIOS_ONLY)
#   *.sh                                 with bash, from the repository root
t=$1
[ -n "$t" ] || { echo "usage: tests/run_one.sh TEST" >&2; exit 2; }
scratch=$(mktemp -d "${TMPDIR:-/tmp}/ddp-test.XXXXXX") || exit 1
trap 'rm -rf "$scratch"' EXIT
trap 'exit 129' HUP
trap 'exit 130' INT
trap 'exit 143' TERM
export TMPDIR="$scratch"
case $t in
    */san/*) export DDP_TEST_QUICK=1 ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 ;;
    */fake_nccl_san/*) export ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 ;;
    */tsan/*) export TSAN_OPTIONS=halt_on_error=1 T_NCCL_SCENARIOS_ONLY=1 ;;
    */fake_nccl_tsan/*) export TSAN_OPTIONS=halt_on_error=1 ;;
esac
case $t in
    *.sh) bash "$t" ;;
    */*) "$t" ;;
    *) "./$t" ;;
esac
