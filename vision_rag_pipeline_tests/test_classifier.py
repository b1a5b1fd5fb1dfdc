"""The offline classifier on labelled fixtures: decoration is IGNOREd, content goes to VISION."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image, ImageDraw, ImageFont

from vision_rag_pipeline.core.config import ClassifierFeature
from vision_rag_pipeline.documents.model import DocumentImage
from vision_rag_pipeline.enrichment import ocr
from vision_rag_pipeline.enrichment.classifier import classify_images

needs_tesseract = pytest.mark.skipif(not ocr.available_languages(), reason="tesseract is not installed")


def _png(img: Image.Image) -> bytes:
    buffer = io.BytesIO()
    img.save(buffer, format="PNG")
    return buffer.getvalue()


def _image(img: Image.Image, name: str = "figure.png", **fields: object) -> DocumentImage:
    return DocumentImage(
        url=f"http://example.com/{name}", name=name, mime="image/png", data=_png(img), **fields
    )


def _font(size: int) -> ImageFont.FreeTypeFont:
    return ImageFont.load_default(size=size)


def _paragraph() -> Image.Image:
    img = Image.new("RGB", (800, 600), "white")
    draw = ImageDraw.Draw(img)
    for row in range(6):
        draw.text(
            (30, 40 + row * 45), f"Line {row}: revenue grew in every region", fill="black", font=_font(22)
        )
    return img


def _bar_chart() -> Image.Image:
    img = Image.new("RGB", (800, 600), "white")
    draw = ImageDraw.Draw(img)
    draw.line([(140, 40), (140, 560), (780, 560)], fill="black", width=2)
    for i, (label, value) in enumerate([("North", 820), ("South", 640), ("East", 910)]):
        y = 80 + i * 150
        draw.rectangle([142, y, 142 + value * 0.6, y + 90], fill=("#1f3b73", "#7a1f1f", "#1f5f2a")[i])
        draw.text((20, y + 30), label, fill="black", font=_font(24))
        draw.text((160, y + 30), str(value), fill="white", font=_font(24))
    return img


def _table() -> Image.Image:
    img = Image.new("RGB", (700, 400), "white")
    draw = ImageDraw.Draw(img)
    for r in range(5):
        draw.line([(20, 40 + r * 70), (680, 40 + r * 70)], fill="black", width=2)
    for x in (20, 250, 470, 680):
        draw.line([(x, 40), (x, 320)], fill="black", width=2)
    for r, row in enumerate(
        [("Metric", "Q1", "Q2"), ("Revenue", "4,210", "4,380"), ("Churn", "2.1%", "1.9%")]
    ):
        for c, value in enumerate(row):
            draw.text(((20, 250, 470)[c] + 12, 60 + r * 70), value, fill="black", font=_font(22))
    return img


def _photo() -> Image.Image:
    rng = np.random.default_rng(7)
    y, x = np.mgrid[0:480, 0:640]
    pixels = np.stack([x / 640 * 255, y / 480 * 255, (x + y) / 1120 * 255], axis=-1)
    pixels += rng.normal(0, 18, pixels.shape)
    img = Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8))
    draw = ImageDraw.Draw(img)
    draw.ellipse([100, 100, 300, 300], fill=(200, 40, 40))
    draw.rectangle([380, 200, 560, 420], fill=(30, 90, 160))
    return img


def _logo() -> Image.Image:
    img = Image.new("RGB", (160, 80), "white")
    ImageDraw.Draw(img).ellipse([10, 10, 70, 70], fill="#0a5")
    return img


def _icon(size: int = 64) -> Image.Image:
    img = Image.new("RGB", (size, size), "white")
    ImageDraw.Draw(img).polygon([(size // 2, 2), (size - 2, size - 2), (2, size - 2)], fill="orange")
    return img


def _classify(images: list[DocumentImage], threshold: float = 0.8, enabled: bool = True) -> list[str]:
    verdicts = classify_images(images, ClassifierFeature(enabled=enabled, threshold=threshold))
    assert [v.image_sha256 for v in verdicts] == [i.sha256 for i in images]
    assert all(v.reasons for v in verdicts), "every verdict says why"
    return [v.verdict for v in verdicts]


DECORATION = {
    "tracking pixel": lambda: _image(Image.new("RGB", (1, 1), "white"), "pixel.gif"),
    "16x16 icon": lambda: _image(_icon(16), "star.png"),
    "600x4 divider": lambda: _image(Image.new("RGB", (600, 4), "#ccc"), "rule.png"),
    "logo by name": lambda: _image(_logo(), "acme-logo.png"),
    "uniform blank": lambda: _image(Image.new("RGB", (400, 300), (240, 240, 240)), "bg.png"),
}


@needs_tesseract
@pytest.mark.parametrize("kind", DECORATION)
def test_decoration_is_ignored(kind: str) -> None:
    assert _classify([DECORATION[kind]()]) == ["IGNORE"]


def _wordmark(size: tuple[int, int]) -> Image.Image:
    """A company logo as report headers carry it: a coloured badge and the name beside it."""
    img = Image.new("RGB", size, "white")
    draw = ImageDraw.Draw(img)
    draw.rounded_rectangle([4, 4, 50, 50], radius=8, fill="#1f4e79")
    draw.text((14, 16), "RA", fill="white", font=_font(18))
    draw.text((60, 14), "Redwater", fill="#1f4e79", font=_font(24))
    return img


@needs_tesseract
def test_an_image_whose_alt_text_says_logo_is_ignored_only_at_a_logos_size() -> None:
    # the file name is a hash: only the alt text says what it is
    header_logo = _image(_wordmark((180, 54)), "img_33a4fed23e.png", alt="Redwater Analytics logo")
    assert _classify([header_logo]) == ["IGNORE"]
    # alone, an alt text is a hint too weak to drop a large image
    large = _image(_bar_chart(), "img_5c1e0b7d2a.png", alt="Redwater Analytics logo")
    assert _classify([large]) == ["VISION"]


def test_the_same_decoration_three_times_is_ignored_everywhere() -> None:
    images = [_image(_icon(), "bullet.png"), _image(_paragraph()), _image(_icon(), "bullet.png")]
    images.append(_image(_icon(), "bullet.png"))
    verdicts = classify_images(images, ClassifierFeature())
    assert [v.verdict for v in verdicts] == ["IGNORE", "VISION", "IGNORE", "IGNORE"]
    assert "repeated" in verdicts[0].tags
    assert any("3 times" in reason for reason in verdicts[0].reasons)


CONTENT = {
    "text paragraph": lambda: _image(_paragraph(), "notes.png"),
    "bar chart with labels": lambda: _image(_bar_chart(), "sales.png"),
    "table with grid lines": lambda: _image(_table(), "kpi.png"),
    "photo": lambda: _image(_photo(), "site.jpg"),
    "scanned page": lambda: _image(_paragraph(), "page-3.png", is_page_image=True),
}


@needs_tesseract
@pytest.mark.parametrize("kind", CONTENT)
def test_content_goes_to_vision(kind: str) -> None:
    verdict = classify_images([CONTENT[kind]()], ClassifierFeature())[0]
    assert verdict.verdict == "VISION"
    assert verdict.scores["content"] > verdict.scores["decoration"]


def test_a_blank_page_image_is_ignored() -> None:
    page = _image(Image.new("RGB", (850, 1100), "white"), "page-9.png", is_page_image=True)
    assert _classify([page]) == ["IGNORE"]


@needs_tesseract
def test_the_threshold_is_the_confidence_a_decoration_hint_needs() -> None:
    logo = _image(_logo(), "acme-logo.png")
    strict = classify_images([logo], ClassifierFeature(threshold=0.8))[0]
    lenient = classify_images([logo], ClassifierFeature(threshold=0.95))[0]
    assert strict.verdict == "IGNORE" and "logo" in strict.tags
    assert lenient.verdict == "VISION" and "logo" not in lenient.tags
    assert lenient.threshold == 0.95
    # certain decoration ignores whatever the threshold
    assert _classify([_image(Image.new("RGB", (1, 1)), "p.gif")], threshold=1.0) == ["IGNORE"]


@needs_tesseract
def test_text_rescues_an_image_named_like_decoration() -> None:
    assert _classify([_image(_paragraph(), "banner-icon.png")]) == ["VISION"]


def _crooked_dialog() -> Image.Image:
    """A low-contrast app dialog turned by 4 degrees: few edges for its size, three lines to read."""
    img = Image.new("RGB", (820, 420), (220, 224, 230))
    draw = ImageDraw.Draw(img)
    draw.rectangle([60, 50, 760, 370], fill=(238, 240, 242), outline=(200, 204, 210))
    lines = [
        "Backup of the Q4 2025 archive completed.",
        "638.3 GB copied to offsite storage.",
        "Elapsed time: 80.9 minutes.",
    ]
    for row, line in enumerate(lines):
        draw.text((96, 130 + row * 50), line, fill=(140, 146, 156), font=_font(22))
    return img.rotate(4, Image.Resampling.BICUBIC, fillcolor=(220, 224, 230))


@needs_tesseract
def test_a_plain_dialog_with_lines_of_text_goes_to_vision() -> None:
    verdict = classify_images([_image(_crooked_dialog(), "screenshot-2.png")], ClassifierFeature())[0]
    assert verdict.verdict == "VISION", verdict.reasons


@needs_tesseract
def test_a_hash_in_a_file_name_is_not_read_as_words() -> None:
    verdict = classify_images([_image(_bar_chart(), "img_ad12aeb956.png")], ClassifierFeature())[0]
    assert not any("file name mentions" in reason for reason in verdict.reasons)
    assert _classify([_image(_logo(), "ad-banner.png")]) == ["IGNORE"]


def test_undecodable_images_are_ignored_with_the_reason() -> None:
    broken = DocumentImage(url="cid:x", name="x.png", mime="image/png", data=b"garbage")
    verdict = classify_images([broken], ClassifierFeature())[0]
    assert verdict.verdict == "IGNORE"
    assert verdict.reasons[0].startswith("undecodable image")


def test_an_svg_chart_with_labels_goes_to_vision_and_a_hostile_one_is_ignored() -> None:
    chart = b'<svg xmlns="http://www.w3.org/2000/svg"><text>Revenue 4,210</text><text>Q1 2024</text></svg>'
    hostile = b'<!DOCTYPE svg [<!ENTITY a "aaaa">]><svg><text>&a;</text></svg>'
    images = [
        DocumentImage(url=f"{n}.svg", name=f"{n}.svg", mime="image/svg+xml", data=d)
        for n, d in (("chart", chart), ("hostile", hostile))
    ]
    assert _classify(images) == ["VISION", "IGNORE"]


def test_disabled_classifier_sends_every_decodable_image_to_vision() -> None:
    images = [_image(Image.new("RGB", (1, 1)), "pixel.gif"), _image(_icon(16), "icon.png")]
    images.append(DocumentImage(url="cid:y", name="y.png", mime="image/png", data=b"garbage"))
    verdicts = classify_images(images, ClassifierFeature(enabled=False))
    assert [v.verdict for v in verdicts] == ["VISION", "VISION", "IGNORE"]
    assert verdicts[0].reasons == ["classifier disabled"]


def test_the_classifier_is_deterministic() -> None:
    images = [_image(_bar_chart(), "a.png"), _image(_logo(), "logo.png"), _image(_photo(), "b.png")]
    first = classify_images(images, ClassifierFeature())
    assert classify_images(images, ClassifierFeature()) == first
