/* CUDA index kernels: take, gather, scatter_add, one_hot, pad, cumsum,
 * cumprod, nonzero, tril/triu, sort and the index range check, each over
 * strided operands without a hidden copy. */
#include <stdlib.h>
#include <type_traits>

#include "iter.cuh"
#include "reduce.cuh"
#include "sort.cuh"

extern "C" {
#include "../index.h"
#include "../index_scalar.h"
}

/* ---- shared ---------------------------------------------------------------------- */

/* The index at element offset off of an index tensor (u8, i32 or i64). */
NDM__HD int64_t idx_at(const char *base, ndm_dtype t, int64_t off)
{
    switch (t) {
    case NDM_U8: return ((const uint8_t *)base)[off];
    case NDM_I32: return ((const int32_t *)base)[off];
    default: return ((const int64_t *)base)[off];
    }
}

/* A negative index counts back from n (the dispatcher checked the range). */
NDM__HD int64_t idx_norm(int64_t v, int64_t n) { return v < 0 ? v + n : v; }

/* Scratch lists of ndim entries: on the stack for common ranks. */
struct ndm__cu_dims {
    int64_t small[4 * 32];
    int64_t *p;
    explicit ndm__cu_dims(int nd)
    {
        p = nd <= 32 ? small : (int64_t *)malloc(4 * (size_t)nd * sizeof(int64_t));
    }
    ~ndm__cu_dims()
    {
        if (p != small)
            free(p);
    }
    ndm__cu_dims(const ndm__cu_dims &) = delete;
    ndm__cu_dims &operator=(const ndm__cu_dims &) = delete;
};

static size_t esize(ndm_dtype t) { return ndm__cuda_host->dtype_size(t); }

/* ---- copy and the range check ------------------------------------------------------- */

static ndm_status cuda_index_copy(int device, const ndm__tensor *dst, const ndm__tensor *src)
{
    return ndm__cuda_backend.copy(device, dst, src);
}

__global__ void ndm__k_find_outside(ndm__cu_geom g, const char *idx, ndm_dtype t, int64_t n,
                                    int64_t first, int64_t lo, int64_t hi,
                                    unsigned long long *pos)
{
    NDM__CU_LOOP(int64_t, i, n)
    {
        int64_t off[1];
        ndm__cu_offsets<1, int64_t>(g, i, off);
        int64_t v = idx_at(idx, t, off[0]);
        if (v < lo || v >= hi)
            atomicMin(pos, (unsigned long long)(first + i));
    }
}

/* The smallest position outside the range wins whatever the order the
 * threads run in: an atomic minimum, then one download. */
static ndm_status cuda_find_outside(int device, const ndm__tensor *idx, int64_t lo, int64_t hi,
                                    int64_t *pos, int64_t *value)
{
    *pos = -1;
    cudaStream_t s = nullptr;
    ndm_status st = ndm__cuda_enter(device, &s);
    if (st < 0)
        return st;
    int64_t total = 1;
    for (int d = 0; d < idx->ndim; d++)
        total *= idx->shape[d];
    if (total == 0)
        return NDM_OK;
    void *ws = NULL;
    st = ndm__cu_scratch_get(device, s, sizeof(unsigned long long), &ws, "an index check");
    if (st < 0)
        return st;
    unsigned long long found = ~0ull;
    cudaError_t e = cudaMemsetAsync(ws, 0xff, sizeof found, s);
    if (e != cudaSuccess)
        st = ndm__cuda_check(device, e, "cudaMemsetAsync");
    int64_t first = 0;
    char *data[1] = {(char *)idx->data};
    const int64_t *strides[1] = {idx->strides};
    size_t es[1] = {esize(idx->dtype)};
    if (st >= 0)
        st = ndm__cu_run_strided(idx->ndim, idx->shape, 1, data, strides, es,
                                 [&](const ndm__cu_geom &g, char *const *p, int64_t n) -> ndm_status {
            /* launches come in C order of the outer axes */
            NDM__LAUNCH(ndm__cuda_blocks(n), NDM__CUDA_THREADS, 0, s, ndm__k_find_outside)(
                g, p[0], idx->dtype, n, first, lo, hi, (unsigned long long *)ws);
            NDM__CUDA_LAUNCHED(device, "the index check kernel");
            first += n;
            return NDM_OK;
        });
    if (st >= 0) {
        e = cudaMemcpyAsync(&found, ws, sizeof found, cudaMemcpyDeviceToHost, s);
        if (e == cudaSuccess)
            e = cudaStreamSynchronize(s);
        if (e != cudaSuccess)
            st = ndm__cuda_check(device, e, "the download of an index check");
    }
    ndm_status fs = ndm__cu_scratch_put(device, s, ws);
    if (st < 0 || fs < 0)
        return st < 0 ? st : fs;
    if (found == ~0ull)
        return NDM_OK;
    /* The offending element, read back from its C-order position. */
    int64_t q = (int64_t)found, off = 0;
    for (int d = idx->ndim - 1; d >= 0; d--) {
        off += (q % idx->shape[d]) * idx->strides[d];
        q /= idx->shape[d];
    }
    unsigned char raw[8] = {0};
    size_t ies = esize(idx->dtype);
    e = cudaMemcpyAsync(raw, (const char *)idx->data + off * (int64_t)ies, ies,
                        cudaMemcpyDeviceToHost, s);
    if (e == cudaSuccess)
        e = cudaStreamSynchronize(s);
    if (e != cudaSuccess)
        return ndm__cuda_check(device, e, "the download of an index");
    *pos = (int64_t)found;
    *value = idx_at((const char *)raw, idx->dtype, 0);
    return NDM_OK;
}

/* ---- take and gather ------------------------------------------------------------------
 * Both iterate over dst with three operands: dst, src with the indexed axis
 * held at 0, and the index; the index then moves the source along its axis. */

template <class U>
__global__ void ndm__k_take(ndm__cu_geom g, U *dst, const U *src, const char *idx, ndm_dtype it,
                            int64_t n, int64_t axis_n, int64_t axis_stride)
{
    NDM__CU_LOOP(int64_t, i, n)
    {
        int64_t off[3];
        ndm__cu_offsets<3, int64_t>(g, i, off);
        int64_t v = idx_norm(idx_at(idx, it, off[2]), axis_n);
        dst[off[0]] = src[off[1] + v * axis_stride];
    }
}

static ndm_status take_run(int device, cudaStream_t s, int nd, const int64_t *shape,
                           const ndm__tensor *dst, const ndm__tensor *src, const ndm__tensor *idx,
                           const int64_t *const *strides, int axis)
{
    char *data[3] = {(char *)dst->data, (char *)src->data, (char *)idx->data};
    size_t es[3] = {esize(dst->dtype), esize(src->dtype), esize(idx->dtype)};
    int64_t axis_n = src->shape[axis], ax = src->strides[axis];
    return ndm__cu_run_strided(nd, shape, 3, data, strides, es,
                               [&](const ndm__cu_geom &g, char *const *p, int64_t n) -> ndm_status {
        switch (es[0]) {
#define NDM__TAKE_CASE(B, U)                                                    \
    case B:                                                                     \
        NDM__LAUNCH(ndm__cuda_blocks(n), NDM__CUDA_THREADS, 0, s, ndm__k_take<U>)(     \
            g, (U *)p[0], (const U *)p[1], p[2], idx->dtype, n, axis_n, ax);    \
        break;
            NDM__TAKE_CASE(1, uint8_t)
            NDM__TAKE_CASE(2, uint16_t)
            NDM__TAKE_CASE(4, uint32_t)
        default:
            NDM__TAKE_CASE(8, uint64_t)
#undef NDM__TAKE_CASE
        }
        NDM__CUDA_LAUNCHED(device, "the take kernel");
        return NDM_OK;
    });
}

static ndm_status cuda_take(int device, const ndm__tensor *dst, const ndm__tensor *src, int axis,
                            const ndm__tensor *idx)
{
    cudaStream_t s = nullptr;
    ndm_status st = ndm__cuda_enter(device, &s);
    if (st < 0)
        return st;
    int nd = dst->ndim, k = idx->ndim;
    ndm__cu_dims b(nd);
    if (!b.p)
        return ndm__cuda_fail(NDM_E_OOM, "take: no memory for a rank-%d plan", nd);
    int64_t *ss = b.p, *is = b.p + nd;
    for (int d = 0; d < nd; d++) {
        bool in_idx = d >= axis && d < axis + k;
        ss[d] = in_idx ? 0 : d < axis ? src->strides[d] : src->strides[d - k + 1];
        is[d] = in_idx ? idx->strides[d - axis] : 0;
    }
    const int64_t *strides[3] = {dst->strides, ss, is};
    return take_run(device, s, nd, dst->shape, dst, src, idx, strides, axis);
}

static ndm_status cuda_gather(int device, const ndm__tensor *dst, const ndm__tensor *src,
                              int axis, const ndm__tensor *idx)
{
    cudaStream_t s = nullptr;
    ndm_status st = ndm__cuda_enter(device, &s);
    if (st < 0)
        return st;
    int nd = dst->ndim;
    ndm__cu_dims b(nd);
    if (!b.p)
        return ndm__cuda_fail(NDM_E_OOM, "gather: no memory for a rank-%d plan", nd);
    int64_t *ss = b.p;
    for (int d = 0; d < nd; d++)
        ss[d] = d == axis ? 0 : src->strides[d];
    const int64_t *strides[3] = {dst->strides, ss, idx->strides};
    return take_run(device, s, nd, dst->shape, dst, src, idx, strides, axis);
}

/* ---- scatter_add ------------------------------------------------------------------------
 * Lines along the axis are independent: two sources with the same target lie
 * on one line (the other coordinates name the target), so adding in line
 * order is adding in C order, and the sums equal the CPU's bit for bit
 * whatever the threads' timing. A short line is walked by one thread. */

template <ndm_dtype E> NDM__HD void ix_add(typename ndm__cu_dt<E>::T *d, typename ndm__cu_dt<E>::T s)
{
    typedef typename ndm__cu_dt<E>::T T;
    if constexpr (E == NDM_BOOL)
        *d = (T)(*d | s);
    else if constexpr (E == NDM_U8 || E == NDM_I32 || E == NDM_I64)
        *d = (T)((uint64_t)*d + (uint64_t)s); /* wraps, without signed overflow */
    else if constexpr (E == NDM_F32)
        *d = __fadd_rn(*d, s);
    else if constexpr (E == NDM_F64)
        *d = __dadd_rn(*d, s);
    else
        *d = ndm__cu_dt<E>::st(__fadd_rn(ndm__cu_dt<E>::ld(*d), ndm__cu_dt<E>::ld(s)));
}

template <ndm_dtype E>
__global__ void ndm__k_scatter_add(ndm__cu_geom g, typename ndm__cu_dt<E>::T *dst,
                                   const char *idx, ndm_dtype it,
                                   const typename ndm__cu_dt<E>::T *src, int64_t lines, int64_t m,
                                   int64_t dst_n, int64_t dax, int64_t iax, int64_t sax)
{
    NDM__CU_LOOP(int64_t, i, lines)
    {
        int64_t off[3];
        ndm__cu_offsets<3, int64_t>(g, i, off);
        for (int64_t j = 0; j < m; j++) {
            int64_t v = idx_norm(idx_at(idx, it, off[1] + j * iax), dst_n);
            ix_add<E>(dst + off[0] + v * dax, src[off[2] + j * sax]);
        }
    }
}

/* Long lines: a warp per line takes 32 entries at a time; the first lane
 * holding each target in those 32 adds the entries for it in lane order
 * (the others hand theirs over by shuffles) and writes once. Each target
 * still sees its additions one by one in C order, as the CPU makes them. */
template <class T> __device__ __forceinline__ T ix_shfl(T v, int k)
{
    if constexpr (std::is_same<T, float>::value || std::is_same<T, double>::value)
        return __shfl_sync(0xffffffffu, v, k);
    else
        return (T)__shfl_sync(0xffffffffu, (long long)v, k);
}

template <ndm_dtype E>
__global__ void ndm__k_scatter_add_warp(ndm__cu_geom g, typename ndm__cu_dt<E>::T *dst,
                                        const char *idx, ndm_dtype it,
                                        const typename ndm__cu_dt<E>::T *src, int64_t lines,
                                        int64_t m, int64_t dst_n, int64_t dax, int64_t iax,
                                        int64_t sax)
{
    typedef typename ndm__cu_dt<E>::T T;
    const int lane = (int)threadIdx.x % 32;
    const int64_t per_block = blockDim.x / 32;
    for (int64_t line = (int64_t)blockIdx.x * per_block + threadIdx.x / 32; line < lines;
         line += (int64_t)gridDim.x * per_block) {
        int64_t off[3];
        ndm__cu_offsets<3, int64_t>(g, line, off);
        for (int64_t j0 = 0; j0 < m; j0 += 32) {
            int64_t j = j0 + lane;
            bool live = j < m;
            int64_t v = live ? idx_norm(idx_at(idx, it, off[1] + j * iax), dst_n) : -1;
            T sv = live ? src[off[2] + j * sax] : (T)0;
            T acc = live ? dst[off[0] + v * dax] : (T)0;
            bool owner = live;
            for (int k = 0; k < 32; k++) {
                int64_t vk = ix_shfl(v, k);
                T sk = ix_shfl(sv, k);
                if (live && vk == v) {
                    if (k < lane)
                        owner = false;
                    else if (owner)
                        ix_add<E>(&acc, sk);
                }
            }
            if (owner)
                dst[off[0] + v * dax] = acc;
            __syncwarp(); /* the next 32 read what these wrote */
        }
    }
}

/* The start of a kernel along one axis of t: the device entered (its
 * stream into *s) and b (rank-sized, made by the caller) holding t's shape
 * with that axis' extent 1: the lines to run. */
static ndm_status axis_lines(int device, cudaStream_t *s, const char *what, const ndm__tensor *t,
                             int axis, ndm__cu_dims &b)
{
    ndm_status st = ndm__cuda_enter(device, s);
    if (st < 0)
        return st;
    if (!b.p)
        return ndm__cuda_fail(NDM_E_OOM, "%s: no memory for a rank-%d plan", what, t->ndim);
    memcpy(b.p, t->shape, (size_t)t->ndim * sizeof(int64_t));
    b.p[axis] = 1;
    return NDM_OK;
}

static ndm_status cuda_scatter_add(int device, const ndm__tensor *dst, int axis,
                                   const ndm__tensor *idx, const ndm__tensor *src)
{
    cudaStream_t s = nullptr;
    int nd = idx->ndim;
    ndm__cu_dims b(nd);
    ndm_status st = axis_lines(device, &s, "scatter_add", idx, axis, b);
    if (st < 0)
        return st;
    int64_t *lshape = b.p;
    int64_t m = idx->shape[axis];
    char *data[3] = {(char *)dst->data, (char *)idx->data, (char *)src->data};
    const int64_t *strides[3] = {dst->strides, idx->strides, src->strides};
    size_t es[3] = {esize(dst->dtype), esize(idx->dtype), esize(src->dtype)};
    int64_t dn = dst->shape[axis], dax = dst->strides[axis], iax = idx->strides[axis],
            sax = src->strides[axis];
    if (m == 0)
        return NDM_OK;
    return ndm__cu_run_strided(nd, lshape, 3, data, strides, es,
                               [&](const ndm__cu_geom &g, char *const *p, int64_t n) -> ndm_status {
        switch (dst->dtype) {
#define NDM__SCAT_CASE(E)                                                       \
    case E:                                                                     \
        if (m >= 64) {                                                          \
            NDM__LAUNCH(ndm__cuda_blocks(n * 32), NDM__CUDA_THREADS, 0, s,      \
                        ndm__k_scatter_add_warp<E>)(                            \
                g, (typename ndm__cu_dt<E>::T *)p[0], p[1], idx->dtype,         \
                (const typename ndm__cu_dt<E>::T *)p[2], n, m, dn, dax, iax, sax); \
        } else {                                                                \
            NDM__LAUNCH(ndm__cuda_blocks(n), NDM__CUDA_THREADS, 0, s,           \
                        ndm__k_scatter_add<E>)(                                 \
                g, (typename ndm__cu_dt<E>::T *)p[0], p[1], idx->dtype,         \
                (const typename ndm__cu_dt<E>::T *)p[2], n, m, dn, dax, iax, sax); \
        }                                                                       \
        NDM__CUDA_LAUNCHED(device, "the scatter_add kernel");                   \
        return NDM_OK;
            NDM__CU_DTYPES(NDM__SCAT_CASE)
#undef NDM__SCAT_CASE
        }
        return ndm__cuda_fail(NDM_E_DTYPE, "scatter_add: invalid dtype %d", (int)dst->dtype);
    });
}

/* ---- one_hot ------------------------------------------------------------------------------ */

__global__ void ndm__k_one_hot(ndm__cu_geom g, char *dst, ndm_dtype dt, const char *idx,
                               ndm_dtype it, int64_t n, int64_t classes, int64_t cs)
{
    const int des = ndm__cu_esize(dt);
    NDM__CU_LOOP(int64_t, i, n * classes)
    {
        int64_t o = i / classes, c = i % classes;
        int64_t off[2];
        ndm__cu_offsets<2, int64_t>(g, o, off);
        int64_t v = idx_at(idx, it, off[1]);
        ndm__cu_store_i(dst + (off[0] + c * cs) * des, dt, c == v ? 1 : 0);
    }
}

static ndm_status cuda_one_hot(int device, const ndm__tensor *dst, const ndm__tensor *idx)
{
    cudaStream_t s = nullptr;
    ndm_status st = ndm__cuda_enter(device, &s);
    if (st < 0)
        return st;
    int64_t classes = dst->shape[dst->ndim - 1], cs = dst->strides[dst->ndim - 1];
    if (classes == 0)
        return NDM_OK;
    char *data[2] = {(char *)dst->data, (char *)idx->data};
    const int64_t *strides[2] = {dst->strides, idx->strides};
    size_t es[2] = {esize(dst->dtype), esize(idx->dtype)};
    return ndm__cu_run_strided(idx->ndim, idx->shape, 2, data, strides, es,
                               [&](const ndm__cu_geom &g, char *const *p, int64_t n) -> ndm_status {
        NDM__LAUNCH(ndm__cuda_blocks(n * classes), NDM__CUDA_THREADS, 0, s, ndm__k_one_hot)(
            g, p[0], dst->dtype, p[1], idx->dtype, n, classes, cs);
        NDM__CUDA_LAUNCHED(device, "the one_hot kernel");
        return NDM_OK;
    });
}

/* ---- pad ------------------------------------------------------------------------------------
 * A thread per destination element maps each coordinate to its source
 * with the same per-axis rule as the CPU (index_scalar.h). Axes past the
 * kernel's rank are walked on the host, one launch per outer position. */

#define NDM__PAD_DIMS 10

typedef struct ndm__pad_geom {
    int nd;
    int64_t shape[NDM__PAD_DIMS], sshape[NDM__PAD_DIMS], before[NDM__PAD_DIMS];
    int64_t ds[NDM__PAD_DIMS], ss[NDM__PAD_DIMS];
} ndm__pad_geom;

template <class U>
__global__ void ndm__k_pad(ndm__pad_geom g, U *dst, const U *src, int64_t n, ndm_pad_mode mode,
                           U value, bool all_value)
{
    NDM__CU_LOOP(int64_t, i, n)
    {
        int64_t q = i, so = 0, dof = 0;
        bool inside = !all_value;
        for (int d = g.nd - 1; d >= 0; d--) {
            int64_t c = q % g.shape[d];
            q /= g.shape[d];
            dof += c * g.ds[d];
            int64_t x = ndm__pad_source(c - g.before[d], g.sshape[d], mode);
            inside = inside && x >= 0;
            so += x * g.ss[d];
        }
        dst[dof] = inside ? src[so] : value;
    }
}

template <class U>
static ndm_status pad_typed(int device, cudaStream_t s, const ndm__tensor *dst,
                            const ndm__tensor *src, const int64_t *keep, int nk,
                            const int64_t *before, ndm_pad_mode mode, double value)
{
    /* the constant converted once, by the kernels' rules */
    U v;
    unsigned char raw[8] = {0};
    ndm__cu_store_d((char *)raw, dst->dtype, value);
    memcpy(&v, raw, sizeof v);
    int outer = nk > NDM__PAD_DIMS ? nk - NDM__PAD_DIMS : 0;
    ndm__pad_geom g;
    memset(&g, 0, sizeof g);
    g.nd = nk - outer;
    int64_t n = 1;
    for (int i = 0; i < g.nd; i++) {
        int d = (int)keep[outer + i];
        g.shape[i] = dst->shape[d], g.sshape[i] = src->shape[d], g.before[i] = before[d];
        g.ds[i] = dst->strides[d], g.ss[i] = src->strides[d];
        n *= g.shape[i];
    }
    int64_t small[32];
    int64_t *c = outer <= 32 ? small : (int64_t *)calloc((size_t)outer, sizeof(int64_t));
    if (!c)
        return ndm__cuda_fail(NDM_E_OOM, "pad: no memory for a rank-%d plan", nk);
    for (int i = 0; i < outer; i++)
        c[i] = 0;
    ndm_status st = NDM_OK;
    for (;;) {
        int64_t so = 0, dof = 0;
        bool inside = true;
        for (int i = 0; i < outer; i++) {
            int d = (int)keep[i];
            int64_t x = ndm__pad_source(c[i] - before[d], src->shape[d], mode);
            inside = inside && x >= 0;
            so += (x < 0 ? 0 : x) * src->strides[d];
            dof += c[i] * dst->strides[d];
        }
        NDM__LAUNCH(ndm__cuda_blocks(n), NDM__CUDA_THREADS, 0, s, ndm__k_pad<U>)(
            g, (U *)dst->data + dof, (const U *)src->data + (inside ? so : 0), n, mode, v,
            !inside);
        cudaError_t e = cudaGetLastError();
        if (e != cudaSuccess) {
            st = ndm__cuda_check(device, e, "launch of the pad kernel");
            break;
        }
        int i = outer - 1;
        while (i >= 0 && ++c[i] == dst->shape[keep[i]])
            c[i--] = 0;
        if (i < 0)
            break;
    }
    if (c != small)
        free(c);
    return st;
}

static ndm_status cuda_pad(int device, const ndm__tensor *dst, const ndm__tensor *src,
                           const int64_t *before, ndm_pad_mode mode, double value)
{
    cudaStream_t s = nullptr;
    ndm_status st = ndm__cuda_enter(device, &s);
    if (st < 0)
        return st;
    int nd = dst->ndim;
    int64_t total = 1;
    for (int d = 0; d < nd; d++)
        total *= dst->shape[d];
    if (total == 0)
        return NDM_OK;
    ndm__cu_dims b(nd);
    if (!b.p)
        return ndm__cuda_fail(NDM_E_OOM, "pad: no memory for a rank-%d plan", nd);
    /* Axes of size 1 on both sides and not padded change nothing. */
    int nk = 0;
    for (int d = 0; d < nd; d++)
        if (!(dst->shape[d] == 1 && src->shape[d] == 1 && before[d] == 0))
            b.p[nk++] = d;
    switch (esize(dst->dtype)) {
    case 1: return pad_typed<uint8_t>(device, s, dst, src, b.p, nk, before, mode, value);
    case 2: return pad_typed<uint16_t>(device, s, dst, src, b.p, nk, before, mode, value);
    case 4: return pad_typed<uint32_t>(device, s, dst, src, b.p, nk, before, mode, value);
    default: return pad_typed<uint64_t>(device, s, dst, src, b.p, nk, before, mode, value);
    }
}

/* ---- cumsum and cumprod ----------------------------------------------------------------------
 * A thread per line, in order: the float sums and products round exactly as
 * the CPU's (in the source's dtype, f16 and bf16 in f32), integers wrap in
 * int64. */

template <ndm_dtype E, bool Prod>
__global__ void ndm__k_cumulate(ndm__cu_geom g, char *dst, const typename ndm__cu_dt<E>::T *src,
                                int64_t lines, int64_t m, int64_t dax, int64_t sax)
{
    typedef ndm__cu_dt<E> D;
    constexpr bool fl = E == NDM_F16 || E == NDM_BF16 || E == NDM_F32 || E == NDM_F64;
    NDM__CU_LOOP(int64_t, i, lines)
    {
        int64_t off[2];
        ndm__cu_offsets<2, int64_t>(g, i, off);
        const typename D::T *x = src + off[1];
        if constexpr (!fl) {
            int64_t *y = (int64_t *)dst + off[0];
            uint64_t acc = Prod ? 1 : 0;
            for (int64_t j = 0; j < m; j++) {
                uint64_t v = (uint64_t)(int64_t)D::ld(x[j * sax]);
                acc = Prod ? acc * v : acc + v;
                y[j * dax] = (int64_t)acc;
            }
        } else if constexpr (E == NDM_F64) {
            double *y = (double *)dst + off[0];
            double acc = Prod ? 1 : 0;
            for (int64_t j = 0; j < m; j++) {
                acc = Prod ? __dmul_rn(acc, x[j * sax]) : __dadd_rn(acc, x[j * sax]);
                y[j * dax] = acc;
            }
        } else {
            typename D::T *y = (typename D::T *)dst + off[0];
            float acc = Prod ? 1 : 0;
            for (int64_t j = 0; j < m; j++) {
                float v = D::ld(x[j * sax]);
                acc = Prod ? __fmul_rn(acc, v) : __fadd_rn(acc, v);
                y[j * dax] = D::st(acc);
            }
        }
    }
}

template <bool Prod>
static ndm_status cuda_cumulate(int device, const ndm__tensor *dst, const ndm__tensor *src,
                                int axis)
{
    const char *what = Prod ? "cumprod" : "cumsum";
    cudaStream_t s = nullptr;
    int nd = dst->ndim;
    ndm__cu_dims b(nd);
    ndm_status st = axis_lines(device, &s, what, dst, axis, b);
    if (st < 0)
        return st;
    int64_t *lshape = b.p;
    int64_t m = dst->shape[axis];
    if (m == 0)
        return NDM_OK;
    char *data[2] = {(char *)dst->data, (char *)src->data};
    const int64_t *strides[2] = {dst->strides, src->strides};
    size_t es[2] = {esize(dst->dtype), esize(src->dtype)};
    int64_t dax = dst->strides[axis], sax = src->strides[axis];
    return ndm__cu_run_strided(nd, lshape, 2, data, strides, es,
                               [&](const ndm__cu_geom &g, char *const *p, int64_t n) -> ndm_status {
        switch (src->dtype) {
#define NDM__CUMULATE_CASE(E)                                                   \
    case E:                                                                     \
        NDM__LAUNCH(ndm__cuda_blocks(n), NDM__CUDA_THREADS, 0, s, ndm__k_cumulate<E, Prod>)( \
            g, p[0], (const typename ndm__cu_dt<E>::T *)p[1], n, m, dax, sax);  \
        NDM__CUDA_LAUNCHED(device, "the cumsum or cumprod kernel");             \
        return NDM_OK;
            NDM__CU_DTYPES(NDM__CUMULATE_CASE)
#undef NDM__CUMULATE_CASE
        }
        return ndm__cuda_fail(NDM_E_DTYPE, "%s: invalid dtype %d", what, (int)src->dtype);
    });
}

static ndm_status cuda_cumsum(int device, const ndm__tensor *dst, const ndm__tensor *src,
                              int axis)
{
    return cuda_cumulate<false>(device, dst, src, axis);
}

static ndm_status cuda_cumprod(int device, const ndm__tensor *dst, const ndm__tensor *src,
                               int axis)
{
    return cuda_cumulate<true>(device, dst, src, axis);
}

/* ---- nonzero ----------------------------------------------------------------------------------
 * Chunks of NZ_CHUNK consecutive C-order positions, a thread each: a pass
 * counts every chunk, one block turns the counts into offsets and the
 * total, and when positions are wanted a second pass writes each chunk's
 * from its offset, so they come out in order without atomics. The total is
 * read back (the dispatcher sizes its result by it): the one synchronising
 * step, as a count that decides an output's size must be. */
#define NZ_CHUNK 256

template <ndm_dtype E> NDM__HD bool nz_at(const typename ndm__cu_dt<E>::T *p)
{
    if constexpr (E == NDM_F16 || E == NDM_BF16)
        return (*p & 0x7fffu) != 0; /* -0.0 is zero, NaN is not */
    else
        return *p != 0;
}

/* counts[c] = the nonzero entries of chunk c (positions [c, c + 1) * NZ_CHUNK of n). */
template <ndm_dtype E>
__global__ void ndm__k_nz_count(ndm__cu_geom g, const typename ndm__cu_dt<E>::T *src, int64_t n,
                                int64_t *counts)
{
    int64_t chunks = (n + NZ_CHUNK - 1) / NZ_CHUNK;
    NDM__CU_LOOP(int64_t, c, chunks)
    {
        int64_t b = c * NZ_CHUNK, e = b + NZ_CHUNK < n ? b + NZ_CHUNK : n, k = 0;
        for (int64_t i = b; i < e; i++) {
            int64_t off[1];
            ndm__cu_offsets<1, int64_t>(g, i, off);
            k += nz_at<E>(src + off[0]);
        }
        counts[c] = k;
    }
}

/* counts[0..chunks) become exclusive offsets and counts[chunks] the total,
 * in one block: each thread sums a run of chunks, one thread scans the
 * threads' sums, each thread then writes its run's offsets. */
#define NZ_SCAN_THREADS 256
__global__ void ndm__k_nz_scan(int64_t *counts, int64_t chunks)
{
    __shared__ int64_t part[NZ_SCAN_THREADS];
    int t = (int)threadIdx.x;
    int64_t per = (chunks + NZ_SCAN_THREADS - 1) / NZ_SCAN_THREADS;
    int64_t b = t * per, e = b + per < chunks ? b + per : chunks, run = 0;
    for (int64_t c = b; c < e; c++)
        run += counts[c];
    part[t] = run;
    __syncthreads();
    if (t == 0) {
        int64_t sum = 0;
        for (int k = 0; k < NZ_SCAN_THREADS; k++) {
            int64_t v = part[k];
            part[k] = sum;
            sum += v;
        }
        counts[chunks] = sum;
    }
    __syncthreads();
    run = part[t];
    for (int64_t c = b; c < e; c++) {
        int64_t k = counts[c];
        counts[c] = run;
        run += k;
    }
}

template <ndm_dtype E>
__global__ void ndm__k_nz_write(ndm__cu_geom g, const typename ndm__cu_dt<E>::T *src, int64_t n,
                                int64_t first, const int64_t *offsets, int64_t *dst)
{
    int64_t chunks = (n + NZ_CHUNK - 1) / NZ_CHUNK;
    NDM__CU_LOOP(int64_t, c, chunks)
    {
        int64_t b = c * NZ_CHUNK, e = b + NZ_CHUNK < n ? b + NZ_CHUNK : n, o = offsets[c];
        for (int64_t i = b; i < e; i++) {
            int64_t off[1];
            ndm__cu_offsets<1, int64_t>(g, i, off);
            if (nz_at<E>(src + off[0]))
                dst[o++] = first + i;
        }
    }
}

template <ndm_dtype E>
static ndm_status nonzero_typed(int device, cudaStream_t s, const ndm__tensor *dst,
                                const ndm__tensor *src, int64_t *count)
{
    typedef typename ndm__cu_dt<E>::T T;
    char *data[1] = {(char *)src->data};
    const int64_t *strides[1] = {src->strides};
    size_t es[1] = {esize(src->dtype)};
    /* The iteration may take several launches (a deep operand): count their chunks first. */
    int64_t chunks = 0;
    ndm_status st = ndm__cu_run_strided(src->ndim, src->shape, 1, data, strides, es,
                                        [&](const ndm__cu_geom &, char *const *, int64_t n) -> ndm_status {
        chunks += (n + NZ_CHUNK - 1) / NZ_CHUNK;
        return NDM_OK;
    });
    if (st < 0)
        return st;
    if (chunks == 0) {
        if (!dst)
            *count = 0;
        return NDM_OK;
    }
    void *ws = NULL;
    st = ndm__cu_scratch_get(device, s, (size_t)(chunks + 1) * sizeof(int64_t), &ws,
                             "the chunk counts of nonzero");
    if (st < 0)
        return st;
    int64_t *counts = (int64_t *)ws, base = 0;
    st = ndm__cu_run_strided(src->ndim, src->shape, 1, data, strides, es,
                             [&](const ndm__cu_geom &g, char *const *p, int64_t n) -> ndm_status {
        NDM__LAUNCH(ndm__cuda_blocks((n + NZ_CHUNK - 1) / NZ_CHUNK), NDM__CUDA_THREADS, 0, s,
                    ndm__k_nz_count<E>)(g, (const T *)p[0], n, counts + base);
        NDM__CUDA_LAUNCHED(device, "the nonzero count kernel");
        base += (n + NZ_CHUNK - 1) / NZ_CHUNK;
        return NDM_OK;
    });
    if (st >= 0) {
        NDM__LAUNCH(1, NZ_SCAN_THREADS, 0, s, ndm__k_nz_scan)(counts, chunks);
        cudaError_t e = cudaGetLastError();
        if (e != cudaSuccess)
            st = ndm__cuda_check(device, e, "launch of the nonzero scan kernel");
    }
    if (st >= 0 && !dst) {
        cudaError_t e = cudaMemcpyAsync(count, counts + chunks, sizeof *count,
                                        cudaMemcpyDeviceToHost, s);
        if (e == cudaSuccess)
            e = cudaStreamSynchronize(s);
        if (e != cudaSuccess)
            st = ndm__cuda_check(device, e, "the download of the nonzero count");
    }
    if (st >= 0 && dst) {
        int64_t first = 0;
        base = 0;
        st = ndm__cu_run_strided(src->ndim, src->shape, 1, data, strides, es,
                                 [&](const ndm__cu_geom &g, char *const *p, int64_t n) -> ndm_status {
            /* launches come in C order of the outer axes */
            NDM__LAUNCH(ndm__cuda_blocks((n + NZ_CHUNK - 1) / NZ_CHUNK), NDM__CUDA_THREADS, 0, s,
                        ndm__k_nz_write<E>)(g, (const T *)p[0], n, first, counts + base,
                                            (int64_t *)dst->data);
            NDM__CUDA_LAUNCHED(device, "the nonzero kernel");
            base += (n + NZ_CHUNK - 1) / NZ_CHUNK;
            first += n;
            return NDM_OK;
        });
    }
    ndm_status fs = ndm__cu_scratch_put(device, s, ws);
    return st < 0 ? st : fs;
}

static ndm_status cuda_nonzero(int device, const ndm__tensor *dst, const ndm__tensor *src,
                               int64_t *count)
{
    cudaStream_t s = nullptr;
    ndm_status st = ndm__cuda_enter(device, &s);
    if (st < 0)
        return st;
    switch (src->dtype) {
#define NDM__NZ_CASE(E)                                                         \
    case E:                                                                     \
        return nonzero_typed<E>(device, s, dst, src, count);
        NDM__CU_DTYPES(NDM__NZ_CASE)
#undef NDM__NZ_CASE
    }
    return ndm__cuda_fail(NDM_E_DTYPE, "nonzero: invalid dtype %d", (int)src->dtype);
}

/* ---- tril and triu ----------------------------------------------------------------------------
 * A thread per element; its row and column come from its C-order position
 * (launches come in C order of the outer axes, so a running base gives it). */

/* Copy one element of es bytes (1, 2, 4 or 8), or clear it (s NULL). */
NDM__HD void ix_elem_put(char *d, const char *s, size_t es)
{
    switch (es) {
    case 1: *(uint8_t *)d = s ? *(const uint8_t *)s : 0; break;
    case 2: *(uint16_t *)d = s ? *(const uint16_t *)s : 0; break;
    case 4: *(uint32_t *)d = s ? *(const uint32_t *)s : 0; break;
    default: *(uint64_t *)d = s ? *(const uint64_t *)s : 0; break;
    }
}

__global__ void ndm__k_tri(ndm__cu_geom g, char *dst, const char *src, size_t es, int64_t n,
                           int64_t first, int64_t rows, int64_t cols, int64_t k, bool upper)
{
    NDM__CU_LOOP(int64_t, i, n)
    {
        int64_t off[2];
        ndm__cu_offsets<2, int64_t>(g, i, off);
        int64_t f = first + i, c = f % cols, r = (f / cols) % rows;
        ix_elem_put(dst + off[0] * (int64_t)es,
                    ndm__tri_keeps(r, c, k, upper) ? src + off[1] * (int64_t)es : NULL, es);
    }
}

static ndm_status cuda_tri(int device, const ndm__tensor *dst, const ndm__tensor *src, int64_t k,
                           bool upper)
{
    cudaStream_t s = nullptr;
    ndm_status st = ndm__cuda_enter(device, &s);
    if (st < 0)
        return st;
    int nd = dst->ndim;
    int64_t rows = dst->shape[nd - 2], cols = dst->shape[nd - 1], first = 0;
    size_t e = esize(dst->dtype);
    char *data[2] = {(char *)dst->data, (char *)src->data};
    const int64_t *strides[2] = {dst->strides, src->strides};
    size_t es[2] = {e, e};
    return ndm__cu_run_strided(nd, dst->shape, 2, data, strides, es,
                               [&](const ndm__cu_geom &g, char *const *p, int64_t n) -> ndm_status {
        NDM__LAUNCH(ndm__cuda_blocks(n), NDM__CUDA_THREADS, 0, s, ndm__k_tri)(
            g, p[0], p[1], e, n, first, rows, cols, k, upper);
        NDM__CUDA_LAUNCHED(device, "the tril/triu kernel");
        first += n;
        return NDM_OK;
    });
}

/* ---- sort -----------------------------------------------------------------------------------
 * A block per line: its pairs (key, position) into the block's room of
 * scratch, the block's bitonic sort (sort.cuh), then the first m out. The
 * operands of the iteration are the source, the values and the indices
 * (a missing output takes the other's place and is not written). */

__global__ void ndm__k_sort(ndm__cu_geom g, int64_t lines, const char *src, ndm_dtype t, size_t es,
                            int64_t sax, char *vals, int64_t vax, int64_t *idx, int64_t iax,
                            int64_t n, int64_t m, uint64_t flip, ndm__sort_pair *room,
                            int64_t per)
{
    ndm__sort_pair *p = room + (int64_t)blockIdx.x * per;
    for (int64_t line = blockIdx.x; line < lines; line += gridDim.x) {
        int64_t off[3];
        ndm__cu_offsets<3, int64_t>(g, line, off);
        const char *x = src + off[0] * (int64_t)es;
        for (int64_t i = threadIdx.x; i < per; i += blockDim.x) {
            ndm__sort_pair q = ndm__cu_sort_pad();
            if (i < n) {
                q.key = ndm__sort_key(x + i * sax * (int64_t)es, t) ^ flip;
                q.pos = i;
            }
            p[i] = q;
        }
        __syncthreads();
        ndm__cu_block_sort(p, per);
        for (int64_t i = threadIdx.x; i < m; i += blockDim.x) {
            int64_t pos = p[i].pos;
            if (vals)
                ix_elem_put(vals + (off[1] + i * vax) * (int64_t)es, x + pos * sax * (int64_t)es,
                            es);
            if (idx)
                idx[off[2] + i * iax] = pos;
        }
        __syncthreads(); /* the room serves the block's next line */
    }
}

static ndm_status cuda_sort(int device, const ndm__tensor *values, const ndm__tensor *indices,
                            const ndm__tensor *src, int axis, bool descending)
{
    cudaStream_t s = nullptr;
    int nd = src->ndim;
    ndm__cu_dims b(nd);
    ndm_status st = axis_lines(device, &s, "sort", src, axis, b);
    if (st < 0)
        return st;
    const ndm__tensor *v = values ? values : indices, *ix = indices ? indices : values;
    int64_t n = src->shape[axis], m = v->shape[axis];
    if (m == 0)
        return NDM_OK;
    int64_t lines_total = 1;
    for (int d = 0; d < nd; d++)
        lines_total *= b.p[d];
    if (lines_total == 0)
        return NDM_OK;
    int64_t per = ndm__cu_sort_room(n);
    unsigned blocks = ndm__cu_sort_blocks(lines_total, per);
    void *ws = NULL;
    st = ndm__cu_scratch_get(device, s, (size_t)blocks * (size_t)per * sizeof(ndm__sort_pair), &ws,
                             "the pairs of a sort");
    if (st < 0)
        return st;
    char *data[3] = {(char *)src->data, (char *)v->data, (char *)ix->data};
    const int64_t *strides[3] = {src->strides, v->strides, ix->strides};
    size_t es[3] = {esize(src->dtype), esize(v->dtype), esize(ix->dtype)};
    uint64_t flip = descending ? ~(uint64_t)0 : 0;
    st = ndm__cu_run_strided(nd, b.p, 3, data, strides, es,
                             [&](const ndm__cu_geom &g, char *const *p, int64_t lines) -> ndm_status {
        unsigned nb = blocks < lines ? blocks : (unsigned)lines;
        NDM__LAUNCH(nb, NDM__CUDA_THREADS, 0, s, ndm__k_sort)(
            g, lines, p[0], src->dtype, es[0], src->strides[axis], values ? p[1] : NULL,
            values ? values->strides[axis] : 0, indices ? (int64_t *)p[2] : NULL,
            indices ? indices->strides[axis] : 0, n, m, flip, (ndm__sort_pair *)ws, per);
        NDM__CUDA_LAUNCHED(device, "the sort kernel");
        return NDM_OK;
    });
    ndm_status fs = ndm__cu_scratch_put(device, s, ws);
    return st < 0 ? st : fs;
}

extern "C" const struct ndm__backend_index ndm__cuda_index = {
    .copy = cuda_index_copy,
    .find_outside = cuda_find_outside,
    .take = cuda_take,
    .gather = cuda_gather,
    .scatter_add = cuda_scatter_add,
    .one_hot = cuda_one_hot,
    .pad = cuda_pad,
    .cumsum = cuda_cumsum,
    .cumprod = cuda_cumprod,
    .nonzero = cuda_nonzero,
    .tri = cuda_tri,
    .sort = cuda_sort,
};
