"""Hybrid search over the materialized indexes: pgvector kNN + BM25, fused by rank or by score.

Reads only what the assets wrote; the embedding model and index handles are opened once per
process so a warm search is a query embedding plus two index lookups per query text. A text and
an image (or several sub-questions) are separate rankings fused together, so a chunk found by
several of them is one hit with the combined score.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal, NamedTuple

from pydantic import BaseModel

from vision_rag_pipeline.chunks.model import Chunk
from vision_rag_pipeline.core.config import RagConfig, RetrievalConfig, load_config
from vision_rag_pipeline.core.text import ENGLISH_STOP_WORDS, QUESTION_WORDS
from vision_rag_pipeline.documents.model import BBox
from vision_rag_pipeline.embeddings.encoder import embedding_dimension, encode
from vision_rag_pipeline.indexes.lexical_backend import open_lexical_index
from vision_rag_pipeline.indexes.pgvector_store import PgVectorStore
from vision_rag_pipeline.query.image_query import describe_query_image

SearchMode = Literal["hybrid", "vector", "lexical"]
SEARCH_MODES = ("hybrid", "vector", "lexical")
CHUNK_KINDS = ("text", "table", "image")


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


class Ranking(NamedTuple):
    """One retriever's answer to one query text: chunk id -> score, best first, and its weight."""

    scores: dict[str, float]
    weight: float


class Filters(BaseModel):
    """Restrict a search: documents (id, source path or file name), chunk kinds, metadata containment."""

    documents: list[str] | None = None
    kinds: list[str] | None = None
    metadata: dict[str, Any] | None = None


def rrf_fuse(rankings: list[tuple[list[str], float]], rrf_k: int) -> dict[str, float]:
    """Weighted reciprocal-rank fusion: score(d) = sum over rankings of weight / (rrf_k + rank)."""
    scores: dict[str, float] = {}
    for ids, weight in rankings:
        for rank, chunk_id in enumerate(ids, start=1):
            scores[chunk_id] = scores.get(chunk_id, 0.0) + weight / (rrf_k + rank)
    return scores


def weighted_fuse(rankings: list[Ranking]) -> dict[str, float]:
    """Min-max normalize each ranking's scores to 0..1, then sum weight x normalized score.

    BM25 and cosine live on different scales; normalizing per ranking makes the weights mean what
    they say. A ranking whose scores are all equal gives each of its chunks the full weight.
    """
    fused: dict[str, float] = {}
    for scores, weight in rankings:
        if not scores:
            continue
        low, high = min(scores.values()), max(scores.values())
        for chunk_id, score in scores.items():
            normalized = (score - low) / (high - low) if high > low else 1.0
            fused[chunk_id] = fused.get(chunk_id, 0.0) + weight * normalized
    return fused


def fuse(rankings: list[Ranking], retrieval: RetrievalConfig) -> dict[str, float]:
    if retrieval.fusion == "weighted":
        return weighted_fuse(rankings)
    return rrf_fuse([(list(r.scores), r.weight) for r in rankings], retrieval.rrf_k)


@lru_cache(maxsize=4)
def vector_store(model: str) -> PgVectorStore:
    """Opening the store creates the schema and checks the embedding dimension, once per process."""
    return PgVectorStore(embedding_dimension(model))


def _lexical_ranking(
    store: PgVectorStore,
    query: str,
    limit: int,
    document_ids: list[str] | None,
    kinds: list[str] | None,
    metadata: dict[str, Any] | None,
) -> dict[str, float]:
    """BM25 hits; a metadata filter is applied afterwards in Postgres, on a larger candidate set."""
    fetch = limit * 4 if metadata else limit
    hits = open_lexical_index().search(query, fetch, document_ids=document_ids, kinds=kinds)
    scores = {hit.chunk_id: hit.score for hit in hits}
    if metadata and scores:
        kept = store.matching(list(scores), metadata)
        scores = {cid: s for cid, s in scores.items() if cid in kept}
    return dict(list(scores.items())[:limit])


def search_queries(
    queries: Sequence[tuple[str, float]],
    k: int,
    mode: SearchMode = "hybrid",
    *,
    filters: Filters | None = None,
    config: RagConfig | None = None,
) -> list[Hit]:
    """Best chunks for several weighted query texts at once (text + image description, sub-questions)."""
    if mode not in SEARCH_MODES:
        raise ValueError(f"mode must be hybrid, vector or lexical, not {mode!r}")
    if k <= 0:
        raise ValueError(f"k must be positive, not {k}")
    queries = [(text, weight) for text, weight in queries if text and text.strip()]
    if not queries:
        raise ValueError("give a text or an image to search for")
    config = config or load_config()
    filters = filters or Filters()
    if filters.kinds is not None and (unknown := set(filters.kinds) - set(CHUNK_KINDS)):
        raise ValueError(f"unknown chunk kind(s) {sorted(unknown)}; use text, table or image")
    retrieval = config.retrieval
    store = vector_store(config.embedding.model)
    document_ids = store.resolve_documents(filters.documents) if filters.documents is not None else None
    if document_ids == []:
        return []
    pool = max(k, retrieval.candidates)
    rankings: list[Ranking] = []
    lexical_rankings: list[Ranking] = []
    if mode in ("hybrid", "lexical"):
        for text, weight in queries:
            scores = _lexical_ranking(store, text, pool, document_ids, filters.kinds, filters.metadata)
            lexical_rankings.append(Ranking(scores, weight * retrieval.lexical_weight))
    asked = content_query(queries[0][0])
    rescore = bool(retrieval.content_rerank_depth and asked and mode != "lexical")
    similarities: dict[str, float] = {}
    if mode in ("hybrid", "vector"):
        # one encoder call for the query texts and, when re-scoring, what the first one asks about
        vectors = encode(
            [text for text, _ in queries] + ([asked] if rescore else []),
            config.embedding.model,
            precision=config.embedding.precision,
        )
        for (_, weight), vector in zip(queries, vectors[: len(queries)], strict=True):
            scores = store.nearest(
                vector,
                pool,
                ef_search=retrieval.ef_search,
                document_ids=document_ids,
                kinds=filters.kinds,
                metadata=filters.metadata,
            )
            rankings.append(Ranking(scores, weight * retrieval.vector_weight))
        if rescore:  # every candidate: the fused head is known only later
            candidates = set().union(*(r.scores for r in rankings + lexical_rankings))
            similarities = store.similarities(vectors[-1], sorted(candidates))
    rankings += lexical_rankings
    fused = fuse(rankings, retrieval)
    ranked = sorted(fused, key=lambda cid: -fused[cid])
    depth = max(k, retrieval.identifier_rerank_depth, retrieval.content_rerank_depth if rescore else 0)
    chunks = store.fetch(ranked[: depth * 2])  # a lexical entry may outlive its Postgres row briefly
    best = [cid for cid in ranked[: depth * 2] if cid in chunks][:depth]
    if similarities:
        head = best[: retrieval.content_rerank_depth]
        best = rerank_by_content(head, fused, similarities, retrieval.content_weight) + best[len(head) :]
    if retrieval.identifier_rerank_depth:
        head = best[: max(k, retrieval.identifier_rerank_depth)]
        texts = {cid: chunks[cid].text for cid in head}
        titles = {cid: str(chunks[cid].metadata.get("title") or "") for cid in head}
        best = rerank_by_identifiers(queries[0][0], head, texts, titles) + best[len(head) :]
    return [_hit(chunks[cid], fused[cid]) for cid in best[:k]]


_IDENTIFIER = re.compile(r"\b(?:[A-Z][\w&'-]*[a-z][\w&'-]*|Q[1-4]|(?:19|20)\d\d)\b")
_WORD = re.compile(r"[\w&'’-]+")
_MONTHS = (
    "january",
    "february",
    "march",
    "april",
    "may",
    "june",
    "july",
    "august",
    "september",
    "october",
    "november",
    "december",
)
_ASKS_FOR_SHARE = re.compile(
    r"\b(?:share|percentage|percent|proportion|fraction)\s+of\b|\bwhat\s+(?:percentage|percent|proportion)\b|%",
    re.IGNORECASE,
)
_STATES_SHARE = re.compile(r"\d\s?%|\d\s+per\s?cent\b", re.IGNORECASE)
_MONTH_AND_YEAR = re.compile(r"\b(" + "|".join(m.capitalize() for m in _MONTHS) + r")\s+(?:19|20)\d\d\b")


def query_identifiers(query: str) -> set[str]:
    """Names, quarters and years in a query: the words that tell one report from its siblings.

    A month with its year ("April 2025") also names its calendar quarter (q2): reports and their
    charts say "Q2 2025" and "Apr", rarely "April".
    """
    tokens = {_normalized(token) for token in _IDENTIFIER.findall(query)}
    quarters = {f"q{_MONTHS.index(month.lower()) // 3 + 1}" for month in _MONTH_AND_YEAR.findall(query)}
    return (tokens | quarters) - ENGLISH_STOP_WORDS - QUESTION_WORDS


def _normalized(token: str) -> str:
    return token.lower().removesuffix("'s").removesuffix("’s")


def _words(text: str) -> set[str]:
    return {_normalized(word) for word in _WORD.findall(text)}


def content_query(query: str) -> str:
    """What a question asks about: the query without its identifiers, question words and stop words.

    "How many help-desk requests came in at Tidewell Software during Q3 2023?" -> "help-desk
    requests came". Empty when nothing is left (the query only names a report).
    """
    dropped = query_identifiers(query)
    kept = [
        word
        for word in _WORD.findall(query)
        if _normalized(word) not in dropped
        and word.lower() not in ENGLISH_STOP_WORDS
        and word.lower() not in QUESTION_WORDS
    ]
    return " ".join(kept)


def _min_max(scores: dict[str, float]) -> dict[str, float]:
    low, high = min(scores.values(), default=0.0), max(scores.values(), default=0.0)
    return {key: (value - low) / (high - low) if high > low else 1.0 for key, value in scores.items()}


def rerank_by_content(
    chunk_ids: list[str], fused: dict[str, float], similarities: dict[str, float], weight: float
) -> list[str]:
    """Order by (1 - weight) x fused score + weight x content similarity, each min-max normalized
    over these chunks; a chunk without a similarity (its row is gone) counts as the least similar."""
    if not chunk_ids:
        return []
    fused_norm = _min_max({cid: fused[cid] for cid in chunk_ids})
    present = {cid: similarities[cid] for cid in chunk_ids if cid in similarities}
    similar_norm = _min_max(present)
    combined = {
        cid: (1 - weight) * fused_norm[cid] + weight * similar_norm.get(cid, 0.0) for cid in chunk_ids
    }
    return sorted(chunk_ids, key=lambda cid: -combined[cid])


def asks_for_share(query: str) -> bool:
    """The question wants a percentage: "what share of", "what percentage of", "proportion of"."""
    return bool(_ASKS_FOR_SHARE.search(query))


def rerank_by_identifiers(
    query: str, chunk_ids: list[str], texts: dict[str, str], titles: dict[str, str] | None = None
) -> list[str]:
    """Stable re-order: chunks carrying more of the query's identifiers first, incoming order within ties.

    Identifiers that appear in some chunk's document title (company, quarter, year) name the report:
    they are counted in the chunk's text and its title, and rank first. The rest (a product, a
    region) are counted in the text and break ties. So a sibling report that mentions the
    product cannot overtake the report the question names. Last, a question asking for a share
    puts chunks that state a percentage first: a chart of units or a KPI in dollars cannot answer it.
    """
    wanted = query_identifiers(query)
    wants_share = asks_for_share(query)
    if not wanted and not wants_share:
        return chunk_ids
    title_words = {cid: _words((titles or {}).get(cid, "")) for cid in chunk_ids}
    naming = wanted & set().union(*title_words.values())
    others = wanted - naming

    def key(chunk_id: str) -> tuple[int, int, bool]:
        words = _words(texts[chunk_id])
        lacks_share = wants_share and not _STATES_SHARE.search(texts[chunk_id])
        return -len(naming & (words | title_words[chunk_id])), -len(others & words), lacks_share

    return sorted(chunk_ids, key=key)


def search(
    text: str | None = None,
    image: str | Path | None = None,
    k: int = 5,
    mode: SearchMode = "hybrid",
    *,
    document_ids: list[str] | None = None,
    kinds: list[str] | None = None,
    metadata: dict[str, Any] | None = None,
    config: RagConfig | None = None,
) -> list[Hit]:
    """Best chunks for a text and/or an image query, each with its location in the source.

    `document_ids` also accepts source paths and file names; `metadata` keeps chunks whose
    metadata contains it (JSON containment, e.g. `{"image_type": "Chart"}`).
    """
    config = config or load_config()
    queries: list[tuple[str, float]] = []
    if text and text.strip():
        queries.append((text, 1.0))
    if image is not None:
        queries.append((describe_query_image(image, config), config.retrieval.image_query_weight))
    filters = Filters(documents=document_ids, kinds=kinds, metadata=metadata)
    return search_queries(queries, k, mode, filters=filters, config=config)


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
