/* SPDX-License-Identifier: MIT (see LICENSE) */
/* tests/test_nccl.c — the NCCL transport (transports/ddp_nccl.h): device buffers through the same
 * calls, against the fake NCCL/CUDA runtime (tests/fake_nccl), and the real NCCL's decline path
 * on a machine without a GPU. Prints TAP.
 *
 *   build/test_nccl                    (DDP_TEST_ONLY=substring: one part)
 *
 * WHAT RUNS
 *   - the collectives matrix of tests/test_collectives.c (included, unchanged) on device twins
 *     of its buffers (tests/ddp_test_device.h) with DDP_NCCL=1: all-reduce, reduce-scatter,
 *     all-gather, broadcast, barrier; every dtype x op, counts {0, 1, 3, 1000} and (1<<20)+7, in
 *     and out of place, world sizes 1, 2, 3, 5, 8 over tcp and 4 over shm; results bit for bit
 *     (floating DDP_AVG within the random cases' tolerance: ncclAvg divides before summing),
 *     guard bytes, sendbuf unchanged, determinism, the same hash on every rank. Once more at
 *     p = 2 with the fake's streams running late (each operation starts 2 ms after it is due).
 *   - late stream: async all-reduce on a non-blocking stream whose work starts 50 ms late;
 *     ddp_wait, then a copy on another stream reads the right result (ddp_wait synchronised
 *     through the CUDA event). A read made before ddp_wait is reported (diag) to see the old
 *     data, which is what makes the check able to fail.
 *   - barrier after a blocking device call: the result is there when the barrier returns.
 *   - groups: a device ring shift (send right, receive left) and a send/recv to itself in one
 *     group; a group mixing an all-reduce with the shift.
 *   - split: p = 4 into two colors; an all-reduce on device in each half.
 *   - reducer: device gradients in copy mode and in view mode (on_device), 3 iterations (the
 *     first rebuilds the buckets), averages checked; ddp_broadcast_params of device parameters.
 *   - nested groups over two communicators (p = 2 and 3): start(C) start(D) all_reduce(C)
 *     all_reduce(D) end(D) end(C) with D's stream 20 ms late: D's synchronize returns only once
 *     its all-reduce ran; a D call while only C's group is open is held too, and waiting for it
 *     inside the group (synchronize, barrier, an async call) is DDP_ERR_INVALID_USAGE while D
 *     stays usable.
 *   - NCCL failing the second call with the stream moving on (FAKE_NCCL_FAIL_OP): ddp_test in
 *     a tight loop never says success; the error carries NCCL's text.
 *   - a peer's asynchronous error (rank 2's NCCL breaks): ranks 0 and 1, waiting in their next
 *     call, fail with DDP_ERR_REMOTE naming rank 2 through the store, not by their timeout.
 *   - NCCL init failing on rank 1 only: every rank's init returns at once, the same way (auto:
 *     NCCL declined naming rank 1, host calls work; DDP_NCCL=1: an init error naming it).
 *   - failures: a rank that stops calling (alive, in no device call) -> every waiting rank gets
 *     DDP_ERR_TIMEOUT within DDP_TIMEOUT_MS + 1 s naming the call and its number, with the
 *     hang report naming the silent rank; a peer killed in a loop -> the survivors get an
 *     error, no hang; ddp_comm_abort from another thread ends a hung ddp_wait with
 *     DDP_ERR_ABORTED; an asynchronous NCCL error -> DDP_ERR_REMOTE from the watchdog;
 *     DDP_NCCL_CHECK: mismatched counts -> DDP_ERR_MISMATCH naming both calls; mixed host and
 *     device buffers -> DDP_ERR_INVALID_ARGUMENT, the communicator still usable; init reporting
 *     ncclInProgress for a while -> still initialises; an NCCL older than 2.19 -> declined with
 *     both versions named, device calls then DDP_ERR_UNSUPPORTED with the reason.
 *   - the real NCCL here (no GPU): init succeeds, NCCL declined with the reason, host
 *     collectives work; DDP_NCCL=1 turns the decline into an init error.
 *
 * REAL MODE (T_DEVICE_REAL=1, make test-gpu): the real NCCL and CUDA runtime, T_DEVICE_RANKS
 * ranks (T_DEVICE_HOSTID gives each its own NCCL host id, so several share one GPU): the
 * matrix at p = 1, 2, 4.. up to it, and the scenarios a real NCCL can be made to show (a rank
 * that stops calling, ddp_comm_abort, a killed peer, nested groups, barrier, groups, split,
 * reducer, DDP_NCCL_CHECK, mixed buffers); the ones that need the fake's switches are skipped
 * (tests/fake_nccl/README.md has the fault model).
 */
#define _GNU_SOURCE
#include "ddp.h"
#include "transports/ddp_tcp.h"
#include "transports/ddp_shm.h"
#include "transports/ddp_nccl.h"
#include "tests/ddp_test.h"
#include "tests/ddp_test_device.h"

#define malloc t_dev_malloc
#define free t_dev_free
#define ddp_comm_init t_dev_comm_init
#define ddp_all_reduce t_dev_all_reduce
#define ddp_reduce_scatter t_dev_reduce_scatter
#define ddp_all_gather t_dev_all_gather
#define ddp_broadcast t_dev_broadcast
#define main test_collectives_main
#include "tests/test_collectives.c"
#undef main
#undef malloc
#undef free
#undef ddp_comm_init
#undef ddp_all_reduce
#undef ddp_reduce_scatter
#undef ddp_all_gather
#undef ddp_broadcast

#include <pthread.h>
#include <signal.h>

/* ------------------------------------------------------------------------- scenarios */
typedef struct {
    int r[T_MAX_RANKS];                 /* the result that matters, per rank */
    int bad[T_MAX_RANKS];               /* wrong values seen */
    int stale[T_MAX_RANKS];             /* the early read saw old data */
    int enabled[T_MAX_RANKS];
    double secs[T_MAX_RANKS];
    int finished[T_MAX_RANKS];          /* a rank that stops calling waits for these */
    int misuse[T_MAX_RANKS];            /* refusals that were expected, counted */
    char msg[T_MAX_RANKS][1600];
} nc_shm_t;
static nc_shm_t *N;

static void nc_msg(int rank, const char *m) { snprintf(N->msg[rank], sizeof N->msg[rank], "%s", m); }

static ddp_comm_t *nc_init(int rank, int p, int timeout_ms) {
    ddp_comm_desc_t d;
    ddp_comm_t *c = NULL;
    t_desc(&d, timeout_ms);
    N->r[rank] = t_dev_comm_init(&c, p, rank, &d);
    if (N->r[rank] != DDP_SUCCESS) { nc_msg(rank, ddp_last_init_error()); return NULL; }
    N->enabled[rank] = ddp_comm_device_enabled(c, NULL, 0);
    return c;
}

/* A device buffer of n floats, every element = v. */
static float *nc_dev_floats(size_t n, float v) {
    float *h = (float *)malloc(n * sizeof *h), *d = NULL;
    size_t i;
    t_dev_load();
    for (i = 0; i < n; i++) h[i] = v;
    if (t_dev_cu.Malloc((void **)&d, n * sizeof *d) != 0) exit(71);
    t_dev_cu.Memcpy(d, h, n * sizeof *d, T_DEV_H2D);
    t_dev_cu.DeviceSynchronize();   /* the copy may return before it lands (see t_dev_copy) */
    free(h);
    return d;
}

/* How many elements of device buffer d differ from want (a synchronous copy on the legacy
 * stream, which does not wait for the communicator's non-blocking stream). */
static int nc_count_bad(const float *d, size_t n, float want) {
    float *h = (float *)malloc(n * sizeof *h);
    size_t i;
    int bad = 0;
    t_dev_cu.Memcpy(h, d, n * sizeof *h, T_DEV_D2H);
    for (i = 0; i < n; i++) bad += h[i] != want;
    free(h);
    return bad;
}

enum { NC_LATE, NC_BARRIER, NC_GROUPS, NC_SPLIT, NC_HANG, NC_DEAD, NC_ABORT, NC_ASYNC_ERR, NC_CHECK,
       NC_MIXED, NC_INPROGRESS, NC_OLD, NC_REAL, NC_REAL_REQUIRED, NC_REDUCER, NC_NESTED, NC_FAIL_OP,
       NC_PEER_ASYNC, NC_INIT_FAIL, NC_INIT_FAIL_REQUIRED, NC_ABORT_STUCK, NC_CALL_FAIL };

/* A rank that stops calling (it is alive, in no device call) until the others are done, as a
 * stuck process would: the real failure, on a GPU as on the fake. */
static void nc_stop_calling(int rank, int p) {
    int q, waiting;
    double t0 = t_now();
    do {
        t_sleep_ms(10);
        for (q = 0, waiting = 0; q < p; q++) waiting += q != rank && !__atomic_load_n(&N->finished[q], __ATOMIC_SEQ_CST);
    } while (waiting && t_now() - t0 < 100.0);
}

/* The timeout the hang scenarios use: short on the fake; a real NCCL over sockets needs longer
 * to set up. */
static int nc_hang_ms(void) { return t_dev_real ? 10000 : 3000; }
typedef struct { int which, p; } nc_arg_t;

typedef struct { ddp_comm_t *c; } nc_abort_t;
static void *nc_abort_later(void *arg) {
    t_sleep_ms(300);
    ddp_comm_abort(((nc_abort_t *)arg)->c);
    return NULL;
}

/* Up to `calls` async all-reduces, each waited for, until one fails (its time and message
 * kept); the process kills itself before call `die_at` (-1: never). */
static void nc_timed_calls(int rank, ddp_comm_t *c, float *x, float *y, size_t n, int calls, int die_at) {
    ddp_request_t req;
    int it;
    for (it = 0; it < calls; it++) {
        double t0;
        if (it == die_at) raise(SIGKILL);
        t0 = t_now();
        N->r[rank] = (ddp_all_reduce_async)(x, y, n, DDP_FLOAT32, DDP_SUM, c, &req);
        if (N->r[rank] == DDP_SUCCESS) N->r[rank] = ddp_wait(&req);
        N->secs[rank] = t_now() - t0;
        if (N->r[rank] != DDP_SUCCESS) break;
    }
    nc_msg(rank, ddp_comm_last_error(c));
}

static int nc_scenario(int rank, int p, void *arg) {
    const nc_arg_t *a = (const nc_arg_t *)arg;
    const size_t n = 4096;
    ddp_comm_t *c = NULL;
    ddp_request_t req;
    float *x, *y;
    double t0;
    int it;
    unsetenv("DDP_TRANSPORT");
    switch (a->which) {
    case NC_LATE: {   /* only the communicator's stream runs late (streams made after this) */
        float *warm = nc_dev_floats(1, 0.0f);   /* the legacy stream exists: on time */
        t_dev_cu.Free(warm);
        setenv("FAKE_CUDA_STREAM_DELAY_US", "50000", 1);
        break;
    }
    case NC_ASYNC_ERR: setenv("FAKE_NCCL_ASYNC_ERROR_AFTER", "2", 1); break;
    case NC_FAIL_OP: setenv("FAKE_NCCL_FAIL_OP", "2", 1); break;
    case NC_ABORT_STUCK: setenv("FAKE_NCCL_ABORT_HANG_MS", "600000", 1); break;
    case NC_CALL_FAIL: if (rank == 0) setenv("FAKE_NCCL_CALL_FAIL", "3", 1); break;
    case NC_PEER_ASYNC: if (rank == 2) setenv("FAKE_NCCL_ASYNC_ERROR_AFTER", "1", 1); break;
    case NC_INIT_FAIL: case NC_INIT_FAIL_REQUIRED:
        if (rank == 1) setenv("FAKE_NCCL_INIT_FAIL", "1", 1);
        if (a->which == NC_INIT_FAIL) unsetenv("DDP_NCCL"); else setenv("DDP_NCCL", "1", 1);
        break;
    case NC_CHECK: setenv("DDP_NCCL_CHECK", "1", 1); break;
    case NC_INPROGRESS: setenv("FAKE_NCCL_INIT_INPROGRESS", "25", 1); break;
    case NC_OLD: setenv("FAKE_NCCL_VERSION", "21805", 1); unsetenv("DDP_NCCL"); break;
    case NC_REAL: case NC_REAL_REQUIRED:
        unsetenv("DDP_NCCL_LIBRARY"); unsetenv("DDP_CUDART_LIBRARY");
        if (a->which == NC_REAL) unsetenv("DDP_NCCL"); else setenv("DDP_NCCL", "1", 1);
        break;
    default: break;
    }
    if (a->which == NC_INIT_FAIL || a->which == NC_INIT_FAIL_REQUIRED) {
        /* NCCL's init fails on rank 1 only: every rank decides the same, at once */
        ddp_comm_desc_t d;
        char why[512];
        int v = rank + 1;
        t_desc(&d, 20000);
        t0 = t_now();
        N->r[rank] = t_dev_comm_init(&c, p, rank, &d);
        N->secs[rank] = t_now() - t0;
        if (N->r[rank] != DDP_SUCCESS) { nc_msg(rank, ddp_last_init_error()); return 0; }
        N->enabled[rank] = ddp_comm_device_enabled(c, why, sizeof why);
        nc_msg(rank, why);
        N->r[rank] = (ddp_all_reduce)(&v, &v, 1, DDP_INT32, DDP_SUM, c);
        N->bad[rank] = v != p * (p + 1) / 2;
        ddp_comm_destroy(c);
        return 0;
    }
    if (a->which == NC_REAL || a->which == NC_REAL_REQUIRED) {
        ddp_comm_desc_t d;
        char why[512];
        float v = (float)rank + 1.0f;
        t_desc(&d, 30000);
        N->r[rank] = (ddp_comm_init)(&c, p, rank, &d);
        if (N->r[rank] != DDP_SUCCESS) { nc_msg(rank, ddp_last_init_error()); return 0; }
        N->enabled[rank] = ddp_comm_device_enabled(c, why, sizeof why);
        nc_msg(rank, why);
        N->r[rank] = (ddp_all_reduce)(&v, &v, 1, DDP_FLOAT32, DDP_SUM, c);
        N->bad[rank] = v != (float)(p * (p + 1) / 2);
        ddp_comm_destroy(c);
        return 0;
    }
    c = nc_init(rank, p, a->which == NC_HANG || a->which == NC_DEAD ? nc_hang_ms() :
                         a->which == NC_ABORT_STUCK ? 2000 :
                         a->which == NC_PEER_ASYNC ? 20000 : 60000);
    if (!c) return 0;
    x = nc_dev_floats(n, (float)(rank + 1));
    y = nc_dev_floats(n, -1.0f);
    switch (a->which) {
    case NC_LATE:
        N->r[rank] = (ddp_all_reduce_async)(x, y, n, DDP_FLOAT32, DDP_SUM, c, &req);
        if (N->r[rank] == DDP_SUCCESS) N->r[rank] = ddp_wait(&req);
        N->bad[rank] = nc_count_bad(y, n, (float)(p * (p + 1) / 2));
        /* the same without ddp_wait before the read: what the check above would see */
        if (N->r[rank] == DDP_SUCCESS) N->r[rank] = (ddp_all_reduce_async)(y, x, n, DDP_FLOAT32, DDP_SUM, c, &req);
        N->stale[rank] = nc_count_bad(x, n, (float)(p * p * (p + 1) / 2)) == (int)n;
        if (N->r[rank] == DDP_SUCCESS) N->r[rank] = ddp_wait(&req);
        break;
    case NC_BARRIER:
        N->r[rank] = (ddp_all_reduce)(x, x, n, DDP_FLOAT32, DDP_SUM, c);
        if (N->r[rank] == DDP_SUCCESS) N->r[rank] = ddp_barrier(c);
        N->bad[rank] = nc_count_bad(x, n, (float)(p * (p + 1) / 2));
        break;
    case NC_GROUPS: {
        float *self = nc_dev_floats(n, 7.0f), *self_in = nc_dev_floats(n, 0.0f);
        ddp_group_start(c);
        ddp_send(x, n, DDP_FLOAT32, (rank + 1) % p, c);
        ddp_recv(y, n, DDP_FLOAT32, (rank + p - 1) % p, c);
        ddp_send(self, n, DDP_FLOAT32, rank, c);
        ddp_recv(self_in, n, DDP_FLOAT32, rank, c);
        N->r[rank] = ddp_group_end(c);
        if (N->r[rank] == DDP_SUCCESS) N->r[rank] = ddp_barrier(c);
        N->bad[rank] = nc_count_bad(y, n, (float)((rank + p - 1) % p + 1)) + nc_count_bad(self_in, n, 7.0f);
        /* a collective and the shift in one group */
        ddp_group_start(c);
        (ddp_all_reduce)(self, self, n, DDP_FLOAT32, DDP_SUM, c);
        ddp_send(x, n, DDP_FLOAT32, (rank + 1) % p, c);
        ddp_recv(y, n, DDP_FLOAT32, (rank + p - 1) % p, c);
        if (N->r[rank] == DDP_SUCCESS) N->r[rank] = ddp_group_end(c);
        if (N->r[rank] == DDP_SUCCESS) N->r[rank] = ddp_barrier(c);
        N->bad[rank] += nc_count_bad(self, n, 7.0f * (float)p);
        nc_msg(rank, ddp_comm_last_error(c));
        t_dev_cu.Free(self); t_dev_cu.Free(self_in);
        break;
    }
    case NC_SPLIT: {
        ddp_comm_t *half = NULL;
        int color = rank % 2;
        N->r[rank] = ddp_comm_split(c, color, rank, &half);
        if (N->r[rank] == DDP_SUCCESS) {
            float want = 0;
            int q;
            for (q = color; q < p; q += 2) want += (float)(q + 1);
            N->r[rank] = (ddp_all_reduce)(x, y, n, DDP_FLOAT32, DDP_SUM, half);
            if (N->r[rank] == DDP_SUCCESS) N->r[rank] = ddp_barrier(half);
            N->bad[rank] = nc_count_bad(y, n, want) + !ddp_comm_device_enabled(half, NULL, 0);
            nc_msg(rank, ddp_comm_last_error(half));
            ddp_comm_destroy(half);
        } else {
            nc_msg(rank, ddp_comm_last_error(c));
        }
        break;
    }
    case NC_HANG:
        /* The first call completes; then rank 1 stops calling. */
        N->r[rank] = (ddp_all_reduce_async)(x, y, n, DDP_FLOAT32, DDP_SUM, c, &req);
        if (N->r[rank] == DDP_SUCCESS) N->r[rank] = ddp_wait(&req);
        if (N->r[rank] != DDP_SUCCESS) { nc_msg(rank, ddp_comm_last_error(c)); N->r[rank] = -1; break; }
        if (rank == 1) { nc_stop_calling(rank, p); ddp_comm_abort(c); break; }   /* then it is killed */
        t0 = t_now();
        N->r[rank] = (ddp_all_reduce_async)(x, y, n, DDP_FLOAT32, DDP_SUM, c, &req);
        if (N->r[rank] == DDP_SUCCESS) N->r[rank] = ddp_wait(&req);
        N->secs[rank] = t_now() - t0;
        nc_msg(rank, ddp_comm_last_error(c));
        break;
    case NC_DEAD:   /* rank 2 is killed before its sixth call */
        nc_timed_calls(rank, c, x, y, n, 200, rank == 2 ? 5 : -1);
        break;
    case NC_ABORT:
        if (rank == 0) {
            nc_abort_t ab;
            pthread_t th;
            ab.c = c;
            t0 = t_now();
            /* the abort first: a real NCCL connects to a peer at its first call, and the call
             * itself waits for rank 1 (bounded: ncclInProgress, polled) */
            pthread_create(&th, NULL, nc_abort_later, &ab);
            N->r[rank] = (ddp_all_reduce_async)(x, y, n, DDP_FLOAT32, DDP_SUM, c, &req);
            if (N->r[rank] == DDP_SUCCESS) N->r[rank] = ddp_wait(&req);
            pthread_join(th, NULL);
            N->secs[rank] = t_now() - t0;
            nc_msg(rank, ddp_comm_last_error(c));
        } else {
            nc_stop_calling(rank, p);   /* never arrives; then it is killed */
            ddp_comm_abort(c);
        }
        break;
    case NC_ASYNC_ERR:
        for (it = 0; it < 6; it++) {
            N->r[rank] = (ddp_all_reduce_async)(x, y, n, DDP_FLOAT32, DDP_SUM, c, &req);
            if (N->r[rank] == DDP_SUCCESS) N->r[rank] = ddp_wait(&req);
            if (N->r[rank] != DDP_SUCCESS) break;
        }
        {
            ddp_result_t e = DDP_SUCCESS;
            ddp_comm_get_async_error(c, &e);
            N->bad[rank] = e == DDP_SUCCESS;
        }
        nc_msg(rank, ddp_comm_last_error(c));
        break;
    case NC_NESTED: {
        /* NCCL's group is the thread's: calls on D inside a group opened for C run at the
         * outermost end. D's stream runs 20 ms late, so an event recorded before its call ran
         * would let the host read stale data. */
        ddp_comm_t *d = NULL;
        void *st = NULL;
        const float want = (float)(p * (p + 1) / 2);
        float *xd = nc_dev_floats(n, (float)(rank + 1)), *yd = nc_dev_floats(n, -1.0f);
        float *yd2 = nc_dev_floats(n, -1.0f);
        ddp_result_t e;
        if ((N->r[rank] = ddp_comm_split(c, 0, rank, &d)) != DDP_SUCCESS) { nc_msg(rank, ddp_comm_last_error(c)); break; }
        setenv("FAKE_CUDA_STREAM_DELAY_US", "20000", 1);
        if (t_dev_cu.StreamCreateWithFlags(&st, 1 /* cudaStreamNonBlocking */) != 0) exit(72);
        unsetenv("FAKE_CUDA_STREAM_DELAY_US");
        ddp_comm_set_cuda_stream(d, st);
        /* nested: start(C) start(D) all_reduce(C) all_reduce(D) end(D) end(C) */
        ddp_group_start(c);
        ddp_group_start(d);
        (ddp_all_reduce)(x, y, n, DDP_FLOAT32, DDP_SUM, c);
        (ddp_all_reduce)(xd, yd, n, DDP_FLOAT32, DDP_SUM, d);
        N->r[rank] = ddp_group_end(d);
        if ((e = ddp_group_end(c)) != DDP_SUCCESS && N->r[rank] == DDP_SUCCESS) N->r[rank] = e;
        if (N->r[rank] == DDP_SUCCESS) N->r[rank] = ddp_comm_device_synchronize(d);
        N->bad[rank] = nc_count_bad(yd, n, want);
        if (N->r[rank] == DDP_SUCCESS) N->r[rank] = ddp_comm_device_synchronize(c);
        N->bad[rank] += nc_count_bad(y, n, want);
        /* a call on D while only C's group is open: held too; waiting for it inside the group
         * is refused (nothing to wait for yet), without breaking D */
        if (N->r[rank] == DDP_SUCCESS) {
            ddp_group_start(c);
            (ddp_all_reduce)(x, y, n, DDP_FLOAT32, DDP_SUM, c);
            N->r[rank] = (ddp_all_reduce)(xd, yd2, n, DDP_FLOAT32, DDP_SUM, d);
            N->misuse[rank] += ddp_comm_device_synchronize(d) == DDP_ERR_INVALID_USAGE;
            N->misuse[rank] += ddp_barrier(d) == DDP_ERR_INVALID_USAGE;
            N->misuse[rank] += (ddp_all_reduce_async)(xd, yd, n, DDP_FLOAT32, DDP_SUM, d, &req) == DDP_ERR_INVALID_USAGE;
            if ((e = ddp_group_end(c)) != DDP_SUCCESS && N->r[rank] == DDP_SUCCESS) N->r[rank] = e;
            if (N->r[rank] == DDP_SUCCESS) N->r[rank] = ddp_comm_device_synchronize(d);
            N->bad[rank] += nc_count_bad(yd2, n, want);
            if (N->r[rank] == DDP_SUCCESS) N->r[rank] = ddp_barrier(d);   /* D still works */
        }
        nc_msg(rank, N->r[rank] == DDP_SUCCESS ? ddp_comm_last_error(d) : ddp_comm_last_error(c));
        ddp_comm_destroy(d);
        t_dev_cu.StreamDestroy(st);
        t_dev_cu.Free(xd); t_dev_cu.Free(yd); t_dev_cu.Free(yd2);
        break;
    }
    case NC_FAIL_OP: {
        /* NCCL fails the second call and the stream moves on (its event fires): the host must
         * not call it done. ddp_test in a tight loop sees the event at once. */
        int done = 0;
        N->r[rank] = (ddp_all_reduce_async)(x, y, n, DDP_FLOAT32, DDP_SUM, c, &req);
        if (N->r[rank] == DDP_SUCCESS) N->r[rank] = ddp_wait(&req);
        if (N->r[rank] != DDP_SUCCESS) { nc_msg(rank, ddp_comm_last_error(c)); N->r[rank] = -1; break; }
        N->r[rank] = (ddp_all_reduce_async)(y, x, n, DDP_FLOAT32, DDP_SUM, c, &req);
        while (N->r[rank] == DDP_SUCCESS && !done) N->r[rank] = ddp_test(&req, &done);
        N->bad[rank] = N->r[rank] == DDP_SUCCESS;   /* success for a failed call */
        nc_msg(rank, ddp_comm_last_error(c));
        break;
    }
    case NC_PEER_ASYNC:   /* rank 2's NCCL breaks after its first call; its peers wait in the second */
        nc_timed_calls(rank, c, x, y, n, 2, -1);
        break;
    case NC_CALL_FAIL: {
        /* rank 1 stops calling after the first call; rank 0's second call waits for it, and
         * NCCL refuses its third at once (ncclRemoteError): the communicator must be aborted
         * then, or the second call's kernel never ends and cudaFree (which waits for the
         * device) blocks for ever, as on an H200 after a peer was killed */
        ddp_request_t req2;
        N->r[rank] = (ddp_all_reduce_async)(x, y, n, DDP_FLOAT32, DDP_SUM, c, &req);
        if (N->r[rank] == DDP_SUCCESS) N->r[rank] = ddp_wait(&req);
        if (N->r[rank] != DDP_SUCCESS) { nc_msg(rank, ddp_comm_last_error(c)); N->r[rank] = -1; break; }
        if (rank == 1) { nc_stop_calling(rank, p); ddp_comm_abort(c); break; }
        N->r[rank] = (ddp_all_reduce_async)(x, y, n, DDP_FLOAT32, DDP_SUM, c, &req2);
        if (N->r[rank] == DDP_SUCCESS) N->r[rank] = (ddp_all_reduce_async)(y, x, n, DDP_FLOAT32, DDP_SUM, c, &req);
        nc_msg(rank, ddp_comm_last_error(c));
        N->bad[rank] = ddp_wait(&req2) == DDP_SUCCESS;   /* it cannot have completed */
        t_dev_cu.Free(x);   /* waits for the device's work, the second call's included */
        t_dev_cu.Free(y);
        N->stale[rank] = 1;   /* came back */
        __atomic_store_n(&N->finished[rank], 1, __ATOMIC_SEQ_CST);
        ddp_comm_destroy(c);
        return 0;
    }
    case NC_ABORT_STUCK:
        /* NCCL's abort never comes back: ddp_comm_abort and destroy still return */
        N->r[rank] = (ddp_all_reduce)(x, y, n, DDP_FLOAT32, DDP_SUM, c);
        if (N->r[rank] == DDP_SUCCESS) N->r[rank] = ddp_comm_device_synchronize(c);
        t0 = t_now();
        ddp_comm_abort(c);
        t_dev_cu.Free(x);
        t_dev_cu.Free(y);
        ddp_comm_destroy(c);
        N->secs[rank] = t_now() - t0;
        __atomic_store_n(&N->finished[rank], 1, __ATOMIC_SEQ_CST);
        return 0;
    case NC_CHECK:
        N->r[rank] = (ddp_all_reduce)(x, y, rank == 0 ? n : n - 1, DDP_FLOAT32, DDP_SUM, c);
        nc_msg(rank, ddp_comm_last_error(c));
        break;
    case NC_MIXED: {
        float host[16] = {0};
        N->r[rank] = (ddp_all_reduce)(host, y, 16, DDP_FLOAT32, DDP_SUM, c);
        nc_msg(rank, ddp_comm_last_error(c));
        N->bad[rank] = (ddp_all_reduce)(x, y, n, DDP_FLOAT32, DDP_SUM, c) != DDP_SUCCESS ||
                       ddp_barrier(c) != DDP_SUCCESS || nc_count_bad(y, n, (float)(p * (p + 1) / 2)) != 0;
        break;
    }
    case NC_REDUCER: {
        /* Device gradients, copy mode and view mode (on_device), 3 iterations each (the first
         * one rebuilds the buckets); then broadcast_params of device parameters from rank 1. */
        const size_t cnt[3] = {1000, 3, 70000};
        float want = (float)(p + 1) / 2.0f;   /* the average of rank + 1 */
        int mode;
        for (mode = 0; mode < 2 && N->r[rank] == DDP_SUCCESS; mode++) {
            ddp_reducer_desc_t rd;
            ddp_reducer_t *red = NULL;
            float *g[3];
            int k;
            memset(&rd, 0, sizeof rd);
            rd.bucket_cap_bytes = 64 << 10;   /* several buckets */
            rd.first_bucket_bytes = 4096;
            rd.gradient_as_bucket_view = mode;
            rd.on_device = mode;
            ddp_reducer_create(&red, c, &rd);
            for (k = 0; k < 3; k++) {
                g[k] = mode ? NULL : nc_dev_floats(cnt[k], 0.0f);
                ddp_reducer_add_param(red, g[k], cnt[k], DDP_FLOAT32);
            }
            for (it = 0; it < 3 && N->r[rank] == DDP_SUCCESS; it++) {
                for (k = 2; k >= 0; k--) {
                    float *dst = (float *)ddp_reducer_grad(red, k);
                    float *src = nc_dev_floats(cnt[k], (float)(rank + 1));
                    ddp_comm_device_copy(c, dst, src, cnt[k] * sizeof(float));
                    ddp_comm_device_synchronize(c);
                    t_dev_cu.Free(src);
                    N->r[rank] = ddp_reducer_grad_ready(red, k);
                }
                if (N->r[rank] == DDP_SUCCESS) N->r[rank] = ddp_reducer_finish(red);
                if (N->r[rank] == DDP_SUCCESS) N->r[rank] = ddp_comm_device_synchronize(c);
                for (k = 0; k < 3; k++) N->bad[rank] += nc_count_bad((float *)ddp_reducer_grad(red, k), cnt[k], want);
            }
            if (N->r[rank] != DDP_SUCCESS) nc_msg(rank, ddp_reducer_last_error(red));
            N->stale[rank] += !ddp_reducer_rebuilt(red);
            ddp_reducer_destroy(red);
            for (k = 0; k < 3; k++) if (g[k]) t_dev_cu.Free(g[k]);
        }
        if (N->r[rank] == DDP_SUCCESS) {
            float *pa = nc_dev_floats(5, (float)rank), *pb = nc_dev_floats(100000, (float)rank * 2);
            void *ps[2];
            size_t pc[2] = {5, 100000};
            ddp_dtype_t pd[2] = {DDP_FLOAT32, DDP_FLOAT32};
            ps[0] = pa; ps[1] = pb;
            N->r[rank] = ddp_broadcast_params(c, ps, pc, pd, 2, 1);
            if (N->r[rank] == DDP_SUCCESS) N->r[rank] = ddp_comm_device_synchronize(c);
            N->bad[rank] += nc_count_bad(pa, 5, 1.0f) + nc_count_bad(pb, 100000, 2.0f);
            if (N->r[rank] != DDP_SUCCESS) nc_msg(rank, ddp_comm_last_error(c));
            t_dev_cu.Free(pa); t_dev_cu.Free(pb);
        }
        break;
    }
    case NC_INPROGRESS:
        N->r[rank] = (ddp_all_reduce)(x, y, n, DDP_FLOAT32, DDP_SUM, c);
        if (N->r[rank] == DDP_SUCCESS) N->r[rank] = ddp_barrier(c);
        N->bad[rank] = nc_count_bad(y, n, (float)(p * (p + 1) / 2));
        break;
    case NC_OLD: {
        char why[512];
        N->enabled[rank] = ddp_comm_device_enabled(c, why, sizeof why);
        N->r[rank] = (ddp_all_reduce)(x, y, n, DDP_FLOAT32, DDP_SUM, c);
        snprintf(N->msg[rank], sizeof N->msg[rank], "%s | %s", why, ddp_comm_last_error(c));
        break;
    }
    default: break;
    }
    __atomic_store_n(&N->finished[rank], 1, __ATOMIC_SEQ_CST);
    t_dev_cu.Free(x);
    t_dev_cu.Free(y);
    ddp_comm_destroy(c);
    return 0;
}

/* Real mode (make test-gpu): only what a real NCCL can be made to do (FAKE_* switches mean
 * nothing there), with at most T_DEVICE_RANKS ranks. */
static int nc_real_ok(int which) {
    switch (which) {
    case NC_ASYNC_ERR: case NC_FAIL_OP: case NC_PEER_ASYNC: case NC_INIT_FAIL: case NC_INIT_FAIL_REQUIRED:
    case NC_ABORT_STUCK: case NC_CALL_FAIL:
    case NC_INPROGRESS: case NC_OLD: case NC_REAL: case NC_REAL_REQUIRED: return 0;
    default: return 1;
    }
}

static int nc_run(int which, int p, const char *name) {
    nc_arg_t a;
    if (!t_selected(name)) return 0;
    if (t_dev_real) {
        int g = getenv("T_DEVICE_RANKS") ? atoi(getenv("T_DEVICE_RANKS")) : 1;
        if (!nc_real_ok(which) || p > g) return 0;
    }
    a.which = which; a.p = p;
    N = (nc_shm_t *)t_shm_user(sizeof(nc_shm_t));
    t_run_ranks(p, nc_scenario, &a, 120);
    ok(!t_last_run.killed_by_watchdog[0] && !t_last_run.killed_by_watchdog[p - 1], "%s: no rank hung (%.1f s)",
       name, t_last_run.seconds);
    return 1;
}

static void nc_scenarios(void) {
    int q, good, np;
    const char *real = "/usr/local/cuda/lib64/libnccl.so.2";
    if (nc_run(NC_LATE, 2, "late stream")) {
        for (q = 0; q < 2; q++) {
            ok(N->r[q] == DDP_SUCCESS && N->bad[q] == 0, "late stream: rank %d reads the right result after "
               "ddp_wait (%s; %d wrong)", q, ddp_strerror((ddp_result_t)N->r[q]), N->bad[q]);
            diag("late stream: rank %d: a read without ddp_wait saw %s", q, N->stale[q] ? "the old data (the "
                 "stream runs late, so the check above can fail)" : "the result already");
        }
    }
    if (nc_run(NC_BARRIER, 3, "barrier drains device work"))
        for (q = 0; q < 3; q++)
            ok(N->r[q] == DDP_SUCCESS && N->bad[q] == 0, "barrier: rank %d sees its device all-reduce done "
               "(%s, %d wrong)", q, ddp_strerror((ddp_result_t)N->r[q]), N->bad[q]);
    if (nc_run(NC_GROUPS, 3, "groups on device"))
        for (q = 0; q < 3; q++)
            ok(N->r[q] == DDP_SUCCESS && N->bad[q] == 0, "groups: rank %d: ring shift, self send/recv, "
               "all-reduce in a group (%s, %d wrong) %s", q, ddp_strerror((ddp_result_t)N->r[q]), N->bad[q], N->msg[q]);
    if (nc_run(NC_REDUCER, 3, "reducer on device gradients"))
        for (q = 0; q < 3; q++)
            ok(N->r[q] == DDP_SUCCESS && N->bad[q] == 0 && N->stale[q] == 0, "reducer: rank %d: device "
               "gradients averaged in copy and view mode over 3 iterations (buckets rebuilt), device "
               "parameters broadcast (%s, %d wrong) %s", q, ddp_strerror((ddp_result_t)N->r[q]), N->bad[q], N->msg[q]);
    np = t_dev_real && getenv("T_DEVICE_RANKS") && atoi(getenv("T_DEVICE_RANKS")) < 4 ? 3 : 4;
    if (nc_run(NC_SPLIT, np, "split on device"))
        for (q = 0; q < np; q++)
            ok(N->r[q] == DDP_SUCCESS && N->bad[q] == 0, "split: rank %d: all-reduce in its half on device "
               "(%s, %d wrong) %s", q, ddp_strerror((ddp_result_t)N->r[q]), N->bad[q], N->msg[q]);
    if (nc_run(NC_HANG, 3, "hang -> timeout")) {
        const int ms = nc_hang_ms();
        for (q = 0; q < 3; q += 2) {
            /* its own timeout, or (a loaded machine: the other waiting rank timed out first and
             * said so) that rank's report, which names the same call and silent rank */
            ok(N->r[q] == DDP_ERR_TIMEOUT || N->r[q] == DDP_ERR_REMOTE, "hang: rank %d: DDP_ERR_TIMEOUT "
               "(got %s)", q, N->r[q] < 0 ? "a failure of the first call" : ddp_strerror((ddp_result_t)N->r[q]));
            /* no timing assertion (the machine may be loaded): the error must come, not hang;
             * the target (DDP_TIMEOUT_MS + 1 s) is reported and measured in the issue's note */
            ok(N->secs[q] < ms / 1000.0 + 30.0, "hang: rank %d: the error came, %.2f s after the call", q, N->secs[q]);
            diag("hang: rank %d: %.2f s against the target of DDP_TIMEOUT_MS %d + 1 s: %s", q, N->secs[q], ms,
                 N->secs[q] < ms / 1000.0 + 1.0 ? "met" : "MISSED (a loaded machine?)");
            ok(strstr(N->msg[q], "all_reduce #2") && t_mentions_int(N->msg[q], ms) &&
               strstr(N->msg[q], "rank 1: no report"), "hang: rank %d names the call, its number, the "
               "timeout and the silent rank: %s", q, N->msg[q]);
        }
    }
    for (np = 2; np <= 3; np++) {
        char name[64];
        snprintf(name, sizeof name, "nested groups over two communicators p=%d", np);
        if (!nc_run(NC_NESTED, np, name)) continue;
        for (q = 0; q < np; q++)
            ok(N->r[q] == DDP_SUCCESS && N->bad[q] == 0 && N->misuse[q] == 3, "nested groups p=%d: rank %d: "
               "a call on D held by a group of C completes before D's synchronize/barrier return (%s, "
               "%d wrong); waiting for it inside the group refused %d of 3 times %s", np, q,
               ddp_strerror((ddp_result_t)N->r[q]), N->bad[q], N->misuse[q], N->msg[q]);
    }
    if (nc_run(NC_FAIL_OP, 2, "a failed call whose event fires"))
        for (q = 0; q < 2; q++)
            ok(N->r[q] == DDP_ERR_REMOTE && !N->bad[q] && strstr(N->msg[q], "asynchronous error") &&
               strstr(N->msg[q], "(NCCL: "), "failed call: rank %d: ddp_test says %s, not success, "
               "with NCCL's own text: %s", q, ddp_strerror((ddp_result_t)N->r[q]), N->msg[q]);
    if (nc_run(NC_PEER_ASYNC, 3, "a peer's asynchronous error")) {
        ok(N->r[2] == DDP_ERR_REMOTE && strstr(N->msg[2], "asynchronous error"), "peer async error: "
           "rank 2 (whose NCCL failed): %s: %s", ddp_strerror((ddp_result_t)N->r[2]), N->msg[2]);
        for (q = 0; q < 2; q++)
            ok(N->r[q] == DDP_ERR_REMOTE && strstr(N->msg[q], "rank 2: ") &&
               strstr(N->msg[q], "asynchronous error"), "peer async error: rank %d learns rank 2's error "
               "through the store (%s after %.2f s, DDP_TIMEOUT_MS 20000), not by its timeout: %s", q,
               ddp_strerror((ddp_result_t)N->r[q]), N->secs[q], N->msg[q]);
    }
    if (nc_run(NC_ABORT_STUCK, 2, "ncclCommAbort that never returns"))
        for (q = 0; q < 2; q++)
            ok(N->r[q] == DDP_SUCCESS && N->finished[q], "stuck ncclCommAbort: rank %d: ddp_comm_abort and "
               "ddp_comm_destroy returned (%.2f s; DDP_TIMEOUT_MS 2000, NCCL's abort sleeps 600 s)", q, N->secs[q]);
    if (nc_run(NC_CALL_FAIL, 2, "a call NCCL refuses at once"))
        ok(N->r[0] == DDP_ERR_REMOTE && !N->bad[0] && strstr(N->msg[0], "FAKE_NCCL_CALL_FAIL") &&
           N->stale[0], "refused call: rank 0: %s, the call before it fails too, and cudaFree returns "
           "(the communicator was aborted): %s", ddp_strerror((ddp_result_t)N->r[0]), N->msg[0]);
    if (nc_run(NC_INIT_FAIL, 3, "NCCL init fails on one rank"))
        for (q = 0; q < 3; q++)
            ok(N->r[q] == DDP_SUCCESS && !N->enabled[q] && !N->bad[q] &&
               strstr(N->msg[q], q == 1 ? "this rank" : "rank 1: "), "init failing on rank 1: rank %d "
               "initialises in %.2f s (DDP_TIMEOUT_MS 20000), declines NCCL as every rank does, and "
               "reduces host buffers: %s", q, N->secs[q], N->msg[q]);
    if (nc_run(NC_INIT_FAIL_REQUIRED, 3, "NCCL init fails on one rank, DDP_NCCL=1"))
        for (q = 0; q < 3; q++)
            ok(N->r[q] == DDP_ERR_UNSUPPORTED && strstr(N->msg[q], "DDP_NCCL=1") &&
               strstr(N->msg[q], q == 1 ? "this rank" : "rank 1: "), "init failing on rank 1, DDP_NCCL=1: "
               "rank %d's init fails at once (%.2f s) naming it: %s", q, N->secs[q], N->msg[q]);
    if (nc_run(NC_DEAD, 3, "dead peer")) {
        for (q = 0; q < 2; q++)
            ok((N->r[q] == DDP_ERR_TIMEOUT || N->r[q] == DDP_ERR_REMOTE) && N->secs[q] < 3.0 + 30.0 &&
               strstr(N->msg[q], "all_reduce #"), "dead peer: rank %d: %s within %.2f s, naming the call: %s",
               q, ddp_strerror((ddp_result_t)N->r[q]), N->secs[q], N->msg[q]);
    }
    if (nc_run(NC_ABORT, 2, "abort from another thread"))
        ok(N->r[0] == DDP_ERR_ABORTED && N->secs[0] < 30.0, "abort: ddp_wait of a hung device call returns "
           "DDP_ERR_ABORTED (%s after %.2f s): %s", ddp_strerror((ddp_result_t)N->r[0]), N->secs[0], N->msg[0]);
    if (nc_run(NC_ASYNC_ERR, 2, "asynchronous error"))
        for (q = 0; q < 2; q++)
            ok(N->r[q] == DDP_ERR_REMOTE && !N->bad[q] && strstr(N->msg[q], "asynchronous error"),
               "async error: rank %d: %s, ddp_comm_get_async_error reports it: %s", q,
               ddp_strerror((ddp_result_t)N->r[q]), N->msg[q]);
    if (nc_run(NC_CHECK, 2, "DDP_NCCL_CHECK mismatch"))
        for (q = 0; q < 2; q++)
            ok(N->r[q] == DDP_ERR_MISMATCH && t_mentions_int(N->msg[q], 4096) && t_mentions_int(N->msg[q], 4095),
               "DDP_NCCL_CHECK: rank %d: %s naming both counts: %s", q, ddp_strerror((ddp_result_t)N->r[q]), N->msg[q]);
    if (nc_run(NC_MIXED, 2, "mixed host and device buffers"))
        for (q = 0; q < 2; q++)
            ok(N->r[q] == DDP_ERR_INVALID_ARGUMENT && !N->bad[q] && strstr(N->msg[q], "not both"),
               "mixed buffers: rank %d: %s, then a device call still works: %s", q,
               ddp_strerror((ddp_result_t)N->r[q]), N->msg[q]);
    if (nc_run(NC_INPROGRESS, 2, "init in progress"))
        for (q = 0; q < 2; q++)
            ok(N->r[q] == DDP_SUCCESS && N->bad[q] == 0 && N->enabled[q], "init reporting ncclInProgress: "
               "rank %d initialises and reduces (%s)", q, ddp_strerror((ddp_result_t)N->r[q]));
    if (nc_run(NC_OLD, 2, "old NCCL")) {
        for (q = 0; q < 2; q++)
            ok(!N->enabled[q] && N->r[q] == DDP_ERR_UNSUPPORTED && strstr(N->msg[q], "2.18.5") &&
               strstr(N->msg[q], "2.19.0"), "NCCL 2.18.5: rank %d declines naming both versions; a device "
               "call is DDP_ERR_UNSUPPORTED with the reason: %s", q, N->msg[q]);
    }
    good = access(real, R_OK) == 0;
    if (nc_run(NC_REAL, 2, "real NCCL, no GPU")) {
        for (q = 0; q < 2; q++) {
            ok(N->r[q] == DDP_SUCCESS && !N->bad[q] && !N->enabled[q] && N->msg[q][0], "real NCCL: rank %d "
               "initialises, declines NCCL (%s) and all-reduces host buffers (%s)", q, N->msg[q],
               ddp_strerror((ddp_result_t)N->r[q]));
            if (good)
                ok(strstr(N->msg[q], "cudaGetDeviceCount") != NULL, "real NCCL: rank %d's reason comes from "
                   "the real CUDA runtime: %s", q, N->msg[q]);
            else
                diag("no %s here: the decline came before NCCL was loaded", real);
        }
    }
    if (nc_run(NC_REAL_REQUIRED, 2, "real NCCL, DDP_NCCL=1"))
        for (q = 0; q < 2; q++)
            ok(N->r[q] == DDP_ERR_UNSUPPORTED && strstr(N->msg[q], "DDP_NCCL=1"), "DDP_NCCL=1 without a "
               "usable NCCL: rank %d's init fails saying so: %s", q, N->msg[q]);
}

int main(void) {
    static const size_t base_counts[] = {0, 1, 3, 1000};
    run_cfg_t runs[16];
    int nruns = 0, i, quick = getenv("DDP_TEST_QUICK") && atoi(getenv("DDP_TEST_QUICK"));
    t_init();
    if (sizeof(coll_shm_t) > T_USER_BYTES || sizeof(nc_shm_t) > T_USER_BYTES) t_bail("shared state too big");
    if (!t_dev_use_fakes()) {
        printf("1..0 # SKIP the fake NCCL is not built (make build/fake_nccl/libnccl.so.2)\n");
        return 0;
    }
    avg_divides_first = 1;   /* ncclAvg: see test_collectives.c */
    if (t_dev_real) {   /* make test-gpu: the real NCCL, T_DEVICE_RANKS ranks (T_DEVICE_HOSTID: on one GPU) */
        int g = getenv("T_DEVICE_RANKS") ? atoi(getenv("T_DEVICE_RANKS")) : 1;
        for (i = 1; i <= g && i <= 8; i *= 2) add_run(runs, &nruns, "tcp", i, 0, NULL, BIG_ALL, 0, base_counts, 4);
        if (g > 2 && g != 4 && g != 8) add_run(runs, &nruns, "tcp", g, 0, NULL, BIG_SUBSET, 0, base_counts, 4);
    } else {
    add_run(runs, &nruns, "tcp", 1, 0, NULL, BIG_NONE, 0, base_counts, 4);
    add_run(runs, &nruns, "tcp", 2, 0, NULL, BIG_ALL, 0, base_counts, 4);
    add_run(runs, &nruns, "tcp", 3, 0, NULL, BIG_SUBSET, 0, base_counts, 4);
    add_run(runs, &nruns, "tcp", 5, 0, NULL, quick ? BIG_NONE : BIG_SUBSET, 0, base_counts, 4);
    if (!quick) add_run(runs, &nruns, "tcp", 8, 0, NULL, BIG_NONE, 0, base_counts, 4);
    add_run(runs, &nruns, "shm", 4, 0, NULL, BIG_NONE, 0, base_counts, 4);
    add_run(runs, &nruns, "late", 2, 0, NULL, BIG_NONE, 0, base_counts, 4);
    }
    if (getenv("T_NCCL_SCENARIOS_ONLY")) nruns = 0;   /* make test-tsan: the threads are there */
    for (i = 0; i < nruns; i++) {
        char name[64];
        int nbad;
        snprintf(name, sizeof name, "device matrix %s p=%d", runs[i].mode, runs[i].p);
        if (!t_selected(name)) continue;
        if (!strcmp(runs[i].mode, "late")) {   /* test_collectives' tcp mode, streams 2 ms late */
            runs[i].mode = "tcp";
            setenv("FAKE_CUDA_STREAM_DELAY_US", "2000", 1);
        }
        S = (coll_shm_t *)t_shm_user(sizeof(coll_shm_t));
        S->ncases = build_cases(&runs[i]);
        nbad = t_run_ranks(runs[i].p, child, &runs[i], 300);
        report_run(&runs[i], nbad);
        unsetenv("FAKE_CUDA_STREAM_DELAY_US");
    }
    nc_scenarios();   /* real mode: those a real NCCL can be made to show (nc_real_ok) */
    return t_done();
}
