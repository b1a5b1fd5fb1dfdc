"""The media-enrichment operation of the reference architecture, on its own: up to ten images in, the
first one's classifier verdict and the Meta-Content of each out. Served by the HTTP API and
`vision-rag enrich`.
"""

from __future__ import annotations

import base64
import io
from pathlib import Path
from typing import Any

from PIL import Image
from pydantic import ValidationError

from vision_rag_pipeline.core.config import RagConfig, RequestLimits, config_in_effect
from vision_rag_pipeline.core.sniff import ImagePayloadError, decode_image_payload, image_mime
from vision_rag_pipeline.documents.model import DocumentImage
from vision_rag_pipeline.enrichment.batch import enrich_document_images
from vision_rag_pipeline.enrichment.cache import EnrichmentCache
from vision_rag_pipeline.enrichment.classifier import classify_images
from vision_rag_pipeline.enrichment.preprocess import MAX_IMAGE_BYTES, image_memory
from vision_rag_pipeline.enrichment.vlm import VisionClient, vision_client_from_env

MAX_IMAGES_PER_REQUEST = 10


def _merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for name, value in override.items():
        merged[name] = (
            _merge(base[name], value)
            if isinstance(value, dict) and isinstance(base.get(name), dict)
            else value
        )
    return merged


def _request_image(index: int, item: Any) -> DocumentImage:
    label = f"image {index + 1}"
    if not isinstance(item, dict):
        raise ValueError(f"{label}: expected an object with 'data' or 'url', got {type(item).__name__}")
    if item.get("url") is not None and not str(item["url"]).startswith("data:"):
        raise ValueError(f"{label}: url must be a base64 data: URL")
    payload = item["url"] if item.get("url") is not None else item.get("data")
    if payload is None:
        raise ValueError(f"{label}: needs 'data' (base64) or 'url' (data: URL)")
    try:
        data, declared = decode_image_payload(str(payload), MAX_IMAGE_BYTES)
    except ImagePayloadError as exc:
        raise ImagePayloadError(f"{label}: {exc}", exc.too_large) from None
    mime = item.get("mime") or image_mime(data, declared or "") or "application/octet-stream"
    name = str(item.get("name") or f"image-{index + 1}")
    return DocumentImage(url=f"request:{name}", name=name, mime=mime, data=data)


def check_request_budget(images: list[DocumentImage], limits: RequestLimits) -> None:
    """Refuse a request whose images hold more pixels, or would take more memory to decode and read,
    than `limits.requests` allows, judged from their headers before any is decoded (`ImagePayloadError`,
    too large). An image whose header does not read is left to its own error."""
    pixels = memory = 0
    for image in images:
        try:
            with Image.open(io.BytesIO(image.data)) as header:
                width, height, mode = header.width, header.height, header.mode
        except (OSError, ValueError, SyntaxError, EOFError, Image.DecompressionBombError):
            continue
        pixels += width * height
        memory += image_memory(width, height, mode)
    if pixels > limits.max_pixels:
        raise ImagePayloadError(
            f"media_enrichment: the images hold {pixels:,} pixels together, more than {limits.max_pixels:,} "
            "(limits.requests.max_pixels)",
            too_large=True,
        )
    if memory > limits.max_memory_bytes:
        raise ImagePayloadError(
            f"media_enrichment: decoding and reading the images would take about {memory / 2**20:,.0f} MB, "
            f"more than {limits.max_memory_bytes / 2**20:,.0f} MB (limits.requests.max_memory_bytes)",
            too_large=True,
        )


def media_enrichment(
    request: dict[str, Any],
    config: RagConfig | None = None,
    cache: EnrichmentCache | None = None,
    vision: VisionClient | None = None,
) -> dict[str, Any]:
    """The reference operation: `{domain, config_version, images (<= 10), features}` ->
    `{classifier_result, generated_response: {content}}`.

    As in the reference, only the first image is classified and its verdict decides for the
    whole request; the verdict is named `GPT_VISION` in the output. `vision` defaults to the
    endpoint configured in the environment (None there = offline).
    """
    base = config or config_in_effect().config
    items = request.get("images") or []
    if not isinstance(items, list) or not items:
        raise ValueError("media_enrichment: 'images' must be a non-empty list")
    most = min(MAX_IMAGES_PER_REQUEST, base.limits.requests.max_images)
    if len(items) > most:
        raise ValueError(
            f"media_enrichment: {len(items)} images, at most {most} per request (limits.requests.max_images)"
        )
    images = [_request_image(i, item) for i, item in enumerate(items)]
    check_request_budget(images, base.limits.requests)
    data = base.model_dump()
    data["domain"] = request.get("domain", base.domain)
    data["config_version"] = request.get("config_version", base.config_version)
    data["media_enrichment"]["features"] = _merge(
        data["media_enrichment"]["features"], request.get("features") or {}
    )
    try:
        config = RagConfig.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        raise ValueError(f"media_enrichment: invalid request: {problems}") from None

    first = classify_images(images[:1], config.media_enrichment.features.classifier)[0]
    verdicts = [first.model_copy(update={"image_sha256": img.sha256}) for img in images]
    batch = enrich_document_images(
        images,
        verdicts,
        config,
        cache,
        str(request.get("document") or "request"),
        vision or vision_client_from_env(config.media_enrichment.provider),
    )
    contents = [batch.results[img.sha256].meta_content for img in images if img.sha256 in batch.results]
    return {
        "classifier_result": {
            "verdict": "GPT_VISION" if first.verdict == "VISION" else "IGNORE",
            "reasons": first.reasons,
            "tags": first.tags,
            "scores": first.scores,
            "threshold": first.threshold,
        },
        "generated_response": {"content": "\n\n".join(dict.fromkeys(contents)), "errors": batch.errors},
    }


def enrich_files(paths: list[Path]) -> list[dict[str, Any]]:
    """`vision-rag enrich`: one media-enrichment request per file, with the configured cache and endpoint."""
    config = config_in_effect().config
    cache = EnrichmentCache() if config.media_enrichment.features.cache.enabled else None
    vision = vision_client_from_env(config.media_enrichment.provider)
    results = []
    for path in paths:
        try:
            request = {
                "domain": config.domain,
                "config_version": config.config_version,
                "document": path.parent.name or "files",
                "images": [{"data": base64.b64encode(path.read_bytes()).decode("ascii"), "name": path.name}],
            }
            results.append({"path": str(path), **media_enrichment(request, config, cache, vision)})
        except (OSError, ValueError) as exc:
            results.append({"path": str(path), "error": str(exc)})
    return results
