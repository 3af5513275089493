/* SPDX-License-Identifier: MIT (see LICENSE) */
/* tests/ddp_test_device.h — runs a host-buffer test's calls on device buffers, through the fake NCCL
 * and CUDA runtime of tests/fake_nccl (built into build/fake_nccl by make).
 *
 * A test that includes this before its own code (test_nccl.c includes test_collectives.c) gets
 *   - every malloc'd region twinned with "device" memory of the fake runtime (which the host
 *     cannot touch: the fake maps it PROT_NONE, so a library that reads a device pointer on the
 *     host crashes instead of passing by luck);
 *   - ddp_all_reduce & co. replaced by wrappers that copy the call's buffers (plus the guard
 *     bytes around them) to the twins, make the call on the device pointers, synchronise the
 *     communicator's stream, and copy the twins back: the test's own checks (results, guards,
 *     sendbuf unchanged, determinism, hashes across ranks) then judge the device run;
 *   - ddp_comm_init replaced by init + a non-blocking stream of its own (so nothing but the
 *     explicit synchronisation orders the collective before the copy back: with the fake's
 *     streams running late, T_DEVICE_SKIP_SYNC=1 makes the results wrong; see test_nccl.c).
 * CUDA is touched only in the forked ranks (the fake's stream threads do not survive fork).
 * T_DEVICE_REAL=1 (make test-gpu) uses the real NCCL and CUDA runtime instead, one rank per GPU.
 */
#ifndef DDP_TEST_DEVICE_H
#define DDP_TEST_DEVICE_H
#include <dlfcn.h>
#include <libgen.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define T_DEV_H2D 1   /* cudaMemcpyHostToDevice */
#define T_DEV_D2H 2
#define T_DEV_GUARD 64
#define T_DEV_MAX_REGIONS 256

typedef struct {
    int (*Malloc)(void **, size_t);
    int (*Free)(void *);
    int (*Memcpy)(void *, const void *, size_t, int);
    int (*StreamCreateWithFlags)(void **, unsigned);
    int (*StreamSynchronize)(void *);
    int (*StreamDestroy)(void *);
    int (*DeviceSynchronize)(void);
} t_dev_cuda_t;

typedef struct { unsigned char *host, *dev; size_t bytes; } t_dev_region_t;

static t_dev_cuda_t t_dev_cu;
static int t_dev_loaded;
static t_dev_region_t t_dev_regions[T_DEV_MAX_REGIONS];
static void *t_dev_stream;
static char t_dev_fake_dir[PATH_MAX];

/* Points the library at the fakes (absolute paths, from this binary's location: build/ or
 * build/san/), and requires NCCL (DDP_NCCL=1: a decline is an init failure, never a quiet
 * host run). In the parent, before any fork. 0 if the fakes are not built. */
static T_UNUSED int t_dev_real;   /* T_DEVICE_REAL=1 (make test-gpu): the real NCCL and GPUs */
static T_UNUSED int t_dev_use_fakes(void) {
    char exe[PATH_MAX], lib[PATH_MAX + 64];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    const char *sub[2] = { "/fake_nccl", "/../fake_nccl" };
    const char *real = getenv("T_DEVICE_REAL");
    int i;
    if (real && !strcmp(real, "1")) {
        t_dev_real = 1;
        setenv("DDP_NCCL", "1", 1);   /* the libraries: DDP_*_LIBRARY, else the library's search */
        return 1;
    }
    if (n <= 0) return 0;
    exe[n] = 0;
    for (i = 0; i < 2; i++) {
        char *d = dirname(exe);
        snprintf(lib, sizeof lib, "%s%s/libnccl.so.2", d, sub[i]);
        if (access(lib, R_OK) == 0) {
            snprintf(t_dev_fake_dir, sizeof t_dev_fake_dir, "%s%s", d, sub[i]);
            setenv("DDP_NCCL_LIBRARY", lib, 1);
            snprintf(lib, sizeof lib, "%s/libcudart.so.13", t_dev_fake_dir);
            setenv("DDP_CUDART_LIBRARY", lib, 1);
            setenv("DDP_NCCL", "1", 1);
            return 1;
        }
        n = readlink("/proc/self/exe", exe, sizeof exe - 1);
        exe[n] = 0;
    }
    return 0;
}

static T_UNUSED void t_dev_load(void) {
    void *h;
    const char *lib = getenv("DDP_CUDART_LIBRARY");
    if (t_dev_loaded) return;
    /* the runtime the library loaded (a second copy would be a second CUDA context) */
    h = lib && lib[0] ? dlopen(lib, RTLD_NOW | RTLD_LOCAL) : NULL;
    if (!h && !(lib && lib[0])) h = dlopen("libcudart.so.13", RTLD_NOW | RTLD_LOCAL);
    if (!h && !(lib && lib[0])) h = dlopen("libcudart.so.12", RTLD_NOW | RTLD_LOCAL);
    if (!h) { fprintf(stderr, "ddp_test_device: %s (set DDP_CUDART_LIBRARY)\n", dlerror()); exit(70); }
#define T_DEV_SYM(f, name) do { void *s_ = dlsym(h, name); if (!s_) { fprintf(stderr, "ddp_test_device: no %s\n", name); exit(70); } memcpy(&t_dev_cu.f, &s_, sizeof s_); } while (0)
    T_DEV_SYM(Malloc, "cudaMalloc");
    T_DEV_SYM(Free, "cudaFree");
    T_DEV_SYM(Memcpy, "cudaMemcpy");
    T_DEV_SYM(StreamCreateWithFlags, "cudaStreamCreateWithFlags");
    T_DEV_SYM(StreamSynchronize, "cudaStreamSynchronize");
    T_DEV_SYM(StreamDestroy, "cudaStreamDestroy");
    T_DEV_SYM(DeviceSynchronize, "cudaDeviceSynchronize");
#undef T_DEV_SYM
    t_dev_loaded = 1;
}

static T_UNUSED void *t_dev_malloc(size_t n) {
    unsigned char *h = (unsigned char *)malloc(n);
    void *d = NULL;
    int i;
    if (!h) return NULL;
    t_dev_load();
    if (t_dev_cu.Malloc(&d, n ? n : 1) != 0) { fprintf(stderr, "ddp_test_device: cudaMalloc(%zu) failed\n", n); exit(70); }
    for (i = 0; i < T_DEV_MAX_REGIONS; i++)
        if (!t_dev_regions[i].host) { t_dev_regions[i].host = h; t_dev_regions[i].dev = (unsigned char *)d; t_dev_regions[i].bytes = n; return h; }
    fprintf(stderr, "ddp_test_device: more than %d regions\n", T_DEV_MAX_REGIONS);
    exit(70);
}

static T_UNUSED void *t_dev_calloc(size_t k, size_t n) {
    void *p = t_dev_malloc(k * n);
    if (p) memset(p, 0, k * n);
    return p;
}

static T_UNUSED void t_dev_free(void *p) {
    int i;
    if (!p) return;
    for (i = 0; i < T_DEV_MAX_REGIONS; i++)
        if (t_dev_regions[i].host == p) { t_dev_cu.Free(t_dev_regions[i].dev); t_dev_regions[i].host = NULL; break; }
    free(p);
}

static T_UNUSED t_dev_region_t *t_dev_find(const void *p) {
    int i;
    for (i = 0; p && i < T_DEV_MAX_REGIONS; i++) {
        t_dev_region_t *r = &t_dev_regions[i];
        if (r->host && (const unsigned char *)p >= r->host && (const unsigned char *)p <= r->host + r->bytes) return r;
    }
    return NULL;
}

/* The device twin of a host pointer (NULL stays NULL; a pointer outside every twinned region
 * is a test bug). */
static T_UNUSED void *t_dev_dev(const void *p) {
    t_dev_region_t *r;
    if (!p) return NULL;
    if (!(r = t_dev_find(p))) { fprintf(stderr, "ddp_test_device: %p is not in a twinned region\n", p); exit(70); }
    return r->dev + ((const unsigned char *)p - r->host);
}

/* Copies [p - guard, p + bytes + guard) (within its region) one way. */
static T_UNUSED void t_dev_copy(const void *p, size_t bytes, int dir) {
    t_dev_region_t *r = t_dev_find(p);
    size_t lo, hi, off;
    if (!p || !r) return;
    off = (size_t)((const unsigned char *)p - r->host);
    lo = off > T_DEV_GUARD ? off - T_DEV_GUARD : 0;
    hi = off + bytes + T_DEV_GUARD < r->bytes ? off + bytes + T_DEV_GUARD : r->bytes;
    if (hi <= lo) return;
    if (dir == T_DEV_H2D) {
        /* From pageable memory cudaMemcpy may return once the data is staged, before it lands
         * (CUDA runtime API, "API synchronization behavior"); the call that follows runs on a
         * non-blocking stream, which does not wait for the legacy stream: wait here. */
        t_dev_cu.Memcpy(r->dev + lo, r->host + lo, hi - lo, T_DEV_H2D);
        t_dev_cu.DeviceSynchronize();
    } else {
        t_dev_cu.Memcpy(r->host + lo, r->dev + lo, hi - lo, T_DEV_D2H);
    }
}

/* After a device call: wait for the communicator's stream (the one synchronisation a user of
 * NCCL semantics must make), then copy back. */
static T_UNUSED void t_dev_after(const void *s, size_t sb, const void *r, size_t rb) {
    const char *skip = getenv("T_DEVICE_SKIP_SYNC");
    if (!(skip && !strcmp(skip, "1"))) t_dev_cu.StreamSynchronize(t_dev_stream);
    t_dev_copy(s, sb, T_DEV_D2H);
    t_dev_copy(r, rb, T_DEV_D2H);
}

static T_UNUSED ddp_result_t t_dev_comm_init(ddp_comm_t **comm, int nranks, int rank, const ddp_comm_desc_t *d) {
    ddp_result_t r;
    const char *hostid = getenv("T_DEVICE_HOSTID");
    if (t_dev_real && hostid && hostid[0]) {   /* several ranks on one GPU: see tests/gpu/test_gpu.sh */
        char v[128];
        snprintf(v, sizeof v, "%s-rank%d", hostid, rank);
        setenv("NCCL_HOSTID", v, 1);
    }
    r = (ddp_comm_init)(comm, nranks, rank, d);
    if (r != DDP_SUCCESS) return r;
    t_dev_load();
    if (!t_dev_stream && t_dev_cu.StreamCreateWithFlags(&t_dev_stream, 1 /* cudaStreamNonBlocking */) != 0) {
        fprintf(stderr, "ddp_test_device: cudaStreamCreateWithFlags failed\n");
        exit(70);
    }
    /* a communicator that declined NCCL (a test of that) keeps the default stream */
    return ddp_comm_device_enabled(*comm, NULL, 0) ? ddp_comm_set_cuda_stream(*comm, t_dev_stream) : DDP_SUCCESS;
}

#define T_DEV_WRAP2(call, sb, rb)                                                      \
    do {                                                                           \
        ddp_result_t r_;                                                           \
        t_dev_copy(sendbuf, (sb), T_DEV_H2D);                                            \
        t_dev_copy(recvbuf, (rb), T_DEV_H2D);                                            \
        r_ = call;                                                                 \
        if (r_ == DDP_SUCCESS) t_dev_after(sendbuf, (sb), recvbuf, (rb));             \
        return r_;                                                                 \
    } while (0)

static T_UNUSED ddp_result_t t_dev_all_reduce(const void *sendbuf, void *recvbuf, size_t count, ddp_dtype_t dt,
                                           ddp_op_t op, ddp_comm_t *c) {
    size_t b = count * ddp_dtype_size(dt);
    T_DEV_WRAP2((ddp_all_reduce)(t_dev_dev(sendbuf), t_dev_dev(recvbuf), count, dt, op, c), b, b);
}
static T_UNUSED ddp_result_t t_dev_reduce_scatter(const void *sendbuf, void *recvbuf, size_t count, ddp_dtype_t dt,
                                               ddp_op_t op, ddp_comm_t *c) {
    size_t b = count * ddp_dtype_size(dt), p = (size_t)ddp_comm_size(c);
    T_DEV_WRAP2((ddp_reduce_scatter)(t_dev_dev(sendbuf), t_dev_dev(recvbuf), count, dt, op, c), p * b, b);
}
static T_UNUSED ddp_result_t t_dev_all_gather(const void *sendbuf, void *recvbuf, size_t count, ddp_dtype_t dt,
                                           ddp_comm_t *c) {
    size_t b = count * ddp_dtype_size(dt), p = (size_t)ddp_comm_size(c);
    T_DEV_WRAP2((ddp_all_gather)(t_dev_dev(sendbuf), t_dev_dev(recvbuf), count, dt, c), b, p * b);
}
static T_UNUSED ddp_result_t t_dev_broadcast(const void *sendbuf, void *recvbuf, size_t count, ddp_dtype_t dt,
                                          int root, ddp_comm_t *c) {
    size_t b = count * ddp_dtype_size(dt);
    T_DEV_WRAP2((ddp_broadcast)(t_dev_dev(sendbuf), t_dev_dev(recvbuf), count, dt, root, c), b, b);
}
static T_UNUSED ddp_result_t t_dev_reduce(const void *sendbuf, void *recvbuf, size_t count, ddp_dtype_t dt,
                                       ddp_op_t op, int root, ddp_comm_t *c) {
    size_t b = count * ddp_dtype_size(dt);
    T_DEV_WRAP2((ddp_reduce)(t_dev_dev(sendbuf), t_dev_dev(recvbuf), count, dt, op, root, c), b, b);
}
static T_UNUSED ddp_result_t t_dev_gather(const void *sendbuf, void *recvbuf, size_t count, ddp_dtype_t dt,
                                       int root, ddp_comm_t *c) {
    size_t b = count * ddp_dtype_size(dt), p = (size_t)ddp_comm_size(c);
    T_DEV_WRAP2((ddp_gather)(t_dev_dev(sendbuf), t_dev_dev(recvbuf), count, dt, root, c), b, p * b);
}
static T_UNUSED ddp_result_t t_dev_scatter(const void *sendbuf, void *recvbuf, size_t count, ddp_dtype_t dt,
                                        int root, ddp_comm_t *c) {
    size_t b = count * ddp_dtype_size(dt), p = (size_t)ddp_comm_size(c);
    T_DEV_WRAP2((ddp_scatter)(t_dev_dev(sendbuf), t_dev_dev(recvbuf), count, dt, root, c), p * b, b);
}
static T_UNUSED ddp_result_t t_dev_all_to_all(const void *sendbuf, void *recvbuf, size_t count, ddp_dtype_t dt,
                                           ddp_comm_t *c) {
    size_t b = count * ddp_dtype_size(dt), p = (size_t)ddp_comm_size(c);
    T_DEV_WRAP2((ddp_all_to_all)(t_dev_dev(sendbuf), t_dev_dev(recvbuf), count, dt, c), p * b, p * b);
}

#endif /* DDP_TEST_DEVICE_H */
