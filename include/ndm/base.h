/* ndm base definitions: export and attribute macros, the two handle types,
 * creation sites and shape literals.
 *
 * Handles are small values, not pointers. An ndm_array or ndm_manager packs a
 * slot number and a generation; every call checks both, so a handle whose
 * array was released or whose manager was closed is reported as stale
 * (NDM_E_CLOSED) without ndm ever reading freed memory. A zeroed handle is the
 * null handle: passed anywhere, it is NDM_E_NULL (see status.h for how a
 * null handle that a failure returned keeps that failure's error).
 *
 * Two reserved manager values say what a null manager used to mean, so that
 * a null one (a failed ndm_manager_new, a zeroed variable) is always an
 * error and never silently becomes another manager:
 *   NDM_CURRENT_SCOPE  the innermost scope of the calling thread at the time
 *                      of the call (ndm_scope_current()); accepted wherever a
 *                      manager is taken; NDM_E_NULL when no scope is active.
 *   NDM_OUTPUT_RULE    no manager named: an operation applies the output rule
 *                      (manager.h). The plain operation macros (ndm_add...)
 *                      pass it to their `_to` functions; a function that
 *                      needs a manager (a factory, ndm_attach...) refuses it
 *                      with NDM_E_INVALID.
 *
 * Thread rules: handles are plain values and may be copied between threads.
 */
#ifndef NDM_BASE_H
#define NDM_BASE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/** Marks an exported function: default visibility while the library is
 *  built, nothing for its users. */
#if defined(NDM_BUILDING_LIBRARY) && defined(__cplusplus) && defined(__clang__)
/* (clang++ takes a [[nodiscard]] after a GNU attribute as the type's) */
#define NDM_API [[gnu::visibility("default")]]
#elif defined(NDM_BUILDING_LIBRARY) && defined(__GNUC__)
#define NDM_API __attribute__((visibility("default")))
#else
#define NDM_API
#endif

/** NDM_NODISCARD marks a status that must be looked at: ignoring it loses
 * the news that the state is not what the caller thinks (a close, a move, a
 * cap that did not happen). A `(void)` cast says "ignored on purpose" and
 * silences it everywhere: [[nodiscard]] in C++17 and, in GCC's C modes,
 * before C23 too (GCC's warn_unused_result ignores casts; Clang's honours
 * them). Printing functions are not marked. */
#if defined(__cplusplus) && __cplusplus >= 201703L
#define NDM_NODISCARD [[nodiscard]]
#elif !defined(__cplusplus) && !defined(__clang__) && !defined(NDM_BUILDING_LIBRARY) &&         \
    defined(__GNUC__) && __GNUC__ >= 11
#define NDM_NODISCARD __extension__ [[nodiscard]]
#elif defined(__GNUC__)
#define NDM_NODISCARD __attribute__((warn_unused_result))
#else
#define NDM_NODISCARD
#endif
/** Lets the compiler check a printf-style format (argument fmt) against
 *  its arguments (from argument args on). */
#if defined(__GNUC__)
#define NDM_PRINTF(fmt, args) __attribute__((format(printf, fmt, args)))
#else
#define NDM_PRINTF(fmt, args)
#endif

/* List and struct literals for the macros below and in other headers:
 * compound literals in C; in C++, which has none, an initializer_list (its
 * array lives to the end of the full expression, as a compound literal
 * passed as an argument does) and a braced temporary. A list's count is
 * taken from its expressions' types in an unevaluated sizeof, in C and in
 * C++ alike: each expression runs once, in the list itself. */
#ifdef __cplusplus
#include <initializer_list>
extern "C++" { /* (C++ code may include this header inside extern "C") */
template <typename... A> char (&ndm_list_count_(A &&...))[sizeof...(A) + 1];
}
#define NDM_LIST_COUNT_(T, ...) ((int)sizeof(ndm_list_count_(__VA_ARGS__)) - 1)
#define NDM_LIST_(T, ...) (std::initializer_list<T>{__VA_ARGS__}.begin())
#define NDM_LITERAL_(T, ...) (T{__VA_ARGS__})
#else
#define NDM_LIST_COUNT_(T, ...) ((int)(sizeof((const T[]){__VA_ARGS__}) / sizeof(T)))
#define NDM_LIST_(T, ...) ((const T[]){__VA_ARGS__})
#define NDM_LITERAL_(T, ...) ((T){__VA_ARGS__})
#endif

#ifdef __cplusplus
extern "C" {
#endif

/** An n-dimensional array: a view (dtype, shape, strides, offset) on a
 *  refcounted storage, owned by exactly one manager. */
typedef struct ndm_array {
    uint64_t id; /**< Slot and generation; 0 is the null handle. Opaque. */
} ndm_array;

/** A node of the manager tree; it owns arrays, child managers and other
 *  resources, and frees them all when it is closed. */
typedef struct ndm_manager {
    uint64_t id; /**< Slot, generation and kind bit; 0 is the null handle. Opaque. */
} ndm_manager;

/** The null array handle: what a failed call returns. */
#define NDM_NULL_ARRAY NDM_LITERAL_(ndm_array, 0)
/** The null manager handle: what a failed call returns. */
#define NDM_NULL_MANAGER NDM_LITERAL_(ndm_manager, 0)
/* Reserved values (above): generation 0 with the manager kind bit, which no
 * real handle carries. */
/** As an output manager (`_to` forms): attach the result by the output rule,
 *  as the form without `_to` does. Factories refuse it (NDM_E_INVALID). */
#define NDM_OUTPUT_RULE NDM_LITERAL_(ndm_manager, UINT64_C(0x8000000000000001))
/** As a manager: the innermost scope active on this thread (NDM_E_NULL
 *  when there is none). */
#define NDM_CURRENT_SCOPE NDM_LITERAL_(ndm_manager, UINT64_C(0x8000000000000002))

/** Is this the null array handle? (A stale handle is not null.) */
static inline bool ndm_array_is_null(ndm_array a) { return a.id == 0; }
/** Is this the null manager handle? (A closed manager's handle is not null.) */
static inline bool ndm_manager_is_null(ndm_manager m) { return m.id == 0; }

/** Creation sites. Public entry points that create, move or release things
 *  are macros that pass the caller's file, line and function to an `_at`
 *  function; the `_at` functions are public too, for wrappers that want to
 *  pass their own caller's site. NDM_HERE is this site's three arguments. */
#define NDM_HERE __FILE__, __LINE__, __func__
/** The three site parameters every `_at` function takes first (file, line,
 *  function: NDM_HERE, or a wrapper's own caller's site). */
#define NDM_SITE_PARAMS const char *ndm_file_, int ndm_line_, const char *ndm_func_

/** A shape literal: NDM_SHAPE(2, 3) expands to `2, (const int64_t[]){2, 3}`,
 * the (ndim, shape) pair that every shape-taking function accepts. */
#define NDM_SHAPE(...)                                                          \
    NDM_LIST_COUNT_(int64_t, __VA_ARGS__), NDM_LIST_(int64_t, __VA_ARGS__)

/** A scalar shape (0-d array). */
#define NDM_SCALAR 0, (const int64_t *)0

#ifdef __cplusplus
}
#endif

#endif
