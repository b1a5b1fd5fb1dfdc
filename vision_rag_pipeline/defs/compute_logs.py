"""Compute logs (each step's stdout and stderr) in the Dagster database, which every host reaches.

A step captures its output to a local file as usual; when the step ends the file goes into the
table `vision_rag_compute_logs` of the instance's Postgres and the local copy is deleted. The UI,
the daemon or any other host reads it from there. Dagster's own local compute log manager keeps the
files on the disk of whichever host ran the step, which in a multi-host deployment (a Celery worker,
a run pod) the webserver cannot see; a shared volume would make every host mount one more thing
that Kubernetes and plain hosts do not have by default, while Postgres is already the one store
every process of a deployment must reach. Logs are capped at Dagster's upload limit
(`DAGSTER_TRUNCATE_COMPUTE_LOGS_UPLOAD_BYTES`, 50 MB a stream); our steps report through
`context.log` (run events), so what lands here is small.

Built on Dagster's base for cloud-storage log managers (the S3, GCS and Azure ones subclass it
too), which has no public name: it comes from defs/dagster_internals.py.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import IO

import dagster
import psycopg
from dagster_postgres.utils import pg_config, pg_url_from_config
from typing_extensions import override

from vision_rag_pipeline.core.config import DatabaseLimits
from vision_rag_pipeline.defs.dagster_internals import (
    IO_TYPE_EXTENSION,
    CapturedLogSubscription,
    ComputeIOType,
    ConfigurableClass,
    ConfigurableClassData,
    PollingComputeLogSubscriptionManager,
    TruncatingCloudStorageComputeLogManager,
)
from vision_rag_pipeline.defs.local_storage import CapturedComputeLogManager

TABLE = "vision_rag_compute_logs"
# A step's end, the UI and the daemon wait on these calls: a database that does not answer fails them
# in seconds (as limits.database bounds the index database's) instead of hanging the step or the page.
# A statement moves at most one stream's capped upload (50 MB).
CONNECT_TIMEOUT_S = DatabaseLimits().connect_timeout_s
STATEMENT_TIMEOUT_S = 60
_SCHEMA = f"""
CREATE TABLE IF NOT EXISTS {TABLE} (
    log_key text NOT NULL,  -- Dagster's log key joined by '/': run id, then step or capture key
    io_type text NOT NULL,  -- stdout | stderr
    partial boolean NOT NULL,  -- an upload while the step still runs
    data bytea NOT NULL,
    stored_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (log_key, io_type, partial)
)
"""


class PostgresComputeLogManager(TruncatingCloudStorageComputeLogManager, ConfigurableClass):
    """Step stdout/stderr in a Postgres table; configured like dagster-postgres' storage
    (`postgres_url` or `postgres_db`), optionally `local_dir` (where capture files live until
    stored; default a temporary folder) and `upload_interval` (seconds between partial uploads of
    a running step's output; default none: stored when the step ends)."""

    def __init__(
        self,
        postgres_url: str,
        local_dir: str | None = None,
        upload_interval: int | None = None,
        inst_data: ConfigurableClassData | None = None,
    ):
        super().__init__()
        # dagster-postgres names the SQLAlchemy driver in the scheme; libpq wants the plain one.
        self._url = postgres_url.replace("postgresql+psycopg2://", "postgresql://")
        # a folder of its own unless configured, removed on dispose: every process that opens the
        # instance (each run, the daemon, the webserver) makes one
        self._own_dir = None if local_dir else tempfile.mkdtemp(prefix="vision-rag-compute-logs-")
        self._local_manager = CapturedComputeLogManager(local_dir or self._own_dir)
        self._upload_interval = upload_interval
        self._subscription_manager = PollingComputeLogSubscriptionManager(self)
        self._inst_data = inst_data
        self._schema_ready = False

    @property
    @override
    def inst_data(self) -> ConfigurableClassData | None:
        return self._inst_data

    @classmethod
    @override
    def config_type(cls) -> dict[str, dagster.Field]:
        return {
            **pg_config(),
            "local_dir": dagster.Field(dagster.StringSource, is_required=False),
            "upload_interval": dagster.Field(dagster.IntSource, is_required=False),
        }

    @classmethod
    @override
    def from_config_value(
        cls, inst_data: ConfigurableClassData | None, config_value
    ) -> PostgresComputeLogManager:
        return cls(
            postgres_url=pg_url_from_config(config_value),
            local_dir=config_value.get("local_dir"),
            upload_interval=config_value.get("upload_interval"),
            inst_data=inst_data,
        )

    @property
    @override
    def local_manager(self) -> CapturedComputeLogManager:
        return self._local_manager

    @property
    @override
    def upload_interval(self) -> int | None:
        return self._upload_interval

    @contextmanager
    def _connect(self) -> Iterator[psycopg.Connection]:
        with psycopg.connect(
            self._url,
            connect_timeout=CONNECT_TIMEOUT_S,
            options=f"-c statement_timeout={STATEMENT_TIMEOUT_S * 1000}",
        ) as conn:
            if not self._schema_ready:
                conn.execute(_SCHEMA)
                self._schema_ready = True
            yield conn

    @override
    def _upload_file_obj(
        self, data: IO[bytes], log_key: Sequence[str], io_type: ComputeIOType, partial=False
    ):
        with self._connect() as conn:
            conn.execute(
                f"INSERT INTO {TABLE} (log_key, io_type, partial, data) VALUES (%s, %s, %s, %s)"
                " ON CONFLICT (log_key, io_type, partial) DO UPDATE"
                " SET data = EXCLUDED.data, stored_at = now()",
                ("/".join(log_key), io_type.value, partial, data.read()),
            )

    def _stored(
        self, column: str, log_key: Sequence[str], io_type: ComputeIOType, partial: bool
    ) -> tuple | None:
        with self._connect() as conn:
            return conn.execute(
                f"SELECT {column} FROM {TABLE} WHERE log_key = %s AND io_type = %s AND partial = %s",
                ("/".join(log_key), io_type.value, partial),
            ).fetchone()

    @override
    def cloud_storage_has_logs(
        self, log_key: Sequence[str], io_type: ComputeIOType, partial: bool = False
    ) -> bool:
        return self._stored("1", log_key, io_type, partial) is not None

    @override
    def download_from_cloud_storage(
        self, log_key: Sequence[str], io_type: ComputeIOType, partial: bool = False
    ) -> None:
        row = self._stored("data", log_key, io_type, partial)
        if row is None:
            return
        path = self._local_manager.get_captured_local_path(
            log_key, IO_TYPE_EXTENSION[io_type], partial=partial
        )
        os.makedirs(os.path.dirname(path), exist_ok=True)
        partial_path = f"{path}.{os.getpid()}.download"
        with open(partial_path, "wb") as handle:
            handle.write(row[0])
        os.replace(partial_path, path)

    @override
    def delete_logs(self, log_key: Sequence[str] | None = None, prefix: Sequence[str] | None = None) -> None:
        self._local_manager.delete_logs(log_key=log_key, prefix=prefix)
        with self._connect() as conn:
            if log_key:
                conn.execute(f"DELETE FROM {TABLE} WHERE log_key = %s", ("/".join(log_key),))
            elif prefix:
                pattern = "/".join(part.replace("%", r"\%").replace("_", r"\_") for part in prefix)
                conn.execute(f"DELETE FROM {TABLE} WHERE log_key LIKE %s", (pattern + "/%",))

    @override
    def download_url_for_type(self, log_key: Sequence[str], io_type: ComputeIOType) -> str | None:
        return None  # the UI shows the text itself; there is no file to link to

    @override
    def display_path_for_type(self, log_key: Sequence[str], io_type: ComputeIOType) -> str:
        return f"postgres table {TABLE}: {'/'.join(log_key)} ({io_type.value})"

    @override
    def on_subscribe(self, subscription: CapturedLogSubscription) -> None:
        self._subscription_manager.add_subscription(subscription)

    @override
    def on_unsubscribe(self, subscription: CapturedLogSubscription) -> None:
        self._subscription_manager.remove_subscription(subscription)

    @override
    def _on_capture_complete(self, log_key: Sequence[str]) -> None:
        """Stored whole, then the partial uploads of the running step are dropped."""
        super()._on_capture_complete(log_key)
        with self._connect() as conn:
            conn.execute(f"DELETE FROM {TABLE} WHERE log_key = %s AND partial", ("/".join(log_key),))

    @override
    def dispose(self) -> None:
        self._subscription_manager.dispose()
        super().dispose()
        if self._own_dir:
            shutil.rmtree(self._own_dir, ignore_errors=True)
