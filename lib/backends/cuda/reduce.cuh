/* Shared by the CUDA reduction and index kernels: stores of a double or an
 * int64 into an element of a dtype known at run time, and stream-ordered
 * scratch memory for a call's partial results. */
#ifndef NDM_CUDA_REDUCE_CUH
#define NDM_CUDA_REDUCE_CUH

#include "common.cuh"

/* The size of an element of dtype t, in device code. */
NDM__HD int ndm__cu_esize(ndm_dtype t)
{
    switch (t) {
#define NDM__CU_ES_CASE(E)                                                      \
    case E:                                                                     \
        return (int)sizeof(typename ndm__cu_dt<E>::T);
        NDM__CU_DTYPES(NDM__CU_ES_CASE)
#undef NDM__CU_ES_CASE
    }
    return 1;
}

/* ndm__cu_st_any for the two natural values the reductions produce. */
NDM__HD void ndm__cu_store_d(char *p, ndm_dtype t, double v) { ndm__cu_st_any(p, t, v); }
NDM__HD void ndm__cu_store_i(char *p, ndm_dtype t, int64_t v) { ndm__cu_st_any(p, t, v); }

#endif
