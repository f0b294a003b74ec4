/* What the main jobs share: the command line, the device, the memory
 * checks (see job.h). */
#include "job.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Resident set size in MiB. */
double rss_mib(void)
{
    FILE *f = fopen("/proc/self/statm", "r");
    long pages = 0, resident = 0;
    if (f) {
        if (fscanf(f, "%ld %ld", &pages, &resident) != 2)
            resident = 0;
        fclose(f);
    }
    return (double)resident * (double)sysconf(_SC_PAGESIZE) / (1024.0 * 1024.0);
}

/* Can `path` be written? Checked before training so a run does not end in
 * an error after its work. Names the reason when not. */
bool writable(const char *path, char *why, size_t n)
{
    char dir[1024];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (!slash)
        snprintf(dir, sizeof dir, ".");
    else if (slash == dir)
        dir[1] = '\0';
    else
        *slash = '\0';
    struct stat st;
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode)) {
        snprintf(why, n, "the folder %s does not exist", dir);
        return false;
    }
    if (access(dir, W_OK) != 0) {
        snprintf(why, n, "the folder %s is not writable", dir);
        return false;
    }
    /* a save never replaces what is not a regular file (a FIFO, a device) */
    if (stat(path, &st) == 0 && !S_ISREG(st.st_mode)) {
        snprintf(why, n, "%s exists and is not a regular file", path);
        return false;
    }
    if (stat(path, &st) == 0 && access(path, W_OK) != 0) {
        snprintf(why, n, "%s exists and cannot be overwritten", path);
        return false;
    }
    return true;
}

/* "cpu", "cuda" (device 0) or "cuda:N"; false for anything else. */
bool parse_device(const char *text, ndm_device *out)
{
    if (!strcmp(text, "cpu")) {
        *out = NDM_CPU;
        return true;
    }
    if (!strcmp(text, "cuda")) {
        *out = NDM_CUDA(0);
        return true;
    }
    if (strncmp(text, "cuda:", 5) || !isdigit((unsigned char)text[5]))
        return false;
    char *end = NULL;
    errno = 0;
    long i = strtol(text + 5, &end, 10);
    if (*end || errno == ERANGE || i > 1024)
        return false;
    *out = NDM_CUDA((int)i);
    return true;
}

/* The model manager on `dev`; on a machine without that GPU, or a build or
 * install without the CUDA module, a message saying which and exit 1
 * before any work. */
ndm_manager model_manager(const char *cmd, ndm_device dev)
{
    ndm_manager model = ndm_manager_new_on(ndm_system(), "model", dev);
    if (!model.id) {
        char name[32];
        ndm_device_str(dev, name, sizeof name);
        fprintf(stderr, "%s %s: cannot use --device %s: %s\n", prog, cmd, name,
                ndm_last_error());
        if (dev.type == NDM_DEVICE_CUDA)
            fprintf(stderr, "%s %s: %d CUDA devices usable here; run with --device cpu, "
                    "or on a machine with a GPU and a build with the CUDA module "
                    "(libndm-cuda.so)\n", prog, cmd, ndm_cuda_device_count());
        exit(1);
    }
    return model;
}

/* The device's allocator: allocated and reserved bytes now, for the
 * flatness check across epochs. */
void device_bytes(ndm_device dev, uint64_t *allocated, uint64_t *reserved)
{
    int64_t a = 0, r = 0;
    if (ndm_memory_stat_get(dev, "allocated_bytes.all.current", &a) != NDM_OK ||
        ndm_memory_stat_get(dev, "reserved_bytes.all.current", &r) != NDM_OK)
        a = r = 0;
    *allocated = (uint64_t)a;
    *reserved = (uint64_t)r;
}


/* Counts of manager m: its live arrays, and its bytes on the CPU plus, with
 * a GPU, on dev (the model and the batches live there, the datasets on the
 * CPU). */
void snap_add(ndm_manager m, ndm_device dev, snapshot *s)
{
    ndm_stats st, sd;
    if (s->n < 8 && ndm_manager_stats(m, NDM_CPU, NDM_STATS_SUBTREE, &st) == NDM_OK) {
        if (dev.type != NDM_DEVICE_CPU &&
            ndm_manager_stats(m, dev, NDM_STATS_SUBTREE, &sd) == NDM_OK)
            st.live_bytes += sd.live_bytes;
        s->arrays[s->n] = st.live_arrays;
        s->bytes[s->n] = st.live_bytes;
        s->n++;
    }
}




static void print_default(FILE *f, const cli_opt *o)
{
    if (o->dflt)
        fprintf(f, " default: %s", o->dflt);
    else if (o->kind == OPT_INT)
        fprintf(f, " default: %lld", (long long)*(int64_t *)o->dst);
    else if (o->kind == OPT_REAL)
        fprintf(f, " default: %g", *(double *)o->dst);
    else if ((o->kind == OPT_TEXT || o->kind == OPT_ANY_TEXT) && *(const char **)o->dst)
        fprintf(f, " default: %s", *(const char **)o->dst);
}

static void describe_range(char *buf, size_t n, const cli_opt *o)
{
    if (o->kind == OPT_INT)
        snprintf(buf, n, "a whole number from %lld to %lld", (long long)o->ilo, (long long)o->ihi);
    else
        snprintf(buf, n, "a number above %g and at most %g", o->rlo, o->rhi);
}

void command_help(FILE *f, const command *c)
{
    fprintf(f, "usage: %s %s%s\n  %s\n", prog, c->name, c->nopts ? " [options]" : "", c->summary);
    if (c->nopts)
        fprintf(f, "options:\n");
    for (int i = 0; i < c->nopts; i++) {
        const cli_opt *o = &c->opts[i];
        char lhs[64];
        snprintf(lhs, sizeof lhs, "%s%s%s", o->name, o->arg ? " " : "", o->arg ? o->arg : "");
        fprintf(f, "  %-16s %s\n", lhs, o->help);
        if (o->kind == OPT_FLAG)
            continue;
        fprintf(f, "  %-16s", "");
        if (o->kind == OPT_INT || o->kind == OPT_REAL) {
            char range[96];
            describe_range(range, sizeof range, o);
            fprintf(f, " %s;", range);
        }
        print_default(f, o);
        fprintf(f, "\n");
    }
    fprintf(f, "  %-16s %s\n", "-h, --help", "print this help and exit");
}

/* A bad command line: say what and why, point at the help, exit 2. */
static void bad_usage(const command *c, const char *fmt, const char *a, const char *b,
                      const char *range)
{
    fprintf(stderr, "%s %s: ", prog, c->name);
    fprintf(stderr, fmt, a, b, range);
    fprintf(stderr, "\n(`%s %s --help` lists the options)\n", prog, c->name);
    exit(2);
}

/* Parse a whole value: no trailing text, no leading blanks, in range. */
static void parse_value(const command *c, const cli_opt *o, const char *v)
{
    char range[96] = "";
    if (o->kind == OPT_TEXT || o->kind == OPT_ANY_TEXT) {
        if (!*v && o->kind == OPT_TEXT)
            bad_usage(c, "%s needs a non-empty %s%s", o->name, o->arg, "");
        *(const char **)o->dst = v;
        return;
    }
    describe_range(range, sizeof range, o);
    char *end = NULL;
    errno = 0;
    bool ok = *v && !isspace((unsigned char)*v);
    if (o->kind == OPT_INT) {
        long long x = ok ? strtoll(v, &end, 10) : 0;
        if (!ok || *end || errno == ERANGE)
            bad_usage(c, "%s '%s' is not a whole number; it takes %s", o->name, v, range);
        if (x < o->ilo || x > o->ihi)
            bad_usage(c, "%s '%s' is out of range; it takes %s", o->name, v, range);
        *(int64_t *)o->dst = x;
    } else {
        double x = ok ? strtod(v, &end) : 0;
        if (!ok || *end || errno == ERANGE || !isfinite(x))
            bad_usage(c, "%s '%s' is not a number; it takes %s", o->name, v, range);
        if (!(x > o->rlo) || x > o->rhi)
            bad_usage(c, "%s '%s' is out of range; it takes %s", o->name, v, range);
        *(double *)o->dst = x;
    }
}

/* Fill the options of c from argv[2..]; --help prints the help and exits 0. */
void parse_options(const command *c, int argc, char **argv)
{
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h") || !strcmp(a, "help")) {
            command_help(stdout, c);
            exit(0);
        }
    }
    for (int i = 2; i < argc; i++) {
        char name[64];
        const char *a = argv[i], *eq = strchr(a, '='), *v = NULL;
        snprintf(name, sizeof name, "%.*s", eq ? (int)(eq - a) : (int)strlen(a), a);
        const cli_opt *o = NULL;
        for (int k = 0; k < c->nopts && !o; k++)
            if (!strcmp(c->opts[k].name, name))
                o = &c->opts[k];
        if (!o)
            bad_usage(c, "unknown option '%s'%s%s", name, "", "");
        if (o->kind == OPT_FLAG) {
            if (eq)
                bad_usage(c, "%s takes no value (got '%s')%s", o->name, eq + 1, "");
            *(bool *)o->dst = true;
            continue;
        }
        if (eq)
            v = eq + 1;
        else if (i + 1 < argc)
            v = argv[++i];
        else if (o->kind == OPT_TEXT || o->kind == OPT_ANY_TEXT)
            bad_usage(c, "%s needs a value (%s)%s", o->name, o->arg, "");
        else {
            char range[96];
            describe_range(range, sizeof range, o);
            bad_usage(c, "%s needs a value: %s%s", o->name, range, "");
        }
        parse_value(c, o, v);
    }
}

/* --device's value, or a usage error (exit 2) naming what it takes. */
ndm_device device_option(const char *cmd, const char *text)
{
    ndm_device dev;
    if (!parse_device(text, &dev)) {
        fprintf(stderr, "%s %s: --device '%s' is not a device; it takes cpu, cuda or cuda:N\n"
                "(`%s %s --help` lists the options)\n", prog, cmd, text, prog, cmd);
        exit(2);
    }
    return dev;
}

/* The command names as a list in words: "train, serve or leak-demo". */
static void command_list(char *buf, size_t n, const command *cs, int nc, const char *last)
{
    size_t at = 0;
    buf[0] = '\0';
    for (int i = 0; i < nc && at < n; i++) {
        const char *sep = i == 0 ? "" : i == nc - 1 ? last : ", ";
        int w = snprintf(buf + at, n - at, "%s%s", sep, cs[i].name);
        at += w > 0 ? (size_t)w : 0;
    }
}

static void tool_help(FILE *f, const command *cs, int nc)
{
    char names[256];
    command_list(names, sizeof names, cs, nc, " or ");
    fprintf(f, "usage: %s COMMAND [options]   run %s\n"
               "       %s COMMAND --help      the options of one command\n"
               "       %s --help | --version\n\n",
            prog, names, prog, prog);
    for (int i = 0; i < nc; i++) {
        command_help(f, &cs[i]);
        fprintf(f, "\n");
    }
    fprintf(f, "Errors name the option and what it accepts, and exit with status 2.\n"
               "Progress goes to stderr: a bar on a terminal, a line per epoch otherwise.\n");
}

static const command *find_command(const command *cs, int nc, const char *name)
{
    for (int i = 0; i < nc; i++)
        if (!strcmp(cs[i].name, name))
            return &cs[i];
    return NULL;
}

int run_tool(int argc, char **argv, const command *cs, int nc)
{
    char names[256];
    if (argc < 2) {
        command_list(names, sizeof names, cs, nc, " or ");
        fprintf(stderr, "%s: which command? %s (`%s --help` says more)\n", prog, names, prog);
        return 2;
    }
    const char *a = argv[1];
    if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
        tool_help(stdout, cs, nc);
        return 0;
    }
    if (!strcmp(a, "help")) {
        const command *c = argc > 2 ? find_command(cs, nc, argv[2]) : NULL;
        if (c)
            command_help(stdout, c);
        else
            tool_help(stdout, cs, nc);
        return 0;
    }
    if (!strcmp(a, "--version")) {
        printf("%s %s (libndm %s)\n", prog, NDM_VERSION_STRING, ndm_version());
        return 0;
    }
    const command *c = find_command(cs, nc, a);
    if (!c) {
        command_list(names, sizeof names, cs, nc, " and ");
        fprintf(stderr, "%s: unknown command '%s'; the commands are %s (`%s --help` says more)\n",
                prog, a, names, prog);
        return 2;
    }
    parse_options(c, argc, argv);
    return c->run();
}
