/* Fast CPU index kernels: operands whose axes merge into (outer, axis, inner)
 * runs take typed loops, split across the thread pool; anything else goes
 * to the reference kernels (index_ref.c). */
#include <stdatomic.h>
#include <string.h>

#include "convert.h"
#include "index_cpu.h"
#include "parallel.h"

/* Work below about this many bytes stays on the calling thread. */
#define PAR_BYTES ((int64_t)1 << 17)

/* Items per chunk so that a chunk moves at least PAR_BYTES / 2 bytes. */
static int64_t grain_for(int64_t bytes_per_item)
{
    int64_t per = (PAR_BYTES / 2) / (bytes_per_item > 0 ? bytes_per_item : 1);
    return per > 0 ? per : 1;
}

/* ---- copy: the core copy, split over the outer axes ------------------------------ */

typedef struct copy_job {
    const ndm__tensor *dst, *src;
    int d;                   /* the axis split; axes before it are walked */
    atomic_int status;
} copy_job;

static void copy_range(void *ctx, int64_t b, int64_t e)
{
    copy_job *j = ctx;
    const ndm__tensor *dt = j->dst, *st = j->src;
    int d = j->d, nd = dt->ndim - d;
    int64_t len = dt->shape[d];
    int64_t dsz = (int64_t)ndm_dtype_size(dt->dtype), ssz = (int64_t)ndm_dtype_size(st->dtype);
    ndm__coords cs;
    int64_t *shape = ndm__coords_get(&cs, (size_t)nd);
    if (!shape) {
        atomic_store(&j->status, NDM_E_OOM);
        return;
    }
    memcpy(shape, dt->shape + d, (size_t)nd * sizeof *shape);
    while (b < e) {
        int64_t o = b / len, x = b % len;
        int64_t seg = e - b < len - x ? e - b : len - x;
        int64_t doff = x * dt->strides[d], soff = x * st->strides[d];
        for (int k = d - 1; k >= 0; k--) {
            int64_t c = o % dt->shape[k];
            o /= dt->shape[k];
            doff += c * dt->strides[k];
            soff += c * st->strides[k];
        }
        shape[0] = seg;
        ndm__tensor sd = {(char *)dt->data + doff * dsz, dt->dtype, nd, shape, dt->strides + d};
        ndm__tensor ss = {(char *)st->data + soff * ssz, st->dtype, nd, shape, st->strides + d};
        ndm_status s = ndm__cpu_copy(0, &sd, &ss);
        if (s < 0)
            atomic_store(&j->status, s);
        b += seg;
    }
    ndm__coords_put(&cs);
}

/* A transposed read: dst runs along its last axis, src along the one
 * before. Copying by square tiles keeps both sides' cache lines in use
 * instead of touching a new source line for every element. */
#define TT 32

typedef struct transpose_job {
    const ndm__tensor *dst, *src;
    int64_t rows, cols, rtiles, ctiles;
    void (*tile)(char *d, const char *s, int64_t ds, int64_t ss, int64_t r, int64_t c);
} transpose_job;

/* d[i * ds + k] = s[i + k * ss] for i < r, k < c, through a buffer: each
 * source run is read once whole and each destination run written once
 * whole, so runs a power-of-two stride apart (which share cache sets) need
 * not stay in cache together. */
#define NDM__TILE(N, T)                                                         \
    static void tile_##N(char *d, const char *s, int64_t ds, int64_t ss, int64_t r, int64_t c) \
    {                                                                           \
        T buf[TT][TT];                                                          \
        if (r == TT && c == TT) { /* constant bounds: unrolled, vectorised */   \
            for (int64_t k = 0; k < TT; k++)                                    \
                for (int64_t i = 0; i < TT; i++)                                \
                    buf[k][i] = ((const T *)s)[i + k * ss];                     \
            for (int64_t i = 0; i < TT; i++)                                    \
                for (int64_t k = 0; k < TT; k++)                                \
                    ((T *)d)[i * ds + k] = buf[k][i];                           \
            return;                                                             \
        }                                                                       \
        for (int64_t k = 0; k < c; k++)                                         \
            for (int64_t i = 0; i < r; i++)                                     \
                buf[k][i] = ((const T *)s)[i + k * ss];                         \
        for (int64_t i = 0; i < r; i++)                                         \
            for (int64_t k = 0; k < c; k++)                                     \
                ((T *)d)[i * ds + k] = buf[k][i];                               \
    }
NDM__TILE(s1, uint8_t)
NDM__TILE(s2, uint16_t)
NDM__TILE(s4, uint32_t)
NDM__TILE(s8, uint64_t)

static void transpose_range(void *ctx, int64_t b, int64_t e)
{
    const transpose_job *j = ctx;
    const ndm__tensor *dt = j->dst, *st = j->src;
    int nd = dt->ndim;
    int64_t es = (int64_t)ndm_dtype_size(dt->dtype), per = j->rtiles * j->ctiles;
    for (int64_t t = b; t < e; t++) {
        /* t = (leading index, row tile, column tile) */
        int64_t lead = t / per, rt = t % per / j->ctiles, ct = t % j->ctiles;
        int64_t doff = 0, soff = 0;
        for (int k = nd - 3; k >= 0; k--) {
            int64_t c = lead % dt->shape[k];
            lead /= dt->shape[k];
            doff += c * dt->strides[k];
            soff += c * st->strides[k];
        }
        int64_t r0 = rt * TT, c0 = ct * TT;
        doff += r0 * dt->strides[nd - 2] + c0;
        soff += r0 + c0 * st->strides[nd - 1];
        j->tile((char *)dt->data + doff * es, (const char *)st->data + soff * es,
                dt->strides[nd - 2], st->strides[nd - 1],
                j->rows - r0 < TT ? j->rows - r0 : TT, j->cols - c0 < TT ? j->cols - c0 : TT);
    }
}

static bool transposed(const ndm__tensor *dst, const ndm__tensor *src)
{
    int nd = dst->ndim;
    return nd >= 2 && dst->dtype == src->dtype && dst->strides[nd - 1] == 1 &&
           src->strides[nd - 2] == 1 && src->strides[nd - 1] != 1 && dst->shape[nd - 1] > 1 &&
           dst->shape[nd - 2] > 1;
}

static ndm_status fast_copy(int device, const ndm__tensor *dst, const ndm__tensor *src)
{
    int64_t n = ndm__numel_t(dst);
    int64_t es = (int64_t)(ndm_dtype_size(dst->dtype) + ndm_dtype_size(src->dtype));
    int threads = ndm__num_threads();
    if (n > 0 && transposed(dst, src)) {
        int nd = dst->ndim;
        transpose_job j = {dst, src, dst->shape[nd - 2], dst->shape[nd - 1], 0, 0, NULL};
        j.rtiles = (j.rows + TT - 1) / TT;
        j.ctiles = (j.cols + TT - 1) / TT;
        switch (ndm_dtype_size(dst->dtype)) {
        case 1: j.tile = tile_s1; break;
        case 2: j.tile = tile_s2; break;
        case 4: j.tile = tile_s4; break;
        default: j.tile = tile_s8; break;
        }
        int64_t tiles = n / (j.rows * j.cols) * j.rtiles * j.ctiles;
        ndm__parallel_for(tiles, grain_for(TT * TT * es), transpose_range, &j);
        return NDM_OK;
    }
    if (threads == 1 || dst->ndim == 0 || n * es < 2 * PAR_BYTES)
        return ndm__cpu_copy(device, dst, src);
    /* Split the first axis at which there are enough pieces for every thread. */
    int64_t pieces = 1;
    int d = 0;
    for (; d < dst->ndim; d++) {
        pieces *= dst->shape[d];
        if (pieces >= 4 * threads || d == dst->ndim - 1)
            break;
    }
    copy_job j = {dst, src, d, NDM_OK};
    ndm__parallel_for(pieces, grain_for(n / pieces * es), copy_range, &j);
    return (ndm_status)atomic_load(&j.status);
}

/* ---- find_outside ---------------------------------------------------------------- */

typedef struct find_job {
    const void *data;
    ndm_dtype dtype;
    int64_t lo, hi;
    atomic_llong first;      /* smallest bad position found */
} find_job;

/* Blocks are tested without branches (so they vectorise); a bad block is
 * then searched for its first bad entry. */
#define NDM__FIND(N, T)                                                         \
    static int64_t find_##N(const T *p, int64_t b, int64_t e, int64_t lo, int64_t hi) \
    {                                                                           \
        for (int64_t i = b; i < e; i += 256) {                                  \
            int64_t m = e - i < 256 ? e - i : 256;                              \
            int bad = 0;                                                        \
            for (int64_t k = 0; k < m; k++)                                     \
                bad |= ((int64_t)p[i + k] < lo) | ((int64_t)p[i + k] >= hi);    \
            if (bad)                                                            \
                for (int64_t k = 0; k < m; k++)                                 \
                    if ((int64_t)p[i + k] < lo || (int64_t)p[i + k] >= hi)      \
                        return i + k;                                           \
        }                                                                       \
        return -1;                                                              \
    }
NDM__FIND(u8, uint8_t)
NDM__FIND(i32, int32_t)
NDM__FIND(i64, int64_t)

static void find_range(void *ctx, int64_t b, int64_t e)
{
    find_job *j = ctx;
    int64_t at = j->dtype == NDM_U8    ? find_u8(j->data, b, e, j->lo, j->hi)
                 : j->dtype == NDM_I32 ? find_i32(j->data, b, e, j->lo, j->hi)
                                       : find_i64(j->data, b, e, j->lo, j->hi);
    if (at < 0)
        return;
    long long cur = atomic_load(&j->first);
    while (at < cur && !atomic_compare_exchange_weak(&j->first, &cur, at))
        ;
}

static ndm_status fast_find_outside(int device, const ndm__tensor *idx, int64_t lo, int64_t hi,
                                    int64_t *pos, int64_t *value)
{
    if (!ndm__contig_t(idx))
        return ndm__ref_find_outside(device, idx, lo, hi, pos, value);
    int64_t n = ndm__numel_t(idx);
    find_job j = {idx->data, idx->dtype, lo, hi, INT64_MAX};
    ndm__parallel_for(n, grain_for((int64_t)ndm_dtype_size(idx->dtype)), find_range, &j);
    int64_t first = atomic_load(&j.first);
    *pos = first == INT64_MAX ? -1 : first;
    if (*pos >= 0)
        *value = ndm__idx_at(idx, first);
    return NDM_OK;
}

/* ---- take ------------------------------------------------------------------------ */

/* Rows (o, k): dst[o, k, :] = src[o, idx[k], :], each of I elements. */
typedef struct take_job {
    const char *src;
    char *dst;
    const void *idx;
    int64_t n, J, I;
    int64_t so, sa, si;      /* src strides: outer, axis, inner */
    int64_t dout, dj, di;    /* dst strides: outer, index, inner */
    int64_t is;              /* index stride */
    void (*rows)(const struct take_job *, int64_t, int64_t);
} take_job;

#define NDM__TAKE(N, T, IN, IT)                                                 \
    static void take_##N##_##IN(const take_job *j, int64_t b, int64_t e)        \
    {                                                                           \
        const IT *ix = (const IT *)j->idx;                                      \
        int64_t o = b / j->J, k = b % j->J;                                     \
        for (int64_t r = b; r < e; r++) {                                       \
            int64_t v = (int64_t)ix[k * j->is];                                 \
            v += v < 0 ? j->n : 0;                                              \
            const T *s = (const T *)j->src + o * j->so + v * j->sa;             \
            T *d = (T *)j->dst + o * j->dout + k * j->dj;                       \
            if (j->I == 1)                                                      \
                *d = *s;                                                        \
            else if (j->si == 1 && j->di == 1)                                  \
                memcpy(d, s, (size_t)j->I * sizeof(T));                         \
            else                                                                \
                for (int64_t i = 0; i < j->I; i++)                              \
                    d[i * j->di] = s[i * j->si];                                \
            if (++k == j->J) {                                                  \
                k = 0;                                                          \
                o++;                                                            \
            }                                                                   \
        }                                                                       \
    }
/* X(element size name, type) crossed with the index types */
#define NDM__SIZES(X, ...)                                                      \
    X(s1, uint8_t, __VA_ARGS__) X(s2, uint16_t, __VA_ARGS__)                    \
    X(s4, uint32_t, __VA_ARGS__) X(s8, uint64_t, __VA_ARGS__)
#define NDM__TAKE_IDX(N, T, _)                                                  \
    NDM__TAKE(N, T, u8, uint8_t) NDM__TAKE(N, T, i32, int32_t) NDM__TAKE(N, T, i64, int64_t)
NDM__SIZES(NDM__TAKE_IDX, _)

/* Pick a typed function from a table indexed by element size and index type. */
static int size_slot(size_t es) { return es == 1 ? 0 : es == 2 ? 1 : es == 4 ? 2 : 3; }
static int idx_slot(ndm_dtype t) { return t == NDM_U8 ? 0 : t == NDM_I32 ? 1 : 2; }

static void (*const take_fns[4][3])(const take_job *, int64_t, int64_t) = {
    {take_s1_u8, take_s1_i32, take_s1_i64},
    {take_s2_u8, take_s2_i32, take_s2_i64},
    {take_s4_u8, take_s4_i32, take_s4_i64},
    {take_s8_u8, take_s8_i32, take_s8_i64},
};

static void take_range(void *ctx, int64_t b, int64_t e)
{
    const take_job *j = ctx;
    j->rows(j, b, e);
}

static ndm_status fast_take(int device, const ndm__tensor *dst, const ndm__tensor *src, int axis,
                            const ndm__tensor *idx)
{
    int k = idx->ndim, snd = src->ndim;
    take_job j = {.src = src->data, .dst = dst->data, .idx = idx->data, .n = src->shape[axis],
                  .sa = src->strides[axis]};
    int64_t outer, ignore;
    if (!ndm__merge_axes(src, 0, axis, &ignore, &j.so) ||
        !ndm__merge_axes(src, axis + 1, snd, &j.I, &j.si) ||
        !ndm__merge_axes(dst, 0, axis, &outer, &j.dout) ||
        !ndm__merge_axes(dst, axis, axis + k, &j.J, &j.dj) ||
        !ndm__merge_axes(dst, axis + k, dst->ndim, &ignore, &j.di) ||
        !ndm__merge_axes(idx, 0, k, &ignore, &j.is))
        return ndm__ref_take(device, dst, src, axis, idx);
    int64_t rows = outer * j.J;
    if (rows == 0 || j.I == 0)
        return NDM_OK;
    size_t es = ndm_dtype_size(dst->dtype);
    j.rows = take_fns[size_slot(es)][idx_slot(idx->dtype)];
    ndm__parallel_for(rows, grain_for(j.I * (int64_t)es + 8), take_range, &j);
    return NDM_OK;
}

/* ---- gather ---------------------------------------------------------------------- */

/* dst[o, k, i] = src[o, idx[o, k, i], i] over rows (o, k) of I elements. */
typedef struct gather_job {
    const char *src;
    char *dst;
    const void *idx;
    int64_t n, K, I;
    int64_t so, sa, si, dout, dk, di, io, ik, ii;
    void (*rows)(const struct gather_job *, int64_t, int64_t);
} gather_job;

#define NDM__GATHER(N, T, IN, IT)                                               \
    static void gather_##N##_##IN(const gather_job *j, int64_t b, int64_t e)    \
    {                                                                           \
        int64_t o = b / j->K, k = b % j->K;                                     \
        for (int64_t r = b; r < e; r++) {                                       \
            const IT *ix = (const IT *)j->idx + o * j->io + k * j->ik;          \
            const T *s = (const T *)j->src + o * j->so;                         \
            T *d = (T *)j->dst + o * j->dout + k * j->dk;                       \
            for (int64_t i = 0; i < j->I; i++) {                                \
                int64_t v = (int64_t)ix[i * j->ii];                             \
                v += v < 0 ? j->n : 0;                                          \
                d[i * j->di] = s[v * j->sa + i * j->si];                        \
            }                                                                   \
            if (++k == j->K) {                                                  \
                k = 0;                                                          \
                o++;                                                            \
            }                                                                   \
        }                                                                       \
    }
#define NDM__GATHER_IDX(N, T, _)                                                \
    NDM__GATHER(N, T, u8, uint8_t) NDM__GATHER(N, T, i32, int32_t)              \
    NDM__GATHER(N, T, i64, int64_t)
NDM__SIZES(NDM__GATHER_IDX, _)

static void (*const gather_fns[4][3])(const gather_job *, int64_t, int64_t) = {
    {gather_s1_u8, gather_s1_i32, gather_s1_i64},
    {gather_s2_u8, gather_s2_i32, gather_s2_i64},
    {gather_s4_u8, gather_s4_i32, gather_s4_i64},
    {gather_s8_u8, gather_s8_i32, gather_s8_i64},
};

static void gather_range(void *ctx, int64_t b, int64_t e)
{
    const gather_job *j = ctx;
    j->rows(j, b, e);
}

/* Merge axes [from, to) of three same-shaped tensors alike. */
static bool merge3(const ndm__tensor *a, const ndm__tensor *b, const ndm__tensor *c, int from,
                   int to, int64_t *n, int64_t *sa, int64_t *sb, int64_t *sc)
{
    int64_t nb, nc;
    return ndm__merge_axes(a, from, to, n, sa) && ndm__merge_axes(b, from, to, &nb, sb) &&
           ndm__merge_axes(c, from, to, &nc, sc);
}

static ndm_status fast_gather(int device, const ndm__tensor *dst, const ndm__tensor *src,
                              int axis, const ndm__tensor *idx)
{
    int nd = dst->ndim;
    gather_job j = {.src = src->data, .dst = dst->data, .idx = idx->data, .n = src->shape[axis],
                    .K = dst->shape[axis], .sa = src->strides[axis], .dk = dst->strides[axis],
                    .ik = idx->strides[axis]};
    int64_t outer;
    if (!merge3(dst, src, idx, 0, axis, &outer, &j.dout, &j.so, &j.io) ||
        !merge3(dst, src, idx, axis + 1, nd, &j.I, &j.di, &j.si, &j.ii))
        return ndm__ref_gather(device, dst, src, axis, idx);
    int64_t rows = outer * j.K;
    if (rows == 0 || j.I == 0)
        return NDM_OK;
    size_t es = ndm_dtype_size(dst->dtype);
    j.rows = gather_fns[size_slot(es)][idx_slot(idx->dtype)];
    ndm__parallel_for(rows, grain_for(j.I * (int64_t)(es + 8)), gather_range, &j);
    return NDM_OK;
}

/* ---- scatter_add ----------------------------------------------------------------- */

/* Tasks are (o, column range) pieces: distinct pieces update distinct
 * elements of dst, so they run in parallel without atomics, and within a
 * piece targets are updated in the order of k, as the reference does. */
typedef struct scatter_job {
    char *dst;
    const char *src;
    const void *idx;
    int64_t n, K, I, chunk, chunks;
    int64_t dout, da, di, so, sk, si, io, ik, ii;
    void (*cols)(const struct scatter_job *, int64_t o, int64_t i0, int64_t i1);
} scatter_job;

#define NDM__ADD_b8(a, b) ((uint8_t)((a) | (b)))
#define NDM__ADD_u8(a, b) ((uint8_t)((a) + (b)))
#define NDM__ADD_i32(a, b) ((int32_t)((uint32_t)(a) + (uint32_t)(b)))
#define NDM__ADD_i64(a, b) ((int64_t)((uint64_t)(a) + (uint64_t)(b)))
#define NDM__ADD_f16(a, b) ndm_f32_to_f16(ndm_f16_to_f32(a) + ndm_f16_to_f32(b))
#define NDM__ADD_bf16(a, b) ndm_f32_to_bf16(ndm_bf16_to_f32(a) + ndm_bf16_to_f32(b))
#define NDM__ADD_f32(a, b) ((a) + (b))
#define NDM__ADD_f64(a, b) ((a) + (b))

#define NDM__SCATTER(N, T, IN, IT)                                              \
    static void scatter_##N##_##IN(const scatter_job *j, int64_t o, int64_t i0, int64_t i1) \
    {                                                                           \
        T *d = (T *)j->dst + o * j->dout;                                       \
        const T *s = (const T *)j->src + o * j->so;                             \
        const IT *ix = (const IT *)j->idx + o * j->io;                          \
        for (int64_t k = 0; k < j->K; k++)                                      \
            for (int64_t i = i0; i < i1; i++) {                                 \
                int64_t v = (int64_t)ix[k * j->ik + i * j->ii];                 \
                v += v < 0 ? j->n : 0;                                          \
                T *t = d + v * j->da + i * j->di;                               \
                *t = NDM__ADD_##N(*t, s[k * j->sk + i * j->si]);                \
            }                                                                   \
    }
#define NDM__SCATTER_IDX(N, E, T)                                               \
    NDM__SCATTER(N, T, u8, uint8_t) NDM__SCATTER(N, T, i32, int32_t)            \
    NDM__SCATTER(N, T, i64, int64_t)
NDM__CPU_DTYPES(NDM__SCATTER_IDX)

#define NDM__SCATTER_ENTRY(N, E, T) [E] = {scatter_##N##_u8, scatter_##N##_i32, scatter_##N##_i64},
static void (*const scatter_fns[NDM_DTYPE_COUNT][3])(const scatter_job *, int64_t, int64_t,
                                                     int64_t) = {
    NDM__CPU_DTYPES(NDM__SCATTER_ENTRY)};

static void scatter_range(void *ctx, int64_t b, int64_t e)
{
    const scatter_job *j = ctx;
    for (int64_t t = b; t < e; t++) {
        int64_t o = t / j->chunks, c = t % j->chunks;
        int64_t i0 = c * j->chunk, i1 = i0 + j->chunk < j->I ? i0 + j->chunk : j->I;
        j->cols(j, o, i0, i1);
    }
}

static ndm_status fast_scatter_add(int device, const ndm__tensor *dst, int axis,
                                   const ndm__tensor *idx, const ndm__tensor *src)
{
    int nd = dst->ndim;
    scatter_job j = {.dst = dst->data, .src = src->data, .idx = idx->data, .n = dst->shape[axis],
                     .K = idx->shape[axis], .da = dst->strides[axis], .sk = src->strides[axis],
                     .ik = idx->strides[axis]};
    int64_t outer;
    if (!merge3(dst, src, idx, 0, axis, &outer, &j.dout, &j.so, &j.io) ||
        !merge3(idx, dst, src, axis + 1, nd, &j.I, &j.ii, &j.di, &j.si))
        return ndm__ref_scatter_add(device, dst, axis, idx, src);
    if (outer == 0 || j.I == 0 || j.K == 0)
        return NDM_OK;
    /* Enough pieces for the pool: split columns when there are few rows. */
    int64_t want = 4 * (int64_t)ndm__num_threads();
    j.chunks = outer >= want ? 1 : (want + outer - 1) / outer;
    j.chunk = (j.I + j.chunks - 1) / j.chunks;
    if (j.chunk < 64)
        j.chunk = j.I < 64 ? j.I : 64;
    j.chunks = (j.I + j.chunk - 1) / j.chunk;
    j.cols = scatter_fns[dst->dtype][idx_slot(idx->dtype)];
    int64_t tasks = outer * j.chunks;
    int64_t bytes = j.K * j.chunk * (int64_t)(ndm_dtype_size(dst->dtype) * 2 + 8);
    ndm__parallel_for(tasks, grain_for(bytes), scatter_range, &j);
    return NDM_OK;
}

/* ---- one_hot --------------------------------------------------------------------- */

typedef struct one_hot_job {
    char *dst;
    const void *idx;
    ndm_dtype it;
    int64_t classes;
    size_t es;
    unsigned char one[8];
} one_hot_job;

static void one_hot_range(void *ctx, int64_t b, int64_t e)
{
    const one_hot_job *j = ctx;
    size_t row = (size_t)j->classes * j->es;
    memset(j->dst + (size_t)b * row, 0, (size_t)(e - b) * row);
    ndm__tensor t = {(void *)j->idx, j->it, 0, NULL, NULL};
    for (int64_t r = b; r < e; r++)
        memcpy(j->dst + (size_t)r * row + (size_t)ndm__idx_at(&t, r) * j->es, j->one, j->es);
}

static ndm_status fast_one_hot(int device, const ndm__tensor *dst, const ndm__tensor *idx)
{
    if (!ndm__contig_t(dst) || !ndm__contig_t(idx))
        return ndm__ref_one_hot(device, dst, idx);
    one_hot_job j = {dst->data, idx->data, idx->dtype, dst->shape[dst->ndim - 1],
                     ndm_dtype_size(dst->dtype), {0}};
    double one = 1.0;
    ndm__tensor from = {&one, NDM_F64, 0, NULL, NULL}, to = {j.one, dst->dtype, 0, NULL, NULL};
    ndm_status st = ndm__cpu_copy(device, &to, &from);
    if (st < 0)
        return st;
    int64_t rows = ndm__numel_t(idx);
    if (j.classes == 0)
        return NDM_OK;
    ndm__parallel_for(rows, grain_for(j.classes * (int64_t)j.es), one_hot_range, &j);
    return NDM_OK;
}

/* ---- pad ------------------------------------------------------------------------- */

/* Rows along the last axis: a row whose outer coordinates fall in the
 * constant border is the constant; any other row is a source row with its
 * two ends made by the mode. */
typedef struct pad_job {
    const ndm__tensor *dst, *src;
    const int64_t *before;
    ndm_pad_mode mode;
    size_t es;
    unsigned char value[8];
    atomic_int status;
} pad_job;

static void fill_elems(char *d, int64_t n, size_t es, const unsigned char *v)
{
    switch (es) {
#define NDM__FILL(ES, T)                                                        \
    case ES: {                                                                  \
        T x;                                                                    \
        memcpy(&x, v, sizeof x);                                                \
        for (int64_t i = 0; i < n; i++)                                         \
            ((T *)d)[i] = x;                                                    \
        break;                                                                  \
    }
        NDM__FILL(1, uint8_t)
        NDM__FILL(2, uint16_t)
        NDM__FILL(4, uint32_t)
        NDM__FILL(8, uint64_t)
    }
}

static void pad_range(void *ctx, int64_t b, int64_t e)
{
    pad_job *j = ctx;
    const ndm__tensor *dt = j->dst, *st = j->src;
    int last = dt->ndim - 1;
    int64_t L = dt->shape[last], n = st->shape[last], bl = j->before[last];
    int64_t ss = st->strides[last];
    size_t es = j->es;
    ndm__coords cs;
    int64_t *c = ndm__coords_get(&cs, (size_t)(last > 0 ? last : 1));
    if (!c) {
        atomic_store(&j->status, NDM_E_OOM);
        return;
    }
    for (int64_t r = b, d = last - 1; d >= 0; d--) {
        c[d] = r % dt->shape[d];
        r /= dt->shape[d];
    }
    for (int64_t r = b; r < e; r++) {
        char *drow = (char *)dt->data + (size_t)r * (size_t)L * es;
        int64_t so = 0;
        bool inside = true;
        for (int d = 0; d < last && inside; d++) {
            int64_t x = ndm__pad_source(c[d] - j->before[d], st->shape[d], j->mode);
            inside = x >= 0;
            so += x * st->strides[d];
        }
        if (!inside) {
            fill_elems(drow, L, es, j->value);
        } else {
            const char *srow = (const char *)st->data + so * (int64_t)es;
            int64_t mid = n < L - bl ? n : L - bl;
            for (int64_t x = 0; x < L; x++) {
                if (x == bl && mid > 0) {
                    if (ss == 1) {
                        memcpy(drow + (size_t)x * es, srow, (size_t)mid * es);
                    } else {
                        ndm__tensor to = {drow + (size_t)x * es, dt->dtype, 1, &mid,
                                          (const int64_t[]){1}};
                        ndm__tensor from = {(void *)srow, st->dtype, 1, &mid, &ss};
                        (void)ndm__cpu_copy(0, &to, &from);
                    }
                    x += mid - 1;
                    continue;
                }
                int64_t sx = ndm__pad_source(x - bl, n, j->mode);
                if (sx < 0)
                    memcpy(drow + (size_t)x * es, j->value, es);
                else
                    memcpy(drow + (size_t)x * es, srow + sx * ss * (int64_t)es, es);
            }
        }
        for (int d = last - 1; d >= 0; d--) {
            if (++c[d] < dt->shape[d])
                break;
            c[d] = 0;
        }
    }
    ndm__coords_put(&cs);
}

static ndm_status fast_pad(int device, const ndm__tensor *dst, const ndm__tensor *src,
                           const int64_t *before, ndm_pad_mode mode, double value)
{
    if (dst->ndim == 0 || !ndm__contig_t(dst))
        return ndm__ref_pad(device, dst, src, before, mode, value);
    int64_t L = dst->shape[dst->ndim - 1];
    int64_t rows = L ? ndm__numel_t(dst) / L : 0;
    if (rows == 0)
        return NDM_OK;
    pad_job j = {dst, src, before, mode, ndm_dtype_size(dst->dtype), {0}, NDM_OK};
    ndm__tensor from = {&value, NDM_F64, 0, NULL, NULL}, to = {j.value, dst->dtype, 0, NULL, NULL};
    ndm_status st = ndm__cpu_copy(device, &to, &from);
    if (st < 0)
        return st;
    ndm__parallel_for(rows, grain_for(L * (int64_t)j.es), pad_range, &j);
    return (ndm_status)atomic_load(&j.status);
}

/* ---- cumsum and cumprod ---------------------------------------------------------- */

/* Lines along the axis, several at a time: a block of up to `block`
 * neighbouring lines accumulates in a local array, so the lines' running
 * sums (or products) are independent chains (and contiguous runs combine as
 * vectors), and each line combines in axis order as the reference does, bit
 * for bit. Lines are the inner positions, or the outer ones when the axis
 * is innermost. */
#define CUM_BLOCK 256

typedef struct cum_job {
    const char *src;
    char *dst;
    int64_t n, I, block, chunks;
    int64_t so, sa, si, dout, da, di;
    void (*run)(const struct cum_job *, int64_t o, int64_t i0, int64_t m);
} cum_job;

/* X(name, source type, accumulator type, destination type, load, store, ...) */
#define NDM__CUM_TYPES(X, ...)                                                  \
    X(b8, uint8_t, uint64_t, int64_t, (uint64_t), (int64_t), __VA_ARGS__)       \
    X(u8, uint8_t, uint64_t, int64_t, (uint64_t), (int64_t), __VA_ARGS__)       \
    X(i32, int32_t, uint64_t, int64_t, (uint64_t)(int64_t), (int64_t), __VA_ARGS__) \
    X(i64, int64_t, uint64_t, int64_t, (uint64_t), (int64_t), __VA_ARGS__)      \
    X(f16, uint16_t, float, uint16_t, ndm_f16_to_f32, ndm_f32_to_f16, __VA_ARGS__) \
    X(bf16, uint16_t, float, uint16_t, ndm_bf16_to_f32, ndm_f32_to_bf16, __VA_ARGS__) \
    X(f32, float, float, float, (float), (float), __VA_ARGS__)                  \
    X(f64, double, double, double, (double), (double), __VA_ARGS__)

/* The two ways to combine (P: the functions' prefix, OP= the operator, ID:
 * its identity); integer accumulators are unsigned, so they wrap. */
#define NDM__CUM_OPS(X) X(cum, +=, 0) X(cump, *=, 1)

#define NDM__CUM(N, ST, AT, DT, LD, STO, P, OP, ID)                             \
    /* one step of a full block of contiguous lines; restrict parameters let  \
     * the compiler vectorise it */                                            \
    static inline void P##_step_##N(AT *restrict acc, const ST *restrict sk,    \
                                    DT *restrict dk)                            \
    {                                                                           \
        for (int64_t i = 0; i < CUM_BLOCK; i++) {                               \
            acc[i] OP LD(sk[i]);                                                \
            dk[i] = STO(acc[i]);                                                \
        }                                                                       \
    }                                                                           \
    static void P##_##N(const cum_job *j, int64_t o, int64_t i0, int64_t m)     \
    {                                                                           \
        AT acc[CUM_BLOCK];                                                      \
        for (int64_t i = 0; i < m; i++)                                         \
            acc[i] = ID;                                                        \
        const ST *s = (const ST *)j->src + o * j->so + i0 * j->si;              \
        DT *d = (DT *)j->dst + o * j->dout + i0 * j->di;                        \
        int64_t si = j->si, di = j->di;                                         \
        for (int64_t k = 0; k < j->n; k++) {                                    \
            const ST *sk = s + k * j->sa;                                       \
            DT *dk = d + k * j->da;                                             \
            if (si == 1 && di == 1 && m == CUM_BLOCK) {                         \
                P##_step_##N(acc, sk, dk);                                      \
            } else {                                                            \
                for (int64_t i = 0; i < m; i++) {                               \
                    acc[i] OP LD(sk[i * si]);                                   \
                    dk[i * di] = STO(acc[i]);                                   \
                }                                                               \
            }                                                                   \
        }                                                                       \
    }

/* The axis innermost: ROWS lines at a time with their accumulators in
 * registers, ROWS independent chains. */
#define ROWS 4
#define NDM__CUM_ROWS(N, ST, AT, DT, LD, STO, P, OP, ID)                        \
    static void P##_rows_##N(const cum_job *j, int64_t o, int64_t i0, int64_t m) \
    {                                                                           \
        (void)o;                                                                \
        const ST *s = (const ST *)j->src + i0 * j->si;                          \
        DT *d = (DT *)j->dst + i0 * j->di;                                      \
        int64_t sa = j->sa, da = j->da, si = j->si, di = j->di;                 \
        if (m == ROWS) {                                                        \
            AT acc[ROWS] = {ID, ID, ID, ID};                                    \
            for (int64_t k = 0; k < j->n; k++)                                  \
                for (int l = 0; l < ROWS; l++) {                                \
                    acc[l] OP LD(s[l * si + k * sa]);                           \
                    d[l * di + k * da] = STO(acc[l]);                           \
                }                                                               \
            return;                                                             \
        }                                                                       \
        for (int64_t l = 0; l < m; l++) {                                       \
            AT acc = ID;                                                        \
            for (int64_t k = 0; k < j->n; k++) {                                \
                acc OP LD(s[l * si + k * sa]);                                  \
                d[l * di + k * da] = STO(acc);                                  \
            }                                                                   \
        }                                                                       \
    }
#define NDM__CUM_BOTH(P, OP, ID)                                                \
    NDM__CUM_TYPES(NDM__CUM, P, OP, ID) NDM__CUM_TYPES(NDM__CUM_ROWS, P, OP, ID)
NDM__CUM_OPS(NDM__CUM_BOTH)

#define NDM__CUM_ENTRY(N, ST, AT, DT, LD, STO, P, OP, ID)                       \
    [NDM_DTYPE_OF_##N] = {P##_##N, P##_rows_##N},
#define NDM_DTYPE_OF_b8 NDM_BOOL
#define NDM_DTYPE_OF_u8 NDM_U8
#define NDM_DTYPE_OF_i32 NDM_I32
#define NDM_DTYPE_OF_i64 NDM_I64
#define NDM_DTYPE_OF_f16 NDM_F16
#define NDM_DTYPE_OF_bf16 NDM_BF16
#define NDM_DTYPE_OF_f32 NDM_F32
#define NDM_DTYPE_OF_f64 NDM_F64
typedef void (*cum_fn)(const cum_job *, int64_t, int64_t, int64_t);
/* [dtype][0: blocks of inner lines, 1: rows with the axis innermost] */
static cum_fn const cum_fns[NDM_DTYPE_COUNT][2] = {NDM__CUM_TYPES(NDM__CUM_ENTRY, cum, +=, 0)};
static cum_fn const cump_fns[NDM_DTYPE_COUNT][2] = {NDM__CUM_TYPES(NDM__CUM_ENTRY, cump, *=, 1)};

static void cum_range(void *ctx, int64_t b, int64_t e)
{
    const cum_job *j = ctx;
    for (int64_t t = b; t < e; t++) {
        int64_t o = t / j->chunks, i0 = (t % j->chunks) * j->block;
        j->run(j, o, i0, j->I - i0 < j->block ? j->I - i0 : j->block);
    }
}

/* false: the operands' axes do not merge into (outer, axis, inner) runs. */
static bool cumulate(const ndm__tensor *dst, const ndm__tensor *src, int axis,
                     cum_fn const (*fns)[2])
{
    int nd = dst->ndim;
    cum_job j = {.src = src->data, .dst = dst->data, .n = dst->shape[axis], .block = CUM_BLOCK,
                 .sa = src->strides[axis], .da = dst->strides[axis], .run = fns[src->dtype][0]};
    int64_t outer, ignore;
    if (!ndm__merge_axes(src, 0, axis, &outer, &j.so) ||
        !ndm__merge_axes(dst, 0, axis, &ignore, &j.dout) ||
        !ndm__merge_axes(src, axis + 1, nd, &j.I, &j.si) ||
        !ndm__merge_axes(dst, axis + 1, nd, &ignore, &j.di))
        return false;
    if (outer == 0 || j.I == 0 || j.n == 0)
        return true;
    if (j.I == 1) {
        /* The axis is innermost: the outer lines, a few at a time. */
        j.I = outer;
        j.si = j.so;
        j.di = j.dout;
        j.so = j.dout = 0;
        j.block = ROWS;
        j.run = fns[src->dtype][1];
        outer = 1;
    }
    j.chunks = (j.I + j.block - 1) / j.block;
    int64_t tasks = outer * j.chunks;
    int64_t per = j.n * (j.I < j.block ? j.I : j.block) * 16;
    ndm__parallel_for(tasks, grain_for(per), cum_range, &j);
    return true;
}

static ndm_status fast_cumsum(int device, const ndm__tensor *dst, const ndm__tensor *src, int axis)
{
    return cumulate(dst, src, axis, cum_fns) ? NDM_OK : ndm__ref_cumsum(device, dst, src, axis);
}

static ndm_status fast_cumprod(int device, const ndm__tensor *dst, const ndm__tensor *src,
                               int axis)
{
    return cumulate(dst, src, axis, cump_fns) ? NDM_OK : ndm__ref_cumprod(device, dst, src, axis);
}

/* ---- nonzero --------------------------------------------------------------------- */

/* A contiguous source in one pass on the calling thread (the positions must
 * come out in order, and the count is a single read); anything else walks
 * coordinates in the reference kernel. */
static ndm_status fast_nonzero(int device, const ndm__tensor *dst, const ndm__tensor *src,
                               int64_t *count)
{
    if (!ndm__contig_t(src))
        return ndm__ref_nonzero(device, dst, src, count);
    int64_t n = ndm__numel_t(src), found = 0;
    int64_t *out = dst ? (int64_t *)dst->data : NULL;
    size_t es = ndm_dtype_size(src->dtype);
    const char *p = src->data;
    for (int64_t i = 0; i < n; i++, p += es)
        if (!ndm__cpu_is_zero(src->dtype, p, es)) {
            if (out)
                out[found] = i;
            found++;
        }
    if (!dst)
        *count = found;
    return NDM_OK;
}

const struct ndm__backend_index ndm__cpu_index = {
    .copy = fast_copy,
    .find_outside = fast_find_outside,
    .take = fast_take,
    .gather = fast_gather,
    .scatter_add = fast_scatter_add,
    .one_hot = fast_one_hot,
    .pad = fast_pad,
    .cumsum = fast_cumsum,
    .cumprod = fast_cumprod,
    .nonzero = fast_nonzero,
    .tri = ndm__cpu_tri,
    .sort = ndm__cpu_sort,
};
