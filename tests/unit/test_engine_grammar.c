/* test_engine_grammar.c — grammar-constrained decoding in the engine (CPU
 * backend, the bundled stories260K model, whose weights know nothing of
 * the grammars below): outputs match a hand-written recogniser of each
 * grammar's language, the finish reasons follow the grammar (its end and
 * an end-of-sequence id: "stop"; max_new_tokens first: "length"), greedy
 * and seeded sampling, batches mixing grammars with free requests (the
 * free ones unchanged), a grammar that starts after a given token
 * sequence, ignore_eos, min_new_tokens and stop strings, and requests retracted for
 * lack of KV memory keeping their grammar's place. */
#include <ctype.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "base/error.h"
#include "base/mem.h"
#include "grammar/grammar.h"
#include "kiln/tokenizer.h"
#include "scheduler/engine.h"

#include "../engine_sink.h"

/* "The " ("cat" | "dog") " ate " [1-9][0-9]? " apples." */
static const char *const SENTENCE =
    "root ::= \"The \" animal \" ate \" num \" apples.\"\n"
    "animal ::= \"cat\" | \"dog\"\n"
    "num ::= [1-9] [0-9]?\n";

static int is_sentence(const char *s) {
    if (strncmp(s, "The ", 4)) return 0;
    s += 4;
    if (strncmp(s, "cat", 3) && strncmp(s, "dog", 3)) return 0;
    s += 3;
    if (strncmp(s, " ate ", 5)) return 0;
    s += 5;
    if (*s < '1' || *s > '9') return 0;
    s++;
    if (isdigit((unsigned char)*s)) s++;
    return !strcmp(s, " apples.");
}

/* A prefix of some sentence (what max_new_tokens may leave). */
static int is_sentence_prefix(const char *s) {
    static const char *const full[] = {"The cat ate 5 apples.", "The dog ate 5 apples.", "The cat ate 55 apples.",
                                       "The dog ate 55 apples."};
    size_t n = strlen(s);
    for (int k = 0; k < 4; k++) {
        int ok = n <= strlen(full[k]);
        for (size_t i = 0; ok && i < n; i++) ok = isdigit((unsigned char)full[k][i]) ? isdigit((unsigned char)s[i]) : s[i] == full[k][i];
        if (ok) return 1;
    }
    return 0;
}

static struct engine *start(long kv_tokens) {
    struct engine_options o;
    engine_options_default(&o);
    const char *m = getenv("KILN_MODELS");
    static char dir[1024];
    snprintf(dir, sizeof dir, "%s/stories260K", m ? m : "models");
    o.model_dir = dir;
    o.skip_sampler_warmup = 1;
    o.threads = 2;
    o.decode_log_interval = 0;
    o.max_total_tokens = (int)kv_tokens;
    struct engine *e;
    struct kiln_error err;
    if (engine_create(&e, &o, &err)) fail_msg("engine_create: %s", err.msg);
    return e;
}

static struct grammar *compile(const struct engine *e, const char *ebnf) {
    struct kiln_error err;
    struct grammar *g = grammar_compile_ebnf(ebnf, strlen(ebnf), NULL, &err);
    if (!g) fail_msg("grammar: %s", err.msg);
    assert_int_equal(grammar_prepare(g, engine_grammar_vocab(e), &err), 0);
    return g;
}

static int32_t prompt[8];
static int n_prompt;

static void request_init(struct engine_request *r, struct grammar *g, int max_new, struct sink *s) {
    memset(r, 0, sizeof *r);
    r->prompt = prompt;
    r->n_prompt = n_prompt;
    sampling_params_default(&r->sampling);
    r->sampling.temperature = 0;
    r->max_new_tokens = max_new;
    r->skip_special_tokens = 1;
    r->grammar = g;
    r->callback = sink_on_event;
    r->user = s;
}

static struct sink *submit(struct engine *e, struct engine_request *r) {
    struct kiln_error err;
    struct sink *s = r->user;
    if (!engine_submit(e, r, &err)) fail_msg("submit: %s", err.msg);
    return s;
}

static int setup(void **state) {
    (void)state;
    /* "Once upon a time" in the model's ids, BOS first */
    const char *m = getenv("KILN_MODELS");
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/stories260K", m ? m : "models");
    struct kiln_tokenizer *tok;
    struct kiln_error err;
    if (kiln_tokenizer_load(&tok, dir, &err)) return -1;
    struct kiln_token_ids ids = {0};
    kiln_tokenizer_encode(tok, "Once upon a time", 16, 1, &ids, &err);
    n_prompt = (int)(ids.n < 8 ? ids.n : 8);
    memcpy(prompt, ids.ids, (size_t)n_prompt * 4);
    kiln_token_ids_free(&ids);
    kiln_tokenizer_free(tok);
    return 0;
}

static void greedy_and_sampled(void **state) {
    (void)state;
    struct engine *e = start(0);
    struct grammar *g = compile(e, SENTENCE);
    struct engine_request r;
    struct sink *s[6];
    for (int k = 0; k < 6; k++) {
        request_init(&r, g, 64, sink_new());
        if (k) {
            r.sampling.temperature = 1.5f;
            r.sampling.has_seed = 1;
            r.sampling.seed = (uint64_t)(k < 5 ? k : 4); /* the last repeats seed 4 */
        }
        s[k] = submit(e, &r);
    }
    grammar_unref(g); /* the engine holds its own references */
    for (int k = 0; k < 6; k++) {
        sink_wait(s[k]);
        printf("  request %d: \"%s\" (%d tokens)\n", k, s[k]->text.data, s[k]->n_ids);
        assert_int_equal(s[k]->finish, ENGINE_FINISH_STOP);
        assert_true(is_sentence(s[k]->text.data));
    }
    assert_string_equal(s[4]->text.data, s[5]->text.data);
    for (int k = 0; k < 6; k++) sink_free(s[k]);
    engine_destroy(e);
}

static void finish_reasons(void **state) {
    (void)state;
    struct engine *e = start(0);
    struct grammar *g = compile(e, SENTENCE);
    struct engine_request r;
    /* max_new_tokens before the end: length, a prefix of the language */
    request_init(&r, g, 3, sink_new());
    struct sink *a = submit(e, &r);
    /* ignore_eos: the grammar's end still ends the request */
    request_init(&r, g, 64, sink_new());
    r.ignore_eos = 1;
    struct sink *b = submit(e, &r);
    /* min_new_tokens past the grammar's end: the grammar wins */
    request_init(&r, g, 64, sink_new());
    r.min_new_tokens = 40;
    struct sink *c = submit(e, &r);
    /* a stop string inside the structure ends it there, as without a grammar */
    static const char *const stops[] = {" ate"};
    request_init(&r, g, 64, sink_new());
    r.stop = stops, r.n_stop = 1;
    struct sink *d = submit(e, &r);
    sink_wait(a), sink_wait(b), sink_wait(c), sink_wait(d);
    assert_int_equal(d->finish, ENGINE_FINISH_STOP);
    assert_true(!strcmp(d->text.data, "The cat") || !strcmp(d->text.data, "The dog"));
    sink_free(d);
    assert_int_equal(a->finish, ENGINE_FINISH_LENGTH);
    assert_int_equal(a->n_ids, 3);
    assert_true(is_sentence_prefix(a->text.data));
    assert_false(is_sentence(a->text.data));
    for (struct sink *x = b; x; x = x == b ? c : NULL) {
        assert_int_equal(x->finish, ENGINE_FINISH_STOP);
        assert_true(is_sentence(x->text.data));
        assert_true(x->n_ids < 40);
    }
    sink_free(a), sink_free(b), sink_free(c);
    grammar_unref(g);
    engine_destroy(e);
}

/* Free requests next to constrained ones produce what they produce alone. */
static void mixed_batch(void **state) {
    (void)state;
    struct engine *e = start(0);
    struct grammar *g = compile(e, SENTENCE);
    struct grammar *digits = compile(e, "root ::= [0-9] [0-9] [0-9] \"!\"");
    struct engine_request r;
    request_init(&r, NULL, 20, sink_new());
    r.ignore_eos = 1;
    struct sink *alone = submit(e, &r);
    sink_wait(alone);
    struct sink *s[9];
    for (int k = 0; k < 9; k++) {
        request_init(&r, k % 3 == 0 ? NULL : k % 3 == 1 ? g : digits, k % 3 == 0 ? 20 : 64, sink_new());
        r.ignore_eos = k % 3 == 0;
        s[k] = submit(e, &r);
    }
    for (int k = 0; k < 9; k++) {
        sink_wait(s[k]);
        const char *t = s[k]->text.data;
        if (k % 3 == 0) {
            assert_string_equal(t, alone->text.data);
        } else if (k % 3 == 1) {
            assert_true(is_sentence(t));
        } else {
            assert_int_equal(strlen(t), 4);
            assert_true(isdigit((unsigned char)t[0]) && isdigit((unsigned char)t[1]) &&
                        isdigit((unsigned char)t[2]) && t[3] == '!');
        }
        sink_free(s[k]);
    }
    sink_free(alone);
    grammar_unref(g), grammar_unref(digits);
    engine_destroy(e);
}

/* grammar_after: free text up to (and with) the trigger token, then the
 * grammar. The trigger is a token the free greedy output has at index 2. */
static void after_trigger(void **state) {
    (void)state;
    struct engine *e = start(0);
    struct grammar *g = compile(e, SENTENCE);
    struct engine_request r;
    request_init(&r, NULL, 12, sink_new());
    r.ignore_eos = 1;
    struct sink *free_run = submit(e, &r);
    sink_wait(free_run);
    assert_true(free_run->n_ids >= 3);
    int32_t trig = free_run->ids[2];
    int first = 0;
    while (free_run->ids[first] != trig) first++;
    request_init(&r, g, 64, sink_new());
    r.grammar_after = &trig;
    r.n_grammar_after = 1;
    struct sink *s = submit(e, &r);
    sink_wait(s);
    assert_int_equal(s->finish, ENGINE_FINISH_STOP);
    assert_true(s->n_ids > first + 1);
    assert_memory_equal(s->ids, free_run->ids, (size_t)(first + 1) * 4);
    /* the text after the trigger's: decoded from the ids after it */
    const char *m = getenv("KILN_MODELS");
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/stories260K", m ? m : "models");
    struct kiln_tokenizer *tok;
    struct kiln_error err;
    assert_int_equal(kiln_tokenizer_load(&tok, dir, &err), 0);
    struct kiln_token_bytes tb;
    assert_int_equal(kiln_tokenizer_token_bytes(tok, &tb, &err), 0);
    struct buf tail = {0};
    buf_reserve(&tail, 0);
    for (int i = first + 1; i < s->n_ids - 1; i++) buf_append(&tail, tb.bytes[s->ids[i]], tb.lens[s->ids[i]]);
    printf("  free \"%s\", then \"%s\"\n", free_run->text.data, tail.data);
    assert_true(is_sentence(tail.data));
    buf_free(&tail);
    kiln_token_bytes_free(&tb);
    kiln_tokenizer_free(tok);
    sink_free(free_run), sink_free(s);
    grammar_unref(g);
    engine_destroy(e);
}

/* A KV pool too small for the batch: requests are retracted and resumed;
 * their matchers stay where they were. */
static void retraction(void **state) {
    (void)state;
    struct engine *e = start(160);
    struct grammar *g = compile(e, "root ::= \"(\" ([a-z] \" \"){80,90} \")\"");
    struct engine_request r;
    struct sink *s[8];
    for (int k = 0; k < 8; k++) {
        request_init(&r, g, 150, sink_new());
        r.sampling.temperature = 1;
        r.sampling.has_seed = 1;
        r.sampling.seed = (uint64_t)k;
        s[k] = submit(e, &r);
    }
    for (int k = 0; k < 8; k++) {
        sink_wait(s[k]);
        const char *t = s[k]->text.data;
        size_t n = strlen(t);
        assert_int_equal(s[k]->finish, ENGINE_FINISH_STOP);
        assert_true(n >= 162 && n <= 182 && t[0] == '(' && t[n - 1] == ')');
        for (size_t i = 1; i + 1 < n; i++) assert_true(i % 2 ? t[i] >= 'a' && t[i] <= 'z' : t[i] == ' ');
        sink_free(s[k]);
    }
    struct engine_stats st;
    engine_stats(e, &st);
    printf("  %ld retractions\n", st.retractions_total);
    assert_true(st.retractions_total > 0);
    grammar_unref(g);
    engine_destroy(e);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(greedy_and_sampled), cmocka_unit_test(finish_reasons), cmocka_unit_test(mixed_batch),
        cmocka_unit_test(after_trigger),      cmocka_unit_test(retraction),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
