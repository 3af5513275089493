#!/usr/bin/env python3
# SPDX-License-Identifier: MIT (see LICENSE)
# Lists functions longer than LIMIT lines in C files: a definition starts at column 0 with a
# name and '(' and reaches '{' at the end of that line or one of the next few (a signature that
# wraps) without a ';'; it ends at the first '}' in column 0.  usage: tools/function_lengths.py LIMIT FILES... (e.g. 80 *.h transports/*.h)
import sys, re
lim = int(sys.argv[1]); rows = []
for f in sys.argv[2:]:
    lines = open(f, errors='replace').read().split('\n')
    i = 0
    while i < len(lines):
        l = lines[i]
        m = re.match(r'[A-Za-z_][^=;]*?\b([A-Za-z_][A-Za-z0-9_]*)\s*\(', l)
        if m and not l.startswith(('typedef', '#', 'struct ', 'enum ', 'union ')):
            k = i; ok = False
            while k < len(lines) and k < i + 8:
                t = lines[k].rstrip()
                if t.endswith(';'): break
                if t.endswith('{'): ok = True; break
                k += 1
            if ok:
                j = k + 1
                while j < len(lines) and not lines[j].startswith('}'): j += 1
                n = j - i + 1
                if n > lim: rows.append((n, f, m.group(1), i + 1))
                i = j + 1
                continue
        i += 1
for n, f, name, ln in sorted(rows, reverse=True): print(f'{n:5d}  {f}:{ln}  {name}')
