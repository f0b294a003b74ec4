/* CPU feature detection, done once for all CPU kernel families, and the
 * process-wide level they read (lowered by NDM_CPU_ISA or a test). */
#include "isa.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../base/error.h"

_Atomic int ndm__cpu_isa_now = -1;

static _Atomic int detected = -1;

#if defined(__x86_64__) && defined(__GNUC__)
#include <cpuid.h>

/* F16C from CPUID leaf 1: clang before 16 does not know "f16c" in
 * __builtin_cpu_supports. Its instructions are VEX-encoded, so, as GCC's
 * "f16c" does, it counts only where AVX does (the OS saves the wide
 * registers): the level and the feature list read the same under both. */
static bool cpu_has_f16c(void)
{
    unsigned a, b, c, d;
    return __builtin_cpu_supports("avx") && __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C);
}
#endif

static ndm__cpu_isa detect(void)
{
#if defined(__x86_64__) && defined(__GNUC__)
    /* __builtin_cpu_supports also checks that the OS saves the wide
     * registers (XGETBV), so a level here is one the process can run. */
    __builtin_cpu_init();
    bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                cpu_has_f16c() && __builtin_cpu_supports("bmi") &&
                __builtin_cpu_supports("bmi2");
    if (avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq"))
        return NDM__CPU_ISA_AVX512;
    if (avx2)
        return NDM__CPU_ISA_AVX2;
#endif
    return NDM__CPU_ISA_REF;
}

ndm__cpu_isa ndm__cpu_isa_detected(void)
{
    int v = atomic_load_explicit(&detected, memory_order_acquire);
    if (v < 0) {
        v = (int)detect();
        atomic_store_explicit(&detected, v, memory_order_release);
    }
    return (ndm__cpu_isa)v;
}

static const char *const names[NDM__CPU_ISA_COUNT] = {"ref", "avx2", "avx512"};

const char *ndm__cpu_isa_name(ndm__cpu_isa level)
{
    return (unsigned)level < NDM__CPU_ISA_COUNT ? names[level] : "?";
}

int ndm__cpu_isa_parse(const char *name)
{
    for (int i = 0; i < NDM__CPU_ISA_COUNT; i++)
        if (!strcmp(name, names[i]))
            return i;
    return -1;
}

/* The detected level lowered by NDM_CPU_ISA. */
static ndm__cpu_isa default_level(void)
{
    ndm__cpu_isa best = ndm__cpu_isa_detected();
    const char *env = getenv("NDM_CPU_ISA");
    if (!env || !*env)
        return best;
    int want = ndm__cpu_isa_parse(env);
    if (want < 0) {
        ndm__warn("NDM_CPU_ISA=%s is not one of ref, avx2, avx512: ignored", env);
        return best;
    }
    if (want > (int)best) {
        ndm__warn("NDM_CPU_ISA=%s: this CPU runs at most %s, which is used", env,
                  names[best]);
        return best;
    }
    return (ndm__cpu_isa)want;
}

ndm__cpu_isa ndm__cpu_isa_init(void)
{
    /* Two threads may both get here: they store the same value. */
    int v = atomic_load_explicit(&ndm__cpu_isa_now, memory_order_acquire);
    if (v < 0) {
        v = (int)default_level();
        atomic_store_explicit(&ndm__cpu_isa_now, v, memory_order_release);
    }
    return (ndm__cpu_isa)v;
}

bool ndm__cpu_isa_force(int level)
{
    if (level < 0) {
        atomic_store(&ndm__cpu_isa_now, (int)default_level());
        return true;
    }
    if (level >= NDM__CPU_ISA_COUNT || level > (int)ndm__cpu_isa_detected())
        return false;
    atomic_store(&ndm__cpu_isa_now, level);
    return true;
}

void ndm__cpu_features_str(char *buf, size_t n)
{
    size_t len = 0;
    buf[0] = '\0';
#if defined(__x86_64__) && defined(__GNUC__)
    /* __builtin_cpu_supports takes a string literal per feature. */
#define NDM__CPU_FEATURE(f)                                                     \
    if (__builtin_cpu_supports(f) && len < n)                                  \
        len += (size_t)snprintf(buf + len, n - len, "%s%s", len ? " " : "", f);
    NDM__CPU_FEATURE("sse4.2")
    NDM__CPU_FEATURE("avx")
    NDM__CPU_FEATURE("avx2")
    NDM__CPU_FEATURE("fma")
    if (cpu_has_f16c() && len < n)
        len += (size_t)snprintf(buf + len, n - len, "%s%s", len ? " " : "", "f16c");
    NDM__CPU_FEATURE("avx512f")
    NDM__CPU_FEATURE("avx512bw")
    NDM__CPU_FEATURE("avx512vl")
    NDM__CPU_FEATURE("avx512dq")
#undef NDM__CPU_FEATURE
#endif
    if (len < n)
        snprintf(buf + len, n - len, "%skernels %s (best here %s)", len ? "; " : "",
                 ndm__cpu_isa_name(ndm__cpu_isa_level()),
                 ndm__cpu_isa_name(ndm__cpu_isa_detected()));
}
