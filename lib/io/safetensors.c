/* safetensors: load (copied or mapped) and save. The header is checked in
 * full, against the size of the data buffer, before any array is made. */
#include <errno.h>
#include <inttypes.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "../base/checked.h"
#include "../base/text.h"
#include "io.h"
#include "json.h"

/* The reference implementation refuses headers above 100 MB; so do we, so
 * a hostile length cannot make us read or allocate more than that. */
#define MAX_HEADER ((uint64_t)100000000)

static const struct {
    const char *name;
    ndm_dtype dtype;
} st_dtypes[] = {
    {"F64", NDM_F64}, {"F32", NDM_F32}, {"F16", NDM_F16}, {"BF16", NDM_BF16},
    {"I64", NDM_I64}, {"I32", NDM_I32}, {"U8", NDM_U8},   {"BOOL", NDM_BOOL},
};
#define N_DTYPES (sizeof st_dtypes / sizeof st_dtypes[0])

static const char *st_dtype_name(ndm_dtype t)
{
    for (size_t i = 0; i < N_DTYPES; i++)
        if (st_dtypes[i].dtype == t)
            return st_dtypes[i].name;
    return NULL;
}

/* ---- the parsed header ------------------------------------------------------- */

typedef struct entry {
    size_t name;       /* pool offset */
    ndm_dtype dtype;
    int ndim;
    size_t dims;       /* index of the first size in header.dims */
    uint64_t begin, end;
    bool have_dtype, have_shape, have_offsets;
} entry;

typedef struct header {
    char *pool;
    size_t pool_used;
    entry *e;
    size_t n, cap;
    int64_t *dims;
    size_t ndims, dims_cap;
    size_t *meta;      /* key, value pool offsets */
    size_t nmeta, meta_cap;
    bool have_meta;
} header;

static void header_free(header *h)
{
    free(h->pool);
    free(h->e);
    free(h->dims);
    free(h->meta);
    memset(h, 0, sizeof *h);
}

/* Grow a vector to hold one more item; the counts are bounded by the
 * header's length, so doubling cannot overflow. */
static bool grow(void **p, size_t *cap, size_t need, size_t item)
{
    if (need <= *cap)
        return true;
    size_t c = *cap ? *cap * 2 : 16;
    while (c < need)
        c *= 2;
    void *q = realloc(*p, c * item);
    if (!q)
        return false;
    *p = q;
    *cap = c;
    return true;
}

typedef struct parse_ctx {
    ndm__json j;
    header *h;
    const char *src;
    const char *api;
    ndm__site where;
} parse_ctx;

static ndm_status bad(parse_ctx *c)
{
    return ndm__fail(NDM_E_FORMAT, c->api, c->where, "'%s': bad safetensors header: %s", c->src,
                     c->j.msg);
}

static ndm_status oom(parse_ctx *c)
{
    return ndm__fail(NDM_E_OOM, c->api, c->where, "'%s': no memory for the header", c->src);
}

static ndm_status parse_metadata(parse_ctx *c)
{
    header *h = c->h;
    if (h->have_meta)
        return ndm__fail(NDM_E_FORMAT, c->api, c->where,
                         "'%s': bad safetensors header: __metadata__ appears twice", c->src);
    h->have_meta = true;
    if (ndm__json_take(&c->j, 'n')) {
        c->j.p--;
        return ndm__json_skip(&c->j) ? NDM_OK : bad(c); /* null: no metadata */
    }
    if (!ndm__json_expect(&c->j, '{', "__metadata__ must be an object of strings"))
        return bad(c);
    if (ndm__json_take(&c->j, '}'))
        return NDM_OK;
    do {
        size_t k, v, len;
        if (!ndm__json_string(&c->j, &k, &len) || !ndm__json_expect(&c->j, ':', "expected ':'"))
            return bad(c);
        if (!ndm__json_string(&c->j, &v, &len))
            return ndm__fail(NDM_E_FORMAT, c->api, c->where,
                             "'%s': bad safetensors header: the __metadata__ value of '%s' is "
                             "not a string (%s)",
                             c->src, h->pool + k, c->j.msg);
        if (!grow((void **)&h->meta, &h->meta_cap, 2 * h->nmeta + 2, sizeof *h->meta))
            return oom(c);
        h->meta[2 * h->nmeta] = k;
        h->meta[2 * h->nmeta + 1] = v;
        h->nmeta++;
    } while (ndm__json_take(&c->j, ','));
    return ndm__json_expect(&c->j, '}', "expected ',' or '}' in __metadata__") ? NDM_OK : bad(c);
}

static ndm_status parse_uint(parse_ctx *c, uint64_t *v, const char *name, const char *field)
{
    bool over;
    if (!ndm__json_uint(&c->j, v, &over))
        return bad(c);
    if (over || *v > (uint64_t)INT64_MAX)
        return ndm__fail(NDM_E_OVERFLOW, c->api, c->where,
                         "'%s': tensor '%s': a %s value does not fit in 63 bits", c->src, name,
                         field);
    return NDM_OK;
}

static ndm_status parse_tensor(parse_ctx *c, entry *e)
{
    header *h = c->h;
    const char *name = h->pool + e->name;
    if (!ndm__json_expect(&c->j, '{', "a tensor entry must be an object"))
        return bad(c);
    if (ndm__json_take(&c->j, '}'))
        goto check;
    do {
        size_t k, len;
        if (!ndm__json_string(&c->j, &k, &len) || !ndm__json_expect(&c->j, ':', "expected ':'"))
            return bad(c);
        const char *key = h->pool + k;
        bool *seen = !strcmp(key, "dtype")          ? &e->have_dtype
                     : !strcmp(key, "shape")        ? &e->have_shape
                     : !strcmp(key, "data_offsets") ? &e->have_offsets
                                                    : NULL;
        if (seen && *seen)
            return ndm__fail(NDM_E_FORMAT, c->api, c->where,
                             "'%s': bad safetensors header: tensor '%s' has '%s' twice", c->src,
                             name, key);
        if (seen)
            *seen = true;
        /* The key is not needed once matched: give its pool bytes back. */
        h->pool_used = c->j.pool_used = k;
        if (seen == &e->have_dtype) {
            size_t v;
            if (!ndm__json_string(&c->j, &v, &len))
                return bad(c);
            const char *dt = h->pool + v;
            size_t i = 0;
            while (i < N_DTYPES && strcmp(st_dtypes[i].name, dt))
                i++;
            if (i == N_DTYPES)
                return ndm__fail(NDM_E_DTYPE, c->api, c->where,
                                 "'%s': tensor '%s' has dtype '%.32s', which ndm does not "
                                 "support (F64 F32 F16 BF16 I64 I32 U8 BOOL)",
                                 c->src, name, dt);
            e->dtype = st_dtypes[i].dtype;
            h->pool_used = c->j.pool_used = v;
        } else if (seen == &e->have_shape) {
            if (!ndm__json_expect(&c->j, '[', "a shape must be a list of sizes"))
                return bad(c);
            e->dims = h->ndims;
            e->ndim = 0;
            if (!ndm__json_take(&c->j, ']')) {
                do {
                    uint64_t d;
                    ndm_status st = parse_uint(c, &d, name, "shape");
                    if (st < 0)
                        return st;
                    if (e->ndim == INT32_MAX)
                        return ndm__fail(NDM_E_FORMAT, c->api, c->where,
                                         "'%s': tensor '%s' has too many axes", c->src, name);
                    if (!grow((void **)&h->dims, &h->dims_cap, h->ndims + 1, sizeof *h->dims))
                        return oom(c);
                    h->dims[h->ndims++] = (int64_t)d;
                    e->ndim++;
                } while (ndm__json_take(&c->j, ','));
                if (!ndm__json_expect(&c->j, ']', "expected ',' or ']' in a shape"))
                    return bad(c);
            }
        } else if (seen == &e->have_offsets) {
            ndm_status st;
            if (!ndm__json_expect(&c->j, '[', "data_offsets must be a list [begin, end]"))
                return bad(c);
            if ((st = parse_uint(c, &e->begin, name, "data_offsets")) < 0)
                return st;
            if (!ndm__json_expect(&c->j, ',', "data_offsets must be a list [begin, end]"))
                return bad(c);
            if ((st = parse_uint(c, &e->end, name, "data_offsets")) < 0)
                return st;
            if (!ndm__json_expect(&c->j, ']', "data_offsets must have two entries"))
                return bad(c);
        } else if (!ndm__json_skip(&c->j)) {
            /* Unknown fields are ignored, as the reference implementation does. */
            return bad(c);
        }
    } while (ndm__json_take(&c->j, ','));
    if (!ndm__json_expect(&c->j, '}', "expected ',' or '}' in a tensor entry"))
        return bad(c);
check:
    if (!e->have_dtype || !e->have_shape || !e->have_offsets)
        return ndm__fail(NDM_E_FORMAT, c->api, c->where,
                         "'%s': bad safetensors header: tensor '%s' lacks '%s'", c->src, name,
                         !e->have_dtype ? "dtype" : !e->have_shape ? "shape" : "data_offsets");
    return NDM_OK;
}

/* Sorting helpers: qsort has no context argument, so the pool and the
 * entries are reached through a thread-local pointer. */
static _Thread_local const header *sort_h;

static int by_name(const void *a, const void *b)
{
    const entry *x = &sort_h->e[*(const size_t *)a], *y = &sort_h->e[*(const size_t *)b];
    return strcmp(sort_h->pool + x->name, sort_h->pool + y->name);
}

static int by_offset(const void *a, const void *b)
{
    size_t i = *(const size_t *)a, k = *(const size_t *)b;
    const entry *x = &sort_h->e[i], *y = &sort_h->e[k];
    if (x->begin != y->begin)
        return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end)
        return x->end < y->end ? -1 : 1;
    return i < k ? -1 : i > k;
}

static int by_meta_key(const void *a, const void *b)
{
    return strcmp(sort_h->pool + sort_h->meta[2 * *(const size_t *)a],
                  sort_h->pool + sort_h->meta[2 * *(const size_t *)b]);
}

/* Sizes, offsets, duplicates and the tiling of the data buffer. *order gets
 * the entries by offset (the order their data comes in). */
static ndm_status validate(parse_ctx *c, uint64_t data_len, size_t **order)
{
    header *h = c->h;
    char desc[160];
    for (size_t i = 0; i < h->n; i++) {
        entry *e = &h->e[i];
        const char *name = h->pool + e->name;
        uint64_t numel = 1, span = 1, isz = ndm_dtype_size(e->dtype);
        int span_axis = -1;
        for (int d = 0; d < e->ndim; d++) {
            uint64_t dim = (uint64_t)h->dims[e->dims + d];
            if (ndm__ckd_mul_u64(&numel, numel, dim) || numel > (uint64_t)INT64_MAX)
                return ndm__fail(NDM_E_OVERFLOW, c->api, c->where,
                                 "'%s': tensor '%s': the element count overflows at axis %d",
                                 c->src, name, d);
            if (dim && span_axis < 0 &&
                (ndm__ckd_mul_u64(&span, span, dim) || span > (uint64_t)INT64_MAX / isz))
                span_axis = d;
        }
        /* An empty tensor's strides multiply its other sizes: they must fit. */
        if (numel == 0 && span_axis >= 0)
            return ndm__fail(NDM_E_OVERFLOW, c->api, c->where,
                             "'%s': tensor '%s': the strides overflow at axis %d", c->src, name,
                             span_axis);
        uint64_t nbytes;
        if (ndm__ckd_mul_u64(&nbytes, numel, (uint64_t)ndm_dtype_size(e->dtype)) ||
            nbytes > (uint64_t)INT64_MAX)
            return ndm__fail(NDM_E_OVERFLOW, c->api, c->where,
                             "'%s': tensor '%s': %" PRIu64 " elements of %s overflow the byte "
                             "count",
                             c->src, name, numel, ndm_dtype_name(e->dtype));
        if (e->end < e->begin)
            return ndm__fail(NDM_E_FORMAT, c->api, c->where,
                             "'%s': tensor '%s' has data_offsets [%" PRIu64 ", %" PRIu64
                             "]: the end is before the beginning",
                             c->src, name, e->begin, e->end);
        if (e->end > data_len)
            return ndm__fail(NDM_E_FORMAT, c->api, c->where,
                             "'%s': tensor '%s' has data_offsets [%" PRIu64 ", %" PRIu64
                             "] beyond the data buffer of %" PRIu64 " bytes",
                             c->src, name, e->begin, e->end, data_len);
        if (e->end - e->begin != nbytes) {
            int64_t zero = 0;
            const int64_t *shape = e->ndim ? h->dims + e->dims : &zero;
            return ndm__fail(NDM_E_FORMAT, c->api, c->where,
                             "'%s': tensor '%s' is %s (%" PRIu64 " bytes) but its data_offsets "
                             "[%" PRIu64 ", %" PRIu64 "] span %" PRIu64 " bytes",
                             c->src, name, ndm__shape_desc(e->dtype, e->ndim, shape, desc, sizeof desc), nbytes,
                             e->begin, e->end, e->end - e->begin);
        }
    }
    size_t *idx = malloc((h->n ? h->n : 1) * sizeof *idx);
    size_t *midx = malloc((h->nmeta ? h->nmeta : 1) * sizeof *midx);
    if (!idx || !midx) {
        free(idx);
        free(midx);
        return oom(c);
    }
    sort_h = h;
    ndm_status st = NDM_OK;
    for (size_t i = 0; i < h->n; i++)
        idx[i] = i;
    qsort(idx, h->n, sizeof *idx, by_name);
    for (size_t i = 1; i < h->n && st == NDM_OK; i++)
        if (!strcmp(h->pool + h->e[idx[i]].name, h->pool + h->e[idx[i - 1]].name))
            st = ndm__fail(NDM_E_FORMAT, c->api, c->where,
                           "'%s': bad safetensors header: tensor '%s' appears twice", c->src,
                           h->pool + h->e[idx[i]].name);
    for (size_t i = 0; i < h->nmeta; i++)
        midx[i] = i;
    qsort(midx, h->nmeta, sizeof *midx, by_meta_key);
    for (size_t i = 1; i < h->nmeta && st == NDM_OK; i++)
        if (!strcmp(h->pool + h->meta[2 * midx[i]], h->pool + h->meta[2 * midx[i - 1]]))
            st = ndm__fail(NDM_E_FORMAT, c->api, c->where,
                           "'%s': bad safetensors header: metadata key '%s' appears twice",
                           c->src, h->pool + h->meta[2 * midx[i]]);
    free(midx);
    if (st == NDM_OK) {
        for (size_t i = 0; i < h->n; i++)
            idx[i] = i;
        qsort(idx, h->n, sizeof *idx, by_offset);
        uint64_t at = 0;
        const entry *prev = NULL;
        for (size_t i = 0; i < h->n && st == NDM_OK; i++) {
            const entry *e = &h->e[idx[i]];
            if (e->begin < at)
                st = ndm__fail(NDM_E_FORMAT, c->api, c->where,
                               "'%s': the data of tensors '%s' [%" PRIu64 ", %" PRIu64
                               ") and '%s' [%" PRIu64 ", %" PRIu64 ") overlap",
                               c->src, h->pool + prev->name, prev->begin, prev->end,
                               h->pool + e->name, e->begin, e->end);
            else if (e->begin > at)
                st = ndm__fail(NDM_E_FORMAT, c->api, c->where,
                               "'%s': bytes [%" PRIu64 ", %" PRIu64
                               ") of the data buffer belong to no tensor",
                               c->src, at, e->begin);
            at = e->end;
            prev = e;
        }
        if (st == NDM_OK && at != data_len)
            st = ndm__fail(NDM_E_FORMAT, c->api, c->where,
                           "'%s': the tensors cover %" PRIu64 " bytes but the data buffer has "
                           "%" PRIu64,
                           c->src, at, data_len);
    }
    sort_h = NULL;
    if (st < 0) {
        free(idx);
        return st;
    }
    *order = idx;
    return NDM_OK;
}

static ndm_status parse(const char *text, size_t n, uint64_t data_len, header *h, size_t **order,
                        const char *src, const char *api, ndm__site where)
{
    memset(h, 0, sizeof *h);
    parse_ctx c = {.h = h, .src = src, .api = api, .where = where};
    if (!ndm__utf8_valid(text, n))
        return ndm__fail(NDM_E_FORMAT, api, where, "'%s': the safetensors header is not UTF-8",
                         src);
    h->pool = malloc(n + 1);
    if (!h->pool)
        return oom(&c);
    ndm__json_init(&c.j, text, n, h->pool, n + 1);
    ndm_status st = NDM_OK;
    if (!ndm__json_expect(&c.j, '{', "the header must be a JSON object"))
        return bad(&c);
    if (!ndm__json_take(&c.j, '}')) {
        do {
            size_t k, len;
            if (!ndm__json_string(&c.j, &k, &len) || !ndm__json_expect(&c.j, ':', "expected ':'"))
                return bad(&c);
            h->pool_used = c.j.pool_used;
            if (!strcmp(h->pool + k, "__metadata__")) {
                h->pool_used = c.j.pool_used = k;
                st = parse_metadata(&c);
            } else {
                if (!grow((void **)&h->e, &h->cap, h->n + 1, sizeof *h->e))
                    return oom(&c);
                entry *e = &h->e[h->n++];
                memset(e, 0, sizeof *e);
                e->name = k;
                st = parse_tensor(&c, e);
            }
            h->pool_used = c.j.pool_used;
            if (st < 0)
                return st;
        } while (ndm__json_take(&c.j, ','));
        if (!ndm__json_expect(&c.j, '}', "expected ',' or '}' after a tensor entry"))
            return bad(&c);
    }
    if (!ndm__json_at_end(&c.j))
        return ndm__fail(NDM_E_FORMAT, api, where,
                         "'%s': bad safetensors header: text after the object at byte %zu", src,
                         ndm__json_pos(&c.j));
    return validate(&c, data_len, order);
}

/* ---- building the result ------------------------------------------------------ */

/* One block holds the struct, the arrays, the string pointers and the
 * strings, so one free releases it. */
static ndm_named_arrays *result_new(const header *h)
{
    size_t ptrs = h->n + 2 * h->nmeta;
    size_t size = sizeof(ndm_named_arrays) + h->n * sizeof(ndm_array) + ptrs * sizeof(char *) +
                  h->pool_used;
    char *blk = calloc(1, size);
    if (!blk)
        return NULL;
    ndm_named_arrays *set = (ndm_named_arrays *)blk;
    ndm_array *arrays = (ndm_array *)(set + 1);
    const char **p = (const char **)(arrays + h->n);
    char *pool = (char *)(p + ptrs);
    memcpy(pool, h->pool, h->pool_used);
    for (size_t i = 0; i < h->n; i++)
        p[i] = pool + h->e[i].name;
    for (size_t i = 0; i < h->nmeta; i++) {
        p[h->n + i] = pool + h->meta[2 * i];
        p[h->n + h->nmeta + i] = pool + h->meta[2 * i + 1];
    }
    set->count = h->n;
    set->names = p;
    set->arrays = arrays;
    set->meta_count = h->nmeta;
    set->meta_keys = p + h->n;
    set->meta_values = p + h->n + h->nmeta;
    return set;
}

/* A mapping shared by the arrays that view it; unmapped with the last. */
typedef struct mapping {
    atomic_uint refs;
    void *base;
    size_t len;
} mapping;

static void mapping_unref(void *data, void *ud)
{
    (void)data;
    mapping *mp = ud;
    if (atomic_fetch_sub_explicit(&mp->refs, 1, memory_order_acq_rel) == 1) {
        munmap(mp->base, mp->len);
        free(mp);
    }
}

typedef struct load_ctx {
    ndm__site site;
    const char *api;
    ndm_manager m;
    const char *name;      /* path or "<buffer>" */
    ndm__src *src;         /* positioned at the data buffer (file copies) */
    const uint8_t *data;   /* the data buffer in memory (buffers and mappings) */
    mapping *map;
} load_ctx;

static ndm_status make_array(load_ctx *c, const header *h, const entry *e, ndm_array *out)
{
    const int64_t *shape = h->dims + e->dims;
    size_t isz = ndm_dtype_size(e->dtype);
    if (c->map) {
        const uint8_t *p = c->data + e->begin;
        bool aligned = ((uintptr_t)p % isz) == 0;
        if (aligned && (ndm__host_little_endian() || isz == 1)) {
            atomic_fetch_add_explicit(&c->map->refs, 1, memory_order_relaxed);
            *out = ndm__array_wrap(c->site, c->api, c->m, e->dtype, e->ndim, shape, (void *)p,
                                   mapping_unref, c->map);
            if (!out->id) {
                atomic_fetch_sub_explicit(&c->map->refs, 1, memory_order_relaxed);
                return ndm_last_status();
            }
            return NDM_OK;
        }
    }
    ndm__view r;
    ndm_array a = ndm__array_make(c->site, c->api, c->m, NULL, e->dtype, e->ndim, shape, &r);
    if (!a.id)
        return ndm_last_status();
    bool swap = !ndm__host_little_endian() && isz > 1;
    ndm_status st;
    if (c->data) {
        st = ndm__io_fill_array_mem(&r, c->data + e->begin, swap, c->api, c->site);
    } else {
        char what[96];
        snprintf(what, sizeof what, "tensor '%.64s'", h->pool + e->name);
        st = ndm__io_fill_array(&r, c->src, swap, what, c->api, c->site);
    }
    if (st < 0) {
        ndm__discard(a);
        return st;
    }
    *out = a;
    return NDM_OK;
}

static void free_set(void *p) { free(p); }

static const ndm_named_arrays *build(load_ctx *c, header *h, const size_t *order)
{
    ndm_named_arrays *set = result_new(h);
    if (!set) {
        ndm__fail(NDM_E_OOM, c->api, c->site, "'%s': no memory for the names", c->name);
        return NULL;
    }
    ndm_array *arrays = (ndm_array *)set->arrays;
    ndm_status st = NDM_OK;
    /* In data order, so a file is read front to back. */
    for (size_t i = 0; i < h->n && st == NDM_OK; i++)
        st = make_array(c, h, &h->e[order[i]], &arrays[order[i]]);
    if (st == NDM_OK) {
        char what[96];
        snprintf(what, sizeof what, "safetensors '%.80s'", c->name);
        st = ndm_manager_own_at(NDM__SITE_ARGS(c->site), c->m, set, free_set, what);
    }
    if (st < 0) {
        for (size_t i = h->n; i-- > 0;)
            ndm__discard(arrays[i]);
        free(set);
        return NULL;
    }
    return set;
}

static ndm_status read_prefix(const uint8_t *p, uint64_t size, uint64_t *hlen, const char *name,
                              const char *api, ndm__site where)
{
    if (size < 8)
        return ndm__fail(NDM_E_FORMAT, api, where,
                         "'%s' has %" PRIu64 " bytes: too short for the 8-byte header length",
                         name, size);
    *hlen = ndm__load_le64(p);
    if (*hlen > size - 8)
        return ndm__fail(NDM_E_FORMAT, api, where,
                         "'%s': the header length %" PRIu64 " exceeds the %" PRIu64
                         " bytes that follow it",
                         name, *hlen, size - 8);
    if (*hlen > MAX_HEADER)
        return ndm__fail(NDM_E_FORMAT, api, where,
                         "'%s': the header length %" PRIu64 " exceeds the limit of %" PRIu64
                         " bytes",
                         name, *hlen, MAX_HEADER);
    if (*hlen < 2)
        return ndm__fail(NDM_E_FORMAT, api, where,
                         "'%s': the header length %" PRIu64 " is too short for a JSON object",
                         name, *hlen);
    return NDM_OK;
}

NDM_API const ndm_named_arrays *ndm_safetensors_load_buffer_at(NDM_SITE_PARAMS, ndm_manager m,
                                                               const void *data, size_t len)
{
    ndm__site site = NDM__SITE;
    const char *api = __func__;
    m = ndm__io_manager(m, api, site);
    if (!m.id)
        return NULL;
    if (!data && len) {
        ndm__fail(NDM_E_INVALID, api, site, "data is NULL for %zu bytes", len);
        return NULL;
    }
    const uint8_t *p = data;
    uint64_t hlen;
    if (read_prefix(p, len, &hlen, "<buffer>", api, site) < 0)
        return NULL;
    header h;
    size_t *order = NULL;
    const ndm_named_arrays *set = NULL;
    if (parse((const char *)p + 8, hlen, len - 8 - hlen, &h, &order, "<buffer>", api, site) ==
        NDM_OK) {
        load_ctx c = {site, api, m, "<buffer>", NULL, p + 8 + hlen, NULL};
        set = build(&c, &h, order);
    }
    free(order);
    header_free(&h);
    return set;
}

NDM_API const ndm_named_arrays *ndm_safetensors_load_at(NDM_SITE_PARAMS, ndm_manager m,
                                                        const char *path, unsigned flags)
{
    ndm__site site = NDM__SITE;
    const char *api = __func__;
    if (flags > NDM_LOAD_MMAP_COW) {
        ndm__fail(NDM_E_INVALID, api, site, "unknown load flags 0x%x", flags);
        return NULL;
    }
    m = ndm__io_manager(m, api, site);
    if (!m.id)
        return NULL;
    if (flags != NDM_LOAD_COPY && ndm_manager_device(m).type != NDM_DEVICE_CPU) {
        ndm__fail(NDM_E_DEVICE, api, site,
                  "a mapped file can only back arrays of a CPU manager; load with "
                  "NDM_LOAD_COPY");
        return NULL;
    }
    ndm__src src;
    if (ndm__src_open_file(&src, path, false, api, site) < 0)
        return NULL;
    uint8_t prefix[8] = {0};
    uint64_t hlen = 0;
    size_t got = 0;
    char *text = NULL;
    header h = {0};
    size_t *order = NULL;
    mapping *map = NULL;
    const ndm_named_arrays *set = NULL;
    if (ndm__src_read(&src, prefix, 8, &got, api, site) < 0 ||
        read_prefix(prefix, src.size, &hlen, path, api, site) < 0)
        goto done;
    if (!(text = malloc(hlen))) {
        ndm__fail(NDM_E_OOM, api, site, "'%s': no memory for a header of %" PRIu64 " bytes",
                  path, hlen);
        goto done;
    }
    if (ndm__src_read_exact(&src, text, hlen, "the header", api, site) < 0 ||
        parse(text, hlen, src.size - 8 - hlen, &h, &order, path, api, site) < 0)
        goto done;
    load_ctx c = {site, api, m, path, &src, NULL, NULL};
    if (flags != NDM_LOAD_COPY) {
        map = calloc(1, sizeof *map);
        if (!map) {
            ndm__fail(NDM_E_OOM, api, site, "no memory for a mapping record");
            goto done;
        }
        int prot = flags == NDM_LOAD_MMAP ? PROT_READ : PROT_READ | PROT_WRITE;
        int mflags = flags == NDM_LOAD_MMAP ? MAP_SHARED : MAP_PRIVATE;
        void *base = mmap(NULL, src.size, prot, mflags, src.fd, 0);
        if (base == MAP_FAILED) {
            ndm__io_errno(errno, path, "map", api, site);
            free(map);
            map = NULL;
            goto done;
        }
        atomic_init(&map->refs, 1); /* ours, dropped below */
        map->base = base;
        map->len = src.size;
        c.map = map;
        c.data = (const uint8_t *)base + 8 + hlen;
    }
    set = build(&c, &h, order);
done:
    if (map)
        mapping_unref(NULL, map);
    free(order);
    header_free(&h);
    free(text);
    ndm__src_close(&src);
    return set;
}

/* ---- lookups -------------------------------------------------------------------- */

NDM_API int64_t ndm_named_arrays_find(const ndm_named_arrays *set, const char *name)
{
    if (!set || !name) {
        ndm__fail(NDM_E_INVALID, __func__, NDM__NO_SITE, "%s is NULL", set ? "name" : "set");
        return -1;
    }
    for (size_t i = 0; i < set->count; i++)
        if (set->names[i] && !strcmp(set->names[i], name))
            return (int64_t)i;
    ndm__fail(NDM_E_INVALID, __func__, NDM__NO_SITE, "no array named '%.200s'", name);
    return -1;
}

NDM_API const char *ndm_named_arrays_meta(const ndm_named_arrays *set, const char *key)
{
    if (!set || !key)
        return NULL;
    for (size_t i = 0; i < set->meta_count; i++)
        if (set->meta_keys[i] && !strcmp(set->meta_keys[i], key))
            return set->meta_values[i];
    return NULL;
}

/* ---- saving ------------------------------------------------------------------------ */

static void sb_fmt(ndm__sbuf *b, const char *fmt, uint64_t v)
{
    char tmp[32];
    int k = snprintf(tmp, sizeof tmp, fmt, v);
    ndm__sbuf_put(b, tmp, (size_t)k);
}

/* A JSON string literal; the text is valid UTF-8 (checked by the caller). */
static void sb_json(ndm__sbuf *b, const char *s)
{
    ndm__sbuf_put(b, "\"", 1);
    for (; *s; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\') {
            char e[2] = {'\\', (char)ch};
            ndm__sbuf_put(b, e, 2);
        } else if (ch < 0x20) {
            char e[8];
            snprintf(e, sizeof e, "\\u%04x", ch);
            ndm__sbuf_put(b, e, 6);
        } else {
            ndm__sbuf_put(b, (const char *)&ch, 1);
        }
    }
    ndm__sbuf_put(b, "\"", 1);
}

static _Thread_local const char *const *sort_names;

static int by_str(const void *a, const void *b)
{
    return strcmp(sort_names[*(const size_t *)a], sort_names[*(const size_t *)b]);
}

/* Names: present, UTF-8, distinct, and not reserved when `tensors`. */
static ndm_status check_names(const char *const *names, size_t n, bool tensors, const char *what,
                              const char *api, ndm__site where)
{
    for (size_t i = 0; i < n; i++) {
        if (!names[i])
            return ndm__fail(NDM_E_INVALID, api, where, "%s %zu is NULL", what, i);
        if (!ndm__utf8_valid(names[i], strlen(names[i])))
            return ndm__fail(NDM_E_INVALID, api, where, "%s %zu is not valid UTF-8", what, i);
        if (tensors && !strcmp(names[i], "__metadata__"))
            return ndm__fail(NDM_E_INVALID, api, where,
                             "'__metadata__' is reserved and cannot name an array");
    }
    if (n < 2)
        return NDM_OK;
    size_t *idx = malloc(n * sizeof *idx);
    if (!idx)
        return ndm__fail(NDM_E_OOM, api, where, "no memory");
    for (size_t i = 0; i < n; i++)
        idx[i] = i;
    sort_names = names;
    qsort(idx, n, sizeof *idx, by_str);
    sort_names = NULL;
    ndm_status st = NDM_OK;
    for (size_t i = 1; i < n && st == NDM_OK; i++)
        if (!strcmp(names[idx[i]], names[idx[i - 1]]))
            st = ndm__fail(NDM_E_INVALID, api, where, "%s '%.200s' appears twice", what,
                           names[idx[i]]);
    free(idx);
    return st;
}

static _Thread_local ndm__view *sort_recs;

/* Larger elements first, then the caller's order: every tensor stays
 * aligned to its element size in the file. */
static int by_itemsize(const void *a, const void *b)
{
    size_t i = *(const size_t *)a, k = *(const size_t *)b;
    size_t x = ndm_dtype_size(sort_recs[i].t.dtype), y = ndm_dtype_size(sort_recs[k].t.dtype);
    if (x != y)
        return x > y ? -1 : 1;
    return i < k ? -1 : i > k;
}

NDM_API ndm_status ndm_safetensors_save_at(NDM_SITE_PARAMS, const char *path,
                                           const ndm_named_arrays *set)
{
    ndm__site site = NDM__SITE;
    const char *api = __func__;
    if (!set || !path)
        return ndm__fail(NDM_E_INVALID, api, site, "%s is NULL", set ? "path" : "set");
    if ((set->count && (!set->names || !set->arrays)) ||
        (set->meta_count && (!set->meta_keys || !set->meta_values)))
        return ndm__fail(NDM_E_INVALID, api, site, "the set has counts but NULL lists");
    ndm_status st = check_names(set->names, set->count, true, "array name", api, site);
    if (st == NDM_OK)
        st = check_names(set->meta_keys, set->meta_count, false, "metadata key", api, site);
    for (size_t i = 0; i < set->meta_count && st == NDM_OK; i++)
        if (!set->meta_values[i] ||
            !ndm__utf8_valid(set->meta_values[i], strlen(set->meta_values[i])))
            st = ndm__fail(NDM_E_INVALID, api, site, "metadata value %zu is NULL or not UTF-8",
                           i);
    if (st < 0)
        return st;
    size_t n = set->count;
    ndm__view *recs = malloc((n ? n : 1) * sizeof *recs);
    size_t *order = malloc((n ? n : 1) * sizeof *order);
    uint64_t *begin = malloc((n ? n : 1) * sizeof *begin);
    ndm__sbuf hb = {0};
    if (!recs || !order || !begin) {
        st = ndm__fail(NDM_E_OOM, api, site, "no memory");
        goto done;
    }
    for (size_t i = 0; i < n; i++) {
        if (!ndm__view_of(set->arrays[i], &recs[i], api, site)) {
            st = ndm_last_status();
            goto done;
        }
        if (!st_dtype_name(recs[i].t.dtype)) {
            st = ndm__fail(NDM_E_DTYPE, api, site, "array '%s' has a dtype safetensors lacks",
                           set->names[i]);
            goto done;
        }
        order[i] = i;
    }
    sort_recs = recs;
    qsort(order, n, sizeof *order, by_itemsize);
    sort_recs = NULL;
    uint64_t at = 0;
    for (size_t i = 0; i < n; i++) {
        begin[order[i]] = at;
        at += recs[order[i]].nbytes;
    }
    ndm__sbuf_put(&hb, "{", 1);
    if (set->meta_count) {
        ndm__sbuf_puts(&hb, "\"__metadata__\":{");
        for (size_t i = 0; i < set->meta_count; i++) {
            if (i)
                ndm__sbuf_put(&hb, ",", 1);
            sb_json(&hb, set->meta_keys[i]);
            ndm__sbuf_put(&hb, ":", 1);
            sb_json(&hb, set->meta_values[i]);
        }
        ndm__sbuf_put(&hb, "}", 1);
    }
    for (size_t i = 0; i < n; i++) {
        const ndm__tensor *r = &recs[i].t;
        uint64_t nbytes = recs[i].nbytes;
        if (i || set->meta_count)
            ndm__sbuf_put(&hb, ",", 1);
        sb_json(&hb, set->names[i]);
        ndm__sbuf_puts(&hb, ":{\"dtype\":\"");
        ndm__sbuf_puts(&hb, st_dtype_name(r->dtype));
        ndm__sbuf_puts(&hb, "\",\"shape\":[");
        for (int d = 0; d < r->ndim; d++)
            sb_fmt(&hb, d ? ",%" PRIu64 : "%" PRIu64, (uint64_t)r->shape[d]);
        sb_fmt(&hb, "],\"data_offsets\":[%" PRIu64, begin[i]);
        sb_fmt(&hb, ",%" PRIu64 "]}", begin[i] + nbytes);
    }
    ndm__sbuf_put(&hb, "}", 1);
    /* Spaces pad the header so the data buffer starts 8-byte aligned. */
    while (!hb.oom && hb.len % 8)
        ndm__sbuf_put(&hb, " ", 1);
    if (hb.oom) {
        st = ndm__fail(NDM_E_OOM, api, site, "no memory for the header");
        goto done;
    }
    ndm__out_file out;
    if ((st = ndm__out_open(&out, path, api, site)) < 0)
        goto done;
    uint8_t prefix[8];
    for (int i = 0; i < 8; i++)
        prefix[i] = (uint8_t)((uint64_t)hb.len >> (8 * i));
    st = ndm__out_write(&out, prefix, 8, api, site);
    if (st == NDM_OK)
        st = ndm__out_write(&out, hb.p, hb.len, api, site);
    for (size_t i = 0; i < n && st == NDM_OK; i++)
        st = ndm__io_write_array(out.f, &recs[order[i]], path, api, site);
    if (st == NDM_OK)
        st = ndm__out_commit(&out, api, site);
    else
        ndm__out_abort(&out);
done:
    free(hb.p);
    free(recs);
    free(order);
    free(begin);
    return st;
}
