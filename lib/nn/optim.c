/* Optimizers: SGD with momentum and weight decay, Adam and AdamW. Their
 * state and scratch arrays are made once in the model, and a step is a
 * sequence of in-place operations, so steps allocate nothing and work on a
 * capped model. */
#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../manager/alloc/alloc.h"
#include "../manager/object.h"
#include "../manager/reclaim.h"
#include "../ops/autograd.h"
#include "../ops/inner.h"
#include "ndm/ndm.h"
#include "ndm/nn.h"
#include "nn.h"

typedef enum algo { SGD, ADAM } algo;

typedef struct optimizer {
    algo a;
    double lr, momentum, weight_decay, beta1, beta2, eps;
    bool decoupled;
    int64_t t; /* steps taken (Adam's bias correction) */
    int n;
    ndm_array *param, *grad;
    ndm_array *s1, *s2; /* SGD: velocity; Adam: first and second moments */
    ndm_array *tmp, *tmp2;
} optimizer;

static void opt_destroy(void *p)
{
    optimizer *o = p;
    free(o->param);
    free(o);
}

static const ndm__object_type opt_type = {
    .name = "optimizer",
    .ended = "freed",
    .destroy = opt_destroy,
    .later = true,
};

static optimizer *get(ndm_optimizer h, const char *api)
{
    return ndm__object_get(h.id, &opt_type, api, NDM__NO_SITE);
}

/* The optimizer over the n arrays of `params` (a module's parameters when
 * params is NULL and net given). */
static ndm_optimizer make(ndm__site site, const char *api, ndm_manager model, ndm_module net,
                          int n, const ndm_array *params, optimizer *o)
{
    if (!params)
        n = ndm_module_parameters(net, NULL, 0);
    else if (n < 0) {
        ndm__fail(NDM_E_INVALID, api, site, "a negative parameter count (%d)", n);
        n = NDM_E_INVALID;
    }
    if (n < 0) {
        free(o);
        return (ndm_optimizer){0};
    }
    /* one block: params, grads, and up to four arrays of state per parameter */
    o->param = ndm__calloc((size_t)(n ? n : 1) * 6, sizeof(ndm_array), NDM__INJ_OBJECT);
    if (!o->param) {
        free(o);
        ndm__fail(NDM_E_OOM, api, site, "no memory for an optimizer");
        return (ndm_optimizer){0};
    }
    o->n = n;
    o->grad = o->param + n;
    o->s1 = o->grad + n;
    o->s2 = o->s1 + n;
    o->tmp = o->s2 + n;
    o->tmp2 = o->tmp + n;
    if (params)
        memcpy(o->param, params, (size_t)n * sizeof *params);
    else
        ndm_module_parameters(net, o->param, n);
    for (int i = 0; i < n; i++) {
        if (!ndm_array_requires_grad(o->param[i])) {
            if (ndm_array_valid(o->param[i]))
                ndm__fail(NDM_E_INVALID, api, site,
                          "array %d of the list is not a parameter (ndm_requires_grad)", i);
            else
                ndm_array_ndim(o->param[i]); /* the handle's own error */
            goto fail;
        }
        /* the record's own shape: a parameter of any rank */
        ndm__view r;
        if (!ndm__view_of(o->param[i], &r, api, site))
            goto fail;
        int nd = r.t.ndim;
        const int64_t *shape = r.t.shape;
        ndm_dtype dt = r.t.dtype;
        /* the gradient handle is owned by the model too */
        o->grad[i] = ndm_grad_to_at(NDM__SITE_ARGS(site), model, o->param[i]);
        bool need_s1 = o->a == ADAM || o->momentum != 0;
        if (!o->grad[i].id ||
            (need_s1 && !(o->s1[i] = ndm_zeros_at(NDM__SITE_ARGS(site), model, dt, nd, shape)).id) ||
            (o->a == ADAM &&
             !(o->s2[i] = ndm_zeros_at(NDM__SITE_ARGS(site), model, dt, nd, shape)).id) ||
            !(o->tmp[i] = ndm_empty_at(NDM__SITE_ARGS(site), model, dt, nd, shape)).id ||
            (o->a == ADAM &&
             !(o->tmp2[i] = ndm_empty_at(NDM__SITE_ARGS(site), model, dt, nd, shape)).id))
            goto fail;
    }
    uint64_t id = ndm__object_new(&opt_type, model, o, site, api);
    if (!id)
        goto fail;
    return (ndm_optimizer){id};
fail:
    /* the arrays made so far stay in the model until it closes */
    opt_destroy(o);
    return (ndm_optimizer){0};
}

/* The rule for a rate, shared by the constructors, the setter and a load. */
static bool rate_ok(double v, bool positive)
{
    return isfinite(v) && (positive ? v > 0 : v >= 0);
}

static bool check_rate(double v, bool positive, const char *what, const char *api,
                       ndm__site site)
{
    if (rate_ok(v, positive))
        return true;
    ndm__fail(NDM_E_INVALID, api, site, "%s must be %s and finite (got %g)", what,
              positive ? "> 0" : ">= 0", v);
    return false;
}

static ndm_optimizer sgd(ndm__site site, ndm_manager model, ndm_module net, int n,
                         const ndm_array *params, double lr, double momentum, double weight_decay)
{
    if (!check_rate(lr, true, "lr", "ndm_sgd", site) ||
        !check_rate(momentum, false, "momentum", "ndm_sgd", site) ||
        !check_rate(weight_decay, false, "weight_decay", "ndm_sgd", site))
        return (ndm_optimizer){0};
    optimizer *o = ndm__calloc(1, sizeof *o, NDM__INJ_OBJECT);
    if (!o) {
        ndm__fail(NDM_E_OOM, "ndm_sgd", site, "no memory");
        return (ndm_optimizer){0};
    }
    *o = (optimizer){.a = SGD, .lr = lr, .momentum = momentum, .weight_decay = weight_decay};
    return make(site, "ndm_sgd", model, net, n, params, o);
}

NDM_API ndm_optimizer ndm_sgd_at(NDM_SITE_PARAMS, ndm_manager model, ndm_module net, double lr,
                                 double momentum, double weight_decay)
{
    NDM__ENTRY(__func__);
    return sgd(NDM__SITE, model, net, 0, NULL, lr, momentum, weight_decay);
}

NDM_API ndm_optimizer ndm_sgd_params_at(NDM_SITE_PARAMS, ndm_manager model, int n,
                                        const ndm_array *params, double lr, double momentum,
                                        double weight_decay)
{
    NDM__ENTRY(__func__);
    ndm__site site = NDM__SITE;
    if (n > 0 && !params) {
        ndm__fail(NDM_E_INVALID, "ndm_sgd", site, "params is NULL");
        return (ndm_optimizer){0};
    }
    static const ndm_array none[1];
    return sgd(site, model, (ndm_module){0}, n, params ? params : none, lr, momentum,
               weight_decay);
}

static ndm_optimizer adam(ndm__site site, ndm_manager model, ndm_module net, int n,
                          const ndm_array *params, double lr, double beta1, double beta2,
                          double eps, double weight_decay, bool decoupled)
{
    const char *api = decoupled ? "ndm_adamw" : "ndm_adam";
    if (!check_rate(lr, true, "lr", api, site) || !check_rate(eps, true, "eps", api, site) ||
        !check_rate(weight_decay, false, "weight_decay", api, site))
        return (ndm_optimizer){0};
    if (!(beta1 >= 0 && beta1 < 1 && beta2 >= 0 && beta2 < 1)) {
        ndm__fail(NDM_E_INVALID, api, site, "betas must be in [0, 1) (got %g, %g)", beta1, beta2);
        return (ndm_optimizer){0};
    }
    optimizer *o = ndm__calloc(1, sizeof *o, NDM__INJ_OBJECT);
    if (!o) {
        ndm__fail(NDM_E_OOM, api, site, "no memory");
        return (ndm_optimizer){0};
    }
    *o = (optimizer){.a = ADAM, .lr = lr, .beta1 = beta1, .beta2 = beta2, .eps = eps,
                     .weight_decay = weight_decay, .decoupled = decoupled};
    return make(site, api, model, net, n, params, o);
}

NDM_API ndm_optimizer ndm_adam_at(NDM_SITE_PARAMS, ndm_manager model, ndm_module net, double lr,
                                  double beta1, double beta2, double eps, double weight_decay,
                                  bool decoupled)
{
    NDM__ENTRY(__func__);
    return adam(NDM__SITE, model, net, 0, NULL, lr, beta1, beta2, eps, weight_decay, decoupled);
}

NDM_API ndm_optimizer ndm_adam_params_at(NDM_SITE_PARAMS, ndm_manager model, int n,
                                         const ndm_array *params, double lr, double beta1,
                                         double beta2, double eps, double weight_decay,
                                         bool decoupled)
{
    NDM__ENTRY(__func__);
    ndm__site site = NDM__SITE;
    if (n > 0 && !params) {
        ndm__fail(NDM_E_INVALID, decoupled ? "ndm_adamw" : "ndm_adam", site, "params is NULL");
        return (ndm_optimizer){0};
    }
    static const ndm_array none[1];
    return adam(site, model, (ndm_module){0}, n, params ? params : none, lr, beta1, beta2, eps,
                weight_decay, decoupled);
}

/* Parameter i's gradient now: data-parallel training makes it a view of
 * a communication bucket after the optimizer was made. */
static ndm_array grad_of(optimizer *o, int i)
{
    ndm_array g = ndm__ag_grad_of(o->param[i]);
    return g.id ? g : o->grad[i];
}

/* tmp = g + wd * w (L2 decay folded into the gradient); returns the array to use. */
static ndm_status l2(optimizer *o, int i, ndm_array *src)
{
    *src = grad_of(o, i);
    if (o->weight_decay == 0 || (o->a == ADAM && o->decoupled))
        return NDM_OK;
    ndm_status st;
    if ((st = ndm_copy_into(o->tmp[i], o->param[i])) < 0 ||
        (st = ndm_mul_scalar_(o->tmp[i], o->weight_decay)) < 0 ||
        (st = ndm_add_(o->tmp[i], *src)) < 0)
        return st;
    *src = o->tmp[i];
    return NDM_OK;
}

/* The whole update of parameter i in one pass (the backend's fused kernel,
 * the same arithmetic as the sequences below); false when the backend or
 * the layouts do not allow it and the sequence must run. */
static bool fused_step(optimizer *o, int i)
{
    ndm__optim_args a = {.kind = o->a == SGD ? 0 : 1, .lr = o->lr, .wd = o->weight_decay};
    a.l2 = o->weight_decay != 0 && !(o->a == ADAM && o->decoupled);
    if (o->a == SGD) {
        a.momentum = o->momentum;
    } else {
        double bc1 = 1 - pow(o->beta1, (double)o->t), bc2 = 1 - pow(o->beta2, (double)o->t);
        a.decoupled = o->decoupled && o->weight_decay != 0;
        a.decay = 1 - o->lr * o->weight_decay;
        a.b1 = o->beta1;
        a.one_b1 = 1 - o->beta1;
        a.b2 = o->beta2;
        a.one_b2 = 1 - o->beta2;
        a.inv_bc2 = 1 / bc2;
        a.eps = o->eps;
        a.lr_bc1 = o->lr / bc1;
    }
    ndm_array m = o->a == ADAM || o->momentum != 0 ? o->s1[i] : (ndm_array){0};
    ndm_array v = o->a == ADAM ? o->s2[i] : (ndm_array){0};
    return ndm__optim_fused(&a, o->param[i], grad_of(o, i), m, v) == NDM_OK;
}

/* The composed updates, from gradient g (with L2 decay when asked). */
static ndm_status sgd_step(optimizer *o, int i, ndm_array g)
{
    ndm_status st;
    ndm_array upd = g;
    if (o->momentum != 0) {
        if ((st = ndm_mul_scalar_(o->s1[i], o->momentum)) < 0 || (st = ndm_add_(o->s1[i], g)) < 0)
            return st;
        upd = o->s1[i];
    }
    if ((upd.id != o->tmp[i].id && (st = ndm_copy_into(o->tmp[i], upd)) < 0) ||
        (st = ndm_mul_scalar_(o->tmp[i], o->lr)) < 0)
        return st;
    return ndm_sub_(o->param[i], o->tmp[i]);
}

static ndm_status adam_step(optimizer *o, int i, ndm_array g)
{
    ndm_status st;
    double bc1 = 1 - pow(o->beta1, (double)o->t), bc2 = 1 - pow(o->beta2, (double)o->t);
    if (o->decoupled && o->weight_decay != 0 &&
        (st = ndm_mul_scalar_(o->param[i], 1 - o->lr * o->weight_decay)) < 0)
        return st;
    ndm_array m = o->s1[i], v = o->s2[i], t2 = o->tmp2[i], t1 = o->tmp[i];
    /* m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2 */
    if ((st = ndm_mul_scalar_(m, o->beta1)) < 0 || (st = ndm_copy_into(t2, g)) < 0 ||
        (st = ndm_mul_scalar_(t2, 1 - o->beta1)) < 0 || (st = ndm_add_(m, t2)) < 0 ||
        (st = ndm_mul_scalar_(v, o->beta2)) < 0 || (st = ndm_copy_into(t2, g)) < 0 ||
        (st = ndm_mul_(t2, g)) < 0 || (st = ndm_mul_scalar_(t2, 1 - o->beta2)) < 0 ||
        (st = ndm_add_(v, t2)) < 0)
        return st;
    /* w -= lr / bc1 * m / (sqrt(v / bc2) + eps) */
    if ((st = ndm_copy_into(t2, v)) < 0 || (st = ndm_mul_scalar_(t2, 1 / bc2)) < 0 ||
        (st = ndm_sqrt_(t2)) < 0 || (st = ndm_add_scalar_(t2, o->eps)) < 0 ||
        (st = ndm_copy_into(t1, m)) < 0 || (st = ndm_div_(t1, t2)) < 0 ||
        (st = ndm_mul_scalar_(t1, o->lr / bc1)) < 0)
        return st;
    return ndm_sub_(o->param[i], t1);
}

/* Count a step, refusing one past NDM_OPTIMIZER_MAX_STEPS: Adam's bias
 * correction reads the count as a double, exact up to there, and the
 * counter can then never overflow. */
static bool count_step(optimizer *o, const char *api)
{
    if (o->t >= NDM_OPTIMIZER_MAX_STEPS) {
        ndm__fail(NDM_E_OVERFLOW, api, NDM__NO_SITE,
                  "the optimizer has taken %" PRId64 " steps, the most it counts", o->t);
        return false;
    }
    o->t++;
    return true;
}

/* The updates of parameters idx[0..n) (idx NULL: 0 .. n-1) by the
 * optimizer's rule, stopping at the first failure. */
static ndm_status step_params(optimizer *o, const int *idx, int n)
{
    for (int k = 0; k < n; k++) {
        int i = idx ? idx[k] : k;
        if (i < 0 || i >= o->n)
            return ndm__fail(NDM_E_INTERNAL, "ndm_optimizer_step", NDM__NO_SITE,
                             "parameter index %d of %d", i, o->n);
        if (fused_step(o, i))
            continue;
        ndm_array g;
        ndm_status st = l2(o, i, &g);
        if (st == NDM_OK)
            st = o->a == SGD ? sgd_step(o, i, g) : adam_step(o, i, g);
        if (st < 0)
            return st;
    }
    return NDM_OK;
}

NDM_API ndm_status ndm_optimizer_step(ndm_optimizer h)
{
    NDM__OP_GUARD();
    optimizer *o = get(h, __func__);
    if (!o)
        return ndm_last_status();
    if (!count_step(o, __func__))
        return NDM_E_OVERFLOW;
    return step_params(o, NULL, o->n);
}

int ndm__optimizer_count(ndm_optimizer h)
{
    optimizer *o = get(h, "ndm_optimizer_step");
    return o ? o->n : ndm_last_status();
}

int ndm__optimizer_find(ndm_optimizer h, ndm_array param)
{
    optimizer *o = get(h, "ndm_optimizer_step");
    for (int i = 0; o && i < o->n; i++)
        if (o->param[i].id == param.id)
            return i;
    return -1;
}

ndm_status ndm__optimizer_step_some(ndm_optimizer h, const int *idx, int n, bool start)
{
    optimizer *o = get(h, "ndm_optimizer_step");
    if (!o)
        return ndm_last_status();
    /* each parameter's update reads only its own state: the subsets of a
     * step give the bits of the whole step, in any order */
    if (start && !count_step(o, "ndm_optimizer_step"))
        return NDM_E_OVERFLOW;
    return step_params(o, idx, n);
}

NDM_API ndm_status ndm_optimizer_zero_grad(ndm_optimizer h)
{
    NDM__OP_GUARD();
    optimizer *o = get(h, __func__);
    if (!o)
        return ndm_last_status();
    return ndm_zero_grad((size_t)o->n, o->param);
}

NDM_API ndm_status ndm_optimizer_set_lr(ndm_optimizer h, double lr)
{
    optimizer *o = get(h, __func__);
    if (!o)
        return ndm_last_status();
    if (!check_rate(lr, true, "lr", __func__, NDM__NO_SITE))
        return NDM_E_INVALID;
    o->lr = lr;
    return NDM_OK;
}

NDM_API double ndm_optimizer_lr(ndm_optimizer h)
{
    optimizer *o = get(h, __func__);
    return o ? o->lr : -1.0;
}

NDM_API double ndm_lr_step(double base, int64_t epoch, int64_t step_size, double gamma)
{
    if (step_size < 1 || epoch < 0)
        return base;
    return base * pow(gamma, (double)(epoch / step_size));
}

NDM_API double ndm_lr_cosine(double base, double min_lr, int64_t t, int64_t total)
{
    if (total < 1)
        return base;
    if (t < 0)
        t = 0;
    if (t > total)
        t = total;
    return min_lr + 0.5 * (base - min_lr) * (1 + cos(M_PI * (double)t / (double)total));
}

/* ---- state: save and restore ------------------------------------------------------ */

static const char *algo_name(const optimizer *o)
{
    return o->a == SGD ? "sgd" : o->decoupled ? "adamw" : "adam";
}

/* The state arrays of o with PyTorch's names ("state.3.exp_avg"); returns
 * how many, or -1 out of memory. names[k] is malloc'd. */
static int state_list(const optimizer *o, char **names, ndm_array *arrays)
{
    int k = 0;
    for (int i = 0; i < o->n; i++) {
        for (int which = 0; which < 2; which++) {
            ndm_array a = which ? o->s2[i] : o->s1[i];
            if (!a.id)
                continue;
            const char *what = o->a == SGD ? "momentum_buffer" : which ? "exp_avg_sq" : "exp_avg";
            char buf[64];
            snprintf(buf, sizeof buf, "state.%d.%s", i, what);
            if (!(names[k] = strdup(buf)))
                return -1;
            arrays[k++] = a;
        }
    }
    return k;
}

static void names_free(char **names, size_t n)
{
    for (size_t i = 0; names && i < n; i++)
        free(names[i]);
    free(names);
}

NDM_API ndm_status ndm_optimizer_save_at(NDM_SITE_PARAMS, ndm_optimizer h, const char *path)
{
    NDM__ENTRY(__func__);
    ndm__site site = NDM__SITE;
    const char *api = "ndm_optimizer_save";
    optimizer *o = ndm__object_get(h.id, &opt_type, api, site);
    if (!o)
        return ndm_last_status();
    size_t cap = (size_t)o->n * 2 + 1;
    char **names = calloc(cap, sizeof *names);
    ndm_array *arrays = calloc(cap, sizeof *arrays);
    int k = names && arrays ? state_list(o, names, arrays) : -1;
    ndm_status st;
    if (k < 0) {
        st = ndm__fail(NDM_E_OOM, api, site, "no memory");
    } else {
        char step[32], lr[32], count[32];
        snprintf(step, sizeof step, "%" PRId64, o->t);
        snprintf(lr, sizeof lr, "%.17g", o->lr);
        snprintf(count, sizeof count, "%d", o->n);
        const char *keys[] = {"optimizer", "step", "lr", "params"};
        const char *values[] = {algo_name(o), step, lr, count};
        ndm_named_arrays set = {(size_t)k, (const char *const *)names, arrays, 4, keys, values};
        st = ndm_safetensors_save_at(NDM__SITE_ARGS(site), path, &set);
    }
    names_free(names, cap);
    free(arrays);
    return st;
}

/* Does a match b's rank and shape (any rank)? */
static bool same_shape(ndm_array a, ndm_array b)
{
    ndm__view ra, rb;
    return ndm__view_peek(a, &ra) && ndm__view_peek(b, &rb) && ra.t.ndim == rb.t.ndim &&
           !memcmp(ra.t.shape, rb.t.shape, (size_t)ra.t.ndim * sizeof *ra.t.shape);
}

/* A metadata field of an optimizer state as a number: the whole text, an
 * int64 when `integer`, else a double, in its type's range (no blanks, no
 * trailing bytes, no overflow). False with NDM_E_FORMAT naming the field. */
static bool meta_number(const char *text, const char *key, bool integer, int64_t *i, double *d,
                        const char *path, const char *api, ndm__site site)
{
    _Static_assert(sizeof(long long) == sizeof(int64_t), "strtoll reads an int64");
    char *end = NULL;
    bool ok = *text && !isspace((unsigned char)*text);
    errno = 0;
    if (ok && integer)
        *i = strtoll(text, &end, 10);
    else if (ok)
        *d = strtod(text, &end);
    if (ok && end != text && *end == '\0' && errno == 0)
        return true;
    ndm__fail(NDM_E_FORMAT, api, site, "'%s': its %s metadata is not %s", path, key,
              integer ? "a whole number in the range of int64"
                      : "a number in the range of a double");
    return false;
}

NDM_API ndm_status ndm_optimizer_load_at(NDM_SITE_PARAMS, ndm_optimizer h, const char *path)
{
    NDM__ENTRY(__func__);
    ndm__site site = NDM__SITE;
    const char *api = "ndm_optimizer_load";
    optimizer *o = ndm__object_get(h.id, &opt_type, api, site);
    if (!o)
        return ndm_last_status();
    ndm_manager tmp = ndm_manager_new_at(NDM__SITE_ARGS(site), ndm_system(), "checkpoint");
    if (!tmp.id)
        return ndm_last_status();
    ndm_status st = NDM_OK;
    size_t cap = (size_t)o->n * 2 + 1;
    char **names = calloc(cap, sizeof *names);
    ndm_array *arrays = calloc(cap, sizeof *arrays);
    int64_t *found = calloc(cap, sizeof *found);
    int k = names && arrays && found ? state_list(o, names, arrays) : -1;
    const ndm_named_arrays *set = NULL;
    if (k < 0)
        st = ndm__fail(NDM_E_OOM, api, site, "no memory");
    else if (!(set = ndm_safetensors_load_at(NDM__SITE_ARGS(site), tmp, path, NDM_LOAD_COPY)))
        st = ndm_last_status();
    /* everything is checked before anything is written */
    const char *kind = set ? ndm_named_arrays_meta(set, "optimizer") : NULL;
    const char *step = set ? ndm_named_arrays_meta(set, "step") : NULL;
    const char *lr = set ? ndm_named_arrays_meta(set, "lr") : NULL;
    const char *count = set ? ndm_named_arrays_meta(set, "params") : NULL;
    if (st == NDM_OK && (!kind || !step || !lr || !count))
        st = ndm__fail(NDM_E_FORMAT, api, site,
                       "'%s' is not an optimizer state (optimizer, step, lr and params "
                       "metadata expected)",
                       path);
    int64_t t = 0, n = 0;
    double rate = 0;
    if (st == NDM_OK && (!meta_number(step, "step", true, &t, NULL, path, api, site) ||
                         !meta_number(lr, "lr", false, NULL, &rate, path, api, site) ||
                         !meta_number(count, "params", true, &n, NULL, path, api, site)))
        st = NDM_E_FORMAT;
    if (st == NDM_OK && (t < 0 || t > NDM_OPTIMIZER_MAX_STEPS))
        st = ndm__fail(NDM_E_INVALID, api, site,
                       "'%s': its step metadata %" PRId64 " is outside [0, %" PRId64 "]", path,
                       t, (int64_t)NDM_OPTIMIZER_MAX_STEPS);
    /* the rule of ndm_optimizer_set_lr() */
    if (st == NDM_OK && !rate_ok(rate, true))
        st = ndm__fail(NDM_E_INVALID, api, site,
                       "'%s': its lr metadata must be > 0 and finite (got %g)", path, rate);
    if (st == NDM_OK && (strcmp(kind, algo_name(o)) || n != o->n))
        st = ndm__fail(NDM_E_INVALID, api, site,
                       "'%s' holds the state of %s over %" PRId64
                       " parameters, not of %s over %d",
                       path, kind, n, algo_name(o), o->n);
    for (int i = 0; st == NDM_OK && i < k; i++) {
        found[i] = -1;
        for (size_t j = 0; j < set->count; j++)
            if (!strcmp(set->names[j], names[i]))
                found[i] = (int64_t)j;
        if (found[i] < 0)
            st = ndm__fail(NDM_E_FORMAT, api, site, "'%s' lacks '%s'", path, names[i]);
        else if (!same_shape(arrays[i], set->arrays[found[i]]))
            st = ndm__fail(NDM_E_SHAPE, api, site, "'%s' in '%s' has another shape", names[i],
                           path);
    }
    if (st == NDM_OK && set->count != (size_t)k)
        st = ndm__fail(NDM_E_FORMAT, api, site, "'%s' holds %zu tensors, %d expected", path,
                       set->count, k);
    /* Each tensor is first brought to its state array's device and dtype
     * in `tmp`, so that a failure there (memory, a transfer) comes before
     * the first write; what remains are copies that cannot fail. */
    ndm_array *staged = st == NDM_OK ? calloc(cap, sizeof *staged) : NULL;
    if (st == NDM_OK && !staged)
        st = ndm__fail(NDM_E_OOM, api, site, "no memory");
    for (int i = 0; st == NDM_OK && i < k; i++) {
        ndm_array v = set->arrays[found[i]];
        ndm_device dev = ndm_array_device(arrays[i]);
        ndm_dtype dt = ndm_array_dtype(arrays[i]);
        if (v.id && !ndm_device_eq(ndm_array_device(v), dev))
            v = ndm_to_to_at(NDM__SITE_ARGS(site), tmp, v, dev);
        if (v.id && ndm_array_dtype(v) != dt)
            v = ndm_astype_to_at(NDM__SITE_ARGS(site), tmp, v, dt);
        if (!(staged[i] = v).id)
            st = ndm_last_status();
    }
    for (int i = 0; st == NDM_OK && i < k; i++)
        st = ndm_copy_into_at(NDM__SITE_ARGS(site), arrays[i], staged[i]);
    if (st == NDM_OK) {
        o->t = t;
        o->lr = rate;
    }
    free(staged);
    names_free(names, cap);
    free(arrays);
    free(found);
    ndm_status cs = ndm_manager_close_at(NDM__SITE_ARGS(site), tmp);
    (void)cs;
    return st;
}
