"""A chart's values paired with their category labels by layout, from the OCR words' boxes.

OCR reads a chart as a column of numbers and a row of labels ("60 · 50 · 45.9 · 41.7 · Q2 · Q3"):
which value belongs to which category is lost, so "how much in Q2" cannot be answered from the
text. On the page it is plain: a vertical bar's value label stands in the same x-band as its
category label below the axis, a horizontal bar's in the same y-band as its label on the left.

Only layout decides, never words, and only when it is unambiguous: the category labels evenly
spaced along one axis, every value label in their bands centred on a label, and every label
holding as many values as the others (one per series). Anything else pairs nothing: a missing
pairing costs little (the raw OCR text is kept), a wrong one would be a confident wrong answer.
Axis ticks (evenly stepped numbers in a row or column) are never values.
"""

from __future__ import annotations

import re
import statistics
from dataclasses import dataclass

from vision_rag_pipeline.enrichment.model import OcrWord

_VALUE = re.compile(r"^[(\-+−]?[$€£¥]?\d[\d.,]*%?[kKmMbB]?\)?$")
_YEAR = re.compile(r"^(19|20)\d\d$")  # a year is a category (2014 2015 2016 under the bars), not a value
MAX_SERIES = 4  # values per category beyond this are a table or a crowd of labels, not series
SPACING_SPREAD = 1.25  # evenly spaced categories: largest gap at most this times the smallest
SMALLEST_VALUE = 0.7  # of the median number height: smaller "numbers" are specks and bar edges
SURE_LABEL = 70.0  # OCR confidence a label needs: OCR keeps unscored words at 60, garbage included
SURE_DIGIT = 90.0  # OCR confidence a one-character value needs (bar edges read as "5", "7")
CENTRED = 0.25  # a value (or a group's mean) lies within this share of the category spacing of its label


@dataclass(frozen=True)
class _Cell:
    """Words on one line standing close together: a label, a value, a title."""

    text: str
    left: float
    top: float
    right: float
    bottom: float
    conf: float

    @property
    def cx(self) -> float:
        return (self.left + self.right) / 2

    @property
    def cy(self) -> float:
        return (self.top + self.bottom) / 2

    @property
    def height(self) -> float:
        return self.bottom - self.top

    @property
    def is_value(self) -> bool:
        return bool(_VALUE.match(self.text)) and not _YEAR.match(self.text)

    @property
    def is_label(self) -> bool:
        """A word or a year, read with some certainty: a lone letter is more often a bar's edge or a
        speck, and words Tesseract doubts are misreadings (a mirrored scan's "ClocK Hie" at 60)."""
        letters = sum(c.isalnum() for c in self.text)
        word = letters >= 2 and any(c.isalpha() for c in self.text)
        return (word or bool(_YEAR.match(self.text))) and self.conf >= SURE_LABEL


def _distinct_words(words: list[OcrWord]) -> list[OcrWord]:
    """One reading per box: several OCR passes read the same word; the surest reading is kept."""
    kept: list[OcrWord] = []
    for word in sorted(words, key=lambda w: -w.conf):
        if not any(_overlap(word, other) >= 0.5 for other in kept):
            kept.append(word)
    return kept


def _overlap(a: OcrWord, b: OcrWord) -> float:
    """Intersection over the smaller box."""
    width = min(a.left + a.width, b.left + b.width) - max(a.left, b.left)
    height = min(a.top + a.height, b.top + b.height) - max(a.top, b.top)
    if width <= 0 or height <= 0:
        return 0.0
    return width * height / max(1, min(a.width * a.height, b.width * b.height))


def cells(words: list[OcrWord]) -> list[_Cell]:
    """Words joined into cells: same line, separated by less than a letter's height."""
    groups: list[list[OcrWord]] = []
    for word in sorted(_distinct_words(words), key=lambda w: w.left):
        middle = word.top + word.height / 2
        for group in groups:
            last = group[-1]
            height = max(last.height, word.height)
            gap = word.left - (last.left + last.width)
            if (
                abs(last.top + last.height / 2 - middle) <= 0.4 * height
                and -0.5 * height <= gap <= 0.8 * height
            ):
                group.append(word)
                break
        else:
            groups.append([word])
    return [
        _Cell(
            text=" ".join(w.text for w in group),
            left=group[0].left,
            top=min(w.top for w in group),
            right=max(w.left + w.width for w in group),
            bottom=max(w.top + w.height for w in group),
            conf=min(w.conf for w in group),
        )
        for group in groups
    ]


def number_value(text: str) -> float | None:
    """The value of a number as OCR reads it on a chart ("1,250", "$4.5k", "45%"), signs and units aside."""
    digits = re.sub(r"[^\d.]", "", text.replace(",", ""))
    try:
        return float(digits)
    except ValueError:
        return None


def evenly_stepped(values: list[float], tolerance: float) -> bool:
    """Three or more values, each step within `tolerance` (a share of the first) of the first: axis ticks."""
    if len(values) < 3:
        return False
    steps = [b - a for a, b in zip(values, values[1:], strict=False)]
    return steps[0] != 0 and all(abs(step - steps[0]) <= tolerance * abs(steps[0]) for step in steps)


def _is_tick_run(run: list[_Cell]) -> bool:
    """Three or more numbers stepping evenly in value (OCR boxes are not exact: within 1 %)."""
    values = [number_value(c.text) for c in run]
    return None not in values and evenly_stepped(values, 0.01)  # type: ignore[arg-type]


def _ticks(values: list[_Cell]) -> set[_Cell]:
    """Values that are axis ticks: a column aligned on one edge or a row on one line, evenly stepped."""
    ticks: set[_Cell] = set()
    for value in values:
        height = value.height
        column = sorted(
            (
                v
                for v in values
                if abs(v.right - value.right) <= 0.6 * height or abs(v.left - value.left) <= 0.6 * height
            ),
            key=lambda c: c.cy,
        )
        row = sorted((v for v in values if abs(v.cy - value.cy) <= 0.5 * height), key=lambda c: c.cx)
        for run in (column, row):
            if _is_tick_run(run):
                ticks.update(run)
    return ticks


def _evenly_spaced(positions: list[float]) -> float | None:
    """The spacing of evenly spaced positions (sorted), or None."""
    gaps = [b - a for a, b in zip(positions, positions[1:], strict=False)]
    if not gaps or min(gaps) <= 0 or max(gaps) > SPACING_SPREAD * min(gaps):
        return None
    return statistics.median(gaps)


def _pair(
    labels: list[_Cell], values: list[_Cell], across: str, on_line: bool = False
) -> list[tuple[str, list[str]]] | None:
    """Values grouped under the label whose band (along `across`: "cx" or "cy") they stand in.

    None unless every label gets the same number of values (1..MAX_SERIES), centred on it, and with
    `on_line` each value on its label's line of text (a horizontal bar's value is; a table row's
    neighbour is not, though it may fall in the band of a label whose own row went unread).
    """
    labels = sorted(labels, key=lambda c: getattr(c, across))
    centres = [getattr(c, across) for c in labels]
    spacing = _evenly_spaced(centres)
    if spacing is None:
        return None
    bands: list[list[_Cell]] = [[] for _ in labels]
    for value in values:
        position = getattr(value, across)
        if centres[0] - spacing / 2 <= position <= centres[-1] + spacing / 2:
            nearest = min(range(len(labels)), key=lambda i: abs(centres[i] - position))
            bands[nearest].append(value)
    count = len(bands[0])
    if not 1 <= count <= MAX_SERIES or any(len(band) != count for band in bands):
        return None
    for label, centre, band in zip(labels, centres, bands, strict=True):
        if abs(statistics.fmean(getattr(v, across) for v in band) - centre) > CENTRED * spacing:
            return None
        if on_line and any(abs(v.cy - label.cy) > max(v.height, label.height) for v in band):
            return None
    return [
        (label.text, [v.text for v in sorted(band, key=lambda c: (round(c.cx / c.height), c.cy))])
        for label, band in zip(labels, bands, strict=True)
    ]


def _rows_of(cells_: list[_Cell]) -> list[list[_Cell]]:
    """Cells grouped by line (centres within half a letter's height), each left to right."""
    rows: list[list[_Cell]] = []
    for cell in sorted(cells_, key=lambda c: c.cy):
        if rows and abs(rows[-1][-1].cy - cell.cy) <= 0.5 * max(cell.height, rows[-1][-1].height):
            rows[-1].append(cell)
        else:
            rows.append([cell])
    return [sorted(row, key=lambda c: c.cx) for row in rows]


def _vertical(labels: list[_Cell], values: list[_Cell]) -> list[tuple[str, list[str]]] | None:
    """Category labels in a row under the plot; values above them in their x-band, below any other label row.

    Nothing is paired when those values could as well be another row's: when the label row above
    them pairs with them too, or when a number stands right under these labels in their span (a
    grid of tiles, each a label over its value, pairs each label with the tile above otherwise).
    """
    rows = [row for row in _rows_of(labels) if len(row) >= 2]
    for index in range(len(rows) - 1, -1, -1):  # the lowest row first: the category axis
        row = rows[index]
        ceiling = max((c.bottom for c in rows[index - 1]), default=float("-inf")) if index else float("-inf")
        above = [v for v in values if ceiling <= v.top and v.bottom <= min(c.top for c in row)]
        if paired := _pair(row, above, "cx"):
            floor, height = max(c.bottom for c in row), max(c.height for c in row)
            half = (row[-1].cx - row[0].cx) / (2 * (len(row) - 1))
            under = [
                v
                for v in values
                if floor <= v.top <= floor + 3 * height and row[0].cx - half <= v.cx <= row[-1].cx + half
            ]
            lent = bool(index) and _pair(rows[index - 1], above, "cx") is not None
            return None if lent or under else paired
    return None


def _horizontal(labels: list[_Cell], values: list[_Cell]) -> list[tuple[str, list[str]]] | None:
    """Category labels in a column (one edge aligned); values right of them in their y-band, with no
    other label in between (a second text column makes it a table or two charts)."""
    for edge in ("left", "right"):
        for anchor in labels:
            column = [c for c in labels if abs(getattr(c, edge) - getattr(anchor, edge)) <= anchor.height]
            if len(column) < 2 or anchor is not min(column, key=lambda c: c.cy):
                continue
            start = max(c.right for c in column)
            top = min(c.top for c in column)
            bottom = max(c.bottom for c in column)
            beside = [v for v in values if v.left >= start and top - v.height <= v.cy <= bottom + v.height]
            if not beside:
                continue
            end = max(v.right for v in beside)
            if any(c not in column and start <= c.left < end and top <= c.cy <= bottom for c in labels):
                continue
            if paired := _pair(column, beside, "cy", on_line=True):
                return paired
    return None


def _legible(values: list[_Cell]) -> list[_Cell]:
    """Values read as text, not as a bar's edge: a lone digit only when Tesseract is sure of it, and
    none much smaller than the chart's other numbers (a chart writes its values in one size)."""
    if not values:
        return []
    typical = statistics.median(v.height for v in values)
    return [
        v
        for v in values
        if v.height >= SMALLEST_VALUE * typical and (len(v.text) > 1 or v.conf >= SURE_DIGIT)
    ]


def chart_rows(words: list[OcrWord]) -> list[str]:
    """Lines "label: value" (values of several series joined by " · "); none unless the layout is clear."""
    found = cells(words)
    values = _legible([c for c in found if c.is_value])
    values = [v for v in values if v not in _ticks(values)]
    labels = [c for c in found if c.is_label and not c.is_value]
    if not values or len(labels) < 2:
        return []
    paired = _vertical(labels, values) or _horizontal(labels, values)
    return [f"{label}: {' · '.join(series)}" for label, series in paired or []]
