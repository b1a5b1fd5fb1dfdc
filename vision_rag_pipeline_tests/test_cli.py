"""The CLI contract other work and evaluation depend on: JSON shapes and exit codes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from vision_rag_pipeline.cli import SAMPLES, main
from vision_rag_pipeline.documents.loader import LOADER_REVISION
from vision_rag_pipeline.documents.registry import document_id_for
from vision_rag_pipeline_tests.conftest import bench_module

INGEST_KEYS = {
    "documents",
    "unchanged",
    "duplicates",
    "images",
    "images_ignored",
    "images_enriched",
    "enrichment_calls",
    "cache_hits",
    "chunks",
    "fallbacks",
    "failed",
    "interrupted",
    "seconds",
    "languages",
    "ocr_languages",
    "warnings",
}
HIT_KEYS = {"chunk_id", "document", "kind", "text", "score", "page", "bbox", "char_span", "image", "passages"}


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = main(list(argv))
    return code, capsys.readouterr().out


@pytest.fixture(scope="module")
def samples() -> list[str]:
    return sorted(str(p) for p in SAMPLES.iterdir() if p.suffix.lower() in (".mhtml", ".mht", ".pdf"))


def test_ingest_json_counts_and_bad_file_does_not_sink_the_run(
    pg_url: str, samples: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "notes.txt"
    bad.write_text("just text")
    missing = tmp_path / "missing.pdf"
    blank = tmp_path / "blank.pdf"  # 2,000 pages: past limits.documents.max_pages, refused at once
    blank.write_bytes(bench_module("bench_document_bombs").blank_pages_pdf(2000))
    code, out = _run(
        capsys, "ingest", *samples, str(bad), str(missing), str(blank), "--json", "--workers", "2"
    )
    report = json.loads(out)
    assert set(report) == INGEST_KEYS
    assert code == 1, "a failed file makes the exit code 1"
    assert report["documents"] == len(samples), "the good files are still ingested"
    assert set(report["ocr_languages"]) == {"eng"}, "English samples are read in English alone"
    assert {f["path"] for f in report["failed"]} == {str(bad), str(missing), str(blank)}
    assert all("\n" not in f["error"] and f["error"] for f in report["failed"])
    [refused] = [f["error"] for f in report["failed"] if f["path"] == str(blank)]
    assert "2,000 pages, more than 1,000 (limits.documents.max_pages)" in refused, refused
    assert report["chunks"] > 0 and report["images"] > 0
    assert set(report["languages"]) == {"en"}, "the samples are English"
    assert report["warnings"] == [], "English documents and an English model: nothing to warn about"
    assert (
        report["images"] == report["images_ignored"] + report["images_enriched"] or report["images_enriched"]
    )

    code, out = _run(capsys, "ingest", *samples, "--json", "--force")
    again = json.loads(out)
    assert code == 0 and again["unchanged"] == 0, "--force runs unchanged files"
    assert again["chunks"] == report["chunks"], "re-ingesting unchanged files keeps the chunk count"
    assert again["enrichment_calls"] == 0, "unchanged images are served from the enrichment cache"


def test_a_submitted_backfill_requests_reenrich_runs_for_the_daemon(
    pg_url: str, samples: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """`backfill --submit` goes through the one way in: the documents are requested for `reenrich`,
    and the ingest_requests sensor (the daemon's) turns them into runs."""
    import dagster as dg

    from vision_rag_pipeline.defs.definitions import defs
    from vision_rag_pipeline.defs.intake import ingest_requests
    from vision_rag_pipeline.defs.resources import IndexDatabase
    from vision_rag_pipeline.defs.runner import dagster_instance
    from vision_rag_pipeline.documents.registry import DocumentRegistry

    assert _run(capsys, "ingest", samples[0])[0] == 0
    partition = document_id_for(samples[0])
    code, out = _run(capsys, "backfill", "--submit", "--partitions", partition)
    assert code == 0 and "requested 1 document(s) for re-enrichment" in out, out
    [fate] = DocumentRegistry().fates([partition])
    assert (fate.state, fate.door) == ("requested", "backfill")

    context = dg.build_sensor_context(
        instance=dagster_instance(), definitions=defs, resources={"index_db": IndexDatabase()}
    )
    runs = ingest_requests(context).run_requests  # and those of other tests' requests, if any
    assert ("reenrich", partition) in {(run.job_name, run.partition_key) for run in runs}
    assert DocumentRegistry().fates([partition])[0].state == "queued", "claimed: no second run asked for"
    _release(partition)


def _release(document_id: str) -> None:
    """A document a sensor claimed for a run no daemon here will start goes back to ingested."""
    from vision_rag_pipeline.core.postgres import connect

    with connect() as conn:
        conn.execute("UPDATE documents SET state = 'ingested' WHERE document_id = %s", (document_id,))


def test_a_backfill_of_every_partition_is_one_request_claimed_tick_by_tick(
    fresh_database: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every key in one `--partitions` argument failed above ~2,500 documents (E2BIG): a backfill is
    now one statement in the registry, however many documents, and the ingest_requests sensor claims
    a bounded number a tick, in runs of consecutive partitions."""
    import dagster as dg

    from vision_rag_pipeline.defs import intake
    from vision_rag_pipeline.defs.backfill import request_backfill
    from vision_rag_pipeline.defs.definitions import defs
    from vision_rag_pipeline.defs.partitions import documents_partitions
    from vision_rag_pipeline.defs.resources import IndexDatabase
    from vision_rag_pipeline.documents.registry import DocumentRegistry

    monkeypatch.setenv("VISION_RAG_PG_URL", fresh_database)
    monkeypatch.setattr(intake, "MAX_CLAIMED_PER_TICK", 3)
    registry = DocumentRegistry()
    keys = []
    for number in range(7):
        path = tmp_path / f"backfilled-{number}.pdf"
        path.write_bytes(b"%PDF-1.4\n% " + str(number).encode())
        keys.append(registry.register(path).document_id)
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions(documents_partitions.name, keys)
        assert request_backfill(instance) == keys
        claimed = []
        for _ in range(3):
            context = dg.build_sensor_context(
                instance=instance, definitions=defs, resources={"index_db": IndexDatabase()}
            )
            result = intake.ingest_requests(context)
            claimed.append(
                [
                    (
                        run.job_name,
                        run.tags["dagster/asset_partition_range_start"],
                        run.tags["dagster/asset_partition_range_end"],
                    )
                    if run.partition_key is None
                    else (run.job_name, run.partition_key, run.partition_key)
                    for run in result.run_requests
                ]
            )
    assert claimed == [
        [("reenrich", keys[0], keys[2])],
        [("reenrich", keys[3], keys[5])],
        [("reenrich", keys[6], keys[6])],
    ]


def test_an_unchanged_file_launches_no_run_until_its_bytes_or_settings_change(
    pg_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from vision_rag_pipeline.defs.runner import dagster_instance

    doc = tmp_path / "report.mhtml"  # bytes of its own: the sample's would make it the sample's duplicate
    doc.write_bytes((SAMPLES / "larkspur_q3_2024_report.mhtml").read_bytes() + b"\r\n\r\n")
    first = json.loads(_run(capsys, "ingest", str(doc), "--json")[1])
    assert first["documents"] == 1 and first["unchanged"] == 0 and first["chunks"] > 0
    runs = dagster_instance().get_runs_count()

    code, out = _run(capsys, "ingest", str(doc), "--json")
    assert code == 0 and json.loads(out)["unchanged"] == 1
    assert dagster_instance().get_runs_count() == runs, "an unchanged file starts no Dagster run"

    doc.write_bytes(doc.read_bytes() + b"\r\n")
    changed = json.loads(_run(capsys, "ingest", str(doc), "--json")[1])
    assert changed["unchanged"] == 0 and changed["chunks"] == first["chunks"], "new bytes: a new run"
    assert dagster_instance().get_runs_count() == runs + 1

    # A setting that shapes the chunks (read by a new process, as a user's next command would).
    config = tmp_path / "rag.json"
    config.write_text(json.dumps({"splitter": {"chunk_size": 400, "chunk_overlap": 40}}))
    env = {**os.environ, "VISION_RAG_CONFIG": str(config)}
    rechunked = _ingest_in_a_new_process(doc, env)
    assert rechunked["unchanged"] == 0, "a changed setting runs the file again"
    assert _ingest_in_a_new_process(doc, env)["unchanged"] == 1, "...once"

    # An upgrade whose loaders read files differently: no setting changed, the file runs again, once.
    upgraded = _ingest_in_a_new_process(doc, env, loader_revision=LOADER_REVISION + 1)
    assert upgraded["unchanged"] == 0 and upgraded["chunks"] == rechunked["chunks"]
    assert _ingest_in_a_new_process(doc, env, loader_revision=LOADER_REVISION + 1)["unchanged"] == 1
    _remove(document_id_for(doc))  # the other tests search the samples alone


def test_deciding_that_files_are_unchanged_imports_no_image_or_document_reader() -> None:
    """An unchanged ingest loads the Dagster definitions and reads no file: SciPy, BeautifulSoup and
    pypdfium2 (~0.7 s of its ~2 s) are imported only when an image or a document is read."""
    probe = (
        "import sys; import vision_rag_pipeline.defs.runner, vision_rag_pipeline.defs.definitions; "
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'scipy', 'bs4', 'pypdfium2', 'torch'}))"
    )
    loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert loaded.strip() == "[]"


def _ingest_in_a_new_process(doc: Path, env: dict[str, str], loader_revision: int = LOADER_REVISION) -> dict:
    """`vision-rag ingest --json` in a new process, whose loaders say they are at `loader_revision`.

    It ends as the `vision-rag` command does (`run`: no interpreter teardown). Through `sys.exit`,
    a daemon thread still in torch's or Tesseract's C++ at teardown aborted the process now and then
    ("terminate called without an active exception"), after its work and output were done."""
    command = [
        sys.executable,
        "-c",
        "from vision_rag_pipeline.defs import versions; "
        f"versions.LOADER_REVISION = {loader_revision}; "
        "from vision_rag_pipeline.cli import run; run()",
        "ingest",
        str(doc),
        "--json",
    ]
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


def _remove(document_id: str) -> None:
    assert main(["forget", document_id]) == 0


def test_search_json_hits(pg_url: str, samples: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    _run(capsys, "ingest", *samples)
    code, out = _run(capsys, "search", "revenue", "-k", "3", "--json")
    hits = json.loads(out)
    assert code == 0
    assert 0 < len(hits) <= 3
    for hit in hits:
        assert set(hit) == HIT_KEYS
        assert hit["document"] in samples, "document is the path as given to ingest"
        assert all(set(passage) == HIT_KEYS and passage["page"] == hit["page"] for passage in hit["passages"])
    scores = [hit["score"] for hit in hits]
    assert scores == sorted(scores, reverse=True), "printed in the order shown"


def test_config_show_json_is_the_rag_config(capsys: pytest.CaptureFixture[str]) -> None:
    code, out = _run(capsys, "config", "show", "--json")
    config = json.loads(out)
    assert code == 0
    assert config["splitter"]["chunk_size"] == 1000
    assert config["media_enrichment"]["features"]["cache"]["key_format"] == "{domain}-{config_version}-{hash}"


def test_invalid_config_file_is_a_usage_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "rag.json"
    config.write_text(json.dumps({"splitter": {"chunk_size": 100, "chunk_overlap": 200}}))
    monkeypatch.setenv("VISION_RAG_CONFIG", str(config))
    assert main(["config", "show"]) == 2
    assert "chunk_overlap" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [[], ["ingest"], ["search", "x", "--mode", "fuzzy"], ["bogus"]])
def test_usage_errors_exit_2(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2


def test_failures_take_one_line_and_verbose_adds_the_traces(
    pg_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    damaged = tmp_path / "damaged.pdf"
    damaged.write_bytes(b"%PDF-1.4\n1 0 obj garbage")
    assert main(["ingest", str(damaged)]) == 1
    assert capsys.readouterr().err.splitlines() == [
        "FAILED damaged.pdf: not a readable PDF (not a PDF, or damaged) (in raw_documents)"
    ]
    assert main(["ingest", str(damaged), "--verbose"]) == 1
    verbose = capsys.readouterr().err
    assert "Stack Trace" in verbose and "dg.Failure" in verbose, "Dagster's log lines, with the trace"
    assert main(["status", str(damaged)]) == 1
    [line] = capsys.readouterr().out.splitlines()
    assert line.startswith(f"failed    {damaged} (") and line.endswith(
        ": damaged.pdf: not a readable PDF (not a PDF, or damaged) (in raw_documents)"
    )

    # a sender's file name cannot forge a line or act on the terminal: refused at arrival, failed in a run
    forged = tmp_path / "a\x1b[2J\nFAILED b.txt"
    forged.write_text("text")
    damaged.rename(damaged := tmp_path / "d\u202efdp.exe\r.pdf")
    assert main(["ingest", str(forged), str(damaged)]) == 1
    err = capsys.readouterr().err.splitlines()
    assert err == [
        "FAILED a\\x1b[2J\\nFAILED b.txt: not an MHTML web archive or a PDF",
        "FAILED d\\u202efdp.exe\\r.pdf: not a readable PDF (not a PDF, or damaged) (in raw_documents)",
    ]

    monkeypatch.setenv("VISION_RAG_PG_URL", f"postgresql://postgres@/postgres?host={tmp_path}/no-server")
    assert main(["search", "revenue", "--mode", "vector"]) == 1
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and err.startswith(
        "vision-rag: DatabaseUnavailable: index database unavailable: "
    ), err
    assert main(["search", "revenue", "--mode", "vector", "--verbose"]) == 1
    assert "Traceback (most recent call last)" in capsys.readouterr().err


def test_the_command_exits_with_its_code_its_whole_output_and_its_exit_handlers(tmp_path: Path) -> None:
    """`run` skips interpreter teardown: what a user pipes must still arrive whole, with the code."""
    script = (
        "import atexit, sys\n"
        "from vision_rag_pipeline import cli\n"
        "atexit.register(lambda: print('exit handler ran', file=sys.stderr))\n"
        "sys.argv = ['vision-rag', *sys.argv[1:]]\n"
        "cli.run()\n"
    )
    shown = subprocess.run(
        [sys.executable, "-c", script, "config", "show", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert shown.returncode == 0
    assert "embedding" in json.loads(shown.stdout)
    assert "exit handler ran" in shown.stderr
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    failed = subprocess.run(
        [sys.executable, "-c", script, "config", "show"],
        env={**os.environ, "VISION_RAG_CONFIG": str(bad)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert failed.returncode == 2
    assert "bad.json" in failed.stderr and "exit handler ran" in failed.stderr
