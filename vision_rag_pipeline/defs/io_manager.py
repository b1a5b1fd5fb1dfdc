"""Asset values stored in the index database, one row per asset key, partition and run.

Every node of a deployment reaches Postgres (the index lives there), so a run on one machine or pod
loads what a run on another stored: a `reenrich` run loads raw_documents, extracted_images and
image_verdicts that the ingest run may have materialized elsewhere. Nothing is kept on a local disk.
The embedded default uses the same code on the embedded Postgres.

A run covers one document partition or a range of them (a batch); a partitioned asset's value is
always `{partition key: that document's value}`, stored and loaded one row per document.

One run per document at a time: before a step of a run stores or loads a document's value, the run
takes the document's lease in the registry (documents/registry.py), all of its documents in
partition order, held until Dagster reports the run finished or the process executing it is gone
(this process renews its leases while it lives). A second run of the document, whether launched by
the daemon, the UI or the CLI in another process, waits in its first step instead of interleaving
with the first. A run found holding a lease after its process died is marked failed and its
concurrency slots freed, whoever finds it.

Values are keyed by run: a run reads its own upstream value when it produced one, else the latest
stored (a `reenrich` run loads what the last ingest stored). Holding the lease, a run that stores a
value deletes the other runs' values of that asset and partition, so the table keeps one row per
asset and document. Values are pickled, as Dagster's own IO managers do. An op's output (no asset
key) is keyed by run and step, as Dagster's default does, and dropped after `OP_VALUE_DAYS`. Unlike
the filesystem IO manager it logs no debug line per input and output: each is a run event Dagster
stores one write at a time.
"""

from __future__ import annotations

import datetime as dt
import pickle
import threading
import time
from collections.abc import Sequence

import dagster as dg

from vision_rag_pipeline.core.postgres import connect, database_url, ensure_schema
from vision_rag_pipeline.defs.resources import IndexDatabase
from vision_rag_pipeline.documents.registry import (
    LEASE_SECONDS,
    DocumentRegistry,
    process_gone,
    this_process,
)

OP_VALUE_DAYS = 7
LEASE_POLL_SECONDS = 1.0
RENEW_SECONDS = LEASE_SECONDS / 4

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
"""
_held: set[tuple[str, str]] = set()  # (partition, run) leases this process knows its runs hold
_held_lock = threading.Lock()
# the index databases where this process has taken leases (URL -> registry), all renewed
_lease_databases: dict[str, DocumentRegistry] = {}
_renewal: threading.Thread | None = None


class PostgresAssetIOManager(dg.ConfigurableIOManager):
    """Pickled values in the `asset_values` table of the index database."""

    index_db: IndexDatabase

    def _url(self) -> str:
        url = self.index_db.database_url()
        ensure_schema(_SCHEMA, url)
        return url

    def handle_output(self, context: dg.OutputContext, obj: object) -> None:
        url = self._url()
        if not context.has_asset_key:  # an op's output: kept a few days, keyed by run and step
            self._store(url, "op:" + "/".join(context.get_identifier()), {"": obj}, context.run_id)
            return
        asset_key = context.asset_key.to_user_string()
        if not context.has_asset_partitions:
            self._store(url, asset_key, {"": obj}, "")
            return
        keys = list(context.asset_partition_keys)
        hold_documents(keys, context.run_id, context.step_context.instance, context.log, url)
        if obj is None:  # the indexes' assets: their rows are the value, nothing to store here
            return
        if not isinstance(obj, dict) or set(obj) != set(keys):
            raise TypeError(f"{asset_key}: expected {{partition: value}} for the partitions {keys}")
        self._store(url, asset_key, obj, context.run_id)

    @staticmethod
    def _store(url: str, asset_key: str, values: dict[str, object], run_id: str) -> None:
        rows = [
            (asset_key, key, run_id, pickle.dumps(value, pickle.HIGHEST_PROTOCOL))
            for key, value in values.items()
        ]
        with connect(url) as conn, conn.cursor() as cursor:
            cursor.executemany(
                "INSERT INTO asset_values (asset_key, partition_key, run_id, value) VALUES (%s, %s, %s, %s)"
                " ON CONFLICT (asset_key, partition_key, run_id) DO UPDATE"
                " SET value = EXCLUDED.value, stored_at = now()",
                rows,
            )
            if asset_key.startswith("op:"):
                cursor.execute(
                    "DELETE FROM asset_values WHERE asset_key LIKE 'op:%%'"
                    " AND stored_at < now() - make_interval(days => %s)",
                    (OP_VALUE_DAYS,),
                )
            elif run_id:  # superseded: no other run of these documents runs while we hold their leases
                cursor.execute(
                    "DELETE FROM asset_values WHERE asset_key = %s AND partition_key = ANY(%s) AND run_id <> %s",
                    (asset_key, list(values), run_id),
                )

    def load_input(self, context: dg.InputContext) -> object:
        url = self._url()
        run_id = context.step_context.run_id
        if not context.has_asset_key:
            return self._load(url, "op:" + "/".join(context.get_identifier()), [""], run_id)[""]
        asset_key = context.asset_key.to_user_string()
        if not context.has_asset_partitions:
            return self._load(url, asset_key, [""], run_id)[""]
        keys = list(context.asset_partition_keys)
        hold_documents(keys, run_id, context.instance, context.log, url)
        return self._load(url, asset_key, keys, run_id)

    @staticmethod
    def _load(url: str, asset_key: str, keys: Sequence[str], run_id: str) -> dict[str, object]:
        with connect(url) as conn:
            # this run's own value first, else the latest stored (by an earlier run)
            rows = conn.execute(
                "SELECT DISTINCT ON (partition_key) partition_key, value FROM asset_values"
                " WHERE asset_key = %s AND partition_key = ANY(%s)"
                " ORDER BY partition_key, run_id = %s DESC, stored_at DESC",
                (asset_key, list(keys), run_id),
            ).fetchall()
        values = {key: pickle.loads(value) for key, value in rows}
        missing = [key for key in keys if key not in values]
        if missing:
            what = f"{asset_key} partition {', '.join(missing[:3])}" if missing != [""] else asset_key
            raise KeyError(f"no stored value for {what}; materialize it first")
        return {key: values[key] for key in keys}


def hold_documents(
    partition_keys: Sequence[str],
    run_id: str,
    instance: dg.DagsterInstance,
    log: object,
    url: str | None = None,
) -> None:
    """Take the documents' leases for `run_id`, in the order given (partition order: two runs of
    overlapping ranges never wait for each other), waiting while another unfinished run holds one.
    A lease passes on when Dagster reports its run finished, or the process running it is gone;
    it is never released by hand, so a crash cannot leak it."""
    wanted = [key for key in partition_keys if (key, run_id) not in _held]
    if not wanted:
        return
    url = url or database_url()
    registry = DocumentRegistry(url)
    me = this_process()
    for key in wanted:
        _hold(registry, key, run_id, me, instance, log)
        with _held_lock:
            _held.add((key, run_id))
    _keep_renewing(url, registry, me)


def _hold(
    registry: DocumentRegistry, key: str, run_id: str, me: str, instance: dg.DagsterInstance, log: object
) -> None:
    waited_for = None
    while not registry.take_lease(key, run_id, me):
        lease = registry.lease(key)
        if lease is None:  # not registered (raw_documents says so) or forgotten meanwhile
            return
        holder = instance.get_run_by_id(lease.run_id)
        gone = process_gone(lease.owner, lease.renewed_at, dt.datetime.now(dt.UTC))
        if holder is None or holder.is_finished or gone:
            if holder is not None and not holder.is_finished:
                abandon_run(instance, holder, f"the process executing it ({lease.owner}) is gone")
            if registry.take_lease(key, run_id, me, holder=lease.run_id):
                return
            continue
        if waited_for != lease.run_id:
            log.info(f"{key}: waiting for run {lease.run_id} of this document to finish")  # type: ignore[attr-defined]
            waited_for = lease.run_id
        time.sleep(LEASE_POLL_SECONDS)


def abandon_run(instance: dg.DagsterInstance, run: dg.DagsterRun, why: str) -> None:
    """Mark a run whose process is gone failed and give back the concurrency slots it held (a
    killed run's `vision_model` slots would otherwise block every later run)."""
    run = instance.get_run_by_id(run.run_id) or run
    if not run.is_finished:
        instance.report_run_failed(run, f"Marked failed by vision-rag (process {this_process()}): {why}.")
    storage = instance.event_log_storage
    if storage.supports_global_concurrency_limits:
        storage.free_concurrency_slots_for_run(run.run_id)


def _keep_renewing(url: str, registry: DocumentRegistry, me: str) -> None:
    """One thread per process renews its leases while the process lives (another host tells a
    live holder from a dead one by these renewals), in every database where this process has taken
    one: a process may run against several index databases in turn. A forked child inherits the
    databases but not the thread, and starts its own."""
    global _renewal
    with _held_lock:
        _lease_databases.setdefault(url, registry)
        if _renewal is not None and _renewal.is_alive():
            return
        _renewal = threading.Thread(target=_renew, args=(me,), name="vision-rag-lease-renewal", daemon=True)
        _renewal.start()


def _renew(me: str) -> None:
    while True:
        time.sleep(RENEW_SECONDS)
        with _held_lock:
            registries = list(_lease_databases.values())
        for registry in registries:
            try:
                registry.renew(me)
            except Exception:  # this database is away: the next renewal tries again
                continue


def delete_partition_values(partition_key: str, url: str | None = None) -> int:
    """Forget every stored value of one partition (a removed document); returns the rows deleted."""
    url = url or database_url()
    ensure_schema(_SCHEMA, url)
    with connect(url) as conn:
        return conn.execute("DELETE FROM asset_values WHERE partition_key = %s", (partition_key,)).rowcount
