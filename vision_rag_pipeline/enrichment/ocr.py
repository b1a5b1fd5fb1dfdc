"""Tesseract OCR that keeps the rows plain Tesseract drops.

Plain Tesseract loses the facts that matter most in report images: KPI tables (ruling lines wreck
its layout analysis), value labels inside coloured bars, light-on-dark dashboards, rotated scans,
small type. So each image is normalised once (colour-aware, polarity-free ink map with ruling lines
removed) and read by a few page-segmentation modes; every line any pass reads that the others missed
is kept. Crooked images are levelled first, turned upright when their first read is unsure and
Tesseract's orientation detection says their text runs another way, and blurred ones upscaled and
sharpened (all lose whole rows otherwise), and every number is read a second time, enlarged, in one
sheet: at chart sizes Tesseract drops decimal points ("746" for 74.6) more than anything else. At
most five Tesseract reads per image plus the re-read (and, for a page asked which way up it is, the
orientation detection and one read of it turned), each single-threaded: parallelism comes from
reading several images on threads (the engine releases the GIL while it reads).

Tesseract runs in-process through its C API (tesserocr), each engine keeping its language model
loaded: starting the `tesseract` binary costs about 145 ms per run here, mostly reloading the model,
against 3-10 ms for a chart-sized read with a loaded engine. The binary that pytesseract is configured
with is still what tells us the installed languages and where their traineddata lives, so OCR reads
the same models whichever way it is called. Engines are single-threaded; a thread takes one from a
small pool and returns it, so parallel reads never share an engine.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import re
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import pytesseract
import tesserocr
from PIL import Image, ImageChops, ImageFilter

from vision_rag_pipeline.enrichment.model import OcrLevel, OcrResult, OcrWord
from vision_rag_pipeline.enrichment.preprocess import (
    deskew,
    for_ocr,
    is_grey,
    long_runs,
    scale_for_ocr,
    sharpen_soft,
)

log = logging.getLogger(__name__)

# Bump when a change here changes what images read as: the enrichment cache key and the
# image_enrichments code version include it, so stale readings are recomputed, not served.
OCR_REVISION = 15
HIGH_CONFIDENCE = 85.0
MEDIUM_CONFIDENCE = 60.0
MAX_PASSES = 5
PASS_TIMEOUT_SECONDS = 60.0
WORD_MIN_CONFIDENCE = 30.0  # below this Tesseract is mostly reading texture, not letters
EXTRA_LINE_MIN_CONFIDENCE = 60.0  # a line a secondary pass adds must be this sure
UNREAD_INK_RATIO = 0.04  # secondary sparse pass when more ink than this lies outside read words
# a page the first read found no sure word on gets more reads only up to this size
SPECULATIVE_READ_MAX_PIXELS = 1_000_000
PROBE_MAX_SIDE = 1000
# a picture's first read is a photo's texture (`_reads_as_texture`) with this many words or more, at a
# mean confidence under this, and at most this many sure plain words
TEXTURE_MIN_WORDS = 5
TEXTURE_MAX_CONFIDENCE = 50.0
TEXTURE_MAX_SURE_WORDS = 2
REREAD_MAX_WORDS = 40  # numbers re-read per image (one sheet)
REREAD_TEXT_HEIGHT = 40  # px: digits this tall keep their decimal point
REREAD_MAX_SCALE = 4.0
DOT_INK_LEVEL = 160  # of 255 on the ink page: a blurred point is grey, not black
# a dot above the mark at most this much paler makes a colon with it; a paler one is blur's smudge
# (without it, 10 of 415 generated chart facts read as "43:5" or "535" stay wrong)
RAISED_DOT_LEVELS = 60
REREAD_INK_LEVEL = 100  # of 255 on the ink page (0 = surest ink): the grey fringe of a bar is not ink
# A first read of some words at a mean confidence under this asks which way up the text is
# (`read_upright`): on the real sets turned text read at 48-70, most upright text at 75 or more.
ORIENTATION_CHECK_BELOW = 75.0
OSD_MODEL = "osd"  # Tesseract's orientation and script detection model (Debian: tesseract-ocr-osd)
OSD_MIN_CONFIDENCE = 1.0  # under this, Tesseract's orientation guess is as often wrong as right
TURN_MIN_GAIN = 1.5  # the turned page's first read must promise this many times the characters

_CJK_GAP = re.compile(r"(?<=[\u3000-\u9fff\uff00-\uffef]) +(?=[\u3000-\u9fff\uff00-\uffef])")
_TOKEN = re.compile(r"\w+")
_MARK_BETWEEN_DIGITS = re.compile(r"(?<=\d)[^\d\s](?=\d)")
# Tesseract languages whose numbers write a decimal comma ("12,5 %"); the rest write a point
DECIMAL_COMMA_LANGUAGES = frozenset(
    [
        "deu",
        "fra",
        "spa",
        "ita",
        "nld",
        "por",
        "rus",
        "ukr",
        "pol",
        "ces",
        "slk",
        "slv",
        "hrv",
        "srp",
        "ron",
        "hun",
        "dan",
        "swe",
        "nor",
        "fin",
        "est",
        "lav",
        "lit",
        "tur",
        "ell",
        "bul",
        "ind",
        "vie",
    ]
)
_UNIT_SIGN = re.compile(r"^[%‰$€£¥]$")  # a sign read as a word of its own: "12,5 %"
_NUMBER = re.compile(r"^[$€£]?\d[\d.,:]*\d[%xX]?[.,:;]?$")  # two digits at least
_PLAIN_WORD = re.compile(r"^(?:[A-Za-z][a-z]{2,}|[A-Z]{3,}|[$€£]?\d+(?:[.,]\d+)*%?|[%‰$€£¥])[.,:;]?$")


class OcrError(RuntimeError):
    """Tesseract is missing or failed in a way that is not about the image."""


@dataclass(frozen=True)
class _Word:
    text: str
    conf: float
    left: int
    top: int
    width: int
    height: int


@dataclass
class _Line:
    words: list[_Word]
    order: int  # position in the pass's reading order
    unsure: int = 0  # words kept on probation: plain words Tesseract scored 0, numbers it doubted

    @property
    def text(self) -> str:
        return _CJK_GAP.sub("", " ".join(w.text for w in self.words))

    @property
    def top(self) -> int:
        return min(w.top for w in self.words)

    @property
    def conf(self) -> float:
        return sum(w.conf for w in self.words) / len(self.words)


@dataclass
class _Pass:
    name: str
    rotation: int
    lines: list[_Line] = field(default_factory=list)

    @property
    def words(self) -> list[_Word]:
        return [w for line in self.lines for w in line.words]

    @property
    def score(self) -> float:
        """Expected number of correctly read characters: what makes one reading better than another."""
        return sum(w.conf / 100 * len("".join(_TOKEN.findall(w.text))) for w in self.words)

    @property
    def mean_conf(self) -> float:
        words = self.words
        return sum(w.conf for w in words) / len(words) if words else 0.0


_TESSDATA_LINE = re.compile(r'"(?P<path>[^"]+)"')


@functools.lru_cache(maxsize=1)
def _installed_tessdata() -> tuple[str, frozenset[str]]:
    """(traineddata directory, languages in it) as the installed `tesseract` reports them; ("", {}) without it."""
    try:
        out = subprocess.run(
            [pytesseract.pytesseract.tesseract_cmd, "--list-langs"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return "", frozenset()
    header, *names = out.splitlines()
    found = _TESSDATA_LINE.search(header)
    directory = found.group("path") if found else ""
    languages = frozenset(n.strip() for n in names if n.strip() and n.strip() != "osd")
    return (directory.rstrip("/") + "/" if directory else ""), languages


@functools.cache
def traineddata_sha256(languages: tuple[str, ...]) -> str:
    """sha256 over these languages' traineddata files and the orientation model (`text_turn`) as this
    host's Tesseract finds them (`missing` for one it lacks): hosts whose models differ read
    differently under the same language names."""
    installed = available_languages() | ({OSD_MODEL} if _has_osd() else set())
    total = hashlib.sha256()
    for language in (*languages, OSD_MODEL):
        path = _model_path(language)
        total.update(f"{language}\n".encode())
        total.update(path.read_bytes() if language in installed and path.is_file() else b"missing")
    return total.hexdigest()


def _model_path(name: str) -> Path:
    return Path(_installed_tessdata()[0], f"{name}.traineddata")


@functools.cache
def _has_osd() -> bool:
    return bool(_installed_tessdata()[0]) and _model_path(OSD_MODEL).is_file()


def available_languages() -> set[str]:
    """Languages the local Tesseract has traineddata for (empty when Tesseract is not installed)."""
    return set(_installed_tessdata()[1])


# Leptonica (under Tesseract) writes its internal errors ("box outside rectangle") to stderr.
tesserocr.set_leptonica_log_level(tesserocr.LeptLogLevel.NONE)
_idle_engines: dict[str, list[tesserocr.PyTessBaseAPI]] = {}
_engines_lock = threading.Lock()


@contextmanager
def _engine(languages: list[str]) -> Iterator[tesserocr.PyTessBaseAPI]:
    """A loaded Tesseract engine for these languages, used by this thread alone until it is handed back."""
    key = "+".join(languages)
    with _engines_lock:
        idle = _idle_engines.setdefault(key, [])
        engine = idle.pop() if idle else None
    if engine is None:
        try:
            # Tesseract's diagnostics ("Empty page!!", resolution guesses) say nothing a user can act on
            engine = tesserocr.PyTessBaseAPI(
                path=_installed_tessdata()[0], lang=key, variables={"debug_file": "/dev/null"}
            )
        except RuntimeError as exc:
            raise OcrError(f"cannot load Tesseract models {key}: {exc}") from exc
    try:
        yield engine
    finally:
        with _engines_lock:
            _idle_engines[key].append(engine)


def missing_language_error(language: str) -> str:
    """The one line that stops OCR on a host without a configured language's traineddata."""
    package = "tesseract-ocr-" + language.replace("_", "-").lower()
    return (
        f"OCR language '{language}' is configured but not installed on this host: install it with "
        f"`apt-get install {package}` or drop it from media_enrichment.ocr.languages"
    )


def missing_languages(languages: list[str]) -> list[str]:
    """The configured languages the local Tesseract has no traineddata for."""
    installed = available_languages()
    return [language for language in languages if language not in installed]


def usable_languages(languages: list[str]) -> list[str]:
    """The requested languages, once each, in order; OcrError naming the first one this host lacks.

    Never English instead: a host without a configured language would index other words than the
    hosts that have it, under the same code version.
    """
    if not available_languages():
        raise OcrError("tesseract is not installed or not on PATH (apt-get install tesseract-ocr)")
    if missing := missing_languages(languages):
        raise OcrError(missing_language_error(missing[0]))
    return list(dict.fromkeys(languages))


def confidence_level(confidence: float) -> OcrLevel:
    """Mean word confidence (0-100) -> the `[OCR_Confidence]` level of the Meta-Content chunk."""
    if confidence >= HIGH_CONFIDENCE:
        return "High"
    if confidence >= MEDIUM_CONFIDENCE:
        return "Medium"
    return "Low"


def _run_tesseract(
    gray: Image.Image, psm: int, languages: list[str], *, polarity_free: bool = True
) -> list[_Line]:
    """One Tesseract read; its words grouped in Tesseract's lines, in its reading order.

    Tesseract reads every word it is unsure of a second time, inverted, in case it is light on
    dark. On a polarity-free ink page (`ink_map`) all text is already dark on light, so that
    second read finds nothing and costs 11-12 % of the OCR time on the real corpus images
    (`bench/bench_ocr_real.py`); only reads of an image as it is (`probe_text`) keep it.
    """
    return _parse_tsv(read_tsv(gray, psm, languages, polarity_free=polarity_free))


def read_tsv(gray: Image.Image, psm: int, languages: list[str], *, polarity_free: bool = True) -> str:
    """One Tesseract read, as Tesseract's TSV (empty when the read timed out)."""
    with _engine(languages) as engine:
        engine.SetVariable("tessedit_do_invert", "0" if polarity_free else "1")
        engine.SetPageSegMode(psm)
        engine.SetImage(gray)
        if not engine.Recognize(timeout=round(PASS_TIMEOUT_SECONDS * 1000)):
            log.warning(
                "Tesseract pass psm %d gave up (timeout %.0f s); pass skipped", psm, PASS_TIMEOUT_SECONDS
            )
            return ""
        return engine.GetTSVText(0)


@dataclass(frozen=True)
class TsvWord:
    """A word of Tesseract's TSV as read, however unsure, with the line it belongs to."""

    text: str
    conf: float
    line: tuple[str, str, str]  # block, paragraph, line numbers
    left: int
    top: int
    width: int
    height: int


def tsv_words(tsv: str) -> list[TsvWord]:
    """Every non-empty word of a TSV read, in reading order."""
    words = []
    for row in tsv.splitlines():
        cells = row.split("\t")
        if len(cells) >= 12 and cells[0] == "5" and cells[11].strip():
            words.append(
                TsvWord(
                    cells[11].strip(),
                    float(cells[10]),
                    (cells[2], cells[3], cells[4]),
                    *map(int, cells[6:10]),
                )
            )
    return words


def _parse_tsv(tsv: str) -> list[_Line]:
    """Tesseract's words grouped by line; unsure words dropped, some kept on probation.

    Tesseract 5 sometimes scores a correctly read word 0 ("1,611 invoices" in a line whose other
    words score 95): such a word is kept, at medium confidence, when it is a plain word or number.
    A number it doubts (blurred "638.3" at 6) is kept at its score until the re-reading confirms, corrects or
    drops it (`_reread_numbers`, `_without_doubtful_words`). Either needs a sure word on its line.
    """
    lines: dict[tuple[str, str, str], _Line] = {}
    for read in tsv_words(tsv):
        text, conf = read.text, read.conf
        unscored = conf == 0 and bool(_PLAIN_WORD.match(text))
        doubtful = conf < WORD_MIN_CONFIDENCE and not unscored and bool(_NUMBER.match(text))
        if conf < WORD_MIN_CONFIDENCE and not (unscored or doubtful):
            continue
        if not _TOKEN.search(text) and not _UNIT_SIGN.match(text):
            continue
        word = _Word(
            text, MEDIUM_CONFIDENCE if unscored else conf, read.left, read.top, read.width, read.height
        )
        if read.line not in lines:
            lines[read.line] = _Line([], len(lines))
        lines[read.line].words.append(word)
        lines[read.line].unsure += unscored or doubtful
    return [line for line in lines.values() if len(line.words) > line.unsure and not _is_debris(line)]


def _is_debris(line: _Line) -> bool:
    """One or two characters alone on a line, not read with certainty: a corner, tick or bullet."""
    return len("".join(_TOKEN.findall(line.text))) < 3 and line.conf < 90


def ink_map(rgb: Image.Image, text_height: float | None) -> np.ndarray:
    """How far each pixel departs from its local background, 0-255, over the most telling channel.

    The background is a median over a window wider than any stroke (the median of 7x7 blocks'
    medians, `_block_medians`), so it follows coloured bars and dark panels but not letters: white
    labels inside a dark bar and dark text on a white page both become ink, and red-on-green text
    does not vanish in a grey conversion. `rgb` may be greyscale (`prepare_page`'s images without
    colour).
    """
    window = max(24.0, 1.5 * (text_height or 16.0))
    factor = max(2, round(window / 7))
    small = _block_medians(rgb, factor)
    background = small.filter(ImageFilter.MedianFilter(7)).resize(rgb.size, Image.Resampling.BILINEAR)
    difference = ImageChops.difference(rgb, background)
    if difference.mode == "L":  # a greyscale image: its one channel is the most telling
        return np.asarray(difference)
    red, green, blue = difference.split()
    return np.asarray(ImageChops.lighter(ImageChops.lighter(red, green), blue))


def _block_medians(img: Image.Image, factor: int) -> Image.Image:
    """`img` reduced `factor` times, each pixel the median of its `factor` x `factor` block.

    A median, not a mean: a block of dense text (table rows a line apart, blurred by an upscaled
    scan) averages to grey, and the window's median of such means took that grey for the page's
    background, so the paper behind the text became a grey blotch on the ink page. A block's median
    is its paper wherever letters cover less than half of it.
    """
    pixels = np.asarray(img)
    rows, columns = -(-pixels.shape[0] // factor), -(-pixels.shape[1] // factor)
    if (rows * factor, columns * factor) != pixels.shape[:2]:  # edge pixels fill the last blocks
        tail = ((0, rows * factor - pixels.shape[0]), (0, columns * factor - pixels.shape[1]))
        pixels = np.pad(pixels, tail + ((0, 0),) * (pixels.ndim - 2), mode="edge")
    blocks = pixels.reshape(rows, factor, columns, factor, *pixels.shape[2:]).swapaxes(1, 2)
    blocks = blocks.reshape(rows, columns, factor * factor, *pixels.shape[2:])
    middle = factor * factor // 2
    return Image.fromarray(np.partition(blocks, middle, axis=2)[:, :, middle], mode=img.mode)


def remove_ruling_lines(ink: np.ndarray, text_height: float | None) -> tuple[np.ndarray, int]:
    """Blank long thin horizontal and vertical strokes (table grids, axes, bar edges).

    Returns the cleaned ink map and how many pixels were removed. A stroke counts as a rule when
    it runs longer than several characters and is thinner than a letter, so blurred text whose
    letters touch is left alone.
    """
    height = text_height or 16.0
    mask = ink > 80
    min_length = max(40, round(4 * height))
    max_thickness = max(3, round(0.4 * height))
    horizontal = long_runs(mask, 1, min_length)
    horizontal &= ~long_runs(horizontal, 0, max_thickness + 1)
    vertical = long_runs(mask, 0, min_length)
    vertical &= ~long_runs(vertical, 1, max_thickness + 1)
    rules = horizontal | vertical
    if not rules.any():
        return ink, 0
    rules = _widen(rules, max_thickness // 2)  # a rule's fringe and the corners where rules meet
    cleaned = ink.copy()
    cleaned[rules] = 0
    return cleaned, int(rules.sum())


def _widen(mask: np.ndarray, reach: int) -> np.ndarray:
    """Dilate a mask by `reach` pixels in every direction (separable square max filter)."""
    out = mask.copy()
    for axis in (0, 1):
        grown = out.copy()
        for shift in range(1, reach + 1):
            ahead = [slice(None), slice(None)]
            behind = [slice(None), slice(None)]
            ahead[axis], behind[axis] = slice(shift, None), slice(None, -shift)
            grown[tuple(behind)] |= out[tuple(ahead)]
            grown[tuple(ahead)] |= out[tuple(behind)]
        out = grown
    return out


def _as_page(ink: np.ndarray) -> Image.Image:
    """Ink map -> black text on white, contrast stretched, the way Tesseract likes it."""
    cumulative = np.cumsum(np.bincount(ink.ravel(), minlength=256))
    peak = max(float(np.searchsorted(cumulative, 0.995 * cumulative[-1])), 40.0)
    scaled = np.clip(np.arange(256, dtype=np.float32) * (255.0 / peak), 0, 255)
    return Image.fromarray((255 - scaled).astype(np.uint8)[ink], mode="L")  # by table, per grey level


def _unread_ink(page: Image.Image, lines: list[_Line]) -> tuple[np.ndarray, np.ndarray]:
    """(ink mask, the part of it no read word covers).

    A word box far wider than its letters (a chart's line read as "O79") covers nothing.
    """
    ink = np.asarray(page) < 128
    covered = np.zeros_like(ink)
    for word in (w for line in lines for w in line.words if w.width <= w.height * (len(w.text) + 1)):
        pad = max(2, word.height // 3)
        covered[
            max(0, word.top - pad) : word.top + word.height + pad,
            max(0, word.left - pad) : word.left + word.width + pad,
        ] = True
    return ink, ink & ~covered


def _more_reads_may_pay(page: Image.Image, first: _Pass) -> bool:
    """The sparse, other-layout and upside-down reads are worth their cost after a first read sure of
    some word (even a page upside down gives a few: 3-45 on each of mmlongbench's scanned
    datasheet pages), or on a small page, where they are cheap (an icon's "DATABASE"). On a bigger
    page without one they read a photo's texture: on the real sets that cost seconds per image
    (13 s for one 12-megapixel photo) and added only noise words ("bee", "foe", "poe"). A page
    whose ink runs vertically is still read turned by 90 and 270 degrees: a table on its side gives
    no sure word until turned."""
    return _any_sure_word(first.lines) or page.width * page.height <= SPECULATIVE_READ_MAX_PIXELS


def _reads_as_texture(first: _Pass) -> bool:
    """The first read of a picture is a photo's texture taken for letters: many words ("SS ee Se"), at
    a mean confidence well under Medium, and hardly a sure plain word. More reads (sparse, other
    layout, turned, re-read sheets) would only add to a reading that ends Low and so is not indexed:
    on the real sets such pictures (a 12-megapixel seascape read as 207 words at 42) took a third of
    the OCR time of pictures. A first read that finds little or nothing is not texture: the sparse
    read finds the labels of a small chart that the layout read missed."""
    words = [w for w in first.words if w.conf >= WORD_MIN_CONFIDENCE]
    sure = [
        w
        for w in words
        if w.conf >= HIGH_CONFIDENCE and _PLAIN_WORD.match(w.text) and letter_count(w.text) >= 3
    ]
    return (
        len(first.words) >= TEXTURE_MIN_WORDS
        and sum(w.conf for w in words) < TEXTURE_MAX_CONFIDENCE * max(1, len(words))
        and len(sure) <= TEXTURE_MAX_SURE_WORDS
    )


def letter_count(text: str) -> int:
    return sum(c.isalpha() for c in text)


def _any_sure_word(lines: list[_Line]) -> bool:
    return any(w.conf >= HIGH_CONFIDENCE for line in lines for w in line.words)


def _unread_ink_ratio(page: Image.Image, lines: list[_Line]) -> float:
    """Share of the ink that no read word covers: labels a layout pass skipped."""
    ink, unread = _unread_ink(page, lines)
    total = int(ink.sum())
    return float(unread.sum()) / total if total else 0.0


def _leftover_labels(
    page: Image.Image, lines: list[_Line], text_height: float
) -> list[tuple[int, int, int, int]]:
    """Boxes (left, top, right, bottom) of unread glyph rows: a value label no pass read.

    A label sitting on a chart's line or beside its marker is lost by every page-level pass
    (Tesseract takes the line for part of the text). Unread ink is cut into connected blobs;
    blobs of a glyph's height side by side on one baseline form a label, at least two glyphs
    wide. Lines, bars and markers are other shapes and stay out.
    """
    _, unread = _unread_ink(page, lines)
    _, blobs = _connected_blobs(unread)
    glyphs = sorted(
        (cols.start, rows.start, cols.stop, rows.stop)
        for rows, cols in blobs
        if 0.5 * text_height <= rows.stop - rows.start <= 1.6 * text_height
        and cols.stop - cols.start <= 1.5 * (rows.stop - rows.start)
    )
    rows_of_glyphs: list[list[tuple[int, int, int, int]]] = []
    for glyph in glyphs:
        for row in rows_of_glyphs:
            last = row[-1]
            overlap = min(last[3], glyph[3]) - max(last[1], glyph[1])
            if glyph[0] - last[2] <= 0.8 * text_height and overlap >= 0.6 * (glyph[3] - glyph[1]):
                row.append(glyph)
                break
        else:
            rows_of_glyphs.append([glyph])
    return [
        (min(g[0] for g in row), min(g[1] for g in row), max(g[2] for g in row), max(g[3] for g in row))
        for row in rows_of_glyphs
        if len(row) >= 2
    ][:REREAD_MAX_WORDS]


def _connected_blobs(mask: np.ndarray) -> tuple[np.ndarray, list[tuple[slice, slice]]]:
    """The mask's 8-connected blobs: a label image (blob n is n) and each blob's (rows, columns) slices.

    SciPy is imported here, on the first use, not with the module: `scipy.ndimage` takes ~0.45 s to
    import, and every `vision-rag` command that loads the Dagster definitions imports this module
    (an unchanged ingest, which reads no image, paid it on every run).
    """
    from scipy import ndimage

    labels, _ = ndimage.label(mask, structure=np.ones((3, 3)))
    return labels, ndimage.find_objects(labels)


def _looks_vertical(page: Image.Image) -> bool:
    """Text lines run top to bottom: the column profile of the ink is striped, the row profile is not."""
    ink = np.asarray(page) < 128
    if ink.sum() < 50:
        return False
    row_profile, column_profile = ink.mean(axis=1), ink.mean(axis=0)
    rows_striped = row_profile.std() / row_profile.mean()
    columns_striped = column_profile.std() / column_profile.mean()
    return bool(columns_striped > 1.5 * rows_striped)


def _digits(text: str) -> str:
    return "".join(c for c in text if c.isdigit())


def _marks(text: str) -> list[str]:
    """The marks between digits ("1.234,56" -> [".", ","]): separators, whatever the locale."""
    return _MARK_BETWEEN_DIGITS.findall(text)


def _adds_marks_only(old: str, new: str) -> bool:
    """`new` is `old` with marks put between its digits, nothing else changed: "746" -> "74.6".

    A mark the first reading had is never rewritten or dropped: "12,5" is not "12.5" and "10:30"
    not "10.30". Which mark a locale uses is the page's business, not ours.
    """
    inserted = iter(new)
    return (
        _MARK_BETWEEN_DIGITS.sub("", new) == _MARK_BETWEEN_DIGITS.sub("", old)
        and all(char in inserted for char in old)
        and len(_marks(new)) > len(_marks(old))
    )


def decimal_mark(languages: list[str]) -> str:
    """The decimal mark of the page's first OCR language: "," for German, French ..., else "."."""
    return "," if languages and languages[0] in DECIMAL_COMMA_LANGUAGES else "."


def _localized(old: str, new: str, decimal: str) -> str:
    """`new` with each mark it put between `old`'s digits written the locale's way: one before
    one or two final digits is a decimal mark ("74,6" -> "74.6" in English); the marks `old`
    had stay as they were."""
    out, kept = [], iter(old)
    pending = next(kept, None)
    for index, char in enumerate(new):
        if char == pending:
            out.append(char)
            pending = next(kept, None)
            continue
        after = re.match(r"\d+", new[index + 1 :])
        decimal_place = (
            after is not None and len(after.group()) <= 2 and not new[index + 1 + after.end() :][:1].isdigit()
        )
        out.append(decimal if char in ".," and decimal_place else char)
    return "".join(out)


def _surest_number(
    old: _Word, rereadings: list[tuple[str, float]], decimal: str = "."
) -> tuple[str, float] | None:
    """The re-reading that should replace `old`, if any.

    One that only restores marks the first reading lost ("74.6" for "746"), the most restored
    first, those marks written the locale's way (`_localized`). Other digits: only one much
    surer that keeps the first reading's marks as they were.
    """
    # a point read after the number ("618." for 61.8) that a much surer re-reading puts between its digits
    dangling = old.text[:-1] if old.text[-1:] in ".," else None
    restored = [
        (text, conf)
        for text, conf in rereadings
        if _adds_marks_only(old.text, text)
        or (dangling and conf > old.conf + 10 and _adds_marks_only(dangling, text))
    ]
    if restored:
        text, conf = max(restored, key=lambda reading: (len(_marks(reading[0])), reading[1]))
        return _localized(old.text, text, decimal), conf
    surer = [
        (text, conf)
        for text, conf in rereadings
        if _digits(text) != _digits(old.text) and conf > old.conf + 10 and _marks(text) == _marks(old.text)
    ]
    return max(surer, key=lambda reading: reading[1]) if surer else None


def _with_lost_separator(page: Image.Image, word: _Word, decimal: str = ".") -> str | None:
    """The number with the decimal point or thousands comma Tesseract dropped, found by shape.

    Blur and JPEG turn a point into a faint blob that Tesseract reads past ("745" for 74.5) even
    enlarged. On the page it is still there: a blob far smaller than a digit, on the baseline, in
    the gap between two digits (a comma reaches below the baseline). Only a word whose every
    digit is a separate blob is trusted; None when the shape says nothing. A mark before one or
    two final digits is the locale's decimal mark; before three, a comma when it reaches below the
    baseline.

    A colon or semicolon Tesseract read between digits ("70:9") is checked the same way: when the
    page shows a single mark on the baseline there and no dot about as dark above it, a blurred
    point was read as a colon. A real colon ("10:30", "3:2") is left as it is, read or lost.
    """
    prefix = len(word.text) - len(word.text.lstrip("$€£"))
    digits = word.text[prefix:].rstrip("%xXMK.,;:")  # a trailing mark is not between digits
    misread = next((i for i, c in enumerate(digits) if c in ":;"), -1)
    if 0 < misread < len(digits) - 1 and sum(c in ":;" for c in digits) == 1:
        digits = digits[:misread] + digits[misread + 1 :]
        word = replace(word, text=word.text[: prefix + misread] + word.text[prefix + misread + 1 :])
    else:
        misread = -1
    if not digits.isdigit() or len(digits) < 2:
        return None
    box = np.asarray(
        page.crop((word.left - 2, word.top - 2, word.left + word.width + 2, word.top + word.height + 2))
    )
    labels, objects = _connected_blobs(box < DOT_INK_LEVEL)
    blobs = [(cols.start, cols.stop, rows.start, rows.stop) for rows, cols in objects]
    darkest = [
        int(box[rows, cols][labels[rows, cols] == n].min()) for n, (rows, cols) in enumerate(objects, 1)
    ]
    # digits are tall and narrow: a wide blob is the edge of the bar under a label, not a glyph
    narrow = [b for b in blobs if b[1] - b[0] <= 1.2 * (b[3] - b[2])]
    # the digits' height, not the word box's: a chart's line or marker can stretch the box
    height = min(word.height, max((b[3] - b[2] for b in narrow), default=word.height))
    glyphs = sorted(b for b in narrow if b[3] - b[2] >= 0.5 * height)
    if len(glyphs) < prefix + len(digits):
        return None
    glyphs = glyphs[prefix : prefix + len(digits)]
    if any(glyphs[i][1] > glyphs[i + 1][0] + 1 for i in range(len(glyphs) - 1)):
        return None  # touching digits: the gaps cannot be trusted
    baseline = float(np.median([g[3] for g in glyphs]))
    marks: list[tuple[int, str, int, int, int]] = []  # gap, mark, darkest level, top, bottom
    raised: dict[int, list[tuple[int, int]]] = {}  # gap -> (darkest level, bottom) of dots above the baseline
    for (left, right, top, bottom), level in zip(blobs, darkest, strict=True):
        small = right - left <= 0.3 * height and bottom - top <= 0.45 * height
        low = top >= baseline - 0.35 * height and bottom >= baseline - 0.1 * height
        gap = next(
            (
                i
                for i in range(len(glyphs) - 1)
                if glyphs[i][1] - 1 <= (left + right) / 2 <= glyphs[i + 1][0] + 1
            ),
            None,
        )
        if small and gap is not None and (right - left) * (bottom - top) >= 4:
            if not low:
                raised.setdefault(gap, []).append((level, bottom))
                continue
            thousands = len(digits) - gap - 1 == 3
            comma = bottom > baseline + 0.12 * height
            marks.append((gap, ("," if comma else ".") if thousands else decimal, level, top, bottom))
    if len(marks) != 1:
        return None
    gap, mark, level, top, bottom = marks[0]
    # a colon's upper dot is about as dark as the lower one and stands apart from it: a real colon
    colon_dot = any(
        dot_level <= level + RAISED_DOT_LEVELS and dot_bottom <= top - (bottom - top) / 2
        for dot_level, dot_bottom in raised.get(gap, [])
    )
    if colon_dot or (misread >= 0 and gap != misread - 1):
        return None  # a real colon, or no mark where the colon was read
    if any(glyphs[i + 1][0] - glyphs[i][1] > 0.4 * height for i in range(len(glyphs) - 1) if i != gap):
        return None  # a wide gap elsewhere: two numbers read as one word
    return word.text[: prefix + gap + 1] + mark + word.text[prefix + gap + 1 :]


def _read_sheet(
    crops: list[Image.Image], languages: list[str], joiner: str = ""
) -> dict[int, tuple[str, float]]:
    """Read crops stacked on one sheet, one per line (one Tesseract read): {crop index: (text, conf)}.

    A crop's words are joined by `joiner`: nothing for a number Tesseract split ("74 .6").
    """
    gap = REREAD_TEXT_HEIGHT
    sheet = Image.new(
        "L", (max(c.width for c in crops) + 2 * gap, sum(c.height + gap for c in crops) + gap), 255
    )
    spans, y = [], gap
    for crop in crops:
        sheet.paste(crop, (gap, y))
        spans.append((y, y + crop.height))
        y += crop.height + gap
    found: dict[int, list[_Word]] = {}
    for line in _run_tesseract(sheet, 6, languages):
        middle = line.top + max(w.height for w in line.words) / 2
        for slot, (start, end) in enumerate(spans):
            if start - gap / 2 <= middle < end + gap / 2:
                found.setdefault(slot, []).extend(line.words)
    return {
        slot: (joiner.join(w.text for w in sorted(words, key=lambda w: w.left)), min(w.conf for w in words))
        for slot, words in found.items()
    }


def _enlarged_crop(page: Image.Image, box: tuple[int, int, int, int]) -> Image.Image:
    """The box, padded, enlarged so its text is `REREAD_TEXT_HEIGHT` px tall (up to x4)."""
    left, top, right, bottom = box
    pad = max(3, (bottom - top) // 3)
    crop = page.crop((left - pad, top - pad, right + pad, bottom + pad))
    scale = min(REREAD_MAX_SCALE, max(1.0, REREAD_TEXT_HEIGHT / max(bottom - top, 1)))
    return crop.resize((round(crop.width * scale), round(crop.height * scale)), Image.Resampling.LANCZOS)


def _read_leftover_labels(page: Image.Image, passes: list[_Pass], languages: list[str]) -> _Pass | None:
    """The unread labels (`_leftover_labels`) read on one sheet; only sure readings become lines."""
    read = [line for reading in passes if reading.rotation == 0 for line in reading.lines]
    heights = [w.height for line in read for w in line.words]
    if not heights:
        return None
    boxes = _leftover_labels(page, read, float(np.median(heights)))
    if not boxes:
        return None
    readings = _read_sheet([_enlarged_crop(page, box) for box in boxes], languages, joiner=" ")
    lines = [
        _Line([_Word(text, conf, left, top, right - left, bottom - top)], order=slot)
        for slot, (text, conf) in readings.items()
        if conf >= EXTRA_LINE_MIN_CONFIDENCE and _TOKEN.search(text)
        for left, top, right, bottom in [boxes[slot]]
    ]
    return _Pass("labels", 0, lines) if lines else None


def _reads_as_number(word: _Word) -> bool:
    """Two digits at least and no letter but a unit or multiplier: "74.6", "$1.2M", "12%"."""
    return len(_digits(word.text)) >= 2 and not any(c.isalpha() for c in word.text.strip("xXMK%$"))


def _may_be_misread_number(word: _Word) -> bool:
    """A short unsure word of digits and letters ("AL7", "4l.5"): a number some of whose digits were
    read as look-alike letters, or a code; only a sure re-reading can tell which."""
    text = word.text
    return (
        word.conf < HIGH_CONFIDENCE
        and len(text) <= 8
        and any(c.isdigit() for c in text)
        and any(c.isalpha() for c in text)
        and not _reads_as_number(word)
    )


def _reread_numbers(page: Image.Image, passes: list[_Pass], languages: list[str]) -> None:
    """Read every number again, enlarged, each on its own line of a sheet, twice.

    At chart and table sizes Tesseract drops or misreads the decimal point of a number more
    often than any letter ("746" for 74.6, "86:8" for 86.8). A word box holding only that number,
    enlarged so digits are 40 px tall, is read reliably: once as it is, once with grey smudges
    (a bar's fringe) cleared, since either can hide a faint point. A re-reading replaces the first
    reading only by `_surest_number`'s rules; a mark they put back is written the way the page's
    language writes it. An unsure short word of letters and digits is re-read too, and becomes a
    number only when a re-reading is certain of one (`_may_be_misread_number`).
    """
    decimal = decimal_mark(languages)
    seen: dict[tuple[int, int, int, int], list[tuple[_Line, int]]] = {}
    for reading in passes:
        if reading.rotation != 0:
            continue
        for line in reading.lines:
            for index, word in enumerate(line.words):
                if _reads_as_number(word) or _may_be_misread_number(word):
                    seen.setdefault((word.left, word.top, word.width, word.height), []).append((line, index))
    numbers = {box: None for box in seen if any(_reads_as_number(line.words[i]) for line, i in seen[box])}
    others = [box for box in seen if box not in numbers]
    # the unsure words get sheets of their own: a sheet is one read, and a line added to it changes
    # how Tesseract reads the numbers beside it
    rereadings = _reread(page, list(numbers)[:REREAD_MAX_WORDS], languages) | _reread(
        page, others[:REREAD_MAX_WORDS], languages
    )
    for box, box_rereadings in rereadings.items():
        for line, index in seen[box]:
            old = line.words[index]
            if _may_be_misread_number(old):
                # letters read into an unsure number ("AL7" for 41.7): only a certain number replaces it
                certain = [
                    (text, conf)
                    for text, conf in box_rereadings
                    if conf >= HIGH_CONFIDENCE and _NUMBER.match(text)
                ]
                if certain:
                    text, conf = max(certain, key=lambda reading: reading[1])
                    line.words[index] = replace(old, text=_localized(old.text, text, decimal), conf=conf)
                continue
            if old.conf < WORD_MIN_CONFIDENCE:
                # doubted: kept only if a sure re-reading has its digits, or replaced by a number
                # the re-reading is certain of (a blurred "525.5" first read as "25:5" at 0)
                agreeing = [
                    (text, conf)
                    for text, conf in box_rereadings
                    if (_digits(text) == _digits(old.text) and conf >= EXTRA_LINE_MIN_CONFIDENCE)
                    or (conf >= HIGH_CONFIDENCE and _NUMBER.match(text))
                ]
                if agreeing:
                    text, conf = max(agreeing, key=lambda reading: reading[1])
                    line.words[index] = replace(old, text=text, conf=conf)
                continue
            surest = _surest_number(old, box_rereadings, decimal)
            if surest is None and (shaped := _with_lost_separator(page, old, decimal)):
                surest = (shaped, old.conf)  # the shape is the last resort: Tesseract's readings come first
            if surest:
                line.words[index] = replace(old, text=surest[0], conf=max(surest[1], old.conf))


def _reread(
    page: Image.Image, boxes: list[tuple[int, int, int, int]], languages: list[str]
) -> dict[tuple[int, int, int, int], list[tuple[str, float]]]:
    """Each word box's readings, enlarged on one sheet: as it is, and with grey smudges cleared."""
    if not boxes:
        return {}
    crops = [
        _enlarged_crop(page, (left, top, left + width, top + height)) for left, top, width, height in boxes
    ]
    as_is = _read_sheet(crops, languages)
    cleared = _read_sheet([c.point(lambda v: 0 if v < REREAD_INK_LEVEL else 255) for c in crops], languages)
    return {
        box: [reading[slot] for reading in (as_is, cleared) if slot in reading]
        for slot, box in enumerate(boxes)
    }


def _without_doubtful_words(passes: list[_Pass]) -> list[_Pass]:
    """The passes without the numbers Tesseract doubted and no re-reading confirmed."""
    for reading in passes:
        for line in reading.lines:
            line.words = [w for w in line.words if w.conf >= WORD_MIN_CONFIDENCE]
        reading.lines = [line for line in reading.lines if line.words]
    return passes


def _tokens(text: str) -> set[str]:
    return {t.lower() for t in _TOKEN.findall(text)}


def _merge(passes: list[_Pass]) -> list[_Line]:
    """The best pass's lines plus every confident line another pass read and the best one missed.

    An added line goes right after the best pass's line just above it when both passes saw the
    page the same way up, else at the end; the best pass's own reading order is kept as is.
    """
    best = max(passes, key=lambda p: p.score)
    placed: list[tuple[float, int, _Line]] = [(float(i), 0, line) for i, line in enumerate(best.lines)]
    seen = set().union(*(_tokens(line.text) for line in best.lines))
    for other in sorted((p for p in passes if p is not best), key=lambda p: -p.score):
        for line in other.lines:
            tokens = _tokens(line.text)
            # a pass that saw the page another way up agrees only by chance unless it is sure
            needed = EXTRA_LINE_MIN_CONFIDENCE if other.rotation == best.rotation else HIGH_CONFIDENCE
            if line.conf < needed or tokens <= seen:
                continue
            seen |= tokens
            position = float(len(best.lines))
            if other.rotation == best.rotation:
                above = [i for i, kept in enumerate(best.lines) if kept.top <= line.top]
                position = (max(above) if above else -1) + 0.5
            placed.append((position, line.top, line))
    return [line for _, _, line in sorted(placed, key=lambda item: (item[0], item[1]))]


def _result(lines: list[_Line], languages: list[str], upright: list[_Line] | None = None) -> OcrResult:
    """The reading; `upright` are the lines whose word boxes are kept (those read the page's way up)."""
    words = [w for line in lines for w in line.words]
    confidence = sum(w.conf for w in words) / len(words) if words else 0.0
    return OcrResult(
        text="\n".join(line.text for line in lines),
        confidence=round(confidence, 1),
        level=confidence_level(confidence),
        languages=languages,
        words=[
            OcrWord(
                text=w.text, conf=round(w.conf, 1), left=w.left, top=w.top, width=w.width, height=w.height
            )
            for line in upright or []
            for w in line.words
        ],
    )


@dataclass(frozen=True)
class PreparedPage:
    """An image made ready for Tesseract once (`prepare_page`), whatever languages then read it."""

    page: Image.Image  # black text on white, levelled, scaled, ruling lines removed
    ruled: bool  # ruling lines were removed: a table or a chart, read row by row first

    @property
    def first_psm(self) -> int:
        return 6 if self.ruled else 3


def prepare_page(img: Image.Image) -> PreparedPage:
    """The image levelled (`deskew`), scaled for OCR, sharpened when blurred, as a polarity-free ink
    page without ruling lines.

    An RGB image whose channels all agree is prepared in greyscale: every step works channel by
    channel, so the page is the same, at a third of the work, and no step copies it to measure it.
    """
    if is_grey(img):
        img = img.convert("L")
    upright, _ = deskew(img)
    scaled, text_height = scale_for_ocr(upright, keep_colour=True)
    scaled, text_height, _ = sharpen_soft(scaled, text_height, enlarged=scaled.width / upright.width)
    ink, removed = remove_ruling_lines(ink_map(scaled, text_height), text_height)
    return PreparedPage(_as_page(ink), bool(removed))


def first_read(prepared: PreparedPage, languages: list[str]) -> str:
    """The first of `read_page`'s reads, as TSV: what it reads is also what tells the page's scripts."""
    return read_tsv(prepared.page, prepared.first_psm, languages)


def read_upright(
    img: Image.Image, languages: list[str], *, picture: bool = False
) -> tuple[PreparedPage, str]:
    """The image prepared (`prepare_page`) and its first read (`first_read`), turned first when its
    text does not run upright.

    Text on its side or upside down reads as unsure garbage ("peulejuod jjas" for "self contained"),
    and a page prepared turned is measured wrong (its text height across the lines). So a first read
    of some words that is unsure (`ORIENTATION_CHECK_BELOW`) asks Tesseract's orientation detection
    which way up the text is (`text_turn`, 0.1-0.5 s); the image turned that way is prepared anew and
    read, and replaces the first when its read promises `TURN_MIN_GAIN` times the characters. A
    `picture` over a megapixel whose first read is a photo's texture is not asked (1.8 s for the
    orientation of a 14-megapixel seascape).
    """
    prepared = prepare_page(img)
    tsv = first_read(prepared, languages)
    first = _Pass("first", 0, _parse_tsv(tsv))
    if not (_may_be_turned(prepared.page, first, picture) and (turn := text_turn(prepared.page))):
        return prepared, tsv
    turned = prepare_page(img.rotate(turn, expand=True))
    turned_tsv = first_read(turned, languages)
    if _Pass("turned", 0, _parse_tsv(turned_tsv)).score >= TURN_MIN_GAIN * first.score:
        return turned, turned_tsv
    return prepared, tsv


def _may_be_turned(page: Image.Image, first: _Pass, picture: bool) -> bool:
    """Whether a first read is unsure enough to ask which way up the text is, and worth asking."""
    big = page.width * page.height > SPECULATIVE_READ_MAX_PIXELS
    return (
        bool(first.words)
        and first.mean_conf < ORIENTATION_CHECK_BELOW
        and not (picture and big and _reads_as_texture(first))
    )


def text_turn(page: Image.Image) -> int:
    """Degrees counter-clockwise (as `Image.rotate` takes them) that set the page's text upright, by
    Tesseract's orientation detection on the ink page; 0 when it is unsure, finds too little text to
    tell, or this host has no orientation model."""
    if not _has_osd():
        return 0
    with _engine([OSD_MODEL]) as engine:
        engine.SetPageSegMode(tesserocr.PSM.OSD_ONLY)
        engine.SetImage(page)
        try:
            found = engine.DetectOrientationScript()
        except RuntimeError:  # too few characters to tell
            return 0
    if not found or found["orient_conf"] < OSD_MIN_CONFIDENCE:
        return 0
    return int(found["orient_deg"]) % 360


def ocr_image(img: Image.Image, languages: list[str]) -> OcrResult:
    """Read every line of text in the image in these languages (`read_upright`, `read_page`)."""
    langs = usable_languages(languages or ["eng"])
    prepared, tsv = read_upright(img, langs)
    return read_page(prepared, langs, tsv)


def read_page(
    prepared: PreparedPage, langs: list[str], first_tsv: str | None = None, *, picture: bool = False
) -> OcrResult:
    """Read every line of text on the page (at most `MAX_PASSES` Tesseract reads plus two re-read sheets);
    `first_tsv` is the first read (`first_read`) when it was already made in these languages.
    `picture`: the image is a picture on a page, not a page image, so a Low reading of it is not indexed
    (`fusion.indexable_reading`): a first read that is texture (`_reads_as_texture`) ends the reading.

    The image is levelled (`deskew`) and, when blurred, upscaled and sharpened first. Pass 1
    reads the cleaned page (psm 3, or psm 6 row by row when ruling lines were removed).
    A sparse-text pass (psm 11) runs when ink is left unread or the reading is not sure, and the
    other layout mode when ink is still unread and some word was read surely (point labels beside
    a chart's line; a photo's texture reads as ink too, but never as a sure word); on a page over a
    megapixel both, and the upside-down read, need a sure word in the first read
    (`_more_reads_may_pay`). When the best reading is still unsure, the page is read turned by 90
    and 270 degrees (text runs vertically) or by 180 degrees (reading is poor). Glyphs no pass read (a label on a chart's
    line) are then read on their own, and finally the numbers are re-read, enlarged.
    """
    page, removed = prepared.page, prepared.ruled
    # a page with ruling lines is a table or a chart: read it row by row (psm 6), else by layout (psm 3)
    tsv = first_read(prepared, langs) if first_tsv is None else first_tsv
    passes = [_Pass("rows" if removed else "layout", 0, _parse_tsv(tsv))]
    first = passes[0]
    if picture and _reads_as_texture(first):
        return _result(_without_doubtful_words(passes)[0].lines, langs, first.lines)
    more_may_pay = _more_reads_may_pay(page, first)
    if more_may_pay and (
        first.mean_conf < HIGH_CONFIDENCE or _unread_ink_ratio(page, first.lines) > UNREAD_INK_RATIO
    ):
        passes.append(_Pass("sparse", 0, _run_tesseract(page, 11, langs)))
        read = [line for reading in passes for line in reading.lines]
        # labels beside chart lines: try the other layout, unless no read is sure of a single word
        # (then the unread "ink" is a photo's texture, and a third read only adds noise)
        if _any_sure_word(read) and _unread_ink_ratio(page, read) > UNREAD_INK_RATIO:
            passes.append(
                _Pass("layout" if removed else "rows", 0, _run_tesseract(page, 3 if removed else 6, langs))
            )
    best = max(passes, key=lambda p: p.score)
    rotations: list[int] = []
    if best.mean_conf < HIGH_CONFIDENCE and _looks_vertical(page):
        rotations = [90, 270]
    elif more_may_pay and (best.mean_conf < MEDIUM_CONFIDENCE or len(best.words) < 3):
        rotations = [180]
    for rotation in rotations[: MAX_PASSES - len(passes)]:
        rotated = page.rotate(rotation, expand=True, fillcolor=255)
        passes.append(_Pass(f"rotated {rotation}", rotation, _run_tesseract(rotated, 3, langs)))
    if labels := _read_leftover_labels(page, passes, langs):
        passes.append(labels)
    _reread_numbers(page, passes, langs)
    lines = _merge(_without_doubtful_words(passes))
    upright = {id(line) for reading in passes if reading.rotation == 0 for line in reading.lines}
    return _result(lines, langs, [line for line in lines if id(line) in upright])


def probe_text(img: Image.Image) -> OcrResult:
    """One cheap sparse-text pass in English on a copy at most 1000 px wide: is there text at all?"""
    gray = img.convert("L")
    if max(gray.size) > PROBE_MAX_SIDE:
        gray.thumbnail((PROBE_MAX_SIDE, PROBE_MAX_SIDE))
    gray = for_ocr(gray)
    langs = usable_languages(["eng"])
    return _result(_run_tesseract(gray, 11, langs, polarity_free=False), langs)
