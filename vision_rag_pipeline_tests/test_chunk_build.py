"""Image chunks: the Meta-Content chunk plus short excerpts that each carry one row or one chart."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from vision_rag_pipeline.chunks.build import IMAGE_EXCERPT_CHARS, _continues, _line_groups, build_chunks
from vision_rag_pipeline.core.config import LoaderConfig, SplitterConfig
from vision_rag_pipeline.documents.model import DocumentImage, Element, LoadedDocument, Location
from vision_rag_pipeline.enrichment.fusion import fuse_by_rule
from vision_rag_pipeline.enrichment.model import EnrichmentResult, ImageVerdict, OcrResult, OcrWord
from vision_rag_pipeline.images.model import ExtractedImage
from vision_rag_pipeline.indexes.lexical import LexicalDoc
from vision_rag_pipeline.indexes.tantivy_index import open_tantivy_index

KPI_TABLE_OCR = """KPI summary, Q3 2023
Metric Actual Target Status
Support tickets 33,773 29,004 Watch
Inventory turnover 6.5x 5.6x On track
Churn rate 4.4% 3.7% Ahead"""

BAR_CHART_OCR = """Revenue by region, Q4 2024 ($M)
100
86.8
74.6
East West Central South"""


def _document(
    ocr_texts: list[str],
) -> tuple[LoadedDocument, list[ExtractedImage], dict[str, EnrichmentResult]]:
    doc = LoadedDocument(
        source_path="/reports/tidewell_q3.mhtml",
        mime="multipart/related",
        title="Tidewell Software Quarterly Report, Q3 2023",
        elements=[
            Element(
                kind="text",
                text="This report summarises the quarter.",
                location=Location(char_span=(0, 35)),
            )
        ],
    )
    images, enrichments = [], {}
    for index, text in enumerate(ocr_texts):
        sha = f"{index:064d}"
        images.append(
            ExtractedImage(
                url=f"cid:image{index}",
                name=f"image{index}.png",
                mime="image/png",
                caption="Key performance indicators against target.",
                sha256=sha,
                size=100,
            )
        )
        enrichments[sha] = EnrichmentResult(
            image_sha256=sha,
            image_url=f"cid:image{index}",
            meta_content="<meta>...</meta>",
            description="KPI table",
            image_type="Table",
            ocr=OcrResult(text=text, confidence=90, level="High"),
        )
    return doc, images, enrichments


def _excerpts(ocr_texts: list[str]) -> list[str]:
    doc, images, enrichments = _document(ocr_texts)
    chunks = build_chunks("doc", doc, images, enrichments, [], LoaderConfig(), SplitterConfig())
    return [c.text for c in chunks if c.kind == "image" and "image_excerpt" in c.metadata]


def test_image_chunks_and_their_excerpts_carry_the_pictures_perceptual_hash() -> None:
    doc, images, enrichments = _document([KPI_TABLE_OCR, KPI_TABLE_OCR.replace("KPI", "Staff")])
    verdicts = [  # the second picture could not be rasterized (an SVG): no hash
        ImageVerdict(image_sha256=images[0].sha256, verdict="VISION", perceptual_hash="00ff00ff00ff00ff"),
        ImageVerdict(image_sha256=images[1].sha256, verdict="VISION"),
    ]
    chunks = build_chunks("doc", doc, images, enrichments, verdicts, LoaderConfig(), SplitterConfig())
    hashes: dict[str, set] = {}
    for chunk in chunks:
        if chunk.kind == "image":
            hashes.setdefault(chunk.metadata["image_sha256"], set()).add(chunk.metadata["perceptual_hash"])
    assert hashes == {images[0].sha256: {"00ff00ff00ff00ff"}, images[1].sha256: {None}}


def test_each_table_row_is_its_own_excerpt_under_the_document_caption_and_table_title() -> None:
    excerpts = _excerpts([KPI_TABLE_OCR])
    heading = (
        "Tidewell Software Quarterly Report, Q3 2023 — Key performance indicators against target. — "
        "KPI summary, Q3 2023: "
    )
    assert heading + "Support tickets 33,773 29,004 Watch" in excerpts
    assert heading + "Churn rate 4.4% 3.7% Ahead" in excerpts
    assert all(text.startswith(heading) for text in excerpts)


def test_a_charts_labels_and_values_stay_together_in_one_excerpt() -> None:
    excerpts = _excerpts([BAR_CHART_OCR])
    assert len(excerpts) == 1
    assert excerpts[0].endswith(
        "Revenue by region, Q4 2024 ($M): 100 · 86.8 · 74.6 · East West Central South"
    )


def test_a_charts_rows_follow_its_lines_in_its_excerpts() -> None:
    """Each value beside its label, under the chart's heading: a question about one bar meets it."""
    doc, images, enrichments = _document([BAR_CHART_OCR])
    words = [
        OcrWord(text=text, conf=95.0, left=left, top=top, width=40, height=20)
        for left, top, text in [(60, 100, "100"), (60, 200, "50"), (60, 300, "0")]
        + [(180 + 200 * i, 400, name) for i, name in enumerate(["East", "West", "Central"])]
        + [(180 + 200 * i, 150 + 40 * i, value) for i, value in enumerate(["86.8", "74.6", "61.3"])]
    ]
    result = next(iter(enrichments.values()))
    enrichments[result.image_sha256] = result.model_copy(
        update={"image_type": "Chart", "ocr": result.ocr.model_copy(update={"words": words})}
    )
    chunks = build_chunks("doc", doc, images, enrichments, [], LoaderConfig(), SplitterConfig())
    excerpts = [c.text for c in chunks if "image_excerpt" in c.metadata]
    assert excerpts[-1].endswith("East West Central South · East: 86.8 · West: 74.6 · Central: 61.3")
    (image_chunk,) = [c for c in chunks if c.kind == "image" and "image_excerpt" not in c.metadata]
    assert image_chunk.metadata["chart_rows"] == [
        "East: 86.8",
        "West: 74.6",
        "Central: 61.3",
    ]  # data, not text


_LINE = st.text(alphabet="abcdefghij ,.%0123456789", min_size=1, max_size=60).filter(lambda s: s.strip())


@given(st.lists(_LINE, max_size=30))
def test_every_line_lands_in_a_group_in_order_and_groups_stay_short(lines: list[str]) -> None:
    groups = _line_groups("\n".join(lines), IMAGE_EXCERPT_CHARS)
    kept = [line.strip() for line in lines if line.strip()]
    read: list[str] = []
    for group in groups:
        parts = group.split(" · ")
        # only a wrapped sentence's line before a cut is repeated, first in the next group
        if read and len(parts) > 1 and parts[0] == read[-1] and _continues(parts[0], parts[1]):
            parts = parts[1:]
        read += parts
        assert len(group) <= IMAGE_EXCERPT_CHARS or group in kept
    assert read == kept


def test_an_amount_that_wraps_onto_the_next_line_stays_with_its_sentence() -> None:
    scan = (
        "The board approved a share buyback programme of up to\n"
        "$148.7 million over the next two years.\n"
        "Headcount reached 1,204 at the end of the quarter."
    )
    assert _line_groups(scan, IMAGE_EXCERPT_CHARS) == [
        "The board approved a share buyback programme of up to · $148.7 million over the next two years.",
        "Headcount reached 1,204 at the end of the quarter.",
    ]


def test_a_sentence_the_length_limit_cuts_keeps_its_head_with_its_amount() -> None:
    memo = (
        "share, payable to shareholders of record at the end of the following\n"
        "month.\n"
        "The Board further authorised a share buyback programme of up to\n"
        "$70.8 million, to be executed over the next twelve months at\n"
        "management's discretion."
    )
    groups = _line_groups(memo, IMAGE_EXCERPT_CHARS)
    assert (
        "The Board further authorised a share buyback programme of up to · "
        "$70.8 million, to be executed over the next twelve months at · management's discretion."
    ) in groups


def test_a_chunk_is_cited_on_the_page_holding_most_of_its_text() -> None:
    """A chunk that opens with the previous page's footer is about the next page (real reports put
    answers on the page before theirs otherwise)."""
    footer = "www.example.org"
    body = "Methodology: of the 1,004 interviews, 35 were conducted in Spanish. " * 5
    doc = LoadedDocument(
        source_path="/reports/survey.pdf",
        mime="application/pdf",
        elements=[
            Element(kind="text", text=footer, location=Location(page=19, bbox=(72, 750, 200, 760))),
            Element(kind="text", text=body, location=Location(page=20, bbox=(72, 80, 540, 300))),
        ],
        pages=20,
    )

    chunks = build_chunks("doc", doc, [], {}, [], LoaderConfig(), SplitterConfig())
    [chunk] = [c for c in chunks if c.kind == "text"]

    assert chunk.page == 20 and chunk.bbox == (72, 80, 540, 300)
    assert chunk.metadata["pages"] == [19, 20], "every page it touches is still listed"
    # each page is also a retrieval unit of its own, holding its whole text
    assert [(c.page, c.text) for c in chunks if c.kind == "page"] == [(19, footer), (20, body.strip())]


def test_an_untitled_scan_is_titled_by_its_first_line_and_its_excerpts_carry_it() -> None:
    memo = "Northwind: internal memo, Q2 2024\nMarket share 19.6 %\nHeadcount 7,722"
    doc, images, enrichments = _document([memo])
    doc.title = ""
    doc.images = [
        DocumentImage(url="memo.pdf#page=1", name="p1.png", mime="image/png", data=b"", is_page_image=True)
    ]
    doc.elements = [Element(kind="image", image_index=0, location=Location(page=1))]

    chunks = build_chunks("doc", doc, images, enrichments, [], LoaderConfig(), SplitterConfig())

    assert {c.metadata["title"] for c in chunks} == {"Northwind: internal memo, Q2 2024"}
    excerpts = [c.text for c in chunks if "image_excerpt" in c.metadata]
    assert excerpts and all(t.count("Northwind: internal memo") == 1 for t in excerpts), "said once"


@pytest.mark.parametrize(
    "level,page_image,indexed", [("Low", False, False), ("Medium", False, True), ("Low", True, True)]
)
def test_a_low_confidence_photo_adds_no_ocr_words_to_the_index(
    tmp_path: Path, level: str, page_image: bool, indexed: bool
) -> None:
    """Photo texture read as letters stays out of the chunks and the lexical index; the photo is still
    found by what the page says about it. The same reading at Medium confidence is indexed, and so is
    a Low reading of a page image (a page without a text layer: its reading is all the text there)."""
    photo = DocumentImage(
        url="cid:harbour",
        name="harbour.jpg",
        mime="image/jpeg",
        data=b"\xff\xd8 not decoded here",
        alt="Container harbour at dawn",
        caption="The new northern terminal",
        context="Cranes at the northern terminal unload the first ships.",
        is_page_image=page_image,
    )
    noise = ["Ssss", "eeae", "Seees", "4815"]
    words = [
        OcrWord(text=w, conf=41.0, left=30 * i, top=10, width=25, height=12) for i, w in enumerate(noise)
    ]
    reading = OcrResult(
        text=f"{noise[0]} {noise[1]}\n{noise[2]} {noise[3]}", confidence=41.0, level=level, words=words
    )
    fused = fuse_by_rule(photo, ["photo"], reading, "report.pdf/harbour.jpg", 12)
    sha = "a" * 64
    enrichment = EnrichmentResult(
        image_sha256=sha,
        image_url=photo.url,
        meta_content=fused.meta_content,
        description=fused.description,
        image_type=fused.image_type,
        keywords=fused.keywords,
        ocr=reading,
    )
    doc = LoadedDocument(
        source_path="/reports/harbour.pdf",
        mime="application/pdf",
        title="Port annual review",
        elements=[Element(kind="image", image_index=0, location=Location(page=1))],
        images=[photo],
    )
    image = ExtractedImage.of(photo).model_copy(update={"sha256": sha})
    chunks = build_chunks("doc", doc, [image], {sha: enrichment}, [], LoaderConfig(), SplitterConfig())
    index = open_tantivy_index(tmp_path / "lexical")
    index.replace_document("doc", [LexicalDoc.of(chunk) for chunk in chunks])

    found = {word: bool(index.search(word, 5)) for word in noise}
    assert found == dict.fromkeys(noise, indexed)
    assert any(word in " ".join(fused.keywords) for word in noise) == indexed
    for words_on_the_page in ("container harbour", "northern terminal", "cranes unload"):
        assert index.search(words_on_the_page, 5), words_on_the_page
