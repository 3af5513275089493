#!/bin/sh
# SPDX-License-Identifier: MIT (see LICENSE)
# tests/test_vendoring.sh — vendoring as the README says: `make dist`, then dist/ddp.h, the
# transports and the sampler copied flat into an empty folder; the README's example (its first
# C block), with its transport includes written flat ("ddp_tcp.h"), builds there with gcc (C99),
# clang (C99) and g++ (C++17) under -Wall -Wextra -Wpedantic -Wshadow -Werror, and runs as 2
# ranks over TCP and over shared memory. Prints TAP; run from the repository root.
set -u
cd "$(dirname "$0")/.." || { echo "Bail out! no repository root"; exit 1; }
root=$(pwd)
tmp=$(mktemp -d "${TMPDIR:-/tmp}/vendoring.XXXXXX") || { echo "Bail out! mktemp failed"; exit 1; }
trap 'rm -rf "$tmp"' EXIT
unset RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE MASTER_ADDR MASTER_PORT DDP_JOB_SECRET DDP_TRANSPORT CPATH C_INCLUDE_PATH
. tests/tap.sh   # ok, notok, check, why
WARN="-Wall -Wextra -Wpedantic -Wshadow -Werror"
echo "1..8"

dist_ok() {
    python3 tools/amalgamate.py "$tmp/dist" > "$tmp/why" 2>&1 || return 1
    mkdir "$tmp/flat" && cp "$tmp/dist/ddp.h" "$tmp/dist/ddp_tcp.h" "$tmp/dist/ddp_shm.h" "$tmp/dist/ddp_sampler.h" "$tmp/flat/" &&
        [ "$(ls "$tmp/flat" | wc -l)" -eq 4 ]
}
check "make dist's files: ddp.h, ddp_tcp.h, ddp_shm.h, ddp_sampler.h copied flat into an empty folder" dist_ok

example_ok() {
    awk '/^```c$/ { on = 1; next } on && /^```/ { exit } on { print }' README.md |
        sed 's|#include "transports/\(ddp_[a-z]*\.h\)"|#include "\1"|' > "$tmp/flat/example.c"
    why "README's first C block, written flat: $(grep -c '' "$tmp/flat/example.c") lines"
    grep -q 'int main' "$tmp/flat/example.c" && grep -q '#include "ddp_tcp.h"' "$tmp/flat/example.c" &&
        ! grep -q 'transports/' "$tmp/flat/example.c"
}
check "the README's example, with its transport includes written flat" example_ok

build() {   # build COMPILER STD OUT
    [ "$4" = c ] || cp "$tmp/flat/example.c" "$tmp/flat/example.$4"
    (cd "$tmp/flat" && $1 $2 $WARN "example.$4" -o "$3" -pthread -lm) > "$tmp/why" 2>&1
}
command -v clang > /dev/null 2>&1 && have_clang=1 || have_clang=0
check "gcc -std=c99 builds it in the flat folder, nothing else on the include path" build gcc -std=c99 ex_gcc c
if [ $have_clang = 1 ]; then check "clang -std=c99 builds it" build clang -std=c99 ex_clang c
else ok "clang -std=c99 builds it # SKIP no clang"; fi
check "g++ -std=c++17 builds it" build g++ -std=c++17 ex_gxx cpp

# run BIN TRANSPORT: two ranks by hand (RANK, WORLD_SIZE, MASTER_PORT), as any launcher does.
run2() {
    port=$(free_port)
    ( RANK=1 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port DDP_TRANSPORT=$2 DDP_TIMEOUT_MS=60000 \
        timeout 90 "$tmp/flat/$1" > "$tmp/r1.out" 2>&1; echo $? > "$tmp/r1.rc" ) &
    RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port DDP_TRANSPORT=$2 DDP_TIMEOUT_MS=60000 \
        timeout 90 "$tmp/flat/$1" > "$tmp/r0.out" 2>&1
    rc0=$?
    wait
    cat "$tmp/r0.out" "$tmp/r1.out" > "$tmp/why"
    why "exit codes $rc0 and $(cat "$tmp/r1.rc")"
    [ $rc0 -eq 0 ] && [ "$(cat "$tmp/r1.rc")" = 0 ] && grep -qx '2 ranks, w = -0.05 0.35 0.75 1.15' "$tmp/r0.out"
}
check "2 ranks over TCP (the gcc build): rank 0 prints the README's result" run2 ex_gcc tcp
check "2 ranks over shared memory (the g++ build)" run2 ex_gxx shm
if [ $have_clang = 1 ]; then check "2 ranks over shared memory (the clang build)" run2 ex_clang shm
else ok "2 ranks over shared memory (the clang build) # SKIP no clang"; fi
