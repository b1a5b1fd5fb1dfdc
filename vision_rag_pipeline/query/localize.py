"""Localize an excerpt: find it in its chunk (fuzzy), then map it to its place in the source.

An LLM quotes approximately (changed case, collapsed line breaks, a dropped word), so the excerpt
is matched with difflib and then replaced by the chunk's own text at that place: every excerpt we
return is verbatim. The place in the source:
- image chunks: the image (its URL, page and bbox for PDF, char offset for MHTML);
- an excerpt inside an inline image annotation `![description](url)`: that image;
- text and table chunks: the excerpt's char span in the document text, and for PDF the page and
  the union of the boxes of the elements it falls in. That needs the document's elements: when
  the source file is still where it was ingested from, it is reloaded (cached per file version)
  and the excerpt searched in the chunk's window of the document text; otherwise the span is the
  chunk start plus the offset in the chunk, and the box the chunk's box.
"""

from __future__ import annotations

import re
from difflib import SequenceMatcher
from functools import lru_cache
from pathlib import Path

from pydantic import BaseModel

from vision_rag_pipeline.chunks.annotations import find_annotations
from vision_rag_pipeline.core.text import CJK_CHAR
from vision_rag_pipeline.documents.loader import load_document
from vision_rag_pipeline.documents.model import BBox, DocumentError, LoadedDocument
from vision_rag_pipeline.query.search import Hit

MIN_MATCH_RATIO = 0.75  # below this an excerpt is not considered found in the chunk
# where an excerpt may start or end: a word boundary, or any character of a script written without spaces
_WORD_START = re.compile(rf"(?<!\w)\w|{CJK_CHAR.pattern}")
_SPACES = re.compile(r"\s+")


class Match(BaseModel):
    start: int  # offsets into the searched text
    end: int
    ratio: float  # 1.0 = exact up to case and whitespace


class SourceLocation(BaseModel):
    page: int | None = None
    bbox: BBox | None = None
    char_span: tuple[int, int] | None = None
    image: str | None = None


def _normalized(text: str) -> tuple[str, list[int]]:
    """Lower-cased text with whitespace runs collapsed to one space, and each char's original index."""
    chars: list[str] = []
    index: list[int] = []
    previous_space = False
    for position, char in enumerate(text):
        if char.isspace():
            if previous_space or not chars:
                continue
            char, previous_space = " ", True
        else:
            previous_space = False
        chars.append(char.lower())
        index.append(position)
    return "".join(chars), index


def find_excerpt(excerpt: str, text: str, min_ratio: float = MIN_MATCH_RATIO) -> Match | None:
    """Where `excerpt` is in `text`: exact, then ignoring case and whitespace, then fuzzy (difflib).

    The fuzzy search slides a window of the excerpt's length over word starts and keeps the best
    ratio, then trims the window to whole words; `None` when even the best is below `min_ratio`.
    """
    excerpt = excerpt.strip()
    if not excerpt or not text:
        return None
    position = text.find(excerpt)
    if position >= 0:
        return Match(start=position, end=position + len(excerpt), ratio=1.0)
    norm_text, index = _normalized(text)
    norm_excerpt = _SPACES.sub(" ", excerpt.lower())
    position = norm_text.find(norm_excerpt)
    if position >= 0:
        return Match(start=index[position], end=index[position + len(norm_excerpt) - 1] + 1, ratio=1.0)
    best: tuple[float, int, int] | None = None
    size = len(norm_excerpt)
    matcher = SequenceMatcher(autojunk=False)
    matcher.set_seq2(norm_excerpt)
    starts = [0] + [m.start() for m in _WORD_START.finditer(norm_text)]
    for start in dict.fromkeys(starts):
        for length in {size, int(size * 0.9), int(size * 1.1)}:
            window = norm_text[start : start + length]
            matcher.set_seq1(window)
            if best is not None and matcher.real_quick_ratio() <= best[0]:
                continue
            if best is not None and matcher.quick_ratio() <= best[0]:
                continue
            ratio = matcher.ratio()
            if best is None or ratio > best[0]:
                best = (ratio, start, start + len(window))
    if best is None or best[0] < min_ratio:
        return None
    ratio, start, end = best
    end = _word_end(norm_text, end)
    while end > start and norm_text[end - 1] == " ":
        end -= 1
    return Match(start=index[start], end=index[end - 1] + 1, ratio=round(ratio, 3))


def _word_end(text: str, end: int) -> int:
    """Extend a cut-off last word to its end, so an excerpt never stops mid-word (Chinese has no
    words to finish: every character is a boundary)."""
    while end < len(text) and end > 0 and _continues_word(text[end - 1]) and _continues_word(text[end]):
        end += 1
    return end


@lru_cache(maxsize=16)
def _continues_word(char: str) -> bool:
    return char.isalnum() and not CJK_CHAR.match(char)


def _load(path: str, mtime_ns: int, size: int) -> LoadedDocument | None:
    """The source document's elements, cached per file version (mtime and size are the key)."""
    try:
        return load_document(path)
    except (DocumentError, OSError):
        return None


def _source_document(source: str) -> LoadedDocument | None:
    path = Path(source)
    try:
        stat = path.stat()
    except OSError:
        return None
    return _load(str(path), stat.st_mtime_ns, stat.st_size) if path.is_file() else None


def locate(hit: Hit, match: Match) -> SourceLocation:
    """The source location of `hit.text[match.start:match.end]`."""
    if hit.kind == "image":
        return SourceLocation(page=hit.page, bbox=hit.bbox, char_span=hit.char_span, image=hit.image)
    for note in find_annotations(hit.text):
        if note.start <= match.start and match.end <= note.end:
            return SourceLocation(page=hit.page, bbox=hit.bbox, image=note.url)
    excerpt = hit.text[match.start : match.end]
    fallback = SourceLocation(
        page=hit.page,
        bbox=hit.bbox,
        char_span=(hit.char_span[0] + match.start, hit.char_span[0] + match.end) if hit.char_span else None,
    )
    document = _source_document(hit.document)
    if document is None or hit.char_span is None:
        return fallback
    full_text = document.text
    window_start = max(0, hit.char_span[0] - 50)
    window = full_text[window_start : hit.char_span[1] + 50]
    found = find_excerpt(excerpt, window)
    if found is None:
        return fallback  # the file changed since it was indexed
    span = (window_start + found.start, window_start + found.end)
    if document.mime != "application/pdf":
        return SourceLocation(page=hit.page, bbox=hit.bbox, char_span=span)
    touched = [
        e.location
        for e in document.elements
        if e.location.char_span and e.location.char_span[0] < span[1] and span[0] < e.location.char_span[1]
    ]
    pages = [loc.page for loc in touched if loc.page is not None]
    if not pages:
        return SourceLocation(page=hit.page, bbox=hit.bbox, char_span=span)
    page = pages[0]
    boxes = [loc.bbox for loc in touched if loc.page == page and loc.bbox is not None]
    bbox = (
        (
            min(b[0] for b in boxes),
            min(b[1] for b in boxes),
            max(b[2] for b in boxes),
            max(b[3] for b in boxes),
        )
        if boxes
        else hit.bbox
    )
    return SourceLocation(page=page, bbox=bbox, char_span=span)
