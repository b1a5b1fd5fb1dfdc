"""Vectors of page units: the mean direction of the chunks on the page.

MiniLM reads 256 tokens, a page often holds a thousand, so a page's own embedding would see only its
top. The normalized mean of its chunks' vectors sees all of it and costs no model call; on the dev
set it also ranked pages better than embedding their text (BENCHMARKS.md, "Retrieval quality").
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence

import numpy as np

from vision_rag_pipeline.chunks.model import Chunk, embedding_text


def embed_with_page_units(
    chunks: Sequence[Chunk], encode: Callable[[list[str]], tuple[np.ndarray, int]]
) -> tuple[np.ndarray, int]:
    """One unit vector per chunk, in order, and how many texts `encode` computed: chunks are encoded
    (chunks/model.py `embedding_text`), page units averaged from the chunks of their page (encoded themselves only where their page has
    no other chunk)."""
    on_page: dict[tuple[str, int | None], list[int]] = defaultdict(list)  # a web page has no number
    for index, chunk in enumerate(chunks):
        if chunk.kind != "page":
            on_page[(chunk.document_id, chunk.page)].append(index)
    encoded = [
        index
        for index, chunk in enumerate(chunks)
        if chunk.kind != "page" or not on_page.get((chunk.document_id, chunk.page))
    ]
    vectors, computed = encode(
        [
            embedding_text(c.kind, c.text, str(c.metadata.get("title") or ""))
            for c in (chunks[i] for i in encoded)
        ]
    )
    if not len(chunks):
        return vectors, computed
    out = np.zeros((len(chunks), vectors.shape[1]), dtype=np.float32)
    out[encoded] = vectors
    for index, chunk in enumerate(chunks):
        members = on_page.get((chunk.document_id, chunk.page)) if chunk.kind == "page" else None
        if members:
            mean = out[members].mean(axis=0)
            out[index] = mean / max(float(np.linalg.norm(mean)), 1e-12)
    return out, computed
