"""chunk_embeddings: one vector per chunk."""

import dagster as dg

from vision_rag_pipeline.chunks.model import Chunk
from vision_rag_pipeline.defs.checks import EVERY_CHUNK_EMBEDDED, every_chunk_embedded
from vision_rag_pipeline.defs.host_inputs import (
    EMBEDDING_MODEL,
    embedding_model_sha256,
    require_launching_host_inputs,
)
from vision_rag_pipeline.defs.partitions import batch_check, documents_partitions
from vision_rag_pipeline.defs.resources import EmbeddingModel, IndexDatabase, RagConfigResource
from vision_rag_pipeline.embeddings.cache import encode_cached
from vision_rag_pipeline.embeddings.encoder import model_variant
from vision_rag_pipeline.embeddings.model import ChunkEmbeddings
from vision_rag_pipeline.embeddings.pages import embed_with_page_units


@dg.asset(
    partitions_def=documents_partitions,
    group_name="embeddings",
    kinds={"python", "pytorch"},
    dagster_type=dict[
        str, ChunkEmbeddings
    ],  # the value's type: a MaterializeResult return annotation says nothing of it
    check_specs=[EVERY_CHUNK_EMBEDDED],
    description="Sentence-transformers vectors (unit-normalized) for every chunk; model and dimension "
    "recorded. Only chunks whose text is not in the embedding cache are encoded; a page unit is the mean "
    "of its page's chunks.",
)
def chunk_embeddings(
    context: dg.AssetExecutionContext,
    document_chunks: dict[str, list[Chunk]],
    rag_config: RagConfigResource,
    index_db: IndexDatabase,
    embedding_model: EmbeddingModel,
) -> dg.MaterializeResult:
    config = rag_config.load()
    require_launching_host_inputs(context, config, EMBEDDING_MODEL)
    embedding = config.embedding
    variant = model_variant(embedding.model, embedding.precision)
    values: dict[str, ChunkEmbeddings] = {}
    checks = {}
    for key, chunks in document_chunks.items():
        vectors, computed = embed_with_page_units(
            chunks,
            lambda texts: encode_cached(
                texts,
                embedding.model,
                lambda missing: embedding_model.encode(missing, embedding),
                index_db.database_url(),
                embedding.precision,
            ),
        )
        dim = int(vectors.shape[1])
        context.add_asset_metadata(
            {
                "model": variant,
                "model_files_sha256": embedding_model_sha256(embedding.model),
                "dim": dim,
                "vectors": len(vectors),
                "computed": computed,
                "from_cache": len(vectors) - computed,
            },
            partition_key=key,
        )
        values[key] = ChunkEmbeddings(model=variant, dim=dim, vectors=vectors)
        checks[key] = every_chunk_embedded(chunks, vectors, dim)
    return dg.MaterializeResult(value=values, check_results=[batch_check(checks)])
