/* Reference index kernels: one element at a time over C-order coordinates,
 * written to be obviously right. They are the oracle for the fast kernels. */
#include <string.h>

#include "convert.h"
#include "index_cpu.h"

static int64_t dot(int nd, const int64_t *c, const int64_t *strides)
{
    int64_t o = 0;
    for (int d = 0; d < nd; d++)
        o += c[d] * strides[d];
    return o;
}

static char *at(const ndm__tensor *t, int64_t off)
{
    return (char *)t->data + off * (int64_t)ndm_dtype_size(t->dtype);
}

/* The element of t at coordinates c. */
static char *elem(const ndm__tensor *t, const int64_t *c)
{
    return at(t, dot(t->ndim, c, t->strides));
}

/* The index at coordinates c of idx; a negative one counts back from n. */
static inline int64_t index_at(const ndm__tensor *idx, const int64_t *c, int64_t n)
{
    int64_t v = ndm__idx_at(idx, dot(idx->ndim, c, idx->strides));
    return v < 0 ? v + n : v;
}

/* A walk over the C-order coordinates of a tensor's elements:
 *     for (int64_t *c = walk_first(&w, t); c; c = walk_next(&w)) ...
 *     return walk_end(&w);
 * walk_first gives NULL when t is empty or memory is short (walk_end then
 * returns NDM_OK or NDM_E_OOM); a loop may break off. */
typedef struct walk {
    ndm__coords cs;
    int nd;
    const int64_t *shape;
    ndm_status st;
} walk;

static int64_t *walk_first(walk *w, const ndm__tensor *t)
{
    w->nd = t->ndim;
    w->shape = t->shape;
    w->st = NDM_OK;
    w->cs.c = w->cs.small;
    if (ndm__numel_t(t) == 0)
        return NULL;
    int64_t *c = ndm__coords_get(&w->cs, (size_t)t->ndim);
    if (!c)
        w->st = NDM_E_OOM;
    return c;
}

static int64_t *walk_next(walk *w)
{
    return ndm__odo_next(w->nd, w->shape, w->cs.c) ? w->cs.c : NULL;
}

static ndm_status walk_end(walk *w)
{
    ndm__coords_put(&w->cs);
    return w->st;
}

ndm_status ndm__ref_find_outside(int device, const ndm__tensor *idx, int64_t lo, int64_t hi,
                                 int64_t *pos, int64_t *value)
{
    (void)device;
    *pos = -1;
    walk w;
    int64_t i = 0;
    for (int64_t *c = walk_first(&w, idx); c; c = walk_next(&w), i++) {
        int64_t v = ndm__idx_at(idx, dot(idx->ndim, c, idx->strides));
        if (v < lo || v >= hi) {
            *pos = i;
            *value = v;
            break;
        }
    }
    return walk_end(&w);
}

ndm_status ndm__ref_take(int device, const ndm__tensor *dst, const ndm__tensor *src, int axis,
                         const ndm__tensor *idx)
{
    (void)device;
    size_t es = ndm_dtype_size(dst->dtype);
    int k = idx->ndim;
    int64_t n = src->shape[axis];
    walk w;
    for (int64_t *c = walk_first(&w, dst); c; c = walk_next(&w)) {
        int64_t so = index_at(idx, c + axis, n) * src->strides[axis];
        for (int d = 0; d < axis; d++)
            so += c[d] * src->strides[d];
        for (int d = axis + 1; d < src->ndim; d++)
            so += c[d + k - 1] * src->strides[d];
        memcpy(elem(dst, c), at(src, so), es);
    }
    return walk_end(&w);
}

ndm_status ndm__ref_gather(int device, const ndm__tensor *dst, const ndm__tensor *src, int axis,
                           const ndm__tensor *idx)
{
    (void)device;
    size_t es = ndm_dtype_size(dst->dtype);
    int64_t n = src->shape[axis];
    walk w;
    for (int64_t *c = walk_first(&w, dst); c; c = walk_next(&w)) {
        int64_t v = index_at(idx, c, n);
        int64_t so = dot(src->ndim, c, src->strides) + (v - c[axis]) * src->strides[axis];
        memcpy(elem(dst, c), at(src, so), es);
    }
    return walk_end(&w);
}

/* *d += *s in dtype t: integers wrap, bool is "or", f16 and bf16 add in f32. */
static void add_to(ndm_dtype t, char *d, const char *s)
{
    switch (t) {
    case NDM_BOOL:
        *(uint8_t *)d = (uint8_t)(*(uint8_t *)d | *(const uint8_t *)s);
        break;
    case NDM_U8:
        *(uint8_t *)d = (uint8_t)(*(uint8_t *)d + *(const uint8_t *)s);
        break;
    case NDM_I32:
        *(int32_t *)d = (int32_t)((uint32_t) * (int32_t *)d + (uint32_t) * (const int32_t *)s);
        break;
    case NDM_I64:
        *(int64_t *)d = (int64_t)((uint64_t) * (int64_t *)d + (uint64_t) * (const int64_t *)s);
        break;
    case NDM_F16:
        *(uint16_t *)d = ndm_f32_to_f16(ndm_f16_to_f32(*(uint16_t *)d) +
                                        ndm_f16_to_f32(*(const uint16_t *)s));
        break;
    case NDM_BF16:
        *(uint16_t *)d = ndm_f32_to_bf16(ndm_bf16_to_f32(*(uint16_t *)d) +
                                         ndm_bf16_to_f32(*(const uint16_t *)s));
        break;
    case NDM_F32:
        *(float *)d += *(const float *)s;
        break;
    case NDM_F64:
        *(double *)d += *(const double *)s;
        break;
    }
}

ndm_status ndm__ref_scatter_add(int device, const ndm__tensor *dst, int axis,
                                const ndm__tensor *idx, const ndm__tensor *src)
{
    (void)device;
    int64_t n = dst->shape[axis];
    walk w;
    for (int64_t *c = walk_first(&w, idx); c; c = walk_next(&w)) {
        int64_t v = index_at(idx, c, n);
        int64_t doff = dot(dst->ndim, c, dst->strides) + (v - c[axis]) * dst->strides[axis];
        add_to(dst->dtype, at(dst, doff), elem(src, c));
    }
    return walk_end(&w);
}

ndm_status ndm__ref_one_hot(int device, const ndm__tensor *dst, const ndm__tensor *idx)
{
    (void)device;
    int last = dst->ndim - 1;
    walk w;
    for (int64_t *c = walk_first(&w, dst); c; c = walk_next(&w)) {
        int64_t v = ndm__idx_at(idx, dot(idx->ndim, c, idx->strides));
        ndm__cpu_store_f64(dst->dtype, elem(dst, c), c[last] == v ? 1 : 0);
    }
    return walk_end(&w);
}

ndm_status ndm__ref_pad(int device, const ndm__tensor *dst, const ndm__tensor *src,
                        const int64_t *before, ndm_pad_mode mode, double value)
{
    (void)device;
    size_t es = ndm_dtype_size(dst->dtype);
    walk w;
    for (int64_t *c = walk_first(&w, dst); c; c = walk_next(&w)) {
        int64_t so = 0;
        bool inside = true;
        for (int d = 0; d < dst->ndim && inside; d++) {
            int64_t x = ndm__pad_source(c[d] - before[d], src->shape[d], mode);
            inside = x >= 0;
            so += x * src->strides[d];
        }
        char *p = elem(dst, c);
        if (inside)
            memcpy(p, at(src, so), es);
        else
            ndm__cpu_store_f64(dst->dtype, p, value);
    }
    return walk_end(&w);
}

/* Running sums (prod false) or products along axis, one line at a time. */
static ndm_status cumulate(const ndm__tensor *dst, const ndm__tensor *src, int axis, bool prod)
{
    if (ndm__numel_t(dst) == 0)
        return NDM_OK;
    ndm__coords cs;
    /* c walks the lines (axis held at 0); shape is dst's with the axis 1. */
    int64_t *c = ndm__coords_get(&cs, 2 * (size_t)dst->ndim);
    if (!c)
        return NDM_E_OOM;
    int64_t *lines = c + dst->ndim;
    for (int d = 0; d < dst->ndim; d++)
        lines[d] = d == axis ? 1 : dst->shape[d];
    int64_t n = dst->shape[axis];
    do {
        char *d0 = elem(dst, c);
        const char *s0 = elem(src, c);
        int64_t ds = dst->strides[axis] * (int64_t)ndm_dtype_size(dst->dtype);
        int64_t ss = src->strides[axis] * (int64_t)ndm_dtype_size(src->dtype);
        /* integers wrap: unsigned arithmetic, read back as int64 */
        uint64_t iacc = prod ? 1 : 0;
        float facc = prod ? 1 : 0;
        double dacc = prod ? 1 : 0;
        for (int64_t k = 0; k < n; k++) {
            const char *s = s0 + k * ss;
            char *d = d0 + k * ds;
            uint64_t iv = 0;
            float fv = 0;
            switch (src->dtype) {
            case NDM_BOOL:
            case NDM_U8:
                iv = *(const uint8_t *)s;
                break;
            case NDM_I32:
                iv = (uint64_t)(int64_t) * (const int32_t *)s;
                break;
            case NDM_I64:
                iv = (uint64_t) * (const int64_t *)s;
                break;
            case NDM_F16:
                fv = ndm_f16_to_f32(*(const uint16_t *)s);
                facc = prod ? facc * fv : facc + fv;
                *(uint16_t *)d = ndm_f32_to_f16(facc);
                continue;
            case NDM_BF16:
                fv = ndm_bf16_to_f32(*(const uint16_t *)s);
                facc = prod ? facc * fv : facc + fv;
                *(uint16_t *)d = ndm_f32_to_bf16(facc);
                continue;
            case NDM_F32:
                fv = *(const float *)s;
                facc = prod ? facc * fv : facc + fv;
                *(float *)d = facc;
                continue;
            case NDM_F64: {
                double dv = *(const double *)s;
                dacc = prod ? dacc * dv : dacc + dv;
                *(double *)d = dacc;
                continue;
            }
            }
            iacc = prod ? iacc * iv : iacc + iv;
            *(int64_t *)d = (int64_t)iacc;
        }
    } while (ndm__odo_next(dst->ndim, lines, c));
    ndm__coords_put(&cs);
    return NDM_OK;
}

ndm_status ndm__ref_cumsum(int device, const ndm__tensor *dst, const ndm__tensor *src, int axis)
{
    (void)device;
    return cumulate(dst, src, axis, false);
}

ndm_status ndm__ref_cumprod(int device, const ndm__tensor *dst, const ndm__tensor *src, int axis)
{
    (void)device;
    return cumulate(dst, src, axis, true);
}

ndm_status ndm__ref_nonzero(int device, const ndm__tensor *dst, const ndm__tensor *src,
                            int64_t *count)
{
    (void)device;
    int64_t *out = dst ? (int64_t *)dst->data : NULL;
    int64_t found = 0, pos = 0;
    size_t es = ndm_dtype_size(src->dtype);
    walk w;
    for (int64_t *c = walk_first(&w, src); c; c = walk_next(&w), pos++) {
        if (!ndm__cpu_is_zero(src->dtype, elem(src, c), es)) {
            if (out)
                out[found] = pos;
            found++;
        }
    }
    if (!dst)
        *count = found;
    return walk_end(&w);
}

const struct ndm__backend_index ndm__cpu_ref_index = {
    .copy = ndm__cpu_copy,
    .find_outside = ndm__ref_find_outside,
    .take = ndm__ref_take,
    .gather = ndm__ref_gather,
    .scatter_add = ndm__ref_scatter_add,
    .one_hot = ndm__ref_one_hot,
    .pad = ndm__ref_pad,
    .cumsum = ndm__ref_cumsum,
    .cumprod = ndm__ref_cumprod,
    .nonzero = ndm__ref_nonzero,
    .tri = ndm__cpu_tri,
    .sort = ndm__cpu_sort,
};
