"""`vision-rag ingest --submit`: register files and hand one run per changed file to the instance's
run coordinator (the daemon's queue), instead of executing them in this process.

Registering copies each file's bytes into the registry in Postgres, so the run can execute on any
host (a run pod, a code server elsewhere, Celery workers) after the file is gone from here. The
runs are made as `dagster job launch` makes them: from this process' view of the code location,
under the location name every deployment gives it (`vision_rag_pipeline.definitions`), so the daemon
finds the job in its own workspace, and with the image `DAGSTER_CURRENT_IMAGE` names (how Dagster's
code servers tell the Kubernetes run launcher which image to run).

Dagster has no public Python API to create and submit a run of a code location (only GraphQL,
which needs the webserver's address); the `dagster._core` imports are those its CLI uses.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import dagster as dg
from dagster._core.definitions.repository_definition import SINGLETON_REPOSITORY_NAME
from dagster._core.definitions.selector import JobSubsetSelector
from dagster._core.remote_origin import InProcessCodeLocationOrigin
from dagster._core.types.loadable_target_origin import LoadableTargetOrigin
from dagster._core.workspace.context import WorkspaceProcessContext, WorkspaceRequestContext
from dagster._core.workspace.load_target import InProcessWorkspaceLoadTarget
from pydantic import BaseModel, Field

from vision_rag_pipeline.defs.partitions import documents_partitions
from vision_rag_pipeline.defs.runner import FailedFile, _unchanged, _unreadable_reason
from vision_rag_pipeline.documents.registry import DocumentRegistry, document_id_for

CODE_LOCATION = "vision_rag_pipeline.definitions"  # its name in every workspace, chart and compose file
JOB = "ingest_document"
PARTITION_TAG = "dagster/partition"


class SubmittedRun(BaseModel):
    path: str
    document_id: str
    run_id: str


class SubmitReport(BaseModel):
    submitted: list[SubmittedRun] = Field(default_factory=list)
    unchanged: list[str] = Field(default_factory=list)  # paths whose last complete run read these bytes
    failed: list[FailedFile] = Field(default_factory=list)


class NoRunQueueError(ValueError):
    """The instance would launch the runs itself, which it cannot for a code location in this process."""


@contextmanager
def code_location_workspace(instance: dg.DagsterInstance) -> Iterator[WorkspaceRequestContext]:
    """The code location loaded in this process, under the name the daemon's workspace knows."""
    origin = InProcessCodeLocationOrigin(
        LoadableTargetOrigin(executable_path=sys.executable, module_name=CODE_LOCATION),
        container_image=os.environ.get("DAGSTER_CURRENT_IMAGE") or None,
        location_name=CODE_LOCATION,
    )
    with WorkspaceProcessContext(instance, InProcessWorkspaceLoadTarget(origin)) as process:
        yield process.create_request_context()


def create_ingest_run(
    instance: dg.DagsterInstance,
    workspace: WorkspaceRequestContext,
    document_id: str,
    run_config: dict | None = None,
) -> dg.DagsterRun:
    """A NOT_STARTED run of `ingest_document` for one partition, with the origins a launcher needs."""
    run_config = run_config or {}
    location = workspace.get_code_location(CODE_LOCATION)
    repository = location.get_repository(SINGLETON_REPOSITORY_NAME)
    remote_job = location.get_job(
        JobSubsetSelector(
            location_name=CODE_LOCATION, repository_name=repository.name, job_name=JOB, op_selection=None
        )
    )
    plan = location.get_execution_plan(
        remote_job, run_config, step_keys_to_execute=None, known_state=None, instance=instance
    ).execution_plan_snapshot
    return instance.create_run(
        job_name=JOB,
        run_id=None,
        run_config=run_config,
        resolved_op_selection=None,
        step_keys_to_execute=plan.step_keys_to_execute,
        op_selection=None,
        status=None,
        root_run_id=None,
        parent_run_id=None,
        tags={**remote_job.run_tags, PARTITION_TAG: document_id},
        job_snapshot=remote_job.job_snapshot,
        execution_plan_snapshot=plan,
        parent_job_snapshot=remote_job.parent_job_snapshot,
        remote_job_origin=remote_job.get_remote_origin(),
        job_code_origin=remote_job.get_python_origin(),
        asset_selection=None,
        asset_check_selection=None,
        asset_graph=repository.asset_graph,
    )


def submit_paths(instance: dg.DagsterInstance, paths: list[str], force: bool = False) -> SubmitReport:
    """Register each readable file and submit one run per file whose bytes or settings changed since
    its partition's last complete run (every file with `force`)."""
    if not isinstance(instance.run_coordinator, dg.QueuedRunCoordinator) and isinstance(
        instance.run_launcher, dg.DefaultRunLauncher
    ):
        raise NoRunQueueError(
            "--submit needs a Dagster instance with a run queue (QueuedRunCoordinator, as in "
            "docker/dagster.yaml) and its daemon running; this one would launch runs itself "
            f"(DAGSTER_HOME={instance.root_directory}); ingest without --submit instead"
        )
    report = SubmitReport()
    readable: dict[str, str] = {}
    for path in paths:
        reason = _unreadable_reason(Path(path))
        if reason:
            report.failed.append(FailedFile(path=path, error=reason))
        else:
            readable[path] = document_id_for(path)
    known = set(instance.get_dynamic_partitions(documents_partitions.name))
    unchanged = set() if force else _unchanged(instance, readable, known)
    report.unchanged = [path for path in readable if path in unchanged]
    todo = {path: doc_id for path, doc_id in readable.items() if path not in unchanged}
    if not todo:
        return report
    registry = DocumentRegistry()
    registered = {path: registry.register(path).document_id for path in todo}
    instance.add_dynamic_partitions(documents_partitions.name, sorted(set(registered.values())))
    with code_location_workspace(instance) as workspace:
        for path, document_id in registered.items():
            run = create_ingest_run(instance, workspace, document_id)
            instance.submit_run(run.run_id, workspace)
            report.submitted.append(SubmittedRun(path=path, document_id=document_id, run_id=run.run_id))
    return report
