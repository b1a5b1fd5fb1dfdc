"""Hybrid query latency at scale, beside the time of its parts.

    .venv/bin/python bench/bench_query_scale.py [--chunks 100000] [--queries 60] [--out /tmp/bench_query_scale]

Builds an index of `--chunks` chunks in a fresh VISION_RAG_HOME under `--out`: 1,000 documents
whose chunks are 3-8 sentences drawn from the text layers of `../shared/corpus`'s PDFs. Each
distinct sentence is embedded once with the configured model; a chunk's vector is the normalized
mean of its sentences' vectors (encoding 100k chunks would take ~40 min here), so the vectors lie
where real ones do. Chunks go through `PgVectorStore.replace_document` (HNSW maintained on insert)
and tantivy's `rebuild`.

Then, warm, for each query (a corpus sentence cut to its first 8 words): `search()` end to end
(hybrid, k=5) and, separately, its parts: query embedding, BM25, the one Postgres statement (pgvector
kNN and the rows of its hits and BM25's), fusion, the rerank's content-query embedding, its cosine
similarities and term matches. Prints one JSON object with p50 and p95 in ms, and the Postgres round
trips one `search()` makes (counted in libpq's protocol trace).
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

DOCUMENTS = 1000
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


def build_index(store, sentences: list[str], vectors: np.ndarray, chunks: int, rng: random.Random) -> float:
    """Writes the chunks into `store` (a PgVectorStore) and tantivy; returns the seconds it took."""
    from vision_rag_pipeline.chunks.model import Chunk
    from vision_rag_pipeline.indexes.lexical import LexicalDoc
    from vision_rag_pipeline.indexes.lexical_backend import open_lexical_index

    per_document = chunks // DOCUMENTS
    lexical: list[LexicalDoc] = []
    started = time.perf_counter()
    for number in range(DOCUMENTS):
        document_id = f"doc-{number:04d}"
        picks = [rng.sample(range(len(sentences)), rng.randint(3, 8)) for _ in range(per_document)]
        batch = [
            Chunk(
                chunk_id=f"{document_id}:{index}",
                document_id=document_id,
                index=index,
                kind="text",
                text=" ".join(sentences[i] for i in pick),
                page=index // 4 + 1,
                metadata={"title": f"Document {number}"},
            )
            for index, pick in enumerate(picks)
        ]
        means = np.stack([vectors[pick].mean(axis=0) for pick in picks])
        store.replace_document(document_id, batch, means / np.linalg.norm(means, axis=1, keepdims=True))
        lexical += [LexicalDoc.of(chunk) for chunk in batch]
    open_lexical_index().rebuild(lexical)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chunks", type=int, default=100_000)
    parser.add_argument("--queries", type=int, default=60)
    parser.add_argument("--corpus", type=Path, default=DEFAULT_CORPUS)
    parser.add_argument("--out", type=Path, default=Path("/tmp/bench_query_scale"))
    parser.add_argument("--keep", action="store_true", help="reuse the index built by an earlier run")
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
    from vision_rag_pipeline.indexes.lexical_backend import open_lexical_index
    from vision_rag_pipeline.query.search import (
        Ranking,
        content_query,
        cosine_similarities,
        fuse,
        match_scores,
        search,
        vector_store,
    )

    rng = random.Random(5)
    sentences = corpus_sentences(args.corpus)
    config = config_in_effect().config
    model, precision = config.embedding.model, config.embedding.precision
    report: dict = {"chunks": args.chunks, "documents": DOCUMENTS, "sentences": len(sentences)}
    store = vector_store(model)
    if not args.keep or store.count() == 0:
        started = time.perf_counter()
        vectors = encode(sentences, model, precision=precision)
        report["sentence_encoding_seconds"] = round(time.perf_counter() - started, 1)
        report["index_build_seconds"] = round(build_index(store, sentences, vectors, args.chunks, rng), 1)
    report["indexed_chunks"] = store.count()
    queries = [" ".join(sentence.split()[:8]) for sentence in rng.sample(sentences, args.queries)]
    retrieval = config.retrieval
    pool = max(5, retrieval.candidates)
    lexical = open_lexical_index()
    for query in queries[:5]:  # warm-up: model, connections, index readers, caches
        search(query, k=5)
    samples: dict[str, list[float]] = {}
    for query in queries:
        timed(samples, "search_end_to_end", search, query, k=5)
        [vector] = timed(samples, "query_embedding", encode, [query], model, precision=precision)
        hits = timed(samples, "bm25", lexical.search, query, pool)
        found = timed(
            samples,
            "pgvector_knn_and_rows",
            store.candidates,
            [vector],
            pool,
            [hit.chunk_id for hit in hits],
            ef_search=retrieval.ef_search,
        )
        scores = {hit.chunk_id: hit.score for hit in hits}
        rankings = [
            Ranking(found.nearest[0], retrieval.vector_weight),
            Ranking(scores, retrieval.lexical_weight),
        ]
        fused = timed(samples, "fusion", fuse, rankings, retrieval)
        ranked = sorted(fused, key=fused.__getitem__, reverse=True)[: 2 * max(5, retrieval.rerank_depth)]
        head = [cid for cid in ranked if cid in found.chunks][: retrieval.rerank_depth]
        texts = {cid: found.chunks[cid].text for cid in head}
        titles = {cid: str(found.chunks[cid].metadata.get("title") or "") for cid in head}
        asked = content_query(query, [f"{titles[cid]} {texts[cid]}" for cid in head])
        [asked_vector] = timed(samples, "rerank_embedding", encode, [asked], model, precision=precision)
        embeddings = {cid: found.embeddings[cid] for cid in head}
        timed(samples, "rerank_similarities", cosine_similarities, asked_vector, embeddings)
        timed(samples, "rerank_matches", match_scores, query, texts, titles)
    trips = []
    for query in queries[:10]:
        with round_trips() as counted:
            search(query, k=5)
        trips.append(counted[0])
    report["ms"] = {name: percentiles(values) for name, values in samples.items()}
    parts = sum(statistics.median(values) for name, values in samples.items() if name != "search_end_to_end")
    report["parts_p50_sum_ms"] = round(parts * 1000, 1)
    report["end_to_end_over_parts"] = round(statistics.median(samples["search_end_to_end"]) / parts, 2)
    report["postgres_round_trips_per_search"] = sorted(set(trips))
    report["load_average"] = [round(x, 2) for x in os.getloadavg()]
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
