/* SPDX-License-Identifier: MIT (see LICENSE) */
/* tests/test_reducer_elastic.c — the reducer goes on after a lost rank: elastic mode's commit
 * round in finish and ddp_reducer_rebind onto a smaller communicator. TAP.
 *
 *   build/test_reducer_elastic          (DDP_TEST_ONLY=<scenario> runs one)
 *
 * Scenarios:
 *   shrink  p = 4; the victim (rank 3, 0 or 1) finishes step 2, then dies (SIGKILL). The
 *           survivors' step 2 or 3 fails; they shrink the communicator (ddp_comm_shrink, the
 *           store in a process of its own, so rank 0 may be the victim: p = 3, renumbered),
 *           destroy the old one, rebind, apply the pending step if told to, and redo. Every survivor ends with 2 committed steps at the rebind
 *           (the victim committed step 2, so every rank had its average), steps 3 and 4 are
 *           exactly the average over the 3 survivors (integer-valued float64 gradients, so
 *           the check is ==), and the replicas' weights are bitwise identical and equal to a
 *           reference computed here. Copy mode, bucket views, flat mode and fp16 compression
 *           (the one that divides by the world size itself); tcp and shm. In bucket-view and
 *           fp16 modes the survivors abandon the failing step after its first bucket, without
 *           finish (rebind drops its state); a variant kills the victim between its exchange
 *           of step 2 and that step's commit round (nobody commits it: dropped everywhere).
 *   decide  p = 3, states constructed after real steps (this test pokes the reducer's step
 *           counters, as a commit round failing on some ranks would leave them): one rank
 *           missed the commit of step s; nobody committed step s (some exchanged it); one
 *           rank already exchanged s + 1 while another missed s; a rank two steps behind.
 *           Every rank gets the same decision, the right apply_pending, the same committed
 *           count; the rank told to apply holds step s's average; the irreconcilable case is
 *           DDP_ERR_MISMATCH on every rank, naming the rank.
 *   refuse  elastic with ZeRO-1 refused at create (why, in the error); rebind without
 *           elastic, with NULL arguments; committed_steps with and without elastic, and
 *           no_sync steps (no commit round) not counted.
 */
#define _GNU_SOURCE
#define DDP_IMPLEMENTATION
#include "ddp.h"
#include "transports/ddp_tcp.h"
#include "transports/ddp_shm.h"
#include "tests/ddp_test.h"
#include "tests/ddp_test_elastic.h"

#define MAXP 4

/* before_commit: the victim's reducer is not elastic (flat mode: same buckets, no rebuild); it
 * runs step 1's commit round by hand and dies between its exchange of step 2 and that step's
 * commit round: every survivor completed step 2's exchange, nobody can commit it. */
typedef struct { int mode, victim, before_commit; } shrink_arg_t;

typedef struct {                         /* per old rank, written by the children */
    uint64_t whash;
    int apply, committed, recovered, done;
} result_t;
static result_t *R;

static ddp_comm_t *init_comm(int rank, int p, int port) {
    ddp_comm_desc_t d;
    ddp_comm_t *c = NULL;
    ddp_result_t r;
    t_el_set_transport();
    t_desc(&d, 20000);
    d.master_port = port;
    d.log_level = 1;
    t_where("ddp_comm_init rank %d of %d, port %d", rank, p, port);
    r = ddp_comm_init(&c, p, rank, &d);
    if (!ok(r == DDP_SUCCESS, "[%s] ddp_comm_init rank %d of %d -> %s %s", t_el_transport, rank, p,
            ddp_strerror(r), r ? ddp_last_init_error() : ""))
        return NULL;
    return c;
}

/* ----------------------------------------------------------------- shrink */
#define STEPS 4
#define VICTIM_LAST_STEP 2
static int last_step(const shrink_arg_t *a) { return a->before_commit ? 1 : VICTIM_LAST_STEP; }

static int shrink(int rank, int p, void *arg) {
    const shrink_arg_t *a = (const shrink_arg_t *)arg;
    static t_el_model_t m;
    ddp_comm_t *c;
    int all[MAXP], surv[MAXP], ns = 0, k, step = 1, recovered = 0, newrank = rank - (rank > a->victim);
    memset(&m, 0, sizeof m);
    m.mode = a->mode;
    for (k = 0; k < p; k++) { all[k] = k; if (k != a->victim) surv[ns++] = k; }
    ddp_store_t *st = NULL;
    if (!(c = t_el_comm_on_store(rank, p, "reducer-elastic", &st))) return 1;
    if (!(m.r = t_el_reducer(c, &m, a->before_commit && rank == a->victim ? T_EL_PLAIN : T_EL_SAME))) return 1;
    while (step <= STEPS) {
        const int *members = step <= last_step(a) ? all : surv;
        int n = step <= last_step(a) ? p : ns, apply = -1, bad;
        ddp_result_t e;
        double t0;
        ddp_comm_t *nc = NULL;
        if (rank == a->victim && step > VICTIM_LAST_STEP) {
            t_where("dying after step %d", VICTIM_LAST_STEP);
            kill(getpid(), SIGKILL);
        }
        m.comm = c;
        m.abandon = !recovered && !a->before_commit && step > VICTIM_LAST_STEP &&
                    (m.mode == T_EL_VIEW || m.mode == T_EL_FP16);
        e = t_el_step_run(&m, rank, step);
        if (a->before_commit && rank == a->victim) {
            int32_t one = _ddp_reducer_commit_value(1, 0);   /* committed, no joiner waiting */
            if (step == VICTIM_LAST_STEP) {
                t_where("dying between the exchange and the commit round of step %d", step);
                kill(getpid(), SIGKILL);
            }
            if (e == DDP_SUCCESS) e = ddp_all_reduce(&one, &one, 1, DDP_INT32, DDP_MIN, c);
        }
        if (e == DDP_SUCCESS) {
            bad = t_el_step_check(&m, members, n, step);
            ok(bad == 0, "[%s] step %d%s: the average over %d ranks (%d elements differ)", t_el_mode_names[m.mode],
               step, recovered ? " (new communicator)" : "", n, bad);
            t_el_step_apply(&m);
            step++;
            continue;
        }
        if (!ok(!recovered && rank != a->victim, "[%s] step %d failed (%s: %.200s): the first failure, on a survivor",
                t_el_mode_names[m.mode], step, ddp_strerror(e), ddp_reducer_last_error(m.r)))
            return 1;
        diag("step %d failed as it should: %s: %.240s", step, ddp_strerror(e), ddp_reducer_last_error(m.r));
        if (a->before_commit)
            ok(step == VICTIM_LAST_STEP && strstr(ddp_reducer_last_error(m.r), "commit round failed"),
               "step %d: the exchange completed, the commit round failed: %.200s", step, ddp_reducer_last_error(m.r));
        t0 = t_now();
        t_where("ddp_comm_shrink");
        e = ddp_comm_shrink(c, NULL, &nc);
        if (!ok(e == DDP_SUCCESS && nc && ddp_comm_size(nc) == ns && ddp_comm_rank(nc) == newrank,
                "[%s] shrink -> %s: rank %d of %d (want %d of %d) %s", t_el_mode_names[m.mode], ddp_strerror(e),
                ddp_comm_rank(nc), ddp_comm_size(nc), newrank, ns, e ? ddp_comm_last_error(c) : ""))
            return 1;
        t_where("destroying the old communicator");
        ddp_comm_destroy(c);   /* revoked by the shrink: waits on nobody */
        c = nc;
        t_where("rebind");
        e = ddp_reducer_rebind(m.r, c, &apply);
        if (!ok(e == DDP_SUCCESS, "[%s] rebind onto %d ranks -> %s %s", t_el_mode_names[m.mode], ns, ddp_strerror(e),
                ddp_reducer_last_error(m.r)))
            return 1;
        ok(ddp_reducer_committed_steps(m.r) == last_step(a), "committed steps after rebind: %lld (the victim "
           "committed step %d, so every rank had its average)", (long long)ddp_reducer_committed_steps(m.r),
           last_step(a));
        ok(apply == (step == VICTIM_LAST_STEP && !a->before_commit), "failed in step %d: apply_pending %d", step, apply);
        if (apply) {   /* the gradients still hold step 2's average over the 4 ranks */
            bad = t_el_step_check(&m, all, p, VICTIM_LAST_STEP);
            ok(bad == 0, "[%s] the pending step's gradients are its average over %d ranks (%d differ)",
               t_el_mode_names[m.mode], p, bad);
            t_el_step_apply(&m);
        }
        diag("recovered in %.3f s (shrink to %d ranks, destroy, rebind)%s", t_now() - t0, ns,
             m.abandon ? "; backward abandoned after the first bucket, without finish" : "");
        step = (int)ddp_reducer_committed_steps(m.r) + 1;
        recovered = 1;
        R[rank].apply = apply;
        R[rank].recovered = 1;
    }
    R[rank].committed = (int)ddp_reducer_committed_steps(m.r);
    R[rank].whash = t_hash(m.w, sizeof m.w);
    R[rank].done = 1;
    ddp_reducer_destroy(m.r);
    ddp_comm_destroy(c);
    ddp_store_close(st);
    return 0;
}

/* The survivors' weights: steps 1 .. last averaged over all p ranks, the others over the survivors. */
static uint64_t reference(int p, int victim, int last) {
    static double w[T_EL_TOTAL];
    int all[MAXP], surv[MAXP], ns = 0, k, step, i;
    size_t off, j;
    for (k = 0; k < p; k++) { all[k] = k; if (k != victim) surv[ns++] = k; }
    memset(w, 0, sizeof w);
    for (step = 1; step <= STEPS; step++)
        for (i = 0, off = 0; i < T_EL_NP; off += t_el_sizes[i], i++)
            for (j = 0; j < t_el_sizes[i]; j++)
                w[off + j] -= step <= last ? t_el_expect(all, p, step, i, j) : t_el_expect(surv, ns, step, i, j);
    return t_hash(w, sizeof w);
}

static void run_shrink(int mode, int victim, int before_commit) {
    shrink_arg_t a;
    const int p = 4;
    int r, bad = 0, same = 1, first = -1, napply = 0;
    a.mode = mode;
    a.victim = victim;
    a.before_commit = before_commit;
    memset(R, 0, sizeof *R * MAXP);
    int stop = -1;
    pid_t store = t_store_process(&t_el_store_port, &stop);
    if (!ok(store > 0 && t_el_store_port > 0, "the store (a process of its own)")) return;
    diag("--- [%s] %s: rank %d of %d dies %s step %d", t_el_transport, t_el_mode_names[mode], victim, p,
         before_commit ? "between the exchange and the commit round of" : "after", VICTIM_LAST_STEP);
    t_run_ranks(p, shrink, &a, 120);
    close(stop);
    waitpid(store, NULL, 0);
    ok(t_rank_signaled(victim, SIGKILL), "the victim died (SIGKILL)");
    for (r = 0; r < p; r++) {
        if (r == victim) continue;
        if (!(t_last_run.exited[r] && t_last_run.code[r] == 0 && R[r].done && R[r].recovered)) bad++;
        if (first < 0) first = r;
        else if (R[r].whash != R[first].whash) same = 0;
        napply += R[r].apply == 1;
    }
    ok(bad == 0, "[%s] %s: every survivor recovered once, finished %d steps and exited cleanly", t_el_transport,
       t_el_mode_names[mode], STEPS);
    ok(same, "[%s] %s: the survivors' weights are bitwise identical", t_el_transport, t_el_mode_names[mode]);
    if (mode != T_EL_FP16)
        ok(first >= 0 && R[first].whash == reference(p, victim, last_step(&a)), "[%s] %s: and equal the reference "
           "(%d step(s) over 4 ranks, the others over 3)", t_el_transport, t_el_mode_names[mode], last_step(&a));
    diag("%d of the 3 survivors applied step %d at the rebind (their commit round failed)", napply, VICTIM_LAST_STEP);
}

/* ----------------------------------------------------------------- decide */
/* Rebind onto the same communicator (any communicator will do) with the states given. */
static ddp_result_t decide_case(t_el_model_t *m, ddp_comm_t *c, const t_el_poke_t *st, int *apply) {
    t_el_poke(m->r, &st[ddp_comm_rank(c)]);
    *apply = -1;
    return ddp_reducer_rebind(m->r, c, apply);
}

static int decide(int rank, int p, void *arg) {
    static t_el_model_t m;
    ddp_comm_t *c;
    int all[MAXP], k, apply, bad, step;
    ddp_result_t e;
    (void)arg;
    memset(&m, 0, sizeof m);
    m.mode = T_EL_COPY;
    for (k = 0; k < p; k++) all[k] = k;
    if (!(c = init_comm(rank, p, t_master_port))) return 1;
    if (!(m.r = t_el_reducer(c, &m, T_EL_SAME))) return 1;
    for (step = 1; step <= 3; step++)
        if (!ok(t_el_step_run(&m, rank, step) == DDP_SUCCESS, "step %d", step)) return 1;
    ok(ddp_reducer_committed_steps(m.r) == 3, "3 steps committed");
    {   /* rank 1's commit round of step 3 failed after its exchange completed */
        const t_el_poke_t st[3] = {{3, 3, 3}, {3, 3, 2}, {3, 3, 3}};
        e = decide_case(&m, c, st, &apply);
        ok(e == DDP_SUCCESS && apply == (rank == 1), "one rank missed the commit of step 3: apply_pending %d "
           "(only there) -> %s", apply, ddp_strerror(e));
        ok(ddp_reducer_committed_steps(m.r) == 3, "committed steps: %lld (3 everywhere)",
           (long long)ddp_reducer_committed_steps(m.r));
        bad = t_el_step_check(&m, all, p, 3);
        ok(bad == 0, "the gradients hold step 3's average (%d differ): what the rank told to apply applies", bad);
    }
    if (!ok(t_el_step_run(&m, rank, 4) == DDP_SUCCESS, "step 4 after the rebind")) return 1;
    {   /* nobody committed step 4; ranks 0 and 2 completed its exchange, rank 1 did not */
        const t_el_poke_t st[3] = {{4, 4, 3}, {4, 3, 3}, {4, 4, 3}};
        e = decide_case(&m, c, st, &apply);
        ok(e == DDP_SUCCESS && apply == 0, "nobody committed step 4: apply_pending %d everywhere -> %s", apply,
           ddp_strerror(e));
        ok(ddp_reducer_committed_steps(m.r) == 3, "committed steps: %lld (3: step 4 dropped, to redo)",
           (long long)ddp_reducer_committed_steps(m.r));
    }
    if (!ok(t_el_step_run(&m, rank, 4) == DDP_SUCCESS, "step 4 redone")) return 1;
    ok(ddp_reducer_committed_steps(m.r) == 4, "committed steps: 4");
    {   /* rank 0 committed 4 and went on to exchange 5 (not committed); rank 1 missed 4's commit */
        const t_el_poke_t st[3] = {{5, 5, 4}, {4, 4, 3}, {4, 4, 4}};
        e = decide_case(&m, c, st, &apply);
        ok(e == DDP_SUCCESS && apply == (rank == 1), "one rank a step ahead, one missed the commit: "
           "apply_pending %d (only the one that missed it) -> %s", apply, ddp_strerror(e));
        ok(ddp_reducer_committed_steps(m.r) == 4, "committed steps: %lld (4 everywhere: rank 0 redoes step 5)",
           (long long)ddp_reducer_committed_steps(m.r));
    }
    {   /* rank 2 is two steps behind: it cannot have step 4's gradients */
        const t_el_poke_t st[3] = {{4, 4, 4}, {4, 4, 4}, {2, 2, 2}};
        e = decide_case(&m, c, st, &apply);
        ok(e == DDP_ERR_MISMATCH && apply == 0 && t_mentions_rank(ddp_reducer_last_error(m.r), 2),
           "irreconcilable states: DDP_ERR_MISMATCH on every rank naming rank 2 -> %s: %s", ddp_strerror(e),
           ddp_reducer_last_error(m.r));
    }
    if (!ok(t_el_step_run(&m, rank, 5) == DDP_SUCCESS, "the reducer still works")) return 1;
    ddp_reducer_destroy(m.r);
    ddp_comm_destroy(c);
    return 0;
}

/* ----------------------------------------------------------------- refuse */
static int refuse(int rank, int p, void *arg) {
    static t_el_model_t m;
    static double flat[64];
    ddp_comm_t *c;
    ddp_reducer_t *r = NULL;
    ddp_reducer_desc_t d;
    ddp_result_t e;
    int apply = 7;
    (void)arg;
    if (!(c = init_comm(rank, p, t_master_port))) return 1;
    memset(&d, 0, sizeof d);
    d.elastic = 1;
    d.zero_stage = 1;
    d.flat_grads = flat;
    d.flat_bytes = sizeof flat;
    e = ddp_reducer_create(&r, c, &d);
    ok(e == DDP_ERR_INVALID_ARGUMENT && !r && strstr(ddp_comm_last_error(c), "checkpoint"),
       "elastic with ZeRO-1 refused at create -> %s: %s", ddp_strerror(e), ddp_comm_last_error(c));
    memset(&m, 0, sizeof m);
    m.mode = T_EL_COPY;
    if (!(m.r = t_el_reducer(c, &m, T_EL_SAME))) return 1;
    ok(ddp_reducer_rebind(m.r, c, NULL) == DDP_ERR_INVALID_ARGUMENT, "rebind with NULL apply_pending");
    ok(ddp_reducer_rebind(m.r, NULL, &apply) == DDP_ERR_INVALID_ARGUMENT && apply == 0, "rebind with NULL newcomm");
    ok(ddp_reducer_committed_steps(NULL) == -1, "committed_steps(NULL) = -1");
    ok(t_el_step_run(&m, rank, 1) == DDP_SUCCESS && ddp_reducer_committed_steps(m.r) == 1,
       "elastic: one step committed");
    ddp_reducer_set_no_sync(m.r, 1);
    ok(t_el_step_run(&m, rank, 2) == DDP_SUCCESS && ddp_reducer_committed_steps(m.r) == 1,
       "a no_sync step: not counted");
    ddp_reducer_set_no_sync(m.r, 0);
    ddp_reducer_destroy(m.r);
    memset(&d, 0, sizeof d);
    r = NULL;
    ddp_reducer_create(&r, c, &d);
    ddp_reducer_add_param(r, NULL, 0, DDP_FLOAT64);   /* refused: count 0 */
    ddp_reducer_add_param(r, m.own[0], 10, DDP_FLOAT64);
    ddp_reducer_grad_ready(r, 0);
    ok(ddp_reducer_finish(r) == DDP_SUCCESS && ddp_reducer_committed_steps(r) == 1,
       "without elastic: finish's successes are counted");
    e = ddp_reducer_rebind(r, c, &apply);
    ok(e == DDP_ERR_INVALID_USAGE && strstr(ddp_reducer_last_error(r), "elastic"), "rebind without elastic -> %s: %s",
       ddp_strerror(e), ddp_reducer_last_error(r));
    ddp_reducer_destroy(r);
    ddp_comm_destroy(c);
    return 0;
}

int main(void) {
    static const char *const modes[] = {"tcp", "shm"};
    int m, k;
    t_init();
    R = (result_t *)t_shm_user(sizeof *R * MAXP);
    if (t_selected("shrink")) {
        /* every mode over tcp; copy and flat over shm; the victim the last, the first (the old
         * communicator's store) and a middle rank */
        static const int victim[2][T_EL_NUM_MODES] = {{3, 0, 1, 2}, {1, -1, 0, -1}};
        for (k = 0; k < 2; k++) {
            t_el_transport = modes[k];
            for (m = 0; m < T_EL_NUM_MODES; m++)
                if (victim[k][m] >= 0) run_shrink(m, victim[k][m], 0);
            run_shrink(T_EL_FLAT, k ? 2 : 0, 1);
        }
        t_el_transport = "tcp";
    }
    if (t_selected("decide")) {
        diag("--- the commit decision, from constructed states, p = 3");
        ok(t_run_ranks(3, decide, NULL, 60) == 0, "decide: every rank exited cleanly");
    }
    if (t_selected("refuse")) {
        diag("--- refusals and the committed-step count");
        ok(t_run_ranks(2, refuse, NULL, 60) == 0, "refuse: every rank exited cleanly");
    }
    return t_done();
}
