"""Numbered things a document captions and a question points at: "Figure 3", "Fig. 2b", "Table 2-1".

The same canonical form on both sides ("figure 3", "table 2-1"), so a question about "Fig. 3" finds
the page whose caption reads "FIGURE 3: ...". Ingest reads captions (a line that starts with the
reference); questions mention references anywhere.
"""

from __future__ import annotations

import re

# what a caption's first word may be, and the one name each kind goes by
_KINDS = {
    "figure": "figure",
    "fig": "figure",
    "fig.": "figure",
    "table": "table",
    "tab.": "table",
    "chart": "chart",
    "exhibit": "exhibit",
    "diagram": "diagram",
    "graph": "graph",
    "map": "map",
}
_KIND = "|".join(re.escape(kind) for kind in sorted(_KINDS, key=len, reverse=True))
_NUMBER = r"(\d{1,3}(?:[.-]\d{1,3})*[a-z]?|[ivx]{1,5}\b|[a-z]\b)"
_CAPTION = re.compile(rf"^\s*({_KIND})\s*{_NUMBER}\s*(?:[:.|—–-]|\s+(?-i:[A-Z(])|$)", re.I)
_MENTION = re.compile(rf"\b({_KIND})\s*(\d{{1,3}}(?:[.-]\d{{1,3}})*[a-z]?)\b", re.I)


def _canonical(kind: str, number: str) -> str:
    return f"{_KINDS[kind.lower()]} {number.lower()}"


def caption_reference(line: str) -> str | None:
    """ "figure 3" for a line that captions Figure 3 ("Figure 3: Revenue by region", "FIG. 3 Revenue",
    "Table 2-1 Compared items"), None for any other line (also one that only mentions it)."""
    match = _CAPTION.match(line)
    return _canonical(match.group(1), match.group(2)) if match else None


def mentioned_references(text: str) -> list[str]:
    """Every numbered figure, table, chart ... a text mentions, canonical, once each in order."""
    return list(dict.fromkeys(_canonical(m.group(1), m.group(2)) for m in _MENTION.finditer(text)))
