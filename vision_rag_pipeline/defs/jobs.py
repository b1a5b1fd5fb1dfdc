"""The asset jobs over one document partition: ingest everything, or re-enrich from the enrichments on."""

import dagster as dg

from vision_rag_pipeline.defs.host_inputs import host_input_tags
from vision_rag_pipeline.defs.indexes import no_orphan_rows
from vision_rag_pipeline.defs.partitions import documents_partitions

# The per-document checks run inside their assets; the index-wide orphan check has its own job.
PER_DOCUMENT = dg.AssetSelection.all() - dg.AssetSelection.checks(no_orphan_rows)
REENRICH_SELECTION = dg.AssetSelection.assets("image_enrichments").downstream() & PER_DOCUMENT

ingest_document_job = dg.define_asset_job(
    "ingest_document",
    selection=PER_DOCUMENT,
    partitions_def=documents_partitions,
    description="Load, enrich, chunk, embed and index one document (one partition).",
    run_tags=host_input_tags(),  # what a step on another host must match (defs/host_inputs.py)
)

reenrich_job = dg.define_asset_job(
    "reenrich",
    selection=REENRICH_SELECTION,
    partitions_def=documents_partitions,
    description="Re-enrich images and rebuild chunks, embeddings and index rows of the selected partitions "
    "(after a prompt or model change); raw documents and image extraction are not re-run.",
    run_tags=host_input_tags(),
)
