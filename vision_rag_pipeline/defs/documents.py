"""The documents area: `raw_documents` and the `remove_document` job (the inbox sensor that requests
it lives in `defs.inbox`, next to the ingest job it also requests).

Deletion runs as its own small job (`remove_document`) rather than inside the sensor: it shows up in the
UI's run history with its counts, runs wherever runs run (the code that can reach the indexes in a
cluster), and a failure is visible and retryable instead of failing sensor ticks. The sensor only
removes the partition, which it must do in the same tick as it notices the deletion.
"""

import warnings

import dagster as dg

from vision_rag_pipeline.defs.io_manager import delete_partition_values, hold_document
from vision_rag_pipeline.defs.partitions import documents_partitions
from vision_rag_pipeline.defs.resources import IndexDatabase, LexicalIndexResource, RagConfigResource
from vision_rag_pipeline.documents.loader import load_document_bytes
from vision_rag_pipeline.documents.model import LoadedDocument
from vision_rag_pipeline.indexes.pgvector_store import delete_document_rows

# raw_documents' data version (the file's sha256) is what makes only changed files stale downstream;
# Dagster calls the `data_version` argument beta and says so in every run's captured stderr. That one
# notice alone is silenced.
warnings.filterwarnings(
    "ignore", message="Parameter `data_version` of initializer `Output.__init__`", category=dg.BetaWarning
)


@dg.asset(
    partitions_def=documents_partitions,
    group_name="documents",
    kinds={"python", "file"},
    description="The file as received (MHTML or PDF; read from the copy stored at registration), parsed into ordered, located elements and images. "
    "Its data version is the file's sha256, so only changed files make downstream assets stale.",
)
def raw_documents(
    context: dg.AssetExecutionContext, index_db: IndexDatabase, rag_config: RagConfigResource
) -> dg.Output[LoadedDocument]:
    registry = index_db.registry()
    registered = registry.get(context.partition_key)
    context.log.info(f"loading {registered.source_path} (the copy stored when it was registered)")
    doc = load_document_bytes(
        registry.content(context.partition_key),
        registered.abs_path,
        source_path=registered.source_path,
        limits=rag_config.load().limits.documents,
    )
    return dg.Output(
        doc,
        data_version=dg.DataVersion(doc.sha256),
        metadata={
            "source_path": registered.source_path,
            "sha256": doc.sha256,
            "size_bytes": doc.size,
            "mime": doc.mime,
            "title": doc.title,
            "pages": doc.pages or 0,
            "elements": len(doc.elements),
            "images": len(doc.images),
            "headers": dg.MetadataValue.json({k: str(v) for k, v in doc.metadata.items()}),
        },
    )


class RemoveDocumentConfig(dg.Config):
    document_id: str


@dg.op(
    description="Delete a document's rows from pgvector (chunks, rag_images), the lexical index, "
    "its stored asset values and the registry (with its stored bytes)."
)
def remove_document_rows(
    context: dg.OpExecutionContext,
    config: RemoveDocumentConfig,
    index_db: IndexDatabase,
    lexical: LexicalIndexResource,
) -> dg.Output[int]:
    # an ingest of this document still running would write its rows back after the deletion
    hold_document(config.document_id, context.run_id, context.instance, context.log, index_db.database_url())
    vector_rows = delete_document_rows(config.document_id, index_db.database_url())
    lexical_rows = lexical.open().delete_document(config.document_id)
    delete_partition_values(config.document_id, index_db.database_url())
    index_db.registry().forget(config.document_id)
    context.log.info(f"{config.document_id}: removed {vector_rows} vector rows, {lexical_rows} lexical rows")
    return dg.Output(
        vector_rows,
        metadata={
            "document_id": config.document_id,
            "vector_rows": vector_rows,
            "lexical_rows": lexical_rows,
        },
    )


@dg.job(name="remove_document", description="Remove a deleted document from every index.")
def remove_document_job() -> None:
    remove_document_rows()
