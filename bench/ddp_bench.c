/* SPDX-License-Identifier: MIT (see LICENSE) */
/* bench/ddp_bench.c — ddp-bench: libddp's collectives over a size sweep, nccl-tests style.
 * Collectives (--coll, or -o): all_reduce reduce_scatter all_gather broadcast reduce gather scatter
 * all_to_all sendrecv (the last two out of place only).
 *
 *   make build/ddp-bench         (or: cc -std=c99 -O2 -I. -pthread bench/ddp_bench.c -o build/ddp-bench -lm)
 *   build/ddprun -n 4 build/ddp-bench -o all_reduce -b 8 -e 128M -f 2 -n 20 -w 5 -c 1 -d float --transport tcp
 *   build/ddp-bench -N 4 -o all_gather -b8 -e64M          # forks 4 ranks on this host itself
 *   build/ddp-bench -N 2 --mem                            # peak RSS of a 256 MiB all_reduce
 *   build/ddp-bench --list-transports                     # the transports compiled in
 *
 * Options are nccl-tests' where it has the letter (-b -e -f -i -n -w -m -c -o -d -r -a -T -F; -t
 * and -g accept 1 only: a rank is a process with one device); the rest are long options
 * (--transport, --nranks/-N, --inplace, --mem, --sizes/-s, --json/-J, ...). All of them: --help.
 *
 * Without a launcher's variables in the environment the program forks -N ranks itself; each
 * calls ddp_comm_init with master 127.0.0.1 and a port that was free a moment before. With
 * RANK and WORLD_SIZE (torchrun, ddprun), OMPI_COMM_WORLD_RANK/SIZE (mpirun) or PMI_RANK/SIZE
 * it is one rank of the launcher's job and calls ddp_comm_init_env (MASTER_ADDR/MASTER_PORT,
 * default 127.0.0.1:29500). Slurm's variables are not taken as a sign: sbatch sets them for a
 * script that is not a rank.
 * Method, columns and JSON: bench/bench_common.h and bench/README.md.
 */
#define _GNU_SOURCE
#ifndef DDP_BENCH_LINKED   /* the Makefile links build/libddp-nccl.o, the same transports */
#define DDP_IMPLEMENTATION
#endif
#include "ddp.h"
#include "transports/ddp_tcp.h"
/* Every transport header present is compiled in (including one is what registers it). */
#if defined(__has_include)
#if __has_include("transports/ddp_shm.h")
#include "transports/ddp_shm.h"
#define DDPB_HAVE_SHM 1
#endif
/* RDMA needs libibverbs: only in build/ddp-bench-ibverbs (-DDDP_BENCH_IBVERBS ... -libverbs). */
/* NCCL is loaded at run time (dlopen): always compiled in; --transport nccl puts the buffers on
 * the GPU. */
#if __has_include("transports/ddp_nccl.h")
#include "transports/ddp_nccl.h"
#define DDPB_HAVE_NCCL 1
#endif
#if defined(DDP_BENCH_IBVERBS) && __has_include("transports/ddp_ibverbs.h")
#include "transports/ddp_ibverbs.h"
#define DDPB_HAVE_IBVERBS 1
#endif
#endif

#include "bench/bench_common.h"
#include "bench/bench_fork.h"

/* The transport headers this file includes, by the name each registers. */
static const char *const ddpb_transport_names[] = {
    "tcp",
#ifdef DDPB_HAVE_SHM
    "shm",
#endif
#ifdef DDPB_HAVE_IBVERBS
    "ibverbs",
#endif
#ifdef DDPB_HAVE_NCCL
    "nccl",
#endif
};
#define DDPB_NTRANSPORTS (sizeof ddpb_transport_names / sizeof ddpb_transport_names[0])

static int ddpb_coll(void *ctx, int coll, const void *s, void *r, size_t count, int dtype, int op,
                     int root, char *err, size_t errcap) {
    ddp_comm_t *c = (ddp_comm_t *)ctx;
    ddp_result_t rc = DDP_ERR_INVALID_ARGUMENT;
    switch (coll) {
    case BENCH_ALL_REDUCE: rc = ddp_all_reduce(s, r, count, (ddp_dtype_t)dtype, (ddp_op_t)op, c); break;
    case BENCH_REDUCE_SCATTER: rc = ddp_reduce_scatter(s, r, count, (ddp_dtype_t)dtype, (ddp_op_t)op, c); break;
    case BENCH_ALL_GATHER: rc = ddp_all_gather(s, r, count, (ddp_dtype_t)dtype, c); break;
    case BENCH_BROADCAST: rc = ddp_broadcast(s, r, count, (ddp_dtype_t)dtype, root, c); break;
    case BENCH_REDUCE: rc = ddp_reduce(s, r, count, (ddp_dtype_t)dtype, (ddp_op_t)op, root, c); break;
    case BENCH_GATHER: rc = ddp_gather(s, r, count, (ddp_dtype_t)dtype, root, c); break;
    case BENCH_SCATTER: rc = ddp_scatter(s, r, count, (ddp_dtype_t)dtype, root, c); break;
    case BENCH_ALL_TO_ALL: rc = ddp_all_to_all(s, r, count, (ddp_dtype_t)dtype, c); break;
    case BENCH_SENDRECV: {
        /* nccl-tests' sendrecv_perf: send to rank + 1, receive from rank - 1, in one group (one
         * by one they would wait for each other around the ring). group_end closes the group
         * even after a refused call, and returns that call's error. */
        int p = ddp_comm_size(c), me = ddp_comm_rank(c);
        ddp_result_t rs, rr;
        if ((rc = ddp_group_start(c)) != DDP_SUCCESS) break;
        rs = ddp_send(s, count, (ddp_dtype_t)dtype, (me + 1) % p, c);
        rr = ddp_recv(r, count, (ddp_dtype_t)dtype, (me + p - 1) % p, c);
        rc = ddp_group_end(c);
        if (rc == DDP_SUCCESS) rc = rs != DDP_SUCCESS ? rs : rr;
        break;
    }
    default: break;
    }
    if (rc == DDP_SUCCESS) return 0;
    snprintf(err, errcap, "%s: %s", ddp_strerror(rc), ddp_comm_last_error(c));
    return 1;
}

#ifdef DDPB_HAVE_NCCL
/* --transport nccl: device twins of the sweep's host buffers; each call runs on them and is waited for
 * (ddp_comm_device_synchronize: the time is the host's view of completion, as nccl-tests'
 * blocking mode); checked calls copy their data over and back around the call. */
typedef struct {
    ddp_comm_t *c;
    unsigned char *hs, *hr, *ds, *dr;
    size_t cap;
} ddpb_dev_t;
static ddpb_dev_t ddpb_dev;
static bench_backend_t *ddpb_backend;

static void ddpb_dev_buffers(void *ctx, unsigned char *s, unsigned char *r, size_t cap) {
    ddpb_dev_t *d = &ddpb_dev;
    void *a = NULL, *b = NULL;
    d->c = (ddp_comm_t *)ctx;
    d->hs = s; d->hr = r; d->cap = cap;
    if (ddp_comm_device_alloc(d->c, cap, &a) != DDP_SUCCESS || ddp_comm_device_alloc(d->c, cap, &b) != DDP_SUCCESS) {
        fprintf(stderr, "ddp-bench: device buffers: %s\n", ddp_comm_last_error(d->c));
        exit(1);
    }
    d->ds = (unsigned char *)a; d->dr = (unsigned char *)b;
}

static void *ddpb_dev_ptr(const void *h) {
    const unsigned char *p = (const unsigned char *)h;
    if (!p) return NULL;
    if (p >= ddpb_dev.hs && p <= ddpb_dev.hs + ddpb_dev.cap) return ddpb_dev.ds + (p - ddpb_dev.hs);
    return ddpb_dev.dr + (p - ddpb_dev.hr);
}

static int ddpb_coll(void *ctx, int coll, const void *s, void *r, size_t count, int dtype, int op,
                     int root, char *err, size_t errcap);
static int ddpb_coll_dev(void *ctx, int coll, const void *s, void *r, size_t count, int dtype, int op,
                         int root, char *err, size_t errcap) {
    ddpb_dev_t *d = &ddpb_dev;
    const int checking = ddpb_backend && ddpb_backend->checking;
    int rc;
    if (checking) {
        ddp_comm_device_copy(d->c, d->ds, d->hs, d->cap);
        ddp_comm_device_copy(d->c, d->dr, d->hr, d->cap);
    }
    rc = ddpb_coll(ctx, coll, ddpb_dev_ptr(s), ddpb_dev_ptr(r), count, dtype, op, root, err, errcap);
    if (!rc && ddp_comm_device_synchronize(d->c) != DDP_SUCCESS) {
        snprintf(err, errcap, "device synchronize: %s", ddp_comm_last_error(d->c));
        return 1;
    }
    if (!rc && checking) {
        ddp_comm_device_copy(d->c, d->hs, d->ds, d->cap);
        ddp_comm_device_copy(d->c, d->hr, d->dr, d->cap);
        ddp_comm_device_synchronize(d->c);
    }
    return rc;
}
#endif

static int ddpb_barrier(void *ctx) { return ddp_barrier((ddp_comm_t *)ctx) != DDP_SUCCESS; }

static int ddpb_reduce_doubles(void *ctx, double *v, int n, int op) {
    return ddp_all_reduce(v, v, (size_t)n, DDP_FLOAT64, op == BENCH_MAX ? DDP_MAX : DDP_SUM,
                          (ddp_comm_t *)ctx) != DDP_SUCCESS;
}

static int ddpb_bcast_int(void *ctx, int *v) {
    return ddp_broadcast(v, v, 1, DDP_INT32, 0, (ddp_comm_t *)ctx) != DDP_SUCCESS;
}

/* The transports this rank uses to reach its peers, distinct, joined by '+' ("tcp", "shm+tcp");
 * "self" for a world of one. */
static void ddpb_transports_used(const ddp_comm_t *c, char *out, size_t cap) {
    int p = ddp_comm_size(c), me = ddp_comm_rank(c), k;
    size_t off = 0;
    out[0] = 0;
    for (k = 0; k < p; k++) {
        const char *t = ddp_comm_transport_name(c, k), *hit;
        size_t tl = strlen(t);
        if (k == me || !*t || !strcmp(t, "none")) continue;
        hit = strstr(out, t);
        if (hit && (hit == out || hit[-1] == '+') && (hit[tl] == 0 || hit[tl] == '+')) continue;
        off += (size_t)snprintf(out + off, off < cap ? cap - off : 0, "%s%s", off ? "+" : "", t);
    }
    if (!out[0]) snprintf(out, cap, "%s", p == 1 ? "self" : "none");
}

/* --registered 1: the sweep's buffers from ddp_comm_mem_alloc (ddp_window.h), which shared-memory
 * collectives read in place; elsewhere ordinary memory. Parsed here (libddp's own option). */
static int ddpb_registered;
static void *ddpb_alloc(void *ctx, size_t bytes) {
    void *p = NULL;
    return ddp_comm_mem_alloc((ddp_comm_t *)ctx, bytes, &p) == DDP_SUCCESS ? p : NULL;
}
static void ddpb_release(void *ctx, void *ptr) { ddp_comm_mem_free((ddp_comm_t *)ctx, ptr); }

/* Takes --registered N / --registered=N out of argv (the common parser does not know it); 1 and a
 * message for a bad value. */
static int ddpb_take_registered(int *argc, char **argv) {
    int i, j;
    for (i = 1; i < *argc; i++) {
        const char *v = NULL;
        int used = 0;
        if (!strcmp(argv[i], "--registered") && i + 1 < *argc) { v = argv[i + 1]; used = 2; }
        else if (!strncmp(argv[i], "--registered=", 13)) { v = argv[i] + 13; used = 1; }
        if (!used) continue;
        if (strcmp(v, "0") && strcmp(v, "1")) {
            fprintf(stderr, "ddp-bench: --registered takes 0 or 1, not '%s'\n", v);
            return 1;
        }
        ddpb_registered = v[0] == '1';
        for (j = i; j + used <= *argc; j++) argv[j] = argv[j + used];
        *argc -= used;
        i--;
    }
    return 0;
}

static int run_rank(const bench_opts_t *o, int nranks, int rank, int port) {
    ddp_comm_t *c = NULL;
    ddp_comm_desc_t desc;
    bench_backend_t b;
    char descr[256], used[96];
    ddp_result_t r;
    int rc;
    memset(&desc, 0, sizeof desc);
    desc.transport = o->transport;
#ifdef DDPB_HAVE_NCCL
    if (o->transport && !strcmp(o->transport, "nccl")) {   /* host transports stay automatic */
        desc.transport = NULL;
        unsetenv("DDP_TRANSPORT");   /* DDP_TRANSPORT=nccl asked for this, as --transport nccl */
        setenv("DDP_NCCL", "1", 1);
    }
#endif
    if (!(c = bench_ddp_init(&desc, nranks, rank, port, "ddp-bench"))) return 1;
    memset(&b, 0, sizeof b);
    b.name = "libddp";
    b.ctx = c;
    b.rank = ddp_comm_rank(c);
    b.nranks = ddp_comm_size(c);
    b.coll = ddpb_coll;
    b.barrier = ddpb_barrier;
    b.reduce_doubles = ddpb_reduce_doubles;
    b.bcast_int = ddpb_bcast_int;
    if (ddpb_registered) {
        b.alloc = ddpb_alloc;
        b.release = ddpb_release;
    }
    ddpb_transports_used(c, used, sizeof used);
#ifdef DDPB_HAVE_NCCL
    if (o->transport && !strcmp(o->transport, "nccl")) {
        char host[48];
        snprintf(host, sizeof host, "%s", used);
        snprintf(used, sizeof used, "nccl (device buffers; host: %s)", host);
        b.coll = ddpb_coll_dev;
        b.buffers = ddpb_dev_buffers;
        ddpb_backend = &b;
    }
#endif
    b.transport = used;
    snprintf(descr, sizeof descr, "libddp %d.%d, transport %s%s, %s", DDP_VERSION_MAJOR,
             DDP_VERSION_MINOR, used, ddpb_registered ? ", registered buffers" : "",
             port ? "ranks forked by the bench (-N)" : "one rank per process (launcher environment)");
    b.description = descr;
    rc = o->mem_mode ? bench_main_mem(o, &b) : bench_main_sweep(o, &b);
    r = ddp_comm_destroy(c);
    if (r != DDP_SUCCESS) {
        fprintf(stderr, "rank %d: ddp_comm_destroy: %s\n", b.rank, ddp_strerror(r));
        rc = 1;
    }
    return rc;
}

static int run_rank_forked(void *arg, int n, int rank, int port) {
    return run_rank((const bench_opts_t *)arg, n, rank, port);
}

int main(int argc, char **argv) {
    bench_opts_t o;
    int port, rc;
    size_t k;
    char version[64];
    snprintf(version, sizeof version, "ddp-bench (libddp) %d.%d", DDP_VERSION_MAJOR, DDP_VERSION_MINOR);
    if (ddpb_take_registered(&argc, argv)) return 2;
    if ((rc = bench_parse_args(argc, argv, &o, 1, version)) >= 0) {
        for (k = 1; k < (size_t)argc; k++)
            if (!strcmp(argv[k], "--help") || !strcmp(argv[k], "-h"))
                printf("libddp's own:\n"
                       "      --registered 0|1    1: the buffers come from ddp_comm_mem_alloc (registered:\n"
                       "                          shared-memory collectives read them in place); default 0\n");
        return rc;
    }
    if (!o.transport_given) {   /* what the library itself would take: DDP_TRANSPORT */
        const char *env = getenv("DDP_TRANSPORT");
        if (env && *env && strcmp(env, "auto")) o.transport = env;
    }
    if (o.list_transports) {
        for (k = 0; k < DDPB_NTRANSPORTS; k++)
            if (ddp_transport_find(ddpb_transport_names[k])) printf("%s\n", ddpb_transport_names[k]);
        return 0;
    }
    if (o.transport && !ddp_transport_find(o.transport)) {
        fprintf(stderr, "ddp-bench: transport '%s' is not compiled in (--list-transports)\n", o.transport);
        return 2;
    }
    if (o.timeout_s) {   /* -T: every rank's waits, forked or launched */
        char ms[32];
        snprintf(ms, sizeof ms, "%ld", (long)o.timeout_s * 1000);
        setenv("DDP_TIMEOUT_MS", ms, 1);
    }
    if ((getenv("RANK") && getenv("WORLD_SIZE")) ||
        (getenv("OMPI_COMM_WORLD_RANK") && getenv("OMPI_COMM_WORLD_SIZE")) ||
        (getenv("PMI_RANK") && getenv("PMI_SIZE")))
        return run_rank(&o, 0, 0, 0);
    if (!(port = bench_free_port())) { perror("ddp-bench: no free port on 127.0.0.1"); return 1; }
    return bench_fork_ranks(o.nranks, run_rank_forked, &o, "ddp-bench", port);
}
