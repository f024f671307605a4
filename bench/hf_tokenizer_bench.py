#!/usr/bin/env python3
"""HF `tokenizers` baseline for bench/bench_tokenizer.c: the same measurement.

Reads the corpus written by `bench_tokenizer --write-corpus FILE` (chunks of
about 4 KiB separated by 0x1E), loads each tokenizer with
Tokenizer.from_file(<KILN_TOKENIZERS>/<name>/tokenizer.json), and encodes
every chunk one at a time (add_special_tokens=False) on a single thread:
one warm-up pass (reported as "cold", the BPE cache starts empty), then
--runs timed passes; prints MB/s of text (wall clock, and CPU time of the
calling thread) as the C program does. With RAYON_NUM_THREADS=1 the Rust
side runs on the calling thread, so thread CPU time covers it.

    ./build/bench_tokenizer --write-corpus /tmp/corpus.txt
    RAYON_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false \
        python3 bench/hf_tokenizer_bench.py --corpus /tmp/corpus.txt qwen3 llama3
"""
import argparse
import os
import sys
import time

# Single thread, set before tokenizers is imported.
os.environ.setdefault("RAYON_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from tokenizers import Tokenizer  # noqa: E402


def main():
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ap = argparse.ArgumentParser()
    ap.add_argument("--corpus", required=True, help="file from bench_tokenizer --write-corpus")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("names", nargs="*", default=["qwen3", "llama3"])
    args = ap.parse_args()
    toks = os.environ.get("KILN_TOKENIZERS", os.path.join(repo, ".cache", "tokenizers"))

    data = open(args.corpus, "rb").read()
    chunks = [c.decode("utf-8") for c in data.split(b"\x1e")]
    text_bytes = sum(len(c.encode("utf-8")) for c in chunks)
    print(f"corpus: {len(chunks)} chunks, {text_bytes / 1e6:.2f} MB of text")
    import tokenizers
    print(f"tokenizers {tokenizers.__version__}, RAYON_NUM_THREADS={os.environ['RAYON_NUM_THREADS']}")

    for name in args.names:
        path = os.path.join(toks, name, "tokenizer.json")
        t0 = time.perf_counter()
        tok = Tokenizer.from_file(path)
        load = time.perf_counter() - t0
        best, total, n_tokens, cpu_best = float("inf"), 0.0, 0, float("inf")
        for r in range(args.runs + 1):
            t0 = time.perf_counter()
            c0 = time.thread_time()
            n_tokens = 0
            for c in chunks:
                n_tokens += len(tok.encode(c, add_special_tokens=False).ids)
            dt = time.perf_counter() - t0
            cdt = time.thread_time() - c0
            if r > 0:
                cpu_best = min(cpu_best, cdt)
            if r == 0:
                print(f"{name:<12} cold (empty cache): {text_bytes / 1e6 / dt:7.2f} MB/s")
                continue
            total += dt
            best = min(best, dt)
        print(f"{name:<12} load {load:.2f} s, {n_tokens} tokens, best {text_bytes / 1e6 / best:7.2f} MB/s, "
              f"mean {text_bytes / 1e6 / (total / args.runs):7.2f} MB/s, "
              f"cpu-time best {text_bytes / 1e6 / cpu_best:7.2f} MB/s ({args.runs} runs)")


if __name__ == "__main__":
    sys.exit(main())
