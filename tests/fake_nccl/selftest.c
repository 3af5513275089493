/* SPDX-License-Identifier: MIT (see LICENSE) */
/* tests/fake_nccl/selftest.c — TAP self-test of the fake CUDA runtime and the fake NCCL.
 *
 *     sh tests/fake_nccl/build.sh build/fake_nccl && prove -v build/fake_nccl/selftest
 *
 * It dlopens libcudart.so.13 and libnccl.so.2 by path from its own directory (or from the
 * directory given as argv[1]), as transports/ddp_nccl.h does, and checks: loading (one copy of
 * the runtime, whichever is loaded first), devices, memory classification, device memory unreadable by the host, copies,
 * stream ordering and the legacy stream's rules, events, the stream delay, errors; then NCCL:
 * a 2-process all-reduce (fork), every collective and dtype/op between 3 thread ranks, groups
 * of sends and receives, mismatches, split, nonblocking init, abort of a hung collective and of
 * one whose peer process died, the injection switches, and unload (no thread of ours left, no
 * /dev/shm litter).
 *
 * Nothing here depends on timing: "not yet" is checked with a gate (a work item that holds the
 * stream until the test opens it) or with an operation whose peer never comes; waits that would
 * hang on a bug are bounded by alarm().
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* ---------------------------------------------------------------- the API, by dlsym */

typedef struct { char internal[128]; } uid_t128;
typedef void *comm_t;

/* ncclConfig_t as in nccl.h 2.28, and NCCL_CONFIG_INITIALIZER. */
typedef struct {
    size_t size;
    unsigned int magic, version;
    int blocking, cgaClusterSize, minCTAs, maxCTAs;
    const char *netName;
    int splitShare, trafficClass;
    const char *commName;
    int collnetEnable, CTAPolicy, shrinkShare, nvlsCTAs, nChannelsPerNetPeer, nvlinkCentricSched;
} config_t;

struct ptr_attr {
    int type, device;
    void *devicePointer, *hostPointer;
    long reserved[8];
};

#define CUDA_FUNCS(X)                                                            \
    X(int, cudaGetDeviceCount, (int *))                                          \
    X(int, cudaSetDevice, (int))                                                 \
    X(int, cudaGetDevice, (int *))                                               \
    X(int, cudaPointerGetAttributes, (struct ptr_attr *, const void *))          \
    X(int, cudaMalloc, (void **, size_t))                                        \
    X(int, cudaFree, (void *))                                                   \
    X(int, cudaMemcpy, (void *, const void *, size_t, int))                      \
    X(int, cudaMemcpyAsync, (void *, const void *, size_t, int, void *))         \
    X(int, cudaMemset, (void *, int, size_t))                                    \
    X(int, cudaMemsetAsync, (void *, int, size_t, void *))                       \
    X(int, cudaStreamCreate, (void **))                                          \
    X(int, cudaStreamCreateWithFlags, (void **, unsigned))                       \
    X(int, cudaStreamDestroy, (void *))                                          \
    X(int, cudaStreamSynchronize, (void *))                                      \
    X(int, cudaStreamQuery, (void *))                                            \
    X(int, cudaStreamWaitEvent, (void *, void *, unsigned))                      \
    X(int, cudaEventCreate, (void **))                                           \
    X(int, cudaEventCreateWithFlags, (void **, unsigned))                        \
    X(int, cudaEventRecord, (void *, void *))                                    \
    X(int, cudaEventQuery, (void *))                                             \
    X(int, cudaEventSynchronize, (void *))                                       \
    X(int, cudaEventDestroy, (void *))                                           \
    X(int, cudaDeviceSynchronize, (void))                                        \
    X(int, cudaGetLastError, (void))                                             \
    X(int, cudaPeekAtLastError, (void))                                          \
    X(const char *, cudaGetErrorString, (int))                                   \
    X(const char *, cudaGetErrorName, (int))                                     \
    X(int, cudaRuntimeGetVersion, (int *))                                       \
    X(int, cudaDriverGetVersion, (int *))                                        \
    X(int, fake_cuda_enqueue, (void *, void (*)(void *), void *))                \
    X(void *, fake_cuda_shadow, (const void *, size_t))

#define NCCL_FUNCS(X)                                                                     \
    X(int, ncclGetVersion, (int *))                                                       \
    X(int, ncclGetUniqueId, (uid_t128 *))                                                 \
    X(int, ncclCommInitRankConfig, (comm_t *, int, uid_t128, int, config_t *))            \
    X(int, ncclCommInitRank, (comm_t *, int, uid_t128, int))                              \
    X(int, ncclCommSplit, (comm_t, int, int, comm_t *, config_t *))                       \
    X(int, ncclCommGetAsyncError, (comm_t, int *))                                        \
    X(int, ncclCommAbort, (comm_t))                                                       \
    X(int, ncclCommFinalize, (comm_t))                                                    \
    X(int, ncclCommDestroy, (comm_t))                                                     \
    X(int, ncclCommCount, (comm_t, int *))                                                \
    X(int, ncclCommUserRank, (comm_t, int *))                                             \
    X(int, ncclCommCuDevice, (comm_t, int *))                                             \
    X(const char *, ncclGetErrorString, (int))                                            \
    X(const char *, ncclGetLastError, (comm_t))                                           \
    X(int, ncclAllReduce, (const void *, void *, size_t, int, int, comm_t, void *))       \
    X(int, ncclReduceScatter, (const void *, void *, size_t, int, int, comm_t, void *))   \
    X(int, ncclAllGather, (const void *, void *, size_t, int, comm_t, void *))            \
    X(int, ncclBroadcast, (const void *, void *, size_t, int, int, comm_t, void *))       \
    X(int, ncclReduce, (const void *, void *, size_t, int, int, int, comm_t, void *))     \
    X(int, ncclSend, (const void *, size_t, int, int, comm_t, void *))                    \
    X(int, ncclRecv, (void *, size_t, int, int, comm_t, void *))                          \
    X(int, ncclGroupStart, (void))                                                        \
    X(int, ncclGroupEnd, (void))                                                          \
    X(int, ncclAlltoAll, (const void *, void *, size_t, int, comm_t, void *))             \
    X(int, ncclGather, (const void *, void *, size_t, int, int, comm_t, void *))          \
    X(int, ncclScatter, (const void *, void *, size_t, int, int, comm_t, void *))         \
    X(int, ncclMemAlloc, (void **, size_t))                                               \
    X(int, ncclMemFree, (void *))

#define DECLARE(ret, name, args) ret(*name) args;
static struct {
    CUDA_FUNCS(DECLARE)
    NCCL_FUNCS(DECLARE)
} A;

enum { H2H, H2D, D2H, D2D, MEMCPY_DEFAULT };
enum { NOT_READY = 600 };
enum { DT_INT8, DT_UINT8, DT_INT32, DT_UINT32, DT_INT64, DT_UINT64, DT_F16, DT_F32, DT_F64, DT_BF16, NDTYPES };
enum { OP_SUM, OP_PROD, OP_MAX, OP_MIN, OP_AVG, NOPS };
#define NONBLOCKING_STREAM 1u

static char lib_dir[PATH_MAX];
static void *h_cudart, *h_nccl;

/* ---------------------------------------------------------------- TAP */

static int n_tests, n_failed;
static pthread_mutex_t tap_mu = PTHREAD_MUTEX_INITIALIZER;

static int ok(int cond, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int ok(int cond, const char *fmt, ...) {
    va_list ap;
    pthread_mutex_lock(&tap_mu);
    n_tests++;
    if (!cond) n_failed++;
    printf("%s %d - ", cond ? "ok" : "not ok", n_tests);
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    printf("\n");
    fflush(stdout);
    pthread_mutex_unlock(&tap_mu);
    return cond;
}

static void diag(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void diag(const char *fmt, ...) {
    va_list ap;
    pthread_mutex_lock(&tap_mu);
    printf("# ");
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    printf("\n");
    fflush(stdout);
    pthread_mutex_unlock(&tap_mu);
}

/* ---------------------------------------------------------------- loading */

static int load_fakes(void) {
    char path[PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/libcudart.so.13", lib_dir);
    if (!(h_cudart = dlopen(path, RTLD_NOW | RTLD_LOCAL))) {
        diag("dlopen %s: %s", path, dlerror());
        return -1;
    }
    snprintf(path, sizeof path, "%s/libnccl.so.2", lib_dir);
    if (!(h_nccl = dlopen(path, RTLD_NOW | RTLD_LOCAL))) {
        diag("dlopen %s: %s", path, dlerror());
        return -1;
    }
#define LOAD_CUDA(ret, name, args) *(void **)&A.name = dlsym(h_cudart, #name);
#define LOAD_NCCL(ret, name, args) *(void **)&A.name = dlsym(h_nccl, #name);
    CUDA_FUNCS(LOAD_CUDA)
    NCCL_FUNCS(LOAD_NCCL)
#define CHECK_LOADED(ret, name, args) if (!A.name) { diag("missing symbol %s", #name); return -1; }
    CUDA_FUNCS(CHECK_LOADED)
    NCCL_FUNCS(CHECK_LOADED)
    return 0;
}

static void unload_fakes(void) {
    dlclose(h_nccl);
    dlclose(h_cudart);
    h_nccl = h_cudart = NULL;
}

/* ---------------------------------------------------------------- helpers */

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {}
}

/* cudaMemcpy host->device may return before the data lands, and cudaMemset of device memory
 * before it is done (CUDA allows both; the fake does both: fake_cudart.c, "Copies"), and an
 * NCCL call on a non-blocking stream does not wait for the legacy stream they run on. So the
 * NCCL tests wait for the legacy stream after each: that stream only, since
 * cudaDeviceSynchronize would also wait for the streams of thread ranks inside a collective. */
static void to_device(void *dev, const void *host, size_t bytes) {
    A.cudaMemcpy(dev, host, bytes, H2D);
    A.cudaStreamSynchronize(NULL);
}

static void dev_memset(void *dev, int value, size_t bytes) {
    A.cudaMemset(dev, value, bytes);
    A.cudaStreamSynchronize(NULL);
}

/* A work item that holds its stream until the test opens it. */
struct gate {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int open;
};

static void gate_wait(void *arg) {
    struct gate *g = arg;
    pthread_mutex_lock(&g->mu);
    while (!g->open) pthread_cond_wait(&g->cv, &g->mu);
    pthread_mutex_unlock(&g->mu);
}

static void gate_init(struct gate *g) {
    pthread_mutex_init(&g->mu, NULL);
    pthread_cond_init(&g->cv, NULL);
    g->open = 0;
}

static void gate_open(struct gate *g) {
    pthread_mutex_lock(&g->mu);
    g->open = 1;
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);
}

static void gate_destroy(struct gate *g) {
    pthread_mutex_destroy(&g->mu);
    pthread_cond_destroy(&g->cv);
}

static config_t config_init(int blocking) {
    config_t c;
    memset(&c, 0, sizeof c);
    c.size = sizeof c;
    c.magic = 0xcafebeef;
    c.version = 22809;
    c.blocking = blocking;
    c.cgaClusterSize = c.minCTAs = c.maxCTAs = INT_MIN;
    c.splitShare = c.trafficClass = c.collnetEnable = c.CTAPolicy = INT_MIN;
    c.shrinkShare = c.nvlsCTAs = c.nChannelsPerNetPeer = c.nvlinkCentricSched = INT_MIN;
    return c;
}

static int async_error(comm_t c) {
    int e = -1;
    if (A.ncclCommGetAsyncError(c, &e) != 0) return -2;
    return e;
}

/* Poll a nonblocking communicator until it is no longer in progress; returns the polls that
 * said ncclInProgress through *inprogress. */
static int wait_ready(comm_t c, int *inprogress) {
    int e, n = 0;
    while ((e = async_error(c)) == 7) {
        n++;
        sleep_ms(1);
    }
    if (inprogress) *inprogress = n;
    return e;
}

/* Names of /dev/shm entries starting with prefix, as one string (for before/after diffs). */
static int shm_count(const char *prefix) {
    DIR *d = opendir("/dev/shm");
    struct dirent *e;
    int n = 0;
    if (!d) return 0;
    while ((e = readdir(d)) != NULL)
        if (strncmp(e->d_name, prefix, strlen(prefix)) == 0) n++;
    closedir(d);
    return n;
}

/* Threads of this process named fake-* (the fakes name their stream workers and tasks). */
static int fake_threads(void) {
    DIR *d = opendir("/proc/self/task");
    struct dirent *e;
    int n = 0;
    if (!d) return -1;
    while ((e = readdir(d)) != NULL) {
        char path[300], name[64] = "";
        FILE *f;
        if (e->d_name[0] == '.') continue;
        snprintf(path, sizeof path, "/proc/self/task/%s/comm", e->d_name);
        if ((f = fopen(path, "r")) != NULL) {
            if (fgets(name, sizeof name, f) && strncmp(name, "fake-", 5) == 0) n++;
            fclose(f);
        }
    }
    closedir(d);
    return n;
}

/* ThreadSanitizer cannot follow a fork() of a multithreaded process into a child that starts
 * threads, and LeakSanitizer in such a child warns about the parent's threads. Under the
 * sanitizers, reload the fakes (which joins all their threads) before forking ranks; the plain
 * build forks with the workers alive, which is what exercises the fakes' atfork handlers. */
#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
#define RELOAD_BEFORE_FORK 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer) || __has_feature(address_sanitizer)
#define RELOAD_BEFORE_FORK 1
#endif
#endif

static void unload_fakes(void);
static int load_fakes(void);

static void before_rank_fork(void) {
#ifdef RELOAD_BEFORE_FORK
    unload_fakes();
    load_fakes();
#endif
}

static int wait_child(pid_t pid) {
    int status;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {}
    return status;
}

/* ---------------------------------------------------------------- dtype encodings (exact) */

static size_t dtype_size(int dt) {
    static const size_t sizes[NDTYPES] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2};
    return sizes[dt];
}

/* fp16 bits of an integer |v| < 2048 (exactly representable). */
static uint16_t half_of_int(long v) {
    uint16_t sign = (uint16_t)(v < 0 ? 0x8000 : 0);
    unsigned long a = (unsigned long)(v < 0 ? -v : v);
    int e = 0;
    if (a == 0) return sign;
    while ((a >> (e + 1)) != 0) e++;
    return (uint16_t)(sign | (uint16_t)((e + 15) << 10) | (uint16_t)((a << (10 - e)) & 0x3ff));
}

/* Store an integer value v as dtype dt at p (integers wrap, as the fake's do). */
static void encode(int dt, long v, void *p) {
    float f = (float)v;
    double d = (double)v;
    uint64_t u = (uint64_t)v;
    uint32_t fb;
    uint16_t h;
    switch (dt) {
    case DT_INT8: case DT_UINT8: { uint8_t b = (uint8_t)u; memcpy(p, &b, 1); break; }
    case DT_INT32: case DT_UINT32: { uint32_t w = (uint32_t)u; memcpy(p, &w, 4); break; }
    case DT_INT64: case DT_UINT64: memcpy(p, &u, 8); break;
    case DT_F16: h = half_of_int(v); memcpy(p, &h, 2); break;
    case DT_F32: memcpy(p, &f, 4); break;
    case DT_F64: memcpy(p, &d, 8); break;
    default: memcpy(&fb, &f, 4); h = (uint16_t)(fb >> 16); memcpy(p, &h, 2); break;   /* exact here */
    }
}

/* The matrix values: multiples of 3 from 3 to 12, so that every op (avg included: x/3 for
 * floats, sum/3 for integers) is exact in every dtype, and the products fit fp16/bf16. */
static long mval(int rank, size_t i) {
    return 3 * (1 + (long)(((size_t)rank + i) % 4));
}

static long reduce_expect(int op, int n, size_t i, int (*rank_of)(int)) {
    long acc = mval(rank_of(0), i), x;
    int r;
    for (r = 1; r < n; r++) {
        x = mval(rank_of(r), i);
        switch (op) {
        case OP_PROD: acc *= x; break;
        case OP_MAX: acc = acc > x ? acc : x; break;
        case OP_MIN: acc = acc < x ? acc : x; break;
        default: acc += x; break;
        }
    }
    if (op == OP_AVG) acc /= n;
    return acc;                     /* encode() wraps it for the 8-bit types, as the fake does */
}

/* ---------------------------------------------------------------- CUDA runtime tests */

static void test_load(void) {
    void *again, *ours = NULL;
    int v = 0;
    ok(load_fakes() == 0, "the fakes load from %s", lib_dir);
    again = dlopen("libcudart.so.13", RTLD_NOW | RTLD_NOLOAD);
    memcpy(&ours, &A.fake_cuda_enqueue, sizeof ours);       /* POSIX: function pointers fit */
    ok(again == h_cudart && dlsym(h_nccl, "fake_cuda_enqueue") == ours,
       "one copy of the fake runtime, shared by the fake NCCL");
    if (again) dlclose(again);
    A.cudaRuntimeGetVersion(&v);
    ok(v == 13000, "cudaRuntimeGetVersion = %d", v);
    A.ncclGetVersion(&v);
    ok(v == 22809, "ncclGetVersion = %d", v);
    setenv("FAKE_NCCL_VERSION", "21805", 1);
    A.ncclGetVersion(&v);
    unsetenv("FAKE_NCCL_VERSION");
    ok(v == 21805, "FAKE_NCCL_VERSION=21805 -> %d", v);
}

static void test_devices(void) {
    int n = -1, d = -1, e1, e2, e3, rc;
    rc = A.cudaGetDeviceCount(&n);
    ok(rc == 0 && n == 1, "one device by default (%d)", n);
    e1 = A.cudaSetDevice(1);
    e2 = A.cudaPeekAtLastError();
    e3 = A.cudaGetLastError();
    ok(e1 == 101 && e2 == 101 && e3 == 101 && A.cudaGetLastError() == 0,
       "cudaSetDevice(1) -> cudaErrorInvalidDevice, recorded; GetLastError clears (%d %d %d)", e1, e2, e3);
    ok(A.cudaGetDevice(&d) == 0 && d == 0, "current device 0");
}

/* Re-exec'd with FAKE_CUDA_DEVICES set: the count is read when the library loads. */
static int child_devices(void) {
    const char *want = getenv("FAKE_CUDA_DEVICES");
    int n = -1, rc;
    void *p = NULL;
    if (load_fakes() != 0) return 10;
    rc = A.cudaGetDeviceCount(&n);
    if (strcmp(want, "0") == 0) {
        if (rc != 100 || n != 0) return 11;
        if (A.cudaMalloc(&p, 16) != 100 || A.cudaSetDevice(0) != 100) return 12;
    } else {
        if (rc != 0 || n != 3) return 13;
        if (A.cudaSetDevice(2) != 0 || A.cudaSetDevice(3) != 101) return 14;
        if (A.cudaMalloc(&p, 16) != 0) return 15;
        {
            struct ptr_attr at;
            if (A.cudaPointerGetAttributes(&at, p) != 0 || at.device != 2) return 16;
        }
        A.cudaFree(p);
    }
    unload_fakes();
    return 0;
}

/* Run this program again as `self MODE lib_dir` with env NAME=VALUE; its exit status. */
static int run_self(const char *mode, const char *name, const char *value) {
    pid_t pid;
    fflush(stdout);
    if ((pid = fork()) == 0) {
        char self[PATH_MAX];
        ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
        if (n < 0) _exit(20);
        self[n] = 0;
        setenv(name, value, 1);
        execl(self, self, mode, lib_dir, (char *)NULL);
        _exit(21);
    }
    return wait_child(pid);
}

/* Loaded NCCL first, with the real CUDA libraries on LD_LIBRARY_PATH: the fake NCCL still gets
 * the fake runtime (DT_RPATH $ORIGIN), and dlopen of the runtime by path finds that same copy. */
static int child_nccl_first(void) {
    char path[PATH_MAX + 32];
    void *nccl, *by_name, *by_path;
    snprintf(path, sizeof path, "%s/libnccl.so.2", lib_dir);
    if (!(nccl = dlopen(path, RTLD_NOW | RTLD_LOCAL))) return 10;
    if (!(by_name = dlopen("libcudart.so.13", RTLD_NOW | RTLD_NOLOAD))) return 11;
    if (!dlsym(by_name, "fake_cuda_enqueue")) return 12;
    snprintf(path, sizeof path, "%s/libcudart.so.13", lib_dir);
    if ((by_path = dlopen(path, RTLD_NOW | RTLD_LOCAL)) != by_name) return 13;
    dlclose(by_path);
    dlclose(by_name);
    dlclose(nccl);
    return 0;
}

static void test_load_order(void) {
    int st = run_self("--child-nccl-first", "LD_LIBRARY_PATH", "/usr/local/cuda/lib64:/usr/local/cuda/lib");
    ok(WIFEXITED(st) && WEXITSTATUS(st) == 0,
       "NCCL loaded first, real CUDA on LD_LIBRARY_PATH: one copy, the fake runtime (exit %d)",
       WIFEXITED(st) ? WEXITSTATUS(st) : -1);
}

static void test_device_count_env(void) {
    const char *counts[] = {"0", "3"};
    int i;
    for (i = 0; i < 2; i++) {
        int st = run_self("--child-devices", "FAKE_CUDA_DEVICES", counts[i]);
        ok(WIFEXITED(st) && WEXITSTATUS(st) == 0, "FAKE_CUDA_DEVICES=%s (%s: exit %d)", counts[i],
           counts[i][0] == '0' ? "cudaErrorNoDevice" : "3 devices, allocations know theirs",
           WIFEXITED(st) ? WEXITSTATUS(st) : -1);
    }
}

static void test_memory_classification(void) {
    struct ptr_attr at;
    char host_stack[16];
    char *dev = NULL, *heap = malloc(64);
    void *zero = (void *)1;
    int rc;
    ok(A.cudaMalloc((void **)&dev, 4196) == 0 && dev, "cudaMalloc");
    rc = A.cudaPointerGetAttributes(&at, dev);
    ok(rc == 0 && at.type == 2 && at.device == 0 && at.devicePointer == dev && !at.hostPointer,
       "device pointer: type 2 (device), devicePointer = ptr");
    rc = A.cudaPointerGetAttributes(&at, dev + 4195);
    ok(rc == 0 && at.type == 2, "a pointer inside the allocation is device");
    rc = A.cudaPointerGetAttributes(&at, dev + 4196);
    ok(rc == 0 && at.type == 0, "one past the end is not");
    rc = A.cudaPointerGetAttributes(&at, host_stack);
    ok(rc == 0 && at.type == 0, "stack memory: success, type 0 (unregistered)");
    rc = A.cudaPointerGetAttributes(&at, heap);
    ok(rc == 0 && at.type == 0, "heap memory: success, type 0");
    ok(A.cudaPointerGetAttributes(NULL, heap) == 1 && A.cudaGetLastError() == 1, "attributes NULL -> 1");
    ok(A.fake_cuda_shadow(dev + 4000, 196) != NULL && A.fake_cuda_shadow(dev + 4000, 197) == NULL,
       "fake_cuda_shadow checks the range");
    ok(A.cudaFree(heap) == 1 && A.cudaGetLastError() == 1, "cudaFree(host pointer) -> cudaErrorInvalidValue");
    ok(A.cudaFree(dev + 8) == 1 && A.cudaGetLastError() == 1, "cudaFree(inside) -> cudaErrorInvalidValue");
    ok(A.cudaFree(dev) == 0 && A.cudaFree(NULL) == 0, "cudaFree, cudaFree(NULL)");
    rc = A.cudaPointerGetAttributes(&at, dev);
    ok(rc == 0 && at.type == 0, "a freed pointer is not device memory");
    ok(A.cudaMalloc(&zero, 0) == 0 && zero == NULL, "cudaMalloc(0): success, NULL");
    free(heap);
}

static void segv_exit(int sig) {
    (void)sig;
    _exit(42);
}

static void test_device_memory_unreadable(void) {
    char *dev = NULL;
    pid_t pid;
    int st;
    A.cudaMalloc((void **)&dev, 100);
    fflush(stdout);
    if ((pid = fork()) == 0) {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = segv_exit;
        sigaction(SIGSEGV, &sa, NULL);
        sigaction(SIGBUS, &sa, NULL);
        if (*(volatile char *)dev == 1) _exit(1);
        _exit(0);
    }
    st = wait_child(pid);
    ok(WIFEXITED(st) && WEXITSTATUS(st) == 42, "a host read of device memory faults");
    A.cudaFree(dev);
}

static void test_memcpy(void) {
    enum { N = 10000 };
    unsigned char *h = malloc(N), *back = malloc(N);
    char *d1 = NULL, *d2 = NULL;
    int i, good;
    for (i = 0; i < N; i++) h[i] = (unsigned char)(i * 7 + 1);
    A.cudaMalloc((void **)&d1, N);
    A.cudaMalloc((void **)&d2, N);
    ok(A.cudaMemcpy(d1, h, N, H2D) == 0, "cudaMemcpy host to device");
    ok(A.cudaMemcpy(d2, d1, N, D2D) == 0, "cudaMemcpy device to device");
    memset(back, 0, N);
    ok(A.cudaMemcpy(back, d2, N, D2H) == 0 && memcmp(back, h, N) == 0, "cudaMemcpy device to host: the data");
    ok(A.cudaMemcpy(d2 + 1000, d1, 100, MEMCPY_DEFAULT) == 0 && A.cudaMemcpy(back, d2 + 1000, 100, MEMCPY_DEFAULT) == 0 &&
           memcmp(back, h, 100) == 0,
       "cudaMemcpyDefault infers the direction, offsets inside allocations");
    ok(A.cudaMemcpy(d1, d2, N, H2D) == 21 && A.cudaGetLastError() == 21,
       "a kind that disagrees with the pointers -> cudaErrorInvalidMemcpyDirection");
    ok(A.cudaMemcpy(d1 + 1, h, N, H2D) == 1 && A.cudaGetLastError() == 1, "a range past the allocation -> 1");
    ok(A.cudaMemcpy(d1, h, N, 7) == 21 && A.cudaGetLastError() == 21, "kind 7 -> 21");
    ok(A.cudaMemset(d1, 0xab, N) == 0 && A.cudaMemcpy(back, d1, N, D2H) == 0, "cudaMemset");
    for (good = 1, i = 0; i < N; i++) good &= back[i] == 0xab;
    ok(good, "cudaMemset: the data");
    ok(A.cudaMemset(h, 0, 10) == 1 && A.cudaGetLastError() == 1, "cudaMemset on host memory -> 1");
    A.cudaFree(d1);
    A.cudaFree(d2);
    free(h);
    free(back);
}

static void test_stream_order(void) {
    enum { N = 4096 };
    struct gate gate;
    void *s = NULL, *e = NULL, *never = NULL;
    unsigned char *h = malloc(N), *out = malloc(N);
    char *d = NULL;
    int i, q1, q2;
    for (i = 0; i < N; i++) h[i] = (unsigned char)i;
    memset(out, 0x55, N);
    gate_init(&gate);
    A.cudaMalloc((void **)&d, N);
    ok(A.cudaStreamCreate(&s) == 0 && A.cudaEventCreate(&e) == 0 && A.cudaEventCreate(&never) == 0,
       "stream and events");
    ok(A.cudaEventQuery(never) == 0, "an event never recorded is complete");
    A.cudaGetLastError();
    A.fake_cuda_enqueue(s, gate_wait, &gate);
    A.cudaMemcpyAsync(d, h, N, H2D, s);
    A.cudaMemcpyAsync(out, d, N, D2H, s);
    A.cudaEventRecord(e, s);
    q1 = A.cudaStreamQuery(s);
    q2 = A.cudaEventQuery(e);
    ok(q1 == NOT_READY && q2 == NOT_READY && out[0] == 0x55 && out[N - 1] == 0x55,
       "work behind a held stream has not run: stream and event not ready, output untouched (%d %d)", q1, q2);
    ok(A.cudaGetLastError() == 0, "cudaErrorNotReady is not recorded as the last error");
    gate_open(&gate);
    ok(A.cudaEventSynchronize(e) == 0 && A.cudaEventQuery(e) == 0 && memcmp(out, h, N) == 0,
       "released: the copies ran in order, the event completed");
    ok(A.cudaStreamQuery(s) == 0 || A.cudaStreamSynchronize(s) == 0, "the stream drains");
    A.cudaStreamDestroy(s);
    A.cudaEventDestroy(e);
    A.cudaEventDestroy(never);
    A.cudaFree(d);
    gate_destroy(&gate);
    free(h);
    free(out);
}

/* CUDA's legacy default stream rules, each checked behind a gate. */
static void test_legacy_stream(void) {
    enum { N = 1024 };
    struct gate gate;
    void *blocking = NULL, *nonblocking = NULL, *s1 = NULL, *s2 = NULL, *e = NULL;
    unsigned char *out = malloc(N);
    char *d = NULL;
    int q;
    A.cudaMalloc((void **)&d, N);
    A.cudaStreamCreate(&blocking);
    A.cudaStreamCreateWithFlags(&nonblocking, NONBLOCKING_STREAM);
    A.cudaStreamCreateWithFlags(&s1, NONBLOCKING_STREAM);
    A.cudaStreamCreateWithFlags(&s2, NONBLOCKING_STREAM);
    A.cudaEventCreateWithFlags(&e, 2);
    A.cudaMemset(d, 0, N);

    /* (a) work on the legacy stream waits for earlier work on a blocking stream */
    gate_init(&gate);
    memset(out, 0x11, N);
    A.fake_cuda_enqueue(blocking, gate_wait, &gate);
    A.cudaMemsetAsync(d, 7, N, NULL);
    A.cudaMemcpyAsync(out, d, N, D2H, NULL);
    q = A.cudaStreamQuery(NULL);
    ok(q == NOT_READY && out[0] == 0x11, "legacy stream waits for a blocking stream's earlier work");
    gate_open(&gate);
    ok(A.cudaStreamSynchronize(NULL) == 0 && out[0] == 7 && out[N - 1] == 7, "... and runs once it is done");
    gate_destroy(&gate);

    /* (b) a blocking stream's later work waits for earlier legacy-stream work */
    gate_init(&gate);
    A.fake_cuda_enqueue(NULL, gate_wait, &gate);
    A.cudaMemsetAsync(d, 8, N, blocking);
    q = A.cudaStreamQuery(blocking);
    ok(q == NOT_READY, "a blocking stream waits for earlier legacy-stream work");
    gate_open(&gate);
    ok(A.cudaStreamSynchronize(blocking) == 0, "... and runs once it is done");
    gate_destroy(&gate);

    /* (c) a non-blocking stream is independent of a held legacy stream */
    gate_init(&gate);
    A.fake_cuda_enqueue(NULL, gate_wait, &gate);
    memset(out, 0, N);
    A.cudaMemsetAsync(d, 9, N, nonblocking);
    A.cudaMemcpyAsync(out, d, N, D2H, nonblocking);
    ok(A.cudaStreamSynchronize(nonblocking) == 0 && out[0] == 9 && A.cudaStreamQuery(NULL) == NOT_READY,
       "a non-blocking stream runs while the legacy stream is held");
    gate_open(&gate);
    A.cudaStreamSynchronize(NULL);
    gate_destroy(&gate);

    /* (d) cudaStreamWaitEvent */
    gate_init(&gate);
    A.fake_cuda_enqueue(s1, gate_wait, &gate);
    A.cudaEventRecord(e, s1);
    ok(A.cudaStreamWaitEvent(s2, e, 0) == 0, "cudaStreamWaitEvent");
    A.cudaMemsetAsync(d, 10, N, s2);
    q = A.cudaStreamQuery(s2);
    ok(q == NOT_READY && A.cudaEventQuery(e) == NOT_READY, "a stream waiting for an event recorded behind a gate waits");
    gate_open(&gate);
    ok(A.cudaStreamSynchronize(s2) == 0 && A.cudaEventQuery(e) == 0, "... until the event completes");
    gate_destroy(&gate);

    /* (e) cudaDeviceSynchronize waits for every stream */
    gate_init(&gate);
    A.fake_cuda_enqueue(s1, gate_wait, &gate);
    A.cudaMemsetAsync(d, 11, N, s1);
    ok(A.cudaStreamQuery(s1) == NOT_READY, "held again");
    gate_open(&gate);
    ok(A.cudaDeviceSynchronize() == 0 && A.cudaStreamQuery(s1) == 0 && A.cudaStreamQuery(s2) == 0 &&
           A.cudaStreamQuery(NULL) == 0 && A.cudaStreamQuery((void *)0x2) == 0,
       "cudaDeviceSynchronize: every stream idle after it");
    gate_destroy(&gate);

    A.cudaStreamDestroy(blocking);
    A.cudaStreamDestroy(nonblocking);
    A.cudaStreamDestroy(s1);
    A.cudaStreamDestroy(s2);
    A.cudaEventDestroy(e);
    A.cudaFree(d);
    free(out);
}

static void test_stream_destroy_pending(void) {
    struct gate gate;
    void *s = NULL, *e = NULL;
    char *d = NULL;
    unsigned char b = 0;
    gate_init(&gate);
    A.cudaMalloc((void **)&d, 16);
    A.cudaStreamCreate(&s);
    A.cudaEventCreate(&e);
    A.fake_cuda_enqueue(s, gate_wait, &gate);
    A.cudaMemsetAsync(d, 5, 16, s);
    A.cudaEventRecord(e, s);
    ok(A.cudaStreamDestroy(s) == 0, "cudaStreamDestroy with pending work returns at once");
    ok(A.cudaStreamQuery(s) == 400 && A.cudaGetLastError() == 400, "the handle is gone: 400");
    gate_open(&gate);
    A.cudaEventSynchronize(e);
    A.cudaMemcpy(&b, d, 1, D2H);
    ok(b == 5 && A.cudaEventQuery(e) == 0, "its pending work still ran");
    ok(A.cudaEventDestroy(e) == 0 && A.cudaEventQuery(e) == 400 && A.cudaGetLastError() == 400,
       "a destroyed event: 400");
    ok(A.cudaStreamSynchronize((void *)0x1234) == 400 && A.cudaStreamDestroy(NULL) == 400 && A.cudaGetLastError() == 400,
       "bogus stream, destroying the default stream: 400");
    ok(strlen(A.cudaGetErrorString(12345)) > 0 && strcmp(A.cudaGetErrorName(600), "cudaErrorNotReady") == 0 &&
           strcmp(A.cudaGetErrorString(0), "no error") == 0,
       "error strings and names");
    A.cudaFree(d);
    gate_destroy(&gate);
}

static void test_stream_delay(void) {
    void *s = NULL;
    char *d = NULL;
    double t0, dt;
    setenv("FAKE_CUDA_STREAM_DELAY_US", "30000", 1);
    A.cudaStreamCreateWithFlags(&s, NONBLOCKING_STREAM);   /* read at stream creation */
    unsetenv("FAKE_CUDA_STREAM_DELAY_US");
    A.cudaMalloc((void **)&d, 16);
    t0 = now_s();
    A.cudaMemsetAsync(d, 1, 16, s);
    A.cudaStreamSynchronize(s);
    dt = now_s() - t0;
    ok(dt >= 0.030, "FAKE_CUDA_STREAM_DELAY_US=30000: a work item runs no sooner than 30 ms later (%.1f ms)", dt * 1e3);
    A.cudaStreamDestroy(s);
    A.cudaFree(d);
}

/* cudaMemcpy and cudaMemset as CUDA documents them (runtime API, "API synchronization behavior"),
 * re-exec'd with FAKE_CUDA_SYNC_COPIES=0 (the default) or 1. Only the legacy stream runs late
 * (it is made while FAKE_CUDA_STREAM_DELAY_US is set); the other streams are on time, so a read
 * on a non-blocking stream shows what has landed. Returns one bit per failed check (AC_*). */
enum {
    AC_H2D_EARLY = 1,      /* H2D returned at once; a non-blocking read sees the old data */
    AC_H2D_LANDS = 2,      /* after cudaDeviceSynchronize: the data as it was at the call */
    AC_D2H_DONE = 4,       /* D2H complete on return, after the H2D before it */
    AC_MEMSET_EARLY = 8,   /* cudaMemset of device memory returned before it was done */
    AC_D2D_EARLY = 16,     /* cudaMemcpy device to device too */
    AC_BLOCKING = 32,      /* a blocking stream's later work waits for them */
    AC_SETUP = 64
};
#define AC_DELAY_US 200000

static int child_async_copies(void) {
    enum { N = 1 << 16 };
    const char *mode = getenv("FAKE_CUDA_SYNC_COPIES");
    int sync = mode && strcmp(mode, "1") == 0, fail = 0;
    unsigned char *h = malloc(N), *out = malloc(N);
    char *d = NULL, *d2 = NULL, *d3 = NULL;
    void *nb = NULL, *blocking = NULL;
    double t0, dt;
    if (load_fakes() != 0 || !h || !out) return AC_SETUP;
    setenv("FAKE_CUDA_STREAM_DELAY_US", "200000", 1);
    A.cudaStreamQuery(NULL);                        /* the legacy stream exists now: late */
    unsetenv("FAKE_CUDA_STREAM_DELAY_US");
    if (A.cudaStreamCreateWithFlags(&nb, NONBLOCKING_STREAM) != 0 || A.cudaStreamCreate(&blocking) != 0 ||
        A.cudaMalloc((void **)&d, N) != 0 || A.cudaMalloc((void **)&d2, N) != 0 || A.cudaMalloc((void **)&d3, N) != 0)
        return AC_SETUP;
    A.cudaMemsetAsync(d, 0x11, N, nb);              /* the old data, on time */
    A.cudaStreamSynchronize(nb);

    memset(h, 0x22, N);
    t0 = now_s();
    A.cudaMemcpy(d, h, N, H2D);
    dt = now_s() - t0;
    memset(h, 0x33, N);                             /* too late: the copy has its own */
    A.cudaMemcpyAsync(out, d, N, D2H, nb);
    A.cudaStreamSynchronize(nb);
    if (sync ? out[0] != 0x22 : out[0] != 0x11 || out[N - 1] != 0x11 || dt * 1e6 >= AC_DELAY_US) fail |= AC_H2D_EARLY;
    A.cudaDeviceSynchronize();
    A.cudaMemcpyAsync(out, d, N, D2H, nb);
    A.cudaStreamSynchronize(nb);
    if (out[0] != 0x22 || out[N - 1] != 0x22) fail |= AC_H2D_LANDS;

    memset(h, 0x44, N);
    A.cudaMemcpy(d, h, N, H2D);
    memset(out, 0, N);
    A.cudaMemcpy(out, d, N, D2H);                   /* the legacy stream: after the H2D */
    if (out[0] != 0x44 || out[N - 1] != 0x44) fail |= AC_D2H_DONE;

    A.cudaMemset(d, 0x55, N);
    A.cudaMemcpyAsync(out, d, N, D2H, nb);
    A.cudaStreamSynchronize(nb);
    if (out[0] != (sync ? 0x55 : 0x44)) fail |= AC_MEMSET_EARLY;
    A.cudaMemcpy(d2, d, N, D2D);                    /* d2 is fresh: zeros */
    A.cudaMemcpyAsync(out, d2, N, D2H, nb);
    A.cudaStreamSynchronize(nb);
    if (out[0] != (sync ? 0x55 : 0)) fail |= AC_D2D_EARLY;
    A.cudaMemcpyAsync(out, d2, N, D2H, blocking);
    A.cudaStreamSynchronize(blocking);
    if (out[0] != 0x55 || out[N - 1] != 0x55) fail |= AC_BLOCKING;

    A.cudaMemcpy(d3, h, N, H2D);                    /* cudaFree waits for it to land (else SIGSEGV) */
    A.cudaFree(d3);
    A.cudaFree(d2);
    A.cudaFree(d);
    A.cudaStreamDestroy(nb);
    A.cudaStreamDestroy(blocking);
    unload_fakes();
    free(h);
    free(out);
    return fail;
}

static void test_async_copies(void) {
    static const struct { int bit; const char *async_text, *sync_text; } checks[] = {
        {AC_H2D_EARLY, "cudaMemcpy H2D returns before the late legacy stream lands it: a non-blocking "
         "stream's async D2H reads the old data", "cudaMemcpy H2D waited: a non-blocking read sees the new data"},
        {AC_H2D_LANDS, "... after cudaDeviceSynchronize it reads the new data, as the host buffer was at the "
         "call (staged)", "... and still does after cudaDeviceSynchronize"},
        {AC_D2H_DONE, "cudaMemcpy D2H is complete on return, and ordered after the H2D before it",
         "cudaMemcpy D2H is complete on return"},
        {AC_MEMSET_EARLY, "cudaMemset of device memory returns before it is done",
         "cudaMemset of device memory waited"},
        {AC_D2D_EARLY, "cudaMemcpy D2D returns before it is done", "cudaMemcpy D2D waited"},
        {AC_BLOCKING, "a blocking stream's later work waits for the legacy stream's copies",
         "a blocking stream's later work sees the copies"},
    };
    int mode;
    for (mode = 0; mode < 2; mode++) {
        int st = run_self("--child-async-copies", "FAKE_CUDA_SYNC_COPIES", mode ? "1" : "0"), i;
        int fail = WIFEXITED(st) ? WEXITSTATUS(st) : 0xff;
        if (fail & AC_SETUP) diag("async copies: setup failed, or the child died (status %d)", st);
        for (i = 0; i < (int)(sizeof checks / sizeof checks[0]); i++)
            ok(!(fail & checks[i].bit), "FAKE_CUDA_SYNC_COPIES=%d, legacy stream %d ms late: %s", mode,
               AC_DELAY_US / 1000, mode ? checks[i].sync_text : checks[i].async_text);
    }
}

/* ---------------------------------------------------------------- NCCL: processes */

/* One rank of a 2-process all-reduce; returns 0 when every check passed. */
static int two_process_rank(uid_t128 id, int rank) {
    enum { N = 300000 };   /* 1.2 MB of float: more than one 1 MiB mailbox round */
    float *h = malloc(N * sizeof *h);
    float *d = NULL, *d2 = NULL;
    comm_t comm = NULL;
    void *s = NULL;
    int i, bad = 0, rc;
    if ((rc = A.ncclCommInitRank(&comm, 2, id, rank)) != 0) return 100 + rc;
    A.cudaStreamCreateWithFlags(&s, NONBLOCKING_STREAM);
    A.cudaMalloc((void **)&d, N * sizeof *d);
    A.cudaMalloc((void **)&d2, N * sizeof *d2);
    for (i = 0; i < N; i++) h[i] = (float)(i % 1000) + (float)rank * 0.5f;
    to_device(d, h, N * sizeof *h);
    if (A.ncclAllReduce(d, d2, N, DT_F32, OP_SUM, comm, s) != 0) bad |= 1;
    if (A.ncclAllReduce(d, d, N, DT_F32, OP_MAX, comm, s) != 0) bad |= 2;       /* in place */
    A.cudaStreamSynchronize(s);
    A.cudaMemcpy(h, d2, N * sizeof *h, D2H);
    for (i = 0; i < N; i++)
        if (h[i] != 2.0f * (float)(i % 1000) + 0.5f) { bad |= 4; break; }
    A.cudaMemcpy(h, d, N * sizeof *h, D2H);
    for (i = 0; i < N; i++)
        if (h[i] != (float)(i % 1000) + 0.5f) { bad |= 8; break; }
    if (async_error(comm) != 0) bad |= 16;
    if (A.ncclCommDestroy(comm) != 0) bad |= 32;
    A.cudaStreamDestroy(s);
    A.cudaFree(d);
    A.cudaFree(d2);
    free(h);
    return bad;
}

static void test_two_processes(void) {
    uid_t128 id;
    pid_t pid;
    int mine, st;
    before_rank_fork();
    A.ncclGetUniqueId(&id);
    fflush(stdout);
    if ((pid = fork()) == 0) {
        alarm(120);
        exit(two_process_rank(id, 1));
    }
    mine = two_process_rank(id, 0);
    st = wait_child(pid);
    ok(mine == 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0,
       "2 processes (fork): all-reduce sum and in-place max of 300k floats (ranks: %d, %d)", mine,
       WIFEXITED(st) ? WEXITSTATUS(st) : -1);
}

/* The peer process dies (SIGKILL) after one all-reduce; ours then waits until we abort. */
static void test_dead_peer(void) {
    uid_t128 id;
    pid_t pid;
    comm_t comm = NULL;
    void *s = NULL, *e = NULL;
    int *d = NULL, st, q;
    char prefix[64];
    before_rank_fork();
    A.ncclGetUniqueId(&id);
    fflush(stdout);
    if ((pid = fork()) == 0) {
        comm_t c = NULL;
        void *cs = NULL;
        int *cd = NULL;
        alarm(120);
        if (A.ncclCommInitRank(&c, 2, id, 1) != 0) _exit(1);
        A.cudaStreamCreateWithFlags(&cs, NONBLOCKING_STREAM);
        A.cudaMalloc((void **)&cd, 64);
        A.ncclAllReduce(cd, cd, 16, DT_INT32, OP_SUM, c, cs);
        A.cudaStreamSynchronize(cs);
        raise(SIGKILL);
        _exit(2);
    }
    ok(A.ncclCommInitRank(&comm, 2, id, 0) == 0, "dead peer: init with a child process");
    A.cudaStreamCreateWithFlags(&s, NONBLOCKING_STREAM);
    A.cudaEventCreate(&e);
    A.cudaMalloc((void **)&d, 64);
    A.ncclAllReduce(d, d, 16, DT_INT32, OP_SUM, comm, s);
    A.cudaStreamSynchronize(s);
    st = wait_child(pid);
    ok(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL, "the peer completed one all-reduce, then was killed");
    A.ncclAllReduce(d, d, 16, DT_INT32, OP_SUM, comm, s);
    A.cudaEventRecord(e, s);
    q = A.cudaEventQuery(e);
    ok(q == NOT_READY && async_error(comm) == 0, "the next all-reduce waits for the dead peer (no error, as NCCL)");
    ok(A.ncclCommAbort(comm) == 0, "ncclCommAbort from the host thread");
    ok(A.cudaEventSynchronize(e) == 0 && A.cudaEventQuery(e) == 0, "the aborted all-reduce returned; the event completed");
    snprintf(prefix, sizeof prefix, "fake_nccl_%d_", (int)getpid());
    ok(shm_count(prefix) == 0, "no segment left in /dev/shm");
    A.cudaStreamDestroy(s);
    A.cudaEventDestroy(e);
    A.cudaFree(d);
}

/* ---------------------------------------------------------------- NCCL: thread ranks */

#define MATRIX_CHECKS(X)                                                                     \
    X(M_INIT, "init (blocking, one thread per rank)")                                        \
    X(M_ALLREDUCE, "all-reduce: every dtype x op (sum prod max min avg), 1000 elements")     \
    X(M_ALLREDUCE_INPLACE, "all-reduce in place")                                            \
    X(M_ALLREDUCE_BIG, "all-reduce of 600k floats (3 mailbox rounds)")                       \
    X(M_REDUCE_SCATTER, "reduce-scatter, 400k elements per rank (chunked)")                  \
    X(M_REDUCE_SCATTER_INPLACE, "reduce-scatter in place (recv = send + rank*count)")        \
    X(M_ALL_GATHER, "all-gather (uint8 and int32)")                                          \
    X(M_ALL_GATHER_INPLACE, "all-gather in place (send = recv + rank*count)")                \
    X(M_BROADCAST, "broadcast from root 1 (root's recv separate; non-roots pass send NULL)") \
    X(M_BROADCAST_INPLACE, "broadcast in place")                                             \
    X(M_REDUCE, "reduce to root 2 (non-roots pass recv NULL)")                               \
    X(M_ALL_TO_ALL, "all-to-all")                                                            \
    X(M_GATHER, "gather to root 0 (non-roots pass recv NULL), and in place")                 \
    X(M_SCATTER, "scatter from root 1 (non-roots pass send NULL), and in place")             \
    X(M_COUNT0, "count 0 is a no-op that succeeds")                                          \
    X(M_BAD_ARGS, "host buffers, in-place all-to-all, bad dtype/op/root: ncclInvalidArgument") \
    X(M_P2P, "group: send to next, recv from previous, and to/from self (400 KB, chunked)")  \
    X(M_COLL_MISMATCH, "ranks disagreeing on a collective's count: all get ncclInvalidUsage") \
    X(M_P2P_MISMATCH, "send/recv sizes disagree: both get ncclInvalidUsage, the third none") \
    X(M_DESTROY, "destroy")

#define AS_ENUM(id, text) id,
#define AS_TEXT(id, text) text,
enum { MATRIX_CHECKS(AS_ENUM) M_NCHECKS };
static const char *const matrix_text[] = {MATRIX_CHECKS(AS_TEXT)};

struct world {
    int n;
    uid_t128 ids[3];
    int runs[M_NCHECKS], fails[M_NCHECKS];
    pthread_mutex_t mu;
    /* the split test */
    int split_ok[8];
};

static void rcheck(struct world *w, int id, int rank, int cond, const char *what) {
    pthread_mutex_lock(&w->mu);
    w->runs[id]++;
    if (!cond) {
        w->fails[id]++;
        diag("rank %d: %s: %s", rank, matrix_text[id], what);
    }
    pthread_mutex_unlock(&w->mu);
}

/* Per-rank device and host buffers for the matrix. */
struct rank_bufs {
    char *dsend, *drecv;
    unsigned char *hsend, *hrecv, *hwant;
    void *stream;
    comm_t comm;
    size_t cap;
};

static int run_sync(struct rank_bufs *b) {
    return A.cudaStreamSynchronize(b->stream);
}

/* Copy `bytes` of drecv to host and compare with hwant. */
static int recv_matches(struct rank_bufs *b, size_t off, size_t bytes) {
    run_sync(b);
    A.cudaMemcpy(b->hrecv, b->drecv + off, bytes, D2H);
    return memcmp(b->hrecv, b->hwant, bytes) == 0;
}

static void fill_i32(unsigned char *p, size_t n, long base) {
    size_t i;
    for (i = 0; i < n; i++) {
        int32_t v = (int32_t)(base + (long)i);
        memcpy(p + i * 4, &v, 4);
    }
}

static int rank_of_identity(int r) {
    return r;
}

static void matrix_allreduce(struct world *w, struct rank_bufs *b, int rank) {
    enum { K = 1000 };
    int dt, op, all = 1, inplace = 1;
    size_t i;
    for (dt = 0; dt < NDTYPES; dt++)
        for (op = 0; op < NOPS; op++) {
            size_t es = dtype_size(dt);
            for (i = 0; i < K; i++) {
                encode(dt, mval(rank, i), b->hsend + i * es);
                encode(dt, reduce_expect(op, w->n, i, rank_of_identity), b->hwant + i * es);
            }
            to_device(b->dsend, b->hsend, K * es);
            if (A.ncclAllReduce(b->dsend, b->drecv, K, dt, op, b->comm, b->stream) != 0 ||
                !recv_matches(b, 0, K * es)) {
                if (all) diag("rank %d: all-reduce dtype %d op %d differs", rank, dt, op);
                all = 0;
            }
            if (op == OP_SUM || op == OP_AVG) {           /* the same, in place */
                to_device(b->drecv, b->hsend, K * es);
                if (A.ncclAllReduce(b->drecv, b->drecv, K, dt, op, b->comm, b->stream) != 0 ||
                    !recv_matches(b, 0, K * es))
                    inplace = 0;
            }
        }
    rcheck(w, M_ALLREDUCE, rank, all, "a result differs");
    rcheck(w, M_ALLREDUCE_INPLACE, rank, inplace, "a result differs");
}

static void matrix_allreduce_big(struct world *w, struct rank_bufs *b, int rank) {
    const size_t n = 600000;
    size_t i;
    for (i = 0; i < n; i++) {
        float x = (float)((i * 31 + (size_t)rank * 7) % 4096), want = 0;
        int r;
        for (r = 0; r < w->n; r++) want += (float)((i * 31 + (size_t)r * 7) % 4096);
        memcpy(b->hsend + i * 4, &x, 4);
        memcpy(b->hwant + i * 4, &want, 4);
    }
    to_device(b->dsend, b->hsend, n * 4);
    rcheck(w, M_ALLREDUCE_BIG, rank,
           A.ncclAllReduce(b->dsend, b->drecv, n, DT_F32, OP_SUM, b->comm, b->stream) == 0 && recv_matches(b, 0, n * 4),
           "wrong sums");
}

static void matrix_reduce_scatter(struct world *w, struct rank_bufs *b, int rank) {
    const size_t rc = 400000;     /* per rank: the slotted mailbox takes ~87k floats a round */
    size_t i, n = (size_t)w->n;
    for (i = 0; i < rc * n; i++) encode(DT_INT32, (long)(i % 1000) + rank, b->hsend + i * 4);
    for (i = 0; i < rc; i++) {
        long want = 0;
        int r;
        for (r = 0; r < w->n; r++) want += (long)(((size_t)rank * rc + i) % 1000) + r;
        encode(DT_INT32, want, b->hwant + i * 4);
    }
    to_device(b->dsend, b->hsend, rc * n * 4);
    rcheck(w, M_REDUCE_SCATTER, rank,
           A.ncclReduceScatter(b->dsend, b->drecv, rc, DT_INT32, OP_SUM, b->comm, b->stream) == 0 &&
               recv_matches(b, 0, rc * 4),
           "wrong block");
    /* in place: recv = send + rank*rc, in the send allocation */
    to_device(b->drecv, b->hsend, rc * n * 4);
    {
        char *recv = b->drecv + (size_t)rank * rc * 4;
        int rcode = A.ncclReduceScatter(b->drecv, recv, rc, DT_INT32, OP_SUM, b->comm, b->stream);
        rcheck(w, M_REDUCE_SCATTER_INPLACE, rank, rcode == 0 && recv_matches(b, (size_t)rank * rc * 4, rc * 4),
               "wrong block");
    }
}

static void matrix_all_gather(struct world *w, struct rank_bufs *b, int rank) {
    const size_t k = 100003;                        /* odd, to catch byte-offset mistakes */
    size_t i, n = (size_t)w->n;
    int good = 1, r;
    /* uint8 */
    for (i = 0; i < k; i++) b->hsend[i] = (unsigned char)(i + (size_t)rank * 17);
    for (r = 0; r < w->n; r++)
        for (i = 0; i < k; i++) b->hwant[(size_t)r * k + i] = (unsigned char)(i + (size_t)r * 17);
    to_device(b->dsend, b->hsend, k);
    good &= A.ncclAllGather(b->dsend, b->drecv, k, DT_UINT8, b->comm, b->stream) == 0 && recv_matches(b, 0, k * n);
    /* int32 */
    fill_i32(b->hsend, k, 1000000L * rank);
    for (r = 0; r < w->n; r++) fill_i32(b->hwant + (size_t)r * k * 4, k, 1000000L * r);
    to_device(b->dsend, b->hsend, k * 4);
    good &= A.ncclAllGather(b->dsend, b->drecv, k, DT_INT32, b->comm, b->stream) == 0 && recv_matches(b, 0, k * n * 4);
    rcheck(w, M_ALL_GATHER, rank, good, "wrong blocks");
    /* in place: our block already sits at recv + rank*k */
    dev_memset(b->drecv, 0, k * n * 4);
    to_device(b->drecv + (size_t)rank * k * 4, b->hsend, k * 4);
    rcheck(w, M_ALL_GATHER_INPLACE, rank,
           A.ncclAllGather(b->drecv + (size_t)rank * k * 4, b->drecv, k, DT_INT32, b->comm, b->stream) == 0 &&
               recv_matches(b, 0, k * n * 4),
           "wrong blocks");
}

static void matrix_rooted(struct world *w, struct rank_bufs *b, int rank) {
    const size_t k = 50001;
    size_t n = (size_t)w->n, i;
    int good, r, rc;
    /* broadcast from 1: non-roots pass send = NULL */
    fill_i32(b->hsend, k, 777);
    fill_i32(b->hwant, k, 777);
    if (rank == 1) to_device(b->dsend, b->hsend, k * 4);
    dev_memset(b->drecv, 0, k * 4);
    rc = A.ncclBroadcast(rank == 1 ? b->dsend : NULL, b->drecv, k, DT_INT32, 1, b->comm, b->stream);
    rcheck(w, M_BROADCAST, rank, rc == 0 && recv_matches(b, 0, k * 4), "wrong data");
    dev_memset(b->drecv, 0, k * 4);
    if (rank == 1) to_device(b->drecv, b->hsend, k * 4);
    rc = A.ncclBroadcast(b->drecv, b->drecv, k, DT_INT32, 1, b->comm, b->stream);
    rcheck(w, M_BROADCAST_INPLACE, rank, rc == 0 && recv_matches(b, 0, k * 4), "wrong data");

    /* reduce to 2, max over int64; non-roots pass recv = NULL */
    for (i = 0; i < k; i++) encode(DT_INT64, (long)i * (rank + 1), b->hsend + i * 8);
    for (i = 0; i < k; i++) encode(DT_INT64, (long)i * w->n, b->hwant + i * 8);
    to_device(b->dsend, b->hsend, k * 8);
    rc = A.ncclReduce(b->dsend, rank == 2 ? b->drecv : NULL, k, DT_INT64, OP_MAX, 2, b->comm, b->stream);
    good = rc == 0;
    if (rank == 2) good &= recv_matches(b, 0, k * 8);
    else run_sync(b);
    rcheck(w, M_REDUCE, rank, good, "wrong result");

    /* all-to-all: block j of rank r carries (r, j) */
    for (r = 0; r < w->n; r++) fill_i32(b->hsend + (size_t)r * k * 4, k, 100000L * rank + 10L * r);
    for (r = 0; r < w->n; r++) fill_i32(b->hwant + (size_t)r * k * 4, k, 100000L * r + 10L * rank);
    to_device(b->dsend, b->hsend, k * n * 4);
    rcheck(w, M_ALL_TO_ALL, rank,
           A.ncclAlltoAll(b->dsend, b->drecv, k, DT_INT32, b->comm, b->stream) == 0 && recv_matches(b, 0, k * n * 4),
           "wrong blocks");

    /* gather to 0, then in place (send = recv + root*k at the root) */
    fill_i32(b->hsend, k, 5000000L * rank);
    for (r = 0; r < w->n; r++) fill_i32(b->hwant + (size_t)r * k * 4, k, 5000000L * r);
    to_device(b->dsend, b->hsend, k * 4);
    rc = A.ncclGather(b->dsend, rank == 0 ? b->drecv : NULL, k, DT_INT32, 0, b->comm, b->stream);
    good = rc == 0;
    if (rank == 0) good &= recv_matches(b, 0, k * n * 4);
    else run_sync(b);
    if (rank == 0) {
        dev_memset(b->drecv, 0, k * n * 4);
        to_device(b->drecv, b->hsend, k * 4);      /* root 0: its block at offset 0 */
        rc = A.ncclGather(b->drecv, b->drecv, k, DT_INT32, 0, b->comm, b->stream);
        good &= rc == 0 && recv_matches(b, 0, k * n * 4);
    } else {
        rc = A.ncclGather(b->dsend, NULL, k, DT_INT32, 0, b->comm, b->stream);
        good &= rc == 0;
        run_sync(b);
    }
    rcheck(w, M_GATHER, rank, good, "wrong blocks");

    /* scatter from 1, then in place (recv = send + root*k at the root) */
    for (r = 0; r < w->n; r++) fill_i32(b->hsend + (size_t)r * k * 4, k, 3000000L * r + 1);
    fill_i32(b->hwant, k, 3000000L * rank + 1);
    if (rank == 1) to_device(b->dsend, b->hsend, k * n * 4);
    dev_memset(b->drecv, 0, k * 4);
    rc = A.ncclScatter(rank == 1 ? b->dsend : NULL, b->drecv, k, DT_INT32, 1, b->comm, b->stream);
    good = rc == 0 && recv_matches(b, 0, k * 4);
    if (rank == 1) {
        to_device(b->drecv, b->hsend, k * n * 4);
        rc = A.ncclScatter(b->drecv, b->drecv + k * 4, k, DT_INT32, 1, b->comm, b->stream);
        good &= rc == 0 && recv_matches(b, k * 4, k * 4);
    } else {
        dev_memset(b->drecv, 0, k * 4);
        rc = A.ncclScatter(NULL, b->drecv, k, DT_INT32, 1, b->comm, b->stream);
        good &= rc == 0 && recv_matches(b, 0, k * 4);
    }
    rcheck(w, M_SCATTER, rank, good, "wrong block");
}

static void matrix_args(struct world *w, struct rank_bufs *b, int rank) {
    int good = 1;
    good &= A.ncclAllReduce(b->dsend, b->drecv, 0, DT_F32, OP_SUM, b->comm, b->stream) == 0;
    good &= A.ncclAllGather(NULL, NULL, 0, DT_F32, b->comm, b->stream) == 0;
    rcheck(w, M_COUNT0, rank, good, "count 0 failed");
    good = 1;
    good &= A.ncclAllReduce(b->hsend, b->drecv, 10, DT_F32, OP_SUM, b->comm, b->stream) == 4;
    good &= A.ncclAllReduce(b->dsend, b->hrecv, 10, DT_F32, OP_SUM, b->comm, b->stream) == 4;
    good &= A.ncclAllReduce(b->dsend, b->drecv, 10, 12, OP_SUM, b->comm, b->stream) == 4;
    good &= A.ncclAllReduce(b->dsend, b->drecv, 10, DT_F32, 5, b->comm, b->stream) == 4;
    good &= A.ncclBroadcast(b->dsend, b->drecv, 10, DT_F32, 3, b->comm, b->stream) == 4;
    good &= A.ncclAlltoAll(b->dsend, b->dsend, 10, DT_F32, b->comm, b->stream) == 4;
    good &= A.ncclAllReduce(b->dsend, b->drecv, b->cap, DT_F32, OP_SUM, b->comm, b->stream) == 4;  /* too big */
    good &= A.ncclAllReduce(b->dsend, b->drecv, 10, DT_F32, OP_SUM, NULL, b->stream) == 4;
    good &= strlen(A.ncclGetLastError(b->comm)) > 0;
    rcheck(w, M_BAD_ARGS, rank, good, "an invalid call was accepted");
}

static void matrix_p2p(struct world *w, struct rank_bufs *b, int rank) {
    const size_t k = 100000, self = 10;             /* 400 KB: several 64 KiB channel chunks */
    int next = (rank + 1) % w->n, prev = (rank + w->n - 1) % w->n, good = 1;
    fill_i32(b->hsend, k, 7000000L * rank);
    fill_i32(b->hsend + k * 4, self, 900L + rank);
    to_device(b->dsend, b->hsend, (k + self) * 4);
    dev_memset(b->drecv, 0, (k + self) * 4);
    good &= A.ncclGroupStart() == 0;
    good &= A.ncclGroupStart() == 0;                 /* nested */
    good &= A.ncclSend(b->dsend, k, DT_INT32, next, b->comm, b->stream) == 0;
    good &= A.ncclRecv(b->drecv, k, DT_INT32, prev, b->comm, b->stream) == 0;
    good &= A.ncclGroupEnd() == 0;
    good &= A.ncclSend(b->dsend + k * 4, self, DT_INT32, rank, b->comm, b->stream) == 0;
    good &= A.ncclRecv(b->drecv + k * 4, self, DT_INT32, rank, b->comm, b->stream) == 0;
    good &= A.ncclGroupEnd() == 0;
    fill_i32(b->hwant, k, 7000000L * prev);
    fill_i32(b->hwant + k * 4, self, 900L + rank);
    good &= recv_matches(b, 0, (k + self) * 4);
    good &= async_error(b->comm) == 0;
    rcheck(w, M_P2P, rank, good, "wrong data or error");
}

/* On a second communicator (their errors are sticky): a collective whose count differs on one
 * rank, then (on a third) a send of 10 received as 20. */
static void matrix_mismatches(struct world *w, struct rank_bufs *b, int rank) {
    comm_t c2 = NULL, c3 = NULL;
    int e, rc;
    A.ncclCommInitRank(&c2, w->n, w->ids[1], rank);
    A.ncclAllReduce(b->dsend, b->drecv, rank == 2 ? 11 : 10, DT_F32, OP_SUM, c2, b->stream);
    run_sync(b);
    e = async_error(c2);
    rcheck(w, M_COLL_MISMATCH, rank, e == 5, "no ncclInvalidUsage");
    A.ncclCommDestroy(c2);
    A.ncclCommInitRank(&c3, w->n, w->ids[2], rank);
    rc = 0;
    if (rank == 0) rc = A.ncclSend(b->dsend, 10, DT_INT32, 1, c3, b->stream);
    if (rank == 1) rc = A.ncclRecv(b->drecv, 20, DT_INT32, 0, c3, b->stream);
    run_sync(b);
    e = async_error(c3);
    rcheck(w, M_P2P_MISMATCH, rank, rc == 0 && e == (rank == 2 ? 0 : 5), "wrong async error");
    A.ncclCommDestroy(c3);
}

static void *matrix_rank(void *arg) {
    struct world *w = ((void **)arg)[0];
    int rank = (int)(intptr_t)((void **)arg)[1];
    struct rank_bufs b;
    memset(&b, 0, sizeof b);
    b.cap = (size_t)8 << 20;
    b.hsend = malloc(b.cap);
    b.hrecv = malloc(b.cap);
    b.hwant = malloc(b.cap);
    A.cudaMalloc((void **)&b.dsend, b.cap);
    A.cudaMalloc((void **)&b.drecv, b.cap);
    /* One fake device: the ranks use non-blocking streams (see fake_cudart.c, "Caveat"). */
    A.cudaStreamCreateWithFlags(&b.stream, NONBLOCKING_STREAM);
    rcheck(w, M_INIT, rank, A.ncclCommInitRank(&b.comm, w->n, w->ids[0], rank) == 0, "init failed");
    if (b.comm) {
        matrix_allreduce(w, &b, rank);
        matrix_allreduce_big(w, &b, rank);
        matrix_reduce_scatter(w, &b, rank);
        matrix_all_gather(w, &b, rank);
        matrix_rooted(w, &b, rank);
        matrix_args(w, &b, rank);
        matrix_p2p(w, &b, rank);
        matrix_mismatches(w, &b, rank);
        rcheck(w, M_DESTROY, rank, A.ncclCommDestroy(b.comm) == 0, "destroy failed");
    }
    A.cudaStreamDestroy(b.stream);
    A.cudaFree(b.dsend);
    A.cudaFree(b.drecv);
    free(b.hsend);
    free(b.hrecv);
    free(b.hwant);
    return NULL;
}

static void run_threads(int n, void *(*fn)(void *), struct world *w) {
    pthread_t t[8];
    void *args[8][2];
    int r;
    for (r = 0; r < n; r++) {
        args[r][0] = w;
        args[r][1] = (void *)(intptr_t)r;
        pthread_create(&t[r], NULL, fn, args[r]);
    }
    for (r = 0; r < n; r++) pthread_join(t[r], NULL);
}

static void test_thread_matrix(void) {
    struct world w;
    int i;
    memset(&w, 0, sizeof w);
    pthread_mutex_init(&w.mu, NULL);
    w.n = 3;
    for (i = 0; i < 3; i++) A.ncclGetUniqueId(&w.ids[i]);
    run_threads(w.n, matrix_rank, &w);
    for (i = 0; i < M_NCHECKS; i++)
        ok(w.runs[i] == w.n && w.fails[i] == 0, "3 thread ranks: %s", matrix_text[i]);
    pthread_mutex_destroy(&w.mu);
}

/* Split 4 thread ranks: color r%2 with key -r (reversed order), rank 3 NOCOLOR; then a
 * nonblocking split of everyone into one communicator. */
static void *split_rank(void *arg) {
    struct world *w = ((void **)arg)[0];
    int rank = (int)(intptr_t)((void **)arg)[1];
    comm_t parent = NULL, child = NULL, all = NULL;
    config_t nb = config_init(0);
    void *s = NULL;
    int *d = NULL, v, good = 1, count = -1, me = -1, rc, polls;
    A.cudaStreamCreateWithFlags(&s, NONBLOCKING_STREAM);
    A.cudaMalloc((void **)&d, 16);
    if (A.ncclCommInitRank(&parent, 4, w->ids[0], rank) != 0) {
        w->split_ok[rank] = 0;
        return NULL;
    }
    rc = A.ncclCommSplit(parent, rank == 3 ? -1 : rank % 2, -rank, &child, NULL);
    good &= rc == 0;
    if (rank == 3) {
        good &= child == NULL;
    } else {
        int want_n = rank % 2 == 0 ? 2 : 1, want_rank = rank == 0 ? 1 : 0;
        good &= child != NULL && A.ncclCommCount(child, &count) == 0 && A.ncclCommUserRank(child, &me) == 0;
        good &= count == want_n && me == want_rank;
        v = rank + 1;
        to_device(d, &v, sizeof v);
        A.ncclAllReduce(d, d, 1, DT_INT32, OP_SUM, child, s);
        A.cudaStreamSynchronize(s);
        A.cudaMemcpy(&v, d, sizeof v, D2H);
        good &= v == (rank % 2 == 0 ? 1 + 3 : 2);                /* ranks {0,2} and {1} */
        good &= A.ncclCommDestroy(child) == 0;
    }
    rc = A.ncclCommSplit(parent, 0, rank, &all, &nb);
    good &= rc == 7 && all != NULL;
    good &= wait_ready(all, &polls) == 0 && polls >= 1;
    good &= A.ncclCommCount(all, &count) == 0 && count == 4 && A.ncclCommUserRank(all, &me) == 0 && me == rank;
    v = 1;
    to_device(d, &v, sizeof v);
    A.ncclAllReduce(d, d, 1, DT_INT32, OP_SUM, all, s);
    A.cudaStreamSynchronize(s);
    A.cudaMemcpy(&v, d, sizeof v, D2H);
    good &= v == 4;
    good &= A.ncclCommDestroy(all) == 0 && A.ncclCommDestroy(parent) == 0;
    A.cudaStreamDestroy(s);
    A.cudaFree(d);
    w->split_ok[rank] = good;
    return NULL;
}

static void test_split(void) {
    struct world w;
    int r, good = 1;
    memset(&w, 0, sizeof w);
    pthread_mutex_init(&w.mu, NULL);
    A.ncclGetUniqueId(&w.ids[0]);
    run_threads(4, split_rank, &w);
    for (r = 0; r < 4; r++) good &= w.split_ok[r];
    ok(good, "split: colors r%%2 ordered by key -r, NOCOLOR -> NULL, all-reduce on each; nonblocking split (%d%d%d%d)",
       w.split_ok[0], w.split_ok[1], w.split_ok[2], w.split_ok[3]);
    pthread_mutex_destroy(&w.mu);
}

/* Two ranks driven from this one thread: a group of blocking inits, or two nonblocking inits. */
static int init_pair(comm_t c[2], int nonblocking, int *min_polls) {
    uid_t128 id;
    config_t cfg = config_init(nonblocking ? 0 : INT_MIN);
    int r, rc = 0, polls;
    A.ncclGetUniqueId(&id);
    if (nonblocking) {
        for (r = 0; r < 2; r++)
            if (A.ncclCommInitRankConfig(&c[r], 2, id, r, &cfg) != 7) rc = -1;
        *min_polls = INT_MAX;
        for (r = 0; r < 2; r++) {
            if (wait_ready(c[r], &polls) != 0) rc = -1;
            if (polls < *min_polls) *min_polls = polls;
        }
        return rc;
    }
    A.ncclGroupStart();
    for (r = 0; r < 2; r++)
        if (A.ncclCommInitRankConfig(&c[r], 2, id, r, &cfg) != 0) rc = -1;
    return A.ncclGroupEnd() != 0 ? -1 : rc;
}

static void test_nonblocking_init(void) {
    uid_t128 id;
    config_t cfg = config_init(0), bad = config_init(1);
    comm_t c[2] = {NULL, NULL};
    int r, rc[2], polls[2], e[2];
    A.ncclGetUniqueId(&id);
    setenv("FAKE_NCCL_INIT_INPROGRESS", "3", 1);
    for (r = 0; r < 2; r++) rc[r] = A.ncclCommInitRankConfig(&c[r], 2, id, r, &cfg);
    unsetenv("FAKE_NCCL_INIT_INPROGRESS");
    for (r = 0; r < 2; r++) e[r] = wait_ready(c[r], &polls[r]);
    ok(rc[0] == 7 && rc[1] == 7 && e[0] == 0 && e[1] == 0 && polls[0] >= 3 && polls[1] >= 3,
       "nonblocking init from one thread: ncclInProgress, then ready; FAKE_NCCL_INIT_INPROGRESS=3 (polls %d, %d)",
       polls[0], polls[1]);
    for (r = 0; r < 2; r++) A.ncclCommDestroy(c[r]);
    rc[0] = init_pair(c, 1, &polls[0]);
    ok(rc[0] == 0 && polls[0] >= 1, "nonblocking init, default: at least one ncclInProgress poll (%d)", polls[0]);
    for (r = 0; r < 2; r++) A.ncclCommDestroy(c[r]);
    ok(init_pair(c, 0, NULL) == 0, "blocking inits of two ranks inside one group, from one thread");
    for (r = 0; r < 2; r++) A.ncclCommDestroy(c[r]);
    bad.magic = 0;
    ok(A.ncclCommInitRankConfig(&c[0], 1, id, 0, &bad) == 4, "a config without NCCL_CONFIG_INITIALIZER: 4");
    ok(A.ncclGroupEnd() == 5, "ncclGroupEnd without ncclGroupStart: ncclInvalidUsage");
}

/* FAKE_NCCL_HANG_RANK=1 FAKE_NCCL_HANG_AFTER=1: rank 1's second all-reduce never arrives. */
static void test_abort_hung(void) {
    comm_t c[2] = {NULL, NULL};
    void *s[2] = {NULL, NULL}, *e = NULL;
    int *d[2] = {NULL, NULL}, r, v[2] = {1, 2}, q;
    setenv("FAKE_NCCL_HANG_RANK", "1", 1);
    setenv("FAKE_NCCL_HANG_AFTER", "1", 1);
    ok(init_pair(c, 0, NULL) == 0, "hang: init 2 ranks (FAKE_NCCL_HANG_RANK=1, FAKE_NCCL_HANG_AFTER=1)");
    unsetenv("FAKE_NCCL_HANG_RANK");
    unsetenv("FAKE_NCCL_HANG_AFTER");
    A.cudaEventCreate(&e);
    for (r = 0; r < 2; r++) {
        A.cudaStreamCreateWithFlags(&s[r], NONBLOCKING_STREAM);
        A.cudaMalloc((void **)&d[r], 4);
        to_device(d[r], &v[r], 4);
    }
    A.ncclGroupStart();
    for (r = 0; r < 2; r++) A.ncclAllReduce(d[r], d[r], 1, DT_INT32, OP_SUM, c[r], s[r]);
    A.ncclGroupEnd();
    for (r = 0; r < 2; r++) {
        A.cudaStreamSynchronize(s[r]);
        A.cudaMemcpy(&v[r], d[r], 4, D2H);
    }
    ok(v[0] == 3 && v[1] == 3, "the first all-reduce completes (issued for both ranks in one group)");
    for (r = 0; r < 2; r++) A.ncclAllReduce(d[r], d[r], 1, DT_INT32, OP_SUM, c[r], s[r]);
    A.cudaEventRecord(e, s[0]);
    ok(A.cudaStreamQuery(s[1]) == 0 || A.cudaStreamSynchronize(s[1]) == 0,
       "rank 1's second all-reduce was dropped: its stream is idle");
    q = A.cudaEventQuery(e);
    ok(q == NOT_READY, "rank 0 waits for it (event not ready)");
    ok(A.ncclCommAbort(c[0]) == 0, "ncclCommAbort(rank 0) from another thread than its stream's");
    ok(A.cudaEventSynchronize(e) == 0 && A.cudaEventQuery(e) == 0, "the hung all-reduce returned; the event completed");
    ok(A.ncclCommAbort(c[0]) == 4, "the aborted handle is gone (ncclInvalidArgument)");
    ok(A.ncclCommAbort(c[1]) == 0, "abort rank 1");
    for (r = 0; r < 2; r++) {
        A.cudaStreamDestroy(s[r]);
        A.cudaFree(d[r]);
    }
    A.cudaEventDestroy(e);
}

/* FAKE_NCCL_ASYNC_ERROR_AFTER=2: ncclRemoteError after two operations, the third never ends. */
static void test_async_error(void) {
    comm_t c[2] = {NULL, NULL};
    void *s[2] = {NULL, NULL}, *e[2] = {NULL, NULL};
    int *d[2] = {NULL, NULL}, r, i, before[2] = {-1, -1}, after[2], q[2];
    setenv("FAKE_NCCL_ASYNC_ERROR_AFTER", "2", 1);
    ok(init_pair(c, 0, NULL) == 0, "async error: init 2 ranks (FAKE_NCCL_ASYNC_ERROR_AFTER=2)");
    unsetenv("FAKE_NCCL_ASYNC_ERROR_AFTER");
    for (r = 0; r < 2; r++) {
        A.cudaStreamCreateWithFlags(&s[r], NONBLOCKING_STREAM);
        A.cudaEventCreate(&e[r]);
        A.cudaMalloc((void **)&d[r], 4);
    }
    for (i = 0; i < 2; i++) {
        for (r = 0; r < 2; r++) A.ncclAllReduce(d[r], d[r], 1, DT_INT32, OP_SUM, c[r], s[r]);
        for (r = 0; r < 2; r++) A.cudaStreamSynchronize(s[r]);
        if (i == 0)
            for (r = 0; r < 2; r++) before[r] = async_error(c[r]);
    }
    for (r = 0; r < 2; r++) after[r] = async_error(c[r]);
    ok(before[0] == 0 && before[1] == 0 && after[0] == 6 && after[1] == 6,
       "no error after one all-reduce; ncclRemoteError after two (%d %d -> %d %d)", before[0], before[1], after[0],
       after[1]);
    for (r = 0; r < 2; r++) {
        A.ncclAllReduce(d[r], d[r], 1, DT_INT32, OP_SUM, c[r], s[r]);
        A.cudaEventRecord(e[r], s[r]);
    }
    for (r = 0; r < 2; r++) q[r] = A.cudaEventQuery(e[r]);
    ok(q[0] == NOT_READY && q[1] == NOT_READY, "the third never completes");
    for (r = 0; r < 2; r++) A.ncclCommAbort(c[r]);
    ok(A.cudaEventSynchronize(e[0]) == 0 && A.cudaEventSynchronize(e[1]) == 0, "... until aborted");
    for (r = 0; r < 2; r++) {
        A.cudaStreamDestroy(s[r]);
        A.cudaEventDestroy(e[r]);
        A.cudaFree(d[r]);
    }
}

static void test_init_fail(void) {
    uid_t128 id;
    config_t nb = config_init(0);
    comm_t c = (comm_t)1;
    int rc, e;
    A.ncclGetUniqueId(&id);
    setenv("FAKE_NCCL_INIT_FAIL", "1", 1);
    rc = A.ncclCommInitRank(&c, 1, id, 0);
    ok(rc == 1 && c == NULL, "FAKE_NCCL_INIT_FAIL=1: blocking init returns ncclUnhandledCudaError, comm NULL");
    rc = A.ncclCommInitRankConfig(&c, 1, id, 0, &nb);
    unsetenv("FAKE_NCCL_INIT_FAIL");
    e = wait_ready(c, NULL);
    ok(rc == 7 && e == 1, "... nonblocking: ncclInProgress, then the async error 1");
    ok(A.ncclCommDestroy(c) == 0, "destroy the failed communicator");
}

/* Two nonblocking ranks driven from this thread; only rank 1's communicator is created with
 * NAME=VALUE in the environment (the switches are read when a communicator is created), as a
 * test sets a switch in one forked rank. Returns the two init results. */
static void init_pair_rank1_env(comm_t c[2], int rc[2], const char *name, const char *value,
                                const char *name2, const char *value2) {
    uid_t128 id;
    config_t nb = config_init(0);
    A.ncclGetUniqueId(&id);
    rc[0] = A.ncclCommInitRankConfig(&c[0], 2, id, 0, &nb);
    setenv(name, value, 1);
    if (name2) setenv(name2, value2, 1);
    rc[1] = A.ncclCommInitRankConfig(&c[1], 2, id, 1, &nb);
    unsetenv(name);
    if (name2) unsetenv(name2);
}

/* FAKE_NCCL_FAIL_OP on rank 1 only (with FAKE_NCCL_ASYNC_ERROR_CODE=3 there, to tell its own
 * error from the peer's): its operation fails and completes without work; rank 0, waiting for
 * it in a collective (p2p: 0) or a receive (p2p: 1), ends with ncclRemoteError; later
 * operations complete at once on both; ncclGetLastError says which. */
static void test_fail_op(int p2p) {
    const char *what = p2p ? "send/recv" : "all-reduce";
    comm_t c[2] = {NULL, NULL};
    void *s[2] = {NULL, NULL}, *e[2] = {NULL, NULL};
    int *send[2] = {NULL, NULL}, *recv[2] = {NULL, NULL}, rc[2], r, v, got[2], err[2], q[2], i;
    char text[2][256];
    init_pair_rank1_env(c, rc, "FAKE_NCCL_FAIL_OP", p2p ? "1" : "2", "FAKE_NCCL_ASYNC_ERROR_CODE", "3");
    ok(rc[0] == 7 && rc[1] == 7 && wait_ready(c[0], NULL) == 0 && wait_ready(c[1], NULL) == 0,
       "FAKE_NCCL_FAIL_OP=%d on rank 1 only (%s): init", p2p ? 1 : 2, what);
    for (r = 0; r < 2; r++) {
        A.cudaStreamCreateWithFlags(&s[r], NONBLOCKING_STREAM);
        A.cudaEventCreate(&e[r]);
        A.cudaMalloc((void **)&send[r], 4);
        A.cudaMalloc((void **)&recv[r], 4);
        v = r + 1;
        to_device(send[r], &v, 4);
        v = -1;
        to_device(recv[r], &v, 4);
    }
    if (!p2p) {
        for (r = 0; r < 2; r++) A.ncclAllReduce(send[r], send[r], 1, DT_INT32, OP_SUM, c[r], s[r]);
        for (r = 0; r < 2; r++) {
            A.cudaStreamSynchronize(s[r]);
            A.cudaMemcpy(&got[r], send[r], 4, D2H);
            err[r] = async_error(c[r]);
        }
        ok(got[0] == 3 && got[1] == 3 && err[0] == 0 && err[1] == 0, "... operation 1 runs (%d %d, errors %d %d)",
           got[0], got[1], err[0], err[1]);
        for (r = 0; r < 2; r++) A.ncclAllReduce(send[r], recv[r], 1, DT_INT32, OP_SUM, c[r], s[r]);
    } else {
        A.ncclRecv(recv[0], 1, DT_INT32, 1, c[0], s[0]);
        A.ncclSend(send[1], 1, DT_INT32, 0, c[1], s[1]);
    }
    for (r = 0; r < 2; r++) A.cudaEventRecord(e[r], s[r]);
    for (r = 0; r < 2; r++) q[r] = A.cudaEventSynchronize(e[r]);
    for (r = 0; r < 2; r++) {
        A.cudaMemcpy(&got[r], recv[r], 4, D2H);
        err[r] = async_error(c[r]);
        snprintf(text[r], sizeof text[r], "%s", A.ncclGetLastError(c[r]));   /* one buffer per thread */
    }
    ok(q[0] == 0 && q[1] == 0, "... the failing operation completes on rank 1 and ends rank 0's wait: "
       "events recorded after them fire");
    ok(err[1] == 3 && err[0] == 6, "... async errors: rank 1 FAKE_NCCL_ASYNC_ERROR_CODE (%d), rank 0 "
       "ncclRemoteError (%d)", err[1], err[0]);
    ok(got[0] == -1 && got[1] == -1, "... output buffers untouched (%d %d)", got[0], got[1]);
    ok(strstr(text[1], p2p ? "operation 1 failed (FAKE_NCCL_FAIL_OP=1)" : "operation 2 failed (FAKE_NCCL_FAIL_OP=2)") &&
       strstr(text[0], "peer rank 1 failed"), "... ncclGetLastError: \"%s\" / \"%s\"", text[1], text[0]);
    for (i = 0; i < 2; i++) {
        for (r = 0; r < 2; r++) A.ncclAllReduce(send[r], recv[r], 1, DT_INT32, OP_SUM, c[r], s[r]);
        for (r = 0; r < 2; r++) A.cudaEventRecord(e[r], s[r]);
    }
    for (r = 0; r < 2; r++) {
        q[r] = A.cudaEventSynchronize(e[r]);
        A.cudaMemcpy(&got[r], recv[r], 4, D2H);
        err[r] = async_error(c[r]);
    }
    ok(q[0] == 0 && q[1] == 0 && got[0] == -1 && got[1] == -1 && err[1] == 3 && err[0] == 6,
       "... later operations complete at once without work on both ranks, the errors stay");
    ok(A.ncclCommAbort(c[0]) == 0 && A.ncclCommAbort(c[1]) == 0, "... ncclCommAbort both");
    for (r = 0; r < 2; r++) {
        A.cudaStreamDestroy(s[r]);
        A.cudaEventDestroy(e[r]);
        A.cudaFree(send[r]);
        A.cudaFree(recv[r]);
    }
}

/* NCCL's groups belong to the thread, not to a communicator: an all-reduce on D inside a group
 * opened around one on C is held until the outermost ncclGroupEnd, so an event recorded on D's
 * (late) stream after the inner End comes before it. */
static void test_group_thread_wide(void) {
    uid_t128 idc, idd;
    comm_t cc = NULL, cd = NULL;
    void *sc = NULL, *sd = NULL, *reader = NULL, *e = NULL;
    int *bc = NULL, *send = NULL, *recv = NULL, v, got = 0, rc[4], q;
    A.ncclGetUniqueId(&idc);
    A.ncclGetUniqueId(&idd);
    ok(A.ncclCommInitRank(&cc, 1, idc, 0) == 0 && A.ncclCommInitRank(&cd, 1, idd, 0) == 0,
       "thread-wide group: two 1-rank communicators C and D");
    A.cudaStreamCreateWithFlags(&sc, NONBLOCKING_STREAM);
    setenv("FAKE_CUDA_STREAM_DELAY_US", "20000", 1);
    A.cudaStreamCreateWithFlags(&sd, NONBLOCKING_STREAM);    /* D's stream runs 20 ms late */
    unsetenv("FAKE_CUDA_STREAM_DELAY_US");
    A.cudaStreamCreateWithFlags(&reader, NONBLOCKING_STREAM);
    A.cudaEventCreate(&e);
    A.cudaMalloc((void **)&bc, 4);
    A.cudaMalloc((void **)&send, 4);
    A.cudaMalloc((void **)&recv, 4);
    v = 5;
    to_device(send, &v, 4);
    to_device(bc, &v, 4);
    v = -1;
    to_device(recv, &v, 4);
    rc[0] = A.ncclGroupStart();
    rc[1] = A.ncclGroupStart();
    A.ncclAllReduce(bc, bc, 1, DT_INT32, OP_SUM, cc, sc);
    A.ncclAllReduce(send, recv, 1, DT_INT32, OP_SUM, cd, sd);
    rc[2] = A.ncclGroupEnd();
    A.cudaEventRecord(e, sd);
    q = A.cudaEventSynchronize(e);
    A.cudaMemcpyAsync(&got, recv, 4, D2H, reader);
    A.cudaStreamSynchronize(reader);
    ok(rc[0] == 0 && rc[1] == 0 && rc[2] == 0 && q == 0 && got == -1,
       "... groupStart; groupStart; all-reduce(C); all-reduce(D); groupEnd; event on D's stream: it fires "
       "before D's all-reduce ran (recv still %d)", got);
    rc[3] = A.ncclGroupEnd();
    A.cudaStreamSynchronize(sd);
    A.cudaMemcpyAsync(&got, recv, 4, D2H, reader);
    A.cudaStreamSynchronize(reader);
    ok(rc[3] == 0 && got == 5, "... the outermost groupEnd issues it (recv %d)", got);
    A.ncclCommDestroy(cc);
    A.ncclCommDestroy(cd);
    A.cudaStreamDestroy(sc);
    A.cudaStreamDestroy(sd);
    A.cudaStreamDestroy(reader);
    A.cudaEventDestroy(e);
    A.cudaFree(bc);
    A.cudaFree(send);
    A.cudaFree(recv);
}

/* FAKE_NCCL_INIT_FAIL on rank 1 only, nonblocking: rank 1 reports ncclInProgress, then the
 * error; rank 0 stays in progress (its peer never joins) until ncclCommAbort, which returns at
 * once and leaves no segment behind. */
static void test_init_fail_one_rank(void) {
    comm_t c[2] = {NULL, NULL};
    char prefix[64];
    int rc[2], e1, i, still = 1, polls;
    double t0, dt;
    init_pair_rank1_env(c, rc, "FAKE_NCCL_INIT_FAIL", "2", NULL, NULL);
    e1 = wait_ready(c[1], &polls);
    ok(rc[0] == 7 && rc[1] == 7 && e1 == 2, "FAKE_NCCL_INIT_FAIL=2 on rank 1 only, nonblocking: both ncclInProgress; "
       "rank 1 then ncclSystemError (%d)", e1);
    ok(strstr(A.ncclGetLastError(c[1]), "init failed (FAKE_NCCL_INIT_FAIL=2)") != NULL,
       "... ncclGetLastError: \"%s\"", A.ncclGetLastError(c[1]));
    for (i = 0; i < 100; i++) {
        still &= async_error(c[0]) == 7;
        sleep_ms(1);
    }
    ok(still, "... rank 0 is still in progress 100 polls later (its peer never joins)");
    t0 = now_s();
    rc[0] = A.ncclCommAbort(c[0]);
    dt = now_s() - t0;
    ok(rc[0] == 0 && dt < 1.0, "... ncclCommAbort of the in-progress init returns promptly (%.1f ms)", dt * 1e3);
    ok(A.ncclCommAbort(c[1]) == 0, "... abort the failed one");
    snprintf(prefix, sizeof prefix, "fake_nccl_%d_", (int)getpid());
    ok(shm_count(prefix) == 0, "... no segment left in /dev/shm");
}

static void test_nccl_misc(void) {
    uid_t128 id, bogus;
    comm_t c = NULL;
    void *p = NULL;
    struct ptr_attr at;
    int dev = -1, n = 0, *d = NULL, v = 5;
    A.ncclGetUniqueId(&id);
    memset(&bogus, 0, sizeof bogus);
    ok(A.ncclCommInitRank(&c, 1, bogus, 0) == 4, "a unique id not from ncclGetUniqueId: ncclInvalidArgument");
    ok(A.ncclCommInitRank(&c, 2, id, 2) == 4, "rank out of range: ncclInvalidArgument");
    ok(A.ncclCommInitRank(&c, 1, id, 0) == 0 && A.ncclCommCount(c, &n) == 0 && n == 1 &&
           A.ncclCommCuDevice(c, &dev) == 0 && dev == 0,
       "a 1-rank communicator: count 1, device 0");
    A.cudaMalloc((void **)&d, 4);
    to_device(d, &v, 4);
    ok(A.ncclAllReduce(d, d, 1, DT_INT32, OP_SUM, c, NULL) == 0 && A.cudaStreamSynchronize(NULL) == 0,
       "all-reduce on the legacy default stream (1 rank)");
    A.cudaMemcpy(&v, d, 4, D2H);
    ok(v == 5 && A.ncclCommFinalize(c) == 0 && A.ncclCommDestroy(c) == 0, "finalize, destroy");
    ok(A.ncclMemAlloc(&p, 1000) == 0 && A.cudaPointerGetAttributes(&at, p) == 0 && at.type == 2 &&
           A.ncclMemFree(p) == 0,
       "ncclMemAlloc gives device memory of the fake runtime");
    ok(strlen(A.ncclGetErrorString(6)) > 0 && strlen(A.ncclGetErrorString(99)) > 0,
       "ncclGetErrorString never NULL");
    A.cudaFree(d);
}

static void test_unload(void) {
    char prefix[64];
    int threads = -1, i;
    snprintf(prefix, sizeof prefix, "fake_nccl_%d_", (int)getpid());
    unload_fakes();
    /* pthread_join has returned for every worker; give the kernel a moment to drop the tasks. */
    for (i = 0; i < 500 && (threads = fake_threads()) != 0; i++) sleep_ms(10);
    ok(threads == 0, "after dlclose no thread of the fakes is left (%d)", threads);
    ok(shm_count(prefix) == 0, "no /dev/shm segment left behind (%s*, split ones included)", prefix);
    ok(load_fakes() == 0, "load again");
    {
        void *p = NULL;
        int n = 0;
        ok(A.cudaMalloc(&p, 64) == 0 && A.cudaMemset(p, 1, 64) == 0 && A.cudaFree(p) == 0 &&
               A.cudaGetDeviceCount(&n) == 0 && n == 1,
           "the reloaded runtime works");
    }
    unload_fakes();
}

/* ---------------------------------------------------------------- main */

static void find_lib_dir(int argc, char **argv) {
    ssize_t n;
    char *slash;
    if (argc > 1 && argv[1][0] != '-') {
        snprintf(lib_dir, sizeof lib_dir, "%s", argv[1]);
        return;
    }
    n = readlink("/proc/self/exe", lib_dir, sizeof lib_dir - 1);
    lib_dir[n > 0 ? n : 0] = 0;
    if ((slash = strrchr(lib_dir, '/')) != NULL) *slash = 0;
    else snprintf(lib_dir, sizeof lib_dir, ".");
}

int main(int argc, char **argv) {
    if (argc > 2 && argv[1][0] == '-') {
        snprintf(lib_dir, sizeof lib_dir, "%s", argv[2]);
        if (strcmp(argv[1], "--child-devices") == 0) return child_devices();
        if (strcmp(argv[1], "--child-nccl-first") == 0) return child_nccl_first();
        if (strcmp(argv[1], "--child-async-copies") == 0) return child_async_copies();
        return 2;
    }
    find_lib_dir(argc, argv);
    signal(SIGPIPE, SIG_DFL);
    alarm(600);                     /* a bug that hangs fails the run instead of hanging prove */

    test_load();
    if (!h_nccl) {
        printf("1..%d\n", n_tests);
        return 1;
    }
    test_load_order();
    test_devices();
    test_device_count_env();
    test_memory_classification();
    test_device_memory_unreadable();
    test_memcpy();
    test_stream_order();
    test_legacy_stream();
    test_stream_destroy_pending();
    test_stream_delay();
    test_async_copies();
    test_two_processes();
    test_dead_peer();
    test_thread_matrix();
    test_split();
    test_nonblocking_init();
    test_abort_hung();
    test_async_error();
    test_init_fail();
    test_init_fail_one_rank();
    test_fail_op(0);
    test_fail_op(1);
    test_group_thread_wide();
    test_nccl_misc();
    test_unload();

    printf("1..%d\n", n_tests);
    return n_failed ? 1 : 0;
}
