"""Load MHTML web archives (browser "Save as MHTML", Word "Single File Web Page") into a LoadedDocument.

The archive is a multipart/related MIME message: one text/html root part, more html parts for frames,
and the resources (images, CSS, fonts) each under its Content-Location and/or Content-ID. The loader
reads the root page in reading order and inlines frame documents where their iframe stands, so the
elements are what a reader of the saved page sees: headings as `# ...`, list items as `- ...`, data
tables as Markdown, and one image element wherever the page shows an image saved in the archive.

Choices worth knowing downstream:
- An image referenced twice gives two image elements sharing one `DocumentImage` (same index); the
  entry's location, context and caption come from the first reference.
- An image element's char span is zero-width at the offset in `LoadedDocument.text` where the image
  stands: inside its paragraph for inline images, at the end of the preceding text between blocks.
- A Word picture is written twice (VML `<v:imagedata>` in a conditional comment plus an `<img>`
  fallback); the `<img>` is used and the VML source only when the fallback is missing.
- `data:` URI images are kept; their `url` is `data:<mime>;sha256=<digest prefix>`, not the URI itself.
- Images the page only uses from CSS (backgrounds, sprites) are not elements: there is no place in
  the text where they stand.
- `metadata` keys: subject, date, from, snapshot_content_location, x_metadata (parsed JSON or the raw
  string), content_location (of the root page); absent headers are left out.
"""

from __future__ import annotations

import base64
import binascii
import codecs
import email
import email.errors
import email.header
import hashlib
import io
import json
import re
from dataclasses import dataclass, field
from email.message import Message
from pathlib import Path
from typing import Any
from urllib.parse import unquote, unquote_to_bytes, urljoin, urlsplit

from bs4 import BeautifulSoup, Comment, NavigableString, Tag
from bs4.dammit import UnicodeDammit
from bs4.element import PreformattedString
from PIL import Image

from vision_rag_pipeline.core.config import DocumentLimits
from vision_rag_pipeline.core.sniff import image_mime
from vision_rag_pipeline.documents.model import (
    DocumentBudgetError,
    DocumentError,
    DocumentImage,
    Element,
    LoadedDocument,
    Location,
)

_HTML_TYPES = frozenset({"text/html", "application/xhtml+xml"})
_SKIP_TAGS = frozenset(
    {
        "head", "title", "script", "style", "noscript", "template", "svg", "math", "meta", "link", "base",
        "select", "datalist", "option", "textarea", "button", "canvas", "audio", "video", "map", "area",
        "noframes", "param", "source", "track",
    }
)  # fmt: skip
_BLOCK_TAGS = frozenset(
    {
        "address", "article", "aside", "blockquote", "body", "caption", "center", "dd", "details", "dialog",
        "div", "dl", "dt", "fieldset", "figcaption", "footer", "form", "frameset", "header", "hgroup",
        "html", "legend", "main", "menu", "nav", "ol", "p", "section", "summary", "table", "tbody", "td",
        "tfoot", "th", "thead", "tr", "ul",
    }
)  # fmt: skip
_HEADING_LEVELS = {f"h{level}": level for level in range(1, 7)}
_IMAGE_TAGS = frozenset({"img", "picture", "input", "object", "embed"})
_BLOCKS_THAT_MAKE_A_LAYOUT_TABLE = ["table", "h1", "h2", "h3", "h4", "h5", "h6", "blockquote",
                                    "pre", "form", "iframe", "figure"]  # fmt: skip
_LAZY_SOURCE_ATTRIBUTES = ("data-src", "data-lazy-src", "data-original", "data-srcset", "data-lazy-srcset")

_IMAGE_MARK = "\x00"  # stands in the text buffer where an inline image occurs
_LINE_BREAK = "\x01"  # stands in the text buffer for <br> and preformatted newlines
_CONTROL_MARKS = str.maketrans("", "", _IMAGE_MARK + _LINE_BREAK)
_WHITESPACE = re.compile(r"\s+")
_BREAKS = re.compile(r"[ \x01]*\x01[ \x01]*")
_PRE_PARAGRAPH = re.compile(r"\n[^\S\n]*\n")
_HIDDEN_STYLE = re.compile(r"display\s*:\s*none|visibility\s*:\s*hidden", re.IGNORECASE)
_META_CHARSET = re.compile(rb"<meta[^>]+charset\s*=\s*[\"']?\s*([A-Za-z0-9._:-]+)", re.IGNORECASE)
_HEADER_LINE = re.compile(rb"^[!-9;-~]+:")
_BOUNDARY = re.compile(rb"boundary\s*=\s*\"?([^\"\r\n;]+)\"?", re.IGNORECASE)
_VML_SHAPE = re.compile(r"<v:shape\b([^>]*)>(.*?)</v:shape>", re.IGNORECASE | re.DOTALL)
_VML_ID = re.compile(r"\bid=\"([^\"]+)\"", re.IGNORECASE)
_VML_IMAGEDATA = re.compile(r"<v:imagedata\b[^>]*?\bsrc=\"([^\"]+)\"", re.IGNORECASE)
_SVG_TAG = re.compile(rb"<svg\b[^>]*>", re.IGNORECASE | re.DOTALL)
_SVG_LENGTH = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*(px)?\s*$")

_CODEC_ALIASES = {  # what browsers really decode these labels as (WHATWG encoding standard)
    "gb2312": "gb18030", "gbk": "gb18030", "x-gbk": "gb18030", "gb_2312-80": "gb18030",
    "iso-8859-1": "windows-1252", "latin1": "windows-1252", "us-ascii": "windows-1252",
    "ascii": "windows-1252", "big5": "big5hkscs", "shift_jis": "cp932", "x-sjis": "cp932",
    "euc-kr": "cp949", "ks_c_5601-1987": "cp949",
    "utf-16": "utf-8", "utf-16le": "utf-8", "utf-16be": "utf-8",  # a <meta> cannot be read in UTF-16
}  # fmt: skip
_IMAGE_EXTENSIONS = {
    "image/png": "png", "image/jpeg": "jpg", "image/gif": "gif", "image/webp": "webp", "image/bmp": "bmp",
    "image/tiff": "tif", "image/x-icon": "ico", "image/avif": "avif", "image/svg+xml": "svg",
}  # fmt: skip
_CONTEXT_CHARS = 300
_MAX_FRAME_DEPTH = 8
_MAX_FRAMES = 256


def load_mhtml(path: str | Path, limits: DocumentLimits | None = None) -> LoadedDocument:
    """Read an MHTML file into elements in reading order plus the images it shows; `limits` bound
    its size, its parts' and how deeply its multipart bodies nest (the defaults when None)."""
    path = Path(path)
    limits = limits or DocumentLimits()
    try:
        if path.stat().st_size > limits.max_document_bytes:
            raise DocumentBudgetError(
                f"{path.name}: {path.stat().st_size:,} bytes, more than {limits.max_document_bytes:,} "
                "(limits.documents.max_document_bytes)"
            )
        raw = path.read_bytes()
    except OSError as exc:
        raise DocumentError(f"{path.name}: cannot read file ({exc.strerror or exc})") from exc
    if not raw.strip():
        raise DocumentError(f"{path.name}: empty file")
    depth = multipart_depth(raw, limits.max_mhtml_depth)
    if depth > limits.max_mhtml_depth:
        raise DocumentBudgetError(
            f"{path.name}: multipart bodies nested more than {limits.max_mhtml_depth} deep "
            "(limits.documents.max_mhtml_depth)"
        )
    try:
        archive = _Archive.parse(raw, path.name, limits)
        reader = _PageReader(archive)
        soup = reader.read()
    except RecursionError:  # a limit raised past what the parser's stack holds
        raise DocumentError(f"{path.name}: nested too deeply to parse") from None
    title = _collapse(soup.title.get_text()) if soup.title else ""
    metadata = _archive_metadata(archive)
    return LoadedDocument(
        source_path=str(path),
        mime="multipart/related",
        title=title or metadata.get("subject", ""),
        metadata=metadata,
        elements=reader.elements,
        images=reader.images,
    )


@dataclass
class _Part:
    """One leaf of the MIME tree with its body already transfer-decoded."""

    content_type: str
    charset: str | None
    location: str | None
    cid: str | None
    data: bytes

    @property
    def url(self) -> str:
        return self.location or f"cid:{self.cid}"


class _Archive:
    """The parts of an MHTML message, findable by URL the way the saved page references them."""

    def __init__(self, message: Message, name: str, limits: DocumentLimits):
        self.message = message
        self.parts: list[_Part] = []
        self._by_location: dict[str, _Part] = {}
        self._by_folded_location: dict[str, _Part] = {}
        self._by_cid: dict[str, _Part] = {}
        decoded = 0
        for leaf in message.walk():
            if leaf.is_multipart():
                continue
            part = _Part(
                content_type=leaf.get_content_type(),
                charset=leaf.get_content_charset(),
                location=_header_text(leaf, "Content-Location") or None,
                cid=(_header_text(leaf, "Content-ID").strip("<> ") or None),
                data=_payload_bytes(leaf),
            )
            decoded += len(part.data)
            if len(part.data) > limits.max_stream_bytes or decoded > limits.max_document_bytes:
                setting = (
                    "max_stream_bytes" if len(part.data) > limits.max_stream_bytes else "max_document_bytes"
                )
                raise DocumentBudgetError(
                    f"{name}: its parts decode to more than {getattr(limits, setting):,} bytes "
                    f"{'in one part' if setting == 'max_stream_bytes' else 'together'} (limits.documents.{setting})"
                )
            self.parts.append(part)
            if part.location:
                key = part.location.split("#", 1)[0]
                self._by_location.setdefault(key, part)
                self._by_location.setdefault(unquote(key), part)
                self._by_folded_location.setdefault(unquote(key).lower(), part)
            if part.cid:
                self._by_cid.setdefault(part.cid, part)
        self.root = self._root_part()
        if self.root is None:
            raise DocumentError(f"{name}: no text/html part in the archive")

    @classmethod
    def parse(cls, raw: bytes, name: str, limits: DocumentLimits) -> _Archive:
        message = email.message_from_bytes(raw)
        if not (message.is_multipart() or message.get_content_type() in _HTML_TYPES):
            message = _reparse_broken_headers(raw) or message
        if not (message.is_multipart() or message.get_content_type() in _HTML_TYPES):
            raise DocumentError(f"{name}: not an MHTML archive (no multipart/related MIME structure)")
        return cls(message, name, limits)

    def _root_part(self) -> _Part | None:
        start = self.message.get_param("start") if self.message.is_multipart() else None
        if isinstance(start, str) and (part := self._by_cid.get(start.strip("<> "))):
            return part
        return next((part for part in self.parts if part.content_type in _HTML_TYPES), None)

    def find(self, url: str, base: str) -> _Part | None:
        """The part a page reference points at (cid:, absolute or relative URL), if it was saved."""
        url = url.strip()
        if not url or url.startswith("data:"):
            return None
        if url[:4].lower() == "cid:":
            return self._by_cid.get(unquote(url[4:]).strip("<> "))
        absolute = _joined(base, url) if base else url
        for candidate in (absolute, url):
            key = candidate.split("#", 1)[0]
            if part := self._by_location.get(key) or self._by_location.get(unquote(key)):
                return part
        return self._by_folded_location.get(unquote(absolute.split("#", 1)[0]).lower())


def _joined(base: str, url: str) -> str:
    """`url` resolved against `base`; as it stands when either does not parse (`https://[host`,
    which urllib takes for a broken IPv6 address)."""
    try:
        return urljoin(base, url)
    except ValueError:
        return url


def _url_path(url: str) -> str:
    try:
        return urlsplit(url).path
    except ValueError:
        return url


def _payload_bytes(leaf: Message) -> bytes:
    payload = leaf.get_payload(decode=True)
    return payload if isinstance(payload, bytes) else b""


# a multipart Content-Type header (folded lines included) and the boundary it declares
_MULTIPART_HEADER = re.compile(
    rb"^content-type:[ \t]*multipart/[^\r\n]*(?:\r?\n[ \t][^\r\n]*)*", re.IGNORECASE | re.MULTILINE
)
_BOUNDARY_PARAMETER = re.compile(rb"boundary\s*=\s*(?:\"([^\"\r\n]+)\"|([^\s;\"]+))", re.IGNORECASE)
_DELIMITER_LINE = re.compile(rb"^--([^\r\n]+?)[ \t]*\r?$", re.MULTILINE)


def multipart_depth(raw: bytes, limit: int) -> int:
    """How deeply the archive's multipart bodies nest, read from the bytes before the MIME parser
    (which recurses once a level) sees them; counting stops past `limit`.

    A body opens where its boundary is declared and closes at its closing delimiter, or at a
    delimiter of a body around it (a part that ends its parent ends its children)."""
    declared = (
        (header.start(), False, found.group(1) or found.group(2))
        for header in _MULTIPART_HEADER.finditer(raw)
        if (found := _BOUNDARY_PARAMETER.search(header.group(0)))
    )
    delimiters = ((line.start(), True, line.group(1)) for line in _DELIMITER_LINE.finditer(raw))
    events = sorted([*declared, *delimiters])
    open_bodies: list[bytes] = []
    deepest = 0
    for _, delimiter, value in events:
        if not delimiter:
            open_bodies.append(value.strip())
            deepest = max(deepest, len(open_bodies))
            if deepest > limit:
                break
            continue
        closing = value.endswith(b"--") and value[:-2].strip() in open_bodies
        boundary = value[:-2].strip() if closing else value.strip()
        if boundary in open_bodies:
            level = len(open_bodies) - 1 - open_bodies[::-1].index(boundary)
            del open_bodies[level if closing else level + 1 :]
    return deepest


def _reparse_broken_headers(raw: bytes) -> Message | None:
    """Recover archives whose top header is broken so `email` sees no multipart body.

    Seen in real saves: a folded header continued without leading whitespace ends the header block
    early. First refold such lines; failing that, rebuild the header from the boundary parameter.
    """
    header_end = re.search(rb"\r?\n\r?\n", raw)
    split_at = header_end.start() if header_end else len(raw)
    lines = raw[:split_at].split(b"\n")
    refolded = [
        line if line[:1] in (b" ", b"\t") or _HEADER_LINE.match(line) else b" " + line for line in lines
    ]
    if refolded != lines:
        message = email.message_from_bytes(b"\n".join(refolded) + raw[split_at:])
        if message.is_multipart():
            return message
    found = _BOUNDARY.search(raw[:16384])
    if not found:
        return None
    boundary = found.group(1).strip()
    first = raw.find(b"--" + boundary)
    if first < 0:
        return None
    header = b'MIME-Version: 1.0\r\nContent-Type: multipart/related; boundary="' + boundary + b'"\r\n\r\n'
    message = email.message_from_bytes(header + raw[first:])
    if not message.is_multipart():
        return None
    original = email.message_from_bytes(raw)  # keep what headers survived (Subject, Date, From, ...)
    for key, value in original.items():
        if key.lower() not in ("content-type", "mime-version"):
            message[key] = value
    return message


def _header_text(message: Message, name: str) -> str:
    """A header as readable text: RFC 2047 words decoded, raw 8-bit taken as UTF-8, never raising on junk."""
    value = message.get(name)
    if value is None:
        return ""
    if isinstance(value, str):
        value = re.sub(r"\r?\n(?=[ \t])", "", value)
    try:
        chunks = email.header.decode_header(value)
    except email.errors.HeaderParseError:
        return str(value).strip()
    pieces = []
    for chunk, charset in chunks:
        if isinstance(chunk, str):
            pieces.append(chunk)
        elif codec := _codec(charset):
            pieces.append(chunk.decode(codec, errors="replace"))
        else:  # raw 8-bit header: UTF-8 when it fits, else what Windows tools wrote
            try:
                pieces.append(chunk.decode("utf-8"))
            except UnicodeDecodeError:
                pieces.append(chunk.decode("windows-1252", errors="replace"))
    return "".join(pieces).strip()


def _archive_metadata(archive: _Archive) -> dict[str, Any]:
    message = archive.message
    metadata: dict[str, Any] = {}
    for header in ("Subject", "Date", "From", "Snapshot-Content-Location"):
        if value := _header_text(message, header):
            metadata[header.lower().replace("-", "_")] = value
    if x_metadata := _header_text(message, "X-Metadata"):
        try:
            metadata["x_metadata"] = json.loads(x_metadata)
        except ValueError:
            metadata["x_metadata"] = x_metadata
    if archive.root.location:
        metadata["content_location"] = archive.root.location
    return metadata


def _codec(label: str | None) -> str | None:
    """The Python codec for a charset label as browsers interpret it, or None when unknown."""
    if not label:
        return None
    label = label.strip().strip("\"'").lower()
    try:
        name = codecs.lookup(_CODEC_ALIASES.get(label, label)).name
    except LookupError:
        return None
    return _CODEC_ALIASES.get(name, name)


def _decode_html(data: bytes, declared_charset: str | None) -> str:
    """HTML bytes as text: the part's charset, then the page's <meta>, then UTF-8, then detection.

    A declared charset that mostly fits wins even with a few bad bytes (they become U+FFFD); a label
    that does not fit at all is treated as a lie and the bytes are sniffed instead.
    """
    meta = _META_CHARSET.search(data[:8192])
    declared = [
        codec
        for label in (declared_charset, meta and meta.group(1).decode("ascii"))
        if (codec := _codec(label))
    ]
    for codec in declared:
        try:
            return data.decode(codec)
        except UnicodeDecodeError:
            text = data.decode(codec, errors="replace")
            if text.count("\ufffd") <= max(8, len(text) // 1000):
                return text
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        pass
    detected = UnicodeDammit(data, is_html=True).unicode_markup
    return (
        detected
        if detected is not None
        else data.decode(declared[0] if declared else "utf-8", errors="replace")
    )


@dataclass
class _Frame:
    """One HTML document being read (the root page or an inlined frame) and what its links resolve against."""

    base: str
    vml_shapes_with_img: set[str] = field(default_factory=set)  # Word shapes that also have an <img> fallback
    vml_sources: dict[str, str] = field(default_factory=dict)  # Word shape id -> VML imagedata src


@dataclass
class _Close:
    tag: str


@dataclass
class _MarkedBlock:
    """An open heading or list item: its blocks get a Markdown marker (a list item only on its first)."""

    tag: str
    marker_used: bool = False


@dataclass
class _FrameExit:
    part: _Part


@dataclass
class _ImageSource:
    key: str
    url: str
    data: bytes
    mime: str


class _PageReader:
    """Turns the root page (and the frames it embeds) into elements and images."""

    def __init__(self, archive: _Archive):
        self._archive = archive
        self.elements: list[Element] = []
        self.images: list[DocumentImage] = []
        self._image_index: dict[str, int] = {}
        self._taken_names: set[str] = set()
        self._buffer: list[str] = []
        self._pending_images: list[int] = []
        self._text_length = 0
        self._has_text = False
        self._marked_blocks: list[_MarkedBlock] = []
        self._pre_depth = 0
        self._captions: list[str] = []
        self._active_frames: list[_Part] = []
        self._frames_inlined = 0

    def read(self) -> BeautifulSoup:
        """Read the whole page; returns the root document's soup (for its <title>)."""
        root = self._archive.root
        soup, frame = self._open_document(root, base="")
        self._active_frames.append(root)
        self._walk(soup, frame)
        self._flush()
        self._fill_contexts()
        return soup

    def _open_document(self, part: _Part, base: str) -> tuple[BeautifulSoup, _Frame]:
        html = _decode_html(part.data, part.charset)
        soup = BeautifulSoup(html, "lxml")
        base = part.location or base
        if (base_tag := soup.find("base", href=True)) is not None:
            base = _joined(base, str(base_tag["href"]))
        frame = _Frame(base=base)
        if "imagedata" not in html:  # not a Word save: no VML pictures to pair with <img> fallbacks
            return soup, frame
        for img in soup.find_all("img", attrs={"v:shapes": True}):
            frame.vml_shapes_with_img.update(re.split(r"[\s,]+", str(img["v:shapes"]).strip()))
        for comment in soup.find_all(string=lambda text: isinstance(text, Comment) and "imagedata" in text):
            frame.vml_sources.update(_vml_images(str(comment)))
        return soup, frame

    def _walk(self, start: Tag, frame: _Frame) -> None:
        stack: list[tuple[Any, _Frame]] = [(child, frame) for child in reversed(start.contents)]
        while stack:
            item, frame = stack.pop()
            if isinstance(item, _Close):
                self._close(item.tag)
            elif isinstance(item, _FrameExit):
                self._flush()
                self._active_frames.remove(item.part)
            elif isinstance(item, Comment):
                self._vml_comment(str(item), frame)
            elif isinstance(item, PreformattedString):
                continue  # CDATA, doctype, processing instructions
            elif isinstance(item, NavigableString):
                self._add_text(str(item))
            elif isinstance(item, Tag):
                self._open(item, frame, stack)

    def _open(self, tag: Tag, frame: _Frame, stack: list[tuple[Any, _Frame]]) -> None:
        name = tag.name.lower()
        if name in _SKIP_TAGS or _is_hidden(tag):
            return
        if name in _IMAGE_TAGS:
            if self._image_tag(tag, frame) or name != "object":
                return  # an <object> that is not an image shows its fallback children
        elif name in ("iframe", "frame"):
            self._inline_frame(tag, frame, stack)
            return
        elif name == "table" and _is_data_table(tag):
            self._table(tag, frame)
            return
        elif name == "br":
            self._buffer.append(_LINE_BREAK)
            return
        elif name == "hr":
            self._flush()
            return
        elif name in _HEADING_LEVELS or name == "li":
            self._flush()
            self._marked_blocks.append(_MarkedBlock(name))
        elif name == "pre":
            self._flush()
            self._pre_depth += 1
        elif name == "figure":
            self._flush()
            caption = tag.find("figcaption")
            self._captions.append(_visible_text(caption) if caption is not None else "")
        elif name in _BLOCK_TAGS:
            self._flush()
        else:
            stack.extend((child, frame) for child in reversed(tag.contents))
            return
        stack.append((_Close(name), frame))
        stack.extend((child, frame) for child in reversed(tag.contents))

    def _close(self, name: str) -> None:
        self._flush()
        if name in _HEADING_LEVELS or name == "li":
            self._marked_blocks.pop()
        elif name == "pre":
            self._pre_depth -= 1
        elif name == "figure":
            self._captions.pop()

    def _add_text(self, text: str) -> None:
        text = text.translate(_CONTROL_MARKS)
        if not self._pre_depth:
            self._buffer.append(text)
            return
        for number, paragraph in enumerate(_PRE_PARAGRAPH.split(text)):
            if number:
                self._flush()
            self._buffer.append(paragraph.replace("\n", _LINE_BREAK))

    def _prefix(self) -> str:
        """Markdown marker for the block being flushed: `# ` for a heading, `- ` for a list item's first."""
        if not self._marked_blocks:
            return ""
        block = self._marked_blocks[-1]
        if block.tag in _HEADING_LEVELS:
            return "#" * _HEADING_LEVELS[block.tag] + " "
        if block.marker_used:
            return ""
        block.marker_used = True
        depth = sum(1 for open_block in self._marked_blocks if open_block.tag == "li")
        return "  " * (depth - 1) + "- "

    def _flush(self) -> None:
        """End the current block: emit its text element, then the images that occurred inside it."""
        if not self._buffer:
            return
        text, marks = _normalise_block("".join(self._buffer))
        self._buffer.clear()
        images, self._pending_images = self._pending_images, []
        if text:
            prefix = self._prefix()
            start = self._append_text(prefix + text, "text") + len(prefix)
            positions = [start + mark for mark in marks]
        else:
            positions = [self._text_length] * len(images)
        for index, position in zip(images, positions, strict=True):
            self.elements.append(
                Element(kind="image", location=Location(char_span=(position, position)), image_index=index)
            )
            if self.images[index].location.char_span is None:
                self.images[index].location = Location(char_span=(position, position))

    def _append_text(self, text: str, kind: str) -> int:
        start = self._text_length + (2 if self._has_text else 0)
        self.elements.append(
            Element(kind=kind, text=text, location=Location(char_span=(start, start + len(text))))
        )
        self._text_length = start + len(text)
        self._has_text = True
        return start

    def _table(self, table: Tag, frame: _Frame) -> None:
        self._flush()
        caption = table.find("caption", recursive=False)
        if caption is not None and (caption_text := _visible_text(caption)):
            self._append_text(caption_text, "text")
        if markdown := _table_markdown(table):
            self._append_text(markdown, "table")
        for image_tag in table.find_all(_IMAGE_TAGS):
            if image_tag.parent is not None and image_tag.parent.name == "picture":
                continue
            if not any(_is_hidden(ancestor) for ancestor in (image_tag, *image_tag.parents)):
                self._image_tag(image_tag, frame)
        self._flush()

    def _inline_frame(self, tag: Tag, frame: _Frame, stack: list[tuple[Any, _Frame]]) -> None:
        """Read the frame's document in place of the iframe, unless it is missing or already open (cycle)."""
        src = str(tag.get("src") or "")
        part = self._archive.find(src, frame.base) if src else None
        if (
            part is None
            or part.content_type not in _HTML_TYPES
            or any(open_part is part for open_part in self._active_frames)
            or len(self._active_frames) > _MAX_FRAME_DEPTH
            or self._frames_inlined >= _MAX_FRAMES
        ):
            return
        self._flush()
        self._frames_inlined += 1
        self._active_frames.append(part)
        soup, child_frame = self._open_document(part, frame.base)
        stack.append((_FrameExit(part), frame))
        stack.extend((child, child_frame) for child in reversed(soup.contents))

    def _vml_comment(self, comment: str, frame: _Frame) -> None:
        """Word pictures live in `<!--[if gte vml 1]>` comments; emit those without an <img> fallback."""
        if "imagedata" not in comment:
            return
        for shape_id, src in _vml_images(comment).items():
            if shape_id not in frame.vml_shapes_with_img:
                self._add_image([src], frame, alt="", title="")

    def _image_tag(self, tag: Tag, frame: _Frame) -> bool:
        """Emit the image an <img>, <picture>, <input type=image>, <object> or <embed> shows, if saved."""
        name = tag.name.lower()
        img = tag if name == "img" else tag.find("img") if name == "picture" else None
        if name == "img":
            candidates = _img_candidates(tag)
        elif name == "picture":
            candidates = _img_candidates(img) if img is not None else []
            for source in tag.find_all("source"):
                candidates += _srcset_urls(str(source.get("srcset") or source.get("src") or ""))
        elif name == "input":
            candidates = [str(tag.get("src") or "")] if str(tag.get("type", "")).lower() == "image" else []
        else:
            candidates = [str(tag.get("data" if name == "object" else "src") or "")]
        if img is not None:
            for shape_id in re.split(r"[\s,]+", str(img.get("v:shapes") or "").strip()):
                if shape_id in frame.vml_sources:
                    candidates.append(frame.vml_sources[shape_id])
        described = img if img is not None else tag
        return self._add_image(
            [candidate for candidate in candidates if candidate],
            frame,
            alt=_collapse(str(described.get("alt") or "")),
            title=_collapse(str(described.get("title") or "")),
        )

    def _add_image(self, candidates: list[str], frame: _Frame, alt: str, title: str) -> bool:
        source = self._resolve_image(candidates, frame.base)
        if source is None:
            return False
        caption = self._captions[-1] if self._captions else ""
        index = self._image_index.get(source.key)
        if index is None:
            index = len(self.images)
            self._image_index[source.key] = index
            width, height = _image_size(source.data, source.mime)
            self.images.append(
                DocumentImage(
                    url=source.url,
                    name=self._unique_name(source.url, source.mime, index + 1),
                    mime=source.mime,
                    data=source.data,
                    alt=alt,
                    title=title,
                    caption=caption,
                    width=width,
                    height=height,
                )
            )
        else:
            image = self.images[index]
            image.alt, image.title, image.caption = (
                image.alt or alt,
                image.title or title,
                image.caption or caption,
            )
        self._buffer.append(_IMAGE_MARK)
        self._pending_images.append(index)
        return True

    def _resolve_image(self, candidates: list[str], base: str) -> _ImageSource | None:
        """The first candidate saved in the archive as an image; inline data: URIs only if none is."""
        for candidate in candidates:
            part = None if candidate.startswith("data:") else self._archive.find(candidate, base)
            if part is not None and (mime := image_mime(part.data, part.content_type)):
                return _ImageSource(key=f"part:{id(part)}", url=part.url, data=part.data, mime=mime)
        for candidate in candidates:
            if candidate.startswith("data:") and (decoded := _decode_data_uri(candidate)):
                declared, data = decoded
                if mime := image_mime(data, declared):
                    digest = hashlib.sha256(data).hexdigest()[:16]
                    return _ImageSource(
                        key=f"data:{digest}", url=f"data:{mime};sha256={digest}", data=data, mime=mime
                    )
        return None

    def _unique_name(self, url: str, mime: str, number: int) -> str:
        """A short file-like name: the URL's basename (with an extension), else image-N.<ext>; unique here."""
        extension = _IMAGE_EXTENSIONS.get(mime, "img")
        basename = "" if url.startswith(("cid:", "data:")) else unquote(_url_path(url)).rsplit("/", 1)[-1]
        basename = re.sub(r"[^\w.\-]+", "_", basename).strip("._")[-80:]
        if not basename:
            basename = f"image-{number}.{extension}"
        elif "." not in basename:
            basename = f"{basename}.{extension}"
        name, stem, suffix, copy = basename, *basename.rsplit(".", 1), 1
        while name in self._taken_names:
            copy += 1
            name = f"{stem}-{copy}.{suffix}"
        self._taken_names.add(name)
        return name

    def _fill_contexts(self) -> None:
        """Give each image the text around its first occurrence (about 300 characters each side)."""
        text = "\n\n".join(element.text for element in self.elements if element.kind != "image")
        for image in self.images:
            position = image.location.char_span[0] if image.location.char_span else 0
            before = text[max(0, position - _CONTEXT_CHARS) : position]
            after = text[position : position + _CONTEXT_CHARS]
            if position > _CONTEXT_CHARS and " " in before:
                before = before.split(" ", 1)[1]
            if position + _CONTEXT_CHARS < len(text) and " " in after:
                after = after.rsplit(" ", 1)[0]
            image.context = _collapse(f"{before} {after}")


def _normalise_block(raw: str) -> tuple[str, list[int]]:
    """Collapse a block's whitespace (keeping <br> as a newline); return it and where its image marks were."""
    collapsed = _BREAKS.sub("\n", _WHITESPACE.sub(" ", raw))
    text = ""
    marks: list[int] = []
    for number, piece in enumerate(collapsed.split(_IMAGE_MARK)):
        if number:
            marks.append(len(text))
        if not text or text.endswith((" ", "\n")):
            piece = piece.lstrip(" ")
        text += piece
    stripped = text.strip()
    lead = len(text) - len(text.lstrip())
    return stripped, [min(max(mark - lead, 0), len(stripped)) for mark in marks]


def _collapse(text: str) -> str:
    return _WHITESPACE.sub(" ", text).strip()


def _is_hidden(tag: Tag) -> bool:
    return tag.has_attr("hidden") or bool(_HIDDEN_STYLE.search(str(tag.get("style") or "")))


def _visible_text(tag: Tag) -> str:
    """The collapsed text a reader sees in a subtree (no scripts, styles or hidden elements)."""
    pieces: list[str] = []
    stack: list[Any] = [tag]
    while stack:
        node = stack.pop()
        if isinstance(node, Tag):
            if node is not tag and (node.name in _SKIP_TAGS or _is_hidden(node)):
                continue
            if node.name == "br":
                pieces.append(" ")
            stack.extend(reversed(node.contents))
        elif isinstance(node, NavigableString) and not isinstance(node, PreformattedString):
            pieces.append(str(node))
    return _collapse("".join(pieces))


def _table_rows(table: Tag) -> list[Tag]:
    """The table's own rows (through thead/tbody/tfoot), not those of nested tables."""
    rows: list[Tag] = []
    for child in table.find_all(["tr", "thead", "tbody", "tfoot"], recursive=False):
        rows.extend([child] if child.name == "tr" else child.find_all("tr", recursive=False))
    return rows


def _is_data_table(table: Tag) -> bool:
    """Data tables have a grid of at least 2x2 cells holding inline content; the rest is page layout."""
    if str(table.get("role") or "").lower() in ("presentation", "none"):
        return False
    rows = _table_rows(table)
    cells = [row.find_all(["td", "th"], recursive=False) for row in rows]
    if len(rows) < 2 or max((len(row_cells) for row_cells in cells), default=0) < 2:
        return False
    return table.find(_BLOCKS_THAT_MAKE_A_LAYOUT_TABLE) is None


def _table_markdown(table: Tag) -> str:
    rows: list[list[str]] = []
    for row in _table_rows(table):
        cells: list[str] = []
        for cell in row.find_all(["td", "th"], recursive=False):
            text = _visible_text(cell).replace("|", "\\|")
            span = str(cell.get("colspan") or "1").strip()
            cells += [text] + [""] * (min(int(span), 50) - 1 if span.isdigit() and int(span) > 1 else 0)
        if any(cells):
            rows.append(cells)
    if not rows:
        return ""
    width = max(len(cells) for cells in rows)
    lines = ["| " + " | ".join(cells + [""] * (width - len(cells))) + " |" for cells in rows]
    lines.insert(1, "|" + " --- |" * width)
    return "\n".join(lines)


def _srcset_urls(srcset: str) -> list[str]:
    srcset = srcset.strip()
    if srcset.startswith("data:"):  # a data: URI holds commas; it is the whole candidate
        return [srcset.split()[0]]
    return [entry.split()[0] for entry in srcset.split(",") if entry.strip()]


def _img_candidates(img: Tag) -> list[str]:
    """URLs an <img> may have been saved under: src, srcset, then lazy-loading attributes."""
    candidates = [str(img.get("src") or "").strip()]
    candidates += _srcset_urls(str(img.get("srcset") or ""))
    for attribute in _LAZY_SOURCE_ATTRIBUTES:
        candidates += _srcset_urls(str(img.get(attribute) or ""))
    return candidates


def _vml_images(comment: str) -> dict[str, str]:
    """Word VML shapes in a conditional comment: shape id (or a unique stand-in) -> imagedata src."""
    images: dict[str, str] = {}
    for number, (attributes, body) in enumerate(_VML_SHAPE.findall(comment)):
        source = _VML_IMAGEDATA.search(body)
        if source:
            shape_id = _VML_ID.search(attributes)
            images[shape_id.group(1) if shape_id else f"#anonymous-{number}"] = source.group(1)
    return images


def _decode_data_uri(uri: str) -> tuple[str, bytes] | None:
    header, comma, payload = uri[5:].partition(",")
    if not comma:
        return None
    mime = header.split(";", 1)[0].strip().lower() or "text/plain"
    if header.lower().endswith(";base64"):
        try:
            return mime, base64.b64decode(re.sub(r"\s+", "", unquote(payload)) + "==", validate=False)
        except (binascii.Error, ValueError):
            return None
    return mime, unquote_to_bytes(payload)


def _image_size(data: bytes, mime: str) -> tuple[int | None, int | None]:
    """Pixel size from the image header only (no full decode); SVG from width/height or viewBox."""
    if mime == "image/svg+xml":
        return _svg_size(data)
    try:
        with Image.open(io.BytesIO(data)) as image:
            return image.size
    except (OSError, ValueError, EOFError, SyntaxError, Image.DecompressionBombError):
        return None, None


def _svg_size(data: bytes) -> tuple[int | None, int | None]:
    root = _SVG_TAG.search(data[:8192])
    if root is None:
        return None, None
    tag = root.group(0).decode("utf-8", errors="replace")
    attributes = dict(re.findall(r"([\w:-]+)\s*=\s*[\"']([^\"']*)[\"']", tag))
    width, height = (_SVG_LENGTH.match(attributes.get(axis, "")) for axis in ("width", "height"))
    if width and height:
        return round(float(width.group(1))), round(float(height.group(1)))
    view_box = re.split(r"[\s,]+", attributes.get("viewBox", "").strip())
    try:
        return round(float(view_box[2])), round(float(view_box[3]))
    except (IndexError, ValueError):
        return None, None
