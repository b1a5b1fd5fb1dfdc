"""`vision-rag ingest` as an operator treats it: real processes started together on a fresh home,
killed with SIGKILL mid-run, interrupted with Ctrl-C, fed a broken file. Nothing hangs (every
wait has a timeout), nothing is lost or duplicated, the terminal shows one line per failure."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import dagster as dg
import numpy as np
import psutil
import pytest
from tantivy import Query

from vision_rag_pipeline.core.postgres import connect, start_embedded
from vision_rag_pipeline.defs.runner import instance_lock
from vision_rag_pipeline.indexes.tantivy_index import open_tantivy_index
from vision_rag_pipeline_tests.conftest import bench_module
from vision_rag_pipeline_tests.openai_fake import FakeOpenAI, Reply, chat_reply

pytestmark = pytest.mark.slow

CLI = [sys.executable, "-m", "vision_rag_pipeline.cli"]
RUN_TIMEOUT = 600  # seconds: a hang fails the test instead of stalling the suite


@pytest.fixture(scope="module")
def documents(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """Four reports (two MHTML, two PDF) with charts to OCR and decoration to ignore."""
    out = tmp_path_factory.mktemp("crash_docs")
    bench_module("evalset").generate(out, docs=4, seed=16)
    return sorted(str(p) for p in (out / "docs").iterdir())


class Home:
    """A fresh VISION_RAG_HOME used only through the CLI, as a user would."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.env = os.environ | {
            "VISION_RAG_HOME": str(path),
            "DAGSTER_HOME": str(path / "dagster"),
            "VISION_RAG_THREADS": "1",  # same float sums in every process: vectors compare exactly
        }

    def start(self, *args: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [*CLI, *args], env=self.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*CLI, *args], env=self.env, capture_output=True, text=True, timeout=RUN_TIMEOUT
        )

    def instance(self) -> dg.DagsterInstance:
        dagster_home = self.path / "dagster"
        with instance_lock(dagster_home):  # as the CLI does: never create storages beside another process
            return dg.DagsterInstance.from_config(str(dagster_home))

    def slot_holders(self) -> set[str]:
        if not (self.path / "dagster" / "dagster.yaml").exists():
            return set()
        instance = self.instance()
        try:
            return instance.event_log_storage.get_concurrency_run_ids()
        finally:
            instance.dispose()

    def index(self) -> dict:
        """The whole index: chunk and image rows with their vectors, and the lexical entries."""
        url = start_embedded(self.path / "pgdata")
        with connect(url) as conn:
            chunks = conn.execute(
                "SELECT chunk_id, document_id, chunk_index, kind, text, page, bbox, char_start, char_end, "
                "image_url, metadata, embedding FROM chunks ORDER BY chunk_id"
            ).fetchall()
            images = conn.execute(
                "SELECT id, document_id, image_sha256, image_url, raw_ocr_text, raw_vlm_caption, content_chunk, "
                "metadata, content_vector FROM rag_images ORDER BY id"
            ).fetchall()
        lexical = open_tantivy_index(self.path / "lexical")
        try:
            entries = lexical._read(
                lambda index: sorted(
                    (doc.get_first("chunk_id"), doc.get_first("document_id"))
                    for doc in (
                        index.searcher().doc(address)
                        for _, address in index.searcher().search(Query.all_query(), 100_000).hits
                    )
                )
            )
        finally:
            lexical.close()
        return {"chunks": chunks, "images": images, "lexical": entries}

    def stop_postgres(self) -> None:
        postmaster = self.path / "pgdata" / "postmaster.pid"
        pid = int(postmaster.read_text().split()[0]) if postmaster.exists() else 0
        if pid > 0:  # a negative one is a standalone backend's, and os.kill would signal a process group
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGINT)  # fast shutdown


@pytest.fixture
def new_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[[], Home]]:
    homes: list[Home] = []

    def make() -> Home:
        homes.append(Home(tmp_path_factory.mktemp("home")))
        return homes[-1]

    yield make
    for home in homes:
        home.stop_postgres()


def _same_index(a: dict, b: dict) -> None:
    for table in ("chunks", "images"):
        assert [row[:-1] for row in a[table]] == [row[:-1] for row in b[table]], (
            f"{table}: ids or texts differ"
        )
        for row_a, row_b in zip(a[table], b[table], strict=True):
            assert np.array_equal(np.asarray(row_a[-1]), np.asarray(row_b[-1])), (
                f"{table}: vector of {row_a[0]}"
            )
    assert a["lexical"] == b["lexical"]
    assert a["chunks"] and a["images"] and a["lexical"]


def _finished(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("ok ")]


def _wait_for(condition: Callable[[], object], what: str, timeout: float = RUN_TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


@pytest.fixture(scope="module")
def concurrent_home(
    documents: list[str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Home, list]]:
    """A fresh home into which four `vision-rag ingest` processes were started at the same moment, one
    document each; the last one also gets a damaged PDF."""
    home = Home(tmp_path_factory.mktemp("concurrent_home"))
    broken = home.path.parent / "damaged.pdf"
    broken.write_bytes(b"%PDF-1.4\n1 0 obj << /Type /Catalog /Pages 2 0 R >> garbage")
    argvs = [["ingest", "--workers", "1", doc] for doc in documents]
    argvs[-1].append(str(broken))
    processes = [home.start(*argv) for argv in argvs]
    results = [(*process.communicate(timeout=RUN_TIMEOUT), process.returncode) for process in processes]
    yield home, results
    home.stop_postgres()


def test_concurrent_ingests_on_a_fresh_home_each_succeed_once(
    concurrent_home: tuple[Home, list], documents: list[str]
) -> None:
    home, results = concurrent_home
    for (_, err, code), doc in zip(results[:-1], documents, strict=False):
        assert code == 0, err
        finished = _finished(err)
        assert len(finished) == 1 and finished[0].startswith(f"ok {doc} "), err
    index = home.index()
    chunk_ids = [row[0] for row in index["chunks"]]
    assert len(chunk_ids) == len(set(chunk_ids))
    assert {row[1] for row in index["chunks"]} == {row[1] for row in index["lexical"]}
    assert len(index["lexical"]) == len(set(index["lexical"])), "no lexical entry twice"
    assert sorted(chunk_ids) == [chunk_id for chunk_id, _ in index["lexical"]], "same chunks in both indexes"
    reported = sum(int(out.split(" chunks in ")[0].rsplit(" ", 1)[1]) for out, _, _ in results)
    assert reported == len(chunk_ids), "every chunk a run reported is in the index, once"

    later = home.run("search", "revenue", "--json")  # the instance and the index still work afterwards
    assert later.returncode == 0, later.stderr
    again = home.run("ingest", "--workers", "1", documents[0])
    assert again.returncode == 0, again.stderr


def test_a_broken_file_is_one_line_on_the_terminal(
    concurrent_home: tuple[Home, list], documents: list[str]
) -> None:
    _, results = concurrent_home
    out, err, code = results[-1]
    assert code == 1, "a failed file makes the exit code 1"
    assert f"ok {documents[-1]}" in err, "the good file next to it is ingested"
    failed = [line for line in err.splitlines() if line.startswith("FAILED")]
    assert failed == ["FAILED damaged.pdf: not a readable PDF (not a PDF, or damaged) (in raw_documents)"]
    assert len(err.splitlines()) == 2, err
    assert "Traceback" not in err + out and "Stack Trace" not in err + out
    summary, *languages = out.splitlines()
    assert "1 not ingested" in summary
    assert [line.split(":")[0] for line in languages] == ["languages", "OCR languages"], (
        "stdout is the summary and nothing else"
    )


def test_kill_9_mid_ingest_then_rerun_gives_the_uninterrupted_index(
    concurrent_home: tuple[Home, list], documents: list[str], new_home: Callable[[], Home]
) -> None:
    home = new_home()
    victim = home.start("ingest", "--workers", "2", *documents)
    _wait_for(lambda: victim.poll() is not None or home.slot_holders(), "a run holding a vision_model slot")
    workers = psutil.Process(victim.pid).children(recursive=True)
    victim.kill()
    victim.wait(timeout=30)
    assert victim.returncode == -signal.SIGKILL, "killed mid-run, not after the end"
    _, alive = psutil.wait_procs(workers, timeout=30)
    assert not alive, "the worker processes die with the CLI"
    assert home.slot_holders(), "the killed runs still hold their pool slots"

    rerun = home.run("ingest", "--workers", "2", *documents)  # hung forever before the fix
    assert rerun.returncode == 0, rerun.stderr
    assert "run(s) of killed vision-rag processes failed" in rerun.stderr
    instance = home.instance()
    try:
        statuses = {run.status for run in instance.get_runs()}
        assert dg.DagsterRunStatus.STARTED not in statuses
        assert dg.DagsterRunStatus.FAILURE in statuses, "the killed runs are marked failed"
        assert not instance.event_log_storage.get_concurrency_run_ids()
    finally:
        instance.dispose()
    _same_index(home.index(), concurrent_home[0].index())


def test_ctrl_c_starts_no_new_document_and_says_what_finished(
    documents: list[str], new_home: Callable[[], Home]
) -> None:
    home = new_home()
    ingest = subprocess.Popen(
        [*CLI, "ingest", "--workers", "2", *documents, *documents],
        env=home.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group, as a terminal's foreground job
    )
    watchdog = threading.Timer(RUN_TIMEOUT, ingest.kill)  # no hang, whatever happens
    watchdog.start()
    try:
        assert ingest.stderr is not None
        for line in ingest.stderr:  # until the first finished document
            if line.startswith("ok "):
                break
        os.killpg(ingest.pid, signal.SIGINT)  # Ctrl-C reaches the whole foreground group
        ingest.wait()
    finally:
        watchdog.cancel()
    err = line + ingest.stderr.read()
    assert ingest.returncode == 130, err
    assert "not started (interrupted)" in err, "the documents after the interrupt never start"
    finished = len(_finished(err))
    assert 1 <= finished < len(documents), "a path given twice is one file"
    assert f"interrupted with {finished} of {len(documents)} documents ingested" in err
    assert "Traceback" not in err
    status = home.run("status")
    assert status.returncode == 1 and "not started (interrupted)" in status.stdout, status.stdout
    instance = home.instance()
    try:
        assert len(instance.get_runs()) < len(documents)
        assert not {run.status for run in instance.get_runs()} & {dg.DagsterRunStatus.STARTED}
        assert not instance.event_log_storage.get_concurrency_run_ids(), (
            "interrupted runs gave their slots back"
        )
    finally:
        instance.dispose()


def test_a_document_overwritten_and_ingested_again_mid_run_waits_for_the_first_run(
    new_home: Callable[[], Home], documents: list[str], tmp_path: Path
) -> None:
    """The issue's repro with real racing processes: while the first ingest of a file waits on its
    vision calls, the file is overwritten with another PDF and ingested again. The second run waits
    for the first (one run per document) and neither reads the other's values: both succeed, and the
    index is exactly a clean ingest of the new file."""
    first_pdf, second_pdf = [d for d in documents if d.endswith(".pdf")][:2]
    target = tmp_path / "doc4.pdf"
    shutil.copyfile(first_pdf, target)
    raced, clean = new_home(), new_home()
    with FakeOpenAI() as endpoint:
        endpoint.script(*[Reply(body=chat_reply("A slow description.").body, delay_s=12.0)] * 4)
        for home in (raced, clean):
            home.env |= {"OPENAI_BASE_URL": endpoint.base_url, "OPENAI_API_KEY": "vr-test-placeholder-key"}
        first = raced.start("ingest", str(target))
        deadline = time.monotonic() + RUN_TIMEOUT
        while not endpoint.requests and first.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert endpoint.requests, "the first run reached its enrichment step"
        shutil.copyfile(second_pdf, target)  # overwritten while the first run enriches
        second = raced.start("ingest", str(target))
        outputs = [process.communicate(timeout=RUN_TIMEOUT) for process in (first, second)]
        assert [first.returncode, second.returncode] == [0, 0], outputs
        assert clean.run("ingest", str(target)).returncode == 0
    _same_index(raced.index(), clean.index())
