"""The evaluation-set generator (bench/evalset.py): documents a browser or PDF reader would accept,
facts exactly where the ground truth says they are, and the same bytes for the same seed."""

from __future__ import annotations

import email
import io
import json
from pathlib import Path

import pypdfium2 as pdfium
import pytest
from bs4 import BeautifulSoup
from PIL import Image

from vision_rag_pipeline_tests.conftest import bench_module

evalset = bench_module("evalset")
eval_retrieval = bench_module("eval_retrieval")


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("evalset")
    evalset.generate(out, docs=6, seed=11)
    return out


def _manifest(out: Path) -> dict:
    return json.loads((out / "manifest.json").read_text())


def _questions(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "questions.jsonl").read_text().splitlines()]


def _visible_text(path: Path) -> str:
    """What a text-only loader sees: the HTML's text, or the PDF's text layer."""
    if path.suffix == ".pdf":
        pdf = pdfium.PdfDocument(str(path))
        return " ".join(pdf[i].get_textpage().get_text_range() for i in range(len(pdf)))
    archive = email.message_from_bytes(path.read_bytes())
    page = next(part for part in archive.walk() if part.get_content_type() == "text/html")
    return BeautifulSoup(page.get_payload(decode=True), "lxml").get_text(" ")


def test_same_seed_writes_identical_files_and_another_seed_differs(generated: Path, tmp_path: Path) -> None:
    evalset.generate(tmp_path / "again", docs=6, seed=11)
    evalset.generate(tmp_path / "other", docs=6, seed=12)
    first = sorted(p.relative_to(generated) for p in generated.rglob("*") if p.is_file())
    assert first == sorted(
        p.relative_to(tmp_path / "again") for p in (tmp_path / "again").rglob("*") if p.is_file()
    )
    for relative in first:
        assert (generated / relative).read_bytes() == (tmp_path / "again" / relative).read_bytes(), relative
    assert (tmp_path / "other" / "questions.jsonl").read_text() != (generated / "questions.jsonl").read_text()


def test_mhtml_is_a_blink_save_whose_images_all_resolve(generated: Path) -> None:
    mhtml_docs = [d for d in _manifest(generated)["documents"] if d["format"] == "mhtml"]
    assert mhtml_docs
    for doc in mhtml_docs:
        raw = (generated / "docs" / doc["file"]).read_bytes()
        archive = email.message_from_bytes(raw)
        assert archive["From"] == "<Saved by Blink>"
        assert archive["Snapshot-Content-Location"].startswith("https://")
        assert archive["Subject"] == doc["title"]
        assert archive.get_content_type() == "multipart/related"
        page, *resources = archive.get_payload()
        assert page["Content-Transfer-Encoding"] == "quoted-printable"
        parts = {part["Content-Location"]: part for part in resources}
        soup = BeautifulSoup(page.get_payload(decode=True), "lxml")
        sources = [img["src"] for img in soup.find_all("img")]
        assert set(sources) == set(parts), "every <img> has its part and every part is used"
        for part in parts.values():
            assert part["Content-Transfer-Encoding"] == "base64"
            Image.open(io.BytesIO(part.get_payload(decode=True))).verify()
        icon = next(image for image in doc["images"] if image["kind"] == "icon")
        assert sources.count(icon["url"]) == icon["occurrences"] >= 3


def test_pdf_opens_with_images_and_an_image_only_scanned_page(generated: Path) -> None:
    pdf_docs = [d for d in _manifest(generated)["documents"] if d["format"] == "pdf"]
    assert pdf_docs
    for doc in pdf_docs:
        pdf = pdfium.PdfDocument(str(generated / "docs" / doc["file"]))
        image_objects = sum(
            1
            for i in range(len(pdf))
            for obj in pdf[i].get_objects()
            if obj.type == pdfium.raw.FPDF_PAGEOBJ_IMAGE
        )
        placements = sum(len(image["placements"]) for image in doc["images"])
        assert image_objects == placements
        for image in doc["images"]:
            if image["kind"] == "scan":
                (placement,) = image["placements"]
                scanned = pdf[placement["page"] - 1]
                assert scanned.get_textpage().get_text_range().strip() == ""
                assert placement["bbox"] == [0, 0, scanned.get_width(), scanned.get_height()]


def test_image_facts_only_in_images_and_text_facts_in_the_text(generated: Path) -> None:
    questions = _questions(generated)
    by_document: dict[str, list[dict]] = {}
    for question in questions:
        by_document.setdefault(question["document"], []).append(question)
    for document, rows in by_document.items():
        text = _visible_text(generated / "docs" / document)
        for row in rows:
            found = eval_retrieval.contains_fact(text, row["fact"])
            assert found == (row["kind"] == "text"), (document, row["kind"], row["fact"])


def test_questions_paraphrase_with_unique_facts_and_point_at_existing_documents(generated: Path) -> None:
    questions = _questions(generated)
    manifest = _manifest(generated)
    files = {doc["file"] for doc in manifest["documents"]}
    assert {q["kind"] for q in questions} == {"image", "text"}
    facts = [q["fact"] for q in questions]
    assert len(facts) == len(set(facts)), "a fact string identifies one place in the set"
    for question in questions:
        assert question["document"] in files
        assert (generated / "docs" / question["document"]).is_file()
        assert question["fact"] not in question["question"]
        assert question["company"] in question["question"]
        if question["kind"] == "image":
            assert question["image_kind"] in evalset.CONTENT_KINDS
            assert question["degradation"] in evalset.DEGRADATIONS


def test_manifest_marks_decoration_ignore_and_content_vision_with_hard_negatives(generated: Path) -> None:
    manifest = _manifest(generated)
    kinds = set()
    for doc in manifest["documents"]:
        for image in doc["images"]:
            kinds.add(image["kind"])
            if image["kind"] in evalset.DECORATION_KINDS:
                assert image["verdict"] == "IGNORE" and not image["facts"]
            else:
                assert image["verdict"] == "VISION" and image["facts"]
    assert set(evalset.DECORATION_KINDS) <= kinds
    quarters_per_company: dict[str, set[int]] = {}
    for doc in manifest["documents"]:
        quarters_per_company.setdefault(doc["company"], set()).add(doc["quarter"])
    assert max(len(quarters) for quarters in quarters_per_company.values()) == 4


def test_a_modest_set_covers_every_kind_and_degradation_without_repeating_a_question() -> None:
    specs = evalset.build_specs(24, seed=3)
    content = [image for doc in specs for image in doc.images if image.verdict == "VISION"]
    assert {image.kind for image in content} == set(evalset.CONTENT_KINDS)
    assert {image.degradation for image in content} == set(evalset.DEGRADATIONS)
    questions = [row["question"] for doc in specs for row in evalset.questions_for(doc)]
    assert len(questions) == len(set(questions)), "the same question must not have two answers"


@pytest.mark.parametrize(
    ("text", "fact", "expected"),
    [
        ("Churn rate 3.2%", "3.2%", True),
        ("Churn rate 13.2%", "3.2%", False),
        ("ARR $48.7M in Q3", "48.7", True),
        ("ARR 48.75 in Q3", "48.7", False),
        ("Active users 12, 418", "12,418", True),
        ("ACTIVE USERS\n12,418.", "12,418", True),
        ("Active users 112,418", "12,418", False),
    ],
)
def test_a_fact_matches_only_as_a_whole_number(text: str, fact: str, expected: bool) -> None:
    assert eval_retrieval.contains_fact(text, fact) is expected
