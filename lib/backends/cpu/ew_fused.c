/* Fused CPU kernels of the training step: the relu gradient and the
 * optimizer update, each one pass over memory where the graph ran several. */
#include <math.h>
#include <stdbool.h>
#include <stdint.h>

#include "ew_cpu.h"
#include "parallel.h"

/* Elements per task: the passes are memory-bound, so a task must move a few
 * hundred kilobytes before a second thread pays for its wake-up. */
#define GRAIN ((int64_t)1 << 16)

/* This file is compiled apart (meson.build): without FMA contraction, so
 * each product and sum below rounds to its type as the separate operations
 * do, in the order written, and the results are those of the unfused
 * sequences bit for bit; and without errno or traps assumed, so sqrt is one
 * instruction and selects need no branch and the loops vectorise (nothing
 * here reads errno or traps). */

typedef struct relu_job {
    void *out;
    const void *g, *x;
    bool f64;
} relu_job;

static void relu_range(void *ctx, int64_t b, int64_t e)
{
    const relu_job *j = ctx;
    if (j->f64) {
        double *o = j->out;
        const double *g = j->g, *x = j->x;
        for (int64_t i = b; i < e; i++)
            o[i] = g[i] * (x[i] > 0 ? 1.0 : 0.0);
    } else {
        float *o = j->out;
        const float *g = j->g, *x = j->x;
        for (int64_t i = b; i < e; i++)
            o[i] = g[i] * (x[i] > 0 ? 1.0f : 0.0f);
    }
}

ndm_status ndm__cpu_relu_grad_flat(int device, ndm_dtype t, void *out, const void *g,
                                   const void *x, int64_t n)
{
    (void)device;
    if (t != NDM_F32 && t != NDM_F64)
        return NDM_E_UNSUPPORTED;
    relu_job j = {out, g, x, t == NDM_F64};
    ndm__parallel_for(n, GRAIN, relu_range, &j);
    return NDM_OK;
}

/* The optimizer step, written once for float and double: every scalar is
 * converted to T first, as the elementwise operations convert theirs. The
 * arrays are apart (the dispatcher checks), hence restrict; each option
 * combination gets its own loop (constant flags), so each loop vectorises. */
#define NDM__OPTIM_RANGE(N, T, SQRT)                                            \
    static inline __attribute__((always_inline)) void sgd_##N(                  \
        T *restrict w, const T *restrict g, T *restrict m, int64_t b, int64_t e, \
        T lr, T mom, T wd, bool l2, bool momentum)                              \
    {                                                                           \
        for (int64_t i = b; i < e; i++) {                                       \
            T d = g[i];                                                         \
            if (l2)                                                             \
                d = w[i] * wd + d;                                              \
            if (momentum)                                                       \
                d = m[i] = m[i] * mom + d;                                      \
            T u = d * lr;                                                       \
            w[i] = w[i] - u;                                                    \
        }                                                                       \
    }                                                                           \
    static inline __attribute__((always_inline)) void adam_##N(                 \
        T *restrict w, const T *restrict g, T *restrict m, T *restrict v,       \
        int64_t b, int64_t e, const ndm__optim_args *a, bool l2, bool decoupled) \
    {                                                                           \
        const T wd = (T)a->wd, decay = (T)a->decay, b1 = (T)a->b1;              \
        const T ob1 = (T)a->one_b1, b2 = (T)a->b2, ob2 = (T)a->one_b2;          \
        const T ibc2 = (T)a->inv_bc2, eps = (T)a->eps, lrb = (T)a->lr_bc1;      \
        for (int64_t i = b; i < e; i++) {                                       \
            T d = g[i], x = w[i];                                               \
            if (l2)                                                             \
                d = x * wd + d;                                                 \
            if (decoupled)                                                      \
                x = x * decay;                                                  \
            T mm = m[i] * b1 + d * ob1;                                         \
            T vv = v[i] * b2 + d * d * ob2;                                     \
            m[i] = mm;                                                          \
            v[i] = vv;                                                          \
            T q = mm / (SQRT(vv * ibc2) + eps) * lrb;                           \
            w[i] = x - q;                                                       \
        }                                                                       \
    }                                                                           \
    static void optim_##N(const ndm__optim_args *a, int64_t b, int64_t e)      \
    {                                                                           \
        T *w = a->w, *m = a->m, *v = a->v;                                      \
        const T *g = a->g;                                                      \
        if (a->kind == 0) {                                                     \
            const T lr = (T)a->lr, mom = (T)a->momentum, wd = (T)a->wd;         \
            if (a->l2 && m)                                                     \
                sgd_##N(w, g, m, b, e, lr, mom, wd, true, true);                \
            else if (a->l2)                                                     \
                sgd_##N(w, g, m, b, e, lr, mom, wd, true, false);               \
            else if (m)                                                         \
                sgd_##N(w, g, m, b, e, lr, mom, wd, false, true);               \
            else                                                                \
                sgd_##N(w, g, m, b, e, lr, mom, wd, false, false);              \
        } else if (a->l2) {                                                     \
            adam_##N(w, g, m, v, b, e, a, true, false);                         \
        } else if (a->decoupled) {                                              \
            adam_##N(w, g, m, v, b, e, a, false, true);                         \
        } else {                                                                \
            adam_##N(w, g, m, v, b, e, a, false, false);                        \
        }                                                                       \
    }
NDM__OPTIM_RANGE(f32, float, sqrtf)
NDM__OPTIM_RANGE(f64, double, sqrt)

typedef struct optim_job {
    const ndm__optim_args *a;
    bool f64;
} optim_job;

static void optim_range(void *ctx, int64_t b, int64_t e)
{
    const optim_job *j = ctx;
    if (j->f64)
        optim_f64(j->a, b, e);
    else
        optim_f32(j->a, b, e);
}

ndm_status ndm__cpu_optim_flat(int device, ndm_dtype t, const ndm__optim_args *args, int64_t n)
{
    (void)device;
    if ((t != NDM_F32 && t != NDM_F64) || args->kind < 0 || args->kind > 1 ||
        (args->kind == 1 && (!args->m || !args->v)))
        return NDM_E_UNSUPPORTED;
    optim_job j = {args, t == NDM_F64};
    /* The Adam pass does a square root and a division per element. */
    ndm__parallel_for(n, args->kind ? GRAIN / 4 : GRAIN, optim_range, &j);
    return NDM_OK;
}
