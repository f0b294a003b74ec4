/* .npy load and save: numpy's format versions 1.0 to 3.0, either byte
 * order, C or Fortran order. The header is a Python dict literal. */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "io.h"

/* numpy's own reader refuses headers above 10000 bytes by default; allow
 * more (ranks in the thousands) but never an unbounded read. */
#define MAX_HEADER ((uint64_t)1 << 24)

typedef struct npy_header {
    ndm_dtype dtype;
    bool swap;       /* the file's byte order is not the host's */
    bool fortran;
    int ndim;
    int64_t *shape;  /* heap */
} npy_header;

typedef struct lexer {
    const char *p, *end, *start;
    const char *src;
    const char *api;
    ndm__site where;
} lexer;

static ndm_status lex_fail(lexer *l, const char *what)
{
    return ndm__fail(NDM_E_FORMAT, l->api, l->where, "'%s': bad .npy header: %s at byte %zu",
                     l->src, what, (size_t)(l->p - l->start));
}

static void lex_ws(lexer *l)
{
    while (l->p < l->end && (*l->p == ' ' || *l->p == '\t' || *l->p == '\n' || *l->p == '\r'))
        l->p++;
}

static bool lex_take(lexer *l, char c)
{
    lex_ws(l);
    if (l->p < l->end && *l->p == c) {
        l->p++;
        return true;
    }
    return false;
}

/* A quoted Python string without escapes (all numpy writes). */
static ndm_status lex_string(lexer *l, const char **s, size_t *n)
{
    lex_ws(l);
    if (l->p >= l->end || (*l->p != '\'' && *l->p != '"'))
        return lex_fail(l, "expected a quoted string");
    char q = *l->p++;
    const char *b = l->p;
    while (l->p < l->end && *l->p != q) {
        if (*l->p == '\\' || *l->p == '\n')
            return lex_fail(l, "unsupported character in a string");
        l->p++;
    }
    if (l->p >= l->end)
        return lex_fail(l, "unterminated string");
    *s = b;
    *n = (size_t)(l->p - b);
    l->p++;
    return NDM_OK;
}

static bool lex_word(lexer *l, const char *w)
{
    lex_ws(l);
    size_t n = strlen(w);
    if ((size_t)(l->end - l->p) >= n && !memcmp(l->p, w, n)) {
        l->p += n;
        return true;
    }
    return false;
}

static ndm_status parse_descr(lexer *l, const char *s, size_t n, npy_header *h)
{
    char d[16];
    if (n == 0 || n >= sizeof d)
        return ndm__fail(NDM_E_DTYPE, l->api, l->where, "'%s': unsupported .npy descr '%.*s'",
                         l->src, (int)(n < 32 ? n : 32), s);
    memcpy(d, s, n);
    d[n] = '\0';
    const char *t = d;
    char order = '|';
    if (*t == '<' || *t == '>' || *t == '|' || *t == '=')
        order = *t++;
    static const struct {
        const char *code;
        ndm_dtype dtype;
    } map[] = {{"f8", NDM_F64}, {"f4", NDM_F32}, {"f2", NDM_F16}, {"i8", NDM_I64},
               {"i4", NDM_I32}, {"u1", NDM_U8},  {"b1", NDM_BOOL}, {"V2", NDM_BF16}};
    for (size_t i = 0; i < sizeof map / sizeof map[0]; i++) {
        if (strcmp(t, map[i].code))
            continue;
        h->dtype = map[i].dtype;
        bool little = order == '<' || (order == '=' && ndm__host_little_endian()) ||
                      (order == '|' && ndm__host_little_endian());
        h->swap = ndm_dtype_size(h->dtype) > 1 && little != ndm__host_little_endian();
        return NDM_OK;
    }
    return ndm__fail(NDM_E_DTYPE, l->api, l->where,
                     "'%s': .npy descr '%s' has no ndm dtype (supported: f8 f4 f2 i8 i4 u1 b1, "
                     "and V2 as bfloat16)",
                     l->src, d);
}

static ndm_status parse_shape(lexer *l, npy_header *h)
{
    if (!lex_take(l, '('))
        return lex_fail(l, "the shape must be a tuple");
    size_t cap = 0;
    h->ndim = 0;
    while (!lex_take(l, ')')) {
        lex_ws(l);
        if (l->p >= l->end || *l->p < '0' || *l->p > '9')
            return lex_fail(l, "expected a size in the shape");
        uint64_t v = 0;
        while (l->p < l->end && *l->p >= '0' && *l->p <= '9') {
            if (v > ((uint64_t)INT64_MAX - 9) / 10)
                return ndm__fail(NDM_E_OVERFLOW, l->api, l->where,
                                 "'%s': a size in the .npy shape does not fit in 63 bits",
                                 l->src);
            v = v * 10 + (uint64_t)(*l->p++ - '0');
        }
        if (l->p < l->end && *l->p == 'L') /* Python 2 long */
            l->p++;
        if (h->ndim == INT32_MAX)
            return lex_fail(l, "too many axes");
        if ((size_t)h->ndim == cap) {
            cap = cap ? cap * 2 : 8;
            int64_t *q = realloc(h->shape, cap * sizeof *q);
            if (!q)
                return ndm__fail(NDM_E_OOM, l->api, l->where, "no memory for a shape");
            h->shape = q;
        }
        h->shape[h->ndim++] = (int64_t)v;
        if (!lex_take(l, ',')) {
            if (!lex_take(l, ')'))
                return lex_fail(l, "expected ',' or ')' in the shape");
            break;
        }
    }
    return NDM_OK;
}

static ndm_status parse_header(const char *text, size_t n, npy_header *h, const char *src,
                               const char *api, ndm__site where)
{
    lexer l = {text, text + n, text, src, api, where};
    memset(h, 0, sizeof *h);
    bool have_descr = false, have_order = false, have_shape = false;
    if (!lex_take(&l, '{'))
        return lex_fail(&l, "expected '{'");
    while (!lex_take(&l, '}')) {
        const char *k;
        size_t kn;
        ndm_status st = lex_string(&l, &k, &kn);
        if (st < 0)
            return st;
        if (!lex_take(&l, ':'))
            return lex_fail(&l, "expected ':'");
        bool *seen = kn == 5 && !memcmp(k, "descr", 5)           ? &have_descr
                     : kn == 13 && !memcmp(k, "fortran_order", 13) ? &have_order
                     : kn == 5 && !memcmp(k, "shape", 5)           ? &have_shape
                                                                   : NULL;
        if (!seen)
            return ndm__fail(NDM_E_FORMAT, api, where, "'%s': bad .npy header: unknown key '%.*s'",
                             src, (int)(kn < 64 ? kn : 64), k);
        if (*seen)
            return ndm__fail(NDM_E_FORMAT, api, where, "'%s': bad .npy header: '%.*s' twice",
                             src, (int)kn, k);
        *seen = true;
        if (seen == &have_descr) {
            lex_ws(&l);
            if (l.p < l.end && *l.p == '[')
                return ndm__fail(NDM_E_DTYPE, api, where,
                                 "'%s': structured .npy dtypes are not supported", src);
            const char *s;
            size_t sn;
            if ((st = lex_string(&l, &s, &sn)) < 0 || (st = parse_descr(&l, s, sn, h)) < 0)
                return st;
        } else if (seen == &have_order) {
            if (lex_word(&l, "True"))
                h->fortran = true;
            else if (!lex_word(&l, "False"))
                return lex_fail(&l, "fortran_order must be True or False");
        } else if ((st = parse_shape(&l, h)) < 0) {
            return st;
        }
        if (!lex_take(&l, ',')) {
            if (!lex_take(&l, '}'))
                return lex_fail(&l, "expected ',' or '}'");
            break;
        }
    }
    lex_ws(&l);
    if (l.p != l.end)
        return lex_fail(&l, "text after the dict");
    if (!have_descr || !have_order || !have_shape)
        return ndm__fail(NDM_E_FORMAT, api, where, "'%s': bad .npy header: no '%s' key", src,
                         !have_descr ? "descr" : !have_order ? "fortran_order" : "shape");
    return NDM_OK;
}

/* Copy the Fortran-ordered data of t (shape reversed) into r in C order. */
static ndm_status from_fortran(const ndm__view *r, const ndm__view *t, const char *api,
                               ndm__site where)
{
    int64_t *fs = malloc((size_t)r->t.ndim * sizeof *fs);
    if (!fs)
        return ndm__fail(NDM_E_OOM, api, where, "no memory for strides");
    int64_t s = 1;
    for (int i = 0; i < r->t.ndim; i++) {
        fs[i] = s;
        s *= r->t.shape[i] ? r->t.shape[i] : 1;
    }
    ndm__tensor src = {t->t.data, r->t.dtype, r->t.ndim, r->t.shape, fs};
    ndm_status st = ndm__device_copy(r->device, &r->t, &src, api, where);
    free(fs);
    return st;
}

static ndm_array load(ndm__site site, const char *api, ndm_manager m, ndm__src *s)
{
    uint8_t pre[12];
    ndm_status st = ndm__src_read_exact(s, pre, 10, "the .npy preamble", api, site);
    if (st < 0)
        return NDM_NULL_ARRAY;
    if (memcmp(pre, "\x93NUMPY", 6)) {
        ndm__fail(NDM_E_FORMAT, api, site, "'%s' is not a .npy file (bad magic)", s->name);
        return NDM_NULL_ARRAY;
    }
    int major = pre[6], minor = pre[7];
    if (major < 1 || major > 3 || minor != 0) {
        ndm__fail(NDM_E_FORMAT, api, site, "'%s': unsupported .npy version %d.%d", s->name, major,
                  minor);
        return NDM_NULL_ARRAY;
    }
    uint64_t hlen = (uint64_t)pre[8] | (uint64_t)pre[9] << 8;
    if (major >= 2) {
        if (ndm__src_read_exact(s, pre + 10, 2, "the .npy header length", api, site) < 0)
            return NDM_NULL_ARRAY;
        hlen = ndm__load_le32(pre + 8);
    }
    if (hlen > ndm__src_bound(s) || hlen > MAX_HEADER) {
        ndm__fail(NDM_E_FORMAT, api, site,
                  "'%s': the .npy header length %" PRIu64 " exceeds the %" PRIu64
                  " bytes left (or the limit of %" PRIu64 ")",
                  s->name, hlen, ndm__src_bound(s), MAX_HEADER);
        return NDM_NULL_ARRAY;
    }
    char *text = malloc(hlen ? hlen : 1);
    if (!text) {
        ndm__fail(NDM_E_OOM, api, site, "no memory for a .npy header");
        return NDM_NULL_ARRAY;
    }
    npy_header h = {0};
    ndm_array a = NDM_NULL_ARRAY, tmp = NDM_NULL_ARRAY;
    if (ndm__src_read_exact(s, text, hlen, "the .npy header", api, site) < 0 ||
        parse_header(text, hlen, &h, s->name, api, site) < 0)
        goto done;
    size_t nbytes;
    if (ndm__shape_check(h.ndim, h.shape, h.dtype, NULL, &nbytes, api, site) < 0)
        goto done;
    /* Before allocating: the data must fit in what is left. */
    if (nbytes > ndm__src_bound(s)) {
        ndm__fail(NDM_E_FORMAT, api, site,
                  "'%s' is truncated: its header describes %zu bytes of data, only %" PRIu64
                  " remain",
                  s->name, nbytes, ndm__src_bound(s));
        goto done;
    }
    ndm__view r, t;
    a = ndm__array_make(site, api, m, NULL, h.dtype, h.ndim, h.shape, &r);
    if (!a.id)
        goto done;
    if (!h.fortran || h.ndim < 2) {
        st = ndm__io_fill_array(&r, s, h.swap, "the array data", api, site);
    } else {
        int64_t *rev = malloc((size_t)h.ndim * sizeof *rev);
        if (!rev) {
            st = ndm__fail(NDM_E_OOM, api, site, "no memory for a shape");
        } else {
            for (int i = 0; i < h.ndim; i++)
                rev[i] = h.shape[h.ndim - 1 - i];
            tmp = ndm__array_make(site, api, m, NULL, h.dtype, h.ndim, rev, &t);
            free(rev);
            st = tmp.id ? ndm__io_fill_array(&t, s, h.swap, "the array data", api, site)
                        : ndm_last_status();
            if (st == NDM_OK)
                st = from_fortran(&r, &t, api, site);
            ndm__discard(tmp);
        }
    }
    if (st < 0) {
        ndm__discard(a);
        a = NDM_NULL_ARRAY;
    }
done:
    free(h.shape);
    free(text);
    return a;
}

NDM_API ndm_array ndm_npy_load_at(NDM_SITE_PARAMS, ndm_manager m, const char *path)
{
    return ndm__io_load_file(NDM__SITE, __func__, m, path, false, load);
}

NDM_API ndm_array ndm_npy_load_buffer_at(NDM_SITE_PARAMS, ndm_manager m, const void *data,
                                         size_t len)
{
    return ndm__io_load_mem(NDM__SITE, __func__, m, data, len, false, load);
}

static const char *npy_descr(ndm_dtype t)
{
    switch (t) {
    case NDM_F64: return "<f8";
    case NDM_F32: return "<f4";
    case NDM_F16: return "<f2";
    case NDM_BF16: return "<V2";
    case NDM_I64: return "<i8";
    case NDM_I32: return "<i4";
    case NDM_U8: return "|u1";
    case NDM_BOOL: return "|b1";
    }
    return NULL;
}

NDM_API ndm_status ndm_npy_save_at(NDM_SITE_PARAMS, const char *path, ndm_array a)
{
    ndm__site site = NDM__SITE;
    const char *api = __func__;
    ndm__view v;
    if (!ndm__view_input(a, &v, api, site))
        return ndm_last_status();
    const ndm__tensor *r = &v.t;
    if (!path)
        return ndm__fail(NDM_E_INVALID, api, site, "path is NULL");
    const char *descr = npy_descr(r->dtype);
    if (!descr)
        return ndm__fail(NDM_E_DTYPE, api, site, "no .npy descr for dtype %d", (int)r->dtype);
    /* Room for "{'descr': ..., 'shape': (...), }", 21 characters per size,
     * the padding to 64 bytes and the newline. */
    size_t cap = 128 + 22 * (size_t)r->ndim + 64;
    char *hdr = malloc(cap);
    if (!hdr)
        return ndm__fail(NDM_E_OOM, api, site, "no memory for a .npy header");
    size_t n = (size_t)snprintf(hdr, cap, "{'descr': '%s', 'fortran_order': False, 'shape': (",
                                descr);
    for (int i = 0; i < r->ndim; i++)
        n += (size_t)snprintf(hdr + n, cap - n, "%s%" PRId64, i ? ", " : "", r->shape[i]);
    n += (size_t)snprintf(hdr + n, cap - n, "%s), }", r->ndim == 1 ? "," : "");
    /* numpy pads magic + length + header + '\n' to a multiple of 64. */
    size_t pre = 10;
    size_t total = (pre + n + 1 + 63) / 64 * 64;
    if (total - pre > 65535) { /* version 2.0 has a 4-byte length */
        pre = 12;
        total = (pre + n + 1 + 63) / 64 * 64;
    }
    while (n < total - pre - 1)
        hdr[n++] = ' ';
    hdr[n++] = '\n';
    uint8_t magic[12] = {0x93, 'N', 'U', 'M', 'P', 'Y', pre == 10 ? 1 : 2, 0};
    for (size_t i = 0; i < pre - 8; i++)
        magic[8 + i] = (uint8_t)(n >> (8 * i));
    ndm__out_file out;
    ndm_status st = ndm__out_open(&out, path, api, site);
    if (st == NDM_OK) {
        st = ndm__out_write(&out, magic, pre, api, site);
        if (st == NDM_OK)
            st = ndm__out_write(&out, hdr, n, api, site);
        if (st == NDM_OK)
            st = ndm__io_write_array(out.f, &v, path, api, site);
        if (st == NDM_OK)
            st = ndm__out_commit(&out, api, site);
        else
            ndm__out_abort(&out);
    }
    free(hdr);
    return st;
}
