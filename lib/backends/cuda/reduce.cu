/* CUDA reductions over trailing axes and softmax: groups of 1, 32 or 256
 * threads per output folding accumulators in a shared-memory tree, and a
 * fixed two-pass split of the reduced range when the outputs are too few. */
#include <math.h>
#include <stdlib.h>

#include "iter.cuh"
#include "reduce.cuh"

/* The operation list is C; its static assertions are spelled for C++ here. */
extern "C" {
#define _Static_assert static_assert
#include "../reduce.h"
#undef _Static_assert
}

/* ---- accumulators ---------------------------------------------------------------
 *
 * One accumulator type for every kind, so that partial results have one
 * layout in shared memory and in the scratch of the two-pass split. Kinds:
 * what is folded, per element; the operation (a runtime value) says how the
 * result is finished. Every combine is associative and commutative (max and
 * min break ties on the smaller position), so the tree's shape does not
 * change a result but for the rounding of float sums. */

enum {
    K_SUMD,   /* d: sum of doubles (sum and mean of floats, the mean of var) */
    K_SUMI,   /* i: wrapping int64 sum */
    K_PRODD,  /* d: product of doubles */
    K_PRODI,  /* i: wrapping int64 product */
    K_EXTD,   /* d, at, i = NaN seen: max/min/argmax/argmin of floats, the max of logsumexp */
    K_EXTI,   /* i, at: max/min/argmax/argmin of integers */
    K_LOGIC,  /* i: all (and) or any (or) */
    K_DEV,    /* d = sum of (x - mean)^2, e = sum of (x - mean): var and std */
    K_EXPS,   /* d = sum of exp(x - max): logsumexp */
    K_COUNT
};

typedef struct ndm__red_acc {
    double d, e;
    int64_t i, at;
} ndm__red_acc;

/* What one launch computes: `op` names the list's row (its map and
 * finish), the flags pick the flavour of the kind. */
typedef struct ndm__red_how {
    ndm__reduce_op op;
    bool mx;     /* max/argmax (not min) */
    bool all;    /* all (not any) */
    bool arg;    /* the result is the position */
    bool mapped; /* elements pass through the list's map */
    bool pre;    /* the first pass of DEV (the mean) or LSE (the max) */
} ndm__red_how;

template <int KIND> NDM__HD ndm__red_acc red_init(const ndm__red_how &h)
{
    ndm__red_acc a;
    a.d = KIND == K_PRODD ? 1.0 : 0.0;
    a.e = 0.0;
    a.i = KIND == K_PRODI ? 1 : KIND == K_LOGIC ? (h.all ? 1 : 0) : 0;
    a.at = -1;
    return a;
}

/* Fold element x (position r of the reduced range, C order). */
template <int KIND> NDM__HD void red_push_d(ndm__red_acc &a, double x, int64_t r,
                                            const ndm__red_how &h, double aux)
{
    if (KIND == K_SUMD) {
        a.d += x;
    } else if (KIND == K_PRODD) {
        a.d *= x;
    } else if (KIND == K_EXTD) {
        if (a.i)
            return;
        if (x != x) {
            a.i = 1;
            a.d = x;
            a.at = r;
        } else if (a.at < 0 || (h.mx ? x > a.d : x < a.d)) {
            a.d = x;
            a.at = r;
        }
    } else if (KIND == K_DEV) {
        double dv = x - aux;
        a.d += dv * dv;
        a.e += dv;
    } else if (KIND == K_EXPS) {
        a.d += exp(x - aux);
    }
}

template <int KIND> NDM__HD void red_push_i(ndm__red_acc &a, int64_t x, int64_t r,
                                            const ndm__red_how &h)
{
    if (KIND == K_SUMI) {
        a.i = (int64_t)((uint64_t)a.i + (uint64_t)x);
    } else if (KIND == K_PRODI) {
        a.i = (int64_t)((uint64_t)a.i * (uint64_t)x);
    } else if (KIND == K_EXTI) {
        if (a.at < 0 || (h.mx ? x > a.i : x < a.i)) {
            a.i = x;
            a.at = r;
        }
    } else if (KIND == K_LOGIC) {
        a.i = h.all ? (a.i && x) : (a.i || x);
    }
}

template <int KIND> NDM__HD ndm__red_acc red_combine(const ndm__red_acc &a, const ndm__red_acc &b,
                                                     const ndm__red_how &h)
{
    ndm__red_acc c = a;
    switch (KIND) {
    case K_SUMD:
    case K_EXPS:
        c.d = a.d + b.d;
        return c;
    case K_PRODD:
        c.d = a.d * b.d;
        return c;
    case K_SUMI:
        c.i = (int64_t)((uint64_t)a.i + (uint64_t)b.i);
        return c;
    case K_PRODI:
        c.i = (int64_t)((uint64_t)a.i * (uint64_t)b.i);
        return c;
    case K_LOGIC:
        c.i = h.all ? (a.i && b.i) : (a.i || b.i);
        return c;
    case K_DEV:
        c.d = a.d + b.d;
        c.e = a.e + b.e;
        return c;
    case K_EXTD: {
        /* The first NaN wins, else the best value at its first position,
         * as the sequential reference finds them. */
        if (a.at < 0)
            return b;
        if (b.at < 0)
            return a;
        if (a.i || b.i) {
            if (a.i && b.i)
                return a.at < b.at ? a : b;
            return a.i ? a : b;
        }
        if (h.mx ? b.d > a.d : b.d < a.d)
            return b;
        if (h.mx ? b.d < a.d : b.d > a.d)
            return a;
        return a.at < b.at ? a : b;
    }
    case K_EXTI: {
        if (a.at < 0)
            return b;
        if (b.at < 0)
            return a;
        if (h.mx ? b.i > a.i : b.i < a.i)
            return b;
        if (h.mx ? b.i < a.i : b.i > a.i)
            return a;
        return a.at < b.at ? a : b;
    }
    }
    return c;
}

/* The result of h.op from its accumulator over R elements: a double, or an
 * int64 in *vi when `int_value`. `aux` is the first pass's value (mean or
 * max). Integer kinds and positions are the accumulator itself; the rest
 * is the list's finish, as the CPU kernels compute it. */
template <int KIND>
NDM__HD double red_finish(const ndm__red_acc &a, const ndm__red_how &h, int64_t R, int64_t ddof,
                          double aux, bool int_value, int64_t *vi)
{
    *vi = 0;
    if (h.arg && !h.pre) {
        *vi = a.at < 0 ? 0 : a.at;
        return 0;
    }
    if (KIND == K_SUMI || KIND == K_PRODI || KIND == K_EXTI || KIND == K_LOGIC) {
        *vi = a.i;
        return 0;
    }
    double s = a.d, e = KIND == K_DEV ? a.e : 0.0;
    if (KIND == K_EXTD) /* at < 0: only the max pass of an empty logsumexp */
        s = a.at < 0 ? (h.mx ? -INFINITY : INFINITY) : a.i ? NAN : a.d;
    if (h.pre)
        return KIND == K_SUMD ? (R ? s / (double)R : NAN) : s;
    double v = ndm__reduce_finish(h.op, s, e, R, ddof, aux);
    if (int_value)
        *vi = ndm__cu_dt<NDM_I64>::st(v);
    return v;
}

/* ---- geometry -------------------------------------------------------------------- */

#define NDM__RED_DIMS 8

typedef struct ndm__red_geom {
    int kd, rd;
    int64_t kshape[NDM__RED_DIMS], ks[NDM__RED_DIMS], kds[NDM__RED_DIMS]; /* kept: src, dst */
    int64_t rshape[NDM__RED_DIMS], rs[NDM__RED_DIMS];                     /* reduced: src */
    int64_t K, R;
} ndm__red_geom;

/* Element offsets of kept position k in src (*so) and dst (*dof). */
NDM__HD void red_kept(const ndm__red_geom &g, int64_t k, int64_t *so, int64_t *dof)
{
    int64_t s = 0, d = 0;
    for (int i = g.kd - 1; i >= 0; i--) {
        int64_t c = k % g.kshape[i];
        k /= g.kshape[i];
        s += c * g.ks[i];
        d += c * g.kds[i];
    }
    *so = s;
    *dof = d;
}

NDM__HD int64_t red_off(const ndm__red_geom &g, int64_t r)
{
    if (g.rd == 1)
        return r * g.rs[0];
    int64_t o = 0;
    for (int i = g.rd - 1; i >= 0; i--) {
        o += (r % g.rshape[i]) * g.rs[i];
        r /= g.rshape[i];
    }
    return o;
}

/* ---- kernels ------------------------------------------------------------------------ */

#define NDM__RED_THREADS 256

/* Whether kind KIND reads dtype E: integer kinds read integers; the rest
 * read anything. */
template <int KIND, ndm_dtype E> constexpr bool red_valid()
{
    constexpr bool fl = E == NDM_F16 || E == NDM_BF16 || E == NDM_F32 || E == NDM_F64;
    if (KIND == K_SUMI || KIND == K_PRODI || KIND == K_EXTI)
        return !fl;
    return true; /* the double kinds read any dtype as double */
}

template <int KIND, ndm_dtype E> NDM__HD void red_push(ndm__red_acc &a, typename ndm__cu_dt<E>::T x,
                                                      int64_t r, const ndm__red_how &h, double aux)
{
    typedef ndm__cu_dt<E> D;
    if constexpr (KIND == K_SUMI || KIND == K_PRODI || KIND == K_EXTI) {
        red_push_i<KIND>(a, (int64_t)D::ld(x), r, h);
    } else if constexpr (KIND == K_LOGIC) {
        red_push_i<KIND>(a, D::ld(x) != 0, r, h);
    } else {
        double v = (double)D::ld(x);
        red_push_d<KIND>(a, h.mapped ? ndm__reduce_map(h.op, v) : v, r, h, aux);
    }
}

/* Everything a launch needs but the geometry. */
typedef struct ndm__red_args {
    const char *src;
    char *dst;            /* the result, or NULL when it goes to aux_out */
    ndm_dtype dtype;      /* dst's */
    bool int_result;
    int64_t ddof;
    const double *aux;    /* per output: the first pass's value, or NULL */
    double *aux_out;      /* per output: where a first pass finishes */
    ndm__red_acc *part;   /* parts > 1: per (output, part) accumulators */
    int64_t parts, chunk; /* the reduced range in parts of chunk elements */
    int lanes;            /* threads per (output, part): 1, 32 or 256 */
} ndm__red_args;

template <int KIND>
NDM__HD void red_store(const ndm__red_args &A, const ndm__red_how &h, const ndm__red_geom &g,
                       const ndm__red_acc &a, int64_t k)
{
    int64_t so, dof, vi;
    red_kept(g, k, &so, &dof);
    double v = red_finish<KIND>(a, h, g.R, A.ddof, A.aux ? A.aux[k] : 0.0, A.int_result, &vi);
    if (A.aux_out)
        A.aux_out[k] = v;
    else if (A.int_result)
        ndm__cu_store_i(A.dst + dof * (int64_t)ndm__cu_esize(A.dtype), A.dtype, vi);
    else
        ndm__cu_store_d(A.dst + dof * (int64_t)ndm__cu_esize(A.dtype), A.dtype, v);
}

/* Work item w = (output k, part p) per group of `lanes` threads; every
 * thread of a block runs the same number of rounds, so the barriers of the
 * tree are reached by all. */
template <int KIND, ndm_dtype E>
__global__ void ndm__k_reduce(ndm__red_geom g, ndm__red_args A, ndm__red_how h)
{
    typedef typename ndm__cu_dt<E>::T T;
    __shared__ ndm__red_acc sm[NDM__RED_THREADS];
    const int L = A.lanes, groups = (int)blockDim.x / L;
    const int t = (int)threadIdx.x, lane = t % L, grp = t / L;
    const int64_t items = g.K * A.parts;
    for (int64_t base = (int64_t)blockIdx.x * groups; base < items;
         base += (int64_t)gridDim.x * groups) {
        int64_t w = base + grp;
        ndm__red_acc a = red_init<KIND>(h);
        if (w < items) {
            int64_t k = w / A.parts, p = w % A.parts;
            int64_t so, dof;
            red_kept(g, k, &so, &dof);
            const T *x = (const T *)A.src + so;
            double aux = A.aux ? A.aux[k] : 0.0;
            int64_t r0 = p * A.chunk, r1 = r0 + A.chunk < g.R ? r0 + A.chunk : g.R;
            for (int64_t r = r0 + lane; r < r1; r += L)
                red_push<KIND, E>(a, x[red_off(g, r)], r, h, aux);
        }
        if (L > 1) {
            sm[t] = a;
            __syncthreads();
            for (int s = L / 2; s > 0; s /= 2) {
                if (lane < s)
                    sm[t] = red_combine<KIND>(sm[t], sm[t + s], h);
                __syncthreads();
            }
            a = sm[t];
            __syncthreads(); /* sm is refilled by the next round */
        }
        if (lane == 0 && w < items) {
            if (A.parts > 1)
                A.part[w] = a;
            else
                red_store<KIND>(A, h, g, a, w);
        }
    }
}

/* The second pass of a split: the parts of each output folded in order. */
template <int KIND>
__global__ void ndm__k_reduce_parts(ndm__red_geom g, ndm__red_args A, ndm__red_how h)
{
    NDM__CU_LOOP(int64_t, k, g.K)
    {
        ndm__red_acc a = A.part[k * A.parts];
        for (int64_t p = 1; p < A.parts; p++)
            a = red_combine<KIND>(a, A.part[k * A.parts + p], h);
        red_store<KIND>(A, h, g, a, k);
    }
}

/* ---- host side ------------------------------------------------------------------------ */

static unsigned red_grid(int64_t blocks)
{
#ifdef NDM__CUDA_HOST_EXEC
    const int64_t cap = 4; /* blocks run one after another: a few exercise the loops */
#else
    const int64_t cap = 4096;
#endif
    return (unsigned)(blocks < 1 ? 1 : blocks < cap ? blocks : cap);
}

template <int KIND, ndm_dtype E>
static ndm_status red_launch(int device, cudaStream_t s, const ndm__red_geom &g,
                             const ndm__red_args &A, const ndm__red_how &h)
{
    int groups = NDM__RED_THREADS / A.lanes;
    int64_t items = g.K * A.parts;
    NDM__LAUNCH(red_grid((items + groups - 1) / groups), NDM__RED_THREADS, 0, s,
                ndm__k_reduce<KIND, E>)(g, A, h);
    NDM__CUDA_LAUNCHED(device, "the reduction kernel");
    if (A.parts > 1) {
        NDM__LAUNCH(ndm__cuda_blocks(g.K), NDM__CUDA_THREADS, 0, s, ndm__k_reduce_parts<KIND>)(
            g, A, h);
        NDM__CUDA_LAUNCHED(device, "the reduction's second pass");
    }
    return NDM_OK;
}

template <int KIND>
static ndm_status red_kind(int device, cudaStream_t s, ndm_dtype t, const ndm__red_geom &g,
                           const ndm__red_args &A, const ndm__red_how &h)
{
    switch (t) {
#define NDM__RED_CASE(E)                                                        \
    case E:                                                                     \
        if constexpr (red_valid<KIND, E>())                                     \
            return red_launch<KIND, E>(device, s, g, A, h);                     \
        break;
        NDM__CU_DTYPES(NDM__RED_CASE)
#undef NDM__RED_CASE
    }
    return ndm__cuda_fail(NDM_E_DTYPE, "reduce: no kernel for dtype %d", (int)t);
}

static ndm_status red_run(int device, cudaStream_t s, int kind, ndm_dtype t,
                          const ndm__red_geom &g, const ndm__red_args &A, const ndm__red_how &h)
{
    switch (kind) {
    case K_SUMD: return red_kind<K_SUMD>(device, s, t, g, A, h);
    case K_SUMI: return red_kind<K_SUMI>(device, s, t, g, A, h);
    case K_PRODD: return red_kind<K_PRODD>(device, s, t, g, A, h);
    case K_PRODI: return red_kind<K_PRODI>(device, s, t, g, A, h);
    case K_EXTD: return red_kind<K_EXTD>(device, s, t, g, A, h);
    case K_EXTI: return red_kind<K_EXTI>(device, s, t, g, A, h);
    case K_LOGIC: return red_kind<K_LOGIC>(device, s, t, g, A, h);
    case K_DEV: return red_kind<K_DEV>(device, s, t, g, A, h);
    case K_EXPS: return red_kind<K_EXPS>(device, s, t, g, A, h);
    }
    return ndm__cuda_fail(NDM_E_INVALID, "reduce: unknown accumulator kind %d", kind);
}

/* The accumulator kind of op over dtype t, from the list's accumulator. */
static int red_kind_of(ndm__reduce_op op, ndm_dtype t)
{
    bool i = ndm__reduce_int_acc(op, t);
    switch (ndm__reduce_acc[op]) {
    case NDM__RACC_SUM: return i ? K_SUMI : K_SUMD;
    case NDM__RACC_PROD: return i ? K_PRODI : K_PRODD;
    case NDM__RACC_MAX:
    case NDM__RACC_MIN:
    case NDM__RACC_ARGMAX:
    case NDM__RACC_ARGMIN: return i ? K_EXTI : K_EXTD;
    case NDM__RACC_ALL:
    case NDM__RACC_ANY: return K_LOGIC;
    case NDM__RACC_DEV: return K_DEV;
    case NDM__RACC_LSE: return K_EXPS;
    }
    return K_SUMD;
}

/* Coalesce the kept and the reduced axes apart; false when either keeps
 * more than NDM__RED_DIMS axes. Merging adjacent reduced axes keeps their
 * C-order positions, which argmax and argmin return. */
static bool red_geometry(const ndm__tensor *dst, const ndm__tensor *src, int nred,
                         ndm__red_geom *g)
{
    int nk = dst->ndim, nd = src->ndim;
    int64_t small[6 * 32];
    int64_t *buf = nd <= 32 ? small : (int64_t *)malloc(6 * (size_t)nd * sizeof(int64_t));
    if (!buf)
        return false;
    int cap = nd <= 32 ? 32 : nd;
    int64_t *ksh = buf, *kss = buf + cap, *kds = buf + 2 * cap;
    int64_t *rsh = buf + 3 * cap, *rss = buf + 4 * cap;
    const int64_t *kin[2] = {src->strides, dst->strides};
    int64_t *kout[2] = {kss, kds};
    int kd = ndm__cu_coalesce(nk, src->shape, 2, kin, ksh, kout);
    const int64_t *rin[1] = {src->strides + nk};
    int64_t *rout[1] = {rss};
    int rd = ndm__cu_coalesce(nred, src->shape + nk, 1, rin, rsh, rout);
    bool ok = kd <= NDM__RED_DIMS && rd <= NDM__RED_DIMS;
    if (ok) {
        memset(g, 0, sizeof *g);
        g->kd = kd, g->rd = rd;
        g->K = g->R = 1;
        for (int i = 0; i < kd; i++)
            g->kshape[i] = ksh[i], g->ks[i] = kss[i], g->kds[i] = kds[i], g->K *= ksh[i];
        for (int i = 0; i < rd; i++)
            g->rshape[i] = rsh[i], g->rs[i] = rss[i], g->R *= rsh[i];
    }
    if (buf != small)
        free(buf);
    return ok;
}

/* Threads per output and parts of the reduced range. A thread per output
 * when the reduced range is short, or when the outputs are many and lie
 * along the fast axis (neighbouring threads then read neighbouring
 * elements); a warp or a block per output otherwise. Few outputs over a long
 * range split it into parts folded by a second pass: a fixed partition, so
 * results never depend on timing. */
static void red_plan(const ndm__red_geom &g, int *lanes, int64_t *parts, int64_t *chunk)
{
    int64_t K = g.K, R = g.R;
    bool r_fast = g.rd > 0 && g.rs[g.rd - 1] == 1;
    int L;
    if (R <= 16 || (!r_fast && K >= 4096))
        L = 1;
    else if (R <= 2048)
        L = 32;
    else
        L = NDM__RED_THREADS;
#ifdef NDM__CUDA_HOST_EXEC
    const int64_t target = 4; /* blocks in flight; small, so the tests split */
    const int64_t per_part = 2048;
#else
    const int64_t target = 1024; /* about 8 blocks per SM of an H100 */
    const int64_t per_part = 8192;
#endif
    int64_t P = 1;
    int64_t blocks = (K + NDM__RED_THREADS / L - 1) / (NDM__RED_THREADS / L);
    if (L == NDM__RED_THREADS && blocks < target && R >= 2 * per_part) {
        P = (target + K - 1) / K;
        int64_t most = R / per_part;
        if (P > most)
            P = most;
    }
    *lanes = L;
    *parts = P < 1 ? 1 : P;
    *chunk = (R + *parts - 1) / *parts;
    if (*chunk < 1)
        *chunk = 1;
}

static ndm_status red_pass(int device, cudaStream_t s, int kind, ndm_dtype t,
                           const ndm__red_geom &g, ndm__red_args A, const ndm__red_how &h)
{
    red_plan(g, &A.lanes, &A.parts, &A.chunk);
    void *part = NULL;
    if (A.parts > 1) {
        ndm_status st = ndm__cu_scratch_get(device, s,
                                            (size_t)(g.K * A.parts) * sizeof(ndm__red_acc), &part,
                                            "a reduction's partial results");
        if (st < 0)
            return st;
        A.part = (ndm__red_acc *)part;
    }
    ndm_status st = red_run(device, s, kind, t, g, A, h);
    ndm_status fs = ndm__cu_scratch_put(device, s, part);
    return st < 0 ? st : fs;
}

static ndm_status red_geometry_ok(int device, cudaStream_t s, const ndm__tensor *dst,
                                  const ndm__tensor *src, int nred, ndm__red_geom *g,
                                  void **tmp, ndm__tensor *dense, int64_t *dense_strides);

static ndm_status cuda_reduce(int device, ndm__reduce_op op, const ndm__tensor *dst,
                              const ndm__tensor *src, int nred, int64_t ddof)
{
    cudaStream_t s = nullptr;
    ndm_status st = ndm__cuda_enter(device, &s);
    if (st < 0)
        return st;
    int64_t K = 1;
    for (int i = 0; i < dst->ndim; i++)
        K *= dst->shape[i];
    if (K == 0)
        return NDM_OK;
    ndm__red_geom g;
    void *tmp = NULL;
    ndm__tensor dense;
    int64_t dense_strides_small[32];
    int64_t *dense_strides = src->ndim <= 32 ? dense_strides_small
                                             : (int64_t *)malloc((size_t)src->ndim * 8);
    if (!dense_strides)
        return ndm__cuda_fail(NDM_E_OOM, "reduce: no memory for a rank-%d plan", src->ndim);
    st = red_geometry_ok(device, s, dst, src, nred, &g, &tmp, &dense, dense_strides);
    if (dense_strides != dense_strides_small)
        free(dense_strides);
    if (st < 0)
        return st;
    const char *x = tmp ? (const char *)tmp : (const char *)src->data;
    ndm_dtype t = src->dtype;
    int acc = ndm__reduce_acc[op];
    ndm__red_how h;
    memset(&h, 0, sizeof h);
    h.op = op;
    h.mx = acc == NDM__RACC_MAX || acc == NDM__RACC_ARGMAX;
    h.all = acc == NDM__RACC_ALL;
    h.arg = acc == NDM__RACC_ARGMAX || acc == NDM__RACC_ARGMIN;
    h.mapped = ndm__reduce_mapped[op];
    ndm__red_args A;
    memset(&A, 0, sizeof A);
    A.src = x;
    A.dst = (char *)dst->data;
    A.dtype = dst->dtype;
    A.ddof = ddof;
    int kind = red_kind_of(op, t);
    A.int_result = ndm__reduce_int_value(op, t);
    void *aux = NULL;
    if (kind == K_DEV || kind == K_EXPS) {
        /* A first pass puts each output's mean (var, std) or max
         * (logsumexp) in scratch; the second reads it. */
        st = ndm__cu_scratch_get(device, s, (size_t)g.K * sizeof(double), &aux,
                                 "a reduction's first pass");
        if (st >= 0) {
            ndm__red_args A1 = A;
            A1.int_result = false;
            A1.aux_out = (double *)aux;
            ndm__red_how h1 = h;
            h1.pre = true;
            h1.mx = true;
            st = red_pass(device, s, kind == K_DEV ? K_SUMD : K_EXTD, t, g, A1, h1);
            A.aux = (const double *)aux;
        }
    }
    if (st >= 0)
        st = red_pass(device, s, kind, t, g, A, h);
    ndm_status fs = ndm__cu_scratch_put(device, s, aux);
    ndm_status ts = ndm__cu_scratch_put(device, s, tmp);
    return st < 0 ? st : fs < 0 ? fs : ts;
}

/* Axes past NDM__RED_DIMS after coalescing: the source is copied dense
 * first (its reduced axes then merge into one); a destination that still
 * has too many is declined. */
static ndm_status red_geometry_ok(int device, cudaStream_t s, const ndm__tensor *dst,
                                  const ndm__tensor *src, int nred, ndm__red_geom *g,
                                  void **tmp, ndm__tensor *dense, int64_t *dense_strides)
{
    *tmp = NULL;
    if (red_geometry(dst, src, nred, g))
        return NDM_OK;
    int64_t n = 1;
    for (int i = src->ndim - 1; i >= 0; i--) {
        dense_strides[i] = n;
        n *= src->shape[i];
    }
    size_t es = ndm__cuda_host->dtype_size(src->dtype);
    ndm_status st = ndm__cu_scratch_get(device, s, (size_t)n * es, tmp,
                                        "a dense copy of a reduction's input");
    if (st < 0)
        return st;
    *dense = (ndm__tensor){*tmp, src->dtype, src->ndim, src->shape, dense_strides};
    st = ndm__cuda_backend.copy(device, dense, src);
    if (st >= 0 && !red_geometry(dst, dense, nred, g))
        st = ndm__cuda_fail(NDM_E_UNSUPPORTED,
                            "reduce: a destination of rank %d whose strides keep more than %d "
                            "axes apart",
                            dst->ndim, NDM__RED_DIMS);
    if (st < 0) {
        (void)ndm__cu_scratch_put(device, s, *tmp);
        *tmp = NULL;
    }
    return st;
}

/* ---- softmax ------------------------------------------------------------------------- */

NDM__HD double smx_max(double a, double b)
{
    if (a != a || b != b)
        return NAN;
    return b > a ? b : a;
}

/* One line along the axis per group of L threads: its max (NaN if any
 * element is NaN), the sum of exp(x - max), then the outputs, in double,
 * as the reference computes them. */
template <ndm_dtype E>
__global__ void ndm__k_softmax(ndm__cu_geom g, char *dst, ndm_dtype dt, const char *src,
                               int64_t lines, int64_t n, int64_t ds, int64_t ss, bool lg, int L)
{
    typedef ndm__cu_dt<E> D;
    __shared__ double sm[NDM__RED_THREADS];
    const int groups = (int)blockDim.x / L;
    const int t = (int)threadIdx.x, lane = t % L, grp = t / L;
    const int des = ndm__cu_esize(dt);
    for (int64_t base = (int64_t)blockIdx.x * groups; base < lines;
         base += (int64_t)gridDim.x * groups) {
        int64_t line = base + grp;
        bool live = line < lines;
        int64_t off[2] = {0, 0};
        if (live)
            ndm__cu_offsets<2, int64_t>(g, line, off);
        const typename D::T *x = (const typename D::T *)src + off[1];
        char *y = dst + off[0] * (int64_t)des;
        double m = -INFINITY;
        for (int64_t j = lane; live && j < n; j += L)
            m = smx_max(m, (double)D::ld(x[j * ss]));
        if (L > 1) {
            sm[t] = m;
            __syncthreads();
            for (int s = L / 2; s > 0; s /= 2) {
                if (lane < s)
                    sm[t] = smx_max(sm[t], sm[t + s]);
                __syncthreads();
            }
            m = sm[t - lane];
            __syncthreads();
        }
        double sum = 0;
        for (int64_t j = lane; live && j < n; j += L)
            sum += exp((double)D::ld(x[j * ss]) - m);
        if (L > 1) {
            sm[t] = sum;
            __syncthreads();
            for (int s = L / 2; s > 0; s /= 2) {
                if (lane < s)
                    sm[t] += sm[t + s];
                __syncthreads();
            }
            sum = sm[t - lane];
            __syncthreads();
        }
        double ls = log(sum);
        for (int64_t j = lane; live && j < n; j += L) {
            double v = (double)D::ld(x[j * ss]);
            ndm__cu_store_d(y + j * ds * (int64_t)des, dt, lg ? (v - m) - ls : exp(v - m) / sum);
        }
    }
}

static ndm_status cuda_softmax(int device, const ndm__tensor *dst, const ndm__tensor *src,
                               int axis, bool lg)
{
    cudaStream_t s = nullptr;
    ndm_status st = ndm__cuda_enter(device, &s);
    if (st < 0)
        return st;
    int nd = src->ndim;
    int64_t n = src->shape[axis], total = 1;
    for (int i = 0; i < nd; i++)
        total *= src->shape[i];
    if (total == 0)
        return NDM_OK;
    int64_t small[32];
    int64_t *lshape = nd <= 32 ? small : (int64_t *)malloc((size_t)nd * sizeof(int64_t));
    if (!lshape)
        return ndm__cuda_fail(NDM_E_OOM, "softmax: no memory for a rank-%d plan", nd);
    memcpy(lshape, src->shape, (size_t)nd * sizeof(int64_t));
    lshape[axis] = 1; /* the lines: every axis but `axis` */
    int L = n <= 16 ? 1 : n <= 2048 ? 32 : NDM__RED_THREADS;
    int64_t ds = dst->strides[axis], ss = src->strides[axis];
    char *data[2] = {(char *)dst->data, (char *)src->data};
    const int64_t *strides[2] = {dst->strides, src->strides};
    size_t es[2] = {ndm__cuda_host->dtype_size(dst->dtype),
                    ndm__cuda_host->dtype_size(src->dtype)};
    st = ndm__cu_run_strided(nd, lshape, 2, data, strides, es,
                             [&](const ndm__cu_geom &g, char *const *p, int64_t lines) -> ndm_status {
        int groups = NDM__RED_THREADS / L;
        unsigned grid = red_grid((lines + groups - 1) / groups);
        switch (src->dtype) {
#define NDM__SMX_CASE(E)                                                        \
    case E:                                                                     \
        NDM__LAUNCH(grid, NDM__RED_THREADS, 0, s, ndm__k_softmax<E>)(           \
            g, p[0], dst->dtype, p[1], lines, n, ds, ss, lg, L);                \
        NDM__CUDA_LAUNCHED(device, "the softmax kernel");                       \
        return NDM_OK;
            NDM__CU_DTYPES(NDM__SMX_CASE)
#undef NDM__SMX_CASE
        }
        return ndm__cuda_fail(NDM_E_DTYPE, "softmax: invalid dtype %d", (int)src->dtype);
    });
    if (lshape != small)
        free(lshape);
    return st;
}

extern "C" const struct ndm__backend_reduce ndm__cuda_reduce = {
    .reduce = cuda_reduce,
    .softmax = cuda_softmax,
};
