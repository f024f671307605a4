/* route_uniform.h — the random draw of uniform dummy routing (a benchmark
 * tool: model_options.dummy_routing, `--dummy-routing uniform`), shared
 * by the CPU and CUDA route operations so that both choose the same
 * experts to the bit.
 *
 * A token row is keyed by its KV slot and position (device data that
 * changes every token and every step, so a recorded graph draws anew on
 * each replay) and by the layer index. Every routed expert gets a score
 * in [0, 1) from a splitmix64 stream seeded with the row's key; the row
 * takes the top_k largest, which makes its set a uniformly random k-subset
 * of the experts. Scores have 24 bits, exact in a float, so the choice
 * involves no float arithmetic that could differ between devices. */
#ifndef KILN_TENSOR_ROUTE_UNIFORM_H
#define KILN_TENSOR_ROUTE_UNIFORM_H

#include <stdint.h>

#ifdef __CUDACC__
#define ROUTE_UNIFORM_FN static inline __host__ __device__
#else
#define ROUTE_UNIFORM_FN static inline
#endif

#define ROUTE_UNIFORM_GAMMA 0x9e3779b97f4a7c15ull

/* splitmix64's output function */
ROUTE_UNIFORM_FN uint64_t route_uniform_mix(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* The seed of a row's stream. */
ROUTE_UNIFORM_FN uint64_t route_uniform_row(int32_t slot, int32_t pos, int32_t layer) {
    uint64_t k = (uint64_t)(uint32_t)slot | (uint64_t)(uint32_t)pos << 32;
    return route_uniform_mix(route_uniform_mix(k + ROUTE_UNIFORM_GAMMA) ^
                             ((uint64_t)(uint32_t)layer + 1) * 0xd1b54a32d192ed03ull);
}

/* Expert e's score in a row: the row stream's (e + 1)-th value, top 24 bits. */
ROUTE_UNIFORM_FN float route_uniform_score(uint64_t row, int e) {
    uint64_t z = route_uniform_mix(row + (uint64_t)(e + 1) * ROUTE_UNIFORM_GAMMA);
    return (float)(uint32_t)(z >> 40) * (1.0f / 16777216.0f);
}

#endif
