/* ndm file formats: safetensors, .npy, IDX (the MNIST format) and CSV.
 *
 * Loading is a factory: every array a load makes belongs to the manager
 * passed in (NDM_CURRENT_SCOPE means the innermost scope of this thread), and
 * for safetensors so does the list of names and metadata. Nothing is
 * allocated until the whole header has been checked against the size of the
 * file, so a malformed or hostile file gives an error, never an allocation
 * of absurd size; on any failure a load returns the null handle (or NULL)
 * and leaves nothing behind.
 *
 * Errors: NDM_E_IO (open, read or write failed; the message has the
 * system's reason; a path that is not a regular file, such as a FIFO, a
 * device or a directory, is refused at once, naming what it is, and a FIFO
 * never blocks a load), NDM_E_FORMAT (malformed, truncated or inconsistent
 * data; the message says what and where), NDM_E_DTYPE (a type ndm lacks),
 * NDM_E_OVERFLOW (sizes that overflow 64 bits), and the manager's refusals
 * (NDM_E_CLOSED, NDM_E_CAPPED, NDM_E_QUOTA, NDM_E_OOM).
 *
 * Byte order: files are little-endian except IDX (big-endian) and .npy
 * files that say otherwise; arrays are always in host order.
 *
 * Saving writes a temporary file beside the destination and renames it over
 * the destination when complete, so a failed save leaves any previous file
 * intact. A missing destination is created; one that exists must be a
 * regular file, or a symbolic link to one (that file is replaced, the link
 * kept): anything else (a FIFO, a device node, a directory, a socket, a
 * dangling link) is NDM_E_IO naming what it is, and left as it was. Arrays
 * to save may have any strides and live on any device.
 *
 * Thread rules: loads and saves of different files may run on many threads
 * at once. Saving an array while another thread writes it is a caller bug.
 */
#ifndef NDM_IO_H
#define NDM_IO_H

#include "base.h"
#include "dtype.h"
#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- safetensors ------------------------------------------------------------
 *
 * The format: an 8-byte little-endian header length N, a JSON header of N
 * bytes mapping each tensor name to {"dtype", "shape", "data_offsets"} (plus
 * an optional "__metadata__" map of strings), then the data buffer. Offsets
 * are relative to the buffer; the tensors must tile it exactly, without gaps
 * or overlaps. Dtypes F64 F32 F16 BF16 I64 I32 U8 BOOL load as the ndm
 * dtypes of the same names; any other (I8, U16, F8_E4M3, ...) is NDM_E_DTYPE.
 */

/** Named arrays with string metadata: what a safetensors file holds. To
 *  save, fill one in (`arrays` may have any strides or device); a load
 *  returns one whose memory belongs to the load's manager. */
typedef struct ndm_named_arrays {
    size_t count;                   /**< number of arrays */
    const char *const *names;       /**< count names, NUL-terminated UTF-8 */
    const ndm_array *arrays;        /**< count arrays, names[i] naming arrays[i] */
    size_t meta_count;              /**< number of metadata entries */
    const char *const *meta_keys;   /**< meta_count keys */
    const char *const *meta_values; /**< meta_count values, meta_values[i] for meta_keys[i] */
} ndm_named_arrays;

/** How a safetensors file is loaded. */
enum {
    /** Read the data into memory of ndm's allocator (the default). */
    NDM_LOAD_COPY = 0,
    /** Map the file read-only: the arrays share one mapping, which is
     *  unmapped when the last of them dies. Writing to them is a caller bug
     *  (the process gets SIGSEGV); so is truncating the file meanwhile. */
    NDM_LOAD_MMAP = 1,
    /** Map the file copy-on-write: the arrays may be written; writes stay in
     *  this process and never reach the file. */
    NDM_LOAD_MMAP_COW = 2,
};

/** Load a safetensors file into manager `m`. The arrays are in the order of
 *  the file's header; names and metadata are copies owned by `m` (through
 *  ndm_manager_own), so the returned set stays valid until `m` closes, even
 *  when some of its arrays are released earlier. With a mapping, a tensor
 *  whose data is not aligned to its element size in the file is copied
 *  (other tensors still share the mapping); bools are kept as the file has
 *  them, while NDM_LOAD_COPY stores them as 0 or 1. Returns the set, or NULL
 *  on failure: the errors above (NDM_E_IO, NDM_E_FORMAT, NDM_E_DTYPE,
 *  NDM_E_OVERFLOW, m's refusals), NDM_E_INVALID for unknown flags. */
#define ndm_safetensors_load(m, path, flags) ndm_safetensors_load_at(NDM_HERE, (m), (path), (flags))
/** ndm_safetensors_load() with an explicit call site (the macro passes NDM_HERE). */
NDM_API const ndm_named_arrays *ndm_safetensors_load_at(NDM_SITE_PARAMS, ndm_manager m,
                                                        const char *path, unsigned flags);
/** Like ndm_safetensors_load(), from the `len` bytes at `data`, which are
 *  copied. */
#define ndm_safetensors_load_buffer(m, data, len)                               \
    ndm_safetensors_load_buffer_at(NDM_HERE, (m), (data), (len))
/** ndm_safetensors_load_buffer() with an explicit call site (the macro passes NDM_HERE). */
NDM_API const ndm_named_arrays *ndm_safetensors_load_buffer_at(NDM_SITE_PARAMS, ndm_manager m,
                                                               const void *data, size_t len);

/** Save a set. The header lists the arrays in the set's order; the data is
 *  laid out by decreasing element size so that every tensor is aligned to
 *  its element size in the file (what mapping needs). Names must be
 *  distinct, valid UTF-8 and not "__metadata__" (NDM_E_INVALID). */
#define ndm_safetensors_save(path, set) ndm_safetensors_save_at(NDM_HERE, (path), (set))
/** ndm_safetensors_save() with an explicit call site (the macro passes NDM_HERE). */
NDM_API NDM_NODISCARD ndm_status ndm_safetensors_save_at(NDM_SITE_PARAMS, const char *path,
                                                         const ndm_named_arrays *set);

/** The index of the array named `name`, or -1 (with NDM_E_INVALID set)
 *  when there is none. The array itself is set->arrays[index]. */
NDM_API int64_t ndm_named_arrays_find(const ndm_named_arrays *set, const char *name);
/** The metadata value of `key`, or NULL (no error set, never fails) when
 *  absent or when set or key is NULL. The string belongs to the set (for a
 *  loaded set, to its manager). */
NDM_API const char *ndm_named_arrays_meta(const ndm_named_arrays *set, const char *key);

/* ---- .npy ----------------------------------------------------------------------
 *
 * numpy's format, versions 1.0, 2.0 and 3.0, little- or big-endian, C or
 * Fortran order; descrs f8 f4 f2 i8 i4 u1 b1. numpy has no bfloat16: ndm
 * writes bf16 as the two-byte void descr '<V2' and reads two-byte voids
 * ('<V2', '|V2'; '>V2' byte-swapped) back as bf16.
 */

/** Load a .npy file into `m` as a C-ordered array. Data after the array is
 *  ignored (several arrays may be saved one after another in one file).
 *  Returns a new array owned by `m`, or the null handle: the errors above
 *  (NDM_E_IO, NDM_E_FORMAT, NDM_E_DTYPE, NDM_E_OVERFLOW, m's refusals). */
#define ndm_npy_load(m, path) ndm_npy_load_at(NDM_HERE, (m), (path))
/** ndm_npy_load() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_array ndm_npy_load_at(NDM_SITE_PARAMS, ndm_manager m, const char *path);
/** ndm_npy_load() from the `len` bytes at `data`. */
#define ndm_npy_load_buffer(m, data, len) ndm_npy_load_buffer_at(NDM_HERE, (m), (data), (len))
/** ndm_npy_load_buffer() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_array ndm_npy_load_buffer_at(NDM_SITE_PARAMS, ndm_manager m, const void *data,
                                         size_t len);
/** Save `a` as .npy: version 1.0 (2.0 when the header needs it),
 *  little-endian, C order, header padded to 64 bytes as numpy does. NDM_OK,
 *  or an error above (NDM_E_IO, or the handle's: NDM_E_NULL, NDM_E_CLOSED)
 *  with any previous file left intact. */
#define ndm_npy_save(path, a) ndm_npy_save_at(NDM_HERE, (path), (a))
/** ndm_npy_save() with an explicit call site (the macro passes NDM_HERE). */
NDM_API NDM_NODISCARD ndm_status ndm_npy_save_at(NDM_SITE_PARAMS, const char *path, ndm_array a);

/* ---- IDX ------------------------------------------------------------------------
 *
 * The MNIST format: two zero bytes, a type code, a rank, the sizes as
 * big-endian 32-bit integers, then the data, big-endian. Types u8 (0x08),
 * i32 (0x0C), f32 (0x0D) and f64 (0x0E) load as those dtypes; i8 and i16
 * are NDM_E_DTYPE. Files and buffers compressed with gzip (.gz) are
 * recognised by their magic bytes and decoded with zlib.
 */

/** Load an IDX file, plain or gzip, into `m`: returns a new array owned by
 *  `m`, or the null handle: the errors above (NDM_E_IO, NDM_E_FORMAT,
 *  NDM_E_DTYPE, NDM_E_OVERFLOW, m's refusals). */
#define ndm_idx_load(m, path) ndm_idx_load_at(NDM_HERE, (m), (path))
/** ndm_idx_load() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_array ndm_idx_load_at(NDM_SITE_PARAMS, ndm_manager m, const char *path);
/** ndm_idx_load() from the `len` bytes at `data` (plain or gzip). */
#define ndm_idx_load_buffer(m, data, len) ndm_idx_load_buffer_at(NDM_HERE, (m), (data), (len))
/** ndm_idx_load_buffer() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_array ndm_idx_load_buffer_at(NDM_SITE_PARAMS, ndm_manager m, const void *data,
                                         size_t len);

/* ---- CSV ----------------------------------------------------------------------- */

/** How CSV text is read; a zeroed struct (or NULL) means comma-separated,
 *  no header row. */
typedef struct ndm_csv_options {
    char delimiter; /**< 0: ',' */
    bool header;    /**< the first row holds column names: skip it */
} ndm_csv_options;

/** Load CSV numbers into a 2-D array [rows, columns] of `dtype`. Fields may
 *  have spaces around them and double quotes; rows end with `\n` or `\r\n`;
 *  blank lines are skipped. Numbers are read in the C locale whatever the
 *  process's locale. An empty field is NaN for float dtypes and an error
 *  for the others. Integer dtypes take integers, or decimals with an
 *  integral value ("3.0"); bool takes 0, 1, true and false. A row with a
 *  different number of fields, text that is not a number, or a value out of
 *  the dtype's range is NDM_E_FORMAT, naming the line and column. No rows
 *  give shape [0, columns of the header] (or [0, 0]). Returns a new array
 *  owned by `m`, or the null handle: NDM_E_FORMAT, or the errors above
 *  (as for ndm_npy_load()). A gzip file is
 *  decoded; the text is held while it is parsed, in the CPU allocator's
 *  memory: it counts against the CPU's memory_limit_mb, so a file whose
 *  text would pass the limit (a decompression bomb) is NDM_E_OOM once its
 *  decoded bytes reach it, not after. A field quoted in a message shows
 *  control bytes escaped (`\r`, `\0`, `\xNN`). The options come last, so a
 *  compound literal can be passed:
 *      ndm_csv_load(m, "x.csv", NDM_F32, &(ndm_csv_options){.header = true}) */
#define ndm_csv_load(m, path, dtype, ...)                                       \
    ndm_csv_load_at(NDM_HERE, (m), (path), (dtype), __VA_ARGS__)
/** ndm_csv_load() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_array ndm_csv_load_at(NDM_SITE_PARAMS, ndm_manager m, const char *path,
                                  ndm_dtype dtype, const ndm_csv_options *opts);
/** ndm_csv_load() from the `len` bytes of text at `text`. */
#define ndm_csv_load_buffer(m, text, len, dtype, ...)                           \
    ndm_csv_load_buffer_at(NDM_HERE, (m), (text), (len), (dtype), __VA_ARGS__)
/** ndm_csv_load_buffer() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_array ndm_csv_load_buffer_at(NDM_SITE_PARAMS, ndm_manager m, const char *text,
                                         size_t len, ndm_dtype dtype,
                                         const ndm_csv_options *opts);

#ifdef __cplusplus
}
#endif

#endif
