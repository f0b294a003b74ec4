/* Well-formed UTF-8, JSON string literals and escaped messages for what
 * ndm writes (dumps, snapshots, errors): names come from users and may hold
 * any byte. */
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "text.h"

size_t ndm__utf8_seq(const char *str, size_t n)
{
    const unsigned char *s = (const unsigned char *)str;
    if (!n)
        return 0;
    unsigned c = s[0];
    if (c < 0x80)
        return 1;
    size_t k;
    unsigned cp;
    if (c >= 0xC2 && c <= 0xDF) {
        k = 1;
        cp = c & 0x1F;
    } else if (c >= 0xE0 && c <= 0xEF) {
        k = 2;
        cp = c & 0x0F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        k = 3;
        cp = c & 0x07;
    } else {
        return 0;
    }
    if (n <= k)
        return 0;
    for (size_t t = 1; t <= k; t++) {
        if ((s[t] & 0xC0) != 0x80)
            return 0;
        cp = cp << 6 | (s[t] & 0x3F);
    }
    if ((k == 2 && cp < 0x800) || (k == 3 && (cp < 0x10000 || cp > 0x10FFFF)) ||
        (cp >= 0xD800 && cp <= 0xDFFF))
        return 0;
    return k + 1;
}

static const char replacement[] = "\xEF\xBF\xBD"; /* U+FFFD */

size_t ndm__utf8_clean(const char *s, char *buf, size_t cap)
{
    size_t n = strlen(s), o = 0;
    for (size_t i = 0; i < n;) {
        size_t k = ndm__utf8_seq(s + i, n - i);
        const char *from = k ? s + i : replacement;
        size_t len = k ? k : 3;
        if (o + len >= cap)
            break;
        memcpy(buf + o, from, len);
        o += len;
        i += k ? k : 1;
    }
    buf[o] = '\0';
    return o;
}

size_t ndm__hex_escape(unsigned char c, char *out)
{
    static const char hex[] = "0123456789abcdef";
    out[0] = '\\';
    out[1] = 'x';
    out[2] = hex[c >> 4];
    out[3] = hex[c & 15];
    return 4;
}

size_t ndm__escape_controls(const char *s, char *buf, size_t cap)
{
    size_t o = 0;
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        bool ctl = c < 0x20 || c == 0x7f;
        if (o + (ctl ? 4 : 1) >= cap)
            break;
        if (ctl)
            o += ndm__hex_escape(c, buf + o);
        else
            buf[o++] = (char)c;
    }
    buf[o] = '\0';
    return o;
}

void ndm__json_write_str(FILE *f, const char *s)
{
    size_t n = strlen(s);
    fputc('"', f);
    for (size_t i = 0; i < n;) {
        unsigned char c = (unsigned char)s[i];
        size_t k = ndm__utf8_seq(s + i, n - i);
        if (!k) {
            fputs("\\ufffd", f);
            i++;
        } else if (c == '"' || c == '\\') {
            fprintf(f, "\\%c", c);
            i++;
        } else if (c < 0x20 || c == 0x7f) {
            fprintf(f, "\\u%04x", c);
            i++;
        } else {
            fwrite(s + i, 1, k, f);
            i += k;
        }
    }
    fputc('"', f);
}

void ndm__sbuf_put(ndm__sbuf *b, const char *s, size_t n)
{
    if (b->oom)
        return;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n + 1)
            cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) {
            b->oom = true;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
}

void ndm__sbuf_puts(ndm__sbuf *b, const char *s) { ndm__sbuf_put(b, s, strlen(s)); }
