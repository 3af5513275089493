/* SPDX-License-Identifier: MIT (see LICENSE) */
/* transports/ddp_ibverbs.h — libddp's RDMA transport on libibverbs (InfiniBand, RoCE).
 *
 * In the file that defines DDP_IMPLEMENTATION this compiles the transport and registers it
 * ("ibverbs", priority 15: above tcp (10), below shm (20), so with the default
 * DDP_TRANSPORT=auto ranks on other hosts are reached by RDMA and same-host ranks still by
 * shared memory when ddp_shm.h is included). Needs <infiniband/verbs.h> (Debian: libibverbs-dev)
 * and linking with -libverbs:
 *
 *     #define DDP_IMPLEMENTATION
 *     #include "ddp.h"
 *     #include "transports/ddp_tcp.h"
 *     #include "transports/ddp_ibverbs.h"     // cc ... -libverbs
 *
 * or define DDP_IBV_DLOPEN (implementation file only) to load libibverbs.so.1 at run time
 * instead, as NCCL does: one binary then runs on hosts with and without RDMA (glibc < 2.34 also
 * needs -ldl). Without a library, a device or an active port, init fails with a clear message:
 * DDP_TRANSPORT=ibverbs then fails, auto goes on with the other transports (the communicator
 * logs the fallback). It sees its communicator only through the ddp_transport_ctx_t given to
 * init (transports/ddp_transport.h).
 *
 * ENVIRONMENT
 *   DDP_IB_HCA          NCCL's syntax: "mlx5_0:1,mlx5_1" (name prefixes, optional :port),
 *                       "=mlx5_0" (exact names), "^mlx5_1" (exclude). Default: the first device
 *                       with an active port.
 *   DDP_IB_GID_INDEX    GID table index (RoCE). Default: the first RoCE v2 GID, IPv4-mapped
 *                       preferred (sysfs gid_attrs/types), else index 0. InfiniBand: LID routing
 *                       unless this is set.
 *   DDP_IB_TIMEOUT      QP local ACK timeout exponent: 4.096 us x 2^v per try (default 15 =
 *                       134 ms; NCCL_IB_TIMEOUT's meaning, whose default 18 suits large fabrics)
 *   DDP_IB_RETRY_CNT    transport retries before a QP errors out (default 6; 7 is the IB maximum,
 *                       but soft-RoCE (rxe) takes 7 as "retry forever" and would never fail)
 *   DDP_IB_KEEPALIVE_MS a waiting rank probes a silent peer this often (default 1000)
 *   DDP_IB_TC, DDP_IB_SL  traffic class / service level (default 0)
 *
 * DESIGN (per peer pair: one RC queue pair, one CQ on the communicator's completion channel)
 *   Bootstrap through the rendezvous store, no rdma_cm: each rank publishes its port (LID, GID,
 *   MTU, link layer), then per pair its QP number, a random PSN and the address + rkey of its
 *   control inbox; both sides move the QP INIT -> RTR -> RTS and publish "ready" (a write that
 *   reaches a peer still in INIT would be dropped and retried, or fail).
 *   Receiver-driven flow control, as NCCL's net_ib: posting irecv #n writes a clear-to-send
 *   (CTS: address, rkey, length, tag) into the sender's inbox slot n with RDMA WRITE WITH
 *   IMMEDIATE; the CTS is the credit. isend #n waits for CTS #n, checks tag and length (else
 *   DDP_ERR_MISMATCH on both sides: the sender NACKs with its own tag and length), then RDMA
 *   WRITEs the payload straight into the receiver's buffer, in chunks of >= 1 MiB (at most 4 per
 *   message, posted as the send queue allows), the last one WITH IMMEDIATE (RC executes writes in
 *   order, so its completion at the receiver means the whole message is there).
 *   Payload paths by size: <= the QP's max inline data (typically 64-256 B) inline from the
 *   user's buffer; <= 16 KiB through per-request bounce slots (one copy each side, no
 *   registration); larger: zero copy, both user buffers registered through a cache.
 *   Registration cache: an entry covers the whole anonymous mapping around a buffer (malloc's
 *   mmap'ed chunks: one registration per buffer) or the buffer's pages (heap, stack, files).
 *   The cached range is also mlock()ed: that is what makes a stale entry detectable. A freed and
 *   re-allocated buffer at the same address is a new, unlocked mapping, and madvise(MADV_COLD)
 *   on one page, which the kernel refuses (EINVAL) only on locked mappings and which changes
 *   nothing that matters otherwise, tells the two apart on every use (one syscall per
 *   message end). Stale entries are deregistered and the buffer registered afresh. Limits: a
 *   program that mlock()s its own buffers (mlockall(MCL_FUTURE)), or two communicators of one
 *   process registering the same recycled buffer (each cache locks it), defeat the check: use
 *   DDP_IB_REG_CACHE=0 there; when mlock fails (RLIMIT_MEMLOCK) registrations are per message.
 *   Completions: test() polls the CQ; wait() arms the CQs and sleeps in poll() on the completion
 *   channel (the blocking half of spin-then-block).
 *   Failures: a failed work completion fails the connection with DDP_ERR_REMOTE (retry exceeded,
 *   remote access/operation errors: the peer is gone or misbehaved) or DDP_ERR_SYSTEM (local
 *   errors), naming the peer and ibv_wc_status_str(). close() sends a BYE (a zero-length write
 *   with immediate) so survivors of a failed collective learn at once, as with TCP's EOF. A
 *   crashed peer sends nothing and RC only notices on a send: a rank that waits longer than
 *   DDP_IB_KEEPALIVE_MS on a silent peer writes zero bytes to it; a dead process's QP is gone,
 *   the write is retried DDP_IB_RETRY_CNT times with the DDP_IB_TIMEOUT ACK timeout and fails
 *   (defaults: 1 s + 7 x 134 ms, about 2 s). A stopped but live process still ACKs (the HCA or
 *   kernel does), so it ends in the communicator's DDP_ERR_TIMEOUT, as with TCP.
 *
 * DEBUG: ddp_ibverbs_stats() returns process-wide counters (registrations, cache hits, stale
 * entries, bounce/inline/zero-copy messages, keepalive probes); DDP_DEBUG=TRACE logs every
 * registration and every stale entry.
 */
#if defined(DDP_IMPLEMENTATION) && !defined(DDP_IBVERBS_IMPLEMENTATION)
#define DDP_IBVERBS_IMPLEMENTATION
#endif
#if defined(DDP_IBVERBS_IMPLEMENTATION)
#ifndef DDP_TRANSPORT_IMPLEMENTATION
#define DDP_TRANSPORT_IMPLEMENTATION
#endif
#ifndef DDP_SOCKET_IMPLEMENTATION
#define DDP_SOCKET_IMPLEMENTATION
#endif
#endif
#include "ddp_transport.h"
#include "../ddp_socket.h"

#ifndef DDP_IBVERBS_H_INCLUDED
#define DDP_IBVERBS_H_INCLUDED
#ifdef __cplusplus
extern "C" {
#endif
typedef struct ddp_ibverbs_stats_s {   /* not the function's name: C++ -Wshadow */
    uint64_t reg_registrations;   /* cache misses: ibv_reg_mr of a user buffer */
    uint64_t reg_hits;            /* messages served by a cached registration */
    uint64_t reg_stale;           /* cached entries found stale (buffer freed, memory remapped) */
    uint64_t reg_evictions;       /* entries dropped for room */
    uint64_t reg_uncached;        /* registrations made for one message only */
    uint64_t inline_sends, bounce_sends, bounce_recvs, zero_copy_sends, zero_copy_recvs;
    uint64_t keepalive_probes;
} ddp_ibverbs_stats_t;
DDP_API const ddp_transport_t *ddp_transport_ibverbs(void);
/* Counters summed over every communicator of the process (debugging and tests). */
DDP_API void ddp_ibverbs_stats(ddp_ibverbs_stats_t *out);
#ifdef __cplusplus
}
#endif
#endif /* DDP_IBVERBS_H_INCLUDED */

#if defined(DDP_IBVERBS_IMPLEMENTATION) && !defined(DDP_IBVERBS_IMPL_INCLUDED)
#define DDP_IBVERBS_IMPL_INCLUDED
#if !defined(DDP_TRANSPORT_IMPL_INCLUDED) || !defined(DDP_SOCKET_IMPL_INCLUDED)
#error "transports/ddp_ibverbs.h's implementation needs ddp_transport.h's and ddp_socket.h's (define DDP_IMPLEMENTATION)"
#endif

#include <infiniband/verbs.h>
#include <arpa/inet.h>
#include <sys/mman.h>
#ifdef DDP_IBV_DLOPEN
#include <dlfcn.h>
#endif

#ifndef MADV_COLD
#define MADV_COLD 20
#endif

#define _DDP_IB_MAGIC 0x44444942u      /* "DDIB" */
#define _DDP_IB_VERSION 1u
#define _DDP_IB_POOL 32                /* requests per connection, as tcp */
#define _DDP_IB_SLOTS 64               /* CTS inbox slots (>= _DDP_IB_POOL: see the CTS comment) */
#define _DDP_IB_SQ 256
#define _DDP_IB_RQ 128                 /* >= 2 x _DDP_IB_POOL: CTS + DATA in flight at most */
#define _DDP_IB_BOUNCE (16u << 10)
#define _DDP_IB_CHUNK (1u << 20)
#define _DDP_IB_MAX_CHUNKS 4
#define _DDP_IB_REGS 64                /* registration cache entries per communicator */
#define _DDP_IB_REG_VMA_MAX ((size_t)1 << 30)
/* Immediate data: kind in the top 2 bits, the message sequence number below. */
#define _DDP_IB_CTS 0u
#define _DDP_IB_DATA 1u
#define _DDP_IB_NACK 2u
#define _DDP_IB_BYE 3u
#define _DDP_IB_SEQ_MASK 0x3fffffffu
/* wr_id of work requests that are not a message's last data write */
#define _DDP_IB_WR_CTL 0u
#define _DDP_IB_WR_PROBE 1u
#define _DDP_IB_WR_BYE 2u
#define _DDP_IB_WR_RECV 3u

/* ---------------------------------------------------------------- the library, linked or loaded */
typedef struct {
    struct ibv_device **(*get_device_list)(int *);
    void (*free_device_list)(struct ibv_device **);
    const char *(*get_device_name)(struct ibv_device *);
    struct ibv_context *(*open_device)(struct ibv_device *);
    int (*close_device)(struct ibv_context *);
    int (*query_device)(struct ibv_context *, struct ibv_device_attr *);
    /* The exported symbol fills the leading (compat) part of ibv_port_attr. */
    int (*query_port)(struct ibv_context *, uint8_t, struct _compat_ibv_port_attr *);
    int (*query_gid)(struct ibv_context *, uint8_t, int, union ibv_gid *);
    struct ibv_pd *(*alloc_pd)(struct ibv_context *);
    int (*dealloc_pd)(struct ibv_pd *);
    struct ibv_mr *(*reg_mr)(struct ibv_pd *, void *, size_t, int);
    int (*dereg_mr)(struct ibv_mr *);
    struct ibv_comp_channel *(*create_comp_channel)(struct ibv_context *);
    int (*destroy_comp_channel)(struct ibv_comp_channel *);
    struct ibv_cq *(*create_cq)(struct ibv_context *, int, void *, struct ibv_comp_channel *, int);
    int (*destroy_cq)(struct ibv_cq *);
    struct ibv_qp *(*create_qp)(struct ibv_pd *, struct ibv_qp_init_attr *);
    int (*modify_qp)(struct ibv_qp *, struct ibv_qp_attr *, int);
    int (*destroy_qp)(struct ibv_qp *);
    int (*get_cq_event)(struct ibv_comp_channel *, struct ibv_cq **, void **);
    void (*ack_cq_events)(struct ibv_cq *, unsigned int);
    const char *(*wc_status_str)(enum ibv_wc_status);
} _ddp_ibv_api_t;

/* Filled once per process, read-only afterwards. ibv_post_send/recv, ibv_poll_cq and
 * ibv_req_notify_cq are inline calls through the context's ops: no symbol needed. */
static _ddp_ibv_api_t _ddp_ibv;
static char _ddp_ibv_load_error[256];
static pthread_once_t _ddp_ibv_once = PTHREAD_ONCE_INIT;

_DDP_PRIVATE void _ddp_ibv_load(void) {
#ifdef DDP_IBV_DLOPEN
    static const char *const names[] = {
        "ibv_get_device_list", "ibv_free_device_list", "ibv_get_device_name", "ibv_open_device",
        "ibv_close_device", "ibv_query_device", "ibv_query_port", "ibv_query_gid", "ibv_alloc_pd",
        "ibv_dealloc_pd", "ibv_reg_mr", "ibv_dereg_mr", "ibv_create_comp_channel",
        "ibv_destroy_comp_channel", "ibv_create_cq", "ibv_destroy_cq", "ibv_create_qp",
        "ibv_modify_qp", "ibv_destroy_qp", "ibv_get_cq_event", "ibv_ack_cq_events",
        "ibv_wc_status_str"};
    void *h = dlopen("libibverbs.so.1", RTLD_NOW | RTLD_LOCAL);
    _ddp_ibv_api_t api;
    size_t i;
    if (!h) {
        const char *e = dlerror();
        snprintf(_ddp_ibv_load_error, sizeof _ddp_ibv_load_error, "cannot load libibverbs.so.1 "
                 "(%s; Debian: apt-get install libibverbs1 ibverbs-providers)", e ? e : "?");
        return;
    }
    /* The table is the symbols in this order: copy each pointer (ISO C has no cast between
     * object and function pointers; POSIX guarantees dlsym's result works as one). */
    for (i = 0; i < sizeof names / sizeof names[0]; i++) {
        void *sym = dlsym(h, names[i]);
        if (!sym) {
            snprintf(_ddp_ibv_load_error, sizeof _ddp_ibv_load_error, "libibverbs.so.1 lacks %s",
                     names[i]);
            return;
        }
        memcpy((char *)&api + i * sizeof(void (*)(void)), &sym, sizeof sym);
    }
    _ddp_ibv = api;
#else
    _ddp_ibv.get_device_list = ibv_get_device_list;
    _ddp_ibv.free_device_list = ibv_free_device_list;
    _ddp_ibv.get_device_name = ibv_get_device_name;
    _ddp_ibv.open_device = ibv_open_device;
    _ddp_ibv.close_device = ibv_close_device;
    _ddp_ibv.query_device = ibv_query_device;
    _ddp_ibv.query_port = ibv_query_port;      /* no parentheses: the symbol, not the macro */
    _ddp_ibv.query_gid = ibv_query_gid;
    _ddp_ibv.alloc_pd = ibv_alloc_pd;
    _ddp_ibv.dealloc_pd = ibv_dealloc_pd;
    _ddp_ibv.reg_mr = ibv_reg_mr;
    _ddp_ibv.dereg_mr = ibv_dereg_mr;
    _ddp_ibv.create_comp_channel = ibv_create_comp_channel;
    _ddp_ibv.destroy_comp_channel = ibv_destroy_comp_channel;
    _ddp_ibv.create_cq = ibv_create_cq;
    _ddp_ibv.destroy_cq = ibv_destroy_cq;
    _ddp_ibv.create_qp = ibv_create_qp;
    _ddp_ibv.modify_qp = ibv_modify_qp;
    _ddp_ibv.destroy_qp = ibv_destroy_qp;
    _ddp_ibv.get_cq_event = ibv_get_cq_event;
    _ddp_ibv.ack_cq_events = ibv_ack_cq_events;
    _ddp_ibv.wc_status_str = ibv_wc_status_str;
#endif
}

/* ---------------------------------------------------------------- debug counters */
static uint64_t _ddp_ib_stats[11];
enum { _DDP_IBS_REG, _DDP_IBS_HIT, _DDP_IBS_STALE, _DDP_IBS_EVICT, _DDP_IBS_UNCACHED,
       _DDP_IBS_INLINE, _DDP_IBS_BSEND, _DDP_IBS_BRECV, _DDP_IBS_ZSEND, _DDP_IBS_ZRECV, _DDP_IBS_PROBE };
static inline void _ddp_ib_count(int which) { __atomic_fetch_add(&_ddp_ib_stats[which], 1, __ATOMIC_RELAXED); }

DDP_API void ddp_ibverbs_stats(ddp_ibverbs_stats_t *out) {
    uint64_t v[11];
    int i;
    if (!out) return;
    for (i = 0; i < 11; i++) v[i] = __atomic_load_n(&_ddp_ib_stats[i], __ATOMIC_RELAXED);
    out->reg_registrations = v[_DDP_IBS_REG];
    out->reg_hits = v[_DDP_IBS_HIT];
    out->reg_stale = v[_DDP_IBS_STALE];
    out->reg_evictions = v[_DDP_IBS_EVICT];
    out->reg_uncached = v[_DDP_IBS_UNCACHED];
    out->inline_sends = v[_DDP_IBS_INLINE];
    out->bounce_sends = v[_DDP_IBS_BSEND];
    out->bounce_recvs = v[_DDP_IBS_BRECV];
    out->zero_copy_sends = v[_DDP_IBS_ZSEND];
    out->zero_copy_recvs = v[_DDP_IBS_ZRECV];
    out->keepalive_probes = v[_DDP_IBS_PROBE];
}

/* ---------------------------------------------------------------- structures */
typedef struct {              /* published once per rank: "addr/ibverbs/<rank>" */
    uint32_t magic, version, avail, link_layer, mtu, lid, use_gid, pad;
    uint8_t gid[16];
    char dev[64];             /* or, when avail == 0, why not */
} _ddp_ib_info_t;

typedef struct {              /* published per pair: "addr/ibverbs.qp<peer>/<rank>" */
    uint32_t magic, qpn, psn, rkey;
    uint64_t inbox;
} _ddp_ib_qpinfo_t;

typedef struct {              /* a clear-to-send (or, in the NACK slot, the sender's message) */
    uint64_t addr, len, tag;
    uint32_t rkey, seq;
} _ddp_ib_cts_t;

typedef struct {              /* a cached registration */
    uintptr_t lo, hi;
    struct ibv_mr *mr;
    int refs, writable, dead;
    uint64_t used;
} _ddp_ib_reg_t;

typedef struct {
    _ddp_transport_req_t h;   /* h.done: a send's payload bytes whose writes are posted */
    uint32_t seq;
    int idx, bounce, inl;
    _ddp_ib_reg_t *reg;       /* cached registration in use, or */
    struct ibv_mr *own_mr;    /* one made for this message (deregistered when done), or */
    struct ibv_mr *user_mr;   /* the caller's (reg_mr) */
} _ddp_ib_req_t;
#define _DDP_IB_NEXT(q) ((_ddp_ib_req_t *)(void *)(q)->h.next)

typedef struct _ddp_ib_conn {
    _ddp_transport_conn_t h;  /* peer, sticky failure, free list: the shared isend/irecv/test */
    struct _ddp_ib *st;
    struct ibv_cq *cq;
    struct ibv_qp *qp;
    unsigned char *mem;       /* inbox, outbox, bounce slots: one mapping, one MR */
    size_t mem_len;
    struct ibv_mr *mr;
    _ddp_ib_cts_t *inbox, *outbox;   /* _DDP_IB_SLOTS + 1 (the NACK slot) each */
    unsigned char *bounce;           /* _DDP_IB_POOL x _DDP_IB_BOUNCE */
    uint64_t peer_inbox;
    uint32_t peer_rkey, psn;
    uint32_t send_seq, recv_seq;     /* next sequence numbers to give out */
    uint32_t cts_got, data_got;      /* CTS / DATA immediates received, in order */
    uint32_t cts_sent;               /* CTS written so far */
    _ddp_ib_req_t *sq, *sq_tail, *spost;  /* sends not complete; first not fully posted */
    _ddp_ib_req_t *rq, *rq_tail;          /* receives not complete (CTS posted in order) */
    int sq_room, max_inline, stage, probe_out;
    int sig[_DDP_IB_SQ];             /* WRs retired by each signaled WR, in posting order */
    int sig_head, sig_tail;
    unsigned events;                 /* completion events not yet acknowledged */
    int64_t last_rx_us, bye_us;       /* bye_us: when the peer's goodbye came (0: not yet) */
    _ddp_ib_req_t pool[_DDP_IB_POOL];
} _ddp_ib_conn_t;

typedef struct _ddp_ib {
    const ddp_transport_ctx_t *ctx;
    int nranks;
    struct ibv_context *vctx;
    struct ibv_pd *pd;
    struct ibv_comp_channel *ch;
    uint8_t port;
    int gid_index, timeout, retry_cnt, keepalive_ms, tc, sl, cache_on;
    _ddp_ib_info_t me;
    _ddp_ib_info_t *peers;    /* looked up by reachable() */
    char *have_peer;
    _ddp_ib_conn_t **pend;    /* connections being set up, by peer */
    _ddp_ib_reg_t regs[_DDP_IB_REGS];
    uint64_t clock;
    size_t page;
    int warned_uncached;
} _ddp_ib_t;

_DDP_PRIVATE ddp_result_t _ddp_ib_finalize(void *state);

/* ---------------------------------------------------------------- device, port, GID */
/* "RoCE v2", "IB/RoCE v1" or "" (sysfs; what NCCL reads too). */
_DDP_PRIVATE void _ddp_ib_gid_type(struct ibv_device *dev, int port, int idx, char *out, size_t cap) {
    char path[512];
    FILE *f;
    out[0] = 0;
    snprintf(path, sizeof path, "%s/ports/%d/gid_attrs/types/%d", dev->ibdev_path, port, idx);
    f = fopen(path, "r");
    if (!f) return;
    if (!fgets(out, (int)cap, f)) out[0] = 0;
    fclose(f);
    out[strcspn(out, "\n")] = 0;
}

_DDP_PRIVATE int _ddp_ib_pick_gid(_ddp_ib_t *st, struct ibv_device *dev, int tbl_len, union ibv_gid *gid) {
    static const uint8_t v4mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    int i, best = -1, best_score = 0;
    for (i = 0; i < tbl_len && i < 256; i++) {
        union ibv_gid g;
        char type[32];
        int score;
        static const uint8_t zero[16] = {0};
        if (_ddp_ibv.query_gid(st->vctx, st->port, i, &g) != 0) continue;
        if (!memcmp(g.raw, zero, 16)) continue;
        _ddp_ib_gid_type(dev, st->port, i, type, sizeof type);
        score = 1 + (strstr(type, "v2") ? 2 : 0) + (!memcmp(g.raw, v4mapped, 12) ? 1 : 0);
        if (score > best_score) { best = i; best_score = score; *gid = g; }
    }
    return best;
}

_DDP_PRIVATE ddp_result_t _ddp_ib_open(_ddp_ib_t *st) {
    const ddp_transport_ctx_t *c = st->ctx;
    const char *spec = getenv("DDP_IB_HCA"), *gi = getenv("DDP_IB_GID_INDEX");
    struct ibv_device **list;
    int n = 0, i;
    char seen[256] = "";
    size_t off = 0;
    pthread_once(&_ddp_ibv_once, _ddp_ibv_load);
    if (_ddp_ibv_load_error[0]) return ddp_transport_fail(c, DDP_ERR_UNSUPPORTED, "ibverbs: %s", _ddp_ibv_load_error);
    list = _ddp_ibv.get_device_list(&n);
    if (!list || n == 0) {
        if (list) _ddp_ibv.free_device_list(list);
        return ddp_transport_fail(c, DDP_ERR_UNSUPPORTED, "ibverbs: no RDMA device on this host "
                                  "(ibv_get_device_list: %s; no HCA driver or rdma_rxe loaded?)",
                                  list ? "none" : strerror(errno));
    }
    for (i = 0; i < n && !st->vctx; i++) {
        const char *name = _ddp_ibv.get_device_name(list[i]);
        struct ibv_context *ctx = _ddp_ibv.open_device(list[i]);
        struct ibv_device_attr da;
        int p;
        if (off + strlen(name) + 16 < sizeof seen)
            off += (size_t)snprintf(seen + off, sizeof seen - off, "%s%s", off ? ", " : "", name);
        if (!ctx) continue;
        if (_ddp_ibv.query_device(ctx, &da) != 0) { _ddp_ibv.close_device(ctx); continue; }
        for (p = 1; p <= da.phys_port_cnt; p++) {
            struct ibv_port_attr pa;
            memset(&pa, 0, sizeof pa);
            if (spec && *spec && !_ddp_transport_match_list(spec, name, p)) continue;
            if (_ddp_ibv.query_port(ctx, (uint8_t)p, (struct _compat_ibv_port_attr *)&pa) != 0) continue;
            if (pa.state != IBV_PORT_ACTIVE) {
                if (off + 24 < sizeof seen) off += (size_t)snprintf(seen + off, sizeof seen - off, " (port %d down)", p);
                continue;
            }
            st->vctx = ctx;
            st->port = (uint8_t)p;
            st->me.link_layer = pa.link_layer;
            st->me.mtu = pa.active_mtu;
            st->me.lid = pa.lid;
            if (gi) {
                long v;
                union ibv_gid g;
                if (_ddp_parse_long(gi, 0, pa.gid_tbl_len - 1, &v) != 0 ||
                    _ddp_ibv.query_gid(ctx, st->port, (int)v, &g) != 0) {
                    _ddp_ibv.free_device_list(list);
                    return ddp_transport_fail(c, DDP_ERR_INVALID_ARGUMENT, "ibverbs: DDP_IB_GID_INDEX=%s "
                                              "is not a GID index of %s port %d (0..%d)", gi, name, p,
                                              pa.gid_tbl_len - 1);
                }
                st->gid_index = (int)v;
                memcpy(st->me.gid, g.raw, 16);
                st->me.use_gid = 1;
            } else if (pa.link_layer == IBV_LINK_LAYER_ETHERNET) {
                union ibv_gid g;
                st->gid_index = _ddp_ib_pick_gid(st, list[i], pa.gid_tbl_len, &g);
                if (st->gid_index < 0) {
                    _ddp_ibv.free_device_list(list);
                    return ddp_transport_fail(c, DDP_ERR_UNSUPPORTED, "ibverbs: %s port %d (RoCE) has "
                                              "no GID (no IP address on its network device?)", name, p);
                }
                memcpy(st->me.gid, g.raw, 16);
                st->me.use_gid = 1;
            }
            snprintf(st->me.dev, sizeof st->me.dev, "%s:%d", name, p);
            break;
        }
        if (!st->vctx) _ddp_ibv.close_device(ctx);
    }
    _ddp_ibv.free_device_list(list);
    if (!st->vctx)
        return ddp_transport_fail(c, DDP_ERR_UNSUPPORTED, "ibverbs: no active port on %s%s%s", seen,
                                  spec ? " matching DDP_IB_HCA=" : "", spec ? spec : "");
    return DDP_SUCCESS;
}

/* ---------------------------------------------------------------- registration cache */
/* 1 if the page holding a is in a locked mapping (the one we locked), 0 if not (remapped). */
_DDP_PRIVATE int _ddp_ib_page_locked(_ddp_ib_t *st, uintptr_t a) {
    void *pg = (void *)(a & ~(uintptr_t)(st->page - 1));
    return madvise(pg, st->page, MADV_COLD) != 0 && errno == EINVAL;
}

/* The anonymous mapping around p, if it is one and not too big ([heap] and [stack] are named,
 * so they are not): one registration then covers every message cut from a malloc'ed buffer. */
_DDP_PRIVATE int _ddp_ib_vma(uintptr_t p, uintptr_t *lo, uintptr_t *hi) {
    FILE *f = fopen("/proc/self/maps", "r");
    char line[512];
    int found = 0;
    if (!f) return 0;
    while (fgets(line, sizeof line, f)) {
        unsigned long a, b, ino;
        char perms[8], name[256] = "";
        if (sscanf(line, "%lx-%lx %7s %*s %*s %lu %255s", &a, &b, perms, &ino, name) < 4) continue;
        if (p < a || p >= b) continue;
        found = ino == 0 && !name[0] && perms[0] == 'r' && b - a <= _DDP_IB_REG_VMA_MAX;
        if (found) { *lo = a; *hi = b; }
        break;
    }
    fclose(f);
    return found;
}

_DDP_PRIVATE void _ddp_ib_reg_drop(_ddp_ib_t *st, _ddp_ib_reg_t *e) {
    int i, shared = 0;
    for (i = 0; i < _DDP_IB_REGS; i++) {
        _ddp_ib_reg_t *o = &st->regs[i];
        if (o != e && o->mr && !o->dead && o->lo < e->hi && e->lo < o->hi) shared = 1;
    }
    if (!shared && !e->dead) munlock((void *)e->lo, e->hi - e->lo);
    _ddp_ibv.dereg_mr(e->mr);
    memset(e, 0, sizeof *e);
}

_DDP_PRIVATE void _ddp_ib_reg_release(_ddp_ib_t *st, _ddp_ib_req_t *q) {
    if (q->reg) {
        if (--q->reg->refs == 0 && q->reg->dead) _ddp_ib_reg_drop(st, q->reg);
        q->reg = NULL;
    }
    if (q->own_mr) { _ddp_ibv.dereg_mr(q->own_mr); q->own_mr = NULL; }
}

/* A registration covering [buf, buf + len): cached (q->reg) or for this message (q->own_mr). */
_DDP_PRIVATE ddp_result_t _ddp_ib_reg_get(_ddp_ib_t *st, _ddp_ib_req_t *q, int peer) {
    const ddp_transport_ctx_t *c = st->ctx;
    const uintptr_t lo = (uintptr_t)q->h.buf, hi = lo + q->h.len;
    const int need_w = !q->h.is_send;
    const int wr = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
    uintptr_t rlo, rhi;
    struct ibv_mr *mr;
    _ddp_ib_reg_t *slot = NULL;
    int i, writable = 1;
    for (i = 0; st->cache_on && i < _DDP_IB_REGS; i++) {
        _ddp_ib_reg_t *e = &st->regs[i];
        if (!e->mr || e->dead || lo < e->lo || hi > e->hi || (need_w && !e->writable)) continue;
        if (!_ddp_ib_page_locked(st, lo) || !_ddp_ib_page_locked(st, hi - 1)) {
            _ddp_ib_count(_DDP_IBS_STALE);
            _DDP_TLOG(c, DDP_LOG_TRACE, "ibverbs: registration [%p, +%zu) is stale (the memory was "
                      "unmapped and mapped again): registering afresh", (void *)e->lo, (size_t)(e->hi - e->lo));
            e->dead = 1;                 /* its pages are not ours to unlock any more */
            if (e->refs == 0) _ddp_ib_reg_drop(st, e);
            continue;
        }
        e->refs++;
        e->used = ++st->clock;
        q->reg = e;
        _ddp_ib_count(_DDP_IBS_HIT);
        return DDP_SUCCESS;
    }
    if (!_ddp_ib_vma(lo, &rlo, &rhi) || hi > rhi) {
        rlo = lo & ~(uintptr_t)(st->page - 1);
        rhi = (hi + st->page - 1) & ~(uintptr_t)(st->page - 1);
    }
    mr = _ddp_ibv.reg_mr(st->pd, (void *)rlo, rhi - rlo, wr);
    if (!mr && !need_w) {        /* read-only memory can still be sent */
        mr = _ddp_ibv.reg_mr(st->pd, (void *)rlo, rhi - rlo, 0);
        writable = 0;
    }
    if (!mr)
        return ddp_transport_fail(c, DDP_ERR_SYSTEM, "ibverbs: registering %zu bytes at %p (for a "
                                  "message %s rank %d) failed: %s%s", (size_t)(rhi - rlo), (void *)rlo,
                                  q->h.is_send ? "to" : "from", peer, strerror(errno),
                                  errno == ENOMEM || errno == EPERM ? " (locked-memory limit: ulimit -l)" : "");
    if (st->cache_on) {
        /* Entries overlapping the new range go first: the mlock below would otherwise make a
         * stale one (old pages behind a range now mapped afresh) look valid again. */
        for (i = 0; i < _DDP_IB_REGS; i++) {
            _ddp_ib_reg_t *e = &st->regs[i];
            if (!e->mr || e->dead || e->hi <= rlo || rhi <= e->lo) continue;
            if (!_ddp_ib_page_locked(st, e->lo) || !_ddp_ib_page_locked(st, e->hi - 1)) e->dead = 1;
            if (e->refs == 0) _ddp_ib_reg_drop(st, e); else e->dead = 1;
        }
        for (i = 0; i < _DDP_IB_REGS; i++) {
            _ddp_ib_reg_t *e = &st->regs[i];
            if (!e->mr) { slot = e; break; }
            if (!e->refs && (!slot || e->used < slot->used)) slot = e;
        }
        if (slot && slot->mr) { _ddp_ib_count(_DDP_IBS_EVICT); _ddp_ib_reg_drop(st, slot); }
    }
    if (!slot || mlock((void *)rlo, rhi - rlo) != 0) {
        if (st->cache_on && !st->warned_uncached++)
            _DDP_TLOG(c, DDP_LOG_INFO, "ibverbs: mlock failed (%s): registering per message, "
                      "which is slow (raise ulimit -l)", strerror(errno));
        q->own_mr = mr;
        _ddp_ib_count(_DDP_IBS_UNCACHED);
        return DDP_SUCCESS;
    }
    slot->lo = rlo;
    slot->hi = rhi;
    slot->mr = mr;
    slot->refs = 1;
    slot->writable = writable;
    slot->dead = 0;
    slot->used = ++st->clock;
    q->reg = slot;
    _ddp_ib_count(_DDP_IBS_REG);
    _DDP_TLOG(c, DDP_LOG_TRACE, "ibverbs: registered [%p, +%zu) for a %zu-byte message %s rank %d "
              "(cache miss)", (void *)rlo, (size_t)(rhi - rlo), q->h.len, q->h.is_send ? "to" : "from", peer);
    return DDP_SUCCESS;
}

_DDP_PRIVATE uint32_t _ddp_ib_lkey(const _ddp_ib_req_t *q) {
    return q->user_mr ? q->user_mr->lkey : q->reg ? q->reg->mr->lkey : q->own_mr->lkey;
}
_DDP_PRIVATE uint32_t _ddp_ib_rkey(const _ddp_ib_req_t *q) {
    return q->user_mr ? q->user_mr->rkey : q->reg ? q->reg->mr->rkey : q->own_mr->rkey;
}

/* ---------------------------------------------------------------- init */
_DDP_PRIVATE ddp_result_t _ddp_ib_init(const ddp_transport_ctx_t *c, void **state) {
    _ddp_ib_t *st;
    ddp_result_t r;
    int n = c->nranks;
    long v;
    *state = NULL;
    st = (_ddp_ib_t *)ddp_transport_calloc(c, sizeof *st);
    if (!st) return ddp_transport_fail(c, DDP_ERR_OUT_OF_MEMORY, "ibverbs: init");
    st->ctx = c;
    st->nranks = n;
    st->page = (size_t)sysconf(_SC_PAGESIZE);
    st->timeout = _ddp_env_int("DDP_IB_TIMEOUT", 1, 31, &v) == 1 ? (int)v : 15;
    st->retry_cnt = _ddp_env_int("DDP_IB_RETRY_CNT", 0, 7, &v) == 1 ? (int)v : 6;
    st->keepalive_ms = _ddp_env_int("DDP_IB_KEEPALIVE_MS", 1, 3600000, &v) == 1 ? (int)v : 1000;
    st->tc = _ddp_env_int("DDP_IB_TC", 0, 255, &v) == 1 ? (int)v : 0;
    st->sl = _ddp_env_int("DDP_IB_SL", 0, 15, &v) == 1 ? (int)v : 0;
    st->cache_on = _ddp_env_int("DDP_IB_REG_CACHE", 0, 1, &v) == 1 ? (int)v : 1;
    st->me.magic = _DDP_IB_MAGIC;
    st->me.version = _DDP_IB_VERSION;
    st->peers = (_ddp_ib_info_t *)ddp_transport_calloc(c, (size_t)n * sizeof *st->peers);
    st->have_peer = (char *)ddp_transport_calloc(c, (size_t)n);
    st->pend = (_ddp_ib_conn_t **)ddp_transport_calloc(c, (size_t)n * sizeof *st->pend);
    if (!st->peers || !st->have_peer || !st->pend) {
        r = ddp_transport_fail(c, DDP_ERR_OUT_OF_MEMORY, "ibverbs: init");
        goto fail;
    }
    if ((r = _ddp_ib_open(st)) != DDP_SUCCESS) goto fail;
    st->pd = _ddp_ibv.alloc_pd(st->vctx);
    st->ch = st->pd ? _ddp_ibv.create_comp_channel(st->vctx) : NULL;
    if (!st->ch) {
        r = ddp_transport_fail(c, DDP_ERR_SYSTEM, "ibverbs: %s on %s: %s", st->pd ? "ibv_create_comp_channel"
                               : "ibv_alloc_pd", st->me.dev, strerror(errno));
        goto fail;
    }
    _ddp_set_nonblock(st->ch->fd, 1);
    /* The stale-registration check needs MADV_COLD to tell locked from unlocked pages (Linux
     * >= 5.4); check once, else register per message. */
    if (st->cache_on) {
        void *pg = mmap(NULL, st->page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        int ok = 0;
        if (pg != MAP_FAILED) {
            ((volatile char *)pg)[0] = 1;
            ok = !_ddp_ib_page_locked(st, (uintptr_t)pg) && mlock(pg, st->page) == 0 &&
                 _ddp_ib_page_locked(st, (uintptr_t)pg);
            munmap(pg, st->page);
        }
        if (!ok) {
            st->cache_on = 0;
            _DDP_TLOG(c, DDP_LOG_INFO, "ibverbs: no registration cache (mlock or MADV_COLD "
                      "unavailable: %s); registering per message", strerror(errno));
        }
    }
    st->me.avail = 1;
    if ((r = c->publish(c->host, "ibverbs", &st->me, sizeof st->me)) != DDP_SUCCESS) goto fail;
    {
        char g[64];
        inet_ntop(AF_INET6, st->me.gid, g, sizeof g);
        _DDP_TLOG(c, DDP_LOG_INFO, "ibverbs: %s, %s, lid %u, gid[%d] %s, mtu %d, registration cache %s",
                  st->me.dev, st->me.link_layer == IBV_LINK_LAYER_ETHERNET ? "RoCE" : "InfiniBand",
                  st->me.lid, st->me.use_gid ? st->gid_index : -1, st->me.use_gid ? g : "-",
                  128 << st->me.mtu, st->cache_on ? "on" : "off");
    }
    *state = st;
    return DDP_SUCCESS;
fail:
    {
        /* Tell the peers this rank has no RDMA, so that they pick another transport for it
         * instead of waiting for an address that never comes. */
        _ddp_ib_info_t none;
        memset(&none, 0, sizeof none);
        none.magic = _DDP_IB_MAGIC;
        none.version = _DDP_IB_VERSION;
        _ddp_strlcpy(none.dev, c->last_error(c->host), sizeof none.dev);
        c->publish(c->host, "ibverbs", &none, sizeof none);
    }
    _ddp_ib_finalize(st);
    return r;
}

_DDP_PRIVATE int _ddp_ib_reachable(void *state, int peer) {
    _ddp_ib_t *st = (_ddp_ib_t *)state;
    _ddp_ib_info_t *pi = &st->peers[peer];
    if (!st->have_peer[peer]) {
        size_t len = 0;
        if (st->ctx->lookup(st->ctx->host, "ibverbs", peer, pi, sizeof *pi, &len) != DDP_SUCCESS ||
            len != sizeof *pi || pi->magic != _DDP_IB_MAGIC || pi->version != _DDP_IB_VERSION)
            memset(pi, 0, sizeof *pi);
        st->have_peer[peer] = 1;
    }
    return pi->avail && pi->link_layer == st->me.link_layer && pi->use_gid == st->me.use_gid;
}

/* ---------------------------------------------------------------- connections */
/* The connection's first failure is recorded and sticks: every later call on it returns it. */
#define _DDP_IB_CONN_FAIL(k, ...) _ddp_transport_conn_fail((k)->st->ctx, &(k)->h.err, __VA_ARGS__)

_DDP_PRIVATE ddp_result_t _ddp_ib_post_recvs(_ddp_ib_conn_t *k, int n) {
    struct ibv_recv_wr wr, *bad = NULL;
    int i;
    memset(&wr, 0, sizeof wr);
    wr.wr_id = _DDP_IB_WR_RECV;
    for (i = 0; i < n; i++)   /* no SGE: write-with-immediate consumes the WR, not its buffer */
        if (ibv_post_recv(k->qp, &wr, &bad) != 0)
            return _DDP_IB_CONN_FAIL(k, DDP_ERR_SYSTEM, "ibverbs: ibv_post_recv (rank %d): %s", k->h.peer, strerror(errno));
    return DDP_SUCCESS;
}

_DDP_PRIVATE void _ddp_ib_conn_free(_ddp_ib_conn_t *k) {
    _ddp_ib_t *st = k->st;
    int i;
    for (i = 0; i < _DDP_IB_POOL; i++) _ddp_ib_reg_release(st, &k->pool[i]);
    if (k->qp) _ddp_ibv.destroy_qp(k->qp);
    if (k->cq) {
        if (k->events) _ddp_ibv.ack_cq_events(k->cq, k->events);
        _ddp_ibv.destroy_cq(k->cq);
    }
    if (k->mr) _ddp_ibv.dereg_mr(k->mr);
    if (k->mem) munmap(k->mem, k->mem_len);
    ddp_transport_free(st->ctx, k);
}

_DDP_PRIVATE ddp_result_t _ddp_ib_progress_conn(_ddp_transport_conn_t *h);
_DDP_PRIVATE ddp_result_t _ddp_ib_post_req(_ddp_transport_conn_t *h, int is_send, void *buf, size_t len,
                                          uint64_t tag, void *mr, void **req);

_DDP_PRIVATE ddp_result_t _ddp_ib_conn_new(_ddp_ib_t *st, int peer, _ddp_ib_conn_t **out) {
    const ddp_transport_ctx_t *c = st->ctx;
    _ddp_ib_conn_t *k = (_ddp_ib_conn_t *)ddp_transport_calloc(c, sizeof *k);
    struct ibv_qp_init_attr qa;
    struct ibv_qp_attr a;
    size_t ctl = 2 * (_DDP_IB_SLOTS + 1) * sizeof(_ddp_ib_cts_t);
    int i;
    *out = NULL;
    if (!k) return ddp_transport_fail(c, DDP_ERR_OUT_OF_MEMORY, "ibverbs: connection");
    k->st = st;
    _ddp_transport_conn_init(&k->h, c, "ibverbs", peer, k->pool, sizeof k->pool[0], _DDP_IB_POOL);
    k->h.post = _ddp_ib_post_req;
    k->h.progress = _ddp_ib_progress_conn;
    ctl = (ctl + st->page - 1) & ~(st->page - 1);
    k->mem_len = ctl + (size_t)_DDP_IB_POOL * _DDP_IB_BOUNCE;
    k->mem = (unsigned char *)mmap(NULL, k->mem_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (k->mem == MAP_FAILED) { k->mem = NULL; _ddp_ib_conn_free(k); return ddp_transport_fail(c, DDP_ERR_OUT_OF_MEMORY, "ibverbs: connection buffers"); }
    k->inbox = (_ddp_ib_cts_t *)(void *)k->mem;
    k->outbox = k->inbox + _DDP_IB_SLOTS + 1;
    k->bounce = k->mem + ctl;
    k->mr = _ddp_ibv.reg_mr(st->pd, k->mem, k->mem_len, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
    if (!k->mr) {
        int e = errno;
        _ddp_ib_conn_free(k);
        return ddp_transport_fail(c, DDP_ERR_SYSTEM, "ibverbs: registering %zu bytes of connection "
                                  "buffers for rank %d failed: %s%s", k->mem_len, peer, strerror(e),
                                  e == ENOMEM || e == EPERM ? " (locked-memory limit: ulimit -l)" : "");
    }
    k->cq = _ddp_ibv.create_cq(st->vctx, _DDP_IB_SQ + _DDP_IB_RQ + 8, k, st->ch, 0);
    if (!k->cq) { int e = errno; _ddp_ib_conn_free(k); return ddp_transport_fail(c, DDP_ERR_SYSTEM, "ibverbs: ibv_create_cq: %s", strerror(e)); }
    memset(&qa, 0, sizeof qa);
    qa.send_cq = qa.recv_cq = k->cq;
    qa.qp_type = IBV_QPT_RC;
    qa.sq_sig_all = 0;
    qa.cap.max_send_wr = _DDP_IB_SQ;
    qa.cap.max_recv_wr = _DDP_IB_RQ;
    qa.cap.max_send_sge = qa.cap.max_recv_sge = 1;
    qa.cap.max_inline_data = 128;
    k->qp = _ddp_ibv.create_qp(st->pd, &qa);
    if (!k->qp) {             /* some devices have no (or less) inline data */
        qa.cap.max_inline_data = 0;
        k->qp = _ddp_ibv.create_qp(st->pd, &qa);
    }
    if (!k->qp) { int e = errno; _ddp_ib_conn_free(k); return ddp_transport_fail(c, DDP_ERR_SYSTEM, "ibverbs: ibv_create_qp (RC) on %s: %s", st->me.dev, strerror(e)); }
    k->max_inline = (int)qa.cap.max_inline_data;
    k->sq_room = _DDP_IB_SQ;
    memset(&a, 0, sizeof a);
    a.qp_state = IBV_QPS_INIT;
    a.pkey_index = 0;
    a.port_num = st->port;
    a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE;
    if (_ddp_ibv.modify_qp(k->qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS) != 0) {
        int e = errno;
        _ddp_ib_conn_free(k);
        return ddp_transport_fail(c, DDP_ERR_SYSTEM, "ibverbs: QP to INIT (rank %d): %s", peer, strerror(e));
    }
    for (i = 0; i < _DDP_IB_POOL; i++) k->pool[i].idx = i;
    if (_ddp_ib_post_recvs(k, _DDP_IB_RQ) != DDP_SUCCESS) { _ddp_ib_conn_free(k); return DDP_ERR_SYSTEM; }
    {
        uint32_t rnd = (uint32_t)(_ddp_now_us() * 2654435761u) ^ (uint32_t)getpid() ^ (uint32_t)(peer * 40503u);
        k->psn = rnd & 0xffffffu;
    }
    k->last_rx_us = _ddp_now_us();
    *out = k;
    return DDP_SUCCESS;
}

_DDP_PRIVATE ddp_result_t _ddp_ib_rtr_rts(_ddp_ib_conn_t *k, const _ddp_ib_qpinfo_t *pq, const _ddp_ib_info_t *pi) {
    _ddp_ib_t *st = k->st;
    struct ibv_qp_attr a;
    memset(&a, 0, sizeof a);
    a.qp_state = IBV_QPS_RTR;
    a.path_mtu = (enum ibv_mtu)(pi->mtu < st->me.mtu ? pi->mtu : st->me.mtu);
    a.dest_qp_num = pq->qpn;
    a.rq_psn = pq->psn;
    a.max_dest_rd_atomic = 1;
    a.min_rnr_timer = 12;               /* 0.64 ms: never expected, receives are pre-posted */
    a.ah_attr.dlid = (uint16_t)pi->lid;
    a.ah_attr.sl = (uint8_t)st->sl;
    a.ah_attr.port_num = st->port;
    if (st->me.use_gid) {
        a.ah_attr.is_global = 1;
        memcpy(a.ah_attr.grh.dgid.raw, pi->gid, 16);
        a.ah_attr.grh.sgid_index = (uint8_t)st->gid_index;
        a.ah_attr.grh.hop_limit = 255;
        a.ah_attr.grh.traffic_class = (uint8_t)st->tc;
    }
    if (_ddp_ibv.modify_qp(k->qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                           IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER) != 0)
        return ddp_transport_fail(st->ctx, DDP_ERR_SYSTEM, "ibverbs: QP to RTR (rank %d, %s): %s",
                                  k->h.peer, pi->dev, strerror(errno));
    memset(&a, 0, sizeof a);
    a.qp_state = IBV_QPS_RTS;
    a.timeout = (uint8_t)st->timeout;
    a.retry_cnt = (uint8_t)st->retry_cnt;
    a.rnr_retry = 7;                    /* infinite: a live peer always re-posts */
    a.sq_psn = k->psn;
    a.max_rd_atomic = 1;
    if (_ddp_ibv.modify_qp(k->qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
                           IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC) != 0)
        return ddp_transport_fail(st->ctx, DDP_ERR_SYSTEM, "ibverbs: QP to RTS (rank %d): %s", k->h.peer, strerror(errno));
    return DDP_SUCCESS;
}

/* Both sides do the same, one stage per call, so a rank never blocks on a key that its peer
 * publishes only in a later round: round 1 publishes (QP info), round 2 reads the peer's (which
 * it published in its round 1) and publishes "ready", round 3 reads the peer's "ready". */
_DDP_PRIVATE ddp_result_t _ddp_ib_connect(void *state, int peer, void **conn) {
    _ddp_ib_t *st = (_ddp_ib_t *)state;
    const ddp_transport_ctx_t *c = st->ctx;
    _ddp_ib_conn_t *k = st->pend[peer];
    char name[48];
    ddp_result_t r;
    *conn = NULL;
    if (!k) {
        _ddp_ib_qpinfo_t qi;
        if ((r = _ddp_ib_conn_new(st, peer, &k)) != DDP_SUCCESS) return r;
        st->pend[peer] = k;
        qi.magic = _DDP_IB_MAGIC;
        qi.qpn = k->qp->qp_num;
        qi.psn = k->psn;
        qi.rkey = k->mr->rkey;
        qi.inbox = (uint64_t)(uintptr_t)k->inbox;
        snprintf(name, sizeof name, "ibverbs.qp%d", peer);
        return c->publish(c->host, name, &qi, sizeof qi);
    }
    if (k->stage == 0) {
        _ddp_ib_qpinfo_t pq;
        size_t len = 0;
        if (!_ddp_ib_reachable(st, peer))
            return ddp_transport_fail(c, DDP_ERR_UNSUPPORTED, "ibverbs: rank %d has no usable RDMA "
                                      "port (%s)", peer, st->peers[peer].dev);
        snprintf(name, sizeof name, "ibverbs.qp%d", c->rank);
        if ((r = c->lookup(c->host, name, peer, &pq, sizeof pq, &len)) != DDP_SUCCESS) return r;
        if (len != sizeof pq || pq.magic != _DDP_IB_MAGIC)
            return ddp_transport_fail(c, DDP_ERR_MISMATCH, "ibverbs: rank %d published a malformed "
                                      "queue pair address", peer);
        k->peer_inbox = pq.inbox;
        k->peer_rkey = pq.rkey;
        if ((r = _ddp_ib_rtr_rts(k, &pq, &st->peers[peer])) != DDP_SUCCESS) return r;
        snprintf(name, sizeof name, "ibverbs.rdy%d", peer);
        if ((r = c->publish(c->host, name, "1", 1)) != DDP_SUCCESS) return r;
        _DDP_TLOG(c, DDP_LOG_TRACE, "ibverbs: QP %u -> rank %d (%s) QP %u, mtu %d, inline %d",
                  k->qp->qp_num, peer, st->peers[peer].dev, pq.qpn,
                  128 << (st->peers[peer].mtu < st->me.mtu ? st->peers[peer].mtu : st->me.mtu), k->max_inline);
        k->stage = 1;
        return DDP_SUCCESS;
    }
    {
        char v[4];
        size_t len = 0;
        snprintf(name, sizeof name, "ibverbs.rdy%d", c->rank);
        if ((r = c->lookup(c->host, name, peer, v, sizeof v, &len)) != DDP_SUCCESS) return r;
    }
    k->stage = 2;
    k->last_rx_us = _ddp_now_us();
    st->pend[peer] = NULL;
    *conn = k;
    return DDP_SUCCESS;
}

/* ---------------------------------------------------------------- data path */
_DDP_PRIVATE int _ddp_ib_seq_before(uint32_t a, uint32_t b) { return (int32_t)(a - b) < 0; }

/* Posts a chain of n WRs (the last signaled) and remembers how many send-queue entries its
 * completion gives back. */
_DDP_PRIVATE ddp_result_t _ddp_ib_post(_ddp_ib_conn_t *k, struct ibv_send_wr *wr, int n) {
    struct ibv_send_wr *bad = NULL;
    int i;
    for (i = 0; i < n; i++) wr[i].next = i + 1 < n ? &wr[i + 1] : NULL;
    wr[n - 1].send_flags |= IBV_SEND_SIGNALED;
    if (ibv_post_send(k->qp, wr, &bad) != 0)
        return _DDP_IB_CONN_FAIL(k, DDP_ERR_SYSTEM, "ibverbs: ibv_post_send to rank %d: %s",
                                 k->h.peer, strerror(errno));
    k->sq_room -= n;
    k->sig[k->sig_tail] = n;
    k->sig_tail = (k->sig_tail + 1) % _DDP_IB_SQ;
    return DDP_SUCCESS;
}

/* A zero-length or inline control write with immediate into the peer's inbox slot. */
_DDP_PRIVATE ddp_result_t _ddp_ib_post_ctl(_ddp_ib_conn_t *k, uint32_t kind, uint32_t seq, int slot,
                                           uint64_t wr_id) {
    struct ibv_send_wr wr;
    struct ibv_sge sge;
    memset(&wr, 0, sizeof wr);
    wr.wr_id = wr_id;
    wr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
    wr.imm_data = htonl(kind << 30 | (seq & _DDP_IB_SEQ_MASK));
    wr.wr.rdma.remote_addr = k->peer_inbox + (uint64_t)(slot < 0 ? 0 : slot) * sizeof(_ddp_ib_cts_t);
    wr.wr.rdma.rkey = k->peer_rkey;
    if (slot >= 0) {
        sge.addr = (uint64_t)(uintptr_t)&k->outbox[slot];
        sge.length = sizeof(_ddp_ib_cts_t);
        sge.lkey = k->mr->lkey;
        wr.sg_list = &sge;
        wr.num_sge = 1;
        if (k->max_inline >= (int)sizeof(_ddp_ib_cts_t)) wr.send_flags = IBV_SEND_INLINE;
    }
    return _ddp_ib_post(k, &wr, 1);
}

/* Posts what the send queue has room for: CTS of posted receives, then payload of sends whose
 * CTS arrived, in sequence order. */
_DDP_PRIVATE ddp_result_t _ddp_ib_push(_ddp_ib_conn_t *k) {
    ddp_result_t r;
    _ddp_ib_req_t *q;
    /* Clear-to-send, in order. The outbox slot is rewritten only _DDP_IB_SLOTS receives later,
     * when at most _DDP_IB_POOL are outstanding: the old write has long completed. */
    for (q = k->rq; q; q = _DDP_IB_NEXT(q)) {
        _ddp_ib_cts_t *o;
        int slot;
        if (_ddp_ib_seq_before(q->seq, k->cts_sent)) continue;
        if (k->sq_room < 1) return DDP_SUCCESS;
        slot = (int)(q->seq % _DDP_IB_SLOTS);
        o = &k->outbox[slot];
        o->addr = q->bounce ? (uint64_t)(uintptr_t)(k->bounce + (size_t)q->idx * _DDP_IB_BOUNCE)
                            : (uint64_t)(uintptr_t)q->h.buf;
        o->rkey = q->bounce ? k->mr->rkey : _ddp_ib_rkey(q);
        o->len = q->h.len;
        o->tag = q->h.tag;
        o->seq = q->seq;
        if ((r = _ddp_ib_post_ctl(k, _DDP_IB_CTS, q->seq, slot, _DDP_IB_WR_CTL)) != DDP_SUCCESS) return r;
        k->cts_sent = q->seq + 1;
    }
    /* Payload. */
    while ((q = k->spost) != NULL && _ddp_ib_seq_before(q->seq, k->cts_got)) {
        const _ddp_ib_cts_t *cts = &k->inbox[q->seq % _DDP_IB_SLOTS];
        struct ibv_send_wr wr[_DDP_IB_MAX_CHUNKS + 1];
        struct ibv_sge sge[_DDP_IB_MAX_CHUNKS + 1];
        size_t chunk;
        int n = 0;
        if (cts->seq != q->seq)
            return _DDP_IB_CONN_FAIL(k, DDP_ERR_INTERNAL, "ibverbs: clear-to-send #%u from rank %d "
                                     "carries #%u", q->seq, k->h.peer, cts->seq);
        if (cts->tag != q->h.tag || cts->len != q->h.len) {
            _ddp_ib_cts_t *o = &k->outbox[_DDP_IB_SLOTS];
            o->tag = q->h.tag;
            o->len = q->h.len;
            o->seq = q->seq;
            if (k->sq_room >= 1) _ddp_ib_post_ctl(k, _DDP_IB_NACK, q->seq, _DDP_IB_SLOTS, _DDP_IB_WR_CTL);
            return _DDP_IB_CONN_FAIL(k, DDP_ERR_MISMATCH, "ibverbs: rank %d expects collective #%u "
                "(signature %08x) of %llu bytes, this rank sends #%u (signature %08x) of %zu bytes: "
                "the ranks called different collectives, dtypes, ops, roots or counts (or differ in DDP_DETERMINISTIC)", k->h.peer,
                (unsigned)(cts->tag & 0xffffffffu), (unsigned)(cts->tag >> 32),
                (unsigned long long)cts->len, (unsigned)(q->h.tag & 0xffffffffu),
                (unsigned)(q->h.tag >> 32), q->h.len);
        }
        chunk = q->h.len / _DDP_IB_MAX_CHUNKS + 1;
        if (chunk < _DDP_IB_CHUNK) chunk = _DDP_IB_CHUNK;
        while (n < _DDP_IB_MAX_CHUNKS + 1 && n < k->sq_room && (q->h.done < q->h.len || (q->h.len == 0 && n == 0))) {
            size_t take = q->h.len - q->h.done < chunk ? q->h.len - q->h.done : chunk;
            int last = q->h.done + take == q->h.len;
            memset(&wr[n], 0, sizeof wr[n]);
            wr[n].wr_id = last ? (uint64_t)(uintptr_t)q : _DDP_IB_WR_CTL;
            wr[n].opcode = last ? IBV_WR_RDMA_WRITE_WITH_IMM : IBV_WR_RDMA_WRITE;
            if (last) wr[n].imm_data = htonl(_DDP_IB_DATA << 30 | (q->seq & _DDP_IB_SEQ_MASK));
            wr[n].wr.rdma.remote_addr = cts->addr + q->h.done;
            wr[n].wr.rdma.rkey = cts->rkey;
            if (take) {
                sge[n].length = (uint32_t)take;
                if (q->inl) {
                    sge[n].addr = (uint64_t)(uintptr_t)q->h.buf;
                    sge[n].lkey = 0;
                    wr[n].send_flags = IBV_SEND_INLINE;
                } else if (q->bounce) {
                    sge[n].addr = (uint64_t)(uintptr_t)(k->bounce + (size_t)q->idx * _DDP_IB_BOUNCE);
                    sge[n].lkey = k->mr->lkey;
                } else {
                    sge[n].addr = (uint64_t)(uintptr_t)(q->h.buf + q->h.done);
                    sge[n].lkey = _ddp_ib_lkey(q);
                }
                wr[n].sg_list = &sge[n];
                wr[n].num_sge = 1;
            }
            q->h.done += take;
            n++;
            if (last) break;
        }
        if (n == 0) return DDP_SUCCESS;              /* no room: later */
        if ((r = _ddp_ib_post(k, wr, n)) != DDP_SUCCESS) return r;
        if (q->h.done < q->h.len) return DDP_SUCCESS;  /* the rest when room frees up */
        k->spost = _DDP_IB_NEXT(q);
    }
    return DDP_SUCCESS;
}

_DDP_PRIVATE const char *_ddp_ib_wc_hint(enum ibv_wc_status s) {
    switch (s) {
    case IBV_WC_RETRY_EXC_ERR: return ": the peer does not answer (it exited or crashed, or its host or link is down)";
    case IBV_WC_RNR_RETRY_EXC_ERR: return ": the peer posts no receives (stuck?)";
    case IBV_WC_REM_ACCESS_ERR: case IBV_WC_REM_INV_REQ_ERR: case IBV_WC_REM_OP_ERR:
        return ": the peer refused the write (closed its connection, or a protocol error)";
    case IBV_WC_WR_FLUSH_ERR: return ": the queue pair had already failed";
    default: return "";
    }
}

/* Polls the completion queue and posts what became possible. *events counts completions. */
_DDP_PRIVATE ddp_result_t _ddp_ib_progress(_ddp_ib_conn_t *k, int *events) {
    struct ibv_wc wc[16];
    int n, i, reposts = 0;
    if (events) *events = 0;
    if (k->h.err != DDP_SUCCESS) return k->h.err;
    do {
        n = ibv_poll_cq(k->cq, 16, wc);
        if (n < 0) return _DDP_IB_CONN_FAIL(k, DDP_ERR_SYSTEM, "ibverbs: ibv_poll_cq (rank %d) failed", k->h.peer);
        if (n > 0) k->last_rx_us = _ddp_now_us();
        if (events) *events += n;
        for (i = 0; i < n; i++) {
            const struct ibv_wc *w = &wc[i];
            if (w->status != IBV_WC_SUCCESS) {
                const char *what = w->wr_id == _DDP_IB_WR_RECV ? "receiving from" :
                                   w->wr_id == _DDP_IB_WR_PROBE ? "keepalive probe of" :
                                   w->wr_id == _DDP_IB_WR_BYE ? "saying goodbye to" : "writing to";
                int remote = w->status == IBV_WC_RETRY_EXC_ERR || w->status == IBV_WC_RNR_RETRY_EXC_ERR ||
                             w->status == IBV_WC_REM_ACCESS_ERR || w->status == IBV_WC_REM_INV_REQ_ERR ||
                             w->status == IBV_WC_REM_OP_ERR || w->status == IBV_WC_REM_ABORT_ERR ||
                             w->status == IBV_WC_RESP_TIMEOUT_ERR || w->status == IBV_WC_WR_FLUSH_ERR;
                return _DDP_IB_CONN_FAIL(k, remote ? DDP_ERR_REMOTE : DDP_ERR_SYSTEM,
                                         "ibverbs: %s rank %d failed: %s (status %d, vendor error "
                                         "0x%x)%s", what, k->h.peer, _ddp_ibv.wc_status_str(w->status),
                                         (int)w->status, w->vendor_err, _ddp_ib_wc_hint(w->status));
            }
            if (w->wr_id == _DDP_IB_WR_RECV) {
                uint32_t imm = ntohl(w->imm_data), kind = imm >> 30, seq = imm & _DDP_IB_SEQ_MASK;
                reposts++;
                if (kind == _DDP_IB_CTS) {
                    if (seq != (k->cts_got & _DDP_IB_SEQ_MASK))
                        return _DDP_IB_CONN_FAIL(k, DDP_ERR_INTERNAL, "ibverbs: clear-to-send #%u "
                                                 "from rank %d, expected #%u", seq, k->h.peer, k->cts_got);
                    k->cts_got++;
                } else if (kind == _DDP_IB_DATA) {
                    _ddp_ib_req_t *q = k->rq;
                    if (!q || seq != (q->seq & _DDP_IB_SEQ_MASK) || w->byte_len != q->h.len)
                        return _DDP_IB_CONN_FAIL(k, DDP_ERR_INTERNAL, "ibverbs: unexpected message "
                                                 "#%u (%u bytes) from rank %d", seq, w->byte_len, k->h.peer);
                    if (q->bounce && q->h.len)
                        memcpy(q->h.buf, k->bounce + (size_t)q->idx * _DDP_IB_BOUNCE, q->h.len);
                    _ddp_ib_reg_release(k->st, q);
                    q->h.complete = 1;
                    k->rq = _DDP_IB_NEXT(q);
                    if (!k->rq) k->rq_tail = NULL;
                    k->data_got++;
                } else if (kind == _DDP_IB_NACK) {
                    const _ddp_ib_cts_t *m = &k->inbox[_DDP_IB_SLOTS];
                    const _ddp_ib_req_t *q = k->rq;
                    return _DDP_IB_CONN_FAIL(k, DDP_ERR_MISMATCH, "ibverbs: rank %d sent collective "
                        "#%u (signature %08x) of %llu bytes, this rank expected #%u (signature %08x) "
                        "of %zu bytes: the ranks called different collectives, dtypes, ops, roots or "
                        "counts", k->h.peer, (unsigned)(m->tag & 0xffffffffu), (unsigned)(m->tag >> 32),
                        (unsigned long long)m->len, q ? (unsigned)(q->h.tag & 0xffffffffu) : 0u,
                        q ? (unsigned)(q->h.tag >> 32) : 0u, q ? q->h.len : (size_t)0);
                } else {
                    /* Goodbye: what the peer wrote before it has arrived (RC keeps order), and
                     * the ACKs of our last writes may still be in this batch. */
                    k->bye_us = _ddp_now_us();
                }
                continue;
            }
            /* A send-side completion: it retires the WRs posted with it. */
            k->sq_room += k->sig[k->sig_head];
            k->sig_head = (k->sig_head + 1) % _DDP_IB_SQ;
            if (w->wr_id == _DDP_IB_WR_PROBE) {
                k->probe_out = 0;
            } else if (w->wr_id > _DDP_IB_WR_RECV) {
                _ddp_ib_req_t *q = (_ddp_ib_req_t *)(uintptr_t)w->wr_id;
                _ddp_ib_reg_release(k->st, q);
                q->h.complete = 1;
                if (k->sq == q) {           /* completions come in posting order */
                    k->sq = _DDP_IB_NEXT(q);
                    if (!k->sq) k->sq_tail = NULL;
                }
            }
        }
    } while (n == 16);
    if (k->bye_us) {
        /* The peer has closed: nothing more arrives. A message still expected, or a send it
         * never cleared, fails now; a send already written gets a moment for its completion. */
        if (k->rq || k->spost || (k->sq && _ddp_now_us() - k->bye_us > 200000))
            return _DDP_IB_CONN_FAIL(k, DDP_ERR_REMOTE, "ibverbs: rank %d closed the connection "
                                     "(it exited, crashed or failed)", k->h.peer);
        return DDP_SUCCESS;
    }
    if (reposts) {
        ddp_result_t r = _ddp_ib_post_recvs(k, reposts);
        if (r != DDP_SUCCESS) return r;
    }
    return _ddp_ib_push(k);
}

/* The shared test's progress: no completion events to count. */
_DDP_PRIVATE ddp_result_t _ddp_ib_progress_conn(_ddp_transport_conn_t *h) {
    return _ddp_ib_progress((_ddp_ib_conn_t *)(void *)h, NULL);
}

_DDP_PRIVATE ddp_result_t _ddp_ib_post_req(_ddp_transport_conn_t *h, int is_send, void *buf, size_t len,
                                          uint64_t tag, void *mr, void **req) {
    _ddp_ib_conn_t *k = (_ddp_ib_conn_t *)(void *)h;
    _ddp_transport_req_t *t;
    _ddp_ib_req_t *q;
    ddp_result_t r;
    if (k->bye_us)   /* (a connection that failed before returns that failure) */
        return _DDP_IB_CONN_FAIL(k, DDP_ERR_REMOTE, "ibverbs: rank %d closed the connection (it "
                                 "exited, crashed or failed)", k->h.peer);
    if ((r = _ddp_transport_req_take(h, is_send, buf, len, tag, &t)) != DDP_SUCCESS) return r;
    q = (_ddp_ib_req_t *)(void *)t;
    q->inl = is_send && len && (int)len <= k->max_inline && !mr;
    q->bounce = !q->inl && len <= _DDP_IB_BOUNCE && !mr;
    q->reg = NULL;
    q->own_mr = NULL;
    q->user_mr = (struct ibv_mr *)mr;
    if (!q->inl && !q->bounce && !mr) {
        r = _ddp_ib_reg_get(k->st, q, k->h.peer);
        if (r != DDP_SUCCESS) { _ddp_transport_req_put(h, t); return r; }
    }
    _ddp_ib_count(q->inl ? _DDP_IBS_INLINE : q->bounce ? (is_send ? _DDP_IBS_BSEND : _DDP_IBS_BRECV)
                  : (is_send ? _DDP_IBS_ZSEND : _DDP_IBS_ZRECV));
    if (is_send) {
        if (q->bounce && len) memcpy(k->bounce + (size_t)q->idx * _DDP_IB_BOUNCE, buf, len);
        q->seq = k->send_seq++;
        if (k->sq_tail) k->sq_tail->h.next = t; else k->sq = q;
        k->sq_tail = q;
        if (!k->spost) k->spost = q;
    } else {
        q->seq = k->recv_seq++;
        if (k->rq_tail) k->rq_tail->h.next = t; else k->rq = q;
        k->rq_tail = q;
    }
    *req = q;
    return _ddp_ib_push(k);
}

/* Arms the connections' CQs and sleeps on the completion channel. A peer silent for longer
 * than DDP_IB_KEEPALIVE_MS gets a zero-length write: if its process is gone, the write fails
 * after the retries and the failure wakes us. */
_DDP_PRIVATE ddp_result_t _ddp_ib_wait(void *state, void *const *conns, int n, int timeout_ms) {
    _ddp_ib_t *st = (_ddp_ib_t *)state;
    struct pollfd pfd;
    int64_t now = _ddp_now_us();
    int i, ev;
    for (i = 0; i < n; i++) {
        _ddp_ib_conn_t *k = (_ddp_ib_conn_t *)conns[i];
        if (k->h.err != DDP_SUCCESS || k->bye_us) { usleep(1000); return DDP_SUCCESS; }  /* test() reports it */
        if (_ddp_ib_progress(k, &ev) != DDP_SUCCESS || ev) return DDP_SUCCESS;
        if (!k->probe_out && k->sq_room > 0 && now - k->last_rx_us > (int64_t)st->keepalive_ms * 1000) {
            struct ibv_send_wr wr;
            memset(&wr, 0, sizeof wr);
            wr.wr_id = _DDP_IB_WR_PROBE;
            wr.opcode = IBV_WR_RDMA_WRITE;
            wr.wr.rdma.remote_addr = k->peer_inbox;
            wr.wr.rdma.rkey = k->peer_rkey;
            if (_ddp_ib_post(k, &wr, 1) != DDP_SUCCESS) return DDP_SUCCESS;
            k->probe_out = 1;
            k->last_rx_us = now;   /* next probe (if this one is still out) a period later */
            _ddp_ib_count(_DDP_IBS_PROBE);
        }
        if (ibv_req_notify_cq(k->cq, 0) != 0)
            return ddp_transport_fail(st->ctx, DDP_ERR_SYSTEM, "ibverbs: ibv_req_notify_cq: %s", strerror(errno));
        /* A completion that arrived before arming raised no event: look once more. */
        if (_ddp_ib_progress(k, &ev) != DDP_SUCCESS || ev) return DDP_SUCCESS;
    }
    pfd.fd = st->ch->fd;
    pfd.events = POLLIN;
    pfd.revents = 0;
    if (poll(&pfd, 1, timeout_ms) < 0 && errno != EINTR)
        return ddp_transport_fail(st->ctx, DDP_ERR_SYSTEM, "ibverbs: poll: %s", strerror(errno));
    for (;;) {
        struct ibv_cq *cq;
        void *ctx;
        if (_ddp_ibv.get_cq_event(st->ch, &cq, &ctx) != 0) break;
        ((_ddp_ib_conn_t *)ctx)->events++;
        if (((_ddp_ib_conn_t *)ctx)->events >= 64) {
            _ddp_ibv.ack_cq_events(cq, ((_ddp_ib_conn_t *)ctx)->events);
            ((_ddp_ib_conn_t *)ctx)->events = 0;
        }
    }
    return DDP_SUCCESS;
}

_DDP_PRIVATE ddp_result_t _ddp_ib_close(void *conn) {
    _ddp_ib_conn_t *k = (_ddp_ib_conn_t *)conn;
    if (!k) return DDP_SUCCESS;
    /* A fork child shares the verbs context with the parent: destroying a queue pair here would
     * destroy the parent's. Leave everything to the child's exit. */
    if (ddp_transport_forked(k->st->ctx)) return DDP_SUCCESS;
    /* Goodbye, so that a peer still waiting on us fails now, not after a keepalive. Wait a
     * little for it to leave the queue (a dead peer never ACKs: then give up). */
    if (k->h.err == DDP_SUCCESS && !k->bye_us && k->sq_room > 0 &&
        _ddp_ib_post_ctl(k, _DDP_IB_BYE, 0, -1, _DDP_IB_WR_BYE) == DDP_SUCCESS) {
        int64_t until = _ddp_now_us() + 100000;
        while (_ddp_now_us() < until) {
            struct ibv_wc w;
            int m = ibv_poll_cq(k->cq, 1, &w);
            if (m < 0 || (m == 1 && (w.wr_id == _DDP_IB_WR_BYE || w.status != IBV_WC_SUCCESS))) break;
            if (m == 0) usleep(50);
        }
    }
    _ddp_ib_conn_free(k);
    return DDP_SUCCESS;
}

_DDP_PRIVATE ddp_result_t _ddp_ib_finalize(void *state) {
    _ddp_ib_t *st = (_ddp_ib_t *)state;
    int i;
    if (!st || ddp_transport_forked(st->ctx)) return DDP_SUCCESS;   /* see _ddp_ib_close */
    for (i = 0; st->pend && i < st->nranks; i++) if (st->pend[i]) _ddp_ib_conn_free(st->pend[i]);
    for (i = 0; i < _DDP_IB_REGS; i++) if (st->regs[i].mr) _ddp_ib_reg_drop(st, &st->regs[i]);
    if (st->ch) _ddp_ibv.destroy_comp_channel(st->ch);
    if (st->pd) _ddp_ibv.dealloc_pd(st->pd);
    if (st->vctx) _ddp_ibv.close_device(st->vctx);
    ddp_transport_free(st->ctx, st->peers);
    ddp_transport_free(st->ctx, st->have_peer);
    ddp_transport_free(st->ctx, st->pend);
    ddp_transport_free(st->ctx, st);
    return DDP_SUCCESS;
}

/* Explicit registration (reg_mr): the caller's buffer, registered for local and remote use. */
_DDP_PRIVATE ddp_result_t _ddp_ib_reg_mr(void *state, void *buf, size_t len, void **mr) {
    _ddp_ib_t *st = (_ddp_ib_t *)state;
    struct ibv_mr *m = _ddp_ibv.reg_mr(st->pd, buf, len, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
    *mr = m;
    if (!m) return ddp_transport_fail(st->ctx, DDP_ERR_SYSTEM, "ibverbs: registering %zu bytes at %p: %s",
                                      len, buf, strerror(errno));
    return DDP_SUCCESS;
}

_DDP_PRIVATE ddp_result_t _ddp_ib_dereg_mr(void *state, void *mr) {
    (void)state;
    if (mr) _ddp_ibv.dereg_mr((struct ibv_mr *)mr);
    return DDP_SUCCESS;
}

static const ddp_transport_t _ddp_ib_transport = {
    DDP_TRANSPORT_VERSION, "ibverbs", 15,
    _ddp_ib_init, _ddp_ib_reachable, _ddp_ib_connect, _ddp_ib_connect,
    _ddp_ib_reg_mr, _ddp_ib_dereg_mr, _ddp_transport_isend, _ddp_transport_irecv, _ddp_transport_test, _ddp_ib_wait,
    _ddp_ib_close, _ddp_ib_finalize, NULL, NULL, NULL,
};

DDP_API const ddp_transport_t *ddp_transport_ibverbs(void) { return &_ddp_ib_transport; }

_DDP_TRANSPORT_CONSTRUCTOR(_ddp_ib_register) { ddp_transport_register(&_ddp_ib_transport); }

#endif /* DDP_IBVERBS implementation */
