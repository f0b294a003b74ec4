/* Modules: what every layer shares (the object handle, named parameters and
 * state, children, train/eval, ndm_forward's scope); each layer's own part
 * is its ndm__module_type, in layer_*.c. ndm_forward runs a module inside a
 * scope so that temporaries (views of the parameters included) never touch
 * the model. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../manager/alloc/alloc.h"
#include "../manager/object.h"
#include "../manager/reclaim.h"
#include "../ops/inner.h"
#include "module.h"
#include "ndm/ndm.h"
#include "ndm/nn.h"
#include "nn.h"

/* ---- the object ------------------------------------------------------------------ */

static void module_destroy(void *p)
{
    ndm__module *m = p;
    if (m->type->destroy)
        m->type->destroy(m);
    free(m->children);
    free(m->params.a);
    free(m->params.names);
    free(m->state.a);
    free(m->state.names);
    free(m);
}

static const ndm__object_type module_object = {
    .name = "module",
    .ended = "freed",
    .destroy = module_destroy,
    .later = true,
};

ndm__module *ndm__module_of(ndm_module h, const char *api, ndm__site site)
{
    return ndm__object_get(h.id, &module_object, api, site);
}

/* The layer's data follows the record, aligned for any type. */
#define DATA_OFFSET                                                                          \
    ((sizeof(ndm__module) + _Alignof(max_align_t) - 1) / _Alignof(max_align_t) *             \
     _Alignof(max_align_t))

bool ndm__nn_model_ok(ndm_manager model, const char *api, ndm__site site)
{
    return ndm__require_manager(model, api, site);
}

ndm__module *ndm__module_new(const ndm__module_type *t, ndm_manager model, const char *api,
                             ndm__site site)
{
    if (!ndm__nn_model_ok(model, api, site))
        return NULL;
    ndm__module *m = ndm__calloc(1, DATA_OFFSET + t->size, NDM__INJ_OBJECT);
    if (!m) {
        ndm__fail(NDM_E_OOM, api, site, "no memory for a module");
        return NULL;
    }
    m->type = t;
    m->data = t->size ? (char *)m + DATA_OFFSET : NULL;
    m->training = true;
    return m;
}

ndm_module ndm__module_finish(ndm__module *m, ndm_manager model, const char *api, ndm__site site)
{
    uint64_t id = ndm__object_new(&module_object, model, m, site, api);
    if (!id) {
        module_destroy(m);
        return (ndm_module){0};
    }
    return (ndm_module){id};
}

ndm_module ndm__module_plain(const ndm__module_type *t, ndm_manager model, const char *api,
                             ndm__site site)
{
    ndm__module *m = ndm__module_new(t, model, api, site);
    return m ? ndm__module_finish(m, model, api, site) : (ndm_module){0};
}

size_t ndm__module_describe_name(const ndm__module *m, char *buf, size_t n, size_t len)
{
    return ndm__module_put(buf, n, len, "%s", m->type->name);
}

ndm_module ndm__module_abandon(ndm__module *m, const char *api, ndm__site site)
{
    if (ndm_last_status() == NDM_OK)
        ndm__fail(NDM_E_OOM, api, site, "no memory");
    module_destroy(m);
    return (ndm_module){0};
}

/* ---- named arrays ------------------------------------------------------------------ */

static bool list_add(ndm__named_list *l, const char *name, ndm_array a)
{
    ndm_array *p = ndm__realloc(l->a, (size_t)(l->n + 1) * sizeof *p, NDM__INJ_OBJECT);
    if (!p)
        return false;
    l->a = p;
    char(*n)[NDM__MODULE_NAME_MAX] =
        ndm__realloc(l->names, (size_t)(l->n + 1) * sizeof *n, NDM__INJ_OBJECT);
    if (!n)
        return false;
    l->names = n;
    snprintf(l->names[l->n], NDM__MODULE_NAME_MAX, "%s", name);
    l->a[l->n++] = a;
    return true;
}

/* A parameter is part of the state too (checkpoints save both). */
bool ndm__module_add_param(ndm__module *m, const char *name, ndm_array a)
{
    return list_add(&m->params, name, a) && list_add(&m->state, name, a);
}

bool ndm__module_add_buffer(ndm__module *m, const char *name, ndm_array a)
{
    return list_add(&m->state, name, a);
}

/* The child's parameters and state under "name.", as PyTorch composes the
 * names of nested modules. */
bool ndm__module_add_child(ndm__module *m, const char *name, ndm_module child)
{
    ndm__module *c = ndm__module_of(child, "ndm__module_add_child", NDM__NO_SITE);
    if (!c)
        return false;
    ndm_module *k = ndm__realloc(m->children, (size_t)(m->nchildren + 1) * sizeof *k,
                                 NDM__INJ_OBJECT);
    if (!k)
        return false;
    m->children = k;
    m->children[m->nchildren++] = child;
    for (int pass = 0; pass < 2; pass++) {
        const ndm__named_list *from = pass ? &c->state : &c->params;
        ndm__named_list *to = pass ? &m->state : &m->params;
        for (int i = 0; i < from->n; i++) {
            char full[NDM__MODULE_NAME_MAX];
            snprintf(full, sizeof full, "%s.%s", name, from->names[i]);
            if (!list_add(to, full, from->a[i]))
                return false;
        }
    }
    return true;
}

size_t ndm__module_put(char *buf, size_t n, size_t len, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(buf + (len < n ? len : n), len < n ? n - len : 0, fmt, ap);
    va_end(ap);
    return len + (k > 0 ? (size_t)k : 0);
}

/* ---- helpers of the layers -------------------------------------------------------- */

/* Built with gradients paused on this thread (ndm_no_grad_begin): an
 * inference model, whose parameters get no gradient arrays. */
bool ndm__nn_grads_wanted(void)
{
    return !ndm__ag_paused();
}

ndm_array ndm__nn_param(ndm__site site, ndm_manager model, int ndim, const int64_t *shape,
                        ndm_rng *rng, bool kaiming)
{
    ndm_array a = kaiming ? ndm_empty_at(NDM__SITE_ARGS(site), model, NDM_F32, ndim, shape)
                          : ndm_zeros_at(NDM__SITE_ARGS(site), model, NDM_F32, ndim, shape);
    if (!a.id)
        return a;
    if ((kaiming && ndm_init_kaiming_uniform_inplace_at(NDM__SITE_ARGS(site), a, rng) < 0) ||
        (ndm__nn_grads_wanted() && ndm_requires_grad_at(NDM__SITE_ARGS(site), a) < 0)) {
        ndm__discard(a);
        return NDM_NULL_ARRAY;
    }
    return a;
}

ndm_array ndm__nn_filled(ndm__site site, ndm_manager model, ndm_dtype dt, int ndim,
                         const int64_t *shape, double value, bool param)
{
    ndm_array a = ndm_full_at(NDM__SITE_ARGS(site), model, dt, value, ndim, shape);
    if (a.id && param && ndm__nn_grads_wanted() &&
        ndm_requires_grad_at(NDM__SITE_ARGS(site), a) < 0) {
        ndm__discard(a);
        return NDM_NULL_ARRAY;
    }
    return a;
}

int64_t *ndm__nn_shape(ndm_array x, int64_t small[16], int *ndim, const char *api,
                       ndm__site site)
{
    int nd = ndm_array_ndim(x);
    if (nd < 0) {
        ndm__fail(ndm_last_status() < 0 ? ndm_last_status() : NDM_E_INVALID, api, site,
                  "the input is not a live array");
        return NULL;
    }
    int64_t *shape = nd <= 16 ? small : malloc((size_t)nd * sizeof *shape);
    if (!shape) {
        ndm__fail(NDM_E_OOM, api, site, "no memory for the shape of a rank-%d input", nd);
        return NULL;
    }
    if (ndm_array_shape(x, shape, nd > 16 ? nd : 16) != nd) {
        if (shape != small)
            free(shape);
        ndm__fail(NDM_E_INVALID, api, site, "the input is not a live array");
        return NULL;
    }
    *ndim = nd;
    return shape;
}

/* ---- initialisation ------------------------------------------------------------- */

static ndm_status fans(ndm_array a, const char *api, ndm__site site, double *fan_in,
                       double *fan_out)
{
    int nd = ndm_array_ndim(a);
    int64_t shape[16];
    if (nd < 1 || nd > 16 || ndm_array_shape(a, shape, 16) < 0)
        return ndm__fail(nd < 0 ? ndm_last_status() : NDM_E_SHAPE, api, site,
                         "initialisation needs an array of rank 1 to 16");
    double rf = 1;
    for (int i = 2; i < nd; i++)
        rf *= (double)shape[i];
    *fan_in = nd > 1 ? (double)shape[1] * rf : (double)shape[0];
    *fan_out = (double)shape[0] * rf;
    if (*fan_in <= 0)
        return ndm__fail(NDM_E_SHAPE, api, site, "fan-in is 0");
    return NDM_OK;
}

/* U(-b, b) with PyTorch's bound: Kaiming's (gain sqrt(2)) or Xavier's. */
static ndm_status init_uniform(ndm__site site, const char *api, ndm_array a, ndm_rng *rng,
                               bool xavier)
{
    double fi = 0, fo = 0;
    ndm_status st = fans(a, api, site, &fi, &fo);
    if (st < 0)
        return st;
    double b = xavier ? sqrt(6.0 / (fi + fo)) : sqrt(2.0) * sqrt(3.0 / fi);
    return ndm_uniform_inplace_at(NDM__SITE_ARGS(site), a, rng, -b, b);
}

NDM_API ndm_status ndm_init_kaiming_uniform_inplace_at(NDM_SITE_PARAMS, ndm_array a, ndm_rng *rng)
{
    return init_uniform(NDM__SITE, "ndm_init_kaiming_uniform_", a, rng, false);
}

NDM_API ndm_status ndm_init_xavier_uniform_inplace_at(NDM_SITE_PARAMS, ndm_array a, ndm_rng *rng)
{
    return init_uniform(NDM__SITE, "ndm_init_xavier_uniform_", a, rng, true);
}

/* ---- every module ------------------------------------------------------------------ */

NDM_API ndm_array ndm_forward_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_module mh, ndm_array x)
{
    NDM__OP_GUARD();
    ndm__site site = NDM__SITE;
    const char *api = "ndm_forward";
    NDM__CALL_FRAME(api, site);
    ndm__module *m = ndm__module_of(mh, api, site);
    ndm__view vx;
    ndm_manager dst = m && ndm__view_input(x, &vx, api, site) ? ndm__output_for(out, x, api, site)
                                                              : NDM_NULL_MANAGER;
    /* Every intermediate (views of the parameters too) lands in this scope,
     * so nothing reaches the model; the result moves to dst. */
    ndm_manager s = dst.id ? ndm_scope_begin_at(NDM__SITE_ARGS(site), dst, "forward")
                           : NDM_NULL_MANAGER;
    if (!s.id)
        return NDM_NULL_ARRAY;
    ndm_array y = ndm__module_forward(m, x, api, site);
    ndm_status st = ndm_scope_end_at(NDM__SITE_ARGS(site), s, y.id ? 1 : 0, &y);
    return y.id && st == NDM_OK ? y : NDM_NULL_ARRAY;
}

ndm_array ndm__module_run(ndm_module mh, ndm_array x, const char *api, ndm__site site)
{
    NDM__OP_GUARD();
    ndm__module *m = ndm__module_of(mh, api, site);
    return m ? ndm__module_forward(m, x, api, site) : NDM_NULL_ARRAY;
}

NDM_API ndm_status ndm_module_set_training(ndm_module mh, bool training)
{
    ndm__module *m = ndm__module_of(mh, __func__, NDM__NO_SITE);
    if (!m)
        return ndm_last_status();
    m->training = training;
    if (m->type->set_training)
        m->type->set_training(m, training);
    for (int i = 0; i < m->nchildren; i++) {
        ndm_status st = ndm_module_set_training(m->children[i], training);
        if (st < 0)
            return st;
    }
    return NDM_OK;
}

/* Names and arrays of list l, up to cap of each; returns the count. */
static int named(const ndm__named_list *l, const char **names, ndm_array *out, int cap)
{
    for (int i = 0; i < l->n && i < cap; i++) {
        if (out)
            out[i] = l->a[i];
        if (names)
            names[i] = l->names[i];
    }
    return l->n;
}

NDM_API int ndm_module_named_parameters(ndm_module mh, const char **names, ndm_array *out,
                                        int cap)
{
    ndm__module *m = ndm__module_of(mh, __func__, NDM__NO_SITE);
    return m ? named(&m->params, names, out, cap) : ndm_last_status();
}

NDM_API int ndm_module_named_state(ndm_module mh, const char **names, ndm_array *out, int cap)
{
    ndm__module *m = ndm__module_of(mh, __func__, NDM__NO_SITE);
    return m ? named(&m->state, names, out, cap) : ndm_last_status();
}

NDM_API int ndm_module_parameters(ndm_module mh, ndm_array *out, int cap)
{
    return ndm_module_named_parameters(mh, NULL, out, cap);
}

NDM_API int ndm_module_describe(ndm_module mh, char *buf, size_t n)
{
    ndm__module *m = ndm__module_of(mh, __func__, NDM__NO_SITE);
    if (!m)
        return ndm_last_status();
    if (buf && n)
        buf[0] = '\0';
    char none[1];
    return (int)ndm__module_describe_into(m, buf ? buf : none, buf ? n : 0, 0);
}

bool ndm__module_valid(ndm_module m) { return ndm__object_valid(m.id, &module_object); }

ndm_status ndm__module_check_owner(ndm_module mh, ndm_manager model, const char *api,
                                   ndm__site site)
{
    ndm__module *m = ndm__module_of(mh, api, site);
    ndm_manager want = m ? ndm__resolve_manager(model, api, site) : NDM_NULL_MANAGER;
    if (!want.id)
        return ndm_last_status();
    char path[512], other[512];
    ndm_manager owner = ndm__object_owner(mh.id);
    if (owner.id != want.id) {
        ndm_manager_path(owner, other, sizeof other);
        ndm_manager_path(want, path, sizeof path);
        return ndm__fail(NDM_E_NOT_OWNER, api, site,
                         "the module belongs to '%s', not to the model '%s'", other, path);
    }
    for (int k = 0; k < m->state.n; k++) {
        ndm_manager am = ndm_array_manager(m->state.a[k]);
        if (!am.id)
            return ndm__fail(NDM_E_CLOSED, api, site, "parameter '%s' of the module is released",
                             m->state.names[k]);
        if (am.id != owner.id) {
            ndm_manager_path(am, other, sizeof other);
            ndm_manager_path(want, path, sizeof path);
            return ndm__fail(NDM_E_NOT_OWNER, api, site,
                             "parameter '%s' of the module lives in '%s', not in the model '%s'",
                             m->state.names[k], other, path);
        }
    }
    return NDM_OK;
}
