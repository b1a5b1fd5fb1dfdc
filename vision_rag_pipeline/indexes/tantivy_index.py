"""The embedded lexical index: tantivy on local disk, safe for several processes at once.

Layout under the root directory:
- `CURRENT` names the live index directory; a rebuild writes a new directory and swaps `CURRENT`
  with `os.replace`, so a reader either sees the old index or the new one, never a half-built one;
- `write.lock` serializes writers across processes (Dagster runs several runs in parallel) and
  threads, because tantivy allows only one `IndexWriter` per index and fails instead of waiting;
- `v<timestamp>-<pid>/` are the index directories.

Readers cache one `tantivy.Index` per root and process and reload it before each search (~25 µs),
which is how commits made by other processes become visible.

A damaged index (a `meta.json` that does not parse, a missing segment, `CURRENT` naming no index)
raises `LexicalIndexDamaged`, and so does a missing one that the ledger (the index database) says
existed: both name the repair, `vision-rag reindex`, which builds the index again from the chunks in
Postgres. Without a ledger (a bare directory) an index is created wherever none is found.
"""

from __future__ import annotations

import os
import re
import shutil
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Protocol, TypeVar, get_args

import fasteners
import tantivy
from tantivy import Document, Filter, Index, Occur, PreTokenizedString, Query, TextAnalyzerBuilder, Token

from vision_rag_pipeline.chunks.model import ChunkKind
from vision_rag_pipeline.core.text import (
    RUSSIAN_QUESTION_WORDS,
    RUSSIAN_STOP_WORDS,
    cjk_bigrams,
    fold_homoglyphs,
    without_chinese_stop_words,
)
from vision_rag_pipeline.indexes.lexical import (
    LexicalDoc,
    LexicalHit,
    LexicalIndexError,
    check_replacement,
)

POINTER_FILE = "CURRENT"
LOCK_FILE = "write.lock"
WRITE_LOCK_TIMEOUT_S = 300.0  # a rebuild of a large index holds the lock this long at most
TANTIVY_LOCK_RETRY_S = 30.0
INDEXED_KINDS: tuple[str, ...] = get_args(ChunkKind)
WRITER_HEAP_BYTES = 64_000_000
REBUILD_HEAP_BYTES = 256_000_000

# The same pipeline as tantivy's built-in `en_stem`, plus English stop words removed from queries.
_QUERY_ANALYZER = (
    TextAnalyzerBuilder(tantivy.Tokenizer.simple())
    .filter(Filter.remove_long(40))
    .filter(Filter.lowercase())
    .filter(Filter.stopword("english"))
    .filter(Filter.stemmer("english"))
    .build()
)
# Russian words, stemmed by Snowball and without stop words, in a field of their own: the English
# field keeps them only lower-cased, so "выручка" would never meet "выручки". Only Cyrillic words
# go there, so English text and queries score exactly as before.
_RUSSIAN_ANALYZER = (
    TextAnalyzerBuilder(tantivy.Tokenizer.simple())
    .filter(Filter.remove_long(40))
    .filter(Filter.lowercase())
    .filter(Filter.custom_stopword(sorted(RUSSIAN_STOP_WORDS | RUSSIAN_QUESTION_WORDS)))
    .filter(Filter.stemmer("russian"))
    .build()
)
_CYRILLIC_WORD = re.compile(r"[\u0400-\u04ff][\w\u0400-\u04ff-]*")

T = TypeVar("T")
REPAIR = "rebuild it from the index database with `vision-rag reindex`"


class LexicalIndexDamaged(LexicalIndexError):
    """The index on disk cannot be read, or is gone though it existed; the message names the repair."""


class IndexLedger(Protocol):
    """Where the fact that an index was made outlives its directory."""

    def made(self, root: Path) -> bool: ...

    def record(self, root: Path) -> None: ...


def build_schema() -> tantivy.Schema:
    builder = tantivy.SchemaBuilder()
    builder.add_text_field("chunk_id", stored=True, tokenizer_name="raw")
    builder.add_text_field("document_id", stored=True, tokenizer_name="raw")
    builder.add_text_field("kind", tokenizer_name="raw")
    builder.add_text_field("text", tokenizer_name="en_stem")
    builder.add_text_field("text_cjk", tokenizer_name="raw", index_option="freq")
    builder.add_text_field("text_ru", tokenizer_name="raw", index_option="freq")
    builder.add_unsigned_field("page", stored=True)
    builder.add_text_field("image", stored=True, tokenizer_name="raw")
    for name in LANDMARK_TERM_FIELDS:
        builder.add_text_field(name, tokenizer_name="raw")
    builder.add_text_field("header", tokenizer_name="en_stem")
    return builder.build()


LANDMARK_TERM_FIELDS = ("page_names", "references", "periods")


SCHEMA = build_schema()


def russian_tokens(text: str) -> list[str]:
    """Stems of the Cyrillic words of a text, in order (stop words dropped)."""
    return _RUSSIAN_ANALYZER.analyze(" ".join(_CYRILLIC_WORD.findall(text)))


def _pre_tokenized(tokens: list[str]) -> PreTokenizedString:
    return PreTokenizedString("", [Token(token, position, 0, 0) for position, token in enumerate(tokens)])


def _to_tantivy(doc: LexicalDoc) -> Document:
    text = fold_homoglyphs(doc.text)  # as queries are: "Н-558" (Cyrillic Н) is the code H-558
    tv_doc = Document(chunk_id=doc.chunk_id, document_id=doc.document_id, kind=doc.kind, text=text)
    if doc.page is not None:
        tv_doc.add_unsigned("page", doc.page)
    if doc.image is not None:
        tv_doc.add_text("image", doc.image)
    if cjk := cjk_bigrams(text, with_unigrams=True):
        tv_doc.add_pre_tokenized_text("text_cjk", _pre_tokenized(cjk))
    if russian := russian_tokens(text):
        tv_doc.add_pre_tokenized_text("text_ru", _pre_tokenized(russian))
    for name in LANDMARK_TERM_FIELDS:
        for value in getattr(doc.landmarks, name):
            tv_doc.add_text(name, value)
    if doc.landmarks.header:
        tv_doc.add_text("header", fold_homoglyphs(doc.landmarks.header))
    return tv_doc


def _unique(items: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(items))


def build_query(
    query: str,
    document_ids: list[str] | None,
    kinds: list[str] | None,
    header_only: bool = False,
) -> Query | None:
    """A BM25 query over the English, CJK and Russian fields, each analysed as it was indexed (the
    header field alone with `header_only`), built from terms so no input is syntax; filters
    (documents, kinds) move no score."""
    query = fold_homoglyphs(query)
    words = _QUERY_ANALYZER.analyze(query)
    analysed: tuple[tuple[str, list[str]], ...] = (("header", words),)
    if not header_only:
        analysed += (
            ("text", words),
            ("text_cjk", cjk_bigrams(without_chinese_stop_words(query))),
            ("text_ru", russian_tokens(query)),
        )
    should = [Query.term_query(SCHEMA, field, term) for field, terms in analysed for term in _unique(terms)]
    if not should:
        return None
    clauses = [(Occur.Must, Query.boolean_query([(Occur.Should, q) for q in should]))]
    if document_ids is not None:
        clauses.append(_required("document_id", document_ids))
    if kinds is not None and (unwanted := [kind for kind in INDEXED_KINDS if kind not in kinds]):
        # A required set of terms doubles a lookup's time at 100k chunks, excluding the other kinds
        # does not (BENCHMARKS.md, query latency), so the shorter of the two is written.
        if len(unwanted) < len(kinds):
            clauses.extend((Occur.MustNot, Query.term_query(SCHEMA, "kind", kind)) for kind in unwanted)
        else:
            clauses.append(_required("kind", kinds))
    return Query.boolean_query(clauses)


def _required(field: str, values: list[str]) -> tuple[Occur, Query]:
    """A filter that must hold and moves no score (a zero constant score)."""
    match = (
        Query.term_query(SCHEMA, field, values[0])
        if len(values) == 1
        else Query.term_set_query(SCHEMA, field, values)
    )
    return Occur.Must, Query.const_score_query(match, 0.0)


class TantivyLexicalIndex:
    """The lexical index in a directory; see the module docstring for the layout."""

    def __init__(self, root: Path, ledger: IndexLedger | None = None) -> None:
        self.root = root
        self.ledger = ledger
        self._recorded = False  # in the ledger, as far as this process knows
        self._pointer = root / POINTER_FILE
        self._thread_lock = threading.Lock()
        self._file_lock = fasteners.InterProcessLock(str(root / LOCK_FILE))
        self._index: Index | None = None
        self._pointer_stamp: tuple[int, int] | None = None

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
        if k <= 0 or document_ids == [] or kinds == []:
            return []
        tv_query = build_query(query, document_ids, kinds, header_only)
        if tv_query is None:
            return []

        def run(index: Index) -> list[LexicalHit]:
            searcher = index.searcher()
            hits = []
            for score, address in searcher.search(tv_query, k, count=False).hits:
                stored = searcher.doc(address)
                hits.append(
                    LexicalHit(
                        chunk_id=stored.get_first("chunk_id"),
                        document_id=stored.get_first("document_id"),
                        score=score,
                    )
                )
            return hits

        return self._read(run)

    def count(self, document_id: str | None = None) -> int:
        if document_id is None:
            return self._read(lambda index: index.searcher().num_docs)
        return self._read(lambda index: self._count_term(index, "document_id", document_id))

    def document_ids(self) -> set[str]:
        # The term dictionary keeps deleted documents' ids until a merge; the filter drops them.
        return self._read(
            lambda index: {
                term
                for term, _ in index.searcher().terms_with_prefix(
                    "document_id", "", filter_query=Query.all_query()
                )
            }
        )

    @staticmethod
    def _count_term(index: Index, field: str, value: str) -> int:
        return index.searcher().search(Query.term_query(SCHEMA, field, value), 1, count=True).count

    def _read(self, action: Callable[[Index], T]) -> T:
        """Run `action` on the live index, following a swap made by another process meanwhile."""
        try:
            index = self._live_index()
            index.reload()
            return action(index)
        except (ValueError, OSError):
            # The directory we held may have been swapped out and removed between two calls.
            self._pointer_stamp = None
            try:
                index = self._live_index()
                index.reload()
                return action(index)
            except (ValueError, OSError) as exc:  # not a swap: the files are damaged
                raise self._damaged(_one_line(exc)) from None  # the reason is in the message

    def _live_index(self) -> Index:
        """The index `CURRENT` names, reopened when it changed since the last call."""
        if not self._pointer.exists():
            self.root.mkdir(parents=True, exist_ok=True)
            with self._exclusive():
                self._create_first_version()
        stat = self._pointer.stat()
        stamp = (stat.st_ino, stat.st_mtime_ns)
        if self._index is None or stamp != self._pointer_stamp:
            self._index = self._open_version(self._pointer.read_text(encoding="utf-8").strip())
            self._pointer_stamp = stamp
            self._record()
        return self._index

    def _open_version(self, version: str) -> Index:
        path = self.root / version
        if not version or not (path / "meta.json").is_file():
            raise self._damaged(f"{self._pointer} names {version!r}, which holds no index")
        try:
            return Index(SCHEMA, path=str(path), reuse=True)
        except ValueError as exc:
            if "schema does not match" in str(exc):
                raise LexicalIndexError(
                    f"{path}: the lexical index was written with another schema (an older version); "
                    "rebuild it with `vision-rag reindex`"
                ) from exc
            raise self._damaged(_one_line(exc)) from None  # the reason is in the message

    def _damaged(self, reason: str) -> LexicalIndexDamaged:
        return LexicalIndexDamaged(f"{self.root}: the lexical index is damaged ({reason[:200]}); {REPAIR}")

    def _create_first_version(self) -> None:
        """Under the write lock: make an empty index live unless another process just did, or unless
        the ledger says one was made here before (then it was deleted: that is reported)."""
        if self._pointer.exists():
            return
        if self.ledger is not None and self.ledger.made(self.root):
            raise LexicalIndexDamaged(
                f"{self.root}: the lexical index is missing, though the index database says one was "
                f"made there (was the directory deleted?); {REPAIR}"
            )
        self._swap_pointer(self._new_version()[0])

    def _record(self) -> None:
        """Tell the ledger an index lives here (once per process: an index older than the ledger
        is recorded when first opened)."""
        if self.ledger is not None and not self._recorded:
            self.ledger.record(self.root)
            self._recorded = True

    # --- writing -------------------------------------------------------------------------------

    def replace_document(self, document_id: str, docs: list[LexicalDoc]) -> None:
        check_replacement(document_id, docs)

        def write(index: Index, writer: tantivy.IndexWriter) -> None:
            # One commit: searchers see the old entries or the new ones, never neither.
            writer.delete_documents_by_term("document_id", document_id)
            for doc in docs:
                writer.delete_documents_by_term("chunk_id", doc.chunk_id)  # a chunk moved between documents
                writer.add_document(_to_tantivy(doc))

        self._write(write)

    def delete_document(self, document_id: str) -> int:
        def write(index: Index, writer: tantivy.IndexWriter) -> int:
            writer.delete_documents_by_term("document_id", document_id)
            return self._count_term(index, "document_id", document_id)  # the commit has not happened yet

        return self._write(write)

    def rebuild(self, docs: Iterable[LexicalDoc]) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        with self._exclusive():
            version, index = self._new_version()
            try:
                with self._writer(
                    index, REBUILD_HEAP_BYTES, num_threads=min(4, os.cpu_count() or 1)
                ) as writer:
                    for doc in docs:
                        writer.add_document(_to_tantivy(doc))
            except BaseException:
                shutil.rmtree(self.root / version, ignore_errors=True)
                raise
            self._swap_pointer(version)
            self._record()
            # No other writer runs while we hold the lock: every other directory is an old version
            # or the leftover of a crashed rebuild.
            for entry in self.root.iterdir():
                if entry.is_dir() and entry.name != version:
                    shutil.rmtree(entry, ignore_errors=True)

    def _write(self, action: Callable[[Index, tantivy.IndexWriter], T]) -> T:
        """Run `action` with the only writer of the live index and commit it."""
        self.root.mkdir(parents=True, exist_ok=True)
        with self._exclusive():
            self._create_first_version()
            self._pointer_stamp = None  # re-read CURRENT: a rebuild may have swapped it while we waited
            index = self._live_index()
            index.reload()
            with self._writer(index, WRITER_HEAP_BYTES, num_threads=1) as writer:
                result = action(index, writer)
            index.reload()
            return result

    @contextmanager
    def _writer(self, index: Index, heap_bytes: int, num_threads: int) -> Iterator[tantivy.IndexWriter]:
        """A writer that commits on success, rolls back on error, and always releases tantivy's lock."""
        deadline = time.monotonic() + TANTIVY_LOCK_RETRY_S
        delay = 0.02
        while True:
            try:
                writer = index.writer(heap_size=heap_bytes, num_threads=num_threads)
                break
            except ValueError as exc:
                if "LockBusy" not in str(exc):
                    raise
                if time.monotonic() > deadline:
                    raise LexicalIndexError(
                        f"{self.root}: the lexical index is locked by another writer (tantivy LockBusy "
                        f"for {TANTIVY_LOCK_RETRY_S:.0f} s); is a process outside vision-rag writing to it?"
                    ) from exc
                time.sleep(delay)
                delay = min(delay * 2, 1.0)
        try:
            yield writer
            writer.commit()
        except BaseException:
            writer.rollback()
            raise
        finally:
            writer.wait_merging_threads()  # consumes the writer and releases the directory lock

    @contextmanager
    def _exclusive(self) -> Iterator[None]:
        with self._thread_lock:
            if not self._file_lock.acquire(timeout=WRITE_LOCK_TIMEOUT_S):
                raise LexicalIndexError(
                    f"{self.root}: the lexical index is locked by another process "
                    f"(waited {WRITE_LOCK_TIMEOUT_S:.0f} s for {self.root / LOCK_FILE})"
                )
            try:
                yield
            finally:
                self._file_lock.release()

    def _new_version(self) -> tuple[str, Index]:
        """An empty index in a fresh directory (not live until `_swap_pointer`)."""
        version = f"v{datetime.now(UTC):%Y%m%d%H%M%S%f}-{os.getpid()}"
        (self.root / version).mkdir()
        return version, Index(SCHEMA, path=str(self.root / version))

    def _swap_pointer(self, version: str) -> None:
        tmp = self.root / f"{POINTER_FILE}.{os.getpid()}.tmp"
        tmp.write_text(version + "\n", encoding="utf-8")
        os.replace(tmp, self._pointer)

    def close(self) -> None:
        with self._thread_lock:
            self._index = None
            self._pointer_stamp = None


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


_open_indexes: dict[Path, TantivyLexicalIndex] = {}
_open_lock = threading.Lock()


def open_tantivy_index(root: Path, ledger: IndexLedger | None = None) -> TantivyLexicalIndex:
    """The process-wide handle for the index under `root` (created on first write or read, unless
    `ledger` says it existed before)."""
    root = root.expanduser().resolve()
    with _open_lock:
        if root not in _open_indexes:
            _open_indexes[root] = TantivyLexicalIndex(root, ledger)
        elif ledger is not None:
            _open_indexes[root].ledger = ledger
        return _open_indexes[root]
