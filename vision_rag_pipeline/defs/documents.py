"""The documents area: `raw_documents` and the `remove_document` job (requested by the inbox sensor
for a deleted file, and run by `vision-rag forget`).

Deletion runs as its own small job (`remove_document`) rather than inside the sensor: it shows up in the
UI's run history with its counts, runs wherever runs run (the code that can reach the indexes in a
cluster), and a failure is visible and retryable instead of failing sensor ticks. The sensor also
removes the partition in the tick that notices the deletion; the job removes it too, for `forget`.
"""

import dagster as dg

from vision_rag_pipeline.defs.io_manager import delete_partition_values, hold_documents
from vision_rag_pipeline.defs.partitions import DocumentFailures, documents_partitions
from vision_rag_pipeline.defs.resources import IndexDatabase, LexicalIndexResource, RagConfigResource
from vision_rag_pipeline.documents.loader import load_document_bytes
from vision_rag_pipeline.documents.model import DocumentError, LoadedDocument
from vision_rag_pipeline.indexes.pgvector_store import delete_document_rows


@dg.asset(
    partitions_def=documents_partitions,
    group_name="documents",
    kinds={"python", "file"},
    description="The file as received (MHTML or PDF; read from the copy stored at registration), parsed into ordered, located elements and images. "
    "Its sha256 (metadata) says whether the file changed.",
)
def raw_documents(
    context: dg.AssetExecutionContext, index_db: IndexDatabase, rag_config: RagConfigResource
) -> dg.Output[dict[str, LoadedDocument]]:
    registry = index_db.registry()
    limits = rag_config.load().limits.documents
    # held from the first step on: a document that fails to load counted its attempt too
    hold_documents(
        context.partition_keys, context.run_id, context.instance, context.log, index_db.database_url()
    )
    docs: dict[str, LoadedDocument] = {}
    failures = DocumentFailures()
    for key in context.partition_keys:
        with failures.document(key):
            try:
                registered = registry.get(key)
                data = registry.content(key)
            except KeyError as exc:
                raise DocumentError(exc.args[0]) from None
            context.log.info(f"loading {registered.source_path} (the copy stored when it was registered)")
            doc = load_document_bytes(
                data, registered.abs_path, source_path=registered.source_path, limits=limits
            )
            context.add_asset_metadata(
                {
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
                partition_key=key,
            )
            docs[key] = doc
    failures.raise_if_any()
    return dg.Output(docs)


class RemoveDocumentConfig(dg.Config):
    document_id: str


@dg.op(
    description="Delete a document's rows from pgvector (chunks, rag_images), the lexical index, "
    "its stored asset values, its partition and the registry (with its stored bytes and the paths "
    "recorded as its duplicates)."
)
def remove_document_rows(
    context: dg.OpExecutionContext,
    config: RemoveDocumentConfig,
    index_db: IndexDatabase,
    lexical: LexicalIndexResource,
) -> dg.Output[int]:
    # an ingest of this document still running would write its rows back after the deletion
    hold_documents(
        [config.document_id], context.run_id, context.instance, context.log, index_db.database_url()
    )
    vector_rows = delete_document_rows(config.document_id, index_db.database_url())
    lexical_rows = lexical.open().delete_document(config.document_id)
    delete_partition_values(config.document_id, index_db.database_url())
    duplicates = index_db.registry().forget(config.document_id)
    context.instance.delete_dynamic_partition(documents_partitions.name, config.document_id)
    context.log.info(
        f"{config.document_id}: removed {vector_rows} vector rows, {lexical_rows} lexical rows, its partition"
        + (f" and the paths recorded as its duplicates ({', '.join(duplicates)})" if duplicates else "")
    )
    return dg.Output(
        vector_rows,
        metadata={
            "document_id": config.document_id,
            "vector_rows": vector_rows,
            "lexical_rows": lexical_rows,
            "duplicates_forgotten": dg.MetadataValue.json(duplicates),
        },
    )


@dg.job(name="remove_document", description="Remove a deleted document from every index.")
def remove_document_job() -> None:
    remove_document_rows()
