"""What a vision provider does to an image before it looks at it, and what it bills for it (OpenAI's rules).

Low detail fits the image in 512×512 and is a flat 85 tokens. High detail fits it in 2048×2048, then
scales it so the short side is 768 px (never upscaling), and charges 85 + 170 per 512-px tile.
`auto` lets the provider choose; we count it as high so the estimate is an upper bound.
"""

from __future__ import annotations

import math

BASE_TOKENS = 85
TOKENS_PER_TILE = 170
TILE_PX = 512
LOW_DETAIL_BOX = 512
MAX_SIDE_PX = 2048
SHORT_SIDE_PX = 768


def _fit(size: tuple[int, int], box: int) -> tuple[int, int]:
    width, height = size
    scale = min(1.0, box / max(width, height))
    return max(1, round(width * scale)), max(1, round(height * scale))  # whole pixels, like the provider


def vision_size(size: tuple[int, int], detail_mode: str) -> tuple[int, int]:
    """The size the provider looks at: low fits 512x512; high/auto fit 2048x2048, then short side <= 768."""
    if detail_mode == "low":
        return _fit(size, LOW_DETAIL_BOX)
    width, height = _fit(size, MAX_SIDE_PX)
    scale = min(1.0, SHORT_SIDE_PX / min(width, height))
    return max(1, round(width * scale)), max(1, round(height * scale))


def vision_tokens(width: int, height: int, detail_mode: str) -> int:
    """Estimated prompt tokens for one image of `width`×`height` px sent with `detail_mode`."""
    if width <= 0 or height <= 0:
        raise ValueError(f"image size must be positive, got {width}x{height}")
    if detail_mode == "low":
        return BASE_TOKENS
    if detail_mode not in ("high", "auto"):
        raise ValueError(f"detail_mode must be low, high or auto, got {detail_mode!r}")
    w, h = vision_size((width, height), detail_mode)
    return BASE_TOKENS + TOKENS_PER_TILE * math.ceil(w / TILE_PX) * math.ceil(h / TILE_PX)
