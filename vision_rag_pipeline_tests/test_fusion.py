"""Meta-Content format, OCR cleaning, type inference, keywords and rule fusion."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from vision_rag_pipeline.documents.model import DocumentImage
from vision_rag_pipeline.enrichment.fusion import (
    DESCRIPTION_MAX_CHARS,
    clean_ocr_text,
    extract_keywords,
    fuse_by_rule,
    infer_image_type,
)
from vision_rag_pipeline.enrichment.model import CHART_DATA_HEADING, CONTEXT_LABEL, MetaContent, OcrResult


def _image(**fields: str) -> DocumentImage:
    return DocumentImage(
        url="https://example.com/img/chart.png", name="chart.png", mime="image/png", data=b"x", **fields
    )


def test_meta_content_renders_the_design_format_exactly() -> None:
    text = MetaContent(
        source="report.mhtml/chart.png",
        image_type="Chart",
        ocr_confidence="High",
        keywords=["revenue", "Q3"],
        content="A bar chart.\nText in image:\nRevenue",
    ).render()
    assert text == (
        "<meta>\n"
        "[Source]: report.mhtml/chart.png\n"
        "[Type]: Chart\n"
        "[OCR_Confidence]: High\n"
        "[Keywords]: revenue, Q3\n"
        "</meta>\n"
        "<content>\n"
        "A bar chart.\nText in image:\nRevenue\n"
        "</content>"
    )


def _one_line(text: str) -> str:
    return " ".join(text.split())


@given(
    source=st.text(),
    image_type=st.text(),
    level=st.sampled_from(["High", "Medium", "Low"]),
    keywords=st.lists(st.text()),
    content=st.text(),
)
def test_meta_content_parses_back_what_it_renders(
    source: str, image_type: str, level: str, keywords: list[str], content: str
) -> None:
    text = MetaContent(
        source=source, image_type=image_type, ocr_confidence=level, keywords=keywords, content=content
    ).render()
    parsed = MetaContent.parse(text)
    expected_keywords = [_one_line(k.replace(",", " ")) for k in keywords]
    assert parsed == MetaContent(
        source=_one_line(source),
        image_type=_one_line(image_type),
        ocr_confidence=level,
        keywords=[k for k in expected_keywords if k],
        content=content.strip(),
    )
    assert parsed.render() == text  # rendering what was parsed gives the same chunk back


def test_parsing_other_text_is_an_error() -> None:
    with pytest.raises(ValueError, match="not a Meta-Content chunk"):
        MetaContent.parse("just some text")


_ROW = st.from_regex(r"[A-Za-z][A-Za-z ]{0,12}: [0-9]{1,3}(\.[0-9])?", fullmatch=True)
_LINE = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9 .,%]{0,30}", fullmatch=True)


@given(before=st.lists(_LINE, max_size=4), rows=st.lists(_ROW, min_size=1, max_size=6), context=_LINE)
def test_layout_finds_every_chart_row_and_leaves_the_page_context_out(
    before: list[str], rows: list[str], context: str
) -> None:
    meta = MetaContent(
        source="r.pdf/p3.png",
        image_type="Chart",
        content="\n".join(["Chart.", *before, CHART_DATA_HEADING, *rows, CONTEXT_LABEL + context]),
    )
    text = meta.render()
    layout = MetaContent.layout(text)
    assert layout is not None
    assert [text[a:b] for a, b in layout.chart_rows] == rows
    assert text[slice(*layout.chart_heading)] == CHART_DATA_HEADING
    body = text[slice(*layout.body)]
    assert body.startswith("Chart.") and CONTEXT_LABEL not in body and "<meta>" not in body


def test_a_plain_text_chunk_has_no_meta_content_layout() -> None:
    assert MetaContent.layout("Revenue rose.\nValues by label:\nNorth: 4") is None


def test_clean_ocr_text_drops_garbage_lines_and_grid_symbols() -> None:
    raw = "Quarterly Revenue | 2024\n|| — ~~ ..\ni l ' ,\n  North   42%  \n7\n=|=|=|=|="
    assert clean_ocr_text(raw) == "Quarterly Revenue 2024\nNorth 42%\n7"


def test_clean_ocr_text_keeps_chinese() -> None:
    assert clean_ocr_text("营业收入 增长 12%\n| |") == "营业收入 增长 12%"


@pytest.mark.parametrize(
    ("tags", "ocr", "hints", "expected"),
    [
        (["chart"], "", "", "Chart"),
        ([], "", "Screenshot of the login page", "Screenshot"),
        ([], "Region Q1 Q2 Q3\nNorth 12 14 15\nSouth 10 11 13\nEast 9 8 12\nWest 7 9 10", "", "Table"),
        ([], "Sales by region\n100\n80\n60\n40\n20\nNorth South East West", "", "Chart"),
        ([], "Our strategy\n• Grow revenue\n• Cut cost\n• Hire", "", "Slide"),
        ([], "File Edit View Help\nSearch settings", "", "Screenshot"),
        ([], "Client -> Gateway -> Service", "", "Diagram"),
        ([], "A long paragraph of scanned prose with no numbers at all", "", "Image"),
    ],
)
def test_infer_image_type(tags: list[str], ocr: str, hints: str, expected: str) -> None:
    assert infer_image_type(tags, ocr, hints) == expected


def test_keywords_put_alt_words_first_drop_stop_words_and_respect_the_limit() -> None:
    ocr = "Revenue revenue revenue by the region\nNorth South EBITDA margin"
    keywords = extract_keywords(ocr, ["Quarterly sales of the company"], max_keywords=5)
    assert keywords[:3] == ["Quarterly", "sales", "company"]
    assert keywords[3] == "Revenue"  # the most frequent OCR word
    assert len(keywords) == 5
    assert not {"the", "of", "by"} & {k.lower() for k in keywords}


def test_rule_fusion_carries_every_ocr_word_alt_text_and_context() -> None:
    image = _image(alt="Revenue by region", context="Figure 3 shows how the northern region grew.")
    ocr = OcrResult(text="North 42\nSouth 37\nEast 55\nWest 18\n|||", confidence=91, level="High")
    fused = fuse_by_rule(image, ["chart"], ocr, "q3-report.mhtml/chart.png", max_keywords=8)
    parsed = MetaContent.parse(fused.meta_content)
    assert parsed.source == "q3-report.mhtml/chart.png"
    assert parsed.image_type == "Chart"
    assert parsed.ocr_confidence == "High"
    for word in ("North 42", "South 37", "East 55", "West 18", "Revenue by region", "northern region grew"):
        assert word in parsed.content
    assert "Text in image:" in parsed.content
    assert fused.fusion == "rule"
    assert fused.description == "Revenue by region"


def test_description_without_alt_is_type_and_first_words_on_one_short_line() -> None:
    ocr = OcrResult(text=("Operating margin improved " * 30).strip(), confidence=70, level="Medium")
    fused = fuse_by_rule(_image(), [], ocr, "doc/chart.png", max_keywords=5)
    assert fused.description.startswith("Chart: Operating margin improved")  # "chart" is in the file name
    assert len(fused.description) <= DESCRIPTION_MAX_CHARS
    assert "\n" not in fused.description
