/* bench_tokenizer — single-thread encoding throughput (MB/s).
 *
 * The text is built deterministically from the oracle corpus
 * (tests/fixtures/oracle/tokenizers.json: several languages, code, numbers,
 * emoji, license text): texts drawn by a fixed LCG and joined with newlines
 * until the target size, cut into chunks of about 4 KiB at text boundaries
 * (typical prompt sizes). `--write-corpus FILE` saves the chunks separated
 * by 0x1E so bench/hf_tokenizer_bench.py measures exactly the same bytes;
 * `--corpus FILE` reads such a file instead of building one.
 *
 *   bench_tokenizer [--mb 4] [--runs 3] [--corpus F | --write-corpus F] [names...]
 *
 * Names are folders under $KILN_TOKENIZERS (default qwen3 llama3).
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/error.h"
#include "base/file.h"
#include "base/knob.h"
#include "base/mem.h"
#include "kiln/tokenizer.h"

#define CHUNK_MIN 4096

/* CPU time of this thread: robust when other jobs share the machine. */
static double cpu_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}
#define SEP '\x1e'

struct corpus {
    char *data;      /* chunks separated by SEP */
    size_t len;
    size_t *start, *end;
    size_t n;
};

static void split_chunks(struct corpus *c) {
    size_t cap = 64;
    c->start = xmalloc(cap * sizeof *c->start);
    c->end = xmalloc(cap * sizeof *c->end);
    size_t a = 0;
    for (size_t i = 0; i <= c->len; i++) {
        if (i < c->len && c->data[i] != SEP) continue;
        if (c->n == cap) {
            cap *= 2;
            c->start = xrealloc(c->start, cap * sizeof *c->start);
            c->end = xrealloc(c->end, cap * sizeof *c->end);
        }
        c->start[c->n] = a;
        c->end[c->n++] = i;
        a = i + 1;
    }
}

static int build_corpus(struct corpus *c, const char *fixtures, size_t target) {
    char path[4096];
    json_error_t je;
    snprintf(path, sizeof path, "%s/oracle/tokenizers.json", fixtures);
    json_t *root = json_load_file(path, 0, &je);
    if (!root) {
        fprintf(stderr, "bench_tokenizer: %s: %s\n", path, je.text);
        return -1;
    }
    json_t *cases = json_object_get(json_object_get(root, "qwen3"), "cases");
    size_t n = json_array_size(cases);
    char *buf = xmalloc(target + 65536);
    size_t len = 0, chunk = 0;
    uint64_t s = 42;
    while (len < target) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        json_t *t = json_object_get(json_array_get(cases, (size_t)(s >> 33) % n), "text");
        size_t tl = json_string_length(t);
        if (tl == 0) continue;
        memcpy(buf + len, json_string_value(t), tl);
        len += tl;
        chunk += tl;
        if (chunk >= CHUNK_MIN) {
            buf[len++] = SEP;
            chunk = 0;
        } else {
            buf[len++] = '\n';
        }
    }
    if (buf[len - 1] == SEP || buf[len - 1] == '\n') len--;
    json_decref(root);
    c->data = buf;
    c->len = len;
    split_chunks(c);
    return 0;
}

int main(int argc, char **argv) {
    const char *corpus_in = NULL, *corpus_out = NULL;
    const char *names[16];
    size_t n_names = 0;
    double mb = 4;
    int runs = 3;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--mb") && i + 1 < argc) mb = atof(argv[++i]);
        else if (!strcmp(argv[i], "--runs") && i + 1 < argc) runs = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--corpus") && i + 1 < argc) corpus_in = argv[++i];
        else if (!strcmp(argv[i], "--write-corpus") && i + 1 < argc) corpus_out = argv[++i];
        else if (argv[i][0] != '-' && n_names < 16) names[n_names++] = argv[i];
        else {
            fprintf(stderr, "usage: bench_tokenizer [--mb N] [--runs N] [--corpus F | --write-corpus F] [names...]\n");
            return 2;
        }
    }
    if (!n_names) {
        names[n_names++] = "qwen3";
        names[n_names++] = "llama3";
    }
    struct kiln_error kerr;
    if (knob_init(&kerr)) {
        fprintf(stderr, "bench_tokenizer: %s\n", kerr.msg);
        return 2;
    }
    const char *fixtures = knob_str(KNOB_FIXTURES);
    const char *toks = knob_str(KNOB_TOKENIZERS);
    struct corpus c = {0};
    struct kiln_error err;
    if (corpus_in) {
        if (file_read_all(corpus_in, &c.data, &c.len, &err)) {
            fprintf(stderr, "bench_tokenizer: %s\n", err.msg);
            return 1;
        }
        split_chunks(&c);
    } else if (build_corpus(&c, fixtures, (size_t)(mb * 1024 * 1024))) {
        return 1;
    }
    size_t text_bytes = 0;
    for (size_t i = 0; i < c.n; i++) text_bytes += c.end[i] - c.start[i];
    if (corpus_out) {
        FILE *f = fopen(corpus_out, "wb");
        if (!f || fwrite(c.data, 1, c.len, f) != c.len || fclose(f)) {
            fprintf(stderr, "bench_tokenizer: cannot write %s\n", corpus_out);
            return 1;
        }
        printf("wrote %s: %zu chunks, %zu bytes of text\n", corpus_out, c.n, text_bytes);
    }
    printf("corpus: %zu chunks, %.2f MB of text\n", c.n, text_bytes / 1e6);
    struct kiln_token_ids ids = {0};
    for (size_t k = 0; k < n_names; k++) {
        char dir[4096];
        struct kiln_tokenizer *tok;
        snprintf(dir, sizeof dir, "%s/%s", toks, names[k]);
        double t0 = time_now();
        if (kiln_tokenizer_load(&tok, dir, &err)) {
            fprintf(stderr, "bench_tokenizer: %s\n", err.msg);
            return 1;
        }
        double load = time_now() - t0, best = 1e30, sum = 0, cpu_best = 1e30;
        size_t n_tokens = 0;
        for (int r = 0; r <= runs; r++) {
            t0 = time_now();
            double c0 = cpu_now();
            n_tokens = 0;
            for (size_t i = 0; i < c.n; i++) {
                if (kiln_tokenizer_encode(tok, c.data + c.start[i], c.end[i] - c.start[i], 0, &ids, &err)) {
                    fprintf(stderr, "bench_tokenizer: %s\n", err.msg);
                    return 1;
                }
                n_tokens += ids.n;
            }
            double dt = time_now() - t0, cdt = cpu_now() - c0;
            if (r > 0 && cdt < cpu_best) cpu_best = cdt;
            if (r == 0) {
                printf("%-12s cold (empty cache): %7.2f MB/s\n", names[k], text_bytes / 1e6 / dt);
                continue; /* warm-up */
            }
            sum += dt;
            if (dt < best) best = dt;
        }
        printf("%-12s load %.2f s, %zu tokens, best %7.2f MB/s, mean %7.2f MB/s, cpu-time best %7.2f MB/s (%d runs)\n",
               names[k], load, n_tokens, text_bytes / 1e6 / best, text_bytes / 1e6 / (sum / runs), text_bytes / 1e6 / cpu_best,
               runs);
        kiln_tokenizer_free(tok);
    }
    kiln_token_ids_free(&ids);
    free(c.data);
    free(c.start);
    free(c.end);
    return 0;
}
