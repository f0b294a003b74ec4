/* libFuzzer target: ndm_from_dlpack on a DLManagedTensor built from the
 * input over a real 4096-byte buffer. The input, read little-endian (bytes
 * past its end read as 0):
 *   0      flags: 1 shape as int64 (else int8), 2 strides NULL, 4 strides as
 *          int64 (else int8), 8 data NULL, 16 shape NULL
 *   1      ndim (int8)
 *   2..5   dtype code, bits, lanes (u16)
 *   6, 7   device type, device id (int8)
 *   8..15  byte_offset (u64)
 *   16     data: the buffer plus this many bytes
 *   17..   the shape, then the strides
 * A refusal is a clean status with a message, the deleter not called and
 * nothing in the manager. An accepted tensor's element count must be the
 * exact one (no wrap), its view must be the one described (data, shape,
 * strides), its bytes must not wrap the address space, and when its
 * extent lies in the buffer every byte is read through ndm; releasing it
 * calls the deleter once. */
#include <dlpack/dlpack.h>

#include "fuzz_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define BUF_BYTES 4096
#define MAX_DIMS 64

typedef struct cursor {
    const uint8_t *p;
    size_t n, at;
} cursor;

static uint64_t take(cursor *c, int bytes)
{
    uint64_t v = 0;
    for (int i = 0; i < bytes; i++, c->at++)
        v |= (uint64_t)(c->at < c->n ? c->p[c->at] : 0) << (8 * i);
    return v;
}

static int64_t take_dim(cursor *c, bool wide)
{
    return wide ? (int64_t)take(c, 8) : (int64_t)(int8_t)take(c, 1);
}

static int deleted;

static void count_delete(DLManagedTensor *t)
{
    (void)t;
    deleted++;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static uint8_t *buf;
    static ndm_manager m;
    if (!buf) {
        buf = malloc(BUF_BYTES); /* exactly: a read past it is the sanitizer's */
        if (!buf)
            fuzz_die("malloc");
        for (int i = 0; i < BUF_BYTES; i++)
            buf[i] = (uint8_t)(i * 31 + 7);
        m = fuzz_manager();
    }
    cursor c = {data, size, 0};
    unsigned flags = (unsigned)take(&c, 1);
    int ndim = (int8_t)take(&c, 1);
    int64_t shape[MAX_DIMS], strides[MAX_DIMS];
    DLManagedTensor t;
    memset(&t, 0, sizeof t);
    t.dl_tensor.ndim = ndim;
    t.dl_tensor.dtype.code = (uint8_t)take(&c, 1);
    t.dl_tensor.dtype.bits = (uint8_t)take(&c, 1);
    t.dl_tensor.dtype.lanes = (uint16_t)take(&c, 2);
    t.dl_tensor.device.device_type = (DLDeviceType)take(&c, 1);
    t.dl_tensor.device.device_id = (int8_t)take(&c, 1);
    t.dl_tensor.byte_offset = take(&c, 8);
    uint8_t at = (uint8_t)take(&c, 1);
    t.dl_tensor.data = flags & 8 ? NULL : buf + at;
    int dims = ndim < 0 ? 0 : ndim > MAX_DIMS ? MAX_DIMS : ndim;
    for (int i = 0; i < dims; i++)
        shape[i] = take_dim(&c, flags & 1);
    for (int i = 0; i < dims; i++)
        strides[i] = take_dim(&c, flags & 4);
    /* a rank past MAX_DIMS points at arrays that short: ndm must refuse it first */
    t.dl_tensor.shape = flags & 16 || ndim > MAX_DIMS ? NULL : shape;
    t.dl_tensor.strides = flags & 2 || ndim > MAX_DIMS ? NULL : strides;
    t.deleter = count_delete;
    deleted = 0;

    ndm_clear_error();
    ndm_array a = ndm_from_dlpack(m, &t);
    if (!a.id) {
        if (ndm_last_status() >= 0)
            fuzz_die("a refusal without a negative status");
        if (!ndm_last_error()[0])
            fuzz_die("a refusal without a message");
        if (deleted)
            fuzz_die("a refused tensor's deleter ran");
        if (fuzz_live(m))
            fuzz_die("a refusal left an array");
        return 0;
    }
    /* Accepted: what was described, exactly (in 128-bit arithmetic). */
    if ((ndim && !t.dl_tensor.shape) || ndim < 0 || ndim > MAX_DIMS || ndm_array_ndim(a) != ndim)
        fuzz_die("an accepted tensor's rank is not the one described");
    size_t item = ndm_dtype_size(ndm_array_dtype(a));
    if (item * 8 != (size_t)t.dl_tensor.dtype.bits * t.dl_tensor.dtype.lanes)
        fuzz_die("an accepted tensor's dtype is not the one described");
    __int128 count = 1, lo = 0, hi = 0;
    int64_t want[MAX_DIMS];
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0)
            fuzz_die("a negative dimension was accepted");
        count *= shape[i];
        if (count > ((__int128)1 << 64))
            count = ((__int128)1 << 64) + 1; /* saturated: past any int64 */
        want[i] = t.dl_tensor.strides ? strides[i] : 0;
    }
    if (!t.dl_tensor.strides) { /* compact row-major */
        __int128 s = 1;
        for (int i = ndim - 1; i >= 0; i--) {
            want[i] = s > INT64_MAX ? INT64_MAX : (int64_t)s;
            s *= shape[i] ? shape[i] : 1;
            if (s > ((__int128)1 << 64))
                s = ((__int128)1 << 64);
        }
    }
    if (count != ndm_array_size(a))
        fuzz_die("an accepted tensor's element count wrapped");
    if ((__int128)ndm_array_nbytes(a) != count * (__int128)item)
        fuzz_die("an accepted tensor's byte count wrapped");
    if (count) {
        for (int i = 0; i < ndim; i++) {
            __int128 span = (__int128)(shape[i] - 1) * want[i] * (__int128)item;
            if (span < 0)
                lo += span;
            else
                hi += span;
        }
        hi += item;
        __int128 base = (__int128)(uintptr_t)t.dl_tensor.data + t.dl_tensor.byte_offset;
        if (base + lo < 0 || base + hi > ((__int128)1 << 64) - 1)
            fuzz_die("an accepted tensor's bytes wrap the address space");
        if ((__int128)(uintptr_t)ndm_array_data(a) != base)
            fuzz_die("an accepted tensor's data pointer is not data + byte_offset");
        int64_t got[MAX_DIMS];
        if (ndm_array_strides(a, got, MAX_DIMS) != ndim)
            fuzz_die("strides");
        for (int i = 0; i < ndim; i++)
            if (shape[i] > 1 && got[i] != want[i])
                fuzz_die("an accepted tensor's strides are not the ones described");
        /* (zero strides view many elements in few bytes: a copy of more
         * than 16 MiB is not read) */
        if (base + lo >= (__int128)(uintptr_t)buf &&
            base + hi <= (__int128)(uintptr_t)buf + BUF_BYTES &&
            ndm_array_nbytes(a) <= ((size_t)16 << 20))
            fuzz_consume(a); /* reads every element through ndm, and releases */
        else if (ndm_array_release(a) != NDM_OK)
            fuzz_die("release");
    } else if (ndm_array_release(a) != NDM_OK) {
        fuzz_die("release");
    }
    if (deleted != 1)
        fuzz_die("releasing an adopted tensor did not call its deleter once");
    if (fuzz_live(m))
        fuzz_die("an array left in the manager");
    return 0;
}
