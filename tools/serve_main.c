/* ndm-serve: an HTTP service for the Fashion-MNIST checkpoints of
 * ndm-fashion train. Options, signals (SIGHUP reloads, SIGTERM drains and
 * exits) and the lifecycle of its managers. */
#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "serve.h"

static const char usage_text[] =
    "usage: ndm-serve --model FILE [options]\n"
    "Serve a checkpoint of `ndm-fashion train` (the Fashion MLP or CNN) over HTTP:\n"
    "  POST /v1/predict    images as JSON ({\"inputs\": [[784 values in 0..1], ...]}),\n"
    "                      .npy (application/x-npy; uint8 pixels are scaled by 1/255)\n"
    "                      or raw float32 (application/octet-stream)\n"
    "  GET  /metrics       Prometheus text: requests, errors, latency, batch sizes,\n"
    "                      queue depth, managers' live arrays and bytes, the allocator\n"
    "  GET  /debug/dump    the manager tree as JSON (ndm_debug_dump_json)\n"
    "  GET  /healthz       200 while a model is loaded\n"
    "  POST /admin/reload  load --model again, or ?model=FILE; SIGHUP does the same\n"
    "SIGTERM (or SIGINT) stops accepting, answers the requests in flight, closes\n"
    "every manager and exits 0 (NDM_LEAK_REPORT=1 prints the leak report).\n"
    "options:\n"
    "  --model FILE         the checkpoint (required)\n"
    "  --host ADDR          IPv4 address to bind (127.0.0.1)\n"
    "  --port N             TCP port; 0 picks a free one (8080)\n"
    "  --port-file FILE     write the port there once listening\n"
    "  --http-threads N     0: a thread per connection; N: a pool of N threads (0)\n"
    "  --max-body BYTES     larger bodies get 413 before parsing (4194304)\n"
    "  --request-limit BYTES  the most memory one request may use; 507 above (67108864)\n"
    "  --max-rows N         images in one request (256)\n"
    "  --batch N            batch concurrent requests up to N rows (0: off)\n"
    "  --max-delay-us D     how long a batch waits for more requests (200)\n"
    "  --queue N            the batcher's queue bound; 503 when full (8 x batch)\n"
    "  --timeout-ms N       a batched request's deadline; 504 after (10000)\n"
    "  --drain-s N          the longest SIGTERM waits for requests in flight (30)\n"
    "  --device DEV         where the model runs: cpu, cuda or cuda:N (cpu)\n"
    "  --verbose            print the library's errors (each is also in its answer)\n"
    "  --help               this text\n";

static bool verbose;
static int signal_pipe[2];

static void on_signal(int sig)
{
    unsigned char c = (unsigned char)sig;
    int saved = errno;
    if (write(signal_pipe[1], &c, 1) < 0) {
        /* the pipe is full: signals enough are pending */
    }
    errno = saved;
}

/* Errors are answered to the client that caused them (a malformed body is
 * not the server's failure): printed with --verbose only. */
static void log_fn(ndm_log_level level, const char *msg, void *ud)
{
    if (level != NDM_LOG_ERROR || verbose)
        ndm_log_stderr(level, msg, ud);
}

static bool parse_int(const char *opt, const char *text, int64_t lo, int64_t hi, int64_t *out)
{
    char *end = NULL;
    errno = 0;
    long long v = strtoll(text, &end, 10);
    if (!*text || *end || errno == ERANGE || v < lo || v > hi) {
        fprintf(stderr, "ndm-serve: %s wants an integer from %lld to %lld, not '%s'\n", opt,
                (long long)lo, (long long)hi, text);
        return false;
    }
    *out = v;
    return true;
}

static bool parse_device(const char *text, ndm_device *out)
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
    long i = strtol(text + 5, &end, 10);
    if (*end || i > 1024)
        return false;
    *out = NDM_CUDA((int)i);
    return true;
}

static int parse_options(int argc, char **argv, serve_options *o)
{
    enum { O_MODEL = 256, O_HOST, O_PORT, O_PORT_FILE, O_THREADS, O_MAX_BODY, O_LIMIT, O_ROWS,
           O_BATCH, O_DELAY, O_QUEUE, O_TIMEOUT, O_DRAIN, O_DEVICE, O_VERBOSE, O_HELP };
    static const struct option longs[] = {
        {"model", required_argument, NULL, O_MODEL},
        {"host", required_argument, NULL, O_HOST},
        {"port", required_argument, NULL, O_PORT},
        {"port-file", required_argument, NULL, O_PORT_FILE},
        {"http-threads", required_argument, NULL, O_THREADS},
        {"max-body", required_argument, NULL, O_MAX_BODY},
        {"request-limit", required_argument, NULL, O_LIMIT},
        {"max-rows", required_argument, NULL, O_ROWS},
        {"batch", required_argument, NULL, O_BATCH},
        {"max-delay-us", required_argument, NULL, O_DELAY},
        {"queue", required_argument, NULL, O_QUEUE},
        {"timeout-ms", required_argument, NULL, O_TIMEOUT},
        {"drain-s", required_argument, NULL, O_DRAIN},
        {"device", required_argument, NULL, O_DEVICE},
        {"verbose", no_argument, NULL, O_VERBOSE},
        {"help", no_argument, NULL, O_HELP},
        {NULL, 0, NULL, 0},
    };
    *o = (serve_options){.host = "127.0.0.1", .port = 8080, .max_body = 4 << 20,
                         .request_limit = 64 << 20, .max_rows = 256, .max_delay_us = 200,
                         .timeout_ms = 10000, .drain_s = 30, .device = "cpu"};
    int c;
    int64_t v = 0;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "", longs, NULL)) != -1) {
        const char *name = optind > 1 ? argv[optind - 1] : "";
        bool ok = true;
        switch (c) {
        case O_MODEL: o->model_path = optarg; break;
        case O_HOST: o->host = optarg; break;
        case O_PORT_FILE: o->port_file = optarg; break;
        case O_DEVICE: o->device = optarg; break;
        case O_VERBOSE: verbose = true; break;
        case O_HELP: fputs(usage_text, stdout); return 1;
        case O_PORT: ok = parse_int("--port", optarg, 0, 65535, &v) && ((o->port = (int)v), 1); break;
        case O_THREADS:
            ok = parse_int("--http-threads", optarg, 0, 1024, &v) && ((o->http_threads = (int)v), 1);
            break;
        case O_MAX_BODY: ok = parse_int("--max-body", optarg, 1, INT64_MAX / 2, &o->max_body); break;
        case O_LIMIT: ok = parse_int("--request-limit", optarg, 0, INT64_MAX / 4096, &o->request_limit); break;
        case O_ROWS: ok = parse_int("--max-rows", optarg, 1, 1 << 20, &o->max_rows); break;
        case O_BATCH: ok = parse_int("--batch", optarg, 0, 4096, &o->batch); break;
        case O_DELAY: ok = parse_int("--max-delay-us", optarg, 0, 10000000, &o->max_delay_us); break;
        case O_QUEUE: ok = parse_int("--queue", optarg, 0, 1 << 20, &o->queue); break;
        case O_TIMEOUT: ok = parse_int("--timeout-ms", optarg, 0, 86400000, &o->timeout_ms); break;
        case O_DRAIN: ok = parse_int("--drain-s", optarg, 0, 3600, &o->drain_s); break;
        default:
            fprintf(stderr, "ndm-serve: unknown or incomplete option '%s' (ndm-serve --help)\n",
                    name);
            return -1;
        }
        if (!ok)
            return -1;
    }
    if (optind < argc) {
        fprintf(stderr, "ndm-serve: unexpected argument '%s' (ndm-serve --help)\n", argv[optind]);
        return -1;
    }
    if (!o->model_path) {
        fprintf(stderr, "ndm-serve: which model? --model FILE (a checkpoint of ndm-fashion "
                        "train)\n");
        return -1;
    }
    struct in_addr addr;
    if (inet_pton(AF_INET, o->host, &addr) != 1) {
        fprintf(stderr, "ndm-serve: --host wants an IPv4 address such as 127.0.0.1, not '%s'\n",
                o->host);
        return -1;
    }
    if (o->batch && o->max_rows > o->batch)
        o->max_rows = o->batch; /* a request is at most one batch */
    return 0;
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv)
{
    serve_options o;
    int pr = parse_options(argc, argv, &o);
    if (pr)
        return pr > 0 ? 0 : 2;
    ndm_device dev;
    if (!parse_device(o.device, &dev)) {
        fprintf(stderr, "ndm-serve: --device wants cpu, cuda or cuda:N, not '%s'\n", o.device);
        return 2;
    }
    ndm_set_log_fn(log_fn, NULL);
    /* SIGTERM, SIGINT and SIGHUP: a handler (on whichever thread the
     * kernel picks, some started before main by the BLAS) writes the
     * signal's number to a pipe that this thread reads */
    if (pipe(signal_pipe) != 0) {
        fprintf(stderr, "ndm-serve: cannot make a pipe for the signals\n");
        return 1;
    }
    struct sigaction sa = {.sa_handler = on_signal};
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);
    signal(SIGPIPE, SIG_IGN); /* a client that hangs up is a failed send, not an exit */

    char why[1400];
    serve_reload_setup(&o, dev);
    serve_model *m = serve_model_load(&o, dev, o.model_path, 1, why, sizeof why);
    if (!m) {
        fprintf(stderr, "ndm-serve: %s\n", why);
        return 1;
    }
    serve_model_swap(m);
    ndm_manager requests = ndm_manager_new(ndm_system(), "http");
    if (!requests.id) {
        fprintf(stderr, "ndm-serve: cannot make the requests' manager: %s\n", ndm_last_error());
        return 1;
    }
    serve_metrics_watch("http", requests);
    int port = 0;
    serve_http *h = serve_http_start(&o, dev, requests, &port, why, sizeof why);
    if (!h) {
        fprintf(stderr, "ndm-serve: %s\n", why);
        serve_model_swap(NULL);
        (void)ndm_manager_close(requests);
        return 1;
    }
    printf("ndm-serve: %s model from %s on %s, listening on http://%s:%d (%s, batching %s)\n",
           m->cnn ? "CNN" : "MLP", o.model_path, o.device, o.host, port,
           o.http_threads ? "a thread pool" : "a thread per connection",
           o.batch ? "on" : "off");
    fflush(stdout);
    if (o.port_file) {
        /* written whole, then renamed, so a reader never sees half a port */
        char tmp[1100];
        snprintf(tmp, sizeof tmp, "%s.tmp", o.port_file);
        FILE *f = fopen(tmp, "w");
        if (!f || fprintf(f, "%d\n", port) < 0 || fclose(f) != 0 || rename(tmp, o.port_file)) {
            fprintf(stderr, "ndm-serve: cannot write --port-file %s\n", o.port_file);
            serve_http_stop(h);
            serve_model_swap(NULL);
            (void)ndm_manager_close(requests);
            return 1;
        }
    }

    for (;;) {
        /* a timeout, so that a runtime that defers handlers to the next
         * call it intercepts (ThreadSanitizer's) gets one */
        struct pollfd pf = {.fd = signal_pipe[0], .events = POLLIN};
        unsigned char sig = 0;
        if (poll(&pf, 1, 100) <= 0 || read(signal_pipe[0], &sig, 1) != 1)
            continue;
        if (sig == SIGHUP) {
            if (serve_reload(NULL, why, sizeof why) < 0)
                fprintf(stderr, "ndm-serve: SIGHUP: the reload failed, the model stays: %s\n", why);
            else
                printf("ndm-serve: SIGHUP: reloaded %s\n", o.model_path);
            fflush(stdout);
            continue;
        }
        break;
    }
    /* drain: no new connections; the requests in flight are answered */
    serve_http_quiesce(h);
    long waiting = serve_metrics_in_flight_now();
    double end = now() + (double)o.drain_s;
    while (serve_metrics_in_flight_now() > 0 && now() < end) {
        struct timespec ms = {0, 1000000};
        nanosleep(&ms, NULL);
    }
    long left = serve_metrics_in_flight_now();
    serve_http_stop(h);
    serve_model_swap(NULL); /* closes the model (the last request has ended) */
    int rc = 0;
    if (ndm_manager_close(requests) < 0) {
        fprintf(stderr, "ndm-serve: closing the requests' manager: %s\n", ndm_last_error());
        rc = 1;
    }
    printf("ndm-serve: stopped: %ld predictions in flight at the signal were answered%s\n",
           waiting - left, left ? ", some not within --drain-s" : "");
    fflush(stdout);
    return left ? 1 : rc;
}
