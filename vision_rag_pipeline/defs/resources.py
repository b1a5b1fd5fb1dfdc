"""Dagster resources: thin handles on the config and the stores. Every field defaults to the
environment (VISION_RAG_CONFIG, VISION_RAG_PG_URL, VISION_RAG_ES_URL) so the UI, sensors and the
CLI see the same thing."""

from __future__ import annotations

import dagster as dg

from vision_rag_pipeline.core.config import RagConfig, load_config
from vision_rag_pipeline.core.postgres import database_url
from vision_rag_pipeline.documents.registry import DocumentRegistry
from vision_rag_pipeline.enrichment.cache import EnrichmentCache
from vision_rag_pipeline.images.store import ImageStore
from vision_rag_pipeline.indexes.lexical import LexicalIndex
from vision_rag_pipeline.indexes.lexical_backend import open_lexical_index
from vision_rag_pipeline.indexes.pgvector_store import PgVectorStore


class RagConfigResource(dg.ConfigurableResource):
    """The RAG config; `config_path` overrides VISION_RAG_CONFIG."""

    config_path: str | None = None

    def load(self) -> RagConfig:
        return load_config(self.config_path)


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
