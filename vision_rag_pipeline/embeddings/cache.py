"""Embeddings remembered by (model variant, sha256 of the text), so re-running chunk_embeddings after a
change upstream embeds only the chunks whose text changed.

Vectors are stored without a fixed dimension (`vector`), so several models can share the table. The
`model` column holds `encoder.model_variant`: a bfloat16 run never reuses float32 vectors, and rows
written before precisions existed (float32) keep serving float32 runs.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable

import numpy as np
from pgvector import Vector

from vision_rag_pipeline.core.postgres import connect, ensure_schema
from vision_rag_pipeline.embeddings.encoder import model_variant

_SCHEMA = """
CREATE TABLE IF NOT EXISTS embedding_cache (
    model text NOT NULL,
    text_sha256 text NOT NULL,
    vector vector NOT NULL,
    PRIMARY KEY (model, text_sha256)
)
"""


def text_sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def encode_cached(
    texts: list[str],
    model: str,
    encode: Callable[[list[str]], np.ndarray],
    url: str | None = None,
    precision: str = "auto",
) -> tuple[np.ndarray, int]:
    """One vector per text (rows in order) and how many had to be computed by `encode`.

    `encode` must run `model` at `precision`. Only the texts missing from the cache for that
    variant are encoded (each distinct text once); the new vectors are stored for the next run.
    """
    if not texts:
        return encode([]), 0
    variant = model_variant(model, precision)
    ensure_schema(_SCHEMA, url)
    digests = [text_sha256(text) for text in texts]
    with connect(url) as conn:
        rows = conn.execute(
            "SELECT text_sha256, vector FROM embedding_cache WHERE model = %s AND text_sha256 = ANY(%s)",
            (variant, sorted(set(digests))),
        ).fetchall()
    known = {digest: np.asarray(vector.to_numpy(), dtype=np.float32) for digest, vector in rows}
    missing = {digest: text for digest, text in zip(digests, texts, strict=True) if digest not in known}
    if missing:
        computed = encode(list(missing.values()))
        fresh = dict(zip(missing, computed, strict=True))
        with connect(url) as conn, conn.cursor() as cur:
            cur.executemany(
                "INSERT INTO embedding_cache (model, text_sha256, vector) VALUES (%s, %s, %s)"
                " ON CONFLICT DO NOTHING",
                [(variant, digest, Vector(vector)) for digest, vector in fresh.items()],
            )
        known.update({digest: np.asarray(vector, dtype=np.float32) for digest, vector in fresh.items()})
    return np.stack([known[digest] for digest in digests]), len(missing)
