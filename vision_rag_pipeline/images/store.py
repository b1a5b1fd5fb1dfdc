"""Content-addressed image store in Postgres: the same image twice is stored once.

Kept in the index database (not on a local disk) so any run worker can read what another
extracted.
"""

from __future__ import annotations

from collections.abc import Iterable

from vision_rag_pipeline.core.postgres import connect, ensure_schema
from vision_rag_pipeline.documents.model import DocumentImage

_SCHEMA = """
CREATE TABLE IF NOT EXISTS image_blobs (
    sha256 text PRIMARY KEY,
    mime text NOT NULL,
    size integer NOT NULL,
    data bytea NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
)
"""


class ImageStore:
    def __init__(self, url: str | None = None) -> None:
        self.url = url
        ensure_schema(_SCHEMA, url)

    def put_many(self, images: Iterable[DocumentImage]) -> int:
        """Store images not stored yet; returns how many were new."""
        unique = {img.sha256: img for img in images}
        if not unique:
            return 0
        with connect(self.url) as conn:
            known = {
                row[0]
                for row in conn.execute(
                    "SELECT sha256 FROM image_blobs WHERE sha256 = ANY(%s)", (list(unique),)
                )
            }
            new = [img for sha, img in unique.items() if sha not in known]
            with conn.cursor() as cur:
                cur.executemany(
                    "INSERT INTO image_blobs (sha256, mime, size, data) VALUES (%s, %s, %s, %s)"
                    " ON CONFLICT (sha256) DO NOTHING",
                    [(img.sha256, img.mime, len(img.data), img.data) for img in new],
                )
        return len(new)

    def get_many(self, sha256s: Iterable[str]) -> dict[str, bytes]:
        keys = list(set(sha256s))
        if not keys:
            return {}
        with connect(self.url) as conn:
            rows = conn.execute("SELECT sha256, data FROM image_blobs WHERE sha256 = ANY(%s)", (keys,))
            return {sha: bytes(data) for sha, data in rows}
