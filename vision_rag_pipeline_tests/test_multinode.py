"""Two nodes that share only Postgres (and Elasticsearch) run each other's partitions.

Each node is its own set of processes with its own DAGSTER_HOME and VISION_RAG_HOME (its local
disk), opening the production instance (docker/dagster.yaml) on one shared Dagster database, the
index in one shared database, and the lexical index in one Elasticsearch (the noida-db emulator).
Each ingests a file, the files are deleted, then each re-enriches the other's partition and one
re-reads the other's raw document: everything a run needs must come from the shared stores.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from vision_rag_pipeline.cli import SAMPLES
from vision_rag_pipeline.core.config import MULTI_NODE_ENV, ConfigError
from vision_rag_pipeline.documents.registry import document_id_for
from vision_rag_pipeline.indexes.lexical_backend import open_lexical_index
from vision_rag_pipeline_tests.es_server import EmulatorUnavailable, noida_elasticsearch
from vision_rag_pipeline_tests.test_deploy_config import PRODUCTION_YAML, ROOT, production_instance_env

BIN = Path(sys.executable).parent


def test_tantivy_is_refused_when_the_deployment_is_multi_node(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("VISION_RAG_ES_URL", raising=False)
    monkeypatch.setenv(MULTI_NODE_ENV, "1")
    with pytest.raises(ConfigError, match="VISION_RAG_ES_URL") as refused:
        open_lexical_index()
    assert "tantivy" in str(refused.value)
    monkeypatch.setenv(MULTI_NODE_ENV, "0")
    assert type(open_lexical_index()).__name__ == "TantivyLexicalIndex"


@pytest.fixture
def es_url(tmp_path: Path) -> Iterator[str]:
    try:
        with noida_elasticsearch(tmp_path / "noida") as url:
            yield url
    except EmulatorUnavailable as exc:
        pytest.skip(f"no Elasticsearch emulator: {exc}")


@pytest.fixture
def dagster_database(pg_url: str) -> Iterator[str]:
    name = f"dagster_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(pg_url, autocommit=True) as admin:
        admin.execute(f"CREATE DATABASE {name}")
    yield name
    with psycopg.connect(pg_url, autocommit=True) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


class Node:
    """One machine: its own disk (homes), the shared services from the environment."""

    def __init__(self, root: Path, shared_env: dict[str, str]) -> None:
        self.root = root
        dagster_home = root / "dagster"
        dagster_home.mkdir(parents=True)
        shutil.copy(ROOT / PRODUCTION_YAML, dagster_home / "dagster.yaml")
        self.env = (
            os.environ
            | shared_env
            | {
                "DAGSTER_HOME": str(dagster_home),
                "VISION_RAG_HOME": str(root / "state"),
                "PYTHONPATH": str(ROOT),
            }
        )

    def start(self, *command: str) -> subprocess.Popen:
        return subprocess.Popen(
            command, env=self.env, cwd=self.root, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )


def finished(process: subprocess.Popen) -> str:
    stdout, stderr = process.communicate(timeout=900)
    assert process.returncode == 0, f"{' '.join(process.args)}: {stderr[-3000:]}"
    return stdout


@pytest.mark.slow
def test_two_nodes_sharing_only_postgres_re_enrich_each_others_partitions(
    tmp_path: Path, pg_url: str, fresh_database: str, dagster_database: str, es_url: str
) -> None:
    shared = production_instance_env(pg_url, dagster_database) | {
        "VISION_RAG_PG_URL": fresh_database,
        "VISION_RAG_ES_URL": es_url,
        "VISION_RAG_ES_INDEX": f"multinode-{uuid.uuid4().hex[:8]}",
        MULTI_NODE_ENV: "1",
    }
    nodes = [Node(tmp_path / name, shared) for name in ("node_a", "node_b")]
    files = []
    samples = sorted(path for path in SAMPLES.iterdir() if path.suffix in (".mhtml", ".pdf"))
    for node, sample in zip(nodes, samples, strict=True):
        (node.root / "inbox").mkdir()
        files.append(str(shutil.copy(sample, node.root / "inbox" / sample.name)))
    document_ids = [document_id_for(path) for path in files]

    ingests = [
        node.start(str(BIN / "vision-rag"), "ingest", path, "--json")
        for node, path in zip(nodes, files, strict=True)
    ]
    for process in ingests:
        assert json.loads(finished(process))["documents"] == 1
    for node in nodes:  # the originals are gone: only the copies registered in Postgres remain
        shutil.rmtree(node.root / "inbox")

    # Each node re-enriches the other's partition (ingested on a disk it never saw), both at once.
    backfills = [
        node.start(str(BIN / "vision-rag"), "backfill", "--partitions", other_id, "--json")
        for node, other_id in zip(nodes, reversed(document_ids), strict=True)
    ]
    for process, other_id in zip(backfills, reversed(document_ids), strict=True):
        [entry] = json.loads(finished(process))
        assert entry["partition"] == other_id and entry["success"] and entry["chunks"] > 0

    # The first asset too: node B reads node A's document from the bytes stored at registration.
    materialize = nodes[1].start(
        str(BIN / "dagster"), "asset", "materialize", "-m", "vision_rag_pipeline.definitions",
        "--select", "raw_documents", "--partition", document_ids[0],
    )  # fmt: skip
    finished(materialize)

    search = nodes[0].start(
        str(BIN / "vision-rag"), "search", "Larkspur", "--mode", "lexical", "-k", "50", "--json"
    )
    found = {hit["document"] for hit in json.loads(finished(search))}
    assert set(files) <= found, "node A's lexical search sees both nodes' documents"

    with psycopg.connect(fresh_database) as conn:
        chunks = dict(conn.execute("SELECT document_id, count(*) FROM chunks GROUP BY 1").fetchall())
        values = conn.execute("SELECT count(*) FROM asset_values").fetchone()[0]
    assert set(chunks) == set(document_ids) and values > 0
    # Nothing a run needs was left on a node's disk: no file there is named after a partition.
    for node in nodes:
        assert not [path for path in node.root.rglob("*") if path.name in document_ids]


def _multi_node_env(home: Path, **stores: str) -> dict[str, str]:
    env = {
        name: value
        for name, value in os.environ.items()
        if name not in ("VISION_RAG_PG_URL", "VISION_RAG_ES_URL")
    }
    return env | {
        MULTI_NODE_ENV: "1",
        "VISION_RAG_HOME": str(home),
        "DAGSTER_HOME": str(home / "dagster"),
        "HOME": str(home),
        "PYTHONPATH": str(ROOT),
        **stores,
    }


@pytest.mark.parametrize(
    ("stores", "missing"),
    [
        ({}, "VISION_RAG_PG_URL and VISION_RAG_ES_URL are not"),
        ({"VISION_RAG_ES_URL": "http://es.invalid:9200"}, "VISION_RAG_PG_URL is not"),
        ({"VISION_RAG_PG_URL": "postgresql://pg.invalid/db"}, "VISION_RAG_ES_URL is not"),
    ],
)
def test_every_process_of_a_multi_node_deployment_refuses_to_start_without_the_shared_stores(
    tmp_path: Path, stores: dict[str, str], missing: str
) -> None:
    pdf = SAMPLES / "larkspur_q3_2024_operations_review.pdf"
    processes = {
        "cli": [str(BIN / "vision-rag"), "ingest", str(pdf)],
        "api": [sys.executable, "-c", "from vision_rag_pipeline.api import create_app; create_app()"],
        "code location": [sys.executable, "-c", "import vision_rag_pipeline.definitions"],
        "worker": [str(BIN / "celery"), "-A", "vision_rag_pipeline.defs.celery_worker", "worker"],
    }
    for name, command in processes.items():
        home = tmp_path / name.replace(" ", "_")
        home.mkdir()
        env = _multi_node_env(home, **stores) | {
            "VISION_RAG_EXECUTOR": "celery",
            "VISION_RAG_CELERY_BROKER_URL": "redis://broker.invalid:6379/0",
        }
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode != 0, name
        assert missing in done.stderr, f"{name}: {done.stderr[-2000:]}"
        assert sorted(p.name for p in home.iterdir()) == [], f"{name} created {list(home.iterdir())}"
    cli_lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert cli_lines, "the worker said why"


def test_the_cli_refuses_in_one_line(tmp_path: Path) -> None:
    done = subprocess.run(
        [str(BIN / "vision-rag"), "search", "revenue"],
        env=_multi_node_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        "vision-rag: VISION_RAG_MULTI_NODE is set but VISION_RAG_PG_URL and VISION_RAG_ES_URL are not: "
        "every host must use the same Postgres and Elasticsearch; refusing to start"
    ]
    assert list(tmp_path.iterdir()) == []


def test_ingest_submit_requests_the_files_for_the_daemon_of_a_shared_instance(
    tmp_path: Path, pg_url: str, fresh_database: str, dagster_database: str
) -> None:
    """`ingest --submit` on one node of a Postgres-backed deployment: every file's bytes and its
    request are in the shared registry and its partition in the shared instance, for the daemon's
    ingest_requests sensor on whichever host (no daemon serves here)."""
    node = Node(
        tmp_path / "node",
        production_instance_env(pg_url, dagster_database) | {"VISION_RAG_PG_URL": fresh_database},
    )
    files = sorted(str(path) for path in SAMPLES.iterdir() if path.suffix in (".mhtml", ".pdf"))
    process = node.start(str(BIN / "vision-rag"), "ingest", "--submit", *files, "--json")
    arrivals = json.loads(finished(process))
    assert {arrival["path"]: arrival["outcome"] for arrival in arrivals} == dict.fromkeys(files, "requested")

    instance_env = production_instance_env(pg_url, dagster_database)
    probe = subprocess.run(
        [sys.executable, "-c", _PARTITIONS_PROBE],
        env={**node.env, **instance_env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert probe.returncode == 0, probe.stderr[-3000:]
    assert set(json.loads(probe.stdout.splitlines()[-1])) == {document_id_for(path) for path in files}
    with psycopg.connect(fresh_database) as conn:  # the bytes are in the registry, for any host
        stored = {
            document_id: (size, state, door)
            for document_id, size, state, door in conn.execute(
                "SELECT document_id, length(content), state, door FROM documents"
            ).fetchall()
        }
    assert stored == {
        document_id_for(path): (Path(path).stat().st_size, "requested", "cli") for path in files
    }


_PARTITIONS_PROBE = """
import json, dagster as dg
print(json.dumps(list(dg.DagsterInstance.get().get_dynamic_partitions("documents"))))
"""
