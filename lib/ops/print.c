/* numpy-style text of an array: array([[1., 2.], ...], dtype=float32),
 * summarised with "..." above 1000 elements (3 edge items per axis). */
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "../base/text.h"
#include "dispatch.h"

#define THRESHOLD 1000
#define EDGE 3
#define LINE_WIDTH 75

static void sb_spaces(ndm__sbuf *b, int n)
{
    for (int i = 0; i < n; i++)
        ndm__sbuf_put(b, " ", 1);
}

/* How the elements are written: every element becomes a string of the same
 * width, computed once over the elements that will be shown. */
typedef struct fmt {
    ndm_dtype dtype;
    bool exp;       /* scientific notation */
    int prec;       /* digits after the point */
    int exp_width;  /* scientific mode: digits of every exponent (numpy pads to the widest) */
    int int_width;  /* fixed mode: width of the part before the point */
    int frac_width; /* fixed mode: width of the part after it */
    int width;      /* total width */
} fmt;

/* Does text read back as v in dtype dt? numpy prints the shortest digits
 * that identify a value in its own precision (at most 8 after the point). */
static bool roundtrips(const char *text, double v, ndm_dtype dt)
{
    double w = strtod(text, NULL);
    switch (dt) {
    case NDM_F32:
        return (float)w == (float)v;
    case NDM_F16:
        return ndm_f32_to_f16((float)w) == ndm_f32_to_f16((float)v);
    case NDM_BF16:
        return ndm_f32_to_bf16((float)w) == ndm_f32_to_bf16((float)v);
    default:
        return w == v;
    }
}

/* Fixed notation with the fewest decimals (<= 8) that round-trip; "1." for
 * whole numbers. */
static void fixed_text(double v, ndm_dtype dt, char *out, size_t n)
{
    for (int d = 0; d <= 8; d++) {
        snprintf(out, n, "%#.*f", d, v);
        if (roundtrips(out, v, dt))
            return;
    }
    snprintf(out, n, "%#.8f", v);
    char *end = out + strlen(out) - 1;
    while (*end == '0' && end[-1] != '.')
        *end-- = '\0';
}

/* Digits after the point that v needs in scientific notation (<= 8). */
static int exp_digits(double v, ndm_dtype dt)
{
    char buf[64];
    for (int d = 0; d <= 8; d++) {
        snprintf(buf, sizeof buf, "%#.*e", d, v);
        if (roundtrips(buf, v, dt))
            return d;
    }
    /* numpy rounds to 8 digits and drops the trailing zeros */
    snprintf(buf, sizeof buf, "%.8e", v);
    const char *p = strchr(buf, 'e') - 1;
    int d = 8;
    while (d > 0 && *p == '0') {
        d--;
        p--;
    }
    return d;
}

static void element_text(const fmt *f, const void *val, char *out, size_t n)
{
    switch (f->dtype) {
    case NDM_BOOL:
        snprintf(out, n, "%s", *(const uint8_t *)val ? "True" : "False");
        return;
    case NDM_U8:
    case NDM_I32:
    case NDM_I64:
        snprintf(out, n, "%" PRId64, *(const int64_t *)val);
        return;
    default:
        break;
    }
    double v = *(const double *)val;
    if (isnan(v)) {
        snprintf(out, n, "nan");
    } else if (isinf(v)) {
        snprintf(out, n, v > 0 ? "inf" : "-inf");
    } else if (f->exp) {
        char t[64];
        snprintf(t, sizeof t, "%#.*e", f->prec, v);
        char *e = strchr(t, 'e');
        int digits = (int)strlen(e + 2);
        snprintf(out, n, "%.*s%.*s%s", (int)(e + 2 - t), t,
                 f->exp_width > digits ? f->exp_width - digits : 0, "000000", e + 2);
    } else {
        fixed_text(v, f->dtype, out, n);
    }
}

/* Pad an element's text to the common width. */
static void element_put(ndm__sbuf *b, const fmt *f, const void *val)
{
    char t[96];
    element_text(f, val, t, sizeof t);
    int len = (int)strlen(t);
    bool is_float = ndm_dtype_is_float(f->dtype);
    double v = is_float ? *(const double *)val : 0;
    if (is_float && !f->exp && isfinite(v)) {
        /* Align the points: the integer part right-aligned, the fraction left. */
        const char *dot = strchr(t, '.');
        int ip = dot ? (int)(dot - t) : len;
        int fp = len - ip - 1;
        sb_spaces(b, f->int_width - ip);
        ndm__sbuf_puts(b, t);
        sb_spaces(b, f->frac_width - fp);
    } else {
        sb_spaces(b, f->width - len);
        ndm__sbuf_puts(b, t);
    }
}

typedef struct printer {
    ndm__sbuf *b;
    fmt f;
    const unsigned char *vals; /* host values: double, int64 or uint8 per element */
    size_t vsize;
    int ndim;
    const int64_t *shape;
    const int64_t *cstrides; /* C-order strides of the host values */
    bool summarise;
} printer;

/* Print the sub-array at value offset `off` of axis `axis`; `indent` is the
 * column of this level's '['. `col` tracks the current line length. */
static void print_rec(printer *pr, int axis, int64_t off, int indent, int *col)
{
    ndm__sbuf *b = pr->b;
    ndm__sbuf_puts(b, "[");
    (*col)++;
    int64_t n = pr->shape[axis];
    bool cut = pr->summarise && n > 2 * EDGE;
    /* numpy's room for an element: the line less the closing ")" or ",",
     * one "]" per level, and the "," or "]" after the element */
    int limit = LINE_WIDTH - 1 - pr->ndim;
    if (axis == pr->ndim - 1) {
        for (int64_t i = 0; i < n; i++) {
            if (cut && i == EDGE) {
                int w = 5; /* "..., " */
                if (*col + 3 > limit) {
                    ndm__sbuf_puts(b, "\n");
                    sb_spaces(b, indent + 1);
                    *col = indent + 1;
                }
                ndm__sbuf_puts(b, "..., ");
                *col += w;
                i = n - EDGE - 1;
                continue;
            }
            if (i > 0 && *col + pr->f.width > limit) {
                /* numpy breaks after the comma and indents to the bracket */
                while (b->len && b->p[b->len - 1] == ' ')
                    b->p[--b->len] = '\0';
                ndm__sbuf_puts(b, "\n");
                sb_spaces(b, indent + 1);
                *col = indent + 1;
            }
            element_put(b, &pr->f, pr->vals + (size_t)(off + i * pr->cstrides[axis]) * pr->vsize);
            *col += pr->f.width;
            if (i + 1 < n) {
                ndm__sbuf_puts(b, ", ");
                *col += 2;
            }
        }
    } else {
        int blank = pr->ndim - axis - 2; /* empty lines between blocks */
        for (int64_t i = 0; i < n; i++) {
            if (i > 0) {
                ndm__sbuf_puts(b, ",\n");
                for (int k = 0; k < blank; k++)
                    ndm__sbuf_puts(b, "\n");
                sb_spaces(b, indent + 1);
                *col = indent + 1;
            }
            if (cut && i == EDGE) {
                ndm__sbuf_puts(b, "...");
                i = n - EDGE - 1;
                continue;
            }
            print_rec(pr, axis + 1, off + i * pr->cstrides[axis], indent + 1, col);
        }
    }
    ndm__sbuf_puts(b, "]");
    (*col)++;
}

/* Is element index i of an axis of size n shown? */
static bool shown(int64_t i, int64_t n, bool summarise)
{
    return !summarise || n <= 2 * EDGE || i < EDGE || i >= n - EDGE;
}

/* Call fn on every element that will be shown. */
typedef void (*visit_fn)(printer *pr, const void *val, void *acc);

static void for_shown(printer *pr, visit_fn fn, void *acc)
{
    int64_t total = ndm__numel(pr->ndim, pr->shape);
    int64_t small[16];
    int64_t *idx = pr->ndim <= 16 ? small : calloc((size_t)pr->ndim, sizeof *idx);
    if (!idx)
        return;
    memset(idx, 0, sizeof(int64_t) * (size_t)(pr->ndim <= 16 ? 16 : pr->ndim));
    for (int64_t k = 0; k < total; k++) {
        bool show = true;
        int64_t off = 0;
        for (int a = 0; a < pr->ndim; a++) {
            show = show && shown(idx[a], pr->shape[a], pr->summarise);
            off += idx[a] * pr->cstrides[a];
        }
        if (show)
            fn(pr, pr->vals + (size_t)off * pr->vsize, acc);
        for (int a = pr->ndim - 1; a >= 0; a--) {
            if (++idx[a] < pr->shape[a])
                break;
            idx[a] = 0;
        }
    }
    if (idx != small)
        free(idx);
}

typedef struct range {
    double maxv, minv;
    bool any;
} range;

static void visit_range(printer *pr, const void *val, void *acc)
{
    (void)pr;
    range *g = acc;
    double v = fabs(*(const double *)val);
    if (isfinite(v) && v != 0) {
        g->any = true;
        if (v > g->maxv)
            g->maxv = v;
        if (v < g->minv)
            g->minv = v;
    }
}

static void visit_prec(printer *pr, const void *val, void *acc)
{
    (void)pr;
    double v = *(const double *)val;
    int *prec = acc;
    if (isfinite(v)) {
        int d = exp_digits(v, pr->f.dtype);
        if (d > *prec)
            *prec = d;
    }
}

static void visit_exp_width(printer *pr, const void *val, void *acc)
{
    double v = *(const double *)val;
    int *digits = acc;
    if (isfinite(v)) {
        char t[64];
        snprintf(t, sizeof t, "%#.*e", pr->f.prec, v);
        int d = (int)strlen(strchr(t, 'e') + 2);
        if (d > *digits)
            *digits = d;
    }
}

typedef struct widths {
    int width, iw, fw;
} widths;

static void visit_width(printer *pr, const void *val, void *acc)
{
    widths *w = acc;
    char t[96];
    element_text(&pr->f, val, t, sizeof t);
    int len = (int)strlen(t);
    const char *dot = strchr(t, '.');
    if (ndm_dtype_is_float(pr->f.dtype) && !pr->f.exp && dot && isfinite(*(const double *)val)) {
        int ip = (int)(dot - t), fp = len - ip - 1;
        if (ip > w->iw)
            w->iw = ip;
        if (fp > w->fw)
            w->fw = fp;
    } else if (len > w->width) {
        w->width = len;
    }
}

/* Size the format from the elements that will be shown (numpy's rules:
 * scientific when the largest magnitude is >= 1e8, the smallest non-zero
 * < 1e-4, or their ratio > 1e3). */
static void measure(printer *pr)
{
    fmt *f = &pr->f;
    if (ndm_dtype_is_float(f->dtype)) {
        range g = {0, INFINITY, false};
        for_shown(pr, visit_range, &g);
        f->exp = g.any && (g.maxv >= 1e8 || g.minv < 1e-4 || g.maxv / g.minv > 1e3);
        if (f->exp) {
            for_shown(pr, visit_prec, &f->prec);
            for_shown(pr, visit_exp_width, &f->exp_width);
        }
    }
    widths w = {0, 0, 0};
    for_shown(pr, visit_width, &w);
    if (ndm_dtype_is_float(f->dtype) && !f->exp && (w.iw || w.fw)) {
        f->int_width = w.iw;
        f->frac_width = w.fw;
        f->width = w.iw + 1 + w.fw;
        if (w.width > f->width) {
            f->int_width += w.width - f->width;
            f->width = w.width;
        }
    } else {
        f->width = w.width;
    }
    /* numpy keeps room for "False" in every bool array with axes */
    if (f->dtype == NDM_BOOL && pr->ndim > 0 && f->width < 5)
        f->width = 5;
}

/* The end of the text: ")" or ", dtype=...)", the dtype on a line of its own
 * under the "(" when it would pass the line width (numpy's rule). */
static void put_dtype(ndm__sbuf *b, const char *dt)
{
    if (!dt) {
        ndm__sbuf_puts(b, ")");
        return;
    }
    ndm__sbuf_puts(b, ",");
    if (b->oom)
        return;
    const char *nl = memrchr(b->p, '\n', b->len);
    size_t last = b->len - (nl ? (size_t)(nl - b->p) + 1 : 0);
    if (last + strlen("dtype=)") + strlen(dt) + 1 > LINE_WIDTH) {
        ndm__sbuf_puts(b, "\n");
        sb_spaces(b, 6);
    } else {
        ndm__sbuf_puts(b, " ");
    }
    ndm__sbuf_puts(b, "dtype=");
    ndm__sbuf_puts(b, dt);
    ndm__sbuf_puts(b, ")");
}

static ndm_status format_array(ndm__array *r, ndm__sbuf *b, const char *api)
{
    int64_t n = ndm__numel(r->ndim, r->shape);
    ndm_dtype as = ndm_dtype_is_float(r->dtype) ? NDM_F64 : r->dtype == NDM_BOOL ? NDM_BOOL : NDM_I64;
    size_t vsize = ndm_dtype_size(as);
    size_t raw_bytes = (size_t)n * ndm_dtype_size(r->dtype);
    void *raw = malloc(raw_bytes ? raw_bytes : 1);
    void *vals = malloc(n ? (size_t)n * vsize : 1);
    int64_t *cs = malloc(sizeof(int64_t) * (size_t)(r->ndim ? r->ndim : 1));
    ndm_status st = NDM_OK;
    if (!raw || !vals || !cs) {
        st = ndm__fail(NDM_E_OOM, api, NDM__NO_SITE, "no memory to format %" PRId64 " elements", n);
        goto done;
    }
    ndm__view v;
    ndm__view_fill(r, &v);
    st = ndm__view_to_host(&v, raw, raw_bytes, api, NDM__NO_SITE);
    if (st < 0)
        goto done;
    ndm__contiguous_strides(r->ndim, r->shape, cs);
    {
        int64_t one = n;
        int64_t unit = 1;
        ndm__tensor src = {raw, r->dtype, 1, &one, &unit};
        ndm__tensor dst = {vals, as, 1, &one, &unit};
        st = ndm__host_copy(&dst, &src, api, NDM__NO_SITE);
        if (st < 0)
            goto done;
    }
    const char *dt = ndm_dtype_name(r->dtype);
    bool show_dtype = !(r->dtype == NDM_F64 || r->dtype == NDM_I64 || r->dtype == NDM_BOOL);
    ndm__sbuf_puts(b, "array(");
    if (n == 0) {
        ndm__sbuf_puts(b, "[]");
        if (r->ndim != 1) {
            ndm__sbuf_puts(b, ", shape=(");
            for (int i = 0; i < r->ndim; i++) {
                char num[32];
                snprintf(num, sizeof num, "%s%" PRId64, i ? ", " : "", r->shape[i]);
                ndm__sbuf_puts(b, num);
            }
            ndm__sbuf_puts(b, r->ndim == 1 ? ",)" : ")");
        }
        put_dtype(b, dt);
        goto done;
    }
    printer pr = {b, {r->dtype, false, 0, 0, 0, 0, 0}, vals, vsize, r->ndim, r->shape, cs,
                  n > THRESHOLD};
    measure(&pr);
    if (r->ndim == 0) {
        char t[96];
        element_text(&pr.f, vals, t, sizeof t);
        ndm__sbuf_puts(b, t);
    } else {
        int col = 6;
        print_rec(&pr, 0, 0, 6, &col);
    }
    put_dtype(b, show_dtype ? dt : NULL);
done:
    free(raw);
    free(vals);
    free(cs);
    if (st == NDM_OK && b->oom)
        st = ndm__fail(NDM_E_OOM, api, NDM__NO_SITE, "no memory for the text");
    return st;
}

NDM_API ndm_status ndm_array_print(ndm_array a, FILE *f)
{
    NDM__OP_GUARD();
    ndm__array *r = ndm__array_get(a, __func__, NDM__NO_SITE);
    if (!r)
        return ndm_last_status();
    if (!f)
        return ndm__fail(NDM_E_INVALID, __func__, NDM__NO_SITE, "FILE is NULL");
    ndm__sbuf b = {0};
    ndm_status st = format_array(r, &b, __func__);
    if (st == NDM_OK) {
        fputs(b.p, f);
        fputc('\n', f);
    }
    free(b.p);
    return st;
}

NDM_API int ndm_array_format(ndm_array a, char *buf, size_t n)
{
    NDM__OP_GUARD();
    ndm__array *r = ndm__array_get(a, __func__, NDM__NO_SITE);
    if (!r)
        return ndm_last_status();
    ndm__sbuf b = {0};
    ndm_status st = format_array(r, &b, __func__);
    int len = st < 0 ? (int)st : (int)b.len;
    if (st == NDM_OK && buf && n) {
        size_t k = b.len < n - 1 ? b.len : n - 1;
        memcpy(buf, b.p, k);
        buf[k] = '\0';
    }
    free(b.p);
    return len;
}
