"""Image decoding for enrichment: every raster becomes RGB, hostile input gets a one-line reason."""

from __future__ import annotations

import io
import struct
import zlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays
from PIL import Image, ImageDraw, ImageFilter, ImageFont

from vision_rag_pipeline.enrichment.preprocess import (
    MAX_IMAGE_BYTES,
    ImageError,
    deskew,
    edge_sharpness,
    encode_for_vision,
    estimate_skew,
    for_ocr,
    load_image,
    long_runs,
    sharpen_soft,
    svg_text,
)


def _encode(img: Image.Image, fmt: str, **kwargs: object) -> bytes:
    buffer = io.BytesIO()
    img.save(buffer, format=fmt, **kwargs)
    return buffer.getvalue()


def test_palette_with_transparency_becomes_rgb_on_white() -> None:
    img = Image.new("P", (20, 20), 0)
    img.putpalette([0, 0, 0, 255, 0, 0] + [0] * 762)
    ImageDraw.Draw(img).rectangle([0, 0, 9, 19], fill=1)
    loaded = load_image(_encode(img, "PNG", transparency=0), "image/png")
    assert loaded.mode == "RGB"
    assert loaded.getpixel((5, 5)) == (255, 0, 0)
    assert loaded.getpixel((15, 5)) == (255, 255, 255)  # transparent part composited on white


def test_alpha_is_composited_on_white() -> None:
    img = Image.new("RGBA", (10, 10), (0, 0, 0, 0))
    img.putpixel((1, 1), (0, 0, 255, 255))
    loaded = load_image(_encode(img, "PNG"), "image/png")
    assert loaded.getpixel((0, 0)) == (255, 255, 255)
    assert loaded.getpixel((1, 1)) == (0, 0, 255)


def test_cmyk_jpeg_becomes_rgb() -> None:
    img = Image.new("CMYK", (16, 16), (0, 255, 255, 0))  # pure red in CMYK
    loaded = load_image(_encode(img, "JPEG"), "image/jpeg")
    red, green, blue = loaded.getpixel((8, 8))
    assert loaded.mode == "RGB" and red > 200 and green < 60 and blue < 60


def test_16_bit_greyscale_is_stretched_not_clipped() -> None:
    ramp = np.tile(np.linspace(0, 4000, 64, dtype=np.uint16), (8, 1))
    loaded = load_image(_encode(Image.fromarray(ramp), "PNG"), "image/png")
    values = np.asarray(loaded.convert("L"))
    assert values.min() == 0 and values.max() == 255


def test_animated_gif_gives_its_first_frame() -> None:
    frames = [Image.new("RGB", (10, 10), colour) for colour in ((255, 0, 0), (0, 0, 255))]
    data = _encode(frames[0], "GIF", save_all=True, append_images=frames[1:], duration=100, loop=0)
    red, green, blue = load_image(data, "image/gif").getpixel((5, 5))
    assert red > 200 and blue < 50


@pytest.mark.parametrize("fmt", ["WEBP", "BMP", "TIFF"])
def test_other_raster_formats_load(fmt: str) -> None:
    img = Image.new("RGB", (30, 20), (10, 200, 30))
    loaded = load_image(_encode(img, fmt), f"image/{fmt.lower()}")
    assert loaded.size == (30, 20) and loaded.mode == "RGB"


def test_images_over_20_mb_are_refused() -> None:
    with pytest.raises(ImageError, match="too large"):
        load_image(b"\x89PNG" + b"\0" * MAX_IMAGE_BYTES, "image/png")


def _png_header_only(width: int, height: int) -> bytes:
    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(b""))
        + chunk(b"IEND", b"")
    )


@pytest.mark.parametrize("side", [8_000, 50_000])
def test_decompression_bomb_is_refused_before_decoding(side: int) -> None:
    with pytest.raises(ImageError, match="decompression bomb refused: .*pixel"):
        load_image(_png_header_only(side, side), "image/png")


def test_undecodable_bytes_get_a_one_line_reason() -> None:
    with pytest.raises(ImageError, match="undecodable image") as caught:
        load_image(b"not an image at all", "image/png")
    assert "\n" not in str(caught.value)


SVG_CHART = b"""<?xml version="1.0"?>
<svg xmlns="http://www.w3.org/2000/svg" width="200" height="100">
  <title>Revenue by quarter</title><desc>Bar chart of 2023 revenue</desc>
  <rect width="50" height="80"/>
  <text x="5" y="90">Q1 <tspan>4,210</tspan></text>
  <text x="60" y="90">Q2 4,380</text>
</svg>"""


def test_svg_labels_are_extracted_as_text() -> None:
    assert svg_text(SVG_CHART).splitlines() == [
        "Revenue by quarter",
        "Bar chart of 2023 revenue",
        "Q1 4,210",
        "Q2 4,380",
    ]


def test_svg_is_not_rasterized_but_says_why() -> None:
    with pytest.raises(ImageError, match="SVG not rasterized"):
        load_image(SVG_CHART, "image/svg+xml")


@pytest.mark.parametrize(
    "svg",
    [
        b'<?xml version="1.0"?><!DOCTYPE svg [<!ENTITY lol "lol"><!ENTITY lol2 "&lol;&lol;">]>'
        b'<svg xmlns="http://www.w3.org/2000/svg"><text>&lol2;</text></svg>',
        b'<?xml version="1.0"?><!DOCTYPE svg SYSTEM "file:///etc/passwd"><svg><text>x</text></svg>',
    ],
)
def test_svg_with_dtd_or_entities_is_refused(svg: bytes) -> None:
    with pytest.raises(ImageError, match="DTD or entities"):
        svg_text(svg)


@given(st.text(alphabet=st.characters(categories=["L", "N"]), min_size=1, max_size=40))
def test_any_svg_text_label_comes_back(label: str) -> None:
    svg = f'<svg xmlns="http://www.w3.org/2000/svg"><text>{label}</text></svg>'.encode()
    assert svg_text(svg) == label


@pytest.mark.parametrize(
    ("size", "detail", "expected"),
    [
        ((4000, 1000), "low", (512, 128)),
        ((4000, 1000), "high", (2048, 512)),
        ((3000, 3000), "high", (768, 768)),
        ((1000, 800), "auto", (960, 768)),
        ((300, 200), "auto", (300, 200)),
    ],
)
def test_encode_for_vision_resizes_like_the_provider(
    size: tuple[int, int], detail: str, expected: tuple[int, int]
) -> None:
    data, mime, out_size = encode_for_vision(Image.new("RGB", size, "white"), detail)
    assert out_size == expected
    assert Image.open(io.BytesIO(data)).size == expected
    assert mime == "image/png"  # a flat graphic stays lossless


def test_photos_are_sent_as_jpeg() -> None:
    noise = np.random.default_rng(0).integers(0, 256, (300, 400, 3), dtype=np.uint8)
    data, mime, _ = encode_for_vision(Image.fromarray(noise), "low")
    assert mime == "image/jpeg" and data[:2] == b"\xff\xd8"


def test_for_ocr_enlarges_small_text_in_greyscale() -> None:
    from PIL import ImageFont

    img = Image.new("RGB", (400, 120), "white")
    draw = ImageDraw.Draw(img)
    for row in range(4):
        draw.text((10, 10 + row * 25), "small print line", fill="black", font=ImageFont.load_default(size=10))
    prepared = for_ocr(img)
    assert prepared.mode == "L"
    assert prepared.width >= 2 * img.width


def _naive_run_lengths(row: list[bool]) -> list[int]:
    out, i = [0] * len(row), 0
    while i < len(row):
        j = i
        while j < len(row) and row[j]:
            j += 1
        for k in range(i, j):
            out[k] = j - i
        i = max(j, i + 1)
    return out


@settings(max_examples=80)
@given(arrays(np.bool_, st.tuples(st.integers(1, 12), st.integers(1, 12))), st.integers(1, 13))
def test_long_runs_match_a_plain_count(mask: np.ndarray, length: int) -> None:
    rows = long_runs(mask, 1, length)
    columns = long_runs(mask, 0, length)
    assert rows.tolist() == [[n >= length for n in _naive_run_lengths(r)] for r in mask.tolist()]
    assert columns.T.tolist() == [[n >= length for n in _naive_run_lengths(c)] for c in mask.T.tolist()]


def _report_lines() -> Image.Image:
    img = Image.new("RGB", (700, 400), "white")
    draw = ImageDraw.Draw(img)
    for row in range(6):
        draw.text(
            (30, 30 + row * 55),
            f"Line {row} of the quarterly report: 4,21{row}",
            fill="black",
            font=ImageFont.load_default(size=24),
        )
    return img


@settings(max_examples=8, deadline=None)
@given(st.floats(min_value=-5.0, max_value=5.0).filter(lambda a: abs(a) >= 1.0))
def test_the_skew_of_a_crooked_page_is_measured_so_it_can_be_undone(angle: float) -> None:
    crooked = _report_lines().rotate(angle, Image.Resampling.BICUBIC, expand=True, fillcolor="white")
    assert estimate_skew(np.asarray(crooked.convert("L"))) == pytest.approx(-angle, abs=0.5)


def test_a_straight_page_is_left_as_it_is() -> None:
    page = _report_lines()
    assert deskew(page) == (page, 0.0)


def test_deskew_turns_a_coloured_slide_back_and_fills_the_corners_with_its_background() -> None:
    slide = Image.new("RGB", (600, 300), "#1f4e79")
    ImageDraw.Draw(slide).text(
        (40, 120), "Gross margin came in at 73.2%", fill="white", font=ImageFont.load_default(size=30)
    )
    upright, angle = deskew(slide.rotate(3.5, Image.Resampling.BICUBIC, expand=True, fillcolor="#1f4e79"))
    assert angle == pytest.approx(-3.5, abs=0.5)
    assert upright.getpixel((1, 1)) == (0x1F, 0x4E, 0x79)


def test_blurred_images_are_told_from_sharp_ones_and_only_they_are_sharpened() -> None:
    sharp = _report_lines()
    blurred = sharp.filter(ImageFilter.GaussianBlur(1.4))
    assert (
        edge_sharpness(np.asarray(blurred.convert("L")))
        < 0.5
        <= edge_sharpness(np.asarray(sharp.convert("L")))
    )
    assert sharpen_soft(sharp, 24.0) == (sharp, 24.0, False)
    restored, height, done = sharpen_soft(blurred, 24.0)
    assert done and restored.size == (1400, 800) and height == 48.0
    back = restored.resize(blurred.size, Image.Resampling.LANCZOS).convert("L")
    assert edge_sharpness(np.asarray(back)) > edge_sharpness(np.asarray(blurred.convert("L")))


def test_an_image_already_enlarged_for_ocr_is_sharpened_at_its_size() -> None:
    small = _report_lines().resize((350, 200), Image.Resampling.LANCZOS)
    enlarged = small.resize((1050, 600), Image.Resampling.BICUBIC)  # what scale_for_ocr does to small type
    restored, height, done = sharpen_soft(enlarged, 20.0, enlarged=3.0)
    assert done and restored.size == enlarged.size and height == 20.0
    assert edge_sharpness(np.asarray(restored.convert("L"))) > edge_sharpness(
        np.asarray(enlarged.convert("L"))
    )
