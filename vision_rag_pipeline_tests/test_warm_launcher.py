"""The warm run launcher's pool with real worker processes: runs executed one after another by the
same warm worker through Dagster's own run execution (the private functions it calls break these
tests if Dagster changes them), a worker killed with SIGKILL failing its run, Terminate from another
process, a config change answered by a fresh worker, and workers that die with their launcher.

The pool is driven directly with small jobs of warm_jobs.py (the launcher gives the pool only runs of
the project's code location; test_daemon.py launches those through a real daemon).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import dagster as dg
import psutil
import pytest
from dagster._core.code_pointer import FileCodePointer, ModuleCodePointer
from dagster._core.launcher import WorkerStatus
from dagster._core.origin import JobPythonOrigin, RepositoryPythonOrigin
from dagster._serdes import serialize_value

from vision_rag_pipeline.defs.run_owner import PID_TAG, reclaim_orphaned_runs
from vision_rag_pipeline.defs.warm_launcher import WarmPool, WarmRunLauncher, runs_warm
from vision_rag_pipeline_tests import warm_jobs

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
TIMEOUT = 120  # a worker's first run imports Dagster, the definitions and torch: slow on a busy machine
LAUNCHER = {"module": "vision_rag_pipeline.defs.warm_launcher", "class": "WarmRunLauncher"}
T = TypeVar("T")


def wait_for(what: str, check: Callable[[], T | None], timeout: float = TIMEOUT) -> T:
    deadline = time.monotonic() + timeout
    while not (found := check()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)
    return found


@pytest.fixture
def instance(vision_rag_home: Path, tmp_path: Path) -> Iterator[dg.DagsterInstance]:
    with dg.instance_for_test(temp_dir=str(tmp_path), overrides={"run_launcher": LAUNCHER}) as instance:
        yield instance


@pytest.fixture
def pool(instance: dg.DagsterInstance) -> Iterator[WarmPool]:
    pool = WarmPool(instance, size=1, idle_seconds=600)
    yield pool
    pool.close()


def new_run(instance: dg.DagsterInstance, job: dg.JobDefinition) -> str:
    """A run as the run coordinator hands it to the launcher: created, STARTING, with its code origin."""
    origin = dg.reconstructable(getattr(warm_jobs, job.name)).get_python_origin()
    run = instance.create_run_for_job(
        job_def=job, job_code_origin=origin, status=dg.DagsterRunStatus.STARTING
    )
    return run.run_id


def status(instance: dg.DagsterInstance, run_id: str, *wanted: dg.DagsterRunStatus) -> dg.DagsterRun | None:
    run = instance.get_run_by_id(run_id)
    return run if run is not None and run.status in wanted else None


def finished(instance: dg.DagsterInstance, run_id: str) -> dg.DagsterRun:
    return wait_for(
        f"run {run_id} to end", lambda: (r := instance.get_run_by_id(run_id)) and r.is_finished and r
    )


def running_in_worker(instance: dg.DagsterInstance, run_id: str) -> tuple[dg.DagsterRun, int]:
    """The run once a worker executes its step, and that worker's pid."""
    run = wait_for(f"run {run_id} to start", lambda: status(instance, run_id, dg.DagsterRunStatus.STARTED))
    wait_for(
        "the step to start",
        lambda: any(e.dagster_event.is_step_start for e in instance.all_logs(run_id) if e.dagster_event),
    )
    return run, int(instance.get_run_by_id(run_id).tags[PID_TAG])


def messages(instance: dg.DagsterInstance, run_id: str) -> str:
    return "\n".join(entry.message for entry in instance.all_logs(run_id))


def test_runs_execute_one_after_another_in_the_same_warm_worker(instance, pool):
    first, second = new_run(instance, warm_jobs.quick_job), new_run(instance, warm_jobs.quick_job)
    pool.submit(first)
    pool.submit(second)

    runs = [finished(instance, run_id) for run_id in (first, second)]

    assert [run.status for run in runs] == [dg.DagsterRunStatus.SUCCESS] * 2
    pids = {int(run.tags[PID_TAG]) for run in runs}
    assert len(pids) == 1 and pids != {os.getpid()}
    assert psutil.Process(pids.pop()).ppid() == os.getpid()  # a worker of this (launching) process
    assert "a warm worker" in messages(instance, second)


def test_a_worker_killed_mid_run_fails_its_run_and_a_new_worker_takes_the_next(instance, pool):
    doomed = new_run(instance, warm_jobs.waiting_job)
    pool.submit(doomed)
    run, pid = running_in_worker(instance, doomed)
    launcher = instance.run_launcher
    assert launcher.check_run_worker_health(run).status == WorkerStatus.RUNNING

    os.kill(pid, signal.SIGKILL)

    run = finished(instance, doomed)
    assert run.status == dg.DagsterRunStatus.FAILURE
    assert f"process {pid} was killed by SIGKILL" in messages(instance, doomed)
    assert launcher.check_run_worker_health(run).status == WorkerStatus.FAILED
    after = new_run(instance, warm_jobs.quick_job)
    pool.submit(after)
    run = finished(instance, after)
    assert run.status == dg.DagsterRunStatus.SUCCESS and int(run.tags[PID_TAG]) != pid


def test_terminate_from_another_process_cancels_the_run_and_the_worker_stays(instance, pool):
    running, waiting = new_run(instance, warm_jobs.waiting_job), new_run(instance, warm_jobs.quick_job)
    pool.submit(running)
    pool.submit(waiting)  # the only worker is busy: it waits in the launcher
    _, pid = running_in_worker(instance, running)
    elsewhere = WarmRunLauncher()  # the webserver's launcher: no pool, the same instance
    elsewhere.register_instance(instance)

    assert elsewhere.terminate(waiting)
    assert status(instance, waiting, dg.DagsterRunStatus.CANCELED)  # at once: nothing runs it yet
    assert elsewhere.terminate(running)

    run = finished(instance, running)
    assert run.status == dg.DagsterRunStatus.CANCELED, messages(instance, running)
    after = new_run(instance, warm_jobs.quick_job)
    pool.submit(after)
    assert finished(instance, after).status == dg.DagsterRunStatus.SUCCESS
    assert int(instance.get_run_by_id(after).tags[PID_TAG]) == pid  # the worker survived the interrupt
    assert instance.get_run_by_id(waiting).status == dg.DagsterRunStatus.CANCELED


def test_a_changed_config_is_run_by_a_fresh_worker(instance, tmp_path, monkeypatch):
    config = tmp_path / "rag.yaml"
    config.write_text("id: warm\n")
    monkeypatch.setenv("VISION_RAG_CONFIG", str(config))  # workers inherit it when spawned
    pool = WarmPool(instance, size=1, idle_seconds=600)
    try:
        before = new_run(instance, warm_jobs.quick_job)
        pool.submit(before)
        old_pid = int(finished(instance, before).tags[PID_TAG])
        config.write_text("id: warm\nmedia_enrichment: {fusion: {max_keywords: 6}}\n")  # other code versions

        after = new_run(instance, warm_jobs.quick_job)
        pool.submit(after)

        run = finished(instance, after)
        assert run.status == dg.DagsterRunStatus.SUCCESS
        assert int(run.tags[PID_TAG]) != old_pid
        wait_for("the stale worker to leave", lambda: not psutil.pid_exists(old_pid), timeout=30)
    finally:
        pool.close()


def test_workers_die_with_the_launching_process_and_their_run_is_found_orphaned(instance):
    run_id = new_run(instance, warm_jobs.waiting_job)
    launcher_script = textwrap.dedent(
        f"""
        import time
        import dagster as dg
        from dagster._serdes import deserialize_value
        from vision_rag_pipeline.defs.warm_launcher import WarmPool
        instance = dg.DagsterInstance.from_ref(deserialize_value({serialize_value(instance.get_ref())!r}))
        WarmPool(instance, size=1, idle_seconds=600).submit({run_id!r})
        time.sleep(600)
        """
    )
    env = os.environ | {"PYTHONPATH": str(REPO)}
    daemon = subprocess.Popen([sys.executable, "-c", launcher_script], env=env)
    try:
        run, pid = running_in_worker(instance, run_id)
        assert psutil.Process(pid).ppid() == daemon.pid
    finally:
        daemon.kill()  # SIGKILL: no clean-up of its own
        daemon.wait()

    wait_for("the worker to die with its parent", lambda: not psutil.pid_exists(pid), timeout=30)
    assert instance.run_launcher.check_run_worker_health(run).status == WorkerStatus.FAILED
    assert reclaim_orphaned_runs(instance) == [run_id]
    assert instance.get_run_by_id(run_id).status == dg.DagsterRunStatus.FAILURE


def _origin(pointer, executable: str = sys.executable) -> JobPythonOrigin:
    return JobPythonOrigin("ingest_document", RepositoryPythonOrigin(executable, pointer))


def test_only_this_projects_runs_in_this_interpreter_go_to_the_warm_workers(instance):
    ours = ModuleCodePointer("vision_rag_pipeline.definitions", "defs", None)
    cases = {
        "ours": (_origin(ours), True),
        "another code location": (
            _origin(FileCodePointer(str(REPO / "bench" / "daemon_executors.py"), "defs")),
            False,
        ),
        "another virtualenv": (_origin(ours, "/opt/other/bin/python"), False),
    }
    for name, (origin, expected) in cases.items():
        run = instance.create_run_for_job(job_def=warm_jobs.quick_job, job_code_origin=origin)
        assert runs_warm(run) is expected, name
