"""What a question can point at: printed page numbers, captions, periods, and the question's own
pointers, read the same way on both sides."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vision_rag_pipeline.chunks.landmarks import attach_landmarks, document_header, page_units
from vision_rag_pipeline.chunks.model import Chunk
from vision_rag_pipeline.core.periods import period_fit, periods, without_periods
from vision_rag_pipeline.core.references import caption_reference, mentioned_references
from vision_rag_pipeline.documents.model import Element, LoadedDocument, Location, PageInfo
from vision_rag_pipeline.documents.page_numbers import edge_numbers, printed_page_numbers
from vision_rag_pipeline.query.analysis import analyze, page_names, positions

# --- printed page numbers ------------------------------------------------------------------------


@st.composite
def printed_documents(draw: st.DrawFn) -> tuple[list[list[int]], list[int], list[list[int]]]:
    """Pages whose margins print place + offset (or a spread of two), among other margin numbers."""
    pages = draw(st.integers(4, 40))
    offset = draw(st.integers(-6, 20))
    spread = draw(st.booleans())
    start = draw(st.integers(1, 30))
    places = list(range(start, start + pages))
    seed = draw(st.integers(0, 10_000))
    rng = random.Random(seed)
    candidates, expected = [], []
    for place in places:
        numbers = [2 * place + offset, 2 * place + offset + 1] if spread else [place + offset]
        numbers = [n for n in numbers if 0 < n < 1000]
        shown = numbers if rng.random() > 0.2 else []  # some pages print none (a full-page picture)
        noise = [rng.randrange(1, 999) for _ in range(rng.randrange(0, 2))]
        candidates.append(shown + noise)
        expected.append(sorted(set(shown)))
    return candidates, places, expected


@settings(max_examples=150, deadline=None)
@given(printed_documents())
def test_printed_page_numbers_are_found_among_other_margin_numbers(
    document: tuple[list[list[int]], list[int], list[list[int]]],
) -> None:
    candidates, places, expected = document
    found = printed_page_numbers(candidates, places)
    assert len(found) == len(places)
    # every number taken was on its page; where the progression is clear, each page gets its own
    for taken, offered in zip(found, candidates, strict=True):
        assert set(taken) <= set(offered)
    if sum(1 for numbers in expected if numbers) >= len(places) // 2 + 2:
        assert all(set(want) <= set(got) for want, got in zip(expected, found, strict=True))


@settings(max_examples=100, deadline=None)
@given(st.lists(st.lists(st.integers(1, 999), max_size=2), min_size=3, max_size=30), st.integers(0, 1000))
def test_numbers_that_follow_no_progression_are_no_page_numbers(noise: list[list[int]], seed: int) -> None:
    rng = random.Random(seed)
    # scattered numbers (issue numbers, counts) fit a progression on three pages almost never
    scattered = [[rng.randrange(100, 999)] for _ in noise]
    assert all(not numbers for numbers in printed_page_numbers(scattered, list(range(1, len(noise) + 1))))


def test_footers_and_headers_give_their_numbers_but_not_their_years() -> None:
    assert edge_numbers(["Issue 26 (2024-02-28) Copyright © Huawei Technologies Co., Ltd. 8"]) == [8]
    assert edge_numbers(["Alibaba Cloud | Introducing Alibaba Cloud 17"]) == [17]
    assert edge_numbers(["4 Graduate Studies & Professional Learning 5"]) == [4, 5]
    assert edge_numbers(["Page 3 of 10"]) == [3, 10]
    assert edge_numbers(["© 2024 Example Corp.", "Annual report 2023", "version 2.1"]) == []


# --- references and periods ----------------------------------------------------------------------


def test_a_caption_is_told_from_a_mention() -> None:
    assert caption_reference("Figure 3: Revenue by region") == "figure 3"
    assert caption_reference("FIG. 2b Levels") == "figure 2b"
    assert caption_reference("Table 2-1 Compared items") == "table 2-1"
    assert caption_reference("Table 4") == "table 4"
    assert caption_reference("Figure 3 shows that revenue rose") is None
    assert caption_reference("As Figure 3 shows, revenue rose") is None
    assert mentioned_references("Compare Fig. 3 with Table 2-1 and figure 3.") == ["figure 3", "table 2-1"]


QUARTER_PHRASES = ("Q{q} {y}", "Q{q}-{yy}", "Q{q}'{yy}", "{q}Q{yy}", "{y} Q{q}", "the {o} quarter of {y}")


@given(st.integers(1990, 2039), st.integers(1, 4), st.sampled_from(QUARTER_PHRASES))
def test_every_way_of_writing_a_quarter_is_the_same_period(year: int, quarter: int, phrase: str) -> None:
    ordinal = ("first", "second", "third", "fourth")[quarter - 1]
    text = "Revenue in " + phrase.format(q=quarter, y=year, yy=f"{year % 100:02d}", o=ordinal) + " rose."
    if "{yy}" in phrase and not 2000 <= year <= 2099:
        return  # a two-digit year is read as 20xx
    assert periods(text)[:2] == [f"{year}-Q{quarter}", str(year)]


@given(st.integers(2000, 2039), st.integers(1, 4), st.sampled_from(QUARTER_PHRASES))
def test_a_question_without_its_periods_keeps_every_other_word(year: int, quarter: int, phrase: str) -> None:
    ordinal = ("first", "second", "third", "fourth")[quarter - 1]
    named = phrase.format(q=quarter, y=year, yy=f"{year % 100:02d}", o=ordinal).removeprefix("the ")
    question = f"Who led the {named} safety audit at the Gdansk site?"
    assert without_periods(question) == "Who led the safety audit at the Gdansk site?"


def test_fiscal_years_halves_and_months_are_periods_and_amounts_are_not() -> None:
    assert periods("FY2021 and fiscal 2015") == ["2021", "2015"]
    assert periods("FY 21") == ["2021"]
    assert periods("H1 2023, the second half of 2024") == ["2023-H1", "2023", "2024-H2", "2024"]
    assert periods("as of March 3, 2025") == ["2025-03", "2025"]
    assert periods("revenue of $2021 million, 2019.5 tonnes, 2020% growth") == []


def test_a_report_of_another_quarter_is_told_from_one_that_cannot_tell() -> None:
    asked = periods("Who led the Q1 2025 audit?")
    assert period_fit(asked, ["2025-Q1", "2025"]) == 1
    assert period_fit(asked, ["2025-Q2", "2025"]) == -1
    assert period_fit(asked, ["2025"]) == 1  # a yearly document covers the quarter
    assert period_fit(periods("in February 2025"), ["2025-Q1", "2025"]) == 1  # the month's quarter
    assert period_fit(periods("in February 2025"), ["2025-Q2", "2025"]) == -1
    assert period_fit(periods("in FY2021"), ["2018"]) == -1
    assert period_fit([], ["2025-Q2"]) == 0


# --- what a question points at -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("question", "names"),
    [
        ("What is the color of Kailali in the map of Page 12?", ["12"]),
        ("How many cars appear on page three?", ["3"]),
        ("How many people appear on pages three and four?", ["3", "4"]),
        ("How many figures are in this paper from Page 3 to Page 6?", ["3", "4", "5", "6"]),
        ("How many colors are in the slide 14?", ["14"]),
        ("What date is at the beginning of page(1)?", ["1"]),
        ("See p. iv for the foreword", ["iv"]),
        ("How many pages does the report have?", []),
    ],
)
def test_pages_a_question_names(question: str, names: list[str]) -> None:
    assert page_names(question) == names


def test_places_in_a_document_a_question_names() -> None:
    assert positions("What color is the car on the cover?") == ["first"]
    assert positions("Is there a signature on the last page?") == ["last"]
    assert positions("In the figure at the second last page, who stands?") == ["second_last"]
    assert positions("What was the last quarter's revenue?") == []


def test_a_question_names_when_besides_its_topic() -> None:
    pointers = analyze("Who led the Q1 2025 safety audit at Glimmerfield Solar's Gdansk site?")
    assert pointers.periods == ["2025-Q1", "2025"]
    assert not pointers.points_into_document
    pointers = analyze("In Figure 5, what is the colour of the line in Table 2?")
    assert pointers.references == ["figure 5", "table 2"]
    assert pointers.points_into_document


# --- chunks record them ----------------------------------------------------------------------------


def _document() -> LoadedDocument:
    def text(page: int, body: str) -> Element:
        return Element(kind="text", text=body, location=Location(page=page, bbox=(0, 0, 10, 10)))

    return LoadedDocument(
        source_path="/reports/Acme_Q3_2024_review.pdf",
        mime="application/pdf",
        title="Acme Quarterly Review",
        elements=[
            text(1, "Acme Corp results for the third quarter of 2024"),
            text(2, "Figure 1: Revenue by region\nRevenue grew in every region."),
            text(3, "Table 2 Headcount\nSales 120"),
        ],
        pages=3,
        page_info=[PageInfo(number=1, label="i"), PageInfo(number=2, printed=["1"]), PageInfo(number=3)],
    )


def test_each_chunk_records_its_page_names_captions_and_its_documents_period() -> None:
    doc = _document()
    chunks = [
        Chunk(chunk_id=f"d:{i}", document_id="d", index=i, kind="text", text=e.text, page=e.location.page)
        for i, e in enumerate(doc.elements)
    ]
    attach_landmarks(chunks, doc)
    assert [c.landmarks.page_names for c in chunks] == [["i"], ["2", "1"], ["3"]]
    assert [c.landmarks.references for c in chunks] == [[], ["figure 1"], ["table 2"]]
    assert all(c.landmarks.periods == ["2024-Q3", "2024"] for c in chunks)  # from its file name and text
    assert all(c.landmarks.page_count == 3 for c in chunks)
    assert "Acme" in document_header(doc)


def test_a_page_unit_holds_its_pages_text_and_its_images_readings() -> None:
    doc = _document()
    doc.elements.append(Element(kind="image", location=Location(page=3), image_index=0))
    units = page_units("d", doc, {0: "Chart: headcount by team"})
    assert [unit.page for unit in units] == [1, 2, 3]
    assert all(unit.kind == "page" for unit in units)
    assert units[2].text == "Table 2 Headcount\nSales 120\n\nChart: headcount by team"
