/* Growth classes: a tracker samples a subtree once per step (live arrays
 * and bytes per creation site, live managers per opening site) and tells a
 * leak (still growing) from a cache warming up (grew, then stopped), a
 * periodic pattern (up and down, no net growth), a steady holding and
 * something released. The samples of the last GROWTH_WINDOW steps are kept
 * per site; the classes read the newer half of that window. */
#include <inttypes.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "core.h"
#include "object.h"
#include "reclaim.h"

#define GROWTH_WINDOW 32

typedef struct gsite {
    ndm__site site;
    bool manager;              /* a manager's opening site (else an array's creation site) */
    char name[NDM__NAME_MAX];  /* the newest manager's name, for a manager site */
    bool names_vary;           /* managers of one opening line with other names (batch-0, batch-1) */
    uint32_t moved;            /* arrays: how they came to where they are (NDM__MOVED_*; 0: made there) */
    ndm__site moved_at;        /* arrays: the line of that move */
    uint32_t where;            /* the manager that held the first one met in the step's walk (its
                                  parent, for a manager site): children are walked newest first,
                                  so of siblings, the newest */
    uint64_t seen;             /* the step it was last sampled in */
    int64_t count[GROWTH_WINDOW], bytes[GROWTH_WINDOW]; /* by step, modulo the window */
} gsite;

/* What one manager's arrays gave the last sample, per site in the order
 * first met: a manager whose counts of arrays made, released and moved in
 * and out are those of then holds the same arrays (a model's weights, step
 * after step), so its part is added again without walking them. */
typedef struct gpart {
    size_t site; /* index into sites */
    int64_t n, bytes;
} gpart;

typedef struct gmemo {
    uint32_t slot, gen; /* the manager (slot 0: an empty entry) */
    uint64_t created, released, moved_in, moved_out;
    uint64_t step;      /* the last step it served (older ones are dropped) */
    size_t nparts, cap;
    gpart *parts;
} gmemo;

typedef struct growth {
    pthread_mutex_t lock;
    ndm_manager watched;
    gsite *sites;
    size_t n, cap;
    uint64_t steps;
    bool oom;                  /* a site could not be added at some step */
    gmemo *memo;               /* open addressing by manager slot, nmemo of cmemo used */
    size_t nmemo, cmemo;
} growth;

static void growth_destroy(void *p)
{
    growth *g = p;
    pthread_mutex_destroy(&g->lock);
    for (size_t i = 0; i < g->cmemo; i++)
        free(g->memo[i].parts);
    free(g->memo);
    free(g->sites);
    free(g);
}

static const ndm__object_type growth_type = {
    .name = "growth tracker",
    .ended = "freed",
    .destroy = growth_destroy,
    .later = true,
};

/* The site's record, made (zeroed: not seen before) when new; NULL without memory. */
/* Arrays are keyed by their creation line and, when a move brought them
 * where they are, by that move and its line (an array attached to the model
 * each step is a leak at the attach); managers by their opening line alone
 * (a loop that names each one, batch-0, batch-1, ..., opens them at one
 * site). */
static gsite *site_of(growth *g, ndm__site s, bool manager, const char *name, uint32_t moved,
                      ndm__site moved_at)
{
    for (size_t i = 0; i < g->n; i++)
        if (g->sites[i].manager == manager && ndm__same_site(g->sites[i].site, s) &&
            g->sites[i].moved == moved && (!moved || ndm__same_site(g->sites[i].moved_at, moved_at))) {
            if (manager && strcmp(g->sites[i].name, name))
                g->sites[i].names_vary = true;
            return &g->sites[i];
        }
    if (g->n == g->cap) {
        size_t cap = g->cap ? 2 * g->cap : 16;
        gsite *p = realloc(g->sites, cap * sizeof *p);
        if (!p) {
            g->oom = true;
            return NULL;
        }
        g->sites = p;
        g->cap = cap;
    }
    gsite *e = &g->sites[g->n++];
    memset(e, 0, sizeof *e);
    e->site = s;
    e->manager = manager;
    e->moved = moved;
    e->moved_at = moved_at;
    if (manager)
        snprintf(e->name, sizeof e->name, "%s", name);
    return e;
}

/* Add n to the site's sample of this step (the slot was cleared when the
 * step began, or is cleared here for a site first seen now). */
static void count(growth *g, gsite *e, uint32_t where, int64_t n, int64_t bytes)
{
    size_t k = (size_t)(g->steps % GROWTH_WINDOW);
    if (e->seen != g->steps + 1) {
        e->seen = g->steps + 1;
        e->count[k] = e->bytes[k] = 0;
        e->where = where;
    }
    e->count[k] += n;
    e->bytes[k] += bytes;
}

/* Move the used entries of g's table into a new one of cap entries (a
 * power of two; the old one is freed). False without memory. */
static bool memo_reseat(growth *g, size_t cap)
{
    gmemo *t = calloc(cap, sizeof *t);
    if (!t)
        return false;
    for (size_t i = 0; i < g->cmemo; i++) {
        if (!g->memo[i].slot)
            continue;
        size_t j = g->memo[i].slot & (cap - 1);
        while (t[j].slot)
            j = (j + 1) & (cap - 1);
        t[j] = g->memo[i];
    }
    free(g->memo);
    g->memo = t;
    g->cmemo = cap;
    return true;
}

/* The memo entry of manager slot `slot`: its own, or the empty one where it
 * would go (NULL when the table cannot grow). */
static gmemo *memo_at(growth *g, uint32_t slot)
{
    if (2 * (g->nmemo + 1) > g->cmemo && !memo_reseat(g, g->cmemo ? 2 * g->cmemo : 64))
        return NULL;
    size_t j = slot & (g->cmemo - 1);
    while (g->memo[j].slot && g->memo[j].slot != slot)
        j = (j + 1) & (g->cmemo - 1);
    return &g->memo[j];
}

/* Drop the entries no step used since the last (managers closed since),
 * by rebuilding the table from those that remain. */
static void memo_prune(growth *g)
{
    size_t live = 0;
    for (size_t i = 0; i < g->cmemo; i++) {
        gmemo *e = &g->memo[i];
        if (e->slot && e->step + 1 < g->steps) {
            free(e->parts);
            *e = (gmemo){0};
        } else if (e->slot) {
            live++;
        }
    }
    if (live == g->nmemo)
        return;
    g->nmemo = live;
    /* re-seat the survivors: removal broke the probe chains (without
     * memory, forget them all: the next step walks every manager) */
    if (!memo_reseat(g, g->cmemo)) {
        for (size_t i = 0; i < g->cmemo; i++)
            free(g->memo[i].parts);
        free(g->memo);
        g->memo = NULL;
        g->nmemo = g->cmemo = 0;
    }
}

/* Count one array of `bytes` from site `site` in a manager's part; false
 * without memory. */
static bool memo_add(gmemo *e, size_t site, int64_t bytes)
{
    for (size_t i = 0; i < e->nparts; i++)
        if (e->parts[i].site == site) {
            e->parts[i].n++;
            e->parts[i].bytes += bytes;
            return true;
        }
    if (e->nparts == e->cap) {
        size_t cap = e->cap ? 2 * e->cap : 4;
        gpart *q = realloc(e->parts, cap * sizeof *q);
        if (!q)
            return false;
        e->parts = q;
        e->cap = cap;
    }
    e->parts[e->nparts++] = (gpart){site, 1, bytes};
    return true;
}

/* Sample m's subtree (tree lock held; each manager's lock while its list is read). */
static void sample(growth *g, ndm__manager *m, bool top)
{
    if (!top && !(atomic_load_explicit(&m->state, memory_order_relaxed) & NDM__M_BUILTIN)) {
        gsite *e = site_of(g, m->site, true, m->name, 0, NDM__NO_SITE);
        if (e) {
            ndm__mlock_take(m);
            int64_t b = m->count[m->dev].bytes;
            ndm__mlock_drop(m);
            /* the first met in a step is the newest (children come newest first) */
            if (e->seen != g->steps + 1)
                snprintf(e->name, sizeof e->name, "%s", m->name);
            count(g, e, m->parent, 1, b);
        }
    }
    ndm__mlock_take(m);
    uint32_t gen = atomic_load_explicit(&m->gen, memory_order_relaxed);
    gmemo *memo = memo_at(g, m->self);
    if (memo && memo->slot == m->self && memo->gen == gen && memo->created == m->created &&
        memo->released == m->released && memo->moved_in == m->moved_in &&
        memo->moved_out == m->moved_out) {
        /* the same arrays as at the last sample */
        for (size_t i = 0; i < memo->nparts; i++)
            count(g, &g->sites[memo->parts[i].site], m->self, memo->parts[i].n,
                  memo->parts[i].bytes);
        memo->step = g->steps;
    } else {
        if (memo) {
            if (!memo->slot)
                g->nmemo++;
            memo->slot = m->self;
            memo->gen = gen;
            memo->created = m->created;
            memo->released = m->released;
            memo->moved_in = m->moved_in;
            memo->moved_out = m->moved_out;
            memo->step = g->steps;
            memo->nparts = 0;
        }
        for (uint32_t i = 0; i < m->narrays; i++) {
            if (!m->arrays[i])
                continue;
            ndm__array *r = ndm__array_rec(m->arrays[i]);
            ndm__site moved_at = NDM__NO_SITE;
            uint32_t moved = ndm__array_last_move(r, &moved_at);
            gsite *e = site_of(g, ndm__array_site(r), false, NULL, moved, moved_at);
            if (!e) {
                if (memo)
                    memo->gen = gen + 1; /* incomplete: never replayed */
                continue;
            }
            int64_t bytes = ndm__numel(r->ndim, r->shape) * (int64_t)ndm__dtype_bytes[r->dtype];
            count(g, e, m->self, 1, bytes);
            if (memo && !memo_add(memo, (size_t)(e - g->sites), bytes))
                memo->gen = gen + 1;
        }
    }
    ndm__mlock_drop(m);
    for (uint32_t c = m->first_child; c; c = ndm__manager_slot(c)->sib_next)
        sample(g, ndm__manager_slot(c), false);
}

typedef enum gclass { G_LEAK, G_CACHE, G_PERIODIC, G_STEADY, G_RELEASED, G_FEW } gclass;

static const char *class_name[] = {"leak", "cache", "periodic", "steady", "released", "too few steps"};

/* The samples of the window, oldest first, in cnt/byt[0..w): every slot of
 * a step in the window was written at that step (by count, or cleared by
 * close_step), or never, for a step before the site was first seen (zero
 * from its making). */
static int window(const growth *g, const gsite *e, int64_t *cnt, int64_t *byt)
{
    int w = g->steps < GROWTH_WINDOW ? (int)g->steps : GROWTH_WINDOW;
    for (int i = 0; i < w; i++) {
        size_t k = (size_t)((g->steps - (uint64_t)w + (uint64_t)i) % GROWTH_WINDOW);
        cnt[i] = e->count[k];
        byt[i] = e->bytes[k];
    }
    return w;
}

/* The class of a site and its slope per step over the newer half (arrays
 * or managers, and bytes). */
static gclass classify(const growth *g, const gsite *e, double *slope_n, double *slope_b)
{
    int64_t c[GROWTH_WINDOW], b[GROWTH_WINDOW];
    int w = window(g, e, c, b);
    *slope_n = *slope_b = 0;
    if (w == 0 || c[w - 1] == 0)
        return G_RELEASED;
    if (w < 3)
        return G_FEW;
    int t = w / 2; /* the newer half of the w - 1 changes (rounded up) */
    int from = w - 1 - t;
    int64_t net = c[w - 1] - c[from];
    *slope_n = (double)net / t;
    *slope_b = (double)(b[w - 1] - b[from]) / t;
    if (net > 0)
        return G_LEAK;
    bool flat_all = true, flat_tail = true, grew = false;
    for (int i = 1; i < w; i++) {
        int64_t d = c[i] - c[i - 1];
        if (d)
            flat_all = false;
        if (d && i > from)
            flat_tail = false;
        if (d > 0 && i <= from)
            grew = true;
    }
    if (flat_all)
        return G_STEADY;
    if (flat_tail && grew)
        return G_CACHE;
    return G_PERIODIC;
}

/* The step's sample is done: a site not seen in it holds 0 for it. */
static void close_step(growth *g)
{
    size_t k = (size_t)(g->steps % GROWTH_WINDOW);
    for (size_t i = 0; i < g->n; i++)
        if (g->sites[i].seen != g->steps + 1)
            g->sites[i].count[k] = g->sites[i].bytes[k] = 0;
    g->steps++;
}

NDM_API ndm_growth ndm_growth_new_at(NDM_SITE_PARAMS, ndm_manager owner, ndm_manager watched)
{
    ndm__site site = NDM__SITE;
    const char *api = "ndm_growth_new";
    NDM__ENTRY(api); /* (registering with the owner's close names this call) */
    if (!ndm__manager_get(owner, api, site) || !ndm__manager_get(watched, api, site))
        return (ndm_growth){0};
    growth *g = calloc(1, sizeof *g);
    if (!g) {
        ndm__fail(NDM_E_OOM, api, site, "no memory for a growth tracker");
        return (ndm_growth){0};
    }
    pthread_mutex_init(&g->lock, NULL);
    g->watched = watched;
    uint64_t id = ndm__object_new(&growth_type, owner, g, site, api);
    if (!id)
        growth_destroy(g);
    return (ndm_growth){id};
}

NDM_API ndm_status ndm_growth_step_at(NDM_SITE_PARAMS, ndm_growth h)
{
    ndm__site site = NDM__SITE;
    const char *api = "ndm_growth_step";
    NDM__OP_GUARD();
    growth *g = ndm__object_get(h.id, &growth_type, api, site);
    if (!g)
        return ndm_last_status();
    pthread_mutex_lock(&g->lock);
    ndm__manager *m = ndm__manager_get(g->watched, api, site);
    ndm_status st = m ? NDM_OK : ndm_last_status();
    if (m) {
        ndm__tree_lock();
        sample(g, m, true);
        ndm__tree_unlock();
        close_step(g);
        if (g->steps % GROWTH_WINDOW == 0)
            memo_prune(g);
    }
    pthread_mutex_unlock(&g->lock);
    return st;
}

typedef struct gline {
    const gsite *e;
    gclass cls;
    double sn, sb;
} gline;

static int by_class(const void *a, const void *b)
{
    const gline *x = a, *y = b;
    if (x->cls != y->cls)
        return x->cls < y->cls ? -1 : 1;
    if (x->sb != y->sb)
        return x->sb < y->sb ? 1 : -1;
    return x->e->site.line - y->e->site.line;
}

/* The classified sites (released ones left out) sorted leak first, in *out. */
static size_t lines_of(const growth *g, gline **out, bool *oom)
{
    gline *l = calloc(g->n ? g->n : 1, sizeof *l);
    size_t n = 0;
    if (!l) {
        *oom = true;
        *out = NULL;
        return 0;
    }
    for (size_t i = 0; i < g->n; i++) {
        gline x = {&g->sites[i], G_RELEASED, 0, 0};
        x.cls = classify(g, &g->sites[i], &x.sn, &x.sb);
        if (x.cls != G_RELEASED)
            l[n++] = x;
    }
    qsort(l, n, sizeof *l, by_class);
    *out = l;
    return n;
}

NDM_API int64_t ndm_growth_leaks_at(NDM_SITE_PARAMS, ndm_growth h)
{
    ndm__site site = NDM__SITE;
    NDM__OP_GUARD();
    growth *g = ndm__object_get(h.id, &growth_type, "ndm_growth_leaks", site);
    if (!g)
        return ndm_last_status();
    pthread_mutex_lock(&g->lock);
    int64_t leaks = 0;
    for (size_t i = 0; i < g->n; i++) {
        double sn, sb;
        leaks += classify(g, &g->sites[i], &sn, &sb) == G_LEAK;
    }
    pthread_mutex_unlock(&g->lock);
    return leaks;
}

NDM_API ndm_status ndm_growth_report_at(NDM_SITE_PARAMS, ndm_growth h, FILE *f)
{
    ndm__site site = NDM__SITE;
    const char *api = "ndm_growth_report";
    NDM__OP_GUARD();
    growth *g = ndm__object_get(h.id, &growth_type, api, site);
    if (!g)
        return ndm_last_status();
    if (!f)
        return ndm__fail(NDM_E_INVALID, api, site, "FILE is NULL");
    pthread_mutex_lock(&g->lock);
    bool oom = g->oom;
    gline *l;
    size_t n = lines_of(g, &l, &oom);
    char path[1024], where[1024], sitebuf[256];
    ndm__tree_lock();
    /* (quiet: a failed lookup's message would take the tree lock again) */
    ndm__manager *m = ndm__manager_peek(g->watched);
    if (m)
        ndm__manager_path_locked(m->self, path, sizeof path);
    else
        snprintf(path, sizeof path, "a closed manager");
    size_t leaks = 0;
    for (size_t i = 0; i < n; i++)
        leaks += l[i].cls == G_LEAK;
    fprintf(f,
            "ndm growth: %" PRIu64 " step%s of %s, %zu site%s alive, %zu growing "
            "(classes over the last %d steps)\n",
            g->steps, g->steps == 1 ? "" : "s", path, n, n == 1 ? "" : "s", leaks,
            g->steps < GROWTH_WINDOW ? (int)g->steps : GROWTH_WINDOW);
    for (size_t i = 0; i < n; i++) {
        const gsite *e = l[i].e;
        int64_t c[GROWTH_WINDOW], b[GROWTH_WINDOW];
        int w = window(g, e, c, b);
        ndm__manager_path_locked(e->where, where, sizeof where);
        ndm__site_str(e->site, sitebuf, sizeof sitebuf);
        const char *unit = e->manager ? "manager" : "array";
        fprintf(f, "  %-8s ", class_name[l[i].cls]);
        if (l[i].cls == G_LEAK)
            fprintf(f, "+%.2f %s%s/step, %+.0f bytes/step: ", l[i].sn, unit,
                    l[i].sn == 1.0 ? "" : "s", l[i].sb);
        else if (l[i].cls == G_CACHE)
            fputs("grew, then stopped: ", f);
        else if (l[i].cls == G_PERIODIC)
            fputs("up and down, no net growth: ", f);
        if (e->manager)
            fprintf(f, "%" PRId64 " manager%s '%s'%s, %" PRId64 " bytes, opened at %s under %s\n",
                    c[w - 1], c[w - 1] == 1 ? "" : "s", e->name,
                    e->names_vary ? " (and other names)" : "", b[w - 1], sitebuf, where);
        else if (e->moved) {
            char movebuf[256];
            fprintf(f, "%" PRId64 " array%s, %" PRId64 " bytes, created at %s, moved by %s at %s, in %s\n",
                    c[w - 1], c[w - 1] == 1 ? "" : "s", b[w - 1], sitebuf, ndm__move_name(e->moved),
                    ndm__site_str(e->moved_at, movebuf, sizeof movebuf), where);
        } else
            fprintf(f, "%" PRId64 " array%s, %" PRId64 " bytes, created at %s in %s\n", c[w - 1],
                    c[w - 1] == 1 ? "" : "s", b[w - 1], sitebuf, where);
    }
    ndm__tree_unlock();
    if (oom)
        fputs("  (some sites were not tracked: out of memory)\n", f);
    pthread_mutex_unlock(&g->lock);
    free(l);
    fflush(f);
    return NDM_OK;
}

NDM_API bool ndm_growth_valid(ndm_growth h)
{
    return ndm__object_valid(h.id, &growth_type);
}

NDM_API ndm_status ndm_growth_free_at(NDM_SITE_PARAMS, ndm_growth h)
{
    return ndm__object_free(h.id, &growth_type, "ndm_growth_free", NDM__SITE);
}
