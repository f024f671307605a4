/* fuzz_template.c — compiles and renders arbitrary template text against a
 * fixed chat context. Nothing may crash, leak or hang: hostile templates
 * must end with an error from the interpreter's limits.
 * Seed corpus: scripts/chat/fuzz_seed.py DIR (the oracle templates and the
 * jinja_cases.py snippets); dictionary: tests/fuzz/fuzz_template.dict. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include <jansson.h>

#include "base/error.h"
#include "chat/jinja.h"

static const char context[] =
    "{\"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\"},"
    " {\"role\": \"user\", \"content\": \"Hi <tool_response>x</tool_response>\"},"
    " {\"role\": \"assistant\", \"content\": \"<think>\\nhm\\n</think>\\n\\nHello\", \"reasoning_content\": null,"
    "  \"tool_calls\": [{\"type\": \"function\", \"function\": {\"name\": \"f\", \"arguments\": {\"a\": [1, 2.5, true]}}}]},"
    " {\"role\": \"tool\", \"content\": \"42\"}, {\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": \"\\u00e9 \\ud83d\\ude00\"}]}],"
    " \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\": {\"type\": \"object\"}}}],"
    " \"documents\": null, \"add_generation_prompt\": true, \"bos_token\": \"<s>\", \"eos_token\": \"</s>\","
    " \"enable_thinking\": false}";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static json_t *vars;
    if (!vars) {
        json_error_t je;
        vars = json_loads(context, 0, &je);
        if (!vars) abort();
    }
    struct kiln_error err;
    struct jinja_template *t = NULL;
    if (jinja_compile(&t, (const char *)data, size, &err)) return 0;
    struct jinja_limits lim = {.max_output = 1 << 20, .max_steps = 200000, .max_depth = 16};
    char *out = NULL;
    size_t len = 0;
    if (!jinja_render(t, vars, &lim, &out, &len, &err)) free(out);
    jinja_free(t);
    return 0;
}
