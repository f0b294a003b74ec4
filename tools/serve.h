/* ndm-serve: what its parts share. serve_main.c reads the options and runs
 * the lifecycle, serve_model.c loads and swaps models, serve_body.c turns a
 * request body into an input array, serve_http.c answers HTTP,
 * serve_metrics.c counts and writes the Prometheus text. */
#ifndef NDM_SERVE_TOOL_H
#define NDM_SERVE_TOOL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "ndm/ndm.h"

/* ---- options ------------------------------------------------------------------ */

typedef struct serve_options {
    const char *model_path;  /* --model: the checkpoint `ndm-fashion train` saved */
    const char *host;        /* --host: the address to bind (a loopback one by default) */
    int port;                /* --port: 0 picks a free port */
    int http_threads;        /* --http-threads: 0, a thread per connection; N, a pool of N */
    int64_t max_body;        /* --max-body: larger bodies get 413 before parsing */
    int64_t request_limit;   /* --request-limit: bytes one request may use (507 above) */
    int64_t max_rows;        /* --max-rows: images in one request */
    int64_t batch;           /* --batch: 0, no batching; N, an ndm_batcher of max_batch N */
    int64_t max_delay_us;    /* --max-delay-us: the batcher's wait for company */
    int64_t queue;           /* --queue: the batcher's queue bound (0: its default) */
    int64_t timeout_ms;      /* --timeout-ms: a batched request's deadline (504 after) */
    int64_t drain_s;         /* --drain-s: the longest SIGTERM waits for requests in flight */
    const char *device;      /* --device: where the model runs */
    const char *port_file;   /* --port-file: where to write the port once listening */
} serve_options;

/* ---- models --------------------------------------------------------------------- */

/* One loaded checkpoint: its model manager (system/model: the weights, the
 * predictor, the batcher), held by the requests that use it. The last
 * holder of a replaced model closes it. */
typedef struct serve_model {
    ndm_manager model;
    ndm_predictor pred;
    ndm_batcher batcher;    /* null without --batch */
    bool cnn;
    uint64_t generation;    /* 1 for the first model, +1 per reload */
    char path[1024];
    atomic_long refs;
    struct serve_model *next_open; /* the list of open models */
} serve_model;

/* Load `path` into a fresh model manager on `dev`, with a batcher when
 * o->batch > 0. NULL with the reason in why. */
serve_model *serve_model_load(const serve_options *o, ndm_device dev, const char *path,
                              uint64_t generation, char *why, size_t n);
/* The current model, held (serve_model_put() when done); NULL after close. */
serve_model *serve_model_get(void);
/* Drop a hold: the last one, on a replaced model, closes its manager. */
void serve_model_put(serve_model *m);
/* Make m current (taking the caller's hold); the replaced model closes when
 * its last request ends. */
void serve_model_swap(serve_model *m);
/* Live arrays and bytes on dev summed over every open model (the current
 * one and those replaced but still answering). */
void serve_models_stats(ndm_device dev, ndm_stats *sum);
/* How many replaced models still wait for their requests. */
long serve_models_retired(void);

/* ---- request bodies ---------------------------------------------------------------- */

/* The body as images for the network: an array in `req` of shape
 * (rows, 28, 28) float32 (or (rows, 1, 28, 28) for the CNN), from JSON
 * ({"inputs": nested lists} or nested lists), .npy (application/x-npy, or
 * any body starting with the .npy magic) or raw little-endian float32
 * (application/octet-stream). The null array with an HTTP status in
 * *status (400 malformed or a wrong shape, 507 over the request's limit)
 * and a message in why. */
ndm_array serve_body_input(ndm_manager req, const char *content_type, const char *body,
                           size_t len, bool cnn, int64_t max_rows, int *status, char *why,
                           size_t n);

/* ---- metrics ------------------------------------------------------------------------ */

enum serve_endpoint {
    EP_PREDICT,
    EP_METRICS,
    EP_DUMP,
    EP_HEALTHZ,
    EP_RELOAD,
    EP_OTHER,
    EP_COUNT
};

/* Count one answered request (seconds and rows for predictions). */
void serve_metrics_count(enum serve_endpoint ep, int status, double seconds, int64_t rows);
void serve_metrics_reload(bool ok);
void serve_metrics_in_flight(int delta);
long serve_metrics_in_flight_now(void);
/* The managers whose live arrays and bytes /metrics shows. */
void serve_metrics_watch(const char *name, ndm_manager m);
/* Write the Prometheus text exposition of everything to f. */
void serve_metrics_write(FILE *f, ndm_device dev);

/* ---- HTTP ------------------------------------------------------------------------------ */

typedef struct serve_http serve_http;
/* Start listening (the port chosen is in *port). NULL with why. */
serve_http *serve_http_start(const serve_options *o, ndm_device dev, ndm_manager requests,
                             int *port, char *why, size_t n);
/* Stop accepting connections; requests in flight go on. */
void serve_http_quiesce(serve_http *h);
/* Close every connection and stop the threads. */
void serve_http_stop(serve_http *h);
/* Reload: a new model from path (NULL: the one the options name); 0 or -1
 * with why. Serialised: one reload at a time. */
int serve_reload(const char *path, char *why, size_t n);
/* The options and device the reloads use (set once by main). */
void serve_reload_setup(const serve_options *o, ndm_device dev);

#endif
