"""The Dagster entry point: `dagster dev -m vision_rag_pipeline.definitions`."""

from __future__ import annotations

import dagster as dg

from vision_rag_pipeline.chunks.assets import document_chunks
from vision_rag_pipeline.config import load_config
from vision_rag_pipeline.documents.assets import raw_documents
from vision_rag_pipeline.documents.sensors import inbox_sensor, remove_document_job
from vision_rag_pipeline.embeddings.assets import chunk_embeddings
from vision_rag_pipeline.enrichment.assets import image_enrichments, image_verdicts
from vision_rag_pipeline.enrichment.cache import OFFLINE_ENGINE
from vision_rag_pipeline.enrichment.sensors import version_sensor
from vision_rag_pipeline.enrichment.versioning import (
    chunking_version,
    classifier_version,
    embedding_version,
    enrichment_version,
)
from vision_rag_pipeline.enrichment.vlm import vision_client_from_env
from vision_rag_pipeline.images.assets import extracted_images
from vision_rag_pipeline.indexes.assets import lexical_index, pgvector_index
from vision_rag_pipeline.indexes.checks import audit_after_index_changes, audit_indexes_job, no_orphan_rows
from vision_rag_pipeline.indexes.schedules import reindex_job, reindex_schedule
from vision_rag_pipeline.io_manager import PickledAssetIOManager
from vision_rag_pipeline.partitions import documents_partitions
from vision_rag_pipeline.resources import IndexDatabase, LexicalIndexResource, RagConfigResource


def _code_versions() -> dict[str, str]:
    """Each derived asset's version: a hash of the settings that shape it, from the config in effect now."""
    config = load_config()
    vision = vision_client_from_env()
    engine = (
        vision.engine
        if vision is not None and config.media_enrichment.features.mllm.enabled
        else OFFLINE_ENGINE
    )
    return {
        "image_verdicts": classifier_version(config),
        "image_enrichments": enrichment_version(config, engine),
        "document_chunks": chunking_version(config),
        "chunk_embeddings": embedding_version(config),
    }


_CODE_VERSIONS = _code_versions()

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

# The per-document checks run inside their assets; the index-wide orphan check has its own job.
_PER_DOCUMENT = dg.AssetSelection.all() - dg.AssetSelection.checks(no_orphan_rows)

ingest_document_job = dg.define_asset_job(
    "ingest_document",
    selection=_PER_DOCUMENT,
    partitions_def=documents_partitions,
    description="Load, enrich, chunk, embed and index one document (one partition).",
)

reenrich_job = dg.define_asset_job(
    "reenrich",
    selection=dg.AssetSelection.assets("image_enrichments").downstream() & _PER_DOCUMENT,
    partitions_def=documents_partitions,
    description="Re-enrich images and rebuild chunks, embeddings and index rows of the selected partitions "
    "(after a prompt or model change); raw documents and image extraction are not re-run.",
)

defs = dg.Definitions(
    assets=ALL_ASSETS,
    asset_checks=[no_orphan_rows],
    jobs=[ingest_document_job, reenrich_job, remove_document_job, reindex_job, audit_indexes_job],
    sensors=[inbox_sensor, version_sensor, audit_after_index_changes],
    schedules=[reindex_schedule],
    resources={
        "io_manager": PickledAssetIOManager(),
        "index_db": IndexDatabase(),
        "lexical": LexicalIndexResource(),
        "rag_config": RagConfigResource(),
    },
)
