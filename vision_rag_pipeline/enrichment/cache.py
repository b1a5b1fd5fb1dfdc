"""The enrichment cache: finished enrichments in Postgres (the index database), keyed by image + settings.

An entry expires `expiry` (DD:HH:MM:SS) after its last use: every hit pushes the deadline out
(sliding expiry); `None` keeps it forever. Lookups for a whole document are one query.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from psycopg.types.json import Jsonb

from vision_rag_pipeline.core.config import RagConfig, parse_expiry_seconds
from vision_rag_pipeline.core.postgres import connect, ensure_schema
from vision_rag_pipeline.enrichment.fusion import FUSION_REVISION
from vision_rag_pipeline.enrichment.languages import LANGUAGE_REVISION, language_fingerprint
from vision_rag_pipeline.enrichment.model import EnrichmentResult
from vision_rag_pipeline.enrichment.ocr import OCR_REVISION

OFFLINE_ENGINE = "offline"

_CREATE_TABLE = """
CREATE TABLE IF NOT EXISTS enrichment_cache (
    key text PRIMARY KEY,
    value jsonb NOT NULL,
    created_at timestamptz NOT NULL,
    last_access timestamptz NOT NULL,
    expires_at timestamptz,
    hits integer NOT NULL DEFAULT 0
)
"""

# One statement per batch: live rows are touched (sliding expiry, hit count) and returned,
# expired rows among the requested keys are deleted; both CTEs see the same snapshot.
_GET_MANY = """
WITH expired AS (
    DELETE FROM enrichment_cache
    WHERE key = ANY(%(keys)s) AND expires_at IS NOT NULL AND expires_at <= %(now)s
), live AS (
    UPDATE enrichment_cache
    SET last_access = %(now)s, hits = hits + 1, expires_at = %(expires_at)s
    WHERE key = ANY(%(keys)s) AND (expires_at IS NULL OR expires_at > %(now)s)
    RETURNING key, value
)
SELECT key, value FROM live
"""

_PUT = """
INSERT INTO enrichment_cache (key, value, created_at, last_access, expires_at, hits)
VALUES (%s, %s, %s, %s, %s, 0)
ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value, created_at = EXCLUDED.created_at,
    last_access = EXCLUDED.last_access, expires_at = EXCLUDED.expires_at, hits = 0
"""


def canonical_json(value: object) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def enrichment_settings(config: RagConfig, engine: str) -> dict:
    """The settings that shape an image's enrichment when `engine` computes it, with the revisions of
    the code that does; the enrichment code version and the cache key hash exactly these.

    Offline (OCR + rule fusion) that is the OCR languages and the keyword count: no vision-model
    setting (prompt, model, detail, kwargs) nor LLM-fusion switch reaches the output, so editing one
    re-reads no image. With an endpoint, the vision model's and fusion's settings count as well
    (fusion borrows the model and kwargs when it has none of its own). Speed settings (OCR workers),
    the classifier (its verdicts are an input, not a setting of this step) and the cache's own
    settings are left out.
    """
    enrichment = config.media_enrichment
    settings: dict = {
        "engine": engine,
        # order matters to Tesseract; with `auto`, this host's languages, and their models' content
        "ocr_languages": language_fingerprint(enrichment.ocr.languages),
        "ocr_revision": OCR_REVISION,
        "language_revision": LANGUAGE_REVISION,  # which of those languages each image is read with
        "fusion_revision": FUSION_REVISION,
        "max_keywords": enrichment.fusion.max_keywords,
    }
    if engine != OFFLINE_ENGINE:
        settings["mllm"] = enrichment.features.mllm.model_dump(mode="json")
        settings["fusion"] = enrichment.fusion.model_dump(mode="json")
    return settings


def cache_key(
    image_sha256_or_bytes: str | bytes, config: RagConfig, engine: str, text_layer: str = ""
) -> str:
    """`features.cache.key_format` filled with the config's domain and version and the settings hash.

    The hash covers the image (its sha256 digest stands for the bytes) and `enrichment_settings` for
    `engine`: "offline" (OCR + rule fusion) or the vision endpoint. With the engine in the key, an
    OCR-only result cached while no endpoint was configured is not served once one is.

    `text_layer` is the PDF's own OCR layer over the image, read instead of Tesseract: the same scan
    with another layer (or none) is another enrichment.
    """
    if isinstance(image_sha256_or_bytes, bytes):
        digest = hashlib.sha256(image_sha256_or_bytes).hexdigest()
    else:
        digest = image_sha256_or_bytes.lower()
        if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
            raise ValueError(f"cache_key needs image bytes or a sha256 hex digest, got {digest[:80]!r}")
    settings = enrichment_settings(config, engine)
    if text_layer:
        settings["text_layer"] = text_layer
    settings_hash = hashlib.sha256(f"{digest}\n{canonical_json(settings)}".encode()).hexdigest()
    key_format = config.media_enrichment.features.cache.key_format
    try:
        return key_format.format(
            domain=config.domain, config_version=config.config_version, hash=settings_hash
        )
    except (KeyError, IndexError, ValueError) as exc:
        raise ValueError(
            f"cache key_format {key_format!r}: only {{domain}}, {{config_version}} and {{hash}} are known"
        ) from exc


@dataclass
class CacheStats:
    hits: int = 0
    misses: int = 0


class EnrichmentCache:
    """Postgres-backed; `clock` (seconds since the epoch) is injectable so tests can move time."""

    def __init__(self, url: str | None = None, clock: Callable[[], float] = time.time) -> None:
        self.url = url
        self.clock = clock
        self.stats = CacheStats()

    def _now(self) -> datetime:
        return datetime.fromtimestamp(self.clock(), tz=UTC)

    def get_many(self, keys: Iterable[str], *, expiry: str | None) -> dict[str, EnrichmentResult]:
        """The live entries among `keys` (marked `cached=True`); each hit is kept for `expiry` more."""
        wanted = sorted(set(keys))
        if not wanted:
            return {}
        ensure_schema(_CREATE_TABLE, self.url)
        now = self._now()
        expires_at = None if expiry is None else now + timedelta(seconds=parse_expiry_seconds(expiry))
        with connect(self.url) as conn:
            rows = conn.execute(_GET_MANY, {"keys": wanted, "now": now, "expires_at": expires_at}).fetchall()
        found = {
            key: EnrichmentResult.model_validate(value).model_copy(update={"cached": True})
            for key, value in rows
        }
        self.stats.hits += len(found)
        self.stats.misses += len(wanted) - len(found)
        return found

    def put_many(self, results: dict[str, EnrichmentResult], *, expiry: str | None) -> None:
        """Store (or replace) each result under its key, expiring `expiry` from now."""
        if not results:
            return
        ensure_schema(_CREATE_TABLE, self.url)
        now = self._now()
        expires_at = None if expiry is None else now + timedelta(seconds=parse_expiry_seconds(expiry))
        rows = [
            (key, Jsonb(result.model_dump(mode="json", exclude={"cached"})), now, now, expires_at)
            for key, result in results.items()
        ]
        with connect(self.url) as conn, conn.cursor() as cur:
            cur.executemany(_PUT, rows)
