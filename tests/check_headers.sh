#!/usr/bin/env bash
# SPDX-License-Identifier: MIT (see LICENSE)
# Every libddp header compiles alone, declarations and implementation, with and without
# DDP_STATIC (implementation), as C99/C11 and C++11/17/20, with gcc and clang; and next to every
# other header in both orders (implementation, C99): for each header H, one file includes H first
# and then all the others, one includes all the others and then H, so H's implementation is
# compiled both before and after every other header's (a header that needs another one includes
# it itself; a header that breaks one included after it, or is broken by one included before it,
# fails). 2 files per header: the check grows linearly with the header count (it used to compile
# every ordered pair). No file defines a feature macro (libddp needs none), and the
# implementation is also compiled after the ISO C headers a trainer includes first (mode
# "after": <stdio.h>, <stdlib.h>, <string.h>, <time.h>, ...).
# A private header (named in $CHECK_HEADERS_PRIVATE) is compiled alone in three of the pairs
# (gcc C99, clang C11, g++ C++11): what "alone" proves is that it includes what it uses, which
# does not depend on the language mode; its code is compiled in every pair anyway, through the
# public headers that include it (ddp.h's implementation includes every private header).
# Usage: [CHECK_HEADERS_PRIVATE="H..."] tests/check_headers.sh OUTDIR HEADER...   (run from the
# repository root; make headers; the "others" are the headers given, in the order given)
set -euo pipefail
out=$1; shift
mkdir -p "$out"
WARN="-Wall -Wextra -Wpedantic -Wshadow -Werror"
have() { command -v "$1" >/dev/null 2>&1; }
compilers=("gcc -std=c99" "gcc -std=c11" "g++ -std=c++11" "g++ -std=c++17" "g++ -std=c++20")
have clang && compilers+=("clang -std=c99" "clang -std=c11")
have clang++ && compilers+=("clang++ -std=c++11" "clang++ -std=c++20")
private_compilers=("gcc -std=c99" "g++ -std=c++11")
have clang && private_compilers+=("clang -std=c11")
is_private() { case " ${CHECK_HEADERS_PRIVATE:-} " in *" $1 "*) return 0;; esac; return 1; }
nprivate=0
jobs=()
n=0
src() {   # src FILE MODE STATIC HEADER...
    local f=$1 mode=$2 st=$3 h; shift 3
    {
        if [ "$mode" = after ]; then
            for h in assert.h errno.h limits.h math.h signal.h stdarg.h stddef.h stdint.h stdio.h stdlib.h string.h time.h; do
                echo "#include <$h>"
            done
        fi
        [ "$st" = static ] && echo '#define DDP_STATIC'
        [ "$mode" != decl ] && echo '#define DDP_IMPLEMENTATION'
        for h in "$@"; do echo "#include \"$h\""; done
        echo 'int main(void) { return 0; }'
    } > "$f"
}
for h in "$@"; do
    pairs=("${compilers[@]}")
    if is_private "$h"; then pairs=("${private_compilers[@]}"); nprivate=$((nprivate + 1)); fi
    for mode in decl impl after; do
        for st in plain static; do
            [ "$mode" = decl ] && [ "$st" = static ] && continue   # DDP_STATIC only means something with the implementation
            [ "$mode" = after ] && [ "$st" = static ] && continue
            n=$((n + 1))
            base="$out/h$n"
            src "$base.c" "$mode" "$st" "$h"
            cp "$base.c" "$base.cpp"
            for cc in "${pairs[@]}"; do
                case $cc in g++*|clang++*) f="$base.cpp";; *) f="$base.c";; esac
                jobs+=("$cc $WARN -I. -fsyntax-only $f  # $h $mode $st")
            done
        done
    done
done
for h in "$@"; do
    others=()
    for o in "$@"; do [ "$o" = "$h" ] || others+=("$o"); done
    [ ${#others[@]} -gt 0 ] || continue
    n=$((n + 1))
    src "$out/p$n.c" impl plain "$h" "${others[@]}"
    jobs+=("gcc -std=c99 $WARN -I. -fsyntax-only $out/p$n.c  # $h first, then the others")
    n=$((n + 1))
    src "$out/p$n.c" impl plain "${others[@]}" "$h"
    jobs+=("gcc -std=c99 $WARN -I. -fsyntax-only $out/p$n.c  # the others, then $h")
done
# The claim above, checked: every private header is compiled as part of the public ones.
if [ -n "${CHECK_HEADERS_PRIVATE:-}" ]; then
    public=()
    for h in "$@"; do is_private "$h" || public+=("$h"); done
    src "$out/public.c" impl plain "${public[@]}"
    deps=$(gcc -I. -MM "$out/public.c" | tr ' \\' '\n\n')
    for h in $CHECK_HEADERS_PRIVATE; do
        printf '%s\n' "$deps" | grep -qx "$h" || { echo "headers: FAILED: private $h is not included by any public header"; exit 1; }
    done
fi
printf '%s\n' "${jobs[@]}" > "$out/jobs.txt"
fail=0
if ! xargs -P "$(nproc)" -I{} -d '\n' sh -c '{} 2>&1 || { echo "FAILED: {}"; exit 255; }' < "$out/jobs.txt" > "$out/log.txt"; then fail=1; fi
if [ $fail = 1 ] || grep -q . "$out/log.txt"; then cat "$out/log.txt"; echo "headers: FAILED"; exit 1; fi
echo "ok: ${#jobs[@]} compiles: $# headers alone (decl/impl/impl after ISO C headers, impl with/without DDP_STATIC; ${#compilers[@]} compiler/standard pairs, ${#private_compilers[@]} for the $nprivate private ones), each first and last among the others; no feature macros"
