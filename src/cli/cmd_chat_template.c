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

static void usage(FILE *f) {
    fprintf(f,
            "usage: kiln chat-template (--tokenizer DIR | --template FILE) [options] < messages.json\n"
            "\n"
            "Reads a JSON array of messages (or an object {\"messages\": [...], \"tools\": [...]})\n"
            "on stdin and prints the rendered prompt, with no newline added.\n"
            "\n"
            "  --tokenizer DIR          model or tokenizer folder (tokenizer_config.json / chat_template.jinja)\n"
            "  --template FILE          render this template file instead (bos/eos from --tokenizer if given)\n"
            "  --bos TEXT, --eos TEXT   set bos_token / eos_token\n"
            "  --no-generation-prompt   add_generation_prompt=False (default True)\n"
            "  --tools JSON             tool schemas (a JSON array)\n"
            "  --kwargs JSON            extra template variables, e.g. '{\"enable_thinking\": false}'\n");
}

static json_t *parse_json_arg(const char *opt, const char *text, struct kiln_error *err) {
    json_error_t je;
    json_t *j = json_loads(text, JSON_DECODE_ANY, &je);
    if (!j) kiln_errorf(err, "%s: invalid JSON at column %d: %s", opt, je.column, je.text);
    return j;
}

int cmd_chat_template(int argc, char **argv) {
    const char *dir = NULL, *template_file = NULL, *bos = NULL, *eos = NULL, *kwargs_text = NULL, *tools_text = NULL;
    int gen = 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int has_value = i + 1 < argc;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--no-generation-prompt")) {
            gen = 0;
        } else if (!strcmp(a, "--tokenizer") && has_value) {
            dir = argv[++i];
        } else if (!strcmp(a, "--template") && has_value) {
            template_file = argv[++i];
        } else if (!strcmp(a, "--bos") && has_value) {
            bos = argv[++i];
        } else if (!strcmp(a, "--eos") && has_value) {
            eos = argv[++i];
        } else if (!strcmp(a, "--kwargs") && has_value) {
            kwargs_text = argv[++i];
        } else if (!strcmp(a, "--tools") && has_value) {
            tools_text = argv[++i];
        } else {
            fprintf(stderr, "kiln chat-template: unknown or incomplete option '%s'\n", a);
            usage(stderr);
            return 2;
        }
    }
    if (!dir && !template_file) {
        usage(stderr);
        return 2;
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
    return rc;
}
