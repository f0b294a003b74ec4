/* Training progress for ndm-fashion: a bar fitted to the terminal, redrawn
 * in place, or plain lines when the output is a file or a pipe. */
#ifndef NDM_TOOLS_PROGRESS_H
#define NDM_TOOLS_PROGRESS_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

/* Where the progress goes and how it is drawn. */
typedef struct progress {
    FILE *out;         /* stderr in ndm-fashion */
    bool tty;          /* redraw one line in place (else: plain lines) */
    int width;         /* the terminal's columns (tty only) */
    double every;      /* plain mode: seconds between lines within an epoch */
    double last_line;  /* plain mode: when the last line was written */
    bool drawn;        /* tty: a bar is on screen */
    double last_draw;  /* tty: when it was drawn */
} progress;

/* One step's figures. */
typedef struct progress_state {
    int epoch, epochs;
    int64_t done, total; /* batches */
    double loss;
    double rate;         /* examples per second */
    const char *unit;    /* what the rate counts (NULL: "examples") */
} progress_state;

/* Set p up for `out`: a terminal's width from the terminal (COLUMNS, then 80,
 * when it does not say), plain lines every `every` seconds otherwise. */
void progress_init(progress *p, FILE *out, double every);

/* The line for s in at most width - 1 characters (so it never wraps): the
 * rate, then the bar, then the loss give way as the width shrinks. Returns
 * its length. */
int progress_format(char *buf, size_t n, int width, const progress_state *s);

/* Report a step at time `now` (seconds): on a terminal, redraw the line; in
 * plain mode, write a line when `every` seconds have passed since the last. */
void progress_update(progress *p, const progress_state *s, double now);

/* The epoch is over: on a terminal, erase the bar; in plain mode, write the
 * epoch's last line. */
void progress_end_epoch(progress *p, const progress_state *s, double now);

#endif
