"""The Kubernetes path in deploy/, checked without a cluster, Helm or kubeconform (none is installable
offline here): the instance file against Dagster's own instance schema and dagster-k8s'
K8sRunLauncher schema, the run config against k8s_job_executor's schema on the real job, and the
Helm values for the official chart against the instance they must render (same launcher settings,
queue, pools, retries) and against the rest of the project (code location name, image, secrets).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import dagster
import dagster as dg
import psycopg
import pytest
import yaml
from dagster._config import process_config
from dagster._core.definitions.repository_definition import SINGLETON_REPOSITORY_NAME
from dagster._core.definitions.selector import JobSubsetSelector
from dagster._core.instance.config import dagster_instance_config
from dagster._core.remote_origin import InProcessCodeLocationOrigin
from dagster._core.types.loadable_target_origin import LoadableTargetOrigin
from dagster._core.workspace.context import WorkspaceProcessContext, WorkspaceRequestContext
from dagster._core.workspace.load_target import InProcessWorkspaceLoadTarget
from dagster_k8s import K8sRunLauncher

from vision_rag_pipeline.core.config import (
    CELERY_BROKER_ENV,
    CELERY_VISIBILITY_ENV,
    EXECUTOR_ENV,
    MULTI_NODE_ENV,
)

ROOT = Path(__file__).resolve().parents[1]
MODULE = "vision_rag_pipeline.definitions"
SHARED_WITH_DOCKER = (
    "storage",
    "compute_logs",
    "run_coordinator",
    "concurrency",
    "run_retries",
    "run_monitoring",
    "sensors",
    "telemetry",
    "nux",
)


def _load(name: str) -> Any:
    return yaml.safe_load((ROOT / name).read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def instance() -> dict[str, Any]:
    return _load("deploy/k8s/dagster.yaml")


@pytest.fixture(scope="module")
def values() -> dict[str, Any]:
    return _load("deploy/helm/values.yaml")


def test_the_k8s_instance_passes_dagsters_schema_and_the_k8s_run_launchers(tmp_path: Path) -> None:
    shutil.copy(ROOT / "deploy/k8s/dagster.yaml", tmp_path / "dagster.yaml")
    config, _ = dagster_instance_config(str(tmp_path))
    launcher = config["run_launcher"]
    assert (launcher["module"], launcher["class"]) == ("dagster_k8s", "K8sRunLauncher")
    checked = process_config(K8sRunLauncher.config_type(), launcher["config"])
    assert checked.success, [error.message for error in checked.errors]
    assert f"{MULTI_NODE_ENV}=1" in launcher["config"]["env_vars"]  # run pods refuse tantivy


def test_the_k8s_instance_differs_from_dockers_only_by_its_run_launcher(instance: dict[str, Any]) -> None:
    docker = _load("docker/dagster.yaml")
    for key in SHARED_WITH_DOCKER:
        assert instance[key] == docker[key], key
    assert set(instance) - set(docker) == {"run_launcher"}


def test_the_helm_values_render_the_k8s_instance(values: dict[str, Any], instance: dict[str, Any]) -> None:
    launcher = instance["run_launcher"]["config"]
    assert values["runLauncher"]["type"] == "K8sRunLauncher"
    k8s = values["runLauncher"]["config"]["k8sRunLauncher"]
    assert [secret["name"] for secret in k8s["envSecrets"]] == launcher["env_secrets"]
    assert k8s["envVars"] == launcher["env_vars"]
    assert k8s["runK8sConfig"]["containerConfig"] == launcher["run_k8s_config"]["container_config"]

    daemon = values["dagsterDaemon"]
    coordinator = daemon["runCoordinator"]
    assert coordinator["type"] == instance["run_coordinator"]["class"]
    runs = instance["concurrency"]["runs"]["max_concurrent_runs"]
    assert coordinator["config"]["queuedRunCoordinator"]["maxConcurrentRuns"] == runs
    assert daemon["runRetries"] == {
        "enabled": instance["run_retries"]["enabled"],
        "maxRetries": instance["run_retries"]["max_retries"],
    }
    assert daemon["sensors"] == {
        "useThreads": instance["sensors"]["use_threads"],
        "numWorkers": instance["sensors"]["num_workers"],
    }
    monitoring = instance["run_monitoring"]
    assert daemon["runMonitoring"] == {
        "enabled": monitoring["enabled"],
        "startTimeoutSeconds": monitoring["start_timeout_seconds"],
        "pollIntervalSeconds": monitoring["poll_interval_seconds"],
    }
    pools = instance["concurrency"]["pools"]
    assert values["concurrency"]["pools"] == {
        "defaultLimit": pools["default_limit"],
        "granularity": pools["granularity"],
    }
    assert values["telemetry"] == instance["telemetry"]
    custom = values["computeLogManager"]["config"]["customComputeLogManager"]
    assert values["computeLogManager"]["type"] == "CustomComputeLogManager"
    assert (custom["module"], custom["class"]) == (
        instance["compute_logs"]["module"],
        instance["compute_logs"]["class"],
    )
    chart_db = values["postgresql"]
    assert custom["config"]["postgres_db"] | {"password": None} == {
        "scheme": instance["storage"]["postgres"]["postgres_db"]["scheme"],
        "hostname": chart_db["postgresqlHost"],
        "port": chart_db["service"]["port"],
        "username": chart_db["postgresqlUsername"],
        "password": None,
        "db_name": chart_db["postgresqlDatabase"],
    }
    assert values["postgresql"]["enabled"] is False  # the index needs pgvector: bring a Postgres that has it


def test_the_helm_code_location_keeps_its_name_and_every_pod_is_told_it_is_multi_node(
    values: dict[str, Any],
) -> None:
    [deployment] = values["dagster-user-deployments"]["deployments"]
    args = deployment["dagsterApiGrpcArgs"]
    assert args[args.index("-m") + 1] == MODULE
    assert args[args.index("--location-name") + 1] == MODULE
    [server] = values["dagsterWebserver"]["workspace"]["servers"]
    assert (server["host"], server["port"], server["name"]) == (
        deployment["name"],
        deployment["port"],
        MODULE,
    )
    assert {"name": MULTI_NODE_ENV, "value": "1"} in deployment["env"]
    assert [s["name"] for s in deployment["envSecrets"]] == [
        s["name"] for s in values["runLauncher"]["config"]["k8sRunLauncher"]["envSecrets"]
    ]
    assert deployment["includeConfigInLaunchedRuns"] == {"enabled": True}


def test_the_chart_version_is_the_pinned_dagster_version(values: dict[str, Any]) -> None:
    """The chart deploys the Dagster the image pins (pyproject.toml), whichever Dagster runs the tests
    (scripts/test_newest_dagster.sh runs them on a newer one)."""
    text = (ROOT / "deploy/helm/values.yaml").read_text(encoding="utf-8")
    pinned = re.search(r'"dagster==([^"]+)"', (ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    assert pinned and set(re.findall(r"--version (\S+)", text)) == {pinned[1]}


_EXECUTOR_PROBE = """
import json, sys, yaml, dagster as dg
from vision_rag_pipeline.defs.definitions import defs
job = defs.resolve_job_def("ingest_document")
config = yaml.safe_load(open(sys.argv[1]))
dg.validate_run_config(job, config)
print(json.dumps({"executor": job.executor_def.name}))
"""


def _probe(env_value: str, **extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", _EXECUTOR_PROBE, str(ROOT / "deploy/k8s/run_config.yaml")],
        env={**os.environ, EXECUTOR_ENV: env_value, "PYTHONPATH": str(ROOT), **extra},
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_k8s_job_executor_is_chosen_by_the_environment_and_accepts_the_run_config() -> None:
    probe = _probe("k8s_job")
    assert probe.returncode == 0, probe.stderr[-3000:]
    assert json.loads(probe.stdout.splitlines()[-1]) == {"executor": "k8s"}
    wrong = _probe("dask")
    assert wrong.returncode != 0 and f"{EXECUTOR_ENV}='dask'" in wrong.stderr


_CELERY_PROBE = """
import json
from vision_rag_pipeline.defs.definitions import defs
executor = defs.resolve_job_def("ingest_document").executor_def
print(json.dumps({"executor": executor.name, "config": executor.apply_config_mapping({}).value["config"]}))
"""


def test_celery_executor_takes_broker_backend_and_delivery_from_the_environment() -> None:
    env = {**os.environ, EXECUTOR_ENV: "celery", "PYTHONPATH": str(ROOT)}
    env.pop(CELERY_BROKER_ENV, None)
    refused = subprocess.run(
        [sys.executable, "-c", _CELERY_PROBE], env=env, capture_output=True, text=True, timeout=300
    )
    assert refused.returncode != 0 and f"needs {CELERY_BROKER_ENV}" in refused.stderr
    env |= {CELERY_BROKER_ENV: "redis://broker.example:6379/0", CELERY_VISIBILITY_ENV: "900"}
    chosen = subprocess.run(
        [sys.executable, "-c", _CELERY_PROBE], env=env, capture_output=True, text=True, timeout=300
    )
    assert chosen.returncode == 0, chosen.stderr[-3000:]
    probe = json.loads(chosen.stdout.splitlines()[-1])
    assert probe["executor"] == "celery"
    config = probe["config"]
    assert config["broker"] == config["backend"] == "redis://broker.example:6379/0"
    delivery = config["config_source"]
    assert delivery["task_acks_late"] and delivery["task_reject_on_worker_lost"]
    assert delivery["broker_transport_options"]["visibility_timeout"] == 900


# ---------------------------------------------------------------------------------------------------
# The real K8sRunLauncher, built from deploy/k8s/dagster.yaml, launching a run against a recording
# Batch API (as dagster-k8s' own unit tests do); then the recorded Job's container command runs on
# a "pod": another host (network + mount namespace) holding only the Job's environment, the Secret
# it names and what the image holds. The instance settings travel in the command (dagster-k8s
# serializes the instance into `dagster api execute_run`), the stores' addresses in the Secret.

IMAGE = "registry.example.com/vision-rag-pipeline:0.1.0"
FAKE_KUBECONFIG = """\
apiVersion: v1
kind: Config
current-context: recorded
contexts: [{name: recorded, context: {cluster: recorded}}]
clusters: [{name: recorded, cluster: {server: "https://kubernetes.invalid"}}]
"""


def _image_env(pod_root: str) -> dict[str, str]:
    """The Dockerfile's ENV, with the project installed where this test's code is."""
    return {
        "PATH": os.pathsep.join([str(Path(sys.executable).parent), "/usr/local/bin:/usr/bin:/bin"]),
        "PYTHONPATH": str(ROOT),
        "PYTHONUNBUFFERED": "1",
        "HOME": f"{pod_root}/home",
        "VISION_RAG_HOME": f"{pod_root}/vision_rag",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
    }


def _pod_env(container: Any, secrets: dict[str, dict[str, str]]) -> dict[str, str]:
    """The container's environment as the kubelet would set it: `env` (values and secret keys),
    then every Secret of `env_from`."""
    env: dict[str, str] = {}
    for source in container.env_from or []:
        env |= secrets[source.secret_ref.name]
    for var in container.env or []:
        if var.value_from is not None:
            ref = var.value_from.secret_key_ref
            env[var.name] = secrets[ref.name][ref.key]
        else:
            env[var.name] = var.value
    return env


@pytest.mark.slow
def test_the_k8s_run_launcher_launches_a_job_whose_command_runs_the_run(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    from unittest import mock

    from dagster._core.launcher import LaunchRunContext

    from vision_rag_pipeline.cli import SAMPLES
    from vision_rag_pipeline.defs.partitions import documents_partitions
    from vision_rag_pipeline.documents.registry import DocumentRegistry
    from vision_rag_pipeline_tests.hosts import Lan, ServiceHost, namespaces_unavailable
    from vision_rag_pipeline_tests.test_deploy_config import production_instance_env

    reason = namespaces_unavailable()
    if reason:
        pytest.skip(f"no separate hosts here: {reason}")
    instance_yaml = _load("deploy/k8s/dagster.yaml")
    launcher_config = instance_yaml["run_launcher"]["config"]
    lan = Lan()
    try:
        services = ServiceHost(lan.add("services"), tmp_path / "services")
        services.create_database("dagster")
        services.create_database("vision_rag")
        # The Secret the instance names: the stores as the pod reaches them, over the network.
        secrets = {
            name: services.shared_env("dagster", "vision_rag") for name in launcher_config["env_secrets"]
        }

        # This process is the daemon: the same instance (minus the launcher, which needs a cluster
        # to be built from the file), reaching Postgres through its socket.
        for name, value in production_instance_env(services.admin_url("dagster"), "dagster").items():
            monkeypatch.setenv(name, value)
        monkeypatch.setenv("DAGSTER_CURRENT_IMAGE", IMAGE)  # as the chart sets it on the code server
        home = tmp_path / "daemon"
        home.mkdir()
        (home / "dagster.yaml").write_text(
            yaml.safe_dump({key: value for key, value in instance_yaml.items() if key != "run_launcher"})
        )
        instance = dagster.DagsterInstance.from_config(str(home))
        pdf = SAMPLES / "larkspur_q3_2024_operations_review.pdf"
        document_id = DocumentRegistry(services.admin_url("vision_rag")).register(str(pdf)).document_id
        instance.add_dynamic_partitions(documents_partitions.name, [document_id])

        kubeconfig = tmp_path / "kubeconfig"
        kubeconfig.write_text(FAKE_KUBECONFIG)
        batch_api = mock.MagicMock()
        checked = process_config(K8sRunLauncher.config_type(), launcher_config)
        assert checked.success, [error.message for error in checked.errors]
        launcher = K8sRunLauncher(
            **{**checked.value, "load_incluster_config": False, "kubeconfig_file": str(kubeconfig)},
            k8s_client_batch_api=batch_api,
        )
        launcher.register_instance(instance)
        with code_location_workspace(instance) as workspace:
            # Steps in the run's process (the default executor): this tests the pod's wiring.
            run = create_ingest_run(instance, workspace, document_id, {})
            launcher.launch_run(LaunchRunContext(dagster_run=run, workspace=workspace))

        [(method, _, call)] = [c for c in batch_api.method_calls if c[0] == "create_namespaced_job"]
        job = call["body"]
        assert call["namespace"] == launcher_config["job_namespace"]
        pod_spec = job.spec.template.spec
        assert pod_spec.service_account_name == launcher_config["service_account_name"]
        [container] = pod_spec.containers
        assert container.image == IMAGE
        argv = [*(container.command or []), *container.args]
        assert argv[:3] == ["dagster", "api", "execute_run"]
        shipped = json.loads(argv[3])["instance_ref"]  # the instance travels in the command
        assert shipped["compute_logs_data"]["class_name"] == "PostgresComputeLogManager"

        # The pod: its own host, a private tmpfs over /opt (its home) and over this test's folders
        # (it must need nothing of the daemon's disk), and nothing of this test's environment but
        # what the Job and the image give.
        pod_root = "/opt"
        pod = lan.add("pod", private=[Path(pod_root), tmp_path_factory.getbasetemp()])
        env = _image_env(pod_root) | _pod_env(container, secrets)
        assert env["DAGSTER_HOME"] == launcher_config["dagster_home"] and env["VISION_RAG_MULTI_NODE"] == "1"
        setup = f'mkdir -p "{env["DAGSTER_HOME"]}" "{env["HOME"]}" "{env["VISION_RAG_HOME"]}" && cd "{env["HOME"]}"'
        done = subprocess.run(
            pod.command(argv, setup=setup), env=env, capture_output=True, text=True, timeout=600
        )
        assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
        stored = instance.get_run_by_id(run.run_id)
        assert stored is not None and stored.status == dagster.DagsterRunStatus.SUCCESS, done.stderr[-4000:]
        with psycopg.connect(services.admin_url("vision_rag")) as conn:
            [(chunks,)] = conn.execute("SELECT count(*) FROM chunks WHERE document_id = %s", (document_id,))
        assert chunks > 0
        instance.dispose()
    finally:
        lan.close()


# A run made as `dagster job launch` makes it, from this process' view of the code location, under the
# name every deployment gives it, so that a launcher finds its origins: Dagster has no public Python
# API for it (the package requests runs through its ingest_requests sensor instead).
CODE_LOCATION = "vision_rag_pipeline.definitions"
JOB = "ingest_document"
PARTITION_TAG = "dagster/partition"


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
