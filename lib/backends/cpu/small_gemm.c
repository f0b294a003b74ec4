/* Small matrix products (batch-1 and small-batch inference): kernels that read
 * A and B where they lie, and the linear layer's forward with its epilogue. */

#include "../../base/compiler.h"
#include "gemm.h"
#include "isa.h"
#include "parallel.h"
#include "small_gemm.h"

#if NDM__CPU_X86
#include <immintrin.h>
#endif

/* With a few rows of C, packing B costs as much as the product itself, and a
 * provider may repack B on every call. Two forms by B's layout:
 * "dot" when B's columns are contiguous (x @ W^T with W row-major, as a
 * linear layer holds its weight): each C value is a dot product along k,
 * eight columns at a time in eight accumulators, so that each load of A
 * serves eight FMAs, the weight rows stream once, and one transposing
 * reduction finishes eight values. "axpy" when B's rows are contiguous:
 * rows of C accumulate A[i, p] * B[p, :], four vectors wide. */

typedef struct small_ctx {
    int64_t m, k;
    const void *a, *b;
    void *c;
    int64_t rsa, csa, rsb, csb, rsc, csc;
    ndm__gemm_epi e;
    bool rev; /* the dot form takes its groups last to first */
} small_ctx;

/* The dot form's group of columns; the parallel split keeps groups whole. */
#define GROUP 8

/* C[i][j] from the product's value r, through the epilogue (small_gemm.h). */
#define NDM__SMALL_OUT(T)                                                       \
    static inline void out_##T(const small_ctx *g, int64_t i, int64_t j, T *cij, T r) \
    {                                                                           \
        const ndm__gemm_epi *e = &g->e;                                         \
        T v = (e->acc ? *cij : e->bias ? ((const T *)e->bias)[i * e->sbias] : (T)0) + r; \
        if (e->cbias)                                                           \
            v += ((const T *)e->cbias)[j * e->scbias];                          \
        if (e->relu)                                                            \
            v = v < 0 ? (T)0 : v;                                               \
        *cij = v;                                                               \
    }
NDM__SMALL_OUT(float)
NDM__SMALL_OUT(double)

/* The dot form's nj values r of row i from column j, through the epilogue.
 * A whole group with contiguous C and bias takes fixed-length loops the
 * compiler turns into a few vector instructions, the branches taken once. */
#define NDM__SMALL_OUT8(T)                                                      \
    static inline void out8_##T(const small_ctx *g, int64_t i, int64_t j, int64_t nj, \
                                const T *r)                                     \
    {                                                                           \
        const ndm__gemm_epi *e = &g->e;                                         \
        T *ci = (T *)g->c + i * g->rsc + j * g->csc;                            \
        if (nj < GROUP || g->csc != 1 || (e->cbias && e->scbias != 1)) {        \
            for (int64_t q = 0; q < nj; q++)                                    \
                out_##T(g, i, j + q, ci + q * g->csc, r[q]);                    \
            return;                                                             \
        }                                                                       \
        T v[GROUP];                                                             \
        if (e->acc) {                                                           \
            for (int q = 0; q < GROUP; q++)                                     \
                v[q] = ci[q] + r[q];                                            \
        } else {                                                                \
            T start = e->bias ? ((const T *)e->bias)[i * e->sbias] : (T)0;      \
            for (int q = 0; q < GROUP; q++)                                     \
                v[q] = start + r[q];                                            \
        }                                                                       \
        if (e->cbias) {                                                         \
            const T *cb = (const T *)e->cbias + j;                              \
            for (int q = 0; q < GROUP; q++)                                     \
                v[q] += cb[q];                                                  \
        }                                                                       \
        if (e->relu)                                                            \
            for (int q = 0; q < GROUP; q++)                                     \
                v[q] = v[q] < 0 ? (T)0 : v[q];                                  \
        for (int q = 0; q < GROUP; q++)                                         \
            ci[q] = v[q];                                                       \
    }
NDM__SMALL_OUT8(float)
NDM__SMALL_OUT8(double)

/* The axpy form writes a row's start value and accumulates onto it; the
 * column bias and relu follow, once the row's sums are complete. */
#define NDM__SMALL_POST(T)                                                      \
    static void post_##T(const small_ctx *g, T *ci, int64_t j0, int64_t j1)     \
    {                                                                           \
        const ndm__gemm_epi *e = &g->e;                                         \
        if (!e->cbias && !e->relu)                                              \
            return;                                                             \
        for (int64_t j = j0; j < j1; j++) {                                     \
            T v = ci[j];                                                        \
            if (e->cbias)                                                       \
                v += ((const T *)e->cbias)[j * e->scbias];                      \
            if (e->relu)                                                        \
                v = v < 0 ? (T)0 : v;                                           \
            ci[j] = v;                                                          \
        }                                                                       \
    }
NDM__SMALL_POST(float)
NDM__SMALL_POST(double)

/* The value a row of the axpy form starts from (when not accumulating). */
#define NDM__SMALL_START(T, g, i)                                               \
    ((g)->e.bias ? ((const T *)(g)->e.bias)[(i) * (g)->e.sbias] : (T)0)

/* Portable forms: the same loop order, one lane. */
#define NDM__SMALL_REF(T, SUF)                                                  \
    static void small_dot_##SUF##_ref(const small_ctx *g, int64_t j0, int64_t j1) \
    {                                                                           \
        const T *a = g->a, *b = g->b;                                           \
        T *c = g->c;                                                            \
        for (int64_t i = 0; i < g->m; i++)                                      \
            for (int64_t t = j0; t < j1; t++) {                                 \
                int64_t j = g->rev ? j0 + j1 - 1 - t : t;                       \
                const T *ai = a + i * g->rsa, *bj = b + j * g->csb;             \
                T s = 0;                                                        \
                for (int64_t p = 0; p < g->k; p++)                              \
                    s += ai[p] * bj[p];                                         \
                out_##T(g, i, j, c + i * g->rsc + j * g->csc, s);               \
            }                                                                   \
    }                                                                           \
    static void small_axpy_##SUF##_ref(const small_ctx *g, int64_t j0, int64_t j1) \
    {                                                                           \
        const T *a = g->a, *b = g->b;                                           \
        T *c = g->c;                                                            \
        for (int64_t i = 0; i < g->m; i++) {                                    \
            T *ci = c + i * g->rsc;                                             \
            if (!g->e.acc)                                                      \
                for (int64_t j = j0; j < j1; j++)                               \
                    ci[j] = NDM__SMALL_START(T, g, i);                          \
            for (int64_t p = 0; p < g->k; p++) {                                \
                T aip = a[i * g->rsa + p * g->csa];                             \
                const T *bp = b + p * g->rsb;                                   \
                for (int64_t j = j0; j < j1; j++)                               \
                    ci[j] += aip * bp[j];                                       \
            }                                                                   \
            post_##T(g, ci, j0, j1);                                            \
        }                                                                       \
    }
NDM__SMALL_REF(float, s)
NDM__SMALL_REF(double, d)

#if NDM__CPU_X86
/* Eight accumulators to their eight sums, r[q] = sum of s[q]'s lanes, with a
 * transposing tree of pairwise additions: no horizontal sum per value. */
__attribute__((target("avx2"))) static inline void red8_s_avx2(const __m256 *s, float *r)
{
    /* hadd(a, b) = a01 a23 b01 b23 | a45 a67 b45 b67 */
    __m256 t0 = _mm256_hadd_ps(s[0], s[1]), t1 = _mm256_hadd_ps(s[2], s[3]);
    __m256 t2 = _mm256_hadd_ps(s[4], s[5]), t3 = _mm256_hadd_ps(s[6], s[7]);
    /* u0 = the low halves' sums of s0..s3 | their high halves' sums */
    __m256 u0 = _mm256_hadd_ps(t0, t1), u1 = _mm256_hadd_ps(t2, t3);
    __m256 v = _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20),
                             _mm256_permute2f128_ps(u0, u1, 0x31));
    _mm256_storeu_ps(r, v);
}

__attribute__((target("avx2"))) static inline void red8_d_avx2(const __m256d *s, double *r)
{
    for (int h = 0; h < 2; h++, s += 4, r += 4) {
        /* hadd(a, b) = a01 b01 | a23 b23 */
        __m256d t0 = _mm256_hadd_pd(s[0], s[1]), t1 = _mm256_hadd_pd(s[2], s[3]);
        __m256d v = _mm256_add_pd(_mm256_permute2f128_pd(t0, t1, 0x20),
                                  _mm256_permute2f128_pd(t0, t1, 0x31));
        _mm256_storeu_pd(r, v);
    }
}

/* AVX-512: fold each accumulator's halves, then the AVX2 tree. */
__attribute__((target("avx512f"))) static inline void red8_s_avx512(const __m512 *s, float *r)
{
    __m256 h[8];
    for (int q = 0; q < 8; q++)
        h[q] = _mm256_add_ps(_mm512_castps512_ps256(s[q]),
                             _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(s[q]), 1)));
    red8_s_avx2(h, r);
}

__attribute__((target("avx512f"))) static inline void red8_d_avx512(const __m512d *s, double *r)
{
    __m256d h[8];
    for (int q = 0; q < 8; q++)
        h[q] = _mm256_add_pd(_mm512_castpd512_pd256(s[q]), _mm512_extractf64x4_pd(s[q], 1));
    red8_d_avx2(h, r);
}

/* Loads of the last k % L values: masked lanes read nothing, so the tail
 * needs no scalar loop and never reads past the operands. */
#define TAIL_MASK_s_avx2(rem)                                                   \
    _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(rem)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7))
#define TAIL_LOAD_s_avx2(p, mask) _mm256_maskload_ps((p), (mask))
#define TAIL_MASK_d_avx2(rem)                                                   \
    _mm256_cmpgt_epi64(_mm256_set1_epi64x((long long)(rem)), _mm256_setr_epi64x(0, 1, 2, 3))
#define TAIL_LOAD_d_avx2(p, mask) _mm256_maskload_pd((p), (mask))
#define TAIL_MASK_s_avx512(rem) ((__mmask16)((1u << (rem)) - 1u))
#define TAIL_LOAD_s_avx512(p, mask) _mm512_maskz_loadu_ps((mask), (p))
#define TAIL_MASK_d_avx512(rem) ((__mmask8)((1u << (rem)) - 1u))
#define TAIL_LOAD_d_avx512(p, mask) _mm512_maskz_loadu_pd((mask), (p))

/* SIMD forms. V the vector type, L its lanes, P the intrinsics' prefix
 * (_mm256, _mm512), X their suffix (ps, pd), M the tail mask's type, TGT the
 * target. The dot form takes eight columns of B (rows of W) at a time, the
 * last group's missing columns repeating its last one (computed, not
 * stored); k runs two vectors per step, then one, then a masked tail. */
#define NDM__SMALL_SIMD(T, SUF, LVL, V, L, P, X, M, TGT)                        \
    __attribute__((target(TGT))) static void small_dot_##SUF##_##LVL(          \
        const small_ctx *g, int64_t j0, int64_t j1)                             \
    {                                                                           \
        const T *a = g->a, *b = g->b;                                           \
        int64_t k = g->k, csb = g->csb, k1 = k / L * L, k2 = k / (2 * L) * (2 * L); \
        M tail = TAIL_MASK_##SUF##_##LVL(k - k1);                               \
        int64_t groups = (j1 - j0 + GROUP - 1) / GROUP;                         \
        for (int64_t t = 0; t < groups; t++) {                                  \
            int64_t j = j0 + (g->rev ? groups - 1 - t : t) * GROUP;             \
            int64_t nj = j1 - j < GROUP ? j1 - j : GROUP;                       \
            const T *bq[GROUP];                                                 \
            for (int q = 0; q < GROUP; q++)                                     \
                bq[q] = b + (j + (q < nj ? q : nj - 1)) * csb;                  \
            for (int64_t i = 0; i < g->m; i++) {                                \
                const T *ai = a + i * g->rsa;                                   \
                V s[GROUP];                                                     \
                _Pragma("GCC unroll 8") for (int q = 0; q < GROUP; q++)         \
                    s[q] = P##_setzero_##X();                                   \
                int64_t p = 0;                                                  \
                for (; p < k2; p += 2 * L) {                                    \
                    V x0 = P##_loadu_##X(ai + p), x1 = P##_loadu_##X(ai + p + L); \
                    _Pragma("GCC unroll 8") for (int q = 0; q < GROUP; q++)     \
                    {                                                           \
                        s[q] = P##_fmadd_##X(x0, P##_loadu_##X(bq[q] + p), s[q]); \
                        s[q] = P##_fmadd_##X(x1, P##_loadu_##X(bq[q] + p + L), s[q]); \
                    }                                                           \
                }                                                               \
                if (p < k1) {                                                   \
                    V x0 = P##_loadu_##X(ai + p);                               \
                    _Pragma("GCC unroll 8") for (int q = 0; q < GROUP; q++)     \
                        s[q] = P##_fmadd_##X(x0, P##_loadu_##X(bq[q] + p), s[q]); \
                }                                                               \
                if (k1 < k) {                                                   \
                    V x0 = TAIL_LOAD_##SUF##_##LVL(ai + k1, tail);              \
                    _Pragma("GCC unroll 8") for (int q = 0; q < GROUP; q++)     \
                        s[q] = P##_fmadd_##X(x0, TAIL_LOAD_##SUF##_##LVL(bq[q] + k1, tail), \
                                             s[q]);                             \
                }                                                               \
                T r[GROUP];                                                     \
                red8_##SUF##_##LVL(s, r);                                       \
                out8_##T(g, i, j, nj, r);                                       \
            }                                                                   \
        }                                                                       \
    }                                                                           \
    __attribute__((target(TGT))) static void small_axpy_##SUF##_##LVL(         \
        const small_ctx *g, int64_t j0, int64_t j1)                             \
    {                                                                           \
        const T *a = g->a, *b = g->b;                                           \
        T *c = g->c;                                                            \
        bool acc = g->e.acc;                                                    \
        for (int64_t i = 0; i < g->m; i++) {                                    \
            T *ci = c + i * g->rsc;                                             \
            const T *ai = a + i * g->rsa;                                       \
            T start = acc ? 0 : NDM__SMALL_START(T, g, i);                      \
            int64_t j = j0;                                                     \
            for (; j + 4 * L <= j1; j += 4 * L) {                               \
                V s0 = P##_set1_##X(start), s1 = s0, s2 = s0, s3 = s0;          \
                if (acc) {                                                      \
                    s0 = P##_loadu_##X(ci + j), s1 = P##_loadu_##X(ci + j + L);  \
                    s2 = P##_loadu_##X(ci + j + 2 * L);                         \
                    s3 = P##_loadu_##X(ci + j + 3 * L);                         \
                }                                                               \
                const T *bp = b + j;                                            \
                for (int64_t p = 0; p < g->k; p++, bp += g->rsb) {              \
                    V x = P##_set1_##X(ai[p * g->csa]);                         \
                    s0 = P##_fmadd_##X(x, P##_loadu_##X(bp), s0);               \
                    s1 = P##_fmadd_##X(x, P##_loadu_##X(bp + L), s1);           \
                    s2 = P##_fmadd_##X(x, P##_loadu_##X(bp + 2 * L), s2);       \
                    s3 = P##_fmadd_##X(x, P##_loadu_##X(bp + 3 * L), s3);       \
                }                                                               \
                P##_storeu_##X(ci + j, s0), P##_storeu_##X(ci + j + L, s1);     \
                P##_storeu_##X(ci + j + 2 * L, s2), P##_storeu_##X(ci + j + 3 * L, s3); \
            }                                                                   \
            for (; j + L <= j1; j += L) {                                       \
                V s0 = acc ? P##_loadu_##X(ci + j) : P##_set1_##X(start);       \
                const T *bp = b + j;                                            \
                for (int64_t p = 0; p < g->k; p++, bp += g->rsb)                \
                    s0 = P##_fmadd_##X(P##_set1_##X(ai[p * g->csa]), P##_loadu_##X(bp), s0); \
                P##_storeu_##X(ci + j, s0);                                     \
            }                                                                   \
            for (; j < j1; j++) {                                               \
                T s = acc ? ci[j] : start;                                      \
                for (int64_t p = 0; p < g->k; p++)                              \
                    s += ai[p * g->csa] * b[p * g->rsb + j];                    \
                ci[j] = s;                                                      \
            }                                                                   \
            post_##T(g, ci, j0, j1);                                            \
        }                                                                       \
    }
NDM__SMALL_SIMD(float, s, avx2, __m256, 8, _mm256, ps, __m256i, "avx2,fma")
NDM__SMALL_SIMD(double, d, avx2, __m256d, 4, _mm256, pd, __m256i, "avx2,fma")
NDM__SMALL_SIMD(float, s, avx512, __m512, 16, _mm512, ps, __mmask16, "avx512f")
NDM__SMALL_SIMD(double, d, avx512, __m512d, 8, _mm512, pd, __mmask8, "avx512f")
#endif

typedef void (*small_fn)(const small_ctx *g, int64_t j0, int64_t j1);

/* ---- the dot form's direction ------------------------------------------------ */

/* A model's weights can outgrow L2 (an MLP's 784x256 layer holds 800 KB, a
 * core's L2 512 KB). Read first to last on every call, each call evicts the
 * rows the next one starts with, and all of them come from L3; read in the
 * other direction over the same B on every other call, the rows the last
 * call read last, still in L2, come first. Each value's reduction is the
 * same in both directions, so no bit of C changes. The calling thread keeps
 * its few most recent large Bs, most recent first, each with the direction
 * its last product took: no lock, no atomic, each thread alternates its
 * own. Bs below NDM__GEMM_SMALL_ALTERNATE_BYTES (small_gemm.h) stay in L2
 * anyway and take no slot. */
#define DIR_SLOTS 4

typedef struct dir_state {
    const void *b[DIR_SLOTS];
    unsigned rev; /* bit s: b[s]'s last product ran last to first */
} dir_state;

static _Thread_local dir_state dir NDM__TLS_MODEL;

static int dir_find(const void *b)
{
    int s = 0;
    while (s < DIR_SLOTS && dir.b[s] != b)
        s++;
    return s;
}

/* The direction of this product over b, recorded for the next one. */
static bool dir_take(const void *b)
{
    int s = dir_find(b);
    bool rev = s < DIR_SLOTS && !((dir.rev >> s) & 1u);
    /* b to the front; those before its slot (or all, a new b evicting the
     * oldest) one back */
    int last = s < DIR_SLOTS ? s : DIR_SLOTS - 1;
    for (int t = last; t > 0; t--)
        dir.b[t] = dir.b[t - 1];
    dir.b[0] = b;
    unsigned below = (1u << last) - 1u, above = ~((2u << last) - 1u);
    dir.rev = (dir.rev & above) | ((dir.rev & below) << 1) | (unsigned)rev;
    return rev;
}

bool ndm__gemm_small_next_reversed(const void *b)
{
    int s = dir_find(b);
    return s < DIR_SLOTS && !((dir.rev >> s) & 1u);
}

typedef struct small_job {
    small_ctx g;
    small_fn fn;
    int64_t n;
} small_job;

/* begin and end count blocks of 64 columns: every chunk but the last keeps
 * the dot form's groups and the axpy form's vectors whole. */
static void small_range(void *ctx, int64_t begin, int64_t end)
{
    const small_job *q = ctx;
    q->fn(&q->g, begin * 64, end * 64 < q->n ? end * 64 : q->n);
}

bool ndm__gemm_small(ndm_dtype dt, int64_t m, int64_t n, int64_t k, const void *a, int64_t rsa,
                     int64_t csa, const void *b, int64_t rsb, int64_t csb, void *c, int64_t rsc,
                     int64_t csc, const ndm__gemm_epi *e)
{
    if (m < 1 || n < 1 || k < 1 || m > NDM__GEMM_SMALL_M || (dt != NDM_F32 && dt != NDM_F64))
        return false;
    /* sizes of 1 leave their stride free */
    if (m == 1)
        rsa = rsc = 0;
    if (k == 1)
        csa = 1, rsb = 1;
    if (n == 1)
        csb = 1, csc = 1;
    bool dot = rsb == 1 && csa == 1;
    bool axpy = !dot && csb == 1 && csc == 1;
    if (!dot && !axpy)
        return false;
    int level = ndm__cpu_isa_level();
    bool s = dt == NDM_F32;
    bool rev = dot && ((n - 1) * csb + k) * (s ? 4 : 8) >= NDM__GEMM_SMALL_ALTERNATE_BYTES &&
               dir_take(b);
    small_job q = {{m, k, a, b, c, rsa, csa, rsb, csb, rsc, csc, *e, rev}, NULL, n};
#if NDM__CPU_X86
    if (level == NDM__CPU_ISA_AVX512)
        q.fn = dot ? (s ? small_dot_s_avx512 : small_dot_d_avx512)
                   : (s ? small_axpy_s_avx512 : small_axpy_d_avx512);
    else if (level == NDM__CPU_ISA_AVX2)
        q.fn = dot ? (s ? small_dot_s_avx2 : small_dot_d_avx2)
                   : (s ? small_axpy_s_avx2 : small_axpy_d_avx2);
#else
    (void)level;
#endif
    if (!q.fn)
        q.fn = dot ? (s ? small_dot_s_ref : small_dot_d_ref)
                   : (s ? small_axpy_s_ref : small_axpy_d_ref);
    /* Chunks of about 2^16 multiply-adds: a thread is worth it only for the
     * large layers. */
    int64_t per_block = 64 * (m * k + 1);
    int64_t blocks = (n + 63) / 64, grain = (65536 + per_block - 1) / per_block;
    if (grain >= blocks)
        q.fn(&q.g, 0, n);
    else
        ndm__parallel_for(blocks, grain, small_range, &q);
    return true;
}

/* ---- the linear layer ------------------------------------------------------- */

/* The epilogue as a pass over y, after a product the small path declined. */
#define NDM__LINEAR_PASS(T)                                                     \
    static void linear_pass_##T(const ndm__tensor *y, const ndm__tensor *b, bool relu) \
    {                                                                           \
        int64_t m = y->shape[0], n = y->shape[1];                               \
        const T *bias = b ? b->data : NULL;                                     \
        int64_t sb = b ? b->strides[0] : 0;                                     \
        for (int64_t i = 0; i < m; i++) {                                       \
            T *row = (T *)y->data + i * y->strides[0];                          \
            for (int64_t j = 0; j < n; j++) {                                   \
                T v = row[j * y->strides[1]];                                   \
                if (bias)                                                       \
                    v += bias[j * sb];                                          \
                if (relu)                                                       \
                    v = v < 0 ? (T)0 : v;                                       \
                row[j * y->strides[1]] = v;                                     \
            }                                                                   \
        }                                                                       \
    }
NDM__LINEAR_PASS(float)
NDM__LINEAR_PASS(double)

ndm_status ndm__cpu_linear(int device, const ndm__tensor *y, const ndm__tensor *x,
                           const ndm__tensor *w, const ndm__tensor *b, bool relu)
{
    (void)device;
    ndm_dtype dt = y->dtype;
    if (dt != NDM_F32 && dt != NDM_F64)
        return NDM_E_UNSUPPORTED;
    int64_t m = x->shape[0], k = x->shape[1], n = w->shape[0];
    if (m == 0 || n == 0)
        return NDM_OK;
    /* B = w^T: B[p][j] = w[j][p] */
    int64_t rsb = w->strides[1], csb = w->strides[0];
    ndm__gemm_epi e = {false, NULL, 0, b ? b->data : NULL, b ? b->strides[0] : 0, relu};
    if (k > 0 && ndm__gemm_small(dt, m, n, k, x->data, x->strides[0], x->strides[1], w->data, rsb,
                                 csb, y->data, y->strides[0], y->strides[1], &e))
        return NDM_OK;
    /* the product as matmul runs it, then the bias and relu in one pass */
    ndm_status st = ndm__cpu_gemm(dt, m, n, k, x->data, x->strides[0], x->strides[1], w->data,
                                  rsb, csb, y->data, y->strides[0], y->strides[1], 0);
    if (st < 0)
        return st;
    if (b || relu) {
        if (dt == NDM_F32)
            linear_pass_float(y, b, relu);
        else
            linear_pass_double(y, b, relu);
    }
    return NDM_OK;
}
