"""Turn image bytes as found in documents into clean RGB pictures for OCR and the vision model.

Documents carry every kind of raster (palette GIFs, CMYK JPEGs, 16-bit PNGs, animated WebPs) and
some hostile ones (decompression bombs, SVG with entity tricks). Everything downstream gets an
8-bit RGB `PIL.Image`, or an `ImageError` whose message says in one line why not.
"""

from __future__ import annotations

import contextlib
import io
import math
import zlib
from xml.parsers import expat

import numpy as np
from PIL import Image, ImageChops, ImageFilter, ImageOps, UnidentifiedImageError

from vision_rag_pipeline.core.config import config_in_effect
from vision_rag_pipeline.core.sniff import is_svg
from vision_rag_pipeline.enrichment.cost import vision_size

MAX_IMAGE_BYTES = 20 * 1024 * 1024
# Pixels per image: `limits.images.max_pixels` of the config (Pillow's own guard, left at its default,
# refuses far larger ones while opening the header).
HIGH_DEPTH_MODES = frozenset({"I;16", "I;16B", "I;16L", "I;16N", "I", "F"})
_STRIP_PIXELS = 1 << 20  # pixels of a 16-bit or float image stretched to 8 bits at a time
# bytes a pixel takes in Pillow, by mode (RGB is stored in four), for what decoding costs
_MODE_BYTES = {
    "1": 1,
    "L": 1,
    "P": 1,
    "I;16": 2,
    "I;16B": 2,
    "I;16L": 2,
    "I;16N": 2,
    "LA": 4,
    "La": 4,
    "PA": 4,
}

_SVG_TEXT_TAGS = frozenset({"text", "title", "desc"})

# Tesseract reads body text best from about 20 px font size up; smaller text is enlarged to ~20 px.
OCR_TARGET_TEXT_HEIGHT = 20
OCR_MAX_UPSCALE = 3.0
OCR_MAX_PIXELS = 12_000_000
RULE_LENGTH = 40  # px: a straight stroke this long is a rule or a bar edge, not a letter


class ImageError(ValueError):
    """An image that cannot be used; the message is one line naming the reason."""


def image_pixel_limit() -> int:
    """`limits.images.max_pixels` of the config in effect."""
    return config_in_effect().config.limits.images.max_pixels


def image_memory(width: int, height: int, mode: str) -> int:
    """The most memory decoding and reading an image of this size and mode takes: the pixels as
    decoded, the 8-bit RGB copy every reader works on (4 bytes a pixel) and the OCR preparation's
    working copies (12 more: a 16-bit or float 6300 x 6300 image took 698 MB, BENCHMARKS.md
    "Outages and huge image queries")."""
    return width * height * (_MODE_BYTES.get(mode, 4) + 16)


def load_image(data: bytes, mime: str, max_pixels: int | None = None) -> Image.Image:
    """Decode the first frame of any raster Pillow reads into 8-bit RGB (alpha composited on white);
    an image of more than `max_pixels` (default: `limits.images.max_pixels`) is refused before it is
    decoded, and a 16-bit or floating-point one is brought to 8 bits a strip at a time."""
    max_pixels = max_pixels or image_pixel_limit()
    if len(data) > MAX_IMAGE_BYTES:
        raise ImageError(f"image too large: {len(data):,} bytes > {MAX_IMAGE_BYTES:,} byte limit")
    if not data:
        raise ImageError("image is empty (0 bytes)")
    if is_svg(data, mime):
        raise ImageError("SVG not rasterized: no SVG rasterizer is installed; its <text>/<title> is indexed")
    try:
        img = Image.open(io.BytesIO(data))
        width, height = img.size
        if width * height > max_pixels:
            raise ImageError(
                f"decompression bomb refused: {width}x{height} = {width * height:,} pixels "
                f"> {max_pixels:,} pixel limit (limits.images.max_pixels)"
            )
        img.seek(0)  # animated GIF/WebP/APNG, multi-page TIFF: the first frame
        img.load()
    except ImageError:
        raise
    except Image.DecompressionBombError as exc:
        raise ImageError(f"decompression bomb refused: {exc}") from exc
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError, EOFError) as exc:
        raise ImageError(f"undecodable image ({mime or 'unknown type'}): {_one_line(exc)}") from exc
    if img.mode in HIGH_DEPTH_MODES:
        img = _to_8bit(img)  # the only reference: the wide image is freed before the RGB copy is made
    with contextlib.suppress(OSError, ValueError, TypeError):  # broken EXIF must not cost the picture
        img = ImageOps.exif_transpose(img)
    return _to_rgb(img)


def _to_rgb(img: Image.Image) -> Image.Image:
    mode = img.mode
    if mode == "P":
        img = img.convert("RGBA" if "transparency" in img.info else "RGB")
    elif mode in ("LA", "La", "PA", "RGBa") or (mode in ("L", "RGB") and "transparency" in img.info):
        img = img.convert("RGBA")
    if img.mode == "RGBA":
        background = Image.new("RGB", img.size, (255, 255, 255))
        background.paste(img, mask=img.getchannel("A"))
        return background
    return img.convert("RGB") if img.mode != "RGB" else img


def _to_8bit(img: Image.Image) -> Image.Image:
    """Stretch 16-bit / 32-bit / float grey levels over 0-255 (a plain convert would clip to white),
    a strip of rows at a time: the image as 64-bit floats would be 4 to 8 times its own size."""
    rows = max(1, _STRIP_PIXELS // img.width)
    strips = [(0, top, img.width, min(top + rows, img.height)) for top in range(0, img.height, rows)]
    low, high = np.inf, -np.inf
    for box in strips:
        values = np.asarray(img.crop(box))
        low, high = min(low, float(values.min())), max(high, float(values.max()))
    out = Image.new("L", img.size)
    for box in strips:
        values = np.asarray(img.crop(box), dtype=np.float64)
        scaled = np.zeros_like(values) if high <= low else (values - low) * (255.0 / (high - low))
        out.paste(Image.fromarray(scaled.round().astype(np.uint8), mode="L"), box[:2])
    return out


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


def _gunzip_limited(data: bytes) -> bytes:
    """Inflate SVGZ without letting a zip bomb past the 20 MB limit."""
    inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
    try:
        out = inflater.decompress(data, MAX_IMAGE_BYTES + 1)
    except zlib.error as exc:
        raise ImageError(f"undecodable SVGZ: {_one_line(exc)}") from exc
    if len(out) > MAX_IMAGE_BYTES:
        raise ImageError(f"SVGZ inflates past the {MAX_IMAGE_BYTES:,} byte limit")
    return out


def svg_text(data: bytes) -> str:
    """The words an SVG carries itself (<text>, <title>, <desc>), one element per line.

    Charts exported as SVG keep their labels as text, so they stay searchable even though we do
    not rasterize SVG. DTDs and entity declarations are refused outright (billion laughs, XXE).
    """
    if len(data) > MAX_IMAGE_BYTES:
        raise ImageError(f"image too large: {len(data):,} bytes > {MAX_IMAGE_BYTES:,} byte limit")
    if data[:2] == b"\x1f\x8b":
        data = _gunzip_limited(data)
    parser = expat.ParserCreate()
    lines: list[str] = []
    stack: list[list[str] | None] = []  # per open element: its text buffer when it is a text tag

    def refuse_dtd(*_args: object) -> None:
        raise ImageError("SVG refused: it declares a DTD or entities")

    def start(tag: str, _attrs: dict[str, str]) -> None:
        local = tag.rsplit("}", 1)[-1].rsplit(":", 1)[-1]
        inside_text = any(buffer is not None for buffer in stack)
        stack.append([] if local in _SVG_TEXT_TAGS and not inside_text else None)

    def end(_tag: str) -> None:
        buffer = stack.pop()
        if buffer is not None:
            line = " ".join("".join(buffer).split())
            if line and line not in lines:
                lines.append(line)

    def characters(chunk: str) -> None:
        for buffer in reversed(stack):
            if buffer is not None:
                buffer.append(chunk)
                return

    parser.StartDoctypeDeclHandler = refuse_dtd
    parser.EntityDeclHandler = refuse_dtd
    parser.ExternalEntityRefHandler = refuse_dtd
    parser.StartElementHandler = start
    parser.EndElementHandler = end
    parser.CharacterDataHandler = characters
    try:
        parser.Parse(data, True)
    except expat.ExpatError as exc:
        raise ImageError(f"undecodable SVG: {_one_line(exc)}") from exc
    return "\n".join(lines)


def encode_for_vision(img: Image.Image, detail_mode: str) -> tuple[bytes, str, tuple[int, int]]:
    """Resize as the provider would (sending more pixels only costs upload time) and encode.

    Graphics with few colours (text, charts, screenshots) go as PNG so letters stay sharp;
    photos as JPEG, which is a fraction of the size.
    """
    size = vision_size(img.size, detail_mode)
    resized = img.convert("RGB")
    if size != resized.size:
        resized = resized.resize(size, Image.Resampling.LANCZOS)
    sample = resized.copy()
    sample.thumbnail((128, 128))
    buffer = io.BytesIO()
    if sample.getcolors(maxcolors=256) is not None:
        resized.save(buffer, format="PNG", optimize=False)
        return buffer.getvalue(), "image/png", size
    resized.save(buffer, format="JPEG", quality=90)
    return buffer.getvalue(), "image/jpeg", size


def long_runs(mask: np.ndarray, axis: int, length: int) -> np.ndarray:
    """Which True pixels belong to a run of at least `length` True pixels along `axis`.

    Every caller asks "is this stroke long?", never how long: marking only the long runs' starts and
    ends lets one int8 running sum (0 or 1 all along) fill them in, a third of the time the run
    lengths themselves took in int32 on a 12-megapixel page.
    """
    grid = mask if axis == 1 else mask.T
    rows, width = grid.shape
    padded = np.zeros((rows, width + 2), dtype=np.int8)
    padded[:, 1:-1] = grid
    edges = np.diff(padded, axis=1).ravel()  # rows x (width + 1): +1 where a run starts, -1 past its end
    starts = np.flatnonzero(edges == 1)
    ends = np.flatnonzero(edges == -1)
    long = ends - starts >= length
    steps = np.zeros(edges.size, dtype=np.int8)
    steps[starts[long]] = 1
    steps[ends[long]] = -1
    out = np.cumsum(steps, dtype=np.int8).view(np.bool_).reshape(rows, width + 1)[:, :width]
    return out if axis == 1 else out.T


def text_line_height(gray: np.ndarray) -> float | None:
    """Median height of the ink bands in the horizontal projection: roughly the font size in pixels.

    Ink is whatever differs from the dominant (background) grey level, so light-on-dark works too.
    """
    if gray.size == 0:
        return None
    background = int(np.bincount(gray.ravel(), minlength=256).argmax())  # the most common grey
    ink = (np.abs(np.arange(256) - background) > 60)[gray]  # by table: no int16 copy of the page
    # table grids, axes and bars are not text: drop long strokes before measuring
    ink &= ~(long_runs(ink, 1, RULE_LENGTH) | long_runs(ink, 0, RULE_LENGTH))
    rows = ink.mean(axis=1) > 0.002
    if not rows.any():
        return None
    edges = np.diff(np.concatenate(([0], rows.view(np.int8), [0])))
    heights = np.flatnonzero(edges == -1) - np.flatnonzero(edges == 1)
    heights = heights[heights >= 4]  # rules, dots and noise are not text lines
    return float(np.median(heights)) if heights.size else None


def _ocr_scale(height: float | None, pixels: int) -> float:
    """How much to enlarge (or shrink) so text lands near Tesseract's preferred height."""
    if height is None:
        return 1.0
    if height < OCR_TARGET_TEXT_HEIGHT * 0.7:
        return min(OCR_MAX_UPSCALE, OCR_TARGET_TEXT_HEIGHT / height)
    # only big scans in big type shrink (speed); a merged band (rotated text) must not shrink small images
    if pixels > OCR_MAX_PIXELS / 3 and height > OCR_TARGET_TEXT_HEIGHT * 6:
        return max(0.5, OCR_TARGET_TEXT_HEIGHT * 3 / height)
    return 1.0


def scale_for_ocr(img: Image.Image, *, keep_colour: bool = False) -> tuple[Image.Image, float | None]:
    """`for_ocr`, plus the text line height measured on the result (None when there is no text line).

    With `keep_colour` an RGB or greyscale image keeps its mode (and is returned itself when no
    scaling is needed).
    """
    gray = greyscale(img)
    height = text_line_height(np.asarray(gray))
    width, image_height = gray.size
    scale = min(_ocr_scale(height, width * image_height), math.sqrt(OCR_MAX_PIXELS / (width * image_height)))
    out = (img if img.mode in ("RGB", "L") else img.convert("RGB")) if keep_colour else gray
    if abs(scale - 1.0) < 0.1:
        return out, height
    size = (max(1, round(width * scale)), max(1, round(image_height * scale)))
    method = Image.Resampling.LANCZOS if scale < 1 else Image.Resampling.BICUBIC
    return out.resize(size, method), None if height is None else height * scale


def for_ocr(img: Image.Image, *, keep_colour: bool = False) -> Image.Image:
    """Greyscale (or RGB with `keep_colour`), small text upscaled (up to x3), huge images capped at 12 MP.

    The scale follows the measured line height rather than the image size: an 800x600 slide
    with 40 px headings needs nothing, a 1200 px wide table in 9 px type needs x2-3.
    """
    return scale_for_ocr(img, keep_colour=keep_colour)[0]


# Soft edges: the steepest grey-level steps of a sharp image (even anti-aliased, JPEG'd or
# downscaled) climb most of the contrast within a pixel or two; a blurred one needs several.
SOFT_EDGE_SHARPNESS = 0.5
MAX_SKEW_DEGREES = 6.0
MIN_SKEW_DEGREES = 0.4  # below this Tesseract copes and a resampling costs more than it gains
SKEW_PROBE_SIDE = 400


def _percentile_of_counts(counts: np.ndarray, share: float) -> float:
    """The value below which `share` of the counted values lie, from a histogram of integers."""
    return float(np.searchsorted(np.cumsum(counts), share * counts.sum()))


def edge_sharpness(gray: np.ndarray) -> float:
    """Steepness of the image's strongest edges relative to its contrast (sharp ~0.6-1, blurred < 0.4).

    Computed from histograms of the 8-bit levels and steps: every image pays for this test, and
    percentiles of float copies of a 2-megapixel image cost ~50 ms.
    """
    levels = np.bincount(gray.ravel(), minlength=256)
    contrast = _percentile_of_counts(levels, 0.99) - _percentile_of_counts(levels, 0.01)
    if contrast < 10:
        return 1.0  # a flat image has no edges to judge; nothing to sharpen
    values = gray.astype(np.int16)
    steps = np.bincount(np.abs(np.diff(values, axis=1)).ravel(), minlength=256)
    steps += np.bincount(np.abs(np.diff(values, axis=0)).ravel(), minlength=256)
    strong = steps.copy()
    strong[: int(0.1 * contrast) + 1] = 0  # steps above a tenth of the contrast
    if not strong.any():
        return 0.0
    return _percentile_of_counts(strong, 0.9) / contrast


def sharpen_soft(
    img: Image.Image, text_height: float | None, enlarged: float = 1.0
) -> tuple[Image.Image, float | None, bool]:
    """Unsharp-mask an image whose edges are soft, upscaling it x2 first (within the pixel cap)
    unless `scale_for_ocr` has already enlarged it by `enlarged` >= 1.5.

    Blur merges a decimal point into its digits and thin strokes into their background; a larger
    image gives the mask room to restore the gaps. An enlarged image has that room already (and
    its softness is partly the interpolation's): doubling it again made 5-11 megapixel pages that
    read slower and no better. Returns (image, text height, done).
    """
    if edge_sharpness(np.asarray(greyscale(img))) >= SOFT_EDGE_SHARPNESS:
        return img, text_height, False
    if enlarged >= 1.5:
        room = 2.0
    else:
        room = min(2.0, math.sqrt(OCR_MAX_PIXELS / (img.width * img.height)))
        if room > 1.1:
            img = img.resize((round(img.width * room), round(img.height * room)), Image.Resampling.BICUBIC)
            text_height = None if text_height is None else text_height * room
        else:
            room = 1.0
    return (
        img.filter(ImageFilter.UnsharpMask(radius=2.0 * room, percent=250, threshold=0)),
        text_height,
        True,
    )


def estimate_skew(gray: np.ndarray) -> float:
    """Angle in degrees (counter-clockwise, as `Image.rotate` takes it) that levels the text lines.

    Text lines, table rules and chart grid lines give the row profile of the ink (whatever
    differs from the dominant grey) its sharpest peaks when they run exactly horizontally: try
    angles within +-6 degrees, coarse then fine.
    """
    probe = Image.fromarray(gray, mode="L")
    if max(probe.size) > SKEW_PROBE_SIDE:
        probe.thumbnail((SKEW_PROBE_SIDE, SKEW_PROBE_SIDE), Image.Resampling.BOX)
    values = np.asarray(probe, dtype=np.int16)
    # edges, not ink: a dark panel or a coloured bar would weigh by its area, a letter by its outline
    steps = np.zeros(values.shape, dtype=np.int16)
    steps[:, 1:] = np.abs(np.diff(values, axis=1))
    steps[1:, :] = np.maximum(steps[1:, :], np.abs(np.diff(values, axis=0)))
    ink = steps > max(12, 0.15 * int(steps.max()))
    if ink.sum() < 50:
        return 0.0
    rows, columns = np.nonzero(ink)

    def peakedness(angle: float) -> float:
        # turning by a few degrees is, for the row profile, a shear: each ink pixel moves by x * tan
        turned = np.round(rows - columns * math.tan(math.radians(angle))).astype(np.int64)
        return float(np.square(np.bincount(turned - turned.min()).astype(np.float64)).sum())

    coarse = np.arange(-MAX_SKEW_DEGREES, MAX_SKEW_DEGREES + 0.01, 0.5)
    best = max(coarse, key=peakedness)
    fine = np.arange(best - 0.4, best + 0.41, 0.1)
    return round(float(max(fine, key=peakedness)), 1)


def deskew(img: Image.Image) -> tuple[Image.Image, float]:
    """`img` turned so its text runs horizontally (grown to keep the corners); returns it and the angle.

    A greyscale image stays greyscale.
    """
    angle = estimate_skew(np.asarray(greyscale(img)))
    if abs(angle) < MIN_SKEW_DEGREES:
        return img, 0.0
    if img.mode != "L":
        img = img.convert("RGB") if img.mode != "RGB" else img
    pixels = np.asarray(img)
    border = np.concatenate([pixels[0], pixels[-1], pixels[:, 0], pixels[:, -1]])
    median = np.median(border, axis=0)
    fill = int(median) if img.mode == "L" else tuple(int(v) for v in median)
    return img.rotate(angle, Image.Resampling.BICUBIC, expand=True, fillcolor=fill), angle


def greyscale(img: Image.Image) -> Image.Image:
    """`img` in greyscale: itself when it is greyscale already (no copy)."""
    return img if img.mode == "L" else img.convert("L")


def is_grey(img: Image.Image) -> bool:
    """Whether every pixel of an RGB image has three equal channels: a scan or a rendering without
    colour, decoded as RGB. An 8x reduced copy is checked first (colour survives the averaging)."""
    if img.mode != "RGB":
        return img.mode == "L"
    for picture in (img.reduce(8), img) if min(img.size) >= 16 else (img,):
        red, green, blue = picture.split()
        if ImageChops.difference(red, green).getbbox() or ImageChops.difference(green, blue).getbbox():
            return False
    return True
