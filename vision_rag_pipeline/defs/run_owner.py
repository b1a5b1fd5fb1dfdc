"""Which process executes a run, so that a later process can give back what a killed one held.

The CLI's runs execute in-process (`execute_in_process`): no run launcher watches them, so
Dagster's run monitoring (a daemon feature that asks the launcher about the run worker) never
sees one die. A run killed with `kill -9` or by the OOM killer stays `STARTED` and keeps its
`vision_model` pool slots; every later run waits on that pool forever. Each run therefore
carries its process's identity in its tags (host, pid, process start time: pids are reused),
and every ingest or backfill first fails the runs whose process is gone and frees their slots.
The daemon's warm run workers (defs/warm_launcher.py) tag their runs the same way: a run waiting for a
worker names the launching process, a running one its worker.
"""

from __future__ import annotations

import os
import socket
from functools import cache

import dagster as dg
import psutil

HOST_TAG = "vision_rag/host"
PID_TAG = "vision_rag/pid"
PROCESS_STARTED_TAG = "vision_rag/process_started"
UNFINISHED = [
    dg.DagsterRunStatus.NOT_STARTED,
    dg.DagsterRunStatus.STARTING,
    dg.DagsterRunStatus.STARTED,
    dg.DagsterRunStatus.CANCELING,
]


@cache
def owner_tags() -> dict[str, str]:
    """Tags naming this process (cached: a process keeps its identity)."""
    return {
        HOST_TAG: socket.gethostname(),
        PID_TAG: str(os.getpid()),
        PROCESS_STARTED_TAG: f"{psutil.Process().create_time():.2f}",
    }


def owner_alive(tags: dict[str, str]) -> bool:
    """Whether the process named by a run's tags still runs (a process on another host is assumed to)."""
    if tags.get(HOST_TAG) != owner_tags()[HOST_TAG]:
        return True
    try:
        process = psutil.Process(int(tags[PID_TAG]))
        return (
            f"{process.create_time():.2f}" == tags.get(PROCESS_STARTED_TAG)
            and process.status() != psutil.STATUS_ZOMBIE
        )
    except (psutil.NoSuchProcess, ValueError, KeyError):
        return False


def reclaim_orphaned_runs(instance: dg.DagsterInstance) -> list[str]:
    """Fail the unfinished runs of this host whose process is gone, and free the pool slots held by
    those and by any ended run whose process is gone (or unknown: launched before these tags).

    Runs without our tags (launched through a code server) are left to Dagster.
    Returns the ids of the runs marked failed.
    """
    failed = []
    runs = instance.get_runs(
        filters=dg.RunsFilter(statuses=UNFINISHED, tags={HOST_TAG: owner_tags()[HOST_TAG]})
    )
    for run in runs:
        if PID_TAG in run.tags and not owner_alive(run.tags):
            instance.report_run_failed(
                run,
                f"Process {run.tags[PID_TAG]} executing this run is gone (killed or crashed); marked failed "
                f"and its concurrency slots freed by vision-rag (process {os.getpid()}).",
            )
            failed.append(run.run_id)
    storage = instance.event_log_storage
    holders = storage.get_concurrency_run_ids() if storage.supports_global_concurrency_limits else set()
    if holders:
        keep = {  # unfinished runs, and ended ones whose process may still be finishing a step
            run.run_id
            for run in instance.get_runs(filters=dg.RunsFilter(run_ids=list(holders)))
            if run.status in UNFINISHED or (PID_TAG in run.tags and owner_alive(run.tags))
        }
        for run_id in holders - keep:  # failed above, ended long ago, or deleted
            storage.free_concurrency_slots_for_run(run_id)
    return failed
