"""Does a document cost the same as the 1,000th as the 10th? Run time and memory across one long ingest.

    .venv/bin/python bench/bench_scale.py [--docs 1000] [--from /tmp/bench_ingest/docs] [--out /tmp/bench_scale]

Ingests `--docs` files in one `vision-rag ingest --json` (default workers, fresh home): the documents
`bench/bench_ingest.py` generated, copied under new names until there are enough. A copy's images
and texts are in the caches already, so after the first round a document costs its Dagster run,
its partition and its index writes: what could grow with the number of documents ingested so far
(run and event storage, registry, indexes) shows undiluted by OCR. Reports the median run time of
the first, middle and last hundred runs (in the order they started), the peak RSS per tenth of the
ingest (sampled every 0.5 s) of the CLI with its workers and, apart, of Postgres' processes when
they are in the tree, and documents/s.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import threading
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[1]


def tree_rss(process: psutil.Process) -> dict[str, int]:
    """RSS of the process tree, Postgres apart (its backends each count the shared buffers they touched)."""
    total = {"vision-rag": 0, "postgres": 0}
    for member in [process, *process.children(recursive=True)]:
        try:
            total["postgres" if member.name().startswith("postgres") else "vision-rag"] += (
                member.memory_info().rss
            )
        except psutil.Error:
            continue
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs", type=int, default=1000)
    parser.add_argument("--from", dest="source", type=Path, default=Path("/tmp/bench_ingest/docs"))
    parser.add_argument("--out", type=Path, default=Path("/tmp/bench_scale"))
    args = parser.parse_args()
    originals = sorted(p for p in args.source.glob("*") if p.suffix in (".mhtml", ".pdf"))
    if not originals:
        raise SystemExit(f"{args.source}: no documents; run bench/bench_ingest.py first")
    shutil.rmtree(args.out, ignore_errors=True)
    docs = args.out / "docs"
    docs.mkdir(parents=True)
    files = []
    for number in range(args.docs):
        original = originals[number % len(originals)]
        copy = docs / f"{number:05d}-{original.name}"
        shutil.copyfile(original, copy)
        files.append(str(copy))
    home = args.out / "home"
    env = os.environ | {"VISION_RAG_HOME": str(home), "DAGSTER_HOME": str(home / "dagster")}
    for key in ("OPENAI_API_KEY", "OPENAI_BASE_URL"):
        env.pop(key, None)

    samples: list[tuple[float, dict[str, int]]] = []
    started = time.perf_counter()
    process = subprocess.Popen(
        [str(REPO / ".venv" / "bin" / "vision-rag"), "ingest", *files, "--json"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    watched = psutil.Process(process.pid)

    def sample() -> None:
        while process.poll() is None:
            samples.append((time.perf_counter() - started, tree_rss(watched)))
            time.sleep(0.5)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    out, _ = process.communicate()
    wall = time.perf_counter() - started
    sampler.join()
    report = json.loads(out[out.index("{") :])

    os.environ.update({"VISION_RAG_HOME": str(home), "DAGSTER_HOME": str(home / "dagster")})
    from vision_rag_pipeline.defs.runner import dagster_instance

    instance = dagster_instance()
    runs = sorted(
        (stats.start_time, stats.end_time - stats.start_time)
        for run in instance.get_runs()
        if (stats := instance.get_run_stats(run.run_id)).start_time and stats.end_time
    )
    seconds = [duration for _, duration in runs]
    middle = len(seconds) // 2
    tenths = {
        part: [
            max((rss[part] for at, rss in samples if wall * i / 10 <= at < wall * (i + 1) / 10), default=0)
            // 2**20
            for i in range(10)
        ]
        for part in ("vision-rag", "postgres")
    }
    subprocess.run(
        [str(REPO / ".venv" / "bin" / "vision-rag"), "db", "stop"], env=env, capture_output=True, check=False
    )
    print(
        json.dumps(
            {
                "documents": report["documents"],
                "failed": len(report["failed"]),
                "runs": len(seconds),
                "documents_per_second": round(report["documents"] / wall, 3),
                "run_seconds_median": {
                    "first_100": round(statistics.median(seconds[:100]), 3),
                    "middle_100": round(statistics.median(seconds[middle - 50 : middle + 50]), 3),
                    "last_100": round(statistics.median(seconds[-100:]), 3),
                },
                "peak_rss_mb_per_tenth": tenths,
                "load_average": [round(x, 2) for x in os.getloadavg()],
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
