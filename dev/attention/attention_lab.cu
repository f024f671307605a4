/* attention_lab.cu — kernel lab for paged causal attention (llm.c dev/cuda
 * style): random paged inputs, a float64 CPU reference, validation of every
 * variant, bitwise batch-invariance checks, and a benchmark that prints
 * achieved TFLOP/s and GB/s next to the limits measured in the same run
 * (a device-to-device copy and a cuBLAS bf16 GEMM).
 *
 * The kernels are the production ones: this file includes
 * src/backend/cuda/cuda_attention.cu and cuda_attn_decode.cu and drives
 * cuda_op_attention through a bare struct cuda_ctx, choosing the variant
 * with ctx.attn_impl and ctx.kv_bf16:
 *   scalar    the first kernel (one block per (token, head))
 *   split     the fp32 split-KV kernel for every row
 *   auto      what kiln runs: tensor-core prefill; decode rows on the bf16
 *             cache take cuda_attn_decode (AD_BN_D128 / AD_BN_D64 positions per warp)
 *   dec32 / dec64  cuda_attn_decode with 32 / 64 positions per warp
 *             (chunks of 128 / 256), called directly (decode-only batches)
 * The cache is fp32 or bf16 per problem (bf16: the host keeps the rounded
 * values, so the reference sees what the GPU sees).
 *
 *   make -C dev attention && dev/build/attention_lab [--quick] [--validate | --bench]
 * (--validate: validation and invariance only; --bench: the benchmark only)
 */
#include "../../src/backend/cuda/cuda_attention.cu"
#include "../../src/backend/cuda/cuda_attn_decode.cu"
#include "../../src/backend/cuda/cuda_attn_prefill.cu"

#include <cublas_v2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <algorithm>
#include <vector>

extern "C" void cuda_fail(const char *expr, const char *what, const char *file, int line) {
    fprintf(stderr, "%s:%d: %s: CUDA error: %s\n", file, line, expr, what);
    abort();
}
extern "C" void cuda_assert_fail(const char *expr, const char *file, int line, const char *msg) {
    fprintf(stderr, "%s:%d: assertion %s failed%s%s\n", file, line, expr, msg ? ": " : "", msg ? msg : "");
    abort();
}

static uint64_t rng = 0x1234567887654321ull;
static uint64_t rnext(void) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return rng;
}
static float frand(void) { return (float)(rnext() >> 40) / (float)(1 << 24) * 2.0f - 1.0f; }

static uint16_t to_bf16(float f) { /* round to nearest even (finite inputs) */
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}
static float from_bf16(uint16_t b) {
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

struct shape {
    const char *name;
    int H, KVH, dk, dv, mla; /* mla: V is the first dv floats of K's row, one KV head */
};

/* One batch: sequences with (context after the step, new tokens). */
struct batch_host {
    int n_seqs, n_tokens, page_size;
    std::vector<int32_t> pos, q_start, page_start, pages;
    long slots;
};

struct problem {
    struct shape sh;
    struct batch_host bh;
    int bf16; /* KV cache element type */
    long k_stride, v_stride, ldq, ldo;
    std::vector<float> q, k, v; /* host copies (bf16-rounded values for a bf16 cache) */
    float *dq, *dout;
    void *dk, *dv_;
    int32_t *dpos, *dqs, *dps, *dpg;
    struct attn_params p;
    struct backend_batch b;
    std::vector<long> ref_rows; /* rows checked against float64, and their reference */
    std::vector<double> ref;
};

static void make_batch(struct batch_host *bh, const int *len, const int *nw, int n, int page_size) {
    bh->n_seqs = n, bh->page_size = page_size, bh->n_tokens = 0;
    int total_pages = 0;
    for (int s = 0; s < n; s++) total_pages += (len[s] + page_size - 1) / page_size;
    int pool = total_pages + 13;
    std::vector<int32_t> perm(pool);
    for (int i = 0; i < pool; i++) perm[i] = i;
    for (int i = pool - 1; i > 0; i--) std::swap(perm[i], perm[rnext() % (uint64_t)(i + 1)]);
    bh->pos.clear(), bh->q_start.clear(), bh->page_start.clear(), bh->pages.clear();
    int pg = 0;
    for (int s = 0; s < n; s++) {
        bh->q_start.push_back(bh->n_tokens);
        bh->page_start.push_back(pg);
        int np = (len[s] + page_size - 1) / page_size;
        for (int i = 0; i < np; i++) bh->pages.push_back(perm[pg + i]);
        pg += np;
        for (int p = len[s] - nw[s]; p < len[s]; p++) bh->pos.push_back(p), bh->n_tokens++;
    }
    bh->q_start.push_back(bh->n_tokens);
    bh->page_start.push_back(pg);
    bh->slots = (long)pool * page_size;
}

template <typename T>
static T *upload(const std::vector<T> &v) {
    T *d;
    CUDA_CHECK(cudaMalloc(&d, v.size() * sizeof(T) + 16));
    CUDA_CHECK(cudaMemcpy(d, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
    return d;
}

/* The cache in its device type (bf16: host values are rounded in place). */
static void *upload_kv(std::vector<float> &v, int bf16) {
    if (!bf16) return upload(v);
    std::vector<uint16_t> b(v.size());
    for (size_t i = 0; i < v.size(); i++) b[i] = to_bf16(v[i]), v[i] = from_bf16(b[i]);
    return upload(b);
}
static void reupload_kv(void *d, const std::vector<float> &v, int bf16) {
    if (!bf16) {
        CUDA_CHECK(cudaMemcpy(d, v.data(), v.size() * 4, cudaMemcpyHostToDevice));
        return;
    }
    std::vector<uint16_t> b(v.size());
    for (size_t i = 0; i < v.size(); i++) b[i] = to_bf16(v[i]);
    CUDA_CHECK(cudaMemcpy(d, b.data(), b.size() * 2, cudaMemcpyHostToDevice));
}

static void problem_init(struct problem *P, struct shape sh, const int *len, const int *nw, int n,
                         int page_size, int bf16) {
    P->sh = sh;
    P->bf16 = bf16;
    make_batch(&P->bh, len, nw, n, page_size);
    int kvh = sh.mla ? 1 : sh.KVH;
    P->k_stride = (long)kvh * sh.dk;
    P->v_stride = sh.mla ? sh.dk : (long)kvh * sh.dv;
    P->ldq = (long)sh.H * sh.dk;
    P->ldo = (long)sh.H * sh.dv;
    long T = P->bh.n_tokens;
    P->q.resize((size_t)(T * P->ldq));
    P->k.resize((size_t)(P->bh.slots * P->k_stride));
    for (auto &x : P->q) x = frand();
    for (auto &x : P->k) x = frand();
    P->dq = upload(P->q);
    P->dk = upload_kv(P->k, bf16);
    if (sh.mla) {
        P->v.clear();
        P->dv_ = P->dk;
    } else {
        P->v.resize((size_t)(P->bh.slots * P->v_stride));
        for (auto &x : P->v) x = frand();
        P->dv_ = upload_kv(P->v, bf16);
    }
    CUDA_CHECK(cudaMalloc(&P->dout, (size_t)(T * P->ldo) * 4));
    P->dpos = upload(P->bh.pos), P->dqs = upload(P->bh.q_start);
    P->dps = upload(P->bh.page_start), P->dpg = upload(P->bh.pages);
    P->p = {sh.H, kvh, sh.dk, sh.dv, P->k_stride, P->v_stride, 1.0f / sqrtf((float)sh.dk)};
    if (sh.mla) P->p.n_kv_heads = 1;
    P->b = {P->bh.n_tokens, P->bh.n_seqs, page_size, P->dpos, P->dqs, P->dps, P->dpg};
    P->ref_rows.clear(), P->ref.clear();
}

static void problem_free(struct problem *P) {
    cudaFree(P->dq), cudaFree(P->dk);
    if (!P->sh.mla) cudaFree(P->dv_);
    cudaFree(P->dout), cudaFree(P->dpos), cudaFree(P->dqs), cudaFree(P->dps), cudaFree(P->dpg);
}

/* float64 reference of one (token, head) */
static void ref_row(const struct problem *P, long t, int h, double *o) {
    const struct batch_host &bh = P->bh;
    int s = 0;
    while (bh.q_start[s + 1] <= t) s++;
    int len = bh.pos[t] + 1, ps = bh.page_size, dk = P->sh.dk, dv = P->sh.dv;
    int g = h / (P->sh.H / P->p.n_kv_heads);
    const float *q = P->q.data() + t * P->ldq + (long)h * dk;
    const float *vb = P->sh.mla ? P->k.data() : P->v.data();
    std::vector<double> sc(len);
    double mx = -1e300;
    for (int i = 0; i < len; i++) {
        long slot = (long)bh.pages[bh.page_start[s] + i / ps] * ps + i % ps;
        const float *k = P->k.data() + slot * P->k_stride + (long)g * dk;
        double d = 0;
        for (int e = 0; e < dk; e++) d += (double)q[e] * k[e];
        sc[i] = d * P->p.scale;
        mx = std::max(mx, sc[i]);
    }
    double sum = 0;
    for (int e = 0; e < dv; e++) o[e] = 0;
    for (int i = 0; i < len; i++) {
        long slot = (long)bh.pages[bh.page_start[s] + i / ps] * ps + i % ps;
        const float *v = vb + slot * P->v_stride + (long)g * dv;
        double w = exp(sc[i] - mx);
        sum += w;
        for (int e = 0; e < dv; e++) o[e] += w * v[e];
    }
    for (int e = 0; e < dv; e++) o[e] /= sum;
}

static struct cuda_ctx make_ctx(long max_context) {
    struct cuda_ctx c;
    memset(&c, 0, sizeof c);
    CUDA_CHECK(cudaStreamCreateWithFlags(&c.stream, cudaStreamNonBlocking));
    cudaDeviceProp prop;
    CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    c.device = 0;
    c.n_sm = prop.multiProcessorCount;
    c.max_context = max_context;
    c.attn.bytes = cuda_attention_scratch_bytes(&c);
    CUDA_CHECK(cudaMalloc(&c.attn.p, c.attn.bytes));
    CUDA_CHECK(cudaMemset(c.attn.p, 0, CUDA_ATTN_COUNTER_BYTES)); /* as reserve does */
    return c;
}

enum { I_SCALAR, I_SPLIT, I_AUTO, I_DEC32, I_DEC64 };
static const char *impl_name(int i) {
    static const char *n[] = {"scalar", "split", "auto", "dec32", "dec64"};
    return n[i];
}

static void run(struct cuda_ctx *c, struct problem *P, int impl) {
    c->kv_bf16 = P->bf16;
    if (impl == I_DEC32 || impl == I_DEC64) {
        ad_dispatch(c, P->dout, DTYPE_F32, P->ldo, P->dq, P->ldq, P->dk, P->dv_, &P->p, &P->b,
                    impl == I_DEC32 ? 32 : 64);
        return;
    }
    c->attn_impl = impl == I_SCALAR ? CUDA_ATTN_SCALAR : impl == I_SPLIT ? CUDA_ATTN_SPLIT : CUDA_ATTN_AUTO;
    cuda_op_attention(c, P->dout, P->ldo, P->dq, P->ldq, P->dk, P->dv_, &P->p, &P->b);
}

/* ‖out − ref‖ / ‖ref‖ and max |out − ref| / max |ref| over sampled rows
 * (all rows when there are few; the reference is computed once per
 * problem); NaN-poisoned output first. */
static int validate(struct cuda_ctx *c, struct problem *P, int impl, double tol) {
    long T = P->bh.n_tokens;
    CUDA_CHECK(cudaMemset(P->dout, 0xff, (size_t)(T * P->ldo) * 4));
    run(c, P, impl);
    CUDA_CHECK(cudaStreamSynchronize(c->stream));
    std::vector<float> out((size_t)(T * P->ldo));
    CUDA_CHECK(cudaMemcpy(out.data(), P->dout, out.size() * 4, cudaMemcpyDeviceToHost));
    int dv = P->sh.dv;
    if (P->ref_rows.empty()) {
        std::vector<long> &rows = P->ref_rows;
        if (T * P->sh.H <= 2048) {
            for (long r = 0; r < T * P->sh.H; r++) rows.push_back(r);
        } else {
            for (int i = 0; i < 256; i++) rows.push_back((long)(rnext() % (uint64_t)(T * P->sh.H)));
            rows.push_back(T * P->sh.H - 1);
            for (int s = 0; s < P->bh.n_seqs; s++) rows.push_back((long)P->bh.q_start[s + 1] * P->sh.H - 1);
        }
        P->ref.resize(rows.size() * dv);
        for (size_t i = 0; i < rows.size(); i++)
            ref_row(P, rows[i] / P->sh.H, (int)(rows[i] % P->sh.H), &P->ref[i * dv]);
    }
    double num = 0, den = 0, maxe = 0, maxr = 0;
    int bad = 0;
    for (size_t i = 0; i < P->ref_rows.size(); i++) {
        long r = P->ref_rows[i], t = r / P->sh.H;
        int h = (int)(r % P->sh.H);
        const double *ref = &P->ref[i * dv];
        const float *o = out.data() + t * P->ldo + (long)h * dv;
        for (int e = 0; e < dv; e++) {
            double d = (double)o[e] - ref[e];
            if (!(fabs(d) < 1e30)) bad = 1;
            num += d * d, den += ref[e] * ref[e];
            maxe = std::max(maxe, fabs(d)), maxr = std::max(maxr, fabs(ref[e]));
        }
    }
    double rel = bad ? INFINITY : sqrt(num / den);
    int ok = rel <= tol;
    printf("  %-8s rel %.2e  max %.2e  (%zu rows, tol %.0e)  %s\n", impl_name(impl), rel, maxe / maxr,
           P->ref_rows.size(), tol, ok ? "ok" : "FAIL");
    return ok;
}

static double time_ms(struct cuda_ctx *c, struct problem *P, int impl, int reps) {
    cudaEvent_t a, b;
    CUDA_CHECK(cudaEventCreate(&a));
    CUDA_CHECK(cudaEventCreate(&b));
    for (int i = 0; i < 3; i++) run(c, P, impl);
    std::vector<float> ts;
    for (int i = 0; i < reps; i++) {
        CUDA_CHECK(cudaEventRecord(a, c->stream));
        run(c, P, impl);
        CUDA_CHECK(cudaEventRecord(b, c->stream));
        CUDA_CHECK(cudaEventSynchronize(b));
        float ms;
        CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
        ts.push_back(ms);
    }
    std::sort(ts.begin(), ts.end());
    cudaEventDestroy(a), cudaEventDestroy(b);
    return ts[ts.size() / 2];
}

/* Per-launch time inside a CUDA graph of 20 launches (as kiln's decode
 * replays them: no launch gaps), and whether the replayed output equals
 * the eager one bitwise (the split path's arrival counters must be zero
 * again after every launch). Returns ms; *same set. */
static double graph_ms(struct cuda_ctx *c, struct problem *P, int impl, int *same) {
    long n = (long)P->bh.n_tokens * P->ldo;
    std::vector<float> eager((size_t)n), replay((size_t)n);
    run(c, P, impl);
    CUDA_CHECK(cudaStreamSynchronize(c->stream));
    CUDA_CHECK(cudaMemcpy(eager.data(), P->dout, (size_t)n * 4, cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemset(P->dout, 0xff, (size_t)n * 4));
    cudaGraph_t g;
    cudaGraphExec_t ge;
    CUDA_CHECK(cudaStreamBeginCapture(c->stream, cudaStreamCaptureModeThreadLocal));
    for (int i = 0; i < 20; i++) run(c, P, impl);
    CUDA_CHECK(cudaStreamEndCapture(c->stream, &g));
    CUDA_CHECK(cudaGraphInstantiate(&ge, g, 0));
    cudaEvent_t a, b;
    CUDA_CHECK(cudaEventCreate(&a));
    CUDA_CHECK(cudaEventCreate(&b));
    CUDA_CHECK(cudaGraphLaunch(ge, c->stream));
    std::vector<float> ts;
    for (int i = 0; i < 7; i++) {
        CUDA_CHECK(cudaEventRecord(a, c->stream));
        CUDA_CHECK(cudaGraphLaunch(ge, c->stream));
        CUDA_CHECK(cudaEventRecord(b, c->stream));
        CUDA_CHECK(cudaEventSynchronize(b));
        float ms;
        CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
        ts.push_back(ms / 20);
    }
    CUDA_CHECK(cudaMemcpy(replay.data(), P->dout, (size_t)n * 4, cudaMemcpyDeviceToHost));
    *same = !memcmp(eager.data(), replay.data(), (size_t)n * 4);
    std::sort(ts.begin(), ts.end());
    cudaGraphExecDestroy(ge), cudaGraphDestroy(g), cudaEventDestroy(a), cudaEventDestroy(b);
    return ts[ts.size() / 2];
}

/* Useful work: causal q·k and p·v products; bytes: q, out (fp32), and
 * every K/V row of the batch once (in the cache's element size). */
static void work(const struct problem *P, double *flop, double *bytes) {
    const struct batch_host &bh = P->bh;
    double ctx_sum = 0, kv_rows = 0;
    for (int t = 0; t < bh.n_tokens; t++) ctx_sum += bh.pos[t] + 1;
    for (int s = 0; s < bh.n_seqs; s++) kv_rows += bh.pos[bh.q_start[s + 1] - 1] + 1;
    *flop = ctx_sum * P->sh.H * 2.0 * (P->sh.dk + P->sh.dv);
    double kv_w = P->sh.mla ? P->sh.dk : (double)P->p.n_kv_heads * (P->sh.dk + P->sh.dv);
    *bytes = kv_rows * kv_w * (P->bf16 ? 2 : 4) + (double)bh.n_tokens * P->sh.H * (P->sh.dk + P->sh.dv) * 4;
}

static double measure_copy_gbs(void) {
    size_t n = (size_t)1 << 30;
    void *a, *b;
    CUDA_CHECK(cudaMalloc(&a, n));
    CUDA_CHECK(cudaMalloc(&b, n));
    CUDA_CHECK(cudaMemset(a, 1, n));
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0), cudaEventCreate(&e1);
    CUDA_CHECK(cudaMemcpy(b, a, n, cudaMemcpyDeviceToDevice));
    std::vector<float> ts;
    for (int i = 0; i < 10; i++) {
        cudaEventRecord(e0);
        CUDA_CHECK(cudaMemcpy(b, a, n, cudaMemcpyDeviceToDevice));
        cudaEventRecord(e1);
        cudaEventSynchronize(e1);
        float ms;
        cudaEventElapsedTime(&ms, e0, e1);
        ts.push_back(ms);
    }
    std::sort(ts.begin(), ts.end());
    cudaFree(a), cudaFree(b);
    return 2.0 * n / (ts[5] * 1e-3) / 1e9;
}

static const struct shape LLAMA = {"llama8b 32/8 d128", 32, 8, 128, 128, 0};
static const struct shape QWEN = {"qwen3 16/8 d128", 16, 8, 128, 128, 0};
static const struct shape D64 = {"gqa 32/8 d64", 32, 8, 64, 64, 0};
static const struct shape MLA = {"mla 16 dk576 dv512", 16, 1, 576, 512, 1};
/* other group sizes for the decode kernel: 1, 6, 8, 12 (two head blocks,
 * the second partial), 16 (two full blocks) */
static const struct shape MHA = {"mha 8/8 d128", 8, 8, 128, 128, 0};
static const struct shape G6 = {"gqa 24/4 d64", 24, 4, 64, 64, 0};
static const struct shape G8 = {"gqa 32/4 d128", 32, 4, 128, 128, 0};
static const struct shape G12 = {"gqa 24/2 d128", 24, 2, 128, 128, 0};
static const struct shape G16 = {"gqa 32/2 d64", 32, 2, 64, 64, 0};

/* Copies sequence si of A (K/V rows and q rows) into sequence sb of B
 * (same length and new tokens) and re-uploads B's q and cache. */
static void embed(struct problem *A, int si, struct problem *B, int sb) {
    int ps = A->bh.page_size, len = A->bh.pos[A->bh.q_start[si + 1] - 1] + 1;
    for (int p = 0; p < len; p++) {
        long sa = (long)A->bh.pages[A->bh.page_start[si] + p / ps] * ps + p % ps;
        long sbb = (long)B->bh.pages[B->bh.page_start[sb] + p / B->bh.page_size] * B->bh.page_size +
                   p % B->bh.page_size;
        memcpy(&B->k[sbb * B->k_stride], &A->k[sa * A->k_stride], A->k_stride * 4);
        if (!A->sh.mla) memcpy(&B->v[sbb * B->v_stride], &A->v[sa * A->v_stride], A->v_stride * 4);
    }
    int n = A->bh.q_start[si + 1] - A->bh.q_start[si];
    for (int r = 0; r < n; r++)
        memcpy(&B->q[(B->bh.q_start[sb] + r) * B->ldq], &A->q[(A->bh.q_start[si] + r) * A->ldq], A->ldq * 4);
}
static void reupload(struct problem *B) {
    CUDA_CHECK(cudaMemcpy(B->dq, B->q.data(), B->q.size() * 4, cudaMemcpyHostToDevice));
    reupload_kv(B->dk, B->k, B->bf16);
    if (!B->sh.mla) reupload_kv(B->dv_, B->v, B->bf16);
}
static std::vector<float> fetch(const struct problem *P) {
    std::vector<float> out((size_t)(P->bh.n_tokens * P->ldo));
    CUDA_CHECK(cudaMemcpy(out.data(), P->dout, out.size() * 4, cudaMemcpyDeviceToHost));
    return out;
}

/* The rows of A's sequences alone, then placed as sequences `at` of
 * batches of nb sequences (other lengths, prompt chunks among them when
 * mixed), and with the chunk-state scratch shrunk (every row unsplit):
 * bitwise the same. */
static int invariance(struct cuda_ctx *c, struct shape sh, int bf16, int impl, const int *la,
                      const int *na, int n, const int *at, const int *nbs, int nnb, int mixed) {
    struct problem A;
    problem_init(&A, sh, la, na, n, 16, bf16);
    run(c, &A, impl);
    CUDA_CHECK(cudaStreamSynchronize(c->stream));
    std::vector<float> alone = fetch(&A);
    long w = (long)sh.H * sh.dv;
    int same = 1;
    char desc[160];
    int dl = snprintf(desc, sizeof desc, "alone");
    for (int bi = 0; bi < nnb; bi++) {
        int nb = nbs[bi];
        std::vector<int> lb(nb), nw(nb);
        for (int i = 0; i < nb; i++) {
            lb[i] = 50 + (int)(rnext() % (nb > 64 ? 300 : 5000));
            nw[i] = mixed && i % 3 == 0 ? 1 + (int)(rnext() % 300) : 1;
            nw[i] = std::min(nw[i], lb[i]);
        }
        for (int i = 0; i < n; i++) lb[at[i]] = la[i], nw[at[i]] = na[i];
        struct problem B;
        problem_init(&B, sh, lb.data(), nw.data(), nb, 16, bf16);
        for (int i = 0; i < n; i++) embed(&A, i, &B, at[i]);
        reupload(&B);
        for (int pass = 0; pass < 2; pass++) {
            size_t keep = c->attn.bytes;
            if (pass) c->attn.bytes = CUDA_ATTN_COUNTER_BYTES + 1024; /* no room for chunk states */
            run(c, &B, impl);
            CUDA_CHECK(cudaStreamSynchronize(c->stream));
            c->attn.bytes = keep;
            std::vector<float> out = fetch(&B);
            for (int i = 0; i < n; i++)
                same &= !memcmp(&out[(size_t)B.bh.q_start[at[i]] * w], &alone[(size_t)A.bh.q_start[i] * w],
                                (size_t)(na[i] * w) * 4);
        }
        dl += snprintf(desc + dl, sizeof desc - dl, " = batch %d (split, unsplit)", nb);
        problem_free(&B);
    }
    printf("  %-20s %-4s %-8s %s: %s\n", sh.name, bf16 ? "bf16" : "fp32", impl_name(impl), desc,
           same ? "bitwise identical" : "DIFFERENT");
    problem_free(&A);
    return same;
}

int main(int argc, char **argv) {
    int quick = 0, do_val = 1, do_bench = 1;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quick")) quick = 1;
        else if (!strcmp(argv[i], "--validate")) do_bench = 0;
        else if (!strcmp(argv[i], "--bench")) do_val = 0;
    }
    setvbuf(stdout, NULL, _IOLBF, 0); /* lines survive an abort */
    cudaDeviceProp prop;
    CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    printf("device: %s, %d SMs\n", prop.name, prop.multiProcessorCount);
    struct cuda_ctx c = make_ctx(16384);
    int fails = 0;

    /* ---- validation: mixed batches (prefill chunks with cached context,
     * decode rows), scattered pages of 1/16/64 slots ---- */
    if (do_val) {
    printf("== validation (rel = ||gpu-ref||/||ref|| vs float64; tensor-core prefill rows round q,k,p,v to bf16)\n");
    int len[] = {300, 1, 2000, 77, 513, 4100, 129}, nw[] = {300, 1, 1, 20, 130, 1, 129};
    int page_sizes[] = {1, 16, 64};
    if (!quick)
        for (const struct shape &sh : {LLAMA, D64, MLA})
            for (int ps : page_sizes) {
                struct problem P;
                problem_init(&P, sh, len, nw, 7, ps, 0);
                printf(" %s fp32 cache, page %d, %d tokens\n", sh.name, ps, P.bh.n_tokens);
                for (int impl : {I_SCALAR, I_SPLIT, I_AUTO}) {
                    bool tc = impl == I_AUTO && !sh.mla;
                    fails += !validate(&c, &P, impl, tc ? 1e-2 : 1e-5);
                }
                problem_free(&P);
            }
    for (const struct shape &sh : {LLAMA, QWEN, D64, MLA})
        for (int ps : page_sizes) {
            struct problem P;
            problem_init(&P, sh, len, nw, 7, ps, 1);
            printf(" %s bf16 cache, page %d, %d tokens (mixed)\n", sh.name, ps, P.bh.n_tokens);
            for (int impl : {I_SPLIT, I_AUTO}) fails += !validate(&c, &P, impl, sh.mla ? 1e-5 : 1e-2);
            problem_free(&P);
        }
    /* decode rows only: fp32-grade on the rounded cache (the decode kernel
     * carries q and p as bf16 hi + lo), contexts 1 .. 4097 around the
     * 64/128/256 boundaries, GQA 1..16 */
    printf("== validation, decode rows on the bf16 cache (tol 1e-5)\n");
    int dlen[] = {1, 2, 33, 64, 65, 127, 128, 129, 255, 256, 257, 1000, 4097}, dnw[13];
    for (int i = 0; i < 13; i++) dnw[i] = 1;
    for (const struct shape &sh : {LLAMA, QWEN, D64, MHA, G6, G8, G12, G16})
        for (int ps : page_sizes) {
            if (ps != 16 && (sh.H == 24 || sh.KVH == 2)) continue;
            struct problem P;
            problem_init(&P, sh, dlen, dnw, 13, ps, 1);
            printf(" %s bf16 cache, page %d, %d decode rows\n", sh.name, ps, P.bh.n_tokens);
            for (int impl : {I_SPLIT, I_DEC32, I_DEC64}) fails += !validate(&c, &P, impl, 1e-5);
            problem_free(&P);
        }
    for (int l : {1, 16384}) { /* one row: every slot busy; the longest context */
        int one[] = {l}, onew[] = {1};
        struct problem P;
        problem_init(&P, LLAMA, one, onew, 1, 1, 1);
        printf(" %s bf16 cache, page 1, one row at context %d\n", LLAMA.name, l);
        for (int impl : {I_AUTO, I_DEC32, I_DEC64}) fails += !validate(&c, &P, impl, 1e-5);
        problem_free(&P);
    }

    /* ---- batch invariance ---- */
    printf("== batch invariance (bitwise)\n");
    {
        /* decode row 3000 + prompt chunk of 200 (mixed batches of 32) */
        int l1[] = {3000, 700}, n1[] = {1, 200}, at[] = {5, 20}, nbs[] = {32};
        fails += !invariance(&c, LLAMA, 0, I_AUTO, l1, n1, 2, at, nbs, 1, 1);
        fails += !invariance(&c, MLA, 0, I_AUTO, l1, n1, 2, at, nbs, 1, 1);
        fails += !invariance(&c, LLAMA, 1, I_AUTO, l1, n1, 2, at, nbs, 1, 1);
        fails += !invariance(&c, MLA, 1, I_AUTO, l1, n1, 2, at, nbs, 1, 1);
        /* decode rows alone (split over many slots), in 32 and 300
         * sequences (few slots / unsplit) */
        int l2[] = {3000, 129, 16384}, n2[] = {1, 1, 1}, at2[] = {7, 3, 1}, nbs2[] = {8, 32, 300};
        for (const struct shape &sh : {LLAMA, QWEN, G12, G16})
            for (int impl : {I_DEC32, I_DEC64})
                fails += !invariance(&c, sh, 1, impl, l2, n2, 3, at2, nbs2, 3, 0);
        fails += !invariance(&c, D64, 1, I_AUTO, l2, n2, 3, at2, nbs2, 3, 0);
    }
    } /* do_val */
    if (!do_bench) {
        printf("%s\n", fails ? "SOME CHECKS FAILED" : "all checks passed");
        return fails ? 1 : 0;
    }

    /* ---- benchmark ---- */
    double gbs = measure_copy_gbs();
    printf("== limits measured now: device copy %.0f GB/s (read+write)\n", gbs);
    printf("== decode benchmark, bf16 cache, page 16 unless p1 (median of 30 launches; graph: per launch in a\n"
           "   20-launch CUDA graph, replay bitwise = eager; GB/s of q/out + K/V read once)\n");
    printf("%-20s %-20s %-8s %9s %9s %9s %9s  %s\n", "shape", "case", "impl", "us", "GB/s", "graph us",
           "GB/s", "replay");
    struct bcase {
        const char *name;
        int n, len, ps; /* len 0: 129 + i % 32 (bench_forward's decode after a 128-token prompt) */
    };
    const struct bcase bl[] = {{"b1 ctx128", 1, 128, 16},        {"b1 ctx4096", 1, 4096, 16},
                               {"b32 ctx4096", 32, 4096, 16},    {"b64 ctx256", 64, 256, 16},
                               {"b256 ctx256", 256, 256, 16},    {"b8 ctx1024", 8, 1024, 16},
                               {"b1 ctx16384", 1, 16384, 16},    {"b128 ctx1024", 128, 1024, 16},
                               {"b64 ctx129-160 p1", 64, 0, 1}, {"b256 ctx129-160 p1", 256, 0, 1}};
    for (const struct shape &sh : {LLAMA, QWEN, D64})
        for (const bcase &bc : bl) {
            if (sh.H == 32 && sh.dk == 64 && bc.n != 32 && bc.n != 1 && bc.n != 256) continue;
            if (quick && bc.n == 128) continue;
            std::vector<int> lens(bc.n, bc.len), nws(bc.n, 1);
            for (int i = 0; i < bc.n; i++)
                if (!bc.len) lens[i] = 129 + i % 32;
            struct problem P;
            problem_init(&P, sh, lens.data(), nws.data(), bc.n, bc.ps, 1);
            double flop, bytes;
            work(&P, &flop, &bytes);
            for (int impl : {I_SPLIT, I_DEC32, I_DEC64}) {
                double ms = time_ms(&c, &P, impl, 30);
                printf("%-20s %-20s %-8s %9.1f %9.0f", sh.name, bc.name, impl_name(impl), ms * 1e3,
                       bytes / ms / 1e6);
                fflush(stdout);
                int same = 0;
                double gms = graph_ms(&c, &P, impl, &same);
                printf(" %9.1f %9.0f  %s\n", gms * 1e3, bytes / gms / 1e6, same ? "same" : "DIFFERENT");
                fails += !same;
            }
            problem_free(&P);
        }
    printf("limits: %.0f GB/s (copy)\n", gbs);
    printf("%s\n", fails ? "SOME CHECKS FAILED" : "all checks passed");
    return fails ? 1 : 0;
}
