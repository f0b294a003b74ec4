/* ndm-memviz: turns a memory snapshot (ndm_memory_dump_snapshot's JSON or pickle,
 * or PyTorch's pickle) into one self-contained HTML page: bytes over time stacked
 * by manager, and the segment map with a replay of it at any event.
 *
 *   ndm-memviz snapshot.json out.html
 *   ndm-memviz before.pickle after.pickle out.html     (compares the two)
 *
 * The page carries its data, CSS and script inline and fetches nothing. Its
 * script draws the plots as SVG, then marks <body data-rendered="1"> with the
 * number of series and blocks drawn, so that a headless browser can check it.
 * Snapshots come from other machines, so the reader bounds what a file can
 * make it do by the file's size: nesting, the values reached through shared
 * (memoised) references, its memory and the page it writes; a file past a
 * bound is refused with a message, and no temporary is left behind.
 * The page is never written over one of the inputs or over a snapshot: two
 * snapshots given without the output name would otherwise replace the second.
 * Exit status: 0 done, 1 unreadable, malformed or oversized snapshot, 2 usage
 * (an output that is an input or a snapshot included). */
#include <errno.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include "memviz.h"

#ifndef NDM_MEMVIZ_FUZZ
static char *read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        mv_fail("cannot open: %s", strerror(errno));
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    for (;;) {
        if (!buf) {
            fclose(f);
            mv_fail("out of memory");
        }
        n += fread(buf + n, 1, cap - n, f);
        if (n < cap)
            break;
        char *grown = realloc(buf, 2 * cap);
        if (!grown)
            free(buf);
        buf = grown;
        cap *= 2;
    }
    bool bad = ferror(f);
    fclose(f);
    if (bad) {
        free(buf);
        mv_fail("read error");
    }
    *len = n;
    return buf;
}

#endif

/* A snapshot's bytes, read into s; mv_input_name names it in messages. */
static void load(const char *name, const char *text, size_t len, snapshot *s)
{
    mv_input_name = name;
    mv_read_snapshot(mv_parse_snapshot(text, len), s);
}

/* The bounds scale with the bytes of every snapshot read. */
static void set_bounds(size_t input_bytes)
{
    mv_arena_limit = bound(MEMORY_BASE, MEMORY_PER_BYTE, input_bytes);
    mv_out_limit = bound(OUTPUT_BASE, OUTPUT_PER_BYTE, input_bytes);
}
#ifdef NDM_MEMVIZ_FUZZ
/* One input of a fuzz target: read, drawn (and, for inputs of odd length,
 * compared with itself) into /dev/null; a refusal returns too. */
int ndm_memviz_fuzz(const uint8_t *data, size_t size);
int ndm_memviz_fuzz(const uint8_t *data, size_t size)
{
    static FILE *sink;
    if (!sink && !(sink = fopen("/dev/null", "w")))
        abort();
    mv_warnings = (vec){NULL, 0, 0, sizeof(char *)};
    mv_warnings_seen = 0;
    mv_out_bytes = 0;
    set_bounds(size);
    if (setjmp(mv_fail_jump) == 0) {
        snapshot s;
        load("fuzz", (const char *)data, size, &s);
        mv_render(sink, &s, size % 2 ? &s : NULL, "fuzz");
    }
    mv_arena_free();
    mv_warnings = (vec){NULL, 0, 0, sizeof(char *)};
    return 0;
}
#else
/* What an existing file at the output path is, if it must not be replaced:
 * one of the inputs (the same file, whatever its spelling), or a snapshot
 * (it starts as ndm's JSON or a pickle does, where a page starts with
 * "<!DOCTYPE"); NULL when writing over it is fine. */
static const char *kept_file(const char *out, char **inputs, int n)
{
    struct stat so;
    if (stat(out, &so) != 0)
        return NULL; /* not there (or not reachable: the write says why) */
    for (int k = 0; k < n; k++) {
        struct stat si;
        if (stat(inputs[k], &si) == 0 && si.st_dev == so.st_dev && si.st_ino == so.st_ino)
            return "it is one of the snapshots to read";
    }
    FILE *f = fopen(out, "rb");
    if (!f)
        return NULL;
    int c;
    while ((c = fgetc(f)) != EOF && (c == ' ' || c == '\t' || c == '\n' || c == '\r'))
        ;
    fclose(f);
    if (c == '{' || c == '[')
        return "it holds a JSON snapshot";
    if (c == 0x80)
        return "it holds a pickled snapshot";
    return NULL;
}

/* A crash must not leave a half page: the temporary goes, then the signal
 * does what it would have done. */
static void on_fatal_signal(int sig)
{
    if (mv_out_tmp[0])
        unlink(mv_out_tmp);
    signal(sig, SIG_DFL);
    raise(sig);
}

int main(int argc, char **argv)
{
    bool help = argc == 2 && (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help"));
    if ((argc != 3 && argc != 4) || help) {
        fprintf(help ? stdout : stderr,
                "usage: %s snapshot.json out.html\n"
                "       %s before.json after.json out.html\n"
                "Writes one self-contained HTML page from a memory snapshot (ndm's JSON or\n"
                "pickle, or PyTorch's pickle): bytes over time stacked by manager (one chart\n"
                "per device, zoom with the wheel, pan by dragging, hover for one allocation),\n"
                "and the segment map with a slider that replays it at any event. Given two\n"
                "snapshots, the page also compares the first with the second. A snapshot\n"
                "that would take more memory or write a larger page than a bound set by its\n"
                "size, or that nests too deeply or holds itself, is refused (exit 1).\n",
                argc > 0 ? argv[0] : "ndm-memviz", argc > 0 ? argv[0] : "ndm-memviz");
        return help ? 0 : 2;
    }
    static const int fatal[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT, SIGXFSZ, SIGINT,
                                SIGTERM, SIGHUP};
    for (size_t k = 0; k < sizeof fatal / sizeof *fatal; k++)
        signal(fatal[k], on_fatal_signal);
    const char *out_path = argv[argc - 1];
    const char *kept = kept_file(out_path, argv + 1, argc - 2);
    if (kept) {
        /* Two snapshots and no page named is the likely slip: say how to
         * compare them. */
        bool pair = argc == 3 && strcmp(kept, "it is one of the snapshots to read") != 0;
        fprintf(stderr, "ndm-memviz: %s: not written over: %s\n", out_path, kept);
        if (pair)
            fprintf(stderr, "to compare the two snapshots, name the page last: %s %s %s out.html\n",
                    argv[0], argv[1], argv[2]);
        else
            fprintf(stderr, "name the page's file last, e.g.: %s %s%s%s out.html\n", argv[0],
                    argv[1], argc == 4 ? " " : "", argc == 4 ? argv[2] : "");
        return 2;
    }
    /* Both files first: the bounds count the bytes of each. Strings of the
     * trees live in the arena, so a text may go once it is read. */
    size_t blen = 0, len;
    if (argc == 4) {
        mv_input_name = argv[1];
        mv_before_text = read_file(argv[1], &blen);
    }
    mv_input_name = argv[argc - 2];
    mv_input_text = read_file(argv[argc - 2], &len);
    set_bounds(blen > SIZE_MAX - len ? SIZE_MAX : blen + len);
    snapshot before_snap, *before = NULL;
    if (mv_before_text) {
        load(argv[1], mv_before_text, blen, &before_snap);
        free(mv_before_text);
        mv_before_text = NULL;
        before = &before_snap;
    }
    snapshot s;
    load(argv[argc - 2], mv_input_text, len, &s);

    /* Written beside the target, then renamed: a failed run leaves no half page. */
    if (snprintf(mv_out_tmp, sizeof mv_out_tmp, "%s.tmp", out_path) >= (int)sizeof mv_out_tmp) {
        mv_out_tmp[0] = '\0';
        mv_fail("output path too long");
    }
    mv_out_file = fopen(mv_out_tmp, "w");
    if (!mv_out_file) {
        fprintf(stderr, "ndm-memviz: %s: cannot write: %s\n", mv_out_tmp, strerror(errno));
        mv_out_tmp[0] = '\0';
        free(mv_input_text);
        mv_arena_free();
        return 1;
    }
    mv_render(mv_out_file, &s, before, argv[1]);
    bool bad = ferror(mv_out_file);
    int closed = fclose(mv_out_file);
    mv_out_file = NULL;
    if (closed != 0 || bad || rename(mv_out_tmp, out_path) != 0) {
        fprintf(stderr, "ndm-memviz: %s: cannot write: %s\n", out_path, strerror(errno));
        mv_out_discard();
        free(mv_input_text);
        mv_arena_free();
        return 1;
    }
    mv_out_tmp[0] = '\0';
    free(mv_input_text);
    mv_arena_free();
    return 0;
}
#endif
