"""What the enrichment stages hand each other: verdicts and enrichment results."""

from __future__ import annotations

import re
from typing import Literal, NamedTuple

from pydantic import BaseModel, Field

Verdict = Literal["IGNORE", "VISION"]
ImageType = Literal["Image", "Screenshot", "Diagram", "Chart", "Photo", "Table", "Slide"]
OcrLevel = Literal["High", "Medium", "Low"]


class ImageVerdict(BaseModel):
    image_sha256: str
    verdict: Verdict
    reasons: list[str] = Field(default_factory=list)
    tags: list[str] = Field(default_factory=list)
    scores: dict[str, float] = Field(default_factory=dict)
    threshold: float = 0.8
    perceptual_hash: str | None = None  # of a decodable raster (images/fingerprint.py)


class OcrWord(BaseModel):
    """One word Tesseract read, with its box on the (levelled, rescaled) page: layout tells a chart's
    value labels which category they belong to."""

    text: str
    conf: float  # 0-100: which of two readings of one box to believe
    left: int
    top: int
    width: int
    height: int


class OcrResult(BaseModel):
    text: str = ""
    confidence: float = 0.0  # mean word confidence, 0-100
    level: OcrLevel = "Low"
    languages: list[str] = Field(default_factory=list)
    words: list[OcrWord] = Field(default_factory=list)  # upright reads only: boxes share one frame


# How a Meta-Content body heads the sections its readers look for again: the chart's values paired
# with their labels ("label: value", one row per line) and the page text around the image.
CHART_DATA_HEADING = "Values by label:"
CONTEXT_LABEL = "Context: "

_META_CONTENT = re.compile(
    r"\A<meta>\n"
    r"\[Source\]: ?(?P<source>[^\n]*)\n"
    r"\[Type\]: ?(?P<image_type>[^\n]*)\n"
    r"\[OCR_Confidence\]: ?(?P<ocr_confidence>[^\n]*)\n"
    r"\[Keywords\]: ?(?P<keywords>[^\n]*)\n"
    r"</meta>\n<content>\n(?P<content>.*)\n</content>\Z",
    re.DOTALL,
)


def _one_line(text: str) -> str:
    return " ".join(text.split())


def flat_keyword(text: str) -> str:
    """A keyword as the [Keywords] line holds it: one line, no commas (they separate keywords)."""
    return _one_line(text.replace(",", " "))


class MetaContentLayout(NamedTuple):
    """Where the parts of a Meta-Content chunk sit in its text, as offsets into it: what an answer may
    quote (the body before the page context, which is cited from the text chunk it comes from) and
    the chart's rows, each a sentence of its own."""

    body: tuple[int, int]
    chart_heading: tuple[int, int] | None
    chart_rows: list[tuple[int, int]]


class MetaContent(BaseModel):
    """The Meta-Content chunk of DESIGN.md as a value. `render` is its one writer and `parse` its one
    reader: fusion writes it, the enrichment cache re-points it at another document, search by
    image reads it back, and the answerer finds its sections (`layout`), all through this model."""

    source: str = ""
    image_type: str = "Image"
    ocr_confidence: str = ""
    keywords: list[str] = Field(default_factory=list)
    content: str = ""

    def render(self) -> str:
        """The chunk text; header values are flattened to one line each (`flat_keyword` for keywords)."""
        keywords = map(flat_keyword, self.keywords)
        header = [
            ("Source", _one_line(self.source)),
            ("Type", _one_line(self.image_type)),
            ("OCR_Confidence", _one_line(self.ocr_confidence)),
            ("Keywords", ", ".join(k for k in keywords if k)),
        ]
        lines = ["<meta>", *(f"[{label}]:" + (f" {value}" if value else "") for label, value in header)]
        return "\n".join([*lines, "</meta>", "<content>", self.content.strip(), "</content>"])

    @classmethod
    def parse(cls, text: str) -> MetaContent:
        """The value `render` wrote; ValueError for any other text."""
        match = _META_CONTENT.match(text.strip())
        if match is None:
            raise ValueError(f"not a Meta-Content chunk: {text[:80]!r}")
        fields = match.groupdict()
        keywords = fields.pop("keywords")
        return cls(**fields, keywords=keywords.split(", ") if keywords else [])

    @staticmethod
    def layout(text: str) -> MetaContentLayout | None:
        """Where the body and the chart rows of a Meta-Content chunk's text are; None for other text."""
        match = _META_CONTENT.match(text)
        if match is None:
            return None
        start, end = match.span("content")
        context = text.find("\n" + CONTEXT_LABEL, start, end)
        end = context if context >= 0 else end
        heading = text.find("\n" + CHART_DATA_HEADING + "\n", start, end)
        if heading < 0:
            return MetaContentLayout((start, end), None, [])
        rows, offset = [], heading + len(CHART_DATA_HEADING) + 2
        block_end = text.find("\n\n", offset, end)
        for line in text[offset : block_end if block_end >= 0 else end].split("\n"):
            if line.strip():
                rows.append((offset, offset + len(line)))
            offset += len(line) + 1
        return MetaContentLayout((start, end), (heading + 1, heading + 1 + len(CHART_DATA_HEADING)), rows)


class EnrichmentResult(BaseModel):
    """The full enrichment of one VISION image; this is what the enrichment cache stores."""

    image_sha256: str
    image_url: str
    meta_content: str  # the <meta>...</meta><content>...</content> chunk
    description: str  # one line, used in the inline `![description](url)` annotation
    image_type: ImageType = "Image"
    keywords: list[str] = Field(default_factory=list)
    ocr: OcrResult = Field(default_factory=OcrResult)
    vlm_caption: str | None = None
    fusion: Literal["llm", "rule"] = "rule"
    vision_tokens: int = 0
    errors: list[str] = Field(default_factory=list)  # provider failures that fell back offline
    cache_key: str = ""
    cached: bool = False
