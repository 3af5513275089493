#!/usr/bin/env python3
# SPDX-License-Identifier: MIT (see LICENSE)
"""Reference data for tests/test_sampler.c, produced by real torch.

    /usr/bin/python3 tests/sampler_ref.py > tests/data/sampler_vectors.txt      # the golden file
    /usr/bin/python3 tests/sampler_ref.py --random 1234 --count 20 > cases.txt  # fresh cases

The oracle is torch itself (torch.utils.data.DistributedSampler, torch.randperm, torch.rand,
torch.randint, Tensor.uniform_ on a torch.Generator). Two things torch cannot answer here:

  * the raw MT19937 words: numpy's legacy RandomState(seed) is the same generator, and
    torch's own Tensor.random_(-2**63, None) returns random64() unchanged
    (uniform_int_full_range in ATen/core/TransformationHelper.h); both are emitted and both are
    checked against MiniMT below before anything is written;
  * randperm's torch >= 2.7 inside-out loop for n >= 214748364: the torch installed here (1.13)
    only has the swap loop, so that loop is re-implemented below on MiniMT and run through
    torch's own DistributedSampler by standing in for torch.randperm. The swap loop written the
    same way is checked against torch.randperm first, so the re-implementation shares
    everything with a checked path but the loop itself.

The golden file needs a torch whose uniform_ fuses its multiply-add (see uniform_is_fused); any
x86-64 torch with AVX2 does, and the script refuses otherwise.

Every line is `tag field...`, whitespace separated, integers in decimal, floats as the hex of
their IEEE bits, 64-bit hashes in hex. A hash is FNV-1a over 64-bit words (h ^= w; h *= prime),
words = for each list: its length, then its elements.
"""
import argparse
import random
import sys

import numpy as np
import torch
from torch.utils.data import BatchSampler, DistributedSampler

M64 = (1 << 64) - 1
FNV_OFFSET, FNV_PRIME = 0xCBF29CE484222325, 0x100000001B3
SEEDS = [0, 42, -1, (1 << 40) + 5, -(1 << 63)]
EPOCHS = [0, 1, 7]
NS = [0, 1, 2, 3, 7, 10, 100, 1000, 12345]
ALGO_TORCH, ALGO_LEGACY, ALGO_INSIDE_OUT = 0, 1, 2


def fnv(h, words):
    for w in words:
        h = ((h ^ (w & M64)) * FNV_PRIME) & M64
    return h


def hash_lists(lists):
    h = FNV_OFFSET
    for lst in lists:
        h = fnv(h, [len(lst)])
        h = fnv(h, lst)
    return h


class MiniMT:
    """MT19937 from the 1998 paper, written for clarity, not speed."""

    def __init__(self, seed):
        x = [seed & 0xFFFFFFFF]
        for k in range(1, 624):
            x.append((1812433253 * (x[-1] ^ (x[-1] >> 30)) + k) & 0xFFFFFFFF)
        self.x, self.i = x, 624

    def u32(self):
        if self.i == 624:
            x = self.x
            for k in range(624):
                y = (x[k] & 0x80000000) | (x[(k + 1) % 624] & 0x7FFFFFFF)
                x[k] = x[(k + 397) % 624] ^ (y >> 1) ^ (0x9908B0DF if y & 1 else 0)
            self.i = 0
        y = self.x[self.i]
        self.i += 1
        y ^= y >> 11
        y ^= (y << 7) & 0x9D2C5680
        y ^= (y << 15) & 0xEFC60000
        return y ^ (y >> 18)

    def u64(self):
        hi = self.u32()
        return (hi << 32) | self.u32()


def perm_swap(n, seed):
    mt, p = MiniMT(seed), list(range(n))
    for i in range(n - 1):
        z = mt.u32() % (n - i)
        p[i], p[i + z] = p[i + z], p[i]
    return p


def perm_inside_out(n, seed):
    """torch >= 2.7 randperm_cpu for n >= UINT32_MAX / 20, as the issue states it."""
    mt, p = MiniMT(seed), [0] * n
    for i in range(n):
        z = mt.u64() % (i + 1)
        p[i] = p[z]
        p[z] = i
    return p


def gen(seed):
    g = torch.Generator()
    g.manual_seed(seed)
    return g


def f32_hex(t):
    return ["%08x" % v for v in t.numpy().view(np.uint32).tolist()]


def f64_hex(t):
    return ["%016x" % v for v in t.numpy().view(np.uint64).tolist()]


def bits32(x):
    return "%08x" % int(np.array([x], dtype=np.float32).view(np.uint32)[0])


def bits64(x):
    return "%016x" % int(np.array([x], dtype=np.float64).view(np.uint64)[0])


def uniform_is_fused():
    """torch's uniform_ kernel computes x * (to - from) + from; its AVX2/AVX-512 builds fuse that
    into one FMA, ATEN_CPU_CAPABILITY=default does not (measured). ddp_sampler.h follows the
    fused default, so the golden file must come from a fused torch."""
    t = torch.empty(2000).uniform_(-0.5, 0.3, generator=gen(3)).numpy()
    r = np.random.RandomState(3).randint(0, 1 << 32, size=2000, dtype=np.uint32)
    x = (r & 0xFFFFFF).astype(np.float32) * np.float32(2.0 ** -24)
    plain = x * (np.float32(0.3) - np.float32(-0.5)) + np.float32(-0.5)
    return not np.array_equal(plain.view(np.uint32), t.view(np.uint32))


def self_check():
    """The references must agree with torch and numpy before they are trusted."""
    for seed in SEEDS + [5489, 7]:
        mt = MiniMT(seed)
        mine = [mt.u32() for _ in range(1300)]
        npy = np.random.RandomState(seed & 0xFFFFFFFF).randint(0, 1 << 32, size=1300, dtype=np.uint32)
        assert mine == npy.tolist(), "MiniMT != numpy MT19937, seed %d" % seed
        t = torch.empty(650, dtype=torch.int64).random_(-(1 << 63), None, generator=gen(seed))
        assert [v & M64 for v in t.tolist()] == [(mine[2 * k] << 32) | mine[2 * k + 1] for k in range(650)]
        for n in (0, 1, 2, 5, 100, 2000):
            assert perm_swap(n, seed) == torch.randperm(n, generator=gen(seed)).tolist(), (n, seed)
    mt = MiniMT(5489)
    draws = [mt.u32() for _ in range(10000)]
    assert draws[0] == 3499211612 and draws[9999] == 4123659995


class Len:
    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n


def sampler_lists(n, w, shuffle, seed, epoch, drop_last, algo):
    """Every rank's list(DistributedSampler(...)) for one epoch, by torch's own class."""
    out = []
    real = torch.randperm
    if algo == ALGO_INSIDE_OUT:
        # DistributedSampler calls torch.randperm(n, generator=g) right after
        # g.manual_seed(seed + epoch); initial_seed() hands back that seed.
        torch.randperm = lambda k, generator: torch.tensor(perm_inside_out(k, generator.initial_seed()),
                                                           dtype=torch.int64)
    try:
        for r in range(w):
            s = DistributedSampler(Len(n), num_replicas=w, rank=r, shuffle=shuffle, seed=seed,
                                   drop_last=drop_last)
            s.set_epoch(epoch)
            out.append(list(s))
    finally:
        torch.randperm = real
    return out


def emit_generator_lines(put):
    for seed in SEEDS + [5489]:
        u = np.random.RandomState(seed & 0xFFFFFFFF).randint(0, 1 << 32, size=12, dtype=np.uint32)
        put("mt32", seed, len(u), *u.tolist())
        t = torch.empty(6, dtype=torch.int64).random_(-(1 << 63), None, generator=gen(seed))
        put("mt64", seed, 6, *[v & M64 for v in t.tolist()])
        put("rand32", seed, 40, *f32_hex(torch.rand(40, generator=gen(seed))))
        put("rand64", seed, 20, *f64_hex(torch.rand(20, dtype=torch.float64, generator=gen(seed))))
        for lo, hi in [(-0.5, 0.3), (1.7, 123.25), (-3e3, -1.1), (0.0, 1.0), (-1e30, 1e30)]:
            a = torch.empty(30).uniform_(lo, hi, generator=gen(seed))
            put("unif32", seed, bits32(lo), bits32(hi), 30, *f32_hex(a))
            b = torch.empty(30, dtype=torch.float64).uniform_(lo, hi, generator=gen(seed))
            put("unif64", seed, bits64(lo), bits64(hi), 30, *f64_hex(b))
        for lo, hi in [(0, 10), (-5, 5), (0, 1), (0, (1 << 32) - 1), (0, 1 << 32), (-(1 << 40), 1 << 40),
                       (-(1 << 63), (1 << 63) - 1), (100, 101 + (1 << 33))]:
            v = torch.randint(lo, hi, (16,), generator=gen(seed))
            put("randint", seed, lo, hi, 16, *v.tolist())
        for n in NS:
            h = hash_lists([torch.randperm(n, generator=gen(seed)).tolist()])
            put("randperm", seed, n, ALGO_TORCH, "%016x" % h)
            put("randperm", seed, n, ALGO_LEGACY, "%016x" % h)
            put("randperm", seed, n, ALGO_INSIDE_OUT, "%016x" % hash_lists([perm_inside_out(n, seed)]))
        # draws of several kinds from one generator: each must leave it where torch does
        g = gen(seed)
        words = f32_hex(torch.rand(5, generator=g))
        words += [str(v) for v in torch.randint(0, 10, (3,), generator=g).tolist()]
        words += f64_hex(torch.rand(3, dtype=torch.float64, generator=g))
        words += [str(v) for v in torch.randperm(7, generator=g).tolist()]
        words += [str(v) for v in torch.randint(-5, 1 << 40, (2,), generator=g).tolist()]
        words += f32_hex(torch.empty(2).uniform_(-2.0, 3.0, generator=g))
        put("chain", seed, len(words), *words)
        # the per-rank augmentation stream: torch.Generator().manual_seed(seed + rank)
        for rank in (0, 1, 7):
            if -(1 << 63) <= seed + rank < (1 << 64):
                put("rank32", seed, rank, 8, *f32_hex(torch.rand(8, generator=gen(seed + rank))))


def emit_sampler(put, n, w, seed, epoch, algo):
    hs = ["%016x" % hash_lists(sampler_lists(n, w, True, seed, epoch, d, algo)) for d in (False, True)]
    put("sampler", n, w, seed, epoch, algo, *hs)


def emit_sampler_lines(put):
    for n in NS:
        for w in range(1, 9):
            hs = ["%016x" % hash_lists(sampler_lists(n, w, False, 0, 0, d, ALGO_TORCH)) for d in (False, True)]
            put("sequential", n, w, *hs)
            for seed in SEEDS:
                for epoch in EPOCHS:
                    emit_sampler(put, n, w, seed, epoch, ALGO_TORCH)
    for n in NS:
        for w in (1, 3, 8):
            for seed in (0, -1):
                for epoch in (0, 7):
                    emit_sampler(put, n, w, seed, epoch, ALGO_INSIDE_OUT)
    for n in (0, 7, 100, 12345):
        for w in (1, 3, 8):
            for shuffle in (0, 1):
                for drop in (0, 1):
                    for bs in (1, 3, 32):
                        for dropb in (0, 1):
                            emit_batch(put, n, w, w - 1, 42, 1, shuffle, drop, bs, dropb)


def emit_batch(put, n, w, rank, seed, epoch, shuffle, drop, bs, dropb):
    s = DistributedSampler(Len(n), num_replicas=w, rank=rank, shuffle=bool(shuffle), seed=seed,
                           drop_last=bool(drop))
    s.set_epoch(epoch)
    b = BatchSampler(s, bs, bool(dropb))
    batches = list(b)
    assert len(batches) == len(b)
    put("batch", n, w, rank, seed, epoch, shuffle, drop, bs, dropb, len(batches),
        "%016x" % hash_lists(batches))


def emit_random_lines(put, rng, count):
    """Random n up to 200000, W up to 17, every flag combination, awkward seeds."""
    for _ in range(count):
        n = rng.choice([rng.randrange(0, 40), rng.randrange(0, 200001)])
        w = rng.randrange(1, 18)
        if rng.random() < 0.2:
            n = w * rng.randrange(0, 5000)  # n % W == 0
        seed = rng.choice([0, rng.randrange(-(1 << 63), 1 << 63), rng.randrange(-1000, 1000),
                           rng.randrange(0, 1 << 32)])
        epoch = rng.randrange(0, 6)
        emit_sampler(put, n, w, seed, epoch, ALGO_TORCH)
        if n <= 20000:
            emit_sampler(put, n, w, seed, epoch, ALGO_INSIDE_OUT)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--random", type=int, metavar="SEED", help="only random sampler cases")
    ap.add_argument("--count", type=int, default=20)
    ap.add_argument("--probe-fused", action="store_true", help="print fused or unfused, exit")
    ap.add_argument("--allow-unfused", action="store_true",
                    help="write the golden file even from an unfused torch (for comparing the rest)")
    args = ap.parse_args()
    if args.probe_fused:
        print("fused" if uniform_is_fused() else "unfused")
        return
    self_check()
    if args.random is None and not args.allow_unfused and not uniform_is_fused():
        sys.exit("sampler_ref.py: this torch does not fuse uniform_'s multiply-add "
                 "(ATEN_CPU_CAPABILITY=default, or a CPU without AVX2); the golden file needs one that does")
    out = sys.stdout

    def put(*fields):
        out.write(" ".join(str(f) for f in fields) + "\n")

    put("# generated by tests/sampler_ref.py with torch", torch.__version__)
    if args.random is not None:
        emit_random_lines(put, random.Random(args.random), args.count)
        return
    emit_generator_lines(put)
    emit_sampler_lines(put)
    emit_random_lines(put, random.Random(20240601), 40)


if __name__ == "__main__":
    main()
