/* Modules: what every layer shares (the object handle, named parameters and
 * state, children, train/eval, ndm_forward's scope); each layer's own part
 * is its ndm__module_type, in layer_*.c. ndm_forward runs a module inside a
 * scope so that temporaries (views of the parameters included) never touch
 * the model. */
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../manager/alloc/alloc.h"
#include "../manager/object.h"
#include "../manager/reclaim.h"
#include "../ops/autograd.h"
#include "../ops/inner.h"
#include "module.h"
#include "ndm/ndm.h"
#include "ndm/nn.h"
#include "nn.h"

static bool rename_tree(ndm__module *m, const char *q);

/* ---- the object ------------------------------------------------------------------ */

static void module_destroy(void *p)
{
    ndm__module *m = p;
    if (m->type->destroy)
        m->type->destroy(m);
    free(m->children);
    free(m->child_names);
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

/* A module that is not made after all: its children live on in the model,
 * free to be registered elsewhere, under their own names again. */
static void free_children(ndm__module *m, const char *api, ndm__site site)
{
    for (int i = 0; i < m->nchildren; i++) {
        ndm__module *c = ndm__module_of(m->children[i], api, site);
        if (c) {
            c->in_parent = false;
            c->parent = (ndm_module){0};
            (void)rename_tree(c, "");
        }
    }
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
    m->class_name = t->name;
    m->data = t->size ? (char *)m + DATA_OFFSET : NULL;
    m->training = true;
    m->qname = "";
    m->site = site;
    return m;
}

ndm_module ndm__module_finish(ndm__module *m, ndm_manager model, const char *api, ndm__site site)
{
    uint64_t id = ndm__object_new(&module_object, model, m, site, api);
    if (!id) {
        free_children(m, api, site);
        module_destroy(m);
        return (ndm_module){0};
    }
    m->self = (ndm_module){id};
    for (int i = 0; i < m->nchildren; i++) {
        ndm__module *c = ndm__module_of(m->children[i], api, site);
        if (c)
            c->parent = m->self;
    }
    return m->self;
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

size_t ndm__module_describe_children(const ndm__module *m, char *buf, size_t n, size_t len)
{
    len = ndm__module_put(buf, n, len, "%s(", m->type->name);
    for (int i = 0; i < m->nchildren; i++) {
        const ndm__module *c = ndm__module_of(m->children[i], "ndm_module_describe", NDM__NO_SITE);
        if (i)
            len = ndm__module_put(buf, n, len, ", ");
        if (c)
            len = ndm__module_describe_into(c, buf, n, len);
    }
    return ndm__module_put(buf, n, len, ")");
}

ndm_module ndm__module_numbered(const ndm__module_type *t, ndm_manager model, int n,
                                const ndm_module *modules, const char *api, ndm__site site)
{
    if (!ndm__nn_model_ok(model, api, site))
        return (ndm_module){0};
    if (n < 0 || (n && !modules)) {
        ndm__fail(NDM_E_INVALID, api, site, "invalid module list (n = %d)", n);
        return (ndm_module){0};
    }
    for (int i = 0; i < n; i++) {
        /* (a null module from a constructor that failed keeps its error) */
        if (ndm__module_check_owner(modules[i], model, api, site) < 0)
            return (ndm_module){0};
    }
    ndm__module *m = ndm__module_new(t, model, api, site);
    if (!m)
        return (ndm_module){0};
    for (int i = 0; i < n; i++) {
        char name[16];
        snprintf(name, sizeof name, "%d", i);
        if (!ndm__module_attach_child(m, name, modules[i], api, site))
            return ndm__module_abandon(m, api, site);
    }
    return ndm__module_finish(m, model, api, site);
}

ndm_module ndm__module_abandon(ndm__module *m, const char *api, ndm__site site)
{
    if (ndm_last_status() == NDM_OK)
        ndm__fail(NDM_E_OOM, api, site, "no memory");
    free_children(m, api, site);
    module_destroy(m);
    return (ndm_module){0};
}

/* ---- named arrays ------------------------------------------------------------------ */

/* Insert (name, a) at position `at` of l. False when there is no memory
 * (l unchanged). */
static bool list_insert(ndm__named_list *l, int at, const char *name, ndm_array a)
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
    memmove(&l->a[at + 1], &l->a[at], (size_t)(l->n - at) * sizeof *l->a);
    memmove(&l->names[at + 1], &l->names[at], (size_t)(l->n - at) * sizeof *l->names);
    snprintf(l->names[at], NDM__MODULE_NAME_MAX, "%s", name);
    l->a[at] = a;
    l->n++;
    return true;
}

static void list_remove(ndm__named_list *l, int at)
{
    memmove(&l->a[at], &l->a[at + 1], (size_t)(l->n - at - 1) * sizeof *l->a);
    memmove(&l->names[at], &l->names[at + 1], (size_t)(l->n - at - 1) * sizeof *l->names);
    l->n--;
}

/* A parameter is part of the state too (checkpoints save both); each goes
 * after the module's own entries of its kind, before its children's. */
bool ndm__module_add_param(ndm__module *m, const char *name, ndm_array a)
{
    if (!list_insert(&m->params, m->own_params, name, a))
        return false;
    if (!list_insert(&m->state, m->own_params, name, a)) {
        list_remove(&m->params, m->own_params);
        return false;
    }
    m->own_params++;
    return true;
}

bool ndm__module_add_buffer(ndm__module *m, const char *name, ndm_array a)
{
    if (!list_insert(&m->state, m->own_params + m->own_buffers, name, a))
        return false;
    m->own_buffers++;
    return true;
}

void ndm__module_drop_param(ndm__module *m)
{
    m->own_params--;
    list_remove(&m->params, m->own_params);
    list_remove(&m->state, m->own_params);
}

void ndm__module_truncate(ndm__module *m, int np, int ns, int nc)
{
    m->params.n = np < m->params.n ? np : m->params.n;
    m->state.n = ns < m->state.n ? ns : m->state.n;
    m->nchildren = nc < m->nchildren ? nc : m->nchildren;
}

bool ndm__module_name_ok(const char *name, const char *what, const char *api, ndm__site site)
{
    if (!name || !*name) {
        ndm__fail(NDM_E_INVALID, api, site, "a %s needs a name (got %s)", what,
                  name ? "\"\"" : "NULL");
        return false;
    }
    if (strchr(name, '.')) {
        ndm__fail(NDM_E_INVALID, api, site,
                  "the %s name '%s' has a '.': dots join the names of nested modules (register "
                  "the child module, or a ModuleList for numbered ones)",
                  what, name);
        return false;
    }
    if (strlen(name) >= NDM__MODULE_NAME_MAX) {
        ndm__fail(NDM_E_INVALID, api, site, "the %s name '%.32s...' is longer than %d bytes",
                  what, name, NDM__MODULE_NAME_MAX - 1);
        return false;
    }
    return true;
}

bool ndm__module_has_name(const ndm__module *m, const char *name)
{
    for (int i = 0; i < m->own_params + m->own_buffers; i++)
        if (!strcmp(m->state.names[i], name))
            return true;
    for (int i = 0; i < m->nchildren; i++)
        if (!strcmp(m->child_names[i], name))
            return true;
    return false;
}

/* "prefix.name", or name for an empty prefix, into buf (cap bytes); false
 * when it does not fit. */
static bool compose(char *buf, size_t cap, const char *prefix, const char *name)
{
    int k = *prefix ? snprintf(buf, cap, "%s.%s", prefix, name) : snprintf(buf, cap, "%s", name);
    return k >= 0 && (size_t)k < cap;
}

/* Give m the qualified name q and its subtree theirs ("q.child..."). False
 * when there is no memory: part of the subtree may keep its former names
 * (rename with the former name to undo: those are interned already). */
static bool rename_tree(ndm__module *m, const char *q)
{
    const char *in = ndm__nn_intern(q);
    if (!in)
        return false;
    m->qname = in;
    for (int i = 0; i < m->nchildren; i++) {
        ndm__module *c = ndm__module_of(m->children[i], "ndm_module_register_child", NDM__NO_SITE);
        size_t cap = strlen(q) + strlen(m->child_names[i]) + 2;
        char *cq = malloc(cap);
        if (!cq)
            return false;
        compose(cq, cap, q, m->child_names[i]);
        bool ok = !c || rename_tree(c, cq);
        free(cq);
        if (!ok)
            return false;
    }
    return true;
}

/* The child's parameters and state under "name.", as PyTorch composes the
 * names of nested modules. */
bool ndm__module_attach_child(ndm__module *m, const char *name, ndm_module child,
                              const char *api, ndm__site site)
{
    ndm__module *c = ndm__module_of(child, api, site);
    if (!c)
        return false;
    if (c == m || (m->self.id && m->self.id == child.id)) {
        ndm__fail(NDM_E_INVALID, api, site, "a module cannot be registered under itself ('%s')",
                  name);
        return false;
    }
    if (c->in_parent) {
        ndm__fail(NDM_E_INVALID, api, site,
                  "the module given as '%s' (%s) is registered already%s%s%s: a module has one "
                  "place in a tree",
                  name, c->class_name, c->qname[0] ? " (as '" : "", c->qname,
                  c->qname[0] ? "')" : "");
        return false;
    }
    if (m->in_parent) {
        ndm__fail(NDM_E_INVALID, api, site,
                  "the module is registered in another already (as '%s'): register its children "
                  "before registering it",
                  m->qname);
        return false;
    }
    for (int i = 0; i < c->state.n; i++)
        for (int j = 0; j < m->state.n; j++)
            if (c->state.a[i].id == m->state.a[j].id) {
                ndm__fail(NDM_E_INVALID, api, site,
                          "'%s.%s' is registered already as '%s': an array has one name in a "
                          "tree (to share a weight, register its own and tie them: ndm_module_tie)",
                          name, c->state.names[i], m->state.names[j]);
                return false;
            }
    for (int pass = 0; pass < 2; pass++) {
        const ndm__named_list *from = pass ? &c->state : &c->params;
        for (int i = 0; i < from->n; i++) {
            char full[NDM__MODULE_NAME_MAX];
            if (!compose(full, sizeof full, name, from->names[i])) {
                ndm__fail(NDM_E_INVALID, api, site,
                          "the state name '%s.%s' would be longer than %d bytes", name,
                          from->names[i], NDM__MODULE_NAME_MAX - 1);
                return false;
            }
        }
    }
    int np = m->params.n, ns = m->state.n, nc = m->nchildren;
    ndm_module *k = ndm__realloc(m->children, (size_t)(nc + 1) * sizeof *k, NDM__INJ_OBJECT);
    if (k)
        m->children = k;
    char(*kn)[NDM__MODULE_NAME_MAX] =
        k ? ndm__realloc(m->child_names, (size_t)(nc + 1) * sizeof *kn, NDM__INJ_OBJECT) : NULL;
    if (kn)
        m->child_names = kn;
    bool ok = kn != NULL;
    for (int pass = 0; ok && pass < 2; pass++) {
        const ndm__named_list *from = pass ? &c->state : &c->params;
        ndm__named_list *to = pass ? &m->state : &m->params;
        for (int i = 0; ok && i < from->n; i++) {
            char full[NDM__MODULE_NAME_MAX];
            compose(full, sizeof full, name, from->names[i]);
            ok = list_insert(to, to->n, full, from->a[i]);
        }
    }
    if (ok) {
        snprintf(m->child_names[nc], NDM__MODULE_NAME_MAX, "%s", name);
        m->children[nc] = child;
        m->nchildren = nc + 1;
        size_t cap = strlen(m->qname) + strlen(name) + 2;
        char *q = malloc(cap);
        ok = q && compose(q, cap, m->qname, name) && rename_tree(c, q);
        free(q);
        if (!ok)
            (void)rename_tree(c, ""); /* its former names, interned already */
    }
    if (!ok) {
        ndm__module_truncate(m, np, ns, nc);
        ndm__fail(NDM_E_OOM, api, site, "no memory to register the module '%s'", name);
        return false;
    }
    c->parent = m->self; /* (null until m is registered: ndm__module_finish sets it) */
    c->in_parent = true;
    m->tied |= c->tied;
    return true;
}

bool ndm__module_add_child(ndm__module *m, const char *name, ndm_module child)
{
    return ndm__module_attach_child(m, name, child, "ndm__module_add_child", NDM__NO_SITE);
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

/* While history is recorded, a frame named by m's qualified name (a root,
 * named "", has ndm_forward's frame alone), at the user's line that made m:
 * a snapshot's stack then reads "blocks.3.attn" between the operation that
 * allocated and the user's call. */
#define MODULE_FRAME(m, site)                                                            \
    int ndm__module_frame_ __attribute__((cleanup(ndm__frame_pop), unused)) =           \
        (m)->qname[0] ? ndm__frame_push((m)->qname, (site).file, (site).func, (site).line, \
                                        (m)->site.file, (m)->site.line)                  \
                      : 0

/* The three forms a module is called in, as a byte budget recomputes them. */
enum { CALL_FORWARD, CALL_RELU, CALL_N };

static ndm_array call_form(ndm__module *m, int kind, int n, const ndm_array *x, const char *api,
                           ndm__site site)
{
    return kind == CALL_RELU ? m->type->forward_relu(m, x[0], api, site)
           : kind == CALL_N  ? m->type->forward_n(m, n, x, api, site)
                             : m->type->forward(m, x[0], api, site);
}

/* A recomputation of a dropped module call (autograd_budget.c). */
static ndm_array replay_call(uint64_t id, int kind, int n, const ndm_array *x)
{
    ndm__module *m = ndm__module_of((ndm_module){id}, "ndm_backward", NDM__NO_SITE);
    if (!m)
        return NDM_NULL_ARRAY;
    ndm__site site = m->site;
    MODULE_FRAME(m, site);
    return call_form(m, kind, n, x, "ndm_backward", site);
}

/* A module call while this thread records under a byte budget. */
static NDM__COLD ndm_array budgeted_call(ndm__module *m, int kind, int n, const ndm_array *x,
                                         const char *api, ndm__site site)
{
    int token = ndm__ag_unit_begin(replay_call, m->self.id, kind, (int)m->recompute, n, x);
    ndm_array y = call_form(m, kind, n, x, api, site);
    ndm__ag_unit_end(token, y);
    return y;
}

ndm_array ndm__module_forward(ndm__module *m, ndm_array x, const char *api, ndm__site site)
{
    MODULE_FRAME(m, site);
    if (NDM__UNLIKELY(ndm__ag_tls.budget))
        return budgeted_call(m, CALL_FORWARD, 1, &x, api, site);
    return m->type->forward(m, x, api, site);
}

ndm_array ndm__module_forward_relu(ndm__module *m, ndm_array x, const char *api,
                                   ndm__site site)
{
    MODULE_FRAME(m, site);
    if (NDM__UNLIKELY(ndm__ag_tls.budget))
        return budgeted_call(m, CALL_RELU, 1, &x, api, site);
    return m->type->forward_relu(m, x, api, site);
}

ndm_array ndm__module_forward_n(ndm__module *m, int n, const ndm_array *x, const char *api,
                                ndm__site site)
{
    if (m->type->forward_n) {
        MODULE_FRAME(m, site);
        if (NDM__UNLIKELY(ndm__ag_tls.budget))
            return budgeted_call(m, CALL_N, n, x, api, site);
        return m->type->forward_n(m, n, x, api, site);
    }
    if (n != 1) {
        ndm__fail(NDM_E_INVALID, api, site, "%s takes one input, got %d", m->class_name, n);
        return NDM_NULL_ARRAY;
    }
    return ndm__module_forward(m, x[0], api, site);
}

/* The inputs after the first may be null handles (an input left out: no
 * mask); a non-null one must be live. */
static bool inputs_ok(int n, const ndm_array *x, const char *api, ndm__site site)
{
    if (n < 1 || !x) {
        ndm__fail(NDM_E_INVALID, api, site, "a forward pass needs at least one input (n = %d)",
                  n);
        return false;
    }
    for (int i = 1; i < n; i++) {
        ndm__view v;
        if (x[i].id && !ndm__view_input(x[i], &v, api, site))
            return false;
    }
    return true;
}

NDM_API ndm_array ndm_forward_n_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_module mh, int n,
                                      const ndm_array *x)
{
    NDM__OP_GUARD();
    ndm__site site = NDM__SITE;
    const char *api = "ndm_forward";
    NDM__CALL_FRAME(api, site);
    ndm__module *m = ndm__module_of(mh, api, site);
    ndm__view vx;
    ndm_manager dst = m && inputs_ok(n, x, api, site) && ndm__view_input(x[0], &vx, api, site)
                          ? ndm__output_for(out, x[0], api, site)
                          : NDM_NULL_MANAGER;
    /* Every intermediate (views of the parameters too) lands in this scope,
     * so nothing reaches the model; the result moves to dst. A child's
     * scope is named by its qualified name, so that a dump taken inside a
     * forward pass shows where it is. */
    ndm_manager s = dst.id ? ndm_scope_begin_at(NDM__SITE_ARGS(site), dst,
                                                m->qname[0] ? m->qname : "forward")
                           : NDM_NULL_MANAGER;
    if (!s.id)
        return NDM_NULL_ARRAY;
    ndm_array y = ndm__module_forward_n(m, n, x, api, site);
    ndm_status st = ndm_scope_end_at(NDM__SITE_ARGS(site), s, y.id ? 1 : 0, &y);
    /* The scope closed under the pass (the close of the manager it hangs
     * from, or of the model): the result died with it, and the null result
     * says why rather than nothing. */
    if (y.id && st == NDM_ALREADY)
        ndm__fail(NDM_E_CLOSED, api, site,
                  "the forward pass's manager was closed while the pass ran");
    return y.id && st == NDM_OK ? y : NDM_NULL_ARRAY;
}

NDM_API ndm_array ndm_forward_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_module mh, ndm_array x)
{
    return ndm_forward_n_to_at(NDM__SITE_ARGS(NDM__SITE), out, mh, 1, &x);
}

ndm_array ndm__module_run(ndm_module mh, ndm_array x, const char *api, ndm__site site)
{
    NDM__OP_GUARD();
    ndm__module *m = ndm__module_of(mh, api, site);
    return m ? ndm__module_forward(m, x, api, site) : NDM_NULL_ARRAY;
}

NDM_API ndm_status ndm_module_set_recompute(ndm_module mh, ndm_recompute mode)
{
    ndm__module *m = ndm__module_of(mh, __func__, NDM__NO_SITE);
    if (!m)
        return ndm_last_status();
    if (mode != NDM_RECOMPUTE_AUTO && mode != NDM_RECOMPUTE_KEEP && mode != NDM_RECOMPUTE_ALWAYS)
        return ndm__fail(NDM_E_INVALID, __func__, NDM__NO_SITE,
                         "%d is not a recompute mode (NDM_RECOMPUTE_AUTO, _KEEP or _ALWAYS)",
                         (int)mode);
    m->recompute = mode;
    return NDM_OK;
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

int ndm__module_tied_to(const ndm__named_list *l, int before)
{
    for (int j = 0; j < before; j++)
        if (l->a[j].id == l->a[before].id)
            return j;
    return -1;
}

/* Names and arrays of list l, up to cap of each; returns the count. With
 * `once`, an array listed already (a tied parameter's second name) is
 * left out, as PyTorch's named_parameters() leaves it. */
static int named(const ndm__named_list *l, bool once, const char **names, ndm_array *out,
                 int cap)
{
    int k = 0;
    for (int i = 0; i < l->n; i++) {
        if (once && ndm__module_tied_to(l, i) >= 0)
            continue;
        if (k < cap) {
            if (out)
                out[k] = l->a[i];
            if (names)
                names[k] = l->names[i];
        }
        k++;
    }
    return k;
}

NDM_API int ndm_module_named_parameters(ndm_module mh, const char **names, ndm_array *out,
                                        int cap)
{
    ndm__module *m = ndm__module_of(mh, __func__, NDM__NO_SITE);
    return m ? named(&m->params, m->tied, names, out, cap) : ndm_last_status();
}

NDM_API int ndm_module_named_state(ndm_module mh, const char **names, ndm_array *out, int cap)
{
    ndm__module *m = ndm__module_of(mh, __func__, NDM__NO_SITE);
    return m ? named(&m->state, false, names, out, cap) : ndm_last_status();
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
    size_t len = ndm__module_describe_into(m, buf ? buf : none, buf ? n : 0, 0);
    /* the tied parameters, by their names from m: "[head.weight (tied to
     * tok_emb.weight)]" */
    int shown = 0;
    for (int i = 0; m->tied && i < m->params.n; i++) {
        int j = ndm__module_tied_to(&m->params, i);
        if (j >= 0)
            len = ndm__module_put(buf ? buf : none, buf ? n : 0, len, "%s%s (tied to %s)",
                                  shown++ ? ", " : " [", m->params.names[i], m->params.names[j]);
    }
    if (shown)
        len = ndm__module_put(buf ? buf : none, buf ? n : 0, len, "]");
    return (int)len;
}

NDM_API ndm_array ndm_module_get_array_at(NDM_SITE_PARAMS, ndm_module mh, const char *name)
{
    ndm__site site = NDM__SITE;
    const char *api = "ndm_module_get_array";
    ndm__module *m = ndm__module_of(mh, api, site);
    if (!m)
        return NDM_NULL_ARRAY;
    for (int i = 0; name && i < m->state.n; i++)
        if (!strcmp(m->state.names[i], name))
            return m->state.a[i];
    char list[400] = "";
    size_t len = 0;
    for (int i = 0; i < m->state.n && len < sizeof list; i++)
        len += (size_t)snprintf(list + len, sizeof list - len, "%s'%s'", i ? ", " : "",
                                m->state.names[i]);
    ndm__fail(NDM_E_INVALID, api, site, "the %s%s%s%s holds no array named '%s' (it holds %s)",
              m->class_name, m->qname[0] ? " '" : "", m->qname, m->qname[0] ? "'" : "",
              name ? name : "(NULL)", m->state.n ? list : "none");
    return NDM_NULL_ARRAY;
}

NDM_API ndm_module ndm_module_get_child_at(NDM_SITE_PARAMS, ndm_module mh, const char *name)
{
    ndm__site site = NDM__SITE;
    const char *api = "ndm_module_get_child";
    ndm__module *m = ndm__module_of(mh, api, site);
    const char *at = name ? name : "";
    ndm_module cur = mh;
    /* one dotted component at a time: "blocks.3.attn" */
    while (m) {
        size_t k = strcspn(at, ".");
        int found = -1;
        for (int i = 0; i < m->nchildren && found < 0; i++)
            if (strlen(m->child_names[i]) == k && !strncmp(m->child_names[i], at, k))
                found = i;
        if (found < 0) {
            char list[400] = "";
            size_t len = 0;
            for (int i = 0; i < m->nchildren && len < sizeof list; i++)
                len += (size_t)snprintf(list + len, sizeof list - len, "%s'%s'", i ? ", " : "",
                                        m->child_names[i]);
            ndm__fail(NDM_E_INVALID, api, site,
                      "the %s%s%s%s has no child '%.*s'%s%s (its children: %s)", m->class_name,
                      m->qname[0] ? " '" : "", m->qname, m->qname[0] ? "'" : "", (int)k, at,
                      at[k] ? " on the way to " : "",
                      at[k] ? (name ? name : "") : "", m->nchildren ? list : "none");
            return (ndm_module){0};
        }
        cur = m->children[found];
        if (!at[k])
            return cur;
        at += k + 1;
        m = ndm__module_of(cur, api, site);
    }
    return (ndm_module){0};
}

NDM_API int ndm_module_named_children(ndm_module mh, const char **names, ndm_module *out, int cap)
{
    ndm__module *m = ndm__module_of(mh, __func__, NDM__NO_SITE);
    if (!m)
        return ndm_last_status();
    for (int i = 0; i < m->nchildren && i < cap; i++) {
        if (names)
            names[i] = m->child_names[i];
        if (out)
            out[i] = m->children[i];
    }
    return m->nchildren;
}

NDM_API int ndm_module_name(ndm_module mh, char *buf, size_t n)
{
    ndm__module *m = ndm__module_of(mh, __func__, NDM__NO_SITE);
    if (!m)
        return ndm_last_status();
    return snprintf(buf, buf ? n : 0, "%s", m->qname);
}

NDM_API int ndm_module_training(ndm_module mh)
{
    ndm__module *m = ndm__module_of(mh, __func__, NDM__NO_SITE);
    return m ? m->training : ndm_last_status();
}

bool ndm__module_valid(ndm_module m) { return ndm__object_valid(m.id, &module_object); }

NDM_API bool ndm_module_valid(ndm_module m) { return ndm__module_valid(m); }

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

/* ---- interned names --------------------------------------------------------------- */

/* The qualified names of modules, each kept once for the life of the
 * process: history frames hold plain pointers to their names and outlive
 * the modules (a snapshot is dumped after the model closed). The set grows
 * only with names never seen before, so a process that builds the same
 * architecture again and again keeps one copy of each. Plain malloc: these
 * are not arrays of any manager. */
static pthread_mutex_t intern_lock = PTHREAD_MUTEX_INITIALIZER;
static char **intern_slots;
static size_t intern_cap, intern_n;

static size_t intern_hash(const char *s)
{
    size_t h = 1469598103934665603u;
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 1099511628211u;
    return h;
}

const char *ndm__nn_intern(const char *s)
{
    if (!*s)
        return "";
    pthread_mutex_lock(&intern_lock);
    const char *found = NULL;
    if (intern_cap) {
        for (size_t i = intern_hash(s) & (intern_cap - 1);; i = (i + 1) & (intern_cap - 1)) {
            if (!intern_slots[i])
                break;
            if (!strcmp(intern_slots[i], s)) {
                found = intern_slots[i];
                break;
            }
        }
    }
    if (!found && 2 * (intern_n + 1) > intern_cap) {
        size_t cap = intern_cap ? 2 * intern_cap : 64;
        char **slots = calloc(cap, sizeof *slots);
        if (slots) {
            for (size_t j = 0; j < intern_cap; j++) {
                if (!intern_slots[j])
                    continue;
                size_t i = intern_hash(intern_slots[j]) & (cap - 1);
                while (slots[i])
                    i = (i + 1) & (cap - 1);
                slots[i] = intern_slots[j];
            }
            free(intern_slots);
            intern_slots = slots;
            intern_cap = cap;
        }
    }
    if (!found && 2 * (intern_n + 1) <= intern_cap) {
        char *copy = strdup(s);
        if (copy) {
            size_t i = intern_hash(s) & (intern_cap - 1);
            while (intern_slots[i])
                i = (i + 1) & (intern_cap - 1);
            intern_slots[i] = copy;
            intern_n++;
            found = copy;
        }
    }
    pthread_mutex_unlock(&intern_lock);
    return found;
}
