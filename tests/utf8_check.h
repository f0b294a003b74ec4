/* A strict UTF-8 check for what ndm writes for other programs (JSON,
 * pickles): tests assert that a document is valid text. */
#ifndef NDM_TEST_UTF8_CHECK_H
#define NDM_TEST_UTF8_CHECK_H

#include <stdbool.h>

/* Is s well-formed UTF-8 (no stray, overlong, surrogate or cut sequences)? */
static inline bool test_utf8_valid(const char *str)
{
    const unsigned char *s = (const unsigned char *)str;
    while (*s) {
        unsigned c = *s, cp, k;
        if (c < 0x80) {
            s++;
            continue;
        }
        if (c >= 0xC2 && c <= 0xDF)
            k = 1, cp = c & 0x1F;
        else if (c >= 0xE0 && c <= 0xEF)
            k = 2, cp = c & 0x0F;
        else if (c >= 0xF0 && c <= 0xF4)
            k = 3, cp = c & 0x07;
        else
            return false;
        for (unsigned t = 1; t <= k; t++) {
            if ((s[t] & 0xC0) != 0x80)
                return false;
            cp = cp << 6 | (s[t] & 0x3F);
        }
        if ((k == 2 && cp < 0x800) || (k == 3 && (cp < 0x10000 || cp > 0x10FFFF)) ||
            (cp >= 0xD800 && cp <= 0xDFFF))
            return false;
        s += k + 1;
    }
    return true;
}

#endif
