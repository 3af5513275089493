/* SPDX-License-Identifier: MIT (see LICENSE) */
/* transports/ddp_shm_window.h — registered (symmetric) buffers of the shared-memory transport:
 * memory that every rank of the host maps, so the collectives read a peer's buffer where it is
 * instead of through a staging copy. Private: transports/ddp_shm.h glues it to its ranks and
 * collectives; users reach it through ddp_comm_mem_alloc / ddp_comm_mem_free (ddp_window.h).
 *
 * A WINDOW is one sealed memfd (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL, so no process can
 * ever make another's access to it fault) per rank, mapped MAP_SHARED by its owner and by every
 * other rank of the communicator. Windows are made collectively, in the same order everywhere,
 * so the n-th window has serial n on every rank. Sharing needs nothing from how the transport's
 * connections were made: the owner publishes (serial, bytes, descriptor number) in its SLOT
 * (below, in its shared header), and a peer opens /proc/<owner pid>/fd/<number>, with the pid
 * the kernel gave for the owner (SO_PEERCRED), never one read from shared memory. Before
 * mapping, the peer checks that what it opened is a memfd named for this communicator and
 * serial, sealed, of exactly the agreed size. If any check fails on any rank, the communicator
 * agrees (ddp_window.h) that nobody reads that window directly: it still works, staged.
 *
 * Per call, each rank publishes in its slot, beside the step it signals, where its send and
 * receive buffers lie: (window serial, offset), serial 0 for ordinary memory. The collective
 * reads every rank's entry after its first synchronisation, so all ranks take the same path.
 *
 * Depends on ddp_transport.h and ddp_shm_handshake.h (the seals). Built by DDP_IMPLEMENTATION
 * (or DDP_SHM_WINDOW_IMPLEMENTATION).
 */
#if defined(DDP_IMPLEMENTATION) && !defined(DDP_SHM_WINDOW_IMPLEMENTATION)
#define DDP_SHM_WINDOW_IMPLEMENTATION
#endif
#if defined(DDP_SHM_WINDOW_IMPLEMENTATION)
#ifndef DDP_TRANSPORT_IMPLEMENTATION
#define DDP_TRANSPORT_IMPLEMENTATION
#endif
#ifndef DDP_SHM_HANDSHAKE_IMPLEMENTATION
#define DDP_SHM_HANDSHAKE_IMPLEMENTATION
#endif
#endif
#include "ddp_transport.h"
#include "ddp_shm_handshake.h"

#if defined(DDP_SHM_WINDOW_IMPLEMENTATION) && !defined(DDP_SHM_WINDOW_IMPL_INCLUDED)
#define DDP_SHM_WINDOW_IMPL_INCLUDED
#if !defined(DDP_TRANSPORT_IMPL_INCLUDED) || !defined(DDP_SHM_HANDSHAKE_IMPL_INCLUDED)
#error "libddp: transports/ddp_shm_window.h's implementation needs ddp_transport.h's and ddp_shm_handshake.h's (define DDP_IMPLEMENTATION)"
#endif

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>

/* Where a call's buffers lie: window serial (0: ordinary memory) and byte offset in it. */
typedef struct { uint64_t send_serial, send_off, recv_serial, recv_off; } _ddp_shm_win_call_t;

/* A rank's slot, in its shared header: one writer (the owner). The window line is read by
 * the peers between the two agreements of a window's creation; call[n & 1] belongs to the call
 * whose first step is step n (as the signatures: read after that step, rewritten two steps
 * later at the earliest, once every peer has signalled the step between). */
typedef struct {
    uint64_t serial, bytes, comm_id;   /* the window being made */
    int32_t fd, pad;
    unsigned char pad0[64 - 32];
    _ddp_shm_win_call_t call[2];
} _ddp_shm_win_slot_t;

#define _DDP_SHM_WIN_SLOT_OFF 256   /* within the 4 KiB header page, after its 4 lines */

typedef struct _ddp_shm_win {
    struct _ddp_shm_win *next;
    uint64_t serial;
    size_t bytes;
    int fd;                          /* ours, open until destroyed: peers open it through /proc */
    int usable;                      /* every rank mapped every rank's: read directly */
    unsigned char **base;            /* nranks: each rank's window as mapped here (ours at [rank]) */
} _ddp_shm_win_t;

/* A transport instance's windows, and the per-call scratch its collectives use (allocated with
 * the first window: nothing per call). */
typedef struct {
    _ddp_shm_win_t *head;
    uint64_t serials;                /* windows made so far (the next one's serial - 1) */
    int nusable;
    const unsigned char **src;       /* nranks: where a call reads each rank's input, or NULL */
    unsigned char **dst;             /* nranks: each rank's output window, or NULL */
    /* Copying into lines a peer just read: ordinary or streaming stores? The cheaper depends on
     * whether the two cores share a cache, which this VM changes from run to run: ns per byte of
     * each way (exponential average), the cheaper used, the other tried every 16th time. */
    double way_cost[2];
    unsigned way_tries;
} _ddp_shm_wins_t;

static inline int _ddp_shm_win_way(_ddp_shm_wins_t *ws) {
    int best;
    if (ws->way_cost[1] == 0) return 1;
    if (ws->way_cost[0] == 0) return 0;
    best = ws->way_cost[1] < ws->way_cost[0];
    return (++ws->way_tries & 15) == 0 ? !best : best;
}

static inline void _ddp_shm_win_way_learn(_ddp_shm_wins_t *ws, int way, int64_t ns, size_t bytes) {
    double c, *e = &ws->way_cost[way];
    if (ns <= 0 || !bytes) return;
    c = (double)ns / (double)bytes;
    *e = *e == 0 ? c : 0.75 * *e + 0.25 * c;
}

_DDP_PRIVATE _ddp_shm_win_slot_t *_ddp_shm_win_slot(void *hdr) {
    return (_ddp_shm_win_slot_t *)(void *)((unsigned char *)hdr + _DDP_SHM_WIN_SLOT_OFF);
}

/* Makes this rank's memfd of `bytes`, sealed and mapped, and publishes it in `slot`. */
_DDP_PRIVATE ddp_result_t _ddp_shm_win_create(const ddp_transport_ctx_t *ctx, _ddp_shm_wins_t *ws,
                                              _ddp_shm_win_slot_t *slot, size_t bytes,
                                              _ddp_shm_win_t **out) {
    _ddp_shm_win_t *w;
    char name[64];
    void *m;
    *out = NULL;
    if (!ws->src) {
        ws->src = (const unsigned char **)ddp_transport_calloc(ctx, sizeof(void *) * (size_t)ctx->nranks);
        ws->dst = (unsigned char **)ddp_transport_calloc(ctx, sizeof(void *) * (size_t)ctx->nranks);
        if (!ws->src || !ws->dst) return ddp_transport_fail(ctx, DDP_ERR_OUT_OF_MEMORY, "shm window: tables");
    }
    w = (_ddp_shm_win_t *)ddp_transport_calloc(ctx, sizeof *w);
    if (!w || !(w->base = (unsigned char **)ddp_transport_calloc(ctx, sizeof(void *) * (size_t)ctx->nranks))) {
        ddp_transport_free(ctx, w);
        return ddp_transport_fail(ctx, DDP_ERR_OUT_OF_MEMORY, "shm window: record");
    }
    w->serial = ++ws->serials;
    w->bytes = bytes;
    snprintf(name, sizeof name, "ddp-win.%016llx.%llu", (unsigned long long)ctx->comm_id,
             (unsigned long long)w->serial);
    w->fd = (int)syscall(SYS_memfd_create, name, 3u /* MFD_CLOEXEC | MFD_ALLOW_SEALING */);
    if (w->fd < 0 || ftruncate(w->fd, (off_t)bytes) != 0 || fcntl(w->fd, F_ADD_SEALS, _DDP_SHM_SEALS) != 0 ||
        (m = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, w->fd, 0)) == MAP_FAILED) {
        ddp_result_t r = ddp_transport_fail(ctx, errno == ENOMEM ? DDP_ERR_OUT_OF_MEMORY : DDP_ERR_SYSTEM,
                                            "shm window: a sealed memfd of %zu bytes: %s", bytes, strerror(errno));
        if (w->fd >= 0) close(w->fd);
        ddp_transport_free(ctx, w->base);
        ddp_transport_free(ctx, w);
        return r;
    }
    w->base[ctx->rank] = (unsigned char *)m;
    slot->serial = w->serial;
    slot->bytes = bytes;
    slot->comm_id = ctx->comm_id;
    slot->fd = w->fd;
    w->next = ws->head;
    ws->head = w;
    *out = w;
    return DDP_SUCCESS;
}

/* Maps rank q's window w (process pid, the kernel's word; its published slot). 0 and a
 * reason in why when it cannot (nothing mapped then). */
_DDP_PRIVATE int _ddp_shm_win_map_peer(const ddp_transport_ctx_t *ctx, _ddp_shm_win_t *w, int q, int pid,
                                       const _ddp_shm_win_slot_t *slot, char *why, size_t cap) {
    char path[64], link[128], want[64];
    struct stat st;
    int fd, seals;
    ssize_t n;
    void *m;
    _ddp_shm_win_slot_t s;
    memcpy(&s, slot, sizeof s);
    if (s.serial != w->serial || s.bytes != w->bytes || s.comm_id != ctx->comm_id || s.fd < 0) {
        snprintf(why, cap, "rank %d published window %llu of %llu bytes, this rank expects window %llu "
                 "of %zu bytes", q, (unsigned long long)s.serial, (unsigned long long)s.bytes,
                 (unsigned long long)w->serial, w->bytes);
        return 0;
    }
    snprintf(path, sizeof path, "/proc/%d/fd/%d", pid, (int)s.fd);
    fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0) {
        snprintf(why, cap, "rank %d's window: open %s: %s", q, path, strerror(errno));
        return 0;
    }
    /* Its name says what it is ("/memfd:NAME (deleted)"): this communicator's window `serial`. */
    n = readlink(path, link, sizeof link - 1);
    link[n > 0 ? n : 0] = 0;
    snprintf(want, sizeof want, "/memfd:ddp-win.%016llx.%llu ", (unsigned long long)ctx->comm_id,
             (unsigned long long)w->serial);
    seals = fcntl(fd, F_GET_SEALS);
    if (strncmp(link, want, strlen(want)) != 0 || fstat(fd, &st) != 0 || (uint64_t)st.st_size != w->bytes ||
        seals < 0 || (seals & _DDP_SHM_SEALS) != _DDP_SHM_SEALS) {
        snprintf(why, cap, "rank %d's window is not a sealed memfd of %zu bytes of this communicator "
                 "(%s, seals %#x)", q, w->bytes, link, (unsigned)(seals < 0 ? 0 : seals));
        close(fd);
        return 0;
    }
    m = mmap(NULL, w->bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (m == MAP_FAILED) {
        snprintf(why, cap, "rank %d's window: mmap of %zu bytes: %s", q, w->bytes, strerror(errno));
        return 0;
    }
    w->base[q] = (unsigned char *)m;
    return 1;
}

/* Unmaps the peers' windows (ours stays: the memory works staged). */
_DDP_PRIVATE void _ddp_shm_win_unmap_peers(const ddp_transport_ctx_t *ctx, _ddp_shm_win_t *w) {
    int q;
    for (q = 0; q < ctx->nranks; q++)
        if (q != ctx->rank && w->base[q]) { munmap(w->base[q], w->bytes); w->base[q] = NULL; }
}

_DDP_PRIVATE void _ddp_shm_win_destroy(const ddp_transport_ctx_t *ctx, _ddp_shm_wins_t *ws, _ddp_shm_win_t *w) {
    _ddp_shm_win_t **pp;
    for (pp = &ws->head; *pp; pp = &(*pp)->next)
        if (*pp == w) { *pp = w->next; break; }
    if (w->usable) ws->nusable--;
    _ddp_shm_win_unmap_peers(ctx, w);
    if (w->base[ctx->rank]) munmap(w->base[ctx->rank], w->bytes);
    close(w->fd);
    ddp_transport_free(ctx, w->base);
    ddp_transport_free(ctx, w);
}

_DDP_PRIVATE void _ddp_shm_wins_release(const ddp_transport_ctx_t *ctx, _ddp_shm_wins_t *ws) {
    while (ws->head) _ddp_shm_win_destroy(ctx, ws, ws->head);
    ddp_transport_free(ctx, ws->src);
    ddp_transport_free(ctx, ws->dst);
    ws->src = NULL;
    ws->dst = NULL;
}

/* The usable window holding [p, p + len) of this rank's memory: its serial and p's offset in
 * it; serial 0 when there is none (len 0 counts as not registered). */
static inline void _ddp_shm_win_find(const _ddp_shm_wins_t *ws, int rank, const void *p, size_t len,
                                     uint64_t *serial, uint64_t *off) {
    const _ddp_shm_win_t *w;
    uintptr_t a = (uintptr_t)p;
    *serial = 0;
    *off = 0;
    if (!len) return;
    for (w = ws->head; w; w = w->next) {
        uintptr_t b = (uintptr_t)w->base[rank];
        if (w->usable && a >= b && a - b <= w->bytes && len <= w->bytes - (a - b)) {
            *serial = w->serial;
            *off = a - b;
            return;
        }
    }
}

/* Rank q's buffer of len bytes at (serial, off), as mapped here, or NULL (serial 0, unknown, or
 * out of bounds: a rank cannot make another read outside a window). */
static inline unsigned char *_ddp_shm_win_at(const _ddp_shm_wins_t *ws, int q, uint64_t serial,
                                             uint64_t off, size_t len) {
    const _ddp_shm_win_t *w;
    if (!serial) return NULL;
    for (w = ws->head; w; w = w->next)
        if (w->serial == serial)
            return w->usable && w->base[q] && off <= w->bytes && len <= w->bytes - off ? w->base[q] + off : NULL;
    return NULL;
}

#endif /* DDP_SHM_WINDOW implementation */
