"""What a Dagster user meets first, run as they would: `dagster definitions validate` and `dagster dev`
in a fresh clone with nothing exported, one code location name however Dagster is started, and
`vision-rag db status|stop` for the embedded Postgres every command leaves running.

Each command runs as a subprocess with a minimal environment (PATH, HOME, PYTHONPATH): no
DAGSTER_HOME, no VISION_RAG_HOME, no DAGSTER_PG_* variables.
"""

from __future__ import annotations

import json
import shutil
import signal
import socket
import subprocess
import sys
import time
import tomllib
import urllib.request
from pathlib import Path

import psycopg
import pytest
import yaml
from dagster._core.workspace.load import location_origin_from_module_name

from vision_rag_pipeline.defs.runner import LOCAL_INSTANCE_BODY

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
MODULE = "vision_rag_pipeline.definitions"
CLONE_FILES = ("dagster.yaml", "workspace.yaml", "pyproject.toml")


def bare_env(home: Path, **extra: str) -> dict[str, str]:
    """A shell with nothing exported but the code on the path and its own HOME."""
    return {"PATH": f"{BIN}:/usr/bin:/bin", "HOME": str(home), "PYTHONPATH": str(ROOT), **extra}


@pytest.fixture
def clone(tmp_path: Path) -> Path:
    """The repo root's files in a fresh folder (the package comes from PYTHONPATH)."""
    folder = tmp_path / "clone"
    folder.mkdir()
    for name in CLONE_FILES:
        shutil.copy(ROOT / name, folder / name)
    (tmp_path / "home").mkdir()
    return folder


def stop_embedded_postgres(env: dict[str, str]) -> None:
    """Whatever a command started stays up (by design): stop it the documented way."""
    subprocess.run([str(BIN / "vision-rag"), "db", "stop"], env=env, capture_output=True, timeout=120)


def test_one_code_location_name_however_dagster_is_started() -> None:
    by_module = location_origin_from_module_name(MODULE, None, None).location_name
    [local] = yaml.safe_load((ROOT / "workspace.yaml").read_text())["load_from"]
    [docker] = yaml.safe_load((ROOT / "workspace-docker.yaml").read_text())["load_from"]
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]["user_code"]["command"]
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["dagster"]
    assert by_module == MODULE
    assert local["python_module"]["location_name"] == by_module
    assert docker["grpc_server"]["location_name"] == by_module
    assert compose[compose.index("--location-name") + 1] == by_module
    assert pyproject == {"module_name": MODULE, "code_location_name": by_module}


def test_the_root_dagster_yaml_is_the_instance_vision_rag_writes() -> None:
    assert yaml.safe_load((ROOT / "dagster.yaml").read_text()) == yaml.safe_load(LOCAL_INSTANCE_BODY)
    assert "DAGSTER_PG" not in (ROOT / "dagster.yaml").read_text()


def test_definitions_validate_in_a_fresh_clone_with_nothing_exported(clone: Path) -> None:
    checked = subprocess.run(
        [str(BIN / "dagster"), "definitions", "validate"],
        cwd=clone,
        env=bare_env(clone.parent / "home"),
        capture_output=True,
        text=True,
        timeout=300,
    )
    output = checked.stdout + checked.stderr
    assert checked.returncode == 0, output[-3000:]
    assert f"Validation successful for code location {MODULE}" in output
    assert "Traceback" not in output


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _graphql(url: str, query: str) -> dict:
    request = urllib.request.Request(
        f"{url}/graphql",
        data=json.dumps({"query": query}).encode(),
        headers={"content-type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.load(response)["data"]


@pytest.mark.slow
def test_dagster_dev_in_a_fresh_clone_keeps_its_history_where_vision_rag_does(clone: Path) -> None:
    home = clone.parent / "home"
    env = bare_env(home)
    port = _free_port()
    process = subprocess.Popen(
        [str(BIN / "dagster"), "dev", "-h", "127.0.0.1", "-p", str(port)],
        cwd=clone,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        # Started from a script, dagster dev ignores SIGTERM unless SIGINT is back to its default.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    url = f"http://127.0.0.1:{port}"
    query = (
        "{ workspaceOrError { ... on Workspace { locationEntries { name loadStatus } } } instance { info } }"
    )
    try:
        deadline = time.monotonic() + 180
        while True:
            assert process.poll() is None, f"dagster dev exited: {process.stderr.read()[-3000:]}"
            try:
                data = _graphql(url, query)
                if data["workspaceOrError"]["locationEntries"][0]["loadStatus"] == "LOADED":
                    break
            except OSError:
                pass
            assert time.monotonic() < deadline, "dagster dev did not load the code location"
            time.sleep(1)
        assert data["workspaceOrError"]["locationEntries"][0]["name"] == MODULE
        info = yaml.safe_load(data["instance"]["info"])
        assert info["run_storage"]["class"] == "LocalRunStorage"
        assert info["nux"] == {"enabled": False}
        # Runs and sensor state land in ~/.vision_rag/dagster, not in the temporary home.
        assert (home / ".vision_rag" / "dagster" / "history" / "runs.db").exists()
        assert (home / ".vision_rag" / "dagster" / "schedules" / "schedules.db").exists()
    finally:
        process.send_signal(signal.SIGINT)
        try:
            stderr = process.communicate(timeout=60)[1]
        except subprocess.TimeoutExpired:
            process.kill()
            stderr = process.communicate()[1]
        stop_embedded_postgres(env)
    assert "DAGSTER_PG" not in stderr
    assert "Traceback" not in stderr, stderr[-3000:]


def test_db_status_and_stop_manage_the_embedded_postgres(tmp_path: Path) -> None:
    env = bare_env(tmp_path, VISION_RAG_HOME=str(tmp_path / "state"))

    def vision_rag(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [str(BIN / "vision-rag"), *args], env=env, capture_output=True, text=True, timeout=120
        )

    assert vision_rag("db", "status").returncode == 3  # nothing started it yet
    started = subprocess.run(
        [
            sys.executable,
            "-c",
            "from vision_rag_pipeline.core.postgres import database_url; print(database_url())",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    try:
        status = vision_rag("db", "status")
        assert status.returncode == 0, status.stderr
        assert started.stdout.strip() in status.stdout  # the URL to connect with
        with psycopg.connect(started.stdout.strip()) as conn:  # outlived the process that started it
            assert conn.execute("SELECT 1").fetchone() == (1,)
        stop = vision_rag("db", "stop")
        assert stop.returncode == 0 and "stopped" in stop.stdout
        assert vision_rag("db", "status").returncode == 3
        with pytest.raises(psycopg.OperationalError):
            psycopg.connect(started.stdout.strip(), connect_timeout=5)
    finally:
        stop_embedded_postgres(env)


def test_a_first_ingest_that_fails_at_once_leaves_a_working_home(tmp_path: Path) -> None:
    """ingest starts the embedded Postgres on a thread while it imports, and waits for it whatever
    happens next: a first command that fails before using it (a config file that does not parse)
    leaves a home whose database is up and whose next ingest works."""
    env = bare_env(tmp_path, VISION_RAG_HOME=str(tmp_path / "state"))

    def vision_rag(*args: str, **extra: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [str(BIN / "vision-rag"), *args],
            env={**env, **extra},
            capture_output=True,
            text=True,
            timeout=300,
        )

    broken = tmp_path / "rag.yaml"
    broken.write_text("splitter: [unclosed\n")
    try:
        failed = vision_rag("ingest", str(tmp_path / "any.pdf"), VISION_RAG_CONFIG=str(broken))
        assert failed.returncode == 2 and "rag.yaml" in failed.stderr, failed.stderr
        assert vision_rag("db", "status").returncode == 0, "the new home's database is up"
        sample = ROOT / "vision_rag_pipeline" / "samples" / "larkspur_q3_2024_report.mhtml"
        ingested = vision_rag("ingest", str(sample), "--json")
        assert ingested.returncode == 0, ingested.stderr
        assert json.loads(ingested.stdout)["chunks"] > 0
    finally:
        stop_embedded_postgres(env)


def test_db_commands_leave_an_external_postgres_alone(tmp_path: Path) -> None:
    env = bare_env(tmp_path, VISION_RAG_PG_URL="postgresql://user@db.example:5432/index")
    status = subprocess.run(
        [str(BIN / "vision-rag"), "db", "stop"], env=env, capture_output=True, text=True, timeout=120
    )
    assert status.returncode == 0 and "does not manage" in status.stdout
    assert not (tmp_path / ".vision_rag" / "pgdata").exists()


def test_loading_the_code_location_shows_no_warning_about_our_definitions() -> None:
    """What `dagster dev`, the daemon and every run print on loading the code: Dagster's preview and
    beta notices about our own definitions are silenced where they arise, by message, and nothing
    else of ours warns (every warning shown, not only the first of each place)."""
    code = (
        "from vision_rag_pipeline.definitions import defs\n"
        "defs.get_repository_def()\n"
        "defs.resolve_job_def('ingest_document')\n"
    )
    done = subprocess.run(
        [sys.executable, "-W", "always", "-c", code], cwd="/", capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    ours = [
        line
        for line in done.stderr.splitlines()
        if "vision_rag_pipeline" in line or "BetaWarning" in line or "PreviewWarning" in line
    ]
    assert ours == []
