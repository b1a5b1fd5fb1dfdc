"""Re-enrich what a config change made stale, and nothing else.

Each derived asset's `code_version` is a hash of the settings that shape it (`enrichment.versioning`),
and Dagster records it on every materialization (tag `dagster/code_version`). Per partition this
sensor compares the recorded version with the current one; where they differ it requests a run of
that asset and everything downstream of it — never raw_documents or extracted_images, which no
setting changes. The enrichment cache and the embedding cache make the re-run pay only for images
and chunk texts that really changed.

A sensor rather than `AutomationCondition.code_version_changed()`: the condition compares with the
previous evaluation tick only, so a change deployed while the daemon was off, or a partition that
failed to re-run, would never be picked up again; the recorded versions are the durable truth.
"""

from __future__ import annotations

from typing import NamedTuple

import dagster as dg
from dagster import DagsterEventType

from vision_rag_pipeline.partitions import documents_partitions

CODE_VERSION_TAG = "dagster/code_version"
_FETCH_BATCH = 500


class Recorded(NamedTuple):
    storage_id: int  # of the latest materialization: changes with every new one
    version: str | None  # its code version; None when it was made before versioning


def recorded_versions(instance: dg.DagsterInstance, asset_key: dg.AssetKey) -> dict[str, Recorded]:
    """{partition: what its latest materialization of `asset_key` recorded}."""
    latest = instance.event_log_storage.get_latest_storage_id_by_partition(
        asset_key, DagsterEventType.ASSET_MATERIALIZATION
    )
    storage_ids = sorted(latest.values())
    tags_by_id: dict[int, dict[str, str]] = {}
    for start in range(0, len(storage_ids), _FETCH_BATCH):
        batch = storage_ids[start : start + _FETCH_BATCH]
        records = instance.fetch_materializations(
            dg.AssetRecordsFilter(asset_key=asset_key, storage_ids=batch), limit=len(batch)
        ).records
        tags_by_id.update({r.storage_id: dict(r.asset_materialization.tags or {}) for r in records})
    return {
        partition: Recorded(storage_id, tags_by_id.get(storage_id, {}).get(CODE_VERSION_TAG))
        for partition, storage_id in latest.items()
    }


def stale_assets_by_partition(
    instance: dg.DagsterInstance, current_versions: dict[dg.AssetKey, str], partitions: set[str]
) -> dict[str, dict[dg.AssetKey, Recorded]]:
    """{partition: {asset whose recorded version differs from the current one: what was recorded}}."""
    stale: dict[str, dict[dg.AssetKey, Recorded]] = {}
    for asset_key, version in current_versions.items():
        for partition, recorded in recorded_versions(instance, asset_key).items():
            if partition in partitions and recorded.version != version:
                stale.setdefault(partition, {})[asset_key] = recorded
    return stale


@dg.sensor(
    name="version_sensor",
    job_name="ingest_document",
    minimum_interval_seconds=60,
    default_status=dg.DefaultSensorStatus.RUNNING,
    description="When the enrichment, classifier, chunking or embedding settings change, re-runs the "
    "changed asset and its downstream assets for every partition materialized with the old settings.",
)
def version_sensor(context: dg.SensorEvaluationContext) -> dg.SensorResult:
    asset_graph = context.repository_def.asset_graph
    current_versions = {
        key: asset_graph.get(key).code_version
        for key in asset_graph.materializable_asset_keys
        if asset_graph.get(key).code_version is not None
    }
    partitions = set(context.instance.get_dynamic_partitions(documents_partitions.name))
    stale = stale_assets_by_partition(context.instance, current_versions, partitions)
    run_requests = []
    for partition, changed in sorted(stale.items()):
        selection = dg.AssetSelection.assets(*changed).downstream().resolve(asset_graph)
        run_requests.append(
            dg.RunRequest(
                partition_key=partition,
                asset_selection=sorted(selection, key=lambda key: key.to_user_string()),
                # One run per stale state, however many ticks see it before the run lands.
                run_key=f"{partition}:"
                + ",".join(
                    f"{key.to_user_string()}#{recorded.storage_id}@{current_versions[key]}"
                    for key, recorded in changed.items()
                ),
                tags={
                    "vision_rag/stale": ", ".join(
                        f"{key.to_user_string()} {recorded.version or 'unversioned'} -> "
                        f"{current_versions[key]}"
                        for key, recorded in changed.items()
                    )
                },
            )
        )
    return dg.SensorResult(run_requests=run_requests)


# --- backfills: re-enrich every (or some) partition on demand ------------------------------------------

REENRICH_ASSETS = (
    "image_enrichments",
    "document_chunks",
    "chunk_embeddings",
    "pgvector_index",
    "lexical_index",
)
_QUIET_CONSOLE = {"loggers": {"console": {"config": {"log_level": "WARNING"}}}}


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
    defs: dg.Definitions, instance: dg.DagsterInstance, partitions: list[str] | None = None
) -> list[dict]:
    """Materialize enrichments → chunks → embeddings → indexes for each partition, one run each, in this
    process (models load once). Returns per partition: success, enrichment calls, cache hits, chunks."""
    job = defs.resolve_job_def("reenrich")
    report = []
    for partition in _partitions(instance, partitions):
        result = job.execute_in_process(
            instance=instance,
            partition_key=partition,
            raise_on_error=False,
            run_config=_QUIET_CONSOLE,
            tags={"vision_rag/backfill": "cli"},
        )
        entry: dict = {"partition": partition, "success": result.success, "run_id": result.run_id}
        if result.success:
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
    from dagster._core.execution.backfill import PartitionBackfill
    from dagster._core.utils import make_new_backfill_id
    from dagster._time import get_current_timestamp

    backfill = PartitionBackfill.from_asset_partitions(
        backfill_id=make_new_backfill_id(),
        asset_graph=defs.resolve_asset_graph(),
        partition_names=_partitions(instance, partitions),
        asset_selection=[dg.AssetKey(name) for name in REENRICH_ASSETS],
        backfill_timestamp=get_current_timestamp(),
        tags={"vision_rag/backfill": "cli"},
        dynamic_partitions_store=instance,
        all_partitions=False,
        title="vision-rag re-enrichment",
        description="Re-enrich images and rebuild chunks, embeddings and index rows.",
        run_config=None,
    )
    instance.add_backfill(backfill)
    return backfill.backfill_id
