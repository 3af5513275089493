/* SPDX-License-Identifier: MIT (see LICENSE) */
/* train_demo.c — data-parallel training with libddp, the way DDP does it.
 *
 * A linear model y = x.w + b learns synthetic data (known true weights) by minibatch SGD.
 * Every rank holds a replica of the model and a disjoint shard of the data; after each
 * backward pass the gradients are averaged across ranks with ddp_all_reduce(DDP_AVG), so every
 * replica takes the same step. Rank 0's initial weights are broadcast first (as DDP does at
 * construction). At the end the demo checks what data parallelism promises:
 *   1. every rank holds bitwise the same weights;
 *   2. they match one process training on the union of the ranks' batches (global batch =
 *      per-rank batch x world size), up to float rounding;
 *   3. the model learned the true weights.
 *
 * Run: make demo (4 ranks), or under any launcher that sets RANK/WORLD_SIZE/MASTER_ADDR/PORT.
 */
#define _GNU_SOURCE
#define DDP_IMPLEMENTATION
#include "ddp.h"
#include "transports/ddp_tcp.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { FEATURES = 64, SAMPLES = 16384, BATCH = 32, EPOCHS = 4 };
#define LR 0.05f

typedef struct { float w[FEATURES + 1]; } model_t; /* w[FEATURES] is the bias */

/* Deterministic data every rank can generate alone (splitmix64). */
static uint64_t mix(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}
static float unit(uint64_t seed) { return (float)((mix(seed) >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f; }
static float true_w(int j) { return j == FEATURES ? 0.5f : unit(1000000 + (uint64_t)j); }
static void sample(size_t i, float *x, float *y) {
    float acc = true_w(FEATURES);
    int j;
    for (j = 0; j < FEATURES; j++) { x[j] = unit(i * FEATURES + (uint64_t)j); acc += x[j] * true_w(j); }
    *y = acc + 0.01f * unit(99999999 + i);
}

/* Gradient of the mean squared error over samples idx[0..n). Returns the loss. */
static float backward(const model_t *m, const size_t *idx, int n, float *grad) {
    float x[FEATURES], y, loss = 0;
    int k, j;
    memset(grad, 0, sizeof(float) * (FEATURES + 1));
    for (k = 0; k < n; k++) {
        float pred = m->w[FEATURES], err;
        sample(idx[k], x, &y);
        for (j = 0; j < FEATURES; j++) pred += m->w[j] * x[j];
        err = pred - y;
        loss += err * err;
        for (j = 0; j < FEATURES; j++) grad[j] += 2 * err * x[j] / (float)n;
        grad[FEATURES] += 2 * err / (float)n;
    }
    return loss / (float)n;
}

/* Rank r's shard for an epoch: a permutation of all samples, strided (DistributedSampler's
 * layout: indices[r::world]). */
static void shard(int epoch, int rank, int world, size_t *out, size_t n) {
    size_t i;
    for (i = 0; i < n; i++) {
        size_t g = i * (size_t)world + (size_t)rank;
        out[i] = (g * 7919u + (size_t)epoch * 104729u) % SAMPLES; /* 7919 is coprime to 2^14 */
    }
}

static void step(model_t *m, const float *grad) {
    int j;
    for (j = 0; j <= FEATURES; j++) m->w[j] -= LR * grad[j];
}

static int fail(const char *what, ddp_comm_t *c) {
    fprintf(stderr, "train_demo: %s failed: %s\n", what, c ? ddp_comm_last_error(c) : ddp_last_init_error());
    return 1;
}

int main(void) {
    ddp_comm_t *comm;
    model_t m, ref;
    float grad[FEATURES + 1], loss = 0, gloss;
    size_t per_rank, *idx, *all, *batch;
    int rank, world, epoch, j, it;
    ddp_result_t r = ddp_comm_init_env(&comm, NULL);
    if (r != DDP_SUCCESS) return fail("ddp_comm_init_env", NULL);
    rank = ddp_comm_rank(comm);
    world = ddp_comm_size(comm);
    per_rank = SAMPLES / (size_t)world;
    idx = (size_t *)malloc(sizeof *idx * per_rank);
    all = (size_t *)malloc(sizeof *all * per_rank);
    batch = (size_t *)malloc(sizeof *batch * BATCH * (size_t)world);
    if (!idx || !all || !batch) return 1;

    /* Different initial weights per rank on purpose: the broadcast must fix them. */
    for (j = 0; j <= FEATURES; j++) m.w[j] = unit(424242 + (uint64_t)j + (uint64_t)rank * 7777);
    if (ddp_broadcast(m.w, m.w, FEATURES + 1, DDP_FLOAT32, 0, comm)) return fail("broadcast", comm);
    ref = m;
    if (rank == 0)
        printf("train_demo: %d ranks, %d samples, batch %d per rank (global %d), %d epochs, local rank %d\n",
               world, SAMPLES, BATCH, BATCH * world, EPOCHS, ddp_comm_local_rank(comm));

    for (epoch = 0; epoch < EPOCHS; epoch++) {
        int steps = (int)(per_rank / BATCH);
        shard(epoch, rank, world, idx, per_rank);
        for (it = 0; it < steps; it++) {
            loss = backward(&m, idx + (size_t)it * BATCH, BATCH, grad);
            if (ddp_all_reduce(grad, grad, FEATURES + 1, DDP_FLOAT32, DDP_AVG, comm))
                return fail("all_reduce", comm);
            step(&m, grad);
            /* The serial reference, on rank 0 only: one process, the union of the batches. */
            if (rank == 0) {
                int q;
                for (q = 0; q < world; q++) {
                    shard(epoch, q, world, all, per_rank);
                    memcpy(batch + (size_t)q * BATCH, all + (size_t)it * BATCH, sizeof(size_t) * BATCH);
                }
                backward(&ref, batch, BATCH * world, grad);
                step(&ref, grad);
            }
        }
        gloss = loss;
        if (ddp_all_reduce(&gloss, &gloss, 1, DDP_FLOAT32, DDP_AVG, comm)) return fail("all_reduce", comm);
        if (rank == 0) printf("epoch %d: mean loss of the last batch over ranks %.6f\n", epoch, gloss);
    }

    /* 1. Identical replicas: max and min of every weight across ranks must agree bitwise. */
    {
        float mx[FEATURES + 1], mn[FEATURES + 1], err = 0, diff = 0;
        int same;
        if (ddp_all_reduce(m.w, mx, FEATURES + 1, DDP_FLOAT32, DDP_MAX, comm) ||
            ddp_all_reduce(m.w, mn, FEATURES + 1, DDP_FLOAT32, DDP_MIN, comm))
            return fail("all_reduce", comm);
        same = memcmp(mx, mn, sizeof mx) == 0;
        for (j = 0; j <= FEATURES; j++) {
            err = fmaxf(err, fabsf(m.w[j] - true_w(j)));
            diff = fmaxf(diff, fabsf(m.w[j] - ref.w[j]));
        }
        if (rank == 0) {
            int ok = same && diff < 1e-4f && err < 0.02f;
            printf("replicas identical on all ranks: %s\n", same ? "yes" : "NO");
            printf("max |w - w_serial| = %.2e (data-parallel == serial large-batch SGD: %s)\n", diff,
                   diff < 1e-4f ? "yes" : "NO");
            printf("max |w - w_true|   = %.2e (learned: %s)\n", err, err < 0.02f ? "yes" : "NO");
            printf("train_demo: %s\n", ok ? "PASS" : "FAIL");
            ddp_comm_destroy(comm);
            return ok ? 0 : 1;
        }
    }
    free(idx);
    free(all);
    free(batch);
    ddp_comm_destroy(comm);
    return 0;
}
