/* The CPU's instruction-set level, detected once for every CPU kernel family
 * (elementwise, reductions, GEMM, convolution, random), with a test mask. */
#ifndef NDM_CPU_ISA_H
#define NDM_CPU_ISA_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>

/* Levels, each a superset of the one before. REF runs the portable C
 * kernels (the compiler's baseline); AVX2 needs AVX2, FMA, F16C, BMI1 and
 * BMI2; AVX512 needs AVX-512 F, BW, VL and DQ as well. A family with no
 * kernel for a level uses its best one below it. */
typedef enum ndm__cpu_isa {
    NDM__CPU_ISA_REF,
    NDM__CPU_ISA_AVX2,
    NDM__CPU_ISA_AVX512,
    NDM__CPU_ISA_COUNT
} ndm__cpu_isa;

/* The level in effect, or -1 before the first call of ndm__cpu_isa_level. */
extern _Atomic int ndm__cpu_isa_now;
ndm__cpu_isa ndm__cpu_isa_init(void);

/* The level the kernels use: the best this CPU and OS run, lowered by the
 * environment variable NDM_CPU_ISA (ref, avx2 or avx512; read once, an
 * unknown value or a level above the CPU's is ignored with a warning), or
 * the level a test forced. Detection runs once; then this is one relaxed
 * load, cheap enough for every kernel call. */
static inline ndm__cpu_isa ndm__cpu_isa_level(void)
{
    int v = atomic_load_explicit(&ndm__cpu_isa_now, memory_order_relaxed);
    return v >= 0 ? (ndm__cpu_isa)v : ndm__cpu_isa_init();
}

/* The best level this CPU runs, whatever the environment or a test chose. */
ndm__cpu_isa ndm__cpu_isa_detected(void);

/* Test and benchmark hook: make every CPU family use `level`, or go back to
 * the default (detected, then lowered by NDM_CPU_ISA) for a negative level.
 * false, changing nothing, when this CPU cannot run the level. Process
 * wide; not while kernels run. */
bool ndm__cpu_isa_force(int level);

/* The CPU's vector features as a list ("sse4.2 avx avx2 fma f16c ..."),
 * then the level detected and the level in effect, into buf (n bytes). */
void ndm__cpu_features_str(char *buf, size_t n);

/* "ref", "avx2", "avx512"; the level of a name, or -1. */
const char *ndm__cpu_isa_name(ndm__cpu_isa level);
int ndm__cpu_isa_parse(const char *name);

#endif
