/* chat_template.c — loading a checkpoint's template and building the
 * context transformers' apply_chat_template renders with. */
#include "chat/chat_template.h"

#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/file.h"
#include "base/json_util.h"
#include "base/mem.h"
#include "chat/jinja.h"

int chat_template_init(struct chat_template *ct, const char *source, const char *bos_token, const char *eos_token,
                       struct kiln_error *err) {
    memset(ct, 0, sizeof *ct);
    ct->source = xstrdup(source);
    ct->bos_token = bos_token ? xstrdup(bos_token) : NULL;
    ct->eos_token = eos_token ? xstrdup(eos_token) : NULL;
    if (jinja_compile(&ct->tmpl, source, strlen(source), err)) goto fail;
    return 0;
fail:
    chat_template_free(ct);
    return -1;
}

void chat_template_free(struct chat_template *ct) {
    if (!ct) return;
    jinja_free(ct->tmpl);
    free(ct->source);
    free(ct->bos_token);
    free(ct->eos_token);
    memset(ct, 0, sizeof *ct);
}

/* A special token is a string or an AddedToken object {"content": ...}. */
static const char *token_text(const json_t *v) {
    if (json_is_string(v)) return json_string_value(v);
    if (json_is_object(v)) {
        const json_t *c = json_object_get(v, "content");
        if (json_is_string(c)) return json_string_value(c);
    }
    return NULL;
}

static const char *pick_template(const json_t *t) {
    if (json_is_string(t)) return json_string_value(t);
    if (!json_is_array(t) || json_array_size(t) == 0) return NULL;
    size_t i;
    const json_t *e;
    json_array_foreach(t, i, e) {
        const json_t *name = json_object_get(e, "name");
        if (json_is_string(name) && !strcmp(json_string_value(name), "default"))
            return json_string_value(json_object_get(e, "template"));
    }
    return json_string_value(json_object_get(json_array_get(t, 0), "template"));
}

int chat_template_load(struct chat_template *ct, const char *dir, struct kiln_error *err) {
    memset(ct, 0, sizeof *ct);
    char *cfg_path = path_join(dir, "tokenizer_config.json");
    char *jinja_path = path_join(dir, "chat_template.jinja");
    char *json_path = path_join(dir, "chat_template.json");
    char *jinja_text = NULL;
    json_t *cfg = NULL, *tj = NULL;
    const char *source = NULL, *bos = NULL, *eos = NULL;
    int rc = -1;
    if (file_exists(cfg_path)) {
        json_error_t je;
        cfg = json_load_checkpoint_file(cfg_path, 0, &je);
        if (!cfg) {
            kiln_errorf(err, "%s:%d:%d: %s", cfg_path, je.line, je.column, je.text);
            goto done;
        }
        source = pick_template(json_object_get(cfg, "chat_template"));
        bos = token_text(json_object_get(cfg, "bos_token"));
        eos = token_text(json_object_get(cfg, "eos_token"));
    }
    if (file_exists(jinja_path)) {
        if (file_read_all(jinja_path, &jinja_text, NULL, err)) goto done;
        source = jinja_text;
    } else if (!source && file_exists(json_path)) {
        json_error_t je;
        tj = json_load_checkpoint_file(json_path, 0, &je);
        if (!tj) {
            kiln_errorf(err, "%s:%d:%d: %s", json_path, je.line, je.column, je.text);
            goto done;
        }
        source = pick_template(json_object_get(tj, "chat_template"));
    }
    if (!source) {
        kiln_errorf(err, "%s: no chat template (expected \"chat_template\" in tokenizer_config.json or a chat_template.jinja file)", dir);
        goto done;
    }
    rc = chat_template_init(ct, source, bos, eos, err);
    if (rc) kiln_error_prefix(err, "%s", jinja_text ? jinja_path : cfg_path);
done:
    json_decref(cfg);
    json_decref(tj);
    free(jinja_text);
    free(cfg_path);
    free(jinja_path);
    free(json_path);
    return rc;
}

int chat_template_render(const struct chat_template *ct, const struct chat_template_args *args, char **out,
                         size_t *out_len, struct kiln_error *err) {
    *out = NULL;
    if (!args->messages || !json_is_array(args->messages))
        return kiln_errorf(err, "messages must be a JSON array");
    if (args->kwargs && !json_is_object(args->kwargs)) return kiln_errorf(err, "template kwargs must be a JSON object");
    json_t *vars = json_object();
    json_object_set(vars, "messages", (json_t *)args->messages);
    json_object_set_new(vars, "tools", args->tools ? json_incref((json_t *)args->tools) : json_null());
    json_object_set_new(vars, "documents", args->documents ? json_incref((json_t *)args->documents) : json_null());
    json_object_set_new(vars, "add_generation_prompt", json_boolean(args->add_generation_prompt));
    if (ct->bos_token) json_object_set_new(vars, "bos_token", json_string(ct->bos_token));
    if (ct->eos_token) json_object_set_new(vars, "eos_token", json_string(ct->eos_token));
    if (args->kwargs) {
        const char *k;
        json_t *v;
        json_object_foreach((json_t *)args->kwargs, k, v) {
            if (!strcmp(k, "messages") || !strcmp(k, "tools") || !strcmp(k, "documents") ||
                !strcmp(k, "add_generation_prompt")) {
                json_decref(vars);
                return kiln_errorf(err, "template kwargs may not set '%s'", k);
            }
            json_object_set(vars, k, v);
        }
    }
    int rc = jinja_render(ct->tmpl, vars, NULL, out, out_len, err);
    json_decref(vars);
    return rc;
}
