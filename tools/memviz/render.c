/* ndm-memviz's renderer: the snapshot and its timelines as the page's JSON
 * data, with the comparison of two snapshots, inside the page of page.html. */
#include <stdarg.h>

#include "memviz.h"
#include "page.h"

/* ---- output ----------------------------------------------------------------------- */

/* Every byte of the page goes through these (the bound: memviz.h). */
size_t mv_out_bytes, mv_out_limit = SIZE_MAX;

static void out_count(size_t n)
{
    mv_out_bytes += n;
    if (mv_out_bytes > mv_out_limit)
        mv_fail("the page would be larger than %zu MiB (the bound is %d MiB plus %d bytes per "
                "byte of the snapshot): refused",
                mv_out_limit >> 20, (int)(OUTPUT_BASE >> 20), OUTPUT_PER_BYTE);
}

static void out_printf(FILE *f, const char *fmt, ...) PRINTF(2, 3);
static void out_printf(FILE *f, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vfprintf(f, fmt, ap);
    va_end(ap);
    out_count(n > 0 ? (size_t)n : 0); /* an error shows in ferror at the end */
}

static void out_putc(int c, FILE *f)
{
    fputc(c, f);
    out_count(1);
}

static void out_puts(const char *s, FILE *f)
{
    fputs(s, f);
    out_count(strlen(s));
}

/* A JSON string safe inside <script>: no "</", no U+2028/2029. */
static void put_jstr(FILE *f, const char *s)
{
    out_putc('"', f);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        unsigned c = *p;
        if (c == '"' || c == '\\')
            out_printf(f, "\\%c", c);
        else if (c < 0x20 || c == '<' || c == '>' || c == '&')
            out_printf(f, "\\u%04x", c);
        else if (c == 0xe2 && p[1] == 0x80 && (p[2] == 0xa8 || p[2] == 0xa9)) {
            out_printf(f, "\\u%04x", p[2] == 0xa8 ? 0x2028 : 0x2029);
            p += 2;
        } else
            out_putc((int)c, f);
    }
    out_putc('"', f);
}

static void put_jval(FILE *f, const jval *v)
{
    switch (v->t) {
    case J_NULL: out_puts("null", f); break;
    case J_BOOL: out_puts(v->b ? "true" : "false", f); break;
    case J_NUM:
        if (v->is_int)
            out_printf(f, "%" PRId64, v->i);
        else
            out_printf(f, "%.17g", v->d);
        break;
    case J_STR: put_jstr(f, v->s); break;
    case J_ARR:
    case J_OBJ:
        out_putc(v->t == J_ARR ? '[' : '{', f);
        for (size_t k = 0; k < v->n; k++) {
            if (k)
                out_putc(',', f);
            if (v->t == J_OBJ) {
                put_jstr(f, v->keys[k]);
                out_putc(':', f);
            }
            put_jval(f, v->items[k]);
        }
        out_putc(v->t == J_ARR ? ']' : '}', f);
        break;
    }
}

static void put_i64_list(FILE *f, const vec *v)
{
    out_putc('[', f);
    for (size_t k = 0; k < v->n; k++)
        out_printf(f, "%s%" PRId64, k ? "," : "", VEC_AT(*v, int64_t, k));
    out_putc(']', f);
}

/* Strings the page refers to by index (managers, stacks), each once. */
typedef struct strtab {
    vec list;      /* const char * */
    size_t *slot;  /* open addressing: index + 1, 0 empty */
    size_t cap;
} strtab;

static size_t str_id(strtab *t, const char *s)
{
    if (2 * (t->list.n + 1) > t->cap) {
        size_t cap = t->cap ? 2 * t->cap : 1024;
        t->slot = mv_xalloc(cap * sizeof *t->slot);
        memset(t->slot, 0, cap * sizeof *t->slot);
        t->cap = cap;
        for (size_t k = 0; k < t->list.n; k++) {
            size_t i = hash_str(VEC_AT(t->list, const char *, k)) & (cap - 1);
            while (t->slot[i])
                i = (i + 1) & (cap - 1);
            t->slot[i] = k + 1;
        }
    }
    size_t i = hash_str(s) & (t->cap - 1);
    for (; t->slot[i]; i = (i + 1) & (t->cap - 1))
        if (!strcmp(VEC_AT(t->list, const char *, t->slot[i] - 1), s))
            return t->slot[i] - 1;
    *(const char **)vec_push(&t->list) = s;
    t->slot[i] = t->list.n;
    return t->list.n - 1;
}

/* The events the page replays (hover, the segment slider): the last
 * MAX_REPLAY of each device, as parallel arrays. The replay runs backwards
 * from the segments, so a window that starts late is still exact. */
#define MAX_REPLAY 200000

static const char *const action_codes[] = {"alloc",        "free_requested", "free_completed",
                                           "segment_alloc", "segment_free",  "segment_map",
                                           "segment_unmap", "oom",           "snapshot"};

static void write_events(FILE *f, const vec *events, strtab *st)
{
    size_t first = events->n > MAX_REPLAY ? events->n - MAX_REPLAY : 0;
    static const char *const keys[] = {"t", "a", "addr", "size", "m", "f"};
    out_printf(f, ",\"skipped\":%zu,\"ev\":{", first);
    for (int key = 0; key < 6; key++) {
        out_printf(f, "%s\"%s\":[", key ? "," : "", keys[key]);
        for (size_t k = first; k < events->n; k++) {
            const event *e = &VEC_AT(*events, event, k);
            int64_t v = 0;
            switch (key) {
            case 0: v = e->time_us; break;
            case 1:
                v = 9;
                for (int c = 0; c < 9; c++)
                    if (!strcmp(e->action, action_codes[c]))
                        v = c;
                break;
            case 2: v = e->addr; break;
            case 3: v = e->size; break;
            case 4: v = (int64_t)str_id(st, e->manager); break;
            case 5: v = (int64_t)str_id(st, e->frames); break;
            }
            out_printf(f, "%s%" PRId64, k > first ? "," : "", v);
        }
        out_putc(']', f);
    }
    out_putc('}', f);
}

static void write_compare(FILE *f, const snapshot *before, const char *before_name,
                          const snapshot *after);

static void write_data(FILE *f, const snapshot *s, const timeline *tls, size_t ntl,
                       const snapshot *before, const char *before_name)
{
    strtab st = {{NULL, 0, 0, sizeof(const char *)}, NULL, 0};
    out_printf(f, "{\"source\":");
    put_jstr(f, mv_input_name);
    out_printf(f, ",\"timelines\":[");
    for (size_t d = 0; d < ntl; d++) {
        const timeline *tl = &tls[d];
        out_printf(f, "%s{\"device\":", d ? "," : "");
        put_jstr(f, tl->device);
        out_printf(f, ",\"events\":%" PRId64 ",\"unknown_frees\":%" PRId64 ",\"peak_total\":%" PRId64
                   ",\"series\":[",
                tl->events, tl->unknown_frees, tl->peak_total);
        size_t ns = tl->series.n;
        for (int k = 0; k < tl->nshown; k++) {
            bool other = ns > MAX_SERIES && k == tl->nshown - 1;
            int64_t peak = tl->group_peak[k];
            out_printf(f, "%s{\"manager\":", k ? "," : "");
            if (other) {
                char name[64];
                snprintf(name, sizeof name, "(%zu other managers)", ns - (size_t)k);
                put_jstr(f, name);
            } else {
                put_jstr(f, VEC_AT(tl->series, series, k).manager);
            }
            out_printf(f, ",\"peak\":%" PRId64 "}", peak);
        }
        out_printf(f, "],\"t\":");
        put_i64_list(f, &tl->t);
        out_printf(f, ",\"values\":");
        put_i64_list(f, &tl->values);
        out_printf(f, ",\"reserved\":");
        put_i64_list(f, &tl->reserved);
        out_printf(f, ",\"ooms\":");
        put_i64_list(f, &tl->ooms);
        write_events(f, &VEC_AT(s->traces, vec, d), &st);
        out_printf(f, "}");
    }
    out_printf(f, "],\"segments\":[");
    for (size_t i = 0; i < s->segments.n; i++) {
        const segment *g = &VEC_AT(s->segments, segment, i);
        out_printf(f, "%s{\"device\":", i ? "," : "");
        put_jstr(f, g->device);
        out_printf(f, ",\"type\":");
        put_jstr(f, g->type);
        out_printf(f,
                ",\"address\":%" PRId64 ",\"total\":%" PRId64 ",\"allocated\":%" PRId64
                ",\"active\":%" PRId64 ",\"requested\":%" PRId64 ",\"stream\":%" PRId64
                ",\"blocks\":[",
                g->address, g->total, g->allocated, g->active, g->requested, g->stream);
        for (size_t k = 0; k < g->blocks.n; k++) {
            const block *b = &VEC_AT(g->blocks, block, k);
            out_printf(f, "%s{\"offset\":%" PRId64 ",\"size\":%" PRId64 ",\"requested\":%" PRId64
                       ",\"state\":",
                    k ? "," : "", b->address - g->address, b->size, b->requested);
            put_jstr(f, b->state);
            out_printf(f, ",\"manager\":");
            put_jstr(f, b->manager);
            out_printf(f, ",\"frames\":");
            put_jstr(f, b->frames);
            out_printf(f, "}");
        }
        out_printf(f, "]}");
    }
    out_printf(f, "],\"settings\":");
    if (s->settings)
        put_jval(f, s->settings);
    else
        out_puts("{}", f);
    out_printf(f, ",\"strings\":[");
    for (size_t k = 0; k < st.list.n; k++) {
        if (k)
            out_putc(',', f);
        put_jstr(f, VEC_AT(st.list, const char *, k));
    }
    out_printf(f, "],\"compare\":");
    if (before)
        write_compare(f, before, before_name, s);
    else
        out_puts("null", f);
    out_printf(f, ",\"warnings\":[");
    for (size_t k = 0; k < mv_warnings.n; k++) {
        if (k)
            out_putc(',', f);
        put_jstr(f, VEC_AT(mv_warnings, char *, k));
    }
    out_printf(f, "]}");
}

/* ---- comparison ---------------------------------------------------------------------
 * Two snapshots side by side: the live bytes of each (folded) manager in
 * their segments, and the segments only one of them has (PyTorch's compare). */

typedef struct held {
    const char *manager;
    int64_t before, after;
} held;

/* A manager's bytes, found by name through t (whose ids are v's indices). */
static void add_held(vec *v, strtab *t, const char *manager, int64_t bytes, bool after)
{
    char fb[1024];
    const char *m = mv_fold_manager(*manager ? manager : "(unknown manager)", fb, sizeof fb);
    size_t id = str_id(t, m);
    if (id == v->n) {
        held *h = vec_push(v);
        char *kept = mv_xalloc(strlen(m) + 1);
        h->manager = strcpy(kept, m);
        VEC_AT(t->list, const char *, id) = h->manager;
        h->before = h->after = 0;
    }
    held *h = &VEC_AT(*v, held, id);
    int64_t *x = after ? &h->after : &h->before;
    *x = mv_add_i64(*x, bytes, "a manager's byte count", "");
}

static int cmp_held(const void *a, const void *b)
{
    const held *x = a, *y = b;
    int64_t dx = llabs(x->after - x->before), dy = llabs(y->after - y->before);
    return dx < dy ? 1 : dx > dy ? -1 : strcmp(x->manager, y->manager);
}

/* The segments of one snapshot by (device, address, size), each once: a
 * pickle may list one segment a million times. */
typedef struct segset {
    const segment **slot;
    size_t cap;
} segset;

static bool same_segment(const segment *a, const segment *b)
{
    return a->address == b->address && a->total == b->total && !strcmp(a->device, b->device);
}

static size_t segment_hash(const segment *g, size_t cap)
{
    uint64_t x = (uint64_t)g->address * UINT64_C(0x9e3779b97f4a7c15) ^
                 (uint64_t)g->total * UINT64_C(0xc2b2ae3d27d4eb4f) ^ (uint64_t)hash_str(g->device);
    return (size_t)(x ^ x >> 29) & (cap - 1);
}

static const segment **segset_find(const segset *ss, const segment *g)
{
    size_t i = segment_hash(g, ss->cap);
    while (ss->slot[i] && !same_segment(ss->slot[i], g))
        i = (i + 1) & (ss->cap - 1);
    return &ss->slot[i];
}

static void segset_build(segset *ss, const snapshot *s)
{
    ss->cap = 16;
    while (ss->cap < 2 * s->segments.n + 2)
        ss->cap *= 2;
    ss->slot = mv_xalloc(ss->cap * sizeof *ss->slot);
    memset(ss->slot, 0, ss->cap * sizeof *ss->slot);
    for (size_t i = 0; i < s->segments.n; i++) {
        const segment *g = &VEC_AT(s->segments, segment, i);
        const segment **x = segset_find(ss, g);
        if (!*x)
            *x = g;
    }
}

static void write_only(FILE *f, const snapshot *s, const snapshot *other)
{
    segset theirs;
    segset_build(&theirs, other);
    out_putc('[', f);
    bool first = true;
    for (size_t i = 0; i < s->segments.n; i++) {
        const segment *g = &VEC_AT(s->segments, segment, i);
        if (*segset_find(&theirs, g))
            continue;
        out_printf(f, "%s{\"device\":", first ? "" : ",");
        put_jstr(f, g->device);
        out_printf(f, ",\"address\":%" PRId64 ",\"total\":%" PRId64 "}", g->address, g->total);
        first = false;
    }
    out_putc(']', f);
}

static void write_compare(FILE *f, const snapshot *before, const char *before_name,
                          const snapshot *after)
{
    vec hv = {NULL, 0, 0, sizeof(held)};
    strtab names = {{NULL, 0, 0, sizeof(const char *)}, NULL, 0};
    const snapshot *both[2] = {before, after};
    int64_t reserved[2] = {0, 0};
    for (int w = 0; w < 2; w++)
        for (size_t i = 0; i < both[w]->segments.n; i++) {
            const segment *g = &VEC_AT(both[w]->segments, segment, i);
            reserved[w] = mv_add_i64(reserved[w], g->total, "the reserved byte count", "");
            for (size_t k = 0; k < g->blocks.n; k++) {
                const block *b = &VEC_AT(g->blocks, block, k);
                if (strcmp(b->state, "inactive"))
                    add_held(&hv, &names, b->manager, b->size, w == 1);
            }
        }
    if (hv.n)
        qsort(hv.items, hv.n, sizeof(held), cmp_held);
    out_printf(f, "{\"source\":");
    put_jstr(f, before_name);
    out_printf(f, ",\"reserved_before\":%" PRId64 ",\"reserved_after\":%" PRId64
               ",\"managers\":[",
            reserved[0], reserved[1]);
    for (size_t k = 0; k < hv.n; k++) {
        const held *h = &VEC_AT(hv, held, k);
        out_printf(f, "%s{\"manager\":", k ? "," : "");
        put_jstr(f, h->manager);
        out_printf(f, ",\"before\":%" PRId64 ",\"after\":%" PRId64 "}", h->before, h->after);
    }
    out_printf(f, "],\"only_before\":");
    write_only(f, before, after);
    out_printf(f, ",\"only_after\":");
    write_only(f, after, before);
    out_putc('}', f);
}

/* The page around the data: CSS and the drawing script. */

void mv_render(FILE *out, const snapshot *s, const snapshot *before, const char *before_name)
{
    size_t ntl = s->devices.n;
    timeline *tls = mv_xalloc((ntl ? ntl : 1) * sizeof *tls);
    for (size_t d = 0; d < ntl; d++)
        mv_build_timeline(&tls[d], (int)d, VEC_AT(s->devices, const char *, d),
                          &VEC_AT(s->traces, vec, d), s);
    out_puts(page_head, out);
    write_data(out, s, tls, ntl, before, before_name);
    out_puts(page_tail, out);
}
