"""Recursive character splitting (as LangChain's RecursiveCharacterTextSplitter) that never breaks an image
annotation.

The text is split on the first separator that occurs, the splits are merged up to `chunk_size` with
`chunk_overlap` carried from the previous piece, and splits still too long are split again with the next
separator, finally character by character. Annotations are atomic units at every level: separators inside
them are ignored and pieces and overlaps start and end only around whole annotations. An annotation longer
than `chunk_size` has its description split instead, each part re-wrapped as `![part](url)`.

Splits keep their separator at their start, so merged pieces are contiguous regions of the text and
`text[piece.start:piece.end] == piece.text` for every piece that is not a re-wrapped description part.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Sequence
from dataclasses import dataclass

from vision_rag_pipeline.chunks.annotations import Annotation, annotation, find_annotations

DEFAULT_SEPARATORS = ("\n\n", "\n", " ")
_ANNOTATION_FRAME_LENGTH = len("![](") + len(")")


@dataclass(frozen=True, slots=True)
class TextPiece:
    """A piece of the text and the region `[start, end)` of the text it covers.

    For a re-wrapped part of a long annotation (`rewrapped`), `start`/`end` is the span of the description
    part in the original annotation and `text` is that part wrapped as `![part](url)`.
    """

    text: str
    start: int
    end: int
    rewrapped: bool = False


def split_text(
    text: str, chunk_size: int, chunk_overlap: int, separators: Sequence[str] = DEFAULT_SEPARATORS
) -> list[TextPiece]:
    """Pieces of at most `chunk_size` characters, in text order, with no image annotation broken.

    A piece is longer than `chunk_size` only when it is one annotation whose URL alone leaves no room for
    a description.
    """
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be at least 1, got {chunk_size}")
    if not 0 <= chunk_overlap < chunk_size:
        raise ValueError(f"chunk_overlap must be in [0, chunk_size={chunk_size}), got {chunk_overlap}")
    if not separators or not all(separators):
        raise ValueError(
            f"separators must be non-empty strings (characters are the implicit last one), got {separators!r}"
        )
    return _Splitter(text, find_annotations(text), chunk_size, chunk_overlap, tuple(separators)).split()


class _Splitter:
    """The state of one split: the text, its annotations and the size limits."""

    def __init__(
        self,
        text: str,
        annotations: list[Annotation],
        chunk_size: int,
        chunk_overlap: int,
        separators: tuple[str, ...],
    ) -> None:
        self.text = text
        self.annotations = annotations
        self.annotation_starts = [found.start for found in annotations]
        self.annotation_by_start = {found.start: found for found in annotations}
        self.chunk_size = chunk_size
        self.chunk_overlap = chunk_overlap
        self.separators = separators
        self.separator_res = [re.compile(re.escape(separator)) for separator in separators]

    def split(self) -> list[TextPiece]:
        return self._split_region(0, len(self.text), next_level=0)

    def _split_span(self, start: int, end: int, level: int) -> list[TextPiece]:
        """Split `[start, end)` (which holds only whole annotations) at the first level that cuts it."""
        while level < len(self.separators):
            bounds = self._separator_bounds(start, end, level)
            if len(bounds) > 2:
                break
            level += 1
        else:
            bounds = self._character_bounds(start, end)

        pieces: list[TextPiece] = []
        run_first = None  # index in bounds of the first split of the current run of splits that fit
        for index in range(len(bounds) - 1):
            split_start, split_end = bounds[index], bounds[index + 1]
            if split_end - split_start <= self.chunk_size:
                if run_first is None:
                    run_first = index
                continue
            if run_first is not None:
                pieces.extend(self._merge(bounds[run_first : index + 1]))
                run_first = None
            pieces.extend(self._split_region(split_start, split_end, next_level=level + 1))
        if run_first is not None:
            pieces.extend(self._merge(bounds[run_first:]))
        return pieces

    def _split_region(self, start: int, end: int, next_level: int) -> list[TextPiece]:
        """The region whole if it fits without its surrounding whitespace, re-wrapped parts if it is one long
        annotation, else split at `next_level`."""
        start, end = self._strip(start, end)
        if start == end:
            return []
        if end - start <= self.chunk_size:
            return [TextPiece(self.text[start:end], start, end)]
        found = self.annotation_by_start.get(start)
        if found is not None and found.end == end:
            return self._rewrap(found)
        return self._split_span(start, end, next_level)

    def _separator_bounds(self, start: int, end: int, level: int) -> list[int]:
        """`start`, every occurrence of the level's separator outside annotations, `end`."""
        bounds = [start]
        for match in self.separator_res[level].finditer(self.text, start, end):
            if match.start() > start and not self._inside_annotation(match.start(), match.end()):
                bounds.append(match.start())
        bounds.append(end)
        return bounds

    def _character_bounds(self, start: int, end: int) -> list[int]:
        """Every character boundary in `[start, end]` that is not inside an annotation."""
        bounds: list[int] = []
        position = start
        first = bisect.bisect_left(self.annotation_starts, start)
        last = bisect.bisect_left(self.annotation_starts, end)
        for found in self.annotations[first:last]:
            bounds.extend(range(position, found.start))
            bounds.append(found.start)
            position = found.end
        bounds.extend(range(position, end))
        bounds.append(end)
        return bounds

    def _inside_annotation(self, start: int, end: int) -> bool:
        """Whether `[start, end)` overlaps an annotation (annotations are sorted and never overlap)."""
        index = bisect.bisect_right(self.annotation_starts, end - 1) - 1
        return index >= 0 and self.annotations[index].end > start

    def _merge(self, bounds: list[int]) -> list[TextPiece]:
        """Merge the consecutive splits `[bounds[k], bounds[k + 1])` into pieces of at most chunk_size,
        each piece starting with up to chunk_overlap characters of whole splits from the previous one."""
        pieces: list[TextPiece] = []
        first = 0  # index in bounds where the current piece starts
        for index in range(1, len(bounds)):
            if bounds[index] - bounds[first] > self.chunk_size and index - 1 > first:
                self._append_piece(pieces, bounds[first], bounds[index - 1])
                while first < index - 1 and (
                    bounds[index - 1] - bounds[first] > self.chunk_overlap
                    or bounds[index] - bounds[first] > self.chunk_size
                ):
                    first += 1
        self._append_piece(pieces, bounds[first], bounds[-1])
        return pieces

    def _append_piece(self, pieces: list[TextPiece], start: int, end: int) -> None:
        """Append the stripped region unless it is empty or adds nothing to the previous piece."""
        start, end = self._strip(start, end)
        if start == end or (pieces and pieces[-1].end >= end):
            return
        pieces.append(TextPiece(self.text[start:end], start, end))

    def _rewrap(self, found: Annotation) -> list[TextPiece]:
        """Split a too-long annotation's description into parts, each re-wrapped as `![part](url)`."""
        description_budget = self.chunk_size - _ANNOTATION_FRAME_LENGTH - len(found.url)
        if description_budget < 1:
            return [TextPiece(self.text[found.start : found.end], found.start, found.end)]
        description_start = found.start + len("![")
        description_end = description_start + len(found.description)
        # keep the caller's overlap ratio for the description parts
        description_overlap = self.chunk_overlap * description_budget // self.chunk_size
        description_splitter = _Splitter(
            self.text, [], description_budget, description_overlap, self.separators
        )
        parts = description_splitter._split_span(description_start, description_end, 0)
        if not parts:
            return [TextPiece(self.text[found.start : found.end], found.start, found.end)]
        return [
            TextPiece(annotation(part.text, found.url), part.start, part.end, rewrapped=True)
            for part in parts
        ]

    def _strip(self, start: int, end: int) -> tuple[int, int]:
        """The region without its leading and trailing whitespace."""
        region = self.text[start:end]
        stripped_left = region.lstrip()
        if not stripped_left:
            return start, start
        return start + len(region) - len(stripped_left), end - (
            len(stripped_left) - len(stripped_left.rstrip())
        )
