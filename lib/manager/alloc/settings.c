/* Allocator settings: PyTorch's `key:value,key:value` grammar with optional
 * device prefixes, checked key by key, and printed back for summaries. */
#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "pool.h"

/* The segment presets. PyTorch's suits CUDA, where a cudaMalloc costs about
 * a millisecond; the compact one suits the CPU, where an mmap costs
 * microseconds: segments sized to the request and whole free segments
 * returned before the pool grows. */
static const ndm__segment_preset presets[] = {
    {"pytorch", (size_t)20 << 20, NDM__ROUND_LARGE, false, false},
    {"compact", (size_t)2 << 20, (size_t)512 << 10, true, true},
};

static void apply_preset(ndm__settings *s, const ndm__segment_preset *p)
{
    s->large_segment_size = p->large_segment_size;
    s->segment_round = p->segment_round;
    s->release_free_segments = p->release_free_segments;
    s->segment_refit = p->segment_refit;
}

void ndm__settings_default(ndm__settings *s, ndm_device dev)
{
    memset(s, 0, sizeof *s);
    s->policy = ndm__pool_policies[0];
    s->preallocate_fraction = 0.92;
    s->memory_limit = 0;
    s->max_split_size = SIZE_MAX;
    s->max_non_split_rounding = (size_t)20 << 20;
    s->gc_threshold = 0;
    s->pressure_every = 0;
    s->thread_cache = true;
    s->expandable = false;
    s->reserved_rate = 0.2;
    s->allocated_rate = 0.8;
    s->allocated_reserved_rate = 0.8;
    apply_preset(s, &presets[dev.type == NDM_DEVICE_CPU]);
}

/* ---- tokens: PyTorch's lexer splits on , : [ ] and drops spaces ------------ */

#define MAX_TOKENS 256
#define TOKEN_LEN 64

typedef struct lexer {
    char tok[MAX_TOKENS][TOKEN_LEN];
    int n;
} lexer;

static int lex(const char *s, lexer *lx, char *err, size_t n)
{
    lx->n = 0;
    char buf[TOKEN_LEN];
    size_t len = 0;
    for (;; s++) {
        char c = *s;
        bool sep = c == ',' || c == ':' || c == '[' || c == ']' || c == '\0';
        if (sep && len) {
            if (lx->n == MAX_TOKENS)
                goto too_many;
            buf[len] = '\0';
            memcpy(lx->tok[lx->n++], buf, len + 1);
            len = 0;
        }
        if (c == '\0')
            return 0;
        if (sep) {
            if (lx->n == MAX_TOKENS)
                goto too_many;
            lx->tok[lx->n][0] = c;
            lx->tok[lx->n++][1] = '\0';
        } else if (!isspace((unsigned char)c)) {
            if (len + 1 >= TOKEN_LEN) {
                buf[len] = '\0';
                snprintf(err, n, "token '%.20s...' is too long", buf);
                return -1;
            }
            buf[len++] = c;
        }
    }
too_many:
    snprintf(err, n, "more than %d tokens", MAX_TOKENS);
    return -1;
}

static bool is_sep(const lexer *lx, int i, char c)
{
    return i < lx->n && lx->tok[i][0] == c && lx->tok[i][1] == '\0';
}

static bool all_digits(const char *s)
{
    if (!*s)
        return false;
    for (; *s; s++)
        if (!isdigit((unsigned char)*s))
            return false;
    return true;
}

static bool parse_u64(const char *s, uint64_t *out)
{
    if (!all_digits(s))
        return false;
    errno = 0;
    unsigned long long v = strtoull(s, NULL, 10);
    if (errno)
        return false;
    *out = v;
    return true;
}

static bool parse_double(const char *s, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !isfinite(v))
        return false;
    *out = v;
    return true;
}

static bool pow2(uint64_t v) { return v && !(v & (v - 1)); }

static int log2_floor(uint64_t v)
{
    int l = -1;
    while (v) {
        v >>= 1;
        l++;
    }
    return l;
}

/* ---- keys ------------------------------------------------------------------ */

static const char *const known_keys[] = {
    "strategy",          "preallocate_fraction",      "memory_limit_mb",
    "max_split_size_mb", "max_non_split_rounding_mb", "large_segment_size_mb",
    "roundup_power2_divisions", "garbage_collection_threshold", "pressure_every_mb",
    "thread_cache",      "policy",                    "release_free_segments",
    "segment_refit",     "segment_round_kb",          "expandable_segments",
    "reserved_rate",     "allocated_rate",            "allocated_reserved_rate",
};
#define KNOWN_KEYS (sizeof known_keys / sizeof *known_keys)

/* Edits (insertions, deletions, substitutions, swaps of neighbours) from a
 * to b, ignoring case; keys are short (a token is under TOKEN_LEN). */
static size_t edit_distance(const char *a, const char *b)
{
    size_t n = strlen(a), m = strlen(b);
    if (n >= TOKEN_LEN || m >= TOKEN_LEN)
        return SIZE_MAX;
    size_t d[TOKEN_LEN][TOKEN_LEN];
    for (size_t i = 0; i <= n; i++)
        d[i][0] = i;
    for (size_t j = 0; j <= m; j++)
        d[0][j] = j;
    for (size_t i = 1; i <= n; i++)
        for (size_t j = 1; j <= m; j++) {
            int ca = tolower((unsigned char)a[i - 1]), cb = tolower((unsigned char)b[j - 1]);
            size_t best = d[i - 1][j - 1] + (ca != cb);
            if (d[i - 1][j] + 1 < best)
                best = d[i - 1][j] + 1;
            if (d[i][j - 1] + 1 < best)
                best = d[i][j - 1] + 1;
            if (i > 1 && j > 1 && ca == tolower((unsigned char)b[j - 2]) &&
                tolower((unsigned char)a[i - 2]) == cb && d[i - 2][j - 2] + 1 < best)
                best = d[i - 2][j - 2] + 1;
            d[i][j] = best;
        }
    return d[n][m];
}

/* The known key an unknown one most likely meant (a slip of a few letters,
 * or a known key's start: "memory_limit" for "memory_limit_mb"), or NULL. */
static const char *near_key(const char *key)
{
    const char *best = NULL;
    size_t best_d = SIZE_MAX, len = strlen(key);
    for (size_t k = 0; k < KNOWN_KEYS; k++) {
        size_t d = edit_distance(key, known_keys[k]);
        if (d < best_d) {
            best_d = d;
            best = known_keys[k];
        }
    }
    if (best && best_d <= 1 + len / 4)
        return best;
    for (size_t k = 0; len >= 4 && k < KNOWN_KEYS; k++)
        if (!strncmp(known_keys[k], key, len))
            return known_keys[k];
    return NULL;
}

typedef struct parser {
    const lexer *lx;
    int i;
    char *err;
    size_t n;
} parser;

static int fail(parser *ps, const char *fmt, ...) NDM_PRINTF(2, 3);
static int fail(parser *ps, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(ps->err, ps->n, fmt, ap);
    va_end(ap);
    return -1;
}

/* The value token after "key:". */
static const char *value_of(parser *ps, const char *key)
{
    if (!is_sep(ps->lx, ps->i, ':')) {
        fail(ps, "expected ':' after '%s'", key);
        return NULL;
    }
    ps->i++;
    const char *t = ps->i < ps->lx->n ? ps->lx->tok[ps->i] : NULL;
    if (!t || (t[1] == '\0' && strchr(",:[]", t[0]))) {
        fail(ps, "%s: missing value", key);
        return NULL;
    }
    return ps->lx->tok[ps->i++];
}

/* The value after "key:" read as a number into *d: its token, or NULL with
 * the reason. */
static const char *number_value(parser *ps, const char *key, double *d)
{
    const char *v = value_of(ps, key);
    if (v && !parse_double(v, d)) {
        fail(ps, "%s: '%s' is not a number", key, v);
        return NULL;
    }
    return v;
}

static int mb_value(parser *ps, const char *key, size_t min_mb, size_t *out, bool zero_ok)
{
    const char *v = value_of(ps, key);
    uint64_t mb;
    if (!v)
        return -1;
    if (!parse_u64(v, &mb))
        return fail(ps, "%s: '%s' is not a whole number of MiB", key, v);
    if (mb == 0 && zero_ok) {
        *out = 0;
        return 0;
    }
    if (mb < min_mb)
        return fail(ps, "%s must be at least %zu (got %" PRIu64 ")", key, min_mb, mb);
    if (mb > SIZE_MAX / NDM__MB)
        return fail(ps, "%s: %" PRIu64 " MiB is too large", key, mb);
    *out = (size_t)mb * NDM__MB;
    return 0;
}

/* The largest division count a table entry holds (an unsigned); the
 * rounding step bottoms out at one byte well before it. */
#define MAX_DIVISIONS (1u << 31)
/* A large segment serves requests of 1 to 10 MiB; a bigger one than this
 * would make every large request ask the device for an unreasonable block. */
#define MAX_LARGE_SEGMENT_MB 1024

static int divisions_value(parser *ps, ndm__settings *s)
{
    const char *key = "roundup_power2_divisions";
    if (!is_sep(ps->lx, ps->i, ':'))
        return fail(ps, "expected ':' after '%s'", key);
    ps->i++;
    const lexer *lx = ps->lx;
    if (!is_sep(lx, ps->i, '[')) {
        if (ps->i >= lx->n || (lx->tok[ps->i][1] == '\0' && strchr(",:]", lx->tok[ps->i][0])))
            return fail(ps, "%s: missing value", key);
        const char *v = lx->tok[ps->i++];
        uint64_t d;
        if (!parse_u64(v, &d) || !pow2(d))
            return fail(ps, "%s: '%s' is not a power of two", key, v);
        if (d > MAX_DIVISIONS)
            return fail(ps, "%s: %" PRIu64 " is above the largest, %u", key, d, MAX_DIVISIONS);
        for (int k = 0; k < NDM__DIV_INTERVALS; k++)
            s->divisions[k] = (unsigned)d;
        return 0;
    }
    /* [K:v,...,>:v]: K MiB (a power of two) bounds from above the sizes that
     * use v divisions, starting where the previous key stopped. */
    ps->i++;
    unsigned table[NDM__DIV_INTERVALS];
    memcpy(table, s->divisions, sizeof table);
    int from = 0;
    bool rest = false;
    for (;;) {
        if (ps->i >= lx->n)
            return fail(ps, "%s: missing ']'", key);
        if (is_sep(lx, ps->i, ']')) {
            ps->i++;
            break;
        }
        if (rest)
            return fail(ps, "%s: '>' must be the last entry", key);
        const char *k = lx->tok[ps->i++];
        if (!is_sep(lx, ps->i, ':'))
            return fail(ps, "%s: expected ':' after '%s'", key, k);
        ps->i++;
        if (ps->i >= lx->n)
            return fail(ps, "%s: missing value after '%s:'", key, k);
        const char *v = lx->tok[ps->i++];
        uint64_t d;
        if (!parse_u64(v, &d) || (d && !pow2(d)))
            return fail(ps, "%s: divisions '%s' must be a power of two or 0", key, v);
        if (d > MAX_DIVISIONS)
            return fail(ps, "%s: %" PRIu64 " is above the largest, %u", key, d, MAX_DIVISIONS);
        int to;
        if (!strcmp(k, ">")) {
            to = NDM__DIV_INTERVALS;
            rest = true;
        } else {
            uint64_t mb;
            if (!parse_u64(k, &mb) || !pow2(mb))
                return fail(ps, "%s: interval '%s' must be a power of two (MiB)", key, k);
            to = log2_floor(mb);
            if (to > NDM__DIV_INTERVALS)
                to = NDM__DIV_INTERVALS;
            if (to < from)
                return fail(ps, "%s: intervals must increase ('%s' after a larger one)", key, k);
        }
        for (int x = from; x < to; x++)
            table[x] = (unsigned)d;
        from = to;
        if (is_sep(lx, ps->i, ','))
            ps->i++;
        else if (ps->i >= lx->n)
            return fail(ps, "%s: missing ']'", key);
        else if (!is_sep(lx, ps->i, ']'))
            return fail(ps, "%s: expected ',' or ']' after '%s'", key, v);
    }
    memcpy(s->divisions, table, sizeof table);
    return 0;
}

static int bool_value(parser *ps, const char *key, bool *out)
{
    const char *v = value_of(ps, key);
    if (!v)
        return -1;
    if (!strcmp(v, "True") || !strcmp(v, "true") || !strcmp(v, "1"))
        *out = true;
    else if (!strcmp(v, "False") || !strcmp(v, "false") || !strcmp(v, "0"))
        *out = false;
    else
        return fail(ps, "%s: expected True or False, got '%s'", key, v);
    return 0;
}

static int apply_key(parser *ps, const char *key, ndm__settings *s)
{
    if (!strcmp(key, "strategy")) {
        const char *v = value_of(ps, key);
        if (!v)
            return -1;
        char names[128] = "";
        size_t len = 0;
        for (int i = 0; ndm__pool_policies[i]; i++) {
            if (!strcmp(v, ndm__pool_policies[i]->name)) {
                s->policy = ndm__pool_policies[i];
                return 0;
            }
            len += (size_t)snprintf(names + len, len < sizeof names ? sizeof names - len : 0,
                                    "%s%s", i ? ", " : "", ndm__pool_policies[i]->name);
        }
        return fail(ps, "strategy: '%s' is not one of %s", v, names);
    }
    if (!strcmp(key, "preallocate_fraction") || !strcmp(key, "garbage_collection_threshold")) {
        bool prealloc = key[0] == 'p';
        double d;
        const char *v = number_value(ps, key, &d);
        if (!v)
            return -1;
        if (prealloc ? !(d > 0 && d <= 1) : !(d > 0 && d < 1))
            return fail(ps, "%s must be in %s (got %s)", key, prealloc ? "(0, 1]" : "(0, 1)", v);
        if (prealloc)
            s->preallocate_fraction = d;
        else
            s->gc_threshold = d;
        return 0;
    }
    if (!strcmp(key, "reserved_rate") || !strcmp(key, "allocated_rate") ||
        !strcmp(key, "allocated_reserved_rate")) {
        double d;
        const char *v = number_value(ps, key, &d);
        if (!v)
            return -1;
        if (!(d >= 0 && d <= 1))
            return fail(ps, "%s must be in [0, 1] (got %s)", key, v);
        *(key[0] == 'r'                 ? &s->reserved_rate
          : !strcmp(key, "allocated_rate") ? &s->allocated_rate
                                          : &s->allocated_reserved_rate) = d;
        return 0;
    }
    if (!strcmp(key, "expandable_segments"))
        return bool_value(ps, key, &s->expandable);
    if (!strcmp(key, "memory_limit_mb")) {
        /* Below one small-pool segment, every allocation would fail, each
         * with a message about its own size rather than this limit. */
        size_t v = 0;
        if (mb_value(ps, key, 0, &v, true) < 0)
            return -1;
        if (v && v < NDM__SMALL_BUFFER)
            return fail(ps,
                        "memory_limit_mb must be 0 (no limit) or at least %zu (got %zu): the "
                        "allocator reserves memory in segments of %zu MiB or more, so a smaller "
                        "limit would refuse every allocation",
                        NDM__SMALL_BUFFER / NDM__MB, v / NDM__MB, NDM__SMALL_BUFFER / NDM__MB);
        s->memory_limit = v;
        return 0;
    }
    if (!strcmp(key, "pressure_every_mb"))
        return mb_value(ps, key, 0, &s->pressure_every, true);
    if (!strcmp(key, "max_split_size_mb"))
        return mb_value(ps, key, 20, &s->max_split_size, false);
    if (!strcmp(key, "max_non_split_rounding_mb"))
        return mb_value(ps, key, 20, &s->max_non_split_rounding, false);
    if (!strcmp(key, "large_segment_size_mb")) {
        size_t v = 0;
        if (mb_value(ps, key, 2, &v, false) < 0)
            return -1;
        if (v > (size_t)MAX_LARGE_SEGMENT_MB * NDM__MB)
            return fail(ps, "%s must be at most %d (got %zu)", key, MAX_LARGE_SEGMENT_MB,
                        v / NDM__MB);
        s->large_segment_size = v;
        return 0;
    }
    if (!strcmp(key, "roundup_power2_divisions"))
        return divisions_value(ps, s);
    if (!strcmp(key, "thread_cache"))
        return bool_value(ps, key, &s->thread_cache);
    if (!strcmp(key, "release_free_segments"))
        return bool_value(ps, key, &s->release_free_segments);
    if (!strcmp(key, "segment_refit"))
        return bool_value(ps, key, &s->segment_refit);
    if (!strcmp(key, "segment_round_kb")) {
        const char *v = value_of(ps, key);
        uint64_t kb;
        if (!v)
            return -1;
        if (!parse_u64(v, &kb) || !pow2(kb) || kb < 512 || kb > 2048)
            return fail(ps, "segment_round_kb must be 512, 1024 or 2048 (got '%s')", v);
        s->segment_round = (size_t)kb << 10;
        return 0;
    }
    if (!strcmp(key, "policy")) {
        const char *v = value_of(ps, key);
        if (!v)
            return -1;
        for (size_t i = 0; i < sizeof presets / sizeof *presets; i++) {
            if (!strcmp(v, presets[i].name)) {
                apply_preset(s, &presets[i]);
                return 0;
            }
        }
        return fail(ps, "policy: '%s' is not one of pytorch, compact", v);
    }
    char list[512];
    size_t len = 0;
    for (size_t k = 0; k < KNOWN_KEYS; k++)
        len += (size_t)snprintf(list + len, len < sizeof list ? sizeof list - len : 0, "%s%s",
                                k ? ", " : "", known_keys[k]);
    const char *near = near_key(key);
    if (near)
        return fail(ps, "unknown key '%s' (did you mean '%s'? known keys: %s)", key, near, list);
    return fail(ps, "unknown key '%s' (known keys: %s)", key, list);
}

ndm_status ndm__settings_parse(const char *conf, ndm_device dev, ndm__settings *out, char *err,
                               size_t n)
{
    ndm__settings s;
    ndm__settings_default(&s, dev);
    if (!conf || !*conf) {
        *out = s;
        return NDM_OK;
    }
    lexer *lx = malloc(sizeof *lx);
    if (!lx) {
        snprintf(err, n, "no memory to parse the settings");
        return NDM_E_OOM;
    }
    int rc = lex(conf, lx, err, n);
    parser ps = {lx, 0, err, n};
    while (rc == 0 && ps.i < lx->n) {
        if (is_sep(lx, ps.i, ',')) { /* empty item */
            ps.i++;
            continue;
        }
        /* [cpu: | cuda: | cuda:N:] key:value */
        bool mine = true;
        const char *t = lx->tok[ps.i];
        if (!strcmp(t, "cpu") || !strcmp(t, "cuda")) {
            bool cuda = t[1] == 'u';
            ps.i++;
            if (!is_sep(lx, ps.i, ':')) {
                rc = fail(&ps, "expected ':' after device '%s'", t);
                break;
            }
            ps.i++;
            int index = -1;
            if (cuda && ps.i < lx->n && all_digits(lx->tok[ps.i])) {
                index = atoi(lx->tok[ps.i]);
                ps.i++;
                if (!is_sep(lx, ps.i, ':')) {
                    rc = fail(&ps, "expected ':' after device 'cuda:%d'", index);
                    break;
                }
                ps.i++;
            }
            mine = cuda ? dev.type == NDM_DEVICE_CUDA && (index < 0 || index == dev.index)
                        : dev.type == NDM_DEVICE_CPU;
            if (ps.i >= lx->n) {
                rc = fail(&ps, "a key must follow the device prefix '%s:'", t);
                break;
            }
        }
        const char *key = lx->tok[ps.i++];
        if (key[1] == '\0' && strchr(",:[]", key[0])) {
            rc = fail(&ps, "expected a key, found '%s'", key);
            break;
        }
        ndm__settings scratch = s;
        rc = apply_key(&ps, key, mine ? &s : &scratch);
        if (rc)
            break;
        if (ps.i < lx->n && !is_sep(lx, ps.i, ',')) {
            rc = fail(&ps, "%s: expected ',' after its value, found '%s'", key, lx->tok[ps.i]);
            break;
        }
    }
    free(lx);
    if (rc)
        return NDM_E_CONFIG;
    *out = s;
    return NDM_OK;
}

/* ---- printing ------------------------------------------------------------- */

int ndm__divisions_str(const unsigned *d, char *buf, size_t n)
{
    bool same = true;
    for (int k = 1; k < NDM__DIV_INTERVALS; k++)
        same &= d[k] == d[0];
    if (same)
        return snprintf(buf, n, "%u", d[0]);
    size_t len = (size_t)snprintf(buf, n, "[");
    for (int k = 0; k < NDM__DIV_INTERVALS;) {
        int e = k;
        while (e + 1 < NDM__DIV_INTERVALS && d[e + 1] == d[k])
            e++;
        char item[32];
        if (e == NDM__DIV_INTERVALS - 1)
            snprintf(item, sizeof item, "%s>:%u", k ? "," : "", d[k]);
        else
            snprintf(item, sizeof item, "%s%llu:%u", k ? "," : "", 1ull << (e + 1), d[k]);
        len += (size_t)snprintf(len < n ? buf + len : NULL, len < n ? n - len : 0, "%s", item);
        k = e + 1;
    }
    len += (size_t)snprintf(len < n ? buf + len : NULL, len < n ? n - len : 0, "]");
    return (int)len;
}

int ndm__settings_str(const ndm__settings *s, char *buf, size_t n)
{
    char split[32], div[160];
    if (s->max_split_size == SIZE_MAX)
        snprintf(split, sizeof split, "unlimited");
    else
        snprintf(split, sizeof split, "%zu", s->max_split_size / NDM__MB);
    ndm__divisions_str(s->divisions, div, sizeof div);
    return snprintf(buf, n,
                    "strategy:%s,preallocate_fraction:%g,memory_limit_mb:%zu,"
                    "max_split_size_mb:%s,max_non_split_rounding_mb:%zu,"
                    "large_segment_size_mb:%zu,roundup_power2_divisions:%s,"
                    "garbage_collection_threshold:%g,pressure_every_mb:%zu,thread_cache:%s,"
                    "release_free_segments:%s,segment_refit:%s,segment_round_kb:%zu,"
                    "expandable_segments:%s,reserved_rate:%g,allocated_rate:%g,"
                    "allocated_reserved_rate:%g",
                    s->policy->name, s->preallocate_fraction,
                    s->memory_limit / NDM__MB, split, s->max_non_split_rounding / NDM__MB,
                    s->large_segment_size / NDM__MB, div, s->gc_threshold,
                    s->pressure_every / NDM__MB, s->thread_cache ? "True" : "False",
                    s->release_free_segments ? "True" : "False",
                    s->segment_refit ? "True" : "False", s->segment_round >> 10,
                    s->expandable ? "True" : "False", s->reserved_rate, s->allocated_rate,
                    s->allocated_reserved_rate);
}
