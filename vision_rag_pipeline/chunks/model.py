"""A chunk: the unit that is embedded, indexed and cited.

`page` chunks are retrieval units, not citations: one per PDF page, holding the page's whole text, so
a question whose words are spread over a page finds it; a search scores them and cites the best
chunk of the page they point to.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from vision_rag_pipeline.documents.model import BBox

ChunkKind = Literal["text", "table", "image", "page"]


class Landmarks(BaseModel):
    """What a question can point at in a chunk's place, recorded at ingest: "the chart on page 14",
    "Figure 3", "the cover", "the Q1 2025 report of Glimmerfield Solar".

    Stored in the chunk's metadata (`landmarks`) so Postgres filters on it, and as fields of both
    lexical indexes.
    """

    page_names: list[str] = Field(default_factory=list)  # what readers call its page: PageInfo.names
    page_count: int | None = None  # pages in its document: "the last page"
    references: list[str] = Field(default_factory=list)  # captioned on its page: "figure 3", "table 2-1"
    periods: list[str] = Field(default_factory=list)  # its document's: "2025-Q1", "2025" (core/periods.py)
    header: str = ""  # its document's title, file name and opening words: who and what the document is


class Chunk(BaseModel):
    chunk_id: str  # "<document id>:<index>", stable for a given document and config
    document_id: str
    index: int
    kind: ChunkKind
    text: str
    page: int | None = None
    bbox: BBox | None = None
    char_span: tuple[int, int] | None = None
    image: str | None = None  # the image URL of an image chunk
    landmarks: Landmarks = Field(default_factory=Landmarks)
    metadata: dict[str, Any] = Field(default_factory=dict)


def embedding_text(kind: str, text: str, title: str) -> str:
    """What the embedding model reads for a chunk: a text or table chunk with its document's title
    before it, as a reader knows which report a passage is from.

    A question names its report ("Glimmerfield Solar's Q1 2025 review") and asks about a passage that
    does not: without the title, every passage of a report series is as near the question as the
    same passage of the other quarters, and a chunk that happens to repeat the title (an image's
    Meta-Content, the first paragraph) is nearer than the answer. Image chunks carry their document's
    name already (the Meta-Content source, the excerpt heading); page units are averaged, not read.
    """
    return f"{title}\n{text}" if kind in ("text", "table") and title.strip() else text
