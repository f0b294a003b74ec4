/* ndm-memviz's model: the tree checked and read into a snapshot (segments,
 * blocks, events per device), and each device's timeline of bytes by manager. */
#include "memviz.h"

/* ---- bounds on the tree ------------------------------------------------------------
 *
 * A pickle's memo lets one container be referenced again and again, or hold
 * itself; nesting needs no MARK. So before the tree is read, one walk bounds
 * its depth, refuses a container that holds itself, and counts the values
 * reached, shared ones each time they are reached, against a budget set by
 * the input's size: what the reader and the page then do is bounded by it. */

#define EXPAND_BASE ((size_t)1 << 20) /* values reached, plus EXPAND_PER_BYTE per byte */
#define EXPAND_PER_BYTE 16

static void tree_check(jval *v, int depth, size_t *budget, size_t limit)
{
    if (!*budget)
        mv_fail("the snapshot reaches more than %zu values through shared references (the bound "
                "is %zu plus %d per byte of the file): refused",
                limit, EXPAND_BASE, EXPAND_PER_BYTE);
    --*budget;
    if (v->t != J_ARR && v->t != J_OBJ)
        return;
    if (v->walking)
        mv_fail("a container holds itself (a reference cycle): refused");
    if (depth > JSON_MAX_DEPTH)
        mv_fail("nested too deeply (more than %d levels)", JSON_MAX_DEPTH);
    v->walking = true;
    for (size_t k = 0; k < v->n; k++)
        tree_check(v->items[k], depth + 1, budget, limit);
    v->walking = false;
}

jval *mv_parse_snapshot(const char *text, size_t len)
{
    jval *root;
    if (len && (unsigned char)text[0] == 0x80) {
        root = mv_pickle_parse(text, len);
    } else {
        if (memchr(text, '\0', len))
            mv_fail("the file holds a NUL byte: not a JSON text");
        root = mv_json_parse(text, len);
    }
    size_t limit = bound(EXPAND_BASE, EXPAND_PER_BYTE, len), budget = limit;
    tree_check(root, 0, &budget, limit);
    return root;
}

/* ---- the snapshot --------------------------------------------------------------
 *
 * Field access with errors that name the path: "segments[2].blocks[0].size". */

static const char *jtype_name(const jval *v)
{
    static const char *names[] = {"null", "a boolean", "a number", "a string", "an array",
                                  "an object"};
    return v ? names[v->t] : "missing";
}

static jval *need(const jval *o, const char *key, jtype t, const char *path)
{
    jval *v = jget(o, key);
    static const char *want[] = {"null", "a boolean", "a number", "a string", "an array",
                                 "an object"};
    if (!v || v->t != t)
        mv_fail("%s%s\"%s\" must be %s (found %s)", path, *path ? "." : "", key, want[t],
                v ? jtype_name(v) : "nothing");
    return v;
}

/* An integer >= 0 (sizes, addresses, times). Optional fields give `dflt`. */
static int64_t need_uint(const jval *o, const char *key, const char *path, bool required,
                         int64_t dflt)
{
    jval *v = jget(o, key);
    if (!v || v->t == J_NULL) {
        if (required)
            mv_fail("%s%s\"%s\" is missing (a non-negative integer)", path, *path ? "." : "", key);
        return dflt;
    }
    if (v->t == J_NUM && (!v->is_int || v->i < 0))
        mv_fail("%s%s\"%s\" must be a non-negative integer (found %.17g)", path, *path ? "." : "",
                key, v->d);
    if (v->t != J_NUM)
        mv_fail("%s%s\"%s\" must be a non-negative integer (found %s)", path, *path ? "." : "", key,
                jtype_name(v));
    return v->i;
}

static const char *opt_str(const jval *o, const char *key, const char *path, const char *dflt)
{
    jval *v = jget(o, key);
    if (!v || v->t == J_NULL)
        return dflt;
    if (v->t != J_STR)
        mv_fail("%s.\"%s\" must be a string (found %s)", path, key, jtype_name(v));
    return v->s;
}

/* Who holds a block: ndm's manager path, else PyTorch's user_metadata, else
 * its category. */
static const char *owner(const jval *o, const char *path)
{
    const char *m = opt_str(o, "manager", path, "");
    if (!*m) {
        const jval *u = jget(o, "user_metadata");
        m = u && u->t == J_STR ? u->s : "";
    }
    if (!*m) {
        const jval *c = jget(o, "category");
        m = c && c->t == J_STR && strcmp(c->s, "unknown") ? c->s : "";
    }
    return m;
}

/* "file:line name; ..." from a frames list, for hover text: made once per
 * list (a pickle shares lists), from its first 8 frames. */
static const char *frames_text(const jval *frames, const char *path)
{
    if (!frames || frames->t == J_NULL)
        return "";
    if (frames->t != J_ARR)
        mv_fail("%s.\"frames\" must be an array (found %s)", path, jtype_name(frames));
    if (frames->text)
        return frames->text;
    char buf[8 * 256];
    size_t o = 0;
    buf[0] = '\0';
    for (size_t k = 0; k < frames->n && k < 8; k++) {
        const jval *f = frames->items[k];
        if (f->t != J_OBJ)
            mv_fail("%s.frames[%zu] must be an object (found %s)", path, k, jtype_name(f));
        const jval *file = jget(f, "filename"), *line = jget(f, "line"), *name = jget(f, "name");
        int w = snprintf(buf + o, sizeof buf - o, "%s%.100s:%" PRId64 " %.100s", k ? "; " : "",
                         file && file->t == J_STR ? file->s : "?",
                         line && line->t == J_NUM && line->is_int ? line->i : (int64_t)0,
                         name && name->t == J_STR ? name->s : "");
        if (w > 0)
            o += (size_t)w < sizeof buf - o ? (size_t)w : sizeof buf - o - 1;
    }
    char *out = mv_xalloc(o + 1);
    memcpy(out, buf, o + 1);
    ((jval *)frames)->text = out;
    return out;
}

int64_t mv_add_i64(int64_t a, int64_t b, const char *what, const char *path)
{
    int64_t r;
    if (__builtin_add_overflow(a, b, &r))
        mv_fail("%s%s%s overflows 64 bits (%" PRId64 " + %" PRId64 ")", path, *path ? ": " : "", what,
                a, b);
    return r;
}

/* One timeline each: a snapshot has a handful. */
#define MAX_DEVICES 64

void mv_read_snapshot(const jval *root, snapshot *s)
{
    if (root->t != J_OBJ)
        mv_fail("the snapshot must be a JSON object (found %s)", jtype_name(root));
    char path[128];
    s->devices = (vec){NULL, 0, 0, sizeof(const char *)};
    s->segments = (vec){NULL, 0, 0, sizeof(segment)};
    s->traces = (vec){NULL, 0, 0, sizeof(vec)};

    /* ndm names its devices; PyTorch's snapshots index CUDA devices. */
    const jval *devs = jget(root, "devices");
    const jval *traces = need(root, "device_traces", J_ARR, "");
    if (devs) {
        if (devs->t != J_ARR)
            mv_fail("\"devices\" must be an array (found %s)", jtype_name(devs));
        for (size_t i = 0; i < devs->n; i++) {
            if (devs->items[i]->t != J_STR)
                mv_fail("devices[%zu] must be a string (found %s)", i, jtype_name(devs->items[i]));
            if (i >= MAX_DEVICES)
                mv_fail("\"devices\" names more than %d devices: refused", MAX_DEVICES);
            for (size_t k = 0; k < i; k++)
                if (!strcmp(devs->items[k]->s, devs->items[i]->s))
                    mv_fail("devices[%zu] \"%s\" is named twice", i, devs->items[i]->s);
            *(const char **)vec_push(&s->devices) = devs->items[i]->s;
        }
    } else {
        if (traces->n > MAX_DEVICES)
            mv_fail("\"device_traces\" has lists for more than %d devices: refused", MAX_DEVICES);
        for (size_t i = 0; i < traces->n; i++) {
            char *name = mv_xalloc(32);
            snprintf(name, 32, "cuda:%zu", i);
            *(const char **)vec_push(&s->devices) = name;
        }
    }

    const jval *segs = jget(root, "segments");
    if (segs && segs->t != J_NULL && segs->t != J_ARR)
        mv_fail("\"segments\" must be an array (found %s)", jtype_name(segs));
    for (size_t i = 0; segs && segs->t == J_ARR && i < segs->n; i++) {
        const jval *js = segs->items[i];
        snprintf(path, sizeof path, "segments[%zu]", i);
        if (js->t != J_OBJ)
            mv_fail("%s must be an object (found %s)", path, jtype_name(js));
        segment *g = vec_push(&s->segments);
        memset(g, 0, sizeof *g);
        const jval *jd = jget(js, "device");
        if (jd && jd->t == J_NUM && jd->is_int && jd->i >= 0 && (size_t)jd->i < s->devices.n)
            g->device = VEC_AT(s->devices, const char *, jd->i);
        else if (jd && jd->t == J_NUM)
            mv_fail("%s.\"device\" %.17g is no index into \"device_traces\"", path, jd->d);
        else
            g->device = need(js, "device", J_STR, path)->s;
        g->dev = -1;
        for (size_t d = 0; d < s->devices.n; d++)
            if (!strcmp(g->device, VEC_AT(s->devices, const char *, d)))
                g->dev = (int)d;
        g->type = opt_str(js, "segment_type", path, "");
        g->address = need_uint(js, "address", path, true, 0);
        g->total = need_uint(js, "total_size", path, true, 0);
        g->allocated = need_uint(js, "allocated_size", path, false, 0);
        g->active = need_uint(js, "active_size", path, false, 0);
        g->requested = need_uint(js, "requested_size", path, false, 0);
        g->stream = need_uint(js, "stream", path, false, 0);
        g->blocks = (vec){NULL, 0, 0, sizeof(block)};
        const jval *jb = need(js, "blocks", J_ARR, path);
        int64_t next = g->address;
        for (size_t k = 0; k < jb->n; k++) {
            char bpath[160];
            snprintf(bpath, sizeof bpath, "%s.blocks[%zu]", path, k);
            const jval *b = jb->items[k];
            if (b->t != J_OBJ)
                mv_fail("%s must be an object (found %s)", bpath, jtype_name(b));
            block *x = vec_push(&g->blocks);
            /* PyTorch's blocks may leave out their address: they tile. */
            x->address = need_uint(b, "address", bpath, false, next);
            x->size = need_uint(b, "size", bpath, true, 0);
            x->requested = need_uint(b, "requested_size", bpath, false, 0);
            x->state = need(b, "state", J_STR, bpath)->s;
            x->manager = owner(b, bpath);
            x->frames = frames_text(jget(b, "frames"), bpath);
            if (strcmp(x->state, "active_allocated") && strcmp(x->state, "active_pending_free") &&
                strcmp(x->state, "inactive"))
                mv_warn("%s: unknown state \"%s\"", bpath, x->state);
            if (x->address != next)
                mv_warn("%s starts at %" PRId64 ", where the previous block ended at %" PRId64,
                        bpath, x->address, next);
            next = mv_add_i64(x->address, x->size, "address + size", bpath);
        }
        if (next != mv_add_i64(g->address, g->total, "address + total_size", path))
            mv_warn("%s: its blocks cover %" PRId64 " of its %" PRId64 " bytes", path,
                    next - g->address, g->total);
    }

    if (traces->n != s->devices.n)
        mv_fail("\"device_traces\" has %zu list%s for %zu device%s: one list per device", traces->n,
                traces->n == 1 ? "" : "s", s->devices.n, s->devices.n == 1 ? "" : "s");
    for (size_t d = 0; d < traces->n; d++) {
        const jval *list = traces->items[d];
        if (list->t != J_ARR)
            mv_fail("device_traces[%zu] must be an array (found %s)", d, jtype_name(list));
        vec *ev = vec_push(&s->traces);
        *ev = (vec){NULL, 0, 0, sizeof(event)};
        int64_t last = INT64_MIN;
        for (size_t k = 0; k < list->n; k++) {
            snprintf(path, sizeof path, "device_traces[%zu][%zu]", d, k);
            const jval *je = list->items[k];
            if (je->t != J_OBJ)
                mv_fail("%s must be an object (found %s)", path, jtype_name(je));
            event *e = vec_push(ev);
            e->action = need(je, "action", J_STR, path)->s;
            /* An out-of-memory entry gives the free device bytes instead. */
            e->addr = need_uint(je, "addr", path, false, 0);
            if (!strcmp(e->action, "oom"))
                e->addr = need_uint(je, "device_free", path, false, e->addr);
            e->size = need_uint(je, "size", path, false, 0);
            /* Snapshots without times are drawn by event index. */
            e->time_us = need_uint(je, "time_us", path, false,
                                   last == INT64_MIN ? 0 : last == INT64_MAX ? last : last + 1);
            e->manager = owner(je, path);
            e->frames = frames_text(jget(je, "frames"), path);
            if (e->time_us < last) {
                mv_warn("%s: time_us goes back from %" PRId64 " to %" PRId64 "; drawn at %" PRId64,
                        path, last, e->time_us, last);
                e->time_us = last;
            }
            last = e->time_us;
        }
    }
    const jval *settings = jget(root, "allocator_settings");
    if (settings && settings->t != J_OBJ && settings->t != J_NULL)
        mv_fail("\"allocator_settings\" must be an object (found %s)", jtype_name(settings));
    s->settings = settings && settings->t == J_OBJ ? settings : NULL;
}

/* ---- the timeline ---------------------------------------------------------------
 *
 * alloc adds its size to its manager; the first of free_requested and
 * free_completed for that address takes it away again (from the manager that
 * allocated it: a free may not name one). segment_alloc/segment_map and
 * segment_free/segment_unmap move the reserved line. */

typedef struct live_entry {
    int64_t addr; /* -1: empty */
    int64_t size;
    int series;
} live_entry;

typedef struct live_map {
    live_entry *t;
    size_t cap, n;
} live_map;

static size_t hash_addr(int64_t a, size_t cap)
{
    uint64_t x = (uint64_t)a * UINT64_C(0x9e3779b97f4a7c15);
    return (size_t)(x >> 17) & (cap - 1);
}

static live_entry *live_find(live_map *m, int64_t addr)
{
    size_t i = hash_addr(addr, m->cap);
    while (m->t[i].addr != -1 && m->t[i].addr != addr)
        i = (i + 1) & (m->cap - 1);
    return &m->t[i];
}

static void live_grow(live_map *m)
{
    live_map g = {NULL, m->cap ? 2 * m->cap : 1024, 0};
    g.t = mv_xalloc(g.cap * sizeof *g.t);
    for (size_t i = 0; i < g.cap; i++)
        g.t[i].addr = -1;
    for (size_t i = 0; i < m->cap; i++)
        if (m->t[i].addr != -1) {
            *live_find(&g, m->t[i].addr) = m->t[i];
            g.n++;
        }
    *m = g;
}

/* Removing from linear probing: shift the run that follows into the hole. */
static void live_remove(live_map *m, live_entry *e)
{
    size_t i = (size_t)(e - m->t), j = i;
    m->t[i].addr = -1;
    for (;;) {
        j = (j + 1) & (m->cap - 1);
        if (m->t[j].addr == -1)
            break;
        size_t h = hash_addr(m->t[j].addr, m->cap);
        bool movable = i <= j ? (h <= i || h > j) : (h <= i && h > j);
        if (movable) {
            m->t[i] = m->t[j];
            m->t[j].addr = -1;
            i = j;
        }
    }
    m->n--;
}

#define MAX_POINTS 2000

static void index_rebuild(timeline *tl, size_t cap)
{
    tl->index = mv_xalloc(cap * sizeof *tl->index);
    tl->index_cap = cap;
    for (size_t i = 0; i < cap; i++)
        tl->index[i] = SIZE_MAX;
    for (size_t k = 0; k < tl->series.n; k++) {
        size_t i = hash_str(VEC_AT(tl->series, series, k).manager) & (cap - 1);
        while (tl->index[i] != SIZE_MAX)
            i = (i + 1) & (cap - 1);
        tl->index[i] = k;
    }
}

/* Per-step managers fold into one series: a path component "<name>-<digits>"
 * becomes "<name>-*", so a training run's thousand "batch-N" managers are
 * one series, "system/model/trainer/batch-*". */
const char *mv_fold_manager(const char *m, char *buf, size_t cap)
{
    size_t o = 0;
    const char *p = m;
    while (*p && o + 3 < cap) {
        size_t n = strcspn(p, "/");
        size_t d = n;
        while (d > 0 && p[d - 1] >= '0' && p[d - 1] <= '9')
            d--;
        bool fold = d < n && d >= 2 && p[d - 1] == '-';
        size_t take = fold ? d : n;
        if (o + take + 3 >= cap)
            return m;
        memcpy(buf + o, p, take);
        o += take;
        if (fold)
            buf[o++] = '*';
        p += n;
        if (*p == '/')
            buf[o++] = *p++;
    }
    if (*p)
        return m;
    buf[o] = '\0';
    return buf;
}

static int series_of(timeline *tl, const char *manager)
{
    char fb[1024];
    if (!*manager)
        manager = "(unknown manager)";
    manager = mv_fold_manager(manager, fb, sizeof fb);
    size_t i = hash_str(manager) & (tl->index_cap - 1);
    for (; tl->index[i] != SIZE_MAX; i = (i + 1) & (tl->index_cap - 1))
        if (!strcmp(VEC_AT(tl->series, series, tl->index[i]).manager, manager))
            return (int)tl->index[i];
    series *x = vec_push(&tl->series);
    char *kept = mv_xalloc(strlen(manager) + 1);
    x->manager = strcpy(kept, manager);
    x->now = x->peak = 0;
    if (2 * tl->series.n > tl->index_cap)
        index_rebuild(tl, 2 * tl->index_cap);
    else
        tl->index[i] = tl->series.n - 1;
    return (int)tl->series.n - 1;
}

static void series_add(timeline *tl, int si, int64_t bytes)
{
    series *s = &VEC_AT(tl->series, series, si);
    s->now = mv_add_i64(s->now, bytes, "a manager's byte count", "");
    if (s->now > s->peak)
        s->peak = s->now;
    tl->total = mv_add_i64(tl->total, bytes, "the byte count in use", "");
    if (tl->total > tl->peak_total)
        tl->peak_total = tl->total;
    if (tl->shown_of) {
        int g = tl->shown_of[si];
        tl->group_now[g] = mv_add_i64(tl->group_now[g], bytes, "a manager's byte count", "");
        if (tl->group_now[g] > tl->group_peak[g])
            tl->group_peak[g] = tl->group_now[g];
    }
}

typedef void (*visit_fn)(timeline *tl, size_t k, const event *e, int64_t reserved, void *ud);
static void emit_point(timeline *tl, int64_t t, const int64_t *vals, int64_t reserved);

/* The state before the first event, replayed backwards from the segments:
 * the blocks a ring that wrapped no longer shows being allocated are drawn
 * from the start (PyTorch's viewer does the same), and so are the
 * segments mapped before it. */
static void window_start(timeline *tl, const snapshot *s, const vec *events)
{
    live_map live = {NULL, 0, 0};
    live_grow(&live);
    tl->initial = (vec){NULL, 0, 0, sizeof(live_entry)};
    tl->initial_manager = (vec){NULL, 0, 0, sizeof(const char *)};
    int64_t reserved = 0;
    for (size_t i = 0; i < s->segments.n; i++) {
        const segment *g = &VEC_AT(s->segments, segment, i);
        if (g->dev != tl->dev)
            continue;
        reserved = mv_add_i64(reserved, g->total, "the reserved byte count", "");
        for (size_t k = 0; k < g->blocks.n; k++) {
            const block *b = &VEC_AT(g->blocks, block, k);
            if (!strcmp(b->state, "inactive"))
                continue;
            if (2 * (live.n + 1) > live.cap)
                live_grow(&live);
            live_entry *x = live_find(&live, b->address);
            if (x->addr != -1)
                continue;
            *(const char **)vec_push(&tl->initial_manager) = b->manager;
            *x = (live_entry){b->address, b->size, (int)tl->initial_manager.n - 1};
            live.n++;
        }
    }
    for (size_t k = events->n; k-- > 0;) {
        const event *e = &VEC_AT(*events, event, k);
        const char *a = e->action;
        if (!strcmp(a, "alloc")) {
            live_entry *x = live_find(&live, e->addr);
            if (x->addr != -1)
                live_remove(&live, x);
        } else if (!strcmp(a, "free_completed")) {
            if (2 * (live.n + 1) > live.cap)
                live_grow(&live);
            live_entry *x = live_find(&live, e->addr);
            if (x->addr == -1) {
                *(const char **)vec_push(&tl->initial_manager) = e->manager;
                *x = (live_entry){e->addr, e->size, (int)tl->initial_manager.n - 1};
                live.n++;
            }
        } else if (!strcmp(a, "segment_alloc") || !strcmp(a, "segment_map")) {
            reserved = mv_add_i64(reserved, -e->size, "the reserved byte count", "");
        } else if (!strcmp(a, "segment_free") || !strcmp(a, "segment_unmap")) {
            reserved = mv_add_i64(reserved, e->size, "the reserved byte count", "");
        }
    }
    for (size_t i = 0; i < live.cap; i++)
        if (live.t[i].addr != -1)
            *(live_entry *)vec_push(&tl->initial) = live.t[i];
    tl->initial_reserved = reserved > 0 ? reserved : 0;
}

/* One pass over the events, calling visit (when given) after each. */
static void replay(timeline *tl, const vec *events, visit_fn visit, void *ud)
{
    live_map live = {NULL, 0, 0};
    live_grow(&live);
    for (size_t k = 0; k < tl->series.n; k++)
        VEC_AT(tl->series, series, k).now = 0;
    int64_t reserved = tl->initial_reserved;
    tl->unknown_frees = 0;
    tl->total = 0;
    for (size_t k = 0; k < tl->initial.n; k++) {
        const live_entry *b = &VEC_AT(tl->initial, live_entry, k);
        if (2 * (live.n + 1) > live.cap)
            live_grow(&live);
        int si = series_of(tl, VEC_AT(tl->initial_manager, const char *, b->series));
        *live_find(&live, b->addr) = (live_entry){b->addr, b->size, si};
        live.n++;
        series_add(tl, si, b->size);
    }
    if (visit && events->n)
        emit_point(tl, VEC_AT(*events, event, 0).time_us, tl->group_now, reserved);
    for (size_t k = 0; k < events->n; k++) {
        const event *e = &VEC_AT(*events, event, k);
        const char *a = e->action;
        if (!strcmp(a, "alloc")) {
            if (2 * (live.n + 1) > live.cap)
                live_grow(&live);
            live_entry *x = live_find(&live, e->addr);
            if (x->addr != -1) { /* reused without a free in the trace */
                series_add(tl, x->series, -x->size);
                live_remove(&live, x);
                x = live_find(&live, e->addr);
            }
            int si = series_of(tl, e->manager);
            *x = (live_entry){e->addr, e->size, si};
            live.n++;
            series_add(tl, si, e->size);
        } else if (!strcmp(a, "free_requested") || !strcmp(a, "free_completed")) {
            live_entry *x = live_find(&live, e->addr);
            if (x->addr != -1) {
                series_add(tl, x->series, -x->size);
                live_remove(&live, x);
            } else if (!strcmp(a, "free_requested")) {
                tl->unknown_frees++;
            }
        } else if (!strcmp(a, "segment_alloc") || !strcmp(a, "segment_map")) {
            reserved = mv_add_i64(reserved, e->size, "the reserved byte count", "");
        } else if (!strcmp(a, "segment_free") || !strcmp(a, "segment_unmap")) {
            reserved = mv_add_i64(reserved, -e->size, "the reserved byte count", "");
        }
        if (visit)
            visit(tl, k, e, reserved, ud);
    }
}

static int cmp_peak_desc(const void *a, const void *b)
{
    const series *x = a, *y = b;
    return x->peak < y->peak ? 1 : x->peak > y->peak ? -1 : strcmp(x->manager, y->manager);
}

typedef struct sampler {
    size_t bucket;          /* events per point */
    int64_t best_total;     /* the fullest state seen in the current bucket */
    int64_t *best, best_t, best_reserved;
    bool have;
} sampler;

static void emit_point(timeline *tl, int64_t t, const int64_t *vals, int64_t reserved)
{
    *(int64_t *)vec_push(&tl->t) = t;
    for (int k = 0; k < tl->nshown; k++)
        *(int64_t *)vec_push(&tl->values) = vals[k];
    *(int64_t *)vec_push(&tl->reserved) = reserved;
}

/* Keeps, per bucket of events, the state whose total is highest, so peaks
 * survive the thinning of long traces. */
static void sample(timeline *tl, size_t k, const event *e, int64_t reserved, void *ud)
{
    sampler *sm = ud;
    if (!strcmp(e->action, "oom"))
        *(int64_t *)vec_push(&tl->ooms) = e->time_us;
    if (!sm->have || tl->total >= sm->best_total) {
        memcpy(sm->best, tl->group_now, (size_t)tl->nshown * sizeof *sm->best);
        sm->best_total = tl->total;
        sm->best_t = e->time_us;
        sm->best_reserved = reserved;
        sm->have = true;
    }
    if ((k + 1) % sm->bucket == 0 || (int64_t)k + 1 == tl->events) {
        emit_point(tl, sm->best_t, sm->best, sm->best_reserved);
        sm->have = false;
    }
}

void mv_build_timeline(timeline *tl, int dev, const char *device, const vec *events,
                              const snapshot *s)
{
    memset(tl, 0, sizeof *tl);
    tl->dev = dev;
    tl->device = device;
    tl->series = (vec){NULL, 0, 0, sizeof(series)};
    tl->t = (vec){NULL, 0, 0, sizeof(int64_t)};
    tl->values = (vec){NULL, 0, 0, sizeof(int64_t)};
    tl->reserved = (vec){NULL, 0, 0, sizeof(int64_t)};
    tl->ooms = (vec){NULL, 0, 0, sizeof(int64_t)};
    tl->events = (int64_t)events->n;
    index_rebuild(tl, 64);
    window_start(tl, s, events);
    /* First pass: the managers and their peaks. */
    replay(tl, events, NULL, NULL);
    size_t ns = tl->series.n;
    if (ns)
        qsort(tl->series.items, ns, sizeof(series), cmp_peak_desc);
    index_rebuild(tl, tl->index_cap);
    int keep = ns > MAX_SERIES ? MAX_SERIES - 1 : (int)ns;
    tl->nshown = ns > MAX_SERIES ? MAX_SERIES : (int)ns;
    tl->shown_of = mv_xalloc((ns ? ns : 1) * sizeof(int));
    for (size_t k = 0; k < ns; k++)
        tl->shown_of[k] = (int)k < keep ? (int)k : keep;
    size_t gsz = ((size_t)tl->nshown + 1) * sizeof(int64_t);
    tl->group_now = mv_xalloc(gsz);
    tl->group_peak = mv_xalloc(gsz);
    memset(tl->group_now, 0, gsz);
    memset(tl->group_peak, 0, gsz);
    /* Second pass: the points, from an empty state at the first event. */
    sampler sm = {0};
    sm.bucket = events->n > MAX_POINTS ? (events->n + MAX_POINTS - 1) / MAX_POINTS : 1;
    sm.best = mv_xalloc(gsz);
    tl->peak_total = 0;
    replay(tl, events, sample, &sm);
}
