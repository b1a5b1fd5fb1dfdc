"""The Dagster entry point: `dagster dev -m vision_rag_pipeline.definitions`."""

from __future__ import annotations

import dagster as dg

from vision_rag_pipeline.chunks.assets import document_chunks
from vision_rag_pipeline.documents.assets import raw_documents
from vision_rag_pipeline.embeddings.assets import chunk_embeddings
from vision_rag_pipeline.enrichment.assets import image_enrichments, image_verdicts
from vision_rag_pipeline.images.assets import extracted_images
from vision_rag_pipeline.indexes.assets import lexical_index, pgvector_index
from vision_rag_pipeline.partitions import documents_partitions
from vision_rag_pipeline.resources import IndexDatabase, LexicalIndexResource, RagConfigResource

ALL_ASSETS = [
    raw_documents,
    extracted_images,
    image_verdicts,
    image_enrichments,
    document_chunks,
    chunk_embeddings,
    pgvector_index,
    lexical_index,
]

ingest_document_job = dg.define_asset_job(
    "ingest_document",
    selection=dg.AssetSelection.assets(*ALL_ASSETS),
    partitions_def=documents_partitions,
    description="Load, enrich, chunk, embed and index one document (one partition).",
)

defs = dg.Definitions(
    assets=ALL_ASSETS,
    jobs=[ingest_document_job],
    resources={
        "index_db": IndexDatabase(),
        "lexical": LexicalIndexResource(),
        "rag_config": RagConfigResource(),
    },
)
