/* Shared by the CPU reduction kernels (reduce_ref.c, reduce.c): element
 * loads and stores of a dtype known at run time, and an odometer over a
 * shape. */
#ifndef NDM_CPU_REDUCE_CPU_H
#define NDM_CPU_REDUCE_CPU_H

#include <stdlib.h>
#include <string.h>

#include "../reduce.h"
#include "convert.h"
#include "gemm.h"

/* ---- shared helpers ---------------------------------------------------------- */

#define LDX_b8(v) (v)
#define LDX_u8(v) (v)
#define LDX_i32(v) (v)
#define LDX_i64(v) (v)
#define LDX_f16(v) ndm__cpu_h2f(v)
#define LDX_bf16(v) ndm__cpu_bf2f(v)
#define LDX_f32(v) (v)
#define LDX_f64(v) (v)

/* Integer loads of float types never happen; they saturate to stay defined. */
#define TOI_b8(v) ((int64_t)(v))
#define TOI_u8(v) ((int64_t)(v))
#define TOI_i32(v) ((int64_t)(v))
#define TOI_i64(v) ((int64_t)(v))
#define TOI_f16(v) ndm__sat_i64(ndm__cpu_h2f(v))
#define TOI_bf16(v) ndm__sat_i64(ndm__cpu_bf2f(v))
#define TOI_f32(v) ndm__sat_i64(v)
#define TOI_f64(v) ndm__sat_i64(v)

static inline double load_one_d(const char *p, ndm_dtype t)
{
    switch (t) {
#define NDM__LD1D(N, E, T)                                                      \
    case E:                                                                     \
        return (double)LDX_##N(*(const T *)p);
        NDM__CPU_DTYPES(NDM__LD1D)
#undef NDM__LD1D
    }
    return 0;
}

static inline int64_t load_one_i(const char *p, ndm_dtype t)
{
    switch (t) {
#define NDM__LD1I(N, E, T)                                                      \
    case E:                                                                     \
        return TOI_##N(*(const T *)p);
        NDM__CPU_DTYPES(NDM__LD1I)
#undef NDM__LD1I
    }
    return 0;
}

/* Store n results (double or int64) at stride s, converted to dtype t. */
static inline void store_row(ndm_dtype t, char *dst, int64_t s, int64_t n, const double *vd,
                      const int64_t *vi)
{
    switch (t) {
#define NDM__STROW(N, E, T)                                                     \
    case E: {                                                                   \
        T *d = (T *)dst;                                                        \
        if (vd)                                                                 \
            for (int64_t j = 0; j < n; j++)                                     \
                d[j * s] = NDM__ST_##N(vd[j]);                                  \
        else                                                                    \
            for (int64_t j = 0; j < n; j++)                                     \
                d[j * s] = NDM__ST_##N(vi[j]);                                  \
        break;                                                                  \
    }
        NDM__CPU_DTYPES(NDM__STROW)
#undef NDM__STROW
    }
}

static inline int64_t numel(int n, const int64_t *shape)
{
    int64_t m = 1;
    for (int i = 0; i < n; i++)
        m *= shape[i];
    return m;
}

/* An odometer's indices: on the stack for common ranks. */
typedef struct odo {
    int64_t small[32];
    int64_t *idx;
} odo;

static inline bool odo_get(odo *o, int n)
{
    o->idx = n <= 32 ? o->small : calloc((size_t)n, sizeof(int64_t));
    if (n <= 32)
        memset(o->small, 0, sizeof o->small);
    return o->idx != NULL;
}

static inline void odo_put(odo *o)
{
    if (o->idx != o->small)
        free(o->idx);
}

/* Advance an odometer over `shape`; returns false after the last position. */
static inline bool odo_next(int64_t *idx, int n, const int64_t *shape)
{
    for (int i = n - 1; i >= 0; i--) {
        if (++idx[i] < shape[i])
            return true;
        idx[i] = 0;
    }
    return false;
}

static inline int64_t odo_offset(const int64_t *idx, int n, const int64_t *strides)
{
    int64_t off = 0;
    for (int i = 0; i < n; i++)
        off += idx[i] * strides[i];
    return off;
}


#endif
