"""How many bytes a PDF's streams inflate to, known before pdfium decodes any of them.

pdfium inflates a page's content streams (and its forms' and fonts') whole while it parses the page:
a 1 MB file whose one content stream inflates to 1 GB peaked at 2.1 GB. So those streams are
measured here first, inflated a chunk at a time and counted, never held, and the document is refused
when one stream or all of them together would pass `limits.documents` (`DocumentBudgetError`, one
line naming the setting).

Every stream of a PDF stands at the top level of the file (`<< dict >> stream ... endstream`; object
streams hold no streams), so a scan of the bytes finds them all, however the cross-reference table
reads. Deflate gives at most 1032 bytes per byte, so a stream too small to pass a limit even so is
not inflated, unless the document's streams together might pass `max_document_bytes`; then the
largest are inflated until their true sizes settle it. A FlateDecode chain (possibly after
ASCIIHexDecode or ASCII85Decode) counts at its inflated size, one that reaches another filter (LZW,
RunLength, Crypt...) at the size the chain gives up to it, and the streams of an encrypted file at
their own size (they do not inflate here). Images count at their declared size: pdfium decodes an
image no larger than its /Width and /Height say, however far its data would inflate (`pdf.py` bounds
each image by that size before it is decoded).
"""

from __future__ import annotations

import base64
import binascii
import mmap
import re
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from vision_rag_pipeline.core.config import DocumentLimits
from vision_rag_pipeline.documents.model import DocumentBudgetError

_STREAM_START = re.compile(rb">>\s*stream(?:\r\n|\n|\r)")
_FILTERS = re.compile(rb"/Filter\s*(\[[^\]]*\]|/[^\s/\[\]<>()]+)")
_NAME = re.compile(rb"/([^\s/\[\]<>()]+)")
_IMAGE = re.compile(rb"/Subtype\s*/Image\b")
_IMAGE_SIZE = {key: re.compile(rb"/" + key + rb"\s+(\d+)(?!\s+\d+\s+R)") for key in (b"Width", b"Height")}
_GREY = re.compile(rb"/ColorSpace\s*/(?:DeviceGray|CalGray|G)\b|/ImageMask\s+true")
_CMYK = re.compile(rb"/ColorSpace\s*/(?:DeviceCMYK|CMYK)\b")
_DEPTH = re.compile(rb"/BitsPerComponent\s+(\d+)")
_DICT_LOOKBACK = (
    2048  # bytes before `stream` searched for its object's `obj` keyword (a longer dictionary: its end)
)
_INFLATE_CHUNK = 1 << 20
MAX_DEFLATE_RATIO = 1032  # the most bytes deflate can make of one
_FLATE = {b"FlateDecode", b"Fl"}
_ASCII = {b"ASCIIHexDecode": "hex", b"AHx": "hex", b"ASCII85Decode": "a85", b"A85": "a85"}


@dataclass
class _Stream:
    bound: int  # the most it can decode to
    measure: Callable[[int], int] | None  # its decoded size, counted up to just past the argument


def check_stream_budget(path: Path, limits: DocumentLimits) -> int:
    """At least the bytes the file's streams decode to (the true size where it mattered); raises
    DocumentBudgetError when one stream passes `max_stream_bytes` or all of them `max_document_bytes`."""
    if path.stat().st_size == 0:
        return 0
    with path.open("rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as data:
        streams = list(_streams(data))
        for stream in streams:  # one stream at a time: inflate only what could pass the limit
            if stream.bound > limits.max_stream_bytes and stream.measure is not None:
                stream.bound, stream.measure = stream.measure(limits.max_stream_bytes), None
            if stream.bound > limits.max_stream_bytes:
                raise DocumentBudgetError(
                    f"{path.name}: a stream decodes to more than {limits.max_stream_bytes:,} bytes "
                    "(limits.documents.max_stream_bytes)"
                )
        total = sum(stream.bound for stream in streams)
        for stream in sorted(streams, key=lambda s: -s.bound):  # the largest bounds settle it soonest
            if total <= limits.max_document_bytes:
                break
            if stream.measure is not None:
                total -= stream.bound - stream.measure(stream.bound)
        if total > limits.max_document_bytes:
            raise DocumentBudgetError(
                f"{path.name}: its streams decode to more than {limits.max_document_bytes:,} bytes together "
                "(limits.documents.max_document_bytes)"
            )
    return total


def _streams(data: mmap.mmap) -> list[_Stream]:
    found = []
    for start in _STREAM_START.finditer(data):
        head = data[max(0, start.start() - _DICT_LOOKBACK) : start.start() + 2]
        dictionary = head[head.rfind(b"obj") + 3 :]
        end = data.find(b"endstream", start.end())
        span = (start.end(), end if end >= 0 else len(data))
        if _IMAGE.search(dictionary):
            found.append(_Stream(_image_bytes(dictionary, span[1] - span[0]), None))
            continue
        filters = _filters(dictionary)
        inflates = any(name in _FLATE for name in filters)
        size = span[1] - span[0]
        found.append(
            _Stream(
                size * MAX_DEFLATE_RATIO if inflates else size,
                (
                    lambda allowed, span=span, filters=filters: _decoded_size(
                        data[span[0] : span[1]], filters, allowed
                    )
                )
                if inflates
                else None,
            )
        )
    return found


def _image_bytes(dictionary: bytes, size: int) -> int:
    """What an image decodes to by its dictionary (pixels x channels x bytes a channel; three channels
    unless it says grey or CMYK), or the size of its data where the dictionary does not say (an
    indirect /Width)."""
    found = [pattern.search(dictionary) for pattern in _IMAGE_SIZE.values()]
    if not all(found):
        return size
    width, height = (int(match.group(1)) for match in found)
    channels = 1 if _GREY.search(dictionary) else 4 if _CMYK.search(dictionary) else 3
    depth = _DEPTH.search(dictionary)
    bits = int(depth.group(1)) if depth else 8
    return width * height * channels * max(bits, 8) // 8


def _filters(dictionary: bytes) -> list[bytes]:
    found = _FILTERS.search(dictionary)
    return _NAME.findall(found.group(1)) if found else []


def _decoded_size(body: bytes, filters: list[bytes], allowed: int) -> int:
    """What the decodable start of the filter chain makes of `body`, counted up to just past
    `allowed` (the caller refuses anything past it)."""
    for name in filters:
        if name in _ASCII:
            body = _ascii_decoded(body, _ASCII[name])
        elif name in _FLATE:
            return _inflate_count(body, allowed)
        else:
            break  # LZW, RunLength, Crypt...: counted as they stand
    return len(body)


def _ascii_decoded(body: bytes, kind: str) -> bytes:
    """ASCIIHex or ASCII85 data decoded (never larger than what it decodes); undecodable: as it is."""
    text = re.sub(rb"\s+", b"", body)
    try:
        if kind == "hex":
            text = text.split(b">", 1)[0]
            return binascii.unhexlify(text + b"0" * (len(text) % 2))
        return base64.a85decode(text.split(b"~>", 1)[0].removeprefix(b"<~"))
    except (binascii.Error, ValueError):
        return body


def _inflate_count(body: bytes, allowed: int) -> int:
    """Bytes `body` inflates to, a chunk at a time, stopping once past `allowed`; a damaged stream
    counts what inflates before the damage (what pdfium makes of it too), one that does not inflate
    at all (encrypted) its own size."""
    inflater = zlib.decompressobj()
    count = 0
    pending = body
    try:
        while count <= allowed and not inflater.eof:
            produced = inflater.decompress(pending, _INFLATE_CHUNK)
            pending = inflater.unconsumed_tail
            count += len(produced)
            if not produced and not pending:
                break
    except zlib.error:
        return count or len(body)
    return count
