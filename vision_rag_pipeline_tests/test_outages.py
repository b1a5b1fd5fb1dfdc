"""The doors outlive their database: `vision-rag serve` as a real process, its embedded Postgres
killed with SIGKILL under load; an external database that is down; a disk that is full."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import psutil
import psycopg
import pytest

from vision_rag_pipeline.api import create_app
from vision_rag_pipeline.core.postgres import running_embedded
from vision_rag_pipeline_tests.test_api import SAMPLE_MHTML, call, multipart, serving
from vision_rag_pipeline_tests.test_pdf_loader import Page, Text, write_pdf

CLI = [sys.executable, "-m", "vision_rag_pipeline.cli"]
LOAD_SECONDS = 14.0  # searches keep coming this long after the kill
KILL_AFTER_SECONDS = 2.0


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _request(url: str, body: dict | None = None, timeout: float = 30) -> tuple[int, dict, dict]:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(
        url, data=data, headers={"Content-Type": "application/json"} if data else {}
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, json.loads(response.read()), dict(response.headers)
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}"), dict(exc.headers)


@pytest.fixture
def served_home(tmp_path: Path) -> Iterator[tuple[str, Path, subprocess.Popen]]:
    """`vision-rag serve` on a fresh home, answering (its database and model loaded)."""
    home = tmp_path / "home"
    env = os.environ | {"VISION_RAG_HOME": str(home), "DAGSTER_HOME": str(home / "dagster")}
    env.pop("VISION_RAG_PG_URL", None)
    port = _free_port()
    server = subprocess.Popen(
        [*CLI, "serve", "--port", str(port), "--no-ingest"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                if _request(f"{url}/health", timeout=5)[0] == 200:
                    break
            except OSError:
                time.sleep(0.2)
        else:
            pytest.fail("serve did not answer /health")
        assert _request(f"{url}/search", {"query": "revenue", "mode": "vector"}, timeout=120)[0] == 200
        yield url, home, server
    finally:
        server.send_signal(signal.SIGINT)
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
        postmaster = home / "pgdata" / "postmaster.pid"
        pid = int(postmaster.read_text().split()[0]) if postmaster.exists() else 0
        if pid > 0:
            with contextlib.suppress(ProcessLookupError):  # the server may be gone already
                os.kill(pid, signal.SIGINT)


def test_serve_answers_again_seconds_after_its_postgres_is_killed(
    served_home: tuple[str, Path, subprocess.Popen],
) -> None:
    url, home, server = served_home
    results: list[tuple[float, int, str | None]] = []  # (seconds since the kill, status, Retry-After)
    killed_at: list[float] = []
    stop = threading.Event()

    def load() -> None:
        while not stop.is_set():
            try:
                status, _, headers = _request(f"{url}/search", {"query": "revenue", "mode": "vector"})
            except OSError as exc:  # no answer within the timeout, or the connection dropped
                status, headers = -1, {"error": repr(exc)}
            since = time.monotonic() - killed_at[0] if killed_at else -1.0
            results.append((since, status, headers.get("retry-after") or headers.get("Retry-After")))

    threads = [threading.Thread(target=load) for _ in range(2)]
    for thread in threads:
        thread.start()
    time.sleep(KILL_AFTER_SECONDS)
    postmaster = int((home / "pgdata" / "postmaster.pid").read_text().split()[0])
    os.kill(postmaster, signal.SIGKILL)
    killed_at.append(time.monotonic())
    time.sleep(LOAD_SECONDS)
    stop.set()
    for thread in threads:
        thread.join(timeout=60)

    before = [r for r in results if r[0] < 0]
    after = [r for r in results if r[0] >= 0]
    failures = [r for r in after if r[1] != 200]
    assert before and all(status == 200 for _, status, _ in before)
    assert {status for _, status, _ in failures} <= {503}, f"only 503s while it is down: {failures[:9]}"
    assert all(retry_after for _, _, retry_after in failures), "every 503 says when to retry"
    last_failure = max((since for since, _, _ in failures), default=0.0)
    assert last_failure < 5.0, f"searches failed for {last_failure:.1f} s after the kill"
    assert sum(status == 200 for _, status, _ in after) >= 10, "searches succeed again"
    assert server.poll() is None, "serve itself was never restarted"
    assert _request(f"{url}/health")[0] == 200
    new_postmaster = int((home / "pgdata" / "postmaster.pid").read_text().split()[0])
    assert new_postmaster != postmaster, "the embedded server was started again"


def _wait_for(check, seconds: float) -> float:  # noqa: ANN001 - a predicate
    """Seconds until `check()` holds, polling; fails after `seconds`."""
    started = time.monotonic()
    while not check():
        assert time.monotonic() - started < seconds, f"not within {seconds} s"
        time.sleep(0.2)
    return time.monotonic() - started


def test_a_hung_database_is_503_within_seconds_and_health_says_so_without_waiting(
    served_home: tuple[str, Path, subprocess.Popen],
) -> None:
    """The postmaster and its backends stopped with SIGSTOP: /health and /search each waited as long
    as the database was stopped (25 s), with no timeout and no 503."""
    url, home, server = served_home
    postmaster = psutil.Process(int((home / "pgdata" / "postmaster.pid").read_text().split()[0]))
    stopped = [postmaster, *postmaster.children(recursive=True)]
    health_seconds: list[float] = []

    def health() -> tuple[int, dict, dict]:
        started = time.monotonic()
        answer = _request(f"{url}/health", timeout=30)
        health_seconds.append(time.monotonic() - started)
        return answer

    for process in stopped:
        process.suspend()
    try:
        _wait_for(lambda: health()[0] == 503, 10)
        status, body, headers = health()
        assert status == 503 and body["database"] == "down" and "unavailable" in body["detail"], body
        assert int(headers["retry-after"]) > 0
        assert max(health_seconds) < 1.0, f"/health waited {max(health_seconds):.1f} s"
        started = time.monotonic()
        status, body, headers = _request(f"{url}/search", {"query": "revenue", "mode": "vector"}, timeout=60)
        waited = time.monotonic() - started
        assert status == 503 and "unavailable" in body["detail"] and int(headers["retry-after"]) > 0, body
        assert waited < 8, f"/search waited {waited:.1f} s on a hung database"
        env = os.environ | {"VISION_RAG_HOME": str(home), "DAGSTER_HOME": str(home / "dagster")}
        started = time.monotonic()
        done = subprocess.run([*CLI, "status"], env=env, capture_output=True, text=True, timeout=120)
        waited = time.monotonic() - started
        assert done.returncode == 1 and "unavailable" in done.stderr, done.stderr
        assert len(done.stderr.strip().splitlines()) == 1 and waited < 20, (waited, done.stderr)
    finally:
        for process in stopped:
            process.resume()
    _wait_for(lambda: health()[0] == 200, 15)
    assert _request(f"{url}/search", {"query": "revenue", "mode": "vector"})[0] == 200
    assert server.poll() is None and postmaster.is_running(), "nothing was restarted"


def _report_pdf(figure: str) -> bytes:
    text = f"Quarterly zircon sales reached {figure} tonnes in the northern mines."
    return write_pdf([Page(texts=[Text(72, 700, text)])])


def _cli(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = os.environ | {"VISION_RAG_HOME": str(home), "DAGSTER_HOME": str(home / "dagster")}
    return subprocess.run([*CLI, *args], env=env, capture_output=True, text=True, timeout=600)


def _chunk_texts(home: Path) -> list[str]:
    url = running_embedded(home / "pgdata").url
    with psycopg.connect(url) as conn:
        return sorted(row[0] for row in conn.execute("SELECT text FROM chunks WHERE kind <> 'page'"))


def test_a_damaged_or_deleted_lexical_index_is_the_servers_fault_and_reindex_repairs_it(
    served_home: tuple[str, Path, subprocess.Popen], tmp_path: Path
) -> None:
    """A `meta.json` of `garbage{` made /search answer 422 `value_error`, /health ok and the CLI exit 2
    (its usage error); an ingest meanwhile failed after writing its pgvector rows; a deleted lexical
    directory was made again, empty: lexical search said "(no hits)"."""
    url, home, server = served_home
    report = tmp_path / "zircon.pdf"
    report.write_bytes(_report_pdf("4,210"))
    assert _cli(home, "ingest", str(report)).returncode == 0
    indexed = _chunk_texts(home)
    lexical = home / "lexical"
    query = {"query": "zircon tonnes", "mode": "lexical"}
    assert _request(f"{url}/search", query)[0] == 200

    def health_says(state: str) -> bool:
        return _request(f"{url}/health")[1].get("status", "") == state

    for damage in ("corrupt", "delete"):
        if damage == "corrupt":
            (lexical / (lexical / "CURRENT").read_text().strip() / "meta.json").write_text("garbage{")
        else:
            shutil.rmtree(lexical)
        for path in ("/search", "/chat"):
            status, body, headers = _request(
                f"{url}{path}", {**query, "mode": "hybrid"} if path == "/search" else {"query": "zircon?"}
            )
            assert status == 503 and "vision-rag reindex" in body["detail"], (damage, path, body)
            assert int(headers["retry-after"]) > 0
        _wait_for(lambda: health_says("degraded"), 10)
        problem = _request(f"{url}/health")[1]
        assert problem["lexical_index"] == "damaged" and "vision-rag reindex" in problem["detail"]
        if damage == "corrupt":  # the CLI says so in one line; an ingest now changes neither index
            searched = _cli(home, "search", "zircon tonnes", "--mode", "lexical")
            errors = searched.stderr.strip().splitlines()
            assert searched.returncode == 1 and len(errors) == 1 and "vision-rag reindex" in errors[0], (
                searched
            )
            report.write_bytes(_report_pdf("9,999"))
            ingested = _cli(home, "ingest", str(report))
            assert ingested.returncode == 1 and "vision-rag reindex" in ingested.stderr, ingested.stderr
            assert _chunk_texts(home) == indexed, "the vector index still holds the last complete ingest"
        assert not (lexical / "CURRENT").exists() or damage == "corrupt", "a deleted index is not made again"
        repaired = _cli(home, "reindex")
        assert repaired.returncode == 0, repaired.stderr
        _wait_for(lambda: health_says("ok"), 10)
        status, body, _ = _request(f"{url}/search", query)
        assert status == 200 and [hit["text"] for hit in body["hits"]], body
        assert all("4,210" in hit["text"] for hit in body["hits"] if hit["kind"] != "page")
    assert server.poll() is None


def test_an_external_database_that_is_down_is_503_with_retry_after_and_health_says_so(
    pg_url: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("VISION_RAG_PG_URL", f"postgresql://postgres@127.0.0.1:{_free_port()}/postgres")
    monkeypatch.setenv("VISION_RAG_INBOX", str(tmp_path / "inbox"))
    with serving(create_app()) as url:
        payload, content_type = multipart([(SAMPLE_MHTML.name, SAMPLE_MHTML.read_bytes())], {})
        status, body = call(f"{url}/upload", payload, content_type)
        assert status == 503 and "unavailable" in body["detail"], "an upload it cannot register is refused"
        assert list((tmp_path / "inbox").iterdir()) == [], "and leaves nothing behind to be lost"
        status, body, headers = _request(f"{url}/health")
        assert status == 503 and "unavailable" in body["detail"] and int(headers["retry-after"]) > 0
        status, body, headers = _request(f"{url}/search", {"query": "revenue", "mode": "vector"})
        assert status == 503 and "unavailable" in body["detail"] and int(headers["retry-after"]) > 0


@pytest.fixture
def tiny_disk(tmp_path: Path) -> Iterator[Path]:
    """A 6 MB file system (tmpfs), too small for a Postgres cluster; skipped where mounting is not
    allowed."""
    mount_point = tmp_path / "tiny"
    mount_point.mkdir()
    if not shutil.which("mount") or os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=6m", "tmpfs", str(mount_point)], capture_output=True
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=False)


def test_a_full_disk_says_disk_full_and_names_the_path(tiny_disk: Path, tmp_path: Path) -> None:
    home = tiny_disk / "home"
    document = tmp_path / "note.pdf"
    document.write_bytes(b"%PDF-1.4\n%%EOF\n")
    env = os.environ | {"VISION_RAG_HOME": str(home), "DAGSTER_HOME": str(tmp_path / "dagster")}
    env.pop("VISION_RAG_PG_URL", None)
    done = subprocess.run(
        [*CLI, "ingest", str(document)], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode != 0
    errors = [line for line in done.stderr.splitlines() if line.strip()]
    assert any("disk full" in line and str(home / "pgdata") in line for line in errors), done.stderr
    assert "CalledProcessError" not in done.stderr and "Traceback" not in done.stderr
