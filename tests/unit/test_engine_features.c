/* test_engine_features.c — engine features seen from the public engine API:
 * prompt logprobs (against the oracle's Hugging Face logits of every
 * position, through chunked prefill and the prefix cache), error codes of
 * engine_submit, generation_config.json sampling defaults, and output text
 * decoded after the prompt (the leading space SentencePiece puts on the
 * first output token). */
#include <math.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "base/error.h"
#include "base/mem.h"
#include "test_tmp.h"
#include "kiln/tokenizer.h"
#include "model/safetensors.h"
#include "scheduler/engine.h"

#include "../engine_sink.h"

static struct engine *start(const char *dir, int chunk, enum engine_sampling_defaults sd) {
    struct engine_options o;
    engine_options_default(&o);
    o.model_dir = dir;
    o.skip_sampler_warmup = 1;
    o.threads = 2;
    o.chunked_prefill_size = chunk;
    o.sampling_defaults = sd;
    o.decode_log_interval = 0;
    struct engine *e;
    struct kiln_error err;
    if (engine_create(&e, &o, &err)) fail_msg("engine_create: %s", err.msg);
    return e;
}

static void request_init(struct engine_request *r, const int32_t *p, int n, int max_new, struct sink *s) {
    memset(r, 0, sizeof *r);
    r->prompt = p;
    r->n_prompt = n;
    sampling_params_default(&r->sampling);
    r->sampling.temperature = 0;
    r->max_new_tokens = max_new;
    r->ignore_eos = 1;
    r->skip_special_tokens = 1;
    r->callback = sink_on_event;
    r->user = s;
}

static void errors(void **state) {
    (void)state;
    struct kiln_error err = {0};
    assert_int_equal(kiln_errorf(&err, "bad %d", 1), -1);
    assert_int_equal(err.code, KILN_ERR_BAD_INPUT);
    assert_int_equal(kiln_errorc(&err, KILN_ERR_OUT_OF_MEMORY, "no room"), -1);
    kiln_error_prefix(&err, "loading %s", "x");
    assert_string_equal(err.msg, "loading x: no room");
    assert_int_equal(err.code, KILN_ERR_OUT_OF_MEMORY);
    assert_string_equal(kiln_error_code_name(KILN_ERR_TOO_LARGE), "too_large");
    assert_int_equal(kiln_errorc(NULL, KILN_ERR_INTERNAL, "ignored"), -1);
}

/* log_softmax(row)[id], in double, from the oracle's logits */
static double ref_logprob(const float *row, int vocab, int id) {
    double mx = -INFINITY, sum = 0;
    for (int i = 0; i < vocab; i++) mx = fmax(mx, row[i]);
    for (int i = 0; i < vocab; i++) sum += exp((double)row[i] - mx);
    return (double)row[id] - mx - log(sum);
}

static void check_prompt_logprobs(const struct sink *s, const int32_t *ids, const float *logits, int vocab,
                                  int from, int n) {
    for (int p = 0; p < n; p++) {
        if (p < from || p == 0) {
            assert_int_equal(s->lp_seen[p], 0);
            continue;
        }
        assert_int_equal(s->lp_seen[p], 1);
        assert_int_equal(s->lp[p].token, ids[p]);
        double want = ref_logprob(logits + (size_t)(p - 1) * vocab, vocab, ids[p]);
        if (fabs(want - s->lp[p].logprob) > 2e-4)
            fail_msg("position %d: logprob %g, Hugging Face %g", p, (double)s->lp[p].logprob, want);
        /* the top alternative is the row's argmax */
        const float *row = logits + (size_t)(p - 1) * vocab;
        int best = 0;
        for (int i = 1; i < vocab; i++)
            if (row[i] > row[best]) best = i;
        assert_true(s->lp[p].n_top == 3);
        assert_int_equal(s->lp[p].top_ids[0], best);
    }
    assert_int_equal(s->lp_events_after_token, 0);
}

/* Chunks of 7 tokens: the rows of a position come from whichever chunk
 * computed it; a second request over the same prompt finds it cached, and
 * the rows it asks for must still be computed (not served from the cache,
 * which has no logits). */
static void prompt_logprobs(void **state) {
    (void)state;
    char dir[4096], ref_path[4096 + 64];
    snprintf(dir, sizeof dir, "%s/oracle/tiny-models/qwen3", getenv("KILN_FIXTURES"));
    snprintf(ref_path, sizeof ref_path, "%s/reference.safetensors", dir);
    struct st_set ref = {0};
    struct kiln_error err;
    if (st_open_file(&ref, ref_path, &err)) fail_msg("%s", err.msg);
    const struct st_tensor *ids_t = st_find(&ref, "p1.ids"), *lg_t = st_find(&ref, "p1.logits");
    const int32_t *ids = ids_t->data;
    const float *logits = lg_t->data;
    int n = 51, vocab = 1024;
    struct engine *e = start(dir, 7, ENGINE_SAMPLING_DEFAULTS_MODEL);
    int starts[] = {0, 0, 30, 50, 51};
    for (size_t k = 0; k < sizeof starts / sizeof starts[0]; k++) {
        struct sink *s = sink_new();
        struct engine_request r;
        request_init(&r, ids, n, 2, s);
        r.prompt_logprobs = 1;
        r.prompt_logprob_start = starts[k];
        r.sampling.top_logprobs = 3;
        assert_true(engine_submit(e, &r, &err) > 0);
        sink_wait(s);
        assert_int_equal(s->finish, ENGINE_FINISH_LENGTH);
        check_prompt_logprobs(s, ids, logits, vocab, starts[k], n);
        /* the cache still serves what comes before the requested rows */
        if (k == 2) assert_true(s->cached_tokens > 0 && s->cached_tokens < 30);
        sink_free(s);
    }
    /* without prompt logprobs the whole prompt but the last token is cached */
    struct sink *s = sink_new();
    struct engine_request r;
    request_init(&r, ids, n, 1, s);
    assert_true(engine_submit(e, &r, &err) > 0);
    sink_wait(s);
    assert_int_equal(s->cached_tokens, n - 1);
    assert_int_equal(s->lp_seen[1], 0);
    sink_free(s);
    engine_destroy(e);
    st_close(&ref);
}

static void submit_codes(void **state) {
    (void)state;
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/stories260K", getenv("KILN_MODELS"));
    struct engine *e = start(dir, 0, ENGINE_SAMPLING_DEFAULTS_MODEL);
    int32_t p[600];
    for (int i = 0; i < 600; i++) p[i] = 300 + i % 100;
    struct engine_request r;
    struct kiln_error err = {0};
    request_init(&r, p, 600, 1, NULL);
    assert_int_equal(engine_submit(e, &r, &err), 0);
    assert_int_equal(err.code, KILN_ERR_TOO_LARGE);
    request_init(&r, p, 100, 500, NULL);
    assert_int_equal(engine_submit(e, &r, &err), 0);
    assert_int_equal(err.code, KILN_ERR_TOO_LARGE);
    p[3] = 100000;
    request_init(&r, p, 10, 1, NULL);
    assert_int_equal(engine_submit(e, &r, &err), 0);
    assert_int_equal(err.code, KILN_ERR_BAD_INPUT);
    engine_destroy(e);
}

/* A copy of stories260K whose generation_config.json sets `gen`. */
static void model_copy(char *dir, size_t cap, const char *gen) {
    char *tmp = test_tmp_dir("test_gencfg");
    assert_true(strlen(tmp) < cap);
    snprintf(dir, cap, "%s", tmp);
    free(tmp);
    const char *files[] = {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        char src[4096], dst[4096 + 64];
        snprintf(src, sizeof src, "%s/stories260K/%s", getenv("KILN_MODELS"), files[i]);
        snprintf(dst, sizeof dst, "%s/%s", dir, files[i]);
        if (symlink(src, dst)) fail_msg("symlink %s", dst);
    }
    char path[4096 + 64];
    snprintf(path, sizeof path, "%s/generation_config.json", dir);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(gen, f);
    fclose(f);
}

static void model_copy_remove(const char *dir) {
    const char *files[] = {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
                           "generation_config.json"};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        char p[4096 + 64];
        snprintf(p, sizeof p, "%s/%s", dir, files[i]);
        unlink(p);
    }
    rmdir(dir);
}

/* Sampled with seed `seed`; `unset` as the server computes it. */
static void sample(struct engine *e, uint64_t seed, unsigned unset, int top_k, int32_t *out) {
    int32_t p[] = {1, 403, 407};
    struct sink *s = sink_new();
    struct engine_request r;
    request_init(&r, p, 3, 24, s);
    r.sampling.temperature = 1;
    r.sampling.top_k = top_k;
    r.sampling.has_seed = 1;
    r.sampling.seed = seed;
    r.sampling_unset = unset;
    struct kiln_error err;
    assert_true(engine_submit(e, &r, &err) > 0);
    sink_wait(s);
    assert_int_equal(s->n_ids, 24);
    memcpy(out, s->ids, 24 * sizeof *out);
    sink_free(s);
}

/* generation_config.json says top_k 1 (greedy): requests that leave top_k
 * unset decode greedily whatever their seed; one that sets it, or a server
 * told to ignore the model's defaults, samples. */
static void sampling_defaults(void **state) {
    (void)state;
    char dir[4096];
    model_copy(dir, sizeof dir, "{\"bos_token_id\": 1, \"eos_token_id\": 2, \"top_k\": 1, \"temperature\": 0.7}");
    int32_t greedy[24], a[24], b[24];
    struct engine *e = start(dir, 0, ENGINE_SAMPLING_DEFAULTS_MODEL);
    struct sampling_params d;
    unsigned mask = engine_sampling_defaults(e, &d);
    assert_int_equal(mask, SAMPLING_FIELD_TOP_K | SAMPLING_FIELD_TEMPERATURE);
    assert_int_equal(d.top_k, 1);
    assert_true(fabsf(d.temperature - 0.7f) < 1e-6f);
    sample(e, 1, SAMPLING_FIELD_ALL, 0, greedy);
    int differ_explicit = 0;
    for (uint64_t seed = 2; seed < 6; seed++) {
        sample(e, seed, SAMPLING_FIELD_ALL, 0, a);
        assert_memory_equal(a, greedy, sizeof a);
        sample(e, seed, SAMPLING_FIELD_ALL & ~SAMPLING_FIELD_TOP_K, 0, b); /* top_k given: off */
        differ_explicit += memcmp(b, greedy, sizeof b) != 0;
    }
    assert_true(differ_explicit > 0);
    engine_destroy(e);
    e = start(dir, 0, ENGINE_SAMPLING_DEFAULTS_OPENAI);
    assert_int_equal(engine_sampling_defaults(e, &d), 0);
    int differ = 0;
    for (uint64_t seed = 2; seed < 6; seed++) {
        sample(e, seed, SAMPLING_FIELD_ALL, 0, a);
        differ += memcmp(a, greedy, sizeof a) != 0;
    }
    assert_true(differ > 0);
    engine_destroy(e);
    model_copy_remove(dir);
}

/* "Once" continues with " upon": the text of the output is what the decode
 * of prompt + output adds to the decode of the prompt (Hugging Face's and
 * the peers' answer), so the first token keeps its space and a stop string
 * " upon" matches it. */
static void leading_space(void **state) {
    (void)state;
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/stories260K", getenv("KILN_MODELS"));
    struct engine *e = start(dir, 0, ENGINE_SAMPLING_DEFAULTS_MODEL);
    const struct kiln_tokenizer *tok = engine_tokenizer(e);
    struct kiln_token_ids ids = {0};
    struct kiln_error err;
    assert_int_equal(kiln_tokenizer_encode(tok, "Once", 4, 1, &ids, &err), 0);
    int32_t p[8];
    int n = 0;
    if (!ids.n || ids.ids[0] != kiln_tokenizer_bos_id(tok)) p[n++] = kiln_tokenizer_bos_id(tok);
    for (size_t i = 0; i < ids.n; i++) p[n++] = ids.ids[i];
    kiln_token_ids_free(&ids);
    struct sink *s = sink_new();
    struct engine_request r;
    request_init(&r, p, n, 4, s);
    assert_true(engine_submit(e, &r, &err) > 0);
    sink_wait(s);
    /* the independent truth: decode(prompt + output) minus decode(prompt) */
    int32_t all[16];
    memcpy(all, p, (size_t)n * sizeof *p);
    memcpy(all + n, s->ids, (size_t)s->n_ids * sizeof *p);
    char *full = NULL, *pre = NULL;
    size_t fl, pl;
    assert_int_equal(kiln_tokenizer_decode(tok, all, (size_t)(n + s->n_ids), 1, &full, &fl, NULL), 0);
    assert_int_equal(kiln_tokenizer_decode(tok, p, (size_t)n, 1, &pre, &pl, NULL), 0);
    assert_true(fl > pl && !memcmp(full, pre, pl));
    assert_int_equal(s->text.len, fl - pl);
    assert_memory_equal(s->text.data, full + pl, fl - pl);
    assert_true(s->text.data[0] == ' ');
    free(full), free(pre);
    sink_free(s);
    /* a stop string with the leading space ends the request at once */
    s = sink_new();
    request_init(&r, p, n, 4, s);
    const char *stop[] = {" upon"};
    r.stop = stop;
    r.n_stop = 1;
    assert_true(engine_submit(e, &r, &err) > 0);
    sink_wait(s);
    assert_int_equal(s->finish, ENGINE_FINISH_STOP);
    assert_int_equal(s->text.len, 0);
    assert_int_equal(s->n_ids, 1);
    sink_free(s);
    engine_destroy(e);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(errors),
        cmocka_unit_test(prompt_logprobs),
        cmocka_unit_test(submit_codes),
        cmocka_unit_test(sampling_defaults),
        cmocka_unit_test(leading_space),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
