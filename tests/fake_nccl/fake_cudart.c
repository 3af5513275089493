/* SPDX-License-Identifier: MIT (see LICENSE) */
/* tests/fake_nccl/fake_cudart.c — a fake CUDA runtime (soname libcudart.so.13) for machines
 * without a GPU. transports/ddp_nccl.h dlopens it (DDP_CUDART_LIBRARY) instead of the real one,
 * and the fake NCCL (fake_nccl.c) links against it.
 *
 * THE MODEL
 *   Devices    FAKE_CUDA_DEVICES (read at load; default 1, at most 64) devices. With 0,
 *              cudaGetDeviceCount returns cudaErrorNoDevice and so does every call that needs a
 *              device. cudaSetDevice/cudaGetDevice keep a current device per host thread.
 *   Memory     cudaMalloc maps a memfd twice: the address returned is PROT_NONE, so host code
 *              that dereferences a device pointer crashes (SIGSEGV) instead of passing by luck;
 *              the second, read-write mapping (the "shadow") is what cudaMemcpy, cudaMemset and
 *              the fake NCCL touch, found through a thread-safe table of allocations
 *              (fake_cuda_shadow). Without memfd the two mappings are an anonymous PROT_NONE
 *              reservation plus separate anonymous memory: device pointers stay unreadable.
 *              FAKE_CUDA_HOST_VISIBLE=1 maps the device view read-write too (a debugging aid:
 *              does a crash go away when the host may read device memory?). Any pointer inside
 *              an allocation is "device" (cudaPointerGetAttributes type 2); anything else is
 *              unregistered host memory (type 0, success, as CUDA >= 11 says).
 *   Streams    Every stream is a worker thread that runs its queue later, in order. The legacy
 *              default stream (NULL, cudaStreamLegacy, cudaStreamPerThread: one per device,
 *              started on first use) follows CUDA's rules: its work waits for everything enqueued
 *              before on the device's blocking streams, and their later work waits for its
 *              earlier work; cudaStreamNonBlocking streams are independent. A stream created
 *              after FAKE_CUDA_STREAM_DELAY_US=N is set sleeps N us before each work item (copies,
 *              memsets, collectives), so a caller that reads results without synchronising sees
 *              stale data. Host pointers given to async copies are read and written when the
 *              copy runs, not when it is enqueued.
 *   Copies     cudaMemcpy and cudaMemset are work on the legacy stream, with the weakest host
 *              synchronisation CUDA documents (runtime API, "API synchronization behavior"; all
 *              host memory is pageable here): host to device performs a stream sync (waits for
 *              the legacy stream's earlier work), copies the source into staging memory, and
 *              returns; the write to the device lands later, like any work item, so a
 *              non-blocking stream that does not wait for the legacy stream may read the old
 *              data. Device to host returns once the copy is complete. Device to device and
 *              cudaMemset of device memory return once enqueued. Host to host is a plain memmove.
 *              Staging is capped at 1 GiB in flight per device (then the call waits for earlier
 *              copies to land) and freed when the copy lands; cudaFree waits for it like any
 *              work. FAKE_CUDA_SYNC_COPIES=1 (read at load) makes every cudaMemcpy and cudaMemset
 *              wait for the legacy stream, as this fake did before: a way to tell whether a
 *              failure is a missing synchronisation after a copy.
 *   Events     cudaEventRecord enqueues a marker; an event is complete once every stream has
 *              reached its latest record (never recorded: complete, as in CUDA).
 *              cudaStreamWaitEvent enqueues a wait for that record. Implicit legacy-stream
 *              ordering and the synchronising calls are built from hidden events.
 *   Frees      cudaFree first waits for the work enqueued before it on the allocation's device
 *              (CUDA's cudaFree synchronises), then unmaps both views.
 *   Errors     Failing calls set the calling thread's last error (cudaGetLastError returns and
 *              clears it, cudaPeekAtLastError only returns it); cudaErrorNotReady is not an
 *              error and is not recorded, as in CUDA. Bad handles: cudaErrorInvalidResourceHandle;
 *              bad arguments: cudaErrorInvalidValue; a copy kind that disagrees with the
 *              pointers: cudaErrorInvalidMemcpyDirection.
 *   Lifetime   A destroyed stream's worker finishes the queue and exits; it is joined by the next
 *              cudaStreamCreate/cudaStreamDestroy or at unload. The unload destructor drains and
 *              joins every worker and frees everything, so no thread of ours outlives dlclose.
 *   fork()     CUDA is not fork-safe; the fake is friendlier: a child starts with no streams,
 *              events or allocations (the parent's are parked, never touched: their threads do
 *              not exist in the child, and their memory is shared with the parent).
 *   Caveat     The legacy stream's implicit ordering, cudaDeviceSynchronize and cudaFree act on
 *              the whole device, as on a GPU. Ranks that are threads of one process and share
 *              one fake device therefore wait for each other's streams there: give each rank its
 *              own device (FAKE_CUDA_DEVICES=N and cudaSetDevice(rank)) or use only
 *              cudaStreamNonBlocking streams and no synchronous calls while a collective of a
 *              peer is pending.
 *
 * Extensions for the fake NCCL and the selftest are declared in fake_cuda.h. Written from the
 * public CUDA runtime documentation; no CUDA header is included.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "fake_cuda.h"

#define API FAKE_EXPORT
#define MAX_DEVICES 64
#define MAX_ALLOC_BYTES ((size_t)16 << 30)   /* one allocation; pages are used only as touched */
#define STAGING_CAP ((size_t)1 << 30)        /* staged host->device bytes in flight, per device */

/* Enum values from driver_types.h that only the runtime needs. */
enum { cudaErrorInitializationError = 3, cudaErrorIllegalAddress = 700 };
enum { MEMCPY_H2H = 0, MEMCPY_H2D = 1, MEMCPY_D2H = 2, MEMCPY_D2D = 3, MEMCPY_DEFAULT = 4 };
enum { STREAM_NON_BLOCKING = 0x1 };
enum { MEMORY_UNREGISTERED = 0, MEMORY_DEVICE = 2 };
#define INVALID_DEVICE_ID (-2)               /* cudaInvalidDeviceId */

/* Same layout as CUDA's struct cudaPointerAttributes. */
struct cudaPointerAttributes {
    int type;
    int device;
    void *devicePointer;
    void *hostPointer;
    long reserved[8];
};

/* ---------------------------------------------------------------- state */

/* An event: user-visible (a handle in g.events) or hidden (implicit ordering, synchronising
 * calls). Freed when the last reference goes: its handle, pending markers, pending waits. */
struct event {
    struct event *next;
    int refs;
    uint64_t recorded;   /* records issued; the latest one is what queries and waits mean */
    uint64_t reached;    /* highest record number a stream has run past (or count of ticks) */
};

enum item_kind {
    ITEM_WORK,     /* fn(arg), after the stream's delay */
    ITEM_MARKER,   /* ev->reached = max(ev->reached, n): an event record */
    ITEM_TICK,     /* ev->reached++: one of several streams a synchronising call waits for */
    ITEM_WAIT      /* block the stream until ev->reached >= n */
};

struct item {
    struct item *next;
    enum item_kind kind;
    void (*fn)(void *);
    void *arg;
    struct event *ev;
    uint64_t n;
};

struct stream {
    struct stream *next;     /* g.streams */
    int device;
    int legacy;              /* the device's legacy default stream */
    int blocking;            /* created without cudaStreamNonBlocking (not the legacy stream) */
    int live;                /* the handle is valid */
    long delay_us;
    struct item *head, *tail;
    uint64_t enqueued, completed;
    pthread_cond_t work_cv;  /* the worker waits here for work (with g.mu) */
    pthread_t thread;
    int thread_started, stopping, exited;
};

struct alloc {
    char *base;              /* what cudaMalloc returned: PROT_NONE */
    char *shadow;            /* the same pages, read-write */
    size_t size, map_len;
    int device;
};

static struct {
    pthread_mutex_t mu;          /* streams, queues, events */
    pthread_cond_t progress;     /* broadcast whenever a stream completes an item */
    struct stream *streams;      /* live streams and destroyed ones still draining */
    struct stream *legacy[MAX_DEVICES];
    struct event *events;        /* user events with a live handle */
    pthread_rwlock_t alloc_lock; /* the allocation table: sorted by base */
    struct alloc *allocs;
    size_t nallocs, cap;
    int ndevices;
    int host_visible;
    int sync_copies;             /* FAKE_CUDA_SYNC_COPIES=1: the pre-staging behaviour */
    size_t staged[MAX_DEVICES];  /* bytes of staged host->device copies not yet landed (g.mu) */
    /* What a forked child inherited: kept reachable, never touched again. */
    struct stream *parked_streams;
    struct event *parked_events;
    struct alloc *parked_allocs;
} g = {
    .mu = PTHREAD_MUTEX_INITIALIZER,
    .progress = PTHREAD_COND_INITIALIZER,
    .alloc_lock = PTHREAD_RWLOCK_INITIALIZER,
    .ndevices = 1,
};

static _Thread_local int tl_device;
static _Thread_local int tl_last_error;

/* ---------------------------------------------------------------- small helpers */

static long env_long(const char *name, long def, long lo, long hi) {
    const char *s = getenv(name);
    char *end;
    long v;
    if (!s || !*s) return def;
    errno = 0;
    v = strtol(s, &end, 10);
    if (errno || *end) return def;
    return v < lo ? lo : v > hi ? hi : v;
}

static void sleep_us(long us) {
    struct timespec ts;
    ts.tv_sec = us / 1000000;
    ts.tv_nsec = (us % 1000000) * 1000;
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {}
}

/* Every public call returns through here: CUDA records failures as the thread's last error,
 * but cudaErrorNotReady is a status, not an error. */
static int ret(int err) {
    if (err != FAKE_cudaSuccess && err != FAKE_cudaErrorNotReady) tl_last_error = err;
    return err;
}

static int need_device(void) {
    return g.ndevices > 0 ? FAKE_cudaSuccess : FAKE_cudaErrorNoDevice;
}

/* ---------------------------------------------------------------- events (g.mu held) */

static struct event *event_new(int refs) {
    struct event *e = calloc(1, sizeof *e);
    if (e) e->refs = refs;
    return e;
}

static void event_unref(struct event *e) {
    if (--e->refs == 0) free(e);
}

static struct event *event_find(void *h) {
    struct event *e;
    if (!h) return NULL;
    for (e = g.events; e; e = e->next)
        if (e == h) return e;
    return NULL;
}

static struct item *item_new(enum item_kind kind, struct event *ev, uint64_t n) {
    struct item *it = calloc(1, sizeof *it);
    if (!it) return NULL;
    it->kind = kind;
    it->ev = ev;
    it->n = n;
    return it;
}

/* ---------------------------------------------------------------- stream workers */

/* Runs an item outside g.mu: work, or a wait for an event. What an item marks (an event
 * reached) is marked by the worker under g.mu together with the stream's completion count, so a
 * caller woken by the mark never sees the item still pending (cudaDeviceSynchronize, then
 * cudaStreamQuery on the same stream, must say idle). */
static void run_item(struct stream *s, struct item *it) {
    (void)s;
    if (it->kind == ITEM_WORK) {
        it->fn(it->arg);
        return;
    }
    if (it->kind == ITEM_MARKER || it->kind == ITEM_TICK) return;
    pthread_mutex_lock(&g.mu);
    while (it->ev->reached < it->n) pthread_cond_wait(&g.progress, &g.mu);
    pthread_mutex_unlock(&g.mu);
}

/* The item's mark and its event reference (g.mu held). */
static void finish_item(struct item *it) {
    if (it->kind == ITEM_WORK) return;
    if (it->kind == ITEM_MARKER) {
        if (it->n > it->ev->reached) it->ev->reached = it->n;
    } else if (it->kind == ITEM_TICK) {
        it->ev->reached++;
    }
    event_unref(it->ev);
}

static void *stream_worker(void *arg) {
    struct stream *s = arg;
    pthread_setname_np(pthread_self(), s->legacy ? "fake-cuda-dflt" : "fake-cuda-strm");
    pthread_mutex_lock(&g.mu);
    for (;;) {
        struct item *it;
        while (!s->head && !s->stopping) pthread_cond_wait(&s->work_cv, &g.mu);
        it = s->head;
        if (!it) break;                       /* stopping, and the queue is drained */
        if (it->kind == ITEM_WORK && s->delay_us > 0) {
            /* Late, with the item still queued; taking it under g.mu afterwards orders it after
             * whatever other streams finished meanwhile (ThreadSanitizer then sees a read that a
             * late write missed as what it is: earlier, not a data race). */
            pthread_mutex_unlock(&g.mu);
            sleep_us(s->delay_us);
            pthread_mutex_lock(&g.mu);
        }
        s->head = it->next;
        if (!s->head) s->tail = NULL;
        pthread_mutex_unlock(&g.mu);
        run_item(s, it);
        pthread_mutex_lock(&g.mu);
        finish_item(it);
        free(it);
        s->completed++;
        pthread_cond_broadcast(&g.progress);
    }
    s->exited = 1;
    pthread_cond_broadcast(&g.progress);
    pthread_mutex_unlock(&g.mu);
    return NULL;
}

/* The worker is started with every signal blocked, so that signals meant for the application
 * (SIGALRM, SIGINT, ...) are never delivered on our threads. */
static int stream_start_worker(struct stream *s) {
    sigset_t all, old;
    int rc;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    rc = pthread_create(&s->thread, NULL, stream_worker, s);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc != 0) return FAKE_cudaErrorMemoryAllocation;
    s->thread_started = 1;
    return FAKE_cudaSuccess;
}

/* Append without the legacy-stream rules (g.mu held). Workers start lazily, on first work. */
static int stream_push(struct stream *s, struct item *it) {
    if (!s->thread_started) {
        int err = stream_start_worker(s);
        if (err) return err;
    }
    it->next = NULL;
    if (s->tail) s->tail->next = it;
    else s->head = it;
    s->tail = it;
    s->enqueued++;
    pthread_cond_signal(&s->work_cv);
    return FAKE_cudaSuccess;
}

static int stream_pending(const struct stream *s) {
    return s->enqueued > s->completed;
}

/* Make `to`'s next item wait for everything enqueued on `from` so far: a hidden event recorded
 * on `from` and waited for on `to`. Every such edge points from earlier-enqueued work to later
 * work, so the edges can never form a cycle. */
static int stream_chain(struct stream *from, struct stream *to) {
    struct event *ev = event_new(2);   /* one reference for the marker, one for the wait */
    struct item *mark = item_new(ITEM_MARKER, ev, 1), *wait = item_new(ITEM_WAIT, ev, 1);
    int err = FAKE_cudaErrorMemoryAllocation;
    if (!ev || !mark || !wait) goto fail;
    ev->recorded = 1;
    if ((err = stream_push(from, mark)) != 0) goto fail;
    if ((err = stream_push(to, wait)) != 0) {
        /* The marker still runs and drops its reference; drop the waiter's. */
        free(wait);
        event_unref(ev);
        return err;
    }
    return FAKE_cudaSuccess;
fail:
    free(ev);
    free(mark);
    free(wait);
    return err;
}

/* CUDA's legacy default stream rules, applied before `s` gets a new item (g.mu held). */
static int stream_add_implicit_waits(struct stream *s) {
    struct stream *b;
    int err;
    if (s->legacy) {
        for (b = g.streams; b; b = b->next)
            if (b != s && b->blocking && b->device == s->device && stream_pending(b))
                if ((err = stream_chain(b, s)) != 0) return err;
    } else if (s->blocking) {
        struct stream *l = g.legacy[s->device];
        if (l && stream_pending(l)) return stream_chain(l, s);
    }
    return FAKE_cudaSuccess;
}

/* Append user-visible work (g.mu held). */
static int stream_enqueue(struct stream *s, struct item *it) {
    int err = stream_add_implicit_waits(s);
    return err ? err : stream_push(s, it);
}

static struct stream *stream_new(int device, int legacy, int blocking) {
    struct stream *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->device = device;
    s->legacy = legacy;
    s->blocking = blocking;
    s->live = 1;
    s->delay_us = env_long("FAKE_CUDA_STREAM_DELAY_US", 0, 0, 60L * 1000000L);
    pthread_cond_init(&s->work_cv, NULL);
    s->next = g.streams;
    g.streams = s;
    return s;
}

static int is_legacy_handle(const void *h) {
    return h == NULL || h == (void *)0x1 || h == (void *)0x2;
}

/* A handle to its stream (g.mu held); the legacy stream of the current device is created on
 * first use. */
static int stream_resolve(void *h, struct stream **out) {
    struct stream *s;
    int err = need_device();
    if (err) return err;
    if (is_legacy_handle(h)) {
        if (!g.legacy[tl_device]) {
            g.legacy[tl_device] = stream_new(tl_device, 1, 0);
            if (!g.legacy[tl_device]) return FAKE_cudaErrorMemoryAllocation;
        }
        *out = g.legacy[tl_device];
        return FAKE_cudaSuccess;
    }
    for (s = g.streams; s; s = s->next)
        if (s == h && s->live) {
            *out = s;
            return FAKE_cudaSuccess;
        }
    return FAKE_cudaErrorInvalidResourceHandle;
}

/* Join and free destroyed streams whose worker has finished. Never joins the calling thread
 * (a work item that destroys its own stream). */
static void streams_reap(void) {
    struct stream **pp, *dead = NULL, *s;
    pthread_mutex_lock(&g.mu);
    for (pp = &g.streams; (s = *pp) != NULL;) {
        int done = !s->live && (s->exited || !s->thread_started);
        if (done && s->thread_started && pthread_equal(s->thread, pthread_self())) done = 0;
        if (done) {
            *pp = s->next;
            s->next = dead;
            dead = s;
        } else {
            pp = &s->next;
        }
    }
    pthread_mutex_unlock(&g.mu);
    while ((s = dead) != NULL) {
        dead = s->next;
        if (s->thread_started) pthread_join(s->thread, NULL);
        pthread_cond_destroy(&s->work_cv);
        free(s);
    }
}

/* Wait until the streams of `device` (-1: every device) have run what was enqueued on them
 * before this call: one hidden "tick" per stream with pending work (g.mu held). */
static int streams_wait(int device) {
    struct stream *s;
    struct event *ev = event_new(1);
    uint64_t want = 0;
    int err = FAKE_cudaSuccess;
    if (!ev) return FAKE_cudaErrorMemoryAllocation;
    for (s = g.streams; s; s = s->next) {
        struct item *tick;
        if ((device >= 0 && s->device != device) || !stream_pending(s)) continue;
        if (!(tick = item_new(ITEM_TICK, ev, 0))) { err = FAKE_cudaErrorMemoryAllocation; break; }
        ev->refs++;
        if ((err = stream_push(s, tick)) != 0) { ev->refs--; free(tick); break; }
        want++;
    }
    while (ev->reached < want) pthread_cond_wait(&g.progress, &g.mu);
    event_unref(ev);
    return err;
}

/* Wait until `s` has run what was enqueued on it before this call (g.mu held). On the legacy
 * stream the marker obeys the implicit rules, so it also waits for the blocking streams. */
static int stream_wait_idle(struct stream *s) {
    struct event *ev;
    struct item *mark;
    int err;
    if (!s->legacy && !stream_pending(s)) return FAKE_cudaSuccess;
    if (!(ev = event_new(2))) return FAKE_cudaErrorMemoryAllocation;   /* the marker's, ours */
    if (!(mark = item_new(ITEM_MARKER, ev, 1))) { free(ev); return FAKE_cudaErrorMemoryAllocation; }
    ev->recorded = 1;
    err = s->legacy ? stream_enqueue(s, mark) : stream_push(s, mark);
    if (err) {
        free(mark);
        free(ev);
        return err;
    }
    while (ev->reached < 1) pthread_cond_wait(&g.progress, &g.mu);
    event_unref(ev);
    return FAKE_cudaSuccess;
}

/* ---------------------------------------------------------------- the allocation table */

/* Index of the allocation containing p, or -1 (alloc_lock held). */
static long alloc_index(const void *p) {
    size_t lo = 0, hi = g.nallocs;
    uintptr_t a = (uintptr_t)p;
    while (lo < hi) {                /* the last allocation whose base <= p */
        size_t mid = lo + (hi - lo) / 2;
        if ((uintptr_t)g.allocs[mid].base <= a) lo = mid + 1;
        else hi = mid;
    }
    if (lo == 0) return -1;
    lo--;
    return a - (uintptr_t)g.allocs[lo].base < g.allocs[lo].size ? (long)lo : -1;
}

static int alloc_insert(const struct alloc *a) {
    size_t i;
    if (g.nallocs == g.cap) {
        size_t cap = g.cap ? g.cap * 2 : 64;
        struct alloc *n = realloc(g.allocs, cap * sizeof *n);
        if (!n) return FAKE_cudaErrorMemoryAllocation;
        g.allocs = n;
        g.cap = cap;
    }
    for (i = g.nallocs; i > 0 && g.allocs[i - 1].base > a->base; i--) g.allocs[i] = g.allocs[i - 1];
    g.allocs[i] = *a;
    g.nallocs++;
    return FAKE_cudaSuccess;
}

/* Two views of the same pages: the device address (PROT_NONE unless FAKE_CUDA_HOST_VISIBLE)
 * and the shadow. memfd_create may be missing (old kernels, seccomp): then an anonymous
 * reservation stands in for the device view, and device pointers are still unreadable. */
static int alloc_map(struct alloc *a) {
    int prot = g.host_visible ? PROT_READ | PROT_WRITE : PROT_NONE;
    int fd = memfd_create("fake-cuda-device-memory", MFD_CLOEXEC);
    if (fd >= 0) {
        if (ftruncate(fd, (off_t)a->map_len) == 0) {
            a->base = mmap(NULL, a->map_len, prot, MAP_SHARED, fd, 0);
            a->shadow = mmap(NULL, a->map_len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        } else {
            a->base = a->shadow = MAP_FAILED;
        }
        close(fd);
    } else {
        a->base = mmap(NULL, a->map_len, prot, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        a->shadow = mmap(NULL, a->map_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    }
    if (a->base != MAP_FAILED && a->shadow != MAP_FAILED) return FAKE_cudaSuccess;
    if (a->base != MAP_FAILED) munmap(a->base, a->map_len);
    if (a->shadow != MAP_FAILED) munmap(a->shadow, a->map_len);
    return FAKE_cudaErrorMemoryAllocation;
}

static void alloc_unmap(const struct alloc *a) {
    munmap(a->base, a->map_len);
    munmap(a->shadow, a->map_len);
}

API void *fake_cuda_shadow(const void *ptr, size_t bytes) {
    void *shadow = NULL;
    long i;
    pthread_rwlock_rdlock(&g.alloc_lock);
    i = alloc_index(ptr);
    if (i >= 0) {
        const struct alloc *a = &g.allocs[i];
        size_t off = (size_t)((const char *)ptr - a->base);
        if (bytes <= a->size - off) shadow = a->shadow + off;
    }
    pthread_rwlock_unlock(&g.alloc_lock);
    return shadow;
}

/* The device of the allocation containing p, or -1. */
static int alloc_device(const void *p) {
    int dev = -1;
    long i;
    pthread_rwlock_rdlock(&g.alloc_lock);
    if ((i = alloc_index(p)) >= 0) dev = g.allocs[i].device;
    pthread_rwlock_unlock(&g.alloc_lock);
    return dev;
}

/* ---------------------------------------------------------------- library load / unload / fork */

/* The allocation table is held with a read lock across fork(): that keeps writers out, and,
 * unlike a write lock (glibc records the writer's TID, which the child does not share), the
 * child can release it. */
static void fork_prepare(void) {
    pthread_mutex_lock(&g.mu);
    pthread_rwlock_rdlock(&g.alloc_lock);
}

static void fork_parent(void) {
    pthread_rwlock_unlock(&g.alloc_lock);
    pthread_mutex_unlock(&g.mu);
}

/* The child has only the forking thread: park the parent's objects (their workers do not exist
 * here, and device memory is MAP_SHARED with the parent) and start empty. */
static void fork_child(void) {
    struct stream *s;
    int d;
    while ((s = g.streams) != NULL) {
        g.streams = s->next;
        s->next = g.parked_streams;
        g.parked_streams = s;
    }
    for (d = 0; d < MAX_DEVICES; d++) {
        g.legacy[d] = NULL;
        g.staged[d] = 0;        /* the parent's staged copies are parked with its streams */
    }
    if (g.events) {
        struct event *last = g.events;
        while (last->next) last = last->next;
        last->next = g.parked_events;
        g.parked_events = g.events;
        g.events = NULL;
    }
    if (g.allocs) {
        /* One array is parked at a time; an older one (a fork of a fork) is freed, it is ours. */
        free(g.parked_allocs);
        g.parked_allocs = g.allocs;
        g.allocs = NULL;
        g.nallocs = g.cap = 0;
    }
    /* fork_prepare's locks are ours (this is the forking thread); waiters on the condition
     * variable died with their threads, so it starts afresh. */
    pthread_cond_init(&g.progress, NULL);
    pthread_rwlock_unlock(&g.alloc_lock);
    pthread_mutex_unlock(&g.mu);
}

__attribute__((constructor)) static void fake_cudart_load(void) {
    g.ndevices = (int)env_long("FAKE_CUDA_DEVICES", 1, 0, MAX_DEVICES);
    g.host_visible = env_long("FAKE_CUDA_HOST_VISIBLE", 0, 0, 1) != 0;
    g.sync_copies = env_long("FAKE_CUDA_SYNC_COPIES", 0, 0, 1) != 0;
    pthread_atfork(fork_prepare, fork_parent, fork_child);
}

/* Drain every stream, join every worker, free everything we own. The fake NCCL's destructor
 * runs first (it depends on us) and aborts its communicators, so no item blocks forever. */
__attribute__((destructor)) static void fake_cudart_unload(void) {
    struct stream *s, *list;
    struct event *e;
    size_t i;
    pthread_mutex_lock(&g.mu);
    for (s = g.streams; s; s = s->next) {
        s->live = 0;
        s->stopping = 1;
        pthread_cond_signal(&s->work_cv);
    }
    list = g.streams;
    pthread_mutex_unlock(&g.mu);
    for (s = list; s; s = s->next)
        if (s->thread_started) pthread_join(s->thread, NULL);
    pthread_mutex_lock(&g.mu);
    while ((s = g.streams) != NULL) {
        g.streams = s->next;
        pthread_cond_destroy(&s->work_cv);
        free(s);
    }
    memset(g.legacy, 0, sizeof g.legacy);
    while ((e = g.events) != NULL) {
        g.events = e->next;
        free(e);
    }
    pthread_mutex_unlock(&g.mu);
    pthread_rwlock_wrlock(&g.alloc_lock);
    for (i = 0; i < g.nallocs; i++) alloc_unmap(&g.allocs[i]);
    free(g.allocs);
    g.allocs = NULL;
    g.nallocs = g.cap = 0;
    pthread_rwlock_unlock(&g.alloc_lock);
}

/* ---------------------------------------------------------------- extensions (fake_cuda.h) */

API int fake_cuda_enqueue(void *stream, void (*fn)(void *arg), void *arg) {
    struct stream *s;
    struct item *it;
    int err;
    if (!fn) return ret(FAKE_cudaErrorInvalidValue);
    if (!(it = item_new(ITEM_WORK, NULL, 0))) return ret(FAKE_cudaErrorMemoryAllocation);
    it->fn = fn;
    it->arg = arg;
    pthread_mutex_lock(&g.mu);
    err = stream_resolve(stream, &s);
    if (!err) err = stream_enqueue(s, it);
    pthread_mutex_unlock(&g.mu);
    if (err) free(it);
    return ret(err);
}

API int fake_cuda_stream_check(void *stream) {
    struct stream *s;
    int err;
    pthread_mutex_lock(&g.mu);
    err = stream_resolve(stream, &s);
    pthread_mutex_unlock(&g.mu);
    return err;
}

API void fake_cuda_quiesce(void) {
    pthread_mutex_lock(&g.mu);
    streams_wait(-1);
    pthread_mutex_unlock(&g.mu);
}

/* ---------------------------------------------------------------- devices, versions, errors */

API int cudaGetDeviceCount(int *count) {
    if (!count) return ret(FAKE_cudaErrorInvalidValue);
    *count = g.ndevices;
    return ret(need_device());
}

API int cudaSetDevice(int device) {
    int err = need_device();
    if (err) return ret(err);
    if (device < 0 || device >= g.ndevices) return ret(FAKE_cudaErrorInvalidDevice);
    tl_device = device;
    return FAKE_cudaSuccess;
}

API int cudaGetDevice(int *device) {
    int err = need_device();
    if (!device) return ret(FAKE_cudaErrorInvalidValue);
    if (err) return ret(err);
    *device = tl_device;
    return FAKE_cudaSuccess;
}

API int cudaRuntimeGetVersion(int *version) {
    if (!version) return ret(FAKE_cudaErrorInvalidValue);
    *version = 13000;
    return FAKE_cudaSuccess;
}

API int cudaDriverGetVersion(int *version) {
    if (!version) return ret(FAKE_cudaErrorInvalidValue);
    *version = 13000;
    return FAKE_cudaSuccess;
}

API int cudaGetLastError(void) {
    int err = tl_last_error;
    tl_last_error = FAKE_cudaSuccess;
    return err;
}

API int cudaPeekAtLastError(void) {
    return tl_last_error;
}

static const struct {
    int code;
    const char *name, *text;
} error_table[] = {
    {FAKE_cudaSuccess, "cudaSuccess", "no error"},
    {FAKE_cudaErrorInvalidValue, "cudaErrorInvalidValue", "invalid argument"},
    {FAKE_cudaErrorMemoryAllocation, "cudaErrorMemoryAllocation", "out of memory"},
    {cudaErrorInitializationError, "cudaErrorInitializationError", "initialization error"},
    {FAKE_cudaErrorInvalidDevicePointer, "cudaErrorInvalidDevicePointer", "invalid device pointer"},
    {FAKE_cudaErrorInvalidMemcpyDirection, "cudaErrorInvalidMemcpyDirection",
     "invalid copy direction for memcpy"},
    {FAKE_cudaErrorNoDevice, "cudaErrorNoDevice", "no CUDA-capable device is detected"},
    {FAKE_cudaErrorInvalidDevice, "cudaErrorInvalidDevice", "invalid device ordinal"},
    {FAKE_cudaErrorInvalidResourceHandle, "cudaErrorInvalidResourceHandle", "invalid resource handle"},
    {FAKE_cudaErrorNotReady, "cudaErrorNotReady", "device not ready"},
    {cudaErrorIllegalAddress, "cudaErrorIllegalAddress", "an illegal memory access was encountered"},
};

API const char *cudaGetErrorString(int error) {
    size_t i;
    for (i = 0; i < sizeof error_table / sizeof error_table[0]; i++)
        if (error_table[i].code == error) return error_table[i].text;
    return "unrecognized error code";
}

API const char *cudaGetErrorName(int error) {
    size_t i;
    for (i = 0; i < sizeof error_table / sizeof error_table[0]; i++)
        if (error_table[i].code == error) return error_table[i].name;
    return "cudaErrorUnknown";
}

/* ---------------------------------------------------------------- memory */

API int cudaMalloc(void **devPtr, size_t size) {
    struct alloc a;
    int err;
    if (!devPtr) return ret(FAKE_cudaErrorInvalidValue);
    if ((err = need_device()) != 0) return ret(err);
    *devPtr = NULL;
    if (size == 0) return FAKE_cudaSuccess;          /* CUDA: success, and a NULL pointer */
    if (size > MAX_ALLOC_BYTES) return ret(FAKE_cudaErrorMemoryAllocation);
    memset(&a, 0, sizeof a);
    a.size = size;
    a.map_len = (size + (size_t)sysconf(_SC_PAGESIZE) - 1) & ~((size_t)sysconf(_SC_PAGESIZE) - 1);
    a.device = tl_device;
    if ((err = alloc_map(&a)) != 0) return ret(err);
    pthread_rwlock_wrlock(&g.alloc_lock);
    err = alloc_insert(&a);
    pthread_rwlock_unlock(&g.alloc_lock);
    if (err) {
        alloc_unmap(&a);
        return ret(err);
    }
    *devPtr = a.base;
    return FAKE_cudaSuccess;
}

API int cudaFree(void *devPtr) {
    struct alloc a;
    long i;
    int dev;
    if (!devPtr) return FAKE_cudaSuccess;             /* cudaFree(0) is a no-op */
    dev = alloc_device(devPtr);
    if (dev < 0) return ret(FAKE_cudaErrorInvalidValue);
    /* Work enqueued before the free may still use the memory. */
    pthread_mutex_lock(&g.mu);
    streams_wait(dev);
    pthread_mutex_unlock(&g.mu);
    pthread_rwlock_wrlock(&g.alloc_lock);
    i = alloc_index(devPtr);
    if (i < 0 || g.allocs[i].base != (char *)devPtr) {
        pthread_rwlock_unlock(&g.alloc_lock);
        return ret(FAKE_cudaErrorInvalidValue);      /* not the start of an allocation */
    }
    a = g.allocs[i];
    memmove(&g.allocs[i], &g.allocs[i + 1], (g.nallocs - (size_t)i - 1) * sizeof a);
    g.nallocs--;
    pthread_rwlock_unlock(&g.alloc_lock);
    alloc_unmap(&a);
    return FAKE_cudaSuccess;
}

API int cudaPointerGetAttributes(struct cudaPointerAttributes *attributes, const void *ptr) {
    long i;
    if (!attributes) return ret(FAKE_cudaErrorInvalidValue);
    memset(attributes, 0, sizeof *attributes);
    pthread_rwlock_rdlock(&g.alloc_lock);
    i = alloc_index(ptr);
    if (i >= 0) {
        attributes->type = MEMORY_DEVICE;
        attributes->device = g.allocs[i].device;
        attributes->devicePointer = (void *)ptr;
        attributes->hostPointer = g.host_visible ? (void *)ptr : NULL;
    } else {
        attributes->type = MEMORY_UNREGISTERED;
        attributes->device = INVALID_DEVICE_ID;
        attributes->hostPointer = (void *)ptr;
    }
    pthread_rwlock_unlock(&g.alloc_lock);
    return FAKE_cudaSuccess;
}

/* A copy or memset, run by a stream worker on shadow (or host) addresses. */
struct copy_work {
    char *dst;
    const char *src;     /* NULL: memset to value */
    size_t n;
    int value;
};

static void copy_run(void *arg) {
    struct copy_work *w = arg;
    if (w->src) memmove(w->dst, w->src, w->n);
    else memset(w->dst, w->value, w->n);
    free(w);
}

/* Where the worker must touch [p, p+n): the shadow of a device range, or p itself for host
 * memory. *is_device says which; a device pointer whose range runs past its allocation fails. */
static int resolve_range(const void *p, size_t n, char **where, int *is_device) {
    char *shadow;
    if (!p) return FAKE_cudaErrorInvalidValue;
    *is_device = fake_cuda_shadow(p, 0) != NULL;
    if (!*is_device) {
        *where = (char *)p;
        return FAKE_cudaSuccess;
    }
    if (!(shadow = fake_cuda_shadow(p, n))) return FAKE_cudaErrorInvalidValue;
    *where = shadow;
    return FAKE_cudaSuccess;
}

/* Validate a copy, and build its work item. An explicit kind must agree with the pointers, so a
 * library bug that passes the wrong direction (or a host pointer as device) is an error here
 * instead of a silent success. */
static int copy_prepare(void *dst, const void *src, size_t count, int kind, struct copy_work **out, int *dir) {
    struct copy_work *w;
    int dst_dev, src_dev, err;
    char *d, *s;
    *out = NULL;
    if (kind < MEMCPY_H2H || kind > MEMCPY_DEFAULT) return FAKE_cudaErrorInvalidMemcpyDirection;
    if (count == 0) return FAKE_cudaSuccess;
    if ((err = resolve_range(dst, count, &d, &dst_dev)) != 0) return err;
    if ((err = resolve_range(src, count, &s, &src_dev)) != 0) return err;
    if (kind != MEMCPY_DEFAULT) {
        int want_src_dev = kind == MEMCPY_D2H || kind == MEMCPY_D2D;
        int want_dst_dev = kind == MEMCPY_H2D || kind == MEMCPY_D2D;
        if (src_dev != want_src_dev || dst_dev != want_dst_dev) return FAKE_cudaErrorInvalidMemcpyDirection;
    }
    *dir = src_dev ? (dst_dev ? MEMCPY_D2D : MEMCPY_D2H) : (dst_dev ? MEMCPY_H2D : MEMCPY_H2H);
    if (!(w = calloc(1, sizeof *w))) return FAKE_cudaErrorMemoryAllocation;
    w->dst = d;
    w->src = s;
    w->n = count;
    *out = w;
    return FAKE_cudaSuccess;
}

static int memset_prepare(void *devPtr, int value, size_t count, struct copy_work **out) {
    struct copy_work *w;
    char *shadow;
    *out = NULL;
    if (!devPtr) return FAKE_cudaErrorInvalidValue;
    if (count == 0) return FAKE_cudaSuccess;
    if (!(shadow = fake_cuda_shadow(devPtr, count))) return FAKE_cudaErrorInvalidValue;
    if (!(w = calloc(1, sizeof *w))) return FAKE_cudaErrorMemoryAllocation;
    w->dst = shadow;
    w->value = value;
    w->n = count;
    *out = w;
    return FAKE_cudaSuccess;
}

/* Enqueue w (may be NULL: nothing to do) on `stream`; wait for it when `sync`. */
static int copy_submit(struct copy_work *w, void *stream, int sync) {
    struct stream *s;
    struct item *it = NULL;
    int err;
    if (w && !(it = item_new(ITEM_WORK, NULL, 0))) {
        free(w);
        return FAKE_cudaErrorMemoryAllocation;
    }
    if (it) {
        it->fn = copy_run;
        it->arg = w;
    }
    pthread_mutex_lock(&g.mu);
    err = stream_resolve(stream, &s);
    if (!err && it) {
        err = stream_enqueue(s, it);
        if (!err) it = NULL;
    }
    if (!err && sync) err = stream_wait_idle(s);
    pthread_mutex_unlock(&g.mu);
    if (it) {
        free(it);
        free(w);
    }
    return err;
}

/* A host->device copy whose source has been copied to staging memory: lands, then gives the
 * staging memory back. */
struct staged_copy {
    char *dst, *staging;
    size_t n;
    int device;
};

static void staged_run(void *arg) {
    struct staged_copy *c = arg;
    memcpy(c->dst, c->staging, c->n);
    free(c->staging);
    pthread_mutex_lock(&g.mu);
    g.staged[c->device] -= c->n;    /* the worker broadcasts g.progress once we return */
    pthread_mutex_unlock(&g.mu);
    free(c);
}

/* cudaMemcpy from pageable host memory to the device, as CUDA documents it (runtime API, "API
 * synchronization behavior", Memcpy, synchronous): a stream sync before the copy starts, then
 * the call returns once the source is in staging memory; the write to the device is work on the
 * legacy stream that lands later (after the stream's delay, like any work item). Staging is
 * bounded per device: past STAGING_CAP outstanding bytes the call waits for earlier copies to
 * land (one copy bigger than the cap still goes, alone). Consumes w. */
static int copy_submit_staged(struct copy_work *w) {
    struct staged_copy *c = calloc(1, sizeof *c);
    struct item *it = item_new(ITEM_WORK, NULL, 0);
    struct stream *s = NULL;
    int err;
    if (!c || !it) {
        err = FAKE_cudaErrorMemoryAllocation;
        goto out;
    }
    c->dst = w->dst;
    c->n = w->n;
    pthread_mutex_lock(&g.mu);
    err = stream_resolve(NULL, &s);
    if (!err) err = stream_wait_idle(s);
    if (!err) {
        c->device = s->device;
        while (g.staged[c->device] > 0 && g.staged[c->device] + c->n > STAGING_CAP)
            pthread_cond_wait(&g.progress, &g.mu);
        g.staged[c->device] += c->n;
    }
    pthread_mutex_unlock(&g.mu);
    if (err) goto out;
    /* Outside the lock: a big copy must not stall every stream. */
    if ((c->staging = malloc(c->n)) != NULL) memcpy(c->staging, w->src, c->n);
    it->fn = staged_run;
    it->arg = c;
    pthread_mutex_lock(&g.mu);
    if (!c->staging) err = FAKE_cudaErrorMemoryAllocation;
    else err = stream_enqueue(s, it);
    if (err) g.staged[c->device] -= c->n;
    pthread_mutex_unlock(&g.mu);
    if (!err) {
        it = NULL;
        c = NULL;
    }
out:
    if (c) free(c->staging);
    free(c);
    free(it);
    free(w);
    return err;
}

/* cudaMemcpy, per direction (the same section of CUDA's documentation): host to device is
 * staged (above); device to host returns once the copy is complete; device to device does no
 * host-side synchronisation; host to host is fully synchronous. FAKE_CUDA_SYNC_COPIES=1: every
 * direction waits for the legacy stream, as this fake did before it staged copies. */
API int cudaMemcpy(void *dst, const void *src, size_t count, int kind) {
    struct copy_work *w = NULL;
    int dir = MEMCPY_H2H, err = need_device();
    if (!err) err = copy_prepare(dst, src, count, kind, &w, &dir);
    if (err || !w) return ret(err);
    if (g.sync_copies) return ret(copy_submit(w, NULL, 1));
    switch (dir) {
    case MEMCPY_H2H:
        memmove(w->dst, w->src, w->n);
        free(w);
        return FAKE_cudaSuccess;
    case MEMCPY_H2D: return ret(copy_submit_staged(w));
    case MEMCPY_D2D: return ret(copy_submit(w, NULL, 0));
    default: return ret(copy_submit(w, NULL, 1));
    }
}

API int cudaMemcpyAsync(void *dst, const void *src, size_t count, int kind, void *stream) {
    struct copy_work *w = NULL;
    int dir = MEMCPY_H2H, err = need_device();
    if (!err) err = copy_prepare(dst, src, count, kind, &w, &dir);
    if (!err) err = copy_submit(w, stream, 0);
    return ret(err);
}

/* CUDA's synchronous cudaMemset is asynchronous with respect to the host when the target is
 * device memory (runtime API, "API synchronization behavior", Memset): work on the legacy
 * stream, not waited for (FAKE_CUDA_SYNC_COPIES=1: waited for). */
API int cudaMemset(void *devPtr, int value, size_t count) {
    struct copy_work *w = NULL;
    int err = need_device();
    if (!err) err = memset_prepare(devPtr, value, count, &w);
    if (!err) err = copy_submit(w, NULL, g.sync_copies);
    return ret(err);
}

API int cudaMemsetAsync(void *devPtr, int value, size_t count, void *stream) {
    struct copy_work *w = NULL;
    int err = need_device();
    if (!err) err = memset_prepare(devPtr, value, count, &w);
    if (!err) err = copy_submit(w, stream, 0);
    return ret(err);
}

/* ---------------------------------------------------------------- streams */

API int cudaStreamCreateWithFlags(void **pStream, unsigned int flags) {
    struct stream *s;
    int err = need_device();
    if (!pStream || (flags & ~(unsigned)STREAM_NON_BLOCKING)) return ret(FAKE_cudaErrorInvalidValue);
    if (err) return ret(err);
    streams_reap();
    pthread_mutex_lock(&g.mu);
    s = stream_new(tl_device, 0, !(flags & STREAM_NON_BLOCKING));
    pthread_mutex_unlock(&g.mu);
    if (!s) return ret(FAKE_cudaErrorMemoryAllocation);
    *pStream = s;
    return FAKE_cudaSuccess;
}

API int cudaStreamCreate(void **pStream) {
    return cudaStreamCreateWithFlags(pStream, 0);
}

/* As in CUDA, the call returns at once; the stream's pending work still runs, then its worker
 * exits and is joined later (streams_reap). */
API int cudaStreamDestroy(void *stream) {
    struct stream *s;
    int err = FAKE_cudaErrorInvalidResourceHandle;
    if (is_legacy_handle(stream)) return ret(err);
    pthread_mutex_lock(&g.mu);
    for (s = g.streams; s; s = s->next)
        if (s == stream && s->live) {
            s->live = 0;
            s->stopping = 1;
            pthread_cond_signal(&s->work_cv);
            err = FAKE_cudaSuccess;
            break;
        }
    pthread_mutex_unlock(&g.mu);
    streams_reap();
    return ret(err);
}

API int cudaStreamSynchronize(void *stream) {
    struct stream *s;
    int err;
    pthread_mutex_lock(&g.mu);
    err = stream_resolve(stream, &s);
    if (!err) err = stream_wait_idle(s);
    pthread_mutex_unlock(&g.mu);
    return ret(err);
}

API int cudaStreamQuery(void *stream) {
    struct stream *s;
    int err;
    pthread_mutex_lock(&g.mu);
    err = stream_resolve(stream, &s);
    if (!err && stream_pending(s)) err = FAKE_cudaErrorNotReady;
    pthread_mutex_unlock(&g.mu);
    return ret(err);
}

API int cudaStreamWaitEvent(void *stream, void *event, unsigned int flags) {
    struct stream *s = NULL;
    struct event *e = NULL;
    struct item *wait;
    int err;
    if (flags & ~1u) return ret(FAKE_cudaErrorInvalidValue);   /* 0, or cudaEventWaitExternal */
    pthread_mutex_lock(&g.mu);
    err = stream_resolve(stream, &s);
    if (!err && !(e = event_find(event))) err = FAKE_cudaErrorInvalidResourceHandle;
    /* Only the latest record counts; none, or one already reached, means nothing to wait for. */
    if (!err && e->reached < e->recorded) {
        if (!(wait = item_new(ITEM_WAIT, e, e->recorded))) {
            err = FAKE_cudaErrorMemoryAllocation;
        } else {
            e->refs++;
            if ((err = stream_enqueue(s, wait)) != 0) {
                e->refs--;
                free(wait);
            }
        }
    }
    pthread_mutex_unlock(&g.mu);
    return ret(err);
}

API int cudaDeviceSynchronize(void) {
    int err;
    pthread_mutex_lock(&g.mu);
    err = need_device();
    if (!err) err = streams_wait(tl_device);
    pthread_mutex_unlock(&g.mu);
    return ret(err);
}

/* ---------------------------------------------------------------- events */

API int cudaEventCreateWithFlags(void **event, unsigned int flags) {
    struct event *e;
    /* cudaEventDefault, BlockingSync, DisableTiming, Interprocess: all mean the same here. */
    if (!event || (flags & ~0xfu)) return ret(FAKE_cudaErrorInvalidValue);
    if (!(e = event_new(1))) return ret(FAKE_cudaErrorMemoryAllocation);
    pthread_mutex_lock(&g.mu);
    e->next = g.events;
    g.events = e;
    pthread_mutex_unlock(&g.mu);
    *event = e;
    return FAKE_cudaSuccess;
}

API int cudaEventCreate(void **event) {
    return cudaEventCreateWithFlags(event, 0);
}

API int cudaEventRecord(void *event, void *stream) {
    struct stream *s = NULL;
    struct event *e;
    struct item *mark;
    int err;
    pthread_mutex_lock(&g.mu);
    if (!(e = event_find(event))) err = FAKE_cudaErrorInvalidResourceHandle;
    else err = stream_resolve(stream, &s);
    if (!err) {
        if (!(mark = item_new(ITEM_MARKER, e, e->recorded + 1))) {
            err = FAKE_cudaErrorMemoryAllocation;
        } else if ((err = stream_enqueue(s, mark)) != 0) {
            free(mark);
        } else {
            e->recorded++;
            e->refs++;
        }
    }
    pthread_mutex_unlock(&g.mu);
    return ret(err);
}

API int cudaEventQuery(void *event) {
    struct event *e;
    int err = FAKE_cudaSuccess;
    pthread_mutex_lock(&g.mu);
    if (!(e = event_find(event))) err = FAKE_cudaErrorInvalidResourceHandle;
    else if (e->reached < e->recorded) err = FAKE_cudaErrorNotReady;
    pthread_mutex_unlock(&g.mu);
    return ret(err);
}

API int cudaEventSynchronize(void *event) {
    struct event *e;
    int err = FAKE_cudaSuccess;
    pthread_mutex_lock(&g.mu);
    if (!(e = event_find(event))) {
        err = FAKE_cudaErrorInvalidResourceHandle;
    } else {
        uint64_t want = e->recorded;
        e->refs++;                  /* the event may be destroyed while we wait */
        while (e->reached < want) pthread_cond_wait(&g.progress, &g.mu);
        event_unref(e);
    }
    pthread_mutex_unlock(&g.mu);
    return ret(err);
}

/* As in CUDA, destroying an event with a pending record is fine: the marker keeps it alive. */
API int cudaEventDestroy(void *event) {
    struct event **pp, *e;
    int err = FAKE_cudaErrorInvalidResourceHandle;
    pthread_mutex_lock(&g.mu);
    for (pp = &g.events; (e = *pp) != NULL; pp = &e->next)
        if (e == event) {
            *pp = e->next;
            e->next = NULL;
            event_unref(e);
            err = FAKE_cudaSuccess;
            break;
        }
    pthread_mutex_unlock(&g.mu);
    return ret(err);
}
