"""Turn a loaded document plus its image enrichments into located chunks.

Text runs are rendered as Markdown with each worthwhile image annotated inline as
`![description](url)` and split recursively; tables are one chunk each, whole; every enriched
image also becomes its own Meta-Content chunk, plus short excerpt chunks of its text. Each
chunk keeps where it came from: page and bbox for PDF elements, a char span into the document
text for MHTML.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from vision_rag_pipeline.chunks.annotations import annotation, find_annotations
from vision_rag_pipeline.chunks.landmarks import attach_landmarks, page_units
from vision_rag_pipeline.chunks.model import Chunk
from vision_rag_pipeline.chunks.splitter import split_text
from vision_rag_pipeline.core.config import LoaderConfig, SplitterConfig
from vision_rag_pipeline.core.text import text_language
from vision_rag_pipeline.documents.model import BBox, Element, ImageInfo, LoadedDocument, Location
from vision_rag_pipeline.enrichment.fusion import chart_data_rows, clean_ocr_text, indexable_reading
from vision_rag_pipeline.enrichment.model import EnrichmentResult, ImageVerdict
from vision_rag_pipeline.images.model import ExtractedImage

# An image's text is also indexed in small groups of lines, each under the document title and
# the image caption: a question about one row of a table or one bar of a chart then meets a
# chunk about that row, not a whole image's worth of text diluted by every other row.
# Bump when a change here changes the chunks a document yields (the chunking code version includes it).
CHUNKING_REVISION = 8  # 8: no excerpts of a Low OCR reading of a picture on a page
IMAGE_EXCERPT_CHARS = 160


@dataclass
class _Rendered:
    """One element's place in a rendered text run."""

    start: int
    end: int
    element: Element
    verbatim: bool  # rendered text equals the element text, so offsets map one to one


def image_description(image: ImageInfo, enrichment: EnrichmentResult | None) -> str:
    """The inline description: the enrichment's, else what the page says about the image."""
    if enrichment is not None:
        return enrichment.description
    return image.alt or image.title or image.caption or Path(image.name).stem


def build_chunks(
    document_id: str,
    doc: LoadedDocument,
    images: Sequence[ExtractedImage],
    enrichments: dict[str, EnrichmentResult],
    verdicts: Sequence[ImageVerdict],
    loader: LoaderConfig,
    splitter: SplitterConfig,
) -> list[Chunk]:
    """`images[i]` describes `doc.images[i]` (with its sha256); `verdicts` say which images are
    decoration (IGNORE) and carry each picture's perceptual hash for search by image."""
    ignored = {v.image_sha256 for v in verdicts if v.verdict == "IGNORE"}
    fingerprints = {v.image_sha256: v.perceptual_hash for v in verdicts if v.perceptual_hash}
    if not doc.title:
        doc = doc.model_copy(update={"title": _scanned_title(doc, images, enrichments)})
    chunks: list[Chunk] = []
    run: list[tuple[str, Element]] = []

    def flush() -> None:
        chunks.extend(_split_run(document_id, doc, run, splitter))
        run.clear()

    for element in doc.elements:
        if element.kind == "table":
            flush()
            chunks.append(_chunk(document_id, doc, "table", element.text, [element], splitter))
        elif element.kind == "image":
            image = images[element.image_index]
            if image.sha256 in ignored or loader.separate_docs_for_images:
                continue
            description = image_description(image, enrichments.get(image.sha256))
            run.append((annotation(description, image.url), element))
        elif element.text.strip():
            run.append((element.text, element))
    flush()
    chunks.extend(_image_chunks(document_id, doc, images, enrichments, fingerprints))
    image_texts = {
        index: enrichments[image.sha256].meta_content
        for index, image in enumerate(images)
        if image.sha256 in enrichments and image.sha256 not in ignored
    }
    for unit in page_units(document_id, doc, image_texts):
        pages = [unit.page] if unit.page else []
        unit.metadata = _base_metadata(doc) | {"pages": pages, "language": text_language(unit.text)}
        chunks.append(unit)
    attach_landmarks(chunks, doc)
    for index, chunk in enumerate(chunks):
        chunk.index = index
        chunk.chunk_id = f"{document_id}:{index:05d}"
    return chunks


def _split_run(
    document_id: str, doc: LoadedDocument, run: list[tuple[str, Element]], splitter: SplitterConfig
) -> list[Chunk]:
    if not run:
        return []
    rendered: list[_Rendered] = []
    parts: list[str] = []
    offset = 0
    for text, element in run:
        rendered.append(_Rendered(offset, offset + len(text), element, element.kind != "image"))
        parts.append(text)
        offset += len(text) + 2
    full = "\n\n".join(parts)
    chunks = []
    for piece in split_text(full, splitter.chunk_size, splitter.chunk_overlap):
        covered = [r for r in rendered if r.start < max(piece.end, piece.start + 1) and r.end > piece.start]
        shares = [min(r.end, piece.end) - max(r.start, piece.start) for r in covered]
        chunk = _chunk(document_id, doc, "text", piece.text, [r.element for r in covered], splitter, shares)
        chunk.char_span = _source_span(covered, piece.start, piece.end)
        chunks.append(chunk)
    return chunks


def _source_span(covered: list[_Rendered], start: int, end: int) -> tuple[int, int] | None:
    """Map a rendered range back to the document text through the elements it covers."""
    points = []
    for r in covered:
        span = r.element.location.char_span
        if span is None:
            continue
        if r.verbatim:
            points += [span[0] + max(0, start - r.start), span[0] + min(r.end, end) - r.start]
        else:
            points += [span[0], span[1]]
    return (min(points), max(points)) if points else None


def _chunk(
    document_id: str,
    doc: LoadedDocument,
    kind: str,
    text: str,
    elements: list[Element],
    splitter: SplitterConfig,
    shares: list[int] | None = None,
) -> Chunk:
    page, bbox = _page_and_bbox([e.location for e in elements], shares)
    spans = [e.location.char_span for e in elements if e.location.char_span]
    metadata = _base_metadata(doc)
    metadata["pages"] = sorted({e.location.page for e in elements if e.location.page})
    metadata["language"] = text_language(text)
    if splitter.image_collection_in_metadata:
        metadata["images"] = [{"url": a.url, "description": a.description} for a in find_annotations(text)]
    return Chunk(
        chunk_id="",
        document_id=document_id,
        index=0,
        kind=kind,
        text=text,
        page=page,
        bbox=bbox,
        char_span=(min(s[0] for s in spans), max(s[1] for s in spans)) if spans else None,
        metadata=metadata,
    )


def _image_chunks(
    document_id: str,
    doc: LoadedDocument,
    images: Sequence[ExtractedImage],
    enrichments: dict[str, EnrichmentResult],
    fingerprints: dict[str, str],
) -> list[Chunk]:
    chunks, seen = [], set()
    for image in images:
        result = enrichments.get(image.sha256)
        if result is None or result.image_sha256 in seen:
            continue
        seen.add(result.image_sha256)
        reading = indexable_reading(result.ocr, image)
        rows = chart_data_rows(result.image_type, reading)
        metadata = _base_metadata(doc) | {
            "image_sha256": result.image_sha256,
            "image_name": image.name,
            "perceptual_hash": fingerprints.get(result.image_sha256),
            "image_type": result.image_type,
            "ocr_confidence": result.ocr.level,
            "ocr_languages": result.ocr.languages,  # the Tesseract languages this image was read with
            # the image's own text says its language; the Meta-Content headers are always English
            "language": text_language(reading.text or result.description),
            "keywords": result.keywords,
            # the chart's values paired with their labels ("label: value"), for callers that want data
            "chart_rows": rows,
            "fusion": result.fusion,
            "alt": image.alt,
            "pages": [image.location.page] if image.location.page else [],
        }
        located = {
            "document_id": document_id,
            "index": 0,
            "kind": "image",
            "page": image.location.page,
            "bbox": image.location.bbox,
            "char_span": image.location.char_span,
            "image": image.url,
        }
        chunks.append(Chunk(chunk_id="", text=result.meta_content, metadata=metadata, **located))
        text_lines = [line for line in clean_ocr_text(reading.text).splitlines() if line.strip()]
        # the image's own first line is its title ("KPI summary, Q3 2024"): every excerpt repeats it
        title = text_lines[0] if text_lines else ""
        heading = " — ".join(dict.fromkeys(p for p in (doc.title, image.caption or image.alt, title) if p))
        # a chart's rows ("Lynx: 47.2") follow its lines, packed with them: a question about one bar
        # meets its value beside its label (one chunk per row crowded other images out of the top 5)
        for part, lines in enumerate(_line_groups("\n".join([*text_lines[1:], *rows]), IMAGE_EXCERPT_CHARS)):
            chunks.append(
                Chunk(
                    chunk_id="",
                    text=f"{heading}: {lines}" if heading else lines,
                    metadata=metadata | {"image_excerpt": part},
                    **located,
                )
            )
    return chunks


def _is_statement(line: str) -> bool:
    """Words and a number on one line: a table row, a bullet, a sentence: one fact, indexed alone."""
    return (
        any(c.isdigit() for c in line)
        and sum(len(word) >= 3 and word.isalpha() for word in line.split()) >= 2
    )


def _continues(previous: str, line: str) -> bool:
    """A wrapped sentence: the line before stops mid-sentence and this one goes on in lower case
    or with an amount ("... a buyback of up to" / "$148.7 million over two years")."""
    return (
        bool(previous)
        and previous[-1] not in ".!?:"
        and (line[0].islower() or line[0] in "$€£" or line[0].isdigit())
    )


def _line_groups(text: str, max_chars: int) -> list[str]:
    """A line that states something (a table row, a bullet, a sentence) starts its own group;
    labels and bare numbers (a chart's axis, bars, tiles) and the rest of a wrapped sentence are
    packed after it in reading order, at most `max_chars` a group, so each value stays next to its
    labels and no group is a sentence's tail alone: when the length limit cuts a wrapped sentence,
    its line before the cut opens the next group as well ("... a buyback of up to · $70.8 million")."""
    groups: list[str] = []
    current, previous = "", ""
    for line in (raw.strip() for raw in text.splitlines()):
        if not line:
            continue
        continues = _continues(previous, line)
        starts = _is_statement(line) and not continues
        if current and (starts or len(current) + 3 + len(line) > max_chars):
            groups.append(current)
            current = previous if continues and len(previous) + 3 + len(line) <= max_chars else ""
        current = f"{current} · {line}" if current else line
        previous = line
    if current:
        groups.append(current)
    return groups


def _scanned_title(
    doc: LoadedDocument, images: Sequence[ExtractedImage], enrichments: dict[str, EnrichmentResult]
) -> str:
    """A document that opens with a scanned page and has no title of its own is titled by the first
    line read off that page, as a reader would title it (a memo's heading, a letter's letterhead)."""
    first = doc.elements[0] if doc.elements else None
    if first is None or first.kind != "image" or not doc.images[first.image_index].is_page_image:
        return ""
    result = enrichments.get(images[first.image_index].sha256)
    lines = [line.strip() for line in clean_ocr_text(result.ocr.text).splitlines()] if result else []
    return next((line for line in lines if line), "")


def _page_and_bbox(
    locations: list[Location], shares: list[int] | None = None
) -> tuple[int | None, BBox | None]:
    """The page holding most of the chunk's text (`shares`: its characters from each location; the
    first page on a tie) and the union of its boxes on that page.

    A chunk that starts with the previous page's footer is cited on the page it is about: citing the
    first page it touches put answers on the page before theirs.
    """
    weights = shares or [1] * len(locations)
    chars: dict[int, int] = {}
    for loc, weight in zip(locations, weights, strict=True):
        if loc.page is not None:
            chars[loc.page] = chars.get(loc.page, 0) + weight
    if not chars:
        return None, None
    page = max(chars, key=lambda p: (chars[p], -p))
    boxes = [loc.bbox for loc in locations if loc.page == page and loc.bbox is not None]
    if not boxes:
        return page, None
    return page, (
        min(b[0] for b in boxes),
        min(b[1] for b in boxes),
        max(b[2] for b in boxes),
        max(b[3] for b in boxes),
    )


def _base_metadata(doc: LoadedDocument) -> dict:
    return {"source": doc.source_path, "title": doc.title, "mime": doc.mime}
