/* ndm-serve's HTTP glue over libmicrohttpd: routes, bodies gathered up to
 * --max-body, a request manager with a byte limit per prediction, the
 * library's statuses as HTTP ones. */
#include <arpa/inet.h>
#include <microhttpd.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "serve.h"

struct serve_http {
    struct MHD_Daemon *d;
    const serve_options *o;
    ndm_device dev;
    ndm_manager requests; /* system/http: a "request" child per prediction */
};

/* Set by the drain: answers close their connections, and a request that
 * starts on a kept-alive connection is refused (503). */
static atomic_bool draining;

/* One request's state, from its first call to its completion. */
typedef struct conn {
    enum serve_endpoint ep;
    char *body;
    size_t len, cap;
    bool too_large, replied, in_flight, bad_method;
    double t0;
} conn;

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static enum serve_endpoint endpoint_of(const char *url)
{
    static const char *const paths[EP_OTHER] = {"/v1/predict", "/metrics", "/debug/dump",
                                                "/healthz", "/admin/reload"};
    for (int i = 0; i < EP_OTHER; i++)
        if (!strcmp(url, paths[i]))
            return (enum serve_endpoint)i;
    return EP_OTHER;
}

/* Answer with `len` bytes of `text` (taken: freed by MHD), counting it. */
static enum MHD_Result reply(struct MHD_Connection *c, conn *k, int status, const char *type,
                             char *text, size_t len, int64_t rows)
{
    struct MHD_Response *r =
        MHD_create_response_from_buffer(len, text, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(text);
        return MHD_NO;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, type);
    if (atomic_load(&draining))
        MHD_add_response_header(r, MHD_HTTP_HEADER_CONNECTION, "close");
    if (status == 405)
        MHD_add_response_header(r, MHD_HTTP_HEADER_ALLOW,
                                k->ep == EP_PREDICT || k->ep == EP_RELOAD ? "POST" : "GET");
    enum MHD_Result ok = MHD_queue_response(c, (unsigned)status, r);
    MHD_destroy_response(r);
    k->replied = true;
    serve_metrics_count(k->ep, status, now() - k->t0, rows);
    return ok;
}

/* An error answer: {"error": "...", "status": N}. */
static enum MHD_Result reply_error(struct MHD_Connection *c, conn *k, int status,
                                   const char *msg)
{
    size_t cap = 2 * strlen(msg) + 64, at = 0;
    char *s = malloc(cap);
    if (!s)
        return MHD_NO;
    at += (size_t)snprintf(s, cap, "{\"error\":\"");
    for (const char *p = msg; *p && at + 8 < cap; p++) {
        if (*p == '"' || *p == '\\')
            s[at++] = '\\';
        s[at++] = (unsigned char)*p < 0x20 ? ' ' : *p;
    }
    at += (size_t)snprintf(s + at, cap - at, "\",\"status\":%d}\n", status);
    return reply(c, k, status, "application/json", s, at, 0);
}

/* What a failed prediction's status is over HTTP. */
static int http_status(ndm_status st)
{
    switch (st) {
    case NDM_E_QUOTA:
    case NDM_E_OOM: return 507;       /* the request would not fit (as DJL Serving answers) */
    case NDM_E_SHAPE:
    case NDM_E_DTYPE:
    case NDM_E_INVALID: return 400;
    case NDM_E_BUSY:
    case NDM_E_CLOSED: return 503;    /* the queue is full, or the server is going away */
    case NDM_E_TIMEOUT: return 504;
    default: return 500;
    }
}

static const char *const labels[10] = {"T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
                                       "Sandal",      "Shirt",   "Sneaker",  "Bag",   "Ankle boot"};

/* The answer: {"model":..,"generation":..,"predictions":[{"class":..,"label":..,"logits":[..]}]} */
static char *answer_json(const serve_model *m, const float *logits, int64_t rows, size_t *len)
{
    char *s = NULL;
    FILE *f = open_memstream(&s, len);
    if (!f)
        return NULL;
    fprintf(f, "{\"model\":\"");
    for (const char *p = m->path; *p; p++)
        fprintf(f, *p == '"' || *p == '\\' ? "\\%c" : "%c", *p);
    fprintf(f, "\",\"generation\":%llu,\"predictions\":[", (unsigned long long)m->generation);
    for (int64_t r = 0; r < rows; r++) {
        const float *l = logits + 10 * r;
        int best = 0;
        for (int i = 1; i < 10; i++)
            if (l[i] > l[best])
                best = i;
        fprintf(f, "%s{\"class\":%d,\"label\":\"%s\",\"logits\":[", r ? "," : "", best,
                labels[best]);
        for (int i = 0; i < 10; i++)
            fprintf(f, "%s%.9g", i ? "," : "", (double)l[i]);
        fprintf(f, "]}");
    }
    fprintf(f, "]}\n");
    fclose(f);
    return s;
}

static enum MHD_Result predict(serve_http *h, struct MHD_Connection *c, conn *k)
{
    serve_model *m = serve_model_get();
    if (!m)
        return reply_error(c, k, 503, "no model: the server is shutting down");
    const serve_options *o = h->o;
    char why[512] = "";
    int status = 500;
    float *logits = NULL;
    int64_t rows = 0;
    /* one manager per request: its input, the answer and (unbatched) the
     * forward pass's temporaries, under the request's byte limit */
    ndm_manager req = ndm_manager_new(h->requests, "request");
    bool ok = req.id != 0;
    if (ok && o->request_limit > 0) {
        ok = ndm_manager_set_limit(req, NDM_CPU, (uint64_t)o->request_limit) == NDM_OK &&
             (ndm_device_eq(h->dev, NDM_CPU) ||
              ndm_manager_set_limit(req, h->dev, (uint64_t)o->request_limit) == NDM_OK);
    }
    if (!ok)
        snprintf(why, sizeof why, "cannot make the request's manager: %s", ndm_last_error());
    const char *ct = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_TYPE);
    ndm_array x = ok ? serve_body_input(req, ct, k->body ? k->body : "", k->len, m->cnn,
                                        o->max_rows, &status, why, sizeof why)
                     : NDM_NULL_ARRAY;
    if (x.id) {
        rows = ndm_array_dim(x, 0);
        ndm_array y = m->batcher.id
                          ? ndm_batcher_predict_to(req, m->batcher, x, o->timeout_ms * 1000)
                          : ndm_predict_under(req, m->pred, x);
        if (y.id && !ndm_device_eq(h->dev, NDM_CPU))
            y = ndm_to(y, NDM_CPU);
        size_t nb = (size_t)rows * 10 * sizeof(float);
        logits = y.id ? malloc(nb) : NULL;
        if (logits && ndm_array_nbytes(y) == nb && ndm_array_copy_out(y, logits, nb) == NDM_OK) {
            status = 200;
        } else {
            status = http_status(ndm_last_status());
            snprintf(why, sizeof why, "%s", ndm_last_error());
        }
    }
    if (req.id && ndm_manager_close(req) < 0 && status == 200) {
        status = 500;
        snprintf(why, sizeof why, "closing the request: %s", ndm_last_error());
    }
    enum MHD_Result r;
    if (status == 200) {
        size_t len = 0;
        char *s = answer_json(m, logits, rows, &len);
        r = s ? reply(c, k, 200, "application/json", s, len, rows)
              : reply_error(c, k, 500, "out of memory writing the answer");
    } else {
        r = reply_error(c, k, status, why);
    }
    free(logits);
    serve_model_put(m);
    return r;
}

/* GET /metrics, /debug/dump: text written to a memory stream. */
static enum MHD_Result text_page(serve_http *h, struct MHD_Connection *c, conn *k)
{
    char *s = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&s, &len);
    if (!f)
        return reply_error(c, k, 500, "out of memory");
    const char *type = "text/plain; version=0.0.4; charset=utf-8";
    if (k->ep == EP_METRICS) {
        serve_metrics_write(f, h->dev);
    } else {
        type = "application/json";
        if (ndm_debug_dump_json(ndm_system(), f) < 0) {
            fclose(f);
            free(s);
            return reply_error(c, k, 500, ndm_last_error());
        }
    }
    fclose(f);
    return reply(c, k, 200, type, s, len, 0);
}

static enum MHD_Result healthz(struct MHD_Connection *c, conn *k)
{
    serve_model *m = serve_model_get();
    if (!m)
        return reply_error(c, k, 503, "shutting down");
    char *s = malloc(64);
    int n = s ? snprintf(s, 64, "ok generation %llu\n", (unsigned long long)m->generation) : 0;
    serve_model_put(m);
    return s ? reply(c, k, 200, "text/plain", s, (size_t)n, 0) : MHD_NO;
}

static enum MHD_Result reload(struct MHD_Connection *c, conn *k)
{
    /* POST /admin/reload?model=PATH, or the --model path again */
    const char *path = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "model");
    char why[1200];
    if (serve_reload(path, why, sizeof why) < 0)
        return reply_error(c, k, 400, why);
    serve_model *m = serve_model_get();
    char *s = malloc(1200);
    int n = s && m ? snprintf(s, 1200, "{\"model\":\"%s\",\"generation\":%llu}\n", m->path,
                              (unsigned long long)m->generation)
                   : 0;
    serve_model_put(m);
    return s ? reply(c, k, 200, "application/json", s, (size_t)n, 0) : MHD_NO;
}

static enum MHD_Result handle(void *cls, struct MHD_Connection *c, const char *url,
                              const char *method, const char *version, const char *upload,
                              size_t *upload_size, void **con_cls)
{
    serve_http *h = cls;
    conn *k = *con_cls;
    (void)version;
    if (!k) {
        k = calloc(1, sizeof *k);
        if (!k)
            return MHD_NO;
        *con_cls = k;
        k->t0 = now();
        k->ep = endpoint_of(url);
        bool post = k->ep == EP_PREDICT || k->ep == EP_RELOAD;
        if (atomic_load(&draining))
            return reply_error(c, k, 503, "shutting down: the requests in flight are answered, "
                                          "no new ones");
        /* everything else answers on the last call, once MHD knows the
         * body (if any) is read: an answer queued earlier closes the
         * connection */
        k->bad_method = k->ep != EP_OTHER && strcmp(method, post ? "POST" : "GET") &&
                        (post || strcmp(method, "HEAD"));
        const char *cl =
            MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
        if (cl && strtoll(cl, NULL, 10) > h->o->max_body) {
            char msg[128];
            snprintf(msg, sizeof msg, "the body is %s bytes, above --max-body %lld", cl,
                     (long long)h->o->max_body);
            return reply_error(c, k, 413, msg);
        }
        if (k->ep == EP_PREDICT && !k->bad_method) {
            serve_metrics_in_flight(1);
            k->in_flight = true;
        }
        return MHD_YES;
    }
    if (*upload_size) {
        /* a chunked body without a length is cut off at --max-body too */
        if (!k->replied && !k->too_large) {
            size_t need = k->len + *upload_size;
            if ((int64_t)need > h->o->max_body) {
                k->too_large = true;
            } else {
                if (need > k->cap) {
                    size_t cap = k->cap ? k->cap : 4096;
                    while (cap < need)
                        cap *= 2;
                    char *b = realloc(k->body, cap);
                    if (!b)
                        return MHD_NO;
                    k->body = b;
                    k->cap = cap;
                }
                memcpy(k->body + k->len, upload, *upload_size);
                k->len = need;
            }
        }
        *upload_size = 0;
        return MHD_YES;
    }
    if (k->replied)
        return MHD_YES;
    if (k->ep == EP_OTHER) {
        char msg[400];
        snprintf(msg, sizeof msg, "no such endpoint: %.200s (POST /v1/predict, GET /metrics, "
                 "GET /debug/dump, GET /healthz, POST /admin/reload)", url);
        return reply_error(c, k, 404, msg);
    }
    if (k->bad_method)
        return reply_error(c, k, 405, k->ep == EP_PREDICT || k->ep == EP_RELOAD ? "use POST"
                                                                                : "use GET");
    if (k->too_large) {
        char msg[128];
        snprintf(msg, sizeof msg, "the body is above --max-body %lld bytes",
                 (long long)h->o->max_body);
        return reply_error(c, k, 413, msg);
    }
    switch (k->ep) {
    case EP_PREDICT: return predict(h, c, k);
    case EP_RELOAD: return reload(c, k);
    case EP_HEALTHZ: return healthz(c, k);
    default: return text_page(h, c, k);
    }
}

static void completed(void *cls, struct MHD_Connection *c, void **con_cls,
                      enum MHD_RequestTerminationCode why)
{
    conn *k = *con_cls;
    (void)cls;
    (void)c;
    (void)why;
    if (!k)
        return;
    if (k->in_flight)
        serve_metrics_in_flight(-1);
    free(k->body);
    free(k);
    *con_cls = NULL;
}

serve_http *serve_http_start(const serve_options *o, ndm_device dev, ndm_manager requests,
                             int *port, char *why, size_t n)
{
    serve_http *h = calloc(1, sizeof *h);
    if (!h) {
        snprintf(why, n, "out of memory");
        return NULL;
    }
    h->o = o;
    h->dev = dev;
    h->requests = requests;
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)o->port)};
    if (inet_pton(AF_INET, o->host, &sa.sin_addr) != 1) {
        snprintf(why, n, "--host %s is not an IPv4 address", o->host);
        free(h);
        return NULL;
    }
    /* A thread per connection (--http-threads 0, the default) lets every
     * connection wait in the batcher at once; a pool of N threads answers N
     * at a time. On 2 cores (bench/serve_http.py, the MLP) the two were
     * even at 1 connection; at 8 and 64 a thread per connection answered
     * 1.2-1.3x the requests of a pool of 2 unbatched and 1.5-2x batched,
     * with a p99 of 36 ms against 131 ms at 64 batched. */
    unsigned flags = MHD_USE_AUTO | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ITC |
                     MHD_USE_ERROR_LOG;
    if (o->http_threads == 0)
        flags |= MHD_USE_THREAD_PER_CONNECTION;
    h->d = MHD_start_daemon(flags, 0, NULL, NULL, handle, h,
                            MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&sa,
                            MHD_OPTION_NOTIFY_COMPLETED, completed, h,
                            MHD_OPTION_CONNECTION_TIMEOUT, 30u,
                            MHD_OPTION_CONNECTION_LIMIT, 1024u,
                            MHD_OPTION_LISTEN_BACKLOG_SIZE, 1024u,
                            o->http_threads > 0 ? MHD_OPTION_THREAD_POOL_SIZE : MHD_OPTION_END,
                            (unsigned)o->http_threads, MHD_OPTION_END);
    if (!h->d) {
        snprintf(why, n, "cannot listen on %s:%d (in use, or not an address of this machine)",
                 o->host, o->port);
        free(h);
        return NULL;
    }
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(h->d, MHD_DAEMON_INFO_BIND_PORT);
    *port = info ? (int)info->port : o->port;
    return h;
}

void serve_http_quiesce(serve_http *h)
{
    atomic_store(&draining, true);
    MHD_socket s = MHD_quiesce_daemon(h->d);
    if (s != MHD_INVALID_SOCKET)
        close(s);
}

void serve_http_stop(serve_http *h)
{
    MHD_stop_daemon(h->d);
    free(h);
}
