/* SPDX-License-Identifier: MIT (see LICENSE) */
/* ddp_window.h — registered (symmetric) buffers: memory a communicator hands out so that the
 * ranks on one host can map each other's, and the shared-memory collectives read a peer's
 * buffer where it is instead of staging it through the transport (NCCL's ncclMemAlloc +
 * ncclCommWindowRegister, as one call).
 *
 *     float *grad;
 *     ddp_comm_mem_alloc(comm, n * sizeof *grad, (void **)&grad);   // every rank, same bytes
 *     ... fill grad ...
 *     ddp_all_reduce(grad, grad, n, DDP_FLOAT32, DDP_AVG, comm);    // zero-copy over shm
 *     ddp_comm_mem_free(comm, grad);                                // every rank, same order
 *
 * RULES
 *   - Both calls are collective: every rank calls them in the same order with the same bytes
 *     (different sizes or frees of different allocations: DDP_ERR_MISMATCH, nothing done).
 *   - The memory is zero-filled, page-aligned and usable with every call, whatever transport
 *     runs the collectives. Where shared memory runs them (every rank on this host), it is a
 *     sealed memfd mapped by every rank, and a collective whose buffers lie in such memory on
 *     every rank reads them there: all-reduce (from DDP_SHM_ZC_MIN, 8 MiB; below, inputs out
 *     of place), reduce-scatter, all-gather and broadcast. Buffers in ordinary memory work as ever, also mixed with
 *     registered ones across ranks. Elsewhere (several hosts, threads, DDP_SHM_COLL=0, TCP) it
 *     is ordinary memory. An INFO line says which it got, and why.
 *   - ddp_comm_mem_free refuses (DDP_ERR_INVALID_USAGE, frees nothing) while an async request
 *     whose buffers meet the memory is not finished; ddp_wait it first. Memory not freed is
 *     released by ddp_comm_destroy. On a failed communicator free releases this rank's part
 *     without asking the others (their mappings stay valid until they free theirs).
 *   - A rank that dies while others map its memory takes nothing down with it: the memory lives
 *     while mapped, and the next collective names the dead rank as usual.
 *
 * Depends on ddp_comm.h. Built by DDP_IMPLEMENTATION (or DDP_WINDOW_IMPLEMENTATION).
 */
#if defined(DDP_IMPLEMENTATION) && !defined(DDP_WINDOW_IMPLEMENTATION)
#define DDP_WINDOW_IMPLEMENTATION
#endif
#if defined(DDP_WINDOW_IMPLEMENTATION) && !defined(DDP_COMM_IMPLEMENTATION)
#define DDP_COMM_IMPLEMENTATION
#endif
#include "ddp_comm.h"

#ifndef DDP_WINDOW_H_INCLUDED
#define DDP_WINDOW_H_INCLUDED
#ifdef __cplusplus
extern "C" {
#endif

/* bytes > 0 of registered memory in *ptr (NULL on failure). Collective. */
DDP_API ddp_result_t ddp_comm_mem_alloc(ddp_comm_t *comm, size_t bytes, void **ptr);
/* Releases memory from ddp_comm_mem_alloc (NULL: nothing). Collective. */
DDP_API ddp_result_t ddp_comm_mem_free(ddp_comm_t *comm, void *ptr);

#ifdef __cplusplus
}
#endif
#endif /* DDP_WINDOW_H_INCLUDED */

#if defined(DDP_WINDOW_IMPLEMENTATION) && !defined(DDP_WINDOW_IMPL_INCLUDED)
#define DDP_WINDOW_IMPL_INCLUDED
#if !defined(DDP_COMM_IMPL_INCLUDED)
#error "libddp: ddp_window.h's implementation needs ddp_comm.h's (define DDP_IMPLEMENTATION)"
#endif

#include <sys/mman.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct _ddp_window {
    struct _ddp_window *next;
    void *ptr;
    size_t bytes;
    uint64_t serial;                 /* the n-th allocation on this communicator: n everywhere */
    void *win;                       /* the collective provider's, or NULL: ordinary memory */
} _ddp_window_t;

typedef struct {
    _ddp_window_t *head;
    uint64_t serials;
} _ddp_windows_t;

/* MIN over the ranks of n int64 values, in place (a collective; waits for earlier requests). */
_DDP_PRIVATE ddp_result_t _ddp_win_min(ddp_comm_t *c, int64_t *v, size_t n) {
    return ddp_all_reduce(v, v, n, DDP_INT64, DDP_MIN, c);
}

_DDP_PRIVATE void _ddp_win_release(ddp_comm_t *c, _ddp_window_t *w) {
    if (w->win) c->choice.coll->win_destroy(c->choice.coll_state, w->win);
    else munmap(w->ptr, w->bytes);
    ddp_comm_free(c, w);
}

/* ddp_comm_destroy: what was not freed. */
_DDP_PRIVATE void _ddp_windows_free_all(ddp_comm_t *c) {
    _ddp_windows_t *ws = (_ddp_windows_t *)c->windows;
    if (!ws) return;
    while (ws->head) {
        _ddp_window_t *w = ws->head;
        ws->head = w->next;
        _ddp_win_release(c, w);
    }
    ddp_comm_free(c, ws);
    c->windows = NULL;
}

/* The provider's part of an allocation (every rank's collectives are the provider's): 1 and
 * *win when every rank made and mapped its part, 0 when some rank could not (why says who);
 * a failed agreement (a dead peer) is returned in *r. */
_DDP_PRIVATE int _ddp_win_share(ddp_comm_t *c, size_t bytes, void **ptr, void **win, char *why,
                                size_t cap, ddp_result_t *r) {
    const ddp_coll_provider_t *cp = c->choice.coll;
    const int me = c->eng.rank;
    int64_t v;
    char mine[256] = "";
    *r = cp->win_create(c->choice.coll_state, bytes, ptr, win) == DDP_SUCCESS ? DDP_SUCCESS : DDP_ERR_SYSTEM;
    if (*r != DDP_SUCCESS) snprintf(mine, sizeof mine, "%.200s", ddp_comm_last_error(c));
    /* Everyone made and published its part (the lowest rank that could not, else nranks). */
    v = *r == DDP_SUCCESS ? c->eng.nranks : me;
    if ((*r = _ddp_win_min(c, &v, 1)) == DDP_SUCCESS && v == c->eng.nranks) {
        if (cp->win_map(c->choice.coll_state, *win, mine, sizeof mine) != DDP_SUCCESS) v = me;
        if ((*r = _ddp_win_min(c, &v, 1)) == DDP_SUCCESS) {
            cp->win_use(c->choice.coll_state, *win, v == c->eng.nranks);
            if (v == c->eng.nranks) return 1;
            snprintf(why, cap, "rank %d could not map every rank's part%s%.256s", (int)v, v == me ? ": " : "",
                     v == me ? mine : "");
            return 0;   /* the memory is ours alone, staged */
        }
    } else if (*r == DDP_SUCCESS) {
        snprintf(why, cap, "rank %d could not make its part%s%.256s", (int)v, v == me ? ": " : "", v == me ? mine : "");
    }
    if (*win) cp->win_destroy(c->choice.coll_state, *win);
    *win = *ptr = NULL;
    return 0;
}

DDP_API ddp_result_t ddp_comm_mem_alloc(ddp_comm_t *c, size_t bytes, void **ptr) {
    _ddp_windows_t *ws;
    _ddp_window_t *w;
    void *p = NULL, *win = NULL;
    int64_t v[3];
    int direct = 0;
    char why[512] = "";
    ddp_result_t r;
    if (ptr) *ptr = NULL;
    if ((r = _ddp_check_comm(c)) != DDP_SUCCESS) return r;
    if (!ptr) return ddp_comm_fail(c, DDP_ERR_INVALID_ARGUMENT, "ddp_comm_mem_alloc: NULL ptr");
    if (!bytes || bytes > (size_t)PTRDIFF_MAX)
        return ddp_comm_fail(c, DDP_ERR_INVALID_ARGUMENT, "ddp_comm_mem_alloc: %zu bytes (1 .. PTRDIFF_MAX)", bytes);
    if (c->group.depth)
        return ddp_comm_fail(c, DDP_ERR_INVALID_USAGE, "ddp_comm_mem_alloc inside a group: it is a "
                             "collective of its own");
    if (!c->windows) {
        if (!(c->windows = ddp_comm_calloc(c, sizeof(_ddp_windows_t))))
            return ddp_comm_fail(c, DDP_ERR_OUT_OF_MEMORY, "ddp_comm_mem_alloc: its table");
        c->windows_free = _ddp_windows_free_all;
    }
    ws = (_ddp_windows_t *)c->windows;
    /* Every rank asks for the same size, and whether its collectives could share it. */
    v[0] = (int64_t)bytes;
    v[1] = -(int64_t)bytes;
    v[2] = c->choice.coll && c->choice.coll->win_create ? 1 : 0;
    if ((r = _ddp_win_min(c, v, 3)) != DDP_SUCCESS) return r;
    if (v[0] != -v[1])
        return ddp_comm_fail(c, DDP_ERR_MISMATCH, "ddp_comm_mem_alloc: the ranks asked for different "
                             "sizes (%lld .. %lld bytes; this rank %zu): nothing allocated",
                             (long long)v[0], (long long)-v[1], bytes);
    if (v[2]) {
        direct = _ddp_win_share(c, bytes, &p, &win, why, sizeof why, &r);
        if (r != DDP_SUCCESS) return r;
        if (!win) p = NULL;
    } else {
        snprintf(why, sizeof why, "the collectives are not run by shared memory on this communicator");
    }
    if (!p) {
        p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED)
            return ddp_comm_fail(c, DDP_ERR_OUT_OF_MEMORY, "ddp_comm_mem_alloc: %zu bytes: %s", bytes, strerror(errno));
    }
    if (!(w = (_ddp_window_t *)ddp_comm_calloc(c, sizeof *w))) {
        if (win) c->choice.coll->win_destroy(c->choice.coll_state, win);
        else munmap(p, bytes);
        return ddp_comm_fail(c, DDP_ERR_OUT_OF_MEMORY, "ddp_comm_mem_alloc: its record");
    }
    w->ptr = p;
    w->bytes = bytes;
    w->win = win;
    w->serial = ++ws->serials;
    w->next = ws->head;
    ws->head = w;
    if (direct)
        _DDP_LOG(c, DDP_LOG_INFO, "ddp_comm_mem_alloc #%llu: %zu bytes registered: every rank maps "
                 "every rank's; collectives on it read peers' buffers directly",
                 (unsigned long long)w->serial, bytes);
    else
        _DDP_LOG(c, DDP_LOG_INFO, "ddp_comm_mem_alloc #%llu: %zu bytes of %s memory, staged as any "
                 "buffer: %s", (unsigned long long)w->serial, bytes, win ? "shared" : "ordinary", why);
    *ptr = p;
    return DDP_SUCCESS;
}

/* The request not yet finished whose buffers meet [p, p + bytes), or NULL. */
_DDP_PRIVATE const _ddp_op_t *_ddp_win_in_flight(ddp_comm_t *c, const void *p, size_t bytes, uint64_t *id) {
    const _ddp_op_t *hit = NULL;
    uint64_t i;
    if (!c->queue.async_init || !c->queue.ops) return NULL;
    pthread_mutex_lock(&c->queue.amu);
    for (i = c->queue.finished + 1; i <= c->queue.issued && !hit; i++) {
        const _ddp_op_t *o = &c->queue.ops[(i - 1) % DDP_MAX_REQUESTS];
        if (o->state != 3 && (_ddp_ranges_meet(o->send, _ddp_op_bytes(c, o, 0), p, bytes) ||
                              _ddp_ranges_meet(o->recv, _ddp_op_bytes(c, o, 1), p, bytes))) {
            hit = o;
            *id = i;
        }
    }
    pthread_mutex_unlock(&c->queue.amu);
    return hit;
}

DDP_API ddp_result_t ddp_comm_mem_free(ddp_comm_t *c, void *ptr) {
    _ddp_windows_t *ws;
    _ddp_window_t **pp, *w;
    const _ddp_op_t *o;
    uint64_t id = 0;
    int64_t v[2];
    ddp_result_t r;
    if (!c) return DDP_ERR_INVALID_ARGUMENT;
    if (!ptr) return DDP_SUCCESS;
    if ((r = _ddp_usable(c)) != DDP_SUCCESS) return r;
    ws = (_ddp_windows_t *)c->windows;
    for (pp = ws ? &ws->head : NULL; pp && *pp && (*pp)->ptr != ptr; pp = &(*pp)->next) {}
    if (!pp || !*pp)
        return ddp_comm_fail(c, DDP_ERR_INVALID_ARGUMENT, "ddp_comm_mem_free: %p is not from "
                             "ddp_comm_mem_alloc on this communicator (or was freed)", ptr);
    w = *pp;
    if ((o = _ddp_win_in_flight(c, w->ptr, w->bytes, &id)) != NULL)
        return ddp_comm_fail(c, DDP_ERR_INVALID_USAGE, "ddp_comm_mem_free: %s (request #%llu) on "
                             "this memory is still in flight: ddp_wait it first; nothing was freed",
                             _ddp_kind_name(o->kind), (unsigned long long)id);
    /* Every rank frees the same allocation (a peer may read ours until it too is done). */
    v[0] = (int64_t)w->serial;
    v[1] = -(int64_t)w->serial;
    r = _ddp_check_comm(c) == DDP_SUCCESS ? _ddp_win_min(c, v, 2) : DDP_ERR_REMOTE;
    if (r == DDP_SUCCESS && v[0] != -v[1])
        return ddp_comm_fail(c, DDP_ERR_MISMATCH, "ddp_comm_mem_free: the ranks free different "
                             "allocations (#%lld .. #%lld; this rank #%llu): nothing freed",
                             (long long)v[0], (long long)-v[1], (unsigned long long)w->serial);
    if (r != DDP_SUCCESS)
        _DDP_LOG(c, DDP_LOG_INFO, "ddp_comm_mem_free #%llu: the communicator failed: this rank's part "
                 "released without the others", (unsigned long long)w->serial);
    *pp = w->next;
    _ddp_win_release(c, w);
    return DDP_SUCCESS;
}

#ifdef __cplusplus
}
#endif
#endif /* DDP_WINDOW implementation */
