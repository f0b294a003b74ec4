/* One thread reading a model's parameters: see weights_read.h. */
#include <stdio.h>

#include "../lib/backends/cpu/small_gemm.h"
#include "weights_read.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define WEIGHTS_READ_X86 1
#else
#define WEIGHTS_READ_X86 0
#endif


bool weights_read_init(weights_read *w, ndm_module net)
{
    ndm_array p[WEIGHTS_READ_MAX + 1];
    int n = ndm_module_parameters(net, p, WEIGHTS_READ_MAX + 1);
    if (n < 0 || n > WEIGHTS_READ_MAX) {
        fprintf(stderr, "weights_read: %s\n", n < 0 ? ndm_last_error() : "too many parameters");
        return false;
    }
    *w = (weights_read){.arrays = n};
    for (int i = 0; i < n; i++) {
        if (ndm_array_dtype(p[i]) != NDM_F32 || !ndm_array_is_contiguous(p[i])) {
            fprintf(stderr, "weights_read: parameter %d is not a contiguous f32 array\n", i);
            return false;
        }
        w->data[i] = ndm_array_data(p[i]);
        w->count[i] = ndm_array_size(p[i]);
        w->bytes += w->count[i] * (int64_t)sizeof(float);
    }
    return true;
}

#if WEIGHTS_READ_X86
/* Eight independent sums of 8 lanes: loads, not additions, set the pace. */
__attribute__((target("avx2"))) static float sum_avx2(const float *a, int64_t n, bool rev)
{
    __m256 s[8];
    for (int q = 0; q < 8; q++)
        s[q] = _mm256_setzero_ps();
    int64_t whole = n / 64 * 64;
    if (!rev) {
        for (int64_t i = 0; i < whole; i += 64)
            _Pragma("GCC unroll 8") for (int q = 0; q < 8; q++)
                s[q] = _mm256_add_ps(s[q], _mm256_loadu_ps(a + i + 8 * q));
    } else {
        for (int64_t i = whole; i > 0; i -= 64)
            _Pragma("GCC unroll 8") for (int q = 0; q < 8; q++)
                s[q] = _mm256_add_ps(s[q], _mm256_loadu_ps(a + i - 64 + 8 * q));
    }
    for (int q = 1; q < 8; q++)
        s[0] = _mm256_add_ps(s[0], s[q]);
    float lane[8], t = 0;
    _mm256_storeu_ps(lane, s[0]);
    for (int q = 0; q < 8; q++)
        t += lane[q];
    for (int64_t i = whole; i < n; i++)
        t += a[i];
    return t;
}
#endif

static float sum_plain(const float *a, int64_t n, bool rev)
{
    float s[8] = {0};
    int64_t whole = n / 8 * 8;
    for (int64_t i = 0; i < whole; i += 8) {
        const float *b = rev ? a + whole - 8 - i : a + i;
        for (int q = 0; q < 8; q++)
            s[q] += b[q];
    }
    float t = 0;
    for (int q = 0; q < 8; q++)
        t += s[q];
    for (int64_t i = whole; i < n; i++)
        t += a[i];
    return t;
}

float weights_read_pass(weights_read *w)
{
    bool odd = w->pass++ & 1u;
#if WEIGHTS_READ_X86
    bool avx2 = __builtin_cpu_supports("avx2");
#endif
    float t = 0;
    for (int i = 0; i < w->arrays; i++) {
        int64_t bytes = w->count[i] * (int64_t)sizeof(float);
        bool rev = odd && bytes >= NDM__GEMM_SMALL_ALTERNATE_BYTES;
#if WEIGHTS_READ_X86
        if (avx2) {
            t += sum_avx2(w->data[i], w->count[i], rev);
            continue;
        }
#endif
        t += sum_plain(w->data[i], w->count[i], rev);
    }
    return t;
}
