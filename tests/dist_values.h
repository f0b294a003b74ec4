/* The values the distributed suites give each rank, and what a collective
 * of them must return: shared by the cmocka suite and the GPU check. */
#ifndef NDM_TESTS_DIST_VALUES_H
#define NDM_TESTS_DIST_VALUES_H

#include <math.h>
#include <stdint.h>

#include "ndm/ndm.h"

/* Rank r's element i: small integers, exact in every dtype. */
static inline double dist_value(ndm_dtype dt, int r, int64_t i)
{
    if (dt == NDM_BOOL)
        return (i + r) % 3 == 0;
    return (double)((i * 3 + r * 5) % 7);
}

/* What every one of `size` ranks' element i gives under op: the CPU path's
 * rules (bool: "any"; integer means truncate). */
static inline double dist_reference(ndm_dtype dt, ndm_dist_op op, int64_t i, int size)
{
    double sum = 0, max = -INFINITY;
    for (int r = 0; r < size; r++) {
        double x = dist_value(dt, r, i);
        sum += x;
        max = x > max ? x : max;
    }
    if (dt == NDM_BOOL)
        return sum > 0;
    if (op == NDM_DIST_MAX)
        return max;
    if (op == NDM_DIST_SUM)
        return sum;
    return ndm_dtype_is_float(dt) ? sum / size : trunc(sum / size);
}

#endif
