/* SPDX-License-Identifier: MIT (see LICENSE) */
/* tests/test_reducer_grow.c — the elastic reducer after a grow (ranks join a running job) and
 * the joiners-waiting count its commit round agrees on. TAP.
 *
 *   build/test_reducer_grow          (DDP_TEST_ONLY=<scenario> runs one)
 *
 * A grow is stood in for by ddp_comm_init of a communicator of m + 1 ranks over the same
 * store (another prefix): the members keep their ranks 0 .. m-1, the joiner is rank m, as
 * ddp_comm_grow numbers them.
 *
 * Scenarios:
 *   grow     m = 3 members run 3 steps, marking gradients in an order unlike the registration
 *            order (so the buckets are rebuilt after step 1 into another layout), then a
 *            4-rank communicator is made; the members rebind their reducers, the joiner
 *            creates a fresh one (same desc, same parameters) and rebinds it. Every rank:
 *            apply_pending 0, 3 committed steps, the same bucket layout (bucket_info) and
 *            rebuilt flag; 3 more steps are exactly the average over 4 ranks (integer-valued
 *            float64 gradients: ==), the replicas' weights bitwise identical. Copy mode,
 *            bucket views, flat mode; tcp and shm.
 *   regrow   4 ranks, rank 1 killed after step 2: the 3 survivors shrink and rebind (apply
 *            the step if told to), run to step 4, then a fifth process joins as rank 3 of a
 *            4-rank communicator; steps 5 and 6 are the average over the 4.
 *   mismatch a joiner whose parameter 2 has another count, one with a parameter less, one with
 *            another bucket cap: DDP_ERR_MISMATCH on every rank naming the joiner (and the
 *            parameter); members whose committed counts cannot be reconciled with a fresh
 *            joiner: DDP_ERR_MISMATCH everywhere naming the rank; one member that missed the
 *            last commit with a fresh joiner: apply_pending only there, the joiner adopts the
 *            count. Survivors with different layouts (as a rank dying in the rebuild's broadcast
 *            leaves them) all take rank 0's, the bucket views' values kept. The reducers still
 *            work afterwards (no rank left in a collective).
 *   joiners  the per-rank count of joiners waiting (the private hook, injected here) agreed in
 *            the commit round: the MAX over ranks on every rank; 0 when a step did not commit
 *            (one rank left a gradient unmarked: finish fails everywhere) and after a no_sync
 *            finish; negative counts are 0, huge ones clamp to 2^30 - 1; 0 without elastic.
 */
#define _GNU_SOURCE
#define DDP_IMPLEMENTATION
#include "ddp.h"
#include "transports/ddp_tcp.h"
#include "transports/ddp_shm.h"
#include "tests/ddp_test.h"
#include "tests/ddp_test_elastic.h"

#define MAXP 5
/* The order backward marks gradients in: not reverse registration order (4 3 2 1 0), so the
 * rebuild after step 1 gives another layout (buckets {2}, {4, 0, 3}, {1} instead of {4, 3},
 * {2, 1}, {0} with a first bucket of 256 bytes and a cap of 1024). */
static const int g_ready[T_EL_NP] = {2, 4, 0, 3, 1};

typedef struct {                         /* per process, written by the children */
    uint64_t whash;
    int apply, committed, rebuilt, done, nbuckets;
    int layout[T_EL_NP][T_EL_NP + 1];    /* per bucket: its count, then its parameters */
} result_t;
static result_t *R;

/* Steps [from, to] over the processes who[0..n), checked and applied. */
static int steps(t_el_model_t *m, int me, const int *who, int n, int from, int to, const char *what) {
    int s, bad;
    for (s = from; s <= to; s++) {
        ddp_result_t e = t_el_step_run(m, me, s);
        if (!ok(e == DDP_SUCCESS, "[%s] %s step %d -> %s %s", t_el_mode_names[m->mode], what, s, ddp_strerror(e),
                ddp_reducer_last_error(m->r)))
            return -1;
        bad = t_el_step_check(m, who, n, s);
        ok(bad == 0, "[%s] %s step %d: the average over %d ranks (%d elements differ)", t_el_mode_names[m->mode], what,
           s, n, bad);
        t_el_step_apply(m);
    }
    return 0;
}

/* The weights after steps [from, to] averaged over who[0..n): a joiner's stand-in for the
 * state the members send it. */
static void replay(double *w, const int *who, int n, int from, int to) {
    int s, i;
    size_t off, j;
    for (s = from; s <= to; s++)
        for (i = 0, off = 0; i < T_EL_NP; off += t_el_sizes[i], i++)
            for (j = 0; j < t_el_sizes[i]; j++) w[off + j] -= t_el_expect(who, n, s, i, j);
}

static void record(t_el_model_t *m, int slot, int apply) {
    int b;
    R[slot].apply = apply;
    R[slot].committed = (int)ddp_reducer_committed_steps(m->r);
    R[slot].rebuilt = ddp_reducer_rebuilt(m->r);
    R[slot].nbuckets = ddp_reducer_num_buckets(m->r);
    for (b = 0; b < R[slot].nbuckets && b < T_EL_NP; b++)
        R[slot].layout[b][0] = ddp_reducer_bucket_info(m->r, b, &R[slot].layout[b][1], T_EL_NP, NULL, NULL);
}

static int layout_equal(int a, int b) {
    return R[a].nbuckets == R[b].nbuckets && !memcmp(R[a].layout, R[b].layout, sizeof R[a].layout);
}

static void layout_str(int slot, char *out, size_t cap) {
    size_t n = 0;
    int b, k;
    out[0] = 0;
    for (b = 0; b < R[slot].nbuckets && b < T_EL_NP && n < cap; b++) {
        n += (size_t)snprintf(out + n, cap - n, "%s{", b ? " " : "");
        for (k = 0; k < R[slot].layout[b][0] && n < cap; k++)
            n += (size_t)snprintf(out + n, cap - n, "%s%d", k ? "," : "", R[slot].layout[b][1 + k]);
        if (n < cap) n += (size_t)snprintf(out + n, cap - n, "}");
    }
}

/* ----------------------------------------------------------------- grow */
#define K_BEFORE 3
#define K_AFTER 3

static int grow(int rank, int p, void *arg) {
    static t_el_model_t m;
    const int members = p - 1;
    int who[MAXP], k, apply = -1;
    ddp_store_t *st = NULL;
    ddp_comm_t *c = NULL, *big;
    ddp_result_t e;
    memset(&m, 0, sizeof m);
    m.mode = *(const int *)arg;
    for (k = 0; k < p; k++) who[k] = k;
    if (rank < members) {
        if (!(c = t_el_comm_on_store(rank, members, "grow-a", &st)) || !(m.r = t_el_reducer(c, &m, T_EL_SAME)))
            return 1;
        if (steps(&m, rank, who, members, 1, K_BEFORE, "before the grow") != 0) return 1;
        ok(ddp_reducer_rebuilt(m.r) == (m.mode != T_EL_FLAT), "[%s] the members' buckets %s rebuilt",
           t_el_mode_names[m.mode], m.mode != T_EL_FLAT ? "were" : "are never (flat mode)");
    }
    if (!(big = t_el_comm_on_store(rank, p, "grow-b", &st))) return 1;
    if (rank < members) {
        ddp_comm_destroy(c);     /* as after ddp_comm_grow: the old one is retired */
    } else {
        if (!(m.r = t_el_reducer(big, &m, T_EL_SAME))) return 1;
        replay(m.w, who, members, 1, K_BEFORE);
    }
    t_where("rebind onto %d ranks", p);
    e = ddp_reducer_rebind(m.r, big, &apply);
    if (!ok(e == DDP_SUCCESS && apply == 0, "[%s] %s rebinds onto %d ranks -> %s, apply_pending %d %s",
            t_el_mode_names[m.mode], rank < members ? "a member" : "the joiner", p, ddp_strerror(e), apply,
            ddp_reducer_last_error(m.r)))
        return 1;
    ok(ddp_reducer_committed_steps(m.r) == K_BEFORE, "committed steps after the grow: %lld (want %d)",
       (long long)ddp_reducer_committed_steps(m.r), K_BEFORE);
    record(&m, rank, apply);
    if (steps(&m, rank, who, p, K_BEFORE + 1, K_BEFORE + K_AFTER, "after the grow") != 0) return 1;
    ok(ddp_reducer_committed_steps(m.r) == K_BEFORE + K_AFTER, "committed steps: %lld",
       (long long)ddp_reducer_committed_steps(m.r));
    ok(ddp_reducer_rebuilt(m.r) == R[rank].rebuilt, "no rebuild after the rebind (rebuilt %d)",
       ddp_reducer_rebuilt(m.r));
    R[rank].whash = t_hash(m.w, sizeof m.w);
    R[rank].done = 1;
    ddp_reducer_destroy(m.r);
    ddp_comm_destroy(big);
    ddp_store_close(st);
    return 0;
}

/* The layouts and weights every process recorded: all the same (and rebuilt, but for flat). */
static void check_same(int p, int mode, const char *what) {
    char a[160], b[160];
    int r, same = 1, done = 1, committed = 1;
    for (r = 0; r < p; r++) {
        if (R[r].done != 1) done = 0;
        if (R[r].committed != R[0].committed) committed = 0;
        if (!layout_equal(r, 0) || R[r].rebuilt != R[0].rebuilt) same = 0;
    }
    layout_str(0, a, sizeof a);
    layout_str(p - 1, b, sizeof b);
    ok(done, "[%s] %s: every process finished", t_el_mode_names[mode], what);
    ok(committed, "[%s] %s: the same committed count everywhere (%d)", t_el_mode_names[mode], what, R[0].committed);
    ok(same, "[%s] %s: the same bucket layout on every rank (rank 0: %s rebuilt %d; the joiner: %s rebuilt %d)",
       t_el_mode_names[mode], what, a, R[0].rebuilt, b, R[p - 1].rebuilt);
    if (mode != T_EL_FLAT)
        ok(strcmp(a, "{4,3} {2,1} {0}") != 0, "[%s] %s: and it is not the default layout {4,3} {2,1} {0}, so "
           "a joiner keeping its own would pair other buckets", t_el_mode_names[mode], what);
    for (r = 1, same = 1; r < p; r++) same &= R[r].whash == R[0].whash;
    ok(same, "[%s] %s: the replicas' weights are bitwise identical", t_el_mode_names[mode], what);
}

static void run_grow(int mode) {
    const int p = 4;
    int stop = -1;
    pid_t store = t_store_process(&t_el_store_port, &stop);
    if (!ok(store > 0 && t_el_store_port > 0, "the store (a process of its own)")) return;
    memset(R, 0, sizeof *R * MAXP);
    diag("--- [%s] %s: 3 members, 3 steps, a joiner, 3 steps over 4", t_el_transport, t_el_mode_names[mode]);
    ok(t_run_ranks(p, grow, &mode, 120) == 0, "[%s] %s grow: every process exited cleanly", t_el_transport,
       t_el_mode_names[mode]);
    close(stop);
    waitpid(store, NULL, 0);
    check_same(p, mode, "grow 3 -> 4");
}

/* ----------------------------------------------------------------- regrow */
#define RG_VICTIM 1
#define RG_VICTIM_LAST 2
#define RG_GROW_AT 4
#define RG_END 6

static int regrow(int proc, int nproc, void *arg) {
    static t_el_model_t m;
    const int p = nproc - 1, joiner = nproc - 1;
    int all[MAXP] = {0, 1, 2, 3}, surv[MAXP] = {0, 2, 3}, grown[MAXP] = {0, 2, 3, 4};
    int step = 1, apply = -1, rank = proc;
    ddp_store_t *st = NULL;
    ddp_comm_t *c = NULL, *nc = NULL;
    ddp_result_t e;
    memset(&m, 0, sizeof m);
    m.mode = *(const int *)arg;
    if (proc != joiner) {
        if (!(c = t_el_comm_on_store(proc, p, "regrow-a", &st)) || !(m.r = t_el_reducer(c, &m, T_EL_SAME))) return 1;
        if (steps(&m, proc, all, p, 1, RG_VICTIM_LAST, "before the loss") != 0) return 1;
        if (proc == RG_VICTIM) {
            t_where("dying after step %d", RG_VICTIM_LAST);
            kill(getpid(), SIGKILL);
        }
        e = t_el_step_run(&m, proc, RG_VICTIM_LAST + 1);
        if (!ok(e != DDP_SUCCESS, "[%s] step %d fails (rank %d died) -> %s", t_el_mode_names[m.mode],
                RG_VICTIM_LAST + 1, RG_VICTIM, ddp_strerror(e)))
            return 1;
        t_where("ddp_comm_shrink");
        e = ddp_comm_shrink(c, NULL, &nc);
        if (!ok(e == DDP_SUCCESS && ddp_comm_size(nc) == p - 1, "[%s] shrink to %d -> %s", t_el_mode_names[m.mode],
                p - 1, ddp_strerror(e)))
            return 1;
        ddp_comm_destroy(c);
        c = nc;
        rank = ddp_comm_rank(c);
        e = ddp_reducer_rebind(m.r, c, &apply);
        if (!ok(e == DDP_SUCCESS && apply == 0 && ddp_reducer_committed_steps(m.r) == RG_VICTIM_LAST,
                "[%s] rebind onto 3 -> %s, apply %d, committed %lld %s", t_el_mode_names[m.mode], ddp_strerror(e),
                apply, (long long)ddp_reducer_committed_steps(m.r), ddp_reducer_last_error(m.r)))
            return 1;
        step = RG_VICTIM_LAST + 1;
        if (steps(&m, proc, surv, p - 1, step, RG_GROW_AT, "after the shrink") != 0) return 1;
    }
    /* the grow: survivors keep their ranks 0 .. 2, the joiner is rank 3 */
    if (!(nc = t_el_comm_on_store(proc == joiner ? p - 1 : rank, p, "regrow-b", &st))) return 1;
    if (proc == joiner) {
        if (!(m.r = t_el_reducer(nc, &m, T_EL_SAME))) return 1;
        replay(m.w, all, p, 1, RG_VICTIM_LAST);
        replay(m.w, surv, p - 1, RG_VICTIM_LAST + 1, RG_GROW_AT);
    } else {
        ddp_comm_destroy(c);
    }
    c = nc;
    e = ddp_reducer_rebind(m.r, c, &apply);
    if (!ok(e == DDP_SUCCESS && apply == 0 && ddp_reducer_committed_steps(m.r) == RG_GROW_AT,
            "[%s] %s rebinds onto 4 -> %s, apply %d, committed %lld %s", t_el_mode_names[m.mode],
            proc == joiner ? "the joiner" : "a survivor", ddp_strerror(e), apply,
            (long long)ddp_reducer_committed_steps(m.r), ddp_reducer_last_error(m.r)))
        return 1;
    rank = ddp_comm_rank(c);
    record(&m, rank, apply);
    if (steps(&m, proc, grown, p, RG_GROW_AT + 1, RG_END, "after the grow") != 0) return 1;
    R[rank].whash = t_hash(m.w, sizeof m.w);
    R[rank].done = 1;
    ddp_reducer_destroy(m.r);
    ddp_comm_destroy(c);
    ddp_store_close(st);
    return 0;
}

static void run_regrow(int mode) {
    int stop = -1;
    pid_t store = t_store_process(&t_el_store_port, &stop);
    if (!ok(store > 0 && t_el_store_port > 0, "the store (a process of its own)")) return;
    memset(R, 0, sizeof *R * MAXP);
    diag("--- [%s] %s: 4 ranks, rank %d dies after step %d, 3 go on to step %d, a fifth process joins",
         t_el_transport, t_el_mode_names[mode], RG_VICTIM, RG_VICTIM_LAST, RG_GROW_AT);
    t_run_ranks(5, regrow, &mode, 120);
    close(stop);
    waitpid(store, NULL, 0);
    ok(t_rank_signaled(RG_VICTIM, SIGKILL), "the victim died (SIGKILL)");
    ok(t_last_run.exited[0] && !t_last_run.code[0] && t_last_run.exited[2] && !t_last_run.code[2] &&
       t_last_run.exited[3] && !t_last_run.code[3] && t_last_run.exited[4] && !t_last_run.code[4],
       "[%s] regrow: the survivors and the joiner exited cleanly", t_el_mode_names[mode]);
    check_same(4, mode, "4 -> 3 -> 4");
}

/* ----------------------------------------------------------------- mismatch */
/* m = 2 members and a joiner (rank 2) with the given tweak: every rank's rebind result. */
static int mismatch_case(ddp_comm_t *big, int rank, int mode, int tweak, const char *what, int param) {
    static t_el_model_t m;
    ddp_result_t e;
    int apply = -1, p = ddp_comm_size(big);
    memset(&m, 0, sizeof m);
    m.mode = mode;
    if (!(m.r = t_el_reducer(big, &m, rank == p - 1 ? tweak : T_EL_SAME))) return 1;
    if (rank < p - 1) {   /* a member, two steps committed */
        t_el_poke_t st = {2, 2, 2};
        t_el_poke(m.r, &st);
    }
    e = ddp_reducer_rebind(m.r, big, &apply);
    ok(e == DDP_ERR_MISMATCH && apply == 0 && t_mentions_rank(ddp_reducer_last_error(m.r), p - 1) &&
       (param < 0 || strstr(ddp_reducer_last_error(m.r), "parameter 2 ")),
       "%s: DDP_ERR_MISMATCH on every rank naming rank %d%s -> %s: %s", what, p - 1, param < 0 ? "" :
       " and parameter 2", ddp_strerror(e), ddp_reducer_last_error(m.r));
    ddp_reducer_destroy(m.r);
    return 0;
}

static int mismatch(int rank, int p, void *arg) {
    static t_el_model_t m;
    ddp_comm_t *c;
    ddp_comm_desc_t d;
    ddp_result_t e;
    int apply = -1, who[3] = {0, 1, 2};
    (void)arg;
    t_el_set_transport();
    t_desc(&d, 20000);
    d.log_level = 1;
    if (!(c = t_comm_init(rank, p, &d))) return 1;
    mismatch_case(c, rank, T_EL_COPY, T_EL_COUNT, "a joiner's parameter 2 of another count", 2);
    mismatch_case(c, rank, T_EL_FLAT, T_EL_COUNT, "flat mode: a joiner's parameter 2 of another count", 2);
    mismatch_case(c, rank, T_EL_COPY, T_EL_FEWER, "a joiner with a parameter less", -1);
    mismatch_case(c, rank, T_EL_COPY, T_EL_CAP, "a joiner with another bucket cap", -1);
    memset(&m, 0, sizeof m);
    m.mode = T_EL_COPY;
    if (!(m.r = t_el_reducer(c, &m, T_EL_SAME))) return 1;
    if (rank < 2) {
        t_el_poke_t st[2] = {{4, 4, 4}, {2, 2, 2}};
        t_el_poke(m.r, &st[rank]);
    }
    e = ddp_reducer_rebind(m.r, c, &apply);
    ok(e == DDP_ERR_MISMATCH && apply == 0 && t_mentions_rank(ddp_reducer_last_error(m.r), 1),
       "members at steps 4 and 2 with a fresh joiner: DDP_ERR_MISMATCH on every rank naming rank 1 -> %s: %s",
       ddp_strerror(e), ddp_reducer_last_error(m.r));
    ddp_reducer_destroy(m.r);
    /* rank 1 missed the commit of step 3 (its exchange completed); rank 2 is fresh */
    memset(&m, 0, sizeof m);
    m.mode = T_EL_COPY;
    if (!(m.r = t_el_reducer(c, &m, T_EL_SAME))) return 1;
    if (rank < 2) {
        t_el_poke_t st[2] = {{3, 3, 3}, {3, 3, 2}};
        t_el_poke(m.r, &st[rank]);
    }
    e = ddp_reducer_rebind(m.r, c, &apply);
    ok(e == DDP_SUCCESS && apply == (rank == 1) && ddp_reducer_committed_steps(m.r) == 3,
       "a member that missed the last commit, and a fresh joiner: apply_pending %d (only on rank 1), committed %lld "
       "(3 everywhere) -> %s %s", apply, (long long)ddp_reducer_committed_steps(m.r), ddp_strerror(e),
       ddp_reducer_last_error(m.r));
    ok(steps(&m, rank, who, p, 4, 5, "after the mixed rebind") == 0, "the reducer works afterwards");
    ddp_reducer_destroy(m.r);
    {   /* survivors with different layouts (a rank died in the rebuild's broadcast, which reached
         * rank 1 only): everyone takes rank 0's, the gradients' values (bucket views) kept */
        static const int32_t other[T_EL_NP] = {0, 1, 2, 3, 4};
        int i, b, bad = 0, n, params[T_EL_NP];
        size_t j;
        t_el_poke_t st = {2, 2, 2};
        memset(&m, 0, sizeof m);
        m.mode = T_EL_VIEW;
        if (!(m.r = t_el_reducer(c, &m, T_EL_SAME))) return 1;
        t_el_poke(m.r, &st);
        ddp_reducer_num_buckets(m.r);   /* closes the list: the default layout */
        if (rank == 1) {
            _ddp_reducer_relayout(m.r, other);
            m.r->rebuilt = 1;
        }
        for (i = 0; i < T_EL_NP; i++)
            for (j = 0; j < t_el_sizes[i]; j++) t_el_grad_of(&m, i)[j] = t_el_gradient(rank, 77, i, j);
        e = ddp_reducer_rebind(m.r, c, &apply);
        for (i = 0; i < T_EL_NP; i++)
            for (j = 0; j < t_el_sizes[i]; j++) bad += t_el_grad_of(&m, i)[j] != t_el_gradient(rank, 77, i, j);
        n = ddp_reducer_bucket_info(m.r, 0, params, T_EL_NP, NULL, NULL);
        b = ddp_reducer_num_buckets(m.r);
        ok(e == DDP_SUCCESS && apply == 0 && b == 3 && n == 2 && params[0] == 4 && params[1] == 3 &&
           !ddp_reducer_rebuilt(m.r) && bad == 0, "survivors with different layouts: rank 0's everywhere (%d "
           "buckets, the first {%d, %d}, rebuilt %d), %d gradient values changed -> %s %s", b, params[0], params[1],
           ddp_reducer_rebuilt(m.r), bad, ddp_strerror(e), ddp_reducer_last_error(m.r));
        ok(steps(&m, rank, who, p, 6, 7, "after the layout agreement") == 0, "the buckets pair up afterwards");
        ddp_reducer_destroy(m.r);
    }
    ddp_comm_destroy(c);
    return 0;
}

/* ----------------------------------------------------------------- joiners */
static int g_waiting;                    /* what the injected hook answers on this rank */
static int hook(ddp_comm_t *comm) { (void)comm; return g_waiting; }

static int joiners(int rank, int p, void *arg) {
    static t_el_model_t m;
    /* per step, per rank: the count each rank sees; the MAX every rank must agree on */
    static const int seen[][3] = {{0, 0, 0}, {2, 0, 5}, {0, 1, 0}, {-1, -1, -1}, {INT32_MAX, 3, 0}};
    static const int want[] = {0, 5, 1, 0, (1 << 30) - 1};
    ddp_comm_t *c;
    ddp_comm_desc_t d;
    ddp_result_t e;
    int s, k, who[3] = {0, 1, 2};
    (void)arg;
    t_el_set_transport();
    t_desc(&d, 20000);
    d.log_level = 1;
    if (!(c = t_comm_init(rank, p, &d))) return 1;
    memset(&m, 0, sizeof m);
    m.mode = T_EL_COPY;
    if (!(m.r = t_el_reducer(c, &m, T_EL_SAME))) return 1;
    ok(ddp_reducer_joiners_waiting(m.r) == 0 && ddp_reducer_joiners_waiting(NULL) == -1,
       "joiners_waiting: 0 before any finish, -1 for NULL");
    m.r->joiners_fn = hook;
    for (s = 0; s < (int)(sizeof want / sizeof want[0]); s++) {
        g_waiting = seen[s][rank];
        if (steps(&m, rank, who, p, s + 1, s + 1, "joiners") != 0) return 1;
        ok(ddp_reducer_joiners_waiting(m.r) == want[s], "step %d: this rank sees %d waiting; agreed: %d (want the "
           "MAX, clamped: %d)", s + 1, g_waiting, ddp_reducer_joiners_waiting(m.r), want[s]);
    }
    /* rank 1 leaves a gradient unmarked (no find_unused): nobody commits; the count is 0 */
    g_waiting = 4;
    for (k = 0; k < T_EL_NP; k++) {
        int i = g_ready[k];
        size_t j;
        double *gr = t_el_grad_of(&m, i);
        if (rank == 1 && i == 0) continue;
        for (j = 0; j < t_el_sizes[i]; j++) gr[j] = t_el_gradient(rank, 99, i, j);
        ddp_reducer_grad_ready(m.r, i);
    }
    e = ddp_reducer_finish(m.r);
    ok(e != DDP_SUCCESS && ddp_reducer_joiners_waiting(m.r) == 0 &&
       ddp_reducer_committed_steps(m.r) == (int64_t)(sizeof want / sizeof want[0]),
       "a step rank 1 did not complete: finish fails on every rank (%s), not committed, joiners_waiting %d",
       ddp_strerror(e), ddp_reducer_joiners_waiting(m.r));
    g_waiting = 2;
    if (steps(&m, rank, who, p, 50, 50, "joiners, after the failed step") != 0) return 1;
    ok(ddp_reducer_joiners_waiting(m.r) == 2, "and the next step agrees again: %d", ddp_reducer_joiners_waiting(m.r));
    ddp_reducer_set_no_sync(m.r, 1);
    for (k = 0; k < T_EL_NP; k++) ddp_reducer_grad_ready(m.r, g_ready[k]);
    ok(ddp_reducer_finish(m.r) == DDP_SUCCESS && ddp_reducer_joiners_waiting(m.r) == 0,
       "a no_sync finish (not a step boundary): joiners_waiting 0, not the last round's 2");
    ddp_reducer_set_no_sync(m.r, 0);
    ddp_reducer_destroy(m.r);
    {   /* without elastic: no commit round, 0 whatever the hook says */
        ddp_reducer_desc_t rd;
        ddp_reducer_t *r = NULL;
        memset(&rd, 0, sizeof rd);
        ddp_reducer_create(&r, c, &rd);
        ddp_reducer_add_param(r, m.own[0], 10, DDP_FLOAT64);
        r->joiners_fn = hook;
        ddp_reducer_grad_ready(r, 0);
        ok(ddp_reducer_finish(r) == DDP_SUCCESS && ddp_reducer_joiners_waiting(r) == 0,
           "without elastic: joiners_waiting 0");
        ddp_reducer_destroy(r);
    }
    ddp_comm_destroy(c);
    return 0;
}

int main(void) {
    static const char *const modes[] = {"tcp", "shm"};
    int m, k;
    t_init();
    t_el_order = g_ready;
    R = (result_t *)t_shm_user(sizeof *R * MAXP);
    if (t_selected("grow")) {
        for (k = 0; k < 2; k++) {
            t_el_transport = modes[k];
            for (m = T_EL_COPY; m <= T_EL_FLAT; m++) run_grow(m);   /* not fp16 */
        }
        t_el_transport = "tcp";
    }
    if (t_selected("regrow")) {
        run_regrow(T_EL_VIEW);
        run_regrow(T_EL_COPY);
    }
    if (t_selected("mismatch")) {
        diag("--- rebind with a joiner whose reducer differs, and members that cannot be reconciled");
        ok(t_run_ranks(3, mismatch, NULL, 60) == 0, "mismatch: every rank exited cleanly");
    }
    if (t_selected("joiners")) {
        diag("--- joiners waiting, agreed in the commit round");
        ok(t_run_ranks(3, joiners, NULL, 60) == 0, "joiners: every rank exited cleanly");
    }
    return t_done();
}
