/* SPDX-License-Identifier: MIT (see LICENSE) */
/* ddp_comm_types.h — the communicator's public types: ddp_comm_t, the desc that configures it
 * (zero = defaults), the async request and its hooks. Types only, so that every communicator
 * header can use them; ddp_comm.h declares the calls and documents them.
 *
 * Users include ddp.h (which includes ddp_comm.h, which includes this). Depends on ddp_base.h
 * and ddp_store.h.
 */
#include "ddp_base.h"
#include "ddp_store.h"

#ifndef DDP_COMM_TYPES_H_INCLUDED
#define DDP_COMM_TYPES_H_INCLUDED

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ddp_comm ddp_comm_t;

/* Zero-initialised = defaults. Values where 0 is legitimate (rank) are arguments, not fields. */
typedef struct ddp_comm_desc {
    const char *transport;        /* NULL/"auto": DDP_TRANSPORT, else the best compiled in */
    const char *master_addr;      /* NULL: MASTER_ADDR, else "127.0.0.1" */
    int master_port;              /* 0: MASTER_PORT, else 29500 */
    int timeout_ms;               /* 0: DDP_TIMEOUT_MS, else 600000; < 0 = wait forever */
    const char *job_secret;       /* NULL: DDP_JOB_SECRET, else no authentication */
    const char *socket_ifname;    /* NULL: DDP_SOCKET_IFNAME, else the route to the master */
    ddp_store_t *store;           /* use this store for rendezvous instead of MASTER_ADDR:PORT */
    const char *store_prefix;     /* key namespace in a shared store (default "ddp") */
    size_t segment_bytes;         /* 0: DDP_SEGMENT_BYTES, else measured default */
    int spin_us;                  /* 0: DDP_SPIN_US, else measured default; < 0 = never spin */
    int log_level;                /* 0: DDP_DEBUG; else a ddp_log_level_t + 1 (1 = silence) */
    const ddp_allocator_t *allocator; /* communicator + transport memory (the store: DDP_MALLOC) */
    ddp_log_fn_t log_fn;          /* NULL: stderr, or DDP_DEBUG_FILE; else every line, to this */
    void *log_user;               /* handed to log_fn */
    int deterministic;            /* 0: DDP_DETERMINISTIC; 1: reductions add in rank order (the
                                   * same bits whatever the algorithm); -1: off */
} ddp_comm_desc_t;

#define DDP_MAX_REQUESTS 64
typedef struct ddp_request { ddp_comm_t *comm; uint64_t id; } ddp_request_t;  /* zero = none */

/* Work around an async all-reduce, on the progress thread (ddp_all_reduce_async_hooked). */
typedef struct ddp_async_hooks {
    void (*before)(void *arg);
    void (*after)(void *arg);
    void *arg;
} ddp_async_hooks_t;

#ifdef __cplusplus
}
#endif
#endif /* DDP_COMM_TYPES_H_INCLUDED */
