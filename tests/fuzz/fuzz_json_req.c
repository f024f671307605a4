/* fuzz_json_req.c — arbitrary bytes as an API request body through the
 * validation the routes use (src/server/json_req.c): the body parse, the
 * sampling fields in all three dialects and the prompt forms (token ids; no
 * tokenizer), the structured-output fields. Anything accepted must be in
 * range for the engine, logit_bias keys must have been plain decimal token
 * ids, and guided_choice strings must make an EBNF grammar that compiles. */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "base/error.h"
#include "grammar/grammar.h"
#include "sample/sampling.h"
#include "server/json_req.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    enum { VOCAB = 1000 };
    struct req_error e;
    memset(&e, 0, sizeof e);
    json_t *body = jr_parse_body((const char *)data, size, &e);
    if (!body) {
        KILN_ASSERT(e.status == 400 && e.msg[0]);
        return 0;
    }
    for (int d = JR_COMPLETION; d <= JR_NATIVE; d++) {
        struct gen_params p;
        gen_params_init(&p);
        json_t *sp = json_object_get(body, "sampling_params");
        const json_t *o = d == JR_NATIVE && json_is_object(sp) ? sp : body;
        if (gen_params_parse(&p, o, body, (enum jr_dialect)d, VOCAB, &e) == 0) {
            KILN_ASSERT(p.n >= 1 && p.n <= JR_MAX_N);
            KILN_ASSERT(p.r.sampling.temperature >= 0 && p.r.sampling.top_p > 0 && p.r.sampling.top_p <= 1);
            KILN_ASSERT(p.r.n_stop >= 0 && p.r.n_stop <= JR_MAX_STOP);
            for (int i = 0; i < p.r.n_stop_ids; i++) KILN_ASSERT(p.r.stop_ids[i] >= 0 && p.r.stop_ids[i] < VOCAB);
            for (int i = 0; i < p.r.sampling.n_logit_bias; i++)
                KILN_ASSERT(p.r.sampling.logit_bias[i].id >= 0 && p.r.sampling.logit_bias[i].id < VOCAB);
            /* logit_bias keys are decimal digits only (no sign, blank or prefix) */
            const char *key;
            json_t *bv;
            json_t *lb = json_object_get(o, "logit_bias");
            if (json_is_object(lb))
                json_object_foreach(lb, key, bv) {
                    KILN_ASSERT(*key);
                    for (const char *c = key; *c; c++) KILN_ASSERT(*c >= '0' && *c <= '9');
                }
            /* a structured-output constraint: its text is there; choices
             * become EBNF that must compile and match each choice exactly */
            KILN_ASSERT(p.so.kind == SO_NONE || p.so.kind == SO_JSON_OBJECT || p.so.text);
            if (p.so.kind == SO_CHOICE) {
                struct kiln_error ge;
                struct grammar *g = grammar_compile_ebnf(p.so.text, p.so.len, NULL, &ge);
                KILN_ASSERT(g);
                grammar_unref(g);
            }
        } else {
            KILN_ASSERT(e.msg[0]);
            /* the body was valid UTF-8, so is the message quoting it, cut or not */
            json_t *m = json_string(e.msg);
            KILN_ASSERT(m);
            json_decref(m);
        }
        gen_params_free(&p);
    }
    struct prompt_list pl;
    if (jr_prompts(json_object_get(body, "prompt"), "prompt", NULL, VOCAB, 0, &pl, &e) == 0) {
        KILN_ASSERT(pl.n >= 1);
        for (int i = 0; i < pl.n; i++) {
            KILN_ASSERT(pl.v[i].n >= 1);
            for (int k = 0; k < pl.v[i].n; k++) KILN_ASSERT(pl.v[i].ids[k] >= 0 && pl.v[i].ids[k] < VOCAB);
        }
        prompt_list_free(&pl);
    }
    json_decref(body);
    return 0;
}
