/* bench_rng.h — the benchmark's seeded random stream (xoshiro256**, seeded
 * through splitmix64): prompt lengths, token ids, shuffles and Poisson
 * arrival gaps all come from one stream so a --seed reproduces a workload
 * exactly on any machine (the C library's rand() differs between libcs). */
#ifndef KILN_CLI_BENCH_RNG_H
#define KILN_CLI_BENCH_RNG_H

#include <stdint.h>

struct bench_rng {
    uint64_t s[4];
};

void bench_rng_init(struct bench_rng *r, uint64_t seed);
/* Uniform integer in [lo, hi] (hi >= lo). */
int64_t bench_rng_range(struct bench_rng *r, int64_t lo, int64_t hi);
/* Exponential with the given rate (mean 1/rate). */
double bench_rng_exponential(struct bench_rng *r, double rate);

#endif
