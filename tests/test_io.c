/* File formats: safetensors, .npy, IDX and CSV round trips, files written
 * byte by byte from the specifications, malformed inputs with their
 * statuses and messages, Fashion-MNIST, and the fuzz targets run over a
 * corpus and thousands of mutations. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <inttypes.h>
#include <locale.h>
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

#include "helpers.h"
#include "manager/alloc/alloc.h"

/* The fuzz targets' entry points, compiled into this suite under their own
 * names so the plain and sanitizer builds run every parser's target. */
#include "fuzz/seeds.h"
#define LLVMFuzzerTestOneInput fuzz_entry_safetensors
#include "fuzz/fuzz_safetensors.c"
#undef LLVMFuzzerTestOneInput
#define LLVMFuzzerTestOneInput fuzz_entry_npy
#include "fuzz/fuzz_npy.c"
#undef LLVMFuzzerTestOneInput
#define LLVMFuzzerTestOneInput fuzz_entry_idx
#include "fuzz/fuzz_idx.c"
#undef LLVMFuzzerTestOneInput
#define LLVMFuzzerTestOneInput fuzz_entry_csv
#include "fuzz/fuzz_csv.c"
#undef LLVMFuzzerTestOneInput
#define NDM_FUZZ_IN_SUITE
#define LLVMFuzzerTestOneInput fuzz_entry_gzip
#include "fuzz/fuzz_gzip.c"
#undef LLVMFuzzerTestOneInput

/* ---- helpers ------------------------------------------------------------------- */

static char tmpdir[512];

static void tpath(char *buf, size_t n, const char *name)
{
    snprintf(buf, n, "%s/%s", tmpdir, name);
}

static uint8_t *read_all(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *p = malloc((size_t)len + 1);
    assert_non_null(p);
    assert_int_equal(fread(p, 1, (size_t)len, f), (size_t)len);
    fclose(f);
    *n = (size_t)len;
    return p;
}

static void write_all(const char *path, const void *p, size_t n)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(p, 1, n, f), n);
    assert_int_equal(fclose(f), 0);
}

static uint64_t rng_next(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* An array of random bit patterns (bools 0/1), NaN payloads included. */
static ndm_array random_array(ndm_manager m, ndm_dtype dt, int ndim, const int64_t *shape,
                              uint64_t seed)
{
    int64_t numel = 1;
    for (int i = 0; i < ndim; i++)
        numel *= shape[i];
    size_t nb = (size_t)numel * ndm_dtype_size(dt);
    uint8_t *buf = malloc(nb + 1);
    assert_non_null(buf);
    for (size_t i = 0; i < nb; i++)
        buf[i] = dt == NDM_BOOL ? (uint8_t)(rng_next(&seed) & 1) : (uint8_t)rng_next(&seed);
    ndm_array a = ndm_from_buffer(m, dt, buf, ndim, shape);
    free(buf);
    assert_live(a);
    return a;
}

static uint8_t *bytes_of(ndm_array a, size_t *n)
{
    *n = ndm_array_nbytes(a);
    uint8_t *p = malloc(*n + 1);
    assert_non_null(p);
    assert_ok(ndm_array_copy_out(a, p, *n));
    return p;
}

/* Same dtype, shape and bytes. */
static void assert_same(ndm_array a, ndm_array b)
{
    assert_int_equal(ndm_array_dtype(a), ndm_array_dtype(b));
    int64_t sa[16], sb[16];
    int na = ndm_array_shape(a, sa, 16), nb = ndm_array_shape(b, sb, 16);
    assert_int_equal(na, nb);
    for (int i = 0; i < na; i++)
        assert_int_equal(sa[i], sb[i]);
    size_t xa, xb;
    uint8_t *pa = bytes_of(a, &xa), *pb = bytes_of(b, &xb);
    assert_int_equal(xa, xb);
    assert_memory_equal(pa, pb, xa);
    free(pa);
    free(pb);
}

static void release(ndm_array a) { assert_ok(ndm_array_release(a)); }

static uint64_t live_arrays(ndm_manager m) { return test_live_arrays(m); }

static uint64_t peak_bytes(ndm_manager m)
{
    ndm_stats st;
    assert_ok(ndm_manager_stats(m, NDM_CPU, NDM_STATS_SUBTREE, &st));
    return st.peak_bytes;
}

static int count_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    if (!d)
        return -1;
    int n = 0;
    while (readdir(d))
        n++;
    closedir(d);
    return n;
}

static bool mapped(const char *path)
{
    size_t n;
    FILE *f = fopen("/proc/self/maps", "r");
    if (!f)
        return false;
    char line[1024];
    bool found = false;
    while (fgets(line, sizeof line, f))
        if (strstr(line, path))
            found = true;
    fclose(f);
    (void)n;
    return found;
}

/* Every dtype, ranks 0 to 4, empty arrays included. */
static const ndm_dtype all_dtypes[] = {NDM_F64, NDM_F32, NDM_F16, NDM_BF16,
                                       NDM_I64, NDM_I32, NDM_U8,  NDM_BOOL};
static const struct {
    int ndim;
    int64_t shape[4];
} shapes[] = {{0, {0}}, {1, {5}}, {1, {0}}, {2, {2, 3}}, {3, {3, 0, 2}}, {4, {2, 1, 3, 2}}};
#define N_DTYPES 8
#define N_SHAPES 6

/* ---- safetensors ---------------------------------------------------------------- */

static void test_safetensors_roundtrip_every_dtype_and_rank(void **state)
{
    ndm_manager root = ROOT(state);
    ndm_manager src = ndm_manager_new(root, "src");
    ndm_array arrays[N_DTYPES * N_SHAPES];
    char names[N_DTYPES * N_SHAPES][32];
    const char *name_ptrs[N_DTYPES * N_SHAPES];
    size_t n = 0;
    for (int d = 0; d < N_DTYPES; d++)
        for (int s = 0; s < N_SHAPES; s++, n++) {
            arrays[n] = random_array(src, all_dtypes[d], shapes[s].ndim, shapes[s].shape,
                                     n * 7919 + 1);
            snprintf(names[n], sizeof names[n], "%s.%d", ndm_dtype_short(all_dtypes[d]), s);
            name_ptrs[n] = names[n];
        }
    const char *keys[] = {"format", "note"}, *values[] = {"ndm", "caf\xc3\xa9 \"quoted\"\n"};
    ndm_named_arrays set = {n, name_ptrs, arrays, 2, keys, values};
    char path[600];
    tpath(path, sizeof path, "all.safetensors");
    assert_ok(ndm_safetensors_save(path, &set));

    size_t flen;
    uint8_t *file = read_all(path, &flen);
    for (int mode = 0; mode < 4; mode++) {
        ndm_manager m = ndm_manager_new(root, "loaded");
        const ndm_named_arrays *got =
            mode < 3 ? ndm_safetensors_load(m, path, (unsigned)mode)
                     : ndm_safetensors_load_buffer(m, file, flen);
        if (!got)
            fail_msg("mode %d: %s", mode, ndm_last_error());
        assert_int_equal(got->count, n);
        for (size_t i = 0; i < n; i++) {
            assert_string_equal(got->names[i], names[i]); /* the header's order */
            assert_same(got->arrays[i], arrays[i]);
            assert_true(ndm_array_manager(got->arrays[i]).id == m.id);
        }
        assert_int_equal(got->meta_count, 2);
        assert_string_equal(ndm_named_arrays_meta(got, "note"), values[1]);
        assert_string_equal(ndm_named_arrays_meta(got, "format"), "ndm");
        assert_null(ndm_named_arrays_meta(got, "absent"));
        assert_int_equal(ndm_named_arrays_find(got, "u8.3"), 6 * N_SHAPES + 3);
        assert_int_equal(ndm_named_arrays_find(got, "nope"), -1);
        assert_int_equal(ndm_last_status(), NDM_E_INVALID);
        assert_int_equal(live_arrays(m), n);
        assert_ok(ndm_manager_close(m));
    }
    free(file);
    assert_ok(ndm_manager_close(src));
    unlink(path);
}

static void test_safetensors_file_bytes_follow_the_format(void **state)
{
    ndm_manager m = ROOT(state);
    /* u8 first in the list, f64 second: the header keeps this order while
     * the data puts the 8-byte elements first, so both stay aligned. */
    const uint8_t av[3] = {1, 2, 3};
    const double bv[2] = {1.0, -2.0};
    ndm_array a = ndm_from_buffer(m, NDM_U8, av, NDM_SHAPE(3));
    ndm_array b = ndm_from_buffer(m, NDM_F64, bv, NDM_SHAPE(1, 2));
    const char *names[] = {"a", "b\"q"};
    const char *keys[] = {"k"}, *values[] = {"v"};
    ndm_named_arrays set = {2, names, (ndm_array[]){a, b}, 1, keys, values};
    char path[600];
    tpath(path, sizeof path, "bytes.safetensors");
    assert_ok(ndm_safetensors_save(path, &set));
    size_t n;
    uint8_t *f = read_all(path, &n);
    const char *json = "{\"__metadata__\":{\"k\":\"v\"},"
                       "\"a\":{\"dtype\":\"U8\",\"shape\":[3],\"data_offsets\":[16,19]},"
                       "\"b\\\"q\":{\"dtype\":\"F64\",\"shape\":[1,2],\"data_offsets\":[0,16]}}";
    size_t jn = strlen(json), hn = (jn + 7) / 8 * 8;
    assert_int_equal(n, 8 + hn + 19);
    uint64_t len = 0;
    for (int i = 7; i >= 0; i--)
        len = len << 8 | f[i];
    assert_int_equal(len, hn);
    assert_memory_equal(f + 8, json, jn);
    for (size_t i = jn; i < hn; i++)
        assert_int_equal(f[8 + i], ' ');
    const double d[2] = {1.0, -2.0};
    assert_memory_equal(f + 8 + hn, d, 16); /* little-endian host */
    assert_memory_equal(f + 8 + hn + 16, "\1\2\3", 3);
    free(f);
    release(a);
    release(b);
    unlink(path);
}

static void test_safetensors_loads_a_handmade_file(void **state)
{
    ndm_manager m = ROOT(state);
    fuzz_seed s[8];
    size_t k = fuzz_seeds("safetensors", s, 8);
    assert_true(k >= 4);
    const ndm_named_arrays *set = ndm_safetensors_load_buffer(m, s[0].p, s[0].n);
    assert_non_null(set);
    assert_int_equal(set->count, 2);
    assert_string_equal(set->names[0], "w");
    assert_string_equal(set->names[1], "b");
    assert_string_equal(ndm_named_arrays_meta(set, "format"), "pt");
    float w[4];
    assert_ok(ndm_array_copy_out(set->arrays[0], w, sizeof w));
    assert_true(w[0] == 1.0f && w[1] == 2.0f && w[2] == 3.0f && w[3] == 4.0f);
    int64_t b[3];
    assert_ok(ndm_array_copy_out(set->arrays[1], b, sizeof b));
    assert_true(b[0] == 7 && b[1] == -7 && b[2] == 1);
    assert_int_equal(ndm_array_ndim(set->arrays[0]), 2);
    release(set->arrays[0]);
    release(set->arrays[1]);

    /* Escapes in keys and values, unknown fields skipped. */
    set = ndm_safetensors_load_buffer(m, s[3].p, s[3].n);
    assert_non_null(set);
    assert_string_equal(set->meta_keys[0], "k\xc3\xa9y");
    assert_string_equal(set->meta_values[0], "v\n\"q\"");
    assert_int_equal(ndm_array_size(set->arrays[0]), 3);
    release(set->arrays[0]);

    /* Bools other than 0/1 in a copy come out as 1. */
    set = ndm_safetensors_load_buffer(m, s[1].p, s[1].n);
    assert_non_null(set);
    assert_int_equal(set->count, 9);
    int64_t ki = ndm_named_arrays_find(set, "k");
    uint8_t kb;
    assert_ok(ndm_array_copy_out(set->arrays[ki], &kb, 1));
    assert_int_equal(kb, 1);
    assert_int_equal(ndm_array_size(set->arrays[ndm_named_arrays_find(set, "e")]), 0);
    assert_int_equal(ndm_array_ndim(set->arrays[ndm_named_arrays_find(set, "a")]), 0);
    for (size_t i = 0; i < set->count; i++)
        release(set->arrays[i]);
    for (size_t i = 0; i < k; i++)
        free(s[i].p);
}

static void test_safetensors_mmap_shares_one_mapping(void **state)
{
    ndm_manager root = ROOT(state);
    ndm_array x = random_array(root, NDM_F32, NDM_SHAPE(64, 64), 3);
    ndm_array y = random_array(root, NDM_I64, NDM_SHAPE(100), 4);
    ndm_array z = random_array(root, NDM_U8, NDM_SHAPE(7), 5);
    ndm_named_arrays set = {3, (const char *[]){"x", "y", "z"}, (ndm_array[]){x, y, z}, 0, NULL,
                            NULL};
    char path[600];
    tpath(path, sizeof path, "mapped.safetensors");
    assert_ok(ndm_safetensors_save(path, &set));

    ndm_manager m = ndm_manager_new(root, "mapped");
    assert_false(mapped(path));
    const ndm_named_arrays *got = ndm_safetensors_load(m, path, NDM_LOAD_MMAP);
    assert_non_null(got);
    assert_true(mapped(path));
    for (int i = 0; i < 3; i++)
        assert_same(got->arrays[i], set.arrays[i]);
    /* The views sit where the header says, inside one mapping. */
    char *px = ndm_array_data(got->arrays[0]), *py = ndm_array_data(got->arrays[1]);
    assert_int_equal(px - py, 800); /* y (8-byte items) comes first in the data */
    release(got->arrays[0]);
    release(got->arrays[2]);
    assert_true(mapped(path));
    release(got->arrays[1]);
    assert_false(mapped(path)); /* unmapped with its last array */
    assert_string_equal(got->names[2], "z"); /* the names live until m closes */
    ndm_stats st;
    assert_ok(ndm_manager_stats(m, NDM_CPU, 0, &st));
    assert_int_equal(st.resources, 1);
    assert_ok(ndm_manager_close(m));

    /* Copy-on-write: writes stay in memory, the file is untouched. */
    m = ndm_manager_new(root, "cow");
    got = ndm_safetensors_load(m, path, NDM_LOAD_MMAP_COW);
    assert_non_null(got);
    int64_t *w = ndm_array_data(got->arrays[1]);
    w[0] = 12345;
    const ndm_named_arrays *again = ndm_safetensors_load(m, path, NDM_LOAD_COPY);
    assert_non_null(again);
    assert_same(again->arrays[1], y);
    int64_t first;
    assert_ok(ndm_item_i64(ndm_select(got->arrays[1], 0, 0), &first));
    assert_int_equal(first, 12345);
    assert_ok(ndm_manager_close(m)); /* closing releases the select view too */
    assert_false(mapped(path));
    release(x);
    release(y);
    release(z);
    unlink(path);
}

static void test_safetensors_mmap_copies_unaligned_tensors(void **state)
{
    ndm_manager m = ROOT(state);
    /* A header of 8k+1 bytes puts the data at an odd offset: the f32 tensor
     * cannot be viewed in place and is copied, the u8 one is mapped. */
    const char *json = "{\"f\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                       "\"u\":{\"dtype\":\"U8\",\"shape\":[3],\"data_offsets\":[8,11]}}";
    size_t jn = strlen(json), hn = (jn + 7) / 8 * 8 + 1;
    uint8_t file[512];
    memset(file, ' ', sizeof file);
    for (int i = 0; i < 8; i++)
        file[i] = (uint8_t)((uint64_t)hn >> (8 * i));
    memcpy(file + 8, json, jn);
    const float fv[2] = {1.5f, -3.0f};
    memcpy(file + 8 + hn, fv, 8);
    memcpy(file + 8 + hn + 8, "xyz", 3);
    char path[600];
    tpath(path, sizeof path, "unaligned.safetensors");
    write_all(path, file, 8 + hn + 11);
    const ndm_named_arrays *set = ndm_safetensors_load(m, path, NDM_LOAD_MMAP);
    assert_non_null(set);
    float *f = ndm_array_data(set->arrays[0]);
    assert_int_equal((uintptr_t)f % 4, 0);
    assert_true(f[0] == 1.5f && f[1] == -3.0f);
    assert_memory_equal(ndm_array_data(set->arrays[1]), "xyz", 3);
    assert_true(mapped(path));
    release(set->arrays[0]);
    assert_true(mapped(path));
    release(set->arrays[1]);
    assert_false(mapped(path));
    unlink(path);
}

static void test_safetensors_saves_strided_views(void **state)
{
    ndm_manager m = ROOT(state);
    float v[12];
    for (int i = 0; i < 12; i++)
        v[i] = (float)i;
    ndm_array a = ndm_from_buffer(m, NDM_F32, v, NDM_SHAPE(3, 4));
    ndm_array t = ndm_transpose(a);                 /* [4,3], strides (1,4) */
    ndm_array s = ndm_slice(a, 1, 3, NDM_END, -2); /* a[:, 3::-2]: columns 3, 1 */
    assert_live(t);
    assert_live(s);
    char path[600];
    tpath(path, sizeof path, "strided.safetensors");
    ndm_named_arrays set = {2, (const char *[]){"t", "s"}, (ndm_array[]){t, s}, 0, NULL, NULL};
    assert_ok(ndm_safetensors_save(path, &set));
    const ndm_named_arrays *got = ndm_safetensors_load(m, path, NDM_LOAD_COPY);
    assert_non_null(got);
    float tt[12], ss[6];
    assert_ok(ndm_array_copy_out(got->arrays[0], tt, sizeof tt));
    assert_ok(ndm_array_copy_out(got->arrays[1], ss, sizeof ss));
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 3; j++)
            assert_true(tt[i * 3 + j] == v[j * 4 + i]);
    for (int i = 0; i < 3; i++) {
        assert_true(ss[i * 2] == v[i * 4 + 3]);
        assert_true(ss[i * 2 + 1] == v[i * 4 + 1]);
    }
    release(got->arrays[0]);
    release(got->arrays[1]);
    release(s);
    release(t);
    release(a);
    unlink(path);
}

typedef struct bad_case {
    const char *json;   /* the header; NULL: `raw` is the whole file */
    size_t data;        /* bytes of data after the header */
    ndm_status want;
    const char *msg;
    const char *raw;
    size_t raw_n;
} bad_case;

static fuzz_seed st_case(const bad_case *c)
{
    if (!c->json)
        return seed_cat(c->raw, c->raw_n, NULL, 0);
    uint8_t *zero = calloc(1, c->data + 1);
    fuzz_seed s = seed_st(c->json, zero, c->data);
    free(zero);
    return s;
}

#define T(dtype, shape, offs)                                                   \
    "{\"dtype\":\"" dtype "\",\"shape\":" shape ",\"data_offsets\":" offs "}"
/* 80 nested lists, past the parser's depth limit. */
#define DEEP8 "[[[[[[[["
#define DEEP                                                                    \
    DEEP8 DEEP8 DEEP8 DEEP8 DEEP8 DEEP8 DEEP8 DEEP8 DEEP8 DEEP8                 \
    "]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]"

static const bad_case st_bad[] = {
    {NULL, 0, NDM_E_FORMAT, "too short for the 8-byte header length", "\x10\0\0", 3},
    {NULL, 0, NDM_E_FORMAT, "exceeds the 4 bytes that follow", "\x10\0\0\0\0\0\0\0{}  ", 12},
    {NULL, 0, NDM_E_FORMAT, "exceeds the 2 bytes", "\xff\xff\xff\xff\xff\xff\xff\xff{}", 10},
    {NULL, 0, NDM_E_FORMAT, "too short for a JSON object", "\0\0\0\0\0\0\0\0", 8},
    {"[]", 0, NDM_E_FORMAT, "must be a JSON object", NULL, 0},
    {"{\"a\":", 0, NDM_E_FORMAT, "a tensor entry must be an object", NULL, 0},
    {"{\"a\":{}}", 0, NDM_E_FORMAT, "tensor 'a' lacks 'dtype'", NULL, 0},
    {"{\"a\":{\"dtype\":\"F32\",\"shape\":[]}}", 4, NDM_E_FORMAT, "lacks 'data_offsets'", NULL, 0},
    {"{\"a\":" T("I16", "[2]", "[0,4]") "}",
     4, NDM_E_DTYPE, "dtype 'I16', which ndm does not support", NULL, 0},
    {"{\"a\":" T("F8_E4M3", "[2]", "[0,2]") "}", 2, NDM_E_DTYPE, "'F8_E4M3'", NULL, 0},
    {"{\"a\":" T("f32", "[2]", "[0,8]") "}", 8, NDM_E_DTYPE, "'f32'", NULL, 0},
    {"{\"a\":" T("F32", "[-1]", "[0,4]") "}",
     4, NDM_E_FORMAT, "expected a non-negative integer", NULL, 0},
    {"{\"a\":" T("F32", "[1.5]", "[0,4]") "}", 4, NDM_E_FORMAT, "not a fraction", NULL, 0},
    {"{\"a\":" T("F32", "[01]", "[0,4]") "}", 4, NDM_E_FORMAT, "leading zero", NULL, 0},
    {"{\"a\":" T("F32", "[99999999999999999999]", "[0,4]") "}",
     4, NDM_E_OVERFLOW, "does not fit in 63 bits", NULL, 0},
    {"{\"a\":" T("U8", "[4294967296,4294967296,4294967296]", "[0,4]") "}",
     4, NDM_E_OVERFLOW, "element count overflows at axis 1", NULL, 0},
    {"{\"a\":" T("F64", "[2305843009213693952]", "[0,4]") "}",
     4, NDM_E_OVERFLOW, "overflow the byte count", NULL, 0},
    {"{\"a\":" T("F32", "[0,4611686018427387904,4]", "[0,0]") "}",
     0, NDM_E_OVERFLOW, "tensor 'a': the strides overflow at axis 1", NULL, 0},
    {"{\"a\":" T("U8", "[1099511627776]", "[0,1099511627776]") "}",
     4, NDM_E_FORMAT, "beyond the data buffer of 4 bytes", NULL, 0},
    {"{\"a\":" T("F32", "[1]", "[4,0]") "}",
     4, NDM_E_FORMAT, "the end is before the beginning", NULL, 0},
    {"{\"a\":" T("F32", "[1]", "[0,8]") "}", 4, NDM_E_FORMAT, "beyond the data buffer", NULL, 0},
    {"{\"a\":" T("F32", "[2]", "[0,4]") "}",
     4, NDM_E_FORMAT, "is f32[2] (8 bytes) but its data_offsets [0, 4] span 4 bytes", NULL, 0},
    {"{\"a\":" T("F32", "[2]", "[0,8]") ",\"b\":" T("F32", "[1]", "[4,8]") "}",
     8, NDM_E_FORMAT, "overlap", NULL, 0},
    {"{\"a\":" T("F32", "[1]", "[0,4]") ",\"b\":" T("F32", "[1]", "[8,12]") "}",
     12, NDM_E_FORMAT, "bytes [4, 8) of the data buffer belong to no tensor", NULL, 0},
    {"{\"a\":" T("F32", "[1]", "[0,4]") "}",
     8, NDM_E_FORMAT, "the tensors cover 4 bytes but the data buffer has 8", NULL, 0},
    {"{\"a\":" T("F32", "[1]", "[0,4]") ",\"a\":" T("F32", "[1]", "[4,8]") "}",
     8, NDM_E_FORMAT, "tensor 'a' appears twice", NULL, 0},
    {"{\"__metadata__\":{\"k\":\"1\",\"k\":\"2\"}}",
     0, NDM_E_FORMAT, "metadata key 'k' appears twice", NULL, 0},
    {"{\"__metadata__\":{\"k\":1}}",
     0, NDM_E_FORMAT, "the __metadata__ value of 'k' is not a string", NULL, 0},
    {"{\"__metadata__\":{},\"__metadata__\":{}}",
     0, NDM_E_FORMAT, "__metadata__ appears twice", NULL, 0},
    {"{\"__metadata__\":[1]}",
     0, NDM_E_FORMAT, "__metadata__ must be an object of strings", NULL, 0},
    {"{} x", 0, NDM_E_FORMAT, "text after the object", NULL, 0},
    {"{\"a\xff\":1}", 0, NDM_E_FORMAT, "not UTF-8", NULL, 0},
    {"{\"a\xc0\x80\":1}", 0, NDM_E_FORMAT, "not UTF-8", NULL, 0},
    {"{\"\\ud800\":1}", 0, NDM_E_FORMAT, "high surrogate without its low half", NULL, 0},
    {"{\"\\udc00\":1}", 0, NDM_E_FORMAT, "lone low surrogate", NULL, 0},
    {"{\"a\\u0000\":1}", 0, NDM_E_FORMAT, "U+0000", NULL, 0},
    {"{\"a\tb\":1}", 0, NDM_E_FORMAT, "control character", NULL, 0},
    {"{\"a\\q\":1}", 0, NDM_E_FORMAT, "bad escape", NULL, 0},
    {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4,8]}}",
     4, NDM_E_FORMAT, "data_offsets must have two entries", NULL, 0},
    {"{\"a\":{\"dtype\":\"F32\",\"dtype\":\"F32\"}}",
     0, NDM_E_FORMAT, "has 'dtype' twice", NULL, 0},
    {"{\"a\":{\"x\":" DEEP "}}", 0, NDM_E_FORMAT, "nested too deeply", NULL, 0},
    {"{\"a\":{\"x\":tru}}", 0, NDM_E_FORMAT, "unexpected value", NULL, 0},
    {"{\"a\":{\"x\":1e}}", 0, NDM_E_FORMAT, "bad number", NULL, 0},
    {"{\"a\" 1}", 0, NDM_E_FORMAT, "expected ':'", NULL, 0},
    {"{\"a\":" T("F32", "[1]", "[0,4]") "", 4, NDM_E_FORMAT, "expected ',' or '}'", NULL, 0},
    {"{\"unterminated", 0, NDM_E_FORMAT, "unterminated string", NULL, 0},
};

static void test_safetensors_rejects_malformed_files(void **state)
{
    ndm_manager m = ROOT(state);
    char path[600];
    tpath(path, sizeof path, "bad.safetensors");
    for (size_t i = 0; i < sizeof st_bad / sizeof st_bad[0]; i++) {
        fuzz_seed s = st_case(&st_bad[i]);
        for (int via_file = 0; via_file < 2; via_file++) {
            ndm_clear_error();
            const ndm_named_arrays *set;
            if (via_file) {
                write_all(path, s.p, s.n);
                set = ndm_safetensors_load(m, path, via_file == 1 ? NDM_LOAD_COPY : NDM_LOAD_MMAP);
            } else {
                set = ndm_safetensors_load_buffer(m, s.p, s.n);
            }
            if (set || ndm_last_status() != st_bad[i].want ||
                !strstr(ndm_last_error(), st_bad[i].msg))
                fail_msg("case %zu (%s): got %s \"%s\", want %s \"%s\"", i,
                         via_file ? "file" : "buffer", ndm_status_name(ndm_last_status()),
                         ndm_last_error(), ndm_status_name(st_bad[i].want), st_bad[i].msg);
            assert_int_equal(live_arrays(m), 0);
        }
        free(s.p);
    }
    /* Nothing was ever allocated for the absurd sizes. */
    assert_int_equal(peak_bytes(m), 0);
    unlink(path);
}

static void test_safetensors_refusals_leave_nothing(void **state)
{
    ndm_manager root = ROOT(state);
    ndm_array x = random_array(root, NDM_F32, NDM_SHAPE(256), 1);
    ndm_array y = random_array(root, NDM_F32, NDM_SHAPE(256), 2);
    ndm_array z = random_array(root, NDM_F32, NDM_SHAPE(256), 3);
    ndm_named_arrays set = {3, (const char *[]){"x", "y", "z"}, (ndm_array[]){x, y, z}, 0, NULL,
                            NULL};
    char path[600];
    tpath(path, sizeof path, "refuse.safetensors");
    assert_ok(ndm_safetensors_save(path, &set));

    ndm_manager m = ndm_manager_new(root, "target");
    assert_ok(ndm_manager_cap(m, NDM_CAP_ARRAYS));
    assert_null(ndm_safetensors_load(m, path, NDM_LOAD_COPY));
    assert_int_equal(ndm_last_status(), NDM_E_CAPPED);
    assert_ok(ndm_manager_uncap(m, NDM_CAP_ARRAYS));

    assert_ok(ndm_manager_set_limit(m, NDM_CPU, 2 * 1024 + 512));
    assert_null(ndm_safetensors_load(m, path, NDM_LOAD_COPY));
    assert_int_equal(ndm_last_status(), NDM_E_QUOTA);
    assert_int_equal(live_arrays(m), 0);
    assert_ok(ndm_manager_set_limit(m, NDM_CPU, 0));

    ndm__alloc_fail_after(2); /* the second array's storage */
    assert_null(ndm_safetensors_load(m, path, NDM_LOAD_COPY));
    ndm__alloc_fail_after(0);
    assert_int_equal(ndm_last_status(), NDM_E_OOM);
    assert_int_equal(live_arrays(m), 0);
    ndm_stats st;
    assert_ok(ndm_manager_stats(m, NDM_CPU, 0, &st));
    assert_int_equal(st.resources, 0);
    assert_int_equal(st.live_bytes, 0);

    char missing[600];
    tpath(missing, sizeof missing, "missing.safetensors");
    assert_null(ndm_safetensors_load(m, missing, NDM_LOAD_COPY));
    assert_int_equal(ndm_last_status(), NDM_E_IO);
    assert_error_has("cannot open");
    assert_error_has("No such file");
    assert_null(ndm_safetensors_load(m, tmpdir, NDM_LOAD_COPY));
    assert_int_equal(ndm_last_status(), NDM_E_IO);
    assert_error_has("not a regular file");
    assert_null(ndm_safetensors_load(m, path, 7));
    assert_int_equal(ndm_last_status(), NDM_E_INVALID);

    /* NDM_CURRENT_SCOPE: the scope catches the arrays; a null manager is
     * refused even inside it. */
    ndm_clear_error();
    assert_null(ndm_safetensors_load(NDM_NULL_MANAGER, path, NDM_LOAD_COPY));
    assert_int_equal(ndm_last_status(), NDM_E_NULL);
    ndm_clear_error();
    assert_null(ndm_safetensors_load(NDM_CURRENT_SCOPE, path, NDM_LOAD_COPY));
    assert_int_equal(ndm_last_status(), NDM_E_NULL);
    ndm_manager s = ndm_scope_begin(m, "scope");
    ndm_clear_error();
    assert_null(ndm_safetensors_load(NDM_NULL_MANAGER, path, NDM_LOAD_COPY));
    assert_int_equal(ndm_last_status(), NDM_E_NULL);
    const ndm_named_arrays *got = ndm_safetensors_load(NDM_CURRENT_SCOPE, path, NDM_LOAD_COPY);
    assert_non_null(got);
    assert_true(ndm_array_manager(got->arrays[2]).id == s.id);
    assert_ok(ndm_scope_end(s, 0, NULL));
    assert_ok(ndm_manager_close(m));
    release(x);
    release(y);
    release(z);
    unlink(path);
}

static void test_safetensors_save_refuses_bad_sets(void **state)
{
    ndm_manager m = ROOT(state);
    ndm_array a = ndm_zeros(m, NDM_F32, NDM_SHAPE(2));
    ndm_array b = ndm_zeros(m, NDM_F32, NDM_SHAPE(2));
    char path[600];
    tpath(path, sizeof path, "keep.safetensors");
    ndm_named_arrays good = {1, (const char *[]){"a"}, (ndm_array[]){a}, 0, NULL, NULL};
    assert_ok(ndm_safetensors_save(path, &good));
    size_t n0;
    uint8_t *before = read_all(path, &n0);

    ndm_named_arrays dup = {2, (const char *[]){"w", "w"}, (ndm_array[]){a, b}, 0, NULL, NULL};
    assert_int_equal(ndm_safetensors_save(path, &dup), NDM_E_INVALID);
    assert_error_has("array name 'w' appears twice");
    ndm_named_arrays reserved = {1, (const char *[]){"__metadata__"}, (ndm_array[]){a}, 0, NULL,
                                 NULL};
    assert_int_equal(ndm_safetensors_save(path, &reserved), NDM_E_INVALID);
    assert_error_has("reserved");
    ndm_named_arrays utf = {1, (const char *[]){"\xff"}, (ndm_array[]){a}, 0, NULL, NULL};
    assert_int_equal(ndm_safetensors_save(path, &utf), NDM_E_INVALID);
    assert_error_has("not valid UTF-8");
    ndm_named_arrays meta = {1, (const char *[]){"a"}, (ndm_array[]){a}, 1, (const char *[]){"k"},
                             (const char *[]){NULL}};
    assert_int_equal(ndm_safetensors_save(path, &meta), NDM_E_INVALID);
    assert_int_equal(ndm_safetensors_save(path, NULL), NDM_E_INVALID);

    release(b);
    ndm_named_arrays stale = {2, (const char *[]){"a", "b"}, (ndm_array[]){a, b}, 0, NULL, NULL};
    assert_int_equal(ndm_safetensors_save(path, &stale), NDM_E_CLOSED);
    assert_error_has("released at");

    char nodir[600];
    tpath(nodir, sizeof nodir, "no/such/dir.safetensors");
    assert_int_equal(ndm_safetensors_save(nodir, &good), NDM_E_IO);
    assert_error_has("No such file or directory");

    /* The earlier file is intact and no temporary file is left behind. */
    size_t n1;
    uint8_t *after = read_all(path, &n1);
    assert_int_equal(n0, n1);
    assert_memory_equal(before, after, n0);
    free(before);
    free(after);
    DIR *d = opendir(tmpdir);
    struct dirent *e;
    while ((e = readdir(d)))
        if (strstr(e->d_name, ".tmp-"))
            fail_msg("temporary file %s left behind", e->d_name);
    closedir(d);
    release(a);
    unlink(path);
}

/* ---- .npy ----------------------------------------------------------------------------- */

static void test_npy_roundtrip_every_dtype_and_rank(void **state)
{
    ndm_manager m = ROOT(state);
    char path[600];
    tpath(path, sizeof path, "rt.npy");
    for (int d = 0; d < N_DTYPES; d++)
        for (int s = 0; s < N_SHAPES; s++) {
            ndm_array a = random_array(m, all_dtypes[d], shapes[s].ndim, shapes[s].shape,
                                       (uint64_t)(d * 31 + s));
            assert_ok(ndm_npy_save(path, a));
            size_t n;
            uint8_t *f = read_all(path, &n);
            assert_memory_equal(f, "\x93NUMPY\x01\x00", 8);
            size_t hl = f[8] | (size_t)f[9] << 8;
            assert_int_equal((10 + hl) % 64, 0);
            assert_int_equal(f[10 + hl - 1], '\n');
            assert_int_equal(n, 10 + hl + ndm_array_nbytes(a));
            ndm_array b = ndm_npy_load(m, path);
            assert_live(b);
            assert_same(a, b);
            ndm_array c = ndm_npy_load_buffer(m, f, n);
            assert_live(c);
            assert_same(a, c);
            free(f);
            release(a);
            release(b);
            release(c);
        }
    unlink(path);
}

static void test_npy_header_matches_numpy(void **state)
{
    ndm_manager m = ROOT(state);
    char path[600];
    tpath(path, sizeof path, "hdr.npy");
    struct {
        ndm_dtype dt;
        int ndim;
        int64_t shape[2];
        const char *dict;
    } cases[] = {
        {NDM_F32, 2, {2, 3}, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }"},
        {NDM_I64, 1, {5}, "{'descr': '<i8', 'fortran_order': False, 'shape': (5,), }"},
        {NDM_BOOL, 0, {0}, "{'descr': '|b1', 'fortran_order': False, 'shape': (), }"},
        {NDM_U8, 1, {0}, "{'descr': '|u1', 'fortran_order': False, 'shape': (0,), }"},
        {NDM_F16, 1, {1}, "{'descr': '<f2', 'fortran_order': False, 'shape': (1,), }"},
        {NDM_BF16, 1, {1}, "{'descr': '<V2', 'fortran_order': False, 'shape': (1,), }"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        ndm_array a = ndm_zeros(m, cases[i].dt, cases[i].ndim, cases[i].shape);
        assert_ok(ndm_npy_save(path, a));
        size_t n;
        uint8_t *f = read_all(path, &n);
        fuzz_seed want = seed_npy(1, cases[i].dict, NULL, 0);
        assert_true(n >= want.n);
        assert_memory_equal(f, want.p, want.n);
        free(want.p);
        free(f);
        release(a);
    }
    unlink(path);
}

static void test_npy_reads_numpy_variants(void **state)
{
    ndm_manager m = ROOT(state);
    fuzz_seed s[8];
    size_t k = fuzz_seeds("npy", s, 8);
    assert_int_equal(k, 7);
    ndm_array a[7];
    for (size_t i = 0; i < k; i++) {
        a[i] = ndm_npy_load_buffer(m, s[i].p, s[i].n);
        if (!a[i].id)
            fail_msg("seed %zu: %s", i, ndm_last_error());
    }
    float c[6], f[6];
    assert_ok(ndm_array_copy_out(a[0], c, sizeof c));
    assert_ok(ndm_array_copy_out(a[1], f, sizeof f));
    for (int i = 0; i < 6; i++)
        assert_true(c[i] == (float)(i + 1));
    /* Fortran order: element (r, col) is the file's item col * 2 + r. */
    for (int r = 0; r < 2; r++)
        for (int col = 0; col < 3; col++)
            assert_true(f[r * 3 + col] == (float)(col * 2 + r + 1));
    int64_t be[3];
    assert_ok(ndm_array_copy_out(a[2], be, sizeof be));
    assert_true(be[0] == 1 && be[1] == -2 && be[2] == INT64_C(0x7f00000000000000));
    assert_int_equal(ndm_array_dtype(a[3]), NDM_BOOL);
    assert_int_equal(ndm_array_ndim(a[3]), 0);
    assert_int_equal(ndm_array_dtype(a[4]), NDM_BF16);
    uint16_t bf[2];
    assert_ok(ndm_array_copy_out(a[4], bf, sizeof bf));
    assert_true(ndm_bf16_to_f32(bf[1]) == 1.0f); /* the high half of 1.0f */
    assert_int_equal(ndm_array_dim(a[5], 1), 5);
    assert_int_equal(ndm_array_size(a[5]), 0);
    assert_int_equal(ndm_array_ndim(a[6]), 4);
    for (size_t i = 0; i < k; i++) {
        release(a[i]);
        free(s[i].p);
    }
}

static void test_npy_rejects_malformed_files(void **state)
{
    ndm_manager m = ROOT(state);
    struct {
        int major;
        const char *dict;
        size_t data;
        ndm_status want;
        const char *msg;
    } cases[] = {
        {1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", 20, NDM_E_FORMAT,
         "only 20 remain"},
        {1, "{'descr': '<f4', 'fortran_order': False, 'shape': (1099511627776,), }", 0,
         NDM_E_FORMAT, "is truncated: its header describes 4398046511104 bytes"},
        {1,
         "{'descr': '<f4', 'fortran_order': False, "
         "'shape': (4294967296, 4294967296, 4294967296), }",
         0, NDM_E_OVERFLOW, "overflows"},
        {1, "{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999,), }", 0,
         NDM_E_OVERFLOW, "does not fit in 63 bits"},
        /* Found by fuzz_npy: an empty array whose strides overflow. */
        {1,
         "{'descr': '>f2', 'fortran_order': True, "
         "'shape': (2, 2, 2,111111111111111111, 2, 1,1,2,1, 2, 1,1, 0, 2, ), }",
         0, NDM_E_OVERFLOW, "the strides of an empty array overflow at axis 9"},
        {1, "{'descr': '<f4', 'fortran_order': False, 'shape': (-1,), }", 0, NDM_E_FORMAT,
         "expected a size"},
        {1, "{'descr': '<c16', 'fortran_order': False, 'shape': (1,), }", 16, NDM_E_DTYPE,
         "'<c16' has no ndm dtype"},
        {1, "{'descr': '|O', 'fortran_order': False, 'shape': (1,), }", 8, NDM_E_DTYPE, "'|O'"},
        {1, "{'descr': '<i2', 'fortran_order': False, 'shape': (1,), }", 2, NDM_E_DTYPE, "'<i2'"},
        {1, "{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (1,), }", 4,
         NDM_E_DTYPE, "structured"},
        {1, "{'descr': '<f4', 'fortran_order': maybe, 'shape': (1,), }", 4, NDM_E_FORMAT,
         "fortran_order must be True or False"},
        {1, "{'descr': '<f4', 'shape': (1,), }", 4, NDM_E_FORMAT, "no 'fortran_order' key"},
        {1, "{'descr': '<f4', 'fortran_order': False, 'shape': (1,), 'x': 1}", 4, NDM_E_FORMAT,
         "unknown key 'x'"},
        {1, "{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (1,)}", 4,
         NDM_E_FORMAT, "'descr' twice"},
        {1, "{'descr': '<f4' 'fortran_order': False, 'shape': (1,)}", 4, NDM_E_FORMAT,
         "expected ',' or '}'"},
        {1, "{'descr': '<f4, 'fortran_order': False, 'shape': (1,)}", 4, NDM_E_DTYPE,
         "'<f4, ' has no ndm dtype"},
        {1, "{'descr': '<f4', 'fortran_order': False, 'shape': (1,)} junk", 4, NDM_E_FORMAT,
         "text after the dict"},
        {1, "{'descr': '<f4', 'fortran_order': False, 'shape': [1]}", 4, NDM_E_FORMAT,
         "the shape must be a tuple"},
        {1, "('descr', '<f4')", 4, NDM_E_FORMAT, "expected '{'"},
        {1, "{'descr': '<f4', 'fortran_order': False, 'shape': (1 2)}", 4, NDM_E_FORMAT,
         "expected ',' or ')'"},
        {1, "{'descr': 'abcdefghijklmnopqrstuvwxyz', 'fortran_order': False, 'shape': (1,)}", 4,
         NDM_E_DTYPE, "unsupported .npy descr"},
    };
    char path[600];
    tpath(path, sizeof path, "bad.npy");
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        uint8_t *zero = calloc(1, cases[i].data + 1);
        fuzz_seed s = seed_npy(cases[i].major, cases[i].dict, zero, cases[i].data);
        free(zero);
        write_all(path, s.p, s.n);
        for (int via_file = 0; via_file < 2; via_file++) {
            ndm_clear_error();
            ndm_array a = via_file ? ndm_npy_load(m, path) : ndm_npy_load_buffer(m, s.p, s.n);
            if (a.id || ndm_last_status() != cases[i].want ||
                !strstr(ndm_last_error(), cases[i].msg))
                fail_msg("case %zu: got %s \"%s\", want %s \"%s\"", i,
                         ndm_status_name(ndm_last_status()), ndm_last_error(),
                         ndm_status_name(cases[i].want), cases[i].msg);
        }
        free(s.p);
    }
    struct {
        const char *raw;
        size_t n;
        const char *msg;
    } raw[] = {
        {"\x93NUMPX\x01\x00\x00\x00", 10, "not a .npy file"},
        {"\x93NUMPY\x04\x00\x00\x00", 10, "unsupported .npy version 4.0"},
        {"\x93NUMPY\x01\x01\x00\x00", 10, "unsupported .npy version 1.1"},
        {"\x93NUMPY\x01\x00\xff\xff{", 11, "header length 65535 exceeds the 1 bytes left"},
        {"\x93NUMPY\x02\x00\xff\xff\xff\x7f{", 13, "exceeds"},
        {"\x93NUMPY\x02\x00\x01", 9, "is truncated"},
        {"\x93NUM", 5, "is truncated: the .npy preamble needs 10 bytes at offset 0"},
    };
    for (size_t i = 0; i < sizeof raw / sizeof raw[0]; i++) {
        ndm_clear_error();
        assert_false(ndm_npy_load_buffer(m, raw[i].raw, raw[i].n).id);
        assert_int_equal(ndm_last_status(), NDM_E_FORMAT);
        assert_error_has(raw[i].msg);
    }
    assert_int_equal(live_arrays(m), 0);
    assert_int_equal(peak_bytes(m), 0);

    ndm_array a = ndm_zeros(m, NDM_F32, NDM_SHAPE(2));
    char nodir[600];
    tpath(nodir, sizeof nodir, "no/dir/x.npy");
    assert_int_equal(ndm_npy_save(nodir, a), NDM_E_IO);
    release(a);
    assert_int_equal(ndm_npy_save(path, a), NDM_E_CLOSED);
    /* A null array keeps the first error, as every operation does. */
    assert_int_equal(ndm_npy_save(path, NDM_NULL_ARRAY), NDM_E_CLOSED);
    ndm_clear_error();
    assert_int_equal(ndm_npy_save(path, NDM_NULL_ARRAY), NDM_E_NULL);
    unlink(path);
}

static void test_npy_saves_strided_views_in_c_order(void **state)
{
    ndm_manager m = ROOT(state);
    int32_t v[24];
    for (int i = 0; i < 24; i++)
        v[i] = i * 3 - 7;
    ndm_array a = ndm_from_buffer(m, NDM_I32, v, NDM_SHAPE(2, 3, 4));
    ndm_array p = ndm_permute(a, 3, ((const int[]){2, 0, 1})); /* [4,2,3] */
    char path[600];
    tpath(path, sizeof path, "perm.npy");
    assert_ok(ndm_npy_save(path, p));
    ndm_array b = ndm_npy_load(m, path);
    assert_live(b);
    int32_t got[24];
    assert_ok(ndm_array_copy_out(b, got, sizeof got));
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 2; j++)
            for (int k = 0; k < 3; k++)
                assert_int_equal(got[(i * 2 + j) * 3 + k], v[(j * 3 + k) * 4 + i]);
    release(b);
    release(p);
    release(a);
    unlink(path);
}

/* ---- IDX ------------------------------------------------------------------------------- */

static void test_idx_reads_plain_and_gzip(void **state)
{
    ndm_manager m = ROOT(state);
    fuzz_seed s[8];
    size_t k = fuzz_seeds("idx", s, 8);
    assert_int_equal(k, 7);
    char path[600];
    tpath(path, sizeof path, "seed.idx");
    for (size_t i = 0; i < k; i++) {
        write_all(path, s[i].p, s[i].n);
        ndm_array a = ndm_idx_load_buffer(m, s[i].p, s[i].n);
        ndm_array b = ndm_idx_load(m, path);
        if (!a.id || !b.id)
            fail_msg("seed %zu: %s", i, ndm_last_error());
        assert_same(a, b);
        if (i == 0 || i == 5) {
            assert_int_equal(ndm_array_dtype(a), NDM_U8);
            assert_int_equal(ndm_array_ndim(a), 3);
            assert_int_equal(ndm_array_dim(a, 0), 3);
            uint8_t px[12];
            assert_ok(ndm_array_copy_out(a, px, 12));
            for (int j = 0; j < 12; j++)
                assert_int_equal(px[j], j * 20);
        }
        if (i == 2) {
            int32_t v[4];
            assert_ok(ndm_array_copy_out(a, v, sizeof v));
            assert_true(v[0] == 1 && v[1] == -2 && v[2] == 0x3f800000 && v[3] == INT32_MAX);
        }
        if (i == 3) {
            float v[2];
            assert_ok(ndm_array_copy_out(a, v, sizeof v));
            assert_true(v[0] == 1.0f && isnan(v[1]));
        }
        if (i == 4) {
            double v[2];
            assert_ok(ndm_array_copy_out(a, v, sizeof v));
            uint64_t bits;
            memcpy(&bits, &v[0], 8);
            assert_true(bits == UINT64_C(0x00000001fffffffe));
        }
        release(a);
        release(b);
        free(s[i].p);
    }
    unlink(path);
}

static void test_idx_rejects_malformed_files(void **state)
{
    ndm_manager m = ROOT(state);
    struct {
        fuzz_seed s;
        ndm_status want;
        const char *msg;
    } cases[20];
    size_t n = 0;
#define CASE(seed, st, text) (cases[n].s = (seed), cases[n].want = (st), cases[n++].msg = (text))
    CASE(seed_cat("\1\0\x08\1", 4, "\0\0\0\1x", 5), NDM_E_FORMAT, "not an IDX file");
    CASE(seed_cat("\0\0\x07\1", 4, "\0\0\0\1x", 5), NDM_E_FORMAT, "unknown IDX type code 0x07");
    CASE(seed_idx(0x0B, 1, (const uint32_t[]){1}, "ab", 2), NDM_E_DTYPE, "0x0b (i16)");
    CASE(seed_idx(0x09, 1, (const uint32_t[]){1}, "a", 1), NDM_E_DTYPE, "(i8)");
    CASE(seed_cat("\0\0\x08\3\0\0", 6, NULL, 0), NDM_E_FORMAT, "the IDX sizes needs 12 bytes");
    CASE(seed_idx(0x08, 2, (const uint32_t[]){3, 4}, "abcdefghij", 10), NDM_E_FORMAT,
         "describes u8[3,4] (12 bytes) but the file holds at most 10");
    CASE(seed_idx(0x08, 1, (const uint32_t[]){2}, "abc", 3), NDM_E_FORMAT,
         "unexpected bytes after its data");
    CASE(seed_idx(0x08, 3, (const uint32_t[]){0xffffffffu, 0xffffffffu, 0xffffffffu}, NULL, 0),
         NDM_E_OVERFLOW, "element count overflows");
    CASE(seed_idx(0x08, 4, (const uint32_t[]){0, 0xffffffffu, 0xffffffffu, 0xffffffffu}, NULL, 0),
         NDM_E_OVERFLOW, "the strides of an empty array overflow at axis 2");
    CASE(seed_idx(0x0E, 2, (const uint32_t[]){65536, 65536}, "x", 1), NDM_E_FORMAT,
         "holds at most 1 bytes");
    CASE(seed_gzip(seed_idx(0x08, 2, (const uint32_t[]){65536, 65536}, "x", 1)), NDM_E_FORMAT,
         "but the compressed file holds at most");
    CASE(seed_cat("\0\0", 2, NULL, 0), NDM_E_FORMAT, "the IDX magic needs 4 bytes");
    uint8_t hundred[100] = {0};
    fuzz_seed gz = seed_gzip(seed_idx(0x08, 1, (const uint32_t[]){100}, hundred, 100));
    /* Truncated gzip stream (cut inside the deflate data). */
    fuzz_seed big = seed_idx(0x08, 1, (const uint32_t[]){4000}, NULL, 0);
    big.p = realloc(big.p, big.n + 4000);
    for (int i = 0; i < 4000; i++)
        big.p[big.n + (size_t)i] = (uint8_t)(i * 7 ^ i >> 3);
    big.n += 4000;
    fuzz_seed bgz = seed_gzip(big);
    bgz.n /= 2;
    CASE(bgz, NDM_E_FORMAT, "truncated");
    /* Corrupt deflate data. */
    fuzz_seed bad = seed_cat(gz.p, gz.n, NULL, 0);
    memset(bad.p + 10, 0xff, bad.n - 18 > 8 ? 8 : bad.n - 18);
    CASE(bad, NDM_E_FORMAT, "gzip");
    free(gz.p);
#undef CASE
    char path[600];
    tpath(path, sizeof path, "bad.idx");
    for (size_t i = 0; i < n; i++) {
        write_all(path, cases[i].s.p, cases[i].s.n);
        for (int via_file = 0; via_file < 2; via_file++) {
            ndm_clear_error();
            ndm_array a = via_file ? ndm_idx_load(m, path)
                                   : ndm_idx_load_buffer(m, cases[i].s.p, cases[i].s.n);
            if (a.id || ndm_last_status() != cases[i].want ||
                !strstr(ndm_last_error(), cases[i].msg))
                fail_msg("case %zu (%s): got %s \"%s\", want %s \"%s\"", i,
                         via_file ? "file" : "buffer", ndm_status_name(ndm_last_status()),
                         ndm_last_error(), ndm_status_name(cases[i].want), cases[i].msg);
        }
        free(cases[i].s.p);
    }
    assert_int_equal(live_arrays(m), 0);
    unlink(path);
}

/* ---- CSV ------------------------------------------------------------------------------------ */

static void test_csv_reads_numbers_into_2d_arrays(void **state)
{
    ndm_manager m = ROOT(state);
    const char *text = "x,y,z\n1, 2.5 ,-3\r\n\n\"4\",5e-1,  nan\n7,,inf";
    ndm_array a = ndm_csv_load_buffer(m, text, strlen(text), NDM_F64,
                                      &(ndm_csv_options){.header = true});
    assert_live(a);
    assert_int_equal(ndm_array_dim(a, 0), 3);
    assert_int_equal(ndm_array_dim(a, 1), 3);
    double v[9];
    assert_ok(ndm_array_copy_out(a, v, sizeof v));
    const double want[9] = {1, 2.5, -3, 4, 0.5, NAN, 7, NAN, INFINITY};
    for (int i = 0; i < 9; i++)
        assert_true(isnan(want[i]) ? isnan(v[i]) : v[i] == want[i]);
    release(a);

    /* Every dtype, another delimiter, a file. */
    char path[600];
    tpath(path, sizeof path, "d.csv");
    write_all(path, "1;0\n255;3.0\n", 12);
    const struct {
        ndm_dtype dt;
        double v[4];
    } dts[] = {{NDM_U8, {1, 0, 255, 3}},  {NDM_I32, {1, 0, 255, 3}}, {NDM_I64, {1, 0, 255, 3}},
               {NDM_F32, {1, 0, 255, 3}}, {NDM_F16, {1, 0, 255, 3}}, {NDM_BF16, {1, 0, 255, 3}}};
    for (size_t i = 0; i < sizeof dts / sizeof dts[0]; i++) {
        ndm_array b = ndm_csv_load(m, path, dts[i].dt, &(ndm_csv_options){.delimiter = ';'});
        assert_live(b);
        assert_int_equal(ndm_array_dtype(b), dts[i].dt);
        for (int j = 0; j < 4; j++) {
            double x;
            ndm_array e = ndm_select(ndm_reshape(b, NDM_SHAPE(4)), 0, j);
            assert_ok(ndm_item(e, &x));
            assert_true(x == dts[i].v[j]);
        }
        assert_ok(ndm_scope_release_all_but(m, 0, NULL));
    }
    ndm_array bo = ndm_csv_load_buffer(m, "true,0\nFALSE,1", 14, NDM_BOOL, NULL);
    assert_live(bo);
    uint8_t bv[4];
    assert_ok(ndm_array_copy_out(bo, bv, 4));
    assert_true(bv[0] == 1 && bv[1] == 0 && bv[2] == 0 && bv[3] == 1);
    release(bo);

    /* Big integers stay exact; a byte order mark is skipped. */
    const char *big = "\xEF\xBB\xBF" "9007199254740993,-9223372036854775808\n";
    ndm_array i64 = ndm_csv_load_buffer(m, big, strlen(big), NDM_I64, NULL);
    assert_live(i64);
    int64_t iv[2];
    assert_ok(ndm_array_copy_out(i64, iv, sizeof iv));
    assert_true(iv[0] == INT64_C(9007199254740993) && iv[1] == INT64_MIN);
    release(i64);

    /* Long numbers, in the middle of the text and at its very end. */
    char longs[700];
    snprintf(longs, sizeof longs, "%0300d1,2\n3,%0300d4", 0, 0);
    ndm_array lg = ndm_csv_load_buffer(m, longs, strlen(longs), NDM_F64, NULL);
    assert_live(lg);
    double lv[4];
    assert_ok(ndm_array_copy_out(lg, lv, sizeof lv));
    assert_true(lv[0] == 1 && lv[1] == 2 && lv[2] == 3 && lv[3] == 4);
    release(lg);

    /* Empty text and a header alone. */
    ndm_array e0 = ndm_csv_load_buffer(m, "", 0, NDM_F32, NULL);
    assert_live(e0);
    assert_int_equal(ndm_array_dim(e0, 0), 0);
    assert_int_equal(ndm_array_dim(e0, 1), 0);
    ndm_array e1 =
        ndm_csv_load_buffer(m, "a,b,c\n", 6, NDM_F32, &(ndm_csv_options){.header = true});
    assert_live(e1);
    assert_int_equal(ndm_array_dim(e1, 1), 3);
    release(e0);
    release(e1);

    /* A gzip-compressed file. */
    fuzz_seed gz = seed_gzip(seed_cat("1,2\n3,4\n", 8, NULL, 0));
    write_all(path, gz.p, gz.n);
    free(gz.p);
    ndm_array g = ndm_csv_load(m, path, NDM_I32, NULL);
    assert_live(g);
    int32_t gv[4];
    assert_ok(ndm_array_copy_out(g, gv, sizeof gv));
    assert_true(gv[0] == 1 && gv[3] == 4);
    release(g);
    unlink(path);
}

/* `total` bytes made of `unit` repeated, gzip-compressed into the file at
 * path as they are made (the decoded text is never held whole). Returns
 * the compressed size. */
static size_t write_gzip_repeated(const char *path, const char *unit, size_t total)
{
    enum { CHUNK = 1 << 20 };
    size_t un = strlen(unit);
    char *in = malloc(CHUNK), *out = malloc(CHUNK);
    assert_true(in && out && CHUNK % un == 0 && total % CHUNK == 0);
    for (size_t i = 0; i < CHUNK; i += un)
        memcpy(in + i, unit, un);
    z_stream zs;
    memset(&zs, 0, sizeof zs);
    assert_int_equal(deflateInit2(&zs, 9, Z_DEFLATED, 16 + MAX_WBITS, 9, Z_DEFAULT_STRATEGY),
                     Z_OK);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    size_t written = 0;
    for (size_t done = 0; done < total; done += CHUNK) {
        bool last = done + CHUNK == total;
        zs.next_in = (Bytef *)in;
        zs.avail_in = CHUNK;
        int rc;
        do {
            zs.next_out = (Bytef *)out;
            zs.avail_out = CHUNK;
            rc = deflate(&zs, last ? Z_FINISH : Z_NO_FLUSH);
            assert_true(rc == Z_OK || rc == Z_STREAM_END || rc == Z_BUF_ERROR);
            size_t k = CHUNK - zs.avail_out;
            assert_int_equal(fwrite(out, 1, k, f), k);
            written += k;
        } while (zs.avail_out == 0 || (last && rc != Z_STREAM_END));
    }
    deflateEnd(&zs);
    assert_int_equal(fclose(f), 0);
    free(in);
    free(out);
    return written;
}

/* Resident set of this process now, in KiB. */
static long rss_now_kib(void)
{
    FILE *f = fopen("/proc/self/statm", "r");
    long size = 0, resident = 0;
    if (!f)
        return 0;
    if (fscanf(f, "%ld %ld", &size, &resident) != 2)
        resident = 0;
    fclose(f);
    return resident * (sysconf(_SC_PAGESIZE) / 1024);
}

/* What the child that loads a bomb reports. */
typedef struct bomb_report {
    ndm_status status;
    char message[1024];
    int64_t reserved_peak, allocated_before, allocated_after, memory_limit;
    uint64_t live_arrays, live_bytes;
    long rss_start_kib, rss_peak_kib;
} bomb_report;

static void test_csv_gzip_bomb_is_refused_at_the_memory_limit(void **state)
{
    (void)state;
    char path[600];
    tpath(path, sizeof path, "bomb.csv.gz");
    /* 512 MiB of a valid table (32 Mi rows of eight zeros) in about 0.5 MB. */
    const size_t expanded = (size_t)512 << 20;
    size_t packed = write_gzip_repeated(path, "0,0,0,0,0,0,0,0\n", expanded);
    assert_true(packed < expanded / 500);
    /* The load runs in a child: its peak resident set is its own, and the
     * limit set there leaves this suite's allocator as it was. */
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        close(fds[0]);
        bomb_report r;
        memset(&r, 0, sizeof r);
        r.rss_start_kib = rss_now_kib();
        ndm_status st = ndm_alloc_configure(NDM_CPU, "memory_limit_mb:64");
        st = st == NDM_OK ? ndm_memory_reset_peak_stats(NDM_CPU) : st;
        st = st == NDM_OK ? ndm_memory_stat_get(NDM_CPU, "allocated_bytes.all.current",
                                                &r.allocated_before)
                          : st;
        ndm_manager m = ndm_manager_new(ndm_system(), "bomb");
        ndm_array a = ndm_csv_load(m, path, NDM_F32, NULL);
        r.status = a.id ? NDM_OK : ndm_last_status();
        snprintf(r.message, sizeof r.message, "%s", ndm_last_error());
        ndm_stats ms;
        if (st == NDM_OK && ndm_manager_stats(m, NDM_CPU, NDM_STATS_SUBTREE, &ms) == NDM_OK) {
            r.live_arrays = ms.live_arrays;
            r.live_bytes = ms.live_bytes;
        }
        if (ndm_memory_stat_get(NDM_CPU, "reserved_bytes.all.peak", &r.reserved_peak) != NDM_OK ||
            ndm_memory_stat_get(NDM_CPU, "allocated_bytes.all.current", &r.allocated_after) !=
                NDM_OK ||
            ndm_memory_stat_get(NDM_CPU, "memory_limit", &r.memory_limit) != NDM_OK)
            r.memory_limit = -1;
        struct rusage ru;
        getrusage(RUSAGE_SELF, &ru);
        r.rss_peak_kib = ru.ru_maxrss;
        (void)!write(fds[1], &r, sizeof r);
        _exit(st == NDM_OK && ndm_manager_close(m) == NDM_OK ? 0 : 1);
    }
    close(fds[1]);
    bomb_report r;
    size_t got = 0;
    while (got < sizeof r) {
        ssize_t k = read(fds[0], (char *)&r + got, sizeof r - got);
        if (k <= 0)
            break;
        got += (size_t)k;
    }
    close(fds[0]);
    int wst = 0;
    assert_int_equal(waitpid(pid, &wst, 0), pid);
    assert_true(WIFEXITED(wst) && WEXITSTATUS(wst) == 0);
    assert_int_equal(got, sizeof r);
    unlink(path);
    print_message("bomb: %zu bytes packed, %zu expanded; child rss %ld KiB at start, peak %ld KiB;"
                  " allocator reserved peak %" PRId64 " bytes\n",
                  packed, expanded, r.rss_start_kib, r.rss_peak_kib, r.reserved_peak);
    if (r.status != NDM_E_OOM || !strstr(r.message, "bomb.csv.gz") ||
        !strstr(r.message, "decoded bytes") || !strstr(r.message, "limit 64"))
        fail_msg("the bomb gave %s: \"%s\"", ndm_status_name(r.status), r.message);
    assert_int_equal(r.memory_limit, INT64_C(64) << 20);
    assert_true(r.reserved_peak <= r.memory_limit);
    /* Far below the expanded size: the limit, plus the decoder's buffers. */
    assert_true(r.rss_peak_kib - r.rss_start_kib < (long)(expanded / 4 / 1024));
    /* Nothing stays: no array, no temporary. */
    assert_int_equal(r.live_arrays, 0);
    assert_int_equal(r.live_bytes, 0);
    assert_int_equal(r.allocated_after, r.allocated_before);
}

/* The text of a CSV file is held in the allocator's memory while it is
 * parsed, so it counts in the allocator's statistics. */
static void test_csv_text_is_held_in_allocator_memory(void **state)
{
    ndm_manager m = ROOT(state);
    char path[600];
    tpath(path, sizeof path, "long.csv.gz");
    /* 64 bytes of text per f32 (0.1 and 61 zeros): the text dwarfs the array. */
    char one[65];
    memset(one, '0', 63);
    one[1] = '.';
    one[2] = '1';
    one[63] = '\n';
    one[64] = '\0';
    size_t text = (size_t)4 << 20;
    write_gzip_repeated(path, one, text);
    assert_ok(ndm_memory_reset_peak_stats(NDM_CPU));
    int64_t before, peak, after;
    assert_ok(ndm_memory_stat_get(NDM_CPU, "allocated_bytes.all.current", &before));
    ndm_array a = ndm_csv_load(m, path, NDM_F32, NULL);
    assert_live(a);
    assert_int_equal(ndm_array_dim(a, 0), (int64_t)(text / 64));
    assert_int_equal(ndm_array_dim(a, 1), 1);
    assert_ok(ndm_memory_stat_get(NDM_CPU, "allocated_bytes.all.peak", &peak));
    assert_ok(ndm_memory_stat_get(NDM_CPU, "allocated_bytes.all.current", &after));
    /* The text was there at the peak; only the array is left. */
    assert_true(peak - before >= (int64_t)text);
    assert_int_equal(after - before, (int64_t)ndm_array_nbytes(a));
    ndm_array head = ndm_slice(a, 0, 0, 2, 1);
    float v[2];
    assert_ok(ndm_array_copy_out(head, v, sizeof v));
    assert_true(v[0] == 0.1f && v[1] == 0.1f);
    release(head);
    release(a);
    unlink(path);
    assert_manager_empty(m);
}

static void test_csv_rejects_malformed_gzip_with_a_message(void **state)
{
    ndm_manager m = ROOT(state);
    char path[600];
    tpath(path, sizeof path, "bad.csv.gz");
    fuzz_seed gz = seed_gzip(seed_cat("1,2\n3,4\n5,6\n", 12, NULL, 0));
    struct {
        size_t keep;     /* bytes of the stream kept */
        long flip;       /* byte to invert (-1: none; negative from the end) */
        const char *msg;
    } cases[] = {
        {gz.n - 6, -1, "the gzip data is truncated or corrupt"},
        {12, -1, "the gzip data is truncated or corrupt"},
        {gz.n, 2, "corrupt"},
        {gz.n, 12, "corrupt"},
        {gz.n, -8, "incorrect data check"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        uint8_t buf[256];
        memcpy(buf, gz.p, gz.n);
        if (cases[i].flip != -1)
            buf[cases[i].flip >= 0 ? (size_t)cases[i].flip : gz.n + (size_t)cases[i].flip] ^= 0xff;
        write_all(path, buf, cases[i].keep);
        ndm_clear_error();
        ndm_array a = ndm_csv_load(m, path, NDM_F32, NULL);
        if (a.id || ndm_last_status() != NDM_E_FORMAT || !strstr(ndm_last_error(), cases[i].msg) ||
            !strstr(ndm_last_error(), "bad.csv.gz"))
            fail_msg("case %zu: got %s \"%s\", want \"%s\"", i, ndm_status_name(ndm_last_status()),
                     ndm_last_error(), cases[i].msg);
        assert_manager_empty(m);
    }
    free(gz.p);
    unlink(path);
}

/* A field with a carriage return or a NUL is quoted with them escaped, so
 * the message shows them and is not cut at the NUL. */
static void test_csv_messages_escape_control_bytes(void **state)
{
    ndm_manager m = ROOT(state);
    static const struct {
        const char *text;
        size_t len;
        const char *msg;
    } cases[] = {
        {"1,2\r3\n", 6, "line 1, column 2: '2\\r3' is not a number"},
        {"1,2\n4,\0" "5\n", 9, "line 2, column 2: '\\05' is not a number"},
        {"7\x01x\n", 4, "line 1, column 1: '7\\x01x' is not a number"},
        {"\"1\t\r\"\n", 6, "'1\\t\\r' is not a number"},
        {"9\r\r\n", 4, "'9\\r' is not a number"},
        {"1234567890123456789012345678901234567890x\n", 42,
         "'1234567890123456789012345678901234567890...' is not a number"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        ndm_clear_error();
        ndm_array a = ndm_csv_load_buffer(m, cases[i].text, cases[i].len, NDM_F32, NULL);
        if (a.id || ndm_last_status() != NDM_E_FORMAT || !strstr(ndm_last_error(), cases[i].msg))
            fail_msg("case %zu: got %s \"%s\", want \"%s\"", i, ndm_status_name(ndm_last_status()),
                     ndm_last_error(), cases[i].msg);
    }
    /* The same from a file. */
    char path[600];
    tpath(path, sizeof path, "ctl.csv");
    write_all(path, "5,6\r\0\n", 6);
    ndm_clear_error();
    assert_false(ndm_csv_load(m, path, NDM_I32, NULL).id);
    assert_int_equal(ndm_last_status(), NDM_E_FORMAT);
    assert_error_has("'6\\r\\0' is not");
    unlink(path);
    assert_manager_empty(m);
}

static void test_csv_ignores_the_process_locale(void **state)
{
    ndm_manager m = ROOT(state);
    const char *locales[] = {"de_DE.UTF-8", "fr_FR.UTF-8", "de_DE", NULL};
    const char *set = NULL;
    for (int i = 0; locales[i] && !set; i++)
        set = setlocale(LC_NUMERIC, locales[i]);
    if (!set) {
        /* Compile one from the system's locale sources into the temporary
         * directory, where LOCPATH makes setlocale find it. */
        char cmd[1200];
        snprintf(cmd, sizeof cmd,
                 "localedef -i de_DE -f UTF-8 '%s/de_DE.UTF-8' >/dev/null 2>&1", tmpdir);
        if (system(cmd) == 0 && setenv("LOCPATH", tmpdir, 1) == 0)
            set = setlocale(LC_NUMERIC, "de_DE.UTF-8");
        unsetenv("LOCPATH");
    }
    if (!set || strcmp(localeconv()->decimal_point, ",") != 0) {
        setlocale(LC_NUMERIC, "C");
        print_message("skipped: no locale with a decimal comma is installed\n");
        skip();
    }
    ndm_array a = ndm_csv_load_buffer(m, "0.5,1.25\n", 9, NDM_F64, NULL);
    setlocale(LC_NUMERIC, "C");
    assert_live(a);
    double v[2];
    assert_ok(ndm_array_copy_out(a, v, sizeof v));
    assert_true(v[0] == 0.5 && v[1] == 1.25);
    release(a);
}

static void test_csv_rejects_bad_text_with_line_and_column(void **state)
{
    ndm_manager m = ROOT(state);
    struct {
        const char *text;
        ndm_dtype dt;
        const char *msg;
    } cases[] = {
        {"1,2\n3\n", NDM_F32, "line 2 has 1 fields, line 1 has 2"},
        {"1,2\n\n3,4,5\n", NDM_F32, "line 3 has 3 fields, line 1 has 2"},
        {"1,abc\n", NDM_F32, "line 1, column 2: 'abc' is not a number"},
        {"1,2\n3,4x\n", NDM_F64, "line 2, column 2: '4x' is not a number"},
        {"256\n", NDM_U8, "'256' does not fit in u8"},
        {"-1\n", NDM_U8, "'-1' does not fit in u8"},
        {"2147483648\n", NDM_I32, "does not fit in i32"},
        {"9223372036854775808\n", NDM_I64, "is out of range"},
        {"1e300\n", NDM_I64, "is out of range"},
        {"1.5\n", NDM_I32, "'1.5' is not an integer"},
        {"2\n", NDM_BOOL, "does not fit in bool"},
        {"1,\n", NDM_I64, "line 1, column 2: '' is empty"},
        {"\"1,2\n", NDM_F32, "line 1, field 1: unbalanced quotes"},
        {"\"1\"x,2\n", NDM_F32, "unbalanced quotes"},
        {"1,2\n3,4;\n", NDM_F64, "line 2, column 2: '4;' is not a number"},
        {"1,2\n3,4e", NDM_F64, "line 2, column 2: '4e' is not a number"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        ndm_clear_error();
        ndm_array a = ndm_csv_load_buffer(m, cases[i].text, strlen(cases[i].text), cases[i].dt,
                                          NULL);
        if (a.id || ndm_last_status() != NDM_E_FORMAT || !strstr(ndm_last_error(), cases[i].msg))
            fail_msg("case %zu: got %s \"%s\", want \"%s\"", i, ndm_status_name(ndm_last_status()),
                     ndm_last_error(), cases[i].msg);
    }
    assert_false(ndm_csv_load_buffer(m, "1", 1, (ndm_dtype)42, NULL).id);
    assert_int_equal(ndm_last_status(), NDM_E_DTYPE);
    assert_false(ndm_csv_load_buffer(m, "1", 1, NDM_F32, &(ndm_csv_options){.delimiter = '"'}).id);
    assert_int_equal(ndm_last_status(), NDM_E_INVALID);
    char missing[600];
    tpath(missing, sizeof missing, "missing.csv");
    assert_false(ndm_csv_load(m, missing, NDM_F32, NULL).id);
    assert_int_equal(ndm_last_status(), NDM_E_IO);
    assert_int_equal(live_arrays(m), 0);
}

/* ---- Fashion-MNIST ------------------------------------------------------------------------- */

static const char *fmnist_dir(void)
{
    const char *d = getenv("NDM_FASHION_MNIST_DIR");
    return d ? d : "/usr/share/datasets/fashion-mnist";
}

/* The first n decoded bytes of a gzip file, read with zlib alone. */
static void gz_head(const char *path, uint8_t *out, int n)
{
    gzFile g = gzopen(path, "rb");
    assert_non_null(g);
    assert_int_equal(gzread(g, out, (unsigned)n), n);
    gzclose(g);
}

static void test_fashion_mnist_loads_from_the_debian_package(void **state)
{
    ndm_manager m = ROOT(state);
    char img[600], lab[600];
    snprintf(img, sizeof img, "%s/train-images-idx3-ubyte.gz", fmnist_dir());
    snprintf(lab, sizeof lab, "%s/train-labels-idx1-ubyte.gz", fmnist_dir());
    if (access(img, R_OK) != 0) {
        print_message("skipped: %s is absent (install dataset-fashion-mnist)\n", img);
        skip();
    }
    const struct {
        const char *split;
        int64_t n;
    } splits[] = {{"train", 60000}, {"t10k", 10000}};
    for (int s = 0; s < 2; s++) {
        snprintf(img, sizeof img, "%s/%s-images-idx3-ubyte.gz", fmnist_dir(), splits[s].split);
        snprintf(lab, sizeof lab, "%s/%s-labels-idx1-ubyte.gz", fmnist_dir(), splits[s].split);
        ndm_dataset ds;
        assert_ok(ndm_dataset_load_idx(m, img, lab, &ds));
        assert_int_equal(ndm_dataset_size(ds), splits[s].n);
        int64_t shape[3];
        assert_int_equal(ndm_array_shape(ds.inputs, shape, 3), 3);
        assert_true(shape[0] == splits[s].n && shape[1] == 28 && shape[2] == 28);
        assert_int_equal(ndm_array_dtype(ds.inputs), NDM_U8);
        assert_int_equal(ndm_array_ndim(ds.labels), 1);
        const uint8_t *y = ndm_array_data(ds.labels);
        int64_t count[10] = {0};
        for (int64_t i = 0; i < splits[s].n; i++) {
            assert_true(y[i] <= 9);
            count[y[i]]++;
        }
        for (int c = 0; c < 10; c++) /* Fashion-MNIST is balanced */
            assert_int_equal(count[c], splits[s].n / 10);
        /* The first label and image against the files' own bytes. */
        uint8_t lh[9], ih[16 + 784];
        gz_head(lab, lh, 9);
        gz_head(img, ih, 16 + 784);
        assert_int_equal(y[0], lh[8]);
        assert_int_equal(y[0], 9); /* an ankle boot opens both splits */
        assert_memory_equal(ndm_array_data(ds.inputs), ih + 16, 784);
        assert_int_equal(ih[2], 0x08);
        assert_ok(ndm_dataset_release(&ds));
        assert_false(ds.inputs.id);
    }
    /* Mismatched files: images of one split, labels of the other. */
    snprintf(img, sizeof img, "%s/t10k-images-idx3-ubyte.gz", fmnist_dir());
    snprintf(lab, sizeof lab, "%s/train-labels-idx1-ubyte.gz", fmnist_dir());
    ndm_dataset bad;
    assert_int_equal(ndm_dataset_load_idx(m, img, lab, &bad), NDM_E_SHAPE);
    assert_error_has("the first axes differ");
    assert_false(bad.inputs.id);
    assert_int_equal(live_arrays(m), 0);
}

/* ---- the fuzz targets over a corpus and mutations ------------------------------------------ */

typedef int (*fuzz_entry)(const uint8_t *, size_t);

/* One to four random edits: bit flips, interesting bytes, inserts,
 * deletes, truncation, copied chunks, interesting integers. */
static size_t mutate(uint8_t *p, size_t n, size_t cap, uint64_t *r)
{
    static const uint8_t interesting[] = {0,   1,   0x7f, 0x80, 0xff, '0', '9', ',', '"', '[',
                                          ']', '{', '}',  ':',  ' ',  '\n', '-', '.', 'e', '\\'};
    int k = 1 + (int)(rng_next(r) % 4);
    for (int t = 0; t < k; t++) {
        uint64_t x = rng_next(r);
        size_t at = n ? (size_t)(rng_next(r) % n) : 0;
        switch (x % 7) {
        case 0:
            if (n)
                p[at] ^= (uint8_t)(1u << (x >> 8) % 8);
            break;
        case 1:
            if (n)
                p[at] = interesting[(x >> 8) % sizeof interesting];
            break;
        case 2:
            if (n < cap) {
                memmove(p + at + 1, p + at, n - at);
                p[at] = (uint8_t)(x >> 16);
                n++;
            }
            break;
        case 3:
            if (n) {
                size_t len = 1 + (size_t)((x >> 8) % 8);
                if (len > n - at)
                    len = n - at;
                memmove(p + at, p + at + len, n - at - len);
                n -= len;
            }
            break;
        case 4:
            n = n ? (size_t)((x >> 8) % n) : 0;
            break;
        case 5:
            if (n > 1) {
                size_t from = (size_t)((x >> 8) % n), len = 1 + (size_t)((x >> 32) % 16);
                if (len > n - from)
                    len = n - from;
                if (len > n - at)
                    len = n - at;
                memmove(p + at, p + from, len);
            }
            break;
        default:
            if (n >= 4 && at <= n - 4) {
                static const uint32_t vals[] = {0, 1, 0x7fffffff, 0x80000000u, 0xffffffffu,
                                                0x10000, 255, 1000000};
                uint32_t v = vals[(x >> 8) % 8];
                for (int i = 0; i < 4; i++)
                    p[at + (size_t)i] =
                        (uint8_t)(x & (1u << 20) ? v >> (24 - 8 * i) : v >> (8 * i));
            }
            break;
        }
    }
    return n;
}

static void run_corpus(const char *format, fuzz_entry entry, const fuzz_seed *extra,
                       size_t nextra, int mutations)
{
    fuzz_seed seeds[16];
    size_t k = fuzz_seeds(format, seeds, 16);
    assert_true(k > 0);
    /* Each input in an exact-size heap copy, so a read past its end is caught. */
    for (size_t i = 0; i < nextra + k; i++) {
        const fuzz_seed *s = i < nextra ? &extra[i] : &seeds[i - nextra];
        uint8_t *exact = malloc(s->n ? s->n : 1);
        memcpy(exact, s->p, s->n);
        entry(exact, s->n);
        free(exact);
    }
    uint64_t r = 0x5eed0000 + (uint64_t)strlen(format);
    uint8_t *buf = malloc(4096);
    assert_non_null(buf);
    for (int t = 0; t < mutations; t++) {
        const fuzz_seed *s = &seeds[rng_next(&r) % k];
        if (s->n > 4000)
            continue;
        memcpy(buf, s->p, s->n);
        size_t n = mutate(buf, s->n, 4096, &r);
        uint8_t *exact = malloc(n ? n : 1);
        memcpy(exact, buf, n);
        entry(exact, n);
        free(exact);
    }
    free(buf);
    for (size_t i = 0; i < k; i++)
        free(seeds[i].p);
}

static void test_fuzz_targets_survive_corpus_and_mutations(void **state)
{
    (void)state;
    int fds = count_fds();
    /* The seeds must load: mutations start from valid files. */
    ndm_manager m = ndm_manager_new(ROOT(state), "seeds");
    const char *formats[] = {"safetensors", "npy", "idx", "csv"};
    for (int f = 0; f < 4; f++) {
        fuzz_seed s[16];
        size_t k = fuzz_seeds(formats[f], s, 16);
        for (size_t i = 0; i < k; i++) {
            bool ok;
            if (f == 0)
                ok = ndm_safetensors_load_buffer(m, s[i].p, s[i].n) != NULL;
            else if (f == 1)
                ok = ndm_npy_load_buffer(m, s[i].p, s[i].n).id != 0;
            else if (f == 2)
                ok = ndm_idx_load_buffer(m, s[i].p, s[i].n).id != 0;
            else
                ok = ndm_csv_load_buffer(m, (const char *)s[i].p + 1, s[i].n - 1,
                                         (ndm_dtype)(s[i].p[0] & 7),
                                         &(ndm_csv_options){",;\t "[(s[i].p[0] >> 4) & 3],
                                                           (s[i].p[0] >> 3) & 1})
                         .id != 0;
            if (!ok)
                fail_msg("%s seed %zu does not load: %s", formats[f], i, ndm_last_error());
            free(s[i].p);
        }
    }
    assert_ok(ndm_manager_close(m));

    fuzz_seed st_extra[sizeof st_bad / sizeof st_bad[0]];
    for (size_t i = 0; i < sizeof st_bad / sizeof st_bad[0]; i++)
        st_extra[i] = st_case(&st_bad[i]);
    run_corpus("safetensors", fuzz_entry_safetensors, st_extra, sizeof st_bad / sizeof st_bad[0],
               3000);
    for (size_t i = 0; i < sizeof st_bad / sizeof st_bad[0]; i++)
        free(st_extra[i].p);
    run_corpus("npy", fuzz_entry_npy, NULL, 0, 3000);
    run_corpus("idx", fuzz_entry_idx, NULL, 0, 3000);
    /* Inputs the fuzzers found, kept as regressions. */
    const fuzz_seed csv_found[] = {
        {(uint8_t *)"\x8a\x0d\x0a\xcc\x0a\x0d\x0d\x0d", 8}, /* strtoll past a field */
    };
    run_corpus("csv", fuzz_entry_csv, csv_found, 1, 3000);
    run_corpus("gzip", fuzz_entry_gzip, NULL, 0, 3000);
    assert_int_equal(count_fds(), fds); /* no descriptor leaked on any path */
}

/* ---- paths that are not regular files --------------------------------------------- */

/* A loader blocked on a FIFO would hang the suite: the alarm fails it. */
static void blocked_on_open(int sig)
{
    (void)sig;
    static const char msg[] = "a call blocked on a path that is not a regular file\n";
    (void)!write(2, msg, sizeof msg - 1);
    _exit(1);
}

static void guard_hangs(bool on)
{
    signal(SIGALRM, on ? blocked_on_open : SIG_DFL);
    alarm(on ? 60 : 0);
}

/* Every loader refuses `path` at once with NDM_E_IO, naming it as `kind`,
 * and leaves nothing in m. */
static void assert_loaders_refuse(ndm_manager m, const char *path, const char *kind)
{
    char want[700];
    snprintf(want, sizeof want, "'%s' is %s", path, kind);
    const unsigned flags[] = {NDM_LOAD_COPY, NDM_LOAD_MMAP, NDM_LOAD_MMAP_COW};
    for (int i = 0; i < 3; i++) {
        ndm_clear_error();
        assert_null(ndm_safetensors_load(m, path, flags[i]));
        assert_int_equal(ndm_last_status(), NDM_E_IO);
        assert_error_has(want);
    }
    ndm_clear_error();
    assert_int_equal(ndm_npy_load(m, path).id, 0);
    assert_int_equal(ndm_last_status(), NDM_E_IO);
    assert_error_has(want);
    ndm_clear_error();
    assert_int_equal(ndm_idx_load(m, path).id, 0);
    assert_int_equal(ndm_last_status(), NDM_E_IO);
    assert_error_has(want);
    ndm_clear_error();
    assert_int_equal(ndm_csv_load(m, path, NDM_F32, NULL).id, 0);
    assert_int_equal(ndm_last_status(), NDM_E_IO);
    assert_error_has(want);
    assert_int_equal(live_arrays(m), 0);
}

static void test_load_refuses_a_fifo_at_once(void **state)
{
    char fifo[600], link[600], good[600];
    tpath(fifo, sizeof fifo, "loads.fifo");
    tpath(link, sizeof link, "loads-fifo.link");
    tpath(good, sizeof good, "loads-good.idx");
    unlink(fifo);
    unlink(link);
    assert_int_equal(mkfifo(fifo, 0600), 0);
    assert_int_equal(symlink(fifo, link), 0);
    /* labels for the dataset's other half: one u8 */
    write_all(good, "\0\0\x08\x01\0\0\0\x01\x07", 9);
    ndm_manager m = ndm_manager_new(ROOT(state), "loads");
    int fds = count_fds();
    guard_hangs(true);
    assert_loaders_refuse(m, fifo, "a FIFO");
    assert_loaders_refuse(m, link, "a FIFO");
    ndm_dataset d;
    ndm_clear_error();
    assert_int_equal(ndm_dataset_load_idx(m, fifo, good, &d), NDM_E_IO);
    assert_error_has("is a FIFO");
    assert_int_equal(d.inputs.id, 0);
    ndm_clear_error();
    assert_int_equal(ndm_dataset_load_idx(m, good, fifo, &d), NDM_E_IO);
    assert_error_has("is a FIFO");
    assert_int_equal(d.inputs.id, 0);
    guard_hangs(false);
    assert_int_equal(count_fds(), fds);
    struct stat st;
    assert_int_equal(lstat(fifo, &st), 0);
    assert_true(S_ISFIFO(st.st_mode));
    assert_manager_empty(m);
    assert_ok(ndm_manager_close(m));
    unlink(link);
    unlink(fifo);
    unlink(good);
}

static void test_load_refuses_devices_and_directories(void **state)
{
    ndm_manager m = ndm_manager_new(ROOT(state), "loads");
    guard_hangs(true);
    assert_loaders_refuse(m, "/dev/null", "a character device");
    assert_loaders_refuse(m, tmpdir, "a directory");
    /* A socket cannot be opened at all: it is still named for what it is. */
    char sock[600];
    tpath(sock, sizeof sock, "s");
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    if (fd >= 0 && strlen(sock) < sizeof sa.sun_path) {
        memcpy(sa.sun_path, sock, strlen(sock) + 1);
        unlink(sock);
        if (bind(fd, (struct sockaddr *)&sa, sizeof sa) == 0) {
            assert_loaders_refuse(m, sock, "a socket");
            unlink(sock);
        }
    }
    if (fd >= 0)
        close(fd);
    guard_hangs(false);
    assert_manager_empty(m);
    assert_ok(ndm_manager_close(m));
}

/* No temporary of a refused save is left in the directory. */
static void assert_no_temporaries(void)
{
    DIR *d = opendir(tmpdir);
    assert_non_null(d);
    for (struct dirent *e; (e = readdir(d));)
        if (strstr(e->d_name, ".tmp-"))
            fail_msg("a save left '%s' behind", e->d_name);
    closedir(d);
}

/* Both savers refuse `path` with NDM_E_IO naming it as `kind`, and what is
 * there keeps its kind (`type`, as S_IFMT of its mode). */
static void assert_saves_refuse(ndm_array a, const char *path, const char *kind, mode_t type)
{
    char want[700];
    snprintf(want, sizeof want, "'%s': it is %s", path, kind);
    ndm_named_arrays set = {1, (const char *[]){"a"}, (ndm_array[]){a}, 0, NULL, NULL};
    ndm_clear_error();
    assert_status(ndm_safetensors_save(path, &set), NDM_E_IO);
    assert_error_has(want);
    ndm_clear_error();
    assert_status(ndm_npy_save(path, a), NDM_E_IO);
    assert_error_has(want);
    struct stat st;
    assert_int_equal(lstat(path, &st), 0);
    assert_int_equal(st.st_mode & S_IFMT, type);
    assert_no_temporaries();
}

static void test_save_keeps_the_kind_of_what_is_at_the_path(void **state)
{
    ndm_manager m = ndm_manager_new(ROOT(state), "saves");
    ndm_array a = random_array(m, NDM_F32, 1, (int64_t[]){4}, 7);
    char fifo[600], link[600], dangling[600], dev[600];
    tpath(fifo, sizeof fifo, "saves.fifo");
    tpath(link, sizeof link, "saves-fifo.link");
    tpath(dangling, sizeof dangling, "saves-dangling.link");
    tpath(dev, sizeof dev, "saves-full.dev");
    unlink(fifo);
    unlink(link);
    unlink(dangling);
    assert_int_equal(mkfifo(fifo, 0600), 0);
    assert_int_equal(symlink(fifo, link), 0);
    guard_hangs(true);
    assert_saves_refuse(a, fifo, "a FIFO", S_IFIFO);
    assert_saves_refuse(a, tmpdir, "a directory", S_IFDIR);
    assert_saves_refuse(a, link, "a symbolic link to a FIFO", S_IFLNK);
    assert_int_equal(symlink("no-such-file", dangling), 0);
    assert_saves_refuse(a, dangling, "a symbolic link to nothing", S_IFLNK);
    /* A device node of our own with /dev/full's numbers: the real one is
     * never touched. Making one needs root. */
    unlink(dev);
    if (mknod(dev, S_IFCHR | 0600, makedev(1, 7)) == 0) {
        assert_saves_refuse(a, dev, "a character device", S_IFCHR);
        unlink(dev);
    } else {
        print_message("no device node (%s): the device case is skipped\n", strerror(errno));
    }
    guard_hangs(false);
    unlink(link);
    unlink(fifo);
    unlink(dangling);
    release(a);
    assert_manager_empty(m);
    assert_ok(ndm_manager_close(m));
}

static void test_save_through_a_link_replaces_its_file(void **state)
{
    ndm_manager m = ndm_manager_new(ROOT(state), "saves");
    ndm_array a = random_array(m, NDM_F32, 2, (int64_t[]){2, 3}, 11);
    char file[600], link[600], fresh[600];
    tpath(file, sizeof file, "through.npy");
    tpath(link, sizeof link, "through.link");
    tpath(fresh, sizeof fresh, "fresh.npy");
    unlink(link);
    unlink(fresh);
    write_all(file, "old", 3);
    assert_int_equal(symlink("through.npy", link), 0);
    assert_ok(ndm_npy_save(link, a));
    struct stat st;
    assert_int_equal(lstat(link, &st), 0);
    assert_true(S_ISLNK(st.st_mode));
    ndm_array b = ndm_npy_load(m, file);
    assert_live(b);
    assert_same(a, b);
    release(b);
    /* A missing destination is made. */
    assert_ok(ndm_npy_save(fresh, a));
    assert_int_equal(lstat(fresh, &st), 0);
    assert_true(S_ISREG(st.st_mode));
    assert_no_temporaries();
    unlink(link);
    unlink(file);
    unlink(fresh);
    release(a);
    assert_manager_empty(m);
    assert_ok(ndm_manager_close(m));
}

/* ---- setup ---------------------------------------------------------------------------- */

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb, (void)flag, (void)ftw;
    return remove(path);
}

/* A tensor's name comes from the file: its control bytes are escaped in
 * the message, which stays one line of text. */
static void test_safetensors_message_escapes_control_bytes_of_names(void **state)
{
    ndm_manager m = ROOT(state);
    const char header[] = "{\"w\\u0001\\n\\u001b[2J\":{\"dtype\":\"Q9\",\"shape\":[1],"
                          "\"data_offsets\":[0,4]}}";
    size_t hn = sizeof header - 1;
    unsigned char file[256] = {0};
    for (int b = 0; b < 8; b++)
        file[b] = (unsigned char)((uint64_t)hn >> (8 * b));
    memcpy(file + 8, header, hn);
    ndm_clear_error();
    assert_null(ndm_safetensors_load_buffer(m, file, 8 + hn + 4));
    assert_int_equal(ndm_last_status(), NDM_E_DTYPE);
    assert_error_has("tensor 'w\\x01\\x0a\\x1b[2J' has dtype 'Q9'");
    for (const char *p = ndm_last_error(); *p; p++)
        assert_true((unsigned char)*p >= 0x20 && *p != 0x7f);
    assert_int_equal(test_live_arrays(m), 0);
}

int main(void)
{
    const char *t = getenv("TMPDIR");
    snprintf(tmpdir, sizeof tmpdir, "%s/ndm-io-XXXXXX", t && *t ? t : "/tmp");
    if (!mkdtemp(tmpdir)) {
        perror("mkdtemp");
        return 1;
    }
    const struct CMUnitTest tests[] = {
        TEST(test_safetensors_message_escapes_control_bytes_of_names),
        TEST(test_safetensors_roundtrip_every_dtype_and_rank),
        TEST(test_safetensors_file_bytes_follow_the_format),
        TEST(test_safetensors_loads_a_handmade_file),
        TEST(test_safetensors_mmap_shares_one_mapping),
        TEST(test_safetensors_mmap_copies_unaligned_tensors),
        TEST(test_safetensors_saves_strided_views),
        TEST(test_safetensors_rejects_malformed_files),
        TEST(test_safetensors_refusals_leave_nothing),
        TEST(test_safetensors_save_refuses_bad_sets),
        TEST(test_npy_roundtrip_every_dtype_and_rank),
        TEST(test_npy_header_matches_numpy),
        TEST(test_npy_reads_numpy_variants),
        TEST(test_npy_rejects_malformed_files),
        TEST(test_npy_saves_strided_views_in_c_order),
        TEST(test_idx_reads_plain_and_gzip),
        TEST(test_idx_rejects_malformed_files),
        TEST(test_csv_reads_numbers_into_2d_arrays),
        TEST(test_csv_ignores_the_process_locale),
        TEST(test_csv_rejects_bad_text_with_line_and_column),
        TEST(test_csv_gzip_bomb_is_refused_at_the_memory_limit),
        TEST(test_csv_text_is_held_in_allocator_memory),
        TEST(test_csv_rejects_malformed_gzip_with_a_message),
        TEST(test_csv_messages_escape_control_bytes),
        TEST(test_fashion_mnist_loads_from_the_debian_package),
        TEST(test_fuzz_targets_survive_corpus_and_mutations),
        TEST(test_load_refuses_a_fifo_at_once),
        TEST(test_load_refuses_devices_and_directories),
        TEST(test_save_keeps_the_kind_of_what_is_at_the_path),
        TEST(test_save_through_a_link_replaces_its_file),
    };
    int rc = cmocka_run_group_tests_name("io", tests, NULL, NULL);
    nftw(tmpdir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    return rc;
}
