#!/bin/sh
# SPDX-License-Identifier: MIT (see LICENSE)
# tests/test_licence.sh — libddp is MIT-licensed, and a single vendored file must carry that: the
# LICENSE file is the MIT text, and every source file of the tree (headers, C/C++ sources,
# scripts) names the licence with an SPDX line in its first three lines. Prints TAP; run from the
# repository root (prove tests/test_licence.sh).
set -u
cd "$(dirname "$0")/.." || { echo "Bail out! no repository root"; exit 1; }
. tests/tap.sh   # ok, notok, check, why
tmp=$(mktemp -d "${TMPDIR:-/tmp}/licence_test.XXXXXX") || { echo "Bail out! mktemp failed"; exit 1; }
trap 'rm -rf "$tmp"' EXIT
echo "1..3"

licence_file() {
    why "LICENSE is missing or is not the MIT licence"
    [ -f LICENSE ] && grep -q "^MIT License" LICENSE && grep -q "Permission is hereby granted, free of charge" LICENSE
}
check "LICENSE holds the MIT licence" licence_file

# The tree's source files: tracked ones when this is a git checkout, else every file on disk.
sources() {
    if git rev-parse --is-inside-work-tree > /dev/null 2>&1; then git ls-files; else find . -type f | sed 's|^\./||'; fi |
        grep -E '\.(h|c|cc|cpp|sh|py)$|(^|/)(Makefile|run)$' | grep -v '^tests/data/'
}
every_file() {
    sources > "$tmp/files"
    nf=$(wc -l < "$tmp/files")
    : > "$tmp/missing"
    while IFS= read -r f; do
        [ -f "$f" ] || continue
        head -n 3 "$f" | grep -q 'SPDX-License-Identifier: MIT' || echo "$f" >> "$tmp/missing"
    done < "$tmp/files"
    why "$(wc -l < "$tmp/missing") of $nf files lack 'SPDX-License-Identifier: MIT' in their first 3 lines: $(head -20 "$tmp/missing" | tr '\n' ' ')"
    [ "$nf" -gt 50 ] && [ ! -s "$tmp/missing" ]
}
check "every header, source and script names the MIT licence (SPDX line in its first 3 lines)" every_file

headers_alone() {   # a header is what users vendor one by one: its own line, first
    : > "$tmp/bad"
    for f in *.h transports/*.h; do
        head -n 1 "$f" | grep -q '^/\* SPDX-License-Identifier: MIT' || echo "$f" >> "$tmp/bad"
    done
    why "headers whose first line is not the SPDX line: $(tr '\n' ' ' < "$tmp/bad")"
    [ ! -s "$tmp/bad" ]
}
check "every library header opens with the SPDX line" headers_alone
