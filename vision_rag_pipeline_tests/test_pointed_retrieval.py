"""Questions that point into a document or name a report of a series find it, through the real asset
graph: a report series whose quarters share one template, and a PDF whose pages print numbers that
are not their index in the file."""

from __future__ import annotations

import json
from pathlib import Path

import dagster as dg
import pytest

from vision_rag_pipeline.defs.definitions import ALL_ASSETS, defs
from vision_rag_pipeline.defs.partitions import documents_partitions
from vision_rag_pipeline.documents.registry import DocumentRegistry
from vision_rag_pipeline.query import search
from vision_rag_pipeline_tests.conftest import bench_module

# Its questions are asked of the whole index: its own, holding this series alone (fixture in conftest).
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("own_index")]


def _ingest(instance: dg.DagsterInstance, path: Path) -> str:
    document_id = DocumentRegistry().register(path).document_id
    instance.add_dynamic_partitions(documents_partitions.name, [document_id])
    result = dg.materialize(
        ALL_ASSETS, partition_key=document_id, instance=instance, resources=defs.resources
    )
    assert result.success
    return document_id


@pytest.fixture(scope="module")
def instance(pg_url: str):
    with dg.instance_for_test() as instance:
        yield instance


@pytest.fixture(scope="module")
def series(instance: dg.DagsterInstance, tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    """One company's four quarterly reports on one template (bench/evalset_series.py), ingested."""
    folder = tmp_path_factory.mktemp("series")
    bench_module("evalset_series").generate(folder, companies=1, seed=3)
    for path in sorted((folder / "docs").iterdir()):
        _ingest(instance, path)
    return [json.loads(line) for line in (folder / "questions.jsonl").read_text().splitlines()]


def _answer(question: dict) -> tuple[bool, int | None]:
    """Whether the first hit is from the report the question names, and the rank of the first hit
    of that report holding the fact."""
    hits = search(text=question["question"], k=5)
    first = bool(hits) and Path(hits[0].document).name == question["document"]
    for rank, hit in enumerate(hits, start=1):
        if Path(hit.document).name == question["document"] and question["fact"] in " ".join(hit.text.split()):
            return first, rank
    return first, None


@pytest.mark.parametrize("kind", ["text", "image"])
def test_a_question_naming_quarter_and_site_finds_that_report_of_the_series(
    series: list[dict], kind: str
) -> None:
    """The same sentences and charts stand in all four reports; only the report's quarter, written as
    the question writes it or not ("Q3 2024", "the third quarter of 2024", "3Q24"), tells them apart."""
    asked = [q for q in series if q["kind"] == kind]
    answers = [_answer(q) for q in asked]
    assert sum(first for first, _ in answers) >= 0.95 * len(asked)
    # a body fact's section does not repeat its report's quarter, which the report's opening and the
    # captions of its charts do: the period is the report's, not the passage's
    found = 1.0 if kind == "text" else 0.85
    assert sum(rank is not None for _, rank in answers) >= found * len(asked), [
        (rank, q["question"]) for (_, rank), q in zip(answers, asked, strict=True) if rank is None
    ]


def _numbered_pdf(path: Path) -> None:
    """Nine pages: a cover and two pages of front matter, then pages printed 1 to 6 in their footers;
    printed page 4 holds a map captioned "Figure 2"; the last page holds the contacts."""
    writer = bench_module("evalset").PdfWriter()
    bodies = {
        1: "Annual field survey of the river districts",
        2: "Foreword by the survey team",
        3: "Contents and reading guide",
        7: "Figure 2: District map\nKailali district is shaded in teal, Bardiya in orange.",
        9: "Contacts: the survey office answers questions by email.",
    }
    for index in range(1, 10):
        writer.new_page()
        gauge = ("Alder", "Birch", "Cedar", "Dogwood", "Elm", "Fir", "Gum", "Hazel", "Ivy")[index - 1]
        writer.text(
            72, 90, bodies.get(index, f"The {gauge} gauge read {index * 3.7:.1f} m at the spring flood.")
        )
        if index > 3:
            writer.text(300, 760, str(index - 3), 9)  # the printed page number
    path.write_bytes(writer.to_bytes("River district survey", "20240101000000Z"))


def test_a_page_named_by_its_printed_number_the_cover_and_a_figure_are_found(
    instance: dg.DagsterInstance, tmp_path: Path
) -> None:
    path = tmp_path / "river_survey.pdf"
    _numbered_pdf(path)
    document = _ingest(instance, path)

    def first_page(question: str) -> int | None:
        hits = search(text=question, k=3, document_ids=[document])
        return hits[0].page if hits else None

    assert first_page("What colour is used for the district on page 4?") == 7  # printed 4, seventh sheet
    assert first_page("What does Figure 2 show?") == 7
    assert first_page("What is written on the cover?") == 1
    assert first_page("Whom does the last page say to contact?") == 9
