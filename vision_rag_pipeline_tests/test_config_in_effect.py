"""One config in effect: the file every process reads, read once per process, and the line a process
prints when its config is not the one the deployment's runs last used. `test_daemon.py` drives the
same through a real daemon and the CLI."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pydantic
import pytest

from vision_rag_pipeline.cli import main
from vision_rag_pipeline.core.config import (
    CONFIG_ENV,
    ConfigError,
    config_in_effect,
    config_path,
    read_config_file,
)
from vision_rag_pipeline.core.config_in_use import (
    ConfigUsed,
    difference,
    last_config_used,
    record_config_used,
    say_once_if_different,
)
from vision_rag_pipeline.core.postgres import stop_embedded
from vision_rag_pipeline.defs.resources import RagConfigResource


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A home of the test's own; the embedded Postgres a test starts in it (recording the config
    used does) is stopped after."""
    monkeypatch.setenv("VISION_RAG_HOME", str(tmp_path / "home"))
    monkeypatch.delenv(CONFIG_ENV, raising=False)
    yield tmp_path / "home"
    stop_embedded(tmp_path / "home" / "pgdata")


def test_the_home_config_file_is_written_on_first_use_and_is_what_config_path_prints(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["config", "path"]) == 0
    assert capsys.readouterr().out.strip() == str(home / "config.yaml")
    assert (home / "config.yaml").read_text().startswith("# The RAG config of vision-rag.")
    (home / "config.yaml").write_text("splitter: {chunk_size: 700}\n")
    assert main(["config", "show"]) == 0
    shown = capsys.readouterr().out
    assert shown.startswith(f"# source: {home / 'config.yaml'} (settings ") and "chunk_size: 700" in shown


def test_vision_rag_config_names_another_file_and_the_home_file_is_left_alone(
    home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    other = tmp_path / "rag.json"
    other.write_text('{"id": "other"}')
    monkeypatch.setenv(CONFIG_ENV, str(other))
    assert main(["config", "path"]) == 0
    assert capsys.readouterr().out.strip() == str(other)
    assert config_in_effect().config.id == "other" and not (home / "config.yaml").exists()


def test_a_process_reads_its_config_once_into_one_frozen_object(home: Path) -> None:
    first = config_in_effect()
    first.path.write_text("media_enrichment: {fusion: {max_keywords: 5}}\n")
    assert config_in_effect() is first, "an edit reaches processes started after it"
    assert (
        first.file_now().sha256 != first.sha256
        and first.file_now().config.media_enrichment.fusion.max_keywords == 5
    )
    with pytest.raises(pydantic.ValidationError, match="frozen"):
        first.config.splitter.chunk_size = 10  # type: ignore[misc]


def test_equal_settings_in_two_files_are_one_config(tmp_path: Path) -> None:
    a, b = tmp_path / "a.yaml", tmp_path / "b.json"
    a.write_text("# comment\nsplitter: {chunk_size: 700}\nid: default\n")
    b.write_text('{"splitter": {"chunk_size": 700, "chunk_overlap": 100}}')
    assert read_config_file(a).sha256 == read_config_file(b).sha256
    used_b = ConfigUsed(str(b), read_config_file(b).sha256, "another-host")
    assert difference(read_config_file(a), used_b) is None


def test_a_run_configured_with_another_config_file_fails_instead_of_mixing_two(
    home: Path, tmp_path: Path
) -> None:
    other = tmp_path / "other.yaml"
    other.write_text("id: other\n")
    assert RagConfigResource().load() is config_in_effect().config
    with pytest.raises(
        ConfigError, match=f"rag_config.config_path names {other}, but this process works with"
    ):
        RagConfigResource(config_path=str(other)).load()


def test_runs_record_their_config_and_another_process_says_so_once_naming_both_files(
    pg_url: str, home: Path, tmp_path: Path
) -> None:
    daemon = tmp_path / "daemon.yaml"
    daemon.write_text("media_enrichment: {fusion: {max_keywords: 6}}\n")
    record_config_used(read_config_file(daemon))  # a run of the daemon's
    used = last_config_used()
    assert used is not None and used.path == str(daemon)

    said: list[str] = []
    here = config_in_effect()  # this process: the home's file, the defaults
    say_once_if_different(here, used, said.append)
    say_once_if_different(here, used, said.append)
    [line] = said
    assert str(home / "config.yaml") in line and str(daemon) in line and "VISION_RAG_CONFIG=" in line

    record_config_used(here)  # this process' runs: now the daemon's side differs
    assert difference(read_config_file(daemon), last_config_used()) is not None
    assert difference(here, last_config_used()) is None


def test_threads_of_one_process_write_a_fresh_homes_config_file_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The CLI starts Postgres and the model on threads, each of which may be first to ask for the
    config file of a home that does not exist yet (a search from a new host did, and failed)."""
    monkeypatch.delenv(CONFIG_ENV, raising=False)
    monkeypatch.setenv("VISION_RAG_HOME", str(tmp_path / "new" / "state"))
    start, errors = threading.Barrier(8), []

    def ask() -> None:
        start.wait()
        try:
            config_path()
        except OSError as error:
            errors.append(error)

    threads = [threading.Thread(target=ask) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert [p.name for p in (tmp_path / "new" / "state").iterdir()] == ["config.yaml"]
