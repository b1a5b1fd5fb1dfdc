"""A document's chunk vectors, and what makes them untrustworthy."""

import numpy as np
from pydantic import BaseModel, ConfigDict

from vision_rag_pipeline.chunks.model import Chunk

UNIT_NORM_TOLERANCE = 1e-3


class ChunkEmbeddings(BaseModel):
    model_config = ConfigDict(arbitrary_types_allowed=True, protected_namespaces=())

    model: str  # the model variant that computed the vectors (encoder.model_variant: name and precision)
    dim: int
    vectors: np.ndarray  # row i embeds chunk i of document_chunks


def embedding_problems(chunks: list[Chunk], vectors: np.ndarray, dim: int) -> list[str]:
    """Why the vectors cannot be trusted to line up with the chunks (empty when they can)."""
    if vectors.ndim != 2 or len(vectors) != len(chunks):
        return [f"{len(chunks)} chunks but {len(vectors)} vectors"]
    problems = []
    if vectors.shape[1] != dim:
        problems.append(f"vectors have {vectors.shape[1]} dimensions, recorded dim is {dim}")
    norms = np.linalg.norm(vectors, axis=1) if len(vectors) else np.zeros(0)
    bad = [
        chunks[i].chunk_id
        for i in np.flatnonzero(~np.isfinite(norms) | (abs(norms - 1) > UNIT_NORM_TOLERANCE))
    ]
    if bad:
        problems.append(f"{len(bad)} vectors are not finite unit vectors: {bad[:5]}")
    return problems
