/* SPDX-License-Identifier: MIT (see LICENSE) */
/* tests/fake_nccl/fake_cuda.h — the private interface between the fake CUDA runtime
 * (fake_cudart.c, built as libcudart.so.13) and the fake NCCL (fake_nccl.c, libnccl.so.2).
 *
 * Neither fake includes a CUDA header: this file declares, with plain C types, the few CUDA
 * runtime calls the fake NCCL makes, and the fake_cuda_* extensions that only the fake runtime
 * exports. Handles (cudaStream_t, cudaEvent_t) are `void *`; cudaError_t is `int`.
 *
 * The model (details at the top of fake_cudart.c):
 *   - device memory is handed out at a PROT_NONE address; the fake's own code reaches the bytes
 *     through a second, read-write mapping of the same pages, the "shadow" (fake_cuda_shadow);
 *   - every stream is a worker thread that runs enqueued work later, in order
 *     (fake_cuda_enqueue); the fake NCCL runs each collective that way.
 *
 * The selftest uses fake_cuda_enqueue too, to hold a stream at a "gate" and so check ordering
 * without depending on timing.
 */
#ifndef FAKE_CUDA_H_INCLUDED
#define FAKE_CUDA_H_INCLUDED

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__) || defined(__clang__)
#define FAKE_EXPORT __attribute__((visibility("default")))
#else
#define FAKE_EXPORT
#endif

/* cudaError_t values the fakes use (driver_types.h, CUDA 13). */
enum {
    FAKE_cudaSuccess = 0,
    FAKE_cudaErrorInvalidValue = 1,
    FAKE_cudaErrorMemoryAllocation = 2,
    FAKE_cudaErrorInvalidDevicePointer = 17,
    FAKE_cudaErrorInvalidMemcpyDirection = 21,
    FAKE_cudaErrorNoDevice = 100,
    FAKE_cudaErrorInvalidDevice = 101,
    FAKE_cudaErrorInvalidResourceHandle = 400,
    FAKE_cudaErrorNotReady = 600
};

/* ---- fake_cuda_* extensions (exported by the fake libcudart.so.13 only) ---------------------- */

/* Queue fn(arg) on `stream` (NULL, cudaStreamLegacy and cudaStreamPerThread mean the legacy
 * default stream of the calling thread's current device). It runs later on the stream's worker
 * thread, after everything enqueued on the stream before it, with the legacy default stream's
 * implicit ordering, and after FAKE_CUDA_STREAM_DELAY_US. fn may block (a collective waiting for
 * its peers): the stream then stalls, as a GPU stream does behind a waiting kernel.
 * Returns a cudaError_t (cudaErrorInvalidResourceHandle for a stream that is not alive). */
FAKE_EXPORT int fake_cuda_enqueue(void *stream, void (*fn)(void *arg), void *arg);

/* 0 when `stream` names a live stream (or the legacy default stream), else a cudaError_t. */
FAKE_EXPORT int fake_cuda_stream_check(void *stream);

/* The read-write shadow address for the device range [ptr, ptr + bytes), or NULL when that range
 * does not lie inside one live allocation (host memory, freed memory, a range that runs past the
 * end). bytes == 0 asks only about ptr itself. The shadow stays valid until cudaFree of that
 * allocation (which first waits for the device's streams, as CUDA's does). */
FAKE_EXPORT void *fake_cuda_shadow(const void *ptr, size_t bytes);

/* Wait until every stream of every device has run all the work enqueued before this call.
 * The fake NCCL calls it when it is unloaded, after aborting its communicators, so that no
 * worker thread can still be inside (or later enter) the fake NCCL's code once it is unmapped. */
FAKE_EXPORT void fake_cuda_quiesce(void);

/* ---- CUDA runtime calls the fake NCCL makes (CUDA 13 signatures, plain C types) ----------- */
int cudaGetDevice(int *device);
int cudaMalloc(void **devPtr, size_t size);
int cudaFree(void *devPtr);
int cudaEventCreateWithFlags(void **event, unsigned int flags);
int cudaEventRecord(void *event, void *stream);
int cudaEventDestroy(void *event);
int cudaStreamWaitEvent(void *stream, void *event, unsigned int flags);

#ifdef __cplusplus
}
#endif
#endif /* FAKE_CUDA_H_INCLUDED */
