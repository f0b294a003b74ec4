/* numpy broadcasting: shapes and stride-0 views for kernels. */
#include <inttypes.h>
#include <string.h>

#include "broadcast.h"

int ndm__max_ndim(int n, ndm__array *const *in)
{
    int m = 0;
    for (int i = 0; i < n; i++)
        if (in[i]->ndim > m)
            m = in[i]->ndim;
    return m;
}

ndm_status ndm__broadcast_shape(int n, ndm__array *const *in, int64_t *out, int *out_ndim,
                                const char *api, ndm__site where)
{
    int nd = ndm__max_ndim(n, in);
    for (int j = 0; j < nd; j++)
        out[j] = 1;
    for (int i = 0; i < n; i++) {
        int lead = nd - in[i]->ndim;
        for (int j = 0; j < in[i]->ndim; j++) {
            int64_t s = in[i]->shape[j];
            int64_t *o = &out[lead + j];
            if (s == *o || s == 1)
                continue;
            if (*o == 1) {
                *o = s;
                continue;
            }
            char d1[160], d2[160];
            /* name the first operand that disagrees with this one */
            int k = 0;
            while (k < i && !(in[k]->ndim > (nd - lead - j - 1) &&
                              in[k]->shape[in[k]->ndim - (nd - lead - j)] == *o))
                k++;
            return ndm__fail(NDM_E_SHAPE, api, where,
                             "shapes %s and %s do not broadcast (axis %d: %" PRId64
                             " against %" PRId64 ")",
                             ndm__array_desc(in[k < i ? k : 0], d1, sizeof d1),
                             ndm__array_desc(in[i], d2, sizeof d2), lead + j - nd, *o, s);
        }
    }
    *out_ndim = nd;
    return NDM_OK;
}

void ndm__broadcast_strides(const ndm__array *r, int ndim, const int64_t *shape, int64_t *strides)
{
    int lead = ndim - r->ndim;
    for (int j = 0; j < ndim; j++) {
        if (j < lead)
            strides[j] = 0;
        else
            strides[j] = (r->shape[j - lead] == 1 && shape[j] != 1) ? 0 : r->strides[j - lead];
    }
}
