"""Chunks and image enrichments in Postgres + pgvector.

`chunks` holds every chunk with its location and vector (HNSW, cosine); `rag_images` is the
reference architecture's table of enriched images. A document's rows are replaced in one
transaction (delete, then COPY), so re-materializing a partition never duplicates rows and
readers never see a half-written document.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from pgvector import Vector
from psycopg.types.json import Jsonb
from pydantic import BaseModel

from vision_rag_pipeline.chunks.model import Chunk
from vision_rag_pipeline.enrichment.model import EnrichmentResult
from vision_rag_pipeline.indexes.postgres import connect, ensure_schema


class DimensionMismatchError(RuntimeError):
    """The index was built for another embedding dimension."""


def _schema(dim: int) -> str:
    return f"""
CREATE TABLE IF NOT EXISTS chunks (
    chunk_id text PRIMARY KEY,
    document_id text NOT NULL,
    chunk_index integer NOT NULL,
    kind text NOT NULL CHECK (kind IN ('text', 'table', 'image')),
    text text NOT NULL,
    page integer,
    bbox double precision[],
    char_start integer,
    char_end integer,
    image_url text,
    metadata jsonb NOT NULL DEFAULT '{{}}',
    embedding vector({dim}) NOT NULL
);
CREATE INDEX IF NOT EXISTS chunks_document_id ON chunks (document_id);
CREATE INDEX IF NOT EXISTS chunks_embedding_hnsw ON chunks USING hnsw (embedding vector_cosine_ops);
CREATE TABLE IF NOT EXISTS rag_images (
    id text PRIMARY KEY,
    document_id text NOT NULL,
    image_sha256 text NOT NULL,
    image_url text NOT NULL,
    raw_ocr_text text,
    raw_vlm_caption text,
    content_chunk text NOT NULL,
    content_vector vector({dim}) NOT NULL,
    metadata jsonb NOT NULL DEFAULT '{{}}'
);
CREATE INDEX IF NOT EXISTS rag_images_document_id ON rag_images (document_id);
"""


class VectorHit(BaseModel):
    chunk_id: str
    score: float  # cosine similarity


_CHUNK_COLUMNS = (
    "chunk_id, document_id, chunk_index, kind, text, page, bbox, char_start, char_end, image_url, metadata"
)


class PgVectorStore:
    def __init__(self, dim: int, url: str | None = None) -> None:
        self.dim = dim
        self.url = url
        ensure_schema(_schema(dim), url)
        self._check_dimension()

    def _check_dimension(self) -> None:
        with connect(self.url) as conn:
            row = conn.execute(
                "SELECT atttypmod FROM pg_attribute WHERE attrelid = 'chunks'::regclass AND attname = 'embedding'"
            ).fetchone()
        if row and row[0] != self.dim:
            raise DimensionMismatchError(
                f"the chunks table holds {row[0]}-dimensional vectors but the embedding model gives {self.dim}; "
                "reindex after changing the embedding model"
            )

    def replace_document(
        self,
        document_id: str,
        chunks: Sequence[Chunk],
        vectors: np.ndarray,
        images: Sequence[tuple[EnrichmentResult, np.ndarray]] = (),
    ) -> None:
        """Delete the document's rows and write the new ones in one transaction."""
        if len(chunks) != len(vectors):
            raise ValueError(f"{len(chunks)} chunks but {len(vectors)} vectors")
        with connect(self.url) as conn, conn.cursor() as cur:
            cur.execute("DELETE FROM chunks WHERE document_id = %s", (document_id,))
            cur.execute("DELETE FROM rag_images WHERE document_id = %s", (document_id,))
            with cur.copy(
                f"COPY chunks ({_CHUNK_COLUMNS}, embedding) FROM STDIN WITH (FORMAT BINARY)"
            ) as copy:
                copy.set_types(
                    [
                        "text",
                        "text",
                        "int4",
                        "text",
                        "text",
                        "int4",
                        "float8[]",
                        "int4",
                        "int4",
                        "text",
                        "jsonb",
                        "vector",
                    ]
                )
                for chunk, vector in zip(chunks, vectors, strict=True):
                    copy.write_row(_chunk_row(chunk) + (Vector(vector),))
            cur.executemany(
                "INSERT INTO rag_images (id, document_id, image_sha256, image_url, raw_ocr_text, raw_vlm_caption,"
                " content_chunk, content_vector, metadata) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)",
                [
                    (
                        f"{document_id}:{result.image_sha256}",
                        document_id,
                        result.image_sha256,
                        result.image_url,
                        result.ocr.text,
                        result.vlm_caption,
                        result.meta_content,
                        Vector(vector),
                        Jsonb(
                            {
                                "image_type": result.image_type,
                                "keywords": result.keywords,
                                "ocr_confidence": result.ocr.level,
                                "fusion": result.fusion,
                                "cache_key": result.cache_key,
                            }
                        ),
                    )
                    for result, vector in images
                ],
            )

    def delete_document(self, document_id: str) -> int:
        with connect(self.url) as conn:
            deleted = conn.execute("DELETE FROM chunks WHERE document_id = %s", (document_id,)).rowcount
            conn.execute("DELETE FROM rag_images WHERE document_id = %s", (document_id,))
        return deleted

    def count(self, document_id: str | None = None) -> int:
        with connect(self.url) as conn:
            if document_id is None:
                return conn.execute("SELECT count(*) FROM chunks").fetchone()[0]
            return conn.execute(
                "SELECT count(*) FROM chunks WHERE document_id = %s", (document_id,)
            ).fetchone()[0]

    def search(
        self,
        vector: np.ndarray,
        k: int,
        *,
        ef_search: int = 100,
        document_ids: list[str] | None = None,
        kinds: list[str] | None = None,
    ) -> list[VectorHit]:
        """Nearest chunks by cosine similarity (HNSW)."""
        where, params = _filters(document_ids, kinds)
        with connect(self.url) as conn:
            conn.execute(f"SET LOCAL hnsw.ef_search = {int(ef_search)}")
            rows = conn.execute(
                f"SELECT chunk_id, 1 - (embedding <=> %s) FROM chunks {where} ORDER BY embedding <=> %s LIMIT %s",
                (Vector(vector), *params, Vector(vector), k),
            ).fetchall()
        return [VectorHit(chunk_id=cid, score=float(score)) for cid, score in rows]

    def fetch(self, chunk_ids: Sequence[str]) -> dict[str, Chunk]:
        if not chunk_ids:
            return {}
        with connect(self.url) as conn:
            rows = conn.execute(
                f"SELECT {_CHUNK_COLUMNS} FROM chunks WHERE chunk_id = ANY(%s)", (list(chunk_ids),)
            ).fetchall()
        return {row[0]: _chunk_from_row(row) for row in rows}


def _filters(document_ids: list[str] | None, kinds: list[str] | None) -> tuple[str, list[Any]]:
    clauses, params = [], []
    if document_ids:
        clauses.append("document_id = ANY(%s)")
        params.append(document_ids)
    if kinds:
        clauses.append("kind = ANY(%s)")
        params.append(kinds)
    return ("WHERE " + " AND ".join(clauses) if clauses else ""), params


def _chunk_row(chunk: Chunk) -> tuple[Any, ...]:
    span = chunk.char_span or (None, None)
    return (
        chunk.chunk_id,
        chunk.document_id,
        chunk.index,
        chunk.kind,
        chunk.text,
        chunk.page,
        list(chunk.bbox) if chunk.bbox else None,
        span[0],
        span[1],
        chunk.image,
        Jsonb(chunk.metadata),
    )


def _chunk_from_row(row: tuple[Any, ...]) -> Chunk:
    (chunk_id, document_id, index, kind, text, page, bbox, char_start, char_end, image, metadata) = row
    return Chunk(
        chunk_id=chunk_id,
        document_id=document_id,
        index=index,
        kind=kind,
        text=text,
        page=page,
        bbox=tuple(bbox) if bbox else None,
        char_span=(char_start, char_end) if char_start is not None else None,
        image=image,
        metadata=metadata or {},
    )
