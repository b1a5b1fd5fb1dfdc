"""Which file each document partition stands for, and that file's bytes.

A partition key must outlive the process that registered it (the UI, a sensor or a backfill
materializes it later, possibly on another machine), so the path and a copy of the file's bytes
are kept in the index database when it is registered. Runs read the copy, never the path: a run
pod sees only Postgres, and the original may be gone (an inbox file moved away, an upload's
temporary file). Registering the same path again replaces the copy.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

from pydantic import BaseModel

from vision_rag_pipeline.core.postgres import connect, ensure_schema

_SCHEMA = """
CREATE TABLE IF NOT EXISTS documents (
    document_id text PRIMARY KEY,
    source_path text NOT NULL,
    abs_path text NOT NULL,
    registered_at timestamptz NOT NULL DEFAULT now()
);
ALTER TABLE documents ADD COLUMN IF NOT EXISTS content bytea;
"""


class RegisteredDocument(BaseModel):
    document_id: str
    source_path: str  # the path as the user gave it
    abs_path: str


def document_id_for(path: str | Path) -> str:
    """Stable, readable partition key: file stem slug + hash of the absolute path."""
    absolute = str(Path(path).expanduser().resolve())
    slug = re.sub(r"[^a-z0-9]+", "-", Path(absolute).stem.lower()).strip("-")[:40] or "document"
    return f"{slug}-{hashlib.sha1(absolute.encode()).hexdigest()[:10]}"


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
                f"document {document_id!r} was registered before files were stored; ingest it again"
            )
        return bytes(row[0])

    def get(self, document_id: str) -> RegisteredDocument:
        with connect(self.url) as conn:
            row = conn.execute(
                "SELECT document_id, source_path, abs_path FROM documents WHERE document_id = %s",
                (document_id,),
            ).fetchone()
        if row is None:
            raise KeyError(f"document {document_id!r} is not registered; ingest its file first")
        return RegisteredDocument(document_id=row[0], source_path=row[1], abs_path=row[2])

    def forget(self, document_id: str) -> None:
        with connect(self.url) as conn:
            conn.execute("DELETE FROM documents WHERE document_id = %s", (document_id,))

    def all(self) -> list[RegisteredDocument]:
        with connect(self.url) as conn:
            rows = conn.execute(
                "SELECT document_id, source_path, abs_path FROM documents ORDER BY 1"
            ).fetchall()
        return [RegisteredDocument(document_id=a, source_path=b, abs_path=c) for a, b, c in rows]
