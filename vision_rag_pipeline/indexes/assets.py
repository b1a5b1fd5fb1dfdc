"""pgvector_index and lexical_index: a partition's rows replaced, never duplicated."""

import dagster as dg

from vision_rag_pipeline.chunks.model import Chunk
from vision_rag_pipeline.embeddings.assets import ChunkEmbeddings
from vision_rag_pipeline.enrichment.service import EnrichmentBatch
from vision_rag_pipeline.indexes.checks import (
    LEXICAL_ROWS_MATCH_CHUNKS,
    PGVECTOR_ROWS_MATCH_CHUNKS,
    rows_match_chunks,
)
from vision_rag_pipeline.indexes.lexical import LexicalDoc
from vision_rag_pipeline.partitions import documents_partitions
from vision_rag_pipeline.resources import IndexDatabase, LexicalIndexResource


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
    document_chunks: list[Chunk],
    chunk_embeddings: ChunkEmbeddings,
    image_enrichments: EnrichmentBatch,
    index_db: IndexDatabase,
) -> dg.MaterializeResult:
    store = index_db.vector_store(chunk_embeddings.dim)
    images = [
        (image_enrichments.results[c.metadata["image_sha256"]], chunk_embeddings.vectors[i])
        for i, c in enumerate(document_chunks)
        if c.kind == "image"
        and "image_excerpt" not in c.metadata  # one rag_images row per image: its Meta-Content chunk
        and c.metadata.get("image_sha256") in image_enrichments.results
    ]
    store.replace_document(context.partition_key, document_chunks, chunk_embeddings.vectors, images)
    rows = store.count(context.partition_key)
    return dg.MaterializeResult(
        metadata={"rows": rows, "image_rows": len(images), "dim": chunk_embeddings.dim},
        check_results=[rows_match_chunks(PGVECTOR_ROWS_MATCH_CHUNKS, rows, len(document_chunks))],
    )


@dg.asset(
    partitions_def=documents_partitions,
    group_name="indexes",
    kinds={"tantivy", "elasticsearch"},
    check_specs=[LEXICAL_ROWS_MATCH_CHUNKS],
    description="BM25 index of the same chunks (tantivy on disk by default, Elasticsearch when configured).",
)
def lexical_index(
    context: dg.AssetExecutionContext, document_chunks: list[Chunk], lexical: LexicalIndexResource
) -> dg.MaterializeResult:
    index = lexical.open()
    index.replace_document(context.partition_key, [LexicalDoc.of(c) for c in document_chunks])
    rows = index.count(context.partition_key)
    return dg.MaterializeResult(
        metadata={"rows": rows},
        check_results=[rows_match_chunks(LEXICAL_ROWS_MATCH_CHUNKS, rows, len(document_chunks))],
    )
