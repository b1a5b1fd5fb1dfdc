"""One way in: every door registers its files in the document registry and requests the same runs.

The doors are `vision-rag ingest`, `POST /upload`, the inbox sensor and `vision-rag backfill`; each
calls `request_files` (or `request_documents` for documents already registered). A file no run
could ingest (missing, empty, not an MHTML or PDF) is refused there with a one-line reason; a
file whose bytes another registered document already has is recorded as that document's duplicate
(one set of chunks, both paths); an unchanged file (the same bytes, every asset materialized with
the code versions in effect) is left as it is; the rest are registered (their bytes copied into the
index database), get their partition, and are `requested` (documents/registry.py).

Requested documents become Dagster runs of `ingest_document` (or `reenrich`) in batches: documents
requested together sit next to each other in the partition order, and a batch is one run over that
partition range, so a run's start (a process, imports, the embedding model) is paid per batch. A
door's files are claimable only once all of them are registered (a sensor ticking in another thread
meanwhile would split them), and a tick left with too little time for a batch's range run leaves the
batch whole to the next tick, which skips its reconcile, rather than making runs of one document each.

- Under a Dagster daemon, the `ingest_requests` sensor claims requested documents and returns one
  `RunRequest` per batch: the daemon's queue and launcher run them. It keeps at most
  MAX_WAITING_RUNS of its runs waiting in that queue; the other requests wait in the registry.
  `vision-rag ingest` waits for them and shows their progress.
- Without a daemon, the process that requested them (`vision-rag ingest`, `vision-rag serve`)
  claims them and executes the same batches in-process (defs/runner.py).

Whoever executes a run, `record_outcome` reads the finished run from the instance and records each
document's fate: ingested; failed with the one-line reason of the step that failed; requested again
when the run was lost (its process killed: `abandon_run`) up to `MAX_ATTEMPTS`, or when a batch
failed on another document (the document named by the `Failure` fails alone, the others run again;
a batch failing without naming one is run again one document per run). `reconcile` does this for
every unfinished document, and is the one recovery mechanism: the sensor calls it on every tick
(for as long as the tick's budget gives it, going on the next tick from where it stopped), the CLI
and `serve` before they execute anything and while they wait.
"""

from __future__ import annotations

import datetime as dt
import math
import os
import re
import socket
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, NamedTuple

import dagster as dg
from pydantic import BaseModel

from vision_rag_pipeline.core.config import inbox_dir, max_batch_documents, sensor_interval_seconds
from vision_rag_pipeline.core.deadline import Deadline
from vision_rag_pipeline.core.sniff import why_not_a_document
from vision_rag_pipeline.defs.io_manager import abandon_run
from vision_rag_pipeline.defs.jobs import PER_DOCUMENT, ingest_document_job, reenrich_job
from vision_rag_pipeline.defs.local_storage import LocalEventLogStorage
from vision_rag_pipeline.defs.partitions import FAILED_DOCUMENTS, documents_partitions
from vision_rag_pipeline.defs.resources import IndexDatabase
from vision_rag_pipeline.defs.versions import up_to_date_partitions
from vision_rag_pipeline.documents.inbox import file_sha256
from vision_rag_pipeline.documents.registry import (
    UNFINISHED,
    Claimed,
    DocumentRegistry,
    FileState,
    display_path,
    document_id_for,
    process_gone,
)

# documents per run: a batch's values sit in memory together in each step (VISION_RAG_MAX_BATCH)
MAX_BATCH_DOCUMENTS = max_batch_documents(20)
MAX_BATCH_BYTES = 64 * 2**20  # ... and so do its files' bytes
MAX_ATTEMPTS = 3  # runs a document is given when its run is lost or fails for a reason not its own
RETRY_PAUSE_SECONDS = (5, 30)  # before the second and the third attempt
# A tick's time, which Dagster counts from the tick's start to the creation of its last run, is to stay
# within 10 s whatever the load (#37). TICK_BUDGET_S of it are the sensor's, on a `Deadline` from the
# tick's start: the reconcile (at most RECONCILE_BUDGET_S; the runs it did not look at are the next
# tick's, from where it stopped), the claim, the plan, and the daemon's creation of the tick's runs
# after the tick returned. The rest is Dagster's, around the call (0.2-0.6 s a tick).
# What the daemon pays to create a run: about 1 s (100,000 partitions, 2 shared cores, load 8-15),
# 2-4 s under heavier contention, and for a run over a partition range also one load of every
# partition key per asset and check of the job (its planned events: 12 in ingest_document), 0.4-2.6 s
# each at 100,000 partitions (BENCHMARKS.md "Catalog of 100,000 documents"). The local storage keeps
# the keys it loaded until a partition is added or deleted (defs/local_storage.py): there the daemon
# loads them at most once a tick. A tick makes at most MAX_RUNS_PER_TICK runs, and no more than its
# estimate fits the time left (RUN_CREATION_BUDGET_S at most), none when not one does. A measure of a
# run's creation is what the daemon took for a tick's runs (from the tick's return to the last run's
# submission, as Dagster records it); the estimate is the slowest of the last ESTIMATE_MEASURES
# measures (a tick after a fast one still plans for the pace of the slow ones before it: runs created
# at 0.53 s each were followed by runs at 1.4 s, and a tick planned on the last measure alone took
# 11.0 s); before anything is measured (a daemon's first tick, a measure older than
# ESTIMATE_MAX_AGE_S) it is RUN_CREATION_S, the slow end of what was measured.
# A run over a range writes its planned events for each of its documents: 2-3 s for 20 at load 4,
# where a run of one took 0.3 s, so the two are measured and estimated apart (a tick whose runs mix
# them measures the range's).
# A tick that plans a range run but whose range estimate fits no tick's budget makes runs of one
# document and forgets the oldest range measure: without it no range run would be made, so none
# measured, and batching would stay off for as long as runs go on being made (a measure ages only
# when ESTIMATE_MAX_AGE_S pass without one); after at most ESTIMATE_MEASURES such ticks a range is
# tried, and measured, again.
# A measure is taken ESTIMATE_MARGIN times over: a run's creation moved by up to half from one tick
# to the next at load 2-4 (0.6-1.4 s on a Postgres-backed instance at 100,000 partitions, where ticks
# planned on the bare measure took up to 11 s).
# Dagster's queue holds at most MAX_WAITING_RUNS of the sensor's runs waiting for a run slot (queued,
# or created and not submitted yet): a tick makes no more runs than that leaves room for, so the rest
# of a backfill or of the version sensor's re-runs waits in the registry (requested, where `vision-rag
# status` counts it), not in Dagster's queue (92 runs were queued after 5 minutes with one run at a
# time). A tick's worth: a run slot that frees finds a run waiting whatever max_concurrent_runs is,
# unless more runs than that start between two ticks.
TICK_BUDGET_S = 8.0
RECONCILE_BUDGET_S = 3.0
RUN_KEYS_A_QUERY = 500  # the reconcile reads the runs of this many run keys in one query
MAX_RUNS_PER_TICK = 10
MAX_CLAIMED_PER_TICK = MAX_RUNS_PER_TICK * MAX_BATCH_DOCUMENTS
MAX_WAITING_RUNS = MAX_RUNS_PER_TICK
WAITING = [dg.DagsterRunStatus.QUEUED, dg.DagsterRunStatus.NOT_STARTED]
RUN_CREATION_S = 4.0
MIN_RUN_CREATION_S = 0.1
ESTIMATE_MAX_AGE_S = 600  # a measure older than this (a daemon stopped since) gives way to RUN_CREATION_S
ESTIMATE_MARGIN = 1.5
ESTIMATE_MEASURES = 5  # the estimate is the slowest of the last this many measures
PLANNED_OUTPUTS = 12
RUN_CREATION_BUDGET_S = 6.0
STALE_CLAIM_SECONDS = 300  # a claim whose run never appeared goes back to the requests
REQUEST_INTERVAL_SECONDS = sensor_interval_seconds(5)
DAEMON_HEARTBEAT_SECONDS = 60  # a daemon whose heartbeat is older serves nothing
RANGE_START_TAG = "dagster/asset_partition_range_start"
RANGE_END_TAG = "dagster/asset_partition_range_end"
RUN_KEY_TAG = "dagster/run_key"
SENSOR = "ingest_requests"
SENSOR_NAME_TAG = "dagster/sensor_name"  # Dagster's tag on each run a sensor requested: its name
LOCAL_CLAIM = "local"  # run key prefix of a batch claimed by a process to execute itself
JOBS = {job.name: job for job in (ingest_document_job, reenrich_job)}

Outcome = Literal["requested", "unchanged", "duplicate", "refused"]


class Arrival(BaseModel):
    """What a door made of one file."""

    path: str
    document_id: str
    outcome: Outcome
    reason: str | None = None  # refused: why, one line
    duplicate_of: str | None = None  # duplicate: the document holding the same bytes


class Batch(BaseModel):
    """Documents of one run: a single partition, or a range of consecutive partitions."""

    job: str
    documents: list[str]  # in partition order
    size: int = 0  # bytes of their files

    def tags(self) -> dict[str, str]:
        """Dagster's own partition tags: one partition, or the range of a batch."""
        if len(self.documents) == 1:
            return {"dagster/partition": self.documents[0]}
        return {RANGE_START_TAG: self.documents[0], RANGE_END_TAG: self.documents[-1]}


def unreadable_reason(path: str | bytes | Path) -> str | None:
    """Why no run could ingest the file (one line naming it), or None. Reads its first bytes only."""
    file = Path(os.fsdecode(path))
    if not file.exists():
        return f"{display_path(path)}: no such file"
    if not file.is_file():
        return f"{display_path(path)}: not a file"
    name = display_path(file.name)
    try:
        why = why_not_a_document(file)
    except OSError as exc:
        return f"{name}: cannot read ({exc.strerror or exc})"
    return f"{name}: {why}" if why else None


def request_files(
    instance: dg.DagsterInstance,
    paths: Sequence[str | bytes],
    door: str,
    asset_graph: Any,
    *,
    force: bool = False,
    versions: bool = True,
    inbox_states: Mapping[bytes, FileState] | None = None,
    resolve: bool = True,
) -> list[Arrival]:
    """Register each file and request a run of `ingest_document` for those that need one (every
    readable one with `force`); returns what became of each, in order. `asset_graph`: Dagster's
    (`defs.resolve_asset_graph()`, a sensor's `repository_def.asset_graph`), which says whether a
    file's partition is up to date; `versions=False`: the same bytes as stored are enough (the inbox:
    the version sensor answers setting changes). `inbox_states`: what the
    inbox sensor saw of its files (`resolve=False`: an inbox link is its own document); a file the
    CLI or an upload puts in the inbox is recorded as seen there too, so the sensor never takes it
    for a new file."""
    registry = DocumentRegistry()
    inbox = os.fsencode(inbox_dir()) + b"/"
    seen: dict[str | bytes, tuple[str, str, FileState | None]] = {}  # path -> (id, sha256, inbox state)
    arrivals: dict[str | bytes, Arrival] = {}
    for path in dict.fromkeys(paths):  # a path given twice is one file
        state = (inbox_states or {}).get(os.fsencode(path))
        document_id = document_id_for(path, resolve=resolve)
        reason = unreadable_reason(path)
        if reason is None:
            try:
                sha256 = state.sha256 if state else file_sha256(path)
            except OSError as exc:
                reason = f"{display_path(Path(os.fsdecode(path)).name)}: cannot read ({exc.strerror or exc})"
        if reason is not None:
            registry.refuse(path, door, reason, inbox_state=state, resolve=resolve)
            arrivals[path] = Arrival(
                path=display_path(path), document_id=document_id, outcome="refused", reason=reason
            )
            continue
        if state is None and _absolute(path, resolve).startswith(inbox):
            stat = os.stat(path)
            state = FileState(stat.st_size, stat.st_mtime_ns, sha256)
        seen[path] = (document_id, sha256, state)
    stored = registry.content_sha256(document_id for document_id, _, _ in seen.values())
    same = {document_id: sha for document_id, sha, _ in seen.values() if stored.get(document_id) == sha}
    # the same bytes as a run is already asked for or working on: that request stands, as it is
    under_way = {fate.document_id for fate in registry.fates(same) if fate.state in UNFINISHED}
    same = {document_id: sha for document_id, sha in same.items() if document_id not in under_way}
    if force or not same:
        unchanged: set[str] = set()
    else:
        unchanged = (
            up_to_date_partitions(instance, asset_graph, PER_DOCUMENT, same) if versions else set(same)
        )
    request = uuid.uuid4().hex[:12]
    requested: list[str] = []
    for path, (document_id, sha256, state) in seen.items():
        if document_id in under_way:
            if state:
                registry.seen_in_inbox(document_id, state)
            arrivals[path] = Arrival(path=display_path(path), document_id=document_id, outcome="requested")
            continue
        if document_id in unchanged:
            if state:
                registry.seen_in_inbox(document_id, state)
            arrivals[path] = Arrival(path=display_path(path), document_id=document_id, outcome="unchanged")
            continue
        owner = None if document_id in stored else registry.content_owner(sha256, other_than=document_id)
        if owner:
            registry.record_duplicate(path, door, owner, inbox_state=state, resolve=resolve)
            arrivals[path] = Arrival(
                path=display_path(path), document_id=document_id, outcome="duplicate", duplicate_of=owner
            )
            continue
        registry.register(path, door, request=request, inbox_state=state, resolve=resolve, held=True)
        requested.append(document_id)
        arrivals[path] = Arrival(path=display_path(path), document_id=document_id, outcome="requested")
    if requested:  # added together, in this order: a batch is a range of consecutive partitions
        instance.add_dynamic_partitions(documents_partitions.name, list(dict.fromkeys(requested)))
        registry.release_request(request)  # ... and claimable together, once all are registered
    return [arrivals[path] for path in paths]


def request_documents(
    instance: dg.DagsterInstance,
    document_ids: Sequence[str],
    door: str,
    job: str = reenrich_job.name,
    *,
    unless_under_way: bool = False,
) -> list[str]:
    """Request a run of `job` for documents already registered (a backfill), given in partition order
    so that they run as batches of consecutive partitions; returns those requested
    (`unless_under_way`: not those a run is already asked for or working on)."""
    return DocumentRegistry().request(
        document_ids, door, job, request=uuid.uuid4().hex[:12], unless_under_way=unless_under_way
    )


def _absolute(path: str | bytes, resolve: bool) -> bytes:
    given = Path(os.fsdecode(path)).expanduser()
    return os.fsencode(given.resolve() if resolve else given.absolute())


def plan_batches(
    instance: dg.DagsterInstance,
    claimed: Sequence[Claimed],
    *,
    max_documents: int = MAX_BATCH_DOCUMENTS,
    max_bytes: int = MAX_BATCH_BYTES,
    parts: int = 1,
) -> list[Batch]:
    """Cut claimed documents into batches: consecutive partitions of one job, at most `max_documents`
    and `max_bytes` each (a document asked to run alone gets a run of its own), at least `parts`
    batches when there are that many documents (each of `parts` workers then has one). Biggest first."""
    order = {key: i for i, key in enumerate(instance.get_dynamic_partitions(documents_partitions.name))}
    missing = [c.document_id for c in claimed if c.document_id not in order]
    if missing:  # registered, its partition deleted since (a re-registered file): add it back
        instance.add_dynamic_partitions(documents_partitions.name, missing)
        order |= {key: len(order) + i for i, key in enumerate(missing)}
    if parts > 1:
        max_documents = max(1, min(max_documents, math.ceil(len(claimed) / (2 * parts))))
    batches: list[Batch] = []
    for job in sorted({c.job for c in claimed}):
        current: Batch | None = None
        previous = -2
        for c in sorted((c for c in claimed if c.job == job), key=lambda c: order[c.document_id]):
            alone = (c.request or "").startswith("alone ")
            size = c.size or 0
            fits = (
                current is not None
                and order[c.document_id] == previous + 1
                and not alone
                and len(current.documents) < max_documents
                and current.size + size <= max_bytes
            )
            if fits and current is not None:
                current.documents.append(c.document_id)
                current.size += size
            else:
                current = Batch(job=job, documents=[c.document_id], size=size)
                batches.append(current)
            if alone:
                current = None
            previous = order[c.document_id]
    return sorted(batches, key=lambda batch: -batch.size)


def affordable(
    batches: Sequence[Batch],
    key_load_s: float,
    keys_kept: bool,
    run_creation_s: float = RUN_CREATION_S,
    budget_s: float = RUN_CREATION_BUDGET_S,
    range_run_s: float | None = None,
    max_runs: int | None = None,
) -> list[Batch]:
    """The first batches whose runs the daemon can create within `budget_s`, given a run's creation
    (`run_creation_s`; `range_run_s` for a run over a range, the same when None) and what one load
    of every partition key took here: a range run's creation
    makes Dagster load them PLANNED_OUTPUTS times, or, where the storage keeps the keys it loaded
    (`keys_kept`), once for the tick's runs. At most `max_runs` (MAX_RUNS_PER_TICK when None); where
    not even the first batch's run fits, runs of one document each (no key load), as many as fit;
    none where not one run fits."""
    max_runs = MAX_RUNS_PER_TICK if max_runs is None else max_runs
    kept: list[Batch] = []
    spent = 0.0
    for batch in batches:
        cost = run_creation_s
        if len(batch.documents) > 1:
            cost = run_creation_s if range_run_s is None else range_run_s
            loads = 0 if keys_kept and any(len(b.documents) > 1 for b in kept) else 1
            cost += (1 if keys_kept else PLANNED_OUTPUTS) * loads * key_load_s
        if len(kept) >= max_runs or spent + cost > budget_s:
            break
        kept.append(batch)
        spent += cost
    if kept or all(len(batch.documents) == 1 for batch in batches):
        return kept
    alone = [Batch(job=batch.job, documents=[document]) for batch in batches for document in batch.documents]
    return affordable(alone, key_load_s, keys_kept, run_creation_s, budget_s, range_run_s, max_runs)


class RequestsCursor(BaseModel):
    """What an `ingest_requests` tick leaves the next: the runs it requested and when it returned them
    to the daemon (a tick without runs passes on the last), the estimate of a run's creation, where
    its reconcile stopped, and whether its time ran out before a run fitted."""

    returned_at: float = 0.0  # epoch seconds
    run_keys: list[str] = []
    run_creation_s: float = RUN_CREATION_S  # estimated: a run of one document
    range_run_s: float = RUN_CREATION_S  # estimated: a run over a range of documents
    run_creation_measures: list[float] = []  # the last measures it was estimated from, the newest last
    range_run_measures: list[float] = []
    ranges: bool = False  # the runs it requested included one over a range
    reconcile_after: str | None = None  # the next reconcile starts after this run
    starved: bool = False  # the next tick gives the reconcile's time to runs

    @classmethod
    def parse(cls, cursor: str | None) -> RequestsCursor:
        try:
            return cls.model_validate_json(cursor) if cursor else cls()
        except ValueError:  # a cursor of another version: start from the default estimate
            return cls()


def run_creation_estimate(instance: dg.DagsterInstance, last: RequestsCursor) -> RequestsCursor:
    """What a tick carries on from the last: when that tick returned its runs, and the estimates of a
    run's creation, of one document and over a range, with how long the daemon took for that tick's
    runs among the measures: from that tick's return to the end of its newest run's creation, per
    run, for the kind of run it made (over a range where any was); the last estimates when that tick
    made no run or none was created. An estimate is ESTIMATE_MARGIN times the slowest of its last
    ESTIMATE_MEASURES measures. The daemon creates a tick's runs one after the other, each in turn:
    its run record, its planned events (most of the time), its submission to the queue
    (`RUN_ENQUEUED`, or the record's own time where runs are not queued). RUN_CREATION_S where the
    last runs are older than ESTIMATE_MAX_AGE_S: the load they were made under has passed."""
    if time.time() - last.returned_at > ESTIMATE_MAX_AGE_S:
        return RequestsCursor(returned_at=last.returned_at)
    carried = RequestsCursor(
        returned_at=last.returned_at,
        run_creation_s=last.run_creation_s,
        range_run_s=last.range_run_s,
        run_creation_measures=last.run_creation_measures,
        range_run_measures=last.range_run_measures,
    )
    records = (
        instance.get_run_records(dg.RunsFilter(tags={RUN_KEY_TAG: last.run_keys})) if last.run_keys else []
    )
    if not records:
        return carried
    newest = max(records, key=lambda record: record.create_timestamp)
    enqueued = instance.get_records_for_run(
        newest.dagster_run.run_id, of_type=dg.DagsterEventType.RUN_ENQUEUED, limit=1
    ).records
    created = enqueued[0].timestamp if enqueued else newest.create_timestamp.timestamp()
    measure = (created - last.returned_at) / len(records)
    if last.ranges:
        measures = [*last.range_run_measures, measure][-ESTIMATE_MEASURES:]
        return carried.model_copy(update={"range_run_measures": measures, "range_run_s": _estimate(measures)})
    measures = [*last.run_creation_measures, measure][-ESTIMATE_MEASURES:]
    return carried.model_copy(
        update={"run_creation_measures": measures, "run_creation_s": _estimate(measures)}
    )


def _estimate(measures: Sequence[float]) -> float:
    return max(MIN_RUN_CREATION_S, ESTIMATE_MARGIN * max(measures))


def claim_key(owner: str, run_id: str) -> str:
    """The run key of a batch a process claims to execute itself: it names the process."""
    return f"{LOCAL_CLAIM} {owner} {run_id}"


def record_outcome(
    instance: dg.DagsterInstance, registry: DocumentRegistry, run: dg.DagsterRun, claim: str | None = None
) -> None:
    """Record what a finished run made of the documents it answers for (see the module docstring);
    `claim`: the key its documents were claimed under by the process that executed it."""
    names = [
        run.run_id,
        *([run.tags[RUN_KEY_TAG]] if RUN_KEY_TAG in run.tags else []),
        *([claim] if claim else []),
    ]
    documents = registry.of_run(names)
    if not documents:
        return
    if run.status == dg.DagsterRunStatus.SUCCESS:
        registry.finish(names, documents, "ingested")
        return
    failure = run_failure(instance, run.run_id)
    if run.status == dg.DagsterRunStatus.CANCELED and failure.reason is None:
        registry.finish(names, documents, "failed", "canceled before it finished")
        return
    reason = failure.reason or "the run failed"
    named = {key: why for key, why in failure.documents.items() if key in documents}
    if named:  # the batch failed on these documents: the others run again, this attempt not counted
        for document_id, why in named.items():
            registry.finish(names, [document_id], "failed", _naming(registry, document_id, why))
        others = [key for key in documents if key not in named]
        registry.finish(
            names, others, "requested", f"its batch failed on {', '.join(named)}", 0, uncount=True
        )
        return
    if len(documents) > 1:  # which document failed the batch is not known: one run each
        registry.finish(names, documents, "requested", f"its batch failed: {reason}", retry_in=0, alone=True)
        return
    (document_id,) = documents
    attempts = documents[document_id]
    if failure.retryable and attempts < MAX_ATTEMPTS:
        pause = RETRY_PAUSE_SECONDS[min(attempts, len(RETRY_PAUSE_SECONDS)) - 1]
        registry.finish(names, documents, "requested", _naming(registry, document_id, reason), retry_in=pause)
    else:
        registry.finish(names, documents, "failed", _naming(registry, document_id, reason))


def _naming(registry: DocumentRegistry, document_id: str, reason: str) -> str:
    """The reason, starting with the file's name when it does not say which file."""
    try:
        name = Path(registry.get(document_id).source_path).name
    except KeyError:
        return reason
    return reason if name in reason else f"{name}: {reason}"


class RunFailure(BaseModel):
    reason: str | None = None  # one line: the first failed step's error, else the run's
    documents: dict[str, str] = {}  # the documents a step's `Failure` named, each with its reason
    retryable: bool = True  # False when a step said the document itself cannot be ingested


def run_failure(instance: dg.DagsterInstance, run_id: str) -> RunFailure:
    """Why a run failed, from its events: the first failed step's error on one line (and the document
    its `Failure` named), else the run's own failure (its process lost, Dagster's storage)."""
    for record in instance.all_logs(run_id, of_type=dg.DagsterEventType.STEP_FAILURE):
        data = record.dagster_event.step_failure_data if record.dagster_event else None
        if data is None or data.error is None:
            continue
        user = data.user_failure_data
        named = user.metadata.get(FAILED_DOCUMENTS) if user else None
        where = f" (in {record.step_key})"
        return RunFailure(
            reason=one_line(data.error) + where,
            documents={key: reason + where for key, reason in (getattr(named, "value", None) or {}).items()},
            retryable=user is None,
        )
    for record in instance.all_logs(run_id, of_type=dg.DagsterEventType.RUN_FAILURE):
        event = record.dagster_event
        error = event.job_failure_data.error if event and event.job_failure_data else None
        message = one_line(error) if error is not None else (event.message if event else None)
        if message:
            return RunFailure(reason=message.splitlines()[0])
    return RunFailure()


def one_line(error: object) -> str:
    """The innermost cause of a Dagster error record, first line, without its (module-qualified)
    class name; a full disk says so first. (A `Failure` says its description.)"""
    while getattr(error, "cause", None) is not None:
        error = error.cause  # type: ignore[attr-defined]
    message = (getattr(error, "message", "") or "").strip()
    cls_name = getattr(error, "cls_name", "") or "Error"
    first = message.splitlines()[0] if message else cls_name
    first = re.sub(rf"^(?:[\w.]+\.)?{re.escape(cls_name)}: ", "", first)
    if "No space left on device" in first and not first.startswith("disk full"):
        return f"disk full: {first}"
    return first


class Reconciled(NamedTuple):
    taken: int  # runs taken over (their process gone)
    resume_after: str | None  # the last run looked at when the deadline passed; None: all looked at


def reconcile(
    instance: dg.DagsterInstance,
    registry: DocumentRegistry | None = None,
    deadline: Deadline | None = None,
    after: str | None = None,
) -> Reconciled:
    """Bring every unfinished document's fate up to date with its run: record finished runs, take
    over runs whose process is gone (marked failed, slots freed, documents requested again) and
    give back claims whose run never came. One run (by id, or by run key while it is queued) at a
    time, in the order of their names starting after `after`, each begun only before `deadline`:
    the runs not looked at are the next call's, from where this one stopped, so each is looked at in
    turn however many wait and none twice before all were."""
    taken = 0
    registry = registry or DocumentRegistry()
    now = dt.datetime.now(dt.UTC)
    running: dict[str, list] = {}
    queued: dict[str, list] = {}
    for row in registry.unfinished():
        if row.state == "running" and row.run_id:
            running.setdefault(row.run_id, []).append(row)
        elif row.run_key:
            queued.setdefault(row.run_key, []).append(row)
    names = sorted({*running, *queued})
    order = [name for name in names if after is None or name > after]
    order += [name for name in names if after is not None and name <= after]
    sensor_keys = [key for key in order if key in queued and not key.startswith(f"{LOCAL_CLAIM} ")]
    sensor_runs: dict[str, dg.DagsterRun] = {}
    fetched = 0
    for position, name in enumerate(order):
        if deadline is not None and deadline.passed():
            return Reconciled(taken, order[position - 1] if position else after)
        if name in running:
            taken += _reconcile_run(instance, registry, name, running[name], now)
            continue
        rows = queued[name]
        age = max((now - r.updated_at).total_seconds() for r in rows)
        if name.startswith(f"{LOCAL_CLAIM} "):
            taken += _reconcile_claim(instance, registry, name, rows, age, now)
            continue
        if name not in sensor_runs and fetched < len(sensor_keys):  # the next keys' runs, in one query
            sensor_runs |= _runs_by_key(instance, sensor_keys[fetched : fetched + RUN_KEYS_A_QUERY])
            fetched += RUN_KEYS_A_QUERY
        run = sensor_runs.get(name)
        if run is not None and run.is_finished:
            record_outcome(instance, registry, run)
        elif run is None and age > STALE_CLAIM_SECONDS:
            registry.finish([name], [r.document_id for r in rows], "requested", None, retry_in=0)
    return Reconciled(taken, None)


def _reconcile_run(
    instance: dg.DagsterInstance, registry: DocumentRegistry, run_id: str, rows: list, now: dt.datetime
) -> int:
    """A run holding documents: recorded once finished, taken over when its process is gone."""
    run = instance.get_run_by_id(run_id)
    if run is None:
        registry.finish(
            [run_id], [r.document_id for r in rows], "requested", "its run was deleted", retry_in=0
        )
        return 0
    taken = 0
    if not run.is_finished and any(process_gone(r.owner, r.renewed_at, now) for r in rows):
        abandon_run(instance, run, f"the process executing it ({rows[0].owner}) is gone")
        run = instance.get_run_by_id(run_id) or run
        taken = 1
    if run.is_finished:
        record_outcome(instance, registry, run)
    return taken


def _reconcile_claim(
    instance: dg.DagsterInstance,
    registry: DocumentRegistry,
    key: str,
    rows: list,
    age: float,
    now: dt.datetime,
) -> int:
    """A batch a process claimed to execute itself: recorded once its run finished, given back (its
    run taken over) when the process is gone."""
    owner = " ".join(key.split(" ")[1:4])
    gone = process_gone(owner, None, now) if _on_this_host(owner) else age > STALE_CLAIM_SECONDS
    run = instance.get_run_by_id(key.rsplit(" ", 1)[-1])
    if run is not None and run.is_finished:
        record_outcome(instance, registry, run, claim=key)
    elif gone:
        if run is None:
            registry.finish([key], [r.document_id for r in rows], "requested", None, retry_in=0)
            return 0
        abandon_run(instance, run, f"the process that claimed it ({owner}) is gone")
        record_outcome(instance, registry, instance.get_run_by_id(run.run_id) or run, claim=key)
        return 1
    return 0


def _runs_by_key(instance: dg.DagsterInstance, keys: Sequence[str]) -> dict[str, dg.DagsterRun]:
    """The latest run of each of these run keys, in one query rather than one each."""
    latest: dict[str, dg.DagsterRun] = {}
    for run in instance.get_runs(dg.RunsFilter(tags={RUN_KEY_TAG: list(keys)})):
        latest.setdefault(run.tags[RUN_KEY_TAG], run)  # newest first
    return latest


def _on_this_host(owner: str) -> bool:
    return owner.split(" ", 1)[0] == socket.gethostname()


def daemon_serves(instance: dg.DagsterInstance) -> bool:
    """Whether a Dagster daemon runs this instance's sensors (and dequeues its runs) now: then its
    `ingest_requests` sensor takes requested documents, else whoever requested them runs them."""
    beats = instance.get_daemon_heartbeats()
    wanted = ["SENSOR"] + (
        ["QUEUED_RUN_COORDINATOR"] if isinstance(instance.run_coordinator, dg.QueuedRunCoordinator) else []
    )
    return all(
        (beat := beats.get(daemon)) is not None and time.time() - beat.timestamp < DAEMON_HEARTBEAT_SECONDS
        for daemon in wanted
    )


def wait_for_documents(
    instance: dg.DagsterInstance,
    document_ids: Iterable[str],
    on_change: object = None,
    poll_seconds: float = 1.0,
) -> None:
    """Block until none of the documents is requested, queued or running (reconciling meanwhile)."""
    registry = DocumentRegistry()
    wanted = list(document_ids)
    last = None
    while True:
        reconcile(instance, registry)
        fates = registry.fates(wanted)
        states = tuple(sorted(f.state or "" for f in fates))
        if states != last and callable(on_change):
            on_change(fates)
            last = states
        if not any(f.state in ("requested", "queued", "running") for f in fates):
            return
        time.sleep(poll_seconds)


@dg.sensor(
    name=SENSOR,
    jobs=[ingest_document_job, reenrich_job],
    minimum_interval_seconds=REQUEST_INTERVAL_SECONDS,
    default_status=dg.DefaultSensorStatus.RUNNING,
    description="Turns documents requested by any door (vision-rag ingest, uploads, the inbox, backfills) "
    "into runs: consecutive partitions requested together are one run over their range, at most "
    f"{MAX_WAITING_RUNS} of them waiting in the run queue. Records what finished runs made of their "
    "documents and requests again those whose run was lost.",
)
def ingest_requests(context: dg.SensorEvaluationContext, index_db: IndexDatabase) -> dg.SensorResult:
    deadline = Deadline(TICK_BUDGET_S)
    registry = index_db.registry()
    last = RequestsCursor.parse(context.cursor)
    # after a tick whose time ran out before any run, runs go first: this reconcile waits a tick
    reconciled = reconcile(
        context.instance,
        registry,
        deadline.within(0 if last.starved else RECONCILE_BUDGET_S),
        last.reconcile_after,
    )
    carried = run_creation_estimate(context.instance, last).model_copy(
        update={"reconcile_after": reconciled.resume_after}
    )
    run_creation_s, range_run_s = carried.run_creation_s, carried.range_run_s
    waiting = context.instance.get_runs_count(dg.RunsFilter(statuses=WAITING, tags={SENSOR_NAME_TAG: SENSOR}))
    if waiting >= MAX_WAITING_RUNS:
        return dg.SensorResult(
            skip_reason=dg.SkipReason(
                f"{waiting} of its runs wait in Dagster's queue (at most {MAX_WAITING_RUNS}): the requested"
                " documents wait in the registry until runs leave the queue"
            ),
            cursor=carried.model_dump_json(),
        )
    cheapest = min(run_creation_s, range_run_s)
    fits = min(
        MAX_RUNS_PER_TICK,
        MAX_WAITING_RUNS - waiting,
        int(min(RUN_CREATION_BUDGET_S, deadline.left()) // cheapest),
    )
    if fits < 1:
        return _out_of_time(deadline, cheapest, carried)
    claimer = f"sensor {uuid.uuid4().hex}"
    claimed = registry.claim(claimer, limit=min(MAX_CLAIMED_PER_TICK, fits * MAX_BATCH_DOCUMENTS))
    if not claimed:
        return dg.SensorResult(
            skip_reason=dg.SkipReason("no document is waiting for a run"), cursor=carried.model_dump_json()
        )
    started = time.monotonic()
    planned = plan_batches(context.instance, claimed)  # loads every partition key once
    key_load_s = time.monotonic() - started
    keys_kept = isinstance(context.instance.event_log_storage, LocalEventLogStorage)
    batches = affordable(
        planned,
        key_load_s,
        keys_kept,
        run_creation_s,
        min(RUN_CREATION_BUDGET_S, deadline.left()),
        range_run_s,
        max_runs=fits,
    )
    if _ranges(planned) and not _ranges(batches):
        whole_tick = affordable(
            planned, key_load_s, keys_kept, run_creation_s, RUN_CREATION_BUDGET_S, range_run_s
        )
        if not _ranges(whole_tick):  # no tick makes the range run at this estimate, which no run measures
            carried = _without_oldest_range_measure(carried)
        elif not last.starved:  # a tick of its own makes it: not runs of one document each
            registry.release(claimer, [c.document_id for c in claimed])
            return _out_of_time(deadline, range_run_s, carried)
    running = {document for batch in batches for document in batch.documents}
    rest = [c.document_id for c in claimed if c.document_id not in running]
    if rest:  # they wait, in their place, for the next tick
        registry.release(claimer, rest)
    if not batches:
        return _out_of_time(deadline, cheapest, carried)
    keys: dict[str, str] = {}
    requests = []
    for batch in batches:
        key = f"{batch.job}:{batch.documents[0]}..{batch.documents[-1]}:{uuid.uuid4().hex[:8]}"
        keys |= dict.fromkeys(batch.documents, key)
        if len(batch.documents) == 1:
            requests.append(dg.RunRequest(job_name=batch.job, run_key=key, partition_key=batch.documents[0]))
        else:
            requests.append(dg.RunRequest(job_name=batch.job, run_key=key, tags=batch.tags()))
    registry.name_run(keys, claimer)
    context.log.info(
        f"{len(running)} documents in {len(batches)} runs (a run's creation estimated at"
        f" {run_creation_s:.1f} s, over a range {range_run_s:.1f} s; {deadline.elapsed():.1f} s of the"
        f" tick's {TICK_BUDGET_S:.0f} spent before it)"
    )
    cursor = carried.model_copy(
        update={
            "returned_at": time.time(),
            "run_keys": [r.run_key for r in requests if r.run_key],
            "ranges": any(len(batch.documents) > 1 for batch in batches),
        }
    )
    return dg.SensorResult(run_requests=requests, cursor=cursor.model_dump_json())


def _without_oldest_range_measure(carried: RequestsCursor) -> RequestsCursor:
    """The range estimate of a tick that could not afford a range run: its oldest measure forgotten,
    RUN_CREATION_S once none is left, so a slow spell's measures age out and a range is tried again."""
    measures = carried.range_run_measures[1:]
    return carried.model_copy(
        update={
            "range_run_measures": measures,
            "range_run_s": _estimate(measures) if measures else RUN_CREATION_S,
        }
    )


def _ranges(batches: Sequence[Batch]) -> bool:
    return any(len(batch.documents) > 1 for batch in batches)


def _out_of_time(deadline: Deadline, run_creation_s: float, carried: RequestsCursor) -> dg.SensorResult:
    """A tick whose time left fits no run's creation: the requests wait, the next tick runs them first."""
    return dg.SensorResult(
        skip_reason=dg.SkipReason(
            f"no run fits the {deadline.left():.1f} s left of this tick's {TICK_BUDGET_S:.0f} s (a run's creation"
            f" estimated at {run_creation_s:.1f} s): the requested documents wait for the next tick"
        ),
        cursor=carried.model_copy(update={"starved": True}).model_dump_json(),
    )
