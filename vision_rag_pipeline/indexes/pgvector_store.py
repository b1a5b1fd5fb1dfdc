"""Chunks and image enrichments in Postgres + pgvector.

`chunks` holds every chunk with its location and vector (HNSW, cosine); `rag_images` is the
reference architecture's table of enriched images. A document's rows are replaced in one
transaction (delete, then COPY), so re-materializing a partition never duplicates rows and
readers never see a half-written document.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
from pgvector import Vector
from psycopg.types.json import Jsonb
from pydantic import BaseModel

from vision_rag_pipeline.chunks.model import Chunk, Landmarks, embedding_text
from vision_rag_pipeline.core.postgres import connect, ensure_schema, one_round_trip, unbounded_statements
from vision_rag_pipeline.enrichment.model import EnrichmentResult

CONTENT_KINDS = ("text", "table", "image")  # what a search returns; page units only rank pages


class DimensionMismatchError(RuntimeError):
    """The index was built for another embedding dimension."""


def _tables_ddl(dim: int, chunks: str = "chunks", images: str = "rag_images") -> str:
    return f"""
CREATE TABLE IF NOT EXISTS {chunks} (
    chunk_id text PRIMARY KEY,
    document_id text NOT NULL,
    chunk_index integer NOT NULL,
    kind text NOT NULL CHECK (kind IN ('text', 'table', 'image', 'page')),
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
{_inline_vectors(chunks, "embedding")}
{_inline_vectors(images, "content_vector")}
"""


def _inline_vectors(table: str, column: str) -> str:
    """Keep a row's vector in the row (storage MAIN), where pgvector's default (EXTERNAL) moves it
    out of a row of more than ~2 kB into the TOAST table, and every read of it (the distance to a
    query, a candidate's vector) into a second lookup. A long text or metadata goes out instead.
    Set only where it is not yet: ALTER TABLE locks the table."""
    return f"""DO $$ BEGIN
    IF (SELECT attstorage FROM pg_attribute WHERE attrelid = '{table}'::regclass AND attname = '{column}') <> 'm'
    THEN ALTER TABLE {table} ALTER COLUMN {column} SET STORAGE MAIN; END IF;
END $$;"""


# How many pages of its document follow a chunk's page (0 on the last page): an expression index on
# it finds the last pages of every document without reading every row's landmarks.
_PAGES_LEFT = "((metadata->'landmarks'->>'page_count')::int - page)"


# The HNSW graphs' build breadth (pgvector's ef_construction; its default is 64). A wider build finds
# more of a query's true nearest chunks at the same search breadth (`retrieval.ef_search`) for about
# twice the build time: BENCHMARKS.md "Query latency" measures both. An index keeps the breadth it
# was built with; `vision-rag reindex` builds it again.
HNSW_EF_CONSTRUCTION = 256
_HNSW = f"USING hnsw (embedding vector_cosine_ops) WITH (ef_construction = {HNSW_EF_CONSTRUCTION})"


def _indexes_ddl(chunks: str = "chunks", images: str = "rag_images") -> str:
    """The chunks' indexes: the vectors' (HNSW, one for content chunks, one for page units), the
    documents', a page's (its chunks and its page unit by one lookup: the `page` of a web archive's
    chunks is NULL, their key -1; it replaces an index of the page units alone), and those of the
    landmarks a question points at (`Pointers`), so a pointing question reads the rows it points at,
    not every row of the index."""
    return f"""
CREATE INDEX IF NOT EXISTS {chunks}_document_id ON {chunks} (document_id);
CREATE INDEX IF NOT EXISTS {chunks}_embedding_hnsw ON {chunks} {_HNSW} WHERE kind <> 'page';
CREATE INDEX IF NOT EXISTS {chunks}_page_hnsw ON {chunks} {_HNSW} WHERE kind = 'page';
DROP INDEX IF EXISTS {chunks}_page_units;
CREATE INDEX IF NOT EXISTS {chunks}_document_page ON {chunks} (document_id, coalesce(page, -1));
CREATE INDEX IF NOT EXISTS {chunks}_landmarks ON {chunks} USING gin ((metadata->'landmarks') jsonb_path_ops);
CREATE INDEX IF NOT EXISTS {chunks}_page ON {chunks} (page);
CREATE INDEX IF NOT EXISTS {chunks}_pages_left ON {chunks} ({_PAGES_LEFT});
CREATE INDEX IF NOT EXISTS {images}_document_id ON {images} (document_id);
"""


# Tables made before page units allowed only three kinds: widen their check once (NOT VALID: no scan).
_PAGE_KIND_MIGRATION = """
DO $$
DECLARE old record;
BEGIN
    FOR old IN SELECT conname FROM pg_constraint WHERE conrelid = 'chunks'::regclass AND contype = 'c'
        AND pg_get_constraintdef(oid) LIKE '%kind%' AND pg_get_constraintdef(oid) NOT LIKE '%page%'
    LOOP
        EXECUTE format('ALTER TABLE chunks DROP CONSTRAINT %I', old.conname);
        ALTER TABLE chunks ADD CONSTRAINT chunks_kind_check
            CHECK (kind IN ('text', 'table', 'image', 'page')) NOT VALID;
    END LOOP;
END $$;
"""


# Which model variant (encoder.model_variant: model name and precision) embedded each document's
# vectors: `reindex` re-embeds where it is not the configured one, and a search embeds the query with
# the variant of the indexed documents. One row per document, so reading it is cheap.
_VECTOR_MODELS_DDL = """
CREATE TABLE IF NOT EXISTS vector_models (document_id text PRIMARY KEY, model text NOT NULL);
"""


_MODELS_QUERY = (
    "SELECT jsonb_object_agg(model, documents) FROM"
    " (SELECT model, count(*) AS documents FROM vector_models GROUP BY model) AS m"
)


def _schema(dim: int) -> str:
    return _tables_ddl(dim) + _indexes_ddl() + _PAGE_KIND_MIGRATION + _VECTOR_MODELS_DDL


_ROW_COLUMNS = "chunk_id, document_id, chunk_index, kind, text, page, bbox, char_start, char_end, image_url"
_CHUNK_COLUMNS = f"{_ROW_COLUMNS}, metadata"
# A search's rows carry their metadata without what no search reads and a PDF chunk has most of: the
# descriptions of its images and the landmarks other than the periods (the document's header, the
# page names), ~0.7 kB of JSON a row to decode otherwise.
_SEARCHED_COLUMNS = (
    f"{_ROW_COLUMNS}, metadata - 'images' - 'landmarks' || jsonb_strip_nulls(jsonb_build_object("
    "'landmarks', jsonb_build_object('periods', metadata->'landmarks'->'periods')))"
)


class Pointers(NamedTuple):
    """Chunks a question points at by their landmarks: on a page it names, on the first or last pages,
    or on a page captioning a figure or table it names (query/analysis.py reads them)."""

    page_names: list[str]
    positions: list[str]  # "first", "last", "second_last"
    references: list[str]

    def condition(self) -> tuple[str, list[Any]]:
        """The SQL condition (any of them) and its parameters; ("", []) when there is none. Each part
        is one the chunks' indexes answer (`_indexes_ddl`): landmark containment, the page, the
        pages left."""
        parts: list[str] = []
        params: list[Any] = []
        for field, values in (("page_names", self.page_names), ("references", self.references)):
            for value in values:
                parts.append("metadata->'landmarks' @> %s")
                params.append(Jsonb({field: [value]}))
        places = {"first": "page = 1", "last": f"{_PAGES_LEFT} = 0", "second_last": f"{_PAGES_LEFT} = 1"}
        parts += [places[position] for position in self.positions if position in places]
        return ("(" + " OR ".join(parts) + ")" if parts else ""), params


class PageUnit(NamedTuple):
    """A page unit as a search reads it: no Chunk (a search reads ~100 and cites at most k), its
    cosine similarity to each query vector computed where its vector is."""

    chunk_id: str
    text: str  # the page's whole text: a page hit's text
    similarities: np.ndarray  # one per query vector


class Candidates(NamedTuple):
    """What one search reads from Postgres (`PgVectorStore.candidates`): every row satisfies the
    search's filters, whichever way it was found."""

    nearest: list[dict[str, float]]  # per query vector: content chunk id -> cosine similarity, best first
    chunks: dict[str, Chunk]  # the content chunks found (and the page units pointed at, without filters)
    embeddings: dict[str, np.ndarray]  # their stored vectors
    pages: dict[tuple[str, int | None], PageUnit]  # the unit of each found chunk's page and the nearest
    pointed: list[str]  # chunks and page units the question points at, most similar to the first vector first


class PgVectorStore:
    def __init__(self, dim: int, url: str | None = None) -> None:
        self.dim = dim
        self.url = url
        self.models: dict[str, int] = {}  # model variant: documents it embedded (`vector_models`)
        self._models_read = 0.0
        ensure_schema(_schema(dim), url)
        self._check_dimension()

    def _check_dimension(self) -> None:
        """Refuse vectors of another dimension; read which variants embedded the index (one round trip)."""
        with connect(self.url) as conn:
            stored_dim, models = conn.execute(
                f"SELECT (SELECT atttypmod FROM pg_attribute WHERE attrelid = 'chunks'::regclass"
                f" AND attname = 'embedding'), ({_MODELS_QUERY})"
            ).fetchone()
        if stored_dim is not None and stored_dim != self.dim:
            raise DimensionMismatchError(
                f"the chunks table holds {stored_dim}-dimensional vectors but the embedding model gives {self.dim}; "
                "reindex after changing the embedding model"
            )
        self.models, self._models_read = dict(models or {}), time.monotonic()

    def model_variant(self, max_age_s: float = 30.0) -> str | None:
        """The variant that embedded most indexed documents (None before the first is recorded), read
        again when the last reading is older than `max_age_s`: a long-lived server follows a reindex."""
        if time.monotonic() - self._models_read > max_age_s:
            with connect(self.url) as conn:
                models = conn.execute(_MODELS_QUERY).fetchone()[0]
            self.models, self._models_read = dict(models or {}), time.monotonic()
        return max(sorted(self.models), key=self.models.__getitem__) if self.models else None

    def replace_document(
        self,
        document_id: str,
        chunks: Sequence[Chunk],
        vectors: np.ndarray,
        images: Sequence[tuple[EnrichmentResult, np.ndarray]] = (),
        model: str | None = None,
    ) -> None:
        """Delete the document's rows and write the new ones in one transaction, with the model variant
        that embedded `vectors` (None: not known, so `reindex` will embed them again)."""
        if len(chunks) != len(vectors):
            raise ValueError(f"{len(chunks)} chunks but {len(vectors)} vectors")
        with connect(self.url) as conn, conn.cursor() as cur:
            cur.execute("DELETE FROM chunks WHERE document_id = %s", (document_id,))
            cur.execute("DELETE FROM rag_images WHERE document_id = %s", (document_id,))
            cur.execute("DELETE FROM vector_models WHERE document_id = %s", (document_id,))
            if model is not None:
                cur.execute(
                    "INSERT INTO vector_models (document_id, model) VALUES (%s, %s)", (document_id, model)
                )
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
        with connect(self.url) as conn, conn.cursor() as cursor:
            with one_round_trip(conn):
                cursor.execute(
                    "SELECT DISTINCT document_id FROM chunks WHERE document_id = ANY(%s)"
                    " OR metadata->>'source' = ANY(%s) OR regexp_replace(metadata->>'source', '^.*/', '') = ANY(%s)",
                    (list(values), list(values), names),
                )
            rows = cursor.fetchall()
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
        focus_documents: Sequence[str] = (),
        page_units: int = 0,
        pages_also: Sequence[str] = (),
        pages_opened: int = 0,
        pointers: Pointers | None = None,
    ) -> Candidates:
        """A search's one round trip. Candidates: the `limit` nearest content chunks to each vector
        through the HNSW index, and as many within `focus_documents` (the documents the question
        names); the chunks on the first `pages_opened` of the `page_units` page units nearest each
        vector and on the pages `pages_also` names (page unit ids); the chunks `pointers` point at (by
        similarity to the first vector); the chunks `also` names. Every candidate satisfies the
        filters (documents, kinds, metadata containment). Returned with their rows and vectors, and
        with the page unit of each candidate's page: its row without metadata, and its similarity to
        each vector instead of its own vector (a search reads no more of it); a row's metadata
        without its images and its landmarks other than the periods (`_SEARCHED_COLUMNS`).

        The filters are applied in each scan: pgvector's iterative scan keeps walking the graph until
        `limit` rows pass them, so a selective filter does not starve the result. The literal
        `kind <> 'page'` and `kind = 'page'` let each scan use its partial HNSW index.
        """
        where, params = _filters(document_ids, list(kinds or CONTENT_KINDS), metadata, alias="c")
        page_where, page_params = _filters(document_ids, None, None, alias="c")
        pointed_on, pointed_on_params = pointers.condition() if pointers else ("", [])
        pointed_on = pointed_on if len(vectors) else ""
        scan = """
            SELECT asked.query, scan.*
            FROM unnest(%b::vector[]) WITH ORDINALITY AS asked (vector, query)
            CROSS JOIN LATERAL (
                SELECT row_number() OVER () AS position, * FROM (
                    SELECT chunk_id, 1 - (embedding <=> asked.vector) AS similarity FROM chunks c
                    WHERE {where} ORDER BY embedding <=> asked.vector LIMIT %s
                ) AS ordered
            ) AS scan"""
        # a pointed PDF page whose text no chunk is cited on (a cover of a few words) counts as its
        # page unit, unless the filters ask for kinds (a page unit is none of them) or metadata; a web
        # archive has no pages to point at, and its one page unit is never a hit
        pointed_kinds = (
            "" if metadata or kinds is not None else " OR (c.kind = 'page' AND c.page IS NOT NULL)"
        )
        # the rows pointed at are read through the landmarks' indexes, then ordered by their distance
        # to the question: a walk of the HNSW graph filtered to them would read far more of the index
        pointed = (
            "SELECT chunk_id, row_number() OVER () AS position FROM (SELECT chunk_id FROM pointed_rows"
            " ORDER BY distance LIMIT %s) AS ordered"
            if pointed_on
            else "SELECT NULL::text AS chunk_id, NULL::bigint AS position WHERE false"
        )
        pointed_rows = (
            f"SELECT chunk_id, embedding <=> %b::vector AS distance FROM chunks c"
            f" WHERE (({where}){pointed_kinds}) AND {page_where} AND {pointed_on}"
            if pointed_on
            else "SELECT NULL::text AS chunk_id, NULL::float8 AS distance WHERE false"
        )
        query = f"""
            WITH nearest AS ({scan.format(where=f"c.kind <> 'page' AND {where}")}),
            focused AS ({scan.format(where=f"c.kind <> 'page' AND {where} AND c.document_id = ANY(%s)")}),
            page_nearest AS ({scan.format(where=f"c.kind = 'page' AND {page_where}")}),
            opened AS (
                SELECT chunk_id FROM page_nearest WHERE position <= %s UNION SELECT unnest(%s::text[])
            ),
            on_pages AS (
                SELECT c.chunk_id FROM chunks c JOIN chunks p ON c.document_id = p.document_id
                AND coalesce(c.page, -1) = coalesce(p.page, -1) WHERE p.chunk_id IN (SELECT chunk_id FROM opened)
                AND c.kind <> 'page' AND {where}
            ),
            pointed_rows AS MATERIALIZED ({pointed_rows}),
            pointed AS ({pointed}),
            found AS (
                SELECT chunk_id FROM nearest UNION SELECT chunk_id FROM focused
                UNION SELECT chunk_id FROM on_pages UNION SELECT chunk_id FROM pointed
                UNION SELECT unnest(%s::text[])
            ),
            rows AS (
                SELECT c.*, 'chunk' AS role FROM chunks c
                WHERE c.chunk_id IN (SELECT chunk_id FROM found) AND c.kind <> 'page' AND {where}
                UNION ALL SELECT c.*, 'chunk' FROM chunks c WHERE c.chunk_id IN (SELECT chunk_id FROM pointed)
                AND c.kind = 'page'
            ),
            units AS (
                SELECT chunk_id FROM page_nearest
                UNION SELECT c.chunk_id FROM (SELECT DISTINCT document_id, page FROM rows) AS r
                JOIN chunks c ON c.document_id = r.document_id AND c.kind = 'page' AND coalesce(c.page, -1) = coalesce(r.page, -1)
            )
            SELECT {_SEARCHED_COLUMNS}, embedding, NULL::float8[], role,
                (SELECT position FROM pointed p WHERE p.chunk_id = r.chunk_id)
            FROM rows r
            UNION ALL
            SELECT {_ROW_COLUMNS}, NULL::jsonb, NULL::vector, ARRAY(
                SELECT 1 - (u.embedding <=> asked.vector) FROM unnest(%b::vector[]) WITH ORDINALITY AS asked (vector, query)
                ORDER BY asked.query
            ), 'page', NULL FROM chunks u WHERE chunk_id IN (SELECT chunk_id FROM units)"""
        wanted = [Vector(v) for v in vectors]
        arguments: list[Any] = [wanted, *params, limit]
        arguments += [wanted, *params, list(focus_documents), limit if focus_documents else 0]
        arguments += [wanted, *page_params, page_units, pages_opened, list(pages_also), *params]
        if pointed_on:
            arguments += [wanted[0], *params, *page_params, *pointed_on_params, limit]
        arguments += [list(also), *params, wanted]
        # binary results (the cursor): a vector is its bytes, not hundreds of decimal numbers
        with connect(self.url) as conn, conn.cursor(binary=True) as cursor:
            with one_round_trip(conn):
                conn.execute(f"SET LOCAL hnsw.ef_search = {int(ef_search)}")
                conn.execute("SET LOCAL hnsw.iterative_scan = 'relaxed_order'")
                cursor.execute(query, arguments)
            rows = cursor.fetchall()
        found = Candidates([{} for _ in vectors], {}, {}, {}, [])
        pointed_at: dict[str, int] = {}
        for *row, embedding, similarities, role, position in rows:
            if role == "page":
                chunk_id, document_id, _, _, text, page = row[:6]  # _ROW_COLUMNS
                found.pages[(document_id, page)] = PageUnit(
                    chunk_id, text, np.asarray(similarities, dtype=float)
                )
                continue
            chunk = _chunk_from_row(tuple(row))
            found.chunks[chunk.chunk_id] = chunk
            found.embeddings[chunk.chunk_id] = embedding.to_numpy()
            if position is not None:
                pointed_at[chunk.chunk_id] = int(position)
        if found.chunks and len(vectors):
            ids = [cid for cid, chunk in found.chunks.items() if chunk.kind != "page"]
            matrix = np.stack([found.embeddings[cid] for cid in ids]) if ids else np.zeros((0, self.dim))
            for i, vector in enumerate(vectors):
                similarity = _cosines(matrix, vector)
                order = np.argsort(-similarity, kind="stable")[:limit]
                found.nearest[i].update((ids[j], float(similarity[j])) for j in order)
        found.pointed.extend(sorted(pointed_at, key=pointed_at.__getitem__))
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


def _cosines(matrix: np.ndarray, vector: np.ndarray) -> np.ndarray:
    """Cosine similarity of each row of `matrix` to `vector` (float32 sums, as pgvector's)."""
    if not len(matrix):
        return np.zeros(0)
    matrix = matrix.astype(np.float32)
    vector = np.asarray(vector, dtype=np.float32)
    norms = np.sqrt(np.einsum("ij,ij->i", matrix, matrix).astype(np.float64) * float(vector @ vector))
    return np.clip((matrix @ vector).astype(np.float64) / np.where(norms > 0, norms, 1.0), -1.0, 1.0)


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
        if conn.execute("SELECT to_regclass('vector_models') IS NOT NULL").fetchone()[0]:
            conn.execute("DELETE FROM vector_models WHERE document_id = %s", (document_id,))
    return deleted


def stored_models(url: str | None = None) -> dict[str | None, int]:
    """{model variant: indexed documents it embedded}; None counts documents indexed without a record
    (before variants were recorded, or written without one)."""
    ensure_schema(_VECTOR_MODELS_DDL, url)
    with connect(url) as conn:
        if not _tables_exist(conn):
            return {}
        rows = conn.execute(
            "SELECT v.model, count(*) FROM (SELECT document_id FROM chunks UNION SELECT document_id FROM"
            " rag_images) AS d LEFT JOIN vector_models v USING (document_id) GROUP BY v.model"
        ).fetchall()
    return {model: int(documents) for model, documents in rows}


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
    model: str | None = None,
) -> RebuildReport:
    """Rebuild `chunks` and `rag_images` aside (fresh HNSW index) and swap them in, searches answering.

    Without `embed` the stored vectors are copied as they are; with it (a new embedding model,
    `dim` its dimension, `model` the variant `embed` runs, recorded for every document) every text
    is embedded again. One transaction: the old tables are locked
    in SHARE mode, so searches keep reading them while writers wait and land in the new tables
    after the swap; the renames at the end take an exclusive lock for an instant. Its statements
    take as long as the index is large: no statement timeout bounds them.
    """
    with connect(url) as conn, unbounded_statements(conn), conn.cursor() as cur:
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
            chunk_text = (
                "kind, text, metadata->>'title'",
                lambda row: embedding_text(row[0], row[1], row[2] or ""),
            )
            _reembed_into(
                conn,
                "chunks",
                "chunks_new",
                _CHUNK_COLUMNS,
                chunk_text,
                "embedding",
                embed,
                batch_size,
                "kind <> 'page'",
            )
            # a page unit is the mean of its page's chunks (embeddings/pages.py), encoded only without them
            cur.execute(
                f"INSERT INTO chunks_new ({_CHUNK_COLUMNS}, embedding) SELECT {_CHUNK_COLUMNS}, mean FROM ("
                f"SELECT p.*, (SELECT l2_normalize(avg(c.embedding)) FROM chunks_new c WHERE c.document_id ="
                " p.document_id AND coalesce(c.page, -1) = coalesce(p.page, -1) AND c.kind <> 'page') AS mean"
                " FROM chunks p WHERE p.kind = 'page') AS units WHERE mean IS NOT NULL"
            )
            _reembed_into(
                conn,
                "chunks",
                "chunks_new",
                _CHUNK_COLUMNS,
                chunk_text,
                "embedding",
                embed,
                batch_size,
                "kind = 'page' AND chunk_id NOT IN (SELECT chunk_id FROM chunks_new)",
            )
            _reembed_into(
                conn,
                "rag_images",
                "rag_images_new",
                _IMAGE_COLUMNS,
                ("content_chunk", lambda row: row[0]),
                "content_vector",
                embed,
                batch_size,
            )
            cur.execute(_VECTOR_MODELS_DDL + "DELETE FROM vector_models")
            if model is not None:
                cur.execute(
                    "INSERT INTO vector_models (document_id, model) SELECT document_id, %s FROM"
                    " (SELECT document_id FROM chunks_new UNION SELECT document_id FROM rag_images_new) AS d",
                    (model,),
                )
        cur.execute(_indexes_ddl("chunks_new", "rag_images_new"))
        chunks = cur.execute("SELECT count(*) FROM chunks_new").fetchone()[0]
        images = cur.execute("SELECT count(*) FROM rag_images_new").fetchone()[0]
        # every index of the new tables takes the name the old one had (chunks_new_x -> chunks_x)
        new_indexes = cur.execute(
            "SELECT indexname FROM pg_indexes WHERE tablename IN ('chunks_new', 'rag_images_new')"
        ).fetchall()
        renames = [
            f'ALTER INDEX "{name}" RENAME TO "{name.replace("_new_", "_", 1)}";' for (name,) in new_indexes
        ]
        cur.execute(
            """
            ALTER TABLE chunks RENAME TO chunks_old;
            ALTER TABLE rag_images RENAME TO rag_images_old;
            ALTER TABLE chunks_new RENAME TO chunks;
            ALTER TABLE rag_images_new RENAME TO rag_images;
            DROP TABLE chunks_old, rag_images_old;
            """
            + "\n".join(renames)
        )
    return RebuildReport(chunks=chunks, images=images, dim=new_dim, reembedded=embed is not None)


def _reembed_into(
    conn: Any,
    source: str,
    target: str,
    columns: str,
    text: tuple[str, Callable[[tuple[Any, ...]], str]],
    vector_column: str,
    embed: Callable[[list[str]], np.ndarray],
    batch_size: int,
    where: str = "TRUE",
) -> None:
    """Copy `columns` of the `source` rows `where` selects into `target`, the vector column computed
    again from the text `text` makes of the columns it names (what ingest embedded for that row)."""
    text_columns, text_of = text
    key_column = columns.split(",", 1)[0]
    with conn.cursor(name=f"reembed_{source}") as read, conn.cursor() as write:
        read.execute(f"SELECT {key_column}, {text_columns} FROM {source} WHERE {where}")
        while batch := read.fetchmany(batch_size):
            vectors = embed([text_of(tuple(row[1:])) for row in batch])
            write.executemany(
                f"INSERT INTO {target} ({columns}, {vector_column}) "
                f"SELECT {columns}, %s FROM {source} WHERE {key_column} = %s",
                [(Vector(vector), row[0]) for row, vector in zip(batch, vectors, strict=True)],
            )


_IMAGE_COLUMNS = (
    "id, document_id, image_sha256, image_url, raw_ocr_text, raw_vlm_caption, content_chunk, metadata"
)


def _filters(
    document_ids: list[str] | None,
    kinds: list[str] | None,
    metadata: dict[str, Any] | None = None,
    *,
    alias: str | None = None,
) -> tuple[str, list[Any]]:
    """A WHERE clause for the filters (with `alias`: a bare condition on that table, TRUE when
    there is none) and its parameters."""
    column = f"{alias}." if alias else ""
    clauses: list[str] = []
    params: list[Any] = []
    if document_ids is not None:
        clauses.append(f"{column}document_id = ANY(%s)")
        params.append(document_ids)
    if kinds is not None:
        clauses.append(f"{column}kind = ANY(%s)")
        params.append(kinds)
    if metadata:
        clauses.append(f"{column}metadata @> %s")
        params.append(Jsonb(metadata))
    if alias:
        return " AND ".join(clauses) or "TRUE", params
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
        Jsonb(chunk.metadata | {"landmarks": chunk.landmarks.model_dump()}),
    )


def _chunk_from_row(row: tuple[Any, ...]) -> Chunk:
    """A stored row as a Chunk, the chunk unvalidated: the rows were validated when written (a search
    reads a few hundred). Its landmarks are validated: a row written before a landmark field existed
    lacks it, and `model_construct` fills a missing field from its `default_factory` through a
    signature check that costs about 1 ms a row."""
    (chunk_id, document_id, index, kind, text, page, bbox, char_start, char_end, image, metadata) = row
    metadata = dict(metadata or {})
    return Chunk.model_construct(
        chunk_id=chunk_id,
        document_id=document_id,
        index=index,
        kind=kind,
        text=text,
        page=page,
        bbox=tuple(bbox) if bbox else None,
        char_span=(char_start, char_end) if char_start is not None else None,
        image=image,
        landmarks=Landmarks.model_validate(metadata.pop("landmarks", {})),
        metadata=metadata,
    )
