/* What the CUDA module runs, as one table: the dispatchers ask it
 * (ndm__backend.supports) before they call a family member, and the
 * conformance suite checks it against the kernels. A row per family (or per
 * operation where one differs), with the dtypes its kernels take and the
 * operand layouts they walk. Host code only: it builds with nvcc and as the
 * host stand-in's C++ alike. */
#include <string.h>

/* the public headers first: their C++ parts must not fall under cuda.h's C linkage */
#include "ndm/base.h"
#include "ndm/dtype.h"

#include "cuda.h"

#define DT(t) (1u << (t))
/* every dtype: the kernels are instantiated over NDM__CU_DTYPES */
#define ANY_DTYPE (DT(NDM_DTYPE_COUNT) - 1u)
/* cuBLAS runs f32 and f64; matmul has its own i64 kernel */
#define MATMUL_DTYPES (DT(NDM_F32) | DT(NDM_F64) | DT(NDM_I64))
/* convolution (through cuBLAS) and pooling compute in f32 or f64 */
#define NN_DTYPES (DT(NDM_F32) | DT(NDM_F64))
/* strided, broadcast and empty operands: the iterators take any strides */
#define ANY_LAYOUT (NDM__LAYOUT_STRIDED | NDM__LAYOUT_BROADCAST | NDM__LAYOUT_EMPTY)

typedef struct cuda_row {
    ndm__op_family family;
    const char *name; /* NULL: every operation of the family */
    unsigned dtypes;  /* each of the case's dtypes is one of these */
    unsigned layouts; /* the layout bits it may carry */
} cuda_row;

/* Searched in order: a row naming an operation comes before its family's. */
static const cuda_row rows[] = {
    /* copy, fill, iota: any pair of dtypes, any strides */
    {NDM__OPS_CORE, NULL, ANY_DTYPE, ANY_LAYOUT},
    /* binary, binary_scalar, unary, where, binary_flat: every op of the
     * lists; the fused relu gradient and optimizer step are not here (the
     * table has no such members: the dispatcher composes them) */
    {NDM__OPS_EW, "relu_grad_flat", 0, 0},
    {NDM__OPS_EW, "optim_flat", 0, 0},
    {NDM__OPS_EW, NULL, ANY_DTYPE, ANY_LAYOUT},
    /* every reduction of the list, softmax and log_softmax */
    {NDM__OPS_REDUCE, NULL, ANY_DTYPE, ANY_LAYOUT},
    /* matmul in its computation dtype; no fused linear layer */
    {NDM__OPS_LINALG, "matmul", MATMUL_DTYPES, ANY_LAYOUT},
    /* copy, take, gather, scatter_add, one_hot, pad, cumsum, cumprod,
     * nonzero, tri, sort (and the bounds scan of the index arguments) */
    {NDM__OPS_INDEX, NULL, ANY_DTYPE, ANY_LAYOUT},
    /* conv2d and its two gradients, pooling and its gradient */
    {NDM__OPS_NN, NULL, NN_DTYPES, ANY_LAYOUT},
    /* uniform, normal, randint, bernoulli, permutation */
    {NDM__OPS_RANDOM, NULL, ANY_DTYPE, ANY_LAYOUT},
};

extern "C" bool ndm__cuda_supports(int device, const ndm__op_case *c)
{
    (void)device; /* every device of the module runs the same kernels */
    for (size_t i = 0; i < sizeof rows / sizeof *rows; i++) {
        const cuda_row *r = &rows[i];
        if (r->family != c->family || (r->name && (!c->name || strcmp(r->name, c->name))))
            continue;
        if (c->layout & ~r->layouts)
            return false;
        for (int k = 0; k < c->ndtypes && k < NDM__OP_MAX_OPERANDS; k++)
            if ((unsigned)c->dtypes[k] >= NDM_DTYPE_COUNT || !(r->dtypes & DT(c->dtypes[k])))
                return false;
        return true;
    }
    return false; /* a family or operation the table does not name */
}
