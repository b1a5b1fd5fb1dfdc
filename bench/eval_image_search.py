"""Search by image on real pictures: does a photographed, cropped or resized copy find its chunk?

The pictures are the reference corpus' own (`../shared/corpus`: the MHTML archives and PDFs,
skipped cleanly when absent), ingested once; the queries are copies of a sample of its indexed
images (those with an image chunk), changed the way a user's copy differs from the original:

- `resized`: 75 % of the size, saved as PNG;
- `photo`: a photo of a screen or a print: each corner moved by up to 3 % (perspective), grey
  noise (sigma 8), a slight blur, JPEG quality 50;
- `crop`: the middle 80 % of the picture.

A query succeeds at k when one of the top-k hits is a chunk of that picture (its image chunk or
an excerpt of it, in any document that holds it). Each copy is described once and searched twice:
with the query's perceptual hash (query/candidates.py NEAR_DUPLICATE_BITS) and without it, so
the difference is that signal's alone. The counter-check: pictures that are not in the
index (the image-only pages of `qa/mmlongbench`, never ingested here) should find no near-duplicate;
`foreign_with_a_near_duplicate` is the share that does, at each distance.

    python bench/eval_image_search.py                       # ingest into a fresh home, then search
    python bench/eval_image_search.py --home /tmp/img_home  # keep the home ...
    python bench/eval_image_search.py --home /tmp/img_home --skip-ingest   # ... and search it again
"""

from __future__ import annotations

import argparse
import io
import json
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from PIL import Image, ImageFilter

sys.path.insert(0, str(Path(__file__).resolve().parent))
from eval_real import DEFAULT_CORPUS  # noqa: E402
from eval_retrieval import ingest, stop_embedded_postgres, use_home  # noqa: E402

if TYPE_CHECKING:
    from vision_rag_pipeline.indexes.pgvector_store import PgVectorStore


def resized(img: Image.Image, rng: random.Random) -> bytes:
    return _encode(img.resize((max(1, img.width * 3 // 4), max(1, img.height * 3 // 4))), "PNG")


def photo(img: Image.Image, rng: random.Random) -> bytes:
    width, height = img.size
    corners = [(0, 0), (width, 0), (width, height), (0, height)]
    moved = [
        (x + rng.uniform(-0.03, 0.03) * width, y + rng.uniform(-0.03, 0.03) * height) for x, y in corners
    ]
    rows, targets = [], []
    for (x, y), (u, v) in zip(moved, corners, strict=True):  # the perspective that maps moved -> corners
        rows += [[x, y, 1, 0, 0, 0, -u * x, -u * y], [0, 0, 0, x, y, 1, -v * x, -v * y]]
        targets += [u, v]
    coefficients = tuple(np.linalg.solve(np.array(rows, dtype=float), np.array(targets, dtype=float)))
    warped = img.transform(
        img.size,
        Image.Transform.PERSPECTIVE,
        coefficients,
        Image.Resampling.BILINEAR,
        fillcolor=(255, 255, 255),
    )
    noise = np.random.default_rng(rng.randrange(2**32)).normal(0, 8, (height, width, 1))
    noisy = Image.fromarray(np.clip(np.asarray(warped, dtype=np.float32) + noise, 0, 255).astype(np.uint8))
    return _encode(noisy.filter(ImageFilter.GaussianBlur(0.6)), "JPEG", quality=50)


def crop(img: Image.Image, rng: random.Random) -> bytes:
    width, height = img.size
    return _encode(img.crop((width // 10, height // 10, width - width // 10, height - height // 10)), "PNG")


VARIANTS: dict[str, Callable[[Image.Image, random.Random], bytes]] = {
    "resized": resized,
    "photo": photo,
    "crop": crop,
}


def _encode(img: Image.Image, fmt: str, **options: int) -> bytes:
    buffer = io.BytesIO()
    img.save(buffer, fmt, **options)
    return buffer.getvalue()


def indexed_pictures() -> dict[str, set[str]]:
    """{image sha256: ids of every chunk of that picture} for the pictures that have an image chunk."""
    from vision_rag_pipeline.core.postgres import connect

    with connect() as conn:
        rows = conn.execute(
            "SELECT metadata->>'image_sha256', chunk_id FROM chunks WHERE kind = 'image'"
        ).fetchall()
    pictures: dict[str, set[str]] = {}
    for sha256, chunk_id in rows:
        pictures.setdefault(sha256, set()).add(chunk_id)
    return pictures


def foreign_near_duplicates(corpus: Path, store: PgVectorStore, sample: int, rng: random.Random) -> dict:
    """Pictures from outside the index: the share that meets an indexed picture within N bits, and
    the share that search would put first as the picture it copies."""
    from vision_rag_pipeline.documents.loader import load_document
    from vision_rag_pipeline.enrichment.preprocess import ImageError, load_image
    from vision_rag_pipeline.images.fingerprint import HASH_BITS, perceptual_hash
    from vision_rag_pipeline.query.candidates import same_picture

    hashes = []
    for path in sorted((corpus / "qa" / "mmlongbench").glob("*.pdf")):
        for image in load_document(path).images:
            try:
                hashes.append(perceptual_hash(load_image(image.data, image.mime)))
            except ImageError:
                continue
    chosen = rng.sample(hashes, min(sample, len(hashes)))
    near = [store.near_duplicates(h, HASH_BITS) if h else {} for h in chosen]
    nearest = [min((d for d, _ in found.values()), default=HASH_BITS + 1) for found in near]
    return {
        "pictures": len(chosen),
        "plain_no_hash": round(sum(h is None for h in chosen) / len(chosen), 3),
        "share_within_bits": {
            bits: round(sum(d <= bits for d in nearest) / len(chosen), 3) for bits in (6, 8, 10, 12, 14)
        },
        "share_put_first": round(sum(bool(same_picture(found)) for found in near) / len(chosen), 3),
    }


def run(corpus: Path, sample: int, k: int, seed: int) -> dict:
    from vision_rag_pipeline.core.config import config_in_effect
    from vision_rag_pipeline.enrichment.preprocess import load_image
    from vision_rag_pipeline.images.store import ImageStore
    from vision_rag_pipeline.query.candidates import NEAR_DUPLICATE_BITS, vector_store
    from vision_rag_pipeline.query.image_query import describe_query_image
    from vision_rag_pipeline.query.search import search_queries

    config = config_in_effect().config
    pictures = indexed_pictures()
    rng = random.Random(seed)
    chosen = rng.sample(sorted(pictures), min(sample, len(pictures)))
    originals = ImageStore().get_many(chosen)
    ranks: dict[str, dict[str, list[int | None]]] = {v: {"hash": [], "text": []} for v in VARIANTS}
    seconds: list[float] = []
    for sha256 in chosen:
        img = load_image(originals[sha256], "")
        for variant, change in VARIANTS.items():
            started = time.perf_counter()
            picture = describe_query_image(change(img, rng))
            # "text": the same query without its perceptual hash, so only what it reads is searched
            for signal, query in (("hash", picture), ("text", picture._replace(perceptual_hash=None))):
                hits = search_queries([], k, image=query, config=config, unit="chunk")
                found = [i for i, hit in enumerate(hits, 1) if hit.chunk_id in pictures[sha256]]
                ranks[variant][signal].append(found[0] if found else None)
            seconds.append(time.perf_counter() - started)

    def recall(found: list[int | None], at: int) -> float:
        return round(sum(r is not None and r <= at for r in found) / len(found), 3)

    foreign = foreign_near_duplicates(corpus, vector_store(config.embedding.model), sample, rng)
    return {
        "pictures": len(chosen),
        "indexed_pictures": len(pictures),
        "near_duplicate_bits": NEAR_DUPLICATE_BITS,
        "seconds_per_query_median": round(statistics.median(seconds), 2),
        "recall": {
            variant: {
                signal: {"R@1": recall(found, 1), f"R@{k}": recall(found, k)} for signal, found in by.items()
            }
            for variant, by in ranks.items()
        },
        "foreign_with_a_near_duplicate": foreign,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", type=Path, default=DEFAULT_CORPUS, help="the reference corpus folder")
    parser.add_argument("--pictures", type=int, default=60, help="indexed pictures to copy and search for")
    parser.add_argument("--k", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--home", type=Path, help="VISION_RAG_HOME to keep (default: a fresh one under /tmp)")
    parser.add_argument("--skip-ingest", action="store_true", help="search what --home already holds")
    args = parser.parse_args(argv)
    if args.skip_ingest and not args.home:
        parser.error("--skip-ingest needs --home")
    documents = sorted([*(args.corpus / "mhtml").glob("*.mht*"), *(args.corpus / "pdf").glob("*.pdf")])
    if not documents:
        print(f"skipped: no reference corpus at {args.corpus}")
        return 0
    owns_home = args.home is None
    home = use_home(args.home or Path("/tmp/vision_rag_eval_image_search"), fresh=not args.skip_ingest)
    try:
        if not args.skip_ingest:
            print(f"ingesting {len(documents)} documents into {home} ...", file=sys.stderr)
            ingest(documents, home)
        report = run(args.corpus, args.pictures, args.k, args.seed)
    finally:
        if owns_home:
            stop_embedded_postgres(home)
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
