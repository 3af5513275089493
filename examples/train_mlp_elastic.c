/* SPDX-License-Identifier: MIT (see LICENSE) */
/* train_mlp_elastic.c — examples/train_mlp.c's MLP training that survives a lost rank and grows
 * back: when a rank dies the others shrink the communicator (ddp_comm_shrink), move the reducer
 * to it (ddp_reducer_rebind: apply or redo the step that failed), deal the rest of the epoch over
 * themselves (ddp_sampler_reshard) and go on, no restart. When a replacement waits to join
 * (ddprun --elastic MIN --max-restarts N starts one with DDP_ELASTIC_JOIN=1; the elastic
 * reducer's commit round tells every member at the same step), the members admit it at the end
 * of a step (ddp_comm_grow), send it the weights and the position in the epoch (ddp_state_sync:
 * each member a share, checked against digests), move the reducer (ddp_reducer_rebind) and deal
 * the rest of the epoch over the grown world; the replacement, started as the same program,
 * returns from ddp_comm_init_env admitted, receives the state and goes on from there. The
 * training loop in main is the plain one plus the blocks marked ELASTIC (lines marked "demo"
 * only measure and count for the demo's report; docs/elastic_training.md quotes them).
 *
 * The model, dataset, backward pass, weight hash and comparison are train_mlp.c's (included
 * below, its main renamed and unused). The reducer is elastic (desc.elastic = 1: a commit round
 * in finish).
 *
 * FAULT INJECTION (standing in for a launcher or a machine killing a rank; deterministic, so a
 * failing run can be replayed exactly): DDP_DEMO_KILL=RANK:STEP makes the rank RANK (of the
 * first communicator) SIGKILL itself at its STEP-th step (0-based, counted over all epochs) in
 * the middle of backward, after the first gradient bucket was handed to the reducer and before
 * the second: a bucket is in flight. Just before, it writes the time (CLOCK_REALTIME, seconds)
 * to DDP_DEMO_KILL_FILE (default: ${TMPDIR:-/tmp}/train_mlp_elastic.<parent pid>.kill, the
 * parent being ddprun, shared by all ranks) and says so on stderr.
 *
 * Rank 0 (of the communicator that finishes) prints per epoch loss, accuracy and the world
 * size, then: when the failure was seen and when the shrunk communicator completed its first
 * step (ms after the kill, the slowest survivor's); after a grow, the timeline (replacement
 * started, admitted, state received, first step at full size), the final accuracy, whether the replicas
 * are bitwise identical (every survivor's weights hash, MAX and MIN over the new
 * communicator), and the sample accounting: per epoch, how many applied steps used each
 * dataset index (the survivors' counts summed over the communicator; the lost rank's part
 * before the failure recomputed from its sampler) against the epoch's list that PyTorch's
 * DistributedSampler lays out (every index once, a few twice as padding); and the weights
 * against a single-process replay of the applied steps (every rank's batch from its sampler,
 * segment by segment: the epoch's world, then each re-shard's; per-rank mean gradients averaged
 * over the step's world), to 1e-5 relative as train_mlp.c's reference. Then one line
 *     train_mlp_elastic: RESULT kill=R:S seen_ms=.. first_step_ms=.. [grown=4 join_to_full_ms=..]
 *                       accuracy=.. identical=yes samples=ok replay=equal PASS
 * and every survivor exits 0 (PASS) or 1 (FAIL): rank 0 broadcasts its verdict, since under
 * ddprun --elastic one rank's non-zero exit alone is a tolerated loss. With DDP_DEMO_KILL set, a
 * run in which no rank was lost FAILs; so does one under --max-restarts (TORCHELASTIC_MAX_RESTARTS
 * > 0 with DDP_ELASTIC_MIN_RANKS) that did not grow back to its first size.
 *
 * THE RESTART BASELINE (bench/restart_vs_shrink.sh: what a job without shrink loses per failure,
 * torchrun's --max-restarts answer): under a launcher that restarts every rank, DDP_DEMO_KILL acts
 * in the first attempt only (TORCHELASTIC_RESTART_COUNT 0 or unset); DDP_DEMO_NO_SHRINK=1 makes a
 * failed step end the process as a plain trainer does; DDP_DEMO_STEP_LOG=FILE has rank 0 append
 * "first_step ATTEMPT TIME" (CLOCK_REALTIME, seconds) when its first step of the process is done.
 *
 * Run: make elastic-demo (random rank and step, tcp and shm), or by hand
 *     DDP_DEMO_KILL=0:100 build/ddprun -n 4 --elastic 3 --max-restarts 1 build/train_mlp_elastic
 * (without --max-restarts the job finishes on 3 ranks).
 * No arguments.
 */
#define main train_mlp_main /* train_mlp.c's main: not called */
#include "train_mlp.c"
#undef main

#include <signal.h>
#include <unistd.h>

static double realtime_s(void);
/* The restart baseline's timestamp (DDP_DEMO_STEP_LOG). */
static void log_first_step(const char *path, int attempt) {
    FILE *f = fopen(path, "a");
    if (!f) return;
    fprintf(f, "first_step %d %.6f\n", attempt, realtime_s());
    fclose(f);
}

static double realtime_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ---------------------------------------------------------------- fault injection */
typedef struct {
    ddp_reducer_t *red;
    int kill_now;               /* this rank dies in this step's backward */
    const char *kill_file;
} step_ctx_t;

static void die_now(const char *kill_file) {
    double t = realtime_s();
    FILE *f = fopen(kill_file, "w");
    if (f) fprintf(f, "%.9f\n", t), fclose(f);
    fprintf(stderr, "train_mlp_elastic: SIGKILL to myself at %.6f (bucket 0 in flight)%s%s\n", t,
            f ? "; time in " : "; cannot write ", kill_file);
    fflush(stderr);
    kill(getpid(), SIGKILL);
}

/* batch_grad's grad_ready_fn. Tensor 1 (b1) comes after W2 completed bucket 0 {b3 W3 b2 W2}:
 * the kill lands between two grad_ready calls. A grad_ready that fails (a peer gone) fails
 * finish too, which is where the loop looks. */
static int ready_or_die(int tensor, void *arg) {
    step_ctx_t *c = (step_ctx_t *)arg;
    if (c->kill_now && tensor == 1) die_now(c->kill_file);
    (void)ddp_reducer_grad_ready(c->red, tensor);
    return 0;
}

/* One step's gradient: batch_grad, or zeros for an empty batch (after a re-shard the last step
 * can be empty on some ranks; they still join its collectives, as torch's Join does). */
static void step_grad(const float *p, const float *data, const int *label, const uint64_t *b,
                      uint64_t len, float *g, double *st, const workspace_t *ws, step_ctx_t *ctx) {
    int t;
    if (len > 0) {
        batch_grad(p, data, label, b, len, g, st, ws, ready_or_die, ctx);
        return;
    }
    memset(g, 0, sizeof(float) * NPARAM);
    for (t = NTENSORS - 1; t >= 0; t--) ready_or_die(t, ctx);
}

/* ---------------------------------------------------------------- sample accounting */
static void tally(int32_t *cnt, const uint64_t *b, uint64_t len, int32_t d) {
    uint64_t i;
    for (i = 0; i < len; i++) cnt[b[i]] += d;
}

/* cnt[i] += how often rank q of a world of w holds index i at positions below `below` of the
 * epoch's list (all of its shard when below is the list's length). tmp: room for a shard. */
static int tally_shard(int32_t *cnt, int w, int q, uint64_t epoch, uint64_t below, uint64_t *tmp) {
    ddp_sampler_t s;
    uint64_t j, n;
    if (ddp_sampler_init(&s, SAMPLES, w, q, 1, SAMPLER_SEED, 0) != DDP_SUCCESS) return -1;
    ddp_sampler_set_epoch(&s, epoch);
    if (ddp_sampler_indices(&s, tmp) != DDP_SUCCESS) return -1;
    n = ddp_sampler_num_samples(&s);
    for (j = 0; j < n && (uint64_t)q + j * (uint64_t)w < below; j++) cnt[tmp[j]]++;
    return 0;
}

/* The epoch's list as torch lays it out for epoch_replicas ranks against cnt (every applied
 * step's indices): lost = uses missing, extra = uses beyond the list's (padding is in the list). */
static int account(const int32_t *cnt, int32_t *want, int epoch_replicas, uint64_t epoch, uint64_t *tmp,
                   long *lost, long *extra) {
    int q, i;
    memset(want, 0, sizeof(int32_t) * SAMPLES);
    for (q = 0; q < epoch_replicas; q++)
        if (tally_shard(want, epoch_replicas, q, epoch, UINT64_MAX, tmp) != 0) return -1;
    *lost = *extra = 0;
    for (i = 0; i < SAMPLES; i++) {
        if (cnt[i] < want[i]) *lost += want[i] - cnt[i];
        if (cnt[i] > want[i]) *extra += cnt[i] - want[i];
    }
    return 0;
}

/* ---------------------------------------------------------------- the single-process replay */
/* steps steps of the ranks whose samplers are s[0..w) (set for the epoch, re-sharded or not),
 * replayed in one process: each rank's mean gradient over its batch, averaged over the w ranks
 * (what the reducer's average does; an empty batch counts as a zero gradient), then SGD. */
static int replay_part(float *p, ddp_sampler_t *s, int w, uint64_t steps, const float *data,
                       const int *label, uint64_t *idx, size_t cap, float *g, float *sum,
                       const workspace_t *ws) {
    ddp_batch_iter_t it[8];
    double st[2] = {0, 0};
    const uint64_t *b;
    uint64_t k, len;
    int q, i;
    for (q = 0; q < w; q++)
        if (ddp_sampler_indices(&s[q], idx + cap * (size_t)q) != DDP_SUCCESS ||
            ddp_batch_iter_init(&it[q], idx + cap * (size_t)q, ddp_sampler_num_samples(&s[q]), BATCH, 0) != DDP_SUCCESS)
            return -1;
    for (k = 0; k < steps; k++) {
        memset(sum, 0, sizeof(float) * NPARAM);
        for (q = 0; q < w; q++)
            if ((len = ddp_batch_iter_next(&it[q], &b)) != 0) {
                batch_grad(p, data, label, b, len, g, st, ws, NULL, NULL);
                for (i = 0; i < NPARAM; i++) sum[i] += g[i];
            }
        for (i = 0; i < NPARAM; i++) g[i] = sum[i] / (float)w;
        sgd_step(p, g);
    }
    return 0;
}

/* A stretch of training the replay redoes: `steps` applied steps of `epoch` on `world` ranks,
 * each dealt positions start + rank, start + rank + world, ... of the epoch's list laid out for
 * `layout` ranks (set_epoch's world). A set_epoch starts one (start 0, world = layout); every
 * re-shard (a shrink, a grow) starts another. */
typedef struct {
    int epoch, layout, world;
    uint64_t start, steps;
} segment_t;
#define MAX_SEGMENTS 64

/* The whole run from the initial weights p, segment by segment. At most 8 ranks. */
static int replay(float *p, const float *data, const int *label, const segment_t *seg, int nseg) {
    ddp_sampler_t s[8];
    size_t cap = SAMPLES + 8;
    uint64_t *idx = (uint64_t *)malloc(sizeof *idx * cap * 8);
    float *g = (float *)malloc(sizeof(float) * NPARAM), *sum = (float *)malloc(sizeof(float) * NPARAM);
    workspace_t ws;
    int k, q, rc = -1;
    memset(&ws, 0, sizeof ws);
    if (!idx || !g || !sum || workspace_alloc(&ws, BATCH) != 0) goto out;
    for (k = 0; k < nseg; k++) {
        if (seg[k].world > 8 || seg[k].layout > 8) goto out;
        for (q = 0; q < seg[k].world; q++) {
            if (ddp_sampler_init(&s[q], SAMPLES, seg[k].layout, 0, 1, SAMPLER_SEED, 0) != DDP_SUCCESS) goto out;
            ddp_sampler_set_epoch(&s[q], (uint64_t)seg[k].epoch);
            if (ddp_sampler_reshard(&s[q], seg[k].world, q, seg[k].start) != DDP_SUCCESS) goto out;
        }
        if (replay_part(p, s, seg[k].world, seg[k].steps, data, label, idx, cap, g, sum, &ws) != 0) goto out;
    }
    rc = 0;
out:
    free(idx), free(g), free(sum);
    workspace_free(&ws);
    return rc;
}

/* (Re)starts this rank's part of the epoch after set_epoch or a re-shard. */
static int start_shard(ddp_sampler_t *s, uint64_t *idx, ddp_batch_iter_t *it) {
    if (ddp_sampler_indices(s, idx) == DDP_SUCCESS &&
        ddp_batch_iter_init(it, idx, ddp_sampler_num_samples(s), BATCH, 0) == DDP_SUCCESS)
        return 0;
    fprintf(stderr, "train_mlp_elastic: sampler: %s\n", ddp_sampler_last_error(s));
    return -1;
}

/* ELASTIC: what a joiner needs besides the weights (plain SGD: no optimizer state): where the
 * epoch is, and the step counter. */
typedef struct {
    ddp_sampler_position_t pos;
    int64_t step;
} demo_state_t;

/* ELASTIC, after a grow, on every rank: the members (ranks below ddp_comm_grow_members) each send
 * a share of the state, the joiners receive it and check every share against its sender's
 * digest. *mb_s: the state's bytes over the call's time. */
static ddp_result_t sync_state(ddp_comm_t *comm, float *p, demo_state_t *st, double *mb_s) {
    ddp_state_buf_t b[2];
    ddp_state_report_t rep;
    ddp_result_t r;
    b[0].ptr = p, b[0].bytes = sizeof(float) * NPARAM;
    b[1].ptr = st, b[1].bytes = sizeof *st;
    r = ddp_state_sync(comm, ddp_comm_grow_members(comm), b, 2, NULL, &rep);
    if (r == DDP_SUCCESS && rep.seconds > 0) *mb_s = (double)rep.bytes / rep.seconds / 1e6;
    return r;
}

static int fail_msg(const char *what, ddp_comm_t *c) {
    fprintf(stderr, "train_mlp_elastic: %s failed: %s\n", what, c ? ddp_comm_last_error(c) : ddp_last_init_error());
    return 1;
}

/* ---------------------------------------------------------------- the demo's report */
/* What the demo records for its report; a trainer needs none of it. */
typedef struct {
    int kill_rank;               /* DDP_DEMO_KILL's, -1: none */
    long kill_step;
    const char *kill_env, *kill_file;
    double times[6];             /* CLOCK_REALTIME: finish failed; first step on the shrunk comm
                                  * done; a joiner started; grown (grow / join returned); state
                                  * received; first step at full size done */
    int nfail, fail_epoch, fail_world, dead[8], ndead; /* the (last) failure: epoch, world before */
    uint64_t fail_consumed, fail_done;                 /* its re-shard's consumed; steps applied */
    long fail_lost, fail_extra;  /* the failure epoch's accounting */
    int samples_ok;              /* every epoch's accounting exact */
    segment_t seg[MAX_SEGMENTS]; /* what the replay redoes */
    int nseg, ngrow;
    int expect_grow;             /* ddprun --max-restarts gives the lost rank a replacement */
    double state_mb_s;           /* the joiner's state transfer */
} run_t;

/* A new segment (a set_epoch or a re-shard); its steps are counted as they are applied. */
static void segment(run_t *r, int epoch, int layout, int world, uint64_t start) {
    if (r->nseg < MAX_SEGMENTS) {
        segment_t *g = &r->seg[r->nseg++];
        g->epoch = epoch, g->layout = layout, g->world = world, g->start = start, g->steps = 0;
    }
}
static void applied(run_t *r) { if (r->nseg > 0) r->seg[r->nseg - 1].steps++; }

/* Rank 0 at the end of an epoch, cnt the uses of each index summed over the ranks: adds the
 * lost ranks' applied steps (from their samplers) in the failure's epoch, then checks cnt
 * against the epoch's list. Returns -1 if a sampler call failed. */
static int epoch_accounting(run_t *r, int32_t *cnt, int32_t *want, uint64_t *tmp, const ddp_sampler_t *smp,
                            int epoch) {
    long lost, extra;
    int t;
    if (epoch == r->fail_epoch)
        for (t = 0; t < r->ndead && t < 8; t++)
            if (tally_shard(cnt, r->fail_world, r->dead[t], (uint64_t)epoch, r->fail_consumed, tmp) != 0) return -1;
    if (account(cnt, want, ddp_sampler_epoch_replicas(smp), (uint64_t)epoch, tmp, &lost, &extra) != 0) return -1;
    if (epoch == r->fail_epoch) r->fail_lost = lost, r->fail_extra = extra;
    if (lost || extra) {
        r->samples_ok = 0;
        printf("train_mlp_elastic: epoch %d: %ld uses of samples lost, %ld beyond the epoch's list\n",
               epoch + 1, lost, extra);
    }
    return 0;
}

/* Rank 0's verdict, printed: the timings against the kill time, accuracy, replicas, accounting
 * and the single-process replay from the initial weights p0 (overwritten). 1: PASS. */
static int32_t verdict(const run_t *r, const float *p, float *p0, const float *data, const int *label,
                       int world0, int world, double acc, int identical) {
    FILE *f = r->kill_rank >= 0 ? fopen(r->kill_file, "r") : NULL;
    double t_kill = 0, rel = -1;
    int killed = f && fscanf(f, "%lf", &t_kill) == 1, worst = 0, equal;
    int32_t pass;
    if (f) fclose(f), remove(r->kill_file);
    if (r->kill_rank < 0)
        printf("train_mlp_elastic: no rank was killed (DDP_DEMO_KILL not set)\n");
    else if (r->nfail == 0 || !killed)
        printf("train_mlp_elastic: rank %d was to be killed at step %ld, but %s\n", r->kill_rank, r->kill_step,
               r->nfail == 0 ? "no rank was lost" : "its kill time is not in DDP_DEMO_KILL_FILE");
    else {
        printf("failure seen %.1f ms after the kill (the last survivor to see it)\n", 1e3 * (r->times[0] - t_kill));
        printf("first step on the shrunk communicator (%d ranks) completed %.1f ms after the kill\n",
               world0 - 1, 1e3 * (r->times[1] - t_kill));
        if (r->times[2] > 0)
            printf("timeline (ms after the kill): replacement started %.1f, admitted (grown to %d ranks) %.1f, "
                   "state received %.1f (%.0f MB/s), first step at full size %.1f; joiner start -> first step "
                   "at full size %.1f ms\n", 1e3 * (r->times[2] - t_kill), world, 1e3 * (r->times[3] - t_kill),
                   1e3 * (r->times[4] - t_kill), r->state_mb_s, 1e3 * (r->times[5] - t_kill),
                   1e3 * (r->times[5] - r->times[2]));
    }
    printf("final accuracy %.1f%% (need >= %.0f%%)\n", 100 * acc, 100 * MIN_ACCURACY);
    printf("replicas bitwise identical on all %d ranks: %s\n", world, identical ? "yes" : "NO");
    if (r->nfail > 0)
        printf("epoch %d (the failure's) sample accounting: %s (%ld lost, %ld repeated beyond PyTorch's "
               "padding of %d)\n", r->fail_epoch + 1,
               r->fail_lost || r->fail_extra ? "WRONG" : "every sample used by exactly one applied step",
               r->fail_lost, r->fail_extra,
               (int)((SAMPLES + r->fail_world - 1) / r->fail_world * r->fail_world - SAMPLES));
    printf("sample accounting, all %d epochs: %s\n", EPOCHS, r->samples_ok ? "ok" : "WRONG");
    /* The same training replayed in one process (one failure at most; more would need a replay
     * of each re-shard): the survivors' weights must equal it to REL_TOL. */
    if (replay(p0, data, label, r->seg, r->nseg) == 0 && r->nseg < MAX_SEGMENTS)
        rel = weights_rel_diff(p, p0, &worst);
    equal = rel >= 0 && rel <= REL_TOL;
    printf("single-process replay of the applied steps: max relative difference %.2e in %s (limit %.0e): %s\n",
           rel, tensors[worst].name, REL_TOL, equal ? "equal" : "DIFFERENT");
    pass = identical && acc >= MIN_ACCURACY && r->samples_ok && equal &&
           (r->kill_rank < 0 || (r->nfail > 0 && killed && r->times[1] > 0 &&
                                 (r->expect_grow ? world == world0 && r->times[5] > 0 : world == world0 - 1)));
    printf("train_mlp_elastic: RESULT kill=%s seen_ms=%.1f first_step_ms=%.1f", r->kill_rank >= 0 ? r->kill_env
           : "none", killed ? 1e3 * (r->times[0] - t_kill) : -1.0, killed ? 1e3 * (r->times[1] - t_kill) : -1.0);
    if (r->expect_grow)
        printf(" grown=%d join_to_full_ms=%.1f", world, r->times[5] > 0 ? 1e3 * (r->times[5] - r->times[2]) : -1.0);
    printf(" accuracy=%.1f identical=%s samples=%s replay=%s %s\n", 100 * acc, identical ? "yes" : "no",
           r->samples_ok ? "ok" : "WRONG", equal ? "equal" : "DIFFERENT", pass ? "PASS" : "FAIL");
    fflush(stdout);
    return pass;
}

int main(int argc, char **argv) {
    ddp_comm_t *comm, *nc;
    ddp_reducer_t *reducer;
    ddp_reducer_desc_t rdesc;
    ddp_shrink_opts_t sopts;
    demo_state_t dst;
    const double t_start = realtime_s();   /* (demo: a joiner's start, for the timeline) */
    workspace_t ws;
    void *views[NTENSORS];
    size_t counts[NTENSORS];
    ddp_dtype_t dtypes[NTENSORS];
    ddp_sampler_t smp;
    ddp_batch_iter_t it;
    step_ctx_t ctx;
    float *data, *p, *p0, *g;
    int32_t *cnt, *want, pass;
    int *label, rank, world, world0, epoch, t, apply, identical, joined, resumed = 0, start_epoch = 0;
    long step = 0;
    uint64_t *idx, *tmp, hash[2];
    double stats[3], acc = 0;
    const char *min_env = getenv("DDP_ELASTIC_MIN_RANKS"), *tmpdir = getenv("TMPDIR");
    const char *attempt_env = getenv("TORCHELASTIC_RESTART_COUNT"), *step_log = getenv("DDP_DEMO_STEP_LOG");
    const int attempt = attempt_env ? atoi(attempt_env) : 0, no_shrink = getenv("DDP_DEMO_NO_SHRINK") != NULL;
    const char *restarts_env = getenv("TORCHELASTIC_MAX_RESTARTS");
    char kill_path[512];
    run_t run;

    if (argc > 1) {
        fprintf(stderr, "usage: [DDP_DEMO_KILL=RANK:STEP] ddprun -n 4 --elastic 3 %s   (no arguments; "
                        "see examples/train_mlp_elastic.c)\n", argv[0]);
        return 2;
    }
    memset(&run, 0, sizeof run);
    run.kill_rank = run.fail_epoch = -1, run.samples_ok = 1;
    run.kill_env = getenv("DDP_DEMO_KILL"), run.kill_file = getenv("DDP_DEMO_KILL_FILE");
    if (run.kill_env && *run.kill_env && sscanf(run.kill_env, "%d:%ld", &run.kill_rank, &run.kill_step) != 2) {
        fprintf(stderr, "train_mlp_elastic: DDP_DEMO_KILL='%s': want RANK:STEP\n", run.kill_env);
        return 2;
    }
    if (attempt > 0) run.kill_rank = -1;     /* (baseline) a restarted attempt runs undisturbed */
    if (!run.kill_file || !*run.kill_file) {
        snprintf(kill_path, sizeof kill_path, "%s/train_mlp_elastic.%ld.kill",
                 tmpdir && *tmpdir ? tmpdir : "/tmp", (long)getppid());
        run.kill_file = kill_path;
    }
    memset(&sopts, 0, sizeof sopts);
    memset(&dst, 0, sizeof dst);
    /* (demo) ddprun --elastic MIN --max-restarts N replaces the lost rank: the run must grow back */
    run.expect_grow = run.kill_rank >= 0 && min_env && restarts_env && atoi(restarts_env) > 0;
    sopts.min_ranks = min_env ? atoi(min_env) : 0;   /* ddprun --elastic MIN sets it */

    /* A replacement (DDP_ELASTIC_JOIN=1) returns from here once the members admitted it. */
    if (ddp_comm_init_env(&comm, NULL) != DDP_SUCCESS) return fail_msg("ddp_comm_init_env", NULL);
    rank = ddp_comm_rank(comm);
    world = world0 = ddp_comm_size(comm);
    joined = ddp_comm_joined(comm);

    data = (float *)malloc(sizeof(float) * SAMPLES * IN);
    label = (int *)malloc(sizeof(int) * SAMPLES);
    p = (float *)malloc(sizeof(float) * NPARAM);
    p0 = (float *)malloc(sizeof(float) * NPARAM);
    g = (float *)malloc(sizeof(float) * NPARAM);
    cnt = (int32_t *)malloc(sizeof(int32_t) * SAMPLES);
    want = (int32_t *)malloc(sizeof(int32_t) * SAMPLES);
    /* a shard never holds more than the epoch's list, n + W - 1 entries for any W <= world0 */
    idx = (uint64_t *)malloc(sizeof *idx * (SAMPLES + (size_t)world0));
    tmp = (uint64_t *)malloc(sizeof *tmp * (SAMPLES + (size_t)world0));
    if (!data || !label || !p || !p0 || !g || !cnt || !want || !idx || !tmp || workspace_alloc(&ws, BATCH) != 0) {
        fprintf(stderr, "train_mlp_elastic: out of memory\n");
        return 1;
    }
    if (ddp_sampler_init(&smp, SAMPLES, world, rank, 1, SAMPLER_SEED, 0) != DDP_SUCCESS) {
        fprintf(stderr, "train_mlp_elastic: sampler: %s\n", ddp_sampler_last_error(&smp));
        return 1;
    }
    make_dataset(data, label);
    init_params(p, 1000 + (uint64_t)rank);
    for (t = 0; t < NTENSORS; t++) {
        views[t] = p + tensors[t].off;
        counts[t] = (size_t)tensors[t].len;
        dtypes[t] = DDP_FLOAT32;
    }
    if (!joined && ddp_broadcast_params(comm, views, counts, dtypes, NTENSORS, 0) != DDP_SUCCESS)
        return fail_msg("broadcast_params", comm);
    memcpy(p0, p, sizeof(float) * NPARAM);

    memset(&rdesc, 0, sizeof rdesc);
    rdesc.first_bucket_bytes = FIRST_BUCKET_BYTES;
    rdesc.bucket_cap_bytes = BUCKET_CAP_BYTES;
    rdesc.elastic = 1;                               /* ELASTIC: commit round in finish */
    if (ddp_reducer_create(&reducer, comm, &rdesc) != DDP_SUCCESS) return fail_msg("reducer_create", comm);
    for (t = 0; t < NTENSORS; t++)
        if (ddp_reducer_add_param(reducer, g + tensors[t].off, (size_t)tensors[t].len, DDP_FLOAT32) != t)
            return fail_msg("reducer_add_param", comm);
    ctx.red = reducer;
    ctx.kill_file = run.kill_file;
    if (joined) {                        /* ELASTIC: a replacement takes the members' state */
        run.times[2] = t_start, run.times[3] = realtime_s();                  /* (demo: timing) */
        if (sync_state(comm, p, &dst, &run.state_mb_s) != DDP_SUCCESS) return fail_msg("ddp_state_sync", comm);
        if (ddp_reducer_rebind(reducer, comm, &apply) != DDP_SUCCESS) return fail_msg("ddp_reducer_rebind", comm);
        if (ddp_sampler_resume(&smp, &dst.pos, world, rank) != DDP_SUCCESS) return 1;
        start_epoch = (int)dst.pos.epoch, step = (long)dst.step, resumed = 1;
        run.times[4] = realtime_s();                                          /* (demo: timing) */
    }

    if (rank == 0 && !joined) {
        printf("train_mlp_elastic: MLP %d-%d-%d-%d (%d parameters), %d samples, %d ranks x batch %d, "
               "%d epochs, SGD lr %g; elastic reducer, shrinks while at least %d rank(s) remain\n", IN, H1, H2, OUT,
               (int)NPARAM, SAMPLES, world, BATCH, EPOCHS, (double)LR, sopts.min_ranks > 0 ? sopts.min_ranks : 1);
        if (run.kill_rank >= 0)
            printf("train_mlp_elastic: DDP_DEMO_KILL: rank %d SIGKILLs itself at step %ld, in backward "
                   "with a bucket in flight\n", run.kill_rank, run.kill_step);
        print_buckets(reducer, "(reverse registration order)");
    }

    for (epoch = start_epoch; epoch < EPOCHS; epoch++) {
        const uint64_t *b;
        uint64_t len, nsteps, done = 0, c;   /* done: steps applied since set_epoch / the re-shard */
        if (!resumed) {                      /* (a joiner's sampler resumed mid-epoch) */
            ddp_sampler_set_epoch(&smp, (uint64_t)epoch);
            segment(&run, epoch, world, world, 0);                            /* (demo: replay) */
        }
        resumed = 0;
        if (start_shard(&smp, idx, &it) != 0) return 1;
        nsteps = ddp_sampler_num_steps(&smp, BATCH);
        memset(cnt, 0, sizeof(int32_t) * SAMPLES);
        stats[0] = stats[1] = stats[2] = 0;
        while (done < nsteps) {
            double st[2] = {0, 0};
            len = ddp_batch_iter_next(&it, &b);
            ctx.kill_now = rank == run.kill_rank && step == run.kill_step && ddp_comm_generation(comm) == 0;
            step++;
            step_grad(p, data, label, b, len, g, st, &ws, &ctx);
            tally(cnt, b, len, 1);
            if (ddp_reducer_finish(reducer) != DDP_SUCCESS) {          /* ELASTIC: a rank died */
                if (no_shrink) return fail_msg("ddp_reducer_finish (DDP_DEMO_NO_SHRINK)", comm); /* (baseline) */
                if (run.times[0] == 0) run.times[0] = realtime_s();       /* (demo: timing) */
                if (ddp_comm_shrink(comm, &sopts, &nc) != DDP_SUCCESS) return fail_msg("ddp_comm_shrink", comm);
                ddp_comm_destroy(comm);                                  /* waits on nobody */
                run.fail_world = world;                                  /* (demo: accounting) */
                comm = nc, world = ddp_comm_size(comm), rank = ddp_comm_rank(comm);
                if (ddp_reducer_rebind(reducer, comm, &apply) != DDP_SUCCESS)
                    return fail_msg("ddp_reducer_rebind", comm);
                if (!apply) tally(cnt, b, len, -1);   /* (demo accounting: the batch goes back) */
                else applied(&run);                                      /* (demo: replay) */
                if (ddp_sampler_consumed_after(&smp, done + (uint64_t)apply, BATCH, &c) != DDP_SUCCESS ||
                    ddp_sampler_reshard(&smp, world, rank, c) != DDP_SUCCESS || start_shard(&smp, idx, &it) != 0)
                    return 1;                                            /* the rest of the epoch */
                run.fail_epoch = epoch, run.fail_consumed = c, run.fail_done = done + (uint64_t)apply; /* (demo) */
                run.nfail++, run.ndead = ddp_comm_removed_ranks(comm, run.dead, 8); /* (demo: accounting) */
                segment(&run, epoch, ddp_sampler_epoch_replicas(&smp), world, c);    /* (demo: replay) */
                nsteps = ddp_sampler_num_steps(&smp, BATCH), done = 0;
                if (!apply) continue;                                    /* redo: nobody applied it */
            } else {
                done++;
                applied(&run);                                           /* (demo: replay) */
                if (step_log && step == 1 && rank == 0) log_first_step(step_log, attempt);   /* (baseline) */
                if (run.times[1] == 0 && !joined && ddp_comm_generation(comm) > 0) run.times[1] = realtime_s(); /* (demo) */
                if (run.times[5] == 0 && ddp_comm_grow_members(comm) < world) run.times[5] = realtime_s(); /* (demo) */
            }
            stats[0] += st[0], stats[1] += st[1], stats[2] += (double)len;
            sgd_step(p, g);
            if (ddp_reducer_joiners_waiting(reducer) > 0) {              /* ELASTIC: grow back */
                ddp_comm_t *grown = NULL;
                if (ddp_comm_grow(comm, NULL, &grown) != DDP_SUCCESS) return fail_msg("ddp_comm_grow", comm);
                if (!grown) continue;                                    /* nobody came in after all */
                run.times[3] = realtime_s();                             /* (demo: timing) */
                if (ddp_sampler_position_after(&smp, done, BATCH, &dst.pos) != DDP_SUCCESS) return 1;
                dst.step = step;
                ddp_comm_destroy(comm);                                  /* retired */
                comm = grown, world = ddp_comm_size(comm), rank = ddp_comm_rank(comm);
                if (sync_state(comm, p, &dst, &run.state_mb_s) != DDP_SUCCESS) return fail_msg("ddp_state_sync", comm);
                if (ddp_reducer_rebind(reducer, comm, &apply) != DDP_SUCCESS) return fail_msg("ddp_reducer_rebind", comm);
                if (ddp_sampler_reshard(&smp, world, rank, dst.pos.consumed) != DDP_SUCCESS ||
                    start_shard(&smp, idx, &it) != 0)
                    return 1;                                            /* the rest of the epoch */
                nsteps = ddp_sampler_num_steps(&smp, BATCH), done = 0;
                run.times[4] = realtime_s(), run.ngrow++;                /* (demo: timing) */
                segment(&run, epoch, ddp_sampler_epoch_replicas(&smp), world, dst.pos.consumed); /* (demo) */
            }
        }
        /* loss sum, correct, samples over the ranks that finished the epoch; index uses */
        if (ddp_all_reduce(stats, stats, 3, DDP_FLOAT64, DDP_SUM, comm) != DDP_SUCCESS ||
            ddp_all_reduce(cnt, cnt, SAMPLES, DDP_INT32, DDP_SUM, comm) != DDP_SUCCESS)
            return fail_msg("all_reduce (epoch statistics)", comm);
        acc = stats[1] / stats[2];
        if (rank != 0) continue;
        printf("epoch %d/%d  loss %.4f  accuracy %5.1f%%  on %d ranks%s\n", epoch + 1, EPOCHS,
               stats[0] / stats[2], 100 * acc, world, epoch == run.fail_epoch ? " (from here on)" : "");
        if (epoch_accounting(&run, cnt, want, tmp, &smp, epoch) != 0) return 1;
    }

    /* Replicas: every survivor's weights hash, the largest and the smallest agree. Times: the
     * slowest survivor's. */
    hash[0] = hash[1] = weights_hash(p);
    if (ddp_all_reduce(&hash[0], &hash[0], 1, DDP_UINT64, DDP_MAX, comm) != DDP_SUCCESS ||
        ddp_all_reduce(&hash[1], &hash[1], 1, DDP_UINT64, DDP_MIN, comm) != DDP_SUCCESS ||
        ddp_all_reduce(run.times, run.times, 6, DDP_FLOAT64, DDP_MAX, comm) != DDP_SUCCESS ||
        ddp_all_reduce(&run.state_mb_s, &run.state_mb_s, 1, DDP_FLOAT64, DDP_MAX, comm) != DDP_SUCCESS)
        return fail_msg("all_reduce (hash, times)", comm);
    identical = hash[0] == hash[1];

    pass = rank == 0 ? verdict(&run, p, p0, data, label, world0, world, acc, identical) : 1;
    /* Every rank exits with rank 0's verdict: under ddprun --elastic one rank's failure is a
     * tolerated loss, so FAIL must end them all to show in ddprun's exit status. */
    if (ddp_broadcast(&pass, &pass, 1, DDP_INT32, 0, comm) != DDP_SUCCESS)
        return fail_msg("broadcast (verdict)", comm);
    ddp_reducer_destroy(reducer);
    ddp_comm_destroy(comm);
    workspace_free(&ws);
    free(data), free(label), free(p), free(p0), free(g), free(cnt), free(want), free(idx), free(tmp);
    return pass ? 0 : 1;
}
