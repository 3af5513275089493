/* bench/bench_common.h — the sweep, timing, statistics and output shared by allreduce_bench.c
 * (libddp) and mpi_allreduce_bench.c (MPI_Allreduce), so both are measured the same way and
 * their rows can be put side by side.
 *
 * A benchmark fills a bench_backend_t (how to all-reduce the buffer being timed, and how to
 * combine a few doubles across ranks) and calls bench_main_sweep / bench_main_mem.
 *
 * METHOD (per size): optional check (fill a known pattern, all-reduce once, compare with the
 * sequential result), zero the buffer (so repeated in-place sums stay finite), -w warmup calls,
 * barrier, -n timed calls back to back with a timestamp after each one. A rank's time is the mean
 * of its n calls; the reported time is that mean averaged over ranks (nccl-tests' "time");
 * p50/p99 are each rank's per-call percentiles, averaged over ranks.
 *   algbw = bytes / time, busbw = algbw * 2(p-1)/p (all-reduce), GB = 1e9 bytes.
 *
 * Needs _GNU_SOURCE (or _POSIX_C_SOURCE >= 200809L) defined by the including file.
 */
#ifndef BENCH_COMMON_H
#define BENCH_COMMON_H

#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/resource.h>
#include <sys/utsname.h>
#include <time.h>
#include <unistd.h>

#define BENCH_MAX_SIZES 128

/* Values are NCCL's ncclDataType_t / ncclRedOp_t (and so libddp's). */
enum { BENCH_INT8 = 0, BENCH_UINT8, BENCH_INT32, BENCH_UINT32, BENCH_INT64, BENCH_UINT64,
       BENCH_FLOAT16, BENCH_FLOAT32, BENCH_FLOAT64, BENCH_BFLOAT16, BENCH_NUM_DTYPES };
enum { BENCH_SUM = 0, BENCH_PROD, BENCH_MAX, BENCH_MIN, BENCH_AVG, BENCH_NUM_OPS };

/* nccl-tests' names first; libddp's as aliases. */
static const struct { const char *name; int dtype; } bench_dtype_names[] = {
    {"int8", BENCH_INT8}, {"uint8", BENCH_UINT8}, {"int32", BENCH_INT32}, {"int", BENCH_INT32},
    {"uint32", BENCH_UINT32}, {"int64", BENCH_INT64}, {"uint64", BENCH_UINT64},
    {"half", BENCH_FLOAT16}, {"float16", BENCH_FLOAT16}, {"float", BENCH_FLOAT32},
    {"float32", BENCH_FLOAT32}, {"double", BENCH_FLOAT64}, {"float64", BENCH_FLOAT64},
    {"bfloat16", BENCH_BFLOAT16}, {"bf16", BENCH_BFLOAT16}};
static const char *const bench_dtype_short[BENCH_NUM_DTYPES] = {"int8", "uint8", "int32",
    "uint32", "int64", "uint64", "half", "float", "double", "bfloat16"};
static const size_t bench_dtype_bytes[BENCH_NUM_DTYPES] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2};
static const char *const bench_op_names[BENCH_NUM_OPS] = {"sum", "prod", "max", "min", "avg"};

typedef struct {
    size_t sizes[BENCH_MAX_SIZES];
    int nsizes;
    size_t minbytes, maxbytes;
    double factor;
    int iters, warmup;
    double target_s;          /* -T: fewer iterations for slow sizes (0 = always -n) */
    int dtype, op;
    int nranks;               /* -p (fork mode of the libddp bench) */
    int check, inplace;
    int mem_mode;             /* -m */
    const char *json;         /* -J */
    const char *label;        /* -L: free text stored in the JSON ("O2", "seg=128K", ...) */
} bench_opts_t;

typedef struct {
    const char *name;         /* "libddp" / "mpi" */
    int rank, nranks;
    void *ctx;
    /* The collective being timed: 0 on success; on failure fills err. */
    int (*allreduce)(void *ctx, const void *sendbuf, void *recvbuf, size_t count, int dtype,
                     int op, char *err, size_t errcap);
    int (*barrier)(void *ctx);
    /* In place, across ranks: op is BENCH_SUM or BENCH_MAX. */
    int (*reduce_doubles)(void *ctx, double *v, int n, int op);
    int (*bcast_int)(void *ctx, int *v);      /* from rank 0 */
    int (*supports)(int dtype, int op);       /* 0: refuse the combination */
    const char *description;  /* printed in the header and stored in the JSON */
} bench_backend_t;

static double bench_now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* "64K", "1M", "1G", "8" (binary multiples, as nccl-tests). 0 on a malformed string. */
static size_t bench_parse_size(const char *s) {
    char *end;
    double v;
    if (!s || !*s) return 0;
    errno = 0;
    v = strtod(s, &end);
    if (errno || v < 0) return 0;
    switch (*end) {
    case 'k': case 'K': v *= 1024.0; end++; break;
    case 'm': case 'M': v *= 1024.0 * 1024.0; end++; break;
    case 'g': case 'G': v *= 1024.0 * 1024.0 * 1024.0; end++; break;
    default: break;
    }
    if (*end == 'B' || *end == 'b') end++;
    return *end ? 0 : (size_t)v;
}

static long bench_peak_rss_kib(void) {
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) != 0) return -1;
    return ru.ru_maxrss;   /* KiB on Linux */
}

/* User and system CPU seconds of this process so far. */
static void bench_cpu_s(double *user, double *sys) {
    struct rusage ru;
    *user = *sys = 0;
    if (getrusage(RUSAGE_SELF, &ru) != 0) return;
    *user = (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec * 1e-6;
    *sys = (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec * 1e-6;
}

static long bench_cur_rss_kib(void) {
    long pages = -1, res = -1;
    FILE *f = fopen("/proc/self/statm", "r");
    if (!f) return -1;
    if (fscanf(f, "%ld %ld", &pages, &res) != 2) res = -1;
    fclose(f);
    return res < 0 ? -1 : res * (sysconf(_SC_PAGESIZE) / 1024);
}

static void bench_usage(const char *prog, int libddp) {
    fprintf(stderr,
        "usage: %s [options]\n"
        "  -b minbytes   smallest size (default 8; K/M/G suffixes)\n"
        "  -e maxbytes   largest size (default 64M; with -m: the buffer, default 256M)\n"
        "  -f factor     multiply the size by this between rows (default 2)\n"
        "  -s list       explicit sizes instead of -b/-e/-f, e.g. 8,64K,1M,16M,64M\n"
        "  -n iters      timed iterations per size (default 20)\n"
        "  -w warmup     untimed iterations per size (default 5)\n"
        "  -T seconds    cap each size at about this much timed work (fewer than -n\n"
        "                iterations for big sizes; rank 0 decides from the warmup; default 0 = off)\n"
        "  -d dtype      int8 uint8 int32 uint32 int64 uint64 half float double bfloat16 (default float)\n"
        "  -o op         sum prod max min avg (default sum)\n"
        "  -c 0|1        check the result once per size (default 1)\n"
        "  -i 0|1        in place (default 1) or out of place\n"
        "%s"
        "  -m            memory mode: one all-reduce of -e bytes (default 256M) in place; report\n"
        "                peak RSS minus the buffer\n"
        "  -J file       write the results as JSON (rank 0)\n"
        "  -L label      free text stored in the JSON\n",
        prog, libddp ? "  -p nranks     fork this many ranks on this host (default 2; ignored under a launcher:\n"
                       "                RANK+WORLD_SIZE, OMPI_COMM_WORLD_RANK+SIZE or PMI_RANK+SIZE set)\n"
                     : "");
}

/* Parses argv; returns 0, or 1 after printing why (or the usage). */
static int bench_parse_args(int argc, char **argv, bench_opts_t *o, int libddp) {
    int i;
    memset(o, 0, sizeof *o);
    o->minbytes = 8;
    o->maxbytes = 0;
    o->factor = 2.0;
    o->iters = 20;
    o->warmup = 5;
    o->dtype = BENCH_FLOAT32;
    o->op = BENCH_SUM;
    o->nranks = 2;
    o->check = 1;
    o->inplace = 1;
    for (i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (a[0] != '-' || !a[1] || a[2]) goto bad;
        if (a[1] == 'm') { o->mem_mode = 1; continue; }
        if (a[1] == 'h') { bench_usage(argv[0], libddp); return 1; }
        if (!v) { fprintf(stderr, "%s: %s needs a value\n", argv[0], a); return 1; }
        i++;
        switch (a[1]) {
        case 'b': if (!(o->minbytes = bench_parse_size(v)) && strcmp(v, "0")) goto badv; break;
        case 'e': if (!(o->maxbytes = bench_parse_size(v))) goto badv; break;
        case 'f': o->factor = atof(v); if (o->factor <= 1.0) goto badv; break;
        case 'n': o->iters = atoi(v); if (o->iters < 1) goto badv; break;
        case 'w': o->warmup = atoi(v); if (o->warmup < 0) goto badv; break;
        case 'T': o->target_s = atof(v); if (o->target_s < 0) goto badv; break;
        case 'c': o->check = atoi(v); break;
        case 'i': o->inplace = atoi(v); break;
        case 'p': o->nranks = atoi(v); if (o->nranks < 1 || o->nranks > 1024) goto badv; break;
        case 'J': o->json = v; break;
        case 'L': o->label = v; break;
        case 'd': {
            size_t k;
            o->dtype = -1;
            for (k = 0; k < sizeof bench_dtype_names / sizeof bench_dtype_names[0]; k++)
                if (!strcasecmp(v, bench_dtype_names[k].name)) o->dtype = bench_dtype_names[k].dtype;
            if (o->dtype < 0) goto badv;
            break;
        }
        case 'o': {
            int k;
            o->op = -1;
            for (k = 0; k < BENCH_NUM_OPS; k++) if (!strcasecmp(v, bench_op_names[k])) o->op = k;
            if (o->op < 0) goto badv;
            break;
        }
        case 's': {
            char buf[1024], *tok, *save = NULL;
            snprintf(buf, sizeof buf, "%s", v);
            o->nsizes = 0;
            for (tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
                size_t b = bench_parse_size(tok);
                if (!b && strcmp(tok, "0")) goto badv;
                if (o->nsizes == BENCH_MAX_SIZES) goto badv;
                o->sizes[o->nsizes++] = b;
            }
            if (!o->nsizes) goto badv;
            break;
        }
        default: goto bad;
        }
        continue;
    badv:
        fprintf(stderr, "%s: bad value '%s' for %s\n", argv[0], v, a);
        return 1;
    bad:
        fprintf(stderr, "%s: unknown option '%s'\n", argv[0], a);
        bench_usage(argv[0], libddp);
        return 1;
    }
    if (!o->maxbytes) o->maxbytes = o->mem_mode ? (256u << 20) : (64u << 20);
    if (!o->nsizes) {
        double b = (double)o->minbytes;
        if (o->minbytes > o->maxbytes) { fprintf(stderr, "%s: -b > -e\n", argv[0]); return 1; }
        while (b <= (double)o->maxbytes && o->nsizes < BENCH_MAX_SIZES) {
            o->sizes[o->nsizes++] = (size_t)b;
            if (b == 0) b = 1;
            b *= o->factor;
        }
    } else {
        int k;
        o->maxbytes = 0;
        for (k = 0; k < o->nsizes; k++) if (o->sizes[k] > o->maxbytes) o->maxbytes = o->sizes[k];
    }
    return 0;
}

/* ---- test pattern: every element is 1 or 2, so every op and dtype stays exact and small
 * (sum <= 2p, prod <= 2^p: integers compare modulo their width, as the wrap-around the libraries
 * compute). */
static int bench_pattern(int rank, size_t i) { return (int)((rank + i) % 2) + 1; }

static uint16_t bench_f2h(float f) {   /* small exact integers only: enough for the pattern */
    uint32_t x;
    int e;
    memcpy(&x, &f, 4);
    if ((x & 0x7fffffffu) == 0) return (uint16_t)(x >> 16);
    e = (int)((x >> 23) & 0xff) - 127 + 15;
    if (e >= 31) return (uint16_t)(((x >> 16) & 0x8000u) | 0x7c00u);
    if (e <= 0) return (uint16_t)((x >> 16) & 0x8000u);
    return (uint16_t)(((x >> 16) & 0x8000u) | ((uint32_t)e << 10) | ((x >> 13) & 0x3ffu));
}
static double bench_h2d(uint16_t h) {
    int e = (h >> 10) & 0x1f;
    double m = (double)(h & 0x3ff);
    double v = e == 0 ? ldexp(m, -24) : e == 31 ? INFINITY : ldexp(m + 1024.0, e - 25);
    return (h & 0x8000) ? -v : v;
}
static uint16_t bench_f2bf(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    return (uint16_t)(x >> 16);   /* exact for the pattern's values */
}
static double bench_bf2d(uint16_t b) {
    uint32_t x = (uint32_t)b << 16;
    float f;
    memcpy(&f, &x, 4);
    return (double)f;
}

static void bench_set(void *buf, size_t i, int dtype, double v) {
    switch (dtype) {
    case BENCH_INT8: case BENCH_UINT8: ((uint8_t *)buf)[i] = (uint8_t)(int64_t)v; break;
    case BENCH_INT32: case BENCH_UINT32: ((uint32_t *)buf)[i] = (uint32_t)(int64_t)v; break;
    case BENCH_INT64: case BENCH_UINT64: ((uint64_t *)buf)[i] = (uint64_t)(int64_t)v; break;
    case BENCH_FLOAT16: ((uint16_t *)buf)[i] = bench_f2h((float)v); break;
    case BENCH_FLOAT32: ((float *)buf)[i] = (float)v; break;
    case BENCH_FLOAT64: ((double *)buf)[i] = v; break;
    case BENCH_BFLOAT16: ((uint16_t *)buf)[i] = bench_f2bf((float)v); break;
    }
}

/* 1 if element i of buf is the expected result of op over all ranks' patterns. */
static int bench_ok(const void *buf, size_t i, int dtype, int op, int p) {
    uint64_t acc = 0, mask;
    double dacc = 0, got = 0;
    int r;
    for (r = 0; r < p; r++) {
        int v = bench_pattern(r, i);
        if (r == 0) { acc = (uint64_t)v; dacc = v; continue; }
        switch (op) {
        case BENCH_SUM: case BENCH_AVG: acc += (uint64_t)v; dacc += v; break;
        case BENCH_PROD: acc *= (uint64_t)v; dacc *= v; break;
        case BENCH_MAX: if ((uint64_t)v > acc) acc = (uint64_t)v; if (v > dacc) dacc = v; break;
        case BENCH_MIN: if ((uint64_t)v < acc) acc = (uint64_t)v; if (v < dacc) dacc = v; break;
        }
    }
    switch (dtype) {
    case BENCH_INT8: case BENCH_UINT8: case BENCH_INT32: case BENCH_UINT32:
    case BENCH_INT64: case BENCH_UINT64: {
        uint64_t g = 0;
        size_t es = bench_dtype_bytes[dtype];
        mask = es == 8 ? ~(uint64_t)0 : (((uint64_t)1 << (8 * es)) - 1);
        if (op == BENCH_AVG) acc = (acc & mask) / (uint64_t)p;  /* sum <= 2p: no wrap, positive */
        if (es == 1) g = ((const uint8_t *)buf)[i];
        else if (es == 4) g = ((const uint32_t *)buf)[i];
        else g = ((const uint64_t *)buf)[i];
        return (g & mask) == (acc & mask);
    }
    case BENCH_FLOAT16: got = bench_h2d(((const uint16_t *)buf)[i]); break;
    case BENCH_BFLOAT16: got = bench_bf2d(((const uint16_t *)buf)[i]); break;
    case BENCH_FLOAT32: got = ((const float *)buf)[i]; break;
    case BENCH_FLOAT64: got = ((const double *)buf)[i]; break;
    }
    if (op == BENCH_AVG) dacc /= p;
    {
        double tol = dtype == BENCH_FLOAT64 ? 1e-12 : dtype == BENCH_FLOAT32 ? 1e-6 : 1e-2;
        return fabs(got - dacc) <= tol * fabs(dacc);
    }
}

static int bench_cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Nearest-rank percentile of sorted v[0..n). */
static double bench_pct(const double *v, int n, double q) {
    int k = (int)ceil(q * n) - 1;
    if (k < 0) k = 0;
    if (k >= n) k = n - 1;
    return v[k];
}

typedef struct {
    size_t bytes, count;
    int iters;
    double time_us, algbw, busbw, p50_us, p99_us, min_us, max_us;
    double cpu_cores, user_cores, sys_cores;   /* CPU of all ranks during the timed calls / wall */
    long wrong;
} bench_row_t;

static void bench_json_escape(FILE *f, const char *s) {
    fputc('"', f);
    for (; s && *s; s++) {
        if (*s == '"' || *s == '\\') fprintf(f, "\\%c", *s);
        else if ((unsigned char)*s < 0x20) fprintf(f, "\\u%04x", *s);
        else fputc(*s, f);
    }
    fputc('"', f);
}

extern char **environ;

/* Every DDP_* variable of the environment (the library's knobs), as a JSON object. */
static void bench_json_env(FILE *f) {
    char **e;
    int first = 1;
    fprintf(f, "{");
    for (e = environ; e && *e; e++) {
        const char *eq = strchr(*e, '=');
        char name[128];
        if (strncmp(*e, "DDP_", 4) || !eq || (size_t)(eq - *e) >= sizeof name) continue;
        memcpy(name, *e, (size_t)(eq - *e));
        name[eq - *e] = 0;
        fprintf(f, "%s", first ? "" : ", ");
        bench_json_escape(f, name);
        fprintf(f, ": ");
        bench_json_escape(f, eq + 1);
        first = 0;
    }
    fprintf(f, "}");
}

static void bench_json_head(FILE *f, const bench_opts_t *o, const bench_backend_t *b,
                            const char *mode) {
    struct utsname u;
    if (uname(&u) != 0) memset(&u, 0, sizeof u);
    fprintf(f, "{\n  \"bench\": \"all_reduce\",\n  \"impl\": ");
    bench_json_escape(f, b->name);
    fprintf(f, ",\n  \"description\": ");
    bench_json_escape(f, b->description);
    fprintf(f, ",\n  \"label\": ");
    bench_json_escape(f, o->label ? o->label : "");
    fprintf(f, ",\n  \"mode\": \"%s\",\n  \"nranks\": %d,\n  \"dtype\": \"%s\",\n  \"op\": \"%s\","
               "\n  \"inplace\": %d,\n  \"iters\": %d,\n  \"warmup\": %d,\n  \"target_s\": %g,"
               "\n  \"host\": {\"nproc\": %ld, \"kernel\": ",
            mode, b->nranks, bench_dtype_short[o->dtype], bench_op_names[o->op], o->inplace,
            o->iters, o->warmup, o->target_s, sysconf(_SC_NPROCESSORS_ONLN));
    bench_json_escape(f, u.release);
    fprintf(f, "},\n  \"env\": ");
    bench_json_env(f);
}

static void bench_header(const bench_opts_t *o, const bench_backend_t *b) {
    char **e;
    int n = 0;
    printf("# %s all_reduce: nranks %d, dtype %s, op %s, %s, iters %d%s, warmup %d, check %d\n",
           b->name, b->nranks, bench_dtype_short[o->dtype], bench_op_names[o->op],
           o->inplace ? "in-place" : "out-of-place", o->iters,
           o->target_s > 0 ? " (capped by -T)" : "", o->warmup, o->check);
    printf("# %s\n", b->description);
    if (!strcmp(b->name, "libddp")) {
        printf("# env:");
        for (e = environ; e && *e; e++)
            if (!strncmp(*e, "DDP_", 4)) { printf(" %s", *e); n++; }
        printf("%s\n", n ? "" : " no DDP_* knobs set (library defaults)");
    }
    printf("# time = mean per call, averaged over ranks; busbw = algbw * 2(p-1)/p; GB = 1e9 B;"
           " p50/p99 per call (sizes <= 64 KiB), averaged over ranks\n");
    printf("# cpu = CPU seconds of all ranks during the timed calls / wall seconds (2.00 = two"
           " cores busy)\n");
    printf("#\n# %10s %12s %8s %6s  %6s %11s %11s %11s %7s %10s %10s %6s\n", "size", "count", "type",
           "redop", "iters", "time(us)", "algbw(GB/s)", "busbw(GB/s)", "#wrong", "p50(us)",
           "p99(us)", "cpu");
}

#define BENCH_LAT_MAX_BYTES (64u << 10)

/* The size sweep. Returns 0 when every call succeeded and every check passed. */
static int bench_main_sweep(const bench_opts_t *o, bench_backend_t *b) {
    const size_t es = bench_dtype_bytes[o->dtype];
    const int p = b->nranks, me = b->rank;
    unsigned char *buf = NULL, *sendbuf = NULL;
    double *lat = NULL, *lat_sorted = NULL;
    bench_row_t rows[BENCH_MAX_SIZES];
    size_t cap = o->maxbytes / es * es;
    long total_wrong = 0;
    int s, rc = 0;
    double stat[6];
    char err[1024];

    if (b->supports && !b->supports(o->dtype, o->op)) {
        if (me == 0) fprintf(stderr, "%s: dtype %s / op %s not supported\n", b->name,
                             bench_dtype_short[o->dtype], bench_op_names[o->op]);
        return 1;
    }
    if (posix_memalign((void **)&buf, 4096, cap ? cap : 64) != 0 ||
        (!o->inplace && posix_memalign((void **)&sendbuf, 4096, cap ? cap : 64) != 0) ||
        !(lat = (double *)malloc((size_t)o->iters * sizeof *lat)) ||
        !(lat_sorted = (double *)malloc((size_t)o->iters * sizeof *lat))) {
        fprintf(stderr, "rank %d: out of memory for %zu-byte buffers\n", me, cap);
        return 1;
    }
    memset(buf, 0, cap ? cap : 64);   /* touch every page before timing */
    if (sendbuf) memset(sendbuf, 0, cap ? cap : 64);
    if (!sendbuf) sendbuf = buf;
    if (me == 0) bench_header(o, b);
    for (s = 0; s < o->nsizes; s++) {
        size_t count = o->sizes[s] / es, bytes = count * es, i;
        bench_row_t *row = &rows[s];
        int it, iters = o->iters;
        double t0, tw, sum = 0, u0, s0, u1, s1;
        long wrong = 0;
        memset(row, 0, sizeof *row);
        row->bytes = bytes;
        row->count = count;
        if (o->check) {
            for (i = 0; i < count; i++) bench_set(sendbuf, i, o->dtype, bench_pattern(me, i));
            if (b->allreduce(b->ctx, sendbuf, buf, count, o->dtype, o->op, err, sizeof err)) goto fail;
            for (i = 0; i < count; i++) wrong += !bench_ok(buf, i, o->dtype, o->op, p);
            memset(sendbuf, 0, bytes);
            if (buf != sendbuf) memset(buf, 0, bytes);
        }
        tw = bench_now_s();
        for (it = 0; it < o->warmup; it++)
            if (b->allreduce(b->ctx, sendbuf, buf, count, o->dtype, o->op, err, sizeof err)) goto fail;
        tw = bench_now_s() - tw;
        if (o->target_s > 0 && o->warmup > 0) {
            double per = tw / o->warmup;
            int want = per > 0 ? (int)ceil(o->target_s / per) : iters;
            if (want < 10) want = 10;
            if (want < iters) iters = want;
            if (b->bcast_int(b->ctx, &iters)) { snprintf(err, sizeof err, "bcast failed"); goto fail; }
        }
        if (b->barrier(b->ctx)) { snprintf(err, sizeof err, "barrier failed"); goto fail; }
        bench_cpu_s(&u0, &s0);
        t0 = bench_now_s();
        for (it = 0; it < iters; it++) {
            double t1;
            if (b->allreduce(b->ctx, sendbuf, buf, count, o->dtype, o->op, err, sizeof err)) goto fail;
            t1 = bench_now_s();
            lat[it] = t1 - t0;
            sum += lat[it];
            t0 = t1;
        }
        bench_cpu_s(&u1, &s1);
        memcpy(lat_sorted, lat, (size_t)iters * sizeof *lat);
        qsort(lat_sorted, (size_t)iters, sizeof *lat_sorted, bench_cmp_double);
        stat[0] = sum / iters;
        stat[1] = bench_pct(lat_sorted, iters, 0.50);
        stat[2] = bench_pct(lat_sorted, iters, 0.99);
        stat[3] = u1 - u0;
        stat[4] = s1 - s0;
        stat[5] = sum;
        if (b->reduce_doubles(b->ctx, stat, 6, BENCH_SUM)) { snprintf(err, sizeof err, "stats reduce failed"); goto fail; }
        {
            double w[3];
            w[0] = (double)wrong;
            w[1] = lat_sorted[iters - 1];
            w[2] = -lat_sorted[0];
            if (b->reduce_doubles(b->ctx, w, 3, BENCH_MAX)) { snprintf(err, sizeof err, "stats reduce failed"); goto fail; }
            /* #wrong: the worst rank (the results must be identical everywhere) */
            row->wrong = (long)w[0];
            row->max_us = w[1] * 1e6;
            row->min_us = -w[2] * 1e6;
        }
        row->iters = iters;
        row->time_us = stat[0] / p * 1e6;
        row->p50_us = stat[1] / p * 1e6;
        row->p99_us = stat[2] / p * 1e6;
        if (stat[5] > 0) {
            row->user_cores = stat[3] / (stat[5] / p);
            row->sys_cores = stat[4] / (stat[5] / p);
            row->cpu_cores = row->user_cores + row->sys_cores;
        }
        row->algbw = row->time_us > 0 ? (double)bytes / (row->time_us * 1e-6) / 1e9 : 0;
        row->busbw = row->algbw * 2.0 * (p - 1) / p;
        total_wrong += row->wrong;
        if (me == 0) {
            char p50[32] = "", p99[32] = "", nw[24] = "N/A";
            if (o->check) snprintf(nw, sizeof nw, "%ld", row->wrong);
            if (bytes <= BENCH_LAT_MAX_BYTES) {
                snprintf(p50, sizeof p50, "%10.2f", row->p50_us);
                snprintf(p99, sizeof p99, "%10.2f", row->p99_us);
            }
            if (!p50[0]) snprintf(p50, sizeof p50, "%10s", "");
            if (!p99[0]) snprintf(p99, sizeof p99, "%10s", "");
            printf("  %10zu %12zu %8s %6s  %6d %11.2f %11.3f %11.3f %7s %s %s %6.2f\n", bytes, count,
                   bench_dtype_short[o->dtype], bench_op_names[o->op], iters, row->time_us,
                   row->algbw, row->busbw, nw, p50, p99, row->cpu_cores);
            fflush(stdout);
        }
        continue;
    fail:
        fprintf(stderr, "rank %d: %s all_reduce of %zu bytes failed: %s\n", me, b->name, bytes, err);
        rc = 1;
        goto out;
    }
    {
        double rss = (double)bench_peak_rss_kib();
        if (b->reduce_doubles(b->ctx, &rss, 1, BENCH_MAX)) { rc = 1; goto out; }
        if (me == 0) {
            double avg_bus = 0;
            int nbig = 0;
            for (s = 0; s < o->nsizes; s++)
                if (rows[s].bytes >= (64u << 10)) { avg_bus += rows[s].busbw; nbig++; }
            printf("# Out of bounds values : %ld %s\n", total_wrong, total_wrong ? "FAILED" : "OK");
            if (nbig) printf("# Avg bus bandwidth (sizes >= 64 KiB) : %.3f GB/s\n", avg_bus / nbig);
            printf("# Peak RSS (max over ranks) : %.1f MiB (buffers: %.1f MiB per rank)\n",
                   rss / 1024.0, (double)cap * (o->inplace ? 1 : 2) / 1048576.0);
            if (o->json) {
                FILE *f = fopen(o->json, "w");
                if (!f) { fprintf(stderr, "cannot write %s: %s\n", o->json, strerror(errno)); rc = 1; }
                else {
                    bench_json_head(f, o, b, "sweep");
                    fprintf(f, ",\n  \"peak_rss_kib\": %.0f,\n  \"wrong\": %ld,\n  \"results\": [\n",
                            rss, total_wrong);
                    for (s = 0; s < o->nsizes; s++) {
                        const bench_row_t *r = &rows[s];
                        fprintf(f, "    {\"bytes\": %zu, \"count\": %zu, \"iters\": %d, "
                                   "\"time_us\": %.3f, \"algbw_GBs\": %.6f, \"busbw_GBs\": %.6f, "
                                   "\"p50_us\": %.3f, \"p99_us\": %.3f, \"min_us\": %.3f, "
                                   "\"max_us\": %.3f, \"cpu_cores\": %.3f, \"user_cores\": %.3f, "
                                   "\"sys_cores\": %.3f, \"wrong\": %ld}%s\n",
                                r->bytes, r->count, r->iters, r->time_us, r->algbw, r->busbw,
                                r->p50_us, r->p99_us, r->min_us, r->max_us, r->cpu_cores,
                                r->user_cores, r->sys_cores, r->wrong,
                                s + 1 < o->nsizes ? "," : "");
                    }
                    fprintf(f, "  ]\n}\n");
                    fclose(f);
                }
            }
        }
        if (total_wrong) rc = 1;
    }
out:
    free(lat);
    free(lat_sorted);
    if (sendbuf != buf) free(sendbuf);
    free(buf);
    return rc;
}

/* -m: one in-place all-reduce of o->maxbytes; peak RSS minus the buffer. */
static int bench_main_mem(const bench_opts_t *o, bench_backend_t *b) {
    const size_t es = bench_dtype_bytes[o->dtype];
    size_t count = o->maxbytes / es, bytes = count * es, i;
    unsigned char *buf = NULL;
    double v[4], t;
    long base_cur = bench_cur_rss_kib();
    char err[1024];
    int rc = 0;
    if (b->supports && !b->supports(o->dtype, o->op)) return 1;
    if (posix_memalign((void **)&buf, 4096, bytes ? bytes : 64) != 0) {
        fprintf(stderr, "rank %d: cannot allocate %zu bytes\n", b->rank, bytes);
        return 1;
    }
    for (i = 0; i < count; i++) bench_set(buf, i, o->dtype, bench_pattern(b->rank, i));
    if (b->barrier(b->ctx)) return 1;
    t = bench_now_s();
    if (b->allreduce(b->ctx, buf, buf, count, o->dtype, o->op, err, sizeof err)) {
        fprintf(stderr, "rank %d: %s all_reduce of %zu bytes failed: %s\n", b->rank, b->name, bytes, err);
        free(buf);
        return 1;
    }
    t = bench_now_s() - t;
    {
        long wrong = 0;
        for (i = 0; i < count; i += 4099) wrong += !bench_ok(buf, i, o->dtype, o->op, b->nranks);
        v[3] = (double)wrong;
    }
    v[0] = (double)bench_peak_rss_kib();
    v[1] = (double)base_cur;
    v[2] = t;
    if (b->reduce_doubles(b->ctx, v, 4, BENCH_MAX)) rc = 1;
    if (b->rank == 0) {
        double buf_mib = (double)bytes / 1048576.0, peak = v[0] / 1024.0, extra = peak - buf_mib;
        printf("# %s all_reduce memory: nranks %d, %zu bytes (%.0f MiB) %s in place, one buffer\n",
               b->name, b->nranks, bytes, buf_mib, bench_dtype_short[o->dtype]);
        printf("# %s\n", b->description);
        printf("  time %.3f s (slowest rank), sampled check: %s\n", v[2], v[3] ? "FAILED" : "OK");
        printf("  RSS before the buffer  : %8.1f MiB (max over ranks)\n", v[1] / 1024.0);
        printf("  peak RSS               : %8.1f MiB (max over ranks, getrusage ru_maxrss)\n", peak);
        printf("  peak RSS - buffer      : %8.1f MiB  (target <= 32 MiB: %s)\n", extra,
               extra <= 32.0 ? "met" : "NOT met");
        printf("  peak - buffer - before : %8.1f MiB  (what the all-reduce itself added)\n",
               extra - v[1] / 1024.0);
        if (o->json) {
            FILE *f = fopen(o->json, "w");
            if (!f) { fprintf(stderr, "cannot write %s: %s\n", o->json, strerror(errno)); rc = 1; }
            else {
                bench_json_head(f, o, b, "memory");
                fprintf(f, ",\n  \"bytes\": %zu,\n  \"time_s\": %.6f,\n  \"rss_before_kib\": %.0f,"
                           "\n  \"peak_rss_kib\": %.0f,\n  \"peak_minus_buffer_mib\": %.3f,"
                           "\n  \"target_met\": %s,\n  \"wrong\": %.0f\n}\n",
                        bytes, v[2], v[1], v[0], extra, extra <= 32.0 ? "true" : "false", v[3]);
                fclose(f);
            }
        }
    }
    if (v[3]) rc = 1;
    free(buf);
    return rc;
}

#endif /* BENCH_COMMON_H */
