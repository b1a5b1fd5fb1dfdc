"""The HTTP API against a real uvicorn server on a free loopback port, through urllib."""

from __future__ import annotations

import base64
import io
import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import uvicorn
from fastapi import FastAPI

from vision_rag_pipeline.api import create_app
from vision_rag_pipeline.documents.registry import DocumentRegistry
from vision_rag_pipeline_tests.test_query import TEXT_DOC, chart, corpus

__all__ = ["corpus"]  # the index fixture, indexed again into this module's own index

# Hits are asserted over what this module indexed, and nothing else (the fixture is in conftest).
pytestmark = pytest.mark.usefixtures("own_index")

SAMPLE_MHTML = (
    Path(__file__).resolve().parents[1] / "vision_rag_pipeline" / "samples" / "larkspur_q3_2024_report.mhtml"
)


@pytest.fixture(scope="module")
def base_url(corpus) -> Iterator[str]:
    """The API over the module's index; it runs no upload (the upload tests below start their own)."""
    with serving(create_app(ingest_on_upload=False)) as url:
        yield url


@contextmanager
def serving(app: FastAPI) -> Iterator[str]:
    """`app` under a real uvicorn server on a free loopback port; yields its base URL."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="critical"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.started, "uvicorn did not start"
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def call(
    url: str,
    body: bytes | dict | None = None,
    content_type: str = "application/json",
    headers: dict[str, str] | None = None,
) -> tuple[int, object]:
    data = json.dumps(body).encode() if isinstance(body, dict) else body
    sent = {"Content-Type": content_type} if data else {}
    request = urllib.request.Request(url, data=data, headers={**sent, **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            raw = response.read()
            return response.status, json.loads(raw) if raw else None
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read() or b"null")


def multipart(files: list[tuple[str, bytes]], fields: dict[str, str]) -> tuple[bytes, str]:
    boundary = uuid.uuid4().hex
    parts = []
    for name, value in fields.items():
        parts.append(
            f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n{value}\r\n'.encode()
        )
    for filename, data in files:
        header = (
            f'--{boundary}\r\nContent-Disposition: form-data; name="files"; filename="{filename}"\r\n'
            "Content-Type: application/octet-stream\r\n\r\n"
        )
        parts.append(header.encode() + data + b"\r\n")
    parts.append(f"--{boundary}--\r\n".encode())
    return b"".join(parts), f"multipart/form-data; boundary={boundary}"


def test_openapi_documents_every_endpoint(base_url: str) -> None:
    status, spec = call(f"{base_url}/openapi.json")
    assert status == 200
    assert {"/upload", "/search", "/chat", "/enrichment-services/media-enrichment"} <= set(spec["paths"])


def test_search_returns_located_hits(base_url: str) -> None:
    status, body = call(f"{base_url}/search", {"query": "Zephyrine picnic attendees", "k": 3})
    assert status == 200
    assert body["hits"][0]["chunk_id"] == f"{TEXT_DOC}:00000"
    assert body["hits"][0]["char_span"] == [0, 69]


def test_search_by_image_over_http(base_url: str) -> None:
    image = base64.b64encode(chart(scale=0.8)).decode()
    status, body = call(f"{base_url}/search", {"image": f"data:image/png;base64,{image}", "k": 3})
    assert status == 200
    assert body["hits"][0]["kind"] == "image"


_STARTED = """
import asyncio
from vision_rag_pipeline.api import create_app
from vision_rag_pipeline.query.candidates import query_vectors
from vision_rag_pipeline.query.ranker import load_ranker

app = create_app(ingest_on_upload=False)


async def started():
    async with app.router.lifespan_context(app):  # what uvicorn completes before it opens the port
        print("loaded", query_vectors.cache_info().currsize, load_ranker.cache_info().currsize)


asyncio.run(started())
"""


def test_a_server_has_loaded_what_a_search_needs_before_it_answers(corpus) -> None:
    """A fresh interpreter, where nothing searched before: once the app has started, the embedding
    model has embedded a query and the ranker is loaded, so the first caller waits for their own
    search only."""
    started = subprocess.run([sys.executable, "-c", _STARTED], capture_output=True, text=True, timeout=300)
    assert started.stdout.split() == ["loaded", "1", "1"], started.stderr


def test_a_server_whose_database_is_down_still_starts_and_says_why_it_is_not_warm() -> None:
    """The warm-up is a convenience: a database that is down when the server starts is /health's to
    report and each request's to answer (503), not a reason to refuse to start."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # nothing listens there once the probe is closed
    env = os.environ | {"VISION_RAG_PG_URL": f"postgresql://vision@127.0.0.1:{port}/nothing"}
    started = subprocess.run(
        [sys.executable, "-c", _STARTED], capture_output=True, text=True, timeout=300, env=env
    )
    assert started.stdout.startswith("loaded"), started.stderr
    assert "search warm-up failed" in started.stderr, started.stderr


def test_bad_requests_get_clear_4xx(base_url: str) -> None:
    status, body = call(f"{base_url}/search", {"query": "x", "k": 0})
    assert status == 422 and body["detail"][0]["loc"][-1] == "k"
    status, body = call(f"{base_url}/search", {"query": "picnic", "rag_config": "nope"})
    assert status == 404 and "unknown rag_config 'nope'" in body["detail"]
    status, body = call(f"{base_url}/search", {"k": 3})
    assert status == 422 and "query or an image" in body["detail"][0]["msg"]
    status, body = call(f"{base_url}/search", {"image": "%%%"})  # the schema says base64
    assert status == 422 and body["detail"][0]["loc"][-1] == "image"
    status, body = call(f"{base_url}/search", {"image": "AAAA"})  # base64, but of no image
    assert status == 415 and "not a readable image" in body["detail"]
    status, _ = call(f"{base_url}/chat", b"{not json", "application/json")
    assert status == 422


@pytest.mark.parametrize("query", ["\t", " ", "\x1f", "\u3000"])
def test_a_query_of_white_space_is_a_valid_query_that_matches_nothing(base_url: str, query: str) -> None:
    """schemathesis: `{"query": "\t"}` got 422, though the spec says a query is any string."""
    assert call(f"{base_url}/search", {"query": query}) == (200, {"hits": []})


def test_chat_answers_with_verbatim_citations(base_url: str) -> None:
    status, body = call(f"{base_url}/chat", {"query": "How many people came to the Zephyrine Labs picnic?"})
    assert status == 200 and body["answered"]
    texts = {hit["chunk_id"]: hit["text"] for hit in body["hits"]}
    assert all(c["excerpt"] in texts[c["chunk_id"]] for c in body["citations"])


def test_media_enrichment_classifies_and_describes(base_url: str) -> None:
    image = {"data": base64.b64encode(chart()).decode(), "name": "feed.png"}
    request = {
        "domain": "zoo",
        "config_version": "1",
        "images": [image],
        "features": {"cache": {"enabled": False}},
    }
    status, body = call(f"{base_url}/enrichment-services/media-enrichment", request)
    assert status == 200
    assert body["classifier_result"]["verdict"] == "GPT_VISION"
    assert "Numbat" in body["generated_response"]["content"]
    status, body = call(
        f"{base_url}/enrichment-services/media-enrichment", {**request, "images": [image] * 11}
    )
    assert status == 422 and body["detail"][0]["loc"][-1] == "images"


def test_media_enrichment_features_are_the_settings_the_schema_lists(base_url: str) -> None:
    """schemathesis: `features: {"": null}` matched the schema (any object) and got 422; a null `url`
    beside `data` was taken for a URL. The schema lists the feature settings a request may override."""
    status, spec = call(f"{base_url}/openapi.json")
    schemas = spec["components"]["schemas"]
    features = schemas["EnrichmentFeaturesOverride"]
    assert (
        set(features["properties"]) == {"mllm", "classifier", "cache"}
        and not features["additionalProperties"]
    )
    assert "pattern" in json.dumps(schemas["CacheFeatureOverride"]["properties"]["key_format"])
    image = {"data": base64.b64encode(chart()).decode(), "url": None, "name": "feed.png"}
    request = {"images": [image], "features": {"cache": {"enabled": False, "expiry": None}}}
    status, body = call(f"{base_url}/enrichment-services/media-enrichment", request)
    assert status == 200 and "Numbat" in body["generated_response"]["content"], body
    for features in ({"": None}, {"cache": {"key_format": "{hash}{0}"}}, {"classifier": {"enabled": None}}):
        status, body = call(
            f"{base_url}/enrichment-services/media-enrichment", {**request, "features": features}
        )
        assert status == 422 and body["detail"][0]["loc"][:2] == ["body", "features"], (features, body)


@pytest.fixture
def forget_after() -> Iterator[list[str]]:
    """Document ids a test uploads, forgotten afterwards: the other suites search the samples alone."""
    from vision_rag_pipeline.cli import main as cli_main

    uploaded: list[str] = []
    yield uploaded
    if uploaded:
        cli_main(["forget", *uploaded])


def _unique(data: bytes) -> bytes:
    """The sample's bytes made a file of their own (the same bytes would be the sample's duplicate)."""
    return data + f"\r\n<!-- {uuid.uuid4().hex} -->\r\n".encode()


def _fate(url: str, document_id: str, until: set[str], timeout: float = 300) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        status, fate = call(f"{url}/documents/{document_id}")
        assert status == 200, fate
        if fate["state"] in until or time.monotonic() > deadline:
            return fate
        time.sleep(0.2)


def test_an_upload_is_run_by_the_server_and_never_ingested_again_by_the_inbox(
    pg_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, forget_after: list[str]
) -> None:
    """Without a daemon the server runs the upload's requested run itself; the inbox sensor then
    finds the file known and unchanged; a file no run could ingest is 415 and leaves nothing."""
    import dagster as dg

    from vision_rag_pipeline.defs.definitions import defs
    from vision_rag_pipeline.defs.inbox import inbox_sensor
    from vision_rag_pipeline.defs.resources import IndexDatabase
    from vision_rag_pipeline.defs.runner import dagster_instance

    inbox = tmp_path / "inbox"
    monkeypatch.setenv("VISION_RAG_INBOX", str(inbox))
    monkeypatch.setenv("VISION_RAG_INBOX_SETTLE_SECONDS", "0")
    data = _unique(SAMPLE_MHTML.read_bytes())
    with serving(create_app()) as url:
        payload, content_type = multipart([(SAMPLE_MHTML.name, data)], {})
        status, body = call(f"{url}/upload", payload, content_type)
        assert status == 202
        [accepted] = body["documents"]
        forget_after.append(accepted["document_id"])
        assert accepted["status"] == "requested"
        # registered before the answer: the bytes are in the index database already
        assert DocumentRegistry().content(accepted["document_id"]) == data
        fate = _fate(url, accepted["document_id"], {"ingested", "failed"})
        assert (fate["state"], fate["attempts"], fate["door"]) == ("ingested", 1, "upload"), fate
        assert (inbox / SAMPLE_MHTML.name).read_bytes() == data

        payload, content_type = multipart([("notes.pdf", b"just text")], {})
        status, body = call(f"{url}/upload", payload, content_type)
        assert status == 415 and "notes.pdf: not an MHTML web archive or a PDF" in body["detail"]
        assert not (inbox / "notes.pdf").exists()
        assert call(f"{url}/documents/nothing-like-it")[0] == 404

    context = dg.build_sensor_context(
        instance=dagster_instance(), definitions=defs, resources={"index_db": IndexDatabase()}
    )
    result = inbox_sensor(context)
    assert (
        isinstance(result, dg.SkipReason)
        and ": 0 new, 0 changed, 0 deleted, 1 as before;" in result.skip_message
    ), "the uploaded file is known to the inbox: not ingested a second time"


def test_an_upload_that_cannot_be_read_fails_with_its_reason_in_the_api_and_the_cli(
    pg_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    forget_after: list[str],
) -> None:
    from vision_rag_pipeline.cli import main as cli_main

    monkeypatch.setenv("VISION_RAG_INBOX", str(tmp_path / "inbox"))
    broken = b"From: <Saved by Blink>\r\nMIME-Version: 1.0\r\nContent-Type: multipart/related; boundary=x\r\n\r\n--x--\r\n"
    with serving(create_app()) as url:
        payload, content_type = multipart([("broken.mhtml", broken)], {})
        status, body = call(f"{url}/upload", payload, content_type)
        assert status == 202
        document_id = body["documents"][0]["document_id"]
        forget_after.append(document_id)
        fate = _fate(url, document_id, {"ingested", "failed"})
    assert (fate["state"], fate["attempts"]) == ("failed", 1), "the file's own fault: no second attempt"
    assert fate["reason"].startswith("broken.mhtml: ") and "\n" not in fate["reason"]
    capsys.readouterr()
    assert cli_main(["status", document_id]) == 1
    out = capsys.readouterr().out
    assert out.startswith("failed    ") and "via upload, 1 attempt(s)" in out and fate["reason"] in out


@pytest.mark.parametrize("name", ["report", "ok.txt", " ", "x.pdf;.exe", ".hidden.pdf"])
def test_upload_names_the_inbox_would_skip_are_415_with_the_reason(
    base_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    monkeypatch.setenv("VISION_RAG_INBOX", str(tmp_path / "inbox"))
    payload, content_type = multipart([(name, SAMPLE_MHTML.read_bytes())], {})
    status, body = call(f"{base_url}/upload", payload, content_type)
    assert status == 415 and ("inbox" in body["detail"] or "no file name" in body["detail"]), body
    assert not list((tmp_path / "inbox").iterdir()), "nothing left where the sensor looks"


def test_a_huge_query_image_is_read_at_a_bounded_size() -> None:
    """A 356 KB PNG of 6300x6300 took 20 s and 1.2 GB: OCR and the classifier now see at most
    MAX_QUERY_PIXELS of it, and a large JPEG is decoded at a reduced scale."""
    from PIL import Image, ImageDraw

    from vision_rag_pipeline.query.image_query import MAX_QUERY_PIXELS, query_image

    for fmt in ("PNG", "JPEG"):
        big = Image.new("RGB", (6300, 6300), "white")
        ImageDraw.Draw(big).text((100, 100), "Revenue 4.2M", fill="black")
        buffer = io.BytesIO()
        big.save(buffer, format=fmt)
        picture = query_image(buffer.getvalue())
        with Image.open(io.BytesIO(picture.data)) as seen:
            assert seen.width * seen.height <= MAX_QUERY_PIXELS, (fmt, seen.size)
            assert abs(seen.width - seen.height) <= 1, "the aspect ratio is kept"


def test_image_queries_beyond_the_limit_get_429_with_retry_after(corpus) -> None:
    app = create_app(ingest_on_upload=False)
    app.state.image_slots.wait_seconds = 0.1
    image = base64.b64encode(chart(scale=0.8)).decode()
    with serving(app) as url:
        held = [app.state.image_slots.turn() for _ in range(2)]  # two queries are running
        for turn in held:
            turn.__enter__()
        try:
            status, body = call(f"{url}/search", {"image": image, "k": 3})
            assert status == 429 and "retry" in body["detail"]
        finally:
            for turn in held:
                turn.__exit__(None, None, None)
        status, body = call(f"{url}/search", {"image": image, "k": 3})
        assert status == 200 and body["hits"]


def test_the_openapi_spec_documents_every_error_an_operation_answers(base_url: str) -> None:
    """schemathesis (`--checks all`, schemathesis.toml) found 400, 404, 413 and 415 undocumented and
    a 422 whose `detail` was a string where the schema says a list."""
    status, spec = call(f"{base_url}/openapi.json")
    assert status == 200
    documented = {
        (path, method): set(operation["responses"])
        for path, item in spec["paths"].items()
        for method, operation in item.items()
    }
    assert {"202", "400", "404", "413", "415", "422", "503"} <= documented[("/upload", "post")]
    for path in ("/search", "/chat", "/enrichment-services/media-enrichment"):
        assert {"200", "400", "404", "413", "415", "422", "429", "503"} <= documented[(path, "post")], path
    assert {"200", "503"} <= documented[("/health", "get")]
    assert {"200", "404", "422"} <= documented[("/documents/{document_id}", "get")]
    status, body = call(f"{base_url}/search", {"query": None})  # valid per field, not as a whole
    assert status == 422 and isinstance(body["detail"], list)
    assert {"loc", "msg", "type"} <= set(body["detail"][0])


@pytest.mark.slow
def test_a_peer_server_takes_over_an_upload_whose_server_was_killed(
    pg_url: str, tmp_path: Path, forget_after: list[str]
) -> None:
    """Two `vision-rag serve` on one home, no daemon: the one running an upload is killed with
    SIGKILL mid-run; the other marks that run failed and runs the document again, and its two attempts
    are counted. Uploading the same file again while it runs asks for no second run."""
    import dagster as dg

    from vision_rag_pipeline.defs.runner import dagster_instance
    from vision_rag_pipeline_tests.openai_fake import FakeOpenAI, Reply, chat_reply

    with FakeOpenAI() as endpoint:
        endpoint.script(Reply(body=chat_reply("A slow description.").body, delay_s=30.0))
        env = os.environ | {
            "VISION_RAG_INBOX": str(tmp_path / "inbox"),
            "OPENAI_BASE_URL": endpoint.base_url,
            "OPENAI_API_KEY": "vr-test-placeholder-key",
        }
        servers = [_serve(env, tmp_path / f"serve-{name}.log") for name in ("a", "b")]
        try:
            (first, first_url), (_, second_url) = servers
            data = _unique(SAMPLE_MHTML.read_bytes())
            payload, content_type = multipart([(SAMPLE_MHTML.name, data)], {})
            status, body = call(f"{first_url}/upload", payload, content_type)
            assert status == 202, body
            document_id = body["documents"][0]["document_id"]
            forget_after.append(document_id)
            deadline = time.monotonic() + 300
            while not endpoint.requests and time.monotonic() < deadline:  # its run reached enrichment
                time.sleep(0.2)
            running = _fate(first_url, document_id, {"running"})
            assert running["state"] == "running" and endpoint.requests, running

            status, body = call(f"{second_url}/upload", payload, content_type)  # the same file again
            assert status == 202 and body["documents"][0]["status"] == "requested"
            assert _fate(second_url, document_id, {"running"})["attempts"] == 1, "no second request"

            first.kill()
            first.wait(timeout=30)
            fate = _fate(second_url, document_id, {"ingested", "failed"})
            assert (fate["state"], fate["attempts"]) == ("ingested", 2), fate
            killed = dagster_instance().get_run_by_id(running["run_id"])
            assert killed.status == dg.DagsterRunStatus.FAILURE, "the killed server's run is marked failed"
        finally:
            for process, _ in servers:
                process.kill()
                process.wait(timeout=30)


def _serve(env: dict[str, str], log: Path) -> tuple[subprocess.Popen, str]:
    """`vision-rag serve` on a free port, once it answers /health."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    process = subprocess.Popen(
        [sys.executable, "-m", "vision_rag_pipeline.cli", "serve", "--port", str(port)],
        env=env,
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if call(f"{url}/health")[0] == 200:
                return process, url
        except OSError:
            pass
        assert process.poll() is None, log.read_text()
        time.sleep(0.5)
    process.kill()
    raise AssertionError(f"serve did not answer: {log.read_text()}")
