"""What a question points at, read the way chunks record it (chunks/landmarks.py).

General language patterns only: page and slide numbers ("page 12", "pages 3 and 4", "slides 2 to
5", "page three"), places in the document ("the cover", "the first page", "the last page", "the
second last page"), numbered references ("Figure 3", "Fig. 2b", "Table 2-1"), reporting periods
("Q1 2025", "the third quarter of 2025", "FY2021") and proper names (capitalised or upper-case words
inside the sentence, such as a company or a place).
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, Field

from vision_rag_pipeline.core.periods import periods
from vision_rag_pipeline.core.references import mentioned_references
from vision_rag_pipeline.core.text import FUNCTION_WORDS

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
# a word that names something: capitalised inside a sentence, all capitals, or letters and digits mixed
_NAME = re.compile(r"(?<![.?!:]\s)(?<!^)\b([A-Z][a-zA-Z&'’-]+|[A-Z0-9]{2,}|\d+[A-Za-z]+\w*)\b")
_ROMAN = re.compile(r"^[ivxlc]+$", re.I)


class QuestionPointers(BaseModel):
    """What a question names besides its topic; empty lists when it names none."""

    page_names: list[str] = Field(default_factory=list)  # as readers number pages: "12", "iv"
    positions: list[Position] = Field(default_factory=list)
    references: list[str] = Field(default_factory=list)  # "figure 3", "table 2-1"
    periods: list[str] = Field(default_factory=list)  # "2025-Q1", "2025"
    names: list[str] = Field(default_factory=list)  # "Glimmerfield", "Gdansk", "COSTCO"

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


def proper_names(question: str) -> list[str]:
    """Words that name something: not the sentence's first word, not a function word, not a
    reference ("Figure", "Table"), not a period ("Q1", "FY2021")."""
    names = []
    for match in _NAME.finditer(question):
        word = re.sub(r"['’]s$", "", match.group(1)).strip("'’-")
        lowered = word.lower()
        if word.isdigit():
            continue
        if lowered in FUNCTION_WORDS or periods(word) or re.fullmatch(r"q[1-4]|h[12]|fy\d*", lowered):
            continue
        if lowered in ("figure", "fig", "table", "page", "pages", "slide", "slides", "chart", "section"):
            continue
        names.append(word)
    return list(dict.fromkeys(names))


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
        names=proper_names(question),
    )
