/* ndm-memviz's pickle reader: the plain values of a PyTorch snapshot into
 * the same tree as JSON; objects are refused, nothing is executed. */
#include <stdarg.h>

#include "memviz.h"

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
    mv_fail("pickle byte %zu: %s", (size_t)(r->p - r->start), msg);
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
    jval *v = mv_xalloc(sizeof *v);
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
    jval **items = mv_xalloc(cap * sizeof *items);
    if (c->n)
        memcpy(items, c->items, c->n * sizeof *items);
    c->items = items;
    if (c->t == J_OBJ) {
        const char **keys = mv_xalloc(cap * sizeof *keys);
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
            char *c = mv_xalloc(strlen(buf) + 1);
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
    char *s = mv_xalloc(n + 1);
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

jval *mv_pickle_parse(const char *text, size_t len)
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
