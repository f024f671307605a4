/* cmd_verify.c — `kiln verify`: checks the forward pass against reference
 * logits (the oracle format: p<i>.ids int32 [len], p<i>.logits fp32
 * [len][vocab]) three ways:
 *   prefill  — each whole sequence in one batch;
 *   decode   — the first half as one prefill, then one token per step;
 *   mixed    — all sequences in one stream of batches: chunked prefill of
 *              the first half (--chunk tokens per step) and decode rows of
 *              the other sequences in the same batches, staggered so that
 *              prefill chunks and decode rows really mix, on scattered KV
 *              pages.
 * A model whose every layer slides (kv_pool.window) returns the pages that
 * fall out of a sequence's window after each step, as the scheduler does,
 * so the later steps read the zero page there (kv_pool.h).
 * Prints max_abs_err=<x> rows=<n>; exits 0 only when every row is within the
 * tolerance (default 1e-3).
 * --routing-check (MoE models on a device): a CPU runner with fp32 products
 * runs every batch too, and the experts each MoE layer chooses are
 * compared (verify_routing.c): a choice may differ only at a near tie that
 * the device's own router logits explain, and the rows that follow such a
 * flip are not held to the tolerance (counted on the "routing" lines);
 * every other row is, and so are the router logits. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/registry.h"
#include "base/error.h"
#include "base/mem.h"
#include "cli/cli.h"
#include "cli/cli_common.h"
#include "cli/cli_job.h"
#include "cli/verify_routing.h"
#include "model/model.h"
#include "runner/runner.h"
#include "model/safetensors.h"

enum { DP_GROUPS_MAX = 64 };

struct ref_seq {
    int len;
    const int32_t *ids;
    const float *logits; /* [len][vocab] */
    int32_t *pages;
    int n_pages;
    int n_dropped; /* pages[0 .. n_dropped) went back: the zero page */
};

struct verify {
    struct model *m;
    struct runner *r;
    /* the page ids of each DP attention group (one without DP attention):
     * sequence i is group i % dp's, and group g's ranks keep its sequences'
     * KV only, each in a pool of its own as large as rank 0's, so kv[0] is
     * rank 0's pool and the others are free lists of the same ids
     * (kv_pool_init_ids) naming the other groups' memory */
    struct kv_pool *kv[DP_GROUPS_MAX];
    struct kv_pool own[DP_GROUPS_MAX];
    int vocab, page_size;
    int dp; /* DP attention groups (--dp) */
    struct ref_seq *seqs;
    int n_seqs;
    double max_err;
    long rows;
    double mode_err;
    long mode_rows;
    /* --routing-check: the reference runner on the CPU, the comparison,
     * and this mode's rows not compared (they follow a flip) */
    struct runner *cr;
    struct kv_pool *ckv; /* its pool, kept in step with kv[0] */
    struct verify_routing *vr;
    long mode_excluded;
};

static struct kv_pool *pool_of(struct verify *v, const struct ref_seq *s) {
    return v->kv[v->dp > 1 ? (int)(s - v->seqs) % v->dp : 0];
}

/* Makes sure seq s owns pages for `len` positions. The reference runner's
 * pool (--routing-check, one group) takes the same steps from the same
 * state, so it hands out the same page ids (and sliding pages). */
static int ensure_pages(struct verify *v, struct ref_seq *s, int len) {
    int need = (len + v->page_size - 1) / v->page_size;
    if (need <= s->n_pages) return 0;
    if (kv_pool_alloc(pool_of(v, s), need - s->n_pages, s->pages + s->n_pages)) return -1;
    if (v->ckv) {
        int32_t *ids = xmalloc((size_t)(need - s->n_pages) * sizeof *ids);
        int same = !kv_pool_alloc(v->ckv, need - s->n_pages, ids) &&
                   !memcmp(ids, s->pages + s->n_pages, (size_t)(need - s->n_pages) * sizeof *ids);
        free(ids);
        KILN_ASSERT_MSG(same, "verify: the reference runner's KV pool gave other pages");
    }
    s->n_pages = need;
    return 0;
}

static void release_pages(struct verify *v, struct ref_seq *s) {
    kv_pool_release(pool_of(v, s), s->pages + s->n_dropped, s->n_pages - s->n_dropped);
    if (v->ckv) kv_pool_release(v->ckv, s->pages + s->n_dropped, s->n_pages - s->n_dropped);
    s->n_pages = 0;
    s->n_dropped = 0;
}

/* Every layer slides: the pages wholly before the window of position
 * `next` go back to the pool. A hybrid pool: their sliding pages do. */
static void drop_pages(struct verify *v, struct ref_seq *s, int next) {
    struct kv_pool *kv = pool_of(v, s);
    int dropped = s->n_dropped;
    kv_pool_drop(kv, s->pages, &s->n_dropped, kv_pool_window_dead(kv, next, s->n_pages));
    if (v->ckv) kv_pool_drop(v->ckv, s->pages, &dropped, kv_pool_window_dead(v->ckv, next, s->n_pages));
    if (kv->swa_window > 0) kv_pool_drop_swa(kv, s->pages, kv_pool_swa_dead(kv, next, s->n_pages));
    if (v->ckv && v->ckv->swa_window > 0)
        kv_pool_drop_swa(v->ckv, s->pages, kv_pool_swa_dead(v->ckv, next, s->n_pages));
}

/* One step: for each listed sequence, tokens [from[i], to[i]). Compares the
 * logits of every row with the reference. */
static int run_step(struct verify *v, int k, const int *which, const int *from, const int *to,
                    struct kiln_error *err) {
    int n = 0, total_pages = 0;
    for (int i = 0; i < k; i++) {
        struct ref_seq *s = &v->seqs[which[i]];
        if (ensure_pages(v, s, to[i])) return kiln_errorf(err, "KV pool exhausted");
        n += to[i] - from[i];
        total_pages += s->n_pages;
    }
    int32_t *ids = xmalloc((size_t)n * 4), *pos = xmalloc((size_t)n * 4),
            *slot = xmalloc((size_t)n * 4), *rows = xmalloc((size_t)n * 4);
    int32_t *q_start = xmalloc((size_t)(k + 1) * 4), *kv_len = xmalloc((size_t)k * 4),
            *page_start = xmalloc((size_t)(k + 1) * 4), *pages = xmalloc((size_t)total_pages * 4 + 4),
            *group = xmalloc((size_t)k * 4);
    int t = 0, pg = 0;
    for (int i = 0; i < k; i++) {
        struct ref_seq *s = &v->seqs[which[i]];
        q_start[i] = t;
        page_start[i] = pg;
        memcpy(pages + pg, s->pages, (size_t)s->n_pages * 4);
        pg += s->n_pages;
        kv_len[i] = to[i];
        group[i] = v->dp > 1 ? which[i] % v->dp : 0;
        for (int p = from[i]; p < to[i]; p++, t++) {
            ids[t] = s->ids[p];
            pos[t] = p;
            slot[t] = s->pages[p / v->page_size] * v->page_size + p % v->page_size;
            rows[t] = t;
        }
    }
    q_start[k] = t;
    page_start[k] = pg;
    struct batch b = {.mode = BATCH_MODE_EXTEND, .n_tokens = n, .input_ids = ids, .positions = pos,
                      .out_slot = slot, .n_seqs = k, .q_start = q_start, .kv_len = kv_len,
                      .kv_page_start = page_start, .kv_pages = pages, .page_size = v->page_size,
                      .seq_group = v->dp > 1 ? group : NULL, .n_logit_rows = n, .logit_rows = rows};
    float *logits = xmalloc((size_t)n * (size_t)v->vocab * 4);
    if (v->vr) vr_step_begin(v->vr);
    int rc = runner_forward(v->r, &b, logits, err);
    if (rc == 0 && v->vr) { /* the same batch on the CPU (its routing only: no logits), the choices compared */
        struct batch rb = b;
        rb.n_logit_rows = 0, rb.logit_rows = NULL;
        struct vr_row *vrows = xmalloc((size_t)n * sizeof *vrows);
        rc = runner_forward(v->cr, &rb, NULL, err);
        for (int i = 0, u = 0; i < k; i++)
            for (int p = from[i]; p < to[i]; p++, u++) vrows[u] = (struct vr_row){which[i], p};
        if (rc == 0) rc = vr_step_compare(v->vr, vrows, n, err);
        free(vrows);
    }
    if (rc == 0) {
        t = 0;
        for (int i = 0; i < k; i++) {
            const struct ref_seq *s = &v->seqs[which[i]];
            for (int p = from[i]; p < to[i]; p++, t++) {
                if (v->vr && vr_excluded(v->vr, which[i], p)) {
                    v->mode_excluded++;
                    continue;
                }
                const float *got = logits + (size_t)t * v->vocab, *want = s->logits + (size_t)p * v->vocab;
                for (int j = 0; j < v->vocab; j++) {
                    double e = fabs((double)got[j] - (double)want[j]);
                    if (!(e <= v->mode_err)) v->mode_err = isnan(e) ? INFINITY : e;
                }
                v->mode_rows++;
            }
        }
    }
    if (rc == 0)
        for (int i = 0; i < k; i++) drop_pages(v, &v->seqs[which[i]], to[i]);
    free(ids), free(pos), free(slot), free(rows), free(q_start), free(kv_len), free(page_start),
        free(pages), free(logits), free(group);
    return rc;
}

static void mode_begin(struct verify *v) {
    v->mode_err = 0;
    v->mode_rows = 0;
    v->mode_excluded = 0;
    if (v->vr) vr_mode_begin(v->vr);
}

static void mode_end(struct verify *v, const char *name) {
    if (v->vr) vr_mode_end(v->vr, name, v->mode_excluded);
    printf("mode=%s max_abs_err=%.3g rows=%ld\n", name, v->mode_err, v->mode_rows);
    if (v->mode_err > v->max_err) v->max_err = v->mode_err;
    v->rows += v->mode_rows;
}

static int verify_prefill(struct verify *v, struct kiln_error *err) {
    mode_begin(v);
    for (int i = 0; i < v->n_seqs; i++) {
        int from = 0, to = v->seqs[i].len;
        if (run_step(v, 1, &i, &from, &to, err)) return -1;
        release_pages(v, &v->seqs[i]);
    }
    mode_end(v, "prefill");
    return 0;
}

static int verify_decode(struct verify *v, struct kiln_error *err) {
    mode_begin(v);
    for (int i = 0; i < v->n_seqs; i++) {
        int half = v->seqs[i].len / 2 > 0 ? v->seqs[i].len / 2 : 1;
        int from = 0, to = half;
        if (run_step(v, 1, &i, &from, &to, err)) return -1;
        for (int p = half; p < v->seqs[i].len; p++) {
            from = p;
            to = p + 1;
            if (run_step(v, 1, &i, &from, &to, err)) return -1;
        }
        release_pages(v, &v->seqs[i]);
    }
    mode_end(v, "decode");
    return 0;
}

static int verify_mixed(struct verify *v, int chunk, struct kiln_error *err) {
    mode_begin(v);
    int *done = xcalloc((size_t)v->n_seqs, sizeof *done);
    int *which = xmalloc((size_t)v->n_seqs * sizeof *which), *from = xmalloc((size_t)v->n_seqs * 4),
        *to = xmalloc((size_t)v->n_seqs * 4);
    int rc = 0;
    for (int step = 0;; step++) {
        int k = 0;
        for (int i = 0; i < v->n_seqs; i++) {
            const struct ref_seq *s = &v->seqs[i];
            if (step < i || done[i] >= s->len) continue; /* staggered start */
            int half = s->len / 2 > 0 ? s->len / 2 : 1;
            int take = done[i] < half ? (half - done[i] < chunk ? half - done[i] : chunk) : 1;
            which[k] = i;
            from[k] = done[i];
            to[k] = done[i] + take;
            done[i] += take;
            k++;
        }
        if (k == 0) {
            int all = 1;
            for (int i = 0; i < v->n_seqs; i++) all &= done[i] >= v->seqs[i].len;
            if (all) break;
            continue;
        }
        if ((rc = run_step(v, k, which, from, to, err))) break;
    }
    for (int i = 0; i < v->n_seqs; i++) release_pages(v, &v->seqs[i]);
    free(done), free(which), free(from), free(to);
    if (rc == 0) mode_end(v, "mixed");
    return rc;
}

static int load_reference(struct verify *v, struct st_set *ref, const char *path,
                          struct kiln_error *err) {
    if (st_open_file(ref, path, err)) return -1;
    int n = 0;
    while (1) {
        char name[64];
        snprintf(name, sizeof name, "p%d.ids", n);
        if (!st_find(ref, name)) break;
        n++;
    }
    if (n == 0) return kiln_errorf(err, "%s: no tensor 'p0.ids' (expected p<i>.ids and p<i>.logits)", path);
    v->seqs = xcalloc((size_t)n, sizeof *v->seqs);
    v->n_seqs = n;
    for (int i = 0; i < n; i++) {
        char name[64];
        const struct st_tensor *ids, *lg;
        snprintf(name, sizeof name, "p%d.ids", i);
        ids = st_find(ref, name);
        if (ids->ndim != 1 || ids->dtype != DTYPE_I32 || ids->shape[0] < 1)
            return kiln_errorf(err, "%s: tensor '%s' must be a non-empty I32 vector", path, name);
        int64_t shape[2] = {ids->shape[0], v->vocab};
        snprintf(name, sizeof name, "p%d.logits", i);
        if (st_expect(ref, name, 2, shape, &lg, err)) return -1;
        if (lg->dtype != DTYPE_F32) return kiln_errorf(err, "%s: tensor '%s' must be F32", path, name);
        v->seqs[i].len = (int)ids->shape[0];
        v->seqs[i].ids = ids->data;
        v->seqs[i].logits = lg->data;
        for (int p = 0; p < v->seqs[i].len; p++)
            if (v->seqs[i].ids[p] < 0 || v->seqs[i].ids[p] >= v->vocab)
                return kiln_errorf(err, "%s: tensor 'p%d.ids' holds id %d outside the vocabulary of %d",
                                   path, i, v->seqs[i].ids[p], v->vocab);
    }
    return 0;
}

int cmd_verify(int argc, char **argv) {
    struct model_args ma;
    model_args_defaults(&ma);
    const char *ref_path = NULL;
    int chunk = 3, routing = 0;
    double tol = 1e-3;
    const struct cli_opt opts[] = {
        CLI_OPT_STR("--reference", &ref_path, "FILE", "p<i>.ids and p<i>.logits tensors (safetensors); required"),
        CLI_OPT_INT("--chunk", &chunk, 1, 1 << 20, "N", "prefill tokens per step in the mixed mode (default 3)"),
        CLI_OPT_DOUBLE("--tolerance", &tol, 0, 1e30, "X", "largest absolute logit error accepted (default 1e-3)"),
        CLI_OPT_FLAG("--routing-check", &routing,
                     "MoE models: compare the experts chosen with a CPU runner's (fp32) on every batch; rows "
                     "after a choice flipped at a near tie are not compared"),
    };
    struct cli_opt model_opts[MODEL_ARGS_MAX_OPTS];
    const struct cli_group groups[] = {
        {NULL, opts, sizeof opts / sizeof opts[0]},
        {"model", model_opts, model_args_options(&ma, 1, model_opts)},
    };
    const struct cli_command cmd = {
        .name = "verify", .usage = "[MODEL] --reference FILE [options]",
        .about = "Checks the forward pass against reference logits: each sequence as one prefill, as a\n"
                 "prefill and then one token per step, and all of them mixed in chunked batches.",
        .groups = groups, .n_groups = sizeof groups / sizeof groups[0], .max_positional = 1};
    const char *positional[2];
    int n_pos, prc = cli_parse(&cmd, argc, argv, positional, &n_pos);
    if (prc) return prc == 1 ? 0 : prc;
    if (!ref_path) {
        fprintf(stderr, "kiln verify: --reference FILE is required\n");
        return 2;
    }
    if ((prc = model_args_finish(&ma, "verify", n_pos ? positional[0] : NULL))) return prc;
    if (ma.dummy_routing != MODEL_ROUTING_MODEL) {
        fprintf(stderr, "kiln verify: --dummy-routing %s: verify checks the model's own routing "
                        "against the reference; random routing makes outputs meaningless\n", ma.dummy_routing_name);
        model_args_free(&ma);
        return 2;
    }
    if (routing && (ma.tp > 1 || ma.pp > 1 || ma.dp > 1 || ma.nnodes > 1)) {
        fprintf(stderr, "kiln verify: --routing-check runs on one rank (no --tp, --pp, --dp or --nnodes)\n");
        model_args_free(&ma);
        return 2;
    }
    struct cli_job job;
    if ((prc = cli_job_start(&job, &ma, "verify", NULL, argc, argv)) >= 0) { /* a rank other than 0 */
        model_args_free(&ma);
        return prc;
    }
    struct kiln_error err = {0};
    struct backend be = {0}, cbe = {0};
    struct st_set ref = {0};
    struct verify v = {0};
    int rc = 1;
    struct backend_options bo;
    cli_job_backend_options(&job, &ma, &bo);
    if (backend_create(&be, ma.device, &bo, &err)) goto out;

    /* Size everything from the reference: the longest sequence, and all of
     * them at once for the mixed mode. */
    struct model_config cfg;
    {
        char path[4096];
        snprintf(path, sizeof path, "%s/config.json", ma.model_dir);
        if (model_config_load(&cfg, path, &err)) goto out;
    }
    v.vocab = cfg.vocab_size;
    v.page_size = ma.page_size;
    v.dp = ma.dp;
    if (load_reference(&v, &ref, ref_path, &err)) goto out;
    /* the pool: every sequence at once, of the group with the most (a
     * page more a sequence) */
    int total = 0, longest = 0, group_pages[DP_GROUPS_MAX] = {0}, pages = 0, G = v.dp > 1 ? v.dp : 1;
    if (G > DP_GROUPS_MAX) {
        kiln_errorf(&err, "--dp %d is above %d", G, DP_GROUPS_MAX);
        goto out;
    }
    for (int i = 0; i < v.n_seqs; i++) {
        total += v.seqs[i].len;
        if (v.seqs[i].len > longest) longest = v.seqs[i].len;
        group_pages[i % G] += (v.seqs[i].len + v.page_size - 1) / v.page_size + 1;
        v.seqs[i].pages = xmalloc((size_t)(v.seqs[i].len / v.page_size + 2) * 4);
    }
    for (int g = 0; g < G; g++) pages = group_pages[g] > pages ? group_pages[g] : pages;
    struct model_options mo = {.load_format = ma.load_format, .quantization = ma.quantization,
                               .no_shared_expert_fusion = ma.no_shared_fusion,
                               .max_batch_tokens = total,
                               .max_seqs = v.n_seqs,
                               .max_context = longest > cfg.max_position_embeddings
                                                  ? longest : cfg.max_position_embeddings,
                               .par = job.par};
    /* a hybrid pool: as many sliding pages, since a step may hold every
     * sequence's whole prompt (the window's pages still go back) */
    struct runner_options ro = {.page_size = v.page_size,
                                .kv_tokens = (long)pages * v.page_size,
                                .swa_full_tokens_ratio = 1, .skip_warmup = 1, .ctrl = job.ctrl};
    ro.no_graphs = routing; /* the trace copies every layer's choices out */
    if (runner_load(&v.r, &be, ma.model_dir, &mo, &ro, &err)) goto out;
    v.m = runner_model(v.r);
    v.kv[0] = runner_kv(v.r);
    if (routing) { /* the reference runner: the same model on the CPU, fp32 products */
        if (model_moe_layers(v.m) == 0) {
            kiln_errorf(&err, "--routing-check: %s has no MoE layers", ma.model_dir);
            goto out;
        }
        struct backend_options cbo = {.cpu_f32 = 1, .kv_fp8 = bo.kv_fp8};
        if (backend_create(&cbe, "cpu", &cbo, &err) || runner_load(&v.cr, &cbe, ma.model_dir, &mo, &ro, &err))
            goto out;
        v.vr = vr_create(&cbe, v.n_seqs);
        struct model_route_trace td = vr_trace_device(v.vr), tc = vr_trace_cpu(v.vr);
        model_set_route_trace(v.m, &td);
        model_set_route_trace(runner_model(v.cr), &tc);
    }
    for (int g = 1; g < G; g++) {
        if (kv_pool_init_ids(&v.own[g], v.page_size, v.kv[0]->n_pages, &err)) goto out;
        if (v.kv[0]->window > 0 && kv_pool_set_window(&v.own[g], v.kv[0]->window, &err)) goto out;
        v.kv[g] = &v.own[g];
    }
    for (int g = 0; g < G; g++) kv_pool_scramble(v.kv[g], 12345 + (uint64_t)g);
    if (v.cr) {
        v.ckv = runner_kv(v.cr);
        kv_pool_scramble(v.ckv, 12345);
    }

    if (verify_prefill(&v, &err) || verify_decode(&v, &err) || verify_mixed(&v, chunk, &err))
        goto out;
    printf("max_abs_err=%.3g rows=%ld\n", v.max_err, v.rows);
    if (!(v.max_err <= tol)) {
        fprintf(stderr, "kiln verify: max_abs_err %.3g exceeds the tolerance %.3g\n", v.max_err, tol);
    } else if (v.vr && !(vr_router_err(v.vr) <= tol)) {
        fprintf(stderr, "kiln verify: the router logits differ from the CPU's by %.3g, above the tolerance %.3g\n",
                vr_router_err(v.vr), tol);
    } else {
        rc = 0;
    }
out:
    if (rc && err.msg[0]) fprintf(stderr, "kiln verify: %s\n", err.msg);
    runner_free(v.r); /* and its model */
    runner_free(v.cr);
    vr_free(v.vr);
    backend_destroy(&cbe);
    for (int g = 1; g < DP_GROUPS_MAX; g++) kv_pool_free(&v.own[g]);
    for (int i = 0; i < v.n_seqs; i++) free(v.seqs[i].pages);
    free(v.seqs);
    st_close(&ref);
    backend_destroy(&be);
    model_args_free(&ma);
    return cli_job_end(&job, rc);
}
