"""The documents area: `raw_documents`, the inbox sensor and the `remove_document` job.

Drop an MHTML or PDF file in the inbox and it is ingested; change it and it is re-ingested; delete it
and it disappears from every index. The sensor's cursor maps each file it has seen to its size, mtime
and sha256, and a file is re-ingested only when its hash changed.

Deletion runs as its own small job (`remove_document`) rather than inside the sensor: it shows up in the
UI's run history with its counts, runs wherever runs run (the code that can reach the indexes in a
cluster), and a failure is visible and retryable instead of failing sensor ticks. The sensor only
removes the partition, which it must do in the same tick as it notices the deletion.
"""

import json

import dagster as dg

from vision_rag_pipeline.defs.io_manager import delete_partition_values
from vision_rag_pipeline.defs.partitions import documents_partitions
from vision_rag_pipeline.defs.resources import IndexDatabase, LexicalIndexResource
from vision_rag_pipeline.documents.inbox import INBOX_ENV, inbox_dir, scan_inbox
from vision_rag_pipeline.documents.loader import load_document_bytes
from vision_rag_pipeline.documents.model import LoadedDocument
from vision_rag_pipeline.documents.registry import document_id_for
from vision_rag_pipeline.indexes.pgvector_store import delete_document_rows


@dg.asset(
    partitions_def=documents_partitions,
    group_name="documents",
    kinds={"python", "file"},
    description="The file as received (MHTML or PDF; read from the copy stored at registration), parsed into ordered, located elements and images. "
    "Its data version is the file's sha256, so only changed files make downstream assets stale.",
)
def raw_documents(context: dg.AssetExecutionContext, index_db: IndexDatabase) -> dg.Output[LoadedDocument]:
    registry = index_db.registry()
    registered = registry.get(context.partition_key)
    context.log.info(f"loading {registered.source_path} (the copy stored when it was registered)")
    doc = load_document_bytes(
        registry.content(context.partition_key), registered.abs_path, source_path=registered.source_path
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


@dg.sensor(
    name="inbox_sensor",
    jobs=[remove_document_job],
    minimum_interval_seconds=30,
    default_status=dg.DefaultSensorStatus.RUNNING,
    description="Watches VISION_RAG_INBOX (default $VISION_RAG_HOME/inbox): new or changed MHTML/PDF files "
    "are ingested (one partition each), deleted ones removed from the partitions and every index.",
)
def inbox_sensor(
    context: dg.SensorEvaluationContext, index_db: IndexDatabase
) -> dg.SensorResult | dg.SkipReason:
    inbox = inbox_dir()
    if not inbox.is_dir():
        # Never read a missing (e.g. unmounted) inbox as "every file was deleted".
        return dg.SkipReason(f"inbox {inbox} does not exist; create it or set {INBOX_ENV}")
    seen: dict[str, dict] = json.loads(context.cursor)["files"] if context.cursor else {}
    current = scan_inbox(inbox, seen)

    registry = index_db.registry()
    ingested: list[str] = []
    run_requests: list[dg.RunRequest] = []
    for path, state in current.items():
        previous = seen.get(path)
        if previous and previous["sha256"] == state["sha256"]:
            continue
        document_id = registry.register(path).document_id
        ingested.append(document_id)
        run_requests.append(
            dg.RunRequest(
                job_name="ingest_document",
                partition_key=document_id,
                tags={"vision_rag/inbox_file": path, "vision_rag/change": "changed" if previous else "new"},
            )
        )
    # No run keys: the cursor already makes each change requested once, and a run key would
    # swallow a file deleted and later added back with the same content.
    deleted = [document_id_for(path) for path in seen if path not in current]
    run_requests += [
        dg.RunRequest(
            job_name="remove_document",
            run_config=dg.RunConfig(
                ops={"remove_document_rows": RemoveDocumentConfig(document_id=document_id)}
            ),
            tags={"vision_rag/document_id": document_id},
        )
        for document_id in deleted
    ]
    partition_requests: list[dg.AddDynamicPartitionsRequest | dg.DeleteDynamicPartitionsRequest] = []
    if ingested:  # adding a partition that exists is a no-op, so a changed file is covered too
        partition_requests.append(documents_partitions.build_add_request(ingested))
    if deleted:
        partition_requests.append(documents_partitions.build_delete_request(deleted))
    return dg.SensorResult(
        run_requests=run_requests,
        dynamic_partitions_requests=partition_requests,
        cursor=json.dumps({"files": current}, sort_keys=True),
    )
