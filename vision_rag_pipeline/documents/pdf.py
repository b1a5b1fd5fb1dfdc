"""Load a PDF into paragraphs and images with their page and bounding box.

pypdfium2 is used directly because it extracts text and images at ~190 pages/s, where unstructured's
`fast` strategy manages 31 pages/s and, offline, silently returns nothing.

Coordinates: every bbox is (x0, y0, x1, y1) in PDF points on the page as displayed (after /Rotate and
the crop box), origin at the top-left corner, so it can crop a rendering of the page directly.
Pages without a text layer are rendered whole (`is_page_image=True`) so the OCR stage can read them.
An image under invisible text (a scan the producer OCR'd) carries that text as `text_layer`: the
PDF's own reading of it, which the enrichment stage uses instead of reading the image again.
pdfium is not thread-safe: load one PDF per thread/process at a time.

Before any page is parsed the document is held to `limits.documents`: its page count, what its
streams inflate to (`pdf_streams.py`), and, page by page, what each image on it decodes to; past a
limit it fails with a one-line `DocumentBudgetError` naming the setting.
"""

from __future__ import annotations

import io
import math
import re
import statistics
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pypdfium2 as pdfium
import pypdfium2.raw as pdfium_c
from PIL import Image, ImageChops

from vision_rag_pipeline.core.config import DocumentLimits
from vision_rag_pipeline.documents.model import (
    BBox,
    DocumentBudgetError,
    DocumentError,
    DocumentImage,
    Element,
    LoadedDocument,
    Location,
    PageInfo,
)
from vision_rag_pipeline.documents.page_numbers import edge_numbers, printed_page_numbers
from vision_rag_pipeline.documents.pdf_streams import check_stream_budget

PDF_MIME = "application/pdf"
MIN_TEXT_CHARS = 5  # fewer visible characters than this and a page counts as a scan
MIN_IMAGE_PX = 2  # images thinner than this are spacers or rules, not pictures
PAGE_RENDER_DPI = 200
PAGE_RENDER_MAX_SIDE = 2500
RASTER_PAGE_SHARE = 0.5  # a picture covering this much of a text-less page is what the page is
CAPTION_LINE_MAX_GAP = 40.0  # pt between an image and a plain line that may caption it
CAPTION_BLOCK_MAX_GAP = 120.0  # pt between an image and a "Figure 3 ..." paragraph
CONTEXT_MAX_CHARS = 300
MARGIN_SHARE = 0.1  # the top and bottom tenth of a page: where headers and footers print page numbers
BODY_EDGE_SHARE = 0.4  # of the pages, that a progression read off the body's edge lines must cover
CAPTION_START = re.compile(
    r"^\s*(figure|fig\.|table|tab\.|chart|graph|diagram|image|photo)\s*[\dIVX:.]", re.I
)
# pdfium marks the hyphen of a word it re-joined across a line break with U+FFFE (older builds: U+0002).
_PDFIUM_MARKERS = str.maketrans("", "", "\ufffe\x02\x00")
_EXTENSIONS = {"image/jpeg": "jpg", "image/png": "png"}
_OPEN_ERRORS = {
    pdfium_c.FPDF_ERR_FILE: "cannot be read",
    pdfium_c.FPDF_ERR_FORMAT: "not a readable PDF (not a PDF, or damaged)",
    pdfium_c.FPDF_ERR_PASSWORD: "encrypted, needs a password",
    pdfium_c.FPDF_ERR_SECURITY: "encrypted with an unsupported security handler",
}


@dataclass
class _Line:
    text: str
    bbox: BBox
    font_size: float  # in points, as displayed
    bold: bool
    invisible: bool = False  # drawn in render mode 3: a scan's OCR layer, placed over its image

    @property
    def height(self) -> float:
        return self.bbox[3] - self.bbox[1]


@dataclass
class _Block:
    """A paragraph-ish run of lines, or an image; the unit of reading order on a page."""

    bbox: BBox
    lines: list[_Line] = field(default_factory=list)
    image: DocumentImage | None = None

    @property
    def text(self) -> str:
        return "\n".join(line.text for line in self.lines)

    @property
    def font_size(self) -> float:
        return max(line.font_size for line in self.lines) if self.lines else 0.0


class _PageFrame:
    """Maps PDF user space (bottom-left origin, unrotated) to the displayed page (top-left origin)."""

    def __init__(self, page: pdfium.PdfPage) -> None:
        self.left, self.bottom, self.right, self.top = page.get_bbox()
        self.rotation = page.get_rotation()
        width, height = self.right - self.left, self.top - self.bottom
        self.width, self.height = (height, width) if self.rotation in (90, 270) else (width, height)

    def point(self, x: float, y: float) -> tuple[float, float]:
        if self.rotation == 90:
            return y - self.bottom, x - self.left
        if self.rotation == 180:
            return self.right - x, y - self.bottom
        if self.rotation == 270:
            return self.top - y, self.right - x
        return x - self.left, self.top - y

    def rect(self, left: float, bottom: float, right: float, top: float) -> BBox:
        """The displayed bbox of a user-space rectangle, clipped to the page."""
        (ax, ay), (bx, by) = self.point(left, bottom), self.point(right, top)
        x0, x1 = sorted((ax, bx))
        y0, y1 = sorted((ay, by))
        return (
            round(min(max(x0, 0.0), self.width), 2),
            round(min(max(y0, 0.0), self.height), 2),
            round(min(max(x1, 0.0), self.width), 2),
            round(min(max(y1, 0.0), self.height), 2),
        )

    @property
    def box(self) -> BBox:
        return (0.0, 0.0, round(self.width, 2), round(self.height, 2))


def load_pdf(path: str | Path, limits: DocumentLimits | None = None) -> LoadedDocument:
    """Text paragraphs and images of a PDF in reading order, each with page and bbox (and char span);
    `limits` bound what it may cost (the defaults when None)."""
    path = Path(path)
    limits = limits or DocumentLimits()
    try:
        pdf = pdfium.PdfDocument(path)
    except FileNotFoundError:
        raise DocumentError(f"{path.name}: file not found") from None
    except pdfium.PdfiumError as error:
        # pdfium refuses an empty page tree without setting an error code, so "no pages" lands here too
        reason = _OPEN_ERRORS.get(getattr(error, "err_code", None), "not a readable PDF (or no pages)")
        raise DocumentError(f"{path.name}: {reason}") from None
    try:
        return _load(pdf, path, limits)
    except pdfium.PdfiumError as error:
        raise DocumentError(f"{path.name}: corrupt PDF ({error})") from None
    finally:
        pdf.close()


def _load(pdf: pdfium.PdfDocument, path: Path, limits: DocumentLimits) -> LoadedDocument:
    page_count = len(pdf)
    if page_count == 0:
        raise DocumentError(f"{path.name}: the PDF has no pages")
    if page_count > limits.max_pages:
        raise DocumentBudgetError(
            f"{path.name}: {page_count:,} pages, more than {limits.max_pages:,} (limits.documents.max_pages)"
        )
    check_stream_budget(path, limits)
    elements: list[Element] = []
    images: list[DocumentImage] = []
    first_page_blocks: list[_Block] | None = None
    margin_numbers: list[list[int]] = []
    body_edge_numbers: list[list[int]] = []
    for page_index in range(page_count):
        page = pdf[page_index]
        try:
            _check_images(page, page_index + 1, path.name, limits)
            blocks, margin_lines, body_edge_lines = _page_blocks(page, page_index + 1, path.name)
        finally:
            page.close()
        margin_numbers.append(edge_numbers(margin_lines))
        body_edge_numbers.append(edge_numbers(body_edge_lines))
        if first_page_blocks is None and any(block.lines for block in blocks):
            first_page_blocks = blocks
        for block in blocks:
            location = Location(page=page_index + 1, bbox=block.bbox)
            if block.image is not None:
                elements.append(Element(kind="image", location=location, image_index=len(images)))
                images.append(block.image)
            else:
                elements.append(Element(kind="text", text=block.text, location=location))
    _set_char_spans(elements)
    metadata = _metadata(pdf)
    info_title = metadata.get("Title", "")
    title = info_title if _is_real_title(info_title, path) else _first_heading(first_page_blocks or [])
    return LoadedDocument(
        source_path=str(path),
        mime=PDF_MIME,
        title=title,
        metadata=metadata,
        elements=elements,
        images=images,
        pages=page_count,
        page_info=_page_info(pdf, margin_numbers, body_edge_numbers),
    )


def _check_images(page: pdfium.PdfPage, page_number: int, file_name: str, limits: DocumentLimits) -> None:
    """Refuse the page before any of its images is decoded (to be extracted, or in a rendering of
    the page) when one decodes to more than `max_stream_bytes`: pdfium decodes an image whole."""
    for image_object in page.get_objects(filter=[pdfium_c.FPDF_PAGEOBJ_IMAGE]):
        width, height = image_object.get_px_size()
        bits = max(image_object.get_metadata().bits_per_pixel, 8)
        if width * height * bits // 8 > limits.max_stream_bytes:
            raise DocumentBudgetError(
                f"{file_name}: page {page_number}: a {width:,}x{height:,} image decodes to more than "
                f"{limits.max_stream_bytes:,} bytes (limits.documents.max_stream_bytes)"
            )


def _page_info(
    pdf: pdfium.PdfDocument, margin_numbers: list[list[int]], body_edge_numbers: list[list[int]]
) -> list[PageInfo]:
    """Each page's label and printed page numbers (see documents/page_numbers.py): from the numbers
    in the pages' margins, or where those give none, from the body's first and last lines too (a
    book's or an excerpt's margins can be wider than a tenth of the page), where a progression must
    cover more of the document (BODY_EDGE_SHARE): section and list numbers open body lines too."""
    labels = [pdf.get_page_label(index) for index in range(len(pdf))]
    places = [int(label) if label.isdigit() else index + 1 for index, label in enumerate(labels)]
    printed = printed_page_numbers(margin_numbers, places)
    if not any(printed):
        with_edges = [margin + edge for margin, edge in zip(margin_numbers, body_edge_numbers, strict=True)]
        printed = printed_page_numbers(with_edges, places, min_share_of_pages=BODY_EDGE_SHARE)
    return [
        PageInfo(number=index + 1, label=label, printed=[str(n) for n in numbers])
        for index, (label, numbers) in enumerate(zip(labels, printed, strict=True))
    ]


def _page_blocks(
    page: pdfium.PdfPage, page_number: int, file_name: str
) -> tuple[list[_Block], list[str], list[str]]:
    """The page's paragraphs and images in reading order (a page without text becomes one rendered
    image), the text lines in its top and bottom margins, and the first and last line of the text
    between them."""
    frame = _PageFrame(page)
    textpage = page.get_textpage()
    try:
        lines = list(_lines(textpage, frame))
    finally:
        textpage.close()
    if sum(len(line.text.replace(" ", "")) for line in lines) < MIN_TEXT_CHARS:
        return [_Block(bbox=frame.box, image=_render_page(page, frame, page_number, file_name))], [], []
    visible = [line for line in lines if not line.invisible]
    margin = [line.text for line in visible if _in_margins(line, frame.height)]
    body = [line for line in visible if not _in_margins(line, frame.height)]
    body_edges = [min(body, key=_top).text, max(body, key=_bottom).text] if body else []
    text_blocks = _paragraphs(lines)
    image_blocks = [
        _Block(bbox=bbox, image=image)
        for bbox, image in _embedded_images(page, frame, page_number, file_name)
    ]
    for block in image_blocks:
        block.image.caption = _caption(block.bbox, text_blocks, lines)
        block.image.context = _context(block.bbox, text_blocks)
        block.image.text_layer = "\n".join(
            line.text for line in lines if line.invisible and _starts_inside(line.bbox, block.bbox)
        )
    return _reading_order(text_blocks + image_blocks, frame.width), margin, body_edges


def _in_margins(line: _Line, height: float) -> bool:
    return line.bbox[1] < MARGIN_SHARE * height or line.bbox[3] > (1 - MARGIN_SHARE) * height


def _top(line: _Line) -> float:
    return line.bbox[1]


def _bottom(line: _Line) -> float:
    return line.bbox[3]


def _lines(textpage: pdfium.PdfTextPage, frame: _PageFrame) -> Iterator[_Line]:
    """pdfium's text lines (it breaks text into lines with CRLF) with their displayed bbox and font size.

    A line's box spans the font's full height (pdfium's loose char box), not just its inked glyphs, so
    the gap between two lines measures line spacing whatever letters they hold.
    """
    text = textpage.get_text_range()
    start = 0
    for raw_line in text.split("\r\n"):
        end = start + len(raw_line)
        line_text = raw_line.translate(_PDFIUM_MARKERS).strip()
        if line_text:
            first = pdfium_c.FPDFText_GetCharIndexFromTextIndex(textpage, start)
            last = pdfium_c.FPDFText_GetCharIndexFromTextIndex(textpage, end - 1)
            first, last = (first, last) if 0 <= first <= last else (start, end - 1)
            boxes = [
                frame.rect(*textpage.get_rect(i))
                for i in range(textpage.count_rects(first, last - first + 1))
            ]
            if boxes:
                font_box = frame.rect(*textpage.get_charbox(first, loose=True))
                bbox = _union(_union_all(boxes), font_box) if font_box[3] > font_box[1] else _union_all(boxes)
                bold = pdfium_c.FPDFText_GetFontWeight(textpage, first) >= 600
                text_object = textpage.get_textobj(first)
                size = _font_size(textpage, first, text_object) or bbox[3] - bbox[1]
                yield _Line(line_text, bbox, size, bold, _is_invisible(text_object))
        start = end + 2


def _font_size(textpage: pdfium.PdfTextPage, char_index: int, text_object: pdfium.PdfObject | None) -> float:
    """The size the reader sees: the Tf size times the text object's scale (Quartz writes `1 Tf` and
    scales with the text matrix, so FPDFText_GetFontSize alone says 1.0)."""
    size = pdfium_c.FPDFText_GetFontSize(textpage, char_index)
    if text_object is None:
        return size
    _, _, c, d, _, _ = text_object.get_matrix().get()
    return size * (c * c + d * d) ** 0.5


def _is_invisible(text_object: pdfium.PdfObject | None) -> bool:
    return (
        text_object is not None
        and pdfium_c.FPDFTextObj_GetTextRenderMode(text_object.raw) == pdfium_c.FPDF_TEXTRENDERMODE_INVISIBLE
    )


def _starts_inside(line: BBox, image: BBox, slack: float = 2.0) -> bool:
    """The line's top-left corner lies on the image: OCR layers place each line over its glyphs."""
    return image[0] - slack <= line[0] <= image[2] + slack and image[1] - slack <= line[1] <= image[3] + slack


def _paragraphs(lines: list[_Line]) -> list[_Block]:
    """Group consecutive lines (pdfium's content order) into paragraphs by spacing, overlap and font size."""
    blocks: list[_Block] = []
    for line in lines:
        block = blocks[-1] if blocks else None
        if block is not None and _continues(block, line):
            block.lines.append(line)
            block.bbox = _union(block.bbox, line.bbox)
        else:
            blocks.append(_Block(bbox=line.bbox, lines=[line]))
    return blocks


def _continues(block: _Block, line: _Line) -> bool:
    previous = block.lines[-1]
    x0, y0, x1, y1 = line.bbox
    same_row = min(y1, previous.bbox[3]) - max(y0, previous.bbox[1]) > 0.5 * min(line.height, previous.height)
    if same_row:
        return x0 - previous.bbox[2] < 3 * max(line.font_size, 1.0)
    size = max(previous.font_size, line.font_size, 1.0)
    if abs(previous.font_size - line.font_size) > 0.15 * size or previous.bold != line.bold:
        return False  # a heading, caption or footnote starts or ends here
    gap = y0 - previous.bbox[3]
    if not -0.3 * size <= gap <= 0.6 * size:
        return False
    if len(block.lines) >= 2:  # a paragraph keeps its line spacing; a wider gap starts the next one
        first_gap = block.lines[1].bbox[1] - block.lines[0].bbox[3]
        if gap > max(first_gap, 0.0) + 0.2 * size:
            return False
    overlap = min(x1, block.bbox[2]) - max(x0, block.bbox[0])
    return overlap > 0.5 * min(x1 - x0, block.bbox[2] - block.bbox[0])


def _reading_order(blocks: list[_Block], page_width: float) -> list[_Block]:
    """Top-to-bottom, left-to-right; between blocks that span the page middle, left column before right."""
    middle = page_width / 2
    ordered: list[_Block] = []
    band: list[_Block] = []
    for block in sorted(blocks, key=lambda b: (b.bbox[1], b.bbox[0])):
        if block.bbox[0] < middle < block.bbox[2]:
            ordered += _band_order(band, middle)
            band = []
            ordered.append(block)
        else:
            band.append(block)
    return ordered + _band_order(band, middle)


def _band_order(band: list[_Block], middle: float) -> list[_Block]:
    left = [block for block in band if block.bbox[2] <= middle]
    right = [block for block in band if block.bbox[2] > middle]
    return _rows(left) + _rows(right)


def _rows(blocks: list[_Block]) -> list[_Block]:
    """Sort by top; blocks whose tops are within a few points form a row read left to right."""
    ordered: list[_Block] = []
    row: list[_Block] = []
    for block in sorted(blocks, key=lambda b: b.bbox[1]):
        if row and block.bbox[1] - row[0].bbox[1] > 3.0:
            ordered += sorted(row, key=lambda b: b.bbox[0])
            row = []
        row.append(block)
    return ordered + sorted(row, key=lambda b: b.bbox[0])


def _embedded_images(
    page: pdfium.PdfPage, frame: _PageFrame, page_number: int, file_name: str
) -> Iterator[tuple[BBox, DocumentImage]]:
    """Raster images drawn on the page, including those inside Form XObjects."""
    index = 0
    for image_object in page.get_objects(filter=[pdfium_c.FPDF_PAGEOBJ_IMAGE]):
        width, height = image_object.get_px_size()
        if width < MIN_IMAGE_PX or height < MIN_IMAGE_PX:
            continue
        bbox = frame.rect(*_page_bounds(image_object))
        if bbox[2] - bbox[0] <= 0 or bbox[3] - bbox[1] <= 0:
            continue  # drawn outside the visible page
        encoded = _encode_image(image_object)
        if encoded is None:
            continue
        data, mime, width, height = encoded
        index += 1
        yield (
            bbox,
            DocumentImage(
                url=f"{file_name}#page={page_number}&image={index}",
                name=f"page-{page_number}-image-{index}.{_EXTENSIONS[mime]}",
                mime=mime,
                data=data,
                width=width,
                height=height,
                location=Location(page=page_number, bbox=bbox),
            ),
        )


def _page_bounds(image_object: pdfium.PdfImage) -> tuple[float, float, float, float]:
    """Object bounds in page user space: pdfium reports nested objects in their Form XObject's space."""
    left, bottom, right, top = image_object.get_bounds()
    container = image_object.container
    while container is not None:
        left, bottom, right, top = container.get_matrix().on_rect(left, bottom, right, top)
        container = container.container
    return left, bottom, right, top


def _encode_image(image_object: pdfium.PdfImage) -> tuple[bytes, str, int, int] | None:
    """JPEG streams are kept as they are (when browsers can show them); everything else becomes PNG."""
    try:
        filters = image_object.get_filters(skip_simple=True)
    except UnicodeDecodeError:  # a damaged filter name: pypdfium2 decodes it as UTF-8
        filters = []
    if filters == ["DCTDecode"]:
        data = bytes(image_object.get_data(decode_simple=True))
        try:
            with Image.open(io.BytesIO(data)) as jpeg:
                if jpeg.format == "JPEG" and jpeg.mode in ("RGB", "L"):
                    return data, "image/jpeg", jpeg.width, jpeg.height
        except (OSError, ValueError):
            pass  # not a self-contained JPEG; let pdfium decode it
    try:
        picture = image_object.get_bitmap(render=False).to_pil()
    except pdfium.PdfiumError:
        return None  # an image pdfium cannot decode is skipped, not fatal for the document
    if picture.width < MIN_IMAGE_PX or picture.height < MIN_IMAGE_PX:
        return None
    return _encode(picture)


def _raster_scale(page: pdfium.PdfPage, frame: _PageFrame) -> float | None:
    """Pixels per point of the raster image(s) covering most of the page, if any: a slide saved as
    one picture, a scan. Rendering finer than that only interpolates: OCR gets no more detail, just
    more pixels to read (a 1024-px slide rendered at 200 dpi, then sharpened, was 17x the pixels)."""
    scales = []
    for image_object in page.get_objects(filter=[pdfium_c.FPDF_PAGEOBJ_IMAGE]):
        left, top, right, bottom = frame.rect(*_page_bounds(image_object))
        area = max(right - left, 0.0) * max(bottom - top, 0.0)
        if area >= RASTER_PAGE_SHARE * frame.width * frame.height:
            width, height = image_object.get_px_size()
            scales.append(math.sqrt(width * height / area))
    return max(scales) if scales else None


def _render_page(page: pdfium.PdfPage, frame: _PageFrame, page_number: int, file_name: str) -> DocumentImage:
    """The whole page as one image for OCR: ~200 dpi, or the resolution of the picture the page is
    when that is coarser (never under 72 dpi); long side capped so huge pages stay affordable."""
    scale = min(PAGE_RENDER_DPI / 72, PAGE_RENDER_MAX_SIDE / max(frame.width, frame.height, 1.0))
    raster = _raster_scale(page, frame)
    if raster is not None:
        scale = min(scale, max(1.0, raster))
    data, mime, width, height = _encode(page.render(scale=scale).to_pil(), photo=True)
    return DocumentImage(
        url=f"{file_name}#page={page_number}",
        name=f"page-{page_number}.{_EXTENSIONS[mime]}",
        mime=mime,
        data=data,
        width=width,
        height=height,
        location=Location(page=page_number, bbox=frame.box),
        is_page_image=True,
    )


def _encode(picture: Image.Image, photo: bool = False) -> tuple[bytes, str, int, int]:
    """PNG (grey when the picture has no colour: 3x smaller, faster); JPEG for colour page renders,
    where PNG costs 14x the encoding time of JPEG and the pixels came from a rendering anyway."""
    if picture.mode not in ("1", "L", "RGB"):
        picture = picture.convert("RGB")
    if picture.mode == "RGB" and _is_grey(picture):
        picture = picture.convert("L")
    buffer = io.BytesIO()
    if photo and picture.mode == "RGB":
        picture.save(buffer, format="JPEG", quality=90)
        mime = "image/jpeg"
    else:
        picture.save(buffer, format="PNG", compress_level=1)  # level 1: several times faster, ~2% larger
        mime = "image/png"
    return buffer.getvalue(), mime, picture.width, picture.height


def _is_grey(picture: Image.Image) -> bool:
    """All three channels agree on an 8x reduced copy (cheap, and colour survives the averaging)."""
    thumbnail = picture.reduce(8) if min(picture.size) >= 16 else picture
    red, green, blue = thumbnail.split()
    return (
        ImageChops.difference(red, green).getbbox() is None
        and ImageChops.difference(green, blue).getbbox() is None
    )


def _caption(image_bbox: BBox, blocks: list[_Block], lines: list[_Line]) -> str:
    """A "Figure N ..." paragraph just above/below the image, else the nearest line within ~40 pt."""
    figure_blocks = [
        (gap, block)
        for block in blocks
        if (gap := _vertical_gap(image_bbox, block.bbox)) is not None
        and gap <= CAPTION_BLOCK_MAX_GAP
        and CAPTION_START.match(block.text)
    ]
    if figure_blocks:
        return min(figure_blocks, key=lambda item: item[0])[1].text.replace("\n", " ")
    near_lines = [
        (gap, line)
        for line in lines
        if (gap := _vertical_gap(image_bbox, line.bbox)) is not None and gap <= CAPTION_LINE_MAX_GAP
    ]
    return min(near_lines, key=lambda item: item[0])[1].text if near_lines else ""


def _vertical_gap(image_bbox: BBox, text_bbox: BBox) -> float | None:
    """Distance from the image to text directly above or below it (sharing some width), else None."""
    if min(image_bbox[2], text_bbox[2]) - max(image_bbox[0], text_bbox[0]) <= 0:
        return None
    if text_bbox[1] >= image_bbox[3] - 2:
        return text_bbox[1] - image_bbox[3]
    if text_bbox[3] <= image_bbox[1] + 2:
        return image_bbox[1] - text_bbox[3]
    return None


def _context(image_bbox: BBox, blocks: list[_Block]) -> str:
    """Up to 300 characters of the page's text closest to the image, in reading order."""
    by_distance = sorted(blocks, key=lambda block: _distance(image_bbox, block.bbox))
    chosen: list[tuple[_Block, str]] = []
    budget = CONTEXT_MAX_CHARS
    for block in by_distance:
        if budget <= 0:
            break
        text = " ".join(block.text.split())[:budget]
        chosen.append((block, text))
        budget -= len(text) + 1
    chosen.sort(key=lambda item: (item[0].bbox[1], item[0].bbox[0]))
    return " ".join(text for _, text in chosen)[:CONTEXT_MAX_CHARS]


def _distance(a: BBox, b: BBox) -> float:
    dx = max(b[0] - a[2], a[0] - b[2], 0.0)
    dy = max(b[1] - a[3], a[1] - b[3], 0.0)
    return (dx * dx + dy * dy) ** 0.5


def _union(a: BBox, b: BBox) -> BBox:
    return (min(a[0], b[0]), min(a[1], b[1]), max(a[2], b[2]), max(a[3], b[3]))


def _union_all(boxes: list[BBox]) -> BBox:
    return (
        min(b[0] for b in boxes),
        min(b[1] for b in boxes),
        max(b[2] for b in boxes),
        max(b[3] for b in boxes),
    )


def _set_char_spans(elements: list[Element]) -> None:
    """Offsets into LoadedDocument.text, the blank-line join of the non-image elements."""
    offset = 0
    for element in elements:
        if element.kind == "image":
            continue
        element.location.char_span = (offset, offset + len(element.text))
        offset += len(element.text) + 2


def _metadata(pdf: pdfium.PdfDocument) -> dict[str, str]:
    """The info dictionary without empty entries, dates as ISO 8601 when they parse, plus the PDF version."""
    metadata = {}
    for key, value in pdf.get_metadata_dict(skip_empty=True).items():
        value = value.strip()
        if value:
            metadata[key] = _iso_date(value) if key.endswith("Date") else value
    version = pdf.get_version()
    if version:
        metadata["PDFVersion"] = f"{version // 10}.{version % 10}"
    return metadata


_PDF_DATE = re.compile(r"^D:(\d{4})(\d{2})?(\d{2})?(\d{2})?(\d{2})?(\d{2})?(Z|[+-]\d{2}'?\d{2})?", re.I)


def _iso_date(value: str) -> str:
    """D:20240822125427Z00'00' -> 2024-08-22T12:54:27Z; anything else is kept verbatim."""
    match = _PDF_DATE.match(value)
    if not match:
        return value
    year, month, day, hour, minute, second, zone = match.groups()
    iso = f"{year}-{month or '01'}-{day or '01'}T{hour or '00'}:{minute or '00'}:{second or '00'}"
    if not zone:
        return iso
    zone = zone.upper().replace("'", "")
    return iso + ("Z" if zone == "Z" else f"{zone[:3]}:{zone[3:]}")


def _is_real_title(title: str, path: Path) -> bool:
    """Producers often leave a file name ("scan.jpg", "Microsoft Word - x.docx", the file's own
    stem) or a stub as Title."""
    return (
        sum(char.isalpha() for char in title) >= 3
        and not _FILE_NAME.search(title)
        and title.strip().casefold() != path.stem.casefold()
    )


_FILE_NAME = re.compile(r"\.[A-Za-z][A-Za-z0-9]{1,3}$")


def _first_heading(blocks: list[_Block]) -> str:
    """The largest-font paragraph of the first text page, when it stands out from the body text."""
    text_blocks = [block for block in blocks if block.lines]
    worded = [block for block in text_blocks if sum(char.isalpha() for char in block.text) >= 3]
    if not worded:
        return ""
    body_size = statistics.median(line.font_size for block in text_blocks for line in block.lines)
    heading = max(worded, key=lambda block: block.font_size)
    if heading.font_size < 1.2 * body_size:
        return ""
    return " ".join(heading.text.split())[:200]
