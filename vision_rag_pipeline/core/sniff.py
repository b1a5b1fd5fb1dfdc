"""Recognise files and image payloads by their bytes, because names and declared types lie.

Browsers save images under `application/octet-stream`, servers send PNGs as `image/jpeg`, and users
rename `.mht` files to `.html`; the loaders and the CLI trust magic bytes over labels. Images sent
inline (base64 or `data:` URLs, to the HTTP API and the media-enrichment operation) are decoded here.
"""

from __future__ import annotations

import base64
import binascii
import re
from pathlib import Path
from typing import Literal

SVG_MIMES = frozenset({"image/svg+xml", "image/svg"})
_BMP_DIB_HEADER_SIZES = {12, 40, 52, 56, 64, 108, 124}
_SVG_ROOT = re.compile(rb"<svg[\s>/]", re.IGNORECASE)
_XML_PROLOGUE = re.compile(
    rb"\A(?:<\?xml[^>]*>|<!--.*?-->|<!DOCTYPE[^>]*>|\s)*<svg[\s>/]", re.IGNORECASE | re.DOTALL
)

_MHTML_MARKERS = (
    re.compile(rb"^content-type:[ \t]*multipart/related", re.IGNORECASE | re.MULTILINE),
    re.compile(rb"^from:[ \t]*<saved by ", re.IGNORECASE | re.MULTILINE),
)
_MIME_VERSION = re.compile(rb"^mime-version:[ \t]*1\.0", re.IGNORECASE | re.MULTILINE)
_HTML_CONTENT_TYPE = re.compile(rb"^content-type:[ \t]*text/html", re.IGNORECASE | re.MULTILINE)


def sniff_image_mime(data: bytes) -> str | None:
    """The image type the bytes really are (PNG, JPEG, GIF, WebP, BMP, TIFF, ICO, AVIF, SVG), else None."""
    head = data[:32]
    if head.startswith(b"\x89PNG\r\n\x1a\n"):
        return "image/png"
    if head.startswith(b"\xff\xd8\xff"):
        return "image/jpeg"
    if head[:6] in (b"GIF87a", b"GIF89a"):
        return "image/gif"
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "image/webp"
    if (
        head[:2] == b"BM"
        and len(head) >= 18
        and int.from_bytes(head[14:18], "little") in _BMP_DIB_HEADER_SIZES
    ):
        return "image/bmp"
    if head[:4] in (b"II*\x00", b"MM\x00*"):
        return "image/tiff"
    if head[:4] in (b"\x00\x00\x01\x00", b"\x00\x00\x02\x00") and len(head) >= 6 and head[4:6] != b"\x00\x00":
        return "image/x-icon"
    if head[4:12] in (b"ftypavif", b"ftypavis"):
        return "image/avif"
    return _sniff_svg(data)


def is_svg(data: bytes, mime: str = "") -> bool:
    """By declared type, or by content for SVG saved under a generic type (octet-stream)."""
    return mime.split(";")[0].strip().lower() in SVG_MIMES or _sniff_svg(data) is not None


def image_mime(data: bytes, declared: str = "") -> str | None:
    """The real image type of a payload; a declared image/* is believed only when the bytes say nothing."""
    if not data:
        return None
    return sniff_image_mime(data) or (declared if declared.startswith("image/") else None)


def _sniff_svg(data: bytes) -> str | None:
    """SVG is XML text: the first element (after prologue, comments, doctype) must be <svg>."""
    head = data[:4096].lstrip(b"\xef\xbb\xbf")
    if _XML_PROLOGUE.match(head) or (head.lstrip().startswith(b"<?xml") and _SVG_ROOT.search(head)):
        return "image/svg+xml"
    return None


def sniff_document_kind(path: str | Path) -> Literal["mhtml", "pdf"] | None:
    """Which loader a file needs judging by its first KB, or None when it is neither an MHTML nor a PDF."""
    with open(path, "rb") as handle:
        return _document_kind(handle.read(1024))


def _document_kind(head: bytes) -> Literal["mhtml", "pdf"] | None:
    if head.lstrip(b"\xef\xbb\xbf \t\r\n").startswith(b"%PDF-"):
        return "pdf"
    if any(marker.search(head) for marker in _MHTML_MARKERS):
        return "mhtml"
    if _MIME_VERSION.search(head) and _HTML_CONTENT_TYPE.search(head):
        return "mhtml"
    if b"%PDF-" in head:  # PDF readers accept junk before the header within the first KB
        return "pdf"
    return None


_NOT_DOCUMENTS = (
    (b"PK\x03\x04", "a ZIP archive (a Word, Excel or PowerPoint file?)"),
    (b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1", "an old Office file (Word 97-2003?)"),
    (b"{\\rtf", "an RTF document"),
    (b"\x89PNG", "a PNG image"),
    (b"\xff\xd8\xff", "a JPEG image"),
)


def why_not_a_document(path: str | bytes | Path) -> str | None:
    """One line saying why a file named like a document is not one (empty, or what its bytes are), or
    None when it is an MHTML web archive or a PDF."""
    with open(path, "rb") as handle:
        head = handle.read(1024)
    if not head:
        return "empty file"
    if _document_kind(head) is not None:
        return None
    what = next((name for magic, name in _NOT_DOCUMENTS if head.startswith(magic)), None)
    return f"{what}, not an MHTML web archive or a PDF" if what else "not an MHTML web archive or a PDF"


class ImagePayloadError(ValueError):
    """A base64 image or data: URL that cannot be decoded; `too_large` when only its size is wrong."""

    def __init__(self, message: str, too_large: bool = False) -> None:
        super().__init__(message)
        self.too_large = too_large


def decode_image_payload(value: str, max_bytes: int) -> tuple[bytes, str | None]:
    """The bytes of a base64 string or a base64 `data:` URL, and the URL's declared type (else None).

    The size is judged from the encoded length before anything is decoded, so an oversized payload
    costs no memory beyond the request itself.
    """
    declared = None
    if value.startswith("data:"):
        header, sep, value = value.partition(",")
        if not (sep and header.endswith(";base64")):
            raise ImagePayloadError("a data: URL must be base64 encoded (data:<type>;base64,<data>)")
        declared = header[len("data:") : -len(";base64")].split(";")[0].strip().lower() or None
    if len(value) // 4 * 3 > max_bytes + 3:
        raise ImagePayloadError(f"about {len(value) // 4 * 3:,} bytes, over the {_mb(max_bytes)} limit", True)
    try:
        data = base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError) as exc:  # ValueError: non-ASCII characters
        raise ImagePayloadError(f"invalid base64: {exc}") from None
    if len(data) > max_bytes:
        raise ImagePayloadError(f"{len(data):,} bytes, over the {_mb(max_bytes)} limit", True)
    return data, declared


def _mb(size: int) -> str:
    return f"{size / 2**20:g} MB"
