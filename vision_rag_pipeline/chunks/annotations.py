"""Inline image annotations `![description](url)`: how they are written and the one regex that finds them.

Everything that writes an annotation goes through `annotation()`, which cleans the description and the URL so
that `ANNOTATION_RE` always matches the whole annotation and nothing else: the description never holds a
bracket, backslash or newline, the URL never holds whitespace, a parenthesis or a bracket.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import quote, unquote

ANNOTATION_RE = re.compile(r"!\[(?P<description>[^\[\]\\\n]*)\]\((?P<url>[^()\[\]\s]+)\)")

_URL_UNSAFE_RE = re.compile(r"[\s()\[\]]")
_DESCRIPTION_BRACKETS = str.maketrans({"[": "(", "]": ")", "\\": None})
_UNNAMED_IMAGE = "image"


@dataclass(frozen=True, slots=True)
class Annotation:
    """One annotation found in a text: `text[start:end]` is the whole `![description](url)`."""

    start: int
    end: int
    description: str
    url: str


def annotation(description: str, url: str) -> str:
    """`![description](url)`, cleaned so that `find_annotations` reads back exactly this description and URL.

    An empty description becomes the image's name taken from the URL, so no annotation is blank.
    """
    encoded_url = encode_url(url)
    if not encoded_url:
        raise ValueError(f"an image annotation needs a URL (description {description[:60]!r})")
    cleaned = clean_description(description) or clean_description(image_name(url)) or _UNNAMED_IMAGE
    return f"![{cleaned}]({encoded_url})"


def clean_description(description: str) -> str:
    """The description on one line, brackets turned into parentheses and backslashes dropped."""
    return " ".join(description.translate(_DESCRIPTION_BRACKETS).split())


def encode_url(url: str) -> str:
    """The URL with whitespace, parentheses and brackets percent-encoded (nothing else is touched)."""
    return _URL_UNSAFE_RE.sub(lambda match: quote(match.group(), safe=""), url.strip())


def image_name(url: str) -> str:
    """A readable name for the image: the last path segment of the URL, or the media type of a data: URL."""
    url = url.strip()
    if url.lower().startswith("data:"):
        return url[len("data:") :].split(",", 1)[0].split(";", 1)[0]
    path = url.split("#", 1)[0].split("?", 1)[0].rstrip("/")
    return unquote(path.rsplit("/", 1)[-1])


def find_annotations(text: str) -> list[Annotation]:
    """Every annotation in `text`, in order (they never overlap)."""
    return [
        Annotation(match.start(), match.end(), match["description"], match["url"])
        for match in ANNOTATION_RE.finditer(text)
    ]


def broken_annotation_offsets(text: str) -> list[int]:
    """Offsets of every `![` that does not start a whole `![description](url)` annotation."""
    starts = {match.start() for match in ANNOTATION_RE.finditer(text)}
    offsets, position = [], text.find("![")
    while position != -1:
        if position not in starts:
            offsets.append(position)
        position = text.find("![", position + 2)
    return offsets
