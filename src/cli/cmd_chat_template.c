/* cmd_chat_template.c — `kiln chat-template`: renders a checkpoint's chat
 * template for a conversation read from stdin, byte for byte what
 * transformers' apply_chat_template(tokenize=False) returns. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "base/error.h"
#include "base/file.h"
#include "chat/chat_template.h"
#include "cli/cli.h"
#include "cli/cli_common.h"

static json_t *parse_json_arg(const char *opt, const char *text, struct kiln_error *err) {
    json_error_t je;
    json_t *j = json_loads(text, JSON_DECODE_ANY, &je);
    if (!j) kiln_errorf(err, "%s: invalid JSON at column %d: %s", opt, je.column, je.text);
    return j;
}

int cmd_chat_template(int argc, char **argv) {
    const char *dir = NULL, *template_file = NULL, *bos = NULL, *eos = NULL, *kwargs_text = NULL, *tools_text = NULL;
    int no_gen = 0;
    const struct cli_opt opts[] = {
        CLI_OPT_STR("--tokenizer", &dir, "DIR",
                    "model or tokenizer folder (tokenizer_config.json / chat_template.jinja),\n"
                    "or a Hugging Face id in the local cache"),
        CLI_OPT_STR("--template", &template_file, "FILE", "render this template file instead (bos/eos from --tokenizer if given)"),
        CLI_OPT_STR("--bos", &bos, "TEXT", "set bos_token"),
        CLI_OPT_STR("--eos", &eos, "TEXT", "set eos_token"),
        CLI_OPT_FLAG("--no-generation-prompt", &no_gen, "add_generation_prompt=False (default True)"),
        CLI_OPT_STR("--tools", &tools_text, "JSON", "tool schemas (a JSON array)"),
        CLI_OPT_STR("--kwargs", &kwargs_text, "JSON", "extra template variables, e.g. '{\"enable_thinking\": false}'"),
    };
    const struct cli_group groups[] = {{NULL, opts, sizeof opts / sizeof opts[0]}};
    const struct cli_command cmd = {
        .name = "chat-template", .usage = "(--tokenizer DIR | --template FILE) [options] < messages.json",
        .about = "Reads a JSON array of messages (or an object {\"messages\": [...], \"tools\": [...]})\n"
                 "on stdin and prints the rendered prompt, with no newline added.",
        .groups = groups, .n_groups = 1, .max_positional = 0};
    int n_pos, prc = cli_parse(&cmd, argc, argv, NULL, &n_pos);
    if (prc) return prc == 1 ? 0 : prc;
    int gen = !no_gen;
    if (!dir && !template_file) {
        fprintf(stderr, "kiln chat-template: give --tokenizer DIR or --template FILE (see --help)\n");
        return 2;
    }
    char *dir_owned = NULL;
    if (dir) {
        char msg[1024];
        int is_id;
        if (cli_resolve_model(dir, &dir, &dir_owned, &is_id, msg, sizeof msg)) {
            fprintf(stderr, "kiln chat-template: --tokenizer: %s\n", msg);
            return 1;
        }
    }

    struct kiln_error err = {0};
    struct chat_template ct = {0};
    json_t *input = NULL, *kwargs = NULL, *tools = NULL;
    char *text = NULL, *out = NULL;
    int rc = 1;
    if (dir && chat_template_load(&ct, dir, &err) && !template_file) goto fail;
    if (template_file) {
        if (file_read_all(template_file, &text, NULL, &err)) goto fail;
        char *b = bos ? NULL : ct.bos_token, *e = eos ? NULL : ct.eos_token;
        struct chat_template fresh;
        if (chat_template_init(&fresh, text, bos ? bos : b, eos ? eos : e, &err)) {
            kiln_error_prefix(&err, "%s", template_file);
            goto fail;
        }
        chat_template_free(&ct);
        ct = fresh;
    } else {
        if (bos) {
            free(ct.bos_token);
            ct.bos_token = strdup(bos);
        }
        if (eos) {
            free(ct.eos_token);
            ct.eos_token = strdup(eos);
        }
    }
    if (kwargs_text && !(kwargs = parse_json_arg("--kwargs", kwargs_text, &err))) goto fail;
    if (kwargs && !json_is_object(kwargs)) {
        kiln_errorf(&err, "--kwargs must be a JSON object");
        goto fail;
    }
    if (tools_text && !(tools = parse_json_arg("--tools", tools_text, &err))) goto fail;

    json_error_t je;
    input = json_loadf(stdin, JSON_DECODE_ANY, &je);
    if (!input) {
        kiln_errorf(&err, "stdin: invalid JSON at line %d column %d: %s", je.line, je.column, je.text);
        goto fail;
    }
    const json_t *messages = input;
    if (json_is_object(input)) {
        messages = json_object_get(input, "messages");
        if (!tools && json_object_get(input, "tools")) tools = json_incref(json_object_get(input, "tools"));
    }
    if (!json_is_array(messages)) {
        kiln_errorf(&err, "stdin: expected a JSON array of messages (or an object with \"messages\")");
        goto fail;
    }
    struct chat_template_args args = {.messages = messages, .add_generation_prompt = gen,
                                      .tools = tools && !json_is_null(tools) ? tools : NULL, .kwargs = kwargs};
    size_t len;
    if (chat_template_render(&ct, &args, &out, &len, &err)) goto fail;
    fwrite(out, 1, len, stdout);
    fflush(stdout);
    rc = 0;
    goto done;
fail:
    fprintf(stderr, "kiln chat-template: %s\n", err.msg);
done:
    free(out);
    free(text);
    json_decref(input);
    json_decref(kwargs);
    json_decref(tools);
    chat_template_free(&ct);
    free(dir_owned);
    return rc;
}
