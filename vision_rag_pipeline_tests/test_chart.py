"""Chart values paired with their category labels by layout: rendered charts read by real Tesseract,
laid-out words (property tests), and the layouts where pairing must say nothing."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image, ImageDraw, ImageFont

from vision_rag_pipeline.documents.model import DocumentImage
from vision_rag_pipeline.enrichment import ocr
from vision_rag_pipeline.enrichment.chart import chart_rows, evenly_stepped
from vision_rag_pipeline.enrichment.fusion import fuse_by_rule, fuse_with_llm
from vision_rag_pipeline.enrichment.model import CHART_DATA_HEADING, OcrResult, OcrWord
from vision_rag_pipeline.enrichment.ocr import ocr_image

needs_tesseract = pytest.mark.skipif(not ocr.available_languages(), reason="tesseract is not installed")


def _font(size: int) -> ImageFont.FreeTypeFont:
    return ImageFont.load_default(size=size)


def _vertical_bars(categories: list[str], labels: list[str], heights: list[float]) -> Image.Image:
    img = Image.new("RGB", (900, 520), "white")
    draw = ImageDraw.Draw(img)
    draw.text((40, 20), "Orders per site, 2019 (thousands)", fill="#222222", font=_font(26))
    left, right, top, bottom = 90, 870, 90, 450
    for tick in range(0, 101, 25):  # a value axis whose ticks must never become values
        y = bottom - (bottom - top) * tick / 100
        draw.text((left - 12, y), str(tick), anchor="rm", fill="#666666", font=_font(16))
    slot = (right - left) / len(categories)
    for index, (category, label, height) in enumerate(zip(categories, labels, heights, strict=True)):
        x0, x1 = left + slot * index + slot * 0.2, left + slot * (index + 1) - slot * 0.2
        y = bottom - (bottom - top) * height / 100
        draw.rectangle((x0, y, x1, bottom), fill=("#1f4e79", "#c0504d", "#9bbb59", "#8064a2")[index % 4])
        draw.text(((x0 + x1) / 2, y - 8), label, anchor="mb", fill="#222222", font=_font(26))
        draw.text(((x0 + x1) / 2, bottom + 14), category, anchor="mt", fill="#333333", font=_font(22))
    return img


def _horizontal_bars(categories: list[str], labels: list[str], lengths: list[float]) -> Image.Image:
    img = Image.new("RGB", (900, 420), "white")
    draw = ImageDraw.Draw(img)
    draw.text((30, 20), "Share who agree", fill="#222222", font=_font(26))
    for index, (category, label, length) in enumerate(zip(categories, labels, lengths, strict=True)):
        y = 110 + index * 75
        draw.text((200, y), category, anchor="rm", fill="#333333", font=_font(24))
        end = 240 + 5 * length
        draw.rectangle((240, y - 16, end, y + 16), fill="#1f4e79")
        draw.text((end + 24, y), label, anchor="lm", fill="#222222", font=_font(24))
    return img


@needs_tesseract
def test_vertical_bar_values_are_paired_with_the_labels_under_them() -> None:
    result = ocr_image(
        _vertical_bars(
            ["Lisbon", "Oslo", "Tallinn", "Dublin"],
            ["61.5", "38.2", "84.7", "47.9"],
            [61.5, 38.2, 84.7, 47.9],
        ),
        ["eng"],
    )
    assert chart_rows(result.words) == ["Lisbon: 61.5", "Oslo: 38.2", "Tallinn: 84.7", "Dublin: 47.9"]


@needs_tesseract
def test_horizontal_bar_values_are_paired_with_the_labels_beside_them() -> None:
    categories = ["Farmers", "Teachers", "Nurses", "Bankers"]
    result = ocr_image(_horizontal_bars(categories, ["72%", "35%", "58%", "21%"], [72, 35, 58, 21]), ["eng"])
    assert chart_rows(result.words) == ["Farmers: 72%", "Teachers: 35%", "Nurses: 58%", "Bankers: 21%"]


@needs_tesseract
def test_a_grid_of_tiles_each_a_label_over_its_value_pairs_nothing() -> None:
    """The second row's labels have the first row's values above them in their bands: that layout
    pairs either way, so it must pair neither (it used to give a tile the value of the one above)."""
    img = Image.new("RGB", (960, 420), "#141922")
    draw = ImageDraw.Draw(img)
    tiles = [("ACTIVE USERS", "18.4K"), ("CHURN RATE", "3.9%"), ("OPEN TICKETS", "412"), ("UPTIME", "99.2%")]
    for index, (label, value) in enumerate(tiles):
        x0, y0 = 36 + (index % 2) * 450, 90 + (index // 2) * 160
        draw.rounded_rectangle((x0, y0, x0 + 420, y0 + 140), radius=12, fill="#212836")
        draw.text((x0 + 24, y0 + 22), label, fill="#8fa1b8", font=_font(20))
        draw.text((x0 + 24, y0 + 62), value, fill="#e6f1ff", font=_font(46))
    assert chart_rows(ocr_image(img, ["eng"]).words) == []


@needs_tesseract
def test_rule_fusion_adds_the_pairs_and_keeps_the_raw_ocr_text() -> None:
    result = ocr_image(
        _vertical_bars(["Lisbon", "Oslo", "Tallinn"], ["61.5", "38.2", "84.7"], [61.5, 38.2, 84.7]), ["eng"]
    )
    image = DocumentImage(
        url="https://example.com/c.png", name="c.png", mime="image/png", data=b"x", alt="Orders chart"
    )
    content = fuse_by_rule(image, [], result, "r.mhtml/c.png", 8).meta_content
    assert f"{CHART_DATA_HEADING}\nLisbon: 61.5\nOslo: 38.2\nTallinn: 84.7" in content
    assert "Text in image:\n" in content and "84.7" in content.split(CHART_DATA_HEADING)[0]


def test_a_table_gets_no_chart_data_even_when_its_words_line_up() -> None:
    words = _laid_out_vertical(["North", "South", "East"], ["10.5", "20.5", "30.5"], shift=0.0)
    image = DocumentImage(
        url="https://example.com/t.png", name="t.png", mime="image/png", data=b"x", alt="Sales table"
    )
    content = fuse_by_rule(
        image, [], OcrResult(text="North South East", words=words), "r/t.png", 8
    ).meta_content
    assert CHART_DATA_HEADING not in content


# --- laid-out words: the geometry alone ------------------------------------------------------------

SPACING = 200
HEIGHT = 20


def _word(text: str, centre_x: float, top: float) -> OcrWord:
    width = 11 * len(text)
    return OcrWord(
        text=text, conf=95.0, left=round(centre_x - width / 2), top=round(top), width=width, height=HEIGHT
    )


def _laid_out_vertical(
    categories: list[str], values: list[str], shift: float, value_tops: list[int] | None = None
) -> list[OcrWord]:
    """Category labels on one row at y=460, each value above its category, the last one moved by
    `shift` spacings along x; a tick column (0..100 by 25) at the left."""
    tops = value_tops or [150 + 37 * i for i in range(len(values))]
    words = [_word(str(t), 60, 440 - 3.5 * t) for t in range(0, 101, 25)]
    for index, (category, value, top) in enumerate(zip(categories, values, tops, strict=True)):
        centre = 200 + SPACING * index
        words.append(_word(category, centre, 460))
        words.append(_word(value, centre + (shift * SPACING if index == len(values) - 1 else 0), top))
    return words


_NAMES = st.lists(
    st.text(alphabet="abcdefghijklmnopqrstuvwxyz", min_size=3, max_size=8).map(str.capitalize),
    min_size=2,
    max_size=5,
    unique=True,
)


@st.composite
def _chart(draw: st.DrawFn) -> tuple[list[str], list[str]]:
    names = draw(_NAMES)
    values = draw(st.lists(st.decimals(1, 999, places=1).map(str), min_size=len(names), max_size=len(names)))
    return names, values


@settings(max_examples=60, deadline=None)
@given(chart=_chart(), order=st.randoms(use_true_random=False))
def test_every_value_is_paired_with_the_label_in_its_band_in_any_reading_order(
    chart: tuple[list[str], list[str]], order: object
) -> None:
    names, values = chart
    words = _laid_out_vertical(names, values, shift=0.0)
    order.shuffle(words)  # type: ignore[attr-defined]
    assert chart_rows(words) == [f"{name}: {value}" for name, value in zip(names, values, strict=True)]


@settings(max_examples=60, deadline=None)
@given(chart=_chart(), shift=st.floats(0.3, 0.7))
def test_a_value_between_two_bands_pairs_nothing(chart: tuple[list[str], list[str]], shift: float) -> None:
    names, values = chart
    assert chart_rows(_laid_out_vertical(names, values, shift=shift)) == []


@settings(max_examples=40, deadline=None)
@given(chart=_chart())
def test_a_category_without_a_value_pairs_nothing(chart: tuple[list[str], list[str]]) -> None:
    names, values = chart
    words = [w for w in _laid_out_vertical(names, values, shift=0.0) if w.text != values[-1] or w.top > 400]
    assert chart_rows(words) == []


def test_unevenly_spaced_labels_are_not_a_category_axis() -> None:
    words = _laid_out_vertical(["Alpha", "Beta", "Gamma"], ["11.5", "22.5", "33.5"], shift=0.0)
    moved = [w.model_copy(update={"left": w.left + 120}) if w.text in ("Gamma", "33.5") else w for w in words]
    assert chart_rows(moved) == []


def test_two_readings_of_one_box_keep_the_surer_one() -> None:
    words = _laid_out_vertical(["Alpha", "Beta", "Gamma"], ["11.5", "22.5", "33.5"], shift=0.0)
    doubted = next(w for w in words if w.text == "22.5").model_copy(update={"text": "225", "conf": 40.0})
    assert chart_rows([*words, doubted]) == ["Alpha: 11.5", "Beta: 22.5", "Gamma: 33.5"]


def test_series_side_by_side_in_a_band_are_listed_left_to_right() -> None:
    words = [_word(name, 200 + SPACING * i, 460) for i, name in enumerate(["Alpha", "Beta", "Gamma"])]
    for i, (first, second) in enumerate([("11.5", "12.5"), ("27.5", "22.5"), ("31.5", "39.5")]):
        words += [_word(first, 200 + SPACING * i - 40, 200), _word(second, 200 + SPACING * i + 40, 260)]
    assert chart_rows(words) == ["Alpha: 11.5 · 12.5", "Beta: 27.5 · 22.5", "Gamma: 31.5 · 39.5"]


class _RecordingModel:
    """Stands in for the vision client: records what fusion asks, replies with a fixed entry."""

    def __init__(self) -> None:
        self.system = self.user = ""

    def fuse(
        self, system: str, user: str, model: str, llm_kwargs: dict, budget_s: float | None = None
    ) -> str:
        self.system, self.user = system, user
        return json.dumps(
            {"type": "Chart", "keywords": ["orders"], "content": "Orders per city. Alpha: 11.5"}
        )


def test_llm_fusion_is_asked_for_category_value_lines_and_given_the_layouts_pairs() -> None:
    words = _laid_out_vertical(["Alpha", "Beta", "Gamma"], ["11.5", "22.5", "33.5"], shift=0.0)
    ocr = OcrResult(text="Alpha Beta Gamma\n11.5 22.5 33.5", confidence=92.0, level="High", words=words)
    image = DocumentImage(
        url="https://example.com/c.png", name="c.png", mime="image/png", data=b"x", alt="Orders chart"
    )
    model = _RecordingModel()
    fuse_with_llm(model, "m", {}, image, [], ocr, "r/c.png", 8, "A bar chart.")  # type: ignore[arg-type]
    assert "'category: value'" in model.system
    assert "Alpha: 11.5\nBeta: 22.5\nGamma: 33.5" in model.user


def test_table_rows_in_the_band_of_a_label_whose_own_row_went_unread_pair_nothing() -> None:
    """Two of four row labels read at one edge: each band then spans two table rows, and the row
    below would lend its numbers to the label above (it gave "Platform uptime: $86.5M")."""
    words = [_word("Platform uptime", 150, 100), _word("Cash on hand", 150, 268)]
    cells = [("98.47%", "97.75%"), ("$86.5M", "$89.0M"), ("40.3", "41.5"), ("$136.9M", "$117.0M")]
    for top, (actual, target) in zip((100, 156, 212, 268), cells, strict=True):
        words += [_word(actual, 420, top), _word(target, 620, top)]
    assert chart_rows(words) == []


def test_labels_over_their_own_values_never_take_the_values_above() -> None:
    """Tiles in a grid, one of the top labels unread: the bottom labels stand under the top tiles'
    values, but their own values stand right under them; the layout pairs nothing (it gave
    "CHURN RATE: $95.10")."""
    words = [_word("ORDER VALUE", 200, 100), _word("$95.10", 200, 140), _word("41.3", 600, 140)]
    words += [_word("CHURN RATE", 200, 260), _word("2.2%", 200, 300)]
    words += [_word("UPTIME", 600, 260), _word("99.15%", 600, 300)]
    assert chart_rows(words) == []


def test_labels_tesseract_doubts_pair_nothing() -> None:
    """A mirrored scan reads as confident-looking garbage ("ClocK Hie: 0"); OCR keeps the words it
    left unscored at 60, so a label needs more than that."""
    words = _laid_out_vertical(["Alpha", "Beta", "Gamma"], ["11.5", "22.5", "33.5"], shift=0.0)
    doubted = [
        w.model_copy(update={"conf": 60.0}) if w.text in ("Alpha", "Beta", "Gamma") else w for w in words
    ]
    assert chart_rows(words) and chart_rows(doubted) == []


@given(
    start=st.integers(-1000, 1000),
    step=st.sampled_from([0.1, 0.25, 1, 5, 10, 250]),
    count=st.integers(3, 8),
)
def test_axis_ticks_are_evenly_stepped_whatever_the_float_error_and_a_bar_value_breaks_them(
    start: int, step: float, count: int
) -> None:
    ticks = [start * step + i * step for i in range(count)]  # 0.1 steps come out 0.09999999999999998
    assert evenly_stepped(ticks, 1e-6)
    assert not evenly_stepped([*ticks[:-1], ticks[-1] + 0.3 * step], 0.01)
    assert not evenly_stepped(ticks[:2], 0.01)
