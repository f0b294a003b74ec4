/* Private error helpers: sites, the per-thread failure record, warnings.
 * Every layer of ndm reports failures through these. */
#ifndef NDM_ERROR_INTERNAL_H
#define NDM_ERROR_INTERNAL_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ndm/base.h"
#include "ndm/status.h"

typedef struct ndm__site {
    const char *file;
    const char *func;
    int line;
} ndm__site;

#define NDM__SITE ((ndm__site){ndm_file_, ndm_func_, ndm_line_})
#define NDM__NO_SITE ((ndm__site){NULL, NULL, 0})
#define NDM__SITE_ARGS(s) (s).file, (s).line, (s).func

/* Record a failure for this thread: "<api>: <message> (at file:line in func)".
 * `api` is the public function's name (a trailing "_at" is dropped). Returns st. */
ndm_status ndm__fail(ndm_status st, const char *api, ndm__site where, const char *fmt, ...)
    NDM_PRINTF(4, 5);
ndm_status ndm__vfail(ndm_status st, const char *api, ndm__site where, const char *fmt,
                      va_list ap);
/* A null handle given to `api`: records NDM_E_NULL ("null <what> handle")
 * unless this thread's last status is already an error, which stays in
 * place (a null handle most often comes from that failure). Returns the
 * thread's last status afterwards. */
ndm_status ndm__fail_null(const char *api, ndm__site where, const char *what);
/* Quiet failures: between ndm__quiet_begin and ndm__quiet_end this thread's
 * failures are recorded (the code on the failure path reads them) but not
 * logged, and the end puts back the last error the thread had before. For
 * work done ahead whose failure is reported, if at all, when the work is
 * done again where it was asked for (a loader's worker threads), or raised
 * again on the thread that asked (a batcher's worker and its requests).
 * Warnings are still logged. */
typedef struct ndm__quiet_state {
    ndm_status status;
    bool quiet;
    char msg[1024];
} ndm__quiet_state;
void ndm__quiet_begin(ndm__quiet_state *saved);
void ndm__quiet_end(const ndm__quiet_state *saved);
/* How many failures this thread has recorded: a caller that runs user code
 * (a module's forward callback) tells from it whether a null result came
 * with an error of its own. */
uint64_t ndm__fail_count(void);
/* Send a warning to the log callback. */
void ndm__warn(const char *fmt, ...) NDM_PRINTF(1, 2);
/* Formats a site as "file:line (func)" into buf. */
const char *ndm__site_str(ndm__site s, char *buf, size_t n);

/* A public function that calls other public ones on the way (a layer's
 * constructor makes its parameters with ndm_empty, a loss gathers with
 * ndm_gather): NDM__ENTRY(api) at its top makes every failure until it
 * returns read as the failure of `api`, the function the user called (the
 * outermost such function, when they nest). GCC and Clang's cleanup
 * attribute ends it on every return. */
const char *ndm__entry_begin(const char *api);
void ndm__entry_end(const char **saved);
#define NDM__ENTRY(api)                                                         \
    const char *ndm__entry_saved_ __attribute__((cleanup(ndm__entry_end), unused)) = \
        ndm__entry_begin(api)

#endif
