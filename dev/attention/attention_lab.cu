/* attention_lab.cu — kernel lab for paged causal attention (llm.c dev/cuda
 * style): random paged inputs, a float64 CPU reference, validation of every
 * variant, a bitwise batch-invariance check, and a benchmark that prints
 * achieved TFLOP/s and GB/s next to the limits measured in the same run
 * (a device-to-device copy and a cuBLAS bf16 GEMM).
 *
 * The kernels are the production ones: this file includes
 * src/backend/cuda/cuda_attention.cu and drives cuda_op_attention through
 * a bare struct cuda_ctx, choosing the variant with ctx.attn_impl:
 *   scalar  the first kernel (one block per (token, head))
 *   split   the fp32 split-KV kernel for every row
 *   auto    tensor-core prefill + split-KV decode (what kiln runs)
 *
 *   make -C dev attention && dev/build/attention_lab [--quick]
 */
#include "../../src/backend/cuda/cuda_attention.cu"

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
    long k_stride, v_stride, ldq, ldo;
    std::vector<float> q, k, v; /* host copies */
    float *dq, *dk, *dv_, *dout;
    int32_t *dpos, *dqs, *dps, *dpg;
    struct attn_params p;
    struct backend_batch b;
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

static void problem_init(struct problem *P, struct shape sh, const int *len, const int *nw, int n,
                         int page_size) {
    P->sh = sh;
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
    P->dk = upload(P->k);
    if (sh.mla) {
        P->v.clear();
        P->dv_ = P->dk;
    } else {
        P->v.resize((size_t)(P->bh.slots * P->v_stride));
        for (auto &x : P->v) x = frand();
        P->dv_ = upload(P->v);
    }
    CUDA_CHECK(cudaMalloc(&P->dout, (size_t)(T * P->ldo) * 4));
    P->dpos = upload(P->bh.pos), P->dqs = upload(P->bh.q_start);
    P->dps = upload(P->bh.page_start), P->dpg = upload(P->bh.pages);
    P->p = {sh.H, kvh, sh.dk, sh.dv, P->k_stride, P->v_stride, 1.0f / sqrtf((float)sh.dk)};
    if (sh.mla) P->p.n_kv_heads = 1;
    P->b = {P->bh.n_tokens, P->bh.n_seqs, page_size, P->dpos, P->dqs, P->dps, P->dpg};
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
    c.n_sm = prop.multiProcessorCount;
    c.max_context = max_context;
    c.attn.bytes = cuda_attention_scratch_bytes(&c);
    CUDA_CHECK(cudaMalloc(&c.attn.p, c.attn.bytes));
    return c;
}

static void run(struct cuda_ctx *c, struct problem *P) {
    cuda_op_attention(c, P->dout, P->ldo, P->dq, P->ldq, P->dk, P->dv_, &P->p, &P->b);
}

/* ‖out − ref‖ / ‖ref‖ and max |out − ref| / max |ref| over sampled rows
 * (all rows when there are few); NaN-poisoned output first. */
static int validate(struct cuda_ctx *c, struct problem *P, const char *variant, double tol) {
    long T = P->bh.n_tokens;
    CUDA_CHECK(cudaMemset(P->dout, 0xff, (size_t)(T * P->ldo) * 4));
    run(c, P);
    CUDA_CHECK(cudaStreamSynchronize(c->stream));
    std::vector<float> out((size_t)(T * P->ldo));
    CUDA_CHECK(cudaMemcpy(out.data(), P->dout, out.size() * 4, cudaMemcpyDeviceToHost));
    std::vector<long> rows;
    if (T * P->sh.H <= 2048) {
        for (long r = 0; r < T * P->sh.H; r++) rows.push_back(r);
    } else {
        for (int i = 0; i < 256; i++) rows.push_back((long)(rnext() % (uint64_t)(T * P->sh.H)));
        rows.push_back(T * P->sh.H - 1);
        for (int s = 0; s < P->bh.n_seqs; s++) rows.push_back((long)P->bh.q_start[s + 1] * P->sh.H - 1);
    }
    std::vector<double> ref(P->sh.dv);
    double num = 0, den = 0, maxe = 0, maxr = 0;
    int bad = 0;
    for (long r : rows) {
        long t = r / P->sh.H;
        int h = (int)(r % P->sh.H);
        ref_row(P, t, h, ref.data());
        const float *o = out.data() + t * P->ldo + (long)h * P->sh.dv;
        for (int e = 0; e < P->sh.dv; e++) {
            double d = (double)o[e] - ref[e];
            if (!(fabs(d) < 1e30)) bad = 1;
            num += d * d, den += ref[e] * ref[e];
            maxe = std::max(maxe, fabs(d)), maxr = std::max(maxr, fabs(ref[e]));
        }
    }
    double rel = bad ? INFINITY : sqrt(num / den);
    int ok = rel <= tol;
    printf("  %-7s rel %.2e  max %.2e  (%zu rows)  %s\n", variant, rel, maxe / maxr, rows.size(),
           ok ? "ok" : "FAIL");
    return ok;
}

static double time_ms(struct cuda_ctx *c, struct problem *P, int reps) {
    cudaEvent_t a, b;
    CUDA_CHECK(cudaEventCreate(&a));
    CUDA_CHECK(cudaEventCreate(&b));
    for (int i = 0; i < 3; i++) run(c, P);
    std::vector<float> ts;
    for (int i = 0; i < reps; i++) {
        CUDA_CHECK(cudaEventRecord(a, c->stream));
        run(c, P);
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

/* Useful work: causal q·k and p·v products; bytes: q, out, and every K/V
 * row of the batch once. */
static void work(const struct problem *P, double *flop, double *bytes) {
    const struct batch_host &bh = P->bh;
    double ctx_sum = 0, kv_rows = 0;
    for (int t = 0; t < bh.n_tokens; t++) ctx_sum += bh.pos[t] + 1;
    for (int s = 0; s < bh.n_seqs; s++) kv_rows += bh.pos[bh.q_start[s + 1] - 1] + 1;
    *flop = ctx_sum * P->sh.H * 2.0 * (P->sh.dk + P->sh.dv);
    double kv_w = P->sh.mla ? P->sh.dk : (double)P->p.n_kv_heads * (P->sh.dk + P->sh.dv);
    *bytes = kv_rows * kv_w * 4 + (double)bh.n_tokens * P->sh.H * (P->sh.dk + P->sh.dv) * 4;
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

static double measure_gemm_tflops(void) {
    int n = 8192;
    cublasHandle_t h;
    if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) return 0;
    std::vector<uint16_t> host((size_t)n * n);
    for (auto &x : host) x = (uint16_t)(0x3c00 + (rnext() & 0x7f)) ^ (rnext() & 0x8000); /* ~±[0.5,1) bf16 */
    void *A, *B, *C;
    CUDA_CHECK(cudaMalloc(&A, (size_t)n * n * 2));
    CUDA_CHECK(cudaMalloc(&B, (size_t)n * n * 2));
    CUDA_CHECK(cudaMalloc(&C, (size_t)n * n * 4));
    CUDA_CHECK(cudaMemcpy(A, host.data(), host.size() * 2, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(B, host.data(), host.size() * 2, cudaMemcpyHostToDevice));
    float al = 1, be = 0;
    auto go = [&]() {
        cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, n, n, n, &al, A, CUDA_R_16BF, n, B, CUDA_R_16BF, n,
                     &be, C, CUDA_R_32F, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    };
    for (int i = 0; i < 3; i++) go();
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0), cudaEventCreate(&e1);
    std::vector<float> ts;
    for (int i = 0; i < 10; i++) {
        cudaEventRecord(e0);
        go();
        cudaEventRecord(e1);
        cudaEventSynchronize(e1);
        float ms;
        cudaEventElapsedTime(&ms, e0, e1);
        ts.push_back(ms);
    }
    std::sort(ts.begin(), ts.end());
    cudaFree(A), cudaFree(B), cudaFree(C);
    cublasDestroy(h);
    return 2.0 * n * n * (double)n / (ts[5] * 1e-3) / 1e12;
}

static const struct shape LLAMA = {"llama8b 32/8 d128", 32, 8, 128, 128, 0};
static const struct shape QWEN = {"qwen3 16/8 d128", 16, 8, 128, 128, 0};
static const struct shape D64 = {"gqa 32/8 d64", 32, 8, 64, 64, 0};
static const struct shape MLA = {"mla 16 dk576 dv512", 16, 1, 576, 512, 1};

static const char *impl_name(int i) { return i == CUDA_ATTN_SCALAR ? "scalar" : i == CUDA_ATTN_SPLIT ? "split" : "auto"; }

int main(int argc, char **argv) {
    int quick = argc > 1 && !strcmp(argv[1], "--quick");
    cudaDeviceProp prop;
    CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    printf("device: %s, %d SMs\n", prop.name, prop.multiProcessorCount);
    struct cuda_ctx c = make_ctx(16384);
    int fails = 0;

    /* ---- validation: mixed batches (prefill chunks with cached context,
     * decode rows), scattered pages of 1/16/64 slots ---- */
    printf("== validation (rel = ||gpu-ref||/||ref|| vs float64; tensor-core rows round q,k,p,v to bf16)\n");
    const struct shape shapes[] = {LLAMA, QWEN, D64, MLA};
    int len[] = {300, 1, 2000, 77, 513, 4100, 129}, nw[] = {300, 1, 1, 20, 130, 1, 129};
    int page_sizes[] = {1, 16, 64};
    for (const struct shape &sh : shapes)
        for (int ps : page_sizes) {
            struct problem P;
            problem_init(&P, sh, len, nw, 7, ps);
            printf(" %s page %d, %d tokens\n", sh.name, ps, P.bh.n_tokens);
            for (int impl : {CUDA_ATTN_SCALAR, CUDA_ATTN_SPLIT, CUDA_ATTN_AUTO}) {
                c.attn_impl = impl;
                bool tc = impl == CUDA_ATTN_AUTO && !sh.mla;
                fails += !validate(&c, &P, impl_name(impl), tc ? 1e-2 : 1e-5);
            }
            problem_free(&P);
        }

    /* ---- batch invariance: the same decode rows alone, in a batch of 32,
     * and with the split scratch shrunk (no split) give the same bits ---- */
    printf("== batch invariance (decode rows and a prefill chunk, bitwise)\n");
    for (const struct shape &sh : {LLAMA, MLA}) {
        c.attn_impl = CUDA_ATTN_AUTO;
        int l1[] = {3000, 700}, n1[] = {1, 200};
        struct problem A;
        problem_init(&A, sh, l1, n1, 2, 16);
        run(&c, &A);
        CUDA_CHECK(cudaStreamSynchronize(c.stream));
        long w = (long)sh.H * sh.dv;
        std::vector<float> alone((size_t)(A.bh.n_tokens * w));
        CUDA_CHECK(cudaMemcpy(alone.data(), A.dout, alone.size() * 4, cudaMemcpyDeviceToHost));
        /* the same K/V and q rows placed as sequences 5 and 20 of 32 */
        int lb[32], nb[32];
        for (int i = 0; i < 32; i++) lb[i] = 50 + (int)(rnext() % 5000), nb[i] = i % 3 ? 1 : 1 + (int)(rnext() % 300);
        for (int i = 0; i < 32; i++) nb[i] = std::min(nb[i], lb[i]);
        lb[5] = 3000, nb[5] = 1, lb[20] = 700, nb[20] = 200;
        struct problem B;
        problem_init(&B, sh, lb, nb, 32, 16);
        /* copy A's K/V rows and q rows into B's pages / rows */
        for (int si = 0; si < 2; si++) {
            int sb = si ? 20 : 5;
            for (int p = 0; p < l1[si]; p++) {
                long sa_slot = (long)A.bh.pages[A.bh.page_start[si] + p / 16] * 16 + p % 16;
                long sb_slot = (long)B.bh.pages[B.bh.page_start[sb] + p / 16] * 16 + p % 16;
                memcpy(&B.k[sb_slot * B.k_stride], &A.k[sa_slot * A.k_stride], A.k_stride * 4);
                if (!sh.mla) memcpy(&B.v[sb_slot * B.v_stride], &A.v[sa_slot * A.v_stride], A.v_stride * 4);
            }
            for (int r = 0; r < n1[si]; r++)
                memcpy(&B.q[(B.bh.q_start[sb] + r) * B.ldq], &A.q[(A.bh.q_start[si] + r) * A.ldq], A.ldq * 4);
        }
        CUDA_CHECK(cudaMemcpy(B.dq, B.q.data(), B.q.size() * 4, cudaMemcpyHostToDevice));
        CUDA_CHECK(cudaMemcpy(B.dk, B.k.data(), B.k.size() * 4, cudaMemcpyHostToDevice));
        if (!sh.mla) CUDA_CHECK(cudaMemcpy(B.dv_, B.v.data(), B.v.size() * 4, cudaMemcpyHostToDevice));
        int same = 1;
        for (int pass = 0; pass < 2; pass++) {
            size_t keep = c.attn.bytes;
            if (pass) c.attn.bytes = 1024; /* no room for chunk states: every row unsplit */
            run(&c, &B);
            CUDA_CHECK(cudaStreamSynchronize(c.stream));
            c.attn.bytes = keep;
            std::vector<float> out((size_t)(B.bh.n_tokens * w));
            CUDA_CHECK(cudaMemcpy(out.data(), B.dout, out.size() * 4, cudaMemcpyDeviceToHost));
            same &= !memcmp(&out[(size_t)B.bh.q_start[5] * w], &alone[0], (size_t)w * 4);
            same &= !memcmp(&out[(size_t)B.bh.q_start[20] * w], &alone[(size_t)w], (size_t)(200 * w) * 4);
        }
        printf("  %-20s alone vs 32-sequence batch (split and unsplit): %s\n", sh.name,
               same ? "bitwise identical" : "DIFFERENT");
        fails += !same;
        problem_free(&A), problem_free(&B);
    }

    /* ---- benchmark ---- */
    double gbs = measure_copy_gbs(), tfl = measure_gemm_tflops();
    printf("== limits measured now: device copy %.0f GB/s (read+write), cuBLAS bf16 GEMM 8192^3 %.0f TFLOP/s\n",
           gbs, tfl);
    printf("== benchmark (median; TFLOP/s of causal products, GB/s of q/out + K/V read once)\n");
    printf("%-22s %-22s %-7s %10s %9s %9s\n", "shape", "case", "impl", "ms", "TFLOP/s", "GB/s");
    struct bcase {
        const char *name;
        int n, len[64], nw[64];
    };
    std::vector<bcase> cases;
    cases.push_back({"prefill 512", 1, {512}, {512}});
    cases.push_back({"prefill 8192", 1, {8192}, {8192}});
    cases.push_back({"decode b1 ctx128", 1, {128}, {1}});
    cases.push_back({"decode b1 ctx4096", 1, {4096}, {1}});
    bcase d32 = {"decode b32 ctx4096", 32, {0}, {0}};
    for (int i = 0; i < 32; i++) d32.len[i] = 4096, d32.nw[i] = 1;
    cases.push_back(d32);
    bcase mix = {"mixed 2k chunk+31 dec", 32, {0}, {0}};
    for (int i = 0; i < 31; i++) mix.len[i] = 1000 + 100 * i, mix.nw[i] = 1;
    mix.len[31] = 4096, mix.nw[31] = 2048;
    cases.push_back(mix);
    for (const struct shape &sh : {LLAMA, QWEN, D64, MLA})
        for (const bcase &bc : cases) {
            if (quick && bc.len[0] == 8192 && sh.H != 32) continue;
            struct problem P;
            problem_init(&P, sh, bc.len, bc.nw, bc.n, 16);
            double flop, bytes;
            work(&P, &flop, &bytes);
            for (int impl : {CUDA_ATTN_SCALAR, CUDA_ATTN_SPLIT, CUDA_ATTN_AUTO}) {
                if (impl == CUDA_ATTN_SPLIT && sh.mla) continue; /* auto is split for MLA */
                c.attn_impl = impl;
                double ms = time_ms(&c, &P, bc.len[0] >= 8192 && impl == CUDA_ATTN_SCALAR ? 3 : 20);
                printf("%-22s %-22s %-7s %10.3f %9.1f %9.0f\n", sh.name, bc.name, impl_name(impl), ms,
                       flop / ms / 1e9, bytes / ms / 1e6);
            }
            problem_free(&P);
        }
    printf("limits: %.0f TFLOP/s (cuBLAS bf16), %.0f GB/s (copy)\n", tfl, gbs);
    printf("%s\n", fails ? "SOME CHECKS FAILED" : "all checks passed");
    return fails ? 1 : 0;
}
