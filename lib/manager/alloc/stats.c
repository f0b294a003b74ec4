/* Allocator statistics as PyTorch names and prints them: flattened keys
 * ("allocated_bytes.all.current") and the memory_summary table. */
#include <inttypes.h>
#include <string.h>

#include "pool.h"

typedef struct group {
    const char *key;      /* PyTorch's key */
    const char *title;    /* summary row */
    size_t offset;        /* of the [NDM_POOL_COUNT] array in ndm_memory_stats */
    bool bytes;
} group;

#define G(k, t, b) {#k, t, offsetof(ndm_memory_stats, k), b}
static const group groups[] = {
    G(allocated_bytes, "Allocated memory", true),
    G(active_bytes, "Active memory", true),
    G(requested_bytes, "Requested memory", true),
    G(reserved_bytes, "Reserved memory", true),
    G(inactive_split_bytes, "Non-releasable memory", true),
    G(allocation, "Allocations", false),
    G(active, "Active allocs", false),
    G(segment, "Reserved segments", false),
    G(inactive_split, "Non-releasable allocs", false),
};
#undef G

static const char *const pool_keys[NDM_POOL_COUNT] = {"all", "small_pool", "large_pool"};

static bool metric(const ndm_memory_stat *s, const char *m, int64_t *out)
{
    if (!strcmp(m, "current"))
        *out = s->current;
    else if (!strcmp(m, "peak"))
        *out = s->peak;
    else if (!strcmp(m, "allocated"))
        *out = s->allocated;
    else if (!strcmp(m, "freed"))
        *out = s->freed;
    else
        return false;
    return true;
}

bool ndm__stats_key(const ndm_memory_stats *st, const char *key, int64_t *out)
{
    for (size_t g = 0; g < sizeof groups / sizeof *groups; g++) {
        size_t len = strlen(groups[g].key);
        if (strncmp(key, groups[g].key, len) || key[len] != '.')
            continue;
        const char *rest = key + len + 1;
        const ndm_memory_stat *arr =
            (const ndm_memory_stat *)((const char *)st + groups[g].offset);
        for (int k = 0; k < NDM_POOL_COUNT; k++) {
            size_t pl = strlen(pool_keys[k]);
            if (!strncmp(rest, pool_keys[k], pl) && rest[pl] == '.')
                return metric(&arr[k], rest + pl + 1, out);
        }
        return false;
    }
    static const struct {
        const char *key;
        size_t offset;
    } single[] = {
        {"oversize_allocations.", offsetof(ndm_memory_stats, oversize_allocations)},
        {"oversize_segments.", offsetof(ndm_memory_stats, oversize_segments)},
    };
    for (size_t i = 0; i < 2; i++) {
        size_t len = strlen(single[i].key);
        if (!strncmp(key, single[i].key, len))
            return metric((const ndm_memory_stat *)((const char *)st + single[i].offset),
                          key + len, out);
    }
    static const struct {
        const char *key;
        size_t offset;
    } scalars[] = {
        {"num_alloc_retries", offsetof(ndm_memory_stats, num_alloc_retries)},
        {"num_ooms", offsetof(ndm_memory_stats, num_ooms)},
        {"num_sync_all_streams", offsetof(ndm_memory_stats, num_sync_all_streams)},
        {"num_device_alloc", offsetof(ndm_memory_stats, num_device_alloc)},
        {"num_device_free", offsetof(ndm_memory_stats, num_device_free)},
        {"num_pressure_calls", offsetof(ndm_memory_stats, num_pressure_calls)},
        {"num_thread_cache_allocs", offsetof(ndm_memory_stats, num_thread_cache_allocs)},
        {"max_split_size", offsetof(ndm_memory_stats, max_split_size)},
        {"memory_limit", offsetof(ndm_memory_stats, memory_limit)},
        {"largest_free_block", offsetof(ndm_memory_stats, largest_free_block)},
        {"free_bytes", offsetof(ndm_memory_stats, free_bytes)},
        {"device_free", offsetof(ndm_memory_stats, device_free)},
        {"device_total", offsetof(ndm_memory_stats, device_total)},
    };
    for (size_t i = 0; i < sizeof scalars / sizeof *scalars; i++) {
        if (!strcmp(key, scalars[i].key)) {
            *out = *(const int64_t *)((const char *)st + scalars[i].offset);
            return true;
        }
    }
    return false;
}

/* ---- the summary table (PyTorch's layout: 75 columns between the bars) ------ */

#define WIDTH 75

/* A size cell: the unit follows the column's "all" value, stepping up while
 * it is at least 768 of the next unit. */
static void size_cell(char *buf, size_t n, int64_t v, int64_t pref)
{
    static const char *const units[] = {"B  ", "KiB", "MiB", "GiB", "TiB", "PiB"};
    int u = 0;
    double p = (double)pref;
    while (u < 5 && p >= 768.0 * 1024.0) {
        v /= 1024;
        p /= 1024.0;
        u++;
    }
    snprintf(buf, n, "%6" PRId64 " %s", v, units[u]);
}

static void count_cell(char *buf, size_t n, int64_t v, int64_t pref)
{
    static const char *const units[] = {" ", "K", "M"};
    int u = 0;
    double p = (double)pref;
    while (u < 2 && p >= 750000.0) {
        v /= 1000;
        p /= 1000.0;
        u++;
    }
    snprintf(buf, n, "%7" PRId64 " %s ", v, units[u]);
}

static void rule(FILE *f, char c)
{
    fputc('|', f);
    for (int i = 0; i < WIDTH; i++)
        fputc(c, f);
    fputs("|\n", f);
}

static void row(FILE *f, const char *name, const ndm_memory_stat *s, const ndm_memory_stat *pref,
                bool bytes)
{
    char c[4][32];
    int64_t v[4] = {s->current, s->peak, s->allocated, s->freed};
    int64_t p[4] = {pref->current, pref->peak, pref->allocated, pref->freed};
    for (int i = 0; i < 4; i++) {
        if (bytes)
            size_cell(c[i], sizeof c[i], v[i], p[i]);
        else
            count_cell(c[i], sizeof c[i], v[i], p[i]);
    }
    fprintf(f, "| %-21s | %s | %s | %s | %s |\n", name, c[0], c[1], c[2], c[3]);
}

static void centered(FILE *f, const char *text)
{
    int len = (int)strlen(text);
    int left = (WIDTH - len) / 2;
    if (left < 0)
        left = 0;
    fprintf(f, "|%*s%s%*s|\n", left, "", text, WIDTH - left - len > 0 ? WIDTH - left - len : 0, "");
}

void ndm__pool_summary(ndm__pool *p, FILE *f)
{
    ndm_memory_stats st;
    ndm__pool_stats(p, &st);
    char title[64], line[160];
    snprintf(title, sizeof title, "ndm memory summary, device %s", p->name);
    rule(f, '=');
    centered(f, title);
    rule(f, '-');
    snprintf(line, sizeof line, "OOMs: %-12" PRId64 " |  device alloc retries: %-8" PRId64,
             st.num_ooms, st.num_alloc_retries);
    centered(f, line);
    rule(f, '=');
    fprintf(f, "|        Metric         | Cur Usage  | Peak Usage | Tot Alloc  | Tot Freed  |\n");
    for (size_t g = 0; g < sizeof groups / sizeof *groups; g++) {
        const ndm_memory_stat *arr =
            (const ndm_memory_stat *)((const char *)&st + groups[g].offset);
        rule(f, '-');
        row(f, groups[g].title, &arr[NDM_POOL_ALL], &arr[NDM_POOL_ALL], groups[g].bytes);
        row(f, "      from large pool", &arr[NDM_POOL_LARGE], &arr[NDM_POOL_ALL], groups[g].bytes);
        row(f, "      from small pool", &arr[NDM_POOL_SMALL], &arr[NDM_POOL_ALL], groups[g].bytes);
    }
    rule(f, '-');
    row(f, "Oversize allocations", &st.oversize_allocations, &st.oversize_allocations, false);
    rule(f, '-');
    row(f, "Oversize segments", &st.oversize_segments, &st.oversize_segments, false);
    rule(f, '=');
    char a[32], b[32], lim[32];
    fprintf(f,
            "Fragmentation: %s free in the cache, largest free block %s, "
            "(free - largest) / free = %.3f\n",
            ndm__fmt_size((size_t)st.free_bytes, a, sizeof a),
            ndm__fmt_size((size_t)st.largest_free_block, b, sizeof b), st.fragmentation);
    if (st.memory_limit)
        ndm__fmt_size((size_t)st.memory_limit, lim, sizeof lim);
    else
        snprintf(lim, sizeof lim, "none");
    fprintf(f, "Limit: %s; pressure callbacks run %" PRId64 " times; cache flushes %" PRId64 "\n",
            lim, st.num_pressure_calls, st.num_sync_all_streams);
    ndm__settings s;
    char conf[512], eff[512];
    ndm__pool_settings(p, &s, conf, sizeof conf);
    ndm__settings_str(&s, eff, sizeof eff);
    fprintf(f, "Settings: %s\n", eff);
    if (conf[0])
        fprintf(f, "From: %s\n", conf);
}
