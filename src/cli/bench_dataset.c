#include "cli/bench_dataset.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/mem.h"
#include "cli/bench_rng.h"
#include "kiln/tokenizer.h"

/* Ids random prompts draw from: no special tokens (a server may refuse or
 * strip them) and no byte-fallback pieces (alone they decode to invalid
 * UTF-8, which the round trip would turn into replacement characters). */
struct id_pool {
    int32_t *ids;
    int n;
};

static int is_byte_piece(const char *s, size_t len) {
    return len == 6 && s[0] == '<' && s[1] == '0' && s[2] == 'x' && s[5] == '>';
}

static int ordinary_id(const struct kiln_tokenizer *tok, int32_t id) {
    size_t len;
    const char *s = kiln_tokenizer_id_to_token(tok, id, &len);
    return s && len > 0 && !kiln_tokenizer_is_special(tok, id) && !is_byte_piece(s, len);
}

static int pool_init(struct id_pool *p, const struct kiln_tokenizer *tok, struct kiln_error *err) {
    int32_t lim = kiln_tokenizer_id_limit(tok);
    p->ids = xmalloc((size_t)(lim > 0 ? lim : 1) * sizeof *p->ids);
    p->n = 0;
    for (int32_t id = 0; id < lim; id++)
        if (ordinary_id(tok, id)) p->ids[p->n++] = id;
    if (p->n == 0) return kiln_errorf(err, "the tokenizer has no ordinary tokens to build prompts from");
    return 0;
}

int bench_default_label_ids(const struct kiln_tokenizer *tok, int32_t *out, int n) {
    int k = 0;
    int32_t lim = kiln_tokenizer_id_limit(tok);
    for (int32_t id = 0; id < lim && k < n; id++)
        if (ordinary_id(tok, id)) out[k++] = id;
    return k;
}

static int encode(const struct kiln_tokenizer *tok, const char *s, int special, struct kiln_token_ids *ids,
                  struct kiln_error *err) {
    return kiln_tokenizer_encode(tok, s, strlen(s), special, ids, err);
}

/* Random text whose own tokenization (without special tokens) has
 * `target` tokens. Decoding and re-encoding merges or splits pieces, so the
 * ids are corrected from the re-encoding until the count holds. */
static int random_text(const struct kiln_tokenizer *tok, const struct id_pool *pool, struct bench_rng *rng,
                       int target, char **out, struct kiln_error *err) {
    struct kiln_token_ids enc = {0};
    int32_t *ids = xmalloc((size_t)(target > 0 ? target : 1) * sizeof *ids);
    int n = target;
    char *text = NULL;
    size_t len;
    for (int i = 0; i < n; i++) ids[i] = pool->ids[bench_rng_range(rng, 0, pool->n - 1)];
    for (int round = 0; round < 32; round++) {
        free(text);
        text = NULL;
        if (kiln_tokenizer_decode(tok, ids, (size_t)n, 1, &text, &len, err)) goto fail;
        if (encode(tok, text, 0, &enc, err)) goto fail;
        if ((int)enc.n == target) break;
        /* Keep what the tokenizer made of the text (it is stable under a
         * further round trip more often than the raw draw) and fix the end. */
        n = (int)enc.n < target ? (int)enc.n : target;
        if (n) memcpy(ids, enc.ids, (size_t)n * sizeof *ids);
        while (n < target) ids[n++] = pool->ids[bench_rng_range(rng, 0, pool->n - 1)];
    }
    free(ids);
    kiln_token_ids_free(&enc);
    *out = text;
    return 0;
fail:
    free(ids);
    free(text);
    kiln_token_ids_free(&enc);
    return -1;
}

/* Sets text/ids/prompt_len from the final text, encoded as the server
 * encodes a completion prompt (with the tokenizer's special tokens). */
static int finish_prompt(const struct kiln_tokenizer *tok, struct bench_prompt *p, char *text,
                         struct kiln_error *err) {
    struct kiln_token_ids enc = {0};
    p->text = text;
    if (encode(tok, text, 1, &enc, err)) return -1;
    p->ids = enc.ids;
    p->n_ids = (int)enc.n;
    p->prompt_len = (int)enc.n;
    return 0;
}

/* Tokens the tokenizer adds around any text (BOS for Llama-2 style). */
static int special_overhead(const struct kiln_tokenizer *tok, struct kiln_error *err, int *out) {
    struct kiln_token_ids enc = {0};
    if (kiln_tokenizer_encode(tok, "", 0, 1, &enc, err)) return -1;
    *out = (int)enc.n;
    kiln_token_ids_free(&enc);
    return 0;
}

static int len_low(int len, double ratio) {
    int lo = (int)(len * ratio);
    return lo < 1 ? 1 : lo;
}

static int build_random(const struct bench_options *o, const struct kiln_tokenizer *tok, const struct id_pool *pool,
                        struct bench_rng *rng, struct bench_prompt *ps, struct kiln_error *err) {
    int overhead;
    if (special_overhead(tok, err, &overhead)) return -1;
    for (int i = 0; i < o->num_prompts; i++) {
        int in = (int)bench_rng_range(rng, len_low(o->random_input_len, o->random_range_ratio), o->random_input_len);
        int out = (int)bench_rng_range(rng, len_low(o->random_output_len, o->random_range_ratio),
                                       o->random_output_len);
        int content = in - overhead > 0 ? in - overhead : 0;
        char *text;
        if (random_text(tok, pool, rng, content, &text, err)) return -1;
        if (finish_prompt(tok, &ps[i], text, err)) return -1;
        ps[i].output_len = out;
    }
    return 0;
}

static void shuffle_prompts(struct bench_prompt *ps, int n, struct bench_rng *rng) {
    for (int i = n - 1; i > 0; i--) {
        int j = (int)bench_rng_range(rng, 0, i);
        struct bench_prompt t = ps[i];
        ps[i] = ps[j];
        ps[j] = t;
    }
}

static int build_shared_prefix(const struct bench_options *o, const struct kiln_tokenizer *tok,
                               const struct id_pool *pool, struct bench_rng *rng, struct bench_prompt *ps,
                               struct kiln_error *err) {
    int k = 0;
    for (int g = 0; g < o->gsp_num_groups; g++) {
        char *system;
        if (random_text(tok, pool, rng, o->gsp_system_prompt_len, &system, err)) return -1;
        for (int q = 0; q < o->gsp_prompts_per_group; q++, k++) {
            char *question;
            if (random_text(tok, pool, rng, o->gsp_question_len, &question, err)) {
                free(system);
                return -1;
            }
            size_t n = strlen(system) + strlen(question) + 3;
            char *full = xmalloc(n);
            snprintf(full, n, "%s\n\n%s", system, question);
            free(question);
            if (finish_prompt(tok, &ps[k], full, err)) {
                free(system);
                return -1;
            }
            ps[k].output_len = o->gsp_output_len;
        }
        free(system);
    }
    shuffle_prompts(ps, k, rng);
    return 0;
}

static int build_score(const struct bench_options *o, const struct kiln_tokenizer *tok, const struct id_pool *pool,
                       struct bench_rng *rng, struct bench_prompt *ps, struct kiln_error *err) {
    struct kiln_token_ids enc = {0};
    for (int i = 0; i < o->num_prompts; i++) {
        struct bench_prompt *p = &ps[i];
        char *query;
        if (random_text(tok, pool, rng, o->score_query_len, &query, err)) goto fail;
        if (finish_prompt(tok, p, query, err)) goto fail;
        p->prompt_len = 0;
        p->output_len = 0;
        p->n_items = o->score_num_items;
        p->items = xcalloc((size_t)p->n_items, sizeof *p->items);
        p->item_ids = xcalloc((size_t)p->n_items, sizeof *p->item_ids);
        p->item_lens = xcalloc((size_t)p->n_items, sizeof *p->item_lens);
        for (int j = 0; j < p->n_items; j++) {
            if (random_text(tok, pool, rng, o->score_item_len, &p->items[j], err)) goto fail;
            /* The server scores query + item as one sequence (item_first
             * false); that sequence is what the offline runner submits. */
            size_t n = strlen(query) + strlen(p->items[j]) + 1;
            char *joined = xmalloc(n);
            snprintf(joined, n, "%s%s", query, p->items[j]);
            int rc = encode(tok, joined, 1, &enc, err);
            free(joined);
            if (rc) goto fail;
            p->item_ids[j] = xmalloc((enc.n ? enc.n : 1) * sizeof(int32_t));
            if (enc.n) memcpy(p->item_ids[j], enc.ids, enc.n * sizeof(int32_t));
            p->item_lens[j] = (int)enc.n;
            p->prompt_len += (int)enc.n;
        }
    }
    kiln_token_ids_free(&enc);
    return 0;
fail:
    kiln_token_ids_free(&enc);
    return -1;
}

/* conversations (or conversation) of one ShareGPT entry, NULL if absent. */
static json_t *sharegpt_turns(json_t *entry) {
    json_t *c = json_object_get(entry, "conversations");
    if (!json_is_array(c)) c = json_object_get(entry, "conversation");
    return json_is_array(c) ? c : NULL;
}

static int build_sharegpt(const struct bench_options *o, const struct kiln_tokenizer *tok, struct bench_rng *rng,
                          struct bench_prompt *ps, int *n_out, struct kiln_error *err) {
    if (!o->dataset_path || !*o->dataset_path)
        return kiln_errorf(err, "--dataset-name sharegpt needs --dataset-path FILE (a ShareGPT JSON file; "
                                "this client does not download it)");
    json_error_t je;
    json_t *root = json_load_file(o->dataset_path, 0, &je);
    if (!root) return kiln_errorf(err, "%s:%d:%d: %s", o->dataset_path, je.line, je.column, je.text);
    if (!json_is_array(root)) {
        json_decref(root);
        return kiln_errorf(err, "%s: expected a JSON array of conversations", o->dataset_path);
    }
    size_t n_all = json_array_size(root), n = 0;
    json_t **pairs = xmalloc((n_all ? n_all : 1) * sizeof *pairs);
    for (size_t i = 0; i < n_all; i++) {
        json_t *t = sharegpt_turns(json_array_get(root, i));
        if (t && json_array_size(t) >= 2 && json_is_string(json_object_get(json_array_get(t, 0), "value")) &&
            json_is_string(json_object_get(json_array_get(t, 1), "value")))
            pairs[n++] = t;
    }
    for (size_t i = n; i > 1; i--) {
        size_t j = (size_t)bench_rng_range(rng, 0, (int64_t)i - 1);
        json_t *x = pairs[i - 1];
        pairs[i - 1] = pairs[j];
        pairs[j] = x;
    }
    struct kiln_token_ids enc = {0};
    int k = 0, rc = 0;
    for (size_t i = 0; i < n && k < o->num_prompts; i++) {
        const char *prompt = json_string_value(json_object_get(json_array_get(pairs[i], 0), "value"));
        const char *completion = json_string_value(json_object_get(json_array_get(pairs[i], 1), "value"));
        int out_len = o->sharegpt_output_len;
        if (!out_len) {
            if ((rc = encode(tok, completion, 1, &enc, err))) break;
            out_len = (int)enc.n;
        }
        struct bench_prompt p = {0};
        if ((rc = finish_prompt(tok, &p, xstrdup(prompt), err))) {
            free(p.text);
            break;
        }
        /* Pruned as bench_serving prunes: too short to time, or too long
         * for the model's context. */
        if (p.prompt_len < 2 || out_len < 2 ||
            (o->sharegpt_context_len && p.prompt_len + out_len > o->sharegpt_context_len)) {
            free(p.text);
            free(p.ids);
            continue;
        }
        p.output_len = out_len;
        ps[k++] = p;
    }
    kiln_token_ids_free(&enc);
    free(pairs);
    json_decref(root);
    if (rc) return -1;
    if (k == 0) return kiln_errorf(err, "%s: no usable conversations (need >= 2 turns and >= 2 tokens each)",
                                   o->dataset_path);
    *n_out = k;
    return 0;
}

int bench_dataset_build(const struct bench_options *o, const struct kiln_tokenizer *tok, struct bench_rng *rng,
                        struct bench_prompt **out, int *n_out, struct kiln_error *err) {
    struct id_pool pool = {0};
    int n = o->dataset == BENCH_DATASET_SHARED_PREFIX ? o->gsp_num_groups * o->gsp_prompts_per_group
                                                       : o->num_prompts;
    struct bench_prompt *ps = xcalloc((size_t)(n > 0 ? n : 1), sizeof *ps);
    int rc = -1;
    if (n <= 0) {
        kiln_errorf(err, "the workload has no prompts");
        goto done;
    }
    if (o->dataset != BENCH_DATASET_SHAREGPT && pool_init(&pool, tok, err)) goto done;
    switch (o->dataset) {
    case BENCH_DATASET_RANDOM: rc = build_random(o, tok, &pool, rng, ps, err); break;
    case BENCH_DATASET_SHARED_PREFIX: rc = build_shared_prefix(o, tok, &pool, rng, ps, err); break;
    case BENCH_DATASET_SCORE: rc = build_score(o, tok, &pool, rng, ps, err); break;
    case BENCH_DATASET_SHAREGPT: rc = build_sharegpt(o, tok, rng, ps, &n, err); break;
    }
done:
    free(pool.ids);
    if (rc) {
        bench_prompts_free(ps, n);
        return -1;
    }
    *out = ps;
    *n_out = n;
    return 0;
}

void bench_prompts_free(struct bench_prompt *ps, int n) {
    if (!ps) return;
    for (int i = 0; i < n; i++) {
        struct bench_prompt *p = &ps[i];
        free(p->text);
        free(p->ids);
        for (int j = 0; j < p->n_items; j++) {
            if (p->items) free(p->items[j]);
            if (p->item_ids) free(p->item_ids[j]);
        }
        free(p->items);
        free(p->item_ids);
        free(p->item_lens);
    }
    free(ps);
}
