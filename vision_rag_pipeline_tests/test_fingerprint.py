"""The perceptual hash search by image relies on: stable under a copy, blind to plain pictures."""

from __future__ import annotations

import io

from hypothesis import given
from hypothesis import strategies as st
from PIL import Image, ImageDraw

from vision_rag_pipeline.images.fingerprint import perceptual_hash
from vision_rag_pipeline.query.candidates import NEAR_DUPLICATE_BITS

colours = st.tuples(st.integers(0, 255), st.integers(0, 255), st.integers(0, 255))


def _bits_apart(first: str, second: str) -> int:
    return (int(first, 16) ^ int(second, 16)).bit_count()


def _slide(title_colour: str = "#1f4e79") -> Image.Image:
    img = Image.new("RGB", (800, 600), "white")
    draw = ImageDraw.Draw(img)
    draw.rectangle((0, 0, 800, 110), fill=title_colour)
    for row in range(5):
        draw.rectangle((60, 160 + row * 80, 60 + 120 * (row + 1), 200 + row * 80), fill="#c55a11")
    return img


@given(colours, st.integers(1, 400), st.integers(1, 400))
def test_a_plain_picture_has_no_hash(colour: tuple[int, int, int], width: int, height: int) -> None:
    assert perceptual_hash(Image.new("RGB", (width, height), colour)) is None


def test_a_faint_rule_on_a_blank_page_has_no_hash() -> None:
    page = Image.new("RGB", (1000, 1400), "white")
    ImageDraw.Draw(page).line((100, 700, 900, 700), fill="black", width=2)
    assert perceptual_hash(page) is None


def test_a_resized_jpeg_copy_keeps_the_hash_and_another_picture_does_not() -> None:
    original = perceptual_hash(_slide())
    buffer = io.BytesIO()
    _slide().resize((400, 300)).save(buffer, format="JPEG", quality=40)
    copy = perceptual_hash(Image.open(io.BytesIO(buffer.getvalue())))
    assert original and copy and _bits_apart(original, copy) <= 4
    mirrored = perceptual_hash(_slide().transpose(Image.Transpose.FLIP_LEFT_RIGHT))
    assert mirrored and _bits_apart(original, mirrored) > NEAR_DUPLICATE_BITS  # not the same
