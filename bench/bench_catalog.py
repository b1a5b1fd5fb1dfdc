"""A catalog of N documents and what it costs to keep it: sensor ticks under a real daemon, the asset
page's partition health, backfill requests turned into runs, and one more document's ingest.

    PYTHONPATH=$PWD .venv/bin/python bench/bench_catalog.py build --docs 100000 [--home /tmp/bench_catalog]
    PYTHONPATH=$PWD .venv/bin/python bench/bench_catalog.py ticks --seconds 600 [--change-config] [--drop 10000] [--code-server]
    PYTHONPATH=$PWD .venv/bin/python bench/bench_catalog.py ticks --seconds 300 --code-server --postgres-instance --request 2000
    PYTHONPATH=$PWD .venv/bin/python bench/bench_catalog.py version [--change-config] [--resume]
    PYTHONPATH=$PWD .venv/bin/python bench/bench_catalog.py sensors [--drop 2000]
    PYTHONPATH=$PWD .venv/bin/python bench/bench_catalog.py inbox [--rounds 3]
    PYTHONPATH=$PWD .venv/bin/python bench/bench_catalog.py range-run
    PYTHONPATH=$PWD .venv/bin/python bench/bench_catalog.py health [--rounds 3]
    PYTHONPATH=$PWD .venv/bin/python bench/bench_catalog.py backfill --seconds 300
    PYTHONPATH=$PWD .venv/bin/python bench/bench_catalog.py ingest-one [--rounds 3]

`build` is resumable (run it again after an interruption; it continues where it stopped) and makes the
catalog the way a user's would be made, through the project's one way in: N small PDFs (1,000 per
folder) are dropped into the inbox; `inbox_sensor` ticks request them (registry rows, partitions;
`--files-per-tick` of them a tick) and `ingest_requests` ticks claim them into batch runs, both called
as the daemon calls them; each batch is then recorded as its successful run would record it. Then
every partition gets one materialization of each of the 8 assets, written as runless events, 4,000
per batch, with the metadata and tags a real run recorded: one real `vision-rag ingest` of a sample
PDF first, whose events are the template (code versions in effect, data version = the file's
sha256), so a tick reads event bodies of a real run's size.

`ticks` starts a real `dagster-daemon` (its code server, sensors in threads as the instance says, at
most `--max-runs` runs executing at once) on the catalog for `--seconds` and reports each sensor's
tick durations (Dagster's own tick records: start to end, run submission included), the runs created,
the runs waiting in Dagster's queue every 15 s and the registry's unfinished documents.
`--change-config` edits the config file first (a setting that makes every partition's enrichments stale); `--drop N` writes N more files into the inbox first,
one-page PDFs of a line of text each, which the daemon's runs ingest (the report gives their states
at the end of each minute and their partitions materialized; the files, their registry rows,
partitions, chunks and lexical entries are removed afterwards, and the runs left queued). `--code-server`: the daemon loads the
code location from one `dagster code-server` started first, for its whole life, as `dagster dev` and
docker-compose.yml run it; without it, from the code server `dagster-daemon run -m` starts itself
and replaces every minute. `--postgres-instance`: the daemon serves a Dagster instance whose
storages are Postgres (a database of the catalog's embedded server, `dagster_postgres/` beside the
local instance, made on first use: the catalog's partitions added in registration order, its
version_sensor pointed at the catalog's recorded versions; its event log holds no materialization).
`--request N`: the catalog's first N documents are requested as a backfill first (put back to
ingested afterwards).
`version` calls `version_sensor` in this process as the daemon does, tick after tick with its cursor,
from an empty cursor (a new sensor on an existing catalog reads every materialization once) until a
tick finds nothing new, then 5 more (`--resume`: from the cursor the last `version` left, the
catalog it read); with `--change-config` the code location loads an edited config first, and the
ticks request re-runs in the registry (no daemon runs them: this measures the sensor alone).
`sensors` calls the sensors in this process at the catalog's scale: version_sensor until everything
stale is requested and 5 quiet ticks followed, inbox_sensor over the unchanged inbox, and with `--drop
N` the registration of N new files tick by tick (removed afterwards).
`inbox` calls inbox_sensor over the unchanged inbox `--rounds` times in this process (wall and CPU
of each tick). `range-run` creates one run of `ingest_document` over 20 consecutive partitions in
this process, as the daemon creates a sensor's batch run (execution plan, run record, planned
events), prints its wall and CPU time and how often every partition key was loaded, and deletes it.
`health` times the asset page's partition-health query (the UI's `PartitionHealthQuery`) against a
fresh `dagster-webserver`: the first answer cold, then warm. `backfill` requests every partition with
`vision-rag backfill --submit`, then runs a daemon for `--seconds` and counts the runs its
`ingest_requests` sensor creates and the documents they cover. `ingest-one` times `vision-rag ingest`
of one new one-page text PDF (no image: its cost is almost all bookkeeping) into the catalog,
`--rounds` times: Dagster's run stats (start to end) and the whole command.

The catalog's partitions have no stored asset values, so the runs a measurement starts for them fail
loading their inputs; tick figures do not depend on that. A drop's runs ingest their new files.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SAMPLE = REPO / "vision_rag_pipeline" / "samples" / "larkspur_q3_2024_operations_review.pdf"
FILES_PER_FOLDER = 1000
RANGE_START, RANGE_END = "dagster/asset_partition_range_start", "dagster/asset_partition_range_end"
EVENTS_PER_BATCH = 4000
LOCATION = "vision_rag_pipeline.definitions"  # the code location's name, however it is loaded
CODE_SERVER_PORT = 4266
PG_DAGSTER_DATABASE = "dagster_bench"  # ticks --postgres-instance: the Dagster storage's database
QUEUE_SAMPLE_S = 15.0


def environment(home: Path) -> dict[str, str]:
    env = os.environ | {
        "PYTHONPATH": str(REPO),
        "VISION_RAG_HOME": str(home),
        "DAGSTER_HOME": str(home / "dagster"),
        "VISION_RAG_INBOX": str(home / "inbox"),
        "VISION_RAG_INBOX_SETTLE_SECONDS": "0",
    }
    for name in (
        "OPENAI_API_KEY",
        "OPENAI_BASE_URL",
        "AZURE_OPENAI_API_KEY",
        "VISION_RAG_CONFIG",
        "VISION_RAG_PG_URL",
    ):
        env.pop(name, None)
    return env


def progress_file(home: Path) -> Path:
    return home / "bench_progress.json"


def load_progress(home: Path) -> dict:
    path = progress_file(home)
    return json.loads(path.read_text()) if path.exists() else {}


def save_progress(home: Path, progress: dict) -> None:
    partial = progress_file(home).with_suffix(".partial")
    partial.write_text(json.dumps(progress))
    os.replace(partial, progress_file(home))


def file_path(home: Path, number: int) -> Path:
    return home / "inbox" / f"batch-{number // FILES_PER_FOLDER:04d}" / f"report-{number:06d}.pdf"


def write_files(home: Path, first: int, count: int, readable: bool = False) -> None:
    """Files `first`.. in the inbox, each its own bytes: stubs with a PDF header (the catalog's: its
    values are written by `build`, never by a run), or `readable` one-page PDFs a run ingests."""
    for number in range(first, first + count):
        path = file_path(home, number)
        if number % FILES_PER_FOLDER == 0 or number == first:
            path.parent.mkdir(parents=True, exist_ok=True)
        if not path.exists():
            path.write_bytes(
                one_page_pdf(f"Report {number}: shipments to depot {number % 97} rose {number % 13} percent.")
                if readable
                else b"%%PDF-1.4\n%% document %d\n%%%%EOF\n" % number
            )


def vision_rag(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "vision_rag_pipeline.cli", *args], env=env, capture_output=True, text=True
    )


# --- build ------------------------------------------------------------------------------------------------


def build(home: Path, docs: int, files_per_tick: int) -> None:
    env = environment(home)
    os.environ.update(env | {"VISION_RAG_SENSOR_RUNS_PER_TICK": str(files_per_tick)})
    progress = load_progress(home)
    if progress.get("docs", docs) != docs:
        sys.exit(f"{home} holds a catalog of {progress['docs']} documents; use another --home")
    progress["docs"] = docs
    if not progress.get("files_written"):
        started = time.perf_counter()
        write_files(home, 0, docs)
        progress |= {"files_written": True, "write_files_s": round(time.perf_counter() - started, 1)}
        save_progress(home, progress)
    if not progress.get("template"):
        template = home / "template" / SAMPLE.name
        template.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(SAMPLE, template)
        done = vision_rag("ingest", str(template), "--json", env=env)
        if done.returncode:
            sys.exit(f"template ingest failed: {done.stderr[-2000:]}")
        progress["template"] = str(template)
        save_progress(home, progress)
    if not progress.get("registered"):
        progress |= register(home)
        save_progress(home, progress)
    materialize(home, progress)
    print(json.dumps(progress, indent=2))


def register(home: Path) -> dict:
    """inbox_sensor and ingest_requests ticks, called as the daemon calls them, until the inbox is
    registered: the inbox requests its new files (registry rows, partitions), ingest_requests claims
    them into batch runs, and each batch is then recorded as a run that succeeded records it (its
    documents `ingested`); the runs themselves are not executed (`materialize` writes their events)."""
    import dagster as dg

    from vision_rag_pipeline.defs.definitions import defs
    from vision_rag_pipeline.defs.inbox import inbox_sensor
    from vision_rag_pipeline.defs.intake import ingest_requests
    from vision_rag_pipeline.defs.resources import IndexDatabase
    from vision_rag_pipeline.defs.runner import dagster_instance
    from vision_rag_pipeline.documents.registry import DocumentRegistry

    instance = dagster_instance()
    registry = DocumentRegistry()
    cursor, inbox_s, requests_s, runs = None, [], [], 0
    while True:
        context = dg.build_sensor_context(
            instance=instance, cursor=cursor, resources={"index_db": IndexDatabase()}, definitions=defs
        )
        started = time.perf_counter()
        inbox_sensor(context)
        inbox_s.append(time.perf_counter() - started)
        cursor = context.cursor
        waiting = registry.waiting("inbox")
        if not waiting:
            break
        while True:
            context = dg.build_sensor_context(
                instance=instance, resources={"index_db": IndexDatabase()}, definitions=defs
            )
            started = time.perf_counter()
            result = ingest_requests(context)
            requests_s.append(time.perf_counter() - started)
            if not result.run_requests:
                break
            for request in result.run_requests:
                registry.finish([request.run_key], registry.of_run([request.run_key]), "ingested")
            runs += len(result.run_requests)
        print(f"inbox tick {len(inbox_s)}: {waiting} files requested in {inbox_s[-1]:.1f} s", flush=True)
    return {
        "registered": True,
        "inbox_ticks": len(inbox_s),
        "inbox_tick_s_median": round(statistics.median(inbox_s), 2),
        "inbox_tick_s_max": round(max(inbox_s), 2),
        "ingest_requests_ticks": len(requests_s),
        "ingest_requests_tick_s_median": round(statistics.median(requests_s), 2) if requests_s else None,
        "batch_runs_requested": runs,
    }


def materialize(home: Path, progress: dict) -> None:
    """One materialization of each asset per partition, as runless events with a real run's metadata."""
    import dagster as dg
    from dagster._core.events import DagsterEvent, DagsterEventType, StepMaterializationData
    from dagster._core.events.log import EventLogEntry
    from dagster._core.instance.utils import RUNLESS_JOB_NAME, RUNLESS_RUN_ID  # a bench may write in bulk

    from vision_rag_pipeline.defs.partitions import documents_partitions
    from vision_rag_pipeline.defs.runner import dagster_instance
    from vision_rag_pipeline.documents.registry import DocumentRegistry, document_id_for

    instance = dagster_instance()
    template_id = document_id_for(progress["template"])
    keys = [dg.AssetKey(name) for name in ASSETS]
    templates = {
        key: instance.fetch_materializations(
            dg.AssetRecordsFilter(asset_key=key, asset_partitions=[template_id]), limit=1
        )
        .records[0]
        .asset_materialization
        for key in keys
    }
    partitions = sorted(set(instance.get_dynamic_partitions(documents_partitions.name)) - {template_id})
    done = progress.get("materialized", 0)
    registry = DocumentRegistry()
    started = time.perf_counter()
    per_batch = EVENTS_PER_BATCH // len(keys)
    for first in range(done, len(partitions), per_batch):
        batch = partitions[first : first + per_batch]
        shas = registry.content_sha256(batch)
        entries = []
        for partition in batch:
            for key in keys:
                template = templates[key]
                tags = dict(template.tags or {})
                if "dagster/data_version" in tags:
                    tags["dagster/data_version"] = shas.get(partition, tags["dagster/data_version"])
                materialization = dg.AssetMaterialization(
                    asset_key=key, partition=partition, metadata=template.metadata, tags=tags
                )
                event = DagsterEvent(
                    event_type_value=DagsterEventType.ASSET_MATERIALIZATION.value,
                    job_name=RUNLESS_JOB_NAME,
                    event_specific_data=StepMaterializationData(materialization),
                )
                entries.append(
                    EventLogEntry(
                        user_message="",
                        level=20,
                        job_name=RUNLESS_JOB_NAME,
                        run_id=RUNLESS_RUN_ID,
                        error_info=None,
                        timestamp=time.time(),
                        dagster_event=event,
                    )
                )
        instance.event_log_storage.store_event_batch(entries)
        progress["materialized"] = first + len(batch)
        save_progress(home, progress)
        rate = (progress["materialized"] - done) / (time.perf_counter() - started)
        print(
            f"materialized {progress['materialized']} of {len(partitions)} ({rate:.0f} partitions/s)",
            flush=True,
        )


ASSETS = (
    "raw_documents",
    "extracted_images",
    "image_verdicts",
    "image_enrichments",
    "document_chunks",
    "chunk_embeddings",
    "pgvector_index",
    "lexical_index",
)


# --- a real daemon ----------------------------------------------------------------------------------------


class Daemon:
    """`dagster-daemon run` on the catalog, in its own process group (stopped with what it started),
    executing at most `max_runs` runs at once: the machine is shared, and the catalog's runs fail
    anyway (its partitions have no stored values), so they only add load. The instance file is
    restored when it stops.

    By default the daemon starts its own code server and replaces it every minute, as `dagster-daemon
    run -m` does. `code_server`: it loads the code location from one `dagster code-server` started
    first, which serves the sensors for the daemon's whole life, as under `dagster dev` and in
    docker-compose.yml."""

    def __init__(self, home: Path, env: dict[str, str], max_runs: int, code_server: bool = False) -> None:
        import yaml

        self.instance_yaml = Path(env["DAGSTER_HOME"]) / "dagster.yaml"
        self.instance_text = self.instance_yaml.read_text()
        instance = yaml.safe_load(self.instance_text)
        instance["concurrency"]["runs"]["max_concurrent_runs"] = max_runs
        self.instance_yaml.write_text(yaml.safe_dump(instance))  # no header: vision-rag leaves it as it is
        self.log = (home / "daemon.log").open("ab")
        self.processes: list[subprocess.Popen] = []
        target = ["-m", LOCATION]
        if code_server:
            self.start(
                "dagster",
                ["code-server", "start", *target, "--location-name", LOCATION, "-p", str(CODE_SERVER_PORT)],
                home,
                env,
            )
            self.wait_for_code_server(env)
            workspace = home / "workspace_code_server.yaml"
            location = {"host": "127.0.0.1", "port": CODE_SERVER_PORT, "location_name": LOCATION}
            workspace.write_text(yaml.safe_dump({"load_from": [{"grpc_server": location}]}))
            target = ["-w", str(workspace)]
        self.start("dagster-daemon", ["run", *target], home, env)

    def start(self, executable: str, args: list[str], home: Path, env: dict[str, str]) -> None:
        self.processes.append(
            subprocess.Popen(
                [str(Path(sys.executable).parent / executable), *args],
                cwd=home,
                env=env,
                stdout=self.log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
            )
        )

    @staticmethod
    def wait_for_code_server(env: dict[str, str]) -> None:
        deadline = time.monotonic() + 300
        while subprocess.run(
            [
                str(Path(sys.executable).parent / "dagster"),
                "api",
                "grpc-health-check",
                "-p",
                str(CODE_SERVER_PORT),
            ],
            env=env,
            capture_output=True,
        ).returncode:
            if time.monotonic() > deadline:
                sys.exit("the code server did not answer within 300 s (daemon.log)")
            time.sleep(1)

    def stop(self) -> None:
        for process in reversed(self.processes):  # the daemon first: its code server outlives it
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGINT)
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        self.log.close()
        self.instance_yaml.write_text(self.instance_text)


def sensor_ticks(instance, since: float) -> dict[str, list]:  # noqa: ANN001
    ticks = {}
    for state in instance.all_instigator_state():
        found = instance.get_ticks(state.instigator_origin_id, state.selector_id, after=since)
        ticks[state.instigator_name] = [t for t in found if t.end_timestamp]
    return ticks


def tick_report(ticks: list) -> dict:  # noqa: ANN001
    seconds = sorted(t.end_timestamp - t.timestamp for t in ticks)
    if not seconds:
        return {"ticks": 0}
    return {
        "ticks": len(seconds),
        "median_s": round(statistics.median(seconds), 2),
        "max_s": round(seconds[-1], 2),
        "failed": sum(1 for t in ticks if t.status.value == "FAILURE"),
        "runs_requested": sum(len(t.run_ids) for t in ticks),
        "last_skip": next((t.skip_reason for t in ticks if t.skip_reason), None),
    }


def adopt_version_cursor(home: Path, env: dict[str, str], instance) -> None:  # noqa: ANN001
    """Hand the cursor `version` left (the catalog it read, where it stopped) to the daemon's
    version_sensor once, through Dagster's `dagster sensor cursor --set`, so its ticks start where
    that catch-up ended instead of reading 800,000 materializations again. `cursor --set` on a sensor
    with no stored state stores it stopped, so `sensor start` follows (it keeps the cursor)."""
    saved = home / "version_cursor.json"
    if not saved.exists() or not saved.read_text():
        return
    for command in (("cursor", "version_sensor", "--set", saved.read_text()), ("start", "version_sensor")):
        done = subprocess.run(
            [
                str(Path(sys.executable).parent / "dagster"),
                *("sensor", *command, "-m", "vision_rag_pipeline.definitions"),
            ],
            env=env,
            cwd=home,
            capture_output=True,
            text=True,
        )
        if done.returncode:
            sys.exit(f"dagster sensor {command[0]} failed: {done.stderr[-1000:]}")
    saved.rename(saved.with_suffix(".adopted"))


def drop_files(home: Path, count: int) -> int:
    """Write `count` new one-page PDFs into the inbox, numbered where no build writes; returns the
    first number."""
    first = load_progress(home)["docs"] + 1_000_000
    write_files(home, first, count, readable=True)
    return first


def dropped_paths(home: Path, first: int, count: int) -> list[str]:
    return [str(file_path(home, number)) for number in range(first, first + count)]


def on_dropped(home: Path, first: int, count: int, sql: str) -> list[tuple]:
    """The rows of `sql` (a statement on the registry, `%s` = the dropped files' paths)."""
    from vision_rag_pipeline.core.postgres import connect

    with connect() as conn:
        return conn.execute(sql, (dropped_paths(home, first, count),)).fetchall()


def remove_dropped(home: Path, instance, first: int, count: int) -> None:  # noqa: ANN001
    """The catalog as built again: the dropped files, their registry rows and partitions go, and what
    their runs wrote (chunks, lexical entries, stored values), as `remove_document` deletes them."""
    from vision_rag_pipeline.defs.io_manager import delete_partition_values
    from vision_rag_pipeline.defs.partitions import documents_partitions
    from vision_rag_pipeline.indexes.lexical_backend import open_lexical_index
    from vision_rag_pipeline.indexes.pgvector_store import delete_document_rows

    rows = on_dropped(
        home,
        first,
        count,
        "DELETE FROM documents WHERE source_path = ANY(%s) RETURNING document_id, state, attempts",
    )
    lexical = open_lexical_index()
    for document_id, state, attempts in rows:
        if state != "requested" or attempts:  # a run took it: it may have written rows
            delete_document_rows(document_id)
            lexical.delete_document(document_id)
            delete_partition_values(document_id)
        instance.delete_dynamic_partition(documents_partitions.name, document_id)
    lexical.close()
    for folder in {Path(path).parent for path in dropped_paths(home, first, count)}:
        shutil.rmtree(folder)


def postgres_dagster_home(home: Path) -> Path:
    """A Dagster home beside the catalog's whose storages are Postgres, as docker/dagster.yaml has them
    (database PG_DAGSTER_DATABASE of the catalog's embedded server), with the local instance's run
    coordinator, sensor threads and concurrency."""
    from urllib.parse import parse_qs, urlparse

    import psycopg
    import yaml

    from vision_rag_pipeline.core.postgres import database_url

    url = database_url()  # the catalog's embedded server: postgresql://postgres:@/postgres?host=<pgdata>
    with psycopg.connect(url, autocommit=True) as conn:
        exists = conn.execute(
            "SELECT 1 FROM pg_database WHERE datname = %s", (PG_DAGSTER_DATABASE,)
        ).fetchone()
        if not exists:
            conn.execute(f"CREATE DATABASE {PG_DAGSTER_DATABASE}")
    socket_dir = parse_qs(urlparse(url).query)["host"][0]
    dagster_home = home / "dagster_postgres"
    dagster_home.mkdir(exist_ok=True)
    config = yaml.safe_load((home / "dagster" / "dagster.yaml").read_text())
    for storage in ("run_storage", "event_log_storage", "schedule_storage"):
        config.pop(storage)
    config["storage"] = {
        "postgres": {
            "postgres_url": f"postgresql+psycopg2://postgres@/{PG_DAGSTER_DATABASE}?host={socket_dir}"
        }
    }
    config["compute_logs"]["config"]["base_dir"] = str(dagster_home / "storage")
    (dagster_home / "dagster.yaml").write_text(yaml.safe_dump(config))
    return dagster_home


def catalog_on_postgres(home: Path, env: dict[str, str], instance) -> None:  # noqa: ANN001
    """The Postgres-backed instance gets the catalog's partitions (its registry's documents, in the order
    they were registered) once, and its version_sensor the version catalog the local instance's
    sensor keeps (the one touched last) with nothing read: its event log holds no materialization, so
    its ticks compare the catalog's 100,000 partitions' recorded versions without reading 800,000
    events first."""
    from vision_rag_pipeline.core.postgres import connect
    from vision_rag_pipeline.defs.partitions import documents_partitions

    if instance.get_dynamic_partitions(documents_partitions.name):
        return
    with connect() as conn:
        ids = [
            row[0]
            for row in conn.execute(
                "SELECT document_id FROM documents WHERE content IS NOT NULL ORDER BY registered_at, document_id"
            )
        ]
        (catalog,) = conn.execute(
            "SELECT catalog FROM version_catalogs ORDER BY touched_at DESC LIMIT 1"
        ).fetchone()
    for first in range(0, len(ids), 10_000):
        instance.add_dynamic_partitions(documents_partitions.name, ids[first : first + 10_000])
    (home / "version_cursor.json").write_text(json.dumps({"catalog": catalog, "after": {}}))
    adopt_version_cursor(home, env, instance)


def run_daemon(
    home: Path,
    seconds: float,
    change_config: bool,
    drop: int,
    max_runs: int,
    code_server: bool,
    postgres_instance: bool = False,
    request: int = 0,
) -> None:
    env = environment(home)
    os.environ.update(env)
    if postgres_instance:
        env["DAGSTER_HOME"] = os.environ["DAGSTER_HOME"] = str(postgres_dagster_home(home))
    from vision_rag_pipeline.defs.intake import request_documents
    from vision_rag_pipeline.defs.runner import dagster_instance

    instance = dagster_instance()
    if postgres_instance:
        catalog_on_postgres(home, env, instance)
    doors = first_documents(request) if request else {}
    requested = request_documents(instance, list(doors), "backfill") if doors else []
    if change_config:
        config = home / "config.yaml"
        keywords = 6 if "max_keywords: 5" in config.read_text() else 5
        config.write_text(f"id: default\nmedia_enrichment: {{fusion: {{max_keywords: {keywords}}}}}\n")
    first = drop_files(home, drop) if drop else 0
    adopt_version_cursor(home, env, instance)
    since = time.time()
    load = os.getloadavg()
    daemon = Daemon(home, env, max_runs, code_server)
    minutes: list[dict[str, int]] = []  # the dropped documents' states at the end of each minute
    waiting: list[int] = []  # the runs waiting in Dagster's queue, every QUEUE_SAMPLE_S
    try:
        minute_ends = since + 60
        while (left := since + seconds - time.time()) > 0:
            time.sleep(min(QUEUE_SAMPLE_S, left))
            waiting.append(waiting_runs(instance))
            if drop and (time.time() >= minute_ends or left <= QUEUE_SAMPLE_S):
                minutes.append(dropped_states(home, first, drop))
                minute_ends += 60
    finally:
        daemon.stop()
    ticks = sensor_ticks(instance, since)
    registry = registry_states()
    runs = runs_since(instance, since)  # before the dropped partitions go: it reads their order
    delete_unfinished_runs(instance, since)
    if drop:
        materialized = dropped_materialized(home, instance, first, drop)
        remove_dropped(home, instance, first, drop)
    if doors:
        put_back_as_ingested(doors)
    report = {
        "seconds": seconds,
        "instance": "Postgres" if postgres_instance else "local (SQLite)",
        "change_config": change_config,
        "drop": drop,
        "requested": len(requested),
        "max_runs": max_runs,
        "load_average_at_start": [round(x, 2) for x in load],
        "load_average_at_end": [round(x, 2) for x in os.getloadavg()],
        "sensors": {name: tick_report(found) for name, found in ticks.items()},
        "code_server": "one for the daemon's life"
        if code_server
        else "the daemon's own, replaced every minute",
        "runs_created_and_documents_in_them": runs,
        f"runs_waiting_in_the_queue_every_{QUEUE_SAMPLE_S:.0f}_s": waiting,
        "registry": registry,
    }
    if drop:
        report["dropped_documents_by_minute"] = minutes
        report["dropped_partitions_materialized"] = materialized
    print(json.dumps(report, indent=2))


def waiting_runs(instance) -> int:  # noqa: ANN001
    """Runs waiting in Dagster's queue: queued, or created and not submitted yet."""
    import dagster as dg

    statuses = [dg.DagsterRunStatus.QUEUED, dg.DagsterRunStatus.NOT_STARTED]
    return instance.get_runs_count(dg.RunsFilter(statuses=statuses))


def first_documents(count: int) -> dict[str, str]:
    """{document: the door it came through} of the catalog's first `count` documents, in registration
    (partition) order."""
    from vision_rag_pipeline.core.postgres import connect

    with connect() as conn:
        rows = conn.execute(
            "SELECT document_id, door FROM documents WHERE state = 'ingested' AND content IS NOT NULL"
            " ORDER BY registered_at, document_id LIMIT %s",
            (count,),
        ).fetchall()
    return dict(rows)


def put_back_as_ingested(doors: dict[str, str]) -> None:
    """The catalog as it was ({document: its door}): re-runs of its partitions, which hold no stored
    values, only fail."""
    from vision_rag_pipeline.core.postgres import connect

    with connect() as conn, conn.cursor() as cursor:
        cursor.executemany(
            "UPDATE documents SET state = 'ingested', door = %s, reason = NULL, attempts = 0, job = %s,"
            " not_before = NULL, run_key = NULL, run_id = NULL, owner = NULL WHERE document_id = %s",
            [(door, "ingest_document", document_id) for document_id, door in doors.items()],
        )


def dropped_states(home: Path, first: int, count: int) -> dict[str, int]:
    """{state: documents} of the dropped files in the registry, "unregistered" for those it has not."""
    sql = "SELECT coalesce(state, '-'), count(*) FROM documents WHERE source_path = ANY(%s) GROUP BY 1"
    states = dict(on_dropped(home, first, count, sql))
    return states | {"unregistered": count - sum(states.values())}


def dropped_materialized(home: Path, instance, first: int, count: int) -> dict[str, int]:  # noqa: ANN001
    """{asset: dropped partitions materialized}, from the instance's records."""
    import dagster as dg

    ids = {
        row[0]
        for row in on_dropped(
            home, first, count, "SELECT document_id FROM documents WHERE source_path = ANY(%s)"
        )
    }
    return {name: len(ids & set(instance.get_materialized_partitions(dg.AssetKey(name)))) for name in ASSETS}


def delete_unfinished_runs(instance, since: float) -> None:  # noqa: ANN001
    """The runs the stopped daemon left queued or started: a later daemon would launch them."""
    import dagster as dg

    statuses = [
        dg.DagsterRunStatus.QUEUED,
        dg.DagsterRunStatus.NOT_STARTED,
        dg.DagsterRunStatus.STARTING,
        dg.DagsterRunStatus.STARTED,
    ]
    created = dt.datetime.fromtimestamp(since, dt.UTC)
    for run in instance.get_runs(dg.RunsFilter(created_after=created, statuses=statuses)):
        instance.delete_run(run.run_id)


def runs_since(instance, since: float) -> tuple[int, int]:  # noqa: ANN001
    """Runs created since `since` (epoch seconds), and the documents they cover (a batch: its range)."""
    import dagster as dg

    from vision_rag_pipeline.defs.partitions import documents_partitions

    order = {key: i for i, key in enumerate(instance.get_dynamic_partitions(documents_partitions.name))}
    runs = instance.get_runs(dg.RunsFilter(created_after=dt.datetime.fromtimestamp(since, dt.UTC)))
    documents = 0
    for run in runs:
        start, end = run.tags.get(RANGE_START), run.tags.get(RANGE_END)
        documents += order[end] - order[start] + 1 if start in order and end in order else 1
    return len(runs), documents


def registry_states() -> dict[str, int]:
    """{"state door": documents} of the registry, the ingested ones left out."""
    from vision_rag_pipeline.core.postgres import connect

    with connect() as conn:
        rows = conn.execute(
            "SELECT coalesce(state, '-') || ' ' || coalesce(door, '-'), count(*) FROM documents"
            " WHERE state IS DISTINCT FROM 'ingested' GROUP BY 1 ORDER BY 1"
        ).fetchall()
    return dict(rows)


def version_ticks(home: Path, change_config: bool, resume: bool) -> None:
    env = environment(home)
    os.environ.update(env)
    if change_config:
        config = home / "config.yaml"
        keywords = 6 if "max_keywords: 5" in config.read_text() else 5
        config.write_text(f"id: default\nmedia_enrichment: {{fusion: {{max_keywords: {keywords}}}}}\n")
    import dagster as dg

    from vision_rag_pipeline.defs.definitions import defs
    from vision_rag_pipeline.defs.runner import dagster_instance
    from vision_rag_pipeline.defs.version_sensor import version_sensor
    from vision_rag_pipeline.documents.registry import DocumentRegistry

    instance = dagster_instance()
    registry = DocumentRegistry()
    saved = [
        path for path in (home / "version_cursor.json", home / "version_cursor.adopted") if path.exists()
    ]
    cursor = max(saved, key=lambda path: path.stat().st_mtime).read_text() if resume and saved else None
    ticks, settled = [], 0
    while settled < 6:
        context = dg.build_sensor_context(instance=instance, cursor=cursor, definitions=defs)
        before = registry.waiting("versions")
        started = time.perf_counter()
        result = version_sensor(context)
        seconds = time.perf_counter() - started
        cursor = context.cursor
        requested = registry.waiting("versions") - before
        reason = result.skip_reason.skip_message if result.skip_reason else ""
        ticks.append({"s": round(seconds, 2), "requested": requested, "skip": reason[:120]})
        print(json.dumps(ticks[-1]), flush=True)
        reading = reason.startswith("reading the materializations")
        settled = 0 if reading else settled + 1
        if requested and settled >= 6:
            break
    (home / "version_cursor.json").write_text(cursor or "")
    catch_up = [t["s"] for t in ticks if t["skip"].startswith("reading")]
    steady = [t["s"] for t in ticks if not t["skip"].startswith("reading")]
    print(
        json.dumps(
            {
                "catch_up_ticks": len(catch_up),
                "catch_up_tick_s_max": max(catch_up, default=0),
                "tick_s_median_after": round(statistics.median(steady), 2),
                "tick_s_max_after": max(steady),
                "requested_per_tick": [t["requested"] for t in ticks if not t["skip"].startswith("reading")],
            },
            indent=2,
        )
    )


def sensors_in_process(home: Path, drop: int) -> None:
    """The sensors' own work at this scale, called in this process as the daemon calls them (no run
    submission): version_sensor from the cursor `version` left until everything stale is requested and
    5 quiet ticks followed, inbox_sensor over the unchanged inbox (3 ticks), and, with `--drop N`, N
    new files registered tick by tick, `ingest_requests` ticked after each and its batches recorded
    ingested; the dropped files are removed afterwards, so the catalog stays as built."""
    env = environment(home)
    os.environ.update(env)
    import dagster as dg

    from vision_rag_pipeline.core.postgres import connect
    from vision_rag_pipeline.defs.definitions import defs
    from vision_rag_pipeline.defs.inbox import inbox_sensor
    from vision_rag_pipeline.defs.intake import ingest_requests
    from vision_rag_pipeline.defs.resources import IndexDatabase
    from vision_rag_pipeline.defs.runner import dagster_instance
    from vision_rag_pipeline.defs.version_sensor import version_sensor
    from vision_rag_pipeline.documents.registry import DocumentRegistry

    instance = dagster_instance()
    registry = DocumentRegistry()

    def context(cursor: str | None = None) -> dg.SensorEvaluationContext:
        return dg.build_sensor_context(
            instance=instance, cursor=cursor, definitions=defs, resources={"index_db": IndexDatabase()}
        )

    def timed(sensor, cursor: str | None = None) -> tuple[float, object, str | None]:  # noqa: ANN001
        built = context(cursor)
        started = time.perf_counter()
        result = sensor(built)
        return time.perf_counter() - started, result, built.cursor

    report: dict = {"load_average_at_start": [round(x, 2) for x in os.getloadavg()]}
    saved = [
        path for path in (home / "version_cursor.json", home / "version_cursor.adopted") if path.exists()
    ]
    cursor = max(saved, key=lambda path: path.stat().st_mtime).read_text() if saved else None
    requesting, quiet = [], []
    while len(quiet) < 5:
        seconds, result, cursor = timed(version_sensor, cursor)
        said = result.skip_reason.skip_message if result.skip_reason else ""
        (quiet if said.endswith("(no new materialization since)") else requesting).append(seconds)
    report["version_sensor"] = {
        "comparing_ticks": len(requesting),
        "comparing_s_median": round(statistics.median(requesting), 2),
        "comparing_s_max": round(max(requesting), 2),
        "quiet_s_median": round(statistics.median(quiet), 2),
    }
    unchanged = [timed(inbox_sensor)[0] for _ in range(3)]
    report["inbox_unchanged_s"] = [round(x, 2) for x in unchanged]
    if drop:
        first = drop_files(home, drop)
        ticks, requests, inbox_cursor = [], [], None
        while True:
            seconds, _, inbox_cursor = timed(inbox_sensor, inbox_cursor)
            ticks.append(seconds)
            if not registry.waiting("inbox"):
                break
            seconds, result, _ = timed(ingest_requests)
            requests.append(seconds)
            for request in result.run_requests:
                registry.finish([request.run_key], registry.of_run([request.run_key]), "ingested")
            with connect() as conn:  # the batches it left for later ticks: as if they had run too
                conn.execute(
                    "UPDATE documents SET state = 'ingested' WHERE door = 'inbox' AND state = 'requested'"
                )
        report["drop"] = {
            "files": drop,
            "inbox_ticks": len(ticks),
            "inbox_s_median": round(statistics.median(ticks), 2),
            "inbox_s_max": round(max(ticks), 2),
            "ingest_requests_s_median": round(statistics.median(requests), 2),
        }
        remove_dropped(home, instance, first, drop)
    report["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    print(json.dumps(report, indent=2))


def inbox_ticks(home: Path, rounds: int) -> None:
    env = environment(home)
    os.environ.update(env)
    import dagster as dg

    from vision_rag_pipeline.defs.definitions import defs
    from vision_rag_pipeline.defs.inbox import inbox_sensor
    from vision_rag_pipeline.defs.resources import IndexDatabase
    from vision_rag_pipeline.defs.runner import dagster_instance

    instance = dagster_instance()
    ticks = []
    for _ in range(rounds):
        context = dg.build_sensor_context(
            instance=instance, definitions=defs, resources={"index_db": IndexDatabase()}
        )
        wall, cpu = time.perf_counter(), time.process_time()
        inbox_sensor(context)
        ticks.append(
            {"s": round(time.perf_counter() - wall, 2), "cpu_s": round(time.process_time() - cpu, 2)}
        )
    print(json.dumps({"load_average": [round(x, 2) for x in os.getloadavg()], "ticks": ticks}, indent=2))


def range_run(home: Path) -> None:
    env = environment(home)
    os.environ.update(env)
    from vision_rag_pipeline.defs.definitions import defs
    from vision_rag_pipeline.defs.intake import RANGE_END_TAG, RANGE_START_TAG
    from vision_rag_pipeline.defs.jobs import ingest_document_job
    from vision_rag_pipeline.defs.partitions import documents_partitions
    from vision_rag_pipeline.defs.runner import dagster_instance

    instance = dagster_instance()
    storage = type(instance.event_log_storage)
    loads = []
    load = storage.get_dynamic_partitions

    def counted(self, name: str):  # noqa: ANN001, ANN202
        loads.append(name)
        return load(self, name)

    storage.get_dynamic_partitions = counted  # type: ignore[method-assign]
    keys = load(instance.event_log_storage, documents_partitions.name)
    middle = len(keys) // 2
    job = defs.resolve_job_def(ingest_document_job.name)
    loads.clear()
    wall, cpu = time.perf_counter(), time.process_time()
    run = instance.create_run_for_job(
        job, tags={RANGE_START_TAG: keys[middle], RANGE_END_TAG: keys[middle + 19]}
    )
    report = {
        "partitions": len(keys),
        "create_run_s": round(time.perf_counter() - wall, 2),
        "create_run_cpu_s": round(time.process_time() - cpu, 2),
        "key_loads": len(loads),
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }
    instance.delete_run(run.run_id)
    print(json.dumps(report, indent=2))


# --- the asset page ---------------------------------------------------------------------------------------

PARTITION_HEALTH_QUERY = """
query PartitionHealthQuery($assetKey: AssetKeyInput!) {
  assetNodeOrError(assetKey: $assetKey) {
    ... on AssetNode {
      id
      partitionKeysByDimension { name type partitionKeys }
      assetPartitionStatuses {
        ... on TimePartitionStatuses { ranges { status startTime endTime startKey endKey } }
        ... on DefaultPartitionStatuses { materializedPartitions materializingPartitions failedPartitions }
        ... on MultiPartitionStatuses { primaryDimensionName }
      }
    }
  }
}
"""


def graphql(port: int, query: str, variables: dict) -> tuple[float, int, dict]:
    body = json.dumps({"query": query, "variables": variables}).encode()
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/graphql", data=body, headers={"Content-Type": "application/json"}
    )
    started = time.perf_counter()
    with urllib.request.urlopen(request, timeout=600) as response:
        raw = response.read()
    return time.perf_counter() - started, len(raw), json.loads(raw)


def health(home: Path, rounds: int, asset: str, port: int = 3311) -> None:
    env = environment(home)
    results = []
    for _ in range(rounds):
        log = (home / "webserver.log").open("ab")
        server = subprocess.Popen(
            [
                str(Path(sys.executable).parent / "dagster-webserver"),
                *("-m", "vision_rag_pipeline.definitions", "-p", str(port), "-h", "127.0.0.1"),
            ],
            cwd=home,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            deadline = time.monotonic() + 180
            while True:
                try:
                    urllib.request.urlopen(f"http://127.0.0.1:{port}/server_info", timeout=5)
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(1)
            # The code location loads in the background: wait for the asset to be known.
            while True:
                _, _, answer = graphql(port, "{ assetNodes { id } }", {})
                if len(answer.get("data", {}).get("assetNodes") or []) >= len(ASSETS):
                    break
                time.sleep(1)
            variables = {"assetKey": {"path": [asset]}}
            cold, size, answer = graphql(port, PARTITION_HEALTH_QUERY, variables)
            node = answer["data"]["assetNodeOrError"]
            partitions = len(node["partitionKeysByDimension"][0]["partitionKeys"])
            warm = [graphql(port, PARTITION_HEALTH_QUERY, variables)[0] for _ in range(3)]
            results.append(
                {
                    "cold_s": round(cold, 2),
                    "warm_s": round(statistics.median(warm), 2),
                    "mb": round(size / 2**20, 1),
                    "partitions": partitions,
                }
            )
        finally:
            os.killpg(server.pid, signal.SIGTERM)
            server.wait(timeout=60)
            log.close()
    print(
        json.dumps(
            {
                "asset": asset,
                "rounds": results,
                "cold_s_median": statistics.median(r["cold_s"] for r in results),
            },
            indent=2,
        )
    )


# --- backfill submission and one more document ------------------------------------------------------------


def backfill(home: Path, seconds: float, max_runs: int) -> None:
    """`vision-rag backfill --submit` over every partition (the request: one statement in the registry),
    then a real daemon for `seconds`: how fast its ingest_requests sensor turns the requests into runs
    (documents claimed and runs created a minute, its ticks' durations). The requests left are put
    back to ingested afterwards, so the catalog stays as built."""
    env = environment(home)
    os.environ.update(env)
    from vision_rag_pipeline.core.postgres import connect
    from vision_rag_pipeline.defs.runner import dagster_instance

    instance = dagster_instance()
    started = time.perf_counter()
    done = vision_rag("backfill", "--submit", env=env)
    request_s = time.perf_counter() - started
    if done.returncode:
        sys.exit(done.stderr[-2000:])
    since = time.time()
    load = os.getloadavg()
    daemon = Daemon(home, env, max_runs)
    try:
        time.sleep(seconds)
    finally:
        daemon.stop()
    created, documents = runs_since(instance, since)
    states = registry_states()
    ticks = sensor_ticks(instance, since)
    with connect() as conn:  # the catalog as it was: its partitions' re-runs would only fail
        conn.execute(
            "UPDATE documents SET state = 'ingested', run_key = NULL WHERE door = 'backfill'"
            " AND state IN ('requested', 'queued', 'failed')"
        )
    print(
        json.dumps(
            {
                "request_s": round(request_s, 2),
                "request_says": done.stdout.strip(),
                "seconds": seconds,
                "max_runs": max_runs,
                "load_average_at_start": [round(x, 2) for x in load],
                "runs_created": created,
                "runs_per_minute": round(created / seconds * 60),
                "documents_in_them": documents,
                "documents_per_minute": round(documents / seconds * 60),
                "hours_for_100k": round(100_000 / (documents / seconds) / 3600, 1) if documents else None,
                "registry": states,
                "sensors": {name: tick_report(found) for name, found in ticks.items()},
            },
            indent=2,
        )
    )


def one_page_pdf(text: str) -> bytes:
    """A one-page PDF holding `text` and no image: its ingest is almost all bookkeeping."""
    from evalset import PdfWriter  # bench/ is on the path

    writer = PdfWriter()
    writer.new_page()
    writer.text(72, 72, text)
    return writer.to_bytes(title="one more document", creation="20261127000000")


def ingest_one(home: Path, rounds: int) -> None:
    env = environment(home)
    os.environ.update(env)
    from vision_rag_pipeline.defs.runner import dagster_instance

    instance = dagster_instance()
    walls, runs = [], []
    for number in range(rounds):
        document = home / "more" / f"one-more-{time.time_ns()}.pdf"
        document.parent.mkdir(parents=True, exist_ok=True)
        document.write_bytes(
            one_page_pdf(f"Report {number}: revenue rose to {time.time_ns() % 1000} thousand.")
        )
        started = time.perf_counter()
        done = vision_rag("ingest", str(document), "--json", env=env)
        walls.append(time.perf_counter() - started)
        if done.returncode:
            sys.exit(done.stderr[-2000:])
        [run] = instance.get_runs(limit=1)
        stats = instance.get_run_stats(run.run_id)
        runs.append(stats.end_time - stats.start_time)
    print(
        json.dumps(
            {
                "rounds": rounds,
                "command_s": [round(w, 2) for w in walls],
                "command_s_median": round(statistics.median(walls), 2),
                "run_s": [round(r, 2) for r in runs],
                "run_s_median": round(statistics.median(runs), 2),
            },
            indent=2,
        )
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "command",
        choices=(
            "build",
            "ticks",
            "version",
            "sensors",
            "inbox",
            "range-run",
            "health",
            "backfill",
            "ingest-one",
        ),
    )
    parser.add_argument("--home", type=Path, default=Path("/tmp/bench_catalog"))
    parser.add_argument("--docs", type=int, default=100_000)
    parser.add_argument("--seconds", type=float, default=600)
    parser.add_argument("--change-config", action="store_true")
    parser.add_argument(
        "--resume", action="store_true", help="version: start from the cursor the last one left"
    )
    parser.add_argument("--drop", type=int, default=0)
    parser.add_argument(
        "--files-per-tick",
        type=int,
        default=2000,
        help="build: the inbox sensor's files a tick while it registers",
    )
    parser.add_argument(
        "--max-runs",
        type=int,
        default=1,
        help="ticks, backfill: runs the daemon executes at once (the CPU they take)",
    )
    parser.add_argument(
        "--code-server",
        action="store_true",
        help="ticks: the daemon loads the code from one `dagster code-server` (as `dagster dev` does)",
    )
    parser.add_argument(
        "--postgres-instance",
        action="store_true",
        help="ticks: a Dagster instance whose storages are Postgres (docker/dagster.yaml), made once",
    )
    parser.add_argument(
        "--request",
        type=int,
        default=0,
        help="ticks: the catalog's first N documents requested as a backfill first (put back afterwards)",
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--asset", default="image_enrichments")
    args = parser.parse_args()
    args.home = args.home.resolve()
    args.home.mkdir(parents=True, exist_ok=True)
    if args.command == "build":
        build(args.home, args.docs, args.files_per_tick)
    elif args.command == "ticks":
        run_daemon(
            args.home,
            args.seconds,
            args.change_config,
            args.drop,
            args.max_runs,
            args.code_server,
            args.postgres_instance,
            args.request,
        )
    elif args.command == "version":
        version_ticks(args.home, args.change_config, args.resume)
    elif args.command == "sensors":
        sensors_in_process(args.home, args.drop)
    elif args.command == "inbox":
        inbox_ticks(args.home, args.rounds)
    elif args.command == "range-run":
        range_run(args.home)
    elif args.command == "health":
        health(args.home, args.rounds, args.asset)
    elif args.command == "backfill":
        backfill(args.home, args.seconds, args.max_runs)
    else:
        ingest_one(args.home, args.rounds)


if __name__ == "__main__":
    main()
