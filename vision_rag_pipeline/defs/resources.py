"""Dagster resources: thin handles on the config and the stores. Every field defaults to the
process' config in effect and the environment (VISION_RAG_PG_URL, VISION_RAG_ES_URL) so the UI,
sensors and the CLI see the same thing."""

from __future__ import annotations

import threading
from contextlib import suppress
from pathlib import Path

import dagster as dg
import numpy as np

from vision_rag_pipeline.core.config import (
    ConfigError,
    ConfigInEffect,
    EmbeddingConfig,
    RagConfig,
    config_in_effect,
)
from vision_rag_pipeline.core.config_in_use import record_config_used, say_once_if_different
from vision_rag_pipeline.core.postgres import database_url
from vision_rag_pipeline.documents.registry import DocumentRegistry
from vision_rag_pipeline.enrichment.cache import EnrichmentCache
from vision_rag_pipeline.images.store import ImageStore
from vision_rag_pipeline.indexes.lexical import LexicalIndex
from vision_rag_pipeline.indexes.lexical_backend import open_lexical_index
from vision_rag_pipeline.indexes.pgvector_store import PgVectorStore


class RagConfigResource(dg.ConfigurableResource):
    """The RAG config in effect in this process (`core.config.config_in_effect`), from which the code
    versions and host inputs were computed too. `config_path` is left unset: a run configured with a
    path other than the process' fails instead of mixing two configs in one run (code versions of one,
    outputs of the other); every process names its file through VISION_RAG_CONFIG.

    Each run records the config it executes with (`core/config_in_use.py`) and logs, once per
    process, when that differs from the one the runs before it used.
    """

    config_path: str | None = None

    def setup_for_execution(self, context: dg.InitResourceContext) -> None:
        in_effect = self._in_effect()
        say_once_if_different(in_effect, record_config_used(in_effect), context.log.warning)

    def load(self) -> RagConfig:
        return self._in_effect().config

    def _in_effect(self) -> ConfigInEffect:
        in_effect = config_in_effect()
        if self.config_path and Path(self.config_path).expanduser().resolve() != in_effect.path:
            raise ConfigError(
                f"rag_config.config_path names {self.config_path}, but this process works with {in_effect.path}: "
                f"set VISION_RAG_CONFIG={self.config_path} for every process (CLI, daemon, code server, "
                "API, workers) instead"
            )
        return in_effect


class IndexDatabase(dg.ConfigurableResource):
    """The Postgres database holding the registry, image store, enrichment cache and pgvector index."""

    url: str | None = None

    def database_url(self) -> str:
        return self.url or database_url()

    def registry(self) -> DocumentRegistry:
        return DocumentRegistry(self.database_url())

    def image_store(self) -> ImageStore:
        return ImageStore(self.database_url())

    def enrichment_cache(self) -> EnrichmentCache:
        return EnrichmentCache(self.database_url())

    def vector_store(self, dim: int) -> PgVectorStore:
        return PgVectorStore(dim, self.database_url())


class LexicalIndexResource(dg.ConfigurableResource):
    """BM25 index: Elasticsearch when VISION_RAG_ES_URL is set, else tantivy under VISION_RAG_HOME."""

    def open(self) -> LexicalIndex:
        return open_lexical_index()


def load_embedding_model() -> None:
    """Load the configured embedding model ahead of the first step that needs it: torch alone imports
    in ~1.2 s, time a document's loading and OCR (Tesseract runs without the GIL) can hide. Best
    effort: a missing model or a bad config is reported by the step that encodes, naming the file."""
    with suppress(Exception):
        from vision_rag_pipeline.embeddings.encoder import load_encoder

        embedding = config_in_effect().config.embedding
        load_encoder(embedding.model, embedding.precision)


class EmbeddingModel(dg.ConfigurableResource):
    """The configured embedding model, starting to load on a thread when a run builds its resources.

    The in-process executor builds every resource of the run before its first step, so the model
    loads while the document is read and OCR'd; a step in a process of its own (k8s_job) builds only
    its own resources, and starts the load when chunk_embeddings starts. `encode` waits for a load in
    progress rather than starting another.
    """

    def setup_for_execution(self, context: dg.InitResourceContext) -> None:
        threading.Thread(target=load_embedding_model, name="load-embedding-model", daemon=True).start()

    def encode(self, texts: list[str], embedding: EmbeddingConfig) -> np.ndarray:
        from vision_rag_pipeline.embeddings.encoder import encode

        return encode(texts, embedding.model, embedding.batch_size, embedding.precision)
