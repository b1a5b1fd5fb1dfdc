"""The HTTP API against hostile callers, through a real uvicorn server: token authentication, body
limits counted on the stream, and a JSON reason for every error (hypothesis-driven fuzzing).

`VISION_RAG_FUZZ_EXAMPLES` sets the examples per fuzz test (default small; raise it for a long run).
"""

from __future__ import annotations

import base64
import contextlib
import io
import json
import os
import select
import socket
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

import vision_rag_pipeline.api as api
from vision_rag_pipeline.api import create_app, is_loopback
from vision_rag_pipeline.cli import main
from vision_rag_pipeline_tests.test_api import call, multipart, serving

FUZZ_EXAMPLES = int(os.environ.get("VISION_RAG_FUZZ_EXAMPLES", "15"))
FUZZ = settings(
    max_examples=FUZZ_EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
TOKEN = "vr-api-token-for-tests-1c9e"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
ENDPOINTS = ["/search", "/chat", "/enrichment-services/media-enrichment"]


@pytest.fixture(scope="module")
def guarded(pg_url: str) -> Iterator[str]:
    """The API with a token configured (uploads are left to the inbox sensor)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("VISION_RAG_API_TOKEN", TOKEN)
        app = create_app(ingest_on_upload=False)
    with serving(app) as url:
        yield url


def png(size: tuple[int, int] = (40, 30), mode: str = "RGB") -> bytes:
    buffer = io.BytesIO()
    Image.new(mode, size).save(buffer, format="PNG")
    return buffer.getvalue()


# --- authentication ------------------------------------------------------------------------------


def test_serve_refuses_a_network_address_without_a_token(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("VISION_RAG_API_TOKEN", raising=False)
    assert main(["serve", "--host", "0.0.0.0"]) == 2
    error = capsys.readouterr().err
    assert "refusing to listen on 0.0.0.0" in error and "VISION_RAG_API_TOKEN" in error


@pytest.mark.parametrize("token", [" ", "short-token", "sixteen chars ok", "tab\tin-the-token-123"])
def test_a_guessable_token_is_refused_naming_the_setting(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], token: str
) -> None:
    """A token of one space let `--host 0.0.0.0` start; a token is 16 printable characters or more."""
    monkeypatch.setenv("VISION_RAG_API_TOKEN", token)
    for host in ("0.0.0.0", "127.0.0.1"):
        assert main(["serve", "--host", host]) == 2
        error = capsys.readouterr().err
        assert error.count("\n") == 1 and "VISION_RAG_API_TOKEN must be at least 16" in error, error
        assert token.strip() not in error or not token.strip(), "the token itself is not printed"


def _request(url: str, headers: dict[str, str], body: bytes | None = None, content_type: str = "") -> int:
    sent = {"Content-Type": content_type} if content_type else {}
    request = urllib.request.Request(url, data=body, headers={**sent, **headers})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status
    except urllib.error.HTTPError as error:
        assert json.loads(error.read())["detail"]
        return error.code


def test_without_a_token_only_requests_addressed_to_this_machine_are_answered(
    pg_url: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """DNS rebinding and CSRF: `curl -H 'Host: attacker.example' -H 'Origin: http://attacker.example'
    -F files=@x.pdf :8101/upload` was 202."""
    monkeypatch.delenv("VISION_RAG_API_TOKEN", raising=False)
    monkeypatch.setenv("VISION_RAG_INBOX", str(tmp_path / "inbox"))
    pdf = b"%PDF-1.4\n%%EOF\n"
    with serving(create_app(ingest_on_upload=False)) as url:
        port = urllib.parse.urlsplit(url).port
        here = f"127.0.0.1:{port}"
        foreign = [
            {"Host": "attacker.example", "Origin": "http://attacker.example"},
            {"Host": f"attacker.example:{port}"},
            {"Host": here, "Origin": "http://attacker.example"},
            {"Host": here, "Origin": f"http://attacker.example:{port}"},
            {"Host": here, "Origin": "null"},
            {"Host": here, "Origin": "http://127.0.0.1:1"},
        ]
        for headers in foreign:
            payload, content_type = multipart([("x.pdf", pdf)], {})
            assert _request(f"{url}/upload", headers, payload, content_type) == 403, headers
            assert _request(f"{url}/health", headers) == 403, headers
        assert not (tmp_path / "inbox").exists() or not list((tmp_path / "inbox").iterdir())
        own = [
            {},
            {"Host": f"localhost:{port}", "Origin": f"http://localhost:{port}"},
            {"Host": f"[::1]:{port}", "Origin": f"http://127.0.0.1:{port}"},
        ]
        for headers in own:
            payload, content_type = multipart([("x.pdf", pdf)], {})
            assert _request(f"{url}/upload", headers, payload, content_type) == 202, headers
    monkeypatch.setenv("VISION_RAG_API_TOKEN", TOKEN)  # behind a proxy: the token decides, not the names
    with serving(create_app(ingest_on_upload=False)) as url:
        foreign_with_token = {"Host": "rag.example.org", "Origin": "https://app.example.org", **AUTH}
        assert _request(f"{url}/health", foreign_with_token) == 200


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("::1", True),
        ("localhost", True),
        ("0.0.0.0", False),
        ("10.0.0.5", False),
        ("::", False),
        ("myhost.example", False),
    ],
)
def test_only_loopback_addresses_count_as_private(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


@pytest.mark.parametrize(
    "headers",
    [{}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN}, {"Authorization": f"Basic {TOKEN}"}],
    ids=["none", "wrong", "no-scheme", "basic"],
)
def test_every_endpoint_wants_the_token(guarded: str, headers: dict[str, str]) -> None:
    for path in [*ENDPOINTS, "/upload"]:
        status, body = call(f"{guarded}{path}", {"query": "picnic"}, headers=headers)
        assert status == 401 and "API token" in body["detail"], path


def test_with_the_token_requests_go_through_and_the_docs_stay_open(guarded: str) -> None:
    status, body = call(f"{guarded}/search", {"k": 3}, headers=AUTH)
    assert status == 422 and "query or an image" in body["detail"][0]["msg"]
    status, spec = call(f"{guarded}/openapi.json")
    assert status == 200 and "/search" in spec["paths"]


# --- body limits on the stream -------------------------------------------------------------------


def _raw_post(url: str, head: dict[str, str], chunks: Iterator[bytes]) -> tuple[int, dict]:
    """POST chunk by chunk on a plain socket; the server may answer (and close) before the end."""
    parsed = urllib.parse.urlsplit(url)
    with socket.create_connection((parsed.hostname, parsed.port), timeout=30) as sock:
        lines = [
            f"POST {parsed.path} HTTP/1.1",
            f"Host: {parsed.netloc}",
            *(f"{k}: {v}" for k, v in head.items()),
        ]
        sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
        try:
            for chunk in chunks:
                if select.select([sock], [], [], 0)[0]:
                    break  # the server answered before the end of the body
                sock.sendall(chunk)
        except (BrokenPipeError, ConnectionResetError):
            pass  # refused mid-body, as it should be
        reply = b""
        with contextlib.suppress(ConnectionResetError):  # a reset after the reply: the unsent rest
            while data := sock.recv(65536):
                reply += data
    status_line, _, rest = reply.partition(b"\r\n")
    _, _, body = rest.partition(b"\r\n\r\n")
    return int(status_line.split()[1]), json.loads(body)


def test_a_chunked_body_without_content_length_is_cut_off_at_the_limit(
    guarded: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(api, "MAX_QUERY_BODY_BYTES", 256 * 1024)
    chunk = b"x" * 65536
    sent: list[int] = []

    def framed() -> Iterator[bytes]:  # 640 MB if the server read it whole
        for i in range(10_000):
            sent.append(i)
            yield b"%x\r\n" % len(chunk) + chunk + b"\r\n"

    head = {**AUTH, "Content-Type": "application/json", "Transfer-Encoding": "chunked"}
    status, body = _raw_post(f"{guarded}/search", head, framed())
    assert status == 413 and "262,144 byte limit" in body["detail"]
    assert len(sent) < 200, "refused early, not after reading the whole stream"
    status, _ = call(f"{guarded}/search", {"k": 3}, headers=AUTH)
    assert status == 422, "the server is still serving"


def test_a_declared_oversized_body_is_refused_before_it_is_read(guarded: str) -> None:
    head = {**AUTH, "Content-Type": "application/json", "Content-Length": str(api.MAX_QUERY_BODY_BYTES + 1)}
    status, body = _raw_post(f"{guarded}/chat", head, iter([]))
    assert status == 413 and "byte limit" in body["detail"]


def test_search_fields_are_bounded(guarded: str) -> None:
    too_many = {"query": "picnic", "documents": [f"doc-{i}" for i in range(api.MAX_FILTER_ITEMS + 1)]}
    status, body = call(f"{guarded}/search", too_many, headers=AUTH)
    assert status == 422 and body["detail"][0]["loc"][-1] == "documents"
    huge_image = {"image": "A" * (api.MAX_IMAGE_CHARS + 4)}
    status, body = call(f"{guarded}/chat", {"query": "x", **huge_image}, headers=AUTH)
    assert status == 422 and body["detail"][0]["loc"][-1] == "image"
    assert "input" not in body["detail"][0], "a 27 MB field is not echoed back"


# --- every error a JSON reason -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "raw"),
    [
        ("/search", b'{"query": "picnic\\u0000"}'),
        ("/search", b'{"query": "\\ud800 lone"}'),
        ("/search", b'{"query": "x", "metadata": {"\\udfff": 1}}'),
        ("/chat", b'{"query": "nul \\u0000 here"}'),
        ("/enrichment-services/media-enrichment", b'{"images": [{"data": "AAAA", "name": "\\ud800"}]}'),
        ("/search", b"[" * 100_000),
        ("/search", b"\xff\xfe not utf-8"),
    ],
    ids=["nul", "surrogate", "surrogate-key", "chat-nul", "enrichment-name", "deep-nesting", "not-utf8"],
)
def test_hostile_text_gets_a_json_4xx(guarded: str, path: str, raw: bytes) -> None:
    status, body = call(f"{guarded}{path}", raw, headers=AUTH)
    assert 400 <= status < 500 and body["detail"], (status, body)


def test_media_enrichment_names_bombs_and_big_images_are_4xx_or_handled(guarded: str) -> None:
    path = f"{guarded}/enrichment-services/media-enrichment"
    long_name = {"images": [{"data": base64.b64encode(png()).decode(), "name": "n" * 300}]}
    status, body = call(path, long_name, headers=AUTH)
    assert status == 422 and body["detail"][0]["loc"][-1] == "name"
    bomb = {"images": [{"data": base64.b64encode(png((20_000, 20_000), "1")).decode()}]}
    status, body = call(path, bomb, headers=AUTH)
    assert status == 200 and "decompression bomb" in " ".join(body["classifier_result"]["reasons"])
    over = {"images": [{"data": "A" * (api.MAX_IMAGE_BYTES // 3 * 4 + 8)}]}  # under the field limit
    status, body = call(path, over, headers=AUTH)
    assert status == 413 and "over the 20 MB limit" in body["detail"]


def _deep_image(kind: str, side: int = 6300) -> bytes:
    """A side x side 16-bit PNG or 32-bit float TIFF, white with one dark bar: ~90-260 KB of file
    that decodes to 80-160 MB."""
    import numpy as np

    dtype, ink, paper = (np.uint16, 1000, 60000) if kind == "png16" else (np.float32, 0.1, 0.9)
    pixels = np.full((side, side), paper, dtype=dtype)
    pixels[side // 10 : side // 10 + 200, side // 10 : side // 2] = ink
    buffer = io.BytesIO()
    if kind == "png16":
        Image.fromarray(pixels).save(buffer, format="PNG")
    else:
        Image.fromarray(pixels, mode="F").save(buffer, format="TIFF", compression="tiff_deflate")
    return buffer.getvalue()


@contextlib.contextmanager
def _rss_growth() -> Iterator[list[int]]:
    """This process's RSS growth over its value at the start, peak sampled every 10 ms ([bytes])."""
    import threading

    import psutil

    process = psutil.Process()
    baseline = process.memory_info().rss
    peak, done = [0], threading.Event()

    def sample() -> None:
        while not done.wait(0.01):
            peak[0] = max(peak[0], process.memory_info().rss - baseline)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        yield peak
    finally:
        done.set()
        sampler.join()


def test_deep_images_are_decoded_at_8_bits_and_a_request_past_its_budget_is_413(guarded: str) -> None:
    """One 1.2 MB request (nine 16-bit 6300² PNGs) took `serve` from 729 MB to 2,977 MB for 110 s; one
    such PNG as a search cost +1.03 GB, a float TIFF +1.16 GB. 16-bit and float images are brought
    to 8 bits a strip at a time now (BENCHMARKS.md measures `serve` itself), and a request whose
    images hold more pixels, or would take more memory, than limits.requests allows is refused before
    any is decoded."""
    png16, tiff = _deep_image("png16"), _deep_image("float")
    enrich = f"{guarded}/enrichment-services/media-enrichment"
    nine = {
        "images": [{"data": base64.b64encode(png16).decode()}] * 9,
        "features": {"cache": {"enabled": False}},
    }
    status, body = call(enrich, nine, headers=AUTH)
    assert status == 413 and "(limits.requests.max_pixels)" in body["detail"], body
    two = {**nine, "images": nine["images"][:2]}  # 79 megapixels, about 1.4 GB to decode and read
    status, body = call(enrich, two, headers=AUTH)
    assert status == 413 and "(limits.requests.max_memory_bytes)" in body["detail"], body
    for path, image in (("/search", png16), ("/enrichment-services/media-enrichment", tiff)):
        encoded = base64.b64encode(image).decode()
        request = (
            {"image": encoded, "k": 3}
            if path == "/search"
            else {"images": [{"data": encoded}], "features": {"cache": {"enabled": False}}}
        )
        with _rss_growth() as growth:
            status, body = call(f"{guarded}{path}", request, headers=AUTH)
        assert status == 200, body
        # before: +1,031 MB (16-bit search), +1,536 MB (float enrichment); now about +250 and +700
        assert growth[0] < 900 * 2**20, f"{path}: +{growth[0] / 2**20:.0f} MB for one deep image"


def test_upload_file_names_that_cannot_be_files_are_422(guarded: str) -> None:
    pdf = b"%PDF-1.4\n%%EOF\n"
    for name in ["x" * 300 + ".pdf", "nul\x00.pdf"]:
        payload, content_type = multipart([(name, pdf)], {})
        status, body = call(f"{guarded}/upload", payload, content_type, headers=AUTH)
        assert status == 422 and "file name" in body["detail"][0]["msg"], name


HOSTILE_NAMES = {
    "line1\nFAILED fake.pdf": "line1 FAILED fake.pdf",
    "red\x1b[31mALERT\x1b[0m.pdf": "redALERT.pdf",
    "title\x1b]0;pwned\x07.pdf": "title.pdf",
    "report\u202efdp.exe.pdf": "report fdp.exe.pdf",
    "zero\u200bwidth\tand\x7fdel.pdf": "zero width and del.pdf",
}


def test_upload_names_are_reduced_to_printable_characters_before_they_are_stored(
    guarded: str, vision_rag_home: Path, fresh_database: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A name `"line1\nFAILED fake.pdf"` made `vision-rag status` print a forged line; ANSI escapes
    and right-to-left marks reached the terminal."""
    from vision_rag_pipeline.documents.registry import DocumentRegistry

    monkeypatch.setenv("VISION_RAG_PG_URL", fresh_database)  # requests no other test's runner takes up
    for sent, kept in HOSTILE_NAMES.items():
        payload, content_type = multipart([(sent, b"%PDF-1.4\n%%EOF\n" + sent.encode())], {})
        status, body = call(f"{guarded}/upload", payload, content_type, headers=AUTH)
        assert status == 202, (sent, body)
        [document] = body["documents"]
        assert document["name"] == kept
        assert (vision_rag_home / "inbox" / kept).is_file()
        assert Path(DocumentRegistry().get(document["document_id"]).source_path).name == kept


def test_status_prints_each_upload_on_one_line_with_its_name_escaped(
    fresh_database: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """Rows stored before names were reduced (or a reason quoting a name) print escaped, one line each."""
    from vision_rag_pipeline.documents.registry import DocumentRegistry

    monkeypatch.setenv("VISION_RAG_PG_URL", fresh_database)  # the test's own registry
    registry = DocumentRegistry()
    ids = []
    for name in HOSTILE_NAMES:
        path = tmp_path / name
        ids.append(registry.refuse(path, "upload", f"{name}: not an MHTML web archive or a PDF").document_id)
    capsys.readouterr()
    main(["status", *ids])
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == len(HOSTILE_NAMES)
    assert not any(char in "".join(lines) for char in "\x1b\x07\u202e\u200b\t\x7f")
    assert not any(line.startswith("FAILED") for line in lines)
    assert any("line1\\nFAILED fake.pdf" in line for line in lines)


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=40),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=12,
)
FIELDS = {
    "/search": ["query", "image", "k", "mode", "documents", "kinds", "metadata", "rag_config"],
    "/chat": ["query", "image", "k", "rag_config"],
    "/enrichment-services/media-enrichment": ["images", "domain", "config_version", "features", "rag_config"],
}
IMAGE_ITEMS = st.fixed_dictionaries(
    {},
    optional={
        "data": st.sampled_from(["", "AAAA", "%%%", base64.b64encode(png()).decode()]) | st.text(max_size=20),
        "url": st.sampled_from(["data:image/png;base64,", "data:,x", "http://x/y.png"])
        | st.text(max_size=20),
        "name": st.text(max_size=300),
        "mime": st.text(max_size=30),
    },
)


@st.composite
def requests(draw: st.DrawFn) -> tuple[str, object]:
    path = draw(st.sampled_from(sorted(FIELDS)))
    names = draw(st.lists(st.sampled_from(FIELDS[path]), unique=True, max_size=4))
    body: dict[str, object] = {name: draw(JSON_VALUES) for name in names}
    if "query" in body and draw(st.booleans()):
        body["query"] = draw(st.text(min_size=1, max_size=60))
    if path.startswith("/enrichment") and draw(st.booleans()):
        body["images"] = draw(st.lists(IMAGE_ITEMS, min_size=1, max_size=3))
    return path, draw(st.one_of(st.just(body), JSON_VALUES))


@FUZZ
@given(requests())
def test_fuzzed_json_requests_never_get_an_unexplained_error(
    guarded: str, request: tuple[str, object]
) -> None:
    path, body = request
    status, reply = call(f"{guarded}{path}", json.dumps(body).encode(), headers=AUTH)
    assert status != 500 and (status == 200 or reply["detail"]), (status, reply)


@FUZZ
@given(
    path=st.sampled_from([*ENDPOINTS, "/upload"]),
    raw=st.binary(max_size=300),
    content_type=st.sampled_from(["application/json", "multipart/form-data; boundary=x", "text/plain", ""]),
)
def test_fuzzed_raw_bodies_get_a_json_4xx(guarded: str, path: str, raw: bytes, content_type: str) -> None:
    status, reply = call(f"{guarded}{path}", raw or b" ", content_type, headers=AUTH)
    assert 400 <= status < 500 and reply["detail"], (status, reply)


@FUZZ
@given(name=st.text(min_size=1, max_size=300))
def test_fuzzed_upload_names_are_saved_or_refused_with_a_reason(guarded: str, name: str) -> None:
    payload, content_type = multipart(
        [(name.replace('"', "'").replace("\r", "").replace("\n", ""), b"%PDF-1.4\n%%EOF\n")], {}
    )
    status, reply = call(f"{guarded}/upload", payload, content_type, headers=AUTH)
    assert status == 202 or (400 <= status < 500 and reply["detail"]), (status, reply)


# Any code point, lone surrogates and control characters included (json.dumps escapes them).
HOSTILE_TEXT = st.text(st.characters(exclude_categories=()), max_size=80)


@st.composite
def well_formed(draw: st.DrawFn) -> tuple[str, dict[str, object]]:
    """Requests of the right shape whose text is anything: they reach the search, answer and
    enrichment code instead of stopping at validation."""
    text = draw(HOSTILE_TEXT.filter(str.strip))
    path = draw(st.sampled_from(sorted(FIELDS)))
    if path == "/search":
        body: dict[str, object] = {
            "query": text,
            "k": draw(st.integers(1, 100)),
            "mode": draw(st.sampled_from(["hybrid", "vector", "lexical"])),
        }
        if draw(st.booleans()):
            body["documents"] = draw(st.lists(HOSTILE_TEXT, max_size=3))
        if draw(st.booleans()):
            body["metadata"] = draw(st.dictionaries(HOSTILE_TEXT, HOSTILE_TEXT | st.integers(), max_size=2))
    elif path == "/chat":
        body = {"query": text}
    else:
        image = {
            "data": base64.b64encode(png((120, 80))).decode(),
            "name": draw(HOSTILE_TEXT),
            "mime": "image/png",
        }
        body = {"images": [image], "domain": text[:40], "features": {"cache": {"enabled": False}}}
    return path, body


@FUZZ
@given(well_formed())
def test_fuzzed_hostile_text_in_well_formed_requests_is_answered_or_refused_with_a_reason(
    guarded: str, request: tuple[str, dict[str, object]]
) -> None:
    path, body = request
    status, reply = call(f"{guarded}{path}", json.dumps(body).encode(), headers=AUTH)
    assert status == 200 or (status == 422 and reply["detail"]), (status, reply)
