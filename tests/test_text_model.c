/* ndm-text's network: its state named as PyTorch names the same structure,
 * the cached decode (prompt, then one token a pass) giving the logits of the
 * full causal pass, the cache's exact size and ownership, a model closed
 * while threads decode with it, and the corpus' UTF-8 check. */
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <setjmp.h>
#include <stdatomic.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "helpers.h"
#include "ndm/ndm.h"
#include "text_corpus.h"
#include "text_model.h"

static const text_config small = {TEXT_VOCAB, 16, 32, 4, 2};

static void test_text_model_state_names(void **state)
{
    ndm_manager model = ndm_manager_new(ROOT(state), "model");
    ndm_rng rng = ndm_rng_new(3);
    ndm_module net = text_model_new(model, &small, &rng);
    assert_live(net);
    const char *names[64];
    ndm_array a[64];
    int n = ndm_module_named_state(net, names, a, 64);
    /* tok_emb, pos_emb, 2 blocks x (norm1 2, attn 4, norm2 2, mlp 4), norm_f 2, head 1 */
    assert_int_equal(n, 2 + 2 * 12 + 3);
    const char *want[] = {"tok_emb.weight", "pos_emb.weight", "blocks.0.norm1.weight",
                          "blocks.0.norm1.bias", "blocks.0.attn.qkv.weight",
                          "blocks.0.attn.qkv.bias", "blocks.0.attn.proj.weight",
                          "blocks.0.attn.proj.bias", "blocks.0.norm2.weight",
                          "blocks.0.norm2.bias", "blocks.0.mlp.0.weight", "blocks.0.mlp.0.bias",
                          "blocks.0.mlp.2.weight", "blocks.0.mlp.2.bias"};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
        assert_string_equal(names[i], want[i]);
    assert_string_equal(names[n - 3], "norm_f.weight");
    assert_string_equal(names[n - 1], "head.weight");
    assert_int_equal(ndm_array_dim(a[4], 0), 3 * small.width); /* qkv (3w, w) as nn.Linear */
    assert_int_equal(ndm_array_dim(a[n - 1], 0), TEXT_VOCAB);   /* head (vocab, w) */
    assert_ok(ndm_manager_close(model));
}

/* The logits of a cached decode equal the full pass's at every position. */
static void test_text_model_cached_decode_matches_full_pass(void **state)
{
    ndm_manager model = ndm_manager_new(ROOT(state), "model");
    ndm_rng rng = ndm_rng_new(5);
    ndm_no_grad_begin();
    ndm_module net = text_model_new(model, &small, &rng);
    assert_live(net);
    assert_ok(ndm_module_set_training(net, false));
    uint64_t weights = test_live_arrays(model);
    enum { T = 12, P = 5 };
    int64_t ids[T];
    for (int i = 0; i < T; i++)
        ids[i] = (i * 37 + 11) % TEXT_VOCAB;
    ndm_manager run = ndm_manager_new(ROOT(state), "request-0");
    float full[T * TEXT_VOCAB], step[TEXT_VOCAB];
    ndm_array all = ndm_forward(net, ndm_from_buffer(run, NDM_I64, ids, NDM_SHAPE(1, T)));
    assert_live(all);
    assert_ok(ndm_array_copy_out(ndm_contiguous(all), full, sizeof full));
    assert_ok(ndm_manager_close(run));

    run = ndm_manager_new(ROOT(state), "request-1");
    ndm_array cache = text_kv_cache(run, &small, T, NDM_F32);
    assert_live(cache);
    assert_int_equal(ndm_array_nbytes(cache), 2 * 2 * T * 32 * 4);
    assert_int_equal(text_kv_bytes(&small, T, NDM_F32), 2 * 2 * T * 32 * 4);
    int64_t pos = 0, n = P;
    while (pos + n <= T) {
        ndm_manager s = ndm_manager_new(run, "step");
        ndm_array tok = ndm_from_buffer(s, NDM_I64, ids + pos, NDM_SHAPE(1, n));
        ndm_array at = ndm_scalar(s, NDM_I64, (double)pos);
        ndm_array y = ndm_forward_n(net, NDM_ARRAYS(tok, cache, at));
        assert_live(y);
        assert_int_equal(ndm_array_dim(y, 1), n);
        /* every position of this pass against the full pass */
        for (int64_t i = 0; i < n; i++) {
            ndm_array row = ndm_contiguous(ndm_select(ndm_select(y, 0, 0), 0, i));
            assert_ok(ndm_array_copy_out(row, step, sizeof step));
            for (int v = 0; v < TEXT_VOCAB; v++) {
                float want = full[(pos + i) * TEXT_VOCAB + v];
                if (fabsf(step[v] - want) > 1e-4f * (1 + fabsf(want)))
                    fail_msg("position %lld, logit %d: cached %g, full %g", (long long)(pos + i),
                             v, (double)step[v], (double)want);
            }
        }
        assert_ok(ndm_manager_close(s));
        /* between passes the request holds its cache alone */
        ndm_stats st;
        assert_ok(ndm_manager_stats(run, NDM_CPU, NDM_STATS_SUBTREE, &st));
        assert_int_equal(st.live_arrays, 1);
        assert_int_equal(st.live_bytes, text_kv_bytes(&small, T, NDM_F32));
        pos += n;
        n = 1;
    }
    assert_int_equal(pos, T);
    ndm_no_grad_end();
    assert_ok(ndm_manager_close(run));
    assert_int_equal(test_live_arrays(model), weights); /* the requests left nothing in it */
    assert_ok(ndm_manager_close(model));
}

/* Past the context, or a decode step of several tokens after the prompt:
 * refused, and the cache is not written. */
static void test_text_model_refuses_past_the_context(void **state)
{
    ndm_manager model = ndm_manager_new(ROOT(state), "model");
    ndm_rng rng = ndm_rng_new(7);
    ndm_no_grad_begin();
    ndm_module net = text_model_new(model, &small, &rng);
    ndm_manager run = ndm_manager_new(ROOT(state), "request");
    int64_t ids[17] = {0};
    ndm_array tok = ndm_from_buffer(run, NDM_I64, ids, NDM_SHAPE(1, 17));
    assert_false(ndm_forward(net, tok).id);
    ndm_array cache = text_kv_cache(run, &small, 16, NDM_F32);
    ndm_array two = ndm_from_buffer(run, NDM_I64, ids, NDM_SHAPE(1, 2));
    assert_false(ndm_forward_n(net, NDM_ARRAYS(two, cache, ndm_scalar(run, NDM_I64, 3))).id);
    float sum = 1;
    assert_ok(ndm_array_copy_out(ndm_sum(ndm_abs(cache), false, NDM_ALL_AXES_LIST), &sum,
                                 sizeof sum));
    assert_true(sum == 0);
    ndm_no_grad_end();
    assert_ok(ndm_manager_close(run));
    assert_ok(ndm_manager_close(model));
}

/* ---- the model closed while requests decode --------------------------------- */

typedef struct decoder {
    ndm_module net;
    ndm_manager parent; /* the predictor's manager */
    int index;
    _Atomic long steps;
    ndm_status last;    /* the status that ended the loop */
    char why[512];      /* and its message */
    bool unclear;       /* an ending other than a clear refusal */
} decoder;

/* Requests of a full context each, one decode pass per token, until a call
 * is refused. */
static void *decode(void *p)
{
    decoder *d = p;
    int64_t ids[1] = {3};
    for (;;) {
        char name[32];
        snprintf(name, sizeof name, "request-%d", d->index);
        ndm_manager req = ndm_manager_new(d->parent, name);
        ndm_array cache = req.id ? text_kv_cache(req, &small, small.ctx, NDM_F32) : NDM_NULL_ARRAY;
        bool ok = cache.id != 0;
        for (int64_t pos = 0; ok && pos < small.ctx; pos++) {
            ndm_manager s = ndm_manager_new(req, "step");
            ndm_array y = ndm_forward_n(d->net, NDM_ARRAYS(ndm_from_buffer(s, NDM_I64, ids, NDM_SHAPE(1, 1)),
                                                          cache, ndm_scalar(s, NDM_I64, (double)pos)));
            float out[TEXT_VOCAB];
            ok = y.id && ndm_array_copy_out(y, out, sizeof out) == NDM_OK;
            if (ok && !isfinite(out[0])) {
                snprintf(d->why, sizeof d->why, "a logit that is not finite: %g", (double)out[0]);
                d->unclear = true;
                return NULL;
            }
            /* the step closed already: by the model's close, after its pass */
            ndm_status cs = ok ? ndm_manager_close(s) : NDM_OK;
            if (cs == NDM_ALREADY) {
                d->last = NDM_E_CLOSED;
                (void)ndm_manager_close(req);
                return NULL;
            }
            ok = ok && cs == NDM_OK;
            if (ok)
                atomic_fetch_add(&d->steps, 1);
        }
        if (!ok) {
            d->last = ndm_last_status();
            snprintf(d->why, sizeof d->why, "%s", ndm_last_error());
            d->unclear = !(d->last == NDM_E_CLOSED || d->last == NDM_E_NULL) || !d->why[0];
            /* closed with the model already, or now while the model's close
             * runs, or never made: the model was gone */
            ndm_status cs = req.id ? ndm_manager_close(req) : NDM_ALREADY;
            if (cs != NDM_ALREADY && cs != NDM_OK) {
                d->unclear = true;
                snprintf(d->why, sizeof d->why, "closing the request: %s", ndm_status_name(cs));
            }
            return NULL;
        }
        if (ndm_manager_close(req) != NDM_OK) {
            d->unclear = true;
            return NULL;
        }
    }
}

static void test_text_model_closed_while_decoding(void **state)
{
    (void)state;
    enum { N = 3 };
    ndm_manager model = ndm_manager_new(ndm_system(), "model");
    ndm_rng rng = ndm_rng_new(9);
    ndm_no_grad_begin();
    ndm_module net = text_model_new(model, &small, &rng);
    ndm_no_grad_end();
    assert_live(net);
    ndm_predictor pred = ndm_predictor_new(model, net);
    assert_true(pred.id != 0);
    decoder d[N];
    pthread_t th[N];
    for (int i = 0; i < N; i++) {
        d[i] = (decoder){.net = net, .parent = ndm_predictor_manager(pred), .index = i};
        assert_int_equal(pthread_create(&th[i], NULL, decode, &d[i]), 0);
    }
    /* requests under way on every thread (one past its first cache), then the close */
    for (int i = 0; i < N; i++)
        while (atomic_load(&d[i].steps) < small.ctx + 2)
            sched_yield();
    assert_ok(ndm_manager_close(model));
    for (int i = 0; i < N; i++) {
        pthread_join(th[i], NULL);
        if (d[i].unclear)
            fail_msg("thread %d ended with %s: %s", i, ndm_status_name(d[i].last), d[i].why);
    }
}

static void test_text_corpus_utf8(void **state)
{
    (void)state;
    size_t bad = 99;
    const char *ok = "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80";
    assert_true(text_utf8_valid((const unsigned char *)ok, strlen(ok), &bad));
    assert_false(text_utf8_valid((const unsigned char *)ok, strlen(ok) - 1, &bad));
    assert_int_equal(bad, strlen(ok) - 4);
    assert_false(text_utf8_valid((const unsigned char *)"ab\xff", 3, &bad));
    assert_int_equal(bad, 2);
    assert_false(text_utf8_valid((const unsigned char *)"a\xc3", 2, &bad)); /* cut short */
    assert_int_equal(bad, 1);
    assert_false(text_utf8_valid((const unsigned char *)"\xc0\xaf", 2, &bad)); /* overlong */
    assert_int_equal(bad, 0);
    assert_false(text_utf8_valid((const unsigned char *)"x\xed\xa0\x80", 4, &bad)); /* surrogate */
    assert_int_equal(bad, 1);
    assert_int_equal(text_char_id('\n'), 0);
    assert_int_equal(text_char_id(' '), 1);
    assert_int_equal(text_char_id('~'), TEXT_VOCAB - 1);
    assert_int_equal(text_char_id('\t'), -1);
    assert_int_equal(text_id_char(text_char_id('q')), 'q');
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        TEST(test_text_model_state_names),
        TEST(test_text_model_cached_decode_matches_full_pass),
        TEST(test_text_model_refuses_past_the_context),
        TEST(test_text_model_closed_while_decoding),
        TEST(test_text_corpus_utf8),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
