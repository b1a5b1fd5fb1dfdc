"""Hybrid query latency at scale, beside the time of its parts.

    .venv/bin/python bench/bench_query_scale.py [--chunks 100000] [--queries 60] [--out /tmp/bench_query_scale]
        [--keep] [--encode-chunks] [--bulk]

Builds an index of `--chunks` chunks in a fresh VISION_RAG_HOME under `--out`: 1,000 documents (or
one per 100 chunks, when that is more: 10,000 at a million chunks) whose chunks are 3-8 sentences
drawn from the text layers of `../shared/corpus`'s PDFs, four chunks to a page, and one page unit
per page (the page's text; its vector the mean of its chunks', as
ingest makes them). Each distinct sentence is embedded once with the configured model; a chunk's
vector is the normalized mean of its sentences' vectors, or with `--encode-chunks` the embedding of
its own text, as ingest makes it (17 chunks a second here at load 2-3: ~1.6 h for 100k). Means of
random sentences lie closer together than real chunks' vectors, which makes the HNSW walk's work
harder: BENCHMARKS.md "Query latency" compares the two. Rows go through
`PgVectorStore.replace_document` (HNSW maintained on insert; with `--bulk` both HNSW graphs are
built after the rows, as `vision-rag reindex` builds them) and tantivy's `rebuild`.

Then, warm, for each query (a corpus sentence cut to its first 8 words): `search()` end to end
(hybrid, k=5, across the whole index) and, separately, its stages: the query embedding, the
candidates (BM25 lookups and the one Postgres statement, each also timed alone inside that stage:
`candidates.lexical`, the four lookups, and `candidates.postgres`, the statement with its rows
read), the features, the score, collapse and cut. Within `search()` the query embedding, the page
and header lookups and the passage lookups run in three threads at once, so the end-to-end time is
less than the parts' sum and `candidates.lexical` sums the lookups' own times. Then 20 questions
that point into a document (the first 6 words and "on page 3", "in Figure 2", "on the first page" or
"on the last page"), end to end. Last, the HNSW index's recall (`hnsw_content_scan`): per
`hnsw.ef_search`, the share of each query's 10 nearest content chunks the search's scan finds, and
the scan's time. Prints one JSON object with p50 and p95 in ms, and the Postgres round trips one
`search()` makes (counted in libpq's protocol trace).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from eval_real import DEFAULT_CORPUS  # noqa: E402

DOCUMENTS = 1000  # at least; a document holds at most CHUNKS_PER_DOCUMENT chunks
CHUNKS_PER_DOCUMENT = 100
CHUNKS_PER_PAGE = 4
POINTERS = ("on page 3", "in Figure 2", "on the first page", "on the last page")
SENTENCE = re.compile(r"[^.!?\n]{40,300}[.!?]")


def corpus_sentences(corpus: Path) -> list[str]:
    """Distinct sentences of the corpus PDFs' text layers."""
    import pypdfium2 as pdfium

    found: dict[str, None] = {}
    for path in sorted(corpus.rglob("*.pdf")):
        pdf = pdfium.PdfDocument(path)
        for page in pdf:
            text = " ".join(page.get_textpage().get_text_range().split())
            for match in SENTENCE.finditer(text):
                found.setdefault(match.group(0).strip(), None)
        pdf.close()
    return list(found)


def percentiles(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {
        "p50": round(statistics.median(ordered) * 1000, 1),
        "p95": round(ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))] * 1000, 1),
    }


def timed(samples: dict[str, list[float]], name: str, action, *args, **kwargs):
    start = time.perf_counter()
    result = action(*args, **kwargs)
    samples.setdefault(name, []).append(time.perf_counter() - start)
    return result


@contextmanager
def timed_within(samples: dict[str, list[float]], name: str, owner, method: str) -> Iterator[None]:
    """Adds the time of every call of `owner.method` in the block, as one sample of `name`."""
    original = getattr(owner, method)
    spent = [0.0]

    def timing(*args, **kwargs):
        start = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            spent[0] += time.perf_counter() - start

    setattr(owner, method, timing)
    try:
        yield
    finally:
        setattr(owner, method, original)
        samples.setdefault(name, []).append(spent[0])


@contextmanager
def round_trips() -> Iterator[list[int]]:
    """Counts (in the list's one item) the Postgres round trips the index store makes in the block:
    the ReadyForQuery messages in libpq's protocol trace of each connection it takes, one a cycle."""
    from vision_rag_pipeline.indexes import pgvector_store

    counted = [0]
    connect = pgvector_store.connect

    @contextmanager
    def traced(url: str | None = None):
        with tempfile.TemporaryFile() as trace:
            with connect(url) as conn:
                conn.pgconn.trace(trace.fileno())
                yield conn
            conn.pgconn.untrace()  # after connect's own COMMIT, if it sends one
            trace.seek(0)
            counted[0] += trace.read().count(b"\tReadyForQuery\t")

    pgvector_store.connect = traced
    try:
        yield counted
    finally:
        pgvector_store.connect = connect


def documents_for(chunks: int) -> int:
    return max(DOCUMENTS, chunks // CHUNKS_PER_DOCUMENT)


def build_index(
    store,
    sentences: list[str],
    vectors: np.ndarray,
    chunks: int,
    rng: random.Random,
    embed=None,
    bulk: bool = False,
) -> dict:
    """Writes the chunks and their page units into `store` (a PgVectorStore) and tantivy; returns
    the seconds it took (`index_build_seconds`, and with `bulk` the HNSW graphs' share of them,
    `hnsw_build_seconds`). A chunk's vector is `embed` of its text, or without `embed` the mean of
    its sentences' `vectors`. With `bulk` the rows are written with no HNSW index and both graphs
    are built after them from the shipped DDL, as `vision-rag reindex` builds them: a million rows
    written one document at a time into maintained graphs would take most of a day here."""
    from vision_rag_pipeline.chunks.model import Chunk
    from vision_rag_pipeline.core.postgres import connect, unbounded_statements
    from vision_rag_pipeline.indexes.lexical import LexicalDoc
    from vision_rag_pipeline.indexes.lexical_backend import open_lexical_index
    from vision_rag_pipeline.indexes.pgvector_store import _indexes_ddl

    if bulk:
        with connect(store.url) as conn:
            conn.execute("DROP INDEX IF EXISTS chunks_embedding_hnsw, chunks_page_hnsw")

    documents = documents_for(chunks)
    per_document = chunks // documents
    lexical: list[LexicalDoc] = []
    started = time.perf_counter()
    for number in range(documents):
        document_id = f"doc-{number:04d}"
        picks = [rng.sample(range(len(sentences)), rng.randint(3, 8)) for _ in range(per_document)]
        batch = [
            Chunk(
                chunk_id=f"{document_id}:{index}",
                document_id=document_id,
                index=index,
                kind="text",
                text=" ".join(sentences[i] for i in pick),
                page=index // CHUNKS_PER_PAGE + 1,
                metadata={"title": f"Document {number}"},
            )
            for index, pick in enumerate(picks)
        ]
        if embed is None:
            means = np.stack([vectors[pick].mean(axis=0) for pick in picks])
            means /= np.linalg.norm(means, axis=1, keepdims=True)
        else:
            means = embed([chunk.text for chunk in batch])
        pages = range(0, len(batch), CHUNKS_PER_PAGE)
        units = [
            Chunk(
                chunk_id=f"{document_id}:page-{start // CHUNKS_PER_PAGE + 1}",
                document_id=document_id,
                index=len(batch) + start // CHUNKS_PER_PAGE,
                kind="page",
                text="\n\n".join(chunk.text for chunk in batch[start : start + CHUNKS_PER_PAGE]),
                page=start // CHUNKS_PER_PAGE + 1,
            )
            for start in pages
        ]
        unit_vectors = np.stack([means[start : start + CHUNKS_PER_PAGE].mean(axis=0) for start in pages])
        unit_vectors /= np.linalg.norm(unit_vectors, axis=1, keepdims=True)
        store.replace_document(document_id, batch + units, np.concatenate([means, unit_vectors]))
        lexical += [LexicalDoc.of(chunk) for chunk in batch + units]
    open_lexical_index().rebuild(lexical)
    timings = {}
    if bulk:
        graphs_started = time.perf_counter()
        with connect(store.url) as conn, unbounded_statements(conn):
            conn.execute(_indexes_ddl())
        timings["hnsw_build_seconds"] = round(time.perf_counter() - graphs_started, 1)
    return {"index_build_seconds": round(time.perf_counter() - started, 1), **timings}


def hnsw_recall(
    store, vectors: np.ndarray, limit: int, ef_searches: tuple[int, ...], exact: int = 10
) -> dict:
    """Per `hnsw.ef_search`: the share of each query's `exact` nearest content chunks (by every
    vector, in numpy) that the HNSW index's `limit` nearest hold, as a search's scan asks for them
    (iterative scan, relaxed order), and that scan's time. A chunk as near as the exact last one
    counts as found: ties are not misses."""
    from pgvector import Vector

    from vision_rag_pipeline.core.postgres import connect

    position: dict[str, int] = {}
    parts = []
    # a server-side cursor: a million vectors read at once would take ~3 GB here
    with connect(store.url) as conn, conn.cursor("content_vectors", binary=True) as cursor:
        cursor.execute("SELECT chunk_id, embedding FROM chunks WHERE kind <> 'page'")
        while rows := cursor.fetchmany(50_000):
            position.update((chunk_id, len(position)) for chunk_id, _ in rows)
            parts.append(np.stack([embedding.to_numpy() for _, embedding in rows]).astype(np.float32))
    matrix = np.concatenate(parts)
    matrix /= np.linalg.norm(matrix, axis=1, keepdims=True)
    similarities = [matrix @ (vector / np.linalg.norm(vector)) for vector in vectors]
    thresholds = [np.partition(sims, -exact)[-exact] - 1e-6 for sims in similarities]
    scan = "SELECT chunk_id FROM chunks c WHERE c.kind <> 'page' ORDER BY embedding <=> %b::vector LIMIT %s"
    report = {}
    for ef_search in ef_searches:
        found, seconds = [], []
        for vector, sims, threshold in zip(vectors, similarities, thresholds, strict=True):
            with connect(store.url) as conn:
                conn.execute(f"SET LOCAL hnsw.ef_search = {int(ef_search)}")
                conn.execute("SET LOCAL hnsw.iterative_scan = 'relaxed_order'")
                started = time.perf_counter()
                ids = [row[0] for row in conn.execute(scan, [Vector(vector), limit]).fetchall()]
                seconds.append(time.perf_counter() - started)
            found.append(min(1.0, sum(sims[position[i]] >= threshold for i in ids) / exact))
        report[str(ef_search)] = {
            f"exact_{exact}_found": round(float(np.mean(found)), 3),
            "scan_ms": percentiles(seconds),
        }
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chunks", type=int, default=100_000)
    parser.add_argument("--queries", type=int, default=60)
    parser.add_argument("--corpus", type=Path, default=DEFAULT_CORPUS)
    parser.add_argument("--out", type=Path, default=Path("/tmp/bench_query_scale"))
    parser.add_argument("--keep", action="store_true", help="reuse the index built by an earlier run")
    parser.add_argument(
        "--encode-chunks",
        action="store_true",
        help="embed every chunk's own text, as ingest does, instead of averaging its sentences' vectors",
    )
    parser.add_argument(
        "--bulk",
        action="store_true",
        help="write every row first and build the HNSW graphs after them, as `vision-rag reindex` does",
    )
    args = parser.parse_args()
    if not args.corpus.is_dir():
        raise SystemExit(f"{args.corpus}: not found (this benchmark draws its text from ../shared/corpus)")
    home = args.out / "home"
    if not args.keep:
        shutil.rmtree(home, ignore_errors=True)
    home.mkdir(parents=True, exist_ok=True)
    os.environ["VISION_RAG_HOME"] = str(home)

    from vision_rag_pipeline.core.config import config_in_effect
    from vision_rag_pipeline.embeddings.encoder import encode
    from vision_rag_pipeline.query.candidates import gather, open_lexical_index, query_vectors, vector_store
    from vision_rag_pipeline.query.features import describe
    from vision_rag_pipeline.query.ranker import load_ranker
    from vision_rag_pipeline.query.search import Scored, ranked, search

    rng = random.Random(5)
    sentences = corpus_sentences(args.corpus)
    config = config_in_effect().config
    model, precision = config.embedding.model, config.embedding.precision
    report: dict = {
        "chunks": args.chunks,
        "documents": documents_for(args.chunks),
        "sentences": len(sentences),
    }
    store = vector_store(model)
    if not args.keep or store.count() == 0:
        started = time.perf_counter()
        vectors = encode(sentences, model, precision=precision)
        report["sentence_encoding_seconds"] = round(time.perf_counter() - started, 1)
        embed = (lambda texts: encode(texts, model, precision=precision)) if args.encode_chunks else None
        report |= build_index(store, sentences, vectors, args.chunks, rng, embed, bulk=args.bulk)
    report["indexed_rows"] = store.count()
    queries = [" ".join(sentence.split()[:8]) for sentence in rng.sample(sentences, args.queries)]
    ranker = load_ranker()
    for query in queries[:5]:  # warm-up: model, connections, index readers, caches
        search(query, k=5)
    samples: dict[str, list[float]] = {}
    for query in queries:
        timed(samples, "search_end_to_end", search, query, k=5)
        timed(samples, "query_embedding", encode, [query], model, precision=precision)
        with (
            timed_within(samples, "candidates.lexical", open_lexical_index(), "search"),
            timed_within(samples, "candidates.postgres", store, "candidates"),
        ):
            pool = timed(
                samples,
                "candidates",
                gather,
                [(query, 1.0)],
                "hybrid",
                image_hash=None,
                document_ids=None,
                kinds=None,
                metadata=None,
                retrieval=config.retrieval,
                embedding=config.embedding,
            )
        query_vectors.cache_clear()  # the content query's embedding, kept from the search above, counts here
        table = timed(samples, "features", describe, pool, model, precision)
        scores = timed(samples, "score", ranker.score, table.matrix)
        timed(samples, "collapse_and_cut", ranked, Scored(pool, table, scores), 5)
    # questions that point into a document: the chunks they point at are read too (on every document
    # of the index: no document is named); the bench's chunks record their page, not printed page names
    for number, query in enumerate(queries[:20]):
        pointer = POINTERS[number % len(POINTERS)]
        timed(samples, "search_pointing_end_to_end", search, f"{' '.join(query.split()[:6])} {pointer}", k=5)
    trips = []
    for query in queries[:10]:
        with round_trips() as counted:
            search(query, k=5)
        trips.append(counted[0])
    report["ms"] = {name: percentiles(values) for name, values in samples.items()}
    parts = sum(
        statistics.median(values)
        for name, values in samples.items()
        if "end_to_end" not in name and "." not in name  # a sub-stage is inside its stage
    )
    report["parts_p50_sum_ms"] = round(parts * 1000, 1)
    report["end_to_end_over_parts"] = round(statistics.median(samples["search_end_to_end"]) / parts, 2)
    report["postgres_round_trips_per_search"] = sorted(set(trips))
    report["hnsw_content_scan"] = hnsw_recall(
        store,
        encode(queries, model, precision=precision),
        config.retrieval.candidates,
        tuple(sorted({40, config.retrieval.ef_search, 200, 400})),
    )
    report["load_average"] = [round(x, 2) for x in os.getloadavg()]
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
