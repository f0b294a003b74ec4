/* ndm-memviz's parts and what they share: the arena and the failure path
 * (base.c), the readers of JSON and pickle into one tree (json.c, pickle.c),
 * the snapshot and its timelines read from that tree (model.c), and the page
 * written from them (render.c, around page.html); main.c runs them. One
 * thread; a failure frees everything and exits (or, in a fuzz target,
 * returns). */
#ifndef NDM_MEMVIZ_H
#define NDM_MEMVIZ_H

#include <inttypes.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef NDM_MEMVIZ_FUZZ
#include <setjmp.h>
#endif

#if defined(__GNUC__)
#define NORETURN __attribute__((noreturn))
#define PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define NORETURN
#define PRINTF(a, b)
#endif

/* ---- memory: one arena, freed at exit (base.c) ------------------------------- */

/* What the arena may hold: set from the input's size before it is read, so
 * a small hostile file cannot make memviz take gigabytes. */
extern size_t mv_arena_limit;
#define MEMORY_BASE ((size_t)64 << 20) /* plus MEMORY_PER_BYTE per input byte */
#define MEMORY_PER_BYTE 64

/* n bytes from the arena (never NULL: past the bound, mv_fail). */
void *mv_xalloc(size_t n);
void mv_arena_free(void);

/* base + per * n, saturated: the bounds that scale with the input. */
static inline size_t bound(size_t base, size_t per, size_t n)
{
    if (n > (SIZE_MAX - base) / per)
        return SIZE_MAX;
    return base + per * n;
}

/* A growable array in the arena (a grown array leaves its old block behind:
 * the arena lives for one run). */
typedef struct vec {
    void *items;
    size_t n, cap, size;
} vec;

static inline void *vec_push(vec *v)
{
    if (v->n == v->cap) {
        size_t cap = v->cap ? 2 * v->cap : 8;
        void *items = mv_xalloc(cap * v->size);
        if (v->n)
            memcpy(items, v->items, v->n * v->size);
        v->items = items;
        v->cap = cap;
    }
    return (char *)v->items + v->n++ * v->size;
}

#define VEC_AT(v, T, i) (((T *)(v).items)[i])

/* ---- errors (base.c) --------------------------------------------------------- */

extern const char *mv_input_name;        /* names the input in messages */
extern char *mv_input_text, *mv_before_text; /* the files' bytes (malloc), freed on every exit */
/* The page being written (its temporary), removed on every failure. */
extern FILE *mv_out_file;
extern char mv_out_tmp[4096];
#ifdef NDM_MEMVIZ_FUZZ
/* Built into a fuzz target: a failure returns to the target, quietly. */
extern jmp_buf mv_fail_jump;
#endif

/* Closes and removes the temporary page, if any. */
void mv_out_discard(void);
/* The message (naming the input), then everything freed and exit 1. */
void mv_fail(const char *fmt, ...) NORETURN PRINTF(1, 2);

/* Warnings go to stderr and into the page (the first hundred). */
extern vec mv_warnings; /* char * */
extern size_t mv_warnings_seen;
void mv_warn(const char *fmt, ...) PRINTF(1, 2);

/* ---- the tree the readers make (json.c, pickle.c) ---------------------------- */

typedef enum jtype { J_NULL, J_BOOL, J_NUM, J_STR, J_ARR, J_OBJ } jtype;

typedef struct jval jval;
struct jval {
    jtype t;
    bool b;
    bool is_int;        /* J_NUM: an integer that fits in int64 */
    int64_t i;
    double d;
    const char *s;      /* J_STR, NUL-terminated (a NUL inside is refused) */
    size_t n;           /* J_ARR / J_OBJ: entries */
    jval **items;
    const char **keys;  /* J_OBJ */
    size_t cap;         /* a pickle's container: room in items (and keys) */
    bool walking;       /* inside tree_check's walk of this container */
    const char *text;   /* a frames list: its hover text, once made */
};

#define JSON_MAX_DEPTH 256

/* A strict JSON text (json.c), or a pickle of plain values (pickle.c), as a
 * tree in the arena; malformed input is refused with mv_fail. */
jval *mv_json_parse(const char *text, size_t len);
jval *mv_pickle_parse(const char *text, size_t len);

static inline jval *jget(const jval *o, const char *key)
{
    if (!o || o->t != J_OBJ)
        return NULL;
    for (size_t k = 0; k < o->n; k++)
        if (!strcmp(o->keys[k], key))
            return o->items[k];
    return NULL;
}

/* ---- the snapshot and its timelines (model.c) -------------------------------- */

typedef struct block {
    int64_t address, size, requested;
    const char *state, *manager, *frames;
} block;

typedef struct segment {
    const char *device, *type;
    int dev; /* index into the devices, -1 for a device no trace names */
    int64_t address, total, allocated, active, requested, stream;
    vec blocks; /* block */
} segment;

typedef struct event {
    const char *action, *manager, *frames;
    int64_t addr, size, time_us;
} event;

typedef struct snapshot {
    vec devices;  /* const char * */
    vec segments; /* segment */
    vec traces;   /* vec of event, one per device */
    const jval *settings;
} snapshot;

/* The file's bytes as a tree: a pickle when it starts with PROTO, else
 * JSON; its nesting, cycles and shared values bounded by its size. */
jval *mv_parse_snapshot(const char *text, size_t len);
/* The snapshot in a tree, checked: errors name the path of the field. */
void mv_read_snapshot(const jval *root, snapshot *s);
/* a + b for addresses, sizes and byte totals, refused when it overflows. */
int64_t mv_add_i64(int64_t a, int64_t b, const char *what, const char *path);

#define MAX_SERIES 15  /* the managers with the highest peaks; the rest add up as one */

typedef struct series {
    const char *manager;
    int64_t now, peak;
} series;

typedef struct timeline {
    const char *device;
    int dev;               /* its index among the devices */
    vec series;            /* series; after the first pass, by falling peak */
    size_t *index;         /* open-addressing table of series by manager name */
    size_t index_cap;
    int nshown;            /* series drawn: the top peaks, plus one for the rest */
    int *shown_of;         /* series -> shown series (NULL in the first pass) */
    int64_t *group_now, *group_peak; /* per shown series */
    vec t;                 /* int64_t time of each point */
    vec values;            /* int64_t [nshown] per point */
    vec reserved;          /* int64_t per point */
    vec ooms;              /* int64_t times */
    int64_t unknown_frees, events, peak_total, total;
    vec initial;           /* live_entry: blocks alive before the first event */
    vec initial_manager;   /* const char *, by live_entry.series */
    int64_t initial_reserved;
} timeline;

/* The bytes over time of device `dev`, stacked by manager, from its events. */
void mv_build_timeline(timeline *tl, int dev, const char *device, const vec *events,
                       const snapshot *s);
/* A manager path with its per-step components ("batch-17") folded to
 * "batch-*", in buf, or m itself when nothing folds or it does not fit. */
const char *mv_fold_manager(const char *m, char *buf, size_t cap);

static inline size_t hash_str(const char *s)
{
    size_t h = 1469598103934665603u;
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 1099511628211u;
    return h;
}

/* ---- the page (render.c) ----------------------------------------------------- */

/* Every byte of the page is counted against a bound set by the input's size
 * (a small file can name a huge string a million times). */
#define OUTPUT_BASE ((size_t)32 << 20) /* plus OUTPUT_PER_BYTE per input byte */
#define OUTPUT_PER_BYTE 64
extern size_t mv_out_bytes, mv_out_limit;

/* The page of snapshot s (compared with `before` when not NULL) to out. */
void mv_render(FILE *out, const snapshot *s, const snapshot *before, const char *before_name);

#endif
