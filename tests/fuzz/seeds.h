/* Valid inputs for every parser, written byte by byte from the formats'
 * specifications (not by ndm's savers): the fuzzers' seed corpus and the
 * starting points of the unit test's mutations. */
#ifndef NDM_FUZZ_SEEDS_H
#define NDM_FUZZ_SEEDS_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

typedef struct fuzz_seed {
    uint8_t *p;
    size_t n;
} fuzz_seed;

static fuzz_seed seed_cat(const void *a, size_t an, const void *b, size_t bn)
{
    fuzz_seed s = {malloc(an + bn + 1), an + bn};
    if (!s.p)
        abort();
    if (an)
        memcpy(s.p, a, an);
    if (bn)
        memcpy(s.p + an, b, bn);
    return s;
}

/* safetensors: length, header padded with spaces to 8 bytes, data. */
static fuzz_seed seed_st(const char *json, const void *data, size_t dn)
{
    size_t hn = strlen(json), padded = (hn + 7) / 8 * 8;
    uint8_t *h = malloc(8 + padded);
    if (!h)
        abort();
    for (int i = 0; i < 8; i++)
        h[i] = (uint8_t)((uint64_t)padded >> (8 * i));
    memcpy(h + 8, json, hn);
    memset(h + 8 + hn, ' ', padded - hn);
    fuzz_seed s = seed_cat(h, 8 + padded, data, dn);
    free(h);
    return s;
}

/* .npy: magic, version, length, the dict padded to 64 bytes with '\n'. */
static fuzz_seed seed_npy(int major, const char *dict, const void *data, size_t dn)
{
    size_t pre = major == 1 ? 10 : 12, dn_ = strlen(dict);
    size_t total = (pre + dn_ + 1 + 63) / 64 * 64, hl = total - pre;
    uint8_t *h = malloc(total);
    if (!h)
        abort();
    memcpy(h, "\x93NUMPY", 6);
    h[6] = (uint8_t)major;
    h[7] = 0;
    for (size_t i = 0; i < pre - 8; i++)
        h[8 + i] = (uint8_t)(hl >> (8 * i));
    memcpy(h + pre, dict, dn_);
    memset(h + pre + dn_, ' ', hl - dn_ - 1);
    h[total - 1] = '\n';
    fuzz_seed s = seed_cat(h, total, data, dn);
    free(h);
    return s;
}

/* IDX: magic, big-endian sizes, data (already big-endian). */
static fuzz_seed seed_idx(uint8_t type, int ndim, const uint32_t *dims, const void *data, size_t dn)
{
    uint8_t h[4 + 4 * 8] = {0, 0, type, (uint8_t)ndim};
    for (int i = 0; i < ndim; i++) {
        h[4 + 4 * i] = (uint8_t)(dims[i] >> 24);
        h[5 + 4 * i] = (uint8_t)(dims[i] >> 16);
        h[6 + 4 * i] = (uint8_t)(dims[i] >> 8);
        h[7 + 4 * i] = (uint8_t)dims[i];
    }
    return seed_cat(h, 4 + 4 * (size_t)ndim, data, dn);
}

/* gzip framing around a deflate stream, in memory. */
static fuzz_seed seed_gzip(fuzz_seed in)
{
    z_stream zs;
    memset(&zs, 0, sizeof zs);
    if (deflateInit2(&zs, 9, Z_DEFLATED, 16 + MAX_WBITS, 8, Z_DEFAULT_STRATEGY) != Z_OK)
        abort();
    size_t cap = deflateBound(&zs, (uLong)in.n) + 32;
    fuzz_seed out = {malloc(cap), 0};
    if (!out.p)
        abort();
    zs.next_in = in.p;
    zs.avail_in = (uInt)in.n;
    zs.next_out = out.p;
    zs.avail_out = (uInt)cap;
    if (deflate(&zs, Z_FINISH) != Z_STREAM_END)
        abort();
    out.n = cap - zs.avail_out;
    deflateEnd(&zs);
    free(in.p);
    return out;
}

/* A gzip stream without its first two bytes (the magic). */
static fuzz_seed seed_unmagic(fuzz_seed in)
{
    fuzz_seed out = seed_cat(in.p + 2, in.n - 2, NULL, 0);
    free(in.p);
    return out;
}

static fuzz_seed seed_text(uint8_t opts, const char *text)
{
    return seed_cat(&opts, 1, text, strlen(text));
}

/* Fill out[] with the seeds of `format` ("safetensors", "npy", "idx",
 * "csv", "gzip"); returns how many (at most cap). The caller frees each .p. */
static size_t fuzz_seeds(const char *format, fuzz_seed *out, size_t cap)
{
    size_t n = 0;
#define PUT(x)                                                                  \
    do {                                                                        \
        fuzz_seed s_ = (x);                                                     \
        if (n < cap)                                                            \
            out[n++] = s_;                                                      \
        else                                                                    \
            free(s_.p);                                                         \
    } while (0)
    if (!strcmp(format, "safetensors")) {
        static const uint8_t d1[40] = {0, 0, 0x80, 0x3f, 0, 0, 0, 0x40, 0, 0, 0x40, 0x40, 0, 0,
                                       0x80, 0x40, 7, 0, 0, 0, 0, 0, 0, 0, 0xf9, 0xff, 0xff,
                                       0xff, 0xff, 0xff, 0xff, 0xff, 1, 0, 0, 0, 0, 0, 0, 0};
        PUT(seed_st("{\"__metadata__\":{\"format\":\"pt\"},"
                    "\"w\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,16]},"
                    "\"b\":{\"dtype\":\"I64\",\"shape\":[3],\"data_offsets\":[16,40]}}",
                    d1, sizeof d1));
        uint8_t d2[8 + 4 + 4 + 2 + 2 + 1 + 1 + 6];
        for (size_t i = 0; i < sizeof d2; i++)
            d2[i] = (uint8_t)(i * 37 + 1);
        d2[21] = 1; /* the BOOL */
        PUT(seed_st("{\"a\":{\"dtype\":\"F64\",\"shape\":[],\"data_offsets\":[0,8]},"
                    "\"e\":{\"dtype\":\"F32\",\"shape\":[0,3],\"data_offsets\":[8,8]},"
                    "\"c\":{\"dtype\":\"I32\",\"shape\":[1],\"data_offsets\":[8,12]},"
                    "\"d\":{\"dtype\":\"F32\",\"shape\":[1,1],\"data_offsets\":[12,16]},"
                    "\"h\":{\"dtype\":\"F16\",\"shape\":[1],\"data_offsets\":[16,18]},"
                    "\"g\":{\"dtype\":\"BF16\",\"shape\":[1,1,1],\"data_offsets\":[18,20]},"
                    "\"u\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[20,21]},"
                    "\"k\":{\"dtype\":\"BOOL\",\"shape\":[1],\"data_offsets\":[21,22]},"
                    "\"z\":{\"dtype\":\"U8\",\"shape\":[1,2,1,3],\"data_offsets\":[22,28]}}",
                    d2, sizeof d2));
        PUT(seed_st("{}", NULL, 0));
        PUT(seed_st("{\"__metadata__\":{\"k\\u00e9y\":\"v\\n\\\"q\\\"\"},"
                    "\"x\":{\"dtype\":\"U8\",\"shape\":[3],\"data_offsets\":[0,3],"
                    "\"extra\":[1,{\"a\":null}]}}",
                    "abc", 3));
    } else if (!strcmp(format, "npy")) {
        static const uint8_t f4[24] = {0, 0, 0x80, 0x3f, 0, 0, 0, 0x40, 0, 0, 0x40, 0x40,
                                       0, 0, 0x80, 0x40, 0, 0, 0xa0, 0x40, 0, 0, 0xc0, 0x40};
        PUT(seed_npy(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", f4, 24));
        PUT(seed_npy(1, "{'descr': '<f4', 'fortran_order': True, 'shape': (2, 3), }", f4, 24));
        static const uint8_t i8[24] = {0, 0, 0, 0, 0, 0, 0, 1, 0xff, 0xff, 0xff, 0xff,
                                       0xff, 0xff, 0xff, 0xfe, 0x7f, 0, 0, 0, 0, 0, 0, 0};
        PUT(seed_npy(2, "{'descr': '>i8', 'fortran_order': False, 'shape': (3,), }", i8, 24));
        PUT(seed_npy(3, "{'descr': '|b1', 'fortran_order': False, 'shape': (), }", "\1", 1));
        PUT(seed_npy(1, "{'shape': (2L, 1L), 'fortran_order': False, 'descr': '<V2'}", f4, 4));
        PUT(seed_npy(1, "{'descr': '|u1', 'fortran_order': False, 'shape': (0, 5), }", NULL, 0));
        PUT(seed_npy(1, "{'descr': '<f2', 'fortran_order': False, 'shape': (1, 1, 2, 1), }", f4,
                     4));
    } else if (!strcmp(format, "idx")) {
        uint8_t img[3 * 2 * 2];
        for (size_t i = 0; i < sizeof img; i++)
            img[i] = (uint8_t)(i * 20);
        PUT(seed_idx(0x08, 3, (const uint32_t[]){3, 2, 2}, img, sizeof img));
        PUT(seed_idx(0x08, 1, (const uint32_t[]){5}, "\1\2\3\4\5", 5));
        static const uint8_t be32[16] = {0, 0, 0, 1, 0xff, 0xff, 0xff, 0xfe,
                                         0x3f, 0x80, 0, 0, 0x7f, 0xff, 0xff, 0xff};
        PUT(seed_idx(0x0C, 2, (const uint32_t[]){2, 2}, be32, 16));
        PUT(seed_idx(0x0D, 1, (const uint32_t[]){2}, be32 + 8, 8));
        PUT(seed_idx(0x0E, 1, (const uint32_t[]){2}, be32, 16));
        PUT(seed_gzip(seed_idx(0x08, 3, (const uint32_t[]){3, 2, 2}, img, sizeof img)));
        PUT(seed_gzip(seed_idx(0x08, 1, (const uint32_t[]){5}, "\1\2\3\4\5", 5)));
    } else if (!strcmp(format, "gzip")) {
        /* gzip streams without their two magic bytes (the target adds them):
         * IDX and CSV contents, two members, and a stream that expands a
         * thousandfold. */
        uint8_t img[3 * 2 * 2];
        for (size_t i = 0; i < sizeof img; i++)
            img[i] = (uint8_t)(i * 20);
        PUT(seed_unmagic(seed_gzip(seed_idx(0x08, 3, (const uint32_t[]){3, 2, 2}, img,
                                            sizeof img))));
        PUT(seed_unmagic(seed_gzip(seed_cat("1,2,3\n4.5,-6,7e2\n", 17, NULL, 0))));
        fuzz_seed a = seed_gzip(seed_cat("1,2\n", 4, NULL, 0));
        fuzz_seed b = seed_gzip(seed_cat("3,4\n", 4, NULL, 0));
        PUT(seed_unmagic(seed_cat(a.p, a.n, b.p, b.n)));
        free(a.p);
        free(b.p);
        uint8_t *zeros = calloc(1, 1 << 20);
        if (!zeros)
            abort();
        PUT(seed_unmagic(seed_gzip(seed_cat(zeros, 1 << 20, NULL, 0))));
        free(zeros);
    } else if (!strcmp(format, "csv")) {
        PUT(seed_text(NDM_F32, "1,2,3\n4.5,-6,7e2\n"));
        PUT(seed_text(NDM_I64 | 8, "a,b\n1,2\n3,4\r\n"));
        PUT(seed_text(NDM_BOOL | 16, "true;0\n1;False\n"));
        PUT(seed_text(NDM_F64, " \"1.5\" , 2 \n\n3,  nan\n,inf\n"));
        PUT(seed_text(NDM_U8 | 32, "1\t2\t255\n0\t3.0\t1e2\n"));
        PUT(seed_text(NDM_F16 | 8 | 48, "\"x y\" z\n0.5 -2\n"));
        PUT(seed_text(NDM_I32, "-2147483648,2147483647\n"));
        PUT(seed_text(NDM_BF16, "\xEF\xBB\xBF" "1.25,-0\n"));
    }
#undef PUT
    return n;
}

#endif
