"""Hybrid search over the materialized indexes: pgvector kNN + BM25, fused by reciprocal rank.

Reads only what the assets wrote; the embedding model and index handles are opened once per
process so a warm search is a query embedding plus two index lookups.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import BaseModel

from vision_rag_pipeline.chunks.model import Chunk
from vision_rag_pipeline.config import RagConfig, RetrievalConfig, load_config
from vision_rag_pipeline.documents.model import BBox
from vision_rag_pipeline.embeddings.encoder import embedding_dimension, encode
from vision_rag_pipeline.indexes.lexical import open_lexical_index
from vision_rag_pipeline.indexes.pgvector_store import PgVectorStore

SearchMode = Literal["hybrid", "vector", "lexical"]


class Hit(BaseModel):
    chunk_id: str
    document: str  # the source file's path as given to `ingest`
    kind: str
    text: str
    score: float
    page: int | None = None
    bbox: BBox | None = None
    char_span: tuple[int, int] | None = None
    image: str | None = None


def rrf_fuse(rankings: list[tuple[list[str], float]], rrf_k: int) -> dict[str, float]:
    """Weighted reciprocal-rank fusion: score(d) = sum over rankings of weight / (rrf_k + rank)."""
    scores: dict[str, float] = {}
    for ids, weight in rankings:
        for rank, chunk_id in enumerate(ids, start=1):
            scores[chunk_id] = scores.get(chunk_id, 0.0) + weight / (rrf_k + rank)
    return scores


@lru_cache(maxsize=4)
def _vector_store(model: str) -> PgVectorStore:
    return PgVectorStore(embedding_dimension(model))


def describe_query_image(image: str | Path) -> str:
    """Search by image: describe the query image the way enrichment describes indexed ones."""
    from vision_rag_pipeline.enrichment.service import describe_image_file

    return describe_image_file(Path(image))


def search(
    text: str | None = None,
    image: str | Path | None = None,
    k: int = 5,
    mode: SearchMode = "hybrid",
    *,
    document_ids: list[str] | None = None,
    kinds: list[str] | None = None,
    config: RagConfig | None = None,
) -> list[Hit]:
    """Best chunks for a text and/or an image query, each with its location in the source."""
    if mode not in ("hybrid", "vector", "lexical"):
        raise ValueError(f"mode must be hybrid, vector or lexical, not {mode!r}")
    config = config or load_config()
    query = " ".join(part for part in (text, describe_query_image(image) if image else None) if part)
    if not query.strip():
        raise ValueError("give a text or an image to search for")
    retrieval: RetrievalConfig = config.retrieval
    pool = max(k, retrieval.candidates)
    rankings: list[tuple[list[str], float]] = []
    vector_scores: dict[str, float] = {}
    if mode in ("hybrid", "vector"):
        store = _vector_store(config.embedding.model)
        vector = encode([query], config.embedding.model)[0]
        hits = store.search(
            vector, pool, ef_search=retrieval.ef_search, document_ids=document_ids, kinds=kinds
        )
        vector_scores = {h.chunk_id: h.score for h in hits}
        rankings.append(([h.chunk_id for h in hits], retrieval.vector_weight))
    lexical_scores: dict[str, float] = {}
    if mode in ("hybrid", "lexical"):
        hits = open_lexical_index().search(query, pool, document_ids=document_ids, kinds=kinds)
        lexical_scores = {h.chunk_id: h.score for h in hits}
        rankings.append(([h.chunk_id for h in hits], retrieval.lexical_weight))
    if mode == "hybrid":
        scores = rrf_fuse(rankings, retrieval.rrf_k)
    else:
        scores = vector_scores or lexical_scores
    best = sorted(scores, key=lambda cid: -scores[cid])[:k]
    chunks = _vector_store(config.embedding.model).fetch(best)
    return [_hit(chunks[cid], scores[cid]) for cid in best if cid in chunks]


def _hit(chunk: Chunk, score: float) -> Hit:
    return Hit(
        chunk_id=chunk.chunk_id,
        document=chunk.metadata.get("source", chunk.document_id),
        kind=chunk.kind,
        text=chunk.text,
        score=round(score, 6),
        page=chunk.page,
        bbox=chunk.bbox,
        char_span=chunk.char_span,
        image=chunk.image,
    )
