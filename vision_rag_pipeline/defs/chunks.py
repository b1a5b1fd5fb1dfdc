"""document_chunks: Markdown with image annotations, split without breaking an annotation."""

from collections import Counter

import dagster as dg

from vision_rag_pipeline.chunks.build import build_chunks
from vision_rag_pipeline.chunks.model import Chunk
from vision_rag_pipeline.defs.checks import ANNOTATIONS_WHOLE, annotations_whole
from vision_rag_pipeline.defs.partitions import batch_check, documents_partitions
from vision_rag_pipeline.defs.resources import RagConfigResource
from vision_rag_pipeline.documents.model import LoadedDocument
from vision_rag_pipeline.enrichment.batch import EnrichmentBatch
from vision_rag_pipeline.enrichment.model import ImageVerdict
from vision_rag_pipeline.images.model import ExtractedImage


@dg.asset(
    partitions_def=documents_partitions,
    group_name="chunks",
    kinds={"python"},
    dagster_type=dict[
        str, list[Chunk]
    ],  # the value's type: a MaterializeResult return annotation says nothing of it
    check_specs=[ANNOTATIONS_WHOLE],
    description="Text, table and Meta-Content image chunks with their source location "
    "(page + bbox for PDF, char span for MHTML).",
)
def document_chunks(
    context: dg.AssetExecutionContext,
    raw_documents: dict[str, LoadedDocument],
    extracted_images: dict[str, list[ExtractedImage]],
    image_verdicts: dict[str, list[ImageVerdict]],
    image_enrichments: dict[str, EnrichmentBatch],
    rag_config: RagConfigResource,
) -> dg.MaterializeResult:
    config = rag_config.load()
    values: dict[str, list[Chunk]] = {}
    checks = {}
    for key, doc in raw_documents.items():
        chunks = build_chunks(
            key,
            doc,
            extracted_images[key],
            image_enrichments[key].results,
            image_verdicts[key],
            config.loader,
            config.splitter,
        )
        kinds = Counter(c.kind for c in chunks)
        preview = "\n\n---\n\n".join(
            f"`{c.chunk_id}` ({c.kind}, page {c.page})\n\n{c.text[:300]}" for c in chunks[:3]
        )
        context.add_asset_metadata(
            {
                "chunks": len(chunks),
                "by_kind": dg.MetadataValue.json(dict(kinds)),
                "chunk_size": config.splitter.chunk_size,
                # chunks per language their text is in (the ingest summary warns an English-only model)
                "languages": dict(
                    Counter(c.metadata["language"] for c in chunks if c.metadata.get("language"))
                ),
                "preview": dg.MetadataValue.md(preview or "_no chunks_"),
            },
            partition_key=key,
        )
        values[key] = chunks
        checks[key] = annotations_whole(chunks)
    return dg.MaterializeResult(value=values, check_results=[batch_check(checks)])
