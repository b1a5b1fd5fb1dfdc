"""Stage two of a search: each candidate described by a few general features.

Every feature is on a scale that means the same from one question to the next (a cosine, a share,
a score divided by the best score of its retriever for this question, a 0/1 fact), so one set of
weights (query/ranker.py) can combine them for every question. None is a rule about one set of
documents: the ranker's weights decide how much each counts, fitted on questions with known answers.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from vision_rag_pipeline.core.periods import period_fit, without_periods
from vision_rag_pipeline.core.text import held_terms, query_terms
from vision_rag_pipeline.query.candidates import CandidatePool, query_vectors

FEATURES = (
    "cosine",  # the passage's vector against the question's
    "cosine_gap",  # that cosine minus the best candidate's
    "bm25",  # the passage's BM25 over the best passage's
    "page_cosine",  # its page unit's vector (the mean of the page's chunks) against the question's
    "page_bm25",  # its page's BM25 (the page's whole text) over the best page's
    "document_page",  # its document's best page BM25 over the best page's: how well the document answers
    "terms",  # share of the question's terms the passage holds, each weighed by how few candidates do
    "content_cosine",  # cosine to what the question asks: its terms most candidates share left out
    "period",  # its document's period: the question's (+1), another of that kind (-1), unknown (0)
    "pointed",  # on a page the question points at (a page number, the cover, a figure it names)
    "image",  # an image chunk (Meta-Content or an excerpt of a picture's text)
)


class FeatureTable(NamedTuple):
    """One row per candidate (`ids`), one column per name of FEATURES."""

    ids: list[str]
    matrix: np.ndarray

    def column(self, name: str) -> np.ndarray:
        return self.matrix[:, FEATURES.index(name)]


def describe(pool: CandidatePool, model: str, precision: str) -> FeatureTable:
    """The features of every candidate of `pool` (`model` and `precision`: what embeds a query)."""
    ids = pool.ids
    table = np.zeros((len(ids), len(FEATURES)))
    if not ids:
        return FeatureTable(ids, table)
    chunks = [pool.chunks[cid] for cid in ids]
    pages = [(chunk.document_id, chunk.page) for chunk in chunks]
    weights = np.array([weight for _, weight in pool.queries], dtype=float)
    weights = weights / weights.sum() if weights.sum() > 0 else np.full(len(weights), 1 / len(weights))
    column = {name: table[:, i] for i, name in enumerate(FEATURES)}
    question = pool.queries[0][0]
    matrix = np.stack([pool.embeddings[cid] for cid in ids]) if len(pool.vectors) else None

    if matrix is not None:
        cosine = _weighted(_cosines(matrix, pool.vectors), weights)
        column["cosine"][:] = cosine
        column["cosine_gap"][:] = cosine - cosine.max()
        known = [i for i, key in enumerate(pages) if key in pool.pages]
        if known:
            similarities = np.stack([pool.pages[pages[i]].similarities for i in known])
            column["page_cosine"][known] = _weighted(similarities, weights)
    for scores in _per_query(pool.chunk_bm25, weights):
        column["bm25"][:] += np.array([scores.get(cid, 0.0) for cid in ids])
    page_scores = _per_query(pool.page_bm25, weights)
    for scores in page_scores:
        column["page_bm25"][:] += np.array([scores.get(key, 0.0) for key in pages])
    best_page: dict[str, float] = {}
    for (doc, _), score in (page_scores[0] if page_scores else {}).items():
        best_page[doc] = max(best_page.get(doc, 0.0), score / weights[0])
    column["document_page"][:] = [best_page.get(doc, 0.0) for doc, _ in pages]
    if pool.pointers.periods:
        column["period"][:] = [period_fit(pool.pointers.periods, chunk.landmarks.periods) for chunk in chunks]
    pointed = set(pool.pointed)
    column["pointed"][:] = [cid in pointed for cid in ids]
    column["image"][:] = [chunk.kind == "image" for chunk in chunks]

    # across documents a period the question names is the document's (the `period` feature): a passage
    # is not the answer for repeating "Q1 2025", as every page of a report's header does
    asked_text = without_periods(question) if pool.across_documents and pool.pointers.periods else question
    held = _held(asked_text, texts_of(chunks))
    column["terms"][:] = _term_shares(asked_text, held)
    if matrix is not None and (asked := _content_query(asked_text, held)):
        vector = query_vectors((asked,), model, precision)
        column["content_cosine"][:] = _cosines(matrix, vector)[:, 0]
    return FeatureTable(ids, table)


def texts_of(chunks: Sequence) -> list[str]:
    return [f"{chunk.metadata.get('title') or ''} {chunk.text}" for chunk in chunks]


def _cosines(matrix: np.ndarray, vectors: np.ndarray) -> np.ndarray:
    """Cosine of each row of `matrix` to each of `vectors`: shape (rows, vectors)."""
    matrix = matrix.astype(np.float32)
    vectors = np.atleast_2d(np.asarray(vectors, dtype=np.float32))
    norms = np.linalg.norm(matrix, axis=1)[:, None] * np.linalg.norm(vectors, axis=1)[None, :]
    return np.clip((matrix @ vectors.T) / np.where(norms > 0, norms, 1.0), -1.0, 1.0).astype(np.float64)


def _weighted(cosines: np.ndarray, weights: np.ndarray) -> np.ndarray:
    return cosines[:, : len(weights)] @ weights[: cosines.shape[1]]


def _per_query(scored: list[dict], weights: np.ndarray) -> list[dict]:
    """Each query text's scores over its best one, times the text's weight ({} when it found nothing)."""
    out = []
    for scores, weight in zip(scored, weights, strict=False):
        best = max(scores.values(), default=0.0)
        out.append({key: weight * score / best for key, score in scores.items()} if best > 0 else {})
    return out


def content_query(query: str, candidate_texts: Sequence[str]) -> str:
    """What a question asks about: its terms minus those at least half the candidates share.

    The excerpts of one report share its title, caption and period, so the whole query scores
    them alike; the terms that tell them apart ("help-desk requests") separate them. Empty when
    nothing is left.
    """
    return _content_query(query, _held(query, candidate_texts))


def _held(query: str, texts: Sequence[str]) -> list[frozenset[str]]:
    """Which of the query's terms each text holds."""
    wanted = frozenset(query_terms(query))
    return [held_terms(text, wanted) for text in texts]


def _content_query(query: str, held: Sequence[frozenset[str]]) -> str:
    return " ".join(
        term for term in query_terms(query) if 2 * sum(term in w for w in held) < max(len(held), 1)
    )


def term_shares(query: str, texts: Sequence[str]) -> np.ndarray:
    """The weighted share of the query's terms each text holds; a term weighs by how few texts hold
    it (inverse document frequency over these candidates), and a term none holds counts for nothing,
    so a stray word ("Tell me ...") changes no order."""
    return _term_shares(query, _held(query, texts))


def _term_shares(query: str, held: Sequence[frozenset[str]]) -> np.ndarray:
    counts = {term: sum(term in have for have in held) for term in query_terms(query)}
    weight = {term: math.log(1 + len(held) / n) for term, n in counts.items() if n}
    total = sum(weight.values())
    if not total:
        return np.zeros(len(held))
    return np.array([sum(w for term, w in weight.items() if term in have) / total for have in held])
