/* SPDX-License-Identifier: MIT (see LICENSE) */
/* ddp_sampler.h — libddp: PyTorch's DistributedSampler, bit for bit, in C.        v0.1
 *
 * Every data-parallel job gives each rank a disjoint shard of the data, reshuffled every epoch,
 * the same way on every rank without talking. This header does it exactly as
 * torch.utils.data.DistributedSampler does, so a C trainer sees the same shards, in the same
 * order, as a PyTorch run with the same (len, num_replicas, rank, shuffle, seed, drop_last,
 * epoch): it can reproduce, resume or cross-check that run. It also exposes the generator torch
 * uses (MT19937) with torch's ways of drawing from it (randperm, randint, rand, uniform_), for
 * per-rank data augmentation that matches torch.Generator().manual_seed(seed + rank).
 * It needs only ddp_base.h (result codes, DDP_API) from libddp: vendor the two files together.
 *
 * DO THIS in exactly one .c file of your program:
 *
 *     #define DDP_IMPLEMENTATION          // or DDP_SAMPLER_IMPLEMENTATION for this header only
 *     #include "ddp_sampler.h"
 *
 * and link with -lm (ddp_torch_uniform_* use fma()). Every other file just includes it.
 *
 * BUILD OPTIONS (define before including)
 *   DDP_IMPLEMENTATION           impl. file only  compile the implementation of every libddp
 *                                                 header included after it in this file
 *   DDP_SAMPLER_IMPLEMENTATION   impl. file only  compile this header's implementation only
 *   DDP_STATIC                   global           make every public function static
 *   DDP_MALLOC/DDP_FREE          impl. file only  allocator (shared with ddp.h); define both or
 *                                                 neither. Used only by ddp_sampler_indices.
 *   DDP_SAMPLER_UNFUSED_UNIFORM  impl. file only  ddp_torch_uniform_*: round x*(to-from) before
 *                                                 adding from, as torch does when run with
 *                                                 ATEN_CPU_CAPABILITY=default (see there)
 *
 * EXAMPLE (one rank of a 4-rank job; every rank runs the same code with its own rank)
 *     ddp_sampler_t s;
 *     if (ddp_sampler_init(&s, dataset_len, 4, rank, 1, 42, 0) != DDP_SUCCESS)
 *         fprintf(stderr, "%s\n", ddp_sampler_last_error(&s));
 *     uint64_t *idx = malloc(ddp_sampler_num_samples(&s) * sizeof *idx);
 *     for (uint64_t epoch = 0; epoch < epochs; epoch++) {
 *         ddp_sampler_set_epoch(&s, epoch);
 *         ddp_sampler_indices(&s, idx);                     // = list(sampler) in torch
 *         ddp_batch_iter_t it;
 *         ddp_batch_iter_init(&it, idx, ddp_sampler_num_samples(&s), 32, 0);
 *         const uint64_t *batch; uint64_t len;
 *         while ((len = ddp_batch_iter_next(&it, &batch)) != 0) train_step(batch, len);
 *     }
 *     // augmentation: the stream of torch.Generator().manual_seed(1234 + rank)
 *     ddp_mt19937_t g; ddp_mt19937_seed_rank(&g, 1234, rank);
 *     float u[8]; ddp_torch_rand_f32(&g, u, 8);           // = torch.rand(8, generator=g)
 *
 * AFTER A LOST RANK: the survivors finish the same epoch (no sample lost, none repeated)
 *     uint64_t c;  // done = steps of batch b every rank completed since set_epoch or the last
 *     ddp_sampler_consumed_after(&s, done, b, &c);       // re-shard; the failed one not counted
 *     ddp_sampler_reshard(&s, new_world, new_rank, c);   // the rest of this epoch, dealt anew
 *     ddp_sampler_indices(&s, idx);  // num_samples may have grown: total_size entries always fit
 *     ddp_batch_iter_init(&it, idx, ddp_sampler_num_samples(&s), b, 0);
 *     for (k = 0; k < ddp_sampler_num_steps(&s, b); k++) {       // the same count on every rank
 *         len = ddp_batch_iter_next(&it, &batch); train_step(batch, len); } // last: len may be 0
 *   - Positions: the epoch's list is torch's padded (or cut) list of total_size entries for the
 *     world the epoch began with; rank r of W takes positions r, r + W, ... so after k steps of
 *     batch b on every rank the positions below min(k * b, num_samples) * W are done: that count
 *     is "consumed". A re-shard deals positions consumed .. total_size - 1 of the same list to
 *     the new ranks (new rank r: consumed + r, consumed + r + W', ...). The old world's padding
 *     stays where it was and none is added for the new world, so the epoch visits every index
 *     exactly as often as it would have without the failure. Shares differ by at most one;
 *     every rank runs ddp_sampler_num_steps steps, all full but the last, which can be short or
 *     empty on some ranks (such a rank still joins that step's collectives, with a zero
 *     gradient, as torch's Join does for uneven inputs). Re-shards compose (two failures in one
 *     epoch); consumed never goes back. set_epoch ends it: the next epoch is torch's sampler
 *     for the new world, bit for bit (its num_samples can differ from the old world's).
 *   - Resume mid-epoch: a checkpoint needs (epoch, ddp_sampler_epoch_replicas, consumed) on top
 *     of init's arguments; the world and rank are the resumed job's own:
 *         ddp_sampler_init(&s, n, epoch_replicas, 0, shuffle, seed, drop_last);
 *         ddp_sampler_set_epoch(&s, epoch);
 *         ddp_sampler_reshard(&s, world, rank, consumed);
 *     or, with the three numbers as one value (ddp_sampler_position_t, ddp_sampler_position_after
 *     on the live sampler), ddp_sampler_init(&s, n, world, rank, ...) then
 *     ddp_sampler_resume(&s, &pos, world, rank).
 *   - Ranks joining mid-epoch (a grow): the members re-shard to the grown world as above; a
 *     joiner resumes from the members' position (sent to it), which gives it exactly the share
 *     a member computes for its rank. Shrinks and grows compose in one epoch.
 *
 * RULES
 *   - What torch does (torch/utils/data/distributed.py; checked bit for bit against torch 1.13
 *     by tests/test_sampler.c, vectors from tests/sampler_ref.py):
 *     num_samples = ceil(n / W), or floor(n / W) when drop_last and n % W != 0;
 *     total_size = num_samples * W. With shuffle the base order is
 *     torch.randperm(n, generator=torch.Generator().manual_seed(seed + epoch)), else 0..n-1.
 *     Without drop_last the base is padded cyclically to total_size (also when W > n); with it
 *     the base is cut to total_size. Rank r takes positions r, r + W, r + 2W, ...
 *   - randperm changed in torch 2.7 for n >= 214748364 (UINT32_MAX / 20): the default here is
 *     current torch; ddp_sampler_set_randperm(s, DDP_RANDPERM_TORCH_LEGACY) gives torch <= 2.6.
 *     Below that n both are the same. The legacy loop was checked against torch 1.13 at
 *     n = 214748364 too; the >= 2.7 loop is tested against an independent re-implementation
 *     (tests/sampler_ref.py) run through torch's own DistributedSampler; only torch >= 2.7
 *     itself could say more.
 *   - seed + epoch wraps modulo 2^64 (torch raises OverflowError from 2^64 on); only its low 32
 *     bits reach the generator, as in torch. num_samples is exact integer arithmetic; torch
 *     divides in double, which differs only for n > 2^53.
 *   - ddp_sampler_indices writes num_samples entries to out. With shuffle and W > 1 it needs a
 *     scratch permutation of n entries (4 bytes each while n <= 2^32, else 8), which it
 *     allocates and frees per call; ddp_sampler_indices_ws takes that scratch from the caller
 *     and never allocates. W == 1 or shuffle == 0 needs no scratch.
 *   - Speed (2-vCPU AMD EPYC VM, gcc -O2): randperm 6.7 ns/element at n = 10^7 and 12.5 at
 *     10^8 (memory bound), against 30 and 50-62 for torch.randperm on the same machine. The
 *     swaps are torch's, in torch's order; the gain is prefetching and 4-byte elements.
 *   - Errors: calls return ddp_result_t; invalid arguments give DDP_ERR_INVALID_ARGUMENT and
 *     change nothing, except that a refused ddp_sampler_init leaves an empty sampler (0
 *     samples; ddp_sampler_last_error() says why, with torch's ValueError text for a bad rank)
 *     and a refused ddp_batch_iter_init an empty iterator. Nothing here calls abort() or
 *     exit(). No global state: any number of samplers and generators, each used by one
 *     thread at a time.
 */
#ifndef DDP_SAMPLER_H_INCLUDED
#define DDP_SAMPLER_H_INCLUDED

#include <stddef.h>
#include <stdint.h>

#if (defined(DDP_IMPLEMENTATION) || defined(DDP_SAMPLER_IMPLEMENTATION)) && \
    !defined(DDP_BASE_NAMES_IMPLEMENTATION)
#define DDP_BASE_NAMES_IMPLEMENTATION   /* ddp_strerror & co., without the rest of the base */
#endif
#include "ddp_base.h"   /* ddp_result_t and DDP_API: one definition for every libddp header */

#ifdef __cplusplus
extern "C" {
#endif


/* ---------------------------------------------------------------- MT19937, as torch draws it */
/* The generator behind every torch.Generator on CPU (ATen/core/MT19937RNGEngine.h): standard
 * MT19937, the same stream as C++ std::mt19937. Fields are private; the struct is public only so
 * it can live on the stack. 2.5 KB. */
typedef struct ddp_mt19937 {
    uint32_t state[624];
    uint32_t next; /* index of the next word of state to temper; 624 = twist first */
} ddp_mt19937_t;

/* torch.Generator().manual_seed(seed): only the low 32 bits matter. A negative Python seed is
 * its two's complement, which is what converting an int64_t to uint64_t gives. */
DDP_API ddp_result_t ddp_mt19937_seed(ddp_mt19937_t *g, uint64_t seed);
/* manual_seed(seed + rank): the per-rank augmentation stream trainers use. rank >= 0. */
DDP_API ddp_result_t ddp_mt19937_seed_rank(ddp_mt19937_t *g, int64_t seed, int rank);
/* One draw: torch's CPUGeneratorImpl::random(). g == NULL returns 0. */
DDP_API uint32_t ddp_mt19937_next_u32(ddp_mt19937_t *g);
/* torch's random64(): two draws, the first one is the high half. */
DDP_API uint64_t ddp_mt19937_next_u64(ddp_mt19937_t *g);
/* count draws of next_u32, faster than calling it count times. */
DDP_API ddp_result_t ddp_mt19937_fill_u32(ddp_mt19937_t *g, uint32_t *out, size_t count);

/* What torch's CPU kernels draw, element by element in memory order, for a contiguous tensor:
 *   ddp_torch_rand_f32     torch.rand(count, generator=g)                     one draw each
 *   ddp_torch_rand_f64     torch.rand(count, dtype=torch.float64, generator=g) two draws each
 *   ddp_torch_uniform_f32  torch.empty(count).uniform_(from, to, generator=g); from <= to
 *   ddp_torch_uniform_f64  the same in float64
 *   ddp_torch_randint      torch.randint(low, high, (count,), generator=g) (int64); low < high.
 *                          One draw each while high - low < 2^32, else two.
 * count == 0 allows out == NULL. The generator advances exactly as torch's would. */
DDP_API ddp_result_t ddp_torch_rand_f32(ddp_mt19937_t *g, float *out, size_t count);
DDP_API ddp_result_t ddp_torch_rand_f64(ddp_mt19937_t *g, double *out, size_t count);
DDP_API ddp_result_t ddp_torch_uniform_f32(ddp_mt19937_t *g, float from, float to, float *out,
                                           size_t count);
DDP_API ddp_result_t ddp_torch_uniform_f64(ddp_mt19937_t *g, double from, double to,
                                           double *out, size_t count);
DDP_API ddp_result_t ddp_torch_randint(ddp_mt19937_t *g, int64_t low, int64_t high, int64_t *out,
                                       size_t count);

/* Which of torch's randperm loops to run (aten/src/ATen/native/TensorFactories.cpp). */
typedef enum ddp_randperm_algo {
    DDP_RANDPERM_TORCH = 0,    /* torch >= 2.7: swap loop below DDP_RANDPERM_LARGE_N, else the
                                  inside-out loop with 64-bit draws. The default. */
    DDP_RANDPERM_TORCH_LEGACY, /* torch <= 2.6 (1.13 included): the swap loop for every n */
    DDP_RANDPERM_INSIDE_OUT    /* the >= 2.7 large-n loop for every n. torch never does this
                                  for small n; it exists to test that loop at a size a test
                                  can afford. */
} ddp_randperm_algo_t;
#define DDP_RANDPERM_LARGE_N 214748364u /* UINT32_MAX / 20, torch's own threshold */

/* torch.randperm(n, generator=g) (int64). n < 2^63. n == 0 allows out == NULL. */
DDP_API ddp_result_t ddp_torch_randperm(ddp_mt19937_t *g, uint64_t n, uint64_t *out,
                                        ddp_randperm_algo_t algo);
/* The same permutation in half the memory; n <= 2^32. */
DDP_API ddp_result_t ddp_torch_randperm_u32(ddp_mt19937_t *g, uint64_t n, uint32_t *out,
                                            ddp_randperm_algo_t algo);

/* ---------------------------------------------------------------- the sampler */
/* Fields are private (read them through the functions); public so it can be a plain value. */
typedef struct ddp_sampler {
    uint64_t dataset_len, num_samples, total_size, epoch;
    uint64_t start;     /* positions of the epoch's list before this are done (a re-shard's
                           consumed; 0 after set_epoch) */
    int64_t seed;
    int num_replicas, rank, shuffle, drop_last;
    int epoch_replicas; /* the world the epoch's list was laid out for (set_epoch's) */
    ddp_randperm_algo_t algo;
    char error[96];
} ddp_sampler_t;

/* DistributedSampler(dataset, num_replicas, rank, shuffle, seed, drop_last); epoch 0.
 * Needs 0 <= rank < num_replicas and dataset_len < 2^63. */
DDP_API ddp_result_t ddp_sampler_init(ddp_sampler_t *s, uint64_t dataset_len, int num_replicas,
                                      int rank, int shuffle, int64_t seed, int drop_last);
/* Starts epoch `epoch` from its beginning, laid out as torch lays it out for the current world
 * (after a re-shard: the re-shard's num_replicas and rank; this also ends the re-shard). */
DDP_API void ddp_sampler_set_epoch(ddp_sampler_t *s, uint64_t epoch);
/* DDP_RANDPERM_TORCH_LEGACY reproduces torch <= 2.6 for n >= DDP_RANDPERM_LARGE_N. */
DDP_API ddp_result_t ddp_sampler_set_randperm(ddp_sampler_t *s, ddp_randperm_algo_t algo);
DDP_API uint64_t ddp_sampler_num_samples(const ddp_sampler_t *s); /* len(sampler); 0 if NULL */
/* Length of the epoch's list, the one positions count in: torch's total_size for the world
 * set_epoch (or init) laid the epoch out for; a re-shard does not change it. */
DDP_API uint64_t ddp_sampler_total_size(const ddp_sampler_t *s);
DDP_API const char *ddp_sampler_last_error(const ddp_sampler_t *s); /* "" if none; never NULL */
/* list(iter(sampler)) for the current epoch: num_samples entries into out. */
DDP_API ddp_result_t ddp_sampler_indices(const ddp_sampler_t *s, uint64_t *out);
/* The same without allocating: workspace holds ddp_sampler_workspace_size(s) bytes, aligned
 * for uint64_t (malloc's alignment will do). SIZE_MAX means no workspace can be big enough. */
DDP_API size_t ddp_sampler_workspace_size(const ddp_sampler_t *s);
DDP_API ddp_result_t ddp_sampler_indices_ws(const ddp_sampler_t *s, uint64_t *out,
                                            void *workspace, size_t workspace_bytes);

/* ---------------------------------------------------------------- mid-epoch: resume, re-shard */
/* Positions: the epoch's list is torch's (shuffled, padded or cut to total_size); rank r of W
 * takes positions r, r + W, r + 2W, ... A step of batch b on every rank uses the b*W positions
 * after the previous step's, so "consumed" = how many positions at the head of the list are done.
 *
 * After local_steps steps of batch samples each, counted from set_epoch or from the last
 * re-shard (only steps every rank completed: a failed step is not counted), *consumed = the
 * position the epoch's list is done up to. The same on every rank. Refused: batch == 0, more
 * steps than ddp_sampler_num_steps(s, batch) (s is not const: a refusal leaves its text). */
DDP_API ddp_result_t ddp_sampler_consumed_after(ddp_sampler_t *s, uint64_t local_steps,
                                                uint64_t batch, uint64_t *consumed);
/* Deals positions consumed .. total_size - 1 of this epoch's list (the list as it was laid out
 * for epoch_replicas, padding included, so that no index is visited more or less often than
 * without the re-shard) to num_replicas ranks: rank r takes consumed + r, consumed + r +
 * num_replicas, ... num_samples becomes this rank's share; shares differ by at most one. Then
 * ddp_sampler_indices gives that share. Several re-shards in an epoch compose (consumed is
 * always a position of the same list). Needs 0 <= rank < num_replicas and start <= consumed <=
 * total_size, where start is the previous re-shard's consumed (0 after set_epoch): positions
 * before it were trained on already. Refused calls change nothing but the error text. */
DDP_API ddp_result_t ddp_sampler_reshard(ddp_sampler_t *s, int num_replicas, int rank,
                                         uint64_t consumed);
/* The number of steps of batch samples every rank runs from set_epoch or the last re-shard to
 * the end of the epoch: ceil(largest share / batch), the same on every rank. A rank whose share ends first takes part in the last step
 * with a short or empty batch (it still joins the collectives). 0 if batch == 0. */
DDP_API uint64_t ddp_sampler_num_steps(const ddp_sampler_t *s, uint64_t batch);
/* What to checkpoint mid-epoch, besides init's arguments: ddp_sampler_epoch_replicas(s), the
 * epoch, and ddp_sampler_consumed_after(...). start is the last re-shard's consumed, 0 if none. */
DDP_API int ddp_sampler_epoch_replicas(const ddp_sampler_t *s);
DDP_API uint64_t ddp_sampler_start(const ddp_sampler_t *s);
/* Those three numbers as one value: where a sampler is in its epoch. It is what a rank joining
 * a running job needs from the members (besides init's arguments, which are the program's),
 * and what a checkpoint needs mid-epoch. Three 64-bit integers, no padding: it can travel as
 * its bytes between ranks of one machine type. */
typedef struct ddp_sampler_position {
    uint64_t epoch;
    uint64_t consumed;         /* positions of the epoch's list done (consumed_after's) */
    int64_t epoch_replicas;    /* the world the epoch's list was laid out for */
} ddp_sampler_position_t;
/* s's position after local_steps steps of batch, counted as ddp_sampler_consumed_after counts
 * them (and refused as it refuses); the same on every rank. */
DDP_API ddp_result_t ddp_sampler_position_after(ddp_sampler_t *s, uint64_t local_steps,
                                                uint64_t batch, ddp_sampler_position_t *pos);
/* s, initialised with the job's dataset_len, shuffle, seed and drop_last (its num_replicas and
 * rank do not matter; its randperm choice is kept), goes to pos and deals the rest of that
 * epoch to num_replicas ranks, this one being rank: exactly the share a member gets from
 * ddp_sampler_reshard(num_replicas, rank, pos->consumed). A joiner's sampler after a grow, or a
 * job resumed mid-epoch. Refused calls change nothing but the error text. */
DDP_API ddp_result_t ddp_sampler_resume(ddp_sampler_t *s, const ddp_sampler_position_t *pos,
                                        int num_replicas, int rank);

/* ---------------------------------------------------------------- batches */
/* torch.utils.data.BatchSampler(sampler, batch_size, drop_last) over an index list: batches of
 * batch_size in order, the last one shorter unless drop_last. The iterator points into
 * indices; it copies nothing. */
typedef struct ddp_batch_iter {
    const uint64_t *indices;
    uint64_t count, batch_size, pos;
    int drop_last;
} ddp_batch_iter_t;

DDP_API ddp_result_t ddp_batch_iter_init(ddp_batch_iter_t *it, const uint64_t *indices,
                                         uint64_t count, uint64_t batch_size, int drop_last);
DDP_API uint64_t ddp_batch_iter_num_batches(const ddp_batch_iter_t *it); /* len(BatchSampler) */
/* Points *batch at the next batch and returns its length; 0 (and *batch = NULL) when done. */
DDP_API uint64_t ddp_batch_iter_next(ddp_batch_iter_t *it, const uint64_t **batch);
DDP_API void ddp_batch_iter_reset(ddp_batch_iter_t *it);

#ifdef __cplusplus
}
#endif

#endif /* DDP_SAMPLER_H_INCLUDED */

/* ============================================================================================
 * IMPLEMENTATION
 * ========================================================================================== */
#if (defined(DDP_IMPLEMENTATION) || defined(DDP_SAMPLER_IMPLEMENTATION)) && \
    !defined(DDP_SAMPLER_IMPL_INCLUDED)
#define DDP_SAMPLER_IMPL_INCLUDED
#ifndef DDP_BASE_NAMES_IMPLEMENTATION
#define DDP_BASE_NAMES_IMPLEMENTATION
#endif
#include "ddp_base.h"   /* its names and the allocator macros (also after a declarations-only include) */

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(__GNUC__) || defined(__clang__)
#define _DDP_SAMPLER_PRIVATE static __attribute__((unused))
/* Write intent: the prefetched slot is about to be swapped. */
#define _DDP_SAMPLER_PREFETCH(addr) __builtin_prefetch((const void *)(addr), 1)
#else
#define _DDP_SAMPLER_PRIVATE static
#define _DDP_SAMPLER_PREFETCH(addr) ((void)(addr))
#endif
/* Under DDP_STATIC a program that calls only some functions must not get warnings for the rest. */
#if defined(DDP_STATIC) && (defined(__GNUC__) || defined(__clang__))
#define _DDP_SAMPLER_DEF DDP_API __attribute__((unused))
#else
#define _DDP_SAMPLER_DEF DDP_API
#endif
#if defined(__cplusplus) || defined(_MSC_VER)
#define _DDP_SAMPLER_RESTRICT __restrict
#else
#define _DDP_SAMPLER_RESTRICT restrict
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------- MT19937
 * Matsumoto & Nishimura, "Mersenne Twister: a 623-dimensionally equidistributed uniform
 * pseudo-random number generator", ACM TOMACS 8(1), 1998: degree 624, middle word 397, twist
 * matrix 0x9908b0df, tempering (11, 7/0x9d2c5680, 15/0xefc60000, 18), Knuth's 1812433253
 * seeding. C++11 [rand.predef] pins the stream: the 10000th draw after seed 5489 is 4123659995.
 * torch seeds with init_with_uint32(seed & 0xffffffff) and twists before the first draw
 * (ATen/core/MT19937RNGEngine.h), which is what next == 624 does here. */
#define _DDP_MT_N 624
#define _DDP_MT_M 397

_DDP_SAMPLER_PRIVATE uint32_t _ddp_mt_mix(uint32_t upper_from, uint32_t lower_from) {
    uint32_t y = (upper_from & 0x80000000u) | (lower_from & 0x7fffffffu);
    return (y >> 1) ^ ((0u - (y & 1u)) & 0x9908b0dfu);
}

/* The recurrence x[k+624] = x[k+397] ^ mix(x[k], x[k+1]) run in place over the whole state. Split
 * in three so no index needs a modulo: the first 227 words read x[k+397] not yet overwritten,
 * the rest read the words this pass already produced, and the last wraps to the new x[0]. */
_DDP_SAMPLER_PRIVATE void _ddp_mt_twist(uint32_t *x) {
    int k;
    for (k = 0; k < _DDP_MT_N - _DDP_MT_M; k++)
        x[k] = x[k + _DDP_MT_M] ^ _ddp_mt_mix(x[k], x[k + 1]);
    for (; k < _DDP_MT_N - 1; k++)
        x[k] = x[k + _DDP_MT_M - _DDP_MT_N] ^ _ddp_mt_mix(x[k], x[k + 1]);
    x[_DDP_MT_N - 1] = x[_DDP_MT_M - 1] ^ _ddp_mt_mix(x[_DDP_MT_N - 1], x[0]);
}

_DDP_SAMPLER_PRIVATE uint32_t _ddp_mt_temper(uint32_t y) {
    y ^= y >> 11;
    y ^= (y << 7) & 0x9d2c5680u;
    y ^= (y << 15) & 0xefc60000u;
    y ^= y >> 18;
    return y;
}

_DDP_SAMPLER_PRIVATE void _ddp_mt_seed(ddp_mt19937_t *g, uint64_t seed) {
    uint32_t k;
    g->state[0] = (uint32_t)(seed & 0xffffffffu);
    for (k = 1; k < _DDP_MT_N; k++) {
        uint32_t prev = g->state[k - 1];
        g->state[k] = (uint32_t)(1812433253u * (prev ^ (prev >> 30)) + k);
    }
    g->next = _DDP_MT_N;
}

_DDP_SAMPLER_PRIVATE uint32_t _ddp_mt_u32(ddp_mt19937_t *g) {
    if (g->next >= _DDP_MT_N) {
        _ddp_mt_twist(g->state);
        g->next = 0;
    }
    return _ddp_mt_temper(g->state[g->next++]);
}

_DDP_SAMPLER_PRIVATE uint64_t _ddp_mt_u64(ddp_mt19937_t *g) {
    uint64_t hi = _ddp_mt_u32(g); /* sequenced: the first draw is the high half */
    return (hi << 32) | _ddp_mt_u32(g);
}

/* A fresh state tempered whole: a fixed trip count and no aliasing let the compiler vectorise it
 * at -O2 (measured: 1.8 -> 1.0 ns per draw here), which is most of what randperm spends. */
_DDP_SAMPLER_PRIVATE void _ddp_mt_temper_all(const uint32_t *_DDP_SAMPLER_RESTRICT x,
                                             uint32_t *_DDP_SAMPLER_RESTRICT out) {
    int k;
    for (k = 0; k < _DDP_MT_N; k++) out[k] = _ddp_mt_temper(x[k]);
}

_DDP_SAMPLER_PRIVATE void _ddp_mt_fill(ddp_mt19937_t *g, uint32_t *out, size_t count) {
    while (count) {
        size_t k, run;
        const uint32_t *src;
        if (g->next >= _DDP_MT_N) {
            _ddp_mt_twist(g->state);
            if (count >= _DDP_MT_N) {
                _ddp_mt_temper_all(g->state, out);
                out += _DDP_MT_N;
                count -= _DDP_MT_N;
                continue; /* next stays 624: the whole state is used */
            }
            g->next = 0;
        }
        run = _DDP_MT_N - g->next;
        if (run > count) run = count;
        src = g->state + g->next;
        for (k = 0; k < run; k++) out[k] = _ddp_mt_temper(src[k]);
        g->next += (uint32_t)run;
        out += run;
        count -= run;
    }
}

_DDP_SAMPLER_DEF ddp_result_t ddp_mt19937_seed(ddp_mt19937_t *g, uint64_t seed) {
    if (!g) return DDP_ERR_INVALID_ARGUMENT;
    _ddp_mt_seed(g, seed);
    return DDP_SUCCESS;
}

_DDP_SAMPLER_DEF ddp_result_t ddp_mt19937_seed_rank(ddp_mt19937_t *g, int64_t seed, int rank) {
    if (!g || rank < 0) return DDP_ERR_INVALID_ARGUMENT;
    _ddp_mt_seed(g, (uint64_t)seed + (uint64_t)rank);
    return DDP_SUCCESS;
}

_DDP_SAMPLER_DEF uint32_t ddp_mt19937_next_u32(ddp_mt19937_t *g) { return g ? _ddp_mt_u32(g) : 0; }
_DDP_SAMPLER_DEF uint64_t ddp_mt19937_next_u64(ddp_mt19937_t *g) { return g ? _ddp_mt_u64(g) : 0; }

_DDP_SAMPLER_DEF ddp_result_t ddp_mt19937_fill_u32(ddp_mt19937_t *g, uint32_t *out, size_t count) {
    if (!g || (!out && count)) return DDP_ERR_INVALID_ARGUMENT;
    _ddp_mt_fill(g, out, count);
    return DDP_SUCCESS;
}

/* ---------------------------------------------------------------- torch's draws
 * ATen/core/DistributionsHelper.h + TransformationHelper.h: uniform_real_distribution<float>
 * takes one draw and keeps its low 24 bits, <double> takes random64() and keeps its low 53,
 * x = bits * 2^-digits, result x * (to - from) + from in the same type. */
#define _DDP_SAMPLER_BLOCK 256

_DDP_SAMPLER_PRIVATE float _ddp_unit_f32(uint32_t r) {
    return (float)(r & 0xffffffu) * (1.0f / 16777216.0f); /* exact: 24 bits, power-of-two scale */
}
_DDP_SAMPLER_PRIVATE double _ddp_unit_f64(uint64_t r) {
    return (double)(r & 0x1fffffffffffffu) * (1.0 / 9007199254740992.0);
}

/* torch's uniform kernel is compiled once per CPU capability and GCC contracts
 * x * (to - from) + from into one FMA in the AVX2/AVX-512 builds. Measured with Debian's torch
 * 1.13 on x86-64: the default run (AVX2) matches fma() on 80000/80000 draws and the unfused
 * expression on 56467; ATEN_CPU_CAPABILITY=default matches the unfused one. For [0, 1) the two
 * agree (x * 1 + 0 is exact). The volatile keeps a compiler from fusing the unfused variant. */
_DDP_SAMPLER_PRIVATE float _ddp_affine_f32(float x, float range, float from) {
#ifdef DDP_SAMPLER_UNFUSED_UNIFORM
    volatile float prod = x * range;
    return prod + from;
#else
    return fmaf(x, range, from);
#endif
}
_DDP_SAMPLER_PRIVATE double _ddp_affine_f64(double x, double range, double from) {
#ifdef DDP_SAMPLER_UNFUSED_UNIFORM
    volatile double prod = x * range;
    return prod + from;
#else
    return fma(x, range, from);
#endif
}

_DDP_SAMPLER_DEF ddp_result_t ddp_torch_rand_f32(ddp_mt19937_t *g, float *out, size_t count) {
    uint32_t r[_DDP_SAMPLER_BLOCK];
    if (!g || (!out && count)) return DDP_ERR_INVALID_ARGUMENT;
    while (count) {
        size_t k, b = count < _DDP_SAMPLER_BLOCK ? count : _DDP_SAMPLER_BLOCK;
        _ddp_mt_fill(g, r, b);
        for (k = 0; k < b; k++) out[k] = _ddp_unit_f32(r[k]);
        out += b;
        count -= b;
    }
    return DDP_SUCCESS;
}

_DDP_SAMPLER_DEF ddp_result_t ddp_torch_rand_f64(ddp_mt19937_t *g, double *out, size_t count) {
    size_t k;
    if (!g || (!out && count)) return DDP_ERR_INVALID_ARGUMENT;
    for (k = 0; k < count; k++) out[k] = _ddp_unit_f64(_ddp_mt_u64(g));
    return DDP_SUCCESS;
}

/* torch checks from <= to and to - from <= max (DistributionsHelper.h); NaN fails the first. */
_DDP_SAMPLER_DEF ddp_result_t ddp_torch_uniform_f32(ddp_mt19937_t *g, float from, float to,
                                                    float *out, size_t count) {
    float range;
    size_t k;
    if (!g || (!out && count) || !(from <= to)) return DDP_ERR_INVALID_ARGUMENT;
    range = to - from;
    if (!(range <= FLT_MAX)) return DDP_ERR_INVALID_ARGUMENT; /* an infinite range fails */
    for (k = 0; k < count; k++)
        out[k] = _ddp_affine_f32(_ddp_unit_f32(_ddp_mt_u32(g)), range, from);
    return DDP_SUCCESS;
}

_DDP_SAMPLER_DEF ddp_result_t ddp_torch_uniform_f64(ddp_mt19937_t *g, double from, double to,
                                                    double *out, size_t count) {
    double range;
    size_t k;
    if (!g || (!out && count) || !(from <= to)) return DDP_ERR_INVALID_ARGUMENT;
    range = to - from;
    if (!(range <= DBL_MAX)) return DDP_ERR_INVALID_ARGUMENT;
    for (k = 0; k < count; k++)
        out[k] = _ddp_affine_f64(_ddp_unit_f64(_ddp_mt_u64(g)), range, from);
    return DDP_SUCCESS;
}

/* uniform_int_from_to_distribution<int64_t>: range = high - low as uint64; random64() when
 * range >= 2^32 else random(); value = low + draw % range, wrapping like torch's int64 cast. */
_DDP_SAMPLER_DEF ddp_result_t ddp_torch_randint(ddp_mt19937_t *g, int64_t low, int64_t high,
                                                int64_t *out, size_t count) {
    uint64_t range, base;
    size_t k;
    if (!g || (!out && count) || !(low < high)) return DDP_ERR_INVALID_ARGUMENT;
    range = (uint64_t)high - (uint64_t)low;
    base = (uint64_t)low;
    for (k = 0; k < count; k++) {
        uint64_t draw = range >= ((uint64_t)1 << 32) ? _ddp_mt_u64(g) : (uint64_t)_ddp_mt_u32(g);
        uint64_t v = draw % range + base;
        /* two's complement back to int64 without implementation-defined conversion */
        out[k] = v <= (uint64_t)INT64_MAX ? (int64_t)v : -(int64_t)(~v) - 1;
    }
    return DDP_SUCCESS;
}

/* ---------------------------------------------------------------- randperm
 * torch's randperm_cpu (aten/src/ATen/native/TensorFactories.cpp), two loops:
 *   swap loop (every n before 2.7, n < UINT32_MAX / 20 since): p = 0..n-1; for i in 0..n-2:
 *       z = random() % (n - i); swap p[i], p[i + z]
 *   inside-out loop (2.7+, n >= UINT32_MAX / 20): for i in 0..n-1:
 *       z = random64() % (i + 1); p[i] = p[z]; p[z] = i
 * A slot's partner is random, so on a big n every swap is a cache miss. The draws do not depend
 * on the array, so the swap targets are computed a block ahead and each is prefetched
 * _DDP_PERM_AHEAD swaps before its use; the swaps stay in torch's order, so the result is the
 * same. Blocks follow the generator's 624-word state so its vectorised path serves them. */
/* In swaps. Measured here at n = 3e7: no prefetch 12.8, 32 ahead 10.1, 64 ahead 9.6 ns/swap. */
#define _DDP_PERM_AHEAD 64

/* r % m for 0 < m < 2^32 via a double quotient: with r = qm + s, r / m <= q + 1 - 1/m, and the
 * rounding error, under (q + 1) 2^-53, is smaller than 1/m because (q + 1) m <= r + m < 2^33.
 * So the truncated quotient is q exactly. A double division pipelines where a 32-bit div often
 * does not (1.4 vs 1.9 ns here). */
_DDP_SAMPLER_PRIVATE uint32_t _ddp_mod_u32(uint32_t r, uint32_t m) {
    uint32_t q = (uint32_t)((double)r / (double)m);
    return r - q * m;
}

/* How many steps the next block takes: the rest of the generator's current state, so that the
 * blocks after it start on a fresh one. */
_DDP_SAMPLER_PRIVATE uint64_t _ddp_perm_block(const ddp_mt19937_t *g, uint64_t steps_left,
                                              unsigned draws_per_step) {
    uint64_t b = (g->next >= _DDP_MT_N ? _DDP_MT_N : _DDP_MT_N - g->next) / draws_per_step;
    if (b == 0) b = 1; /* one word left and a step needs two: that step straddles the twist */
    return b < steps_left ? b : steps_left;
}

/* Swap targets i + z for steps [i, i + b) of the swap loop over n elements; b <= 624. */
_DDP_SAMPLER_PRIVATE void _ddp_swap_targets(ddp_mt19937_t *g, uint64_t n, uint64_t i, uint64_t b,
                                            uint64_t *target) {
    uint32_t r[_DDP_MT_N];
    uint64_t k;
    _ddp_mt_fill(g, r, (size_t)b);
    if (n - i <= 0xffffffffu) { /* every modulus fits 32 bits */
        uint32_t m = (uint32_t)(n - i);
        for (k = 0; k < b; k++, m--) target[k] = i + k + _ddp_mod_u32(r[k], m);
    } else { /* torch computes random() % (n - i) in 64 bits: a modulus >= 2^32 keeps the draw */
        for (k = 0; k < b; k++) {
            uint64_t m = n - i - k;
            target[k] = i + k + (m > 0xffffffffu ? r[k] : _ddp_mod_u32(r[k], (uint32_t)m));
        }
    }
}

/* Where steps [i, i + b) of the inside-out loop read from; b <= 312. */
_DDP_SAMPLER_PRIVATE void _ddp_inside_out_targets(ddp_mt19937_t *g, uint64_t i, uint64_t b,
                                                  uint64_t *target) {
    uint32_t r[_DDP_MT_N];
    uint64_t k;
    _ddp_mt_fill(g, r, (size_t)(2 * b));
    for (k = 0; k < b; k++) target[k] = (((uint64_t)r[2 * k] << 32) | r[2 * k + 1]) % (i + k + 1);
}

/* Prefetch the target of the swap _DDP_PERM_AHEAD after swap k of this block. */
#define _DDP_PERM_PREFETCH(p, k, cur, b, nxt, nb)                                                  \
    do {                                                                                           \
        uint64_t ahead_ = (k) + _DDP_PERM_AHEAD;                                                   \
        if (ahead_ < (b))                                                                          \
            _DDP_SAMPLER_PREFETCH((p) + (cur)[ahead_]);                                            \
        else if (ahead_ - (b) < (nb))                                                              \
            _DDP_SAMPLER_PREFETCH((p) + (nxt)[ahead_ - (b)]);                                      \
    } while (0)

/* One definition per element type: uint32_t halves the memory traffic where n allows it. */
#define _DDP_DEFINE_RANDPERM(SUFFIX, T)                                                            \
    _DDP_SAMPLER_PRIVATE void _ddp_randperm_swap_##SUFFIX(ddp_mt19937_t *g, T *p, uint64_t n) {    \
        uint64_t ta[_DDP_MT_N], tb[_DDP_MT_N], *cur = ta, *nxt = tb, *tmp;                         \
        uint64_t i, k, b, nb, steps;                                                               \
        for (i = 0; i < n; i++) p[i] = (T)i;                                                       \
        if (n < 2) return;                                                                         \
        steps = n - 1;                                                                             \
        b = _ddp_perm_block(g, steps, 1);                                                          \
        _ddp_swap_targets(g, n, 0, b, cur);                                                        \
        for (k = 0; k < b && k < _DDP_PERM_AHEAD; k++) _DDP_SAMPLER_PREFETCH(p + cur[k]);          \
        for (i = 0; i < steps; i += b, b = nb, tmp = cur, cur = nxt, nxt = tmp) {                  \
            nb = i + b < steps ? _ddp_perm_block(g, steps - (i + b), 1) : 0;                       \
            if (nb) _ddp_swap_targets(g, n, i + b, nb, nxt);                                       \
            for (k = 0; k < b; k++) {                                                              \
                T t;                                                                               \
                _DDP_PERM_PREFETCH(p, k, cur, b, nxt, nb);                                         \
                t = p[i + k];                                                                      \
                p[i + k] = p[cur[k]];                                                              \
                p[cur[k]] = t;                                                                     \
            }                                                                                      \
        }                                                                                          \
    }                                                                                              \
    _DDP_SAMPLER_PRIVATE void _ddp_randperm_inside_out_##SUFFIX(ddp_mt19937_t *g, T *p,            \
                                                                uint64_t n) {                      \
        uint64_t ta[_DDP_MT_N], tb[_DDP_MT_N], *cur = ta, *nxt = tb, *tmp;                         \
        uint64_t i, k, b, nb;                                                                      \
        if (n == 0) return;                                                                        \
        b = _ddp_perm_block(g, n, 2);                                                              \
        _ddp_inside_out_targets(g, 0, b, cur);                                                     \
        for (k = 0; k < b && k < _DDP_PERM_AHEAD; k++) _DDP_SAMPLER_PREFETCH(p + cur[k]);          \
        for (i = 0; i < n; i += b, b = nb, tmp = cur, cur = nxt, nxt = tmp) {                      \
            nb = i + b < n ? _ddp_perm_block(g, n - (i + b), 2) : 0;                               \
            if (nb) _ddp_inside_out_targets(g, i + b, nb, nxt);                                    \
            for (k = 0; k < b; k++) { /* torch writes p[i] = i first: z == i reads it back */      \
                _DDP_PERM_PREFETCH(p, k, cur, b, nxt, nb);                                         \
                p[i + k] = (T)(i + k);                                                             \
                p[i + k] = p[cur[k]];                                                              \
                p[cur[k]] = (T)(i + k);                                                            \
            }                                                                                      \
        }                                                                                          \
    }

_DDP_DEFINE_RANDPERM(u32, uint32_t)
_DDP_DEFINE_RANDPERM(u64, uint64_t)

/* 1 where torch (as algo says) runs the inside-out loop for this n. */
_DDP_SAMPLER_PRIVATE int _ddp_randperm_uses_inside_out(uint64_t n, ddp_randperm_algo_t algo) {
    return algo == DDP_RANDPERM_INSIDE_OUT ||
           (algo == DDP_RANDPERM_TORCH && n >= DDP_RANDPERM_LARGE_N);
}

_DDP_SAMPLER_PRIVATE int _ddp_randperm_algo_valid(ddp_randperm_algo_t algo) {
    return algo == DDP_RANDPERM_TORCH || algo == DDP_RANDPERM_TORCH_LEGACY ||
           algo == DDP_RANDPERM_INSIDE_OUT;
}

_DDP_SAMPLER_PRIVATE void _ddp_randperm_run_u32(ddp_mt19937_t *g, uint32_t *p, uint64_t n,
                                                ddp_randperm_algo_t algo) {
    if (_ddp_randperm_uses_inside_out(n, algo))
        _ddp_randperm_inside_out_u32(g, p, n);
    else
        _ddp_randperm_swap_u32(g, p, n);
}

_DDP_SAMPLER_PRIVATE void _ddp_randperm_run_u64(ddp_mt19937_t *g, uint64_t *p, uint64_t n,
                                                ddp_randperm_algo_t algo) {
    if (_ddp_randperm_uses_inside_out(n, algo))
        _ddp_randperm_inside_out_u64(g, p, n);
    else
        _ddp_randperm_swap_u64(g, p, n);
}

_DDP_SAMPLER_DEF ddp_result_t ddp_torch_randperm(ddp_mt19937_t *g, uint64_t n, uint64_t *out,
                                                 ddp_randperm_algo_t algo) {
    if (!g || (!out && n) || n > (uint64_t)INT64_MAX || !_ddp_randperm_algo_valid(algo))
        return DDP_ERR_INVALID_ARGUMENT;
    _ddp_randperm_run_u64(g, out, n, algo);
    return DDP_SUCCESS;
}

_DDP_SAMPLER_DEF ddp_result_t ddp_torch_randperm_u32(ddp_mt19937_t *g, uint64_t n, uint32_t *out,
                                                     ddp_randperm_algo_t algo) {
    if (!g || (!out && n) || n > ((uint64_t)1 << 32) || !_ddp_randperm_algo_valid(algo))
        return DDP_ERR_INVALID_ARGUMENT;
    _ddp_randperm_run_u32(g, out, n, algo);
    return DDP_SUCCESS;
}

/* ---------------------------------------------------------------- the sampler
 * torch/utils/data/distributed.py, DistributedSampler.__init__ / __iter__. */
_DDP_SAMPLER_DEF ddp_result_t ddp_sampler_init(ddp_sampler_t *s, uint64_t dataset_len,
                                               int num_replicas, int rank, int shuffle,
                                               int64_t seed, int drop_last) {
    uint64_t w;
    if (!s) return DDP_ERR_INVALID_ARGUMENT;
    memset(s, 0, sizeof *s);
    if (num_replicas < 1) {
        snprintf(s->error, sizeof s->error, "num_replicas must be at least 1, got %d",
                 num_replicas);
        return DDP_ERR_INVALID_ARGUMENT;
    }
    if (rank < 0 || rank >= num_replicas) { /* torch's ValueError, word for word */
        snprintf(s->error, sizeof s->error,
                 "Invalid rank %d, rank should be in the interval [0, %d]", rank, num_replicas - 1);
        return DDP_ERR_INVALID_ARGUMENT;
    }
    if (dataset_len > (uint64_t)INT64_MAX) { /* torch.randperm takes an int64 */
        snprintf(s->error, sizeof s->error, "dataset_len %llu does not fit in int64",
                 (unsigned long long)dataset_len);
        return DDP_ERR_INVALID_ARGUMENT;
    }
    w = (uint64_t)num_replicas;
    /* torch: ceil((n - W) / W) when drop_last and W does not divide n, which is floor(n / W),
     * 0 included for n < W; else ceil(n / W). */
    s->num_samples = dataset_len / w + (!drop_last && dataset_len % w != 0);
    if (s->num_samples > UINT64_MAX / w) { /* unreachable for n < 2^63, W < 2^31; kept honest */
        s->num_samples = 0;
        snprintf(s->error, sizeof s->error, "num_samples * num_replicas overflows");
        return DDP_ERR_INVALID_ARGUMENT;
    }
    s->total_size = s->num_samples * w;
    s->dataset_len = dataset_len;
    s->num_replicas = num_replicas;
    s->epoch_replicas = num_replicas;
    s->rank = rank;
    s->shuffle = shuffle != 0;
    s->seed = seed;
    s->drop_last = drop_last != 0;
    s->algo = DDP_RANDPERM_TORCH;
    return DDP_SUCCESS;
}

/* After a re-shard the epoch is laid out anew for the re-shard's world, exactly as init would:
 * init checked that any W < 2^31 fits for this dataset_len. Without one nothing changes. */
_DDP_SAMPLER_DEF void ddp_sampler_set_epoch(ddp_sampler_t *s, uint64_t epoch) {
    uint64_t w;
    if (!s) return;
    s->epoch = epoch;
    if (s->num_replicas < 1) return; /* never initialised, or init failed: stays empty */
    w = (uint64_t)s->num_replicas;
    s->num_samples = s->dataset_len / w + (!s->drop_last && s->dataset_len % w != 0);
    s->total_size = s->num_samples * w;
    s->epoch_replicas = s->num_replicas;
    s->start = 0;
}

_DDP_SAMPLER_DEF ddp_result_t ddp_sampler_set_randperm(ddp_sampler_t *s, ddp_randperm_algo_t algo) {
    if (!s || !_ddp_randperm_algo_valid(algo)) return DDP_ERR_INVALID_ARGUMENT;
    s->algo = algo;
    return DDP_SUCCESS;
}

_DDP_SAMPLER_DEF uint64_t ddp_sampler_num_samples(const ddp_sampler_t *s) {
    return s ? s->num_samples : 0;
}
_DDP_SAMPLER_DEF uint64_t ddp_sampler_total_size(const ddp_sampler_t *s) {
    return s ? s->total_size : 0;
}
_DDP_SAMPLER_DEF const char *ddp_sampler_last_error(const ddp_sampler_t *s) {
    return s ? s->error : "ddp_sampler_last_error: sampler is NULL";
}

/* 1 where this rank's share is the epoch's whole base order, untouched (one rank, from the start
 * of an epoch that needs no padding): then out itself can hold the permutation. */
_DDP_SAMPLER_PRIVATE int _ddp_sampler_share_is_base(const ddp_sampler_t *s) {
    return s->num_replicas == 1 && s->start == 0 && s->num_samples == s->dataset_len;
}

/* The scratch permutation is needed only when shuffling for more than one rank: with one rank
 * out itself has n entries and holds the permutation. */
_DDP_SAMPLER_DEF size_t ddp_sampler_workspace_size(const ddp_sampler_t *s) {
    uint64_t n;
    if (!s || !s->shuffle || s->num_samples == 0 || _ddp_sampler_share_is_base(s)) return 0;
    n = s->dataset_len;
    if (n <= ((uint64_t)1 << 32)) return n > SIZE_MAX / 4 ? SIZE_MAX : (size_t)n * 4;
    return n > SIZE_MAX / 8 ? SIZE_MAX : (size_t)n * 8;
}

/* out[k] = padded[start + rank + k * W] with padded[p] = base[p mod n]: without drop_last that
 * is torch's cyclic padding, with it total_size <= n and the modulo never bites. start is 0 and
 * W the epoch's world unless re-sharded. */
_DDP_SAMPLER_PRIVATE uint64_t _ddp_sampler_first_pos(const ddp_sampler_t *s) {
    uint64_t n = s->dataset_len;
    return (s->start % n + (uint64_t)s->rank % n) % n; /* no overflow: each term < n < 2^63 */
}
#define _DDP_DEFINE_GATHER(SUFFIX, T)                                                              \
    _DDP_SAMPLER_PRIVATE void _ddp_gather_##SUFFIX(const ddp_sampler_t *s, const T *base,          \
                                                   uint64_t *out) {                                \
        uint64_t n = s->dataset_len, step = (uint64_t)s->num_replicas % n, k;                      \
        uint64_t pos = _ddp_sampler_first_pos(s);                                                  \
        for (k = 0; k < s->num_samples; k++) {                                                     \
            out[k] = base[pos];                                                                    \
            pos += step;                                                                           \
            if (pos >= n) pos -= n;                                                                \
        }                                                                                          \
    }
_DDP_DEFINE_GATHER(u32, uint32_t)
_DDP_DEFINE_GATHER(u64, uint64_t)

_DDP_SAMPLER_DEF ddp_result_t ddp_sampler_indices_ws(const ddp_sampler_t *s, uint64_t *out,
                                                     void *workspace, size_t workspace_bytes) {
    ddp_mt19937_t g;
    uint64_t n, k;
    size_t need;
    if (!s) return DDP_ERR_INVALID_ARGUMENT;
    if (s->num_replicas < 1) return DDP_ERR_INVALID_USAGE; /* never initialised, or init failed */
    if (s->num_samples == 0) return DDP_SUCCESS;
    if (!out) return DDP_ERR_INVALID_ARGUMENT;
    n = s->dataset_len;
    if (!s->shuffle) {
        uint64_t step = (uint64_t)s->num_replicas % n, pos = _ddp_sampler_first_pos(s);
        for (k = 0; k < s->num_samples; k++) {
            out[k] = pos;
            pos += step;
            if (pos >= n) pos -= n;
        }
        return DDP_SUCCESS;
    }
    _ddp_mt_seed(&g, (uint64_t)s->seed + s->epoch);
    if (_ddp_sampler_share_is_base(s)) { /* num_samples == n */
        _ddp_randperm_run_u64(&g, out, n, s->algo);
        return DDP_SUCCESS;
    }
    need = ddp_sampler_workspace_size(s);
    if (!workspace || need == SIZE_MAX || workspace_bytes < need) return DDP_ERR_INVALID_ARGUMENT;
    if (n <= ((uint64_t)1 << 32)) {
        uint32_t *p = (uint32_t *)workspace;
        if ((uintptr_t)workspace % sizeof *p) return DDP_ERR_INVALID_ARGUMENT;
        _ddp_randperm_run_u32(&g, p, n, s->algo);
        _ddp_gather_u32(s, p, out);
    } else {
        uint64_t *p = (uint64_t *)workspace;
        if ((uintptr_t)workspace % sizeof *p) return DDP_ERR_INVALID_ARGUMENT;
        _ddp_randperm_run_u64(&g, p, n, s->algo);
        _ddp_gather_u64(s, p, out);
    }
    return DDP_SUCCESS;
}

_DDP_SAMPLER_DEF ddp_result_t ddp_sampler_indices(const ddp_sampler_t *s, uint64_t *out) {
    size_t need = ddp_sampler_workspace_size(s);
    void *ws;
    ddp_result_t r;
    if (need == 0) return ddp_sampler_indices_ws(s, out, NULL, 0);
    if (!out) return DDP_ERR_INVALID_ARGUMENT;
    if (need == SIZE_MAX) return DDP_ERR_OUT_OF_MEMORY;
    ws = DDP_MALLOC(need);
    if (!ws) return DDP_ERR_OUT_OF_MEMORY;
    r = ddp_sampler_indices_ws(s, out, ws, need);
    DDP_FREE(ws);
    return r;
}

/* ---------------------------------------------------------------- mid-epoch: resume, re-shard
 * The epoch's list stays the one set_epoch laid out (total_size positions); a re-shard only
 * moves where this rank starts in it (start + rank) and how far it strides (num_replicas). */
_DDP_SAMPLER_DEF ddp_result_t ddp_sampler_reshard(ddp_sampler_t *s, int num_replicas, int rank,
                                                  uint64_t consumed) {
    uint64_t left, w;
    if (!s) return DDP_ERR_INVALID_ARGUMENT;
    if (s->num_replicas < 1) {
        snprintf(s->error, sizeof s->error, "reshard: the sampler was never initialised");
        return DDP_ERR_INVALID_USAGE;
    }
    if (num_replicas < 1) {
        snprintf(s->error, sizeof s->error, "reshard: num_replicas must be at least 1, got %d",
                 num_replicas);
        return DDP_ERR_INVALID_ARGUMENT;
    }
    if (rank < 0 || rank >= num_replicas) {
        snprintf(s->error, sizeof s->error,
                 "reshard: invalid rank %d, rank should be in the interval [0, %d]", rank,
                 num_replicas - 1);
        return DDP_ERR_INVALID_ARGUMENT;
    }
    if (consumed > s->total_size) {
        snprintf(s->error, sizeof s->error, "reshard: consumed %llu is past the epoch's end, %llu",
                 (unsigned long long)consumed, (unsigned long long)s->total_size);
        return DDP_ERR_INVALID_ARGUMENT;
    }
    if (consumed < s->start) { /* would train a second time on what a step already used */
        snprintf(s->error, sizeof s->error, "reshard: consumed %llu is before %llu, done already",
                 (unsigned long long)consumed, (unsigned long long)s->start);
        return DDP_ERR_INVALID_ARGUMENT;
    }
    left = s->total_size - consumed;
    w = (uint64_t)num_replicas;
    s->num_samples = left / w + ((uint64_t)rank < left % w);
    s->num_replicas = num_replicas;
    s->rank = rank;
    s->start = consumed;
    s->error[0] = '\0';
    return DDP_SUCCESS;
}

/* The largest share: what rank 0 holds (ranks below left % W hold one more than the rest). */
_DDP_SAMPLER_PRIVATE uint64_t _ddp_sampler_max_share(const ddp_sampler_t *s) {
    uint64_t left = s->total_size - s->start, w = (uint64_t)s->num_replicas;
    return left / w + (left % w != 0);
}

_DDP_SAMPLER_DEF uint64_t ddp_sampler_num_steps(const ddp_sampler_t *s, uint64_t batch) {
    uint64_t most;
    if (!s || batch == 0 || s->num_replicas < 1) return 0;
    most = _ddp_sampler_max_share(s);
    return most / batch + (most % batch != 0);
}

/* Every rank has run local_steps steps, so each has used min(local_steps * batch, its share)
 * samples: rank r position start + r + jW for j below that, which is every position below
 * start + min(local_steps * batch * W, left) and none after. */
_DDP_SAMPLER_DEF ddp_result_t ddp_sampler_consumed_after(ddp_sampler_t *s, uint64_t local_steps,
                                                         uint64_t batch, uint64_t *consumed) {
    uint64_t steps, used, left, done;
    if (!s || !consumed) return DDP_ERR_INVALID_ARGUMENT;
    if (s->num_replicas < 1) {
        snprintf(s->error, sizeof s->error, "consumed_after: the sampler was never initialised");
        return DDP_ERR_INVALID_USAGE;
    }
    if (batch == 0) {
        snprintf(s->error, sizeof s->error, "consumed_after: batch must be at least 1");
        return DDP_ERR_INVALID_ARGUMENT;
    }
    steps = ddp_sampler_num_steps(s, batch);
    if (local_steps > steps) {
        snprintf(s->error, sizeof s->error, "consumed_after: %llu steps, but the epoch has %llu",
                 (unsigned long long)local_steps, (unsigned long long)steps);
        return DDP_ERR_INVALID_ARGUMENT;
    }
    /* below the last step local_steps * batch < the largest share: no overflow; times W it
     * stays under left + W */
    used = local_steps == steps ? _ddp_sampler_max_share(s) : local_steps * batch;
    left = s->total_size - s->start;
    done = used * (uint64_t)s->num_replicas;
    *consumed = s->start + (done < left ? done : left);
    return DDP_SUCCESS;
}

_DDP_SAMPLER_DEF int ddp_sampler_epoch_replicas(const ddp_sampler_t *s) {
    return s ? s->epoch_replicas : 0;
}
_DDP_SAMPLER_DEF uint64_t ddp_sampler_start(const ddp_sampler_t *s) { return s ? s->start : 0; }

_DDP_SAMPLER_DEF ddp_result_t ddp_sampler_position_after(ddp_sampler_t *s, uint64_t local_steps,
                                                         uint64_t batch, ddp_sampler_position_t *pos) {
    uint64_t c = 0;
    ddp_result_t e;
    if (!s || !pos) return DDP_ERR_INVALID_ARGUMENT;
    if ((e = ddp_sampler_consumed_after(s, local_steps, batch, &c)) != DDP_SUCCESS) return e;
    pos->epoch = s->epoch;
    pos->consumed = c;
    pos->epoch_replicas = s->epoch_replicas;
    return DDP_SUCCESS;
}

/* The epoch laid out again for the world it began with, then re-sharded: a copy, so that a
 * refusal leaves s as it was. */
_DDP_SAMPLER_DEF ddp_result_t ddp_sampler_resume(ddp_sampler_t *s, const ddp_sampler_position_t *pos,
                                                 int num_replicas, int rank) {
    ddp_sampler_t t;
    ddp_result_t e;
    if (!s) return DDP_ERR_INVALID_ARGUMENT;
    if (s->num_replicas < 1) {
        snprintf(s->error, sizeof s->error, "resume: the sampler was never initialised");
        return DDP_ERR_INVALID_USAGE;
    }
    if (!pos || pos->epoch_replicas < 1 || pos->epoch_replicas > INT32_MAX) {
        if (pos) snprintf(s->error, sizeof s->error, "resume: the position's epoch_replicas %lld is not a world size",
                          (long long)pos->epoch_replicas);
        else snprintf(s->error, sizeof s->error, "resume: NULL position");
        return DDP_ERR_INVALID_ARGUMENT;
    }
    e = ddp_sampler_init(&t, s->dataset_len, (int)pos->epoch_replicas, 0, s->shuffle, s->seed, s->drop_last);
    if (e == DDP_SUCCESS) {
        t.algo = s->algo;
        ddp_sampler_set_epoch(&t, pos->epoch);
        e = ddp_sampler_reshard(&t, num_replicas, rank, pos->consumed);
    }
    if (e != DDP_SUCCESS) {
        snprintf(s->error, sizeof s->error, "resume: %.80s", t.error);
        return e;
    }
    *s = t;
    return DDP_SUCCESS;
}

/* ---------------------------------------------------------------- batches
 * torch/utils/data/sampler.py, BatchSampler: len = count // bs if drop_last else ceil. */
_DDP_SAMPLER_DEF ddp_result_t ddp_batch_iter_init(ddp_batch_iter_t *it, const uint64_t *indices,
                                                  uint64_t count, uint64_t batch_size,
                                                  int drop_last) {
    if (!it) return DDP_ERR_INVALID_ARGUMENT;
    memset(it, 0, sizeof *it); /* a refused iterator yields nothing rather than garbage */
    if ((!indices && count) || batch_size == 0) return DDP_ERR_INVALID_ARGUMENT;
    it->indices = indices;
    it->count = count;
    it->batch_size = batch_size;
    it->pos = 0;
    it->drop_last = drop_last != 0;
    return DDP_SUCCESS;
}

_DDP_SAMPLER_DEF uint64_t ddp_batch_iter_num_batches(const ddp_batch_iter_t *it) {
    if (!it || it->batch_size == 0) return 0;
    return it->count / it->batch_size + (!it->drop_last && it->count % it->batch_size != 0);
}

_DDP_SAMPLER_DEF uint64_t ddp_batch_iter_next(ddp_batch_iter_t *it, const uint64_t **batch) {
    uint64_t left, len;
    if (batch) *batch = NULL;
    if (!it || !batch || it->batch_size == 0 || it->pos >= it->count) return 0;
    left = it->count - it->pos;
    len = left < it->batch_size ? left : it->batch_size;
    if (len < it->batch_size && it->drop_last) return 0;
    *batch = it->indices + it->pos;
    it->pos += len;
    return len;
}

_DDP_SAMPLER_DEF void ddp_batch_iter_reset(ddp_batch_iter_t *it) {
    if (it) it->pos = 0;
}

#ifdef __cplusplus
}
#endif

#endif /* DDP_SAMPLER_IMPLEMENTATION */
