/* The CPU elementwise kernels as one table per instruction set: contiguous
 * loops the driver (ew.c) feeds with rows, tiles and chunks. */
#ifndef NDM_CPU_EW_CPU_H
#define NDM_CPU_EW_CPU_H

#include <stddef.h>
#include <stdint.h>

#include "../ew.h"

/* o[i] = a[i * sa] OP b[i * sb] for i < n, with sa, sb in {0, 1} and not both
 * 0; a and b hold the computation type, o holds it too (bool for comparisons
 * and logical ops). o may be a or b exactly (in place). */
typedef void (*ndm__ew_bin_fn)(void *o, const void *a, int64_t sa, const void *b, int64_t sb,
                               int64_t n);
/* o[i] = OP(a[i]); params as in ndm__backend_ew.unary. o may be a. */
typedef void (*ndm__ew_un_fn)(void *o, const void *a, int64_t n, const void *params);
/* o[i] = c[i] ? a[i * sa] : b[i * sb], sa and sb in {0, 1}. */
typedef void (*ndm__ew_where_fn)(void *o, const uint8_t *c, const void *a, int64_t sa,
                                 const void *b, int64_t sb, int64_t n);
/* d[i * ds] = convert(s[i * ss]) for i < n; any strides (ss may be 0). */
typedef void (*ndm__ew_conv_fn)(void *d, int64_t ds, const void *s, int64_t ss, int64_t n);
/* Copy n bytes with non-temporal stores where d allows. */
typedef void (*ndm__ew_stream_fn)(void *d, const void *s, size_t n);

/* The tables the kernel files define (ew_kern_<isa>.c) hold the kernels
 * written for their instruction set and NULL elsewhere; the tables the
 * driver uses (ndm__ew_isa_active) start from the reference loops (cpu/
 * ew_ref.c) and take each of those kernels in turn, generic then AVX2 then
 * AVX-512 (BLIS's way), so every (operation, computation dtype) slot of
 * bin and un has a kernel, and so does where for every computation dtype.
 * f16 and bf16 are never computation dtypes: their slots stay NULL. */
typedef struct ndm__ew_isa {
    const char *name;
    /* by computation dtype */
    ndm__ew_bin_fn bin[NDM__EW_BINOP_COUNT][NDM_DTYPE_COUNT];
    ndm__ew_un_fn un[NDM__EW_UNOP_COUNT][NDM_DTYPE_COUNT];
    ndm__ew_where_fn where[NDM_DTYPE_COUNT];
    /* [source dtype][destination dtype], every pair */
    ndm__ew_conv_fn conv[NDM_DTYPE_COUNT][NDM_DTYPE_COUNT];
    /* same-dtype moves, by element size (1, 2, 4, 8) */
    ndm__ew_conv_fn move[9];
    ndm__ew_stream_fn stream; /* NULL: no non-temporal stores */
    void (*fence)(void);      /* orders non-temporal stores; NULL with stream */
} ndm__ew_isa;

/* The AVX2 and AVX-512 tables need GCC's target pragma; elsewhere only the
 * generic table (the compiler's default instruction set) is built. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define NDM__EW_X86_TABLES 1
#else
#define NDM__EW_X86_TABLES 0
#endif

extern const ndm__ew_isa ndm__ew_isa_generic;
#if NDM__EW_X86_TABLES
extern const ndm__ew_isa ndm__ew_isa_avx2;
extern const ndm__ew_isa ndm__ew_isa_avx512;
#endif

/* The table the fast backend uses: the one of the CPU level in effect
 * (isa.h). Built on first use; then a load and an index. */
const ndm__ew_isa *ndm__ew_isa_active(void);
/* The table of a level, for tests that compare levels. */
const ndm__ew_isa *ndm__ew_isa_of(int level);
/* Test and benchmark hook over ndm__cpu_isa_force: use the named level
 * ("generic" or "ref", "avx2", "avx512") for every CPU family, or the
 * default one for NULL. NDM_E_UNSUPPORTED when the CPU lacks it,
 * NDM_E_INVALID for an unknown name. Process wide; not while kernels run. */
int ndm__ew_isa_select(const char *name);
/* Fill every bin and un slot with the reference loop (ew_ref.c). */
void ndm__ew_isa_fill_reference(ndm__ew_isa *t);

/* Test hook: outputs of at least this many bytes use non-temporal stores
 * (default 64 MiB). */
void ndm__ew_set_stream_min(int64_t bytes);

/* The fused kernels of the training step (ew_fused.c), slots of the fast table. */
ndm_status ndm__cpu_relu_grad_flat(int device, ndm_dtype t, void *out, const void *g,
                                   const void *x, int64_t n);
ndm_status ndm__cpu_optim_flat(int device, ndm_dtype t, const ndm__optim_args *args, int64_t n);

/* Fast CPU family table and the reference one. */
extern const ndm__backend_ew ndm__cpu_ew;
extern const ndm__backend_ew ndm__cpu_ref_ew;

/* Copies for the core table: the parallel converting copy and the plain
 * reference it is tested against. */
ndm_status ndm__cpu_copy_fast(int device, const ndm__tensor *dst, const ndm__tensor *src);
ndm_status ndm__cpu_copy(int device, const ndm__tensor *dst, const ndm__tensor *src);

#endif
