/* Host execution: the runtime API lives in cuda_runtime.h (test-only). */
#ifndef NDM_CUDA_HOST_RUNTIME_API_H
#define NDM_CUDA_HOST_RUNTIME_API_H
#include "cuda_runtime.h"
#endif
