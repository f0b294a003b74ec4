/* ndm-fashion's progress: the line fitted to a terminal's width, redrawn in
 * place on a pseudo-terminal, and plain lines when the output is a file. */
#include <fcntl.h>
#include <poll.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <termios.h>
#include <unistd.h>

#include <cmocka.h>

#include "progress.h"

static const progress_state mid = {3, 10, 120, 469, 0.4321, 78325, NULL};

static void test_progress_line_fits_every_width(void **state)
{
    (void)state;
    for (int width = 2; width <= 240; width++) {
        char buf[512];
        int n = progress_format(buf, sizeof buf, width, &mid);
        assert_int_equal(n, (int)strlen(buf));
        if (n > width - 1 && width > 1)
            fail_msg("width %d: %d characters: '%s'", width, n, buf);
        assert_null(strchr(buf, '\n'));
        assert_null(strchr(buf, '\r'));
    }
}

static void test_progress_line_gives_way_in_order(void **state)
{
    (void)state;
    char buf[512];
    /* wide: everything, a 30-cell bar with 120/469 of it filled */
    progress_format(buf, sizeof buf, 200, &mid);
    assert_string_equal(buf, "epoch 3/10 [#######.......................] 120/469 batches  "
                             "loss 0.4321   78325 examples/s");
    /* 80 columns: still everything, the bar narrower */
    progress_format(buf, sizeof buf, 80, &mid);
    assert_non_null(strstr(buf, "examples/s"));
    assert_non_null(strchr(buf, '['));
    assert_true(strlen(buf) <= 79);
    /* 60: the rate goes first */
    progress_format(buf, sizeof buf, 60, &mid);
    assert_null(strstr(buf, "examples/s"));
    assert_non_null(strstr(buf, "loss 0.4321"));
    assert_non_null(strchr(buf, '['));
    /* 40: no bar, the counts and the loss */
    progress_format(buf, sizeof buf, 40, &mid);
    assert_string_equal(buf, "epoch 3/10 120/469 batches  loss 0.4321");
    /* 20: cut at the width */
    progress_format(buf, sizeof buf, 20, &mid);
    assert_string_equal(buf, "epoch 3/10 120/469 ");
}

/* Plain mode: a line at most every `every` seconds within an epoch, one at
 * its end, no carriage return, no escape sequence. */
static void test_progress_plain_lines_in_a_file(void **state)
{
    (void)state;
    FILE *f = tmpfile();
    assert_non_null(f);
    progress p;
    progress_init(&p, f, 10.0);
    assert_false(p.tty);
    progress_state s = mid;
    const double times[] = {0, 1, 5, 9.9, 10.5, 12, 20.4, 20.6};
    for (size_t i = 0; i < sizeof times / sizeof times[0]; i++) {
        s.done = 10 + (int64_t)i;
        progress_update(&p, &s, times[i]);
    }
    s.done = s.total;
    progress_end_epoch(&p, &s, 21);
    rewind(f);
    char text[2048];
    size_t n = fread(text, 1, sizeof text - 1, f);
    text[n] = '\0';
    fclose(f);
    assert_string_equal(text, "epoch 3/10: 14/469 batches, loss 0.4321, 78325 examples/s\n"
                              "epoch 3/10: 17/469 batches, loss 0.4321, 78325 examples/s\n"
                              "epoch 3/10: 469/469 batches, loss 0.4321, 78325 examples/s\n");
}

/* Terminal mode on a pseudo-terminal 50 columns wide: each frame starts
 * with \r, ends by erasing the rest of the line, and fits in 49 columns;
 * the end of the epoch erases the bar. */
static void test_progress_redraws_in_place_on_a_terminal(void **state)
{
    (void)state;
    int master = posix_openpt(O_RDWR | O_NOCTTY);
    if (master < 0 || grantpt(master) != 0 || unlockpt(master) != 0)
        skip();
    int slave = open(ptsname(master), O_RDWR | O_NOCTTY);
    assert_true(slave >= 0);
    struct termios t;
    assert_int_equal(tcgetattr(slave, &t), 0);
    cfmakeraw(&t); /* no \n to \r\n translation: bytes arrive as written */
    assert_int_equal(tcsetattr(slave, TCSANOW, &t), 0);
    struct winsize ws = {.ws_row = 24, .ws_col = 50};
    assert_int_equal(ioctl(slave, TIOCSWINSZ, &ws), 0);
    FILE *f = fdopen(slave, "w");
    assert_non_null(f);
    progress p;
    progress_init(&p, f, 10.0);
    assert_true(p.tty);
    assert_int_equal(p.width, 50);
    progress_state s = mid;
    for (int i = 0; i < 3; i++) {
        s.done = 100 + i;
        progress_update(&p, &s, i);
    }
    s.done = 9; /* fewer digits: padded, the bar stays where it was */
    progress_update(&p, &s, 3.01);
    progress_update(&p, &s, 3.02); /* within 50 ms of the last frame: not drawn */
    progress_end_epoch(&p, &s, 4);
    char text[4096];
    size_t n = 0;
    struct pollfd pf = {.fd = master, .events = POLLIN};
    while (n < sizeof text - 1 && poll(&pf, 1, 200) > 0) {
        ssize_t k = read(master, text + n, sizeof text - 1 - n);
        if (k <= 0)
            break;
        n += (size_t)k;
    }
    assert_true(n > 0);
    text[n] = '\0';
    fclose(f);
    close(master);
    assert_null(strchr(text, '\n'));
    int frames = 0;
    for (char *at = text; (at = strchr(at, '\r')) != NULL; at++) {
        char *end = strstr(at, "\033[K");
        assert_non_null(end);
        int len = (int)(end - at - 1);
        if (len > 49)
            fail_msg("a frame of %d characters on a 50-column terminal", len);
        frames++;
    }
    assert_int_equal(frames, 5); /* four updates drawn, then the erase */
    assert_non_null(strstr(text, "   9/469 batches"));
    assert_string_equal(strrchr(text, '\r'), "\r\033[K");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_progress_line_fits_every_width),
        cmocka_unit_test(test_progress_line_gives_way_in_order),
        cmocka_unit_test(test_progress_plain_lines_in_a_file),
        cmocka_unit_test(test_progress_redraws_in_place_on_a_terminal),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
