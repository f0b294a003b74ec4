/* Private autograd interface: the operation codes dispatchers record, their
 * parameters, and the inline check that keeps recording free when off. */
#ifndef NDM_OPS_AUTOGRAD_H
#define NDM_OPS_AUTOGRAD_H

#include <stdbool.h>
#include <stdint.h>

#include "ndm/array.h"
#include "ndm/manager.h"
#include "ndm/random.h"
#include "ndm/status.h"
#include "../base/compiler.h"
#include "../base/error.h"

typedef enum ndm__ag_op {
    NDM__AG_BINARY,      /* i[0]: ndm__ew_binop */
    NDM__AG_SCALAR,      /* i[0]: ndm__ew_binop, i[1]: swapped (s op a), s[0]: the scalar */
    NDM__AG_UNARY,       /* i[0]: ndm__ew_unop */
    NDM__AG_CLAMP,       /* s[0], s[1]: bounds */
    NDM__AG_WHERE,       /* in: cond, a, b */
    NDM__AG_CAST,        /* astype */
    NDM__AG_IDENTITY,    /* alias, contiguous, copy: same shape */
    NDM__AG_RESHAPE,     /* reshape, squeeze, unsqueeze: grad reshaped back */
    NDM__AG_PERMUTE,     /* axes[0..naxes): the permutation used */
    NDM__AG_SLICE,       /* i[0]: axis, i[1]: start, i[2]: stop, i[3]: step (as given) */
    NDM__AG_SELECT,      /* i[0]: axis, i[1]: index (as given) */
    NDM__AG_EXPAND,      /* broadcast view: grad summed back */
    NDM__AG_SUM,         /* axes (normalised, naxes = -1: all), i[0]: keepdim */
    NDM__AG_MEAN,
    NDM__AG_MAX,
    NDM__AG_MIN,
    NDM__AG_LOGSUMEXP,
    NDM__AG_SOFTMAX,     /* i[0]: axis */
    NDM__AG_LOG_SOFTMAX, /* i[0]: axis */
    NDM__AG_MATMUL,
    NDM__AG_DOT,
    NDM__AG_OUTER,
    NDM__AG_CONCAT,      /* i[0]: axis; n inputs */
    NDM__AG_STACK,       /* i[0]: axis; n inputs */
    NDM__AG_TAKE,        /* i[0]: axis; in: a, indices */
    NDM__AG_GATHER,      /* i[0]: axis; in: a, indices */
    NDM__AG_FLIP,        /* i[0]: axis */
    NDM__AG_CUMSUM,      /* i[0]: axis (normalised) */
    NDM__AG_CUMPROD,     /* i[0]: axis (normalised) */
    NDM__AG_TRI,         /* i[0]: the diagonal offset k, i[1]: upper (triu) */
    NDM__AG_RMS_NORM,    /* i[0]: with a weight; in: x[, w], rstd (x's shape, last axis 1) */
    NDM__AG_INDEX,       /* i[0]: k, the leading axes indexed; in: a, the flat i64 positions
                            into a's first k axes merged (the broadcast index shape) */
    NDM__AG_MASKED_SELECT, /* in: a, mask, the i64 C-order positions picked in the
                              broadcast of a and mask */
    NDM__AG_CONV2D,      /* conv: the options in conv; in: x, w[, b] */
    NDM__AG_MAX_POOL2D,  /* pool options in pool */
    NDM__AG_AVG_POOL2D,  /* pool options in pool, i[0]: count_include_pad */
    NDM__AG_CROSS_ENTROPY, /* in: logits (N, C), labels (N); i[0]: reduction */
    NDM__AG_NLL,         /* in: log-probabilities (N, C), labels (N); i[0]: reduction */
    NDM__AG_OP_COUNT
} ndm__ag_op;

#define NDM__AG_MAX_AXES 16

typedef struct ndm__ag_params {
    int64_t i[4];
    double s[2];
    int naxes;           /* -1: all axes */
    int axes[NDM__AG_MAX_AXES];
    int64_t conv[7];     /* stride[2], padding[2], dilation[2], groups */
} ndm__ag_params;

/* Autograd's own per-thread state (not the manager's thread record): the
 * graph manager this thread records into (null: none), the last graph it
 * used (valid while ctx_mgr is a live handle), and the pause depth. A small
 * fixed record in static TLS, so the check below is two loads and no call. */
typedef struct ndm__ag_thread {
    ndm_manager graph;
    void *ctx;
    ndm_manager ctx_mgr;
    int pause;
    /* Under a byte budget (autograd_budget.c) only: set while this thread
     * records into a budgeted graph or recomputes for one, so that module
     * calls and random draws take the budget's slow path; false (one load)
     * otherwise. */
    bool budget;
    int depth;            /* module calls open on this thread, while `budget` */
    int keep;             /* of them, marked NDM_RECOMPUTE_KEEP */
    void *unit;           /* the unit of recomputation being recorded, or NULL */
    void *replay;         /* the recomputation running, or NULL */
} ndm__ag_thread;

extern _Thread_local ndm__ag_thread ndm__ag_tls NDM__TLS_MODEL;

/* Is this thread recording? */
static inline bool ndm__ag_on(void)
{
    return ndm__ag_tls.graph.id && !ndm__ag_tls.pause;
}

/* Record an operation: out = op(in[0..n)) with parameters p (may be NULL).
 * Nothing happens unless recording is on and an input needs a gradient. A
 * failure to record (no memory) leaves `out` valid but without a gradient
 * and is reported by the next ndm_backward. */
void ndm__ag_record(ndm__ag_op op, ndm_array out, int n, const ndm_array *in,
                    const ndm__ag_params *p);

/* Record a reduction: normalises the axes (negative, all) for rank ndim. */
void ndm__ag_record_reduce(ndm__ag_op op, ndm_array out, ndm_array in, int ndim, bool keepdim,
                           int naxes, const int *axes);

/* Operations built from other public operations pause recording while they
 * work, so only the operation itself is recorded. */
static inline bool ndm__ag_pause(void)
{
    if (!ndm__ag_tls.graph.id)
        return false;
    ndm__ag_tls.pause++;
    return true;
}
static inline void ndm__ag_resume(bool paused)
{
    if (paused)
        ndm__ag_tls.pause--;
}

#define NDM__AG_RECORD(op, out, n, in, p)                                       \
    do {                                                                        \
        if (NDM__UNLIKELY(ndm__ag_on()) && (out).id)                            \
            ndm__ag_record((op), (out), (n), (in), (p));                        \
    } while (0)


/* ---- the graph, for the engine and the backward rules ------------------- */

typedef struct ndm__ag_node {
    ndm__ag_op op;
    int n;                       /* inputs */
    uint64_t order;              /* recording order: producers come first */
    ndm_array out;               /* the recorded result (the key) */
    ndm_array saved_out;         /* a handle on it that the graph keeps */
    ndm_array *in;               /* handles on the inputs that the graph keeps */
    struct ndm__ag_node **prod;  /* the node that made each input, or NULL */
    ndm_array *leaf;             /* the gradient array of each parameter input, or null */
    unsigned char *needs;        /* does input i need a gradient */
    ndm__ag_params p;
    ndm_array g;                 /* during backward: d(out) accumulated */
    int seen;
    /* Under a byte budget: the unit of recomputation the node belongs to
     * (its index + 1; 0: none), and whether it was recorded in a module
     * marked NDM_RECOMPUTE_KEEP (its arrays are never dropped). */
    uint32_t unit;
    bool pinned;
} ndm__ag_node;

/* A graph: nodes by the id of the array they made (open addressing). */
typedef struct ndm__ag_budget ndm__ag_budget;
typedef struct ndm__ag_graph {
    ndm_manager mgr;
    uint64_t *keys;
    ndm__ag_node **vals;
    size_t cap, count;
    ndm__ag_node **all; /* every node in recording order (all[k] has order k + 1) */
    size_t nall, capall;
    uint64_t next_order;
    bool failed; /* a node could not be recorded */
    ndm__ag_budget *budget; /* NULL: no byte budget */
} ndm__ag_graph;

/* The node that made array id, or NULL; and another id for a node (a
 * recomputed array, a kept view of its result), false when out of memory. */
ndm__ag_node *ndm__ag_graph_find(ndm__ag_graph *g, uint64_t id);
bool ndm__ag_graph_alias(ndm__ag_graph *g, uint64_t id, ndm__ag_node *nd);

/* ---- byte budgets (autograd_budget.c) ------------------------------------- */

/* Recompute a module call: the module (by handle id), the form it was
 * called in (kind: the nn layer's own code) and its inputs. */
typedef ndm_array (*ndm__ag_replay_fn)(uint64_t module, int kind, int n, const ndm_array *in);

/* Around a module's forward pass while ndm__ag_tls.budget is set: begin
 * returns a token for end (mode: NDM_RECOMPUTE_*, the module's setting). */
int ndm__ag_unit_begin(ndm__ag_replay_fn fn, uint64_t module, int kind, int mode, int n,
                       const ndm_array *in);
void ndm__ag_unit_end(int token, ndm_array y);

/* A random draw from *rng while ndm__ag_tls.budget is set: the generator
 * to draw from (rng, or while recomputing, *local set to the state the
 * recorded draw started from, rng left as it is). */
ndm_rng *ndm__ag_budget_rng(ndm_rng *rng, ndm_rng *local);

/* The budget's part of recording a node (nd made, `in` its inputs); in a
 * recomputation, ndm__ag_replay_record takes the place of recording. */
void ndm__ag_budget_node(ndm__ag_graph *g, ndm__ag_node *nd);
void ndm__ag_replay_record(ndm__ag_graph *g, ndm__ag_op op, ndm_array out, int n,
                           const ndm_array *in);

/* Backward under a budget: before a node's rule (its arrays made resident
 * again, recomputed where dropped, and held until after), after it, and
 * at the start and end of a backward pass. */
ndm_status ndm__ag_budget_before(ndm__ag_graph *g, ndm__ag_node *nd, const char *api,
                                 ndm__site site);
void ndm__ag_budget_after(ndm__ag_graph *g, ndm__ag_node *nd);
void ndm__ag_budget_backward_begin(ndm__ag_graph *g);
void ndm__ag_budget_free(ndm__ag_budget *b);

/* The gradients of a node's inputs given g = d(out): gi[i] for each input
 * that needs one (others may stay null). Temporaries follow the output rule
 * (backward runs inside a scope). */
ndm_status ndm__ag_rule(ndm__ag_node *nd, ndm_array g, ndm_array *gi);

/* Backward as ndm_backward_with_at(), calling ready(ud, g) as soon as the
 * gradient array g of a parameter is complete: no node left to run adds to
 * it (data-parallel training starts communicating it then). Each parameter
 * the graph reaches is reported once, in the order backward finishes them;
 * after an error no more are reported. */
typedef void (*ndm__ag_ready_fn)(void *ud, ndm_array grad);
ndm_status ndm__ag_backward_hooked(const char *api, ndm__site site, ndm_array out,
                                   ndm_array grad, ndm__ag_ready_fn ready, void *ud);

/* The gradient array of parameter `param` itself (not a fresh handle), or
 * the null handle when it is not a parameter. */
ndm_array ndm__ag_grad_of(ndm_array param);

/* Make `grad` (an array of the parameter's dtype and shape, owned by the
 * caller) the gradient that backward accumulates into and the optimizers
 * read, and return the one it replaces (not released); the null handle
 * when param is not a parameter. Graphs recorded before keep the old one. */
ndm_array ndm__ag_set_grad(ndm_array param, ndm_array grad);

/* Sum g over the axes broadcasting added to reach `shape`. */
ndm_array ndm__ag_sum_to(ndm_array g, int ndim, const int64_t *shape);

#endif
