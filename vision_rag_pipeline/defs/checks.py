"""Asset checks at each hand-off, as check specs of the asset they guard (they run inside its step).

A separate check step per asset would cost an ingest run five more steps of Dagster bookkeeping (inputs
loaded again, events stored) for a few milliseconds of checking. Blocking where a failure would corrupt
what comes next: a chunk with a broken image annotation would be embedded and indexed as garbage, and
vectors that do not line up with chunks would attach each vector to the wrong text. The index checks run
last, so they report (row counts) instead. The index-wide orphan check lives with the indexes
(`defs/indexes.py`).
"""

import warnings

import dagster as dg
import numpy as np

from vision_rag_pipeline.chunks.annotations import broken_annotation_offsets
from vision_rag_pipeline.chunks.model import Chunk
from vision_rag_pipeline.defs.partitions import documents_partitions
from vision_rag_pipeline.embeddings.model import embedding_problems

# Per-partition check specs are a Dagster "preview" feature, used on purpose: each document gets its own
# check status. Its PreviewWarning (one per spec, at import) is silenced here alone, by its message.
with warnings.catch_warnings():
    warnings.filterwarnings(
        "ignore", message="Specifying a partitions_def on an AssetCheckSpec", category=dg.PreviewWarning
    )
    ANNOTATIONS_WHOLE = dg.AssetCheckSpec(
        "annotations_whole",
        asset="document_chunks",
        blocking=True,
        partitions_def=documents_partitions,
        description="Every `![` in a chunk starts a whole image annotation: the splitter never cut one.",
    )
    EVERY_CHUNK_EMBEDDED = dg.AssetCheckSpec(
        "every_chunk_embedded",
        asset="chunk_embeddings",
        blocking=True,
        partitions_def=documents_partitions,
        description="One finite unit vector per chunk, in chunk order.",
    )
    PGVECTOR_ROWS_MATCH_CHUNKS = dg.AssetCheckSpec(
        "pgvector_rows_match_chunks",
        asset="pgvector_index",
        partitions_def=documents_partitions,
        description="The partition has exactly one pgvector row per chunk.",
    )
    LEXICAL_ROWS_MATCH_CHUNKS = dg.AssetCheckSpec(
        "lexical_rows_match_chunks",
        asset="lexical_index",
        partitions_def=documents_partitions,
        description="The partition has exactly one lexical-index entry per chunk.",
    )


def annotations_whole(chunks: list[Chunk]) -> dg.AssetCheckResult:
    """The ANNOTATIONS_WHOLE result for a document's chunks."""
    broken = {c.chunk_id: offsets for c in chunks if (offsets := broken_annotation_offsets(c.text))}
    return dg.AssetCheckResult(
        check_name=ANNOTATIONS_WHOLE.name,
        passed=not broken,
        metadata={"chunks": len(chunks), "broken": dg.MetadataValue.json(dict(list(broken.items())[:20]))},
    )


def every_chunk_embedded(chunks: list[Chunk], vectors: np.ndarray, dim: int) -> dg.AssetCheckResult:
    """The EVERY_CHUNK_EMBEDDED result for a document's chunks and their vectors."""
    problems = embedding_problems(chunks, vectors, dim)
    return dg.AssetCheckResult(
        check_name=EVERY_CHUNK_EMBEDDED.name,
        passed=not problems,
        metadata={
            "chunks": len(chunks),
            "vectors": len(vectors),
            "problems": dg.MetadataValue.json(problems),
        },
    )


def rows_match_chunks(spec: dg.AssetCheckSpec, index_rows: int, chunks: int) -> dg.AssetCheckResult:
    """The result of an index's row-count check: one row per chunk of the document.

    The UI plots each numeric metadata key as one series over every evaluation, whatever the
    partition: the documents' row counts side by side read as an index growing and shrinking. The
    only number is therefore the partition's own mismatch (0 when sound, comparable across
    documents); the counts themselves are text.
    """
    return dg.AssetCheckResult(
        check_name=spec.name,
        passed=index_rows == chunks,
        metadata={
            "rows_missing": chunks - index_rows,  # negative: rows no chunk accounts for
            "rows": dg.MetadataValue.text(f"{index_rows} index rows for {chunks} chunks"),
        },
    )
