"""The project's definitions under another Dagster executor, as a code location for bench_daemon.py.

    dagster-daemon run -f bench/daemon_executors.py      # BENCH_EXECUTOR=multiprocess|forkserver|in_process

`multiprocess` is Dagster's default (each step in a spawned process); `forkserver` forks each step
from a server that imported the definitions and torch once per run; `in_process` runs every step
in the run's own process. Everything else is the project's `defs`.
"""

import os

import dagster as dg

from vision_rag_pipeline.defs import definitions as project  # its `defs`: one Definitions at module scope

PRELOAD = ["vision_rag_pipeline.definitions", "torch"]
EXECUTORS = {
    "multiprocess": dg.multiprocess_executor,
    "forkserver": dg.multiprocess_executor.configured(
        {"start_method": {"forkserver": {"preload_modules": PRELOAD}}}
    ),
    "in_process": dg.in_process_executor,
}

defs = dg.Definitions(
    assets=project.defs.assets,
    asset_checks=project.defs.asset_checks,
    jobs=project.defs.jobs,
    sensors=project.defs.sensors,
    schedules=project.defs.schedules,
    resources=project.defs.resources,
    executor=EXECUTORS[os.environ["BENCH_EXECUTOR"]],
)
