"""Ingest files through the Dagster asset graph: one dynamic partition and one run per document.

The runs execute in this process (models load once) against the Dagster instance in
DAGSTER_HOME, so they show up in the UI exactly like runs launched from it.
"""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import dagster as dg
import sqlalchemy
from pydantic import BaseModel, Field
from sqlalchemy.engine import Engine

from vision_rag_pipeline.config import dagster_home
from vision_rag_pipeline.documents.registry import DocumentRegistry
from vision_rag_pipeline.documents.sniff import sniff_document_kind
from vision_rag_pipeline.partitions import documents_partitions

_LOCAL_INSTANCE_YAML = """\
# Written by vision-rag for the embedded default: SQLite run/event storage in this directory.
telemetry:
  enabled: false
"""


# Run events still go to the instance (and the UI); only the terminal echo is quieted.
_QUIET_CONSOLE = {"loggers": {"console": {"config": {"log_level": "WARNING"}}}}


class FailedFile(BaseModel):
    path: str
    error: str


class IngestReport(BaseModel):
    documents: int = 0
    images: int = 0
    images_ignored: int = 0
    images_enriched: int = 0
    enrichment_calls: int = 0
    cache_hits: int = 0
    chunks: int = 0
    failed: list[FailedFile] = Field(default_factory=list)
    seconds: float = 0.0


def _fast_local_sqlite(dbapi_connection: object, _record: object) -> None:
    """Skip fsync on the local SQLite run history: Dagster opens a connection per event, and the
    syncs cost more than a small document's whole enrichment. Index data lives in Postgres and is
    unaffected; an OS crash can at worst lose the latest run records."""
    if isinstance(dbapi_connection, sqlite3.Connection):
        dbapi_connection.execute("PRAGMA synchronous=OFF")


def dagster_instance() -> dg.DagsterInstance:
    """The instance in DAGSTER_HOME (default `$VISION_RAG_HOME/dagster`), created on first use."""
    if not sqlalchemy.event.contains(Engine, "connect", _fast_local_sqlite):
        sqlalchemy.event.listen(Engine, "connect", _fast_local_sqlite)
    home = dagster_home()
    os.environ["DAGSTER_HOME"] = str(home)
    home.mkdir(parents=True, exist_ok=True)
    config = home / "dagster.yaml"
    if not config.exists():
        config.write_text(_LOCAL_INSTANCE_YAML)
    return dg.DagsterInstance.get()


def ingest_paths(paths: Sequence[str], progress: Callable[[str], None] = lambda _: None) -> IngestReport:
    """Register each file as a partition and materialize the asset graph for it, one run each."""
    from vision_rag_pipeline.definitions import defs

    started = time.perf_counter()
    report = IngestReport()
    instance = dagster_instance()
    job = defs.resolve_job_def("ingest_document")
    registry = DocumentRegistry()
    for path in paths:
        reason = _unreadable_reason(Path(path))
        if reason:
            report.failed.append(FailedFile(path=path, error=reason))
            progress(f"FAILED {path}: {reason}")
            continue
        document_id = registry.register(path).document_id
        instance.add_dynamic_partitions(documents_partitions.name, [document_id])
        result = job.execute_in_process(
            instance=instance, partition_key=document_id, raise_on_error=False, run_config=_QUIET_CONSOLE
        )
        if not result.success:
            error = _failure_reason(result)
            if Path(path).name not in error:
                error = f"{Path(path).name}: {error}"
            report.failed.append(FailedFile(path=path, error=error))
            progress(f"FAILED {error}")
            continue
        _add_counts(report, result)
        progress(f"ok {path} ({document_id})")
    report.seconds = round(time.perf_counter() - started, 3)
    return report


def _unreadable_reason(path: Path) -> str | None:
    if not path.exists():
        return f"{path}: no such file"
    if not path.is_file():
        return f"{path}: not a file"
    if sniff_document_kind(path) is None:
        return f"{path.name}: not an MHTML web archive or a PDF"
    return None


def _add_counts(report: IngestReport, result: dg.ExecuteInProcessResult) -> None:
    images = result.output_for_node("extracted_images")
    verdicts = result.output_for_node("image_verdicts")
    batch = result.output_for_node("image_enrichments")
    report.documents += 1
    report.images += len(images)
    report.images_ignored += sum(v.verdict == "IGNORE" for v in verdicts)
    report.images_enriched += len(batch.results)
    report.enrichment_calls += batch.calls
    report.cache_hits += batch.cache_hits
    report.chunks += len(result.output_for_node("document_chunks"))


def _failure_reason(result: dg.ExecuteInProcessResult) -> str:
    """The user-code exception behind the first failed step, on one line."""
    for event in result.all_events:
        if event.is_step_failure and event.step_failure_data and event.step_failure_data.error:
            error = event.step_failure_data.error
            while error.cause is not None:
                error = error.cause
            message = error.message.strip().splitlines()[0] if error.message.strip() else error.cls_name
            message = message.removeprefix(f"{error.cls_name}: ")
            return f"{message} (in {event.step_key})"
    return "run failed"
