/* Job-wide memory reports: every rank's dump or leak report gathered to
 * rank 0, each manager path prefixed with its rank. */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "group.h"
#include "ndm/debug.h"

/* Gather every rank's text to rank 0: *all (rank 0 only) holds the texts
 * one after the other, lens[r] bytes each. */
static ndm_status gather_text(ndm__dist_group *g, const char *mine, int len, char **all,
                              int **lens, const char *api, ndm__site site)
{
    *all = NULL;
    *lens = calloc((size_t)g->size, sizeof **lens);
    if (!*lens)
        return ndm__fail(NDM_E_OOM, api, site, "no memory");
    MPI_Request req;
    MPI_Igather(&len, 1, MPI_INT, *lens, 1, MPI_INT, 0, g->comm, &req);
    ndm_status st = ndm__dist_wait(g, &req, 1, NULL, 0, api, site);
    if (st < 0)
        return st;
    int *displs = NULL;
    int64_t total = 0;
    if (g->rank == 0) {
        displs = malloc((size_t)g->size * sizeof *displs);
        for (int r = 0; r < g->size; r++)
            total += (*lens)[r];
        *all = total < INT32_MAX ? malloc((size_t)total + 1) : NULL;
        if (displs && *all) {
            int64_t o = 0;
            for (int r = 0; r < g->size; r++) {
                displs[r] = (int)o;
                o += (*lens)[r];
            }
        }
    }
    /* rank 0 without memory still takes part, and reports it afterwards */
    bool ok = g->rank != 0 || (displs && *all);
    MPI_Igatherv(mine, len, MPI_CHAR, ok ? *all : NULL, *lens, ok ? displs : *lens, MPI_CHAR, 0,
                 g->comm, &req);
    if (!ok && g->rank == 0) {
        /* receive nothing: counts of zero */
        memset(*lens, 0, (size_t)g->size * sizeof **lens);
    }
    st = ndm__dist_wait(g, &req, 1, NULL, 0, api, site);
    free(displs);
    if (st == NDM_OK && !ok)
        st = ndm__fail(NDM_E_OOM, api, site, "no memory for the ranks' reports");
    return st;
}

/* Is the "system" at s, in line [line, le), a manager path? */
static bool path_at(const char *line, const char *s, const char *le)
{
    return (s == line || s[-1] == ' ') && (s + 6 == le || s[6] == '/' || s[6] == ' ');
}

/* The next manager path in [q, le), or NULL. */
static const char *next_path(const char *line, const char *q, const char *le)
{
    for (const char *s; q < le && (s = memmem(q, (size_t)(le - q), "system", 6)); q = s + 6)
        if (path_at(line, s, le))
            return s;
    return NULL;
}

/* Print text to f, prefixing "rankN/" to every manager path (a word that
 * starts with "system") and "rankN: " to lines that have none. */
static void print_prefixed(FILE *f, int rank, const char *text, int len)
{
    const char *p = text, *end = text + len;
    while (p < end) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        const char *le = nl ? nl : end;
        const char *q = p, *s = next_path(p, p, le);
        if (!s)
            fprintf(f, "rank%d: ", rank);
        for (; s; s = next_path(p, s + 6, le)) {
            fwrite(q, 1, (size_t)(s - q), f);
            fprintf(f, "rank%d/", rank);
            q = s;
        }
        fwrite(q, 1, (size_t)(le - q), f);
        fputc('\n', f);
        p = le + 1;
    }
}

/* Run `report` into memory on every rank, gather, print on rank 0. */
static ndm_status gathered(ndm__dist_group *g, ndm__dist_kind kind, ndm_manager m, FILE *f,
                           int64_t *count, const char *api, ndm__site site)
{
    char *buf = NULL;
    size_t len = 0;
    ndm_status local = NDM_OK;
    if (g->rank == 0 && !f)
        local = ndm__fail(NDM_E_INVALID, api, site, "f is NULL on rank 0");
    FILE *mem = local == NDM_OK ? open_memstream(&buf, &len) : NULL;
    if (local == NDM_OK && !mem)
        local = ndm__fail(NDM_E_OOM, api, site, "no memory for a report");
    int64_t n = 0;
    if (mem) {
        if (kind == NDM__DIST_DUMP)
            local = ndm_debug_dump_at(NDM__SITE_ARGS(site), m, mem);
        else
            n = ndm_leak_report(mem);
        fclose(mem);
    }
    ndm_status st = ndm__dist_agree(g, kind, 0, NULL, local, NULL, api, site);
    if (st == NDM_OK && count) {
        MPI_Request req;
        MPI_Iallreduce(MPI_IN_PLACE, &n, 1, MPI_INT64_T, MPI_SUM, g->comm, &req);
        st = ndm__dist_wait(g, &req, 1, NULL, 0, api, site);
        *count = n;
    }
    char *all = NULL;
    int *lens = NULL;
    if (st == NDM_OK)
        st = gather_text(g, buf ? buf : "", len > INT32_MAX ? INT32_MAX : (int)len, &all, &lens,
                         api, site);
    if (st == NDM_OK && g->rank == 0) {
        int64_t o = 0;
        for (int r = 0; r < g->size; r++) {
            print_prefixed(f, r, all + o, lens[r] && all[o + lens[r] - 1] == '\n' ? lens[r] - 1
                                                                                 : lens[r]);
            o += lens[r];
        }
        fflush(f);
    }
    free(all);
    free(lens);
    free(buf);
    return st;
}

NDM_API ndm_status ndm_dist_debug_dump(ndm_manager m, FILE *f)
{
    ndm__dist_group *g = ndm__dist_group_get(__func__, NDM__NO_SITE);
    if (!g)
        return ndm_last_status();
    return gathered(g, NDM__DIST_DUMP, m, f, NULL, __func__, NDM__NO_SITE);
}

NDM_API int64_t ndm_dist_leak_report(FILE *f)
{
    ndm__dist_group *g = ndm__dist_group_get(__func__, NDM__NO_SITE);
    if (!g)
        return ndm_last_status();
    int64_t n = 0;
    ndm_status st = gathered(g, NDM__DIST_LEAKS, NDM_NULL_MANAGER, f, &n, __func__, NDM__NO_SITE);
    return st < 0 ? st : n;
}
