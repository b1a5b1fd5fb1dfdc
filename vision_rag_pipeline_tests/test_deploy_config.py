"""The production stack's files agree with each other and with Dagster, without a Docker engine:
docker-compose.yml, Dockerfile, .dockerignore, docker/dagster.yaml, workspace.yaml and workspace-docker.yaml.

docker/dagster.yaml is checked twice: by Dagster's own instance config schema, and by opening a real
Postgres-backed instance from it (on the embedded Postgres) and running a job through it.
"""

from __future__ import annotations

import fnmatch
import importlib
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import dagster as dg
import psycopg
import pytest
import yaml
from dagster._core.instance.config import dagster_instance_config

ROOT = Path(__file__).resolve().parents[1]
PRODUCTION_YAML = "docker/dagster.yaml"
DAGSTER_SERVICES = ("user_code", "webserver", "daemon", "worker")
SERVICE_PORTS = {"postgres": 5432, "elasticsearch": 9200, "redis": 6379}
_INTERPOLATION = re.compile(r"\$\{(?P<name>\w+)(?::?-(?P<default>[^}]*))?\}")


def _load(name: str) -> Any:
    return yaml.safe_load((ROOT / name).read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def services() -> dict[str, dict[str, Any]]:
    return _load("docker-compose.yml")["services"]


@pytest.fixture(scope="module")
def dockerfile() -> str:
    """The Dockerfile with continuation lines joined, one instruction per line."""
    return (ROOT / "Dockerfile").read_text(encoding="utf-8").replace("\\\n", " ")


def compose_value(value: Any) -> str:
    """What compose hands the container when the user's shell sets none of the variables."""
    return _INTERPOLATION.sub(lambda m: m["default"] or "", str(value)).replace("$$", "$")


def environment(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return {name: compose_value(value) for name, value in env.items()}


def command(service: dict[str, Any]) -> list[str]:
    cmd = service["command"]
    return cmd.split() if isinstance(cmd, str) else [str(part) for part in cmd]


def option(cmd: list[str], *flags: str) -> str:
    for flag in flags:
        if flag in cmd:
            return cmd[cmd.index(flag) + 1]
    raise AssertionError(f"{' '.join(cmd)!r} has none of {flags}")


def env_vars_read(config: Any) -> set[str]:
    """Every `{env: NAME}` in a Dagster config document."""
    if isinstance(config, dict):
        if set(config) == {"env"}:
            return {config["env"]}
        return set().union(*(env_vars_read(v) for v in config.values()))
    if isinstance(config, list):
        return set().union(*(env_vars_read(v) for v in config))
    return set()


def test_the_stack_has_its_five_services_on_the_intended_images(services: dict[str, Any]) -> None:
    assert {"postgres", "elasticsearch", *DAGSTER_SERVICES} <= set(services)
    assert services["postgres"]["image"] == "pgvector/pgvector:pg17"
    assert services["elasticsearch"]["image"].startswith("docker.elastic.co/elasticsearch/elasticsearch:8.")
    images = {services[name]["image"] for name in DAGSTER_SERVICES}
    assert len(images) == 1, f"user code, webserver and daemon must run one image, got {images}"
    assert all(services[name]["build"] == "." for name in DAGSTER_SERVICES)


def test_every_dependency_exists_has_a_healthcheck_and_is_waited_on(services: dict[str, Any]) -> None:
    for name, service in services.items():
        for dependency, condition in (service.get("depends_on") or {}).items():
            assert dependency in services, f"{name} depends on unknown service {dependency}"
            if dependency == "dagster_schema":  # a one-shot job: it finishes, it is never healthy
                assert condition == {"condition": "service_completed_successfully"}, f"{name} -> {dependency}"
                continue
            assert condition == {"condition": "service_healthy"}, f"{name} -> {dependency}"
            assert "healthcheck" in services[dependency], f"{dependency} has no healthcheck"
    for name in DAGSTER_SERVICES:
        assert "postgres" in services[name]["depends_on"], f"{name} opens the instance in Postgres"
    for name in ("webserver", "daemon"):
        assert "user_code" in services[name]["depends_on"], f"{name} loads the code location"
    assert "elasticsearch" in services["user_code"]["depends_on"]


def test_dagsters_schema_is_created_once_before_any_process_opens_the_instance(
    services: dict[str, Any],
) -> None:
    """Processes that each create the schema on an empty database at once fail with `type "runs"
    already exists`: one job creates (or migrates) it, and everything else waits for it."""
    assert command(services["dagster_schema"]) == ["dagster", "instance", "migrate"]
    assert services["dagster_schema"]["restart"] == "no"
    assert "postgres" in services["dagster_schema"]["depends_on"]
    opening = [
        name for name, service in services.items()
        if "DAGSTER_HOME" in environment(service) and name != "dagster_schema"
    ]  # fmt: skip
    assert set(DAGSTER_SERVICES) <= set(opening)
    for name in opening:
        assert "dagster_schema" in services[name]["depends_on"], f"{name} may race to create the schema"


def test_urls_and_hosts_in_the_environment_name_services_and_their_ports(services: dict[str, Any]) -> None:
    env = environment(services["user_code"])
    pg, es = urlsplit(env["VISION_RAG_PG_URL"]), urlsplit(env["VISION_RAG_ES_URL"])
    assert pg.scheme == "postgresql"
    assert (pg.hostname, pg.port) == ("postgres", SERVICE_PORTS["postgres"])
    assert (es.scheme, es.hostname, es.port) == ("http", "elasticsearch", SERVICE_PORTS["elasticsearch"])
    for name in DAGSTER_SERVICES:
        dagster_env = environment(services[name])
        assert dagster_env["DAGSTER_PG_HOST"] in services
        assert int(dagster_env["DAGSTER_PG_PORT"]) == SERVICE_PORTS[dagster_env["DAGSTER_PG_HOST"]]


def test_postgres_credentials_and_databases_match_the_server(services: dict[str, Any]) -> None:
    server = environment(services["postgres"])
    init_scripts = "".join(
        path.read_text(encoding="utf-8")
        for volume in services["postgres"]["volumes"]
        if volume.endswith(":/docker-entrypoint-initdb.d:ro")
        for path in sorted((ROOT / volume.split(":")[0]).glob("*.sql"))
    )
    created = {server["POSTGRES_DB"], *re.findall(r"CREATE DATABASE (\w+)", init_scripts)}
    index_url = urlsplit(environment(services["user_code"])["VISION_RAG_PG_URL"])
    assert (index_url.username, index_url.password) == (server["POSTGRES_USER"], server["POSTGRES_PASSWORD"])
    assert index_url.path.lstrip("/") in created
    for name in DAGSTER_SERVICES:
        dagster_env = environment(services[name])
        assert dagster_env["DAGSTER_PG_USERNAME"] == server["POSTGRES_USER"]
        assert dagster_env["DAGSTER_PG_PASSWORD"] == server["POSTGRES_PASSWORD"]
        assert dagster_env["DAGSTER_PG_DB"] in created
    assert index_url.path.lstrip("/") != environment(services["daemon"])["DAGSTER_PG_DB"]


def test_every_variable_dagster_yaml_reads_is_set_for_every_dagster_process(
    services: dict[str, Any], dockerfile: str
) -> None:
    needed = env_vars_read(_load(PRODUCTION_YAML))
    assert {"DAGSTER_PG_HOST", "DAGSTER_PG_PASSWORD"} <= needed
    home = re.search(r"DAGSTER_HOME=(\S+)", dockerfile)
    assert home, "the Dockerfile sets DAGSTER_HOME"
    assert re.search(rf"^COPY {PRODUCTION_YAML} \$\{{?DAGSTER_HOME\}}?/dagster.yaml$", dockerfile, re.M)
    for name in DAGSTER_SERVICES:
        env = environment(services[name])
        assert needed <= set(env), f"{name} lacks {sorted(needed - set(env))}"
        assert env["DAGSTER_HOME"] == home[1], f"{name} would not find the image's dagster.yaml"


def test_secrets_pass_through_from_the_users_shell_empty_by_default(
    services: dict[str, Any],
) -> None:
    raw = services["user_code"]["environment"]
    for name in ("OPENAI_API_KEY", "VISION_RAG_ES_API_KEY", "VISION_RAG_ES_PASSWORD"):
        assert raw[name] == f"${{{name}:-}}"


def test_the_code_location_is_the_same_module_locally_and_in_docker(services: dict[str, Any]) -> None:
    [local] = _load("workspace.yaml")["load_from"]
    [docker] = _load("workspace-docker.yaml")["load_from"]
    module = local["python_module"]["module_name"]
    assert module == "vision_rag_pipeline.definitions"
    assert isinstance(importlib.import_module(module).defs, dg.Definitions)

    server = docker["grpc_server"]
    code_server = command(services["user_code"])
    assert code_server[:3] == ["dagster", "code-server", "start"]
    assert option(code_server, "-m", "--module-name") == module
    assert option(code_server, "--location-name") == server["location_name"]
    assert server["location_name"] == local["python_module"]["location_name"]
    assert server["host"] == "user_code"
    assert int(option(code_server, "-p", "--port")) == server["port"] == 4000
    assert option(code_server, "-h", "--host") == "0.0.0.0"
    healthcheck = services["user_code"]["healthcheck"]["test"]
    assert "grpc-health-check" in healthcheck and int(option(healthcheck, "-p")) == 4000


def test_webserver_and_daemon_load_the_docker_workspace_and_the_ui_is_on_3000(
    services: dict[str, Any], dockerfile: str
) -> None:
    webserver, daemon = command(services["webserver"]), command(services["daemon"])
    assert webserver[0] == "dagster-webserver" and daemon[:2] == ["dagster-daemon", "run"]
    for cmd in (webserver, daemon):
        assert option(cmd, "-w", "--workspace") == "workspace-docker.yaml"
    assert re.search(r"^COPY workspace-docker.yaml \./?$", dockerfile, re.M)
    assert option(webserver, "-h", "--host") == "0.0.0.0"
    port = int(option(webserver, "-p", "--port"))
    assert port == 3000
    published = [compose_value(p) for p in services["webserver"]["ports"]]
    assert f"3000:{port}" in published


def test_the_inbox_is_a_volume_and_compute_logs_need_none(services: dict[str, Any]) -> None:
    home = environment(services["user_code"])["VISION_RAG_HOME"]
    user_code_mounts = {compose_value(v).split(":")[1] for v in services["user_code"]["volumes"]}
    assert {home, f"{home}/inbox"} <= user_code_mounts
    # Step output goes to the Dagster database, which every container (and host) reaches: no
    # service shares the Dagster home's storage through a volume.
    compute_logs = _load(PRODUCTION_YAML)["compute_logs"]
    assert (compute_logs["module"], compute_logs["class"]) == (
        "vision_rag_pipeline.defs.compute_logs",
        "PostgresComputeLogManager",
    )
    assert (
        compute_logs["config"]["postgres_db"] == _load(PRODUCTION_YAML)["storage"]["postgres"]["postgres_db"]
    )
    dagster_home = environment(services["webserver"])["DAGSTER_HOME"]
    for name in DAGSTER_SERVICES:
        assert not any(dagster_home in v for v in services[name].get("volumes", [])), name


def test_the_celery_worker_scales_and_sees_what_the_code_server_sees(services: dict[str, Any]) -> None:
    worker, user_code = services["worker"], services["user_code"]
    assert command(worker)[:3] == ["dagster-celery", "worker", "start"]
    assert option(command(worker), "-A", "--app") == "vision_rag_pipeline.defs.celery_worker"
    assert not {"container_name", "ports", "hostname"} & set(worker), "--scale needs anonymous replicas"
    assert environment(worker) == environment(user_code), "one environment for the run and its steps"
    broker = urlsplit(environment(worker)["VISION_RAG_CELERY_BROKER_URL"])
    assert (broker.scheme, broker.hostname, broker.port) == ("redis", "redis", SERVICE_PORTS["redis"])
    assert worker["profiles"] == services["redis"]["profiles"] == ["celery"]
    assert {"postgres", "elasticsearch", "redis"} <= set(worker["depends_on"])
    assert environment(user_code)["VISION_RAG_MULTI_NODE"] == "1"


def test_dockerfile_installs_tesseract_cpu_torch_and_the_project(dockerfile: str) -> None:
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    [torch_pin] = re.findall(r'"(torch==[^"]+)"', pyproject)
    assert re.search(r"^FROM python:3\.11-slim-bookworm$", dockerfile, re.M)
    assert re.search(r"apt-get install .*tesseract-ocr .*tesseract-ocr-chi-sim", dockerfile)
    assert re.search(rf"pip install {re.escape(torch_pin)} .*whl/cpu", dockerfile)
    assert re.search(r"pip install (--no-deps )?\.(\s|$)", dockerfile)
    assert dockerfile.index(torch_pin) < dockerfile.index("pip install .")


def test_dockerignore_keeps_everything_the_dockerfile_copies(dockerfile: str) -> None:
    ignored = [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text(encoding="utf-8").splitlines()
        if line.strip() and not line.startswith("#")
    ]
    sources = [s for line in re.findall(r"^COPY (.+)$", dockerfile, re.M) for s in line.split()[:-1]]
    assert PRODUCTION_YAML in sources and "vision_rag_pipeline" in sources
    for source in sources:
        assert (ROOT / source).exists(), f"COPY {source}: no such file"
        assert not any(fnmatch.fnmatch(source, pattern) for pattern in ignored), f"{source} is ignored"


def test_dagster_yaml_passes_dagsters_instance_config_schema(tmp_path: Path) -> None:
    shutil.copy(ROOT / PRODUCTION_YAML, tmp_path / "dagster.yaml")
    config, custom_class = dagster_instance_config(str(tmp_path))
    assert custom_class is None
    postgres_db = config["storage"]["postgres"]["postgres_db"]
    # SQLAlchemy 2.1 maps `postgresql://` to psycopg 3, where dagster-postgres' NOTIFY fails.
    assert postgres_db["scheme"] == "postgresql+psycopg2"
    assert config["run_coordinator"]["class"] == "QueuedRunCoordinator"
    assert config["run_retries"]["enabled"] is True and config["run_retries"]["max_retries"] == 2
    assert config["concurrency"]["pools"]["default_limit"] >= 1
    assert config["telemetry"] == {"enabled": False}
    assert config["nux"] == {"enabled": False}  # no community pop-up over the production UI


def production_instance_env(pg_url: str, database: str) -> dict[str, str]:
    """The variables docker/dagster.yaml reads, naming `database` on the Postgres of `pg_url`
    (libpq takes a socket directory from PGHOST when the URL has no host)."""
    url = urlsplit(pg_url)
    socket_dir = parse_qs(url.query).get("host", [None])[0]
    return {
        **({"PGHOST": socket_dir} if socket_dir else {}),
        "DAGSTER_PG_HOST": "" if socket_dir else url.hostname or "",
        "DAGSTER_PG_PORT": str(url.port or 5432),
        "DAGSTER_PG_USERNAME": url.username or "",
        "DAGSTER_PG_PASSWORD": url.password or "",
        "DAGSTER_PG_DB": database,
    }


@pytest.fixture
def production_instance(
    pg_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[dg.DagsterInstance]:
    """The instance docker/dagster.yaml describes, on a fresh database of the session's Postgres."""
    database = "vision_rag_deploy_check"
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {database} WITH (FORCE)")
        conn.execute(f"CREATE DATABASE {database}")
    for name, value in production_instance_env(pg_url, database).items():
        monkeypatch.setenv(name, value)
    shutil.copy(ROOT / PRODUCTION_YAML, tmp_path / "dagster.yaml")
    instance = dg.DagsterInstance.from_config(str(tmp_path))
    try:
        yield instance
    finally:
        instance.dispose()
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {database} WITH (FORCE)")


def test_dagster_yaml_opens_a_postgres_instance_that_records_runs_and_bounds_the_vision_pool(
    production_instance: dg.DagsterInstance,
) -> None:
    from dagster_postgres import PostgresEventLogStorage, PostgresRunStorage

    from vision_rag_pipeline.definitions import defs

    instance = production_instance
    assert isinstance(instance.run_storage, PostgresRunStorage)
    assert isinstance(instance.event_log_storage, PostgresEventLogStorage)
    assert type(instance.run_coordinator).__name__ == "QueuedRunCoordinator"
    assert instance.run_retries_enabled and instance.run_retries_max_retries == 2

    pools = {
        assets_def.op.pool for assets_def in defs.resolve_asset_graph().assets_defs if assets_def.op.pool
    }
    assert pools == {"vision_model"}

    @dg.asset(pool="vision_model")
    def described_image() -> str:
        return "a chart"

    result = dg.materialize([described_image], instance=instance)
    assert result.success
    stored = instance.get_run_by_id(result.run_id)
    assert stored is not None and stored.status == dg.DagsterRunStatus.SUCCESS
    assert instance.get_latest_materialization_event(described_image.key) is not None

    limit = instance.get_concurrency_config().pool_config.default_pool_limit
    assert instance.event_log_storage.get_concurrency_info("vision_model").slot_count == limit


def _compose_cli() -> list[str] | None:
    for cli in (["docker", "compose"], ["docker-compose"]):
        if shutil.which(cli[0]) is None:
            continue
        probe = subprocess.run([*cli, "version"], capture_output=True, text=True, check=False)
        if probe.returncode == 0:
            return cli
    return None


def test_docker_compose_accepts_the_file_without_an_engine() -> None:
    cli = _compose_cli()
    if cli is None:
        pytest.skip("neither the `docker compose` plugin nor docker-compose is installed")
    checked = subprocess.run(
        [*cli, "-f", str(ROOT / "docker-compose.yml"), "config", "--quiet"],
        capture_output=True,
        text=True,
        check=False,
        cwd=ROOT,
    )
    assert checked.returncode == 0, checked.stderr
