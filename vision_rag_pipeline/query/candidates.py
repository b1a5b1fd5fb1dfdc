"""Stage one of a search: the candidates, and the raw signals each retriever gave them.

Documents, then pages, then passages. Across several documents the question's words are first
scored against the documents' headers (title, file name, opening words) by BM25, whose IDF makes a
name that picks out a few documents count for more than words a template shares with forty; the
best of those documents are searched on their own as well, so their passages are candidates
whatever the rest of the index holds. Pages are ranked by their page units (a page's whole text by
BM25, the mean of its chunks' vectors), and the chunks of the best pages become candidates too.
Passages come from BM25 and the HNSW index. Postgres is asked once, for every candidate's row,
vector and page unit, with the search's filters applied to every path.
"""

from __future__ import annotations

from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np

from vision_rag_pipeline.chunks.model import Chunk
from vision_rag_pipeline.core.config import EmbeddingConfig, RetrievalConfig
from vision_rag_pipeline.core.periods import spelled
from vision_rag_pipeline.core.postgres import database_url
from vision_rag_pipeline.embeddings.encoder import (
    embedding_dimension,
    encode,
    resolve_precision,
    variant_precision,
)
from vision_rag_pipeline.images.fingerprint import HASH_BITS
from vision_rag_pipeline.indexes.lexical import LexicalHit, LexicalIndex
from vision_rag_pipeline.indexes.lexical_backend import open_lexical_index
from vision_rag_pipeline.indexes.pgvector_store import CONTENT_KINDS, PageUnit, PgVectorStore, Pointers
from vision_rag_pipeline.query.analysis import QuestionPointers, analyze

# How far each retriever looks. Fixed rather than configured: the ranker's weights were fitted on
# candidates gathered this way (`retrieval.candidates` sets the passages per retriever).
PAGE_UNITS = 20  # pages ranked per query text, by BM25 and by vector
PAGES_OPENED = 5  # of those, per retriever, whose chunks all become candidates
HEADER_UNITS = 400  # page units scored by their document's header: enough to see ~20 documents
DOCUMENTS_FOCUSED = 3  # documents the question names best, searched on their own too
# Search by image: a picture within this many bits (of the 64-bit dHash) of the query image is a
# near duplicate; the one that is closest, with every other picture at least NEAR_DUPLICATE_MARGIN
# bits further, is the query's original (a photo, re-save or resize of it). BENCHMARKS.md "Search by
# image" measures both numbers.
NEAR_DUPLICATE_BITS = 8
NEAR_DUPLICATE_MARGIN = 6


@dataclass
class CandidatePool:
    """Everything a search found for one question, before any scoring."""

    queries: list[
        tuple[str, float]
    ]  # the texts searched (question, sub-questions, the image's text), weights
    pointers: QuestionPointers  # what the question points at (pages, figures, periods)
    across_documents: bool  # the search spans more than one document
    vectors: np.ndarray  # the query texts' embeddings (none in lexical mode)
    chunks: dict[str, Chunk]  # candidates, every one satisfying the filters
    embeddings: dict[str, np.ndarray]
    pages: dict[tuple[str, int | None], PageUnit]  # the units of the candidates' pages, and the nearest
    chunk_bm25: list[dict[str, float]]  # per query text: chunk id -> BM25
    page_bm25: list[dict[tuple[str, int | None], float]]  # per query text: (document, page) -> BM25
    pointed: list[str]  # candidates on the pages the question points at
    near: dict[str, tuple[int, str]] = field(default_factory=dict)  # image chunk -> (bits, picture hash)

    @property
    def ids(self) -> list[str]:
        return list(self.chunks)


@lru_cache(maxsize=256)
def query_vectors(texts: tuple[str, ...], model: str, precision: str) -> np.ndarray:
    """The query texts' embeddings (read-only), kept per process: `ask` searches again with the same
    texts, and the rerank's content query recurs."""
    vectors = encode(list(texts), model, precision=precision)
    vectors.flags.writeable = False
    return vectors


@lru_cache(maxsize=1)
def _search_threads() -> ThreadPoolExecutor:
    """The threads in which a search's lookups run beside each other: one pool per process, shared
    by the searches running at once (up to the pool's default bound)."""
    return ThreadPoolExecutor(thread_name_prefix="search")


def vector_store(model: str) -> PgVectorStore:
    """The store of the index database in effect. Opening it creates the schema and checks the
    embedding dimension, once per process and database: a process whose database changes (another
    home or `database.url`) searches the new one with its schema made there."""
    return _vector_store(model, database_url())


@lru_cache(maxsize=4)
def _vector_store(model: str, url: str) -> PgVectorStore:
    return PgVectorStore(embedding_dimension(model), url)


def indexed_embedding(store: PgVectorStore, embedding: EmbeddingConfig) -> EmbeddingConfig:
    """The embedding settings a query must be embedded with to be compared with the indexed vectors:
    the configured model at the precision that embedded most indexed documents (hosts of a deployment
    may resolve `auto` differently, and a precision change takes effect document by document), or as
    configured when the index holds another model's vectors or none yet."""
    variant = store.model_variant()
    if variant is None:
        return embedding
    model, precision = variant_precision(variant)
    if model != embedding.model or precision == resolve_precision(embedding.precision):
        return embedding
    return embedding.model_copy(update={"precision": precision})


def gather(
    queries: list[tuple[str, float]],
    mode: str,
    *,
    image_hash: str | None,
    document_ids: list[str] | None,
    kinds: list[str] | None,
    metadata: dict | None,
    retrieval: RetrievalConfig,
    embedding: EmbeddingConfig,
) -> CandidatePool:
    """The candidates for `queries` (the question first) within `document_ids` (None: the whole
    index), each retriever's signals kept for the features."""
    question = queries[0][0]
    pointers = analyze(question)
    store = vector_store(embedding.model)
    lexical = open_lexical_index()
    across = document_ids is None or len(document_ids) > 1
    limit = retrieval.candidates
    content_kinds = list(kinds or CONTENT_KINDS)
    # The query texts' embedding, the page and header lookups and the passage lookups run at once,
    # in three threads: torch and tantivy release the GIL for most of their work.
    threads = _search_threads()
    embedding_ahead = (
        threads.submit(
            query_vectors, tuple(text for text, _ in queries), embedding.model, embedding.precision
        )
        if mode in ("hybrid", "vector")
        else None
    )
    lexical_texts = [text for text, _ in queries] if mode in ("hybrid", "lexical") else []
    if lexical_texts and pointers.periods:
        # the question's periods also as documents write them: "FY2021" finds "2021", "3Q24" "Q3 2024"
        lexical_texts[0] = f"{question} {' '.join(spelled(period) for period in pointers.periods)}"
    pages_ahead = threads.submit(_pages_and_focus, lexical, lexical_texts, document_ids, across)
    chunk_hits = [
        lexical.search(text, limit, document_ids=document_ids, kinds=content_kinds) for text in lexical_texts
    ]
    page_hits, focus = pages_ahead.result()
    focused_hits = (
        lexical.search(lexical_texts[0], limit, document_ids=focus, kinds=content_kinds) if focus else []
    )
    vectors = embedding_ahead.result() if embedding_ahead else np.zeros((0, store.dim), dtype=np.float32)
    near = (
        store.near_duplicates(
            image_hash,
            NEAR_DUPLICATE_BITS + NEAR_DUPLICATE_MARGIN,
            document_ids=document_ids,
            kinds=content_kinds,
            metadata=metadata,
        )
        if image_hash
        else {}
    )
    pointed = (
        Pointers(pointers.page_names, list(pointers.positions), pointers.references)
        if pointers.points_into_document
        else None
    )
    page_ids = [hit.chunk_id for hits in page_hits for hit in hits[:PAGES_OPENED]]
    found = store.candidates(
        list(vectors),
        limit,
        [
            *(hit.chunk_id for hits in chunk_hits for hit in hits),
            *(hit.chunk_id for hit in focused_hits),
            *near,
        ],
        ef_search=retrieval.ef_search,
        document_ids=document_ids,
        kinds=kinds,
        metadata=metadata,
        focus_documents=focus,
        page_units=PAGE_UNITS,
        pages_also=page_ids,
        pages_opened=PAGES_OPENED,
        pointers=pointed,
    )
    page_of = {unit.chunk_id: key for key, unit in found.pages.items()}
    return CandidatePool(
        queries=list(queries),
        pointers=pointers,
        across_documents=across,
        vectors=np.asarray(vectors),
        chunks=found.chunks,
        embeddings=found.embeddings,
        pages=found.pages,
        chunk_bm25=[
            {hit.chunk_id: hit.score for hit in hits if hit.chunk_id in found.chunks} for hits in chunk_hits
        ],
        page_bm25=_page_scores(page_hits, page_of),
        pointed=[cid for cid in found.pointed if cid in found.chunks],
        near={cid: value for cid, value in near.items() if cid in found.chunks},
    )


def _pages_and_focus(
    lexical: LexicalIndex, texts: list[str], document_ids: list[str] | None, across: bool
) -> tuple[list[list[LexicalHit]], list[str]]:
    """Per query text its best page units by BM25; and across documents, the documents whose
    headers the question (the first text) names best."""
    page_hits = [
        lexical.search(text, PAGE_UNITS, document_ids=document_ids, kinds=["page"]) for text in texts
    ]
    if not (across and texts):
        return page_hits, []
    headers = lexical.search(
        texts[0], HEADER_UNITS, document_ids=document_ids, kinds=["page"], header_only=True
    )
    return page_hits, list(dict.fromkeys(hit.document_id for hit in headers))[:DOCUMENTS_FOCUSED]


def _page_scores(page_hits: list, page_of: dict[str, tuple[str, int | None]]) -> list[dict]:
    """Per query text: (document, page) -> its page unit's BM25, for the page units Postgres returned."""
    scored: list[dict] = []
    for hits in page_hits:
        by_page: dict[tuple[str, int | None], float] = defaultdict(float)
        for hit in hits:
            if hit.chunk_id in page_of:
                by_page[page_of[hit.chunk_id]] = max(by_page[page_of[hit.chunk_id]], hit.score)
        scored.append(dict(by_page))
    return scored


def same_picture(near: dict[str, tuple[int, str]]) -> list[str]:
    """The chunks of the one indexed picture the query image is a copy of, or none when unsure.

    A copy is within NEAR_DUPLICATE_BITS of its original, but so can be every chart a report series
    draws from one template (2-10 bits apart on the generated set). So the closest picture counts as
    the same only when every other picture is at least NEAR_DUPLICATE_MARGIN bits further away.
    """
    if not near:
        return []
    closest, picture = min(near.values())
    runner_up = min((d for d, other in near.values() if other != picture), default=HASH_BITS + 1)
    if closest > NEAR_DUPLICATE_BITS or runner_up - closest < NEAR_DUPLICATE_MARGIN:
        return []
    return [cid for cid, (_, other) in near.items() if other == picture]
