"""An extracted image: its description in the document plus a reference into the image store."""

from __future__ import annotations

from vision_rag_pipeline.documents.model import DocumentImage, ImageInfo


class ExtractedImage(ImageInfo):
    sha256: str
    size: int

    @classmethod
    def of(cls, image: DocumentImage) -> ExtractedImage:
        return cls(**image.model_dump(exclude={"data"}), sha256=image.sha256, size=len(image.data))

    def with_data(self, data: bytes) -> DocumentImage:
        return DocumentImage(**self.model_dump(exclude={"sha256", "size"}), data=data)
