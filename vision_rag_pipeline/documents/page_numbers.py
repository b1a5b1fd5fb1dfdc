"""The page numbers a document prints in its headers and footers, told apart from other numbers there.

A header or footer line often starts or ends with the page's printed number ("Copyright © Huawei
Technologies Co., Ltd. 8", "Alibaba Cloud | Introducing Alibaba Cloud 17", "4 Graduate Studies ...
Graduate Studies 5" across a printed spread), but also with issue numbers, chapter numbers or
counts. A printed page number follows the pages: it is the page's place in the document plus a fixed
offset (front matter before page 1), or, on a scanned or exported spread, two numbers per sheet. So
a number counts as printed only where it fits the one such progression that most pages share.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence

# A number of one to three digits at the start or end of a margin line: a four-digit number there
# is a year ("© 2024") far more often than a page.
_EDGE_NUMBER = re.compile(
    r"^\s*(?:page\s+)?[-–—(]?\s*(\d{1,3})\b(?![.,:/]\d)|(?<![\d.,:/])\b(\d{1,3})\s*[-–—)]?\s*$", re.I
)
MIN_PAGES = 3  # a progression seen on fewer pages may be a coincidence
MIN_SHARE = 0.25  # ... or on fewer than this share of the pages that show an edge number


def edge_numbers(lines: Sequence[str]) -> list[int]:
    """The numbers that open or close these lines (a page's header and footer lines)."""
    found = []
    for line in lines:
        for match in _EDGE_NUMBER.finditer(line.strip()):
            found.append(int(match.group(1) or match.group(2)))
    return found


def printed_page_numbers(
    candidates: Sequence[Sequence[int]], places: Sequence[int], min_share_of_pages: float = 0.0
) -> list[list[int]]:
    """For each page, the numbers among its `candidates` that are its printed page numbers.

    `places[i]` is page i's place in the document (its numeric page label, else its index). The
    progression is printed = place + offset (one number per page) or 2 x place + offset and the
    number after it (a spread), whichever most pages fit; a progression fitted by too few pages
    (MIN_PAGES, MIN_SHARE of the pages showing a number, `min_share_of_pages` of all pages) is no
    progression, and no number is taken.
    """
    fits: Counter[tuple[int, int]] = Counter()  # (step, offset) -> numbers that fit it, over all pages
    pages: Counter[tuple[int, int]] = Counter()  # ... and pages with one that fits
    for numbers, place in zip(candidates, places, strict=True):
        # a spread's offset is its left number's: the right one is one more
        here = Counter((1, n - place) for n in set(numbers))
        here.update({(2, n - 2 * place) for n in numbers} | {(2, n - 1 - 2 * place) for n in numbers})
        here.update({(2, n - 2 * place) for n in numbers} & {(2, n - 1 - 2 * place) for n in numbers})
        fits.update(here)
        pages.update(here.keys())
    if not fits:
        return [[] for _ in candidates]
    showing = sum(1 for numbers in candidates if numbers)
    step, offset = max(fits, key=lambda fit: (fits[fit], -fit[0], -abs(fit[1])))
    if pages[(step, offset)] < max(MIN_PAGES, MIN_SHARE * showing, min_share_of_pages * len(candidates)):
        return [[] for _ in candidates]
    printed = []
    for numbers, place in zip(candidates, places, strict=True):
        expected = {step * place + offset} | ({step * place + offset + 1} if step == 2 else set())
        printed.append(sorted({n for n in numbers if n in expected and n > 0}))
    return printed
