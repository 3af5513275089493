/* SPDX-License-Identifier: MIT (see LICENSE) */
/* bench/nccl_raw.c — nccl-raw: ncclAllReduce with nothing of libddp around it, the baseline that
 * `ddp-bench --transport nccl -o all_reduce` is compared with (tests/gpu/test_gpu.sh, make test-gpu).
 *
 *   make build/nccl-raw
 *   build/nccl-raw -b 16 -e 256M -f 4                       # one rank
 *   build/ddprun -n 2 build/nccl-raw -b 16 -e 256M -f 4      # a rank per process (RANK, WORLD_SIZE)
 *   build/nccl-raw -V                                       # libraries, versions, devices; no NCCL call
 *
 * Libraries: loaded at run time as transports/ddp_nccl.h loads them (DDP_CUDART_LIBRARY, else
 * libcudart.so.13 / .12; DDP_NCCL_LIBRARY, else libnccl.so.2); no CUDA headers: the few
 * prototypes are declared below with plain C types. Device: LOCAL_RANK modulo the visible ones.
 * Several ranks: rank 0 serves libddp's store at MASTER_ADDR:MASTER_PORT (127.0.0.1:29500 by
 * default; ddprun sets both, and DDP_JOB_SECRET) and hands out its ncclUniqueId there.
 *
 * Per size (float32 sum, out of place, cudaMalloc'd buffers, one non-blocking stream), after -w
 * warm-up calls, two timings of -n back-to-back calls:
 *   events: cudaEventRecord before and after the n calls, then cudaEventElapsedTime / n: what the
 *           GPU spent, the NCCL ceiling;
 *   host:   each call enqueued, then cudaStreamSynchronize, host clock / n: the host's view of
 *           each call's completion, which is how ddp-bench times a device call.
 * Times are averaged over ranks (nccl-tests' default); algbw = size / time, GB = 1e9 B. Rows are
 * printed by rank 0: size count iters events_us events_GBs host_us host_GBs.
 * Without a CUDA runtime or a GPU it prints one line saying so and exits 0; any later failure
 * exits 1 naming the call and NCCL's or CUDA's message. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#define DDP_IMPLEMENTATION
#include "ddp_store.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define NR_MAX_SIZES 64
#define NR_FLOAT32 7        /* ncclFloat32 */
#define NR_FLOAT64 8        /* ncclFloat64 */
#define NR_SUM 0            /* ncclSum */
#define NR_H2D 1            /* cudaMemcpyHostToDevice */
#define NR_D2H 2
#define NR_NONBLOCKING 1u   /* cudaStreamNonBlocking */

typedef struct { char internal[128]; } nr_id_t;   /* ncclUniqueId */
typedef struct nr_comm *nr_comm_t;                 /* ncclComm_t */
typedef void *nr_stream_t, *nr_event_t;            /* cudaStream_t, cudaEvent_t */

typedef struct {
    int (*GetDeviceCount)(int *);
    int (*SetDevice)(int);
    int (*Malloc)(void **, size_t);
    int (*Free)(void *);
    int (*Memset)(void *, int, size_t);
    int (*Memcpy)(void *, const void *, size_t, int);
    int (*DeviceSynchronize)(void);
    int (*StreamCreateWithFlags)(nr_stream_t *, unsigned);
    int (*StreamSynchronize)(nr_stream_t);
    int (*StreamDestroy)(nr_stream_t);
    int (*EventCreate)(nr_event_t *);
    int (*EventRecord)(nr_event_t, nr_stream_t);
    int (*EventSynchronize)(nr_event_t);
    int (*EventElapsedTime)(float *, nr_event_t, nr_event_t);
    int (*EventDestroy)(nr_event_t);
    const char *(*CudaErrorString)(int);
    int (*RuntimeGetVersion)(int *);
    int (*DriverGetVersion)(int *);
    int (*GetVersion)(int *);
    int (*GetUniqueId)(nr_id_t *);
    int (*CommInitRank)(nr_comm_t *, int, nr_id_t, int);
    int (*AllReduce)(const void *, void *, size_t, int, int, nr_comm_t, nr_stream_t);
    int (*CommDestroy)(nr_comm_t);
    const char *(*NcclErrorString)(int);
    char cudart_path[512], nccl_path[512];
} nr_api_t;

static nr_api_t api;
static int me;   /* this rank, for messages */

static void die(const char *what, const char *msg) {
    fprintf(stderr, "nccl-raw: rank %d: %s: %s\n", me, what, msg);
    exit(1);
}
static void cu(int rc, const char *what) {
    if (rc) die(what, api.CudaErrorString ? api.CudaErrorString(rc) : "CUDA error");
}
static void nc(int rc, const char *what) {
    if (rc) die(what, api.NcclErrorString ? api.NcclErrorString(rc) : "NCCL error");
}

/* The env override alone, else the first name that loads; *used gets what loaded. */
static void *open_lib(const char *env, const char *const *names, char *used, size_t cap, char *err,
                      size_t ecap) {
    const char *forced = getenv(env);
    void *h = NULL;
    int i;
    if (forced && forced[0]) {
        if (!(h = dlopen(forced, RTLD_NOW | RTLD_LOCAL))) snprintf(err, ecap, "%s=%s: %s", env, forced, dlerror());
        snprintf(used, cap, "%s", forced);
        return h;
    }
    for (i = 0; names[i] && !h; i++) {
        if ((h = dlopen(names[i], RTLD_NOW | RTLD_LOCAL)) != NULL) snprintf(used, cap, "%s", names[i]);
        else if (i == 0) snprintf(err, ecap, "%s", dlerror());
    }
    return h;
}

/* dlsym into a function pointer without casting an object pointer to a function pointer. */
#define NR_SYM(h, field, name)                                          \
    do {                                                                \
        void *s_ = dlsym((h), (name));                                  \
        if (!s_) { missing = (name); break; }                           \
        memcpy(&api.field, &s_, sizeof s_);                             \
    } while (0)

/* 0: the CUDA runtime is loaded; else *why says what is missing. */
static int load_cudart(char *why, size_t cap) {
    static const char *const names[] = { "libcudart.so.13", "libcudart.so.12", NULL };
    const char *missing = NULL;
    void *h = open_lib("DDP_CUDART_LIBRARY", names, api.cudart_path, sizeof api.cudart_path, why, cap);
    if (!h) return 1;
    NR_SYM(h, GetDeviceCount, "cudaGetDeviceCount");
    NR_SYM(h, SetDevice, "cudaSetDevice");
    NR_SYM(h, Malloc, "cudaMalloc");
    NR_SYM(h, Free, "cudaFree");
    NR_SYM(h, Memset, "cudaMemset");
    NR_SYM(h, Memcpy, "cudaMemcpy");
    NR_SYM(h, DeviceSynchronize, "cudaDeviceSynchronize");
    NR_SYM(h, StreamCreateWithFlags, "cudaStreamCreateWithFlags");
    NR_SYM(h, StreamSynchronize, "cudaStreamSynchronize");
    NR_SYM(h, StreamDestroy, "cudaStreamDestroy");
    NR_SYM(h, EventCreate, "cudaEventCreate");
    NR_SYM(h, EventRecord, "cudaEventRecord");
    NR_SYM(h, EventSynchronize, "cudaEventSynchronize");
    NR_SYM(h, EventElapsedTime, "cudaEventElapsedTime");
    NR_SYM(h, EventDestroy, "cudaEventDestroy");
    NR_SYM(h, CudaErrorString, "cudaGetErrorString");
    if (missing) { snprintf(why, cap, "%s has no %s", api.cudart_path, missing); return 1; }
    NR_SYM(h, RuntimeGetVersion, "cudaRuntimeGetVersion");   /* optional: only printed */
    NR_SYM(h, DriverGetVersion, "cudaDriverGetVersion");
    return 0;
}

static void load_nccl(void) {
    static const char *const names[] = { "libnccl.so.2", NULL };
    const char *missing = NULL;
    char err[512] = "";
    void *h = open_lib("DDP_NCCL_LIBRARY", names, api.nccl_path, sizeof api.nccl_path, err, sizeof err);
    if (!h) die("no NCCL", err);
    NR_SYM(h, GetVersion, "ncclGetVersion");
    NR_SYM(h, GetUniqueId, "ncclGetUniqueId");
    NR_SYM(h, CommInitRank, "ncclCommInitRank");
    NR_SYM(h, AllReduce, "ncclAllReduce");
    NR_SYM(h, CommDestroy, "ncclCommDestroy");
    NR_SYM(h, NcclErrorString, "ncclGetErrorString");
    if (missing) die(api.nccl_path, missing);
}

/* "64", "4K", "16M", "1G" (binary); 0 if malformed. */
static size_t parse_size(const char *s) {
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    switch (*end) {
    case 'k': case 'K': v <<= 10; end++; break;
    case 'm': case 'M': v <<= 20; end++; break;
    case 'g': case 'G': v <<= 30; end++; break;
    default: break;
    }
    return *end || end == s ? 0 : (size_t)v;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int env_int(const char *name, int dflt) {
    const char *v = getenv(name);
    return v && *v ? atoi(v) : dflt;
}

/* Rank 0's ncclUniqueId, through libddp's store on MASTER_ADDR:MASTER_PORT. Rank 0 keeps the
 * store open (*store) until the end: the others have their id once NCCL's init returns. */
static nr_id_t share_id(int rank, ddp_store_t **store) {
    const char *addr = getenv("MASTER_ADDR");
    ddp_store_t *s = NULL;
    nr_id_t id;
    size_t len = 0;
    ddp_result_t r;
    if (!addr || !*addr) addr = "127.0.0.1";
    memset(&id, 0, sizeof id);
    r = ddp_store_open(&s, addr, env_int("MASTER_PORT", 29500), rank == 0, NULL);
    if (r != DDP_SUCCESS) die("store", s ? ddp_store_last_error(s) : ddp_strerror(r));
    if (rank == 0) {
        nc(api.GetUniqueId(&id), "ncclGetUniqueId");
        if (ddp_store_set(s, "nccl-raw/id", &id, sizeof id) != DDP_SUCCESS) die("store set", ddp_store_last_error(s));
        *store = s;
    } else {
        if (ddp_store_get(s, "nccl-raw/id", &id, sizeof id, &len) != DDP_SUCCESS) die("store get", ddp_store_last_error(s));
        if (len != sizeof id) die("store get", "rank 0's unique id has the wrong length");
        ddp_store_close(s);
    }
    return id;
}

static void usage(void) {
    fprintf(stderr, "usage: nccl-raw [-b minbytes] [-e maxbytes] [-f factor] [-n iters] [-w warmup] [-V]\n"
                    "  sizes as ddp-bench's -b/-e/-f (default 8 .. 64M, x2; K/M/G binary); -n 20, -w 5\n"
                    "  -V  print the libraries, their versions and the device count, then exit\n");
}

int main(int argc, char **argv) {
    size_t sizes[NR_MAX_SIZES], minb = 8, maxb = 64u << 20, cap;
    double factor = 2.0, b;
    int nsizes = 0, iters = 20, warmup = 5, version_only = 0, i, k;
    int rank = env_int("RANK", 0), world = env_int("WORLD_SIZE", 1), ndev = 0, rt = 0, drv = 0, nv = 0;
    char why[600] = "";
    ddp_store_t *store = NULL;
    nr_comm_t comm = NULL;
    nr_stream_t st = NULL;
    nr_event_t e0 = NULL, e1 = NULL;
    void *send = NULL, *recv = NULL, *dstat = NULL;
    nr_id_t id;
    int rc;

    for (i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-V")) { version_only = 1; continue; }
        if (a[0] != '-' || !a[1] || a[2] || !v) { usage(); return 2; }
        i++;
        switch (a[1]) {
        case 'b': minb = parse_size(v); break;
        case 'e': maxb = parse_size(v); break;
        case 'f': factor = atof(v); break;
        case 'n': iters = atoi(v); break;
        case 'w': warmup = atoi(v); break;
        default: usage(); return 2;
        }
    }
    if (minb < 4 || maxb < minb || factor <= 1.0 || iters < 1 || warmup < 0) {
        fprintf(stderr, "nccl-raw: need 4 <= -b <= -e, -f > 1, -n >= 1, -w >= 0\n");
        return 2;
    }
    for (b = (double)minb; b <= (double)maxb && nsizes < NR_MAX_SIZES; b *= factor)
        sizes[nsizes++] = (size_t)b / 4 * 4;   /* whole floats, as ddp-bench rounds */
    if (rank < 0 || world < 1 || rank >= world) { fprintf(stderr, "nccl-raw: RANK %d of WORLD_SIZE %d\n", rank, world); return 2; }
    me = rank;

    if (load_cudart(why, sizeof why)) { printf("nccl-raw: skipped: no CUDA runtime (%s)\n", why); return 0; }
    rc = api.GetDeviceCount(&ndev);
    if (rc || ndev < 1) {
        printf("nccl-raw: skipped: no GPU (cudaGetDeviceCount: %s, %d devices; runtime %s)\n",
               rc ? api.CudaErrorString(rc) : "no error", ndev, api.cudart_path);
        return 0;
    }
    load_nccl();
    if (api.RuntimeGetVersion) api.RuntimeGetVersion(&rt);
    if (api.DriverGetVersion) api.DriverGetVersion(&drv);
    api.GetVersion(&nv);
    if (version_only) {
        printf("nccl-raw: NCCL %d.%d.%d (%s); CUDA runtime %d.%d (%s); driver supports CUDA %d.%d; %d GPU%s\n",
               nv / 10000, nv / 100 % 100, nv % 100, api.nccl_path, rt / 1000, rt % 1000 / 10,
               api.cudart_path, drv / 1000, drv % 1000 / 10, ndev, ndev == 1 ? "" : "s");
        return 0;
    }

    cu(api.SetDevice(env_int("LOCAL_RANK", rank) % ndev), "cudaSetDevice");
    if (world == 1) nc(api.GetUniqueId(&id), "ncclGetUniqueId");
    else id = share_id(rank, &store);
    nc(api.CommInitRank(&comm, world, id, rank), "ncclCommInitRank");
    cap = sizes[nsizes - 1];
    cu(api.StreamCreateWithFlags(&st, NR_NONBLOCKING), "cudaStreamCreateWithFlags");
    cu(api.Malloc(&send, cap), "cudaMalloc");
    cu(api.Malloc(&recv, cap), "cudaMalloc");
    cu(api.Malloc(&dstat, 2 * sizeof(double)), "cudaMalloc");
    cu(api.Memset(send, 0, cap), "cudaMemset");
    cu(api.Memset(recv, 0, cap), "cudaMemset");
    cu(api.DeviceSynchronize(), "cudaDeviceSynchronize");
    cu(api.EventCreate(&e0), "cudaEventCreate");
    cu(api.EventCreate(&e1), "cudaEventCreate");
    if (rank == 0) {
        printf("# nccl-raw: ncclAllReduce float32 sum, out of place, %d rank%s, NCCL %d.%d.%d (%s), "
               "CUDA runtime %d.%d (%s), %d GPU%s visible\n", world, world == 1 ? "" : "s", nv / 10000,
               nv / 100 % 100, nv % 100, api.nccl_path, rt / 1000, rt % 1000 / 10, api.cudart_path, ndev,
               ndev == 1 ? "" : "s");
        printf("# events: cudaEventRecord around %d back-to-back calls; host: each call enqueued then "
               "cudaStreamSynchronize, host clock. Means over ranks; GB = 1e9 B\n", iters);
        printf("#%11s %12s %6s %12s %11s %12s %11s\n", "size", "count", "iters", "events_us", "events_GBs",
               "host_us", "host_GBs");
        fflush(stdout);
    }
    for (k = 0; k < nsizes; k++) {
        const size_t count = sizes[k] / 4, bytes = count * 4;
        double t, stat[2];
        float ms = 0;
        for (i = 0; i < warmup; i++) nc(api.AllReduce(send, recv, count, NR_FLOAT32, NR_SUM, comm, st), "ncclAllReduce");
        /* a one-element all-reduce, waited for: every rank starts the timed calls together */
        nc(api.AllReduce(send, recv, 1, NR_FLOAT32, NR_SUM, comm, st), "ncclAllReduce");
        cu(api.StreamSynchronize(st), "cudaStreamSynchronize");
        cu(api.EventRecord(e0, st), "cudaEventRecord");
        for (i = 0; i < iters; i++) nc(api.AllReduce(send, recv, count, NR_FLOAT32, NR_SUM, comm, st), "ncclAllReduce");
        cu(api.EventRecord(e1, st), "cudaEventRecord");
        cu(api.EventSynchronize(e1), "cudaEventSynchronize");
        cu(api.EventElapsedTime(&ms, e0, e1), "cudaEventElapsedTime");
        stat[0] = (double)ms * 1e3 / iters;
        nc(api.AllReduce(send, recv, 1, NR_FLOAT32, NR_SUM, comm, st), "ncclAllReduce");
        cu(api.StreamSynchronize(st), "cudaStreamSynchronize");
        t = now_s();
        for (i = 0; i < iters; i++) {
            nc(api.AllReduce(send, recv, count, NR_FLOAT32, NR_SUM, comm, st), "ncclAllReduce");
            cu(api.StreamSynchronize(st), "cudaStreamSynchronize");
        }
        stat[1] = (now_s() - t) * 1e6 / iters;
        /* the means over ranks (cudaMemcpy from pageable memory may return before the data
         * lands: wait for the device before the non-blocking stream reads it) */
        cu(api.Memcpy(dstat, stat, sizeof stat, NR_H2D), "cudaMemcpy");
        cu(api.DeviceSynchronize(), "cudaDeviceSynchronize");
        nc(api.AllReduce(dstat, dstat, 2, NR_FLOAT64, NR_SUM, comm, st), "ncclAllReduce");
        cu(api.StreamSynchronize(st), "cudaStreamSynchronize");
        cu(api.Memcpy(stat, dstat, sizeof stat, NR_D2H), "cudaMemcpy");
        stat[0] /= world;
        stat[1] /= world;
        if (rank == 0) {
            printf("%12zu %12zu %6d %12.2f %11.3f %12.2f %11.3f\n", bytes, count, iters, stat[0],
                   stat[0] > 0 ? (double)bytes / stat[0] * 1e-3 : 0.0, stat[1],
                   stat[1] > 0 ? (double)bytes / stat[1] * 1e-3 : 0.0);
            fflush(stdout);
        }
    }
    api.EventDestroy(e0);
    api.EventDestroy(e1);
    api.Free(send);
    api.Free(recv);
    api.Free(dstat);
    api.StreamDestroy(st);
    nc(api.CommDestroy(comm), "ncclCommDestroy");
    if (store) ddp_store_close(store);
    return 0;
}
