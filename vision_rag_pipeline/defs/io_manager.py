"""Asset values stored in the index database, one row per asset key, partition and run.

Every node of a deployment reaches Postgres (the index lives there), so a run on one machine or pod
loads what a run on another stored: a `reenrich` run loads raw_documents, extracted_images and
image_verdicts that the ingest run may have materialized elsewhere. Nothing is kept on a local disk.
The embedded default uses the same code on the embedded Postgres.

One run per document at a time: before a step of a run stores or loads a document partition's
value, the run takes the document's lease (`document_runs`), held until Dagster reports the run
finished (or its process gone). A second run of the document, whether launched by the daemon, the
UI or the CLI in another process, waits in its first step instead of interleaving with the first.

Values are keyed by run: a run reads its own upstream value when it produced one, else the latest
stored (a `reenrich` run loads what the last ingest stored). Holding the lease, a run that stores a
value deletes the other runs' values of that asset and partition, so the table keeps one row per
asset and document. Values are pickled, as Dagster's own IO managers do. An op's output (no asset
key) is keyed by run and step, as Dagster's default does, and dropped after `OP_VALUE_DAYS`. Unlike
the filesystem IO manager it logs no debug line per input and output: each is a run event Dagster
stores one write at a time (~40 events per ingest run).
"""

from __future__ import annotations

import pickle
import threading
import time

import dagster as dg

from vision_rag_pipeline.core.postgres import connect, database_url, ensure_schema
from vision_rag_pipeline.defs.resources import IndexDatabase
from vision_rag_pipeline.defs.run_owner import PID_TAG, owner_alive

OP_VALUE_DAYS = 7
LEASE_POLL_SECONDS = 1.0

_SCHEMA = """
CREATE TABLE IF NOT EXISTS asset_values (
    asset_key text NOT NULL,
    partition_key text NOT NULL,  -- '' for an unpartitioned asset
    run_id text NOT NULL DEFAULT '',  -- '' for an unpartitioned asset, and rows stored before runs keyed them
    value bytea NOT NULL,
    stored_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (asset_key, partition_key, run_id)
);
ALTER TABLE asset_values ADD COLUMN IF NOT EXISTS run_id text NOT NULL DEFAULT '';
DO $$ BEGIN
    IF NOT EXISTS (
        SELECT 1 FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey)
        WHERE i.indrelid = 'asset_values'::regclass AND i.indisprimary AND a.attname = 'run_id'
    ) THEN
        ALTER TABLE asset_values DROP CONSTRAINT asset_values_pkey;
        ALTER TABLE asset_values ADD PRIMARY KEY (asset_key, partition_key, run_id);
    END IF;
END $$;
CREATE TABLE IF NOT EXISTS document_runs (
    partition_key text PRIMARY KEY,
    run_id text NOT NULL,
    since timestamptz NOT NULL DEFAULT now()
);
"""
_held: set[tuple[str, str]] = set()  # (partition, run) leases this process knows its runs hold
_held_lock = threading.Lock()


class PostgresAssetIOManager(dg.ConfigurableIOManager):
    """Pickled values in the `asset_values` table of the index database."""

    index_db: IndexDatabase

    def _url(self) -> str:
        url = self.index_db.database_url()
        ensure_schema(_SCHEMA, url)
        return url

    def handle_output(self, context: dg.OutputContext, obj: object) -> None:
        asset_key, partition_key = _row_key(context)
        url = self._url()
        run_id = context.run_id if (partition_key or not context.has_asset_key) else ""
        if partition_key:
            hold_document(partition_key, run_id, context.step_context.instance, context.log, url)
        with connect(url) as conn:
            conn.execute(
                "INSERT INTO asset_values (asset_key, partition_key, run_id, value) VALUES (%s, %s, %s, %s)"
                " ON CONFLICT (asset_key, partition_key, run_id) DO UPDATE"
                " SET value = EXCLUDED.value, stored_at = now()",
                (asset_key, partition_key, run_id, pickle.dumps(obj, pickle.HIGHEST_PROTOCOL)),
            )
            if partition_key:  # superseded: no other run of this document runs while we hold its lease
                conn.execute(
                    "DELETE FROM asset_values WHERE asset_key = %s AND partition_key = %s AND run_id <> %s",
                    (asset_key, partition_key, run_id),
                )
            elif not context.has_asset_key:
                conn.execute(
                    "DELETE FROM asset_values WHERE asset_key LIKE 'op:%%'"
                    " AND stored_at < now() - make_interval(days => %s)",
                    (OP_VALUE_DAYS,),
                )

    def load_input(self, context: dg.InputContext) -> object:
        asset_key, partition_key = _row_key(context)
        url = self._url()
        run_id = context.step_context.run_id
        if partition_key:
            hold_document(partition_key, run_id, context.instance, context.log, url)
        with connect(url) as conn:
            # this run's own value first, else the latest stored (by an earlier run)
            row = conn.execute(
                "SELECT value FROM asset_values WHERE asset_key = %s AND partition_key = %s"
                " ORDER BY run_id = %s DESC, stored_at DESC LIMIT 1",
                (asset_key, partition_key, run_id),
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


def hold_document(
    partition_key: str, run_id: str, instance: dg.DagsterInstance, log: object, url: str | None = None
) -> None:
    """Take the document's lease for `run_id`, waiting while another unfinished run holds it. A lease
    passes on when Dagster reports its run finished, or the process running it is gone (a killed CLI
    run that nothing marked failed yet); it is never released by hand, so a crash cannot leak it."""
    if (partition_key, run_id) in _held:
        return
    url = url or database_url()
    ensure_schema(_SCHEMA, url)
    waited_for = None
    while True:
        with connect(url) as conn:
            holder = conn.execute(
                "INSERT INTO document_runs (partition_key, run_id) VALUES (%s, %s)"
                " ON CONFLICT (partition_key) DO UPDATE SET partition_key = EXCLUDED.partition_key"
                " RETURNING run_id",
                (partition_key, run_id),
            ).fetchone()[0]
            if holder != run_id and _run_over(instance, holder):
                taken = conn.execute(
                    "UPDATE document_runs SET run_id = %s, since = now() WHERE partition_key = %s AND run_id = %s",
                    (run_id, partition_key, holder),
                ).rowcount
                holder = run_id if taken else holder
        if holder == run_id:
            with _held_lock:
                _held.add((partition_key, run_id))
            return
        if waited_for != holder:
            log.info(f"{partition_key}: waiting for run {holder} of this document to finish")  # type: ignore[attr-defined]
            waited_for = holder
        time.sleep(LEASE_POLL_SECONDS)


def _run_over(instance: dg.DagsterInstance, run_id: str) -> bool:
    run = instance.get_run_by_id(run_id)
    if run is None or run.is_finished:
        return True
    return PID_TAG in run.tags and not owner_alive(run.tags)


def delete_partition_values(partition_key: str, url: str | None = None) -> int:
    """Forget every stored value of one partition (a removed document); returns the rows deleted."""
    url = url or database_url()
    ensure_schema(_SCHEMA, url)
    with connect(url) as conn:
        conn.execute("DELETE FROM document_runs WHERE partition_key = %s", (partition_key,))
        return conn.execute("DELETE FROM asset_values WHERE partition_key = %s", (partition_key,)).rowcount
