/* Repeated siblings: the children of a set of managers grouped by name,
 * device and creation site, so that reports print 500 request managers made
 * by one line of a loop as one entry. Tree lock held. */
#ifndef NDM_MANAGER_SIBLINGS_H
#define NDM_MANAGER_SIBLINGS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Group g is slot[start[g] .. start[g + 1]), its members oldest first; the
 * groups come in the order of their oldest members (children oldest first,
 * parent after parent). */
typedef struct ndm__sibs {
    uint32_t *slot;
    size_t *start;
    size_t ngroups;
} ndm__sibs;

/* The children of parents[0..np), grouped; false when out of memory (*out
 * empty: the caller visits them one by one). */
bool ndm__sibs_of(const uint32_t *parents, size_t np, ndm__sibs *out);
void ndm__sibs_free(ndm__sibs *s);

/* The oldest child of m (the list runs newest first); 0 for none. Its
 * younger siblings follow through sib_prev. */
uint32_t ndm__oldest_child(uint32_t m);

#endif
