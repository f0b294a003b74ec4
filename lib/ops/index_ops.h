/* Private helpers shared by the index dispatchers (index.c, index_take.c)
 * and the losses' label check. */
#ifndef NDM_OPS_INDEX_H
#define NDM_OPS_INDEX_H

#include "../backends/index.h"
#include "dispatch.h"

/* Scratch for sizes and strides: on the stack for common ranks. */
typedef struct ndm__scratch {
    int64_t small[64];
    int64_t *p;
} ndm__scratch;

/* n entries, or NULL with NDM_E_OOM recorded. */
int64_t *ndm__scratch_get(ndm__scratch *s, size_t n, const char *api, ndm__site site);
void ndm__scratch_put(ndm__scratch *s);

/* The index family of a device's backend, or NULL with NDM_E_UNSUPPORTED. */
const struct ndm__backend_index *ndm__index_family(ndm_device dev, const char *api,
                                                   ndm__site site);

/* Do a and b live on one device? NDM_E_DEVICE naming both when not. */
bool ndm__same_device(const ndm__array *a, const ndm__array *b, const char *api, ndm__site site);

/* A kernel failed: record why, release the half-made result, return null. */
ndm_array ndm__kernel_failed(ndm_status st, ndm_array res, const char *what, const char *api,
                             ndm__site site);

#endif
