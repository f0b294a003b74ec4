/* Grouping repeated siblings for the reports (siblings.h). */
#include "siblings.h"

#include <stdlib.h>
#include <string.h>

#include "core.h"

typedef struct kid {
    uint32_t slot;
    uint32_t order; /* place among all the children, oldest first */
} kid;

typedef struct run {
    size_t start, n;
    uint32_t first; /* order of its oldest member */
} run;

uint32_t ndm__oldest_child(uint32_t m)
{
    uint32_t c = ndm__manager_slot(m)->first_child;
    while (c && ndm__manager_slot(c)->sib_next)
        c = ndm__manager_slot(c)->sib_next;
    return c;
}

static int text_cmp(const char *a, const char *b)
{
    return a == b ? 0 : !a ? -1 : !b ? 1 : strcmp(a, b);
}

/* The key (name, device, site), then the order. */
static int kid_cmp(const void *pa, const void *pb)
{
    const kid *ka = pa, *kb = pb;
    const ndm__manager *a = ndm__manager_slot(ka->slot), *b = ndm__manager_slot(kb->slot);
    int c = strcmp(a->name, b->name);
    if (!c)
        c = (int)a->device.type - (int)b->device.type;
    if (!c)
        c = a->device.index - b->device.index;
    if (!c)
        c = text_cmp(a->site.file, b->site.file);
    if (!c)
        c = a->site.line - b->site.line;
    if (!c)
        c = text_cmp(a->site.func, b->site.func);
    return c ? c : ka->order < kb->order ? -1 : ka->order > kb->order;
}

static int run_cmp(const void *pa, const void *pb)
{
    const run *a = pa, *b = pb;
    return a->first < b->first ? -1 : a->first > b->first;
}

bool ndm__sibs_of(const uint32_t *parents, size_t np, ndm__sibs *out)
{
    memset(out, 0, sizeof *out);
    size_t n = 0;
    for (size_t p = 0; p < np; p++)
        for (uint32_t c = ndm__manager_slot(parents[p])->first_child; c;
             c = ndm__manager_slot(c)->sib_next)
            n++;
    kid *k = malloc((n ? n : 1) * sizeof *k);
    run *r = malloc((n ? n : 1) * sizeof *r);
    out->slot = malloc((n ? n : 1) * sizeof *out->slot);
    out->start = malloc((n + 1) * sizeof *out->start);
    if (!k || !r || !out->slot || !out->start) {
        free(k);
        free(r);
        ndm__sibs_free(out);
        return false;
    }
    uint32_t order = 0;
    for (size_t p = 0; p < np; p++)
        for (uint32_t c = ndm__oldest_child(parents[p]); c; c = ndm__manager_slot(c)->sib_prev)
            k[order] = (kid){c, order}, order++;
    qsort(k, n, sizeof *k, kid_cmp);
    size_t nr = 0;
    for (size_t i = 0; i < n; i++) {
        if (i && kid_cmp(&(kid){k[i - 1].slot, 0}, &(kid){k[i].slot, 0}) == 0) {
            r[nr - 1].n++;
            continue;
        }
        r[nr++] = (run){i, 1, k[i].order};
    }
    qsort(r, nr, sizeof *r, run_cmp);
    size_t at = 0;
    for (size_t g = 0; g < nr; g++) {
        out->start[g] = at;
        for (size_t i = 0; i < r[g].n; i++)
            out->slot[at++] = k[r[g].start + i].slot;
    }
    out->start[nr] = at;
    out->ngroups = nr;
    free(k);
    free(r);
    return true;
}

void ndm__sibs_free(ndm__sibs *s)
{
    free(s->slot);
    free(s->start);
    memset(s, 0, sizeof *s);
}
