"""Asset checks at each hand-off of the index half of the graph.

The per-document checks are check specs of the asset they guard and run inside its step: a separate
check step per asset would cost an ingest run five more steps of Dagster bookkeeping (inputs loaded
again, events stored) for a few milliseconds of checking.

Blocking where a failure would corrupt what comes next: a chunk with a broken image annotation would
be embedded and indexed as garbage, and vectors that do not line up with chunks would attach each
vector to the wrong text. The index checks run last, so they report (row counts) instead.

The orphan check looks at the whole index, not one document, so it does not run in every ingest run:
the `audit_indexes` job runs it after each successful reindex and document removal, the two jobs after
which the indexes and the registry must agree.
"""

import dagster as dg
import numpy as np

from vision_rag_pipeline.chunks.annotations import ANNOTATION_RE
from vision_rag_pipeline.chunks.model import Chunk
from vision_rag_pipeline.documents.sensors import remove_document_job
from vision_rag_pipeline.indexes.pgvector_store import indexed_document_ids
from vision_rag_pipeline.indexes.schedules import reindex_job
from vision_rag_pipeline.partitions import documents_partitions
from vision_rag_pipeline.resources import IndexDatabase, LexicalIndexResource

UNIT_NORM_TOLERANCE = 1e-3

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


def broken_annotation_offsets(text: str) -> list[int]:
    """Offsets of every `![` that does not start a whole `![description](url)` annotation."""
    starts = {match.start() for match in ANNOTATION_RE.finditer(text)}
    offsets, position = [], text.find("![")
    while position != -1:
        if position not in starts:
            offsets.append(position)
        position = text.find("![", position + 2)
    return offsets


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
    """The result of an index's row-count check: one row per chunk of the document."""
    return dg.AssetCheckResult(
        check_name=spec.name,
        passed=index_rows == chunks,
        metadata={"index_rows": index_rows, "chunks": chunks},
    )


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


audit_indexes_job = dg.define_asset_job(
    "audit_indexes",
    selection=dg.AssetSelection.checks(no_orphan_rows),
    description="Look for index rows of documents that are no longer registered.",
)


@dg.run_status_sensor(
    name="audit_after_index_changes",
    run_status=dg.DagsterRunStatus.SUCCESS,
    monitored_jobs=[reindex_job, remove_document_job],
    request_job=audit_indexes_job,
    default_status=dg.DefaultSensorStatus.RUNNING,
    description="After a reindex or a document removal, check that no index holds orphan rows.",
)
def audit_after_index_changes(context: dg.RunStatusSensorContext) -> dg.RunRequest:
    run_id = context.dagster_run.run_id
    return dg.RunRequest(run_key=run_id, tags={"vision_rag/after_run": run_id})
