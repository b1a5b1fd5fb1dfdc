"""The inbox sensor: drop an MHTML or PDF file in the inbox and it is ingested; change it and it is
re-ingested; delete it and it disappears from the partitions and every index.

The inbox is one of the doors of `defs/intake.py`: a new or changed file is requested there like any
other's (recorded as a duplicate when another document has its bytes), and the `ingest_requests`
sensor turns the requests into runs. This sensor requests the `remove_document` runs of deleted
files itself.

Its state is the registry table (one row per file: size, mtime, sha256), not its cursor: a tick over an
unchanged inbox reads no file contents and writes nothing, however many files it holds. A file is
re-ingested only when its hash changed, and only once it stopped changing: its size and mtime held
still over one tick, or nothing wrote to it for `VISION_RAG_INBOX_SETTLE_SECONDS` (default: the
tick interval).

A tick takes at most `VISION_RAG_SENSOR_RUNS_PER_TICK` files (new, changed or deleted; oldest first)
and none while that many of its requests still wait for a run: a drop of 100,000 files is taken over
the following ticks, each well within Dagster's 60 s, instead of one tick that times out. A new or
changed file's request is a row of the registry, written in the tick that reads it: it stands
whether or not Dagster stores the tick. A deletion's state is dropped by the next tick, which runs
only once Dagster stored this one's `remove_document` requests with its cursor (`accepted`).

A tick ends within TICK_BUDGET_S of its start: where listing the inbox (a `stat` of every file: 1 s
of CPU at 100,000 files, 14 s a tick at load 17-20) outlasts its share, the listing stops and the
next tick goes on from where it stopped, in name order; a known file is taken as deleted only by a
tick that listed its place (or, at the end of a pass, found its directory gone).

A file named like a document that is not one (empty, a Word file renamed `.pdf`) gets one line in
the tick's log when first seen, and is refused in the registry with its reason, where `vision-rag
status` reads it as it reads every door's; it is not read again while it stays as it is. Each tick
says how many files it saw and how many it skipped.
"""

import json
import os

import dagster as dg

from vision_rag_pipeline.core.config import (
    INBOX_ENV,
    inbox_dir,
    inbox_settle_seconds,
    sensor_interval_seconds,
    sensor_runs_per_tick,
)
from vision_rag_pipeline.core.deadline import Deadline
from vision_rag_pipeline.defs.documents import RemoveDocumentConfig, remove_document_job
from vision_rag_pipeline.defs.intake import request_files
from vision_rag_pipeline.defs.partitions import documents_partitions
from vision_rag_pipeline.defs.resources import IndexDatabase
from vision_rag_pipeline.documents.inbox import InboxScan, ScanPosition, scan_inbox
from vision_rag_pipeline.documents.registry import DocumentRegistry, FileState, display_path

MAX_LOGGED = 20  # lines of one kind per tick: name a few, count the rest
# A tick ends within TICK_BUDGET_S of its start (a `Deadline`; 10 s a tick is the target, the rest is
# Dagster's around the call): the listing and the reading of files take at most SCAN_BUDGET_S of it,
# the rest of the inbox is listed by the next ticks from where it stopped (the cursor's `scan`).
TICK_BUDGET_S = 8.0
SCAN_BUDGET_S = 5.0
INTERVAL_SECONDS = sensor_interval_seconds(30)
FILES_PER_TICK = sensor_runs_per_tick(200)
SENSOR_NAME = "inbox_sensor"


@dg.sensor(
    name=SENSOR_NAME,
    jobs=[remove_document_job],
    minimum_interval_seconds=INTERVAL_SECONDS,
    default_status=dg.DefaultSensorStatus.RUNNING,
    description="Watches VISION_RAG_INBOX (default $VISION_RAG_HOME/inbox): new or changed MHTML/PDF files "
    "are ingested (one partition each), deleted ones removed from the partitions and every index, "
    f"at most {FILES_PER_TICK} a tick. Links pointing out of the inbox, and files that are not documents, "
    "are skipped with a reason.",
)
def inbox_sensor(
    context: dg.SensorEvaluationContext, index_db: IndexDatabase
) -> dg.SensorResult | dg.SkipReason:
    deadline = Deadline(TICK_BUDGET_S)
    registry = index_db.registry()
    cursor = json.loads(context.cursor) if context.cursor else {}
    _commit_accepted(registry, cursor.get("accepted", {}))
    inbox = inbox_dir()
    if not inbox.is_dir():
        # Never read a missing (e.g. unmounted) inbox as "every file was deleted".
        context.update_cursor(
            json.dumps({"settling": cursor["settling"]}) if cursor.get("settling") else None
        )
        return dg.SkipReason(f"inbox {inbox} does not exist; create it or set {INBOX_ENV}")
    root = bytes(inbox.resolve())
    known = registry.inbox_files(root)
    if "files" in cursor:  # the state an older version kept in the cursor: adopt it once, not re-ingest all
        registry.record_inbox({p: s for p, s in _cursor_state(cursor).items() if p not in known})
        known = registry.inbox_files(root)
    rejected_before = registry.inbox_rejections(root)
    waiting_runs = registry.waiting("inbox")  # its requests no run has taken yet
    budget = max(0, FILES_PER_TICK - waiting_runs)
    settling = {bytes.fromhex(path): tuple(seen) for path, seen in cursor.get("settling", {}).items()}
    scan = scan_inbox(
        inbox,
        known,
        settling,
        int(inbox_settle_seconds(INTERVAL_SECONDS) * 1e9),
        {path: (why.size, why.mtime_ns) for path, why in rejected_before.items()},
        budget,
        deadline.within(SCAN_BUDGET_S),
        _position(cursor.get("scan")),
    )
    _log_lines(context, [f"skipped {reason}" for reason in scan.skipped])
    _log_lines(
        context, [f"skipped {display_path(path)}: {why.reason}" for path, why in scan.rejected.items()]
    )
    still_rejected = scan.rejected_unchanged | set(scan.rejected)
    cleared = [path for path in rejected_before if path not in still_rejected and scan.covers(path)]
    if scan.rejected or cleared:
        registry.record_inbox_rejections(scan.rejected, cleared)

    gone = [path for path in known if path not in scan.present and scan.covers(path)]
    # what the tick needs of the known files beyond (size, mtime): those read again and those gone
    entries = registry.inbox_entries([*(path for path in scan.read if path in known), *gone[:budget]])
    changed = {
        path: "changed" if path in known else "new"
        for path, state in scan.read.items()
        if path not in entries or entries[path].state.sha256 != state.sha256
    }
    deleted = [entries[path].document_id for path in gone[: max(0, budget - len(changed))] if path in entries]
    # New, changed and touched files (same bytes, new mtime: recorded, so the next tick does not hash
    # them again) go through the one way in.
    if scan.read:
        request_files(
            context.instance,
            list(scan.read),
            "inbox",
            context.repository_def.asset_graph,
            versions=False,
            inbox_states=scan.read,
            resolve=False,
        )
    for fate in registry.fates(deleted) if deleted else []:
        if fate.state == "duplicate":  # no partition and no rows of its own: forgotten here, no run
            registry.forget(fate.document_id)
            deleted.remove(fate.document_id)

    summary = _summary(inbox, scan, changed, len(deleted), len(gone) - len(deleted), waiting_runs)
    # what the previous ticks saw changing where this one did not list stays for the tick that does
    settling = {path: seen for path, seen in settling.items() if not scan.covers(path)} | scan.settling
    state = {
        "settling": {path.hex(): list(seen) for path, seen in settling.items()},
        "accepted": {"gone": deleted} if deleted else {},
        "scan": scan.resume
        and [
            scan.resume.directory.hex(),
            scan.resume.after.hex(),
            [directory.hex() for directory in scan.resume.pending],
        ],
    }
    state = {key: value for key, value in state.items() if value}
    if state or context.cursor:
        context.update_cursor(json.dumps(state) if state else None)

    # No run keys: a deletion's state is committed once its request was accepted, so it is requested
    # once, and a run key would swallow a file deleted and later added back with the same bytes.
    run_requests = [
        dg.RunRequest(
            job_name=remove_document_job.name,
            run_config=dg.RunConfig(
                ops={"remove_document_rows": RemoveDocumentConfig(document_id=document_id)}
            ),
        )
        for document_id in deleted
    ]
    if not run_requests:
        return dg.SkipReason(summary)
    context.log.info(summary)
    return dg.SensorResult(
        run_requests=run_requests,
        dynamic_partitions_requests=[documents_partitions.build_delete_request(deleted)],
    )


def _position(saved: list | None) -> ScanPosition | None:
    """Where the last tick's listing stopped, as its cursor keeps it (paths in hex)."""
    if not saved:
        return None
    directory, after, pending = saved
    return ScanPosition(bytes.fromhex(directory), bytes.fromhex(after), [bytes.fromhex(p) for p in pending])


def _commit_accepted(registry: DocumentRegistry, accepted: dict) -> None:
    """What the previous tick requested, now that Dagster stored its requests (and so this cursor)."""
    if accepted.get("gone"):
        registry.leave_inbox(accepted["gone"])


def _summary(
    inbox: os.PathLike,
    scan: InboxScan,
    changed: dict[bytes, str],
    deleted: int,
    deletions_waiting: int,
    waiting_runs: int,
) -> str:
    """One line: what the tick saw, what it requested (the ingest_requests sensor runs the new and
    changed files), what it skipped and what waits."""
    new = sum(1 for change in changed.values() if change == "new")
    not_documents = len(scan.rejected) + len(scan.rejected_unchanged)
    parts = [
        f"{scan.seen} files in {inbox}: {new} new, {len(changed) - new} changed, {deleted} deleted, "
        f"{len(scan.present) - len(changed)} as before",
        f"{not_documents + len(scan.skipped)} skipped ({not_documents} not documents, {len(scan.skipped)} links "
        "or unreadable folders)",
    ]
    if scan.resume:
        parts.append(
            f"listed as far as {display_path(scan.resume.directory)} in this tick's time, the next tick goes on"
            " from there"
        )
    if scan.settling:
        parts.append(f"{len(scan.settling)} still changing, read once they hold still")
    if scan.waiting or deletions_waiting:
        parts.append(
            f"{scan.waiting + deletions_waiting} waiting for the next ticks (at most {FILES_PER_TICK} a tick; "
            f"{waiting_runs} of its requests wait for a run)"
        )
    return "; ".join(parts)


def _log_lines(context: dg.SensorEvaluationContext, lines: list[str]) -> None:
    for line in lines[:MAX_LOGGED]:
        context.log.warning(line)
    if len(lines) > MAX_LOGGED:
        context.log.warning(f"... and {len(lines) - MAX_LOGGED} more")


def _cursor_state(cursor: dict) -> dict[bytes, FileState]:
    """{path: state} from the cursor the sensor kept before its state moved to the registry."""
    files = cursor.get("files", {})
    return {os.fsencode(path): FileState(s["size"], s["mtime_ns"], s["sha256"]) for path, s in files.items()}
