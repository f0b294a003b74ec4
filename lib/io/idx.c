/* IDX (the MNIST format), plain or gzip-compressed. Sizes are checked
 * against what the file can hold before the array is allocated. */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "io.h"

static ndm_array load(ndm__site site, const char *api, ndm_manager m, ndm__src *s)
{
    uint8_t magic[4];
    if (ndm__src_read_exact(s, magic, 4, "the IDX magic", api, site) < 0)
        return NDM_NULL_ARRAY;
    if (magic[0] || magic[1]) {
        ndm__fail(NDM_E_FORMAT, api, site,
                  "'%s' is not an IDX file: it starts with 0x%02x%02x, not two zero bytes",
                  s->name, magic[0], magic[1]);
        return NDM_NULL_ARRAY;
    }
    ndm_dtype dtype;
    switch (magic[2]) {
    case 0x08: dtype = NDM_U8; break;
    case 0x0C: dtype = NDM_I32; break;
    case 0x0D: dtype = NDM_F32; break;
    case 0x0E: dtype = NDM_F64; break;
    case 0x09:
    case 0x0B:
        ndm__fail(NDM_E_DTYPE, api, site, "'%s': IDX type 0x%02x (%s) has no ndm dtype", s->name,
                  magic[2], magic[2] == 0x09 ? "i8" : "i16");
        return NDM_NULL_ARRAY;
    default:
        ndm__fail(NDM_E_FORMAT, api, site, "'%s': unknown IDX type code 0x%02x", s->name,
                  magic[2]);
        return NDM_NULL_ARRAY;
    }
    int ndim = magic[3];
    int64_t shape[255];
    uint8_t dims[4 * 255];
    if (ndm__src_read_exact(s, dims, 4 * (size_t)ndim, "the IDX sizes", api, site) < 0)
        return NDM_NULL_ARRAY;
    for (int i = 0; i < ndim; i++)
        shape[i] = ndm__load_be32(dims + 4 * i);
    size_t nbytes;
    if (ndm__shape_check(ndim, shape, dtype, NULL, &nbytes, api, site) < 0)
        return NDM_NULL_ARRAY;
    /* Before allocating: a gzip file is bounded by deflate's best ratio. */
    uint64_t bound = ndm__src_bound(s);
    if (nbytes > bound) {
        char desc[160];
        ndm__fail(NDM_E_FORMAT, api, site,
                  "'%s': the IDX header describes %s (%zu bytes) but the %s holds at most %" PRIu64
                  " bytes of data",
                  s->name, ndm__shape_desc(dtype, ndim, shape, desc, sizeof desc), nbytes,
                  ndm__src_is_gzip(s) ? "compressed file" : "file", bound);
        return NDM_NULL_ARRAY;
    }
    ndm__view r;
    ndm_array a = ndm__array_make(site, api, m, NULL, dtype, ndim, shape, &r);
    if (!a.id)
        return a;
    bool swap = ndm__host_little_endian() && ndm_dtype_size(dtype) > 1;
    ndm_status st = ndm__io_fill_array(&r, s, swap, "the IDX data", api, site);
    if (st == NDM_OK)
        st = ndm__src_expect_end(s, api, site);
    if (st < 0) {
        ndm__discard(a);
        return NDM_NULL_ARRAY;
    }
    return a;
}

NDM_API ndm_array ndm_idx_load_at(NDM_SITE_PARAMS, ndm_manager m, const char *path)
{
    return ndm__io_load_file(NDM__SITE, __func__, m, path, true, load);
}

NDM_API ndm_array ndm_idx_load_buffer_at(NDM_SITE_PARAMS, ndm_manager m, const void *data,
                                         size_t len)
{
    return ndm__io_load_mem(NDM__SITE, __func__, m, data, len, true, load);
}
