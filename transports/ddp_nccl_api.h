/* SPDX-License-Identifier: MIT (see LICENSE) */
/* transports/ddp_nccl_api.h — finding and binding NCCL and the CUDA runtime: the one function
 * table the NCCL transport (transports/ddp_nccl.h) calls them through. Private: users include
 * ddp_nccl.h, which includes this.
 *
 * Loaded (the default): dlopen at first use, searching DDP_NCCL_LIBRARY / DDP_CUDART_LIBRARY,
 * the loader's path, CUDA_HOME's and /usr/local/cuda's lib64, CONDA_PREFIX/lib and the active
 * virtualenv's nvidia wheels; the types are spelled with plain C types of the same ABI, so no
 * CUDA header is needed. Linked (DDP_NCCL_LINK): the real headers and symbols. Either way the
 * table says why NCCL cannot be used (none, too old, a symbol missing) instead of failing.
 * Depends on ddp_base.h. Built by DDP_IMPLEMENTATION (or DDP_NCCL_API_IMPLEMENTATION).
 */
#if defined(DDP_IMPLEMENTATION) && !defined(DDP_NCCL_API_IMPLEMENTATION)
#define DDP_NCCL_API_IMPLEMENTATION
#endif
#if defined(DDP_NCCL_API_IMPLEMENTATION) && !defined(DDP_BASE_IMPLEMENTATION)
#define DDP_BASE_IMPLEMENTATION
#endif
#include "../ddp_base.h"

#if defined(DDP_NCCL_API_IMPLEMENTATION) && !defined(DDP_NCCL_API_IMPL_INCLUDED)
#define DDP_NCCL_API_IMPL_INCLUDED
#ifndef DDP_BASE_IMPL_INCLUDED
#error "libddp: transports/ddp_nccl_api.h's implementation needs ddp_base.h's (define DDP_IMPLEMENTATION)"
#endif
#include <dlfcn.h>
#include <glob.h>

/* ---------------------------------------------------------------- the NCCL/CUDA types
 * Linked: the real headers. Loaded: the same ABI spelled with plain C types (enums are
 * int-sized; handles are pointers), so that ddp.h users need no CUDA headers. Layouts from
 * nccl.h (2.19's ncclConfig_t: the version field tells NCCL which fields follow) and CUDA's
 * driver_types.h (cudaPointerAttributes). */
#ifdef DDP_NCCL_LINK
#if defined(__GNUC__) || defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpedantic"   /* CUDA's headers use anonymous unions */
#endif
#include <nccl.h>
#include <cuda_runtime_api.h>
#if defined(__GNUC__) || defined(__clang__)
#pragma GCC diagnostic pop
#endif
typedef ncclResult_t _ddp_nres_t;
typedef ncclDataType_t _ddp_ndtype_t;
typedef ncclRedOp_t _ddp_nop_t;
typedef ncclComm_t _ddp_ncomm_t;
typedef ncclUniqueId _ddp_nid_t;
typedef ncclConfig_t _ddp_nconfig_t;
typedef cudaError_t _ddp_cerr_t;
typedef cudaStream_t _ddp_cstream_t;
typedef cudaEvent_t _ddp_cevent_t;
typedef struct cudaPointerAttributes _ddp_cattr_t;
typedef enum cudaMemcpyKind _ddp_ckind_t;
#define _DDP_NCCL_CONFIG_INIT(cfg) do { ncclConfig_t _i = NCCL_CONFIG_INITIALIZER; (cfg) = _i; } while (0)
#else
typedef int _ddp_nres_t;
typedef int _ddp_ndtype_t;
typedef int _ddp_nop_t;
typedef struct _ddp_ncomm *_ddp_ncomm_t;
typedef struct { char internal[128]; } _ddp_nid_t;
typedef struct {
    size_t size;
    unsigned int magic, version;
    int blocking, cgaClusterSize, minCTAs, maxCTAs;
    const char *netName;
    int splitShare;
} _ddp_nconfig_t;
typedef int _ddp_cerr_t;
typedef struct _ddp_cstream *_ddp_cstream_t;
typedef struct _ddp_cevent *_ddp_cevent_t;
typedef struct {
    int type, device;
    void *devicePointer, *hostPointer;
    long reserved[8];
} _ddp_cattr_t;
typedef int _ddp_ckind_t;
#define _DDP_NCCL_CONFIG_INIT(cfg) do {                                                     \
        memset(&(cfg), 0, sizeof(cfg));                                                     \
        (cfg).size = sizeof(cfg); (cfg).magic = 0xcafebeefu; (cfg).version = 21900u;        \
        (cfg).blocking = (cfg).cgaClusterSize = (cfg).minCTAs = (cfg).maxCTAs = INT_MIN;    \
        (cfg).splitShare = INT_MIN;                                                          \
    } while (0)
#endif
#define _DDP_NCCL_IN_PROGRESS ((_ddp_nres_t)7)   /* ncclInProgress */
#define _DDP_NRES(v) ((_ddp_nres_t)(v))
#define _DDP_CUDA_NOT_READY 600          /* cudaErrorNotReady */
#define _DDP_CUDA_MEM_DEVICE 2           /* cudaMemoryTypeDevice */
#define _DDP_CUDA_MEM_MANAGED 3
#define _DDP_CUDA_COPY_DEFAULT 4         /* cudaMemcpyDefault: direction from the pointers */
#define _DDP_CUDA_EVENT_NO_TIMING 2      /* cudaEventDisableTiming */
#define _DDP_NCCL_MIN_VERSION 21900      /* 2.19.0 */
#define _DDP_NCCL_SPLIT_NOCOLOR (-1)

/* ---------------------------------------------------------------- the function table
 * One per process, filled once (loaded or linked) and read-only afterwards. */
typedef struct {
    int loaded;                  /* 1 ok, -1 failed (why says why) */
    int cuda_ok;                 /* the CUDA runtime is bound: pointers can be classified even
                                  * when NCCL is missing or too old */
    char why[1024];
    char nccl_path[256], cudart_path[256];
    int version, runtime_version;
    _ddp_nres_t (*GetVersion)(int *);
    _ddp_nres_t (*GetUniqueId)(_ddp_nid_t *);
    _ddp_nres_t (*CommInitRankConfig)(_ddp_ncomm_t *, int, _ddp_nid_t, int, _ddp_nconfig_t *);
    _ddp_nres_t (*CommSplit)(_ddp_ncomm_t, int, int, _ddp_ncomm_t *, _ddp_nconfig_t *);
    _ddp_nres_t (*CommGetAsyncError)(_ddp_ncomm_t, _ddp_nres_t *);
    _ddp_nres_t (*CommAbort)(_ddp_ncomm_t);
    _ddp_nres_t (*CommFinalize)(_ddp_ncomm_t);
    _ddp_nres_t (*CommDestroy)(_ddp_ncomm_t);
    const char *(*NcclErrorString)(_ddp_nres_t);
    const char *(*NcclLastError)(_ddp_ncomm_t);
    _ddp_nres_t (*AllReduce)(const void *, void *, size_t, _ddp_ndtype_t, _ddp_nop_t, _ddp_ncomm_t, _ddp_cstream_t);
    _ddp_nres_t (*ReduceScatter)(const void *, void *, size_t, _ddp_ndtype_t, _ddp_nop_t, _ddp_ncomm_t, _ddp_cstream_t);
    _ddp_nres_t (*AllGather)(const void *, void *, size_t, _ddp_ndtype_t, _ddp_ncomm_t, _ddp_cstream_t);
    _ddp_nres_t (*Broadcast)(const void *, void *, size_t, _ddp_ndtype_t, int, _ddp_ncomm_t, _ddp_cstream_t);
    _ddp_nres_t (*Reduce)(const void *, void *, size_t, _ddp_ndtype_t, _ddp_nop_t, int, _ddp_ncomm_t, _ddp_cstream_t);
    _ddp_nres_t (*Send)(const void *, size_t, _ddp_ndtype_t, int, _ddp_ncomm_t, _ddp_cstream_t);
    _ddp_nres_t (*Recv)(void *, size_t, _ddp_ndtype_t, int, _ddp_ncomm_t, _ddp_cstream_t);
    _ddp_nres_t (*GroupStart)(void);
    _ddp_nres_t (*GroupEnd)(void);
    /* NCCL >= 2.28; NULL before: grouped send/recv instead */
    _ddp_nres_t (*AlltoAll)(const void *, void *, size_t, _ddp_ndtype_t, _ddp_ncomm_t, _ddp_cstream_t);
    _ddp_nres_t (*Gather)(const void *, void *, size_t, _ddp_ndtype_t, int, _ddp_ncomm_t, _ddp_cstream_t);
    _ddp_nres_t (*Scatter)(const void *, void *, size_t, _ddp_ndtype_t, int, _ddp_ncomm_t, _ddp_cstream_t);
    /* CUDA runtime */
    _ddp_cerr_t (*GetDeviceCount)(int *);
    _ddp_cerr_t (*SetDevice)(int);
    _ddp_cerr_t (*PointerGetAttributes)(_ddp_cattr_t *, const void *);
    _ddp_cerr_t (*Malloc)(void **, size_t);
    _ddp_cerr_t (*Free)(void *);
    _ddp_cerr_t (*MemcpyAsync)(void *, const void *, size_t, _ddp_ckind_t, _ddp_cstream_t);
    _ddp_cerr_t (*MemsetAsync)(void *, int, size_t, _ddp_cstream_t);
    _ddp_cerr_t (*EventCreateWithFlags)(_ddp_cevent_t *, unsigned int);
    _ddp_cerr_t (*EventRecord)(_ddp_cevent_t, _ddp_cstream_t);
    _ddp_cerr_t (*EventQuery)(_ddp_cevent_t);
    _ddp_cerr_t (*EventDestroy)(_ddp_cevent_t);
    _ddp_cerr_t (*CudaLastError)(void);
    const char *(*CudaErrorString)(_ddp_cerr_t);
    _ddp_cerr_t (*RuntimeGetVersion)(int *);
} _ddp_nccl_api_t;

static _ddp_nccl_api_t _ddp_nccl_api;
static pthread_mutex_t _ddp_nccl_api_mu = PTHREAD_MUTEX_INITIALIZER;

#ifdef DDP_NCCL_LINK
_DDP_PRIVATE void _ddp_nccl_bind(_ddp_nccl_api_t *a) {
    a->GetVersion = ncclGetVersion; a->GetUniqueId = ncclGetUniqueId;
    a->CommInitRankConfig = ncclCommInitRankConfig; a->CommSplit = ncclCommSplit;
    a->CommGetAsyncError = ncclCommGetAsyncError; a->CommAbort = ncclCommAbort;
    a->CommFinalize = ncclCommFinalize; a->CommDestroy = ncclCommDestroy;
    a->NcclErrorString = ncclGetErrorString; a->NcclLastError = ncclGetLastError;
    a->AllReduce = ncclAllReduce; a->ReduceScatter = ncclReduceScatter; a->AllGather = ncclAllGather;
    a->Broadcast = ncclBroadcast; a->Reduce = ncclReduce; a->Send = ncclSend; a->Recv = ncclRecv;
    a->GroupStart = ncclGroupStart; a->GroupEnd = ncclGroupEnd;
#if NCCL_VERSION_CODE >= 22800
    a->AlltoAll = ncclAlltoAll; a->Gather = ncclGather; a->Scatter = ncclScatter;
#endif
    a->GetDeviceCount = cudaGetDeviceCount; a->SetDevice = cudaSetDevice;
    a->PointerGetAttributes = cudaPointerGetAttributes; a->Malloc = cudaMalloc; a->Free = cudaFree;
    a->MemcpyAsync = cudaMemcpyAsync; a->MemsetAsync = cudaMemsetAsync;
    a->EventCreateWithFlags = cudaEventCreateWithFlags; a->EventRecord = cudaEventRecord;
    a->EventQuery = cudaEventQuery; a->EventDestroy = cudaEventDestroy;
    a->CudaLastError = cudaGetLastError; a->CudaErrorString = cudaGetErrorString;
    a->RuntimeGetVersion = cudaRuntimeGetVersion;
    a->cuda_ok = 1;
    snprintf(a->nccl_path, sizeof a->nccl_path, "linked (DDP_NCCL_LINK)");
    snprintf(a->cudart_path, sizeof a->cudart_path, "linked (DDP_NCCL_LINK)");
}
#else
/* The first of the candidates that loads: env override alone, else the sonames (the loader's
 * search path), else CUDA_HOME's and /usr/local/cuda's lib64, else the active Python
 * environment's wheels (VIRTUAL_ENV: site-packages/nvidia/<pkg>/lib, where PyTorch's NCCL and
 * CUDA runtime live) and CONDA_PREFIX/lib. */
_DDP_PRIVATE void *_ddp_nccl_dlopen(const char *env, const char *const *names, char *used,
                                    size_t cap, char *err, size_t ecap) {
    static const char *const wheels[] = { "nccl", "cu13", "cuda_runtime", "cu12" };
    const char *forced = getenv(env), *home = getenv("CUDA_HOME");
    const char *venv = getenv("VIRTUAL_ENV"), *conda = getenv("CONDA_PREFIX");
    const char *dirs[2];
    void *h;
    int i, k;
    err[0] = 0;
    if (forced && forced[0]) {
        h = dlopen(forced, RTLD_NOW | RTLD_LOCAL);
        if (!h) snprintf(err, ecap, "%s=%s: %s", env, forced, dlerror());
        else _ddp_strlcpy(used, forced, cap);
        return h;
    }
    for (i = 0; names[i]; i++) {
        if ((h = dlopen(names[i], RTLD_NOW | RTLD_LOCAL)) != NULL) { _ddp_strlcpy(used, names[i], cap); return h; }
        if (!err[0]) snprintf(err, ecap, "%s", dlerror());
    }
    dirs[0] = home && home[0] ? home : NULL;
    dirs[1] = "/usr/local/cuda";
    for (k = 0; k < 2; k++) {
        char path[512];
        if (!dirs[k]) continue;
        for (i = 0; names[i]; i++) {
            snprintf(path, sizeof path, "%s/lib64/%s", dirs[k], names[i]);
            if ((h = dlopen(path, RTLD_NOW | RTLD_LOCAL)) != NULL) { _ddp_strlcpy(used, path, cap); return h; }
        }
    }
    for (i = 0; conda && conda[0] && names[i]; i++) {
        char path[512];
        snprintf(path, sizeof path, "%s/lib/%s", conda, names[i]);
        if ((h = dlopen(path, RTLD_NOW | RTLD_LOCAL)) != NULL) { _ddp_strlcpy(used, path, cap); return h; }
    }
    for (k = 0; venv && venv[0] && k < (int)(sizeof wheels / sizeof wheels[0]); k++) {
        char pattern[512];
        glob_t g;
        size_t j;
        snprintf(pattern, sizeof pattern, "%s/lib/python3*/site-packages/nvidia/%s/lib", venv, wheels[k]);
        if (glob(pattern, 0, NULL, &g) != 0) continue;
        for (j = 0; j < g.gl_pathc; j++)
            for (i = 0; names[i]; i++) {
                char path[768];
                snprintf(path, sizeof path, "%s/%s", g.gl_pathv[j], names[i]);
                if ((h = dlopen(path, RTLD_NOW | RTLD_LOCAL)) != NULL) {
                    _ddp_strlcpy(used, path, cap);
                    globfree(&g);
                    return h;
                }
            }
        globfree(&g);
    }
    return NULL;
}

/* dlsym into a function pointer without the object/function pointer cast (ISO C forbids it). */
#define _DDP_NCCL_SYM(h, a, field, name, required)                                          \
    do {                                                                                   \
        void *_s = dlsym((h), (name));                                                     \
        memcpy(&(a)->field, &_s, sizeof _s);                                               \
        if (!_s && (required)) { missing = (name); }                                       \
    } while (0)

_DDP_PRIVATE void _ddp_nccl_bind(_ddp_nccl_api_t *a) {
    static const char *const nccl_names[] = { "libnccl.so.2", "libnccl.so", NULL };
    static const char *const cudart_names[] = { "libcudart.so.13", "libcudart.so.12", "libcudart.so", NULL };
    char err[256];
    const char *missing = NULL;
    void *cu, *nc;
    /* The runtime first: NCCL needs it loaded, and a machine without CUDA stops here. */
    cu = _ddp_nccl_dlopen("DDP_CUDART_LIBRARY", cudart_names, a->cudart_path, sizeof a->cudart_path,
                          err, sizeof err);
    if (!cu) { snprintf(a->why, sizeof a->why, "no CUDA runtime (%s)", err); a->loaded = -1; return; }
    _DDP_NCCL_SYM(cu, a, GetDeviceCount, "cudaGetDeviceCount", 1);
    _DDP_NCCL_SYM(cu, a, SetDevice, "cudaSetDevice", 1);
    _DDP_NCCL_SYM(cu, a, PointerGetAttributes, "cudaPointerGetAttributes", 1);
    _DDP_NCCL_SYM(cu, a, Malloc, "cudaMalloc", 1);
    _DDP_NCCL_SYM(cu, a, Free, "cudaFree", 1);
    _DDP_NCCL_SYM(cu, a, MemcpyAsync, "cudaMemcpyAsync", 1);
    _DDP_NCCL_SYM(cu, a, MemsetAsync, "cudaMemsetAsync", 1);
    _DDP_NCCL_SYM(cu, a, EventCreateWithFlags, "cudaEventCreateWithFlags", 1);
    _DDP_NCCL_SYM(cu, a, EventRecord, "cudaEventRecord", 1);
    _DDP_NCCL_SYM(cu, a, EventQuery, "cudaEventQuery", 1);
    _DDP_NCCL_SYM(cu, a, EventDestroy, "cudaEventDestroy", 1);
    _DDP_NCCL_SYM(cu, a, CudaLastError, "cudaGetLastError", 1);
    _DDP_NCCL_SYM(cu, a, CudaErrorString, "cudaGetErrorString", 1);
    _DDP_NCCL_SYM(cu, a, RuntimeGetVersion, "cudaRuntimeGetVersion", 0);
    if (missing) {
        snprintf(a->why, sizeof a->why, "%s lacks %s", a->cudart_path, missing);
        a->loaded = -1;
        return;
    }
    a->cuda_ok = 1;
    nc = _ddp_nccl_dlopen("DDP_NCCL_LIBRARY", nccl_names, a->nccl_path, sizeof a->nccl_path, err, sizeof err);
    if (!nc) { snprintf(a->why, sizeof a->why, "no NCCL library (%s)", err); a->loaded = -1; return; }
    _DDP_NCCL_SYM(nc, a, GetVersion, "ncclGetVersion", 1);
    _DDP_NCCL_SYM(nc, a, GetUniqueId, "ncclGetUniqueId", 1);
    _DDP_NCCL_SYM(nc, a, CommInitRankConfig, "ncclCommInitRankConfig", 1);
    _DDP_NCCL_SYM(nc, a, CommSplit, "ncclCommSplit", 1);
    _DDP_NCCL_SYM(nc, a, CommGetAsyncError, "ncclCommGetAsyncError", 1);
    _DDP_NCCL_SYM(nc, a, CommAbort, "ncclCommAbort", 1);
    _DDP_NCCL_SYM(nc, a, CommFinalize, "ncclCommFinalize", 1);
    _DDP_NCCL_SYM(nc, a, CommDestroy, "ncclCommDestroy", 1);
    _DDP_NCCL_SYM(nc, a, NcclErrorString, "ncclGetErrorString", 1);
    _DDP_NCCL_SYM(nc, a, NcclLastError, "ncclGetLastError", 0);
    _DDP_NCCL_SYM(nc, a, AllReduce, "ncclAllReduce", 1);
    _DDP_NCCL_SYM(nc, a, ReduceScatter, "ncclReduceScatter", 1);
    _DDP_NCCL_SYM(nc, a, AllGather, "ncclAllGather", 1);
    _DDP_NCCL_SYM(nc, a, Broadcast, "ncclBroadcast", 1);
    _DDP_NCCL_SYM(nc, a, Reduce, "ncclReduce", 1);
    _DDP_NCCL_SYM(nc, a, Send, "ncclSend", 1);
    _DDP_NCCL_SYM(nc, a, Recv, "ncclRecv", 1);
    _DDP_NCCL_SYM(nc, a, GroupStart, "ncclGroupStart", 1);
    _DDP_NCCL_SYM(nc, a, GroupEnd, "ncclGroupEnd", 1);
    _DDP_NCCL_SYM(nc, a, AlltoAll, "ncclAlltoAll", 0);
    _DDP_NCCL_SYM(nc, a, Gather, "ncclGather", 0);
    _DDP_NCCL_SYM(nc, a, Scatter, "ncclScatter", 0);
    if (missing) {
        snprintf(a->why, sizeof a->why, "%s lacks %s", a->nccl_path, missing);
        a->loaded = -1;
    }
}
#undef _DDP_NCCL_SYM
#endif

/* The table, loaded on first use (any thread). NULL when not even the CUDA runtime is there;
 * else the table, with why filled when NCCL itself is unusable (pointers can still be told
 * apart, so a device buffer gets a clear error instead of a host dereference). */
_DDP_PRIVATE const _ddp_nccl_api_t *_ddp_nccl_load(char *why, size_t cap) {
    _ddp_nccl_api_t *a = &_ddp_nccl_api;
    pthread_mutex_lock(&_ddp_nccl_api_mu);
    if (a->loaded == 0) {
        _ddp_nccl_bind(a);
        if (a->loaded == 0 && a->GetVersion(&a->version) != 0) {
            snprintf(a->why, sizeof a->why, "ncclGetVersion failed");
            a->loaded = -1;
        }
        if (a->loaded == 0 && a->version < _DDP_NCCL_MIN_VERSION) {
            snprintf(a->why, sizeof a->why, "NCCL %d.%d.%d (%s) is older than the 2.19.0 libddp needs",
                     a->version / 10000, a->version / 100 % 100, a->version % 100, a->nccl_path);
            a->loaded = -1;
        }
        if (a->loaded == 0 && a->RuntimeGetVersion) a->RuntimeGetVersion(&a->runtime_version);
        if (a->loaded == 0) a->loaded = 1;
    }
    pthread_mutex_unlock(&_ddp_nccl_api_mu);
    if (a->loaded < 0) _ddp_strlcpy(why, a->why, cap);
    return a->cuda_ok ? a : NULL;
}

#endif /* DDP_NCCL_API_IMPLEMENTATION */
