"""The inbox sensor (add, change, touch, delete, ignore) and the version sensor, driven tick by tick."""

import json
import os
import shutil
from pathlib import Path

import dagster as dg
import numpy as np
import pytest

from vision_rag_pipeline.chunks.model import Chunk
from vision_rag_pipeline.defs.documents import inbox_sensor
from vision_rag_pipeline.defs.partitions import documents_partitions
from vision_rag_pipeline.defs.resources import IndexDatabase
from vision_rag_pipeline.defs.versions import CODE_VERSION_TAG, version_sensor
from vision_rag_pipeline.documents.inbox import INBOX_ENV
from vision_rag_pipeline.documents.registry import DocumentRegistry, document_id_for
from vision_rag_pipeline.indexes.lexical import LexicalDoc
from vision_rag_pipeline.indexes.lexical_backend import open_lexical_index
from vision_rag_pipeline.indexes.pgvector_store import PgVectorStore

SAMPLES = Path(__file__).resolve().parents[1] / "vision_rag_pipeline" / "samples"
PDF = SAMPLES / "larkspur_q3_2024_operations_review.pdf"
MHTML = SAMPLES / "larkspur_q3_2024_report.mhtml"
DIM = 384  # the session's chunks table is shared with the pipeline tests (all-MiniLM-L6-v2)


@pytest.fixture
def instance():
    with dg.instance_for_test() as instance:
        yield instance


@pytest.fixture
def inbox(tmp_path, pg_url, monkeypatch) -> Path:
    path = tmp_path / "inbox"
    path.mkdir()
    monkeypatch.setenv(INBOX_ENV, str(path))
    return path


def tick(instance, cursor=None):
    from vision_rag_pipeline.definitions import defs

    context = dg.build_sensor_context(
        instance=instance, cursor=cursor, definitions=defs, resources={"index_db": IndexDatabase()}
    )
    return inbox_sensor(context)


def ingest_requests(result):
    return [r for r in result.run_requests if r.job_name == "ingest_document"]


def test_new_files_are_registered_partitioned_and_requested(instance, inbox):
    pdf = Path(shutil.copy(PDF, inbox))
    (inbox / "sub").mkdir()
    mhtml = Path(shutil.copy(MHTML, inbox / "sub"))

    result = tick(instance)

    expected = {document_id_for(pdf), document_id_for(mhtml)}
    assert {r.partition_key for r in ingest_requests(result)} == expected
    [add] = result.dynamic_partitions_requests
    assert isinstance(add, dg.AddDynamicPartitionsRequest)
    assert add.partitions_def_name == documents_partitions.name and set(add.partition_keys) == expected
    assert {DocumentRegistry().get(key).abs_path for key in expected} == {str(pdf), str(mhtml)}
    assert set(json.loads(result.cursor)["files"]) == {str(pdf), str(mhtml)}


def test_unchanged_and_touched_files_request_nothing(instance, inbox):
    pdf = Path(shutil.copy(PDF, inbox))
    first = tick(instance)
    assert not tick(instance, first.cursor).run_requests

    stat = pdf.stat()
    os.utime(pdf, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    touched = tick(instance, first.cursor)
    assert not touched.run_requests and not touched.dynamic_partitions_requests


def test_changed_content_re_runs_the_same_partition(instance, inbox):
    pdf = Path(shutil.copy(PDF, inbox))
    first = tick(instance)
    with pdf.open("ab") as handle:
        handle.write(b"\n% revised\n")

    second = tick(instance, first.cursor)

    [request] = ingest_requests(second)
    assert request.partition_key == document_id_for(pdf)
    assert request.tags["vision_rag/change"] == "changed"
    assert not tick(instance, second.cursor).run_requests


def test_files_that_are_not_documents_are_ignored(instance, inbox):
    (inbox / "notes.txt").write_text("hello")
    (inbox / "fake.pdf").write_text("not really a pdf")
    (inbox / ".partial.pdf").write_bytes(PDF.read_bytes())
    result = tick(instance)
    assert not result.run_requests and json.loads(result.cursor)["files"] == {}


def test_a_missing_inbox_is_skipped_not_read_as_everything_deleted(instance, inbox):
    shutil.copy(PDF, inbox)
    first = tick(instance)
    shutil.rmtree(inbox)
    assert isinstance(tick(instance, first.cursor), dg.SkipReason)


def test_a_deleted_file_loses_its_partition_and_its_rows_in_both_indexes(instance, inbox):
    pdf = Path(shutil.copy(PDF, inbox))
    first = tick(instance)
    document_id = document_id_for(pdf)
    chunks = [
        Chunk(
            chunk_id=f"{document_id}:{i}", document_id=document_id, index=i, kind="text", text=f"deleted {i}"
        )
        for i in range(3)
    ]
    vectors = np.random.default_rng(0).normal(size=(3, DIM)).astype(np.float32)
    store = PgVectorStore(DIM)
    store.replace_document(document_id, chunks, vectors)
    lexical = open_lexical_index()
    lexical.replace_document(
        document_id,
        [LexicalDoc(chunk_id=c.chunk_id, document_id=document_id, kind=c.kind, text=c.text) for c in chunks],
    )
    pdf.unlink()

    result = tick(instance, first.cursor)

    [delete] = result.dynamic_partitions_requests
    assert isinstance(delete, dg.DeleteDynamicPartitionsRequest) and delete.partition_keys == [document_id]
    [removal] = result.run_requests
    assert removal.job_name == "remove_document"
    from vision_rag_pipeline.definitions import defs

    run = defs.resolve_job_def("remove_document").execute_in_process(
        run_config=removal.run_config, instance=instance
    )
    assert run.success
    assert store.count(document_id) == 0 and lexical.count(document_id) == 0
    assert document_id not in {doc.document_id for doc in DocumentRegistry().all()}
    assert json.loads(result.cursor)["files"] == {}


# --- version sensor ---------------------------------------------------------------------------------------


def record(instance, asset: str, partition: str, version: str | None) -> None:
    tags = {CODE_VERSION_TAG: version} if version else {}
    instance.report_runless_asset_event(
        dg.AssetMaterialization(asset_key=asset, partition=partition, tags=tags)
    )


def current_versions() -> dict[str, str]:
    from vision_rag_pipeline.definitions import defs

    graph = defs.resolve_asset_graph()
    return {key.to_user_string(): graph.get(key).code_version for key in graph.materializable_asset_keys}


def version_tick(instance):
    from vision_rag_pipeline.definitions import defs

    return version_sensor(dg.build_sensor_context(instance=instance, definitions=defs))


def materialize_all(instance, partition: str, overrides: dict[str, str | None] = {}) -> None:  # noqa: B006
    for asset, version in current_versions().items():
        record(instance, asset, partition, overrides.get(asset, version))


def selections(result) -> dict[str, set[str]]:
    return {r.partition_key: {k.to_user_string() for k in r.asset_selection} for r in result.run_requests}


INDEX_HALF = {"document_chunks", "chunk_embeddings", "pgvector_index", "lexical_index"}


def test_nothing_is_requested_while_versions_match(instance):
    instance.add_dynamic_partitions(documents_partitions.name, ["a", "b"])
    materialize_all(instance, "a")
    materialize_all(instance, "b")
    assert not version_tick(instance).run_requests


def test_a_stale_enrichment_re_runs_enrichment_and_downstream_only(instance):
    instance.add_dynamic_partitions(documents_partitions.name, ["a", "b"])
    materialize_all(instance, "a", {"image_enrichments": "old-prompt"})
    materialize_all(instance, "b")

    first = version_tick(instance)

    assert selections(first) == {"a": {"image_enrichments"} | INDEX_HALF}
    # A later tick before the run lands asks for the same run (Dagster drops it by run key).
    assert [r.run_key for r in version_tick(instance).run_requests] == [first.run_requests[0].run_key]


def test_a_classifier_change_also_re_runs_verdicts_and_unversioned_history_counts_as_stale(instance):
    instance.add_dynamic_partitions(documents_partitions.name, ["a", "b"])
    materialize_all(instance, "a", {"image_verdicts": "old-threshold"})
    materialize_all(instance, "b", {"chunk_embeddings": None})
    assert selections(version_tick(instance)) == {
        "a": {"image_verdicts", "image_enrichments"} | INDEX_HALF,
        "b": {"chunk_embeddings", "pgvector_index"},
    }


def test_removed_partitions_are_left_alone(instance):
    instance.add_dynamic_partitions(documents_partitions.name, ["a"])
    materialize_all(instance, "a", {"image_enrichments": "old"})
    instance.delete_dynamic_partition(documents_partitions.name, "a")
    assert not version_tick(instance).run_requests
