/* ndm random numbers from a seeded counter-based generator.
 *
 * The generator is Philox-4x32-10 (Salmon et al., "Parallel random numbers:
 * as easy as 1, 2, 3", SC 2011): a keyed bijection on 128-bit counters. A
 * generator is a small value the caller owns, not a handle:
 *
 *     ndm_rng rng = ndm_rng_new(42);
 *     ndm_array w = ndm_normal(model, &rng, NDM_F32, 0.0, 0.02, NDM_SHAPE(784, 128));
 *     ndm_array d = ndm_bernoulli(batch, &rng, NDM_BOOL, 0.9, NDM_SHAPE(64, 128));
 *
 * Every call reads the generator and advances `offset` past what it
 * consumed, so successive calls give fresh numbers, and a copy of the struct
 * taken before a call replays it exactly. A failed call leaves it unchanged.
 *
 * The stream, exactly. Block b of a generator is
 *     Philox4x32_10(key = {lo32(seed), hi32(seed)},
 *                   counter = {lo32(offset + b), hi32(offset + b),
 *                              lo32(stream), hi32(stream)}),
 * four 32-bit words; word j of the call is word j % 4 of block j / 4. An
 * array's elements are numbered by their flat index i in C order of the
 * logical shape (whatever the strides), and element i is made from words
 * [i*w, (i+1)*w) only (normal: from those of its pair), where w is 1, 2 or 4
 * (below). So the numbers depend on (seed, stream, offset, i) alone: the
 * same seed gives the same array whatever the thread count and whatever the
 * array's memory layout. A call on n elements advances `offset` by
 * ceil(n*w / 4) blocks (ndm_rng_blocks); counters wrap modulo 2^64.
 *
 * Per element, with x the element's words read little-endian (the first
 * word lowest) and u a fraction in [0, 1): the top 24 bits of the word for
 * w = 1 (u = (x >> 8) 2^-24), the top 53 of the 64 for w = 2:
 * - uniform: lo + (hi - lo) * u in double, then rounded to the dtype (f16 and
 *   bf16 through f32); a value that rounds up to hi is replaced by the
 *   largest one below it. w = 2 for f64, else 1.
 * - normal: Box-Muller on element pairs (2q, 2q+1), which share the words of
 *   both: u1 = u + 2^-24 (or 2^-53), in (0, 1], from the first element's
 *   words and u2 from the second's; r = sqrt(-2 ln u1), then
 *   mean + std r cos(2 pi u2) and mean + std r sin(2 pi u2). w = 2 for f64.
 * - randint: lo + floor(x * (hi - lo) / 2^64) over 64 bits (w = 2), or
 *   / 2^128 over 128 bits (w = 4) for ranges above 2^32; the bias is below
 *   2^-32 per value.
 * - bernoulli: x < floor(p 2^32) (w = 1; p = 1 always), stored as 1 or 0 in
 *   any dtype.
 * - permutation: inside-out Fisher-Yates; step i draws j in [0, i] from
 *   element i's 64 bits as randint does (w = 2), then a[i] = a[j], a[j] = i.
 * - multinomial (w = 2), over rows of R probabilities p (as double):
 *   with replacement, draw s of row r is element r * S + s (S samples a
 *   row): c are the running sums of the row, added left to right, and the
 *   draw is the first j with c[j] > u * c[R-1] (u from 53 bits; the last
 *   positive category if rounding leaves none). Without replacement, each
 *   category j of row r is element r * R + j with the key -ln(u1) / p[j]
 *   (u1 in (0, 1], ln by normal's polynomial; none for p[j] = 0), and the
 *   draws are the categories of the S smallest keys, smallest first (ties
 *   to the lower j): the exponential race, which draws one category after
 *   another with probability proportional to p, each at most once. A
 *   multinomial call advances by ceil(n * 2 / 4) blocks for its n elements
 *   (rows * S, or rows * R without replacement).
 * uniform, randint, bernoulli, permutation and multinomial are exact: every
 * backend gives the same bits. normal evaluates ln, sin and cos with its own polynomials
 * (f32 arithmetic for f32, f16 and bf16; f64 for f64), the same on the CPU
 * and on CUDA, so it too gives the same bits on every backend; its values
 * agree with the formula to a few units in the last place of f32 (about
 * 1e-6 relative) and to about 1e-13 in f64.
 *
 * Ownership: factories take the manager that will own the result
 * (NDM_CURRENT_SCOPE: the innermost scope of this thread) like ndm_zeros, and return a fresh handle
 * or the null handle; the in-place forms (ndm_uniform_ ...) fill an existing
 * array of any layout, even one in a capped manager, and return a status.
 * Errors: NDM_E_INVALID for a NULL generator or bad parameters (hi <= lo,
 * std < 0, p outside [0, 1], non-finite values), NDM_E_DTYPE for a dtype the
 * distribution does not make, and the factory errors of array.h.
 *
 * Thread rules: an ndm_rng is a plain value; one used by two threads at once
 * needs the caller's lock. Give each thread its own stream instead.
 */
#ifndef NDM_RANDOM_H
#define NDM_RANDOM_H

#include "base.h"
#include "device.h"
#include "dtype.h"
#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

/** A generator: which stream to read (seed, stream) and where (offset, in
 *  128-bit blocks). All three fields are the caller's to set. */
typedef struct ndm_rng {
    uint64_t seed;   /**< the Philox key */
    uint64_t stream; /**< the stream, the counter's high 64 bits */
    uint64_t offset; /**< the next block to read, the counter's low 64 bits */
} ndm_rng;

/** Stream 0 of `seed`, from its start. */
static inline ndm_rng ndm_rng_new(uint64_t seed)
{
    ndm_rng r = {seed, 0, 0};
    return r;
}

/** Blocks a call on n elements with w words each consumes: ceil(n*w / 4). */
static inline uint64_t ndm_rng_blocks(uint64_t n, unsigned w) { return (n * w + 3) / 4; }

/** @name Distributions
 *  Each factory returns a new array owned by `m`, the caller's to release
 *  (or m's close releases it), or the null handle with nothing allocated
 *  and the generator unchanged: NDM_E_INVALID (a NULL generator, bad
 *  parameters), NDM_E_DTYPE (a dtype the distribution does not make), and
 *  the factory errors of array.h. Each in-place form returns NDM_OK or one
 *  of those errors (NDM_E_NULL / NDM_E_CLOSED for `a`), `a` and the
 *  generator unchanged. */
/** @{ */

/** Uniform on [lo, hi) (float dtypes). */
#define ndm_uniform(m, rng, dtype, lo, hi, ...)                                 \
    ndm_uniform_at(NDM_HERE, (m), (rng), (dtype), (lo), (hi), __VA_ARGS__)
/** ndm_uniform() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_array ndm_uniform_at(NDM_SITE_PARAMS, ndm_manager m, ndm_rng *rng, ndm_dtype dtype,
                                 double lo, double hi, int ndim, const int64_t *shape);
/** ndm_uniform() into the existing array `a` (any layout, even in a capped manager):
 *  NDM_OK, or an error with the generator unchanged. */
#define ndm_uniform_(a, rng, lo, hi) ndm_uniform_inplace_at(NDM_HERE, (a), (rng), (lo), (hi))
/** ndm_uniform_() with an explicit call site (the macro passes NDM_HERE). */
NDM_API NDM_NODISCARD ndm_status ndm_uniform_inplace_at(NDM_SITE_PARAMS, ndm_array a,
                                                        ndm_rng *rng, double lo, double hi);

/** Normal with mean and standard deviation std >= 0 (float dtypes). */
#define ndm_normal(m, rng, dtype, mean, std, ...)                               \
    ndm_normal_at(NDM_HERE, (m), (rng), (dtype), (mean), (std), __VA_ARGS__)
/** ndm_normal() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_array ndm_normal_at(NDM_SITE_PARAMS, ndm_manager m, ndm_rng *rng, ndm_dtype dtype,
                                double mean, double std, int ndim, const int64_t *shape);
/** ndm_normal() into the existing array `a` (any layout, even in a capped manager):
 *  NDM_OK, or an error with the generator unchanged. */
#define ndm_normal_(a, rng, mean, std) ndm_normal_inplace_at(NDM_HERE, (a), (rng), (mean), (std))
/** ndm_normal_() with an explicit call site (the macro passes NDM_HERE). */
NDM_API NDM_NODISCARD ndm_status ndm_normal_inplace_at(NDM_SITE_PARAMS, ndm_array a, ndm_rng *rng,
                                                       double mean, double std);

/** Integers uniform on [lo, hi) (u8, i32, i64; the range must fit the dtype). */
#define ndm_randint(m, rng, dtype, lo, hi, ...)                                 \
    ndm_randint_at(NDM_HERE, (m), (rng), (dtype), (lo), (hi), __VA_ARGS__)
/** ndm_randint() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_array ndm_randint_at(NDM_SITE_PARAMS, ndm_manager m, ndm_rng *rng, ndm_dtype dtype,
                                 int64_t lo, int64_t hi, int ndim, const int64_t *shape);
/** ndm_randint() into the existing array `a` (any layout, even in a capped manager):
 *  NDM_OK, or an error with the generator unchanged. */
#define ndm_randint_(a, rng, lo, hi) ndm_randint_inplace_at(NDM_HERE, (a), (rng), (lo), (hi))
/** ndm_randint_() with an explicit call site (the macro passes NDM_HERE). */
NDM_API NDM_NODISCARD ndm_status ndm_randint_inplace_at(NDM_SITE_PARAMS, ndm_array a,
                                                        ndm_rng *rng, int64_t lo, int64_t hi);

/** 1 with probability p, else 0, in any dtype (bool for masks). */
#define ndm_bernoulli(m, rng, dtype, p, ...)                                    \
    ndm_bernoulli_at(NDM_HERE, (m), (rng), (dtype), (p), __VA_ARGS__)
/** ndm_bernoulli() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_array ndm_bernoulli_at(NDM_SITE_PARAMS, ndm_manager m, ndm_rng *rng, ndm_dtype dtype,
                                   double p, int ndim, const int64_t *shape);
/** ndm_bernoulli() into the existing array `a` (any layout, even in a capped manager):
 *  NDM_OK, or an error with the generator unchanged. */
#define ndm_bernoulli_(a, rng, p) ndm_bernoulli_inplace_at(NDM_HERE, (a), (rng), (p))
/** ndm_bernoulli_() with an explicit call site (the macro passes NDM_HERE). */
NDM_API NDM_NODISCARD ndm_status ndm_bernoulli_inplace_at(NDM_SITE_PARAMS, ndm_array a,
                                                          ndm_rng *rng, double p);

/** A random permutation of 0..n-1 as a 1-d i64 array (n >= 0). */
#define ndm_permutation(m, rng, n) ndm_permutation_at(NDM_HERE, (m), (rng), (n))
/** ndm_permutation() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_array ndm_permutation_at(NDM_SITE_PARAMS, ndm_manager m, ndm_rng *rng, int64_t n);
/** @} */

/** torch.multinomial(probs, num_samples, replacement): category indices
 *  drawn from the rows of `probs` (1-d: one row of categories; 2-d: rows x
 *  categories), a float array of weights that need not sum to 1, from the
 *  stream of *rng as above (the same draw on every backend, bit for bit).
 *  Returns a new i64 array of shape [num_samples] or [rows, num_samples]
 *  owned by the output rule's manager (probs', unless a scope or the _to
 *  form names one), the generator advanced; or the null handle with
 *  nothing allocated and the generator unchanged. Without replacement a
 *  row's draws are distinct and num_samples <= categories. Errors:
 *  NDM_E_INVALID for a NULL generator, num_samples < 1, more samples than
 *  categories without replacement, and (read from the data, which on a
 *  device waits for its queue) an entry that is negative, NaN or infinite,
 *  a row that sums to zero or overflows, or a row with fewer nonzero
 *  entries than num_samples without replacement, the message naming the
 *  row and entry; NDM_E_SHAPE for a rank other than 1 or 2; NDM_E_DTYPE
 *  for a non-float probs; NDM_E_NULL / NDM_E_CLOSED for a null or stale
 *  handle; NDM_E_CAPPED / NDM_E_QUOTA / NDM_E_OOM from the output manager. */
#define ndm_multinomial(probs, num_samples, replacement, rng)                   \
    ndm_multinomial_to_at(NDM_HERE, NDM_OUTPUT_RULE, (probs), (num_samples), (replacement), (rng))
/** ndm_multinomial() with the result attached to m instead of by the output rule. */
#define ndm_multinomial_to(m, probs, num_samples, replacement, rng)             \
    ndm_multinomial_to_at(NDM_HERE, (m), (probs), (num_samples), (replacement), (rng))
/** ndm_multinomial_to() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_array ndm_multinomial_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array probs,
                                        int64_t num_samples, bool replacement, ndm_rng *rng);

#ifdef __cplusplus
}
#endif

#endif
