"""Embedding batches of ever new shapes: time and memory growth of one process.

    .venv/bin/python bench/bench_encode_shapes.py [--calls 30]

Each `encode()` call gets a random number of texts (1-64) of a random length (3-300 words), as a
long ingest's documents do. Prints the process's RSS growth after the first call. A/B the kernel
cache bound against oneDNN's default as whole processes (hyperfine for time, /usr/bin/time -v for
peak RSS):

    hyperfine -w 1 -r 5 '.venv/bin/python bench/bench_encode_shapes.py' \
        'env ONEDNN_PRIMITIVE_CACHE_CAPACITY=1024 LRU_CACHE_CAPACITY=1024 .venv/bin/python bench/bench_encode_shapes.py'
"""

from __future__ import annotations

import argparse
import random

import psutil

from vision_rag_pipeline.embeddings.encoder import encode

WORDS = [
    "alpha",
    "beta",
    "gamma",
    "delta",
    "revenue",
    "quarter",
    "margin",
    "energy",
    "output",
    "plant",
    "mill",
    "zebra",
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=30)
    args = parser.parse_args()
    random.seed(1)
    encode(["warm up"], "all-MiniLM-L6-v2")
    before = psutil.Process().memory_info().rss
    for _ in range(args.calls):
        texts, words = random.randint(1, 64), random.randint(3, 300)
        encode([" ".join(random.choices(WORDS, k=words)) for _ in range(texts)], "all-MiniLM-L6-v2")
    print(f"RSS growth over {args.calls} calls: {(psutil.Process().memory_info().rss - before) >> 20} MB")


if __name__ == "__main__":
    main()
