/* SPDX-License-Identifier: MIT (see LICENSE) */
/* bench/bench_cli.h — the command line of the small benchmark tools (ddp-overlap, ddp-async,
 * ddp-scale, ddp-kill-detect, store-bench, guess-bench, ddp-state-transfer), with ddp-bench's
 * conventions (bench_common.h): getopt_long, so "-b8", "-b 8", "--bytes 8" and "--bytes=8" all
 * work; -h/--help prints the usage to stdout and exits 0; --version prints "<tool> (libddp) X.Y"
 * and exits 0; an unknown option, a missing value or a stray argument prints why, then the usage,
 * to stderr and exits 2; a bad value prints why and exits 2.
 *
 *     static const struct option longopts[] = {{"iters", required_argument, NULL, 'i'},
 *         BENCH_CLI_COMMON, {NULL, 0, NULL, 0}};
 *     bench_cli_t cli;
 *     bench_cli_init(&cli, "ddp-x", usage_text, argc, argv);
 *     while ((opt = bench_cli_next(&cli, "+:i:h", longopts)) != -1) {
 *         if (opt == 'i' && !bench_cli_int(&cli, 1, 100, &o.iters)) return 2;
 *     }
 *     if (!bench_cli_end(&cli)) return cli.rc;   (0 after --help or --version, else 2)
 *
 * usage_text is the whole --help text, its first line "usage: ddp-x [options]". Needs the
 * DDP_VERSION_* macros (ddp_base.h, included by ddp.h and ddp_store.h) before it. Static inline:
 * a tool uses what it needs, without unused-function warnings. */
#ifndef BENCH_CLI_H
#define BENCH_CLI_H

#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>

#define BENCH_CLI_VERSION 0x1000   /* getopt_long's value for --version (no letter) */
#define BENCH_CLI_COMMON {"help", no_argument, NULL, 'h'}, {"version", no_argument, NULL, BENCH_CLI_VERSION}

typedef struct {
    const char *name;    /* the tool's name, for messages and --version */
    const char *usage;   /* the --help text */
    int argc;
    char **argv;
    int opt, rc;         /* the option being handled; the exit status once parsing stops */
    const struct option *longopts;
} bench_cli_t;

static inline void bench_cli_init(bench_cli_t *c, const char *name, const char *usage, int argc, char **argv) {
    c->name = name;
    c->usage = usage;
    c->argc = argc;
    c->argv = argv;
    c->opt = c->rc = 0;
    c->longopts = NULL;
    optind = 1;
    opterr = 0;
}

/* The next option, or -1: at the end of the options (rc 0), and after -h, --version or a
 * command-line error (each handled here: rc is then the exit status, 0 or 2). shortopts must
 * start with "+:" (stop at the first operand; report a missing value as ':'). */
static inline int bench_cli_next(bench_cli_t *c, const char *shortopts, const struct option *longopts) {
    int opt;
    c->rc = 0;
    c->longopts = longopts;
    opt = c->opt = getopt_long(c->argc, c->argv, shortopts, longopts, NULL);
    switch (opt) {
    case 'h': fputs(c->usage, stdout); return -1;
    case BENCH_CLI_VERSION: printf("%s (libddp) %d.%d\n", c->name, DDP_VERSION_MAJOR, DDP_VERSION_MINOR); return -1;
    case ':': fprintf(stderr, "%s: %s needs a value\n", c->name, c->argv[optind - 1]); break;
    case '?':
        if (optopt) fprintf(stderr, "%s: unknown option '-%c'\n", c->name, optopt);
        else fprintf(stderr, "%s: unknown option '%s'\n", c->name, c->argv[optind - 1]);
        break;
    default: return opt;
    }
    fputs(c->usage, stderr);
    c->rc = 2;
    return -1;
}

/* Says "bad value" for the option being handled, by its names ("-b/--bytes"), whichever way it
 * was written (rc 2); returns 0. */
static inline int bench_cli_bad(bench_cli_t *c) {
    const struct option *l = c->longopts;
    while (l && l->name && l->val != c->opt) l++;
    if (l && l->name && c->opt < 256)
        fprintf(stderr, "%s: bad value '%s' for -%c/--%s\n", c->name, optarg, c->opt, l->name);
    else if (l && l->name)
        fprintf(stderr, "%s: bad value '%s' for --%s\n", c->name, optarg, l->name);
    else
        fprintf(stderr, "%s: bad value '%s' for -%c\n", c->name, optarg, c->opt);
    c->rc = 2;
    return 0;
}

/* The option's value as a whole number in [lo, hi]: 1, or 0 after saying why (rc 2). */
static inline int bench_cli_int(bench_cli_t *c, long lo, long hi, int *out) {
    char *end;
    long v;
    errno = 0;
    v = strtol(optarg, &end, 10);
    if (errno || end == optarg || *end || v < lo || v > hi) return bench_cli_bad(c);
    *out = (int)v;
    return 1;
}

/* The option's value as a number >= lo: 1, or 0 after saying why (rc 2). */
static inline int bench_cli_double(bench_cli_t *c, double lo, double *out) {
    char *end;
    double v;
    errno = 0;
    v = strtod(optarg, &end);
    if (errno || end == optarg || *end || !(v >= lo)) return bench_cli_bad(c);
    *out = v;
    return 1;
}

/* After the loop: 1 when the options ended well and nothing follows them; else 0 (rc says the
 * exit status: 0 after --help or --version, 2 after an error, said already). */
static inline int bench_cli_end(bench_cli_t *c) {
    if (c->opt != -1 || c->rc) return 0;
    if (optind < c->argc) {
        fprintf(stderr, "%s: unexpected argument '%s'\n", c->name, c->argv[optind]);
        fputs(c->usage, stderr);
        c->rc = 2;
        return 0;
    }
    return 1;
}

#endif /* BENCH_CLI_H */
