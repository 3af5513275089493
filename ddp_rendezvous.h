/* SPDX-License-Identifier: MIT (see LICENSE) */
/* ddp_rendezvous.h — the communicator's rendezvous through the store, private: the job check,
 * registration, the transports every rank offers, the wait for all ranks (and who is missing),
 * the authenticated identity, the host table, and settings every rank must share.
 *
 * ddp_comm_init.h runs it (_ddp_rendezvous) as one step of init. Depends on ddp_comm_core.h.
 * Built by DDP_IMPLEMENTATION (or DDP_RENDEZVOUS_IMPLEMENTATION).
 */
#if defined(DDP_IMPLEMENTATION) && !defined(DDP_RENDEZVOUS_IMPLEMENTATION)
#define DDP_RENDEZVOUS_IMPLEMENTATION
#endif
#if defined(DDP_RENDEZVOUS_IMPLEMENTATION)
#ifndef DDP_COMM_CORE_IMPLEMENTATION
#define DDP_COMM_CORE_IMPLEMENTATION
#endif
#endif
#include "ddp_comm_core.h"

/* ============================================================================================
 * IMPLEMENTATION
 * ========================================================================================== */
#if defined(DDP_RENDEZVOUS_IMPLEMENTATION) && !defined(DDP_RENDEZVOUS_IMPL_INCLUDED)
#define DDP_RENDEZVOUS_IMPL_INCLUDED
#if !defined(DDP_COMM_CORE_IMPL_INCLUDED)
#error "libddp: ddp_rendezvous.h's implementation needs those of the headers below it (define DDP_IMPLEMENTATION)"
#endif

/* torchrun without --standalone: its agent serves the store (TORCHELASTIC_USE_AGENT_STORE). */
_DDP_PRIVATE int _ddp_torchrun_agent_store(void) {
    const char *a = getenv("TORCHELASTIC_USE_AGENT_STORE");
    return a && (!strcmp(a, "True") || !strcmp(a, "true") || !strcmp(a, "1"));
}

/* ddprun serves the store itself (DDP_LAUNCHER_STORE=HOST:PORT, libddp's protocol): every rank
 * is a client, so the store outlives any rank. 1 with host and port, 0 when unset, -1 when the
 * value is not HOST:PORT ("[v6]:PORT" for an IPv6 address). */
_DDP_PRIVATE int _ddp_launcher_store(char *host, size_t cap, int *port) {
    const char *v = getenv("DDP_LAUNCHER_STORE"), *colon;
    size_t n;
    long p;
    if (!v || !*v) return 0;
    colon = strrchr(v, ':');
    if (!colon || colon == v || _ddp_parse_long(colon + 1, 1, 65535, &p) != 0) return -1;
    n = (size_t)(colon - v);
    if (v[0] == '[' && n >= 2 && v[n - 1] == ']') { v++; n -= 2; }
    if (n == 0 || n >= cap) return -1;
    memcpy(host, v, n);
    host[n] = 0;
    *port = (int)p;
    return 1;
}

#define _DDP_LAUNCHER_HOST "the launcher (ddprun)"   /* the store's hosted_by under ddprun */
_DDP_PRIVATE int _ddp_store_by_launcher(const ddp_store_t *s) {
    return s && !strcmp(s->hosted_by, _DDP_LAUNCHER_HOST);
}

/* Host identity: boot id + hostname + network namespace (two containers on one kernel share the
 * boot id but not the namespace; two hosts may share a name). DDP_HOST_ID overrides, so tests
 * can fake several hosts on one machine (DDP_TEST_HOSTS, for the hierarchical algorithms'
 * layout only, is read where the layout is made). */
_DDP_PRIVATE void _ddp_host_id(char *out, size_t cap) {
    char boot[64] = "", host[64] = "", ns[64] = "";
    const char *env = getenv("DDP_HOST_ID");
    FILE *f;
    ssize_t n;
    if (env && *env) { _ddp_strlcpy(out, env, cap); return; }
    f = fopen("/proc/sys/kernel/random/boot_id", "r");
    if (f) {
        if (!fgets(boot, sizeof boot, f)) boot[0] = 0;
        fclose(f);
        boot[strcspn(boot, "\n")] = 0;
    }
    gethostname(host, sizeof host - 1);
    n = readlink("/proc/self/ns/net", ns, sizeof ns - 1);
    ns[n > 0 ? n : 0] = 0;
    snprintf(out, cap, "%.63s|%.40s|%.40s", host, boot, ns);
}


/* A setting every rank must share: the first to publish it under its key decides (a
 * COMPARE_SET of the registration batch, _ddp_rendezvous_register); val is what the key holds
 * after it (len bytes). Another value than this rank's is DDP_ERR_MISMATCH, told with fmt
 * (this rank's %d, then the first rank's %s). */
_DDP_PRIVATE ddp_result_t _ddp_rendezvous_agreed(ddp_comm_t *c, char *val, size_t cap, size_t len, int mine,
                                                 const char *fmt) {
    char want[32];
    ddp_result_t r;
    snprintf(want, sizeof want, "%d", mine);
    val[len < cap ? len : cap - 1] = 0;
    if (strcmp(val, want) == 0) return DDP_SUCCESS;
    {
        char msg[512];
#if defined(__GNUC__) || defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wformat-nonliteral"
#endif
        snprintf(msg, sizeof msg, fmt, mine, val);
#if defined(__GNUC__) || defined(__clang__)
#pragma GCC diagnostic pop
#endif
        r = ddp_comm_fail(c, DDP_ERR_MISMATCH, "init: %s", msg);
    }
    _ddp_publish_failure(c);
    return r;
}

/* The key every data connection proves knowledge of (challenge-response, ddp_auth.h): rank 0's
 * random per-communicator token, handed out through the store, bound to the job secret when
 * there is one (then a token seen on the wire is useless without the secret). The store holds
 * the secret already stretched (ddp_auth.h: _ddp_auth_job_key), so a guess checked against a
 * captured data handshake costs the same as one against the store's. */
_DDP_PRIVATE void _ddp_derive_data_key(ddp_comm_t *c) {
    if (c->boot.store && c->boot.store->keylen) {
        _ddp_hmac_sha256_t h;
        _ddp_hmac_sha256_init(&h, c->boot.store->key, c->boot.store->keylen);
        _ddp_hmac_sha256_update(&h, "ddp data key v1", 15);
        _ddp_hmac_sha256_update(&h, c->boot.token, sizeof c->boot.token);
        _ddp_hmac_sha256_final(&h, c->boot.data_key);
        _ddp_auth_wipe(&h, sizeof h);
    } else {
        memcpy(c->boot.data_key, c->boot.token, sizeof c->boot.data_key);
    }
}

/* Who has not joined yet, from the join masks (a few reads, not one per rank), written as ranks:
 * "ranks 2, 5-7" (at most `cap` bytes, then "and N more"). Returns the store's error, if any. */
#define _DDP_JOINMASK_BITS 62
_DDP_PRIVATE ddp_result_t _ddp_rendezvous_absent(ddp_comm_t *c, char *out, size_t cap, int *nmissing) {
    char key[256];
    size_t off = 0;
    int g, shown = 0, run_start = -1, run_end = -1, more = 0;
    const int groups = (c->eng.nranks + _DDP_JOINMASK_BITS - 1) / _DDP_JOINMASK_BITS;
    *nmissing = 0;
    out[0] = 0;
    for (g = 0; g <= groups; g++) {
        int64_t mask = 0;
        int b;
        if (g < groups) {
            ddp_result_t r;
            _ddp_key(c, key, sizeof key, "joinmask/%d", g);
            if ((r = ddp_store_add(c->boot.store, key, 0, &mask)) != DDP_SUCCESS) return r;   /* adding 0 reads */
        }
        for (b = 0; b < _DDP_JOINMASK_BITS; b++) {
            const int rank = g * _DDP_JOINMASK_BITS + b, absent = g < groups && rank < c->eng.nranks &&
                             !(mask & ((int64_t)1 << b));
            if (absent) {
                ++*nmissing;
                if (run_start >= 0 && rank == run_end + 1) { run_end = rank; continue; }
            }
            if (run_start >= 0) {   /* a run of absent ranks ended: write it */
                if (off + 32 < cap) {
                    off += (size_t)snprintf(out + off, cap - off, run_end > run_start ? "%s%d-%d" : "%s%d",
                                            shown ? ", " : "", run_start, run_end);
                    shown++;
                } else {
                    more += run_end - run_start + 1;
                }
                run_start = -1;
            }
            if (absent) run_start = run_end = rank;
            if (g == groups) break;
        }
    }
    if (more && off + 24 < cap) snprintf(out + off, cap - off, " and %d more", more);
    return DDP_SUCCESS;
}

/* "rank 2" or "ranks 2, 5-7". */
_DDP_PRIVATE const char *_ddp_ranks_word(int n) { return n == 1 ? "rank" : "ranks"; }

/* The rendezvous timed out waiting for "ready": who is missing, in what the deadline left (the
 * ready wait kept a slice for it). Whether the store answers at all is what tells a stopped,
 * overloaded or unreachable rank 0 from ranks that never came. */
_DDP_PRIVATE ddp_result_t _ddp_rendezvous_missing(ddp_comm_t *c) {
    char missing[400];
    int nmissing = 0;
    if (_ddp_rendezvous_absent(c, missing, sizeof missing, &nmissing) != DDP_SUCCESS)
        return ddp_comm_fail(c, DDP_ERR_TIMEOUT, "init: rendezvous at %s:%d: %s store does "
                             "not answer: no rendezvous within %d ms, then no answer to a query "
                             "(%s stopped, hung, overloaded or out of descriptors, or cut off "
                             "from this host)", c->boot.master_addr, c->boot.master_port,
                             _ddp_store_by_launcher(c->boot.store) ? "the launcher's" : "rank 0's", c->eng.timeout_ms,
                             _ddp_store_by_launcher(c->boot.store) ? "the launcher" : "rank 0");
    if (!nmissing)
        return ddp_comm_fail(c, DDP_ERR_TIMEOUT, "init: rendezvous at %s:%d: no rendezvous within %d "
                             "ms, yet every rank joined as the wait ended", c->boot.master_addr,
                             c->boot.master_port, c->eng.timeout_ms);
    return ddp_comm_fail(c, DDP_ERR_TIMEOUT, "init: rendezvous at %s:%d: %d of %d ranks never joined "
                         "within %d ms: %s %s (check WORLD_SIZE and that every rank was started)",
                         c->boot.master_addr, c->boot.master_port, nmissing, c->eng.nranks, c->eng.timeout_ms,
                         _ddp_ranks_word(nmissing), missing);
}

/* What is left of the rendezvous' deadline, less `keep` ms kept for what follows; at least 1
 * (0 would mean the store's own timeout). */
_DDP_PRIVATE int _ddp_init_ms_left(const ddp_comm_t *c, int keep) {
    int left = _ddp_ms_left(c->boot.init_deadline_us);
    if (left < 0) return -1;   /* no deadline: wait forever */
    left -= keep;
    return left < 1 ? 1 : left;
}

/* Rendezvous, phase 1: rank 0 says which job this store serves; a rank of another job that
 * reached it (two jobs on one host and port) is refused here, naming both, before it counts in. */
_DDP_PRIVATE ddp_result_t _ddp_rendezvous_job(ddp_comm_t *c) {
    char key[256];
    ddp_result_t r;
    _ddp_key(c, key, sizeof key, "job");
    if (c->eng.rank == 0) {
        r = ddp_store_set(c->boot.store, key, c->boot.job, strlen(c->boot.job));
    } else {
        char theirs[sizeof c->boot.job];
        size_t len = 0;
        r = ddp_store_get(c->boot.store, key, theirs, sizeof theirs - 1, &len);
        if (r == DDP_SUCCESS) {
            theirs[len < sizeof theirs ? len : sizeof theirs - 1] = 0;
            if (strcmp(theirs, c->boot.job) != 0) {
                c->boot.foreign = 1;   /* not our store: leave its job alone (no failure published) */
                return ddp_comm_fail(c, DDP_ERR_MISMATCH, "init: this rank belongs to job '%s' but the "
                                     "store at %s:%d serves job '%s': two jobs met on one port; give "
                                     "each job its own MASTER_PORT", c->boot.job[0] ? c->boot.job : "(none)",
                                     c->boot.master_addr, c->boot.master_port, theirs[0] ? theirs : "(none)");
            }
        }
    }
    if (r != DDP_SUCCESS) return ddp_comm_fail(c, r, "init: rendezvous: %s", ddp_store_last_error(c->boot.store));
    return DDP_SUCCESS;
}

/* Phase 2, one batch of store requests (one round trip, ddp_store_batch), checked after it:
 * the world size and DDP_ASYNC_LANES (each rank opens that many connection sets at init), where
 * the first rank decides and anyone who disagrees fails loudly; this rank counts once and
 * publishes its host; rank 0 draws the communicator's identity (id and connection token). A
 * rank that disagrees, or a second process with the same RANK, has written its count and host
 * by the time it finds out: it fails and publishes the failure, which ends every rank's init.
 * What only a rank that passed these checks may write (its join-mask bit, rank 0's identity)
 * goes with its join (_ddp_rendezvous_join): a duplicate RANK would otherwise add its mask bit
 * twice (a carry into the next rank's) and a second rank 0 would replace the identity. */
enum { _DDP_RV_WORLD, _DDP_RV_LANES, _DDP_RV_RANK, _DDP_RV_HOST, _DDP_RV_OPS };
_DDP_PRIVATE ddp_result_t _ddp_rendezvous_register(ddp_comm_t *c, const char *host) {
    char keys[_DDP_RV_OPS][256], vals[2][32], got[2][64];
    unsigned char entry[_DDP_HOST_ENTRY];
    ddp_store_op_t ops[_DDP_RV_OPS];
    const int nops = _DDP_RV_OPS;
    int i;
    ddp_result_t r;
    memset(ops, 0, sizeof ops);
    _ddp_key(c, keys[_DDP_RV_WORLD], sizeof keys[0], "world_size");
    _ddp_key(c, keys[_DDP_RV_LANES], sizeof keys[0], "async_lanes");
    snprintf(vals[0], sizeof vals[0], "%d", c->eng.nranks);
    snprintf(vals[1], sizeof vals[1], "%d", c->queue.want_lanes);
    for (i = 0; i < 2; i++) {
        ops[i].kind = DDP_STORE_OP_COMPARE_SET;
        ops[i].value = vals[i]; ops[i].len = strlen(vals[i]);
        ops[i].out = got[i]; ops[i].cap = sizeof got[i] - 1;
    }
    _ddp_key(c, keys[_DDP_RV_RANK], sizeof keys[0], "rank/%d", c->eng.rank);
    ops[_DDP_RV_RANK].kind = DDP_STORE_OP_ADD; ops[_DDP_RV_RANK].delta = 1;
    /* host/N: the host's identity (NUL-padded) and the CPUs this rank may use */
    memset(entry, 0, sizeof entry);
    memcpy(entry, host, strlen(host) < _DDP_HOST_ID_LEN ? strlen(host) : _DDP_HOST_ID_LEN - 1);
    _ddp_cpu_mask(entry + _DDP_HOST_ID_LEN);
    _ddp_key(c, keys[_DDP_RV_HOST], sizeof keys[0], "host/%d", c->eng.rank);
    ops[_DDP_RV_HOST].kind = DDP_STORE_OP_SET; ops[_DDP_RV_HOST].value = entry; ops[_DDP_RV_HOST].len = sizeof entry;
    if (c->eng.rank == 0) {
        c->tctx.comm_id = _ddp_random64();
        if (_ddp_auth_random(c->boot.token, sizeof c->boot.token) != 0)
            return ddp_comm_fail(c, DDP_ERR_SYSTEM, "init: no random bytes for the connection token");
    }
    for (i = 0; i < nops; i++) ops[i].key = keys[i];
    r = ddp_store_batch(c->boot.store, ops, nops);
    if (r != DDP_SUCCESS) return ddp_comm_fail(c, r, "init: rendezvous: %s", ddp_store_last_error(c->boot.store));
    if ((r = _ddp_rendezvous_agreed(c, got[0], sizeof got[0], ops[0].out_len, c->eng.nranks, "world size "
                                    "disagreement: this rank was started with world size %d, the job's "
                                    "first rank with %s")) != DDP_SUCCESS ||
        (r = _ddp_rendezvous_agreed(c, got[1], sizeof got[1], ops[1].out_len, c->queue.want_lanes,
                                    "DDP_ASYNC_LANES is %d on this rank, %s on the job's first rank: set "
                                    "it the same everywhere")) != DDP_SUCCESS)
        return r;
    if (ops[_DDP_RV_RANK].num > 1) {
        r = ddp_comm_fail(c, DDP_ERR_INVALID_USAGE, "init: rank %d joined twice (two processes "
                          "were given RANK=%d)", c->eng.rank, c->eng.rank);
        _ddp_publish_failure(c);
        return r;
    }
    if (c->eng.rank == 0) _ddp_derive_data_key(c);
    return DDP_SUCCESS;
}

/* Phase 3: the transports listen and publish their addresses before this rank counts itself in. */
_DDP_PRIVATE ddp_result_t _ddp_rendezvous_transports(ddp_comm_t *c, const char *forced) {
    char why_none[512] = "";
    int i;
    c->boot.hold_pub = 1;   /* their addresses go with the join (_ddp_rendezvous_wait) */
    for (i = 0; i < _ddp_ntransports && c->peers.ntinst < _DDP_MAX_TRANSPORTS; i++) {
        const ddp_transport_t *t = _ddp_transports[i];
        void *state = NULL;
        ddp_result_t r;
        /* DDP_TRANSPORT picks the host transport; a device one (NCCL) is for device buffers */
        if (forced && strcmp(forced, t->name) != 0 && !t->device) continue;
        c->init_probe = !forced;
        r = t->init(&c->tctx, &state);
        c->init_probe = 0;
        if (r != DDP_SUCCESS) {
            if (forced) { c->boot.hold_pub = c->boot.nheld = 0; return r; }
            /* One line, with the reason; the communicator goes on without it. */
            _DDP_LOG(c, DDP_LOG_WARN, "transport %s unavailable, using the others (%s): %s",
                     t->name, "DDP_TRANSPORT=auto", c->last_error);
            _ddp_strlcpy(why_none, c->last_error, sizeof why_none);
            c->last_error[0] = 0;   /* not this communicator's error: init goes on */
            continue;
        }
        c->peers.tinst[c->peers.ntinst].t = t;
        c->peers.tinst[c->peers.ntinst].state = state;
        c->peers.ntinst++;
    }
    if (c->peers.ntinst == 0 && c->eng.nranks > 1) {
        c->boot.hold_pub = c->boot.nheld = 0;
        return ddp_comm_fail(c, DDP_ERR_UNSUPPORTED, "init: no usable transport (%s)",
                             why_none[0] ? why_none : "none compiled in: include transports/ddp_tcp.h");
    }
    return DDP_SUCCESS;
}


/* "2 of 3 ranks joined after 30 s; still waiting for rank 2": said at WARN while the ready
 * wait lasts, by every waiting rank (and the rank hosting the store says so). */
_DDP_PRIVATE void _ddp_rendezvous_note(ddp_comm_t *c, int64_t waited_ms) {
    char missing[400];
    int nmissing = 0;
    const int hosts = c->boot.own_store && c->eng.rank == 0 && !_ddp_torchrun_agent_store() &&
                      !_ddp_store_by_launcher(c->boot.store);
    if (_ddp_rendezvous_absent(c, missing, sizeof missing, &nmissing) != DDP_SUCCESS)
        _DDP_LOG(c, DDP_LOG_WARN, "init: waiting %lld s for the rendezvous at %s:%d%s; the store does "
                 "not answer a query", (long long)(waited_ms / 1000), c->boot.master_addr, c->boot.master_port,
                 hosts ? " (this rank hosts the store)" : "");
    else if (nmissing)
        _DDP_LOG(c, DDP_LOG_WARN, "init: %d of %d ranks joined the rendezvous at %s:%d%s after %lld s; "
                 "still waiting for %s %s (check WORLD_SIZE and that every rank was started)",
                 c->eng.nranks - nmissing, c->eng.nranks, c->boot.master_addr, c->boot.master_port,
                 hosts ? " (hosted by this rank)" : "", (long long)(waited_ms / 1000),
                 _ddp_ranks_word(nmissing), missing);
}

/* Phase 4a: one batch: the addresses the transports published (held until now), this rank's
 * bit in its group's join mask (a sum of distinct powers of two is their OR: a rendezvous that
 * lasts names the missing ranks from a few reads, not one per rank), rank 0's communicator
 * identity, then the count. The last rank to count in says the rendezvous is ready (so the
 * identity is there by then). */
_DDP_PRIVATE ddp_result_t _ddp_rendezvous_join(ddp_comm_t *c, const char *k_ready) {
    char key[256], k_mask[256], k_id[256];
    unsigned char ident[8 + _DDP_AUTH_KEY_BYTES];
    ddp_store_op_t ops[11];
    int n = _ddp_comm_held_ops(c, ops, 8);
    ddp_result_t r;
    memset(&ops[n], 0, sizeof ops[0] * 3);
    _ddp_key(c, k_mask, sizeof k_mask, "joinmask/%d", c->eng.rank / _DDP_JOINMASK_BITS);
    ops[n].kind = DDP_STORE_OP_ADD; ops[n].key = k_mask;
    ops[n++].delta = (int64_t)1 << (c->eng.rank % _DDP_JOINMASK_BITS);
    if (c->eng.rank == 0) {
        memcpy(ident, &c->tctx.comm_id, 8);
        memcpy(ident + 8, c->boot.token, sizeof c->boot.token);
        _ddp_key(c, k_id, sizeof k_id, "comm_id");
        ops[n].kind = DDP_STORE_OP_SET; ops[n].key = k_id;
        ops[n].value = ident; ops[n++].len = sizeof ident;
    }
    _ddp_key(c, key, sizeof key, "joined");
    ops[n].kind = DDP_STORE_OP_ADD; ops[n].key = key; ops[n].delta = 1;
    c->boot.hold_pub = c->boot.nheld = 0;
    r = ddp_store_batch(c->boot.store, ops, n + 1);
    if (c->eng.rank == 0) _ddp_auth_wipe(ident, sizeof ident);
    if (r != DDP_SUCCESS)
        return ddp_comm_fail(c, r, "init: rendezvous: %s", ddp_store_last_error(c->boot.store));
    _DDP_LOG(c, DDP_LOG_INFO, "joined rendezvous at %s:%d as rank %d of %d (%lld joined so far)",
             c->boot.master_addr, c->boot.master_port, c->eng.rank, c->eng.nranks, (long long)ops[n].num);
    if (ops[n].num == c->eng.nranks && (r = ddp_store_set(c->boot.store, k_ready, "1", 1)) != DDP_SUCCESS)
        return ddp_comm_fail(c, r, "init: rendezvous: %s", ddp_store_last_error(c->boot.store));
    return DDP_SUCCESS;
}

/* Phase 5 (ranks but 0): the communicator's identity that rank 0 drew (len bytes of ident,
 * read with the ready wait; found 0: not there then, so it is read now). */
_DDP_PRIVATE ddp_result_t _ddp_rendezvous_identity(ddp_comm_t *c, unsigned char *ident, size_t len, int found) {
    const size_t want = 8 + _DDP_AUTH_KEY_BYTES;
    char key[256];
    ddp_result_t r;
    if (!found) {
        _ddp_key(c, key, sizeof key, "comm_id");
        if ((r = ddp_store_get(c->boot.store, key, ident, want, &len)) != DDP_SUCCESS)
            return ddp_comm_fail(c, r, "init: rendezvous: %s", ddp_store_last_error(c->boot.store));
    }
    if (len != want)
        return ddp_comm_fail(c, DDP_ERR_MISMATCH, "init: rendezvous: the communicator's identity "
                             "has %zu bytes, expected %zu (mixed libddp versions?)", len, want);
    memcpy(&c->tctx.comm_id, ident, 8);
    memcpy(c->boot.token, ident + 8, sizeof c->boot.token);
    _ddp_auth_wipe(ident, want);
    _ddp_derive_data_key(c);
    return DDP_SUCCESS;
}

/* Phase 4b: wait until every rank has counted in (or one aborted the rendezvous), in slices
 * that say who is missing. Each slice is one batch: the wait, whether it was an abort, and (ranks
 * but 0) the communicator's identity, there once the rendezvous is ready (rank 0 publishes it
 * before it counts in): the answers of all three in one round trip. */
_DDP_PRIVATE ddp_result_t _ddp_rendezvous_wait(ddp_comm_t *c) {
    char k_ready[256], k_abort[256], k_id[256];
    const char *keys[2];
    unsigned char ident[8 + _DDP_AUTH_KEY_BYTES];
    ddp_store_op_t ops[3];
    int64_t t0 = _ddp_now_us(), waited_ms = 0;
    int keep = c->eng.timeout_ms / 10;
    ddp_result_t r;
    _ddp_key(c, k_ready, sizeof k_ready, "ready");
    _ddp_key(c, k_abort, sizeof k_abort, "abort");
    _ddp_key(c, k_id, sizeof k_id, "comm_id");
    keys[0] = k_ready; keys[1] = k_abort;
    if ((r = _ddp_rendezvous_join(c, k_ready)) != DDP_SUCCESS) return r;
    /* A slice of the deadline is kept to ask who is missing (a tenth, 100 ms to 1 s). */
    keep = keep < 100 ? 100 : keep > 1000 ? 1000 : keep;
    for (;;) {
        const int left = _ddp_init_ms_left(c, keep);
        const int64_t note = _ddp_next_wait_note_ms(waited_ms) - waited_ms;
        const int slice = left >= 0 && left <= note ? left : (int)(note < 1 ? 1 : note);
        memset(ops, 0, sizeof ops);
        ops[0].kind = DDP_STORE_OP_WAIT; ops[0].keys = keys; ops[0].nkeys = 2; ops[0].any = 1;
        ops[1].kind = DDP_STORE_OP_CHECK; ops[1].key = k_abort;
        ops[2].kind = DDP_STORE_OP_GET_IF_SET; ops[2].key = k_id; ops[2].out = ident; ops[2].cap = sizeof ident;
        r = _ddp_store_batch_for(c->boot.store, ops, c->eng.rank ? 3 : 2, slice);
        waited_ms = (_ddp_now_us() - t0) / 1000;
        if (r != DDP_ERR_TIMEOUT || slice == left) break;
        _ddp_rendezvous_note(c, waited_ms);   /* the wait goes on: say for whom */
    }
    if (r == DDP_ERR_TIMEOUT) {
        /* A store init did not open is bounded only while it is asked who is missing. */
        if (!c->boot.own_store && c->boot.init_deadline_us) _ddp_store_bound(c->boot.store, c->boot.init_deadline_us);
        r = _ddp_rendezvous_missing(c);
        if (!c->boot.own_store) _ddp_store_bound(c->boot.store, 0);
        return r;
    }
    if (r != DDP_SUCCESS) return ddp_comm_fail(c, r, "init: rendezvous: %s", ddp_store_last_error(c->boot.store));
    if (ops[1].num) {
        char why[512];
        size_t len = 0;
        _ddp_auth_wipe(ident, sizeof ident);
        ddp_store_get(c->boot.store, k_abort, why, sizeof why - 1, &len);
        why[len < sizeof why ? len : sizeof why - 1] = 0;
        return ddp_comm_fail(c, DDP_ERR_REMOTE, "init: rendezvous aborted by another rank: %s", why);
    }
    return c->eng.rank ? _ddp_rendezvous_identity(c, ident, ops[2].out_len, ops[2].num != 0) : DDP_SUCCESS;
}

/* Phase 6: every rank's host, for local rank/size and for transports that reach same-host peers
 * only, and the CPUs this host's ranks may use together (the union of their affinity masks: a
 * launcher that binds each rank to its own core, as mpirun does, leaves each one CPU, yet the
 * ranks are not oversubscribed). Rank 0 collects the table once and publishes it whole; everyone
 * else reads one value: O(n) store requests in all instead of every rank asking for every host
 * (O(n^2): a million requests at 1,024 ranks). */
_DDP_PRIVATE ddp_result_t _ddp_rendezvous_table(ddp_comm_t *c, unsigned char *table, size_t bytes) {
    char key[256];
    size_t len = 0;
    int i;
    ddp_result_t r;
    _ddp_key(c, key, sizeof key, "hosts");
    if (c->eng.rank == 0) {
        for (i = 0; i < c->eng.nranks; i++) {
            char hk[256];
            _ddp_key(c, hk, sizeof hk, "host/%d", i);
            len = 0;
            if ((r = ddp_store_get(c->boot.store, hk, table + (size_t)i * _DDP_HOST_ENTRY, _DDP_HOST_ENTRY, &len)) != DDP_SUCCESS)
                return ddp_comm_fail(c, r, "init: rendezvous: %s", ddp_store_last_error(c->boot.store));
            if (len != _DDP_HOST_ENTRY)
                return ddp_comm_fail(c, DDP_ERR_MISMATCH, "init: rendezvous: rank %d's host entry has %zu "
                                     "bytes, expected %d (mixed libddp versions?)", i, len, _DDP_HOST_ENTRY);
        }
        r = ddp_store_set(c->boot.store, key, table, bytes);
    } else {
        r = ddp_store_get(c->boot.store, key, table, bytes, &len);
        if (r == DDP_SUCCESS && len != bytes)
            return ddp_comm_fail(c, DDP_ERR_MISMATCH, "init: rendezvous: the host table has %zu bytes, "
                                 "expected %zu", len, bytes);
    }
    if (r != DDP_SUCCESS) return ddp_comm_fail(c, r, "init: rendezvous: %s", ddp_store_last_error(c->boot.store));
    return DDP_SUCCESS;
}

_DDP_PRIVATE ddp_result_t _ddp_rendezvous_hosts(ddp_comm_t *c, const char *host) {
    const size_t bytes = (size_t)c->eng.nranks * _DDP_HOST_ENTRY;
    unsigned char *table, cpus[_DDP_CPU_MASK_BYTES];
    int i, k, lr = 0, ls = 0;
    ddp_result_t r;
    c->boot.host_ids = (char *)_ddp_calloc(&c->alloc, (size_t)c->eng.nranks * _DDP_HOST_ID_LEN);
    table = (unsigned char *)_ddp_calloc(&c->alloc, bytes);
    if (!c->boot.host_ids || !table) {
        _ddp_free(&c->alloc, table);
        return ddp_comm_fail(c, DDP_ERR_OUT_OF_MEMORY, "init: host table");
    }
    if ((r = _ddp_rendezvous_table(c, table, bytes)) != DDP_SUCCESS) {
        _ddp_free(&c->alloc, table);
        return r;
    }
    memset(cpus, 0, sizeof cpus);
    for (i = 0; i < c->eng.nranks; i++) {
        const unsigned char *e = table + (size_t)i * _DDP_HOST_ENTRY;
        char *h = c->boot.host_ids + (size_t)i * _DDP_HOST_ID_LEN;
        memcpy(h, e, _DDP_HOST_ID_LEN - 1);
        h[_DDP_HOST_ID_LEN - 1] = 0;
        if (strcmp(h, host) != 0) continue;
        if (i < c->eng.rank) lr++;
        ls++;
        for (k = 0; k < _DDP_CPU_MASK_BYTES; k++) cpus[k] = (unsigned char)(cpus[k] | e[_DDP_HOST_ID_LEN + k]);
    }
    _ddp_free(&c->alloc, table);
    if (c->boot.local_rank < 0) c->boot.local_rank = lr;
    if (c->boot.local_size < 0) c->boot.local_size = ls;
    c->tctx.host_cpus = _ddp_cpu_mask_count(cpus);
    /* Across hosts without a secret the store and the token are readable by anyone who can
     * reach MASTER_PORT: say so once (rank 0), with the fix. */
    if (c->eng.rank == 0 && c->boot.store && !c->boot.store->keylen) {
        int other = 0;
        for (i = 1; i < c->eng.nranks && !other; i++)
            other = strcmp(c->boot.host_ids + (size_t)i * _DDP_HOST_ID_LEN, c->boot.host_ids) != 0;
        if (other)
            _DDP_LOG(c, DDP_LOG_WARN, "ranks span several hosts and no job secret is set: anyone who "
                     "can reach %s:%d can read the rendezvous store, join this job and see or alter "
                     "its data; set the same DDP_JOB_SECRET on every rank (ddprun makes one per job) "
                     "or desc.job_secret", c->boot.master_addr, c->boot.master_port);
    }
    return DDP_SUCCESS;
}

_DDP_PRIVATE ddp_result_t _ddp_rendezvous(ddp_comm_t *c, const char *forced) {
    char host[_DDP_HOST_ID_LEN];
    ddp_result_t r;
    c->tctx.key_from_secret = c->boot.store && c->boot.store->keylen;   /* before any transport's init */
    _ddp_host_id(host, sizeof host);
    if ((r = _ddp_rendezvous_job(c)) != DDP_SUCCESS ||
        (r = _ddp_rendezvous_register(c, host)) != DDP_SUCCESS ||
        (r = _ddp_rendezvous_transports(c, forced)) != DDP_SUCCESS ||
        (r = _ddp_rendezvous_wait(c)) != DDP_SUCCESS)
        return r;
    return _ddp_rendezvous_hosts(c, host);
}

#endif /* DDP_RENDEZVOUS_IMPLEMENTATION */
