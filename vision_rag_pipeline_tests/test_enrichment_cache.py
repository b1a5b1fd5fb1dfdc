"""Enrichment cache: key stability and sensitivity, sliding expiry with an injectable clock."""

from __future__ import annotations

import subprocess
import sys
import threading
import uuid
from typing import Any

import psycopg
import pytest

from vision_rag_pipeline.core.config import RagConfig
from vision_rag_pipeline.core.postgres import DDL_LOCK_ID, connect
from vision_rag_pipeline.enrichment.cache import EnrichmentCache, cache_key
from vision_rag_pipeline.enrichment.model import EnrichmentResult

DAY = 24 * 3600
IMAGE = b"tiny image bytes"
PINNED_CONFIG = {
    "domain": "intranet",
    "config_version": "2024-07-22",
    "media_enrichment": {
        "features": {
            "mllm": {
                "enabled": True,
                "model": "gpt-4o",
                "prompt": "Describe the image.",
                "detail_mode": "auto",
                "llm_kwargs": {"temperature": 0, "max_tokens": 800},
            },
            "classifier": {"enabled": True, "threshold": 0.8},
            "cache": {
                "enabled": True,
                "expiry": "07:00:00:00",
                "key_format": "{domain}-{config_version}-{hash}",
            },
        },
        "ocr": {"languages": ["eng"]},
        "fusion": {"use_llm": True, "model": None, "max_keywords": 12},
    },
}
# Pinned: if this changes, every deployed cache entry is silently orphaned. Change it on purpose only
# (a new enrichment setting legitimately changes it; so does a new OCR_REVISION, LANGUAGE_REVISION or
# FUSION_REVISION, as it must).
PINNED_KEY = "intranet-2024-07-22-456be0d617aa47c1e46569e8856153bfe35af9051f30faa8917ca2f45e874afd"


def _config(**changes: Any) -> RagConfig:
    """The default config with nested fields replaced, e.g. `{"media_enrichment.ocr.languages": [...]}`."""
    data = RagConfig().model_dump()
    for dotted, value in changes.items():
        *path, last = dotted.split(".")
        target = data
        for part in path:
            target = target[part]
        target[last] = value
    return RagConfig.model_validate(data)


def test_cache_key_is_pinned_and_stable_across_processes(monkeypatch: pytest.MonkeyPatch) -> None:
    from vision_rag_pipeline.enrichment import cache

    key = cache_key(IMAGE, RagConfig.model_validate(PINNED_CONFIG), "offline")
    code = (
        "from vision_rag_pipeline.core.config import RagConfig;"
        "from vision_rag_pipeline.enrichment.cache import cache_key;"
        f"print(cache_key({IMAGE!r}, RagConfig.model_validate({PINNED_CONFIG!r}), 'offline'))"
    )
    other_process = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert other_process.stdout.strip() == key
    # the OCR models' content is this host's (a per-host input): fixed here to pin everything else
    monkeypatch.setattr(cache, "language_fingerprint", lambda configured: f"{'+'.join(configured)}:models")
    assert cache_key(IMAGE, RagConfig.model_validate(PINNED_CONFIG), "offline") == PINNED_KEY


@pytest.mark.parametrize("revision", ["OCR_REVISION", "LANGUAGE_REVISION", "FUSION_REVISION"])
def test_a_new_ocr_revision_gives_new_keys_so_old_readings_are_not_served(
    monkeypatch: pytest.MonkeyPatch, revision: str
) -> None:
    from vision_rag_pipeline.enrichment import cache

    before = cache_key(IMAGE, RagConfig(), "offline")
    monkeypatch.setattr(cache, revision, getattr(cache, revision) + 1)
    assert cache_key(IMAGE, RagConfig(), "offline") != before


def test_hosts_with_other_ocr_languages_installed_do_not_share_auto_readings(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`auto` reads with what this host has: a host without Chinese would read a Chinese chart as
    English, so its readings must not be served to (or from) a host with it."""
    from vision_rag_pipeline.enrichment import languages

    monkeypatch.setattr(languages, "available_languages", lambda: {"eng", "rus", "chi_sim"})
    auto, listed = RagConfig(), _config(**{"media_enrichment.ocr.languages": ["eng", "rus"]})
    with_chinese = cache_key(IMAGE, auto, "offline"), cache_key(IMAGE, listed, "offline")
    monkeypatch.setattr(languages, "available_languages", lambda: {"eng", "rus"})
    assert cache_key(IMAGE, auto, "offline") != with_chinese[0]
    assert cache_key(IMAGE, listed, "offline") == with_chinese[1]  # a list is the same input everywhere


def test_cache_key_accepts_the_sha256_instead_of_the_bytes() -> None:
    import hashlib

    assert cache_key(hashlib.sha256(IMAGE).hexdigest(), RagConfig(), "offline") == cache_key(
        IMAGE, RagConfig(), "offline"
    )
    with pytest.raises(ValueError, match="sha256"):
        cache_key("not-a-digest", RagConfig(), "offline")


ENDPOINT = "openai:http://localhost:11434/v1"
VISION_MODEL_CHANGES = [
    {"media_enrichment.features.mllm.prompt": "Another prompt"},
    {"media_enrichment.features.mllm.model": "llava:13b"},
    {"media_enrichment.features.mllm.detail_mode": "low"},
    {"media_enrichment.features.mllm.llm_kwargs": {"temperature": 0.5, "max_tokens": 800}},
    {"media_enrichment.features.mllm.enabled": False},
    {"media_enrichment.fusion.use_llm": False},
    {"media_enrichment.fusion.model": "llava:13b"},
]
OUTPUT_CHANGES = [
    {"media_enrichment.ocr.languages": ["eng", "chi_sim"]},
    {"media_enrichment.fusion.max_keywords": 5},
    {"domain": "intranet"},
    {"config_version": "2024-07-22"},
]


@pytest.mark.parametrize("change", VISION_MODEL_CHANGES + OUTPUT_CHANGES)
def test_with_a_vision_model_any_setting_that_changes_the_output_changes_the_key(
    change: dict[str, Any],
) -> None:
    assert cache_key(IMAGE, _config(**change), ENDPOINT) != cache_key(IMAGE, RagConfig(), ENDPOINT)


@pytest.mark.parametrize("change", OUTPUT_CHANGES)
def test_offline_the_ocr_fusion_and_config_settings_change_the_key(change: dict[str, Any]) -> None:
    assert cache_key(IMAGE, _config(**change), "offline") != cache_key(IMAGE, RagConfig(), "offline")


@pytest.mark.parametrize(
    "change",
    [
        *VISION_MODEL_CHANGES,
        {"media_enrichment.features.classifier.threshold": 0.5},
        {"media_enrichment.features.cache.expiry": None},
    ],
)
def test_offline_no_vision_model_classifier_or_cache_setting_changes_the_key(change: dict[str, Any]) -> None:
    """Without a vision model these shape no enrichment: a prompt edit must re-read no image."""
    assert cache_key(IMAGE, _config(**change), "offline") == cache_key(IMAGE, RagConfig(), "offline")


def test_key_ignores_ocr_worker_count_but_not_the_engine_or_image() -> None:
    base = cache_key(IMAGE, RagConfig(), "offline")
    assert cache_key(IMAGE, _config(**{"media_enrichment.ocr.max_workers": 7}), "offline") == base
    assert cache_key(IMAGE, RagConfig(), "openai:http://localhost:11434/v1") != base
    assert cache_key(IMAGE + b"!", RagConfig(), "offline") != base


def test_key_follows_key_format() -> None:
    config = _config(**{"domain": "intranet", "config_version": "v7"})
    config = config.with_settings(
        {"media_enrichment": {"features": {"cache": {"key_format": "img:{domain}:{config_version}:{hash}"}}}}
    )
    key = cache_key(IMAGE, config, "offline")
    assert key.startswith("img:intranet:v7:") and len(key.rsplit(":", 1)[1]) == 64


class Clock:
    def __init__(self) -> None:
        self.now = 1_700_000_000.0

    def __call__(self) -> float:
        return self.now


def _result(key: str) -> EnrichmentResult:
    return EnrichmentResult(
        image_sha256="ab" * 32,
        image_url="https://example.com/a.png",
        meta_content="<meta>...",
        description="a",
        cache_key=key,
    )


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def cache(pg_url: str, clock: Clock) -> EnrichmentCache:
    return EnrichmentCache(pg_url, clock=clock)


def _key() -> str:
    return f"test-{uuid.uuid4().hex}"


def test_put_then_get_returns_the_full_result_marked_cached(cache: EnrichmentCache) -> None:
    key, missing = _key(), _key()
    cache.put_many({key: _result(key)}, expiry="07:00:00:00")
    found = cache.get_many([key, missing], expiry="07:00:00:00")
    assert list(found) == [key]
    assert found[key].cached and found[key].image_url == "https://example.com/a.png"
    assert (cache.stats.hits, cache.stats.misses) == (1, 1)


def test_each_hit_pushes_expiry_out_sliding(cache: EnrichmentCache, clock: Clock) -> None:
    key = _key()
    cache.put_many({key: _result(key)}, expiry="01:00:00:00")
    clock.now += 0.9 * DAY
    assert key in cache.get_many([key], expiry="01:00:00:00")  # refreshed: now + 1 day
    clock.now += 0.9 * DAY  # 1.8 days after the put, 0.9 after the last hit
    assert key in cache.get_many([key], expiry="01:00:00:00")
    clock.now += 1.1 * DAY  # idle longer than the expiry
    assert cache.get_many([key], expiry="01:00:00:00") == {}
    # the expired row was deleted, not just skipped
    clock.now -= 10 * DAY
    assert cache.get_many([key], expiry="01:00:00:00") == {}


def test_no_expiry_keeps_entries_forever(cache: EnrichmentCache, clock: Clock) -> None:
    key = _key()
    cache.put_many({key: _result(key)}, expiry=None)
    clock.now += 10_000 * DAY
    assert key in cache.get_many([key], expiry=None)


def test_put_replaces_an_existing_entry(cache: EnrichmentCache) -> None:
    key = _key()
    cache.put_many({key: _result(key)}, expiry=None)
    cache.put_many({key: _result(key).model_copy(update={"description": "newer"})}, expiry=None)
    assert cache.get_many([key], expiry=None)[key].description == "newer"


def test_a_batch_lookup_is_one_query(cache: EnrichmentCache, monkeypatch: pytest.MonkeyPatch) -> None:
    keys = [_key() for _ in range(20)]
    cache.put_many({k: _result(k) for k in keys}, expiry=None)
    import psycopg

    statements: list[str] = []
    original = psycopg.Connection.execute

    def counting(self: psycopg.Connection, query: Any, *args: Any, **kwargs: Any) -> Any:
        statements.append(str(query))
        return original(self, query, *args, **kwargs)

    monkeypatch.setattr(psycopg.Connection, "execute", counting)
    assert len(cache.get_many(keys, expiry=None)) == 20
    assert len([s for s in statements if "enrichment_cache" in s]) == 1


def test_the_cache_table_is_created_under_the_schema_lock(fresh_database: str) -> None:
    """Two ingest workers starting on a fresh database both create the table: unserialized, one
    of them failed its document with "duplicate key ... pg_type_typname_nsp_index"."""
    with connect(fresh_database):  # this process has connected before: the pgvector extension is in place
        pass
    with psycopg.connect(fresh_database, autocommit=True) as other_worker:
        other_worker.execute("SELECT pg_advisory_lock(%s)", (DDL_LOCK_ID,))  # mid-way through its own DDL
        lookup = threading.Thread(
            target=EnrichmentCache(fresh_database).get_many, args=([_key()],), kwargs={"expiry": None}
        )
        lookup.start()
        lookup.join(timeout=1.0)
        assert lookup.is_alive(), "the table was created without waiting for the schema lock"
        other_worker.execute("SELECT pg_advisory_unlock(%s)", (DDL_LOCK_ID,))
        lookup.join(timeout=30)
        assert not lookup.is_alive()
        assert other_worker.execute("SELECT to_regclass('enrichment_cache')").fetchone()[0] is not None
