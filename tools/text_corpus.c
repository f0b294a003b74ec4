/* ndm-text's corpus: fortune files read as characters of the vocabulary,
 * one fortune in `every` held out, and the unigram baseline. */
#include "text_corpus.h"

#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int text_char_id(unsigned char c)
{
    if (c == '\n')
        return 0;
    return c >= ' ' && c <= '~' ? c - ' ' + 1 : -1;
}

char text_id_char(int id)
{
    return id == 0 ? '\n' : (char)(' ' + id - 1);
}

/* A growing byte buffer. */
typedef struct buf {
    uint8_t *p;
    size_t n, cap;
} buf;

static bool put(buf *b, const uint8_t *s, size_t n)
{
    if (b->n + n > b->cap) {
        size_t cap = b->cap ? b->cap : 1 << 16;
        while (cap < b->n + n)
            cap *= 2;
        uint8_t *p = realloc(b->p, cap);
        if (!p)
            return false;
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    return true;
}

static int by_name(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static bool ends_with(const char *s, const char *tail)
{
    size_t n = strlen(s), k = strlen(tail);
    return n >= k && !strcmp(s + n - k, tail);
}

/* The fortune files of dir, sorted; NULL when dir cannot be read. */
static char **list_files(const char *dir, int *count)
{
    DIR *d = opendir(dir);
    if (!d)
        return NULL;
    char **names = NULL;
    int n = 0, cap = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        char path[4096];
        struct stat st;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        if (e->d_name[0] == '.' || ends_with(e->d_name, ".dat") || ends_with(e->d_name, ".u8") ||
            lstat(path, &st) != 0 || !S_ISREG(st.st_mode))
            continue;
        if (n == cap) {
            cap = cap ? 2 * cap : 64;
            char **p = realloc(names, (size_t)cap * sizeof *p);
            if (!p)
                break;
            names = p;
        }
        names[n] = strdup(e->d_name);
        if (names[n])
            n++;
    }
    closedir(d);
    if (!names)
        names = calloc(1, sizeof *names);
    qsort(names, (size_t)n, sizeof *names, by_name);
    *count = n;
    return names;
}

/* One file's text as vocabulary ids, cleaned (see the header). */
static bool clean(FILE *f, buf *out)
{
    int c;
    while ((c = getc(f)) != EOF) {
        if (c == '\b') {
            if (out->n)
                out->n--; /* an overstrike keeps its last character */
            continue;
        }
        if (c == '\t')
            c = ' ';
        int id = text_char_id((unsigned char)c);
        uint8_t v = (uint8_t)id;
        if (id >= 0 && !put(out, &v, 1))
            return false;
    }
    return true;
}

bool text_corpus_read(const char *dir, int every, size_t limit, text_corpus *out, char *why,
                      size_t n)
{
    memset(out, 0, sizeof *out);
    int nfiles = 0;
    char **names = list_files(dir, &nfiles);
    if (!names || nfiles == 0) {
        snprintf(why, n, "no fortune files in %s", dir);
        free(names);
        return false;
    }
    buf tr = {0}, va = {0}, text = {0};
    int64_t fortune = 0;
    bool ok = true;
    const uint8_t sep_id = (uint8_t)text_char_id('%'), nl = 0;
    for (int i = 0; i < nfiles && ok; i++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        FILE *f = fopen(path, "rb");
        text.n = 0;
        if (!f || !clean(f, &text)) {
            snprintf(why, n, "cannot read %s", path);
            ok = false;
        }
        if (f)
            fclose(f);
        /* fortunes end at a line "%"; the last one of a file may not */
        size_t start = 0;
        for (size_t k = 0; ok && k <= text.n; k++) {
            bool at_sep = k + 1 < text.n && text.p[k] == sep_id && text.p[k + 1] == nl &&
                          (k == 0 || text.p[k - 1] == nl);
            if (!at_sep && k < text.n)
                continue;
            if (k > start) {
                buf *to = fortune % every == every - 1 ? &va : &tr;
                if (to == &va)
                    out->val_fortunes++;
                else
                    out->train_fortunes++;
                fortune++;
                uint8_t end[2] = {sep_id, nl};
                ok = put(to, text.p + start, k - start) && put(to, end, 2);
            }
            start = k + 2;
            k++;
        }
        out->files++;
    }
    for (int i = 0; i < nfiles; i++)
        free(names[i]);
    free(names);
    free(text.p);
    if (!ok || !tr.n || !va.n) {
        if (ok)
            snprintf(why, n, "the fortune files in %s hold too little text", dir);
        free(tr.p);
        free(va.p);
        return false;
    }
    if (limit > 0) {
        tr.n = tr.n < limit ? tr.n : limit;
        size_t vl = limit / (size_t)every > 1024 ? limit / (size_t)every : 1024;
        va.n = va.n < vl ? va.n : vl;
    }
    out->train = tr.p;
    out->ntrain = tr.n;
    out->val = va.p;
    out->nval = va.n;
    double count[TEXT_VOCAB], total = 0;
    for (int v = 0; v < TEXT_VOCAB; v++)
        count[v] = 1;
    for (size_t k = 0; k < tr.n; k++)
        count[tr.p[k]]++;
    for (int v = 0; v < TEXT_VOCAB; v++)
        total += count[v];
    double htr = 0, hva = 0;
    for (int v = 0; v < TEXT_VOCAB; v++)
        htr -= count[v] / total * log2(count[v] / total);
    for (size_t k = 0; k < va.n; k++)
        hva -= log2(count[va.p[k]] / total);
    out->unigram_train_bits = htr;
    out->unigram_val_bits = hva / (double)va.n;
    return true;
}

void text_corpus_free(text_corpus *c)
{
    free(c->train);
    free(c->val);
    memset(c, 0, sizeof *c);
}

bool text_utf8_valid(const unsigned char *s, size_t len, size_t *bad)
{
    size_t i = 0;
    while (i < len) {
        unsigned char c = s[i];
        size_t k = c < 0x80 ? 0 : (c & 0xe0) == 0xc0 ? 1 : (c & 0xf0) == 0xe0 ? 2
                             : (c & 0xf8) == 0xf0 ? 3 : 4;
        bool ok = k < 4 && i + k < len && !(k == 1 && c < 0xc2) && !(c > 0xf4);
        uint32_t cp = k == 0 ? c : (uint32_t)(c & (0x3f >> k));
        for (size_t j = 1; ok && j <= k; j++) {
            ok = (s[i + j] & 0xc0) == 0x80;
            cp = cp << 6 | (s[i + j] & 0x3f);
        }
        /* no overlong forms, no surrogates, nothing past U+10FFFF */
        if (ok && ((k == 2 && cp < 0x800) || (k == 3 && cp < 0x10000) ||
                   (cp >= 0xd800 && cp <= 0xdfff) || cp > 0x10ffff))
            ok = false;
        if (!ok) {
            *bad = i;
            return false;
        }
        i += k + 1;
    }
    return true;
}
