"""Thumbnail grids for the image assets' materializations: the pictures a run worked on, in the UI.

Markdown metadata with data: URI images (`images/thumbnail.py`), which Dagster's UI renders without a
file server: one row per image (its first MAX_THUMBNAILS, a few KB each), with what the asset knows
of it by then.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

import dagster as dg

from vision_rag_pipeline.documents.model import DocumentImage
from vision_rag_pipeline.images.thumbnail import thumbnail_uri

MAX_THUMBNAILS = 12
FIRST_WORDS = 14


def first_words(text: str, count: int = FIRST_WORDS) -> str:
    words = text.split()
    return " ".join(words[:count]) + (" …" if len(words) > count else "")


def _cell(text: str) -> str:
    """Text safe inside a markdown table cell: one line, no pipes, no markup characters."""
    return re.sub(r"([|*_`\[\]<>\\])", r"\\\1", " ".join(text.split()))


def where(image: DocumentImage) -> str:
    """Page (PDF) or character offset (MHTML) of an image in its document."""
    if image.location.page:
        return f"page {image.location.page}"
    if image.location.char_span:
        return f"char {image.location.char_span[0]}"
    return ""


def image_grid(
    images: Sequence[DocumentImage], columns: dict[str, Callable[[DocumentImage], str]]
) -> dg.MetadataValue:
    """A markdown table: the thumbnail, the image's name, then one cell per column for each image."""
    shown = list({image.sha256: image for image in images}.values())  # each picture once
    header = ["image", "name", *columns]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for image in shown[:MAX_THUMBNAILS]:
        uri = thumbnail_uri(image.sha256, image.data)
        picture = f"![{_cell(image.name)}]({uri})" if uri else "(no preview)"
        cells = [picture, _cell(image.name), *(_cell(describe(image)) for describe in columns.values())]
        lines.append("| " + " | ".join(cells) + " |")
    if not shown:
        return dg.MetadataValue.md("_no images_")
    if len(shown) > MAX_THUMBNAILS:
        lines.append(f"\n_first {MAX_THUMBNAILS} of {len(shown)} distinct images_")
    return dg.MetadataValue.md("\n".join(lines))
