"""Search by image on a generated set: does a re-rendered, resized copy of a chart find its image chunk?

For every chart of a set written by `bench/evalset.py generate` (bar, line and pie charts; other
kinds with --kinds), the chart is drawn again from its spec without the document's degradation,
resized by --scale, saved as PNG and used as the query of `search(image=...)`. A query succeeds
when one of the top-k hits is this chart's image chunk: same document, and the chunk's image URL
is the chart's (MHTML) or its page and box are the chart's placement (PDF, IoU >= 0.5). Needs a
VISION_RAG_HOME where the set is ingested (e.g. the one `bench/eval_retrieval.py --home` made).

    python bench/evalset.py generate /tmp/evalset --docs 12 --seed 7
    python bench/eval_retrieval.py /tmp/evalset --home /tmp/evalset/home
    python bench/eval_query.py /tmp/evalset --home /tmp/evalset/home --k 5 --scale 0.75
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parent))

from evalset import RENDERERS, build_specs  # noqa: E402

CHART_KINDS = ("bar_outside", "bar_inside", "line_chart", "pie_chart")


def query_images(out_dir: Path, kinds: tuple[str, ...], scale: float) -> list[dict]:
    """Write the re-rendered, resized copies; one row per query with what must be found."""
    manifest = json.loads((out_dir / "manifest.json").read_text(encoding="utf-8"))
    specs = build_specs(len(manifest["documents"]), manifest["seed"])
    entries = {
        (doc["file"], image["name"]): image for doc in manifest["documents"] for image in doc["images"]
    }
    folder = out_dir / "query_images"
    folder.mkdir(exist_ok=True)
    rows = []
    for doc in specs:
        for image in doc.images:
            if image.kind not in kinds or not image.facts:
                continue
            picture = RENDERERS[image.kind](image.params)
            picture = picture.resize(
                (max(1, round(picture.width * scale)), max(1, round(picture.height * scale))),
                Image.Resampling.LANCZOS,
            )
            path = folder / f"{Path(doc.file_name).stem}--{Path(image.name).stem}.png"
            buffer = io.BytesIO()
            picture.save(buffer, format="PNG")
            path.write_bytes(buffer.getvalue())
            rows.append(
                {
                    "query": str(path),
                    "document": doc.file_name,
                    "image": image.name,
                    "kind": image.kind,
                    "degradation_in_document": image.degradation,
                    "url": entries[(doc.file_name, image.name)].get("url"),
                    "placements": entries[(doc.file_name, image.name)].get("placements", []),
                }
            )
    return rows


def _iou(a: list[float], b: list[float]) -> float:
    overlap = max(0.0, min(a[2], b[2]) - max(a[0], b[0])) * max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - overlap
    return overlap / union if union > 0 else 0.0


def is_the_chart(hit: dict, row: dict) -> bool:
    if hit["kind"] != "image" or not str(hit["document"]).endswith(row["document"]):
        return False
    if row["url"]:
        return hit["image"] == row["url"]
    return any(
        hit["page"] == placement["page"] and hit["bbox"] and _iou(hit["bbox"], placement["bbox"]) >= 0.5
        for placement in row["placements"]
    )


def image_rank(hits: list[dict], row: dict) -> int | None:
    return next((rank for rank, hit in enumerate(hits, start=1) if is_the_chart(hit, row)), None)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out_dir", type=Path, help="a directory written by `bench/evalset.py generate`")
    parser.add_argument("--home", type=Path, required=True, help="VISION_RAG_HOME holding the ingested set")
    parser.add_argument("--k", type=int, default=5)
    parser.add_argument("--scale", type=float, default=0.75, help="resize factor of the query copies")
    parser.add_argument("--kinds", default=",".join(CHART_KINDS), help="image kinds to query with")
    parser.add_argument("--mode", choices=("hybrid", "vector", "lexical"), default="hybrid")
    parser.add_argument("--json", type=Path, metavar="FILE", help="write the numbers here")
    args = parser.parse_args(argv)
    os.environ["VISION_RAG_HOME"] = str(args.home.resolve())
    os.environ.setdefault("DAGSTER_HOME", str(args.home.resolve() / "dagster"))
    from vision_rag_pipeline.query import search

    rows = query_images(args.out_dir, tuple(args.kinds.split(",")), args.scale)
    search(text="warm-up query", k=args.k)
    for row in rows:
        started = time.perf_counter()
        hits = [hit.model_dump() for hit in search(image=row["query"], k=args.k, mode=args.mode)]
        row["seconds"] = round(time.perf_counter() - started, 3)
        row["rank"] = image_rank(hits, row)
        row["top"] = [f"{Path(h['document']).name} [{h['kind']}]" for h in hits]
    by_kind: dict[str, list[dict]] = defaultdict(list)
    for row in rows:
        by_kind[row["kind"]].append(row)
        by_kind["all"].append(row)

    def rate(group: list[dict], k: int) -> float:
        return sum(r["rank"] is not None and r["rank"] <= k for r in group) / len(group)

    table = {
        name: {"queries": len(group), "top1": rate(group, 1), f"top{args.k}": rate(group, args.k)}
        for name, group in sorted(by_kind.items(), key=lambda item: item[0] != "all")
    }
    print(f"| image kind | queries | top-1 | top-{args.k} |\n|---|---:|---:|---:|")
    for name, row in table.items():
        print(f"| {name} | {row['queries']} | {row['top1']:.3f} | {row[f'top{args.k}']:.3f} |")
    latencies = [r["seconds"] for r in rows]
    print(f"image query latency (describe + search): median {statistics.median(latencies) * 1000:.0f} ms")
    misses = [r for r in rows if r["rank"] is None]
    for miss in misses[:10]:
        print(f"miss: {Path(miss['query']).name}: top {miss['top']}", file=sys.stderr)
    if args.json:
        args.json.write_text(json.dumps({"scores": table, "rows": rows}, indent=1), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
