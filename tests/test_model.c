/* SPDX-License-Identifier: MIT (see LICENSE) */
/* tests/test_model.c — the all-reduce cost model (ddp_model.h). Prints TAP.
 *
 *   build/test_model
 *
 * - The model file: save then load gives the same doubles bit for bit; keys left out keep the
 *   defaults; every malformed line (unknown key, no '=', not a number, trailing junk, negative,
 *   inf, nan) fails with the file and the line number in the message and leaves the model as
 *   it was; a missing file fails.
 * - The algorithm names and DDP_ALGO spellings.
 * - The picks: one host of 8 ranks takes rd at 8 B and the ring at 64 MiB; 2 hosts x 2 ranks
 *   on a 1 Gbit/s link take a hierarchical algorithm at 4 MiB; with one rank per host a
 *   hierarchical algorithm costs exactly its flat counterpart and is never picked over it; on
 *   one host hier_* is the ring; only allowed algorithms are picked.
 * - Time grows with size for every algorithm and layout; HUGE_VAL for layouts that cannot
 *   exist and unknown algorithms; the same inputs give the same bits and the same pick.
 */
#define _GNU_SOURCE
#define DDP_IMPLEMENTATION
#include "ddp.h"
#include "transports/ddp_tcp.h"
#include "ddp_model.h"
#include "tests/ddp_test.h"

#include <math.h>

static char t_dir[256];

static _ddp_layout_t lay(int p, int h, int lmin, int lmax) {
    _ddp_layout_t l;
    l.nranks = p;
    l.nhosts = h;
    l.local_min = lmin;
    l.local_max = lmax;
    return l;
}

static void write_file(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    if (!f) { perror(path); exit(1); }
    fputs(text, f);
    fclose(f);
}

static int same_numbers(const _ddp_model_t *a, const _ddp_model_t *b) {
    return !memcmp(a->alpha_us, b->alpha_us, sizeof a->alpha_us) && !memcmp(a->beta_ns, b->beta_ns, sizeof a->beta_ns) &&
           !memcmp(&a->nic_ns, &b->nic_ns, sizeof a->nic_ns) && !memcmp(&a->gamma_ns, &b->gamma_ns, sizeof a->gamma_ns);
}

static void test_names(void) {
    int a, good = 1;
    for (a = 0; a < _DDP_AR_NUM; a++) good &= _ddp_ar_algo_parse(_ddp_ar_algo_name(a)) == a;
    ok(good, "every algorithm's name parses back to it");
    ok(!strcmp(_ddp_ar_algo_name(_DDP_AR_RAB), "rabenseifner") && !strcmp(_ddp_ar_algo_name(_DDP_AR_HIER_RAB), "hier_rabenseifner"),
       "names as DDP_ALGO spells them");
    ok(_ddp_ar_algo_parse("recursive_doubling") == _DDP_AR_RD, "recursive_doubling is rd");
    ok(_ddp_ar_algo_parse("auto") == -1 && _ddp_ar_algo_parse("") == -1 && _ddp_ar_algo_parse(NULL) == -1 &&
       _ddp_ar_algo_parse("Ring") == -1, "other strings are -1");
    ok(!strcmp(_ddp_ar_algo_name(-1), "?") && !strcmp(_ddp_ar_algo_name(_DDP_AR_NUM), "?"), "out of range names are ?");
}

static void test_file(void) {
    _ddp_model_t m, back, d;
    char path[320], err[512];
    struct { const char *text; int line; const char *what; } bad[] = {
        {"alpha_local_us = 1\n\nbogus_key = 3\n", 3, "bogus_key"},
        {"# comment\nalpha_net_us 20\n", 2, "="},
        {"gamma_ns = fast\n", 1, "fast"},
        {"beta_net_ns = 0.8x\n", 1, "0.8x"},
        {"nic_ns = -1\n", 1, "negative"},
        {"alpha_net_us = inf\n", 1, "inf"},
        {"alpha_net_us = nan\n", 1, "nan"},
        {"gamma_ns =\n", 1, "gamma_ns"},
    };
    size_t i;
    _ddp_model_defaults(&d);
    ok(d.alpha_us[0] > 0 && d.alpha_us[1] > 0 && d.beta_ns[0] > 0 && d.beta_ns[1] > 0 && d.nic_ns > 0 &&
       d.gamma_ns > 0 && !strncmp(d.source, "built-in defaults", 17), "defaults are positive and say where they come from");
    ok(d.alpha_us[_DDP_LINK_NET] > d.alpha_us[_DDP_LINK_LOCAL] && d.beta_ns[_DDP_LINK_NET] > d.beta_ns[_DDP_LINK_LOCAL],
       "the network costs more than shared memory");

    m = d;
    m.alpha_us[0] = 1.0 / 3;
    m.alpha_us[1] = 23.456789012345678;
    m.beta_ns[0] = 0.0123456789;
    m.beta_ns[1] = 8e-3;
    m.nic_ns = 0;
    m.gamma_ns = 1e-300;
    snprintf(path, sizeof path, "%s/model.conf", t_dir);
    ok(_ddp_model_save(&m, path, "a test\nof two lines", err, sizeof err) == 0, "save: %s", err);
    _ddp_model_defaults(&back);
    ok(_ddp_model_load(&back, path, err, sizeof err) == 0, "load what was saved: %s", err);
    ok(same_numbers(&m, &back), "save then load gives the same doubles bit for bit");
    ok(!strcmp(back.source, path), "source is the path loaded");

    write_file(path, "  # only gamma\n\tgamma_ns = 0.25   # a trailing comment\r\n\n");
    back = d;
    ok(_ddp_model_load(&back, path, err, sizeof err) == 0 && back.gamma_ns == 0.25 &&
       back.alpha_us[1] == d.alpha_us[1] && back.beta_ns[0] == d.beta_ns[0] && back.nic_ns == d.nic_ns,
       "keys left out keep their values (%s)", err);

    for (i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char want[400];
        back = d;
        write_file(path, bad[i].text);
        err[0] = 0;
        snprintf(want, sizeof want, "%s:%d:", path, bad[i].line);
        ok(_ddp_model_load(&back, path, err, sizeof err) == -1 && strstr(err, want) && strstr(err, bad[i].what) &&
           same_numbers(&back, &d) && !strcmp(back.source, d.source),
           "malformed file %zu refused, names line %d and '%s', model unchanged: %s", i, bad[i].line, bad[i].what, err);
    }
    snprintf(path, sizeof path, "%s/missing.conf", t_dir);
    ok(_ddp_model_load(&back, path, err, sizeof err) == -1 && strstr(err, path), "a missing file fails: %s", err);
    snprintf(path, sizeof path, "%s/no/such/dir/x.conf", t_dir);
    ok(_ddp_model_save(&m, path, NULL, err, sizeof err) == -1 && strstr(err, path), "saving where one cannot fails: %s", err);
}

/* 1 Gbit/s Ethernet: 8 ns per byte per link. */
static _ddp_model_t gbit(void) {
    _ddp_model_t m;
    _ddp_model_defaults(&m);
    m.alpha_us[_DDP_LINK_NET] = 30;
    m.beta_ns[_DDP_LINK_NET] = 8;
    m.nic_ns = 8;
    return m;
}

static void test_picks(void) {
    _ddp_model_t m;
    _ddp_layout_t l;
    double t[_DDP_AR_NUM], sizes[] = {0, 8, 1024, 65536, 1 << 20, 4 << 20, 64 << 20, 1e9};
    const unsigned all = (1u << _DDP_AR_NUM) - 1;
    int a, p, k, good;
    _ddp_model_defaults(&m);

    l = lay(8, 1, 8, 8);
    a = _ddp_model_ar_pick(&m, 8, &l, all, t);
    ok(a == _DDP_AR_RD, "one host, p = 8, 8 B: rd (%.2f us vs ring %.2f us)", t[_DDP_AR_RD], t[_DDP_AR_RING]);
    a = _ddp_model_ar_pick(&m, 64 << 20, &l, all, t);
    ok(a == _DDP_AR_RING, "one host, p = 8, 64 MiB: ring (got %s: ring %.0f us, rabenseifner %.0f us)",
       _ddp_ar_algo_name(a), t[_DDP_AR_RING], t[_DDP_AR_RAB]);
    good = 1;
    for (k = 0; k < (int)(sizeof sizes / sizeof sizes[0]); k++) {
        _ddp_model_ar_pick(&m, sizes[k], &l, all, t);
        for (a = _DDP_AR_HIER_RING; a < _DDP_AR_NUM; a++) good &= t[a] == t[_DDP_AR_RING];
    }
    ok(good, "one host: every hier_* is the ring, bit for bit");

    m = gbit();
    l = lay(4, 2, 2, 2);
    a = _ddp_model_ar_pick(&m, 4 << 20, &l, all, t);
    ok(a >= _DDP_AR_HIER_RING, "2 hosts x 2 ranks, 1 Gbit/s, 4 MiB: hierarchical (got %s: ring %.0f, rab %.0f, "
       "hier_ring %.0f, hier_rab %.0f us)", _ddp_ar_algo_name(a), t[_DDP_AR_RING], t[_DDP_AR_RAB],
       t[_DDP_AR_HIER_RING], t[_DDP_AR_HIER_RAB]);
    a = _ddp_model_ar_pick(&m, 4 << 20, &l, all & ~(7u << _DDP_AR_HIER_RING), t);
    ok(a < _DDP_AR_HIER_RING, "the same with hier_* not allowed: a flat one (%s)", _ddp_ar_algo_name(a));

    /* One rank per host: hier_X is X over the hosts. */
    good = 1;
    for (p = 2; p <= 130; p += 7) {
        l = lay(p, p, 1, 1);
        for (k = 0; k < (int)(sizeof sizes / sizeof sizes[0]); k++) {
            a = _ddp_model_ar_pick(&m, sizes[k], &l, all, t);
            if (a >= _DDP_AR_HIER_RING) good = 0;
            for (a = 0; a < 3; a++)
                if (fabs(t[_DDP_AR_HIER_RING + a] - t[a]) > 1e-12 * t[a]) good = 0;
        }
    }
    ok(good, "one rank per host: hier_X costs X (to rounding) and is never picked over it");

    /* Many hosts, many ranks each: small goes by latency, large by bandwidth. */
    _ddp_model_defaults(&m);
    l = lay(1024, 128, 8, 8);
    a = _ddp_model_ar_pick(&m, 8, &l, all, t);
    ok(a == _DDP_AR_RD || a == _DDP_AR_HIER_RD, "1024 ranks on 128 hosts, 8 B: a recursive doubling (%s)", _ddp_ar_algo_name(a));
    ok(t[_DDP_AR_RING] > 10 * t[a], "... where the flat ring's 2046 steps cost over 10x (%.0f vs %.0f us)", t[_DDP_AR_RING], t[a]);
    a = _ddp_model_ar_pick(&m, 256 << 20, &l, all, t);
    ok(a != _DDP_AR_RD && a != _DDP_AR_HIER_RD, "1024 ranks, 256 MiB: not a recursive doubling (%s)", _ddp_ar_algo_name(a));

    /* Only allowed ones are picked. */
    good = 1;
    l = lay(24, 3, 8, 8);
    for (k = 0; k < (int)(sizeof sizes / sizeof sizes[0]); k++) {
        unsigned mask;
        for (mask = 1; mask <= all; mask++) {
            a = _ddp_model_ar_pick(&m, sizes[k], &l, mask, NULL);
            if (a < 0 || a >= _DDP_AR_NUM || !(mask & (1u << a))) good = 0;
        }
    }
    ok(good, "the pick is always among the allowed (every mask, every size)");
    ok(_ddp_model_ar_pick(&m, 8, &l, 1u << _DDP_AR_RING, NULL) == _DDP_AR_RING, "ring alone allowed: ring at 8 B");
    ok(_ddp_model_ar_pick(&m, 64 << 20, &l, 1u << _DDP_AR_RD, NULL) == _DDP_AR_RD, "rd alone allowed: rd at 64 MiB");
}

static void test_shape(void) {
    _ddp_model_t m;
    _ddp_layout_t ls[] = {lay(2, 1, 2, 2), lay(8, 1, 8, 8), lay(7, 1, 7, 7), lay(16, 4, 4, 4), lay(12, 4, 3, 3),
                          lay(10, 3, 3, 4), lay(64, 64, 1, 1), lay(1000, 125, 8, 8), lay(102400, 800, 128, 128),
                          lay(100, 7, 14, 15)};
    _ddp_layout_t badl[] = {lay(0, 1, 1, 1), lay(4, 0, 1, 1), lay(4, 5, 1, 1), lay(8, 2, 5, 5), lay(8, 2, 2, 3),
                            lay(8, 2, 4, 3), lay(8, 2, 0, 8)};
    double t[_DDP_AR_NUM], t2[_DDP_AR_NUM];
    int a, i, good = 1, fin = 1, bad = 1, det = 1;
    _ddp_model_defaults(&m);
    for (i = 0; i < (int)(sizeof ls / sizeof ls[0]); i++) {
        for (a = 0; a < _DDP_AR_NUM; a++) {
            double b, prev = 0;
            for (b = 1; b <= 4e9; b *= 1.7) {
                double u = _ddp_model_ar_us(&m, a, b, &ls[i]);
                if (!(u < HUGE_VAL) || u < 0) fin = 0;
                if (u < prev) good = 0;
                prev = u;
            }
        }
    }
    ok(fin, "every algorithm has a finite time in every possible layout");
    ok(good, "time never falls as the size grows (every algorithm, 10 layouts, 1 B .. 4 GB)");
    for (i = 0; i < (int)(sizeof badl / sizeof badl[0]); i++)
        for (a = 0; a < _DDP_AR_NUM; a++)
            if (_ddp_model_ar_us(&m, a, 1024, &badl[i]) != HUGE_VAL) bad = 0;
    ok(bad, "HUGE_VAL for layouts that cannot be (no ranks, no hosts, more hosts than ranks, per-host counts that "
       "do not add up)");
    ok(_ddp_model_ar_us(&m, -1, 8, &ls[1]) == HUGE_VAL && _ddp_model_ar_us(&m, _DDP_AR_NUM, 8, &ls[1]) == HUGE_VAL &&
       _ddp_model_ar_us(&m, 0, -1, &ls[1]) == HUGE_VAL && _ddp_model_ar_us(&m, 0, 8, NULL) == HUGE_VAL,
       "HUGE_VAL for unknown algorithms, negative sizes, no layout");
    {
        _ddp_layout_t one = lay(1, 1, 1, 1);
        ok(_ddp_model_ar_us(&m, _DDP_AR_HIER_RAB, 1e6, &one) == 0 && _ddp_model_ar_us(&m, _DDP_AR_RING, 1e6, &one) == 0,
           "one rank: nothing to do, 0 us");
    }
    for (i = 0; i < (int)(sizeof ls / sizeof ls[0]); i++) {
        _ddp_model_t copy;
        double b;
        memcpy(&copy, &m, sizeof m);   /* what a broadcast of rank 0's model delivers */
        for (b = 8; b < 1e9; b *= 3.3) {
            int p1 = _ddp_model_ar_pick(&m, b, &ls[i], 0x3f, t), p2 = _ddp_model_ar_pick(&copy, b, &ls[i], 0x3f, t2);
            if (p1 != p2 || memcmp(t, t2, sizeof t)) det = 0;
            for (a = 0; a < _DDP_AR_NUM; a++)
                if (t[a] != _ddp_model_ar_us(&m, a, b, &ls[i])) det = 0;
        }
    }
    ok(det, "deterministic: a copy of the model gives the same pick and the same bits; times[] is ar_us");
}

int main(void) {
    snprintf(t_dir, sizeof t_dir, "%s/ddp_model_test.XXXXXX", t_tmpdir());
    if (!mkdtemp(t_dir)) { perror("mkdtemp"); return 1; }
    test_names();
    test_file();
    test_picks();
    test_shape();
    {
        char cmd[300];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", t_dir);
        if (system(cmd) != 0) diag("could not remove %s", t_dir);
    }
    return t_done();
}
