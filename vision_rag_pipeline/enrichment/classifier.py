"""Offline image classifier: which images are worth OCR and a vision model (VISION), which are
decoration (IGNORE).

Every image gets tag confidences (0-1) from evidence that costs milliseconds: its size and
aspect, statistics of a 128 px copy (colour count, edge density, entropy, contrast), its file
name and alt text, and how often it repeats in the document. Only when that evidence points to
decoration that is not certain does one cheap Tesseract probe look for text, which can rescue
the image.

How `threshold` applies: a tag is asserted only when its confidence reaches the threshold. An
image is IGNOREd when an asserted decoration tag is at least as confident as the strongest
content tag; otherwise it is VISION. Hard facts (a 1x1 pixel, a tiny or blank image, a divider,
the same bytes three times, undecodable data) have confidence 1.0 and always IGNORE; softer
hints (a "logo" file name, icon size, a plain graphic without text) only IGNORE at or below
their confidence. A higher threshold therefore drops fewer images: when in doubt an image is
enriched, because a fact lost inside an image costs more than one OCR run.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

import numpy as np
from PIL import Image

from vision_rag_pipeline.core.config import ClassifierFeature
from vision_rag_pipeline.core.sniff import is_svg
from vision_rag_pipeline.documents.model import DocumentImage
from vision_rag_pipeline.enrichment.model import ImageVerdict
from vision_rag_pipeline.enrichment.ocr import OcrError, probe_text
from vision_rag_pipeline.enrichment.preprocess import ImageError, load_image, svg_text
from vision_rag_pipeline.images.fingerprint import perceptual_hash

# Bump when a change here changes verdicts: the image_verdicts code version includes it.
CLASSIFIER_REVISION = 4  # 4: verdicts carry the picture's perceptual hash
TINY_SIDE = 48  # px: smaller than 48x48 is an icon or a bullet
TINY_AREA = 4_000  # px2: a 200x19 strip carries no fact either
DIVIDER_ASPECT = 15.0
BANNER_ASPECT = 8.0
ICON_SIDE = 128
LOGO_SIDE = 256  # px: a header logo or a badge fits in this
REPEAT_COUNT = 3
STATS_SIDE = 128
TEXT_BEARING_WORDS = 8  # the probe read this many words: the image carries text worth reading

DECORATION_TAGS = frozenset(
    {"tracking-pixel", "tiny", "divider", "blank", "repeated", "logo", "icon", "decoration", "plain"}
)
_DECORATION_WORDS = {
    "logo": "logo",
    "brand": "logo",
    "icon": "icon",
    "favicon": "icon",
    "sprite": "icon",
    "emoji": "icon",
    "bullet": "icon",
    "arrow": "icon",
    "button": "icon",
    "avatar": "icon",
    "badge": "icon",
    "spacer": "decoration",
    "pixel": "decoration",
    "blank": "decoration",
    "transparent": "decoration",
    "shim": "decoration",
    "divider": "decoration",
    "separator": "decoration",
    "border": "decoration",
    "advert": "decoration",
    "ad": "decoration",
    "ads": "decoration",
    "tracking": "decoration",
    "beacon": "decoration",
    "facebook": "icon",
    "twitter": "icon",
    "linkedin": "icon",
    "social": "icon",
}
_CONTENT_WORDS = (
    "chart",
    "graph",
    "diagram",
    "table",
    "figure",
    "screenshot",
    "slide",
    "plot",
    "scan",
    "map",
)
_WORD = re.compile(r"[a-z]+")
_SEGMENT_SEPARATOR = re.compile(r"[^a-z0-9]+")
_HEX_RUN = re.compile(r"[0-9a-f]{6,}")
_NAME_PATTERN = re.compile(r"\d+")


@dataclass(frozen=True)
class ImageStats:
    """What a 128 px copy says about the picture."""

    width: int
    height: int
    colours: int  # distinct colours at 4 bits per channel
    entropy: float  # grey-level histogram entropy, bits (0-8)
    edge_density: float  # share of pixels on a strong edge
    contrast: float  # grey-level standard deviation

    @property
    def aspect(self) -> float:
        return max(self.width, self.height) / max(1, min(self.width, self.height))


def image_stats(img: Image.Image) -> ImageStats:
    small = img.convert("RGB")
    small.thumbnail((STATS_SIDE, STATS_SIDE), Image.Resampling.BILINEAR)
    rgb = np.asarray(small, dtype=np.uint8)
    gray = np.asarray(small.convert("L"), dtype=np.float32)
    packed = (
        (rgb[..., 0] >> 4).astype(np.int32) << 8 | (rgb[..., 1] >> 4).astype(np.int32) << 4 | rgb[..., 2] >> 4
    )
    histogram = np.bincount(gray.astype(np.uint8).ravel(), minlength=256) / gray.size
    nonzero = histogram[histogram > 0]
    gradient_x = np.abs(np.diff(gray, axis=1))[:-1, :] if gray.shape[0] > 1 else np.zeros((0, 0))
    gradient_y = np.abs(np.diff(gray, axis=0))[:, :-1] if gray.shape[1] > 1 else np.zeros((0, 0))
    edges = float(((gradient_x + gradient_y) > 48).mean()) if gradient_x.size else 0.0
    return ImageStats(
        width=img.width,
        height=img.height,
        colours=int(np.unique(packed).size),
        entropy=float(-(nonzero * np.log2(nonzero)).sum()),
        edge_density=edges,
        contrast=float(gray.std()),
    )


@dataclass
class _Evidence:
    confidences: dict[str, float]
    reasons: list[str]

    def tag(self, name: str, confidence: float, reason: str) -> None:
        if confidence > self.confidences.get(name, 0.0):
            self.confidences[name] = round(min(1.0, confidence), 3)
        if reason not in self.reasons:
            self.reasons.append(reason)

    def strongest(self, decoration: bool) -> float:
        values = [c for t, c in self.confidences.items() if (t in DECORATION_TAGS) == decoration]
        return max(values, default=0.0)


def _words(*texts: str) -> list[str]:
    """The words of names and alt texts; hex runs ("img_ad12aeb956") are hashes, not words."""
    return [
        word
        for text in texts
        for segment in _SEGMENT_SEPARATOR.split(text.lower())
        if not (_HEX_RUN.fullmatch(segment) and any(c.isdigit() for c in segment))
        for word in _WORD.findall(segment)
    ]


def _name_pattern(name: str) -> str:
    return _NAME_PATTERN.sub("#", name.lower().rsplit("/", 1)[-1])


def _clamp(value: float) -> float:
    return max(0.0, min(1.0, value))


def _size_evidence(image: DocumentImage, stats: ImageStats, evidence: _Evidence) -> None:
    width, height = stats.width, stats.height
    if width <= 2 and height <= 2:
        evidence.tag("tracking-pixel", 1.0, f"{width}x{height} px: a tracking pixel")
    elif max(width, height) < TINY_SIDE or width * height < TINY_AREA:
        evidence.tag("tiny", 1.0, f"{width}x{height} px: too small to carry content")
    if stats.aspect >= DIVIDER_ASPECT:
        evidence.tag("divider", 1.0, f"aspect ratio {stats.aspect:.0f}:1: a divider or border")
    elif stats.aspect >= BANNER_ASPECT:
        evidence.tag("divider", 0.7, f"aspect ratio {stats.aspect:.0f}:1: a strip, probably decorative")
    if max(width, height) <= ICON_SIDE:
        evidence.tag("icon", 0.6, f"{width}x{height} px: icon-sized")


def _picture_evidence(stats: ImageStats, evidence: _Evidence) -> None:
    if stats.contrast < 3 or stats.colours <= 1:
        evidence.tag("blank", 1.0, "near-uniform: no content and no text")
        return
    if stats.colours >= 300 and stats.entropy >= 5.5 and min(stats.width, stats.height) >= 100:
        richness = _clamp((stats.colours - 300) / 1200) * _clamp((stats.entropy - 5.5) / 1.5)
        reason = f"{stats.colours} colours, entropy {stats.entropy:.1f} bits: a photo"
        evidence.tag("photo", 0.6 + 0.35 * richness, reason)
    structure = _clamp(stats.edge_density / 0.04) * _clamp(min(stats.width, stats.height) / 200)
    if structure >= 0.25:
        reason = f"edge density {stats.edge_density:.3f}: drawn content"
        evidence.tag("graphic", 0.3 + 0.5 * structure, reason)
    elif "photo" not in evidence.confidences:
        evidence.tag("plain", 0.9 - structure, "few edges for its size and no photo texture: a plain graphic")


def _text_evidence(image: DocumentImage, evidence: _Evidence) -> set[str]:
    """Tags the file name, alt text and caption suggest; returns the decoration tags they named."""
    named = set()
    name_words = _words(image.name, image.url.rsplit("/", 1)[-1])
    alt_words = _words(image.alt, image.title)
    for word in name_words:
        if word in _DECORATION_WORDS:
            evidence.tag(_DECORATION_WORDS[word], 0.85, f"file name mentions '{word}'")
            named.add(_DECORATION_WORDS[word])
    for word in alt_words:
        if word in _DECORATION_WORDS:
            evidence.tag(_DECORATION_WORDS[word], 0.75, f"alt text mentions '{word}'")
            named.add(_DECORATION_WORDS[word])
    described = " ".join([image.alt, image.title, image.caption, image.name]).lower()
    for word in _CONTENT_WORDS:
        if word in described:
            tag = word if word in ("chart", "table", "screenshot", "diagram") else "figure"
            evidence.tag(tag, 0.8, f"described as '{word}'")
            break
    return named


def _named_and_sized_as_decoration(named: set[str], stats: ImageStats, evidence: _Evidence) -> None:
    """A name or alt text that says logo or icon, on an image the size of one: two hints agreeing
    are surer than either (an alt text alone, 0.75, stays under the default threshold)."""
    if max(stats.width, stats.height) > LOGO_SIDE:
        return
    for tag in ("logo", "icon"):
        if tag in named:
            evidence.tag(tag, 0.9, f"named a {tag} and {stats.width}x{stats.height} px, the size of one")
            return


def _probe(img: Image.Image, evidence: _Evidence) -> None:
    try:
        probe = probe_text(img)
    except OcrError as exc:
        evidence.reasons.append(f"text probe unavailable: {exc}")
        return
    words = probe.text.split()
    if not words:
        evidence.reasons.append("text probe: no text")
        return
    confidence = _clamp(len(words) / 4) * probe.confidence / 100
    if len(words) >= TEXT_BEARING_WORDS and probe.confidence >= 60:
        confidence = max(confidence, 0.95)  # lines of readable text: content, whatever its drawing looks like
    evidence.tag(
        "text", confidence, f"text probe read {len(words)} words at confidence {probe.confidence:.0f}"
    )


def _verdict(
    image: DocumentImage, evidence: _Evidence, threshold: float, fingerprint: str | None = None
) -> ImageVerdict:
    asserted = {t: c for t, c in evidence.confidences.items() if c >= threshold}
    decoration = max((c for t, c in asserted.items() if t in DECORATION_TAGS), default=0.0)
    content = evidence.strongest(decoration=False)
    verdict = "IGNORE" if decoration > 0 and decoration >= content else "VISION"
    scores = {"content": content, "decoration": evidence.strongest(decoration=True)}
    scores["text"] = evidence.confidences.get("text", 0.0)
    return ImageVerdict(
        image_sha256=image.sha256,
        verdict=verdict,
        reasons=evidence.reasons,
        tags=sorted(asserted, key=lambda t: -asserted[t]),
        scores=scores,
        threshold=threshold,
        perceptual_hash=fingerprint,
    )


def classify_image(
    image: DocumentImage, threshold: float, repeats: int = 1, pattern_repeats: int = 1
) -> ImageVerdict:
    """The verdict for one image; `repeats` says how often its bytes occur in the document."""
    evidence = _Evidence({}, [])
    try:
        img = load_image(image.data, image.mime)
    except ImageError as exc:
        if is_svg(image.data, image.mime):
            return _svg_verdict(image, threshold, str(exc))
        evidence.tag("blank", 1.0, str(exc))
        return _verdict(image, evidence, threshold)
    fingerprint = perceptual_hash(img)
    stats = image_stats(img)
    _picture_evidence(stats, evidence)
    if image.is_page_image:
        if "blank" not in evidence.confidences:
            evidence.tag("page", 1.0, "a scanned page: always read")
        return _verdict(image, evidence, threshold, fingerprint)
    _size_evidence(image, stats, evidence)
    if repeats >= REPEAT_COUNT:
        evidence.tag("repeated", 1.0, f"the same image appears {repeats} times in the document")
    elif pattern_repeats >= REPEAT_COUNT and max(stats.width, stats.height) <= 2 * ICON_SIDE:
        evidence.tag("repeated", 0.85, f"{pattern_repeats} small images share the name pattern")
    _named_and_sized_as_decoration(_text_evidence(image, evidence), stats, evidence)
    hard = evidence.strongest(decoration=True) >= 1.0
    if not hard and _verdict(image, evidence, threshold).verdict == "IGNORE":
        _probe(img, evidence)  # only a doubtful IGNORE is worth a Tesseract run: text can rescue it
    return _verdict(image, evidence, threshold, fingerprint)


def _svg_verdict(image: DocumentImage, threshold: float, reason: str) -> ImageVerdict:
    """SVG is not rasterized, but its own text is indexed: worth enriching when it has words."""
    evidence = _Evidence({}, [reason])
    try:
        words = svg_text(image.data).split()
    except ImageError as exc:
        evidence.tag("blank", 1.0, str(exc))
        return _verdict(image, evidence, threshold)
    if len(words) >= 2:
        evidence.tag("text", 0.9, f"SVG carries {len(words)} words of text")
    else:
        evidence.tag("plain", 1.0, "SVG without text")
    _text_evidence(image, evidence)
    return _verdict(image, evidence, threshold)


def classify_images(images: list[DocumentImage], config: ClassifierFeature) -> list[ImageVerdict]:
    """One verdict per image, in order. Deterministic and offline; see the module doc for `threshold`."""
    if not config.enabled:
        return [_unclassified(image, config.threshold) for image in images]
    repeats = Counter(image.sha256 for image in images)
    patterns = Counter(_name_pattern(image.name) for image in images)
    return [
        classify_image(image, config.threshold, repeats[image.sha256], patterns[_name_pattern(image.name)])
        for image in images
    ]


def _unclassified(image: DocumentImage, threshold: float) -> ImageVerdict:
    """Classifier off: every image that can be read (an SVG by its own text) goes to enrichment."""
    reasons = ["classifier disabled"]
    fingerprint = None
    try:
        fingerprint = perceptual_hash(load_image(image.data, image.mime))
    except ImageError as exc:
        if not is_svg(image.data, image.mime):
            return ImageVerdict(
                image_sha256=image.sha256, verdict="IGNORE", reasons=[str(exc)], threshold=threshold
            )
        reasons.append(str(exc))
    return ImageVerdict(
        image_sha256=image.sha256,
        verdict="VISION",
        reasons=reasons,
        threshold=threshold,
        perceptual_hash=fingerprint,
    )
