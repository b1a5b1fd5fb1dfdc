"""Cost of an inbox sensor tick over a large, unchanged inbox: time, memory, file reads and writes.

    PYTHONPATH=$PWD .venv/bin/python bench/bench_inbox_tick.py --files 100000 --ticks 7 [--home /tmp/bench_inbox_home]

Writes N small PDF files (1,000 per folder) into a fresh inbox, lets one tick register them all, then
measures T ticks with nothing changed in a fresh process: the median wall time, the process's peak RSS
(and its RSS before the first tick, i.e. what importing the code location costs), how many files were
read (sniffed or hashed) and how many registry rows were written. The sensor function is called
exactly as the daemon calls it, through `build_sensor_context`.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path


def _sensor_tick(instance: object) -> object:
    import dagster as dg

    from vision_rag_pipeline.defs.inbox import inbox_sensor
    from vision_rag_pipeline.defs.resources import IndexDatabase

    context = dg.build_sensor_context(instance=instance, resources={"index_db": IndexDatabase()})
    return inbox_sensor(context)


def _instance() -> object:
    """One instance for every tick, as the daemon has (without one, each context builds its own)."""
    import dagster as dg

    import vision_rag_pipeline.defs.inbox  # noqa: F401  (imported outside the timings)
    from vision_rag_pipeline.documents.registry import DocumentRegistry

    DocumentRegistry()  # the embedded server started and the schema applied, outside the timings
    return dg.DagsterInstance.ephemeral()


def measure(ticks: int) -> dict:
    """T unchanged ticks in this (fresh) process."""
    import psutil

    from vision_rag_pipeline.core.postgres import connect
    from vision_rag_pipeline.documents import inbox as inbox_module

    reads = [0]
    for name in ("file_sha256", "why_not_a_document"):
        original = getattr(inbox_module, name)

        def counted(*args, _original=original):
            reads[0] += 1
            return _original(*args)

        setattr(inbox_module, name, counted)
    instance = _instance()
    rss_before = psutil.Process().memory_info().rss
    with connect() as conn:
        [(since,)] = conn.execute("SELECT pg_current_xact_id()::text::bigint").fetchall()
    seconds = []
    for _ in range(ticks):
        started = time.perf_counter()
        result = _sensor_tick(instance)
        seconds.append(time.perf_counter() - started)
    with connect() as conn:
        [(written,)] = conn.execute(
            "SELECT count(*) FROM documents WHERE xmin::text::bigint > %s", (since,)
        ).fetchall()
    return {
        "result": type(result).__name__,
        "tick_s_median": round(statistics.median(seconds), 3),
        "tick_s_min": round(min(seconds), 3),
        "tick_s_max": round(max(seconds), 3),
        "rss_mb_before_ticks": round(rss_before / 2**20, 1),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "files_read": reads[0],
        "registry_rows_written": written,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=100_000)
    parser.add_argument("--ticks", type=int, default=7)
    parser.add_argument("--home", type=Path, default=Path("/tmp/bench_inbox_home"))
    parser.add_argument("--measure", action="store_true", help=argparse.SUPPRESS)  # the child process
    args = parser.parse_args()
    os.environ["VISION_RAG_HOME"] = str(args.home)
    os.environ["VISION_RAG_INBOX"] = str(args.home / "inbox")
    if args.measure:
        print(json.dumps(measure(args.ticks)))
        return

    shutil.rmtree(args.home, ignore_errors=True)
    inbox = args.home / "inbox"
    started = time.perf_counter()
    for i in range(args.files):
        folder = inbox / f"batch-{i // 1000:04d}"
        if i % 1000 == 0:
            folder.mkdir(parents=True)
        (folder / f"report-{i:06d}.pdf").write_bytes(b"%%PDF-1.4\n%% document %d\n%%%%EOF\n" % i)
    written_s = time.perf_counter() - started
    try:
        instance = _instance()
        started = time.perf_counter()
        first = _sensor_tick(instance)
        first_s = time.perf_counter() - started
        child = subprocess.run(
            [sys.executable, __file__, "--measure", "--ticks", str(args.ticks), "--home", str(args.home)],
            check=True,
            capture_output=True,
            text=True,
        )
        report = {
            "files": args.files,
            "write_files_s": round(written_s, 1),
            "first_tick_s": round(first_s, 1),
            "first_tick_run_requests": len(first.run_requests),
            "first_tick_cursor": first.cursor,
            **json.loads(child.stdout.strip().splitlines()[-1]),
        }
        print(json.dumps(report, indent=2))
    finally:
        postmaster = args.home / "pgdata" / "postmaster.pid"
        if postmaster.exists():
            os.kill(int(postmaster.read_text().split()[0]), signal.SIGINT)  # the embedded server we started


if __name__ == "__main__":
    main()
