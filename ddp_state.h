/* SPDX-License-Identifier: MIT (see LICENSE) */
/* ddp_state.h — live state from peers: ranks that hold the job's state (model, optimizer state,
 * step counter, sampler position, any user buffers: identical replicas) bring ranks that lack it
 * (a replacement that joined a running job) level with them, each holder sending a share, and
 * the receivers verify what arrived against the senders' digests. torchft heals a recovered
 * replica this way; Horovod elastic broadcasts from rank 0 (here the receivers' inbound link is
 * shared by every sender, so a big state arrives from several peers at once).
 *
 *     ddp_state_buf_t st[] = {{weights, wbytes}, {adam_m, wbytes}, {adam_v, wbytes},
 *                             {&step, sizeof step}, {&sampler_pos, sizeof sampler_pos}};
 *     ddp_state_report_t rep;
 *     // after the grow: the old members (ranks 0 .. m-1) hold it, the joiners receive it
 *     if (ddp_state_sync(comm, m, st, 5, NULL, &rep) != DDP_SUCCESS) fail(ddp_comm_last_error(comm));
 *
 * Collective over comm: every rank passes the same list of buffer sizes (the same program
 * allocates them; the receivers' contents are overwritten). Ranks [0, senders) send, ranks
 * [senders, size) receive, into their buffers in place: no copy of the state, no memory sized by
 * it. How (docs/state.md has the whole story):
 *  1. Check: one small all-gather of each rank's (senders, number of buffers, total bytes, a
 *     digest of the size list, options). A rank that disagrees is named on every rank
 *     (DDP_ERR_MISMATCH) before any data moves (a buffer whose size differs is named too, after
 *     one more round that only a mismatch costs); a rank whose arguments are invalid fails on
 *     every rank too (DDP_ERR_INVALID_ARGUMENT). opts->check_senders: each sender also puts the
 *     digest of its whole state in, and the senders' replicas must be bitwise identical.
 *  2. Move: the concatenated bytes of the buffers are cut into `senders` contiguous shares, at
 *     DDP_STATE_BLOCK_BYTES boundaries (shares cross buffer boundaries); sender i sends share i
 *     to every receiver, in pieces of at most opts->piece_bytes, all senders at once (one group
 *     of sends and receives per piece).
 *  3. Verify: each sender hashes its share as it goes out, each receiver each share as it arrives
 *     (a thread of the call hashes while the next piece moves); one all-gather of the senders'
 *     share digests, each receiver compares, and one all-gather of the receivers' verdicts: a share
 *     that arrived different fails the call on EVERY rank with the same DDP_ERR_MISMATCH, naming
 *     the share, its sender, its bytes and buffers, and the receiver. No rank returns success while
 *     another fails verification.
 * A failure of comm (a peer died, a timeout) returns its error, naming the rank and phase, and
 * leaves comm failed as any call would (shrink or destroy it); a refusal or a mismatch leaves it
 * usable. After any failure the receivers' buffers hold an unspecified mix: do not use them.
 * senders == size: nothing to receive (the checks only). Host buffers only (device memory:
 * DDP_ERR_UNSUPPORTED). One INFO line per call.
 *
 * THE DIGEST (ddp_state_digest; the report's digest): XXH64 (the xxHash specification,
 * doc/xxhash_spec.md in github.com/Cyan4973/xxHash, "XXH64 algorithm description"; written here
 * from that text) of each DDP_STATE_BLOCK_BYTES block of the concatenated bytes, seeded with the
 * block's index (0, 1, ...; the last block may be short); the block digests are added (mod
 * 2^64), and the digest is XXH64 (seed 0) of the 16 bytes (that sum, the total byte count), both
 * little-endian. So it depends only on the concatenated bytes, not on how they are split into
 * buffers, and a share's part is a sum any rank can hash in any order: each byte is hashed once.
 * Not cryptographic: it catches corruption and wrong data, not an adversary. Inputs are read as
 * little-endian on any host.
 *
 * Users include ddp.h (which includes this). Depends on ddp_comm.h. Built by DDP_IMPLEMENTATION
 * (or DDP_STATE_IMPLEMENTATION).
 */
#if defined(DDP_IMPLEMENTATION) && !defined(DDP_STATE_IMPLEMENTATION)
#define DDP_STATE_IMPLEMENTATION
#endif
#if defined(DDP_STATE_IMPLEMENTATION)
#ifndef DDP_COMM_IMPLEMENTATION
#define DDP_COMM_IMPLEMENTATION
#endif
#endif
#include "ddp_comm.h"

#ifndef DDP_STATE_H_INCLUDED
#define DDP_STATE_H_INCLUDED

#ifdef __cplusplus
extern "C" {
#endif

#define DDP_STATE_BLOCK_BYTES ((size_t)64 << 10)         /* the digest's block; shares start at one */
#define DDP_STATE_DEFAULT_PIECE_BYTES ((size_t)4 << 20)  /* one group of sends per piece */

typedef struct ddp_state_buf {
    void *ptr;                     /* the senders' state; the receivers' destination */
    size_t bytes;                  /* may be 0 (ptr then may be NULL) */
} ddp_state_buf_t;

typedef struct ddp_state_opts {    /* zero = defaults; every rank passes the same */
    int check_senders;             /* 1: the senders first compare digests of their whole state
                                    * (one more pass over it on each sender) */
    size_t piece_bytes;            /* most bytes of one share in one group: 0: 4 MiB; rounded up
                                    * to a multiple of DDP_STATE_BLOCK_BYTES */
} ddp_state_opts_t;

typedef struct ddp_state_report {
    uint64_t bytes;                /* the whole state (every buffer) */
    uint64_t moved;                /* bytes this rank sent (a sender: its share to each
                                    * receiver) or received (a receiver: the whole state) */
    uint64_t digest;               /* ddp_state_digest of the state as this rank holds it after
                                    * the call: receivers (from what arrived, no extra pass);
                                    * senders: with check_senders, else 0 */
    double seconds;                /* this rank's time in the call */
    int senders, receivers;
} ddp_state_report_t;

/* Collective over comm (see above). report (may be NULL) is filled on success and on a
 * verification mismatch (zeroed otherwise). */
DDP_API ddp_result_t ddp_state_sync(ddp_comm_t *comm, int senders, const ddp_state_buf_t *bufs, int nbufs,
                                    const ddp_state_opts_t *opts, ddp_state_report_t *report);
/* The digest of the concatenated buffers (see THE DIGEST); local, no communication. Buffers with
 * bytes == 0 are skipped (their ptr may be NULL); bufs NULL or nbufs <= 0: the empty state. */
DDP_API uint64_t ddp_state_digest(const ddp_state_buf_t *bufs, int nbufs);

#ifdef __cplusplus
}
#endif
#endif /* DDP_STATE_H_INCLUDED */

/* ============================================================================================
 * IMPLEMENTATION
 * ========================================================================================== */
#if defined(DDP_STATE_IMPLEMENTATION) && !defined(DDP_STATE_IMPL_INCLUDED)
#define DDP_STATE_IMPL_INCLUDED
#ifndef DDP_COMM_IMPL_INCLUDED
#error "libddp: ddp_state.h's implementation needs ddp_comm.h's (define DDP_IMPLEMENTATION)"
#endif

/* ---- XXH64, from the specification cited above (streaming form) ---- */
#define _DDP_XXH_P1 UINT64_C(0x9E3779B185EBCA87)
#define _DDP_XXH_P2 UINT64_C(0xC2B2AE3D27D4EB4F)
#define _DDP_XXH_P3 UINT64_C(0x165667B19E3779F9)
#define _DDP_XXH_P4 UINT64_C(0x85EBCA77C2B2AE63)
#define _DDP_XXH_P5 UINT64_C(0x27D4EB2F165667C5)

typedef struct {
    uint64_t acc[4], seed, len;    /* len: bytes fed so far */
    unsigned char stripe[32];      /* an incomplete stripe */
    unsigned nstripe;
} _ddp_xxh64_t;

_DDP_PRIVATE uint64_t _ddp_xxh_rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

_DDP_PRIVATE uint64_t _ddp_xxh_le64(const unsigned char *p) {
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
#else
    return (uint64_t)p[0] | (uint64_t)p[1] << 8 | (uint64_t)p[2] << 16 | (uint64_t)p[3] << 24 |
           (uint64_t)p[4] << 32 | (uint64_t)p[5] << 40 | (uint64_t)p[6] << 48 | (uint64_t)p[7] << 56;
#endif
}

_DDP_PRIVATE uint32_t _ddp_xxh_le32(const unsigned char *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* The spec's "round": one lane into one accumulator. */
_DDP_PRIVATE uint64_t _ddp_xxh_round(uint64_t acc, uint64_t lane) {
    return _ddp_xxh_rotl(acc + lane * _DDP_XXH_P2, 31) * _DDP_XXH_P1;
}

_DDP_PRIVATE void _ddp_xxh64_init(_ddp_xxh64_t *h, uint64_t seed) {
    h->seed = seed;
    h->acc[0] = seed + _DDP_XXH_P1 + _DDP_XXH_P2;
    h->acc[1] = seed + _DDP_XXH_P2;
    h->acc[2] = seed;
    h->acc[3] = seed - _DDP_XXH_P1;
    h->len = 0;
    h->nstripe = 0;
}

/* Whole stripes of p[0, n) (n a multiple of 32) into the four accumulators. */
_DDP_PRIVATE void _ddp_xxh64_stripes(uint64_t *acc, const unsigned char *p, size_t n) {
    uint64_t a0 = acc[0], a1 = acc[1], a2 = acc[2], a3 = acc[3];
    const unsigned char *const end = p + n;
    for (; p < end; p += 32) {
        a0 = _ddp_xxh_round(a0, _ddp_xxh_le64(p));
        a1 = _ddp_xxh_round(a1, _ddp_xxh_le64(p + 8));
        a2 = _ddp_xxh_round(a2, _ddp_xxh_le64(p + 16));
        a3 = _ddp_xxh_round(a3, _ddp_xxh_le64(p + 24));
    }
    acc[0] = a0, acc[1] = a1, acc[2] = a2, acc[3] = a3;
}

_DDP_PRIVATE void _ddp_xxh64_update(_ddp_xxh64_t *h, const void *data, size_t n) {
    const unsigned char *p = (const unsigned char *)data;
    size_t whole;
    h->len += n;
    if (h->nstripe) {
        size_t take = 32 - h->nstripe < n ? 32 - h->nstripe : n;
        memcpy(h->stripe + h->nstripe, p, take);
        h->nstripe += (unsigned)take;
        p += take;
        n -= take;
        if (h->nstripe < 32) return;
        _ddp_xxh64_stripes(h->acc, h->stripe, 32);
        h->nstripe = 0;
    }
    whole = n & ~(size_t)31;
    _ddp_xxh64_stripes(h->acc, p, whole);
    if (n > whole) {
        memcpy(h->stripe, p + whole, n - whole);
        h->nstripe = (unsigned)(n - whole);
    }
}

_DDP_PRIVATE uint64_t _ddp_xxh64_digest(const _ddp_xxh64_t *h) {
    const unsigned char *p = h->stripe, *const end = h->stripe + h->nstripe;
    uint64_t acc;
    int i;
    if (h->len >= 32) {   /* the spec's step 3: the accumulators converge */
        acc = _ddp_xxh_rotl(h->acc[0], 1) + _ddp_xxh_rotl(h->acc[1], 7) + _ddp_xxh_rotl(h->acc[2], 12) +
              _ddp_xxh_rotl(h->acc[3], 18);
        for (i = 0; i < 4; i++) acc = (acc ^ _ddp_xxh_round(0, h->acc[i])) * _DDP_XXH_P1 + _DDP_XXH_P4;
    } else {
        acc = h->seed + _DDP_XXH_P5;
    }
    acc += h->len;
    for (; p + 8 <= end; p += 8)
        acc = _ddp_xxh_rotl(acc ^ _ddp_xxh_round(0, _ddp_xxh_le64(p)), 27) * _DDP_XXH_P1 + _DDP_XXH_P4;
    if (p + 4 <= end) {
        acc = _ddp_xxh_rotl(acc ^ (uint64_t)_ddp_xxh_le32(p) * _DDP_XXH_P1, 23) * _DDP_XXH_P2 + _DDP_XXH_P3;
        p += 4;
    }
    for (; p < end; p++) acc = _ddp_xxh_rotl(acc ^ (uint64_t)*p * _DDP_XXH_P5, 11) * _DDP_XXH_P1;
    acc ^= acc >> 33;   /* avalanche */
    acc *= _DDP_XXH_P2;
    acc ^= acc >> 29;
    acc *= _DDP_XXH_P3;
    return acc ^ (acc >> 32);
}

_DDP_PRIVATE uint64_t _ddp_xxh64(const void *data, size_t n, uint64_t seed) {
    _ddp_xxh64_t h;
    _ddp_xxh64_init(&h, seed);
    _ddp_xxh64_update(&h, data, n);
    return _ddp_xxh64_digest(&h);
}

/* ---- the state as one run of bytes ---- */

/* A position in the concatenation: offset off, which is byte `in` of buffer `buf`; plus the
 * digest of what was walked from the share's start: the current block's XXH64 and the sum of the
 * finished blocks' digests. */
typedef struct {
    uint64_t off, end;             /* [off, end): what is left of the share */
    int buf;
    size_t in;
    _ddp_xxh64_t h;
    uint64_t sum;
} _ddp_state_cur_t;

/* Most segments (buffer pieces) of one share in one group: a state of many small buffers moves
 * in more groups, never in more queued calls than this per peer. */
#define _DDP_STATE_MAX_SEGS 64

_DDP_PRIVATE void _ddp_state_cur_init(_ddp_state_cur_t *k, const ddp_state_buf_t *bufs, int nbufs,
                                      uint64_t lo, uint64_t hi) {
    uint64_t at = 0;
    int b = 0;
    while (b < nbufs && at + bufs[b].bytes <= lo) at += bufs[b++].bytes;   /* skips empty buffers */
    k->off = lo;
    k->end = hi;
    k->buf = b;
    k->in = (size_t)(lo - at);
    k->sum = 0;
    _ddp_xxh64_init(&k->h, lo / DDP_STATE_BLOCK_BYTES);
}

/* The next segment from position (*buf, *in) within [off, end): a buffer's bytes, at most max. */
_DDP_PRIVATE size_t _ddp_state_seg(const ddp_state_buf_t *bufs, int nbufs, int *buf, size_t *in, uint64_t left,
                                   size_t max, unsigned char **ptr) {
    size_t n;
    while (*buf < nbufs && *in == bufs[*buf].bytes) { (*buf)++; *in = 0; }
    if (*buf >= nbufs || left == 0) return 0;
    n = bufs[*buf].bytes - *in;
    if (n > left) n = (size_t)left;
    if (n > max) n = max;
    *ptr = (unsigned char *)bufs[*buf].ptr + *in;
    return n;
}

/* Feeds p[0, n) (the bytes at k->off) to k's digest, closing blocks at their boundaries. */
_DDP_PRIVATE void _ddp_state_hash(_ddp_state_cur_t *k, const unsigned char *p, size_t n, uint64_t total) {
    while (n) {
        uint64_t to_edge = DDP_STATE_BLOCK_BYTES - k->off % DDP_STATE_BLOCK_BYTES;
        size_t take = to_edge < n ? (size_t)to_edge : n;
        _ddp_xxh64_update(&k->h, p, take);
        p += take;
        n -= take;
        k->off += take;
        if (k->off % DDP_STATE_BLOCK_BYTES == 0 || k->off == total) {
            k->sum += _ddp_xxh64_digest(&k->h);
            _ddp_xxh64_init(&k->h, k->off / DDP_STATE_BLOCK_BYTES);
        }
    }
}

/* The digest from the sum of every block's digest and the total. */
_DDP_PRIVATE uint64_t _ddp_state_final(uint64_t sum, uint64_t total) {
    unsigned char b[16];
    int i;
    for (i = 0; i < 8; i++) b[i] = (unsigned char)(sum >> (8 * i)), b[8 + i] = (unsigned char)(total >> (8 * i));
    return _ddp_xxh64(b, sizeof b, 0);
}

/* Hashes the rest of k's range in place (no transfer). */
_DDP_PRIVATE void _ddp_state_hash_all(_ddp_state_cur_t *k, const ddp_state_buf_t *bufs, int nbufs, uint64_t total) {
    unsigned char *p = NULL;
    size_t n;
    while ((n = _ddp_state_seg(bufs, nbufs, &k->buf, &k->in, k->end - k->off, (size_t)-1, &p)) > 0) {
        _ddp_state_hash(k, p, n, total);
        k->in += n;
    }
}

DDP_API uint64_t ddp_state_digest(const ddp_state_buf_t *bufs, int nbufs) {
    _ddp_state_cur_t k;
    uint64_t total = 0;
    int b;
    if (!bufs || nbufs < 0) nbufs = 0;
    for (b = 0; b < nbufs; b++) total += bufs[b].bytes;
    _ddp_state_cur_init(&k, bufs, nbufs, 0, total);
    _ddp_state_hash_all(&k, bufs, nbufs, total);
    return _ddp_state_final(k.sum, total);
}

/* Share i of `senders`: whole blocks, [*lo, *hi) bytes, the first shares one block longer when
 * the blocks do not divide evenly. */
_DDP_PRIVATE void _ddp_state_share(uint64_t total, int senders, int i, uint64_t *lo, uint64_t *hi) {
    const uint64_t nblocks = (total + DDP_STATE_BLOCK_BYTES - 1) / DDP_STATE_BLOCK_BYTES;
    const uint64_t q = nblocks / (uint64_t)senders, r = nblocks % (uint64_t)senders;
    const uint64_t b0 = q * (uint64_t)i + ((uint64_t)i < r ? (uint64_t)i : r);
    const uint64_t b1 = b0 + q + ((uint64_t)i < r);
    *lo = b0 * DDP_STATE_BLOCK_BYTES < total ? b0 * DDP_STATE_BLOCK_BYTES : total;
    *hi = b1 * DDP_STATE_BLOCK_BYTES < total ? b1 * DDP_STATE_BLOCK_BYTES : total;
}

/* Which buffers hold bytes [lo, hi) (hi > lo): *first .. *last. */
_DDP_PRIVATE void _ddp_state_bufs_of(const ddp_state_buf_t *bufs, int nbufs, uint64_t lo, uint64_t hi, int *first,
                                     int *last) {
    uint64_t at = 0;
    int b;
    *first = *last = -1;
    for (b = 0; b < nbufs; at += bufs[b].bytes, b++) {
        if (!bufs[b].bytes || at + bufs[b].bytes <= lo || at >= hi) continue;
        if (*first < 0) *first = b;
        *last = b;
    }
}

/* ---- the check round: one record per rank ---- */
enum {
    _DDP_SR_MAGIC, _DDP_SR_BAD, _DDP_SR_SENDERS, _DDP_SR_NBUFS, _DDP_SR_TOTAL, _DDP_SR_SIZES,
    _DDP_SR_PIECE, _DDP_SR_CHECK, _DDP_SR_WHOLE, _DDP_SR_WORDS
};
#define _DDP_STATE_MAGIC UINT64_C(0x6464707374617431)   /* "ddpstat1" */

/* The first rank whose record disagrees with rank 0's, and how: the same message on every rank.
 * DDP_SUCCESS when all agree. *sizes_rank: the first rank whose buffer sizes differ while the
 * number of buffers agrees everywhere (-1: none); the caller names the buffer (one more round). */
_DDP_PRIVATE ddp_result_t _ddp_state_agree(ddp_comm_t *c, const uint64_t *rec, int size, int *sizes_rank) {
    static const char *const what[_DDP_SR_WORDS] = {"version", "", "senders", "number of buffers", "total bytes",
                                                    "", "piece_bytes", "check_senders", ""};
    const uint64_t *r0 = rec;
    int r, w;
    *sizes_rank = -1;
    for (r = 0; r < size; r++)
        if (rec[r * _DDP_SR_WORDS + _DDP_SR_BAD])
            return ddp_comm_fail(c, DDP_ERR_INVALID_ARGUMENT, "state_sync: rank %d refused its arguments (its "
                                 "ddp_comm_last_error says which); nothing was moved", r);
    for (r = 1; r < size; r++) {
        const uint64_t *x = rec + r * _DDP_SR_WORDS;
        for (w = 0; w < _DDP_SR_WORDS; w++) {
            if (w == _DDP_SR_BAD || w == _DDP_SR_WHOLE || w == _DDP_SR_TOTAL || w == _DDP_SR_SIZES || x[w] == r0[w])
                continue;
            return ddp_comm_fail(c, DDP_ERR_MISMATCH, "state_sync: rank %d passed %s %llu, rank 0 %llu (every "
                                 "rank passes the same list of buffer sizes and options); nothing was moved",
                                 r, what[w], (unsigned long long)x[w], (unsigned long long)r0[w]);
        }
    }
    for (r = 1; r < size; r++) {
        const uint64_t *x = rec + r * _DDP_SR_WORDS;
        if (x[_DDP_SR_SIZES] != r0[_DDP_SR_SIZES] || x[_DDP_SR_TOTAL] != r0[_DDP_SR_TOTAL]) {
            *sizes_rank = r;
            return DDP_ERR_MISMATCH;
        }
    }
    if (r0[_DDP_SR_CHECK])
        for (r = 1; r < (int)r0[_DDP_SR_SENDERS]; r++)
            if (rec[r * _DDP_SR_WORDS + _DDP_SR_WHOLE] != r0[_DDP_SR_WHOLE])
                return ddp_comm_fail(c, DDP_ERR_MISMATCH, "state_sync: check_senders: sender rank %d's state "
                                     "(digest %016llx) differs from rank 0's (%016llx): the senders' replicas "
                                     "are not identical; nothing was moved", r,
                                     (unsigned long long)rec[r * _DDP_SR_WORDS + _DDP_SR_WHOLE],
                                     (unsigned long long)r0[_DDP_SR_WHOLE]);
    return DDP_SUCCESS;
}

/* Every rank has as many buffers as rank 0 but some sizes differ (rank `first` for one): rank 0's
 * sizes are broadcast, 64 at a time, each rank finds its first buffer that differs, and one
 * all-gather of (buffer + 1, its size, rank 0's) names it on every rank. rec: 3 words per rank. */
_DDP_PRIVATE ddp_result_t _ddp_state_name_buffer(ddp_comm_t *c, const ddp_state_buf_t *bufs, int nbufs, uint64_t *rec,
                                                 int first) {
    const int rank = ddp_comm_rank(c), size = ddp_comm_size(c);
    uint64_t chunk[64], mine[3] = {0, 0, 0};
    int base, i, r;
    ddp_result_t e;
    for (base = 0; base < nbufs; base += 64) {
        const int m = nbufs - base < 64 ? nbufs - base : 64;
        for (i = 0; i < m; i++) chunk[i] = bufs[base + i].bytes;
        if ((e = ddp_broadcast(chunk, chunk, (size_t)m, DDP_UINT64, 0, c)) != DDP_SUCCESS) return e;
        for (i = 0; i < m && !mine[0]; i++)
            if (chunk[i] != bufs[base + i].bytes)
                mine[0] = (uint64_t)(base + i) + 1, mine[1] = bufs[base + i].bytes, mine[2] = chunk[i];
    }
    memcpy(rec + 3 * (size_t)rank, mine, sizeof mine);
    if ((e = ddp_all_gather(rec + 3 * (size_t)rank, rec, 3, DDP_UINT64, c)) != DDP_SUCCESS) return e;
    for (r = 1; r < size; r++)
        if (rec[3 * r])
            return ddp_comm_fail(c, DDP_ERR_MISMATCH, "state_sync: rank %d's buffer %d is %llu bytes, rank 0's "
                                 "%llu (every rank passes the same list of buffer sizes); nothing was moved", r,
                                 (int)rec[3 * r] - 1, (unsigned long long)rec[3 * r + 1],
                                 (unsigned long long)rec[3 * r + 2]);
    return ddp_comm_fail(c, DDP_ERR_INTERNAL, "state_sync: rank %d's sizes digest differs from rank 0's, yet "
                         "every size agrees", first);
}

/* The local checks; DDP_SUCCESS, DDP_ERR_INVALID_ARGUMENT or (device memory)
 * DDP_ERR_UNSUPPORTED, recorded, not yet returned: the rank still takes part in the check round,
 * so that every rank fails at once (the others with DDP_ERR_INVALID_ARGUMENT, naming it). */
_DDP_PRIVATE ddp_result_t _ddp_state_args(ddp_comm_t *c, int senders, const ddp_state_buf_t *bufs, int nbufs,
                                          uint64_t *total) {
    int b;
    *total = 0;
    if (senders < 1 || senders > ddp_comm_size(c))
        return ddp_comm_fail(c, DDP_ERR_INVALID_ARGUMENT, "state_sync: senders = %d: must be 1 .. %d (the "
                             "communicator's size: ranks [0, senders) send, the rest receive)", senders,
                             ddp_comm_size(c));
    if (nbufs < 0 || (nbufs > 0 && !bufs))
        return ddp_comm_fail(c, DDP_ERR_INVALID_ARGUMENT, "state_sync: %s (nbufs = %d)",
                             nbufs < 0 ? "a negative number of buffers" : "bufs is NULL", nbufs);
    for (b = 0; b < nbufs; b++) {
        if (!bufs[b].ptr && bufs[b].bytes)
            return ddp_comm_fail(c, DDP_ERR_INVALID_ARGUMENT, "state_sync: buffer %d: NULL ptr with %zu bytes", b,
                                 bufs[b].bytes);
        if (bufs[b].bytes && ddp_comm_is_device(c, bufs[b].ptr))   /* hashed here: host memory only */
            return ddp_comm_fail(c, DDP_ERR_UNSUPPORTED, "state_sync: buffer %d is device memory: host buffers "
                                 "only (stage a device state through host memory)", b);
        if (*total + bufs[b].bytes < *total)
            return ddp_comm_fail(c, DDP_ERR_INVALID_ARGUMENT, "state_sync: buffer %d: the sizes add up past 2^64", b);
        *total += bufs[b].bytes;
    }
    return DDP_SUCCESS;
}

/* ---- the transfer ---- */

/* A failure of comm: its own message (which names the rank and phase) in context, without
 * repeating its "rank N: " head and "[reason]" tail. */
_DDP_PRIVATE ddp_result_t _ddp_state_comm_err(ddp_comm_t *c, ddp_result_t e, const char *what) {
    char body[640];
    const char *m = ddp_comm_last_error(c), *colon = strstr(m, ": ");
    size_t n;
    if (!strncmp(m, "rank ", 5) && colon) m = colon + 2;
    snprintf(body, sizeof body, "%.600s", m);
    n = strlen(body);
    if (n && body[n - 1] == ']') {
        char *open = strrchr(body, '[');
        if (open && open > body && open[-1] == ' ') open[-1] = 0;
    }
    return ddp_comm_fail(c, e, "state_sync: %s: %s", what, body);
}

/* Queues (inside the caller's group) the next piece of k's share: sends to every receiver
 * (peer < 0: this rank is its sender) or receives from `peer`, without moving k. */
_DDP_PRIVATE ddp_result_t _ddp_state_post(ddp_comm_t *c, const _ddp_state_cur_t *k, const ddp_state_buf_t *bufs,
                                          int nbufs, size_t piece, int peer, int senders, int size) {
    int buf = k->buf, segs = 0, r;
    size_t in = k->in, n;
    uint64_t left = k->end - k->off < piece ? k->end - k->off : piece;
    unsigned char *p = NULL;
    ddp_result_t e = DDP_SUCCESS;
    while (segs < _DDP_STATE_MAX_SEGS && (n = _ddp_state_seg(bufs, nbufs, &buf, &in, left, (size_t)-1, &p)) > 0) {
        if (peer >= 0) e = ddp_recv(p, n, DDP_UINT8, peer, c);
        else
            for (r = senders; r < size && e == DDP_SUCCESS; r++) e = ddp_send(p, n, DDP_UINT8, r, c);
        if (e != DDP_SUCCESS) return e;
        in += n;
        left -= n;
        segs++;
    }
    return DDP_SUCCESS;
}

/* After the group: walks the same piece again and moves k past it; hash = 1 hashes it, 2 too (a
 * receiver's: what arrived), 0 does not (the hasher's cursors do, or a sender hashed before).
 * Returns the piece's bytes. */
_DDP_PRIVATE uint64_t _ddp_state_advance(_ddp_state_cur_t *k, const ddp_state_buf_t *bufs, int nbufs, size_t piece,
                                         uint64_t total, int hash, int share) {
    int segs = 0;
    size_t n;
    uint64_t left = k->end - k->off < piece ? k->end - k->off : piece, moved = 0;
    unsigned char *p = NULL;
    (void)share;
    while (segs < _DDP_STATE_MAX_SEGS && (n = _ddp_state_seg(bufs, nbufs, &k->buf, &k->in, left, (size_t)-1, &p)) > 0) {
#ifdef _DDP_STATE_TEST_RECEIVED
        /* Test builds only (tests/test_state_sync.c): what arrived, before it is hashed. */
        if (hash == 2) _DDP_STATE_TEST_RECEIVED(share, k->off, p, n);
#endif
        if (hash) _ddp_state_hash(k, p, n, total);
        else k->off += n;
        k->in += n;
        left -= n;
        moved += n;
        segs++;
    }
    return moved;
}

/* The hashing beside the transfer: a thread of this call walks the same pieces with cursors of
 * its own and hashes them, one round behind the transfer on a receiver (round j's bytes are in
 * place once its group ended, and round j + 1 lands elsewhere), free-running on a sender (its
 * share does not change), so the hashing overlaps the transfer instead of adding to it. If no
 * thread can be started, the transfer hashes each round itself after its group. */
typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    uint64_t ready;                /* rounds whose bytes are in place (a sender: all) */
    int stop;                      /* the transfer failed: return at once */
    _ddp_state_cur_t *k;           /* its own cursors */
    int nk, nbufs, receiver, rank;
    const ddp_state_buf_t *bufs;
    size_t piece;
    uint64_t total;
} _ddp_state_hasher_t;

_DDP_PRIVATE int _ddp_state_left(const _ddp_state_cur_t *k, int nk) {
    int i, left = 0;
    for (i = 0; i < nk; i++) left += k[i].off < k[i].end;
    return left;
}

_DDP_PRIVATE void *_ddp_state_hasher_main(void *arg) {
    _ddp_state_hasher_t *h = (_ddp_state_hasher_t *)arg;
    uint64_t round;
    int i, stop;
    for (round = 0; _ddp_state_left(h->k, h->nk); round++) {
        pthread_mutex_lock(&h->mu);
        while (!h->stop && h->ready <= round) pthread_cond_wait(&h->cv, &h->mu);
        stop = h->stop;
        pthread_mutex_unlock(&h->mu);
        if (stop) break;
        for (i = 0; i < h->nk; i++)
            if (h->k[i].off < h->k[i].end)
                _ddp_state_advance(&h->k[i], h->bufs, h->nbufs, h->piece, h->total, h->receiver ? 2 : 1,
                                   h->receiver ? i : h->rank);
    }
    return NULL;
}

/* Tells the hasher that rounds [0, ready) are in place, or (stop) to give up. */
_DDP_PRIVATE void _ddp_state_hasher_tell(_ddp_state_hasher_t *h, uint64_t ready, int stop) {
    pthread_mutex_lock(&h->mu);
    if (ready > h->ready) h->ready = ready;
    if (stop) h->stop = 1;
    pthread_cond_signal(&h->cv);
    pthread_mutex_unlock(&h->mu);
}

/* The data phase: the senders' shares to every receiver, piece by piece; each piece one group.
 * k: this rank's cursors (a sender: k[0], its share; a receiver: k[i], share i), hk as many
 * for the hasher; hash = 0: a sender that hashed its share before. On success k[i].sum holds
 * the digest of what k[i] covered. */
_DDP_PRIVATE ddp_result_t _ddp_state_move(ddp_comm_t *c, _ddp_state_cur_t *k, _ddp_state_cur_t *hk, int senders,
                                          const ddp_state_buf_t *bufs, int nbufs, size_t piece, uint64_t total,
                                          int hash, uint64_t *moved) {
    const int rank = ddp_comm_rank(c), size = ddp_comm_size(c), sender = rank < senders;
    const int nk = sender ? 1 : senders;
    _ddp_state_hasher_t h;
    pthread_t th;
    int i, threaded = 0, why = 0;
    uint64_t pieces = 0;
    ddp_result_t e = DDP_SUCCESS;
    *moved = 0;
    if (hash) {
        memset(&h, 0, sizeof h);
        memcpy(hk, k, sizeof *k * (size_t)nk);
        h.k = hk, h.nk = nk, h.nbufs = nbufs, h.receiver = !sender, h.rank = rank;
        h.bufs = bufs, h.piece = piece, h.total = total;
        h.ready = sender ? UINT64_MAX : 0;
#ifdef _DDP_STATE_TEST_NO_THREAD
        if (_DDP_STATE_TEST_NO_THREAD) why = EAGAIN;   /* test builds only: the fallback */
        else
#endif
        if ((why = pthread_mutex_init(&h.mu, NULL)) == 0) {
            if ((why = pthread_cond_init(&h.cv, NULL)) == 0) {
                threaded = (why = pthread_create(&th, NULL, _ddp_state_hasher_main, &h)) == 0;
                if (!threaded) pthread_cond_destroy(&h.cv);
            }
            if (!threaded) pthread_mutex_destroy(&h.mu);
        }
        if (!threaded)
            ddp_comm_log(c, DDP_LOG_INFO, "state_sync: no hashing thread (%s): hashing after each piece",
                         strerror(why));
    }
    while (_ddp_state_left(k, nk)) {
        if ((e = ddp_group_start(c)) != DDP_SUCCESS) break;
        for (i = 0, e = DDP_SUCCESS; i < nk && e == DDP_SUCCESS; i++)
            if (k[i].off < k[i].end) e = _ddp_state_post(c, &k[i], bufs, nbufs, piece, sender ? -1 : i, senders, size);
        {   /* the group runs (or, after a refused call, reports it) at group_end */
            ddp_result_t g = ddp_group_end(c);
            if (e == DDP_SUCCESS) e = g;
        }
        if (e != DDP_SUCCESS) {
            char what[96];
            snprintf(what, sizeof what, "%s piece %llu of %s", sender ? "sending" : "receiving",
                     (unsigned long long)pieces, sender ? "its share to the receivers" : "the shares");
            e = _ddp_state_comm_err(c, e, what);
            break;
        }
        for (i = 0; i < nk; i++)
            if (k[i].off < k[i].end) {
                uint64_t n = _ddp_state_advance(&k[i], bufs, nbufs, piece, total,
                                                threaded || !hash ? 0 : sender ? 1 : 2, sender ? rank : i);
                *moved += sender ? n * (uint64_t)(size - senders) : n;
            }
        pieces++;
#ifdef _DDP_STATE_TEST_SENT
        if (sender) _DDP_STATE_TEST_SENT(pieces);   /* test builds only: a piece went out */
#endif
        if (threaded && !sender) _ddp_state_hasher_tell(&h, pieces, 0);
    }
    if (threaded) {   /* after a failure: stop it; else it finishes the last round */
        if (e != DDP_SUCCESS) _ddp_state_hasher_tell(&h, 0, 1);
        pthread_join(th, NULL);
        pthread_cond_destroy(&h.cv);
        pthread_mutex_destroy(&h.mu);
        for (i = 0; i < nk; i++) k[i].sum = hk[i].sum;
    }
    return e;
}

/* ---- ddp_state_sync's steps ---- */

/* opts' piece size rounded up to whole blocks, as documented at ddp_state_opts_t. */
_DDP_PRIVATE size_t _ddp_state_piece(const ddp_state_opts_t *o) {
    size_t piece = o->piece_bytes ? o->piece_bytes : DDP_STATE_DEFAULT_PIECE_BYTES;
    piece = (piece + DDP_STATE_BLOCK_BYTES - 1) / DDP_STATE_BLOCK_BYTES * DDP_STATE_BLOCK_BYTES;
    if (!piece) piece = DDP_STATE_BLOCK_BYTES;   /* rounding wrapped */
    return piece;
}

/* A digest of the size list (each size little-endian), so that one word of the check round
 * compares every rank's list, whatever its length. */
_DDP_PRIVATE uint64_t _ddp_state_sizes_digest(const ddp_state_buf_t *bufs, int nbufs) {
    _ddp_xxh64_t h;
    unsigned char le[8];
    int b, j;
    _ddp_xxh64_init(&h, 0);
    for (b = 0; b < nbufs; b++) {
        for (j = 0; j < 8; j++) le[j] = (unsigned char)((uint64_t)bufs[b].bytes >> (8 * j));
        _ddp_xxh64_update(&h, le, 8);
    }
    return _ddp_xxh64_digest(&h);
}

/* This rank's record for the check round: every word every rank must agree on before data moves
 * (the whole state's digest, for check_senders, is the caller's). */
_DDP_PRIVATE void _ddp_state_record(uint64_t *mine, int senders, const ddp_state_buf_t *bufs, int nbufs,
                                    uint64_t total, size_t piece, const ddp_state_opts_t *o) {
    mine[_DDP_SR_SENDERS] = (uint64_t)senders;
    mine[_DDP_SR_NBUFS] = (uint64_t)nbufs;
    mine[_DDP_SR_TOTAL] = total;
    mine[_DDP_SR_SIZES] = _ddp_state_sizes_digest(bufs, nbufs);
    mine[_DDP_SR_PIECE] = piece;
    mine[_DDP_SR_CHECK] = o->check_senders != 0;
}

/* check_senders on a sender: the digest of the whole state, hashed share by share (k: scratch),
 * so that this rank's own share's digest comes free (*own) and the transfer need not hash it. */
_DDP_PRIVATE uint64_t _ddp_state_whole_digest(_ddp_state_cur_t *k, const ddp_state_buf_t *bufs, int nbufs,
                                              uint64_t total, int senders, int rank, uint64_t *own) {
    uint64_t all = 0, lo, hi;
    int i;
    for (i = 0; i < senders; i++) {
        _ddp_state_share(total, senders, i, &lo, &hi);
        _ddp_state_cur_init(k, bufs, nbufs, lo, hi);
        _ddp_state_hash_all(k, bufs, nbufs, total);
        all += k->sum;
        if (i == rank) *own = k->sum;   /* its share's, for the verification */
    }
    return _ddp_state_final(all, total);
}

/* The check round: every rank's record to every rank and the same verdict on each, so that a
 * refusal or a disagreement fails every rank before any data moves. */
_DDP_PRIVATE ddp_result_t _ddp_state_check(ddp_comm_t *c, const uint64_t *mine, uint64_t *rec, ddp_result_t bad,
                                           const ddp_state_buf_t *bufs, int nbufs) {
    const int rank = ddp_comm_rank(c), size = ddp_comm_size(c);
    int first;
    ddp_result_t e;
    memcpy(rec + (size_t)rank * _DDP_SR_WORDS, mine, sizeof *mine * _DDP_SR_WORDS);
    e = ddp_all_gather(rec + (size_t)rank * _DDP_SR_WORDS, rec, _DDP_SR_WORDS, DDP_UINT64, c);
    if (e != DDP_SUCCESS) return _ddp_state_comm_err(c, e, "the check round (sizes, options)");
    if (bad != DDP_SUCCESS) return bad;   /* its message is this rank's last error */
    if ((e = _ddp_state_agree(c, rec, size, &first)) != DDP_SUCCESS) {
        if (first >= 0 && (e = _ddp_state_name_buffer(c, bufs, nbufs, rec, first)) != DDP_ERR_MISMATCH &&
            e != DDP_ERR_INTERNAL)
            e = _ddp_state_comm_err(c, e, "naming the buffer whose size differs");
        return e;
    }
    return DDP_SUCCESS;
}

/* The transfer: this rank's cursors (a sender: its share; a receiver: every share; the hasher's
 * after them), then every share moves, hashed as it goes unless a sender hashed it already. */
_DDP_PRIVATE ddp_result_t _ddp_state_transfer(ddp_comm_t *c, _ddp_state_cur_t *k, int senders,
                                              const ddp_state_buf_t *bufs, int nbufs, size_t piece, uint64_t total,
                                              int hashed, uint64_t *moved) {
    const int rank = ddp_comm_rank(c), sender = rank < senders, nk = sender ? 1 : senders;
    uint64_t lo, hi;
    int i;
    for (i = 0; i < nk; i++) {
        _ddp_state_share(total, senders, sender ? rank : i, &lo, &hi);
        _ddp_state_cur_init(&k[i], bufs, nbufs, lo, hi);
    }
    return _ddp_state_move(c, k, k + nk, senders, bufs, nbufs, piece, total, !hashed, moved);
}

/* The exchange of digests: the senders' share digests (own: this sender's) to everyone, each
 * receiver compares, then every receiver's verdict to everyone (in rec[size ..]), so that every
 * rank reaches the same result. A receiver's *digest: the state's, from what arrived. */
_DDP_PRIVATE ddp_result_t _ddp_state_exchange(ddp_comm_t *c, const _ddp_state_cur_t *k, uint64_t *rec, int senders,
                                              uint64_t own, uint64_t total, uint64_t *digest) {
    const int rank = ddp_comm_rank(c), size = ddp_comm_size(c), sender = rank < senders;
    uint64_t verdict = 0, sums = 0;   /* (shares that arrived different) << 32 | first such share + 1 */
    int i;
    ddp_result_t e;
    rec[rank] = sender ? own : 0;
    if ((e = ddp_all_gather(rec + rank, rec, 1, DDP_UINT64, c)) != DDP_SUCCESS)
        return _ddp_state_comm_err(c, e, "gathering the senders' share digests");
    if (!sender) {
        for (i = 0; i < senders; i++) {
            sums += k[i].sum;
            if (k[i].sum != rec[i])
                verdict = verdict ? verdict + (UINT64_C(1) << 32) : (UINT64_C(1) << 32) | (uint64_t)(i + 1);
        }
        *digest = _ddp_state_final(sums, total);
    }
    rec[size + rank] = verdict;
    if ((e = ddp_all_gather(rec + size + rank, rec + size, 1, DDP_UINT64, c)) != DDP_SUCCESS)
        return _ddp_state_comm_err(c, e, "gathering the receivers' verdicts");
    return DDP_SUCCESS;
}

/* The verdict from the receivers' (rec[size ..]): the same DDP_ERR_MISMATCH on every rank, naming
 * the first share that arrived different, its sender and receiver, so no rank succeeds alone. */
_DDP_PRIVATE ddp_result_t _ddp_state_verdict(ddp_comm_t *c, const uint64_t *rec, int senders,
                                             const ddp_state_buf_t *bufs, int nbufs, uint64_t total) {
    const int size = ddp_comm_size(c);
    uint64_t lo, hi;
    int i, first, last, bad_share = -1, bad_receiver = -1, nbad = 0;
    for (i = senders; i < size; i++) {
        const uint64_t v = rec[size + i];
        if (!v) continue;
        nbad += (int)(v >> 32);
        if (bad_receiver < 0) bad_receiver = i, bad_share = (int)(v & 0xffffffffu) - 1;
    }
    if (!nbad) return DDP_SUCCESS;
    _ddp_state_share(total, senders, bad_share, &lo, &hi);
    _ddp_state_bufs_of(bufs, nbufs, lo, hi, &first, &last);
    return ddp_comm_fail(c, DDP_ERR_MISMATCH, "state_sync: share %d (bytes [%llu, %llu) of %llu, buffers %d .. %d), "
                         "sent by rank %d, arrived different at rank %d (its digest differs from the sender's); "
                         "%d share(s) arrived different in all: the receivers' state is not to be used",
                         bad_share, (unsigned long long)lo, (unsigned long long)hi, (unsigned long long)total,
                         first, last, bad_share, bad_receiver, nbad);
}

DDP_API ddp_result_t ddp_state_sync(ddp_comm_t *c, int senders, const ddp_state_buf_t *bufs, int nbufs,
                                    const ddp_state_opts_t *opts, ddp_state_report_t *report) {
    const int64_t t0 = _ddp_now_us();
    ddp_state_opts_t o;
    ddp_state_report_t rep;
    uint64_t total = 0, mine[_DDP_SR_WORDS], *rec = NULL, moved = 0, own = 0;
    _ddp_state_cur_t *k = NULL;
    int size, rank, sender, hashed = 0;
    size_t piece;
    ddp_result_t e, bad;
    if (report) memset(report, 0, sizeof *report);
    if (!c || ddp_comm_rank(c) < 0) return DDP_ERR_INVALID_ARGUMENT;
    size = ddp_comm_size(c);
    rank = ddp_comm_rank(c);
    memset(&o, 0, sizeof o);
    if (opts) o = *opts;
    piece = _ddp_state_piece(&o);
    memset(&rep, 0, sizeof rep);
    memset(mine, 0, sizeof mine);
    bad = _ddp_state_args(c, senders, bufs, nbufs, &total);
    sender = rank < senders;
    /* The records of every rank, then (reused) the senders' share digests and the verdicts;
     * the cursors: one per share on a receiver, twice (the transfer's, the hasher's). Sized by
     * the world, never by the state. */
    rec = (uint64_t *)ddp_comm_calloc(c, sizeof *rec * (size_t)size * _DDP_SR_WORDS);
    k = (_ddp_state_cur_t *)ddp_comm_calloc(c, sizeof *k * 2 * (size_t)(bad == DDP_SUCCESS && !sender ? senders : 1));
    if (!rec || !k) {
        ddp_comm_free(c, rec);
        ddp_comm_free(c, k);
        return ddp_comm_fail(c, DDP_ERR_OUT_OF_MEMORY, "state_sync: %zu bytes for the check round",
                             sizeof *rec * (size_t)size * _DDP_SR_WORDS);
    }
    mine[_DDP_SR_MAGIC] = _DDP_STATE_MAGIC;
    mine[_DDP_SR_BAD] = bad != DDP_SUCCESS;
    if (bad == DDP_SUCCESS) {
        _ddp_state_record(mine, senders, bufs, nbufs, total, piece, &o);
        if (sender && o.check_senders) {
            rep.digest = mine[_DDP_SR_WHOLE] = _ddp_state_whole_digest(k, bufs, nbufs, total, senders, rank, &own);
            hashed = 1;
        }
    }
    if ((e = _ddp_state_check(c, mine, rec, bad, bufs, nbufs)) != DDP_SUCCESS) goto out;
    rep.bytes = total;
    rep.senders = senders;
    rep.receivers = size - senders;
    if (senders < size) {
        if ((e = _ddp_state_transfer(c, k, senders, bufs, nbufs, piece, total, hashed, &moved)) != DDP_SUCCESS)
            goto out;
        rep.moved = moved;
        if ((e = _ddp_state_exchange(c, k, rec, senders, hashed ? own : k[0].sum, total, &rep.digest)) != DDP_SUCCESS)
            goto out;
        if ((e = _ddp_state_verdict(c, rec, senders, bufs, nbufs, total)) != DDP_SUCCESS) {
            rep.seconds = (double)(_ddp_now_us() - t0) * 1e-6;   /* a mismatch still reports */
            if (report) *report = rep;
            report = NULL;
            goto out;
        }
    }
    rep.seconds = (double)(_ddp_now_us() - t0) * 1e-6;
    ddp_comm_log(c, DDP_LOG_INFO, "state_sync: %llu bytes in %d buffers, %d share(s) from ranks 0..%d to %d "
                 "receiver(s), %s %llu bytes, verified: %.3f s, %.2f GB/s (the state's bytes / time)",
                 (unsigned long long)total, nbufs, senders, senders - 1, size - senders, sender ? "sent" : "received",
                 (unsigned long long)rep.moved, rep.seconds, rep.seconds > 0 ? (double)total / rep.seconds * 1e-9 : 0.0);
    if (report) *report = rep;
out:
    if (e != DDP_SUCCESS && report) memset(report, 0, sizeof *report);
    ddp_comm_free(c, rec);
    ddp_comm_free(c, k);
    return e;
}

#endif /* DDP_STATE_IMPLEMENTATION */
