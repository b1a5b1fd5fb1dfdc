"""The inbox sensor (add, change, touch, delete, ignore) and the version sensor, driven tick by tick."""

import json
import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import dagster as dg
import numpy as np
import psycopg
import pytest
from dagster._core.definitions.repository_definition import SINGLETON_REPOSITORY_NAME
from dagster._core.remote_origin import InProcessCodeLocationOrigin
from dagster._core.types.loadable_target_origin import LoadableTargetOrigin
from dagster._core.workspace.context import WorkspaceProcessContext, WorkspaceRequestContext
from dagster._core.workspace.load_target import InProcessWorkspaceLoadTarget
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vision_rag_pipeline.chunks.model import Chunk
from vision_rag_pipeline.core.config import INBOX_ENV, INBOX_SETTLE_ENV, config_in_effect
from vision_rag_pipeline.defs.inbox import inbox_sensor
from vision_rag_pipeline.defs.intake import ingest_requests as ingest_requests_sensor
from vision_rag_pipeline.defs.partitions import documents_partitions
from vision_rag_pipeline.defs.resources import IndexDatabase
from vision_rag_pipeline.defs.version_index import stale
from vision_rag_pipeline.defs.version_sensor import version_sensor
from vision_rag_pipeline.defs.versions import CODE_VERSION_TAG
from vision_rag_pipeline.documents import inbox as inbox_module
from vision_rag_pipeline.documents.inbox import file_sha256, scan_inbox
from vision_rag_pipeline.documents.registry import DocumentRegistry, document_id_for
from vision_rag_pipeline.indexes.lexical import LexicalDoc
from vision_rag_pipeline.indexes.lexical_backend import open_lexical_index
from vision_rag_pipeline.indexes.pgvector_store import PgVectorStore

SAMPLES = Path(__file__).resolve().parents[1] / "vision_rag_pipeline" / "samples"
PDF = SAMPLES / "larkspur_q3_2024_operations_review.pdf"
MHTML = SAMPLES / "larkspur_q3_2024_report.mhtml"
DIM = 384  # the session's chunks table is shared with the pipeline tests (all-MiniLM-L6-v2)


# The name every deployment (workspace.yaml, the daemon) gives the code location: a queued run carries
# its origin there, which Dagster builds only from a loaded workspace (no public Python API for it).
CODE_LOCATION = "vision_rag_pipeline.definitions"
CARRIED = object()
_cursors: dict[object, str | None] = {}  # what each test instance's last tick left, as the daemon keeps it


@pytest.fixture
def instance():
    with dg.instance_for_test() as instance:
        yield instance
    _cursors.pop(id(instance), None)
    _cursors.pop((id(instance), "version"), None)


@pytest.fixture
def inbox(tmp_path, fresh_database, monkeypatch) -> Path:
    """An empty inbox, and an index database of the test's own: a file's fate there is this test's alone
    (the same bytes anywhere else in the database would make it a duplicate)."""
    path = tmp_path / "inbox"
    path.mkdir()
    monkeypatch.setenv(INBOX_ENV, str(path))
    monkeypatch.setenv(INBOX_SETTLE_ENV, "0")  # files written by the test are whole: read at once
    monkeypatch.setenv("VISION_RAG_PG_URL", fresh_database)
    return path


def _context(instance, cursor: str | None):
    from vision_rag_pipeline.definitions import defs

    return dg.build_sensor_context(
        instance=instance, cursor=cursor, definitions=defs, resources={"index_db": IndexDatabase()}
    )


def tick(instance, cursor: str | None | object = CARRIED) -> dg.SensorResult | dg.SkipReason:
    """One tick as the daemon runs it: with the cursor the previous tick left (Dagster stores it with
    that tick's run requests), unless the test gives one."""
    return tick_with_cursor(instance, _cursors.get(id(instance)) if cursor is CARRIED else cursor)[0]


def tick_with_cursor(instance, cursor: str | None) -> tuple[dg.SensorResult | dg.SkipReason, str | None]:
    """One tick: the cursor the previous tick left in, the one it leaves out."""
    context = _context(instance, cursor)
    result = inbox_sensor(context)
    _cursors[id(instance)] = context.cursor
    return result, context.cursor


def requests(result) -> list[dg.RunRequest]:
    return [] if isinstance(result, dg.SkipReason) else result.run_requests


def fates(state: str) -> dict[str, str]:
    """{document id: source path} of the documents in this state."""
    with psycopg.connect(os.environ["VISION_RAG_PG_URL"]) as conn:
        return dict(conn.execute("SELECT document_id, source_path FROM documents WHERE state = %s", (state,)))


def range_of(run: dg.RunRequest) -> tuple[str, str]:
    """The first and last partition of a run over a range, as Dagster's tags name them."""
    return run.tags["dagster/asset_partition_range_start"], run.tags["dagster/asset_partition_range_end"]


def requested() -> set[str]:
    return set(fates("requested"))


def known_files(inbox: Path) -> set[bytes]:
    return set(DocumentRegistry().inbox_files(bytes(inbox)))


def test_new_files_are_registered_partitioned_and_requested(instance, inbox):
    pdf = Path(shutil.copy(PDF, inbox))
    (inbox / "sub").mkdir()
    mhtml = Path(shutil.copy(MHTML, inbox / "sub"))

    result = tick(instance)

    expected = {document_id_for(pdf), document_id_for(mhtml)}
    assert requested() == expected, "requested through the one way in, for the ingest_requests sensor"
    assert not requests(result) and ": 2 new, 0 changed" in result.skip_message
    assert set(instance.get_dynamic_partitions(documents_partitions.name)) == expected
    assert {DocumentRegistry().get(key).abs_path for key in expected} == {str(pdf), str(mhtml)}
    assert known_files(inbox) == {bytes(pdf), bytes(mhtml)}
    [fate] = DocumentRegistry().fates([document_id_for(pdf)])
    assert fate.door == "inbox"


def test_a_tick_dagster_did_not_accept_loses_no_file(instance, inbox):
    """A file's request is its registry row, written by the tick that read it: a tick whose cursor
    never reached Dagster (timed out, its results never stored) loses nothing and doubles nothing."""
    pdf = Path(shutil.copy(PDF, inbox))
    tick(instance, None)
    tick(instance, None)  # the first tick's cursor never reached Dagster
    assert requested() == {document_id_for(pdf)}
    assert DocumentRegistry().fates([document_id_for(pdf)])[0].attempts == 0


def test_a_drop_larger_than_a_tick_is_taken_over_the_next_ticks_oldest_first(instance, inbox, monkeypatch):
    from vision_rag_pipeline.defs import inbox as sensor_module

    monkeypatch.setattr(sensor_module, "FILES_PER_TICK", 4)
    for i in range(10):
        path = inbox / f"report-{i}.pdf"
        path.write_bytes(PDF.read_bytes()[:4096] + str(i).encode())
        os.utime(path, ns=(10**18 + i, 10**18 + i))  # report-0 is the oldest

    DocumentRegistry()  # the test's database gets its tables
    taken = []
    for _ in range(4):
        before = requested()
        tick(instance)
        taken.append(sorted(fates("requested")[key] for key in requested() - before))
        with psycopg.connect(os.environ["VISION_RAG_PG_URL"]) as conn:  # as if their runs had ingested them
            conn.execute("UPDATE documents SET state = 'ingested' WHERE state = 'requested'")

    assert [len(names) for names in taken] == [4, 4, 2, 0]
    assert taken[0] == [str(inbox / f"report-{i}.pdf") for i in range(4)]
    assert len(known_files(inbox)) == 10


def test_no_file_is_taken_while_a_ticks_worth_of_its_requests_wait_for_a_run(instance, inbox, monkeypatch):
    from vision_rag_pipeline.defs import inbox as sensor_module

    monkeypatch.setattr(sensor_module, "FILES_PER_TICK", 2)
    for i in range(2):
        (inbox / f"first-{i}.pdf").write_bytes(PDF.read_bytes()[:4096] + str(i).encode())
    tick(instance)
    shutil.copy(PDF, inbox)
    result = tick(instance)
    assert isinstance(result, dg.SkipReason)
    assert (
        "1 waiting for the next ticks (at most 2 a tick; 2 of its requests wait for a run)"
        in result.skip_message
    )


def test_the_ingest_requests_sensor_turns_files_requested_together_into_one_run_over_their_range(
    instance, inbox
):
    for number in range(3):
        (inbox / f"report-{number}.pdf").write_bytes(PDF.read_bytes() + f"\n% {number}\n".encode())
    tick(instance)
    ids = [document_id_for(inbox / f"report-{number}.pdf") for number in range(3)]

    result = ingest_requests_sensor(_context(instance, None))

    [run] = result.run_requests
    assert run.job_name == "ingest_document"
    partitions = instance.get_dynamic_partitions(documents_partitions.name)
    assert range_of(run) == (partitions[0], partitions[-1])
    assert set(partitions) == set(ids)
    assert set(fates("queued")) == set(ids) and not requested(), (
        "claimed once: the next tick asks for nothing"
    )
    assert not ingest_requests_sensor(_context(instance, None)).run_requests


def test_files_a_door_registers_together_are_claimed_together_by_a_tick_that_comes_between(
    instance, inbox, monkeypatch
):
    """Sensors tick in threads: an `ingest_requests` tick can claim while the inbox is still
    registering the files it was given together. It finds none of them until all are registered, then
    all of them: one run over their range, not a run for the first file and another for the rest."""
    for number in range(3):
        (inbox / f"report-{number}.pdf").write_bytes(PDF.read_bytes() + f"\n% {number}\n".encode())
    ids = [document_id_for(inbox / f"report-{number}.pdf") for number in range(3)]
    register = DocumentRegistry.register
    between: list[dg.SensorResult] = []

    def register_then_tick(self, *args, **kwargs):  # noqa: ANN001, ANN202
        registered = register(self, *args, **kwargs)
        between.append(ingest_requests_sensor(_context(instance, None)))
        return registered

    with monkeypatch.context() as patch:
        patch.setattr(DocumentRegistry, "register", register_then_tick)
        tick(instance)

    assert len(between) == 3 and not any(result.run_requests for result in between)
    [run] = ingest_requests_sensor(_context(instance, None)).run_requests
    partitions = instance.get_dynamic_partitions(documents_partitions.name)
    assert set(partitions) == set(ids)
    assert range_of(run) == (partitions[0], partitions[-1])
    assert set(fates("queued")) == set(ids)


# A door registering two files, killed after the first: `register` is made to hang there.
_KILLED_MID_REGISTRATION = """
import pathlib, sys, time
import dagster as dg
from vision_rag_pipeline.definitions import defs
from vision_rag_pipeline.defs.intake import request_files
from vision_rag_pipeline.documents import registry

registry.HOLD_SECONDS = 3.0
register = registry.DocumentRegistry.register

def register_then_hang(self, *args, **kwargs):
    registered = register(self, *args, **kwargs)
    pathlib.Path(sys.argv[1]).touch()
    time.sleep(600)
    return registered

registry.DocumentRegistry.register = register_then_hang
with dg.instance_for_test() as instance:
    request_files(instance, sys.argv[2:], "cli", defs.resolve_asset_graph())
"""


def test_a_file_held_by_a_door_killed_mid_registration_is_claimed_once_the_hold_passes(inbox, tmp_path):
    """kill -9 of a process between two files it registers together: the first, held for its batch,
    is not lost; no claim takes it until the hold (HOLD_SECONDS) passes, then one does."""
    import signal
    import subprocess
    import time

    files = []
    for number in range(2):
        files.append(tmp_path / f"report-{number}.pdf")
        files[-1].write_bytes(PDF.read_bytes() + f"\n% {number}\n".encode())
    registered = tmp_path / "registered"
    door = subprocess.Popen(
        [sys.executable, "-c", _KILLED_MID_REGISTRATION, str(registered), *map(str, files)]
    )
    try:
        deadline = time.monotonic() + 120
        while not registered.exists():
            assert door.poll() is None and time.monotonic() < deadline, "the door never registered a file"
            time.sleep(0.1)
    finally:
        door.send_signal(signal.SIGKILL)
        door.wait(30)
    held = document_id_for(files[0])
    assert requested() == {held}, "registered and requested: the second file never was"
    assert DocumentRegistry().claim("a tick") == [], "held for the batch its door was registering"

    time.sleep(3.5)
    assert [claimed.document_id for claimed in DocumentRegistry().claim("a tick")] == [held]


def test_an_ingest_requests_tick_makes_a_bounded_number_of_runs_and_leaves_the_rest_in_their_place(
    instance, catalog, monkeypatch
):
    """Documents requested apart from each other (every other partition) are a run each: a tick makes at
    most MAX_RUNS_PER_TICK of them (each costs the daemon a run's creation) and gives the documents
    it claimed beyond that back, first in line for the next tick."""
    from vision_rag_pipeline.defs import intake

    monkeypatch.setattr(intake, "MAX_RUNS_PER_TICK", 2)
    ids = register(instance, catalog, *(f"doc-{i}" for i in range(9)))
    wanted = ids[::2]
    intake.request_documents(instance, wanted, "backfill")

    taken = []
    for _ in range(4):
        result = ingest_requests_sensor(_context(instance, measured(1.0)))
        taken.append([run.partition_key for run in result.run_requests])

    assert taken == [wanted[0:2], wanted[2:4], wanted[4:], []]


@pytest.fixture
def queue() -> Iterator[tuple[dg.DagsterInstance, WorkspaceRequestContext]]:
    """An instance whose runs wait in Dagster's queue (the QueuedRunCoordinator, as dagster.yaml has
    it), and the code location loaded in this process under the name the daemon's workspace gives it:
    runs created from it carry the origins a queued run needs."""
    coordinator = {"module": "dagster.core.run_coordinator", "class": "QueuedRunCoordinator"}
    with dg.instance_for_test(overrides={"run_coordinator": coordinator}) as instance:
        origin = InProcessCodeLocationOrigin(
            LoadableTargetOrigin(executable_path=sys.executable, module_name=CODE_LOCATION),
            location_name=CODE_LOCATION,
        )
        with WorkspaceProcessContext(instance, InProcessWorkspaceLoadTarget(origin)) as process:
            yield instance, process.create_request_context()


def create_runs(
    instance: dg.DagsterInstance,
    workspace: WorkspaceRequestContext,
    requests: list[dg.RunRequest],
    *,
    submitted: bool = True,
) -> list[dg.DagsterRun]:
    """Create the runs a tick requested as the daemon does once the tick returned: Dagster's creation of
    a run of the job (its plan, its planned events) with the sensor's name and the run key as tags,
    then its submission to the queue, unless not `submitted` (created, not submitted yet)."""
    from vision_rag_pipeline.definitions import defs

    repository = workspace.get_code_location(CODE_LOCATION).get_repository(SINGLETON_REPOSITORY_NAME)
    runs = []
    for request in requests:
        tags = {"dagster/sensor_name": "ingest_requests", **request.tags}
        if request.run_key:
            tags["dagster/run_key"] = request.run_key
        if request.partition_key:
            tags["dagster/partition"] = request.partition_key
        remote_job = repository.get_full_job(request.job_name)
        run = instance.create_run_for_job(
            defs.resolve_job_def(request.job_name),
            tags=tags,
            remote_job_origin=remote_job.get_remote_origin(),
            job_code_origin=remote_job.get_python_origin(),
        )
        if submitted:
            instance.submit_run(run.run_id, workspace)
        runs.append(run)
    return runs


def start(instance: dg.DagsterInstance, runs: list[dg.DagsterRun]) -> None:
    """The daemon takes these runs from the queue: their process reports them started."""
    for run in runs:
        event = dg.DagsterEvent(event_type_value=dg.DagsterEventType.RUN_START.value, job_name=run.job_name)
        instance.report_dagster_event(event, run_id=run.run_id)


def test_no_run_is_made_while_a_ticks_worth_of_the_sensors_runs_wait_in_dagsters_queue(queue, catalog):
    """A backfill of 30 runs, one run at a time: the sensor keeps at most MAX_WAITING_RUNS (a tick's
    worth) of its runs waiting in Dagster's queue, queued or created and not submitted yet; the rest of
    the backfill stays requested in the registry, the tick saying why it makes no run, and as runs
    leave the queue the next tick makes as many as there is room for (92 runs were queued after 5
    minutes on the Postgres-backed instance before). Runs another sensor queued do not count."""
    from vision_rag_pipeline.defs import intake

    instance, workspace = queue
    ids = register(instance, catalog, *(f"doc-{i}" for i in range(60)))
    intake.request_documents(instance, ids[::2], "backfill")  # apart: a run each
    first = ingest_requests_sensor(_context(instance, measured(0.1)))
    queued = create_runs(instance, workspace, first.run_requests[:-1])
    create_runs(instance, workspace, first.run_requests[-1:], submitted=False)
    other = dg.RunRequest(
        job_name="reenrich", partition_key=ids[1], tags={"dagster/sensor_name": "version_sensor"}
    )
    create_runs(instance, workspace, [other])

    full = ingest_requests_sensor(_context(instance, measured(0.1)))  # time enough for 10 runs

    assert [run.status for run in instance.get_runs()].count(dg.DagsterRunStatus.QUEUED) == 10
    assert len(first.run_requests) == intake.MAX_WAITING_RUNS == 10
    assert not full.run_requests
    assert "10 of its runs wait in Dagster's queue" in full.skip_reason.skip_message
    assert len(requested()) == 20, "the rest of the backfill waits in the registry"

    start(instance, queued[:3])
    room = ingest_requests_sensor(_context(instance, measured(0.1)))

    assert len(room.run_requests) == 3, "as many as the queue has room for"
    assert len(requested()) == 17


def test_where_loading_the_partition_keys_is_slow_a_tick_makes_one_range_run(instance, catalog, monkeypatch):
    """A run over a partition range makes the daemon load every partition key once per asset and check
    (0.4-2.6 s each at 100,000 partitions) where the storage does not keep them (Dagster's own, as
    here, and Postgres): when the tick's own load of them was slow, it makes one batch run and leaves
    the other batches, in their place, to the next ticks."""
    import time

    from vision_rag_pipeline.defs import intake

    ids = register(instance, catalog, *(f"doc-{i}" for i in range(5)))
    intake.request_documents(instance, [*ids[0:2], *ids[3:5]], "backfill")  # two ranges
    load = instance.get_dynamic_partitions

    def slow(name):  # noqa: ANN001, ANN202
        time.sleep(0.3)  # x 12 planned outputs + 1 s: one range run fits the 6 s budget, two do not
        return load(name)

    monkeypatch.setattr(instance, "get_dynamic_partitions", slow)
    taken = []
    for _ in range(3):
        result = ingest_requests_sensor(_context(instance, measured(1.0)))
        taken.append(
            [(r.tags[intake.RANGE_START_TAG], r.tags[intake.RANGE_END_TAG]) for r in result.run_requests]
        )

    assert taken == [[(ids[0], ids[1])], [(ids[3], ids[4])], []]


def measured(run_creation_s: float) -> str:
    """The cursor of an ingest_requests tick that measured the daemon's creation of its runs just now."""
    import time

    from vision_rag_pipeline.defs.intake import RequestsCursor

    return RequestsCursor(
        returned_at=time.time(), run_creation_s=run_creation_s, range_run_s=run_creation_s
    ).model_dump_json()


def test_where_the_storage_keeps_the_keys_a_slow_load_is_paid_once_a_tick():
    """The local storage keeps the keys it loaded (defs/local_storage.py): the daemon loads them once
    for all of a tick's range runs, not once per planned output of each."""
    from vision_rag_pipeline.defs.intake import Batch, affordable

    ranges = [Batch(job="reenrich", documents=[f"d{i}", f"d{i + 1}"]) for i in range(0, 40, 2)]
    kept = affordable(ranges, key_load_s=2.0, keys_kept=True, run_creation_s=1.0)
    assert len(kept) == 4  # 2 s + 4 x 1 s of a 6 s budget
    not_kept = affordable(ranges, key_load_s=2.0, keys_kept=False, run_creation_s=1.0)
    assert [batch.documents for batch in not_kept] == [[f"d{i}"] for i in range(6)], (
        "not one range run fits (1 s + 12 key loads of 2 s): runs of one document, which load no key"
    )
    assert affordable(ranges, key_load_s=2.0, keys_kept=True, run_creation_s=7.0) == [], "no run fits"


def test_a_slow_run_creation_makes_the_next_tick_request_fewer_runs_and_a_fast_one_more(
    instance, catalog, monkeypatch
):
    """The daemon creates a tick's runs after the tick returns, and Dagster counts that in the tick:
    2-4 s a run under load, against 1 s at rest. Each tick measures how long the daemon took for the
    previous tick's runs (their run records) and estimates a run's creation from the slowest of the
    last ESTIMATE_MEASURES measures, so a tick stays within its budget as the load moves. Here the
    runs' records are added in turn, as slowly or as quickly as the daemon would create them
    (unqueued runs: the estimate takes the newest record's creation; queued runs are in
    test_a_tick_after_a_fast_one_plans_for_the_slow_ones_before_it_and_stays_within_its_budget)."""
    import time
    import uuid

    from vision_rag_pipeline.defs import intake

    monkeypatch.setattr(intake, "RUN_CREATION_BUDGET_S", 2.0)
    ids = register(instance, catalog, *(f"doc-{i}" for i in range(40)))
    intake.request_documents(instance, ids[::2], "backfill")  # apart: a run each

    def create_in_turn(result, seconds_each: float) -> None:  # noqa: ANN001
        for request in result.run_requests:
            time.sleep(seconds_each)
            tags = {
                **request.tags,
                "dagster/partition": request.partition_key,
                "dagster/run_key": request.run_key,
            }
            instance.add_run(dg.DagsterRun(job_name=request.job_name, run_id=str(uuid.uuid4()), tags=tags))

    fast = intake.RequestsCursor(returned_at=time.time(), run_creation_s=0.3).model_dump_json()
    first = ingest_requests_sensor(_context(instance, fast))
    create_in_turn(first, seconds_each=1.0)
    after_slow = ingest_requests_sensor(_context(instance, first.cursor))
    cursor, made_after_fast = after_slow.cursor, []
    create_in_turn(after_slow, seconds_each=0.0)
    for _ in range(intake.ESTIMATE_MEASURES):
        result = ingest_requests_sensor(_context(instance, cursor))
        made_after_fast.append(len(result.run_requests))
        create_in_turn(result, seconds_each=0.0)
        cursor = result.cursor

    assert len(first.run_requests) == 6, "0.3 s a run in a 2 s budget"
    # 1.0 s a run as the runs were created, 1.5 s with the margin: 0.5 s a run is left for the load
    assert len(after_slow.run_requests) == 1, "one run of 1.5 s fits a 2 s budget, two do not"
    assert intake.RequestsCursor.parse(after_slow.cursor).run_creation_s >= 1.0 * intake.ESTIMATE_MARGIN
    assert made_after_fast[:-1] == [1] * (intake.ESTIMATE_MEASURES - 1), "the slow measure is among the last"
    assert made_after_fast[-1] >= 6, "more again once the last measures are all quick"

    long_ago = intake.RequestsCursor(returned_at=time.time() - 3600, run_creation_s=0.15).model_dump_json()
    result = ingest_requests_sensor(_context(instance, long_ago))
    assert intake.RequestsCursor.parse(result.cursor).run_creation_s == intake.RUN_CREATION_S, (
        "a measure from a daemon stopped an hour ago gives way to the default"
    )


def test_a_one_document_run_created_quickly_does_not_make_a_run_over_a_range_look_cheap(instance, catalog):
    """A run over a range writes its planned events for each of its documents (2-3 s for 20 at load 4
    where a run of one took 0.3 s): after a tick whose one-document run was created quickly, the
    next tick, with ranges to run, still estimates a range run's creation as unmeasured (4 s), so it
    makes one, not six at the one-document pace; the one after measured it."""
    from vision_rag_pipeline.defs import intake

    ids = register(instance, catalog, *(f"doc-{i}" for i in range(41)))
    intake.request_documents(instance, ids[:1], "backfill")
    single = ingest_requests_sensor(_context(instance, None))
    add_runs(instance, single)  # quickly
    intake.request_documents(instance, ids[1:41], "backfill")  # two ranges of 20

    ranges = ingest_requests_sensor(_context(instance, single.cursor))

    assert [len(r.tags) for r in single.run_requests] == [0], "one document, one partition"
    assert intake.RequestsCursor.parse(ranges.cursor).run_creation_s < 1.0, "the one-document run measured"
    assert len(ranges.run_requests) == 1, "a range run's creation not measured yet: 4 s of the 6"
    add_runs(instance, ranges)
    after = ingest_requests_sensor(_context(instance, ranges.cursor))
    assert intake.RequestsCursor.parse(after.cursor).range_run_s < 1.0, "the range run measured"
    assert len(after.run_requests) == 1, "the other range"


def test_a_tick_after_a_fast_one_plans_for_the_slow_ones_before_it_and_stays_within_its_budget(
    queue, catalog, monkeypatch
):
    """The daemon's creation of a tick's runs moves with the load (on the Postgres-backed instance, runs
    created at 0.53 s each were followed by runs at 1.4 s, and a tick planned on the last measure
    alone took 11.0 s). The estimate is the slowest of the last measures: after a tick whose runs were
    created slowly and one whose runs were created quickly, a tick whose runs are slow again still ends
    within its budget, its runs' creation counted (Dagster's create-run call slowed, the real one made,
    after the tick returned as the daemon makes it)."""
    import time

    from vision_rag_pipeline.defs import intake

    # Dagster's real creation of a run takes 0.2-2 s here as the load moves: a pause of 3 s a run and a
    # budget of 10 s make the last tick overrun on a fast tick's measure (3-10 runs) whatever it is
    monkeypatch.setattr(intake, "TICK_BUDGET_S", 12.0)
    monkeypatch.setattr(intake, "RUN_CREATION_BUDGET_S", 10.0)
    instance, workspace = queue
    ids = register(instance, catalog, *(f"doc-{i}" for i in range(40)))
    intake.request_documents(instance, ids[::2], "backfill")  # apart: a run each
    create = instance.create_run_for_job
    pause = 0.0

    def slowed(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        time.sleep(pause)
        return create(*args, **kwargs)

    monkeypatch.setattr(instance, "create_run_for_job", slowed)

    def tick_and_its_runs(cursor: str, pause_s: float) -> tuple[dg.SensorResult, float]:
        nonlocal pause
        pause = pause_s
        began = time.monotonic()
        result = ingest_requests_sensor(_context(instance, cursor))
        runs = create_runs(instance, workspace, result.run_requests)
        took = time.monotonic() - began
        start(instance, runs)
        return result, took

    slow, _ = tick_and_its_runs(measured(8.0), 3.0)
    fast, _ = tick_and_its_runs(slow.cursor, 0.0)
    again, took = tick_and_its_runs(fast.cursor, 3.0)

    assert len(slow.run_requests) == 1, "8 s a run in 10 s"
    assert again.run_requests
    assert took <= intake.TICK_BUDGET_S, f"{len(again.run_requests)} runs: {took:.1f} s"
    assert len(intake.RequestsCursor.parse(again.cursor).run_creation_measures) == 2


def add_runs(instance, result) -> None:  # noqa: ANN001
    """Create the runs a tick requested, as the daemon does once the tick returned."""
    import uuid

    for request in result.run_requests:
        tags = {**request.tags, "dagster/run_key": request.run_key}
        if request.partition_key:
            tags["dagster/partition"] = request.partition_key
        instance.add_run(dg.DagsterRun(job_name=request.job_name, run_id=str(uuid.uuid4()), tags=tags))


def finished_runs_hold(instance, document_ids: list[str]) -> dict[str, str]:
    """Each document held by a run of its own that succeeded, its outcome not recorded yet (as when the
    run ended after the last tick); {run id: document}."""
    import uuid

    runs = {}
    with psycopg.connect(os.environ["VISION_RAG_PG_URL"]) as conn:
        for document_id in document_ids:
            run_id = str(uuid.uuid4())
            instance.add_run(
                dg.DagsterRun(
                    job_name="ingest_document",
                    run_id=run_id,
                    status=dg.DagsterRunStatus.SUCCESS,
                    tags={"dagster/partition": document_id},
                )
            )
            conn.execute(
                "UPDATE documents SET state = 'running', run_id = %s WHERE document_id = %s",
                (run_id, document_id),
            )
            runs[run_id] = document_id
    return runs


def test_a_first_tick_with_nothing_measured_makes_the_runs_a_slow_creation_fits_then_measures(
    instance, catalog
):
    """A daemon's first tick has no measure of a run's creation (the first tick with runs took 12.3 s
    at load 4 when it assumed 1 s a run): it assumes the slow end of what was measured, so it makes one
    run of its 6 s, and the next tick, which measured the daemon's creation of that run, more."""
    from vision_rag_pipeline.defs import intake

    ids = register(instance, catalog, *(f"doc-{i}" for i in range(40)))
    intake.request_documents(instance, ids[::2], "backfill")  # apart: a run each

    first = ingest_requests_sensor(_context(instance, None))
    add_runs(instance, first)  # quickly
    second = ingest_requests_sensor(_context(instance, first.cursor))

    assert len(first.run_requests) == 1, "4 s a run assumed in a 6 s budget"
    assert len(second.run_requests) > 1


def test_a_slow_reconcile_stops_at_its_budget_and_the_next_ticks_go_on_where_it_stopped(
    instance, catalog, monkeypatch
):
    """The tick's own work counts in its time: the reconcile looks at runs until its share of the tick
    is spent, and leaves the others to the next ticks, which start after the last it looked at. Every
    run's outcome is recorded, each run read once, and the requests waiting get their runs meanwhile."""
    import time

    from vision_rag_pipeline.defs import intake

    monkeypatch.setattr(intake, "RECONCILE_BUDGET_S", 0.5)
    ids = register(instance, catalog, *(f"doc-{i}" for i in range(14)))
    runs = finished_runs_hold(instance, ids[:12])
    intake.request_documents(instance, ids[12:], "backfill")
    read = []
    get_run = instance.get_run_by_id

    def slow(run_id):  # noqa: ANN001, ANN202
        time.sleep(0.3)  # Dagster's run storage, slow under load
        read.append(run_id)
        return get_run(run_id)

    monkeypatch.setattr(instance, "get_run_by_id", slow)
    cursor = measured(1.0)
    ingested_after_each = []
    made = []
    for _ in range(8):
        result = ingest_requests_sensor(_context(instance, cursor))
        cursor = result.cursor
        made += result.run_requests
        ingested_after_each.append(len(fates("ingested")))

    assert ingested_after_each[0] == 2, "0.3 s a run: two begun within 0.5 s"
    assert ingested_after_each[:6] == [2, 4, 6, 8, 10, 12]
    assert sorted(read) == sorted(runs), "each run read once"
    assert made, "the requests waiting got their run meanwhile"


def test_a_batch_whose_range_run_no_longer_fits_the_tick_waits_whole_for_the_next(
    instance, catalog, monkeypatch
):
    """Under load a tick's own work can leave time for runs of one document but not for the run over
    a batch's range. The batch is given back whole and the next tick, which skips its reconcile,
    makes the range run: files requested together are not split into a run each."""
    import time

    from vision_rag_pipeline.defs import intake

    ids = register(instance, catalog, *(f"doc-{i}" for i in range(3)))
    intake.request_documents(instance, ids, "backfill")
    cursor = intake.RequestsCursor(returned_at=time.time(), run_creation_s=0.2, range_run_s=3.0)
    count = instance.get_runs_count

    def slow(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        time.sleep(intake.TICK_BUDGET_S - 2.5)  # the run storage under load: < 2.5 s of the tick left,
        return count(*args, **kwargs)  # room for 0.2 s runs, not for a 3 s one (a whole tick has 6 s)

    monkeypatch.setattr(instance, "get_runs_count", slow)
    waited = ingest_requests_sensor(_context(instance, cursor.model_dump_json()))

    assert not waited.run_requests and "no run fits" in waited.skip_reason.skip_message
    assert requested() == set(ids), "claims given back"

    monkeypatch.setattr(instance, "get_runs_count", count)
    [run] = ingest_requests_sensor(_context(instance, waited.cursor)).run_requests
    assert range_of(run) == (ids[0], ids[-1])


def test_a_range_estimate_no_tick_can_afford_ages_out_and_batches_come_back(instance, catalog):
    """A slow spell's range measure (5 s, planned 7.5 s against a 6 s budget) makes runs of one
    document. No range run is then made, so none is measured: the tick forgets the oldest range
    measure instead, and once none is left the next batch is one run over its range again."""
    import time

    from vision_rag_pipeline.defs import intake

    ids = register(instance, catalog, *(f"doc-{i}" for i in range(6)))
    intake.request_documents(instance, ids[:3], "backfill")
    slow_spell = intake.RequestsCursor(
        returned_at=time.time(), run_creation_s=0.5, range_run_s=7.5, range_run_measures=[5.0]
    )

    singles = ingest_requests_sensor(_context(instance, slow_spell.model_dump_json()))

    assert sorted(run.partition_key for run in singles.run_requests) == sorted(ids[:3])
    assert intake.RequestsCursor.parse(singles.cursor).range_run_s == intake.RUN_CREATION_S
    intake.request_documents(instance, ids[3:], "backfill")
    [run] = ingest_requests_sensor(_context(instance, singles.cursor)).run_requests
    assert range_of(run) == (ids[3], ids[-1])


def test_a_tick_whose_own_work_left_no_time_for_a_run_makes_none_and_the_next_makes_them_first(
    instance, catalog, monkeypatch
):
    """Where the tick's own work (here a slow load of the partition keys to plan its batches) left less
    time than a run's creation, it makes no run: its claims go back, in their place, and the next tick
    gives its reconcile's time to the runs."""
    import time

    from vision_rag_pipeline.defs import intake

    monkeypatch.setattr(intake, "TICK_BUDGET_S", 2.0)
    ids = register(instance, catalog, *(f"doc-{i}" for i in range(5)))
    finished_runs_hold(instance, ids[4:])
    intake.request_documents(instance, ids[0:3:2], "backfill")  # two runs
    load = instance.get_dynamic_partitions

    def slow(name):  # noqa: ANN001, ANN202
        time.sleep(1.5)
        return load(name)

    monkeypatch.setattr(instance, "get_dynamic_partitions", slow)
    starved = ingest_requests_sensor(_context(instance, measured(1.0)))

    assert not starved.run_requests
    assert "no run fits" in starved.skip_reason.skip_message
    assert requested() == {ids[0], ids[2]}, "claims given back"
    assert set(fates("ingested")) == set(ids[1:4:2] + ids[4:]), "the reconcile came first this tick"

    monkeypatch.setattr(instance, "get_dynamic_partitions", load)
    finished_runs_hold(instance, ids[1:2])
    after = ingest_requests_sensor(_context(instance, starved.cursor))

    [run] = after.run_requests  # 1 s a run in the 2 s of this tick
    assert run.partition_key in (ids[0], ids[2])
    assert ids[1] in fates("running"), "no reconcile in the tick after a starved one"


def test_unchanged_and_touched_files_request_nothing(instance, inbox):
    pdf = Path(shutil.copy(PDF, inbox))
    tick(instance)
    with psycopg.connect(os.environ["VISION_RAG_PG_URL"]) as conn:  # as if its run had ingested it
        conn.execute("UPDATE documents SET state = 'ingested'")
    assert not requests(tick(instance)) and not requested()

    stat = pdf.stat()
    os.utime(pdf, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    result = tick(instance)
    assert isinstance(result, dg.SkipReason) and not requested(), "the same bytes: no new request"
    # The touch was recorded: the next tick does not hash the file again.
    [(_, mtime_ns)] = DocumentRegistry().inbox_files(bytes(inbox)).values()
    assert mtime_ns == stat.st_mtime_ns + 10**9


def test_an_unchanged_tick_reads_no_file_and_writes_no_state(instance, inbox, monkeypatch):
    for i in range(5):
        (inbox / f"report-{i}.pdf").write_bytes(PDF.read_bytes() + f"\n% {i}\n".encode())
    tick(instance)

    def row_versions() -> list:  # xmin changes whenever Postgres writes a row
        with psycopg.connect(os.environ["VISION_RAG_PG_URL"]) as conn:
            return conn.execute(
                "SELECT document_id, xmin::text FROM documents WHERE document_id = ANY(%s) ORDER BY 1",
                ([document_id_for(p) for p in inbox.iterdir()],),
            ).fetchall()

    def no_reading(*_):
        raise AssertionError("an unchanged file was read")

    before = row_versions()
    monkeypatch.setattr(inbox_module, "file_sha256", no_reading)
    assert isinstance(tick(instance), dg.SkipReason)
    assert row_versions() == before and len(before) == 5


def test_the_state_an_older_version_kept_in_the_cursor_is_adopted_not_re_ingested(instance, inbox):
    unchanged, edited = Path(shutil.copy(PDF, inbox)), Path(shutil.copy(MHTML, inbox))
    old_cursor = {
        str(path): {
            "size": path.stat().st_size,
            "mtime_ns": path.stat().st_mtime_ns,
            "sha256": file_sha256(path),
        }
        for path in (unchanged, edited)
    }
    edited.write_bytes(edited.read_bytes() + b"\n")

    tick(instance, json.dumps({"files": old_cursor}))

    assert requested() == {document_id_for(edited)}
    assert known_files(inbox) == {bytes(unchanged), bytes(edited)}


def test_changed_content_re_runs_the_same_partition(instance, inbox):
    pdf = Path(shutil.copy(PDF, inbox))
    tick(instance)
    with psycopg.connect(os.environ["VISION_RAG_PG_URL"]) as conn:  # as if its run had ingested it
        conn.execute("UPDATE documents SET state = 'ingested'")
    with pdf.open("ab") as handle:
        handle.write(b"\n% revised\n")

    tick(instance)

    assert requested() == {document_id_for(pdf)}
    assert DocumentRegistry().content(document_id_for(pdf)) == pdf.read_bytes()


def test_a_file_still_being_copied_starts_one_run_once_it_holds_still(instance, inbox, monkeypatch):
    """A slowly copied PDF used to start a run per tick, each on a partial file (5 failed runs before
    one succeeded): now nothing is requested until its size and mtime held still over one tick."""
    monkeypatch.setenv(INBOX_SETTLE_ENV, "30")
    whole = PDF.read_bytes()
    copying = inbox / "slow.pdf"
    copying.write_bytes(whole[: len(whole) // 3])
    result, cursor = tick_with_cursor(instance, None)
    assert isinstance(result, dg.SkipReason) and "1 still changing" in result.skip_message
    assert not known_files(inbox), "a partial file is not registered"
    with copying.open("ab") as handle:
        handle.write(whole[len(whole) // 3 :])
    result, cursor = tick_with_cursor(instance, cursor)
    assert not requested(), "it changed since the last tick: still no run"
    result, cursor = tick_with_cursor(instance, cursor)
    assert requested() == {document_id_for(copying)}
    assert DocumentRegistry().content(document_id_for(copying)) == whole, "the run reads the whole file"
    assert cursor is None


def test_a_known_file_being_rewritten_is_neither_deleted_nor_re_run_until_it_holds_still(
    instance, inbox, monkeypatch
):
    pdf = Path(shutil.copy(PDF, inbox))
    tick(instance)
    with psycopg.connect(os.environ["VISION_RAG_PG_URL"]) as conn:  # as if its run had ingested it
        conn.execute("UPDATE documents SET state = 'ingested'")
    monkeypatch.setenv(INBOX_SETTLE_ENV, "30")
    pdf.write_bytes(PDF.read_bytes()[:100])  # truncated: the rewrite has begun
    result, cursor = tick_with_cursor(instance, None)
    assert not requests(result) and not requested(), "no remove_document and no ingest of a half-written file"
    pdf.write_bytes(PDF.read_bytes() + b"\n% revised\n")
    result, cursor = tick_with_cursor(instance, cursor)
    assert not requested()
    tick_with_cursor(instance, cursor)
    assert requested() == {document_id_for(pdf)}


NOT_A_DOCUMENT_DOCX = "a ZIP archive (a Word, Excel or PowerPoint file?), not an MHTML web archive or a PDF"


def test_files_that_are_not_documents_are_refused_with_a_reason_once_and_counted(instance, inbox, capfd):
    """An empty PDF and a Word file renamed .pdf were ignored without a word: now each is named in
    the tick's log once, refused with its reason in the registry (`vision-rag status` shows it as
    any door's refusal), not read again while it stays as it is, and forgotten once it is gone."""
    (inbox / "notes.txt").write_text("hello")  # not named like a document: not looked at
    (inbox / ".partial.pdf").write_bytes(PDF.read_bytes())  # hidden: a download in progress
    (inbox / "empty.pdf").write_bytes(b"")
    (inbox / "report.pdf").write_bytes(b"PK\x03\x04" + bytes(200))  # a .docx renamed
    shutil.copy(PDF, inbox / "real.pdf")

    result = tick(instance)

    assert requested() == {document_id_for(inbox / "real.pdf")}
    said = capfd.readouterr().err  # the tick's log: the UI shows it under the tick
    assert f"skipped {inbox}/empty.pdf: empty file\n" in said
    assert f"skipped {inbox}/report.pdf: {NOT_A_DOCUMENT_DOCX}\n" in said
    assert result.skip_message.startswith(
        f"3 files in {inbox}: 1 new, 0 changed, 0 deleted, 0 as before; 2 skipped (2 not documents"
    )
    assert {
        fate.path: fate.reason for fate in DocumentRegistry().summary().attention if fate.state == "refused"
    } == {
        str(inbox / "empty.pdf"): "empty.pdf: empty file",
        str(inbox / "report.pdf"): f"report.pdf: {NOT_A_DOCUMENT_DOCX}",
    }
    assert instance.get_dynamic_partitions(documents_partitions.name) == [document_id_for(inbox / "real.pdf")]
    again = tick(instance)
    assert isinstance(again, dg.SkipReason) and "2 skipped (2 not documents" in again.skip_message
    assert "skipped" not in capfd.readouterr().err, "said once, not every tick"
    (inbox / "empty.pdf").unlink()
    assert not requests(tick(instance)), "a refused file leaves without a run"
    assert set(fates("refused").values()) == {str(inbox / "report.pdf")}


def test_a_missing_inbox_is_skipped_not_read_as_everything_deleted(instance, inbox):
    shutil.copy(PDF, inbox)
    tick(instance)
    shutil.rmtree(inbox)
    assert isinstance(tick(instance), dg.SkipReason)
    assert len(known_files(inbox)) == 1


def test_a_deleted_file_loses_its_partition_and_its_rows_in_both_indexes(instance, inbox):
    pdf = Path(shutil.copy(PDF, inbox))
    tick(instance)
    document_id = document_id_for(pdf)
    chunks = [
        Chunk(
            chunk_id=f"{document_id}:{i}", document_id=document_id, index=i, kind="text", text=f"deleted {i}"
        )
        for i in range(3)
    ]
    vectors = np.random.default_rng(0).normal(size=(3, DIM)).astype(np.float32)
    store = PgVectorStore(DIM)
    store.replace_document(document_id, chunks, vectors)
    lexical = open_lexical_index()
    lexical.replace_document(
        document_id,
        [LexicalDoc(chunk_id=c.chunk_id, document_id=document_id, kind=c.kind, text=c.text) for c in chunks],
    )
    pdf.unlink()

    result = tick(instance)

    [delete] = result.dynamic_partitions_requests
    assert isinstance(delete, dg.DeleteDynamicPartitionsRequest) and delete.partition_keys == [document_id]
    [removal] = result.run_requests
    assert removal.job_name == "remove_document"
    assert not requests(tick(instance)) and not known_files(inbox)  # requested once
    from vision_rag_pipeline.definitions import defs

    run = defs.resolve_job_def("remove_document").execute_in_process(
        run_config=removal.run_config, instance=instance
    )
    assert run.success
    assert store.count(document_id) == 0 and lexical.count(document_id) == 0
    assert document_id not in {doc.document_id for doc in DocumentRegistry().all()}


def test_a_listing_slower_than_a_tick_goes_on_next_tick_and_deletes_only_what_it_listed(
    instance, inbox, monkeypatch
):
    """The tick's time counts from its start: where listing the inbox is slow (a file system under
    load), a tick lists only while its share lasts and the next goes on from where it stopped. A known
    file is taken as deleted only by the tick that listed its directory (or, at the end of a pass,
    found it gone): a file no tick listed yet is not deleted, and none is requested again."""
    import time

    from vision_rag_pipeline.defs import inbox as module

    for folder in "abc":
        (inbox / folder).mkdir()
        for number in range(2):
            (inbox / folder / f"{number}.pdf").write_bytes(
                PDF.read_bytes() + f"\n% {folder}{number}\n".encode()
            )
    (inbox / "d").mkdir()
    (inbox / "d" / "0.pdf").write_bytes(PDF.read_bytes() + b"\n% d0\n")
    tick(instance)
    assert len(known_files(inbox)) == 7
    for folder in "abc":
        (inbox / folder / "1.pdf").unlink()
    shutil.rmtree(inbox / "d")  # a whole folder gone: found at the end of the pass
    monkeypatch.setattr(module, "SCAN_BUDGET_S", 0.5)
    scandir = os.scandir

    def slow(path):  # noqa: ANN001, ANN202
        time.sleep(0.3)  # one directory's listing on a file system under load
        return scandir(path)

    monkeypatch.setattr(inbox_module.os, "scandir", slow)
    removed: list[list[str]] = []
    said = []
    for _ in range(6):
        result = tick(instance)
        removed.append(
            sorted(
                Path(
                    DocumentRegistry()
                    .get(r.run_config["ops"]["remove_document_rows"]["config"]["document_id"])
                    .source_path
                ).parent.name
                for r in requests(result)
            )
        )
        said.append(result.skip_message if isinstance(result, dg.SkipReason) else "")

    # 0.3 s a listing in 0.5 s: the top and one folder the first tick, then a folder a tick, the last
    # ending the pass, which finds the folder d gone
    assert removed[:4] == [[], ["c"], ["b"], ["a", "d"]], "each deletion found by the tick that listed it"
    assert removed[4:] == [[], []], "a new pass: nothing deleted twice"
    assert "the next tick goes on from there" in said[0]
    with psycopg.connect(os.environ["VISION_RAG_PG_URL"]) as conn:
        [(requests_made,)] = conn.execute("SELECT count(DISTINCT request) FROM documents").fetchall()
    assert requests_made == 1, "the files left were requested by the first tick, none again"


def test_links_out_of_the_inbox_are_skipped_and_never_touch_the_linked_document(instance, inbox, tmp_path):
    outside = Path(shutil.copy(PDF, tmp_path / "ingested-by-cli.pdf"))
    cli_document = DocumentRegistry().register(outside)
    (inbox / "link.pdf").symlink_to(outside)
    (inbox / "sub").mkdir()
    (inbox / "sub" / PDF.name).write_bytes(PDF.read_bytes() + b"\n% another\n")
    (inbox / "loop").symlink_to(inbox / "sub")  # a directory link, even inside: never walked

    tick(instance)

    assert requested() == {cli_document.document_id, document_id_for(inbox / "sub" / PDF.name)}
    assert sorted(scan_inbox(inbox, {}).skipped) == [
        f"{inbox}/link.pdf: links out of the inbox (to {outside})",
        f"{inbox}/loop: directory links are not followed",
    ]
    (inbox / "link.pdf").unlink()
    assert not requests(tick(instance))
    assert DocumentRegistry().get(cli_document.document_id).abs_path == str(outside)


def test_identical_bytes_under_two_paths_are_one_document_with_both_paths_recorded(instance, inbox):
    """A second copy arriving (here a link inside the inbox) is recorded as a duplicate of the first:
    one partition, one set of chunks; deleting it drops only its record."""
    pdf = Path(shutil.copy(PDF, inbox))
    tick(instance)
    (inbox / "alias.pdf").symlink_to(pdf)

    tick(instance)

    alias_id = document_id_for(inbox / "alias.pdf", resolve=False)
    assert requested() == {document_id_for(pdf)}
    assert instance.get_dynamic_partitions(documents_partitions.name) == [document_id_for(pdf)]
    [alias] = DocumentRegistry().fates([alias_id])
    assert (alias.state, alias.duplicate_of, alias.path) == (
        "duplicate",
        document_id_for(pdf),
        str(inbox / "alias.pdf"),
    )
    (inbox / "alias.pdf").unlink()
    assert not requests(tick(instance)), "no removal run: the document stays, under its own path"
    assert not DocumentRegistry().fates([alias_id]) and requested() == {document_id_for(pdf)}


FILE_NAMES = st.binary(min_size=1, max_size=60).filter(
    lambda name: b"/" not in name and b"\0" not in name and not name.startswith(b".")
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(stem=FILE_NAMES)
def test_any_file_name_is_ingested_and_removed(instance, inbox, stem):
    path = bytes(inbox) + b"/" + stem + b".pdf"
    with open(path, "wb") as handle:
        handle.write(PDF.read_bytes()[:4096] + stem)  # sniffed by its header; the sensor never parses it

    tick(instance)

    document_id = document_id_for(path, resolve=False)
    assert document_id in requested()
    registered = DocumentRegistry().get(document_id)
    assert os.fsencode(registered.abs_path) == path
    os.unlink(path)
    [removal] = requests(tick(instance))
    assert removal.run_config["ops"]["remove_document_rows"]["config"]["document_id"] == document_id


# --- version sensor ---------------------------------------------------------------------------------------


@pytest.fixture
def catalog(tmp_path, fresh_database, monkeypatch) -> Path:
    """An index database of the test's own (registry and recorded versions), and a folder for the
    files of the documents registered there."""
    monkeypatch.setenv("VISION_RAG_PG_URL", fresh_database)
    return tmp_path


def register(instance, folder: Path, *names: str) -> list[str]:
    """Documents as a door registers them (a stored copy, a partition), all ingested; their ids."""
    registry = DocumentRegistry()
    ids = []
    for name in names:
        path = folder / f"{name}.pdf"
        path.write_bytes(b"%PDF-1.4\n% " + name.encode())
        ids.append(registry.register(path).document_id)
    instance.add_dynamic_partitions(documents_partitions.name, ids)
    with psycopg.connect(os.environ["VISION_RAG_PG_URL"]) as conn:
        conn.execute("UPDATE documents SET state = 'ingested' WHERE document_id = ANY(%s)", (ids,))
    return ids


def record(instance, asset: str, partition: str, version: str | None) -> None:
    tags = {CODE_VERSION_TAG: version} if version else {}
    instance.report_runless_asset_event(
        dg.AssetMaterialization(asset_key=asset, partition=partition, tags=tags)
    )


def current_versions() -> dict[str, str]:
    from vision_rag_pipeline.definitions import defs

    graph = defs.resolve_asset_graph()
    return {key.to_user_string(): graph.get(key).code_version for key in graph.materializable_asset_keys}


def version_tick(instance, cursor: str | None | object = CARRIED) -> dg.SensorResult:
    """One version-sensor tick with the cursor its previous tick left (unless one is given)."""
    from vision_rag_pipeline.definitions import defs

    key = (id(instance), "version")
    context = dg.build_sensor_context(
        instance=instance, definitions=defs, cursor=_cursors.get(key) if cursor is CARRIED else cursor
    )
    result = version_sensor(context)
    _cursors[key] = context.cursor
    return result


def materialize_all(instance, partition: str, overrides: dict[str, str | None] = {}) -> None:  # noqa: B006
    for asset, version in current_versions().items():
        record(instance, asset, partition, overrides.get(asset, version))


def rerun_requests() -> dict[str, str]:
    """{document: the job requested} of the re-runs the version sensor requested and no run took yet;
    taken as a run would take them, so the next call shows only what was requested since."""
    with psycopg.connect(os.environ["VISION_RAG_PG_URL"]) as conn:
        return dict(
            conn.execute(
                "UPDATE documents SET state = 'queued' WHERE door = 'versions' AND state = 'requested'"
                " RETURNING document_id, job"
            )
        )


def test_nothing_is_requested_while_versions_match(instance, catalog):
    a, b = register(instance, catalog, "a", "b")
    materialize_all(instance, a)
    materialize_all(instance, b)
    result = version_tick(instance)
    assert not result.run_requests and not rerun_requests()
    assert "match the config" in result.skip_reason.skip_message  # the UI says why the tick is empty


def test_a_stale_enrichment_is_requested_once_for_re_enrichment_and_its_tick_submits_no_run(
    instance, catalog
):
    a, b = register(instance, catalog, "a", "b")
    materialize_all(instance, a, {"image_enrichments": "old-prompt"})
    materialize_all(instance, b)

    result = version_tick(instance)

    assert not result.run_requests, "the ingest_requests sensor makes the runs, in batches"
    assert rerun_requests() == {a: "reenrich"}  # image_enrichments and everything downstream of it
    assert "re-runs of 1 requested now (image_enrichments -> " in result.skip_reason.skip_message
    [fate] = DocumentRegistry().fates([a])
    assert fate.door == "versions"
    # Requested once: nothing more until it materializes, even if its run fails.
    with psycopg.connect(os.environ["VISION_RAG_PG_URL"]) as conn:
        conn.execute("UPDATE documents SET state = 'failed' WHERE document_id = %s", (a,))
    assert not version_tick(instance).run_requests and not rerun_requests()


def test_a_whole_stale_catalog_is_one_request_run_in_batches_of_consecutive_partitions(instance, catalog):
    """Every stale partition requested by one tick, in the order the documents were registered (their
    partitions' order), so the ingest_requests sensor's run is one range over them."""
    ids = register(instance, catalog, *(f"doc-{i}" for i in range(5)))
    for partition in ids:
        materialize_all(instance, partition, {"document_chunks": "old-splitter"})

    version_tick(instance)
    result = ingest_requests_sensor(_context(instance, None))

    [run] = result.run_requests
    assert run.job_name == "reenrich"
    assert range_of(run) == (ids[0], ids[-1])


def test_a_stale_catalog_larger_than_a_tick_is_requested_over_the_next_ticks(instance, catalog, monkeypatch):
    from vision_rag_pipeline.defs import version_sensor as module

    monkeypatch.setattr(module, "REQUESTS_PER_TICK", 2)
    ids = register(instance, catalog, *(f"doc-{i}" for i in range(5)))
    for partition in ids:
        materialize_all(instance, partition, {"document_chunks": "old-splitter"})

    taken, said = [], []
    for _ in range(4):
        said.append(version_tick(instance).skip_reason.skip_message)
        taken.append(sorted(rerun_requests()))

    assert taken == [ids[0:2], ids[2:4], ids[4:], []]
    assert "3 left for the next ticks (at most 2 a tick)" in said[0]
    assert "re-runs of 1 requested now" in said[2] and "4 requested before" in said[2]


def compared_once(instance, catalog) -> tuple[str, str]:
    """Two documents materialized with the versions in effect, and a tick that compared them."""
    a, b = register(instance, catalog, "a", "b")
    materialize_all(instance, a)
    materialize_all(instance, b)
    version_tick(instance)
    return a, b


def test_a_quiet_tick_does_not_compare_and_a_new_materialization_does(instance, catalog, monkeypatch):
    from vision_rag_pipeline.defs import version_sensor as module

    a, b = compared_once(instance, catalog)
    compared = []
    monkeypatch.setattr(module, "stale", lambda *args: compared.append(1) or stale(*args))

    assert "no new materialization since" in version_tick(instance).skip_reason.skip_message
    assert not compared
    record(instance, "document_chunks", b, "old-splitter")  # a run elsewhere recorded an old version
    version_tick(instance)
    assert compared == [1] and rerun_requests() == {b: "reenrich"}


def test_a_tick_reads_only_the_materializations_recorded_since_the_last(instance, catalog, monkeypatch):
    a, b = compared_once(instance, catalog)
    read = []
    fetch = instance.fetch_materializations

    def counted(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        found = fetch(*args, **kwargs)
        read.extend(found.records)
        return found

    monkeypatch.setattr(instance, "fetch_materializations", counted)
    version_tick(instance)
    assert read == [] and not rerun_requests()
    record(instance, "chunk_embeddings", b, "old-model")

    version_tick(instance)

    assert rerun_requests() == {b: "reenrich"} and len(read) == 1


def test_a_tick_slow_to_read_stops_at_its_budget_and_the_next_goes_on_from_the_asset_it_stopped_at(
    instance, catalog, monkeypatch
):
    """The tick's time counts from its start: where Dagster's event log answers slowly, a tick reads
    materializations only while its time lasts and the next ticks go on from the asset it stopped at,
    each asset's new materializations read once, and the comparison comes once all are read."""
    import time

    from vision_rag_pipeline.defs import version_sensor as module

    monkeypatch.setattr(module, "TICK_BUDGET_S", 1.0)
    a, b = compared_once(instance, catalog)
    record(instance, "chunk_embeddings", b, "old-model")
    fetched: list[list[str]] = []
    fetch = instance.fetch_materializations

    def slow(records_filter, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        time.sleep(0.3)  # the event log under load
        fetched[-1].append(records_filter.asset_key.to_user_string())
        return fetch(records_filter, *args, **kwargs)

    monkeypatch.setattr(instance, "fetch_materializations", slow)
    said = []
    while not said or _deferred(said[-1]) and len(said) < 6:  # until the tick that compared
        fetched.append([])
        said.append(version_tick(instance).skip_reason.skip_message)

    assert all(len(tick) <= 4 for tick in fetched), "begun at 0, 0.3, 0.6, 0.9 s of a 1 s tick"
    read = [asset for tick in fetched for asset in tick]
    from vision_rag_pipeline.defs.versions import code_versions

    assert sorted(read) == sorted(code_versions()), "each asset read once, then the comparison"
    assert len(said) > 1 and "next tick goes on from there" in said[0]
    assert "re-runs of 1 requested now" in said[-1] and rerun_requests() == {b: "reenrich"}


def _deferred(message: str) -> bool:
    """Whether a version tick left its reading or its comparison to the next tick."""
    return message.startswith("reading") or message.endswith("the next tick compares")


def test_a_comparison_with_no_time_left_comes_first_in_the_next_tick(instance, catalog, monkeypatch):
    """A tick that read everything but had no time left to compare leaves the comparison to the next,
    which compares before reading anything again: reading first could use that tick's time too."""
    import time

    from vision_rag_pipeline.defs import version_sensor as module

    a, b = compared_once(instance, catalog)
    key = (id(instance), "version")
    _cursors[key] = json.dumps(json.loads(_cursors[key]) | {"compare_s": 60.0})  # a slow last comparison
    record(instance, "chunk_embeddings", b, "old-model")
    fetch = instance.fetch_materializations
    fetched = []
    monkeypatch.setattr(
        instance,
        "fetch_materializations",
        lambda *args, **kwargs: fetched.append(1) or fetch(*args, **kwargs),
    )

    deferred = version_tick(instance).skip_reason.skip_message
    assert deferred.endswith("the next tick compares") and not rerun_requests()
    read_before = len(fetched)
    started = time.monotonic()
    compared = version_tick(instance).skip_reason.skip_message

    assert "re-runs of 1 requested now" in compared and rerun_requests() == {b: "reenrich"}
    assert len(fetched) == read_before, "the comparison came before any reading"
    assert time.monotonic() - started < module.TICK_BUDGET_S


def test_a_partition_that_materializes_an_old_version_again_is_asked_again(instance, catalog):
    [a] = register(instance, catalog, "a")
    materialize_all(instance, a, {"image_enrichments": "old-prompt"})
    version_tick(instance)
    assert rerun_requests() == {a: "reenrich"}
    version_tick(instance)
    assert not rerun_requests()
    record(instance, "image_enrichments", a, "older-still")  # e.g. a CLI with another config
    with psycopg.connect(os.environ["VISION_RAG_PG_URL"]) as conn:  # ... whose run recorded it ingested
        conn.execute("UPDATE documents SET state = 'ingested' WHERE document_id = %s", (a,))
    version_tick(instance)
    assert rerun_requests() == {a: "reenrich"}


def test_a_document_a_run_is_under_way_for_is_left_to_it_and_compared_once_it_materialized(instance, catalog):
    [a] = register(instance, catalog, "a")
    materialize_all(instance, a, {"image_enrichments": "old-prompt"})
    with psycopg.connect(os.environ["VISION_RAG_PG_URL"]) as conn:  # a door asked for its run meanwhile
        conn.execute("UPDATE documents SET state = 'running' WHERE document_id = %s", (a,))

    waiting = version_tick(instance)

    assert "1 left to the run already asked for" in waiting.skip_reason.skip_message
    [fate] = DocumentRegistry().fates([a])
    assert (fate.state, fate.door) == ("running", "cli"), "the run under way keeps it"
    materialize_all(instance, a, {"image_enrichments": "old-prompt"})  # it ran with the old settings
    with psycopg.connect(os.environ["VISION_RAG_PG_URL"]) as conn:
        conn.execute("UPDATE documents SET state = 'ingested' WHERE document_id = %s", (a,))
    version_tick(instance)
    assert rerun_requests() == {a: "reenrich"}


def test_a_classifier_or_loader_change_re_runs_the_whole_ingest_and_unversioned_history_counts_as_stale(
    instance, catalog
):
    a, b, c, d = register(instance, catalog, "a", "b", "c", "d")
    materialize_all(instance, a, {"image_verdicts": "old-threshold"})
    materialize_all(instance, b, {"chunk_embeddings": None})
    materialize_all(instance, c, {"raw_documents": "old-loader"})
    materialize_all(instance, d)
    version_tick(instance)
    assert rerun_requests() == {a: "ingest_document", b: "reenrich", c: "ingest_document"}


def test_removed_documents_are_left_alone(instance, catalog):
    [a] = register(instance, catalog, "a")
    materialize_all(instance, a, {"image_enrichments": "old"})
    instance.delete_dynamic_partition(documents_partitions.name, a)  # as remove_document does
    DocumentRegistry().forget(a)
    result = version_tick(instance)
    assert not rerun_requests()
    assert "1 of 1 partitions recorded other versions" in result.skip_reason.skip_message
    assert "1 of 1" not in version_tick(instance).skip_reason.skip_message, "forgotten by the catalog"


def test_an_edited_config_waits_for_the_code_location_to_load_it(instance, catalog, monkeypatch):
    """The sensor compares with the config its process read; runs started after an edit read the new
    file, so it stands by (saying why) until its code location loads the file again."""
    config = catalog / "rag.yaml"
    config.write_text("id: before\n")
    monkeypatch.setenv("VISION_RAG_CONFIG", str(config))
    # read now, as by a code location started with it: an earlier ingest's lease-renewal thread reads
    # the config every 15 s, and may have done so since the test began (then without this file)
    config_in_effect.cache_clear()
    [a] = register(instance, catalog, "a")
    materialize_all(instance, a)
    version_tick(instance)
    assert not rerun_requests()
    config.write_text("media_enrichment: {fusion: {max_keywords: 5}}\n")

    waiting = version_tick(instance)

    assert not rerun_requests()
    assert f"{config} changed since this code location read it" in waiting.skip_reason.skip_message
    config_in_effect.cache_clear()  # the code location loads again (dagster-daemon run: every minute)
    version_tick(instance)
    assert rerun_requests() == {a: "reenrich"}


PROMPT_EDIT = "media_enrichment: {features: {mllm: {prompt: 'List every figure in the image.'}}}\n"


def test_a_prompt_edit_without_a_vision_model_re_runs_nothing(instance, catalog, monkeypatch):
    """Offline the prompt reaches no output: re-running would re-read every image for the same text."""
    [a] = register(instance, catalog, "a")
    materialize_all(instance, a)
    config = catalog / "rag.yaml"
    config.write_text(PROMPT_EDIT)
    monkeypatch.setenv("VISION_RAG_CONFIG", str(config))
    config_in_effect.cache_clear()  # the code location loads with the edited file

    version_tick(instance)
    assert not rerun_requests()


def test_a_prompt_edit_with_a_vision_model_re_enriches(instance, catalog, monkeypatch):
    from vision_rag_pipeline.defs.versions import code_versions

    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")  # configured, never called here
    [a] = register(instance, catalog, "a")
    materialize_all(instance, a, code_versions())  # as runs with that model recorded them
    version_tick(instance)
    assert not rerun_requests()
    config = catalog / "rag.yaml"
    config.write_text(PROMPT_EDIT)
    monkeypatch.setenv("VISION_RAG_CONFIG", str(config))
    config_in_effect.cache_clear()  # the code location loads with the edited file

    version_tick(instance)
    assert rerun_requests() == {a: "reenrich"}
