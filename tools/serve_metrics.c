/* ndm-serve's metrics: counters kept with atomics on the request path, and
 * the Prometheus text exposition format that GET /metrics answers. */
#include <string.h>

#include "serve.h"

static const char *const endpoint_names[EP_COUNT] = {
    "/v1/predict", "/metrics", "/debug/dump", "/healthz", "/admin/reload", "other",
};

/* The statuses ndm-serve answers, in the order /metrics lists them. */
static const int statuses[] = {200, 400, 404, 405, 413, 415, 500, 503, 504, 507};
enum { NSTATUS = (int)(sizeof statuses / sizeof statuses[0]) };

/* Latency buckets (seconds) and rows-per-request buckets, Prometheus's
 * cumulative "le" form written from per-bucket counts. */
static const double lat_le[] = {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01,
                                0.025,  0.05,    0.1,    0.25,  0.5,    1,     2.5};
enum { NLAT = (int)(sizeof lat_le / sizeof lat_le[0]) };
static const int64_t rows_le[] = {1, 2, 4, 8, 16, 32, 64, 128, 256};
enum { NROWS = (int)(sizeof rows_le / sizeof rows_le[0]) };

static atomic_ullong requests[EP_COUNT][NSTATUS + 1]; /* the last: any other status */
static atomic_ullong lat_bucket[NLAT + 1];
static atomic_ullong lat_count, lat_sum_ns;
static atomic_ullong rows_bucket[NROWS + 1];
static atomic_ullong rows_sum;
static atomic_ullong reloads[2];
static atomic_long in_flight;

enum { NWATCH = 8 };
static pthread_mutex_t watch_lock = PTHREAD_MUTEX_INITIALIZER;
static struct {
    char name[32];
    ndm_manager m;
} watched[NWATCH];
static int nwatched;

static int status_index(int status)
{
    for (int i = 0; i < NSTATUS; i++)
        if (statuses[i] == status)
            return i;
    return NSTATUS;
}

void serve_metrics_count(enum serve_endpoint ep, int status, double seconds, int64_t rows)
{
    atomic_fetch_add(&requests[ep][status_index(status)], 1);
    if (ep != EP_PREDICT)
        return;
    int b = 0;
    while (b < NLAT && seconds > lat_le[b])
        b++;
    atomic_fetch_add(&lat_bucket[b], 1);
    atomic_fetch_add(&lat_count, 1);
    atomic_fetch_add(&lat_sum_ns, (unsigned long long)(seconds * 1e9));
    if (status == 200 && rows > 0) {
        int r = 0;
        while (r < NROWS && rows > rows_le[r])
            r++;
        atomic_fetch_add(&rows_bucket[r], 1);
        atomic_fetch_add(&rows_sum, (unsigned long long)rows);
    }
}

void serve_metrics_reload(bool ok) { atomic_fetch_add(&reloads[ok ? 0 : 1], 1); }
void serve_metrics_in_flight(int delta) { atomic_fetch_add(&in_flight, delta); }
long serve_metrics_in_flight_now(void) { return atomic_load(&in_flight); }

void serve_metrics_watch(const char *name, ndm_manager m)
{
    pthread_mutex_lock(&watch_lock);
    if (nwatched < NWATCH) {
        snprintf(watched[nwatched].name, sizeof watched[nwatched].name, "%s", name);
        watched[nwatched++].m = m;
    }
    pthread_mutex_unlock(&watch_lock);
}

static void histogram(FILE *f, const char *name, const char *help, int n, const double *le,
                      atomic_ullong *bucket, unsigned long long count, double sum)
{
    fprintf(f, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    unsigned long long cum = 0;
    for (int i = 0; i < n; i++) {
        cum += atomic_load(&bucket[i]);
        fprintf(f, "%s_bucket{le=\"%g\"} %llu\n", name, le[i], cum);
    }
    cum += atomic_load(&bucket[n]);
    fprintf(f, "%s_bucket{le=\"+Inf\"} %llu\n%s_sum %.9g\n%s_count %llu\n", name, cum, name, sum,
            name, count);
}

static void managers(FILE *f, ndm_device dev)
{
    char devname[32];
    ndm_device_str(dev, devname, sizeof devname);
    fprintf(f, "# HELP ndm_manager_live_arrays Live arrays in a top-level manager's subtree.\n"
               "# TYPE ndm_manager_live_arrays gauge\n");
    pthread_mutex_lock(&watch_lock);
    /* a model being replaced and the current one are both "model": summed */
    serve_model *m = serve_model_get();
    ndm_stats ms;
    serve_models_stats(dev, &ms);
    fprintf(f, "ndm_manager_live_arrays{manager=\"model\"} %llu\n",
            (unsigned long long)ms.live_arrays);
    ndm_stats ws[NWATCH];
    for (int i = 0; i < nwatched; i++) {
        if (ndm_manager_stats(watched[i].m, dev, NDM_STATS_SUBTREE, &ws[i]) < 0)
            ws[i] = (ndm_stats){0};
        fprintf(f, "ndm_manager_live_arrays{manager=\"%s\"} %llu\n", watched[i].name,
                (unsigned long long)ws[i].live_arrays);
    }
    fprintf(f, "# HELP ndm_manager_live_bytes Live bytes in a top-level manager's subtree, "
               "per device.\n# TYPE ndm_manager_live_bytes gauge\n");
    fprintf(f, "ndm_manager_live_bytes{manager=\"model\",device=\"%s\"} %llu\n", devname,
            (unsigned long long)ms.live_bytes);
    for (int i = 0; i < nwatched; i++)
        fprintf(f, "ndm_manager_live_bytes{manager=\"%s\",device=\"%s\"} %llu\n",
                watched[i].name, devname, (unsigned long long)ws[i].live_bytes);
    pthread_mutex_unlock(&watch_lock);
    fprintf(f, "# HELP ndm_serve_models_retired Replaced models still answering requests.\n"
               "# TYPE ndm_serve_models_retired gauge\nndm_serve_models_retired %ld\n",
            serve_models_retired());
    fprintf(f, "# HELP ndm_serve_model_generation The model's number: 1, then +1 per reload.\n"
               "# TYPE ndm_serve_model_generation gauge\nndm_serve_model_generation %llu\n",
            m ? (unsigned long long)m->generation : 0ull);
    if (m) {
        ndm_batcher_stats bs = {0};
        if (m->batcher.id && ndm_batcher_stats_get(m->batcher, &bs) < 0)
            bs = (ndm_batcher_stats){0};
        fprintf(f, "# HELP ndm_serve_queue_depth Requests waiting in the batcher's queue.\n"
                   "# TYPE ndm_serve_queue_depth gauge\nndm_serve_queue_depth %llu\n",
                (unsigned long long)bs.queue_depth);
        fprintf(f, "# HELP ndm_serve_batches_total Forward passes the batcher ran (this model).\n"
                   "# TYPE ndm_serve_batches_total counter\nndm_serve_batches_total %llu\n",
                (unsigned long long)bs.batches);
        fprintf(f, "# HELP ndm_serve_batch_rows_total Rows in those passes.\n"
                   "# TYPE ndm_serve_batch_rows_total counter\nndm_serve_batch_rows_total %llu\n",
                (unsigned long long)bs.rows);
        fprintf(f, "# HELP ndm_serve_batch_rows_max The most rows in one pass.\n"
                   "# TYPE ndm_serve_batch_rows_max gauge\nndm_serve_batch_rows_max %llu\n",
                (unsigned long long)bs.largest_batch);
    }
    serve_model_put(m);
}

static void allocator(FILE *f, ndm_device dev)
{
    ndm_device devs[2] = {NDM_CPU, dev};
    int ndev = ndm_device_eq(dev, NDM_CPU) ? 1 : 2;
    const char *what[3] = {"allocated", "reserved", "peak_allocated"};
    const char *help[3] = {"Bytes of live blocks.", "Bytes of segments held from the device.",
                           "The most bytes of live blocks at once."};
    for (int k = 0; k < 3; k++) {
        fprintf(f, "# HELP ndm_allocator_%s_bytes %s\n# TYPE ndm_allocator_%s_bytes gauge\n",
                what[k], help[k], what[k]);
        for (int d = 0; d < ndev; d++) {
            ndm_memory_stats s;
            char name[32];
            ndm_device_str(devs[d], name, sizeof name);
            if (ndm_memory_stats_get(devs[d], &s) < 0)
                continue;
            int64_t v = k == 0   ? s.allocated_bytes[NDM_POOL_ALL].current
                        : k == 1 ? s.reserved_bytes[NDM_POOL_ALL].current
                                 : s.allocated_bytes[NDM_POOL_ALL].peak;
            fprintf(f, "ndm_allocator_%s_bytes{device=\"%s\"} %lld\n", what[k], name,
                    (long long)v);
        }
    }
}

void serve_metrics_write(FILE *f, ndm_device dev)
{
    fprintf(f, "# HELP ndm_serve_requests_total Requests answered, by endpoint and status.\n"
               "# TYPE ndm_serve_requests_total counter\n");
    unsigned long long errors[NSTATUS + 1] = {0};
    for (int e = 0; e < EP_COUNT; e++)
        for (int s = 0; s <= NSTATUS; s++) {
            unsigned long long v = atomic_load(&requests[e][s]);
            if (s < NSTATUS && statuses[s] >= 400)
                errors[s] += v;
            if (s == NSTATUS)
                errors[s] += v;
            if (!v && !(s == 0 && e <= EP_HEALTHZ))
                continue; /* a line per status seen, and the 200s of the main ones */
            if (s < NSTATUS)
                fprintf(f, "ndm_serve_requests_total{endpoint=\"%s\",status=\"%d\"} %llu\n",
                        endpoint_names[e], statuses[s], v);
            else
                fprintf(f, "ndm_serve_requests_total{endpoint=\"%s\",status=\"other\"} %llu\n",
                        endpoint_names[e], v);
        }
    fprintf(f, "# HELP ndm_serve_errors_total Requests answered with a status of 400 or above.\n"
               "# TYPE ndm_serve_errors_total counter\n");
    for (int s = 0; s <= NSTATUS; s++)
        if (s == NSTATUS || statuses[s] >= 400) {
            if (s < NSTATUS)
                fprintf(f, "ndm_serve_errors_total{status=\"%d\"} %llu\n", statuses[s], errors[s]);
            else
                fprintf(f, "ndm_serve_errors_total{status=\"other\"} %llu\n", errors[s]);
        }
    histogram(f, "ndm_serve_request_duration_seconds",
              "Time from a prediction's first byte to its answer.", NLAT, lat_le, lat_bucket,
              atomic_load(&lat_count), (double)atomic_load(&lat_sum_ns) * 1e-9);
    double rle[NROWS];
    unsigned long long rcount = 0;
    for (int i = 0; i < NROWS; i++)
        rle[i] = (double)rows_le[i];
    for (int i = 0; i <= NROWS; i++)
        rcount += atomic_load(&rows_bucket[i]);
    histogram(f, "ndm_serve_request_rows", "Images per answered prediction (its batch size).",
              NROWS, rle, rows_bucket, rcount, (double)atomic_load(&rows_sum));
    fprintf(f, "# HELP ndm_serve_in_flight Predictions being answered now.\n"
               "# TYPE ndm_serve_in_flight gauge\nndm_serve_in_flight %ld\n",
            atomic_load(&in_flight));
    fprintf(f, "# HELP ndm_serve_reloads_total Model reloads, by result.\n"
               "# TYPE ndm_serve_reloads_total counter\n"
               "ndm_serve_reloads_total{result=\"ok\"} %llu\n"
               "ndm_serve_reloads_total{result=\"failed\"} %llu\n",
            atomic_load(&reloads[0]), atomic_load(&reloads[1]));
    managers(f, dev);
    allocator(f, dev);
}
