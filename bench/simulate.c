/* SPDX-License-Identifier: MIT (see LICENSE) */
/* bench/simulate.c — ddp-simulate: what libddp's all-reduce cost model (ddp_model.h, compiled in
 * here: the very formulas the library picks with) predicts, for this machine's model or any
 * model file, at any scale. Model output, not measurements.
 *
 *   build/ddp-simulate --predict [-m MODEL] -p P -H HOSTS [-s 8,4K,64K,1M,4M,16M,64M] [-J out.json]
 *       every algorithm's predicted time per size, which one `auto` picks and its busbw
 *       (bytes / time * 2(p-1)/p, nccl-tests' all-reduce factor); P ranks spread evenly over
 *       HOSTS hosts (local_min = floor(P/HOSTS), local_max = ceil).
 *   build/ddp-simulate --project [-m MODEL] [-o bench/results/projection.md] [--svg FILE]
 *       1024, 10240 and 102400 ranks with 8, 64 and 128 ranks per host, network links of 10,
 *       100 and 400 Gbit/s with 2 and 20 us latency (the local link and gamma from MODEL): the
 *       winner, its time and busbw, and the runner-up at 8 B .. 256 MiB, and every layout's
 *       crossover sizes; --svg draws the predicted busbw against size for a few layouts.
 *   --scratch BYTES   rd is only allowed up to this (the scratch: 8 segments of 512 KiB; default 4M);
 *                     hier_rd while bytes / local_min fits
 *   --stream-gbps G   --project: one TCP stream's ceiling (default 40): beta_net is the slower
 *                     of it and the link, nic_ns the link itself
 */
#define _GNU_SOURCE
#define DDP_IMPLEMENTATION
#include "ddp_model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    _ddp_model_t m;
    double scratch;
} sim_t;

static double sim_parse_size(const char *s, char **end) {
    double v = strtod(s, end);
    switch (**end) {
    case 'k': case 'K': v *= 1024; (*end)++; break;
    case 'm': case 'M': v *= 1024 * 1024; (*end)++; break;
    case 'g': case 'G': v *= 1024.0 * 1024 * 1024; (*end)++; break;
    default: break;
    }
    if (**end == 'B' || **end == 'b') (*end)++;
    return v;
}

static void sim_fmt_size(char *out, size_t cap, double b) {
    if (b >= 1024.0 * 1024 * 1024) snprintf(out, cap, "%.4g GiB", b / (1024.0 * 1024 * 1024));
    else if (b >= 1024.0 * 1024) snprintf(out, cap, "%.4g MiB", b / (1024.0 * 1024));
    else if (b >= 1024) snprintf(out, cap, "%.4g KiB", b / 1024);
    else snprintf(out, cap, "%.0f B", b);
}

static void sim_fmt_time(char *out, size_t cap, double us) {
    if (us >= 1e6) snprintf(out, cap, "%.3g s", us * 1e-6);
    else if (us >= 1e3) snprintf(out, cap, "%.3g ms", us * 1e-3);
    else snprintf(out, cap, "%.3g us", us);
}

static _ddp_layout_t sim_layout(int p, int h) {
    _ddp_layout_t l;
    l.nranks = p;
    l.nhosts = h;
    l.local_min = p / h;
    l.local_max = (p + h - 1) / h;
    return l;
}

/* What the communicator may run at this size: rd only while the buffer fits the scratch,
 * hier_rd while one slice does. */
static unsigned sim_allowed(const sim_t *s, double bytes, const _ddp_layout_t *l) {
    unsigned a = (1u << _DDP_AR_NUM) - 1;
    if (bytes > s->scratch) a &= ~(1u << _DDP_AR_RD);
    if (bytes / l->local_min > s->scratch) a &= ~(1u << _DDP_AR_HIER_RD);
    return a;
}

static double sim_busbw(double bytes, double us, int p) {
    return us > 0 && p > 1 ? bytes / (us * 1e3) * 2.0 * (p - 1) / p : 0;
}

/* The pick and the runner-up (-1 if none). */
static int sim_pick(const sim_t *s, double bytes, const _ddp_layout_t *l, double *t, int *second) {
    unsigned allowed = sim_allowed(s, bytes, l);
    int best = _ddp_model_ar_pick(&s->m, bytes, l, allowed, t), a;
    *second = -1;
    for (a = 0; a < _DDP_AR_NUM; a++)
        if (a != best && (allowed & (1u << a)) && (*second < 0 || t[a] < t[*second])) *second = a;
    return best;
}

static void sim_json_model(FILE *f, const _ddp_model_t *m) {
    const char *c;
    fprintf(f, "{\"alpha_local_us\": %.6g, \"beta_local_ns\": %.6g, \"alpha_net_us\": %.6g, "
               "\"beta_net_ns\": %.6g, \"nic_ns\": %.6g, \"gamma_ns\": %.6g, \"source\": \"",
            m->alpha_us[0], m->beta_ns[0], m->alpha_us[1], m->beta_ns[1], m->nic_ns, m->gamma_ns);
    for (c = m->source; *c; c++) {
        if (*c == '"' || *c == '\\') fputc('\\', f);
        if ((unsigned char)*c >= 0x20) fputc(*c, f);
    }
    fputs("\"}", f);
}

static int sim_predict(const sim_t *s, int p, int h, const double *sizes, int nsizes, const char *json) {
    _ddp_layout_t l = sim_layout(p, h);
    FILE *jf = NULL;
    int i, a, first = 1;
    printf("# MODEL OUTPUT (ddp_model.h), not measurements. Model: %s\n", s->m.source);
    printf("# alpha_local %.4g us, beta_local %.4g ns/B, alpha_net %.4g us, beta_net %.4g ns/B, "
           "nic %.4g ns/B, gamma %.4g ns/B\n", s->m.alpha_us[0], s->m.beta_ns[0], s->m.alpha_us[1],
           s->m.beta_ns[1], s->m.nic_ns, s->m.gamma_ns);
    printf("# p = %d ranks on %d hosts (%d..%d per host); rd up to %.0f bytes; times in us, '-' = not allowed\n",
           p, h, l.local_min, l.local_max, s->scratch);
    printf("%12s", "bytes");
    for (a = 0; a < _DDP_AR_NUM; a++) printf(" %12s", _ddp_ar_algo_name(a));
    printf(" %18s %10s\n", "auto", "busbw_GBs");
    if (json) {
        if (!(jf = fopen(json, "w"))) { perror(json); return 1; }
        fputs("{\"model\": ", jf);
        sim_json_model(jf, &s->m);
        fprintf(jf, ",\n \"layout\": {\"nranks\": %d, \"nhosts\": %d, \"local_min\": %d, \"local_max\": %d, "
                    "\"scratch_bytes\": %.0f},\n \"rows\": [", p, h, l.local_min, l.local_max, s->scratch);
    }
    for (i = 0; i < nsizes; i++) {
        double t[_DDP_AR_NUM];
        int second, best = sim_pick(s, sizes[i], &l, t, &second);
        unsigned allowed = sim_allowed(s, sizes[i], &l);
        printf("%12.0f", sizes[i]);
        for (a = 0; a < _DDP_AR_NUM; a++) {
            if (allowed & (1u << a)) printf(" %12.2f", t[a]);
            else printf(" %12s", "-");
            if (jf && (allowed & (1u << a)))
                fprintf(jf, "%s\n  {\"bytes\": %.0f, \"algo\": \"%s\", \"us\": %.6g, \"busbw_GBs\": %.6g}",
                        first ? "" : ",", sizes[i], _ddp_ar_algo_name(a), t[a], sim_busbw(sizes[i], t[a], p)), first = 0;
        }
        printf(" %18s %10.3f\n", _ddp_ar_algo_name(best), sim_busbw(sizes[i], t[best], p));
        if (jf)
            fprintf(jf, "%s\n  {\"bytes\": %.0f, \"algo\": \"auto\", \"pick\": \"%s\", \"us\": %.6g, \"busbw_GBs\": %.6g}",
                    first ? "" : ",", sizes[i], _ddp_ar_algo_name(best), t[best], sim_busbw(sizes[i], t[best], p)), first = 0;
    }
    if (jf) {
        fputs("\n ]}\n", jf);
        if (fclose(jf) != 0) { perror(json); return 1; }
    }
    return 0;
}

/* ---------------------------------------------------------------- --project */
static const int proj_p[3] = {1024, 10240, 102400};
static const int proj_local[3] = {8, 64, 128};
static const double proj_gbps[3] = {10, 100, 400};
static const double proj_lat[2] = {2, 20};
static const double proj_sizes[5] = {8, 65536, 1048576, 16777216, 268435456};

/* The model for a network of `gbps` and `lat_us`: the local link and gamma as loaded. */
static sim_t proj_net(const sim_t *base, double gbps, double lat_us, double stream_gbps) {
    sim_t s = *base;
    double link = 8.0 / gbps, stream = 8.0 / stream_gbps;
    s.m.alpha_us[_DDP_LINK_NET] = lat_us;
    s.m.beta_ns[_DDP_LINK_NET] = link > stream ? link : stream;
    s.m.nic_ns = link;
    return s;
}

/* Sizes (from 8 B to 1 GiB) where the pick changes, bisected to 1 %. */
static void proj_crossovers(FILE *f, const sim_t *s, const _ddp_layout_t *l) {
    double lo = 8, t[_DDP_AR_NUM];
    int second, cur = sim_pick(s, lo, l, t, &second), n = 0;
    fprintf(f, "%s", _ddp_ar_algo_name(cur));
    while (lo < 1024.0 * 1024 * 1024) {
        double hi = lo * 1.0905;   /* 2^(1/8) */
        int next = sim_pick(s, hi, l, t, &second);
        if (next != cur) {
            double a = lo, b = hi;
            char sz[32];
            while (b / a > 1.01) {
                double mid = sqrt(a * b);
                if (sim_pick(s, mid, l, t, &second) == cur) a = mid; else b = mid;
            }
            sim_fmt_size(sz, sizeof sz, b);
            fprintf(f, " → %s at %s", _ddp_ar_algo_name(next), sz);
            cur = next;
            n++;
        }
        lo = hi;
    }
    if (!n) fprintf(f, " throughout");
}

typedef struct { const char *label; int p, local, ring_only; double gbps, lat; } proj_line_t;
static const proj_line_t proj_lines[] = {
    {"1024 ranks, 8/host, 100G, 2 us: auto", 1024, 8, 0, 100, 2},
    {"1024 ranks, 8/host, 100G, 2 us: ring", 1024, 8, 1, 100, 2},
    {"10240 ranks, 64/host, 100G, 20 us: auto", 10240, 64, 0, 100, 20},
    {"10240 ranks, 64/host, 100G, 20 us: ring", 10240, 64, 1, 100, 20},
    {"102400 ranks, 128/host, 400G, 2 us: auto", 102400, 128, 0, 400, 2},
    {"102400 ranks, 128/host, 10G, 20 us: auto", 102400, 128, 0, 10, 20},
};
#define PROJ_NLINES (int)(sizeof proj_lines / sizeof proj_lines[0])

/* Predicted busbw against size, log-log, drawn directly (no other tool needed). */
static int proj_svg(const char *path, const sim_t *base, double stream_gbps) {
    static const char *const colors[] = {"#1f77b4", "#1f77b4", "#d62728", "#d62728", "#2ca02c", "#9467bd"};
    const double W = 900, Hh = 420, x0 = 70, y0 = 30, pw = 520, ph = 330;
    const double xmin = 3, xmax = 30;           /* log2 bytes: 8 B .. 1 GiB */
    const double ymin = -5, ymax = 2;           /* log10 GB/s */
    FILE *f = fopen(path, "w");
    int i, k;
    if (!f) { perror(path); return 1; }
    fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" "
               "font-family=\"sans-serif\" font-size=\"11\">\n", W, Hh);
    fprintf(f, "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n");
    fprintf(f, "<text x=\"%.0f\" y=\"18\" font-size=\"13\">MODEL OUTPUT (ddp_model.h, not measured): "
               "predicted all-reduce busbw</text>\n", x0);
    for (k = (int)xmin; k <= (int)xmax; k += 3) {
        double x = x0 + (k - xmin) / (xmax - xmin) * pw;
        char sz[32];
        sim_fmt_size(sz, sizeof sz, ldexp(1, k));
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/>\n", x, y0, x, y0 + ph);
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%s</text>\n", x, y0 + ph + 15, sz);
    }
    for (k = (int)ymin; k <= (int)ymax; k++) {
        double y = y0 + ph - (k - ymin) / (ymax - ymin) * ph;
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/>\n", x0, y, x0 + pw, y);
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">%g</text>\n", x0 - 5, y + 4, pow(10, k));
    }
    fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">bytes</text>\n", x0 + pw / 2, y0 + ph + 32);
    fprintf(f, "<text x=\"15\" y=\"%.1f\" transform=\"rotate(-90 15 %.1f)\" text-anchor=\"middle\">busbw GB/s</text>\n",
            y0 + ph / 2, y0 + ph / 2);
    for (i = 0; i < PROJ_NLINES; i++) {
        const proj_line_t *pl = &proj_lines[i];
        sim_t s = proj_net(base, pl->gbps, pl->lat, stream_gbps);
        _ddp_layout_t l = sim_layout(pl->p, pl->p / pl->local);
        double lb;
        fprintf(f, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"2\"%s points=\"", colors[i],
                pl->ring_only ? " stroke-dasharray=\"5,4\"" : "");
        for (lb = xmin; lb <= xmax + 1e-9; lb += 0.25) {
            double bytes = ldexp(1, (int)floor(lb)) * pow(2, lb - floor(lb)), t[_DDP_AR_NUM], us, bw, y;
            int second, a = sim_pick(&s, bytes, &l, t, &second);
            us = pl->ring_only ? t[_DDP_AR_RING] : t[a];
            bw = sim_busbw(bytes, us, pl->p);
            y = bw > 0 ? log10(bw) : ymin;
            if (y < ymin) y = ymin;
            if (y > ymax) y = ymax;
            fprintf(f, "%.1f,%.1f ", x0 + (lb - xmin) / (xmax - xmin) * pw, y0 + ph - (y - ymin) / (ymax - ymin) * ph);
        }
        fprintf(f, "\"/>\n");
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" stroke-width=\"2\"%s/>\n",
                x0 + pw + 10, y0 + 12 + 18.0 * i, x0 + pw + 30, y0 + 12 + 18.0 * i, colors[i],
                pl->ring_only ? " stroke-dasharray=\"5,4\"" : "");
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"9\">%s</text>\n", x0 + pw + 34, y0 + 15 + 18.0 * i, pl->label);
    }
    fprintf(f, "<text x=\"%.0f\" y=\"%.0f\" font-size=\"9\">local link: %s</text>\n", x0, Hh - 8, base->m.source);
    fprintf(f, "</svg>\n");
    if (fclose(f) != 0) { perror(path); return 1; }
    return 0;
}

static int sim_project(const sim_t *base, const char *out, const char *svg, double stream_gbps) {
    FILE *f = out ? fopen(out, "w") : stdout;
    int ip, il, ig, ia, k;
    if (!f) { perror(out); return 1; }
    fprintf(f, "# MODEL OUTPUT — projected all-reduce algorithm choice (not measurements)\n\n");
    fprintf(f, "Generated by `make simulate` (build/ddp-simulate --project) from the cost model in "
               "ddp_model.h, the formulas libddp picks its all-reduce algorithm with. Nothing here was "
               "run at these scales: these are predictions of a model whose local link was measured on a "
               "2-core machine.\n\n");
    fprintf(f, "- Model: %s. Local link (shared memory): alpha %.3g us, beta %.3g ns/B; reduction gamma %.3g ns/B.\n",
            base->m.source, base->m.alpha_us[0], base->m.beta_ns[0], base->m.gamma_ns);
    fprintf(f, "- Network: per-host link of 10, 100 or 400 Gbit/s (nic_ns = 8 / Gbit/s, shared by the host's "
               "streams), one TCP stream at most %.0f Gbit/s (beta_net = the slower of the two), latency "
               "alpha_net 2 or 20 us.\n", stream_gbps);
    fprintf(f, "- Ranks spread evenly, consecutive ranks per host; rd only up to %.0f MiB (the scratch), hier_rd "
               "while one host slice (bytes / ranks per host) fits.\n", base->scratch / (1024 * 1024));
    fprintf(f, "- busbw = bytes / time x 2(p-1)/p. Each cell: **winner** time (busbw GB/s); runner-up.\n"
               "- Not modelled: memory-bandwidth contention among many ranks of one host (the local link is "
               "one stream's cost however many run), more ranks than cores, stragglers and noise, which "
               "grow with the number of steps.\n\n");
    for (ig = 0; ig < 3; ig++) {
        for (ia = 0; ia < 2; ia++) {
            sim_t s = proj_net(base, proj_gbps[ig], proj_lat[ia], stream_gbps);
            fprintf(f, "## %.0f Gbit/s links, %.0f us network latency\n\n", proj_gbps[ig], proj_lat[ia]);
            fprintf(f, "| ranks | per host | hosts |");
            for (k = 0; k < 5; k++) {
                char sz[32];
                sim_fmt_size(sz, sizeof sz, proj_sizes[k]);
                fprintf(f, " %s |", sz);
            }
            fprintf(f, "\n|---:|---:|---:|");
            for (k = 0; k < 5; k++) fprintf(f, "---|");
            fprintf(f, "\n");
            for (ip = 0; ip < 3; ip++) {
                for (il = 0; il < 3; il++) {
                    _ddp_layout_t l = sim_layout(proj_p[ip], proj_p[ip] / proj_local[il]);
                    fprintf(f, "| %d | %d | %d |", l.nranks, proj_local[il], l.nhosts);
                    for (k = 0; k < 5; k++) {
                        double t[_DDP_AR_NUM];
                        char tm[32];
                        int second, best = sim_pick(&s, proj_sizes[k], &l, t, &second);
                        sim_fmt_time(tm, sizeof tm, t[best]);
                        fprintf(f, " **%s** %s (%.3g); %s |", _ddp_ar_algo_name(best), tm,
                                sim_busbw(proj_sizes[k], t[best], l.nranks),
                                second >= 0 ? _ddp_ar_algo_name(second) : "-");
                    }
                    fprintf(f, "\n");
                }
            }
            fprintf(f, "\nCrossovers (the pick from 8 B up to 1 GiB):\n\n");
            for (ip = 0; ip < 3; ip++) {
                for (il = 0; il < 3; il++) {
                    _ddp_layout_t l = sim_layout(proj_p[ip], proj_p[ip] / proj_local[il]);
                    fprintf(f, "- %d ranks, %d per host: ", l.nranks, proj_local[il]);
                    proj_crossovers(f, &s, &l);
                    fprintf(f, "\n");
                }
            }
            fprintf(f, "\n");
        }
    }
    if (svg) fprintf(f, "Chart: %s (predicted busbw against size for a few of these layouts).\n", svg);
    if (out && fclose(f) != 0) { perror(out); return 1; }
    return svg ? proj_svg(svg, base, stream_gbps) : 0;
}

static void sim_usage(FILE *f) {
    fprintf(f, "usage: ddp-simulate --predict [-m MODEL] -p P -H HOSTS [-s 8,4K,64K,1M,4M,16M,64M] [-J out.json]\n"
               "       ddp-simulate --project [-m MODEL] [-o out.md] [--svg out.svg] [--stream-gbps 40]\n"
               "       common: --scratch BYTES (rd's limit, default 4M)\n");
}

int main(int argc, char **argv) {
    sim_t s;
    int mode = 0, p = 0, h = 1, nsizes = 0, i;
    double sizes[64], stream_gbps = 40;
    const char *model = NULL, *json = NULL, *out = NULL, *svg = NULL, *list = "8,4K,64K,1M,4M,16M,64M";
    char err[512], *end;
    _ddp_model_defaults(&s.m);
    s.scratch = 4.0 * 1024 * 1024;
    for (i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--predict")) mode = 1;
        else if (!strcmp(a, "--project")) mode = 2;
        else if (!strcmp(a, "-h") || !strcmp(a, "--help")) { sim_usage(stdout); return 0; }
        else if (!v) { sim_usage(stderr); return 2; }
        else if (!strcmp(a, "-m")) model = v, i++;
        else if (!strcmp(a, "-p")) p = atoi(v), i++;
        else if (!strcmp(a, "-H")) h = atoi(v), i++;
        else if (!strcmp(a, "-s")) list = v, i++;
        else if (!strcmp(a, "-J")) json = v, i++;
        else if (!strcmp(a, "-o")) out = v, i++;
        else if (!strcmp(a, "--svg")) svg = v, i++;
        else if (!strcmp(a, "--stream-gbps")) stream_gbps = atof(v), i++;
        else if (!strcmp(a, "--scratch")) { s.scratch = sim_parse_size(v, &end); i++; }
        else { sim_usage(stderr); return 2; }
    }
    if (model && _ddp_model_load(&s.m, model, err, sizeof err)) { fprintf(stderr, "ddp-simulate: %s\n", err); return 1; }
    if (mode == 2) {
        if (!(stream_gbps > 0)) { fprintf(stderr, "ddp-simulate: --stream-gbps must be > 0\n"); return 2; }
        return sim_project(&s, out, svg, stream_gbps);
    }
    if (mode != 1 || p < 1 || h < 1 || h > p) { sim_usage(stderr); return 2; }
    while (*list && nsizes < 64) {
        double v = sim_parse_size(list, &end);
        if (end == list || v < 0 || (*end && *end != ',')) { fprintf(stderr, "ddp-simulate: bad size list at '%s'\n", list); return 2; }
        sizes[nsizes++] = v;
        list = *end ? end + 1 : end;
    }
    return sim_predict(&s, p, h, sizes, nsizes, json);
}
