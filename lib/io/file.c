/* Byte sources and sinks for the file formats: plain and gzip files and
 * buffers, atomic file writes, and moving array data through them. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "../base/checked.h"
#include "io.h"

/* Host-side staging for device arrays and strided writes: big enough to keep
 * system calls rare, small enough to stay in cache-friendly territory. */
#define STAGE_BYTES ((size_t)4 << 20)
/* gzread takes an int count; plain reads are chunked the same way. */
#define READ_CHUNK ((size_t)1 << 30)

ndm_status ndm__io_errno(int err, const char *path, const char *what, const char *api,
                         ndm__site where)
{
    return ndm__fail(NDM_E_IO, api, where, "cannot %s '%s': %s", what, path, strerror(err));
}

/* ---- sources ------------------------------------------------------------- */

static ndm_status gzip_mem_init(ndm__src *s, const char *api, ndm__site where)
{
    z_stream *zs = calloc(1, sizeof *zs);
    if (!zs)
        return ndm__fail(NDM_E_OOM, api, where, "no memory for a gzip stream");
    /* 16 + MAX_WBITS: gzip framing only, as the file path accepts. */
    if (inflateInit2(zs, 16 + MAX_WBITS) != Z_OK) {
        free(zs);
        return ndm__fail(NDM_E_OOM, api, where, "cannot start a gzip decoder");
    }
    zs->next_in = (Bytef *)s->mem;
    zs->avail_in = s->size > UINT_MAX ? UINT_MAX : (uInt)s->size;
    s->zs = zs;
    s->kind = NDM__SRC_GZ_MEM;
    return NDM_OK;
}

ndm_status ndm__src_open_mem(ndm__src *s, const void *data, size_t len, bool gzip,
                             const char *api, ndm__site where)
{
    memset(s, 0, sizeof *s);
    s->fd = -1;
    s->name = "<buffer>";
    if (len && !data)
        return ndm__fail(NDM_E_INVALID, api, where, "data is NULL for %zu bytes", len);
    s->mem = data;
    s->size = len;
    s->kind = NDM__SRC_MEM;
    if (gzip && len >= 2 && s->mem[0] == 0x1f && s->mem[1] == 0x8b)
        return gzip_mem_init(s, api, where);
    return NDM_OK;
}

const char *ndm__file_kind(unsigned mode)
{
    mode_t m = (mode_t)mode;
    return S_ISREG(m)    ? "a regular file"
           : S_ISDIR(m)  ? "a directory"
           : S_ISFIFO(m) ? "a FIFO"
           : S_ISCHR(m)  ? "a character device"
           : S_ISBLK(m)  ? "a block device"
           : S_ISSOCK(m) ? "a socket"
           : S_ISLNK(m)  ? "a symbolic link"
                         : "of an unknown kind";
}

static ndm_status not_regular(const char *path, mode_t mode, const char *api, ndm__site where)
{
    return ndm__fail(NDM_E_IO, api, where, "'%s' is %s, not a regular file", path,
                     ndm__file_kind(mode));
}

int ndm__open_regular(const char *path, uint64_t *size, const char *api, ndm__site where)
{
    if (!path)
        return ndm__fail(NDM_E_INVALID, api, where, "path is NULL");
    /* A device is refused before it is opened (opening one can have effects
     * of its own); O_NONBLOCK keeps a FIFO that appears after the check from
     * blocking the open until a writer comes, and fstat decides. */
    struct stat st;
    if (stat(path, &st) == 0 && !S_ISREG(st.st_mode))
        return not_regular(path, st.st_mode, api, where);
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (fd < 0) {
        int e = errno;
        /* a socket cannot be opened: say what it is rather than ENXIO */
        if (stat(path, &st) == 0 && !S_ISREG(st.st_mode))
            return not_regular(path, st.st_mode, api, where);
        return ndm__io_errno(e, path, "open", api, where);
    }
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return ndm__io_errno(e, path, "stat", api, where);
    }
    /* Sizes are checked against the file's size before allocating, so the
     * size has to be known: no pipes or devices. */
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return not_regular(path, st.st_mode, api, where);
    }
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) < 0) {
        int e = errno;
        close(fd);
        return ndm__io_errno(e, path, "set the mode of", api, where);
    }
    *size = (uint64_t)st.st_size;
    return fd;
}

ndm_status ndm__src_open_file(ndm__src *s, const char *path, bool gzip, const char *api,
                              ndm__site where)
{
    memset(s, 0, sizeof *s);
    s->fd = -1;
    s->name = path;
    uint64_t size;
    int fd = ndm__open_regular(path, &size, api, where);
    if (fd < 0)
        return fd;
    s->fd = fd;
    s->size = size;
    s->kind = NDM__SRC_FD;
    if (!gzip || s->size < 2)
        return NDM_OK;
    uint8_t magic[2];
    ssize_t k;
    do
        k = pread(fd, magic, 2, 0);
    while (k < 0 && errno == EINTR);
    if (k < 0) {
        int e = errno;
        ndm__src_close(s);
        return ndm__io_errno(e, path, "read", api, where);
    }
    if (k == 2 && magic[0] == 0x1f && magic[1] == 0x8b) {
        gzFile gz = gzdopen(fd, "rb");
        if (!gz) {
            ndm__src_close(s);
            return ndm__fail(NDM_E_OOM, api, where, "cannot start a gzip decoder for '%s'", path);
        }
        gzbuffer(gz, 256 * 1024);
        s->gz = gz;
        s->fd = -1; /* gzclose closes it */
        s->kind = NDM__SRC_GZ_FD;
    }
    return NDM_OK;
}

void ndm__src_close(ndm__src *s)
{
    if (s->gz)
        gzclose((gzFile)s->gz);
    if (s->fd >= 0)
        close(s->fd);
    if (s->zs) {
        inflateEnd((z_stream *)s->zs);
        free(s->zs);
    }
    s->gz = NULL;
    s->zs = NULL;
    s->fd = -1;
}

ndm_array ndm__io_load_file(ndm__site site, const char *api, ndm_manager m, const char *path,
                            bool gzip, ndm__load_fn load)
{
    m = ndm__io_manager(m, api, site);
    ndm__src s;
    if (!m.id || ndm__src_open_file(&s, path, gzip, api, site) < 0)
        return NDM_NULL_ARRAY;
    ndm_array a = load(site, api, m, &s);
    ndm__src_close(&s);
    return a;
}

ndm_array ndm__io_load_mem(ndm__site site, const char *api, ndm_manager m, const void *data,
                           size_t len, bool gzip, ndm__load_fn load)
{
    m = ndm__io_manager(m, api, site);
    ndm__src s;
    if (!m.id || ndm__src_open_mem(&s, data, len, gzip, api, site) < 0)
        return NDM_NULL_ARRAY;
    ndm_array a = load(site, api, m, &s);
    ndm__src_close(&s);
    return a;
}

uint64_t ndm__src_bound(const ndm__src *s)
{
    if (!ndm__src_is_gzip(s))
        return s->size - s->pos;
    uint64_t b = s->size > (UINT64_MAX - 1024) / NDM__GZIP_MAX_RATIO
                     ? UINT64_MAX
                     : s->size * NDM__GZIP_MAX_RATIO + 1024;
    return b > s->pos ? b - s->pos : 0;
}

static ndm_status read_fd(ndm__src *s, uint8_t *dst, size_t n, size_t *got, const char *api,
                          ndm__site where)
{
    size_t done = 0;
    while (done < n) {
        size_t want = n - done < READ_CHUNK ? n - done : READ_CHUNK;
        ssize_t k = read(s->fd, dst + done, want);
        if (k < 0) {
            if (errno == EINTR)
                continue;
            return ndm__io_errno(errno, s->name, "read", api, where);
        }
        if (k == 0)
            break;
        done += (size_t)k;
    }
    *got = done;
    return NDM_OK;
}

static ndm_status read_gz_fd(ndm__src *s, uint8_t *dst, size_t n, size_t *got, const char *api,
                             ndm__site where)
{
    gzFile gz = s->gz;
    size_t done = 0;
    while (done < n) {
        size_t want = n - done < READ_CHUNK ? n - done : READ_CHUNK;
        int k = gzread(gz, dst + done, (unsigned)want);
        if (k < 0) {
            int code;
            const char *msg = gzerror(gz, &code);
            if (code == Z_ERRNO)
                return ndm__io_errno(errno, s->name, "read", api, where);
            return ndm__fail(NDM_E_FORMAT, api, where, "'%s': corrupt gzip data (%s)", s->name,
                             msg);
        }
        done += (size_t)k;
        if ((size_t)k < want) {
            int code;
            const char *msg = gzerror(gz, &code);
            /* Z_BUF_ERROR: the file ends inside a gzip stream. */
            if (code != Z_OK)
                return ndm__fail(NDM_E_FORMAT, api, where,
                                 "'%s': the gzip data is truncated or corrupt (%s)", s->name,
                                 msg);
            break;
        }
    }
    *got = done;
    return NDM_OK;
}

static ndm_status read_gz_mem(ndm__src *s, uint8_t *dst, size_t n, size_t *got,
                              const char *api, ndm__site where)
{
    z_stream *zs = s->zs;
    size_t done = 0;
    while (done < n && !s->zend) {
        uint64_t used = (uint64_t)((const uint8_t *)zs->next_in - s->mem);
        if (zs->avail_in == 0 && used < s->size) {
            uint64_t left = s->size - used;
            zs->avail_in = left > UINT_MAX ? UINT_MAX : (uInt)left;
        }
        size_t want = n - done < UINT_MAX ? n - done : UINT_MAX;
        zs->next_out = dst + done;
        zs->avail_out = (uInt)want;
        int rc = inflate(zs, Z_NO_FLUSH);
        done += want - zs->avail_out;
        if (rc == Z_OK)
            continue;
        if (rc == Z_STREAM_END) {
            /* Another member may follow, as gzread would read it. */
            const uint8_t *p = zs->next_in;
            uint64_t left = s->size - (uint64_t)(p - s->mem);
            if (left >= 2 && p[0] == 0x1f && p[1] == 0x8b) {
                if (inflateReset(zs) != Z_OK)
                    return ndm__fail(NDM_E_FORMAT, api, where, "'%s': bad gzip member", s->name);
                continue;
            }
            s->zend = true;
        } else if (rc == Z_BUF_ERROR) {
            /* No progress is possible: the input ended inside a stream. */
            return ndm__fail(NDM_E_FORMAT, api, where,
                             "'%s': the gzip data is truncated (it ends inside a stream)",
                             s->name);
        } else {
            return ndm__fail(rc == Z_MEM_ERROR ? NDM_E_OOM : NDM_E_FORMAT, api, where,
                             "'%s': corrupt gzip data (%s)", s->name,
                             zs->msg ? zs->msg : "inflate failed");
        }
    }
    *got = done;
    return NDM_OK;
}

ndm_status ndm__src_read(ndm__src *s, void *dst, size_t n, size_t *got, const char *api,
                         ndm__site where)
{
    size_t k = 0;
    ndm_status st = NDM_OK;
    switch (s->kind) {
    case NDM__SRC_MEM: {
        uint64_t left = s->size - s->pos;
        k = n < left ? n : (size_t)left;
        if (k)
            memcpy(dst, s->mem + s->pos, k);
        break;
    }
    case NDM__SRC_FD:
        st = read_fd(s, dst, n, &k, api, where);
        break;
    case NDM__SRC_GZ_FD:
        st = read_gz_fd(s, dst, n, &k, api, where);
        break;
    case NDM__SRC_GZ_MEM:
        st = read_gz_mem(s, dst, n, &k, api, where);
        break;
    }
    s->pos += k;
    *got = k;
    return st;
}

ndm_status ndm__src_read_exact(ndm__src *s, void *dst, size_t n, const char *what,
                               const char *api, ndm__site where)
{
    size_t got;
    uint64_t at = s->pos;
    ndm_status st = ndm__src_read(s, dst, n, &got, api, where);
    if (st < 0)
        return st;
    if (got < n)
        return ndm__fail(NDM_E_FORMAT, api, where,
                         "'%s' is truncated: %s needs %zu bytes at offset %" PRIu64
                         ", only %zu remain",
                         s->name, what, n, at, got);
    return NDM_OK;
}

ndm_status ndm__src_expect_end(ndm__src *s, const char *api, ndm__site where)
{
    uint8_t extra[64];
    size_t got;
    uint64_t at = s->pos;
    ndm_status st = ndm__src_read(s, extra, sizeof extra, &got, api, where);
    if (st < 0)
        return st;
    if (got)
        return ndm__fail(NDM_E_FORMAT, api, where,
                         "'%s' has unexpected bytes after its data (at offset %" PRIu64 ")",
                         s->name, at);
    return NDM_OK;
}

/* ---- temporaries ----------------------------------------------------------------- */

ndm_status ndm__tmp_resize(ndm__tmp *t, ndm_manager m, size_t n, size_t keep, const char *what,
                           const char *api, ndm__site where)
{
    ndm__alloc_tag tag = {ndm__owner_slot(m), where.file, where.func, where.line, NULL, false};
    ndm__block b;
    if (ndm__alloc(NDM_CPU, n, &tag, &b) < 0)
        return ndm__fail(ndm_last_status(), api, where, "no memory for %s (%zu bytes): %s", what,
                         n, ndm_last_error());
    if (t->blk.ptr && keep)
        memcpy(b.ptr, t->blk.ptr, keep < n ? keep : n);
    ndm__tmp_free(t);
    t->blk = b;
    return NDM_OK;
}

void ndm__tmp_free(ndm__tmp *t)
{
    if (t->blk.cookie)
        ndm__free(NDM_CPU, &t->blk);
    memset(&t->blk, 0, sizeof t->blk);
}

ndm_status ndm__src_read_all(ndm__src *s, ndm__tmp *t, size_t *len, ndm_manager m,
                             const char *api, ndm__site where)
{
    /* Plain data in one read of its size (one byte more to see its end);
     * gzip into a buffer that doubles as it fills. */
    uint64_t left = s->size - s->pos;
    size_t cap = ndm__src_is_gzip(s) ? (size_t)1 << 16
                 : left < SIZE_MAX ? (size_t)left + 1
                                   : SIZE_MAX;
    char what[64 + 256];
    snprintf(what, sizeof what, "the contents of '%s'", s->name);
    ndm_status st = ndm__tmp_resize(t, m, cap, 0, what, api, where);
    size_t n = 0;
    while (st == NDM_OK) {
        size_t got;
        st = ndm__src_read(s, (char *)t->blk.ptr + n, cap - n, &got, api, where);
        n += got;
        if (st < 0 || n < cap)
            break;
        size_t grown;
        if (ndm__ckd_mul_size(&grown, cap, 2)) {
            st = ndm__fail(NDM_E_OVERFLOW, api, where, "'%s' decodes to more than %zu bytes",
                           s->name, cap);
            break;
        }
        snprintf(what, sizeof what, "the contents of '%s' past %zu decoded bytes", s->name, n);
        st = ndm__tmp_resize(t, m, grown, n, what, api, where);
        cap = grown;
    }
    if (st < 0) {
        ndm__tmp_free(t);
        return st;
    }
    *len = n;
    return NDM_OK;
}

/* ---- byte order and arrays ------------------------------------------------- */

void ndm__swap_bytes(void *p, size_t n, size_t size)
{
    uint8_t *b = p;
    if (size < 2)
        return;
    for (size_t i = 0; i < n; i++, b += size)
        for (size_t lo = 0, hi = size - 1; lo < hi; lo++, hi--) {
            uint8_t t = b[lo];
            b[lo] = b[hi];
            b[hi] = t;
        }
}

/* Items as ndm keeps them: host order, bools 0 or 1. */
static void fix_items(void *p, size_t nbytes, ndm_dtype dt, bool swap)
{
    size_t isz = ndm_dtype_size(dt);
    if (swap)
        ndm__swap_bytes(p, nbytes / isz, isz);
    if (dt == NDM_BOOL) {
        uint8_t *b = p;
        for (size_t i = 0; i < nbytes; i++)
            b[i] = b[i] != 0;
    }
}

ndm_status ndm__io_fill_array(const ndm__view *v, ndm__src *s, bool swap, const char *what,
                              const char *api, ndm__site where)
{
    size_t nbytes = v->nbytes;
    if (v->device.type == NDM_DEVICE_CPU) {
        ndm_status st = ndm__src_read_exact(s, v->t.data, nbytes, what, api, where);
        if (st == NDM_OK)
            fix_items(v->t.data, nbytes, v->t.dtype, swap);
        return st;
    }
    size_t isz = ndm_dtype_size(v->t.dtype);
    size_t chunk = STAGE_BYTES - STAGE_BYTES % isz;
    uint8_t *stage = malloc(nbytes < chunk ? (nbytes ? nbytes : 1) : chunk);
    if (!stage)
        return ndm__fail(NDM_E_OOM, api, where, "no memory for a staging buffer");
    ndm_status st = NDM_OK;
    for (size_t done = 0; done < nbytes && st == NDM_OK;) {
        size_t k = nbytes - done < chunk ? nbytes - done : chunk;
        st = ndm__src_read_exact(s, stage, k, what, api, where);
        if (st == NDM_OK) {
            fix_items(stage, k, v->t.dtype, swap);
            st = ndm__range_from_host(v, done, stage, k, api, where);
        }
        done += k;
    }
    free(stage);
    return st;
}

ndm_status ndm__io_fill_array_mem(const ndm__view *v, const void *src, bool swap, const char *api,
                                  ndm__site where)
{
    ndm__src s;
    ndm_status st = ndm__src_open_mem(&s, src, v->nbytes, false, api, where);
    if (st == NDM_OK)
        st = ndm__io_fill_array(v, &s, swap, "the array data", api, where);
    ndm__src_close(&s);
    return st;
}

/* ---- writing array data ---------------------------------------------------- */

typedef struct writer {
    FILE *f;
    const char *path;
    bool swap;
    ndm_dtype dtype;
    size_t isz;
    uint8_t *stage;
    size_t cap;
    int64_t *shape, *strides; /* scratch for one sub-array */
    const char *api;
    ndm__site where;
} writer;

static ndm_status put(writer *w, const void *p, size_t n)
{
    if (n && fwrite(p, 1, n, w->f) != n)
        return ndm__io_errno(errno, w->path, "write", w->api, w->where);
    return NDM_OK;
}

/* Copy the sub-array (data, ndim, shape with shape[0] = rows0, strides) into
 * the stage in C order and write it; it fits in the stage. */
static ndm_status emit(writer *w, char *data, int ndim, const int64_t *shape,
                       const int64_t *strides, int64_t rows0)
{
    for (int i = 0; i < ndim; i++)
        w->shape[i] = shape[i];
    if (ndim)
        w->shape[0] = rows0;
    ndm__contiguous_strides(ndim, w->shape, w->strides);
    ndm__tensor dst = {w->stage, w->dtype, ndim, w->shape, w->strides};
    ndm__tensor src = {data, w->dtype, ndim, w->shape, strides};
    ndm_status st = ndm__host_copy(&dst, &src, w->api, w->where);
    if (st < 0)
        return st;
    size_t n = (size_t)ndm__shape_numel(ndim, w->shape) * w->isz;
    if (w->swap)
        ndm__swap_bytes(w->stage, n / w->isz, w->isz);
    return put(w, w->stage, n);
}

/* Write a strided CPU sub-array in C order, in pieces that fit the stage. */
static ndm_status write_sub(writer *w, char *data, int ndim, const int64_t *shape,
                            const int64_t *strides)
{
    size_t bytes = (size_t)ndm__shape_numel(ndim, shape) * w->isz;
    if (bytes <= w->cap)
        return emit(w, data, ndim, shape, strides, ndim ? shape[0] : 1);
    size_t row = (size_t)ndm__shape_numel(ndim - 1, shape + 1) * w->isz;
    int64_t step = row <= w->cap ? (int64_t)(w->cap / row) : 1;
    for (int64_t i = 0; i < shape[0]; i += step) {
        char *p = data + i * strides[0] * (int64_t)w->isz;
        int64_t k = shape[0] - i < step ? shape[0] - i : step;
        ndm_status st = row <= w->cap ? emit(w, p, ndim, shape, strides, k)
                                      : write_sub(w, p, ndim - 1, shape + 1, strides + 1);
        if (st < 0)
            return st;
    }
    return NDM_OK;
}

/* Download a contiguous device array in stage-sized pieces. */
static ndm_status write_device(writer *w, const ndm__view *v)
{
    size_t n = v->nbytes;
    for (size_t done = 0; done < n;) {
        size_t k = n - done < w->cap ? n - done : w->cap;
        ndm_status st = ndm__range_to_host(v, done, w->stage, k, w->api, w->where);
        if (st < 0)
            return st;
        if (w->swap)
            ndm__swap_bytes(w->stage, k / w->isz, w->isz);
        if ((st = put(w, w->stage, k)) < 0)
            return st;
        done += k;
    }
    return NDM_OK;
}

ndm_status ndm__io_write_array(FILE *f, const ndm__view *v, const char *path, const char *api,
                               ndm__site where)
{
    const ndm__tensor *t = &v->t;
    size_t isz = ndm_dtype_size(t->dtype);
    size_t nbytes = v->nbytes;
    bool swap = !ndm__host_little_endian() && isz > 1;
    ndm_device dev = v->device;
    writer w = {f, path, swap, t->dtype, isz, NULL, 0, NULL, NULL, api, where};
    if (dev.type == NDM_DEVICE_CPU && v->contiguous && !swap)
        return put(&w, t->data, nbytes);
    if (!nbytes)
        return NDM_OK;
    w.cap = STAGE_BYTES - STAGE_BYTES % isz;
    w.stage = malloc(w.cap);
    w.shape = malloc(2 * (size_t)(t->ndim ? t->ndim : 1) * sizeof(int64_t));
    ndm_status st = NDM_OK;
    if (!w.stage || !w.shape) {
        st = ndm__fail(NDM_E_OOM, api, where, "no memory for a staging buffer");
    } else if (dev.type == NDM_DEVICE_CPU) {
        w.strides = w.shape + t->ndim;
        st = write_sub(&w, t->data, t->ndim, t->shape, t->strides);
    } else if (v->contiguous) {
        st = write_device(&w, v);
    } else {
        /* Make it contiguous on the device first, as ndm_array_copy_out does. */
        ndm__block tmp;
        st = ndm__alloc(dev, nbytes, NULL, &tmp);
        if (st == NDM_OK) {
            ndm__contiguous_strides(t->ndim, t->shape, w.shape);
            ndm__view c = *v;
            c.t = (ndm__tensor){tmp.ptr, t->dtype, t->ndim, t->shape, w.shape};
            c.contiguous = true;
            st = ndm__device_copy(dev, &c.t, t, api, where);
            if (st == NDM_OK)
                st = write_device(&w, &c);
            ndm__free(dev, &tmp);
        } else {
            ndm__fail(st, api, where, "no device memory for a contiguous copy");
        }
    }
    free(w.stage);
    free(w.shape);
    return st;
}

/* ---- atomic output files ----------------------------------------------------- */

static atomic_uint tmp_counter;

/* Where a save to `path` lands: NDM_OK with *dest NULL for the path itself
 * (missing or a regular file), or the file a symbolic link names (malloc'd),
 * so the link stays a link. Anything else there is refused, because the
 * rename would put a regular file in its place. */
static ndm_status save_target(const char *path, char **dest, const char *api, ndm__site where)
{
    *dest = NULL;
    struct stat st;
    if (lstat(path, &st) != 0)
        return errno == ENOENT ? NDM_OK : ndm__io_errno(errno, path, "stat", api, where);
    if (S_ISREG(st.st_mode))
        return NDM_OK;
    if (!S_ISLNK(st.st_mode))
        return ndm__fail(NDM_E_IO, api, where,
                         "cannot save to '%s': it is %s, not a regular file", path,
                         ndm__file_kind(st.st_mode));
    if (stat(path, &st) != 0)
        return ndm__fail(NDM_E_IO, api, where,
                         "cannot save to '%s': it is a symbolic link to nothing that exists "
                         "(%s)",
                         path, strerror(errno));
    if (!S_ISREG(st.st_mode))
        return ndm__fail(NDM_E_IO, api, where,
                         "cannot save to '%s': it is a symbolic link to %s, not to a regular "
                         "file",
                         path, ndm__file_kind(st.st_mode));
    if (!(*dest = realpath(path, NULL)))
        return ndm__io_errno(errno, path, "resolve the link", api, where);
    return NDM_OK;
}

ndm_status ndm__out_open(ndm__out_file *o, const char *path, const char *api, ndm__site where)
{
    memset(o, 0, sizeof *o);
    if (!path)
        return ndm__fail(NDM_E_INVALID, api, where, "path is NULL");
    ndm_status st = save_target(path, &o->dest, api, where);
    if (st < 0)
        return st;
    const char *at = o->dest ? o->dest : path;
    size_t n = strlen(at) + 64;
    o->tmp = malloc(n);
    if (!o->tmp) {
        free(o->dest);
        o->dest = NULL;
        return ndm__fail(NDM_E_OOM, api, where, "no memory for a file name");
    }
    for (int attempt = 0; attempt < 100; attempt++) {
        snprintf(o->tmp, n, "%s.tmp-%ld-%u", at, (long)getpid(),
                 atomic_fetch_add(&tmp_counter, 1));
        /* 0666: the caller's umask decides, as for any new file. */
        int fd = open(o->tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
        if (fd < 0) {
            if (errno == EEXIST)
                continue;
            st = ndm__io_errno(errno, path, "create a file beside", api, where);
            break;
        }
        o->f = fdopen(fd, "wb");
        if (!o->f) {
            st = ndm__io_errno(errno, o->tmp, "open", api, where);
            close(fd);
            unlink(o->tmp);
            break;
        }
        o->path = path;
        return NDM_OK;
    }
    if (st == NDM_OK)
        st = ndm__fail(NDM_E_IO, api, where, "cannot find a free temporary name beside '%s'",
                       path);
    free(o->tmp);
    free(o->dest);
    o->tmp = NULL;
    o->dest = NULL;
    return st;
}

ndm_status ndm__out_write(ndm__out_file *o, const void *p, size_t n, const char *api,
                          ndm__site where)
{
    if (n && fwrite(p, 1, n, o->f) != n)
        return ndm__io_errno(errno, o->path, "write", api, where);
    return NDM_OK;
}

ndm_status ndm__out_commit(ndm__out_file *o, const char *api, ndm__site where)
{
    int err = 0;
    if (fflush(o->f) != 0 || ferror(o->f))
        err = errno ? errno : EIO;
    if (fclose(o->f) != 0 && !err)
        err = errno ? errno : EIO;
    o->f = NULL;
    ndm_status st = NDM_OK;
    if (!err) {
        /* Looked at again: what was put at the path while the data was
         * written must not be replaced either. */
        char *dest;
        st = save_target(o->path, &dest, api, where);
        const char *to = dest ? dest : o->path;
        if (st == NDM_OK && (!dest != !o->dest || (dest && strcmp(dest, o->dest) != 0)))
            st = ndm__fail(NDM_E_IO, api, where,
                           "cannot save to '%s': a link there was made or changed during the "
                           "save",
                           o->path);
        if (st == NDM_OK && rename(o->tmp, to) != 0)
            err = errno;
        free(dest);
    }
    if (err)
        st = ndm__io_errno(err, o->path, "write", api, where);
    if (st < 0)
        unlink(o->tmp);
    free(o->tmp);
    free(o->dest);
    o->tmp = NULL;
    o->dest = NULL;
    return st;
}

void ndm__out_abort(ndm__out_file *o)
{
    if (o->f)
        fclose(o->f);
    if (o->tmp) {
        unlink(o->tmp);
        free(o->tmp);
    }
    free(o->dest);
    o->f = NULL;
    o->tmp = NULL;
    o->dest = NULL;
}
