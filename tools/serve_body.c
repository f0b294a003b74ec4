/* ndm-serve's request bodies: JSON, .npy or raw float32 turned into the
 * network's input, with a 400 that says what is wrong with a bad one. */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "fashion_net.h"
#include "serve.h"

/* the most axes of an input, JSON lists nested or .npy axes */
#define JSON_MAX_DEPTH 8

static void say(char *why, size_t n, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, n, fmt, ap);
    va_end(ap);
}

/* ---- JSON: nested lists of numbers ----------------------------------------------- */

typedef struct json {
    const char *start, *p, *end;
    float *v;
    size_t nv, cap;
    int depth;                      /* the depth of the numbers (-1: none seen yet) */
    int64_t dims[JSON_MAX_DEPTH];   /* the length first seen at each depth */
    char *why;
    size_t n;
} json;

static void skip_ws(json *j)
{
    while (j->p < j->end && isspace((unsigned char)*j->p))
        j->p++;
}

static bool push(json *j, float x)
{
    if (j->nv == j->cap) {
        size_t cap = j->cap ? 2 * j->cap : 1024;
        float *v = realloc(j->v, cap * sizeof *v);
        if (!v) {
            say(j->why, j->n, "out of memory reading the body");
            return false;
        }
        j->v = v;
        j->cap = cap;
    }
    j->v[j->nv++] = x;
    return true;
}

static bool number(json *j, int depth)
{
    char buf[64];
    size_t k = 0;
    while (j->p < j->end && k < sizeof buf - 1 &&
           (isdigit((unsigned char)*j->p) || strchr("+-.eE", *j->p)))
        buf[k++] = *j->p++;
    buf[k] = '\0';
    char *e = NULL;
    errno = 0;
    double x = k ? strtod(buf, &e) : 0;
    if (!k || *e || errno == ERANGE || !isfinite(x)) {
        say(j->why, j->n, "malformed JSON: expected a number at byte %td", j->p - j->start);
        return false;
    }
    if (j->depth < 0)
        j->depth = depth;
    else if (j->depth != depth) {
        say(j->why, j->n, "wrong shape: numbers at list depths %d and %d", j->depth, depth);
        return false;
    }
    return push(j, (float)x);
}

static bool list(json *j, int depth)
{
    if (depth >= JSON_MAX_DEPTH) {
        say(j->why, j->n, "wrong shape: lists nested deeper than %d", JSON_MAX_DEPTH);
        return false;
    }
    j->p++; /* '[' */
    int64_t count = 0;
    skip_ws(j);
    if (j->p < j->end && *j->p == ']') {
        j->p++;
    } else {
        for (;;) {
            skip_ws(j);
            if (j->p >= j->end) {
                say(j->why, j->n, "malformed JSON: the body ends inside a list");
                return false;
            }
            if (*j->p == '[' ? !list(j, depth + 1) : !number(j, depth + 1))
                return false;
            count++;
            skip_ws(j);
            if (j->p < j->end && *j->p == ',') {
                j->p++;
                continue;
            }
            if (j->p < j->end && *j->p == ']') {
                j->p++;
                break;
            }
            say(j->why, j->n, "malformed JSON: expected ',' or ']'");
            return false;
        }
    }
    if (j->dims[depth] < 0)
        j->dims[depth] = count;
    else if (j->dims[depth] != count) {
        say(j->why, j->n, "wrong shape: lists of %lld and %lld items at depth %d",
            (long long)j->dims[depth], (long long)count, depth + 1);
        return false;
    }
    return true;
}

/* {"inputs": LIST} (or "instances"), or a bare LIST. */
static bool parse_json(json *j)
{
    skip_ws(j);
    if (j->p < j->end && *j->p == '{') {
        j->p++;
        skip_ws(j);
        const char *keys[2] = {"\"inputs\"", "\"instances\""};
        size_t klen = 0;
        for (int i = 0; i < 2 && !klen; i++)
            if ((size_t)(j->end - j->p) >= strlen(keys[i]) &&
                !memcmp(j->p, keys[i], strlen(keys[i])))
                klen = strlen(keys[i]);
        if (!klen) {
            say(j->why, j->n, "malformed JSON: expected {\"inputs\": [...]}");
            return false;
        }
        j->p += klen;
        skip_ws(j);
        if (j->p >= j->end || *j->p != ':') {
            say(j->why, j->n, "malformed JSON: expected ':' after the key");
            return false;
        }
        j->p++;
        skip_ws(j);
        if (j->p >= j->end || *j->p != '[') {
            say(j->why, j->n, "malformed JSON: \"inputs\" must be a list");
            return false;
        }
        if (!list(j, 0))
            return false;
        skip_ws(j);
        if (j->p >= j->end || *j->p != '}') {
            say(j->why, j->n, "malformed JSON: expected '}' after the inputs");
            return false;
        }
        j->p++;
    } else if (j->p < j->end && *j->p == '[') {
        if (!list(j, 0))
            return false;
    } else {
        say(j->why, j->n, "malformed JSON: expected {\"inputs\": [...]} or a list");
        return false;
    }
    skip_ws(j);
    if (j->p != j->end) {
        say(j->why, j->n, "malformed JSON: data after the end of the value");
        return false;
    }
    if (j->depth < 0) {
        say(j->why, j->n, "wrong shape: no numbers");
        return false;
    }
    return true;
}

/* ---- shapes ------------------------------------------------------------------------- */

/* The rows of an input of this shape: (784), (28, 28) or (1, 28, 28) is
 * one image; a leading axis counts images of those shapes. -1 otherwise. */
static int64_t image_rows(int nd, const int64_t *dims)
{
    bool one = (nd == 1 && dims[0] == 784) || (nd == 2 && dims[0] == 28 && dims[1] == 28) ||
               (nd == 3 && dims[0] == 1 && dims[1] == 28 && dims[2] == 28);
    if (one)
        return 1;
    if (nd >= 2 && image_rows(nd - 1, dims + 1) == 1)
        return dims[0];
    return -1;
}

static void shape_str(int nd, const int64_t *dims, char *s, size_t n)
{
    size_t at = 0;
    at += (size_t)snprintf(s + at, n - at, "(");
    for (int i = 0; i < nd && at < n; i++)
        at += (size_t)snprintf(s + at, n - at, "%s%lld", i ? ", " : "", (long long)dims[i]);
    if (at < n)
        snprintf(s + at, n - at, ")");
}

/* The status for a failed array call: over the request's limit is 507. */
static int fail_status(char *why, size_t n, const char *doing)
{
    ndm_status st = ndm_last_status();
    say(why, n, "%s: %s", doing, ndm_last_error());
    return st == NDM_E_QUOTA || st == NDM_E_OOM ? 507 : 400;
}

/* x (rows of 784 float32 values in req) as the network's input. */
static ndm_array as_images(ndm_manager req, ndm_array x, int64_t rows, bool cnn, int *status,
                           char *why, size_t n)
{
    ndm_array img = ndm_reshape(x, NDM_SHAPE(rows, 28, 28));
    ndm_array in = img.id ? fashion_input(img, cnn) : img;
    if (!in.id)
        *status = fail_status(why, n, "shaping the input");
    (void)req;
    return in;
}

static bool check_rows(int nd, const int64_t *dims, int64_t max_rows, int64_t *rows, char *why,
                       size_t n)
{
    char s[128];
    *rows = image_rows(nd, dims);
    if (*rows < 1) {
        shape_str(nd, dims, s, sizeof s);
        say(why, n, "wrong shape %s: an image is 784 values, (28, 28) or (1, 28, 28), and a "
            "batch of them adds a leading axis of at least one", s);
        return false;
    }
    if (*rows > max_rows) {
        say(why, n, "wrong shape: %lld images in one request, at most %lld", (long long)*rows,
            (long long)max_rows);
        return false;
    }
    return true;
}

static ndm_array from_json(ndm_manager req, const char *body, size_t len, bool cnn,
                           int64_t max_rows, int *status, char *why, size_t n)
{
    json j = {.start = body, .p = body, .end = body + len, .depth = -1, .why = why, .n = n};
    for (int i = 0; i < JSON_MAX_DEPTH; i++)
        j.dims[i] = -1;
    ndm_array out = NDM_NULL_ARRAY;
    int64_t rows;
    *status = 400;
    if (parse_json(&j) && check_rows(j.depth, j.dims, max_rows, &rows, why, n)) {
        ndm_array x = ndm_from_buffer(req, NDM_F32, j.v, NDM_SHAPE(rows, 784));
        if (!x.id)
            *status = fail_status(why, n, "making the input");
        else
            out = as_images(req, x, rows, cnn, status, why, n);
    }
    free(j.v);
    return out;
}

static ndm_array from_npy(ndm_manager req, const char *body, size_t len, bool cnn,
                          int64_t max_rows, int *status, char *why, size_t n)
{
    *status = 400;
    ndm_array a = ndm_npy_load_buffer(req, body, len);
    if (!a.id) {
        *status = fail_status(why, n, "reading the .npy body");
        return a;
    }
    int64_t dims[JSON_MAX_DEPTH], rows;
    int nd = ndm_array_ndim(a);
    if (nd < 1 || nd > JSON_MAX_DEPTH) {
        say(why, n, "wrong shape: a .npy body of %d axes (an image is 784 values, (28, 28) or "
            "(1, 28, 28), a batch of them one axis more)", nd);
        return NDM_NULL_ARRAY;
    }
    if (ndm_array_shape(a, dims, JSON_MAX_DEPTH) != nd ||
        !check_rows(nd, dims, max_rows, &rows, why, n))
        return NDM_NULL_ARRAY;
    /* pixels as bytes are scaled to [0, 1], as the network was trained */
    ndm_array x = ndm_array_dtype(a) == NDM_U8 ? ndm_mul_scalar(ndm_astype(a, NDM_F32), 1.0 / 255.0)
                  : ndm_array_dtype(a) == NDM_F32 ? a
                                                  : ndm_astype(a, NDM_F32);
    if (!x.id) {
        *status = fail_status(why, n, "converting the .npy body to float32");
        return x;
    }
    return as_images(req, x, rows, cnn, status, why, n);
}

static ndm_array from_raw(ndm_manager req, const char *body, size_t len, bool cnn,
                          int64_t max_rows, int *status, char *why, size_t n)
{
    *status = 400;
    if (len == 0 || len % (784 * sizeof(float))) {
        say(why, n, "wrong shape: a raw body is float32 images of 784 values (3136 bytes "
            "each), not %zu bytes", len);
        return NDM_NULL_ARRAY;
    }
    int64_t rows = (int64_t)(len / (784 * sizeof(float))), dims[2] = {rows, 784};
    if (!check_rows(2, dims, max_rows, &rows, why, n))
        return NDM_NULL_ARRAY;
    ndm_array x = ndm_from_buffer(req, NDM_F32, body, NDM_SHAPE(rows, 784));
    if (!x.id) {
        *status = fail_status(why, n, "making the input");
        return x;
    }
    return as_images(req, x, rows, cnn, status, why, n);
}

static bool type_is(const char *ct, const char *want)
{
    size_t k = strlen(want);
    return ct && !strncasecmp(ct, want, k) && (ct[k] == '\0' || ct[k] == ';' || ct[k] == ' ');
}

ndm_array serve_body_input(ndm_manager req, const char *ct, const char *body, size_t len,
                           bool cnn, int64_t max_rows, int *status, char *why, size_t n)
{
    if (len >= 6 && !memcmp(body, "\x93NUMPY", 6))
        return from_npy(req, body, len, cnn, max_rows, status, why, n);
    if (type_is(ct, "application/x-npy")) {
        *status = 400;
        say(why, n, "malformed .npy body: it does not start with the .npy magic");
        return NDM_NULL_ARRAY;
    }
    if (type_is(ct, "application/octet-stream"))
        return from_raw(req, body, len, cnn, max_rows, status, why, n);
    if (!ct || type_is(ct, "application/json"))
        return from_json(req, body, len, cnn, max_rows, status, why, n);
    *status = 415;
    say(why, n, "unsupported Content-Type '%s': application/json, application/x-npy or "
        "application/octet-stream (raw float32)", ct);
    return NDM_NULL_ARRAY;
}
