"""Hybrid search over the materialized indexes, as declared stages:

1. candidates (query/candidates.py): documents by their headers, pages by their page units,
   passages by BM25 and the HNSW index, the pages and pictures the question points at; one
   Postgres round trip, every path under the search's filters;
2. features (query/features.py): each candidate described by a few general signals;
3. score (query/ranker.py): a weighted sum of those, with weights fitted on questions with known
   answers and checked out of fold;
4. collapse: one hit per thing, a picture however many chunks describe it (or one per page, with
   `unit="page"`);
5. cut: the best k.

The index handles and the embedding model are opened once per process.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
from pydantic import BaseModel, Field

from vision_rag_pipeline.chunks.model import Chunk
from vision_rag_pipeline.core.config import RagConfig, ResultUnit, SearchMode, config_in_effect
from vision_rag_pipeline.documents.model import BBox
from vision_rag_pipeline.indexes.pgvector_store import CONTENT_KINDS
from vision_rag_pipeline.query.candidates import (
    CandidatePool,
    gather,
    indexed_embedding,
    same_picture,
    vector_store,
)
from vision_rag_pipeline.query.features import FeatureTable, describe
from vision_rag_pipeline.query.image_query import QueryImage, describe_query_image
from vision_rag_pipeline.query.ranker import Ranker, load_ranker

SEARCH_MODES = ("hybrid", "vector", "lexical")
RESULT_UNITS = ("chunk", "page")
CHUNK_KINDS = CONTENT_KINDS
IMAGE_QUERY_WEIGHT = 1.0  # the image's text beside the question's, when both are given
PASSAGES_PER_PAGE = 3  # a page hit's best passages


class Hit(BaseModel):
    """A thing found, where it is in its source: a chunk (kind text, table or image), or a page
    (kind "page": `unit="page"`, or a page a question points at that no chunk is cited on)."""

    chunk_id: str
    document: str  # the source file's path as given to `ingest`
    kind: str
    text: str
    score: float  # the logistic of the ranker's score, 0 to 1; hits come best first
    page: int | None = None
    bbox: BBox | None = None
    char_span: tuple[int, int] | None = None
    image: str | None = None
    passages: list[Hit] = Field(default_factory=list)  # a page hit's best passages, best first


class Filters(BaseModel):
    """Restrict a search: documents (id, source path or file name), chunk kinds, metadata containment.
    Every hit satisfies them, whichever retriever found it."""

    documents: list[str] | None = None
    kinds: list[str] | None = None
    metadata: dict[str, Any] | None = None


class Scored(NamedTuple):
    """A search's candidates with their features and scores, before collapse and cut: what
    `bench/fit_ranker.py` fits on, and what `ranked` turns into hits."""

    pool: CandidatePool
    features: FeatureTable
    scores: np.ndarray  # one logit per candidate, in `features.ids` order


def search(
    text: str | None = None,
    image: str | Path | None = None,
    k: int | None = None,
    mode: SearchMode | None = None,
    *,
    unit: ResultUnit | None = None,
    document_ids: list[str] | None = None,
    kinds: list[str] | None = None,
    metadata: dict[str, Any] | None = None,
    config: RagConfig | None = None,
) -> list[Hit]:
    """The best k things for a text and/or an image query, each with its location in the source.

    `document_ids` also accepts source paths and file names; `metadata` keeps chunks whose
    metadata contains it (JSON containment, e.g. `{"image_type": "Chart"}`). k, mode and unit
    default to the config's `retrieval` settings.
    """
    config = config or config_in_effect().config
    queries = [(text, 1.0)] if text else []
    picture = describe_query_image(image, config) if image is not None else None
    filters = Filters(documents=document_ids, kinds=kinds, metadata=metadata)
    return search_queries(queries, k, mode, image=picture, filters=filters, config=config, unit=unit)


def warm_up(config: RagConfig | None = None) -> None:
    """Load what every search needs by running one: the embedding model at the index's precision and
    its first pass (which builds its kernels), the store, the lexical index, the ranker. A server
    calls it before it answers, so its first caller waits for their own search only."""
    search("warm up", k=1, config=config)


def search_queries(
    queries: Sequence[tuple[str, float]],
    k: int | None = None,
    mode: SearchMode | None = None,
    *,
    image: QueryImage | None = None,
    filters: Filters | None = None,
    config: RagConfig | None = None,
    unit: ResultUnit | None = None,
) -> list[Hit]:
    """The best k things for several weighted query texts at once (the question first, then
    sub-questions) and an image."""
    config = config or config_in_effect().config
    retrieval = config.retrieval
    k = retrieval.k if k is None else k
    unit = unit or retrieval.unit
    if k <= 0:
        raise ValueError(f"k must be positive, not {k}")
    if unit not in RESULT_UNITS:
        raise ValueError(f"unit must be chunk or page, not {unit!r}")
    scored = score_candidates(queries, mode, image=image, filters=filters, config=config)
    return ranked(scored, k, unit) if scored else []


def score_candidates(
    queries: Sequence[tuple[str, float]],
    mode: SearchMode | None = None,
    *,
    image: QueryImage | None = None,
    filters: Filters | None = None,
    config: RagConfig | None = None,
    ranker: Ranker | None = None,
) -> Scored | None:
    """Stages 1-3: the candidates, their features and their scores (None when a document filter
    names no indexed document)."""
    config = config or config_in_effect().config
    retrieval = config.retrieval
    mode = mode or retrieval.mode
    if mode not in SEARCH_MODES:
        raise ValueError(f"mode must be hybrid, vector or lexical, not {mode!r}")
    texts = [(text, weight) for text, weight in queries if text and text.strip()]
    if image is not None and image.text.strip():
        texts.append((image.text, IMAGE_QUERY_WEIGHT))
    if not texts:
        raise ValueError("give a text or an image to search for")
    filters = filters or Filters()
    if filters.kinds is not None and (unknown := set(filters.kinds) - set(CHUNK_KINDS)):
        raise ValueError(f"unknown chunk kind(s) {sorted(unknown)}; use text, table or image")
    store = vector_store(config.embedding.model)
    document_ids = store.resolve_documents(filters.documents) if filters.documents is not None else None
    if document_ids == []:
        return None
    embedding = indexed_embedding(store, config.embedding) if mode != "lexical" else config.embedding
    pool = gather(
        texts,
        mode,
        image_hash=image.perceptual_hash if image is not None else None,
        document_ids=document_ids,
        kinds=filters.kinds,
        metadata=filters.metadata,
        retrieval=retrieval,
        embedding=embedding,
    )
    features = describe(pool, embedding.model, embedding.precision)
    ranker = ranker or load_ranker(retrieval.ranker)
    return Scored(pool=pool, features=features, scores=ranker.score(features.matrix))


def ranked(scored: Scored, k: int, unit: ResultUnit = "chunk") -> list[Hit]:
    """Stages 4-5: one hit per thing (a picture, or with `unit="page"` a page), best first; the
    picture the query image is a copy of first of all; then the best k."""
    pool, ids = scored.pool, scored.features.ids
    order = sorted(range(len(ids)), key=lambda i: -scored.scores[i])
    probability = {ids[i]: _probability(float(scored.scores[i])) for i in order}
    copied = same_picture(pool.near)
    for cid in copied:
        probability[cid] = 1.0  # the indexed original of the query picture
    ordered = [cid for cid in copied if cid in probability] + [ids[i] for i in order if ids[i] not in copied]
    groups: dict[tuple, list[str]] = {}
    for cid in ordered:
        groups.setdefault(_thing(pool.chunks[cid], unit), []).append(cid)
    return [
        _page_hit(pool, key, members, probability)
        if key[0] == "page"
        else _hit(pool.chunks[members[0]], probability[members[0]])
        for key, members in list(groups.items())[:k]
    ]


def _thing(chunk: Chunk, unit: ResultUnit) -> tuple:
    """What a hit stands for: its page (`unit="page"`, where the source has pages: a web archive
    has none, only chunks and pictures), its picture (every chunk of one image: the Meta-Content
    chunk and the excerpts of its text), or itself."""
    if unit == "page" and chunk.page is not None:
        return ("page", chunk.document_id, chunk.page)
    if chunk.kind == "image" and chunk.image:
        return ("picture", chunk.document_id, chunk.image)
    return ("chunk", chunk.chunk_id)


def _page_hit(pool: CandidatePool, key: tuple, members: list[str], probability: dict[str, float]) -> Hit:
    _, document_id, page = key
    passages = [
        _hit(pool.chunks[cid], probability[cid]) for cid in members if pool.chunks[cid].kind != "page"
    ]
    first = pool.chunks[members[0]]
    unit = pool.pages.get((document_id, page))  # a page the index holds no unit for is its passages
    best = passages[:PASSAGES_PER_PAGE]
    return Hit(
        chunk_id=unit.chunk_id if unit else first.chunk_id,
        document=first.metadata.get("source", document_id),
        kind="page",
        text=unit.text if unit else "\n\n".join(hit.text for hit in best),
        score=probability[members[0]],
        page=page,
        passages=best,
    )


def _probability(logit: float) -> float:
    return round(1 / (1 + math.exp(-max(min(logit, 50.0), -50.0))), 6)


def _hit(chunk: Chunk, score: float) -> Hit:
    return Hit(
        chunk_id=chunk.chunk_id,
        document=chunk.metadata.get("source", chunk.document_id),
        kind=chunk.kind,
        text=chunk.text,
        score=score,
        page=chunk.page,
        bbox=chunk.bbox,
        char_span=chunk.char_span,
        image=chunk.image,
    )
