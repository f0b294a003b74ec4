/* A small pull parser for the JSON headers of safetensors files: strings,
 * non-negative integers, and skipping any other value, with bounded depth. */
#ifndef NDM_IO_JSON_H
#define NDM_IO_JSON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct ndm__json {
    const char *start, *p, *end;
    char *pool;           /* decoded strings, NUL-terminated */
    size_t pool_used, pool_cap;
    char msg[192];        /* what went wrong, with the byte offset */
} ndm__json;

/* `pool` must hold at least n + 1 bytes: decoded strings are never longer
 * than their quoted form. */
void ndm__json_init(ndm__json *j, const char *text, size_t n, char *pool, size_t pool_cap);
/* Skip whitespace; then consume `c` if it is next. */
bool ndm__json_take(ndm__json *j, char c);
/* Skip whitespace; `c` must be next (records an error naming `what`). */
bool ndm__json_expect(ndm__json *j, char c, const char *what);
/* Is the rest only whitespace? */
bool ndm__json_at_end(ndm__json *j);
/* A string, decoded into the pool at *off (length *len). Strings holding
 * U+0000 are refused: names are C strings. */
bool ndm__json_string(ndm__json *j, size_t *off, size_t *len);
/* A non-negative integer without fraction or exponent. *overflow is set
 * (and true returned) when it does not fit in 64 bits. */
bool ndm__json_uint(ndm__json *j, uint64_t *v, bool *overflow);
/* Skip one value of any kind. */
bool ndm__json_skip(ndm__json *j);
/* Offset of the parse position, for messages. */
static inline size_t ndm__json_pos(const ndm__json *j) { return (size_t)(j->p - j->start); }

/* Is s[0..n) well-formed UTF-8 (no overlongs, surrogates or values past
 * U+10FFFF)? */
bool ndm__utf8_valid(const char *s, size_t n);

#endif
