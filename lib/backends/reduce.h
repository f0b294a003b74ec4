/* The reduction family of the backend table: reductions over trailing axes
 * and softmax. Dispatchers (lib/ops/reduce.c) fill in dtypes and shapes. */
#ifndef NDM_BACKEND_REDUCE_H
#define NDM_BACKEND_REDUCE_H

#include "backend.h"

typedef enum ndm__reduce_op {
    NDM__RED_SUM,
    NDM__RED_PROD,
    NDM__RED_MEAN,
    NDM__RED_VAR,
    NDM__RED_STD,
    NDM__RED_MAX,
    NDM__RED_MIN,
    NDM__RED_ARGMAX,
    NDM__RED_ARGMIN,
    NDM__RED_ALL,
    NDM__RED_ANY,
    NDM__RED_LOGSUMEXP,
} ndm__reduce_op;

struct ndm__backend_reduce {
    /* required: reduce the trailing `nred` axes of src into dst. src has
     * dst->ndim + nred axes and its leading axes have dst's shape; the
     * reduced axes come in the input's order, so the flat index that
     * argmax/argmin return is their C-order position. dst's dtype is the
     * op's result dtype (float accumulation in f64, integer sum/prod in
     * int64 wrapping). When the reduced count is 0: sum 0, prod 1, all 1,
     * any 0, logsumexp -inf, mean/var/std NaN; the dispatcher never passes
     * an empty max/min/argmax/argmin with a non-empty dst. `ddof` is used
     * by var and std. dst does not overlap src. */
    ndm_status (*reduce)(int device, ndm__reduce_op op, const ndm__tensor *dst,
                         const ndm__tensor *src, int nred, int64_t ddof);
    /* required: softmax (or log_softmax when `log`) of src along `axis`
     * into dst, same shape, a float dtype; src may be any dtype. */
    ndm_status (*softmax)(int device, const ndm__tensor *dst, const ndm__tensor *src, int axis,
                          bool log);
};

extern const struct ndm__backend_reduce ndm__cpu_reduce;
extern const struct ndm__backend_reduce ndm__cpu_ref_reduce;

#endif
