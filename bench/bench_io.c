/* File formats and the loader against plain system calls and zlib doing the
 * same work: safetensors and .npy loads against read(), mapped loads against
 * mmap, IDX gzip against gzread, CSV against a strtod loop, saves against
 * write(), and the loader's epoch against a hand-written gather. Each figure
 * and its anchors are sampled turn about; ratios are medians of pairs. */
#include <fcntl.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "bench.h"
#include "ndm/ndm.h"

static char dir[512];

static void die(const char *what)
{
    fprintf(stderr, "bench_io: %s: %s\n", what, ndm_last_error());
    exit(1);
}

static uint64_t rng(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static size_t file_size(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 ? (size_t)st.st_size : 0;
}

/* The anchor for loads: read() the whole file into one buffer. */
static double read_file_s(const char *path, void *buf, size_t n)
{
    double t = bench_now();
    int fd = open(path, O_RDONLY);
    size_t done = 0;
    while (done < n) {
        ssize_t k = read(fd, (char *)buf + done, n - done);
        if (k <= 0)
            break;
        done += (size_t)k;
    }
    close(fd);
    return bench_now() - t;
}

/* The same into memory malloc'd for the occasion, as a loader written by
 * hand would do: the page faults are part of the cost. */
static double read_fresh_s(const char *path, size_t n)
{
    double t = bench_now();
    void *buf = malloc(n);
    read_file_s(path, buf, n);
    free(buf);
    return bench_now() - t;
}

/* A GB/s figure from times sampled turn about with its anchor's. */
static void add_rate(bench_report *r, const char *name, const char *unit, const char *anchor,
                     double bytes, const double *fig_t, const double *anchor_t, int n)
{
    bench_add_paired_rate(r, name, unit, 1e-9, anchor, bytes, fig_t, bytes, anchor_t, n);
}

int main(int argc, char **argv)
{
    bench_opts o = bench_parse(argc, argv);
    bench_report rep = {.o = o};
    const int reps = o.quick ? 3 : 7;
    if (!bench_tempdir(dir, sizeof dir, "io"))
        die("mkdtemp");
    ndm_manager m = ndm_manager_new(ndm_system(), "bench");
    char path[600], note[256];
    double a[16], b[16], c[16];

    /* ---- safetensors: 8 tensors of f32, 64 MiB in all (8 MiB quick) ---- */
    int64_t rows = o.quick ? 256 : 2048;
    ndm_array arrs[8];
    const char *names[8] = {"t0", "t1", "t2", "t3", "t4", "t5", "t6", "t7"};
    for (int i = 0; i < 8; i++) {
        arrs[i] = ndm_full(m, NDM_F32, (double)i, NDM_SHAPE(rows, 1024));
        if (!arrs[i].id)
            die("full");
    }
    ndm_named_arrays set = {8, names, arrs, 0, NULL, NULL};
    snprintf(path, sizeof path, "%s/w.safetensors", dir);
    /* a first save gives the anchor its bytes */
    if (ndm_safetensors_save(path, &set) != NDM_OK)
        die("save");
    size_t fsz = file_size(path);
    char *buf = malloc(fsz);
    read_file_s(path, buf, fsz);
    char p2[600];
    snprintf(p2, sizeof p2, "%s/anchor.bin", dir);
    for (int r = 0; r < reps; r++) {
        double t0 = bench_now();
        if (ndm_safetensors_save(path, &set) != NDM_OK)
            die("save");
        a[r] = bench_now() - t0;
        /* Like a save over an earlier checkpoint, the old data goes first. */
        t0 = bench_now();
        int fd = open(p2, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        size_t done = 0;
        while (done < fsz) {
            ssize_t k = write(fd, buf + done, fsz - done);
            if (k <= 0)
                break;
            done += (size_t)k;
        }
        close(fd);
        b[r] = bench_now() - t0;
    }
    unlink(p2);
    add_rate(&rep, "safetensors_save_GBps", "GB/s", "write() of the same bytes over an older file",
             (double)fsz, a, b, reps);

    for (int r = 0; r < reps; r++) {
        b[r] = read_file_s(path, buf, fsz);
        c[r] = read_fresh_s(path, fsz);
        ndm_manager lm = ndm_manager_new(m, "load");
        double t0 = bench_now();
        const ndm_named_arrays *got = ndm_safetensors_load(lm, path, NDM_LOAD_COPY);
        a[r] = bench_now() - t0;
        if (!got)
            die("load");
        if (ndm_manager_close(lm) != NDM_OK)
            die("close");
    }
    add_rate(&rep, "safetensors_load_copy_GBps", "GB/s", "read() into a fresh malloc'd buffer",
             (double)fsz, a, c, reps);
    add_rate(&rep, "safetensors_load_copy_vs_warm_buffer", "GB/s",
             "read() into a buffer already faulted in", (double)fsz, a, b, reps);

    for (int r = 0; r < reps; r++) {
        double t0 = bench_now();
        int fd = open(path, O_RDONLY);
        void *p = mmap(NULL, fsz, PROT_READ, MAP_SHARED, fd, 0);
        close(fd);
        munmap(p, fsz);
        b[r] = bench_now() - t0;
        ndm_manager lm = ndm_manager_new(m, "map");
        t0 = bench_now();
        const ndm_named_arrays *got = ndm_safetensors_load(lm, path, NDM_LOAD_MMAP);
        if (!got || ndm_manager_close(lm) != NDM_OK)
            die("mmap load");
        a[r] = bench_now() - t0;
    }
    bench_add_paired_time(&rep, "safetensors_load_mmap_us", "us", 1e6,
                          "open+mmap+munmap of the file", a, b, reps);
    unlink(path);

    /* ---- .npy: one f32 array of the same size ---- */
    ndm_array big = ndm_full(m, NDM_F32, 0.25, NDM_SHAPE(8 * rows, 1024));
    snprintf(path, sizeof path, "%s/a.npy", dir);
    if (ndm_npy_save(path, big) != NDM_OK)
        die("npy save");
    fsz = file_size(path);
    for (int r = 0; r < reps; r++) {
        c[r] = read_fresh_s(path, fsz);
        double t0 = bench_now();
        ndm_array x = ndm_npy_load(m, path);
        a[r] = bench_now() - t0;
        if (!x.id || ndm_array_release(x) != NDM_OK)
            die("npy load");
    }
    add_rate(&rep, "npy_load_GBps", "GB/s", "read() into a fresh malloc'd buffer", (double)fsz, a,
             c, reps);
    unlink(path);
    (void)!ndm_array_release(big);
    for (int i = 0; i < 8; i++)
        (void)!ndm_array_release(arrs[i]);
    free(buf);

    /* ---- IDX gzip: Fashion-MNIST's training images when installed ---- */
    const char *fm = getenv("NDM_FASHION_MNIST_DIR");
    snprintf(path, sizeof path, "%s/train-images-idx3-ubyte.gz",
             fm ? fm : "/usr/share/datasets/fashion-mnist");
    if (access(path, R_OK) != 0) {
        /* A synthetic stand-in: 60000 noisy 28x28 images. */
        snprintf(path, sizeof path, "%s/images.idx.gz", dir);
        gzFile g = gzopen(path, "wb6");
        uint8_t hdr[16] = {0, 0, 8, 3, 0, 0, 0xea, 0x60, 0, 0, 0, 28, 0, 0, 0, 28};
        gzwrite(g, hdr, 16);
        uint64_t s = 1;
        uint8_t img[784];
        for (int i = 0; i < 60000; i++) {
            for (int j = 0; j < 784; j++)
                img[j] = (j % 28 > 6 && j % 28 < 22) ? (uint8_t)(rng(&s) & 0xff) : 0;
            gzwrite(g, img, 784);
        }
        gzclose(g);
        bench_note(&rep, "idx: synthetic 60000x28x28 images (Fashion-MNIST not installed)");
    } else {
        bench_note(&rep, "idx: Fashion-MNIST train-images-idx3-ubyte.gz");
    }
    size_t raw = 16 + (size_t)60000 * 784;
    int idx_reps = o.quick ? 3 : 5;
    for (int r = 0; r < idx_reps; r++) {
        double t0 = bench_now();
        uint8_t *dec = malloc(raw);
        gzFile g = gzopen(path, "rb");
        gzbuffer(g, 256 * 1024);
        int got = gzread(g, dec, (unsigned)raw);
        gzclose(g);
        free(dec);
        b[r] = bench_now() - t0;
        if (got != (int)raw)
            die("gzread");
        t0 = bench_now();
        ndm_array x = ndm_idx_load(m, path);
        a[r] = bench_now() - t0;
        if (!x.id || ndm_array_release(x) != NDM_OK)
            die("idx load");
    }
    bench_add_paired_rate(&rep, "idx_gzip_load_MBps", "MB/s", 1e-6,
                          "gzread of the same file into a fresh buffer", (double)raw, a,
                          (double)raw, b, idx_reps);
    if (!strncmp(path, dir, strlen(dir)))
        unlink(path);

    /* ---- CSV: 8 columns of decimals ---- */
    int64_t crow = o.quick ? 20000 : 200000;
    size_t cap = (size_t)crow * 8 * 24 + 64, len = 0;
    char *text = malloc(cap);
    uint64_t s = 7;
    for (int64_t i = 0; i < crow; i++)
        for (int j = 0; j < 8; j++)
            len += (size_t)snprintf(text + len, cap - len, "%.6f%c",
                                    (double)(rng(&s) % 2000000) / 1000.0 - 1000.0,
                                    j == 7 ? '\n' : ',');
    double *vals = malloc((size_t)crow * 8 * sizeof *vals);
    for (int r = 0; r < reps; r++) {
        double t0 = bench_now();
        char *p = text, *end;
        for (int64_t i = 0; i < crow * 8; i++) {
            vals[i] = strtod(p, &end);
            p = end + 1;
        }
        b[r] = bench_now() - t0;
        t0 = bench_now();
        ndm_array x = ndm_csv_load_buffer(m, text, len, NDM_F64, NULL);
        a[r] = bench_now() - t0;
        if (!x.id || ndm_array_release(x) != NDM_OK)
            die("csv");
    }
    bench_add_paired_rate(&rep, "csv_load_MBps", "MB/s", 1e-6,
                          "a bare strtod loop over the same text", (double)len, a, (double)len, b,
                          reps);
    free(vals);
    free(text);

    /* ---- the loader: an epoch of 60000 u8 images, batch 64, scaled ---- */
    int64_t n = o.quick ? 10000 : 60000;
    uint8_t *px = malloc((size_t)n * 784);
    uint8_t *lab = malloc((size_t)n);
    for (int64_t i = 0; i < n * 784; i++)
        px[i] = (uint8_t)rng(&s);
    for (int64_t i = 0; i < n; i++)
        lab[i] = (uint8_t)(i % 10);
    ndm_manager data = ndm_manager_new(m, "data");
    ndm_dataset ds = {ndm_from_buffer(data, NDM_U8, px, NDM_SHAPE(n, 28, 28)),
                      ndm_from_buffer(data, NDM_U8, lab, NDM_SHAPE(n))};
    ndm_manager trainer = ndm_manager_new(m, "trainer");
    ndm_loader ld = ndm_loader_new(
        trainer, ds,
        &(ndm_loader_options){.batch_size = 64, .seed = 1,
                              .flags = NDM_LOADER_SHUFFLE | NDM_LOADER_SCALE_INPUTS |
                                       NDM_LOADER_LABELS_I64});
    if (!ld.id)
        die("loader");
    int64_t *order = malloc((size_t)n * sizeof *order);
    float *fx = malloc(64 * 784 * sizeof *fx);
    int64_t *fy = malloc(64 * sizeof *fy);
    volatile float sink = 0;
    for (int r = 0; r < reps; r++) {
        double t0 = bench_now();
        ndm_batch bt;
        int rc;
        while ((rc = ndm_loader_next(ld, &bt)) > 0)
            sink += ((const float *)ndm_array_data(bt.inputs))[0];
        if (rc < 0)
            die("next");
        a[r] = bench_now() - t0;
        /* The anchors: shuffle, then gather and scale into a buffer malloc'd
         * per batch (as ndm does), or into one reused buffer. */
        for (int fresh = 1; fresh >= 0; fresh--) {
        t0 = bench_now();
        uint64_t st = 1 + (uint64_t)r;
        for (int64_t i = 0; i < n; i++)
            order[i] = i;
        for (int64_t i = n - 1; i > 0; i--) {
            int64_t j = (int64_t)(rng(&st) % (uint64_t)(i + 1)), tmp = order[i];
            order[i] = order[j];
            order[j] = tmp;
        }
        for (int64_t first = 0; first < n; first += 64) {
            int64_t cnt = n - first < 64 ? n - first : 64;
            float *bx = fresh ? malloc(64 * 784 * sizeof *bx) : fx;
            int64_t *by = fresh ? malloc(64 * sizeof *by) : fy;
            for (int64_t k = 0; k < cnt; k++) {
                const uint8_t *src = px + order[first + k] * 784;
                for (int j = 0; j < 784; j++)
                    bx[k * 784 + j] = (float)src[j] / 255.0f;
                by[k] = lab[order[first + k]];
            }
            sink += bx[0];
            if (fresh) {
                free(bx);
                free(by);
            }
        }
        (fresh ? c : b)[r] = bench_now() - t0;
        }
    }
    bench_add_paired_rate(&rep, "loader_epoch_examples_per_s", "ex/s", 1,
                          "shuffle + gather + scale, malloc per batch", (double)n, a, (double)n,
                          c, reps);
    bench_add_paired_rate(&rep, "loader_epoch_vs_reused_buffer", "ex/s", 1,
                          "shuffle + gather + scale into one reused buffer", (double)n, a,
                          (double)n, b, reps);
    snprintf(note, sizeof note, "loader: %lld examples of 28x28 u8, batch 64, shuffled, scaled",
             (long long)n);
    bench_note(&rep, note);
    free(order);
    free(fx);
    free(fy);
    free(px);
    free(lab);

    if (ndm_manager_close(m) != NDM_OK)
        die("close");
    rmdir(dir);
    bench_print(&rep);
    return 0;
}
