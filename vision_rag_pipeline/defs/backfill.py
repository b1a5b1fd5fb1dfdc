"""Re-enrich every (or some) partition on demand: in this process, or as a Dagster backfill for the daemon."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import dagster as dg

from vision_rag_pipeline.defs.host_inputs import host_input_tags
from vision_rag_pipeline.defs.partitions import documents_partitions
from vision_rag_pipeline.defs.run_owner import owner_tags, reclaim_orphaned_runs
from vision_rag_pipeline.defs.runner import console_config, failure_reason, instance_lock


class UnknownPartitionError(ValueError):
    """A partition named on the command line is not a registered document."""


def _partitions(instance: dg.DagsterInstance, wanted: list[str] | None) -> list[str]:
    known = instance.get_dynamic_partitions(documents_partitions.name)
    if not wanted:
        return list(known)
    unknown = sorted(set(wanted) - set(known))
    if unknown:
        raise UnknownPartitionError(f"no such document partition: {', '.join(unknown)}")
    return list(dict.fromkeys(wanted))


def run_reenrich_backfill(
    defs: dg.Definitions,
    instance: dg.DagsterInstance,
    partitions: list[str] | None = None,
    verbose: bool = False,
) -> list[dict]:
    """Materialize enrichments → chunks → embeddings → indexes for each partition, one run each, in this
    process (models load once). Returns per partition: success, enrichment calls, cache hits, chunks
    (or the error on one line)."""
    job = defs.resolve_job_def("reenrich")
    with instance_lock(Path(instance.root_directory)):
        reclaim_orphaned_runs(instance)  # a killed run's pool slots would block these runs for good
    report = []
    for partition in _partitions(instance, partitions):
        result = job.execute_in_process(
            instance=instance,
            partition_key=partition,
            raise_on_error=False,
            run_config=console_config(verbose),
            tags={"vision_rag/backfill": "cli"} | owner_tags(),
        )
        entry: dict = {"partition": partition, "success": result.success, "run_id": result.run_id}
        if not result.success:
            entry["error"] = failure_reason(result)
        else:
            batch = result.output_for_node("image_enrichments")
            entry |= {
                "enrichment_calls": batch.calls,
                "cache_hits": batch.cache_hits,
                "chunks": len(result.output_for_node("document_chunks")),
            }
        report.append(entry)
    return report


# Partitions per Dagster backfill. `dagster job backfill` creates and queues a backfill's runs in its own
# process and records the backfill once all are queued: an interrupted submission leaves at most one
# chunk's runs without their backfill (about 5 minutes of them at the rate in BENCHMARKS.md "Catalog of
# 100,000 documents"). 2,000 keys also keep one `--partitions` argument well under Linux's 128 KiB.
BACKFILL_CHUNK = 2000
_MAX_ARGUMENT_BYTES = 100_000


def submit_reenrich_backfill(
    instance: dg.DagsterInstance,
    partitions: list[str] | None = None,
    progress: Callable[[str], None] = lambda _: None,
) -> list[str]:
    """Queue the same work as backfills of the `reenrich` job for the daemon, one queued run per
    partition (bounded by the `vision_model` pool), in chunks of `BACKFILL_CHUNK` partitions; returns
    the backfill ids. Every chunk's runs carry one `vision_rag/backfill` tag, so the UI's run list
    filters them together.

    Through Dagster's own `dagster job backfill`, which creates and queues each chunk's runs (about
    7 a second at 100,000 partitions, BENCHMARKS.md): a job backfill is listed on the job's page (Jobs →
    reenrich → Partitions, "Backfill history") as well as under Runs → Backfills; an asset backfill,
    which Python could only create through private classes, appeared under Runs → Backfills alone.
    Every partition is named by ranges (`--from`/`--to` over the partitions' order), a selection by
    lists of keys, so no argument grows with the catalog.
    """
    known = instance.get_dynamic_partitions(documents_partitions.name)
    names = _partitions(instance, partitions) if partitions else list(known)
    if not names:
        raise UnknownPartitionError("no document partitions to backfill yet")
    tags = json.dumps({"vision_rag/backfill": f"cli-{uuid.uuid4().hex[:8]}", **host_input_tags()})
    if partitions:
        selections = [("--partitions", ",".join(chunk)) for chunk in _argument_chunks(names)]
    else:
        selections = [
            ("--from", names[start], "--to", names[min(start + BACKFILL_CHUNK, len(names)) - 1])
            for start in range(0, len(names), BACKFILL_CHUNK)
        ]
    backfill_ids = []
    for number, selection in enumerate(selections, start=1):
        backfill_ids.append(_job_backfill(instance, selection, tags))
        progress(f"backfill {backfill_ids[-1]}: {number} of {len(selections)} submitted")
    return backfill_ids


def _argument_chunks(names: list[str]) -> Iterator[list[str]]:
    """The names in order, at most BACKFILL_CHUNK and _MAX_ARGUMENT_BYTES (joined) a chunk."""
    chunk: list[str] = []
    size = 0
    for name in names:
        if chunk and (len(chunk) == BACKFILL_CHUNK or size + len(name.encode()) + 1 > _MAX_ARGUMENT_BYTES):
            yield chunk
            chunk, size = [], 0
        chunk.append(name)
        size += len(name.encode()) + 1
    if chunk:
        yield chunk


def _job_backfill(instance: dg.DagsterInstance, selection: tuple[str, ...], tags: str) -> str:
    done = subprocess.run(
        [
            str(Path(sys.executable).parent / "dagster"),
            *("job", "backfill", "-m", "vision_rag_pipeline.definitions", "-j", "reenrich"),
            *selection,
            *("--tags", tags, "--noprompt"),
        ],
        env=os.environ | {"DAGSTER_HOME": instance.root_directory},
        capture_output=True,
        text=True,
    )
    launched = re.search(r"Launched backfill job `([^`]+)`", done.stdout)
    if done.returncode or not launched:
        lines = (done.stderr or done.stdout).strip().splitlines()
        raise RuntimeError(f"dagster job backfill failed: {lines[-1] if lines else done.returncode}")
    return launched.group(1)
