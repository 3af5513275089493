/* SPDX-License-Identifier: MIT (see LICENSE) */
/* tests/test_sampler_reshard.c — the sampler going on after ranks are lost mid-epoch.
 *
 * An epoch is simulated rank by rank: W0 ranks run some steps, then the world changes (a
 * re-shard at ddp_sampler_consumed_after), run some more, change again, and finish the epoch.
 * What the ranks visited together must be the epoch the un-failed run visits (the same multiset
 * of dataset indices; that run is torch's DistributedSampler, which tests/test_sampler.c checks
 * bit for bit), every rank of a world must run the same number of steps, the positions used must
 * always be a prefix of the epoch's list, a resumed sampler must equal the live one, and the next
 * epoch must be torch's for the new world. Bad arguments are refused with a message. Prints TAP.
 */
#define DDP_SAMPLER_IMPLEMENTATION
#include "ddp_sampler.h"

#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int g_tests, g_failed;

static void ok(int cond, const char *fmt, ...) {
    va_list ap;
    g_tests++;
    if (!cond) g_failed++;
    printf("%s %d - ", cond ? "ok" : "not ok", g_tests);
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    printf("\n");
    fflush(stdout);
}

static void *xcalloc(size_t n, size_t size) {
    void *p = calloc(n ? n : 1, size);
    if (!p) {
        printf("Bail out! out of memory\n");
        exit(1);
    }
    return p;
}

/* ------------------------------------------------------------------ one simulated epoch */
typedef struct scenario {
    uint64_t n, batch, epoch;
    int64_t seed;
    int shuffle, drop_last;
    int nworlds;       /* the first world, then one per re-shard */
    int world[4];      /* ranks of each world */
    uint64_t steps[4]; /* steps each world runs before the next re-shard; the last world runs
                          to the end of the epoch whatever this says */
} scenario_t;

/* What went wrong, by property; each counts cases, and the first case of each is described. */
enum {
    F_API,       /* a call that should succeed did not */
    F_POSITION,  /* a rank's share is not positions start + r + jW of the epoch's list */
    F_STEPS,     /* ranks of one world disagree on the steps, or a share does not fit them */
    F_CONSUMED,  /* consumed_after is not what the ranks used, or ranks disagree on it */
    F_PREFIX,    /* the positions used are not exactly the head of the list */
    F_MULTISET,  /* the epoch visited other indices, or as often, than without the failure */
    F_RESUME,    /* init + set_epoch + reshard from the checkpoint differs from the live one */
    F_NEXT,      /* the next epoch is not the plain sampler's for the new world */
    F_IDENTITY,  /* reshard(W0, r, 0) or to a multiple of W0 differs from the plain shard */
    F_COUNT
};
static const char *const f_name[F_COUNT] = {
    "calls succeed",
    "each rank's share is positions start + r + jW of the epoch's list",
    "every rank of a world runs the same steps; only the last step may be short or empty",
    "consumed_after is what the ranks used, the same on every rank",
    "the positions used are always the head of the epoch's list",
    "the epoch visits the same multiset of indices as without the failure",
    "init + set_epoch + reshard from the checkpointed state equals the live sampler",
    "set_epoch after a re-shard is the plain sampler of the new world",
    "reshard to the epoch's own world at a multiple of it is the plain shard's tail"};
static int f_count[F_COUNT], f_cases, f_identity_cases;
static char f_first[F_COUNT][200];

static void describe(char *buf, size_t len, const scenario_t *sc) {
    int k, at = snprintf(buf, len, "n=%llu b=%llu shuffle=%d drop=%d worlds",
                         (unsigned long long)sc->n, (unsigned long long)sc->batch, sc->shuffle,
                         sc->drop_last);
    for (k = 0; k < sc->nworlds && at > 0 && (size_t)at < len; k++)
        at += snprintf(buf + at, len - (size_t)at, " %d(%llu)", sc->world[k],
                       (unsigned long long)sc->steps[k]);
}

static void fail(int what, const scenario_t *sc) {
    if (f_count[what]++ == 0) describe(f_first[what], sizeof f_first[what], sc);
}

static int init_rank(ddp_sampler_t *s, const scenario_t *sc, int world, int rank) {
    if (ddp_sampler_init(s, sc->n, world, rank, sc->shuffle, sc->seed, sc->drop_last) !=
        DDP_SUCCESS)
        return 0;
    ddp_sampler_set_epoch(s, sc->epoch);
    return 1;
}

/* The epoch's list as torch lays it out for W ranks: rank r's shard interleaved (r + jW). */
static uint64_t *epoch_list(const scenario_t *sc, int w, uint64_t *total) {
    ddp_sampler_t s;
    uint64_t *list, *mine, j;
    int r;
    init_rank(&s, sc, w, 0);
    *total = ddp_sampler_total_size(&s);
    list = (uint64_t *)xcalloc(*total, sizeof *list);
    mine = (uint64_t *)xcalloc(ddp_sampler_num_samples(&s), sizeof *mine);
    for (r = 0; r < w; r++) {
        init_rank(&s, sc, w, r);
        ddp_sampler_indices(&s, mine);
        for (j = 0; j < ddp_sampler_num_samples(&s); j++) list[r + j * (uint64_t)w] = mine[j];
    }
    free(mine);
    return list;
}

static int same_indices(const ddp_sampler_t *a, const ddp_sampler_t *b) {
    uint64_t na = ddp_sampler_num_samples(a), *xa, *xb;
    int same;
    if (na != ddp_sampler_num_samples(b) ||
        ddp_sampler_total_size(a) != ddp_sampler_total_size(b))
        return 0;
    xa = (uint64_t *)xcalloc(na, sizeof *xa);
    xb = (uint64_t *)xcalloc(na, sizeof *xb);
    same = ddp_sampler_indices(a, xa) == DDP_SUCCESS && ddp_sampler_indices(b, xb) == DDP_SUCCESS &&
           memcmp(xa, xb, na * sizeof *xa) == 0;
    free(xa);
    free(xb);
    return same;
}

static void run_scenario(const scenario_t *sc) {
    const int w0 = sc->world[0];
    uint64_t total, c = 0, j, i;
    uint64_t *list = epoch_list(sc, w0, &total);
    uint64_t *want = (uint64_t *)xcalloc(sc->n, sizeof *want); /* the un-failed epoch */
    uint64_t *got = (uint64_t *)xcalloc(sc->n, sizeof *got);
    unsigned char *used = (unsigned char *)xcalloc(total, 1);
    uint64_t *idx = (uint64_t *)xcalloc(total, sizeof *idx);
    ddp_sampler_t ranks[16], next[16];
    int seg, r, bad_api = 0;

    f_cases++;
    /* the un-failed epoch, straight from the plain sampler's shards */
    for (r = 0; r < w0; r++) {
        ddp_sampler_t s;
        if (!init_rank(&s, sc, w0, r) || ddp_sampler_indices(&s, idx) != DDP_SUCCESS) bad_api = 1;
        for (j = 0; j < ddp_sampler_num_samples(&s); j++) want[idx[j]]++;
        if (!init_rank(&ranks[r], sc, w0, r)) bad_api = 1;
    }
    for (seg = 0; seg < sc->nworlds; seg++) {
        const int w = sc->world[seg];
        const int last = seg == sc->nworlds - 1;
        uint64_t steps = ddp_sampler_num_steps(&ranks[0], sc->batch), run, c_next = 0, sum = 0;
        uint64_t lo = UINT64_MAX, hi = 0;
        if (seg > 0) {
            /* survivors: each new rank carries some old rank's sampler (all equal but rank) */
            for (r = 0; r < w; r++) {
                next[r] = ranks[r % sc->world[seg - 1]];
                if (ddp_sampler_reshard(&next[r], w, r, c) != DDP_SUCCESS) bad_api = 1;
            }
            memcpy(ranks, next, (size_t)w * sizeof *ranks);
            steps = ddp_sampler_num_steps(&ranks[0], sc->batch);
        }
        run = last || sc->steps[seg] > steps ? steps : sc->steps[seg];
        for (r = 0; r < w; r++) {
            const ddp_sampler_t *s = &ranks[r];
            uint64_t share = ddp_sampler_num_samples(s), upto, cr = 0;
            ddp_sampler_t resumed;
            /* every step but the last full on every rank */
            if (ddp_sampler_num_steps(s, sc->batch) != steps || share > steps * sc->batch ||
                (steps && share < (steps - 1) * sc->batch))
                fail(F_STEPS, sc);
            if (share > total - c) { /* more than is left: do not let it write past idx */
                fail(F_POSITION, sc);
                continue;
            }
            if (ddp_sampler_indices(s, idx) != DDP_SUCCESS) bad_api = 1;
            for (j = 0; j < share; j++) {
                uint64_t p = c + (uint64_t)r + j * (uint64_t)w;
                if (p >= total || idx[j] != list[p]) {
                    fail(F_POSITION, sc);
                    break;
                }
            }
            upto = run * sc->batch < share ? run * sc->batch : share;
            for (j = 0; j < upto; j++) {
                uint64_t p = c + (uint64_t)r + j * (uint64_t)w;
                if (idx[j] < sc->n) got[idx[j]]++;
                if (p < total) used[p]++;
            }
            sum += share;
            if (share < lo) lo = share;
            if (share > hi) hi = share;
            if (ddp_sampler_consumed_after(&ranks[r], run, sc->batch, &cr) != DDP_SUCCESS)
                bad_api = 1;
            if (r == 0) c_next = cr;
            if (cr != c_next) fail(F_CONSUMED, sc);
            /* what a checkpoint holds: epoch, the epoch's world, consumed */
            if (seg > 0 &&
                (!init_rank(&resumed, sc, ddp_sampler_epoch_replicas(s), 0) ||
                 ddp_sampler_reshard(&resumed, w, r, ddp_sampler_start(s)) != DDP_SUCCESS ||
                 !same_indices(&resumed, s)))
                fail(F_RESUME, sc);
        }
        if (sum != total - c || (w > 0 && hi - lo > 1 && sum)) fail(F_STEPS, sc);
        /* the positions used so far are exactly [0, c_next), each once */
        for (i = 0; i < total; i++)
            if (used[i] != (i < c_next)) {
                fail(F_PREFIX, sc);
                break;
            }
        if (c_next < c || (last && c_next != total)) fail(F_CONSUMED, sc);
        c = c_next;
    }
    for (i = 0; i < sc->n; i++)
        if (got[i] != want[i]) {
            fail(F_MULTISET, sc);
            break;
        }
    /* the next epoch: exactly the plain sampler of the last world */
    {
        const int w = sc->world[sc->nworlds - 1];
        for (r = 0; r < w; r++) {
            ddp_sampler_t plain;
            ddp_sampler_set_epoch(&ranks[r], sc->epoch + 1);
            if (ddp_sampler_init(&plain, sc->n, w, r, sc->shuffle, sc->seed, sc->drop_last) !=
                DDP_SUCCESS)
                bad_api = 1;
            ddp_sampler_set_epoch(&plain, sc->epoch + 1);
            if (!same_indices(&ranks[r], &plain) || ddp_sampler_start(&ranks[r]) != 0 ||
                ddp_sampler_epoch_replicas(&ranks[r]) != w)
                fail(F_NEXT, sc);
        }
    }
    if (bad_api) fail(F_API, sc);
    free(list);
    free(want);
    free(got);
    free(used);
    free(idx);
}

/* reshard(W0, r, c) with c a multiple of W0 is the plain shard without its first c / W0. */
static void check_identity(const scenario_t *sc) {
    const int w = sc->world[0];
    uint64_t total, c, *plain, *mine;
    int r;
    ddp_sampler_t s;
    f_identity_cases++;
    init_rank(&s, sc, w, 0);
    total = ddp_sampler_total_size(&s);
    plain = (uint64_t *)xcalloc(total, sizeof *plain);
    mine = (uint64_t *)xcalloc(total, sizeof *mine);
    for (r = 0; r < w; r++) {
        ddp_sampler_t p;
        uint64_t per;
        init_rank(&p, sc, w, r);
        per = ddp_sampler_num_samples(&p);
        ddp_sampler_indices(&p, plain);
        for (c = 0; c <= total; c += (uint64_t)w) {
            ddp_sampler_t q = s;
            uint64_t skip = c / (uint64_t)w;
            if (ddp_sampler_reshard(&q, w, r, c) != DDP_SUCCESS ||
                ddp_sampler_num_samples(&q) != per - skip ||
                ddp_sampler_indices(&q, mine) != DDP_SUCCESS ||
                memcmp(mine, plain + skip, (per - skip) * sizeof *mine) != 0) {
                fail(F_IDENTITY, sc);
                break;
            }
        }
    }
    free(plain);
    free(mine);
}

/* A small deterministic generator for the step counts (the cases must be the same every run). */
static uint64_t g_lcg = 0x9e3779b97f4a7c15ull;
static uint64_t pick(uint64_t bound) { /* 0 .. bound */
    g_lcg = g_lcg * 6364136223846793005ull + 1442695040888963407ull;
    return (g_lcg >> 33) % (bound + 1);
}

static void check_epochs(void) {
    static const uint64_t ns[] = {0, 1, 2, 3, 5, 7, 10, 17, 31, 64, 101, 1000};
    static const uint64_t batches[] = {1, 2, 3, 7};
    size_t a, bi;
    int w0, shuffle, drop, f;
    for (a = 0; a < sizeof ns / sizeof ns[0]; a++)
        for (w0 = 1; w0 <= 8; w0++)
            for (shuffle = 0; shuffle < 2; shuffle++)
                for (drop = 0; drop < 2; drop++)
                    for (bi = 0; bi < sizeof batches / sizeof batches[0]; bi++) {
                        scenario_t sc;
                        ddp_sampler_t s;
                        uint64_t steps, ks[5];
                        int w1, k, cand[4], nc = 0, c;
                        if (ns[a] == 1000 && w0 != 3 && w0 != 8) continue; /* keep it quick */
                        memset(&sc, 0, sizeof sc);
                        sc.n = ns[a];
                        sc.batch = batches[bi];
                        sc.epoch = 5 + (uint64_t)w0;
                        sc.seed = 42 - (int64_t)a;
                        sc.shuffle = shuffle;
                        sc.drop_last = drop;
                        sc.world[0] = w0;
                        init_rank(&s, &sc, w0, 0);
                        steps = ddp_sampler_num_steps(&s, sc.batch);
                        ks[0] = 0;
                        ks[1] = 1;
                        ks[2] = steps / 2;
                        ks[3] = steps ? steps - 1 : 0;
                        ks[4] = steps; /* consumed = the end */
                        sc.nworlds = 1;
                        sc.steps[0] = steps;
                        run_scenario(&sc); /* no failure at all */
                        check_identity(&sc);
                        /* one re-shard: to one rank, one fewer, the same, one more */
                        cand[nc++] = 1;
                        if (w0 - 1 > 1) cand[nc++] = w0 - 1;
                        if (w0 > 1) cand[nc++] = w0;
                        cand[nc++] = w0 + 1;
                        for (c = 0; c < nc; c++)
                            for (k = 0; k < 5; k++) {
                                sc.nworlds = 2;
                                sc.world[1] = cand[c];
                                sc.steps[0] = ks[k];
                                run_scenario(&sc);
                            }
                        /* two and three re-shards (two failures, then a third), steps picked */
                        for (k = 0; k < 6; k++) {
                            w1 = w0 > 1 ? w0 - 1 : 1;
                            sc.nworlds = 3 + (k % 2);
                            sc.world[1] = w1;
                            sc.world[2] = k == 2 ? 1 : (w1 > 1 ? w1 - 1 : 1);
                            sc.world[3] = 1 + (int)pick(3);
                            sc.steps[0] = pick(steps);
                            sc.steps[1] = pick(steps);
                            sc.steps[2] = k == 4 ? 0 : pick(steps); /* a re-shard right after one */
                            run_scenario(&sc);
                        }
                    }
    for (f = 0; f < F_COUNT; f++) {
        if (f_count[f]) printf("# first failing case: %s\n", f_first[f]);
        ok(f_count[f] == 0, "%s (%d cases; %d failures)", f_name[f],
           f == F_IDENTITY ? f_identity_cases : f_cases, f_count[f]);
    }
}

/* A hand-worked case, for the reader: n = 10, W0 = 4 pads to 12 positions (3 each); after one
 * step of batch 1 positions 0..3 are done; 3 survivors share positions 4..11 (8 left): ranks 0
 * and 1 take 3 (4, 7, 10 and 5, 8, 11), rank 2 takes 2 (6, 9). Batch 2: 2 steps each, rank 2's
 * second batch holds one sample. */
static void check_worked_example(void) {
    ddp_sampler_t s;
    uint64_t c = 0, out[4];
    int good = 1;
    ddp_sampler_init(&s, 10, 4, 2, 0, 0, 0);
    good &= ddp_sampler_total_size(&s) == 12 && ddp_sampler_num_samples(&s) == 3;
    good &= ddp_sampler_consumed_after(&s, 1, 1, &c) == DDP_SUCCESS && c == 4;
    good &= ddp_sampler_reshard(&s, 3, 2, c) == DDP_SUCCESS && ddp_sampler_num_samples(&s) == 2;
    good &= ddp_sampler_indices(&s, out) == DDP_SUCCESS && out[0] == 6 && out[1] == 9;
    good &= ddp_sampler_num_steps(&s, 2) == 2 && ddp_sampler_total_size(&s) == 12;
    good &= ddp_sampler_consumed_after(&s, 1, 2, &c) == DDP_SUCCESS && c == 10;
    good &= ddp_sampler_reshard(&s, 1, 0, c) == DDP_SUCCESS && ddp_sampler_num_samples(&s) == 2;
    /* positions 10 and 11 of the padded list: 10 mod 10 and 11 mod 10 */
    good &= ddp_sampler_indices(&s, out) == DDP_SUCCESS && out[0] == 0 && out[1] == 1;
    ok(good, "worked example: n=10 W=4 -> 3 ranks after 1 step -> 1 rank after 1 more");
}

/* ------------------------------------------------------------------ refusals */
/* A refused call changes nothing but the error text. */
static int unchanged(const ddp_sampler_t *a, const ddp_sampler_t *b) {
    return a->num_samples == b->num_samples && a->total_size == b->total_size &&
           a->start == b->start && a->num_replicas == b->num_replicas && a->rank == b->rank &&
           a->epoch_replicas == b->epoch_replicas && a->epoch == b->epoch;
}

static int refused(ddp_sampler_t *s, ddp_result_t got, ddp_result_t want, const char *word,
                   const ddp_sampler_t *before) {
    int good = got == want && strstr(ddp_sampler_last_error(s), word) != NULL &&
               unchanged(s, before);
    if (!good)
        printf("# got %d (want %d), message '%s' (want '%s')\n", (int)got, (int)want,
               ddp_sampler_last_error(s), word);
    return good;
}

static void check_errors(void) {
    const ddp_result_t inval = DDP_ERR_INVALID_ARGUMENT;
    ddp_sampler_t s, before, empty;
    uint64_t c = 7;
    int good = 1;

    ddp_sampler_init(&s, 10, 4, 1, 1, 42, 0); /* 12 positions */
    before = s;
    good &= refused(&s, ddp_sampler_reshard(&s, 0, 0, 0), inval, "num_replicas", &before);
    good &= refused(&s, ddp_sampler_reshard(&s, -3, 0, 0), inval, "num_replicas", &before);
    good &= refused(&s, ddp_sampler_reshard(&s, 3, -1, 0), inval, "invalid rank -1", &before);
    good &= refused(&s, ddp_sampler_reshard(&s, 3, 3, 0), inval, "[0, 2]", &before);
    good &= refused(&s, ddp_sampler_reshard(&s, INT_MAX, INT_MAX, 0), inval, "invalid rank",
                    &before);
    ok(good, "reshard refuses num_replicas < 1 and a rank outside [0, num_replicas)");

    good = refused(&s, ddp_sampler_reshard(&s, 3, 0, 13), inval, "past the epoch's end, 12",
                   &before);
    good &= refused(&s, ddp_sampler_reshard(&s, 3, 0, UINT64_MAX), inval, "past", &before);
    good &= ddp_sampler_reshard(&s, 3, 0, 12) == DDP_SUCCESS && ddp_sampler_num_samples(&s) == 0 &&
            ddp_sampler_last_error(&s)[0] == '\0' && ddp_sampler_num_steps(&s, 4) == 0;
    ok(good, "consumed past the end (13, 2^64-1) refused; = the end leaves nothing to do");

    ddp_sampler_init(&s, 10, 4, 1, 1, 42, 0);
    good = ddp_sampler_reshard(&s, 3, 0, 4) == DDP_SUCCESS;
    before = s;
    good &= refused(&s, ddp_sampler_reshard(&s, 2, 0, 3), inval, "before 4", &before);
    good &= ddp_sampler_reshard(&s, 2, 1, 4) == DDP_SUCCESS; /* again at the same place: fine */
    ok(good, "a re-shard back before the last one is refused (those samples were trained on)");

    ddp_sampler_init(&s, 10, 4, 1, 1, 42, 0); /* 3 steps of batch 1, 1 of batch >= 3 */
    before = s;
    good = refused(&s, ddp_sampler_consumed_after(&s, 1, 0, &c), inval, "batch", &before);
    good &= refused(&s, ddp_sampler_consumed_after(&s, 4, 1, &c), inval, "epoch has 3", &before);
    good &= refused(&s, ddp_sampler_consumed_after(&s, UINT64_MAX, UINT64_MAX, &c), inval,
                    "epoch has 1", &before);
    good &= refused(&s, ddp_sampler_consumed_after(&s, UINT64_MAX / 2 + 1, 2, &c), inval, "steps",
                    &before);
    good &= c == 7;
    good &= ddp_sampler_consumed_after(&s, 1, UINT64_MAX, &c) == DDP_SUCCESS && c == 12;
    good &= ddp_sampler_consumed_after(&s, 3, 1, &c) == DDP_SUCCESS && c == 12;
    good &= ddp_sampler_consumed_after(&s, 0, 5, &c) == DDP_SUCCESS && c == 0;
    good &= ddp_sampler_consumed_after(&s, 1, 1, NULL) == inval;
    ok(good, "consumed_after refuses batch 0 and more steps than the epoch has (no overflow)");

    /* never initialised / refused init / NULL */
    memset(&empty, 0, sizeof empty);
    good = ddp_sampler_reshard(&empty, 2, 0, 0) == DDP_ERR_INVALID_USAGE &&
           ddp_sampler_last_error(&empty)[0] != '\0';
    good &= ddp_sampler_init(&empty, 10, 2, 5, 0, 0, 0) == inval &&
            ddp_sampler_reshard(&empty, 2, 0, 0) == DDP_ERR_INVALID_USAGE &&
            ddp_sampler_consumed_after(&empty, 0, 1, &c) == DDP_ERR_INVALID_USAGE &&
            ddp_sampler_num_steps(&empty, 1) == 0;
    good &= ddp_sampler_reshard(NULL, 2, 0, 0) == inval &&
            ddp_sampler_consumed_after(NULL, 0, 1, &c) == inval &&
            ddp_sampler_num_steps(NULL, 1) == 0 && ddp_sampler_num_steps(&s, 0) == 0 &&
            ddp_sampler_epoch_replicas(NULL) == 0 && ddp_sampler_start(NULL) == 0;
    ok(good, "an uninitialised sampler is refused (DDP_ERR_INVALID_USAGE); NULL too");

    { /* the largest dataset: positions near 2^63, the widest world */
        const uint64_t n = (uint64_t)INT64_MAX; /* = 1 mod 3: 3 ranks pad to n + 2 */
        uint64_t out[1];
        good = ddp_sampler_init(&s, n, 3, 0, 0, 0, 0) == DDP_SUCCESS &&
               ddp_sampler_total_size(&s) == n + 2;
        good &= ddp_sampler_reshard(&s, INT_MAX, 1, n - 1) == DDP_SUCCESS &&
                ddp_sampler_num_samples(&s) == 1 && ddp_sampler_indices(&s, out) == DDP_SUCCESS &&
                out[0] == 0; /* position n: padding, = index 0 */
        good &= ddp_sampler_num_steps(&s, UINT64_MAX) == 1 &&
                ddp_sampler_consumed_after(&s, 1, UINT64_MAX, &c) == DDP_SUCCESS && c == n + 2;
        good &= ddp_sampler_reshard(&s, INT_MAX, INT_MAX - 1, n + 2) == DDP_SUCCESS &&
                ddp_sampler_num_samples(&s) == 0;
        ddp_sampler_init(&s, n, 3, 2, 0, 0, 0);
        good &= ddp_sampler_consumed_after(&s, 1, (uint64_t)1 << 62, &c) == DDP_SUCCESS &&
                c == n + 2 && ddp_sampler_reshard(&s, 2, 1, (uint64_t)3 << 61) == DDP_SUCCESS &&
                ddp_sampler_num_samples(&s) == (n + 2 - ((uint64_t)3 << 61)) / 2;
        ok(good, "n = 2^63 - 1: positions past n wrap to the padding, no overflow");
    }
}

/* ------------------------------------------------------------------ grows
 * A grow re-shards the rest of the epoch to more ranks, with the same reshard. The members
 * re-shard their samplers; a joiner has none: it builds one from init's arguments and the
 * position the members send it (ddp_sampler_position_after / ddp_sampler_resume, which is init with
 * the epoch's world, set_epoch, reshard). Its share must be the one a member would compute for
 * that rank, and the epoch, shrinks and grows together, must visit every index as often as the
 * epoch without them. */
static void check_grow_joiners(const scenario_t *sc, int *cases, int *bad_share, int *bad_recipe,
                               int *bad_pos) {
    ddp_sampler_t ranks[16], next[16];
    uint64_t c = 0;
    int seg, r;
    for (r = 0; r < sc->world[0]; r++) init_rank(&ranks[r], sc, sc->world[0], r);
    for (seg = 1; seg < sc->nworlds; seg++) {
        const int wp = sc->world[seg - 1], w = sc->world[seg];
        uint64_t steps = ddp_sampler_num_steps(&ranks[0], sc->batch);
        uint64_t run = sc->steps[seg - 1] > steps ? steps : sc->steps[seg - 1];
        ddp_sampler_position_t pos;
        if (ddp_sampler_position_after(&ranks[0], run, sc->batch, &pos) != DDP_SUCCESS ||
            ddp_sampler_consumed_after(&ranks[0], run, sc->batch, &c) != DDP_SUCCESS ||
            pos.consumed != c || pos.epoch != sc->epoch || pos.epoch_replicas != sc->world[0])
            (*bad_pos)++;
        for (r = 0; r < w; r++) {
            /* a member's view of rank r's share, and the joiner's own (any init world/rank) */
            ddp_sampler_t member = ranks[r % wp], joiner, recipe;
            if (ddp_sampler_reshard(&member, w, r, c) != DDP_SUCCESS) (*bad_share)++;
            next[r] = member;
            if (r < wp) continue;   /* a member: it has its own */
            (*cases)++;
            if (ddp_sampler_init(&joiner, sc->n, w, r, sc->shuffle, sc->seed, sc->drop_last) !=
                    DDP_SUCCESS ||
                ddp_sampler_resume(&joiner, &pos, w, r) != DDP_SUCCESS ||
                !same_indices(&joiner, &member) ||
                ddp_sampler_num_steps(&joiner, sc->batch) != ddp_sampler_num_steps(&member, sc->batch))
                (*bad_share)++;
            /* the recipe by hand: init with the epoch's world, set_epoch, reshard */
            if (ddp_sampler_init(&recipe, sc->n, (int)pos.epoch_replicas, 0, sc->shuffle, sc->seed,
                                 sc->drop_last) != DDP_SUCCESS)
                (*bad_recipe)++;
            ddp_sampler_set_epoch(&recipe, pos.epoch);
            if (ddp_sampler_reshard(&recipe, w, r, pos.consumed) != DDP_SUCCESS ||
                !same_indices(&recipe, &member))
                (*bad_recipe)++;
        }
        memcpy(ranks, next, (size_t)w * sizeof *ranks);
    }
}

static void check_grows(void) {
    static const uint64_t ns[] = {1, 2, 5, 7, 10, 17, 31, 64, 101, 1000};
    static const uint64_t batches[] = {1, 2, 3, 7};
    static const int worlds[][4] = {{4, 3, 4, 0}, {3, 5, 0, 0}, {1, 4, 0, 0}, {4, 3, 4, 2}};
    static const int nworlds[] = {3, 2, 2, 4};
    static const char *const names[] = {"4 -> 3 -> 4", "3 -> 5", "1 -> 4", "4 -> 3 -> 4 -> 2"};
    size_t a, bi, wi;
    int shuffle, drop, f, k;
    for (wi = 0; wi < sizeof nworlds / sizeof nworlds[0]; wi++) {
        int cases = 0, bad_share = 0, bad_recipe = 0, bad_pos = 0, failures = 0;
        memset(f_count, 0, sizeof f_count);
        f_cases = 0;
        for (a = 0; a < sizeof ns / sizeof ns[0]; a++)
            for (shuffle = 0; shuffle < 2; shuffle++)
                for (drop = 0; drop < 2; drop++)
                    for (bi = 0; bi < sizeof batches / sizeof batches[0]; bi++)
                        for (k = 0; k < 6; k++) {
                            scenario_t sc;
                            ddp_sampler_t s;
                            uint64_t steps;
                            int w;
                            memset(&sc, 0, sizeof sc);
                            sc.n = ns[a];
                            sc.batch = batches[bi];
                            sc.epoch = 3 + a;
                            sc.seed = 7 + (int64_t)k;
                            sc.shuffle = shuffle;
                            sc.drop_last = drop;
                            sc.nworlds = nworlds[wi];
                            for (w = 0; w < sc.nworlds; w++) sc.world[w] = worlds[wi][w];
                            init_rank(&s, &sc, sc.world[0], 0);
                            steps = ddp_sampler_num_steps(&s, sc.batch);
                            /* grow at the start, after one step, mid-epoch, at the end; then picked */
                            sc.steps[0] = k == 0 ? 0 : k == 1 ? 1 : k == 2 ? steps / 2 : k == 3 ? steps : pick(steps);
                            sc.steps[1] = k < 4 ? (steps + 2) / 3 : pick(steps);
                            sc.steps[2] = k == 5 ? 0 : pick(steps);
                            run_scenario(&sc);
                            check_grow_joiners(&sc, &cases, &bad_share, &bad_recipe, &bad_pos);
                        }
        for (f = 0; f < F_COUNT; f++) {
            if (f_count[f]) printf("# %s: first failing case: %s\n", names[wi], f_first[f]);
            failures += f_count[f];
        }
        ok(failures == 0, "%s mid-epoch: every index visited exactly as often as without re-shards, every rank "
           "of a world the same steps, positions the head of the list, the next epoch torch's (%d cases, %d "
           "failures)", names[wi], f_cases, failures);
        ok(bad_pos == 0, "%s: ddp_sampler_position_after is (epoch, the epoch's world, consumed_after) (%d bad)",
           names[wi], bad_pos);
        ok(bad_share == 0 && cases > 0, "%s: a joiner's sampler from init + ddp_sampler_resume(position) has "
           "exactly the share a member computes for its rank (%d joiners, %d bad)", names[wi], cases, bad_share);
        ok(bad_recipe == 0, "%s: and so has init(epoch_replicas) + set_epoch(epoch) + reshard(world, rank, "
           "consumed) (%d bad)", names[wi], bad_recipe);
    }
}

/* ddp_sampler_position_after and ddp_sampler_resume refuse what they cannot do, changing nothing. */
static void check_resume_errors(void) {
    ddp_sampler_t s, before, m;
    ddp_sampler_position_t pos;
    ddp_result_t e;
    int good;
    ddp_sampler_init(&m, 100, 4, 1, 1, 42, 0);
    ddp_sampler_set_epoch(&m, 3);
    ddp_sampler_set_randperm(&m, DDP_RANDPERM_TORCH_LEGACY);
    ok(ddp_sampler_position_after(&m, 2, 5, &pos) == DDP_SUCCESS && pos.epoch == 3 && pos.consumed == 40 &&
       pos.epoch_replicas == 4, "position after 2 steps of 5 on 4 ranks: epoch 3, consumed 40, epoch_replicas 4");
    ok(ddp_sampler_position_after(&m, 99, 5, &pos) == DDP_ERR_INVALID_ARGUMENT && strstr(ddp_sampler_last_error(&m), "steps"),
       "position: more steps than the epoch has refused: %s", ddp_sampler_last_error(&m));
    ok(ddp_sampler_position_after(&m, 1, 5, NULL) == DDP_ERR_INVALID_ARGUMENT, "position_after: NULL refused");
    ddp_sampler_position_after(&m, 2, 5, &pos);
    ddp_sampler_init(&s, 100, 1, 0, 1, 42, 0);
    ddp_sampler_set_randperm(&s, DDP_RANDPERM_TORCH_LEGACY);
    before = s;
    good = 1;
    e = ddp_sampler_resume(&s, &pos, 3, 3);
    good &= e == DDP_ERR_INVALID_ARGUMENT && strstr(ddp_sampler_last_error(&s), "rank") != NULL;
    pos.epoch_replicas = 0;
    e = ddp_sampler_resume(&s, &pos, 3, 0);
    good &= e == DDP_ERR_INVALID_ARGUMENT && strstr(ddp_sampler_last_error(&s), "epoch_replicas") != NULL;
    pos.epoch_replicas = 4;
    pos.consumed = 101;
    e = ddp_sampler_resume(&s, &pos, 3, 0);
    good &= e == DDP_ERR_INVALID_ARGUMENT && strstr(ddp_sampler_last_error(&s), "past") != NULL;
    good &= ddp_sampler_resume(&s, NULL, 3, 0) == DDP_ERR_INVALID_ARGUMENT;
    good &= unchanged(&s, &before) && s.algo == before.algo;
    ok(good, "resume refuses a bad rank, a position with no world, consumed past the epoch, NULL; s unchanged");
    pos.consumed = 40;
    ok(ddp_sampler_resume(&s, &pos, 3, 2) == DDP_SUCCESS && s.algo == DDP_RANDPERM_TORCH_LEGACY &&
       ddp_sampler_num_samples(&s) == 20 && ddp_sampler_start(&s) == 40 && ddp_sampler_epoch_replicas(&s) == 4,
       "resume to 3 ranks at 40 of 100: 20 samples, start 40, the epoch's world 4, randperm choice kept");
    {
        ddp_sampler_t u;
        memset(&u, 0, sizeof u);
        ok(ddp_sampler_resume(&u, &pos, 3, 0) == DDP_ERR_INVALID_USAGE, "resume of a sampler never initialised");
    }
}

int main(void) {
    check_epochs();
    check_grows();
    check_resume_errors();
    check_worked_example();
    check_errors();
    printf("1..%d\n", g_tests);
    return g_failed ? 1 : 0;
}
