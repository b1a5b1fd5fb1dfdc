"""A chunk: the unit that is embedded, indexed and cited."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from vision_rag_pipeline.documents.model import BBox

ChunkKind = Literal["text", "table", "image"]


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
    metadata: dict[str, Any] = Field(default_factory=dict)
