/* Strided iteration: coalesce, then walk rows with an odometer. */
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "iter.h"

#define SMALL_RANK 16

ndm_status ndm__cpu_iterate(int ndim, const int64_t *shape, int nops, char *const *data,
                            const int64_t *const *strides, const size_t *esize, ndm__row_fn row,
                            void *ctx)
{
    for (int i = 0; i < ndim; i++)
        if (shape[i] == 0)
            return NDM_OK;
    int64_t small[SMALL_RANK * (2 + NDM__ITER_MAX_OPERANDS)];
    int64_t *buf = small;
    if (ndim > SMALL_RANK) {
        buf = malloc(sizeof(int64_t) * (size_t)ndim * (2 + NDM__ITER_MAX_OPERANDS));
        if (!buf)
            return NDM_E_OOM;
    }
    int64_t *sh = buf;
    int64_t *idx = buf + ndim;
    int64_t *st[NDM__ITER_MAX_OPERANDS];
    for (int k = 0; k < nops; k++)
        st[k] = buf + (size_t)(2 + k) * (size_t)ndim;

    /* Drop size-1 axes and merge an axis into the next inner one when every
     * operand steps through both as one. */
    int n = 0;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] == 1)
            continue;
        if (n > 0) {
            bool merge = true;
            for (int k = 0; k < nops; k++)
                if (st[k][n - 1] != strides[k][i] * shape[i]) {
                    merge = false;
                    break;
                }
            if (merge) {
                sh[n - 1] *= shape[i];
                for (int k = 0; k < nops; k++)
                    st[k][n - 1] = strides[k][i];
                continue;
            }
        }
        sh[n] = shape[i];
        for (int k = 0; k < nops; k++)
            st[k][n] = strides[k][i];
        n++;
    }
    char *p[NDM__ITER_MAX_OPERANDS];
    int64_t rs[NDM__ITER_MAX_OPERANDS];
    for (int k = 0; k < nops; k++)
        p[k] = data[k];
    if (n == 0) {
        for (int k = 0; k < nops; k++)
            rs[k] = 1;
        row(ctx, p, rs, 1);
        goto done;
    }
    /* Prefer a unit-stride axis of the first operand as the row. */
    int inner = n - 1;
    if (st[0][inner] != 1)
        for (int i = n - 2; i >= 0; i--)
            if (st[0][i] == 1) {
                int64_t t = sh[i];
                sh[i] = sh[inner];
                sh[inner] = t;
                for (int k = 0; k < nops; k++) {
                    t = st[k][i];
                    st[k][i] = st[k][inner];
                    st[k][inner] = t;
                }
                break;
            }
    for (int k = 0; k < nops; k++)
        rs[k] = st[k][inner];
    int64_t len = sh[inner];
    int outer = n - 1;
    memset(idx, 0, sizeof(int64_t) * (size_t)(outer ? outer : 1));
    for (;;) {
        row(ctx, p, rs, len);
        int d = outer - 1;
        for (; d >= 0; d--) {
            idx[d]++;
            for (int k = 0; k < nops; k++)
                p[k] += st[k][d] * (int64_t)esize[k];
            if (idx[d] < sh[d])
                break;
            for (int k = 0; k < nops; k++)
                p[k] -= st[k][d] * sh[d] * (int64_t)esize[k];
            idx[d] = 0;
        }
        if (d < 0)
            break;
    }
done:
    if (buf != small)
        free(buf);
    return NDM_OK;
}
