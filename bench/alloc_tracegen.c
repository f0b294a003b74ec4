/* Records allocator traces of synthetic training and serving steps through
 * the public API: the patterns bench/alloc_replay replays until real loops exist.
 *
 *   alloc_tracegen mlp|cnn|serve OUT.trace [steps]
 *
 * mlp:   784-2048-1024-512-10 MLP, batch 256, f32, Adam: activations made
 *        layer by layer and kept for backward, freed in reverse as backward
 *        consumes them, weight-gradient temporaries added into persistent
 *        gradients, and Adam's temporaries per parameter.
 * cnn:   three conv blocks (im2col workspaces, ReLU, max-pool with indices)
 *        and a linear head on 64 x 3 x 32 x 32, the same backward/Adam shape.
 * serve: transformer-style inference requests with random sequence lengths
 *        (16..512) through four blocks; each request is its own manager.
 *
 * Only storage is made (ndm_empty): nothing is computed, the sizes and the
 * order of allocations and frees are what the trace keeps. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ndm/ndm.h"

#define CHECK(expr)                                                                 \
    do {                                                                            \
        if ((expr) != NDM_OK) {                                                     \
            fprintf(stderr, "%s failed: %s\n", #expr, ndm_last_error());            \
            exit(1);                                                                \
        }                                                                           \
    } while (0)

static ndm_array mk(ndm_manager m, ndm_dtype dt, int64_t a, int64_t b)
{
    ndm_array x = b ? ndm_empty(m, dt, NDM_SHAPE(a, b)) : ndm_empty(m, dt, NDM_SHAPE(a));
    if (!x.id) {
        fprintf(stderr, "allocation failed: %s\n", ndm_last_error());
        exit(1);
    }
    return x;
}

static void drop(ndm_array a) { CHECK(ndm_array_release(a)); }

/* Adam on one parameter of n elements: v's square of the gradient, the
 * bias-corrected moments, the denominator and the update, each a temporary. */
static void adam_step(ndm_manager step, int64_t rows, int64_t cols)
{
    ndm_array g2 = mk(step, NDM_F32, rows, cols);
    drop(g2);
    ndm_array mhat = mk(step, NDM_F32, rows, cols);
    ndm_array vhat = mk(step, NDM_F32, rows, cols);
    ndm_array denom = mk(step, NDM_F32, rows, cols);
    drop(vhat);
    ndm_array upd = mk(step, NDM_F32, rows, cols);
    drop(mhat);
    drop(denom);
    drop(upd);
}

/* ---- MLP ---------------------------------------------------------------------- */

static void mlp(ndm_manager root, int steps)
{
    enum { L = 4 };
    const int64_t dims[L + 1] = {784, 2048, 1024, 512, 10};
    const int64_t batch = 256;
    ndm_manager model = ndm_manager_new(root, "model");
    for (int i = 0; i < L; i++) {
        mk(model, NDM_F32, dims[i], dims[i + 1]);     /* W */
        mk(model, NDM_F32, dims[i + 1], 0);            /* b */
        for (int k = 0; k < 3; k++) {                  /* grad, Adam m, v */
            mk(model, NDM_F32, dims[i], dims[i + 1]);
            mk(model, NDM_F32, dims[i + 1], 0);
        }
    }
    for (int s = 0; s < steps; s++) {
        ndm_manager step = ndm_manager_new(root, "batch");
        ndm_array x = mk(step, NDM_F32, batch, dims[0]);
        ndm_array y = mk(step, NDM_I64, batch, 0);
        ndm_array h[L], a[L];
        ndm_array in = x;
        for (int i = 0; i < L; i++) {
            h[i] = mk(step, NDM_F32, batch, dims[i + 1]); /* addmm */
            a[i] = i < L - 1 ? mk(step, NDM_F32, batch, dims[i + 1]) : h[i]; /* relu */
            in = a[i];
        }
        (void)in;
        ndm_array probs = mk(step, NDM_F32, batch, dims[L]);
        ndm_array loss = mk(step, NDM_F32, 1, 0);
        ndm_array g = mk(step, NDM_F32, batch, dims[L]); /* dloss/dlogits */
        drop(probs);
        for (int i = L - 1; i >= 0; i--) {
            ndm_array prev = i ? a[i - 1] : x;
            ndm_array gw = mk(step, NDM_F32, dims[i], dims[i + 1]); /* prev^T @ g */
            drop(gw);                                               /* added into the grad */
            ndm_array gb = mk(step, NDM_F32, dims[i + 1], 0);
            drop(gb);
            if (i > 0) {
                ndm_array gp = mk(step, NDM_F32, batch, dims[i]);   /* g @ W^T */
                ndm_array mask = mk(step, NDM_U8, batch, dims[i]);  /* relu' */
                ndm_array gr = mk(step, NDM_F32, batch, dims[i]);
                drop(mask);
                drop(gp);
                drop(g);
                g = gr;
            } else {
                drop(g);
            }
            if (i < L - 1)
                drop(a[i]);
            drop(h[i]);
            (void)prev;
        }
        for (int i = 0; i < L; i++) {
            adam_step(step, dims[i], dims[i + 1]);
            adam_step(step, dims[i + 1], 0);
        }
        (void)y;
        (void)loss;
        CHECK(ndm_manager_close(step)); /* x, y, loss */
    }
    CHECK(ndm_manager_close(model));
}

/* ---- CNN ---------------------------------------------------------------------- */

static void cnn(ndm_manager root, int steps)
{
    enum { B = 3 };
    const int64_t n = 64, cin[B] = {3, 32, 64}, cout[B] = {32, 64, 128}, hw[B] = {32, 16, 8};
    ndm_manager model = ndm_manager_new(root, "model");
    for (int i = 0; i < B; i++)
        for (int k = 0; k < 4; k++) { /* weight, grad, m, v; and the bias */
            mk(model, NDM_F32, cout[i], cin[i] * 9);
            mk(model, NDM_F32, cout[i], 0);
        }
    for (int k = 0; k < 4; k++) {
        mk(model, NDM_F32, 10, 128);
        mk(model, NDM_F32, 10, 0);
    }
    for (int s = 0; s < steps; s++) {
        ndm_manager step = ndm_manager_new(root, "batch");
        ndm_array x = mk(step, NDM_F32, n * 3, 32 * 32);
        ndm_array y = mk(step, NDM_I64, n, 0);
        ndm_array conv[B], relu[B], pool[B], idx[B];
        for (int i = 0; i < B; i++) {
            int64_t pix = hw[i] * hw[i];
            ndm_array col = mk(step, NDM_F32, n * cin[i] * 9, pix); /* im2col */
            conv[i] = mk(step, NDM_F32, n * cout[i], pix);
            drop(col);
            relu[i] = mk(step, NDM_F32, n * cout[i], pix);
            pool[i] = mk(step, NDM_F32, n * cout[i], pix / 4);
            idx[i] = mk(step, NDM_I64, n * cout[i], pix / 4);
        }
        ndm_array feat = mk(step, NDM_F32, n, 128); /* global average pool */
        ndm_array logits = mk(step, NDM_F32, n, 10);
        ndm_array g = mk(step, NDM_F32, n, 10);
        ndm_array gfc = mk(step, NDM_F32, 10, 128);
        drop(gfc);
        ndm_array gfeat = mk(step, NDM_F32, n, 128);
        drop(g);
        drop(logits);
        drop(feat);
        ndm_array gpool = mk(step, NDM_F32, n * cout[B - 1], hw[B - 1] * hw[B - 1] / 4);
        drop(gfeat);
        for (int i = B - 1; i >= 0; i--) {
            int64_t pix = hw[i] * hw[i];
            ndm_array grelu = mk(step, NDM_F32, n * cout[i], pix); /* unpool */
            drop(gpool);
            drop(idx[i]);
            drop(pool[i]);
            ndm_array gconv = mk(step, NDM_F32, n * cout[i], pix);  /* relu' */
            drop(grelu);
            drop(relu[i]);
            ndm_array col = mk(step, NDM_F32, n * cin[i] * 9, pix); /* im2col again */
            ndm_array gw = mk(step, NDM_F32, cout[i], cin[i] * 9);
            drop(col);
            drop(gw);
            ndm_array gb = mk(step, NDM_F32, cout[i], 0);
            drop(gb);
            if (i > 0) {
                ndm_array gcol = mk(step, NDM_F32, n * cin[i] * 9, pix); /* W^T @ g */
                gpool = mk(step, NDM_F32, n * cin[i], pix);            /* col2im */
                drop(gcol);
            }
            drop(gconv);
            drop(conv[i]);
        }
        for (int i = 0; i < B; i++) {
            adam_step(step, cout[i], cin[i] * 9);
            adam_step(step, cout[i], 0);
        }
        adam_step(step, 10, 128);
        adam_step(step, 10, 0);
        (void)x;
        (void)y;
        CHECK(ndm_manager_close(step));
    }
    CHECK(ndm_manager_close(model));
}

/* ---- serving ------------------------------------------------------------------ */

static void serve(ndm_manager root, int requests)
{
    const int64_t hidden = 1024, ffn = 4096, heads = 16;
    ndm_manager model = ndm_manager_new(root, "predictor");
    for (int l = 0; l < 4; l++) {
        mk(model, NDM_F16, hidden, 3 * hidden);
        mk(model, NDM_F16, hidden, hidden);
        mk(model, NDM_F16, hidden, ffn);
        mk(model, NDM_F16, ffn, hidden);
    }
    uint64_t rng = 0x2545f4914f6cdd1dull;
    for (int r = 0; r < requests; r++) {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        int64_t seq = 16 + (int64_t)(rng % 497);
        ndm_manager req = ndm_manager_new(root, "request");
        ndm_array x = mk(req, NDM_F16, seq, hidden);
        for (int l = 0; l < 4; l++) {
            ndm_array qkv = mk(req, NDM_F16, seq, 3 * hidden);
            ndm_array scores = mk(req, NDM_F16, heads * seq, seq);
            ndm_array probs = mk(req, NDM_F16, heads * seq, seq);
            drop(scores);
            ndm_array ctx = mk(req, NDM_F16, seq, hidden);
            drop(probs);
            drop(qkv);
            ndm_array proj = mk(req, NDM_F16, seq, hidden);
            drop(ctx);
            ndm_array up = mk(req, NDM_F16, seq, ffn);
            ndm_array act = mk(req, NDM_F16, seq, ffn);
            drop(up);
            ndm_array down = mk(req, NDM_F16, seq, hidden);
            drop(act);
            drop(proj);
            drop(x);
            x = down;
        }
        ndm_array logits = mk(req, NDM_F32, 1, 32000);
        (void)logits;
        CHECK(ndm_manager_close(req));
    }
    CHECK(ndm_manager_close(model));
}

int main(int argc, char **argv)
{
    bool known = argc >= 3 && (!strcmp(argv[1], "mlp") || !strcmp(argv[1], "cnn") ||
                               !strcmp(argv[1], "serve"));
    if (!known) {
        fprintf(stderr, "usage: %s mlp|cnn|serve OUT.trace [steps]\n", argv[0]);
        return 2;
    }
    int steps = argc > 3 ? atoi(argv[3]) : (!strcmp(argv[1], "serve") ? 200 : 20);
    ndm_manager root = ndm_manager_new(ndm_system(), argv[1]);
    CHECK(ndm_memory_record_trace(argv[2]));
    if (!strcmp(argv[1], "mlp"))
        mlp(root, steps);
    else if (!strcmp(argv[1], "cnn"))
        cnn(root, steps);
    else
        serve(root, steps);
    CHECK(ndm_memory_record_trace(NULL));
    CHECK(ndm_manager_close(root));
    return 0;
}
