"""image_verdicts and image_enrichments: decide which images matter, then make them searchable."""

from collections import Counter
from pathlib import Path

import dagster as dg

from vision_rag_pipeline.core.config import RagConfig
from vision_rag_pipeline.defs.host_inputs import OCR_LANGUAGES, require_launching_host_inputs
from vision_rag_pipeline.defs.partitions import documents_partitions
from vision_rag_pipeline.defs.previews import first_words, image_grid
from vision_rag_pipeline.defs.resources import IndexDatabase, RagConfigResource
from vision_rag_pipeline.documents.model import DocumentImage
from vision_rag_pipeline.enrichment.batch import EnrichmentBatch, enrich_document_images
from vision_rag_pipeline.enrichment.cache import OFFLINE_ENGINE
from vision_rag_pipeline.enrichment.classifier import classify_images
from vision_rag_pipeline.enrichment.languages import language_fingerprint, resolve_languages
from vision_rag_pipeline.enrichment.model import EnrichmentResult, ImageVerdict, MetaContent
from vision_rag_pipeline.enrichment.vlm import vision_client_from_env
from vision_rag_pipeline.images.model import ExtractedImage

VISION_POOL = "vision_model"  # enrichment steps share it: bounds simultaneous vision-model calls


def _with_bytes(images: list[ExtractedImage], index_db: IndexDatabase) -> list[DocumentImage]:
    data = index_db.image_store().get_many(image.sha256 for image in images)
    return [image.with_data(data[image.sha256]) for image in images]


@dg.asset(
    partitions_def=documents_partitions,
    group_name="enrichment",
    kinds={"python"},
    description="Classifier verdict per image: IGNORE (logos, icons, spacers, dividers, tracking pixels, "
    "repeated decoration) or VISION (text, charts, diagrams, screenshots, photos), with reasons and scores.",
)
def image_verdicts(
    context: dg.AssetExecutionContext,
    extracted_images: dict[str, list[ExtractedImage]],
    index_db: IndexDatabase,
    rag_config: RagConfigResource,
) -> dg.Output[dict[str, list[ImageVerdict]]]:
    classifier = rag_config.load().media_enrichment.features.classifier
    values: dict[str, list[ImageVerdict]] = {}
    for key, extracted in extracted_images.items():
        images = _with_bytes(extracted, index_db)
        verdicts = classify_images(images, classifier)
        by_image = {v.image_sha256: v for v in verdicts}
        counts = Counter(v.verdict for v in verdicts)
        tags = Counter(tag for v in verdicts for tag in v.tags)
        context.log.info(f"{key}: verdicts {dict(counts)}")
        context.add_asset_metadata(
            {
                "thumbnails": image_grid(
                    images,
                    {
                        "verdict": lambda image, by_image=by_image: by_image[image.sha256].verdict,
                        "why": lambda image, by_image=by_image: "; ".join(by_image[image.sha256].reasons[:2]),
                    },
                ),
                "vision": counts.get("VISION", 0),
                "ignore": counts.get("IGNORE", 0),
                "threshold": classifier.threshold,
                "tags": dg.MetadataValue.json(dict(tags.most_common(20))),
            },
            partition_key=key,
        )
        values[key] = verdicts
    return dg.Output(values)


@dg.asset(
    partitions_def=documents_partitions,
    group_name="enrichment",
    # Kinds are fixed when the code location loads: "openai" only when an endpoint is configured then
    # (each run reads the environment itself; the metadata's `engine` says what really computed it).
    kinds={"python", "tesseract"} | ({"openai"} if vision_client_from_env() else set()),
    pool=VISION_POOL,
    description="For VISION images: preprocessing, OCR, vision-LLM description when an endpoint is "
    "configured, fused into a Meta-Content chunk; served from the enrichment cache when the key matches.",
)
def image_enrichments(
    context: dg.AssetExecutionContext,
    extracted_images: dict[str, list[ExtractedImage]],
    image_verdicts: dict[str, list[ImageVerdict]],
    index_db: IndexDatabase,
    rag_config: RagConfigResource,
) -> dg.Output[dict[str, EnrichmentBatch]]:
    config = rag_config.load()
    resolve_languages(config.media_enrichment.ocr.languages)  # a listed language missing here: say which
    require_launching_host_inputs(context, config, OCR_LANGUAGES)
    cache = index_db.enrichment_cache() if config.media_enrichment.features.cache.enabled else None
    vision = vision_client_from_env(config.media_enrichment.provider)
    registry = index_db.registry()
    values: dict[str, EnrichmentBatch] = {}
    for key, extracted in extracted_images.items():
        verdicts = image_verdicts[key]
        wanted = {v.image_sha256 for v in verdicts if v.verdict == "VISION"}
        images = _with_bytes([image for image in extracted if image.sha256 in wanted], index_db)
        name = Path(registry.get(key).source_path).name
        batch = enrich_document_images(images, verdicts, config, cache, document_name=name, vision=vision)
        for error in batch.errors:
            context.log.warning(error)
        if batch.fallbacks:
            context.log.warning(f"{name}: offline fallbacks: {batch.fallbacks}")
        context.add_asset_metadata(_enrichment_metadata(batch, images, config), partition_key=key)
        values[key] = batch
    return dg.Output(values)


def _enrichment_metadata(batch: EnrichmentBatch, images: list[DocumentImage], config: RagConfig) -> dict:
    read_with = Counter("+".join(r.ocr.languages) for r in batch.results.values() if r.ocr.languages)
    looked_up = batch.calls + batch.cache_hits
    # Offline nothing is billed: the figure is what a vision model would cost, and is labelled so.
    tokens_label = "vision_tokens_if_enabled" if batch.engine == OFFLINE_ENGINE else "vision_tokens_estimate"
    preview = "\n\n".join(
        f"**{r.image_url}**\n\n```\n{r.meta_content[:600]}\n```" for r in list(batch.results.values())[:3]
    )
    return {
        "thumbnails": image_grid(
            images,
            {
                "verdict": lambda _: "VISION",
                "OCR": lambda image: _ocr_confidence(batch.results[image.sha256]),
                "chunk": lambda image: first_words(_chunk_content(batch.results[image.sha256])),
            },
        ),
        "enriched": len(batch.results),
        "enrichment_calls": batch.calls,
        "cache_hits": batch.cache_hits,
        "cache_hit_ratio": round(batch.cache_hits / looked_up, 3) if looked_up else 0.0,
        "engine": batch.engine,
        tokens_label: batch.vision_tokens,
        "ocr_languages": dict(read_with),  # images per Tesseract language set they were read with
        # what OCR could read with on this host (`auto`: its installed languages): a per-host input
        "ocr_language_set": language_fingerprint(config.media_enrichment.ocr.languages),
        "fallbacks": sum(batch.fallbacks.values()),
        "fallback_reasons": dg.MetadataValue.json(batch.fallbacks),
        "provider_seconds": batch.provider_seconds,
        "preview": dg.MetadataValue.md(preview or "_no VISION images_"),
    }


def _ocr_confidence(result: EnrichmentResult) -> str:
    """The Meta-Content's OCR level with Tesseract's mean word confidence: "High (91)"."""
    return f"{result.ocr.level} ({result.ocr.confidence:.0f})" if result.ocr.text else "no text"


def _chunk_content(result: EnrichmentResult) -> str:
    """What the image chunk says (its <content>), without the <meta> header."""
    try:
        return MetaContent.parse(result.meta_content).content
    except ValueError:
        return result.description
