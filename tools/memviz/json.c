/* ndm-memviz's JSON reader: a strict RFC 8259 reader into the tree of
 * memviz.h, with errors that name the line and column. */
#include <errno.h>
#include <stdarg.h>

#include "memviz.h"

/* ---- JSON ---------------------------------------------------------------------
 *
 * A strict reader (RFC 8259) into a tree: objects keep their keys in order,
 * integers that fit in int64 are kept exact (addresses), nesting is bounded
 * so a hostile file cannot exhaust the stack, and every error names the line
 * and column. */

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
    mv_fail("line %d, column %d: %s", line, col, msg);
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
    char *out = mv_xalloc((size_t)(q - r->p) + 1), *o = out;
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
    jval *v = mv_xalloc(sizeof *v);
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

jval *mv_json_parse(const char *text, size_t len)
{
    reader r = {text, text + len, text};
    if (len >= 3 && memcmp(text, "\xef\xbb\xbf", 3) == 0)
        r.p += 3; /* a byte order mark */
    skip_ws(&r);
    if (r.p == r.end)
        mv_fail("the file is empty");
    jval *v = parse_value(&r, 0);
    skip_ws(&r);
    if (r.p != r.end)
        jfail(&r, r.p, "unexpected text after the snapshot object");
    return v;
}
