"""Ingest files through the Dagster asset graph: one dynamic partition and one run per document.

Each run executes in-process (`execute_in_process`) inside one of a few spawned worker processes
(two by default, `VISION_RAG_INGEST_WORKERS`; with one, in this process), each of which loads the
models once. The runs go to the Dagster instance in DAGSTER_HOME, so they show up in the UI exactly
like runs launched from it.
"""

from __future__ import annotations

import ctypes
import errno
import hashlib
import multiprocessing
import os
import re
import signal
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from contextlib import ExitStack, contextmanager, suppress
from functools import cache
from pathlib import Path

import dagster as dg
import fasteners
import yaml
from dagster._utils.error import SerializableErrorInfo  # the type of a step failure's error: no public name
from pydantic import BaseModel, Field

from vision_rag_pipeline.core.config import config_in_effect, dagster_home, ingest_workers
from vision_rag_pipeline.core.postgres import quiet_embedded_server_notice
from vision_rag_pipeline.core.sniff import sniff_document_kind
from vision_rag_pipeline.defs.enrichment import VISION_POOL
from vision_rag_pipeline.defs.local_storage import HOME_SUBDIRS
from vision_rag_pipeline.defs.partitions import documents_partitions
from vision_rag_pipeline.defs.resources import load_embedding_model
from vision_rag_pipeline.defs.run_owner import owner_tags, reclaim_orphaned_runs
from vision_rag_pipeline.documents.registry import DocumentRegistry, document_id_for

_LOCAL_INSTANCE_HEADER = "# Written by vision-rag for the embedded default"
# The local instance; the repo root's dagster.yaml holds the same settings, for `dagster dev` run
# there with DAGSTER_HOME unset, where each storage's base_dir defaults to its folder of the
# vision-rag Dagster home (HOME_SUBDIRS); the file vision-rag writes names the folders.
LOCAL_INSTANCE_BODY = """\
telemetry:
  enabled: false
nux:
  enabled: false
# The daemon launches queued runs (inbox, version sensor, backfills, UI) every second, from threads:
# a run launched through a code server (not to the warm workers below) waits for its process to
# start, and one at a time left the queue draining slower than the runs finished.
run_coordinator:
  module: dagster.core.run_coordinator
  class: QueuedRunCoordinator
  config:
    dequeue_interval_seconds: 1
    dequeue_use_threads: true
    dequeue_num_workers: 4
# Runs of this project execute in a pool of warm worker processes of the daemon (one per core, each
# ~0.7 GB, kept until 10 minutes idle) rather than a new process per run (defs/warm_launcher.py).
run_launcher:
  module: vision_rag_pipeline.defs.warm_launcher
  class: WarmRunLauncher
# Sensors tick in threads of their own: a long inbox tick (a drop of thousands of files) delays
# neither the version sensor nor the audit sensor.
sensors:
  use_threads: true
  num_workers: 4
concurrency:
  runs:
    max_concurrent_runs: 4  # beyond the workers, launched runs wait in the launcher (STARTING)
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


class _Counts(BaseModel):
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


class IngestReport(_Counts):
    documents: int = 0
    unchanged: int = 0  # of `documents`: bytes and settings as at their last successful run, so not run
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


@cache
def dagster_instance() -> dg.DagsterInstance:
    """The instance in DAGSTER_HOME (default `$VISION_RAG_HOME/dagster`), created on first use."""
    home = dagster_home()
    os.environ["DAGSTER_HOME"] = str(home)
    with instance_lock(home):
        write_local_instance_config(home)
        instance = dg.DagsterInstance.get()
        _ensure_vision_pool(instance)
    return instance


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


class DocumentOutcome(_Counts):
    """What one document's run produced (picklable: it crosses from a worker process)."""

    path: str
    document_id: str
    error: str | None = None
    interrupted: bool = False


def default_workers() -> int:
    """Two runs at once keep both cores busy: one document's OCR overlaps another's bookkeeping."""
    return ingest_workers() or min(2, os.cpu_count() or 1)


def ingest_paths(
    paths: Sequence[str],
    progress: Callable[[str], None] = lambda _: None,
    workers: int | None = None,
    verbose: bool = False,
    force: bool = False,
) -> IngestReport:
    """Register each file as a partition and materialize the asset graph for it, one run each.

    A file whose bytes and settings are those of its partition's last complete run is counted as
    unchanged and launches no run (unless `force`). The others run biggest first: with several
    workers in that many spawned processes (each loads the models once), with one in this process.
    Runs left behind by killed processes are failed first, so their pool slots cannot block these.
    On Ctrl-C no further document starts, the running ones are interrupted (Dagster fails their
    runs) and the report says which finished.
    """
    started = time.perf_counter()
    report = IngestReport()
    instance = dagster_instance()
    with instance_lock(dagster_home()):
        orphans = reclaim_orphaned_runs(instance)
    if orphans:
        progress(f"marked {len(orphans)} run(s) of killed vision-rag processes failed and freed their slots")
    readable: dict[str, str] = {}
    for path in paths:
        reason = _unreadable_reason(Path(path))
        if reason:
            report.failed.append(FailedFile(path=path, error=reason))
            progress(f"FAILED {reason}")
        else:
            readable[path] = document_id_for(path)
    known = set(instance.get_dynamic_partitions(documents_partitions.name))
    workers = max(1, min(workers or default_workers(), len(readable)))
    with ExitStack() as stack:
        # a new file runs for sure: its workers load their models while the others are checked
        early = force or any(doc_id not in known for doc_id in readable.values())
        pool = stack.enter_context(_started_pool(workers)) if early else None
        if early and pool is None:  # the runs are in this process: the model loads beside the first one
            threading.Thread(target=load_embedding_model, name="load-embedding-model", daemon=True).start()
        unchanged = set() if force else _unchanged(instance, readable, known)
        for path in (p for p in readable if p in unchanged):  # in the order given
            report.documents += 1
            report.unchanged += 1
            progress(f"unchanged {path} ({readable[path]})")
        # biggest first: a large document started last would leave the other workers idle at the end
        todo = sorted((p for p in readable if p not in unchanged), key=lambda p: -Path(p).stat().st_size)
        if not early and todo:
            workers = max(1, min(workers, len(todo)))
            pool = stack.enter_context(_started_pool(workers))
        registry = DocumentRegistry()
        accepted = [(path, registry.register(path).document_id) for path in todo]
        instance.add_dynamic_partitions(documents_partitions.name, sorted({doc_id for _, doc_id in accepted}))
        remaining = _run_documents(accepted, pool, workers, verbose, lambda o: _merge(report, o, progress))
    for path, _ in remaining:
        report.failed.append(FailedFile(path=path, error=f"{Path(path).name}: not started (interrupted)"))
    if remaining:
        progress(f"not started (interrupted): {len(remaining)} document(s)")
    report.interrupted = report.interrupted or bool(remaining)
    report.warnings = language_warnings(report.languages)
    report.seconds = round(time.perf_counter() - started, 3)
    return report


def _unchanged(instance: dg.DagsterInstance, documents: dict[str, str], known: set[str]) -> set[str]:
    """The paths (of {path: document id}; `known`: the partitions that exist) whose partition's last
    complete run read these bytes with the settings in effect now, into the index database in use
    now (it holds the same bytes)."""
    from vision_rag_pipeline.defs.definitions import defs
    from vision_rag_pipeline.defs.jobs import PER_DOCUMENT
    from vision_rag_pipeline.defs.versions import up_to_date_partitions

    candidates = {path: doc_id for path, doc_id in documents.items() if doc_id in known}
    if not candidates:
        return set()
    stored = DocumentRegistry().content_sha256(candidates.values())
    shas = {
        doc_id: sha
        for path, doc_id in candidates.items()
        if (sha := hashlib.sha256(Path(path).read_bytes()).hexdigest()) == stored.get(doc_id)
    }
    fresh = up_to_date_partitions(instance, defs, PER_DOCUMENT, shas) if shas else set()
    return {path for path, doc_id in candidates.items() if doc_id in fresh}


def _run_documents(
    items: list[tuple[str, str]],
    pool: ProcessPoolExecutor | None,
    workers: int,
    verbose: bool,
    record: Callable[[DocumentOutcome], None],
) -> list[tuple[str, str]]:
    """Run each document, at most `workers` at a time (none waits in a queue, so none starts after an
    interrupt); returns the documents not started because of one."""
    pending = list(reversed(items))
    with _stop_requests() as stop:
        if pool is None:
            while pending and not stop.is_set():
                outcome = run_document(*pending.pop(), verbose=verbose)  # Dagster interrupts a running one
                record(outcome)
                if outcome.interrupted:
                    stop.set()
            return pending[::-1]
        running: dict[Future[DocumentOutcome], tuple[str, str]] = {}
        forwarded = False
        while running or (pending and not stop.is_set()):
            while pending and not stop.is_set() and len(running) < workers:
                item = pending.pop()
                running[pool.submit(run_document, *item, verbose=verbose)] = item
            done, _ = wait(running, timeout=STOP_POLL_SECONDS, return_when=FIRST_COMPLETED)
            if stop.is_set() and not forwarded:  # Ctrl-C reached the workers too; a signal sent here did not
                for child in multiprocessing.active_children():
                    with suppress(ProcessLookupError):
                        os.kill(child.pid, signal.SIGINT)  # type: ignore[arg-type]
                forwarded = True
            for future in done:
                outcome = _outcome(future, *running.pop(future))
                record(outcome)
                if outcome.interrupted:
                    stop.set()
        return pending[::-1]


@contextmanager
def _stop_requests() -> Iterator[threading.Event]:
    """An event Ctrl-C and SIGTERM set, rather than raising KeyboardInterrupt in the middle of the
    bookkeeping between runs. Off the main thread (the HTTP API's ingest thread) signals are not ours."""
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


def _outcome(future: Future[DocumentOutcome], path: str, document_id: str) -> DocumentOutcome:
    try:
        return future.result()
    except Exception as exc:  # the worker process died (killed, out of memory) or could not run the document
        return DocumentOutcome(
            path=path, document_id=document_id, error=f"{Path(path).name}: {exception_line(exc)}"
        )


def exception_line(exc: BaseException) -> str:
    """`Type: first line of the message`: what the terminal shows of an unexpected exception; a
    full disk says so first, with the file it could not write."""
    if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
        return str(exc) if str(exc).startswith("disk full") else f"disk full: {exc.filename or exc}"
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__


def _interrupted(path: str, document_id: str) -> DocumentOutcome:
    error = f"{Path(path).name}: interrupted before it finished"
    return DocumentOutcome(path=path, document_id=document_id, error=error, interrupted=True)


def _merge(report: IngestReport, outcome: DocumentOutcome, progress: Callable[[str], None]) -> None:
    report.interrupted = report.interrupted or outcome.interrupted
    if outcome.error:
        report.failed.append(FailedFile(path=outcome.path, error=outcome.error))
        progress(f"FAILED {outcome.error}")
        return
    report.documents += 1
    for field in (
        "images",
        "images_ignored",
        "images_enriched",
        "enrichment_calls",
        "cache_hits",
        "chunks",
    ):
        setattr(report, field, getattr(report, field) + getattr(outcome, field))
    for language, count in outcome.languages.items():
        report.languages[language] = report.languages.get(language, 0) + count
    for language, count in outcome.ocr_languages.items():
        report.ocr_languages[language] = report.ocr_languages.get(language, 0) + count
    for reason, count in outcome.fallbacks.items():
        report.fallbacks[reason] = report.fallbacks.get(reason, 0) + count
    progress(f"ok {outcome.path} ({outcome.document_id})")


def quiet_library_noise() -> None:
    """Keep the terminal for our own lines: the missing XDG_RUNTIME_DIR notice and the model-loading
    progress bar say nothing a user can act on. (Dagster's preview and beta notices about our
    definitions are silenced where they arise, by message: defs/checks.py, defs/definitions.py.)"""
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    quiet_embedded_server_notice()


@contextmanager
def _started_pool(workers: int) -> Iterator[ProcessPoolExecutor | None]:
    """`workers` spawned processes, already starting (None for one worker: runs stay in this process)."""
    if workers == 1:
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
    # Ctrl-C reaches the whole process group: a worker between documents ignores it, and during one
    # Dagster's own handler interrupts the run (so it fails cleanly, freeing its pool slots).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    os.environ["VISION_RAG_THREADS"] = str(threads)
    quiet_library_noise()
    with suppress(Exception):  # reported by each document's run, as below
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


def run_document(path: str, document_id: str, verbose: bool = False) -> DocumentOutcome:
    """Materialize the whole asset graph for one registered document in this process."""
    from vision_rag_pipeline.defs.definitions import defs

    result = defs.resolve_job_def("ingest_document").execute_in_process(
        instance=dagster_instance(),
        partition_key=document_id,
        raise_on_error=False,
        run_config=console_config(verbose),
        tags=owner_tags(),
    )
    if not result.success:
        if _was_interrupted(result):
            return _interrupted(path, document_id)
        error = failure_reason(result)
        if Path(path).name not in error:
            error = f"{Path(path).name}: {error}"
        return DocumentOutcome(path=path, document_id=document_id, error=error)
    verdicts = result.output_for_node("image_verdicts")
    batch = result.output_for_node("image_enrichments")
    chunks = result.output_for_node("document_chunks")
    return DocumentOutcome(
        path=path,
        document_id=document_id,
        images=len(result.output_for_node("extracted_images")),
        images_ignored=sum(v.verdict == "IGNORE" for v in verdicts),
        images_enriched=len(batch.results),
        enrichment_calls=batch.calls,
        cache_hits=batch.cache_hits,
        fallbacks=batch.fallbacks,
        chunks=len(chunks),
        languages=Counter(c.metadata["language"] for c in chunks if c.metadata.get("language")),
        ocr_languages=Counter(lang for r in batch.results.values() for lang in r.ocr.languages),
    )


def _unreadable_reason(path: Path) -> str | None:
    if not path.exists():
        return f"{path}: no such file"
    if not path.is_file():
        return f"{path}: not a file"
    if sniff_document_kind(path) is None:
        return f"{path.name}: not an MHTML web archive or a PDF"
    return None


def _failures(result: dg.ExecuteInProcessResult) -> Iterator[tuple[SerializableErrorInfo, str]]:
    """The errors that failed the run and where: each failed step's, then the run's own."""
    for event in result.all_events:
        if event.is_step_failure and event.step_failure_data and event.step_failure_data.error:
            yield event.step_failure_data.error, f"in {event.step_key}"
    for event in result.all_events:
        if event.event_type == dg.DagsterEventType.RUN_FAILURE and event.job_failure_data.error:
            yield event.job_failure_data.error, "in the Dagster run, outside the assets"


def failure_reason(result: dg.ExecuteInProcessResult) -> str:
    """The exception behind the first failed step, on one line; else the one that failed the run
    outside any step (Dagster's own storage, for instance). The full traces stay in the run's events."""
    for error, where in _failures(result):
        return f"{_one_line(error)} ({where})"
    return "run failed"


def _was_interrupted(result: dg.ExecuteInProcessResult) -> bool:
    return any(
        cause.cls_name in {cls.__name__ for cls in INTERRUPTED}
        for error, _ in _failures(result)
        for cause in _causes(error)
    )


def _causes(error: SerializableErrorInfo | None) -> Iterator[SerializableErrorInfo]:
    while error is not None:
        yield error
        error = error.cause


def _one_line(error: SerializableErrorInfo) -> str:
    """The innermost cause's message, first line, without its (module-qualified) class name."""
    *_, error = _causes(error)
    message = error.message.strip().splitlines()[0] if error.message.strip() else error.cls_name
    message = re.sub(rf"^(?:[\w.]+\.)?{re.escape(error.cls_name)}: ", "", message)
    if "No space left on device" in message and not message.startswith("disk full"):
        return f"disk full: {message}"
    return message
