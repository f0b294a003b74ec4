/* ndm-text's corpus and vocabulary: the fortune files of the Debian
 * packages fortunes and fortunes-min, read as characters, split into
 * training and held-out fortunes. */
#ifndef NDM_TOOLS_TEXT_CORPUS_H
#define NDM_TOOLS_TEXT_CORPUS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The vocabulary: newline (id 0) and the printable ASCII characters ' '
 * to '~' (ids 1 to 95). */
#define TEXT_VOCAB 96

/* A character's id, or -1 for one outside the vocabulary. */
int text_char_id(unsigned char c);
/* The character of an id in [0, TEXT_VOCAB). */
char text_id_char(int id);

/* The corpus as ids. Each fortune ends with its separator line "%\n", as in
 * the files; every `every`-th fortune (in file-name order) is held out. */
typedef struct text_corpus {
    uint8_t *train, *val;
    size_t ntrain, nval;
    int64_t train_fortunes, val_fortunes;
    int files;
    /* the training characters' frequencies (add-one), and the held-out
     * characters' cross-entropy under them: the unigram baseline */
    double unigram_train_bits, unigram_val_bits;
} text_corpus;

/* Read every fortune file under dir (regular files, not the .dat indexes
 * nor the .u8 links). Characters outside the vocabulary are dropped (a tab
 * reads as a space; an overstrike "_\bx" as its last character). With
 * limit > 0, only the first `limit` training and limit / every held-out
 * characters are kept. Returns true, or false with the reason in why. */
bool text_corpus_read(const char *dir, int every, size_t limit, text_corpus *out, char *why,
                      size_t n);
void text_corpus_free(text_corpus *c);

/* Is s[0, len) well-formed UTF-8? When not, *bad is the offset of the
 * first byte that is not. */
bool text_utf8_valid(const unsigned char *s, size_t len, size_t *bad);

#endif
