/* The fast CPU elementwise driver: plans the walk over any strides, splits
 * it across the pool, and feeds each row to the best kernel table, with
 * L1-sized tiles for conversions and non-temporal stores for huge outputs. */
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <pthread.h>

#include "ew_cpu.h"
#include "isa.h"
#include "parallel.h"

/* ---- instruction set choice ---------------------------------------------- */

/* One table per level, each the one below with its own kernels laid over. */
static ndm__ew_isa tables[NDM__CPU_ISA_COUNT];
static _Atomic int tables_built;
static pthread_once_t tables_once = PTHREAD_ONCE_INIT;

/* Take every non-NULL function pointer of src[0, bytes) into dst (memcpy:
 * the slots have several function pointer types). */
static void overlay_slots(void *dst, const void *src, size_t bytes)
{
    for (size_t o = 0; o + sizeof(void (*)(void)) <= bytes; o += sizeof(void (*)(void))) {
        void (*f)(void);
        memcpy(&f, (const char *)src + o, sizeof f);
        if (f)
            memcpy((char *)dst + o, &f, sizeof f);
    }
}
#define NDM__EW_OVERLAY(dst, src, field)                                        \
    overlay_slots(&(dst)->field, &(src)->field, sizeof(dst)->field)

static void overlay(ndm__ew_isa *t, const ndm__ew_isa *k)
{
    t->name = k->name;
    NDM__EW_OVERLAY(t, k, bin);
    NDM__EW_OVERLAY(t, k, un);
    NDM__EW_OVERLAY(t, k, where);
    NDM__EW_OVERLAY(t, k, conv);
    NDM__EW_OVERLAY(t, k, move);
    t->stream = k->stream;
    t->fence = k->fence;
}

static void tables_build(void)
{
    ndm__ew_isa *ref = &tables[NDM__CPU_ISA_REF];
    ndm__ew_isa_fill_reference(ref);
    overlay(ref, &ndm__ew_isa_generic);
    tables[NDM__CPU_ISA_AVX2] = *ref;
    tables[NDM__CPU_ISA_AVX512] = *ref;
#if NDM__EW_X86_TABLES
    overlay(&tables[NDM__CPU_ISA_AVX2], &ndm__ew_isa_avx2);
    tables[NDM__CPU_ISA_AVX512] = tables[NDM__CPU_ISA_AVX2];
    overlay(&tables[NDM__CPU_ISA_AVX512], &ndm__ew_isa_avx512);
#endif
    atomic_store_explicit(&tables_built, 1, memory_order_release);
}

const ndm__ew_isa *ndm__ew_isa_of(int level)
{
    if (__builtin_expect(!atomic_load_explicit(&tables_built, memory_order_acquire), 0))
        pthread_once(&tables_once, tables_build);
    return &tables[level];
}

const ndm__ew_isa *ndm__ew_isa_active(void) { return ndm__ew_isa_of(ndm__cpu_isa_level()); }

int ndm__ew_isa_select(const char *name)
{
    if (!name)
        return ndm__cpu_isa_force(-1) ? NDM_OK : NDM_E_UNSUPPORTED;
    int level = !strcmp(name, "generic") ? NDM__CPU_ISA_REF : ndm__cpu_isa_parse(name);
    if (level < 0)
        return NDM_E_INVALID;
    return ndm__cpu_isa_force(level) ? NDM_OK : NDM_E_UNSUPPORTED;
}

/* ---- tuning ---------------------------------------------------------------- */

/* Elements per task: below this the pool's wake-up costs more than it saves.
 * Transcendental functions do enough work per element to split earlier. */
#define GRAIN_CHEAP ((int64_t)1 << 16)
#define GRAIN_MATH ((int64_t)1 << 13)
/* Elements per tile: the converted operands of one tile stay in L1. */
#define TILE 1024
/* Outputs at least this large are written with non-temporal stores: they
 * cannot stay in the cache anyway, and skipping the read for ownership
 * saves a quarter of the traffic of a binary op. */
static _Atomic int64_t stream_min_bytes = (int64_t)64 << 20;

void ndm__ew_set_stream_min(int64_t bytes) { atomic_store(&stream_min_bytes, bytes); }

/* ---- the walk -------------------------------------------------------------- */

#define MAX_OPS 4
#define SMALL_RANK 16

/* A walk over the elements of up to MAX_OPS operands sharing a shape.
 * Operand 0 is the output: axes are ordered by its strides (largest
 * outermost), flipped where its stride is negative, and merged where every
 * operand allows, so a contiguous output walks memory in order. */
typedef struct plan {
    int nd; /* >= 1 */
    int nops;
    int64_t total;
    int64_t *shape;
    int64_t *st[MAX_OPS];
    char *base[MAX_OPS];
    int64_t es[MAX_OPS];
    int64_t st1[MAX_OPS]; /* the row strides of a one-axis plan */
    int64_t small[SMALL_RANK * (1 + MAX_OPS)];
    int64_t *heap;
} plan;

static bool c_contiguous(int ndim, const int64_t *shape, const int64_t *st)
{
    int64_t expect = 1;
    for (int i = ndim - 1; i >= 0; i--) {
        if (shape[i] != 1 && st[i] != expect)
            return false;
        expect *= shape[i];
    }
    return true;
}

/* The element count of t when it is C-contiguous, else -1. */
static int64_t flat_count(const ndm__tensor *t)
{
    int64_t n = 1;
    for (int i = t->ndim - 1; i >= 0; i--) {
        if (t->shape[i] != 1 && t->strides[i] != n)
            return -1;
        n *= t->shape[i];
    }
    return n;
}

/* Small contiguous operations whose dtypes need no conversion skip the plan
 * and the pool: one kernel call. Returns the element count when that holds
 * for out and the inputs given (NULL: a scalar), else -1. */
static int64_t direct_count(const ndm__tensor *out, ndm_dtype rt, const ndm__tensor *a,
                            const ndm__tensor *b, ndm_dtype ct)
{
    int64_t n = flat_count(out);
    if (n < 0 || n > GRAIN_CHEAP || out->dtype != rt)
        return -1;
    if (a && (a->dtype != ct || flat_count(a) != n))
        return -1;
    if (b && (b->dtype != ct || flat_count(b) != n))
        return -1;
    return n;
}

/* Returns false when out of memory (only for ranks above SMALL_RANK). A NULL
 * strides entry means stride 0 on every axis (a scalar operand). */
static bool plan_init(plan *p, int ndim, const int64_t *shape, int nops, char *const *data,
                      const int64_t *const *strides, const size_t *esize)
{
    p->nops = nops;
    p->heap = NULL;
    p->total = 1;
    for (int i = 0; i < ndim; i++)
        p->total *= shape[i];
    int cap = ndim > 1 ? ndim : 1;
    int64_t *mem = p->small;
    if (cap > SMALL_RANK) {
        p->heap = malloc(sizeof(int64_t) * (size_t)cap * (1 + MAX_OPS));
        if (!p->heap)
            return false;
        mem = p->heap;
    }
    p->shape = mem;
    for (int k = 0; k < nops; k++) {
        p->st[k] = mem + (size_t)cap * (1 + (size_t)k);
        p->base[k] = data[k];
        p->es[k] = (int64_t)esize[k];
    }
    if (p->total == 0) {
        p->nd = 1;
        p->shape[0] = 0;
        return true;
    }
    /* The common case: every operand C-contiguous or a scalar, one flat row. */
    bool flat = true;
    for (int k = 0; k < nops && flat; k++)
        flat = !strides[k] || c_contiguous(ndim, shape, strides[k]);
    if (flat) {
        p->nd = 1;
        p->shape[0] = p->total;
        for (int k = 0; k < nops; k++)
            p->st[k][0] = strides[k] ? 1 : 0;
        return true;
    }
    /* Keep the axes longer than 1; flip those the output walks backwards. */
    int n = 0;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] == 1)
            continue;
        bool flip = strides[0][i] < 0;
        p->shape[n] = shape[i];
        for (int k = 0; k < nops; k++) {
            int64_t s = strides[k] ? strides[k][i] : 0;
            if (flip) {
                p->base[k] += (shape[i] - 1) * s * p->es[k];
                s = -s;
            }
            p->st[k][n] = s;
        }
        n++;
    }
    /* Order by the output's stride, largest first (stable insertion sort:
     * ranks are small and usually sorted already). */
    for (int i = 1; i < n; i++) {
        for (int j = i; j > 0 && p->st[0][j - 1] < p->st[0][j]; j--) {
            int64_t t = p->shape[j];
            p->shape[j] = p->shape[j - 1];
            p->shape[j - 1] = t;
            for (int k = 0; k < nops; k++) {
                t = p->st[k][j];
                p->st[k][j] = p->st[k][j - 1];
                p->st[k][j - 1] = t;
            }
        }
    }
    /* Merge an axis into the next inner one where every operand steps
     * through the pair as through one axis. */
    int m = 0;
    for (int i = 0; i < n; i++) {
        if (m > 0) {
            bool merge = true;
            for (int k = 0; k < nops && merge; k++)
                merge = p->st[k][m - 1] == p->st[k][i] * p->shape[i];
            if (merge) {
                p->shape[m - 1] *= p->shape[i];
                for (int k = 0; k < nops; k++)
                    p->st[k][m - 1] = p->st[k][i];
                continue;
            }
        }
        p->shape[m] = p->shape[i];
        for (int k = 0; k < nops; k++)
            p->st[k][m] = p->st[k][i];
        m++;
    }
    if (m == 0) { /* one element */
        p->shape[0] = 1;
        for (int k = 0; k < nops; k++)
            p->st[k][0] = 1;
        m = 1;
    }
    p->nd = m;
    return true;
}

static void plan_free(plan *p)
{
    if (p->heap)
        free(p->heap);
}

typedef void (*row_fn)(const void *job, char *const *p, const int64_t *s, int64_t n);

/* Run `row` over elements [begin, end) in the plan's order. */
static void plan_walk(const plan *p, int64_t begin, int64_t end, row_fn row, const void *job)
{
    int nd = p->nd, outer = nd - 1, nops = p->nops;
    if (nd == 1) {
        char *rp[MAX_OPS];
        for (int k = 0; k < nops; k++)
            rp[k] = p->base[k] + begin * p->st[k][0] * p->es[k];
        row(job, rp, (const int64_t *)p->st1, end - begin);
        return;
    }
    int64_t len = p->shape[outer];
    int64_t small_idx[SMALL_RANK];
    int64_t *idx = outer <= SMALL_RANK ? small_idx : malloc(sizeof(int64_t) * (size_t)outer);
    if (!idx) {
        /* No memory for the odometer of a very high rank: find each
         * element's address by division instead (slow, correct). */
        for (int64_t e = begin; e < end; e++) {
            char *rp[MAX_OPS];
            int64_t ones[MAX_OPS];
            for (int k = 0; k < nops; k++) {
                rp[k] = p->base[k];
                ones[k] = 1;
            }
            int64_t rem = e;
            for (int d = nd - 1; d >= 0; d--) {
                int64_t i = rem % p->shape[d];
                rem /= p->shape[d];
                for (int k = 0; k < nops; k++)
                    rp[k] += i * p->st[k][d] * p->es[k];
            }
            row(job, rp, ones, 1);
        }
        return;
    }
    char *ptr[MAX_OPS];
    int64_t rs[MAX_OPS];
    int64_t r = begin / len, j = begin % len;
    for (int k = 0; k < nops; k++) {
        ptr[k] = p->base[k];
        rs[k] = p->st[k][outer];
    }
    for (int d = outer - 1; d >= 0; d--) {
        idx[d] = r % p->shape[d];
        r /= p->shape[d];
        for (int k = 0; k < nops; k++)
            ptr[k] += idx[d] * p->st[k][d] * p->es[k];
    }
    int64_t left = end - begin;
    while (left > 0) {
        int64_t n = len - j < left ? len - j : left;
        char *rp[MAX_OPS];
        for (int k = 0; k < nops; k++)
            rp[k] = ptr[k] + j * rs[k] * p->es[k];
        row(job, rp, rs, n);
        left -= n;
        j = 0;
        if (left <= 0)
            break;
        for (int d = outer - 1; d >= 0; d--) {
            for (int k = 0; k < nops; k++)
                ptr[k] += p->st[k][d] * p->es[k];
            if (++idx[d] < p->shape[d])
                break;
            for (int k = 0; k < nops; k++)
                ptr[k] -= p->st[k][d] * p->shape[d] * p->es[k];
            idx[d] = 0;
        }
    }
    if (idx != small_idx)
        free(idx);
}

/* What every job starts with: the plan, the row function and the table. */
typedef struct job_head {
    plan pl;
    row_fn row;
    const ndm__ew_isa *isa;
    bool stream;
    /* blocked walk (see blocked_axis): the second blocked axis, its block
     * count and the inner axis's */
    int bj;
    int64_t nbj, nbi;
} job_head;

/* Side of the square blocks of a blocked walk, in elements. */
#define BLOCK 64

/* An input read across its memory order (a transposed view: its unit-stride
 * axis is not the output's inner axis) makes a row-by-row walk touch one
 * cache line per element. Such plans walk BLOCK x BLOCK squares of the inner
 * axis and that input's fast axis instead. Returns the fast axis, or -1. */
static int blocked_axis(const plan *p)
{
    int nd = p->nd, in = nd - 1;
    if (nd < 2 || p->st[0][in] != 1 || p->shape[in] < BLOCK / 4)
        return -1;
    for (int k = 1; k < p->nops; k++) {
        int64_t si = p->st[k][in] < 0 ? -p->st[k][in] : p->st[k][in];
        if (si * p->es[k] <= 64)
            continue;
        int best = -1;
        int64_t bs = INT64_MAX;
        for (int j = 0; j < in; j++) {
            int64_t sj = p->st[k][j] < 0 ? -p->st[k][j] : p->st[k][j];
            if (sj && sj < bs && p->shape[j] >= BLOCK / 4) {
                bs = sj;
                best = j;
            }
        }
        if (best >= 0 && bs * p->es[k] <= 16)
            return best;
    }
    return -1;
}

/* Blocks [b0, b1) of a blocked walk, numbered (outer index, block along
 * bj, block along the inner axis) with the inner block fastest. */
static void blocked_range(void *ctx, int64_t b0, int64_t b1)
{
    const job_head *h = ctx;
    const plan *p = &h->pl;
    int nd = p->nd, in = nd - 1, bj = h->bj, nops = p->nops;
    int64_t rs[MAX_OPS];
    for (int k = 0; k < nops; k++)
        rs[k] = p->st[k][in];
    for (int64_t blk = b0; blk < b1; blk++) {
        int64_t bi = blk % h->nbi, t = blk / h->nbi;
        int64_t bjx = t % h->nbj, outer = t / h->nbj;
        char *ptr[MAX_OPS];
        for (int k = 0; k < nops; k++)
            ptr[k] = p->base[k];
        for (int d = in - 1; d >= 0; d--) {
            if (d == bj)
                continue;
            int64_t i = outer % p->shape[d];
            outer /= p->shape[d];
            for (int k = 0; k < nops; k++)
                ptr[k] += i * p->st[k][d] * p->es[k];
        }
        int64_t i0 = bi * BLOCK, n = p->shape[in] - i0 < BLOCK ? p->shape[in] - i0 : BLOCK;
        int64_t j0 = bjx * BLOCK, j1 = j0 + BLOCK < p->shape[bj] ? j0 + BLOCK : p->shape[bj];
        for (int64_t j = j0; j < j1; j++) {
            char *rp[MAX_OPS];
            for (int k = 0; k < nops; k++)
                rp[k] = ptr[k] + (j * p->st[k][bj] + i0 * rs[k]) * p->es[k];
            h->row(h, rp, rs, n);
        }
    }
    if (h->stream)
        h->isa->fence();
}

static void job_range(void *ctx, int64_t begin, int64_t end)
{
    const job_head *h = ctx;
    plan_walk(&h->pl, begin, end, h->row, h);
    if (h->stream)
        h->isa->fence();
}

/* Plan and run a job; `h` must be the first member of the job. */
static ndm_status job_run(job_head *h, int ndim, const int64_t *shape, int nops, char *const *data,
                          const int64_t *const *strides, const size_t *esize, int64_t grain)
{
    if (!plan_init(&h->pl, ndim, shape, nops, data, strides, esize))
        return NDM_E_OOM;
    for (int k = 0; k < nops; k++)
        h->pl.st1[k] = h->pl.st[k][0];
    if (h->pl.total > 0) {
        int64_t min = atomic_load_explicit(&stream_min_bytes, memory_order_relaxed);
        h->stream = h->stream && h->isa->stream && h->pl.total * h->pl.es[0] >= min;
        h->bj = blocked_axis(&h->pl);
        if (h->bj >= 0) {
            /* rows of at most BLOCK elements: no streaming through tiles */
            h->stream = false;
            h->nbi = (h->pl.shape[h->pl.nd - 1] + BLOCK - 1) / BLOCK;
            h->nbj = (h->pl.shape[h->bj] + BLOCK - 1) / BLOCK;
            int64_t per = h->pl.shape[h->pl.nd - 1] * h->pl.shape[h->bj];
            int64_t blocks = h->pl.total / per * h->nbi * h->nbj;
            int64_t g = grain / (BLOCK * BLOCK);
            ndm__parallel_for(blocks, g > 0 ? g : 1, blocked_range, h);
        } else if (h->pl.total <= grain) {
            job_range(h, 0, h->pl.total);
        } else {
            ndm__parallel_for(h->pl.total, grain, job_range, h);
        }
    }
    plan_free(&h->pl);
    return NDM_OK;
}

/* Write a computed tile: converted to the output dtype, streamed past the
 * cache, or moved (the output is strided). */
static void tile_out(const job_head *h, ndm__ew_conv_fn conv, size_t es, char *dst, int64_t ds,
                     const void *tile, int64_t m)
{
    if (conv)
        conv(dst, ds, tile, 1, m);
    else if (h->stream && ds == 1)
        h->isa->stream(dst, tile, (size_t)m * es);
    else
        h->isa->move[es](dst, ds, tile, 1, m);
}

/* ---- binary ---------------------------------------------------------------- */

typedef struct bin_job {
    job_head h;
    ndm__ew_bin_fn k;
    ndm__ew_conv_fn conv_a, conv_b; /* input dtype -> ct; NULL when equal */
    ndm__ew_conv_fn conv_o;         /* result type -> out dtype; NULL when equal */
    size_t es_a, es_b, es_o, es_ct, es_r;
} bin_job;

static void bin_row(const void *job, char *const *p, const int64_t *s, int64_t n)
{
    const bin_job *J = job;
    int64_t so = s[0], sa = s[1], sb = s[2];
    bool a_unit = !J->conv_a && (sa == 1 || sa == 0);
    bool b_unit = !J->conv_b && (sb == 1 || sb == 0);
    bool o_unit = !J->conv_o && so == 1 && !J->h.stream;
    if (a_unit && b_unit && o_unit && (sa | sb)) {
        J->k(p[0], p[1], sa, p[2], sb, n);
        return;
    }
    _Alignas(64) unsigned char ta[TILE * 8], tb[TILE * 8], to[TILE * 8];
    /* A stride-0 operand is converted once. */
    const void *ca = NULL, *cb = NULL;
    if (sa == 0) {
        ca = J->conv_a ? (J->conv_a(ta, 1, p[1], 0, 1), (const void *)ta) : p[1];
    }
    if (sb == 0) {
        cb = J->conv_b ? (J->conv_b(tb, 1, p[2], 0, 1), (const void *)tb) : p[2];
    }
    if (ca && cb) {
        J->k(to, ca, 1, cb, 1, 1);
        ndm__ew_conv_fn fill = J->conv_o ? J->conv_o : J->h.isa->move[J->es_r];
        fill(p[0], so, to, 0, n);
        return;
    }
    for (int64_t i0 = 0; i0 < n; i0 += TILE) {
        int64_t m = n - i0 < TILE ? n - i0 : TILE;
        const void *xa = ca, *xb = cb;
        int64_t xsa = ca ? 0 : 1, xsb = cb ? 0 : 1;
        if (!xa) {
            char *src = p[1] + i0 * sa * (int64_t)J->es_a;
            if (J->conv_a) {
                J->conv_a(ta, 1, src, sa, m);
                xa = ta;
            } else if (sa == 1) {
                xa = src;
            } else {
                J->h.isa->move[J->es_a](ta, 1, src, sa, m);
                xa = ta;
            }
        }
        if (!xb) {
            char *src = p[2] + i0 * sb * (int64_t)J->es_b;
            if (J->conv_b) {
                J->conv_b(tb, 1, src, sb, m);
                xb = tb;
            } else if (sb == 1) {
                xb = src;
            } else {
                J->h.isa->move[J->es_b](tb, 1, src, sb, m);
                xb = tb;
            }
        }
        char *dst = p[0] + i0 * so * (int64_t)J->es_o;
        if (o_unit) {
            J->k(dst, xa, xsa, xb, xsb, m);
        } else {
            J->k(to, xa, xsa, xb, xsb, m);
            tile_out(&J->h, J->conv_o, J->es_r, dst, so, to, m);
        }
    }
}

static ndm__ew_conv_fn conv_or_null(const ndm__ew_isa *isa, ndm_dtype from, ndm_dtype to)
{
    return from == to ? NULL : isa->conv[from][to];
}

static bool is_math(ndm__ew_binop op) { return ndm__ew_binop_has(op, NDM__EWF_COSTLY); }

/* The planned path (its frame holds the plan: kept out of the small path). */
__attribute__((noinline)) static ndm_status bin_run(ndm__ew_binop op, ndm_dtype ct,
                                                   const ndm__tensor *out, const ndm__tensor *a,
                                                   const void *a_scalar, const ndm__tensor *b,
                                                   const void *b_scalar)
{
    const ndm__ew_isa *isa = ndm__ew_isa_active();
    ndm_dtype rt = ndm__ew_binop_is_bool(op) ? NDM_BOOL : ct;
    ndm_dtype adt = a ? a->dtype : ct, bdt = b ? b->dtype : ct;
    bin_job J;
    J.h.row = bin_row;
    J.h.isa = isa;
    J.h.stream = true;
    J.k = isa->bin[op][ct];
    if (!J.k)
        return NDM_E_UNSUPPORTED;
    J.conv_a = conv_or_null(isa, adt, ct);
    J.conv_b = conv_or_null(isa, bdt, ct);
    J.conv_o = conv_or_null(isa, rt, out->dtype);
    J.es_a = ndm__ew_esize(adt);
    J.es_b = ndm__ew_esize(bdt);
    J.es_o = ndm__ew_esize(out->dtype);
    J.es_ct = ndm__ew_esize(ct);
    J.es_r = ndm__ew_esize(rt);
    char *data[3] = {out->data, a ? a->data : (char *)a_scalar, b ? b->data : (char *)b_scalar};
    const int64_t *strides[3] = {out->strides, a ? a->strides : NULL, b ? b->strides : NULL};
    size_t es[3] = {J.es_o, J.es_a, J.es_b};
    return job_run(&J.h, out->ndim, out->shape, 3, data, strides, es,
                   is_math(op) ? GRAIN_MATH : GRAIN_CHEAP);
}

/* One kernel call when direct_count allows; -1 to take the planned path. */
static inline int bin_direct(ndm__ew_binop op, ndm_dtype ct, const ndm__tensor *out,
                             const ndm__tensor *a, const void *as, const ndm__tensor *b,
                             const void *bs)
{
    ndm_dtype rt = ndm__ew_binop_is_bool(op) ? NDM_BOOL : ct;
    int64_t n = direct_count(out, rt, a, b, ct);
    if (n < 0)
        return -1;
    ndm__ew_bin_fn k = ndm__ew_isa_active()->bin[op][ct];
    if (!k)
        return NDM_E_UNSUPPORTED;
    if (n)
        k(out->data, a ? a->data : as, a != NULL, b ? b->data : bs, b != NULL, n);
    return NDM_OK;
}

static ndm_status cpu_binary(int device, ndm__ew_binop op, ndm_dtype ct, const ndm__tensor *out,
                             const ndm__tensor *a, const ndm__tensor *b)
{
    (void)device;
    int st = bin_direct(op, ct, out, a, NULL, b, NULL);
    return st != -1 ? (ndm_status)st : bin_run(op, ct, out, a, NULL, b, NULL);
}

/* cpu_binary_flat's other cases: large operands take the threaded walk,
 * over one axis; the first call builds the tables (out of the small path's
 * frame). */
static __attribute__((noinline)) ndm_status binary_flat_slow(ndm__ew_binop op, ndm_dtype t,
                                                             void *out, const void *a,
                                                             const void *b, int64_t n)
{
    if (n > GRAIN_CHEAP) {
        int64_t one = 1;
        ndm__tensor to = {out, t, 1, &n, &one}, ta = {(void *)a, t, 1, &n, &one},
                    tb = {(void *)b, t, 1, &n, &one};
        return bin_run(op, t, &to, &ta, NULL, &tb, NULL);
    }
    ndm__ew_bin_fn k = ndm__ew_isa_active()->bin[op][t];
    if (!k)
        return NDM_E_UNSUPPORTED;
    if (n)
        k(out, a, 1, b, 1, n);
    return NDM_OK;
}

static ndm_status cpu_binary_flat(int device, ndm__ew_binop op, ndm_dtype t, void *out,
                                  const void *a, const void *b, int64_t n)
{
    (void)device;
    /* Small, the ISA chosen and its tables built: the kernel, straight. */
    int level = atomic_load_explicit(&ndm__cpu_isa_now, memory_order_relaxed);
    if (__builtin_expect(n > GRAIN_CHEAP || level < 0 ||
                             !atomic_load_explicit(&tables_built, memory_order_acquire),
                         0))
        return binary_flat_slow(op, t, out, a, b, n);
    ndm__ew_bin_fn k = tables[level].bin[op][t];
    if (!k)
        return NDM_E_UNSUPPORTED;
    if (n)
        k(out, a, 1, b, 1, n);
    return NDM_OK;
}

static ndm_status cpu_binary_scalar(int device, ndm__ew_binop op, ndm_dtype ct,
                                    const ndm__tensor *out, const ndm__tensor *a, const void *s,
                                    bool swap)
{
    (void)device;
    const ndm__tensor *x = swap ? NULL : a, *y = swap ? a : NULL;
    const void *xs = swap ? s : NULL, *ys = swap ? NULL : s;
    int st = bin_direct(op, ct, out, x, xs, y, ys);
    return st != -1 ? (ndm_status)st : bin_run(op, ct, out, x, xs, y, ys);
}

/* ---- unary ----------------------------------------------------------------- */

typedef struct un_job {
    job_head h;
    ndm__ew_un_fn k;
    const void *params;
    ndm__ew_conv_fn conv_a, conv_o;
    size_t es_a, es_o, es_r;
} un_job;

static void un_row(const void *job, char *const *p, const int64_t *s, int64_t n)
{
    const un_job *J = job;
    int64_t so = s[0], sa = s[1];
    _Alignas(64) unsigned char ta[TILE * 8], to[TILE * 8];
    if (sa == 0) {
        const void *x = p[1];
        if (J->conv_a) {
            J->conv_a(ta, 1, p[1], 0, 1);
            x = ta;
        }
        J->k(to, x, 1, J->params);
        ndm__ew_conv_fn fill = J->conv_o ? J->conv_o : J->h.isa->move[J->es_r];
        fill(p[0], so, to, 0, n);
        return;
    }
    bool a_unit = !J->conv_a && sa == 1;
    bool o_unit = !J->conv_o && so == 1 && !J->h.stream;
    if (a_unit && o_unit) {
        J->k(p[0], p[1], n, J->params);
        return;
    }
    for (int64_t i0 = 0; i0 < n; i0 += TILE) {
        int64_t m = n - i0 < TILE ? n - i0 : TILE;
        char *src = p[1] + i0 * sa * (int64_t)J->es_a;
        const void *xa = src;
        if (J->conv_a) {
            J->conv_a(ta, 1, src, sa, m);
            xa = ta;
        } else if (sa != 1) {
            J->h.isa->move[J->es_a](ta, 1, src, sa, m);
            xa = ta;
        }
        char *dst = p[0] + i0 * so * (int64_t)J->es_o;
        if (o_unit) {
            J->k(dst, xa, m, J->params);
        } else {
            J->k(to, xa, m, J->params);
            tile_out(&J->h, J->conv_o, J->es_r, dst, so, to, m);
        }
    }
}

__attribute__((noinline)) static ndm_status un_run(ndm__ew_unop op, ndm_dtype ct,
                                                  const ndm__tensor *out, const ndm__tensor *a,
                                                  const void *params)
{
    const ndm__ew_isa *isa = ndm__ew_isa_active();
    ndm_dtype rt = ct;
    un_job J;
    J.h.row = un_row;
    J.h.isa = isa;
    J.h.stream = true;
    J.k = isa->un[op][ct];
    if (!J.k)
        return NDM_E_UNSUPPORTED;
    J.params = params;
    J.conv_a = conv_or_null(isa, a->dtype, ct);
    J.conv_o = conv_or_null(isa, rt, out->dtype);
    J.es_a = ndm__ew_esize(a->dtype);
    J.es_o = ndm__ew_esize(out->dtype);
    J.es_r = ndm__ew_esize(rt);
    char *data[2] = {out->data, a->data};
    const int64_t *strides[2] = {out->strides, a->strides};
    size_t es[2] = {J.es_o, J.es_a};
    return job_run(&J.h, out->ndim, out->shape, 2, data, strides, es,
                   ndm__ew_unop_has(op, NDM__EWF_COSTLY) ? GRAIN_MATH : GRAIN_CHEAP);
}

static ndm_status cpu_unary(int device, ndm__ew_unop op, ndm_dtype ct, const ndm__tensor *out,
                            const ndm__tensor *a, const void *params)
{
    (void)device;
    int64_t n = direct_count(out, ct, a, NULL, ct);
    if (n < 0)
        return un_run(op, ct, out, a, params);
    ndm__ew_un_fn k = ndm__ew_isa_active()->un[op][ct];
    if (!k)
        return NDM_E_UNSUPPORTED;
    if (n)
        k(out->data, a->data, n, params);
    return NDM_OK;
}

/* ---- where ----------------------------------------------------------------- */

typedef struct where_job {
    job_head h;
    ndm__ew_where_fn k;
    ndm__ew_conv_fn conv_c, conv_a, conv_b, conv_o;
    size_t es_c, es_a, es_b, es_o, es_ct;
} where_job;

/* Operand of a where row: constant (converted once), unit (direct) or
 * gathered into a tile. */
static const void *where_in(const where_job *J, ndm__ew_conv_fn conv, size_t es, char *p,
                            int64_t s, int64_t i0, int64_t m, unsigned char *tile)
{
    if (s == 0) {
        if (!conv)
            return p;
        conv(tile, 1, p, 0, 1);
        return tile;
    }
    char *src = p + i0 * s * (int64_t)es;
    if (conv) {
        conv(tile, 1, src, s, m);
        return tile;
    }
    if (s == 1)
        return src;
    J->h.isa->move[es](tile, 1, src, s, m);
    return tile;
}

static void where_row(const void *job, char *const *p, const int64_t *s, int64_t n)
{
    const where_job *J = job;
    int64_t so = s[0], sc = s[1], sa = s[2], sb = s[3];
    _Alignas(64) unsigned char tc[TILE], ta[TILE * 8], tb[TILE * 8], to[TILE * 8];
    bool o_unit = !J->conv_o && so == 1 && !J->h.stream;
    for (int64_t i0 = 0; i0 < n; i0 += TILE) {
        int64_t m = n - i0 < TILE ? n - i0 : TILE;
        const uint8_t *c;
        if (sc == 0) {
            uint8_t v;
            if (J->conv_c)
                J->conv_c(&v, 1, p[1], 0, 1);
            else
                v = *(const uint8_t *)p[1];
            memset(tc, v, (size_t)m);
            c = tc;
        } else {
            c = where_in(J, J->conv_c, J->es_c, p[1], sc, i0, m, tc);
        }
        const void *xa = where_in(J, J->conv_a, J->es_a, p[2], sa, i0, m, ta);
        const void *xb = where_in(J, J->conv_b, J->es_b, p[3], sb, i0, m, tb);
        char *dst = p[0] + i0 * so * (int64_t)J->es_o;
        if (o_unit) {
            J->k(dst, c, xa, sa != 0, xb, sb != 0, m);
        } else {
            J->k(to, c, xa, sa != 0, xb, sb != 0, m);
            tile_out(&J->h, J->conv_o, J->es_ct, dst, so, to, m);
        }
    }
}

static ndm_status cpu_where(int device, ndm_dtype ct, const ndm__tensor *out,
                            const ndm__tensor *cond, const ndm__tensor *a, const ndm__tensor *b)
{
    (void)device;
    const ndm__ew_isa *isa = ndm__ew_isa_active();
    where_job J;
    J.h.row = where_row;
    J.h.isa = isa;
    J.h.stream = true;
    J.k = isa->where[ct];
    J.conv_c = conv_or_null(isa, cond->dtype, NDM_BOOL);
    J.conv_a = conv_or_null(isa, a->dtype, ct);
    J.conv_b = conv_or_null(isa, b->dtype, ct);
    J.conv_o = conv_or_null(isa, ct, out->dtype);
    J.es_c = ndm__ew_esize(cond->dtype);
    J.es_a = ndm__ew_esize(a->dtype);
    J.es_b = ndm__ew_esize(b->dtype);
    J.es_o = ndm__ew_esize(out->dtype);
    J.es_ct = ndm__ew_esize(ct);
    char *data[4] = {out->data, cond->data, a->data, b->data};
    const int64_t *strides[4] = {out->strides, cond->strides, a->strides, b->strides};
    size_t es[4] = {J.es_o, J.es_c, J.es_a, J.es_b};
    return job_run(&J.h, out->ndim, out->shape, 4, data, strides, es, GRAIN_CHEAP);
}

/* ---- converting copy ------------------------------------------------------- */

typedef struct copy_job {
    job_head h;
    ndm__ew_conv_fn conv; /* NULL for a same-dtype move */
    size_t es_d, es_s;
} copy_job;

static void copy_row(const void *job, char *const *p, const int64_t *s, int64_t n)
{
    const copy_job *J = job;
    int64_t sd = s[0], ss = s[1];
    if (J->h.stream && sd == 1) {
        if (!J->conv && ss == 1) {
            J->h.isa->stream(p[0], p[1], (size_t)n * J->es_d);
            return;
        }
        _Alignas(64) unsigned char to[TILE * 8];
        ndm__ew_conv_fn f = J->conv ? J->conv : J->h.isa->move[J->es_s];
        for (int64_t i0 = 0; i0 < n; i0 += TILE) {
            int64_t m = n - i0 < TILE ? n - i0 : TILE;
            f(to, 1, p[1] + i0 * ss * (int64_t)J->es_s, ss, m);
            J->h.isa->stream(p[0] + i0 * (int64_t)J->es_d, to, (size_t)m * J->es_d);
        }
        return;
    }
    if (J->conv)
        J->conv(p[0], sd, p[1], ss, n);
    else
        J->h.isa->move[J->es_d](p[0], sd, p[1], ss, n);
}

ndm_status ndm__cpu_copy_fast(int device, const ndm__tensor *dst, const ndm__tensor *src)
{
    (void)device;
    const ndm__ew_isa *isa = ndm__ew_isa_active();
    copy_job J;
    J.h.row = copy_row;
    J.h.isa = isa;
    J.h.stream = true;
    J.conv = conv_or_null(isa, src->dtype, dst->dtype);
    J.es_d = ndm__ew_esize(dst->dtype);
    J.es_s = ndm__ew_esize(src->dtype);
    char *data[2] = {dst->data, src->data};
    const int64_t *strides[2] = {dst->strides, src->strides};
    size_t es[2] = {J.es_d, J.es_s};
    return job_run(&J.h, dst->ndim, dst->shape, 2, data, strides, es, GRAIN_CHEAP);
}

const ndm__backend_ew ndm__cpu_ew = {
    .binary = cpu_binary,
    .binary_scalar = cpu_binary_scalar,
    .unary = cpu_unary,
    .where = cpu_where,
    .binary_flat = cpu_binary_flat,
    .relu_grad_flat = ndm__cpu_relu_grad_flat,
    .optim_flat = ndm__cpu_optim_flat,
};
