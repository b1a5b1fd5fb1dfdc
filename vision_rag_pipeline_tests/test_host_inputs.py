"""Per-host inputs: the embedding model by its files' content and the OCR languages with their models,
and a host whose inputs differ from the launching host's fails the step instead of writing other
output under the same version."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import dagster as dg
import pytest

from vision_rag_pipeline.cli import SAMPLES
from vision_rag_pipeline.core.config import RagConfig
from vision_rag_pipeline.core.content_hash import directory_sha256
from vision_rag_pipeline.defs.definitions import defs
from vision_rag_pipeline.defs.host_inputs import (
    EMBEDDING_MODEL,
    HOST_INPUTS_TAG,
    OCR_LANGUAGES,
    embedding_model_sha256,
    host_input_tags,
    host_inputs,
)
from vision_rag_pipeline.defs.partitions import documents_partitions
from vision_rag_pipeline.defs.versions import embedding_version
from vision_rag_pipeline.documents.registry import DocumentRegistry
from vision_rag_pipeline.embeddings.encoder import model_directory
from vision_rag_pipeline.enrichment import ocr
from vision_rag_pipeline.enrichment.languages import language_fingerprint


@pytest.fixture
def model_copies(tmp_path: Path) -> tuple[Path, Path]:
    """The bundled model's small files (not the weights) under two paths, as two hosts keep them."""
    source = model_directory("all-MiniLM-L6-v2")
    assert source is not None
    copies = []
    for name in ("host_a", "host_b"):
        target = tmp_path / name / "model"
        shutil.copytree(source, target, ignore=shutil.ignore_patterns("*.safetensors", "*.bin"))
        copies.append(target)
    return copies[0], copies[1]


def test_the_same_files_under_two_paths_have_one_hash_and_one_embedding_version(
    model_copies: tuple[Path, Path], vision_rag_home: Path
) -> None:
    host_a, host_b = model_copies
    assert directory_sha256(host_a) == directory_sha256(host_b)
    versions = {
        embedding_version(RagConfig.model_validate({"embedding": {"model": str(m)}})) for m in model_copies
    }
    assert len(versions) == 1, "hosts keeping the model under different paths agree on what is stale"


def test_a_changed_file_changes_the_hash_and_the_version(
    model_copies: tuple[Path, Path], vision_rag_home: Path
) -> None:
    host_a, host_b = model_copies
    before = embedding_version(RagConfig.model_validate({"embedding": {"model": str(host_b)}}))
    config = host_b / "config.json"
    config.write_text(config.read_text().replace("384", "385"))
    assert directory_sha256(host_a) != directory_sha256(host_b)
    embedding_model_sha256.cache_clear()  # a new process would hash again
    after = embedding_version(RagConfig.model_validate({"embedding": {"model": str(host_b)}}))
    assert after != before


def test_the_hash_is_remembered_by_the_files_stat(
    model_copies: tuple[Path, Path], vision_rag_home: Path
) -> None:
    host_a, _ = model_copies
    digest = directory_sha256(host_a)
    cache = json.loads((vision_rag_home / "cache" / "content-sha256.json").read_text())
    assert digest in cache.values()


def test_runs_of_the_asset_jobs_carry_the_launching_hosts_inputs() -> None:
    expected = host_input_tags()
    assert json.loads(expected[HOST_INPUTS_TAG]) == host_inputs(RagConfig())
    for job in ("ingest_document", "reenrich"):
        assert defs.resolve_job_def(job).run_tags[HOST_INPUTS_TAG] == expected[HOST_INPUTS_TAG]


def _run_launched_with(launching: dict[str, str]) -> tuple[str, str, set[str]]:
    """Ingest a sample in this process as if another host with these inputs had launched the run:
    (the step that failed, its message, the assets materialized)."""
    path = SAMPLES / "larkspur_q3_2024_operations_review.pdf"
    document_id = DocumentRegistry().register(path).document_id
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions(documents_partitions.name, [document_id])
        result = defs.resolve_job_def("ingest_document").execute_in_process(
            instance=instance,
            partition_key=document_id,
            tags={HOST_INPUTS_TAG: json.dumps(launching)},
            raise_on_error=False,
        )
        assert not result.success
        [failure] = [event for event in result.all_events if event.is_step_failure]
        error = failure.step_failure_data.error
        message = " ".join(e.message for e in (error, error.cause) if e is not None)
        materialized = {e.asset_key.to_user_string() for e in result.get_asset_materialization_events()}
        return failure.step_key, message, materialized


def test_a_host_with_other_model_files_fails_the_embedding_step_and_records_nothing(pg_url: str) -> None:
    # the files of the host that launched the run
    step, message, materialized = _run_launched_with({EMBEDDING_MODEL: "0" * 64})
    assert step == "chunk_embeddings"
    assert "embedding_model" in message and "differs from the launching host's" in message
    assert "chunk_embeddings" not in materialized and "pgvector_index" not in materialized


def test_the_ocr_languages_are_a_host_input_by_name_and_by_their_models(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    auto = language_fingerprint("auto")
    assert auto.startswith("auto+eng+") and host_inputs(RagConfig())[OCR_LANGUAGES] == auto
    listed = language_fingerprint(["eng", "rus"])
    directory, installed = ocr._installed_tessdata()
    # a host without Russian: `auto` reads with less there, and a listed rus has no model there
    monkeypatch.setattr(ocr, "_installed_tessdata", lambda: (directory, installed - {"rus"}))
    ocr.traineddata_sha256.cache_clear()
    try:
        assert "rus" not in language_fingerprint("auto") and language_fingerprint("auto") != auto
        assert language_fingerprint(["eng", "rus"]) != listed
    finally:
        ocr.traineddata_sha256.cache_clear()


def test_a_host_with_other_ocr_languages_fails_the_enrichment_step_and_records_nothing(pg_url: str) -> None:
    step, message, materialized = _run_launched_with({OCR_LANGUAGES: "auto+eng+rus+chi_sim:0000000000000000"})
    assert step == "image_enrichments"
    assert "ocr_languages" in message and "differs from the launching host's" in message
    assert "image_enrichments" not in materialized and "document_chunks" not in materialized
