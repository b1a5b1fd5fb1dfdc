"""What a question points at, read the way chunks record it (chunks/landmarks.py).

General language patterns only: page and slide numbers ("page 12", "pages 3 and 4", "slides 2 to
5", "page three"), places in the document ("the cover", "the first page", "the last page", "the
second last page"), numbered references ("Figure 3", "Fig. 2b", "Table 2-1") and reporting periods
("Q1 2025", "the third quarter of 2025", "FY2021"). Names are left to BM25 over the documents'
headers, whose IDF weighs them by how few documents they pick out (query/candidates.py).
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, Field

from vision_rag_pipeline.core.periods import periods
from vision_rag_pipeline.core.references import mentioned_references

Position = Literal["first", "last", "second_last"]

NUMBER_WORDS = {
    word: number
    for number, word in enumerate(
        [
            "zero",
            "one",
            "two",
            "three",
            "four",
            "five",
            "six",
            "seven",
            "eight",
            "nine",
            "ten",
            "eleven",
            "twelve",
            "thirteen",
            "fourteen",
            "fifteen",
            "sixteen",
            "seventeen",
            "eighteen",
            "nineteen",
            "twenty",
        ]
    )
}
_PAGE_NUMBER = r"(\d{1,4}|[ivxlc]{1,6}\b|" + "|".join(NUMBER_WORDS) + ")"
# "page 12", "pages 3 and 4", "pages 3-5", "slide 14", "p. 7", "on page(1)"
_PAGE_REFERENCE = re.compile(
    rf"\b(?:pages?|slides?|p\.|pp\.)\s*\(?\s*{_PAGE_NUMBER}\s*\)?(?:\s*(and|to|through|-|–|,)\s*(?:pages?\s*|slides?\s*)?{_PAGE_NUMBER})?",
    re.I,
)
_FIRST = re.compile(
    r"\b(?:cover(?:\s+page)?|front\s+page|first\s+(?:page|slide)|title\s+(?:page|slide))\b", re.I
)
_SECOND_LAST = re.compile(r"\b(?:second[\s-]+(?:to[\s-]+)?last|penultimate)\b", re.I)
_LAST = re.compile(r"\b(?:last|final|back)\s+(?:page|slide|cover)\b|\bback\s+cover\b", re.I)
# "the first figure", "the second table": a numbered reference by its order
_ORDINAL_REFERENCE = re.compile(
    r"\b(first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth)\s+(figure|table|chart)\b", re.I
)
_ORDINALS = ("first", "second", "third", "fourth", "fifth", "sixth", "seventh", "eighth", "ninth", "tenth")
_ROMAN = re.compile(r"^[ivxlc]+$", re.I)


class QuestionPointers(BaseModel):
    """What a question names besides its topic; empty lists when it names none."""

    page_names: list[str] = Field(default_factory=list)  # as readers number pages: "12", "iv"
    positions: list[Position] = Field(default_factory=list)
    references: list[str] = Field(default_factory=list)  # "figure 3", "table 2-1"
    periods: list[str] = Field(default_factory=list)  # "2025-Q1", "2025"

    @property
    def points_into_document(self) -> bool:
        return bool(self.page_names or self.positions or self.references)


def _page_name(token: str) -> str:
    token = token.lower()
    if token in NUMBER_WORDS:
        return str(NUMBER_WORDS[token])
    return token


def page_names(question: str) -> list[str]:
    """The page (or slide) numbers a question names, ranges spelled out: "pages 3 to 5" -> 3, 4, 5."""
    names: list[str] = []
    for match in _PAGE_REFERENCE.finditer(question):
        first, joiner, second = match.group(1), match.group(2), match.group(3)
        start = _page_name(first)
        if second is None:
            names.append(start)
            continue
        end = _page_name(second)
        ranged = joiner.lower() in ("to", "through", "-", "–")
        if ranged and start.isdigit() and end.isdigit() and 0 < int(end) - int(start) <= 50:
            names += [str(page) for page in range(int(start), int(end) + 1)]
        else:
            names += [start, end]
    return list(dict.fromkeys(name for name in names if name.isdigit() or _ROMAN.match(name)))


def positions(question: str) -> list[Position]:
    found: list[Position] = []
    if _FIRST.search(question):
        found.append("first")
    if _SECOND_LAST.search(question):
        found.append("second_last")
    elif _LAST.search(question):
        found.append("last")
    return found


def analyze(question: str) -> QuestionPointers:
    return QuestionPointers(
        page_names=page_names(question),
        positions=positions(question),
        references=list(
            dict.fromkeys(
                [
                    *mentioned_references(question),
                    *(
                        f"{m.group(2).lower()} {_ORDINALS.index(m.group(1).lower()) + 1}"
                        for m in _ORDINAL_REFERENCE.finditer(question)
                    ),
                ]
            )
        ),
        periods=periods(question),
    )
