"""Asset checks at each hand-off of the index half of the graph.

Blocking where a failure would corrupt what comes next: a chunk with a broken image annotation would
be embedded and indexed as garbage, and vectors that do not line up with chunks would attach each
vector to the wrong text. The index checks run last, so they report (row counts, orphans) instead.
"""

import dagster as dg
import numpy as np

from vision_rag_pipeline.chunks.annotations import ANNOTATION_RE
from vision_rag_pipeline.chunks.model import Chunk
from vision_rag_pipeline.embeddings.assets import ChunkEmbeddings
from vision_rag_pipeline.indexes.pgvector_store import chunk_count, indexed_document_ids
from vision_rag_pipeline.partitions import documents_partitions
from vision_rag_pipeline.resources import IndexDatabase, LexicalIndexResource

UNIT_NORM_TOLERANCE = 1e-3


def broken_annotation_offsets(text: str) -> list[int]:
    """Offsets of every `![` that does not start a whole `![description](url)` annotation."""
    starts = {match.start() for match in ANNOTATION_RE.finditer(text)}
    offsets, position = [], text.find("![")
    while position != -1:
        if position not in starts:
            offsets.append(position)
        position = text.find("![", position + 2)
    return offsets


def embedding_problems(chunks: list[Chunk], embeddings: ChunkEmbeddings) -> list[str]:
    """Why the vectors cannot be trusted to line up with the chunks (empty when they can)."""
    vectors = embeddings.vectors
    if vectors.ndim != 2 or len(vectors) != len(chunks):
        return [f"{len(chunks)} chunks but {len(vectors)} vectors"]
    problems = []
    if vectors.shape[1] != embeddings.dim:
        problems.append(f"vectors have {vectors.shape[1]} dimensions, recorded dim is {embeddings.dim}")
    norms = np.linalg.norm(vectors, axis=1) if len(vectors) else np.zeros(0)
    bad = [
        chunks[i].chunk_id
        for i in np.flatnonzero(~np.isfinite(norms) | (abs(norms - 1) > UNIT_NORM_TOLERANCE))
    ]
    if bad:
        problems.append(f"{len(bad)} vectors are not finite unit vectors: {bad[:5]}")
    return problems


@dg.asset_check(
    asset="document_chunks",
    partitions_def=documents_partitions,
    blocking=True,
    description="Every `![` in a chunk starts a whole image annotation: the splitter never cut one.",
)
def annotations_whole(document_chunks: list[Chunk]) -> dg.AssetCheckResult:
    broken = {c.chunk_id: offsets for c in document_chunks if (offsets := broken_annotation_offsets(c.text))}
    return dg.AssetCheckResult(
        passed=not broken,
        metadata={
            "chunks": len(document_chunks),
            "broken": dg.MetadataValue.json(dict(list(broken.items())[:20])),
        },
    )


@dg.asset_check(
    asset="chunk_embeddings",
    partitions_def=documents_partitions,
    blocking=True,
    additional_ins={"document_chunks": dg.AssetIn("document_chunks")},
    description="One finite unit vector per chunk, in chunk order.",
)
def every_chunk_embedded(
    chunk_embeddings: ChunkEmbeddings, document_chunks: list[Chunk]
) -> dg.AssetCheckResult:
    problems = embedding_problems(document_chunks, chunk_embeddings)
    return dg.AssetCheckResult(
        passed=not problems,
        metadata={
            "chunks": len(document_chunks),
            "vectors": len(chunk_embeddings.vectors),
            "problems": dg.MetadataValue.json(problems),
        },
    )


def _row_count_result(index_rows: int, chunks: int) -> dg.AssetCheckResult:
    return dg.AssetCheckResult(
        passed=index_rows == chunks, metadata={"index_rows": index_rows, "chunks": chunks}
    )


@dg.asset_check(
    asset="pgvector_index",
    partitions_def=documents_partitions,
    additional_ins={"document_chunks": dg.AssetIn("document_chunks")},
    description="The partition has exactly one pgvector row per chunk.",
)
def pgvector_rows_match_chunks(
    context: dg.AssetCheckExecutionContext, document_chunks: list[Chunk], index_db: IndexDatabase
) -> dg.AssetCheckResult:
    rows = chunk_count(context.partition_key, index_db.database_url())
    return _row_count_result(rows, len(document_chunks))


@dg.asset_check(
    asset="lexical_index",
    partitions_def=documents_partitions,
    additional_ins={"document_chunks": dg.AssetIn("document_chunks")},
    description="The partition has exactly one lexical-index entry per chunk.",
)
def lexical_rows_match_chunks(
    context: dg.AssetCheckExecutionContext, document_chunks: list[Chunk], lexical: LexicalIndexResource
) -> dg.AssetCheckResult:
    return _row_count_result(lexical.open().count(context.partition_key), len(document_chunks))


def orphan_document_ids(
    instance: dg.DagsterInstance, index_db: IndexDatabase, lexical: LexicalIndexResource
) -> dict[str, list[str]]:
    """{index: document ids it holds that are no registered document with a partition}."""
    registered = {doc.document_id for doc in index_db.registry().all()}
    known = registered & set(instance.get_dynamic_partitions(documents_partitions.name))
    return {
        "pgvector": sorted(indexed_document_ids(index_db.database_url()) - known),
        "lexical": sorted(lexical.open().document_ids() - known),
    }


@dg.asset_check(
    asset="lexical_index",
    description="No index (pgvector or lexical) holds rows of a document that is no longer registered.",
)
def no_orphan_rows(
    context: dg.AssetCheckExecutionContext, index_db: IndexDatabase, lexical: LexicalIndexResource
) -> dg.AssetCheckResult:
    orphans = orphan_document_ids(context.instance, index_db, lexical)
    return dg.AssetCheckResult(
        passed=not any(orphans.values()),
        severity=dg.AssetCheckSeverity.WARN,
        metadata={name: dg.MetadataValue.json(ids[:50]) for name, ids in orphans.items()},
    )


INDEX_CHECKS = [
    annotations_whole,
    every_chunk_embedded,
    pgvector_rows_match_chunks,
    lexical_rows_match_chunks,
    no_orphan_rows,
]
