/* cuda_sample.cu — sampling on the GPU (backend_ops.sample): the CPU
 * sampler's semantics (src/sample/sampling.h) over rows of logits that
 * never leave the device; only the token ids are copied back.
 *
 * Two launches, both sized by (n, vocab) alone, so they can be recorded
 * in a graph and a row's token never depends on the other rows:
 *
 *  1. argmax_kernel (n x splits CTAs of 8192 logits): first the row's
 *     grammar mask (a bitmask: cleared tokens -inf), then its
 *     sparse adjustments that fall in the chunk (stop masks, logit_bias,
 *     repetition, frequency / presence; one entry per token), in place,
 *     with the CPU's float operations; then the first index of the largest
 *     non-NaN logit and the smallest finite logit of the chunk.
 *  2. row_kernel (one CTA per row): reduces the chunks in a fixed order;
 *     greedy rows are done. Otherwise it finds the kept set and draws.
 *
 * The kept set. A token's weight argument is x = (l - m) * (1 / T) with
 * the CPU's float operations (__fmul_rn / __fsub_rn: no FMA contraction),
 * so the tests that decide membership are the CPU's, bit for bit: positive
 * weight is x > W_CUT, and min_p is expneg(x) >= min_p with the CPU's own
 * exp polynomial wherever a fast exp cannot settle it (keep_min_p). Both
 * are monotone in the logit, and top_k / top_p keep prefixes in key order
 * (logit desc, id asc): the kept set is always a key prefix, cut at one
 * key Kc, intersected with the min_p test. A key is the 56-bit integer
 * (desc-ordered float bits << 24 | id), so "key order" is integer order.
 * Masses (top_p sums, the draw) use the fast exp (__expf, ~2^-21
 * relative): they weigh tokens, they never decide which are kept except
 * at top_p's boundary, which float sums place only to rounding anyway.
 * (The first version evaluated the polynomial for every token in every
 * pass: ~55 instructions a logit made a 1-row top_k 50 take 122 us.)
 *
 * Finding Kc without sorting the vocabulary: a histogram of count and mass
 * over 2048 bins linear in the logit between the row's top and the
 * smallest logit that still has weight (like the CPU's top_p histogram,
 * linear bins spread a row's bulk so shared-memory atomics rarely
 * collide), then the bin where the running count (top_k) or mass (top_p)
 * reaches its target. If the whole prefix up to that bin has at most 4096
 * tokens, it is compacted into shared memory and sorted (bitonic, by key),
 * and everything after — top_p on top of top_k, min_p, the draw — runs on
 * that list without touching the row again (top_k = 50, or a peaked
 * nucleus: two passes over the row in all). Otherwise only the crossing
 * bin is resolved exactly: compacted if it fits, else refined by a radix
 * select over the key bits (11 bits a pass, stopping as soon as the
 * crossing digit holds <= 4096 tokens), and the draw is one more pass.
 *
 * Masses are 64-bit fixed point (w * 2^S with S = 63 - ceil(log2 vocab),
 * so a row's total cannot overflow and the smallest weight, 2^-40, is
 * still >= 2^5 units): integer atomics are exact and order-independent,
 * so the result is deterministic and batch-invariant. The top_p boundary
 * then differs from the CPU's float/double sums only where the two are
 * within rounding of each other.
 *
 * The draw: u = uniform01(seed, step) exactly as the CPU computes it;
 * target = u * Z; the kept tokens are walked in ascending id order (the
 * CPU walks them in its selection's order: the kept set and the
 * probabilities are the same, the token for a given u may differ). On
 * the list: a block scan. On the row: per-warp tile sums (tiles of >= 512
 * ids), a block scan over the tiles, then one warp scans the crossing tile.
 */
#include "backend/cuda/cuda_pdl.cuh"

enum {
    A_THREADS = 256,
    A_CHUNK = 8192,   /* logits per argmax CTA (multiple of 4) */
    A_MAX_SPLIT = 64,
    B_THREADS = 1024,
    NBINS = 2048,     /* = 2 * B_THREADS: two bins per thread in scans */
    CAP = 4096,       /* = 4 * B_THREADS: shared-memory list of keys */
    KEY_BITS = 56,
    NONE = 0x7fffffff,
};
typedef unsigned long long u64;

/* sampling.c: weights below exp(W_CUT) ~ 2^-40 of the top token's are 0 */
#define W_CUT (-27.7f)
#define TOP_P_SLACK 1e-6
#define FULL_MASK 0xffffffffu

struct sample_partial {
    float v; /* largest non-NaN logit of the chunk */
    int i;   /* its first index, NONE if the chunk is all NaN */
    float mn; /* smallest finite logit (+inf if none) */
    int pad;
};

/* ---- pieces shared with the CPU sampler (bitwise the same) --------------- */

/* sampling.c exp_neg_v, one lane: exp(x) for x <= 0, exactly 0 at or below
 * W_CUT (and for -inf / NaN), exactly 1 at 0. Every operation rounded
 * separately, as the CPU's SSE code does. */
static __device__ __forceinline__ float expneg(float x) {
    bool in = x > W_CUT;
    float xc = in ? x : W_CUT;
    const float magic = 12582912.0f;
    float n = __fsub_rn(__fadd_rn(__fmul_rn(xc, 1.44269504f), magic), magic);
    float f = __fsub_rn(__fsub_rn(xc, __fmul_rn(n, 0.693145752f)), __fmul_rn(n, 1.42860677e-6f));
    float p = 1.0f / 720;
    p = __fadd_rn(__fmul_rn(p, f), 1.0f / 120);
    p = __fadd_rn(__fmul_rn(p, f), 1.0f / 24);
    p = __fadd_rn(__fmul_rn(p, f), 1.0f / 6);
    p = __fadd_rn(__fmul_rn(p, f), 0.5f);
    p = __fadd_rn(__fmul_rn(p, f), 1.0f);
    p = __fadd_rn(__fmul_rn(p, f), 1.0f);
    float r = __fmul_rn(p, __int_as_float(((int)n + 127) << 23));
    return in ? r : 0.0f;
}

/* sampling.c uniform01: SplitMix64 finalisers over seed and step. */
static __device__ __forceinline__ u64 mix64(u64 z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static __device__ __forceinline__ double uniform01(u64 seed, u64 step) {
    u64 h = mix64(seed ^ mix64(step + 0x9e3779b97f4a7c15ULL));
    return (double)(h >> 11) * (1.0 / 9007199254740992.0);
}

/* ---- keys ------------------------------------------------------------------ */

/* (logit desc, id asc) as one integer: smaller key = ranks first. -0 is
 * taken as +0 (the CPU compares them equal, so the id decides). */
static __device__ __forceinline__ u64 key_of(float l, long i) {
    unsigned b = __float_as_uint(l == 0.0f ? 0.0f : l);
    unsigned asc = (b & 0x80000000u) ? ~b : (b | 0x80000000u);
    return ((u64)(~asc) << 24) | (u64)i;
}

static __device__ __forceinline__ float key_logit(u64 k) {
    unsigned asc = ~(unsigned)(k >> 24);
    unsigned b = (asc & 0x80000000u) ? (asc & 0x7fffffffu) : ~asc;
    return __uint_as_float(b);
}

static __device__ __forceinline__ int key_id(u64 k) { return (int)(k & 0xffffff); }

/* ---- element loops ---------------------------------------------------------- */

/* Calls f(x, i) for every i in [0, n) of row (ids offset by base), with
 * 16-byte loads when the row allows, four loads in flight per thread. */
template <class F>
static __device__ __forceinline__ void for_each(const float *row, long n, long base, bool vec, F f) {
    const long T = blockDim.x;
    long done = 0;
    if (vec) {
        const float4 *r4 = (const float4 *)row;
        long n4 = n >> 2, j = threadIdx.x;
        for (; j + 3 * T < n4; j += 4 * T) {
            float4 a = r4[j], b = r4[j + T], c = r4[j + 2 * T], d = r4[j + 3 * T];
            long i = base + 4 * j;
            f(a.x, i), f(a.y, i + 1), f(a.z, i + 2), f(a.w, i + 3);
            i += 4 * T;
            f(b.x, i), f(b.y, i + 1), f(b.z, i + 2), f(b.w, i + 3);
            i += 4 * T;
            f(c.x, i), f(c.y, i + 1), f(c.z, i + 2), f(c.w, i + 3);
            i += 4 * T;
            f(d.x, i), f(d.y, i + 1), f(d.z, i + 2), f(d.w, i + 3);
        }
        for (; j < n4; j += T) {
            float4 a = r4[j];
            long i = base + 4 * j;
            f(a.x, i), f(a.y, i + 1), f(a.z, i + 2), f(a.w, i + 3);
        }
        done = 4 * n4;
    }
    long j = done + threadIdx.x;
    for (; j + 3 * T < n; j += 4 * T) {
        float a = row[j], b = row[j + T], c = row[j + 2 * T], d = row[j + 3 * T];
        f(a, base + j), f(b, base + j + T), f(c, base + j + 2 * T), f(d, base + j + 3 * T);
    }
    for (; j < n; j += T) f(row[j], base + j);
}

/* ---- 1. adjustments ---------------------------------------------------------- */

/* The CPU's operations on one logit (sampler_process_logits after the
 * engine's mask_stops), each rounded as the CPU rounds it. */
static __device__ __forceinline__ float adjusted(float x, const struct backend_sample_adj &a) {
    if (a.flags & BACKEND_ADJ_MASK) x = -INFINITY;
    if (a.flags & BACKEND_ADJ_BIAS) x = __fadd_rn(x, a.bias);
    if (a.flags & BACKEND_ADJ_REP) x = x > 0 ? __fdiv_rn(x, a.rep) : __fmul_rn(x, a.rep);
    if (a.flags & BACKEND_ADJ_SUB) x = __fsub_rn(x, a.sub);
    return x;
}

/* ---- 2. per-chunk argmax --------------------------------------------------- */

/* (v, i) ranks before (bv, bi): larger value, or equal and lower index. */
static __device__ __forceinline__ bool better(float v, int i, float bv, int bi) {
    if (i == NONE) return false;
    if (bi == NONE) return true;
    return v > bv || (v == bv && i < bi);
}

static __device__ __forceinline__ void warp_best(float &v, int &i, float &mn) {
    for (int o = 16; o > 0; o >>= 1) {
        float ov = __shfl_xor_sync(FULL_MASK, v, o), om = __shfl_xor_sync(FULL_MASK, mn, o);
        int oi = __shfl_xor_sync(FULL_MASK, i, o);
        if (better(ov, oi, v, i)) v = ov, i = oi;
        mn = fminf(mn, om);
    }
}

static __global__ void __launch_bounds__(A_THREADS)
argmax_kernel(float *logits, long ld, long vocab, long chunk, bool vec,
              const struct backend_sample_row *rows, const struct backend_sample_adj *adj,
              struct sample_partial *part) {
    pdl_trigger(); /* programmatic dependent launch (cuda_pdl.cuh): wait before any access */
    pdl_wait();
    long r = blockIdx.y, s = blockIdx.x, lo = s * chunk;
    long hi = lo + chunk < vocab ? lo + chunk : vocab;
    /* first the row's grammar mask over this chunk: a token whose bit is
     * clear is -inf before anything else (what adjustments then do to it
     * leaves it -inf) */
    const uint32_t *mask = rows[r].mask;
    if (mask) {
        float *row = logits + r * ld;
        for (long w = lo / 32 + threadIdx.x; w * 32 < hi; w += blockDim.x) {
            uint32_t bits = mask[w];
            if (bits == FULL_MASK) continue;
            long a = w * 32 > lo ? w * 32 : lo, b = w * 32 + 32 < hi ? w * 32 + 32 : hi;
            for (long i = a; i < b; i++)
                if (!(bits >> (i & 31) & 1)) row[i] = -INFINITY;
        }
        __syncthreads();
    }
    /* then the row's adjustments that fall in this chunk (one entry per
     * token, so no two threads touch one logit), in place */
    int start = rows[r].adj_start, na = rows[r].n_adj;
    if (na > 0) {
        float *row = logits + r * ld;
        for (int e = threadIdx.x; e < na; e += blockDim.x) {
            struct backend_sample_adj a = adj[start + e];
            if (a.id >= lo && a.id < hi) row[a.id] = adjusted(row[a.id], a);
        }
        __syncthreads();
    }
    float bv = -INFINITY, mn = INFINITY;
    int bi = NONE;
    if (lo < hi)
        for_each(logits + r * ld + lo, hi - lo, lo, vec, [&](float x, long i) {
            if (x != x) return;
            if (better(x, (int)i, bv, bi)) bv = x, bi = (int)i;
            if (isfinite(x)) mn = fminf(mn, x);
        });
    __shared__ float sv[32], sm[32];
    __shared__ int si[32];
    warp_best(bv, bi, mn);
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    if (lane == 0) sv[w] = bv, si[w] = bi, sm[w] = mn;
    __syncthreads();
    if (w == 0) {
        int nw = blockDim.x >> 5;
        bv = lane < nw ? sv[lane] : -INFINITY;
        bi = lane < nw ? si[lane] : NONE;
        mn = lane < nw ? sm[lane] : INFINITY;
        warp_best(bv, bi, mn);
        if (lane == 0) part[r * gridDim.x + s] = {bv, bi, mn, 0};
    }
}

/* ---- 3. the row kernel ------------------------------------------------------ */

struct row_smem {
    unsigned cnt[NBINS];
    u64 mass[NBINS];
    u64 list[CAP]; /* keys; also the draw's tile sums */
    u64 sa[32], sb[32];
    /* broadcasts */
    float m, fmin;
    int im;
    int x_idx;         /* crossing bin / list index / tile, -1 if none */
    u64 x_c, x_m;      /* count and mass before the crossing (relative to the scan's base) */
    u64 x_incl_m;      /* mass up to and including the crossing list element */
    u64 tot_c, tot_m;
    unsigned n_list;
    int token;
};

/* What a pass looks at: tokens of positive weight, with key <= kc when
 * have_cut, level-0 bin in [blo, bhi], and (key >> s) == q. */
struct region {
    int have_cut;
    u64 kc;
    int blo, bhi;
    int s;
    u64 q;
};

struct rowctx {
    const float *row;
    long V;
    bool vec;
    float m, inv_t, min_p;
    int S;             /* fixed-point scale: mass unit 2^-S */
    float hb, inv_w;   /* level-0 bins: (hb - l) * inv_w */
};

static __device__ __forceinline__ float weight_arg(const rowctx &c, float l) {
    return __fmul_rn(__fsub_rn(l, c.m), c.inv_t);
}

/* A token's mass in fixed point (units of 2^-S of the top token's weight):
 * exp(x) by the fast exp2 unit. The masses only weigh the draw and the
 * top_p sums (relative error ~2^-21, below the CPU's own float sums);
 * which tokens are kept never depends on them: positive weight is the
 * exact test x > W_CUT, and min_p goes through keep_min_p. At least 1 for
 * a token of positive weight. */
static __device__ __forceinline__ u64 mass_of(float x, int S) {
    u64 q = __float2ull_rn(__fmul_rn(__expf(x), __int_as_float((127 + S) << 23)));
    return q ? q : 1;
}

/* The CPU's min_p test, expneg(x) >= min_p, exactly: the fast exp settles
 * it unless it is within 2^-16 of min_p (expneg and __expf are both within
 * 2^-20 of exp), where the exact polynomial decides. */
static __device__ __forceinline__ bool keep_min_p(float x, float min_p) {
    if (!(min_p > 0)) return true;
    float a = __expf(x);
    if (a > min_p * (1.0f + 1.0f / 65536)) return true;
    if (a < min_p * (1.0f - 1.0f / 65536)) return false;
    return expneg(x) >= min_p;
}

static __device__ __forceinline__ int bin_of(const rowctx &c, float l) {
    float t = __fmul_rn(__fsub_rn(c.hb, l), c.inv_w);
    return t < (float)(NBINS - 1) ? (int)t : NBINS - 1;
}

/* Region membership of token i with logit l; x is its weight argument. */
static __device__ __forceinline__ bool member(const rowctx &c, const region &g, float l, long i,
                                              float &x) {
    x = weight_arg(c, l);
    if (!(x > W_CUT)) return false; /* also NaN and -inf */
    if (g.have_cut || g.s < KEY_BITS) {
        u64 key = key_of(l, i);
        if (g.have_cut && key > g.kc) return false;
        if (g.s < KEY_BITS && (key >> g.s) != g.q) return false;
    }
    if (g.blo > 0 || g.bhi < NBINS - 1) {
        int b = bin_of(c, l);
        if (b < g.blo || b > g.bhi) return false;
    }
    return true;
}

/* Exclusive block scan of two u64 values; totals too. Ends synchronized. */
static __device__ void block_excl2(row_smem &sm, u64 a, u64 b, u64 &ea, u64 &eb, u64 &ta, u64 &tb) {
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    u64 ia = a, ib = b;
    for (int o = 1; o < 32; o <<= 1) {
        u64 xa = __shfl_up_sync(FULL_MASK, ia, o), xb = __shfl_up_sync(FULL_MASK, ib, o);
        if (lane >= o) ia += xa, ib += xb;
    }
    if (lane == 31) sm.sa[w] = ia, sm.sb[w] = ib;
    __syncthreads();
    if (w == 0) {
        u64 va = lane < nw ? sm.sa[lane] : 0, vb = lane < nw ? sm.sb[lane] : 0;
        for (int o = 1; o < 32; o <<= 1) {
            u64 xa = __shfl_up_sync(FULL_MASK, va, o), xb = __shfl_up_sync(FULL_MASK, vb, o);
            if (lane >= o) va += xa, vb += xb;
        }
        sm.sa[lane] = va, sm.sb[lane] = vb;
    }
    __syncthreads();
    u64 oa = w ? sm.sa[w - 1] : 0, ob = w ? sm.sb[w - 1] : 0;
    ea = oa + ia - a, eb = ob + ib - b;
    ta = sm.sa[nw - 1], tb = sm.sb[nw - 1];
    __syncthreads();
}

static __device__ void clear_bins(row_smem &sm) {
    for (int b = threadIdx.x; b < NBINS; b += blockDim.x) sm.cnt[b] = 0, sm.mass[b] = 0;
    __syncthreads();
}

/* Histogram of the region's count (and mass, when need_mass): by level-0
 * bin (shift < 0) or by the key digit (key >> shift) & (2^width - 1). */
static __device__ void histogram(row_smem &sm, const rowctx &c, const region &g, int shift, int width,
                                 bool need_mass) {
    clear_bins(sm);
    u64 mask = (1ull << width) - 1;
    for_each(c.row, c.V, 0, c.vec, [&](float l, long i) {
        float x;
        if (!member(c, g, l, i, x)) return;
        int b = shift < 0 ? bin_of(c, l) : (int)((key_of(l, i) >> shift) & mask);
        atomicAdd(&sm.cnt[b], 1u);
        if (need_mass) atomicAdd(&sm.mass[b], mass_of(x, c.S));
    });
    __syncthreads();
}

/* The bin where the running count (by_mass false) or mass, starting at
 * `base`, first reaches target: sm.x_idx (-1 if never), and the count and
 * mass of the bins before it in sm.x_c / sm.x_m; totals in sm.tot_*. */
static __device__ void find_bin(row_smem &sm, bool by_mass, u64 target, u64 base) {
    int t = threadIdx.x;
    if (t == 0) sm.x_idx = -1;
    u64 c0 = sm.cnt[2 * t], c1 = sm.cnt[2 * t + 1], m0 = sm.mass[2 * t], m1 = sm.mass[2 * t + 1];
    u64 ec, em, tc, tm;
    block_excl2(sm, c0 + c1, m0 + m1, ec, em, tc, tm);
    u64 v0 = by_mass ? m0 : c0, v1 = by_mass ? m1 : c1, before = base + (by_mass ? em : ec);
    if (before < target && before + v0 >= target) sm.x_idx = 2 * t, sm.x_c = ec, sm.x_m = em;
    else if (before + v0 < target && before + v0 + v1 >= target)
        sm.x_idx = 2 * t + 1, sm.x_c = ec + c0, sm.x_m = em + m0;
    if (t == 0) sm.tot_c = tc, sm.tot_m = tm;
    __syncthreads();
}

/* Region members into sm.list (unordered); returns how many (<= CAP). */
static __device__ int compact(row_smem &sm, const rowctx &c, const region &g) {
    if (threadIdx.x == 0) sm.n_list = 0;
    __syncthreads();
    for_each(c.row, c.V, 0, c.vec, [&](float l, long i) {
        float x;
        if (!member(c, g, l, i, x)) return;
        unsigned at = atomicAdd(&sm.n_list, 1u);
        if (at < CAP) sm.list[at] = key_of(l, i);
    });
    __syncthreads();
    return sm.n_list < CAP ? (int)sm.n_list : CAP;
}

/* Sorts sm.list[0, n) ascending by key, or by id. */
static __device__ void sort_list(row_smem &sm, int n, bool by_id) {
    int np = 2;
    while (np < n) np <<= 1;
    for (int i = n + threadIdx.x; i < np; i += blockDim.x) sm.list[i] = ~0ull;
    __syncthreads();
    for (int k = 2; k <= np; k <<= 1)
        for (int j = k >> 1; j > 0; j >>= 1) {
            for (int t = threadIdx.x; t < np / 2; t += blockDim.x) {
                int i = 2 * j * (t / j) + (t % j), p = i + j;
                u64 x = sm.list[i], y = sm.list[p];
                u64 kx = by_id ? (x & 0xffffff) | (x == ~0ull ? 1ull << 40 : 0) : x;
                u64 ky = by_id ? (y & 0xffffff) | (y == ~0ull ? 1ull << 40 : 0) : y;
                if ((kx > ky) == ((i & k) == 0)) sm.list[i] = y, sm.list[p] = x;
            }
            __syncthreads();
        }
}

/* Over sm.list[0, n) in order: each element counts 1 (by_mass false) or
 * its fixed-point weight (0 below min_p when min_p > 0); finds the first
 * index where base + the running metric reaches target: sm.x_idx (-1 if
 * never) and sm.x_incl_m, the base mass plus the masses up to it. */
static __device__ void find_in_list(row_smem &sm, const rowctx &c, int n, bool by_mass, float min_p,
                                    u64 target, u64 base_c, u64 base_m) {
    int t = threadIdx.x;
    if (t == 0) sm.x_idx = -1;
    u64 mc[4], mm[4], sc = 0, sms = 0;
#pragma unroll
    for (int j = 0; j < 4; j++) {
        int i = 4 * t + j;
        mc[j] = mm[j] = 0;
        if (i < n) {
            float x = weight_arg(c, key_logit(sm.list[i])); /* > W_CUT: listed tokens have weight */
            mm[j] = keep_min_p(x, min_p) ? mass_of(x, c.S) : 0;
            mc[j] = 1;
        }
        sc += mc[j], sms += mm[j];
    }
    u64 ec, em, tc, tm;
    block_excl2(sm, sc, sms, ec, em, tc, tm);
    u64 cc = base_c + ec, cm = base_m + em;
#pragma unroll
    for (int j = 0; j < 4; j++) {
        u64 before = by_mass ? cm : cc, v = by_mass ? mm[j] : mc[j];
        if (v && before < target && before + v >= target) sm.x_idx = 4 * t + j, sm.x_incl_m = cm + mm[j];
        cc += mc[j], cm += mm[j];
    }
    if (t == 0) sm.tot_c = tc, sm.tot_m = tm;
    __syncthreads();
}

/* The result of a selection: keys <= kc are kept. With list_full, the
 * kept prefix itself is sm.list[0, n_list), sorted by key. */
struct cut {
    int have;
    u64 kc;
    u64 mass; /* of the kept prefix */
    int list_full, n_list;
};

/* Selects the key prefix of region g whose count reaches target (by_mass
 * false) or whose mass reaches it, from the level-0 histogram already in
 * sm (built over g). The prefix's mass (cut.mass) is only right when the
 * histogram has masses and need_mass is set (refinement keeps them). */
static __device__ cut select_prefix(row_smem &sm, const rowctx &c, region g, bool by_mass, u64 target,
                                    bool need_mass) {
    cut r = {0, 0, 0, 0, 0};
    find_bin(sm, by_mass, target, 0);
    int k0 = sm.x_idx;
    if (k0 < 0) { /* never reached (mass rounding at top_p ~ 1): keep everything */
        r.mass = sm.tot_m;
        return r;
    }
    u64 bc = sm.x_c, bm = sm.x_m, in_bin = sm.cnt[k0];
    if (bc + in_bin <= CAP) {
        /* the whole prefix fits: sort it and keep it */
        region p = g;
        p.blo = 0, p.bhi = k0;
        int n = compact(sm, c, p);
        sort_list(sm, n, false);
        find_in_list(sm, c, n, by_mass, 0.0f, target, 0, 0);
        int idx = sm.x_idx;
        if (idx < 0) idx = n - 1; /* cannot happen: the histogram said so */
        r.have = 1, r.kc = sm.list[idx], r.mass = sm.x_incl_m, r.list_full = 1, r.n_list = idx + 1;
        __syncthreads();
        return r;
    }
    /* only the crossing bin, refined over the key bits until it fits */
    region q = g;
    q.blo = q.bhi = k0;
    for (;;) {
        if (in_bin <= CAP) {
            int n = compact(sm, c, q);
            sort_list(sm, n, false);
            find_in_list(sm, c, n, by_mass, 0.0f, target, bc, bm);
            int idx = sm.x_idx;
            if (idx < 0) idx = n - 1;
            r.have = 1, r.kc = sm.list[idx], r.mass = sm.x_incl_m;
            __syncthreads();
            return r;
        }
        int shift = q.s > 11 ? q.s - 11 : 0, width = q.s - shift;
        histogram(sm, c, q, shift, width, need_mass);
        find_bin(sm, by_mass, target, by_mass ? bm : bc);
        int d = sm.x_idx;
        if (d < 0) { /* cannot happen: the bin holds the crossing */
            r.mass = bm + sm.tot_m;
            return r;
        }
        bc += sm.x_c, bm += sm.x_m, in_bin = sm.cnt[d];
        q.q = (q.s < KEY_BITS ? q.q << width : 0) | (u64)d;
        q.s = shift;
        __syncthreads();
    }
}

/* Level-0 bins for region g: linear in the logit from the top (m) down to
 * lo, the lowest logit that can still matter. */
static __device__ void set_bins(rowctx &c, float lo) {
    c.hb = c.m;
    float width = __fsub_rn(c.m, lo);
    c.inv_w = width > 0 && isfinite(width) ? (float)NBINS / width : 0.0f;
}

/* Logits i..i+3 of the row (NaN past hi: never kept); 16 bytes at once
 * where the row allows (i is a multiple of 4 then; ld, a multiple of 4,
 * keeps the read inside the row). */
static __device__ __forceinline__ float4 load4(const rowctx &c, long i, long hi) {
    if (c.vec && i < hi) {
        float4 v = *(const float4 *)(c.row + i);
        if (i + 3 >= hi) {
            if (i + 1 >= hi) v.y = NAN;
            if (i + 2 >= hi) v.z = NAN;
            v.w = NAN;
        }
        return v;
    }
    float4 v;
    v.x = i < hi ? c.row[i] : NAN;
    v.y = i + 1 < hi ? c.row[i + 1] : NAN;
    v.z = i + 2 < hi ? c.row[i + 2] : NAN;
    v.w = i + 3 < hi ? c.row[i + 3] : NAN;
    return v;
}

/* Kept mass of tokens i..i+3 (kept: member of g and min_p); each in m4
 * when given. */
static __device__ __forceinline__ u64 quad_mass(const rowctx &c, const region &g, float4 v, long i,
                                                u64 *m4) {
    float l[4] = {v.x, v.y, v.z, v.w};
    u64 s = 0;
#pragma unroll
    for (int j = 0; j < 4; j++) {
        float x;
        u64 q = member(c, g, l[j], i + j, x) && keep_min_p(x, c.min_p) ? mass_of(x, c.S) : 0;
        if (m4) m4[j] = q;
        s += q;
    }
    return s;
}

static __global__ void __launch_bounds__(B_THREADS, 1)
row_kernel(int32_t *tokens, const float *logits, long ld, long vocab, bool vec,
           const struct backend_sample_row *rows, const struct sample_partial *part, int nsplit,
           unsigned char *kept_out) {
    extern __shared__ __align__(16) unsigned char smem_raw[];
    row_smem &sm = *(row_smem *)smem_raw;
    pdl_trigger(); /* as argmax_kernel */
    pdl_wait();
    long r = blockIdx.x;
    int t = threadIdx.x;
    if (t < 32) {
        float bv = -INFINITY, mn = INFINITY;
        int bi = NONE;
        for (int j = t; j < nsplit; j += 32) {
            struct sample_partial p = part[r * nsplit + j];
            if (better(p.v, p.i, bv, bi)) bv = p.v, bi = p.i;
            mn = fminf(mn, p.mn);
        }
        warp_best(bv, bi, mn);
        if (t == 0) sm.m = bv, sm.im = bi, sm.fmin = mn;
    }
    __syncthreads();
    const struct backend_sample_row P = rows[r];
    float m = sm.m, temp = P.temperature;
    int im = sm.im;
    unsigned char *kept = kept_out ? kept_out + r * vocab : NULL;
    bool greedy = !(temp > 0) || P.top_k == 1 || !(P.top_p > 0) || im == NONE || !isfinite(m);
    if (greedy) {
        int tok = im == NONE ? 0 : im;
        if (t == 0) tokens[r] = tok;
        if (kept)
            for (long i = t; i < vocab; i += blockDim.x) kept[i] = i == tok;
        return;
    }
    rowctx c;
    c.row = logits + r * ld;
    c.V = vocab;
    c.vec = vec;
    c.m = m;
    c.inv_t = __fdiv_rn(1.0f, temp);
    c.min_p = P.min_p > 0 ? P.min_p : 0.0f;
    int bits = vocab > 1 ? 64 - __clzll((long long)(vocab - 1)) : 0;
    c.S = 63 - bits > 62 ? 62 : 63 - bits;
    set_bins(c, fmaxf(sm.fmin, __fadd_rn(m, __fdiv_rn(W_CUT, c.inv_t))));
    bool use_k = P.top_k > 0 && P.top_k < vocab, use_p = P.top_p < 1.0f;
    region all = {0, 0, 0, NBINS - 1, KEY_BITS, 0};
    cut k = {0, 0, 0, 0, 0};

    if (use_k || use_p) {
        /* masses only where top_p will weigh them */
        histogram(sm, c, all, -1, 0, use_p);
        find_bin(sm, false, ~0ull, 0); /* totals only */
        u64 n_pos = sm.tot_c, z = sm.tot_m;
        k.mass = z;
        if (use_k && n_pos > (u64)P.top_k) k = select_prefix(sm, c, all, false, (u64)P.top_k, use_p);
        if (use_p && k.mass > 0) {
            double need_d = ((double)P.top_p - TOP_P_SLACK) * (double)k.mass;
            bool by_mass = need_d > 0;
            u64 target = 1;
            if (by_mass) {
                double cd = ceil(need_d);
                target = cd >= (double)k.mass ? k.mass : (u64)cd;
                if (target == 0) target = 1;
            }
            if (k.list_full) {
                find_in_list(sm, c, k.n_list, by_mass, 0.0f, target, 0, 0);
                int idx = sm.x_idx < 0 ? k.n_list - 1 : sm.x_idx;
                k.kc = sm.list[idx], k.n_list = idx + 1, k.have = 1;
                __syncthreads();
            } else {
                region g = all;
                if (k.have) { /* a top_k cut too large for the list: new bins below it */
                    g.have_cut = 1, g.kc = k.kc;
                    set_bins(c, key_logit(k.kc));
                    histogram(sm, c, g, -1, 0, true);
                }
                cut p = select_prefix(sm, c, g, by_mass, target, true);
                if (p.have || !k.have) k = p;
            }
        }
    }

    /* ---- the draw ---- */
    double u = uniform01(P.seed, P.step);
    if (k.list_full) {
        int n = k.n_list;
        sort_list(sm, n, true);
        find_in_list(sm, c, n, true, c.min_p, ~0ull, 0, 0); /* totals: Z */
        u64 Z = sm.tot_m;
        int tok = im;
        if (Z > 0) {
            u64 target = (u64)(u * (double)Z);
            if (target >= Z) target = Z - 1;
            find_in_list(sm, c, n, true, c.min_p, target + 1, 0, 0);
            if (sm.x_idx >= 0) tok = key_id(sm.list[sm.x_idx]);
        }
        if (t == 0) tokens[r] = tok;
        if (kept) {
            for (long i = t; i < vocab; i += blockDim.x) kept[i] = 0;
            __syncthreads();
            for (int i = t; i < n; i += blockDim.x)
                if (keep_min_p(weight_arg(c, key_logit(sm.list[i])), c.min_p)) kept[key_id(sm.list[i])] = 1;
        }
        return;
    }

    /* On the row: kept = positive weight, key <= kc, min_p. Tiles of ts ids
     * (a multiple of 512, at most 1024 tiles), one warp per tile, each lane
     * four consecutive ids per load (16 bytes where the row allows). */
    region g = all;
    g.have_cut = k.have, g.kc = k.kc;
    long ts = 512 * ((vocab + 512L * 1024 - 1) / (512L * 1024));
    int n_tiles = (int)((vocab + ts - 1) / ts);
    int lane = t & 31, warp = t >> 5;
    for (int tile = warp; tile < n_tiles; tile += blockDim.x >> 5) {
        long lo = tile * ts, hi = lo + ts < vocab ? lo + ts : vocab;
        u64 s = 0;
        for (long i = lo + 4 * lane; i < hi; i += 512) { /* four 4-wide loads in flight */
            float4 x[4];
#pragma unroll
            for (int j = 0; j < 4; j++) x[j] = load4(c, i + 128 * j, hi);
#pragma unroll
            for (int j = 0; j < 4; j++) s += quad_mass(c, g, x[j], i + 128 * j, NULL);
        }
        for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(FULL_MASK, s, o);
        if (lane == 0) sm.list[tile] = s;
    }
    __syncthreads();
    u64 v = t < n_tiles ? sm.list[t] : 0, ev, ez, Z, dummy;
    block_excl2(sm, v, 0, ev, ez, Z, dummy);
    if (t == 0) sm.token = im, sm.x_idx = -1;
    __syncthreads();
    u64 target = 0;
    if (Z > 0) {
        target = (u64)(u * (double)Z);
        if (target >= Z) target = Z - 1;
        if (t < n_tiles && ev <= target && target < ev + v) sm.x_idx = t, sm.x_c = ev;
    }
    __syncthreads();
    if (Z > 0 && warp == 0 && sm.x_idx >= 0) {
        /* the crossing tile, 128 ids at a time: lane sums, a warp scan, then
         * the crossing lane walks its four */
        long lo = sm.x_idx * ts, hi = lo + ts < vocab ? lo + ts : vocab;
        u64 base = sm.x_c;
        for (long c0 = lo; c0 < hi; c0 += 128) {
            long i = c0 + 4 * lane;
            u64 m4[4];
            u64 ls = quad_mass(c, g, load4(c, i, hi), i, m4);
            u64 incl = ls;
            for (int o = 1; o < 32; o <<= 1) {
                u64 y = __shfl_up_sync(FULL_MASK, incl, o);
                if (lane >= o) incl += y;
            }
            unsigned hit = __ballot_sync(FULL_MASK, ls > 0 && base + incl > target);
            if (hit) {
                if (lane == __ffs(hit) - 1) {
                    u64 cum = base + incl - ls;
                    int j = 0;
                    for (; j < 3; j++) {
                        cum += m4[j];
                        if (m4[j] && cum > target) break;
                    }
                    sm.token = (int)(i + j);
                }
                break;
            }
            base += __shfl_sync(FULL_MASK, incl, 31);
        }
    }
    __syncthreads();
    if (t == 0) tokens[r] = sm.token;
    if (kept)
        for_each(c.row, vocab, 0, false, [&](float l, long i) {
            float x;
            kept[i] = member(c, g, l, i, x) && keep_min_p(x, c.min_p);
        });
}

/* ---- entry points ------------------------------------------------------------ */

/* Chunk length and count of the argmax pass for a vocabulary. */
static long argmax_chunk(long vocab, int *nsplit) {
    long chunk = A_CHUNK;
    if ((vocab + chunk - 1) / chunk > A_MAX_SPLIT) chunk = ((vocab + A_MAX_SPLIT - 1) / A_MAX_SPLIT + 3) & ~3L;
    *nsplit = (int)((vocab + chunk - 1) / chunk);
    return chunk;
}

extern "C" size_t cuda_sample_scratch_bytes(long rows) {
    return (size_t)(rows > 0 ? rows : 1) * A_MAX_SPLIT * sizeof(struct sample_partial);
}

extern "C" int cuda_sample_reserve(struct cuda_ctx *c) {
    /* the partials for max_tokens rows at the most splits any vocabulary
     * takes: sized once here, so no sampling call grows scratch (which
     * would make recorded graphs stale) */
    long rows = c->max_tokens > 0 ? c->max_tokens : 1;
    return cuda_scratch_reserve(c, &c->sample_part,
                                (size_t)rows * A_MAX_SPLIT * sizeof(struct sample_partial), rows);
}

static void sample_run(void *ctx, int32_t *tokens, float *logits, long ld, long n, long vocab,
                       const struct backend_sample_row *rows, const struct backend_sample_adj *adj,
                       unsigned char *kept) {
    struct cuda_ctx *c = (struct cuda_ctx *)ctx;
    if (n <= 0) return;
    CUDA_ASSERT_MSG(vocab > 0 && vocab < (1 << 24), "sample: vocab must be below 2^24");
    int nsplit;
    long chunk = argmax_chunk(vocab, &nsplit);
    long max_rows = n > c->max_tokens ? n : c->max_tokens;
    size_t part_bytes = (size_t)max_rows * nsplit * sizeof(struct sample_partial);
    if (cuda_scratch_reserve(c, &c->sample_part, part_bytes, max_rows)) return;
    if (!c->sample_ready) {
        CUDA_CHECK(cudaFuncSetAttribute(row_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        (int)sizeof(row_smem)));
        c->sample_ready = 1;
    }
    bool vec = ld % 4 == 0 && ((uintptr_t)logits & 15) == 0;
    struct sample_partial *part = (struct sample_partial *)c->sample_part.p;
    /* programmatic dependent launch (cuda_pdl.cuh): argmax overlaps the
     * lm_head's tail, the row kernel argmax's */
    pdl_launch(c, argmax_kernel, dim3((unsigned)nsplit, (unsigned)n), dim3(A_THREADS), 0, logits,
               ld, vocab, chunk, vec, rows, adj, part);
    pdl_launch(c, row_kernel, dim3((unsigned)n), dim3(B_THREADS), sizeof(row_smem), tokens,
               (const float *)logits, ld, vocab, vec, rows, (const struct sample_partial *)part,
               nsplit, kept);
}

extern "C" void cuda_op_sample(void *ctx, int32_t *tokens, float *logits, long ld, long n, long vocab,
                               const struct backend_sample_row *rows,
                               const struct backend_sample_adj *adj) {
    sample_run(ctx, tokens, logits, ld, n, vocab, rows, adj, NULL);
}

extern "C" void cuda_sample_kept(void *ctx, unsigned char *kept, int32_t *tokens, float *logits,
                                 long ld, long n, long vocab, const struct backend_sample_row *rows,
                                 const struct backend_sample_adj *adj) {
    sample_run(ctx, tokens, logits, ld, n, vocab, rows, adj, kept);
}
