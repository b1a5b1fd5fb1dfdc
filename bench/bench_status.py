"""`vision-rag status` over a large registry: the whole command's wall time, as a user runs it.

    PYTHONPATH=$PWD .venv/bin/python bench/bench_status.py [--documents 100000] [--runs 5] [--work /tmp/bench_status]

Starts an embedded Postgres in a fresh home and registers `--documents` files through the registry's
own path (`DocumentRegistry.register`: the file's bytes copied, its fate `requested`), refusing one in
a thousand (`DocumentRegistry.refuse`, as a door does). The registered ones are then marked ingested
in one statement, as their runs' outcomes would have been recorded, a few left failed. Then times
`vision-rag status` (the summary and the files needing a look) and `vision-rag status FILE` (one
file by name) as whole processes, `--runs` times each; prints the medians as JSON.
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--documents", type=int, default=100_000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--work", type=Path, default=Path("/tmp/bench_status"))
    args = parser.parse_args()
    shutil.rmtree(args.work, ignore_errors=True)
    (args.work / "files").mkdir(parents=True)
    os.environ |= {
        "VISION_RAG_HOME": str(args.work / "home"),
        "DAGSTER_HOME": str(args.work / "home" / "dagster"),
    }

    from vision_rag_pipeline.core.postgres import connect, database_url, stop_embedded
    from vision_rag_pipeline.documents.registry import DocumentRegistry

    database_url()  # starts the home's embedded Postgres
    registry = DocumentRegistry()
    started = time.perf_counter()
    for number in range(args.documents):
        path = args.work / "files" / f"report-{number:06d}.pdf"
        path.write_bytes(b"%PDF-1.4\n% report " + str(number).encode() + b"\n%%EOF\n")
        if number % 1000 == 999:
            registry.refuse(path, "inbox", f"{path.name}: not an MHTML web archive or a PDF")
        else:
            registry.register(path, "inbox")
        path.unlink()
    registering = time.perf_counter() - started
    with connect() as conn:  # the outcomes the runs would have recorded
        conn.execute("UPDATE documents SET state = 'ingested', attempts = 1 WHERE state = 'requested'")
        conn.execute(
            "UPDATE documents SET state = 'failed', reason = 'not a readable PDF' WHERE document_id IN"
            " (SELECT document_id FROM documents WHERE state = 'ingested' ORDER BY document_id LIMIT 20)"
        )
        conn.execute("ANALYZE documents")  # VACUUM cannot run inside connect()'s transaction

    def timed(*argv: str) -> float:
        begun = time.perf_counter()
        subprocess.run(
            [sys.executable, "-m", "vision_rag_pipeline.cli", "status", *argv],
            env=os.environ | {"PYTHONPATH": str(REPO)},
            capture_output=True,
            check=False,
        )
        return time.perf_counter() - begun

    try:
        summary = [timed() for _ in range(args.runs)]
        one = [timed(f"report-{args.documents // 2:06d}.pdf") for _ in range(args.runs)]
    finally:
        stop_embedded(args.work / "home" / "pgdata")
    print(
        json.dumps(
            {
                "documents": args.documents,
                "registering_seconds": round(registering, 1),
                "status_seconds_median": round(statistics.median(summary), 2),
                "status_seconds": [round(s, 2) for s in summary],
                "status_one_file_seconds_median": round(statistics.median(one), 2),
            }
        )
    )


if __name__ == "__main__":
    main()
