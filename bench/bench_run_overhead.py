"""Per-document CPU of one ingest process, split into the asset functions and Dagster's bookkeeping.

    .venv/bin/python bench/bench_run_overhead.py --docs 8 [--from /tmp/bench_ingest/docs] [--home /tmp/overhead_home] [--parts] [--storage dagster]

Ingests the first two documents to warm up (models, schema), then N more in this process, one
Dagster run each (`ingest_paths(..., workers=1)`). Bookkeeping = the process's CPU time minus the
CPU spent inside asset compute functions; it is what Dagster's run, event and partition storage
cost per document. Also prints the events stored by the last run; with --parts, the CPU per
document of the parts of the bookkeeping named in PARTS (timed around those functions; creating
the run includes writing its planned events, which storing events counts too). With --storage
dagster the home's dagster.yaml names Dagster's own SQLite storages (`storage: sqlite`) and compute
log manager instead of defs/local_storage.py's, the rest of the instance unchanged: what the local
storage saves, for BENCHMARKS.md. Child CPU (the compute log manager's `tail` processes) is
reported apart.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
import os
import resource
import shutil
import time
from collections.abc import Callable
from pathlib import Path

PARTS = {  # what the figure is, -> the functions timed (module, attribute path)
    "storing events": [("dagster._core.instance.methods.event_methods", "EventMethods.handle_new_event")],
    "creating the run": [("dagster._core.instance.runs.run_domain", "RunDomain.create_run_for_job")],
    "input data versions": [
        (
            "dagster._core.execution.context.data_version_cache",
            "DataVersionCache._fetch_input_asset_version_info",
        )
    ],
    "check target materializations": [
        (
            "dagster._core.definitions.asset_checks.asset_check_result",
            "AssetCheckResult._get_target_materialization_data",
        )
    ],
    "asset values in and out of Postgres": [
        ("vision_rag_pipeline.defs.io_manager", "PostgresAssetIOManager.load_input"),
        ("vision_rag_pipeline.defs.io_manager", "PostgresAssetIOManager.handle_output"),
    ],
}


def timed(fn: Callable, spent: dict[str, float], part: str) -> Callable:
    """`fn` adding its CPU time to spent[part]; a generator's time is taken across its steps."""

    def steps(gen):
        while True:
            started = time.process_time()
            try:
                item = next(gen)
            except StopIteration as stop:
                return stop.value
            finally:
                spent[part] += time.process_time() - started
            yield item

    def call(*a, **k):
        if inspect.isgeneratorfunction(fn):
            return steps(fn(*a, **k))
        started = time.process_time()
        try:
            return fn(*a, **k)
        finally:
            spent[part] += time.process_time() - started

    return call


def time_parts() -> dict[str, float]:
    """Wrap the functions of PARTS; returns the CPU seconds each part has spent, updated as they run."""
    spent = dict.fromkeys(PARTS, 0.0)
    for part, functions in PARTS.items():
        for module, path in functions:
            owner_name, name = path.split(".")
            owner = getattr(importlib.import_module(module), owner_name)
            setattr(owner, name, timed(getattr(owner, name), spent, part))
    return spent


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def write_dagster_storage_config() -> None:
    """The home's dagster.yaml with Dagster's SQLite storages and compute log manager in place of
    defs/local_storage.py's; without vision-rag's header line, so vision-rag leaves it as it is."""
    import yaml

    from vision_rag_pipeline.core.config import dagster_home
    from vision_rag_pipeline.defs.local_storage import HOME_SUBDIRS
    from vision_rag_pipeline.defs.runner import LOCAL_INSTANCE_BODY

    home = dagster_home()
    config = yaml.safe_load(LOCAL_INSTANCE_BODY)
    for storage in HOME_SUBDIRS:
        del config[storage]
    config["storage"] = {"sqlite": {"base_dir": str(home)}}
    home.mkdir(parents=True)
    (home / "dagster.yaml").write_text(yaml.safe_dump(config, sort_keys=False))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs", type=int, default=8)
    parser.add_argument("--from", dest="source", type=Path, default=Path("/tmp/bench_ingest/docs"))
    parser.add_argument("--home", type=Path, default=Path("/tmp/overhead_home"))
    parser.add_argument("--parts", action="store_true", help="also time the parts of the bookkeeping")
    parser.add_argument("--storage", choices=["local", "dagster"], default="local")
    args = parser.parse_args()
    shutil.rmtree(args.home, ignore_errors=True)
    os.environ["VISION_RAG_HOME"] = str(args.home)
    os.environ["VISION_RAG_INGEST_WORKERS"] = "1"
    if args.storage == "dagster":
        write_dagster_storage_config()

    import dagster._core.execution.plan.compute_generator as compute_generator

    from vision_rag_pipeline.defs import runner as ingest

    ingest.quiet_library_noise()
    files = sorted(str(p) for p in args.source.iterdir() if p.suffix.lower() in (".mhtml", ".mht", ".pdf"))
    ingest.ingest_paths(files[:2], workers=1)

    in_assets = [0.0]
    invoke = compute_generator.invoke_compute_fn

    def timed_invoke(*a, **k):  # the asset's own code, as Dagster calls it
        started = time.process_time()
        try:
            return invoke(*a, **k)
        finally:
            in_assets[0] += time.process_time() - started

    compute_generator.invoke_compute_fn = timed_invoke
    parts = time_parts() if args.parts else {}
    cpu, wall, child = time.process_time(), time.perf_counter(), children_cpu()
    report = ingest.ingest_paths(files[2 : 2 + args.docs], workers=1)
    cpu, wall, child = time.process_time() - cpu, time.perf_counter() - wall, children_cpu() - child
    instance = ingest.dagster_instance()
    last_run = instance.get_runs(limit=1)[0]
    n = max(1, report.documents)
    print(
        json.dumps(
            {
                "documents": report.documents,
                "wall_s_per_doc": round(wall / n, 3),
                "cpu_s_per_doc": round(cpu / n, 3),
                "asset_code_cpu_s_per_doc": round(in_assets[0] / n, 3),
                "dagster_bookkeeping_cpu_s_per_doc": round((cpu - in_assets[0]) / n, 3),
                "child_process_cpu_s_per_doc": round(child / n, 3),
                "events_per_run": len(instance.all_logs(last_run.run_id)),
                **(
                    {"parts_cpu_s_per_doc": {part: round(cpu / n, 4) for part, cpu in parts.items()}}
                    if parts
                    else {}
                ),
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
