"""The local run history: Dagster's SQLite files, written through engines kept between calls."""

from pathlib import Path

import dagster as dg

from vision_rag_pipeline.ingest import write_local_instance_config
from vision_rag_pipeline.local_storage import (
    CapturedComputeLogManager,
    LocalEventLogStorage,
    LocalRunStorage,
)

documents = dg.DynamicPartitionsDefinition(name="docs")


@dg.asset(partitions_def=documents)
def loaded(context: dg.AssetExecutionContext) -> str:
    print(f"stdout of {context.partition_key}")  # what a user's print looks like
    return context.partition_key


@dg.asset(partitions_def=documents)
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
