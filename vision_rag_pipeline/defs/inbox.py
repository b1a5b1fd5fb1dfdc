"""The inbox sensor: drop an MHTML or PDF file in the inbox and it is ingested; change it and it is
re-ingested; delete it and it disappears from the partitions and every index.

Its state is the registry table (one row per file: size, mtime, sha256), not its cursor: a tick over an
unchanged inbox reads no file contents and writes nothing, however many files it holds. A file is
re-ingested only when its hash changed, and only once it stopped changing: its size and mtime held
still over one tick, or nothing wrote to it for `VISION_RAG_INBOX_SETTLE_SECONDS` (default: the
tick interval). The cursor holds only what the tick saw of the files still changing. The sensor targets both jobs it requests, `ingest_document`
and `remove_document` (Dagster refuses a RunRequest for a job the sensor does not declare).
"""

import json
import os

import dagster as dg

from vision_rag_pipeline.core.config import (
    INBOX_ENV,
    inbox_dir,
    inbox_settle_seconds,
    sensor_interval_seconds,
)
from vision_rag_pipeline.defs.documents import RemoveDocumentConfig, remove_document_job
from vision_rag_pipeline.defs.jobs import ingest_document_job
from vision_rag_pipeline.defs.partitions import documents_partitions
from vision_rag_pipeline.defs.resources import IndexDatabase
from vision_rag_pipeline.documents.inbox import scan_inbox
from vision_rag_pipeline.documents.registry import FileState, display_path

MAX_LOGGED_SKIPS = 20  # the same links are skipped on every tick: name a few, count the rest
INTERVAL_SECONDS = sensor_interval_seconds(30)


@dg.sensor(
    name="inbox_sensor",
    jobs=[ingest_document_job, remove_document_job],
    minimum_interval_seconds=INTERVAL_SECONDS,
    default_status=dg.DefaultSensorStatus.RUNNING,
    description="Watches VISION_RAG_INBOX (default $VISION_RAG_HOME/inbox): new or changed MHTML/PDF files "
    "are ingested (one partition each), deleted ones removed from the partitions and every index. "
    "Links pointing out of the inbox are skipped.",
)
def inbox_sensor(
    context: dg.SensorEvaluationContext, index_db: IndexDatabase
) -> dg.SensorResult | dg.SkipReason:
    inbox = inbox_dir()
    if not inbox.is_dir():
        # Never read a missing (e.g. unmounted) inbox as "every file was deleted".
        return dg.SkipReason(f"inbox {inbox} does not exist; create it or set {INBOX_ENV}")
    registry = index_db.registry()
    known = registry.inbox_files(bytes(inbox.resolve()))
    cursor = json.loads(context.cursor) if context.cursor else {}
    if "files" in cursor:  # the state an older version kept in the cursor: adopt it once, not re-ingest all
        registry.record_inbox({p: s for p, s in _cursor_state(cursor).items() if p not in known})
        known = registry.inbox_files(bytes(inbox.resolve()))
    settling = {
        bytes.fromhex(path): (size, mtime) for path, (size, mtime) in cursor.get("settling", {}).items()
    }
    scan = scan_inbox(
        inbox,
        {path: entry.state for path, entry in known.items()},
        settling,
        int(inbox_settle_seconds(INTERVAL_SECONDS) * 1e9),
    )
    if scan.settling or context.cursor:
        state = {path.hex(): list(seen) for path, seen in scan.settling.items()}
        context.update_cursor(json.dumps({"settling": state}) if state else None)
    for reason in scan.skipped[:MAX_LOGGED_SKIPS]:
        context.log.warning(f"skipped {reason}")
    if len(scan.skipped) > MAX_LOGGED_SKIPS:
        context.log.warning(f"... and {len(scan.skipped) - MAX_LOGGED_SKIPS} more skipped")

    changed = {
        path: "changed" if path in known else "new"
        for path in scan.restated
        if path not in known or known[path].state.sha256 != scan.files[path].sha256
    }
    deleted = [entry.document_id for path, entry in known.items() if path not in scan.files]
    # A touched file (same bytes, new mtime) is recorded too, so the next tick does not hash it again.
    ids = registry.record_inbox({path: scan.files[path] for path in scan.restated}) if scan.restated else {}
    if deleted:
        registry.leave_inbox(deleted)

    # No run keys: the registry already makes each change requested once, and a run key would
    # swallow a file deleted and later added back with the same content.
    run_requests = [
        dg.RunRequest(
            job_name=ingest_document_job.name,
            partition_key=ids[path],
            tags={"vision_rag/inbox_file": display_path(path), "vision_rag/change": change},
        )
        for path, change in changed.items()
    ] + [
        dg.RunRequest(
            job_name=remove_document_job.name,
            run_config=dg.RunConfig(
                ops={"remove_document_rows": RemoveDocumentConfig(document_id=document_id)}
            ),
            tags={"vision_rag/document_id": document_id},
        )
        for document_id in deleted
    ]
    partition_requests: list[dg.AddDynamicPartitionsRequest | dg.DeleteDynamicPartitionsRequest] = []
    if changed:  # adding a partition that exists is a no-op, so a changed file is covered too
        partition_requests.append(documents_partitions.build_add_request([ids[path] for path in changed]))
    if deleted:
        partition_requests.append(documents_partitions.build_delete_request(deleted))
    if not run_requests:
        writing = f"; {len(scan.settling)} still changing, read once they hold still" if scan.settling else ""
        return dg.SkipReason(f"no change among {len(scan.files)} files in {inbox}{writing}")
    return dg.SensorResult(run_requests=run_requests, dynamic_partitions_requests=partition_requests)


def _cursor_state(cursor: dict) -> dict[bytes, FileState]:
    """{path: state} from the cursor the sensor kept before its state moved to the registry."""
    files = cursor.get("files", {})
    return {os.fsencode(path): FileState(s["size"], s["mtime_ns"], s["sha256"]) for path, s in files.items()}
