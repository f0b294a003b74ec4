/* The memory floor of a batch-1 forward pass: one thread reading a model's
 * parameters once each, from wherever they lie in the cache hierarchy, in
 * the order and the directions the small-matrix path reads them (an array of
 * 64 KiB or more runs last to first on every other pass, so that the part
 * still in L2 comes first; lib/backends/cpu/small_gemm.c). A forward pass
 * cannot take less time than this, whatever its arithmetic. */
#ifndef NDM_BENCH_WEIGHTS_READ_H
#define NDM_BENCH_WEIGHTS_READ_H

#include <stdint.h>

#include "ndm/ndm.h"

#define WEIGHTS_READ_MAX 32

typedef struct weights_read {
    const float *data[WEIGHTS_READ_MAX];
    int64_t count[WEIGHTS_READ_MAX]; /* floats */
    int arrays;
    int64_t bytes;
    unsigned pass; /* passes made: its low bit picks the direction */
} weights_read;

/* The f32 parameters of net, in the order the forward pass reads them;
 * false (with a message on stderr) when a parameter is not a contiguous f32
 * array or there are more than WEIGHTS_READ_MAX. */
bool weights_read_init(weights_read *w, ndm_module net);

/* One pass over every parameter; returns a sum so that no read is dropped. */
float weights_read_pass(weights_read *w);

#endif
