/* "Why is this array alive?": its retention path. The managers that own it,
 * root first, each with the line that opened it; its storage and how many
 * bytes the array pins beyond its own elements; every other view that keeps
 * that storage alive (a slice's base, an alias in another manager, a value
 * an autograd graph saved, a DLPack export not yet deleted), each with its
 * manager and creation line; a loan (the manager it returns to); and the
 * streams recorded as its users, whose work its memory waits for. What is
 * read is copied under the locks (tree, then the array's manager, then the
 * storage's, the order of moves) and printed after. */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "../base/text.h"
#include "core.h"

#define WHY_PATH 512

/* One view of the storage, as it was when read. */
typedef struct why_view {
    char desc[96];
    char path[WHY_PATH];
    char mgr_name[NDM__NAME_MAX];
    ndm__site made;
    int64_t elem_bytes;   /* bytes of its own elements */
    char lender[WHY_PATH]; /* "" unless borrowed (or its lender closed) */
    bool is_self, is_home, exported;
    bool lender_gone;      /* borrowed, and the lender has closed since */
    uint32_t moved;        /* how it came to its manager (NDM__MOVED_*; 0: made there) */
    ndm__site moved_at;
} why_view;

typedef struct why {
    why_view self;
    char owners[16][WHY_PATH]; /* the owner chain: names and opening sites */
    int nowners;
    int owners_skipped;        /* managers between the root and owners[1], not shown */
    int64_t storage_bytes;
    bool wrapped;              /* a buffer ndm did not allocate */
    char charged[WHY_PATH];
    why_view *views;           /* the other views, newest first */
    size_t nviews, views_total;
    uint32_t stream_uses;      /* streams besides its own recorded as users of the storage */
} why;

/* Bytes of r's own elements (its extent in the storage). */
static int64_t elem_bytes(const ndm__array *r)
{
    return ndm__numel(r->ndim, r->shape) * (int64_t)ndm__dtype_bytes[r->dtype];
}

/* Tree lock held, and r's manager's lock when r is `self`. The other views
 * are read without their managers' locks (taking them here would invert
 * the lock order): only what is fixed at their making, their manager and
 * their lender (atomic), not their last move (kept in fields a death
 * rewrites). */
static void read_view(why_view *v, ndm__array *r, const ndm__array *self, const ndm__array *home)
{
    ndm__array_desc(r, v->desc, sizeof v->desc);
    uint32_t mgr = ndm__array_mgr_unlocked(r);
    ndm__manager *m = ndm__manager_rec(mgr);
    ndm__manager_path_locked(mgr, v->path, sizeof v->path);
    snprintf(v->mgr_name, sizeof v->mgr_name, "%s", m->name);
    v->made = ndm__array_site(r);
    v->elem_bytes = elem_bytes(r);
    v->is_self = r == self;
    v->is_home = r == home;
    uint32_t lender_gen, lender = ndm__array_lender_unlocked(r, &lender_gen);
    v->exported = mgr == ndm__detached_slot && lender;
    v->moved = v->is_self ? ndm__array_last_move(r, &v->moved_at) : 0;
    v->lender[0] = 0;
    v->lender_gone = false;
    if (lender) {
        /* (a lender that closed may have its slot taken by another manager:
         * its path would name that one) */
        ndm__manager *l = ndm__manager_rec(lender);
        unsigned st = atomic_load_explicit(&l->state, memory_order_relaxed);
        if ((st & (NDM__M_LIVE | NDM__M_CLOSING)) == NDM__M_LIVE &&
            atomic_load_explicit(&l->gen, memory_order_relaxed) == lender_gen)
            ndm__manager_path_locked(lender, v->lender, sizeof v->lender);
        else
            v->lender_gone = true;
    }
}

/* Tree lock held; owner chain of manager slot `slot`, root first: the root
 * and the innermost 15 of a deeper chain, the managers between counted in
 * owners_skipped. */
static void read_owners(why *w, uint32_t slot)
{
    uint32_t chain[16];
    int n = 0, depth = 0;
    for (uint32_t s = slot; s; s = ndm__manager_rec(s)->parent, depth++) {
        if (n < 16)
            chain[n++] = s;
        else
            chain[15] = s; /* (the last one written is the root) */
    }
    w->nowners = n;
    w->owners_skipped = depth - n;
    for (int i = 0; i < n; i++) {
        ndm__manager *m = ndm__manager_rec(chain[n - 1 - i]);
        /* (the built-in nodes were opened by ndm itself) */
        char at[256];
        if (m->site.file && !(atomic_load_explicit(&m->state, memory_order_relaxed) & NDM__M_BUILTIN))
            snprintf(w->owners[i], WHY_PATH, "'%s' opened at %s", m->name,
                     ndm__site_str(m->site, at, sizeof at));
        else
            snprintf(w->owners[i], WHY_PATH, "'%s'", m->name);
    }
}

/* Copy r's retention path into w (NDM_E_OOM when the view list cannot be
 * copied); the tree lock is taken here. */
static ndm_status why_read(ndm__array *r, uint32_t gen, why *w, const char *api, ndm__site site)
{
    memset(w, 0, sizeof *w);
    ndm__tree_lock();
    ndm__manager *m;
    for (;;) {
        m = ndm__manager_rec(ndm__array_mgr_unlocked(r));
        ndm__mlock_take(m);
        if (atomic_load_explicit(&r->gen, memory_order_relaxed) != gen ||
            !atomic_load_explicit(&r->live, memory_order_relaxed)) {
            ndm__mlock_drop(m);
            ndm__tree_unlock();
            return ndm__fail(NDM_E_CLOSED, api, site, "the array was released meanwhile");
        }
        if (r->mgr == m->self)
            break;
        ndm__mlock_drop(m); /* moved meanwhile */
    }
    /* (r cannot die while its manager's lock is held, so neither can its storage) */
    ndm__storage *s = r->storage;
    ndm__array *home = ndm__storage_home(s);
    read_view(&w->self, r, r, home);
    read_owners(w, r->mgr);
    w->storage_bytes = (int64_t)s->nbytes;
    w->wrapped = s->cookie == NULL;
    /* (a count the allocator reads without its pool's lock, which may not
     * be taken under a manager's: the block is kept by r) */
    w->stream_uses = s->cookie ? ndm__alloc_stream_uses(s->device, s->cookie) : 0;
    ndm__manager_path_locked(s->charged, w->charged, sizeof w->charged);
    ndm_status st = NDM_OK;
    unsigned refs = atomic_load_explicit(&s->refs, memory_order_acquire) & NDM__REFS_COUNT;
    if (refs > 1) {
        ndm__storage_cold *c = ndm__storage_cold_of(s);
        ndm__lock_take(&c->lock);
        size_t cap = (atomic_load_explicit(&s->refs, memory_order_relaxed) & NDM__REFS_COUNT);
        w->views = calloc(cap, sizeof *w->views);
        if (!w->views) {
            st = ndm__fail(NDM_E_OOM, api, site, "no memory to list %zu views", cap);
        } else {
            for (uint32_t v = c->first_view; v && w->nviews < cap; v = ndm__array_rec(v)->sv_next) {
                ndm__array *vr = ndm__array_rec(v);
                w->views_total++;
                if (vr != r)
                    read_view(&w->views[w->nviews++], vr, r, home);
            }
        }
        ndm__lock_drop(&c->lock);
    }
    ndm__mlock_drop(m);
    ndm__tree_unlock();
    return st;
}

static const char *fmt_bytes(int64_t n, char *buf, size_t len)
{
    if (n < 10 * 1024)
        snprintf(buf, len, "%" PRId64 " bytes", n);
    else if (n < 1024 * 1024)
        snprintf(buf, len, "%.1f KiB", (double)n / 1024.0);
    else
        snprintf(buf, len, "%.1f MiB", (double)n / (1024.0 * 1024.0));
    return buf;
}

/* What a view is, in words, for the text form. */
static const char *view_role(const why_view *v)
{
    if (v->exported)
        return "a DLPack export not yet deleted";
    if (strcmp(v->mgr_name, "graph") == 0)
        return "saved by an autograd graph";
    if (v->is_home)
        return "the array that made the storage";
    if (v->lender[0] || v->lender_gone)
        return "a borrowed view";
    return "a view";
}

/* As every report writes a site: "file.c:12 (func)". */
static void print_site(FILE *f, ndm__site s)
{
    char buf[256];
    fputs(ndm__site_str(s, buf, sizeof buf), f);
}

static void why_print(FILE *f, const why *w)
{
    char b1[32], b2[32];
    fprintf(f, "why alive: %s, made at ", w->self.desc);
    print_site(f, w->self.made);
    fprintf(f, "\n  owned by %s", w->self.path);
    if (w->self.moved) {
        fprintf(f, ", moved there by %s at ", ndm__move_name(w->self.moved));
        print_site(f, w->self.moved_at);
    }
    if (w->self.lender[0])
        fprintf(f, " (borrowed: it goes back to %s when that manager closes)", w->self.lender);
    else if (w->self.lender_gone)
        fputs(" (borrowed from a manager that has closed: it goes back to an earlier lender, "
              "or is released, when this manager closes)", f);
    fputc('\n', f);
    for (int i = 0; i < w->nowners; i++) {
        fprintf(f, "    %*s%s\n", 2 * i, "", w->owners[i]);
        if (i == 0 && w->owners_skipped)
            fprintf(f, "      ... %d more managers\n", w->owners_skipped);
    }
    fprintf(f, "  storage: %s%s, charged to %s", fmt_bytes(w->storage_bytes, b1, sizeof b1),
            w->wrapped ? " (a wrapped buffer)" : "", w->charged);
    if (w->storage_bytes > w->self.elem_bytes)
        fprintf(f, "; this array's elements are %s, so it pins %s more",
                fmt_bytes(w->self.elem_bytes, b1, sizeof b1),
                fmt_bytes(w->storage_bytes - w->self.elem_bytes, b2, sizeof b2));
    fputc('\n', f);
    if (w->stream_uses)
        fprintf(f, "  pending stream uses: recorded on %u other stream%s (ndm_array_record_stream); "
                   "its memory is reused only after their work queued by its release is done\n",
                w->stream_uses, w->stream_uses == 1 ? "" : "s");
    if (!w->nviews) {
        fputs("  no other view holds the storage: releasing this array frees it\n", f);
        return;
    }
    fprintf(f, "  %zu other view%s hold%s the storage (it lives until every one is released):\n",
            w->nviews, w->nviews == 1 ? "" : "s", w->nviews == 1 ? "s" : "");
    for (size_t i = 0; i < w->nviews; i++) {
        const why_view *v = &w->views[i];
        fprintf(f, "    %s, %s, in %s, made at ", v->desc, view_role(v), v->path);
        print_site(f, v->made);
        if (v->moved && !v->exported) {
            fprintf(f, ", moved there by %s at ", ndm__move_name(v->moved));
            print_site(f, v->moved_at);
        }
        if (v->exported)
            fprintf(f, ", lent by %s", v->lender[0] ? v->lender : "a manager that has closed");
        else if (v->lender[0])
            fprintf(f, ", borrowed from %s", v->lender);
        else if (v->lender_gone)
            fputs(", borrowed from a manager that has closed", f);
        fputc('\n', f);
    }
}

static void json_site(FILE *f, ndm__site s)
{
    fputs("{\"file\":", f);
    ndm__json_write_str(f, s.file ? s.file : "");
    fputs(",\"func\":", f);
    ndm__json_write_str(f, s.func ? s.func : "");
    fprintf(f, ",\"line\":%d}", s.line);
}

static void json_view(FILE *f, const why_view *v)
{
    fputs("{\"array\":", f);
    ndm__json_write_str(f, v->desc);
    fputs(",\"manager\":", f);
    ndm__json_write_str(f, v->path);
    fputs(",\"made\":", f);
    json_site(f, v->made);
    fprintf(f, ",\"element_bytes\":%" PRId64 ",\"role\":", v->elem_bytes);
    const char *role = v->is_self        ? "self"
                       : v->exported     ? "dlpack_export"
                       : strcmp(v->mgr_name, "graph") == 0 ? "autograd"
                       : v->is_home      ? "home"
                       : v->lender[0] || v->lender_gone ? "borrowed"
                                         : "view";
    ndm__json_write_str(f, role);
    if (v->moved) {
        fputs(",\"moved\":{\"by\":", f);
        ndm__json_write_str(f, ndm__move_name(v->moved));
        fputs(",\"at\":", f);
        json_site(f, v->moved_at);
        fputc('}', f);
    }
    fputs(",\"lender\":", f);
    if (v->lender[0])
        ndm__json_write_str(f, v->lender);
    else
        fputs("null", f);
    fputc('}', f);
}

static void why_json(FILE *f, const why *w)
{
    fputs("{\"array\":", f);
    json_view(f, &w->self);
    fputs(",\"owners\":[", f);
    for (int i = 0; i < w->nowners; i++) {
        if (i)
            fputc(',', f);
        ndm__json_write_str(f, w->owners[i]);
        if (i == 0 && w->owners_skipped)
            fprintf(f, ",\"... %d more managers\"", w->owners_skipped);
    }
    fprintf(f, "],\"storage\":{\"bytes\":%" PRId64 ",\"wrapped\":%s,\"charged\":", w->storage_bytes,
            w->wrapped ? "true" : "false");
    ndm__json_write_str(f, w->charged);
    int64_t pinned = w->storage_bytes > w->self.elem_bytes ? w->storage_bytes - w->self.elem_bytes : 0;
    fprintf(f, ",\"pinned_beyond_elements\":%" PRId64 ",\"stream_uses\":%u},\"held_by\":[",
            pinned, w->stream_uses);
    for (size_t i = 0; i < w->nviews; i++) {
        if (i)
            fputc(',', f);
        json_view(f, &w->views[i]);
    }
    fputs("]}\n", f);
}

static ndm_status why_alive(ndm__site site, const char *api, ndm_array a, FILE *f, bool json)
{
    ndm__array *r = ndm__array_get(a, api, site);
    if (!r)
        return ndm_last_status();
    if (!f)
        return ndm__fail(NDM_E_INVALID, api, site, "FILE is NULL");
    why w;
    ndm_status st = why_read(r, (uint32_t)(a.id >> 32), &w, api, site);
    if (st == NDM_OK) {
        if (json)
            why_json(f, &w);
        else
            why_print(f, &w);
        fflush(f);
    }
    free(w.views);
    return st;
}

NDM_API ndm_status ndm_why_alive_at(NDM_SITE_PARAMS, ndm_array a, FILE *f)
{
    return why_alive(NDM__SITE, "ndm_why_alive", a, f, false);
}

NDM_API ndm_status ndm_why_alive_json_at(NDM_SITE_PARAMS, ndm_array a, FILE *f)
{
    return why_alive(NDM__SITE, "ndm_why_alive_json", a, f, true);
}

/* ---- the top of the leak report ------------------------------------------------- */

typedef struct top_site {
    ndm__site site;
    int64_t bytes;
    ndm_array newest; /* one live array made there */
} top_site;

#define WHY_TOP_SITES 256

/* Live arrays of m's subtree grouped by creation site (at most
 * WHY_TOP_SITES sites; the rest are not looked at). Tree lock held. */
static void top_walk(ndm__manager *m, top_site *t, size_t *n)
{
    ndm__mlock_take(m);
    for (uint32_t i = 0; i < m->narrays; i++) {
        if (!m->arrays[i])
            continue;
        ndm__array *r = ndm__array_rec(m->arrays[i]);
        ndm__site s = ndm__array_site(r);
        size_t k = 0;
        while (k < *n && !ndm__same_site(t[k].site, s))
            k++;
        if (k == *n) {
            if (*n == WHY_TOP_SITES)
                continue;
            t[(*n)++] = (top_site){s, 0, NDM_NULL_ARRAY};
        }
        t[k].bytes += (int64_t)r->storage->nbytes;
        t[k].newest = ndm__array_handle(r->self, atomic_load_explicit(&r->gen, memory_order_relaxed));
    }
    ndm__mlock_drop(m);
    for (uint32_t c = m->first_child; c; c = ndm__manager_slot(c)->sib_next)
        top_walk(ndm__manager_slot(c), t, n);
}

static int by_bytes(const void *a, const void *b)
{
    const top_site *x = a, *y = b;
    return x->bytes < y->bytes ? 1 : x->bytes > y->bytes ? -1 : 0;
}

void ndm__why_top(FILE *f, ndm_manager root, int top)
{
    top_site *t = calloc(WHY_TOP_SITES, sizeof *t);
    if (!t) {
        fputs("ndm why alive: no memory to group the arrays\n", f);
        return;
    }
    size_t n = 0;
    ndm__tree_lock();
    /* (looked up under the tree lock, which a close holds to end a manager) */
    ndm__manager *m = root.id ? ndm__manager_peek(root) : ndm__manager_slot(ndm__system_slot);
    if (m)
        top_walk(m, t, &n);
    ndm__tree_unlock();
    qsort(t, n, sizeof *t, by_bytes);
    for (size_t i = 0; i < n && i < (size_t)top; i++) {
        /* (an array released meanwhile by another thread is skipped) */
        why w;
        ndm__array *r = ndm__array_peek(t[i].newest);
        if (r && why_read(r, (uint32_t)(t[i].newest.id >> 32), &w, "NDM_LEAK_REPORT",
                          NDM__NO_SITE) == NDM_OK)
            why_print(f, &w);
        if (r)
            free(w.views);
    }
    fflush(f);
    free(t);
}
