"""Any bytes given to the MHTML and PDF loaders give a document or a DocumentError, never another
exception: hypothesis mutates the shipped samples (flipped, cut, spliced and repeated bytes) and
makes up archives and PDFs from scratch.

`VISION_RAG_FUZZ_EXAMPLES` sets the examples per test (default small; raise it for a long run).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vision_rag_pipeline.cli import SAMPLES
from vision_rag_pipeline.documents.mhtml import load_mhtml
from vision_rag_pipeline.documents.model import DocumentError, LoadedDocument
from vision_rag_pipeline.documents.pdf import load_pdf

FUZZ = settings(
    max_examples=int(os.environ.get("VISION_RAG_FUZZ_EXAMPLES", "15")),
    deadline=None,
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
    ],
)
MHTML_SAMPLE = (SAMPLES / "larkspur_q3_2024_report.mhtml").read_bytes()
PDF_SAMPLE = (SAMPLES / "larkspur_q3_2024_operations_review.pdf").read_bytes()


@st.composite
def mutated(draw: st.DrawFn, original: bytes) -> bytes:
    """`original` with a few random edits: the shapes real damage takes (bit rot, truncation, a
    block copied elsewhere, junk spliced in)."""
    data = bytearray(original)
    for _ in range(draw(st.integers(1, 6))):
        at = draw(st.integers(0, max(0, len(data) - 1)))
        edit = draw(st.sampled_from(["flip", "cut", "truncate", "splice", "repeat"]))
        if edit == "flip" and data:
            data[at] ^= draw(st.integers(1, 255))
        elif edit == "cut":
            del data[at : at + draw(st.integers(1, 4096))]
        elif edit == "truncate":
            del data[at:]
        elif edit == "splice":
            data[at:at] = draw(st.binary(min_size=1, max_size=64))
        else:
            block = data[at : at + draw(st.integers(1, 512))]
            data[draw(st.integers(0, len(data))) : 0] = block * draw(st.integers(1, 20))
    return bytes(data)


def _load(loader, path: Path, data: bytes) -> LoadedDocument | None:  # noqa: ANN001 - either loader
    path.write_bytes(data)
    try:
        document = loader(path)
    except DocumentError as exc:
        assert str(exc).startswith(path.name), "the error names the file"
        return None
    assert isinstance(document, LoadedDocument)
    assert all(image.data for image in document.images)
    return document


@FUZZ
@given(data=mutated(MHTML_SAMPLE))
def test_damaged_mhtml_loads_or_raises_document_error(tmp_path: Path, data: bytes) -> None:
    _load(load_mhtml, tmp_path / "damaged.mhtml", data)


@FUZZ
@given(data=mutated(PDF_SAMPLE))
def test_damaged_pdf_loads_or_raises_document_error(tmp_path: Path, data: bytes) -> None:
    _load(load_pdf, tmp_path / "damaged.pdf", data)


MIME_LINES = st.sampled_from(
    [
        b"MIME-Version: 1.0",
        b'Content-Type: multipart/related; boundary="b"',
        b"Content-Type: multipart/related; boundary=",
        b"Content-Type: text/html; charset=x-unknown",
        b"Content-Type: image/png",
        b"Content-Transfer-Encoding: base64",
        b"Content-Transfer-Encoding: quoted-printable",
        b"Content-Location: file:///etc/passwd",
        b"Content-Location: cid:x",
        b"--b",
        b"--b--",
        b"",
        b"<html><img src=cid:x><svg><text>hi</text></svg>",
        b"iVBORw0KGgo=",
        b"=\xff=0",
    ]
)


@FUZZ
@given(lines=st.lists(MIME_LINES | st.binary(max_size=40), max_size=40))
def test_made_up_archives_load_or_raise_document_error(tmp_path: Path, lines: list[bytes]) -> None:
    _load(load_mhtml, tmp_path / "made-up.mhtml", b"\r\n".join(lines))


PDF_TOKENS = st.sampled_from(
    [
        b"%PDF-1.7",
        b"1 0 obj",
        b"endobj",
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Page /Parent 2 0 R >>",
        b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        b"/Count 99999999",
        b"stream",
        b"endstream",
        b"/Filter /FlateDecode",
        b"xref",
        b"0 4",
        b"trailer << /Root 1 0 R /Size 4 >>",
        b"startxref",
        b"%%EOF",
        b"/Encrypt << /Filter /Standard >>",
        b"/MediaBox [0 0 1e9 1e9]",
        b"BT /F1 12 Tf (Hello) Tj ET",
    ]
)


@FUZZ
@given(tokens=st.lists(PDF_TOKENS | st.binary(max_size=24), min_size=1, max_size=50))
def test_made_up_pdfs_load_or_raise_document_error(tmp_path: Path, tokens: list[bytes]) -> None:
    _load(load_pdf, tmp_path / "made-up.pdf", b"%PDF-1.7\n" + b"\n".join(tokens))


@pytest.mark.parametrize("loader", [load_mhtml, load_pdf])
def test_the_unmutated_samples_load(tmp_path: Path, loader) -> None:  # noqa: ANN001
    data = MHTML_SAMPLE if loader is load_mhtml else PDF_SAMPLE
    assert (
        _load(loader, tmp_path / ("sample.mhtml" if loader is load_mhtml else "sample.pdf"), data) is not None
    )


def test_an_image_filter_name_that_is_not_utf8_is_not_fatal(tmp_path: Path) -> None:
    """Found by the long fuzz run: pypdfium2 decodes filter names as UTF-8 and raised UnicodeDecodeError."""
    damaged = re.sub(rb"(/Subtype /Image [^>]*/Filter /)F", lambda m: m.group(1) + b"\xc6", PDF_SAMPLE)
    assert damaged != PDF_SAMPLE
    _load(load_pdf, tmp_path / "filter.pdf", damaged)
