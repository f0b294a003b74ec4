#!/usr/bin/env bash
# libndm.so needs no CUDA library (only its module does), and the module
# takes nothing of libndm by symbol (what it needs comes through the host
# table): the libraries each ELF file names, and the module's undefined
# symbols.
set -euo pipefail
lib=$1 module=$2
needed() { readelf -d "$1" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'; }
echo "libndm.so needs: $(needed "$lib" | tr '\n' ' ')"
echo "libndm-cuda.so needs: $(needed "$module" | tr '\n' ' ')"
if needed "$lib" | grep -Eq '^lib(cudart|cublas|cuda|nvrtc|nccl)'; then
    echo "libndm.so links a CUDA library"; exit 1
fi
needed "$module" | grep -q '^libcudart' || { echo "the module does not link the CUDA runtime"; exit 1; }
if needed "$module" | grep -q '^libndm'; then
    echo "the module links libndm"; exit 1
fi
undefined=$(nm -D --undefined-only "$module" | awk '{print $NF}' | grep '^ndm' || true)
if [ -n "$undefined" ]; then
    echo "the module expects these from libndm: $undefined"; exit 1
fi
exported=$(nm -D --defined-only "$module" | awk '{print $NF}' | grep '^ndm' || true)
[ "$exported" = ndm_backend_cuda_register ] ||
    { echo "the module exports: $exported (want ndm_backend_cuda_register only)"; exit 1; }
echo ok
