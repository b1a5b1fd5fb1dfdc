"""Reindex: both indexes rebuilt aside and swapped in while searches keep answering."""

import threading

import numpy as np
import pytest

from vision_rag_pipeline.chunks.model import Chunk
from vision_rag_pipeline.indexes.pgvector_store import PgVectorStore, rebuild_tables
from vision_rag_pipeline.indexes.reindex import rebuild_lexical, vector_dimension
from vision_rag_pipeline.indexes.tantivy_index import open_tantivy_index

DIM = 16
DOCUMENTS = 6
CHUNKS_PER_DOCUMENT = 40


def chunks_of(document_id: str) -> list[Chunk]:
    return [
        Chunk(
            chunk_id=f"{document_id}:{i}",
            document_id=document_id,
            index=i,
            kind="text",
            text=f"quarterly revenue report {document_id} section {i}",
        )
        for i in range(CHUNKS_PER_DOCUMENT)
    ]


def unit(vectors: np.ndarray) -> np.ndarray:
    return (vectors / np.linalg.norm(vectors, axis=1, keepdims=True)).astype(np.float32)


@pytest.fixture
def populated(fresh_database: str, tmp_path):
    store = PgVectorStore(DIM, fresh_database)
    rng = np.random.default_rng(7)
    for d in range(DOCUMENTS):
        store.replace_document(
            f"doc{d}", chunks_of(f"doc{d}"), unit(rng.normal(size=(CHUNKS_PER_DOCUMENT, DIM)))
        )
    lexical = open_tantivy_index(tmp_path / "lexical")
    rebuild_lexical(lexical, fresh_database)
    return store, lexical


def search_until(stop: threading.Event, store: PgVectorStore, lexical, outcomes: list) -> None:
    query = unit(np.ones((1, DIM)))[0]
    while not stop.is_set():
        try:
            outcomes.append(
                (len(store.candidates([query], 5).nearest[0]), len(lexical.search("quarterly revenue", 5)))
            )
        except Exception as exc:  # any error during the swap is the failure this test is about
            outcomes.append(exc)


def test_searches_answer_throughout_a_rebuild_and_swap(populated, fresh_database):
    store, lexical = populated
    before = set(store.candidates(unit(np.ones((1, DIM))), 20).nearest[0])
    stop, outcomes = threading.Event(), []
    searcher = threading.Thread(target=search_until, args=(stop, store, lexical, outcomes))
    searcher.start()
    try:
        for _ in range(3):
            vector_report = rebuild_tables(fresh_database)
            lexical_docs = rebuild_lexical(lexical, fresh_database)
    finally:
        stop.set()
        searcher.join()

    assert outcomes and all(outcome == (5, 5) for outcome in outcomes), [o for o in outcomes if o != (5, 5)][
        :3
    ]
    assert vector_report.chunks == lexical_docs == DOCUMENTS * CHUNKS_PER_DOCUMENT
    assert not vector_report.reembedded
    assert set(store.candidates(unit(np.ones((1, DIM))), 20).nearest[0]) == before  # vectors copied
    assert lexical.count() == DOCUMENTS * CHUNKS_PER_DOCUMENT


def test_writes_during_a_rebuild_land_in_the_new_table(populated, fresh_database):
    store, _ = populated
    rebuild_tables(fresh_database)
    store.replace_document("doc0", chunks_of("doc0")[:3], unit(np.ones((3, DIM))))
    assert store.count("doc0") == 3 and store.count() == (DOCUMENTS - 1) * CHUNKS_PER_DOCUMENT + 3


def test_a_new_embedding_model_re_embeds_into_a_table_of_its_dimension(populated, fresh_database):
    store, _ = populated
    new_dim = 8
    embedded: list[str] = []

    def embed(texts: list[str]) -> np.ndarray:
        embedded.extend(texts)
        return unit(np.arange(1, new_dim + 1, dtype=np.float32)[None, :].repeat(len(texts), axis=0))

    report = rebuild_tables(fresh_database, embed=embed, dim=new_dim)

    assert report.reembedded and report.dim == new_dim == vector_dimension(fresh_database)
    assert len(embedded) == report.chunks == DOCUMENTS * CHUNKS_PER_DOCUMENT
    hits = PgVectorStore(new_dim, fresh_database).candidates(unit(np.ones((1, new_dim))), 3).nearest[0]
    assert len(hits) == 3
