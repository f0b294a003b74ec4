/* The CPU's sort of (key, position) pairs, shared by the index family's
 * sort and the random family's multinomial draw without replacement. */
#ifndef NDM_CPU_SORT_H
#define NDM_CPU_SORT_H

#include "../index_scalar.h"

/* Sort a[0..n) by ndm__sort_before, tmp[0..n) the room to merge in. */
void ndm__cpu_sort_pairs(ndm__sort_pair *a, ndm__sort_pair *tmp, int64_t n);

#endif
