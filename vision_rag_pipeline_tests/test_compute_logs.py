"""Compute logs in Postgres: output captured on one host is read on another (each with its own
local folder), partial uploads are replaced by the whole log, deleting a run's logs removes them, and
a database that does not answer fails a call in seconds."""

from __future__ import annotations

import socket
import sys
import time
from pathlib import Path

import psycopg
import pytest

from vision_rag_pipeline.defs.compute_logs import (
    CONNECT_TIMEOUT_S,
    STATEMENT_TIMEOUT_S,
    TABLE,
    PostgresComputeLogManager,
)
from vision_rag_pipeline.defs.dagster_internals import ComputeIOType


def _manager(url: str, local_dir: Path) -> PostgresComputeLogManager:
    return PostgresComputeLogManager(url, local_dir=str(local_dir))


def test_output_captured_on_one_host_is_read_on_another(fresh_database: str, tmp_path: Path) -> None:
    worker = _manager(fresh_database, tmp_path / "worker")
    key = ["run-1", "compute_logs", "step-a"]
    with worker.capture_logs(key):
        print("embedded 12 chunks")
        print("model loaded", file=sys.stderr)
        sys.stdout.flush()
        sys.stderr.flush()
    assert not list((tmp_path / "worker").rglob("*.out")), "the worker keeps no copy"

    webserver = _manager(fresh_database, tmp_path / "webserver")  # never saw the worker's folder
    assert webserver.is_capture_complete(key)
    out, _ = webserver.get_log_data_for_type(key, ComputeIOType.STDOUT, 0, None)
    err, _ = webserver.get_log_data_for_type(key, ComputeIOType.STDERR, 0, None)
    assert out == b"embedded 12 chunks\n" and err == b"model loaded\n"
    assert "postgres" in webserver.get_log_metadata(key).stdout_location

    webserver.delete_logs(prefix=["run-1"])
    with psycopg.connect(fresh_database) as conn:
        assert conn.execute(f"SELECT count(*) FROM {TABLE}").fetchone() == (0,)
    assert not webserver.is_capture_complete(key)


def test_a_partial_upload_is_readable_then_replaced_by_the_whole_log(
    fresh_database: str, tmp_path: Path
) -> None:
    worker = _manager(fresh_database, tmp_path / "worker")
    key = ["run-2", "compute_logs", "step-b"]
    with worker.capture_logs(key):
        print("first half")
        sys.stdout.flush()
        worker.on_progress(key)  # what the upload thread does every `upload_interval` seconds
        reader = _manager(fresh_database, tmp_path / "reader")
        partial, _ = reader.get_log_data_for_type(key, ComputeIOType.STDOUT, 0, None)
        assert partial == b"first half\n"
        print("second half")
        sys.stdout.flush()
    with psycopg.connect(fresh_database) as conn:
        assert conn.execute(f"SELECT count(*) FROM {TABLE} WHERE partial").fetchone() == (0,)
    whole, _ = _manager(fresh_database, tmp_path / "other").get_log_data_for_type(
        key, ComputeIOType.STDOUT, 0, None
    )
    assert whole == b"first half\nsecond half\n"


def test_a_database_that_does_not_answer_fails_a_read_within_the_connect_bound(tmp_path: Path) -> None:
    """A server that accepts the connection and says nothing (a stopped process, a frozen VM): the
    UI's read of a step's output fails in seconds instead of hanging its page."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        port = silent.getsockname()[1]
        manager = _manager(f"postgresql://postgres@127.0.0.1:{port}/dagster", tmp_path)
        started = time.monotonic()
        with pytest.raises(psycopg.OperationalError):
            manager.cloud_storage_has_logs(["run-3", "compute_logs", "step-c"], ComputeIOType.STDOUT)
        assert time.monotonic() - started < CONNECT_TIMEOUT_S + 2


def test_statements_run_under_a_bound(fresh_database: str, tmp_path: Path) -> None:
    with _manager(fresh_database, tmp_path)._connect() as conn:
        assert conn.execute("SHOW statement_timeout").fetchone() == (f"{STATEMENT_TIMEOUT_S // 60}min",)


def test_a_manager_without_a_local_dir_removes_its_own_folder_on_dispose(fresh_database: str) -> None:
    """Each process that opens the instance makes one: left behind, they piled up in /tmp."""
    manager = PostgresComputeLogManager(fresh_database)
    key = ["run-4", "compute_logs", "step-d"]
    with manager.capture_logs(key):
        print("a line")
        sys.stdout.flush()
    folder = Path(manager.local_manager.get_captured_local_path(key, "out")).parents[2]
    assert folder.name.startswith("vision-rag-compute-logs-") and folder.is_dir()
    manager.dispose()
    assert not folder.exists()
    reader = PostgresComputeLogManager(fresh_database)
    out, _ = reader.get_log_data_for_type(key, ComputeIOType.STDOUT, 0, None)
    reader.dispose()
    assert out == b"a line\n", "the log itself stays in the database"
