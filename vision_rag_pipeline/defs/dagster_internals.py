"""The Dagster internals this project builds on: the one module that imports `dagster._`.

Both uses are instance plug-ins named in dagster.yaml, the place Dagster documents for swapping a
storage or a compute log manager; a plug-in is a subclass of the class it replaces, and Dagster
exports none of those classes, nor the protocol they share (`ConfigurableClass`), from `dagster`
or any other public module (checked on 1.13: `dir(dagster)`, the API docs' "Internals" page, which
documents them at these private paths; dagster-aws, -gcp and -azure import their compute log
managers' bases from the same paths). Anything else the plug-ins need that has a public name
(`dagster.Field`, `dagster.EventLogEntry`, `dagster_postgres.utils.pg_config`) is imported from
there, not from here. `vision_rag_pipeline_tests/test_dagster_internals.py` asserts that no other
module of the package imports `dagster._` and that every name below resolves on the installed
Dagster; `scripts/test_newest_dagster.sh` runs that and the other Dagster-facing tests on the
newest release.
"""

# The instance-config protocol every storage and compute log manager implements (`inst_data`,
# `config_type`, `from_config_value`): Dagster builds the classes dagster.yaml names through it.
# Public form: none.
from dagster._serdes import ConfigurableClass, ConfigurableClassData

# isort: split
# The SQLite storages Dagster itself uses by default (`storage: sqlite` in dagster.yaml), subclassed
# by defs/local_storage.py to keep one SQLAlchemy engine per database file instead of one per call,
# answer schema probes once, and write an event's rows with one precompiled INSERT: what that saves
# per ingested document is measured in BENCHMARKS.md ("Local run storage against Dagster's"). It also
# keeps a dynamic partitions definition's keys while the table is unchanged: Dagster loads them all
# 9-12 times to create one run over a partition range (BENCHMARKS.md "Catalog of 100,000
# documents"), and builds a storage on a database this process already checked without checking its
# schema revision again (`create_db_conn_string`: the URL Dagster's own builder gives that file). The
# public configuration only picks these classes or Postgres; it cannot change how they connect or
# what they read.
from dagster._core.storage.event_log.sqlite.sqlite_event_log import INDEX_SHARD_NAME, SqliteEventLogStorage
from dagster._core.storage.runs.sqlite.sqlite_run_storage import SqliteRunStorage
from dagster._core.storage.schedules.sqlite.sqlite_schedule_storage import SqliteScheduleStorage
from dagster._core.storage.sqlite import create_db_conn_string

# isort: split
# What `SqliteEventLogStorage.store_event` writes and which events it also writes to the index
# database: the override in local_storage.py writes the same rows to the same tables, so it takes
# Dagster's own tables and event sets rather than copies that could drift from the next release.
from dagster._core.events import ASSET_CHECK_EVENTS, ASSET_EVENTS, EVENT_TYPE_TO_PIPELINE_RUN_STATUS
from dagster._core.storage.event_log.schema import AssetKeyTable, SqlEventLogStorageTable

# isort: split
# Compute logs. `LocalComputeLogManager` (Dagster's default) is subclassed to capture a step's output
# without echoing it through `tail -F` processes (four a run, see BENCHMARKS.md); the capture itself
# is Dagster's `redirect_to_file`, the same file-descriptor redirect its own manager uses, and the
# file names (`IO_TYPE_EXTENSION`) are the ones its readers expect.
from dagster._core.execution.compute_logs import redirect_to_file
from dagster._core.storage.compute_log_manager import (
    CapturedLogContext,
    CapturedLogSubscription,
    ComputeIOType,
)
from dagster._core.storage.local_compute_log_manager import IO_TYPE_EXTENSION, LocalComputeLogManager

# isort: split
# The base of the S3, GCS and Azure compute log managers (upload when a step ends, partial uploads,
# the UI's polling), which defs/compute_logs.py extends with a Postgres table so that every host of
# a deployment reads a step's output. Public form: none (dagster-aws imports it from here too).
from dagster._core.storage.cloud_storage_compute_log_manager import (
    PollingComputeLogSubscriptionManager,
    TruncatingCloudStorageComputeLogManager,
)

__all__ = [
    "ASSET_CHECK_EVENTS",
    "ASSET_EVENTS",
    "EVENT_TYPE_TO_PIPELINE_RUN_STATUS",
    "INDEX_SHARD_NAME",
    "IO_TYPE_EXTENSION",
    "AssetKeyTable",
    "CapturedLogContext",
    "CapturedLogSubscription",
    "ComputeIOType",
    "ConfigurableClass",
    "ConfigurableClassData",
    "LocalComputeLogManager",
    "PollingComputeLogSubscriptionManager",
    "SqlEventLogStorageTable",
    "SqliteEventLogStorage",
    "SqliteRunStorage",
    "SqliteScheduleStorage",
    "TruncatingCloudStorageComputeLogManager",
    "create_db_conn_string",
    "redirect_to_file",
]
