"""The query module: reads the materialized indexes."""

from vision_rag_pipeline.query.search import Hit, search

__all__ = ["Hit", "search"]
