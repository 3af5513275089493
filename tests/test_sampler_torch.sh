#!/bin/sh
# SPDX-License-Identifier: MIT (see LICENSE)
# tests/test_sampler_torch.sh — ddp_sampler.h against the torch installed on this machine, live.
#
# tests/test_sampler.c checks the committed vectors (tests/data/sampler_vectors.txt); this script
# checks that those vectors are still what torch produces, and adds fresh random cases (a new
# seed each run, printed so a failure can be replayed: SAMPLER_SEED=... sh tests/...). It needs
# a python3 that can import torch (Debian: apt-get install python3-torch, then /usr/bin/python3);
# without one it skips. Run from the repository root. Prints TAP.
set -u

py=""
for cand in "${PYTHON:-}" python3 /usr/bin/python3; do
    [ -n "$cand" ] || continue
    if version=$("$cand" -c "import torch; print(torch.__version__)" 2>/dev/null); then py=$cand; break; fi
done
if [ -z "$py" ]; then
    echo "1..0 # SKIP no torch"
    exit 0
fi

tmp=$(mktemp -d "${TMPDIR:-/tmp}/ddp_sampler.XXXXXX") || { echo "Bail out! mktemp failed"; exit 1; }
trap 'rm -rf "$tmp"' EXIT INT TERM
seed=${SAMPLER_SEED:-$(date +%s)}
count=${SAMPLER_COUNT:-30}
echo "1..3"
echo "# torch $version via $py; random seed $seed"

if ${CC:-cc} -std=c99 -O2 -Wall -Wextra -Wpedantic -Werror -I. tests/test_sampler.c \
        -o "$tmp/test_sampler" -lm 2>"$tmp/cc.log"; then
    echo "ok 1 - build tests/test_sampler.c"
else
    sed 's/^/# /' "$tmp/cc.log"
    echo "not ok 1 - build tests/test_sampler.c"
fi

# The committed vectors must be exactly what this torch generates (comment lines aside). A torch
# that does not fuse uniform_'s multiply-add (no AVX2, or ATEN_CPU_CAPABILITY=default) rounds
# uniform_(from, to) differently; sampler_ref.py explains. Then those lines are left out.
if [ "$("$py" tests/sampler_ref.py --probe-fused 2>/dev/null)" = fused ]; then
    "$py" tests/sampler_ref.py > "$tmp/golden.txt" 2>"$tmp/ref.log"
    skip='^#'
else
    echo "# this torch does not fuse uniform_'s multiply-add: unif32/unif64/chain lines not compared"
    "$py" tests/sampler_ref.py --allow-unfused > "$tmp/golden.txt" 2>"$tmp/ref.log"
    skip='^(#|unif32 |unif64 |chain )'
fi
grep -Ev "$skip" "$tmp/golden.txt" > "$tmp/a"
grep -Ev "$skip" tests/data/sampler_vectors.txt > "$tmp/b"
if [ -s "$tmp/a" ] && cmp -s "$tmp/a" "$tmp/b"; then
    echo "ok 2 - tests/data/sampler_vectors.txt is what this torch produces"
else
    sed 's/^/# /' "$tmp/ref.log"
    diff "$tmp/a" "$tmp/b" 2>/dev/null | head -5 | sed 's/^/# /'
    echo "not ok 2 - tests/data/sampler_vectors.txt is what this torch produces"
fi

# Fresh random cases (n up to 200000, W up to 17, every flag combination) through the C code.
if "$py" tests/sampler_ref.py --random "$seed" --count "$count" > "$tmp/random.txt" 2>"$tmp/ref2.log" &&
   [ -x "$tmp/test_sampler" ] && "$tmp/test_sampler" "$tmp/random.txt" > "$tmp/out.txt" 2>&1; then
    grep -c '^sampler' "$tmp/random.txt" | sed 's/^/# sampler lines checked: /'
    echo "ok 3 - $count random DistributedSampler cases (seed $seed) match torch"
else
    sed 's/^/# /' "$tmp/ref2.log" "$tmp/out.txt" 2>/dev/null | grep -v '^# ok ' | head -40
    echo "not ok 3 - $count random DistributedSampler cases (seed $seed) match torch"
fi
