/* SPDX-License-Identifier: MIT (see LICENSE) */
/* tests/test_wait_notes.c — waits inside the transports' own collectives speak. TAP.
 *
 *   build/test_wait_notes
 *
 * A collective that shm or threads runs itself (not the engine's algorithms, whose waits
 * test_failures covers) and that waits for late ranks says so at WARN, as the engine does: the
 * call and its number, where in it, and which ranks it waits for, as ranks ("ranks 1-2").
 *   shm      3 processes: a barrier all on time, then an all_reduce that rank 0 enters alone;
 *            ranks 1 and 2 enter only once rank 0 has logged "all_reduce #2 (shm, phase ...):
 *            no progress for ... s, waiting for ranks 1-2 (timeout in ... s)". The call then
 *            succeeds.
 *   threads  the same with 3 thread ranks of one process (ddp_comm_init_threads) and a
 *            zero-copy all_reduce: "all_reduce #2 (threads, phase arrive): ...".
 * The two worlds run at once (the threads world in a fourth process), so the test takes about
 * one note's wait (10 s). No time is assumed: the late ranks wait for the note (at most 40 s),
 * not for a clock, and the check reads the message, not the seconds in it.
 */
#define _GNU_SOURCE
#include "ddp.h"
#include "tests/ddp_test.h"

#include <pthread.h>

#define NOTE_RANKS 3
#define NOTE_COUNT 4096   /* 16 KiB of floats: above the one-step sizes, the zero-copy path */

/* The first note each rank logged, in shared memory (the shm world's ranks are processes). */
typedef struct {
    int set[NOTE_RANKS];
    char line[NOTE_RANKS][700];
} notes_t;

static void catch_note(void *user, ddp_log_level_t level, int rank, const char *msg) {
    notes_t *n = (notes_t *)user;
    if (level != DDP_LOG_WARN || !strstr(msg, "no progress for") || rank < 0 || rank >= NOTE_RANKS ||
        __atomic_load_n(&n->set[rank], __ATOMIC_ACQUIRE))
        return;
    snprintf(n->line[rank], sizeof n->line[rank], "%s", msg);
    __atomic_store_n(&n->set[rank], 1, __ATOMIC_RELEASE);
}

static void note_desc(ddp_comm_desc_t *d, notes_t *n) {
    t_desc(d, 120000);
    d->log_level = 1 + DDP_LOG_WARN;
    d->log_fn = catch_note;
    d->log_user = n;
}

/* One rank's part: a barrier, then the all_reduce that ranks 1 and 2 enter late. 1 if right. */
static int late_all_reduce(ddp_comm_t *c, int rank, notes_t *n, char *why, size_t cap) {
    static float x[NOTE_RANKS][NOTE_COUNT];
    ddp_result_t r = ddp_barrier(c);
    int i;
    if (r != DDP_SUCCESS) { snprintf(why, cap, "barrier -> %s", ddp_strerror(r)); return 0; }
    for (i = 0; i < NOTE_COUNT; i++) x[rank][i] = 1;
    if (rank != 0) {
        double t0 = t_now();
        while (!__atomic_load_n(&n->set[0], __ATOMIC_ACQUIRE) && t_now() - t0 < 40) t_sleep_ms(20);
    }
    r = ddp_all_reduce(x[rank], x[rank], NOTE_COUNT, DDP_FLOAT32, DDP_SUM, c);
    if (r != DDP_SUCCESS || x[rank][0] != NOTE_RANKS || x[rank][NOTE_COUNT - 1] != NOTE_RANKS) {
        snprintf(why, cap, "all_reduce -> %s, %g", ddp_strerror(r), (double)x[rank][0]);
        return 0;
    }
    return 1;
}

static int note_right(const notes_t *n, const char *transport) {
    char call[64];
    const char *l = n->line[0];
    snprintf(call, sizeof call, "all_reduce #2 (%s, phase ", transport);
    return n->set[0] && !strncmp(l, call, strlen(call)) && strstr(l, "): no progress for ") &&
           strstr(l, " s, waiting for ranks 1-2 (timeout in ") && !n->set[1] && !n->set[2];
}

/* ----------------------------------------------------------------- threads */
typedef struct {
    ddp_comm_t *c;
    notes_t *n;
    int rank, right;
    char why[200];
} thread_rank_t;

static void *thread_rank(void *arg) {
    thread_rank_t *t = (thread_rank_t *)arg;
    t->right = late_all_reduce(t->c, t->rank, t->n, t->why, sizeof t->why);
    return NULL;
}

static int threads_world(notes_t *n) {
    ddp_comm_t *comms[NOTE_RANKS];
    thread_rank_t t[NOTE_RANKS];
    pthread_t th[NOTE_RANKS];
    ddp_comm_desc_t d;
    ddp_result_t r;
    int i;
    note_desc(&d, n);
    r = ddp_comm_init_threads(comms, NOTE_RANKS, &d);
    if (!ok(r == DDP_SUCCESS, "threads: ddp_comm_init_threads(%d) -> %s %s", NOTE_RANKS, ddp_strerror(r),
            r ? ddp_last_init_error() : ""))
        return 1;
    ok(!strcmp(ddp_comm_transport_name(comms[0], 1), "threads"), "threads: rank 1 is reached by '%s'",
       ddp_comm_transport_name(comms[0], 1));
    for (i = 0; i < NOTE_RANKS; i++) {
        memset(&t[i], 0, sizeof t[i]);
        t[i].c = comms[i];
        t[i].n = n;
        t[i].rank = i;
        pthread_create(&th[i], NULL, thread_rank, &t[i]);
    }
    for (i = 0; i < NOTE_RANKS; i++) pthread_join(th[i], NULL);
    for (i = 0; i < NOTE_RANKS; i++)
        ok(t[i].right, "threads: rank %d: the late all_reduce completes %s", i, t[i].why);
    ok(note_right(n, "threads"), "threads: rank 0's wait said what it waits for, and only rank 0's: '%s'",
       n->line[0]);
    for (i = NOTE_RANKS - 1; i >= 0; i--) ddp_comm_destroy(comms[i]);
    return 0;
}

/* ----------------------------------------------------------------- shm */
static int shm_rank(int rank, notes_t *n) {
    ddp_comm_desc_t d;
    ddp_comm_t *c;
    char why[200] = "";
    int right;
    note_desc(&d, n);
    if (!(c = t_comm_init(rank, NOTE_RANKS, &d))) return 1;
    if (rank == 0)
        ok(!strcmp(ddp_comm_transport_name(c, 1), "shm"), "shm: rank 1 is reached by '%s'",
           ddp_comm_transport_name(c, 1));
    right = late_all_reduce(c, rank, n, why, sizeof why);
    ok(right, "shm: the late all_reduce completes %s", why);
    if (rank == 0)
        ok(note_right(n, "shm"), "shm: rank 0's wait said what it waits for, and only rank 0's: '%s'",
           n->line[0]);
    ddp_comm_destroy(c);
    return 0;
}

static int world(int rank, int p, void *arg) {
    notes_t *n = (notes_t *)arg;
    (void)p;
    t_where(rank < NOTE_RANKS ? "shm world" : "threads world");
    return rank < NOTE_RANKS ? shm_rank(rank, &n[0]) : threads_world(&n[1]);
}

int main(void) {
    notes_t *n = (notes_t *)t_shm_user(2 * sizeof(notes_t));
    ok(t_run_ranks(NOTE_RANKS + 1, world, n, 150) == 0, "the shm world (3 processes) and the threads world "
       "(3 threads of a fourth) ran");
    return t_done();
}
