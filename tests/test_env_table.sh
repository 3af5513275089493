#!/bin/sh
# SPDX-License-Identifier: MIT (see LICENSE)
# tests/test_env_table.sh — docs/environment.md is the one table of every environment variable
# libddp reads. Run from the repository root (prove tests/test_env_table.sh); prints TAP.
# Fails when the code (the library headers, transports/, tools/) reads a DDP_* variable the
# table does not list, or the table lists a DDP_* variable nothing reads. Takes well under 1 s.
#
# "Reads" is found from the string literals that are exactly a DDP_* name ("DDP_ALGO"): getenv
# takes them, and so do the helpers that call getenv for a transport (_ddp_env_int,
# _ddp_shm_env_size, _ddp_transport_spin_us, _ddp_nccl_dlopen), so no variable hides behind a
# helper. Two kinds of such literals are not variables and are left out: result-code names
# (DDP_SUCCESS, DDP_ERR_*: the table of error names) and names the code #defines.
# "The table lists" is the first column of the table rows of docs/environment.md.
set -u

tmp=$(mktemp -d "${TMPDIR:-/tmp}/env_table_test.XXXXXX") || { echo "Bail out! mktemp failed"; exit 1; }
trap 'rm -rf "$tmp"' EXIT
DOC=docs/environment.md

echo "1..4"
. "$(dirname "$0")/tap.sh"   # ok, notok, check, why

code_files() { ls ./*.h transports/*.h tools/*.c 2>/dev/null; }

# Each variable the code reads, once, with the first place that names it (file:line).
code_names() {
    code_files | xargs grep -hoE '^[[:space:]]*#[[:space:]]*define[[:space:]]+DDP_[A-Z0-9_]+' |
        sed 's/.*define[[:space:]]*//' | sort -u > "$tmp/defined"
    code_files | xargs grep -noE '"DDP_[A-Z0-9_]+"' |
        sed 's/^\.\///; s/:"\(DDP_[A-Z0-9_]*\)"$/ \1/' |     # "file:line NAME"
        awk '{ print $2, $1 }' | sort -u -k1,1 |
        while read -r name where; do
            case $name in DDP_SUCCESS|DDP_ERR_*) continue ;; esac
            grep -qx "$name" "$tmp/defined" && continue
            echo "$name $where"
        done
}

# Each DDP_* name in the first column of a table row of the doc.
table_names() {
    sed -n 's/^|\([^|]*\)|.*/\1/p' "$DOC" | grep -oE 'DDP_[A-Z0-9_]+' | sort -u
}

code_names > "$tmp/code"
cut -d' ' -f1 "$tmp/code" > "$tmp/code_names"
if [ -f "$DOC" ]; then table_names > "$tmp/table"; else : > "$tmp/table"; fi

found_code() {
    c=$(wc -l < "$tmp/code_names")
    [ "$c" -ge 20 ] && return 0
    why "found $c DDP_* variables in the code (expected 20 or more): is the scan broken?"
    return 1
}
check "the code reads DDP_* variables (the scan finds them)" found_code

found_table() {
    [ -f "$DOC" ] || { why "$DOC is missing"; return 1; }
    c=$(wc -l < "$tmp/table")
    [ "$c" -ge 20 ] && return 0
    why "found $c DDP_* rows in $DOC (expected 20 or more): is its table still a Markdown table?"
    return 1
}
check "$DOC has the table" found_table

all_listed() {
    missing=$(comm -23 "$tmp/code_names" "$tmp/table")
    [ -z "$missing" ] && return 0
    for m in $missing; do
        why "$m is read by the code ($(awk -v m="$m" '$1 == m { print $2 }' "$tmp/code")) but not listed in $DOC"
    done
    return 1
}
check "every DDP_* variable the code reads is in the table" all_listed

all_read() {
    extra=$(comm -13 "$tmp/code_names" "$tmp/table")
    [ -z "$extra" ] && return 0
    for m in $extra; do
        why "$m is listed in $DOC but nothing in *.h, transports/*.h or tools/*.c reads it"
    done
    return 1
}
check "every DDP_* variable in the table is read by the code" all_read
