"""What the enrichment stages hand each other: verdicts and enrichment results."""

from __future__ import annotations

from typing import Literal

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
