"""Vision token estimates, computed the way OpenAI bills image inputs.

Low detail is a flat 85 tokens. High detail fits the image in 2048×2048, then scales it
so the short side is 768 px (never upscaling), and charges 85 + 170 per 512-px tile.
`auto` lets the provider choose; we count it as high so the estimate is an upper bound.
"""

from __future__ import annotations

import math

BASE_TOKENS = 85
TOKENS_PER_TILE = 170
TILE_PX = 512
MAX_SIDE_PX = 2048
SHORT_SIDE_PX = 768


def vision_tokens(width: int, height: int, detail_mode: str) -> int:
    """Estimated prompt tokens for one image of `width`×`height` px sent with `detail_mode`."""
    if width <= 0 or height <= 0:
        raise ValueError(f"image size must be positive, got {width}x{height}")
    if detail_mode == "low":
        return BASE_TOKENS
    if detail_mode not in ("high", "auto"):
        raise ValueError(f"detail_mode must be low, high or auto, got {detail_mode!r}")
    fit = min(1.0, MAX_SIDE_PX / max(width, height))
    w, h = max(1, round(width * fit)), max(1, round(height * fit))  # whole pixels, like the provider
    shrink = min(1.0, SHORT_SIDE_PX / min(w, h))
    w, h = max(1, round(w * shrink)), max(1, round(h * shrink))
    tiles = math.ceil(w / TILE_PX) * math.ceil(h / TILE_PX)
    return BASE_TOKENS + TOKENS_PER_TILE * tiles
