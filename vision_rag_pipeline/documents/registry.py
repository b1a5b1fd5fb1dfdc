"""Every file any door was given, what became of it, a copy of its bytes, and who works on it now.

A partition key must outlive the process that registered it (the UI, a sensor or a backfill
materializes it later, possibly on another machine), so the path and a copy of the file's bytes
are kept in the index database when it is registered. Runs read the copy, never the path: a run
pod sees only Postgres, and the original may be gone (an inbox file moved away, an upload's
temporary file). Registering the same path again replaces the copy.

One row per path, keyed by `document_id_for(path)`, holds the file's fate, whichever door it came
through (the CLI, an upload, the inbox, a backfill):

- `requested`: registered and waiting for a run; `queued`: a sensor asked Dagster for its run
  (`run_key`); `running`: a run holds its lease; `ingested`; `failed` with a one-line `reason`;
  `refused` at the door (not an MHTML or PDF, empty, unreadable) with its reason and no partition;
  `duplicate`: the same bytes as another document (`alias_of`), indexed once under that one.
- `attempts`: the runs that tried the document since it was last requested.
- The lease (`run_id`, `owner`, `renewed_at`): the one run at a time that may store or load the
  document's values, and the process executing it. It passes on when Dagster reports the run
  finished or its process is gone (`process_gone`: the same host checks the pid, another host the
  lease's renewals), so a crash never leaks it.

Files that arrived through the inbox also keep their size, mtime and sha256 here: the inbox
sensor's state lives in this table, one row per file, so a tick over an unchanged inbox writes
nothing and its cursor stays empty.
"""

from __future__ import annotations

import hashlib
import os
import re
import socket
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from functools import cache
from pathlib import Path
from typing import Literal, NamedTuple

import psutil
from pydantic import BaseModel

from vision_rag_pipeline.core.postgres import connect, ensure_schema

LEASE_SECONDS = 60  # a lease not renewed for this long belongs to a process gone (on another host)
HOLD_SECONDS = 60.0  # a document registered `held` by a process that died is claimable after this

# Idempotent: the ALTERs upgrade a registry created before the inbox kept its state here, and
# before fates and leases; `document_runs` held the leases before they moved here.
_SCHEMA = """
CREATE TABLE IF NOT EXISTS documents (
    document_id text PRIMARY KEY,
    source_path text NOT NULL,
    abs_path text NOT NULL,
    registered_at timestamptz NOT NULL DEFAULT now()
);
ALTER TABLE documents ADD COLUMN IF NOT EXISTS path_bytes bytea;
ALTER TABLE documents ADD COLUMN IF NOT EXISTS inbox_size bigint;
ALTER TABLE documents ADD COLUMN IF NOT EXISTS inbox_mtime_ns bigint;
ALTER TABLE documents ADD COLUMN IF NOT EXISTS inbox_sha256 text;
ALTER TABLE documents ADD COLUMN IF NOT EXISTS content bytea;
ALTER TABLE documents ADD COLUMN IF NOT EXISTS content_sha256 text;
ALTER TABLE documents ADD COLUMN IF NOT EXISTS door text;
ALTER TABLE documents ADD COLUMN IF NOT EXISTS state text;
ALTER TABLE documents ADD COLUMN IF NOT EXISTS reason text;
ALTER TABLE documents ADD COLUMN IF NOT EXISTS attempts int NOT NULL DEFAULT 0;
ALTER TABLE documents ADD COLUMN IF NOT EXISTS job text;
ALTER TABLE documents ADD COLUMN IF NOT EXISTS request text;
ALTER TABLE documents ADD COLUMN IF NOT EXISTS not_before timestamptz;
ALTER TABLE documents ADD COLUMN IF NOT EXISTS run_key text;
ALTER TABLE documents ADD COLUMN IF NOT EXISTS run_id text;
ALTER TABLE documents ADD COLUMN IF NOT EXISTS owner text;
ALTER TABLE documents ADD COLUMN IF NOT EXISTS renewed_at timestamptz;
ALTER TABLE documents ADD COLUMN IF NOT EXISTS alias_of text;
ALTER TABLE documents ADD COLUMN IF NOT EXISTS updated_at timestamptz NOT NULL DEFAULT now();
UPDATE documents SET content_sha256 = encode(sha256(content), 'hex')
    WHERE content_sha256 IS NULL AND content IS NOT NULL;
CREATE INDEX IF NOT EXISTS documents_unfinished ON documents (state, updated_at)
    WHERE state IN ('requested', 'queued', 'running');
CREATE INDEX IF NOT EXISTS documents_content_sha256 ON documents (content_sha256);
CREATE INDEX IF NOT EXISTS documents_state ON documents (state);
DROP TABLE IF EXISTS document_runs;
"""

State = Literal["requested", "queued", "running", "ingested", "failed", "refused", "duplicate"]
UNFINISHED: tuple[State, ...] = ("requested", "queued", "running")
INGEST_JOB = "ingest_document"


class RegisteredDocument(BaseModel):
    document_id: str
    source_path: str  # the path as the user gave it (undecodable bytes shown as \\x escapes)
    abs_path: str  # what to open: exact, even when the file name is not UTF-8


class Fate(BaseModel):
    """What became of one file: what `vision-rag status` and `GET /documents/{id}` show."""

    document_id: str
    path: str
    door: str | None
    state: State | None  # None: registered before fates were recorded
    reason: str | None = None  # why it failed or was refused, one line
    attempts: int = 0
    duplicate_of: str | None = None
    run_id: str | None = None
    updated_at: datetime


class Summary(BaseModel):
    """Counts by state, and the files that need a look (failed, refused, unfinished), newest first."""

    counts: dict[str, int]
    attention: list[Fate]


class FileState(NamedTuple):
    """What the inbox sensor saw of a file: size and mtime say "maybe changed", the hash decides."""

    size: int
    mtime_ns: int
    sha256: str


class Rejected(NamedTuple):
    """An inbox file named like a document whose bytes are not one, as it was when read."""

    size: int
    mtime_ns: int
    reason: str


class InboxEntry(NamedTuple):
    """An inbox file's document and the state the sensor last saw it in."""

    document_id: str
    state: FileState


class Lease(NamedTuple):
    """Who holds a document: the run and the process executing it, last renewed when."""

    run_id: str
    owner: str | None
    renewed_at: datetime | None


class Unfinished(NamedTuple):
    document_id: str
    state: str  # queued | running
    run_key: str | None
    run_id: str | None
    attempts: int
    owner: str | None
    renewed_at: datetime | None
    updated_at: datetime


class Claimed(NamedTuple):
    """A requested document taken for a run."""

    document_id: str
    job: str
    request: str | None
    size: int


def display_path(path: str | bytes | Path) -> str:
    """A file name as text Postgres and Dagster accept: bytes that are not UTF-8 become \\x escapes."""
    return os.fsencode(path).decode("utf-8", "backslashreplace")


def document_id_for(path: str | bytes | Path, *, resolve: bool = True) -> str:
    """Stable, readable partition key: file stem slug + hash of the absolute path (its bytes).

    `resolve=False` keeps a symbolic link's own path: an inbox link is its own document, never the
    file it points at (which the CLI may have ingested under its own id).
    """
    given = Path(os.fsdecode(path)).expanduser()
    absolute = given.resolve() if resolve else given.absolute()
    slug = re.sub(r"[^a-z0-9]+", "-", absolute.stem.lower()).strip("-")[:40] or "document"
    return f"{slug}-{hashlib.sha1(os.fsencode(absolute)).hexdigest()[:10]}"


@cache
def this_process() -> str:
    """`host pid start-time`: who holds a lease (pids are reused, their start times are not)."""
    return f"{socket.gethostname()} {os.getpid()} {psutil.Process().create_time():.2f}"


def process_gone(owner: str | None, renewed_at: datetime | None, now: datetime) -> bool:
    """Whether the process named by a lease is gone: on this host by its pid, elsewhere because it
    stopped renewing the lease for `LEASE_SECONDS`."""
    if not owner:
        return True
    host, pid, started = (owner.split(" ") + ["", ""])[:3]
    if host != socket.gethostname():
        return renewed_at is None or (now - renewed_at).total_seconds() > LEASE_SECONDS
    try:
        process = psutil.Process(int(pid))
        return f"{process.create_time():.2f}" != started or process.status() == psutil.STATUS_ZOMBIE
    except (psutil.NoSuchProcess, ValueError):
        return True


class DocumentRegistry:
    def __init__(self, url: str | None = None) -> None:
        self.url = url
        ensure_schema(_SCHEMA, url)

    # --- what the doors record ----------------------------------------------------------------------

    def register(
        self,
        path: str | bytes | Path,
        door: str = "cli",
        *,
        job: str = INGEST_JOB,
        request: str | None = None,
        inbox_state: FileState | None = None,
        resolve: bool = True,
        content: bytes | None = None,
        held: bool = False,
    ) -> RegisteredDocument:
        """Record the file under its partition key, copy its bytes into the database and request a
        run of `job` for it (its attempts start afresh). `inbox_state`: the file lies in the inbox,
        which then knows it as seen. `held`: no claim takes it until `release_request(request)`, or
        HOLD_SECONDS from now should the registering process die first."""
        data = content if content is not None else _read(path)
        doc, path_bytes = self._document(path, resolve)
        state = inbox_state or FileState(None, None, None)  # type: ignore[arg-type]
        with connect(self.url) as conn:
            conn.execute(
                "INSERT INTO documents (document_id, source_path, abs_path, path_bytes, content, content_sha256,"
                " door, state, reason, attempts, job, request, not_before, run_key, alias_of,"
                " inbox_size, inbox_mtime_ns, inbox_sha256, updated_at)"
                " VALUES (%s, %s, %s, %s, %s, %s, %s, 'requested', NULL, 0, %s, %s,"
                " CASE WHEN %s THEN now() + make_interval(secs => %s) END, NULL, NULL, %s, %s, %s, now())"
                " ON CONFLICT (document_id) DO UPDATE SET source_path = EXCLUDED.source_path,"
                " abs_path = EXCLUDED.abs_path, path_bytes = EXCLUDED.path_bytes, content = EXCLUDED.content,"
                " content_sha256 = EXCLUDED.content_sha256, door = EXCLUDED.door, state = 'requested',"
                " reason = NULL, attempts = 0, job = EXCLUDED.job, request = EXCLUDED.request,"
                " not_before = EXCLUDED.not_before, run_key = NULL, alias_of = NULL, registered_at = now(),"
                " updated_at = now(), inbox_size = COALESCE(EXCLUDED.inbox_size, documents.inbox_size),"
                " inbox_mtime_ns = COALESCE(EXCLUDED.inbox_mtime_ns, documents.inbox_mtime_ns),"
                " inbox_sha256 = COALESCE(EXCLUDED.inbox_sha256, documents.inbox_sha256)",
                (
                    doc.document_id,
                    doc.source_path,
                    doc.abs_path,
                    path_bytes,
                    data,
                    _sha256(data),
                    door,
                    job,
                    request,
                    held,
                    HOLD_SECONDS,
                    *state,
                ),
            )
        return doc

    def refuse(
        self,
        path: str | bytes | Path,
        door: str,
        reason: str,
        *,
        inbox_state: FileState | None = None,
        resolve: bool = True,
    ) -> RegisteredDocument:
        """Record a file no run can ingest (not a document, empty, unreadable) with its reason."""
        return self._record_other(path, door, "refused", reason, None, inbox_state, resolve)

    def record_duplicate(
        self,
        path: str | bytes | Path,
        door: str,
        of: str,
        *,
        inbox_state: FileState | None = None,
        resolve: bool = True,
    ) -> RegisteredDocument:
        """Record a path whose bytes are those of document `of`: indexed once, under `of`."""
        return self._record_other(path, door, "duplicate", None, of, inbox_state, resolve)

    def _record_other(
        self,
        path: str | bytes | Path,
        door: str,
        state: State,
        reason: str | None,
        alias_of: str | None,
        inbox_state: FileState | None,
        resolve: bool,
    ) -> RegisteredDocument:
        doc, path_bytes = self._document(path, resolve)
        seen = inbox_state or FileState(None, None, None)  # type: ignore[arg-type]
        with connect(self.url) as conn:
            conn.execute(
                "INSERT INTO documents (document_id, source_path, abs_path, path_bytes, door, state, reason,"
                " alias_of, inbox_size, inbox_mtime_ns, inbox_sha256, updated_at)"
                " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, now())"
                " ON CONFLICT (document_id) DO UPDATE SET source_path = EXCLUDED.source_path,"
                " abs_path = EXCLUDED.abs_path, path_bytes = EXCLUDED.path_bytes, content = NULL,"
                " content_sha256 = NULL, door = EXCLUDED.door, state = EXCLUDED.state,"
                " reason = EXCLUDED.reason, alias_of = EXCLUDED.alias_of, attempts = 0, run_key = NULL,"
                " updated_at = now(), inbox_size = COALESCE(EXCLUDED.inbox_size, documents.inbox_size),"
                " inbox_mtime_ns = COALESCE(EXCLUDED.inbox_mtime_ns, documents.inbox_mtime_ns),"
                # a refused file is no inbox document: the inbox knows it as rejected (inbox_rejections)
                " inbox_sha256 = CASE WHEN EXCLUDED.state = 'refused' THEN NULL"
                " ELSE COALESCE(EXCLUDED.inbox_sha256, documents.inbox_sha256) END",
                (
                    doc.document_id,
                    doc.source_path,
                    doc.abs_path,
                    path_bytes,
                    door,
                    state,
                    reason,
                    alias_of,
                    *seen,
                ),
            )
        return doc

    @staticmethod
    def _document(path: str | bytes | Path, resolve: bool) -> tuple[RegisteredDocument, bytes]:
        """The row's identity, and the absolute path's exact bytes (any file name works)."""
        given = Path(os.fsdecode(path)).expanduser()
        absolute = os.fsencode(given.resolve() if resolve else given.absolute())
        doc = RegisteredDocument(
            document_id=document_id_for(path, resolve=resolve),
            source_path=display_path(path),
            abs_path=display_path(absolute),
        )
        return doc, absolute

    def request(
        self,
        document_ids: Sequence[str],
        door: str,
        job: str,
        request: str | None = None,
        *,
        unless_under_way: bool = False,
    ) -> list[str]:
        """Request a run of `job` for registered documents (a backfill); returns those requested.

        They are claimed in the order given (their `updated_at` a microsecond apart): given in partition
        order, each claim is a range of consecutive partitions, so a sensor's tick makes runs of whole
        batches rather than one run per scattered document. `unless_under_way`: a document already
        requested, queued or running is left to that run (which reads the settings in effect when it
        starts)."""
        busy = "AND (d.state IS NULL OR d.state NOT IN ('requested', 'queued', 'running'))"
        with connect(self.url) as conn:
            rows = conn.execute(
                "UPDATE documents AS d SET state = 'requested', door = %s, job = %s, request = %s,"
                " reason = NULL, attempts = 0, not_before = NULL, run_key = NULL,"
                " updated_at = now() + make_interval(secs => t.n / 1e6)"
                " FROM unnest(%s::text[]) WITH ORDINALITY AS t(document_id, n)"
                " WHERE d.document_id = t.document_id AND d.content IS NOT NULL"
                f" {busy if unless_under_way else ''} RETURNING d.document_id",
                (door, job, request, list(document_ids)),
            ).fetchall()
        return [document_id for (document_id,) in rows]

    def release_request(self, request: str) -> None:
        """Let claims take the documents registered `held` under `request`, all at once: files a door
        was given together are claimed together, as one batch of consecutive partitions, even by a
        sensor that ticks while the door is still registering them."""
        with connect(self.url) as conn:
            conn.execute(
                "UPDATE documents SET not_before = NULL"
                " WHERE request = %s AND state = 'requested' AND not_before > now()",
                (request,),
            )

    def content_owner(self, sha256: str, other_than: str) -> str | None:
        """A document (not `other_than`) whose stored bytes have this sha256 and that is, or is on its
        way to be, indexed."""
        with connect(self.url) as conn:
            row = conn.execute(
                "SELECT document_id FROM documents WHERE content_sha256 = %s AND document_id <> %s"
                " AND content IS NOT NULL AND state IS DISTINCT FROM 'failed' ORDER BY registered_at LIMIT 1",
                (sha256, other_than),
            ).fetchone()
        return row[0] if row else None

    # --- what runs read -----------------------------------------------------------------------------

    def content(self, document_id: str) -> bytes:
        """The bytes the file had when it was last registered."""
        with connect(self.url) as conn:
            row = conn.execute(
                "SELECT content FROM documents WHERE document_id = %s", (document_id,)
            ).fetchone()
        if row is None:
            raise KeyError(f"document {document_id!r} is not registered; ingest its file first")
        if row[0] is None:
            raise KeyError(
                f"document {document_id!r} has no stored copy (registered by an older version, or the file"
                " vanished while it was registered); ingest it again"
            )
        return bytes(row[0])

    def content_sha256(self, document_ids: Iterable[str]) -> dict[str, str]:
        """{document id: sha256 of its stored copy}."""
        with connect(self.url) as conn:
            rows = conn.execute(
                "SELECT document_id, content_sha256 FROM documents"
                " WHERE document_id = ANY(%s) AND content_sha256 IS NOT NULL",
                (list(document_ids),),
            ).fetchall()
        return dict(rows)

    def get(self, document_id: str) -> RegisteredDocument:
        with connect(self.url) as conn:
            row = conn.execute(
                "SELECT document_id, source_path, abs_path, path_bytes FROM documents WHERE document_id = %s",
                (document_id,),
            ).fetchone()
        if row is None:
            raise KeyError(f"document {document_id!r} is not registered; ingest its file first")
        return _registered(row)

    def forget(self, document_id: str) -> list[str]:
        """Drop the document's row and those of the paths recorded as its duplicates; returns the
        duplicates' source paths (their bytes went with the document)."""
        with connect(self.url) as conn:
            duplicates = conn.execute(
                "DELETE FROM documents WHERE alias_of = %s RETURNING source_path", (document_id,)
            ).fetchall()
            conn.execute("DELETE FROM documents WHERE document_id = %s", (document_id,))
        return [path for (path,) in duplicates]

    def all(self) -> list[RegisteredDocument]:
        """The documents with a stored copy (refused files and duplicates have none)."""
        with connect(self.url) as conn:
            rows = conn.execute(
                "SELECT document_id, source_path, abs_path, path_bytes FROM documents"
                " WHERE content IS NOT NULL ORDER BY 1"
            ).fetchall()
        return [_registered(row) for row in rows]

    # --- runs: requests, leases and outcomes --------------------------------------------------------

    def claim(
        self, owner: str, document_ids: Sequence[str] | None = None, limit: int | None = None
    ) -> list[Claimed]:
        """Take requested documents due for a run (`document_ids`: only those): `queued` under
        `owner` (a sensor's run key, or a process that will run them). Concurrent claimers get
        disjoint sets. Biggest first: a long document started last would hold up the end."""
        only = "AND document_id = ANY(%(ids)s)" if document_ids is not None else ""
        with connect(self.url) as conn:
            rows = conn.execute(
                "UPDATE documents SET state = 'queued', run_key = %(owner)s, updated_at = now()"
                " WHERE document_id IN (SELECT document_id FROM documents WHERE state = 'requested'"
                f" AND (not_before IS NULL OR not_before <= now()) {only}"
                " ORDER BY updated_at, document_id LIMIT %(limit)s FOR UPDATE SKIP LOCKED)"
                " RETURNING document_id, job, request, octet_length(content)",
                {"owner": owner, "ids": list(document_ids or []), "limit": limit},
            ).fetchall()
        return sorted((Claimed(*row) for row in rows), key=lambda c: (-(c.size or 0), c.document_id))

    def registered_in_order(self, document_ids: Iterable[str]) -> list[str]:
        """Those of the documents registered with a stored copy, in the order they were registered:
        the order their partitions were added in (a document registered again keeps its partition's
        place), read without loading every partition key from Dagster."""
        with connect(self.url) as conn:
            rows = conn.execute(
                "SELECT document_id FROM documents WHERE document_id = ANY(%s) AND content IS NOT NULL"
                " ORDER BY registered_at, document_id",
                (list(document_ids),),
            ).fetchall()
        return [document_id for (document_id,) in rows]

    def release(self, owner: str, document_ids: Sequence[str]) -> None:
        """Give claimed documents back to the requests, in their place: a tick that claimed more than it
        runs leaves the rest for the next one."""
        with connect(self.url) as conn:
            conn.execute(
                "UPDATE documents SET state = 'requested', run_key = NULL"
                " WHERE state = 'queued' AND run_key = %s AND document_id = ANY(%s)",
                (owner, list(document_ids)),
            )

    def waiting(self, door: str) -> int:
        """How many of the documents this door requested no run has taken yet."""
        with connect(self.url) as conn:
            return conn.execute(
                "SELECT count(*) FROM documents WHERE state IN ('requested', 'queued') AND door = %s", (door,)
            ).fetchone()[0]

    def next_due(self, document_ids: Sequence[str] | None = None) -> float | None:
        """Seconds until the first of these documents (None: any) requested for later is due, or None
        when none is requested."""
        only = "AND document_id = ANY(%s)" if document_ids is not None else ""
        with connect(self.url) as conn:
            row = conn.execute(
                "SELECT count(*), extract(epoch FROM min(coalesce(not_before, now())) - now())"
                f" FROM documents WHERE state = 'requested' {only}",
                (list(document_ids),) if document_ids is not None else (),
            ).fetchone()
        return float(row[1]) if row[0] else None

    def name_run(self, claimed: Mapping[str, str], owner: str) -> None:
        """{document id: run key} for documents claimed by `owner` (a sensor names each batch's run)."""
        with connect(self.url) as conn, conn.cursor() as cursor:
            cursor.executemany(
                "UPDATE documents SET run_key = %s WHERE document_id = %s AND state = 'queued' AND run_key = %s",
                [(key, document_id, owner) for document_id, key in claimed.items()],
            )

    def lease(self, document_id: str) -> Lease | None:
        with connect(self.url) as conn:
            row = conn.execute(
                "SELECT run_id, owner, renewed_at FROM documents WHERE document_id = %s AND run_id IS NOT NULL",
                (document_id,),
            ).fetchone()
        return Lease(*row) if row else None

    def take_lease(self, document_id: str, run_id: str, owner: str, holder: str | None = None) -> bool:
        """Hold the document for `run_id`, executed by `owner`: free, already ours, or taken from
        `holder` (a run found over). A new holder makes the document `running`, one attempt more;
        a document requested again meanwhile stays requested (this run may read older bytes)."""
        with connect(self.url) as conn:
            taken = conn.execute(
                "UPDATE documents SET run_id = %(run)s, owner = %(owner)s, renewed_at = now(),"
                " attempts = attempts + CASE WHEN run_id IS DISTINCT FROM %(run)s THEN 1 ELSE 0 END,"
                " state = CASE WHEN run_id IS DISTINCT FROM %(run)s AND (state IS NULL OR state IN"
                " ('queued', 'ingested', 'failed', 'running')) THEN 'running' ELSE state END,"
                " updated_at = CASE WHEN run_id IS DISTINCT FROM %(run)s THEN now() ELSE updated_at END"
                " WHERE document_id = %(doc)s AND (run_id IS NULL OR run_id = %(run)s OR run_id = %(holder)s)",
                {"run": run_id, "owner": owner, "doc": document_id, "holder": holder},
            ).rowcount
        return bool(taken)

    def renew(self, owner: str) -> None:
        """This process is alive: its leases stay its own."""
        with connect(self.url) as conn:
            conn.execute("UPDATE documents SET renewed_at = now() WHERE owner = %s", (owner,))

    def finish(
        self,
        run: Sequence[str],
        document_ids: Iterable[str],
        state: State,
        reason: str | None = None,
        retry_in: float | None = None,
        alone: bool = False,
        uncount: bool = False,
    ) -> list[str]:
        """Record what a run (named by its id, or a key it was requested or claimed under) made of its
        documents, those it still answers for: ingested, failed with its reason, or requested again (`retry_in`
        seconds from now; `alone`: each in a run of its own; `uncount`: the run did not try them to the
        end, so its attempt is not counted). Returns the documents recorded."""
        with connect(self.url) as conn:
            rows = conn.execute(
                "UPDATE documents SET state = %(state)s, reason = %(reason)s, updated_at = now(),"
                " attempts = CASE WHEN %(uncount)s AND state = 'running' THEN greatest(attempts - 1, 0)"
                " ELSE attempts END,"
                " request = CASE WHEN %(alone)s THEN 'alone ' || document_id ELSE request END,"
                " not_before = CASE WHEN %(retry)s::float8 IS NULL THEN NULL"
                " ELSE now() + make_interval(secs => %(retry)s::float8) END"
                " WHERE document_id = ANY(%(ids)s) AND ((state = 'running' AND run_id = ANY(%(run)s))"
                " OR (state = 'queued' AND run_key = ANY(%(run)s))) RETURNING document_id",
                {
                    "state": state,
                    "reason": reason,
                    "alone": alone,
                    "uncount": uncount,
                    "retry": retry_in,
                    "ids": list(document_ids),
                    "run": list(run),
                },
            ).fetchall()
        return [document_id for (document_id,) in rows]

    def of_run(self, run: Sequence[str]) -> dict[str, int]:
        """{document: attempts} of the documents a run (by its id, or a key) still answers for."""
        with connect(self.url) as conn:
            rows = conn.execute(
                "SELECT document_id, attempts FROM documents WHERE (state = 'running' AND run_id = ANY(%s))"
                " OR (state = 'queued' AND run_key = ANY(%s))",
                (list(run), list(run)),
            ).fetchall()
        return dict(rows)

    def unfinished(self) -> list[Unfinished]:
        """Every document a run was asked for (`queued`) or holds (`running`)."""
        with connect(self.url) as conn:
            rows = conn.execute(
                "SELECT document_id, state, run_key, run_id, attempts, owner, renewed_at, updated_at"
                " FROM documents WHERE state IN ('queued', 'running')"
            ).fetchall()
        return [Unfinished(*row) for row in rows]

    # --- what status shows --------------------------------------------------------------------------

    def fates(self, keys: Iterable[str]) -> list[Fate]:
        """The fates of the documents named by id, path (as given or absolute) or file name."""
        wanted = list(keys)
        absolute = [str(Path(key).expanduser().resolve()) for key in wanted]
        with connect(self.url) as conn:
            rows = conn.execute(
                f"SELECT {_FATE_COLUMNS} FROM documents WHERE document_id = ANY(%s) OR source_path = ANY(%s)"
                " OR abs_path = ANY(%s) OR regexp_replace(source_path, '^.*/', '') = ANY(%s)"
                " ORDER BY updated_at",
                (wanted, wanted, absolute, wanted),
            ).fetchall()
        return [_fate(row) for row in rows]

    def summary(self, limit: int = 50) -> Summary:
        """Counts by state and the `limit` most recent files that are not simply ingested."""
        with connect(self.url) as conn:
            counts = dict(
                conn.execute("SELECT coalesce(state, 'registered'), count(*) FROM documents GROUP BY 1")
            )
            rows = conn.execute(
                f"SELECT {_FATE_COLUMNS} FROM documents WHERE state IN"
                " ('failed', 'refused', 'requested', 'queued', 'running') ORDER BY updated_at DESC LIMIT %s",
                (limit,),
            ).fetchall()
        return Summary(counts=counts, attention=[_fate(row) for row in rows][::-1])

    # --- the inbox sensor's state -------------------------------------------------------------------

    def inbox_files(self, inbox: bytes) -> dict[bytes, tuple[int, int]]:
        """{path: (size, mtime_ns)} of every file the sensor last saw under the directory `inbox`
        (absolute): what a tick compares with each file's `stat`. The rest of a file's state is read
        (`inbox_entries`) only for the files that moved or went: at 100,000 files, building a whole
        entry for each took as long as listing the inbox."""
        prefix = inbox.rstrip(b"/") + b"/"
        with connect(self.url) as conn, conn.cursor(binary=True) as cursor:
            rows = cursor.execute(
                "SELECT path_bytes, inbox_size, inbox_mtime_ns FROM documents"
                " WHERE inbox_sha256 IS NOT NULL AND substring(path_bytes FROM 1 FOR %s) = %s",
                (len(prefix), prefix),
            ).fetchall()
        return {path: (size, mtime_ns) for path, size, mtime_ns in rows}

    def inbox_entries(self, paths: Iterable[bytes]) -> dict[bytes, InboxEntry]:
        """{path: entry} of these files, of those the inbox sensor knows."""
        wanted = list(paths)
        if not wanted:  # an unchanged inbox's tick: no scan of the table
            return {}
        with connect(self.url) as conn:
            rows = conn.execute(
                "SELECT path_bytes, document_id, inbox_size, inbox_mtime_ns, inbox_sha256 FROM documents"
                " WHERE inbox_sha256 IS NOT NULL AND path_bytes = ANY(%s)",
                (wanted,),
            ).fetchall()
        return {bytes(path): InboxEntry(doc_id, FileState(*state)) for path, doc_id, *state in rows}

    def record_inbox(self, files: Mapping[bytes, FileState]) -> dict[bytes, str]:
        """Register inbox files as the states say they were ingested, with no request (the state an
        older inbox sensor kept in its cursor, adopted once): a file whose bytes still have that
        sha256 is stored; one changed since is then requested like any changed file. Returns
        {path: document id}."""
        ids = {path: document_id_for(path, resolve=False) for path in files}
        rows = (  # read one file at a time: there may be many
            (ids[path], display_path(path), display_path(path), path, data, state.sha256, *state)
            for path, state in files.items()
            for data in (_read(path),)
            if _sha256(data) == state.sha256
        )
        with connect(self.url) as conn, conn.cursor() as cursor:
            cursor.executemany(
                "INSERT INTO documents (document_id, source_path, abs_path, path_bytes, content, content_sha256,"
                " door, inbox_size, inbox_mtime_ns, inbox_sha256) VALUES (%s, %s, %s, %s, %s, %s, 'inbox', %s, %s, %s)"
                " ON CONFLICT (document_id) DO NOTHING",
                rows,
            )
        return ids

    def inbox_rejections(self, inbox: bytes) -> dict[bytes, Rejected]:
        """{path: why} of the files under `inbox` refused there (named like documents, not ones), as
        they were when read: the inbox reads them again only once they change."""
        prefix = inbox.rstrip(b"/") + b"/"
        with connect(self.url) as conn:
            rows = conn.execute(
                "SELECT path_bytes, inbox_size, inbox_mtime_ns, reason FROM documents WHERE state = 'refused'"
                " AND inbox_size IS NOT NULL AND substring(path_bytes FROM 1 FOR %s) = %s",
                (len(prefix), prefix),
            ).fetchall()
        return {bytes(path): Rejected(*rest) for path, *rest in rows}

    def record_inbox_rejections(
        self, rejected: Mapping[bytes, Rejected], cleared: Iterable[bytes] = ()
    ) -> None:
        """Refuse these inbox files with their reasons (`vision-rag status` shows them, as any door's
        refusals) and forget the `cleared` ones (gone from the inbox, or documents now)."""
        with connect(self.url) as conn:
            conn.execute(
                "DELETE FROM documents WHERE state = 'refused' AND path_bytes = ANY(%s)", (list(cleared),)
            )
        for path, why in rejected.items():
            name = display_path(os.path.basename(path))
            self.refuse(
                path,
                "inbox",
                f"{name}: {why.reason}",
                inbox_state=FileState(why.size, why.mtime_ns, None),
                resolve=False,
            )  # type: ignore[arg-type]

    def seen_in_inbox(self, document_id: str, state: FileState) -> None:
        """An unchanged file seen again (touched: a new mtime), so the next tick does not hash it again."""
        with connect(self.url) as conn:
            conn.execute(
                "UPDATE documents SET inbox_size = %s, inbox_mtime_ns = %s, inbox_sha256 = %s WHERE document_id = %s",
                (*state, document_id),
            )

    def leave_inbox(self, document_ids: Iterable[str]) -> None:
        """The files are gone from the inbox: drop their state (the `remove_document` run forgets
        the rows once their index rows are deleted)."""
        with connect(self.url) as conn:
            conn.execute(
                "UPDATE documents SET inbox_size = NULL, inbox_mtime_ns = NULL, inbox_sha256 = NULL"
                " WHERE document_id = ANY(%s)",
                (list(document_ids),),
            )


_FATE_COLUMNS = "document_id, source_path, door, state, reason, attempts, alias_of, run_id, updated_at"


def _fate(row: tuple) -> Fate:
    return Fate(**dict(zip(Fate.model_fields, row, strict=True)))


def _read(path: str | bytes | Path) -> bytes | None:
    """The file's bytes, or None when it vanished since it was seen (its run then fails naming it)."""
    try:
        with open(path, "rb") as handle:
            return handle.read()
    except OSError:
        return None


def _sha256(data: bytes | None) -> str | None:
    return hashlib.sha256(data).hexdigest() if data is not None else None


def _registered(row: tuple) -> RegisteredDocument:
    document_id, source_path, abs_path, path_bytes = row
    return RegisteredDocument(
        document_id=document_id,
        source_path=source_path,
        abs_path=os.fsdecode(bytes(path_bytes)) if path_bytes is not None else abs_path,
    )
