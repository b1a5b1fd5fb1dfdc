"""Ingest speed on real documents, beside one plain Tesseract pass over the same pages.

    .venv/bin/python bench/bench_real_ingest.py [--set mmlongbench|corpus|pdf|all] [--repeat 1]
                                                [--out /tmp/bench_real_ingest] [--ingest-only]

For each set of `../shared/corpus` (mmlongbench: the 7 PDFs of qa/mmlongbench; corpus: the reference
corpus's MHTML and PDFs; pdf: the reference corpus's PDFs alone; all: the three), in one run:

- **plain pass** (the yardstick): every PDF page rendered at scale 2 and every MHTML image as
  stored, each read once by the `tesseract` binary (eng, default page segmentation,
  OMP_THREAD_LIMIT=1), one after another. Rendering is not timed.
- **ingest**: `vision-rag ingest FILES --json` (default workers) into a fresh home: wall time, peak
  RSS of the whole process tree (sampled every 0.1 s) and, from the runs' Dagster step stats, the
  seconds each asset's steps took, summed over documents.
- **unchanged**: the same command again on the same home.
- **one file**: `vision-rag ingest` of the set's smallest PDF into another fresh home: wall time and
  seconds from launch to its first step starting.

Ratio = ingest wall time / plain-pass time. Medians over `--repeat` runs; prints one JSON object.
`--ingest-only` runs the first ingest alone (fresh home, its wall time and peak RSS): the command to
time as a whole process against another checkout or setting, e.g.

    hyperfine -w 1 -r 5 'bench/bench_real_ingest.py --set pdf --ingest-only' \
        'env VISION_RAG_CONFIG=float32.yaml bench/bench_real_ingest.py --set pdf --ingest-only'
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
from eval_real import DEFAULT_CORPUS  # noqa: E402
from eval_retrieval import stop_embedded_postgres, vision_rag_command  # noqa: E402

RENDER_SCALE = 2
RSS_SAMPLE_SECONDS = 0.1


def document_sets(corpus: Path) -> dict[str, list[Path]]:
    return {
        "mmlongbench": sorted((corpus / "qa" / "mmlongbench").glob("*.pdf")),
        "corpus": sorted((corpus / "mhtml").iterdir()) + sorted((corpus / "pdf").glob("*.pdf")),
        "pdf": sorted((corpus / "pdf").glob("*.pdf")),
    }


def page_images(documents: list[Path], folder: Path) -> list[Path]:
    """What the plain pass reads: PDF pages rendered at scale 2, MHTML images as stored."""
    import pypdfium2 as pdfium

    from vision_rag_pipeline.documents.loader import load_document_bytes

    images = []
    for doc in documents:
        if doc.suffix.lower() == ".pdf":
            pdf = pdfium.PdfDocument(doc)
            for number, page in enumerate(pdf):
                path = folder / f"{doc.stem}-{number}.png"
                page.render(scale=RENDER_SCALE).to_pil().save(path)
                images.append(path)
            pdf.close()
        else:
            for number, image in enumerate(load_document_bytes(doc.read_bytes(), str(doc), str(doc)).images):
                path = folder / f"{doc.stem}-{number}.img"
                path.write_bytes(image.data)
                images.append(path)
    return images


def plain_pass_seconds(images: list[Path]) -> float:
    env = {**os.environ, "OMP_THREAD_LIMIT": "1"}
    started = time.perf_counter()
    for image in images:
        subprocess.run(["tesseract", str(image), "-", "-l", "eng"], env=env, capture_output=True, check=False)
    return time.perf_counter() - started


class PeakRss:
    """Peak summed RSS of a process and all its descendants, sampled in a thread."""

    def __init__(self, pid: int) -> None:
        self.root = psutil.Process(pid)
        self.peak = 0
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        while not self._done.wait(RSS_SAMPLE_SECONDS):
            try:
                tree = [self.root, *self.root.children(recursive=True)]
                self.peak = max(self.peak, sum(p.memory_info().rss for p in tree if p.is_running()))
            except psutil.Error:
                continue

    def stop(self) -> int:
        self._done.set()
        self._thread.join()
        return self.peak


def run_ingest(documents: list[Path], home: Path) -> dict:
    env = {**os.environ, "VISION_RAG_HOME": str(home), "DAGSTER_HOME": str(home / "dagster")}
    (home / "dagster").mkdir(parents=True, exist_ok=True)
    command = [*vision_rag_command(), "ingest", *map(str, documents), "--json"]
    launched = time.time()
    started = time.perf_counter()
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    rss = PeakRss(process.pid)
    out, err = process.communicate()
    seconds = time.perf_counter() - started
    peak = rss.stop()
    if "{" not in out:
        raise SystemExit(f"vision-rag ingest (exit {process.returncode}) printed no report:\n{err[-2000:]}")
    report = json.loads(out[out.index("{") :])
    return {
        "seconds": round(seconds, 2),
        "peak_rss_mb": round(peak / 2**20),
        "launched": launched,
        "report": report,
    }


def step_seconds(home: Path, since: float) -> tuple[dict[str, float], float | None]:
    """Seconds per asset step summed over the runs started after `since`, and the earliest step start."""
    import dagster as dg

    instance = dg.DagsterInstance.from_config(str(home / "dagster"))
    per_step: dict[str, float] = defaultdict(float)
    first_start = None
    for run in instance.get_runs():
        for step in instance.get_run_step_stats(run.run_id):
            if step.start_time is None or step.start_time < since:
                continue
            first_start = step.start_time if first_start is None else min(first_start, step.start_time)
            if step.end_time is not None:
                per_step[step.step_key] += step.end_time - step.start_time
    instance.dispose()
    return {key: round(value, 2) for key, value in sorted(per_step.items())}, first_start


def ingest_only(name: str, documents: list[Path], out: Path) -> dict:
    home = out / f"{name}_home"
    shutil.rmtree(home, ignore_errors=True)
    first = run_ingest(documents, home)
    stop_embedded_postgres(home)
    return {
        "documents": len(documents),
        "ingest_seconds": first["seconds"],
        "peak_rss_mb": first["peak_rss_mb"],
        "failed": len(first["report"]["failed"]),
        "chunks": first["report"]["chunks"],
    }


def measure(name: str, documents: list[Path], out: Path) -> dict:
    with tempfile.TemporaryDirectory(dir=out) as scratch:
        images = page_images(documents, Path(scratch))
        plain = plain_pass_seconds(images)
    home = out / f"{name}_home"
    shutil.rmtree(home, ignore_errors=True)
    first = run_ingest(documents, home)
    steps, _ = step_seconds(home, first["launched"])
    again = run_ingest(documents, home)
    stop_embedded_postgres(home)

    smallest = min((d for d in documents if d.suffix.lower() == ".pdf"), key=lambda d: d.stat().st_size)
    one_home = out / f"{name}_one_home"
    shutil.rmtree(one_home, ignore_errors=True)
    one = run_ingest([smallest], one_home)
    _, first_step = step_seconds(one_home, one["launched"])
    stop_embedded_postgres(one_home)
    report = first["report"]
    return {
        "documents": len(documents),
        "plain_pass_images": len(images),
        "plain_pass_seconds": round(plain, 2),
        "ingest_seconds": first["seconds"],
        "ratio": round(first["seconds"] / plain, 3),
        "pages_per_second": round(len(images) / first["seconds"], 3),
        "images_per_second": round(report["images"] / first["seconds"], 3),
        "peak_rss_mb": first["peak_rss_mb"],
        "failed": len(report["failed"]),
        "images": report["images"],
        "images_enriched": report["images_enriched"],
        "chunks": report["chunks"],
        "step_seconds": steps,
        "unchanged_seconds": again["seconds"],
        "unchanged_share": round(again["seconds"] / first["seconds"], 3),
        "unchanged_documents": again["report"]["unchanged"],
        "one_file": smallest.name,
        "one_file_seconds": one["seconds"],
        "one_file_first_step_after": round(first_step - one["launched"], 2) if first_step else None,
        "one_file_peak_rss_mb": one["peak_rss_mb"],
    }


def median_of(runs: list[dict]) -> dict:
    """Each numeric figure's median over the runs (the step table of the median run by ingest time)."""
    middle = sorted(runs, key=lambda r: r["ingest_seconds"])[len(runs) // 2]
    summary = dict(middle)
    for key, value in middle.items():
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            summary[key] = statistics.median(r[key] for r in runs if r[key] is not None)
    summary["runs"] = len(runs)
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--set", choices=("mmlongbench", "corpus", "pdf", "all"), default="all")
    parser.add_argument("--ingest-only", action="store_true", help="the first ingest alone, for A/B timing")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--corpus", type=Path, default=DEFAULT_CORPUS)
    parser.add_argument("--out", type=Path, default=Path("/tmp/bench_real_ingest"))
    args = parser.parse_args()
    if not args.corpus.is_dir():
        raise SystemExit(f"no corpus at {args.corpus}")
    args.out.mkdir(parents=True, exist_ok=True)
    sets = document_sets(args.corpus)
    chosen = list(sets) if args.set == "all" else [args.set]
    run = ingest_only if args.ingest_only else measure
    results = {
        name: median_of([run(name, sets[name], args.out) for _ in range(args.repeat)]) for name in chosen
    }
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
