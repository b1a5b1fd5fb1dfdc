"""Fusion: OCR text, the VLM description and what the page says about an image -> one Meta-Content chunk.

Rule fusion is the offline default and needs no model: it keeps every readable OCR line (the
image's words must be searchable), adds a chart's values paired with their labels by layout
("Q2 2024: 41.7", `enrichment.chart`), infers the image type from classifier tags, alt/caption words
and the shape of the OCR text, and picks keywords. LLM fusion asks a chat model to merge the VLM
description with the OCR text, correcting OCR errors with the visual context; any failure there is
the caller's cue to fall back to rule fusion.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass
from typing import Literal, get_args

from vision_rag_pipeline.core.text import FUNCTION_WORDS
from vision_rag_pipeline.documents.model import DocumentImage, ImageInfo
from vision_rag_pipeline.enrichment.chart import chart_rows, evenly_stepped, number_value
from vision_rag_pipeline.enrichment.model import (
    CHART_DATA_HEADING,
    CONTEXT_LABEL,
    ImageType,
    MetaContent,
    OcrResult,
    flat_keyword,
)
from vision_rag_pipeline.enrichment.vlm import VisionClient, VisionError

# Bump when fusion writes different Meta-Content for the same inputs (rules or the fusion prompt):
# the enrichment cache key and the image_enrichments code version include it.
FUSION_REVISION = 2  # 2: a Low reading contributes no text (`indexable_reading`)
DESCRIPTION_MAX_CHARS = 200
CONTEXT_MAX_CHARS = 300
IMAGE_TYPES: tuple[str, ...] = get_args(ImageType)


def _one_line(text: str) -> str:
    return " ".join(text.split())


@dataclass(frozen=True)
class Fused:
    meta_content: str
    description: str
    image_type: ImageType
    keywords: list[str]
    fusion: Literal["llm", "rule"]


# --- OCR text cleaning ---------------------------------------------------------------------------

# Tables are read row by row already, and a screenshot's text is not a chart's
_NO_CHART_DATA: frozenset[str] = frozenset({"Table", "Screenshot"})

_KEPT_SYMBOLS = {"%", "$", "€", "£", "¥", "&", "+", "="}


def _is_cjk(char: str) -> bool:
    return "\u2e80" <= char <= "\u9fff" or "\uac00" <= char <= "\ud7af" or "\uf900" <= char <= "\ufaff"


def _is_word(token: str) -> bool:
    """Carries meaning on its own: two letters/digits, any digit, or a CJK character."""
    return sum(c.isalnum() for c in token) >= 2 or any(c.isdigit() or _is_cjk(c) for c in token)


def indexable_reading(ocr: OcrResult, image: ImageInfo) -> OcrResult:
    """What of an image's OCR reading may become chunk text and keywords: all of it, or none of a Low
    reading (mean word confidence under 60) of a picture on a page. Such a reading is a photo's
    texture taken for letters far more often than text ("SSS, eee, See" off an infographic's photo);
    the picture is still indexed by its verdict, alt text, caption and context. A page image (a PDF
    page without a text layer: a scan, a slide saved as a picture) keeps its reading however unsure:
    it is the only text the document has there ("GO T0 THE DOCTOR" on a slide read at 49).
    The level stays, so the chunk says how sure OCR was."""
    if ocr.level != "Low" or image.is_page_image:
        return ocr
    return ocr.model_copy(update={"text": "", "words": []})


def clean_ocr_text(text: str) -> str:
    """OCR text without garbage: symbol-only tokens (grid lines, speckle) and lines of stray letters."""
    lines = []
    for raw in text.splitlines():
        tokens = [t for t in raw.split() if any(c.isalnum() for c in t) or t in _KEPT_SYMBOLS]
        if not any(_is_word(t) for t in tokens):
            continue
        line = " ".join(tokens)
        visible = line.replace(" ", "")
        if sum(c.isalnum() for c in visible) < 0.5 * len(visible):
            continue
        lines.append(line)
    return "\n".join(lines)


# --- image type ----------------------------------------------------------------------------------

_TYPE_WORDS: list[tuple[ImageType, re.Pattern[str]]] = [
    ("Table", re.compile(r"\btables?\b", re.I)),
    ("Chart", re.compile(r"\b(charts?|graphs?|plots?|histograms?|bar|pie|dashboards?)\b", re.I)),
    ("Screenshot", re.compile(r"\b(screenshots?|screen ?shots?|screen|ui|window)\b", re.I)),
    ("Diagram", re.compile(r"\b(diagrams?|flow ?charts?|architecture|schematics?|workflow)\b", re.I)),
    ("Slide", re.compile(r"\b(slides?|presentation)\b", re.I)),
    ("Photo", re.compile(r"\b(photos?|photographs?|pictures?)\b", re.I)),
]
_NUMBER_RE = re.compile(r"^[(\-+$€£¥]?\d[\d.,:/]*%?[kKmMbB]?\)?$")
_BULLET_RE = re.compile(r"^\s*(?:[•●▪◦○■□➢►*\-–]|o\s)\s*\S")
_ARROW_RE = re.compile(r"→|->|=>|⟶|⇒|←|<-")
_UI_WORDS = re.compile(
    r"\b(file|edit|view|help|settings|search|log ?in|sign ?in|sign ?up|cancel|ok|submit|save|close|"
    r"menu|home|profile|password|username|https?|www)\b",
    re.I,
)


def _to_number(token: str) -> float | None:
    return number_value(token) if _NUMBER_RE.match(token) else None


def _type_from_text_shape(raw_text: str, clean_text: str) -> ImageType | None:
    lines = [line.split() for line in clean_text.splitlines()]
    numbers = [[v for v in map(_to_number, tokens) if v is not None] for tokens in lines]
    number_only = [
        nums for nums, tokens in zip(numbers, lines, strict=True) if nums and len(nums) == len(tokens)
    ]
    single_ticks = [nums[0] for nums in number_only if len(nums) == 1]
    rows = [len(nums) for nums, tokens in zip(numbers, lines, strict=True) if 2 <= len(nums) < len(tokens)]
    if len(rows) >= 3 and Counter(rows).most_common(1)[0][1] >= 0.6 * len(rows):
        return "Table"
    # axis ticks: a row of evenly stepped numbers, or a column of them (steps equal up to float error)
    if any(evenly_stepped(nums, 1e-6) for nums in number_only) or evenly_stepped(single_ticks[:6], 1e-6):
        return "Chart"
    if len(number_only) >= 3 and len(number_only) < len(lines):
        return "Chart"
    raw_lines = [line for line in raw_text.splitlines() if line.strip()]
    if sum(bool(_BULLET_RE.match(line)) for line in raw_lines) >= 2 and len(raw_lines) <= 20:
        return "Slide"
    if len(set(m.lower() for m in _UI_WORDS.findall(clean_text))) >= 2:
        return "Screenshot"
    if _ARROW_RE.search(raw_text):
        return "Diagram"
    return None


def _type_from_words(text: str, include_photo: bool = True) -> ImageType | None:
    for image_type, words in _TYPE_WORDS:
        if (include_photo or image_type != "Photo") and words.search(text):
            return image_type
    return None


def infer_image_type(tags: list[str], ocr_text: str, hints: str = "") -> ImageType:
    """Classifier tags, then words of alt/title/caption/name, then the shape of the OCR text.

    A "photo" tag only says the picture has many colours (so do gradients and screenshots of
    photos), so it decides only when nothing else does.
    """
    tag_text = " ".join(tags).replace("_", " ").replace("-", " ")
    return (
        _type_from_words(tag_text, include_photo=False)
        or _type_from_words(hints)
        or _type_from_text_shape(ocr_text, clean_ocr_text(ocr_text))
        or _type_from_words(tag_text)
        or "Image"
    )


# --- keywords ------------------------------------------------------------------------------------

# Words that say an image is an image: never a keyword of what it shows.
_CAPTION_WORDS = frozenset({"image", "picture", "figure", "fig", "photo", "shows", "shown", "showing"})
_NOT_KEYWORDS = FUNCTION_WORDS | _CAPTION_WORDS
_TOKEN_RE = re.compile(r"\w[\w'’&.\-]*\w|\w")


def _keyword_candidates(text: str) -> list[str]:
    found = []
    for token in _TOKEN_RE.findall(text):
        token = token.strip("'’.-_")
        has_letter = any(c.isalpha() for c in token)
        long_enough = len(token) >= 3 or any(c.isdigit() for c in token) or any(_is_cjk(c) for c in token)
        if has_letter and long_enough and len(token) >= 2 and token.lower() not in _NOT_KEYWORDS:
            found.append(token)
    return found


def extract_keywords(ocr_text: str, hints: list[str], max_keywords: int) -> list[str]:
    """Words of the alt text/title/caption first (written by people), then the most frequent OCR words."""
    chosen: dict[str, str] = {}
    for word in _keyword_candidates(" ".join(hints)):
        chosen.setdefault(word.lower(), word)
    ocr_words = _keyword_candidates(ocr_text)
    counts = Counter(w.lower() for w in ocr_words)
    first_seen: dict[str, str] = {}
    for word in ocr_words:
        first_seen.setdefault(word.lower(), word)
    ranked = sorted(first_seen, key=lambda w: (-counts[w], -any(c.isupper() for c in first_seen[w]), -len(w)))
    for lower in ranked:
        chosen.setdefault(lower, first_seen[lower])
    return list(chosen.values())[:max_keywords]


# --- rule and LLM fusion -------------------------------------------------------------------------


def _truncate(text: str, limit: int) -> str:
    text = _one_line(text)
    if len(text) <= limit:
        return text
    cut = text[: limit - 1].rsplit(" ", 1)[0] or text[: limit - 1]
    return cut + "…"


def _hints(image: DocumentImage) -> list[str]:
    return [h for h in (image.alt, image.title, image.caption) if h.strip()]


def one_line_description(
    image: DocumentImage, image_type: str, ocr_text: str, vlm_caption: str | None
) -> str:
    """The `![description](url)` text: alt/title/caption, else the VLM's first sentence, else OCR words."""
    hints = _hints(image)
    if hints:
        return _truncate(hints[0], DESCRIPTION_MAX_CHARS)
    if vlm_caption:
        return _truncate(re.split(r"(?<=[.!?])\s", vlm_caption.strip(), maxsplit=1)[0], DESCRIPTION_MAX_CHARS)
    words = clean_ocr_text(ocr_text).split()
    if words:
        return _truncate(f"{image_type}: {' '.join(words[:30])}", DESCRIPTION_MAX_CHARS)
    return image_type


def _what_it_shows(image: DocumentImage, image_type: str) -> str:
    labelled = [
        f"{label}: {_one_line(text)}"
        for label, text in (("Title", image.title), ("Caption", image.caption))
        if text.strip()
    ]
    alt = _one_line(image.alt)
    head = f"{image_type}: {alt}" if alt else image_type
    return ". ".join([head, *labelled]) + "."


def chart_data_rows(image_type: str, ocr: OcrResult) -> list[str]:
    """The chart's values paired with their labels by layout ("label: value"); none when unsure."""
    return [] if image_type in _NO_CHART_DATA else chart_rows(ocr.words)


def chart_data(image_type: str, ocr: OcrResult) -> str:
    """`chart_data_rows` under `CHART_DATA_HEADING`, the section rule fusion adds; "" without rows."""
    rows = chart_data_rows(image_type, ocr)
    return "\n".join([CHART_DATA_HEADING, *rows]) if rows else ""


def rule_content(
    image: DocumentImage, image_type: str, ocr_text: str, vlm_caption: str | None, data: str = ""
) -> str:
    """What the image shows, the VLM description if any, all of its readable text, its chart data and
    its context."""
    parts = [_what_it_shows(image, image_type)]
    if vlm_caption:
        parts.append(vlm_caption.strip())
    if ocr_text:
        parts.append("Text in image:\n" + ocr_text)
    if data:
        parts.append(data)
    if image.context.strip():
        parts.append(CONTEXT_LABEL + _truncate(image.context, CONTEXT_MAX_CHARS))
    return "\n".join(parts)


def fuse_by_rule(
    image: DocumentImage,
    tags: list[str],
    ocr: OcrResult,
    source: str,
    max_keywords: int,
    vlm_caption: str | None = None,
) -> Fused:
    ocr = indexable_reading(ocr, image)
    text = clean_ocr_text(ocr.text)
    hints = _hints(image)
    image_type = infer_image_type(tags, ocr.text, " ".join([*hints, image.name]))
    keywords = extract_keywords(text, hints, max_keywords)
    content = rule_content(image, image_type, text, vlm_caption, chart_data(image_type, ocr))
    return Fused(
        meta_content=MetaContent(
            source=source, image_type=image_type, ocr_confidence=ocr.level, keywords=keywords, content=content
        ).render(),
        description=one_line_description(image, image_type, text, vlm_caption),
        image_type=image_type,
        keywords=keywords,
        fusion="rule",
    )


FUSION_SYSTEM_PROMPT = (
    "You write search-index entries for images. You get a vision model's description of an image and "
    "the text OCR read from it (OCR makes mistakes; the description shows what is really there). "
    "Reply with one JSON object and nothing else: "
    '{{"type": one of {types}, "keywords": [up to {max_keywords} distinctive words or phrases], '
    '"content": "what the image shows (scene, objects, layout); EVERY piece of text it contains, with '
    "OCR errors corrected using the description (never invent text); for a chart, its data one line per "
    "category as 'category: value' (several series: 'category: value (series) · value (series)'), each "
    'value read off the category it stands over or beside; what it means or is for"}}.'
)

# When the fused content misses more than this share of the OCR words, the OCR text is appended:
# the chunk must stay findable by the image's own words even if the model summarised instead.
_MAX_MISSING_OCR_WORDS = 0.5


def _parse_fusion_reply(reply: str) -> dict[str, object]:
    start, end = reply.find("{"), reply.rfind("}")
    try:
        data = json.loads(reply[start : end + 1]) if start >= 0 and end > start else None
    except json.JSONDecodeError:
        data = None
    if not isinstance(data, dict) or not isinstance(data.get("content"), str) or not data["content"].strip():
        raise VisionError(
            f"fusion: malformed reply (expected a JSON object with content): {reply[:120]!r}",
            "malformed reply",
        )
    return data


def _missing_share(ocr_text: str, content: str) -> float:
    words = {w.lower() for w in _TOKEN_RE.findall(ocr_text) if len(w) >= 3}
    if not words:
        return 0.0
    present = {w.lower() for w in _TOKEN_RE.findall(content)}
    return len(words - present) / len(words)


def fuse_with_llm(
    client: VisionClient,
    model: str,
    llm_kwargs: dict[str, object],
    image: DocumentImage,
    tags: list[str],
    ocr: OcrResult,
    source: str,
    max_keywords: int,
    vlm_caption: str | None,
    budget_s: float | None = None,
) -> Fused:
    """LLM fusion within `budget_s` seconds; raises VisionError (the caller falls back to `fuse_by_rule`)."""
    ocr = indexable_reading(ocr, image)
    text = clean_ocr_text(ocr.text)
    hints = _hints(image)
    rule_type = infer_image_type(tags, ocr.text, " ".join([*hints, image.name]))
    paired = "\n".join(chart_data_rows(rule_type, ocr))
    system = FUSION_SYSTEM_PROMPT.format(types=", ".join(IMAGE_TYPES), max_keywords=max_keywords)
    user = "\n".join(
        [
            f"Image: {source}",
            *(
                f"{label}: {_one_line(value)}"
                for label, value in zip(
                    ("Alt text", "Title", "Caption"), (image.alt, image.title, image.caption), strict=True
                )
                if value.strip()
            ),
            f"Surrounding text: {_truncate(image.context, CONTEXT_MAX_CHARS)}"
            if image.context.strip()
            else "",
            f"Vision model description:\n{vlm_caption or '(none)'}",
            f"OCR text (confidence {ocr.level}):\n{text or '(none)'}",
            f"Chart values paired with their labels by their position (OCR):\n{paired}" if paired else "",
        ]
    )
    data = _parse_fusion_reply(client.fuse(system, user, model, dict(llm_kwargs), budget_s))
    content = str(data["content"]).strip()
    if _missing_share(text, content) > _MAX_MISSING_OCR_WORDS:
        content += "\nText in image (OCR):\n" + text
    image_type: ImageType = data.get("type") if data.get("type") in IMAGE_TYPES else rule_type  # type: ignore[assignment]
    raw_keywords = data.get("keywords")
    keywords = (
        [flat_keyword(str(k)) for k in raw_keywords if flat_keyword(str(k))]
        if isinstance(raw_keywords, list)
        else []
    )
    keywords = keywords[:max_keywords] or extract_keywords(text, hints, max_keywords)
    return Fused(
        meta_content=MetaContent(
            source=source, image_type=image_type, ocr_confidence=ocr.level, keywords=keywords, content=content
        ).render(),
        description=one_line_description(image, image_type, text, vlm_caption or content),
        image_type=image_type,
        keywords=keywords,
        fusion="llm",
    )
