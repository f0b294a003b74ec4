/* Observability: statistics, the debug dump (text and JSON), leak hunting
 * since a mark, and the leak report. Every walk holds the tree lock so the
 * topology is stable, and each manager's lock while reading its figures. */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "../base/text.h"
#include "core.h"
#include "siblings.h"

typedef struct figures {
    uint64_t live, created, released, moved_in, moved_out, resources, children;
    uint64_t closed_created, closed_released; /* by closed children */
    uint64_t borrowed, shared, lent;          /* with `loans` only */
    uint64_t recomputed;                      /* bytes autograd recomputed under a budget */
    int64_t bytes[NDM__MAX_DEVICES];
    int64_t peak[NDM__MAX_DEVICES];
    unsigned state;
} figures;

/* Whether view r of m shares its storage with a view in another manager:
 * its bytes are charged elsewhere, or another manager holds a view of the
 * storage charged here. m's lock held (then the storage's: the order of moves). */
static bool shares_storage(const ndm__manager *m, ndm__array *r)
{
    ndm__storage *s = r->storage;
    if ((atomic_load_explicit(&s->refs, memory_order_acquire) & NDM__REFS_COUNT) < 2)
        return false;
    ndm__storage_cold *c = ndm__storage_cold_of(s);
    ndm__lock_take(&c->lock);
    bool shared = s->charged != m->self ||
                  (atomic_load_explicit(&s->refs, memory_order_relaxed) & NDM__REFS_COUNT) >
                      ndm__storage_charged_views(s);
    ndm__lock_drop(&c->lock);
    return shared;
}

/* Read m's figures; `loans` also counts its borrowed and shared arrays (a
 * walk of its list: the dumps ask, statistics do not). Tree lock held. */
static void read_figures(ndm__manager *m, figures *f, bool loans)
{
    memset(f, 0, sizeof *f);
    ndm__mlock_take(m);
    f->live = m->live;
    f->created = m->created;
    f->released = m->released;
    f->moved_in = m->moved_in;
    f->moved_out = m->moved_out;
    f->resources = m->resources;
    f->recomputed = atomic_load_explicit(&m->recomputed, memory_order_relaxed);
    for (int d = 0; d < NDM__MAX_DEVICES; d++) {
        f->bytes[d] = ndm__bytes_of(m, d);
        f->peak[d] = ndm__bytes_peak(m, d);
    }
    for (uint32_t e = 0; loans && e < m->narrays; e++) {
        if (!m->arrays[e])
            continue;
        ndm__array *r = ndm__array_rec(m->arrays[e]);
        f->borrowed += r->lender != 0;
        f->shared += shares_storage(m, r);
    }
    ndm__mlock_drop(m);
    f->children = m->children;
    f->closed_created = m->closed_created;
    f->closed_released = m->closed_released;
    f->state = atomic_load_explicit(&m->state, memory_order_relaxed);
}

/* Arrays lent by each live manager, by slot (a walk of the whole tree: a
 * borrower may be anywhere). NULL when out of memory: dumps then omit it. */
typedef struct lent_table {
    uint32_t *n;
    uint32_t size;
} lent_table;

static void lent_walk(ndm__manager *m, lent_table *t)
{
    ndm__mlock_take(m);
    for (uint32_t e = 0; e < m->narrays; e++) {
        if (!m->arrays[e])
            continue;
        ndm__array *r = ndm__array_rec(m->arrays[e]);
        if (!r->lender || r->lender >= t->size)
            continue;
        ndm__manager *l = ndm__manager_slot(r->lender);
        if (l && atomic_load_explicit(&l->gen, memory_order_relaxed) == r->lender_gen)
            t->n[r->lender]++;
    }
    ndm__mlock_drop(m);
    for (uint32_t c = m->first_child; c; c = ndm__manager_slot(c)->sib_next)
        lent_walk(ndm__manager_slot(c), t);
}

static lent_table lent_collect(void)
{
    lent_table t = {NULL, atomic_load_explicit(&ndm__manager_high, memory_order_acquire)};
    t.n = calloc(t.size ? t.size : 1, sizeof *t.n);
    if (t.n)
        lent_walk(ndm__manager_slot(ndm__system_slot), &t);
    return t;
}

static uint64_t lent_of(const lent_table *t, const ndm__manager *m)
{
    return t->n && m->self < t->size ? t->n[m->self] : 0;
}

static void add_subtree(ndm__manager *m, int dev, ndm_stats *out, bool top)
{
    figures f;
    read_figures(m, &f, false);
    out->live_arrays += f.live;
    out->created += f.created + f.closed_created;
    out->released += f.released + f.closed_released;
    out->moved_in += f.moved_in;
    out->moved_out += f.moved_out;
    out->resources += f.resources;
    out->live_bytes += (uint64_t)f.bytes[dev];
    out->peak_bytes += (uint64_t)f.peak[dev];
    if (!top)
        out->children++;
    for (uint32_t c = m->first_child; c; c = ndm__manager_slot(c)->sib_next)
        add_subtree(ndm__manager_slot(c), dev, out, false);
}

NDM_API ndm_status ndm_manager_stats(ndm_manager h, ndm_device device, unsigned flags,
                                     ndm_stats *out)
{
    ndm__manager *m = ndm__manager_get(h, __func__, NDM__NO_SITE);
    if (!m)
        return ndm_last_status();
    if (!out)
        return ndm__fail(NDM_E_INVALID, __func__, NDM__NO_SITE, "out is NULL");
    if (device.index < 0 || device.index >= NDM__MAX_CUDA ||
        (device.type != NDM_DEVICE_CPU && device.type != NDM_DEVICE_CUDA) ||
        (device.type == NDM_DEVICE_CPU && device.index != 0))
        return ndm__fail(NDM_E_DEVICE, __func__, NDM__NO_SITE, "not a device: type %d index %d",
                         (int)device.type, device.index);
    if (flags & ~(unsigned)NDM_STATS_SUBTREE)
        return ndm__fail(NDM_E_INVALID, __func__, NDM__NO_SITE, "unknown flags 0x%x",
                         flags & ~(unsigned)NDM_STATS_SUBTREE);
    if (ndm__alloc_device_check(device, __func__, NDM__NO_SITE) < 0)
        return ndm_last_status(); /* a device that cannot exist in this process */
    memset(out, 0, sizeof *out);
    int dev = ndm__device_slot(device);
    ndm__tree_lock();
    if (flags & NDM_STATS_SUBTREE) {
        add_subtree(m, dev, out, true);
    } else {
        figures f;
        read_figures(m, &f, false);
        out->live_arrays = f.live;
        out->created = f.created;
        out->released = f.released;
        out->moved_in = f.moved_in;
        out->moved_out = f.moved_out;
        out->resources = f.resources;
        out->live_bytes = (uint64_t)f.bytes[dev];
        out->peak_bytes = (uint64_t)f.peak[dev];
        out->children = f.children;
    }
    ndm__tree_unlock();
    return NDM_OK;
}

/* ---- the text dump ---------------------------------------------------------- */

/* Visit the children of parents[0..np) at depth, repeated siblings as one
 * group (siblings.h); one by one when there is no memory to group them. */
typedef void (*group_fn)(uint32_t *members, size_t n, int depth, void *ctx);
static void each_child_group(uint32_t *parents, size_t np, int depth, group_fn fn, void *ctx)
{
    ndm__sibs sibs;
    if (ndm__sibs_of(parents, np, &sibs)) {
        for (size_t g = 0; g < sibs.ngroups; g++)
            fn(sibs.slot + sibs.start[g], sibs.start[g + 1] - sibs.start[g], depth, ctx);
        ndm__sibs_free(&sibs);
        return;
    }
    for (size_t p = 0; p < np; p++)
        for (uint32_t c = ndm__oldest_child(parents[p]); c; c = ndm__manager_slot(c)->sib_prev) {
            uint32_t one = c;
            fn(&one, 1, depth, ctx);
        }
}

/* A group's label, "request" or "500 × request", and its width in columns
 * (the sign is two bytes, one column). */
static int group_label(char *buf, size_t cap, size_t n, const char *name)
{
    if (n == 1)
        return snprintf(buf, cap, "%s", name);
    int len = snprintf(buf, cap, "%zu \u00d7 %s", n, name);
    return len - 1;
}

static void measure_group(uint32_t *members, size_t n, int depth, void *ctx)
{
    int *width = ctx;
    char label[NDM__NAME_MAX + 32];
    int w = 2 * depth + group_label(label, sizeof label, n, ndm__manager_slot(members[0])->name);
    if (w > *width)
        *width = w;
    each_child_group(members, n, depth + 1, measure_group, ctx);
}

static const char *delta(char *buf, size_t n, int64_t now, int64_t before, bool seen)
{
    if (!seen)
        snprintf(buf, n, "[new]");
    else if (now == before)
        snprintf(buf, n, "[=]");
    else
        snprintf(buf, n, "[%+" PRId64 "]", now - before);
    return buf;
}

static void figures_add(figures *sum, const figures *f)
{
    sum->live += f->live;
    sum->created += f->created;
    sum->released += f->released;
    sum->moved_in += f->moved_in;
    sum->moved_out += f->moved_out;
    sum->resources += f->resources;
    sum->recomputed += f->recomputed;
    sum->children += f->children;
    sum->closed_created += f->closed_created;
    sum->closed_released += f->closed_released;
    sum->borrowed += f->borrowed;
    sum->shared += f->shared;
    sum->lent += f->lent;
    for (int d = 0; d < NDM__MAX_DEVICES; d++) {
        sum->bytes[d] += f->bytes[d];
        sum->peak[d] += f->peak[d];
    }
}

typedef struct dump_ctx {
    FILE *f;
    int width;
    const lent_table *lt;
} dump_ctx;

/* One line for a manager, or for a group of repeated siblings (their sums;
 * the change is against their sums at the previous dump), then its children. */
static void dump_group(uint32_t *members, size_t n, int depth, void *vctx)
{
    dump_ctx *c = vctx;
    FILE *f = c->f;
    ndm__manager *m = ndm__manager_slot(members[0]);
    figures fg, one;
    memset(&fg, 0, sizeof fg);
    uint64_t was_live = 0;
    int64_t was_bytes = 0;
    bool seen = false;
    int own = m->dev;
    for (size_t i = 0; i < n; i++) {
        ndm__manager *mi = ndm__manager_slot(members[i]);
        read_figures(mi, &one, true);
        one.lent = lent_of(c->lt, mi);
        figures_add(&fg, &one);
        if (mi->dumped.seen) {
            seen = true;
            was_live += mi->dumped.live;
            was_bytes += mi->dumped.bytes;
        }
        mi->dumped.live = one.live;
        mi->dumped.created = one.created;
        mi->dumped.released = one.released;
        mi->dumped.bytes = one.bytes[own];
        mi->dumped.seen = true;
        if (i == 0)
            fg.state = one.state;
    }
    char dev[32], d1[32], d2[32], label[NDM__NAME_MAX + 32];
    ndm_device_str(m->device, dev, sizeof dev);
    int cols = group_label(label, sizeof label, n, m->name);
    int pad = c->width - 2 * depth - cols;
    fprintf(f, "%*s%s%*s  %-6s  arrays %" PRIu64 " %s  bytes %" PRId64 " %s  created %" PRIu64,
            2 * depth, "", label, pad > 0 ? pad : 0, "", dev, fg.live,
            delta(d1, sizeof d1, (int64_t)fg.live, (int64_t)was_live, seen), fg.bytes[own],
            delta(d2, sizeof d2, fg.bytes[own], was_bytes, seen), fg.created);
    if (fg.closed_created)
        fprintf(f, " (+%" PRIu64 " in closed children)", fg.closed_created);
    fprintf(f, "  released %" PRIu64, fg.released);
    if (fg.closed_released)
        fprintf(f, " (+%" PRIu64 " in closed children)", fg.closed_released);
    /* (so that more released than created reads as arrays moved in) */
    if (fg.moved_in)
        fprintf(f, "  moved in %" PRIu64, fg.moved_in);
    if (fg.moved_out)
        fprintf(f, "  moved out %" PRIu64, fg.moved_out);
    fprintf(f, "  peak %" PRId64, fg.peak[own]);
    for (int d = 0; d < NDM__MAX_DEVICES; d++) {
        if (d == own || (fg.bytes[d] == 0 && fg.peak[d] == 0))
            continue;
        ndm_device_str(ndm__slot_device(d), dev, sizeof dev);
        fprintf(f, "  %s bytes %" PRId64 " peak %" PRId64, dev, fg.bytes[d], fg.peak[d]);
    }
    if (fg.resources)
        fprintf(f, "  resources %" PRIu64, fg.resources);
    if (fg.recomputed)
        fprintf(f, "  recomputed %" PRIu64, fg.recomputed);
    /* arrays on loan (ndm_temp_attach) and views of storage another manager
     * also views: the bytes of such storage count once, where it is charged */
    if (fg.lent)
        fprintf(f, "  lent %" PRIu64, fg.lent);
    if (fg.borrowed)
        fprintf(f, "  borrowed %" PRIu64, fg.borrowed);
    if (fg.shared)
        fprintf(f, "  shared %" PRIu64, fg.shared);
    unsigned caps = (fg.state >> NDM__CAP_SHIFT) & (NDM_CAP_ARRAYS | NDM_CAP_CHILDREN);
    if (caps && !(fg.state & NDM__M_BUILTIN))
        fprintf(f, "  capped(%s%s%s)", caps & NDM_CAP_ARRAYS ? "arrays" : "",
                caps == (NDM_CAP_ARRAYS | NDM_CAP_CHILDREN) ? "," : "",
                caps & NDM_CAP_CHILDREN ? "children" : "");
    if (fg.state & NDM__M_SCOPE)
        fprintf(f, "  scope");
    if (n > 1) {
        char site[256];
        fprintf(f, "  made at %s", ndm__site_str(m->site, site, sizeof site));
    }
    fputc('\n', f);
    each_child_group(members, n, depth + 1, dump_group, c);
}

/* The manager a dump or report is of, or NULL (the failure recorded) for a
 * stale handle or a NULL FILE. */
static ndm__manager *report_args(ndm_manager h, FILE *f, const char *api, ndm__site site)
{
    ndm__manager *m = ndm__manager_get(h, api, site);
    if (m && !f) {
        ndm__fail(NDM_E_INVALID, api, site, "FILE is NULL");
        return NULL;
    }
    return m;
}

NDM_API ndm_status ndm_debug_dump_at(NDM_SITE_PARAMS, ndm_manager h, FILE *f)
{
    ndm__manager *m = report_args(h, f, __func__, NDM__SITE);
    if (!m)
        return ndm_last_status();
    ndm__tree_lock();
    char path[1024];
    ndm__manager_path_locked(m->self, path, sizeof path);
    fprintf(f, "ndm dump: %s (arrays, bytes; [change since the previous dump])\n", path);
    lent_table lt = lent_collect();
    dump_ctx ctx = {f, 0, &lt};
    uint32_t top = m->self;
    measure_group(&top, 1, 0, &ctx.width);
    dump_group(&top, 1, 0, &ctx);
    ndm__tree_unlock();
    free(lt.n);
    fflush(f);
    return NDM_OK;
}

NDM_API ndm_status ndm_debug_dump_why_at(NDM_SITE_PARAMS, ndm_manager h, FILE *f, int top)
{
    ndm__site site = NDM__SITE;
    if (top < 1 || top > NDM_DUMP_WHY_MAX)
        return ndm__fail(NDM_E_INVALID, __func__, site, "top %d: it goes from 1 to %d", top,
                         NDM_DUMP_WHY_MAX);
    ndm_status st = ndm_debug_dump_at(NDM__SITE_ARGS(site), h, f);
    if (st != NDM_OK)
        return st;
    ndm__why_top(f, ndm__manager_resolved(h, __func__, site), top);
    return NDM_OK;
}

/* ---- JSON ---------------------------------------------------------------------- */

static void json_node(ndm__manager *m, FILE *f, const lent_table *lt)
{
    figures fg;
    read_figures(m, &fg, true);
    fg.lent = lent_of(lt, m);
    char path[1024], dev[32];
    ndm__manager_path_locked(m->self, path, sizeof path);
    ndm_device_str(m->device, dev, sizeof dev);
    fputs("{\"name\":", f);
    ndm__json_write_str(f, m->name);
    fputs(",\"path\":", f);
    ndm__json_write_str(f, path);
    fprintf(f, ",\"device\":\"%s\",\"scope\":%s,\"capped\":[", dev,
            (fg.state & NDM__M_SCOPE) ? "true" : "false");
    unsigned caps = (fg.state >> NDM__CAP_SHIFT) & (NDM_CAP_ARRAYS | NDM_CAP_CHILDREN);
    if (fg.state & NDM__M_BUILTIN)
        caps = 0;
    fprintf(f, "%s%s%s]", caps & NDM_CAP_ARRAYS ? "\"arrays\"" : "",
            caps == (NDM_CAP_ARRAYS | NDM_CAP_CHILDREN) ? "," : "",
            caps & NDM_CAP_CHILDREN ? "\"children\"" : "");
    fprintf(f,
            ",\"live_arrays\":%" PRIu64 ",\"created\":%" PRIu64 ",\"released\":%" PRIu64
            ",\"closed_created\":%" PRIu64 ",\"closed_released\":%" PRIu64
            ",\"moved_in\":%" PRIu64 ",\"moved_out\":%" PRIu64 ",\"resources\":%" PRIu64
            ",\"lent\":%" PRIu64 ",\"borrowed\":%" PRIu64 ",\"shared\":%" PRIu64
            ",\"bytes\":{",
            fg.live, fg.created, fg.released, fg.closed_created, fg.closed_released, fg.moved_in,
            fg.moved_out, fg.resources, fg.lent, fg.borrowed, fg.shared);
    bool first = true;
    for (int d = 0; d < NDM__MAX_DEVICES; d++) {
        if (d != m->dev && fg.bytes[d] == 0 && fg.peak[d] == 0)
            continue;
        ndm_device_str(ndm__slot_device(d), dev, sizeof dev);
        fprintf(f, "%s\"%s\":{\"live\":%" PRId64 ",\"peak\":%" PRId64 "}", first ? "" : ",", dev,
                fg.bytes[d], fg.peak[d]);
        first = false;
    }
    fputs("},\"children\":[", f);
    first = true;
    for (uint32_t c = ndm__oldest_child(m->self); c; c = ndm__manager_slot(c)->sib_prev) {
        if (!first)
            fputc(',', f);
        json_node(ndm__manager_slot(c), f, lt);
        first = false;
    }
    fputs("]}", f);
}

NDM_API ndm_status ndm_debug_dump_json_at(NDM_SITE_PARAMS, ndm_manager h, FILE *f)
{
    ndm__manager *m = report_args(h, f, __func__, NDM__SITE);
    if (!m)
        return ndm_last_status();
    ndm__tree_lock();
    lent_table lt = lent_collect();
    json_node(m, f, &lt);
    ndm__tree_unlock();
    free(lt.n);
    fputc('\n', f);
    fflush(f);
    return NDM_OK;
}

/* ---- leak hunting ----------------------------------------------------------------- */

NDM_API ndm_seq ndm_mark(ndm_manager h)
{
    if (!ndm__manager_get(h, __func__, NDM__NO_SITE))
        return 0;
    /* a new epoch: everything created from now on carries it or a later one */
    return atomic_fetch_add_explicit(&ndm__epoch, 1, memory_order_relaxed) + 1;
}

/* Arrays are grouped by creation site and, for an array moved where it
 * is, by its last move too (the growth tracker's key): "created at X,
 * moved by ndm_attach at Y" names the line that made the array and the
 * line that put it where it leaks. */
typedef struct site_group {
    ndm__site site;
    uint32_t moved;    /* NDM__MOVED_*; 0: made where it is */
    ndm__site moved_at;
    uint64_t count;
    uint64_t bytes;
    uint32_t mgr; /* the manager of the newest array of the group */
} site_group;

typedef struct groups {
    site_group *g;
    size_t n, cap;
    uint64_t total;
    bool oom;
} groups;

/* Group m's own arrays created at or after `mark` by creation site. */
static void collect_one(ndm__manager *m, ndm_seq mark, groups *gs)
{
    ndm__mlock_take(m);
    for (uint32_t e = m->narrays; e-- > 0;) {
        if (!m->arrays[e])
            continue;
        ndm__array *r = ndm__array_rec(m->arrays[e]);
        if (r->epoch < mark)
            continue;
        gs->total++;
        uint64_t bytes = (uint64_t)ndm__numel(r->ndim, r->shape) * ndm_dtype_size(r->dtype);
        ndm__site site = ndm__array_site(r), moved_at = NDM__NO_SITE;
        uint32_t moved = ndm__array_last_move(r, &moved_at);
        size_t i = 0;
        while (i < gs->n && !(ndm__same_site(gs->g[i].site, site) && gs->g[i].moved == moved &&
                              (!moved || ndm__same_site(gs->g[i].moved_at, moved_at))))
            i++;
        if (i == gs->n) {
            if (gs->n == gs->cap) {
                size_t cap = gs->cap ? gs->cap * 2 : 16;
                site_group *p = realloc(gs->g, cap * sizeof *p);
                if (!p) {
                    gs->oom = true;
                    continue;
                }
                gs->g = p;
                gs->cap = cap;
            }
            gs->g[gs->n++] = (site_group){site, moved, moved_at, 0, 0, m->self};
        }
        gs->g[i].count++;
        gs->g[i].bytes += bytes;
    }
    ndm__mlock_drop(m);
}

/* One group's line: "N arrays, B bytes, created at X[, moved by M at Y,] in P". */
static void print_group(FILE *f, const site_group *g, const char *path)
{
    char site[256], moved[256];
    ndm__site_str(g->site, site, sizeof site);
    if (g->moved)
        fprintf(f, "  %" PRIu64 " array%s, %" PRIu64 " bytes, created at %s, moved by %s at %s, in %s\n",
                g->count, g->count == 1 ? "" : "s", g->bytes, site, ndm__move_name(g->moved),
                ndm__site_str(g->moved_at, moved, sizeof moved), path);
    else
        fprintf(f, "  %" PRIu64 " array%s, %" PRIu64 " bytes, created at %s in %s\n", g->count,
                g->count == 1 ? "" : "s", g->bytes, site, path);
}

static void collect_since(ndm__manager *m, ndm_seq mark, groups *gs)
{
    collect_one(m, mark, gs);
    for (uint32_t c = m->first_child; c; c = ndm__manager_slot(c)->sib_next)
        collect_since(ndm__manager_slot(c), mark, gs);
}

static int by_count(const void *a, const void *b)
{
    const site_group *x = a, *y = b;
    if (x->count != y->count)
        return x->count < y->count ? 1 : -1;
    return x->bytes < y->bytes ? 1 : x->bytes > y->bytes ? -1 : 0;
}

NDM_API int64_t ndm_count_since(ndm_manager h, ndm_seq mark)
{
    ndm__manager *m = ndm__manager_get(h, __func__, NDM__NO_SITE);
    if (!m)
        return ndm_last_status();
    groups gs = {0};
    ndm__tree_lock();
    collect_since(m, mark, &gs);
    ndm__tree_unlock();
    free(gs.g);
    return (int64_t)gs.total;
}

NDM_API ndm_status ndm_report_since(ndm_manager h, ndm_seq mark, FILE *f)
{
    ndm__manager *m = report_args(h, f, __func__, NDM__NO_SITE);
    if (!m)
        return ndm_last_status();
    groups gs = {0};
    char path[1024];
    ndm__tree_lock();
    collect_since(m, mark, &gs);
    ndm__manager_path_locked(m->self, path, sizeof path);
    if (gs.n)
        qsort(gs.g, gs.n, sizeof *gs.g, by_count);
    fprintf(f, "ndm report: %" PRIu64 " array%s created since mark %" PRIu64
               " still alive under %s\n",
            gs.total, gs.total == 1 ? "" : "s", mark, path);
    for (size_t i = 0; i < gs.n; i++) {
        ndm__manager_path_locked(gs.g[i].mgr, path, sizeof path);
        print_group(f, &gs.g[i], path);
    }
    ndm__tree_unlock();
    if (gs.oom)
        fprintf(f, "  (some sites were not grouped: out of memory)\n");
    free(gs.g);
    fflush(f);
    return NDM_OK;
}

/* ---- leak report at exit ----------------------------------------------------------- */

/* Count the live managers and arrays under m. */
static void leak_count(ndm__manager *m, uint64_t *nm, uint64_t *na)
{
    if (!(atomic_load_explicit(&m->state, memory_order_relaxed) & NDM__M_BUILTIN))
        (*nm)++;
    ndm__mlock_take(m);
    for (uint32_t e = 0; e < m->narrays; e++)
        *na += m->arrays[e] != 0;
    ndm__mlock_drop(m);
    for (uint32_t c = m->first_child; c; c = ndm__manager_slot(c)->sib_next)
        leak_count(ndm__manager_slot(c), nm, na);
}

/* The borrowed arrays among the members' (ndm_temp_attach): they go back
 * to their lender when the borrower closes, so the report says from whom,
 * grouped by lender and creation site. Tree lock held. */
#define LOAN_GROUPS 16
static void leak_loans(uint32_t *members, size_t n, const char *path, FILE *f)
{
    struct loan_group {
        uint32_t lender, gen;
        ndm__site site;
        uint64_t count;
    } g[LOAN_GROUPS];
    size_t ng = 0;
    uint64_t more = 0;
    for (size_t i = 0; i < n; i++) {
        ndm__manager *m = ndm__manager_slot(members[i]);
        ndm__mlock_take(m);
        for (uint32_t e = 0; e < m->narrays; e++) {
            ndm__array *r = m->arrays[e] ? ndm__array_rec(m->arrays[e]) : NULL;
            if (!r || !r->lender)
                continue;
            size_t j = 0;
            while (j < ng && !(g[j].lender == r->lender && g[j].gen == r->lender_gen &&
                               ndm__same_site(g[j].site, ndm__array_site(r))))
                j++;
            if (j == ng && ng == LOAN_GROUPS) {
                more++;
                continue;
            }
            if (j == ng)
                g[ng++] = (struct loan_group){r->lender, r->lender_gen, ndm__array_site(r), 0};
            g[j].count++;
        }
        ndm__mlock_drop(m);
    }
    char site[256], lpath[1024];
    for (size_t j = 0; j < ng; j++) {
        ndm__manager *l = ndm__manager_slot(g[j].lender);
        bool live = l && (atomic_load_explicit(&l->state, memory_order_relaxed) & NDM__M_LIVE) &&
                    atomic_load_explicit(&l->gen, memory_order_relaxed) == g[j].gen;
        if (live)
            ndm__manager_path_locked(g[j].lender, lpath, sizeof lpath);
        fprintf(f, "  %" PRIu64 " array%s created at %s in %s borrowed from %s%s%s\n", g[j].count,
                g[j].count == 1 ? "" : "s", ndm__site_str(g[j].site, site, sizeof site), path,
                live ? "'" : "", live ? lpath : "a manager since closed", live ? "'" : "");
    }
    if (more)
        fprintf(f, "  %" PRIu64 " more borrowed array%s in %s\n", more, more == 1 ? "" : "s",
                path);
}

/* List a manager, or a group of repeated siblings ("1000 × manager ..."),
 * with its arrays grouped by creation site, most first; then its children,
 * oldest first. */
static void leak_group(uint32_t *members, size_t n, int depth, void *ctx)
{
    FILE *f = ctx;
    char path[1024], site[256];
    ndm__manager *m = ndm__manager_slot(members[0]);
    ndm__manager_path_locked(m->self, path, sizeof path);
    if (!(atomic_load_explicit(&m->state, memory_order_relaxed) & NDM__M_BUILTIN)) {
        ndm__site_str(m->site, site, sizeof site);
        if (n == 1)
            fprintf(f, "  manager %s created at %s\n", path, site);
        else
            fprintf(f, "  %zu \u00d7 manager %s created at %s\n", n, path, site);
    }
    groups gs = {0};
    for (size_t i = 0; i < n; i++)
        collect_one(ndm__manager_slot(members[i]), 0, &gs);
    if (gs.n)
        qsort(gs.g, gs.n, sizeof *gs.g, by_count);
    for (size_t i = 0; i < gs.n; i++)
        print_group(f, &gs.g[i], path);
    if (gs.oom)
        fprintf(f, "  (some arrays of %s were not grouped: out of memory)\n", path);
    free(gs.g);
    leak_loans(members, n, path, f);
    each_child_group(members, n, depth + 1, leak_group, f);
}

NDM_API int64_t ndm_leak_report(FILE *f)
{
    ndm__init();
    uint64_t nm = 0, na = 0;
    ndm__manager *sys = ndm__manager_slot(ndm__system_slot);
    ndm__tree_lock();
    leak_count(sys, &nm, &na);
    if (f) {
        if (nm == 0 && na == 0) {
            fprintf(f, "ndm leak report: nothing alive\n");
        } else {
            fprintf(f, "ndm leak report: %" PRIu64 " live manager%s, %" PRIu64 " live array%s\n",
                    nm, nm == 1 ? "" : "s", na, na == 1 ? "" : "s");
            uint32_t top = sys->self;
            leak_group(&top, 1, 0, f);
        }
        fflush(f);
    }
    ndm__tree_unlock();
    return (int64_t)na;
}

/* ---- names for the allocator: OOM messages and history -------------------------- */

#define TOP_MANAGERS 3

typedef struct top_list {
    uint32_t slot[TOP_MANAGERS];
    int64_t bytes[TOP_MANAGERS];
    int n;
} top_list;

static void top_walk(ndm__manager *m, int dev, top_list *t)
{
    /* a snapshot for a message: the count is written under m's lock, read here
     * without it, as one relaxed load (a GNU builtin: C11 has none for plain
     * objects) */
    int64_t b = __atomic_load_n(&m->count[dev].bytes, __ATOMIC_RELAXED) +
                atomic_load_explicit(&m->count[dev].inbox, memory_order_relaxed);
    if (b > 0) {
        int i = t->n < TOP_MANAGERS ? t->n++ : TOP_MANAGERS - 1;
        if (i < TOP_MANAGERS - 1 || b > t->bytes[i]) {
            for (; i > 0 && t->bytes[i - 1] < b; i--) {
                t->slot[i] = t->slot[i - 1];
                t->bytes[i] = t->bytes[i - 1];
            }
            t->slot[i] = m->self;
            t->bytes[i] = b;
        }
    }
    for (uint32_t c = m->first_child; c; c = ndm__manager_slot(c)->sib_next)
        top_walk(ndm__manager_slot(c), dev, t);
}

void ndm__report_top_managers(ndm_device dev, char *buf, size_t n)
{
    buf[0] = '\0';
    if (dev.index < 0 || dev.index >= NDM__MAX_CUDA)
        return;
    int d = ndm__device_slot(dev);
    top_list t = {{0}, {0}, 0};
    size_t len = 0;
    ndm__tree_lock();
    top_walk(ndm__manager_slot(ndm__system_slot), d, &t);
    for (int i = 0; i < t.n && len < n; i++) {
        char path[512];
        ndm__manager_path_locked(t.slot[i], path, sizeof path);
        len += (size_t)snprintf(buf + len, n - len, "%s%s %.2f MiB", i ? ", " : "", path,
                                (double)t.bytes[i] / (1024.0 * 1024.0));
    }
    ndm__tree_unlock();
}

void ndm__describe_manager_path(uint32_t slot, char *buf, size_t n)
{
    ndm__manager_path(slot, buf, n);
}
