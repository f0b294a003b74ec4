/* The CPU backend's table and its core kernels: converting copy, fill, iota,
 * host transfers. Other families register themselves in their own files. */
#include <stdlib.h>
#include <string.h>

#include "../backend.h"
#include "../index.h"
#include "../random.h"
#include "../linalg.h"
#include "../nn.h"
#include "../reduce.h"
#include "convert.h"
#include "ew_cpu.h"
#include "iter.h"

/* conv_S_D: one row of dst(D) = src(S). Contiguous rows get their own loop
 * so the compiler can vectorise them. */
#define NDM__CONV_ROW(SN, SE, ST, DN, DE, DT)                                   \
    static void conv_##SN##_##DN(void *ctx, char *const *p, const int64_t *s, int64_t n) \
    {                                                                           \
        (void)ctx;                                                              \
        DT *restrict d = (DT *)p[0];                                            \
        const ST *restrict x = (const ST *)p[1];                                \
        if (s[0] == 1 && s[1] == 1) {                                           \
            for (int64_t i = 0; i < n; i++)                                     \
                d[i] = NDM__ST_##DN(NDM__LD_##SN(x[i]));                        \
        } else {                                                                \
            for (int64_t i = 0; i < n; i++)                                     \
                d[i * s[0]] = NDM__ST_##DN(NDM__LD_##SN(x[i * s[1]]));          \
        }                                                                       \
    }
#define NDM__CONV_FROM(SN, SE, ST)                                              \
    NDM__CONV_ROW(SN, SE, ST, b8, NDM_BOOL, uint8_t)                          \
    NDM__CONV_ROW(SN, SE, ST, u8, NDM_U8, uint8_t)                              \
    NDM__CONV_ROW(SN, SE, ST, i32, NDM_I32, int32_t)                            \
    NDM__CONV_ROW(SN, SE, ST, i64, NDM_I64, int64_t)                            \
    NDM__CONV_ROW(SN, SE, ST, f16, NDM_F16, uint16_t)                           \
    NDM__CONV_ROW(SN, SE, ST, bf16, NDM_BF16, uint16_t)                         \
    NDM__CONV_ROW(SN, SE, ST, f32, NDM_F32, float)                              \
    NDM__CONV_ROW(SN, SE, ST, f64, NDM_F64, double)
NDM__CPU_DTYPES(NDM__CONV_FROM)

#define NDM__CONV_ENTRY(SN, SE, ST)                                             \
    [SE] = {[NDM_BOOL] = conv_##SN##_b8, [NDM_U8] = conv_##SN##_u8,            \
            [NDM_I32] = conv_##SN##_i32,   [NDM_I64] = conv_##SN##_i64,          \
            [NDM_F16] = conv_##SN##_f16,   [NDM_BF16] = conv_##SN##_bf16,        \
            [NDM_F32] = conv_##SN##_f32,   [NDM_F64] = conv_##SN##_f64},
static const ndm__row_fn conv[NDM_DTYPE_COUNT][NDM_DTYPE_COUNT] = {NDM__CPU_DTYPES(NDM__CONV_ENTRY)};

/* Same-dtype copies move bytes of the element size. */
#define NDM__MOVE_ROW(BITS)                                                     \
    static void move##BITS(void *ctx, char *const *p, const int64_t *s, int64_t n) \
    {                                                                           \
        (void)ctx;                                                              \
        uint##BITS##_t *restrict d = (uint##BITS##_t *)p[0];                    \
        const uint##BITS##_t *restrict x = (const uint##BITS##_t *)p[1];        \
        if (s[0] == 1 && s[1] == 1)                                             \
            memcpy(d, x, (size_t)n * sizeof *d);                                \
        else                                                                    \
            for (int64_t i = 0; i < n; i++)                                     \
                d[i * s[0]] = x[i * s[1]];                                      \
    }
NDM__MOVE_ROW(8)
NDM__MOVE_ROW(16)
NDM__MOVE_ROW(32)
NDM__MOVE_ROW(64)

/* The reference copy: one row at a time through the plain conversions. The
 * fast table uses ndm__cpu_copy_fast (ew.c): vectorized and parallel. */
ndm_status ndm__cpu_copy(int device, const ndm__tensor *dst, const ndm__tensor *src)
{
    (void)device;
    ndm__row_fn fn;
    if (dst->dtype == src->dtype) {
        switch (ndm_dtype_size(dst->dtype)) {
        case 1: fn = move8; break;
        case 2: fn = move16; break;
        case 4: fn = move32; break;
        default: fn = move64; break;
        }
    } else {
        fn = conv[src->dtype][dst->dtype];
    }
    char *data[2] = {dst->data, src->data};
    const int64_t *strides[2] = {dst->strides, src->strides};
    size_t es[2] = {ndm_dtype_size(dst->dtype), ndm_dtype_size(src->dtype)};
    return ndm__cpu_iterate(dst->ndim, dst->shape, 2, data, strides, es, fn, NULL);
}

static ndm_status fill_with(ndm_status (*copy)(int, const ndm__tensor *, const ndm__tensor *),
                            int device, const ndm__tensor *dst, double value)
{
    /* Convert once into one element, then broadcast it with a stride-0 copy. */
    unsigned char one[8];
    int64_t zero = 0;
    ndm__tensor v = {&value, NDM_F64, 0, NULL, NULL};
    ndm__tensor e = {one, dst->dtype, 0, NULL, NULL};
    ndm_status st = ndm__cpu_copy(device, &e, &v);
    if (st < 0)
        return st;
    int64_t *zs = NULL;
    int64_t small[16];
    (void)zero;
    if (dst->ndim <= 16) {
        zs = small;
    } else {
        zs = calloc((size_t)dst->ndim, sizeof *zs);
        if (!zs)
            return NDM_E_OOM;
    }
    for (int i = 0; i < dst->ndim; i++)
        zs[i] = 0;
    ndm__tensor src = {one, dst->dtype, dst->ndim, dst->shape, zs};
    st = copy(device, dst, &src);
    if (zs != small)
        free(zs);
    return st;
}

static ndm_status cpu_fill(int device, const ndm__tensor *dst, double value)
{
    return fill_with(ndm__cpu_copy_fast, device, dst, value);
}

static ndm_status cpu_fill_ref(int device, const ndm__tensor *dst, double value)
{
    return fill_with(ndm__cpu_copy, device, dst, value);
}

#define NDM__IOTA_ROW(N, E, T)                                                  \
    static void iota_##N(char *p, int64_t s, int64_t n, double start, double step) \
    {                                                                           \
        T *d = (T *)p;                                                          \
        for (int64_t i = 0; i < n; i++)                                         \
            d[i * s] = NDM__ST_##N(start + (double)i * step);                   \
    }
NDM__CPU_DTYPES(NDM__IOTA_ROW)

static ndm_status cpu_iota(int device, const ndm__tensor *dst, double start, double step)
{
    (void)device;
    int64_t n = dst->ndim ? dst->shape[0] : 1;
    int64_t s = dst->ndim ? dst->strides[0] : 1;
    switch (dst->dtype) {
#define NDM__IOTA_CASE(N, E, T)                                                 \
    case E:                                                                     \
        iota_##N(dst->data, s, n, start, step);                                 \
        break;
        NDM__CPU_DTYPES(NDM__IOTA_CASE)
    }
    return NDM_OK;
}

static ndm_status cpu_transfer(int device, void *dst, const void *src, size_t n)
{
    (void)device;
    if (n)
        memcpy(dst, src, n);
    return NDM_OK;
}

/* Family tables, one line each, filled by the files of each family. */

const ndm__backend ndm__cpu_backend = {
    .abi = NDM__BACKEND_ABI,
    .name = "cpu",
    .type = NDM_DEVICE_CPU,
    .copy = ndm__cpu_copy_fast,
    .fill = cpu_fill,
    .iota = cpu_iota,
    .upload = cpu_transfer,
    .download = cpu_transfer,
    .sync = NULL,
    .index = &ndm__cpu_index,
    .random = &ndm__cpu_random,
    .reduce = &ndm__cpu_reduce,
    .linalg = &ndm__cpu_linalg,
    .nn = &ndm__cpu_nn,
    .ew = &ndm__cpu_ew,
};

const ndm__backend ndm__cpu_ref_backend = {
    .abi = NDM__BACKEND_ABI,
    .name = "cpu-reference",
    .type = NDM_DEVICE_CPU,
    .copy = ndm__cpu_copy,
    .fill = cpu_fill_ref,
    .iota = cpu_iota,
    .upload = cpu_transfer,
    .download = cpu_transfer,
    .sync = NULL,
    .index = &ndm__cpu_ref_index,
    .random = &ndm__cpu_ref_random,
    .reduce = &ndm__cpu_ref_reduce,
    .linalg = &ndm__cpu_ref_linalg,
    .nn = &ndm__cpu_ref_nn,
    .ew = &ndm__cpu_ref_ew,
};
