"""A run launcher that executes the daemon's runs in a few warm worker processes, as the CLI does.

Dagster's `DefaultRunLauncher` asks the code server to start each run, and the code server spawns a
new process per run: every inbox, version-sensor, backfill, schedule or UI run imports Dagster, the
project and torch and loads the embedding model before its first step (~3.4 s of CPU, against
~0.35 s for a run in a process that has done so already). `WarmRunLauncher` keeps a small pool of
worker processes instead, spawned once by the launcher in the process that launches runs (the
daemon; the webserver never launches with the queued run coordinator). Each worker imports the
definitions and starts loading the model, then executes one launched run after another: it reloads
the run from the instance and executes that existing run as `dagster api execute_run` does (same
status transitions STARTING -> STARTED -> SUCCESS/FAILURE, same events, logs and compute logs).

- Runs wait for a free worker in the launcher (status STARTING); a worker that finishes takes the
  next at once, without waiting for the run queue's next dequeue.
- A worker that dies (kill -9, out of memory) has its run marked failed and its pool slots freed at
  once; a new worker replaces it. Each run carries the identity of the process that holds it
  (defs/run_owner.py: first the launcher's, then its worker's), so run monitoring
  (`check_run_worker_health`), `vision-rag` and a restarted daemon's pool fail runs whose process is
  gone.
- Workers die with the launching process (Linux parent-death signal) and leave after `idle_seconds`
  without a run (their ~0.7 GB each is given back; the next run spawns them again).
- A worker whose definitions are stale (the config file now gives other code versions, or a source
  file of the project changed since it imported them) hands its run back and exits; a fresh worker
  runs it, so a setting change takes effect without a reload, as with a process per run.
- Terminating a run (the UI's Terminate) works from any process: a run still waiting is canceled
  at once; a running one is marked CANCELING, and its worker, which polls its run's status, interrupts
  it so that Dagster records it canceled.

Only runs of this project's code location in this interpreter go to the pool; others (another code
location, another virtualenv) are launched by `DefaultRunLauncher` through their code server.

Dagster has no public API to execute an already created run in a running process except the
`dagster api execute_run` command (a new process per run, which is the cost avoided here), so the
worker calls the functions that command calls (`recon_job_from_origin`, `core_execute_run`,
`capture_interrupts`) and reports its process as Dagster's run workers do (`EngineEventData`); the
launcher's health-check types, the code pointer it recognises and the tag of gRPC-launched runs have
no public names either. All are under `dagster._`; test_warm_launcher.py runs real runs through
them, terminates one and kills a real worker.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import multiprocessing
import os
import signal
import sys
import threading
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any

import dagster as dg
from dagster._core.code_pointer import ModuleCodePointer  # the code location a run's origin names
from dagster._core.events import EngineEventData  # the run's "process started" event, as Dagster's own
from dagster._core.launcher import CheckRunHealthResult, LaunchRunContext, WorkerStatus
from dagster._core.storage.tags import GRPC_INFO_TAG  # runs handed to DefaultRunLauncher carry it
from dagster._serdes import ConfigurableClassData

from vision_rag_pipeline.defs.run_owner import PID_TAG, owner_alive, owner_tags, reclaim_orphaned_runs

WARM_MODULES = frozenset({"vision_rag_pipeline.definitions"})  # the code location the workers preload
DEFAULT_IDLE_SECONDS = 600
CANCEL_POLL_SECONDS = 1.0
STOP_SECONDS = 10.0  # a busy worker's time to record its interrupted run when the launcher shuts down
PACKAGE = Path(__file__).resolve().parents[1]


class WarmRunLauncher(dg.DefaultRunLauncher):
    """`DefaultRunLauncher` whose runs of this project execute in a pool of warm worker processes.

    Config (all optional): `workers`, the pool's size (default: the CPU count, at most the instance's
    `max_concurrent_runs`); `idle_seconds`, how long a worker waits for a run before leaving
    (default 600).
    """

    def __init__(
        self,
        inst_data: ConfigurableClassData | None = None,
        workers: int | None = None,
        idle_seconds: int = DEFAULT_IDLE_SECONDS,
    ):
        super().__init__(inst_data=inst_data)
        self._workers = workers
        self._idle_seconds = idle_seconds
        self._pool: WarmPool | None = None
        self._pool_lock = threading.Lock()

    @classmethod
    def config_type(cls) -> dict:
        return {
            "workers": dg.Field(dg.IntSource, is_required=False),
            "idle_seconds": dg.Field(dg.IntSource, is_required=False, default_value=DEFAULT_IDLE_SECONDS),
        }

    @classmethod
    def from_config_value(cls, inst_data: ConfigurableClassData, config_value: Mapping[str, Any]):
        return cls(inst_data=inst_data, **config_value)

    def pool_size(self) -> int:
        """`workers`, else one per core but no more than runs may be in progress at once."""
        if self._workers:
            return self._workers
        cores = os.cpu_count() or 1
        queue = getattr(self._instance.run_coordinator, "get_run_queue_config", None)
        limit = queue().max_concurrent_runs if queue else -1
        return max(1, min(cores, limit) if limit > 0 else cores)

    def launch_run(self, context: LaunchRunContext) -> None:
        run = context.dagster_run
        if not runs_warm(run):
            super().launch_run(context)
            return
        with self._pool_lock:
            if self._pool is None:
                self._pool = WarmPool(self._instance, self.pool_size(), self._idle_seconds)
            pool = self._pool
        self._instance.add_run_tags(run.run_id, owner_tags())  # held by this process until a worker takes it
        pool.submit(run.run_id)

    def terminate(self, run_id: str) -> bool:
        run = self._instance.get_run_by_id(run_id)
        if run is None or run.is_finished:
            return False
        if GRPC_INFO_TAG in run.tags:
            return super().terminate(run_id)
        if run.status != dg.DagsterRunStatus.STARTED:  # waiting for a worker: nothing runs it yet
            self._instance.report_run_canceled(run, "Run canceled before a warm worker executed it.")
        elif owner_alive(run.tags):
            self._instance.report_run_canceling(run)  # its worker interrupts it within a second
        else:
            self._instance.report_run_canceled(run, "Run canceled; the process executing it is gone.")
        return True

    @property
    def supports_check_run_worker_health(self) -> bool:
        return True

    def check_run_worker_health(self, run: dg.DagsterRun) -> CheckRunHealthResult:
        if PID_TAG not in run.tags or GRPC_INFO_TAG in run.tags:
            # launched through a code server, which fails the run if its process dies
            return CheckRunHealthResult(WorkerStatus.RUNNING, "not run by a warm worker")
        if owner_alive(run.tags):
            return CheckRunHealthResult(WorkerStatus.RUNNING, run_worker_id=run.tags[PID_TAG])
        return CheckRunHealthResult(
            WorkerStatus.FAILED,
            f"process {run.tags[PID_TAG]} executing the run is gone",
            run_worker_id=run.tags[PID_TAG],
        )

    def dispose(self) -> None:
        if self._pool is not None:
            self._pool.close()
        super().dispose()


def runs_warm(run: dg.DagsterRun) -> bool:
    """Whether a warm worker can execute the run: this project's code location, this interpreter."""
    origin = run.job_code_origin
    if origin is None:
        return False
    pointer = origin.repository_origin.code_pointer
    return (
        isinstance(pointer, ModuleCodePointer)
        and pointer.module in WARM_MODULES
        and os.path.realpath(origin.executable_path) == os.path.realpath(sys.executable)
    )


@dataclass
class _Worker:
    process: multiprocessing.process.BaseProcess
    conn: Connection
    run_id: str | None = None
    idle_since: float = field(default_factory=time.monotonic)
    leaving: bool = False  # told to exit, or exiting on its own (stale definitions): no run is lost


class WarmPool:
    """The worker processes and the runs waiting for one, supervised by one thread of this process.

    The workers are started from that thread, which lives as long as the process: Linux sends the
    parent-death signal when the creating thread ends, not only the process.
    """

    def __init__(self, instance: dg.DagsterInstance, size: int, idle_seconds: float) -> None:
        self._instance = instance
        self._size = size
        self._idle_seconds = idle_seconds
        self._waiting: deque[str] = deque()
        self._workers: list[_Worker] = []
        self._lock = threading.Lock()
        self._closed = False
        self._wake_read, self._wake_write = os.pipe()
        self._context = multiprocessing.get_context("spawn")
        self._thread = threading.Thread(target=self._supervise, name="warm-run-pool", daemon=True)
        self._thread.start()

    def submit(self, run_id: str) -> None:
        with self._lock:
            self._waiting.append(run_id)
        os.write(self._wake_write, b"x")

    def close(self) -> None:
        self._closed = True
        os.write(self._wake_write, b"x")
        self._thread.join(STOP_SECONDS + 5)

    def _supervise(self) -> None:
        # runs a killed daemon left behind (waiting here, or in its dead workers) are failed, their
        # pool slots freed, before this pool's runs need those slots
        with contextlib.suppress(Exception):
            reclaim_orphaned_runs(self._instance)
        while not self._closed:
            try:
                self._step()
            except Exception:  # keep supervising (this thread's end would kill every worker)
                logging.getLogger(__name__).exception("warm run pool")
                time.sleep(1)
        self._stop_workers()

    def _step(self) -> None:
        with self._lock:
            waiting = bool(self._waiting)
        live = [w for w in self._workers if not w.leaving]
        if waiting and len(live) < self._size:  # spawn the whole pool on demand: the next runs find it warm
            for _ in range(self._size - len(live)):
                self._workers.append(self._spawn())
        self._dispatch()
        self._retire_idle()
        watched: list[Any] = [self._wake_read]
        for worker in self._workers:
            watched += [worker.conn, worker.process.sentinel]
        for ready in wait(watched, timeout=max(1.0, self._idle_seconds / 4)):
            if ready == self._wake_read:
                os.read(self._wake_read, 4096)
        for worker in list(self._workers):
            self._read_messages(worker)
            if not worker.process.is_alive():
                self._reap(worker)

    def _spawn(self) -> _Worker:
        ours, theirs = self._context.Pipe()
        threads = max(1, (os.cpu_count() or 1) // self._size)
        process = self._context.Process(
            target=worker_main,
            args=(theirs, self._instance.get_ref(), os.getpid(), threads),
            name="vision-rag-warm-run-worker",
            daemon=False,
        )
        process.start()
        theirs.close()
        return _Worker(process, ours)

    def _dispatch(self) -> None:
        for worker in self._workers:
            if worker.leaving or worker.run_id is not None:
                continue
            with self._lock:
                if not self._waiting:
                    return
                run_id = self._waiting.popleft()
            try:
                worker.conn.send(run_id)
                worker.run_id = run_id
            except OSError:  # died meanwhile: the run goes to another worker
                with self._lock:
                    self._waiting.appendleft(run_id)
                worker.leaving = True

    def _retire_idle(self) -> None:
        with self._lock:
            if self._waiting:
                return
        for worker in self._workers:
            idle = not worker.leaving and worker.run_id is None
            if idle and time.monotonic() - worker.idle_since > self._idle_seconds:
                self._leave(worker)

    def _leave(self, worker: _Worker) -> None:
        worker.leaving = True
        with contextlib.suppress(OSError):
            worker.conn.send(None)

    def _read_messages(self, worker: _Worker) -> None:
        try:
            while worker.conn.poll():
                kind, run_id = worker.conn.recv()
                if kind == "stale":  # exits: a fresh worker runs it on current definitions
                    worker.leaving = True
                    with self._lock:
                        self._waiting.appendleft(run_id)
                worker.run_id = None
                worker.idle_since = time.monotonic()
        except (EOFError, OSError):
            pass

    def _reap(self, worker: _Worker) -> None:
        worker.process.join()
        self._workers.remove(worker)
        worker.conn.close()
        if worker.run_id is not None:
            self._fail_run(worker.run_id, worker.process.pid, worker.process.exitcode)

    def _fail_run(self, run_id: str, pid: int | None, exitcode: int | None) -> None:
        run = self._instance.get_run_by_id(run_id)
        if run is None or run.is_finished:
            return
        how = (
            f"was killed by {signal.Signals(-exitcode).name}"
            if exitcode is not None and exitcode < 0
            else f"exited with code {exitcode}"
        )
        self._instance.report_run_failed(
            run, f"Warm run worker process {pid} {how} while executing this run (killed, or out of memory)."
        )
        storage = self._instance.event_log_storage
        if storage.supports_global_concurrency_limits:
            storage.free_concurrency_slots_for_run(run_id)

    def _stop_workers(self) -> None:
        """Idle workers leave; a busy one is interrupted (Dagster records its run failed) and waited for."""
        for worker in self._workers:
            if worker.run_id is not None and worker.process.pid:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(worker.process.pid, signal.SIGINT)
            self._leave(worker)
        deadline = time.monotonic() + STOP_SECONDS
        for worker in self._workers:
            worker.process.join(max(0.0, deadline - time.monotonic()))
            if worker.process.is_alive():
                worker.process.kill()
                worker.process.join()


def worker_main(conn: Connection, instance_ref: Any, parent: int, threads: int) -> None:
    """A warm worker: preload, then execute the runs sent until told to leave (None) or orphaned."""
    from vision_rag_pipeline.defs.resources import load_embedding_model
    from vision_rag_pipeline.defs.runner import die_with_parent, quiet_library_noise

    die_with_parent(parent)
    # The daemon's Ctrl-C reaches the process group: between runs a worker ignores it (it dies with
    # the daemon); during a run Dagster's handler interrupts the run, which is recorded as failed.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    os.environ["VISION_RAG_THREADS"] = str(threads)
    quiet_library_noise()
    sources = source_mtimes()
    with contextlib.suppress(Exception):  # a definitions error is reported by the run that meets it
        for module in WARM_MODULES:  # by name, as Dagster loads the code location the runs point at
            importlib.import_module(module)
    threading.Thread(target=load_embedding_model, name="load-embedding-model", daemon=True).start()
    with dg.DagsterInstance.from_ref(instance_ref) as instance:
        while True:
            try:
                run_id = conn.recv()
            except (EOFError, OSError):
                return
            if run_id is None:
                return
            if definitions_stale(sources):
                conn.send(("stale", run_id))
                return
            execute_run(instance, run_id)
            conn.send(("done", run_id))


def source_mtimes() -> dict[str, int]:
    """The project's Python files and their modification times (ns)."""
    return {str(path): path.stat().st_mtime_ns for path in PACKAGE.rglob("*.py")}


def definitions_stale(sources: dict[str, int]) -> bool:
    """Whether this process's definitions differ from what a new process would load: a source file
    changed, or the config file now gives other code versions (they are computed on import)."""
    if source_mtimes() != sources:
        return True
    module = sys.modules.get("vision_rag_pipeline.defs.definitions")
    if module is None:
        return False
    from vision_rag_pipeline.core.config import config_in_effect
    from vision_rag_pipeline.defs.versions import code_versions

    try:
        current = code_versions(config_in_effect().file_now().config)
    except Exception:  # an unreadable config: the run reports it
        return False
    loaded = {
        spec.key.to_user_string(): spec.code_version for asset in module.ALL_ASSETS for spec in asset.specs
    }
    return any(loaded.get(key) != version for key, version in current.items())


def execute_run(instance: dg.DagsterInstance, run_id: str) -> None:
    """Execute an existing (launched) run in this process, as `dagster api execute_run` does."""
    from dagster._grpc.impl import core_execute_run  # what `dagster api execute_run` executes
    from dagster._utils.hosted_user_process import recon_job_from_origin
    from dagster._utils.interrupts import capture_interrupts

    run = instance.get_run_by_id(run_id)
    if run is None or run.is_finished:
        return
    if run.status == dg.DagsterRunStatus.CANCELING:  # terminated while it waited for this worker
        instance.report_run_canceled(run, "Run canceled before a warm worker executed it.")
        return
    instance.add_run_tags(run_id, owner_tags())
    pid = os.getpid()
    instance.report_engine_event(
        f"Started process for run (pid: {pid}): a warm worker of the daemon.",
        run,
        EngineEventData.in_process(pid),
    )
    done = threading.Event()
    watcher = threading.Thread(target=_interrupt_on_cancel, args=(instance, run_id, done), daemon=True)
    try:
        recon_job = recon_job_from_origin(run.job_code_origin)  # type: ignore[arg-type]
        watcher.start()
        with capture_interrupts():
            for _ in core_execute_run(recon_job, run, instance, inject_env_vars=True):
                pass
    except (Exception, KeyboardInterrupt):  # core_execute_run records the failure before raising
        pass
    finally:
        done.set()
        if watcher.is_alive():
            watcher.join()
    run = instance.get_run_by_id(run_id)
    if run is not None and not run.is_finished:
        instance.report_run_failed(run, "The warm worker ended the run without a result.")


def _interrupt_on_cancel(instance: dg.DagsterInstance, run_id: str, done: threading.Event) -> None:
    """Interrupt this process's run once it is terminated (CANCELING) or failed from outside."""
    ended = {dg.DagsterRunStatus.CANCELING, dg.DagsterRunStatus.CANCELED, dg.DagsterRunStatus.FAILURE}
    while not done.wait(CANCEL_POLL_SECONDS):
        run = instance.get_run_by_id(run_id)
        if run is None or run.status in ended:
            if not done.is_set():
                os.kill(os.getpid(), signal.SIGINT)
            return
