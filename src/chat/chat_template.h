/* chat_template.h — a checkpoint's chat template: load it once, render
 * conversations into prompt text exactly as transformers'
 * apply_chat_template(tokenize=False) does.
 *
 * Loading reads <model dir>/chat_template.jinja when present (newer
 * checkpoints), else tokenizer_config.json's "chat_template" (a string, or a
 * list of {name, template} from which "default" is taken, else the first),
 * and the bos/eos tokens (strings or {"content": ...} objects). The template
 * is compiled once; rendering is read-only on it, so one chat_template may be
 * rendered from several threads at once.
 *
 * The render context is what transformers passes: messages, tools (None when
 * absent), documents (None), add_generation_prompt, bos_token/eos_token when
 * the checkpoint defines them, then any extra keyword arguments (for example
 * enable_thinking). raise_exception() in a template, and anything jinja2
 * would raise, becomes an error with a message.
 *
 *     struct chat_template ct;
 *     if (chat_template_load(&ct, dir, &err)) ...;
 *     struct chat_template_args a = {.messages = msgs, .add_generation_prompt = 1};
 *     char *prompt; size_t len;
 *     if (chat_template_render(&ct, &a, &prompt, &len, &err)) ...;
 *     free(prompt);
 *     chat_template_free(&ct);
 */
#ifndef KILN_CHAT_CHAT_TEMPLATE_H
#define KILN_CHAT_CHAT_TEMPLATE_H

#include <stddef.h>

#include <jansson.h>

struct kiln_error;
struct jinja_template;

struct chat_template {
    struct jinja_template *tmpl;
    char *source;    /* the template text */
    char *bos_token; /* NULL: not defined for the template */
    char *eos_token;
};

struct chat_template_args {
    const json_t *messages;    /* array of message objects */
    int add_generation_prompt;
    const json_t *tools;       /* array, or NULL for None */
    const json_t *documents;   /* array, or NULL for None */
    const json_t *kwargs;      /* object of extra template variables, or NULL */
};

/* Compiles source; bos/eos may be NULL. Syntax errors read
 * "template:LINE:COL: what was expected". */
int chat_template_init(struct chat_template *ct, const char *source, const char *bos_token, const char *eos_token,
                       struct kiln_error *err);
/* Reads the template and special tokens from a model (or tokenizer) folder. */
int chat_template_load(struct chat_template *ct, const char *dir, struct kiln_error *err);
/* Accepts a zeroed or half-built chat_template. */
void chat_template_free(struct chat_template *ct);

/* Renders into a NUL-terminated heap string (free it). */
int chat_template_render(const struct chat_template *ct, const struct chat_template_args *args, char **out,
                         size_t *out_len, struct kiln_error *err);

#endif
