"""The PDF loader on PDFs written by the tests themselves (a tiny writer below), plus a corpus smoke test."""

from __future__ import annotations

import io
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import pypdfium2 as pdfium
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

from vision_rag_pipeline.core.config import DocumentLimits
from vision_rag_pipeline.documents.model import DocumentBudgetError, DocumentError
from vision_rag_pipeline.documents.pdf import load_pdf
from vision_rag_pipeline_tests.conftest import CORPUS, bench_module

LETTER = (612, 792)
bombs = bench_module("bench_document_bombs")


@dataclass
class Text:
    x: float
    y: float  # baseline, PDF user space (bottom-left origin)
    text: str
    size: float = 12
    invisible: bool = False  # render mode 3, as OCR software lays its text over a scan


@dataclass
class Picture:
    x: float
    y: float  # bottom edge, PDF user space
    width: float
    height: float
    image: Image.Image
    jpeg: bool = False
    in_form_at: tuple[float, float] | None = None  # draw inside a Form XObject translated by this
    stored_turned: bool = False  # the raster stored a quarter turn round, drawn upright by its matrix


@dataclass
class Page:
    texts: list[Text] = field(default_factory=list)
    pictures: list[Picture] = field(default_factory=list)
    size: tuple[float, float] = LETTER
    rotate: int = 0


def write_pdf(pages: list[Page], info: dict[str, str] | None = None, encrypt: bool = False) -> bytes:
    """A minimal but valid PDF: Helvetica text, RGB images (Flate or DCT), optional Form XObjects."""
    objects: list[bytes] = []

    def add(body: bytes) -> int:
        objects.append(body)
        return len(objects)

    def stream(header: str, data: bytes) -> bytes:
        return f"<< {header} /Length {len(data)} >>\nstream\n".encode() + data + b"\nendstream"

    catalog = add(b"")  # filled in once the page tree exists
    page_tree = add(b"")
    font = add(b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica /Encoding /WinAnsiEncoding >>")
    page_ids = []
    for page in pages:
        content, xobjects = [], []
        for text in page.texts:
            escaped = text.text.replace("\\", "\\\\").replace("(", "\\(").replace(")", "\\)")
            mode = 3 if text.invisible else 0
            content.append(f"BT /F1 {text.size} Tf {mode} Tr {text.x} {text.y} Td ({escaped}) Tj ET")
        for number, picture in enumerate(page.pictures, start=1):
            rgb = picture.image.convert("RGB")
            if picture.stored_turned:
                rgb = rgb.rotate(90, expand=True)  # its top is the stored raster's left column
            if picture.jpeg:
                buffer = io.BytesIO()
                rgb.save(buffer, format="JPEG", quality=90)
                data, image_filter = buffer.getvalue(), "/DCTDecode"
            else:
                data, image_filter = zlib.compress(rgb.tobytes()), "/FlateDecode"
            image = add(
                stream(
                    f"/Type /XObject /Subtype /Image /Width {rgb.width} /Height {rgb.height} "
                    f"/ColorSpace /DeviceRGB /BitsPerComponent 8 /Filter {image_filter}",
                    data,
                )
            )
            matrix = (
                f"0 {-picture.height} {picture.width} 0 {picture.x} {picture.y + picture.height}"
                if picture.stored_turned
                else f"{picture.width} 0 0 {picture.height} {picture.x} {picture.y}"
            )
            draw = f"q {matrix} cm /Im{number} Do Q"
            if picture.in_form_at is None:
                xobjects.append(f"/Im{number} {image} 0 R")
                content.append(draw)
            else:
                form = add(
                    stream(
                        f"/Type /XObject /Subtype /Form /BBox [0 0 {page.size[0]} {page.size[1]}] "
                        f"/Resources << /XObject << /Im{number} {image} 0 R >> >>",
                        draw.encode(),
                    )
                )
                xobjects.append(f"/Fm{number} {form} 0 R")
                dx, dy = picture.in_form_at
                content.append(f"q 1 0 0 1 {dx} {dy} cm /Fm{number} Do Q")
        contents = add(stream("", "\n".join(content).encode("latin-1")))
        page_ids.append(
            add(
                f"<< /Type /Page /Parent {page_tree} 0 R /MediaBox [0 0 {page.size[0]} {page.size[1]}] "
                f"/Rotate {page.rotate} /Contents {contents} 0 R /Resources << /Font << /F1 {font} 0 R >> "
                f"/XObject << {' '.join(xobjects)} >> >> >>".encode()
            )
        )
    objects[catalog - 1] = f"<< /Type /Catalog /Pages {page_tree} 0 R >>".encode()
    kids = " ".join(f"{page_id} 0 R" for page_id in page_ids)
    objects[page_tree - 1] = f"<< /Type /Pages /Kids [{kids}] /Count {len(page_ids)} >>".encode()
    trailer = f"/Root {catalog} 0 R"
    if info:
        entries = " ".join(f"/{key} ({value})" for key, value in info.items())
        trailer += f" /Info {add(f'<< {entries} >>'.encode())} 0 R"
    if encrypt:  # a standard security handler whose (random) hashes match no empty user password
        handler = f"<< /Filter /Standard /V 1 /R 2 /O <{'ab' * 32}> /U <{'cd' * 32}> /P -4 >>"
        trailer += f" /Encrypt {add(handler.encode())} 0 R"
        trailer += " /ID [<00112233445566778899aabbccddeeff> <00112233445566778899aabbccddeeff>]"
    out = io.BytesIO()
    out.write(b"%PDF-1.4\n")
    offsets = []
    for number, body in enumerate(objects, start=1):
        offsets.append(out.tell())
        out.write(f"{number} 0 obj\n".encode() + body + b"\nendobj\n")
    xref = out.tell()
    out.write(f"xref\n0 {len(objects) + 1}\n0000000000 65535 f \n".encode())
    out.write("".join(f"{offset:010d} 00000 n \n" for offset in offsets).encode())
    out.write(f"trailer\n<< /Size {len(objects) + 1} {trailer} >>\nstartxref\n{xref}\n%%EOF\n".encode())
    return out.getvalue()


def save(tmp_path: Path, data: bytes, name: str = "doc.pdf") -> Path:
    path = tmp_path / name
    path.write_bytes(data)
    return path


def checkerboard(width: int = 40, height: int = 20) -> Image.Image:
    image = Image.new("RGB", (width, height), "red")
    for x in range(0, width, 4):
        for y in range(0, height, 4):
            image.putpixel((x, y), (0, 0, 255))
    return image


def assert_bbox_close(actual: tuple[float, ...], expected: tuple[float, ...], tolerance: float = 2.0) -> None:
    assert all(abs(a - e) <= tolerance for a, e in zip(actual, expected, strict=True)), (actual, expected)


def test_text_keeps_page_numbers_and_top_left_bboxes(tmp_path: Path) -> None:
    pages = [
        Page(texts=[Text(72, 740, "Quarterly report heading line"), Text(72, 400, "Middle of page one")]),
        Page(texts=[Text(72, 100, "Bottom of page two, near the footer")]),
    ]
    document = load_pdf(save(tmp_path, write_pdf(pages)))

    assert document.mime == "application/pdf" and document.pages == 2
    located = {element.text: element.location for element in document.elements}
    top = located["Quarterly report heading line"]
    assert top.page == 1 and top.bbox[1] < 60  # drawn 52 pt below the top edge
    assert located["Middle of page one"].page == 1
    bottom = located["Bottom of page two, near the footer"]
    assert bottom.page == 2 and bottom.bbox[3] > 680
    for location in located.values():
        x0, y0, x1, y1 = location.bbox
        assert 0 <= x0 < x1 <= LETTER[0] and 0 <= y0 < y1 <= LETTER[1]
        assert abs(x0 - 72) < 3


def _wide_margin_page(first_line: str, last_line: str) -> Page:
    """A page whose text sits between 15 % and 80 % of its height: a hearing's or an excerpt's
    layout, its first and last lines well inside the top and bottom tenths' limits."""
    body = [
        Text(150, 640 - 16 * i, f"Body line {i} of the statement read into the record.") for i in range(20)
    ]
    return Page(texts=[Text(300, 665, first_line), *body, Text(150, 170, last_line)])


def test_page_numbers_at_the_edge_of_a_text_inside_wide_margins_are_found(tmp_path: Path) -> None:
    """A number at the top of the text on every page, though not in the page's top tenth, is the
    printed page number (the page one of a hearing prints it under the text, as "(1)")."""
    pages = [_wide_margin_page("Witness list", "(1)")]
    pages += [_wide_margin_page(str(number), "end of page") for number in range(2, 10)]
    document = load_pdf(save(tmp_path, write_pdf([Page(texts=[Text(72, 700, "Cover")]), *pages])))

    assert [info.printed for info in document.page_info] == [[]] + [[str(n)] for n in range(1, 10)]


def test_section_numbers_opening_a_few_pages_are_no_page_numbers(tmp_path: Path) -> None:
    """A paper's section headings ("2 Related Work" on the fifth page, "3 Method" on the sixth...)
    fit a progression on three pages: not enough of the document for a number read off the text's
    own first line."""
    headings = {5: "2 Related Work", 6: "3 Method", 7: "4 Results"}
    pages = [
        _wide_margin_page(headings.get(number, "Introduction and notes"), "more") for number in range(1, 13)
    ]
    document = load_pdf(save(tmp_path, write_pdf(pages)))

    assert all(not info.printed for info in document.page_info)


def test_lines_close_together_form_one_paragraph_and_columns_read_left_first(tmp_path: Path) -> None:
    right_column = [Text(320, 700 - 14 * i, f"right column line {i}", 10) for i in range(3)]
    left_column = [Text(72, 700 - 14 * i, f"left column line {i}", 10) for i in range(3)]
    page = Page(texts=[Text(72, 740, "A heading across the whole page width of this report", 16)])
    page.texts += right_column + left_column + [Text(72, 500, "A separate paragraph far below", 10)]

    texts = [element.text for element in load_pdf(save(tmp_path, write_pdf([page]))).elements]

    assert texts == [
        "A heading across the whole page width of this report",
        "left column line 0\nleft column line 1\nleft column line 2",
        "A separate paragraph far below",
        "right column line 0\nright column line 1\nright column line 2",
    ]


def test_raster_image_is_extracted_in_place_with_caption(tmp_path: Path) -> None:
    page = Page(
        texts=[Text(72, 740, "Results of the experiment"), Text(100, 480, "Figure 1: Red and blue pixels")],
        pictures=[Picture(100, 500, 200, 100, checkerboard())],
    )
    document = load_pdf(save(tmp_path, write_pdf([page]), "report.pdf"))

    assert [element.kind for element in document.elements] == ["text", "image", "text"]
    image_element = document.elements[1]
    image = document.images[image_element.image_index]
    assert image_element.location.page == image.location.page == 1
    assert_bbox_close(image.location.bbox, (100, 792 - 600, 300, 792 - 500))
    assert image.mime == "image/png" and (image.width, image.height) == (40, 20)
    with Image.open(io.BytesIO(image.data)) as decoded:
        assert decoded.size == (40, 20) and decoded.convert("RGB").getpixel((1, 1)) == (255, 0, 0)
    assert image.name == "page-1-image-1.png" and image.url == "report.pdf#page=1&image=1"
    assert image.caption == "Figure 1: Red and blue pixels"
    assert "Results of the experiment" in image.context and len(image.context) <= 300
    assert not image.is_page_image


def test_an_ocr_layer_over_a_scan_becomes_its_text_layer_and_stays_page_text(tmp_path: Path) -> None:
    scan = Picture(0, 0, *LETTER, checkerboard(120, 160))
    photo = Picture(100, 100, 200, 100, checkerboard())
    page = Page(
        texts=[
            Text(72, 700, "Invoice number 4471 paid", invisible=True),
            Text(72, 680, "Total due 12,5 EUR", invisible=True),
        ],
        pictures=[scan],
    )
    plain = Page(texts=[Text(110, 150, "A caption drawn over a photo")], pictures=[photo])
    document = load_pdf(save(tmp_path, write_pdf([page, plain])))

    scanned, pictured = document.images
    assert scanned.text_layer == "Invoice number 4471 paid\nTotal due 12,5 EUR"
    assert pictured.text_layer == ""  # visible text is drawn over a picture, not read off it
    page_text = [element.text for element in document.elements if element.kind == "text"]
    assert any("Invoice number 4471 paid" in text for text in page_text)


def test_a_figure_caption_wins_over_a_nearer_plain_line(tmp_path: Path) -> None:
    page = Page(
        texts=[
            Text(100, 620, "Figure 2. Throughput per worker"),
            Text(100, 490, "axis label under the chart"),
            Text(100, 300, "Unrelated body text far away " * 3),
        ],
        pictures=[Picture(100, 500, 200, 100, checkerboard())],
    )
    image = load_pdf(save(tmp_path, write_pdf([page]))).images[0]

    assert image.caption == "Figure 2. Throughput per worker"
    assert image.context.startswith("Figure 2. Throughput per worker axis label under the chart")


def test_jpeg_streams_are_kept_byte_for_byte(tmp_path: Path) -> None:
    photo = Picture(72, 300, 160, 120, checkerboard(), jpeg=True)
    pdf_bytes = write_pdf([Page(texts=[Text(72, 740, "A photo follows")], pictures=[photo])])

    image = load_pdf(save(tmp_path, pdf_bytes)).images[0]

    assert image.mime == "image/jpeg" and image.name.endswith(".jpg")
    assert image.data.startswith(b"\xff\xd8") and image.data in pdf_bytes


def test_images_inside_form_xobjects_are_placed_on_the_page(tmp_path: Path) -> None:
    page = Page(
        texts=[Text(72, 740, "Diagram page")],
        pictures=[Picture(10, 10, 100, 50, checkerboard(), in_form_at=(300, 400))],
    )
    image = load_pdf(save(tmp_path, write_pdf([page]))).images[0]

    assert_bbox_close(image.location.bbox, (310, 792 - 460, 410, 792 - 410))


def test_images_smaller_than_two_pixels_are_skipped(tmp_path: Path) -> None:
    page = Page(
        texts=[Text(72, 740, "A spacer image")], pictures=[Picture(72, 600, 300, 1, checkerboard(1, 1))]
    )
    document = load_pdf(save(tmp_path, write_pdf([page])))

    assert document.images == [] and [element.kind for element in document.elements] == ["text"]


@pytest.mark.parametrize("rotate", [90, 180, 270])
def test_bboxes_on_rotated_pages_match_the_rendered_page(tmp_path: Path, rotate: int) -> None:
    page = Page(
        texts=[Text(72, 700, "MMMMMMMMMMMM", 24)],
        pictures=[Picture(300, 100, 200, 150, Image.new("RGB", (8, 8), "black"))],
        rotate=rotate,
    )
    path = save(tmp_path, write_pdf([page]))
    document = load_pdf(path)
    pdf = pdfium.PdfDocument(path)
    try:
        rendered = pdf[0].render(scale=1).to_pil().convert("L")
    finally:
        pdf.close()

    for element in document.elements:
        x0, y0, x1, y1 = element.location.bbox
        assert x1 <= rendered.width + 1 and y1 <= rendered.height + 1
        ink = rendered.crop((round(x0), round(y0), round(x1), round(y1)))
        assert ink.getextrema()[0] < 64, f"no ink inside the {element.kind} bbox {element.location.bbox}"
        everything_else = rendered.copy()
        everything_else.paste(255, (round(x0) - 2, round(y0) - 2, round(x1) + 2, round(y1) + 2))
        for other in document.elements:
            if other is not element:
                ox0, oy0, ox1, oy1 = other.location.bbox
                everything_else.paste(255, (round(ox0) - 2, round(oy0) - 2, round(ox1) + 2, round(oy1) + 2))
        assert everything_else.getextrema()[0] > 128, "ink outside every bbox"


def test_image_only_page_becomes_one_page_image_without_text(tmp_path: Path) -> None:
    scan = Image.new("RGB", (850, 1100), "white")
    scan.paste((0, 0, 0), (100, 100, 700, 140))
    path = tmp_path / "scan.pdf"
    scan.save(path, "PDF", resolution=100.0)

    document = load_pdf(path)

    assert document.pages == 1 and len(document.images) == 1
    assert [element.kind for element in document.elements] == ["image"]
    page_image = document.images[0]
    assert page_image.is_page_image and page_image.location.page == 1
    assert_bbox_close(page_image.location.bbox, (0, 0, 612, 792))
    assert (page_image.width, page_image.height) == (850, 1100), (
        "the scan's own pixels: finer only interpolates"
    )
    assert document.text == ""


@pytest.mark.parametrize(("dpi", "rendered"), [(300.0, (1700, 2200)), (50.0, (612, 792))])
def test_a_scanned_page_renders_at_its_resolution_between_72_and_200_dpi(
    tmp_path: Path, dpi: float, rendered: tuple[int, int]
) -> None:
    scan = Image.new("L", (round(8.5 * dpi), round(11 * dpi)), 255)
    scan.paste(0, (10, 10, scan.width // 2, scan.height // 20))
    path = tmp_path / "scan.pdf"
    scan.save(path, "PDF", resolution=dpi)

    [page_image] = load_pdf(path).images

    assert (page_image.width, page_image.height) == rendered


def test_text_page_and_scanned_page_in_one_document(tmp_path: Path) -> None:
    pages = [
        Page(
            texts=[Text(72, 740, "Cover letter text")], pictures=[Picture(72, 400, 100, 100, checkerboard())]
        ),
        Page(pictures=[Picture(0, 0, 612, 792, checkerboard(85, 110))]),
    ]
    document = load_pdf(save(tmp_path, write_pdf(pages)))

    assert [(image.location.page, image.is_page_image) for image in document.images] == [
        (1, False),
        (2, True),
    ]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    lines=st.lists(
        # no "-": pdfium rightly drops a hyphen that splits a word across two lines
        st.text(
            st.characters(min_codepoint=33, max_codepoint=126, exclude_characters="-"),
            min_size=5,
            max_size=30,
        ),
        min_size=1,
        max_size=12,
    ),
    spacing=st.sampled_from([14, 40]),
)
def test_char_spans_index_the_document_text(tmp_path: Path, lines: list[str], spacing: int) -> None:
    texts = [Text(72, 760 - spacing * (i % 15), line, 10) for i, line in enumerate(lines)]
    pages = [Page(texts=texts[:15]), Page(texts=texts[15:])] if len(texts) > 15 else [Page(texts=texts)]
    document = load_pdf(save(tmp_path, write_pdf(pages)))

    end = -2
    for element in document.elements:
        assert element.kind == "text"
        start, stop = element.location.char_span
        assert document.text[start:stop] == element.text and start == end + 2
        end = stop
    assert end == len(document.text)
    assert sorted("".join(document.text.split())) == sorted("".join(lines))


def test_metadata_and_title_come_from_the_info_dictionary(tmp_path: Path) -> None:
    info = {
        "Title": "Annual Report 2023",
        "Author": "Finance Team",
        "CreationDate": "D:20240131093000+01'00'",
    }
    document = load_pdf(save(tmp_path, write_pdf([Page(texts=[Text(72, 700, "Body")])], info=info)))

    assert document.title == "Annual Report 2023"
    assert document.metadata["Author"] == "Finance Team"
    assert document.metadata["CreationDate"] == "2024-01-31T09:30:00+01:00"


@pytest.mark.parametrize(
    "info", [None, {"Title": "report-final.docx"}, {"Title": "UG"}, {"Title": "Scan_0001"}]
)
def test_title_falls_back_to_the_first_heading(tmp_path: Path, info: dict[str, str] | None) -> None:
    page = Page(
        texts=[Text(72, 740, "Installation Guide", 24)]
        + [Text(72, 700 - 14 * i, "body text", 10) for i in range(5)]
    )
    path = save(tmp_path, write_pdf([page], info=info), name="scan_0001.pdf")  # a title that is its stem
    assert load_pdf(path).title == "Installation Guide"


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"", "not a readable PDF"),
        (b"Hello, this is a plain text file.\n", "not a readable PDF"),
        (write_pdf([Page(texts=[Text(72, 700, "x")])])[:200], "not a readable PDF"),
        (write_pdf([]), "not a readable PDF"),
        (write_pdf([Page(texts=[Text(72, 700, "secret")])], encrypt=True), "password"),
    ],
    ids=["empty", "not-a-pdf", "truncated", "zero-pages", "encrypted"],
)
def test_unreadable_pdfs_raise_document_error_naming_the_file(
    tmp_path: Path, data: bytes, reason: str
) -> None:
    with pytest.raises(DocumentError, match=rf"^bad\.pdf: .*{reason}") as raised:
        load_pdf(save(tmp_path, data, "bad.pdf"))
    assert "\n" not in str(raised.value)


def test_missing_file_raises_document_error(tmp_path: Path) -> None:
    with pytest.raises(DocumentError, match="^gone.pdf: file not found"):
        load_pdf(tmp_path / "gone.pdf")


CORPUS_PDFS = sorted((CORPUS / "pdf").glob("*.pdf")) if (CORPUS / "pdf").is_dir() else []


def test_a_pdf_of_more_pages_than_the_limit_is_refused_before_a_page_is_read(tmp_path: Path) -> None:
    """A 464 KB PDF of 2,000 blank pages had not finished loading and OCR after 400 s."""
    with pytest.raises(DocumentBudgetError) as refused:
        load_pdf(save(tmp_path, bombs.blank_pages_pdf(2000)))
    assert str(refused.value) == "doc.pdf: 2,000 pages, more than 1,000 (limits.documents.max_pages)"
    few = save(tmp_path, bombs.blank_pages_pdf(3), "few.pdf")
    with pytest.raises(DocumentBudgetError, match="limits.documents.max_pages"):
        load_pdf(few, DocumentLimits(max_pages=2))
    assert load_pdf(few, DocumentLimits(max_pages=3)).pages == 3


@pytest.mark.parametrize(
    "bomb",
    [bombs.content_bomb_pdf, bombs.image_bomb_pdf, lambda: bombs.image_bomb_pdf(indirect_size=True)],
    ids=["content-1GB", "image-18000", "image-indirect-size"],
)
def test_a_stream_inflating_past_the_limit_is_refused_before_pdfium_inflates_it(tmp_path: Path, bomb) -> None:  # noqa: ANN001
    """A 1 MB PDF whose one stream inflates to 1 GB peaked at 2.5 GB (the bench measures the memory)."""
    with pytest.raises(
        DocumentBudgetError, match=r"more than 134,217,728 bytes \(limits.documents.max_stream_bytes\)"
    ):
        load_pdf(save(tmp_path, bomb()))


def test_streams_inflating_past_the_document_limit_together_are_refused(tmp_path: Path) -> None:
    path = save(tmp_path, bombs.content_bomb_pdf(8 << 20, pages=3))
    limits = DocumentLimits(max_stream_bytes=16 << 20, max_document_bytes=20 << 20)
    with pytest.raises(DocumentBudgetError, match=r"together \(limits.documents.max_document_bytes\)"):
        load_pdf(path, limits)
    doc = load_pdf(path, limits.model_copy(update={"max_document_bytes": 32 << 20}))
    assert doc.pages == 3 and "A page with a few words on it." in doc.text


@pytest.mark.skipif(not CORPUS_PDFS, reason="corpus not available")
@pytest.mark.parametrize("path", CORPUS_PDFS, ids=lambda path: path.name)
def test_corpus_pdfs_load_or_raise_document_error(path: Path) -> None:
    try:
        document = load_pdf(path)
    except DocumentError:
        return
    assert document.pages and document.elements
    assert all(element.location.page for element in document.elements)
    if path.name == "docling_2305.03393v1-pg9.pdf":  # a table drawn with vector lines, no raster image
        assert document.images == [] and "OTSL" in document.text
    if path.name == "docling_ocr_test.pdf":  # a scan without a text layer
        assert [image.is_page_image for image in document.images] == [True]
