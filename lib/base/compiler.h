/* Compiler hints every layer uses: branch weights, forced inlining, cold
 * paths, and the thread-local model. A leaf header: it includes nothing. */
#ifndef NDM_BASE_COMPILER_H
#define NDM_BASE_COMPILER_H

#if defined(__GNUC__)
#define NDM__LIKELY(x) __builtin_expect(!!(x), 1)
#define NDM__UNLIKELY(x) __builtin_expect(!!(x), 0)
/* For the few helpers of the per-array hot path that the compiler would
 * otherwise keep out of line (a call costs as much as their body). */
#define NDM__ALWAYS_INLINE inline __attribute__((always_inline))
/* An error path kept out of the caller, so the caller needs no frame. */
#define NDM__COLD __attribute__((noinline, cold))
/* A shared library's general thread-locals cost a call on every access;
 * initial-exec ones are one load. Keep each such variable a pointer: the
 * static TLS block a library loaded with dlopen may use is small. */
#define NDM__TLS_MODEL __attribute__((tls_model("initial-exec")))
#else
#define NDM__LIKELY(x) (x)
#define NDM__UNLIKELY(x) (x)
#define NDM__ALWAYS_INLINE inline
#define NDM__COLD
#define NDM__TLS_MODEL
#endif

#endif
