"""Reporting periods in text, in one canonical form, for documents and questions alike.

A report series (one company's Q1..Q4 reports on one template) repeats the same sentences with
other numbers; what tells its reports apart is the period each covers, and a question names it
("Q1 2025", "the first quarter of 2025", "1Q25", "FY2021", "fiscal 2021", "H1 2024", "March 2025").
Each becomes a canonical string: "2025-Q1", "2025-H1", "2025-03" or a year "2025"; a quarter, half or
month also yields its year. A fiscal year counts as its year: reports rarely spell out both.
"""

from __future__ import annotations

import re

ORDINAL_WORDS = {"first": 1, "second": 2, "third": 3, "fourth": 4, "1st": 1, "2nd": 2, "3rd": 3, "4th": 4}
MONTHS = {
    name: number
    for number, names in enumerate(
        (
            ("january", "jan"),
            ("february", "feb"),
            ("march", "mar"),
            ("april", "apr"),
            ("may",),
            ("june", "jun"),
            ("july", "jul"),
            ("august", "aug"),
            ("september", "sep", "sept"),
            ("october", "oct"),
            ("november", "nov"),
            ("december", "dec"),
        ),
        start=1,
    )
    for name in names
}
_YEAR = r"((?:19|20)\d{2})"
_SHORT_YEAR = r"'?(\d{2})"
_ANY_YEAR = rf"(?:{_YEAR}|{_SHORT_YEAR})"
_SEP = r"[\s'’/-]*"
_ORDINAL = "|".join(ORDINAL_WORDS)
_MONTH = "|".join(sorted(MONTHS, key=len, reverse=True))
_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = (
    # Q1 2025, Q1-25, Q1'25, Q1 FY25, Q1 fiscal 2025
    ("quarter", re.compile(rf"\bq([1-4]){_SEP}(?:fy|fiscal(?:\s+year)?)?{_SEP}{_ANY_YEAR}\b", re.I)),
    # 1Q25, 1Q 2025, 1Q FY2025
    ("quarter", re.compile(rf"\b([1-4])q{_SEP}(?:fy)?{_SEP}{_ANY_YEAR}\b", re.I)),
    # 2025 Q1, 2025-Q1, FY2025 Q1
    ("quarter_year_first", re.compile(rf"\b(?:fy)?{_YEAR}{_SEP}q([1-4])\b", re.I)),
    # the first quarter of 2025, first quarter 2025, first fiscal quarter of 2025
    (
        "quarter_words",
        re.compile(
            rf"\b({_ORDINAL})\s+(?:fiscal\s+)?quarter(?:\s+of)?(?:\s+(?:fiscal\s+)?(?:year\s+)?)?\s*{_YEAR}\b",
            re.I,
        ),
    ),
    ("half", re.compile(rf"\bh([12]){_SEP}(?:fy)?{_SEP}{_ANY_YEAR}\b", re.I)),
    ("half", re.compile(rf"\b([12])h{_SEP}(?:fy)?{_SEP}{_ANY_YEAR}\b", re.I)),
    (
        "half_words",
        re.compile(rf"\b(first|second)\s+half(?:\s+of)?(?:\s+(?:fiscal\s+)?(?:year\s+)?)?\s*{_YEAR}\b", re.I),
    ),
    ("month", re.compile(rf"\b({_MONTH})\.?(?:\s+\d{{1,2}},?)?\s+{_YEAR}\b", re.I)),
    # FY2021, FY 2021, FY21, fiscal 2021, fiscal year 2021
    ("fiscal", re.compile(rf"\b(?:fy{_SEP}{_ANY_YEAR}|fiscal\s+(?:year\s+)?{_YEAR})\b", re.I)),
    ("year", re.compile(rf"(?<![\d.,$€£]){_YEAR}(?![\d.,%]\d|\d|%)")),
)


def _full_year(long: str | None, short: str | None) -> int:
    return int(long) if long else 2000 + int(short or 0)


def periods(text: str) -> list[str]:
    """The canonical periods `text` names, in order of first mention, each once: "2025-Q1", "2025"."""
    found: list[tuple[int, str]] = []
    for kind, pattern in _PATTERNS:
        for match in pattern.finditer(text):
            groups = match.groups()
            if kind == "quarter":
                year, label = _full_year(groups[1], groups[2]), f"Q{groups[0]}"
            elif kind == "quarter_year_first":
                year, label = int(groups[0]), f"Q{groups[1]}"
            elif kind == "quarter_words":
                year, label = int(groups[1]), f"Q{ORDINAL_WORDS[groups[0].lower()]}"
            elif kind == "half":
                year, label = _full_year(groups[1], groups[2]), f"H{groups[0]}"
            elif kind == "half_words":
                year, label = int(groups[1]), "H1" if groups[0].lower() == "first" else "H2"
            elif kind == "month":
                year, label = int(groups[1]), f"{MONTHS[groups[0].lower()]:02d}"
            elif kind == "fiscal":
                year, label = _full_year(groups[0] or groups[2], groups[1]), ""
            else:
                year, label = int(groups[0]), ""
            if label:
                found.append((match.start(), f"{year}-{label}"))
            found.append((match.start(), str(year)))
    return list(dict.fromkeys(period for _, period in sorted(found, key=lambda item: item[0])))


def without_periods(text: str) -> str:
    """`text` with every period it names blanked out ("Who led the Q1 2025 audit?" -> "Who led the
    audit?")."""
    for _, pattern in _PATTERNS:
        text = pattern.sub(" ", text)
    return " ".join(text.split())


_MONTH_NAMES = {
    number: max((n for n, m in MONTHS.items() if m == number), key=len) for number in range(1, 13)
}


def spelled(period: str) -> str:
    """A canonical period as documents write it: "Q1 2025", "H2 2024", "march 2025", "2025"."""
    if "-" not in period:
        return period
    year, label = period.split("-", 1)
    if label[0] in "QH":
        return f"{label} {year}"
    return f"{_MONTH_NAMES[int(label)]} {year}"


def granularity(period: str) -> str:
    """ "year", "quarter", "half" or "month"."""
    if "-" not in period:
        return "year"
    label = period.split("-", 1)[1]
    return {"Q": "quarter", "H": "half"}.get(label[0], "month")


_ORDER = ("year", "half", "quarter", "month")


def finest_period(asked: list[str]) -> str:
    """The most precise of the periods a question names: "2025-Q1" of ["2025-Q1", "2025"]."""
    return max(asked, key=lambda p: _ORDER.index(granularity(p)))


def containing(period: str) -> dict[str, str]:
    """The period and those that contain it, by granularity: a month is in its quarter, its half
    and its year ("2025-02" -> quarter "2025-Q1", half "2025-H1", year "2025")."""
    year = period.split("-", 1)[0]
    kind = granularity(period)
    found = {kind: period, "year": year}
    if kind == "month":
        month = int(period.split("-")[1])
        found |= {"quarter": f"{year}-Q{(month - 1) // 3 + 1}", "half": f"{year}-H{(month - 1) // 6 + 1}"}
    elif kind == "quarter":
        found["half"] = f"{year}-H{(int(period[-1]) - 1) // 2 + 1}"
    return found


def period_fit(asked: list[str], covered: list[str]) -> int:
    """+1 where a document covering `covered` is one the question asking about `asked` means, -1 where
    it covers other periods of that kind (the Q2 report when Q1 or February is asked), 0 when it
    cannot tell.

    The question's finest period is compared at the finest granularity the document states: a
    quarterly report answers for the months of its quarter, an annual report for its year.
    """
    if not asked or not covered:
        return 0
    wanted = containing(finest_period(asked))
    stated = {granularity(p) for p in covered}
    for kind in reversed(_ORDER):
        if kind in stated and kind in wanted:
            return 1 if wanted[kind] in covered else -1
    return 0
