/* Elementwise kernels for any CPU the compiler targets by default (SSE2 on
 * x86-64): the fallback table. */
#define NDM__EW_ISA_TABLE ndm__ew_isa_generic
#define NDM__EW_ISA_NAME "generic"
#include "ew_kern.h"
