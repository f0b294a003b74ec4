/* Elementwise kernels for x86-64 CPUs with AVX-512 (F, BW, VL, DQ), chosen
 * at run time, with full-width vectors. */
#include "ew_cpu.h"
#if NDM__EW_X86_TABLES
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c,bmi,bmi2")
#pragma GCC target("prefer-vector-width=512")
#define NDM__EW_ISA_TABLE ndm__ew_isa_avx512
#define NDM__EW_ISA_NAME "avx512"
#include "ew_kern.h"
#endif
