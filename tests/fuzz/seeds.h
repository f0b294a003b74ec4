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

/* A pickle, opcode by opcode (ndm-memviz's seeds). */
typedef struct seed_pk {
    uint8_t b[2048];
    size_t n;
} seed_pk;

static void pk_raw(seed_pk *k, const void *p, size_t n)
{
    if (k->n + n > sizeof k->b)
        abort();
    memcpy(k->b + k->n, p, n);
    k->n += n;
}

static void pk_u8(seed_pk *k, uint8_t v) { pk_raw(k, &v, 1); }

static void pk_str(seed_pk *k, const char *s) /* SHORT_BINUNICODE */
{
    pk_u8(k, 0x8c);
    pk_u8(k, (uint8_t)strlen(s));
    pk_raw(k, s, strlen(s));
}

static void pk_int(seed_pk *k, uint32_t v) /* BININT1, BININT2 or BININT */
{
    if (v < 256) {
        pk_u8(k, 'K');
        pk_u8(k, (uint8_t)v);
    } else if (v < 65536) {
        uint8_t b[3] = {'M', (uint8_t)v, (uint8_t)(v >> 8)};
        pk_raw(k, b, 3);
    } else {
        uint8_t b[5] = {'J', (uint8_t)v, (uint8_t)(v >> 8), (uint8_t)(v >> 16), (uint8_t)(v >> 24)};
        pk_raw(k, b, 5);
    }
}

/* A PyTorch-shaped snapshot as its pickler writes one: protocol 4, a FRAME,
 * MEMOIZE after each container and string, MARK ... SETITEMS, the frames
 * list shared through BINGET, a tuple, a float, a LONG1. */
static fuzz_seed seed_pickle(bool with_frame)
{
    seed_pk k = {{0}, 0};
    pk_u8(&k, 0x80);
    pk_u8(&k, 4);
    if (with_frame)
        pk_raw(&k, "\x95\0\0\0\0\0\0\0\0", 9); /* FRAME (its length is not checked) */
    pk_raw(&k, "}\x94(", 3); /* the root: memo 0 */
    pk_str(&k, "segments");
    pk_raw(&k, "]\x94(}\x94(", 6); /* memo 1, 2 */
    pk_str(&k, "device");
    pk_int(&k, 0);
    pk_str(&k, "address");
    pk_int(&k, 4096);
    pk_str(&k, "total_size");
    pk_int(&k, 2097152);
    pk_str(&k, "segment_type");
    pk_str(&k, "small");
    pk_str(&k, "segment_pool_id");
    pk_raw(&k, "K\0K\0\x86", 5); /* TUPLE2 */
    pk_str(&k, "is_expandable");
    pk_u8(&k, 0x89); /* NEWFALSE */
    pk_str(&k, "blocks");
    pk_raw(&k, "]\x94(}\x94(", 6);
    pk_str(&k, "size");
    pk_int(&k, 1024);
    pk_str(&k, "requested_size");
    pk_int(&k, 1000);
    pk_str(&k, "state");
    pk_str(&k, "active_allocated");
    pk_str(&k, "frames");
    pk_raw(&k, "]\x94q\x09}(", 6); /* the frames list, memo 9 by BINPUT */
    pk_str(&k, "filename");
    pk_str(&k, "train.py");
    pk_str(&k, "line");
    pk_int(&k, 3);
    pk_str(&k, "name");
    pk_str(&k, "step");
    pk_raw(&k, "ua", 2);
    pk_raw(&k, "u}(", 3);
    pk_str(&k, "size");
    pk_int(&k, 2096128);
    pk_str(&k, "state");
    pk_str(&k, "inactive");
    pk_str(&k, "frames");
    pk_u8(&k, ']');
    pk_raw(&k, "ue", 2); /* the blocks */
    pk_raw(&k, "ue", 2); /* the segment, the segments */
    pk_str(&k, "device_traces");
    pk_raw(&k, "](](}(", 6);
    pk_str(&k, "action");
    pk_str(&k, "segment_alloc");
    pk_str(&k, "addr");
    pk_int(&k, 4096);
    pk_str(&k, "size");
    pk_int(&k, 2097152);
    pk_str(&k, "time_us");
    pk_int(&k, 10);
    pk_str(&k, "frames");
    pk_raw(&k, "h\x09u}(", 5); /* the shared frames */
    pk_str(&k, "action");
    pk_str(&k, "alloc");
    pk_str(&k, "addr");
    pk_int(&k, 4096);
    pk_str(&k, "size");
    pk_int(&k, 1000);
    pk_str(&k, "time_us");
    pk_int(&k, 70000);
    pk_str(&k, "category");
    pk_str(&k, "parameter");
    pk_raw(&k, "u}(", 3);
    pk_str(&k, "action");
    pk_str(&k, "oom");
    pk_str(&k, "device_free");
    pk_int(&k, 5);
    pk_str(&k, "size");
    pk_raw(&k, "\x8a\x06\0\0\0\0\0\x01", 8); /* LONG1: 2^40 */
    pk_str(&k, "time_us");
    pk_int(&k, 70001);
    pk_raw(&k, "ueea", 4);
    pk_str(&k, "allocator_settings");
    pk_u8(&k, '}');
    pk_str(&k, "garbage_collection_threshold");
    pk_raw(&k, "G\x3f\xe0\0\0\0\0\0\0", 9); /* BINFLOAT 0.5 */
    pk_u8(&k, 's');
    pk_raw(&k, "u.", 2);
    return seed_cat(k.b, k.n, NULL, 0);
}

/* ndm_from_dlpack's target: its header (see fuzz_dlpack.c), then the shape
 * and strides as int8 (flags 0) or int64 (flags 1 | 4). */
static fuzz_seed seed_dl(uint8_t flags, int8_t ndim, uint8_t code, uint8_t bits, uint8_t device,
                         uint64_t byte_offset, uint8_t at, const int64_t *shape,
                         const int64_t *strides)
{
    uint8_t b[17 + 2 * 8 * 8] = {flags, (uint8_t)ndim, code, bits, 1, 0, device, 0};
    for (int i = 0; i < 8; i++)
        b[8 + i] = (uint8_t)(byte_offset >> (8 * i));
    b[16] = at;
    size_t n = 17;
    for (int pass = 0; pass < 2; pass++) {
        const int64_t *v = pass ? strides : shape;
        int wide = pass ? flags & 4 : flags & 1;
        for (int i = 0; v && i < ndim && i < 8; i++) {
            if (wide) {
                for (int j = 0; j < 8; j++)
                    b[n++] = (uint8_t)((uint64_t)v[i] >> (8 * j));
            } else {
                b[n++] = (uint8_t)v[i];
            }
        }
    }
    return seed_cat(b, n, NULL, 0);
}

/* Fill out[] with the seeds of `format` ("safetensors", "npy", "idx",
 * "csv", "gzip", "memviz", "dlpack"); returns how many (at most cap). The
 * caller frees each .p. */
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
    } else if (!strcmp(format, "memviz")) {
        static const char json[] =
            "{\"devices\": [\"cpu\", \"cuda:0\"],\n"
            " \"segments\": [{\"device\": \"cpu\", \"address\": 4096, \"total_size\": 2048,\n"
            "   \"segment_type\": \"small\", \"stream\": 0, \"blocks\": [\n"
            "   {\"address\": 4096, \"size\": 1024, \"requested_size\": 1000,\n"
            "    \"state\": \"active_allocated\", \"manager\": \"system/model\",\n"
            "    \"frames\": [{\"filename\": \"train.c\", \"line\": 12, \"name\": \"load\"}]},\n"
            "   {\"size\": 1024, \"state\": \"inactive\"}]}],\n"
            " \"device_traces\": [[\n"
            "   {\"action\": \"segment_alloc\", \"addr\": 4096, \"size\": 2048, \"time_us\": 1},\n"
            "   {\"action\": \"alloc\", \"addr\": 4096, \"size\": 1024, \"time_us\": 2,\n"
            "    \"manager\": \"system/model/trainer/batch-1\"},\n"
            "   {\"action\": \"free_requested\", \"addr\": 4096, \"size\": 1024, \"time_us\": 3},\n"
            "   {\"action\": \"free_completed\", \"addr\": 4096, \"size\": 1024},\n"
            "   {\"action\": \"oom\", \"device_free\": 5, \"size\": 1e3, \"time_us\": 4}],\n"
            "  [{\"action\": \"alloc\", \"addr\": 64, \"size\": 8, \"manager\": \"sys/\\u00e9\\ud83d\\ude00\"}]],\n"
            " \"allocator_settings\": {\"strategy\": \"auto_growth\", \"a\": [null, true, -1.5e-3]}}\n";
        PUT(seed_cat(json, sizeof json - 1, NULL, 0));
        PUT(seed_cat(json, sizeof json - 2, NULL, 0)); /* odd length: compared with itself */
        PUT(seed_pickle(false));
        PUT(seed_pickle(true));
    } else if (!strcmp(format, "dlpack")) {
        PUT(seed_dl(0, 2, 2, 32, 1, 0, 0, (const int64_t[]){2, 3}, NULL));       /* f32 2x3 */
        PUT(seed_dl(0, 2, 2, 32, 1, 16, 0, (const int64_t[]){3, 2},
                    (const int64_t[]){1, 3}));                                    /* transposed */
        PUT(seed_dl(2, 0, 0, 64, 1, 8, 8, NULL, NULL));                          /* i64 scalar */
        PUT(seed_dl(0, 3, 1, 8, 3, 0, 0, (const int64_t[]){2, 0, 4}, NULL));     /* u8 empty */
        PUT(seed_dl(0, 1, 6, 8, 1, 0, 3, (const int64_t[]){5}, (const int64_t[]){2})); /* bool */
        PUT(seed_dl(0, 2, 4, 16, 1, 0, 0, (const int64_t[]){4, 4},
                    (const int64_t[]){0, 1}));                                    /* bf16 broadcast */
        PUT(seed_dl(1 | 4, 2, 2, 16, 1, 32, 0, (const int64_t[]){8, 8},
                    (const int64_t[]){8, 1}));                                    /* f16, int64 dims */
        PUT(seed_dl(0, 1, 2, 32, 2, 0, 0, (const int64_t[]){4}, NULL));          /* a CUDA tensor */
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
