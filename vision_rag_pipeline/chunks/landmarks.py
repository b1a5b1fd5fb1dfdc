"""What a question can point at, recorded per chunk (`Landmarks`), and one retrieval unit per page.

Questions point into a document as readers do: by the number printed on a page or shown by the PDF
viewer ("the map of page 12", "slide 14"), by its place ("the cover", "the last page"), by a
caption's number ("Figure 3", "Table 2-1"), and across documents by who and when ("Glimmerfield
Solar's Q1 2025 report"). Each chunk records those of its page and document; query/analysis.py reads
the same things out of a question.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

from vision_rag_pipeline.chunks.model import Chunk, Landmarks
from vision_rag_pipeline.core.periods import periods
from vision_rag_pipeline.core.references import caption_reference
from vision_rag_pipeline.documents.model import LoadedDocument

HEADER_CHARS = 300  # of the document's opening text: a cover's or a first page's masthead


def document_header(doc: LoadedDocument) -> str:
    """Who and what the document is: its title, its file name's words and its opening words."""
    stem = " ".join(re.split(r"[\W_]+", Path(doc.source_path).stem))
    opening = " ".join(doc.text[: HEADER_CHARS * 2].split())[:HEADER_CHARS]
    return " · ".join(part for part in dict.fromkeys((doc.title.strip(), stem.strip(), opening)) if part)


def page_references(doc: LoadedDocument) -> dict[int, list[str]]:
    """Per page, the figures and tables captioned on it: caption lines of its text and its images'
    captions."""
    found: dict[int, list[str]] = defaultdict(list)
    for element in doc.elements:
        page = element.location.page
        if page is None:
            continue
        if element.kind == "image":
            lines = [doc.images[element.image_index].caption]
        else:
            lines = element.text.splitlines()
        found[page] += [ref for line in lines if (ref := caption_reference(line))]
    return {page: list(dict.fromkeys(refs)) for page, refs in found.items()}


def _own_references(chunk: Chunk, doc: LoadedDocument) -> list[str]:
    """A chunk without pages (MHTML): the captions in its own text and of the images it holds."""
    lines = chunk.text.splitlines()
    lines += [image.caption for image in doc.images if image.url == chunk.image or image.url in chunk.text]
    return list(dict.fromkeys(ref for line in lines if line and (ref := caption_reference(line))))


def attach_landmarks(chunks: Sequence[Chunk], doc: LoadedDocument) -> None:
    """Fill every chunk's `landmarks` from its page and its document."""
    header = document_header(doc)
    covered = periods(header)
    names = {info.number: info.names for info in doc.page_info}
    references = page_references(doc)
    for chunk in chunks:
        chunk.landmarks = Landmarks(
            page_names=names.get(chunk.page, []) if chunk.page else [],
            page_count=doc.pages,
            references=references.get(chunk.page, []) if chunk.page else _own_references(chunk, doc),
            periods=covered,
            header=header,
        )


def page_units(document_id: str, doc: LoadedDocument, image_texts: dict[int, str]) -> list[Chunk]:
    """One `page` chunk per page with text (a saved web page is one page): its text elements and
    tables in reading order, and for each image on it the text its image chunk indexes
    (`image_texts`, by image index)."""
    parts: dict[int | None, list[str]] = defaultdict(list)
    for element in doc.elements:
        text = image_texts.get(element.image_index, "") if element.kind == "image" else element.text
        if text.strip():
            parts[element.location.page].append(text.strip())
    return [
        Chunk(chunk_id="", document_id=document_id, index=0, kind="page", text="\n\n".join(texts), page=page)
        for page, texts in sorted(parts.items(), key=lambda item: item[0] or 0)
    ]
