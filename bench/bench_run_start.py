"""What a run costs in a cold process against a warm one: the tax every daemon-launched run pays.

    PYTHONPATH=$PWD .venv/bin/python bench/bench_run_start.py [FILE] [--runs 3] [--home /tmp/bench_run_start]

First ingests FILE with `vision-rag ingest` into a fresh home (Postgres started, caches filled). Then,
in this fresh process: the CPU of importing Dagster's command-line module (what a run worker spawned
by the code server imports first) and the project's definitions, then of the document's ingest run
repeated here (`--force`, in-process, enrichments and vectors from the caches every time). The first
run also pays torch's import, the model load and every first-use path; the later ones are what a
warm worker (the CLI's) pays per document. Postgres' own CPU is not counted.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

SAMPLE = Path(__file__).resolve().parents[1] / "vision_rag_pipeline" / "samples"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "file", nargs="?", type=Path, default=SAMPLE / "larkspur_q3_2024_operations_review.pdf"
    )
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--home", type=Path, default=Path("/tmp/bench_run_start"))
    args = parser.parse_args()
    shutil.rmtree(args.home, ignore_errors=True)
    os.environ.update({"VISION_RAG_HOME": str(args.home), "DAGSTER_HOME": str(args.home / "dagster")})
    subprocess.run(
        [sys.executable, "-m", "vision_rag_pipeline.cli", "ingest", str(args.file)],
        check=True,
        capture_output=True,
    )

    started = time.process_time()
    import dagster._cli  # noqa: F401  (a spawned run worker's main module imports it)

    cli_import = time.process_time() - started
    import vision_rag_pipeline.definitions  # noqa: F401
    from vision_rag_pipeline.core.postgres import stop_embedded
    from vision_rag_pipeline.defs.runner import ingest_paths

    project_import = time.process_time() - started - cli_import
    runs = []
    try:
        for _ in range(args.runs):
            before = time.process_time()
            report = ingest_paths([str(args.file)], workers=1, force=True)
            assert report.documents == 1 and not report.failed, report.failed
            runs.append(round(time.process_time() - before, 2))
    finally:
        stop_embedded(args.home / "pgdata")
    print(
        json.dumps(
            {
                "dagster_cli_import_cpu": round(cli_import, 2),
                "definitions_import_cpu": round(project_import, 2),
                "run_cpu": runs,  # the first, then warm
                "cold_minus_warm_cpu": round(cli_import + project_import + runs[0] - runs[-1], 2),
            }
        )
    )


if __name__ == "__main__":
    main()
