"""A perceptual hash of a picture, so a photo, a re-save or a resize of an indexed image finds it.

dHash: the picture in grey at 9 x 8, one bit per pair of horizontal neighbours (is the right one
brighter?). JPEG artefacts, noise, a slight blur or tilt and any scaling flip few of the 64 bits;
an unrelated picture flips about half, a chart drawn from the same template only a few. A crop or a redraw moves the picture under the grid and is
left to the image's text, which search matches as well.

A plain picture (a blank page, a flat background, a thin rule) gets no hash: its bits are ties
broken by noise, so it would match every other plain picture. On the reference corpus, 60 pictures
from outside the index met an indexed one within 8 bits 22 % of the time with plain pictures hashed,
never without them; 98 % of its pictures keep a hash.
"""

from __future__ import annotations

import numpy as np
from PIL import Image

HASH_BITS = 64
DISTINCT_STEP = 2  # grey levels (of 255) between two neighbours for their bit to mean something
MIN_DISTINCT_PAIRS = 8  # of the 64 pairs; fewer and the picture is plain


def perceptual_hash(img: Image.Image) -> str | None:
    """The picture's 64-bit dHash as 16 hex digits (how chunk metadata and SQL carry it), or None
    for a plain picture."""
    grey = np.asarray(img.convert("L").resize((9, 8), Image.Resampling.BOX), dtype=np.int16)
    steps = np.diff(grey, axis=1)
    if int((np.abs(steps) >= DISTINCT_STEP).sum()) < MIN_DISTINCT_PAIRS:
        return None
    return np.packbits(steps.ravel() > 0).tobytes().hex()
