"""Search by image: describe the query image exactly the way enrichment describes indexed images.

The query image goes through the same steps as a document image (decode and preprocess, OCR,
the vision model when an endpoint is configured, fusion into Meta-Content), so its description
uses the same words as the chunk of a matching indexed image; its perceptual hash finds the same
picture indexed, however its text was read. The classifier's tags feed the
image type as they do at indexing, but its verdict is overruled: the user asked about this image.
The enrichment cache is not used: a query image is seen once and must not fill the cache.

A query image is bounded before any of that: one over `MAX_QUERY_PIXELS` is decoded at a reduced
size where the format allows (JPEG's DCT scaling through Pillow's `draft`), shrunk to the bound and
passed on as PNG, so OCR, the classifier and the vision model read at most that many pixels. A
6300x6300 PNG took 20 s and 1.2 GB of the server before.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import NamedTuple

from PIL import Image, ImageOps

from vision_rag_pipeline.core.config import RagConfig, config_in_effect
from vision_rag_pipeline.core.sniff import image_mime, is_svg
from vision_rag_pipeline.documents.model import DocumentImage
from vision_rag_pipeline.enrichment.batch import enrich_document_images
from vision_rag_pipeline.enrichment.classifier import classify_images
from vision_rag_pipeline.enrichment.model import MetaContent
from vision_rag_pipeline.enrichment.preprocess import MAX_IMAGE_BYTES, ImageError, load_image
from vision_rag_pipeline.enrichment.vlm import vision_client_from_env

QUERY_DOCUMENT = "query"
MAX_QUERY_PIXELS = 4_000_000  # what OCR reads of a query image: 2000x2000, a page at ~170 dpi


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
            data, mime = bounded_image(data, mime)
        except ImageError as exc:
            raise QueryImageError(f"{label}: not a readable image: {exc}") from exc
    return DocumentImage(url=f"query:{label}", name=label, mime=mime, data=data)


def bounded_image(data: bytes, mime: str, max_pixels: int = MAX_QUERY_PIXELS) -> tuple[bytes, str]:
    """`data` as it is when it has at most `max_pixels`, else shrunk to that (as PNG); raises
    ImageError when it cannot be decoded."""
    image = None
    try:
        with Image.open(io.BytesIO(data)) as probe:
            width, height = probe.size
            if width * height <= max_pixels:
                load_image(data, mime)  # decodable at all
                return data, mime
            scale = (max_pixels / (width * height)) ** 0.5
            target = (max(1, int(width * scale)), max(1, int(height * scale)))
            if probe.format == "JPEG":  # decoded at 1/2, 1/4 or 1/8 scale: never whole
                probe.draft("RGB", target)
                image = ImageOps.exif_transpose(probe.convert("RGB"))
    except (OSError, ValueError, SyntaxError, EOFError, Image.DecompressionBombError):
        load_image(data, mime)  # raises the reason as ImageError
        raise
    if image is None:
        image = load_image(data, mime)  # other formats decode whole once (bomb-checked), then shrink
    image.thumbnail(target, Image.Resampling.LANCZOS, reducing_gap=2.0)
    out = io.BytesIO()
    image.save(out, format="PNG")
    return out.getvalue(), "image/png"


def describe_query_image(image: str | Path | bytes, config: RagConfig | None = None) -> QueryImage:
    """The text to search for (the image's type, keywords and Meta-Content body, no [Source] line)
    and the picture's perceptual hash."""
    config = config or config_in_effect().config
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
    meta = MetaContent.parse(result.meta_content)
    text = "\n".join(part for part in (meta.image_type, ", ".join(meta.keywords), meta.content) if part)
    return QueryImage(text, verdict.perceptual_hash)
