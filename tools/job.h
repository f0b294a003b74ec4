/* What the main jobs (ndm-fashion, ndm-text) share: the command line (options
 * with their ranges, help and errors), the device, the memory checks. */
#ifndef NDM_TOOLS_JOB_H
#define NDM_TOOLS_JOB_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "ndm/ndm.h"

/* The tool's name in its messages ("ndm-fashion"), defined by the tool. */
extern const char *prog;

/* Live arrays and bytes of each manager watched, for the flatness check. */
typedef struct snapshot {
    uint64_t arrays[8];
    uint64_t bytes[8];
    int n;
    double rss;
    uint64_t dev_allocated, dev_reserved; /* the device's allocator (not the CPU) */
} snapshot;

/* One option of a command: its name, the value it takes, the accepted range
 * and where the value goes. The help text and the errors come from here. */
/* OPT_TEXT takes a non-empty value; OPT_ANY_TEXT any value, the empty one
 * included (the command judges it). */
typedef enum opt_kind { OPT_FLAG, OPT_INT, OPT_REAL, OPT_TEXT, OPT_ANY_TEXT } opt_kind;

typedef struct cli_opt {
    const char *name;  /* "--epochs" */
    const char *arg;   /* "N" (NULL for a flag) */
    opt_kind kind;
    int64_t ilo, ihi;  /* OPT_INT: accepted range */
    double rlo, rhi;   /* OPT_REAL: accepted range, rlo excluded */
    void *dst;         /* bool, int64_t, double or const char * */
    const char *dflt;  /* the default in words (NULL: the initial value) */
    const char *help;
} cli_opt;

typedef struct command {
    const char *name;
    const char *summary;
    const cli_opt *opts;
    int nopts;
    int (*run)(void); /* runs the command once its options are filled; the exit status */
} command;

/* Seconds on the monotonic clock. */
double now(void);
/* Resident set size in MiB. */
double rss_mib(void);
/* Can `path` be written? Checked before training so a run does not end in
 * an error after its work. Names the reason in why when not. */
bool writable(const char *path, char *why, size_t n);
/* "cpu", "cuda" (device 0) or "cuda:N"; false for anything else. */
bool parse_device(const char *text, ndm_device *out);
/* --device's value, or a usage error (exit 2) naming what it takes. */
ndm_device device_option(const char *cmd, const char *text);
/* The model manager on `dev`; on a machine without that GPU, or a build or
 * install without the CUDA module, a message saying which and exit 1
 * before any work. */
ndm_manager model_manager(const char *cmd, ndm_device dev);
/* The device's allocator: allocated and reserved bytes now. */
void device_bytes(ndm_device dev, uint64_t *allocated, uint64_t *reserved);
/* Add manager m's live arrays and bytes (CPU plus dev) to s. */
void snap_add(ndm_manager m, ndm_device dev, snapshot *s);

/* c's help: usage, summary, each option with its range and default. */
void command_help(FILE *f, const command *c);
/* Fill the options of c from argv[2..]; --help prints the help and exits 0;
 * a bad option or value is a message naming it and exit 2. */
void parse_options(const command *c, int argc, char **argv);

/* The whole command line of a tool with these commands: --help, help CMD,
 * --version, a missing or unknown command (exit 2), then the command's
 * options and its run. The exit status. */
int run_tool(int argc, char **argv, const command *commands, int ncommands);

#endif
