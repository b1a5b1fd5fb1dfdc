"""Asset values stored in the index database, one row per asset key and partition.

Every node of a deployment reaches Postgres (the index lives there), so a run on one machine or pod
loads what a run on another stored: a `reenrich` run loads raw_documents, extracted_images and
image_verdicts that the ingest run may have materialized elsewhere. Nothing is kept on a local disk.
The embedded default uses the same code on the embedded Postgres.

Values are pickled, as Dagster's own IO managers do; a new materialization replaces the row in
one statement, so a reader sees the old value or the new one, never half of either. An op's
output (no asset key) is keyed by run and step, as Dagster's default does. Unlike the
filesystem IO manager it logs no debug line per input and output: each is a run event Dagster
stores one write at a time (~40 events per ingest run).
"""

from __future__ import annotations

import pickle

import dagster as dg

from vision_rag_pipeline.core.postgres import connect, database_url, ensure_schema
from vision_rag_pipeline.defs.resources import IndexDatabase

_SCHEMA = """
CREATE TABLE IF NOT EXISTS asset_values (
    asset_key text NOT NULL,
    partition_key text NOT NULL,  -- '' for an unpartitioned asset
    value bytea NOT NULL,
    stored_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (asset_key, partition_key)
)
"""


class PostgresAssetIOManager(dg.ConfigurableIOManager):
    """Pickled values in the `asset_values` table of the index database."""

    index_db: IndexDatabase

    def _url(self) -> str:
        url = self.index_db.database_url()
        ensure_schema(_SCHEMA, url)
        return url

    def handle_output(self, context: dg.OutputContext, obj: object) -> None:
        asset_key, partition_key = _row_key(context)
        with connect(self._url()) as conn:
            conn.execute(
                "INSERT INTO asset_values (asset_key, partition_key, value) VALUES (%s, %s, %s)"
                " ON CONFLICT (asset_key, partition_key) DO UPDATE"
                " SET value = EXCLUDED.value, stored_at = now()",
                (asset_key, partition_key, pickle.dumps(obj, pickle.HIGHEST_PROTOCOL)),
            )

    def load_input(self, context: dg.InputContext) -> object:
        asset_key, partition_key = _row_key(context)
        with connect(self._url()) as conn:
            row = conn.execute(
                "SELECT value FROM asset_values WHERE asset_key = %s AND partition_key = %s",
                (asset_key, partition_key),
            ).fetchone()
        if row is None:
            what = f"{asset_key} partition {partition_key}" if partition_key else asset_key
            raise KeyError(f"no stored value for {what}; materialize it first")
        return pickle.loads(row[0])


def _row_key(context: dg.InputContext | dg.OutputContext) -> tuple[str, str]:
    if not context.has_asset_key:
        return "op:" + "/".join(context.get_identifier()), ""
    partition = context.asset_partition_key if context.has_asset_partitions else ""
    return context.asset_key.to_user_string(), partition


def delete_partition_values(partition_key: str, url: str | None = None) -> int:
    """Forget every stored value of one partition (a removed document); returns the rows deleted."""
    url = url or database_url()
    ensure_schema(_SCHEMA, url)
    with connect(url) as conn:
        return conn.execute("DELETE FROM asset_values WHERE partition_key = %s", (partition_key,)).rowcount
