"""Chunks and image enrichments in Postgres + pgvector.

`chunks` holds every chunk with its location and vector (HNSW, cosine); `rag_images` is the
reference architecture's table of enriched images. A document's rows are replaced in one
transaction (delete, then COPY), so re-materializing a partition never duplicates rows and
readers never see a half-written document.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
from pgvector import Vector
from psycopg.types.json import Jsonb
from pydantic import BaseModel

from vision_rag_pipeline.chunks.model import Chunk
from vision_rag_pipeline.core.postgres import connect, ensure_schema, one_round_trip
from vision_rag_pipeline.enrichment.model import EnrichmentResult


class DimensionMismatchError(RuntimeError):
    """The index was built for another embedding dimension."""


def _tables_ddl(dim: int, chunks: str = "chunks", images: str = "rag_images") -> str:
    return f"""
CREATE TABLE IF NOT EXISTS {chunks} (
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
CREATE TABLE IF NOT EXISTS {images} (
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
"""


def _indexes_ddl(chunks: str = "chunks", images: str = "rag_images") -> str:
    return f"""
CREATE INDEX IF NOT EXISTS {chunks}_document_id ON {chunks} (document_id);
CREATE INDEX IF NOT EXISTS {chunks}_embedding_hnsw ON {chunks} USING hnsw (embedding vector_cosine_ops);
CREATE INDEX IF NOT EXISTS {images}_document_id ON {images} (document_id);
"""


def _schema(dim: int) -> str:
    return _tables_ddl(dim) + _indexes_ddl()


_CHUNK_COLUMNS = (
    "chunk_id, document_id, chunk_index, kind, text, page, bbox, char_start, char_end, image_url, metadata"
)


class Candidates(NamedTuple):
    """What one search reads from Postgres (`PgVectorStore.candidates`)."""

    nearest: list[dict[str, float]]  # per query vector: chunk id -> cosine similarity, best first
    chunks: dict[str, Chunk]  # the rows found, nearest or asked for
    embeddings: dict[str, np.ndarray]  # their stored vectors, for the rerank's similarities
    matching: set[str]  # those whose metadata contains the metadata filter's (all without one)


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
        return delete_document_rows(document_id, self.url)

    def count(self, document_id: str | None = None) -> int:
        return chunk_count(document_id, self.url)

    def resolve_documents(self, values: Sequence[str]) -> list[str]:
        """Document ids for values that are ids, source paths as ingested, or bare file names."""
        names = [Path(v).name for v in values]
        with connect(self.url) as conn:
            rows = conn.execute(
                "SELECT DISTINCT document_id FROM chunks WHERE document_id = ANY(%s)"
                " OR metadata->>'source' = ANY(%s) OR regexp_replace(metadata->>'source', '^.*/', '') = ANY(%s)",
                (list(values), list(values), names),
            ).fetchall()
        return sorted(row[0] for row in rows)

    def candidates(
        self,
        vectors: Sequence[np.ndarray],
        limit: int,
        also: Sequence[str] = (),
        *,
        ef_search: int = 100,
        document_ids: list[str] | None = None,
        kinds: list[str] | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> Candidates:
        """The `limit` nearest chunks to each vector through the HNSW index, filters applied in the
        scan, and the rows with embeddings of those and of `also`: a search's one round trip.

        With filters, pgvector's iterative scan keeps walking the graph until `limit` rows pass them,
        so a selective filter does not starve the result (plain HNSW would stop after ef_search rows).
        """
        where, params = _filters(document_ids, kinds, metadata)
        # `position` keeps each scan's order, so equal similarities stay in it as they did alone
        query = f"""
            WITH nearest AS (
                SELECT asked.query, scan.*
                FROM unnest(%b::vector[]) WITH ORDINALITY AS asked (vector, query)
                CROSS JOIN LATERAL (
                    SELECT row_number() OVER () AS position, * FROM (
                        SELECT chunk_id, 1 - (embedding <=> asked.vector) AS similarity FROM chunks {where}
                        ORDER BY embedding <=> asked.vector LIMIT %s
                    ) AS ordered
                ) AS scan
            ),
            wanted AS (SELECT chunk_id FROM nearest UNION SELECT unnest(%s::text[]))
            SELECT query, similarity, {_CHUNK_COLUMNS}, embedding, metadata @> %s
            FROM wanted JOIN chunks USING (chunk_id) LEFT JOIN nearest USING (chunk_id)
            ORDER BY query, position"""
        # binary both ways (%b, the cursor): a vector is its bytes, not hundreds of decimal numbers
        with connect(self.url) as conn, conn.cursor(binary=True) as cursor:
            with one_round_trip(conn):
                conn.execute(f"SET LOCAL hnsw.ef_search = {int(ef_search)}")
                if where:
                    conn.execute("SET LOCAL hnsw.iterative_scan = 'relaxed_order'")
                cursor.execute(
                    query, ([Vector(v) for v in vectors], *params, limit, list(also), Jsonb(metadata or {}))
                )
            rows = cursor.fetchall()
        found = Candidates([{} for _ in vectors], {}, {}, set())
        for asked, similarity, *row, embedding, matches in rows:
            if asked is not None:
                found.nearest[asked - 1][row[0]] = float(similarity)
            found.chunks[row[0]] = _chunk_from_row(tuple(row))
            found.embeddings[row[0]] = embedding.to_numpy()
            if matches:
                found.matching.add(row[0])
        for i, scores in enumerate(found.nearest):  # relaxed order: nearly sorted, made exact here
            found.nearest[i] = dict(sorted(scores.items(), key=lambda item: -item[1]))
        return found

    def near_duplicates(
        self,
        perceptual_hash: str,
        max_bits: int,
        *,
        document_ids: list[str] | None = None,
        kinds: list[str] | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> dict[str, tuple[int, str]]:
        """{chunk id: (differing bits, its picture's hash)} of the image chunks (not their excerpts)
        whose picture's perceptual hash is within `max_bits` of `perceptual_hash`, closest first: a
        scan of the image chunks."""
        where, params = _filters(document_ids, kinds, metadata)
        distance = "bit_count(('x' || (metadata->>'perceptual_hash'))::bit(64) # ('x' || %s)::bit(64))"
        with connect(self.url) as conn:
            rows = conn.execute(
                f"SELECT chunk_id, distance, hash FROM (SELECT chunk_id, {distance} AS distance,"
                f" metadata->>'perceptual_hash' AS hash FROM chunks {where} {'AND' if where else 'WHERE'}"
                " kind = 'image' AND metadata->>'perceptual_hash' IS NOT NULL"
                " AND NOT metadata ? 'image_excerpt') AS scored WHERE distance <= %s ORDER BY distance, chunk_id",
                (perceptual_hash, *params, max_bits),
            ).fetchall()
        return {chunk_id: (int(distance), picture) for chunk_id, distance, picture in rows}

    def similarities(self, vector: np.ndarray, chunk_ids: Sequence[str]) -> dict[str, float]:
        """Cosine similarity of the stored chunk embeddings to `vector` (no re-encoding)."""
        if not chunk_ids:
            return {}
        with connect(self.url) as conn:
            rows = conn.execute(
                "SELECT chunk_id, 1 - (embedding <=> %s) FROM chunks WHERE chunk_id = ANY(%s)",
                (Vector(vector), list(chunk_ids)),
            ).fetchall()
        return {chunk_id: float(similarity) for chunk_id, similarity in rows}


def _tables_exist(conn: Any) -> bool:
    return conn.execute(
        "SELECT to_regclass('chunks') IS NOT NULL AND to_regclass('rag_images') IS NOT NULL"
    ).fetchone()[0]


def delete_document_rows(document_id: str, url: str | None = None) -> int:
    """Delete a document's chunks and image rows (no embedding dimension needed); returns chunks deleted."""
    with connect(url) as conn:
        if not _tables_exist(conn):
            return 0
        deleted = conn.execute("DELETE FROM chunks WHERE document_id = %s", (document_id,)).rowcount
        conn.execute("DELETE FROM rag_images WHERE document_id = %s", (document_id,))
    return deleted


def chunk_count(document_id: str | None = None, url: str | None = None) -> int:
    """Chunk rows of one document (uses the document_id index), or of all; 0 before the first."""
    with connect(url) as conn:
        if not _tables_exist(conn):
            return 0
        if document_id is None:
            return conn.execute("SELECT count(*) FROM chunks").fetchone()[0]
        return conn.execute("SELECT count(*) FROM chunks WHERE document_id = %s", (document_id,)).fetchone()[
            0
        ]


def indexed_document_ids(url: str | None = None) -> set[str]:
    """Every document id with a row in `chunks` or `rag_images`."""
    with connect(url) as conn:
        if not _tables_exist(conn):
            return set()
        rows = conn.execute(
            "SELECT document_id FROM chunks UNION SELECT document_id FROM rag_images"
        ).fetchall()
    return {row[0] for row in rows}


def stored_chunks(url: str | None = None, batch_size: int = 1000) -> Iterator[Chunk]:
    """Every stored chunk (without its vector), streamed in document order."""
    with connect(url) as conn:
        if not _tables_exist(conn):
            return
        with conn.cursor(name="stored_chunks") as cur:
            cur.itersize = batch_size
            cur.execute(f"SELECT {_CHUNK_COLUMNS} FROM chunks ORDER BY document_id, chunk_index")
            for row in cur:
                yield _chunk_from_row(row)


class RebuildReport(BaseModel):
    chunks: int
    images: int
    dim: int
    reembedded: bool


def rebuild_tables(
    url: str | None = None,
    *,
    embed: Callable[[list[str]], np.ndarray] | None = None,
    dim: int | None = None,
    batch_size: int = 256,
) -> RebuildReport:
    """Rebuild `chunks` and `rag_images` aside (fresh HNSW index) and swap them in, searches answering.

    Without `embed` the stored vectors are copied as they are; with it (a new embedding model,
    `dim` its dimension) every text is embedded again. One transaction: the old tables are locked
    in SHARE mode, so searches keep reading them while writers wait and land in the new tables
    after the swap; the renames at the end take an exclusive lock for an instant.
    """
    with connect(url) as conn, conn.cursor() as cur:
        if not _tables_exist(conn):
            raise RuntimeError("there is no vector index to rebuild yet; ingest a document first")
        cur.execute("LOCK TABLE chunks, rag_images IN SHARE MODE")
        current_dim = cur.execute(
            "SELECT atttypmod FROM pg_attribute WHERE attrelid = 'chunks'::regclass AND attname = 'embedding'"
        ).fetchone()[0]
        new_dim = dim if embed is not None and dim is not None else current_dim
        cur.execute("DROP TABLE IF EXISTS chunks_new, rag_images_new")
        cur.execute(_tables_ddl(new_dim, "chunks_new", "rag_images_new"))
        if embed is None:
            cur.execute("INSERT INTO chunks_new SELECT * FROM chunks")
            cur.execute("INSERT INTO rag_images_new SELECT * FROM rag_images")
        else:
            _reembed_into(
                conn, "chunks", "chunks_new", _CHUNK_COLUMNS, "text", "embedding", embed, batch_size
            )
            _reembed_into(
                conn,
                "rag_images",
                "rag_images_new",
                _IMAGE_COLUMNS,
                "content_chunk",
                "content_vector",
                embed,
                batch_size,
            )
        cur.execute(_indexes_ddl("chunks_new", "rag_images_new"))
        chunks = cur.execute("SELECT count(*) FROM chunks_new").fetchone()[0]
        images = cur.execute("SELECT count(*) FROM rag_images_new").fetchone()[0]
        cur.execute(
            """
            ALTER TABLE chunks RENAME TO chunks_old;
            ALTER TABLE rag_images RENAME TO rag_images_old;
            ALTER TABLE chunks_new RENAME TO chunks;
            ALTER TABLE rag_images_new RENAME TO rag_images;
            DROP TABLE chunks_old, rag_images_old;
            ALTER INDEX chunks_new_document_id RENAME TO chunks_document_id;
            ALTER INDEX chunks_new_embedding_hnsw RENAME TO chunks_embedding_hnsw;
            ALTER INDEX rag_images_new_document_id RENAME TO rag_images_document_id;
            ALTER INDEX chunks_new_pkey RENAME TO chunks_pkey;
            ALTER INDEX rag_images_new_pkey RENAME TO rag_images_pkey;
            """
        )
    return RebuildReport(chunks=chunks, images=images, dim=new_dim, reembedded=embed is not None)


def _reembed_into(
    conn: Any,
    source: str,
    target: str,
    columns: str,
    text_column: str,
    vector_column: str,
    embed: Callable[[list[str]], np.ndarray],
    batch_size: int,
) -> None:
    """Copy `columns` of `source` into `target`, the vector column computed again from the text column."""
    key_column = columns.split(",", 1)[0]
    with conn.cursor(name=f"reembed_{source}") as read, conn.cursor() as write:
        read.execute(f"SELECT {key_column}, {text_column} FROM {source}")
        while batch := read.fetchmany(batch_size):
            vectors = embed([text for _, text in batch])
            write.executemany(
                f"INSERT INTO {target} ({columns}, {vector_column}) "
                f"SELECT {columns}, %s FROM {source} WHERE {key_column} = %s",
                [(Vector(vector), key) for (key, _), vector in zip(batch, vectors, strict=True)],
            )


_IMAGE_COLUMNS = (
    "id, document_id, image_sha256, image_url, raw_ocr_text, raw_vlm_caption, content_chunk, metadata"
)


def _filters(
    document_ids: list[str] | None, kinds: list[str] | None, metadata: dict[str, Any] | None = None
) -> tuple[str, list[Any]]:
    clauses: list[str] = []
    params: list[Any] = []
    if document_ids is not None:
        clauses.append("document_id = ANY(%s)")
        params.append(document_ids)
    if kinds is not None:
        clauses.append("kind = ANY(%s)")
        params.append(kinds)
    if metadata:
        clauses.append("metadata @> %s")
        params.append(Jsonb(metadata))
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
