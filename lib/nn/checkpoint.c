/* Checkpoints: a module's state (parameters and buffers) saved and loaded as
 * safetensors under PyTorch's state_dict names, checked name by name. */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../base/error.h"
#include "../base/text.h"
#include "ndm/ndm.h"
#include "ndm/nn.h"
#include "nn.h"

ndm_status ndm__nn_copy_into(ndm__site site, ndm_manager scratch, ndm_array dst, ndm_array src)
{
    ndm_device to = ndm_array_device(dst), from = ndm_array_device(src);
    if (ndm_device_eq(to, from))
        return ndm_copy_into_at(NDM__SITE_ARGS(site), dst, src);
    ndm_array t = ndm_to_to_at(NDM__SITE_ARGS(site), scratch, src, to);
    if (!t.id)
        return ndm_last_status();
    ndm_status st = ndm_copy_into_at(NDM__SITE_ARGS(site), dst, t);
    ndm_status rs = ndm_array_release(t);
    return st < 0 ? st : rs;
}

NDM_API ndm_status ndm_module_save_at(NDM_SITE_PARAMS, ndm_module m, const char *path)
{
    NDM__ENTRY(__func__);
    ndm__site site = NDM__SITE;
    int n = ndm_module_named_state(m, NULL, NULL, 0);
    if (n < 0)
        return n;
    const char **names = calloc((size_t)n + 1, sizeof *names);
    ndm_array *arrays = calloc((size_t)n + 1, sizeof *arrays);
    ndm_status st;
    if (!names || !arrays) {
        st = ndm__fail(NDM_E_OOM, "ndm_module_save", site, "no memory");
    } else {
        ndm_module_named_state(m, names, arrays, n);
        /* PyTorch's safetensors.torch.save_model writes this too */
        const char *keys[] = {"format"}, *values[] = {"pt"};
        ndm_named_arrays set = {(size_t)n, names, arrays, 1, keys, values};
        st = ndm_safetensors_save_at(NDM__SITE_ARGS(site), path, &set);
    }
    free(names);
    free(arrays);
    return st;
}

/* Append ", name" (or a shape note) to a message buffer, noting overflow once. */
static void note(char *buf, size_t cap, int *count, const char *fmt, const char *name,
                 const char *extra)
{
    size_t len = strlen(buf);
    if ((*count)++ < 8 && len < cap)
        snprintf(buf + len, cap - len, fmt, *count > 1 ? ", " : "", name, extra);
    else if (*count == 9 && len < cap)
        snprintf(buf + len, cap - len, ", ...");
}

/* The sizes of a, in buf when they fit its `cap` or else in memory the
 * caller frees; NULL (with *nd negative) for a bad handle or no memory. */
static int64_t *shape_of(ndm_array a, int64_t *buf, int cap, int *nd)
{
    *nd = ndm_array_ndim(a);
    if (*nd < 0)
        return NULL;
    int64_t *s = *nd <= cap ? buf : malloc((size_t)*nd * sizeof *s);
    if (!s || ndm_array_shape(a, s, *nd > cap ? *nd : cap) < 0) {
        if (s != buf)
            free(s);
        *nd = -1;
        return NULL;
    }
    return s;
}

static bool same_shape(ndm_array a, ndm_array b)
{
    int64_t ba[16], bb[16];
    int na, nb;
    int64_t *sa = shape_of(a, ba, 16, &na), *sb = shape_of(b, bb, 16, &nb);
    bool same = sa && sb && na == nb && !memcmp(sa, sb, (size_t)na * sizeof *sa);
    if (sa != ba)
        free(sa);
    if (sb != bb)
        free(sb);
    return same;
}

/* "(2, 3)"; past SHAPE_SHOWN sizes, the first of them, "..." and the rank. */
#define SHAPE_SHOWN 8
static void shape_str(ndm_array a, char *buf, size_t cap)
{
    int64_t s[16];
    int nd;
    int64_t *dims = shape_of(a, s, 16, &nd);
    if (!dims) {
        snprintf(buf, cap, "(unknown)");
        return;
    }
    int shown = nd > SHAPE_SHOWN ? SHAPE_SHOWN : nd;
    size_t len = (size_t)snprintf(buf, cap, "(");
    for (int i = 0; i < shown && len < cap; i++)
        len += (size_t)snprintf(buf + len, cap - len, i ? ", %lld" : "%lld", (long long)dims[i]);
    if (shown < nd && len < cap)
        len += (size_t)snprintf(buf + len, cap - len, ", ...; rank %d", nd);
    if (len < cap)
        snprintf(buf + len, cap - len, ")");
    if (dims != s)
        free(dims);
}

/* Append "'name'" to a list (", " between). */
static void list_add(ndm__sbuf *list, const char *name)
{
    if (list->len)
        ndm__sbuf_puts(list, ", ");
    ndm__sbuf_puts(list, "'");
    ndm__sbuf_puts(list, name);
    ndm__sbuf_puts(list, "'");
}

/* A lenient load that left names unmatched says which, every one of them:
 * the module's tensors that kept their values, the file's that went unused. */
static void warn_unmatched(const char *path, const ndm__site *site, const char **names,
                           const int64_t *found, int n, const ndm_named_arrays *set,
                           const char *const *fnames, const bool *used, int loaded)
{
    ndm__sbuf kept = {0}, unused = {0};
    char where[256];
    for (int i = 0; i < n; i++)
        if (found[i] < 0)
            list_add(&kept, names[i]);
    for (size_t j = 0; j < set->count; j++)
        if (!used[j])
            list_add(&unused, fnames[j]);
    if (!kept.oom && !unused.oom)
        ndm__warn("ndm_module_load: '%s' (lenient): loaded %d of the module's %d tensors; "
                  "kept their values: %s; not in the module: %s (at %s)",
                  path, loaded, n, kept.len ? kept.p : "none", unused.len ? unused.p : "none",
                  ndm__site_str(*site, where, sizeof where));
    else
        ndm__warn("ndm_module_load: '%s' (lenient): loaded %d of the module's %d tensors "
                  "(no memory to list the others) (at %s)",
                  path, loaded, n, ndm__site_str(*site, where, sizeof where));
    free(kept.p);
    free(unused.p);
}

/* The file's names through `map` into *out (one per tensor: set->names[j]
 * itself when unchanged, else a copy; NULL for a tensor the callback
 * drops, which is marked used so that it is neither loaded nor
 * unexpected). Two tensors read as one name are refused (NDM_E_FORMAT). */
static ndm_status map_names(const ndm_name_map *map, const ndm_named_arrays *set, bool *used,
                            char ***out, const char *path, const char *api, ndm__site site)
{
    char **mapped = calloc(set->count + 1, sizeof *mapped);
    if (!mapped)
        return ndm__fail(NDM_E_OOM, api, site, "no memory");
    *out = mapped;
    for (size_t j = 0; j < set->count; j++) {
        const char *name = set->names[j];
        char *rewritten = NULL;
        for (int k = 0; k < map->n; k++) {
            size_t fl = map->from[k] ? strlen(map->from[k]) : 0;
            if (map->from[k] && !strncmp(name, map->from[k], fl)) {
                const char *to = map->to[k] ? map->to[k] : "";
                rewritten = malloc(strlen(to) + strlen(name + fl) + 1);
                if (!rewritten)
                    return ndm__fail(NDM_E_OOM, api, site, "no memory");
                strcpy(rewritten, to);
                strcat(rewritten, name + fl);
                break; /* the first prefix that matches */
            }
        }
        const char *now = rewritten ? rewritten : name;
        if (map->fn) {
            char buf[512];
            int r = map->fn(now, buf, sizeof buf, map->ud);
            if (r < 0) {
                free(rewritten);
                return ndm__fail(r, api, site, "the name map refused '%s' of '%s'", name, path);
            }
            if (r == 0) {
                free(rewritten);
                used[j] = true; /* dropped: neither loaded nor unexpected */
                continue;
            }
            if (!memchr(buf, '\0', sizeof buf)) {
                free(rewritten);
                return ndm__fail(NDM_E_INVALID, api, site,
                                 "the name map's name for '%s' is longer than %zu bytes", name,
                                 sizeof buf - 1);
            }
            free(rewritten);
            rewritten = strdup(buf);
            if (!rewritten)
                return ndm__fail(NDM_E_OOM, api, site, "no memory");
        }
        mapped[j] = rewritten ? rewritten : (char *)name;
        for (size_t i = 0; i < j; i++)
            if (mapped[i] && !strcmp(mapped[i], mapped[j]))
                return ndm__fail(NDM_E_FORMAT, api, site,
                                 "'%s' and '%s' of '%s' both read as '%s' through the name map",
                                 set->names[i], set->names[j], path, mapped[j]);
    }
    return NDM_OK;
}

/* The first entry k < before (among the n) that holds the array of entry
 * i and is in the file, or -1: i's tied name that the file has. With
 * before = n, any such entry but i. */
static int tied_found(const ndm_array *arrays, const int64_t *found, int before, int i)
{
    for (int k = 0; k < before; k++)
        if (k != i && found[k] >= 0 && arrays[k].id == arrays[i].id)
            return k;
    return -1;
}

/* Do file tensors a and b (one shape) hold the same values, bit for bit
 * once b is in a's dtype? (no memory to look: taken as the same) */
static bool same_values(ndm_manager scratch, ndm_array a, ndm_array b)
{
    if (ndm_array_dtype(b) != ndm_array_dtype(a))
        b = ndm_astype_to(scratch, b, ndm_array_dtype(a));
    size_t nb = (size_t)ndm_array_nbytes(a);
    char *pa = malloc(nb + 1), *pb = malloc(nb + 1);
    bool same = !b.id || !pa || !pb || ndm_array_copy_out(a, pa, nb) < 0 ||
                ndm_array_copy_out(b, pb, nb) < 0 || !memcmp(pa, pb, nb);
    free(pa);
    free(pb);
    return same;
}

static int load(ndm__site site, const char *api, ndm_module m, const char *path, unsigned mode,
                const ndm_name_map *map)
{
    if (mode > NDM_CHECKPOINT_LENIENT)
        return ndm__fail(NDM_E_INVALID, api, site, "unknown mode %u", mode);
    if (map && ((map->n < 0 || (map->n && (!map->from || !map->to)))))
        return ndm__fail(NDM_E_INVALID, api, site, "a name map with %d prefixes needs both lists",
                         map->n);
    int n = ndm_module_named_state(m, NULL, NULL, 0);
    if (n < 0)
        return n;
    ndm_manager tmp = ndm_manager_new_at(NDM__SITE_ARGS(site), ndm_system(), "checkpoint");
    if (!tmp.id)
        return ndm_last_status();
    const char **names = calloc((size_t)n + 1, sizeof *names);
    ndm_array *arrays = calloc((size_t)n + 1, sizeof *arrays);
    int64_t *found = calloc((size_t)n + 1, sizeof *found);
    const ndm_named_arrays *set = NULL;
    ndm_status st = NDM_OK;
    bool *used = NULL;
    char **mapped = NULL;
    if (!names || !arrays || !found)
        st = ndm__fail(NDM_E_OOM, api, site, "no memory");
    else if (!(set = ndm_safetensors_load_at(NDM__SITE_ARGS(site), tmp, path, NDM_LOAD_MMAP_COW)))
        st = ndm_last_status();
    else if (!(used = calloc(set->count + 1, sizeof *used)))
        st = ndm__fail(NDM_E_OOM, api, site, "no memory");
    else if (map)
        st = map_names(map, set, used, &mapped, path, api, site);
    /* the file's names as the module reads them */
    const char *const *fnames = mapped ? (const char *const *)mapped : set ? set->names : NULL;
    int loaded = 0;
    if (st == NDM_OK) {
        ndm_module_named_state(m, names, arrays, n);
        char missing[400] = "", unexpected[400] = "", shapes[600] = "";
        int nmissing = 0, nunexpected = 0, nshapes = 0;
        /* every name and shape is checked before anything is written */
        for (int i = 0; i < n; i++) {
            found[i] = -1;
            for (size_t j = 0; j < set->count && found[i] < 0; j++)
                if (fnames[j] && !strcmp(fnames[j], names[i]))
                    found[i] = (int64_t)j;
            if (found[i] >= 0)
                used[found[i]] = true;
        }
        for (int i = 0; i < n; i++) {
            if (found[i] < 0) {
                /* a tied name is not missing when the file has another */
                if (tied_found(arrays, found, n, i) < 0)
                    note(missing, sizeof missing, &nmissing, "%s'%s'%s", names[i], "");
                continue;
            }
            if (!same_shape(arrays[i], set->arrays[found[i]])) {
                char want[160], got[160], both[360];
                shape_str(arrays[i], want, sizeof want);
                shape_str(set->arrays[found[i]], got, sizeof got);
                snprintf(both, sizeof both, " is %s in the file, %s in the module", got, want);
                note(shapes, sizeof shapes, &nshapes, "%s'%s'%s", names[i], both);
            }
        }
        for (size_t j = 0; j < set->count; j++)
            if (!used[j])
                note(unexpected, sizeof unexpected, &nunexpected, "%s'%s'%s", fnames[j], "");
        int matched = n - nmissing;
        /* tied names, both in the file: one array takes one value */
        int tj = -1, ti = -1;
        for (int i = 0; !nshapes && ti < 0 && i < n; i++) {
            int j = found[i] >= 0 ? tied_found(arrays, found, i, i) : -1;
            if (j >= 0 && !same_values(tmp, set->arrays[found[j]], set->arrays[found[i]]))
                ti = i, tj = j;
        }
        if (nshapes)
            st = ndm__fail(NDM_E_SHAPE, api, site, "'%s' does not fit the module: %s", path,
                           shapes);
        else if (ti >= 0)
            st = ndm__fail(NDM_E_FORMAT, api, site,
                           "'%s' holds different values for '%s' and '%s', which are tied in "
                           "the module (one array, ndm_module_tie): save them equal, or leave "
                           "one out",
                           path, names[tj], names[ti]);
        else if (mode == NDM_CHECKPOINT_LENIENT && n > 0 && matched == 0)
            /* names of another scheme ("fc1.weight" for "0.weight"): nothing
             * would be loaded and the module would keep its values */
            st = ndm__fail(NDM_E_FORMAT, api, site,
                           "'%s' matches none of the module's %d tensors (lenient load): the "
                           "module has %s; the file has %s%s",
                           path, n, missing, nunexpected ? "" : "no tensors", unexpected);
        else if (mode == NDM_CHECKPOINT_STRICT && (nmissing || nunexpected))
            st = ndm__fail(NDM_E_FORMAT, api, site,
                           "'%s' does not match the module: %d missing%s%s%s; %d unexpected%s%s%s",
                           path, nmissing, nmissing ? " (" : "", missing, nmissing ? ")" : "",
                           nunexpected, nunexpected ? " (" : "", unexpected,
                           nunexpected ? ")" : "");
        for (int i = 0; st == NDM_OK && i < n; i++) {
            if (found[i] < 0 || tied_found(arrays, found, i, i) >= 0)
                continue; /* (a tied array is written once) */
            st = ndm__nn_copy_into(site, tmp, arrays[i], set->arrays[found[i]]);
            loaded++;
        }
        if (st == NDM_OK && (nmissing || nunexpected))
            warn_unmatched(path, &site, names, found, n, set, fnames, used, loaded);
    }
    free(names);
    free(arrays);
    free(found);
    free(used);
    if (mapped) {
        for (size_t j = 0; j < set->count; j++)
            if (mapped[j] != set->names[j])
                free(mapped[j]);
        free(mapped);
    }
    ndm_status cs = ndm_manager_close_at(NDM__SITE_ARGS(site), tmp);
    (void)cs;
    return st < 0 ? st : loaded;
}

NDM_API int ndm_module_load_at(NDM_SITE_PARAMS, ndm_module m, const char *path, unsigned mode)
{
    NDM__ENTRY(__func__);
    return load(NDM__SITE, "ndm_module_load", m, path, mode, NULL);
}

NDM_API int ndm_module_load_mapped_at(NDM_SITE_PARAMS, ndm_module m, const char *path,
                                      unsigned mode, const ndm_name_map *map)
{
    NDM__ENTRY(__func__);
    return load(NDM__SITE, "ndm_module_load_mapped", m, path, mode, map);
}
