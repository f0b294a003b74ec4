/* Shared by the fuzz targets: the driver that runs a load on a buffer and
 * through a file, and the checks that abort on any outcome a malformed input
 * must not produce (a status other than a clean refusal, an empty message,
 * arrays left behind). */
#ifndef NDM_FUZZ_COMMON_H
#define NDM_FUZZ_COMMON_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "ndm/ndm.h"

/* Keeps the reads of fuzz_consume from being optimised away. */
static volatile unsigned fuzz_sink;

static void fuzz_die(const char *what)
{
    fprintf(stderr, "fuzz invariant broken: %s (last error %s: %s)\n", what,
            ndm_status_name(ndm_last_status()), ndm_last_error());
    abort();
}

static uint64_t fuzz_live(ndm_manager m)
{
    ndm_stats st;
    if (ndm_manager_stats(m, NDM_CPU, NDM_STATS_SUBTREE, &st) != NDM_OK)
        fuzz_die("stats");
    return st.live_arrays;
}

/* Set by a target whose inputs may expand past the memory limit: there a
 * refusal for memory (NDM_E_OOM) is clean too. */
static bool fuzz_oom_allowed;

/* A failed load: a clean status with a message, and nothing left in m. */
static void fuzz_failed(ndm_manager m)
{
    ndm_status st = ndm_last_status();
    if (st != NDM_E_FORMAT && st != NDM_E_DTYPE && st != NDM_E_OVERFLOW &&
        !(fuzz_oom_allowed && st == NDM_E_OOM))
        fuzz_die("a malformed input gave an unexpected status");
    if (!ndm_last_error()[0])
        fuzz_die("a failure without a message");
    if (fuzz_live(m))
        fuzz_die("a failed load left arrays behind");
}

/* Read every byte of a loaded array, so a view past its data is caught by
 * the sanitizers; then release it. */
static void fuzz_consume(ndm_array a)
{
    if (!ndm_array_valid(a))
        fuzz_die("a loaded array is not valid");
    size_t n = ndm_array_nbytes(a);
    unsigned char *buf = malloc(n ? n : 1);
    if (!buf)
        fuzz_die("malloc");
    if (ndm_array_copy_out(a, buf, n) != NDM_OK)
        fuzz_die("copy_out of a loaded array");
    unsigned sum = 0;
    for (size_t i = 0; i < n; i++)
        sum += buf[i];
    fuzz_sink = sum;
    free(buf);
    if (ndm_array_release(a) != NDM_OK)
        fuzz_die("release of a loaded array");
}

/* The input as a file: a memory file reached through /proc, so the file
 * paths (reads, gzip, mappings) run without touching the disk. Returns the
 * descriptor (to close) or -1 when the system has no memory files. */
static int fuzz_file(const uint8_t *data, size_t size, char *path, size_t n)
{
#ifdef __linux__
    int fd = memfd_create("ndm-fuzz", MFD_CLOEXEC);
    if (fd < 0)
        return -1;
    size_t done = 0;
    while (done < size) {
        ssize_t k = write(fd, data + done, size - done);
        if (k <= 0) {
            close(fd);
            return -1;
        }
        done += (size_t)k;
    }
    snprintf(path, n, "/proc/self/fd/%d", fd);
    return fd;
#else
    (void)data, (void)size, (void)path, (void)n;
    return -1;
#endif
}

static ndm_manager fuzz_manager(void)
{
    ndm_manager m = ndm_manager_new(ndm_system(), "fuzz");
    if (!m.id)
        fuzz_die("manager");
    return m;
}

static void fuzz_close(ndm_manager m)
{
    if (fuzz_live(m))
        fuzz_die("arrays left in the manager");
    if (ndm_manager_close(m) != NDM_OK)
        fuzz_die("close");
}

/* A loaded array is read whole; a failed load is a clean refusal. */
static inline void fuzz_check_array(ndm_manager m, ndm_array a)
{
    if (a.id)
        fuzz_consume(a);
    else
        fuzz_failed(m);
}

/* One load of a target into m and its check: from the buffer (data, size)
 * when path is NULL, else from the file at path in the target's load mode
 * `mode`. ctx is the target's own. */
typedef void (*fuzz_load_fn)(ndm_manager m, const uint8_t *data, size_t size, const char *path,
                             int mode, const void *ctx);

/* The driver of every target: the input loaded from a buffer, then, where
 * the system has memory files, from a file once per mode. */
static inline void fuzz_run(const uint8_t *data, size_t size, int modes, fuzz_load_fn load,
                            const void *ctx)
{
    ndm_manager m = fuzz_manager();
    ndm_clear_error();
    load(m, data, size, NULL, 0, ctx);
    char path[64];
    int fd = fuzz_file(data, size, path, sizeof path);
    if (fd >= 0) {
        for (int i = 0; i < modes; i++) {
            ndm_clear_error();
            load(m, NULL, 0, path, i, ctx);
        }
        close(fd);
    }
    fuzz_close(m);
}

#endif
