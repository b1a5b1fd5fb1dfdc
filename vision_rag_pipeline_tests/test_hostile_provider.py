"""Real ingests against hostile vision endpoints (a local server speaking the OpenAI API): one that
hangs, one that echoes the API key in its error bodies."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import dagster as dg
import psycopg
import pytest

from vision_rag_pipeline.cli import SAMPLES
from vision_rag_pipeline.defs.runner import dagster_instance, ingest_paths
from vision_rag_pipeline.documents.registry import DocumentRegistry
from vision_rag_pipeline.indexes.lexical_backend import open_lexical_index
from vision_rag_pipeline.indexes.pgvector_store import delete_document_rows
from vision_rag_pipeline_tests.openai_fake import HANG, FakeOpenAI, echo_key_reply
from vision_rag_pipeline_tests.test_enrichment_service import png
from vision_rag_pipeline_tests.test_mhtml_loader import Resource, build_mhtml

FIGURES = 8  # two waves of the client's four concurrent calls
ALL_SAMPLES = sorted(str(p) for p in SAMPLES.iterdir() if p.suffix.lower() in (".mhtml", ".pdf"))


@pytest.fixture
def endpoint(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeOpenAI]:
    with FakeOpenAI() as server:
        monkeypatch.setenv("OPENAI_BASE_URL", server.base_url)
        monkeypatch.setenv("OPENAI_API_KEY", "vr-test-placeholder-key")
        yield server


def _figures_page(tmp_path: Path) -> Path:
    """A saved page with FIGURES distinct text figures, each worth a vision call."""
    run = uuid.uuid4().hex[:8]
    html = "<html><body><h1>Figures</h1>" + "".join(
        f'<p>Figure {i} of the quarterly review.</p><img src="https://example.test/fig{i}.png" alt="figure {i}">'
        for i in range(FIGURES)
    )
    resources = tuple(
        Resource(
            png([f"Figure {i} run {run}", f"Revenue {1000 + i} EUR"]),
            "image/png",
            f"https://example.test/fig{i}.png",
        )
        for i in range(FIGURES)
    )
    path = tmp_path / "figures.mhtml"
    path.write_bytes(build_mhtml(html + "</body></html>", resources))
    return path


def _remove_from_the_index(path: Path) -> None:
    registry = DocumentRegistry()
    document_id = registry.register(path).document_id
    delete_document_rows(document_id)
    open_lexical_index().delete_document(document_id)
    registry.forget(document_id)


def test_a_hanging_endpoint_costs_a_document_at_most_30_s_then_the_offline_path_takes_over(
    pg_url: str, endpoint: FakeOpenAI, tmp_path: Path
) -> None:
    endpoint.default = HANG
    page = _figures_page(tmp_path)
    report = ingest_paths([str(page)])
    _remove_from_the_index(page)  # the other suites search the shared index for the samples only
    assert report.documents == 1 and not report.failed, report.failed
    assert report.images_enriched == FIGURES and report.chunks > 0
    # What the endpoint cost the document, from its first call to the end of its last (recorded on
    # the materialization): a correctness bound, not a benchmark. Without the budgets: 60 s x 4
    # attempts per image, then fusion again. Measured: 25.0 s (the 25 s image budget of the first
    # four concurrent calls; the breaker then opens and the other four never wait).
    [record] = dagster_instance().fetch_materializations(dg.AssetKey("image_enrichments"), limit=1).records
    assert record.asset_materialization.metadata["provider_seconds"].value <= 30
    assert report.fallbacks.get("vision: timeout", 0) >= 1
    assert report.fallbacks.get("vision: circuit open", 0) >= 1, "the second wave never waits"
    assert len(endpoint.requests) < FIGURES
    assert report.fallbacks["fusion: description failed"] == report.images_enriched
    assert sum(v for k, v in report.fallbacks.items() if k.startswith("vision:")) == report.images_enriched
    assert all(r.body["messages"][0]["content"][1]["type"] == "image_url" for r in endpoint.requests), (
        "fusion is never asked after the description failed"
    )


def _tables_containing(pg_url: str, needle: str) -> list[str]:
    with psycopg.connect(pg_url) as conn:
        tables = [
            f'"{schema}"."{name}"'
            for schema, name in conn.execute(
                "SELECT schemaname, tablename FROM pg_tables"
                " WHERE schemaname NOT IN ('pg_catalog', 'information_schema')"
            )
        ]
        return [
            table
            for table in tables
            if conn.execute(
                f"SELECT count(*) FROM {table} t WHERE t::text LIKE %s", (f"%{needle}%",)
            ).fetchone()[0]
        ]


def test_an_echoed_api_key_is_stored_nowhere(
    pg_url: str, vision_rag_home: Path, endpoint: FakeOpenAI, monkeypatch: pytest.MonkeyPatch
) -> None:
    key = f"vr-secret-{uuid.uuid4().hex}"
    monkeypatch.setenv("OPENAI_API_KEY", key)
    endpoint.default = echo_key_reply(401)
    report = ingest_paths(ALL_SAMPLES)
    assert report.documents == len(ALL_SAMPLES) and not report.failed, report.failed
    assert key in endpoint.requests[0].headers["authorization"], "the endpoint saw (and echoed) the key"
    assert report.fallbacks.get("vision: http 401", 0) >= 1

    found = [str(p) for p in vision_rag_home.rglob("*") if p.is_file() and key.encode() in p.read_bytes()]
    assert found == [], "event log, compute logs, pickles and index files hold no key"
    assert _tables_containing(pg_url, key) == []
    # the errors themselves were kept, redacted: the event log says what went wrong
    logs = [
        p for p in (vision_rag_home / "dagster").rglob("*") if p.is_file() and b"[REDACTED]" in p.read_bytes()
    ]
    assert logs
