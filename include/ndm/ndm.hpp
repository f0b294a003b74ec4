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
 * as remainder and xor): ndm::matmul(a, b), or a.matmul(b).
 *
 * Modules. ndm::make_module(model, "Block", lambda) makes a user module
 * (ndm_module_new) whose forward pass is the lambda, given the module and
 * its inputs; ndm::module is a handle (the model owns the module) that runs
 * the forward pass when called, net(x) or net({x, mask}), and registers
 * parameters, buffers and children. An ndm::error thrown inside the lambda
 * comes out of the call with its status and message (the lambda's line);
 * another exception is thrown again, as itself, by the call on the same
 * thread. */
#ifndef NDM_NDM_HPP
#define NDM_NDM_HPP

#include <cmath>
#include <cstdint>
#include <exception>
#include <functional>
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
inline ndm_module check(ndm_module m)
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

/* ---- modules ------------------------------------------------------------------------ */

class module;
/** A forward pass written as a lambda: the module itself and its inputs
 *  (owners of aliases of the caller's arrays, released when it returns),
 *  returning the result (its owner hands it over). */
using forward_fn = std::function<array(const module &self, const std::vector<array> &inputs)>;

/** A module handle (not an owner: a module lives until its model closes,
 *  as in C). Calling it runs ndm_forward(); the registration functions
 *  throw ndm::error on a refusal. */
class module {
public:
    module() noexcept = default;
    explicit module(ndm_module m) noexcept : h_(m) {}
    ndm_module get() const noexcept { return h_; }
    operator ndm_module() const noexcept { return h_; }
    /** Whether the handle names a live module. */
    bool ok() const noexcept { return h_.id != 0 && ndm_module_valid(h_); }

    /** ndm_forward() on x. */
    array operator()(const array &x, site s = site()) const
    {
        return result_(ndm_forward_to_at(s.file, s.line, s.func, NDM_OUTPUT_RULE, h_, x.get()));
    }
    /** ndm_forward_n() on several inputs (an empty owner: an input left out). */
    array operator()(std::initializer_list<std::reference_wrapper<const array>> xs,
                     site s = site()) const
    {
        std::vector<ndm_array> in;
        for (const array &x : xs)
            in.push_back(x.get());
        return result_(ndm_forward_n_to_at(s.file, s.line, s.func, NDM_OUTPUT_RULE, h_,
                                           (int)in.size(), in.data()));
    }
    /** The child `name` ("blocks.3.attn" through dots). */
    module child(const char *name, site s = site()) const
    {
        return module(detail::check(ndm_module_get_child_at(s.file, s.line, s.func, h_, name)));
    }
    /** An alias of the array m holds under `name` ("weight", "fc1.bias"), by
     *  the output rule (inside a forward pass: the pass's scope). */
    array param(const char *name, site s = site()) const
    {
        ndm_array a = detail::check(ndm_module_get_array_at(s.file, s.line, s.func, h_, name));
        return adopt(ndm_alias_to_at(s.file, s.line, s.func, NDM_OUTPUT_RULE, a));
    }
    /** ndm_module_register_parameter(): the owner hands its array to the
     *  module (moved in: std::move(w), or a temporary), which the model then
     *  keeps; on a refusal the owner given keeps it and releases it. */
    void register_parameter(const char *name, array a, site s = site()) const
    {
        if (detail::check(ndm_module_register_parameter_at(s.file, s.line, s.func, h_, name,
                                                           a.get())) >= 0)
            (void)a.release();
    }
    /** ndm_module_register_buffer(), the array handed over likewise. */
    void register_buffer(const char *name, array a, site s = site()) const
    {
        if (detail::check(ndm_module_register_buffer_at(s.file, s.line, s.func, h_, name,
                                                        a.get())) >= 0)
            (void)a.release();
    }
    void register_child(const char *name, ndm_module c, site s = site()) const
    {
        detail::check(ndm_module_register_child_at(s.file, s.line, s.func, h_, name, c));
    }
    /** ndm_module_tie(): the parameter `name` becomes the array of `to`
     *  (weight tying, "head.weight" to "tok_emb.weight"). */
    void tie(const char *name, const char *to, site s = site()) const
    {
        detail::check(ndm_module_tie_at(s.file, s.line, s.func, h_, name, to));
    }
    /** ndm_module_describe() as a string. */
    std::string describe() const
    {
        int n = ndm_module_describe(h_, nullptr, 0);
        if (n < 0)
            return std::string();
        std::string text((size_t)n + 1, '\0');
        (void)ndm_module_describe(h_, &text[0], text.size());
        text.resize((size_t)n);
        return text;
    }
    /** The qualified name ("blocks.3.attn"; "" for a root). */
    std::string name() const
    {
        char buf[256];
        int n = ndm_module_name(h_, buf, sizeof buf);
        return n < 0 ? std::string() : std::string(buf, (size_t)n < sizeof buf ? (size_t)n : 0);
    }

private:
    static array result_(ndm_array y);
    ndm_module h_{0};
};

namespace detail {
#if NDM_HPP_THROWS
/* An exception other than ndm::error thrown by a forward lambda: it cannot
 * cross the C library, so it waits here and module's call throws it again
 * on the same thread. */
inline thread_local std::exception_ptr forward_pending;
#endif

inline ndm_array forward_trampoline(ndm_module self, int n, const ndm_array *in, void *ud)
{
    const forward_fn &fn = *static_cast<const forward_fn *>(ud);
#if NDM_HPP_THROWS
    try {
#endif
        std::vector<array> inputs;
        inputs.reserve((size_t)n);
        for (int i = 0; i < n; i++)
            inputs.emplace_back(in[i].id ? ndm_alias_to_at(__FILE__, __LINE__, "ndm::module",
                                                           NDM_OUTPUT_RULE, in[i])
                                         : ndm_array{0});
        return fn(module(self), inputs).release();
#if NDM_HPP_THROWS
    } catch (const error &) {
        return ndm_array{0}; /* its status and message are the thread's last error */
    } catch (...) {
        forward_pending = std::current_exception();
        return ndm_array{0};
    }
#endif
}

inline void forward_destroy(void *ud) { delete static_cast<forward_fn *>(ud); }
} // namespace detail

inline array module::result_(ndm_array y)
{
#if NDM_HPP_THROWS
    if (y.id == 0 && detail::forward_pending) {
        std::exception_ptr e = detail::forward_pending;
        detail::forward_pending = nullptr;
        std::rethrow_exception(e);
    }
#endif
    return adopt(y);
}

/** A user module whose forward pass is `fn` (ndm_module_new(): owned by
 *  model; fn is kept until the module dies). name: its class name in
 *  descriptions ("Block"). */
inline module make_module(ndm_manager model, const char *name, forward_fn fn, site s = site())
{
    ndm_module_type t{};
    t.name = name;
    t.forward = detail::forward_trampoline;
    t.destroy = detail::forward_destroy;
    return module(detail::check(
        ndm_module_new_at(s.file, s.line, s.func, model, &t, new forward_fn(std::move(fn)))));
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
