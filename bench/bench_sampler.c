/* bench_sampler.c — CPU sampler cost per sampled token, greedy and the five
 * random configurations of the start-up warm-up, on one row of logits.
 *
 *   bench_sampler [--vocab 151936] [--iters 500] [--flat]
 *
 * Logits are model-like by default: a normal(0, 2.5) bulk with 8 tokens at
 * 16..20.9 (a trained model's top logit sits ~15-25 above the bulk), so the
 * nucleus is small; --flat keeps just the normal bulk (a nucleus of tens of
 * thousands of tokens: the hard case for top_p and for plain sampling). The row
 * is restored before each call (the sampler may change it); the copy is
 * timed separately and subtracted.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/mem.h"
#include "sample/sampling.h"

static uint64_t rng_next(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static double rng_unit(uint64_t *s) { return ((double)(rng_next(s) >> 11) + 0.5) / 9007199254740992.0; }

int main(int argc, char **argv) {
    int vocab = 151936, iters = 500, flat = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--vocab") && i + 1 < argc) vocab = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--iters") && i + 1 < argc) iters = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--flat")) flat = 1;
        else {
            fprintf(stderr, "usage: bench_sampler [--vocab N] [--iters N] [--flat]\n");
            return 2;
        }
    }
    if (vocab < 1 || iters < 1) return 2;
    float *pristine = xmalloc((size_t)vocab * sizeof(float));
    float *row = xmalloc((size_t)vocab * sizeof(float));
    float *scratch = xmalloc(2 * (size_t)vocab * sizeof(float));
    uint64_t rs = 42;
    for (int i = 0; i < vocab; i++) {
        double u1 = rng_unit(&rs), u2 = rng_unit(&rs);
        pristine[i] = (float)(2.5 * sqrt(-2 * log(u1)) * cos(6.283185307179586 * u2));
    }
    if (!flat)
        for (int j = 0; j < 8; j++) pristine[rng_next(&rs) % (uint64_t)vocab] = 16.0f + (float)j * 0.7f;
    int32_t prompt[256];
    for (int i = 0; i < 256; i++) prompt[i] = (int32_t)(rng_next(&rs) % (uint64_t)vocab);
    struct sampler_state *st = sampler_state_create(vocab, prompt, 256);
    for (int i = 0; i < 64; i++) sampler_state_accept(st, (int32_t)(rng_next(&rs) % (uint64_t)vocab));

    struct {
        const char *name;
        struct sampling_params p;
    } cfg[8];
    int n = 0;
    for (int i = 0; i < 8; i++) sampling_params_default(&cfg[i].p);
    cfg[n].name = "greedy", cfg[n++].p.temperature = 0;
    cfg[n].name = "t=0.7 p=0.9", cfg[n].p.temperature = 0.7f, cfg[n++].p.top_p = 0.9f;
    cfg[n].name = "t=1.0 k=50", cfg[n].p.temperature = 1.0f, cfg[n++].p.top_k = 50;
    cfg[n].name = "t=0.8 p=0.95 k=40", cfg[n].p.temperature = 0.8f, cfg[n].p.top_p = 0.95f;
    cfg[n++].p.top_k = 40;
    cfg[n].name = "t=1.2 min_p=0.05", cfg[n].p.temperature = 1.2f, cfg[n++].p.min_p = 0.05f;
    cfg[n].name = "t=0.6 p=0.8 k=20 rep=1.1", cfg[n].p.temperature = 0.6f, cfg[n].p.top_p = 0.8f;
    cfg[n].p.top_k = 20, cfg[n++].p.repetition_penalty = 1.1f;
    cfg[n].name = "t=1.0 (no truncation)", cfg[n++].p.temperature = 1.0f;
    cfg[n].name = "greedy + logprobs top 5", cfg[n].p.temperature = 0, cfg[n].p.logprobs = 1;
    cfg[n++].p.top_logprobs = 5;

    double t0 = time_now();
    for (int it = 0; it < iters; it++) memcpy(row, pristine, (size_t)vocab * sizeof(float));
    double copy_us = (time_now() - t0) / iters * 1e6;
    printf("vocab %d, %s logits, %d iterations; row copy %.1f us (subtracted)\n", vocab,
           flat ? "flat" : "model-like", iters, copy_us);
    struct sample_result res;
    for (int c = 0; c < n; c++) {
        int32_t sink = 0;
        for (int it = 0; it < 5; it++) { /* warm caches */
            memcpy(row, pristine, (size_t)vocab * sizeof(float));
            sampler_sample(&cfg[c].p, st, row, vocab, (uint64_t)it, scratch, &res);
        }
        t0 = time_now();
        for (int it = 0; it < iters; it++) {
            memcpy(row, pristine, (size_t)vocab * sizeof(float));
            sampler_sample(&cfg[c].p, st, row, vocab, (uint64_t)it, scratch, &res);
            sink += res.token;
        }
        double us = (time_now() - t0) / iters * 1e6 - copy_us;
        printf("  %-26s %8.1f us/sample  (checksum %d)\n", cfg[c].name, us, (int)sink);
    }
    int buckets[] = {1, 2, 4, 8, 16, 32, 64, 128, 256};
    printf("sampler_warmup(buckets 1..256): %.3f s\n", sampler_warmup(vocab, buckets, 9));
    sampler_state_free(st);
    free(pristine);
    free(row);
    free(scratch);
    return 0;
}
