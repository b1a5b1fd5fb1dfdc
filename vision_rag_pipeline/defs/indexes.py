"""The indexes area: `pgvector_index` and `lexical_index` (a partition's rows replaced, never
duplicated), the `reindex` job and its nightly schedule (both indexes rebuilt aside and swapped while
searches answer), and the index-wide orphan check.

The orphan check looks at the whole index, not one document, so it does not run in every ingest run:
the `audit_indexes` job runs it after each successful reindex and document removal, the two jobs after
which the indexes and the registry must agree.
"""

import dagster as dg

from vision_rag_pipeline.chunks.model import Chunk
from vision_rag_pipeline.core.config import reindex_cron
from vision_rag_pipeline.defs.checks import (
    LEXICAL_ROWS_MATCH_CHUNKS,
    PGVECTOR_ROWS_MATCH_CHUNKS,
    rows_match_chunks,
)
from vision_rag_pipeline.defs.documents import remove_document_job
from vision_rag_pipeline.defs.partitions import batch_check, documents_partitions
from vision_rag_pipeline.defs.resources import IndexDatabase, LexicalIndexResource, RagConfigResource
from vision_rag_pipeline.embeddings.model import ChunkEmbeddings
from vision_rag_pipeline.enrichment.batch import EnrichmentBatch
from vision_rag_pipeline.indexes.lexical import LexicalDoc
from vision_rag_pipeline.indexes.pgvector_store import indexed_document_ids
from vision_rag_pipeline.indexes.reindex import reindex


@dg.asset(
    partitions_def=documents_partitions,
    group_name="indexes",
    kinds={"postgres"},
    check_specs=[PGVECTOR_ROWS_MATCH_CHUNKS],
    description="Chunks with vectors in Postgres (pgvector HNSW, cosine) and enriched images in rag_images; "
    "the partition's rows are replaced in one transaction.",
)
def pgvector_index(
    context: dg.AssetExecutionContext,
    document_chunks: dict[str, list[Chunk]],
    chunk_embeddings: dict[str, ChunkEmbeddings],
    image_enrichments: dict[str, EnrichmentBatch],
    index_db: IndexDatabase,
    lexical: LexicalIndexResource,
) -> dg.MaterializeResult:
    # The lexical index must answer before either index changes: `lexical_index` runs beside this
    # step, so a damaged one would otherwise fail the run after this step wrote the documents' new
    # rows, leaving the two indexes holding different versions of them. Here it fails before, and the
    # run leaves both as they were (its error names the repair).
    lexical.open().count(next(iter(document_chunks)))
    checks = {}
    for key, chunks in document_chunks.items():
        embedded, enriched = chunk_embeddings[key], image_enrichments[key]
        store = index_db.vector_store(embedded.dim)
        images = [
            (enriched.results[c.metadata["image_sha256"]], embedded.vectors[i])
            for i, c in enumerate(chunks)
            if c.kind == "image"
            and "image_excerpt" not in c.metadata  # one rag_images row per image: its Meta-Content chunk
            and c.metadata.get("image_sha256") in enriched.results
        ]
        store.replace_document(key, chunks, embedded.vectors, images, embedded.model)
        rows = store.count(key)
        context.add_asset_metadata(
            {"rows": rows, "image_rows": len(images), "dim": embedded.dim, "model": embedded.model},
            partition_key=key,
        )
        checks[key] = rows_match_chunks(PGVECTOR_ROWS_MATCH_CHUNKS, rows, len(chunks))
    return dg.MaterializeResult(check_results=[batch_check(checks)])


@dg.asset(
    partitions_def=documents_partitions,
    group_name="indexes",
    kinds={"tantivy", "elasticsearch"},
    check_specs=[LEXICAL_ROWS_MATCH_CHUNKS],
    description="BM25 index of the same chunks (tantivy on disk by default, Elasticsearch when configured).",
)
def lexical_index(
    context: dg.AssetExecutionContext, document_chunks: dict[str, list[Chunk]], lexical: LexicalIndexResource
) -> dg.MaterializeResult:
    index = lexical.open()
    checks = {}
    for key, chunks in document_chunks.items():
        index.replace_document(key, [LexicalDoc.of(c) for c in chunks])
        rows = index.count(key)
        context.add_asset_metadata({"rows": rows}, partition_key=key)
        checks[key] = rows_match_chunks(LEXICAL_ROWS_MATCH_CHUNKS, rows, len(chunks))
    return dg.MaterializeResult(check_results=[batch_check(checks)])


class ReindexConfig(dg.Config):
    reembed: bool = False  # embed every chunk again even though the model's dimension did not change


@dg.op(description="Rebuild the pgvector tables and the lexical index from the stored chunks, then swap.")
def rebuild_indexes(
    context: dg.OpExecutionContext,
    config: ReindexConfig,
    index_db: IndexDatabase,
    lexical: LexicalIndexResource,
    rag_config: RagConfigResource,
) -> dg.Output[int]:
    report = reindex(
        lexical.open(), rag_config.load().embedding, index_db.database_url(), reembed=config.reembed
    )
    context.log.info(f"reindexed: {report.model_dump()}")
    return dg.Output(
        report.vector.chunks,
        metadata={
            "chunks": report.vector.chunks,
            "image_rows": report.vector.images,
            "dim": report.vector.dim,
            "reembedded": report.vector.reembedded,
            "reembed_reason": report.reembed_reason or "",
            "lexical_docs": report.lexical_docs,
            "seconds": report.seconds,
        },
    )


@dg.job(name="reindex", description="Rebuild both indexes aside and swap them in, without downtime.")
def reindex_job() -> None:
    rebuild_indexes()


reindex_schedule = dg.ScheduleDefinition(
    name="daily_reindex",
    job=reindex_job,
    cron_schedule=reindex_cron(),
    default_status=dg.DefaultScheduleStatus.RUNNING,
    description="Every night at 03:00 (or VISION_RAG_REINDEX_CRON): compact both indexes (fresh HNSW "
    "graph, merged tantivy segments).",
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
