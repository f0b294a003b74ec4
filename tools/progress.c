/* Training progress for ndm-fashion: the line's layout for a given width,
 * and where it is written (redrawn on a terminal, plain lines elsewhere). */
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include "progress.h"

void progress_init(progress *p, FILE *out, double every)
{
    memset(p, 0, sizeof *p);
    p->out = out;
    p->every = every;
    p->last_line = -1;
    p->tty = isatty(fileno(out));
    p->width = 80;
    if (p->tty) {
        struct winsize ws;
        const char *cols = getenv("COLUMNS");
        if (ioctl(fileno(out), TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0)
            p->width = ws.ws_col;
        else if (cols && atoi(cols) > 0)
            p->width = atoi(cols);
    }
}

int progress_format(char *buf, size_t n, int width, const progress_state *s)
{
    if (n == 0)
        return 0;
    int room = width - 1; /* the last column would wrap on some terminals */
    if (room < 1)
        room = 1;
    if ((size_t)room >= n)
        room = (int)n - 1;
    char head[48], count[64], loss[32], rate[40];
    snprintf(head, sizeof head, "epoch %d/%d", s->epoch, s->epochs);
    /* the count padded to the total's width, so the bar does not move */
    int digits = snprintf(NULL, 0, "%lld", (long long)s->total);
    snprintf(count, sizeof count, " %*lld/%lld batches", digits, (long long)s->done,
             (long long)s->total);
    snprintf(loss, sizeof loss, "  loss %.4f", s->loss);
    /* six digits wide, like the count, so that the bar keeps its width */
    snprintf(rate, sizeof rate, "  %6.0f %s/s", s->rate, s->unit ? s->unit : "examples");
    int fixed = (int)(strlen(head) + strlen(count));
    int lossw = (int)strlen(loss), ratew = (int)strlen(rate);
    /* what gives way as the width shrinks: the rate, then the bar (30
     * cells down to 10), then the loss; the rest is cut at the width */
    bool with_rate = true, with_loss = true;
    int bar = room - fixed - lossw - ratew - 3;
    if (bar < 10) {
        with_rate = false;
        bar = room - fixed - lossw - 3;
    }
    if (bar < 10) {
        bar = 0;
        with_loss = room >= fixed + lossw;
    }
    if (bar > 30)
        bar = 30;
    char line[512];
    int len = snprintf(line, sizeof line, "%s", head);
    if (bar > 0) {
        int64_t filled = s->total > 0 ? bar * s->done / s->total : bar;
        line[len++] = ' ';
        line[len++] = '[';
        for (int i = 0; i < bar; i++)
            line[len++] = i < filled ? '#' : '.';
        line[len++] = ']';
        line[len] = '\0';
    }
    len += snprintf(line + len, sizeof line - (size_t)len, "%s%s%s", count,
                    with_loss ? loss : "", with_rate ? rate : "");
    if (len > room)
        len = room;
    memcpy(buf, line, (size_t)len);
    buf[len] = '\0';
    return len;
}

static void plain_line(progress *p, const progress_state *s, double now)
{
    fprintf(p->out, "epoch %d/%d: %lld/%lld batches, loss %.4f, %.0f %s/s\n", s->epoch,
            s->epochs, (long long)s->done, (long long)s->total, s->loss, s->rate,
            s->unit ? s->unit : "examples");
    fflush(p->out);
    p->last_line = now;
}

void progress_update(progress *p, const progress_state *s, double now)
{
    if (p->tty) {
        /* at most 20 frames a second, and always the last batch's */
        if (p->drawn && now - p->last_draw < 0.05 && s->done < s->total)
            return;
        p->last_draw = now;
        char line[512];
        progress_format(line, sizeof line, p->width, s);
        /* back to the start of the line, the new text, erase what is left */
        fprintf(p->out, "\r%s\033[K", line);
        fflush(p->out);
        p->drawn = true;
    } else if (p->last_line < 0) {
        p->last_line = now; /* the clock starts at the first step */
    } else if (now - p->last_line >= p->every && s->done < s->total) {
        plain_line(p, s, now);
    }
}

void progress_end_epoch(progress *p, const progress_state *s, double now)
{
    if (p->tty) {
        if (p->drawn)
            fprintf(p->out, "\r\033[K");
        fflush(p->out);
        p->drawn = false;
    } else {
        plain_line(p, s, now);
    }
}
