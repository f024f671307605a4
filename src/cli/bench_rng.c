#include "cli/bench_rng.h"

#include <math.h>

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

void bench_rng_init(struct bench_rng *r, uint64_t seed) {
    uint64_t x = seed;
    for (int i = 0; i < 4; i++) r->s[i] = splitmix64(&x);
}

static uint64_t bench_rng_next(struct bench_rng *r) {
    uint64_t *s = r->s;
    uint64_t out = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return out;
}

/* Uniform in [0, 1). */
static double bench_rng_uniform(struct bench_rng *r) { return (double)(bench_rng_next(r) >> 11) * 0x1.0p-53; }

int64_t bench_rng_range(struct bench_rng *r, int64_t lo, int64_t hi) {
    uint64_t span = (uint64_t)(hi - lo) + 1;
    if (span == 0) return (int64_t)bench_rng_next(r); /* the full 64-bit range */
    /* Rejection keeps the draw unbiased for spans that do not divide 2^64. */
    uint64_t limit = UINT64_MAX - UINT64_MAX % span, x;
    do x = bench_rng_next(r);
    while (x >= limit);
    return lo + (int64_t)(x % span);
}

double bench_rng_exponential(struct bench_rng *r, double rate) {
    return -log1p(-bench_rng_uniform(r)) / rate;
}
