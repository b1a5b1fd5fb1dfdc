"""Dagster run history for the embedded default: SQLite, as Dagster's own default, minus its per-call engine.

Dagster's SQLite storages build a fresh SQLAlchemy engine (and SQLite connection) for every read
and write: about 330 times per ingest run here, roughly 1 s of CPU per document, more than a
document's embedding. These subclasses keep one engine per database file and reuse its
connections, remember the schema Dagster probes before most writes, and store an event's rows
without rebuilding statements; what is stored, and where, is unchanged, so `dagster dev` and the
UI read the same files. Production deployments use dagster-postgres instead (docker/dagster.yaml).

`base_dir` is optional in each: by default it lies under the vision-rag Dagster home
(`$DAGSTER_HOME`, else `$VISION_RAG_HOME/dagster`). That lets the repo root's dagster.yaml name no
path: `dagster dev` there with nothing exported keeps its history where `vision-rag` keeps it, not
in the temporary home Dagster makes when DAGSTER_HOME is unset.

The storages and log manager subclassed here have no public name: they come from
defs/dagster_internals.py, which says why each is used.
"""

from __future__ import annotations

import importlib.metadata
import os
import shutil
import sqlite3
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Generator, Iterator, Sequence
from contextlib import contextmanager
from functools import cached_property
from pathlib import Path

import dagster
import sqlalchemy
from sqlalchemy.engine import Connection, Engine
from typing_extensions import override

from vision_rag_pipeline.core.config import dagster_home
from vision_rag_pipeline.defs.dagster_internals import (
    ASSET_CHECK_EVENTS,
    ASSET_EVENTS,
    EVENT_TYPE_TO_PIPELINE_RUN_STATUS,
    INDEX_SHARD_NAME,
    IO_TYPE_EXTENSION,
    AssetKeyTable,
    CapturedLogContext,
    ComputeIOType,
    ConfigurableClassData,
    LocalComputeLogManager,
    SqlEventLogStorageTable,
    SqliteEventLogStorage,
    SqliteRunStorage,
    SqliteScheduleStorage,
    create_db_conn_string,
    redirect_to_file,
)

RUN_SHARD_ENGINES = 4  # one event-log database per run: keep the engines of the latest few runs
KNOWN_PARTITION_SECONDS = 5.0
# not *.db: Dagster takes every *.db file in the folder for a run's events
RUN_SHARD_TEMPLATE = f".empty-run-shard-{importlib.metadata.version('dagster')}.sqlite"
_INSERT_EVENT = SqlEventLogStorageTable.insert()
# What changes whenever a dynamic partition is added or deleted, by any process: the number of rows,
# and the newest row (its id, key and creation time: SQLite reuses the id of a deleted newest row).
# Both are index lookups (~3 ms at 100,000 partitions); loading the keys is a scan (0.4-2.6 s).
_PARTITIONS_MARKER = sqlalchemy.text(
    "SELECT (SELECT count(*) FROM dynamic_partitions),"
    " (SELECT id || ' ' || partition || ' ' || coalesce(create_timestamp, '')"
    "  FROM dynamic_partitions ORDER BY id DESC LIMIT 1)"
)
_PARTITION_KEYS = "SELECT partition FROM dynamic_partitions WHERE partitions_def_name = ? ORDER BY id"
# (index database, definition) -> (marker, keys), shared by the process's storages: a code server
# makes a new instance, so a new storage, for every sensor tick
_PARTITION_KEYS_LOADED: dict[tuple[str, str], tuple[tuple, list[str]]] = {}
# How long a connection waits for another process's write lock, as Dagster's own SQLite storages do
SQLITE_BUSY_TIMEOUT_SECONDS = 30
OPTIONAL_BASE_DIR = {"base_dir": dagster.Field(dagster.StringSource, is_required=False)}
# Where each storage keeps its files under a Dagster home (Dagster's own layout, plus `history`).
HOME_SUBDIRS = {
    "run_storage": "history",
    "event_log_storage": "history/runs",
    "schedule_storage": "schedules",
    "compute_logs": "storage",
}


def _with_base_dir(config_value: dict, storage: str) -> dict:
    """`config_value` with `base_dir` defaulting to its folder under the vision-rag Dagster home."""
    return {"base_dir": str(dagster_home() / HOME_SUBDIRS[storage]), **config_value}


def _engine(url: str) -> Engine:
    engine = sqlalchemy.create_engine(
        url, connect_args={"timeout": SQLITE_BUSY_TIMEOUT_SECONDS, "check_same_thread": False}
    )
    sqlalchemy.event.listen(engine, "connect", _sync_at_checkpoints)
    return engine


def _sync_at_checkpoints(dbapi_connection: sqlite3.Connection, _record: object) -> None:
    """fsync at WAL checkpoints, not at every commit (Dagster's storages are in WAL mode): the syncs
    of a run's ~100 event writes would cost more than a small document's whole enrichment. A power
    cut can roll back the latest commits but never leaves a database corrupt, as `synchronous=OFF`
    could (the run and event storage of every run)."""
    dbapi_connection.execute("PRAGMA synchronous=NORMAL")


class SchemaFacts:
    """What a storage's schema and data migrations are known to have, remembered once seen.

    Dagster asks its SQLite storages before nearly every read and write whether a table, a column
    or a migrated index exists (~40 queries, reflections and new connections per ingest run).
    Migrations only ever add them, so an answer of yes stays true; a no is asked again.
    """

    def __init__(self) -> None:
        self._seen: set[tuple[str, str]] = set()

    def holds(self, fact: tuple[str, str], probe: Callable[[], bool]) -> bool:
        if fact in self._seen:
            return True
        if probe():
            self._seen.add(fact)
            return True
        return False


class CheckedDatabases:
    """The SQLite files whose schema revision this process has checked (and Dagster created or
    stamped where it was missing), by path and inode.

    Dagster checks a database's revision each time it builds a storage on it, loading every
    migration script (~0.1-0.3 s a check), and a code server builds a new instance, so three
    checks, for every sensor tick. A storage built on a checked file skips the check; a file
    replaced since (another inode) is checked again.
    """

    def __init__(self) -> None:
        self._checked: set[tuple[str, int]] = set()

    @staticmethod
    def _identity(path: str) -> tuple[str, int] | None:
        try:
            return (path, os.stat(path).st_ino)
        except FileNotFoundError:
            return None

    def holds(self, path: str) -> bool:
        return self._identity(path) in self._checked

    def add(self, path: str) -> None:
        identity = self._identity(path)
        if identity is not None:
            self._checked.add(identity)


CHECKED = CheckedDatabases()


def _checked_storage(storage_class, inst_data: ConfigurableClassData | None, base_dir: str, name: str):  # noqa: ANN001, ANN202
    """`storage_class.from_local(base_dir)` (which checks the database's revision, creating it if
    missing), or the storage on a database this process checked already."""
    path = os.path.join(os.path.abspath(base_dir), f"{name}.db")
    if CHECKED.holds(path):
        return storage_class(create_db_conn_string(base_dir, name), inst_data)
    storage = storage_class.from_local(base_dir=base_dir, inst_data=inst_data)
    CHECKED.add(path)
    return storage


class LocalEventLogStorage(SqliteEventLogStorage):
    """`SqliteEventLogStorage` (one database per run plus an index) with engines kept between calls.

    A new run's database is a copy of an empty one migrated once per Dagster version, rather than
    created and stamped through alembic each time (~45 ms per run). It also remembers for a few
    seconds that a dynamic partition exists: Dagster asks about 100 times per ingest run, for the
    partition the run is about. A partition deleted by another
    process can at worst look present for `KNOWN_PARTITION_SECONDS`; one deleted here never does.

    And the process keeps the last list of a dynamic partitions definition's keys loaded, with the
    table's change marker read in the same transaction: creating a run over a partition range makes
    Dagster load every key once per asset and check the run plans (9-12 times per run here, each a
    scan of the table), and each later load is then one marker query, the list itself only when a
    process (this one or another) added or deleted a partition since.
    """

    def __init__(self, base_dir: str, inst_data: ConfigurableClassData | None = None):
        self._engines: OrderedDict[str, Engine] = OrderedDict()  # set first: the base class connects
        self._engines_lock = threading.Lock()
        self._known_partitions: dict[tuple[str, str], float] = {}  # -> remembered until (monotonic)
        self._schema = SchemaFacts()
        super().__init__(base_dir, inst_data)

    @classmethod
    @override
    def config_type(cls) -> dict[str, dagster.Field]:
        return OPTIONAL_BASE_DIR

    @classmethod
    @override
    def from_config_value(cls, inst_data: ConfigurableClassData | None, config_value) -> LocalEventLogStorage:
        return cls(inst_data=inst_data, **_with_base_dir(config_value, "event_log_storage"))

    def _shard_engine(self, shard: str) -> Engine:
        with self._engines_lock:
            engine = self._engines.get(shard)
            if engine is None:
                engine = self._engines[shard] = _engine(self.conn_string_for_shard(shard))
                while len(self._engines) > RUN_SHARD_ENGINES + 1:  # + the index shard, used on every call
                    oldest = next(key for key in self._engines if key != "index")
                    self._engines.pop(oldest).dispose()
            self._engines.move_to_end(shard)
            return engine

    @contextmanager
    @override
    def _connect(self, shard: str) -> Iterator[Connection]:
        with self._db_lock:
            engine = self._shard_engine(shard)
            if shard not in self._initialized_dbs:
                path = self.path_for_shard(shard)
                if not self._copied_empty_run_shard(shard) and not CHECKED.holds(path):
                    self._initdb(engine)
                    CHECKED.add(path)
                self._initialized_dbs.add(shard)
            with engine.connect() as conn, conn.begin():
                yield conn

    def _copied_empty_run_shard(self, shard: str) -> bool:
        """Create a new run's database from the template (built on first use); False when not a new run."""
        path = self.path_for_shard(shard)
        if shard == INDEX_SHARD_NAME or os.path.exists(path):
            return False
        template = os.path.join(self._base_dir, RUN_SHARD_TEMPLATE)
        if not os.path.exists(template):
            building = f"{template}.{os.getpid()}.{threading.get_ident()}"
            engine = _engine(f"sqlite:///{building}")
            self._initdb(engine)
            engine.dispose()  # the last connection to close folds the WAL into the file
            os.replace(building, template)  # other processes see a whole template or none
        partial = f"{path}.{os.getpid()}.partial"
        shutil.copyfile(template, partial)
        os.replace(partial, path)
        return True

    @override
    def store_event(self, event: dagster.EventLogEntry) -> None:
        """`SqliteEventLogStorage.store_event` with the row passed as parameters of one INSERT
        compiled once, not built into a new statement per event (0.33 -> 0.20 ms an event, ~94 a run).
        Same rows, in the same databases: the run's, and the index for asset, check and run status events.
        """
        row = self._event_to_row(event)
        with self.run_connection(event.run_id) as conn:
            conn.execute(_INSERT_EVENT, row)
        event_type = event.dagster_event_type if event.is_dagster_event else None
        if event_type in ASSET_EVENTS:
            with self.index_transaction() as conn:
                event_id = conn.execute(_INSERT_EVENT, row).inserted_primary_key[0]
                self._store_asset_event_tags(conn, [event], [event_id])
                self._store_asset_event(conn, event, event_id)
        elif event_type in ASSET_CHECK_EVENTS:
            with self.index_connection() as conn:
                event_id = conn.execute(_INSERT_EVENT, row).inserted_primary_key[0]
            self.store_asset_check_event(event, event_id)
        elif event_type in EVENT_TYPE_TO_PIPELINE_RUN_STATUS:
            with self.index_connection() as conn:
                conn.execute(_INSERT_EVENT, row)

    @override
    def _store_asset_event(self, conn: Connection, event: dagster.EventLogEntry, event_id: int) -> None:
        """Dagster's update of the asset's row in `asset_keys`, trying the UPDATE first: Dagster tries
        an INSERT, which fails on every event of an asset already known (16 a run), and updates on the
        error. The same row results; the transaction holds SQLite's write lock, so no other process
        can insert the row between the two statements."""
        asset_key = event.dagster_event.asset_key if event.dagster_event else None
        if asset_key is None:
            return
        values = self._get_asset_entry_values(
            event, event_id, self._has_asset_key_index_cols_on_connection(conn)
        )
        if not values:
            return
        key = asset_key.to_string()
        updated = conn.execute(
            AssetKeyTable.update().where(AssetKeyTable.c.asset_key == key).values(**values)
        )
        if updated.rowcount == 0:
            conn.execute(AssetKeyTable.insert().values(asset_key=key, **values))

    @override
    def has_table(self, table_name: str) -> bool:
        """Asked before every asset and check event write, each time on a new engine and connection."""
        return self._schema.holds(("table", table_name), lambda: self._index_has_table(table_name))

    def _index_has_table(self, table_name: str) -> bool:
        with self._shard_engine(INDEX_SHARD_NAME).connect() as conn:
            return bool(conn.dialect.has_table(conn, table_name))

    @override
    def _has_asset_key_col_on_connection(self, conn: Connection, column_name: str) -> bool:
        """Reflected before every asset event write."""
        probe = super()._has_asset_key_col_on_connection
        return self._schema.holds(("asset_keys column", column_name), lambda: probe(conn, column_name))

    @override
    def has_secondary_index(self, name: str) -> bool:
        """Queried before every asset record read."""
        probe = super().has_secondary_index
        return self._schema.holds(("secondary index", name), lambda: probe(name))

    @override
    def has_dynamic_partition(self, partitions_def_name: str, partition_key: str) -> bool:
        key = (partitions_def_name, partition_key)
        if self._known_partitions.get(key, 0.0) > time.monotonic():
            return True
        exists = super().has_dynamic_partition(partitions_def_name, partition_key)
        if exists:
            self._known_partitions[key] = time.monotonic() + KNOWN_PARTITION_SECONDS
        return exists

    @override
    def get_dynamic_partitions(self, partitions_def_name: str) -> Sequence[str]:
        """Dagster's answer (the keys in the order they were added), from the list last loaded while
        the table's marker is unchanged; a new list each call, as Dagster's, for callers that edit it.
        The marker and the keys are read in one transaction, so a list is never kept under the
        marker of another state of the table."""
        self._check_partitions_table()
        loaded = self._keys_of(partitions_def_name)
        with self.index_connection() as conn:
            marker = tuple(conn.execute(_PARTITIONS_MARKER).one())
            cached = _PARTITION_KEYS_LOADED.get(loaded)
            if cached is None or cached[0] != marker:
                keys = [row[0] for row in conn.exec_driver_sql(_PARTITION_KEYS, (partitions_def_name,))]
                cached = _PARTITION_KEYS_LOADED[loaded] = (marker, keys)
        return list(cached[1])

    def _keys_of(self, partitions_def_name: str) -> tuple[str, str]:
        return (self.conn_string_for_shard(INDEX_SHARD_NAME), partitions_def_name)

    @override
    def add_dynamic_partitions(self, partitions_def_name: str, partition_keys: Sequence[str]) -> None:
        """Dagster's add, which reads which keys exist and then inserts the others, once more when
        another process inserted one of them in between (two sensors of a daemon requesting the same
        files at once: the insert fails on the table's unique key); the second read sees them."""
        try:
            super().add_dynamic_partitions(partitions_def_name, partition_keys)
        except sqlalchemy.exc.IntegrityError:
            super().add_dynamic_partitions(partitions_def_name, partition_keys)
        _PARTITION_KEYS_LOADED.pop(self._keys_of(partitions_def_name), None)

    @override
    def delete_dynamic_partition(self, partitions_def_name: str, partition_key: str) -> None:
        self._known_partitions.pop((partitions_def_name, partition_key), None)
        super().delete_dynamic_partition(partitions_def_name, partition_key)
        _PARTITION_KEYS_LOADED.pop(self._keys_of(partitions_def_name), None)

    @override
    def dispose(self) -> None:
        with self._engines_lock:
            for engine in self._engines.values():
                engine.dispose()
            self._engines.clear()
        super().dispose()


class LocalRunStorage(SqliteRunStorage):
    """`SqliteRunStorage` with its one engine kept between calls."""

    @classmethod
    @override
    def config_type(cls) -> dict[str, dagster.Field]:
        return OPTIONAL_BASE_DIR

    @classmethod
    @override
    def from_config_value(cls, inst_data: ConfigurableClassData | None, config_value) -> LocalRunStorage:
        return _checked_storage(
            cls, inst_data, _with_base_dir(config_value, "run_storage")["base_dir"], "runs"
        )

    @contextmanager
    @override
    def connect(self) -> Iterator[Connection]:
        if not hasattr(self, "_reused_engine"):
            self._reused_engine = _engine(self._conn_string)
        with self._reused_engine.connect() as conn, conn.begin():
            yield conn

    @cached_property
    def _schema(self) -> SchemaFacts:
        return SchemaFacts()

    @override
    def has_run_stats_index_cols(self) -> bool:
        """Reflected on every run creation and status change."""
        return self._schema.holds(("runs columns", "start_time end_time"), super().has_run_stats_index_cols)

    @override
    def has_backfill_id_column(self) -> bool:
        """Reflected on every run creation."""
        return self._schema.holds(("runs column", "backfill_id"), super().has_backfill_id_column)


class LocalScheduleStorage(SqliteScheduleStorage):
    """Dagster's SQLite schedule storage (sensor and schedule state, ticks), under the Dagster home by default."""

    @classmethod
    @override
    def config_type(cls) -> dict[str, dagster.Field]:
        return OPTIONAL_BASE_DIR

    @classmethod
    @override
    def from_config_value(cls, inst_data: ConfigurableClassData | None, config_value) -> LocalScheduleStorage:
        base_dir = _with_base_dir(config_value, "schedule_storage")["base_dir"]
        return _checked_storage(cls, inst_data, base_dir, "schedules")


class CapturedComputeLogManager(LocalComputeLogManager):
    """`LocalComputeLogManager` that captures a run's stdout and stderr to the same files (the UI shows
    them as usual) without echoing them to the terminal.

    Dagster's echo starts four processes per capture: a `tail -F` per stream, each watched by a
    fresh Python interpreter: 0.065 s of child CPU per ingested document, plus the forks. Our steps report through
    `context.log`, which reaches the run's events and the terminal without them.
    """

    @classmethod
    @override
    def config_type(cls) -> dict[str, dagster.Field]:
        return {**super().config_type(), **OPTIONAL_BASE_DIR}

    @classmethod
    @override
    def from_config_value(
        cls, inst_data: ConfigurableClassData | None, config_value
    ) -> CapturedComputeLogManager:
        return cls(inst_data=inst_data, **_with_base_dir(config_value, "compute_logs"))

    @contextmanager
    @override
    def capture_logs(self, log_key: Sequence[str]) -> Generator[CapturedLogContext, None, None]:
        outpath = self.get_captured_local_path(log_key, IO_TYPE_EXTENSION[ComputeIOType.STDOUT])
        errpath = self.get_captured_local_path(log_key, IO_TYPE_EXTENSION[ComputeIOType.STDERR])
        for path in (outpath, errpath):
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            Path(path).touch()
        with redirect_to_file(sys.stdout, outpath), redirect_to_file(sys.stderr, errpath):
            yield CapturedLogContext(log_key)
        Path(self.complete_artifact_path(log_key)).touch()
