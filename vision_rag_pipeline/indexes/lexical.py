"""The lexical (BM25) index interface that both backends (tantivy, Elasticsearch) implement.

Both backends hold one entry per chunk, keyed by `chunk_id`, grouped by `document_id` (the Dagster
partition), so a partition is replaced or deleted as a unit and re-running an asset never duplicates.
The chunk text itself lives in Postgres; the lexical index only answers "which chunks, how well".
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any, Protocol

from pydantic import BaseModel, Field

from vision_rag_pipeline.chunks.model import Chunk, Landmarks
from vision_rag_pipeline.core.text import ENGLISH_STOP_WORDS

_WORD = re.compile(r"\w+")
# Bump when either backend analyses text differently (the `lexical_index` code version includes it, so
# each document's entries are written again). 2: look-alike letters folded to Latin inside codes.
LEXICAL_ANALYSIS_REVISION = 2


class LexicalDoc(BaseModel):
    """One chunk as the lexical index sees it."""

    chunk_id: str
    document_id: str
    kind: str
    text: str
    page: int | None = None
    image: str | None = None
    landmarks: Landmarks = Field(default_factory=Landmarks)
    metadata: dict[str, Any] = Field(default_factory=dict)

    @classmethod
    def of(cls, chunk: Chunk) -> LexicalDoc:
        """The lexical index's view of a chunk (its text lives in Postgres too)."""
        return cls(
            chunk_id=chunk.chunk_id,
            document_id=chunk.document_id,
            kind=chunk.kind,
            text=chunk.text,
            page=chunk.page,
            image=chunk.image,
            landmarks=chunk.landmarks,
            metadata={"source": chunk.metadata.get("source")},
        )


class LexicalHit(BaseModel):
    chunk_id: str
    document_id: str
    score: float


class LexicalIndexError(RuntimeError):
    """The index cannot be used right now (server down, credentials rejected, index locked...)."""


class LexicalIndex(Protocol):
    def replace_document(self, document_id: str, docs: list[LexicalDoc]) -> None:
        """Make `docs` the document's only entries (upsert by chunk_id, drop the rest); idempotent."""

    def delete_document(self, document_id: str) -> int:
        """Remove the document's entries; returns how many were removed."""

    def search(
        self,
        query: str,
        k: int,
        *,
        document_ids: list[str] | None = None,
        kinds: list[str] | None = None,
        header_only: bool = False,
    ) -> list[LexicalHit]:
        """Best first. User text is never parsed as query syntax; no searchable word -> [].

        `header_only`: score the documents' headers alone (title, file name, opening words), not
        the chunks' text: which documents a question names."""

    def count(self, document_id: str | None = None) -> int: ...

    def document_ids(self) -> set[str]: ...

    def rebuild(self, docs: Iterable[LexicalDoc]) -> None:
        """Build a fresh index aside from `docs`, then swap it in atomically; searches answer throughout."""

    def close(self) -> None:
        """Release connections and handles; the object reopens them if used again."""


def has_searchable_words(query: str) -> bool:
    """False for a query of only punctuation and English stop words, which must match nothing."""
    return any(word.lower() not in ENGLISH_STOP_WORDS for word in _WORD.findall(query))


def check_replacement(document_id: str, docs: list[LexicalDoc]) -> None:
    """Reject input that would break the one-entry-per-chunk, one-partition-per-call contract."""
    seen: set[str] = set()
    for doc in docs:
        if doc.document_id != document_id:
            raise ValueError(
                f"chunk {doc.chunk_id!r} belongs to document {doc.document_id!r}, not {document_id!r}"
            )
        if doc.chunk_id in seen:
            raise ValueError(f"chunk id {doc.chunk_id!r} appears twice in document {document_id!r}")
        seen.add(doc.chunk_id)
