/* runner.c — a runner's set-up: the staging and sampling buffers, the
 * memory plan, the KV pool, and the start-up sequence of runner_load. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/knob.h"
#include "base/log.h"
#include "base/mem.h"
#include "dist/comm.h"
#include "runner/mem_plan.h"
#include "runner/runner_internal.h"

struct model *runner_model(const struct runner *r) { return r->m; }
struct kv_pool *runner_kv(struct runner *r) { return &r->kv; }
int runner_can_sample(const struct runner *r) { return r->sample_on; }
int runner_sample_adj_capacity(const struct runner *r) { return r->adj_cap; }
uint32_t *runner_mask_host(struct runner *r) { return r->smask_host; }
int runner_mask_words(const struct runner *r) { return r->mask_words; }

/* The staging buffer, the logits of one chunk and the device sampler's
 * buffers, for the model's largest batch. */
static int reserve_buffers(struct runner *r, struct kiln_error *err) {
    const struct backend_ops *ops = r->be->ops;
    void *ctx = r->be->ctx;
    long T = r->max_batch_tokens, S = r->max_seqs;
    struct mem_plan_runner l; /* the sizes the memory plan counts */
    int hybrid = r->swa_window > 0;
    mem_plan_runner_layout(T, S, r->max_context, r->page_size, ops->sample != NULL, hybrid, &l);
    r->logit_chunk = (int)l.logit_chunk;
    r->pages_cap = l.pages_cap;
#define ALLOC(field, count, type)                                                           \
    do {                                                                                    \
        r->field = ops->alloc(ctx, (size_t)(count) * sizeof(type));                         \
        if (!r->field)                                                                     \
            return kiln_errorc(err, KILN_ERR_OUT_OF_MEMORY, "out of device memory for activations (%s)", #field); \
    } while (0)
    ALLOC(logits, (long)r->logit_chunk * r->vocab, float);
    r->stage_srows_off = l.stage_srows_off;
    r->stage_pages_off = l.stage_pages_off;
    long stage_ints = l.stage_ints;
    ALLOC(stage, stage_ints, int32_t);
    if (ops->sample) {
        r->adj_cap = l.adj_cap;
        ALLOC(sadj, r->adj_cap, struct backend_sample_adj);
        ALLOC(stok, S, int32_t);
    }
    r->mask_words = (int)((r->vocab + 31) / 32);
    if (ops->sample) ALLOC(smask, S * r->mask_words, uint32_t);
#undef ALLOC
    r->ids = r->stage;
    r->pos = r->ids + T;
    r->slot = r->pos + T;
    r->rows = r->slot + T;
    r->q_start = r->rows + T;
    r->page_start = r->q_start + S + 1;
    r->pages = r->stage + r->stage_pages_off;
    r->srows = (struct backend_sample_row *)(r->stage + r->stage_srows_off);
    if (hybrid) {
        r->stage_swa_off = l.stage_swa_off;
        r->swa_slot = r->stage + r->stage_swa_off;
        r->swa_pages = r->swa_slot + T;
        r->swa_slot_host = xmalloc((size_t)T * 4);
        r->swa_pages_host = xmalloc((size_t)r->pages_cap * 4);
    }
    if (ops->host_alloc && (r->stage_host = ops->host_alloc(ctx, (size_t)stage_ints * 4)))
        r->stage_pinned = 1;
    else
        r->stage_host = xmalloc((size_t)stage_ints * 4);
    r->perm = xmalloc((size_t)T * sizeof *r->perm);
    if (ops->sample) {
        size_t ab = (size_t)r->adj_cap * sizeof *r->sadj_host;
        if (ops->host_alloc && (r->sadj_host = ops->host_alloc(ctx, ab))) r->sadj_pinned = 1;
        else r->sadj_host = xmalloc(ab);
        if (ops->host_alloc && (r->stok_host = ops->host_alloc(ctx, (size_t)S * 4))) r->stok_pinned = 1;
        else r->stok_host = xmalloc((size_t)S * 4);
    }
    size_t mb = (size_t)S * (size_t)r->mask_words * 4;
    if (ops->sample && ops->host_alloc && (r->smask_host = ops->host_alloc(ctx, mb))) r->smask_pinned = 1;
    else r->smask_host = xcalloc(mb, 1);
    return 0;
}

static void free_buffers(struct runner *r) {
    const struct backend_ops *ops = r->be->ops;
    runner_drop_graphs(r);
    void *bufs[] = {r->logits, r->stage, r->sadj, r->stok, r->smask};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        if (bufs[i]) ops->free(r->be->ctx, bufs[i]);
    void *host[] = {r->stage_host, r->sadj_host, r->stok_host, r->smask_host};
    int pinned[] = {r->stage_pinned, r->sadj_pinned, r->stok_pinned, r->smask_pinned};
    for (int i = 0; i < 4; i++) {
        if (pinned[i]) ops->host_free(r->be->ctx, host[i]);
        else free(host[i]);
    }
    free(r->perm);
    free(r->swa_slot_host);
    free(r->swa_pages_host);
}

#define GIB(x) ((double)(x) / 1073741824.0)

/* The KV pool's size in tokens: the memory plan (mem_plan.h) from the
 * model's config and the device's memory before the model loaded
 * (free_before). The weights and the buffers counted so far are in place
 * by now; where they took more than the plan counted (the allocator's
 * rounding), the pool gives way, never the reserve. */
static int plan_kv_tokens(const struct runner *r, const struct runner_options *o, size_t per_token,
                          size_t free_before, long *out, struct kiln_error *err) {
    const struct backend_ops *ops = r->be->ops;
    struct model *m = r->m;
    const struct model_config *c = model_config(m);
    struct backend_step_shape shape;
    model_step_shape(c, r->max_batch_tokens, r->max_context, model_fuses_shared(m), &shape);
    shape.device_sampling = ops->sample != NULL;
    size_t free_now = 0, total = 0;
    if (ops->mem_info) ops->mem_info(r->be->ctx, &free_now, &total);
    struct mem_plan_in in = {
        .device_total = total, .device_free = free_before,
        .mem_fraction_static = o->mem_fraction_static, .kv_tokens = o->kv_tokens,
        .kv_token_bytes = per_token, .max_context = r->max_context,
        .max_running_requests = o->max_running_requests,
        .chunked_prefill_size = o->chunked_prefill_size,
        .window = model_config_all_window(c), .page_size = r->page_size,
        .weights = model_weight_bytes(m) + model_config_derived_bytes(c),
        .activations = model_activation_bytes(c, r->max_batch_tokens, r->max_context),
        .runner = mem_plan_runner_bytes(r->max_batch_tokens, r->max_seqs, r->max_context,
                                        r->page_size, r->vocab, ops->sample != NULL, r->swa_window > 0),
        .workspace = ops->workspace_bytes ? ops->workspace_bytes(r->be->ctx, &shape) : 0};
    struct mem_plan p;
    if (mem_plan_compute(&in, &p, err)) return -1;
    long tokens = p.kv_tokens;
    if (total && o->kv_tokens <= 0) {
        /* what is allocated beside the weights already, against the plan */
        double used = (double)free_before - (double)free_now - (double)in.weights;
        double later = (double)p.reserve - (used > 0 ? used : 0);
        double room = (double)free_now - (later > 0 ? later : 0);
        if ((double)tokens * (double)per_token > room) tokens = (long)(room / (double)per_token);
        if (tokens < p.need_tokens)
            return kiln_errorc(err, KILN_ERR_OUT_OF_MEMORY,
                               "not enough device memory for the KV cache: %.2f GiB are free after "
                               "loading (the plan expected %.2f GiB), %.2f GiB of it stay back; "
                               "%ld tokens of %zu bytes are needed",
                               GIB(free_now), GIB((double)free_before - (double)in.weights -
                                                  (double)in.activations - (double)in.runner),
                               GIB(later > 0 ? later : 0), p.need_tokens, per_token);
        log_info("memory plan: device %.2f GiB; weights %.2f GiB; activations %.2f GiB, runner "
                 "buffers %.2f GiB, backend scratch %.2f GiB, headroom %.2f GiB (%.2f GiB kept "
                 "back, --mem-fraction-static %.2f); KV cache %.2f GiB (%ld tokens); %.2f GiB in "
                 "use beside the weights before the pool",
                 GIB(total), GIB(in.weights), GIB(in.activations), GIB(in.runner),
                 GIB(in.workspace), GIB(MEM_PLAN_HEADROOM), GIB(p.reserve), p.fraction,
                 GIB((double)tokens * (double)per_token), tokens, GIB(used > 0 ? used : 0));
    } else {
        log_debug("memory plan: weights %.2f GiB, activations %.2f GiB, runner buffers %.2f GiB, "
                  "backend scratch %.2f GiB; KV cache %ld tokens",
                  GIB(in.weights), GIB(in.activations), GIB(in.runner), GIB(in.workspace), tokens);
    }
    *out = tokens;
    return 0;
}

static int init(struct runner *r, struct model *m, const struct runner_options *o,
                struct kiln_error *err) {
    r->m = m;
    r->be = model_backend(m);
    r->kv.scratch_page = -1;
    r->max_batch_tokens = model_max_batch_tokens(m);
    r->max_seqs = model_max_seqs(m);
    r->max_context = model_max_context(m);
    r->page_size = o && o->page_size > 0 ? o->page_size : 1;
    r->vocab = model_config(m)->vocab_size;
    r->hidden = model_config(m)->hidden_size;
    const struct backend_ops *ops = r->be->ops;
    /* Graphs need a step the backend can record: no host round trips and
     * a backend that records. */
    r->graphs_on = ops->graph_begin && !(o && o->no_graphs) && knob_bool(KNOB_GRAPHS);
    r->sample_on = ops->sample && knob_bool(KNOB_GPU_SAMPLE);
    r->graph_sample_on = knob_bool(KNOB_GRAPH_SAMPLE);
    /* the layers must run without the host for every decode bucket's rows */
    long biggest = 0;
    for (int i = 0; i < RUNNER_GRAPH_BUCKETS; i++)
        if (runner_bucket_size(i) <= r->max_seqs && runner_bucket_size(i) <= r->max_batch_tokens)
            biggest = runner_bucket_size(i);
    if (r->graphs_on && !model_graphable(m, biggest)) r->graphs_on = 0;
    const struct model_config *c = model_config(m);
    int hw = model_config_hybrid_window(c);
    if (hw > 0 && hw < r->max_context && c->shard.dp_size <= 1 && !(o && o->disable_hybrid_swa)) r->swa_window = hw;
    r->ctrl = o ? o->ctrl : NULL;
    if (r->ctrl && r->ctrl->size > 1) {
        r->lead = r->ctrl->rank == 0;
        r->follower = !r->lead;
    }
    if (r->follower) {
        r->f_rows = xcalloc((size_t)r->max_batch_tokens, sizeof *r->f_rows);
        r->f_tokens = xcalloc((size_t)r->max_batch_tokens, sizeof *r->f_tokens);
    }
    return reserve_buffers(r, err) || runner_pp_init(r, err) ? -1 : 0;
}

static int create_pool(struct runner *r, const struct runner_options *o, size_t free_before,
                       struct kiln_error *err) {
    struct model *m = r->m;
    const struct model_config *c = model_config(m);
    struct kv_layer_layout layout[512];
    int nl = model_kv_layout(m, layout, 512);
    size_t per_token = kv_pool_page_bytes(layout, nl, 1, backend_kv_dtype(r->be));
    static const struct runner_options none = {0};
    if (!o) o = &none;
    /* a hybrid pool: a full token costs its full layers' bytes and the
     * ratio's share of the sliding layers' */
    unsigned char layer_swa[512] = {0};
    double ratio = mem_plan_swa_ratio(o->swa_full_tokens_ratio);
    if (r->swa_window > 0) {
        struct model_stage st;
        model_stage_of(m, &st);
        for (int l = 0; l < nl; l++) layer_swa[l] = model_config_layer_window(c, st.layer0 + l) > 0;
        enum dtype dt = backend_kv_dtype(r->be);
        per_token = kv_pool_token_bytes_part(layout, layer_swa, nl, dt, 0) +
                    (size_t)ceil(ratio * (double)kv_pool_token_bytes_part(layout, layer_swa, nl, dt, 1));
    }
    long tokens = 0;
    if (plan_kv_tokens(r, o, per_token, free_before, &tokens, err)) return -1;
    if (r->ctrl && r->ctrl->size > 1 && runner_ctrl_agree(r, &tokens, err)) return -1;
    int n_pages = (int)((tokens + r->page_size - 1) / r->page_size);
    if (r->swa_window > 0) {
        long n_swa = mem_plan_swa_tokens(tokens, ratio, r->swa_window, r->page_size, r->max_batch_tokens) /
                     r->page_size;
        return kv_pool_init_hybrid(&r->kv, r->be, layout, layer_swa, nl, r->page_size, n_pages, r->swa_window,
                                   (int)n_swa + 2, err); /* + the zero and padding pages */
    }
    int window = model_config_all_window(c);
    if (window > 0) n_pages++; /* the zero page (kv_pool_set_window) */
    if (kv_pool_init(&r->kv, r->be, layout, nl, r->page_size, n_pages, err)) return -1;
    return window > 0 ? kv_pool_set_window(&r->kv, window, err) : 0;
}

int runner_create(struct runner **out, struct model *m, const struct runner_options *ro,
                  struct kiln_error *err) {
    *out = NULL;
    if (ro && ro->ctrl && ro->ctrl->size > 1)
        return kiln_errorf(err, "runner_create: a runner of several ranks is made by runner_load "
                                "(the other ranks must load the same model)");
    struct runner *r = xcalloc(1, sizeof *r);
    size_t free_now = 0, total = 0;
    const struct backend *be = model_backend(m);
    if (be->ops->mem_info) be->ops->mem_info(be->ctx, &free_now, &total);
    if (init(r, m, ro, err) || create_pool(r, ro, free_now + model_weight_bytes(m), err)) {
        runner_free(r);
        return -1;
    }
    *out = r;
    return 0;
}

/* The device backend's communicator over the ranks [first, first + n) of
 * the job (every rank calls it, each for the group it is in; the groups
 * split the ranks into equal consecutive ranges): each group's first rank
 * makes its start-up token (backend_ops.comm_id), every rank's travels on
 * ctrl in one all-gather, led by its length (0: that rank failed, and says
 * why), and every rank joins its group with its first rank's. */
static int device_comm_start(struct backend *be, struct dist_comm *ctrl, int first, int n, const char *what,
                             struct dist_comm **out, struct kiln_error *err) {
    enum { MSG = 8 + DIST_COMM_ID_MAX };
    uint8_t *all = xcalloc((size_t)ctrl->size, MSG), *msg = all + (size_t)ctrl->rank * MSG;
    uint64_t len = 0;
    struct kiln_error e0 = {0};
    if (ctrl->rank == first) {
        size_t l = DIST_COMM_ID_MAX;
        if (!be->ops->comm_id(be->ctx, msg + 8, &l, &e0)) len = l;
        memcpy(msg, &len, 8);
    }
    if (dist_comm_all_gather(ctrl, msg, all, MSG, err)) {
        free(all);
        return -1;
    }
    memcpy(&len, all + (size_t)first * MSG, 8);
    if (!len || len > DIST_COMM_ID_MAX) {
        free(all);
        if (ctrl->rank == first) {
            *err = e0;
            return -1;
        }
        return kiln_errorf(err, "rank %d could not start the %s communicator of %s", first, be->ops->name, what);
    }
    struct dist_comm *c = xcalloc(1, sizeof *c);
    int rc = be->ops->comm_init(be->ctx, c, ctrl->rank - first, n, all + (size_t)first * MSG + 8, (size_t)len, err);
    free(all);
    if (rc) {
        free(c);
        return -1;
    }
    log_info("rank %d of %d: %s run on %s's own communicator (%s, rank %d of %d)", ctrl->rank, ctrl->size, what,
             be->ops->name, c->ops->name, c->rank, c->size);
    *out = c;
    return 0;
}

static void device_comm_free(struct dist_comm *c) {
    if (!c) return;
    dist_comm_free(c);
    free(c);
}

int runner_load(struct runner **out, struct backend *be, const char *model_dir,
                const struct model_options *mo_in, const struct runner_options *ro,
                struct kiln_error *err) {
    *out = NULL;
    struct model_options mo = mo_in ? *mo_in : (struct model_options){0};
    struct dist_comm *ctrl = ro->ctrl && ro->ctrl->size > 1 ? ro->ctrl : NULL;
    /* the model's collectives (model_parallel.comm): the backend's own
     * communicator where it has one (CUDA: NCCL), else the host ctrl
     * (the TCP mesh: host memory, the CPU backend's) */
    if ((mo.par.tp_size > 1 || ctrl) && !be->ops->comm_init && strcmp(be->ops->name, "cpu"))
        return kiln_errorf(err, "--tp > 1 with --device %s: the backend has no communicator of its own",
                           be->ops->name);
    if (runner_pp_check(be, &mo, err)) return -1;
    if (ctrl && ctrl->rank == 0 && runner_lead_load(ctrl, &mo, ro, err)) return -1;
    /* the device's communicators: the job's (the model's collectives; under
     * pipeline parallel the sends between the stages), and under pipeline
     * parallel with --tp each stage's (its collectives), created alike */
    struct dist_comm *dev_comm = NULL, *dev_stage = NULL;
    if (ctrl && be->ops->comm_init) {
        int pp = mo.par.pp_size > 1, tp = mo.par.tp_size > 1 ? mo.par.tp_size : 1;
        if (device_comm_start(be, ctrl, 0, ctrl->size, pp ? "the sends between pipeline stages" : "the model's collectives",
                              &dev_comm, err))
            return -1;
        if (pp) {
            mo.par.pp_comm = dev_comm;
            if (tp > 1 && device_comm_start(be, ctrl, ctrl->rank / tp * tp, tp, "the stage's collectives", &dev_stage,
                                            err)) {
                device_comm_free(dev_comm);
                return -1;
            }
            mo.par.comm = dev_stage;
        } else if (tp > 1) {
            mo.par.comm = dev_comm;
        }
    }
    /* the checkpoint's copy overlaps the KV pool and the warm-up
     * (KILN_LOAD_OVERLAP=0: load first, for comparisons) */
    mo.defer_weights = !ro->skip_warmup && knob_bool(KNOB_LOAD_OVERLAP);
    size_t free_before = 0, total = 0;
    if (be->ops->mem_info) be->ops->mem_info(be->ctx, &free_before, &total);
    double t0 = time_now();
    struct model *m;
    if (model_load(&m, model_dir, be, &mo, err)) {
        device_comm_free(dev_stage);
        device_comm_free(dev_comm);
        if (be->ops->mem_info && err->code == KILN_ERR_OUT_OF_MEMORY) {
            char msg[sizeof err->msg];
            snprintf(msg, sizeof msg, "%s", err->msg);
            return kiln_errorc(err, KILN_ERR_OUT_OF_MEMORY, "the model does not fit: %s (the device has %.2f GiB, %.2f GiB "
                                    "were free before loading)",
                               msg, GIB(total), GIB(free_before));
        }
        return -1;
    }
    struct runner *r = xcalloc(1, sizeof *r);
    r->own_model = 1;
    r->dev_comm = dev_comm;
    r->dev_stage = dev_stage;
    double t_load = time_now() - t0, t_load0 = t0;
    if (init(r, m, ro, err)) goto fail;
    log_info("load: %.2f GiB of weights and the activations for %d-token batches %s in %.2f s",
             GIB(model_weight_bytes(m)), r->max_batch_tokens,
             model_weights_pending(m) ? "allocated, their copy started" : "loaded", t_load);
    /* the runner's buffers count as activations in the plan, as the model's */
    t0 = time_now();
    if (create_pool(r, ro, free_before, err)) goto fail;
    double t_kv = time_now() - t0;
    t0 = time_now();
    /* the other ranks replay rank 0's warm-up steps in runner_follow */
    if (!ro->skip_warmup && !r->follower && runner_warmup(r, err)) goto fail;
    double t_warm = time_now() - t0;
    t0 = time_now();
    model_weights_ready(m); /* before any request: the copies are done */
    double t_wait = time_now() - t0, t_weights = time_now() - t_load0;
    log_info("start-up: load %.2f s, KV pool %.2f s, warm-up and graphs %.2f s; weights on the "
             "device %.2f s after loading began (%.2f GB/s; %.2f s waited after the warm-up)",
             t_load, t_kv, t_warm, t_weights,
             (double)model_weight_bytes(m) / 1e9 / (t_weights > 0 ? t_weights : 1e-9), t_wait);
    const struct model_config *c = model_config(m);
    long pool_tokens = (long)kv_pool_usable(&r->kv) * r->page_size;
    size_t per_token = kv_pool_page_bytes(r->kv.layout, r->kv.n_layers, 1, r->kv.dtype);
    double kv_bytes = (double)per_token * (double)pool_tokens;
    if (r->kv.swa_window > 0) {
        const struct kv_pool *kv = &r->kv;
        size_t full = kv_pool_token_bytes_part(kv->layout, kv->layer_swa, kv->n_layers, kv->dtype, 0);
        size_t swa = kv_pool_token_bytes_part(kv->layout, kv->layer_swa, kv->n_layers, kv->dtype, 1);
        long swa_tokens = (long)(kv->n_swa_pages - 2) * r->page_size;
        kv_bytes = (double)full * (double)pool_tokens + (double)swa * (double)swa_tokens;
        int n_swa_layers = 0;
        for (int l = 0; l < kv->n_layers; l++) n_swa_layers += kv->layer_swa[l];
        log_info("hybrid KV pool: the %d sliding layers (window %d) keep %ld tokens in pages of their own, the "
                 "%d full layers %ld; a sequence's sliding pages go back as its window leaves them (one pool "
                 "for every layer would hold %.0f tokens)",
                 n_swa_layers, kv->swa_window, swa_tokens, kv->n_layers - n_swa_layers, pool_tokens,
                 kv_bytes / (double)per_token);
    }
    log_info("model %s: %s, %d layers, context %d; KV cache %ld tokens (%s, %.1f MiB, page size %d)",
             model_dir, model_arch_name(c->arch), c->n_layers, r->max_context, pool_tokens,
             dtype_name(r->kv.dtype), kv_bytes / 1048576.0, r->page_size);
    if (r->kv.window > 0) {
        long per_seq = mem_plan_window_tokens(r->kv.window, r->page_size);
        long ctx = r->max_context;
        log_info("sliding window of %d on every layer: the pages before a sequence's window return "
                 "to the pool, so a sequence keeps at most %ld tokens of KV beside its prefill "
                 "chunk; the pool holds %ld sequences at full context (%ld without the window)",
                 r->kv.window, per_seq < ctx ? per_seq : ctx,
                 pool_tokens / (per_seq < ctx ? per_seq : ctx), pool_tokens / ctx);
    }
    if (c->shard.dp_size > 1) /* each group's ranks keep their own requests' KV only */
        log_info("DP attention: %d groups of %d ranks, a KV cache of %ld tokens each: %ld tokens in all",
                 c->shard.dp_size, c->shard.attn_tp_size, pool_tokens, pool_tokens * c->shard.dp_size);
    r->ready = 1;
    *out = r;
    return 0;
fail:
    if (!r->m) model_free(m);
    runner_free(r);
    return -1;
}

void runner_free(struct runner *r) {
    if (!r) return;
    if (r->lead && r->ready) runner_lead_stop(r);
    buf_free(&r->msg);
    ctrl_msg_free(&r->in);
    free(r->rx);
    free(r->f_rows);
    free(r->f_tokens);
    runner_pp_free(r);
    if (r->m) {
        model_weights_ready(r->m); /* no copy may still be writing what is released */
        free_buffers(r);
        kv_pool_free(&r->kv);
        if (r->own_model) model_free(r->m);
    }
    device_comm_free(r->dev_stage);
    device_comm_free(r->dev_comm);
    free(r);
}
