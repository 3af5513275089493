/* SPDX-License-Identifier: MIT (see LICENSE) */
/* bench/svg_chart.c — draws bandwidth-by-size line charts as SVG from ddp-bench JSON files.
 *
 *   cc -std=c99 -O2 bench/svg_chart.c -o build/svg_chart -lm        (make builds it)
 *   build/svg_chart -o bench/results/busbw.svg bench/results/all_reduce_tcp_p2.json \
 *                   bench/results/all_reduce_tcp_p4.json 'build/mpi_p2.json=Open MPI p=2'
 *
 * Each FILE[=LABEL] is one line: x = "bytes" (log2 axis), y = "busbw_GBs" (or -y KEY) of the
 * rows of its "results" array, in-place rows by default (-P). The label defaults to
 * "<impl> <transport> p=<nranks>". Any JSON with that shape works: ddp-bench's, the MPI and Gloo
 * peers' (bench/README.md has the schema). No python, no gnuplot: a fresh machine with a C
 * compiler can draw the chart that `make bench` writes.
 *
 * Options: -o out.svg (default stdout)  -P in|out|both  -y KEY  -t title  -s subtitle
 *          -W width -H height (pixels of the plot area; default 700 x 400)
 */
#define _GNU_SOURCE
#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- a small JSON reader: the whole document as a tree */
enum { J_NULL, J_BOOL, J_NUM, J_STR, J_ARR, J_OBJ };
typedef struct jv {
    int type, n;
    double num;
    char *str;
    char **keys;          /* J_OBJ */
    struct jv *kids;      /* J_ARR, J_OBJ */
} jv;

static void j_ws(const char **p) { while (isspace((unsigned char)**p)) (*p)++; }

static int j_parse(const char **p, jv *v, int depth);

static char *j_string(const char **p) {
    const char *s = *p + 1;
    size_t cap = 16, n = 0;
    char *out = (char *)malloc(cap);
    if (!out) return NULL;
    for (; *s && *s != '"'; s++) {
        unsigned c = (unsigned char)*s;
        if (n + 4 >= cap) {
            char *t = (char *)realloc(out, cap *= 2);
            if (!t) { free(out); return NULL; }
            out = t;
        }
        if (c == '\\') {
            s++;
            switch (*s) {
            case 'n': c = '\n'; break;
            case 't': c = '\t'; break;
            case 'r': c = '\r'; break;
            case 'b': c = '\b'; break;
            case 'f': c = '\f'; break;
            case 'u': {
                unsigned u = 0;
                int k;
                for (k = 1; k <= 4; k++) {
                    char h = s[k];
                    if (!isxdigit((unsigned char)h)) { free(out); return NULL; }
                    u = u * 16 + (unsigned)(isdigit((unsigned char)h) ? h - '0' : (h | 0x20) - 'a' + 10);
                }
                s += 4;
                /* UTF-8 (surrogate pairs come out as two replacement-free 3-byte sequences:
                 * good enough for labels) */
                if (u < 0x80) c = u;
                else if (u < 0x800) { out[n++] = (char)(0xc0 | (u >> 6)); c = 0x80 | (u & 0x3f); }
                else { out[n++] = (char)(0xe0 | (u >> 12)); out[n++] = (char)(0x80 | ((u >> 6) & 0x3f)); c = 0x80 | (u & 0x3f); }
                break;
            }
            case 0: free(out); return NULL;
            default: c = (unsigned char)*s; break;
            }
        }
        out[n++] = (char)c;
    }
    if (*s != '"') { free(out); return NULL; }
    out[n] = 0;
    *p = s + 1;
    return out;
}

static int j_push(jv *v, size_t *cap) {
    if ((size_t)v->n == *cap) {
        size_t nc = *cap ? *cap * 2 : 8;
        jv *k = (jv *)realloc(v->kids, nc * sizeof *k);
        if (!k) return 1;
        v->kids = k;
        if (v->type == J_OBJ) {
            char **kk = (char **)realloc(v->keys, nc * sizeof *kk);
            if (!kk) return 1;
            v->keys = kk;
        }
        *cap = nc;
    }
    memset(&v->kids[v->n], 0, sizeof v->kids[0]);
    return 0;
}

static int j_parse(const char **p, jv *v, int depth) {
    memset(v, 0, sizeof *v);
    if (depth > 64) return 1;
    j_ws(p);
    switch (**p) {
    case '{': case '[': {
        char close = **p == '{' ? '}' : ']';
        size_t cap = 0;
        v->type = close == '}' ? J_OBJ : J_ARR;
        (*p)++;
        j_ws(p);
        if (**p == close) { (*p)++; return 0; }
        for (;;) {
            if (j_push(v, &cap)) return 1;
            if (v->type == J_OBJ) {
                j_ws(p);
                if (**p != '"' || !(v->keys[v->n] = j_string(p))) return 1;
                j_ws(p);
                if (**p != ':') { free(v->keys[v->n]); return 1; }
                (*p)++;
            }
            if (j_parse(p, &v->kids[v->n], depth + 1)) { if (v->type == J_OBJ) free(v->keys[v->n]); return 1; }
            v->n++;
            j_ws(p);
            if (**p == ',') { (*p)++; continue; }
            if (**p == close) { (*p)++; return 0; }
            return 1;
        }
    }
    case '"':
        v->type = J_STR;
        return !(v->str = j_string(p));
    case 't': if (strncmp(*p, "true", 4)) return 1; v->type = J_BOOL; v->num = 1; *p += 4; return 0;
    case 'f': if (strncmp(*p, "false", 5)) return 1; v->type = J_BOOL; *p += 5; return 0;
    case 'n': if (strncmp(*p, "null", 4)) return 1; v->type = J_NULL; *p += 4; return 0;
    default: {
        char *end;
        v->type = J_NUM;
        v->num = strtod(*p, &end);
        if (end == *p) return 1;
        *p = end;
        return 0;
    }
    }
}

static void j_free(jv *v) {
    int k;
    for (k = 0; k < v->n; k++) {
        j_free(&v->kids[k]);
        if (v->type == J_OBJ) free(v->keys[k]);
    }
    free(v->kids);
    free(v->keys);
    free(v->str);
}

static const jv *j_get(const jv *o, const char *key) {
    int k;
    if (!o || o->type != J_OBJ) return NULL;
    for (k = 0; k < o->n; k++) if (!strcmp(o->keys[k], key)) return &o->kids[k];
    return NULL;
}
static const char *j_str(const jv *o, const char *key, const char *def) {
    const jv *v = j_get(o, key);
    return v && v->type == J_STR ? v->str : def;
}
static double j_num(const jv *o, const char *key, double def) {
    const jv *v = j_get(o, key);
    return v && (v->type == J_NUM || v->type == J_BOOL) ? v->num : def;
}

/* ---- the chart */
#define MAX_SERIES 16
#define MAX_POINTS 256
typedef struct {
    char label[160], coll[64];
    double x[MAX_POINTS], y[MAX_POINTS];
    int n, dashed, file, deflabel;
} series_t;

/* Okabe & Ito's colour-blind-safe palette (yellow left out: unreadable on white). */
static const char *const palette[] = {"#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00",
                                      "#56B4E9", "#000000", "#999999"};

static void xml(FILE *f, const char *s) {
    for (; *s; s++) {
        switch (*s) {
        case '&': fputs("&amp;", f); break;
        case '<': fputs("&lt;", f); break;
        case '>': fputs("&gt;", f); break;
        case '"': fputs("&quot;", f); break;
        default: fputc(*s, f);
        }
    }
}

static void size_label(char *out, size_t cap, int k) {
    static const char *const unit[] = {"B", "K", "M", "G", "T"};
    int u = k / 10;
    if (u > 4) u = 4;
    snprintf(out, cap, "%.0f%s", ldexp(1.0, k - 10 * u), unit[u]);
}

/* Text width estimate for layout (sans-serif averages ~0.6 em per character). */
static double text_w(const char *s, double font) { return 0.6 * font * (double)strlen(s); }

static char *read_file(const char *path) {
    FILE *f = fopen(path, "rb");
    char *buf;
    long n;
    if (!f) return NULL;
    if (fseek(f, 0, SEEK_END) || (n = ftell(f)) < 0 || fseek(f, 0, SEEK_SET) ||
        !(buf = (char *)malloc((size_t)n + 1))) { fclose(f); return NULL; }
    if (fread(buf, 1, (size_t)n, f) != (size_t)n) { free(buf); fclose(f); return NULL; }
    buf[n] = 0;
    fclose(f);
    return buf;
}

static void usage(const char *prog) {
    fprintf(stderr, "usage: %s [-o out.svg] [-P in|out|both] [-y KEY] [-t title] [-s subtitle]\n"
                    "       [-W width] [-H height] FILE.json[=LABEL] ...\n", prog);
}

int main(int argc, char **argv) {
    series_t *ser = (series_t *)calloc(MAX_SERIES, sizeof *ser);
    int nser = 0, nfile = 0, i, k, placement = 1, mixed = 0;   /* placement: 0 out, 1 in, 2 both */
    const char *out = NULL, *ykey = "busbw_GBs", *title = NULL, *subtitle = NULL;
    char deftitle[256] = "", defsub[256] = "", coll0[64] = "";
    double pw = 700, ph = 400, xmin = 1e300, xmax = 0, ymax = 0;
    FILE *f;
    if (!ser) return 1;
    for (i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (a[0] == '-' && a[1] && !a[2] && strchr("oPytsWH", a[1])) {
            const char *v = i + 1 < argc ? argv[++i] : NULL;
            if (!v) { usage(argv[0]); return 2; }
            switch (a[1]) {
            case 'o': out = v; break;
            case 'y': ykey = v; break;
            case 't': title = v; break;
            case 's': subtitle = v; break;
            case 'W': pw = atof(v); break;
            case 'H': ph = atof(v); break;
            case 'P': placement = !strcmp(v, "out") ? 0 : !strcmp(v, "both") ? 2 : 1; break;
            }
            continue;
        }
        if (a[0] == '-') { usage(argv[0]); return 2; }
        {
            char path[1024], *eq, *text;
            const char *label = NULL, *cur;
            const jv *res;
            jv doc;
            int pl;
            snprintf(path, sizeof path, "%s", a);
            if ((eq = strchr(path, '='))) { *eq = 0; label = eq + 1; }
            if (!(text = read_file(path))) { fprintf(stderr, "%s: cannot read %s\n", argv[0], path); return 1; }
            cur = text;
            if (j_parse(&cur, &doc, 0) || !(res = j_get(&doc, "results")) || res->type != J_ARR) {
                fprintf(stderr, "%s: %s: not JSON with a \"results\" array\n", argv[0], path);
                return 1;
            }
            if (!deftitle[0]) {
                const jv *host = j_get(&doc, "host");
                const char *date = j_str(&doc, "date", "");
                char day[16];
                snprintf(coll0, sizeof coll0, "%s", j_str(&doc, "collective", j_str(&doc, "bench", "")));
                snprintf(day, sizeof day, "%.10s", date);
                snprintf(deftitle, sizeof deftitle, "%s%s%s by message size (%s, %s)", coll0,
                         coll0[0] ? ": " : "", !strcmp(ykey, "algbw_GBs") ? "algorithm bandwidth" :
                         !strcmp(ykey, "busbw_GBs") ? "bus bandwidth" : ykey,
                         j_str(&doc, "dtype", "?"), j_str(&doc, "op", "?"));
                snprintf(defsub, sizeof defsub, "%s%s%s, %.0f cores%s", day[0] ? day : "",
                         day[0] ? " on " : "", j_str(host, "name", "?"), j_num(host, "nproc", 0),
                         placement == 2 ? "; dashed: out-of-place" : placement ? "; in-place" : "; out-of-place");
            }
            for (pl = 0; pl < 2; pl++) {
                series_t *s;
                if (placement != 2 && pl != placement) continue;
                if (nser == MAX_SERIES) { fprintf(stderr, "%s: at most %d lines\n", argv[0], MAX_SERIES); return 1; }
                s = &ser[nser];
                s->file = nfile;
                snprintf(s->coll, sizeof s->coll, "%s", j_str(&doc, "collective", j_str(&doc, "bench", "")));
                if (strcmp(s->coll, coll0)) mixed = 1;
                s->deflabel = !label;
                if (label) snprintf(s->label, sizeof s->label, "%s", label);
                else {
                    const char *impl = j_str(&doc, "impl", "?"), *tr = j_str(&doc, "transport", "");
                    snprintf(s->label, sizeof s->label, "%s%s%s p=%.0f", impl, tr[0] && strcmp(tr, impl) ? " " : "",
                             strcmp(tr, impl) ? tr : "", j_num(&doc, "nranks", 0));
                }
                if (j_num(&doc, "wrong", 0) > 0) {   /* a chart must not hide a failed check */
                    size_t l = strlen(s->label);
                    snprintf(s->label + l, sizeof s->label - l, " (wrong results!)");
                }
                s->dashed = placement == 2 && pl == 0;
                for (k = 0; k < res->n && s->n < MAX_POINTS; k++) {
                    const jv *r = &res->kids[k];
                    double x = j_num(r, "bytes", 0), y = j_num(r, ykey, -1);
                    int ip = (int)j_num(r, "inplace", 1);
                    if (ip != pl || x <= 0 || y < 0) continue;   /* a log axis has no 0 */
                    s->x[s->n] = log2(x);
                    s->y[s->n] = y;
                    s->n++;
                    if (x < xmin) xmin = x;
                    if (x > xmax) xmax = x;
                    if (y > ymax) ymax = y;
                }
                if (s->n) nser++;
            }
            nfile++;
            j_free(&doc);
            free(text);
        }
    }
    if (!nser) { fprintf(stderr, "%s: no data points\n", argv[0]); usage(argv[0]); return 1; }
    if (mixed) {   /* several collectives: the title cannot name one; each line says its own */
        char *c = strstr(deftitle, ": ");
        if (c) memmove(deftitle, c + 2, strlen(c + 2) + 1);
        deftitle[0] = (char)toupper((unsigned char)deftitle[0]);
        for (i = 0; i < nser; i++) {
            char *l = ser[i].label;
            size_t lc = strlen(ser[i].coll), ll = strlen(l);
            if (!ser[i].deflabel || lc + 1 + ll >= sizeof ser[i].label) continue;
            memmove(l + lc + 1, l, ll + 1);
            memcpy(l, ser[i].coll, lc);
            l[lc] = ' ';
        }
    }
    {
        const double font = 13, ml = 72, mt = 70, mb = 58, gap = 24;
        int kmin = (int)floor(log2(xmin)), kmax = (int)ceil(log2(xmax)), step = 1, nlab = 0;
        int labk[64], nleg = 0;
        double ystep, e, lw = 0, W, H, sx, y;
        char buf[64];
        if (kmax == kmin) kmax = kmin + 1;
        /* y: 0 .. a round number above the data, 4-8 gridlines of 1, 2, 2.5 or 5 x 10^n */
        if (ymax <= 0) ymax = 1;
        e = pow(10, floor(log10(ymax / 5)));
        ystep = e;
        if (ymax / ystep > 8) ystep = 2 * e;
        if (ymax / ystep > 8) ystep = 2.5 * e;
        if (ymax / ystep > 8) ystep = 5 * e;
        if (ymax / ystep > 8) ystep = 10 * e;
        ymax = ceil(ymax / ystep - 1e-9) * ystep;
        /* x: a gridline per doubling; labels on multiples of `step` doublings, so 1K, 1M, 64K
         * and 64M get theirs whenever step is 1 or 2, and the labels never touch */
        sx = pw / (kmax - kmin);
        {
            static const int steps[] = {1, 2, 3, 5, 10};
            for (i = 0; i < 5; i++) { step = steps[i]; if (step * sx >= text_w("512K", font) + 12) break; }
        }
        for (k = kmin; k <= kmax && nlab < 63; k++) {
            /* the axis ends get a label too where it does not touch its neighbour's */
            int end = k == kmin ? kmin + step - ((kmin % step) + step) % step : k == kmax ? kmax - ((kmax % step) + step) % step : k;
            char a[16], b[16];
            if (k % step == 0) { labk[nlab++] = k; continue; }
            if (k != kmin && k != kmax) continue;
            size_label(a, sizeof a, k);
            size_label(b, sizeof b, end);
            if (fabs((double)(end - k)) * sx >= (text_w(a, font) + text_w(b, font)) / 2 + 8) labk[nlab++] = k;
        }
        for (i = 0; i < nser; i++) if (text_w(ser[i].label, font) > lw) lw = text_w(ser[i].label, font);
        W = ml + pw + gap + 34 + lw + 16;
        H = mt + ph + mb;
        f = out ? fopen(out, "w") : stdout;
        if (!f) { perror(out); return 1; }
        fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" "
                   "viewBox=\"0 0 %.0f %.0f\" font-family=\"DejaVu Sans, Helvetica, Arial, sans-serif\" "
                   "font-size=\"%.0f\">\n", W, H, W, H, font);
        fprintf(f, "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n");
        fprintf(f, "<text x=\"%.0f\" y=\"26\" font-size=\"17\" font-weight=\"bold\">", ml);
        xml(f, title ? title : deftitle);
        fprintf(f, "</text>\n<text x=\"%.0f\" y=\"47\" fill=\"#555\">", ml);
        xml(f, subtitle ? subtitle : defsub);
        fprintf(f, "</text>\n");
        /* grid */
        fprintf(f, "<g stroke=\"#e4e4e4\" stroke-width=\"1\">\n");
        for (k = kmin; k <= kmax; k++)
            fprintf(f, "<line x1=\"%.1f\" y1=\"%.0f\" x2=\"%.1f\" y2=\"%.0f\"/>\n",
                    ml + (k - kmin) * sx, mt, ml + (k - kmin) * sx, mt + ph);
        for (y = 0; y <= ymax + ystep / 2; y += ystep)
            fprintf(f, "<line x1=\"%.0f\" y1=\"%.1f\" x2=\"%.0f\" y2=\"%.1f\"/>\n", ml,
                    mt + ph - y / ymax * ph, ml + pw, mt + ph - y / ymax * ph);
        fprintf(f, "</g>\n<rect x=\"%.0f\" y=\"%.0f\" width=\"%.0f\" height=\"%.0f\" fill=\"none\" "
                   "stroke=\"#444\"/>\n", ml, mt, pw, ph);
        /* tick labels */
        fprintf(f, "<g fill=\"#222\" text-anchor=\"middle\">\n");
        for (i = 0; i < nlab; i++) {
            size_label(buf, sizeof buf, labk[i]);
            fprintf(f, "<text x=\"%.1f\" y=\"%.0f\">%s</text>\n", ml + (labk[i] - kmin) * sx, mt + ph + 18, buf);
        }
        fprintf(f, "</g>\n<g fill=\"#222\" text-anchor=\"end\">\n");
        for (y = 0; y <= ymax + ystep / 2; y += ystep)
            fprintf(f, "<text x=\"%.0f\" y=\"%.1f\">%g</text>\n", ml - 6, mt + ph - y / ymax * ph + 4.5,
                    fabs(y) < ystep / 1e6 ? 0.0 : y);
        fprintf(f, "</g>\n");
        fprintf(f, "<text x=\"%.1f\" y=\"%.0f\" text-anchor=\"middle\">message size (bytes, log scale; "
                   "K = 1024)</text>\n", ml + pw / 2, mt + ph + 42);
        fprintf(f, "<text transform=\"translate(20 %.1f) rotate(-90)\" text-anchor=\"middle\">%s "
                   "(GB/s, GB = 10\xe2\x81\xb9 bytes)</text>\n", mt + ph / 2,
                   !strcmp(ykey, "busbw_GBs") ? "bus bandwidth" : !strcmp(ykey, "algbw_GBs") ? "algorithm bandwidth" : ykey);
        /* lines, then the legend outside the plot so it never covers data */
        for (i = 0; i < nser; i++) {
            const series_t *s = &ser[i];
            /* one colour per file: with -P both its dashed line is the out-of-place twin */
            const char *col = palette[s->file % (int)(sizeof palette / sizeof palette[0])];
            int row;
            fprintf(f, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"2\"%s points=\"", col,
                    s->dashed ? " stroke-dasharray=\"6 4\"" : "");
            for (k = 0; k < s->n; k++)
                fprintf(f, "%s%.1f,%.1f", k ? " " : "", ml + (s->x[k] - kmin) * sx, mt + ph - s->y[k] / ymax * ph);
            fprintf(f, "\"/>\n<g fill=\"%s\">", col);
            for (k = 0; k < s->n; k++)
                fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"2.6\"/>", ml + (s->x[k] - kmin) * sx,
                        mt + ph - s->y[k] / ymax * ph);
            fprintf(f, "</g>\n");
            if (i > 0 && ser[i - 1].file == s->file) continue;   /* the file is in the legend */
            row = nleg++;
            fprintf(f, "<line x1=\"%.0f\" y1=\"%.0f\" x2=\"%.0f\" y2=\"%.0f\" stroke=\"%s\" stroke-width=\"2\"/>"
                       "<circle cx=\"%.0f\" cy=\"%.0f\" r=\"2.6\" fill=\"%s\"/>\n",
                    ml + pw + gap, mt + 10 + 22.0 * row, ml + pw + gap + 26, mt + 10 + 22.0 * row, col,
                    ml + pw + gap + 13, mt + 10 + 22.0 * row, col);
            fprintf(f, "<text x=\"%.0f\" y=\"%.0f\">", ml + pw + gap + 34, mt + 14.5 + 22.0 * row);
            xml(f, s->label);
            fprintf(f, "</text>\n");
        }
        fprintf(f, "</svg>\n");
        if (out && fclose(f) != 0) { perror(out); return 1; }
    }
    free(ser);
    return 0;
}
