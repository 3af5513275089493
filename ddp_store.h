/* SPDX-License-Identifier: MIT (see LICENSE) */
/* ddp_store.h — libddp's rendezvous key-value store, client and server (c10d TCPStore
 * semantics). Rank 0 of a communicator serves it on MASTER_ADDR:MASTER_PORT and every rank is a
 * client; under ddprun, ddprun serves it (DDP_LAUNCHER_STORE) and so it outlives any rank; it is
 * also usable on its own:
 *
 *     #define DDP_IMPLEMENTATION        // in one .c file (or DDP_STORE_IMPLEMENTATION)
 *     #include "ddp_store.h"
 *
 *     ddp_store_t *s;
 *     ddp_store_open(&s, "127.0.0.1", 29500, is_server, NULL);
 *     ddp_store_set(s, "key", "v", 1);  ddp_store_get(s, "key", buf, sizeof buf, &len);
 *     ddp_store_close(s);
 *
 * RULES: every call blocks at most the store's timeout (desc.timeout_ms, else DDP_TIMEOUT_MS);
 * get and wait block until their keys exist. A store handle is safe to share between threads.
 * A client retries connecting (exponential backoff with jitter) until its timeout: ranks start
 * in any order, and a master flooded by thousands of connects may reset some. A connection that
 * brings no challenge within half the handshake bound is made again (a full listen queue drops
 * some connections the client sees as made). A connect that lasts says why at WARN after 10 s,
 * 30 s, 60 s (refused, no free local port, SYNs unanswered, no challenge); no free local port
 * (EADDRNOTAVAIL) is said at once. desc.local_addr picks the address connections leave from.
 *
 * JOB SECRET: with one (desc.secret, else DDP_JOB_SECRET) every connection opens with a mutual
 * challenge-response (ddp_auth.h, label "store"): the secret itself never crosses the wire. A
 * client that cannot prove it knows the secret gets one DDP_ERR_AUTH answer and is
 * disconnected; a client refuses (DDP_ERR_AUTH) a master that cannot prove it, or that asks for
 * no secret when the client has one. The proofs are keyed with the secret stretched by PBKDF2
 * (ddp_auth.h: _ddp_auth_job_key) with a salt the server draws at start. Without a secret anyone
 * who reaches the port from another host may use the store, and on this host only the store's
 * own user: that is the insecure mode, fine on loopback or a private network (a WARN says so
 * when the server listens on a network address).
 *
 * THE SERVER listens on `host` when it is a loopback address (then nothing off this machine can
 * connect) or an address of this machine; otherwise, and when host is NULL, on every interface.
 * It logs the address at INFO. Before a connection has authenticated the server reads only the
 * hello (at most 128 bytes, whatever the peer announces) and allocates nothing the peer sizes;
 * a connection that has not authenticated within min(timeout, 10 s) (at least 1 s) is closed.
 * Wrong proofs are throttled per source (see "the throttle" in ddp_store_server.h): after 3, a
 * source's next proof is checked only after 100 ms, doubling to 2 s. Without a secret, a
 * connection from this host whose socket another user owns is closed unread (sock_diag).
 * Failed handshakes are logged at most once a second, with a count of those not shown. The
 * server raises its soft RLIMIT_NOFILE to the hard limit; when it runs out of descriptors all
 * the same it closes the oldest unauthenticated connection (else refuses the newcomer) and goes
 * on serving. It listens with 8 sockets sharing the port (SO_REUSEPORT, after binding it alone
 * once, so a port in use is an error): 8 listen queues for a burst of connects. A connection it
 * drops is shut down, so it ends for the client even where a forked child holds a copy of the
 * server's socket. After the hello it reads a connection's requests up to 64 KiB at a time and
 * runs them in order; what cannot run yet (behind a parked GET/WAIT, or while 256 KiB of that
 * client's answers wait to be read) waits with the connection, and nothing more is read from it
 * until then: a client that pipelines without reading costs the server at most that much
 * memory. Its work per request does not grow with the clients: the key table grows
 * with the keys, and a write runs again only the GET/WAITs parked on its keys. Linux only (epoll).
 *
 * BATCHES: ddp_store_batch(s, ops, n) sends n requests (ddp_store_op_t: SET, GET, ADD,
 * COMPARE_SET, WAIT on one key or several (keys, nkeys, any), CHECK, DELETE, and GET_IF_SET, a
 * GET that answers at once; zero-initialise each, set kind, key and what the kind reads)
 * in one write and reads their answers in order: one round trip for all of them instead of n,
 * which is what a rendezvous of thousands of ranks on one store costs. The server runs them in
 * order, exactly as n calls one after another would (a GET or WAIT that waits holds the
 * requests after it); each op gets its own result (and out_len, num), and the call returns
 * DDP_SUCCESS or the first op's failure. Meant for requests that do not need each other's
 * answers: check the results after the call. Long batches go as windows of at most 64
 * requests and 16 KiB (a bigger request alone), a round trip each. The timeout bounds the
 * whole batch. On a c10d store the requests run one by one (same results, no pipelining).
 *
 * PYTORCH'S STORE: ddp_store_connect_c10d(host, port, timeout_ms, &s) gives the same handle type
 * as a client of a c10d TCPStore: torchrun's agent store (TORCHELASTIC_USE_AGENT_STORE=True), or
 * any torch.distributed.TCPStore started from Python. Every call above works on it unchanged
 * (ddp_store_port returns the port it connected to). Keys get torch's "/" in front on the wire,
 * as Python's TCPStore does: ddp_store_set(s, "k", ...) is what store.get("k") reads in Python.
 * The handle finds out which of the protocol's dialects the server speaks (PyTorch 1.x to 2.x,
 * with or without the VALIDATE handshake that the libuv server of 2.4+ requires; see
 * ddp_store_c10d.h). What the c10d protocol lacks: a wait for any one of several keys is
 * emulated by polling CHECK; a timed-out wait withdraws itself with CANCEL_WAIT where the server
 * has it, else the connection is dropped (the next call reconnects); a request the server's
 * dialect has no query for returns DDP_ERR_UNSUPPORTED with a message.
 * NO AUTHENTICATION: c10d has none, and nothing secret is ever sent to a c10d store. Anyone
 * who reaches the port can read and write it, as with torch itself; libddp hands out its data
 * connections' key through the store, so a job rendezvousing through torchrun's store without
 * DDP_JOB_SECRET is exactly as exposed as torch's own processes are. With DDP_JOB_SECRET set on
 * every rank the handle keeps it (never on the wire) and the communicator binds the data key to
 * it, so reading the store does not let a stranger join the data connections.
 * LAYOUT: four private headers below this one, one concept each:
 *   ddp_store_core.h    the handle, libddp's wire protocol, the client interface, connecting
 *   ddp_store_server.h  the server: key-value table, connections, throttle, the epoll thread
 *   ddp_store_client.h  libddp's client: its handshake, the round trip, its requests
 *   ddp_store_c10d.h    the c10d TCPStore client: its wire, dialect probing, its requests
 * The calls here check their arguments and go through the handle's client interface (libddp's
 * or c10d's, set when the handle is made) under its mutex.
 * Depends on those (and through them on ddp_base.h, ddp_socket.h and ddp_auth.h); link with
 * -pthread.
 */
#if defined(DDP_IMPLEMENTATION) && !defined(DDP_STORE_IMPLEMENTATION)
#define DDP_STORE_IMPLEMENTATION
#endif
#if defined(DDP_STORE_IMPLEMENTATION)
#ifndef DDP_STORE_CORE_IMPLEMENTATION
#define DDP_STORE_CORE_IMPLEMENTATION
#endif
#ifndef DDP_STORE_SERVER_IMPLEMENTATION
#define DDP_STORE_SERVER_IMPLEMENTATION
#endif
#ifndef DDP_STORE_CLIENT_IMPLEMENTATION
#define DDP_STORE_CLIENT_IMPLEMENTATION
#endif
#ifndef DDP_STORE_C10D_IMPLEMENTATION
#define DDP_STORE_C10D_IMPLEMENTATION
#endif
#endif
#include "ddp_store_core.h"
#include "ddp_store_server.h"
#include "ddp_store_client.h"
#include "ddp_store_c10d.h"

#ifndef DDP_STORE_H_INCLUDED
#define DDP_STORE_H_INCLUDED

#ifdef __cplusplus
extern "C" {
#endif

/* ddp_store_t, ddp_store_desc_t (timeout, secret, log level and rank, local address),
 * DDP_STORE_MAX_KEY and DDP_STORE_MAX_VALUE are declared in ddp_store_core.h.
 * host: where clients connect (the server listens there when it can, see above; a server's
 * NULL host listens everywhere and connects its own handle to 127.0.0.1). */
DDP_API ddp_result_t ddp_store_open(ddp_store_t **store, const char *host, int port, int is_server,
                                    const ddp_store_desc_t *desc);
/* A client of PyTorch's c10d TCPStore at host:port (see PYTORCH'S STORE above); connecting is
 * retried with backoff until timeout_ms (0: DDP_TIMEOUT_MS, else 600000; < 0 = forever), which
 * then bounds every call. Close it with ddp_store_close. */
DDP_API ddp_result_t ddp_store_connect_c10d(const char *host, int port, int timeout_ms,
                                            ddp_store_t **out);
DDP_API ddp_result_t ddp_store_close(ddp_store_t *store);
DDP_API ddp_result_t ddp_store_set(ddp_store_t *store, const char *key, const void *value,
                                   size_t len);
/* Waits for the key; copies up to cap bytes; *len = the value's full length. */
DDP_API ddp_result_t ddp_store_get(ddp_store_t *store, const char *key, void *value, size_t cap,
                                   size_t *len);
DDP_API ddp_result_t ddp_store_add(ddp_store_t *store, const char *key, int64_t delta,
                                   int64_t *result);
/* Sets key to desired if its value equals expected (a missing key matches expected_len == 0);
 * *actual receives the value after the call (up to cap bytes, full length in *actual_len). */
DDP_API ddp_result_t ddp_store_compare_set(ddp_store_t *store, const char *key,
                                           const void *expected, size_t expected_len,
                                           const void *desired, size_t desired_len,
                                           void *actual, size_t cap, size_t *actual_len);
DDP_API ddp_result_t ddp_store_wait(ddp_store_t *store, const char *const *keys, int nkeys,
                                    int timeout_ms);        /* 0: the store's timeout */
DDP_API ddp_result_t ddp_store_check(ddp_store_t *store, const char *key, int *exists);
DDP_API ddp_result_t ddp_store_delete(ddp_store_t *store, const char *key, int *deleted);
/* nops requests in one round trip (see BATCHES above); ops[i].result is each one's own. */
DDP_API ddp_result_t ddp_store_batch(ddp_store_t *store, ddp_store_op_t *ops, int nops);
DDP_API int ddp_store_port(const ddp_store_t *store);       /* server's port (useful with port 0) */
DDP_API const char *ddp_store_last_error(const ddp_store_t *store);

#ifdef __cplusplus
}
#endif
#endif /* DDP_STORE_H_INCLUDED */


/* ============================================================================================
 * IMPLEMENTATION
 * ========================================================================================== */
#if defined(DDP_STORE_IMPLEMENTATION) && !defined(DDP_STORE_IMPL_INCLUDED)
#define DDP_STORE_IMPL_INCLUDED
#if !defined(DDP_STORE_SERVER_IMPL_INCLUDED) || !defined(DDP_STORE_CLIENT_IMPL_INCLUDED) || \
    !defined(DDP_STORE_C10D_IMPL_INCLUDED)
#error "libddp: ddp_store.h's implementation needs ddp_store_server.h's, ddp_store_client.h's and ddp_store_c10d.h's (define DDP_IMPLEMENTATION)"
#endif

/* ---------------------------------------------------------------- handles
 * A handle gets its client interface (libddp's, or c10d's) here, then connects; on failure err
 * says why and the handle is gone. like: a handle whose key this one reuses (NULL: stretch the
 * secret here). */
_DDP_PRIVATE ddp_result_t _ddp_store_attach(ddp_store_t *s, const _ddp_store_client_t *client,
                                            const ddp_store_t *like, ddp_store_t **out, char *err,
                                            size_t errcap) {
    ddp_result_t r;
    s->client = client;
    _ddp_store_copy_key(s, like);
    if (like) memcpy(s->hosted_by, like->hosted_by, sizeof s->hosted_by);   /* a lane's messages too */
    if (client->prepare) client->prepare(s);
    pthread_mutex_lock(&s->mu);
    r = _ddp_store_connect(s);
    pthread_mutex_unlock(&s->mu);
    if (r != DDP_SUCCESS) {
        _ddp_strlcpy(err, s->last_error, errcap);
        ddp_store_close(s);
        return r;
    }
    *out = s;
    return DDP_SUCCESS;
}

/* A client's address: a host and a port to connect to. */
_DDP_PRIVATE int _ddp_store_client_addr_ok(const char *host, int port) {
    return port > 0 && port <= 65535 && host && *host;
}

_DDP_PRIVATE ddp_result_t _ddp_store_open_like(ddp_store_t **out, const char *host, int port,
                                               int is_server, const ddp_store_desc_t *d,
                                               const ddp_store_t *like, char *err, size_t errcap) {
    ddp_store_t *s;
    ddp_result_t r;
    if (!out) return DDP_ERR_INVALID_ARGUMENT;
    *out = NULL;
    if (port < 0 || port > 65535 || (!is_server && !_ddp_store_client_addr_ok(host, port)))
        return DDP_ERR_INVALID_ARGUMENT;
    if (!(s = _ddp_store_new(host, port, d))) return DDP_ERR_OUT_OF_MEMORY;
    if (is_server && (r = _ddp_store_start_server(s, host)) != DDP_SUCCESS) {
        _ddp_strlcpy(err, s->last_error, errcap);
        ddp_store_close(s);
        return r;
    }
    return _ddp_store_attach(s, &_ddp_store_native, like, out, err, errcap);
}

_DDP_PRIVATE ddp_result_t _ddp_store_open(ddp_store_t **out, const char *host, int port,
                                          int is_server, const ddp_store_desc_t *d, char *err,
                                          size_t errcap) {
    return _ddp_store_open_like(out, host, port, is_server, d, NULL, err, errcap);
}

DDP_API ddp_result_t ddp_store_open(ddp_store_t **out, const char *host, int port, int is_server,
                                    const ddp_store_desc_t *d) {
    char err[512];
    return _ddp_store_open(out, host, port, is_server, d, err, sizeof err);
}

/* A client of `client`'s protocol at host:port (no server): d as for ddp_store_open (timeout,
 * log level and rank; the secret is ignored when like has one). */
_DDP_PRIVATE ddp_result_t _ddp_store_client_new(ddp_store_t **out, const _ddp_store_client_t *client,
                                                const char *host, int port, const ddp_store_desc_t *d,
                                                const ddp_store_t *like, char *err, size_t errcap) {
    ddp_store_t *s;
    if (!out) return DDP_ERR_INVALID_ARGUMENT;
    *out = NULL;
    if (!_ddp_store_client_addr_ok(host, port)) return DDP_ERR_INVALID_ARGUMENT;
    if (!(s = _ddp_store_new(host, port, d))) return DDP_ERR_OUT_OF_MEMORY;
    return _ddp_store_attach(s, client, like, out, err, errcap);
}

/* A c10d client: d as for ddp_store_open (the secret is kept for the communicator's data key
 * and never sent). On failure err says why (the handle is gone). */
_DDP_PRIVATE ddp_result_t _ddp_store_connect_c10d(ddp_store_t **out, const char *host, int port,
                                                  const ddp_store_desc_t *d, char *err, size_t errcap) {
    return _ddp_store_client_new(out, &_ddp_store_c10d, host, port, d, NULL, err, errcap);
}

/* Another client of the store `like` is connected to, in the same protocol (a communicator's
 * lanes open their own): ddp_store_open's client, or a c10d one, with like's key (the secret
 * is not stretched again; d->secret is ignored). */
_DDP_PRIVATE ddp_result_t _ddp_store_client_like(ddp_store_t **out, const ddp_store_t *like,
                                                 const ddp_store_desc_t *d, char *err, size_t errcap) {
    if (!like) return DDP_ERR_INVALID_ARGUMENT;
    return _ddp_store_client_new(out, like->client, like->host, like->port, d, like, err, errcap);
}

DDP_API ddp_result_t ddp_store_connect_c10d(const char *host, int port, int timeout_ms, ddp_store_t **out) {
    ddp_store_desc_t d;
    char err[512];
    memset(&d, 0, sizeof d);
    d.timeout_ms = timeout_ms;
    return _ddp_store_connect_c10d(out, host, port, &d, err, sizeof err);
}

/* A server's close never waits on its clients for long: others may still read keys (a slower
 * rank reading why the job failed), so it serves on while clients are connected, for at most
 * grace_ms (the caller's bound: ddp_store_close uses _DDP_STORE_CLOSE_GRACE_MS or the store's
 * timeout if shorter; ddp_comm_init_threads' private store, whose clients live in this very
 * process, 0). A dead client's socket closes by itself. */
#ifndef _DDP_STORE_CLOSE_GRACE_MS
#define _DDP_STORE_CLOSE_GRACE_MS 2000
#endif
_DDP_PRIVATE ddp_result_t _ddp_store_close_within(ddp_store_t *s, int grace_ms) {
    if (!s) return DDP_ERR_INVALID_ARGUMENT;
    _ddp_store_hangup(s);
    _ddp_store_server_stop(s, grace_ms);
    _ddp_store_server_free(s);
    _ddp_auth_wipe(s->secret, sizeof s->secret);
    _ddp_auth_wipe(s->key, sizeof s->key);
    pthread_mutex_destroy(&s->mu);
    pthread_mutex_destroy(&s->srv_mu);
    DDP_FREE(s);
    return DDP_SUCCESS;
}

DDP_API ddp_result_t ddp_store_close(ddp_store_t *s) {
    int grace = _DDP_STORE_CLOSE_GRACE_MS;
    if (s && s->timeout_ms >= 0 && s->timeout_ms < grace) grace = s->timeout_ms;
    return _ddp_store_close_within(s, grace);
}

/* A fork child's copy of a store: close this process's descriptors, nothing more. A client
 * sends nothing on close, so it goes as usual. A server's thread stayed in the parent and its
 * connections may have been copied mid-change: nothing is joined, sent or taken off the epoll
 * set (shared with the parent), and its memory is left to the child's exit. */
_DDP_PRIVATE void _ddp_store_forget(ddp_store_t *s) {
    int *fds[6];
    int i;
    if (!s) return;
    if (!s->thread_started) { _ddp_store_close_within(s, 0); return; }
    fds[0] = &s->fd; fds[1] = &s->listen_fd; fds[2] = &s->epfd; fds[3] = &s->spare_fd;
    fds[4] = &s->wake[0]; fds[5] = &s->wake[1];
    for (i = 0; i < 6; i++) {
        if (*fds[i] >= 0) close(*fds[i]);
        *fds[i] = -1;
    }
    for (i = 1; i < s->nlisten; i++) close(s->listen_fds[i]);   /* [0] is listen_fd */
    s->nlisten = 0;
}

/* ---------------------------------------------------------------- the calls
 * Each checks its arguments, then runs the handle's client's request under the handle's mutex. */
_DDP_PRIVATE ddp_result_t _ddp_store_check_key(ddp_store_t *s, const char *key) {
    size_t n;
    if (!s || !key) return DDP_ERR_INVALID_ARGUMENT;
    n = strlen(key);
    if (n == 0 || n > DDP_STORE_MAX_KEY) {
        snprintf(s->last_error, sizeof s->last_error, "key length %zu not in 1..%d", n, DDP_STORE_MAX_KEY);
        return DDP_ERR_INVALID_ARGUMENT;
    }
    return DDP_SUCCESS;
}

DDP_API ddp_result_t ddp_store_set(ddp_store_t *s, const char *key, const void *value, size_t len) {
    ddp_result_t r = _ddp_store_check_key(s, key);
    if (r != DDP_SUCCESS) return r;
    if ((len && !value) || len > DDP_STORE_MAX_VALUE) return DDP_ERR_INVALID_ARGUMENT;
    pthread_mutex_lock(&s->mu);
    r = s->client->set(s, key, value, len);
    pthread_mutex_unlock(&s->mu);
    return r;
}

DDP_API ddp_result_t ddp_store_get(ddp_store_t *s, const char *key, void *value, size_t cap, size_t *len) {
    ddp_result_t r = _ddp_store_check_key(s, key);
    if (r != DDP_SUCCESS) return r;
    if (cap && !value) return DDP_ERR_INVALID_ARGUMENT;
    pthread_mutex_lock(&s->mu);
    r = s->client->get(s, key, value, cap, len);
    pthread_mutex_unlock(&s->mu);
    return r;
}

DDP_API ddp_result_t ddp_store_add(ddp_store_t *s, const char *key, int64_t delta, int64_t *result) {
    ddp_result_t r = _ddp_store_check_key(s, key);
    if (r != DDP_SUCCESS) return r;
    pthread_mutex_lock(&s->mu);
    r = s->client->add(s, key, delta, result);
    pthread_mutex_unlock(&s->mu);
    return r;
}

DDP_API ddp_result_t ddp_store_compare_set(ddp_store_t *s, const char *key, const void *expected,
                                           size_t expected_len, const void *desired, size_t desired_len,
                                           void *actual, size_t cap, size_t *actual_len) {
    ddp_result_t r = _ddp_store_check_key(s, key);
    if (r != DDP_SUCCESS) return r;
    if ((expected_len && !expected) || (desired_len && !desired) || (cap && !actual) ||
        expected_len > DDP_STORE_MAX_VALUE || desired_len > DDP_STORE_MAX_VALUE)
        return DDP_ERR_INVALID_ARGUMENT;
    pthread_mutex_lock(&s->mu);
    r = s->client->compare_set(s, key, expected, expected_len, desired, desired_len, actual, cap, actual_len);
    pthread_mutex_unlock(&s->mu);
    return r;
}

/* Every key 1..DDP_STORE_MAX_KEY bytes, all of them with their NULs in _DDP_STORE_WAIT_KEYS. */
_DDP_PRIVATE ddp_result_t _ddp_store_wait_keys(ddp_store_t *s, const char *const *keys, int nkeys,
                                               int timeout_ms, int any) {
    size_t off = 0;
    int i;
    ddp_result_t r;
    if (!s || nkeys < 0 || (nkeys && !keys)) return DDP_ERR_INVALID_ARGUMENT;
    for (i = 0; i < nkeys; i++) {
        if ((r = _ddp_store_check_key(s, keys[i])) != DDP_SUCCESS) return r;
        off += strlen(keys[i]) + 1;
        if (off > _DDP_STORE_WAIT_KEYS) return DDP_ERR_INVALID_ARGUMENT;
    }
    if (nkeys == 0) return DDP_SUCCESS;
    pthread_mutex_lock(&s->mu);
    r = s->client->wait(s, keys, nkeys, timeout_ms, any);
    pthread_mutex_unlock(&s->mu);
    return r;
}

DDP_API ddp_result_t ddp_store_wait(ddp_store_t *s, const char *const *keys, int nkeys, int timeout_ms) {
    return _ddp_store_wait_keys(s, keys, nkeys, timeout_ms, 0);
}

DDP_API ddp_result_t ddp_store_check(ddp_store_t *s, const char *key, int *exists) {
    ddp_result_t r = _ddp_store_check_key(s, key);
    if (r != DDP_SUCCESS) return r;
    pthread_mutex_lock(&s->mu);
    r = s->client->check(s, key, exists);
    pthread_mutex_unlock(&s->mu);
    return r;
}

DDP_API ddp_result_t ddp_store_delete(ddp_store_t *s, const char *key, int *deleted) {
    ddp_result_t r = _ddp_store_check_key(s, key);
    if (r != DDP_SUCCESS) return r;
    pthread_mutex_lock(&s->mu);
    r = s->client->del(s, key, deleted);
    pthread_mutex_unlock(&s->mu);
    return r;
}

/* One op of a batch, checked as its own call would check it (0: fine). */
_DDP_PRIVATE ddp_result_t _ddp_store_check_op(ddp_store_t *s, const ddp_store_op_t *op) {
    ddp_result_t r;
    if (op->kind < DDP_STORE_OP_SET || op->kind > DDP_STORE_OP_GET_IF_SET) return DDP_ERR_INVALID_ARGUMENT;
    if (op->kind == DDP_STORE_OP_WAIT && op->keys) {   /* several keys: as ddp_store_wait takes them */
        size_t off = 0;
        int i;
        if (op->nkeys < 1) return DDP_ERR_INVALID_ARGUMENT;
        for (i = 0; i < op->nkeys; i++) {
            if ((r = _ddp_store_check_key(s, op->keys[i])) != DDP_SUCCESS) return r;
            if ((off += strlen(op->keys[i]) + 1) > _DDP_STORE_WAIT_KEYS) return DDP_ERR_INVALID_ARGUMENT;
        }
    } else if ((r = _ddp_store_check_key(s, op->key)) != DDP_SUCCESS) {
        return r;
    }
    if ((op->len && !op->value) || op->len > DDP_STORE_MAX_VALUE || (op->expected_len && !op->expected) ||
        op->expected_len > DDP_STORE_MAX_VALUE || (op->cap && !op->out))
        return DDP_ERR_INVALID_ARGUMENT;
    return DDP_SUCCESS;
}

/* A client without pipelining (c10d): the ops one by one, through its single calls (a WAIT
 * within timeout_ms, 0: the store's). */
_DDP_PRIVATE ddp_result_t _ddp_store_batch_serial(ddp_store_t *s, ddp_store_op_t *ops, int nops, int timeout_ms) {
    ddp_result_t first = DDP_SUCCESS;
    int i, flag;
    for (i = 0; i < nops; i++) {
        ddp_store_op_t *op = &ops[i];
        const char *key = op->key;
        flag = 0;
        switch (op->kind) {
        case DDP_STORE_OP_SET: op->result = s->client->set(s, key, op->value, op->len); break;
        case DDP_STORE_OP_GET: op->result = s->client->get(s, key, op->out, op->cap, &op->out_len); break;
        case DDP_STORE_OP_ADD: op->result = s->client->add(s, key, op->delta, &op->num); break;
        case DDP_STORE_OP_COMPARE_SET:
            op->result = s->client->compare_set(s, key, op->expected, op->expected_len, op->value,
                                                op->len, op->out, op->cap, &op->out_len);
            break;
        case DDP_STORE_OP_WAIT:
            op->result = op->keys ? s->client->wait(s, op->keys, op->nkeys, timeout_ms, op->any)
                                  : s->client->wait(s, &key, 1, timeout_ms, 0);
            break;
        case DDP_STORE_OP_CHECK: op->result = s->client->check(s, key, &flag); op->num = flag; break;
        case DDP_STORE_OP_GET_IF_SET:   /* two requests here: a check, then the get */
            op->result = s->client->check(s, key, &flag);
            op->num = flag;
            if (op->result == DDP_SUCCESS && flag) op->result = s->client->get(s, key, op->out, op->cap, &op->out_len);
            break;
        default: op->result = s->client->del(s, key, &flag); op->num = flag; break;
        }
        if (op->result != DDP_SUCCESS && first == DDP_SUCCESS) first = op->result;
    }
    return first;
}

/* ddp_store_batch within timeout_ms (0: the store's timeout; init's waits come in slices). */
_DDP_PRIVATE ddp_result_t _ddp_store_batch_for(ddp_store_t *s, ddp_store_op_t *ops, int nops, int timeout_ms) {
    ddp_result_t r;
    int i;
    if (!s || nops < 0 || (nops && !ops)) return DDP_ERR_INVALID_ARGUMENT;
    for (i = 0; i < nops; i++) {
        ops[i].out_len = 0;
        ops[i].num = 0;
        if ((r = _ddp_store_check_op(s, &ops[i])) != DDP_SUCCESS) {
            ops[i].result = r;
            if (r == DDP_ERR_INVALID_ARGUMENT)
                snprintf(s->last_error, sizeof s->last_error, "ddp_store_batch: op %d of %d is not a "
                         "valid request (kind %d; its key, value lengths or buffer)", i, nops, (int)ops[i].kind);
            return r;
        }
        ops[i].result = DDP_SUCCESS;
    }
    if (nops == 0) return DDP_SUCCESS;
    pthread_mutex_lock(&s->mu);
    r = s->client->batch ? s->client->batch(s, ops, nops, timeout_ms) : _ddp_store_batch_serial(s, ops, nops, timeout_ms);
    pthread_mutex_unlock(&s->mu);
    return r;
}

DDP_API ddp_result_t ddp_store_batch(ddp_store_t *s, ddp_store_op_t *ops, int nops) {
    return _ddp_store_batch_for(s, ops, nops, 0);
}

DDP_API int ddp_store_port(const ddp_store_t *s) { return s ? s->port : -1; }
DDP_API const char *ddp_store_last_error(const ddp_store_t *s) { return s ? s->last_error : "NULL store"; }

/* While reporting a failure the store must not become a second wait: short timeouts and no
 * reconnecting (the master may be the rank that died). */
_DDP_PRIVATE void _ddp_store_quick(ddp_store_t *s, int on) {
    static const int quick_ms = 1000;
    pthread_mutex_lock(&s->mu);   /* a transport's thread may be in a request (its timeout) */
    if (on && !s->quick) { s->quick = s->timeout_ms; s->timeout_ms = quick_ms; }
    else if (!on && s->quick) { s->timeout_ms = s->quick; s->quick = 0; }
    pthread_mutex_unlock(&s->mu);
}

#endif /* DDP_STORE_IMPLEMENTATION */
