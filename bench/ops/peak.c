/* The machine's f32 multiply-add peak, measured in the run that uses it: a
 * loop of independent FMAs in the widest vectors the CPU has, on one thread
 * and on several at once. A constant would hold on one CPU only. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "sections.h"

#if defined(__GNUC__) && defined(__x86_64__)
#include <immintrin.h>
#define PEAK_X86 1
#else
#define PEAK_X86 0
#endif

/* Twelve chains: more than latency x pipes (4 x 2 on current cores), so
 * the FMA units never wait. a = a * x + y converges (to y / (1 - x)), so
 * no value overflows or goes subnormal however long it runs. */
#define CHAINS 12

#if PEAK_X86
__attribute__((target("avx512f"))) static float fma_avx512(long iters)
{
    __m512 a[CHAINS], x = _mm512_set1_ps(0.999999f), y = _mm512_set1_ps(1e-7f);
    for (int j = 0; j < CHAINS; j++)
        a[j] = _mm512_set1_ps((float)j);
    for (long i = 0; i < iters; i++)
        for (int j = 0; j < CHAINS; j++)
            a[j] = _mm512_fmadd_ps(a[j], x, y);
    for (int j = 1; j < CHAINS; j++)
        a[0] = _mm512_add_ps(a[0], a[j]);
    return _mm512_reduce_add_ps(a[0]);
}

__attribute__((target("avx2,fma"))) static float fma_avx2(long iters)
{
    __m256 a[CHAINS], x = _mm256_set1_ps(0.999999f), y = _mm256_set1_ps(1e-7f);
    for (int j = 0; j < CHAINS; j++)
        a[j] = _mm256_set1_ps((float)j);
    for (long i = 0; i < iters; i++)
        for (int j = 0; j < CHAINS; j++)
            a[j] = _mm256_fmadd_ps(a[j], x, y);
    for (int j = 1; j < CHAINS; j++)
        a[0] = _mm256_add_ps(a[0], a[j]);
    float v[8];
    _mm256_storeu_ps(v, a[0]);
    return v[0] + v[1] + v[2] + v[3] + v[4] + v[5] + v[6] + v[7];
}
#endif

/* Elsewhere: four-wide multiply-adds, which the compiler fuses where the
 * target has FMA (-ffp-contract) and counts as two operations either way. */
typedef float v4f __attribute__((vector_size(16)));

static float fma_generic(long iters)
{
    v4f a[CHAINS], x = {0.999999f, 0.999999f, 0.999999f, 0.999999f};
    v4f y = {1e-7f, 1e-7f, 1e-7f, 1e-7f};
    for (int j = 0; j < CHAINS; j++)
        a[j] = (v4f){(float)j, (float)j, (float)j, (float)j};
    for (long i = 0; i < iters; i++)
        for (int j = 0; j < CHAINS; j++)
            a[j] = a[j] * x + y;
    for (int j = 1; j < CHAINS; j++)
        a[0] += a[j];
    return a[0][0] + a[0][1] + a[0][2] + a[0][3];
}

typedef float (*fma_fn)(long iters);

/* The loop for this CPU, its vector width in floats and its name. */
static fma_fn pick(int *lanes, const char **isa)
{
#if PEAK_X86
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f")) {
        *lanes = 16, *isa = "AVX-512";
        return fma_avx512;
    }
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
        *lanes = 8, *isa = "AVX2";
        return fma_avx2;
    }
#endif
    *lanes = 4, *isa = "4-wide";
    return fma_generic;
}

typedef struct run {
    fma_fn fn;
    long iters;
    pthread_barrier_t *start;
    volatile float sink;
} run;

static void *run_thread(void *p)
{
    run *r = p;
    pthread_barrier_wait(r->start);
    r->sink = r->fn(r->iters);
    return NULL;
}

/* Seconds for `threads` threads to run the loop `iters` times each, all
 * started together. */
static double time_threads(fma_fn fn, long iters, int threads)
{
    pthread_t *tid = malloc(sizeof *tid * (size_t)threads);
    run *runs = malloc(sizeof *runs * (size_t)threads);
    pthread_barrier_t start;
    if (!tid || !runs || pthread_barrier_init(&start, NULL, (unsigned)threads + 1) != 0)
        exit(1);
    for (int t = 0; t < threads; t++) {
        runs[t] = (run){fn, iters, &start, 0};
        if (pthread_create(&tid[t], NULL, run_thread, &runs[t]) != 0)
            exit(1);
    }
    pthread_barrier_wait(&start);
    double t0 = bench_now();
    for (int t = 0; t < threads; t++)
        pthread_join(tid[t], NULL);
    double s = bench_now() - t0;
    pthread_barrier_destroy(&start);
    free(tid), free(runs);
    return s;
}

double bench_fma_peak(int threads, const char **isa)
{
    int lanes;
    fma_fn fn = pick(&lanes, isa);
    if (threads < 1)
        threads = 1;
    /* about 0.1 s a sample; the best of five (peak: nothing runs faster) */
    long iters = 1 << 16;
    while (time_threads(fn, iters, threads) < 0.02 && iters < (1L << 40))
        iters *= 2;
    iters *= 5;
    double best = 0;
    for (int i = 0; i < 5; i++) {
        double s = time_threads(fn, iters, threads);
        double g = 2.0 * CHAINS * lanes * (double)iters * threads / s * 1e-9;
        if (g > best)
            best = g;
    }
    return best;
}
