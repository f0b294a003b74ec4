/* CPU matrix products: ndm's blocked GEMM (packed panels, SIMD micro-kernels
 * picked by the CPU at run time) and the batched matmul kernels of the linalg
 * family (reference and fast). The build's GEMM provider is gemm_provider.c;
 * the timing of products for bench/train, gemm_profile.c. */
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "../linalg.h"
#include "isa.h"
#include "gemm.h"
#include "gemm_profile.h"
#include "gemm_provider.h"
#include "ndm/config.h"
#include "parallel.h"
#include "small_gemm.h"

#if NDM__CPU_X86
#include <immintrin.h>
#endif

/* ---- micro-kernels ---------------------------------------------------------
 * A micro-kernel computes an MR x NR tile of C from a packed A panel (kc
 * steps of MR values) and a packed B panel (kc steps of NR values). Panels
 * are zero-padded, so it always computes the whole tile and writes the valid
 * mv x nv part. `init` (MR values, or NULL for zeros) starts each row's
 * accumulators: a bias added without another pass over C. */

typedef void (*micro_s_fn)(int64_t kc, const float *a, const float *b, float *c, int64_t rsc,
                           int64_t csc, int64_t mv, int64_t nv, bool acc, const float *init);
typedef void (*micro_d_fn)(int64_t kc, const double *a, const double *b, double *c,
                           int64_t rsc, int64_t csc, int64_t mv, int64_t nv, bool acc,
                           const double *init);

/* Write an MR x NR tile t (row-major) into the valid part of C. */
#define NDM__TILE_OUT(T, MR, NR)                                                \
    static void tile_out_##T##_##MR##x##NR(const T *t, T *c, int64_t rsc, int64_t csc, \
                                           int64_t mv, int64_t nv, bool acc)     \
    {                                                                           \
        for (int64_t i = 0; i < mv; i++)                                        \
            for (int64_t j = 0; j < nv; j++) {                                  \
                T *p = c + i * rsc + j * csc;                                   \
                *p = acc ? *p + t[i * NR + j] : t[i * NR + j];                  \
            }                                                                   \
    }

/* Portable kernels: plain C with fixed trip counts the compiler unrolls. */
#define NDM__MICRO_C(T, SUF, MR, NR)                                            \
    NDM__TILE_OUT(T, MR, NR)                                                    \
    static void micro_##SUF##_c(int64_t kc, const T *restrict a, const T *restrict b, \
                                T *restrict c, int64_t rsc, int64_t csc, int64_t mv, \
                                int64_t nv, bool acc, const T *init)            \
    {                                                                           \
        T t[MR * NR];                                                           \
        for (int i = 0; i < MR * NR; i++)                                       \
            t[i] = init ? init[i / NR] : 0;                                     \
        for (int64_t p = 0; p < kc; p++) {                                      \
            _Pragma("GCC unroll 8") for (int i = 0; i < MR; i++)                \
            {                                                                   \
                T ai = a[p * MR + i];                                           \
                _Pragma("GCC unroll 8") for (int j = 0; j < NR; j++) t[i * NR + j] += ai * b[p * NR + j]; \
            }                                                                   \
        }                                                                       \
        tile_out_##T##_##MR##x##NR(t, c, rsc, csc, mv, nv, acc);                \
    }
NDM__MICRO_C(float, s, 4, 8)
NDM__MICRO_C(double, d, 4, 4)

#if NDM__CPU_X86
/* The SIMD kernels keep MR rows x 2 vectors of accumulators in registers.
 * V is the vector type, X the intrinsics' suffix (ps, pd), NR two vectors'
 * worth of lanes. */

/* AVX-512: 12 rows (24 of the 32 registers); M is the type of a lane mask. */
#define NDM__MICRO_AVX512(T, SUF, V, X, NR, M)                                  \
    NDM__TILE_OUT(T, 12, NR)                                                    \
    __attribute__((target("avx512f"))) static void micro_##SUF##_avx512(        \
        int64_t kc, const T *restrict a, const T *restrict b, T *restrict c, int64_t rsc, \
        int64_t csc, int64_t mv, int64_t nv, bool acc, const T *init)           \
    {                                                                           \
        enum { L = NR / 2 };                                                    \
        V r[12][2];                                                             \
        _Pragma("GCC unroll 12") for (int i = 0; i < 12; i++)                   \
            r[i][0] = r[i][1] = init ? _mm512_set1_##X(init[i]) : _mm512_setzero_##X(); \
        for (int64_t p = 0; p < kc; p++) {                                      \
            V b0 = _mm512_loadu_##X(b), b1 = _mm512_loadu_##X(b + L);           \
            _Pragma("GCC unroll 12") for (int i = 0; i < 12; i++)               \
            {                                                                   \
                V ai = _mm512_set1_##X(a[i]);                                   \
                r[i][0] = _mm512_fmadd_##X(ai, b0, r[i][0]);                    \
                r[i][1] = _mm512_fmadd_##X(ai, b1, r[i][1]);                    \
            }                                                                   \
            a += 12;                                                            \
            b += NR;                                                            \
        }                                                                       \
        if (csc == 1) {                                                         \
            /* rows of C are contiguous: masked stores cover partial tiles */   \
            M m0 = (M)(nv >= L ? ~0u : (1u << nv) - 1);                         \
            M m1 = (M)(nv >= NR ? ~0u : nv <= L ? 0 : (1u << (nv - L)) - 1);    \
            _Pragma("GCC unroll 12") for (int i = 0; i < 12; i++)               \
            {                                                                   \
                if (i >= mv)                                                    \
                    break;                                                      \
                T *row = c + i * rsc;                                           \
                if (acc) {                                                      \
                    r[i][0] = _mm512_add_##X(r[i][0], _mm512_maskz_loadu_##X(m0, row)); \
                    r[i][1] = _mm512_add_##X(r[i][1], _mm512_maskz_loadu_##X(m1, row + L)); \
                }                                                               \
                _mm512_mask_storeu_##X(row, m0, r[i][0]);                       \
                _mm512_mask_storeu_##X(row + L, m1, r[i][1]);                   \
            }                                                                   \
            return;                                                             \
        }                                                                       \
        T t[12 * NR];                                                           \
        _Pragma("GCC unroll 12") for (int i = 0; i < 12; i++)                   \
        {                                                                       \
            _mm512_storeu_##X(t + i * NR, r[i][0]);                             \
            _mm512_storeu_##X(t + i * NR + L, r[i][1]);                         \
        }                                                                       \
        tile_out_##T##_12x##NR(t, c, rsc, csc, mv, nv, acc);                    \
    }
NDM__MICRO_AVX512(float, s, __m512, ps, 32, __mmask16)
NDM__MICRO_AVX512(double, d, __m512d, pd, 16, __mmask8)

/* AVX2 with FMA: 6 rows (12 of the 16 registers). */
#define NDM__MICRO_AVX2(T, SUF, V, X, NR)                                       \
    NDM__TILE_OUT(T, 6, NR)                                                     \
    __attribute__((target("avx2,fma"))) static void micro_##SUF##_avx2(         \
        int64_t kc, const T *restrict a, const T *restrict b, T *restrict c, int64_t rsc, \
        int64_t csc, int64_t mv, int64_t nv, bool acc, const T *init)           \
    {                                                                           \
        enum { L = NR / 2 };                                                    \
        V r[6][2];                                                              \
        _Pragma("GCC unroll 6") for (int i = 0; i < 6; i++)                     \
            r[i][0] = r[i][1] = init ? _mm256_set1_##X(init[i]) : _mm256_setzero_##X(); \
        for (int64_t p = 0; p < kc; p++) {                                      \
            V b0 = _mm256_loadu_##X(b), b1 = _mm256_loadu_##X(b + L);           \
            _Pragma("GCC unroll 6") for (int i = 0; i < 6; i++)                 \
            {                                                                   \
                V ai = _mm256_set1_##X(a[i]);                                   \
                r[i][0] = _mm256_fmadd_##X(ai, b0, r[i][0]);                    \
                r[i][1] = _mm256_fmadd_##X(ai, b1, r[i][1]);                    \
            }                                                                   \
            a += 6;                                                             \
            b += NR;                                                            \
        }                                                                       \
        if (csc == 1 && nv == NR) {                                             \
            /* whole rows of contiguous C: no trip through memory */            \
            _Pragma("GCC unroll 6") for (int i = 0; i < 6; i++)                 \
            {                                                                   \
                if (i >= mv)                                                    \
                    break;                                                      \
                T *row = c + i * rsc;                                           \
                if (acc) {                                                      \
                    r[i][0] = _mm256_add_##X(r[i][0], _mm256_loadu_##X(row));   \
                    r[i][1] = _mm256_add_##X(r[i][1], _mm256_loadu_##X(row + L)); \
                }                                                               \
                _mm256_storeu_##X(row, r[i][0]);                                \
                _mm256_storeu_##X(row + L, r[i][1]);                            \
            }                                                                   \
            return;                                                             \
        }                                                                       \
        T t[6 * NR];                                                            \
        _Pragma("GCC unroll 6") for (int i = 0; i < 6; i++)                     \
        {                                                                       \
            _mm256_storeu_##X(t + i * NR, r[i][0]);                             \
            _mm256_storeu_##X(t + i * NR + L, r[i][1]);                         \
        }                                                                       \
        tile_out_##T##_6x##NR(t, c, rsc, csc, mv, nv, acc);                     \
    }
NDM__MICRO_AVX2(float, s, __m256, ps, 16)
NDM__MICRO_AVX2(double, d, __m256d, pd, 8)
#endif

/* The kernel set for this CPU, chosen once. */
typedef struct kernels {
    int smr, snr, dmr, dnr;
    micro_s_fn s;
    micro_d_fn d;
} kernels;

/* The micro-kernels of the CPU level in effect (isa.h). */
static const kernels *cpu_kernels(void)
{
    static const kernels portable = {4, 8, 4, 4, micro_s_c, micro_d_c};
#if NDM__CPU_X86
    static const kernels avx512 = {12, 32, 12, 16, micro_s_avx512, micro_d_avx512};
    static const kernels avx2 = {6, 16, 6, 8, micro_s_avx2, micro_d_avx2};
    static const kernels *const by_level[NDM__CPU_ISA_COUNT] = {&portable, &avx2, &avx512};
    return by_level[ndm__cpu_isa_level()];
#else
    return &portable;
#endif
}

/* ---- the blocked driver ----------------------------------------------------
 * Goto's loop order: B blocks of KC x NC are packed once and shared by all
 * threads; each task packs its own MC x KC block of A and runs the
 * micro-kernel over a range of B panels. */

#define KC 256
#define NC 3072

typedef struct blocked {
    size_t es;              /* element size */
    int mr, nr;
    int64_t mc;
    micro_s_fn s;
    micro_d_fn d;
    int64_t m, n, k;
    const char *a, *b;
    char *c;
    int64_t rsa, csa, rsb, csb, rsc, csc;
    bool acc;               /* accumulate into C for this k block */
    const char *bias;       /* per row of C, added in the first k block; or NULL */
    int64_t sbias;
    /* the current block */
    int64_t jc, nc, pc, kc;
    char *bp;               /* packed B block */
    int64_t nic, njg, panels_per_group, npanels;
    atomic_int failed;
} blocked;

/* The packing buffers, per call from the library's caching allocator
 * (backend.h, "kernel scratch"), charged to the product's output manager:
 * its cache hands the same warm block back call after call, so a buffer is
 * not fresh mmap'd memory whose first touch (page faults, zeroed huge
 * pages) would cost about a tenth of a training step. A buffer taken on a
 * pool thread is given back on it, before its task returns. */
static char *pack_take(size_t bytes, ndm_status *st)
{
    void *p;
    *st = ndm__scratch_alloc(NDM_DEVICE_CPU, 0, bytes, &p);
    return p;
}

static void pack_give(void *p) { ndm__scratch_free(NDM_DEVICE_CPU, 0, p); }

/* ---- packing --------------------------------------------------------------
 * Operands read across their memory order (x @ W^T reads W's rows as B's
 * columns; a layer's input as A row by row) are packed with 8 x 8
 * transposes of floats on AVX2, not one element at a time: element-wise,
 * these packs cost a fifth of a training step's forward product. */

#if NDM__CPU_X86
/* The 8 x 8 floats s[r * ss + c] (r, c < 8) to d[c * ds + r], writing
 * the first `rows` of each destination row (rows 4, 6 or 8; rows past
 * `have` of s read as zeros). */
__attribute__((target("avx2"))) static inline void tr8x8_s(const float *s, int64_t ss, int have,
                                                           float *d, int64_t ds, int rows)
{
    __m256 r[8];
    for (int i = 0; i < 8; i++)
        r[i] = i < have ? _mm256_loadu_ps(s + i * ss) : _mm256_setzero_ps();
    __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
    __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
    __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
    __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
    __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xee);
    __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xee);
    __m256 u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xee);
    __m256 u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xee);
    __m256 o[8] = {
        _mm256_permute2f128_ps(u0, u4, 0x20), _mm256_permute2f128_ps(u1, u5, 0x20),
        _mm256_permute2f128_ps(u2, u6, 0x20), _mm256_permute2f128_ps(u3, u7, 0x20),
        _mm256_permute2f128_ps(u0, u4, 0x31), _mm256_permute2f128_ps(u1, u5, 0x31),
        _mm256_permute2f128_ps(u2, u6, 0x31), _mm256_permute2f128_ps(u3, u7, 0x31),
    };
    for (int c = 0; c < 8; c++) {
        float *dc = d + c * ds;
        if (rows == 8) {
            _mm256_storeu_ps(dc, o[c]);
        } else {
            _mm_storeu_ps(dc, _mm256_castps256_ps128(o[c]));
            if (rows == 6)
                _mm_storel_pi((__m64 *)(dc + 4), _mm256_extractf128_ps(o[c], 1));
        }
    }
}

/* A's rows contiguous (csa == 1), panels of mr = 6 or 12 rows: blocks of
 * 8 depths by up to 8 rows transposed; the depths past the last whole
 * block one by one. false when the CPU or the shape does not fit. */
__attribute__((target("avx2"))) static bool pack_a_tr_s(float *restrict dst, const float *a,
                                                         int64_t rsa, int64_t rows, int64_t kc,
                                                         int mr)
{
    for (int64_t i0 = 0; i0 < rows; i0 += mr) {
        int64_t mv = rows - i0 < mr ? rows - i0 : mr;
        const float *panel = a + i0 * rsa;
        int64_t p = 0;
        for (; p + 8 <= kc; p += 8)
            for (int g = 0; g < mr; g += 8) {
                int rows_g = mr - g < 8 ? mr - g : 8;
                int have = mv - g < 0 ? 0 : mv - g > 8 ? 8 : (int)(mv - g);
                tr8x8_s(panel + g * rsa + p, rsa, have, dst + p * mr + g, mr, rows_g);
            }
        for (; p < kc; p++)
            for (int64_t i = 0; i < mr; i++)
                dst[p * mr + i] = i < mv ? panel[i * rsa + p] : 0.0f;
        dst += kc * mr;
    }
    return true;
}

/* One whole panel of B (cols == nr, a multiple of 8) whose columns are
 * contiguous (rsb == 1): W's rows when B = W^T. */
__attribute__((target("avx2"))) static void pack_b_tr_s(float *restrict dst, const float *b,
                                                        int64_t csb, int64_t kc, int nr)
{
    int64_t p = 0;
    for (; p + 8 <= kc; p += 8)
        for (int j = 0; j < nr; j += 8)
            tr8x8_s(b + j * csb + p, csb, 8, dst + p * nr + j, nr, 8);
    for (; p < kc; p++)
        for (int j = 0; j < nr; j++)
            dst[p * nr + j] = b[j * csb + p];
}
#endif

/* The transposing packs when this CPU runs them and the layout asks for
 * them; false otherwise (the caller packs element by element). */
static bool pack_a_fast_float(float *restrict dst, const float *a, int64_t rsa, int64_t csa,
                              int64_t rows, int64_t kc, int mr)
{
#if NDM__CPU_X86
    if (csa == 1 && rsa != 1 && (mr == 6 || mr == 12) && kc >= 8 &&
        ndm__cpu_isa_level() >= NDM__CPU_ISA_AVX2)
        return pack_a_tr_s(dst, a, rsa, rows, kc, mr);
#endif
    (void)dst, (void)a, (void)rsa, (void)csa, (void)rows, (void)kc, (void)mr;
    return false;
}

static bool pack_a_fast_double(double *restrict dst, const double *a, int64_t rsa, int64_t csa,
                               int64_t rows, int64_t kc, int mr)
{
    (void)dst, (void)a, (void)rsa, (void)csa, (void)rows, (void)kc, (void)mr;
    return false;
}

static bool pack_b_fast_float(float *restrict dst, const float *b, int64_t rsb, int64_t csb,
                              int64_t kc, int64_t cols, int nr)
{
#if NDM__CPU_X86
    if (rsb == 1 && csb != 1 && cols == nr && nr % 8 == 0 && kc >= 8 &&
        ndm__cpu_isa_level() >= NDM__CPU_ISA_AVX2) {
        pack_b_tr_s(dst, b, csb, kc, nr);
        return true;
    }
#endif
    (void)dst, (void)b, (void)rsb, (void)csb, (void)kc, (void)cols, (void)nr;
    return false;
}

static bool pack_b_fast_double(double *restrict dst, const double *b, int64_t rsb, int64_t csb,
                               int64_t kc, int64_t cols, int nr)
{
    (void)dst, (void)b, (void)rsb, (void)csb, (void)kc, (void)cols, (void)nr;
    return false;
}

/* Copy one panel row (mr or nr values) of a contiguous run: a call to
 * memcpy per panel row cost more than the copy; the panel widths are fixed
 * sizes that compile to a few moves. */
#define NDM__COPY_RUN(T)                                                        \
    static inline void copy_run_##T(T *restrict dst, const T *src, int len)    \
    {                                                                           \
        switch (len) {                                                          \
        case 4: memcpy(dst, src, 4 * sizeof(T)); break;                         \
        case 6: memcpy(dst, src, 6 * sizeof(T)); break;                         \
        case 8: memcpy(dst, src, 8 * sizeof(T)); break;                         \
        case 12: memcpy(dst, src, 12 * sizeof(T)); break;                       \
        case 16: memcpy(dst, src, 16 * sizeof(T)); break;                       \
        case 32: memcpy(dst, src, 32 * sizeof(T)); break;                       \
        default:                                                                \
            for (int i = 0; i < len; i++)                                       \
                dst[i] = src[i];                                                \
        }                                                                       \
    }
NDM__COPY_RUN(float)
NDM__COPY_RUN(double)

/* Pack `rows` x `kc` of A (starting at `a`) into panels of MR rows, zero-padded. */
#define NDM__PACK_A(T)                                                          \
    static void pack_a_##T(T *restrict dst, const T *a, int64_t rsa, int64_t csa, int64_t rows, \
                           int64_t kc, int mr)                                  \
    {                                                                           \
        if (pack_a_fast_##T(dst, a, rsa, csa, rows, kc, mr))                    \
            return;                                                             \
        for (int64_t i0 = 0; i0 < rows; i0 += mr) {                             \
            int64_t mv = rows - i0 < mr ? rows - i0 : mr;                       \
            if (csa == 1) {                                                     \
                /* rows are contiguous: read along them */                      \
                for (int64_t i = 0; i < mv; i++) {                              \
                    const T *row = a + (i0 + i) * rsa;                          \
                    for (int64_t p = 0; p < kc; p++)                            \
                        dst[p * mr + i] = row[p];                               \
                }                                                               \
                for (int64_t i = mv; i < mr; i++)                               \
                    for (int64_t p = 0; p < kc; p++)                            \
                        dst[p * mr + i] = 0;                                    \
                dst += kc * mr;                                                 \
                continue;                                                       \
            }                                                                   \
            if (rsa == 1 && mv == mr) {                                         \
                /* columns contiguous (A = x^T): a run of mr per depth */       \
                for (int64_t p = 0; p < kc; p++)                                \
                    copy_run_##T(dst + p * mr, a + i0 + p * csa, mr);           \
                dst += kc * mr;                                                 \
                continue;                                                       \
            }                                                                   \
            for (int64_t p = 0; p < kc; p++) {                                  \
                const T *src = a + i0 * rsa + p * csa;                          \
                int64_t i = 0;                                                  \
                for (; i < mv; i++)                                             \
                    dst[i] = src[i * rsa];                                      \
                for (; i < mr; i++)                                             \
                    dst[i] = 0;                                                 \
                dst += mr;                                                      \
            }                                                                   \
        }                                                                       \
    }
NDM__PACK_A(float)
NDM__PACK_A(double)

/* Pack one panel of B: `kc` rows of `cols` (<= NR) columns, zero-padded to NR. */
#define NDM__PACK_B(T)                                                          \
    static void pack_b_##T(T *restrict dst, const T *b, int64_t rsb, int64_t csb, int64_t kc, \
                           int64_t cols, int nr)                                \
    {                                                                           \
        if (pack_b_fast_##T(dst, b, rsb, csb, kc, cols, nr))                    \
            return;                                                             \
        if (csb == 1 && cols == nr) {                                           \
            for (int64_t p = 0; p < kc; p++)                                    \
                copy_run_##T(dst + p * nr, b + p * rsb, nr);                    \
            return;                                                             \
        }                                                                       \
        for (int64_t p = 0; p < kc; p++) {                                      \
            const T *src = b + p * rsb;                                         \
            int64_t j = 0;                                                      \
            for (; j < cols; j++)                                               \
                dst[p * nr + j] = src[j * csb];                                 \
            for (; j < nr; j++)                                                 \
                dst[p * nr + j] = 0;                                            \
        }                                                                       \
    }
NDM__PACK_B(float)
NDM__PACK_B(double)

static void pack_b_range(void *ctx, int64_t begin, int64_t end)
{
    blocked *g = ctx;
    for (int64_t q = begin; q < end; q++) {
        int64_t j0 = q * g->nr;
        int64_t cols = g->nc - j0 < g->nr ? g->nc - j0 : g->nr;
        const char *src = g->b + (g->pc * g->rsb + (g->jc + j0) * g->csb) * (int64_t)g->es;
        char *dst = g->bp + (size_t)(q * g->kc * g->nr) * g->es;
        if (g->es == sizeof(float))
            pack_b_float((float *)dst, (const float *)src, g->rsb, g->csb, g->kc, cols, g->nr);
        else
            pack_b_double((double *)dst, (const double *)src, g->rsb, g->csb, g->kc, cols, g->nr);
    }
}

static void compute_range(void *ctx, int64_t begin, int64_t end)
{
    blocked *g = ctx;
    ndm_status st;
    char *ap = pack_take((size_t)(g->mc * g->kc) * g->es, &st);
    if (!ap) {
        atomic_store(&g->failed, st);
        return;
    }
    int64_t packed_ic = -1;
    for (int64_t t = begin; t < end; t++) {
        int64_t ic = t / g->njg, jg = t % g->njg;
        int64_t i0 = ic * g->mc;
        int64_t mc = g->m - i0 < g->mc ? g->m - i0 : g->mc;
        if (ic != packed_ic) {
            const char *src = g->a + (i0 * g->rsa + g->pc * g->csa) * (int64_t)g->es;
            if (g->es == sizeof(float))
                pack_a_float((float *)ap, (const float *)src, g->rsa, g->csa, mc, g->kc, g->mr);
            else
                pack_a_double((double *)ap, (const double *)src, g->rsa, g->csa, mc, g->kc,
                              g->mr);
            packed_ic = ic;
        }
        int64_t q0 = jg * g->panels_per_group;
        int64_t q1 = q0 + g->panels_per_group < g->npanels ? q0 + g->panels_per_group : g->npanels;
        for (int64_t q = q0; q < q1; q++) {
            int64_t j0 = q * g->nr;
            int64_t nv = g->nc - j0 < g->nr ? g->nc - j0 : g->nr;
            const char *bq = g->bp + (size_t)(q * g->kc * g->nr) * g->es;
            for (int64_t ir = 0; ir < mc; ir += g->mr) {
                int64_t mv = mc - ir < g->mr ? mc - ir : g->mr;
                const char *aq = ap + (size_t)(ir * g->kc) * g->es;
                char *cq = g->c + ((i0 + ir) * g->rsc + (g->jc + j0) * g->csc) * (int64_t)g->es;
                /* the bias of these rows, padded to MR */
                union {
                    float s[16];
                    double d[16];
                } init;
                bool with = g->bias && g->pc == 0;
                for (int64_t i = 0; with && i < g->mr; i++) {
                    const char *bp = g->bias + (i0 + ir + i) * g->sbias * (int64_t)g->es;
                    if (g->es == sizeof(float))
                        init.s[i] = i < mv ? *(const float *)bp : 0.0f;
                    else
                        init.d[i] = i < mv ? *(const double *)bp : 0.0;
                }
                if (g->es == sizeof(float))
                    g->s(g->kc, (const float *)aq, (const float *)bq, (float *)cq, g->rsc, g->csc,
                         mv, nv, g->acc, with ? init.s : NULL);
                else
                    g->d(g->kc, (const double *)aq, (const double *)bq, (double *)cq, g->rsc,
                         g->csc, mv, nv, g->acc, with ? init.d : NULL);
            }
        }
    }
    pack_give(ap);
}

static ndm_status gemm_blocked(ndm_dtype dt, int64_t m, int64_t n, int64_t k, const void *a,
                               int64_t rsa, int64_t csa, const void *b, int64_t rsb, int64_t csb,
                               void *c, int64_t rsc, int64_t csc, bool accumulate,
                               const void *bias, int64_t sbias)
{
    const kernels *kn = cpu_kernels();
    blocked g = {0};
    g.es = ndm_dtype_size(dt);
    g.mr = dt == NDM_F32 ? kn->smr : kn->dmr;
    g.nr = dt == NDM_F32 ? kn->snr : kn->dnr;
    g.mc = (int64_t)g.mr * (dt == NDM_F32 ? 12 : 8);
    g.s = kn->s;
    g.d = kn->d;
    g.m = m, g.n = n, g.k = k;
    g.a = a, g.b = b, g.c = c;
    g.rsa = rsa, g.csa = csa, g.rsb = rsb, g.csb = csb, g.rsc = rsc, g.csc = csc;
    g.bias = bias;
    g.sbias = sbias;
    atomic_init(&g.failed, 0);
    int threads = ndm__num_threads();
    int64_t ncap = n < NC ? n : NC;
    int64_t kcap = k < KC ? k : KC;
    ndm_status st;
    g.bp = pack_take((size_t)(kcap * ((ncap + g.nr - 1) / g.nr) * g.nr) * g.es, &st);
    if (!g.bp)
        return st;
    /* Depth blocks of equal size: a short last block (784 = 3 * 256 + 16)
     * reads and writes all of C for a few products. */
    int64_t kblocks = (k + KC - 1) / KC, kcb = (k + kblocks - 1) / kblocks;
    for (g.jc = 0; g.jc < n; g.jc += NC) {
        g.nc = n - g.jc < NC ? n - g.jc : NC;
        g.npanels = (g.nc + g.nr - 1) / g.nr;
        for (g.pc = 0; g.pc < k; g.pc += kcb) {
            g.kc = k - g.pc < kcb ? k - g.pc : kcb;
            g.acc = accumulate || g.pc > 0;
            /* Packing B is a copy of kc x nc elements; split it when big. */
            ndm__parallel_for(g.npanels, (4096 + g.kc * g.nr - 1) / (g.kc * g.nr), pack_b_range,
                              &g);
            g.nic = (m + g.mc - 1) / g.mc;
            /* Enough tasks for every thread even when A has few row blocks. */
            g.njg = g.nic >= 2 * threads ? 1 : (2 * threads + g.nic - 1) / g.nic;
            if (g.njg > g.npanels)
                g.njg = g.npanels;
            g.panels_per_group = (g.npanels + g.njg - 1) / g.njg;
            g.njg = (g.npanels + g.panels_per_group - 1) / g.panels_per_group;
            /* A task is worth a thread above about 2^18 flops. */
            int64_t flops = 2 * g.mc * g.kc * g.panels_per_group * g.nr;
            int64_t grain = flops >= (1 << 18) ? 1 : ((1 << 18) + flops - 1) / flops;
            ndm__parallel_for(g.nic * g.njg, grain, compute_range, &g);
            if (atomic_load(&g.failed)) {
                pack_give(g.bp);
                return atomic_load(&g.failed);
            }
        }
    }
    pack_give(g.bp);
    return NDM_OK;
}

/* ---- operands packed by the caller ------------------------------------------
 * A convolution multiplies the same weights by every sample's unfolded
 * input: it packs A once per call (ndm__gemm_pack_a) and writes each panel
 * of B straight from its input as the product reaches it, so that no
 * unfolded matrix is written and then copied again. The depth is cut into
 * balanced blocks whose B panel stays in L1; the rows of A into blocks
 * that stay in L2, over which a chunk of B panels is reused. */

#define PANEL_L1_BYTES 24576
#define A_L2_BYTES 262144
#define B_CHUNK_BYTES 131072

static void fill_rows(ndm_dtype dt, int64_t m, int64_t n, void *c, int64_t rsc, int64_t csc,
                      const void *bias, int64_t sbias);

/* The depth blocks for a k of this dtype: *kc each (the last may be
 * shorter). */
static int64_t packed_kc(size_t es, int nr, int64_t k)
{
    int64_t cap = PANEL_L1_BYTES / ((int64_t)nr * (int64_t)es);
    cap = cap < 64 ? 64 : cap > 512 ? 512 : cap;
    if (k <= cap)
        return k > 0 ? k : 1;
    int64_t blocks = (k + cap - 1) / cap;
    return (k + blocks - 1) / blocks;
}

static void packed_shape(ndm_dtype dt, int *mr, int *nr)
{
    const kernels *kn = cpu_kernels();
    *mr = dt == NDM_F32 ? kn->smr : kn->dmr;
    *nr = dt == NDM_F32 ? kn->snr : kn->dnr;
}

size_t ndm__gemm_packed_a_bytes(ndm_dtype dt, int64_t m, int64_t k)
{
    int mr, nr;
    packed_shape(dt, &mr, &nr);
    int64_t mpad = (m + mr - 1) / mr * mr;
    return (size_t)(mpad * (k > 0 ? k : 0)) * ndm_dtype_size(dt);
}

/* Block pc of the depth starts at element pc * mpad; in it, the panel of
 * rows [ir, ir + mr) at ir * kc. */
void ndm__gemm_pack_a(ndm_dtype dt, int64_t m, int64_t k, const void *a, int64_t rsa,
                      int64_t csa, void *dst)
{
    int mr, nr;
    packed_shape(dt, &mr, &nr);
    size_t es = ndm_dtype_size(dt);
    int64_t mpad = (m + mr - 1) / mr * mr, kcb = packed_kc(es, nr, k);
    for (int64_t pc = 0; pc < k; pc += kcb) {
        int64_t kc = k - pc < kcb ? k - pc : kcb;
        const char *src = (const char *)a + pc * csa * (int64_t)es;
        char *d = (char *)dst + (size_t)(pc * mpad) * es;
        if (dt == NDM_F32)
            pack_a_float((float *)d, (const float *)src, rsa, csa, m, kc, mr);
        else
            pack_a_double((double *)d, (const double *)src, rsa, csa, m, kc, mr);
    }
}

void ndm__gemm_matrix_panel(void *ctx, void *dst, int64_t p0, int64_t kc, int64_t j0,
                            int64_t cols, int nr)
{
    const ndm__gemm_matrix *b = ctx;
    const char *src = (const char *)b->data + (p0 * b->rs + j0 * b->cs) * (int64_t)b->es;
    if (b->es == sizeof(float))
        pack_b_float(dst, (const float *)src, b->rs, b->cs, kc, cols, nr);
    else
        pack_b_double(dst, (const double *)src, b->rs, b->cs, kc, cols, nr);
}

static ndm_status gemm_packed_impl(ndm_dtype dt, int64_t m, int64_t n, int64_t k,
                                   const void *ap, ndm__gemm_panel_fn panel, void *ctx, void *c,
                                   int64_t rsc, int64_t csc, const void *bias, int64_t sbias,
                                   unsigned flags)
{
    bool accumulate = flags & NDM__GEMM_ACCUMULATE;
    if (m <= 0 || n <= 0)
        return NDM_OK;
    if (dt != NDM_F32 && dt != NDM_F64)
        return NDM_E_DTYPE;
    if (k <= 0) {
        if (!accumulate)
            fill_rows(dt, m, n, c, rsc, csc, bias, sbias);
        return NDM_OK;
    }
    const kernels *kn = cpu_kernels();
    int mr, nr;
    packed_shape(dt, &mr, &nr);
    size_t es = ndm_dtype_size(dt);
    int64_t mpad = (m + mr - 1) / mr * mr, kcb = packed_kc(es, nr, k);
    int64_t npanels = (n + nr - 1) / nr;
    /* All of A's block in L2: one panel of B at a time, still in L1 when
     * every row block has read it. Else blocks of mc rows over a chunk of
     * panels. */
    int64_t mc = A_L2_BYTES / (kcb * (int64_t)es) / mr * mr;
    mc = mc < mr ? mr : mc;
    int64_t chunk = 1;
    if (mpad > mc) {
        chunk = B_CHUNK_BYTES / (kcb * nr * (int64_t)es);
        chunk = chunk < 1 ? 1 : chunk > npanels ? npanels : chunk;
    } else {
        mc = mpad;
    }
    size_t panel_elems = (size_t)(kcb * nr);
    /* one panel of slack: a panel writer may store a vector past its end */
    ndm_status st;
    char *bp = pack_take((size_t)(chunk + 1) * panel_elems * es, &st);
    if (!bp)
        return st;
    for (int64_t pc = 0; pc < k; pc += kcb) {
        int64_t kc = k - pc < kcb ? k - pc : kcb;
        const char *ablock = (const char *)ap + (size_t)(pc * mpad) * es;
        bool acc = accumulate || pc > 0;
        bool with = bias && pc == 0 && !accumulate;
        for (int64_t q0 = 0; q0 < npanels; q0 += chunk) {
            int64_t q1 = q0 + chunk < npanels ? q0 + chunk : npanels;
            for (int64_t q = q0; q < q1; q++) {
                int64_t j0 = q * nr;
                panel(ctx, bp + (size_t)((q - q0) * kc * nr) * es, pc, kc, j0,
                      n - j0 < nr ? n - j0 : nr, nr);
            }
            for (int64_t i0 = 0; i0 < m; i0 += mc) {
                int64_t i1 = i0 + mc < m ? i0 + mc : m;
                for (int64_t q = q0; q < q1; q++) {
                    int64_t j0 = q * nr;
                    int64_t nv = n - j0 < nr ? n - j0 : nr;
                    const char *bq = bp + (size_t)((q - q0) * kc * nr) * es;
                    for (int64_t ir = i0; ir < i1; ir += mr) {
                        int64_t mv = i1 - ir < mr ? i1 - ir : mr;
                        const char *aq = ablock + (size_t)(ir * kc) * es;
                        char *cq = (char *)c + (ir * rsc + j0 * csc) * (int64_t)es;
                        union {
                            float s[16];
                            double d[16];
                        } init;
                        for (int64_t i = 0; with && i < mr; i++) {
                            const char *b = (const char *)bias + (ir + i) * sbias * (int64_t)es;
                            if (es == sizeof(float))
                                init.s[i] = i < mv ? *(const float *)b : 0.0f;
                            else
                                init.d[i] = i < mv ? *(const double *)b : 0.0;
                        }
                        if (es == sizeof(float))
                            kn->s(kc, (const float *)aq, (const float *)bq, (float *)cq, rsc, csc,
                                  mv, nv, acc, with ? init.s : NULL);
                        else
                            kn->d(kc, (const double *)aq, (const double *)bq, (double *)cq, rsc,
                                  csc, mv, nv, acc, with ? init.d : NULL);
                    }
                }
            }
        }
    }
    pack_give(bp);
    return NDM_OK;
}

/* ---- integers -------------------------------------------------------------
 * int64 with wrapping (unsigned) arithmetic, row by row over the pool. */

typedef struct gemm_i64_ctx {
    int64_t n, k;
    const int64_t *a, *b;
    int64_t *c;
    int64_t rsa, csa, rsb, csb, rsc, csc;
    bool acc;
} gemm_i64_ctx;

static void gemm_i64_rows(void *ctx, int64_t begin, int64_t end)
{
    const gemm_i64_ctx *g = ctx;
    ndm_status st;
    uint64_t *row = (uint64_t *)pack_take((size_t)(g->n ? g->n : 1) * sizeof *row, &st);
    for (int64_t i = begin; i < end; i++) {
        int64_t *ci = g->c + i * g->rsc;
        if (!row) { /* no scratch: accumulate in place, slower but exact */
            for (int64_t j = 0; j < g->n; j++) {
                uint64_t s = g->acc ? (uint64_t)ci[j * g->csc] : 0;
                for (int64_t p = 0; p < g->k; p++)
                    s += (uint64_t)g->a[i * g->rsa + p * g->csa] *
                         (uint64_t)g->b[p * g->rsb + j * g->csb];
                ci[j * g->csc] = (int64_t)s;
            }
            continue;
        }
        for (int64_t j = 0; j < g->n; j++)
            row[j] = g->acc ? (uint64_t)ci[j * g->csc] : 0;
        for (int64_t p = 0; p < g->k; p++) {
            uint64_t aip = (uint64_t)g->a[i * g->rsa + p * g->csa];
            if (!aip)
                continue;
            const int64_t *bp = g->b + p * g->rsb;
            for (int64_t j = 0; j < g->n; j++)
                row[j] += aip * (uint64_t)bp[j * g->csb];
        }
        for (int64_t j = 0; j < g->n; j++)
            ci[j * g->csc] = (int64_t)row[j];
    }
    pack_give(row);
}

/* ---- entry point ------------------------------------------------------------ */

/* C's rows set to the bias (or zeros): typed loops, no call per element. */
#define NDM__FILL_ROWS(T)                                                       \
    static void fill_rows_##T(int64_t m, int64_t n, T *c, int64_t rsc, int64_t csc, \
                              const T *bias, int64_t sbias)                     \
    {                                                                           \
        for (int64_t i = 0; i < m; i++) {                                       \
            T v = bias ? bias[i * sbias] : (T)0;                                \
            T *row = c + i * rsc;                                               \
            if (csc == 1)                                                       \
                for (int64_t j = 0; j < n; j++)                                 \
                    row[j] = v;                                                 \
            else                                                                \
                for (int64_t j = 0; j < n; j++)                                 \
                    row[j * csc] = v;                                           \
        }                                                                       \
    }
NDM__FILL_ROWS(float)
NDM__FILL_ROWS(double)
NDM__FILL_ROWS(int64_t)

static void fill_rows(ndm_dtype dt, int64_t m, int64_t n, void *c, int64_t rsc, int64_t csc,
                      const void *bias, int64_t sbias)
{
    if (dt == NDM_F32)
        fill_rows_float(m, n, c, rsc, csc, bias, sbias);
    else if (dt == NDM_F64)
        fill_rows_double(m, n, c, rsc, csc, bias, sbias);
    else
        fill_rows_int64_t(m, n, c, rsc, csc, bias, sbias);
}

static ndm_status gemm_bias_impl(ndm_dtype dt, int64_t m, int64_t n, int64_t k, const void *a,
                              int64_t rsa, int64_t csa, const void *b, int64_t rsb, int64_t csb,
                              void *c, int64_t rsc, int64_t csc, const void *bias, int64_t sbias,
                              unsigned flags)
{
    bool acc = flags & NDM__GEMM_ACCUMULATE;
    if (m <= 0 || n <= 0)
        return NDM_OK;
    if (k <= 0 || (bias && dt == NDM_I64)) {
        if (!acc)
            fill_rows(dt, m, n, c, rsc, csc, bias, sbias);
        if (k <= 0)
            return NDM_OK;
        acc = acc || bias;
    }
    if (dt == NDM_I64) {
        gemm_i64_ctx g = {n, k, a, b, c, rsa, csa, rsb, csb, rsc, csc, acc};
        double work = (double)n * (double)k;
        int64_t grain = work >= 65536.0 ? 1 : (int64_t)(65536.0 / (work + 1.0)) + 1;
        ndm__parallel_for(m, grain, gemm_i64_rows, &g);
        return NDM_OK;
    }
    if (dt != NDM_F32 && dt != NDM_F64)
        return NDM_E_DTYPE;
    ndm__gemm_epi epi = {acc, bias, sbias, NULL, 0, false};
    if (ndm__gemm_small(dt, m, n, k, a, rsa, csa, b, rsb, csb, c, rsc, csc, &epi))
        return NDM_OK;
#if NDM_HAVE_OPENBLAS || NDM_HAVE_BLIS
    if (!(flags & NDM__GEMM_NO_PROVIDER) && ndm__gemm_uses_provider(m, n, k)) {
        /* the provider adds onto C, so a bias is written first */
        if (bias && !acc)
            fill_rows(dt, m, n, c, rsc, csc, bias, sbias);
        int done = ndm__gemm_provider_run(dt, m, n, k, a, rsa, csa, b, rsb, csb, c, rsc, csc,
                                 acc || bias);
        if (done != 0)
            return done < 0 ? (ndm_status)done : NDM_OK;
        if (bias && !acc) {
            acc = true;
            bias = NULL;
        }
    }
#endif
    return gemm_blocked(dt, m, n, k, a, rsa, csa, b, rsb, csb, c, rsc, csc, acc, bias, sbias);
}

ndm_status ndm__cpu_gemm_bias(ndm_dtype dt, int64_t m, int64_t n, int64_t k, const void *a,
                              int64_t rsa, int64_t csa, const void *b, int64_t rsb, int64_t csb,
                              void *c, int64_t rsc, int64_t csc, const void *bias, int64_t sbias,
                              unsigned flags)
{
    if (__builtin_expect(ndm__gemm_profiling(), 0)) {
        double t0 = ndm__gemm_profile_now();
        ndm_status st = gemm_bias_impl(dt, m, n, k, a, rsa, csa, b, rsb, csb, c, rsc, csc, bias,
                                       sbias, flags);
        ndm__gemm_profile_add(t0);
        return st;
    }
    return gemm_bias_impl(dt, m, n, k, a, rsa, csa, b, rsb, csb, c, rsc, csc, bias, sbias, flags);
}

ndm_status ndm__cpu_gemm(ndm_dtype dt, int64_t m, int64_t n, int64_t k, const void *a,
                         int64_t rsa, int64_t csa, const void *b, int64_t rsb, int64_t csb,
                         void *c, int64_t rsc, int64_t csc, unsigned flags)
{
    return ndm__cpu_gemm_bias(dt, m, n, k, a, rsa, csa, b, rsb, csb, c, rsc, csc, NULL, 0, flags);
}

/* ---- batched matmul (the linalg family) ------------------------------------ */

/* The rows of an operand over (batch..., rows) as one axis, when its strides
 * allow: a single stride for the whole run, or false. */
static bool fold_rows(int nb, const int64_t *shape, const int64_t *strides, int64_t rows,
                      int64_t row_stride, int64_t *out)
{
    int64_t st = rows > 1 ? row_stride : 0;
    int64_t span = rows; /* elements of the folded axis seen so far */
    bool have = rows > 1;
    for (int i = nb - 1; i >= 0; i--) {
        if (shape[i] == 1)
            continue;
        if (!have) {
            /* every inner axis had size 1: this one sets the stride */
            st = strides[i];
            have = true;
            span = shape[i];
            continue;
        }
        if (strides[i] != st * span)
            return false;
        span *= shape[i];
    }
    *out = have ? st : 1;
    return true;
}

typedef struct batch_ctx {
    const ndm__tensor *c, *a, *b;
    int nb;
    int64_t m, n, k;
    unsigned flags;
    atomic_int status;
} batch_ctx;

static void batch_range(void *ctx, int64_t begin, int64_t end)
{
    batch_ctx *g = ctx;
    int nb = g->nb;
    int64_t small[16];
    int64_t *idx = nb <= 16 ? small : malloc((size_t)nb * sizeof *idx);
    if (!idx) {
        atomic_store(&g->status, NDM_E_OOM);
        return;
    }
    size_t es = ndm_dtype_size(g->c->dtype);
    int64_t rem = begin;
    for (int i = nb - 1; i >= 0; i--) {
        idx[i] = rem % g->c->shape[i];
        rem /= g->c->shape[i];
    }
    for (int64_t t = begin; t < end; t++) {
        int64_t oa = 0, ob = 0, oc = 0;
        for (int i = 0; i < nb; i++) {
            oa += idx[i] * g->a->strides[i];
            ob += idx[i] * g->b->strides[i];
            oc += idx[i] * g->c->strides[i];
        }
        const int64_t *sa = g->a->strides + nb, *sb = g->b->strides + nb, *sc = g->c->strides + nb;
        ndm_status st = ndm__cpu_gemm(g->c->dtype, g->m, g->n, g->k,
                                      (const char *)g->a->data + oa * (int64_t)es, sa[0], sa[1],
                                      (const char *)g->b->data + ob * (int64_t)es, sb[0], sb[1],
                                      (char *)g->c->data + oc * (int64_t)es, sc[0], sc[1],
                                      g->flags);
        if (st < 0)
            atomic_store(&g->status, st);
        for (int i = nb - 1; i >= 0; i--) {
            if (++idx[i] < g->c->shape[i])
                break;
            idx[i] = 0;
        }
    }
    if (idx != small)
        free(idx);
}

static ndm_status matmul_common(const ndm__tensor *c, const ndm__tensor *a, const ndm__tensor *b,
                                bool fast)
{
    int nd = c->ndim, nb = nd - 2;
    int64_t m = c->shape[nd - 2], n = c->shape[nd - 1], k = a->shape[nd - 1];
    int64_t batches = 1;
    for (int i = 0; i < nb; i++)
        batches *= c->shape[i];
    if (batches == 0 || m == 0 || n == 0)
        return NDM_OK;
    unsigned flags = fast ? 0 : NDM__GEMM_NO_PROVIDER;
    if (fast && batches > 1) {
        /* b shared by every batch: fold the batch axes into the rows of a
         * and c, so one large product replaces many small ones. */
        bool b_shared = true;
        for (int i = 0; i < nb; i++)
            if (c->shape[i] != 1 && b->strides[i] != 0)
                b_shared = false;
        int64_t rsa, rsc;
        if (b_shared && fold_rows(nb, c->shape, a->strides, m, a->strides[nd - 2], &rsa) &&
            fold_rows(nb, c->shape, c->strides, m, c->strides[nd - 2], &rsc))
            return ndm__cpu_gemm(c->dtype, batches * m, n, k, a->data, rsa, a->strides[nd - 1],
                                 b->data, b->strides[nd - 2], b->strides[nd - 1], c->data, rsc,
                                 c->strides[nd - 1], flags);
    }
    batch_ctx g = {c, a, b, nb, m, n, k, flags, 0};
    atomic_init(&g.status, NDM_OK);
    /* Many small products run side by side, each on one thread with ndm's
     * kernel; large ones run one after the other, each using every core. */
    if (fast && batches >= 2 && (double)m * (double)n * (double)k <= 96.0 * 96.0 * 96.0) {
        g.flags |= NDM__GEMM_NO_PROVIDER;
        ndm__parallel_for(batches, 1, batch_range, &g);
    } else {
        batch_range(&g, 0, batches);
    }
    return (ndm_status)atomic_load(&g.status);
}

static ndm_status cpu_matmul(int device, const ndm__tensor *c, const ndm__tensor *a,
                             const ndm__tensor *b)
{
    (void)device;
    return matmul_common(c, a, b, true);
}

static ndm_status cpu_ref_matmul(int device, const ndm__tensor *c, const ndm__tensor *a,
                                 const ndm__tensor *b)
{
    (void)device;
    return matmul_common(c, a, b, false);
}

const struct ndm__backend_linalg ndm__cpu_linalg = {
    .matmul = cpu_matmul,
    .linear = ndm__cpu_linear,
};

const struct ndm__backend_linalg ndm__cpu_ref_linalg = {
    .matmul = cpu_ref_matmul,
};

/* Profiled whole: the panels its callback writes (a convolution's
 * unfolding) count as GEMM time, as the packing of B does elsewhere. */
ndm_status ndm__gemm_packed(ndm_dtype dt, int64_t m, int64_t n, int64_t k, const void *ap,
                            ndm__gemm_panel_fn panel, void *ctx, void *c, int64_t rsc,
                            int64_t csc, const void *bias, int64_t sbias, unsigned flags)
{
    if (__builtin_expect(ndm__gemm_profiling(), 0)) {
        double t0 = ndm__gemm_profile_now();
        ndm_status st =
            gemm_packed_impl(dt, m, n, k, ap, panel, ctx, c, rsc, csc, bias, sbias, flags);
        ndm__gemm_profile_add(t0);
        return st;
    }
    return gemm_packed_impl(dt, m, n, k, ap, panel, ctx, c, rsc, csc, bias, sbias, flags);
}
