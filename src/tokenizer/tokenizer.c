/* tokenizer.c — loading tokenizer.json and the public encode/decode API. */
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/error.h"
#include "base/file.h"
#include "base/json_util.h"
#include "base/mem.h"
#include "tokenizer/tok_json.h"
#include "tokenizer/tokenizer_impl.h"

void kiln_token_ids_free(struct kiln_token_ids *v) {
    if (!v) return;
    free(v->ids);
    memset(v, 0, sizeof *v);
}

void kiln_tokenizer_free(struct kiln_tokenizer *t) {
    if (!t) return;
    bpe_free(&t->model);
    normalizer_free(t->normalizer);
    pretokenizer_free(t->pretokenizer);
    postprocess_free(t->post);
    decoder_free(t->decoder);
    added_vocab_free(&t->added);
    free(t->dec_str);
    free(t->dec_len);
    free(t->special);
    for (int i = 0; i < TOK_SLOTS; i++) {
        struct tok_slot *sl = &t->slots[i];
        tok_ctx_free(&sl->ctx);
        bpe_cache_destroy(sl->cache);
        if (sl->lock_init) pthread_mutex_destroy(&sl->lock);
    }
    free(t);
}

/* Ids, decode strings and special flags over the union of the model's and
 * the added vocabulary. */
static void build_id_tables(struct kiln_tokenizer *t) {
    t->id_limit = t->model.id_limit > t->added.id_limit ? t->model.id_limit : t->added.id_limit;
    size_t n = (size_t)t->id_limit + 1;
    t->dec_str = xcalloc(n, sizeof *t->dec_str);
    t->dec_len = xcalloc(n, sizeof *t->dec_len);
    t->special = xcalloc(n, 1);
    for (int32_t id = 0; id < t->id_limit; id++) {
        const struct added_token *a = added_vocab_token(&t->added, id);
        size_t len = 0;
        const char *s = NULL;
        if (a) {
            s = a->norm ? a->norm : a->content;
            len = a->norm ? a->norm_len : a->len;
        } else {
            s = bpe_id_to_token(&t->model, id, &len);
        }
        if (!s) continue;
        t->dec_str[id] = s;
        t->dec_len[id] = (uint32_t)len;
        t->special[id] = tok_strmap_get(&t->added.specials, s, len) >= 0;
    }
    t->vocab_size = t->model.vocab.count;
    for (size_t i = 0; i < t->added.n; i++)
        if (tok_strmap_get(&t->model.vocab, t->added.tokens[i].content, t->added.tokens[i].len) < 0) t->vocab_size++;
}

/* bos_token / eos_token are a string or {"content": ...} (AddedToken). */
static int config_token(struct kiln_tokenizer *t, json_t *cfg, const char *key, int32_t *id, struct kiln_error *err) {
    json_t *v = json_object_get(cfg, key);
    *id = -1;
    if (!v || json_is_null(v)) return 0;
    if (json_is_object(v)) v = json_object_get(v, "content");
    if (!json_is_string(v)) return kiln_errorf(err, "tokenizer_config.json: %s: expected a string or {\"content\": ...}", key);
    *id = kiln_tokenizer_token_to_id(t, json_string_value(v), json_string_length(v));
    return 0;
}

static int load_config(struct kiln_tokenizer *t, const char *config, size_t len, struct kiln_error *err) {
    json_error_t je;
    json_t *cfg = json_load_checkpoint(config, len, 0, &je);
    int rc = -1;
    if (!cfg) return kiln_errorf(err, "tokenizer_config.json: invalid JSON at line %d column %d: %s", je.line, je.column, je.text);
    if (!json_is_object(cfg)) {
        kiln_errorf(err, "tokenizer_config.json: expected an object");
        goto fail;
    }
    json_t *v;
    if ((v = json_object_get(cfg, "add_bos_token")) && !json_is_null(v)) {
        if (!json_is_boolean(v)) {
            kiln_errorf(err, "tokenizer_config.json: add_bos_token: expected true or false");
            goto fail;
        }
        t->add_bos = json_is_true(v);
    }
    if ((v = json_object_get(cfg, "add_eos_token")) && !json_is_null(v)) {
        if (!json_is_boolean(v)) {
            kiln_errorf(err, "tokenizer_config.json: add_eos_token: expected true or false");
            goto fail;
        }
        t->add_eos = json_is_true(v);
    }
    if (config_token(t, cfg, "bos_token", &t->bos_id, err) || config_token(t, cfg, "eos_token", &t->eos_id, err)) goto fail;
    rc = 0;
fail:
    json_decref(cfg);
    return rc;
}

int kiln_tokenizer_load_buffer(struct kiln_tokenizer **out, const char *json, size_t json_len, const char *config,
                               size_t config_len, struct kiln_error *err) {
    json_error_t je;
    json_t *root = NULL, *v;
    struct kiln_tokenizer *t = xcalloc(1, sizeof *t);
    *out = NULL;
    t->bos_id = t->eos_id = -1;
    for (int i = 0; i < TOK_SLOTS; i++) {
        struct tok_slot *sl = &t->slots[i];
        tok_ctx_init(&sl->ctx);
        if (pthread_mutex_init(&sl->lock, NULL) == 0) sl->lock_init = 1;
        sl->cache = bpe_cache_create();
        sl->ctx.cache = sl->cache;
    }

    root = json_load_checkpoint(json, json_len, 0, &je);
    if (!root) {
        kiln_errorf(err, "tokenizer.json: invalid JSON at line %d column %d: %s", je.line, je.column, je.text);
        goto fail;
    }
    if (!json_is_object(root)) {
        kiln_errorf(err, "tokenizer.json: expected an object at the top level");
        goto fail;
    }
    if ((v = json_object_get(root, "version")) && (!json_is_string(v) || strcmp(json_string_value(v), "1.0"))) {
        kiln_errorf(err, "tokenizer.json: version: expected \"1.0\"");
        goto fail;
    }
    if (!json_object_get(root, "model")) {
        kiln_errorf(err, "tokenizer.json: model: missing");
        goto fail;
    }
    if (bpe_parse(&t->model, json_object_get(root, "model"), "model", err)) goto fail;
    if (normalizer_parse(&t->normalizer, json_object_get(root, "normalizer"), "normalizer", err)) goto fail;
    if (pretokenizer_parse(&t->pretokenizer, json_object_get(root, "pre_tokenizer"), "pre_tokenizer", err)) goto fail;
    if (postprocess_parse(&t->post, json_object_get(root, "post_processor"), "post_processor", err)) goto fail;
    if (decoder_parse(&t->decoder, json_object_get(root, "decoder"), "decoder", err)) goto fail;
    if (added_vocab_parse(&t->added, json_object_get(root, "added_tokens"), &t->model, t->normalizer, &t->slots[0].ctx,
                          err))
        goto fail;
    tok_arena_reset(&t->slots[0].ctx.arena);
    build_id_tables(t);
    if (config && load_config(t, config, config_len, err)) goto fail;
    json_decref(root);
    *out = t;
    return 0;
fail:
    json_decref(root);
    kiln_tokenizer_free(t);
    return -1;
}

int kiln_tokenizer_load(struct kiln_tokenizer **out, const char *path, struct kiln_error *err) {
    struct stat st;
    char *json = NULL, *config = NULL, *json_path = NULL, *config_path = NULL;
    size_t json_len = 0, config_len = 0;
    int rc = -1;
    *out = NULL;
    if (stat(path, &st) != 0) return kiln_errorf(err, "%s: no such file or folder", path);
    if (S_ISDIR(st.st_mode)) {
        json_path = path_join(path, "tokenizer.json");
        config_path = path_join(path, "tokenizer_config.json");
    } else {
        json_path = xstrdup(path);
    }
    if (file_read_all(json_path, &json, &json_len, err)) goto fail;
    if (config_path && file_exists(config_path) && file_read_all(config_path, &config, &config_len, err)) goto fail;
    rc = kiln_tokenizer_load_buffer(out, json, json_len, config, config_len, err);
    if (rc) kiln_error_prefix(err, "%s", path);
fail:
    free(json);
    free(config);
    free(json_path);
    free(config_path);
    return rc;
}

/* ---- encode ----------------------------------------------------------- */

static int encode_piece(const struct kiln_tokenizer *t, struct tok_ctx *ctx, struct tok_piece p,
                        struct kiln_token_ids *out, struct kiln_error *err) {
    struct tok_pieces *cur = &ctx->pieces[0], *other = &ctx->pieces[1];
    cur->n = 0;
    tok_pieces_push(cur, p.s, p.len, p.zp);
    if (t->pretokenizer && pretokenizer_run(t->pretokenizer, ctx, &cur, &other, err)) return -1;
    for (size_t i = 0; i < cur->n; i++)
        if (bpe_word(&t->model, ctx, cur->v[i].s, cur->v[i].len, out, err)) return -1;
    return 0;
}

static int encode_with(const struct kiln_tokenizer *t, struct tok_ctx *ctx, const char *text, size_t len,
                       struct kiln_token_ids *out, struct kiln_error *err) {
    struct added_splits raw = {0}, sub = {0};
    int rc = -1;
    added_vocab_split(&t->added, 0, text, len, &raw);
    for (size_t i = 0; i < raw.n; i++) {
        const struct added_split *sp = &raw.v[i];
        if (sp->id >= 0) {
            tok_ids_push(out, sp->id);
            continue;
        }
        if (sp->a >= sp->b) continue;
        /* zp: only a piece starting the input maps back to offset 0. */
        struct tok_piece p = {text + sp->a, sp->b - sp->a, sp->a == 0 ? utf8_seq_len((unsigned char)text[0]) : 0};
        if (t->normalizer && normalizer_apply(t->normalizer, ctx, &p, err)) goto fail;
        if (p.len == 0) continue;
        if (t->added.normalized.empty) {
            if (encode_piece(t, ctx, p, out, err)) goto fail;
            continue;
        }
        added_vocab_split(&t->added, 1, p.s, p.len, &sub);
        for (size_t k = 0; k < sub.n; k++) {
            const struct added_split *q = &sub.v[k];
            if (q->id >= 0) {
                tok_ids_push(out, q->id);
            } else if (q->a < q->b) {
                struct tok_piece s = {p.s + q->a, q->b - q->a, p.zp > q->a ? p.zp - q->a : 0};
                if (encode_piece(t, ctx, s, out, err)) goto fail;
            }
        }
    }
    rc = 0;
fail:
    added_splits_free(&raw);
    added_splits_free(&sub);
    return rc;
}

int kiln_tokenizer_encode(const struct kiln_tokenizer *tok, const char *text, size_t len, int add_special_tokens,
                          struct kiln_token_ids *out, struct kiln_error *err) {
    struct kiln_tokenizer *t = (struct kiln_tokenizer *)tok; /* only the slots change */
    out->n = 0;
    if (!text && len) return kiln_errorf(err, "encode: NULL text");
    if (!text) text = "";
    size_t bad = utf8_validate(text, len);
    if (bad != len) return kiln_errorf(err, "encode: input is not valid UTF-8 (at byte %zu)", bad);
    struct tok_ctx local, *ctx = NULL;
    struct tok_slot *slot = NULL;
    for (int i = 0; i < TOK_SLOTS && !slot; i++)
        if (t->slots[i].lock_init && pthread_mutex_trylock(&t->slots[i].lock) == 0) slot = &t->slots[i];
    if (slot) {
        ctx = &slot->ctx;
    } else {
        tok_ctx_init(&local);
        ctx = &local;
    }
    int rc = encode_with(t, ctx, text, len, out, err);
    if (rc == 0 && add_special_tokens && t->post) postprocess_apply(t->post, out);
    if (slot) {
        tok_arena_reset(&ctx->arena);
        pthread_mutex_unlock(&slot->lock);
    } else {
        tok_ctx_free(&local);
    }
    return rc;
}

/* ---- decode and lookups ------------------------------------------------ */

int kiln_tokenizer_decode(const struct kiln_tokenizer *t, const int32_t *ids, size_t n, int skip_special_tokens,
                          char **out, size_t *out_len, struct kiln_error *err) {
    struct dec_run r;
    dec_run_init(&r, t->decoder);
    for (size_t i = 0; i < n; i++) {
        const char *s;
        size_t len;
        if (!tok_decode_str(t, ids[i], &s, &len)) continue;
        if (skip_special_tokens && t->special[ids[i]]) continue;
        dec_run_token(&r, s, len);
    }
    dec_run_finish(&r);
    *out = r.out.data ? r.out.data : xstrdup("");
    if (out_len) *out_len = r.out.len;
    r.out.data = NULL;
    dec_run_free(&r);
    (void)err;
    return 0;
}

int32_t kiln_tokenizer_token_to_id(const struct kiln_tokenizer *t, const char *token, size_t len) {
    int32_t id = tok_strmap_get(&t->added.by_content, token, len);
    return id >= 0 ? id : tok_strmap_get(&t->model.vocab, token, len);
}

const char *kiln_tokenizer_id_to_token(const struct kiln_tokenizer *t, int32_t id, size_t *len) {
    const struct added_token *a = added_vocab_token(&t->added, id);
    if (a) {
        if (len) *len = a->len;
        return a->content;
    }
    return bpe_id_to_token(&t->model, id, len);
}

size_t kiln_tokenizer_vocab_size(const struct kiln_tokenizer *t) { return t->vocab_size; }
int32_t kiln_tokenizer_id_limit(const struct kiln_tokenizer *t) { return t->id_limit; }
int32_t kiln_tokenizer_bos_id(const struct kiln_tokenizer *t) { return t->bos_id; }
int32_t kiln_tokenizer_eos_id(const struct kiln_tokenizer *t) { return t->eos_id; }
int kiln_tokenizer_add_bos_token(const struct kiln_tokenizer *t) { return t->add_bos; }
int kiln_tokenizer_add_eos_token(const struct kiln_tokenizer *t) { return t->add_eos; }

int kiln_tokenizer_is_special(const struct kiln_tokenizer *t, int32_t id) {
    return id >= 0 && id < t->id_limit && t->special[id];
}
