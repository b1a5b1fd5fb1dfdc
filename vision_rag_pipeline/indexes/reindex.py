"""Rebuild both indexes from the stored chunks without downtime: build aside, then swap.

The chunk rows in Postgres (text, location and vector) are the source of truth; the lexical index is
rebuilt from them (tantivy: new directory + pointer swap; Elasticsearch: new index + alias move) and
the pgvector tables are copied into fresh tables with a fresh HNSW index and renamed into place.
Vectors are copied, not recomputed, unless they are not what the configured model would give: its
dimension no longer matches the table, or a document's vectors were embedded by another model or
precision (`vector_models` records the variant of each document), or a re-embedding is asked for;
even then the embedding cache answers for texts the model variant already embedded.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

from pydantic import BaseModel

from vision_rag_pipeline.core.config import EmbeddingConfig
from vision_rag_pipeline.core.postgres import connect
from vision_rag_pipeline.indexes.lexical import LexicalDoc, LexicalIndex
from vision_rag_pipeline.indexes.pgvector_store import (
    RebuildReport,
    rebuild_tables,
    stored_chunks,
    stored_models,
)


class ReindexReport(BaseModel):
    vector: RebuildReport
    lexical_docs: int
    seconds: float
    reembed_reason: str | None = None  # why the vectors were computed again, when they were


def vector_dimension(url: str | None = None) -> int | None:
    """The dimension of the stored chunk vectors, or None before the first document is indexed."""
    with connect(url) as conn:
        row = conn.execute(
            "SELECT atttypmod FROM pg_attribute"
            " WHERE attrelid = to_regclass('chunks') AND attname = 'embedding'"
        ).fetchone()
    return row[0] if row else None


def rebuild_lexical(lexical: LexicalIndex, url: str | None = None) -> int:
    """Replace the lexical index with one built from the stored chunks; returns how many it holds."""
    count = 0

    def docs() -> Iterator[LexicalDoc]:
        nonlocal count
        for chunk in stored_chunks(url):
            count += 1
            yield LexicalDoc.of(chunk)

    lexical.rebuild(docs())
    return count


def reindex(
    lexical: LexicalIndex, embedding: EmbeddingConfig, url: str | None = None, *, reembed: bool = False
) -> ReindexReport:
    """Rebuild the pgvector tables and the lexical index aside and swap them in.

    Re-embeds when asked, or when the stored vectors are not the configured model variant's
    (`reembed_reason`).
    """
    from vision_rag_pipeline.embeddings.cache import encode_cached
    from vision_rag_pipeline.embeddings.encoder import embedding_dimension, encode, model_variant

    started = time.perf_counter()
    model_dim = embedding_dimension(embedding.model)
    variant = model_variant(embedding.model, embedding.precision)
    reason = "asked" if reembed else stale_vectors_reason(url, model_dim, variant)
    if reason:

        def embed(texts: list[str]):
            return encode_cached(
                texts,
                embedding.model,
                lambda missing: encode(missing, embedding.model, embedding.batch_size, embedding.precision),
                url,
                embedding.precision,
            )[0]

        vector = rebuild_tables(url, embed=embed, dim=model_dim, model=variant)
    else:
        vector = rebuild_tables(url)
    lexical_docs = rebuild_lexical(lexical, url)
    return ReindexReport(
        vector=vector,
        lexical_docs=lexical_docs,
        seconds=round(time.perf_counter() - started, 3),
        reembed_reason=reason,
    )


def stale_vectors_reason(url: str | None, model_dim: int, variant: str) -> str | None:
    """Why the stored vectors are not those `variant` (of dimension `model_dim`) gives, or None."""
    stored_dim = vector_dimension(url)
    if stored_dim is not None and stored_dim != model_dim:
        return f"the index holds {stored_dim}-dimensional vectors, {variant} gives {model_dim}"
    others = {model: n for model, n in stored_models(url).items() if model != variant}
    if not others:
        return None
    named = ", ".join(
        f"{n} by {model or 'an unrecorded model'}" for model, n in sorted(others.items(), key=str)
    )
    return f"documents embedded by another model variant than {variant}: {named}"
