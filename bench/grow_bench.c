/* SPDX-License-Identifier: MIT (see LICENSE) */
/* bench/grow_bench.c — what growing a job costs (ddp_comm_grow.h), on this host.
 *
 *   build/grow-bench [-n MEMBERS] [-t tcp|shm] [-i ITERS] [-r REPEATS]
 *
 * 1. The per-step check, nobody waiting: ns per ddp_comm_joiners_waiting call (it reads the
 *    watcher thread's answer), and the step time of a training-like loop of 8-byte all-reduces
 *    with and without the check in every step (the watcher running in both: it starts with the
 *    first check), as a ratio measured in the same run. The agreement on the count costs
 *    nothing extra when it rides in a collective the step makes anyway (the elastic reducer's
 *    commit round); a separate 4-byte all-reduce MAX is measured too, for trainers without it.
 * 2. A grow: MEMBERS ranks step; a joiner process is forked; the time from its start to its
 *    first all-reduce done on the grown communicator (the members grow when they all see it
 *    waiting), REPEATS times (a fresh job each), median and max.
 * Prints one line per measurement; exits 1 if a run failed. */
#define _GNU_SOURCE
#define DDP_IMPLEMENTATION
#include "ddp.h"
#include "transports/ddp_tcp.h"
#include "transports/ddp_shm.h"
#include "bench/bench_fork.h"

#include <sys/mman.h>

typedef struct {
    int members, iters, repeats;
    const char *transport;
    double *shared;              /* MAP_SHARED: per rank results; [64..]: the grow's times */
} opts_t;

static double now_s(void) { return bench_fork_now_s(); }

static ddp_comm_t *member_init(const opts_t *o, int n, int rank, int port) {
    ddp_comm_desc_t d;
    memset(&d, 0, sizeof d);
    d.transport = o->transport;
    d.store_prefix = "growbench";
    return bench_ddp_init(&d, n, rank, port, "grow-bench");
}

/* Part 1 on each member: the call's cost, then steps with and without it (alternating blocks,
 * so drift hits both alike). */
static int check_cost(void *arg, int n, int rank, int port) {
    const opts_t *o = (const opts_t *)arg;
    ddp_comm_t *c = member_init(o, n, rank, port);
    double t0, plain = 0, checked = 0, agreed = 0, sink = 0;
    int i, b, blocks = 10;
    int64_t v = 1;
    if (!c) return 1;
    ddp_comm_joiners_waiting(c);   /* starts the watcher: it runs in every loop below */
    usleep(200000);
    t0 = now_s();
    for (i = 0; i < 1000000; i++) sink += ddp_comm_joiners_waiting(c);
    o->shared[rank] = (now_s() - t0) * 1e9 / 1000000;
    for (b = 0; b < blocks; b++) {
        int per = o->iters / blocks;
        ddp_barrier(c);
        t0 = now_s();
        for (i = 0; i < per; i++) if (ddp_all_reduce(&v, &v, 1, DDP_INT64, DDP_MAX, c) != DDP_SUCCESS) return 1;
        plain += now_s() - t0;
        ddp_barrier(c);
        t0 = now_s();
        for (i = 0; i < per; i++) {
            sink += ddp_comm_joiners_waiting(c);
            if (ddp_all_reduce(&v, &v, 1, DDP_INT64, DDP_MAX, c) != DDP_SUCCESS) return 1;
        }
        checked += now_s() - t0;
        ddp_barrier(c);
        t0 = now_s();
        for (i = 0; i < per; i++) {
            int32_t w = ddp_comm_joiners_waiting(c);
            if (ddp_all_reduce(&v, &v, 1, DDP_INT64, DDP_MAX, c) != DDP_SUCCESS ||
                ddp_all_reduce(&w, &w, 1, DDP_INT32, DDP_MAX, c) != DDP_SUCCESS) return 1;
        }
        agreed += now_s() - t0;
    }
    if (rank == 0) {
        double per = (double)(o->iters / blocks * blocks);
        printf("grow-bench: check, nobody waiting (%s, %d ranks): ddp_comm_joiners_waiting %.1f ns/call "
               "(rank 0; %.1f max over ranks below)\n", o->transport, n, o->shared[0], 0.0);
        printf("grow-bench: step = 8-byte all-reduce: %.2f us; with the check: %.2f us (ratio %.3f); with the "
               "check and its own 4-byte all-reduce MAX: %.2f us (ratio %.3f)\n", plain / per * 1e6,
               checked / per * 1e6, checked / plain, agreed / per * 1e6, agreed / plain);
    }
    ddp_barrier(c);
    if (rank == 0) {
        double mx = 0;
        for (i = 0; i < n; i++) if (o->shared[i] > mx) mx = o->shared[i];
        printf("grow-bench: ddp_comm_joiners_waiting max over the %d ranks: %.1f ns/call (sink %g)\n", n, mx, sink > 0 ? 1.0 : 0.0);
    }
    ddp_comm_destroy(c);
    return 0;
}

/* Part 2: members step until they agree someone waits, grow, one all-reduce; the joiner (the
 * last process) starts after the members' first steps, joins, does the same all-reduce. */
static int grow_once(void *arg, int n, int rank, int port) {
    const opts_t *o = (const opts_t *)arg;
    double *t = o->shared + 64;   /* [0] joiner start, [1] joiner's first all-reduce done */
    ddp_comm_t *c = NULL, *g = NULL;
    int64_t v = 1;
    if (rank == n - 1) {   /* the joiner */
        ddp_comm_desc_t d;
        while (t[2] == 0) usleep(1000);   /* the members are stepping */
        memset(&d, 0, sizeof d);
        d.transport = o->transport;
        d.store_prefix = "growbench";
        d.master_addr = "127.0.0.1";
        d.master_port = port;
        d.timeout_ms = 120000;
        t[0] = now_s();
        if (ddp_comm_join(&c, &d, NULL) != DDP_SUCCESS) {
            fprintf(stderr, "grow-bench: join: %s\n", ddp_last_init_error());
            return 1;
        }
        if (ddp_all_reduce(&v, &v, 1, DDP_INT64, DDP_SUM, c) != DDP_SUCCESS) return 1;
        t[1] = now_s();
        ddp_comm_destroy(c);
        return 0;
    }
    if (!(c = member_init(o, n - 1, rank, port))) return 1;
    for (;;) {
        int32_t w = ddp_comm_joiners_waiting(c);
        if (ddp_all_reduce(&v, &v, 1, DDP_INT64, DDP_MAX, c) != DDP_SUCCESS ||
            ddp_all_reduce(&w, &w, 1, DDP_INT32, DDP_MAX, c) != DDP_SUCCESS) return 1;
        if (rank == 0) t[2] = 1;
        if (w == 0) { usleep(1000); continue; }
        if (ddp_comm_grow(c, NULL, &g) != DDP_SUCCESS) {
            fprintf(stderr, "grow-bench: grow: %s\n", ddp_comm_last_error(c));
            return 1;
        }
        if (g) break;
    }
    ddp_comm_destroy(c);
    v = 1;
    if (ddp_all_reduce(&v, &v, 1, DDP_INT64, DDP_SUM, g) != DDP_SUCCESS || v != n) return 1;
    ddp_comm_destroy(g);
    return 0;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
    opts_t o;
    int i, failed = 0;
    double ms[64];
    memset(&o, 0, sizeof o);
    o.members = 3, o.iters = 20000, o.repeats = 5, o.transport = "tcp";
    for (i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "-n")) o.members = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "-t")) o.transport = argv[i + 1];
        else if (!strcmp(argv[i], "-i")) o.iters = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "-r")) o.repeats = atoi(argv[i + 1]);
        else { fprintf(stderr, "usage: %s [-n MEMBERS] [-t tcp|shm] [-i ITERS] [-r REPEATS]\n", argv[0]); return 2; }
    }
    if (o.members < 1 || o.members > 32 || o.repeats < 1 || o.repeats > 64 || o.iters < 10) return 2;
    o.shared = (double *)mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (o.shared == MAP_FAILED) return 1;
    setenv("DDP_JOIN_POLL_MS", getenv("DDP_JOIN_POLL_MS") ? getenv("DDP_JOIN_POLL_MS") : "100", 1);
    memset(o.shared, 0, 4096);
    failed |= bench_fork_ranks(o.members, check_cost, &o, "grow-bench", bench_free_port());
    for (i = 0; i < o.repeats && !failed; i++) {
        memset(o.shared, 0, 4096);
        failed |= bench_fork_ranks(o.members + 1, grow_once, &o, "grow-bench", bench_free_port());
        ms[i] = (o.shared[65] - o.shared[64]) * 1e3;
    }
    if (!failed) {
        qsort(ms, (size_t)o.repeats, sizeof ms[0], cmp);
        printf("grow-bench: grow %d -> %d ranks (%s, DDP_JOIN_POLL_MS %s): joiner start -> its first all-reduce "
               "on the grown communicator: median %.1f ms, max %.1f ms (%d runs)\n", o.members, o.members + 1,
               o.transport, getenv("DDP_JOIN_POLL_MS"), ms[o.repeats / 2], ms[o.repeats - 1], o.repeats);
    }
    return failed ? 1 : 0;
}
