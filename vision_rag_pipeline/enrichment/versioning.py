"""Versions of the settings that shape each derived asset, so a config change re-runs only what it touched.

Each version is a short hash of exactly the settings that change an asset's output: the Dagster
`code_version` of the asset. When it differs from the one a partition was last materialized with,
that partition is stale from this asset on, and nothing upstream of it needs to run again.
Settings that change only speed (OCR workers, batch sizes) or bookkeeping (cache expiry) are left out.
"""

from __future__ import annotations

import hashlib
import json

from vision_rag_pipeline.chunks.build import CHUNKING_REVISION
from vision_rag_pipeline.config import RagConfig
from vision_rag_pipeline.embeddings.encoder import resolve_precision
from vision_rag_pipeline.enrichment.classifier import CLASSIFIER_REVISION
from vision_rag_pipeline.enrichment.ocr import OCR_REVISION

VERSION_LENGTH = 12


def _short_hash(settings: dict) -> str:
    canonical = json.dumps(settings, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()[:VERSION_LENGTH]


def classifier_version(config: RagConfig) -> str:
    """What decides IGNORE vs VISION: the classifier switch and threshold, and the classifier's revision."""
    return _short_hash(
        {
            "classifier": config.media_enrichment.features.classifier.model_dump(mode="json"),
            "revision": CLASSIFIER_REVISION,
        }
    )


def enrichment_version(config: RagConfig, engine: str) -> str:
    """What an image's Meta-Content depends on: the vision model call, OCR, fusion and who computes it,
    plus `config_version`, the user's explicit "re-enrich everything" switch (it is also in the cache key).

    `engine` is "offline" or the vision endpoint (see `enrichment.cache.cache_key`): switching from
    OCR-only to a real vision model must re-enrich even when no setting changed.
    """
    enrichment = config.media_enrichment
    return _short_hash(
        {
            "mllm": enrichment.features.mllm.model_dump(mode="json"),
            "ocr_languages": enrichment.ocr.languages,  # order matters to Tesseract
            "ocr_revision": OCR_REVISION,
            "fusion": enrichment.fusion.model_dump(mode="json"),
            "engine": engine,
            "config_version": config.config_version,
        }
    )


def chunking_version(config: RagConfig) -> str:
    """How a document becomes chunks: loader and splitter settings, and the chunk builder's revision."""
    return _short_hash(
        {
            "loader": config.loader.model_dump(mode="json"),
            "splitter": config.splitter.model_dump(mode="json"),
            "revision": CHUNKING_REVISION,
        }
    )


def embedding_version(config: RagConfig) -> str:
    """Which model embeds the chunks and at which precision (the batch size does not change a vector).

    `auto` counts as the precision it resolves to on this machine: it embeds in bfloat16 only where
    the CPU computes it natively, so two machines can produce (slightly) different vectors.
    """
    embedding = config.embedding
    return _short_hash({"model": embedding.model, "precision": resolve_precision(embedding.precision)})
