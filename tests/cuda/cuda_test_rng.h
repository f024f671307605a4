/* cuda_test_rng.h — random inputs of the GPU tests: xorshift64, seeded from
 * the clock unless KILN_TEST_SEED is set; the seed is printed, so a failing
 * run can be repeated exactly. */
#ifndef KILN_TESTS_CUDA_TEST_RNG_H
#define KILN_TESTS_CUDA_TEST_RNG_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static uint64_t rng_state;

static inline void rng_seed(const char *test) {
    const char *seed = getenv("KILN_TEST_SEED");
    rng_state = seed ? strtoull(seed, NULL, 0) : (uint64_t)time(NULL) * 2654435761u + 1;
    if (!rng_state) rng_state = 1;
    printf("%s: KILN_TEST_SEED=%llu\n", test, (unsigned long long)rng_state);
}

static inline uint64_t rng_next(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

/* uniform in [-scale, scale) */
static inline float frand(float scale) {
    return ((float)(rng_next() >> 40) / (float)(1ull << 24) * 2.0f - 1.0f) * scale;
}

#endif
