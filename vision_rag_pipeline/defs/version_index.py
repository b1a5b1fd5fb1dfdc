"""What each partition's latest materialization of each versioned asset recorded, kept in the index
database and brought up to date from Dagster's event log a batch at a time, so the version sensor
answers "which partitions are stale?" with one query instead of reading every partition's events.

Reading Dagster's record of the latest materialization per partition costs a whole event body per
partition (deserialized for one tag): ~1 ms each, 45-56 s a tick at 10,000 documents and Dagster's
60 s timeout at 100,000 (BENCHMARKS.md "Catalog of 100,000 documents"). Here each materialization is
read once, when it is new (`fetch_materializations` after the last storage id read, in batches within
a tick's time), and its partition's row replaced; the rows of one Dagster instance form a catalog,
named in the sensor's cursor (a new cursor, a new instance or a reset sensor builds a new one from the
event log). A row also says which version a re-run was last requested for, so a partition is
requested once per stale state, and again after a new materialization recorded another old version.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping, Sequence
from typing import NamedTuple

import dagster as dg

from vision_rag_pipeline.core.deadline import Deadline
from vision_rag_pipeline.core.postgres import connect, ensure_schema

_SCHEMA = """
CREATE TABLE IF NOT EXISTS version_catalogs (
    catalog text PRIMARY KEY,
    touched_at timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE IF NOT EXISTS recorded_versions (
    catalog text NOT NULL REFERENCES version_catalogs ON DELETE CASCADE,
    asset text NOT NULL,
    partition text NOT NULL,
    storage_id bigint NOT NULL,
    code_version text,
    requested_version text,
    PRIMARY KEY (catalog, asset, partition)
);
"""
CODE_VERSION_TAG = "dagster/code_version"
BATCH = 500
ABANDONED_AFTER = "7 days"  # a catalog no sensor touched for this long belongs to a gone instance


def new_catalog(url: str | None = None) -> str:
    """A catalog for an instance whose sensor starts from nothing; drops the abandoned ones."""
    ensure_schema(_SCHEMA, url)
    catalog = uuid.uuid4().hex
    with connect(url) as conn:
        conn.execute(f"DELETE FROM version_catalogs WHERE touched_at < now() - interval '{ABANDONED_AFTER}'")
        conn.execute("INSERT INTO version_catalogs (catalog) VALUES (%s)", (catalog,))
    return catalog


class Read(NamedTuple):
    after: dict[str, int]  # {asset: the last storage id read}
    unread: list[str]  # the assets not read to the end when the deadline passed, in turn; [] all were


def read_new_materializations(
    instance: dg.DagsterInstance,
    catalog: str,
    after: Mapping[str, int],
    deadline: Deadline,
    to_read: Sequence[str] | None = None,
    url: str | None = None,
) -> Read:
    """Record the materializations made since of the assets in `after` ({asset: last storage id read};
    `to_read`: only those, the ones a read that stopped at its deadline left), a batch at a time, each
    batch begun only before `deadline`. A read that takes several ticks goes on with the assets left,
    from the one it stopped at, and is complete once each was read to the end once."""
    ensure_schema(_SCHEMA, url)
    after = dict(after)
    unread = [asset for asset in (to_read or after) if asset in after]
    while unread:
        asset = unread[0]
        if deadline.passed():
            break
        records = instance.fetch_materializations(
            dg.AssetRecordsFilter(asset_key=dg.AssetKey(asset), after_storage_id=after[asset] or None),
            limit=BATCH,
            ascending=True,
        ).records
        latest: dict[str, tuple[int, str | None]] = {}
        for record in records:
            materialization = record.asset_materialization
            if materialization is not None and materialization.partition is not None:
                tags = materialization.tags or {}
                latest[materialization.partition] = (record.storage_id, tags.get(CODE_VERSION_TAG))
        _upsert(catalog, asset, latest, url)
        if records:
            after[asset] = records[-1].storage_id
        if len(records) < BATCH:
            unread.pop(0)
    with connect(url) as conn:
        conn.execute("UPDATE version_catalogs SET touched_at = now() WHERE catalog = %s", (catalog,))
    return Read(after, unread)


def _upsert(catalog: str, asset: str, latest: Mapping[str, tuple[int, str | None]], url: str | None) -> None:
    if not latest:
        return
    with connect(url) as conn:
        conn.execute(
            "INSERT INTO recorded_versions (catalog, asset, partition, storage_id, code_version)"
            " SELECT %s, %s, p, s, v FROM unnest(%s::text[], %s::bigint[], %s::text[]) AS t(p, s, v)"
            " ON CONFLICT (catalog, asset, partition) DO UPDATE SET storage_id = EXCLUDED.storage_id,"
            " code_version = EXCLUDED.code_version, requested_version = NULL"
            " WHERE recorded_versions.storage_id < EXCLUDED.storage_id",
            (
                catalog,
                asset,
                list(latest),
                [storage_id for storage_id, _ in latest.values()],
                [version for _, version in latest.values()],
            ),
        )


class Staleness(NamedTuple):
    partitions: int  # with a recorded version
    stale: int  # of those, with an asset whose recorded version is not the current one
    requested: int  # of those, with a re-run requested for every such asset, not materialized yet


def stale(
    catalog: str, current: Mapping[str, str], url: str | None = None
) -> tuple[dict[str, list[str]], Staleness]:
    """{partition: its assets whose recorded version is not `current`'s ({asset: version}) and no re-run
    was requested for} of every partition with such an asset; and the counts. Two scans of the
    catalog's rows (an index of the recorded versions, not of Dagster's events): about 1 s at 100,000
    partitions."""
    values = ", ".join(["(%s, %s)"] * len(current))
    params = [item for pair in current.items() for item in pair]
    with connect(url) as conn:
        (partitions,) = conn.execute(
            "SELECT count(*) FROM (SELECT DISTINCT partition FROM recorded_versions WHERE catalog = %s) AS p",
            (catalog,),
        ).fetchone()
        rows = conn.execute(
            "SELECT r.partition, array_agg(r.asset ORDER BY r.asset)"
            " FILTER (WHERE r.requested_version IS DISTINCT FROM c.version)"
            f" FROM recorded_versions r JOIN (VALUES {values}) AS c(asset, version) USING (asset)"
            " WHERE r.catalog = %s AND r.code_version IS DISTINCT FROM c.version GROUP BY r.partition",
            (*params, catalog),
        ).fetchall()
    due = {partition: assets for partition, assets in rows if assets}
    return due, Staleness(partitions, len(rows), len(rows) - len(due))


def mark_requested(
    catalog: str, current: Mapping[str, str], partitions: Sequence[str], url: str | None = None
) -> None:
    """A re-run of these partitions' stale assets was requested: they are not asked again until a new
    materialization records another old version, or the versions change again. Only this sensor
    writes the catalog, so nothing recorded between its query and this update is overwritten."""
    values = ", ".join(["(%s, %s)"] * len(current))
    params = [item for pair in current.items() for item in pair]
    with connect(url) as conn:
        conn.execute(
            "UPDATE recorded_versions AS r SET requested_version = c.version"
            f" FROM (VALUES {values}) AS c(asset, version)"
            " WHERE r.catalog = %s AND r.asset = c.asset AND r.partition = ANY(%s)"
            " AND r.code_version IS DISTINCT FROM c.version",
            (*params, catalog, list(partitions)),
        )


def forget_partitions(catalog: str, partitions: Iterable[str], url: str | None = None) -> None:
    """Drop the rows of partitions that no longer exist."""
    with connect(url) as conn:
        conn.execute(
            "DELETE FROM recorded_versions WHERE catalog = %s AND partition = ANY(%s)",
            (catalog, list(partitions)),
        )
