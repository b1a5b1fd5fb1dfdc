"""Sensors and the schedule driven by a real `dagster-daemon` (its own code server and run workers),
on a temporary instance: what a user of the inbox sees, not what a sensor function returns.

One deployment for the module, in scenario order: a file dropped into the inbox is requested and the
`ingest_requests` sensor runs it: ingested and searchable; a vision-prompt edit without a vision
model launches nothing; a keyword-count change in the config file re-enriches its partition once the
daemon's code server loaded it (`dagster-daemon run` starts a new one every minute); files dropped
together run as one batch over their partition range, and a file that is no document is refused with
its reason in `vision-rag status`; `vision-rag ingest` of a file while the daemon serves waits for the
daemon's run; deleting the file removes its rows from both indexes; the nightly reindex, its cron set
by VISION_RAG_REINDEX_CRON to one minute inside the test's window, is launched by the scheduler; a
`vision-rag ingest` without the daemon's VISION_RAG_CONFIG reads the home's config file and says, as
the daemon's sensor does, that the two differ, naming both files. Runs are queued one at a time
(`concurrency.runs.max_concurrent_runs: 1`): the machine is small, and a reindex racing a removal is
not what these tests are about.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import NamedTuple, TypeVar

import dagster as dg
import psutil
import psycopg
import pytest
import yaml
from dagster._core.definitions.instigation_logger import get_instigation_log_records
from dagster._core.instance.ref import InstanceRef
from dagster._core.scheduler.instigation import InstigatorTick, TickStatus
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from vision_rag_pipeline.core.config import read_config_file
from vision_rag_pipeline.defs.partitions import documents_partitions
from vision_rag_pipeline.defs.runner import write_local_instance_config
from vision_rag_pipeline.documents.registry import DocumentRegistry, document_id_for

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
PDF = REPO / "vision_rag_pipeline" / "samples" / "larkspur_q3_2024_operations_review.pdf"
TICK_SECONDS = 5
RUNS_PER_TICK = 2  # a drop of three files takes two ticks
RUN_TIMEOUT = 240  # a whole ingest run takes ~5 s, several times that on a busy two-core machine
RELOAD_TIMEOUT = 150  # the daemon starts a new code server every 60 s; it then imports the project
STALE_AFTER_ENRICHMENT_CHANGE = {
    "image_enrichments",
    "document_chunks",
    "chunk_embeddings",
    "pgvector_index",
    "lexical_index",
}

T = TypeVar("T")


class Deployment(NamedTuple):
    instance: dg.DagsterInstance
    inbox: Path
    config: Path
    env: dict[str, str]
    log: Path
    daemon_pid: int


def wait_for(what: str, check: Callable[[], T | None], deployment: Deployment, timeout: float) -> T:
    """Poll `check` until it returns something truthy; fail with the daemon's last words otherwise."""
    deadline = time.monotonic() + timeout
    while True:
        found = check()
        if found:
            return found
        if time.monotonic() > deadline:
            tail = "\n".join(deployment.log.read_text(errors="replace").splitlines()[-40:])
            pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}; daemon log:\n{tail}")
        time.sleep(1)


def runs(deployment: Deployment, **tags: str) -> list[dg.DagsterRun]:
    return list(deployment.instance.get_runs(dg.RunsFilter(tags=tags)))


def runs_covering(deployment: Deployment, document_id: str) -> list[dg.DagsterRun]:
    """The runs of the document's partition: of it alone, or of a range of partitions holding it."""
    keys = deployment.instance.get_dynamic_partitions(documents_partitions.name)
    place = keys.index(document_id)
    return [
        run
        for run in deployment.instance.get_runs()
        if run.tags.get("dagster/partition") == document_id
        or (
            "dagster/asset_partition_range_start" in run.tags
            and keys.index(run.tags["dagster/asset_partition_range_start"])
            <= place
            <= keys.index(run.tags["dagster/asset_partition_range_end"])
        )
    ]


def finished_run(deployment: Deployment, what: str, **tags: str) -> dg.DagsterRun:
    """The run with these tags, once it finished; a failed run fails the test at once."""

    def done() -> dg.DagsterRun | None:
        for run in runs(deployment, **tags):
            if run.status == dg.DagsterRunStatus.FAILURE:
                pytest.fail(f"{what}: run {run.run_id} failed")
            if run.status == dg.DagsterRunStatus.SUCCESS:
                return run
        return None

    return wait_for(what, done, deployment, RUN_TIMEOUT)


def sensor_ticks(deployment: Deployment, name: str) -> list[InstigatorTick]:
    """The sensor's ticks, newest first."""
    for state in deployment.instance.all_instigator_state():
        if state.instigator_name == name:
            return list(deployment.instance.get_ticks(state.instigator_origin_id, state.selector_id))
    return []


def tick_log(deployment: Deployment, tick: InstigatorTick) -> list[dict]:
    """What the tick logged (the UI's tick logs); nothing for a tick that logged nothing."""
    return list(get_instigation_log_records(deployment.instance, tick.log_key)) if tick.log_key else []


def edit_config_and_wait_for_the_daemon_to_load_it(deployment: Deployment, text: str) -> str:
    """Write the config file; return once a version-sensor tick compared with it (its skip reason
    names the settings it compared with). Returns the new settings' short hash."""
    deployment.config.write_text(text)
    settings = read_config_file(deployment.config).sha256[:12]
    wait_for(
        "the daemon's code server to load the edited config",
        lambda: any(
            f"(settings {settings})" in (tick.skip_reason or "")
            for tick in sensor_ticks(deployment, "version_sensor")[:3]
        ),
        deployment,
        RELOAD_TIMEOUT,
    )
    return settings


def _kill_tree(process: subprocess.Popen) -> None:
    """SIGINT the daemon's process group (daemon, code server, run workers), then SIGKILL what is left."""
    try:
        family = [process.pid, *(child.pid for child in psutil.Process(process.pid).children(recursive=True))]
    except psutil.NoSuchProcess:
        family = [process.pid]
    try:
        os.killpg(process.pid, signal.SIGINT)
        process.wait(timeout=30)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        pass
    for pid in family:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    process.wait(timeout=10)


@pytest.fixture(scope="module")
def deployment(pg_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    root = tmp_path_factory.mktemp("daemon")
    home, inbox, config = root / "home", root / "inbox", root / "rag.yaml"
    dagster_home = home / "dagster"
    inbox.mkdir()
    config.write_text("id: daemon-test\n")
    # The project's own local instance, queued one run at a time.
    write_local_instance_config(dagster_home)
    instance_yaml = dagster_home / "dagster.yaml"
    instance = yaml.safe_load(instance_yaml.read_text())
    instance["concurrency"]["runs"]["max_concurrent_runs"] = 1
    instance_yaml.write_text(yaml.safe_dump(instance))
    database = f"daemon_{uuid.uuid4().hex[:10]}"  # its own index database on the session's server
    with psycopg.connect(pg_url, autocommit=True) as admin:
        admin.execute(f"CREATE DATABASE {database}")
    reindex_at = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=150)
    env = os.environ | {
        "PYTHONPATH": str(REPO),
        "VISION_RAG_HOME": str(home),
        "DAGSTER_HOME": str(dagster_home),
        "VISION_RAG_PG_URL": make_conninfo(**(conninfo_to_dict(pg_url) | {"dbname": database})),
        "VISION_RAG_INBOX": str(inbox),
        "VISION_RAG_CONFIG": str(config),
        "VISION_RAG_SENSOR_INTERVAL_SECONDS": str(TICK_SECONDS),
        "VISION_RAG_SENSOR_RUNS_PER_TICK": str(RUNS_PER_TICK),
        # Fires once, at a minute about two and a half minutes from now (UTC, the schedule's timezone).
        "VISION_RAG_REINDEX_CRON": f"{reindex_at.minute} {reindex_at.hour} * * *",
    }
    # Opened before the daemon starts: two processes creating a new home's SQLite storages at once
    # break it ("table alembic_version already exists").
    instance = dg.DagsterInstance.from_ref(InstanceRef.from_dir(str(dagster_home)))
    log = root / "daemon.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [
                str(Path(sys.executable).parent / "dagster-daemon"),
                "run",
                "-m",
                "vision_rag_pipeline.definitions",
            ],
            cwd=root,  # not the repository root, whose dagster.yaml is the production instance
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # one process group to stop, with everything it starts
            # Started from a script, Dagster ignores SIGINT unless it is back to its default.
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )
    try:
        with (
            pytest.MonkeyPatch.context() as patch,
            instance,
        ):
            for name in ("VISION_RAG_HOME", "VISION_RAG_PG_URL", "VISION_RAG_INBOX", "VISION_RAG_CONFIG"):
                patch.setenv(name, env[name])  # this process searches the deployment's indexes
            yield Deployment(instance, inbox, config, env, log, process.pid)
    finally:
        _kill_tree(process)


@pytest.fixture(scope="module")
def document_id(deployment: Deployment) -> str:
    return document_id_for(deployment.inbox / PDF.name)


def test_a_dropped_file_is_partitioned_ingested_and_searchable(deployment: Deployment, document_id: str):
    from vision_rag_pipeline.query.search import search

    shutil.copy(PDF, deployment.inbox)

    wait_for(
        "the inbox sensor to add the partition",
        lambda: document_id in deployment.instance.get_dynamic_partitions(documents_partitions.name),
        deployment,
        RUN_TIMEOUT,
    )
    run = finished_run(deployment, "the ingest run", **{"dagster/partition": document_id})
    assert run.job_name == "ingest_document" and run.tags["dagster/sensor_name"] == "ingest_requests"
    # recorded by the sensor's next tick, which reads the finished run
    wait_for(
        "the ingest_requests sensor to record the outcome",
        lambda: DocumentRegistry().fates([document_id])[0].state == "ingested",
        deployment,
        4 * TICK_SECONDS,
    )
    [fate] = DocumentRegistry().fates([document_id])
    assert (fate.door, fate.attempts, fate.run_id) == ("inbox", 1, run.run_id)
    hits = search("What dividend did the board approve?", k=5, document_ids=[document_id])
    assert any("0.42" in hit.text for hit in hits), [hit.text[:80] for hit in hits]


def test_a_prompt_edit_without_a_vision_model_launches_no_run(deployment: Deployment, document_id: str):
    edit_config_and_wait_for_the_daemon_to_load_it(
        deployment,
        "id: daemon-test\nmedia_enrichment: {features: {mllm: {prompt: 'List every figure in the image.'}}}\n",
    )
    time.sleep(2 * TICK_SECONDS)  # the prompt shapes no output offline: nothing to re-read
    assert not reenrich_runs(deployment)
    assert DocumentRegistry().fates([document_id])[0].door == "inbox", "the version sensor requested nothing"


def reenrich_runs(deployment: Deployment) -> list[dg.DagsterRun]:
    return list(deployment.instance.get_runs(dg.RunsFilter(job_name="reenrich")))


def test_a_setting_change_re_enriches_the_partition_once_the_daemon_loaded_it(
    deployment: Deployment, document_id: str
):
    """The version sensor requests the stale partition through the registry (door `versions`), and the
    ingest_requests sensor runs it: the re-enrichment, whose materializations record the new version."""
    from vision_rag_pipeline.defs.versions import CODE_VERSION_TAG, code_versions

    deployment.config.write_text("id: daemon-test\nmedia_enrichment: {fusion: {max_keywords: 6}}\n")
    new_version = code_versions(read_config_file(deployment.config).config)["image_enrichments"]

    def finished() -> dg.DagsterRun | None:
        for run in reenrich_runs(deployment):
            if run.status == dg.DagsterRunStatus.FAILURE:
                pytest.fail(f"the re-enrichment run {run.run_id} failed")
            if run.status == dg.DagsterRunStatus.SUCCESS:
                return run
        return None

    run = wait_for("the re-enrichment run", finished, deployment, RELOAD_TIMEOUT + RUN_TIMEOUT)

    assert run.tags["dagster/partition"] == document_id
    assert run.tags["dagster/sensor_name"] == "ingest_requests"
    assert DocumentRegistry().fates([document_id])[0].door == "versions"
    latest = {
        asset: deployment.instance.get_latest_materialization_event(dg.AssetKey(asset))
        for asset in ("raw_documents", *STALE_AFTER_ENRICHMENT_CHANGE)
    }
    assert {
        asset for asset, event in latest.items() if event.run_id == run.run_id
    } == STALE_AFTER_ENRICHMENT_CHANGE
    enrichment = latest["image_enrichments"].asset_materialization
    assert enrichment.partition == document_id and enrichment.tags[CODE_VERSION_TAG] == new_version
    time.sleep(2 * TICK_SECONDS)  # the recorded versions now match the file: nothing more to re-run
    assert len(reenrich_runs(deployment)) == 1


def test_files_dropped_together_run_as_one_batch(deployment: Deployment):
    for number in range(3):
        (deployment.inbox / f"batch-{number}.pdf").write_bytes(PDF.read_bytes() + f"\n% {number}\n".encode())
    ids = {document_id_for(deployment.inbox / f"batch-{number}.pdf") for number in range(3)}

    def batch_run() -> dg.DagsterRun | None:
        for run in runs(deployment, **{"dagster/sensor_name": "ingest_requests"}):
            if (
                "dagster/asset_partition_range_start" in run.tags
                and run.status == dg.DagsterRunStatus.SUCCESS
            ):
                return run
            if run.status == dg.DagsterRunStatus.FAILURE:
                pytest.fail(f"run {run.run_id} failed")
        return None

    run = wait_for("the batch's run", batch_run, deployment, RUN_TIMEOUT)
    start, end = (
        run.tags["dagster/asset_partition_range_start"],
        run.tags["dagster/asset_partition_range_end"],
    )
    assert {start, end} <= ids and start != end
    wait_for(
        "the batch's documents to be recorded ingested",
        lambda: {fate.state for fate in DocumentRegistry().fates({start, end})} == {"ingested"},
        deployment,
        4 * TICK_SECONDS,
    )
    # the inbox takes RUNS_PER_TICK (2) files a tick: the third comes a tick later, in a run of its own
    # (until the inbox registered it, the registry has no fate of it: the other two alone said done)
    wait_for(
        "the third document to be recorded ingested",
        lambda: [fate.state for fate in DocumentRegistry().fates(ids)] == ["ingested"] * 3,
        deployment,
        RUN_TIMEOUT,
    )


def test_the_cli_waits_for_the_daemons_run_of_its_file(deployment: Deployment, tmp_path: Path):
    """With a daemon serving the instance, `vision-rag ingest` requests the file and waits for the
    run the daemon makes of it, instead of running it a second way."""
    path = tmp_path / "by-the-cli.pdf"
    path.write_bytes(PDF.read_bytes() + b"\n% the CLI's\n")
    done = subprocess.run(
        [sys.executable, "-m", "vision_rag_pipeline.cli", "ingest", str(path)],
        env=deployment.env,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT,
    )
    assert done.returncode == 0, done.stderr
    assert "the Dagster daemon runs 1 document(s)" in done.stderr and f"ok {path} (" in done.stderr
    # its run, alone or in a batch with documents another door requested in the same tick
    [run] = runs_covering(deployment, document_id_for(path))
    assert run.tags["dagster/sensor_name"] == "ingest_requests" and run.status == dg.DagsterRunStatus.SUCCESS


def test_a_deleted_file_leaves_the_partitions_and_both_indexes(deployment: Deployment, document_id: str):
    from vision_rag_pipeline.indexes.lexical_backend import open_lexical_index
    from vision_rag_pipeline.indexes.pgvector_store import PgVectorStore

    store, lexical = PgVectorStore(384), open_lexical_index()
    assert store.count(document_id) > 0 and lexical.count(document_id) > 0
    (deployment.inbox / PDF.name).unlink()

    def removed() -> bool:
        done = [run for run in deployment.instance.get_runs(dg.RunsFilter(job_name="remove_document"))]
        return any(run.status == dg.DagsterRunStatus.SUCCESS for run in done)

    wait_for("the removal run", removed, deployment, RUN_TIMEOUT)

    assert document_id not in deployment.instance.get_dynamic_partitions(documents_partitions.name)
    assert store.count(document_id) == 0 and lexical.count(document_id) == 0
    assert document_id not in {doc.document_id for doc in DocumentRegistry().all()}


def test_files_that_are_not_documents_are_named_in_the_tick_and_kept_in_the_registry(deployment: Deployment):
    (deployment.inbox / "empty.pdf").write_bytes(b"")
    (deployment.inbox / "report.pdf").write_bytes(b"PK\x03\x04" + bytes(300))  # a .docx renamed
    inbox = bytes(deployment.inbox.resolve())

    rejections = wait_for(
        "the inbox sensor to record why two files are skipped",
        lambda: (found := DocumentRegistry().inbox_rejections(inbox)) and len(found) == 2 and found,
        deployment,
        RUN_TIMEOUT,
    )
    assert {Path(path.decode()).name: why.reason for path, why in rejections.items()} == {
        "empty.pdf": "empty.pdf: empty file",
        "report.pdf": "report.pdf: a ZIP archive (a Word, Excel or PowerPoint file?), not an MHTML web archive or a PDF",
    }
    status = subprocess.run(
        [sys.executable, "-m", "vision_rag_pipeline.cli", "status"],
        env=deployment.env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert status.returncode == 1, status.stdout + status.stderr
    assert f"refused   {deployment.inbox.resolve()}/empty.pdf (" in status.stdout
    assert " via inbox, " in status.stdout and status.stdout.count("refused   ") == 2

    def logged(line: str) -> bool:
        return any(
            line in str(record.get("msg", ""))
            for tick in sensor_ticks(deployment, "inbox_sensor")[:10]
            for record in tick_log(deployment, tick)
        )

    line = f"skipped {deployment.inbox.resolve()}/empty.pdf: empty file"
    wait_for("the tick's log to say why", lambda: logged(line), deployment, RUN_TIMEOUT)
    counted = wait_for(
        "a tick that counts them",
        lambda: next(
            (t.skip_reason for t in sensor_ticks(deployment, "inbox_sensor") if t.skip_reason), None
        ),
        deployment,
        RUN_TIMEOUT,
    )
    assert "2 skipped (2 not documents" in counted, counted
    for name in ("empty.pdf", "report.pdf"):
        (deployment.inbox / name).unlink()


def test_a_drop_larger_than_a_tick_is_taken_over_the_next_ticks(deployment: Deployment):
    """Three files with two a tick: two requested in one tick, the third in a later one; none lost."""
    since = time.time()
    for number in range(3):  # PDFs to the sniffer, unreadable to the loader: their runs fail at once
        (deployment.inbox / f"drop-{number}.pdf").write_bytes(b"%%PDF-1.4\n%% drop %d\n%%%%EOF\n" % number)

    def requested() -> list[int] | None:
        news = [
            int(found.group(1))
            for tick in reversed(sensor_ticks(deployment, "inbox_sensor"))
            if tick.timestamp > since and (found := re.search(r": (\d+) new,", tick.skip_reason or ""))
        ]
        taken = [count for count in news if count]
        return taken if sum(taken) >= 3 else None

    assert wait_for("each dropped file requested", requested, deployment, RUN_TIMEOUT) == [2, 1]
    ids = [document_id_for(deployment.inbox / f"drop-{number}.pdf") for number in range(3)]
    fates = wait_for(
        "their runs",
        lambda: (found := DocumentRegistry().fates(ids)) and {f.state for f in found} == {"failed"} and found,
        deployment,
        RUN_TIMEOUT,
    )
    assert len(fates) == 3 and {fate.door for fate in fates} == {"inbox"}


def test_the_nightly_reindex_is_launched_by_the_scheduler(deployment: Deployment):
    run = finished_run(deployment, "the scheduled reindex", **{"dagster/schedule_name": "daily_reindex"})
    assert run.job_name == "reindex"


def test_no_sensor_or_schedule_tick_failed(deployment: Deployment):
    states = deployment.instance.all_instigator_state()
    assert {state.instigator_name for state in states} >= {
        "ingest_requests",
        "inbox_sensor",
        "version_sensor",
        "daily_reindex",
    }
    failed = {
        state.instigator_name: [tick.error.message for tick in ticks]
        for state in states
        if (
            ticks := deployment.instance.get_ticks(
                state.instigator_origin_id, state.selector_id, statuses=[TickStatus.FAILURE]
            )
        )
    }
    assert not failed


def test_a_cli_without_the_daemons_config_reads_the_home_file_says_they_differ_and_the_daemon_runs_it(
    deployment: Deployment, tmp_path: Path
):
    """The issue's case: `dagster dev` with VISION_RAG_CONFIG set, `vision-rag ingest` without it. The
    CLI says the two configs differ, naming both files; its file goes the one way in, so the daemon
    serving the instance runs it with the daemon's config: the index keeps one config."""
    from vision_rag_pipeline.core.config_in_use import last_config_used

    env = {name: value for name, value in deployment.env.items() if name != "VISION_RAG_CONFIG"}
    vision_rag = str(Path(sys.executable).parent / "vision-rag")
    home_config = Path(env["VISION_RAG_HOME"]) / "config.yaml"
    document = tmp_path / "from-the-cli.pdf"
    document.write_bytes(PDF.read_bytes() + b"\n% from the CLI\n")

    ingest = subprocess.run([vision_rag, "ingest", str(document)], env=env, capture_output=True, text=True)

    assert ingest.returncode == 0, ingest.stderr
    [said] = [
        line for line in ingest.stderr.splitlines() if "differs from the one the last runs used" in line
    ]
    assert str(home_config) in said and str(deployment.config) in said
    path = subprocess.run([vision_rag, "config", "path"], env=env, capture_output=True, text=True, check=True)
    assert path.stdout.strip() == str(home_config) and home_config.is_file()
    [run] = runs(deployment, **{"dagster/partition": document_id_for(document)})
    assert run.tags["dagster/sensor_name"] == "ingest_requests", "run by the daemon, not by the CLI"
    assert last_config_used().path == str(deployment.config), "with the daemon's config"
