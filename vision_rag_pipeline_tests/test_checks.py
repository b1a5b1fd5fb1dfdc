"""Asset checks: a broken hand-off fails its check, and a blocking failure stops what comes after it."""

import dagster as dg
import numpy as np
import pytest

from vision_rag_pipeline.chunks.annotations import annotation, broken_annotation_offsets
from vision_rag_pipeline.chunks.model import Chunk
from vision_rag_pipeline.defs.checks import (
    ANNOTATIONS_WHOLE,
    EVERY_CHUNK_EMBEDDED,
    PGVECTOR_ROWS_MATCH_CHUNKS,
    annotations_whole,
    every_chunk_embedded,
    rows_match_chunks,
)
from vision_rag_pipeline.defs.definitions import defs
from vision_rag_pipeline.defs.indexes import no_orphan_rows, pgvector_index
from vision_rag_pipeline.defs.partitions import documents_partitions
from vision_rag_pipeline.defs.resources import IndexDatabase, LexicalIndexResource
from vision_rag_pipeline.embeddings.model import ChunkEmbeddings
from vision_rag_pipeline.enrichment.batch import EnrichmentBatch
from vision_rag_pipeline.indexes.pgvector_store import PgVectorStore

DIM = 384
WHOLE = "Revenue chart: " + annotation("Bar chart of Q3 revenue [USD]", "images/rev (1).png") + " end."


def chunk(document_id: str, index: int, text: str) -> Chunk:
    return Chunk(
        chunk_id=f"{document_id}:{index}", document_id=document_id, index=index, kind="text", text=text
    )


def unit_vectors(n: int) -> np.ndarray:
    vectors = np.random.default_rng(n).normal(size=(n, DIM)).astype(np.float32)
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


@pytest.fixture
def instance():
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions(documents_partitions.name, ["doc-a"])
        yield instance


def test_whole_annotations_pass_and_cut_ones_are_found():
    assert broken_annotation_offsets(WHOLE) == []
    cut = WHOLE[: WHOLE.index("](") + 4]
    assert broken_annotation_offsets(cut) == [WHOLE.index("![")]
    assert broken_annotation_offsets("no images here") == []


def run(instance, chunks: list[Chunk], vectors: np.ndarray):
    """document_chunks → chunk_embeddings → pgvector_index stand-ins carrying the real checks."""
    downstream_ran = []

    @dg.asset(
        name="document_chunks",
        partitions_def=documents_partitions,
        dagster_type=list[Chunk],
        check_specs=[ANNOTATIONS_WHOLE],
    )
    def fake_chunks() -> dg.MaterializeResult:
        return dg.MaterializeResult(value=chunks, check_results=[annotations_whole(chunks)])

    @dg.asset(
        name="chunk_embeddings",
        partitions_def=documents_partitions,
        deps=["document_chunks"],
        dagster_type=ChunkEmbeddings,
        check_specs=[EVERY_CHUNK_EMBEDDED],
    )
    def fake_embeddings() -> dg.MaterializeResult:
        return dg.MaterializeResult(
            value=ChunkEmbeddings(model="test", dim=DIM, vectors=vectors),
            check_results=[every_chunk_embedded(chunks, vectors, DIM)],
        )

    @dg.asset(name="pgvector_index", partitions_def=documents_partitions, deps=["chunk_embeddings"])
    def fake_index() -> None:
        downstream_ran.append(True)

    result = dg.materialize(
        [fake_chunks, fake_embeddings, fake_index],
        partition_key="doc-a",
        instance=instance,
        raise_on_error=False,
    )
    checks = {e.check_name: e.passed for e in result.get_asset_check_evaluations()}
    assert all(e.partition == "doc-a" for e in result.get_asset_check_evaluations())
    return checks, bool(downstream_ran)


def test_good_chunks_and_vectors_pass_and_flow_on(instance):
    chunks = [chunk("doc-a", 0, WHOLE), chunk("doc-a", 1, "plain text")]
    assert run(instance, chunks, unit_vectors(2)) == (
        {"annotations_whole": True, "every_chunk_embedded": True},
        True,
    )


def test_a_cut_annotation_blocks_embedding_and_indexing(instance):
    chunks = [chunk("doc-a", 0, WHOLE[: WHOLE.index("](") + 3])]
    checks, downstream_ran = run(instance, chunks, unit_vectors(1))
    assert checks == {"annotations_whole": False}  # nothing after it ran, its check included
    assert not downstream_ran


def test_missing_or_broken_vectors_block_indexing(instance):
    chunks = [chunk("doc-a", i, f"text {i}") for i in range(3)]
    checks, downstream_ran = run(instance, chunks, unit_vectors(2))
    assert checks == {"annotations_whole": True, "every_chunk_embedded": False} and not downstream_ran

    zero_row = unit_vectors(3)
    zero_row[1] = 0
    checks, downstream_ran = run(instance, chunks, zero_row)
    assert checks["every_chunk_embedded"] is False and not downstream_ran


def test_ingest_runs_the_document_checks_inside_their_assets_and_not_the_orphan_check():
    ingest = defs.resolve_job_def("ingest_document")
    assert sorted(node.name for node in ingest.graph.nodes) == sorted(
        key.to_user_string() for key in ingest.asset_layer.executable_asset_keys
    ), "one step per asset: no separate check steps"
    specs = {spec.name: spec for asset in defs.assets for spec in asset.check_specs}
    assert {name for name, spec in specs.items() if spec.blocking} == {
        "annotations_whole",
        "every_chunk_embedded",
    }
    assert {"pgvector_rows_match_chunks", "lexical_rows_match_chunks"} <= specs.keys()
    audit = defs.resolve_job_def("audit_indexes")
    assert [node.name for node in audit.graph.nodes] == ["lexical_index_no_orphan_rows"]


def test_pgvector_row_count_is_checked_against_the_chunk_count(instance, pg_url):
    chunks = [chunk("doc-a", i, f"text {i}") for i in range(3)]

    # a partitioned asset's value is {partition: the document's value} (defs/partitions.py)
    @dg.asset(name="document_chunks", partitions_def=documents_partitions)
    def fake_chunks() -> dict[str, list[Chunk]]:
        return {"doc-a": chunks}

    @dg.asset(name="chunk_embeddings", partitions_def=documents_partitions)
    def fake_embeddings() -> dict[str, ChunkEmbeddings]:
        return {"doc-a": ChunkEmbeddings(model="test", dim=DIM, vectors=unit_vectors(3))}

    @dg.asset(name="image_enrichments", partitions_def=documents_partitions)
    def fake_enrichments() -> dict[str, EnrichmentBatch]:
        return {"doc-a": EnrichmentBatch()}

    result = dg.materialize(
        [fake_chunks, fake_embeddings, fake_enrichments, pgvector_index],
        partition_key="doc-a",
        instance=instance,
        resources={"index_db": IndexDatabase(), "lexical": LexicalIndexResource()},
    )
    [evaluation] = result.get_asset_check_evaluations()
    assert evaluation.partition == "doc-a", "a run of one document records the check for its partition"
    assert evaluation.check_name == PGVECTOR_ROWS_MATCH_CHUNKS.name and evaluation.passed
    assert PgVectorStore(DIM).count("doc-a") == 3
    assert (
        evaluation.metadata["rows_missing"].value == 0
    )  # the one number plotted: same scale for every document
    assert evaluation.metadata["rows"].value == "3 index rows for 3 chunks"

    failed = rows_match_chunks(PGVECTOR_ROWS_MATCH_CHUNKS, index_rows=2, chunks=3)
    assert not failed.passed and failed.metadata["rows_missing"].value == 1
    PgVectorStore(DIM).delete_document("doc-a")


def test_a_batch_passes_a_check_when_every_document_does_and_names_those_that_do_not():
    """Dagster records one evaluation per check and step: a batch's is the conjunction."""
    from vision_rag_pipeline.defs.partitions import batch_check

    good = rows_match_chunks(PGVECTOR_ROWS_MATCH_CHUNKS, index_rows=3, chunks=3)
    bad = rows_match_chunks(PGVECTOR_ROWS_MATCH_CHUNKS, index_rows=2, chunks=3)
    assert batch_check({"a": good}) is good, "one document keeps its own result"
    combined = batch_check({"a": good, "b": bad, "c": good})
    assert not combined.passed and combined.metadata["failed_documents"].value == ["b"]
    assert batch_check({"a": good, "c": good}).passed


def test_rows_of_unregistered_documents_are_reported_as_orphans(instance, pg_url):
    PgVectorStore(DIM).replace_document("ghost-doc", [chunk("ghost-doc", 0, "boo")], unit_vectors(1))

    @dg.asset(name="lexical_index")
    def fake_lexical() -> None:
        return None

    result = dg.materialize(
        [fake_lexical, no_orphan_rows],
        instance=instance,
        resources={"index_db": IndexDatabase(), "lexical": LexicalIndexResource()},
    )
    [evaluation] = result.get_asset_check_evaluations()
    assert not evaluation.passed and evaluation.severity == dg.AssetCheckSeverity.WARN
    assert "ghost-doc" in evaluation.metadata["pgvector"].value
    PgVectorStore(DIM).delete_document("ghost-doc")
