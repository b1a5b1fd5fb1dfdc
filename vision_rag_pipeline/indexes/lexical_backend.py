"""Which lexical backend serves this deployment: Elasticsearch when configured, tantivy on disk otherwise."""

from __future__ import annotations

import os
from pathlib import Path

from vision_rag_pipeline.core.config import ES_URL_ENV
from vision_rag_pipeline.core.config import home as default_home
from vision_rag_pipeline.indexes.lexical import LexicalIndex


def open_lexical_index(home: Path | None = None) -> LexicalIndex:
    """Elasticsearch when `VISION_RAG_ES_URL` is set, else tantivy under `<home>/lexical`.

    Cheap to call on every query: both backends keep one open handle per process and target. Each
    backend's client library is imported only when it is the one chosen.
    """
    if os.environ.get(ES_URL_ENV):
        from vision_rag_pipeline.indexes.elasticsearch_index import open_elasticsearch_index

        return open_elasticsearch_index()
    from vision_rag_pipeline.indexes.tantivy_index import open_tantivy_index

    return open_tantivy_index((home or default_home()) / "lexical")
