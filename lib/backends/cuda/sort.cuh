/* A block's sort of (key, position) pairs in global memory (bitonic, over a
 * power-of-two room padded with pairs that sort last), shared by the index
 * family's sort and the random family's draw without replacement. Pairs
 * order by key, then position (index_scalar.h), so the result is the
 * stable order whatever the network does. */
#ifndef NDM_CUDA_SORT_CUH
#define NDM_CUDA_SORT_CUH

#include "common.cuh"

extern "C" {
#include "../index_scalar.h"
}

/* The room a line of n pairs takes: the power of two at or above n. */
static inline int64_t ndm__cu_sort_room(int64_t n)
{
    int64_t p = 1;
    while (p < n)
        p *= 2;
    return p;
}

/* The padding: after every real pair. */
NDM__HD ndm__sort_pair ndm__cu_sort_pad(void)
{
    ndm__sort_pair q;
    q.key = ~(uint64_t)0;
    q.pos = INT64_MAX;
    return q;
}

/* Sort p[0..room) (room a power of two) with the block's threads; every
 * thread of the block calls it, after the pairs are written and a
 * __syncthreads; it returns after a __syncthreads. */
__device__ __forceinline__ void ndm__cu_block_sort(ndm__sort_pair *p, int64_t room)
{
    for (int64_t k = 2; k <= room; k <<= 1) {
        for (int64_t j = k >> 1; j > 0; j >>= 1) {
            for (int64_t i = threadIdx.x; i < room; i += blockDim.x) {
                int64_t l = i ^ j;
                if (l > i) {
                    ndm__sort_pair a = p[i], b = p[l];
                    bool up = (i & k) == 0;
                    if (up ? ndm__sort_before(b, a) : ndm__sort_before(a, b)) {
                        p[i] = b;
                        p[l] = a;
                    }
                }
            }
            __syncthreads();
        }
    }
}

/* How many blocks sort lines of `room` pairs at once: at most `lines`, and
 * their rooms together within 64 MiB of scratch (at least one block). */
static inline unsigned ndm__cu_sort_blocks(int64_t lines, int64_t room)
{
    int64_t by_room = ((int64_t)64 << 20) / (room * (int64_t)sizeof(ndm__sort_pair));
    int64_t b = lines < by_room ? lines : by_room;
    int64_t cap = (int64_t)ndm__cuda_blocks((int64_t)NDM__CUDA_THREADS * 1024);
    b = b < cap ? b : cap;
    return (unsigned)(b > 0 ? b : 1);
}

#endif
