"""Search by image: describe the query image exactly the way enrichment describes indexed images.

The query image goes through the same steps as a document image (decode and preprocess, OCR,
the vision model when an endpoint is configured, fusion into Meta-Content), so its description
uses the same words as the chunk of a matching indexed image; its perceptual hash finds the same
picture indexed, however its text was read. The classifier's tags feed the
image type as they do at indexing, but its verdict is overruled: the user asked about this image.
The enrichment cache is not used: a query image is seen once and must not fill the cache.
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

from vision_rag_pipeline.core.config import RagConfig, load_config
from vision_rag_pipeline.core.sniff import image_mime, is_svg
from vision_rag_pipeline.documents.model import DocumentImage
from vision_rag_pipeline.enrichment.batch import enrich_document_images
from vision_rag_pipeline.enrichment.classifier import classify_images
from vision_rag_pipeline.enrichment.fusion import parse_meta_content
from vision_rag_pipeline.enrichment.preprocess import MAX_IMAGE_BYTES, ImageError, load_image
from vision_rag_pipeline.enrichment.vlm import vision_client_from_env

QUERY_DOCUMENT = "query"


class QueryImage(NamedTuple):
    """What search by image looks for: the image described as enrichment describes indexed images,
    and its perceptual hash (None when it cannot be rasterized, e.g. an SVG)."""

    text: str
    perceptual_hash: str | None


class QueryImageError(ValueError):
    """The query image cannot be read; the message names the file and the reason."""


def query_image(image: str | Path | bytes, name: str = "query-image") -> DocumentImage:
    """The query as a DocumentImage, after checking it is an image we can decode."""
    if isinstance(image, bytes):
        data, label = image, name
    else:
        path = Path(image)
        label = path.name
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise QueryImageError(f"{path}: cannot read the query image: {exc.strerror}") from exc
    if len(data) > MAX_IMAGE_BYTES:
        raise QueryImageError(f"{label}: {len(data):,} bytes is over the 20 MB image limit")
    mime = image_mime(data) or "application/octet-stream"  # load_image still tries PIL's own detection
    if not is_svg(data, mime):  # an SVG is read from its own text, as at indexing
        try:
            load_image(data, mime)
        except ImageError as exc:
            raise QueryImageError(f"{label}: not a readable image: {exc}") from exc
    return DocumentImage(url=f"query:{label}", name=label, mime=mime, data=data)


def describe_query_image(image: str | Path | bytes, config: RagConfig | None = None) -> QueryImage:
    """The text to search for (the image's type, keywords and Meta-Content body, no [Source] line)
    and the picture's perceptual hash."""
    config = config or load_config()
    picture = query_image(image)
    verdict = classify_images([picture], config.media_enrichment.features.classifier)[0]
    batch = enrich_document_images(
        [picture],
        [verdict.model_copy(update={"verdict": "VISION"})],
        config,
        cache=None,
        document_name=QUERY_DOCUMENT,
        vision=vision_client_from_env(config.media_enrichment.provider),
    )
    result = batch.results[picture.sha256]
    fields = parse_meta_content(result.meta_content)
    keywords = ", ".join(fields["keywords"])
    text = "\n".join(part for part in (str(fields["type"]), keywords, str(fields["content"])) if part)
    return QueryImage(text, verdict.perceptual_hash)
