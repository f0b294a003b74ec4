/* ndm-memviz: turns a memory snapshot (ndm_memory_dump_snapshot's JSON or pickle,
 * or PyTorch's pickle) into one self-contained HTML page: bytes over time stacked
 * by manager, and the segment map with a replay of it at any event.
 *
 *   ndm-memviz snapshot.json out.html
 *   ndm-memviz before.pickle after.pickle out.html     (compares the two)
 *
 * The page carries its data, CSS and script inline and fetches nothing. Its
 * script draws the plots as SVG, then marks <body data-rendered="1"> with the
 * number of series and blocks drawn, so that a headless browser can check it.
 * Snapshots come from other machines, so the reader bounds what a file can
 * make it do by the file's size: nesting, the values reached through shared
 * (memoised) references, its memory and the page it writes; a file past a
 * bound is refused with a message, and no temporary is left behind.
 * Exit status: 0 done, 1 unreadable, malformed or oversized snapshot, 2 usage. */
#include <errno.h>
#include <inttypes.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#if defined(__GNUC__)
#define NORETURN __attribute__((noreturn))
#define PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define NORETURN
#define PRINTF(a, b)
#endif

/* ---- memory: one arena, freed at exit ---------------------------------------- */

typedef struct chunk {
    struct chunk *next;
    size_t used, cap;
    max_align_t data[];
} chunk;

static chunk *arena;
/* What the arena holds and may hold: set from the input's size before it is
 * read, so a small hostile file cannot make memviz take gigabytes. */
static size_t arena_bytes, arena_limit = SIZE_MAX;

static void fail(const char *fmt, ...) NORETURN PRINTF(1, 2);

/* base + per * n, saturated: the bounds that scale with the input. */
static size_t bound(size_t base, size_t per, size_t n)
{
    if (n > (SIZE_MAX - base) / per)
        return SIZE_MAX;
    return base + per * n;
}

#define MEMORY_BASE ((size_t)64 << 20) /* plus MEMORY_PER_BYTE per input byte */
#define MEMORY_PER_BYTE 64

static void *xalloc(size_t n)
{
    if (n > SIZE_MAX / 2)
        fail("out of memory");
    n = (n + sizeof(max_align_t) - 1) / sizeof(max_align_t) * sizeof(max_align_t);
    if (!arena || arena->cap - arena->used < n) {
        size_t cap = n > ((size_t)1 << 20) ? n : (size_t)1 << 20;
        if (cap > arena_limit - arena_bytes || arena_bytes > arena_limit)
            fail("the snapshot needs more than %zu MiB of memory to draw (the bound is %d MiB "
                 "plus %d bytes per byte of the file): refused",
                 arena_limit >> 20, (int)(MEMORY_BASE >> 20), MEMORY_PER_BYTE);
        chunk *c = malloc(sizeof *c + cap);
        if (!c)
            fail("out of memory");
        c->next = arena;
        c->used = 0;
        c->cap = cap;
        arena = c;
        arena_bytes += cap;
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
    arena_bytes = 0;
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
static char *input_text, *before_text; /* the files' bytes (malloc), freed on every exit */
/* The page being written (its temporary), removed on every failure. */
static FILE *out_file;
static char out_tmp[4096];

#ifdef NDM_MEMVIZ_FUZZ
/* Built into a fuzz target: a failure returns to the target, quietly. */
static jmp_buf fail_jump;
#endif

static void out_discard(void)
{
    if (out_file)
        fclose(out_file);
    out_file = NULL;
    if (out_tmp[0])
        remove(out_tmp);
    out_tmp[0] = '\0';
}

static void fail(const char *fmt, ...) NORETURN PRINTF(1, 2);
static void fail(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
#ifdef NDM_MEMVIZ_FUZZ
    char buf[512];
    vsnprintf(buf, sizeof buf, fmt, ap); /* formatted all the same, for the sanitizers */
#else
    fprintf(stderr, "ndm-memviz: %s: ", input_name);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
#endif
    va_end(ap);
    out_discard();
    arena_free();
    free(input_text);
    free(before_text);
    input_text = before_text = NULL;
#ifdef NDM_MEMVIZ_FUZZ
    longjmp(fail_jump, 1);
#else
    exit(1);
#endif
}

/* Warnings go to stderr and into the page. */
static vec warnings = {NULL, 0, 0, sizeof(char *)};

static size_t warnings_seen;

static void warn(const char *fmt, ...) PRINTF(1, 2);
static void warn(const char *fmt, ...)
{
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    /* The first hundred: a hostile file may hold a million. */
    if (++warnings_seen > 100)
        return;
#ifndef NDM_MEMVIZ_FUZZ
    fprintf(stderr, "ndm-memviz: %s: warning: %s%s\n", input_name, buf,
            warnings_seen == 100 ? " (further warnings are not shown)" : "");
#endif
    char *s = xalloc(strlen(buf) + 1);
    strcpy(s, buf);
    *(char **)vec_push(&warnings) = s;
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
    size_t cap;         /* a pickle's container: room in items (and keys) */
    bool walking;       /* inside tree_check's walk of this container */
    const char *text;   /* a frames list: its hover text, once made */
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

/* ---- pickle ---------------------------------------------------------------------
 *
 * PyTorch's snapshots are pickles (torch.cuda.memory._dump_snapshot): the
 * subset of opcodes Python's pickler writes for dicts, lists, tuples,
 * strings, numbers, booleans and None (protocols 2 to 5, with the memo) is
 * read into the same tree as JSON; any other opcode (a class, a reduce) is
 * refused, so nothing in the file is ever executed. */

typedef struct pkreader {
    const unsigned char *p, *end, *start;
    vec stack; /* jval * */
    vec marks; /* size_t */
    vec memo;  /* jval * */
} pkreader;

static void pkfail(const pkreader *r, const char *fmt, ...) NORETURN PRINTF(2, 3);
static void pkfail(const pkreader *r, const char *fmt, ...)
{
    char msg[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fail("pickle byte %zu: %s", (size_t)(r->p - r->start), msg);
}

static const unsigned char *pk_take(pkreader *r, size_t n)
{
    if ((size_t)(r->end - r->p) < n)
        pkfail(r, "unexpected end of input");
    const unsigned char *at = r->p;
    r->p += n;
    return at;
}

static uint64_t pk_le(pkreader *r, size_t n)
{
    const unsigned char *b = pk_take(r, n);
    uint64_t v = 0;
    for (size_t i = 0; i < n; i++)
        v |= (uint64_t)b[i] << (8 * i);
    return v;
}

static jval *pk_new(jtype t)
{
    jval *v = xalloc(sizeof *v);
    memset(v, 0, sizeof *v);
    v->t = t;
    return v;
}

static void pk_push(pkreader *r, jval *v) { *(jval **)vec_push(&r->stack) = v; }

static jval *pk_pop(pkreader *r)
{
    if (!r->stack.n || (r->marks.n && VEC_AT(r->marks, size_t, r->marks.n - 1) >= r->stack.n))
        pkfail(r, "stack underflow");
    return VEC_AT(r->stack, jval *, --r->stack.n);
}

static jval *pk_top(pkreader *r)
{
    if (!r->stack.n)
        pkfail(r, "stack underflow");
    return VEC_AT(r->stack, jval *, r->stack.n - 1);
}

static size_t pk_mark(pkreader *r)
{
    if (!r->marks.n)
        pkfail(r, "no mark");
    return VEC_AT(r->marks, size_t, --r->marks.n);
}

/* Containers grow by appending, their room doubling: rebuilt on every
 * append, a list of n items would cost n^2 / 2 pointers. */
static void pk_room(jval *c, size_t add)
{
    size_t need = c->n + add;
    if (need <= c->cap)
        return;
    size_t cap = c->cap ? c->cap : 4;
    while (cap < need)
        cap *= 2;
    jval **items = xalloc(cap * sizeof *items);
    if (c->n)
        memcpy(items, c->items, c->n * sizeof *items);
    c->items = items;
    if (c->t == J_OBJ) {
        const char **keys = xalloc(cap * sizeof *keys);
        if (c->n)
            memcpy(keys, c->keys, c->n * sizeof *keys);
        c->keys = keys;
    }
    c->cap = cap;
}

static void pk_append(pkreader *r, jval *list, jval **items, size_t n)
{
    if (list->t != J_ARR)
        pkfail(r, "append to %s", list->t == J_OBJ ? "a dict" : "a scalar");
    pk_room(list, n);
    if (n)
        memcpy(list->items + list->n, items, n * sizeof *items);
    list->n += n;
}

static void pk_setitems(pkreader *r, jval *d, jval **kv, size_t n)
{
    if (d->t != J_OBJ || n % 2)
        pkfail(r, "setitems on %s", d->t == J_OBJ ? "an odd count" : "no dict");
    pk_room(d, n / 2);
    for (size_t k = 0; k < n; k += 2) {
        const jval *key = kv[k];
        char buf[32];
        const char *ks;
        if (key->t == J_STR) {
            ks = key->s;
        } else if (key->t == J_NUM && key->is_int) {
            snprintf(buf, sizeof buf, "%" PRId64, key->i);
            char *c = xalloc(strlen(buf) + 1);
            ks = strcpy(c, buf);
        } else {
            pkfail(r, "a dict key must be a string or an integer");
        }
        d->keys[d->n] = ks;
        d->items[d->n] = kv[k + 1];
        d->n++;
    }
}

static jval *pk_str(pkreader *r, size_t n)
{
    const unsigned char *b = pk_take(r, n);
    if (memchr(b, '\0', n))
        pkfail(r, "a string holds a NUL byte");
    char *s = xalloc(n + 1);
    memcpy(s, b, n);
    s[n] = '\0';
    jval *v = pk_new(J_STR);
    v->s = s;
    return v;
}

static jval *pk_int(int64_t i)
{
    jval *v = pk_new(J_NUM);
    v->is_int = true;
    v->i = i;
    v->d = (double)i;
    return v;
}

static jval *pickle_parse(const char *text, size_t len)
{
    pkreader r = {(const unsigned char *)text, (const unsigned char *)text + len,
                  (const unsigned char *)text,
                  {NULL, 0, 0, sizeof(jval *)}, {NULL, 0, 0, sizeof(size_t)},
                  {NULL, 0, 0, sizeof(jval *)}};
    for (;;) {
        unsigned op = *pk_take(&r, 1);
        switch (op) {
        case 0x80: /* PROTO */
            if (*pk_take(&r, 1) > 5)
                pkfail(&r, "protocol above 5");
            break;
        case 0x95: pk_take(&r, 8); break; /* FRAME */
        case '}': pk_push(&r, pk_new(J_OBJ)); break;
        case ']': case ')': pk_push(&r, pk_new(J_ARR)); break; /* tuples read as lists */
        case '(':
            if (r.marks.n > JSON_MAX_DEPTH)
                pkfail(&r, "nested too deeply");
            *(size_t *)vec_push(&r.marks) = r.stack.n;
            break;
        case 'N': pk_push(&r, pk_new(J_NULL)); break;
        case 0x88: case 0x89: {
            jval *v = pk_new(J_BOOL);
            v->b = op == 0x88;
            pk_push(&r, v);
            break;
        }
        case 'K': pk_push(&r, pk_int((int64_t)pk_le(&r, 1))); break;
        case 'M': pk_push(&r, pk_int((int64_t)pk_le(&r, 2))); break;
        case 'J': pk_push(&r, pk_int((int32_t)(uint32_t)pk_le(&r, 4))); break;
        case 0x8a: { /* LONG1 */
            size_t n = *pk_take(&r, 1);
            if (n > 8)
                pkfail(&r, "an integer wider than 64 bits");
            uint64_t u = n ? pk_le(&r, n) : 0;
            if (n && n < 8 && (u >> (8 * n - 1)) & 1)
                u |= ~UINT64_C(0) << (8 * n); /* sign-extend */
            pk_push(&r, pk_int((int64_t)u));
            break;
        }
        case 'G': { /* BINFLOAT, big-endian */
            const unsigned char *b = pk_take(&r, 8);
            uint64_t u = 0;
            for (int i = 0; i < 8; i++)
                u = u << 8 | b[i];
            double d;
            memcpy(&d, &u, sizeof d);
            jval *v = pk_new(J_NUM);
            v->d = d;
            v->is_int = false;
            pk_push(&r, v);
            break;
        }
        case 0x8c: pk_push(&r, pk_str(&r, *pk_take(&r, 1))); break; /* SHORT_BINUNICODE */
        case 'X': pk_push(&r, pk_str(&r, pk_le(&r, 4))); break;    /* BINUNICODE */
        case 0x8d: pk_push(&r, pk_str(&r, pk_le(&r, 8))); break;   /* BINUNICODE8 */
        case 0x94: *(jval **)vec_push(&r.memo) = pk_top(&r); break; /* MEMOIZE */
        case 'q': case 'r': { /* BINPUT, LONG_BINPUT */
            size_t i = op == 'q' ? (size_t)pk_le(&r, 1) : (size_t)pk_le(&r, 4);
            if (i > r.memo.n + 1024)
                pkfail(&r, "memo index %zu out of range", i);
            while (r.memo.n <= i)
                *(jval **)vec_push(&r.memo) = NULL;
            VEC_AT(r.memo, jval *, i) = pk_top(&r);
            break;
        }
        case 'h': case 'j': { /* BINGET, LONG_BINGET */
            size_t i = op == 'h' ? (size_t)pk_le(&r, 1) : (size_t)pk_le(&r, 4);
            if (i >= r.memo.n || !VEC_AT(r.memo, jval *, i))
                pkfail(&r, "memo index %zu not set", i);
            pk_push(&r, VEC_AT(r.memo, jval *, i));
            break;
        }
        case 'a': { /* APPEND */
            jval *v = pk_pop(&r);
            pk_append(&r, pk_top(&r), &v, 1);
            break;
        }
        case 'e': case 'u': case 'l': case 't': case 'd': { /* APPENDS SETITEMS LIST TUPLE DICT */
            size_t m = pk_mark(&r);
            size_t n = r.stack.n - m;
            jval **items = n ? (jval **)r.stack.items + m : NULL; /* no stack yet: NULL */
            if (op == 'e' || op == 'u') {
                if (!m)
                    pkfail(&r, "nothing below the mark");
                jval *c = VEC_AT(r.stack, jval *, m - 1);
                if (op == 'e')
                    pk_append(&r, c, items, n);
                else
                    pk_setitems(&r, c, items, n);
                r.stack.n = m;
            } else {
                jval *c = pk_new(op == 'd' ? J_OBJ : J_ARR);
                if (op == 'd')
                    pk_setitems(&r, c, items, n);
                else
                    pk_append(&r, c, items, n);
                r.stack.n = m;
                pk_push(&r, c);
            }
            break;
        }
        case 's': { /* SETITEM */
            jval *kv[2];
            kv[1] = pk_pop(&r);
            kv[0] = pk_pop(&r);
            pk_setitems(&r, pk_top(&r), kv, 2);
            break;
        }
        case 0x85: case 0x86: case 0x87: { /* TUPLE1..3 */
            size_t n = op - 0x84;
            size_t base = r.marks.n ? VEC_AT(r.marks, size_t, r.marks.n - 1) : 0;
            if (r.stack.n < base + n)
                pkfail(&r, "stack underflow");
            jval *c = pk_new(J_ARR);
            pk_append(&r, c, (jval **)r.stack.items + r.stack.n - n, n);
            r.stack.n -= n;
            pk_push(&r, c);
            break;
        }
        case '.': { /* STOP */
            jval *v = pk_pop(&r);
            if (r.p != r.end)
                pkfail(&r, "unexpected bytes after STOP");
            return v;
        }
        default:
            r.p--;
            pkfail(&r, "opcode 0x%02x is not one a snapshot holds (objects are refused)", op);
        }
    }
}

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
        fail("the snapshot reaches more than %zu values through shared references (the bound "
             "is %zu plus %d per byte of the file): refused",
             limit, EXPAND_BASE, EXPAND_PER_BYTE);
    --*budget;
    if (v->t != J_ARR && v->t != J_OBJ)
        return;
    if (v->walking)
        fail("a container holds itself (a reference cycle): refused");
    if (depth > JSON_MAX_DEPTH)
        fail("nested too deeply (more than %d levels)", JSON_MAX_DEPTH);
    v->walking = true;
    for (size_t k = 0; k < v->n; k++)
        tree_check(v->items[k], depth + 1, budget, limit);
    v->walking = false;
}

/* The file's bytes as a tree: a pickle when it starts with PROTO, else JSON. */
static jval *parse_snapshot(const char *text, size_t len)
{
    jval *root;
    if (len && (unsigned char)text[0] == 0x80) {
        root = pickle_parse(text, len);
    } else {
        if (memchr(text, '\0', len))
            fail("the file holds a NUL byte: not a JSON text");
        root = json_parse(text, len);
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
    int dev; /* index into the devices, -1 for a device no trace names */
    int64_t address, total, allocated, active, requested, stream;
    vec blocks; /* block */
} segment;

typedef struct event {
    const char *action, *manager, *frames;
    int64_t addr, size, time_us;
} event;

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
        fail("%s.\"frames\" must be an array (found %s)", path, jtype_name(frames));
    if (frames->text)
        return frames->text;
    char buf[8 * 256];
    size_t o = 0;
    buf[0] = '\0';
    for (size_t k = 0; k < frames->n && k < 8; k++) {
        const jval *f = frames->items[k];
        if (f->t != J_OBJ)
            fail("%s.frames[%zu] must be an object (found %s)", path, k, jtype_name(f));
        const jval *file = jget(f, "filename"), *line = jget(f, "line"), *name = jget(f, "name");
        int w = snprintf(buf + o, sizeof buf - o, "%s%.100s:%" PRId64 " %.100s", k ? "; " : "",
                         file && file->t == J_STR ? file->s : "?",
                         line && line->t == J_NUM && line->is_int ? line->i : (int64_t)0,
                         name && name->t == J_STR ? name->s : "");
        if (w > 0)
            o += (size_t)w < sizeof buf - o ? (size_t)w : sizeof buf - o - 1;
    }
    char *out = xalloc(o + 1);
    memcpy(out, buf, o + 1);
    ((jval *)frames)->text = out;
    return out;
}

/* a + b for addresses, sizes and byte totals, refused when it overflows. */
static int64_t add_i64(int64_t a, int64_t b, const char *what, const char *path)
{
    int64_t r;
    if (__builtin_add_overflow(a, b, &r))
        fail("%s%s%s overflows 64 bits (%" PRId64 " + %" PRId64 ")", path, *path ? ": " : "", what,
             a, b);
    return r;
}

typedef struct snapshot {
    vec devices;  /* const char * */
    vec segments; /* segment */
    vec traces;   /* vec of event, one per device */
    const jval *settings;
} snapshot;

/* One timeline each: a snapshot has a handful. */
#define MAX_DEVICES 64

static void read_snapshot(const jval *root, snapshot *s)
{
    if (root->t != J_OBJ)
        fail("the snapshot must be a JSON object (found %s)", jtype_name(root));
    char path[128];
    s->devices = (vec){NULL, 0, 0, sizeof(const char *)};
    s->segments = (vec){NULL, 0, 0, sizeof(segment)};
    s->traces = (vec){NULL, 0, 0, sizeof(vec)};

    /* ndm names its devices; PyTorch's snapshots index CUDA devices. */
    const jval *devs = jget(root, "devices");
    const jval *traces = need(root, "device_traces", J_ARR, "");
    if (devs) {
        if (devs->t != J_ARR)
            fail("\"devices\" must be an array (found %s)", jtype_name(devs));
        for (size_t i = 0; i < devs->n; i++) {
            if (devs->items[i]->t != J_STR)
                fail("devices[%zu] must be a string (found %s)", i, jtype_name(devs->items[i]));
            if (i >= MAX_DEVICES)
                fail("\"devices\" names more than %d devices: refused", MAX_DEVICES);
            for (size_t k = 0; k < i; k++)
                if (!strcmp(devs->items[k]->s, devs->items[i]->s))
                    fail("devices[%zu] \"%s\" is named twice", i, devs->items[i]->s);
            *(const char **)vec_push(&s->devices) = devs->items[i]->s;
        }
    } else {
        if (traces->n > MAX_DEVICES)
            fail("\"device_traces\" has lists for more than %d devices: refused", MAX_DEVICES);
        for (size_t i = 0; i < traces->n; i++) {
            char *name = xalloc(32);
            snprintf(name, 32, "cuda:%zu", i);
            *(const char **)vec_push(&s->devices) = name;
        }
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
        const jval *jd = jget(js, "device");
        if (jd && jd->t == J_NUM && jd->is_int && jd->i >= 0 && (size_t)jd->i < s->devices.n)
            g->device = VEC_AT(s->devices, const char *, jd->i);
        else if (jd && jd->t == J_NUM)
            fail("%s.\"device\" %.17g is no index into \"device_traces\"", path, jd->d);
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
                fail("%s must be an object (found %s)", bpath, jtype_name(b));
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
                warn("%s: unknown state \"%s\"", bpath, x->state);
            if (x->address != next)
                warn("%s starts at %" PRId64 ", where the previous block ended at %" PRId64,
                     bpath, x->address, next);
            next = add_i64(x->address, x->size, "address + size", bpath);
        }
        if (next != add_i64(g->address, g->total, "address + total_size", path))
            warn("%s: its blocks cover %" PRId64 " of its %" PRId64 " bytes", path,
                 next - g->address, g->total);
    }

    if (traces->n != s->devices.n)
        fail("\"device_traces\" has %zu list%s for %zu device%s: one list per device", traces->n,
             traces->n == 1 ? "" : "s", s->devices.n, s->devices.n == 1 ? "" : "s");
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
    g.t = xalloc(g.cap * sizeof *g.t);
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

#define MAX_SERIES 15  /* the managers with the highest peaks; the rest add up as one */
#define MAX_POINTS 2000

typedef struct series {
    const char *manager;
    int64_t now, peak;
} series;

typedef struct timeline {
    const char *device;
    int dev;               /* its index among the devices */
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
    vec initial;           /* live_entry: blocks alive before the first event */
    vec initial_manager;   /* const char *, by live_entry.series */
    int64_t initial_reserved;
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

/* Per-step managers fold into one series: a path component "<name>-<digits>"
 * becomes "<name>-*", so a training run's thousand "batch-N" managers are
 * one series, "system/model/trainer/batch-*". */
static const char *fold_manager(const char *m, char *buf, size_t cap)
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
    manager = fold_manager(manager, fb, sizeof fb);
    size_t i = hash_str(manager) & (tl->index_cap - 1);
    for (; tl->index[i] != SIZE_MAX; i = (i + 1) & (tl->index_cap - 1))
        if (!strcmp(VEC_AT(tl->series, series, tl->index[i]).manager, manager))
            return (int)tl->index[i];
    series *x = vec_push(&tl->series);
    char *kept = xalloc(strlen(manager) + 1);
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
    s->now = add_i64(s->now, bytes, "a manager's byte count", "");
    if (s->now > s->peak)
        s->peak = s->now;
    tl->total = add_i64(tl->total, bytes, "the byte count in use", "");
    if (tl->total > tl->peak_total)
        tl->peak_total = tl->total;
    if (tl->shown_of) {
        int g = tl->shown_of[si];
        tl->group_now[g] = add_i64(tl->group_now[g], bytes, "a manager's byte count", "");
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
        reserved = add_i64(reserved, g->total, "the reserved byte count", "");
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
            reserved = add_i64(reserved, -e->size, "the reserved byte count", "");
        } else if (!strcmp(a, "segment_free") || !strcmp(a, "segment_unmap")) {
            reserved = add_i64(reserved, e->size, "the reserved byte count", "");
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
            reserved = add_i64(reserved, e->size, "the reserved byte count", "");
        } else if (!strcmp(a, "segment_free") || !strcmp(a, "segment_unmap")) {
            reserved = add_i64(reserved, -e->size, "the reserved byte count", "");
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

static void build_timeline(timeline *tl, int dev, const char *device, const vec *events,
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
    replay(tl, events, sample, &sm);
}

/* ---- output ----------------------------------------------------------------------- */

/* Every byte of the page goes through these, counted against a bound set by
 * the input's size (a small file can name a huge string a million times). */
#define OUTPUT_BASE ((size_t)32 << 20) /* plus OUTPUT_PER_BYTE per input byte */
#define OUTPUT_PER_BYTE 64

static size_t out_bytes, out_limit = SIZE_MAX;

static void out_count(size_t n)
{
    out_bytes += n;
    if (out_bytes > out_limit)
        fail("the page would be larger than %zu MiB (the bound is %d MiB plus %d bytes per "
             "byte of the snapshot): refused",
             out_limit >> 20, (int)(OUTPUT_BASE >> 20), OUTPUT_PER_BYTE);
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
        t->slot = xalloc(cap * sizeof *t->slot);
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
    put_jstr(f, input_name);
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
    for (size_t k = 0; k < warnings.n; k++) {
        if (k)
            out_putc(',', f);
        put_jstr(f, VEC_AT(warnings, char *, k));
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
    const char *m = fold_manager(*manager ? manager : "(unknown manager)", fb, sizeof fb);
    size_t id = str_id(t, m);
    if (id == v->n) {
        held *h = vec_push(v);
        char *kept = xalloc(strlen(m) + 1);
        h->manager = strcpy(kept, m);
        VEC_AT(t->list, const char *, id) = h->manager;
        h->before = h->after = 0;
    }
    held *h = &VEC_AT(*v, held, id);
    int64_t *x = after ? &h->after : &h->before;
    *x = add_i64(*x, bytes, "a manager's byte count", "");
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
    ss->slot = xalloc(ss->cap * sizeof *ss->slot);
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
            reserved[w] = add_i64(reserved[w], g->total, "the reserved byte count", "");
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
    "table{border-collapse:collapse}td{padding:1px 10px 1px 0}td+td{max-width:1000px;"
    "overflow-wrap:anywhere}\n"
    "#tip{position:fixed;pointer-events:none;background:#fffbe6;border:1px solid #bbb;"
    "padding:4px 6px;font-size:12px;white-space:pre;display:none;max-width:640px}\n"
    "svg.plot{overflow:hidden;margin:0}.timeline{cursor:crosshair;user-select:none}\n"
    ".cursor{stroke:#000;stroke-width:.5}h3{font-size:13px;margin:14px 0 2px}\n"
    ".replay input{width:600px;vertical-align:middle}\n"
    "th{text-align:left;padding:1px 10px 1px 0}.grow{color:#b00}.shrink{color:#070}\n"
    "i.bar{display:inline-block;height:9px}i.bar.grow{background:#e15759}"
    "i.bar.shrink{background:#59a14f}\n"
    "</style>\n</head>\n<body data-rendered=\"0\">\n<h1>ndm memory snapshot</h1>\n"
    "<div id=\"source\" class=\"note\"></div>\n<div id=\"warnings\"></div>\n"
    "<div id=\"compare\"></div>\n"
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
    "var S = D.strings;\n"
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
    "  var u = ['B', 'KiB', 'MiB', 'GiB', 'TiB'], i = 0, neg = n < 0;\n"
    "  n = Math.abs(n);\n"
    "  while (n >= 1024 && i < u.length - 1) { n /= 1024; i++; }\n"
    "  return (neg ? '-' : '') + (i ? n.toFixed(n < 10 ? 2 : 1) : String(n)) + ' ' + u[i];\n"
    "}\n"
    "function secs(us) {\n"
    "  if (Math.abs(us) >= 1e6) return (us / 1e6).toFixed(2) + ' s';\n"
    "  if (Math.abs(us) >= 1e3) return (us / 1e3).toFixed(1) + ' ms';\n"
    "  return Math.round(us) + ' us';\n"
    "}\n"
    "function hex(a) { return '0x' + a.toString(16); }\n"
    "/* Per-step managers as one series: \"batch-12\" -> \"batch-*\" (as ndm-memviz folds). */\n"
    "function fold(m) {\n"
    "  return (m || '(unknown manager)').split('/').map(function (c) {\n"
    "    return c.replace(/^(.+-)[0-9]+$/, '$1*');\n"
    "  }).join('/');\n"
    "}\n"
    "var tip = document.getElementById('tip');\n"
    "function showTip(text, x, y) {\n"
    "  tip.textContent = text; tip.style.display = 'block';\n"
    "  tip.style.left = (x + 14) + 'px'; tip.style.top = (y + 14) + 'px';\n"
    "}\n"
    "function hover(node, text) {\n"
    "  el('title', {}, node).textContent = text;\n"
    "  node.addEventListener('mousemove', function (ev) { showTip(text, ev.clientX, ev.clientY); });\n"
    "  node.addEventListener('mouseleave', function () { tip.style.display = 'none'; });\n"
    "}\n"
    "var params = {};\n"
    "location.hash.replace(/^#/, '').split('&').forEach(function (kv) {\n"
    "  var i = kv.indexOf('=');\n"
    "  if (i > 0) params[decodeURIComponent(kv.slice(0, i))] = decodeURIComponent(kv.slice(i + 1));\n"
    "});\n"
    "function hashArgs(key, dev) {\n"
    "  var v = params[key];\n"
    "  if (!v) return null;\n"
    "  var parts = v.split(':');\n"
    "  var name = parts.slice(0, parts.length - (key === 'replay' ? 1 : 2)).join(':');\n"
    "  return name === dev ? parts.slice(parts.length - (key === 'replay' ? 1 : 2)).map(Number) : null;\n"
    "}\n"
    "\n"
    "/* ---- the allocator state at any event: backwards from the segments ---- */\n"
    "var ACT = ['alloc', 'free_requested', 'free_completed', 'segment_alloc', 'segment_free',\n"
    "           'segment_map', 'segment_unmap', 'oom', 'snapshot', 'other'];\n"
    "function finalState(dev) {\n"
    "  var st = {segs: new Map(), blocks: new Map()};\n"
    "  D.segments.forEach(function (s) {\n"
    "    if (s.device !== dev) return;\n"
    "    st.segs.set(s.address, {size: s.total, type: s.type});\n"
    "    s.blocks.forEach(function (b) {\n"
    "      if (b.state === 'inactive') return;\n"
    "      st.blocks.set(s.address + b.offset, {size: b.size, req: b.requested, state: b.state,\n"
    "                                           m: b.manager, f: b.frames});\n"
    "    });\n"
    "  });\n"
    "  return st;\n"
    "}\n"
    "function Replayer(tl) {\n"
    "  var ev = tl.ev, n = ev.t.length, st = finalState(tl.device), cur = n;\n"
    "  function undo(i) {\n"
    "    var a = ev.a[i], addr = ev.addr[i], b;\n"
    "    if (a === 0) st.blocks.delete(addr);\n"
    "    else if (a === 1) { b = st.blocks.get(addr); if (b) b.state = 'active_allocated'; }\n"
    "    else if (a === 2) st.blocks.set(addr, {size: ev.size[i], req: ev.size[i],\n"
    "                                           state: 'active_pending_free', m: S[ev.m[i]],\n"
    "                                           f: S[ev.f[i]]});\n"
    "    else if (a === 3 || a === 5) st.segs.delete(addr);\n"
    "    else if (a === 4 || a === 6) st.segs.set(addr, {size: ev.size[i], type: ''});\n"
    "  }\n"
    "  function apply(i) {\n"
    "    var a = ev.a[i], addr = ev.addr[i], b;\n"
    "    if (a === 0) st.blocks.set(addr, {size: ev.size[i], req: ev.size[i],\n"
    "                                      state: 'active_allocated', m: S[ev.m[i]], f: S[ev.f[i]]});\n"
    "    else if (a === 1) { b = st.blocks.get(addr); if (b) b.state = 'active_pending_free'; }\n"
    "    else if (a === 2) st.blocks.delete(addr);\n"
    "    else if (a === 3 || a === 5) st.segs.set(addr, {size: ev.size[i], type: ''});\n"
    "    else if (a === 4 || a === 6) st.segs.delete(addr);\n"
    "  }\n"
    "  return {\n"
    "    n: n,\n"
    "    /* The state after the first k events of the window. */\n"
    "    at: function (k) {\n"
    "      k = Math.max(0, Math.min(n, k));\n"
    "      if (k > cur && n - k < k - cur) { st = finalState(tl.device); cur = n; }\n"
    "      while (cur > k) undo(--cur);\n"
    "      while (cur < k) apply(cur++);\n"
    "      return st;\n"
    "    },\n"
    "    /* Events whose time is at most t. */\n"
    "    count: function (t) {\n"
    "      var lo = 0, hi = n;\n"
    "      while (lo < hi) { var mid = (lo + hi) >> 1; if (ev.t[mid] <= t) lo = mid + 1; else hi = mid; }\n"
    "      return lo;\n"
    "    }\n"
    "  };\n"
    "}\n"
    "\n"
    "var drawnSeries = 0, drawnBlocks = 0, drawnSegments = 0;\n"
    "var replayers = {};\n"
    "\n"
    "/* ---- timelines: zoom with the wheel, pan by dragging, hover one allocation ---- */\n"
    "function drawTimeline(tl, host) {\n"
    "  html('h2', 'Allocated bytes over time on ' + tl.device + ', stacked by manager', host);\n"
    "  var info = tl.events + ' events, peak ' + bytes(tl.peak_total);\n"
    "  if (tl.unknown_frees) info += '; ' + tl.unknown_frees +\n"
    "    ' frees of blocks allocated before the trace began were left out';\n"
    "  html('div', info + '. Wheel: zoom; drag: pan; double click: whole trace.', host, 'note');\n"
    "  var W = Math.max(600, Math.min(2400, (host.clientWidth || 1000) - 90)), H = 280, L = 70,\n"
    "      B = 24;\n"
    "  var svg = el('svg', {width: W + L + 10, height: H + B + 10, 'class': 'timeline',\n"
    "                      'data-device': tl.device}, host);\n"
    "  var n = tl.t.length, k = tl.series.length;\n"
    "  if (!n) { html('div', 'no events on this device', host, 'note'); return; }\n"
    "  var rp = replayers[tl.device] = Replayer(tl);\n"
    "  var T0 = tl.t[0], T1 = tl.t[n - 1];\n"
    "  T1 += Math.max(1, Math.round((T1 - T0) / 20)); /* past the last event: the final state shows */\n"
    "  var view = [T0, T1];\n"
    "  var ymax = 1;\n"
    "  for (var i = 0; i < n; i++) {\n"
    "    var s = 0; for (var j = 0; j < k; j++) s += tl.values[i * k + j];\n"
    "    ymax = Math.max(ymax, s, tl.reserved[i]);\n"
    "  }\n"
    "  var axes = el('g', {}, svg);\n"
    "  /* a nested svg clips the plot to its area, in the outer coordinates */\n"
    "  var plot = el('svg', {x: L, y: 5, width: W, height: H,\n"
    "                        viewBox: L + ' 5 ' + W + ' ' + H, 'class': 'plot'}, svg);\n"
    "  var cursor = el('line', {y1: 5, y2: H + 5, 'class': 'cursor', visibility: 'hidden'}, svg);\n"
    "  function X(t) { return L + (t - view[0]) / (view[1] - view[0]) * W; }\n"
    "  function Y(v) { return 5 + H - v / ymax * H; }\n"
    "  var legend = html('div', null, host, 'legend');\n"
    "  for (var j2 = 0; j2 < k; j2++) {\n"
    "    var m = tl.series[j2].manager, item = html('span', null, legend);\n"
    "    html('i', null, item).style.background = color(m);\n"
    "    item.appendChild(document.createTextNode(m + ' (peak ' + bytes(tl.series[j2].peak) + ')'));\n"
    "  }\n"
    "  html('span', '- - reserved', legend);\n"
    "  function render() {\n"
    "    while (plot.firstChild) plot.removeChild(plot.firstChild);\n"
    "    while (axes.firstChild) axes.removeChild(axes.firstChild);\n"
    "    for (var g = 0; g <= 4; g++) {\n"
    "      var v = ymax * g / 4;\n"
    "      el('line', {x1: L, x2: L + W, y1: Y(v), y2: Y(v), 'class': 'grid'}, axes);\n"
    "      el('text', {x: L - 6, y: Y(v) + 4, 'text-anchor': 'end', 'class': 'label'}, axes)\n"
    "        .textContent = bytes(Math.round(v));\n"
    "    }\n"
    "    for (var g2 = 0; g2 <= 4; g2++) {\n"
    "      var tt = view[0] + (view[1] - view[0]) * g2 / 4;\n"
    "      el('text', {x: X(tt), y: H + B, 'text-anchor': 'middle', 'class': 'label'}, axes)\n"
    "        .textContent = secs(tt - T0);\n"
    "    }\n"
    "    /* only the points in view, and one either side */\n"
    "    var a = 0, b = n - 1;\n"
    "    while (a + 1 < n && tl.t[a + 1] < view[0]) a++;\n"
    "    while (b > a && tl.t[b - 1] > view[1]) b--;\n"
    "    var below = [];\n"
    "    for (var i2 = a; i2 <= b; i2++) below.push(0);\n"
    "    for (var j3 = 0; j3 < k; j3++) {\n"
    "      var top = [], d = '';\n"
    "      for (var i3 = a; i3 <= b; i3++) top.push(below[i3 - a] + tl.values[i3 * k + j3]);\n"
    "      for (var i4 = a; i4 <= b; i4++) {\n"
    "        var x = X(tl.t[i4]), xn = i4 + 1 < n ? X(tl.t[i4 + 1]) : X(T1);\n"
    "        d += (i4 > a ? 'L' : 'M') + x.toFixed(1) + ',' + Y(top[i4 - a]).toFixed(1) +\n"
    "             'L' + xn.toFixed(1) + ',' + Y(top[i4 - a]).toFixed(1);\n"
    "      }\n"
    "      for (var i5 = b; i5 >= a; i5--) {\n"
    "        var xa = X(tl.t[i5]), xb = i5 + 1 < n ? X(tl.t[i5 + 1]) : X(T1);\n"
    "        d += 'L' + xb.toFixed(1) + ',' + Y(below[i5 - a]).toFixed(1) +\n"
    "             'L' + xa.toFixed(1) + ',' + Y(below[i5 - a]).toFixed(1);\n"
    "      }\n"
    "      var mm = tl.series[j3].manager;\n"
    "      el('path', {d: d + 'Z', fill: color(mm), 'class': 'series', 'data-manager': mm,\n"
    "                  'data-peak': tl.series[j3].peak}, plot);\n"
    "      below = top;\n"
    "    }\n"
    "    var r = '';\n"
    "    for (var i6 = a; i6 <= b; i6++) {\n"
    "      var xr = X(tl.t[i6]), xs = i6 + 1 < n ? X(tl.t[i6 + 1]) : X(T1);\n"
    "      r += (i6 > a ? 'L' : 'M') + xr.toFixed(1) + ',' + Y(tl.reserved[i6]).toFixed(1) +\n"
    "           'L' + xs.toFixed(1) + ',' + Y(tl.reserved[i6]).toFixed(1);\n"
    "    }\n"
    "    el('path', {d: r, 'class': 'reserved'}, plot);\n"
    "    tl.ooms.forEach(function (t) {\n"
    "      hover(el('line', {x1: X(t), x2: X(t), y1: 5, y2: H + 5, 'class': 'oom'}, plot),\n"
    "            'out of memory at ' + secs(t - T0));\n"
    "    });\n"
    "    el('line', {x1: L, x2: L, y1: 5, y2: H + 5, 'class': 'axis'}, axes);\n"
    "    el('line', {x1: L, x2: L + W, y1: H + 5, y2: H + 5, 'class': 'axis'}, axes);\n"
    "    svg.setAttribute('data-view', Math.round(view[0] - T0) + ',' + Math.round(view[1] - T0));\n"
    "  }\n"
    "  render();\n"
    "  drawnSeries += k;\n"
    "  /* The allocation under (t, bytes): the band of its series at t, then the\n"
    "   * live blocks of that series at the event before t, stacked by address. */\n"
    "  function pick(t, v) {\n"
    "    var i = 0;\n"
    "    while (i + 1 < n && tl.t[i + 1] <= t) i++;\n"
    "    var base = 0, band = -1, bandH = 0;\n"
    "    for (var j = 0; j < k; j++) {\n"
    "      var h = tl.values[i * k + j];\n"
    "      if (v >= base && v < base + h) { band = j; bandH = h; break; }\n"
    "      base += h;\n"
    "    }\n"
    "    if (band < 0) return null;\n"
    "    var name = tl.series[band].manager, other = /^\\(\\d+ other managers\\)$/.test(name);\n"
    "    var shown = {};\n"
    "    tl.series.forEach(function (s) { shown[s.manager] = true; });\n"
    "    var st = rp.at(rp.count(t)), live = [];\n"
    "    st.blocks.forEach(function (b, addr) {\n"
    "      var f = fold(b.m);\n"
    "      if (other ? !shown[f] : f === name) live.push([addr, b]);\n"
    "    });\n"
    "    live.sort(function (x, y) { return x[0] - y[0]; });\n"
    "    var sum = 0;\n"
    "    live.forEach(function (x) { sum += x[1].req || x[1].size; });\n"
    "    if (!sum) return null;\n"
    "    var off = (v - base) / bandH * sum, acc = 0;\n"
    "    for (var q = 0; q < live.length; q++) {\n"
    "      acc += live[q][1].req || live[q][1].size;\n"
    "      if (off < acc) return {addr: live[q][0], b: live[q][1], series: name};\n"
    "    }\n"
    "    return {addr: live[live.length - 1][0], b: live[live.length - 1][1], series: name};\n"
    "  }\n"
    "  function describe(p) {\n"
    "    var b = p.b;\n"
    "    return bytes(b.req || b.size) + ' at ' + hex(p.addr) + ' (' + b.state + ')\\n' +\n"
    "      (b.m || '(no manager)') + '\\n' + (b.f ? b.f.split('; ').join('\\n') : '(no stack recorded)');\n"
    "  }\n"
    "  function hoverAt(t, v, cx, cy) {\n"
    "    var p = pick(t, v);\n"
    "    cursor.setAttribute('x1', X(t)); cursor.setAttribute('x2', X(t));\n"
    "    cursor.setAttribute('visibility', 'visible');\n"
    "    if (!p) { tip.style.display = 'none'; svg.removeAttribute('data-hover-addr'); return; }\n"
    "    svg.setAttribute('data-hover-addr', String(p.addr));\n"
    "    svg.setAttribute('data-hover-manager', p.b.m);\n"
    "    showTip(describe(p), cx, cy);\n"
    "  }\n"
    "  function local(ev) {\n"
    "    var r = svg.getBoundingClientRect();\n"
    "    return [ev.clientX - r.left, ev.clientY - r.top];\n"
    "  }\n"
    "  var drag = null, pending = null;\n"
    "  svg.addEventListener('wheel', function (ev) {\n"
    "    var p = local(ev);\n"
    "    if (p[0] < L || p[0] > L + W) return;\n"
    "    ev.preventDefault();\n"
    "    var t = view[0] + (p[0] - L) / W * (view[1] - view[0]);\n"
    "    var f = ev.deltaY < 0 ? 0.8 : 1.25;\n"
    "    var a = t - (t - view[0]) * f, b = t + (view[1] - t) * f;\n"
    "    view = [Math.max(T0, a), Math.min(T1, b)];\n"
    "    if (view[1] - view[0] < 2) view = [t - 1, t + 1];\n"
    "    render();\n"
    "  }, {passive: false});\n"
    "  svg.addEventListener('mousedown', function (ev) {\n"
    "    drag = {x: local(ev)[0], view: view.slice()};\n"
    "    ev.preventDefault();\n"
    "  });\n"
    "  window.addEventListener('mouseup', function () { drag = null; });\n"
    "  svg.addEventListener('dblclick', function () { view = [T0, T1]; render(); });\n"
    "  svg.addEventListener('mousemove', function (ev) {\n"
    "    var p = local(ev);\n"
    "    if (drag) {\n"
    "      var span = drag.view[1] - drag.view[0];\n"
    "      var dt = (p[0] - drag.x) / W * span;\n"
    "      var a = Math.max(T0, Math.min(T1 - span, drag.view[0] - dt));\n"
    "      view = [a, a + span];\n"
    "      render();\n"
    "      return;\n"
    "    }\n"
    "    if (p[0] < L || p[0] > L + W || p[1] < 5 || p[1] > H + 5) return;\n"
    "    var cx = ev.clientX, cy = ev.clientY;\n"
    "    var t = view[0] + (p[0] - L) / W * (view[1] - view[0]), v = (H + 5 - p[1]) / H * ymax;\n"
    "    if (!pending) window.requestAnimationFrame(function () {\n"
    "      hoverAt(pending[0], pending[1], pending[2], pending[3]); pending = null;\n"
    "    });\n"
    "    pending = [t, v, cx, cy];\n"
    "  });\n"
    "  svg.addEventListener('mouseleave', function () {\n"
    "    tip.style.display = 'none'; cursor.setAttribute('visibility', 'hidden');\n"
    "  });\n"
    "  var z = hashArgs('zoom', tl.device);\n"
    "  if (z) { view = [T0 + z[0], T0 + z[1]]; render(); }\n"
    "  var hv = hashArgs('hover', tl.device);\n"
    "  if (hv) {\n"
    "    var box = svg.getBoundingClientRect();\n"
    "    hoverAt(hv[0], hv[1], box.left + X(hv[0]), box.top + Y(hv[1]));\n"
    "  }\n"
    "}\n"
    "\n"
    "/* ---- the segment map, to scale, with a slider that replays it ---- */\n"
    "var stateColor = {active_allocated: '#4e79a7', active_pending_free: '#f28e2b',\n"
    "                  inactive: '#e4e4e4'};\n"
    "function drawSegmap(host, dev, segs, maxSeg, blocksOf, label) {\n"
    "  while (host.firstChild) host.removeChild(host.firstChild);\n"
    "  var total = 0, live = 0;\n"
    "  segs.forEach(function (s) { total += s.total; });\n"
    "  var W = 900, L = 200, RH = 16, GAP = 4;\n"
    "  var svg = el('svg', {width: L + W + 10, height: segs.length * (RH + GAP) + 4,\n"
    "                      'class': 'segmap', 'data-device': dev}, host);\n"
    "  var scale = W / Math.max(1, maxSeg);\n"
    "  segs.forEach(function (s, i) {\n"
    "    var y = 2 + i * (RH + GAP), w = Math.max(2, s.total * scale);\n"
    "    el('text', {x: L - 6, y: y + RH - 4, 'text-anchor': 'end', 'class': 'label'}, svg)\n"
    "      .textContent = hex(s.address) + ' ' + bytes(s.total) + (s.type ? ' ' + s.type : '');\n"
    "    var frame = el('rect', {x: L, y: y, width: w.toFixed(1), height: RH, fill: '#f6f6f6',\n"
    "                            stroke: '#999', 'class': 'segment', 'data-total': s.total}, svg);\n"
    "    hover(frame, 'segment ' + hex(s.address) + '\\n' + bytes(s.total) +\n"
    "          (s.allocated !== undefined ? ', allocated ' + bytes(s.allocated) : ''));\n"
    "    blocksOf(s).forEach(function (b) {\n"
    "      var rc = el('rect', {x: L + b.offset * scale, y: y + 1,\n"
    "                           width: Math.max(0.5, b.size * scale), height: RH - 2,\n"
    "                           fill: stateColor[b.state] || '#c00', stroke: '#fff',\n"
    "                           'stroke-width': 0.5, 'class': 'block',\n"
    "                           'data-state': b.state, 'data-manager': b.manager}, svg);\n"
    "      if (b.state !== 'inactive') live++;\n"
    "      hover(rc, (b.manager || '(no manager)') + '\\n' + b.state + ', ' + bytes(b.size) +\n"
    "            ' (requested ' + bytes(b.requested) + ')\\n' + hex(s.address + b.offset) +\n"
    "            (b.frames ? '\\n' + b.frames.split('; ').join('\\n') : ''));\n"
    "    });\n"
    "  });\n"
    "  svg.setAttribute('data-live-blocks', live);\n"
    "  html('div', label + ': ' + segs.length + ' segments, ' + bytes(total) + ' reserved, ' +\n"
    "       live + ' blocks in use', host, 'note');\n"
    "  if (!segs.length) html('div', 'no segments', host, 'note');\n"
    "  return svg;\n"
    "}\n"
    "function drawSegments(host) {\n"
    "  var states = document.getElementById('states');\n"
    "  Object.keys(stateColor).forEach(function (s) {\n"
    "    var item = html('span', null, states);\n"
    "    html('i', null, item).style.background = stateColor[s];\n"
    "    item.appendChild(document.createTextNode(s));\n"
    "  });\n"
    "  var devs = [];\n"
    "  D.timelines.forEach(function (tl) { devs.push(tl.device); });\n"
    "  D.segments.forEach(function (s) { if (devs.indexOf(s.device) < 0) devs.push(s.device); });\n"
    "  devs.forEach(function (dev) {\n"
    "    var segs = D.segments.filter(function (s) { return s.device === dev; })\n"
    "      .sort(function (a, b) { return a.address - b.address; });\n"
    "    var tl = D.timelines.filter(function (t) { return t.device === dev; })[0];\n"
    "    if (!segs.length && !(tl && tl.ev.t.length)) return;\n"
    "    /* one scale for every state of the replay: the largest segment ever seen */\n"
    "    var maxSeg = 1;\n"
    "    segs.forEach(function (s) { maxSeg = Math.max(maxSeg, s.total); });\n"
    "    if (tl) tl.ev.a.forEach(function (a, i) { if (a >= 3 && a <= 6) maxSeg = Math.max(maxSeg, tl.ev.size[i]); });\n"
    "    html('h3', dev, host);\n"
    "    var box = html('div', null, host);\n"
    "    function drawFinal() {\n"
    "      var svg = drawSegmap(box, dev, segs, maxSeg, function (s) { return s.blocks; },\n"
    "                           'at the snapshot');\n"
    "      s2count(segs);\n"
    "      return svg;\n"
    "    }\n"
    "    var counted = false;\n"
    "    function s2count(list) {\n"
    "      if (counted) return;\n"
    "      counted = true;\n"
    "      list.forEach(function (s) { drawnSegments++; drawnBlocks += s.blocks.length; });\n"
    "    }\n"
    "    var svg = drawFinal();\n"
    "    if (!tl || !tl.ev.t.length) return;\n"
    "    var rp = replayers[dev] || Replayer(tl), n = rp.n;\n"
    "    var ctl = html('div', null, host, 'replay');\n"
    "    html('label', 'Replay: event ', ctl);\n"
    "    var slider = html('input', null, ctl);\n"
    "    slider.type = 'range'; slider.min = 0; slider.max = n; slider.value = n;\n"
    "    slider.setAttribute('data-device', dev);\n"
    "    var what = html('span', '', ctl, 'note');\n"
    "    function show(k) {\n"
    "      slider.value = k;\n"
    "      if (k >= n) {\n"
    "        svg = drawFinal();\n"
    "        what.textContent = ' ' + n + ' of ' + n + ' (the snapshot)';\n"
    "      } else {\n"
    "        var st = rp.at(k), list = [];\n"
    "        st.segs.forEach(function (v, addr) { list.push({address: addr, total: v.size, type: v.type}); });\n"
    "        list.sort(function (a, b) { return a.address - b.address; });\n"
    "        var byAddr = list.slice();\n"
    "        function segOf(addr) {\n"
    "          var lo = 0, hi = byAddr.length - 1;\n"
    "          while (lo <= hi) {\n"
    "            var mid = (lo + hi) >> 1, s = byAddr[mid];\n"
    "            if (addr < s.address) hi = mid - 1;\n"
    "            else if (addr >= s.address + s.total) lo = mid + 1;\n"
    "            else return s;\n"
    "          }\n"
    "          return null;\n"
    "        }\n"
    "        var per = new Map(), orphans = 0;\n"
    "        st.blocks.forEach(function (b, addr) {\n"
    "          var s = segOf(addr);\n"
    "          if (!s) { orphans++; return; }\n"
    "          if (!per.has(s.address)) per.set(s.address, []);\n"
    "          per.get(s.address).push({offset: addr - s.address, size: b.size, requested: b.req,\n"
    "                                   state: b.state, manager: b.m, frames: b.f});\n"
    "        });\n"
    "        var t = tl.ev.t[Math.max(0, k - 1)] - tl.ev.t[0];\n"
    "        svg = drawSegmap(box, dev, list, maxSeg, function (s) { return per.get(s.address) || []; },\n"
    "                         'after event ' + k + ' (' + secs(t) + ')');\n"
    "        svg.setAttribute('data-orphans', orphans);\n"
    "        var e = k > 0 ? k - 1 : 0;\n"
    "        what.textContent = ' ' + k + ' of ' + n + ': last ' + ACT[tl.ev.a[e]] + ' ' +\n"
    "          bytes(tl.ev.size[e]) + ' ' + (S[tl.ev.m[e]] || '');\n"
    "      }\n"
    "      svg.setAttribute('data-event', k);\n"
    "    }\n"
    "    slider.addEventListener('input', function () { show(Number(slider.value)); });\n"
    "    var r = hashArgs('replay', dev);\n"
    "    if (r) show(r[0]); else svg.setAttribute('data-event', n);\n"
    "  });\n"
    "  if (!D.segments.length) html('div', 'no segments in the snapshot', host, 'note');\n"
    "}\n"
    "\n"
    "/* ---- two snapshots ---- */\n"
    "function drawCompare(host) {\n"
    "  var C = D.compare;\n"
    "  if (!C) return;\n"
    "  html('h2', 'Compared with ' + C.source, host);\n"
    "  html('div', 'reserved ' + bytes(C.reserved_before) + ' before, ' + bytes(C.reserved_after) +\n"
    "       ' now; ' + C.only_before.length + ' segments only before, ' + C.only_after.length +\n"
    "       ' only now', host, 'note');\n"
    "  var t = html('table', null, host, 'compare');\n"
    "  var head = html('tr', null, t);\n"
    "  ['manager', 'before', 'now', 'change', ''].forEach(function (h) { html('th', h, head); });\n"
    "  var most = 1;\n"
    "  C.managers.forEach(function (m) { most = Math.max(most, Math.abs(m.after - m.before)); });\n"
    "  C.managers.forEach(function (m) {\n"
    "    var row = html('tr', null, t), d = m.after - m.before;\n"
    "    row.setAttribute('data-manager', m.manager);\n"
    "    row.setAttribute('data-delta', d);\n"
    "    html('td', m.manager, row);\n"
    "    html('td', bytes(m.before), row);\n"
    "    html('td', bytes(m.after), row);\n"
    "    html('td', (d > 0 ? '+' : '') + bytes(d), row, d > 0 ? 'grow' : d < 0 ? 'shrink' : '');\n"
    "    var bar = html('i', null, html('td', null, row));\n"
    "    bar.className = 'bar ' + (d > 0 ? 'grow' : 'shrink');\n"
    "    bar.style.width = Math.round(Math.abs(d) / most * 200) + 'px';\n"
    "  });\n"
    "  [['only before', C.only_before], ['only now', C.only_after]].forEach(function (x) {\n"
    "    if (!x[1].length) return;\n"
    "    html('div', x[0] + ': ' + x[1].map(function (s) {\n"
    "      return s.device + ' ' + hex(s.address) + ' ' + bytes(s.total);\n"
    "    }).join(', '), host, 'note');\n"
    "  });\n"
    "}\n"
    "\n"
    "try {\n"
    "  document.getElementById('source').textContent = D.source;\n"
    "  var w = document.getElementById('warnings');\n"
    "  D.warnings.forEach(function (m) { html('div', 'warning: ' + m, w, 'warn'); });\n"
    "  drawCompare(document.getElementById('compare'));\n"
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
    "  html('pre', 'drawing failed: ' + e + '\\n' + (e.stack || ''), document.body, 'warn');\n"
    "}\n"
    "})();\n"
    "</script>\n</body>\n</html>\n";

#ifndef NDM_MEMVIZ_FUZZ
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

#endif

/* A snapshot's bytes, read into s; input_name names it in messages. */
static void load(const char *name, const char *text, size_t len, snapshot *s)
{
    input_name = name;
    read_snapshot(parse_snapshot(text, len), s);
}

/* The bounds scale with the bytes of every snapshot read. */
static void set_bounds(size_t input_bytes)
{
    arena_limit = bound(MEMORY_BASE, MEMORY_PER_BYTE, input_bytes);
    out_limit = bound(OUTPUT_BASE, OUTPUT_PER_BYTE, input_bytes);
}

static void render(FILE *out, const snapshot *s, const snapshot *before, const char *before_name)
{
    size_t ntl = s->devices.n;
    timeline *tls = xalloc((ntl ? ntl : 1) * sizeof *tls);
    for (size_t d = 0; d < ntl; d++)
        build_timeline(&tls[d], (int)d, VEC_AT(s->devices, const char *, d),
                       &VEC_AT(s->traces, vec, d), s);
    out_puts(page_head, out);
    write_data(out, s, tls, ntl, before, before_name);
    out_puts(page_tail, out);
}

#ifdef NDM_MEMVIZ_FUZZ
/* One input of a fuzz target: read, drawn (and, for inputs of odd length,
 * compared with itself) into /dev/null; a refusal returns too. */
int ndm_memviz_fuzz(const uint8_t *data, size_t size);
int ndm_memviz_fuzz(const uint8_t *data, size_t size)
{
    static FILE *sink;
    if (!sink && !(sink = fopen("/dev/null", "w")))
        abort();
    warnings = (vec){NULL, 0, 0, sizeof(char *)};
    warnings_seen = 0;
    out_bytes = 0;
    set_bounds(size);
    if (setjmp(fail_jump) == 0) {
        snapshot s;
        load("fuzz", (const char *)data, size, &s);
        render(sink, &s, size % 2 ? &s : NULL, "fuzz");
    }
    arena_free();
    warnings = (vec){NULL, 0, 0, sizeof(char *)};
    return 0;
}
#else
/* A crash must not leave a half page: the temporary goes, then the signal
 * does what it would have done. */
static void on_fatal_signal(int sig)
{
    if (out_tmp[0])
        unlink(out_tmp);
    signal(sig, SIG_DFL);
    raise(sig);
}

int main(int argc, char **argv)
{
    bool help = argc == 2 && (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help"));
    if ((argc != 3 && argc != 4) || help) {
        fprintf(help ? stdout : stderr,
                "usage: %s snapshot.json out.html\n"
                "       %s before.json after.json out.html\n"
                "Writes one self-contained HTML page from a memory snapshot (ndm's JSON or\n"
                "pickle, or PyTorch's pickle): bytes over time stacked by manager (one chart\n"
                "per device, zoom with the wheel, pan by dragging, hover for one allocation),\n"
                "and the segment map with a slider that replays it at any event. Given two\n"
                "snapshots, the page also compares the first with the second. A snapshot\n"
                "that would take more memory or write a larger page than a bound set by its\n"
                "size, or that nests too deeply or holds itself, is refused (exit 1).\n",
                argc > 0 ? argv[0] : "ndm-memviz", argc > 0 ? argv[0] : "ndm-memviz");
        return help ? 0 : 2;
    }
    static const int fatal[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT, SIGXFSZ, SIGINT,
                                SIGTERM, SIGHUP};
    for (size_t k = 0; k < sizeof fatal / sizeof *fatal; k++)
        signal(fatal[k], on_fatal_signal);
    const char *out_path = argv[argc - 1];
    /* Both files first: the bounds count the bytes of each. Strings of the
     * trees live in the arena, so a text may go once it is read. */
    size_t blen = 0, len;
    if (argc == 4) {
        input_name = argv[1];
        before_text = read_file(argv[1], &blen);
    }
    input_name = argv[argc - 2];
    input_text = read_file(argv[argc - 2], &len);
    set_bounds(blen > SIZE_MAX - len ? SIZE_MAX : blen + len);
    snapshot before_snap, *before = NULL;
    if (before_text) {
        load(argv[1], before_text, blen, &before_snap);
        free(before_text);
        before_text = NULL;
        before = &before_snap;
    }
    snapshot s;
    load(argv[argc - 2], input_text, len, &s);

    /* Written beside the target, then renamed: a failed run leaves no half page. */
    if (snprintf(out_tmp, sizeof out_tmp, "%s.tmp", out_path) >= (int)sizeof out_tmp) {
        out_tmp[0] = '\0';
        fail("output path too long");
    }
    out_file = fopen(out_tmp, "w");
    if (!out_file) {
        fprintf(stderr, "ndm-memviz: %s: cannot write: %s\n", out_tmp, strerror(errno));
        out_tmp[0] = '\0';
        free(input_text);
        arena_free();
        return 1;
    }
    render(out_file, &s, before, argv[1]);
    bool bad = ferror(out_file);
    int closed = fclose(out_file);
    out_file = NULL;
    if (closed != 0 || bad || rename(out_tmp, out_path) != 0) {
        fprintf(stderr, "ndm-memviz: %s: cannot write: %s\n", out_path, strerror(errno));
        out_discard();
        free(input_text);
        arena_free();
        return 1;
    }
    out_tmp[0] = '\0';
    free(input_text);
    arena_free();
    return 0;
}
#endif
