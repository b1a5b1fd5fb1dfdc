"""The ingest queue of uploaded files: each accepted upload is a row until it is ingested or fails
for good, so no upload is lost to a crash, a restart or a database outage.

An upload is registered (its bytes copied into the registry) and queued in the same database
before the API answers. A worker claims rows one at a time (`FOR UPDATE SKIP LOCKED`: several
servers on one database never run the same row), ingests, and records the outcome: `ingested`,
or the failure's one-line reason with another attempt after a pause, up to `MAX_ATTEMPTS`; then
`failed` keeps the reason for the API's status endpoint and `vision-rag status`. A row left
`running` by a process that died is handed back when its owner is found gone.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from datetime import datetime
from typing import Literal

from pydantic import BaseModel

from vision_rag_pipeline.core.postgres import connect, ensure_schema

MAX_ATTEMPTS = 3
RETRY_PAUSE_SECONDS = (5, 30)  # before the second and the third attempt

_SCHEMA = """
CREATE TABLE IF NOT EXISTS ingest_queue (
    document_id text PRIMARY KEY,
    name text NOT NULL,
    path text NOT NULL,
    status text NOT NULL,  -- pending | running | ingested | failed
    attempts int NOT NULL DEFAULT 0,
    reason text,  -- one line: why the last attempt failed
    owner text,  -- the process running it (host:pid:start time)
    next_attempt_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now()
)
"""

IngestState = Literal["pending", "running", "ingested", "failed"]


class IngestStatus(BaseModel):
    document_id: str
    name: str
    path: str
    status: IngestState
    attempts: int
    reason: str | None = None  # why the last attempt failed, one line
    updated_at: datetime


_COLUMNS = ", ".join(IngestStatus.model_fields)  # the table's columns, in the model's order


class IngestQueue:
    def __init__(self, url: str | None = None) -> None:
        self.url = url
        ensure_schema(_SCHEMA, url)

    def enqueue(self, document_id: str, name: str, path: str) -> IngestStatus:
        """Queue (again) a registered document; a new upload of it starts its attempts afresh."""
        with connect(self.url) as conn:
            row = conn.execute(
                "INSERT INTO ingest_queue (document_id, name, path, status) VALUES (%s, %s, %s, 'pending')"
                " ON CONFLICT (document_id) DO UPDATE SET name = EXCLUDED.name, path = EXCLUDED.path,"
                " status = 'pending', attempts = 0, reason = NULL, owner = NULL, next_attempt_at = now(),"
                f" updated_at = now() RETURNING {_COLUMNS}",
                (document_id, name, path),
            ).fetchone()
        return _status(row)

    def claim(self, owner: str) -> IngestStatus | None:
        """The oldest row due for an attempt, now `running` under `owner`; None when none is due."""
        with connect(self.url) as conn:
            row = conn.execute(
                "UPDATE ingest_queue SET status = 'running', owner = %s, attempts = attempts + 1,"
                " updated_at = now() WHERE document_id = (SELECT document_id FROM ingest_queue"
                " WHERE status = 'pending' AND next_attempt_at <= now() ORDER BY next_attempt_at"
                f" LIMIT 1 FOR UPDATE SKIP LOCKED) RETURNING {_COLUMNS}",
                (owner,),
            ).fetchone()
        return _status(row) if row else None

    def finish(self, document_id: str, error: str | None) -> IngestStatus:
        """Record an attempt's outcome: ingested, another attempt after a pause, or failed for good."""
        with connect(self.url) as conn:
            attempts = conn.execute(
                "SELECT attempts FROM ingest_queue WHERE document_id = %s", (document_id,)
            ).fetchone()[0]
            if error is None:
                status, pause = "ingested", 0
            elif attempts >= MAX_ATTEMPTS:
                status, pause = "failed", 0
            else:
                status, pause = "pending", RETRY_PAUSE_SECONDS[min(attempts, len(RETRY_PAUSE_SECONDS)) - 1]
            row = conn.execute(
                "UPDATE ingest_queue SET status = %s, reason = %s, owner = NULL, updated_at = now(),"
                " next_attempt_at = now() + make_interval(secs => %s) WHERE document_id = %s"
                f" RETURNING {_COLUMNS}",
                (status, error, pause, document_id),
            ).fetchone()
        return _status(row)

    def hand_back_orphans(self, owner_alive: Callable[[str], bool]) -> list[str]:
        """Rows `running` under a process that is gone go back to `pending` (the attempt it made is
        still counted); returns their document ids."""
        with connect(self.url) as conn:
            running = conn.execute(
                "SELECT document_id, owner FROM ingest_queue WHERE status = 'running'"
            ).fetchall()
            orphans = [document_id for document_id, owner in running if not owner_alive(owner or "")]
            if orphans:
                conn.execute(
                    "UPDATE ingest_queue SET status = 'pending', owner = NULL, updated_at = now()"
                    " WHERE document_id = ANY(%s) AND status = 'running'",
                    (orphans,),
                )
        return orphans

    def get(self, document_id: str) -> IngestStatus | None:
        with connect(self.url) as conn:
            row = conn.execute(
                f"SELECT {_COLUMNS} FROM ingest_queue WHERE document_id = %s", (document_id,)
            ).fetchone()
        return _status(row) if row else None

    def all(self, document_ids: Iterable[str] | None = None) -> list[IngestStatus]:
        with connect(self.url) as conn:
            if document_ids is None:
                rows = conn.execute(f"SELECT {_COLUMNS} FROM ingest_queue ORDER BY updated_at").fetchall()
            else:
                rows = conn.execute(
                    f"SELECT {_COLUMNS} FROM ingest_queue WHERE document_id = ANY(%s) ORDER BY updated_at",
                    (list(document_ids),),
                ).fetchall()
        return [_status(row) for row in rows]


def _status(row: tuple) -> IngestStatus:
    return IngestStatus(**dict(zip(IngestStatus.model_fields, row, strict=True)))
