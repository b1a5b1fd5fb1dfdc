"""How many of an evaluation set's image facts the OCR text itself contains, per image kind.

    .venv/bin/python bench/evalset.py generate /tmp/q_eval --docs 40 --seed 7
    .venv/bin/python bench/ocr_fact_recall.py /tmp/q_eval [--docs 40]

Runs `ocr_image` on every content image of the set (as the loaders extract it), checks each of its
facts with the same matcher as `eval_retrieval.py`, and prints the share found (overall, per image
kind, per degradation) with the median and total OCR time. It isolates OCR from ranking: a fact
missing here cannot be found by any search.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parent))
from eval_retrieval import contains_fact  # noqa: E402

from vision_rag_pipeline.documents.loader import load_document  # noqa: E402
from vision_rag_pipeline.enrichment.ocr import ocr_image  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", type=Path, help="a directory written by `bench/evalset.py generate`")
    parser.add_argument("--docs", type=int, default=None, help="only the first N documents")
    args = parser.parse_args()
    manifest = json.loads((args.out_dir / "manifest.json").read_text())
    found, total, seconds = Counter(), Counter(), []
    found_by_degradation, total_by_degradation = Counter(), Counter()
    for doc in manifest["documents"][: args.docs]:
        with_facts = {image["sha256"]: image for image in doc["images"] if image["facts"]}
        for extracted in load_document(args.out_dir / "docs" / doc["file"]).images:
            image = with_facts.pop(hashlib.sha256(extracted.data).hexdigest(), None)
            if image is None:
                continue
            picture = Image.open(io.BytesIO(extracted.data)).convert("RGB")
            started = time.perf_counter()
            text = ocr_image(picture, ["eng"]).text
            seconds.append(time.perf_counter() - started)
            for fact in image["facts"]:
                total[image["kind"]] += 1
                hit = contains_fact(text, str(fact))
                found[image["kind"]] += hit
                total_by_degradation[image["degradation"]] += 1
                found_by_degradation[image["degradation"]] += hit
    print(
        json.dumps(
            {
                "facts_found": round(sum(found.values()) / max(1, sum(total.values())), 3),
                "facts": sum(total.values()),
                "images": len(seconds),
                "ocr_median_ms": round(1000 * statistics.median(seconds)) if seconds else None,
                "ocr_total_s": round(sum(seconds), 1),
                "by_kind": {kind: round(found[kind] / total[kind], 3) for kind in sorted(total)},
                "by_degradation": {
                    name: round(found_by_degradation[name] / total_by_degradation[name], 3)
                    for name in sorted(total_by_degradation)
                },
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
