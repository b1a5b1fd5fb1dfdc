"""Every file's fate, through `vision-rag` run as a user runs it (a subprocess, a fresh home): what
`status` says of each file a door was given, identical bytes under two paths indexed once, the
reason a file failed as its run's step error, and `forget` dropping a document whole."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import dagster as dg

from vision_rag_pipeline.cli import SAMPLES
from vision_rag_pipeline.documents.registry import document_id_for
from vision_rag_pipeline_tests.test_crash_safety import Home, new_home

__all__ = ["new_home"]  # the fixture, shared with the crash tests

PDF = SAMPLES / "larkspur_q3_2024_operations_review.pdf"
DAMAGED = "damaged.pdf: not a readable PDF (not a PDF, or damaged) (in raw_documents)"


def test_status_duplicates_failures_and_forget_through_the_cli(
    new_home: Callable[[], Home], tmp_path: Path
) -> None:
    home = new_home()
    (tmp_path / "one").mkdir()
    (tmp_path / "two").mkdir()
    original, copy = tmp_path / "one" / "report.pdf", tmp_path / "two" / "same-report.pdf"
    original.write_bytes(PDF.read_bytes())
    copy.write_bytes(PDF.read_bytes())
    (tmp_path / "empty.pdf").write_bytes(b"")
    (tmp_path / "renamed.pdf").write_bytes(b"PK\x03\x04[Content_Types].xml word/document.xml")
    (tmp_path / "damaged.pdf").write_bytes(b"%PDF-1.4\n1 0 obj garbage")
    files = [original, copy, tmp_path / "empty.pdf", tmp_path / "renamed.pdf", tmp_path / "damaged.pdf"]

    ingest = home.run("ingest", *map(str, files))

    assert ingest.returncode == 1, ingest.stderr
    assert sorted(ingest.stderr.splitlines()) == sorted(
        [
            f"duplicate {copy}: the same bytes as {document_id_for(original)}, indexed once",
            "FAILED empty.pdf: empty file",
            "FAILED renamed.pdf: a ZIP archive (a Word, Excel or PowerPoint file?), not an MHTML web archive or a PDF",
            f"FAILED {DAMAGED}",
            f"ok {original} ({document_id_for(original)})",
        ]
    )
    status = home.run("status")
    assert status.returncode == 1, "a file failed"
    summary, *lines = status.stdout.splitlines()
    assert summary == "1 duplicate, 1 failed, 1 ingested, 2 refused"
    assert [line.split()[0] for line in lines] == ["refused", "refused", "failed"]
    assert (
        lines[-1].startswith(f"failed    {tmp_path / 'damaged.pdf'} (")
        and " via cli, 1 attempt(s), " in lines[-1]
    )
    assert lines[-1].endswith(f": {DAMAGED}")
    [duplicate] = home.run("status", str(copy)).stdout.splitlines()
    assert duplicate.startswith(f"duplicate {copy} (") and duplicate.endswith(
        f": the same bytes as {document_id_for(original)}, indexed once"
    )

    hits = json.loads(home.run("search", "Larkspur operations", "--json", "-k", "10").stdout)
    assert hits and {hit["document"] for hit in hits} == {str(original)}, "one set of chunks, not two"

    instance = home.instance()
    try:  # the failed run's step error is the reason, from a Dagster Failure (no stack trace shown)
        [failed] = instance.get_runs(dg.RunsFilter(statuses=[dg.DagsterRunStatus.FAILURE]))
        [step] = instance.all_logs(failed.run_id, of_type=dg.DagsterEventType.STEP_FAILURE)
        data = step.dagster_event.step_failure_data
        assert data.user_failure_data.description == DAMAGED.removesuffix(" (in raw_documents)")
        ours = {tag for tag in failed.tags if not tag.startswith("dagster/")}
        assert ours <= {"vision_rag/host_inputs"}, "no bookkeeping tags of ours on a run"
    finally:
        instance.dispose()

    forget = home.run("forget", str(original), str(tmp_path / "damaged.pdf"))
    assert forget.returncode == 0, forget.stderr
    assert home.run("status", str(original), str(copy)).stdout.startswith("nothing registered under")
    assert not home.index()["chunks"], "its chunks are gone from pgvector"
    instance = home.instance()
    try:
        assert instance.get_dynamic_partitions("documents") == [], "its partition and the failed one's too"
    finally:
        instance.dispose()
    hits = json.loads(home.run("search", "Larkspur operations", "--json", "-k", "10").stdout)
    assert hits == []


def test_a_batch_failing_on_two_files_fails_them_alone_and_runs_the_rest_again(
    new_home: Callable[[], Home], tmp_path: Path
) -> None:
    """Three files requested together are one run; the two that cannot be read fail it with their
    own reasons, the third runs again in a second run and is ingested, its attempts counting one."""
    home = new_home()
    good = tmp_path / "good.pdf"
    good.write_bytes(PDF.read_bytes())
    for name in ("bad-one.pdf", "bad-two.pdf"):
        (tmp_path / name).write_bytes(b"%PDF-1.4\n1 0 obj garbage " + name.encode())

    ingest = home.run(
        "ingest", "--workers", "1", str(good), str(tmp_path / "bad-one.pdf"), str(tmp_path / "bad-two.pdf")
    )

    assert ingest.returncode == 1, ingest.stderr
    failed = sorted(line for line in ingest.stderr.splitlines() if line.startswith("FAILED"))
    assert failed == [
        f"FAILED {name}: not a readable PDF (not a PDF, or damaged) (in raw_documents)"
        for name in ("bad-one.pdf", "bad-two.pdf")
    ]
    [line] = home.run("status", str(good)).stdout.splitlines()
    assert line.startswith("ingested") and " 1 attempt(s)" in line, line
    instance = home.instance()
    try:
        runs = instance.get_runs()
        assert len(runs) == 2, "the batch, then the good file again"
        [batch] = [run for run in runs if run.status == dg.DagsterRunStatus.FAILURE]
        assert "dagster/asset_partition_range_start" in batch.tags
    finally:
        instance.dispose()
