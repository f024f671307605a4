/* cmd_generate.c — `kiln generate`: greedy decoding of one sequence, the
 * simplest end-to-end use of the forward pass (prefill once, then one token
 * per step; on a backend that samples on the device, the greedy token is
 * chosen there and only its id comes back, unless KILN_GPU_SAMPLE=0). Stops at an end-of-sequence id from generation_config.json
 * unless --ignore-eos, or after --max-tokens. The prompt is --ids, or
 * --prompt TEXT encoded with the model's tokenizer (special tokens added as
 * its tokenizer.json says). Prints the generated ids, comma-separated, on
 * one line; with --prompt also the prompt and the generated text after it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/registry.h"
#include "base/error.h"
#include "base/file.h"
#include "base/mem.h"
#include "cli/cli.h"
#include "cli/cli_common.h"
#include "cli/cli_job.h"
#include "kiln/tokenizer.h"
#include "model/model.h"
#include "runner/runner.h"
#include "tensor/backend.h"

/* First index of the largest logit (ties go to the lower id). */
static int argmax(const float *v, int n) {
    int best = 0;
    for (int i = 1; i < n; i++)
        if (v[i] > v[best]) best = i;
    return best;
}

static int is_eos(const struct generation_config *g, int id) {
    for (int i = 0; i < g->n_eos; i++)
        if (g->eos_token_ids[i] == id) return 1;
    return 0;
}

int cmd_generate(int argc, char **argv) {
    struct model_args ma;
    model_args_defaults(&ma);
    const char *ids_arg = NULL, *prompt_text = NULL;
    int max_tokens = 32, ignore_eos = 0;
    const struct cli_opt opts[] = {
        CLI_OPT_STR("--ids", &ids_arg, "1,2,3", "the prompt as token ids"),
        CLI_OPT_STR("--prompt", &prompt_text, "TEXT", "the prompt as text (the model's tokenizer encodes it)"),
        CLI_OPT_INT("--max-tokens", &max_tokens, 0, 1 << 24, "N", "tokens to generate at most (default 32)"),
        CLI_OPT_FLAG("--ignore-eos", &ignore_eos, "go on after an end-of-sequence token"),
    };
    struct cli_opt model_opts[MODEL_ARGS_MAX_OPTS];
    const struct cli_group groups[] = {
        {NULL, opts, sizeof opts / sizeof opts[0]},
        {"model", model_opts, model_args_options(&ma, 1, model_opts)},
    };
    const struct cli_command cmd = {
        .name = "generate", .usage = "[MODEL] (--ids 1,2,3 | --prompt TEXT) [options]",
        .about = "Greedy decoding of one sequence. Prints the generated ids, comma-separated, on one line;\n"
                 "with --prompt also the prompt and the generated text after it.",
        .groups = groups, .n_groups = sizeof groups / sizeof groups[0], .max_positional = 1};
    const char *positional[2];
    int n_pos, prc = cli_parse(&cmd, argc, argv, positional, &n_pos);
    if (prc) return prc == 1 ? 0 : prc;
    if (!ids_arg == !prompt_text) {
        fprintf(stderr, "kiln generate: give exactly one of --ids and --prompt\n");
        return 2;
    }
    if ((prc = model_args_finish(&ma, "generate", n_pos ? positional[0] : NULL))) return prc;
    struct cli_job job;
    if ((prc = cli_job_start(&job, &ma, "generate", NULL, argc, argv)) >= 0) { /* a rank other than 0 */
        model_args_free(&ma);
        return prc;
    }
    int32_t *prompt = NULL;
    struct kiln_tokenizer *tok = NULL;
    int n_prompt;
    if (prompt_text) {
        struct kiln_error terr;
        struct kiln_token_ids ids = {0};
        if (kiln_tokenizer_load(&tok, ma.model_dir, &terr) ||
            kiln_tokenizer_encode(tok, prompt_text, strlen(prompt_text), 1, &ids, &terr)) {
            fprintf(stderr, "kiln generate: %s\n", terr.msg);
            kiln_tokenizer_free(tok);
            model_args_free(&ma);
            return cli_job_end(&job, 1);
        }
        n_prompt = (int)ids.n;
        prompt = xmalloc((size_t)(n_prompt ? n_prompt : 1) * sizeof *prompt);
        memcpy(prompt, ids.ids, (size_t)n_prompt * sizeof *prompt);
        kiln_token_ids_free(&ids);
    } else {
        n_prompt = cli_parse_ids(ids_arg, &prompt);
    }
    if (n_prompt <= 0) {
        if (n_prompt == 0) fprintf(stderr, "kiln generate: the prompt is empty\n");
        free(prompt);
        kiln_tokenizer_free(tok);
        model_args_free(&ma);
        return cli_job_end(&job, 2);
    }

    struct kiln_error err = {0};
    struct backend be = {0};
    struct model *m = NULL;
    struct runner *run = NULL;
    int rc = 1, page_size = ma.page_size;
    int32_t *seq = NULL, *pages = NULL, *rows = NULL, *pos = NULL, *slot = NULL;
    float *logits = NULL;
    struct backend_options bo;
    cli_job_backend_options(&job, &ma, &bo);
    if (backend_create(&be, ma.device, &bo, &err)) goto out;
    /* the context (and so the KV pool: one whole sequence) from config.json */
    struct model_config cfg0;
    {
        size_t dl = strlen(ma.model_dir);
        char *path = dl > 5 && !strcmp(ma.model_dir + dl - 5, ".json") ? xstrdup(ma.model_dir)
                                                                        : path_join(ma.model_dir, "config.json");
        int crc = model_config_load(&cfg0, path, &err);
        free(path);
        if (crc) goto out;
    }
    int ctx = cfg0.max_position_embeddings;
    for (int i = 0; i < n_prompt; i++)
        if (prompt[i] >= cfg0.vocab_size) {
            kiln_errorf(&err, "--ids: token id %d is outside the vocabulary of %d", prompt[i], cfg0.vocab_size);
            goto out;
        }
    if (n_prompt + max_tokens > ctx) max_tokens = ctx - n_prompt;
    if (max_tokens < 0) {
        kiln_errorf(&err, "the prompt of %d tokens exceeds the context of %d", n_prompt, ctx);
        goto out;
    }
    int n_pages = (ctx + page_size - 1) / page_size;
    struct model_options mo = {.load_format = ma.load_format, .quantization = ma.quantization,
                               .no_shared_expert_fusion = ma.no_shared_fusion,
                               .dummy_routing = (enum model_routing)ma.dummy_routing,
                               .max_batch_tokens = n_prompt,
                               .max_seqs = 1, .par = job.par};
    /* every page is taken at once and kept: as many sliding pages (a hybrid pool) */
    struct runner_options ro = {.page_size = page_size, .kv_tokens = (long)n_pages * page_size,
                                .swa_full_tokens_ratio = 1, .skip_warmup = 1, .ctrl = job.ctrl};
    if (runner_load(&run, &be, ma.model_dir, &mo, &ro, &err)) goto out;
    m = runner_model(run);
    const struct model_config *cfg = model_config(m);
    KILN_ASSERT(model_max_context(m) == ctx);
    pages = xmalloc((size_t)n_pages * 4);
    KILN_ASSERT(kv_pool_alloc(runner_kv(run), n_pages, pages) == 0);
    seq = xmalloc((size_t)(n_prompt + max_tokens + 1) * 4);
    memcpy(seq, prompt, (size_t)n_prompt * 4);
    pos = xmalloc((size_t)n_prompt * 4);
    slot = xmalloc((size_t)n_prompt * 4);
    logits = xmalloc((size_t)cfg->vocab_size * 4);
    int len = n_prompt, done = 0, first = 1;
    while (len - n_prompt < max_tokens) {
        int n = len - done;
        for (int i = 0; i < n; i++) {
            pos[i] = done + i;
            slot[i] = pages[(done + i) / page_size] * page_size + (done + i) % page_size;
        }
        int32_t q_start[2] = {0, n}, kv_len = len, page_start[2] = {0, n_pages}, row = n - 1;
        struct batch b = {.mode = done ? BATCH_MODE_DECODE : BATCH_MODE_EXTEND, .n_tokens = n,
                          .input_ids = seq + done, .positions = pos, .out_slot = slot,
                          .n_seqs = 1, .q_start = q_start, .kv_len = &kv_len,
                          .kv_page_start = page_start, .kv_pages = pages, .page_size = page_size,
                          .n_logit_rows = 1, .logit_rows = &row};
        int next;
        if (runner_can_sample(run)) { /* greedy on the device: only the id comes back */
            struct backend_sample_row greedy = {0};
            struct runner_sampling smp = {.rows = &greedy};
            int32_t t;
            if (runner_forward_sample(run, &b, &smp, &t, logits, &err)) goto out;
            next = t;
        } else {
            if (runner_forward(run, &b, logits, &err)) goto out;
            next = argmax(logits, cfg->vocab_size);
        }
        done = len;
        if (!ignore_eos && is_eos(model_generation_config(m), next)) break;
        printf(first ? "%d" : ",%d", next);
        first = 0;
        seq[len++] = next;
    }
    printf("\n");
    if (tok) {
        char *text = NULL;
        size_t tl = 0;
        if (kiln_tokenizer_decode(tok, seq, (size_t)len, 1, &text, &tl, &err)) goto out;
        printf("%.*s\n", (int)tl, text);
        free(text);
    }
    rc = 0;
out:
    if (rc) fprintf(stderr, "kiln generate: %s\n", err.msg);
    free(prompt), free(seq), free(pages), free(rows), free(pos), free(slot), free(logits);
    runner_free(run); /* and its model */
    backend_destroy(&be);
    kiln_tokenizer_free(tok);
    model_args_free(&ma);
    return cli_job_end(&job, rc);
}
