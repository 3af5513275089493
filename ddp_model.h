/* SPDX-License-Identifier: MIT (see LICENSE) */
/* ddp_model.h — libddp's all-reduce cost model: the predicted time of each all-reduce algorithm
 * for a size, a world size and a hosts layout, and the pick of the fastest. Private: the
 * communicator (ddp_comm.h) asks it once per call; bench/simulate.c projects it to large jobs
 * and bench/calibrate.c measures its parameters. Built by DDP_IMPLEMENTATION (or
 * DDP_MODEL_IMPLEMENTATION). Depends on ddp_base.h.
 *
 * PARAMETERS (_ddp_model_t; the file keys in brackets)
 *   alpha_us[LOCAL]  [alpha_local_us]  latency of one message between two ranks of one host
 *                                      (shared memory): half a ping-pong round trip of 8 bytes
 *   alpha_us[NET]    [alpha_net_us]    the same across hosts (TCP)
 *   beta_ns[LOCAL]   [beta_local_ns]   ns per byte of one point-to-point stream on one host
 *   beta_ns[NET]     [beta_net_ns]     ns per byte of one stream across hosts
 *   nic_ns           [nic_ns]          ns per byte through one host's network link, shared by
 *                                      all of that host's concurrent streams (k streams each get
 *                                      max(beta_net, k * nic_ns) per byte); 0 = no shared limit
 *   gamma_ns         [gamma_ns]        ns per byte to reduce (float sum, read two, write one)
 * A message of m bytes costs alpha + m * beta: Hockney's model (R. W. Hockney, "The
 * communication challenge for MPP: Intel Paragon and Meiko CS-2", Parallel Computing 20, 1994).
 *
 * DEFAULTS: LOCAL and gamma measured on the development machine (2-core AMD EPYC VM, shm
 * transport, `make calibrate`: alpha 3.4 us, beta 0.13 ns/B = 7.7 GB/s, gamma 0.10 ns/B); NET is an assumed 10 GbE link through one switch: alpha 25 us
 * (a TCP round trip of ~50 us through kernel stacks on both ends), beta = nic = 0.8 ns/B
 * (10 Gbit/s = 1.25 GB/s: one stream fills the link, so the link and the stream share one rate).
 *
 * FORMULAS. n bytes, p ranks on H hosts with L = local_min .. Lmax = local_max ranks each,
 * msg(m) = alpha + m * beta on the link a step uses. Following Thakur, Rabenseifner & Gropp,
 * "Optimization of collective communication operations in MPICH", IJHPCA 19(1), 2005 (section 4
 * gives these alpha-beta-gamma costs), with p' = the largest power of two <= p, k = log2 p':
 *   ring          (p-1) [alpha + n/p max(beta, gamma)] + (p-1) msg(n/p): Thakur's
 *                 2(p-1) msg(n/p) + (p-1)(n/p) gamma, except that the reduce-scatter's
 *                 reductions overlap its transfers (ddp_ring.h keeps up to 8 segments in
 *                 flight and reduces one while the next arrive), so the slower of moving and
 *                 reducing paces those steps. The 2(p-1)/p n bytes per rank are the bandwidth
 *                 optimum (Patarasuk & Yuan, "Bandwidth optimal all-reduce algorithms for
 *                 clusters of workstations", JPDC 69(2), 2009). With H > 1 every step is
 *                 paced by its slowest link, the network: one stream per direction leaves each
 *                 host (a host's ranks are consecutive). The TCP alpha is mostly software
 *                 overhead on the boundary ranks, which take part in every step, so it is paid
 *                 2(p-1) times even though only H of each step's p hops cross hosts.
 *   rd            [p' < p: 2 msg(n) + n gamma to fold the extra ranks in and hand them the
 *                 result] + k (msg(n) + n gamma): each step reduces what it received before the
 *                 next can send it (no overlap; the same for rabenseifner).
 *   rabenseifner  [the same folding] + recursive halving (step i: msg(n/2^i) + n/2^i gamma)
 *                 then recursive doubling (the same messages in reverse order), i = 1..k:
 *                 2k alpha + 2 (p'-1)/p' n beta + (p'-1)/p' n gamma.
 *   hier_X        (Lmax-1) steps of n/L: ring reduce-scatter inside each host (as ring's)
 *                 + X over the H hosts on n/L bytes, L such all-reduces at once
 *                 + (Lmax-1) msg_local(n/L) all-gather inside each host.
 *                 H == 1: the two local parts only (then it equals ring); Lmax == 1: X alone
 *                 (then it equals flat X: the pick prefers the flat one on such ties).
 * Which link a recursive step uses: partners r ^ mask. All local when H == 1; when every host
 * has L ranks, L a power of two, steps with mask < L stay inside hosts; every other step crosses
 * hosts and costs max(local msg, network msg) (paced by its slowest pair), with
 * min(Lmax, 2 mask) streams per host (of a host's consecutive ranks, those within mask of either
 * end have partners elsewhere) sharing its link. Rabenseifner's halving starts at mask 1 (the
 * largest exchange, n/2, with the nearest rank, as MPICH does) unless _DDP_MODEL_RAB_FAR_FIRST.
 * The folding of extra ranks crosses hosts when H > 1 (the partner is p' away), min(Lmax, p-p')
 * streams per host.
 * In hier_X, L all-reduces of the hosts run at once, so each host link carries L streams.
 * Not modelled: contention for a host's memory bandwidth when many ranks copy through shared
 * memory at once (LOCAL is one stream's cost however many run), more ranks than cores, and
 * the per-segment latency of messages larger than a segment (a few percent at 512 KiB).
 *
 * FILE: text, one "key = value" per line (keys above, values >= 0, any strtod number),
 * '#' starts a comment. Keys left out keep their defaults. `make calibrate` writes
 * build/ddp_model.conf; DDP_MODEL=path makes the library read it at init (rank 0's numbers are
 * broadcast, so every rank picks the same algorithm).
 */
#if defined(DDP_IMPLEMENTATION) && !defined(DDP_MODEL_IMPLEMENTATION)
#define DDP_MODEL_IMPLEMENTATION
#endif
#if defined(DDP_MODEL_IMPLEMENTATION) && !defined(DDP_BASE_IMPLEMENTATION)
#define DDP_BASE_IMPLEMENTATION
#endif
#include "ddp_base.h"

#ifndef DDP_MODEL_H_INCLUDED
#define DDP_MODEL_H_INCLUDED

#ifdef __cplusplus
extern "C" {
#endif

/* The all-reduce algorithms the model knows; the values index times[] and the allowed mask. */
typedef enum {
    _DDP_AR_RING,        /* flat ring over all ranks in rank order: reduce-scatter then all-gather, 2(p-1) steps of n/p bytes, segments pipelined */
    _DDP_AR_RD,          /* recursive doubling: log2 steps exchanging the whole buffer (extra ranks of a non-power-of-two world fold in first and get the result back: 2 more messages of n); only allowed when n <= the scratch */
    _DDP_AR_RAB,         /* Rabenseifner: recursive-halving reduce-scatter then recursive-doubling all-gather (same folding of extra ranks as rd) */
    _DDP_AR_HIER_RING,   /* hierarchical: reduce-scatter inside each host, all-reduce of each slice across hosts with a ring, all-gather inside each host */
    _DDP_AR_HIER_RD,     /* same, the across-hosts part by recursive doubling */
    _DDP_AR_HIER_RAB,    /* same, the across-hosts part by Rabenseifner */
    _DDP_AR_NUM
} _ddp_ar_algo_t;

typedef struct {
    int nranks;                /* p */
    int nhosts;                /* H >= 1 */
    int local_min, local_max;  /* ranks per host: fewest and most over the hosts */
} _ddp_layout_t;

enum { _DDP_LINK_LOCAL = 0, _DDP_LINK_NET = 1 };
/* Plain data: the communicator broadcasts rank 0's copy byte for byte. */
typedef struct {
    double alpha_us[2];   /* latency per message: [LOCAL] shared-memory point-to-point on one host, [NET] across hosts (TCP) */
    double beta_ns[2];    /* ns per byte of one point-to-point stream */
    double nic_ns;        /* ns per byte through one host's network link, shared by all of that host's concurrent streams; 0 = no shared limit */
    double gamma_ns;      /* ns per byte to reduce (elementwise sum, read two write one) */
    char source[256];     /* "built-in defaults (...)" or the path it was loaded from */
} _ddp_model_t;

#ifdef __cplusplus
}
#endif
#endif /* DDP_MODEL_H_INCLUDED */

/* ============================================================================================
 * IMPLEMENTATION
 * ========================================================================================== */
#if defined(DDP_MODEL_IMPLEMENTATION) && !defined(DDP_MODEL_IMPL_INCLUDED)
#define DDP_MODEL_IMPL_INCLUDED
#ifndef DDP_BASE_IMPL_INCLUDED
#error "libddp: ddp_model.h's implementation needs ddp_base.h's (define DDP_IMPLEMENTATION)"
#endif
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Measured by `make calibrate` on the development machine (see the top of this file). */
#define _DDP_MODEL_ALPHA_LOCAL_US 3.4   /* runs gave 2.6 .. 4.6 (a shared VM) */
#define _DDP_MODEL_BETA_LOCAL_NS 0.13   /* 7.7 GB/s; runs gave 0.09 .. 0.16 */
#define _DDP_MODEL_GAMMA_NS 0.10        /* 10 GB/s of operand; runs gave 0.076 .. 0.14 */
/* Assumed: 10 GbE through one switch. */
#define _DDP_MODEL_ALPHA_NET_US 25.0
#define _DDP_MODEL_BETA_NET_NS 0.8
#define _DDP_MODEL_NIC_NS 0.8

/* Predicted times this close to the best count as ties (to the lower enum value), so that the
 * hierarchical algorithms never win over the flat ones by rounding where they are the same. */
#define _DDP_MODEL_TIE 1e-9

static const char *const _ddp_ar_algo_names[_DDP_AR_NUM] = {
    "ring", "rd", "rabenseifner", "hier_ring", "hier_rd", "hier_rabenseifner"};

_DDP_PRIVATE const char *_ddp_ar_algo_name(int a) {
    return a >= 0 && a < _DDP_AR_NUM ? _ddp_ar_algo_names[a] : "?";
}

_DDP_PRIVATE int _ddp_ar_algo_parse(const char *s) {
    int a;
    if (!s) return -1;
    if (!strcmp(s, "recursive_doubling")) return _DDP_AR_RD;
    for (a = 0; a < _DDP_AR_NUM; a++)
        if (!strcmp(s, _ddp_ar_algo_names[a])) return a;
    return -1;
}

_DDP_PRIVATE void _ddp_model_defaults(_ddp_model_t *m) {
    memset(m, 0, sizeof *m);
    m->alpha_us[_DDP_LINK_LOCAL] = _DDP_MODEL_ALPHA_LOCAL_US;
    m->beta_ns[_DDP_LINK_LOCAL] = _DDP_MODEL_BETA_LOCAL_NS;
    m->alpha_us[_DDP_LINK_NET] = _DDP_MODEL_ALPHA_NET_US;
    m->beta_ns[_DDP_LINK_NET] = _DDP_MODEL_BETA_NET_NS;
    m->nic_ns = _DDP_MODEL_NIC_NS;
    m->gamma_ns = _DDP_MODEL_GAMMA_NS;
    _ddp_strlcpy(m->source, "built-in defaults (local: shm measured on a 2-core AMD EPYC VM; "
                 "net: 10 GbE assumed)", sizeof m->source);
}

/* ---------------------------------------------------------------- the file */
/* The file's keys, in the order save writes them, and where each lives in the struct. */
#define _DDP_MODEL_NKEYS 6
static const char *const _ddp_model_keys[_DDP_MODEL_NKEYS] = {
    "alpha_local_us", "beta_local_ns", "alpha_net_us", "beta_net_ns", "nic_ns", "gamma_ns"};

_DDP_PRIVATE double *_ddp_model_field(_ddp_model_t *m, int key) {
    switch (key) {
    case 0: return &m->alpha_us[_DDP_LINK_LOCAL];
    case 1: return &m->beta_ns[_DDP_LINK_LOCAL];
    case 2: return &m->alpha_us[_DDP_LINK_NET];
    case 3: return &m->beta_ns[_DDP_LINK_NET];
    case 4: return &m->nic_ns;
    default: return &m->gamma_ns;
    }
}

_DDP_PRIVATE char *_ddp_model_trim(char *s) {
    char *e;
    while (*s == ' ' || *s == '\t') s++;
    e = s + strlen(s);
    while (e > s && (e[-1] == ' ' || e[-1] == '\t' || e[-1] == '\r' || e[-1] == '\n')) *--e = 0;
    return s;
}

/* One "key = value" line (comment already cut) into m; NULL, or what is wrong with it. */
_DDP_PRIVATE const char *_ddp_model_parse_line(_ddp_model_t *m, char *line, char *bad, size_t cap) {
    char *eq = strchr(line, '='), *key, *val, *end;
    double v;
    int k;
    if (!eq) return "expected key = value";
    *eq = 0;
    key = _ddp_model_trim(line);
    val = _ddp_model_trim(eq + 1);
    for (k = 0; k < _DDP_MODEL_NKEYS; k++)
        if (!strcmp(key, _ddp_model_keys[k])) break;
    if (k == _DDP_MODEL_NKEYS) {
        snprintf(bad, cap, "unknown key '%.64s' (expected alpha_local_us, alpha_net_us, "
                 "beta_local_ns, beta_net_ns, nic_ns or gamma_ns)", key);
        return bad;
    }
    v = strtod(val, &end);
    /* v != v is NaN; DBL_MAX bounds out infinity: costs are finite. */
    if (!*val || *end || v != v || v > DBL_MAX) {
        snprintf(bad, cap, "%s: '%.64s' is not a number", key, val);
        return bad;
    }
    if (v < 0) {
        snprintf(bad, cap, "%s: %g is negative", key, v);
        return bad;
    }
    *_ddp_model_field(m, k) = v;
    return NULL;
}

/* m is changed only when the whole file is good. */
_DDP_PRIVATE int _ddp_model_load(_ddp_model_t *m, const char *path, char *err, size_t cap) {
    _ddp_model_t t = *m;
    char line[512], bad[200];
    int lineno = 0;
    FILE *f = fopen(path, "r");
    if (!f) {
        snprintf(err, cap, "%s: cannot open: %s", path, strerror(errno));
        return -1;
    }
    while (fgets(line, sizeof line, f)) {
        char *hash, *s;
        const char *why;
        lineno++;
        if (!strchr(line, '\n') && !feof(f)) {
            snprintf(err, cap, "%s:%d: line longer than %d characters", path, lineno, (int)sizeof line - 2);
            fclose(f);
            return -1;
        }
        if ((hash = strchr(line, '#')) != NULL) *hash = 0;
        s = _ddp_model_trim(line);
        if (!*s) continue;
        if ((why = _ddp_model_parse_line(&t, s, bad, sizeof bad)) != NULL) {
            snprintf(err, cap, "%s:%d: %s", path, lineno, why);
            fclose(f);
            return -1;
        }
    }
    if (ferror(f)) {
        snprintf(err, cap, "%s: read error after line %d", path, lineno);
        fclose(f);
        return -1;
    }
    fclose(f);
    _ddp_strlcpy(t.source, path, sizeof t.source);
    *m = t;
    return 0;
}

/* The shortest %g that reads back as the same double, so a saved file loads bit for bit. */
_DDP_PRIVATE void _ddp_model_fmt(char *out, size_t cap, double v) {
    int prec;
    for (prec = 6; prec < 17; prec++) {
        snprintf(out, cap, "%.*g", prec, v);
        if (strtod(out, NULL) == v) return;
    }
    snprintf(out, cap, "%.17g", v);
}

/* comment (may be NULL, may hold several lines) goes first, each line as a '#' comment. */
_DDP_PRIVATE int _ddp_model_save(const _ddp_model_t *m, const char *path, const char *comment,
                                 char *err, size_t cap) {
    _ddp_model_t t = *m;
    char num[40];
    int k, bad;
    FILE *f = fopen(path, "w");
    if (!f) {
        snprintf(err, cap, "%s: cannot create: %s", path, strerror(errno));
        return -1;
    }
    fprintf(f, "# libddp all-reduce cost model (ddp_model.h); DDP_MODEL=%s selects it\n", path);
    while (comment && *comment) {
        size_t len = strcspn(comment, "\n");
        fprintf(f, "# %.*s\n", (int)len, comment);
        comment += len;
        if (*comment == '\n') comment++;
    }
    for (k = 0; k < _DDP_MODEL_NKEYS; k++) {
        _ddp_model_fmt(num, sizeof num, *_ddp_model_field(&t, k));
        fprintf(f, "%s = %s\n", _ddp_model_keys[k], num);
    }
    bad = ferror(f);
    if (fclose(f) != 0 || bad) {
        snprintf(err, cap, "%s: write error: %s", path, strerror(errno));
        return -1;
    }
    return 0;
}

/* ---------------------------------------------------------------- the formulas
 * Every time below is in microseconds; all of the model's arithmetic is in this section. */

/* One message of `bytes` on a link; on the network `streams` of this host's streams share its
 * link at once. overlap: the receiver reduces each segment while the next ones arrive (the
 * ring's window), so the slower of moving and reducing a byte paces the step. */
_DDP_PRIVATE double _ddp_model_msg(const _ddp_model_t *m, int link, double bytes, double streams,
                                   int overlap) {
    double per = m->beta_ns[link];
    if (link == _DDP_LINK_NET && streams * m->nic_ns > per) per = streams * m->nic_ns;
    if (overlap && m->gamma_ns > per) per = m->gamma_ns;
    return m->alpha_us[link] + bytes * per * 1e-3;
}

/* A step in which every rank sends `bytes` to a partner: local when no pair crosses hosts, else
 * paced by the slower of a local pair and a network pair. */
_DDP_PRIVATE double _ddp_model_step(const _ddp_model_t *m, int crosses, int any_local, double bytes,
                                    double streams, int overlap) {
    double loc = _ddp_model_msg(m, _DDP_LINK_LOCAL, bytes, 1, overlap), net;
    if (!crosses) return loc;
    net = _ddp_model_msg(m, _DDP_LINK_NET, bytes, streams, overlap);
    return any_local && loc > net ? loc : net;
}

/* Ring reduce-scatter then all-gather, `steps` of each, `bytes` per step. The reduce-scatter's
 * reductions hide behind its transfers (segments in flight, ddp_ring.h), the all-gather has
 * none. Both the flat ring and the inside-host parts of hier_* come here, so that hier_* over
 * one host is the ring to the last bit. */
_DDP_PRIVATE double _ddp_model_ring_steps(const _ddp_model_t *m, int crosses, int any_local,
                                          double bytes, double streams, int steps) {
    double rs = _ddp_model_step(m, crosses, any_local, bytes, streams, 1);
    double ag = _ddp_model_step(m, crosses, any_local, bytes, streams, 0);
    return steps * rs + steps * ag;
}

_DDP_PRIVATE double _ddp_model_reduce(const _ddp_model_t *m, double bytes) {
    return bytes * m->gamma_ns * 1e-3;
}

/* The ranks one flat algorithm runs over: g->nranks of them on g->nhosts hosts, and `groups`
 * such algorithms running at once on the same hosts (hier_*: L), each host's link shared by
 * all of them. */
typedef struct {
    const _ddp_layout_t *g;
    int groups;
} _ddp_model_grp_t;

/* Does the recursive step with partners r ^ mask cross hosts, and how many of a host's streams
 * share its link then (see the top of this file). */
_DDP_PRIVATE int _ddp_model_mask_crosses(const _ddp_layout_t *g, int mask) {
    int l = g->local_min;
    if (g->nhosts <= 1) return 0;
    return !(l == g->local_max && (l & (l - 1)) == 0 && mask < l);
}
_DDP_PRIVATE double _ddp_model_mask_streams(const _ddp_model_grp_t *s, int mask) {
    double k = 2.0 * mask < s->g->local_max ? 2.0 * mask : s->g->local_max;
    return k * s->groups;
}

/* Folding a non-power-of-two world onto p' ranks and handing the result back. */
_DDP_PRIVATE double _ddp_model_fold(const _ddp_model_t *m, const _ddp_model_grp_t *s, double n,
                                    int p2) {
    int extra = s->g->nranks - p2;
    double k;
    if (extra <= 0) return 0;
    k = (extra < s->g->local_max ? extra : s->g->local_max) * (double)s->groups;
    return 2 * _ddp_model_step(m, s->g->nhosts > 1, s->g->local_max > 1, n, k, 0) + _ddp_model_reduce(m, n);
}

_DDP_PRIVATE int _ddp_model_pow2_floor(int p) {
    int p2 = 1;
    while (p2 <= p / 2) p2 *= 2;
    return p2;
}

_DDP_PRIVATE double _ddp_model_ring(const _ddp_model_t *m, const _ddp_model_grp_t *s, double n) {
    int q = s->g->nranks;
    if (q <= 1) return 0;
    return _ddp_model_ring_steps(m, s->g->nhosts > 1, s->g->local_max > 1, n / q, (double)s->groups, q - 1);
}

_DDP_PRIVATE double _ddp_model_rd(const _ddp_model_t *m, const _ddp_model_grp_t *s, double n) {
    int p2 = _ddp_model_pow2_floor(s->g->nranks), mask;
    double t;
    if (s->g->nranks <= 1) return 0;
    t = _ddp_model_fold(m, s, n, p2);
    for (mask = 1; mask < p2; mask <<= 1)
        t += _ddp_model_step(m, _ddp_model_mask_crosses(s->g, mask), s->g->local_max > 1, n,
                             _ddp_model_mask_streams(s, mask), 0) + _ddp_model_reduce(m, n);
    return t;
}

_DDP_PRIVATE double _ddp_model_rab(const _ddp_model_t *m, const _ddp_model_grp_t *s, double n) {
    int p2 = _ddp_model_pow2_floor(s->g->nranks), k = 0, i;
    double t, piece = n;
    if (s->g->nranks <= 1) return 0;
    while ((1 << k) < p2) k++;
    t = _ddp_model_fold(m, s, n, p2);
    /* Halving step i (1..k) exchanges and reduces n/2^i; the doubling step that undoes it sends
     * the same n/2^i with the same partner, so each pair of steps is counted together. */
    for (i = 1; i <= k; i++) {
#ifdef _DDP_MODEL_RAB_FAR_FIRST
        int mask = p2 >> i;
#else
        int mask = 1 << (i - 1);
#endif
        double step;
        piece /= 2;
        step = _ddp_model_step(m, _ddp_model_mask_crosses(s->g, mask), s->g->local_max > 1, piece,
                               _ddp_model_mask_streams(s, mask), 0);
        t += 2 * step + _ddp_model_reduce(m, piece);
    }
    return t;
}

/* The flat algorithm X (ring, rd or rabenseifner) over s. */
_DDP_PRIVATE double _ddp_model_flat(const _ddp_model_t *m, int x, const _ddp_model_grp_t *s, double n) {
    return x == _DDP_AR_RING ? _ddp_model_ring(m, s, n)
         : x == _DDP_AR_RD ? _ddp_model_rd(m, s, n) : _ddp_model_rab(m, s, n);
}

_DDP_PRIVATE int _ddp_model_layout_ok(const _ddp_layout_t *l) {
    return l && l->nranks >= 1 && l->nhosts >= 1 && l->local_min >= 1 && l->local_min <= l->local_max &&
           (double)l->local_min * l->nhosts <= l->nranks && (double)l->local_max * l->nhosts >= l->nranks;
}

_DDP_PRIVATE double _ddp_model_ar_us(const _ddp_model_t *m, int algo, double bytes, const _ddp_layout_t *l) {
    _ddp_model_grp_t s;
    if (!m || algo < 0 || algo >= _DDP_AR_NUM || !_ddp_model_layout_ok(l) || !(bytes >= 0)) return HUGE_VAL;
    if (l->nranks == 1) return 0;
    if (algo < _DDP_AR_HIER_RING) {
        s.g = l;
        s.groups = 1;
        return _ddp_model_flat(m, algo, &s, bytes);
    } else {
        /* Inside each host a ring over Lmax ranks moving n/L slices (reduce-scatter, then
         * all-gather); across hosts L all-reduces of n/L at once, one rank per host each. */
        int L = l->local_min, lmax = l->local_max;
        double slice = bytes / L;
        double t = lmax > 1 ? _ddp_model_ring_steps(m, 0, 1, slice, 1, lmax - 1) : 0;
        _ddp_layout_t across;
        if (l->nhosts > 1) {
            across.nranks = l->nhosts;
            across.nhosts = l->nhosts;
            across.local_min = across.local_max = 1;
            s.g = &across;
            s.groups = L;
            t += _ddp_model_flat(m, algo - _DDP_AR_HIER_RING, &s, slice);
        }
        return t;
    }
}

_DDP_PRIVATE int _ddp_model_ar_pick(const _ddp_model_t *m, double bytes, const _ddp_layout_t *l,
                                    unsigned allowed, double *times) {
    double t[_DDP_AR_NUM], best = HUGE_VAL;
    int a, pick = -1;
    for (a = 0; a < _DDP_AR_NUM; a++) {
        t[a] = _ddp_model_ar_us(m, a, bytes, l);
        if (times) times[a] = t[a];
        if ((allowed & (1u << a)) && t[a] < best) best = t[a];
    }
    for (a = 0; a < _DDP_AR_NUM && pick < 0; a++)
        if ((allowed & (1u << a)) && t[a] <= best * (1 + _DDP_MODEL_TIE)) pick = a;
    /* Nothing allowed can run: the ring always can, whatever the layout says. */
    return pick < 0 ? _DDP_AR_RING : pick;
}

#endif /* DDP_MODEL_IMPLEMENTATION */
