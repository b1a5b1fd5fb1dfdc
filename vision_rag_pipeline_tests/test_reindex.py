"""Reindex: both indexes rebuilt aside and swapped in while searches keep answering."""

import json
import shutil
import threading
from pathlib import Path

import numpy as np
import pytest

from vision_rag_pipeline.chunks.model import Chunk
from vision_rag_pipeline.core.postgres import connect
from vision_rag_pipeline.indexes.pgvector_store import HNSW_EF_CONSTRUCTION, PgVectorStore, rebuild_tables
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


def chunk_indexes(url: str) -> set[str]:
    with connect(url) as conn:
        return {row[0] for row in conn.execute("SELECT indexname FROM pg_indexes WHERE tablename = 'chunks'")}


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


def hnsw_definitions(url: str) -> list[str]:
    with connect(url) as conn:
        return [
            row[0]
            for row in conn.execute(
                "SELECT indexdef FROM pg_indexes WHERE tablename = 'chunks' AND indexdef LIKE '%hnsw%'"
            )
        ]


def test_a_rebuild_gives_an_index_built_at_pgvectors_default_breadth_the_wider_graph(
    populated, fresh_database
):
    """README: an HNSW index built before keeps its graph until `vision-rag reindex`."""
    with connect(fresh_database) as conn:  # as an earlier version built it
        conn.execute("DROP INDEX chunks_embedding_hnsw")
        conn.execute(
            "CREATE INDEX chunks_embedding_hnsw ON chunks USING hnsw (embedding vector_cosine_ops) WHERE kind <> 'page'"
        )
    assert (
        sum(f"ef_construction='{HNSW_EF_CONSTRUCTION}'" in d for d in hnsw_definitions(fresh_database)) == 1
    )
    rebuild_tables(fresh_database)
    definitions = hnsw_definitions(fresh_database)
    assert len(definitions) == 2  # content chunks' and page units'
    assert all(f"ef_construction='{HNSW_EF_CONSTRUCTION}'" in d for d in definitions), definitions


def test_a_new_embedding_model_re_embeds_into_a_table_of_its_dimension(populated, fresh_database):
    store, _ = populated
    new_dim = 8
    embedded: list[str] = []

    def embed(texts: list[str]) -> np.ndarray:
        embedded.extend(texts)
        return unit(np.arange(1, new_dim + 1, dtype=np.float32)[None, :].repeat(len(texts), axis=0))

    indexes_before = chunk_indexes(fresh_database)
    report = rebuild_tables(fresh_database, embed=embed, dim=new_dim)

    assert report.reembedded and report.dim == new_dim == vector_dimension(fresh_database)
    # the swapped-in table keeps every index under its own name (a missing one: searches scan rows)
    assert chunk_indexes(fresh_database) == indexes_before
    with connect(fresh_database) as conn:  # a vector stays in its row, not in the TOAST table
        storage = conn.execute(
            "SELECT attstorage FROM pg_attribute WHERE attrelid = 'chunks'::regclass AND attname = 'embedding'"
        ).fetchone()[0]
    assert storage == "m"
    assert len(embedded) == report.chunks == DOCUMENTS * CHUNKS_PER_DOCUMENT
    hits = PgVectorStore(new_dim, fresh_database).candidates(unit(np.ones((1, new_dim))), 3).nearest[0]
    assert len(hits) == 3


def _retrained_minilm(folder: Path) -> Path:
    """Another model of MiniLM's dimension: the bundled one with one layer's weights changed."""
    from safetensors.torch import load_file, save_file

    from vision_rag_pipeline.embeddings.encoder import model_directory

    shutil.copytree(model_directory("all-MiniLM-L6-v2"), folder)
    weights = load_file(str(folder / "model.safetensors"))
    name = next(key for key in weights if key.endswith("layer.5.output.dense.weight"))
    weights[name] = weights[name] * 0.5
    save_file(weights, str(folder / "model.safetensors"))
    return folder


@pytest.mark.parametrize("swap", ["model", "precision"])
def test_reindex_re_embeds_vectors_of_another_model_of_the_same_dimension(
    swap, fresh_database, tmp_path, monkeypatch, capsys
):
    """The README promises a re-embedding when the embedding model changed; a swap that keeps the
    dimension (another 384-dimensional model, or MiniLM at another precision) used to keep the old
    vectors, which no query embedded by the new model is comparable with."""
    from vision_rag_pipeline.chunks.model import embedding_text
    from vision_rag_pipeline.cli import SAMPLES, main
    from vision_rag_pipeline.core.config import config_in_effect
    from vision_rag_pipeline.core.postgres import connect
    from vision_rag_pipeline.embeddings.encoder import encode

    document = tmp_path / "swap.pdf"
    document.write_bytes((SAMPLES / "larkspur_q3_2024_operations_review.pdf").read_bytes() + b"\n%swap\n")
    config = tmp_path / "rag.json"
    monkeypatch.setenv("VISION_RAG_PG_URL", fresh_database)
    monkeypatch.setenv("VISION_RAG_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("VISION_RAG_CONFIG", str(config))
    config.write_text(json.dumps({"embedding": {"precision": "float32"}}))
    assert main(["ingest", str(document), "--json"]) == 0

    def stored() -> tuple[list[str], np.ndarray]:
        with connect(fresh_database) as conn:
            rows = conn.execute(
                "SELECT kind, text, metadata->>'title', embedding FROM chunks WHERE kind <> 'page' ORDER BY chunk_id"
            ).fetchall()
        return [embedding_text(k, t, title or "") for k, t, title, _ in rows], np.stack(
            [e.to_numpy() for *_, e in rows]
        )

    texts, before = stored()
    assert np.allclose(before, encode(texts, "all-MiniLM-L6-v2", precision="float32"), atol=1e-5)
    new = (
        {"model": str(_retrained_minilm(tmp_path / "minilm-retrained")), "precision": "float32"}
        if swap == "model"
        else {"precision": "int8"}
    )
    config.write_text(json.dumps({"embedding": new}))
    config_in_effect.cache_clear()  # the next `vision-rag` process reads the edited file
    capsys.readouterr()
    assert main(["reindex", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["vector"]["reembedded"], "a model of the same dimension is re-embedded too"
    _, after = stored()
    model = new.get("model", "all-MiniLM-L6-v2")
    assert np.allclose(after, encode(texts, model, precision=new["precision"]), atol=1e-5)
    assert not np.allclose(after, before, atol=1e-3)

    assert main(["reindex", "--json"]) == 0
    again = json.loads(capsys.readouterr().out)
    assert not again["vector"]["reembedded"], "the vectors are now the configured model's: copied"


def test_a_query_is_embedded_as_the_indexed_documents_were(fresh_database):
    """A host resolving `auto` to another precision than the ingesting host's still embeds its
    queries at the precision of the indexed vectors."""
    from vision_rag_pipeline.core.config import EmbeddingConfig
    from vision_rag_pipeline.query.search import indexed_embedding

    store = PgVectorStore(DIM, fresh_database)
    configured = EmbeddingConfig(precision="float32")
    assert indexed_embedding(store, configured) == configured, "an empty index: as configured"
    for d, model in enumerate(["all-MiniLM-L6-v2@int8", "all-MiniLM-L6-v2@int8", "all-MiniLM-L6-v2"]):
        store.replace_document(f"doc{d}", chunks_of(f"doc{d}")[:2], unit(np.ones((2, DIM))), model=model)
    store.model_variant(max_age_s=0)
    assert indexed_embedding(store, configured).precision == "int8", "the variant of most documents"
    other = EmbeddingConfig(model="paraphrase-multilingual-MiniLM-L12-v2", precision="float32")
    assert indexed_embedding(store, other) == other, "another model's vectors: as configured"
    store.delete_document("doc0")
    store.delete_document("doc1")
    store.model_variant(max_age_s=0)
    assert indexed_embedding(store, configured) == configured
