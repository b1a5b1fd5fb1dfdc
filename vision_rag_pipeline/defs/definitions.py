"""Every Dagster object of the project in one `Definitions`, each asset versioned by the config in effect
(resolved once per process: `core.config.config_in_effect`)."""

import warnings

import dagster as dg

from vision_rag_pipeline.core.config import EXECUTOR_ENV, executor_choice
from vision_rag_pipeline.defs.chunks import document_chunks
from vision_rag_pipeline.defs.documents import raw_documents, remove_document_job
from vision_rag_pipeline.defs.embeddings import chunk_embeddings
from vision_rag_pipeline.defs.enrichment import image_enrichments, image_verdicts
from vision_rag_pipeline.defs.images import extracted_images
from vision_rag_pipeline.defs.inbox import inbox_sensor
from vision_rag_pipeline.defs.indexes import (
    audit_after_index_changes,
    audit_indexes_job,
    lexical_index,
    no_orphan_rows,
    pgvector_index,
    reindex_job,
    reindex_schedule,
)
from vision_rag_pipeline.defs.intake import ingest_requests
from vision_rag_pipeline.defs.io_manager import PostgresAssetIOManager
from vision_rag_pipeline.defs.jobs import ingest_document_job, reenrich_job
from vision_rag_pipeline.defs.resources import (
    EmbeddingModel,
    IndexDatabase,
    LexicalIndexResource,
    RagConfigResource,
)
from vision_rag_pipeline.defs.version_sensor import version_sensor
from vision_rag_pipeline.defs.versions import code_versions


def _executor() -> dg.ExecutorDefinition:
    """A Kubernetes pod per step (dagster-k8s `k8s_job_executor`) when VISION_RAG_EXECUTOR=k8s_job;
    each step a task for Celery workers on any host (dagster-celery, defs/celery_executor.py) when
    VISION_RAG_EXECUTOR=celery; otherwise every step of a run in the run's own process
    (`in_process_executor`), runs side by side.

    A document's steps form a chain, so steps in processes of their own bought no parallelism and
    cost an import of Dagster, the project and torch each: a one-page PDF's daemon-launched run took
    6.1x the CLI's ingest, 3.2x with steps forked from a preloaded forkserver, 1.1x in one process
    (BENCHMARKS.md "Daemon runs").
    """
    choice = executor_choice()
    if choice == "k8s_job":
        from dagster_k8s import k8s_job_executor

        return k8s_job_executor
    if choice == "celery":
        from vision_rag_pipeline.defs.celery_executor import celery_executor_from_env

        return celery_executor_from_env()
    if choice:
        raise ValueError(
            f"{EXECUTOR_ENV}={choice!r}: expected k8s_job or celery, or unset for the default executor"
        )
    return dg.in_process_executor


_CODE_VERSIONS = code_versions()
_INDEX_DB = IndexDatabase()

ALL_ASSETS = dg.map_asset_specs(
    lambda spec: spec.replace_attributes(code_version=_CODE_VERSIONS.get(spec.key.to_user_string())),
    [
        raw_documents,
        extracted_images,
        image_verdicts,
        image_enrichments,
        document_chunks,
        chunk_embeddings,
        pgvector_index,
        lexical_index,
    ],
)

defs = dg.Definitions(
    assets=ALL_ASSETS,
    asset_checks=[no_orphan_rows],
    jobs=[ingest_document_job, reenrich_job, remove_document_job, reindex_job, audit_indexes_job],
    sensors=[ingest_requests, inbox_sensor, version_sensor, audit_after_index_changes],
    schedules=[reindex_schedule],
    executor=_executor(),
    resources={
        "io_manager": PostgresAssetIOManager(index_db=_INDEX_DB),
        "index_db": _INDEX_DB,
        "lexical": LexicalIndexResource(),
        "rag_config": RagConfigResource(),
        "embedding_model": EmbeddingModel(),
    },
)

# Dagster rebuilds inbox_sensor to bind resources to the op job it targets (remove_document), passing
# an `owners` argument of its own and warning that the argument is beta. Built here once (the result
# is cached), that one internal BetaWarning is silenced by its message; any other still shows.
with warnings.catch_warnings():
    warnings.filterwarnings("ignore", message="Parameter `owners` of initializer", category=dg.BetaWarning)
    defs.get_repository_def()
