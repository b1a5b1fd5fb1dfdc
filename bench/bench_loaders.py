"""Loader throughput on the reference corpus (../shared/corpus): MHTML docs/s and PDF pages/s.

    .venv/bin/python bench/bench_loaders.py [--corpus ../shared/corpus] [--repeat 3]

Each file is loaded `--repeat` times; the median pass is reported (the machine is shared).
PDF pages/s includes embedded-image extraction and rendering of image-only pages.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from vision_rag_pipeline.documents.loader import load_document
from vision_rag_pipeline.documents.model import DocumentError


def _pass(files: list[Path]) -> tuple[float, int, int, list[str]]:
    started = time.perf_counter()
    pages = images = 0
    failures = []
    for file in files:
        try:
            doc = load_document(file)
        except DocumentError as exc:
            failures.append(str(exc))
            continue
        pages += doc.pages or 0
        images += len(doc.images)
    return time.perf_counter() - started, pages, images, failures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--corpus", type=Path, default=Path(__file__).resolve().parents[2] / "shared" / "corpus"
    )
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    mhtml = sorted((args.corpus / "mhtml").iterdir())
    pdf = sorted((args.corpus / "pdf").glob("*.pdf")) + sorted((args.corpus / "qa").rglob("*.pdf"))
    result = {}
    for name, files in (("mhtml", mhtml), ("pdf", pdf)):
        runs = [_pass(files) for _ in range(args.repeat)]
        seconds = statistics.median(r[0] for r in runs)
        _, pages, images, failures = runs[0]
        result[name] = {
            "files": len(files),
            "pages": pages,
            "images": images,
            "failed": failures,
            "median_seconds": round(seconds, 2),
            "files_per_second": round(len(files) / seconds, 1),
            "pages_per_second": round(pages / seconds, 1) if pages else None,
        }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
