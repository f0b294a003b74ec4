/* ndm-memviz's memory (one arena, freed at exit, bounded by the input's
 * size) and its failure path: a refusal frees everything, then exits. */
#include <setjmp.h>
#include <stdarg.h>

#include "memviz.h"

/* ---- memory: one arena, freed at exit ---------------------------------------- */

typedef struct chunk {
    struct chunk *next;
    size_t used, cap;
    max_align_t data[];
} chunk;

static chunk *arena;
/* What the arena holds (mv_arena_limit: what it may hold). */
static size_t arena_bytes;
size_t mv_arena_limit = SIZE_MAX;

void *mv_xalloc(size_t n)
{
    if (n > SIZE_MAX / 2)
        mv_fail("out of memory");
    n = (n + sizeof(max_align_t) - 1) / sizeof(max_align_t) * sizeof(max_align_t);
    if (!arena || arena->cap - arena->used < n) {
        size_t cap = n > ((size_t)1 << 20) ? n : (size_t)1 << 20;
        if (cap > mv_arena_limit - arena_bytes || arena_bytes > mv_arena_limit)
            mv_fail("the snapshot needs more than %zu MiB of memory to draw (the bound is %d MiB "
                    "plus %d bytes per byte of the file): refused",
                    mv_arena_limit >> 20, (int)(MEMORY_BASE >> 20), MEMORY_PER_BYTE);
        chunk *c = malloc(sizeof *c + cap);
        if (!c)
            mv_fail("out of memory");
        c->next = arena;
        c->used = 0;
        c->cap = cap;
        arena = c;
        arena_bytes += cap;
    }
    void *p = (char *)arena->data + arena->used;
    arena->used += n;
    return p;
}

void mv_arena_free(void)
{
    while (arena) {
        chunk *n = arena->next;
        free(arena);
        arena = n;
    }
    arena_bytes = 0;
}

/* ---- errors ---------------------------------------------------------------- */

const char *mv_input_name = "snapshot";
char *mv_input_text, *mv_before_text; /* the files' bytes (malloc), freed on every exit */
FILE *mv_out_file;
char mv_out_tmp[4096];

#ifdef NDM_MEMVIZ_FUZZ
jmp_buf mv_fail_jump;
#endif

void mv_out_discard(void)
{
    if (mv_out_file)
        fclose(mv_out_file);
    mv_out_file = NULL;
    if (mv_out_tmp[0])
        remove(mv_out_tmp);
    mv_out_tmp[0] = '\0';
}

void mv_fail(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
#ifdef NDM_MEMVIZ_FUZZ
    char buf[512];
    vsnprintf(buf, sizeof buf, fmt, ap); /* formatted all the same, for the sanitizers */
#else
    fprintf(stderr, "ndm-memviz: %s: ", mv_input_name);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
#endif
    va_end(ap);
    mv_out_discard();
    mv_arena_free();
    free(mv_input_text);
    free(mv_before_text);
    mv_input_text = mv_before_text = NULL;
#ifdef NDM_MEMVIZ_FUZZ
    longjmp(mv_fail_jump, 1);
#else
    exit(1);
#endif
}

vec mv_warnings = {NULL, 0, 0, sizeof(char *)};

size_t mv_warnings_seen;

void mv_warn(const char *fmt, ...)
{
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    /* The first hundred: a hostile file may hold a million. */
    if (++mv_warnings_seen > 100)
        return;
#ifndef NDM_MEMVIZ_FUZZ
    fprintf(stderr, "ndm-memviz: %s: warning: %s%s\n", mv_input_name, buf,
            mv_warnings_seen == 100 ? " (further warnings are not shown)" : "");
#endif
    char *s = mv_xalloc(strlen(buf) + 1);
    strcpy(s, buf);
    *(char **)vec_push(&mv_warnings) = s;
}
