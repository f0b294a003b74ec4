/* Private helpers shared by the file formats: byte sources (files, buffers,
 * gzip streams), byte order, atomic file writes and array data transfer. */
#ifndef NDM_IO_INTERNAL_H
#define NDM_IO_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "ndm/io.h"
#include "../manager/alloc/alloc.h"
#include "../ops/inner.h"

/* Deflate cannot expand a byte of input into more than 1032 bytes of output,
 * so a gzip source of n bytes decodes to at most this many bytes: the bound
 * a gzip header's sizes are checked against before anything is allocated. */
#define NDM__GZIP_MAX_RATIO 1032u

/* ---- sources ------------------------------------------------------------- */

enum ndm__src_kind { NDM__SRC_MEM, NDM__SRC_FD, NDM__SRC_GZ_FD, NDM__SRC_GZ_MEM };

/* Bytes read in order from a file or a buffer, gzip-decoded when the data
 * starts with the gzip magic and the caller allows it. */
typedef struct ndm__src {
    enum ndm__src_kind kind;
    const char *name;       /* path or "<buffer>", for messages */
    const uint8_t *mem;     /* NDM__SRC_MEM, NDM__SRC_GZ_MEM */
    uint64_t size;          /* bytes of the file or buffer (compressed size for gzip) */
    uint64_t pos;           /* decoded bytes consumed so far */
    int fd;
    void *gz;               /* gzFile */
    void *zs;               /* z_stream for a gzip buffer */
    bool zend;
} ndm__src;

ndm_status ndm__src_open_file(ndm__src *s, const char *path, bool gzip, const char *api,
                              ndm__site where);
ndm_status ndm__src_open_mem(ndm__src *s, const void *data, size_t len, bool gzip,
                             const char *api, ndm__site where);
void ndm__src_close(ndm__src *s);

static inline bool ndm__src_is_gzip(const ndm__src *s)
{
    return s->kind == NDM__SRC_GZ_FD || s->kind == NDM__SRC_GZ_MEM;
}

/* The most decoded bytes that can still come: exact for plain sources, the
 * deflate bound for gzip. */
uint64_t ndm__src_bound(const ndm__src *s);

/* Read up to n bytes; *got < n only at the end of the data. A read error or
 * a corrupt gzip stream is an error (NDM_E_IO / NDM_E_FORMAT). */
ndm_status ndm__src_read(ndm__src *s, void *dst, size_t n, size_t *got, const char *api,
                         ndm__site where);
/* Read exactly n bytes; fewer is NDM_E_FORMAT naming `what`. */
ndm_status ndm__src_read_exact(ndm__src *s, void *dst, size_t n, const char *what,
                               const char *api, ndm__site where);
/* NDM_E_FORMAT when bytes remain after the data. */
ndm_status ndm__src_expect_end(ndm__src *s, const char *api, ndm__site where);

/* ---- temporaries ------------------------------------------------------------ */

/* Host memory a loader holds while it reads (decoded text, long fields,
 * staging), taken from the CPU caching allocator rather than malloc: it
 * counts against the CPU's memory_limit_mb and shows in its statistics and
 * history (tagged with the loader's manager), and a request over the limit
 * fails with NDM_E_OOM before any memory is used. */
typedef struct ndm__tmp {
    ndm__block blk;
} ndm__tmp;

/* Size t to n bytes (the first call, or a growth keeping its first `keep`
 * bytes). On failure t is unchanged and the error names `what`. */
ndm_status ndm__tmp_resize(ndm__tmp *t, ndm_manager m, size_t n, size_t keep, const char *what,
                           const char *api, ndm__site where);
void ndm__tmp_free(ndm__tmp *t);

/* All the decoded bytes of s into t (growing, with room for one byte more),
 * their count in *len. A gzip source grows the buffer as it inflates, so a
 * decompression bomb stops at the memory limit, not at its decoded size. */
ndm_status ndm__src_read_all(ndm__src *s, ndm__tmp *t, size_t *len, ndm_manager m,
                             const char *api, ndm__site where);

/* ---- byte order ------------------------------------------------------------ */

static inline bool ndm__host_little_endian(void)
{
    const uint16_t one = 1;
    return *(const uint8_t *)&one == 1;
}

/* Reverse the bytes of each of the n items of `size` bytes at p. */
void ndm__swap_bytes(void *p, size_t n, size_t size);

static inline uint32_t ndm__load_be32(const uint8_t *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}
static inline uint64_t ndm__load_le64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}
static inline uint32_t ndm__load_le32(const uint8_t *p)
{
    return (uint32_t)p[3] << 24 | (uint32_t)p[2] << 16 | (uint32_t)p[1] << 8 | p[0];
}

/* ---- arrays ---------------------------------------------------------------- */

/* Fill the fresh contiguous array of view v with its nbytes read from s; items are
 * byte-swapped when `swap` and bools are normalised to 0/1. Device arrays go
 * through a bounded host buffer. */
ndm_status ndm__io_fill_array(const ndm__view *v, ndm__src *s, bool swap, const char *what,
                              const char *api, ndm__site where);
/* The same from memory. */
ndm_status ndm__io_fill_array_mem(const ndm__view *v, const void *src, bool swap,
                                  const char *api, ndm__site where);

/* Write the elements of v's array in C order, little-endian. A CPU array that is
 * contiguous is written in place; others go through a bounded host buffer. */
ndm_status ndm__io_write_array(FILE *f, const ndm__view *v, const char *path, const char *api,
                               ndm__site where);

/* ---- files ----------------------------------------------------------------- */

/* How a stat mode reads in a message: "a FIFO", "a directory", ... */
const char *ndm__file_kind(unsigned mode);

/* Open `path` for reading, refusing anything that is not a regular file
 * (a FIFO, a device, a directory, a socket) at once with NDM_E_IO naming
 * what it is; a FIFO never blocks the call. Returns the descriptor, with
 * the file's size in *size, or a negative status. Every file ndm reads is
 * opened here. */
int ndm__open_regular(const char *path, uint64_t *size, const char *api, ndm__site where);

/* A file written beside its destination and renamed over it on commit, so a
 * failed save never leaves a half-written file at `path`. A destination
 * that exists and is not a regular file is refused at open and again at
 * commit (NDM_E_IO naming what it is), so a save never changes the kind of
 * what is at the path; through a symbolic link the file it names is
 * replaced and the link kept. */
typedef struct ndm__out_file {
    FILE *f;
    const char *path;
    char *tmp;
    char *dest; /* the file a link at `path` names, or NULL */
} ndm__out_file;

ndm_status ndm__out_open(ndm__out_file *o, const char *path, const char *api, ndm__site where);
ndm_status ndm__out_write(ndm__out_file *o, const void *p, size_t n, const char *api,
                          ndm__site where);
ndm_status ndm__out_commit(ndm__out_file *o, const char *api, ndm__site where);
void ndm__out_abort(ndm__out_file *o);

/* NDM_E_IO for errno `err` on `path` while doing `what`. */
ndm_status ndm__io_errno(int err, const char *path, const char *what, const char *api,
                         ndm__site where);

/* Resolve a loader's manager (factories: given, else the innermost scope). */
static inline ndm_manager ndm__io_manager(ndm_manager m, const char *api, ndm__site where)
{
    return ndm__factory_manager(m, api, where);
}

/* One array read from an open source into manager m. */
typedef ndm_array (*ndm__load_fn)(ndm__site site, const char *api, ndm_manager m, ndm__src *s);

/* A single-array loader's frame: resolve the manager, open the file at
 * `path` (or the buffer), read with `load`, close. */
ndm_array ndm__io_load_file(ndm__site site, const char *api, ndm_manager m, const char *path,
                            bool gzip, ndm__load_fn load);
ndm_array ndm__io_load_mem(ndm__site site, const char *api, ndm_manager m, const void *data,
                           size_t len, bool gzip, ndm__load_fn load);

#endif
