"""Which lexical backend serves this deployment: Elasticsearch when configured, tantivy on disk otherwise."""

from __future__ import annotations

from pathlib import Path

from vision_rag_pipeline.core.config import (
    ES_URL_ENV,
    MULTI_NODE_ENV,
    ConfigError,
    elasticsearch_url,
    multi_node,
)
from vision_rag_pipeline.core.config import home as default_home
from vision_rag_pipeline.core.postgres import connect, ensure_schema
from vision_rag_pipeline.indexes.lexical import LexicalIndex


def open_lexical_index(home: Path | None = None) -> LexicalIndex:
    """Elasticsearch when `VISION_RAG_ES_URL` is set, else tantivy under `<home>/lexical`.

    Cheap to call on every query: both backends keep one open handle per process and target. Each
    backend's client library is imported only when it is the one chosen.

    Refused when the deployment is multi-node (`VISION_RAG_MULTI_NODE`) without Elasticsearch:
    tantivy is one index on one disk, and each host would write and search its own.
    """
    if elasticsearch_url():
        from vision_rag_pipeline.indexes.elasticsearch_index import open_elasticsearch_index

        return open_elasticsearch_index()
    if multi_node():
        raise ConfigError(
            f"{MULTI_NODE_ENV} is set but {ES_URL_ENV} is not: with more than one host the lexical "
            f"index must be Elasticsearch (tantivy keeps one index on one local disk, so each host "
            f"would index and search only its own documents); set {ES_URL_ENV}"
        )
    from vision_rag_pipeline.indexes.tantivy_index import open_tantivy_index

    return open_tantivy_index((home or default_home()) / "lexical", PostgresLedger())


class PostgresLedger:
    """The tantivy indexes made on this database's behalf, by directory: a directory that is gone
    though its index was made is reported (a deleted index, repaired by `vision-rag reindex`), not
    silently made again empty. The index database is where the chunks the index holds come from."""

    _SCHEMA = (
        "CREATE TABLE IF NOT EXISTS lexical_index_roots ("
        "root text PRIMARY KEY, made_at timestamptz NOT NULL DEFAULT now())"
    )

    def made(self, root: Path) -> bool:
        ensure_schema(self._SCHEMA)
        with connect() as conn:
            return (
                conn.execute("SELECT 1 FROM lexical_index_roots WHERE root = %s", (str(root),)).fetchone()
                is not None
            )

    def record(self, root: Path) -> None:
        ensure_schema(self._SCHEMA)
        with connect() as conn:
            conn.execute(
                "INSERT INTO lexical_index_roots (root) VALUES (%s) ON CONFLICT DO NOTHING", (str(root),)
            )
