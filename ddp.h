/* SPDX-License-Identifier: MIT (see LICENSE) */
/* ddp.h — libddp: data-parallel collectives for C training code.           v0.2
 *
 * What torch.distributed + DistributedDataParallel give PyTorch, as a header-only C library:
 * several processes (ranks) each hold a model replica and their own data shard; libddp averages
 * their gradients with ring all-reduce over a pluggable transport (TCP sockets by default).
 *
 * DO THIS in exactly one .c file of your program:
 *
 *     #define DDP_IMPLEMENTATION
 *     #include "ddp.h"
 *     #include "transports/ddp_tcp.h"     // including a transport is what compiles it in
 *
 * and link with -pthread. Every other file just does #include "ddp.h". No feature macro is
 * needed (no _GNU_SOURCE): your own #includes may come first, in C99/C11 (strict -std=c99 too)
 * or C++; ddp_base.h's FEATURE MACROS says how.
 *
 * BUILD OPTIONS (define before including; the one table for every libddp header)
 *   DDP_IMPLEMENTATION     impl. file only  compile the implementation of every libddp header
 *                                           included after it in this file (each header maps
 *                                           it to its own DDP_<NAME>_IMPLEMENTATION)
 *   DDP_STATIC             global           make every public function static (private copy)
 *   DDP_MALLOC/DDP_FREE    impl. file only  allocator; define both or neither
 *   DDP_ASSERT(c)          impl. file only  checks for programmer bugs only (default: assert)
 *
 * WHAT IS WHERE (each header includes what it needs; nothing includes a header that includes it
 * back; this one includes the whole library)
 *   ddp_base.h          result codes, dtypes, ops, DDP_API; private clocks, parsing, logging
 *   ddp_kernels.h       local reduction kernels, fp16/bf16 conversion           (base)
 *   ddp_socket.h        private socket helpers                                  (base)
 *   ddp_auth.h          private SHA-256, HMAC-SHA256, challenge-response proofs (base)
 *   ddp_store.h         the rendezvous key-value store, client and server      (socket, auth)
 *   transports/ddp_transport.h   the transport interface, its context, the registry (base)
 *   ddp_engine.h        the point-to-point engine the algorithms see            (base)
 *   ddp_algorithms.h    the algorithms, one family per header (ddp_ring.h, ddp_tree.h, ...),
 *                       their shared parts in ddp_algorithm.h                   (engine, kernels)
 *   ddp_comm.h          communicator, rendezvous, operation engine, collectives (all above)
 *   ddp_window.h        registered memory: ddp_comm_mem_alloc / _free           (comm)
 *   ddp_reducer.h       gradient bucket reducer, ddp_broadcast_params           (comm)
 *   ddp_powersgd.h      PowerSGD gradient compression, a reducer comm hook      (reducer)
 *   ddp_state.h         live state from peers: ddp_state_sync, ddp_state_digest (comm)
 *   ddp_sampler.h       DistributedSampler (stands alone, with ddp_base.h)
 *   transports/ddp_{tcp,shm,threads,ibverbs}.h   one transport each        (transport interface)
 *
 * RUN-TIME ENVIRONMENT (all optional; the desc struct wins over the environment)
 *   RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE MASTER_ADDR MASTER_PORT   (torchrun's names;
 *       also OMPI_COMM_WORLD_*, PMI_RANK/PMI_SIZE, SLURM_PROCID/SLURM_NTASKS/SLURM_LOCALID)
 *   DDP_TIMEOUT_MS      every blocking wait (default 600000 = 10 min, as torch.distributed)
 *   DDP_DEBUG           NONE | WARN (default: failures) | INFO (decisions) | TRACE, to stderr
 *   DDP_TRANSPORT       force a transport by name ("tcp", ...) instead of the best compiled in
 *   DDP_JOB_SECRET      shared secret; ranks that do not present it are refused at rendezvous
 *   DDP_SOCKET_IFNAME   NCCL syntax: "eth0", "eth,ib" (prefixes), "^docker" (exclude), "=eth0"
 *   DDP_SPIN_US         how long a waiting rank polls before it sleeps in the kernel
 *   DDP_SEGMENT_BYTES   pipeline segment of the ring algorithms
 *
 * EXAMPLE
 *     ddp_comm_t *comm;
 *     if (ddp_comm_init_env(&comm, NULL) != DDP_SUCCESS) { ... }   // under torchrun/ddprun/mpirun
 *     ddp_all_reduce(grad, grad, n, DDP_FLOAT32, DDP_AVG, comm);   // in place: send == recv
 *     ddp_comm_destroy(comm);
 *
 * RULES
 *   - Calls, counts and dtypes are NCCL's: (sendbuf, recvbuf, count, dtype, op, comm), counts in
 *     elements. In place by pointer equality: all-reduce/broadcast send == recv; all-gather
 *     send == recv + rank*sendcount*size; reduce-scatter recv == send + rank*recvcount*size.
 *   - DDP_AVG divides the sum by the world size once (integers: truncating division); fp16/bf16
 *     are reduced in fp32 and rounded to nearest even. Results are bitwise identical on every
 *     rank and deterministic run to run.
 *   - A communicator is used by one thread at a time. Several communicators may coexist.
 *   - Every blocking point times out (DDP_TIMEOUT_MS). A failed collective leaves the
 *     communicator in an error state: later calls return the same error; destroy it, or first
 *     ddp_comm_shrink it to go on with the ranks still there (ddp_comm_shrink.h).
 *   - Errors: every call returns ddp_result_t; ddp_comm_last_error() says which rank, which peer,
 *     which phase, errno and what was expected. The library never calls abort() or exit().
 */
#ifndef DDP_H_INCLUDED
#define DDP_H_INCLUDED
#endif
/* Outside any guard: each header guards its declarations and builds its implementation when
 * included with DDP_IMPLEMENTATION defined, even after an earlier declarations-only include. */
#include "ddp_comm.h"
#include "ddp_window.h"
#include "ddp_reducer.h"
#include "ddp_powersgd.h"
#include "ddp_state.h"
