/* The CPU's triangles (tril, triu) and stable sort along an axis: one
 * kernel each, in both tables (nothing faster would pay at these sizes). */
#include "index_cpu.h"
#include "sort_cpu.h"

static int64_t offset_of(int nd, const int64_t *c, const int64_t *strides)
{
    int64_t o = 0;
    for (int d = 0; d < nd; d++)
        o += c[d] * strides[d];
    return o;
}

ndm_status ndm__cpu_tri(int device, const ndm__tensor *dst, const ndm__tensor *src, int64_t k,
                        bool upper)
{
    (void)device;
    if (ndm__numel_t(dst) == 0)
        return NDM_OK;
    int nd = dst->ndim;
    size_t es = ndm_dtype_size(dst->dtype);
    ndm__coords cs;
    int64_t *c = ndm__coords_get(&cs, (size_t)nd);
    if (!c)
        return NDM_E_OOM;
    do {
        char *d = (char *)dst->data + offset_of(nd, c, dst->strides) * (int64_t)es;
        if (ndm__tri_keeps(c[nd - 2], c[nd - 1], k, upper))
            memcpy(d, (const char *)src->data + offset_of(nd, c, src->strides) * (int64_t)es, es);
        else
            memset(d, 0, es);
    } while (ndm__odo_next(nd, dst->shape, c));
    ndm__coords_put(&cs);
    return NDM_OK;
}

/* Runs of this many are sorted by insertion before the merges. */
enum { RUN = 16 };

void ndm__cpu_sort_pairs(ndm__sort_pair *a, ndm__sort_pair *tmp, int64_t n)
{
    for (int64_t b = 0; b < n; b += RUN) {
        int64_t e = b + RUN < n ? b + RUN : n;
        for (int64_t i = b + 1; i < e; i++) {
            ndm__sort_pair v = a[i];
            int64_t j = i;
            for (; j > b && ndm__sort_before(v, a[j - 1]); j--)
                a[j] = a[j - 1];
            a[j] = v;
        }
    }
    ndm__sort_pair *from = a, *to = tmp;
    for (int64_t w = RUN; w < n; w *= 2) {
        for (int64_t lo = 0; lo < n; lo += 2 * w) {
            int64_t mid = lo + w < n ? lo + w : n, hi = lo + 2 * w < n ? lo + 2 * w : n;
            int64_t i = lo, j = mid, o = lo;
            while (i < mid && j < hi)
                to[o++] = ndm__sort_before(from[j], from[i]) ? from[j++] : from[i++];
            while (i < mid)
                to[o++] = from[i++];
            while (j < hi)
                to[o++] = from[j++];
        }
        ndm__sort_pair *t = from;
        from = to;
        to = t;
    }
    if (from != a)
        memcpy(a, from, (size_t)n * sizeof *a);
}

ndm_status ndm__cpu_sort(int device, const ndm__tensor *values, const ndm__tensor *indices,
                         const ndm__tensor *src, int axis, bool descending)
{
    (void)device;
    const ndm__tensor *out = values ? values : indices;
    int nd = src->ndim;
    int64_t n = src->shape[axis], m = out->shape[axis];
    if (ndm__numel_t(out) == 0)
        return NDM_OK;
    ndm__coords cs, ls;
    int64_t *c = ndm__coords_get(&cs, (size_t)nd), *lines = ndm__coords_get(&ls, (size_t)nd);
    void *room = NULL;
    ndm_status st = c && lines ? ndm__scratch_alloc(NDM_DEVICE_CPU, 0,
                                                    2 * (size_t)n * sizeof(ndm__sort_pair), &room)
                               : NDM_E_OOM;
    if (st < 0)
        goto done;
    memcpy(lines, src->shape, (size_t)nd * sizeof *lines);
    lines[axis] = 1;
    ndm__sort_pair *p = room, *tmp = p + n;
    size_t es = ndm_dtype_size(src->dtype);
    uint64_t flip = descending ? ~UINT64_C(0) : 0;
    do {
        const char *s = (const char *)src->data + offset_of(nd, c, src->strides) * (int64_t)es;
        for (int64_t i = 0; i < n; i++)
            p[i] = (ndm__sort_pair){ndm__sort_key(s + i * src->strides[axis] * (int64_t)es,
                                                  src->dtype) ^ flip, i};
        ndm__cpu_sort_pairs(p, tmp, n);
        if (values) {
            char *v = (char *)values->data + offset_of(nd, c, values->strides) * (int64_t)es;
            for (int64_t i = 0; i < m; i++)
                memcpy(v + i * values->strides[axis] * (int64_t)es,
                       s + p[i].pos * src->strides[axis] * (int64_t)es, es);
        }
        if (indices) {
            int64_t *x = (int64_t *)indices->data + offset_of(nd, c, indices->strides);
            for (int64_t i = 0; i < m; i++)
                x[i * indices->strides[axis]] = p[i].pos;
        }
    } while (ndm__odo_next(nd, lines, c));
done:
    ndm__scratch_free(NDM_DEVICE_CPU, 0, room);
    if (c)
        ndm__coords_put(&cs);
    if (lines)
        ndm__coords_put(&ls);
    return st;
}
