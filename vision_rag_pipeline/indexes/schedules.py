"""The reindex job and its daily schedule: both indexes rebuilt aside and swapped, searches answering."""

import dagster as dg

from vision_rag_pipeline.indexes.reindex import reindex
from vision_rag_pipeline.resources import IndexDatabase, LexicalIndexResource, RagConfigResource


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
    cron_schedule="0 3 * * *",
    default_status=dg.DefaultScheduleStatus.RUNNING,
    description="Every night at 03:00: compact both indexes (fresh HNSW graph, merged tantivy segments).",
)
