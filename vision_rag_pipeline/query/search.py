"""Hybrid search over the materialized indexes: pgvector kNN + BM25, fused by rank or by score.

Reads only what the assets wrote; the embedding model and index handles are opened once per
process so a warm search is the query embeddings, a BM25 lookup per query text and one Postgres
round trip for them all (kNN, the candidates' rows and their embeddings). A text and
an image (or several sub-questions) are separate rankings fused together, so a chunk found by
several of them is one hit with the combined score. Indexed pictures whose perceptual hash is
within a few bits of the query image's are one more ranking, and the one picture the query is
clearly a copy of (a photo, re-save or resize of it) comes first.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal, NamedTuple

import numpy as np
from pydantic import BaseModel

from vision_rag_pipeline.chunks.model import Chunk
from vision_rag_pipeline.core.config import EmbeddingConfig, RagConfig, RetrievalConfig, config_in_effect
from vision_rag_pipeline.core.periods import containing, finest_period, period_fit, spelled, without_periods
from vision_rag_pipeline.core.text import query_terms, terms
from vision_rag_pipeline.documents.model import BBox
from vision_rag_pipeline.embeddings.encoder import (
    embedding_dimension,
    encode,
    resolve_precision,
    variant_precision,
)
from vision_rag_pipeline.images.fingerprint import HASH_BITS
from vision_rag_pipeline.indexes.lexical import LandmarkFilter, LexicalHit
from vision_rag_pipeline.indexes.lexical_backend import open_lexical_index
from vision_rag_pipeline.indexes.pgvector_store import CONTENT_KINDS, PgVectorStore, Pointers
from vision_rag_pipeline.query.analysis import QuestionPointers, analyze
from vision_rag_pipeline.query.image_query import QueryImage, describe_query_image

SearchMode = Literal["hybrid", "vector", "lexical"]
SEARCH_MODES = ("hybrid", "vector", "lexical")
CHUNK_KINDS = CONTENT_KINDS


class Hit(BaseModel):
    """A chunk found, where it is in its source; kind "page" (the whole page) only where a question
    points at a page that no chunk is cited on."""

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


@lru_cache(maxsize=256)
def query_vectors(texts: tuple[str, ...], model: str, precision: str) -> np.ndarray:
    """The query texts' embeddings (read-only), kept: a search across documents searches some of its
    documents again with the same texts (`pages_in_document_order`)."""
    vectors = encode(list(texts), model, precision=precision)
    vectors.flags.writeable = False
    return vectors


@lru_cache(maxsize=4)
def vector_store(model: str) -> PgVectorStore:
    """Opening the store creates the schema and checks the embedding dimension, once per process."""
    return PgVectorStore(embedding_dimension(model))


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


def search_queries(
    queries: Sequence[tuple[str, float]],
    k: int,
    mode: SearchMode = "hybrid",
    *,
    image: QueryImage | None = None,
    filters: Filters | None = None,
    config: RagConfig | None = None,
) -> list[Hit]:
    """Best chunks for several weighted query texts at once (the question first, then sub-questions)
    and an image."""
    if mode not in SEARCH_MODES:
        raise ValueError(f"mode must be hybrid, vector or lexical, not {mode!r}")
    if k <= 0:
        raise ValueError(f"k must be positive, not {k}")
    config = config or config_in_effect().config
    if not any(text and text.strip() for text, _ in queries) and not (image and image.text.strip()):
        raise ValueError("give a text or an image to search for")
    filters = filters or Filters()
    if filters.kinds is not None and (unknown := set(filters.kinds) - set(CHUNK_KINDS)):
        raise ValueError(f"unknown chunk kind(s) {sorted(unknown)}; use text, table or image")
    store = vector_store(config.embedding.model)
    document_ids = store.resolve_documents(filters.documents) if filters.documents is not None else None
    if document_ids == []:
        return []
    return _search(queries, k, mode, image, filters, config, document_ids)


def _search(
    queries: Sequence[tuple[str, float]],
    k: int,
    mode: SearchMode,
    image: QueryImage | None,
    filters: Filters,
    config: RagConfig,
    document_ids: list[str] | None,
    near: dict[str, tuple[int, str]] | None = None,
) -> list[Hit]:
    """`search_queries` within `document_ids` (resolved; None: every document); `near`: the query
    picture's near-duplicates among them when already found (`PgVectorStore.near_duplicates`)."""
    question_texts = list(queries)
    pointers = analyze(queries[0][0]) if queries and queries[0][0] else QuestionPointers()
    if image is not None:
        queries = [*queries, (image.text, config.retrieval.image_query_weight)]
    queries = [(text, weight) for text, weight in queries if text and text.strip()]
    retrieval = config.retrieval
    store = vector_store(config.embedding.model)
    pool = max(k, retrieval.candidates)
    kinds = filters.kinds or list(CHUNK_KINDS)
    across_documents = document_ids is None or len(document_ids) > 1
    lexical = open_lexical_index()
    lexical_queries = queries if mode in ("hybrid", "lexical") else []
    if lexical_queries and pointers.periods:
        # the question's periods also as documents write them: "FY2021" finds "2021", "3Q24" "Q3 2024"
        question, weight = lexical_queries[0]
        written = " ".join(spelled(period) for period in pointers.periods)
        lexical_queries = [(f"{question} {written}", weight), *lexical_queries[1:]]
    # a metadata filter is applied to BM25 hits afterwards, in Postgres, so ask for more of them
    lexical_hits = [
        lexical.search(text, pool * 4 if filters.metadata else pool, document_ids=document_ids, kinds=kinds)
        for text, _ in lexical_queries
    ]
    use_pages = bool(retrieval.page_weight and retrieval.page_units)
    page_hits = [
        lexical.search(text, retrieval.page_units, document_ids=document_ids, kinds=["page"])
        for text, _ in (lexical_queries if use_pages else [])
    ]
    # across documents, the chunks of the documents the question names by name or period
    restricted: list[tuple[list[LexicalHit], float]] = []
    if across_documents and lexical_queries:
        question = lexical_queries[0][0]
        if pointers.names and retrieval.named_weight:
            named = LandmarkFilter(header_words=pointers.names)
            hits = lexical.search(question, pool, document_ids=document_ids, kinds=kinds, landmarks=named)
            restricted.append((hits, retrieval.named_weight))
        if pointers.periods and retrieval.period_weight:
            finest = finest_period(pointers.periods)
            # the reports of that period: of its quarter or half for a month; a year only when asked
            named_periods = [
                p for p in containing(finest).values() if p != finest.split("-")[0] or p == finest
            ]
            period = LandmarkFilter(periods=named_periods)
            hits = lexical.search(question, pool, document_ids=document_ids, kinds=kinds, landmarks=period)
            restricted.append((hits, retrieval.period_weight))
    embedding = indexed_embedding(store, config.embedding) if mode != "lexical" else config.embedding
    vectors = (
        query_vectors(tuple(text for text, _ in queries), embedding.model, embedding.precision)
        if mode in ("hybrid", "vector")
        else []
    )
    if (
        near is None
        and image is not None
        and image.perceptual_hash
        and retrieval.near_duplicate_bits is not None
    ):
        near = store.near_duplicates(
            image.perceptual_hash,
            retrieval.near_duplicate_bits + retrieval.near_duplicate_margin,
            document_ids=document_ids,
            kinds=filters.kinds,
            metadata=filters.metadata,
        )
    near = near or {}
    pointed = (
        Pointers(pointers.page_names, list(pointers.positions), pointers.references)
        if pointers.points_into_document and retrieval.pointer_weight
        else None
    )
    found = store.candidates(
        vectors,
        pool,
        [
            *(hit.chunk_id for hits in lexical_hits for hit in hits),
            *(hit.chunk_id for hits, _ in restricted for hit in hits),
            *near,
        ],
        ef_search=retrieval.ef_search,
        document_ids=document_ids,
        kinds=kinds,
        metadata=filters.metadata,
        page_units=retrieval.page_units if use_pages else 0,
        pages_also=[hit.chunk_id for hits in page_hits for hit in hits[: retrieval.pages_opened]],
        pages_opened=retrieval.pages_opened if use_pages else 0,
        pointers=pointed,
    )
    chunks = {cid: chunk for cid, chunk in found.chunks.items() if chunk.kind != "page"}
    rankings = [
        Ranking(scores, weight * retrieval.vector_weight)
        for (_, weight), scores in zip(queries, found.nearest, strict=False)
    ]
    for (_, weight), hits in zip(lexical_queries, lexical_hits, strict=False):
        kept = [hit for hit in hits if not filters.metadata or hit.chunk_id in found.matching][:pool]
        rankings.append(Ranking({hit.chunk_id: hit.score for hit in kept}, weight * retrieval.lexical_weight))
    for hits, weight in restricted:
        kept = [hit for hit in hits if not filters.metadata or hit.chunk_id in found.matching]
        rankings.append(Ranking({hit.chunk_id: hit.score for hit in kept}, weight))
    if found.pointed:
        pointed_scores = {cid: float(len(found.pointed) - rank) for rank, cid in enumerate(found.pointed)}
        rankings.append(Ranking(pointed_scores, retrieval.pointer_weight))
    if near:
        closeness = {cid: 1 - distance / HASH_BITS for cid, (distance, _) in near.items()}
        rankings.append(Ranking(closeness, retrieval.image_query_weight))
    fused = fuse(rankings, retrieval)
    if use_pages:
        page_rankings = [
            Ranking(scores, weight * retrieval.vector_weight)
            for (_, weight), scores in zip(queries, found.nearest_pages, strict=False)
        ]
        page_rankings += [
            Ranking({hit.chunk_id: hit.score for hit in hits}, weight * retrieval.lexical_weight)
            for (_, weight), hits in zip(lexical_queries, page_hits, strict=False)
        ]
        fused = with_page_scores(fused, fuse(page_rankings, retrieval), found.chunks, chunks, retrieval)
    other_period = (
        {
            cid
            for cid in fused
            if cid in chunks and period_fit(pointers.periods, chunks[cid].landmarks.periods) < 0
        }
        if across_documents and pointers.periods
        else set()
    )
    for cid in other_period:
        fused[cid] *= retrieval.other_period_factor
    ranked = sorted(fused, key=lambda cid: -fused[cid])
    depth = max(k, retrieval.rerank_depth)
    # a lexical entry may outlive its Postgres row briefly
    best = [cid for cid in ranked[: depth * 2] if cid in chunks][:depth]
    head = best[: retrieval.rerank_depth]
    if head:
        texts = {cid: chunks[cid].text for cid in head}
        titles = {cid: str(chunks[cid].metadata.get("title") or "") for cid in head}
        similarities: dict[str, float] = {}
        question = queries[0][0]
        # across documents a period the question names is the document's, judged by its landmarks
        # (the period ranking, other_period_factor) and its title: a passage is not the answer for
        # repeating "Q1 2025" (the report's opening line) where the answer's section does not
        passage_question = without_periods(question) if across_documents and pointers.periods else question
        asked = (
            content_query(passage_question, [f"{titles[cid]} {texts[cid]}" for cid in head])
            if retrieval.content_weight
            else ""
        )
        if asked and mode != "lexical":
            asked_vector = query_vectors((asked,), embedding.model, embedding.precision)[0]
            similarities = cosine_similarities(asked_vector, {cid: found.embeddings[cid] for cid in head})
        # exact matches tell near-identical documents apart (a report series' titles and the words
        # only one quarter's excerpt has); within one document they outvote the content instead
        # (dev set page R@5 0.939 without them there, 0.914 with them)
        matches = match_scores(passage_question, texts, titles, question) if across_documents else {}
        head = rerank(head, fused, matches, similarities, retrieval, other_period)
    if head and retrieval.low_confidence_ocr_last:
        head = sorted(head, key=lambda cid: _unsure_ocr(chunks[cid]))  # stable: order kept otherwise
    best = head + best[len(head) :]
    if not across_documents and found.pointed:
        # within one document, the best chunk of each page the question points at (a page number, a
        # place, a caption) comes first; the rest keep their order
        first = pointed_first(best, [cid for cid in found.pointed if cid in found.chunks], found.chunks)
        best = first + [cid for cid in best if cid not in first]
    same = [cid for cid in same_picture(near, retrieval) if cid in chunks]
    best = same + [cid for cid in best if cid not in same]
    hits = [_hit(found.chunks[cid], fused.get(cid, 0.0)) for cid in best[:k]]
    if across_documents and retrieval.pages_within_documents:
        slots = [found.chunks[cid].document_id for cid in best[:k]]
        places = Counter(slots[1:])
        # a document with one place after the first hit has no order to give
        ordered = [doc for doc in dict.fromkeys(slots[1 : retrieval.rerank_depth + 1]) if places[doc] > 1]
        page_order = {
            document: [
                hit.page
                for hit in _search(
                    question_texts,
                    max(retrieval.rerank_depth, k),
                    mode,
                    image,
                    filters,
                    config,
                    [document],
                    # the picture's near-duplicates in this document: those found across documents
                    {
                        cid: v
                        for cid, v in near.items()
                        if cid in chunks and chunks[cid].document_id == document
                    },
                )
            ]
            for document in ordered
        }
        hits = pages_in_document_order(hits, slots, page_order)
    return hits


def pages_in_document_order(
    hits: list[Hit], slots: list[str], page_order: dict[str, list[int | None]]
) -> list[Hit]:
    """The hits of a search across documents with each document's hits after the first (`slots`: each
    hit's document id) reordered among its places by their pages' order in that document's own search
    (`page_order`), hits on pages it did not rank last. A place keeps its score: the scores read as
    they did, place by place.

    Across documents, exact matches of the question's words tell near-identical documents apart, and
    pick the first hit; among one document's pages they outvote what the question asks (see the
    rerank in `search_queries`), so that document's own search orders the rest. Which chunks are hit
    stays the search's across documents: a report series' paragraph only exact matches find is kept.
    """
    queued = {}
    for document, pages in page_order.items():
        rank = {page: index for index, page in enumerate(dict.fromkeys(pages))}
        mine = [hit for hit, place in zip(hits[1:], slots[1:], strict=True) if place == document]
        queued[document] = sorted(mine, key=lambda hit: rank.get(hit.page, len(rank)))
    return hits[:1] + [
        queued[place].pop(0).model_copy(update={"score": hit.score}) if place in queued else hit
        for hit, place in zip(hits[1:], slots[1:], strict=True)
    ]


POINTED_PAGES_FIRST = 3  # "pages 3 to 10" must not fill the first hits with one page each


def pointed_first(ranked: list[str], pointed: list[str], rows: dict[str, Chunk]) -> list[str]:
    """The best ranked chunk of each pointed page, at most POINTED_PAGES_FIRST of them, in rank order;
    a pointed page none of whose chunks ranked gets its chunk most similar to the question, and one
    no chunk is cited on (a cover of a few words, read with the next page) its page unit."""
    first: dict[tuple[str, int | None], str] = {}
    for cid in [*[c for c in ranked if c in set(pointed)], *[c for c in pointed if rows[c].kind != "page"]]:
        first.setdefault((rows[cid].document_id, rows[cid].page), cid)
    for cid in pointed:
        if rows[cid].kind == "page":
            first.setdefault((rows[cid].document_id, rows[cid].page), cid)
    return list(first.values())[:POINTED_PAGES_FIRST]


def with_page_scores(
    fused: dict[str, float],
    page_fused: dict[str, float],
    rows: dict[str, Chunk],
    chunks: dict[str, Chunk],
    retrieval: RetrievalConfig,
) -> dict[str, float]:
    """Every chunk's score plus `page_weight` x its page's fused score (pages ranked by their page
    units: `page_fused`, by page unit id; `rows` holds the page units' rows)."""
    by_page = {
        (rows[unit].document_id, rows[unit].page): score for unit, score in page_fused.items() if unit in rows
    }
    scored = dict(fused)
    for cid, chunk in chunks.items():
        page_score = by_page.get((chunk.document_id, chunk.page), 0.0)
        if page_score or cid in scored:
            scored[cid] = scored.get(cid, 0.0) + retrieval.page_weight * page_score
    return scored


def cosine_similarities(vector: np.ndarray, embeddings: dict[str, np.ndarray]) -> dict[str, float]:
    """{chunk id: cosine similarity} of stored embeddings to `vector`, computed here from the rows
    the search read anyway rather than asked of Postgres again (float32 sums, as pgvector's)."""
    if not embeddings:
        return {}
    matrix = np.stack(list(embeddings.values())).astype(np.float32)
    vector = np.asarray(vector, dtype=np.float32)
    dots = (matrix @ vector).astype(np.float64)
    squares = np.einsum("ij,ij->i", matrix, matrix).astype(np.float64) * float(vector @ vector)
    return dict(zip(embeddings, np.clip(dots / np.sqrt(squares), -1.0, 1.0).tolist(), strict=True))


def same_picture(near: dict[str, tuple[int, str]], retrieval: RetrievalConfig) -> list[str]:
    """The chunks of the one indexed picture the query image is a copy of, or none when unsure.

    A copy is within `near_duplicate_bits` of its original, but so can be every chart a report series
    draws from one template (2-10 bits apart on the generated set). So the closest picture counts as
    the same only when every other picture is at least `near_duplicate_margin` bits further away: at
    8 and 6, no query of the generated or the real-picture set put a wrong picture first.
    """
    if not near:
        return []
    closest, picture = min(near.values())
    runner_up = min((d for d, other in near.values() if other != picture), default=HASH_BITS + 1)
    if closest > retrieval.near_duplicate_bits or runner_up - closest < retrieval.near_duplicate_margin:
        return []
    return [cid for cid, (_, other) in near.items() if other == picture]


# measured on the generated set (image R@5 0.935 with title words counted as text, 0.957 at 2)
# and neutral on the real one, whose questions are asked within one document (one title)
TITLE_WEIGHT = 2.0


def content_query(query: str, candidate_texts: Sequence[str]) -> str:
    """What a question asks about: its terms minus those at least half the candidates share.

    The excerpts of one report share its title, caption and period, so the whole query scores
    them alike; the terms that tell them apart ("help-desk requests") separate them. Empty when
    nothing is left.
    """
    words = [set(terms(text)) for text in candidate_texts]
    return " ".join(
        term for term in query_terms(query) if 2 * sum(term in w for w in words) < max(len(words), 1)
    )


def match_scores(
    query: str, texts: dict[str, str], titles: dict[str, str], title_query: str | None = None
) -> dict[str, float]:
    """How exactly each candidate contains the query's words and numbers, 0..1 + TITLE_WEIGHT; the
    title share counts the words of `title_query` (the query's by default).

    The weighted share of the query terms found in any candidate that this one contains (title and
    text alike), plus TITLE_WEIGHT x the weighted share of those found in any candidate's document
    title that its own title has: a question naming a document's title words is about that document
    (field weights, as BM25F gives them). A term weighs by how few candidates hold it (inverse
    document frequency over the candidates): the words every excerpt of one period repeats ("quarter",
    "2024") tell them apart less than the one word only the answer has. A term no candidate has counts
    for nothing, so a stray word ("Tell me ...") changes no order; a month is a month, not a quarter.
    """
    words = {cid: set(terms(f"{titles.get(cid, '')} {text}")) for cid, text in texts.items()}
    title_words = {cid: set(terms(titles.get(cid, ""))) for cid in texts}

    def weights(fields: dict[str, set[str]], wanted: list[str]) -> dict[str, float]:
        held = {term: sum(term in have for have in fields.values()) for term in wanted}
        return {term: math.log(1 + len(fields) / n) for term, n in held.items() if n}

    def share(found: set[str], weight: dict[str, float]) -> float:
        total = sum(weight.values())
        return sum(w for term, w in weight.items() if term in found) / total if total else 0.0

    in_texts = weights(words, query_terms(query))
    in_titles = weights(title_words, query_terms(title_query if title_query is not None else query))
    return {
        cid: share(words[cid], in_texts) + TITLE_WEIGHT * share(title_words[cid], in_titles) for cid in texts
    }


def _min_max(scores: dict[str, float]) -> dict[str, float]:
    low, high = min(scores.values(), default=0.0), max(scores.values(), default=0.0)
    return {key: (value - low) / (high - low) if high > low else 0.0 for key, value in scores.items()}


def rerank(
    chunk_ids: list[str],
    fused: dict[str, float],
    matches: dict[str, float],
    similarities: dict[str, float],
    retrieval: RetrievalConfig,
    other_period: set[str] | frozenset[str] = frozenset(),
) -> list[str]:
    """Order by (1 - content_weight) x fused + content_weight x content similarity + match_weight x
    exact matches, each min-max normalized over these chunks; a chunk without a similarity (its
    row is gone) counts as the least similar. Chunks of a report of another period than the one
    asked keep `other_period_factor` of that score too: the passage a series' other quarters
    share word for word is as similar there. Ties keep the incoming order."""
    if not chunk_ids:
        return []
    fused_norm = _min_max({cid: fused[cid] for cid in chunk_ids})
    similar_norm = _min_max({cid: similarities[cid] for cid in chunk_ids if cid in similarities})
    match_norm = _min_max({cid: matches.get(cid, 0.0) for cid in chunk_ids})
    content_weight = retrieval.content_weight if similarities else 0.0
    combined = {
        cid: (1 - content_weight) * fused_norm[cid]
        + content_weight * similar_norm.get(cid, 0.0)
        + retrieval.match_weight * match_norm[cid]
        for cid in chunk_ids
    }
    for cid in other_period & combined.keys():
        combined[cid] *= retrieval.other_period_factor
    return sorted(chunk_ids, key=lambda cid: -combined[cid])


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
    config = config or config_in_effect().config
    queries = [(text, 1.0)] if text else []
    picture = describe_query_image(image, config) if image is not None else None
    filters = Filters(documents=document_ids, kinds=kinds, metadata=metadata)
    return search_queries(queries, k, mode, image=picture, filters=filters, config=config)


def _unsure_ocr(chunk: Chunk) -> bool:
    """An image chunk whose text is OCR Tesseract was unsure of (Low: mean word confidence under
    60), with no vision model's reading: texture read as letters more often than not."""
    return (
        chunk.kind == "image"
        and chunk.metadata.get("ocr_confidence") == "Low"
        and chunk.metadata.get("fusion", "rule") == "rule"
    )


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
