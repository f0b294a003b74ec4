/* The CPU's fused RMS normalisation of rows: one pass for the sum of
 * squares, one for the scaled row. The reference runs the rows in order,
 * the fast table spreads them over the pool: the same arithmetic per row. */
#include <math.h>

#include "../nn.h"
#include "parallel.h"

typedef struct rms_job {
    const ndm__tensor *y, *rstd, *x, *w;
    double eps;
} rms_job;

/* Four running sums in double, added in a fixed order at the end: no
 * chain of dependent additions, and the same bits on every table. */
static double sum_squares_f32(const float *x, int64_t n)
{
    double s[4] = {0, 0, 0, 0};
    int64_t k = 0;
    for (; k + 4 <= n; k += 4)
        for (int i = 0; i < 4; i++)
            s[i] += (double)x[k + i] * (double)x[k + i];
    for (; k < n; k++)
        s[0] += (double)x[k] * (double)x[k];
    return (s[0] + s[1]) + (s[2] + s[3]);
}

static double sum_squares_f64(const double *x, int64_t n)
{
    double s[4] = {0, 0, 0, 0};
    int64_t k = 0;
    for (; k + 4 <= n; k += 4)
        for (int i = 0; i < 4; i++)
            s[i] += x[k + i] * x[k + i];
    for (; k < n; k++)
        s[0] += x[k] * x[k];
    return (s[0] + s[1]) + (s[2] + s[3]);
}

static void rms_rows(void *ctx, int64_t b, int64_t e)
{
    const rms_job *j = ctx;
    int64_t n = j->x->shape[j->x->ndim - 1];
    if (j->x->dtype == NDM_F32) {
        const float *w = j->w ? j->w->data : NULL;
        for (int64_t r = b; r < e; r++) {
            const float *x = (const float *)j->x->data + r * n;
            float *y = (float *)j->y->data + r * n;
            double ss = sum_squares_f32(x, n);
            float k_r = (float)(1.0 / sqrt(ss / (double)n + j->eps));
            ((float *)j->rstd->data)[r] = k_r;
            if (w)
                for (int64_t k = 0; k < n; k++)
                    y[k] = (x[k] * k_r) * w[k];
            else
                for (int64_t k = 0; k < n; k++)
                    y[k] = x[k] * k_r;
        }
    } else {
        const double *w = j->w ? j->w->data : NULL;
        for (int64_t r = b; r < e; r++) {
            const double *x = (const double *)j->x->data + r * n;
            double *y = (double *)j->y->data + r * n;
            double ss = sum_squares_f64(x, n);
            double k_r = 1.0 / sqrt(ss / (double)n + j->eps);
            ((double *)j->rstd->data)[r] = k_r;
            if (w)
                for (int64_t k = 0; k < n; k++)
                    y[k] = (x[k] * k_r) * w[k];
            else
                for (int64_t k = 0; k < n; k++)
                    y[k] = x[k] * k_r;
        }
    }
}

static int64_t rows_of(const ndm__tensor *x)
{
    int64_t rows = 1;
    for (int d = 0; d < x->ndim - 1; d++)
        rows *= x->shape[d];
    return rows;
}

ndm_status ndm__cpu_ref_rms_norm(int device, const ndm__tensor *y, const ndm__tensor *rstd,
                                 const ndm__tensor *x, const ndm__tensor *w, double eps)
{
    (void)device;
    rms_job j = {y, rstd, x, w, eps};
    rms_rows(&j, 0, rows_of(x));
    return NDM_OK;
}

ndm_status ndm__cpu_rms_norm(int device, const ndm__tensor *y, const ndm__tensor *rstd,
                             const ndm__tensor *x, const ndm__tensor *w, double eps)
{
    (void)device;
    rms_job j = {y, rstd, x, w, eps};
    int64_t n = x->shape[x->ndim - 1], rows = rows_of(x);
    /* about 32k elements a piece */
    int64_t grain = n >= 32768 ? 1 : 32768 / n;
    ndm__parallel_for(rows, grain, rms_rows, &j);
    return NDM_OK;
}
