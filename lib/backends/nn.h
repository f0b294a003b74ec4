/* The neural-network family of the backend table: 2-d convolution and
 * pooling on NCHW arrays. Dispatchers (lib/ops/conv.c) check the geometry. */
#ifndef NDM_BACKEND_NN_H
#define NDM_BACKEND_NN_H

#include "backend.h"

/* Geometry with every default resolved: index 0 is H, 1 is W. */
typedef struct ndm__conv2d_geom {
    int64_t stride[2], padding[2], dilation[2];
    int64_t groups;
} ndm__conv2d_geom;

typedef struct ndm__pool2d_geom {
    int64_t kernel[2], stride[2], padding[2];
    bool max;               /* max pooling; else average */
    bool count_include_pad; /* average: divide by the full window */
} ndm__pool2d_geom;

struct ndm__backend_nn {
    /* required: bytes of scratch that conv2d needs for these operands (the
     * dispatcher allocates it and passes it in). */
    size_t (*conv2d_workspace)(int device, const ndm__tensor *y, const ndm__tensor *x,
                               const ndm__tensor *w, const ndm__conv2d_geom *g);
    /* required: y (N, O, OH, OW) = x (N, C, H, W) cross-correlated with
     * w (O, C/groups, KH, KW), plus bias (O) when not NULL. One dtype, f32
     * or f64; x, w and bias may have any strides, y is C-contiguous and
     * does not overlap the inputs. `ws` holds conv2d_workspace bytes,
     * aligned to 64 (NULL when that is 0). */
    ndm_status (*conv2d)(int device, const ndm__tensor *y, const ndm__tensor *x,
                         const ndm__tensor *w, const ndm__tensor *bias,
                         const ndm__conv2d_geom *g, void *ws);
    /* required: y (N, C, OH, OW) = max or mean of each window of x
     * (N, C, H, W); f32 or f64; padding never wins a max. */
    ndm_status (*pool2d)(int device, const ndm__tensor *y, const ndm__tensor *x,
                         const ndm__pool2d_geom *g);
};

extern const struct ndm__backend_nn ndm__cpu_nn;
extern const struct ndm__backend_nn ndm__cpu_ref_nn;

#endif
