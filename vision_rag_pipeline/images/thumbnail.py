"""Small JPEG thumbnails as data: URIs, so the Dagster UI shows the pictures a run worked on without a
file server (its markdown metadata renders `![alt](data:image/jpeg;base64,...)`)."""

from __future__ import annotations

import base64
import io
from collections import OrderedDict

from PIL import Image

THUMBNAIL_SIDE = 112  # px, the longer side: a JPEG of 2-5 KB
_MAX_PIXELS = 60_000_000  # larger pictures are not decoded for a preview
_CACHE_SIZE = 256
_cache: OrderedDict[str, str | None] = OrderedDict()  # sha256 -> URI: three assets show the same images


def thumbnail_uri(sha256: str, data: bytes, side: int = THUMBNAIL_SIDE) -> str | None:
    """The picture shrunk to `side` px (alpha on white) as a `data:image/jpeg;base64,` URI; None for
    bytes Pillow cannot decode (SVG, broken files) or too large to decode for a preview."""
    if sha256 in _cache:
        _cache.move_to_end(sha256)
        return _cache[sha256]
    uri = _thumbnail(data, side)
    _cache[sha256] = uri
    if len(_cache) > _CACHE_SIZE:
        _cache.popitem(last=False)
    return uri


def _thumbnail(data: bytes, side: int) -> str | None:
    try:
        with Image.open(io.BytesIO(data)) as img:
            if img.width * img.height > _MAX_PIXELS:
                return None
            img.draft("RGB", (side * 2, side * 2))  # JPEG: decode at a reduced scale
            img.seek(0)
            img.thumbnail((side, side), Image.Resampling.LANCZOS, reducing_gap=2.0)
            picture = img.convert("RGBA")
    except (OSError, ValueError, SyntaxError, EOFError, Image.DecompressionBombError):
        return None
    flat = Image.new("RGB", picture.size, "white")
    flat.paste(picture, mask=picture.getchannel("A"))
    out = io.BytesIO()
    flat.save(out, "JPEG", quality=70, optimize=True)
    return "data:image/jpeg;base64," + base64.b64encode(out.getvalue()).decode("ascii")
