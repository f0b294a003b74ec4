/* Shared benchmark helpers: timing, medians, and the report every benchmark
 * prints: a table for people, or with --json one object for scripts,
 *   {"<figure>": {"value": v, "unit": "...", "anchor": "<what>",
 *                 "anchor_value": a, "ratio": r}, ...}
 * where ratio is ours over the anchor's in the direction the name says. */
#ifndef NDM_BENCH_H
#define NDM_BENCH_H

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct bench_opts {
    bool json;
    bool quick;
} bench_opts;

static inline bench_opts bench_parse(int argc, char **argv)
{
    bench_opts o = {false, false};
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--json"))
            o.json = true;
        else if (!strcmp(argv[i], "--quick"))
            o.quick = true;
        else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            printf("usage: %s [--json] [--quick]\n", argv[0]);
            exit(0);
        }
    }
    return o;
}

static inline double bench_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* A new private folder `ndm-bench-<what>-XXXXXX` under $TMPDIR, else the
 * system's (P_tmpdir); false when it cannot be made. */
static inline bool bench_tempdir(char *dir, size_t n, const char *what)
{
    const char *t = getenv("TMPDIR");
    snprintf(dir, n, "%s/ndm-bench-%s-XXXXXX", t && *t ? t : P_tmpdir, what);
    return mkdtemp(dir) != NULL;
}

static inline int bench_cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Median of n samples (sorts v). */
static inline double bench_median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, bench_cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

typedef struct bench_figure {
    char name[96];
    double value;
    char unit[24];
    char anchor[160];
    double anchor_value;
    double ratio;
    double ratio_lo, ratio_hi; /* spread of interleaved pairs' ratios; 0 when none */
} bench_figure;

typedef struct bench_report {
    bench_figure f[256];
    int n;
    bench_opts o;
    char notes[16][256];
    int nnotes;
} bench_report;

/* Add a figure; ratio = value / anchor_value (or 0 when there is no anchor). */
static inline void bench_add(bench_report *r, const char *name, double value, const char *unit,
                             const char *anchor, double anchor_value)
{
    if (r->n >= 256)
        return;
    bench_figure *f = &r->f[r->n++];
    snprintf(f->name, sizeof f->name, "%s", name);
    f->value = value;
    snprintf(f->unit, sizeof f->unit, "%s", unit);
    snprintf(f->anchor, sizeof f->anchor, "%s", anchor ? anchor : "");
    f->anchor_value = anchor_value;
    f->ratio = anchor_value != 0 ? value / anchor_value : 0;
    f->ratio_lo = f->ratio_hi = 0;
}

/* A line of context printed with the table (and as "notes" in JSON). */
static inline void bench_note(bench_report *r, const char *text)
{
    if (r->nnotes < 16)
        snprintf(r->notes[r->nnotes++], sizeof r->notes[0], "%s", text);
}

static inline void bench_json_str(FILE *f, const char *s)
{
    fputc('"', f);
    for (; *s; s++) {
        if (*s == '"' || *s == '\\')
            fputc('\\', f);
        fputc(*s, f);
    }
    fputc('"', f);
}

static inline void bench_print(const bench_report *r)
{
    if (r->o.json) {
        printf("{");
        for (int i = 0; i < r->n; i++) {
            const bench_figure *f = &r->f[i];
            printf("%s\n  ", i ? "," : "");
            bench_json_str(stdout, f->name);
            printf(": {\"value\": %.6g, \"unit\": ", f->value);
            bench_json_str(stdout, f->unit);
            printf(", \"anchor\": ");
            bench_json_str(stdout, f->anchor);
            printf(", \"anchor_value\": %.6g, \"ratio\": %.4g", f->anchor_value, f->ratio);
            if (f->ratio_hi > 0)
                printf(", \"ratio_lo\": %.4g, \"ratio_hi\": %.4g", f->ratio_lo, f->ratio_hi);
            printf("}");
        }
        if (r->nnotes) {
            printf("%s\n  \"notes\": [", r->n ? "," : "");
            for (int i = 0; i < r->nnotes; i++) {
                printf("%s", i ? ", " : "");
                bench_json_str(stdout, r->notes[i]);
            }
            printf("]");
        }
        printf("\n}\n");
        return;
    }
    for (int i = 0; i < r->nnotes; i++)
        printf("# %s\n", r->notes[i]);
    printf("%-44s %14s %-10s %14s %8s %13s  %s\n", "figure", "value", "unit", "anchor",
           "ratio", "pairs' spread", "anchor is");
    for (int i = 0; i < r->n; i++) {
        const bench_figure *f = &r->f[i];
        char spread[32] = "";
        if (f->ratio_hi > 0)
            snprintf(spread, sizeof spread, "%.3f-%.3f", f->ratio_lo, f->ratio_hi);
        printf("%-44s %14.4g %-10s %14.4g %8.3f %13s  %s\n", f->name, f->value, f->unit,
               f->anchor_value, f->ratio, spread, f->anchor);
    }
}

/* ---- figures measured with their anchors, interleaved -------------------------
 * Shared machines drift (memory bandwidth, other tenants) within a run, so a
 * figure and its anchor are sampled alternately, figure then anchor, and the
 * ratio reported is the median of the pairs' ratios, with their spread. */

typedef struct bench_pairs {
    double fig_t, anchor_t; /* medians of the figure's and the anchor's times */
    double ratio, lo, hi;   /* median, least and greatest of the pairs' ratios */
} bench_pairs;

/* From n pairs of times (fig_t[i] and anchor_t[i] measured one after the
 * other). `rate`: the figure is a rate (work / time, more is better), so a
 * pair's ratio is anchor time / figure time; else figure time / anchor time. */
static inline bench_pairs bench_pair_stats(const double *fig_t, const double *anchor_t, int n,
                                           bool rate)
{
    bench_pairs p = {0, 0, 0, 0, 0};
    double f[64], a[64], q[64];
    if (n > 64)
        n = 64;
    if (n <= 0)
        return p;
    for (int i = 0; i < n; i++) {
        f[i] = fig_t[i];
        a[i] = anchor_t[i];
        q[i] = rate ? anchor_t[i] / fig_t[i] : fig_t[i] / anchor_t[i];
    }
    p.fig_t = bench_median(f, n);
    p.anchor_t = bench_median(a, n);
    p.ratio = bench_median(q, n); /* sorts q */
    p.lo = q[0];
    p.hi = q[n - 1];
    return p;
}

/* bench_add with the pairs' median ratio and spread in place of
 * value / anchor_value. */
static inline void bench_add_pairs(bench_report *r, const char *name, double value,
                                   const char *unit, const char *anchor, double anchor_value,
                                   bench_pairs p)
{
    bench_add(r, name, value, unit, anchor, anchor_value);
    if (r->n > 0 && anchor_value != 0) {
        bench_figure *f = &r->f[r->n - 1];
        f->ratio = p.ratio;
        f->ratio_lo = p.lo;
        f->ratio_hi = p.hi;
    }
}

/* ---- sampling contenders turn about --------------------------------------------
 * The one way every benchmark interleaves: k contenders (the figure first,
 * then its anchors) are sampled round-robin, ABAB... or ABCABC..., after one
 * warm-up sample each, so that drift in the machine hits all of them alike. */

#define BENCH_MAXSAMPLES 64

/* One sample of a contender: a time (seconds, or ns per unit: any unit, as
 * long as the contenders compared agree). */
typedef double (*bench_sample_fn)(void *ctx);

/* t[j][i] = contender j's i-th of n samples (n at most BENCH_MAXSAMPLES). */
static inline void bench_interleave(int k, const bench_sample_fn *fn, void *const *ctx, int n,
                                    double (*t)[BENCH_MAXSAMPLES])
{
    if (n > BENCH_MAXSAMPLES)
        n = BENCH_MAXSAMPLES;
    for (int j = 0; j < k; j++)
        (void)fn[j](ctx[j]);
    for (int i = 0; i < n; i++)
        for (int j = 0; j < k; j++)
            t[j][i] = fn[j](ctx[j]);
}

/* A time figure from paired samples: value and anchor_value are the medians
 * times `scale` (e.g. 1e6 for seconds shown as us), ratio the pairs' median
 * of figure / anchor, with their spread. A null anchor_t: the figure alone. */
static inline void bench_add_paired_time(bench_report *r, const char *name, const char *unit,
                                         double scale, const char *anchor, const double *fig_t,
                                         const double *anchor_t, int n)
{
    if (!anchor_t) {
        double f[BENCH_MAXSAMPLES];
        if (n > BENCH_MAXSAMPLES)
            n = BENCH_MAXSAMPLES;
        memcpy(f, fig_t, (size_t)n * sizeof *f);
        bench_add(r, name, bench_median(f, n) * scale, unit, NULL, 0);
        return;
    }
    bench_pairs p = bench_pair_stats(fig_t, anchor_t, n, false);
    bench_add_pairs(r, name, p.fig_t * scale, unit, anchor, p.anchor_t * scale, p);
}

/* A rate figure from paired times: the figure does `fig_work` units per
 * sample (bytes, examples...) and the anchor `anchor_work`; value and
 * anchor_value are work per second times `scale` (1e-9 for GB/s), ratio the
 * pairs' median of figure rate / anchor rate, with their spread. */
static inline void bench_add_paired_rate(bench_report *r, const char *name, const char *unit,
                                         double scale, const char *anchor, double fig_work,
                                         const double *fig_t, double anchor_work,
                                         const double *anchor_t, int n)
{
    double f[BENCH_MAXSAMPLES], a[BENCH_MAXSAMPLES];
    if (n > BENCH_MAXSAMPLES)
        n = BENCH_MAXSAMPLES;
    for (int i = 0; i < n; i++) {
        f[i] = fig_t[i] / fig_work;
        a[i] = anchor_t[i] / anchor_work;
    }
    bench_pairs p = bench_pair_stats(f, a, n, true);
    bench_add_pairs(r, name, scale / p.fig_t, unit, anchor, scale / p.anchor_t, p);
}

#endif
