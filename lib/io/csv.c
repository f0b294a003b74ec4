/* CSV numbers into a 2-D array: one pass counts rows and checks that every
 * row has the same number of fields, a second parses into the array. */
#include <errno.h>
#include <inttypes.h>
#include <locale.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "../base/text.h"
#include "io.h"

/* Numbers are read in the C locale, whatever the process set: a file
 * written with '.' decimals must not depend on LC_NUMERIC. */
static locale_t c_locale;
static pthread_once_t c_locale_once = PTHREAD_ONCE_INIT;

static void c_locale_init(void) { c_locale = newlocale(LC_NUMERIC_MASK, "C", (locale_t)0); }

static double to_double(const char *s, char **end)
{
    pthread_once(&c_locale_once, c_locale_init);
    return c_locale ? strtod_l(s, end, c_locale) : strtod(s, end);
}

typedef struct csv {
    const char *text, *end;
    ndm_manager m;             /* the loader's, which temporaries are tagged with */
    char delim;
    bool header;
    ndm_dtype dtype;
    const char *name;
    const char *api;
    ndm__site where;
} csv;

typedef struct line {
    const char *p, *e;
    int64_t no;        /* 1-based */
} line;

/* The next line at *at (without its \n or \r\n); false at the end. */
static bool next_line(const csv *c, const char **at, line *l)
{
    if (*at >= c->end)
        return false;
    const char *p = *at;
    const char *nl = memchr(p, '\n', (size_t)(c->end - p));
    const char *e = nl ? nl : c->end;
    *at = nl ? nl + 1 : c->end;
    if (e > p && e[-1] == '\r')
        e--;
    l->p = p;
    l->e = e;
    l->no++;
    return true;
}

static bool is_space(const csv *c, char ch)
{
    return (ch == ' ' || ch == '\t') && ch != c->delim;
}

static bool blank(const csv *c, const line *l)
{
    for (const char *p = l->p; p < l->e; p++)
        if (!is_space(c, *p))
            return false;
    return true;
}

/* The next field of the line at *p: its content in [*fs, *fe), unquoted
 * and trimmed. Returns 1 when a delimiter follows, 0 at the end of the
 * line, -1 for a malformed quoted field. */
static int next_field(const csv *c, const char **p, const char *e, const char **fs,
                      const char **fe)
{
    const char *q = *p;
    while (q < e && is_space(c, *q))
        q++;
    if (q < e && *q == '"') {
        const char *b = ++q;
        for (;;) {
            if (q >= e)
                return -1;
            if (*q == '"') {
                if (q + 1 < e && q[1] == '"') {
                    q += 2;
                    continue;
                }
                break;
            }
            q++;
        }
        *fs = b;
        *fe = q++;
        while (q < e && is_space(c, *q))
            q++;
        if (q < e && *q != c->delim)
            return -1;
    } else {
        const char *b = q;
        while (q < e && *q != c->delim)
            q++;
        const char *t = q;
        while (t > b && is_space(c, t[-1]))
            t--;
        *fs = b;
        *fe = t;
    }
    *p = q < e ? q + 1 : q;
    return q < e ? 1 : 0;
}

static ndm_status count_fields(const csv *c, const line *l, int64_t *n)
{
    /* Without quotes a line has one more field than delimiters. */
    if (!memchr(l->p, '"', (size_t)(l->e - l->p))) {
        int64_t k = 1;
        for (const char *p = l->p; p < l->e; p++)
            k += *p == c->delim;
        *n = k;
        return NDM_OK;
    }
    const char *p = l->p, *fs, *fe;
    int64_t k = 0;
    int more;
    do {
        more = next_field(c, &p, l->e, &fs, &fe);
        if (more < 0)
            return ndm__fail(NDM_E_FORMAT, c->api, c->where,
                             "'%s': line %" PRId64 ", field %" PRId64 ": unbalanced quotes",
                             c->name, l->no, k + 1);
        k++;
    } while (more);
    *n = k;
    return NDM_OK;
}

/* A field as messages quote it: its first bytes, control bytes escaped so
 * that a carriage return or a NUL stays visible and ends nothing. */
static const char *quoted(const char *text, size_t len, char *buf, size_t n)
{
    size_t k = 0, i = 0;
    for (; i < len && i < 40 && k + 5 < n; i++) {
        unsigned char ch = (unsigned char)text[i];
        const char *esc = ch == '\0' ? "\\0" : ch == '\r' ? "\\r" : ch == '\t' ? "\\t" : NULL;
        if (esc) {
            buf[k++] = esc[0];
            buf[k++] = esc[1];
        } else if (ch < 0x20 || ch == 0x7f) {
            k += ndm__hex_escape(ch, buf + k);
        } else {
            buf[k++] = (char)ch;
        }
    }
    if (i < len && k + 3 < n) {
        memcpy(buf + k, "...", 3);
        k += 3;
    }
    buf[k] = '\0';
    return buf;
}

static ndm_status bad_value(const csv *c, const line *l, int64_t col, const char *text,
                            size_t len, const char *why)
{
    char q[4 * 40 + 8];
    return ndm__fail(NDM_E_FORMAT, c->api, c->where,
                     "'%s': line %" PRId64 ", column %" PRId64 ": '%s' %s", c->name, l->no, col,
                     quoted(text, len, q, sizeof q), why);
}

static bool is_word(const char *s, size_t n, const char *w)
{
    return strlen(w) == n && !memcmp(s, w, n);
}

/* Parse one field into *out (an element of c->dtype). */
static ndm_status parse_value(const csv *c, const line *l, int64_t col, const char *fs,
                              const char *fe, void *out)
{
    /* strtod and strtoll take C strings: the field is copied and terminated
     * (the text itself may end without a terminator). */
    char small[128], *num = small;
    size_t n = (size_t)(fe - fs);
    ndm__tmp heap = {0};
    if (n >= sizeof small) {
        if (ndm__tmp_resize(&heap, c->m, n + 1, 0, "a long field", c->api, c->where) < 0)
            return ndm_last_status();
        num = heap.blk.ptr;
    }
    memcpy(num, fs, n);
    num[n] = '\0';
    ndm_status st = NDM_OK;
    char *end;
    if (ndm_dtype_is_float(c->dtype)) {
        double v = NAN;
        if (n) {
            v = to_double(num, &end);
            if (end != num + n) {
                st = bad_value(c, l, col, fs, n, "is not a number");
                goto done;
            }
        }
        switch (c->dtype) {
        case NDM_F64: *(double *)out = v; break;
        case NDM_F32: *(float *)out = (float)v; break;
        case NDM_F16: *(uint16_t *)out = ndm_f32_to_f16((float)v); break;
        default: *(uint16_t *)out = ndm_f32_to_bf16((float)v); break;
        }
        goto done;
    }
    if (!n) {
        st = bad_value(c, l, col, fs, n, "is empty; only float dtypes take missing values");
        goto done;
    }
    int64_t lo = c->dtype == NDM_I64 ? INT64_MIN : c->dtype == NDM_I32 ? INT32_MIN : 0;
    int64_t hi = c->dtype == NDM_I64   ? INT64_MAX
                 : c->dtype == NDM_I32 ? INT32_MAX
                 : c->dtype == NDM_U8  ? 255
                                       : 1;
    int64_t v;
    if (c->dtype == NDM_BOOL &&
        (is_word(num, n, "true") || is_word(num, n, "True") || is_word(num, n, "TRUE"))) {
        v = 1;
    } else if (c->dtype == NDM_BOOL && (is_word(num, n, "false") || is_word(num, n, "False") ||
                                        is_word(num, n, "FALSE"))) {
        v = 0;
    } else {
        errno = 0;
        long long x = strtoll(num, &end, 10);
        if (end == num + n && errno == ERANGE) {
            st = bad_value(c, l, col, fs, n, "is out of range");
            goto done;
        }
        if (end == num + n) {
            v = x;
        } else {
            /* "3.0" or "1e3": a decimal with an integral value. */
            double d = to_double(num, &end);
            if (end != num + n)
                st = bad_value(c, l, col, fs, n, "is not a number");
            else if (d != floor(d) || !isfinite(d))
                st = bad_value(c, l, col, fs, n, "is not an integer");
            else if (d < -9223372036854775808.0 || d >= 9223372036854775808.0)
                st = bad_value(c, l, col, fs, n, "is out of range");
            if (st < 0)
                goto done;
            v = (int64_t)d;
        }
    }
    if (v < lo || v > hi) {
        char why[64];
        snprintf(why, sizeof why, "does not fit in %s", ndm_dtype_short(c->dtype));
        st = bad_value(c, l, col, fs, n, why);
        goto done;
    }
    switch (c->dtype) {
    case NDM_I64: *(int64_t *)out = v; break;
    case NDM_I32: *(int32_t *)out = (int32_t)v; break;
    default: *(uint8_t *)out = (uint8_t)v; break;
    }
done:
    ndm__tmp_free(&heap);
    return st;
}

static ndm_array parse(csv *c, ndm_manager m)
{
    if (!ndm_dtype_valid(c->dtype)) {
        ndm__fail(NDM_E_DTYPE, c->api, c->where, "invalid dtype %d", (int)c->dtype);
        return NDM_NULL_ARRAY;
    }
    if (c->delim == '"' || c->delim == '\n' || c->delim == '\r') {
        ndm__fail(NDM_E_INVALID, c->api, c->where, "'%c' cannot be a delimiter",
                  c->delim == '"' ? '"' : ' ');
        return NDM_NULL_ARRAY;
    }
    if (c->end - c->text >= 3 && !memcmp(c->text, "\xEF\xBB\xBF", 3))
        c->text += 3; /* a UTF-8 byte order mark */
    const char *at = c->text;
    line l = {0}, first = {0};
    int64_t rows = 0, cols = 0, hcols = 0;
    bool header_done = !c->header;
    while (next_line(c, &at, &l)) {
        if (blank(c, &l))
            continue;
        int64_t k = 0;
        if (count_fields(c, &l, &k) < 0)
            return NDM_NULL_ARRAY;
        if (!header_done) {
            header_done = true;
            hcols = k;
            continue;
        }
        if (rows == 0) {
            cols = k;
            first = l;
        } else if (k != cols) {
            ndm__fail(NDM_E_FORMAT, c->api, c->where,
                      "'%s': line %" PRId64 " has %" PRId64 " fields, line %" PRId64
                      " has %" PRId64,
                      c->name, l.no, k, first.no, cols);
            return NDM_NULL_ARRAY;
        }
        rows++;
    }
    if (rows == 0)
        cols = hcols;
    int64_t shape[2] = {rows, cols};
    ndm__view r;
    ndm_array a = ndm__array_make(c->where, c->api, m, NULL, c->dtype, 2, shape, &r);
    if (!a.id)
        return a;
    size_t isz = ndm_dtype_size(c->dtype);
    bool on_cpu = r.device.type == NDM_DEVICE_CPU;
    /* A device array is parsed on the host first. */
    ndm__tmp stage = {0};
    ndm_status st = on_cpu ? NDM_OK
                           : ndm__tmp_resize(&stage, c->m, r.nbytes, 0,
                                             "the host copy of the array", c->api, c->where);
    char *dst = on_cpu ? r.t.data : stage.blk.ptr;
    at = c->text;
    l.no = 0;
    header_done = !c->header;
    int64_t i = 0;
    while (st == NDM_OK && next_line(c, &at, &l)) {
        if (blank(c, &l))
            continue;
        if (!header_done) {
            header_done = true;
            continue;
        }
        const char *p = l.p, *fs = NULL, *fe = NULL;
        for (int64_t j = 0; j < cols && st == NDM_OK; j++) {
            (void)next_field(c, &p, l.e, &fs, &fe);
            st = parse_value(c, &l, j + 1, fs, fe, dst + (size_t)(i * cols + j) * isz);
        }
        i++;
    }
    if (st == NDM_OK && !on_cpu)
        st = ndm__io_fill_array_mem(&r, dst, false, c->api, c->where);
    ndm__tmp_free(&stage);
    if (st < 0) {
        ndm__discard(a);
        return NDM_NULL_ARRAY;
    }
    return a;
}

static csv csv_of(ndm_manager m, const ndm_csv_options *opts, ndm_dtype dtype,
                  const char *name, const char *api, ndm__site where)
{
    csv c = {0};
    c.delim = opts && opts->delimiter ? opts->delimiter : ',';
    c.m = m;
    c.header = opts && opts->header;
    c.dtype = dtype;
    c.name = name;
    c.api = api;
    c.where = where;
    return c;
}

NDM_API ndm_array ndm_csv_load_buffer_at(NDM_SITE_PARAMS, ndm_manager m, const char *text,
                                         size_t len, ndm_dtype dtype,
                                         const ndm_csv_options *opts)
{
    ndm__site site = NDM__SITE;
    m = ndm__io_manager(m, __func__, site);
    if (!m.id)
        return NDM_NULL_ARRAY;
    if (!text && len) {
        ndm__fail(NDM_E_INVALID, __func__, site, "text is NULL for %zu bytes", len);
        return NDM_NULL_ARRAY;
    }
    csv c = csv_of(m, opts, dtype, "<buffer>", __func__, site);
    if (!text)
        text = ""; /* no arithmetic on a null pointer, even by 0 */
    c.text = text;
    c.end = text + len;
    return parse(&c, m);
}

NDM_API ndm_array ndm_csv_load_at(NDM_SITE_PARAMS, ndm_manager m, const char *path,
                                  ndm_dtype dtype, const ndm_csv_options *opts)
{
    ndm__site site = NDM__SITE;
    const char *api = __func__;
    m = ndm__io_manager(m, api, site);
    if (!m.id)
        return NDM_NULL_ARRAY;
    ndm__src s;
    if (ndm__src_open_file(&s, path, true, api, site) < 0)
        return NDM_NULL_ARRAY;
    /* The text is read whole, in the allocator's memory: a compressed file
     * that expands past the CPU's memory limit is refused as it inflates. */
    ndm__tmp text = {0};
    size_t len = 0;
    ndm_array a = NDM_NULL_ARRAY;
    if (ndm__src_read_all(&s, &text, &len, m, api, site) == NDM_OK) {
        csv c = csv_of(m, opts, dtype, path, api, site);
        c.text = text.blk.ptr;
        c.end = c.text + len;
        a = parse(&c, m);
    }
    ndm__tmp_free(&text);
    ndm__src_close(&s);
    return a;
}
