"""Re-enrich every (or some) partition on demand: in this process, or as a Dagster backfill for the daemon."""

from __future__ import annotations

from pathlib import Path

import dagster as dg

from vision_rag_pipeline.defs.host_inputs import host_input_tags
from vision_rag_pipeline.defs.jobs import REENRICH_SELECTION
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


def submit_reenrich_backfill(
    defs: dg.Definitions, instance: dg.DagsterInstance, partitions: list[str] | None = None
) -> str:
    """Queue the same work as a Dagster asset backfill for the daemon (shown under Backfills in the UI,
    bounded by the `vision_model` pool); returns the backfill id."""
    # No public Python API submits an asset backfill (only GraphQL and the CLI, which store this object).
    from dagster._core.execution.backfill import PartitionBackfill
    from dagster._core.utils import make_new_backfill_id
    from dagster._time import get_current_timestamp

    backfill = PartitionBackfill.from_asset_partitions(
        backfill_id=make_new_backfill_id(),
        asset_graph=defs.resolve_asset_graph(),
        partition_names=_partitions(instance, partitions),
        asset_selection=sorted(REENRICH_SELECTION.resolve(defs.resolve_asset_graph())),
        backfill_timestamp=get_current_timestamp(),
        tags={"vision_rag/backfill": "cli", **host_input_tags()},
        dynamic_partitions_store=instance,
        all_partitions=False,
        title="vision-rag re-enrichment",
        description="Re-enrich images and rebuild chunks, embeddings and index rows.",
        run_config=None,
    )
    instance.add_backfill(backfill)
    return backfill.backfill_id
