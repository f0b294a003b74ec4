/* CPU fast reductions and softmax: coalesced axes, rows of typed vector
 * loops, work split over the thread pool. The reference kernels are in
 * reduce_ref.c; a reduction of the list with no accumulator class here (a
 * mapped one) runs there. */
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "reduce_cpu.h"
#include "isa.h"
#include "gemm.h"
#include "parallel.h"

#if NDM__CPU_X86
#include <immintrin.h>
#endif

/* exp without a call per element: round x/ln2 to k, a degree-13 Taylor
 * polynomial on |r| <= ln2/2 (error below 1e-17), then scale by 2^k in two
 * halves so that subnormal and overflowing results round once. */
static inline double expd(double x)
{
    if (!(x > -746.0))
        return x != x ? x : 0.0;
    if (x > 710.0)
        return HUGE_VAL;
    const double shift = 6755399441055744.0; /* 1.5 * 2^52: rounds to an integer */
    double kd = (x * 1.4426950408889634 + shift) - shift;
    double r = (x - kd * 6.93147180369123816490e-01) - kd * 1.90821492927058770002e-10;
    double p = 1.0 / 6227020800.0;
    p = p * r + 1.0 / 479001600.0;
    p = p * r + 1.0 / 39916800.0;
    p = p * r + 1.0 / 3628800.0;
    p = p * r + 1.0 / 362880.0;
    p = p * r + 1.0 / 40320.0;
    p = p * r + 1.0 / 5040.0;
    p = p * r + 1.0 / 720.0;
    p = p * r + 1.0 / 120.0;
    p = p * r + 1.0 / 24.0;
    p = p * r + 1.0 / 6.0;
    p = p * r + 0.5;
    p = p * r + 1.0;
    p = p * r + 1.0;
    int64_t k = (int64_t)kd, k1 = k / 2, k2 = k - k1;
    uint64_t b1 = (uint64_t)(k1 + 1023) << 52, b2 = (uint64_t)(k2 + 1023) << 52;
    double s1, s2;
    memcpy(&s1, &b1, sizeof s1);
    memcpy(&s2, &b2, sizeof s2);
    return p * s1 * s2;
}


#define BL 1024

enum {
    C_SUMD, C_SUMI, C_PRODD, C_PRODI, C_MAXD, C_MAXI, C_MIND, C_MINI,
    C_AMAXD, C_AMAXI, C_AMIND, C_AMINI, C_ALL, C_ANY, C_VAR2, C_LSE2,
};
enum { LD_D, LD_I, LD_T }; /* loads as double, as int64, as truth (0/1) */

typedef struct acc1 {
    double d, d2;
    int64_t i, x;
} acc1;

typedef struct blk {
    double d[BL], d2[BL];
    int64_t i[BL], x[BL];
} blk;

typedef double v4d __attribute__((vector_size(32)));
typedef float v4f __attribute__((vector_size(16)));

/* The sum of a contiguous row in four vectors of f64 sums. */
#define NDM__SUM(NAME, T, VT)                                                   \
    static double NAME(const T *x, int64_t n)                                   \
    {                                                                           \
        v4d a0 = {0, 0, 0, 0}, a1 = a0, a2 = a0, a3 = a0;                       \
        int64_t i = 0;                                                          \
        for (; i + 16 <= n; i += 16) {                                          \
            VT f0, f1, f2, f3;                                                  \
            memcpy(&f0, x + i, sizeof f0);                                      \
            memcpy(&f1, x + i + 4, sizeof f1);                                  \
            memcpy(&f2, x + i + 8, sizeof f2);                                  \
            memcpy(&f3, x + i + 12, sizeof f3);                                 \
            a0 += __builtin_convertvector(f0, v4d);                             \
            a1 += __builtin_convertvector(f1, v4d);                             \
            a2 += __builtin_convertvector(f2, v4d);                             \
            a3 += __builtin_convertvector(f3, v4d);                             \
        }                                                                       \
        v4d t = (a0 + a1) + (a2 + a3);                                          \
        double s = (t[0] + t[1]) + (t[2] + t[3]);                               \
        for (; i < n; i++)                                                      \
            s += x[i];                                                          \
        return s;                                                               \
    }
NDM__SUM(sum_f32_c, float, v4f)
NDM__SUM(sum_f64_block_c, double, v4d)

/* acc[j] += rows of x, two rows per pass (f32 or f64, unit stride). */
#define NDM__VSUM(NAME, T, VT)                                                  \
    static void NAME(double *acc, int64_t L, const T *x, int64_t rn, int64_t rs) \
    {                                                                           \
        int64_t r = 0;                                                          \
        for (; r + 2 <= rn; r += 2) {                                           \
            const T *p0 = x + r * rs, *p1 = p0 + rs;                            \
            int64_t j = 0;                                                      \
            for (; j + 4 <= L; j += 4) {                                        \
                VT f0, f1;                                                      \
                v4d a;                                                          \
                memcpy(&f0, p0 + j, sizeof f0);                                 \
                memcpy(&f1, p1 + j, sizeof f1);                                 \
                memcpy(&a, acc + j, sizeof a);                                  \
                a += __builtin_convertvector(f0, v4d) + __builtin_convertvector(f1, v4d); \
                memcpy(acc + j, &a, sizeof a);                                  \
            }                                                                   \
            for (; j < L; j++)                                                  \
                acc[j] += (double)p0[j] + (double)p1[j];                        \
        }                                                                       \
        for (; r < rn; r++)                                                     \
            for (int64_t j = 0; j < L; j++)                                     \
                acc[j] += (double)x[r * rs + j];                                \
    }
NDM__VSUM(vsum_f32_c, float, v4f)
NDM__VSUM(vsum_f64_c, double, v4d)

#if NDM__CPU_X86
/* AVX2 versions: converting f32 to f64 four at a time keeps a sum at the
 * speed of memory, where SSE2 conversions cannot. */
#define NDM__LD_PS(p) _mm256_cvtps_pd(_mm_loadu_ps(p))

#define NDM__SUM_AVX2(NAME, T, LOAD)                                            \
    __attribute__((target("avx2"))) static double NAME(const T *x, int64_t n)   \
    {                                                                           \
        __m256d a0 = _mm256_setzero_pd(), a1 = a0, a2 = a0, a3 = a0;            \
        int64_t i = 0;                                                          \
        for (; i + 16 <= n; i += 16) {                                          \
            a0 = _mm256_add_pd(a0, LOAD(x + i));                                \
            a1 = _mm256_add_pd(a1, LOAD(x + i + 4));                            \
            a2 = _mm256_add_pd(a2, LOAD(x + i + 8));                            \
            a3 = _mm256_add_pd(a3, LOAD(x + i + 12));                           \
        }                                                                       \
        double t[4];                                                            \
        _mm256_storeu_pd(t, _mm256_add_pd(_mm256_add_pd(a0, a1), _mm256_add_pd(a2, a3))); \
        double s = (t[0] + t[1]) + (t[2] + t[3]);                               \
        for (; i < n; i++)                                                      \
            s += x[i];                                                          \
        return s;                                                               \
    }
NDM__SUM_AVX2(sum_f32_avx2, float, NDM__LD_PS)
NDM__SUM_AVX2(sum_f64_block_avx2, double, _mm256_loadu_pd)

/* Four rows per pass, so the accumulators are loaded and stored once per
 * four rows. */
#define NDM__VSUM_AVX2(NAME, T, LOAD)                                           \
    __attribute__((target("avx2"))) static void NAME(double *acc, int64_t L, const T *x, \
                                                     int64_t rn, int64_t rs)    \
    {                                                                           \
        int64_t r = 0;                                                          \
        for (; r + 4 <= rn; r += 4) {                                           \
            const T *p0 = x + r * rs, *p1 = p0 + rs, *p2 = p1 + rs, *p3 = p2 + rs; \
            int64_t j = 0;                                                      \
            for (; j + 4 <= L; j += 4) {                                        \
                __m256d s01 = _mm256_add_pd(LOAD(p0 + j), LOAD(p1 + j));        \
                __m256d s23 = _mm256_add_pd(LOAD(p2 + j), LOAD(p3 + j));        \
                _mm256_storeu_pd(acc + j, _mm256_add_pd(_mm256_loadu_pd(acc + j), \
                                                        _mm256_add_pd(s01, s23))); \
            }                                                                   \
            for (; j < L; j++)                                                  \
                acc[j] += ((double)p0[j] + (double)p1[j]) + ((double)p2[j] + (double)p3[j]); \
        }                                                                       \
        for (; r < rn; r++)                                                     \
            for (int64_t j = 0; j < L; j++)                                     \
                acc[j] += (double)x[r * rs + j];                                \
    }
NDM__VSUM_AVX2(vsum_f32_avx2, float, NDM__LD_PS)
NDM__VSUM_AVX2(vsum_f64_avx2, double, _mm256_loadu_pd)

/* max or min of a contiguous row; NaN if any element is NaN. */
#define NDM__EXTREME_AVX2(NAME, T, LOAD, OP, INIT, CMP)                         \
    __attribute__((target("avx2"))) static double NAME(const T *x, int64_t n)   \
    {                                                                           \
        __m256d m0 = _mm256_set1_pd(INIT), m1 = m0, bad = _mm256_setzero_pd();  \
        int64_t i = 0;                                                          \
        for (; i + 8 <= n; i += 8) {                                            \
            __m256d a = LOAD(x + i), b = LOAD(x + i + 4);                       \
            bad = _mm256_or_pd(bad, _mm256_or_pd(_mm256_cmp_pd(a, a, _CMP_UNORD_Q), \
                                                 _mm256_cmp_pd(b, b, _CMP_UNORD_Q))); \
            m0 = OP(m0, a);                                                     \
            m1 = OP(m1, b);                                                     \
        }                                                                       \
        double t[4];                                                            \
        _mm256_storeu_pd(t, OP(m0, m1));                                        \
        double m = t[0];                                                        \
        for (int j = 1; j < 4; j++)                                             \
            m = t[j] CMP m ? t[j] : m;                                          \
        bool nan = _mm256_movemask_pd(bad) != 0;                                \
        for (; i < n; i++) {                                                    \
            double v = x[i];                                                    \
            nan |= v != v;                                                      \
            m = v CMP m ? v : m;                                                \
        }                                                                       \
        return nan ? NAN : m;                                                   \
    }
NDM__EXTREME_AVX2(max_f32_avx2, float, NDM__LD_PS, _mm256_max_pd, -INFINITY, >)
NDM__EXTREME_AVX2(min_f32_avx2, float, NDM__LD_PS, _mm256_min_pd, INFINITY, <)
NDM__EXTREME_AVX2(max_f64_avx2, double, _mm256_loadu_pd, _mm256_max_pd, -INFINITY, >)
NDM__EXTREME_AVX2(min_f64_avx2, double, _mm256_loadu_pd, _mm256_min_pd, INFINITY, <)

/* The second pass of var: sums of d and d^2 for d = x - mean. */
#define NDM__DEV_AVX2(NAME, T, LOAD)                                            \
    __attribute__((target("avx2,fma"))) static void NAME(const T *x, int64_t n, double mean, \
                                                         double *sd, double *sd2) \
    {                                                                           \
        __m256d mu = _mm256_set1_pd(mean), s0 = _mm256_setzero_pd(), s1 = s0, q0 = s0, q1 = s0; \
        int64_t i = 0;                                                          \
        for (; i + 8 <= n; i += 8) {                                            \
            __m256d a = _mm256_sub_pd(LOAD(x + i), mu), b = _mm256_sub_pd(LOAD(x + i + 4), mu); \
            s0 = _mm256_add_pd(s0, a);                                          \
            s1 = _mm256_add_pd(s1, b);                                          \
            q0 = _mm256_fmadd_pd(a, a, q0);                                     \
            q1 = _mm256_fmadd_pd(b, b, q1);                                     \
        }                                                                       \
        double t[4], u[4];                                                      \
        _mm256_storeu_pd(t, _mm256_add_pd(s0, s1));                             \
        _mm256_storeu_pd(u, _mm256_add_pd(q0, q1));                             \
        double s = (t[0] + t[1]) + (t[2] + t[3]), q = (u[0] + u[1]) + (u[2] + u[3]); \
        for (; i < n; i++) {                                                    \
            double d = (double)x[i] - mean;                                     \
            s += d;                                                             \
            q += d * d;                                                         \
        }                                                                       \
        *sd += s;                                                               \
        *sd2 += q;                                                              \
    }
NDM__DEV_AVX2(dev_f32_avx2, float, NDM__LD_PS)
NDM__DEV_AVX2(dev_f64_avx2, double, _mm256_loadu_pd)
#undef NDM__LD_PS

/* exp of four doubles: the algorithm of expd with FMA; inputs are clamped
 * so that the scale factors stay normal, NaN is put back at the end. */
__attribute__((target("avx2,fma"))) static inline __m256d exp4_avx2(__m256d x)
{
    const __m256d shift = _mm256_set1_pd(6755399441055744.0);
    __m256d xc = _mm256_min_pd(_mm256_max_pd(x, _mm256_set1_pd(-746.0)), _mm256_set1_pd(710.0));
    __m256d kd = _mm256_sub_pd(_mm256_fmadd_pd(xc, _mm256_set1_pd(1.4426950408889634), shift),
                               shift);
    __m256d r = _mm256_fnmadd_pd(kd, _mm256_set1_pd(6.93147180369123816490e-01), xc);
    r = _mm256_fnmadd_pd(kd, _mm256_set1_pd(1.90821492927058770002e-10), r);
    static const double c[] = {1.0 / 6227020800.0, 1.0 / 479001600.0, 1.0 / 39916800.0,
                               1.0 / 3628800.0, 1.0 / 362880.0, 1.0 / 40320.0, 1.0 / 5040.0,
                               1.0 / 720.0, 1.0 / 120.0, 1.0 / 24.0, 1.0 / 6.0, 0.5, 1.0, 1.0};
    __m256d p = _mm256_set1_pd(c[0]);
    for (int i = 1; i < 14; i++)
        p = _mm256_fmadd_pd(p, r, _mm256_set1_pd(c[i]));
    /* 2^k as 2^k1 * 2^k2: the integer k + 1023 sits in the low bits of
     * k + 1.5 * 2^52, whose bit pattern is 0x4338... + k */
    __m256d k1 = _mm256_floor_pd(_mm256_mul_pd(kd, _mm256_set1_pd(0.5)));
    __m256d k2 = _mm256_sub_pd(kd, k1);
    __m256i bias = _mm256_set1_epi64x(0x4338000000000000LL - 1023);
    __m256i e1 = _mm256_slli_epi64(_mm256_sub_epi64(_mm256_castpd_si256(_mm256_add_pd(k1, shift)), bias), 52);
    __m256i e2 = _mm256_slli_epi64(_mm256_sub_epi64(_mm256_castpd_si256(_mm256_add_pd(k2, shift)), bias), 52);
    __m256d y = _mm256_mul_pd(_mm256_mul_pd(p, _mm256_castsi256_pd(e1)), _mm256_castsi256_pd(e2));
    return _mm256_blendv_pd(y, x, _mm256_cmp_pd(x, x, _CMP_UNORD_Q));
}

__attribute__((target("avx2,fma"))) static void exp_row_avx2(double *x, int64_t n)
{
    int64_t i = 0;
    for (; i + 4 <= n; i += 4)
        _mm256_storeu_pd(x + i, exp4_avx2(_mm256_loadu_pd(x + i)));
    for (; i < n; i++)
        x[i] = expd(x[i]);
}
#endif

static void exp_row_c(double *x, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        x[i] = expd(x[i]);
}

/* The row kernels of the CPU level in effect (isa.h). The optional ones (NULL)
 * leave the row to the generic path. */
typedef struct sums {
    double (*f32)(const float *, int64_t);
    double (*f64_block)(const double *, int64_t);
    void (*vf32)(double *, int64_t, const float *, int64_t, int64_t);
    void (*vf64)(double *, int64_t, const double *, int64_t, int64_t);
    void (*exp_row)(double *, int64_t);
    double (*max_f32)(const float *, int64_t), (*min_f32)(const float *, int64_t);
    double (*max_f64)(const double *, int64_t), (*min_f64)(const double *, int64_t);
    void (*dev_f32)(const float *, int64_t, double, double *, double *);
    void (*dev_f64)(const double *, int64_t, double, double *, double *);
} sums;

static const sums *cpu_sums(void)
{
    static const sums portable = {sum_f32_c, sum_f64_block_c, vsum_f32_c, vsum_f64_c, exp_row_c,
                                  NULL, NULL, NULL, NULL, NULL, NULL};
#if NDM__CPU_X86
    static const sums avx2 = {sum_f32_avx2, sum_f64_block_avx2, vsum_f32_avx2, vsum_f64_avx2,
                              exp_row_avx2, max_f32_avx2, min_f32_avx2, max_f64_avx2,
                              min_f64_avx2, dev_f32_avx2, dev_f64_avx2};
    static const sums *const by_level[NDM__CPU_ISA_COUNT] = {&portable, &avx2, &avx2};
    return by_level[ndm__cpu_isa_level()];
#else
    return &portable;
#endif
}

static double sum_f32(const float *x, int64_t n) { return cpu_sums()->f32(x, n); }

/* Blocks of 512 summed in 16 lanes, the block sums combined pairwise (a
 * binary counter of partial sums), so the error grows with log2(n/512). */
static double sum_f64(const double *x, int64_t n)
{
    double (*block)(const double *, int64_t) = cpu_sums()->f64_block;
    double level[64];
    uint64_t count = 0;
    for (int64_t i = 0; i < n; i += 512) {
        double s = block(x + i, n - i < 512 ? n - i : 512);
        int lv = 0;
        for (uint64_t c = count; c & 1; c >>= 1, lv++)
            s += level[lv];
        level[lv] = s;
        count++;
    }
    double total = 0;
    for (int lv = 0; lv < 64; lv++)
        if (count >> lv & 1)
            total += level[lv];
    return total;
}


/* n elements at stride s into a double, int64 or truth buffer. */
static void load_row(int kind, ndm_dtype t, const char *x, int64_t s, int64_t n, double *od,
                     int64_t *oi)
{
    switch (t) {
#define NDM__LOADROW(N, E, T)                                                   \
    case E: {                                                                   \
        const T *p = (const T *)x;                                              \
        if (kind == LD_D)                                                       \
            for (int64_t j = 0; j < n; j++)                                     \
                od[j] = (double)LDX_##N(p[j * s]);                              \
        else if (kind == LD_I)                                                  \
            for (int64_t j = 0; j < n; j++)                                     \
                oi[j] = TOI_##N(p[j * s]);                                      \
        else                                                                    \
            for (int64_t j = 0; j < n; j++)                                     \
                oi[j] = LDX_##N(p[j * s]) != 0;                                 \
        break;                                                                  \
    }
        NDM__CPU_DTYPES(NDM__LOADROW)
#undef NDM__LOADROW
    }
}

static acc1 acc_init(int cls, int64_t r0)
{
    acc1 a = {0, 0, 0, r0};
    switch (cls) {
    case C_PRODD: a.d = 1; break;
    case C_PRODI: a.i = 1; break;
    case C_MAXD: case C_AMAXD: a.d = -INFINITY; break;
    case C_MIND: case C_AMIND: a.d = INFINITY; break;
    case C_MAXI: case C_AMAXI: a.i = INT64_MIN; break;
    case C_MINI: case C_AMINI: a.i = INT64_MAX; break;
    case C_ALL: a.i = 1; break;
    default: break;
    }
    return a;
}

/* Combine the partial `b` (a later part of the range) into `a`. */
static void acc_combine(int cls, acc1 *a, const acc1 *b)
{
    switch (cls) {
    case C_SUMD: case C_LSE2: a->d += b->d; break;
    case C_VAR2: a->d += b->d; a->d2 += b->d2; break;
    case C_SUMI: a->i = (int64_t)((uint64_t)a->i + (uint64_t)b->i); break;
    case C_PRODD: a->d *= b->d; break;
    case C_PRODI: a->i = (int64_t)((uint64_t)a->i * (uint64_t)b->i); break;
    case C_MAXD: if (b->d > a->d || b->d != b->d) a->d = b->d; break;
    case C_MIND: if (b->d < a->d || b->d != b->d) a->d = b->d; break;
    case C_MAXI: if (b->i > a->i) a->i = b->i; break;
    case C_MINI: if (b->i < a->i) a->i = b->i; break;
    case C_AMAXD:
        if (b->d > a->d || (b->d != b->d && a->d == a->d))
            *a = *b;
        break;
    case C_AMIND:
        if (b->d < a->d || (b->d != b->d && a->d == a->d))
            *a = *b;
        break;
    case C_AMAXI: if (b->i > a->i) *a = *b; break;
    case C_AMINI: if (b->i < a->i) *a = *b; break;
    case C_ALL: a->i &= b->i; break;
    case C_ANY: a->i |= b->i; break;
    }
}

/* Fold n loaded elements (indices i0...) into one accumulator. */
static void h_apply(int cls, acc1 *a, const double *xd, const int64_t *xi, int64_t n, int64_t i0,
                    double pre)
{
    switch (cls) {
    case C_SUMD: {
        double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
        int64_t j = 0;
        for (; j + 4 <= n; j += 4) {
            s0 += xd[j];
            s1 += xd[j + 1];
            s2 += xd[j + 2];
            s3 += xd[j + 3];
        }
        for (; j < n; j++)
            s0 += xd[j];
        a->d += (s0 + s1) + (s2 + s3);
        break;
    }
    case C_SUMI: {
        uint64_t s = (uint64_t)a->i;
        for (int64_t j = 0; j < n; j++)
            s += (uint64_t)xi[j];
        a->i = (int64_t)s;
        break;
    }
    case C_PRODD: {
        double p = a->d;
        for (int64_t j = 0; j < n; j++)
            p *= xd[j];
        a->d = p;
        break;
    }
    case C_PRODI: {
        uint64_t p = (uint64_t)a->i;
        for (int64_t j = 0; j < n; j++)
            p *= (uint64_t)xi[j];
        a->i = (int64_t)p;
        break;
    }
    case C_MAXD: {
        /* NaN sticks: nothing compares greater than it, and it replaces anything */
        double m = a->d;
        for (int64_t j = 0; j < n; j++)
            m = (xd[j] > m || xd[j] != xd[j]) ? xd[j] : m;
        a->d = m;
        break;
    }
    case C_MIND: {
        double m = a->d;
        for (int64_t j = 0; j < n; j++)
            m = (xd[j] < m || xd[j] != xd[j]) ? xd[j] : m;
        a->d = m;
        break;
    }
    case C_MAXI: {
        int64_t m = a->i;
        for (int64_t j = 0; j < n; j++)
            m = xi[j] > m ? xi[j] : m;
        a->i = m;
        break;
    }
    case C_MINI: {
        int64_t m = a->i;
        for (int64_t j = 0; j < n; j++)
            m = xi[j] < m ? xi[j] : m;
        a->i = m;
        break;
    }
    case C_AMAXD:
    case C_AMIND: {
        bool mx = cls == C_AMAXD;
        double m = a->d;
        int64_t at = a->x;
        for (int64_t j = 0; j < n; j++) {
            double x = xd[j];
            if ((mx ? x > m : x < m) || (x != x && m == m)) {
                m = x;
                at = i0 + j;
            }
        }
        a->d = m;
        a->x = at;
        break;
    }
    case C_AMAXI:
    case C_AMINI: {
        bool mx = cls == C_AMAXI;
        int64_t m = a->i, at = a->x;
        for (int64_t j = 0; j < n; j++)
            if (mx ? xi[j] > m : xi[j] < m) {
                m = xi[j];
                at = i0 + j;
            }
        a->i = m;
        a->x = at;
        break;
    }
    case C_ALL: {
        int64_t v = a->i;
        for (int64_t j = 0; j < n; j++)
            v &= xi[j];
        a->i = v;
        break;
    }
    case C_ANY: {
        int64_t v = a->i;
        for (int64_t j = 0; j < n; j++)
            v |= xi[j];
        a->i = v;
        break;
    }
    case C_VAR2: {
        double s = a->d, s2 = a->d2;
        for (int64_t j = 0; j < n; j++) {
            double d = xd[j] - pre;
            s += d;
            s2 += d * d;
        }
        a->d = s;
        a->d2 = s2;
        break;
    }
    case C_LSE2: {
        double s = a->d;
        for (int64_t j = 0; j < n; j++)
            s += expd(xd[j] - pre);
        a->d = s;
        break;
    }
    }
}

/* Fold one loaded row (index i0 of the reduction) into L lane accumulators. */
static void v_apply(int cls, blk *b, int64_t L, const double *xd, const int64_t *xi, int64_t i0,
                    const double *pre)
{
    switch (cls) {
    case C_SUMD:
        for (int64_t j = 0; j < L; j++)
            b->d[j] += xd[j];
        break;
    case C_SUMI:
        for (int64_t j = 0; j < L; j++)
            b->i[j] = (int64_t)((uint64_t)b->i[j] + (uint64_t)xi[j]);
        break;
    case C_PRODD:
        for (int64_t j = 0; j < L; j++)
            b->d[j] *= xd[j];
        break;
    case C_PRODI:
        for (int64_t j = 0; j < L; j++)
            b->i[j] = (int64_t)((uint64_t)b->i[j] * (uint64_t)xi[j]);
        break;
    case C_MAXD:
        for (int64_t j = 0; j < L; j++)
            b->d[j] = (xd[j] > b->d[j] || xd[j] != xd[j]) ? xd[j] : b->d[j];
        break;
    case C_MIND:
        for (int64_t j = 0; j < L; j++)
            b->d[j] = (xd[j] < b->d[j] || xd[j] != xd[j]) ? xd[j] : b->d[j];
        break;
    case C_MAXI:
        for (int64_t j = 0; j < L; j++)
            b->i[j] = xi[j] > b->i[j] ? xi[j] : b->i[j];
        break;
    case C_MINI:
        for (int64_t j = 0; j < L; j++)
            b->i[j] = xi[j] < b->i[j] ? xi[j] : b->i[j];
        break;
    case C_AMAXD:
    case C_AMIND: {
        bool mx = cls == C_AMAXD;
        for (int64_t j = 0; j < L; j++) {
            double x = xd[j], m = b->d[j];
            if ((mx ? x > m : x < m) || (x != x && m == m)) {
                b->d[j] = x;
                b->x[j] = i0;
            }
        }
        break;
    }
    case C_AMAXI:
    case C_AMINI: {
        bool mx = cls == C_AMAXI;
        for (int64_t j = 0; j < L; j++)
            if (mx ? xi[j] > b->i[j] : xi[j] < b->i[j]) {
                b->i[j] = xi[j];
                b->x[j] = i0;
            }
        break;
    }
    case C_ALL:
        for (int64_t j = 0; j < L; j++)
            b->i[j] &= xi[j];
        break;
    case C_ANY:
        for (int64_t j = 0; j < L; j++)
            b->i[j] |= xi[j];
        break;
    case C_VAR2:
        for (int64_t j = 0; j < L; j++) {
            double d = xd[j] - pre[j];
            b->d[j] += d;
            b->d2[j] += d * d;
        }
        break;
    case C_LSE2:
        for (int64_t j = 0; j < L; j++)
            b->d[j] += expd(xd[j] - pre[j]);
        break;
    }
}

typedef struct plan {
    ndm__reduce_op op;
    int cls, pre_cls;       /* pre_cls: first pass of var/std/logsumexp, or -1 */
    ndm_dtype st, dt;
    size_t ses, des;
    const char *src;
    char *dst;
    int nk, nr;
    int64_t *ksh, *kss, *kds, *rsh, *rss;
    int64_t K, R, ddof;
    bool outer, int_out;
    int64_t L, nlb;         /* outer: size of the last kept axis, lane blocks along it */
    int64_t groups, split;
    int phase;              /* 0: whole tasks; 1, 2: passes into partials */
    double *pre;            /* split > 1: first-pass results per output */
    acc1 *part;             /* split > 1: split x K partial accumulators */
    atomic_int oom;
} plan;

static int load_kind(int cls)
{
    switch (cls) {
    case C_SUMI: case C_PRODI: case C_MAXI: case C_MINI: case C_AMAXI: case C_AMINI:
        return LD_I;
    case C_ALL: case C_ANY:
        return LD_T;
    default:
        return LD_D;
    }
}

typedef struct scratch {
    double bd[BL];
    int64_t bi[BL];
    int64_t *idx;
    blk b;
} scratch;

static void h_row(const plan *p, scratch *w, int cls, acc1 *a, const char *x, int64_t s,
                  int64_t n, int64_t i0, double pre)
{
    if (cls == C_SUMD && s == 1 && p->st == NDM_F32) {
        a->d += sum_f32((const float *)x, n);
        return;
    }
    if (cls == C_SUMD && s == 1 && p->st == NDM_F64) {
        a->d += sum_f64((const double *)x, n);
        return;
    }
    const sums *k = cpu_sums();
    bool f32 = p->st == NDM_F32, f64 = p->st == NDM_F64;
    if (s == 1 && (f32 || f64)) {
        double (*ext)(const void *, int64_t) = NULL;
        if (cls == C_MAXD)
            ext = f32 ? (double (*)(const void *, int64_t))k->max_f32
                      : (double (*)(const void *, int64_t))k->max_f64;
        if (cls == C_MIND)
            ext = f32 ? (double (*)(const void *, int64_t))k->min_f32
                      : (double (*)(const void *, int64_t))k->min_f64;
        if (ext) {
            /* a NaN already held stays; a NaN in the row replaces anything */
            double v = ext(x, n);
            if (a->d == a->d && (v != v || (cls == C_MAXD ? v > a->d : v < a->d)))
                a->d = v;
            return;
        }
        if (cls == C_VAR2 && (f32 ? k->dev_f32 != NULL : k->dev_f64 != NULL)) {
            if (f32)
                k->dev_f32((const float *)x, n, pre, &a->d, &a->d2);
            else
                k->dev_f64((const double *)x, n, pre, &a->d, &a->d2);
            return;
        }
    }
    int kind = load_kind(cls);
    for (int64_t j0 = 0; j0 < n; j0 += BL) {
        int64_t m = n - j0 < BL ? n - j0 : BL;
        load_row(kind, p->st, x + j0 * s * (int64_t)p->ses, s, m, w->bd, w->bi);
        if (cls == C_LSE2) {
            /* exp over the whole buffer at once, then a plain sum */
            for (int64_t j = 0; j < m; j++)
                w->bd[j] -= pre;
            k->exp_row(w->bd, m);
            h_apply(C_SUMD, a, w->bd, w->bi, m, i0 + j0, pre);
            continue;
        }
        h_apply(cls, a, w->bd, w->bi, m, i0 + j0, pre);
    }
}

static void v_rows(const plan *p, scratch *w, int cls, int64_t L, const char *x, int64_t ks,
                   int64_t rn, int64_t rs, int64_t i0, const double *pre)
{
    if (cls == C_SUMD && ks == 1 && p->st == NDM_F32) {
        cpu_sums()->vf32(w->b.d, L, (const float *)x, rn, rs);
        return;
    }
    if (cls == C_SUMD && ks == 1 && p->st == NDM_F64) {
        cpu_sums()->vf64(w->b.d, L, (const double *)x, rn, rs);
        return;
    }
    int kind = load_kind(cls);
    for (int64_t r = 0; r < rn; r++) {
        load_row(kind, p->st, x + r * rs * (int64_t)p->ses, ks, L, w->bd, w->bi);
        if (cls == C_LSE2) {
            for (int64_t j = 0; j < L; j++)
                w->bd[j] -= pre[j];
            cpu_sums()->exp_row(w->bd, L);
            v_apply(C_SUMD, &w->b, L, w->bd, w->bi, i0 + r, pre);
            continue;
        }
        v_apply(cls, &w->b, L, w->bd, w->bi, i0 + r, pre);
    }
}

/* Visit the reduced positions [r0, r1) as row segments along the last
 * reduced axis: inner layout into `a`, outer layout into the lanes. */
static void walk(const plan *p, scratch *w, int cls, const char *base, int64_t r0, int64_t r1,
                 acc1 *a, int64_t lanes, double pre1, const double *pre)
{
    int nr = p->nr;
    int64_t *idx = w->idx;
    int64_t rem = r0;
    for (int i = nr - 1; i >= 0; i--) {
        idx[i] = rem % p->rsh[i];
        rem /= p->rsh[i];
    }
    int64_t last = p->rsh[nr - 1], rs = p->rss[nr - 1];
    for (int64_t r = r0; r < r1;) {
        int64_t off = odo_offset(idx, nr, p->rss);
        int64_t len = last - idx[nr - 1] < r1 - r ? last - idx[nr - 1] : r1 - r;
        const char *x = base + off * (int64_t)p->ses;
        if (a)
            h_row(p, w, cls, a, x, rs, len, r, pre1);
        else
            v_rows(p, w, cls, lanes, x, p->kss[p->nk - 1], len, rs, r, pre);
        r += len;
        idx[nr - 1] += len;
        for (int i = nr - 1; i > 0 && idx[i] == p->rsh[i]; i--) {
            idx[i] = 0;
            idx[i - 1]++;
        }
    }
}

/* Source and destination offsets (elements) of kept position kflat. */
static void kept_offsets(const plan *p, int64_t kflat, int64_t *so, int64_t *dof)
{
    int64_t s = 0, d = 0;
    for (int i = p->nk - 1; i >= 0; i--) {
        int64_t q = kflat % p->ksh[i];
        kflat /= p->ksh[i];
        s += q * p->kss[i];
        d += q * p->kds[i];
    }
    *so = s;
    *dof = d;
}

static double finish_pre(const plan *p, const acc1 *a)
{
    if (p->pre_cls == C_SUMD)
        return p->R ? a->d / (double)p->R : NAN;
    return a->d;
}

/* The result of one output: the accumulator itself (an int64 value) or the
 * list's finish of it. */
static void finish(const plan *p, const acc1 *a, double pre, double *vd, int64_t *vi)
{
    double s = a->d, e = 0;
    switch (p->cls) {
    case C_AMAXD: case C_AMIND: case C_AMAXI: case C_AMINI:
        *vi = a->x;
        return;
    case C_SUMI: case C_PRODI: case C_MAXI: case C_MINI: case C_ALL: case C_ANY:
        *vi = a->i;
        return;
    case C_VAR2:
        s = a->d2, e = a->d;
        break;
    default:
        break;
    }
    double v = ndm__reduce_finish(p->op, s, e, p->R, p->ddof, pre);
    if (p->int_out)
        *vi = ndm__sat_i64(v);
    else
        *vd = v;
}

static acc1 lane_get(const blk *b, int64_t j)
{
    return (acc1){b->d[j], b->d2[j], b->i[j], b->x[j]};
}

static void lanes_init(blk *b, int cls, int64_t lanes, int64_t r0)
{
    acc1 a = acc_init(cls, r0);
    for (int64_t j = 0; j < lanes; j++) {
        b->d[j] = a.d;
        b->d2[j] = a.d2;
        b->i[j] = a.i;
        b->x[j] = a.x;
    }
}

/* Group g: its first kept position and number of outputs. */
static int64_t group_first(const plan *p, int64_t g, int64_t *lanes)
{
    if (!p->outer) {
        *lanes = 1;
        return g;
    }
    int64_t o = g / p->nlb, lb = g % p->nlb;
    *lanes = p->L - lb * BL < BL ? p->L - lb * BL : BL;
    return o * p->L + lb * BL;
}

static void store_results(const plan *p, int64_t kflat, int64_t lanes, const double *vd,
                          const int64_t *vi)
{
    int64_t so, dof;
    kept_offsets(p, kflat, &so, &dof);
    int64_t ds = p->nk ? p->kds[p->nk - 1] : 0;
    store_row(p->dt, p->dst + dof * (int64_t)p->des, ds, lanes, p->int_out ? NULL : vd, vi);
}

static void run_task(plan *p, scratch *w, int64_t t)
{
    int64_t g = t / p->split, c = t % p->split;
    int64_t q = p->R / p->split, rr = p->R % p->split;
    int64_t r0 = q * c + (c < rr ? c : rr), r1 = r0 + q + (c < rr ? 1 : 0);
    int64_t lanes, kflat = group_first(p, g, &lanes);
    int64_t so, dof;
    kept_offsets(p, kflat, &so, &dof);
    const char *base = p->src + so * (int64_t)p->ses;
    double pre[BL];
    pre[0] = 0;
    double vd[BL];
    int64_t vi[BL];
    if (p->phase == 0) {
        /* the whole reduced range: both passes here, results stored */
        if (p->pre_cls >= 0) {
            if (!p->outer) {
                acc1 a = acc_init(p->pre_cls, r0);
                walk(p, w, p->pre_cls, base, r0, r1, &a, 1, 0, NULL);
                pre[0] = finish_pre(p, &a);
            } else {
                lanes_init(&w->b, p->pre_cls, lanes, r0);
                walk(p, w, p->pre_cls, base, r0, r1, NULL, lanes, 0, NULL);
                for (int64_t j = 0; j < lanes; j++) {
                    acc1 a = lane_get(&w->b, j);
                    pre[j] = finish_pre(p, &a);
                }
            }
        }
        if (!p->outer) {
            acc1 a = acc_init(p->cls, r0);
            walk(p, w, p->cls, base, r0, r1, &a, 1, pre[0], NULL);
            finish(p, &a, pre[0], vd, vi);
        } else {
            lanes_init(&w->b, p->cls, lanes, r0);
            walk(p, w, p->cls, base, r0, r1, NULL, lanes, 0, pre);
            for (int64_t j = 0; j < lanes; j++) {
                acc1 a = lane_get(&w->b, j);
                finish(p, &a, pre[j], vd + j, vi + j);
            }
        }
        store_results(p, kflat, lanes, vd, vi);
        return;
    }
    /* one part of the range into the partials */
    int cls = p->phase == 1 ? p->pre_cls : p->cls;
    acc1 *dst = p->part + c * p->K + kflat;
    if (!p->outer) {
        acc1 a = acc_init(cls, r0);
        walk(p, w, cls, base, r0, r1, &a, 1, p->phase == 2 && p->pre ? p->pre[kflat] : 0, NULL);
        dst[0] = a;
    } else {
        lanes_init(&w->b, cls, lanes, r0);
        walk(p, w, cls, base, r0, r1, NULL, lanes, 0, p->phase == 2 && p->pre ? p->pre + kflat : NULL);
        for (int64_t j = 0; j < lanes; j++)
            dst[j] = lane_get(&w->b, j);
    }
}

static void task_range(void *ctx, int64_t begin, int64_t end)
{
    plan *p = ctx;
    scratch *w = malloc(sizeof *w + (size_t)p->nr * sizeof(int64_t));
    if (!w) {
        atomic_store(&p->oom, 1);
        return;
    }
    w->idx = (int64_t *)(w + 1);
    for (int64_t t = begin; t < end; t++)
        run_task(p, w, t);
    free(w);
}

/* Keep the n axes whose size is not 1, sorted by decreasing |stride| of
 * the first stride array (stably), then merge neighbours that step as one. */
static int coalesce(int n, int64_t *sh, int64_t *s1, int64_t *s2, bool sort)
{
    int m = 0;
    for (int i = 0; i < n; i++) {
        if (sh[i] == 1)
            continue;
        sh[m] = sh[i];
        s1[m] = s1[i];
        if (s2)
            s2[m] = s2[i];
        m++;
    }
    if (sort)
        for (int i = 1; i < m; i++)
            for (int j = i; j > 0 && llabs(s1[j - 1]) < llabs(s1[j]); j--) {
                int64_t t = sh[j];
                sh[j] = sh[j - 1];
                sh[j - 1] = t;
                t = s1[j];
                s1[j] = s1[j - 1];
                s1[j - 1] = t;
                if (s2) {
                    t = s2[j];
                    s2[j] = s2[j - 1];
                    s2[j - 1] = t;
                }
            }
    int k = 0;
    for (int i = 0; i < m; i++) {
        if (k > 0 && s1[k - 1] == s1[i] * sh[i] && (!s2 || s2[k - 1] == s2[i] * sh[i])) {
            sh[k - 1] *= sh[i];
            s1[k - 1] = s1[i];
            if (s2)
                s2[k - 1] = s2[i];
            continue;
        }
        sh[k] = sh[i];
        s1[k] = s1[i];
        if (s2)
            s2[k] = s2[i];
        k++;
    }
    return k;
}

/* The accumulator class of op over dtype t, from the list's accumulator. */
static int main_class(ndm__reduce_op op, ndm_dtype t)
{
    bool i = ndm__reduce_int_acc(op, t);
    switch (ndm__reduce_acc[op]) {
    case NDM__RACC_SUM: return i ? C_SUMI : C_SUMD;
    case NDM__RACC_PROD: return i ? C_PRODI : C_PRODD;
    case NDM__RACC_MAX: return i ? C_MAXI : C_MAXD;
    case NDM__RACC_MIN: return i ? C_MINI : C_MIND;
    case NDM__RACC_ARGMAX: return i ? C_AMAXI : C_AMAXD;
    case NDM__RACC_ARGMIN: return i ? C_AMINI : C_AMIND;
    case NDM__RACC_ALL: return C_ALL;
    case NDM__RACC_ANY: return C_ANY;
    case NDM__RACC_DEV: return C_VAR2;
    case NDM__RACC_LSE: return C_LSE2;
    }
    return C_SUMD;
}

static ndm_status fast_reduce(int device, ndm__reduce_op op, const ndm__tensor *dst,
                              const ndm__tensor *src, int nred, int64_t ddof)
{
    if (ndm__reduce_mapped[op])
        return ndm__cpu_ref_reduce.reduce(device, op, dst, src, nred, ddof);
    int nk0 = dst->ndim;
    plan p = {0};
    p.K = numel(nk0, dst->shape);
    if (p.K == 0)
        return NDM_OK;
    int64_t small[5 * 24];
    int64_t *dims = small;
    if (nk0 + nred + 1 > 24) {
        dims = malloc((size_t)(5 * (nk0 + nred + 1)) * sizeof *dims);
        if (!dims)
            return NDM_E_OOM;
    }
    int cap = nk0 + nred + 1 > 24 ? nk0 + nred + 1 : 24;
    p.ksh = dims, p.kss = dims + cap, p.kds = dims + 2 * cap;
    p.rsh = dims + 3 * cap, p.rss = dims + 4 * cap;
    for (int i = 0; i < nk0; i++) {
        p.ksh[i] = dst->shape[i];
        p.kss[i] = src->strides[i];
        p.kds[i] = dst->strides[i];
    }
    p.R = 1;
    for (int i = 0; i < nred; i++) {
        p.rsh[i] = src->shape[nk0 + i];
        p.rss[i] = src->strides[nk0 + i];
        p.R *= p.rsh[i];
    }
    int acc = ndm__reduce_acc[op];
    bool arg = acc == NDM__RACC_ARGMAX || acc == NDM__RACC_ARGMIN;
    p.nk = coalesce(nk0, p.ksh, p.kss, p.kds, true);
    /* The flat index of argmax/argmin needs the reduced axes in order. */
    p.nr = p.R ? coalesce(nred, p.rsh, p.rss, NULL, !arg) : 0;
    if (p.nr == 0) {
        p.nr = 1;
        p.rsh[0] = 1;
        p.rss[0] = 0;
    }
    p.op = op;
    p.st = src->dtype;
    p.dt = dst->dtype;
    p.ses = ndm_dtype_size(p.st);
    p.des = ndm_dtype_size(p.dt);
    p.src = src->data;
    p.dst = dst->data;
    p.ddof = ddof;
    p.cls = main_class(op, p.st);
    p.pre_cls = p.cls == C_VAR2 ? C_SUMD : p.cls == C_LSE2 ? C_MAXD : -1;
    p.int_out = ndm__reduce_int_value(op, p.st);
    atomic_init(&p.oom, 0);
    p.outer = p.nk > 0 &&
              (p.R < 16 || llabs(p.kss[p.nk - 1]) < llabs(p.rss[p.nr - 1]));
    if (p.outer) {
        p.L = p.ksh[p.nk - 1];
        p.nlb = (p.L + BL - 1) / BL;
        p.groups = p.K / p.L * p.nlb;
    } else {
        p.groups = p.K;
    }
    int threads = ndm__num_threads();
    p.split = 1;
    if (p.groups < threads && p.R >= 65536) {
        p.split = p.R / 32768;
        if (p.split > threads)
            p.split = threads;
    }
    int64_t per_task = (p.R / p.split + 1) * (p.outer ? (p.L < BL ? p.L : BL) : 1);
    int64_t grain = per_task >= 32768 ? 1 : 32768 / per_task;
    ndm_status st = NDM_OK;
    if (p.split == 1) {
        ndm__parallel_for(p.groups, grain, task_range, &p);
    } else {
        st = ndm__scratch_alloc(NDM_DEVICE_CPU, 0, (size_t)(p.split * p.K) * sizeof *p.part,
                                (void **)&p.part);
        if (st >= 0 && p.pre_cls >= 0)
            st = ndm__scratch_alloc(NDM_DEVICE_CPU, 0, (size_t)p.K * sizeof *p.pre,
                                    (void **)&p.pre);
        if (st < 0)
            goto done;
        double vd[1];
        int64_t vi[1];
        for (p.phase = p.pre_cls >= 0 ? 1 : 2; p.phase <= 2; p.phase++) {
            int cls = p.phase == 1 ? p.pre_cls : p.cls;
            ndm__parallel_for(p.groups * p.split, grain, task_range, &p);
            if (atomic_load(&p.oom))
                break;
            for (int64_t k = 0; k < p.K; k++) {
                acc1 a = p.part[k];
                for (int64_t c = 1; c < p.split; c++)
                    acc_combine(cls, &a, &p.part[c * p.K + k]);
                if (p.phase == 1) {
                    p.pre[k] = finish_pre(&p, &a);
                    continue;
                }
                finish(&p, &a, p.pre ? p.pre[k] : 0, vd, vi);
                store_results(&p, k, 1, vd, vi);
            }
        }
    }
    if (atomic_load(&p.oom))
        st = NDM_E_OOM;
done:
    ndm__scratch_free(NDM_DEVICE_CPU, 0, p.pre);
    ndm__scratch_free(NDM_DEVICE_CPU, 0, p.part);
    if (dims != small)
        free(dims);
    return st;
}

/* ---- fast softmax ------------------------------------------------------------ */

typedef struct smx {
    const ndm__tensor *d, *s;
    int axis, nd;
    bool log;
    int64_t n;
    atomic_int oom;
} smx;

static void smx_range(void *ctx, int64_t begin, int64_t end)
{
    smx *c = ctx;
    int nd = c->nd, ax = c->axis;
    int64_t n = c->n;
    void (*exp_row)(double *, int64_t) = cpu_sums()->exp_row;
    double *buf;
    if (ndm__scratch_alloc(NDM_DEVICE_CPU, 0,
                           2 * (size_t)n * sizeof *buf + (size_t)nd * sizeof(int64_t),
                           (void **)&buf) < 0) {
        atomic_store(&c->oom, 1);
        return;
    }
    int64_t *idx = (int64_t *)(buf + 2 * n);
    int64_t rem = begin;
    for (int i = nd - 1; i >= 0; i--) {
        if (i == ax) {
            idx[i] = 0;
            continue;
        }
        idx[i] = rem % c->s->shape[i];
        rem /= c->s->shape[i];
    }
    size_t ses = ndm_dtype_size(c->s->dtype), des = ndm_dtype_size(c->d->dtype);
    for (int64_t line = begin; line < end; line++) {
        const char *x = (const char *)c->s->data + odo_offset(idx, nd, c->s->strides) * (int64_t)ses;
        char *y = (char *)c->d->data + odo_offset(idx, nd, c->d->strides) * (int64_t)des;
        load_row(LD_D, c->s->dtype, x, c->s->strides[ax], n, buf, NULL);
        double m = -INFINITY;
        for (int64_t j = 0; j < n; j++)
            m = (buf[j] > m || buf[j] != buf[j]) ? buf[j] : m;
        double sum = 0;
        for (int64_t j = 0; j < n; j++)
            buf[j] -= m;
        if (c->log) {
            /* exp goes to the second half of the buffer; x - m stays */
            double *e = buf + n;
            memcpy(e, buf, (size_t)n * sizeof *e);
            exp_row(e, n);
            for (int64_t j = 0; j < n; j++)
                sum += e[j];
            double ls = log(sum);
            for (int64_t j = 0; j < n; j++)
                buf[j] -= ls;
        } else {
            exp_row(buf, n);
            for (int64_t j = 0; j < n; j++)
                sum += buf[j];
            for (int64_t j = 0; j < n; j++)
                buf[j] /= sum;
        }
        store_row(c->d->dtype, y, c->d->strides[ax], n, buf, NULL);
        for (int i = nd - 1; i >= 0; i--) {
            if (i == ax)
                continue;
            if (++idx[i] < c->s->shape[i])
                break;
            idx[i] = 0;
        }
    }
    ndm__scratch_free(NDM_DEVICE_CPU, 0, buf);
}

static ndm_status fast_softmax(int device, const ndm__tensor *dst, const ndm__tensor *src,
                               int axis, bool lg)
{
    (void)device;
    smx c = {dst, src, axis, src->ndim, lg, src->shape[axis], 0};
    atomic_init(&c.oom, 0);
    int64_t total = numel(src->ndim, src->shape);
    if (total == 0)
        return NDM_OK;
    int64_t lines = total / c.n;
    int64_t grain = c.n >= 8192 ? 1 : 8192 / c.n;
    ndm__parallel_for(lines, grain, smx_range, &c);
    return atomic_load(&c.oom) ? NDM_E_OOM : NDM_OK;
}

const struct ndm__backend_reduce ndm__cpu_reduce = {
    .reduce = fast_reduce,
    .softmax = fast_softmax,
};
