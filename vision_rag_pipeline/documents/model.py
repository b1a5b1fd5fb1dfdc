"""One document model for every loader: ordered elements with their place in the source.

MHTML elements carry a char span into the document's plain text (`LoadedDocument.text`,
the elements' texts joined by blank lines); PDF elements carry a page (1-based) and a bbox in
PDF points with a top-left origin (x0, y0, x1, y1). Images carry their bytes until the
`extracted_images` asset moves them into the content-addressed store.
"""

from __future__ import annotations

import hashlib
from typing import Any, Literal

from pydantic import BaseModel, Field

BBox = tuple[float, float, float, float]
ElementKind = Literal["text", "table", "image"]


class Location(BaseModel):
    page: int | None = None
    bbox: BBox | None = None
    char_span: tuple[int, int] | None = None


class ImageInfo(BaseModel):
    """What the document says about an image, without its bytes."""

    url: str  # Content-Location / cid: for MHTML, `<file name>#page=N&image=I` for PDF
    name: str  # short file-like name for [Source]: <document>/<image name>
    mime: str
    alt: str = ""
    title: str = ""
    caption: str = ""  # figcaption / nearby "Figure N" line
    context: str = ""  # text just before and after the image
    width: int | None = None
    height: int | None = None
    location: Location = Field(default_factory=Location)
    is_page_image: bool = False  # a PDF page with no text layer, rendered so it can be OCR'd
    text_layer: str = ""  # PDF: the invisible text over this image (a scan's OCR layer), read instead of OCR


class DocumentImage(ImageInfo):
    """An image as found in the document: its bytes plus what the page says about it."""

    data: bytes = Field(repr=False)

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.data).hexdigest()


class Element(BaseModel):
    """A block of the document in reading order. Image elements point at `LoadedDocument.images`."""

    kind: ElementKind
    text: str = ""  # for tables: the table as Markdown; for images: empty (filled at chunking)
    location: Location = Field(default_factory=Location)
    image_index: int | None = None


class PageInfo(BaseModel):
    """What a reader calls a page: the label a PDF viewer shows for it (its /PageLabels entry, "iv" or
    "12"; empty where the file has none) and the page numbers printed in its header or footer (two on
    a printed spread). A question about "page 12" means one of these, not the page's index in the file,
    which differs wherever a document has a cover, front matter or pages cut out of a longer one."""

    number: int  # 1-based index in the file
    label: str = ""
    printed: list[str] = Field(default_factory=list)

    @property
    def names(self) -> list[str]:
        """Every number a reader may call this page by: its label (its index where it has none) and
        the numbers printed on it."""
        return list(dict.fromkeys([self.label or str(self.number), *self.printed]))


class LoadedDocument(BaseModel):
    source_path: str
    mime: Literal["multipart/related", "application/pdf"]
    sha256: str = ""  # of the file's bytes: decides whether a document changed
    size: int = 0
    title: str = ""
    metadata: dict[str, Any] = Field(default_factory=dict)  # MHTML headers, X-Metadata, PDF info
    elements: list[Element] = Field(default_factory=list)
    images: list[DocumentImage] = Field(default_factory=list)
    pages: int | None = None
    page_info: list[PageInfo] = Field(default_factory=list)  # PDF: one per page, in order

    @property
    def text(self) -> str:
        """The plain text MHTML char spans index into (image elements contribute nothing)."""
        return "\n\n".join(e.text for e in self.elements if e.kind != "image")


class DocumentError(Exception):
    """A file that cannot be loaded; the message is one line naming the reason."""


class DocumentBudgetError(DocumentError):
    """A document past one of `limits.documents`; the message names the file and the setting."""
