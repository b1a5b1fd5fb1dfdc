"""Connections to the index database: reused after a clean commit, never after a failure."""

from __future__ import annotations

import glob
import os
import shutil
import signal
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

from vision_rag_pipeline.core import postgres
from vision_rag_pipeline.core.postgres import (
    DatabaseUnavailable,
    connect,
    running_embedded,
    start_embedded,
    statement_timeout,
    stop_embedded,
)


def test_the_embedded_server_gets_an_eighth_of_the_memory_for_its_buffers(pg_url: str) -> None:
    """At Postgres' default 128 MB a search over ~100k chunks reads its HNSW pages from the OS cache
    each time; the embedded server is started with an eighth of the machine's memory, at most 1 GB."""
    if os.environ.get("VISION_RAG_PG_URL"):
        pytest.skip("a server run by the caller is theirs to tune")
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    with connect(pg_url) as conn:
        blocks, block_size = conn.execute(
            "SELECT setting::bigint, current_setting('block_size')::bigint FROM pg_settings"
            " WHERE name = 'shared_buffers'"
        ).fetchone()
    assert blocks * block_size // 2**20 == max(128, min(1024, memory // 8 // 2**20))


def test_the_embedded_server_builds_hnsw_graphs_in_a_quarter_of_the_memory(pg_url: str) -> None:
    """At Postgres' default 64 MB pgvector builds the graph of more than ~30k chunks on disk, many
    times slower (`vision-rag reindex`); the embedded server gets a quarter of the machine's memory,
    at most 4 GB and half of /dev/shm, where a parallel build reserves it."""
    if os.environ.get("VISION_RAG_PG_URL"):
        pytest.skip("a server run by the caller is theirs to tune")
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    shared_memory = shutil.disk_usage("/dev/shm").total if Path("/dev/shm").is_dir() else memory
    with connect(pg_url) as conn:
        kilobytes = conn.execute(
            "SELECT setting::bigint FROM pg_settings WHERE name = 'maintenance_work_mem'"
        ).fetchone()[0]
    assert kilobytes // 1024 == max(64, min(4096, memory // 4 // 2**20, shared_memory // 2 // 2**20))


def _backend(url: str) -> int:
    with connect(url) as conn:
        return conn.execute("SELECT pg_backend_pid()").fetchone()[0]


def test_a_committed_connection_is_reused_and_its_writes_are_kept(pg_url: str) -> None:
    with connect(pg_url) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS pool_probe (n int)")
        conn.execute("DELETE FROM pool_probe")
        conn.execute("INSERT INTO pool_probe VALUES (1)")
        first = conn.execute("SELECT pg_backend_pid()").fetchone()[0]
    assert _backend(pg_url) == first
    with psycopg.connect(pg_url) as other:  # committed: another session sees it
        assert other.execute("SELECT count(*) FROM pool_probe").fetchone()[0] == 1


def test_a_connection_whose_transaction_failed_is_dropped_and_its_writes_rolled_back(pg_url: str) -> None:
    with connect(pg_url) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS pool_probe (n int)")
        conn.execute("DELETE FROM pool_probe")
    with pytest.raises(psycopg.errors.DivisionByZero), connect(pg_url) as conn:
        failed = conn.execute("SELECT pg_backend_pid()").fetchone()[0]
        conn.execute("INSERT INTO pool_probe VALUES (2)")
        conn.execute("SELECT 1 / 0")
    assert _backend(pg_url) != failed
    with connect(pg_url) as conn:
        assert conn.execute("SELECT count(*) FROM pool_probe").fetchone()[0] == 0


class _FreezableProxy:
    """A TCP port that relays to the session's Postgres socket until `freeze()`: from then on it
    passes nothing either way, as a server whose processes are stopped answers nothing."""

    def __init__(self, pg_url: str) -> None:
        folder = conninfo_to_dict(pg_url)["host"]
        [self.target] = [
            path for path in glob.glob(str(Path(folder) / ".s.PGSQL.*")) if not path.endswith(".lock")
        ]
        self.frozen = threading.Event()
        self.held: list[socket.socket] = []
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"postgresql://postgres@127.0.0.1:{self.listener.getsockname()[1]}/postgres"
        threading.Thread(target=self._accept, daemon=True).start()

    def freeze(self) -> None:
        self.frozen.set()

    def _accept(self) -> None:
        while True:
            client, _ = self.listener.accept()
            if self.frozen.is_set():
                self.held.append(client)  # accepted, never answered
                continue
            server = socket.socket(socket.AF_UNIX)
            server.connect(self.target)
            for source, sink in ((client, server), (server, client)):
                threading.Thread(target=self._relay, args=(source, sink), daemon=True).start()

    def _relay(self, source: socket.socket, sink: socket.socket) -> None:
        while data := source.recv(65536):
            while self.frozen.is_set():
                time.sleep(0.05)
            sink.sendall(data)


@pytest.fixture
def proxy(pg_url: str) -> Iterator[_FreezableProxy]:
    yield _FreezableProxy(pg_url)


def _within(seconds: float, action) -> BaseException | None:  # noqa: ANN001 - a callable
    """What `action` raised, run on a thread that must end within `seconds`."""
    raised: list[BaseException] = []

    def run() -> None:
        try:
            action()
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            raised.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"still waiting on a hung database after {seconds} s"
    return raised[0] if raised else None


def test_a_hung_server_fails_a_statement_within_its_bound_even_on_a_connection_used_for_work(
    proxy: _FreezableProxy,
) -> None:
    """A connection last used for work (bound 600 s) went back to the pool and was handed to the
    health probe: setting its 2 s bound waited on the hung server under the old one, and /health said
    ok for as long as the database was stopped."""
    with connect(proxy.url) as conn:  # work: limits.database.statement_timeout_s
        conn.execute("SELECT 1")
    proxy.freeze()

    def probe() -> None:
        with statement_timeout(1.0), connect(proxy.url) as conn:
            conn.execute("SELECT 1")

    started = time.monotonic()
    failure = _within(10, probe)
    assert isinstance(failure, DatabaseUnavailable) and "no answer within 1.5 s" in str(failure), failure
    assert time.monotonic() - started < 5
    failure = _within(15, probe)  # no idle connection left: a new one, which never completes
    assert isinstance(failure, DatabaseUnavailable) and "no connection within" in str(failure), failure


def test_a_stop_that_timed_out_still_keeps_the_server_stopped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stop whose shutdown outlasts its wait (a checkpoint on a busy disk) raises; once the
    server is gone, this process's next connection fails instead of starting it again: a test
    worker left such a server running after its session."""
    pgdata = tmp_path / "pgdata"
    url = start_embedded(pgdata)
    server = running_embedded(pgdata)
    try:
        with connect(url) as conn:
            conn.execute("SELECT 1")
        with monkeypatch.context() as slow:
            slow.setattr(postgres.os, "kill", lambda pid, sig: None)  # the shutdown has not ended yet
            with pytest.raises(TimeoutError, match="still running after"):
                stop_embedded(pgdata, timeout=0.3)
        os.kill(server.pid, signal.SIGINT)  # ... and now it ends
        deadline = time.monotonic() + 30
        while running_embedded(pgdata) is not None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert running_embedded(pgdata) is None
        with pytest.raises(DatabaseUnavailable), connect(url) as conn:
            conn.execute("SELECT 1")
        assert running_embedded(pgdata) is None
    finally:
        stop_embedded(pgdata)


def test_a_server_this_process_stopped_is_not_started_again_by_its_next_connection(tmp_path: Path) -> None:
    """A server that died is started again by the next connection; one this process stopped on
    purpose (`vision-rag db stop`, a test session's end) stays stopped: the lease renewal's thread
    went on connecting after a session's end and left a server running that nobody stopped."""
    pgdata = tmp_path / "pgdata"
    url = start_embedded(pgdata)
    try:
        with connect(url) as conn:
            conn.execute("SELECT 1")
        stop_embedded(pgdata)
        with pytest.raises(DatabaseUnavailable), connect(url) as conn:
            conn.execute("SELECT 1")
        assert running_embedded(pgdata) is None
    finally:
        stop_embedded(pgdata)
