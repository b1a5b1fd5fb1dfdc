"""Offline enrichment throughput: 800×600 generated text images, cold cache, OCR + rule fusion.

    .venv/bin/python bench/bench_enrichment.py [--images 20] [--workers N] [--no-cache]

Reports images/s for three runs of `enrich_document_images`: two batches of new images (cold
cache: the steady state of an ingest; OCR on one thread per core) and the second batch again
(warm cache). With the cache, the embedded Postgres under
VISION_RAG_HOME (or VISION_RAG_PG_URL) is used; each run of the bench uses a fresh cache domain.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import random
import time
import uuid

from PIL import Image, ImageDraw, ImageFont

from vision_rag_pipeline.core.config import RagConfig
from vision_rag_pipeline.documents.model import DocumentImage
from vision_rag_pipeline.enrichment.batch import enrich_document_images
from vision_rag_pipeline.enrichment.cache import EnrichmentCache
from vision_rag_pipeline.enrichment.model import ImageVerdict

_WORDS_TEXT = """revenue margin warehouse forecast customer backlog invoice quarter region north south
east west growth churn pipeline budget headcount latency uptime incident release contract supplier"""
WORDS = _WORDS_TEXT.split()


def text_image(rng: random.Random, index: int) -> DocumentImage:
    """An 800×600 slide-like image: a title and eight lines of words and numbers."""
    img = Image.new("RGB", (800, 600), "white")
    draw = ImageDraw.Draw(img)
    draw.text(
        (40, 30),
        f"Report {index}: {rng.choice(WORDS).title()}",
        fill="black",
        font=ImageFont.load_default(size=40),
    )
    body = ImageFont.load_default(size=26)
    for line in range(8):
        words = " ".join(rng.choice(WORDS) for _ in range(4))
        draw.text((40, 110 + line * 58), f"{words} {rng.randint(10, 9999)}", fill="black", font=body)
    buffer = io.BytesIO()
    img.save(buffer, format="PNG")
    return DocumentImage(
        url=f"bench/{index}.png", name=f"{index}.png", mime="image/png", data=buffer.getvalue()
    )


def timed_run(
    images: list[DocumentImage], config: RagConfig, cache: EnrichmentCache | None
) -> dict[str, float]:
    verdicts = [ImageVerdict(image_sha256=img.sha256, verdict="VISION") for img in images]
    start = time.perf_counter()
    batch = enrich_document_images(images, verdicts, config, cache, "bench")
    seconds = time.perf_counter() - start
    if batch.errors:
        raise SystemExit(f"enrichment errors: {batch.errors[:3]}")
    return {
        "images": len(images),
        "seconds": round(seconds, 2),
        "images_per_s": round(len(images) / seconds, 2),
        "calls": batch.calls,
        "cache_hits": batch.cache_hits,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=20)
    parser.add_argument("--workers", type=int, default=None, help="OCR threads (default: all cores)")
    parser.add_argument("--no-cache", action="store_true", help="skip the Postgres enrichment cache")
    args = parser.parse_args()

    rng = random.Random(7)
    first = [text_image(rng, i) for i in range(args.images)]
    second = [text_image(rng, args.images + i) for i in range(args.images)]
    config = RagConfig(domain=f"bench-{uuid.uuid4().hex[:8]}").with_settings(
        {"media_enrichment": {"ocr": {"max_workers": args.workers}}}
    )
    cache = None if args.no_cache else EnrichmentCache()
    report = {
        "cores": os.cpu_count(),
        "workers": args.workers or os.cpu_count(),
        "cache": not args.no_cache,
        "cold_cache": timed_run(first, config, cache),
        "cold_cache_again": timed_run(second, config, cache),
        "warm_cache": timed_run(second, config, cache),
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
