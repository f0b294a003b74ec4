/* ndm-memviz: turns a memory snapshot (ndm_memory_dump_snapshot's JSON) into one
 * self-contained HTML page: bytes over time stacked by manager, and the segment map.
 *
 *   ndm-memviz snapshot.json out.html
 *
 * The page carries its data, CSS and script inline and fetches nothing. Its
 * script draws the plots as SVG, then marks <body data-rendered="1"> with the
 * number of series and blocks drawn, so that a headless browser can check it.
 * Exit status: 0 done, 1 unreadable or malformed snapshot, 2 usage. */
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- memory: one arena, freed at exit ---------------------------------------- */

typedef struct chunk {
    struct chunk *next;
    size_t used, cap;
    max_align_t data[];
} chunk;

static chunk *arena;

static void *xalloc(size_t n)
{
    n = (n + sizeof(max_align_t) - 1) / sizeof(max_align_t) * sizeof(max_align_t);
    if (!arena || arena->cap - arena->used < n) {
        size_t cap = n > ((size_t)1 << 20) ? n : (size_t)1 << 20;
        chunk *c = malloc(sizeof *c + cap);
        if (!c) {
            fprintf(stderr, "ndm-memviz: out of memory\n");
            exit(1);
        }
        c->next = arena;
        c->used = 0;
        c->cap = cap;
        arena = c;
    }
    void *p = (char *)arena->data + arena->used;
    arena->used += n;
    return p;
}

static void arena_free(void)
{
    while (arena) {
        chunk *n = arena->next;
        free(arena);
        arena = n;
    }
}

/* A growable array in the arena (a grown array leaves its old block behind:
 * the arena lives for one run). */
typedef struct vec {
    void *items;
    size_t n, cap, size;
} vec;

static void *vec_push(vec *v)
{
    if (v->n == v->cap) {
        size_t cap = v->cap ? 2 * v->cap : 8;
        void *items = xalloc(cap * v->size);
        if (v->n)
            memcpy(items, v->items, v->n * v->size);
        v->items = items;
        v->cap = cap;
    }
    return (char *)v->items + v->n++ * v->size;
}

#define VEC_AT(v, T, i) (((T *)(v).items)[i])

/* ---- errors ---------------------------------------------------------------- */

static const char *input_name = "snapshot";
static char *input_text; /* the file's bytes (malloc), freed on every exit */

#if defined(__GNUC__)
#define NORETURN __attribute__((noreturn))
#define PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define NORETURN
#define PRINTF(a, b)
#endif

static void fail(const char *fmt, ...) NORETURN PRINTF(1, 2);
static void fail(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "ndm-memviz: %s: ", input_name);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    arena_free();
    free(input_text);
    exit(1);
}

/* Warnings go to stderr and into the page. */
static vec warnings = {NULL, 0, 0, sizeof(char *)};

static void warn(const char *fmt, ...) PRINTF(1, 2);
static void warn(const char *fmt, ...)
{
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    fprintf(stderr, "ndm-memviz: %s: warning: %s\n", input_name, buf);
    if (warnings.n < 100) {
        char *s = xalloc(strlen(buf) + 1);
        strcpy(s, buf);
        *(char **)vec_push(&warnings) = s;
    }
}

/* ---- JSON ---------------------------------------------------------------------
 *
 * A strict reader (RFC 8259) into a tree: objects keep their keys in order,
 * integers that fit in int64 are kept exact (addresses), nesting is bounded
 * so a hostile file cannot exhaust the stack, and every error names the line
 * and column. */

typedef enum jtype { J_NULL, J_BOOL, J_NUM, J_STR, J_ARR, J_OBJ } jtype;

typedef struct jval jval;
struct jval {
    jtype t;
    bool b;
    bool is_int;        /* J_NUM: an integer that fits in int64 */
    int64_t i;
    double d;
    const char *s;      /* J_STR, NUL-terminated (a NUL inside is refused) */
    size_t n;           /* J_ARR / J_OBJ: entries */
    jval **items;
    const char **keys;  /* J_OBJ */
};

#define JSON_MAX_DEPTH 256

typedef struct reader {
    const char *p, *end, *start;
} reader;

static void where(const reader *r, const char *at, int *line, int *col)
{
    *line = 1;
    *col = 1;
    for (const char *q = r->start; q < at; q++) {
        if (*q == '\n') {
            ++*line;
            *col = 1;
        } else {
            ++*col;
        }
    }
}

static void jfail(const reader *r, const char *at, const char *fmt, ...) NORETURN PRINTF(3, 4);
static void jfail(const reader *r, const char *at, const char *fmt, ...)
{
    int line, col;
    where(r, at, &line, &col);
    char msg[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fail("line %d, column %d: %s", line, col, msg);
}

static void skip_ws(reader *r)
{
    while (r->p < r->end && (*r->p == ' ' || *r->p == '\t' || *r->p == '\n' || *r->p == '\r'))
        r->p++;
}

static jval *parse_value(reader *r, int depth);

static unsigned hex4(reader *r)
{
    unsigned v = 0;
    for (int k = 0; k < 4; k++) {
        if (r->p >= r->end)
            jfail(r, r->p, "unexpected end of input in a \\u escape");
        char c = *r->p++;
        v <<= 4;
        if (c >= '0' && c <= '9')
            v |= (unsigned)(c - '0');
        else if (c >= 'a' && c <= 'f')
            v |= (unsigned)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F')
            v |= (unsigned)(c - 'A' + 10);
        else
            jfail(r, r->p - 1, "invalid hex digit '%c' in a \\u escape", c);
    }
    return v;
}

static char *put_utf8(char *o, unsigned cp)
{
    if (cp < 0x80) {
        *o++ = (char)cp;
    } else if (cp < 0x800) {
        *o++ = (char)(0xc0 | (cp >> 6));
        *o++ = (char)(0x80 | (cp & 0x3f));
    } else if (cp < 0x10000) {
        *o++ = (char)(0xe0 | (cp >> 12));
        *o++ = (char)(0x80 | ((cp >> 6) & 0x3f));
        *o++ = (char)(0x80 | (cp & 0x3f));
    } else {
        *o++ = (char)(0xf0 | (cp >> 18));
        *o++ = (char)(0x80 | ((cp >> 12) & 0x3f));
        *o++ = (char)(0x80 | ((cp >> 6) & 0x3f));
        *o++ = (char)(0x80 | (cp & 0x3f));
    }
    return o;
}

/* At the opening quote. Escapes never lengthen the text, so the raw length
 * bounds the decoded one. */
static const char *parse_string(reader *r)
{
    const char *open = r->p++;
    const char *q = r->p;
    while (q < r->end && *q != '"') {
        if (*q == '\\')
            q++;
        q++;
    }
    if (q >= r->end)
        jfail(r, open, "unterminated string");
    char *out = xalloc((size_t)(q - r->p) + 1), *o = out;
    while (*r->p != '"') {
        unsigned char c = (unsigned char)*r->p;
        if (c < 0x20)
            jfail(r, r->p, "control character 0x%02x inside a string", c);
        if (c != '\\') {
            *o++ = (char)c;
            r->p++;
            continue;
        }
        r->p++;
        char e = *r->p++;
        switch (e) {
        case '"': *o++ = '"'; break;
        case '\\': *o++ = '\\'; break;
        case '/': *o++ = '/'; break;
        case 'b': *o++ = '\b'; break;
        case 'f': *o++ = '\f'; break;
        case 'n': *o++ = '\n'; break;
        case 'r': *o++ = '\r'; break;
        case 't': *o++ = '\t'; break;
        case 'u': {
            unsigned cp = hex4(r);
            if (cp >= 0xd800 && cp < 0xdc00) {
                if (r->end - r->p < 6 || r->p[0] != '\\' || r->p[1] != 'u')
                    jfail(r, r->p, "a high surrogate \\u%04x without its low half", cp);
                r->p += 2;
                unsigned lo = hex4(r);
                if (lo < 0xdc00 || lo >= 0xe000)
                    jfail(r, r->p - 6, "\\u%04x is not a low surrogate", lo);
                cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
            } else if (cp >= 0xdc00 && cp < 0xe000) {
                jfail(r, r->p - 6, "a lone low surrogate \\u%04x", cp);
            }
            if (cp == 0)
                jfail(r, r->p - 6, "\\u0000 inside a string");
            o = put_utf8(o, cp);
            break;
        }
        default:
            jfail(r, r->p - 2, "invalid escape '\\%c'", e);
        }
    }
    r->p++;
    *o = '\0';
    return out;
}

static void parse_number(reader *r, jval *v)
{
    const char *s = r->p;
    const char *q = s;
    if (q < r->end && *q == '-')
        q++;
    if (q >= r->end || !(*q >= '0' && *q <= '9'))
        jfail(r, s, "invalid number");
    if (*q == '0' && q + 1 < r->end && q[1] >= '0' && q[1] <= '9')
        jfail(r, s, "invalid number: leading zero");
    while (q < r->end && *q >= '0' && *q <= '9')
        q++;
    bool integer = true;
    if (q < r->end && *q == '.') {
        integer = false;
        q++;
        if (q >= r->end || !(*q >= '0' && *q <= '9'))
            jfail(r, s, "invalid number: no digits after the decimal point");
        while (q < r->end && *q >= '0' && *q <= '9')
            q++;
    }
    if (q < r->end && (*q == 'e' || *q == 'E')) {
        integer = false;
        q++;
        if (q < r->end && (*q == '+' || *q == '-'))
            q++;
        if (q >= r->end || !(*q >= '0' && *q <= '9'))
            jfail(r, s, "invalid number: no digits in the exponent");
        while (q < r->end && *q >= '0' && *q <= '9')
            q++;
    }
    char buf[64];
    size_t len = (size_t)(q - s);
    if (len >= sizeof buf)
        jfail(r, s, "number too long (%zu characters)", len);
    memcpy(buf, s, len);
    buf[len] = '\0';
    v->t = J_NUM;
    v->d = strtod(buf, NULL);
    if (integer) {
        errno = 0;
        long long i = strtoll(buf, NULL, 10);
        v->is_int = errno == 0;
        v->i = (int64_t)i;
    }
    r->p = q;
}

static bool literal(reader *r, const char *word)
{
    size_t n = strlen(word);
    if ((size_t)(r->end - r->p) >= n && memcmp(r->p, word, n) == 0) {
        r->p += n;
        return true;
    }
    return false;
}

static jval *parse_value(reader *r, int depth)
{
    skip_ws(r);
    if (r->p >= r->end)
        jfail(r, r->p, "unexpected end of input: expected a value");
    if (depth > JSON_MAX_DEPTH)
        jfail(r, r->p, "nested too deeply (more than %d levels)", JSON_MAX_DEPTH);
    jval *v = xalloc(sizeof *v);
    memset(v, 0, sizeof *v);
    char c = *r->p;
    if (c == '{' || c == '[') {
        bool obj = c == '{';
        char close = obj ? '}' : ']';
        const char *open = r->p++;
        vec items = {NULL, 0, 0, sizeof(jval *)}, keys = {NULL, 0, 0, sizeof(char *)};
        skip_ws(r);
        if (r->p < r->end && *r->p == close) {
            r->p++;
        } else {
            for (;;) {
                skip_ws(r);
                if (obj) {
                    if (r->p >= r->end)
                        jfail(r, open, "unterminated object");
                    if (*r->p != '"')
                        jfail(r, r->p, "expected a key in double quotes");
                    *(const char **)vec_push(&keys) = parse_string(r);
                    skip_ws(r);
                    if (r->p >= r->end || *r->p != ':')
                        jfail(r, r->p, "expected ':' after a key");
                    r->p++;
                }
                *(jval **)vec_push(&items) = parse_value(r, depth + 1);
                skip_ws(r);
                if (r->p >= r->end)
                    jfail(r, open, "unterminated %s", obj ? "object" : "array");
                if (*r->p == ',') {
                    r->p++;
                    skip_ws(r);
                    if (r->p < r->end && *r->p == close)
                        jfail(r, r->p, "trailing comma before '%c'", close);
                    continue;
                }
                if (*r->p == close) {
                    r->p++;
                    break;
                }
                jfail(r, r->p, "expected ',' or '%c'", close);
            }
        }
        v->t = obj ? J_OBJ : J_ARR;
        v->n = items.n;
        v->items = items.items;
        v->keys = keys.items;
        return v;
    }
    if (c == '"') {
        v->t = J_STR;
        v->s = parse_string(r);
        return v;
    }
    if (c == '-' || (c >= '0' && c <= '9')) {
        parse_number(r, v);
        return v;
    }
    if (literal(r, "true")) {
        v->t = J_BOOL;
        v->b = true;
        return v;
    }
    if (literal(r, "false")) {
        v->t = J_BOOL;
        return v;
    }
    if (literal(r, "null"))
        return v;
    jfail(r, r->p, "expected a value, found '%c'", c);
}

static jval *json_parse(const char *text, size_t len)
{
    reader r = {text, text + len, text};
    if (len >= 3 && memcmp(text, "\xef\xbb\xbf", 3) == 0)
        r.p += 3; /* a byte order mark */
    skip_ws(&r);
    if (r.p == r.end)
        fail("the file is empty");
    jval *v = parse_value(&r, 0);
    skip_ws(&r);
    if (r.p != r.end)
        jfail(&r, r.p, "unexpected text after the snapshot object");
    return v;
}

static jval *jget(const jval *o, const char *key)
{
    if (!o || o->t != J_OBJ)
        return NULL;
    for (size_t k = 0; k < o->n; k++)
        if (!strcmp(o->keys[k], key))
            return o->items[k];
    return NULL;
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
        fail("%s%s\"%s\" must be %s (found %s)", path, *path ? "." : "", key, want[t],
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
            fail("%s%s\"%s\" is missing (a non-negative integer)", path, *path ? "." : "", key);
        return dflt;
    }
    if (v->t == J_NUM && (!v->is_int || v->i < 0))
        fail("%s%s\"%s\" must be a non-negative integer (found %.17g)", path, *path ? "." : "",
             key, v->d);
    if (v->t != J_NUM)
        fail("%s%s\"%s\" must be a non-negative integer (found %s)", path, *path ? "." : "", key,
             jtype_name(v));
    return v->i;
}

static const char *opt_str(const jval *o, const char *key, const char *path, const char *dflt)
{
    jval *v = jget(o, key);
    if (!v || v->t == J_NULL)
        return dflt;
    if (v->t != J_STR)
        fail("%s.\"%s\" must be a string (found %s)", path, key, jtype_name(v));
    return v->s;
}

typedef struct block {
    int64_t address, size, requested;
    const char *state, *manager, *frames;
} block;

typedef struct segment {
    const char *device, *type;
    int64_t address, total, allocated, active, requested, stream;
    vec blocks; /* block */
} segment;

typedef struct event {
    const char *action, *manager;
    int64_t addr, size, time_us;
} event;

/* "file:line name; ..." from a frames list, for hover text. */
static const char *frames_text(const jval *frames, const char *path)
{
    if (!frames || frames->t == J_NULL)
        return "";
    if (frames->t != J_ARR)
        fail("%s.\"frames\" must be an array (found %s)", path, jtype_name(frames));
    size_t cap = 1;
    for (size_t k = 0; k < frames->n; k++)
        cap += 64 + (frames->items[k]->t == J_OBJ ? 256 : 0);
    char *out = xalloc(cap), *o = out;
    *o = '\0';
    for (size_t k = 0; k < frames->n && k < 8; k++) {
        const jval *f = frames->items[k];
        if (f->t != J_OBJ)
            fail("%s.frames[%zu] must be an object (found %s)", path, k, jtype_name(f));
        const jval *file = jget(f, "filename"), *line = jget(f, "line"), *name = jget(f, "name");
        o += snprintf(o, (size_t)(out + cap - o), "%s%.100s:%" PRId64 " %.100s", k ? "; " : "",
                      file && file->t == J_STR ? file->s : "?",
                      line && line->t == J_NUM && line->is_int ? line->i : (int64_t)0,
                      name && name->t == J_STR ? name->s : "");
    }
    return out;
}

typedef struct snapshot {
    vec devices;  /* const char * */
    vec segments; /* segment */
    vec traces;   /* vec of event, one per device */
    const jval *settings;
} snapshot;

static void read_snapshot(const jval *root, snapshot *s)
{
    if (root->t != J_OBJ)
        fail("the snapshot must be a JSON object (found %s)", jtype_name(root));
    char path[128];
    s->devices = (vec){NULL, 0, 0, sizeof(const char *)};
    s->segments = (vec){NULL, 0, 0, sizeof(segment)};
    s->traces = (vec){NULL, 0, 0, sizeof(vec)};

    const jval *devs = need(root, "devices", J_ARR, "");
    for (size_t i = 0; i < devs->n; i++) {
        if (devs->items[i]->t != J_STR)
            fail("devices[%zu] must be a string (found %s)", i, jtype_name(devs->items[i]));
        *(const char **)vec_push(&s->devices) = devs->items[i]->s;
    }

    const jval *segs = jget(root, "segments");
    if (segs && segs->t != J_NULL && segs->t != J_ARR)
        fail("\"segments\" must be an array (found %s)", jtype_name(segs));
    for (size_t i = 0; segs && segs->t == J_ARR && i < segs->n; i++) {
        const jval *js = segs->items[i];
        snprintf(path, sizeof path, "segments[%zu]", i);
        if (js->t != J_OBJ)
            fail("%s must be an object (found %s)", path, jtype_name(js));
        segment *g = vec_push(&s->segments);
        memset(g, 0, sizeof *g);
        g->device = need(js, "device", J_STR, path)->s;
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
                fail("%s must be an object (found %s)", bpath, jtype_name(b));
            block *x = vec_push(&g->blocks);
            x->address = need_uint(b, "address", bpath, true, 0);
            x->size = need_uint(b, "size", bpath, true, 0);
            x->requested = need_uint(b, "requested_size", bpath, false, 0);
            x->state = need(b, "state", J_STR, bpath)->s;
            x->manager = opt_str(b, "manager", bpath, "");
            x->frames = frames_text(jget(b, "frames"), bpath);
            if (strcmp(x->state, "active_allocated") && strcmp(x->state, "active_pending_free") &&
                strcmp(x->state, "inactive"))
                warn("%s: unknown state \"%s\"", bpath, x->state);
            if (x->address != next)
                warn("%s starts at %" PRId64 ", where the previous block ended at %" PRId64,
                     bpath, x->address, next);
            next = x->address + x->size;
        }
        if (next != g->address + g->total)
            warn("%s: its blocks cover %" PRId64 " of its %" PRId64 " bytes", path,
                 next - g->address, g->total);
    }

    const jval *traces = need(root, "device_traces", J_ARR, "");
    if (traces->n != devs->n)
        fail("\"device_traces\" has %zu list%s for %zu device%s: one list per device", traces->n,
             traces->n == 1 ? "" : "s", devs->n, devs->n == 1 ? "" : "s");
    for (size_t d = 0; d < traces->n; d++) {
        const jval *list = traces->items[d];
        if (list->t != J_ARR)
            fail("device_traces[%zu] must be an array (found %s)", d, jtype_name(list));
        vec *ev = vec_push(&s->traces);
        *ev = (vec){NULL, 0, 0, sizeof(event)};
        int64_t last = INT64_MIN;
        for (size_t k = 0; k < list->n; k++) {
            snprintf(path, sizeof path, "device_traces[%zu][%zu]", d, k);
            const jval *je = list->items[k];
            if (je->t != J_OBJ)
                fail("%s must be an object (found %s)", path, jtype_name(je));
            event *e = vec_push(ev);
            e->action = need(je, "action", J_STR, path)->s;
            e->addr = need_uint(je, "addr", path, false, 0);
            e->size = need_uint(je, "size", path, false, 0);
            e->time_us = need_uint(je, "time_us", path, false, last == INT64_MIN ? 0 : last);
            e->manager = opt_str(je, "manager", path, "");
            if (e->time_us < last) {
                warn("%s: time_us goes back from %" PRId64 " to %" PRId64 "; drawn at %" PRId64,
                     path, last, e->time_us, last);
                e->time_us = last;
            }
            last = e->time_us;
        }
    }
    const jval *settings = jget(root, "allocator_settings");
    if (settings && settings->t != J_OBJ && settings->t != J_NULL)
        fail("\"allocator_settings\" must be an object (found %s)", jtype_name(settings));
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
    g.t = malloc(g.cap * sizeof *g.t);
    if (!g.t)
        fail("out of memory");
    for (size_t i = 0; i < g.cap; i++)
        g.t[i].addr = -1;
    for (size_t i = 0; i < m->cap; i++)
        if (m->t[i].addr != -1) {
            *live_find(&g, m->t[i].addr) = m->t[i];
            g.n++;
        }
    free(m->t);
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

#define MAX_SERIES 15  /* the managers with the highest peaks; the rest add up as one */
#define MAX_POINTS 2000

typedef struct series {
    const char *manager;
    int64_t now, peak;
} series;

typedef struct timeline {
    const char *device;
    vec series;            /* series; after the first pass, by falling peak */
    size_t *index;         /* open-addressing table of series by manager name */
    size_t index_cap;
    int nshown;            /* series drawn: the top peaks, plus one for the rest */
    int *shown_of;         /* series -> shown series (NULL in the first pass) */
    int64_t *group_now, *group_peak; /* per shown series */
    vec t;                 /* int64_t time of each point */
    vec values;            /* int64_t [nshown] per point */
    vec reserved;          /* int64_t per point */
    vec ooms;              /* int64_t times */
    int64_t unknown_frees, events, peak_total, total;
} timeline;

static size_t hash_str(const char *s)
{
    size_t h = 1469598103934665603u;
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 1099511628211u;
    return h;
}

static void index_rebuild(timeline *tl, size_t cap)
{
    tl->index = xalloc(cap * sizeof *tl->index);
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

static int series_of(timeline *tl, const char *manager)
{
    if (!*manager)
        manager = "(unknown manager)";
    size_t i = hash_str(manager) & (tl->index_cap - 1);
    for (; tl->index[i] != SIZE_MAX; i = (i + 1) & (tl->index_cap - 1))
        if (!strcmp(VEC_AT(tl->series, series, tl->index[i]).manager, manager))
            return (int)tl->index[i];
    series *x = vec_push(&tl->series);
    x->manager = manager;
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
    s->now += bytes;
    if (s->now > s->peak)
        s->peak = s->now;
    tl->total += bytes;
    if (tl->total > tl->peak_total)
        tl->peak_total = tl->total;
    if (tl->shown_of) {
        int g = tl->shown_of[si];
        tl->group_now[g] += bytes;
        if (tl->group_now[g] > tl->group_peak[g])
            tl->group_peak[g] = tl->group_now[g];
    }
}

typedef void (*visit_fn)(timeline *tl, size_t k, const event *e, int64_t reserved, void *ud);

/* One pass over the events, calling visit (when given) after each. */
static void replay(timeline *tl, const vec *events, visit_fn visit, void *ud)
{
    live_map live = {NULL, 0, 0};
    live_grow(&live);
    for (size_t k = 0; k < tl->series.n; k++)
        VEC_AT(tl->series, series, k).now = 0;
    int64_t reserved = 0;
    tl->unknown_frees = 0;
    tl->total = 0;
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
            reserved += e->size;
        } else if (!strcmp(a, "segment_free") || !strcmp(a, "segment_unmap")) {
            reserved -= e->size;
        }
        if (visit)
            visit(tl, k, e, reserved, ud);
    }
    free(live.t);
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

static void build_timeline(timeline *tl, const char *device, const vec *events)
{
    memset(tl, 0, sizeof *tl);
    tl->device = device;
    tl->series = (vec){NULL, 0, 0, sizeof(series)};
    tl->t = (vec){NULL, 0, 0, sizeof(int64_t)};
    tl->values = (vec){NULL, 0, 0, sizeof(int64_t)};
    tl->reserved = (vec){NULL, 0, 0, sizeof(int64_t)};
    tl->ooms = (vec){NULL, 0, 0, sizeof(int64_t)};
    tl->events = (int64_t)events->n;
    index_rebuild(tl, 64);
    /* First pass: the managers and their peaks. */
    replay(tl, events, NULL, NULL);
    size_t ns = tl->series.n;
    if (ns)
        qsort(tl->series.items, ns, sizeof(series), cmp_peak_desc);
    index_rebuild(tl, tl->index_cap);
    int keep = ns > MAX_SERIES ? MAX_SERIES - 1 : (int)ns;
    tl->nshown = ns > MAX_SERIES ? MAX_SERIES : (int)ns;
    tl->shown_of = xalloc((ns ? ns : 1) * sizeof(int));
    for (size_t k = 0; k < ns; k++)
        tl->shown_of[k] = (int)k < keep ? (int)k : keep;
    size_t gsz = ((size_t)tl->nshown + 1) * sizeof(int64_t);
    tl->group_now = xalloc(gsz);
    tl->group_peak = xalloc(gsz);
    memset(tl->group_now, 0, gsz);
    memset(tl->group_peak, 0, gsz);
    /* Second pass: the points, from an empty state at the first event. */
    sampler sm = {0};
    sm.bucket = events->n > MAX_POINTS ? (events->n + MAX_POINTS - 1) / MAX_POINTS : 1;
    sm.best = xalloc(gsz);
    tl->peak_total = 0;
    if (events->n)
        emit_point(tl, VEC_AT(*events, event, 0).time_us, tl->group_now, 0);
    replay(tl, events, sample, &sm);
}

/* ---- output ----------------------------------------------------------------------- */

/* A JSON string safe inside <script>: no "</", no U+2028/2029. */
static void put_jstr(FILE *f, const char *s)
{
    fputc('"', f);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        unsigned c = *p;
        if (c == '"' || c == '\\')
            fprintf(f, "\\%c", c);
        else if (c < 0x20 || c == '<' || c == '>' || c == '&')
            fprintf(f, "\\u%04x", c);
        else if (c == 0xe2 && p[1] == 0x80 && (p[2] == 0xa8 || p[2] == 0xa9)) {
            fprintf(f, "\\u%04x", p[2] == 0xa8 ? 0x2028 : 0x2029);
            p += 2;
        } else
            fputc((int)c, f);
    }
    fputc('"', f);
}

static void put_jval(FILE *f, const jval *v)
{
    switch (v->t) {
    case J_NULL: fputs("null", f); break;
    case J_BOOL: fputs(v->b ? "true" : "false", f); break;
    case J_NUM:
        if (v->is_int)
            fprintf(f, "%" PRId64, v->i);
        else
            fprintf(f, "%.17g", v->d);
        break;
    case J_STR: put_jstr(f, v->s); break;
    case J_ARR:
    case J_OBJ:
        fputc(v->t == J_ARR ? '[' : '{', f);
        for (size_t k = 0; k < v->n; k++) {
            if (k)
                fputc(',', f);
            if (v->t == J_OBJ) {
                put_jstr(f, v->keys[k]);
                fputc(':', f);
            }
            put_jval(f, v->items[k]);
        }
        fputc(v->t == J_ARR ? ']' : '}', f);
        break;
    }
}

static void put_i64_list(FILE *f, const vec *v)
{
    fputc('[', f);
    for (size_t k = 0; k < v->n; k++)
        fprintf(f, "%s%" PRId64, k ? "," : "", VEC_AT(*v, int64_t, k));
    fputc(']', f);
}

static void write_data(FILE *f, const snapshot *s, const timeline *tls, size_t ntl)
{
    fprintf(f, "{\"source\":");
    put_jstr(f, input_name);
    fprintf(f, ",\"timelines\":[");
    for (size_t d = 0; d < ntl; d++) {
        const timeline *tl = &tls[d];
        fprintf(f, "%s{\"device\":", d ? "," : "");
        put_jstr(f, tl->device);
        fprintf(f, ",\"events\":%" PRId64 ",\"unknown_frees\":%" PRId64 ",\"peak_total\":%" PRId64
                   ",\"series\":[",
                tl->events, tl->unknown_frees, tl->peak_total);
        size_t ns = tl->series.n;
        for (int k = 0; k < tl->nshown; k++) {
            bool other = ns > MAX_SERIES && k == tl->nshown - 1;
            int64_t peak = tl->group_peak[k];
            fprintf(f, "%s{\"manager\":", k ? "," : "");
            if (other) {
                char name[64];
                snprintf(name, sizeof name, "(%zu other managers)", ns - (size_t)k);
                put_jstr(f, name);
            } else {
                put_jstr(f, VEC_AT(tl->series, series, k).manager);
            }
            fprintf(f, ",\"peak\":%" PRId64 "}", peak);
        }
        fprintf(f, "],\"t\":");
        put_i64_list(f, &tl->t);
        fprintf(f, ",\"values\":");
        put_i64_list(f, &tl->values);
        fprintf(f, ",\"reserved\":");
        put_i64_list(f, &tl->reserved);
        fprintf(f, ",\"ooms\":");
        put_i64_list(f, &tl->ooms);
        fprintf(f, "}");
    }
    fprintf(f, "],\"segments\":[");
    for (size_t i = 0; i < s->segments.n; i++) {
        const segment *g = &VEC_AT(s->segments, segment, i);
        fprintf(f, "%s{\"device\":", i ? "," : "");
        put_jstr(f, g->device);
        fprintf(f, ",\"type\":");
        put_jstr(f, g->type);
        fprintf(f,
                ",\"address\":%" PRId64 ",\"total\":%" PRId64 ",\"allocated\":%" PRId64
                ",\"active\":%" PRId64 ",\"requested\":%" PRId64 ",\"stream\":%" PRId64
                ",\"blocks\":[",
                g->address, g->total, g->allocated, g->active, g->requested, g->stream);
        for (size_t k = 0; k < g->blocks.n; k++) {
            const block *b = &VEC_AT(g->blocks, block, k);
            fprintf(f, "%s{\"offset\":%" PRId64 ",\"size\":%" PRId64 ",\"requested\":%" PRId64
                       ",\"state\":",
                    k ? "," : "", b->address - g->address, b->size, b->requested);
            put_jstr(f, b->state);
            fprintf(f, ",\"manager\":");
            put_jstr(f, b->manager);
            fprintf(f, ",\"frames\":");
            put_jstr(f, b->frames);
            fprintf(f, "}");
        }
        fprintf(f, "]}");
    }
    fprintf(f, "],\"settings\":");
    if (s->settings)
        put_jval(f, s->settings);
    else
        fputs("{}", f);
    fprintf(f, ",\"warnings\":[");
    for (size_t k = 0; k < warnings.n; k++) {
        if (k)
            fputc(',', f);
        put_jstr(f, VEC_AT(warnings, char *, k));
    }
    fprintf(f, "]}");
}

/* The page around the data: CSS and the drawing script. */
static const char page_head[] =
    "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
    "<title>ndm memory snapshot</title>\n<style>\n"
    "body{font:13px/1.4 system-ui,sans-serif;margin:16px 24px;color:#222;background:#fff}\n"
    "h1{font-size:18px;margin:0 0 4px}h2{font-size:15px;margin:24px 0 6px}\n"
    ".note{color:#666}.warn{color:#a40}\n"
    "svg{display:block;margin:4px 0;overflow:visible}\n"
    ".axis{stroke:#888;stroke-width:1}.grid{stroke:#eee;stroke-width:1}\n"
    ".label{font-size:11px;fill:#555}\n"
    ".reserved{fill:none;stroke:#333;stroke-width:1.2;stroke-dasharray:4 3}\n"
    ".oom{stroke:#d00;stroke-width:1.5}\n"
    "path.series:hover{opacity:.75}rect.block:hover{stroke:#000;stroke-width:1.5}\n"
    ".legend{display:flex;flex-wrap:wrap;gap:4px 16px;margin:2px 0 8px}\n"
    ".legend span i{display:inline-block;width:10px;height:10px;margin-right:4px}\n"
    "table{border-collapse:collapse}td{padding:1px 10px 1px 0}\n"
    "#tip{position:fixed;pointer-events:none;background:#fffbe6;border:1px solid #bbb;"
    "padding:4px 6px;font-size:12px;white-space:pre;display:none;max-width:640px}\n"
    "</style>\n</head>\n<body data-rendered=\"0\">\n<h1>ndm memory snapshot</h1>\n"
    "<div id=\"source\" class=\"note\"></div>\n<div id=\"warnings\"></div>\n"
    "<div id=\"timelines\"></div>\n<h2>Segments</h2>\n"
    "<div class=\"legend\" id=\"states\"></div>\n<div id=\"segments\"></div>\n"
    "<h2>Allocator settings</h2>\n<table id=\"settings\"></table>\n"
    "<div id=\"tip\"></div>\n<script id=\"ndm-data\" type=\"application/json\">";

static const char page_tail[] =
    "</script>\n<script>\n"
    "(function () {\n"
    "'use strict';\n"
    "var NS = 'http://www.w3.org/2000/svg';\n"
    "var D = JSON.parse(document.getElementById('ndm-data').textContent);\n"
    "var palette = ['#4e79a7','#f28e2b','#59a14f','#e15759','#76b7b2','#edc948','#b07aa1',\n"
    "  '#ff9da7','#9c755f','#86bcb6','#d37295','#8cd17d','#499894','#bab0ac','#79706e'];\n"
    "var colors = {};\n"
    "function color(m) {\n"
    "  if (!(m in colors)) colors[m] = palette[Object.keys(colors).length % palette.length];\n"
    "  return colors[m];\n"
    "}\n"
    "function el(tag, attrs, parent) {\n"
    "  var e = document.createElementNS(NS, tag);\n"
    "  for (var k in attrs) e.setAttribute(k, attrs[k]);\n"
    "  if (parent) parent.appendChild(e);\n"
    "  return e;\n"
    "}\n"
    "function html(tag, text, parent, cls) {\n"
    "  var e = document.createElement(tag);\n"
    "  if (text !== null) e.textContent = text;\n"
    "  if (cls) e.className = cls;\n"
    "  if (parent) parent.appendChild(e);\n"
    "  return e;\n"
    "}\n"
    "function bytes(n) {\n"
    "  var u = ['B', 'KiB', 'MiB', 'GiB', 'TiB'], i = 0;\n"
    "  while (Math.abs(n) >= 1024 && i < u.length - 1) { n /= 1024; i++; }\n"
    "  return (i ? n.toFixed(n < 10 ? 2 : 1) : String(n)) + ' ' + u[i];\n"
    "}\n"
    "function secs(us) {\n"
    "  if (Math.abs(us) >= 1e6) return (us / 1e6).toFixed(2) + ' s';\n"
    "  if (Math.abs(us) >= 1e3) return (us / 1e3).toFixed(1) + ' ms';\n"
    "  return us + ' us';\n"
    "}\n"
    "var tip = document.getElementById('tip');\n"
    "function hover(node, text) {\n"
    "  el('title', {}, node).textContent = text;\n"
    "  node.addEventListener('mousemove', function (ev) {\n"
    "    tip.textContent = text; tip.style.display = 'block';\n"
    "    tip.style.left = (ev.clientX + 14) + 'px'; tip.style.top = (ev.clientY + 14) + 'px';\n"
    "  });\n"
    "  node.addEventListener('mouseleave', function () { tip.style.display = 'none'; });\n"
    "}\n"
    "var drawnSeries = 0, drawnBlocks = 0, drawnSegments = 0;\n"
    "function drawTimeline(tl, host) {\n"
    "  html('h2', 'Allocated bytes over time on ' + tl.device + ', stacked by manager', host);\n"
    "  var info = tl.events + ' events, peak ' + bytes(tl.peak_total);\n"
    "  if (tl.unknown_frees) info += '; ' + tl.unknown_frees +\n"
    "    ' frees of blocks allocated before the trace began were left out';\n"
    "  html('div', info, host, 'note');\n"
    "  var W = 900, H = 260, L = 70, B = 24;\n"
    "  var svg = el('svg', {width: W + L + 10, height: H + B + 10, 'class': 'timeline',\n"
    "                      'data-device': tl.device}, host);\n"
    "  var n = tl.t.length, k = tl.series.length;\n"
    "  if (!n) { html('div', 'no events on this device', host, 'note'); return; }\n"
    "  /* past the last event, so that the final state shows */\n"
    "  var t0 = tl.t[0], t1 = tl.t[n - 1]; t1 += Math.max(1, Math.round((t1 - t0) / 20));\n"
    "  var ymax = 1;\n"
    "  for (var i = 0; i < n; i++) {\n"
    "    var s = 0; for (var j = 0; j < k; j++) s += tl.values[i * k + j];\n"
    "    ymax = Math.max(ymax, s, tl.reserved[i]);\n"
    "  }\n"
    "  function X(t) { return L + (t - t0) / (t1 - t0) * W; }\n"
    "  function Y(v) { return 5 + H - v / ymax * H; }\n"
    "  for (var g = 0; g <= 4; g++) {\n"
    "    var v = ymax * g / 4;\n"
    "    el('line', {x1: L, x2: L + W, y1: Y(v), y2: Y(v), 'class': 'grid'}, svg);\n"
    "    el('text', {x: L - 6, y: Y(v) + 4, 'text-anchor': 'end', 'class': 'label'}, svg)\n"
    "      .textContent = bytes(Math.round(v));\n"
    "  }\n"
    "  for (var g2 = 0; g2 <= 4; g2++) {\n"
    "    var tt = t0 + (t1 - t0) * g2 / 4;\n"
    "    el('text', {x: X(tt), y: H + B, 'text-anchor': 'middle', 'class': 'label'}, svg)\n"
    "      .textContent = secs(Math.round(tt - t0));\n"
    "  }\n"
    "  var below = new Array(n).fill(0);\n"
    "  var legend = html('div', null, host, 'legend');\n"
    "  for (var j2 = 0; j2 < k; j2++) {\n"
    "    var top = [], d = '';\n"
    "    for (var i2 = 0; i2 < n; i2++) top.push(below[i2] + tl.values[i2 * k + j2]);\n"
    "    for (var i3 = 0; i3 < n; i3++) {\n"
    "      var x = X(tl.t[i3]), xn = i3 + 1 < n ? X(tl.t[i3 + 1]) : L + W;\n"
    "      d += (i3 ? 'L' : 'M') + x.toFixed(1) + ',' + Y(top[i3]).toFixed(1) +\n"
    "           'L' + xn.toFixed(1) + ',' + Y(top[i3]).toFixed(1);\n"
    "    }\n"
    "    for (var i4 = n - 1; i4 >= 0; i4--) {\n"
    "      var xa = X(tl.t[i4]), xb = i4 + 1 < n ? X(tl.t[i4 + 1]) : L + W;\n"
    "      d += 'L' + xb.toFixed(1) + ',' + Y(below[i4]).toFixed(1) +\n"
    "           'L' + xa.toFixed(1) + ',' + Y(below[i4]).toFixed(1);\n"
    "    }\n"
    "    var m = tl.series[j2].manager;\n"
    "    var p = el('path', {d: d + 'Z', fill: color(m), 'class': 'series', 'data-manager': m,\n"
    "                        'data-peak': tl.series[j2].peak}, svg);\n"
    "    hover(p, m + '\\npeak ' + bytes(tl.series[j2].peak));\n"
    "    var item = html('span', null, legend);\n"
    "    html('i', null, item).style.background = color(m);\n"
    "    var peak = ' (peak ' + bytes(tl.series[j2].peak) + ')';\n"
    "    item.appendChild(document.createTextNode(m + peak));\n"
    "    below = top; drawnSeries++;\n"
    "  }\n"
    "  var r = '';\n"
    "  for (var i5 = 0; i5 < n; i5++) {\n"
    "    var xr = X(tl.t[i5]), xs = i5 + 1 < n ? X(tl.t[i5 + 1]) : L + W;\n"
    "    r += (i5 ? 'L' : 'M') + xr.toFixed(1) + ',' + Y(tl.reserved[i5]).toFixed(1) +\n"
    "         'L' + xs.toFixed(1) + ',' + Y(tl.reserved[i5]).toFixed(1);\n"
    "  }\n"
    "  hover(el('path', {d: r, 'class': 'reserved'}, svg), 'reserved by segments');\n"
    "  tl.ooms.forEach(function (t) {\n"
    "    hover(el('line', {x1: X(t), x2: X(t), y1: 5, y2: H + 5, 'class': 'oom'}, svg),\n"
    "          'out of memory at ' + secs(t - t0));\n"
    "  });\n"
    "  el('line', {x1: L, x2: L, y1: 5, y2: H + 5, 'class': 'axis'}, svg);\n"
    "  el('line', {x1: L, x2: L + W, y1: H + 5, y2: H + 5, 'class': 'axis'}, svg);\n"
    "  var key = html('span', null, legend);\n"
    "  key.textContent = '- - reserved';\n"
    "}\n"
    "var stateColor = {active_allocated: '#4e79a7', active_pending_free: '#f28e2b',\n"
    "                  inactive: '#e4e4e4'};\n"
    "function drawSegments(host) {\n"
    "  var states = document.getElementById('states');\n"
    "  Object.keys(stateColor).forEach(function (s) {\n"
    "    var item = html('span', null, states);\n"
    "    html('i', null, item).style.background = stateColor[s];\n"
    "    item.appendChild(document.createTextNode(s));\n"
    "  });\n"
    "  var byDev = {};\n"
    "  D.segments.forEach(function (s) { (byDev[s.device] = byDev[s.device] || []).push(s); });\n"
    "  Object.keys(byDev).forEach(function (dev) {\n"
    "    var segs = byDev[dev].slice().sort(function (a, b) { return a.address - b.address; });\n"
    "    var total = 0;\n"
    "    segs.forEach(function (s) { total += s.total; });\n"
    "    html('div', dev + ': ' + segs.length + ' segments, ' + bytes(total) + ' reserved',\n"
    "         host, 'note');\n"
    "    /* every segment gets the full width: small ones stay readable */\n"
    "    var W = 900, L = 200, RH = 16, GAP = 4;\n"
    "    var svg = el('svg', {width: L + W + 10, height: segs.length * (RH + GAP) + 4,\n"
    "                        'class': 'segmap', 'data-device': dev}, host);\n"
    "    segs.forEach(function (s, i) {\n"
    "      var y = 2 + i * (RH + GAP), scale = W / Math.max(1, s.total);\n"
    "      el('text', {x: L - 6, y: y + RH - 4, 'text-anchor': 'end', 'class': 'label'}, svg)\n"
    "        .textContent = '0x' + s.address.toString(16) + ' ' + bytes(s.total) +\n"
    "                       (s.type ? ' ' + s.type : '');\n"
    "      var frame = el('rect', {x: L, y: y, width: Math.max(1, s.total * scale), height: RH,\n"
    "                              fill: 'none', stroke: '#999'}, svg);\n"
    "      hover(frame, 'segment 0x' + s.address.toString(16) + '\\n' + bytes(s.total) +\n"
    "            ', allocated ' + bytes(s.allocated) + ', stream ' + s.stream);\n"
    "      s.blocks.forEach(function (b) {\n"
    "        var rc = el('rect', {x: L + b.offset * scale, y: y + 1,\n"
    "                             width: Math.max(0.5, b.size * scale), height: RH - 2,\n"
    "                             fill: stateColor[b.state] || '#c00', stroke: '#fff',\n"
    "                             'stroke-width': 0.5, 'class': 'block',\n"
    "                             'data-state': b.state, 'data-manager': b.manager}, svg);\n"
    "        hover(rc, (b.manager || '(no manager)') + '\\n' + b.state + ', ' + bytes(b.size) +\n"
    "              ' (requested ' + bytes(b.requested) + ')\\n0x' +\n"
    "              (s.address + b.offset).toString(16) + (b.frames ? '\\n' + b.frames : ''));\n"
    "        drawnBlocks++;\n"
    "      });\n"
    "      drawnSegments++;\n"
    "    });\n"
    "  });\n"
    "  if (!D.segments.length) html('div', 'no segments in the snapshot', host, 'note');\n"
    "}\n"
    "try {\n"
    "  document.getElementById('source').textContent = D.source;\n"
    "  var w = document.getElementById('warnings');\n"
    "  D.warnings.forEach(function (m) { html('div', 'warning: ' + m, w, 'warn'); });\n"
    "  var th = document.getElementById('timelines');\n"
    "  D.timelines.forEach(function (tl) { drawTimeline(tl, th); });\n"
    "  drawSegments(document.getElementById('segments'));\n"
    "  var st = document.getElementById('settings');\n"
    "  Object.keys(D.settings).forEach(function (key) {\n"
    "    var row = html('tr', null, st);\n"
    "    html('td', key, row);\n"
    "    html('td', JSON.stringify(D.settings[key]), row);\n"
    "  });\n"
    "  document.body.setAttribute('data-series', drawnSeries);\n"
    "  document.body.setAttribute('data-blocks', drawnBlocks);\n"
    "  document.body.setAttribute('data-segments', drawnSegments);\n"
    "  document.body.setAttribute('data-rendered', '1');\n"
    "} catch (e) {\n"
    "  document.body.setAttribute('data-rendered', 'error');\n"
    "  html('pre', 'drawing failed: ' + e, document.body, 'warn');\n"
    "}\n"
    "})();\n"
    "</script>\n</body>\n</html>\n";

static char *read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        fail("cannot open: %s", strerror(errno));
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    for (;;) {
        if (!buf) {
            fclose(f);
            fail("out of memory");
        }
        n += fread(buf + n, 1, cap - n, f);
        if (n < cap)
            break;
        char *grown = realloc(buf, 2 * cap);
        if (!grown)
            free(buf);
        buf = grown;
        cap *= 2;
    }
    bool bad = ferror(f);
    fclose(f);
    if (bad) {
        free(buf);
        fail("read error");
    }
    *len = n;
    return buf;
}

int main(int argc, char **argv)
{
    bool help = argc == 2 && (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help"));
    if (argc != 3 || help) {
        fprintf(help ? stdout : stderr,
                "usage: %s snapshot.json out.html\n"
                "Writes one self-contained HTML page from an ndm memory snapshot: bytes over\n"
                "time stacked by manager (one chart per device) and the segment map.\n",
                argc > 0 ? argv[0] : "ndm-memviz");
        return help ? 0 : 2;
    }
    input_name = argv[1];
    size_t len;
    input_text = read_file(argv[1], &len);
    if (memchr(input_text, '\0', len))
        fail("the file holds a NUL byte: not a JSON text");
    jval *root = json_parse(input_text, len);
    snapshot s;
    read_snapshot(root, &s);
    size_t ntl = s.devices.n;
    timeline *tls = xalloc((ntl ? ntl : 1) * sizeof *tls);
    for (size_t d = 0; d < ntl; d++)
        build_timeline(&tls[d], VEC_AT(s.devices, const char *, d),
                       &VEC_AT(s.traces, vec, d));

    /* Written beside the target, then renamed: a failed run leaves no half page. */
    char tmp[4096];
    if (snprintf(tmp, sizeof tmp, "%s.tmp", argv[2]) >= (int)sizeof tmp) {
        fail("output path too long");
    }
    FILE *out = fopen(tmp, "w");
    if (!out) {
        fprintf(stderr, "ndm-memviz: %s: cannot write: %s\n", tmp, strerror(errno));
        free(input_text);
        arena_free();
        return 1;
    }
    fputs(page_head, out);
    write_data(out, &s, tls, ntl);
    fputs(page_tail, out);
    bool bad = ferror(out);
    if (fclose(out) != 0 || bad || rename(tmp, argv[2]) != 0) {
        fprintf(stderr, "ndm-memviz: %s: cannot write: %s\n", argv[2], strerror(errno));
        remove(tmp);
        free(input_text);
        arena_free();
        return 1;
    }
    free(input_text);
    arena_free();
    return 0;
}
