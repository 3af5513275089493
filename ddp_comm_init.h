/* SPDX-License-Identifier: MIT (see LICENSE) */
/* ddp_comm_init.h — bootstrap, private: the ranks from the environment and launchers, settings,
 * the store, the rendezvous (ddp_rendezvous.h), the transport per peer, the host layout and the
 * cost model, device setup, async lanes; ddp_comm_init, ddp_comm_init_threads (threads as
 * ranks), ddp_comm_init_env and ddp_comm_destroy.
 *
 * Depends on ddp_rendezvous.h and ddp_health.h (which brings ddp_comm_queue.h). Built by DDP_IMPLEMENTATION (or
 * DDP_COMM_INIT_IMPLEMENTATION).
 */
#if defined(DDP_IMPLEMENTATION) && !defined(DDP_COMM_INIT_IMPLEMENTATION)
#define DDP_COMM_INIT_IMPLEMENTATION
#endif
#if defined(DDP_COMM_INIT_IMPLEMENTATION)
#ifndef DDP_RENDEZVOUS_IMPLEMENTATION
#define DDP_RENDEZVOUS_IMPLEMENTATION
#endif
#ifndef DDP_HEALTH_IMPLEMENTATION
#define DDP_HEALTH_IMPLEMENTATION
#endif
#endif
#include "ddp_rendezvous.h"
#include "ddp_health.h"

/* ============================================================================================
 * IMPLEMENTATION
 * ========================================================================================== */
#if defined(DDP_COMM_INIT_IMPLEMENTATION) && !defined(DDP_COMM_INIT_IMPL_INCLUDED)
#define DDP_COMM_INIT_IMPL_INCLUDED
#if !defined(DDP_RENDEZVOUS_IMPL_INCLUDED) || !defined(DDP_HEALTH_IMPL_INCLUDED)
#error "libddp: ddp_comm_init.h's implementation needs those of the headers below it (define DDP_IMPLEMENTATION)"
#endif

#ifdef __cplusplus
extern "C" {   /* the public calls defined here: C linkage, as ddp_comm.h declares them */
#endif

/* The last failed ddp_comm_init* of this thread: there is no communicator to ask. */
static __thread char _ddp_init_error[1024];
DDP_API const char *ddp_last_init_error(void) { return _ddp_init_error; }

typedef struct {
    int rank, nranks, local_rank, local_size;
    char err[256];
} _ddp_env_ranks_t;

/* torchrun's names first, then Open MPI, PMI (MPICH/Intel MPI), Slurm. */
_DDP_PRIVATE ddp_result_t _ddp_ranks_from_env(_ddp_env_ranks_t *e) {
    static const char *const sets[][4] = {
        {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"},
        {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"},
        {"PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"},
        {"SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE"},
    };
    size_t i;
    e->local_rank = e->local_size = -1;
    for (i = 0; i < sizeof sets / sizeof sets[0]; i++) {
        long r, n, v;
        int hr = _ddp_env_int(sets[i][0], 0, INT_MAX - 1, &r);
        int hn = _ddp_env_int(sets[i][1], 1, INT_MAX, &n);
        if (hr == 0 && hn == 0) continue;
        if (hr < 0) { snprintf(e->err, sizeof e->err, "%s='%s' is not a rank (a whole number >= 0)", sets[i][0], getenv(sets[i][0])); return DDP_ERR_INVALID_ARGUMENT; }
        if (hn < 0) { snprintf(e->err, sizeof e->err, "%s='%s' is not a world size (a whole number >= 1)", sets[i][1], getenv(sets[i][1])); return DDP_ERR_INVALID_ARGUMENT; }
        if (hr == 0) { snprintf(e->err, sizeof e->err, "%s is set but %s is missing", sets[i][1], sets[i][0]); return DDP_ERR_INVALID_ARGUMENT; }
        if (hn == 0) { snprintf(e->err, sizeof e->err, "%s is set but %s is missing", sets[i][0], sets[i][1]); return DDP_ERR_INVALID_ARGUMENT; }
        if (r >= n) { snprintf(e->err, sizeof e->err, "%s=%ld is not below %s=%ld", sets[i][0], r, sets[i][1], n); return DDP_ERR_INVALID_ARGUMENT; }
        e->rank = (int)r;
        e->nranks = (int)n;
        if (_ddp_env_int(sets[i][2], 0, INT_MAX, &v) == 1) e->local_rank = (int)v;
        if (_ddp_env_int(sets[i][3], 1, INT_MAX, &v) == 1) e->local_size = (int)v;
        return DDP_SUCCESS;
    }
    snprintf(e->err, sizeof e->err, "no rank in the environment");
    return DDP_ERR_UNSUPPORTED;   /* the caller makes it a world of one */
}

/* What a communicator made from another one (an async lane, a split's child) takes from it;
 * all zero for ddp_comm_init. */
typedef struct {
    int is_lane;                /* a lane: never runs device calls, no lanes of its own */
    void **dev_inherited;       /* the device communicator of a split (adopted: set to NULL) */
    const int *split_hosts;     /* a split of a DDP_TEST_HOSTS layout: the members' host numbers,
                                 * in the new ranks' order */
    int rendezvous_ms;          /* > 0: the rendezvous' bound, instead of the timeout (a grow:
                                 * a joiner lost meanwhile must not hold the members long) */
    int no_health;              /* no health thread: a split, threads as ranks (their processes
                                 * are watched through the communicator they came from) */
} _ddp_parent_t;

_DDP_PRIVATE ddp_result_t _ddp_comm_init(ddp_comm_t **out, int nranks, int rank, const ddp_comm_desc_t *d,
                                         const _ddp_parent_t *from);

/* The settings of a communicator made from c (a split's or a shrink's child): c's store under
 * prefix, its transport, timeout, segment size, wait policy, allocator and log. */
_DDP_PRIVATE void _ddp_child_desc(const ddp_comm_t *c, const char *prefix, ddp_comm_desc_t *d) {
    memset(d, 0, sizeof *d);
    d->master_addr = c->boot.master_addr;
    d->master_port = c->boot.master_port;
    d->timeout_ms = c->eng.timeout_ms;
    d->socket_ifname = c->boot.ifname[0] ? c->boot.ifname : NULL;
    d->store = c->boot.store;
    d->store_prefix = prefix;
    d->transport = c->peers.transport_name[0] ? c->peers.transport_name : NULL;   /* as the parent's */
    d->segment_bytes = c->eng.segment_bytes;
    d->deterministic = c->choice.deterministic ? 1 : -1;
    d->spin_us = c->eng.spin_us ? c->eng.spin_us : -1;
    d->log_level = c->eng.log_level + 1;
    d->allocator = c->alloc.alloc ? &c->alloc : NULL;
    d->log_fn = c->log.fn;   /* the child logs where its parent does */
    d->log_user = c->log.user;
}

DDP_API ddp_result_t ddp_comm_init(ddp_comm_t **out, int nranks, int rank, const ddp_comm_desc_t *d) {
    _ddp_parent_t none;
    memset(&none, 0, sizeof none);
    return _ddp_comm_init(out, nranks, rank, d, &none);
}

/* Step 1: settings from the desc, else the environment, else measured defaults; the bounded
 * scratch and per-peer tables (the only allocations sized by the world). */
/* ---- the launcher's job: what keeps two jobs on one host apart
 * The job's identity as its launcher names it: torchrun's run id, Slurm's job and step, Open
 * MPI's job (PMIx namespace); "" when none says. */
_DDP_PRIVATE void _ddp_job_identity(char *out, size_t cap) {
    const char *v;
    out[0] = 0;
    if ((v = getenv("DDP_JOB_ID")) && *v) snprintf(out, cap, "%.120s", v);
    else if ((v = getenv("TORCHELASTIC_RUN_ID")) && *v && getenv("TORCHELASTIC_RESTART_COUNT"))
        snprintf(out, cap, "torchrun:%.100s/attempt_%.16s", v, getenv("TORCHELASTIC_RESTART_COUNT"));
    else if ((v = getenv("SLURM_JOB_ID")) && *v && getenv("SLURM_PROCID"))
        snprintf(out, cap, "slurm:%.40s.%.40s", v, getenv("SLURM_STEP_ID") ? getenv("SLURM_STEP_ID") : "0");
    else if ((v = getenv("PMIX_NAMESPACE")) && *v) snprintf(out, cap, "pmix:%.100s", v);
    else if ((v = getenv("OMPI_MCA_ess_base_jobid")) && *v) snprintf(out, cap, "ompi:%.100s", v);
    else if ((v = getenv("PMI_KVSNAME")) && *v) snprintf(out, cap, "pmi:%.100s", v);
}

/* The first host of a Slurm node list ("node[07-09,12],login1" -> "node07"); 0 if none. */
_DDP_PRIVATE int _ddp_slurm_first_host(const char *list, char *out, size_t cap) {
    size_t n = 0;
    const char *p = list;
    if (!list || !*list || cap < 2) return 0;
    while (*p && *p != ',' && *p != '[' && n + 1 < cap) out[n++] = *p++;
    if (*p == '[') {
        p++;
        while (*p >= '0' && *p <= '9' && n + 1 < cap) out[n++] = *p++;
    }
    out[n] = 0;
    return n > 0;
}

/* Settings, part 1: logging, timeout, spinning, segments, the algorithm and its crossover,
 * async lanes: desc first, then DDP_* variables, then defaults. */
_DDP_PRIVATE ddp_result_t _ddp_init_tuning(ddp_comm_t *c, const ddp_comm_desc_t *d) {
    const int nranks = c->eng.nranks;
    const char *s;
    long v;
    c->eng.log_level = d->log_level ? d->log_level - 1 : _ddp_log_level_from_env();
    c->log.fn = d->log_fn;
    c->log.user = d->log_user;
    if (!d->log_fn && (s = getenv("DDP_DEBUG_FILE")) && *s) _ddp_log_open_file(c, s);
    s = getenv("DDP_DEBUG");
    if (!d->log_level && s && _ddp_log_level_parse(s) < 0)
        _DDP_LOG(c, DDP_LOG_WARN, "DDP_DEBUG='%s' is not a level: NONE, WARN, INFO, TRACE or VERSION "
                 "(NCCL_DEBUG's names); WARN is in force", s);
    else if (!d->log_level && s && !strcasecmp(s, "VERSION") && c->eng.rank == 0)
        _DDP_LOG(c, DDP_LOG_WARN, "libddp %d.%d", DDP_VERSION_MAJOR, DDP_VERSION_MINOR);
    c->eng.timeout_ms = d->timeout_ms ? d->timeout_ms : _ddp_env_timeout_ms();
    s = getenv("DDP_TIMEOUT_MS");
    if (!d->timeout_ms && s && _ddp_parse_long(s, -1, INT_MAX, &v) != 0)
        return ddp_comm_fail(c, DDP_ERR_INVALID_ARGUMENT, "init: DDP_TIMEOUT_MS='%s' is not a "
                             "number of milliseconds", s);
    c->eng.spin_us = d->spin_us ? d->spin_us : -2;
    if (c->eng.spin_us == -2) {
        s = getenv("DDP_SPIN_US");
        /* Measured (README): polling with sched_yield beats sleeping at once even with 4 ranks
         * on 2 CPUs, because the yield hands the CPU to the peer we wait for. */
        c->eng.spin_us = (s && _ddp_parse_long(s, -1, 10000000, &v) == 0) ? (int)v : _DDP_DEFAULT_SPIN_US;
    }
    if (c->eng.spin_us < 0) c->eng.spin_us = 0;
    c->eng.segment_bytes = d->segment_bytes ? d->segment_bytes : _ddp_parse_size(getenv("DDP_SEGMENT_BYTES"));
    if (!c->eng.segment_bytes) c->eng.segment_bytes = 512u << 10;
    if (c->eng.segment_bytes < 4096) c->eng.segment_bytes = 4096;
    if (c->eng.segment_bytes > (64u << 20)) c->eng.segment_bytes = 64u << 20;
    c->eng.segment_bytes &= ~(size_t)63;
    s = getenv("DDP_ALGO");
    c->choice.algo = !s || !*s || !strcmp(s, "auto") ? _DDP_ALGO_AUTO : !strcmp(s, "hier") ? _DDP_ALGO_HIER
            : 1 + _ddp_ar_algo_parse(s);
    if (c->choice.algo < 0 || (c->choice.algo == 0 && s && *s && strcmp(s, "auto")))
        return ddp_comm_fail(c, DDP_ERR_INVALID_ARGUMENT, "init: DDP_ALGO='%s': expected auto, ring, rd, "
                             "rabenseifner, hier, hier_ring, hier_rd or hier_rabenseifner", s);
    /* Measured crossover (README, bench/): below it the ring's 2(p-1) hops cost more than
     * recursive doubling's extra bytes. */
    c->choice.rd_max_bytes = _ddp_parse_size(getenv("DDP_RD_MAX_BYTES"));
    if (!c->choice.rd_max_bytes)
        c->choice.rd_max_bytes = nranks == 2 ? _DDP_RD_MAX_BYTES_P2
                        : (nranks & (nranks - 1)) == 0 ? _DDP_RD_MAX_BYTES_POW2 : _DDP_RD_MAX_BYTES_FOLDED;
    s = getenv("DDP_DETERMINISTIC");
    c->choice.deterministic = d->deterministic > 0;
    if (!d->deterministic && s && *s) {
        long det = 0;
        if (_ddp_parse_long(s, 0, 1, &det) != 0)
            return ddp_comm_fail(c, DDP_ERR_INVALID_ARGUMENT, "init: DDP_DETERMINISTIC='%s': expected 0 or 1", s);
        c->choice.deterministic = det == 1;
    }
    s = getenv("DDP_ASYNC_LANES");
    c->queue.want_lanes = (s && _ddp_parse_long(s, 1, _DDP_MAX_LANES, &v) == 0) ? (int)v : _DDP_DEFAULT_LANES;
    c->queue.lane_min_bytes = _ddp_parse_size(getenv("DDP_LANE_MIN_BYTES"));
    if (!c->queue.lane_min_bytes) c->queue.lane_min_bytes = _DDP_LANE_MIN_BYTES;
    return DDP_SUCCESS;
}

/* Settings, part 2: where the rendezvous is: MASTER_ADDR (else Slurm's first host, else this
 * host) and MASTER_PORT (else one derived from the job's identity, else the default). */
_DDP_PRIVATE ddp_result_t _ddp_init_master(ddp_comm_t *c, const ddp_comm_desc_t *d) {
    const int nranks = c->eng.nranks;
    const char *s = d->master_addr ? d->master_addr : getenv("MASTER_ADDR");
    long v;
    int i;
    if (s && *s) {
        _ddp_strlcpy(c->boot.master_addr, s, sizeof c->boot.master_addr);
    } else if (getenv("SLURM_PROCID") &&
               (_ddp_slurm_first_host(getenv("SLURM_STEP_NODELIST"), c->boot.master_addr, sizeof c->boot.master_addr) ||
                _ddp_slurm_first_host(getenv("SLURM_JOB_NODELIST"), c->boot.master_addr, sizeof c->boot.master_addr))) {
        _DDP_LOG(c, DDP_LOG_INFO, "init: master %s: the first host of Slurm's node list (MASTER_ADDR unset)",
                 c->boot.master_addr);
    } else {
        _ddp_strlcpy(c->boot.master_addr, "127.0.0.1", sizeof c->boot.master_addr);
    }
    if (d->master_port) {
        c->boot.master_port = d->master_port;
    } else if ((i = _ddp_env_int("MASTER_PORT", 1, 65535, &v)) == 1) {
        c->boot.master_port = (int)v;
    } else if (i < 0) {
        return ddp_comm_fail(c, DDP_ERR_INVALID_ARGUMENT, "init: MASTER_PORT='%s' is not a port "
                             "number (1..65535)", getenv("MASTER_PORT"));
    } else if (nranks == 1 && !d->store) {
        c->boot.master_port = 0;   /* nobody else connects: a port the kernel picks, never a clash */
    } else if (c->boot.job[0]) {
        /* mpirun and srun set no MASTER_PORT: every job on a host would meet on 29500. A port
         * from the job's identity (20000..31999, below Linux's ephemeral range) keeps them
         * apart; the rendezvous still refuses a rank of another job (same port by chance). */
        c->boot.master_port = 20000 + (int)(_ddp_fnv1a(c->boot.job, strlen(c->boot.job), _DDP_FNV_INIT) % 12000u);
        _DDP_LOG(c, DDP_LOG_INFO, "init: master port %d derived from the job's identity %s "
                 "(MASTER_PORT unset)", c->boot.master_port, c->boot.job);
    } else {
        c->boot.master_port = _DDP_DEFAULT_PORT;
    }
    if ((c->boot.master_port < 1 && !(nranks == 1 && c->boot.master_port == 0)) || c->boot.master_port > 65535)
        return ddp_comm_fail(c, DDP_ERR_INVALID_ARGUMENT, "init: master port %d out of range", c->boot.master_port);
    return DDP_SUCCESS;
}

/* Settings, part 3: a host transport forced by desc.transport or DDP_TRANSPORT, which must be
 * compiled in; NULL is "auto". */
_DDP_PRIVATE ddp_result_t _ddp_init_forced_transport(ddp_comm_t *c, const ddp_comm_desc_t *d, const char **forced_out) {
    const char *forced = d->transport ? d->transport : getenv("DDP_TRANSPORT");
    int i;
    if (forced && (!*forced || !strcmp(forced, "auto"))) forced = NULL;
    if (forced) _ddp_strlcpy(c->peers.transport_name, forced, sizeof c->peers.transport_name);
    if (forced && !ddp_transport_find(forced)) {
        char names[128] = "";
        size_t off = 0;
        for (i = 0; i < _ddp_ntransports && off + 16 < sizeof names; i++)
            off += (size_t)snprintf(names + off, sizeof names - off, "%s%s", i ? ", " : "", _ddp_transports[i]->name);
        return ddp_comm_fail(c, DDP_ERR_UNSUPPORTED, "init: transport '%s' is not compiled into "
                             "this program (compiled in: %s; include transports/ddp_%s.h)", forced,
                             off ? names : "none", forced);
    }
    *forced_out = forced;
    return DDP_SUCCESS;
}

_DDP_PRIVATE ddp_result_t _ddp_init_settings(ddp_comm_t *c, const ddp_comm_desc_t *d, const char **forced_out) {
    const int nranks = c->eng.nranks;
    const char *s, *forced = NULL;
    ddp_result_t r;
    int i;
    if ((r = _ddp_init_tuning(c, d)) != DDP_SUCCESS) return r;
    _ddp_strlcpy(c->boot.prefix, d->store_prefix ? d->store_prefix : "ddp", sizeof c->boot.prefix);
    s = d->socket_ifname ? d->socket_ifname : getenv("DDP_SOCKET_IFNAME");
    _ddp_strlcpy(c->boot.ifname, s ? s : "", sizeof c->boot.ifname);
    _ddp_job_identity(c->boot.job, sizeof c->boot.job);
    if ((r = _ddp_init_master(c, d)) != DDP_SUCCESS || (r = _ddp_init_forced_transport(c, d, &forced)) != DDP_SUCCESS)
        return r;
    c->peers.by_rank = (_ddp_peer_t *)_ddp_calloc(&c->alloc, sizeof *c->peers.by_rank * (size_t)nranks);
    c->group.p2p = (uint32_t *)_ddp_calloc(&c->alloc, sizeof *c->group.p2p * 4 * (size_t)nranks);
    c->eng.scratch_bytes = c->eng.segment_bytes * _DDP_MAX_SLOTS;
    c->eng.scratch = (unsigned char *)_ddp_alloc(&c->alloc, c->eng.scratch_bytes);
    if (!c->peers.by_rank || !c->eng.scratch || !c->group.p2p) return ddp_comm_fail(c, DDP_ERR_OUT_OF_MEMORY, "init: allocating");
    for (i = 0; i < nranks; i++) c->peers.by_rank[i].tinst = -1;
    _DDP_LOG(c, DDP_LOG_INFO, "libddp %d.%d: rank %d of %d, master %s:%d, timeout %d ms, spin %d us, "
             "segment %zu bytes, transport %s, DDP_ALGO %s, async lanes %d", DDP_VERSION_MAJOR,
             DDP_VERSION_MINOR, c->eng.rank, nranks, c->boot.master_addr, c->boot.master_port, c->eng.timeout_ms,
             c->eng.spin_us, c->eng.segment_bytes, forced ? forced : "auto",
             getenv("DDP_ALGO") && *getenv("DDP_ALGO") ? getenv("DDP_ALGO") : "auto", c->queue.want_lanes);
    *forced_out = forced;
    return DDP_SUCCESS;
}

/* Keys of this attempt under libddp/<run id>/attempt_<n>/ unless the caller chose a prefix: a
 * store that outlives the ranks (torchrun's agent's, ddprun's) may serve several attempts. */
_DDP_PRIVATE void _ddp_init_attempt_prefix(ddp_comm_t *c, const ddp_comm_desc_t *d) {
    const char *run = getenv("TORCHELASTIC_RUN_ID"), *att = getenv("TORCHELASTIC_RESTART_COUNT");
    if (!d->store_prefix)
        snprintf(c->boot.prefix, sizeof c->boot.prefix, "libddp/%.40s/attempt_%.16s", run ? run : "none",
                 att ? att : "0");
}

/* Opens this rank's handle of the job's store; *who: who serves it (for messages). */
_DDP_PRIVATE ddp_result_t _ddp_init_store_open(ddp_comm_t *c, const ddp_comm_desc_t *d, const ddp_store_desc_t *sd,
                                               const char **who) {
    char err[512] = "", lhost[256];
    int lport = 0;
    const int lr = _ddp_launcher_store(lhost, sizeof lhost, &lport);
    ddp_result_t r;
    if (lr < 0)
        return ddp_comm_fail(c, DDP_ERR_INVALID_ARGUMENT, "init: DDP_LAUNCHER_STORE='%.200s' is not "
                             "HOST:PORT", getenv("DDP_LAUNCHER_STORE"));
    if (lr > 0) {
        /* ddprun serves the store (libddp's protocol, the job secret): every rank is a client,
         * so losing any rank, rank 0 included, leaves the store to the others. */
        _ddp_init_attempt_prefix(c, d);
        _ddp_strlcpy(c->boot.master_addr, lhost, sizeof c->boot.master_addr);
        c->boot.master_port = lport;
        _DDP_LOG(c, DDP_LOG_INFO, "rendezvous through the launcher's store at %s:%d "
                 "(DDP_LAUNCHER_STORE), keys under %s/", lhost, lport, c->boot.prefix);
        *who = _DDP_LAUNCHER_HOST;
        if ((r = _ddp_store_open(&c->boot.store, lhost, lport, 0, sd, err, sizeof err)) != DDP_SUCCESS)
            return ddp_comm_fail(c, r, "init: the launcher's store (DDP_LAUNCHER_STORE=%.200s, served by "
                                 "ddprun, on several hosts by node 0's): %s", getenv("DDP_LAUNCHER_STORE"), err);
        return DDP_SUCCESS;
    }
    if (_ddp_torchrun_agent_store()) {
        /* torchrun (not --standalone) already serves a c10d TCPStore on MASTER_PORT: every
         * rank is a client of it. It outlives worker restarts. */
        _ddp_init_attempt_prefix(c, d);
        _DDP_LOG(c, DDP_LOG_INFO, "rendezvous through torchrun's agent store at %s:%d (c10d TCPStore "
                 "protocol, TORCHELASTIC_USE_AGENT_STORE=True), keys under %s/", c->boot.master_addr,
                 c->boot.master_port, c->boot.prefix);
        *who = "torchrun's agent";
        r = _ddp_store_connect_c10d(&c->boot.store, c->boot.master_addr, c->boot.master_port, sd, err, sizeof err);
    } else {
        *who = "rank 0";   /* mpirun, srun, torchrun --standalone: the store dies with rank 0 */
        r = _ddp_store_open(&c->boot.store, c->boot.master_addr, c->boot.master_port, c->eng.rank == 0, sd, err,
                            sizeof err);
    }
    return r == DDP_SUCCESS ? r : ddp_comm_fail(c, r, "init: %s", err);
}

/* Step 2: the store: the caller's (split, threads), else the launcher's (DDP_LAUNCHER_STORE), else
 * torchrun's agent's, else rank 0 serves MASTER_ADDR:PORT. */
_DDP_PRIVATE ddp_result_t _ddp_init_store(ddp_comm_t *c, const ddp_comm_desc_t *d) {
    ddp_store_desc_t sd;
    const char *who = "";
    ddp_result_t r;
    if (d->store) {
        c->boot.store = d->store;
        return DDP_SUCCESS;
    }
    memset(&sd, 0, sizeof sd);
    sd.timeout_ms = c->eng.timeout_ms;
    sd.secret = d->job_secret;
    sd.log_level = c->eng.log_level + 1;
    sd.log_rank = c->eng.rank + 1;
    if (c->log.fn || c->log_file) { sd.log_fn = _ddp_store_log_fwd; sd.log_user = c; }
    if ((r = _ddp_init_store_open(c, d, &sd, &who)) != DDP_SUCCESS) return r;
    _ddp_strlcpy(c->boot.store->hosted_by, who, sizeof c->boot.store->hosted_by);
    c->boot.own_store = 1;
    if (c->boot.master_port == 0) c->boot.master_port = ddp_store_port(c->boot.store);   /* world of one */
    /* Every request of this init ends by the rendezvous' deadline, not a timeout each. */
    if (c->boot.init_deadline_us) _ddp_store_bound(c->boot.store, c->boot.init_deadline_us);
    return DDP_SUCCESS;
}

/* Step 4: per peer, the highest-priority transport that reaches it (same rule on both sides,
 * so they agree without talking). */
_DDP_PRIVATE ddp_result_t _ddp_init_pick_transports(ddp_comm_t *c) {
    const int nranks = c->eng.nranks, rank = c->eng.rank;
    ddp_result_t r;
    int i;
    for (i = 0; i < nranks; i++) {
        int k, best = -1;
        if (i == rank) continue;
        for (k = 0; k < c->peers.ntinst; k++) {
            const ddp_transport_t *t = c->peers.tinst[k].t;
            if (t->reachable && !t->reachable(c->peers.tinst[k].state, i)) continue;
            if (best < 0 || t->priority > c->peers.tinst[best].t->priority) best = k;
        }
        if (best < 0) {
            r = ddp_comm_fail(c, DDP_ERR_UNSUPPORTED, "init: no transport reaches rank %d (host %s)",
                              i, _ddp_comm_host_id(c, i));
            return r;
        }
        c->peers.by_rank[i].tinst = best;
        _DDP_LOG(c, DDP_LOG_TRACE, "peer %d (host %s): transport %s", i, _ddp_comm_host_id(c, i),
                 c->peers.tinst[best].t->name);
    }
    return DDP_SUCCESS;
}

/* Step 5: one transport reaches everyone and can run the collectives itself (shared memory on
 * one host). A transport with its own setup (join) makes what its collectives need by itself,
 * in time linear in the ranks; any other needs every peer connected first. */
_DDP_PRIVATE ddp_result_t _ddp_init_coll_provider(ddp_comm_t *c) {
    const int nranks = c->eng.nranks, rank = c->eng.rank;
    const ddp_coll_provider_t *coll;
    void *state;
    ddp_result_t r;
    int k, same = c->peers.by_rank[rank == 0 ? 1 : 0].tinst;
    for (k = 0; k < nranks; k++) if (k != rank && c->peers.by_rank[k].tinst != same) same = -1;
    /* (Several hosts in the layout: DDP_TEST_HOSTS over one transport; the model decides.) */
    if (same < 0 || c->choice.algo != _DDP_ALGO_AUTO || c->choice.layout.nhosts != 1 ||
        !(coll = c->peers.tinst[same].t->coll) || !coll->enable)
        return DDP_SUCCESS;
    state = c->peers.tinst[same].state;
    r = coll->join ? coll->join(state) : _ddp_connect_peers(c, NULL, nranks);
    if (r == DDP_ERR_UNSUPPORTED && coll->join) return DDP_SUCCESS;
    if (r != DDP_SUCCESS) { _ddp_publish_failure(c); return r; }
    if (coll->enable(state) == DDP_SUCCESS) {
        c->choice.coll = coll;
        c->choice.coll_state = state;
    }
    return DDP_SUCCESS;
}

/* Step 6: the ring's neighbours and recursive doubling's partners, connected now (others on
 * first use). */
_DDP_PRIVATE ddp_result_t _ddp_init_connect_neighbours(ddp_comm_t *c) {
    const int nranks = c->eng.nranks, rank = c->eng.rank;
    ddp_result_t r;
    if (nranks > 1) {
        /* Ring neighbours, and the partners of recursive doubling: r ^ 2^i within the largest
         * power of two, r +- 2^k for the folded extra ranks. */
        int list[2 + 2 + 32], n = 0, p2 = 1, k, j;
        list[n++] = (rank + 1) % nranks;
        list[n++] = (rank + nranks - 1) % nranks;
        while (p2 * 2 <= nranks) p2 *= 2;
        if (rank >= p2) list[n++] = rank - p2;
        else {
            if (rank + p2 < nranks) list[n++] = rank + p2;
            for (k = 1; k < p2; k <<= 1) list[n++] = rank ^ k;
        }
        for (k = 0, j = 0; k < n; k++) {   /* dedupe */
            int seen = 0, m;
            for (m = 0; m < j; m++) if (list[m] == list[k]) seen = 1;
            if (!seen) list[j++] = list[k];
        }
        _DDP_LOG(c, DDP_LOG_INFO, "ring: send to rank %d via %s, receive from rank %d via %s; "
                 "%d peers connected in all", list[0], ddp_comm_transport_name(c, list[0]), list[1],
                 ddp_comm_transport_name(c, list[1]), j);
        if (c->choice.deterministic)
            _DDP_LOG(c, DDP_LOG_INFO, "deterministic (DDP_DETERMINISTIC): all_reduce, reduce_scatter and reduce add "
                     "every element in rank order, %s; DDP_ALGO does not change their bits",
                     c->choice.coll ? "as the transport's own collectives do"
                     : nranks > 2 ? "each at its owner (a direct reduce-scatter, then the ring's all-gather)"
                     : "which at 2 ranks is every algorithm's one addition");
        if (c->choice.coll)
            _DDP_LOG(c, DDP_LOG_INFO, "collectives: run by the %s transport itself (all %d ranks "
                     "reach each other through it); DDP_ALGO=ring or rd to use those instead",
                     c->peers.tinst[c->peers.by_rank[list[0]].tinst].t->name, nranks);
        else if (c->choice.algo == _DDP_ALGO_RD)
            _DDP_LOG(c, DDP_LOG_INFO, "all_reduce algorithm: recursive doubling up to the scratch size "
                     "(%zu bytes), ring above (DDP_ALGO)", c->eng.scratch_bytes);
        else if (c->choice.algo == 1 + _DDP_AR_HIER_RD)
            _DDP_LOG(c, DDP_LOG_INFO, "all_reduce algorithm: hierarchical, recursive doubling across "
                     "hosts while a slice fits the scratch (%zu bytes), Rabenseifner above (DDP_ALGO)",
                     c->eng.scratch_bytes);
        else if (c->choice.algo == _DDP_ALGO_HIER)
            _DDP_LOG(c, DDP_LOG_INFO, "all_reduce algorithm: hierarchical, across hosts as the cost "
                     "model picks (DDP_ALGO)");
        else if (c->choice.algo != _DDP_ALGO_AUTO)
            _DDP_LOG(c, DDP_LOG_INFO, "all_reduce algorithm: %s (DDP_ALGO)", _ddp_ar_long_names[c->choice.algo - 1]);
        else if (c->choice.layout.nhosts == 1)
            _DDP_LOG(c, DDP_LOG_INFO, "all_reduce algorithm: recursive doubling up to %zu bytes, "
                     "ring above (one host: measured thresholds; DDP_ALGO, DDP_RD_MAX_BYTES override)",
                     c->choice.rd_max_bytes);
        else
            _DDP_LOG(c, DDP_LOG_INFO, "all_reduce algorithm: by the cost model, per call size (%d hosts; "
                     "rank 0 logs the table; DDP_ALGO overrides)", c->choice.layout.nhosts);
        r = _ddp_connect_peers(c, list, j);
        if (r != DDP_SUCCESS) { _ddp_publish_failure(c); return r; }
    }
    return DDP_SUCCESS;
}

/* Step 6b: the hosts layout (from the host table, or DDP_TEST_HOSTS: a label per rank, for tests
 * of the hierarchical algorithms with ranks that are threads of one process) and this rank's
 * groups for the hierarchical all-reduce: the ranks of its host, and the ranks that have its
 * local number on the other hosts. Hosts are told apart by hashing (a million ranks: no n^2
 * string compares). split_hosts: a split's (_ddp_parent_t), else NULL. */
_DDP_PRIVATE ddp_result_t _ddp_init_layout(ddp_comm_t *c, const int *split_hosts) {
    const int n = c->eng.nranks, me = c->eng.rank;
    const char *labels = getenv("DDP_TEST_HOSTS");
    const char **key = NULL;
    int *lab_len = NULL, *host = NULL, *local = NULL, *count = NULL, *table = NULL;
    size_t tsize = 4, mask;
    int i, nhosts = 0, lmin = n, lmax = 0, nlocal, ninter;
    ddp_result_t r = DDP_SUCCESS;
    while (tsize < 2 * (size_t)n) tsize <<= 1;
    mask = tsize - 1;
    key = (const char **)_ddp_calloc(&c->alloc, sizeof *key * (size_t)n);
    lab_len = (int *)_ddp_calloc(&c->alloc, sizeof *lab_len * (size_t)n);
    host = (int *)_ddp_calloc(&c->alloc, sizeof *host * (size_t)n);
    local = (int *)_ddp_calloc(&c->alloc, sizeof *local * (size_t)n);
    count = (int *)_ddp_calloc(&c->alloc, sizeof *count * (size_t)n);
    table = (int *)_ddp_calloc(&c->alloc, sizeof *table * tsize);
    if (!key || !lab_len || !host || !local || !count || !table) {
        r = ddp_comm_fail(c, DDP_ERR_OUT_OF_MEMORY, "init: hosts layout (%d ranks)", n);
        goto done;
    }
    if (split_hosts) {   /* a split under DDP_TEST_HOSTS: the parent's layout */
        for (i = 0; i < n; i++) { key[i] = (const char *)&split_hosts[i]; lab_len[i] = (int)sizeof(int); }
    } else if (labels && *labels) {
        const char *q = labels;
        for (i = 0; i < n; i++) {
            key[i] = q;
            lab_len[i] = (int)strcspn(q, ",");
            q += lab_len[i];
            if (!lab_len[i] || (i < n - 1 && *q != ',')) break;
            if (*q == ',') q++;
        }
        if (i < n || *q) {
            r = ddp_comm_fail(c, DDP_ERR_INVALID_ARGUMENT, "init: DDP_TEST_HOSTS='%.200s': expected %d "
                              "comma-separated host labels, one per rank (none empty)", labels, n);
            goto done;
        }
    } else {
        for (i = 0; i < n; i++) {
            key[i] = c->boot.host_ids + (size_t)i * _DDP_HOST_ID_LEN;
            lab_len[i] = (int)strlen(key[i]);
        }
    }
    for (i = 0; i < (int)tsize; i++) table[i] = -1;
    for (i = 0; i < n; i++) {
        size_t h = (size_t)_ddp_fnv1a(key[i], (size_t)lab_len[i], _DDP_FNV_INIT) & mask;
        for (;; h = (h + 1) & mask) {
            const int j = table[h];
            if (j < 0) { table[h] = i; host[i] = nhosts++; break; }
            if (lab_len[j] == lab_len[i] && !memcmp(key[j], key[i], (size_t)lab_len[i])) { host[i] = host[j]; break; }
        }
        local[i] = count[host[i]]++;
    }
    for (i = 0; i < nhosts; i++) {
        if (count[i] < lmin) lmin = count[i];
        if (count[i] > lmax) lmax = count[i];
    }
    c->choice.layout.nranks = n;
    c->choice.layout.nhosts = nhosts;
    c->choice.layout.local_min = lmin;
    c->choice.layout.local_max = lmax;
    nlocal = count[host[me]];
    ninter = local[me] < lmin ? nhosts : 0;
    c->choice.hier_ranks = (int *)_ddp_calloc(&c->alloc, sizeof *c->choice.hier_ranks * (size_t)(nlocal + ninter + 1));
    if (!c->choice.hier_ranks) { r = ddp_comm_fail(c, DDP_ERR_OUT_OF_MEMORY, "init: hosts layout"); goto done; }
    c->choice.hier.local.ranks = c->choice.hier_ranks;
    c->choice.hier.inter.ranks = c->choice.hier_ranks + nlocal;
    c->choice.hier.local.n = c->choice.hier.inter.n = 0;
    for (i = 0; i < n; i++) {   /* both in rank order: every member makes the same list */
        if (host[i] == host[me]) {
            if (i == me) c->choice.hier.local.me = c->choice.hier.local.n;
            c->choice.hier_ranks[c->choice.hier.local.n++] = i;
        }
        if (ninter && local[i] == local[me]) {
            if (i == me) c->choice.hier.inter.me = c->choice.hier.inter.n;
            c->choice.hier_ranks[nlocal + c->choice.hier.inter.n++] = i;
        }
    }
    c->choice.hier.slices = lmin;
    c->choice.hier.nhosts = nhosts;
    c->choice.hier.nranks = n;
    if (split_hosts || (labels && *labels)) {   /* kept for this communicator's splits */
        if (!(c->choice.host_of = (int *)_ddp_calloc(&c->alloc, sizeof *c->choice.host_of * (size_t)n))) {
            r = ddp_comm_fail(c, DDP_ERR_OUT_OF_MEMORY, "init: hosts layout");
            goto done;
        }
        memcpy(c->choice.host_of, host, sizeof *host * (size_t)n);
        if (split_hosts)
            _DDP_LOG(c, DDP_LOG_INFO, "hosts: DDP_TEST_HOSTS: the parent communicator's test hosts");
        else
            _DDP_LOG(c, DDP_LOG_INFO, "hosts: DDP_TEST_HOSTS: this rank on test host '%.*s'", lab_len[me], key[me]);
    }
    _DDP_LOG(c, DDP_LOG_INFO, "hosts: %d ranks on %d host%s, %d to %d per host; this host's ranks: %d, "
             "local number %d%s", n, nhosts, nhosts == 1 ? "" : "s", lmin, lmax, nlocal, c->choice.hier.local.me,
             ninter ? "" : " (forwards only in the hierarchical all-reduce: more ranks here than on the "
             "smallest host)");
done:
    _ddp_free(&c->alloc, key);
    _ddp_free(&c->alloc, lab_len);
    _ddp_free(&c->alloc, host);
    _ddp_free(&c->alloc, local);
    _ddp_free(&c->alloc, count);
    _ddp_free(&c->alloc, table);
    return r;
}

/* Which algorithms can run a call of `bytes` here (recursive doubling exchanges whole buffers
 * through the scratch; the hierarchical ones need a host with two ranks to pay). */
_DDP_PRIVATE unsigned _ddp_ar_allowed(const ddp_comm_t *c, double bytes, int hier_only) {
    const double L = c->choice.layout.local_min > 0 ? c->choice.layout.local_min : 1;
    unsigned m = 0;
    if (!hier_only) {
        m |= 1u << _DDP_AR_RING | 1u << _DDP_AR_RAB;
        if (bytes <= (double)c->eng.scratch_bytes) m |= 1u << _DDP_AR_RD;
    }
    if (hier_only || c->choice.layout.local_max > 1) {
        m |= 1u << _DDP_AR_HIER_RING | 1u << _DDP_AR_HIER_RAB;
        if (bytes / L <= (double)c->eng.scratch_bytes) m |= 1u << _DDP_AR_HIER_RD;
    }
    return m;
}

_DDP_PRIVATE void _ddp_fmt_bytes(char *out, size_t cap, double b) {
    if (b >= 1073741824.0) snprintf(out, cap, "%g GiB", b / 1073741824.0);
    else if (b >= 1048576.0) snprintf(out, cap, "%g MiB", b / 1048576.0);
    else if (b >= 1024.0) snprintf(out, cap, "%g KiB", b / 1024.0);
    else snprintf(out, cap, "%g B", b);
}

/* Step 6c: the cost model. Rank 0 reads DDP_MODEL (else the built-in parameters) and publishes
 * them: every rank must choose alike. Then the choice per power of two of the call size, and at
 * INFO (rank 0) the table of predicted times it chose from and the crossovers. */
_DDP_PRIVATE ddp_result_t _ddp_init_model(ddp_comm_t *c) {
    const int multi = c->choice.layout.nhosts > 1;
    char key[256], err[512];
    size_t len = 0;
    ddp_result_t r;
    int k, a;
    _ddp_model_defaults(&c->choice.model);
    for (k = 0; k < 64; k++) c->choice.ar_pick[k] = c->choice.hier_pick[k] = (signed char)_DDP_AR_RING;
    if (c->eng.nranks == 1 || (!multi && c->choice.algo != _DDP_ALGO_HIER)) return DDP_SUCCESS;
    _ddp_key(c, key, sizeof key, "model");
    if (c->eng.rank == 0) {
        const char *path = getenv("DDP_MODEL");
        if (path && *path && _ddp_model_load(&c->choice.model, path, err, sizeof err) != 0) {
            r = ddp_comm_fail(c, DDP_ERR_INVALID_ARGUMENT, "init: DDP_MODEL: %s", err);
            _ddp_publish_failure(c);
            return r;
        }
        r = ddp_store_set(c->boot.store, key, &c->choice.model, sizeof c->choice.model);
    } else {
        r = ddp_store_get(c->boot.store, key, &c->choice.model, sizeof c->choice.model, &len);
        if (r == DDP_SUCCESS && len != sizeof c->choice.model)
            return ddp_comm_fail(c, DDP_ERR_MISMATCH, "init: rank 0's cost model has %zu bytes, this "
                                 "build's %zu: every rank must run the same libddp", len, sizeof c->choice.model);
    }
    if (r != DDP_SUCCESS) return ddp_comm_fail(c, r, "init: cost model: %s", ddp_store_last_error(c->boot.store));
    c->choice.model.source[sizeof c->choice.model.source - 1] = 0;
    for (k = 0; k < 64; k++) {
        const double b = k < 50 ? (double)((uint64_t)1 << k) : 1125899906842624.0;
        c->choice.ar_pick[k] = (signed char)_ddp_model_ar_pick(&c->choice.model, b, &c->choice.layout, _ddp_ar_allowed(c, b, 0), NULL);
        c->choice.hier_pick[k] = (signed char)_ddp_model_ar_pick(&c->choice.model, b, &c->choice.layout, _ddp_ar_allowed(c, b, 1), NULL);
    }
    if (c->eng.rank == 0 && c->eng.log_level >= DDP_LOG_INFO) {
        const signed char *pick = c->choice.algo == _DDP_ALGO_HIER ? c->choice.hier_pick : c->choice.ar_pick;
        char line[1024], sz[32], lo[32];
        size_t o;
        _DDP_LOG(c, DDP_LOG_INFO, "cost model (%s): alpha %.3g us local, %.3g us net; beta %.3g ns/B "
                 "local, %.3g ns/B net; host link %.3g ns/B; reduce %.3g ns/B", c->choice.model.source,
                 c->choice.model.alpha_us[0], c->choice.model.alpha_us[1], c->choice.model.beta_ns[0], c->choice.model.beta_ns[1],
                 c->choice.model.nic_ns, c->choice.model.gamma_ns);
        o = (size_t)snprintf(line, sizeof line, "all_reduce predicted us:  %9s", "size");
        for (a = 0; a < _DDP_AR_NUM; a++) o += (size_t)snprintf(line + o, sizeof line - o, " %17s", _ddp_ar_algo_name(a));
        _DDP_LOG(c, DDP_LOG_INFO, "%s  -> %s", line, c->choice.algo == _DDP_ALGO_HIER ? "DDP_ALGO=hier picks"
                 : c->choice.algo == _DDP_ALGO_AUTO ? "auto picks" : "(DDP_ALGO fixes the algorithm)");
        for (k = 3; k <= 30; k += 3) {
            const double b = (double)((uint64_t)1 << k);
            double t[_DDP_AR_NUM];
            unsigned allowed = _ddp_ar_allowed(c, b, c->choice.algo == _DDP_ALGO_HIER);
            _ddp_model_ar_pick(&c->choice.model, b, &c->choice.layout, allowed, t);
            _ddp_fmt_bytes(sz, sizeof sz, b);
            o = (size_t)snprintf(line, sizeof line, "all_reduce predicted us:  %9s", sz);
            for (a = 0; a < _DDP_AR_NUM; a++) {
                if (allowed & (1u << a) && t[a] < 1e15) o += (size_t)snprintf(line + o, sizeof line - o, " %17.1f", t[a]);
                else o += (size_t)snprintf(line + o, sizeof line - o, " %17s", "-");
            }
            _DDP_LOG(c, DDP_LOG_INFO, "%s  -> %s", line, _ddp_ar_algo_name(pick[k]));
        }
        o = 0;
        line[0] = 0;
        for (k = 0; k < 64; k++) {
            if (k < 63 && pick[k + 1] == pick[k]) continue;
            _ddp_fmt_bytes(lo, sizeof lo, k < 50 ? (double)((uint64_t)1 << k) : 1125899906842624.0);
            o += (size_t)snprintf(line + o, sizeof line - o, "%s%s%s%s", o ? ", " : "", _ddp_ar_algo_name(pick[k]),
                                  k < 63 ? " up to " : " above", k < 63 ? lo : "");
            if (o >= sizeof line) break;
        }
        _DDP_LOG(c, DDP_LOG_INFO, "all_reduce %s: %s (DDP_ALGO=... to force one, DDP_MODEL=file from "
                 "`make calibrate`)", c->choice.algo == _DDP_ALGO_HIER ? "DDP_ALGO=hier" : "auto", line);
    }
    return DDP_SUCCESS;
}

/* Step 7: device (GPU) buffers, when a transport offers them (transports/ddp_nccl.h). Every
 * rank must be able to (a rank without a device would leave the others waiting in NCCL's
 * init): the ranks agree on the probe first, then set up together, then agree on the setup.
 * "auto" (DDP_NCCL unset) declines with one line and the host path goes on; DDP_NCCL=1 makes
 * it an init error. Lanes (copies of this communicator) never run device calls. */
_DDP_PRIVATE ddp_result_t _ddp_init_device(ddp_comm_t *c, int is_lane) {
    const char *mode = getenv("DDP_NCCL");
    const int required = mode && !strcmp(mode, "1");
    char why[384] = "";
    int32_t first_no;
    ddp_result_t r;
    long chk = 0;
    int local_no;
    int k;
    for (k = 0; k < c->peers.ntinst && !c->dev.any; k++)
        if (c->peers.tinst[k].t->device) {
            c->dev.any = c->peers.tinst[k].t->device;
            c->dev.any_state = c->peers.tinst[k].state;
        }
    if (!c->dev.any) {
        _ddp_strlcpy(c->dev.declined, "no device transport compiled in (include transports/ddp_nccl.h)",
                     sizeof c->dev.declined);
        return DDP_SUCCESS;
    }
    if (is_lane) { _ddp_strlcpy(c->dev.declined, "a lane", sizeof c->dev.declined); return DDP_SUCCESS; }
    /* The first rank that cannot (INT32_MAX: all can), the same on every rank. */
    local_no = c->dev.any->probe(c->dev.any_state, why, sizeof why) != DDP_SUCCESS;
    first_no = local_no ? c->eng.rank : INT32_MAX;
    c->last_error[0] = 0;
    if ((r = _ddp_exec_min_int32(c, &first_no)) != DDP_SUCCESS) return r;
    if (first_no == INT32_MAX) {
        /* DDP_ERR_REMOTE: this rank gave up because another's setup failed (it said so through
         * the store), so the ranks agree at once; that rank is the one to name. */
        ddp_result_t sr = c->dev.any->setup(c->dev.any_state, c->dev.inherited);
        local_no = sr != DDP_SUCCESS;
        c->dev.inherited = NULL;   /* the setup's now, whatever happened */
        if (local_no) _ddp_strlcpy(why, c->last_error, sizeof why);
        c->last_error[0] = 0;
        first_no = !local_no ? INT32_MAX : sr == DDP_ERR_REMOTE ? INT32_MAX - 1 : c->eng.rank;
        if ((r = _ddp_exec_min_int32(c, &first_no)) != DDP_SUCCESS) return r;
        if (first_no == INT32_MAX) {
            c->dev.provider = c->dev.any;
            c->dev.state = c->dev.any_state;
            c->dev.check = _ddp_env_int("DDP_NCCL_CHECK", 0, 1, &chk) > 0 && chk;
            _DDP_LOG(c, DDP_LOG_INFO, "device buffers: NCCL on all %d ranks (device calls are "
                     "enqueued on the communicator's CUDA stream and return)%s", c->eng.nranks,
                     c->dev.check ? "; DDP_NCCL_CHECK: each call's fingerprint compared across ranks" : "");
            return DDP_SUCCESS;
        }
        if (local_no && sr != DDP_ERR_REMOTE)
            snprintf(c->dev.declined, sizeof c->dev.declined, "NCCL setup failed on this rank: %s", why);
        else if (local_no) {   /* gave up: why names the rank and its reason */
            char me[24];
            int skip = snprintf(me, sizeof me, "rank %d: ", c->eng.rank);
            snprintf(c->dev.declined, sizeof c->dev.declined, "%s",
                     strncmp(why, me, (size_t)skip) ? why : why + skip);
        }
        else if (first_no == INT32_MAX - 1)
            snprintf(c->dev.declined, sizeof c->dev.declined, "NCCL setup failed on another rank");
        else
            snprintf(c->dev.declined, sizeof c->dev.declined, "NCCL setup failed on rank %d (its log "
                     "says why)", (int)first_no);
        if (!required)
            _DDP_LOG(c, DDP_LOG_WARN, "device buffers: NCCL not used: %s; host buffers go on as "
                     "before (DDP_NCCL=1 makes this an init error)", c->dev.declined);
    } else {
        if (c->dev.inherited && c->dev.any->release_inherited)
            c->dev.any->release_inherited(c->dev.any_state, c->dev.inherited);
        c->dev.inherited = NULL;
        if (local_no)
            snprintf(c->dev.declined, sizeof c->dev.declined, "NCCL declined on this rank: %s", why);
        else
            snprintf(c->dev.declined, sizeof c->dev.declined, "NCCL declined on rank %d (its log says "
                     "why; this rank could use it)", (int)first_no);
        if (!required)
            _DDP_LOG(c, DDP_LOG_INFO, "device buffers: %s; host buffers use the host transports "
                     "(DDP_NCCL=0 to skip NCCL, =1 to require it)", c->dev.declined);
    }
    if (required)
        return ddp_comm_fail(c, DDP_ERR_UNSUPPORTED, "init: DDP_NCCL=1 but %s", c->dev.declined);
    return DDP_SUCCESS;
}

/* At init, when lanes may help (the ring does the collectives: shared memory gains nothing):
 * copies of the communicator with their own connections, every rank at the same point, so
 * async and blocking calls stay interchangeable. Their threads start at the first async call. */
_DDP_PRIVATE ddp_result_t _ddp_lanes_create(ddp_comm_t *c) {
    int want = c->choice.coll || c->eng.nranks < 2 ? 1 : c->queue.want_lanes, i;
    ddp_comm_desc_t d;
    ddp_store_desc_t sd;
    _ddp_parent_t lane;
    char prefix[192], err[512] = "";
    ddp_result_t r;
    c->queue.lanes[0].owner = c->queue.lanes[0].exec = c;
    for (i = 1; i < want; i++) {
        ddp_store_t *client = NULL;
        snprintf(prefix, sizeof prefix, "%s/lane%d", c->boot.prefix, i);
        /* Its own client of the store: a store client serves one thread at a time, and the
         * lanes report failures from their own threads. */
        memset(&sd, 0, sizeof sd);
        sd.timeout_ms = c->eng.timeout_ms;
        sd.secret = "";                /* the lane's client takes the store's stretched key */
        sd.log_level = c->eng.log_level + 1;
        sd.log_rank = c->eng.rank + 1;
        if (c->log.fn || c->log_file) { sd.log_fn = _ddp_store_log_fwd; sd.log_user = c; }
        if ((r = _ddp_store_client_like(&client, c->boot.store, &sd, err, sizeof err)) != DDP_SUCCESS) {
            ddp_comm_fail(c, r, "init: async lane %d: connecting to the store at %s:%d: %.400s", i,
                          c->boot.store->host, c->boot.store->port, err);
            if (client) ddp_store_close(client);
            return r;
        }
        memset(&d, 0, sizeof d);
        d.master_addr = c->boot.master_addr;
        d.master_port = c->boot.master_port;
        d.timeout_ms = c->eng.timeout_ms;
        d.socket_ifname = c->boot.ifname[0] ? c->boot.ifname : NULL;
        d.store = client;
        d.store_prefix = prefix;
        d.transport = c->peers.transport_name[0] ? c->peers.transport_name : NULL;
        d.segment_bytes = c->eng.segment_bytes;
        d.deterministic = c->choice.deterministic ? 1 : -1;
        d.spin_us = c->eng.spin_us ? c->eng.spin_us : -1;
        d.log_level = (c->eng.log_level >= DDP_LOG_TRACE ? c->eng.log_level : DDP_LOG_WARN) + 1;
        d.allocator = c->alloc.alloc ? &c->alloc : NULL;
        d.log_fn = c->log.fn;   /* a lane logs where its communicator does */
        d.log_user = c->log.user;
        c->queue.lanes[i].owner = c;
        memset(&lane, 0, sizeof lane);
        lane.is_lane = 1;
        if ((r = _ddp_comm_init(&c->queue.lanes[i].exec, c->eng.nranks, c->eng.rank, &d, &lane)) != DDP_SUCCESS) {
            ddp_store_close(client);
            return ddp_comm_fail(c, r, "init: the connections of async lane %d: %.600s", i,
                                 ddp_last_init_error());
        }
        c->queue.lanes[i].exec->boot.own_store = 1;   /* destroy closes the client */
        c->queue.nlanes = i + 1;
    }
    _DDP_LOG(c, DDP_LOG_INFO, "async: %d lane%s: %s", want, want > 1 ? "s" : "",
             want > 1 ? "async requests from DDP_LANE_MIN_BYTES up take turns, each lane with its "
             "own connections (DDP_ASYNC_LANES=1: one)" : c->choice.coll ? "collectives run by the "
             "transport" : "one");
    return DDP_SUCCESS;
}

DDP_API ddp_result_t ddp_comm_destroy(ddp_comm_t *c) {
    int i;
    ddp_allocator_t a;
    if (!c) return DDP_ERR_INVALID_ARGUMENT;
    if (!_ddp_live_check(c, 0)) return DDP_ERR_INVALID_USAGE;
    /* A fork child's copy: release what this process holds (memory, descriptors, mappings),
     * nothing the parent still uses; the threads stayed in the parent. */
    c->forked = _ddp_forked(c);
    _DDP_LOG(c, DDP_LOG_INFO, "destroying communicator%s", c->forked ? " (a fork child's copy)" : "");
    if (c->forked) c->queue.progress_on = 0;
    if (c->grow.watch_stop) c->grow.watch_stop(c);   /* the joiners' watcher, if it ran */
    if (c->health_stop) c->health_stop(c);           /* the health thread */
    if (c->queue.progress_on) {
        /* Requests still queued run first (the peers run them too); then the threads end. */
        pthread_mutex_lock(&c->queue.amu);
        c->queue.progress_stop = 1;
        pthread_cond_broadcast(&c->queue.acv);
        pthread_mutex_unlock(&c->queue.amu);
        for (i = 0; i < c->queue.nlanes; i++) pthread_join(c->queue.lanes[i].thread, NULL);
        c->queue.progress_on = 0;
    }
    for (i = 1; i < c->queue.nlanes; i++) ddp_comm_destroy(c->queue.lanes[i].exec);
    c->queue.nlanes = 0;
    if (c->windows_free) c->windows_free(c);         /* registered memory not freed */
    if (!_ddp_live_check(c, 1)) return DDP_ERR_INVALID_USAGE;   /* destroyed by another thread */
    _ddp_say_goodbye(c);
    _ddp_close_peers(c);   /* transports see tctx.forked */
    if (c->dev.inherited && c->dev.any && c->dev.any->release_inherited && !c->forked)
        c->dev.any->release_inherited(c->dev.any_state, c->dev.inherited);
    for (i = 0; i < c->peers.ntinst; i++)
        if (c->peers.tinst[i].state) c->peers.tinst[i].t->finalize(c->peers.tinst[i].state);
    if (c->forked) {
        if (c->boot.store && c->boot.own_store) _ddp_store_forget(c->boot.store);
        if (c->boot.extra_store) _ddp_store_forget(c->boot.extra_store);
    } else {
        if (c->boot.store && c->boot.own_store) ddp_store_close(c->boot.store);
        /* ddp_comm_init_threads' private server: its clients are this process's other ranks,
         * which need it no more (any destroy order returns at once, as NCCL's ncclCommInitAll
         * users destroy 0..n-1 from one thread). */
        if (c->boot.extra_store) _ddp_store_close_within(c->boot.extra_store, 0);
    }
    a = c->alloc;
    _ddp_auth_wipe(c->boot.token, sizeof c->boot.token);
    _ddp_auth_wipe(c->boot.data_key, sizeof c->boot.data_key);
    _ddp_free(&a, c->peers.by_rank);
    _ddp_free(&a, c->group.p2p);
    _ddp_free(&a, c->group.ops);
    _ddp_free(&a, c->group.fuse_buf);
    _ddp_free(&a, c->dev.prints);
    /* The parent's trace file: a child's fclose would write the parent's buffered lines again
     * (the FILE and its descriptor are left to the child's exit). */
    if (c->forked) c->trace.file = NULL;
    if (c->trace_open) _ddp_trace_close(&c->trace, &a);
    _ddp_free(&a, c->boot.host_ids);
    _ddp_free(&a, c->choice.hier_ranks);
    _ddp_free(&a, c->choice.host_of);
    _ddp_free(&a, c->eng.scratch);
    _ddp_free(&a, c->queue.ops);
    _ddp_free(&a, c->shrink.parent_ranks);
    _ddp_free(&a, c->shrink.removed);
    if (c->queue.async_init && !c->forked) {   /* a progress thread's lock may be copied held */
        pthread_mutex_destroy(&c->queue.amu);
        pthread_cond_destroy(&c->queue.acv);
        pthread_cond_destroy(&c->queue.adone);
    }
    if (c->log_file) close(c->log.fd);
    _ddp_free(&a, c);
    return DDP_SUCCESS;
}


/* A failure before there is a communicator: the story goes to ddp_last_init_error. */
_DDP_PRIVATE ddp_result_t _ddp_init_refuse(ddp_result_t r, const char *fmt, ...)
#if defined(__GNUC__) || defined(__clang__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
_DDP_PRIVATE ddp_result_t _ddp_init_refuse(ddp_result_t r, const char *fmt, ...) {
    char msg[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    snprintf(_ddp_init_error, sizeof _ddp_init_error, "%s [%s]", msg, ddp_strerror(r));
    if (_ddp_log_level_from_env() >= DDP_LOG_WARN) _ddp_log_str(-1, DDP_LOG_WARN, _ddp_init_error);
    return r;
}

/* Init's first step, and a joiner's lobby (ddp_comm_grow.h): a communicator with its settings
 * and nothing else (no store, no peers). */
_DDP_PRIVATE ddp_result_t _ddp_comm_new(ddp_comm_t **out, int nranks, int rank, const ddp_comm_desc_t *d,
                                        const char **forced) {
    ddp_comm_desc_t zero;
    ddp_comm_t *c;
    ddp_result_t r;
    _ddp_init_error[0] = 0;
    if (!out) return _ddp_init_refuse(DDP_ERR_INVALID_ARGUMENT, "ddp_comm_init: NULL comm pointer");
    *out = NULL;
    if (nranks < 1 || nranks > _DDP_MAX_RANKS)
        return _ddp_init_refuse(DDP_ERR_INVALID_ARGUMENT, "ddp_comm_init: world size %d is not in "
                                "1..%d (rank 0's store holds a connection per rank)", nranks, _DDP_MAX_RANKS);
    if (rank < 0 || rank >= nranks)
        return _ddp_init_refuse(DDP_ERR_INVALID_ARGUMENT, "ddp_comm_init: rank %d is not in 0..%d "
                                "(world size %d)", rank, nranks - 1, nranks);
    if (!d) { memset(&zero, 0, sizeof zero); d = &zero; }
    if (d->allocator && (!d->allocator->alloc || !d->allocator->free))
        return _ddp_init_refuse(DDP_ERR_INVALID_ARGUMENT, "ddp_comm_init: desc.allocator needs both "
                                "alloc and free");
    c = (ddp_comm_t *)_ddp_calloc(d->allocator, sizeof *c);
    if (!c) return _ddp_init_refuse(DDP_ERR_OUT_OF_MEMORY, "ddp_comm_init: allocating the communicator");
    c->log.fd = 2;   /* stderr until the settings say otherwise */
    pthread_mutex_init(&c->queue.amu, NULL);
    pthread_cond_init(&c->queue.acv, NULL);
    pthread_cond_init(&c->queue.adone, NULL);
    c->queue.async_init = 1;
    pthread_once(&_ddp_fork_once, _ddp_fork_register);
    c->fork_gen = __atomic_load_n(&_ddp_fork_gen, __ATOMIC_RELAXED);
    c->pid = (int)getpid();
    if (!_ddp_live_add(c)) { _ddp_free(d->allocator, c); return DDP_ERR_OUT_OF_MEMORY; }
    if (d->allocator) c->alloc = *d->allocator;
    c->eng.rank = rank;
    c->eng.nranks = nranks;
    c->boot.local_rank = c->boot.local_size = -1;
    if ((r = _ddp_init_settings(c, d, forced)) != DDP_SUCCESS) {
        _ddp_strlcpy(_ddp_init_error, c->last_error, sizeof _ddp_init_error);
        ddp_comm_destroy(c);
        return r;
    }
    *out = c;
    return DDP_SUCCESS;
}

/* Settings, store, rendezvous (transports open listeners and publish), transport per peer,
 * collective provider, neighbour connections, lanes: each step names its failure. */
_DDP_PRIVATE ddp_result_t _ddp_comm_init(ddp_comm_t **out, int nranks, int rank, const ddp_comm_desc_t *d,
                                         const _ddp_parent_t *from) {
    ddp_comm_desc_t zero;
    ddp_comm_t *c;
    ddp_result_t r;
    const char *forced = NULL;
    if (!out) return _ddp_init_refuse(DDP_ERR_INVALID_ARGUMENT, "ddp_comm_init: NULL comm pointer");
    *out = NULL;
    if ((r = _ddp_comm_new(&c, nranks, rank, d, &forced)) != DDP_SUCCESS) return r;
    if (!d) { memset(&zero, 0, sizeof zero); d = &zero; }
    /* one deadline for the rendezvous */
    c->boot.init_deadline_us = _ddp_deadline(from->rendezvous_ms > 0 ? from->rendezvous_ms : c->eng.timeout_ms);
    _ddp_init_contexts(c);
    {
        char terr[600];
        if (_ddp_trace_open(&c->trace, &c->alloc, rank, !from->is_lane, terr, sizeof terr) != 0) {
            r = ddp_comm_fail(c, DDP_ERR_SYSTEM, "init: %s", terr);
            c->trace_open = 1;
            goto fail;
        }
        c->trace_open = 1;
    }
    if ((r = _ddp_init_store(c, d)) != DDP_SUCCESS) goto fail;
    if ((r = _ddp_rendezvous(c, forced)) != DDP_SUCCESS) goto fail;
    if ((r = _ddp_init_pick_transports(c)) != DDP_SUCCESS) goto fail;
    if ((r = _ddp_init_layout(c, from->split_hosts)) != DDP_SUCCESS) goto fail;
    if ((r = _ddp_init_model(c)) != DDP_SUCCESS) goto fail;
    if (nranks > 1 && (r = _ddp_init_coll_provider(c)) != DDP_SUCCESS) goto fail;
    if (nranks > 1 && (r = _ddp_init_connect_neighbours(c)) != DDP_SUCCESS) goto fail;
    if (from->dev_inherited) {   /* ours from here on (the caller keeps it if we fail before) */
        c->dev.inherited = *from->dev_inherited;
        *from->dev_inherited = NULL;
    }
    if ((r = _ddp_init_device(c, from->is_lane)) != DDP_SUCCESS) goto fail;
    snprintf(c->trace.transport, sizeof c->trace.transport, "%s", nranks == 1 ? "self" : c->choice.coll ?
             c->peers.tinst[c->peers.by_rank[(rank + 1) % nranks].tinst].t->name : ddp_comm_transport_name(c, (rank + 1) % nranks));
    if (c->trace.file)
        _DDP_LOG(c, DDP_LOG_INFO, "DDP_TRACE: writing this rank's calls as Chrome trace events");
    c->queue.nlanes = 1;
    if (!from->is_lane && (r = _ddp_lanes_create(c)) != DDP_SUCCESS) goto fail;
    _DDP_LOG(c, DDP_LOG_INFO, "wait policy: poll %d us (yielding the CPU between polls), then "
             "sleep in the kernel; %d ranks on this host, %d CPUs for them (their affinity masks "
             "together; %d for this rank)", c->eng.spin_us, c->boot.local_size, c->tctx.host_cpus,
             _ddp_cpu_count());
    _DDP_LOG(c, DDP_LOG_INFO, "init done: local rank %d of %d", c->boot.local_rank, c->boot.local_size);
    if (c->boot.own_store) _ddp_store_bound(c->boot.store, 0);   /* later requests: a timeout each */
    if (!from->is_lane && !from->no_health) _ddp_health_start(c);
    *out = c;
    return DDP_SUCCESS;
fail:
    if (c->boot.store && c->boot.own_store) _ddp_store_bound(c->boot.store, 0);
    /* Ranks waiting in the rendezvous learn at once instead of at their timeout; a rank that
     * only saw a peer go away says why that peer went, if it told the store. */
    if (c->boot.store && (r != DDP_ERR_REMOTE || !_ddp_add_root_cause(c))) _ddp_publish_failure(c);
    /* The caller gets no communicator to ask, so keep the story per thread. */
    _ddp_strlcpy(_ddp_init_error, c->last_error, sizeof _ddp_init_error);
    ddp_comm_destroy(c);
    return r;
}

/* ---------------------------------------------------------------- threads as ranks
 * n communicators in this process, one per thread (the C answer to nn.DataParallel). A private
 * store on 127.0.0.1 (a free port the kernel picks) does the rendezvous; each rank has its own
 * client of it. Ranks talk through transports/ddp_threads.h when it is compiled in (reducing
 * straight from each other's buffers), else through the shared-memory transport (ranks of one
 * process share its mappings), else the default: no socket is involved with either, and a small
 * all-reduce costs well under a microsecond. desc->transport or DDP_TRANSPORT still decide. */
typedef struct {
    ddp_comm_t **out;
    int rank, n, port;
    const ddp_comm_desc_t *desc;
    const char *transport;
    ddp_result_t r;
    char err[1024];
} _ddp_thread_init_t;

static void *_ddp_thread_init_main(void *arg) {
    _ddp_thread_init_t *t = (_ddp_thread_init_t *)arg;
    ddp_comm_desc_t d = *t->desc;
    _ddp_parent_t from;
    ddp_store_desc_t sd;
    ddp_store_t *client = NULL;
    memset(&sd, 0, sizeof sd);
    sd.timeout_ms = d.timeout_ms;
    sd.log_level = d.log_level;
    sd.log_rank = t->rank + 1;
    sd.secret = "";
    t->r = ddp_store_open(&client, "127.0.0.1", t->port, 0, &sd);
    if (t->r != DDP_SUCCESS) {
        snprintf(t->err, sizeof t->err, "init_threads: rank %d: store: %s", t->rank, "cannot reach the private store");
        return NULL;
    }
    d.store = client;
    d.store_prefix = "threads";
    d.transport = t->transport;
    d.master_addr = "127.0.0.1";
    d.master_port = t->port;
    memset(&from, 0, sizeof from);
    from.no_health = 1;   /* one process: nothing a heartbeat would tell */
    t->r = _ddp_comm_init(t->out, t->n, t->rank, &d, &from);
    if (t->r != DDP_SUCCESS) {
        _ddp_strlcpy(t->err, ddp_last_init_error(), sizeof t->err);
        ddp_store_close(client);
        return NULL;
    }
    (*t->out)->boot.own_store = 1;          /* destroy closes this rank's client */
    return NULL;
}

DDP_API ddp_result_t ddp_comm_init_threads(ddp_comm_t **comms, int n, const ddp_comm_desc_t *desc) {
    ddp_comm_desc_t zero;
    ddp_store_desc_t sd;
    ddp_store_t *srv = NULL;
    _ddp_thread_init_t *t;
    pthread_t *th;
    ddp_result_t r = DDP_SUCCESS;
    int i, started = 0;
    if (!comms || n < 1) {
        snprintf(_ddp_init_error, sizeof _ddp_init_error, "init_threads: %s",
                 comms ? "n must be >= 1" : "NULL comms");
        return DDP_ERR_INVALID_ARGUMENT;
    }
    for (i = 0; i < n; i++) comms[i] = NULL;
    if (!desc) { memset(&zero, 0, sizeof zero); desc = &zero; }
    memset(&sd, 0, sizeof sd);
    sd.timeout_ms = desc->timeout_ms;
    sd.log_level = desc->log_level;
    sd.secret = "";
    r = ddp_store_open(&srv, "127.0.0.1", 0, 1, &sd);
    if (r != DDP_SUCCESS) {
        snprintf(_ddp_init_error, sizeof _ddp_init_error, "init_threads: private store: %s",
                 srv ? ddp_store_last_error(srv) : ddp_strerror(r));
        return r;
    }
    t = (_ddp_thread_init_t *)DDP_MALLOC(sizeof *t * (size_t)n);
    th = (pthread_t *)DDP_MALLOC(sizeof *th * (size_t)n);
    if (!t || !th) {
        DDP_FREE(t);
        DDP_FREE(th);
        ddp_store_close(srv);
        snprintf(_ddp_init_error, sizeof _ddp_init_error, "init_threads: out of memory");
        return DDP_ERR_OUT_OF_MEMORY;
    }
    for (i = 0; i < n; i++) {
        memset(&t[i], 0, sizeof t[i]);
        t[i].out = &comms[i];
        t[i].rank = i;
        t[i].n = n;
        t[i].port = ddp_store_port(srv);
        t[i].desc = desc;
        t[i].transport = desc->transport ? desc->transport
                       : getenv("DDP_TRANSPORT") ? NULL : ddp_transport_find("threads") ? "threads"
                       : ddp_transport_find("shm") ? "shm" : NULL;
        if (pthread_create(&th[i], NULL, _ddp_thread_init_main, &t[i]) != 0) {
            t[i].r = DDP_ERR_SYSTEM;
            snprintf(t[i].err, sizeof t[i].err, "init_threads: pthread_create: %s", strerror(errno));
            break;
        }
        started++;
    }
    for (i = 0; i < started; i++) pthread_join(th[i], NULL);
    for (i = 0; i < n; i++) {
        if (i >= started || t[i].r != DDP_SUCCESS) {
            if (r == DDP_SUCCESS) {
                r = i >= started ? DDP_ERR_SYSTEM : t[i].r;
                _ddp_strlcpy(_ddp_init_error, i >= started ? "init_threads: a thread did not start"
                                                           : t[i].err, sizeof _ddp_init_error);
            }
        }
    }
    if (r != DDP_SUCCESS) {
        for (i = 0; i < n; i++) if (comms[i]) { ddp_comm_destroy(comms[i]); comms[i] = NULL; }
        ddp_store_close(srv);
    } else {
        comms[0]->boot.extra_store = srv;    /* the server lives as long as rank 0's communicator */
    }
    DDP_FREE(t);
    DDP_FREE(th);
    return r;
}

/* ddp_comm_init_env's ranks from the environment (ddp_comm_grow.h's ddp_comm_init_env joins
 * instead when told to). */
_DDP_PRIVATE ddp_result_t _ddp_comm_init_env(ddp_comm_t **out, const ddp_comm_desc_t *d) {
    _ddp_env_ranks_t e;
    ddp_result_t r;
    ddp_comm_t *c;
    if (!out) return DDP_ERR_INVALID_ARGUMENT;
    *out = NULL;
    memset(&e, 0, sizeof e);
    r = _ddp_ranks_from_env(&e);
    if (r == DDP_ERR_UNSUPPORTED) {
        /* No launcher: the program was run directly. A world of one (every collective a
         * local copy), as users of a single process expect. */
        if (_ddp_log_level_from_env() >= DDP_LOG_INFO && !(d && d->log_level))
            _ddp_log_str(0, DDP_LOG_INFO, "init: no launcher in the environment (RANK/WORLD_SIZE, "
                         "OMPI_COMM_WORLD_*, PMI_*, SLURM_*): a world of one");
        e.rank = 0;
        e.nranks = 1;
        r = DDP_SUCCESS;
    }
    if (r != DDP_SUCCESS) {
        snprintf(_ddp_init_error, sizeof _ddp_init_error, "init: %s [%s]", e.err, ddp_strerror(r));
        if (_ddp_log_level_from_env() >= DDP_LOG_WARN) {
            _ddp_log_str(-1, DDP_LOG_WARN, _ddp_init_error);
        }
        return r;
    }
    r = ddp_comm_init(&c, e.nranks, e.rank, d);
    if (r != DDP_SUCCESS) return r;
    if (e.local_rank >= 0) c->boot.local_rank = e.local_rank;
    if (e.local_size >= 0) c->boot.local_size = e.local_size;
    *out = c;
    return DDP_SUCCESS;
}

#ifdef __cplusplus
}
#endif

#endif /* DDP_COMM_INIT_IMPLEMENTATION */
