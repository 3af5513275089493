#!/usr/bin/env python3
# SPDX-License-Identifier: MIT (see LICENSE)
"""Writes libddp as few files as a user vendors: one header with the whole core (ddp.h and every
libddp header it includes, each once, in include order) and the optional headers beside it
(ddp_sampler.h, the transports), which then need nothing else from the tree.

    python3 tools/amalgamate.py OUTDIR        (what `make dist` runs)

A local include ("...") that resolves to a file of this tree is replaced by that file's text the
first time, and dropped after; system includes (<...>) stay. In the optional headers each
include of a core header becomes `#include "ddp.h"`: the one core header holds all of them, and
sits in the same folder in a flat copy (its guards make a repeat harmless); a header only an
optional one uses (shm's handshake, NCCL's library table) is inlined into it.
"""
import os, re, sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')
OPTIONAL = ['ddp_sampler.h', 'transports/ddp_tcp.h', 'transports/ddp_shm.h', 'transports/ddp_threads.h',
            'transports/ddp_nccl.h', 'transports/ddp_ibverbs.h']


def inline(path, seen, out):
    path = os.path.normpath(path)
    if path in seen:
        return
    seen.add(path)
    rel = os.path.relpath(path, ROOT)
    out.append(f'/* ==== {rel} ==== */\n')
    with open(path) as f:
        for line in f:
            m = INCLUDE.match(line)
            if m:
                target = os.path.normpath(os.path.join(os.path.dirname(path), m.group(1)))
                if not os.path.isfile(target):
                    target = os.path.normpath(os.path.join(ROOT, m.group(1)))
                if os.path.isfile(target) and os.path.commonpath([target, ROOT]) == ROOT:
                    inline(target, seen, out)
                    continue
            out.append(line)


def optional(path, core, own):
    """An optional header's lines: an include of a core header becomes #include "ddp.h" (once in a
    row); its own private headers (a transport's handshake or library table) are inlined."""
    lines, last = [], None
    own.add(os.path.normpath(path))
    with open(path) as f:
        for line in f:
            m = INCLUDE.match(line)
            target = m and os.path.normpath(os.path.join(os.path.dirname(path), m.group(1)))
            if m and target in core:
                line = '#include "ddp.h"   /* was: ' + m.group(1) + ' (tools/amalgamate.py) */\n'
                if last is not None and last.startswith('#include "ddp.h"'):
                    line = '/* ' + m.group(1) + ': in ddp.h too */\n'
            elif m and os.path.isfile(target):
                if target not in own:
                    lines.append(f'/* ==== {os.path.relpath(target, ROOT)} ==== */\n')
                    lines.extend(optional(target, core, own))
                line = '/* ' + m.group(1) + ': inlined above */\n'
            lines.append(line)
            last = line
    return lines


def main():
    if len(sys.argv) != 2:
        sys.exit('usage: amalgamate.py OUTDIR')
    outdir = sys.argv[1]
    os.makedirs(outdir, exist_ok=True)
    seen, out = set(), ['/* SPDX-License-Identifier: MIT (see LICENSE at the end of this file) */\n',
                        '/* libddp, one file: ddp.h and every header it includes (tools/amalgamate.py). Put\n',
                        ' * the optional headers (ddp_sampler.h, the transports) beside it. */\n']
    inline(os.path.join(ROOT, 'ddp.h'), seen, out)
    with open(os.path.join(ROOT, 'LICENSE')) as f:
        out.append('/*\n' + ''.join(' * ' + l if l.strip() else ' *\n' for l in f) + ' */\n')
    with open(os.path.join(outdir, 'ddp.h'), 'w') as f:
        f.write(''.join(out))
    for opt in OPTIONAL:
        src = os.path.join(ROOT, opt)
        if os.path.isfile(src):
            with open(os.path.join(outdir, os.path.basename(opt)), 'w') as g:
                g.write(''.join(optional(src, seen, set())))
    print(f'{outdir}: ddp.h ({len(seen)} headers in one) and ' +
          ', '.join(os.path.basename(o) for o in OPTIONAL if os.path.isfile(os.path.join(ROOT, o))))


if __name__ == '__main__':
    main()
