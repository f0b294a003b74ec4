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
            printf(", \"anchor_value\": %.6g, \"ratio\": %.4g}", f->anchor_value, f->ratio);
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
    printf("%-44s %14s %-10s %14s %8s  %s\n", "figure", "value", "unit", "anchor", "ratio",
           "anchor is");
    for (int i = 0; i < r->n; i++) {
        const bench_figure *f = &r->f[i];
        printf("%-44s %14.4g %-10s %14.4g %8.3f  %s\n", f->name, f->value, f->unit,
               f->anchor_value, f->ratio, f->anchor);
    }
}

#endif
