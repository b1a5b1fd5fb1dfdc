"""The local run history: Dagster's SQLite files, written through engines kept between calls."""

import multiprocessing
import shutil
import sqlite3
import subprocess
import sys
import time
from multiprocessing.sharedctypes import Synchronized
from multiprocessing.synchronize import Event
from pathlib import Path

import dagster as dg
import pytest
import sqlalchemy

from vision_rag_pipeline.defs import runner
from vision_rag_pipeline.defs.dagster_internals import SqliteEventLogStorage
from vision_rag_pipeline.defs.intake import run_failure
from vision_rag_pipeline.defs.local_storage import (
    CapturedComputeLogManager,
    LocalEventLogStorage,
    LocalRunStorage,
    LocalScheduleStorage,
)
from vision_rag_pipeline.defs.runner import write_local_instance_config

documents = dg.DynamicPartitionsDefinition(name="docs")


@dg.asset(partitions_def=documents, code_version="1")  # versioned: data versions repeat across homes
def loaded(context: dg.AssetExecutionContext) -> str:
    print(f"stdout of {context.partition_key}")  # what a user's print looks like
    return context.partition_key


@dg.asset(partitions_def=documents, code_version="1")
def indexed(loaded: str) -> dg.MaterializeResult:
    return dg.MaterializeResult(metadata={"rows": len(loaded)})


def _run_three_documents(instance: dg.DagsterInstance) -> None:
    instance.add_dynamic_partitions("docs", ["a", "bb", "ccc"])
    job = dg.Definitions(assets=[loaded, indexed]).resolve_implicit_global_asset_job_def()
    for key in ("a", "bb", "ccc"):
        assert job.execute_in_process(instance=instance, partition_key=key).success


def test_runs_and_materializations_land_where_plain_dagster_reads_them(tmp_path: Path) -> None:
    write_local_instance_config(tmp_path)
    with dg.DagsterInstance.from_config(str(tmp_path)) as instance:
        assert isinstance(instance.run_storage, LocalRunStorage)
        assert isinstance(instance.event_log_storage, LocalEventLogStorage)
        assert isinstance(instance.compute_log_manager, CapturedComputeLogManager)
        _run_three_documents(instance)
        # a power cut may roll back the latest commits, never corrupt a database: WAL, synced at checkpoints
        run_id = instance.get_runs()[0].run_id
        for connection in (instance.run_storage.connect(), instance.event_log_storage.run_connection(run_id)):
            with connection as conn:
                modes = (
                    conn.exec_driver_sql("PRAGMA journal_mode").scalar(),
                    conn.exec_driver_sql("PRAGMA synchronous").scalar(),
                )
                assert modes == ("wal", 1), "WAL with synchronous=NORMAL (1), not OFF (0)"

    # the UI of a user who deleted our dagster.yaml: Dagster's default SQLite storage, same files
    (tmp_path / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    with dg.DagsterInstance.from_config(str(tmp_path)) as plain:
        assert len(plain.get_runs()) == 3
        assert plain.get_dynamic_partitions("docs") == ["a", "bb", "ccc"]
        latest = plain.get_latest_materialization_event(dg.AssetKey("indexed"))
        assert latest is not None and latest.asset_materialization.metadata["rows"].value in (1, 2, 3)
        assert plain.get_materialized_partitions(dg.AssetKey("indexed")) == {"a", "bb", "ccc"}
        # each run's own event database (copied from an empty template) reads as Dagster wrote it
        runs = plain.get_runs()
        assert set(plain.event_log_storage.get_all_run_ids()) == {run.run_id for run in runs}
        for run in runs:
            events = plain.all_logs(run.run_id)
            assert any(event.dagster_event_type == dg.DagsterEventType.RUN_SUCCESS for event in events)
            # a step's stdout was captured where the UI's default compute log manager reads it
            (captured,) = [e for e in events if e.dagster_event_type == dg.DagsterEventType.LOGS_CAPTURED]
            log_key = plain.compute_log_manager.build_log_key_for_run(
                run.run_id, captured.dagster_event.logs_captured_data.file_key
            )
            stdout = plain.compute_log_manager.get_log_data(log_key).stdout or b""
            assert f"stdout of {run.tags['dagster/partition']}".encode() in stdout


def _asset_state(instance: dg.DagsterInstance) -> dict:
    """What the UI and the version checks read of each asset: its record and per-partition data versions."""
    state = {}
    for key in (dg.AssetKey("loaded"), dg.AssetKey("indexed")):
        (record,) = instance.get_asset_records([key])
        latest = record.asset_entry.last_materialization_record
        tags = dict(latest.asset_materialization.tags or {}) if latest else {}
        pointers = {k for k in tags if k.startswith("dagster/input_event_pointer/")}
        state[key] = {
            "tags": {k: v for k, v in tags.items() if k not in pointers},  # storage ids differ per home
            "pointers": sorted(pointers),
            "last_run_is_latest": record.asset_entry.last_run_id == instance.get_runs(limit=1)[0].run_id,
            "partitions": instance.get_materialized_partitions(key),
            "data_versions": instance.event_log_storage.get_latest_tags_by_partition(
                key, dg.DagsterEventType.ASSET_MATERIALIZATION, ["dagster/data_version"]
            ),
        }
    return state


def test_assets_read_back_as_from_dagsters_own_sqlite_storage(tmp_path: Path) -> None:
    write_local_instance_config(tmp_path / "ours")
    (tmp_path / "plain").mkdir()
    (tmp_path / "plain" / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    states = []
    for home in ("ours", "plain"):
        with dg.DagsterInstance.from_config(str(tmp_path / home)) as instance:
            _run_three_documents(instance)
            states.append(_asset_state(instance))
    assert states[0] == states[1]
    assert states[0][dg.AssetKey("indexed")]["pointers"] == ["dagster/input_event_pointer/loaded"]


def test_a_dagster_yaml_of_the_users_own_is_left_alone(tmp_path: Path) -> None:
    own = "telemetry:\n  enabled: true\n"
    (tmp_path / "dagster.yaml").write_text(own)
    write_local_instance_config(tmp_path)
    assert (tmp_path / "dagster.yaml").read_text() == own


def test_a_partition_deleted_through_this_instance_is_gone_at_once(tmp_path: Path) -> None:
    write_local_instance_config(tmp_path)
    with dg.DagsterInstance.from_config(str(tmp_path)) as instance:
        instance.add_dynamic_partitions("docs", ["a"])
        assert instance.has_dynamic_partition("docs", "a")
        assert instance.has_dynamic_partition("docs", "a")  # remembered
        instance.delete_dynamic_partition("docs", "a")
        assert not instance.has_dynamic_partition("docs", "a")
        assert not instance.has_dynamic_partition("docs", "never-added")


def test_an_up_to_date_config_is_not_rewritten(tmp_path: Path) -> None:
    write_local_instance_config(tmp_path)
    before = (tmp_path / "dagster.yaml").stat()
    write_local_instance_config(tmp_path)
    after = (tmp_path / "dagster.yaml").stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)


# Reads of the config, each racing the other process's rewrites. With the rewrite in place (the bug
# the test guards), 8 to 15 of 60 reads saw Dagster's defaults, the first of them by the 7th read
# (5 tries): 40 reads miss it with a chance under 1 in 300. Bounded by reads, not rewrites: the
# reads are what can fail, and 3,000 rewrites took 145 s for the same assertion.
READS = 40


def _rewrite_with_other_pool_limits(home: str, stop: Event, rewrites: Synchronized) -> None:
    """Another ingest process whose config differs (an upgrade): pool limit 2 and 3 by turns, until stopped."""
    template = runner.LOCAL_INSTANCE_BODY
    while not stop.is_set():
        rewrites.value += 1
        runner.LOCAL_INSTANCE_BODY = template.replace(
            "default_limit: 2", f"default_limit: {2 + rewrites.value % 2}"
        )
        write_local_instance_config(Path(home))


def test_a_process_starting_while_another_writes_the_config_reads_a_whole_one(tmp_path: Path) -> None:
    write_local_instance_config(tmp_path)
    spawn = multiprocessing.get_context("spawn")
    stop, rewrites = spawn.Event(), spawn.Value("q", 0)
    writer = spawn.Process(target=_rewrite_with_other_pool_limits, args=(str(tmp_path), stop, rewrites))
    writer.start()
    try:
        while rewrites.value < 2 and writer.is_alive():  # its first rewrite (limit 3) is done
            time.sleep(0.05)
        before = rewrites.value
        limits = []
        for _ in range(READS):
            with dg.DagsterInstance.from_config(str(tmp_path)) as instance:
                limits.append(instance.global_op_concurrency_default_limit)
        assert rewrites.value > before and writer.is_alive(), "the reads raced the rewrites"
    finally:
        stop.set()
        writer.join(timeout=60)
    assert writer.exitcode == 0
    assert set(limits) <= {2, 3}, "an instance came up without our config (a half-written dagster.yaml)"


@dg.asset(pool="vision_model")
def described() -> int:
    return 1


def test_a_run_failing_outside_its_steps_reports_dagsters_error_on_one_line(tmp_path: Path) -> None:
    write_local_instance_config(tmp_path)
    with dg.DagsterInstance.from_config(str(tmp_path)) as instance:

        def locked() -> None:
            raise RuntimeError("database is locked\nsecond line of detail")

        instance.event_log_storage.get_pool_limits = locked  # Dagster's pool bookkeeping fails
        job = dg.Definitions(assets=[described]).resolve_implicit_global_asset_job_def()
        result = job.execute_in_process(instance=instance, raise_on_error=False)
        assert not result.success
        failure = run_failure(instance, result.run_id)
    assert (failure.reason, failure.retryable) == ("database is locked", True)


def _key_loads(instance: dg.DagsterInstance) -> list[str]:
    """The scans of the dynamic partitions table this instance's storage makes from now on."""
    loads: list[str] = []
    engine = instance.event_log_storage._shard_engine("index")  # noqa: SLF001

    def seen(_conn, _cursor, statement: str, *_args) -> None:  # noqa: ANN001
        if statement.startswith("SELECT partition FROM dynamic_partitions"):
            loads.append(statement)

    sqlalchemy.event.listen(engine, "before_cursor_execute", seen)
    return loads


def test_adding_partitions_another_process_adds_at_the_same_moment_succeeds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two sensors of one daemon may request the same file at once: when the other process's insert
    lands between this one's read and its insert (which then fails on the unique key), the add still
    succeeds, each key once."""
    write_local_instance_config(tmp_path)
    dagsters_add = SqliteEventLogStorage.add_dynamic_partitions
    raced = []

    def add_after_another(self, name: str, keys: list[str]) -> None:
        if not raced:
            raced.append(True)
            with sqlite3.connect(tmp_path / "history" / "runs" / "index.db") as other:
                other.execute(
                    "INSERT INTO dynamic_partitions (partitions_def_name, partition) VALUES ('docs', 'a')"
                )
            raise sqlalchemy.exc.IntegrityError(
                "INSERT INTO dynamic_partitions", None, sqlite3.IntegrityError()
            )
        dagsters_add(self, name, keys)

    with dg.DagsterInstance.from_config(str(tmp_path)) as instance:
        instance.get_dynamic_partitions("docs")  # the table exists, as in a running deployment
        monkeypatch.setattr(SqliteEventLogStorage, "add_dynamic_partitions", add_after_another)
        instance.add_dynamic_partitions("docs", ["a", "b"])
        assert raced and instance.get_dynamic_partitions("docs") == ["a", "b"]


def test_partition_keys_are_loaded_once_and_what_another_process_changes_is_seen(tmp_path: Path) -> None:
    """A run over a partition range makes Dagster load every key 9-12 times: the process keeps the
    list while the table is unchanged, and any change, made here or by another process, is in the
    next answer."""
    write_local_instance_config(tmp_path)

    def elsewhere(*statements: str) -> None:
        """Another process's writes, as any writer's reach the file (one transaction)."""
        with sqlite3.connect(tmp_path / "history" / "runs" / "index.db") as other:
            for statement in statements:
                other.execute(statement)

    with dg.DagsterInstance.from_config(str(tmp_path)) as daemon:
        daemon.add_dynamic_partitions("docs", ["a", "bb", "ccc"])
        loads = _key_loads(daemon)
        for _ in range(12):
            assert daemon.get_dynamic_partitions("docs") == ["a", "bb", "ccc"]
        assert len(loads) == 1, "one scan for twelve answers"
        daemon.get_dynamic_partitions("docs").append("edited by a caller")
        assert daemon.get_dynamic_partitions("docs") == ["a", "bb", "ccc"]

        elsewhere(  # the newest, whose row id SQLite gives the next row: as many rows, the same last id
            "DELETE FROM dynamic_partitions WHERE partition = 'ccc'",
            "INSERT INTO dynamic_partitions (partitions_def_name, partition) VALUES ('docs', 'dddd')",
        )
        assert daemon.get_dynamic_partitions("docs") == ["a", "bb", "dddd"]
        elsewhere("DELETE FROM dynamic_partitions WHERE partition = 'bb'")  # not the newest: fewer rows
        assert daemon.get_dynamic_partitions("docs") == ["a", "dddd"]
        elsewhere("INSERT INTO dynamic_partitions (partitions_def_name, partition) VALUES ('other', 'x')")
        assert daemon.get_dynamic_partitions("docs") == ["a", "dddd"]
        daemon.add_dynamic_partitions("docs", ["e"])
        assert daemon.get_dynamic_partitions("docs") == ["a", "dddd", "e"]
        assert len(loads) == 5, "a scan after each change, none between"

        added = subprocess.run(
            [
                sys.executable,
                "-c",
                "import dagster as dg, sys; dg.DagsterInstance.from_config(sys.argv[1])"
                ".add_dynamic_partitions('docs', ['from another process'])",
                str(tmp_path),
            ],
            capture_output=True,
            text=True,
        )
        assert added.returncode == 0, added.stderr
        assert daemon.get_dynamic_partitions("docs") == ["a", "dddd", "e", "from another process"]

    with dg.DagsterInstance.from_config(str(tmp_path)) as next_tick:  # a code server's instance per tick
        loads = _key_loads(next_tick)
        assert next_tick.get_dynamic_partitions("docs") == ["a", "dddd", "e", "from another process"]
        assert not loads, "the process's list, still current"


def test_a_process_checks_a_databases_schema_once(tmp_path: Path, monkeypatch) -> None:  # noqa: ANN001
    """Dagster checks each SQLite file's schema revision whenever it builds a storage on it (loading
    every migration script), and a code server builds a new instance for every sensor tick: the
    process checks each file once, and again a file replaced since (a home deleted and made anew)."""
    write_local_instance_config(tmp_path)
    checks: list[str] = []
    for storage in (LocalRunStorage, LocalScheduleStorage):
        from_local = storage.from_local

        def counted(cls, *args, _from_local=from_local, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
            checks.append(cls.__name__)
            return _from_local(*args, **kwargs)

        monkeypatch.setattr(storage, "from_local", classmethod(counted))
    initdb = LocalEventLogStorage._initdb

    def counted_initdb(self, engine, **kwargs):  # noqa: ANN001, ANN003, ANN202
        checks.append("event log index")
        return initdb(self, engine, **kwargs)

    monkeypatch.setattr(LocalEventLogStorage, "_initdb", counted_initdb)

    def one_tick() -> None:
        with dg.DagsterInstance.from_config(str(tmp_path)) as instance:
            instance.add_dynamic_partitions("docs", ["a"])
            assert not instance.get_runs()
            assert instance.get_dynamic_partitions("docs") == ["a"]

    one_tick()
    first = len(checks)
    assert {"LocalRunStorage", "LocalScheduleStorage", "event log index"} <= set(checks)
    one_tick()
    one_tick()
    assert len(checks) == first, "no second check of the same files"

    for folder in ("history", "schedules"):
        shutil.rmtree(tmp_path / folder)
    one_tick()  # created again, as Dagster creates a missing database
    assert len(checks) > first
