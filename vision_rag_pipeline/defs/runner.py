"""Execute requested documents' runs in this process (or a few spawned worker processes), as the
CLI and `vision-rag serve` do when no Dagster daemon serves the instance; and the local instance.

The runs are those the daemon would launch (defs/intake.py plans them: one run per batch of
documents requested together) and go to the Dagster instance in DAGSTER_HOME, so they show up in
the UI exactly like runs launched from it. Workers are spawned processes (two by default,
`VISION_RAG_INGEST_WORKERS`; with one, the runs stay in this process), each of which loads the models
once; their batches are cut so that each worker has work. What a run made of its documents is
recorded by the process that executed it (`record_outcome`), and the report is read back from the
registry and the runs' materializations, as for runs the daemon executed.
"""

from __future__ import annotations

import ctypes
import multiprocessing
import os
import signal
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from contextlib import contextmanager, suppress
from functools import cache
from pathlib import Path

import dagster as dg
import fasteners
import yaml
from pydantic import BaseModel, Field

from vision_rag_pipeline.core.config import config_in_effect, dagster_home, ingest_workers
from vision_rag_pipeline.core.terminal import quiet_library_noise
from vision_rag_pipeline.defs.enrichment import VISION_POOL
from vision_rag_pipeline.defs.intake import (
    Arrival,
    Batch,
    claim_key,
    daemon_serves,
    plan_batches,
    reconcile,
    record_outcome,
    request_files,
    wait_for_documents,
)
from vision_rag_pipeline.defs.local_storage import HOME_SUBDIRS
from vision_rag_pipeline.defs.resources import load_embedding_model
from vision_rag_pipeline.documents.registry import DocumentRegistry, Fate, this_process

_LOCAL_INSTANCE_HEADER = "# Written by vision-rag for the embedded default"
# The local instance; the repo root's dagster.yaml holds the same settings, for `dagster dev` run
# there with DAGSTER_HOME unset, where each storage's base_dir defaults to its folder of the
# vision-rag Dagster home (HOME_SUBDIRS); the file vision-rag writes names the folders.
LOCAL_INSTANCE_BODY = """\
telemetry:
  enabled: false
nux:
  enabled: false
# The daemon launches queued runs (requested documents, the version sensor, the UI) every second,
# from threads: a run launched through the code server waits for its process to start, and one at a
# time left the queue draining slower than the runs finished.
run_coordinator:
  module: dagster.core.run_coordinator
  class: QueuedRunCoordinator
  config:
    dequeue_interval_seconds: 1
    dequeue_use_threads: true
    dequeue_num_workers: 4
# Sensors tick in threads of their own: a long inbox tick (a drop of thousands of files) delays
# neither the version sensor nor the audit sensor.
sensors:
  use_threads: true
  num_workers: 4
concurrency:
  runs:
    # Each run is a process of its own (Dagster's default launcher, ~0.7 GB) working a batch of the
    # documents requested together: one per core.
    max_concurrent_runs: 2
  pools:
    default_limit: 2  # bounds the `vision_model` pool: simultaneous vision-model enrichment steps
# Dagster's SQLite layout, with engines kept between calls
run_storage:
  module: vision_rag_pipeline.defs.local_storage
  class: LocalRunStorage
event_log_storage:
  module: vision_rag_pipeline.defs.local_storage
  class: LocalEventLogStorage
schedule_storage:
  module: vision_rag_pipeline.defs.local_storage
  class: LocalScheduleStorage
compute_logs:  # captured for the UI, not echoed to the terminal (no tail processes per run)
  module: vision_rag_pipeline.defs.local_storage
  class: CapturedComputeLogManager
"""
_LOCAL_INSTANCE_PREAMBLE = """\
{header}: SQLite run history in this directory (rewritten
# by vision-rag while this header is here; delete the header to keep your own edits).
"""


def local_instance_yaml(home: Path) -> str:
    """LOCAL_INSTANCE_BODY with each storage's folder under `home` spelled out: the file stays
    right when opened with DAGSTER_HOME pointing elsewhere."""
    config = yaml.safe_load(LOCAL_INSTANCE_BODY)
    for storage, subdir in HOME_SUBDIRS.items():
        config[storage]["config"] = {"base_dir": str(home.resolve() / subdir)}
    return _LOCAL_INSTANCE_PREAMBLE.format(header=_LOCAL_INSTANCE_HEADER) + yaml.safe_dump(
        config, sort_keys=False
    )


# Run events (failures with their stack traces included) still go to the instance and the UI; the
# terminal shows our one-line errors, and Dagster's own lines only with --verbose.
QUIET_CONSOLE = {"loggers": {"console": {"config": {"log_level": "CRITICAL"}}}}
VERBOSE_CONSOLE = {"loggers": {"console": {"config": {"log_level": "WARNING"}}}}
INSTANCE_LOCK = ".vision-rag.lock"
PR_SET_PDEATHSIG = 1  # linux/prctl.h
INTERRUPTED = (KeyboardInterrupt, dg.DagsterExecutionInterruptedError)  # an interrupted run's errors
STOP_POLL_SECONDS = 0.5


def console_config(verbose: bool) -> dict:
    return VERBOSE_CONSOLE if verbose else QUIET_CONSOLE


class FailedFile(BaseModel):
    path: str
    error: str


class IngestReport(BaseModel):
    documents: int = 0  # files now indexed: ingested, unchanged or duplicates of an indexed document
    unchanged: int = 0  # of `documents`: bytes and settings as at their last successful run, so not run
    duplicates: int = 0  # of `documents`: the same bytes as another document, indexed once under it
    images: int = 0
    images_ignored: int = 0
    images_enriched: int = 0
    enrichment_calls: int = 0
    cache_hits: int = 0
    chunks: int = 0
    languages: dict[str, int] = Field(default_factory=dict)  # chunks per language their text is in
    ocr_languages: dict[str, int] = Field(default_factory=dict)  # images read with each Tesseract language
    # images whose provider call fell back to the offline path, by reason ("vision: timeout": 3)
    fallbacks: dict[str, int] = Field(default_factory=dict)
    failed: list[FailedFile] = Field(default_factory=list)
    interrupted: bool = False  # Ctrl-C or SIGTERM: the documents not in `documents` are in `failed`
    seconds: float = 0.0
    warnings: list[str] = Field(default_factory=list)  # settings that do not fit the documents seen


def language_warnings(languages: Iterable[str]) -> list[str]:
    """An English-only embedding model meeting other languages: said once per ingest, not once per
    chunk. (Imported here: the encoder is slow to import, and the CLI imports this module to start.)
    A configured OCR language this host lacks is no warning: it fails each document's enrichment."""
    from vision_rag_pipeline.embeddings.encoder import english_only_warning

    model = english_only_warning(config_in_effect().config.embedding.model, languages)
    return [model] if model else []


_instance_made = threading.Lock()  # the file lock below is per process: threads take this one first


@cache
def dagster_instance() -> dg.DagsterInstance:
    """The instance in DAGSTER_HOME (default `$VISION_RAG_HOME/dagster`), created on first use."""
    with _instance_made:
        return _make_instance()


def _make_instance() -> dg.DagsterInstance:
    home = dagster_home()
    os.environ["DAGSTER_HOME"] = str(home)
    with instance_lock(home):
        write_local_instance_config(home)
        instance = _shared_instance()
        _ensure_vision_pool(instance)
    return instance


def _shared_instance(attempts: int = 4) -> dg.DagsterInstance:
    """`DagsterInstance.get()`, tried again when another host created the same storages at that moment.

    The file lock above serializes the processes of one home; hosts sharing one Postgres instance
    (docker/dagster.yaml) can still create its fresh schema at once, and the loser's CREATE fails
    ("type run_tags already exists") in a transaction that is rolled back. The winner's schema is
    complete by the next try, which finds it and creates nothing.
    """
    for attempt in range(attempts - 1):
        try:
            return dg.DagsterInstance.get()
        except Exception as error:  # psycopg2's DuplicateObject/DuplicateTable through SQLAlchemy
            if "already exists" not in str(error):
                raise
            time.sleep(0.5 * (attempt + 1))
    return dg.DagsterInstance.get()


def _ensure_vision_pool(instance: dg.DagsterInstance, attempts: int = 5) -> None:
    """Create the `vision_model` pool's row before any run claims a slot.

    Dagster creates it on a step's first claim; on a Postgres instance two processes doing that at once
    fail one of them (its insert's unique violation aborts the transaction the rest of the claim runs
    in). Made up front, a lost race is simply retried and then finds the row.
    """
    storage = instance.event_log_storage
    if not storage.supports_global_concurrency_limits or instance.global_op_concurrency_default_limit is None:
        return
    for attempt in range(attempts):
        if VISION_POOL in storage.get_concurrency_keys():
            return
        try:
            storage.initialize_concurrency_limit_to_default(VISION_POOL)
        except Exception:  # the other process won the race: its row is found on the next pass
            if attempt == attempts - 1:
                raise
            time.sleep(0.1 * (attempt + 1))


@contextmanager
def instance_lock(home: Path) -> Iterator[None]:
    """Held while a process creates or migrates the instance's storages or tidies its runs.

    Two processes creating a fresh home's SQLite storages at once both run Dagster's alembic
    migrations and leave it broken for good ("more than one head", "table runs already exists").
    """
    home.mkdir(parents=True, exist_ok=True)
    with fasteners.InterProcessLock(str(home / INSTANCE_LOCK)):
        yield


def write_local_instance_config(home: Path) -> None:
    """Write our dagster.yaml into `home` unless the user has one of their own there.

    Every ingest process calls this while others may be reading the file: it is left alone when
    already right and otherwise replaced whole. A rewrite in place let a worker starting at the
    same moment read a half-written file, get Dagster's defaults (no pool limit), reset the
    `vision_model` pool and fail the other worker's runs.
    """
    home.mkdir(parents=True, exist_ok=True)
    config = home / "dagster.yaml"
    wanted = local_instance_yaml(home)
    if config.exists():
        current = config.read_text()
        if current == wanted or not current.startswith(_LOCAL_INSTANCE_HEADER):
            return
    partial = home / f".dagster.yaml.{os.getpid()}.{threading.get_ident()}"
    partial.write_text(wanted)
    os.replace(partial, config)


def default_workers() -> int:
    """Two runs at once keep both cores busy: one batch's OCR overlaps another's bookkeeping."""
    return ingest_workers() or min(2, os.cpu_count() or 1)


def ingest_paths(
    paths: Sequence[str],
    progress: Callable[[str], None] = lambda _: None,
    workers: int | None = None,
    verbose: bool = False,
    force: bool = False,
    door: str = "cli",
) -> IngestReport:
    """Request the files through the one way in (defs/intake.py), then see their runs through: a
    daemon serving the instance runs them and this waits; otherwise they run here.

    A file whose bytes and settings are those of its partition's last complete run is counted as
    unchanged and launches no run (unless `force`). On Ctrl-C no further batch starts, the running
    ones are interrupted (Dagster fails their runs) and the report says which finished.
    """
    from vision_rag_pipeline.defs.definitions import defs

    started = time.perf_counter()
    instance = dagster_instance()
    # before its files are requested again: a killed ingest's runs end first
    taken = reconcile(instance).taken
    if taken:
        progress(f"marked {taken} run(s) of killed vision-rag processes failed and freed their slots")
    arrivals = request_files(instance, paths, door, defs.resolve_asset_graph(), force=force)
    for arrival in arrivals:
        if arrival.outcome == "unchanged":
            progress(f"unchanged {arrival.path} ({arrival.document_id})")
        elif arrival.outcome == "duplicate":
            progress(f"duplicate {arrival.path}: the same bytes as {arrival.duplicate_of}, indexed once")
        elif arrival.outcome == "refused":
            progress(f"FAILED {arrival.reason}")
    requested = list(dict.fromkeys(a.document_id for a in arrivals if a.outcome == "requested"))
    show = _progress_lines(progress)
    ran: dict[str, str] = {}
    interrupted = False
    if requested and daemon_serves(instance):
        progress(
            f"the Dagster daemon runs {len(requested)} document(s); waiting (Ctrl-C stops waiting, not them)"
        )
        try:
            wait_for_documents(instance, requested, lambda fates: show(fates, None))
        except KeyboardInterrupt:
            interrupted = True
    elif requested:
        interrupted, ran = run_requested(instance, requested, workers, verbose, show)
    report = ingest_report(instance, arrivals, ran)
    report.interrupted = report.interrupted or interrupted
    report.seconds = round(time.perf_counter() - started, 3)
    return report


def _progress_lines(progress: Callable[[str], None]) -> Callable[[list[Fate], bool | None], None]:
    """A progress callback printing each document once, as it ends: ok (its fate says ingested, or
    the run executed here for it succeeded), or FAILED with its reason."""
    said: set[str] = set()

    def show(fates: list[Fate], run_succeeded: bool | None) -> None:
        for fate in fates:
            ok = fate.state == "ingested" or run_succeeded is True
            if fate.document_id in said or not (ok or fate.state == "failed"):
                continue
            said.add(fate.document_id)
            progress(f"ok {fate.path} ({fate.document_id})" if ok else f"FAILED {fate.reason}")

    return show


def run_requested(
    instance: dg.DagsterInstance,
    document_ids: Sequence[str] | None,
    workers: int | None = None,
    verbose: bool = False,
    on_change: Callable[[list[Fate], bool | None], None] = lambda *_: None,
) -> tuple[bool, dict[str, str]]:
    """Claim the requested documents among `document_ids` (None: every requested one) and execute
    their batches here, at most `workers` at a time, until none of them is requested any more (a
    run lost or failed for a reason not the document's own is requested again, after a pause).
    Returns whether an interrupt stopped it (batches not started because of one are recorded failed,
    "not started"), and {document: the run executed here that ingested it}."""
    registry = DocumentRegistry()
    owner = this_process()
    pending_key = claim_key(owner, "pending")
    ingested: dict[str, str] = {}

    def done(batch: Batch, run_id: str) -> None:
        run = instance.get_run_by_id(run_id)
        succeeded = run is not None and run.status == dg.DagsterRunStatus.SUCCESS
        if succeeded:
            ingested.update(dict.fromkeys(batch.documents, run_id))
        on_change(registry.fates(batch.documents), succeeded)

    while True:
        reconcile(instance, registry)
        claimed = registry.claim(pending_key, document_ids)
        if not claimed:
            due = registry.next_due(document_ids)
            if due is None and document_ids is not None:  # runs of others (queued, running): wait for them
                due = (
                    1.0
                    if any(f.state in ("queued", "running") for f in registry.fates(document_ids))
                    else None
                )
            if due is None:
                return False, ingested
            time.sleep(min(max(due, 0.1), 30.0))
            continue
        count = max(1, min(workers or default_workers(), len(claimed)))
        runs: list[tuple[Batch, str]] = []
        for batch in plan_batches(instance, claimed, parts=count):
            run_id = str(uuid.uuid4())
            registry.name_run(dict.fromkeys(batch.documents, claim_key(owner, run_id)), pending_key)
            runs.append((batch, run_id))
        with _started_pool(min(count, len(runs))) as pool:
            remaining, stopped = _run_batches(runs, pool, count, verbose, done)
        for batch, run_id in remaining:
            for fate in registry.fates(batch.documents):
                why = f"{Path(fate.path).name}: not started (interrupted)"
                registry.finish([claim_key(owner, run_id)], [fate.document_id], "failed", why)
            on_change(registry.fates(batch.documents), None)
        if stopped:
            return True, ingested


def _run_batches(
    runs: list[tuple[Batch, str]],
    pool: ProcessPoolExecutor | None,
    workers: int,
    verbose: bool,
    done: Callable[[Batch, str], None],
) -> tuple[list[tuple[Batch, str]], bool]:
    """Run each batch, at most `workers` at a time (none waits in a queue, so none starts after an
    interrupt); returns the batches not started because of one, and whether one came."""
    pending = list(reversed(runs))
    with _stop_requests() as stop:
        if pool is None:
            while pending and not stop.is_set():
                batch, run_id = pending.pop()
                if run_batch(batch, run_id, verbose):  # Dagster interrupts a running one
                    stop.set()
                done(batch, run_id)
            return pending[::-1], stop.is_set()
        running: dict[Future[bool], tuple[Batch, str]] = {}
        forwarded = False
        while running or (pending and not stop.is_set()):
            while pending and not stop.is_set() and len(running) < workers:
                batch, run_id = pending.pop()
                running[pool.submit(run_batch, batch, run_id, verbose)] = (batch, run_id)
            finished, _ = wait(running, timeout=STOP_POLL_SECONDS, return_when=FIRST_COMPLETED)
            if stop.is_set() and not forwarded:  # Ctrl-C reached the workers too; a signal sent here did not
                for child in multiprocessing.active_children():
                    with suppress(ProcessLookupError):
                        os.kill(child.pid, signal.SIGINT)  # type: ignore[arg-type]
                forwarded = True
            for future in finished:
                batch, run_id = running.pop(future)
                with suppress(Exception):  # a dead worker's run is taken over by reconcile, as any lost run
                    if future.result():
                        stop.set()
                done(batch, run_id)
        return pending[::-1], stop.is_set()


def run_batch(batch: Batch, run_id: str, verbose: bool = False) -> bool:
    """Execute one batch's run in this process and record what it made of its documents; returns
    whether it was interrupted."""
    from vision_rag_pipeline.defs.definitions import defs

    instance = dagster_instance()
    registry = DocumentRegistry()
    claim = claim_key(this_process(), run_id)
    single = batch.documents[0] if len(batch.documents) == 1 else None
    result = defs.resolve_job_def(batch.job).execute_in_process(
        instance=instance,
        run_id=run_id,
        partition_key=single,
        tags=None if single else batch.tags(),
        raise_on_error=False,
        run_config=console_config(verbose),
    )
    if not result.success and _was_interrupted(result):
        for fate in registry.fates(batch.documents):
            why = f"{Path(fate.path).name}: interrupted before it finished"
            registry.finish([run_id, claim], [fate.document_id], "failed", why)
        return True
    run = instance.get_run_by_id(run_id)
    if run is not None:
        record_outcome(instance, registry, run, claim=claim)
    return False


@contextmanager
def _stop_requests() -> Iterator[threading.Event]:
    """An event Ctrl-C and SIGTERM set, rather than raising KeyboardInterrupt in the middle of the
    bookkeeping between runs. Off the main thread (`serve`'s runner) signals are not ours."""
    stop = threading.Event()
    if threading.current_thread() is not threading.main_thread():
        yield stop
        return
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield stop
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _was_interrupted(result: dg.ExecuteInProcessResult) -> bool:
    names = {cls.__name__ for cls in INTERRUPTED}
    for event in result.all_events:
        error = None
        if event.is_step_failure and event.step_failure_data:
            error = event.step_failure_data.error
        elif event.event_type == dg.DagsterEventType.RUN_FAILURE and event.job_failure_data:
            error = event.job_failure_data.error
        while error is not None:
            if error.cls_name in names:
                return True
            error = error.cause
    return False


def ingest_report(
    instance: dg.DagsterInstance, arrivals: list[Arrival], ran: dict[str, str] | None = None
) -> IngestReport:
    """What became of each file, from the registry, with the counts each run's materializations
    recorded: the same for runs executed here and by the daemon. `ran`: {document: the run executed
    here that ingested it} (its fate may have moved on since: the file was requested again)."""
    report = IngestReport()
    fates = {fate.document_id: fate for fate in DocumentRegistry().fates([a.document_id for a in arrivals])}
    ingested: dict[str, str] = {}
    for arrival in {a.path: a for a in arrivals}.values():  # a path given twice is one file
        fate = fates.get(arrival.document_id)
        if arrival.document_id in (ran or {}):
            report.documents += 1
            ingested[arrival.document_id] = (ran or {})[arrival.document_id]
            continue
        if arrival.outcome == "refused":
            report.failed.append(FailedFile(path=arrival.path, error=arrival.reason or "refused"))
        elif arrival.outcome in ("unchanged", "duplicate"):
            report.documents += 1
            report.unchanged += arrival.outcome == "unchanged"
            report.duplicates += arrival.outcome == "duplicate"
        elif fate is not None and fate.state == "ingested":
            report.documents += 1
            if fate.run_id:
                ingested[arrival.document_id] = fate.run_id
        else:
            why = (
                fate.reason if fate else None
            ) or f"{Path(arrival.path).name}: {fate.state if fate else 'lost'}"
            report.failed.append(FailedFile(path=arrival.path, error=why))
            report.interrupted = report.interrupted or "interrupted" in why
    for counts in document_counts(instance, ingested).values():
        for key, value in counts.items():
            if isinstance(value, dict):
                _merge(getattr(report, key), value)
            else:
                setattr(report, key, getattr(report, key) + value)
    report.warnings = language_warnings(report.languages)
    return report


# what each asset's materialization metadata says, as the report's counts: {asset: {count: metadata key}}
_COUNTED = {
    "extracted_images": {"images": "images"},
    "image_verdicts": {"images_ignored": "ignore"},
    "image_enrichments": {
        "images_enriched": "enriched",
        "enrichment_calls": "enrichment_calls",
        "cache_hits": "cache_hits",
        "fallbacks": "fallback_reasons",
    },
    "document_chunks": {"chunks": "chunks", "languages": "languages"},
}


def document_counts(instance: dg.DagsterInstance, runs: dict[str, str]) -> dict[str, dict]:
    """{document: its counts} from what its run ({document: run id}) recorded on each materialization
    of it; `ocr_languages` counts images per language (a set read with eng+rus counts for both)."""
    counts: dict[str, dict] = {}
    for run_id in set(runs.values()):
        records = instance.get_records_for_run(
            run_id, of_type=dg.DagsterEventType.ASSET_MATERIALIZATION
        ).records
        for record in records:
            event = record.asset_materialization
            if event is None or runs.get(event.partition or "") != run_id:
                continue
            asset = event.asset_key.to_user_string()
            meta = {key: getattr(value, "value", value) for key, value in event.metadata.items()}
            mine = counts.setdefault(event.partition or "", {})
            for count, key in _COUNTED.get(asset, {}).items():
                value = meta.get(key) or ({} if key in ("fallback_reasons", "languages") else 0)
                if isinstance(value, dict):
                    _merge(mine.setdefault(count, {}), value)
                else:
                    mine[count] = mine.get(count, 0) + value
            for languages, images in (meta.get("ocr_languages") or {}).items():
                _merge(mine.setdefault("ocr_languages", {}), dict.fromkeys(languages.split("+"), images))
    return counts


def _merge(total: dict[str, int], more: dict[str, int]) -> None:
    for key, count in more.items():
        total[key] = total.get(key, 0) + count


@contextmanager
def _started_pool(workers: int) -> Iterator[ProcessPoolExecutor | None]:
    """`workers` spawned processes, already starting (None for one worker: runs stay in this process)."""
    if workers <= 1:
        threading.Thread(target=load_embedding_model, name="load-embedding-model", daemon=True).start()
        yield None
        return
    share = max(1, (os.cpu_count() or 1) // workers)
    with ProcessPoolExecutor(
        workers,
        mp_context=multiprocessing.get_context("spawn"),
        initializer=_init_worker,
        initargs=(share, os.getpid()),
    ) as pool:
        for _ in range(workers):  # a process is spawned per pending task: start them all now
            pool.submit(os.getpid)
        yield pool


def _init_worker(threads: int, parent: int) -> None:
    """Tie the worker to its parent, give it its share of the cores (so OCR and torch threads do not
    oversubscribe) and load what every run needs (Dagster definitions, the embedding model: ~9 s)
    before the first one."""
    die_with_parent(parent)
    # Ctrl-C reaches the whole process group: a worker between runs ignores it, and during one
    # Dagster's own handler interrupts the run (so it fails cleanly, freeing its pool slots).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    os.environ["VISION_RAG_THREADS"] = str(threads)
    quiet_library_noise()
    with suppress(Exception):  # reported by each run, as below
        from vision_rag_pipeline.defs.definitions import defs  # noqa: F401  (imported for its load time)
    load_embedding_model()


def die_with_parent(parent: int) -> None:
    """A worker must not outlive the CLI: killed with it (kill -9 included), it would keep running
    documents nobody waits for, ~700 MB each. Linux sends the signal when the parent exits; a parent
    gone already (before the call) is checked after it."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:
        os._exit(1)
