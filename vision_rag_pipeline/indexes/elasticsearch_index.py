"""The production lexical index: Elasticsearch through the official client.

Chunks live in versioned concrete indexes `<prefix>-v<timestamp>` behind the alias `<prefix>`;
every read and write goes through the alias, and a rebuild loads a new version and moves the alias
in one `update_aliases` call, so searches never see an empty or half-built index.

Where the cluster is and how to log in comes from the environment (`ElasticsearchSettings` in
core/config.py); secrets never reach a message.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager, suppress
from datetime import UTC, datetime
from typing import Any, TypeVar

import elastic_transport
import elasticsearch
from elasticsearch import Elasticsearch, helpers

from vision_rag_pipeline.core.config import ElasticsearchSettings
from vision_rag_pipeline.core.text import fold_homoglyphs
from vision_rag_pipeline.indexes.lexical import (
    LexicalDoc,
    LexicalHit,
    LexicalIndexError,
    check_replacement,
    has_searchable_words,
)

BULK_CHUNK_DOCS = 500
FIRST_VERSION = "v0"  # deterministic, so processes racing to create the index create the same one

T = TypeVar("T")


def _client(settings: ElasticsearchSettings) -> Elasticsearch:
    options: dict[str, Any] = {"request_timeout": 30, "retry_on_timeout": True, "max_retries": 2}
    if settings.api_key:
        options["api_key"] = settings.api_key
    elif settings.username:
        options["basic_auth"] = (settings.username, settings.password or "")
    if settings.ca_certs:
        options["ca_certs"] = settings.ca_certs
    if not settings.verify_certs:
        options["verify_certs"] = False
        options["ssl_show_warn"] = False
    return Elasticsearch(settings.url, **options)


# Elasticsearch's built-in language analyzers, one sub-field each, searched together with the
# English field: `cjk` cuts Chinese, Japanese and Korean into bigrams, `russian` stems Russian.
LANGUAGE_ANALYZERS = ("cjk", "russian")


def index_body(analyzers: tuple[str, ...] = LANGUAGE_ANALYZERS) -> dict[str, Any]:
    """Settings and mapping of one concrete index version, with these language sub-fields."""
    text_fields: dict[str, Any] = {"standard": {"type": "text", "analyzer": "standard"}}
    text_fields |= {name: {"type": "text", "analyzer": name} for name in analyzers}
    return {
        "mappings": {
            "dynamic": "strict",
            "properties": {
                "chunk_id": {"type": "keyword"},
                "document_id": {"type": "keyword"},
                "kind": {"type": "keyword"},
                "image": {"type": "keyword"},
                "page": {"type": "integer"},
                "text": {"type": "text", "analyzer": "english", "fields": text_fields},
                "landmarks": {
                    "properties": {
                        "page_names": {"type": "keyword"},
                        "page_count": {"type": "integer"},
                        "references": {"type": "keyword"},
                        "periods": {"type": "keyword"},
                        "header": {"type": "text", "analyzer": "english"},
                    }
                },
                "metadata": {"type": "object", "enabled": False},
            },
        }
    }


def _source(doc: LexicalDoc) -> dict[str, Any]:
    """The stored document; its text and header with homoglyphs folded inside codes, as queries are
    (the analyzers cannot fold only inside codes, so the text reaches them folded)."""
    source = doc.model_dump(mode="json", exclude_none=True)
    source["text"] = fold_homoglyphs(doc.text)
    if header := source.get("landmarks", {}).get("header"):
        source["landmarks"]["header"] = fold_homoglyphs(header)
    return source


class ElasticsearchLexicalIndex:
    """The lexical index as an Elasticsearch alias over versioned indexes."""

    def __init__(self, settings: ElasticsearchSettings) -> None:
        self.settings = settings
        self.alias = settings.alias
        self._client: Elasticsearch | None = None
        self._alias_ready = False
        self._text_fields: list[str] | None = None
        self._lock = threading.Lock()

    # --- plumbing ------------------------------------------------------------------------------

    @property
    def client(self) -> Elasticsearch:
        with self._lock:
            if self._client is None:
                self._client = _client(self.settings)
            return self._client

    def _call(self, operation: str, action: Callable[[Elasticsearch], T]) -> T:
        """Run one operation, creating the alias on first use and turning failures into one line."""
        with self._errors(operation):
            if not self._alias_ready:
                self._ensure_alias()
            return action(self.client)

    @contextmanager
    def _errors(self, operation: str) -> Iterator[None]:
        where = f"Elasticsearch at {self.settings.safe_url}"
        try:
            yield
        except elastic_transport.TlsError as exc:
            raise LexicalIndexError(
                f"{where}: TLS handshake failed ({type(exc).__name__}); set VISION_RAG_ES_CA_CERTS "
                "to the cluster's CA file or VISION_RAG_ES_VERIFY_CERTS=false"
            ) from None
        except elastic_transport.ConnectionTimeout:
            raise LexicalIndexError(f"{where} did not answer in time ({operation})") from None
        except elastic_transport.ConnectionError as exc:
            raise LexicalIndexError(f"{where} is unreachable ({operation}): {_root_cause(exc)}") from None
        except elasticsearch.AuthenticationException:
            raise LexicalIndexError(
                f"{where} rejected the credentials (HTTP 401); check VISION_RAG_ES_API_KEY or "
                "VISION_RAG_ES_USERNAME/VISION_RAG_ES_PASSWORD"
            ) from None
        except elasticsearch.AuthorizationException:
            raise LexicalIndexError(
                f"{where}: the credentials may not {operation} on '{self.alias}*' (HTTP 403)"
            ) from None
        except elasticsearch.ApiError as exc:
            raise LexicalIndexError(
                f"{where}: {operation} failed: HTTP {exc.meta.status} {_reason(exc)}"
            ) from None
        except helpers.BulkIndexError as exc:
            first = exc.errors[0] if exc.errors else {}
            raise LexicalIndexError(
                f"{where}: {operation}: {len(exc.errors)} chunk(s) were rejected, first: {first}"
            ) from None

    def _ensure_alias(self) -> None:
        """Create the first version behind the alias unless the alias already exists."""
        client = self.client
        if not client.indices.exists_alias(name=self.alias):
            # `exists` is true for an alias too: another process may have made it since the first look
            if client.indices.exists(index=self.alias) and not client.indices.exists_alias(name=self.alias):
                raise LexicalIndexError(
                    f"Elasticsearch at {self.settings.safe_url}: '{self.alias}' is a concrete index, "
                    "not an alias; set VISION_RAG_ES_INDEX to another name or delete it"
                )
            try:
                self._create_version(f"{self.alias}-{FIRST_VERSION}", aliased=True)
            except elasticsearch.BadRequestError as exc:
                if exc.error != "resource_already_exists_exception":
                    raise
        self._alias_ready = True

    def _create_version(self, name: str, *, aliased: bool) -> None:
        """Create a concrete index, leaving out each language analyzer the server does not have."""
        aliases = {self.alias: {}} if aliased else None
        analyzers = LANGUAGE_ANALYZERS
        while True:
            try:
                self.client.indices.create(index=name, aliases=aliases, **index_body(analyzers))
                return
            except elasticsearch.BadRequestError as exc:
                missing = tuple(a for a in analyzers if a in _reason(exc))
                if not missing:
                    raise
                analyzers = tuple(a for a in analyzers if a not in missing)

    def _search_fields(self, client: Elasticsearch) -> list[str]:
        if self._text_fields is None:
            mapping = client.indices.get_mapping(index=self.alias)
            sub_fields: set[str] = set()
            for body in mapping.body.values():
                sub_fields.update(body["mappings"]["properties"]["text"].get("fields", {}))
            self._text_fields = ["text", *(f"text.{name}" for name in sorted(sub_fields))]
        return self._text_fields

    # --- reading -------------------------------------------------------------------------------

    def search(
        self,
        query: str,
        k: int,
        *,
        document_ids: list[str] | None = None,
        kinds: list[str] | None = None,
        header_only: bool = False,
    ) -> list[LexicalHit]:
        if k <= 0 or document_ids == [] or kinds == [] or not has_searchable_words(query):
            return []
        filters: list[dict[str, Any]] = []
        if document_ids is not None:
            filters.append({"terms": {"document_id": document_ids}})
        if kinds is not None:
            filters.append({"terms": {"kind": kinds}})

        def run(client: Elasticsearch) -> list[LexicalHit]:
            # multi_match analyses the text per field and never parses query syntax; the document's
            # header scores beside the text, as tantivy's header field does.
            folded = fold_homoglyphs(query)
            should: list[dict[str, Any]] = [{"match": {"landmarks.header": folded}}]
            if not header_only:
                should.append({"multi_match": {"query": folded, "fields": self._search_fields(client)}})
            must = {"bool": {"should": should}}
            response = client.search(
                index=self.alias,
                query={"bool": {"must": must, "filter": filters}},
                size=k,
                source=["document_id"],
                track_total_hits=False,
            )
            return [
                LexicalHit(
                    chunk_id=hit["_id"], document_id=hit["_source"]["document_id"], score=hit["_score"]
                )
                for hit in response["hits"]["hits"]
            ]

        return self._call("search", run)

    def count(self, document_id: str | None = None) -> int:
        query = {"term": {"document_id": document_id}} if document_id is not None else {"match_all": {}}
        return self._call("count", lambda client: client.count(index=self.alias, query=query)["count"])

    def document_ids(self) -> set[str]:
        return self._call("list documents", self._document_ids)

    def _document_ids(self, client: Elasticsearch) -> set[str]:
        ids: set[str] = set()
        after: dict[str, Any] | None = None
        while True:
            composite: dict[str, Any] = {
                "size": 1000,
                "sources": [{"id": {"terms": {"field": "document_id"}}}],
            }
            if after:
                composite["after"] = after
            try:
                response = client.search(index=self.alias, size=0, aggs={"ids": {"composite": composite}})
            except elasticsearch.BadRequestError as exc:
                if "composite" not in _reason(exc):
                    raise
                return self._document_ids_by_terms(client)  # servers without composite (noida-db)
            buckets = response["aggregations"]["ids"]["buckets"]
            ids.update(bucket["key"]["id"] for bucket in buckets)
            after = response["aggregations"]["ids"].get("after_key")
            if not buckets or not after:
                return ids

    def _document_ids_by_terms(self, client: Elasticsearch) -> set[str]:
        size = max(1, client.count(index=self.alias)["count"])
        response = client.search(
            index=self.alias, size=0, aggs={"ids": {"terms": {"field": "document_id", "size": size}}}
        )
        return {bucket["key"] for bucket in response["aggregations"]["ids"]["buckets"]}

    # --- writing -------------------------------------------------------------------------------

    def replace_document(self, document_id: str, docs: list[LexicalDoc]) -> None:
        check_replacement(document_id, docs)

        def write(client: Elasticsearch) -> None:
            # Upsert first, then drop the entries that are gone: searches never see the document empty.
            actions = ({"_index": self.alias, "_id": doc.chunk_id, "_source": _source(doc)} for doc in docs)
            helpers.bulk(client, actions, chunk_size=BULK_CHUNK_DOCS, refresh=False)
            stale = {"bool": {"filter": [{"term": {"document_id": document_id}}]}}
            if docs:
                stale["bool"]["must_not"] = [{"ids": {"values": [doc.chunk_id for doc in docs]}}]
            client.delete_by_query(index=self.alias, query=stale, conflicts="proceed")
            # One explicit refresh makes the upserts and the deletions searchable together.
            client.indices.refresh(index=self.alias)

        self._call("write", write)

    def delete_document(self, document_id: str) -> int:
        def delete(client: Elasticsearch) -> int:
            response = client.delete_by_query(
                index=self.alias, query={"term": {"document_id": document_id}}, conflicts="proceed"
            )
            client.indices.refresh(index=self.alias)
            return int(response["deleted"])

        return self._call("delete", delete)

    def rebuild(self, docs: Iterable[LexicalDoc]) -> None:
        """Load a new version, then move the alias to it atomically and drop the old versions.

        Writes that other processes send to the alias while the rebuild runs land in the old
        version and are dropped with it; rebuild from the source of truth when writers are idle.
        """

        def swap(client: Elasticsearch) -> None:
            new_index = f"{self.alias}-v{datetime.now(UTC):%Y%m%d%H%M%S%f}"
            self._create_version(new_index, aliased=False)
            try:
                actions = (
                    {"_index": new_index, "_id": doc.chunk_id, "_source": _source(doc)} for doc in docs
                )
                helpers.bulk(client, actions, chunk_size=BULK_CHUNK_DOCS, refresh=False)
                client.indices.refresh(index=new_index)
                old_indexes = list(client.indices.get_alias(name=self.alias).body)
                client.indices.update_aliases(
                    actions=[
                        *({"remove": {"index": old, "alias": self.alias}} for old in old_indexes),
                        {"add": {"index": new_index, "alias": self.alias}},
                    ]
                )
            except BaseException:
                with suppress(Exception):  # best effort: the original error is the one to report
                    client.indices.delete(index=new_index, ignore_unavailable=True)
                raise
            for old in old_indexes:
                client.indices.delete(index=old, ignore_unavailable=True)
            self._text_fields = None

        self._call("rebuild", swap)

    def close(self) -> None:
        with self._lock:
            if self._client is not None:
                self._client.close()
            self._client = None
            self._alias_ready = False
            self._text_fields = None


def _reason(exc: elasticsearch.ApiError) -> str:
    """The server's own explanation (`error.reason`), falling back to the error type."""
    error = exc.body.get("error") if isinstance(exc.body, dict) else None
    if isinstance(error, dict) and error.get("reason"):
        return f"{error.get('type', exc.message)}: {error['reason']}"
    return str(exc.message)


def _root_cause(exc: BaseException) -> str:
    """The innermost error message (`Connection refused`), not the client's nested wrappers."""
    while exc.__cause__ is not None or exc.__context__ is not None:
        exc = exc.__cause__ or exc.__context__  # type: ignore[assignment]
    return str(exc)


_open_indexes: dict[ElasticsearchSettings, ElasticsearchLexicalIndex] = {}
_open_lock = threading.Lock()


def open_elasticsearch_index(settings: ElasticsearchSettings | None = None) -> ElasticsearchLexicalIndex:
    """The process-wide handle for these settings (from the environment when none are given)."""
    settings = settings or ElasticsearchSettings.from_env()
    with _open_lock:
        if settings not in _open_indexes:
            _open_indexes[settings] = ElasticsearchLexicalIndex(settings)
        return _open_indexes[settings]
