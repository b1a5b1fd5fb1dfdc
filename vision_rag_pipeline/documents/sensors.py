"""The inbox: drop an MHTML or PDF file in a directory and it is ingested; change it and it is re-ingested;
delete it and it disappears from every index.

The sensor's cursor maps each file it has seen to its size, mtime and sha256. A file is hashed only when
its size or mtime moved, and re-ingested only when its hash changed (a `touch` costs nothing).

Deletion runs as its own small job (`remove_document`) rather than inside the sensor: it shows up in the
UI's run history with its counts, runs wherever runs run (the code that can reach the indexes in a
cluster), and a failure is visible and retryable instead of failing sensor ticks. The sensor only
removes the partition, which it must do in the same tick as it notices the deletion.
"""

import hashlib
import json
import os
from pathlib import Path

import dagster as dg

from vision_rag_pipeline.config import home
from vision_rag_pipeline.documents.registry import document_id_for
from vision_rag_pipeline.documents.sniff import sniff_document_kind
from vision_rag_pipeline.indexes.pgvector_store import delete_document_rows
from vision_rag_pipeline.partitions import documents_partitions
from vision_rag_pipeline.resources import IndexDatabase, LexicalIndexResource

INBOX_ENV = "VISION_RAG_INBOX"
DOCUMENT_SUFFIXES = (".mhtml", ".mht", ".pdf")
_HASH_BLOCK = 1 << 20


def inbox_dir() -> Path:
    """`VISION_RAG_INBOX`, else `$VISION_RAG_HOME/inbox`."""
    configured = os.environ.get(INBOX_ENV)
    return Path(configured).expanduser().resolve() if configured else home() / "inbox"


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while block := handle.read(_HASH_BLOCK):
            digest.update(block)
    return digest.hexdigest()


def scan_inbox(inbox: Path, seen: dict[str, dict]) -> dict[str, dict]:
    """{absolute path: {size, mtime_ns, sha256}} for every document file under `inbox`.

    `seen` is the previous scan: a file whose size and mtime did not move keeps its old hash unread.
    Files that are not MHTML/PDF by name and by their bytes are left out.
    """
    found: dict[str, dict] = {}
    for path in sorted(inbox.rglob("*")):
        if path.suffix.lower() not in DOCUMENT_SUFFIXES or path.name.startswith(".") or not path.is_file():
            continue
        try:
            stat = path.stat()
            key = str(path.resolve())
            previous = seen.get(key)
            if previous and (previous["size"], previous["mtime_ns"]) == (stat.st_size, stat.st_mtime_ns):
                found[key] = previous
                continue
            if sniff_document_kind(path) is None:
                continue
            found[key] = {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns, "sha256": file_sha256(path)}
        except OSError:
            continue  # vanished or unreadable while we looked: the next tick sees the settled state
    return found


class RemoveDocumentConfig(dg.Config):
    document_id: str


@dg.op(
    description="Delete a document's rows from pgvector (chunks, rag_images), the lexical index "
    "and the registry."
)
def remove_document_rows(
    context: dg.OpExecutionContext,
    config: RemoveDocumentConfig,
    index_db: IndexDatabase,
    lexical: LexicalIndexResource,
) -> dg.Output[int]:
    vector_rows = delete_document_rows(config.document_id, index_db.database_url())
    lexical_rows = lexical.open().delete_document(config.document_id)
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
