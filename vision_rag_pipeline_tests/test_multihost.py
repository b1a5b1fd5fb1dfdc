"""The Celery path across real hosts: network namespaces on one machine (hosts.py).

- service host: Postgres + pgvector, Redis (broker and results), the Elasticsearch test server;
- head: `vision-rag ingest --submit` requests the file, the `ingest_requests` sensor of a
  `dagster-daemon` (with its own code server) turns it into a run and launches it; the run's process
  orchestrates and executes no step;
- two workers (`dagster-celery worker start`), each in its own mount namespace with a private tmpfs
  over the test's temporary folders: they never see the head's files (the PDF, its Dagster home);
- a third host searches.

Asserted: the run succeeds; its steps ran on both workers and on nothing else; the third host finds
the document; compute logs captured on the workers are read from another host; a worker killed
with SIGKILL (its whole process group) in the middle of a step has that step run again by the other
worker and the run succeeds into the same index: as many chunk rows as chunks, in pgvector and
Elasticsearch alike.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import dagster as dg
import psycopg
import pytest

from vision_rag_pipeline.cli import SAMPLES
from vision_rag_pipeline.documents.registry import document_id_for
from vision_rag_pipeline_tests.hosts import ROOT, Host, Lan, ServiceHost, host_env, namespaces_unavailable

pytestmark = pytest.mark.slow

BIN = Path(sys.executable).parent
WORKERS = ("worker-a", "worker-b")
# How soon the broker hands a dead worker's step to another: above any step of these small files.
VISIBILITY_TIMEOUT_S = 20
RUN_TIMEOUT_S = 240  # generous: a loaded CI machine, not a target
PDF = SAMPLES / "larkspur_q3_2024_operations_review.pdf"
MHTML = SAMPLES / "larkspur_q3_2024_report.mhtml"


@dataclass
class Deployment:
    lan: Lan
    services: ServiceHost
    dagster_db: str
    index_db: str
    env: dict[str, str]  # what every host is given
    root: Path
    head: Host
    client: Host
    workers: dict[str, Host] = field(default_factory=dict)
    worker_processes: dict[str, object] = field(default_factory=dict)

    def dagster_sql(self, query: str, *params: object) -> list[tuple]:
        with psycopg.connect(self.services.admin_url(self.dagster_db)) as conn:
            return conn.execute(query, params).fetchall()

    def index_sql(self, query: str, *params: object) -> list[tuple]:
        with psycopg.connect(self.services.admin_url(self.index_db)) as conn:
            return conn.execute(query, params).fetchall()

    def host_env(self, name: str, base: Path) -> dict[str, str]:
        return host_env(
            self.env
            | {
                "HOME": str(base),
                "DAGSTER_HOME": str(base / "dagster"),
                "VISION_RAG_HOME": str(base / "state"),
                "TMPDIR": str(base / "tmp"),
            }
        )

    def submit(self, path: Path) -> str:
        """`vision-rag ingest --submit` on the head, then the id of the run the daemon made of it."""
        env = self.host_env("head", self.root / "head")
        done = self.head.run([str(BIN / "vision-rag"), "ingest", "--submit", str(path)], env)
        assert done.returncode == 0, done.stderr[-3000:]
        [line] = done.stdout.splitlines()
        document_id, printed_path = line.split(" ", 1)
        assert printed_path == str(path)
        deadline = time.monotonic() + RUN_TIMEOUT_S
        while time.monotonic() < deadline:
            rows = self.dagster_sql(
                "SELECT run_id FROM run_tags WHERE key = 'dagster/partition' AND value = %s", document_id
            )
            if rows:
                return rows[0][0]
            time.sleep(0.5)
        raise AssertionError(f"no run was made of {document_id}:\n{self.logs()}")

    def wait_for_run(self, run_id: str) -> str:
        deadline = time.monotonic() + RUN_TIMEOUT_S
        while time.monotonic() < deadline:
            rows = self.dagster_sql("SELECT status FROM runs WHERE run_id = %s", run_id)
            if rows and rows[0][0] in ("SUCCESS", "FAILURE", "CANCELED"):
                return rows[0][0]
            time.sleep(0.5)
        return "TIMEOUT"

    def step_workers(self, run_id: str) -> list[tuple[str, str]]:
        """(step, Celery worker) for every step a worker started, in order."""
        placed = []
        for (event,) in self.dagster_sql(
            "SELECT event FROM event_logs WHERE run_id = %s AND dagster_event_type = 'ENGINE_EVENT'"
            " AND step_key IS NOT NULL ORDER BY id",
            run_id,
        ):
            entry = dg.deserialize_value(event, dg.EventLogEntry)
            metadata = entry.dagster_event.event_specific_data.metadata
            if "Celery worker" in metadata:
                placed.append((entry.step_key, metadata["Celery worker"].value))
        return placed

    def started_steps(self, run_id: str) -> set[str]:
        rows = self.dagster_sql(
            "SELECT step_key FROM event_logs WHERE run_id = %s AND dagster_event_type = 'STEP_START'", run_id
        )
        return {step for (step,) in rows}

    def logs(self) -> str:
        return "\n".join(
            f"== {path.name}\n{path.read_text(errors='replace')[-2500:]}"
            for path in sorted(self.root.glob("*.log"))
        )


def _worker_name(host: str) -> str:
    return f"{host}@{host}"  # dagster-celery's `-n NAME` is NAME@<host name>


def _start_worker(deployment: Deployment, name: str, basetemp: Path) -> None:
    host = deployment.lan.add(name, private=[basetemp])
    base = basetemp / name  # on the worker's own tmpfs
    env = deployment.host_env(name, base)
    setup = (
        f'mkdir -p "{base}/dagster" "{base}/state" "{base}/tmp" && '
        f'cp "{ROOT / "docker/dagster.yaml"}" "{base}/dagster/" && cd "{base}" && '
        f'test ! -e "{deployment.root}/head" || {{ echo "the head\'s files are visible"; exit 3; }}'
    )
    deployment.workers[name] = host
    deployment.worker_processes[name] = host.start(
        [str(BIN / "dagster-celery"), "worker", "start", "-n", name, "-A", "vision_rag_pipeline.defs.celery_worker",
         "--loglevel", "INFO", "--", "--concurrency", "1"],
        env, deployment.root / f"{name}.log", setup=setup,
    )  # fmt: skip


def _wait_for_workers(deployment: Deployment) -> None:
    deadline = time.monotonic() + 120
    for name in deployment.workers:
        log = deployment.root / f"{name}.log"
        while f"{_worker_name(name)} ready." not in log.read_text(errors="replace"):
            assert deployment.worker_processes[name].poll() is None, deployment.logs()
            assert time.monotonic() < deadline, deployment.logs()
            time.sleep(0.2)


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    reason = namespaces_unavailable()
    if reason:
        pytest.skip(f"no separate hosts here: {reason}")
    basetemp = tmp_path_factory.getbasetemp()
    root = tmp_path_factory.mktemp("multihost")
    lan = Lan()
    try:
        services = ServiceHost(lan.add("services"), root / "services")
        tag = uuid.uuid4().hex[:8]
        dagster_db, index_db = f"dagster_{tag}", f"index_{tag}"
        services.create_database(dagster_db)
        services.create_database(index_db)
        env = services.shared_env(dagster_db, index_db) | {
            "VISION_RAG_ES_INDEX": f"multihost-{tag}",
            "VISION_RAG_EXECUTOR": "celery",
            "VISION_RAG_CELERY_BROKER_URL": services.redis_url,
            "VISION_RAG_CELERY_VISIBILITY_TIMEOUT_SECONDS": str(VISIBILITY_TIMEOUT_S),
            "VISION_RAG_SENSOR_INTERVAL_SECONDS": "3",  # the sensors tick on the head
        }
        deployment = Deployment(
            lan, services, dagster_db, index_db, env, root, head=lan.add("head"), client=lan.add("client")
        )
        head_home = root / "head"
        (head_home / "dagster").mkdir(parents=True)
        shutil.copy(ROOT / "docker/dagster.yaml", head_home / "dagster")
        # The Dagster schema first, once, as docker-compose.yml's `dagster_schema` does: processes
        # that each create it on a fresh database race (`type "runs" already exists`).
        migrated = deployment.head.run(
            [str(BIN / "dagster"), "instance", "migrate"], deployment.host_env("head", head_home)
        )
        assert migrated.returncode == 0, migrated.stderr[-3000:]
        for name in WORKERS:
            _start_worker(deployment, name, basetemp)
        deployment.head.start(
            [str(BIN / "dagster-daemon"), "run", "-m", "vision_rag_pipeline.definitions"],
            deployment.host_env("head", head_home), root / "daemon.log", setup=f'cd "{head_home}"',
        )  # fmt: skip
        _wait_for_workers(deployment)
        yield deployment
    finally:
        lan.close()


@pytest.fixture(scope="module")
def first_run(deployment: Deployment) -> str:
    """The PDF, copied onto the head only, submitted there."""
    pdf = Path(shutil.copy(PDF, deployment.root / "head" / PDF.name))
    run_id = deployment.submit(pdf)
    status = deployment.wait_for_run(run_id)
    assert status == "SUCCESS", deployment.logs()
    return run_id


def test_the_run_succeeds_with_its_steps_on_both_workers_and_none_on_the_head(
    deployment: Deployment, first_run: str
) -> None:
    placed = dict(deployment.step_workers(first_run))
    assert set(placed) == deployment.started_steps(first_run), "every step ran as a Celery task"
    assert len(placed) == 8
    assert set(placed.values()) == {_worker_name(name) for name in WORKERS}, placed


def test_a_third_host_finds_the_document(deployment: Deployment, first_run: str) -> None:
    env = deployment.host_env("client", deployment.root / "client")
    found = deployment.client.run(
        [str(BIN / "vision-rag"), "search", "Larkspur operations review", "--json", "-k", "10"], env
    )
    assert found.returncode == 0, found.stderr[-3000:]
    hits = json.loads(found.stdout)
    assert str(deployment.root / "head" / PDF.name) in {hit["document"] for hit in hits}, hits


_READ_COMPUTE_LOGS = """
import json, sys, dagster as dg
from dagster._core.storage.compute_log_manager import ComputeIOType
instance = dg.DagsterInstance.get()
manager = instance.compute_log_manager
read = {}
for record in instance.get_records_for_run(sys.argv[1], of_type=dg.DagsterEventType.LOGS_CAPTURED).records:
    data = record.event_log_entry.dagster_event.logs_captured_data
    key = [sys.argv[1], "compute_logs", data.file_key]
    text, _ = manager.get_log_data_for_type(key, ComputeIOType.STDERR, 0, None)
    read[",".join(data.step_keys)] = None if text is None else len(text)
print(json.dumps({"manager": type(manager).__name__, "read": read}))
"""


def test_compute_logs_captured_on_the_workers_are_read_on_another_host(
    deployment: Deployment, first_run: str
) -> None:
    env = deployment.host_env("client", deployment.root / "client")
    (deployment.root / "client" / "dagster").mkdir(parents=True, exist_ok=True)
    shutil.copy(ROOT / "docker/dagster.yaml", deployment.root / "client" / "dagster")
    done = deployment.client.run([sys.executable, "-c", _READ_COMPUTE_LOGS, first_run], env)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.splitlines()[-1])
    assert report["manager"] == "PostgresComputeLogManager"
    assert len(report["read"]) == 8 and all(size is not None for size in report["read"].values()), report


def test_a_worker_killed_mid_step_leaves_the_run_to_the_other_and_the_index_whole(
    deployment: Deployment, first_run: str
) -> None:
    mhtml = Path(shutil.copy(MHTML, deployment.root / "head" / MHTML.name))
    run_id = deployment.submit(mhtml)
    killed, deadline = None, time.monotonic() + RUN_TIMEOUT_S
    while killed is None and time.monotonic() < deadline:
        for step, worker in deployment.step_workers(run_id):
            if step == "chunk_embeddings":  # the slowest step: the model loads and encodes
                killed = worker.split("@")[0]
                os.killpg(deployment.worker_processes[killed].pid, signal.SIGKILL)
                break
        time.sleep(0.05)
    assert killed, deployment.logs()
    finished = deployment.dagster_sql(
        "SELECT 1 FROM event_logs WHERE run_id = %s AND step_key = 'chunk_embeddings'"
        " AND dagster_event_type = 'STEP_SUCCESS'",
        run_id,
    )
    assert not finished, "the worker was killed after its step, not during it"
    assert deployment.wait_for_run(run_id) == "SUCCESS", deployment.logs()

    placed = deployment.step_workers(run_id)
    survivor = _worker_name(next(name for name in WORKERS if name != killed))
    # The broker handed the step over (after the visibility timeout) and the survivor did the rest.
    handed_over = placed.index(("chunk_embeddings", survivor))
    assert placed[handed_over:] and all(worker == survivor for _, worker in placed[handed_over:]), placed

    document = document_id_for(str(mhtml))
    [(rows, distinct, top)] = deployment.index_sql(
        "SELECT count(*), count(DISTINCT chunk_index), max(chunk_index) FROM chunks WHERE document_id = %s",
        document,
    )
    assert rows == distinct == top + 1 > 0, "one row per chunk, none twice"
    env = deployment.host_env("client", deployment.root / "client")
    counted = deployment.client.run(
        [sys.executable, "-c",
         "import sys; from vision_rag_pipeline.indexes.lexical_backend import open_lexical_index; "
         "print(open_lexical_index().count(sys.argv[1]))", document],
        env,
    )  # fmt: skip
    assert counted.returncode == 0, counted.stderr[-3000:]
    assert int(counted.stdout.split()[-1]) == rows, "Elasticsearch holds the same chunks once each"
