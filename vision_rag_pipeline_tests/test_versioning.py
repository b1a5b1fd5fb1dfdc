"""Feature versions: a setting change moves exactly the versions of the assets it shapes."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from vision_rag_pipeline.core.config import RagConfig
from vision_rag_pipeline.defs.versions import (
    chunking_version,
    classifier_version,
    embedding_version,
    enrichment_version,
    loading_version,
)
from vision_rag_pipeline.embeddings import encoder

OFFLINE = "offline"
ENDPOINT = "openai:http://localhost:11434/v1"
VISION_MODEL_SETTINGS = (
    {"features": {"mllm": {"prompt": "List every figure in the image."}}},
    {"features": {"mllm": {"model": "gpt-4o-mini"}}},
    {"features": {"mllm": {"detail_mode": "high"}}},
    {"features": {"mllm": {"llm_kwargs": {"temperature": 0.2}}}},
    {"features": {"mllm": {"enabled": False}}},
    {"fusion": {"use_llm": False}},
    {"fusion": {"model": "gpt-4o-mini"}},
)


def versions(config: RagConfig, engine: str = OFFLINE) -> dict[str, str]:
    return {
        "loading": loading_version(),
        "classifier": classifier_version(config),
        "enrichment": enrichment_version(config, engine),
        "chunking": chunking_version(config),
        "embedding": embedding_version(config),
    }


def changed(before: RagConfig, after: RagConfig, engine: str = OFFLINE) -> set[str]:
    old, new = versions(before, engine), versions(after, engine)
    return {name for name in old if old[name] != new[name]}


def with_settings(**sections: dict) -> RagConfig:
    return RagConfig.model_validate(sections)


def test_versions_are_stable_for_equal_configs():
    assert versions(RagConfig()) == versions(RagConfig.model_validate(RagConfig().model_dump(mode="json")))


@given(st.text(min_size=1, max_size=200))
def test_a_prompt_change_moves_only_the_enrichment_version_with_a_vision_model(prompt):
    after = with_settings(media_enrichment={"features": {"mllm": {"prompt": prompt}}})
    expected = set() if prompt == RagConfig().media_enrichment.features.mllm.prompt else {"enrichment"}
    assert changed(RagConfig(), after, ENDPOINT) == expected


@pytest.mark.parametrize("settings", VISION_MODEL_SETTINGS)
def test_without_a_vision_model_its_settings_move_no_version(settings):
    """Offline, the prompt, model, detail and LLM-fusion settings reach no output: editing them must
    not re-read every image."""
    assert changed(RagConfig(), with_settings(media_enrichment=settings)) == set()


@pytest.mark.parametrize("settings", VISION_MODEL_SETTINGS)
def test_with_a_vision_model_its_settings_move_the_enrichment_version(settings):
    assert changed(RagConfig(), with_settings(media_enrichment=settings), ENDPOINT) == {"enrichment"}


@pytest.mark.parametrize("engine", [OFFLINE, ENDPOINT])
def test_ocr_languages_and_keyword_count_move_the_enrichment_version_for_any_engine(engine):
    for settings in ({"ocr": {"languages": ["eng", "chi_sim"]}}, {"fusion": {"max_keywords": 5}}):
        assert changed(RagConfig(), with_settings(media_enrichment=settings), engine) == {"enrichment"}


def test_a_new_fusion_revision_moves_only_the_enrichment_version(monkeypatch: pytest.MonkeyPatch):
    """Fusion's rules and its prompt live in code: bumping their revision must re-enrich (the version
    sensor's trigger), and nothing else."""
    from vision_rag_pipeline.enrichment import cache as module

    before = versions(RagConfig())
    monkeypatch.setattr(module, "FUSION_REVISION", module.FUSION_REVISION + 1)
    after = versions(RagConfig())
    assert {name for name in before if before[name] != after[name]} == {"enrichment"}


def test_a_new_loader_revision_moves_only_the_loading_version(monkeypatch: pytest.MonkeyPatch):
    """A loader change (a PDF's text layer read for its scans, pages rendered at another resolution)
    must reach documents loaded before it, which no setting would re-run."""
    from vision_rag_pipeline.defs import versions as module

    before = versions(RagConfig())
    monkeypatch.setattr(module, "LOADER_REVISION", module.LOADER_REVISION + 1)
    after = versions(RagConfig())
    assert {name for name in before if before[name] != after[name]} == {"loading"}


def test_switching_from_offline_to_a_vision_endpoint_re_enriches():
    config = RagConfig()
    assert enrichment_version(config, OFFLINE) != enrichment_version(config, ENDPOINT)


def test_the_ocr_languages_a_host_has_are_in_the_enrichment_version_under_auto(monkeypatch):
    from vision_rag_pipeline.enrichment import languages

    listed = with_settings(media_enrichment={"ocr": {"languages": ["eng", "rus"]}})
    monkeypatch.setattr(languages, "available_languages", lambda: {"eng", "rus", "chi_sim"})
    before = versions(RagConfig()), versions(listed)
    monkeypatch.setattr(languages, "available_languages", lambda: {"eng", "rus"})
    after = versions(RagConfig()), versions(listed)
    assert {name for name in before[0] if before[0][name] != after[0][name]} == {"enrichment"}
    assert before[1] == after[1]  # a listed language is required on every host instead


def test_a_new_lexical_analysis_rewrites_only_the_lexical_index(monkeypatch: pytest.MonkeyPatch):
    from vision_rag_pipeline.defs import versions as module

    before = module.lexical_version(), versions(RagConfig())
    monkeypatch.setattr(module, "LEXICAL_ANALYSIS_REVISION", module.LEXICAL_ANALYSIS_REVISION + 1)
    assert module.lexical_version() != before[0] and versions(RagConfig()) == before[1]


def test_classifier_threshold_moves_only_the_classifier_version():
    after = with_settings(media_enrichment={"features": {"classifier": {"threshold": 0.5}}})
    assert changed(RagConfig(), after) == {"classifier"}


def test_splitter_and_embedding_model_move_their_own_versions():
    assert changed(RagConfig(), with_settings(splitter={"chunk_size": 500})) == {"chunking"}
    assert changed(RagConfig(), with_settings(loader={"separate_docs_for_images": True})) == {"chunking"}
    assert changed(RagConfig(), with_settings(embedding={"model": "/models/e5-small"})) == {"embedding"}


def test_embedding_precision_moves_only_the_embedding_version():
    float32, bfloat16 = (with_settings(embedding={"precision": p}) for p in ("float32", "bfloat16"))
    assert changed(float32, bfloat16) == {"embedding"}


def test_auto_precision_has_one_version_whatever_the_cpu(monkeypatch):
    """Nodes with and without native bfloat16 must agree on what is stale."""
    auto = RagConfig()
    assert auto.embedding.precision == "auto"
    versions = set()
    for native in (True, False):
        monkeypatch.setattr(encoder, "_cpu_has_native_bfloat16", lambda native=native: native)
        versions.add(embedding_version(auto))
    assert len(versions) == 1
    for pinned in ("float32", "bfloat16", "int8"):
        assert changed(auto, with_settings(embedding={"precision": pinned})) == {"embedding"}


def test_what_auto_picks_and_the_int8_scheme_are_in_the_embedding_version(monkeypatch):
    """An upgrade that makes `auto` stand for another precision, or quantizes otherwise, must
    re-embed what the previous code embedded (once: the cache is keyed by variant)."""
    auto, int8 = RagConfig(), with_settings(embedding={"precision": "int8"})
    before = embedding_version(auto), embedding_version(int8)
    monkeypatch.setattr(encoder, "AUTO_PRECISION", "bfloat16")
    assert embedding_version(auto) != before[0] and embedding_version(int8) == before[1]
    monkeypatch.setattr(encoder, "INT8_SCHEME", "per-tensor")
    assert embedding_version(int8) != before[1]
    monkeypatch.setattr(encoder, "AUTO_PRECISION", "int8")
    assert embedding_version(auto) != before[0]


def test_speed_and_bookkeeping_settings_re_run_nothing():
    after = with_settings(
        media_enrichment={"ocr": {"max_workers": 7}, "features": {"cache": {"expiry": "01:00:00:00"}}},
        embedding={"batch_size": 64},
        retrieval={"k": 9},
    )
    assert changed(RagConfig(), after) == set()


def test_bumping_config_version_re_enriches():
    assert changed(RagConfig(), with_settings(config_version="2025-01-01")) == {"enrichment"}
