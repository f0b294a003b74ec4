/* Elementwise kernels for x86-64 CPUs with AVX2, FMA and F16C, chosen at run
 * time; the rest of the library keeps the baseline instruction set. */
#include "ew_cpu.h"
#if NDM__EW_X86_TABLES
#pragma GCC target("avx2,fma,f16c,bmi,bmi2")
#define NDM__EW_ISA_TABLE ndm__ew_isa_avx2
#define NDM__EW_ISA_NAME "avx2"
#include "ew_kern.h"
#endif
