#include "tokenizer/postprocess.h"

#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/mem.h"
#include "tokenizer/bpe.h"
#include "tokenizer/tok_json.h"

static void postprocess_fini(struct postprocess *p) {
    for (size_t i = 0; i < p->n_children; i++) postprocess_fini(&p->children[i]);
    free(p->children);
    for (size_t i = 0; i < p->n_single; i++) free(p->single[i].ids);
    free(p->single);
    memset(p, 0, sizeof *p);
}

void postprocess_free(struct postprocess *p) {
    if (!p) return;
    postprocess_fini(p);
    free(p);
}

static void add_piece(struct postprocess *p, const int32_t *ids, size_t n, int is_text) {
    p->single = xrealloc(p->single, (p->n_single + 1) * sizeof *p->single);
    struct postprocess_piece *pc = &p->single[p->n_single++];
    pc->ids = NULL;
    pc->n_ids = 0;
    if (is_text) return;
    pc->ids = xmalloc((n ? n : 1) * sizeof *ids);
    memcpy(pc->ids, ids, n * sizeof *ids);
    pc->n_ids = n;
}

/* {"SpecialToken": {"id": name}} resolves through special_tokens[name].ids;
 * {"Sequence": {"id": "A"}} is the text. */
static int parse_template(struct postprocess *p, json_t *json, const char *path, struct kiln_error *err) {
    char buf[TJ_PATH_MAX], where[TJ_PATH_MAX];
    json_t *single, *specials = json_object_get(json, "special_tokens");
    if (tj_array(json, path, "single", &single, err)) return -1;
    if (specials && !json_is_object(specials))
        return kiln_errorf(err, "tokenizer.json: %s.special_tokens: expected an object", path);
    for (size_t i = 0; i < json_array_size(single); i++) {
        json_t *e = json_array_get(single, i), *v;
        tj_path_index(where, sizeof where, path, "single", i);
        if ((v = json_object_get(e, "Sequence")) != NULL) {
            const char *id;
            if (!json_is_object(v)) return kiln_errorf(err, "tokenizer.json: %s.Sequence: expected an object", where);
            if (tj_string(v, tj_path(buf, sizeof buf, where, "Sequence"), "id", 1, &id, NULL, err)) return -1;
            if (strcmp(id, "A") && strcmp(id, "B"))
                return kiln_errorf(err, "tokenizer.json: %s.Sequence.id: expected \"A\" or \"B\"", where);
            add_piece(p, NULL, 0, 1);
        } else if ((v = json_object_get(e, "SpecialToken")) != NULL) {
            const char *name;
            json_t *tok, *ids;
            if (!json_is_object(v)) return kiln_errorf(err, "tokenizer.json: %s.SpecialToken: expected an object", where);
            if (tj_string(v, tj_path(buf, sizeof buf, where, "SpecialToken"), "id", 1, &name, NULL, err)) return -1;
            tok = specials ? json_object_get(specials, name) : NULL;
            if (!tok)
                return kiln_errorf(err, "tokenizer.json: %s: special token '%s' is missing from special_tokens", where, name);
            snprintf(buf, sizeof buf, "%s.special_tokens[\"%.64s\"]", path, name);
            if (tj_array(tok, buf, "ids", &ids, err)) return -1;
            int32_t *v_ids = xmalloc((json_array_size(ids) + 1) * sizeof *v_ids);
            for (size_t k = 0; k < json_array_size(ids); k++) {
                json_t *x = json_array_get(ids, k);
                if (!json_is_integer(x) || json_integer_value(x) < 0 || json_integer_value(x) >= BPE_MAX_ID) {
                    free(v_ids);
                    return kiln_errorf(err, "tokenizer.json: %s.ids[%zu]: expected a token id", buf, k);
                }
                v_ids[k] = (int32_t)json_integer_value(x);
            }
            add_piece(p, v_ids, json_array_size(ids), 0);
            free(v_ids);
        } else {
            return kiln_errorf(err, "tokenizer.json: %s: expected {\"Sequence\": ...} or {\"SpecialToken\": ...}", where);
        }
    }
    return 0;
}

/* Bert/Roberta: "cls": [token, id], "sep": [token, id]. */
static int parse_pair_token(json_t *json, const char *path, const char *key, int32_t *id, struct kiln_error *err) {
    json_t *v = json_object_get(json, key);
    if (!json_is_array(v) || json_array_size(v) != 2 || !json_is_string(json_array_get(v, 0)) ||
        !json_is_integer(json_array_get(v, 1)) || json_integer_value(json_array_get(v, 1)) < 0 ||
        json_integer_value(json_array_get(v, 1)) >= BPE_MAX_ID)
        return kiln_errorf(err, "tokenizer.json: %s.%s: expected [token, id]", path, key);
    *id = (int32_t)json_integer_value(json_array_get(v, 1));
    return 0;
}

static int parse_into(struct postprocess *p, json_t *json, const char *path, int depth, struct kiln_error *err) {
    char buf[TJ_PATH_MAX];
    const char *type;
    memset(p, 0, sizeof *p);
    if (depth > 16) return kiln_errorf(err, "tokenizer.json: %s: Sequence nested too deeply", path);
    if (tj_type(json, path, &type, err)) return -1;
    if (!strcmp(type, "Sequence")) {
        json_t *arr;
        p->type = POSTPROCESS_TYPE_SEQUENCE;
        if (tj_array(json, path, "processors", &arr, err)) return -1;
        p->children = xcalloc(json_array_size(arr) + 1, sizeof *p->children);
        for (size_t i = 0; i < json_array_size(arr); i++) {
            p->n_children = i + 1;
            if (parse_into(&p->children[i], json_array_get(arr, i), tj_path_index(buf, sizeof buf, path, "processors", i),
                           depth + 1, err))
                return -1;
        }
        return 0;
    }
    if (!strcmp(type, "ByteLevel")) {
        p->type = POSTPROCESS_TYPE_NONE;
        return 0;
    }
    if (!strcmp(type, "TemplateProcessing")) {
        p->type = POSTPROCESS_TYPE_TEMPLATE;
        return parse_template(p, json, path, err);
    }
    if (!strcmp(type, "BertProcessing") || !strcmp(type, "RobertaProcessing")) {
        int32_t cls, sep;
        p->type = POSTPROCESS_TYPE_TEMPLATE;
        if (parse_pair_token(json, path, "cls", &cls, err) || parse_pair_token(json, path, "sep", &sep, err)) return -1;
        add_piece(p, &cls, 1, 0);
        add_piece(p, NULL, 0, 1);
        add_piece(p, &sep, 1, 0);
        return 0;
    }
    return kiln_errorf(err, "tokenizer.json: post_processor type '%s' is not supported (at %s)", type, path);
}

int postprocess_parse(struct postprocess **out, json_t *json, const char *path, struct kiln_error *err) {
    *out = NULL;
    if (!json || json_is_null(json)) return 0;
    struct postprocess *p = xcalloc(1, sizeof *p);
    if (parse_into(p, json, path, 0, err)) {
        postprocess_free(p);
        return -1;
    }
    *out = p;
    return 0;
}

void postprocess_apply(const struct postprocess *p, struct kiln_token_ids *ids) {
    switch (p->type) {
    case POSTPROCESS_TYPE_SEQUENCE:
        for (size_t i = 0; i < p->n_children; i++) postprocess_apply(&p->children[i], ids);
        return;
    case POSTPROCESS_TYPE_NONE:
        return;
    case POSTPROCESS_TYPE_TEMPLATE: {
        struct kiln_token_ids out = {0};
        for (size_t i = 0; i < p->n_single; i++) {
            const struct postprocess_piece *pc = &p->single[i];
            if (!pc->ids) {
                for (size_t k = 0; k < ids->n; k++) tok_ids_push(&out, ids->ids[k]);
            } else {
                for (size_t k = 0; k < pc->n_ids; k++) tok_ids_push(&out, pc->ids[k]);
            }
        }
        free(ids->ids);
        *ids = out;
        return;
    }
    }
}
