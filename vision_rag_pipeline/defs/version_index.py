"""What each partition's latest materialization of each versioned asset recorded, kept in the index
database and brought up to date from Dagster's event log a batch at a time, so the version sensor
answers "which partitions are stale?" with one query instead of reading every partition's events.

Reading Dagster's record of the latest materialization per partition costs a whole event body per
partition (deserialized for one tag): ~1 ms each, 45-56 s a tick at 10,000 documents and Dagster's
60 s timeout at 100,000 (BENCHMARKS.md "Catalog of 100,000 documents"). Here each materialization is
read once, when it is new (`fetch_materializations` after the last storage id read, in batches within
a time budget), and its partition's row replaced; the rows of one Dagster instance form a catalog,
named in the sensor's cursor (a new cursor, a new instance or a reset sensor builds a new one from the
event log). A row also says which version a re-run was last requested for, so a partition is
requested once per stale state, as the run keys of a scan used to ensure, and again after a new
materialization recorded another old version.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable, Mapping
from typing import NamedTuple

import dagster as dg

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


class StaleAsset(NamedTuple):
    partition: str
    asset: str
    storage_id: int  # of the latest materialization
    recorded: str | None  # its code version (None: made before versioning)


def new_catalog(url: str | None = None) -> str:
    """A catalog for an instance whose sensor starts from nothing; drops the abandoned ones."""
    ensure_schema(_SCHEMA, url)
    catalog = uuid.uuid4().hex
    with connect(url) as conn:
        conn.execute(f"DELETE FROM version_catalogs WHERE touched_at < now() - interval '{ABANDONED_AFTER}'")
        conn.execute("INSERT INTO version_catalogs (catalog) VALUES (%s)", (catalog,))
    return catalog


def read_new_materializations(
    instance: dg.DagsterInstance,
    catalog: str,
    after: Mapping[str, int],
    budget_s: float,
    url: str | None = None,
) -> tuple[dict[str, int], bool]:
    """Record the materializations of the assets in `after` ({asset: last storage id read}) made since;
    returns the new `after` and whether every asset was read to the end within `budget_s`."""
    ensure_schema(_SCHEMA, url)
    deadline = time.monotonic() + budget_s
    after = dict(after)
    complete = True
    for asset in after:
        while True:
            if time.monotonic() > deadline:
                complete = False
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
                break
    with connect(url) as conn:
        conn.execute("UPDATE version_catalogs SET touched_at = now() WHERE catalog = %s", (catalog,))
    return after, complete


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
    catalog: str, current: Mapping[str, str], limit: int, url: str | None = None
) -> tuple[list[StaleAsset], Staleness]:
    """The stale assets of the first `limit` partitions (by key) with an asset whose recorded version
    is not `current`'s ({asset: version}) and no re-run requested for it; and the counts."""
    values = ", ".join(["(%s, %s)"] * len(current))
    params = [item for pair in current.items() for item in pair]
    with connect(url) as conn:
        counts = conn.execute(
            "SELECT count(DISTINCT r.partition),"
            " count(DISTINCT r.partition) FILTER (WHERE r.code_version IS DISTINCT FROM c.version),"
            " count(DISTINCT r.partition) FILTER (WHERE r.code_version IS DISTINCT FROM c.version"
            " AND r.requested_version IS DISTINCT FROM c.version)"
            f" FROM recorded_versions r JOIN (VALUES {values}) AS c(asset, version) USING (asset)"
            " WHERE r.catalog = %s",
            (*params, catalog),
        ).fetchone()
        rows = conn.execute(
            f"WITH due AS (SELECT r.partition, r.asset, r.storage_id, r.code_version"
            f" FROM recorded_versions r JOIN (VALUES {values}) AS c(asset, version) USING (asset)"
            " WHERE r.catalog = %s AND r.code_version IS DISTINCT FROM c.version"
            " AND r.requested_version IS DISTINCT FROM c.version),"
            " chosen AS (SELECT DISTINCT partition FROM due ORDER BY partition LIMIT %s)"
            " SELECT due.* FROM due JOIN chosen USING (partition) ORDER BY 1, 2",
            (*params, catalog, limit),
        ).fetchall()
    total, stale_partitions, not_requested = counts
    return [StaleAsset(*row) for row in rows], Staleness(
        total, stale_partitions, stale_partitions - not_requested
    )


def mark_requested(catalog: str, requested: Mapping[str, Mapping[str, int]], url: str | None = None) -> None:
    """{"asset@version": {partition: storage id}}: Dagster accepted a re-run of these assets, requested
    when their latest materialization was that one (a newer one is judged anew)."""
    with connect(url) as conn, conn.cursor() as cursor:
        for key, partitions in requested.items():
            asset, version = key.split("@", 1)
            cursor.execute(
                "UPDATE recorded_versions AS r SET requested_version = %s"
                " FROM unnest(%s::text[], %s::bigint[]) AS t(partition, storage_id)"
                " WHERE r.catalog = %s AND r.asset = %s AND r.partition = t.partition"
                " AND r.storage_id = t.storage_id",
                (version, list(partitions), list(partitions.values()), catalog, asset),
            )


def forget_partitions(catalog: str, partitions: Iterable[str], url: str | None = None) -> None:
    """Drop the rows of partitions that no longer exist."""
    with connect(url) as conn:
        conn.execute(
            "DELETE FROM recorded_versions WHERE catalog = %s AND partition = ANY(%s)",
            (catalog, list(partitions)),
        )
