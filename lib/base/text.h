/* Text that ndm writes for other programs: well-formed UTF-8 and JSON
 * string literals, whatever bytes a user's name holds. */
#ifndef NDM_BASE_TEXT_H
#define NDM_BASE_TEXT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

/* The length (1 to 4) of the well-formed UTF-8 sequence that starts s[0..n),
 * or 0 when s[0] starts none (a stray continuation byte, an overlong form,
 * a surrogate, a value past U+10FFFF, a sequence cut short). */
size_t ndm__utf8_seq(const char *s, size_t n);

/* Copy the C string s into buf[0..cap) as well-formed UTF-8, each byte that
 * starts no sequence replaced by U+FFFD; cut at a sequence boundary when
 * buf is short. Returns the length written (buf is NUL-terminated; cap > 0). */
size_t ndm__utf8_clean(const char *s, char *buf, size_t cap);

/* Copy the C string s into buf[0..cap) with each control byte (below 0x20,
 * and DEL) written as \xNN, so that a message naming a user's string stays
 * one line of text; cut at an escape's boundary when buf is short. Returns
 * the length written (buf is NUL-terminated; cap > 0). */
size_t ndm__escape_controls(const char *s, char *buf, size_t cap);

/* Writes byte c as the four characters \xNN at out (no NUL); returns 4. */
size_t ndm__hex_escape(unsigned char c, char *out);

/* Write the C string s to f as a JSON string literal: quotes, backslashes
 * and control characters escaped, bytes that start no UTF-8 sequence
 * written as \ufffd, so that the output is valid UTF-8 JSON. */
void ndm__json_write_str(FILE *f, const char *s);

/* A text that grows as it is written, NUL-terminated: start it zeroed and
 * free(p) when done. A growth that fails sets `oom`; the puts after it do
 * nothing, so a writer checks once at the end. */
typedef struct ndm__sbuf {
    char *p;
    size_t len, cap;
    bool oom;
} ndm__sbuf;

/* Appends s[0..n) to b. */
void ndm__sbuf_put(ndm__sbuf *b, const char *s, size_t n);

/* Appends the C string s to b. */
void ndm__sbuf_puts(ndm__sbuf *b, const char *s);

#endif
