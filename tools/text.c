/* ndm-text: the second main job. `train` fits a small character-level
 * transformer to the Debian fortune files with flat memory; `generate`
 * serves prompts from several threads, each request's key/value cache owned
 * by its request manager, the characters streamed as they come. */
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "job.h"
#include "ndm/ndm.h"
#include "progress.h"
#include "text_corpus.h"
#include "text_model.h"

const char *prog = "ndm-text";

#define DEFAULT_DATA "/usr/share/games/fortunes"
#define ARCH "gpt-char"
/* one fortune in HOLD_OUT is held out for validation */
#define HOLD_OUT 20

static void die(const char *doing)
{
    fprintf(stderr, "ndm-text: %s failed: %s\n", doing, ndm_last_error());
    exit(1);
}

#define CHECK(expr, doing)                                                      \
    do {                                                                        \
        if ((expr) < 0)                                                         \
            die(doing);                                                         \
    } while (0)
#define LIVE(h, doing)                                                          \
    do {                                                                        \
        if (!(h).id)                                                            \
            die(doing);                                                         \
    } while (0)

static double bits(double nats)
{
    return nats / log(2.0);
}

/* splitmix64: the training windows' offsets, from --seed */
static uint64_t mix(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15u);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9u;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebu;
    return z ^ (z >> 31);
}

/* ---- train -------------------------------------------------------------------- */

typedef struct train_opts {
    const char *data;
    const char *out;
    int64_t epochs, steps, batch, limit, val_windows;
    int64_t layers, width, heads, ctx;
    double lr;
    int64_t seed;
    bool quiet, no_save;
    const char *device;
} train_opts;

/* (rows, ctx + 1) token windows of ids starting at offs[], as i64 in m. */
static ndm_array windows(ndm_manager m, const uint8_t *ids, const size_t *offs, int64_t rows,
                         int64_t ctx, int64_t *scratch)
{
    for (int64_t r = 0; r < rows; r++)
        for (int64_t j = 0; j <= ctx; j++)
            scratch[r * (ctx + 1) + j] = ids[offs[r] + (size_t)j];
    return ndm_from_buffer(m, NDM_I64, scratch, NDM_SHAPE(rows, ctx + 1));
}

/* The mean cross-entropy (nats per character) of net predicting each
 * window's characters from the ones before. */
static ndm_array window_loss(ndm_module net, ndm_array w, int64_t ctx)
{
    int64_t rows = ndm_array_dim(w, 0);
    ndm_array x = ndm_contiguous(ndm_slice(w, 1, 0, ctx, 1));
    ndm_array y = ndm_reshape(ndm_contiguous(ndm_slice(w, 1, 1, ctx + 1, 1)), NDM_SHAPE(rows * ctx));
    ndm_array logits = ndm_forward(net, x);
    return ndm_cross_entropy(ndm_reshape(logits, NDM_SHAPE(rows * ctx, TEXT_VOCAB)), y);
}

/* The held-out loss in nats per character: non-overlapping windows through
 * the held-out fortunes (the first `limit` of them), in a manager of its own. */
static double validate(ndm_manager parent, ndm_module net, const uint8_t *val, size_t nval,
                       int64_t ctx, int64_t batch, int64_t limit, int64_t *scratch, size_t *offs,
                       int64_t *windows_seen)
{
    const char *doing = "measuring the held-out loss";
    int64_t nw = (int64_t)((nval - 1) / (size_t)ctx);
    if (limit > 0 && nw > limit)
        nw = limit;
    ndm_manager ev = ndm_manager_new(parent, "eval");
    LIVE(ev, doing);
    CHECK(ndm_module_set_training(net, false), doing);
    ndm_no_grad_begin();
    double sum = 0;
    for (int64_t at = 0; at < nw; at += batch) {
        int64_t rows = nw - at < batch ? nw - at : batch;
        ndm_manager b = ndm_manager_new(ev, "batch");
        for (int64_t r = 0; r < rows; r++)
            offs[r] = (size_t)((at + r) * ctx);
        ndm_array w = windows(b, val, offs, rows, ctx, scratch);
        double l;
        CHECK(ndm_item(window_loss(net, w, ctx), &l), doing);
        sum += l * (double)rows;
        CHECK(ndm_manager_close(b), doing);
    }
    ndm_no_grad_end();
    CHECK(ndm_module_set_training(net, true), doing);
    CHECK(ndm_manager_close(ev), doing);
    *windows_seen = nw;
    return nw ? sum / (double)nw : 0;
}

static int train(train_opts o)
{
    char why[1200], devname[32];
    ndm_device dev = device_option("train", o.device);
    ndm_device_str(dev, devname, sizeof devname);
    const char *dir = o.data ? o.data : DEFAULT_DATA;
    if (o.width % o.heads) {
        fprintf(stderr, "ndm-text train: --width %lld is not a multiple of --heads %lld\n",
                (long long)o.width, (long long)o.heads);
        return 2;
    }
    if (!o.no_save && !writable(o.out, why, sizeof why)) {
        fprintf(stderr, "ndm-text train: cannot save the model to %s: %s (choose another --out, "
                "or --no-save)\n", o.out, why);
        return 1;
    }
    /* the device before the corpus: a missing GPU is reported before the
     * files are read */
    ndm_manager model = model_manager("train", dev);
    text_corpus corpus;
    if (!text_corpus_read(dir, HOLD_OUT, (size_t)o.limit, &corpus, why, sizeof why)) {
        fprintf(stderr, "ndm-text train: %s; install the Debian package fortunes (or "
                "fortunes-min), or pass --data DIR with fortune files\n", why);
        return 1;
    }
    if (corpus.ntrain < (size_t)o.ctx + 2 || corpus.nval < (size_t)o.ctx + 2) {
        fprintf(stderr, "ndm-text train: %zu training and %zu held-out characters are too few "
                "for a context of %lld (raise --limit or lower --ctx)\n", corpus.ntrain,
                corpus.nval, (long long)o.ctx);
        return 1;
    }
    printf("ndm-text train: %lld epochs of %lld steps, batch %lld x %lld characters, Adam lr %g "
           "(cosine), seed %lld, device %s\n",
           (long long)o.epochs, (long long)o.steps, (long long)o.batch, (long long)o.ctx, o.lr,
           (long long)o.seed, devname);
    printf("  corpus: %d fortune files in %s: %lld fortunes, %zu characters for training; "
           "%lld held out (one in %d), %zu characters\n",
           corpus.files, dir, (long long)corpus.train_fortunes, corpus.ntrain,
           (long long)corpus.val_fortunes, HOLD_OUT, corpus.nval);
    printf("  unigram baseline: %.3f bits/char on the held-out text (%.3f on the training text)\n",
           corpus.unigram_val_bits, corpus.unigram_train_bits);

    /* system/data holds the corpus (CPU); system/model, on --device, the
     * parameters and Adam's state, capped before the first step;
     * model/trainer a batch manager per step, and the evaluation's */
    ndm_manager data = ndm_manager_new(ndm_system(), "data");
    LIVE(data, "creating the data manager");
    ndm_array train_ids = ndm_from_buffer(data, NDM_U8, corpus.train, NDM_SHAPE((int64_t)corpus.ntrain));
    ndm_array val_ids = ndm_from_buffer(data, NDM_U8, corpus.val, NDM_SHAPE((int64_t)corpus.nval));
    LIVE(train_ids, "keeping the corpus");
    LIVE(val_ids, "keeping the corpus");
    size_t ntrain = corpus.ntrain, nval = corpus.nval;
    double unigram = corpus.unigram_val_bits;
    text_corpus_free(&corpus);
    const uint8_t *tr = ndm_array_data(train_ids), *va = ndm_array_data(val_ids);

    text_config cfg = {TEXT_VOCAB, o.ctx, o.width, o.heads, o.layers};
    ndm_rng rng = ndm_rng_new((uint64_t)o.seed);
    ndm_module net = text_model_new(model, &cfg, &rng);
    LIVE(net, "building the network");
    int np = ndm_module_parameters(net, NULL, 0);
    ndm_array *params = np > 0 ? malloc((size_t)np * sizeof *params) : NULL;
    if (!params || ndm_module_parameters(net, params, np) != np)
        die("listing the parameters");
    int64_t nparams = 0;
    for (int i = 0; i < np; i++)
        nparams += ndm_array_size(params[i]);
    free(params);
    printf("  GPT: %lld layers, width %lld, %lld heads, context %lld, vocabulary %d: %lld "
           "parameters\n", (long long)o.layers, (long long)o.width, (long long)o.heads,
           (long long)o.ctx, TEXT_VOCAB, (long long)nparams);
    ndm_optimizer opt = ndm_adam(model, net, o.lr, 0.9, 0.999, 1e-8, 0.0);
    LIVE(opt, "creating the optimizer");
    CHECK(ndm_manager_cap(model, NDM_CAP_ARRAYS), "capping the model");
    ndm_manager trainer = ndm_manager_new(model, "trainer");
    LIVE(trainer, "creating the trainer");

    int64_t rows_max = o.batch;
    int64_t *scratch = malloc((size_t)(rows_max * (o.ctx + 1)) * sizeof *scratch);
    size_t *offs = malloc((size_t)rows_max * sizeof *offs);
    if (!scratch || !offs) {
        fprintf(stderr, "ndm-text train: out of memory for a batch\n");
        return 1;
    }
    uint64_t stream = (uint64_t)o.seed;
    progress bar;
    progress_init(&bar, stderr, 10.0);
    snapshot first = {0}, last = {0}, rss_base = {0};
    int rss_epoch = 0;
    double val = 0, loss = 0;
    int64_t vw = 0;
    for (int epoch = 1; epoch <= o.epochs; epoch++) {
        const char *doing = "a training step";
        CHECK(ndm_optimizer_set_lr(opt, ndm_lr_cosine(o.lr, o.lr * 0.1, epoch - 1, o.epochs)),
              "setting the learning rate");
        double t0 = now(), sum = 0;
        uint64_t step_peak = 0; /* the most a step's manager held at once */
        progress_state ps = {epoch, (int)o.epochs, 0, o.steps, 0, 0, "characters"};
        for (int64_t s = 0; s < o.steps; s++) {
            /* one manager per step: the batch, the activations, the graph */
            ndm_manager b = ndm_manager_new(trainer, "batch");
            LIVE(b, doing);
            for (int64_t r = 0; r < o.batch; r++)
                offs[r] = (size_t)(mix(&stream) % (uint64_t)(ntrain - (size_t)o.ctx - 1));
            ndm_array w = windows(b, tr, offs, o.batch, o.ctx, scratch);
            CHECK(ndm_grad_begin(b), doing);
            ndm_array l = window_loss(net, w, o.ctx);
            LIVE(l, doing);
            CHECK(ndm_backward(l), doing);
            CHECK(ndm_grad_end(), doing);
            CHECK(ndm_optimizer_step(opt), doing);
            CHECK(ndm_optimizer_zero_grad(opt), doing);
            double lv;
            CHECK(ndm_item(l, &lv), doing);
            ndm_stats bs;
            CHECK(ndm_manager_stats(b, dev, NDM_STATS_SUBTREE, &bs), doing);
            if (bs.peak_bytes > step_peak)
                step_peak = bs.peak_bytes;
            CHECK(ndm_manager_close(b), doing);
            sum += lv;
            double t = now();
            ps.done = s + 1;
            ps.loss = bits(sum / (double)(s + 1));
            ps.rate = (double)((s + 1) * o.batch * o.ctx) / (t - t0);
            if (!o.quiet)
                progress_update(&bar, &ps, t);
        }
        double secs = now() - t0;
        if (!o.quiet)
            progress_end_epoch(&bar, &ps, now());
        loss = bits(sum / (double)o.steps);
        val = bits(validate(trainer, net, va, nval, o.ctx, o.batch, o.val_windows, scratch, offs,
                            &vw));
        snapshot sn = {0};
        snap_add(model, dev, &sn);
        snap_add(trainer, dev, &sn);
        snap_add(data, dev, &sn);
        sn.rss = rss_mib();
        if (epoch == 1)
            first = sn;
        if (epoch == 2 || o.epochs == 1) {
            rss_base = sn;
            rss_epoch = epoch;
        }
        last = sn;
        printf("  epoch %2d: train %.3f bits/char  held-out %.3f bits/char  %.1f s  "
               "%.0f characters/s  step peak %.1f MiB  RSS %.1f MiB\n",
               epoch, loss, val, secs, (double)(o.steps * o.batch * o.ctx) / secs,
               (double)step_peak / (1024.0 * 1024.0), sn.rss);
        fflush(stdout);
        if (!o.quiet)
            (void)ndm_debug_dump(model, stdout);
    }
    free(scratch);
    free(offs);

    if (o.epochs >= 2) {
        bool flat = first.n == last.n;
        uint64_t arrays = 0, nbytes = 0;
        for (int i = 0; i < last.n; i++) {
            flat = flat && first.arrays[i] == last.arrays[i] && first.bytes[i] == last.bytes[i];
            arrays += last.arrays[i];
            nbytes += last.bytes[i];
        }
        printf("memory after epoch 1 and after epoch %lld: live arrays and bytes of model, "
               "trainer and data %s (%llu arrays, %.1f MiB)\n",
               (long long)o.epochs, flat ? "identical" : "CHANGED", (unsigned long long)arrays,
               (double)nbytes / (1024.0 * 1024.0));
        if (o.epochs > rss_epoch)
            printf("RSS after epoch %d and after epoch %lld: %.1f -> %.1f MiB (%+.2f%%)\n",
                   rss_epoch, (long long)o.epochs, rss_base.rss, last.rss,
                   rss_base.rss > 0 ? 100.0 * (last.rss - rss_base.rss) / rss_base.rss : 0.0);
        else
            printf("RSS: not compared (the first epoch grows the caches; it takes 3 epochs)\n");
    } else {
        printf("memory: one epoch, nothing to compare (the check needs --epochs 2 or more)\n");
    }
    printf("final held-out loss: %.3f bits/char on %lld windows of %lld characters; the unigram "
           "baseline %.3f bits/char (%.0f%% of it)\n",
           val, (long long)vw, (long long)o.ctx, unigram, 100.0 * val / unigram);

    if (!o.no_save) {
        char v[5][24], vb[32], lb[32];
        int64_t sz[5] = {TEXT_VOCAB, o.ctx, o.width, o.heads, o.layers};
        for (int i = 0; i < 5; i++)
            snprintf(v[i], sizeof v[i], "%lld", (long long)sz[i]);
        snprintf(vb, sizeof vb, "%.4f", val);
        snprintf(lb, sizeof lb, "%.4f", loss);
        int n = ndm_module_named_state(net, NULL, NULL, 0);
        const char **names = n > 0 ? malloc((size_t)n * sizeof *names) : NULL;
        ndm_array *state = n > 0 ? malloc((size_t)n * sizeof *state) : NULL;
        if (!names || !state || ndm_module_named_state(net, names, state, n) != n)
            die("listing the model's state");
        const char *keys[8] = {"arch", "vocab", "ctx", "width", "heads", "layers",
                               "val_bits_per_char", "train_bits_per_char"};
        const char *vals[8] = {ARCH, v[0], v[1], v[2], v[3], v[4], vb, lb};
        ndm_named_arrays set = {(size_t)n, names, state, 8, keys, vals};
        CHECK(ndm_safetensors_save(o.out, &set), "saving the model");
        printf("saved %d tensors to %s\n", n, o.out);
        free(names);
        free(state);
    }
    CHECK(ndm_manager_close(model), "closing the model");
    CHECK(ndm_manager_close(data), "closing the data");
    return 0;
}

/* ---- generate ------------------------------------------------------------------- */

typedef struct gen_opts {
    const char *model;
    const char *prompt; /* NULL: the built-in prompts in turn */
    int64_t requests, threads, tokens, top_k, seed;
    double temperature;
    bool greedy, dump, quiet;
    const char *device;
} gen_opts;

static const char *const default_prompts[] = {
    "Q: What is the difference between ", "A computer ", "Love is ", "The law ", "Never ",
    "There are two kinds of people: ", "Life is ", "If you ",
};
enum { NDEFAULT = (int)(sizeof default_prompts / sizeof default_prompts[0]) };

/* What the serving threads share, and each one's count. */
typedef struct server {
    ndm_module net;
    ndm_manager requests; /* the predictor's manager: the request managers' parent */
    ndm_manager model;
    text_config cfg;
    const gen_opts *o;
    const char *const *prompts;
    int nprompts;
    pthread_mutex_t print; /* one request's line at a time on stdout */
} server;

typedef struct worker {
    server *s;
    int64_t first, step;   /* requests first, first + step, ... */
    int64_t tokens;        /* generated */
    int errors;
    char error[512];
} worker;

/* Print one request's text so far: with one thread as it comes, with
 * several a whole line at a time, each after its request's number. */
static void emit(server *s, int64_t r, char *line, size_t *len, bool flush_all)
{
    if (s->o->quiet)
        return;
    if (s->o->threads == 1) {
        fwrite(line, 1, *len, stdout);
        fflush(stdout);
        *len = 0;
        return;
    }
    size_t start = 0;
    pthread_mutex_lock(&s->print);
    for (size_t i = 0; i < *len; i++)
        if (line[i] == '\n') {
            printf("[%" PRId64 "] %.*s\n", r, (int)(i - start), line + start);
            start = i + 1;
        }
    if (flush_all && start < *len) {
        printf("[%" PRId64 "] %.*s\n", r, (int)(*len - start), line + start);
        start = *len;
    }
    fflush(stdout);
    pthread_mutex_unlock(&s->print);
    memmove(line, line + start, *len - start);
    *len -= start;
}

/* The next character: from the logits' last row, at the temperature, among
 * the top k, drawn from the request's stream; with --greedy the likeliest. */
static int sample(ndm_array logits, int64_t row, const gen_opts *o, ndm_rng *rng)
{
    ndm_array last = ndm_select(ndm_select(logits, 0, 0), 0, row);
    int64_t id = -1;
    if (o->greedy) {
        if (ndm_item_i64(ndm_argmax(last, 0, false), &id) != NDM_OK)
            return -1;
        return (int)id;
    }
    ndm_array vals, idx;
    if (ndm_topk(ndm_mul_scalar(last, 1.0 / o->temperature), o->top_k, 0, true, &vals, &idx) !=
        NDM_OK)
        return -1;
    int64_t j = -1;
    if (ndm_item_i64(ndm_multinomial(ndm_softmax(vals, 0), 1, true, rng), &j) != NDM_OK ||
        ndm_item_i64(ndm_select(idx, 0, j), &id) != NDM_OK)
        return -1;
    return (int)id;
}

/* One request: a manager "request-<r>" under the predictor's, the cache in
 * it, the prompt in one forward pass, then one pass per new character, each
 * in a step manager of the request. */
static int64_t run_request(worker *w, int64_t r)
{
    server *s = w->s;
    const gen_opts *o = s->o;
    const char *prompt = s->prompts[r % s->nprompts];
    int64_t plen = (int64_t)strlen(prompt);
    int64_t total = plen + o->tokens < s->cfg.ctx ? plen + o->tokens : s->cfg.ctx;
    char name[32];
    snprintf(name, sizeof name, "request-%" PRId64, r);
    ndm_manager req = ndm_manager_new(s->requests, name);
    ndm_array cache = req.id ? text_kv_cache(req, &s->cfg, total, NDM_F32) : NDM_NULL_ARRAY;
    int64_t *ids = malloc((size_t)plen * sizeof *ids);
    char *line = malloc((size_t)(plen + o->tokens + 1));
    size_t len = 0;
    if (!cache.id || !ids || !line) {
        if (!w->errors++)
            snprintf(w->error, sizeof w->error, "request %" PRId64 ": %s", r,
                     !ids || !line ? "out of memory" : ndm_last_error());
        free(ids);
        free(line);
        if (req.id)
            (void)ndm_manager_close(req);
        return -1;
    }
    for (int64_t i = 0; i < plen; i++)
        ids[i] = text_char_id((unsigned char)prompt[i]);
    memcpy(line, prompt, (size_t)plen);
    len = (size_t)plen;
    /* same seed, same request number: the same text, whatever the threads */
    ndm_rng rng = ndm_rng_new((uint64_t)o->seed);
    rng.stream = (uint64_t)r;
    int64_t pos = 0, n = plen, made = 0;
    bool ok = true, newline = plen > 0 && prompt[plen - 1] == '\n';
    while (ok && made < o->tokens) {
        ndm_manager step = ndm_manager_new(req, "step");
        ndm_array tok = ndm_from_buffer(step, NDM_I64, ids, NDM_SHAPE(1, n));
        ndm_array at = ndm_scalar(step, NDM_I64, (double)pos);
        ndm_array logits = ndm_forward_n(s->net, NDM_ARRAYS(tok, cache, at));
        int id = logits.id ? sample(logits, n - 1, o, &rng) : -1;
        ok = id >= 0 && ndm_manager_close(step) == NDM_OK;
        if (!ok)
            break;
        if (o->dump && r == 0 && pos == 0) {
            pthread_mutex_lock(&s->print);
            printf("ndm_debug_dump while request 0 runs (its key/value cache: %" PRIu64
                   " bytes = 2 x %lld layers x %lld tokens x %lld width x 4 bytes):\n",
                   text_kv_bytes(&s->cfg, total, NDM_F32), (long long)s->cfg.layers,
                   (long long)total, (long long)s->cfg.width);
            (void)ndm_debug_dump(s->model, stdout);
            pthread_mutex_unlock(&s->print);
        }
        if (pos == 0) {
            /* the prompt, once its pass is done (after the dump, not inside its line) */
            if (o->threads == 1 && !o->quiet)
                printf("--- request %" PRId64 " ---\n", r);
            emit(s, r, line, &len, false);
        }
        char c = text_id_char(id);
        /* a fortune ends at a line "%" */
        if (newline && c == '%')
            break;
        newline = c == '\n';
        line[len++] = c;
        made++;
        emit(s, r, line, &len, false);
        pos += n;
        n = 1;
        ids[0] = id;
        if (pos + 1 > total)
            break; /* the cache is full: the context is used up */
    }
    if (len || o->threads == 1) {
        if (o->threads == 1 && !o->quiet) {
            emit(s, r, line, &len, true);
            printf("%s", newline ? "" : "\n");
        } else {
            emit(s, r, line, &len, true);
        }
    }
    free(ids);
    free(line);
    if (!ok && !w->errors++)
        snprintf(w->error, sizeof w->error, "request %" PRId64 ": %s", r, ndm_last_error());
    if (ndm_manager_close(req) != NDM_OK && !w->errors++)
        snprintf(w->error, sizeof w->error, "closing request %" PRId64 ": %s", r,
                 ndm_last_error());
    return ok ? made : -1;
}

static void *gen_worker(void *p)
{
    worker *w = p;
    for (int64_t r = w->first; r < w->s->o->requests; r += w->step) {
        int64_t made = run_request(w, r); /* a failure is counted there */
        if (made > 0)
            w->tokens += made;
    }
    return NULL;
}

/* A prompt the model can take, or a message naming what is wrong, exit 2. */
static void check_prompt(const char *p, int64_t ctx)
{
    size_t n = strlen(p), bad = 0;
    if (n == 0) {
        fprintf(stderr, "ndm-text generate: the prompt is empty; give at least one character "
                "(--prompt TEXT)\n");
        exit(2);
    }
    if (!text_utf8_valid((const unsigned char *)p, n, &bad)) {
        fprintf(stderr, "ndm-text generate: the prompt is not UTF-8: byte 0x%02x at offset %zu "
                "begins no valid character\n", (unsigned char)p[bad], bad);
        exit(2);
    }
    for (size_t i = 0; i < n; i++)
        if (text_char_id((unsigned char)p[i]) < 0) {
            fprintf(stderr, "ndm-text generate: the prompt's character at offset %zu (byte "
                    "0x%02x) is not in the model's vocabulary: newline and printable ASCII "
                    "(' ' to '~')\n", i, (unsigned char)p[i]);
            exit(2);
        }
    if (ctx > 0 && (int64_t)n > ctx) {
        fprintf(stderr, "ndm-text generate: the prompt has %zu characters, more than the "
                "model's context of %lld; give at most %lld\n", n, (long long)ctx,
                (long long)ctx);
        exit(2);
    }
}

/* A size from the model file's metadata, or 0. */
static int64_t meta_int(const ndm_named_arrays *w, const char *key)
{
    const char *v = ndm_named_arrays_meta(w, key);
    return v ? strtoll(v, NULL, 10) : 0;
}

static int generate(gen_opts o)
{
    char devname[32];
    ndm_device dev = device_option("generate", o.device);
    ndm_device_str(dev, devname, sizeof devname);
    if (o.prompt)
        check_prompt(o.prompt, 0);
    struct stat st;
    if (stat(o.model, &st) != 0) {
        fprintf(stderr, "ndm-text generate: no model at %s (run `ndm-text train --out %s` "
                "first, or pass --model FILE)\n", o.model, o.model);
        return 1;
    }
    ndm_manager model = model_manager("generate", dev);
    /* the sizes, from the file's metadata (a mapping that dies with the
     * manager that reads it) */
    ndm_manager peek = ndm_manager_new_on(model, "peek", NDM_CPU);
    LIVE(peek, "creating the manager that reads the model's metadata");
    const ndm_named_arrays *file = ndm_safetensors_load(peek, o.model, NDM_LOAD_MMAP);
    const char *arch = file ? ndm_named_arrays_meta(file, "arch") : NULL;
    text_config cfg = {0};
    if (arch && !strcmp(arch, ARCH))
        cfg = (text_config){meta_int(file, "vocab"), meta_int(file, "ctx"),
                            meta_int(file, "width"), meta_int(file, "heads"),
                            meta_int(file, "layers")};
    double val = file && ndm_named_arrays_meta(file, "val_bits_per_char")
                     ? strtod(ndm_named_arrays_meta(file, "val_bits_per_char"), NULL) : 0;
    CHECK(ndm_manager_close(peek), "closing the model file");
    if (cfg.vocab != TEXT_VOCAB || cfg.ctx < 1 || cfg.width < 1 || cfg.heads < 1 ||
        cfg.layers < 1 || cfg.layers > 64 || cfg.width % cfg.heads) {
        fprintf(stderr, "ndm-text generate: %s is not a model that `ndm-text train` saved%s%s\n",
                o.model, file ? "" : ": ", file ? "" : ndm_last_error());
        return 1;
    }
    const char *one[1] = {o.prompt};
    const char *const *prompts = o.prompt ? one : default_prompts;
    int nprompts = o.prompt ? 1 : NDEFAULT;
    for (int i = 0; i < nprompts; i++)
        check_prompt(prompts[i], cfg.ctx);
    /* built without gradient arrays, then one call reads the file into it
     * and makes the predictor, which caps the model */
    ndm_rng rng = ndm_rng_new(0);
    ndm_no_grad_begin();
    ndm_module net = text_model_new(model, &cfg, &rng);
    ndm_no_grad_end();
    LIVE(net, "building the network");
    ndm_predictor pred = ndm_predictor_load(model, net, o.model);
    if (!pred.id) {
        fprintf(stderr, "ndm-text generate: %s does not load into the network it describes: %s\n",
                o.model, ndm_last_error());
        return 1;
    }
    int threads = (int)(o.threads < o.requests ? o.threads : o.requests);
    char sampling[64];
    if (o.greedy)
        snprintf(sampling, sizeof sampling, "greedy");
    else
        snprintf(sampling, sizeof sampling, "temperature %g, top-k %lld", o.temperature,
                 (long long)o.top_k);
    printf("ndm-text generate: %lld request%s from %d thread%s, up to %lld characters each, "
           "%s, seed %lld, on %s\n",
           (long long)o.requests, o.requests == 1 ? "" : "s", threads, threads == 1 ? "" : "s",
           (long long)o.tokens, sampling, (long long)o.seed, devname);
    printf("  model %s: %lld layers, width %lld, %lld heads, context %lld (held-out %.3f "
           "bits/char)\n", o.model, (long long)cfg.layers, (long long)cfg.width,
           (long long)cfg.heads, (long long)cfg.ctx, val);
    fflush(stdout);
    server s = {net, ndm_predictor_manager(pred), model, cfg, &o, prompts, nprompts,
                PTHREAD_MUTEX_INITIALIZER};
    LIVE(s.requests, "finding the predictor's manager");
    worker *ws = calloc((size_t)threads, sizeof *ws);
    pthread_t *th = calloc((size_t)threads, sizeof *th);
    if (!ws || !th) {
        fprintf(stderr, "ndm-text generate: out of memory for %d threads\n", threads);
        return 1;
    }
    double t0 = now();
    for (int t = 0; t < threads; t++) {
        ws[t] = (worker){&s, t, threads, 0, 0, ""};
        if (pthread_create(&th[t], NULL, gen_worker, &ws[t]) != 0) {
            fprintf(stderr, "ndm-text generate: cannot start thread %d of %d\n", t + 1, threads);
            return 1;
        }
    }
    int64_t tokens = 0;
    int errors = 0;
    for (int t = 0; t < threads; t++) {
        pthread_join(th[t], NULL);
        tokens += ws[t].tokens;
        if (ws[t].errors) {
            errors += ws[t].errors;
            fprintf(stderr, "  thread %d: %d errors, first: %s\n", t, ws[t].errors, ws[t].error);
        }
    }
    double secs = now() - t0;
    free(ws);
    free(th);
    printf("generated %lld character%s in %.2f s: %.0f characters/s from %d thread%s; %d errors\n",
           (long long)tokens, tokens == 1 ? "" : "s", secs, (double)tokens / secs, threads, threads == 1 ? "" : "s",
           errors);
    ndm_stats ps;
    CHECK(ndm_manager_stats(s.requests, NDM_CPU, NDM_STATS_SUBTREE, &ps),
          "counting the request managers");
    printf("after the requests: live request managers: %llu, live request arrays: %llu\n",
           (unsigned long long)ps.children, (unsigned long long)ps.live_arrays);
    if (o.dump)
        (void)ndm_debug_dump(model, stdout);
    CHECK(ndm_manager_close(model), "closing the model");
    fflush(stdout); /* before the leak report's lines on stderr at exit */
    return errors ? 1 : 0;
}

/* ---- main ----------------------------------------------------------------------- */

/* The full run: 4 blocks of width 128 with 4 heads over a context of 128
 * characters (0.83 M parameters) see 4 x 200 steps x 16 windows x 128 =
 * 1.6 M characters, some minutes on two cores */
static train_opts topt = {NULL, "text-model.safetensors", 4, 200, 16, 0, 256, 4, 128, 4, 128,
                          3e-3, 1, false, false, "cpu"};
static gen_opts gopt = {"text-model.safetensors", NULL, 8, 2, 200, 20, 1, 0.8, false, false,
                        false, "cpu"};

static const cli_opt train_opts_list[] = {
    {"--epochs", "N", OPT_INT, 1, 1000, 0, 0, &topt.epochs, NULL, "epochs"},
    {"--steps", "N", OPT_INT, 1, 1000000, 0, 0, &topt.steps, NULL,
     "training steps per epoch, each on --batch windows drawn at random"},
    {"--batch", "N", OPT_INT, 1, 4096, 0, 0, &topt.batch, NULL, "windows per step"},
    {"--lr", "X", OPT_REAL, 0, 0, 0, 10, &topt.lr, NULL,
     "Adam's learning rate, decayed to 10% on a cosine over the epochs"},
    {"--seed", "N", OPT_INT, 0, INT64_MAX, 0, 0, &topt.seed, NULL,
     "seed of the initial weights and the windows"},
    {"--limit", "N", OPT_INT, 0, INT64_MAX, 0, 0, &topt.limit, "0, all of it",
     "train on the first N characters and validate on the first N/20 (at least 1024) held out"},
    {"--val-windows", "N", OPT_INT, 0, 1000000, 0, 0, &topt.val_windows, NULL,
     "held-out windows measured after each epoch (0: all of them)"},
    {"--layers", "N", OPT_INT, 1, 64, 0, 0, &topt.layers, NULL, "transformer blocks"},
    {"--width", "N", OPT_INT, 8, 4096, 0, 0, &topt.width, NULL, "features per position"},
    {"--heads", "N", OPT_INT, 1, 64, 0, 0, &topt.heads, NULL, "attention heads (divide --width)"},
    {"--ctx", "N", OPT_INT, 8, 4096, 0, 0, &topt.ctx, NULL,
     "context: characters per window, the most a prompt and its continuation can use"},
    {"--data", "DIR", OPT_TEXT, 0, 0, 0, 0, &topt.data, DEFAULT_DATA,
     "folder of fortune files (the Debian packages fortunes, fortunes-min)"},
    {"--out", "FILE", OPT_TEXT, 0, 0, 0, 0, &topt.out, NULL, "where to save the model"},
    {"--no-save", NULL, OPT_FLAG, 0, 0, 0, 0, &topt.no_save, NULL, "do not save the model"},
    {"--quiet", NULL, OPT_FLAG, 0, 0, 0, 0, &topt.quiet, NULL,
     "no progress and no per-epoch dump; the summary lines only"},
    {"--device", "DEV", OPT_TEXT, 0, 0, 0, 0, &topt.device, NULL,
     "where the model and the batches live: cpu, cuda or cuda:N"},
};
static const cli_opt gen_opts_list[] = {
    {"--model", "FILE", OPT_TEXT, 0, 0, 0, 0, &gopt.model, NULL, "the model `train` saved"},
    {"--prompt", "TEXT", OPT_ANY_TEXT, 0, 0, 0, 0, &gopt.prompt, "eight built-in prompts in turn",
     "the prompt of every request (UTF-8, in the vocabulary, at most the context)"},
    {"--requests", "N", OPT_INT, 1, 1000000, 0, 0, &gopt.requests, NULL, "prompts to answer"},
    {"--threads", "N", OPT_INT, 1, 256, 0, 0, &gopt.threads, NULL,
     "serving threads (1: characters streamed as they come; more: whole lines, each after "
     "its request's number)"},
    {"--tokens", "N", OPT_INT, 1, 4096, 0, 0, &gopt.tokens, NULL,
     "characters to generate per request (fewer at the end of a fortune or of the context)"},
    {"--temperature", "X", OPT_REAL, 0, 0, 0, 100, &gopt.temperature, NULL,
     "sampling temperature: below 1 sharper, above 1 flatter"},
    {"--greedy", NULL, OPT_FLAG, 0, 0, 0, 0, &gopt.greedy, NULL,
     "take the likeliest character every time instead of sampling"},
    {"--top-k", "N", OPT_INT, 1, TEXT_VOCAB, 0, 0, &gopt.top_k, NULL,
     "sample among the k likeliest characters"},
    {"--seed", "N", OPT_INT, 0, INT64_MAX, 0, 0, &gopt.seed, NULL,
     "seed of the sampling: request r draws from stream r, so the same seed gives the same "
     "text whatever the threads"},
    {"--dump", NULL, OPT_FLAG, 0, 0, 0, 0, &gopt.dump, NULL,
     "print ndm_debug_dump while request 0 runs (its cache under its manager) and after"},
    {"--quiet", NULL, OPT_FLAG, 0, 0, 0, 0, &gopt.quiet, NULL, "no generated text; the summary only"},
    {"--device", "DEV", OPT_TEXT, 0, 0, 0, 0, &gopt.device, NULL,
     "where the model runs: cpu, cuda or cuda:N"},
};
static int run_train(void) { return train(topt); }
static int run_generate(void) { return generate(gopt); }
static const command commands[] = {
    {"train", "train a character-level transformer on the fortune files, checking that memory "
     "stays flat", train_opts_list, (int)(sizeof train_opts_list / sizeof train_opts_list[0]),
     run_train},
    {"generate", "continue prompts from several threads, a manager and a key/value cache per "
     "request", gen_opts_list, (int)(sizeof gen_opts_list / sizeof gen_opts_list[0]),
     run_generate},
};
enum { NCOMMANDS = (int)(sizeof commands / sizeof commands[0]) };

int main(int argc, char **argv)
{
    return run_tool(argc, argv, commands, NCOMMANDS);
}
