"""OCR on generated images of the kinds plain Tesseract gets wrong in reports."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest
from PIL import Image, ImageDraw, ImageFilter, ImageFont

from vision_rag_pipeline.enrichment import ocr
from vision_rag_pipeline.enrichment.ocr import confidence_level, ocr_image, usable_languages
from vision_rag_pipeline_tests.conftest import CORPUS

pytestmark = pytest.mark.skipif(not ocr.available_languages(), reason="tesseract is not installed")

SENTENCES = [
    "Quarterly revenue grew 12 percent to 4,210 million",
    "Operating margin improved in every region",
    "Headcount reached 18,300 employees worldwide",
]


def _font(size: int) -> ImageFont.FreeTypeFont:
    return ImageFont.load_default(size=size)


SERIF = Path("/usr/share/fonts/truetype/dejavu/DejaVuSerif.ttf")  # a second face where the system has it
FACES = [_font] + ([lambda size: ImageFont.truetype(SERIF, size)] if SERIF.exists() else [])


def _text_image(foreground: str = "black", background: str = "white") -> Image.Image:
    img = Image.new("RGB", (800, 600), background)
    draw = ImageDraw.Draw(img)
    for row, sentence in enumerate(SENTENCES):
        draw.text((30, 60 + row * 50), sentence, fill=foreground, font=_font(22))
    return img


def _words(text: str) -> set[str]:
    return set(text.lower().split())


def test_a_rendered_paragraph_is_read_back_with_high_confidence() -> None:
    result = ocr_image(_text_image(), ["eng"])
    assert {"quarterly", "revenue", "4,210", "headcount", "18,300"} <= _words(result.text)
    assert result.level == "High"
    assert result.languages == ["eng"]


def test_light_text_on_a_dark_dashboard_is_read() -> None:
    result = ocr_image(_text_image(foreground="#e8e8e8", background="#1b2330"), ["eng"])
    assert {"operating", "margin", "region", "4,210"} <= _words(result.text)


def test_a_kpi_table_with_grid_lines_reads_its_cells_row_by_row() -> None:
    rows = [("Metric", "Q1", "Q2"), ("Revenue", "4,210", "4,380"), ("Churn", "2.1%", "1.9%")]
    img = Image.new("RGB", (800, 600), "white")
    draw = ImageDraw.Draw(img)
    columns, top, height = [40, 300, 520, 760], 80, 70
    for r in range(len(rows) + 1):
        draw.line([(columns[0], top + r * height), (columns[-1], top + r * height)], fill="black", width=3)
    for x in columns:
        draw.line([(x, top), (x, top + len(rows) * height)], fill="black", width=3)
    for r, row in enumerate(rows):
        for c, value in enumerate(row):
            draw.text((columns[c] + 14, top + r * height + 22), value, fill="black", font=_font(24))
    lines = ocr_image(img, ["eng"]).text.splitlines()
    assert "Revenue 4,210 4,380" in lines
    assert "Churn 2.1% 1.9%" in lines


def test_value_labels_inside_dark_bars_are_read() -> None:
    img = Image.new("RGB", (800, 600), "white")
    draw = ImageDraw.Draw(img)
    bars = [("North", 820, "#1f3b73"), ("South", 640, "#7a1f1f"), ("West", 455, "#333333")]
    for i, (region, value, colour) in enumerate(bars):
        y = 80 + i * 130
        draw.rectangle([150, y, 150 + value * 0.7, y + 80], fill=colour)
        draw.text((20, y + 26), region, fill="black", font=_font(26))
        draw.text((170, y + 26), f"{value} units", fill="white", font=_font(26))
    words = _words(ocr_image(img, ["eng"]).text)
    assert {"north", "south", "west", "820", "640", "455"} <= words


def test_text_turned_by_90_degrees_is_read() -> None:
    result = ocr_image(_text_image().rotate(90, expand=True), ["eng"])
    assert {"quarterly", "revenue", "headcount"} <= _words(result.text)


def test_a_blank_image_reads_nothing_with_low_confidence() -> None:
    result = ocr_image(Image.new("RGB", (400, 300), "white"), ["eng"])
    assert result.text == "" and result.level == "Low" and result.confidence == 0


@pytest.mark.parametrize(
    ("confidence", "level"),
    [(96.0, "High"), (85.0, "High"), (84.9, "Medium"), (60.0, "Medium"), (59.9, "Low")],
)
def test_confidence_levels(confidence: float, level: str) -> None:
    assert confidence_level(confidence) == level


def test_a_missing_language_stops_ocr_instead_of_reading_english() -> None:
    with pytest.raises(ocr.OcrError, match="'xx_missing'.*apt-get install tesseract-ocr-xx-missing"):
        usable_languages(["eng", "xx_missing"])
    with pytest.raises(ocr.OcrError, match="xx_missing"):
        ocr_image(_text_image(), ["xx_missing"])


@pytest.mark.skipif("chi_sim" not in ocr.available_languages(), reason="chi_sim traineddata not installed")
def test_chinese_is_used_when_asked_and_installed() -> None:
    assert usable_languages(["eng", "chi_sim"]) == ["eng", "chi_sim"]
    assert ocr_image(_text_image(), ["chi_sim", "eng"]).languages == ["chi_sim", "eng"]


def _bar_chart() -> Image.Image:
    """A vertical bar chart as report tools draw it: grid lines, small decimal labels inside the bars."""
    img = Image.new("RGB", (900, 520), "white")
    draw = ImageDraw.Draw(img)
    draw.text((40, 25), "Revenue by region, Q4 2024 ($M)", fill="#222222", font=_font(26))
    for tick in range(6):
        y = 450 - tick * 72
        draw.line([(90, y), (870, y)], fill="#e6e6e6", width=1)
        draw.text((50, y - 9), str(tick * 20), fill="#888888", font=_font(15))
    bars = [
        ("East", 42.8, "#1f4e79"),
        ("West", 86.8, "#b03a2e"),
        ("Central", 62.5, "#117a65"),
        ("South", 74.6, "#6c3483"),
    ]
    for i, (region, value, colour) in enumerate(bars):
        left = 130 + i * 195
        top = 450 - value * 3.6
        draw.rectangle([left, top, left + 117, 450], fill=colour)
        draw.text((left + 30, top + 12), f"{value}", fill="white", font=_font(22))
        draw.text((left + 35, 460), region, fill="#222222", font=_font(20))
    return img


def test_decimal_value_labels_inside_coloured_bars_keep_their_decimal_point() -> None:
    words = _words(ocr_image(_bar_chart(), ["eng"]).text)
    assert {"42.8", "86.8", "62.5", "74.6", "east", "central"} <= words


def test_a_crooked_chart_is_levelled_before_it_is_read() -> None:
    crooked = _bar_chart().rotate(3.5, Image.Resampling.BICUBIC, expand=True, fillcolor="white")
    assert {"86.8", "62.5", "74.6", "east", "west", "central", "south"} <= _words(
        ocr_image(crooked, ["eng"]).text
    )


def test_a_blurred_chart_is_sharpened_before_it_is_read() -> None:
    blurred = _bar_chart().filter(ImageFilter.GaussianBlur(1.4))
    assert {"42.8", "86.8", "62.5", "74.6"} <= _words(ocr_image(blurred, ["eng"]).text)


def _number_page(text: str, blur: float = 0.0) -> tuple[Image.Image, ocr._Word]:
    """A number drawn 40 px tall on a white page, and the word box Tesseract would give it."""
    page = Image.new("L", (400, 120), 255)
    draw = ImageDraw.Draw(page)
    draw.text((40, 30), text, fill=0, font=_font(48))
    left, top, right, bottom = draw.textbbox((40, 30), text, font=_font(48))
    if blur:
        page = page.filter(ImageFilter.GaussianBlur(blur))
    return page, ocr._Word(text, 90.0, left, top, right - left, bottom - top)


def test_a_rereading_never_drops_a_decimal_point_the_first_reading_had() -> None:
    first = ocr._Word("48.5", 95.0, 0, 0, 60, 20)
    assert ocr._surest_number(first, [("485", 99.0)]) is None
    assert ocr._surest_number(ocr._Word("745", 93.0, 0, 0, 60, 20), [("745", 95.0), ("74.5", 70.0)]) == (
        "74.5",
        70.0,
    )


@pytest.mark.parametrize(("drawn", "read_as"), [("74.5", "745"), ("33,773", "33773"), ("$430.05", "$43005")])
def test_a_faint_separator_tesseract_read_past_is_restored_from_its_shape(drawn: str, read_as: str) -> None:
    page, box = _number_page(drawn, blur=1.2)
    assert (
        ocr._with_lost_separator(page, ocr._Word(read_as, box.conf, box.left, box.top, box.width, box.height))
        == drawn
    )


def test_a_colon_is_never_taken_for_a_lost_point() -> None:
    colon, box = _number_page("10:30", blur=1.2)
    for read_as in ("1030", "10:30"):
        word = ocr._Word(read_as, box.conf, box.left, box.top, box.width, box.height)
        assert ocr._with_lost_separator(colon, word) is None


def test_a_blurred_point_read_as_a_colon_is_a_point_when_nothing_sits_above_it() -> None:
    point, box = _number_page("70.9", blur=1.2)
    word = ocr._Word("70:9", box.conf, box.left, box.top, box.width, box.height)
    assert ocr._with_lost_separator(point, word) == "70.9"
    assert ocr._with_lost_separator(point, word, decimal=",") == "70,9", "a German page writes it its way"


def test_a_point_read_after_a_number_goes_where_a_much_surer_rereading_puts_it() -> None:
    """A label over a bar read "618." (the point fused with the bar's fringe) is 61.8 when the
    enlarged re-reading is sure of it; a sentence's full stop after a year stays where it is."""
    misplaced = ocr._Word("618.", 70.3, 0, 0, 60, 20)
    assert ocr._surest_number(misplaced, [("618", 74.8), ("61.8", 95.6)]) == ("61.8", 95.6)
    assert ocr._surest_number(misplaced, [("61.8", 75.0)]) is None, "not sure enough to move a mark"
    assert (
        ocr._surest_number(ocr._Word("2018.", 91.0, 0, 0, 60, 20), [("2018.", 96.0), ("2018", 95.0)]) is None
    )


def test_a_restored_decimal_mark_is_written_the_way_the_page_language_writes_it() -> None:
    lost = ocr._Word("746", 90.0, 0, 0, 60, 20)
    assert ocr._surest_number(lost, [("74,6", 80.0)], decimal=".") == ("74.6", 80.0)
    assert ocr._surest_number(lost, [("74.6", 80.0)], decimal=",") == ("74,6", 80.0)
    assert ocr._surest_number(ocr._Word("33773", 90.0, 0, 0, 60, 20), [("33,773", 80.0)]) == ("33,773", 80.0)
    assert ocr.decimal_mark(["deu", "eng"]) == "," and ocr.decimal_mark(["eng", "deu"]) == "."


def test_a_lost_point_is_found_when_the_label_sits_on_a_bar() -> None:
    page = Image.new("L", (400, 120), 255)
    draw = ImageDraw.Draw(page)
    left, top, right, bottom = draw.textbbox((40, 30), "59.7", font=_font(48))
    # a grey bar behind the label's lower half, kept apart from the digits by a light halo
    draw.rectangle((left - 12, (top + bottom) // 2, right + 12, bottom + 12), fill=140)
    draw.text((40, 30), "59.7", fill=0, font=_font(48), stroke_width=3, stroke_fill=255)
    page = page.filter(ImageFilter.GaussianBlur(1.0))
    word = ocr._Word("597", 90.0, left, top, right - left, bottom - top + 8)  # the box reaches the bar
    assert ocr._with_lost_separator(page, word) == "59.7"


def test_a_lost_point_is_found_when_the_word_box_takes_in_the_charts_line() -> None:
    page, box = _number_page("30.8", blur=1.0)
    line_y = box.top + box.height + 25
    ImageDraw.Draw(page).line(
        (box.left - 30, line_y + 20, box.left + box.width + 30, line_y), fill=0, width=4
    )
    tall = box.height + 50  # Tesseract's box reaches down over the line and its marker
    word = ocr._Word("308", box.conf, box.left, box.top, box.width, tall)
    assert ocr._with_lost_separator(page, word) == "30.8"


def test_two_numbers_read_as_one_word_get_no_invented_point() -> None:
    page, box = _number_page("335.7   350")
    word = ocr._Word("3357350", box.conf, box.left, box.top, box.width, box.height)
    assert ocr._with_lost_separator(page, word) is None


def test_a_word_tesseract_left_unscored_is_kept_only_beside_a_sure_word_and_when_it_looks_real() -> None:
    row = "5\t1\t1\t1\t{line}\t{n}\t{left}\t10\t50\t20\t{conf}\t{text}"
    tsv = "\n".join(
        [
            row.format(line=1, n=1, left=10, conf=0.0, text="1,611"),
            row.format(line=1, n=2, left=70, conf=0.0, text="invoices"),
            row.format(line=1, n=3, left=130, conf=95.3, text="need"),
            row.format(line=1, n=4, left=190, conf=0.0, text="1¢0;932"),
            row.format(line=2, n=1, left=10, conf=0.0, text="Details"),
        ]
    )
    (line,) = ocr._parse_tsv(tsv)
    assert line.text == "1,611 invoices need"


@pytest.mark.parametrize(
    ("first", "rereading"),
    [
        ("81,8", "81.8"),
        ("33,773", "33.773"),
        ("1,2", "1.2"),
        ("10:30", "10.30"),
        ("19:45", "1945"),
        ("3:2", "32"),
    ],
)
def test_a_rereading_never_rewrites_or_drops_a_mark_the_first_reading_had(first: str, rereading: str) -> None:
    """Which mark separates digits is the page's locale (12,5 % in German, 10:30 a time), not ours."""
    assert ocr._surest_number(ocr._Word(first, 80.0, 0, 0, 60, 20), [(rereading, 99.0)]) is None


def _rendered(text: str, face: ImageFont.FreeTypeFont, size: int, blur: float) -> Image.Image:
    img = Image.new("RGB", (round(face.getlength(text)) + 2 * size, 3 * size), "white")
    ImageDraw.Draw(img).text((size, size), text, font=face, fill="black")
    return img.filter(ImageFilter.GaussianBlur(blur)) if blur else img


@pytest.mark.parametrize(
    ("text", "kept"),
    [
        ("Umsatzrendite 2023: 12,5 %", "12,5 %"),
        ("Eigenkapitalquote: 7,25 %", "7,25 %"),
        ("siehe Abbildungen 1,2 und 3", "1,2 und"),
        ("see Figures 1,2 and 3", "Figures 1,2 and"),
        ("Umsatz 1.234,56 EUR", "1.234,56 EUR"),
        ("Beginn 10:30 Uhr", "10:30 Uhr"),
        ("Ende um 19:45", "um 19:45"),
        ("Seitenverhaltnis 3:2", "3:2"),
    ],
)
def test_numbers_of_any_locale_are_read_as_printed(text: str, kept: str) -> None:
    """European decimals, lists of figures, times and ratios come out as printed, in two fonts,
    two sizes and sharp or slightly blurred: no repair turns a comma or a colon into a point."""
    for face, size, blur in itertools.product(FACES, (22, 32), (0.0, 0.8)):
        read = " ".join(ocr_image(_rendered(text, face(size), size, blur), ["eng"]).text.split())
        assert kept in read, (face(size).getname(), size, blur, read)


def _doubted(page_text: str, read_as: str) -> tuple[list[ocr._Pass], Image.Image]:
    page, box = _number_page(page_text)
    sure = ocr._Word("copied", 96.0, box.left + box.width + 30, box.top, 80, box.height)
    doubted = ocr._Word(read_as, 6.0, box.left, box.top, box.width, box.height)
    return [ocr._Pass("layout", 0, [ocr._Line([doubted, sure], 0, unsure=1)])], page


@pytest.mark.parametrize(
    ("on_the_page", "doubted_reading", "kept"),
    [("638.3", "638.3:", "638.3"), ("12.5", "638.3", "12.5"), ("ABC", "638.3", None)],
)
def test_a_doubted_number_is_kept_only_when_a_sure_rereading_confirms_or_corrects_it(
    on_the_page: str, doubted_reading: str, kept: str | None
) -> None:
    passes, page = _doubted(on_the_page, doubted_reading)
    ocr._reread_numbers(page, passes, ["eng"])
    words = [w.text for w in ocr._without_doubtful_words(passes)[0].lines[0].words]
    assert words == ([kept, "copied"] if kept else ["copied"])


@pytest.mark.parametrize(
    ("on_the_page", "first_reading", "kept"),
    [("41.7", "AL7", "41.7"), ("A17", "A17", "A17"), ("H-558", "H-558", "H-558")],
)
def test_an_unsure_word_of_letters_and_digits_becomes_a_number_only_when_a_rereading_is_sure_of_it(
    on_the_page: str, first_reading: str, kept: str
) -> None:
    """A bar label read "AL7" is 41.7 when the enlarged re-reading is certain; codes stay codes."""
    page, box = _number_page(on_the_page)
    word = ocr._Word(first_reading, 59.0, box.left, box.top, box.width, box.height)
    passes = [ocr._Pass("rows", 0, [ocr._Line([word], 0)])]
    ocr._reread_numbers(page, passes, ["eng"])
    assert passes[0].lines[0].words[0].text == kept


def _line_chart(values: list[float], months: list[str]) -> Image.Image:
    """A monthly line chart with each value printed just above its marker, as dashboards draw them."""
    img = Image.new("RGB", (900, 520), "white")
    draw = ImageDraw.Draw(img)
    draw.text((40, 22), "Monthly active users, Q1 2025 (thousands)", fill="#222222", font=_font(28))
    for tick in range(4):
        y = 450 - 340 * tick / 3
        draw.line((90, y, 860, y), fill="#e6e6e6", width=1)
        draw.text((78, y), str(125 * tick), anchor="rm", fill="#888888", font=_font(16))
    points = [(150 + 650 * i / (len(values) - 1), 450 - 340 * v / 375) for i, v in enumerate(values)]
    draw.line(points, fill="#1f4e79", width=4)
    for (x, y), value, month in zip(points, values, months, strict=True):
        draw.ellipse((x - 7, y - 7, x + 7, y + 7), fill="#1f4e79")
        draw.text((x, y - 14), f"{value}", anchor="mb", fill="#222222", font=_font(26))
        draw.text((x, 464), month, anchor="mt", fill="#333333", font=_font(22))
    return img


def test_a_value_label_sitting_on_a_blurred_chart_line_is_read() -> None:
    # Tesseract reads the middle label and the line under it as one page-wide word ("O79");
    # the label is then found as unread glyphs and read on its own
    chart = _line_chart([311.7, 279.4, 304.7], ["Jan", "Feb", "Mar"]).filter(ImageFilter.GaussianBlur(1.4))
    assert {"311.7", "279.4", "304.7", "jan", "feb", "mar"} <= _words(ocr_image(chart, ["eng"]).text)


def test_a_word_box_far_wider_than_its_letters_hides_no_ink() -> None:
    page = Image.new("L", (1200, 200), 255)
    ImageDraw.Draw(page).text((600, 60), "279.4", fill=0, font=_font(40))
    runaway = ocr._Line([ocr._Word("O79", 40.0, 100, 40, 1000, 80)], order=0)
    assert ocr._leftover_labels(page, [runaway], 40.0) == ocr._leftover_labels(page, [], 40.0) != []


def test_a_photo_without_text_is_read_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Texture counts as unread ink, but a first read sure of no word on a page over a megapixel
    means there is no text to find: sparse, other-layout and upside-down reads would add noise and
    seconds (a 12-megapixel photo in the reference corpus took 13 s to read as "ae ee Se SS")."""
    texture = np.random.default_rng(5).normal(128, 60, (300, 400)).clip(0, 255).astype(np.uint8)
    photo = Image.fromarray(texture, "L").resize((1200, 900), Image.Resampling.BICUBIC).convert("RGB")
    reads: list[tuple[int, tuple[int, int]]] = []
    read_tsv = ocr.read_tsv

    def recorded(gray: Image.Image, psm: int, languages: list[str], **options: bool) -> str:
        reads.append((psm, gray.size))
        return read_tsv(gray, psm, languages, **options)

    monkeypatch.setattr(ocr, "read_tsv", recorded)
    result = ocr_image(photo, ["eng"])
    assert not any(w.conf >= ocr.HIGH_CONFIDENCE for w in result.words)
    assert [psm for psm, size in reads if size in (reads[0][1], reads[0][1][::-1])] in ([3], [6])


@pytest.mark.parametrize("angle", [90, 180])
def test_a_big_page_on_its_side_or_upside_down_is_still_turned_and_read(angle: int) -> None:
    """What the one-read rule must not cost: a first read of turned text is sure of few or no words
    (none for text on its side, whose ink runs vertically), yet the turned read finds it all."""
    page = _text_image().resize((1600, 1200), Image.Resampling.BICUBIC).rotate(angle, expand=True)
    assert page.width * page.height > ocr.SPECULATIVE_READ_MAX_PIXELS
    assert {"quarterly", "revenue", "headcount"} <= _words(ocr_image(page, ["eng"]).text)


def _prepared_in_colour(img: Image.Image) -> tuple[bytes, bool]:
    """`prepare_page`'s steps with the image kept in RGB throughout, as they ran before greyscale images
    were prepared in one channel."""
    from vision_rag_pipeline.enrichment.preprocess import deskew, scale_for_ocr, sharpen_soft

    upright, _ = deskew(img)
    scaled, height = scale_for_ocr(upright, keep_colour=True)
    scaled, height, _ = sharpen_soft(scaled, height, enlarged=scaled.width / upright.width)
    assert scaled.mode == "RGB"
    ink, removed = ocr.remove_ruling_lines(ocr.ink_map(scaled, height), height)
    return ocr._as_page(ink).tobytes(), bool(removed)


@pytest.mark.parametrize(
    ("angle", "blur", "font_size"),
    [(0.0, 0.0, 24), (2.5, 0.0, 24), (0.0, 1.6, 24), (-3.0, 1.2, 11), (0.0, 0.0, 9)],
)
def test_a_page_without_colour_is_prepared_in_one_channel_into_the_same_page(
    angle: float, blur: float, font_size: int
) -> None:
    """A scan decoded as RGB is prepared as greyscale (a third of the work): the page Tesseract reads
    must be the very page the RGB steps make, crooked, blurred or in small type (all steps run)."""
    page = Image.new("L", (640, 420), 250)
    draw = ImageDraw.Draw(page)
    draw.rectangle((20, 300, 600, 302), fill=30)  # a rule to remove
    for row in range(5):
        draw.text(
            (30, 30 + row * 50),
            f"Net revenue {row}: 4,21{row}.5",
            fill=20,
            font=ImageFont.load_default(size=font_size),
        )
    if angle:
        page = page.rotate(angle, Image.Resampling.BICUBIC, expand=True, fillcolor=250)
    if blur:
        page = page.filter(ImageFilter.GaussianBlur(blur))
    rgb = page.convert("RGB")
    prepared = ocr.prepare_page(rgb)
    assert (prepared.page.tobytes(), prepared.ruled) == _prepared_in_colour(rgb)


def _sea_texture() -> Image.Image:
    """A photo's texture that Tesseract takes for a few unsure words ("ea key hehe EE fee CO")."""
    rng = np.random.default_rng(0)
    img = Image.new("RGB", (900, 600), (40, 110, 140))
    draw = ImageDraw.Draw(img)
    for _ in range(2500):
        x, y, width = int(rng.integers(0, 900)), int(rng.integers(0, 600)), int(rng.integers(4, 14))
        colour = tuple(int(v) for v in rng.integers(150, 255, 3))
        draw.arc((x, y, x + width, y + width // 2 + 2), 180, 360, fill=colour, width=2)
    return img.filter(ImageFilter.GaussianBlur(0.6))


def _counting_reads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    reads: list[int] = []
    original = ocr.read_tsv

    def counted(gray: Image.Image, psm: int, languages: list[str], **options: bool) -> str:
        reads.append(psm)
        return original(gray, psm, languages, **options)

    monkeypatch.setattr(ocr, "read_tsv", counted)
    return reads


def test_a_picture_whose_first_read_is_texture_is_not_read_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """A Low reading of a picture is not indexed, so a first read that is a photo's texture ends it; a
    page image (a scan, a slide saved as a picture) keeps every read, as its reading is indexed."""
    reads = _counting_reads(monkeypatch)
    prepared = ocr.prepare_page(_sea_texture())
    picture = ocr.read_page(prepared, ["eng"], picture=True)
    assert len(reads) == 1 and picture.level == "Low"
    reads.clear()
    page_image = ocr.read_page(prepared, ["eng"])
    assert len(reads) > 1 and page_image.level == "Low"


def test_a_picture_with_text_is_read_as_fully_as_a_page_image(monkeypatch: pytest.MonkeyPatch) -> None:
    img = Image.new("RGB", (900, 420), "white")
    draw = ImageDraw.Draw(img)
    for row, line in enumerate(
        ["Quarterly revenue by region", "North 41.2  South 38.7", "West 12.5  East 7.6"]
    ):
        draw.text((40, 40 + row * 110), line, fill="black", font=ImageFont.load_default(size=40))
    reads = _counting_reads(monkeypatch)
    prepared = ocr.prepare_page(img)
    as_picture = ocr.read_page(prepared, ["eng"], picture=True)
    picture_reads = list(reads)
    reads.clear()
    assert as_picture == ocr.read_page(prepared, ["eng"]) and picture_reads == reads
    assert "revenue" in as_picture.text


TABLE_ROWS = [
    ("Processing", "total chunks", "mean chunks per document (std)", "tables mean (std)"),
    ("Base 128", "64,058", "800.73 (484.11)", "N/A"),
    ("Base 256", "32,051", "400.64 (242.04)", "N/A"),
    ("Base 512", "16,046", "200.58 (121.01)", "N/A"),
    ("Chipper", "20,843", "260.57 (145.80)", "96.20 (57.53)"),
]


def scanned_table_pdf(path: Path) -> Path:
    """A one-page PDF without a text layer whose only content is a ruled table in serif type, stored
    at about 118 dpi a quarter turn round and drawn upright by its matrix, as a paper's table pasted
    into a PDF often is: the loader renders the page at 200 dpi, upscaling it into soft, dense rows."""
    from vision_rag_pipeline_tests.test_pdf_loader import Page, Picture, write_pdf

    face = FACES[-1](16)
    pad, pitch = 3, 23
    widths = [max(round(face.getlength(row[c])) for row in TABLE_ROWS) + 2 * pad for c in range(4)]
    table = Image.new("L", (sum(widths) + 1, pitch * len(TABLE_ROWS) + 1), 255)
    draw = ImageDraw.Draw(table)
    left = 0
    for c, width in enumerate([*widths, 0]):
        draw.line([(left, 0), (left, table.height)], fill=0)
        for r, row in enumerate(TABLE_ROWS if c < len(widths) else []):
            draw.text((left + pad, r * pitch + 2), row[c], fill=0, font=face)
        left = min(left + width, table.width - 1)
    for r in range(len(TABLE_ROWS) + 1):
        draw.line([(0, r * pitch), (table.width, r * pitch)], fill=0)
    width, height = table.width / 1.64, table.height / 1.64  # 1.64 px per point: 118 dpi
    path.write_bytes(write_pdf([Page(pictures=[Picture(72, 400, width, height, table, stored_turned=True)])]))
    return path


def _read_as_ingest_does(path: Path) -> tuple[ocr.OcrResult, str]:
    """The reading of the document's one image and the Meta-Content chunk made of it, offline."""
    from vision_rag_pipeline.core.config import RagConfig
    from vision_rag_pipeline.documents.loader import load_document
    from vision_rag_pipeline.enrichment.classifier import classify_images
    from vision_rag_pipeline.enrichment.fusion import fuse_by_rule
    from vision_rag_pipeline.enrichment.languages import read_image
    from vision_rag_pipeline.enrichment.preprocess import load_image

    (image,) = load_document(path, source_path=str(path)).images
    (verdict,) = classify_images([image], RagConfig().media_enrichment.features.classifier)
    assert image.is_page_image and verdict.verdict == "VISION"
    reading = read_image(load_image(image.data, image.mime), ["eng"], picture=not image.is_page_image)
    return reading, fuse_by_rule(image, verdict.tags, reading, path.name, 8).meta_content


def test_a_small_ruled_table_rendered_up_is_read_row_by_row(tmp_path: Path) -> None:
    """Upscaled, the table's rows sit a line apart in soft type: each block of the background window
    is half ink, and a mean of it took grey for the paper, burying the rows in grey blotches that
    Tesseract read as "(sta)itables:mean-(std) ESS) 800 reas"."""
    reading, chunk = _read_as_ingest_does(scanned_table_pdf(tmp_path / "table.pdf"))
    assert reading.level == "High"
    assert "Chipper 20,843 260.57 (145.80) 96.20 (57.53)" in reading.text.splitlines()
    assert "[Type]: Table" in chunk and "Chipper 20,843" in chunk


@pytest.mark.skipif(not CORPUS.exists(), reason="the shared corpus is not here")
def test_the_corpus_table_scan_reads_every_row() -> None:
    reading, chunk = _read_as_ingest_does(CORPUS / "pdf" / "unstructured_single_table.pdf")
    assert reading.level == "High"
    assert "Chipper 20,843 260.57 (145.80) 96.20 (57.53)" in reading.text.splitlines()
    assert "[Type]: Table" in chunk


@pytest.mark.parametrize("turn", [90, 180, 270])
def test_a_table_page_turned_any_way_is_set_upright_before_it_is_read(tmp_path: Path, turn: int) -> None:
    """Upside down, the table's first read is sure of no word and the page is over a megapixel, so
    no later read turns it (the upside-down read needs a sure word): Tesseract's orientation
    detection on the ink page tells the turn, and the page turned back is prepared and read anew."""
    from vision_rag_pipeline.documents.loader import load_document
    from vision_rag_pipeline.enrichment.preprocess import load_image

    (image,) = load_document(scanned_table_pdf(tmp_path / "table.pdf")).images
    turned = load_image(image.data, image.mime).rotate(turn, expand=True)
    assert "Chipper 20,843 260.57 (145.80) 96.20 (57.53)" in ocr_image(turned, ["eng"]).text.splitlines()


def test_an_upright_page_read_surely_is_not_asked_which_way_up_it_is(monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[int] = []
    monkeypatch.setattr(ocr, "text_turn", lambda page: asked.append(1) or 0)
    assert "revenue" in ocr_image(_text_image(), ["eng"]).text
    assert not asked


def test_a_wrong_orientation_guess_costs_a_read_not_the_reading(monkeypatch: pytest.MonkeyPatch) -> None:
    """The page turned the way orientation detection says replaces the first only when its read
    promises half as many characters again: an upright page told it is upside down stays upright."""
    monkeypatch.setattr(ocr, "ORIENTATION_CHECK_BELOW", 101.0)  # ask for every page
    monkeypatch.setattr(ocr, "text_turn", lambda page: 180)
    prepared, _ = ocr.read_upright(_text_image(), ["eng"])
    assert prepared.page.tobytes() == ocr.prepare_page(_text_image()).page.tobytes()
    assert {"quarterly", "revenue", "headcount"} <= _words(ocr.read_page(prepared, ["eng"]).text)


@pytest.mark.skipif(not ocr._has_osd(), reason="Tesseract's orientation model is not installed")
def test_a_host_without_the_orientation_model_has_another_fingerprint(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """It reads turned pages differently, so its readings must not pass for this host's."""
    upside_down = ocr.prepare_page(_text_image().resize((1600, 1200)).rotate(180)).page
    assert ocr.text_turn(upside_down) == 180
    with_model = ocr.traineddata_sha256(("eng",))
    monkeypatch.setattr(ocr, "_has_osd", lambda: False)
    ocr.traineddata_sha256.cache_clear()
    try:
        assert ocr.traineddata_sha256(("eng",)) != with_model
        assert ocr.text_turn(upside_down) == 0
    finally:
        ocr.traineddata_sha256.cache_clear()
