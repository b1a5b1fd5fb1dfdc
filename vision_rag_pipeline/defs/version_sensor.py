"""`version_sensor`: when a setting or a code revision changes an asset's version (defs/versions.py),
every partition materialized with the old one is re-run from that asset on, in one request.

Each tick compares, per partition, the version recorded on the latest materialization (tag
`dagster/code_version`) with the one its code location computed from the config in effect when it
loaded (the same versions the UI shows). The recorded versions come from `version_index.py`, which
reads each materialization once, when it is new, into a table of the index database: a tick costs the
new materializations and one query, not a read of every partition's events (which took 45-56 s a tick
at 10,000 documents). After an edit of the config file the sensor waits for its code location's next
load, which `dagster-daemon run` makes every minute: runs started meanwhile read the new file, and
comparing them with the old versions would re-run what they just did.

The stale partitions are requested through the one way in (defs/intake.py) as `vision-rag backfill`
requests them: one statement in the registry for all of them, in partition order, and the
`ingest_requests` sensor turns them into runs of batches of consecutive partitions, a bounded number
a tick. The tick itself submits no run, so it stays short however many partitions a change made
stale. A partition whose document a run is already asked for or working on is left to that run and
compared again once it materialized. The enrichment and embedding caches make a re-run pay only for
images and chunk texts that really changed.

A sensor rather than `AutomationCondition.code_version_changed()`: the condition compares with the
previous evaluation tick only, so a change deployed while the daemon was off, or a partition that
failed to re-run, would never be picked up again; the recorded versions are the durable truth. The
registry's request rather than a Dagster asset backfill: a sensor can start one only through
`RunRequest.for_asset_graph_subset`, which Dagster keeps private (its `AssetGraphSubset` is not public
API), an asset backfill over 100,000 partitions started about 8 runs a minute, and documents
requested through the registry get the same batches, fates and recovery as every other door's.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence

import dagster as dg

from vision_rag_pipeline.core.config import config_in_effect, sensor_interval_seconds
from vision_rag_pipeline.core.config_in_use import last_config_used, say_once_if_different
from vision_rag_pipeline.core.deadline import Deadline
from vision_rag_pipeline.defs.intake import request_documents
from vision_rag_pipeline.defs.jobs import ingest_document_job, reenrich_job
from vision_rag_pipeline.defs.version_index import (
    Staleness,
    forget_partitions,
    mark_requested,
    new_catalog,
    read_new_materializations,
    stale,
)
from vision_rag_pipeline.defs.versions import code_versions
from vision_rag_pipeline.documents.registry import DocumentRegistry

# A tick stays within TICK_BUDGET_S of its start (a `Deadline`; 10 s a tick is the target, the rest is
# Dagster's around the call): reading new materializations takes at most READ_BUDGET_S of it, a batch
# at a time, the rest read by the next ticks from where it stopped; the comparison runs only where
# the time left holds what the last one took, else at the start of the next tick; the re-runs are
# requested REQUEST_CHUNK at a time while time is left, the others by the next ticks.
TICK_BUDGET_S = 8.0
READ_BUDGET_S = 3.0
REQUEST_CHUNK = 1000
# Requested a tick at most: the registry's update of 100,000 documents took 12.6 s on 2 shared cores,
# 5,000 take well under a second, and 5,000 a minute stay ahead of the runs ingest_requests starts
# (BENCHMARKS.md "Catalog of 100,000 documents").
REQUESTS_PER_TICK = 5000
# The registry's job for a partition whose first stale asset is this one: `reenrich` re-runs from the
# enrichments on, which the enrichment cache answers without OCR or a vision call when only chunking,
# embedding or the lexical analysis changed; a stale loader or classifier needs the whole ingest.
WHOLE_INGEST_FROM = {"raw_documents", "extracted_images", "image_verdicts"}


@dg.sensor(
    name="version_sensor",
    minimum_interval_seconds=sensor_interval_seconds(60),
    default_status=dg.DefaultSensorStatus.RUNNING,
    description="When the enrichment, classifier, chunking or embedding settings (or the loaders' code or "
    "the lexical analysis) change, requests a re-run of every partition materialized with the old ones "
    f"(a backfill through the registry, at most {REQUESTS_PER_TICK} partitions a tick; the ingest_requests "
    "sensor runs them in batches). Compares with the config this code location loaded; after an edit of "
    "the file it waits for the next load.",
)
def version_sensor(context: dg.SensorEvaluationContext) -> dg.SensorResult:
    deadline = Deadline(TICK_BUDGET_S)
    in_effect = config_in_effect()
    on_disk = in_effect.file_now()
    if on_disk.sha256 != in_effect.sha256:
        # Runs started now read the new file; comparing their versions with this process' old ones
        # would re-run every partition they touch. The code location's next load compares with them.
        return dg.SensorResult(
            skip_reason=dg.SkipReason(
                f"{in_effect.path} changed since this code location read it (settings {in_effect.sha256[:12]} "
                f"-> {on_disk.sha256[:12]}): it compares with the new settings once reloaded (dagster-daemon "
                "run reloads it within a minute; under dagster dev: Deployment -> Reload)"
            )
        )
    say_once_if_different(in_effect, last_config_used(), context.log.warning)
    current = code_versions(in_effect.config)
    # what a comparison depends on besides the catalog: the versions, and the settings its message names
    compared_with = (
        ",".join(f"{asset}={version}" for asset, version in sorted(current.items())) + in_effect.sha256
    )
    cursor = json.loads(context.cursor) if context.cursor else {}
    catalog = cursor.get("catalog") or new_catalog()
    read = cursor.get("after", {})
    # a comparison the last tick had no time for comes first: reading again before it could take this
    # tick's time as well, under an event log slow enough, tick after tick
    after, unread = (
        (read, [])
        if cursor.get("compare_first")
        else read_new_materializations(
            context.instance,
            catalog,
            {asset: read.get(asset, 0) for asset in current},
            deadline.within(READ_BUDGET_S),
            cursor.get("reading"),
        )
    )
    state: dict = {"catalog": catalog, "after": after, "compare_s": cursor.get("compare_s", 0.0)}
    if unread:
        context.update_cursor(json.dumps(state | {"reading": unread}))
        return dg.SensorResult(
            skip_reason=dg.SkipReason(
                f"reading the materializations recorded since the last tick (up to storage ids {after}); the "
                f"next tick goes on from there ({', '.join(unread)} left) before comparing versions"
            )
        )
    settled = cursor.get("settled")
    if settled and settled["with"] == compared_with and after == read:
        # Nothing recorded since a comparison that left nothing to request, under the same settings.
        context.update_cursor(json.dumps(state | {"settled": settled}))
        return dg.SensorResult(
            skip_reason=dg.SkipReason(settled["message"] + " (no new materialization since)")
        )
    if deadline.left() < state["compare_s"] and not cursor.get("compare_first"):
        context.update_cursor(json.dumps(state | {"compare_first": True}))
        return dg.SensorResult(
            skip_reason=dg.SkipReason(
                f"the materializations recorded are read; the comparison (it took {state['compare_s']:.1f} s) "
                f"does not fit the {max(0.0, deadline.left()):.1f} s left of this tick: the next tick compares"
            )
        )
    started = time.monotonic()
    by_partition, counts = stale(catalog, current)
    due = DocumentRegistry().registered_in_order(by_partition) if by_partition else []
    state["compare_s"] = time.monotonic() - started
    requested, waiting, left, gone = _request_reruns(
        context.instance, catalog, current, by_partition, due, deadline
    )
    changes = _changes(by_partition, requested, current)
    message = _summary(in_effect.describe(), counts, len(requested), changes, waiting, left)
    if not (waiting or left or gone):  # what later ticks say while nothing changes: all requested before
        done = counts._replace(requested=counts.requested + len(requested))
        state["settled"] = {"with": compared_with, "message": _summary(in_effect.describe(), done)}
    context.update_cursor(json.dumps(state))
    if requested:
        context.log.info(message)
    return dg.SensorResult(skip_reason=dg.SkipReason(message))


def _summary(
    config: str,
    counts: Staleness,
    requested: int = 0,
    changes: Sequence[str] = (),
    waiting: int = 0,
    left: int = 0,
) -> str:
    """The tick's one line: what is stale, what it requested now (`changes`: `asset -> version` of
    those), what was requested before, and what waits."""
    if not counts.stale:
        return f"the versions recorded for all {counts.partitions} partitions match the config in effect, {config}"
    return (
        f"{counts.stale} of {counts.partitions} partitions recorded other versions than the config in effect, "
        f"{config}: "
        + (
            f"re-runs of {requested} requested now ({', '.join(changes)}), run in batches by the "
            "ingest_requests sensor; "
            if requested
            else ""
        )
        + f"{counts.requested} requested before, not yet done or failed (a new materialization, or a new "
        "version, asks again)"
        + (f"; {waiting} left to the run already asked for (or with no registered copy)" if waiting else "")
        + (f"; {left} left for the next ticks (at most {REQUESTS_PER_TICK} a tick)" if left else "")
    )


def _changes(by_partition: dict[str, list[str]], requested: list[str], current: dict[str, str]) -> list[str]:
    """`asset -> its version now` for each stale asset of the requested partitions."""
    assets = sorted({asset for partition in requested for asset in by_partition[partition]})
    return [f"{asset} -> {current[asset]}" for asset in assets]


def _request_reruns(
    instance: dg.DagsterInstance,
    catalog: str,
    current: dict[str, str],
    by_partition: dict[str, list[str]],
    due: list[str],
    deadline: Deadline,
) -> tuple[list[str], int, int, int]:
    """Request the first `REQUESTS_PER_TICK` stale partitions' re-runs (`due`: those registered, in
    partition order, so they run as batches of consecutive partitions) through the one way in,
    REQUEST_CHUNK at a time while the tick has time: the whole ingest where the loader or the
    classifier is stale, else the re-enrichment. Returns the partitions requested, how many were left
    to a run already requested or under way (compared again once it materialized), how many wait for
    the next ticks, and how many were forgotten: partitions whose document is no longer registered
    (removed)."""
    if not by_partition:
        return [], 0, 0, 0
    gone = set(by_partition) - set(due)
    if gone:
        forget_partitions(catalog, gone)
    requested: list[str] = []
    taken = 0
    for first in range(0, min(len(due), REQUESTS_PER_TICK), REQUEST_CHUNK):
        if first and deadline.passed():
            break
        chunk = due[first : min(first + REQUEST_CHUNK, REQUESTS_PER_TICK)]
        jobs: dict[str, list[str]] = {}
        for partition in chunk:
            whole = WHOLE_INGEST_FROM & set(by_partition[partition])
            jobs.setdefault(ingest_document_job.name if whole else reenrich_job.name, []).append(partition)
        done = [
            partition
            for job, partitions in jobs.items()
            for partition in request_documents(instance, partitions, "versions", job, unless_under_way=True)
        ]
        mark_requested(catalog, current, done)
        requested += done
        taken += len(chunk)
    return requested, taken - len(requested), len(due) - taken, len(gone)
