"""Ingest throughput and warm search latency, offline, on generated documents.

    .venv/bin/python bench/bench_ingest.py --docs 100 [--out /tmp/bench_ingest]

Generates N documents with `bench/evalset.py` (a few images each), ingests them all through
`vision-rag ingest --json` in a fresh VISION_RAG_HOME (one Dagster run per document), then times
warm searches in-process. Prints one JSON object; medians, not means (the machine is shared).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
QUERIES = [
    "What was revenue in Q3?",
    "customer churn percentage",
    "net promoter score",
    "how many support tickets were opened",
    "board approved dividend per share",
    "warehouse lease square feet",
    "on-time delivery rate against target",
    "employees at the end of the quarter",
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs", type=int, default=100)
    parser.add_argument("--out", type=Path, default=Path("/tmp/bench_ingest"))
    parser.add_argument("--seed", type=int, default=11)
    args = parser.parse_args()

    docs_dir = args.out / "docs"
    if not docs_dir.exists():
        subprocess.run(
            [
                sys.executable,
                str(REPO / "bench" / "evalset.py"),
                "generate",
                str(args.out),
                "--docs",
                str(args.docs),
                "--seed",
                str(args.seed),
            ],
            check=True,
            stdout=subprocess.DEVNULL,
        )
    files = sorted(str(p) for p in docs_dir.iterdir() if p.suffix in (".mhtml", ".pdf"))[: args.docs]
    home = args.out / "home"
    shutil.rmtree(home, ignore_errors=True)
    env = os.environ | {"VISION_RAG_HOME": str(home), "DAGSTER_HOME": str(home / "dagster")}
    env.pop("OPENAI_API_KEY", None)
    env.pop("OPENAI_BASE_URL", None)

    started = time.perf_counter()
    proc = subprocess.run(
        [str(REPO / ".venv" / "bin" / "vision-rag"), "ingest", *files, "--json"],
        env=env,
        capture_output=True,
        text=True,
    )
    wall = time.perf_counter() - started
    report = json.loads(proc.stdout)

    os.environ.update({"VISION_RAG_HOME": str(home), "DAGSTER_HOME": str(home / "dagster")})
    from vision_rag_pipeline.query import search

    search(text="warm up", k=5)
    latencies = {}
    for mode in ("hybrid", "vector", "lexical"):
        samples = []
        for _ in range(3):
            for query in QUERIES:
                t0 = time.perf_counter()
                search(text=query, k=5, mode=mode)
                samples.append((time.perf_counter() - t0) * 1000)
        latencies[mode] = round(statistics.median(samples), 1)

    print(
        json.dumps(
            {
                "documents": report["documents"],
                "failed": len(report["failed"]),
                "images": report["images"],
                "images_enriched": report["images_enriched"],
                "chunks": report["chunks"],
                "ingest_seconds_in_cli": report["seconds"],
                "wall_seconds_incl_startup": round(wall, 1),
                "documents_per_second": round(report["documents"] / report["seconds"], 3),
                "search_median_ms": latencies,
                "cpus": os.cpu_count(),
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
