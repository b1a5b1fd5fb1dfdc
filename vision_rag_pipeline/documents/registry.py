"""Which file each document partition stands for, a copy of its bytes, and what the inbox sensor last
saw of it.

A partition key must outlive the process that registered it (the UI, a sensor or a backfill
materializes it later, possibly on another machine), so the path and a copy of the file's bytes
are kept in the index database when it is registered. Runs read the copy, never the path: a run
pod sees only Postgres, and the original may be gone (an inbox file moved away, an upload's
temporary file). Registering the same path again replaces the copy. Files that arrived through the
inbox also keep their size, mtime and sha256 here: the sensor's state lives in this table, one row
per file, so a tick over an unchanged inbox writes nothing and its cursor stays empty.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import NamedTuple

from pydantic import BaseModel

from vision_rag_pipeline.core.postgres import connect, ensure_schema

# Idempotent: the ALTERs upgrade a registry created before the inbox kept its state here.
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
CREATE TABLE IF NOT EXISTS inbox_rejections (
    path_bytes bytea PRIMARY KEY,
    source_path text NOT NULL,
    size bigint NOT NULL,
    mtime_ns bigint NOT NULL,
    reason text NOT NULL,
    seen_at timestamptz NOT NULL DEFAULT now()
);
"""


class RegisteredDocument(BaseModel):
    document_id: str
    source_path: str  # the path as the user gave it (undecodable bytes shown as \\x escapes)
    abs_path: str  # what to open: exact, even when the file name is not UTF-8


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
    document_id: str
    state: FileState


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


class DocumentRegistry:
    def __init__(self, url: str | None = None) -> None:
        self.url = url
        ensure_schema(_SCHEMA, url)

    def register(self, path: str | Path) -> RegisteredDocument:
        """Record the file under its partition key and copy its bytes into the database."""
        doc = RegisteredDocument(
            document_id=document_id_for(path),
            source_path=str(path),
            abs_path=str(Path(path).expanduser().resolve()),
        )
        content = Path(doc.abs_path).read_bytes()
        with connect(self.url) as conn:
            conn.execute(
                "INSERT INTO documents (document_id, source_path, abs_path, content) VALUES (%s, %s, %s, %s)"
                " ON CONFLICT (document_id) DO UPDATE SET source_path = EXCLUDED.source_path,"
                " content = EXCLUDED.content, registered_at = now()",
                (doc.document_id, doc.source_path, doc.abs_path, content),
            )
        return doc

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
        """{document id: sha256 of its stored copy} (hashed by Postgres: the bytes stay there)."""
        with connect(self.url) as conn:
            rows = conn.execute(
                "SELECT document_id, encode(sha256(content), 'hex') FROM documents"
                " WHERE document_id = ANY(%s) AND content IS NOT NULL",
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

    def forget(self, document_id: str) -> None:
        with connect(self.url) as conn:
            conn.execute("DELETE FROM documents WHERE document_id = %s", (document_id,))

    def all(self) -> list[RegisteredDocument]:
        with connect(self.url) as conn:
            rows = conn.execute(
                "SELECT document_id, source_path, abs_path, path_bytes FROM documents ORDER BY 1"
            ).fetchall()
        return [_registered(row) for row in rows]

    # --- the inbox sensor's state -------------------------------------------------------------------

    def inbox_files(self, inbox: bytes) -> dict[bytes, InboxEntry]:
        """{path: entry} of every file the sensor last saw under the directory `inbox` (absolute)."""
        prefix = inbox.rstrip(b"/") + b"/"
        with connect(self.url) as conn:
            rows = conn.execute(
                "SELECT path_bytes, document_id, inbox_size, inbox_mtime_ns, inbox_sha256 FROM documents"
                " WHERE inbox_sha256 IS NOT NULL AND substring(path_bytes FROM 1 FOR %s) = %s",
                (len(prefix), prefix),
            ).fetchall()
        return {bytes(path): InboxEntry(doc_id, FileState(*state)) for path, doc_id, *state in rows}

    def record_inbox(self, files: Mapping[bytes, FileState]) -> dict[bytes, str]:
        """Register inbox files (new, changed or touched) with their state, in one transaction;
        returns {path: document id}."""
        ids = {path: document_id_for(path, resolve=False) for path in files}
        rows = (  # read one file at a time: a tick may register many
            (ids[path], display_path(path), display_path(path), path, _read(path), *state)
            for path, state in files.items()
        )
        with connect(self.url) as conn, conn.cursor() as cursor:
            cursor.executemany(
                "INSERT INTO documents (document_id, source_path, abs_path, path_bytes, content, inbox_size,"
                " inbox_mtime_ns, inbox_sha256) VALUES (%s, %s, %s, %s, %s, %s, %s, %s)"
                " ON CONFLICT (document_id) DO UPDATE SET source_path = EXCLUDED.source_path,"
                " abs_path = EXCLUDED.abs_path, path_bytes = EXCLUDED.path_bytes, content = EXCLUDED.content,"
                " registered_at = now(), inbox_size = EXCLUDED.inbox_size,"
                " inbox_mtime_ns = EXCLUDED.inbox_mtime_ns, inbox_sha256 = EXCLUDED.inbox_sha256",
                rows,
            )
        return ids

    def store_inbox_copies(self, paths: Iterable[bytes]) -> dict[bytes, str]:
        """Register new or changed inbox files (their path and a copy of their bytes) without the state
        that marks them seen: until `commit_inbox_states` records it, the sensor takes them for new
        (or changed) again, so a tick whose run requests Dagster never accepted loses no file.
        Returns {path: document id}."""
        ids = {path: document_id_for(path, resolve=False) for path in paths}
        rows = (  # read one file at a time: a tick may register many
            (ids[path], display_path(path), display_path(path), path, _read(path)) for path in ids
        )
        with connect(self.url) as conn, conn.cursor() as cursor:
            cursor.executemany(
                "INSERT INTO documents (document_id, source_path, abs_path, path_bytes, content)"
                " VALUES (%s, %s, %s, %s, %s) ON CONFLICT (document_id) DO UPDATE SET"
                " source_path = EXCLUDED.source_path, abs_path = EXCLUDED.abs_path,"
                " path_bytes = EXCLUDED.path_bytes, content = EXCLUDED.content, registered_at = now()",
                rows,
            )
        return ids

    def commit_inbox_states(self, states: Mapping[str, FileState]) -> None:
        """Record what the sensor saw of registered inbox files ({document id: state}): from now on
        they are known, and read again only when their size or mtime moves."""
        with connect(self.url) as conn:
            conn.execute(
                "UPDATE documents AS d SET inbox_size = s.size, inbox_mtime_ns = s.mtime_ns, inbox_sha256 = s.sha"
                " FROM unnest(%s::text[], %s::bigint[], %s::bigint[], %s::text[]) AS s(id, size, mtime_ns, sha)"
                " WHERE d.document_id = s.id",
                (
                    list(states),
                    [state.size for state in states.values()],
                    [state.mtime_ns for state in states.values()],
                    [state.sha256 for state in states.values()],
                ),
            )

    def inbox_rejections(self, inbox: bytes) -> dict[bytes, Rejected]:
        """{path: why} of the files under `inbox` that are named like documents but are not ones."""
        prefix = inbox.rstrip(b"/") + b"/"
        with connect(self.url) as conn:
            rows = conn.execute(
                "SELECT path_bytes, size, mtime_ns, reason FROM inbox_rejections"
                " WHERE substring(path_bytes FROM 1 FOR %s) = %s",
                (len(prefix), prefix),
            ).fetchall()
        return {bytes(path): Rejected(*rest) for path, *rest in rows}

    def record_inbox_rejections(
        self, rejected: Mapping[bytes, Rejected], cleared: Iterable[bytes] = ()
    ) -> None:
        """Remember why these files are not documents (`vision-rag status` shows them) and forget the
        `cleared` ones (gone from the inbox, or documents now)."""
        with connect(self.url) as conn, conn.cursor() as cursor:
            cursor.execute("DELETE FROM inbox_rejections WHERE path_bytes = ANY(%s)", (list(cleared),))
            cursor.executemany(
                "INSERT INTO inbox_rejections (path_bytes, source_path, size, mtime_ns, reason)"
                " VALUES (%s, %s, %s, %s, %s) ON CONFLICT (path_bytes) DO UPDATE SET size = EXCLUDED.size,"
                " mtime_ns = EXCLUDED.mtime_ns, reason = EXCLUDED.reason, seen_at = now()",
                [(path, display_path(path), *why) for path, why in rejected.items()],
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


def _read(path: bytes) -> bytes | None:
    """The file's bytes, or None when it vanished since the scan (its run then fails naming it)."""
    try:
        with open(path, "rb") as handle:
            return handle.read()
    except OSError:
        return None


def _registered(row: tuple) -> RegisteredDocument:
    document_id, source_path, abs_path, path_bytes = row
    return RegisteredDocument(
        document_id=document_id,
        source_path=source_path,
        abs_path=os.fsdecode(bytes(path_bytes)) if path_bytes is not None else abs_path,
    )
