/* The JSON pull parser behind safetensors headers. It never reads past the
 * end it was given and never recurses deeper than MAX_DEPTH. */
#include <stdio.h>
#include <string.h>

#include "../base/text.h"
#include "json.h"

#define MAX_DEPTH 64

void ndm__json_init(ndm__json *j, const char *text, size_t n, char *pool, size_t pool_cap)
{
    j->start = j->p = text;
    j->end = text + n;
    j->pool = pool;
    j->pool_used = 0;
    j->pool_cap = pool_cap;
    j->msg[0] = '\0';
}

static bool fail(ndm__json *j, const char *what)
{
    if (j->p >= j->end)
        snprintf(j->msg, sizeof j->msg, "%s at byte %zu (the header ends there)", what,
                 ndm__json_pos(j));
    else
        snprintf(j->msg, sizeof j->msg, "%s at byte %zu (found '%c')", what, ndm__json_pos(j),
                 (*j->p >= 0x20 && *j->p < 0x7f) ? *j->p : '?');
    return false;
}

static void ws(ndm__json *j)
{
    while (j->p < j->end && (*j->p == ' ' || *j->p == '\t' || *j->p == '\n' || *j->p == '\r'))
        j->p++;
}

bool ndm__json_take(ndm__json *j, char c)
{
    ws(j);
    if (j->p < j->end && *j->p == c) {
        j->p++;
        return true;
    }
    return false;
}

bool ndm__json_expect(ndm__json *j, char c, const char *what)
{
    if (ndm__json_take(j, c))
        return true;
    return fail(j, what);
}

bool ndm__json_at_end(ndm__json *j)
{
    ws(j);
    return j->p == j->end;
}

static int hex(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

static bool hex4(ndm__json *j, unsigned *out)
{
    if (j->end - j->p < 4)
        return fail(j, "short \\u escape");
    unsigned v = 0;
    for (int i = 0; i < 4; i++) {
        int h = hex(j->p[i]);
        if (h < 0)
            return fail(j, "bad \\u escape");
        v = v << 4 | (unsigned)h;
    }
    j->p += 4;
    *out = v;
    return true;
}

/* Walk a string after its opening quote; write its decoded bytes to `out`
 * when not NULL. */
static bool string_body(ndm__json *j, char *out, size_t *len)
{
    size_t n = 0;
    for (;;) {
        if (j->p >= j->end)
            return fail(j, "unterminated string");
        unsigned char c = (unsigned char)*j->p;
        if (c == '"') {
            j->p++;
            *len = n;
            return true;
        }
        if (c < 0x20)
            return fail(j, "control character in a string");
        if (c != '\\') {
            if (out)
                out[n] = (char)c;
            n++;
            j->p++;
            continue;
        }
        j->p++;
        if (j->p >= j->end)
            return fail(j, "unterminated escape");
        char e = *j->p++;
        unsigned cp;
        switch (e) {
        case '"': cp = '"'; break;
        case '\\': cp = '\\'; break;
        case '/': cp = '/'; break;
        case 'b': cp = '\b'; break;
        case 'f': cp = '\f'; break;
        case 'n': cp = '\n'; break;
        case 'r': cp = '\r'; break;
        case 't': cp = '\t'; break;
        case 'u':
            if (!hex4(j, &cp))
                return false;
            if (cp >= 0xDC00 && cp <= 0xDFFF)
                return fail(j, "lone low surrogate in a \\u escape");
            if (cp >= 0xD800 && cp <= 0xDBFF) {
                unsigned lo;
                if (j->end - j->p < 2 || j->p[0] != '\\' || j->p[1] != 'u')
                    return fail(j, "high surrogate without its low half");
                j->p += 2;
                if (!hex4(j, &lo))
                    return false;
                if (lo < 0xDC00 || lo > 0xDFFF)
                    return fail(j, "high surrogate without its low half");
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            }
            break;
        default:
            j->p--;
            return fail(j, "bad escape");
        }
        if (cp == 0)
            return fail(j, "U+0000 in a string");
        char buf[4];
        size_t k;
        if (cp < 0x80) {
            buf[0] = (char)cp;
            k = 1;
        } else if (cp < 0x800) {
            buf[0] = (char)(0xC0 | cp >> 6);
            buf[1] = (char)(0x80 | (cp & 0x3F));
            k = 2;
        } else if (cp < 0x10000) {
            buf[0] = (char)(0xE0 | cp >> 12);
            buf[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
            buf[2] = (char)(0x80 | (cp & 0x3F));
            k = 3;
        } else {
            buf[0] = (char)(0xF0 | cp >> 18);
            buf[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
            buf[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
            buf[3] = (char)(0x80 | (cp & 0x3F));
            k = 4;
        }
        if (out)
            memcpy(out + n, buf, k);
        n += k;
    }
}

bool ndm__json_string(ndm__json *j, size_t *off, size_t *len)
{
    ws(j);
    if (j->p >= j->end || *j->p != '"')
        return fail(j, "expected a string");
    j->p++;
    /* The decoded form plus its NUL is shorter than the quoted form, so the
     * pool (sized from the text) cannot overflow; check anyway. */
    if (j->pool_cap - j->pool_used < (size_t)(j->end - j->p) + 1)
        return fail(j, "string pool exhausted");
    char *out = j->pool + j->pool_used;
    if (!string_body(j, out, len))
        return false;
    out[*len] = '\0';
    *off = j->pool_used;
    j->pool_used += *len + 1;
    return true;
}

bool ndm__json_uint(ndm__json *j, uint64_t *v, bool *overflow)
{
    ws(j);
    const char *s = j->p;
    if (s >= j->end || *s < '0' || *s > '9')
        return fail(j, "expected a non-negative integer");
    uint64_t x = 0;
    bool over = false;
    while (j->p < j->end && *j->p >= '0' && *j->p <= '9') {
        unsigned d = (unsigned)(*j->p - '0');
        if (x > (UINT64_MAX - d) / 10)
            over = true;
        else
            x = x * 10 + d;
        j->p++;
    }
    if (j->p - s > 1 && *s == '0') {
        j->p = s;
        return fail(j, "integer with a leading zero");
    }
    if (j->p < j->end && (*j->p == '.' || *j->p == 'e' || *j->p == 'E'))
        return fail(j, "expected an integer, not a fraction");
    *v = x;
    *overflow = over;
    return true;
}

/* One or more digits at *p, *p moved past them; "bad number" where none is. */
static bool digits(ndm__json *j, const char **p)
{
    const char *q = *p;
    if (q >= j->end || *q < '0' || *q > '9') {
        j->p = q;
        return fail(j, "bad number");
    }
    while (q < j->end && *q >= '0' && *q <= '9')
        q++;
    *p = q;
    return true;
}

static bool skip_number(ndm__json *j)
{
    const char *p = j->p;
    if (p < j->end && *p == '-')
        p++;
    if (p < j->end && *p == '0')
        p++;
    else if (!digits(j, &p))
        return false;
    if (p < j->end && *p == '.') {
        p++;
        if (!digits(j, &p))
            return false;
    }
    if (p < j->end && (*p == 'e' || *p == 'E')) {
        p++;
        if (p < j->end && (*p == '+' || *p == '-'))
            p++;
        if (!digits(j, &p))
            return false;
    }
    j->p = p;
    return true;
}

static bool word(ndm__json *j, const char *w)
{
    size_t n = strlen(w);
    if ((size_t)(j->end - j->p) < n || memcmp(j->p, w, n) != 0)
        return fail(j, "unexpected value");
    j->p += n;
    return true;
}

static bool skip_value(ndm__json *j, int depth)
{
    if (depth > MAX_DEPTH)
        return fail(j, "values nested too deeply");
    ws(j);
    if (j->p >= j->end)
        return fail(j, "expected a value");
    size_t len;
    switch (*j->p) {
    case '"':
        j->p++;
        return string_body(j, NULL, &len);
    case '{':
        j->p++;
        if (ndm__json_take(j, '}'))
            return true;
        do {
            ws(j);
            if (j->p >= j->end || *j->p != '"')
                return fail(j, "expected a key");
            j->p++;
            if (!string_body(j, NULL, &len) || !ndm__json_expect(j, ':', "expected ':'") ||
                !skip_value(j, depth + 1))
                return false;
        } while (ndm__json_take(j, ','));
        return ndm__json_expect(j, '}', "expected ',' or '}'");
    case '[':
        j->p++;
        if (ndm__json_take(j, ']'))
            return true;
        do {
            if (!skip_value(j, depth + 1))
                return false;
        } while (ndm__json_take(j, ','));
        return ndm__json_expect(j, ']', "expected ',' or ']'");
    case 't':
        return word(j, "true");
    case 'f':
        return word(j, "false");
    case 'n':
        return word(j, "null");
    default:
        return skip_number(j);
    }
}

bool ndm__json_skip(ndm__json *j) { return skip_value(j, 0); }

bool ndm__utf8_valid(const char *str, size_t n)
{
    for (size_t i = 0, k; i < n; i += k)
        if (!(k = ndm__utf8_seq(str + i, n - i)))
            return false;
    return true;
}
