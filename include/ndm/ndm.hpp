/* ndm for C++17: owners that release and close on destruction, operators,
 * exceptions that carry the status and the message.
 *
 *   ndm::manager model(ndm_system(), "model");
 *   ndm::array x = ndm::ones(model, NDM_F32, {2, 3});
 *   ndm::array y = x * 2.0 + 1.0;           // y is in model (the output rule)
 *   std::cout << ndm::sum(y) << "\n";       // array(18., dtype=float32)
 *
 * Header-only, over the C API of <ndm/ndm.h>; nothing here keeps state of
 * its own.
 *
 * Ownership. ndm::manager, ndm::scope and ndm::array are move-only owners of
 * one C handle. A manager owner closes its manager when destroyed (and with
 * it every array and child under it); an array owner releases its array; a
 * scope owner ends its scope, releasing what the scope still holds. Their
 * order does not matter: an array owner that outlives its manager finds its
 * handle stale, and its destructor does nothing (ndm's handles carry a
 * generation, so a stale one never names another array). get() lends the C
 * handle (and every owner converts to it, so the whole C API takes them);
 * release() hands the handle over and leaves the owner empty. ndm::adopt()
 * takes the result of any C call into an owner.
 *
 * Sites. Every call and operator passes the caller's file, line and function
 * to the C API (through default arguments that the compiler fills in where
 * the call is written), so leak reports, dumps and error messages name the
 * user's line, not this header's.
 *
 * Errors. A failed call throws ndm::error, which carries the status
 * (status()) and the C API's message (what()). Destructors never throw. With
 * exceptions off (-fno-exceptions, or NDM_NO_EXCEPTIONS defined before this
 * header), nothing throws: a failed call returns an empty owner (ok() false)
 * or the negative status, item() returns NaN, and the error stays in
 * ndm_last_status() and ndm_last_error().
 *
 * Operators. + - * / on two arrays, or an array and a number (either side),
 * with numpy's broadcasting and promotion; unary -; += -= *= /= in place;
 * == != < <= > >= give bool arrays (so an array has no conversion to bool:
 * ask ok() for validity). There is no matrix-product operator (% and ^ read
 * as remainder and xor): ndm::matmul(a, b), or a.matmul(b). */
#ifndef NDM_NDM_HPP
#define NDM_NDM_HPP

#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "ndm.h"

#if !defined(NDM_NO_EXCEPTIONS) && (defined(__cpp_exceptions) || defined(__EXCEPTIONS))
#define NDM_HPP_THROWS 1
#include <stdexcept>
#else
#define NDM_HPP_THROWS 0
#endif

namespace ndm {

/** A call site: filled in by default arguments where the call is written. */
struct site {
    const char *file;
    int line;
    const char *func;
    site(const char *f = __builtin_FILE(), int l = __builtin_LINE(),
         const char *fn = __builtin_FUNCTION()) noexcept
        : file(f), line(l), func(fn)
    {
    }
};

#if NDM_HPP_THROWS
/** A failed ndm call: its status and the C API's message. */
class error : public std::runtime_error {
public:
    error(ndm_status st, const char *message)
        : std::runtime_error(message && *message ? message : ndm_status_str(st)), status_(st)
    {
    }
    ndm_status status() const noexcept { return status_; }

private:
    ndm_status status_;
};
#endif

namespace detail {
/* The thread's last failure: thrown, or left for the caller to read. */
inline void fail(ndm_status st)
{
#if NDM_HPP_THROWS
    throw error(st < 0 ? st : NDM_E_INTERNAL, ndm_last_error());
#else
    (void)st;
#endif
}
inline ndm_status check(ndm_status st)
{
    if (st < 0)
        fail(st);
    return st;
}
inline ndm_array check(ndm_array a)
{
    if (a.id == 0)
        fail(ndm_last_status());
    return a;
}
inline ndm_manager check(ndm_manager m)
{
    if (m.id == 0)
        fail(ndm_last_status());
    return m;
}
} // namespace detail

/** The owner of one array: released when the owner is destroyed. */
class array {
public:
    array() noexcept = default;
    /** Own `a` (a live array, or the null handle for an empty owner). */
    explicit array(ndm_array a) noexcept : h_(a) {}
    array(const array &) = delete;
    array &operator=(const array &) = delete;
    array(array &&o) noexcept : h_(o.release()) {}
    array &operator=(array &&o) noexcept
    {
        if (this != &o) {
            reset();
            h_ = o.release();
        }
        return *this;
    }
    ~array() { reset(); }

    /** The handle, lent (the owner keeps it). */
    ndm_array get() const noexcept { return h_; }
    operator ndm_array() const noexcept { return h_; }
    /** The handle, handed over: the owner is empty after. */
    ndm_array release() noexcept
    {
        ndm_array h = h_;
        h_ = ndm_array{0};
        return h;
    }
    /** Release the array now (nothing when empty or already stale). */
    void reset() noexcept
    {
        if (h_.id != 0)
            (void)ndm_array_release_at(__FILE__, __LINE__, "ndm::array::reset", release());
    }
    /** Whether the owner holds a handle that names a live array. */
    bool ok() const noexcept { return h_.id != 0 && ndm_array_valid(h_); }

    int ndim() const noexcept { return ndm_array_ndim(h_); }
    int64_t dim(int axis) const noexcept { return ndm_array_dim(h_, axis); }
    int64_t size() const noexcept { return ndm_array_size(h_); }
    size_t nbytes() const noexcept { return ndm_array_nbytes(h_); }
    ndm_dtype dtype() const noexcept { return ndm_array_dtype(h_); }
    ndm_manager owner() const noexcept { return ndm_array_manager(h_); }
    std::vector<int64_t> shape() const
    {
        int n = ndm_array_ndim(h_);
        std::vector<int64_t> s(n > 0 ? (size_t)n : 0);
        if (n > 0)
            (void)ndm_array_shape(h_, s.data(), n);
        return s;
    }
    /** The one element as a double (NaN with exceptions off, on failure). */
    double item(site s = site()) const
    {
        double v = NAN;
        detail::check(ndm_item_at(s.file, s.line, s.func, h_, &v));
        return v;
    }
    /** The elements in C order, as T (sizeof(T) must be the dtype's size). */
    template <typename T> std::vector<T> to_vector(site s = site()) const
    {
        int64_t n = ndm_array_size(h_);
        std::vector<T> v(n > 0 ? (size_t)n : 0);
        if (detail::check(ndm_array_copy_out_at(s.file, s.line, s.func, h_, v.data(),
                                                v.size() * sizeof(T))) < 0)
            v.clear();
        return v;
    }

    /** a[start:stop:step] along axis, a view (NDM_END: an open bound). */
    array slice(int axis, int64_t start, int64_t stop = NDM_END, int64_t step = 1,
                site s = site()) const
    {
        return adopt_(ndm_slice_to_at(s.file, s.line, s.func, NDM_OUTPUT_RULE, h_, axis, start,
                                      stop, step));
    }
    /** a[..., index, ...] along axis (the axis goes), a view. */
    array select(int axis, int64_t index, site s = site()) const
    {
        return adopt_(ndm_select_to_at(s.file, s.line, s.func, NDM_OUTPUT_RULE, h_, axis, index));
    }
    array reshape(std::initializer_list<int64_t> shape, site s = site()) const
    {
        return adopt_(ndm_reshape_to_at(s.file, s.line, s.func, NDM_OUTPUT_RULE, h_,
                                        (int)shape.size(), shape.begin()));
    }
    /** The axes reversed, a view. */
    array t(site s = site()) const
    {
        return adopt_(ndm_permute_to_at(s.file, s.line, s.func, NDM_OUTPUT_RULE, h_, 0, nullptr));
    }
    array matmul(const array &b, site s = site()) const
    {
        return adopt_(ndm_matmul_to_at(s.file, s.line, s.func, NDM_OUTPUT_RULE, h_, b.h_));
    }

private:
    static array adopt_(ndm_array a) { return array(detail::check(a)); }
    ndm_array h_{0};
};

/** Own the result of a C call: throws (or returns an empty owner) for the
 *  null handle a failure returns. */
inline array adopt(ndm_array a) { return array(detail::check(a)); }

/** The owner of one manager: closed (with its subtree) when destroyed. */
class manager {
public:
    manager() noexcept = default;
    /** Own `m` (the system and detached managers cannot be owned: their
     *  close is refused, and the destructor then does nothing). */
    explicit manager(ndm_manager m) noexcept : h_(m) {}
    /** A new child of parent, named name (on parent's device). */
    manager(ndm_manager parent, const char *name, site s = site())
        : h_(detail::check(ndm_manager_new_at(s.file, s.line, s.func, parent, name)))
    {
    }
    /** A new child of parent on `device`. */
    manager(ndm_manager parent, const char *name, ndm_device device, site s = site())
        : h_(detail::check(ndm_manager_new_on_at(s.file, s.line, s.func, parent, name, device)))
    {
    }
    manager(const manager &) = delete;
    manager &operator=(const manager &) = delete;
    manager(manager &&o) noexcept : h_(o.release()) {}
    manager &operator=(manager &&o) noexcept
    {
        if (this != &o) {
            reset();
            h_ = o.release();
        }
        return *this;
    }
    ~manager() { reset(); }

    ndm_manager get() const noexcept { return h_; }
    operator ndm_manager() const noexcept { return h_; }
    ndm_manager release() noexcept
    {
        ndm_manager h = h_;
        h_ = ndm_manager{0};
        return h;
    }
    /** Close now, reporting a failure (an on-close hook's, for instance). */
    ndm_status close(site s = site())
    {
        ndm_manager h = release();
        return h.id ? detail::check(ndm_manager_close_at(s.file, s.line, s.func, h)) : NDM_ALREADY;
    }
    /** Close now; a failure is not reported. */
    void reset() noexcept
    {
        if (h_.id != 0)
            (void)ndm_manager_close_at(__FILE__, __LINE__, "ndm::manager::reset", release());
    }
    explicit operator bool() const noexcept { return h_.id != 0 && ndm_manager_valid(h_); }
    /** Counters of the manager (NDM_STATS_SUBTREE in flags for its subtree). */
    ndm_stats stats(unsigned flags = 0) const
    {
        ndm_stats st{};
        detail::check(ndm_manager_stats(h_, ndm_manager_device(h_), flags, &st));
        return st;
    }

private:
    ndm_manager h_{0};
};

/** A scope: the innermost one catches the results of operations on this
 *  thread (manager.h's output rule). Its destruction ends it: what it still
 *  holds is released, also when an exception unwinds through it. */
class scope {
public:
    explicit scope(ndm_manager parent, const char *name = "scope", site s = site())
        : h_(detail::check(ndm_scope_begin_at(s.file, s.line, s.func, parent, name)))
    {
    }
    scope(const scope &) = delete;
    scope &operator=(const scope &) = delete;
    scope(scope &&) = delete;
    scope &operator=(scope &&) = delete;
    ~scope()
    {
        if (h_.id != 0)
            (void)ndm_scope_end_at(__FILE__, __LINE__, "ndm::scope::~scope", h_, 0, nullptr);
    }

    ndm_manager get() const noexcept { return h_; }
    operator ndm_manager() const noexcept { return h_; }
    /** Move a out of the scope now, to where the scope's end moves what it
     *  keeps (the scope's parent); returns the same owner. */
    array keep(array a, site s = site())
    {
        detail::check(ndm_scope_move_out_at(s.file, s.line, s.func, a.get()));
        return a;
    }
    /** End the scope now, reporting a failure. */
    ndm_status end(site s = site())
    {
        ndm_manager h = h_;
        h_ = ndm_manager{0};
        return h.id ? detail::check(ndm_scope_end_at(s.file, s.line, s.func, h, 0, nullptr))
                    : NDM_ALREADY;
    }

private:
    ndm_manager h_{0};
};

/* ---- factories (in manager m, or NDM_CURRENT_SCOPE) ------------------------------ */

using shape_t = std::initializer_list<int64_t>;

inline array empty(ndm_manager m, ndm_dtype t, shape_t shape, site s = site())
{
    return adopt(ndm_empty_at(s.file, s.line, s.func, m, t, (int)shape.size(), shape.begin()));
}
inline array zeros(ndm_manager m, ndm_dtype t, shape_t shape, site s = site())
{
    return adopt(ndm_zeros_at(s.file, s.line, s.func, m, t, (int)shape.size(), shape.begin()));
}
inline array ones(ndm_manager m, ndm_dtype t, shape_t shape, site s = site())
{
    return adopt(ndm_ones_at(s.file, s.line, s.func, m, t, (int)shape.size(), shape.begin()));
}
inline array full(ndm_manager m, ndm_dtype t, double value, shape_t shape, site s = site())
{
    return adopt(
        ndm_full_at(s.file, s.line, s.func, m, t, value, (int)shape.size(), shape.begin()));
}
inline array arange(ndm_manager m, ndm_dtype t, double start, double stop, double step = 1,
                    site s = site())
{
    return adopt(ndm_arange_at(s.file, s.line, s.func, m, t, start, stop, step));
}

namespace detail {
template <typename T> struct dtype_of;
template <> struct dtype_of<uint8_t> { static constexpr ndm_dtype value = NDM_U8; };
template <> struct dtype_of<int32_t> { static constexpr ndm_dtype value = NDM_I32; };
template <> struct dtype_of<int64_t> { static constexpr ndm_dtype value = NDM_I64; };
template <> struct dtype_of<float> { static constexpr ndm_dtype value = NDM_F32; };
template <> struct dtype_of<double> { static constexpr ndm_dtype value = NDM_F64; };
} // namespace detail

/** An array of T's dtype copied from values, in the given shape (by default
 *  one axis of values.size()). */
template <typename T>
array from(ndm_manager m, const std::vector<T> &values, std::vector<int64_t> shape = {},
           site s = site())
{
    if (shape.empty())
        shape.push_back((int64_t)values.size());
    return adopt(ndm_from_buffer_at(s.file, s.line, s.func, m, detail::dtype_of<T>::value,
                                    values.data(), (int)shape.size(), shape.data()));
}

/* ---- operators -------------------------------------------------------------------- */

namespace detail {
/* An operand that remembers where the expression is written (operators take
 * no extra arguments: the site comes with the conversion). */
struct lhs {
    const array &a;
    site s;
    lhs(const array &x, site where = site()) noexcept : a(x), s(where) {}
};
struct num {
    double v;
    site s;
    num(double x, site where = site()) noexcept : v(x), s(where) {}
};
} // namespace detail

#define NDM_HPP_BINARY_(OP, FN)                                                           \
    inline array operator OP(detail::lhs x, const array &y)                               \
    {                                                                                     \
        return adopt(FN##_to_at(x.s.file, x.s.line, x.s.func, NDM_OUTPUT_RULE, x.a, y));   \
    }                                                                                     \
    inline array operator OP(detail::lhs x, double y)                                     \
    {                                                                                     \
        return adopt(FN##_scalar_to_at(x.s.file, x.s.line, x.s.func, NDM_OUTPUT_RULE, x.a, \
                                       y));                                               \
    }
NDM_HPP_BINARY_(+, ndm_add)
NDM_HPP_BINARY_(-, ndm_sub)
NDM_HPP_BINARY_(*, ndm_mul)
NDM_HPP_BINARY_(/, ndm_div)
NDM_HPP_BINARY_(==, ndm_eq)
NDM_HPP_BINARY_(!=, ndm_ne)
NDM_HPP_BINARY_(<, ndm_lt)
NDM_HPP_BINARY_(<=, ndm_le)
NDM_HPP_BINARY_(>, ndm_gt)
NDM_HPP_BINARY_(>=, ndm_ge)
#undef NDM_HPP_BINARY_

/* A number on the left: the operation with its operands the other way round. */
#define NDM_HPP_LEFT_(OP, FN)                                                             \
    inline array operator OP(double x, detail::lhs y)                                     \
    {                                                                                     \
        return adopt(FN##_to_at(y.s.file, y.s.line, y.s.func, NDM_OUTPUT_RULE, y.a, x));   \
    }
NDM_HPP_LEFT_(+, ndm_add_scalar)
NDM_HPP_LEFT_(-, ndm_rsub_scalar)
NDM_HPP_LEFT_(*, ndm_mul_scalar)
NDM_HPP_LEFT_(/, ndm_rdiv_scalar)
NDM_HPP_LEFT_(==, ndm_eq_scalar)
NDM_HPP_LEFT_(!=, ndm_ne_scalar)
NDM_HPP_LEFT_(<, ndm_gt_scalar)
NDM_HPP_LEFT_(<=, ndm_ge_scalar)
NDM_HPP_LEFT_(>, ndm_lt_scalar)
NDM_HPP_LEFT_(>=, ndm_le_scalar)
#undef NDM_HPP_LEFT_

inline array operator-(detail::lhs x)
{
    return adopt(ndm_neg_to_at(x.s.file, x.s.line, x.s.func, NDM_OUTPUT_RULE, x.a));
}

/* In place: the site comes with the right operand. */
namespace detail {
struct rhs {
    const array &a;
    site s;
    rhs(const array &x, site where = site()) noexcept : a(x), s(where) {}
};
} // namespace detail
#define NDM_HPP_INPLACE_(OP, FN)                                                          \
    inline array &operator OP(array &x, detail::rhs y)                                    \
    {                                                                                     \
        detail::check(FN##_inplace_at(y.s.file, y.s.line, y.s.func, x, y.a));             \
        return x;                                                                         \
    }                                                                                     \
    inline array &operator OP(array &x, detail::num y)                                    \
    {                                                                                     \
        detail::check(FN##_scalar_inplace_at(y.s.file, y.s.line, y.s.func, x, y.v));      \
        return x;                                                                         \
    }
NDM_HPP_INPLACE_(+=, ndm_add)
NDM_HPP_INPLACE_(-=, ndm_sub)
NDM_HPP_INPLACE_(*=, ndm_mul)
NDM_HPP_INPLACE_(/=, ndm_div)
#undef NDM_HPP_INPLACE_

/* ---- functions -------------------------------------------------------------------- */

inline array matmul(const array &a, const array &b, site s = site())
{
    return adopt(ndm_matmul_to_at(s.file, s.line, s.func, NDM_OUTPUT_RULE, a, b));
}

#define NDM_HPP_UNARY_(NAME)                                                              \
    inline array NAME(const array &a, site s = site())                                    \
    {                                                                                     \
        return adopt(ndm_##NAME##_to_at(s.file, s.line, s.func, NDM_OUTPUT_RULE, a));     \
    }
NDM_HPP_UNARY_(abs)
NDM_HPP_UNARY_(exp)
NDM_HPP_UNARY_(log)
NDM_HPP_UNARY_(sqrt)
NDM_HPP_UNARY_(tanh)
NDM_HPP_UNARY_(sigmoid)
NDM_HPP_UNARY_(relu)
#undef NDM_HPP_UNARY_

/** Sum over axes (none given: every axis), keeping them as size 1 when
 *  keepdim. */
inline array sum(const array &a, std::initializer_list<int> axes = {}, bool keepdim = false,
                 site s = site())
{
    return adopt(ndm_sum_to_at(s.file, s.line, s.func, NDM_OUTPUT_RULE, a, keepdim,
                               axes.size() ? (int)axes.size() : -1, axes.size() ? axes.begin() : nullptr));
}
inline array mean(const array &a, std::initializer_list<int> axes = {}, bool keepdim = false,
                  site s = site())
{
    return adopt(ndm_mean_to_at(s.file, s.line, s.func, NDM_OUTPUT_RULE, a, keepdim,
                                axes.size() ? (int)axes.size() : -1,
                                axes.size() ? axes.begin() : nullptr));
}

/** Print a as ndm_array_print does (numpy's repr); a handle that names no
 *  array prints as <invalid array: the status's name>. */
inline std::ostream &operator<<(std::ostream &os, const array &a)
{
    int n = ndm_array_format(a, nullptr, 0);
    if (n < 0)
        return os << "<invalid array: " << ndm_status_name((ndm_status)n) << ">";
    std::string text((size_t)n + 1, '\0');
    n = ndm_array_format(a, &text[0], text.size());
    text.resize(n > 0 ? (size_t)n : 0);
    return os << text;
}

} // namespace ndm

#endif
