/* bench_radix.c — radix prefix cache throughput on a serving-like stream:
 * N requests of T tokens, each opening with one of P shared "system
 * prompts" of S tokens and ending in its own tokens. Per request the
 * engine's sequence is timed: match, lock, insert, unlock, then eviction
 * down to a page budget. Afterwards a match-only pass and a full eviction.
 * Prints operations/s and tokens/s per page size.
 *
 *   bench_radix [--requests 10000] [--tokens 1024] [--prefixes 100]
 *               [--shared 512] [--page-size N (default: 1 and 16)]
 *               [--capacity PAGES (default: unlimited)] [--seed 1]
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/mem.h"
#include "cache/radix.h"

struct bench_pages {
    long released;
};

static void count_release(void *user, const int32_t *pages, int n) {
    ((struct bench_pages *)user)->released += n;
}

static uint64_t next_rand(uint64_t *s) {
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return *s >> 33;
}

static void run(int ps, int n_req, int n_tok, int n_prefix, int shared, long capacity,
                uint64_t seed) {
    uint64_t rng = seed;
    int32_t *prefixes = xmalloc((size_t)n_prefix * (size_t)shared * sizeof *prefixes);
    for (long i = 0; i < (long)n_prefix * shared; i++) prefixes[i] = (int32_t)(next_rand(&rng) % 32000);
    int32_t *ids = xmalloc((size_t)n_req * (size_t)n_tok * sizeof *ids);
    for (int r = 0; r < n_req; r++) {
        int32_t *q = ids + (size_t)r * (size_t)n_tok;
        const int32_t *pre = prefixes + (size_t)(next_rand(&rng) % (uint64_t)n_prefix) * (size_t)shared;
        for (int i = 0; i < n_tok; i++) q[i] = i < shared ? pre[i] : (int32_t)(next_rand(&rng) % 32000);
    }
    int n_pages = n_tok / ps, aligned = n_pages * ps;
    int32_t *pages = xmalloc((size_t)n_pages * sizeof *pages);

    struct bench_pages bp = {0};
    struct radix_tree *t = radix_create(ps, count_release, &bp);
    int32_t next_page = 0;
    long matched_tokens = 0;
    double t_match = 0, t_insert = 0, t_evict = 0;
    for (int r = 0; r < n_req; r++) {
        const int32_t *q = ids + (size_t)r * (size_t)n_tok;
        struct radix_node *node, *leaf;
        double t0 = time_now();
        int m = radix_match(t, NULL, q, n_tok, pages, &node);
        radix_lock(t, node);
        double t1 = time_now();
        for (int p = m / ps; p < n_pages; p++) pages[p] = next_page++; /* "computed" pages */
        double t2 = time_now();
        radix_insert(t, NULL, q, aligned, pages, &leaf);
        radix_unlock(t, node);
        double t3 = time_now();
        if (capacity > 0 && radix_total_pages(t) > capacity)
            radix_evict(t, (int)(radix_total_pages(t) - capacity));
        double t4 = time_now();
        t_match += t1 - t0;
        t_insert += t3 - t2;
        t_evict += t4 - t3;
        matched_tokens += m;
    }
    long cached = radix_total_pages(t);

    double t0 = time_now();
    long hit = 0;
    for (int r = 0; r < n_req; r++)
        hit += radix_match(t, NULL, ids + (size_t)r * (size_t)n_tok, n_tok, pages, NULL);
    double t_rematch = time_now() - t0;

    t0 = time_now();
    long evicted = radix_evict(t, 1 << 30);
    double t_drain = time_now() - t0;
    radix_destroy(t);

    double tok = (double)n_req * n_tok;
    printf("page_size %2d: %d requests x %d tokens, %d prefixes of %d tokens, capacity %ld\n", ps,
           n_req, n_tok, n_prefix, shared, capacity);
    printf("  match+lock     %10.0f ops/s %8.1f Mtok/s  (hit %.1f%% of tokens)\n", n_req / t_match,
           tok / t_match / 1e6, 100.0 * (double)matched_tokens / tok);
    printf("  insert+unlock  %10.0f ops/s %8.1f Mtok/s\n", n_req / t_insert, tok / t_insert / 1e6);
    if (capacity > 0)
        printf("  evict to budget %9.3f s total, %ld pages released\n", t_evict, bp.released);
    printf("  re-match       %10.0f ops/s %8.1f Mtok/s  (hit %.1f%%)\n", n_req / t_rematch,
           tok / t_rematch / 1e6, 100.0 * (double)hit / tok);
    printf("  evict all      %10.0f pages/s (%ld pages, %ld cached before)\n",
           evicted / (t_drain > 0 ? t_drain : 1e-9), evicted, cached);
    free(pages);
    free(ids);
    free(prefixes);
}

int main(int argc, char **argv) {
    int n_req = 10000, n_tok = 1024, n_prefix = 100, shared = 512, ps = 0;
    long capacity = 0;
    uint64_t seed = 1;
    for (int i = 1; i + 1 < argc; i += 2) {
        const char *a = argv[i], *v = argv[i + 1];
        if (!strcmp(a, "--requests")) n_req = atoi(v);
        else if (!strcmp(a, "--tokens")) n_tok = atoi(v);
        else if (!strcmp(a, "--prefixes")) n_prefix = atoi(v);
        else if (!strcmp(a, "--shared")) shared = atoi(v);
        else if (!strcmp(a, "--page-size")) ps = atoi(v);
        else if (!strcmp(a, "--capacity")) capacity = atol(v);
        else if (!strcmp(a, "--seed")) seed = strtoull(v, NULL, 10);
        else {
            fprintf(stderr, "bench_radix: unknown option %s\n", a);
            return 2;
        }
    }
    if (n_req < 1 || n_tok < 1 || n_prefix < 1 || shared < 0 || shared > n_tok || ps < 0) {
        fprintf(stderr, "bench_radix: need requests, tokens, prefixes >= 1, 0 <= shared <= tokens\n");
        return 2;
    }
    if (ps) {
        run(ps, n_req, n_tok, n_prefix, shared, capacity, seed);
    } else {
        run(1, n_req, n_tok, n_prefix, shared, capacity, seed);
        run(16, n_req, n_tok, n_prefix, shared, capacity, seed);
    }
    return 0;
}
