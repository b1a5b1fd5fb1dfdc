"""Enrich a document's VISION images: cache lookup, OCR (+ VLM), fusion into Meta-Content, cache store.

OCR reads the images on threads of this step, one per core this process may use
(`media_enrichment.ocr.max_workers` when set): Tesseract runs in-process through its C API
(tesserocr) and releases the GIL while it reads, so threads read in parallel without a process
pool. Vision-model calls run in other threads alongside (they only wait on the network). A
provider failure is recorded on the image and the offline result is used instead; such fallbacks
are not cached, so the next run asks the provider again. Each image's provider calls
(description, then fusion) share one time budget, and fusion is not asked to merge a description
that failed; `fallbacks` counts why the offline path was taken.
"""

from __future__ import annotations

import io
import time
from collections import Counter
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from PIL import Image
from pydantic import BaseModel, Field

from vision_rag_pipeline.core.config import MllmFeature, RagConfig, cpu_threads
from vision_rag_pipeline.core.sniff import is_svg
from vision_rag_pipeline.documents.model import DocumentImage
from vision_rag_pipeline.enrichment.cache import OFFLINE_ENGINE, EnrichmentCache, cache_key
from vision_rag_pipeline.enrichment.cost import vision_tokens
from vision_rag_pipeline.enrichment.fusion import (
    Fused,
    fuse_by_rule,
    fuse_with_llm,
)
from vision_rag_pipeline.enrichment.languages import read_image, resolve_languages
from vision_rag_pipeline.enrichment.model import EnrichmentResult, ImageVerdict, MetaContent, OcrResult
from vision_rag_pipeline.enrichment.ocr import OcrError
from vision_rag_pipeline.enrichment.preprocess import (
    ImageError,
    encode_for_vision,
    load_image,
    svg_text,
)
from vision_rag_pipeline.enrichment.vlm import VisionClient, VisionError, VisionImage


class EnrichmentBatch(BaseModel):
    """One document's enrichments, keyed by image sha256, with what it cost."""

    results: dict[str, EnrichmentResult] = Field(default_factory=dict)
    calls: int = 0  # enrichments computed (cache misses): OCR + fusion, plus the VLM when configured
    cache_hits: int = 0
    vision_tokens: int = 0  # what the provider bills for these images (low: 85; high/auto: by 512-px tiles)
    engine: str = OFFLINE_ENGINE  # who computed them: "offline" (OCR + rules) or the vision endpoint
    errors: list[str] = Field(default_factory=list)
    fallbacks: dict[str, int] = Field(default_factory=dict)  # "vision: timeout" -> images that fell back
    provider_seconds: float = 0.0  # wall time from the first endpoint call to the end of the last


# --- OCR on threads ------------------------------------------------------------------------------


def _svg_ocr(data: bytes) -> tuple[OcrResult, str | None]:
    """An SVG we cannot rasterize is read from its own <text>/<title>: exact, so full confidence."""
    try:
        text = svg_text(data)
    except ImageError as exc:
        return OcrResult(), str(exc)
    return OcrResult(text=text, confidence=100.0 if text else 0.0, level="High" if text else "Low"), None


def _text_layer_ocr(text: str) -> OcrResult:
    """A scan's OCR layer from its PDF: the document's own text, trusted as its text chunks are.

    Reading the image again cost 4-9 s per scanned page for much the same words (the reference
    corpus's Backus scan: 188 of 196 vocabulary words shared), so the layer stands in for Tesseract.
    """
    return OcrResult(text=text, confidence=100.0, level="High")


def _ocr_all(images: dict[str, DocumentImage], config: RagConfig) -> dict[str, tuple[OcrResult, str | None]]:
    """OCR text per image, or empty text and the reason it could not be read.

    Threads, not processes: Tesseract's C API (tesserocr) and the numpy/PIL preparation release the
    GIL, so two threads read as fast as two processes here, without a pool that outlives the step
    (a process pool left idle at exit hangs Dagster's multiprocess step workers).

    Each image is read in the languages of the scripts it holds, what the page says around it
    (alt text, caption, surrounding text) telling the likely ones (`read_image`). A configured
    language this host lacks raises OcrError for the whole batch: nothing is read without it.
    """
    ocr_config = config.media_enrichment.ocr
    workers = min(ocr_config.max_workers or cpu_threads(), max(1, len(images)))
    languages = resolve_languages(ocr_config.languages)

    def read(image: DocumentImage) -> tuple[OcrResult, str | None]:
        if image.text_layer:
            return _text_layer_ocr(image.text_layer), None
        try:
            picture = load_image(image.data, image.mime)
        except ImageError as exc:
            return _svg_ocr(image.data) if is_svg(image.data, image.mime) else (OcrResult(), str(exc))
        hint = " ".join((image.alt, image.title, image.caption, image.context))
        try:
            return read_image(picture, languages, hint, picture=not image.is_page_image), None
        except OcrError as exc:
            return OcrResult(), str(exc)

    with ThreadPoolExecutor(max_workers=workers) as threads:
        return dict(zip(images, threads.map(read, images.values()), strict=True))


# --- vision model --------------------------------------------------------------------------------


def _describe(vision: VisionClient, image: DocumentImage, feature: MllmFeature) -> tuple[str, float]:
    """The VLM caption of one image, and the seconds it took (charged to the image's budget)."""
    started = time.monotonic()
    data, mime, _ = encode_for_vision(load_image(image.data, image.mime), feature.detail_mode)
    return vision.describe_one(VisionImage(data, mime), feature), time.monotonic() - started


def _token_estimate(image: DocumentImage, detail_mode: str) -> int:
    """Vision tokens as the provider bills this image, whether or not a provider is configured."""
    if image.width and image.height:
        return vision_tokens(image.width, image.height, detail_mode)
    try:
        with Image.open(io.BytesIO(image.data)) as img:
            return vision_tokens(img.width, img.height, detail_mode)
    except (OSError, ValueError, Image.DecompressionBombError):
        return 0


@dataclass
class _Computed:
    ocr: OcrResult
    caption: str | None = None
    errors: list[str] = field(default_factory=list)
    fallbacks: list[str] = field(default_factory=list)  # "vision: timeout", "fusion: description failed"
    provider_s: float = 0.0  # spent on the description; fusion gets the rest of the image budget
    caption_failed: bool = False


def _compute(
    images: dict[str, DocumentImage],
    tags: dict[str, list[str]],
    sources: dict[str, str],
    config: RagConfig,
    vision: VisionClient | None,
) -> dict[str, tuple[_Computed, Fused]]:
    """OCR every image on threads while the VLM describes them in other threads, then fuse."""
    mllm = config.media_enrichment.features.mllm
    with ThreadPoolExecutor(max_workers=vision.max_concurrency if vision else 1) as threads:
        captions: dict[str, Future[tuple[str, float]]] = {}
        if vision is not None and mllm.enabled:
            captions = {sha: threads.submit(_describe, vision, img, mllm) for sha, img in images.items()}
        computed = {}
        for sha, (ocr, error) in _ocr_all(images, config).items():
            computed[sha] = _Computed(ocr, errors=[f"ocr: {error}"] if error else [])
        for sha, future in captions.items():
            done = computed[sha]
            try:
                done.caption, done.provider_s = future.result()
            except VisionError as exc:
                done.errors.append(f"vision: {exc}")
                done.fallbacks.append(f"vision: {exc.reason}")
                done.caption_failed = True
            except ImageError as exc:
                done.errors.append(f"vision: {exc}")
                done.fallbacks.append("vision: image not encodable")
                done.caption_failed = True
        fusions = {
            sha: threads.submit(_fuse, img, tags.get(sha, []), computed[sha], sources[sha], config, vision)
            for sha, img in images.items()
        }
        return {sha: (computed[sha], future.result()) for sha, future in fusions.items()}


# --- fusion and the batch ------------------------------------------------------------------------


def _fuse(
    image: DocumentImage,
    tags: list[str],
    computed: _Computed,
    source: str,
    config: RagConfig,
    vision: VisionClient | None,
) -> Fused:
    """LLM fusion when an endpoint is configured and wanted, else (or when it fails) rule fusion.

    When the description failed, the endpoint is not asked again for the same image: rule fusion
    keeps the OCR text, and the image's budget is not spent twice on an endpoint that just failed.
    """
    enrichment = config.media_enrichment
    max_keywords = enrichment.fusion.max_keywords
    if vision is not None and enrichment.fusion.use_llm and computed.caption_failed:
        computed.fallbacks.append("fusion: description failed")
    elif vision is not None and enrichment.fusion.use_llm:
        mllm = enrichment.features.mllm
        try:
            return fuse_with_llm(
                vision,
                enrichment.fusion.model or mllm.model,
                mllm.llm_kwargs,
                image,
                tags,
                computed.ocr,
                source,
                max_keywords,
                computed.caption,
                budget_s=max(0.0, vision.limits.image_budget_s - computed.provider_s),
            )
        except VisionError as exc:
            computed.errors.append(f"fusion: {exc}")
            computed.fallbacks.append(f"fusion: {exc.reason}")
    return fuse_by_rule(image, tags, computed.ocr, source, max_keywords, computed.caption)


def _for_this_document(
    hit: EnrichmentResult, image: DocumentImage, tags: list[str], source: str, config: RagConfig
) -> EnrichmentResult:
    """A cached result re-pointed at this document: source, URL and (rule fusion) alt text and context.

    The key covers the image and the settings, not the page around it, so the same chart in two
    reports shares one entry. Rule fusion is cheap and is redone from the cached OCR text; an LLM
    fusion keeps its content and only gets this document's [Source].
    """
    if hit.fusion == "rule":
        fused = fuse_by_rule(
            image, tags, hit.ocr, source, config.media_enrichment.fusion.max_keywords, hit.vlm_caption
        )
        update: dict[str, Any] = {
            "meta_content": fused.meta_content,
            "description": fused.description,
            "image_type": fused.image_type,
            "keywords": fused.keywords,
        }
    else:
        meta = MetaContent.parse(hit.meta_content)
        update = {"meta_content": meta.model_copy(update={"source": source}).render()}
    return hit.model_copy(update={**update, "image_url": image.url})


def enrichment_engine(config: RagConfig, vision: VisionClient | None) -> str:
    """Who computes enrichments: the endpoint when one is configured and the vision model or LLM
    fusion is wanted, else "offline" (OCR + rule fusion)."""
    enrichment = config.media_enrichment
    if vision is not None and (enrichment.features.mllm.enabled or enrichment.fusion.use_llm):
        return vision.engine
    return OFFLINE_ENGINE


def enrich_document_images(
    images: list[DocumentImage],
    verdicts: list[ImageVerdict],
    config: RagConfig,
    cache: EnrichmentCache | None,
    document_name: str,
    vision: VisionClient | None = None,
) -> EnrichmentBatch:
    """Enrich the images whose verdict is VISION (each distinct image once), from the cache when possible."""
    vision_shas = {v.image_sha256 for v in verdicts if v.verdict == "VISION"}
    tags = {v.image_sha256: v.tags for v in verdicts}
    unique: dict[str, DocumentImage] = {}
    for image in images:
        sha = image.sha256  # computed once: it hashes the bytes on every access
        if sha in vision_shas:
            unique.setdefault(sha, image)
    features = config.media_enrichment.features
    engine = enrichment_engine(config, vision)
    active_vision = vision if engine != OFFLINE_ENGINE else None
    keys = {sha: cache_key(sha, config, engine, image.text_layer) for sha, image in unique.items()}
    use_cache = cache is not None and features.cache.enabled
    hits = cache.get_many(keys.values(), expiry=features.cache.expiry) if use_cache else {}

    estimates = {sha: _token_estimate(image, features.mllm.detail_mode) for sha, image in unique.items()}
    batch = EnrichmentBatch(vision_tokens=sum(estimates.values()), engine=engine)
    sources = {sha: f"{document_name}/{image.name}" for sha, image in unique.items()}
    misses: dict[str, DocumentImage] = {}
    for sha, image in unique.items():
        hit = hits.get(keys[sha])
        if hit is not None:
            result = _for_this_document(hit, image, tags.get(sha, []), sources[sha], config)
            # offline, the detail mode is not in the key: the estimate follows the setting in effect
            batch.results[sha] = result.model_copy(update={"vision_tokens": estimates[sha]})
            batch.cache_hits += 1
        else:
            misses[sha] = image

    computed = _compute(misses, tags, sources, config, active_vision) if misses else {}
    fresh: dict[str, EnrichmentResult] = {}
    fallbacks: Counter[str] = Counter()
    for sha, image in misses.items():
        done, fused = computed[sha]
        result = EnrichmentResult(
            image_sha256=sha,
            image_url=image.url,
            meta_content=fused.meta_content,
            description=fused.description,
            image_type=fused.image_type,
            keywords=fused.keywords,
            ocr=done.ocr,
            vlm_caption=done.caption,
            fusion=fused.fusion,
            vision_tokens=estimates[sha],
            errors=done.errors,
            cache_key=keys[sha],
        )
        batch.results[sha] = result
        batch.calls += 1
        batch.errors.extend(f"{sources[sha]}: {error}" for error in done.errors)
        fallbacks.update(done.fallbacks)
        if not done.errors:
            fresh[keys[sha]] = result
    if use_cache and fresh:
        cache.put_many(fresh, expiry=features.cache.expiry)
    batch.fallbacks = dict(sorted(fallbacks.items()))
    if active_vision is not None:
        batch.provider_seconds = round(active_vision.breaker.seconds_waited(), 2)
    return batch
