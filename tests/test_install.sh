#!/bin/sh
# SPDX-License-Identifier: MIT (see LICENSE)
# tests/test_install.sh — `make install` / `make uninstall` (issue 16), used as an installed user
# would: install into a scratch prefix (mktemp -d), build an example outside the tree with only
# `cc $(pkg-config --cflags --libs ddp)` (it includes "ddp.h" and "transports/ddp_tcp.h"), run it
# as a world of one and as 2 ranks over TCP under the installed ddprun, run the installed
# ddp-bench and ddp-status --help, then uninstall and check the prefix is empty again. Also a
# DESTDIR staging install (packagers) and a prefix that install has to create (uninstall
# removes what it created, and nothing it did not). Prints TAP; run from anywhere (prove
# tests/test_install.sh). Without pkg-config it installs nothing and skips. ~5 s once
# build/ddprun, build/ddp-status and build/ddp-bench are built.
set -u
cd "$(dirname "$0")/.." || { echo "Bail out! no repository root"; exit 1; }
root=$(pwd)

if ! command -v pkg-config > /dev/null 2>&1; then echo "1..0 # SKIP no pkg-config"; exit 0; fi
CC=${CC:-cc}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/install_test.XXXXXX") || { echo "Bail out! mktemp failed"; exit 1; }
prefix=$(mktemp -d "${TMPDIR:-/tmp}/install_prefix.XXXXXX") || { rm -rf "$tmp"; echo "Bail out! mktemp failed"; exit 1; }
trap 'rm -rf "$tmp" "$prefix"' EXIT
unset RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE MASTER_ADDR MASTER_PORT DDP_JOB_SECRET DDP_TRANSPORT \
      CPATH C_INCLUDE_PATH PKG_CONFIG_LIBDIR PKG_CONFIG_SYSROOT_DIR
# The install runs its own make: not the jobserver or flags of a `make test` around this script.
unset MAKEFLAGS MFLAGS MAKELEVEL

echo "1..14"
. "$root/tests/tap.sh"   # ok, notok, check, why
T="timeout -k 2 60"
mk() { make -s --no-print-directory -C "$root" "$@"; }
# Every file and directory under $1, relative to it, sorted.
tree() { (cd "$1" && find . -mindepth 1 | LC_ALL=C sort); }

# --- 1: install ------------------------------------------------------------------------------
install_it() { mk install PREFIX="$prefix" > "$tmp/why" 2>&1; }
check "make install PREFIX=\$tmp builds ddprun, ddp-status, ddp-bench and installs" install_it
inc=$prefix/include/ddp
pcdir=$prefix/share/pkgconfig
[ -f "$inc/ddp.h" ] && [ -f "$pcdir/ddp.pc" ] || { echo "Bail out! nothing installed"; tree "$prefix" | sed 's/^/# /'; exit 1; }

# --- 2-3: the headers ---------------------------------------------------------------------------
# Every public header of the tree (ddp*.h, transports/*.h), byte for byte, in the same layout.
headers() {
    for h in ddp*.h transports/*.h; do
        [ -f "$inc/$h" ] || { why "$h is not installed"; continue; }
        cmp -s "$h" "$inc/$h" || why "$inc/$h differs from $h"
    done
    for f in $(cd "$inc" && find . -type f ! -name .install-dirs | sed 's|^\./||'); do
        [ -f "$f" ] || why "installed $f is not a header of the tree"
    done
    [ ! -s "$tmp/why" ]
}
check "every public header installed under include/ddp/, transports/ kept, identical" headers

# Each #include "x" in an installed header names a file that is there, next to that header.
self_contained() {
    for f in $(cd "$inc" && find . -name '*.h' | sed 's|^\./||'); do
        hd=$(dirname "$inc/$f")   # not $d: tap.sh's check keeps its description there
        for i in $(sed -n 's/^[ \t]*#[ \t]*include[ \t]*"\([^"]*\)".*/\1/p' "$inc/$f"); do
            [ -f "$hd/$i" ] || why "$f includes \"$i\": no $hd/$i"
        done
    done
    [ ! -s "$tmp/why" ]
}
check "the installed headers' relative includes all resolve inside the prefix" self_contained

# --- 4: ddp.pc ---------------------------------------------------------------------------------
export PKG_CONFIG_PATH="$pcdir"
ver=$(for k in MAJOR MINOR PATCH; do
          sed -n "s/^[ \t]*#[ \t]*define[ \t][ \t]*DDP_VERSION_$k[ \t][ \t]*\([0-9][0-9]*\).*/\1/p" ddp_base.h ddp.h | head -n 1
      done | paste -s -d . -)
pc() {
    pkg-config --exists ddp || { why "pkg-config does not find ddp with PKG_CONFIG_PATH=$pcdir"; return 1; }
    pkg-config --print-errors --validate ddp > "$tmp/validate" 2>&1 || why "pkg-config --validate: $(cat "$tmp/validate")"
    v=$(pkg-config --modversion ddp); [ "$v" = "$ver" ] || why "Version '$v', the headers say '$ver'"
    c=$(echo $(pkg-config --cflags ddp)); [ "$c" = "-I$inc" ] || why "Cflags '$c', expected '-I$inc'"
    l=$(echo $(pkg-config --libs ddp))
    for w in -pthread -lm; do case " $l " in *" $w "*) ;; *) why "Libs '$l' lacks $w";; esac; done
    case " $c $l " in *" -W"*|*" -Werror"*) why "warning flags in the .pc: '$c $l'";; esac
    [ ! -s "$tmp/why" ]
}
check "pkg-config finds ddp $ver: Cflags -I<prefix>/include/ddp, Libs -pthread -lm, no warning flags" pc
echo "# cflags+libs: $(pkg-config --cflags --libs ddp)"

# --- 5-7: an example outside the tree, with the installed headers only -------------------------
mkdir "$tmp/user"
cat > "$tmp/user/hello_ddp.c" << 'EOF'
/* An installed user's program: only the installed headers and pkg-config's flags. */
#define DDP_IMPLEMENTATION
#include "ddp.h"
#include "transports/ddp_tcp.h"
#include <stdio.h>

#define N 4099  /* odd: uneven ring chunks */

int main(void) {
    static float x[N];
    static int ranks[64];
    ddp_comm_t *comm = NULL;
    int rank, size, i, bad = 0, me;
    ddp_result_t r = ddp_comm_init_env(&comm, NULL);
    if (r != DDP_SUCCESS) { fprintf(stderr, "init: %s\n", ddp_last_init_error()); return 1; }
    rank = ddp_comm_rank(comm);
    size = ddp_comm_size(comm);
    if (size < 1 || size > 64) { fprintf(stderr, "world size %d\n", size); return 1; }
    for (i = 0; i < N; i++) x[i] = (float)(rank + 1) + (float)(i % 7);
    r = ddp_all_reduce(x, x, N, DDP_FLOAT32, DDP_SUM, comm);
    if (r != DDP_SUCCESS) { fprintf(stderr, "all_reduce: %s: %s\n", ddp_strerror(r), ddp_comm_last_error(comm)); return 1; }
    for (i = 0; i < N; i++)
        if (x[i] != (float)(size * (size + 1) / 2) + (float)(size * (i % 7))) bad++;
    me = rank;
    r = ddp_all_gather(&me, ranks, 1, DDP_INT32, comm);
    if (r != DDP_SUCCESS) { fprintf(stderr, "all_gather: %s: %s\n", ddp_strerror(r), ddp_comm_last_error(comm)); return 1; }
    for (i = 0; i < size; i++)
        if (ranks[i] != i) bad++;
    printf("libddp %d.%d rank %d of %d via %s: all_reduce + all_gather %s\n", DDP_VERSION_MAJOR,
           DDP_VERSION_MINOR, rank, size, size > 1 ? ddp_comm_transport_name(comm, (rank + 1) % size) : "self",
           bad ? "WRONG" : "ok");
    ddp_comm_destroy(comm);
    return bad ? 1 : 0;
}
EOF
build_user() {
    (cd "$tmp/user" && $T "$CC" -std=c99 -o hello_ddp hello_ddp.c $(pkg-config --cflags --libs ddp)) > "$tmp/why" 2>&1
}
check "an example outside the tree builds with $CC \$(pkg-config --cflags --libs ddp)" build_user

one() {
    (cd "$tmp/user" && $T ./hello_ddp) > "$tmp/one.out" 2>&1 || { why "exit $?: $(cat "$tmp/one.out")"; return 1; }
    grep -q 'rank 0 of 1 .*: all_reduce + all_gather ok' "$tmp/one.out" || { why "$(cat "$tmp/one.out")"; return 1; }
}
check "it runs as a world of one (no launcher): the collectives are right" one

two() {
    (cd "$tmp/user" && DDP_TRANSPORT=tcp $T "$prefix/bin/ddprun" -n 2 ./hello_ddp) > "$tmp/two.out" 2>&1 ||
        { why "exit $?: $(cat "$tmp/two.out")"; return 1; }
    for r in 0 1; do
        grep -q "rank $r of 2 via tcp: all_reduce + all_gather ok" "$tmp/two.out" || { why "$(cat "$tmp/two.out")"; return 1; }
    done
}
check "the installed ddprun -n 2 runs it: 2 ranks, TCP on 127.0.0.1, results checked" two
sed 's/^/#   /' "$tmp/two.out"

# --- 8-10: the installed tools ------------------------------------------------------------------
help() {
    $T "$prefix/bin/ddprun" --help > "$tmp/help.out" 2>&1 || { why "exit $?"; return 1; }
    grep -q 'ddprun - start the ranks' "$tmp/help.out" || { why "$(head -5 "$tmp/help.out")"; return 1; }
}
check "the installed ddprun --help prints the manual" help

status_help() {
    $T "$prefix/bin/ddp-status" --help > "$tmp/status.out" 2>&1 || { why "exit $?"; return 1; }
    grep -q '^usage: ddp-status' "$tmp/status.out" || { why "$(head -5 "$tmp/status.out")"; return 1; }
}
check "the installed ddp-status --help prints the manual" status_help

bench() {
    $T "$prefix/bin/ddp-bench" -N 2 --transport tcp -s 8,64K -n 3 -w 1 -c 1 > "$tmp/bench.out" 2>&1 ||
        { why "exit $?: $(tail -5 "$tmp/bench.out")"; return 1; }
}
check "the installed ddp-bench -N 2 --transport tcp runs and checks an all-reduce" bench

# --- 11-12: uninstall --------------------------------------------------------------------------
uninstall_it() { mk uninstall PREFIX="$prefix" > "$tmp/why" 2>&1; }
check "make uninstall PREFIX=\$tmp" uninstall_it
empty() {
    [ -d "$prefix" ] || { why "uninstall removed the prefix itself (install did not create it)"; return 1; }
    left=$(tree "$prefix"); [ -z "$left" ] || { why "left behind: $left"; return 1; }
}
check "the prefix is empty again (files and the directories install created)" empty

# --- 13: DESTDIR (packagers) ------------------------------------------------------------------
stage() {
    mk install DESTDIR="$tmp/stage" PREFIX=/opt/ddp-test > "$tmp/mk.out" 2>&1 || { why "install: $(cat "$tmp/mk.out")"; return 1; }
    [ ! -e /opt/ddp-test ] || why "installed outside DESTDIR: /opt/ddp-test exists"
    s=$tmp/stage/opt/ddp-test
    for f in bin/ddprun bin/ddp-bench include/ddp/ddp.h include/ddp/transports/ddp_tcp.h share/pkgconfig/ddp.pc; do
        [ -f "$s/$f" ] || why "no $f under DESTDIR"
    done
    grep -qx 'prefix=/opt/ddp-test' "$s/share/pkgconfig/ddp.pc" || why "ddp.pc: $(grep '^prefix=' "$s/share/pkgconfig/ddp.pc")"
    grep -q "$tmp" "$s/share/pkgconfig/ddp.pc" && why "ddp.pc names the staging directory"
    [ ! -e "$s/include/ddp/.install-dirs" ] || why "a DESTDIR install leaves .install-dirs in the package"
    mk uninstall DESTDIR="$tmp/stage" PREFIX=/opt/ddp-test > "$tmp/mk.out" 2>&1 || { why "uninstall: $(cat "$tmp/mk.out")"; return 1; }
    files=$(find "$tmp/stage" ! -type d); [ -z "$files" ] || why "uninstall left: $files"
    [ ! -e "$s/include/ddp" ] || why "uninstall left include/ddp"
    [ ! -s "$tmp/why" ]
}
check "DESTDIR=stage PREFIX=/opt/ddp-test: all under the stage, .pc says /opt/ddp-test; uninstall" stage

# --- 14: a prefix install creates, next to a directory it finds ----------------------------
created() {
    mkdir -p "$tmp/mine/bin" && echo keep > "$tmp/mine/bin/other-tool"
    p=$tmp/mine/new/deeper
    mk install PREFIX="$p" BINDIR="$tmp/mine/bin" > "$tmp/mk.out" 2>&1 || { why "install: $(cat "$tmp/mk.out")"; return 1; }
    [ -x "$tmp/mine/bin/ddprun" ] || why "BINDIR not honoured"
    mk uninstall PREFIX="$p" BINDIR="$tmp/mine/bin" > "$tmp/mk.out" 2>&1 || { why "uninstall: $(cat "$tmp/mk.out")"; return 1; }
    left=$(tree "$tmp/mine" | tr '\n' ' ')
    [ "$left" = "./bin ./bin/other-tool " ] || why "after uninstall: $left (expected ./bin ./bin/other-tool)"
    [ ! -s "$tmp/why" ]
}
check "uninstall removes the directories install created (the new prefix too), keeps a shared bin/" created
