/* The module type table: every layer is an ndm__module_type (its name, its
 * forward pass, its description, its train/eval and destroy hooks) and a
 * block of its own data. module.c holds what every module shares: the
 * object handle, the named parameters and state, the children, train/eval.
 *
 * A layer is one file (layer_*.c): a static const ndm__module_type, the
 * layer's data struct, and its public constructor, which makes the record
 * with ndm__module_new, registers its arrays by name and hands it to
 * ndm__module_finish. Thread rules: as ndm/nn.h says of modules; the hooks
 * run on the caller's thread, under the operation guard of the call. */
#ifndef NDM_NN_MODULE_H
#define NDM_NN_MODULE_H

#include <stdbool.h>
#include <stddef.h>

#include "ndm/ndm.h"
#include "../base/error.h"

/* The longest state name kept, NUL included ("blocks.3.attn.qkv.weight"):
 * a registration that would compose a longer one is refused. */
#define NDM__MODULE_NAME_MAX 128

typedef struct ndm__module ndm__module;

typedef struct ndm__module_type {
    const char *name; /* "Linear": PyTorch's class name, used in messages */
    size_t size;      /* bytes of the layer's data (ndm__module.data), zeroed at creation */
    /* required: m's forward pass on x. Every array it makes follows the
     * output rule (the caller's scope owns them); operations are given
     * `site`, so that a failure names the user's line. Null on failure, with
     * the error recorded for api. */
    ndm_array (*forward)(ndm__module *m, ndm_array x, const char *api, ndm__site site);
    /* optional: the forward pass over n inputs (a user module's, which may
     * take several: x and a mask). NULL: the module takes one (forward). */
    ndm_array (*forward_n)(ndm__module *m, int n, const ndm_array *x, const char *api,
                           ndm__site site);
    /* optional: forward followed by a ReLU, in one pass (Sequential uses it
     * for a module of this type followed by ReLU). NULL: none. */
    ndm_array (*forward_relu)(ndm__module *m, ndm_array x, const char *api, ndm__site site);
    /* required: append the one-line description ("Linear(4, 3)") to buf,
     * written as snprintf would at offset len of a buffer of n bytes
     * (nothing past n); returns the new length, whether it fitted or not. */
    size_t (*describe)(const ndm__module *m, char *buf, size_t n, size_t len);
    /* optional: m->training has just been set (children are set by
     * module.c, not by the hook). NULL: the flag is all the layer reads. */
    void (*set_training)(ndm__module *m, bool training);
    /* optional: free what the data holds besides arrays (the model owns
     * those). Runs when the module dies, possibly later on another thread
     * (the object's deferred reclamation); NULL: nothing to free. */
    void (*destroy)(ndm__module *m);
    /* optional: m's own parameter `old` is now `now` (ndm_module_tie):
     * point the data's copies of the handle at it (ndm__rebind). NULL:
     * the layer keeps no copy (it looks its arrays up by name). */
    void (*rebind)(ndm__module *m, ndm_array old, ndm_array now);
} ndm__module_type;

/* A layer's rebind: *slot becomes `now` if it was `old`. */
static inline void ndm__rebind(ndm_array *slot, ndm_array old, ndm_array now)
{
    if (slot->id == old.id)
        *slot = now;
}

/* Named arrays: a module's parameters, or its whole state (parameters and
 * buffers, in the order of PyTorch's state_dict). */
typedef struct ndm__named_list {
    int n;
    ndm_array *a;
    char (*names)[NDM__MODULE_NAME_MAX];
} ndm__named_list;

struct ndm__module {
    const ndm__module_type *type;
    const char *class_name; /* type->name, or a user module's own ("Block") */
    void *data;          /* type->size bytes, in the same allocation */
    bool training;       /* modules start in training mode */
    ndm_module self;     /* its own handle, once registered in the model */
    ndm_module parent;   /* the module it is a child of (at most one), or null */
    bool in_parent;      /* registered as a child (parent is null until that one is made) */
    /* The name from the root of its tree, as PyTorch's named_modules()
     * gives it ("blocks.3.attn"; "" for a root): interned (ndm__nn_intern),
     * so that history frames may keep pointing at it after the module dies. */
    const char *qname;
    ndm__site site;      /* where it was made: its frames' place */
    int nchildren;
    ndm_module *children;
    char (*child_names)[NDM__MODULE_NAME_MAX];
    /* PyTorch's order: a module's own parameters, then its own buffers
     * (in state), then each child's entries in registration order. */
    int own_params, own_buffers;
    ndm__named_list params; /* this module's and its children's, with names */
    ndm__named_list state;  /* parameters and buffers, for checkpoints */
    /* Its tree holds a parameter under two names (ndm_module_tie): params
     * and state list both names, ndm_module_parameters the array once. */
    bool tied;
    ndm_recompute recompute; /* its part in a byte budget (ndm_module_set_recompute) */
};

/* The first entry of l before `before` that holds the array of entry
 * `before` (a tied parameter's other name), or -1. */
int ndm__module_tied_to(const ndm__named_list *l, int before);

/* The ReLU layer's type: a module whose type has forward_relu and which is
 * followed by one of these runs both in one pass inside a Sequential. */
extern const ndm__module_type ndm__module_relu;

/* Is model a live manager? (false with the error recorded): constructors
 * check it before their arguments, as every constructor reports. */
bool ndm__nn_model_ok(ndm_manager model, const char *api, ndm__site site);
/* A new module of type t for `model` (checked first), training, with zeroed
 * data. NULL with the error recorded. */
ndm__module *ndm__module_new(const ndm__module_type *t, ndm_manager model, const char *api,
                             ndm__site site);
/* Register a built module in model; on failure it is freed (its arrays stay
 * in the model until it closes) and the null module returned. */
ndm_module ndm__module_finish(ndm__module *m, ndm_manager model, const char *api, ndm__site site);
/* A module of type t with nothing of its own (no data to set, no arrays):
 * new and finish in one. */
ndm_module ndm__module_plain(const ndm__module_type *t, ndm_manager model, const char *api,
                             ndm__site site);
/* A constructor's failure: m is freed, NDM_E_OOM recorded unless an error
 * already was; returns the null module. */
ndm_module ndm__module_abandon(ndm__module *m, const char *api, ndm__site site);

/* Add a to m's parameters (and so to its state), or to its state only (a
 * buffer), after m's own entries and before its children's. False when
 * there is no memory. */
bool ndm__module_add_param(ndm__module *m, const char *name, ndm_array a);
bool ndm__module_add_buffer(ndm__module *m, const char *name, ndm_array a);
/* Add `child` (a live module of m's model that has no parent yet) to m's
 * children, its parameters and state under "name.<its name>", and give it
 * and its subtree their qualified names. False with the error recorded for
 * api (NDM_E_OOM, NDM_E_INVALID for a composed name past the limit); on
 * failure m is as it was. ndm__module_add_child: the same for a layer's
 * constructor, which abandons m on failure. */
bool ndm__module_attach_child(ndm__module *m, const char *name, ndm_module child,
                              const char *api, ndm__site site);
bool ndm__module_add_child(ndm__module *m, const char *name, ndm_module child);
/* Drop the entries past the first np parameters and ns state entries, and
 * the children past the first nc (undoing a registration that failed). */
void ndm__module_truncate(ndm__module *m, int np, int ns, int nc);
/* Undo the last ndm__module_add_param (a registration that failed after it). */
void ndm__module_drop_param(ndm__module *m);
/* Is `name` a valid local name: not empty, no '.', shorter than the
 * state names' limit? False with NDM_E_INVALID recorded for api. */
bool ndm__module_name_ok(const char *name, const char *what, const char *api, ndm__site site);
/* Does m already hold a parameter, buffer or child of this local name? */
bool ndm__module_has_name(const ndm__module *m, const char *name);
/* s kept for the life of the process, one copy per distinct string (the
 * names frames point to); NULL when there is no memory. */
const char *ndm__nn_intern(const char *s);

/* The live module behind h, or NULL with the handle's error recorded. */
ndm__module *ndm__module_of(ndm_module h, const char *api, ndm__site site);
/* m's forward pass, through its type: while history is recorded, with a
 * call frame named by m's qualified name (a child's: "blocks.3.attn"), at
 * the place m was made. forward_relu: the fused form (the type has it). */
ndm_array ndm__module_forward(ndm__module *m, ndm_array x, const char *api, ndm__site site);
ndm_array ndm__module_forward_relu(ndm__module *m, ndm_array x, const char *api,
                                   ndm__site site);
/* The same over n inputs: a module without forward_n takes exactly one
 * (NDM_E_INVALID otherwise). */
ndm_array ndm__module_forward_n(ndm__module *m, int n, const ndm_array *x, const char *api,
                                ndm__site site);
/* m's description, through its type. */
static inline size_t ndm__module_describe_into(const ndm__module *m, char *buf, size_t n,
                                               size_t len)
{
    return m->type->describe(m, buf, n, len);
}
/* A describe that writes the type's name: a layer without arguments. */
size_t ndm__module_describe_name(const ndm__module *m, char *buf, size_t n, size_t len);
/* A describe for a container: "<type name>(<child>, <child>, ...)". */
size_t ndm__module_describe_children(const ndm__module *m, char *buf, size_t n, size_t len);
/* A container of type t whose children are `modules`, named "0", "1", ...
 * (Sequential, ModuleList): each checked to be a live module of model,
 * registered once. The null module with the error recorded for api. */
ndm_module ndm__module_numbered(const ndm__module_type *t, ndm_manager model, int n,
                                const ndm_module *modules, const char *api, ndm__site site);
/* Append to a description as snprintf would (the `describe` convention). */
size_t ndm__module_put(char *buf, size_t n, size_t len, const char *fmt, ...)
    NDM_PRINTF(4, 5);

/* ---- helpers of the built-in layers ---------------------------------------- */

/* A parameter: an f32 array of `shape` in model, Kaiming-uniform from rng
 * (`kaiming`) or zeros, with a gradient unless gradients are paused on this
 * thread (a model built for inference). Null on failure. */
ndm_array ndm__nn_param(ndm__site site, ndm_manager model, int ndim, const int64_t *shape,
                        ndm_rng *rng, bool kaiming);
/* An array of model filled with value: a buffer (no gradient) or, with
 * `param`, a parameter as above. Null on failure. */
ndm_array ndm__nn_filled(ndm__site site, ndm_manager model, ndm_dtype dt, int ndim,
                         const int64_t *shape, double value, bool param);
/* Are gradients wanted for new parameters on this thread? */
bool ndm__nn_grads_wanted(void);
/* The shape of x into small (cap 16) or, for a higher rank, a heap buffer
 * the caller frees when it is not small; *ndim set. NULL with the error
 * recorded for api. */
int64_t *ndm__nn_shape(ndm_array x, int64_t small[16], int *ndim, const char *api,
                       ndm__site site);

#endif
