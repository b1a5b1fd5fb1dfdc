"""The vision-LLM client, with the real `openai` client, against a local server speaking the OpenAI API."""

from __future__ import annotations

import base64
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import openai
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vision_rag_pipeline.core.config import MllmFeature, ProviderLimits
from vision_rag_pipeline.core.redact import REDACTED, redact, redact_url, url_secrets
from vision_rag_pipeline.enrichment.cost import vision_tokens
from vision_rag_pipeline.enrichment.vlm import VisionClient, VisionError, VisionImage, vision_client_from_env
from vision_rag_pipeline_tests.openai_fake import (
    HANG,
    FakeOpenAI,
    Reply,
    chat_reply,
    echo_key_reply,
    error_reply,
)

PNG = VisionImage(b"\x89PNG\r\n\x1a\nfake", "image/png")
JPEG = VisionImage(b"\xff\xd8\xfffake", "image/jpeg")


@pytest.fixture
def server() -> Iterator[FakeOpenAI]:
    with FakeOpenAI() as fake:
        yield fake


@pytest.fixture
def sleeps() -> list[float]:
    return []


@pytest.fixture
def client(server: FakeOpenAI, sleeps: list[float]) -> VisionClient:
    raw = openai.OpenAI(base_url=server.base_url, api_key="test-key", max_retries=0, timeout=10)
    return VisionClient(
        raw, engine=f"openai:{server.base_url}", limits=ProviderLimits(max_attempts=3), sleep=sleeps.append
    )


FEATURE = MllmFeature(
    model="gpt-4o-mini",
    prompt="Describe it.",
    detail_mode="high",
    llm_kwargs={"temperature": 0.2, "max_tokens": 321},
)


@pytest.mark.parametrize(
    ("width", "height", "detail", "tokens"),
    [(1024, 1024, "high", 765), (2048, 4096, "high", 1105), (4096, 4096, "low", 85), (512, 512, "auto", 255)],
)
def test_vision_tokens_match_the_providers_documented_examples(
    width: int, height: int, detail: str, tokens: int
) -> None:
    assert vision_tokens(width, height, detail) == tokens


def test_request_carries_model_prompt_detail_data_url_and_kwargs(
    server: FakeOpenAI, client: VisionClient
) -> None:
    server.script(chat_reply("A bar chart of revenue."))
    assert client.describe_one(PNG, FEATURE) == "A bar chart of revenue."
    [request] = server.requests
    assert request.path == "/v1/chat/completions"
    assert request.headers["authorization"] == "Bearer test-key"
    body = request.body
    assert body["model"] == "gpt-4o-mini"
    assert body["temperature"] == 0.2 and body["max_tokens"] == 321
    [message] = body["messages"]
    text_part, image_part = message["content"]
    assert text_part == {"type": "text", "text": "Describe it."}
    assert image_part["type"] == "image_url"
    assert image_part["image_url"]["detail"] == "high"
    url = image_part["image_url"]["url"]
    assert url.startswith("data:image/png;base64,")
    assert base64.b64decode(url.split(",", 1)[1]) == PNG.data


def test_429_with_retry_after_is_retried_and_succeeds(
    server: FakeOpenAI, client: VisionClient, sleeps: list[float]
) -> None:
    server.script(
        error_reply(429, "slow down", headers={"Retry-After": "0"}), chat_reply("second time lucky")
    )
    assert client.describe_one(PNG, FEATURE) == "second time lucky"
    assert len(server.requests) == 2
    assert sleeps == [0.0]  # Retry-After honoured instead of the backoff


def test_server_errors_forever_give_up_after_bounded_attempts_with_backoff(
    server: FakeOpenAI, client: VisionClient, sleeps: list[float]
) -> None:
    server.default = error_reply(500, "boom")
    with pytest.raises(VisionError, match="gave up after 3 attempts"):
        client.describe_one(PNG, FEATURE)
    assert len(server.requests) == 3
    assert len(sleeps) == 2 and sleeps[1] > sleeps[0] > 0  # exponential backoff between attempts


@pytest.mark.parametrize(
    "reply",
    [Reply(body="this is not JSON"), Reply(body={"choices": []}), chat_reply(None), chat_reply("   ")],
    ids=["not-json", "no-choices", "null-content", "blank"],
)
def test_malformed_reply_raises_vision_error_without_retrying(
    server: FakeOpenAI, client: VisionClient, reply: Reply
) -> None:
    server.script(reply)
    with pytest.raises(VisionError):
        client.describe_one(PNG, FEATURE)
    assert len(server.requests) == 1


def test_client_errors_are_not_retried(server: FakeOpenAI, client: VisionClient) -> None:
    server.script(error_reply(401, "bad key"))
    with pytest.raises(VisionError, match="bad key"):
        client.describe_one(PNG, FEATURE)
    assert len(server.requests) == 1


def test_fuse_sends_a_text_only_chat(server: FakeOpenAI, client: VisionClient) -> None:
    server.script(chat_reply('{"content": "fused"}'))
    assert client.fuse("system rules", "user data", "gpt-4o", {"temperature": 0}) == '{"content": "fused"}'
    messages = server.requests[0].body["messages"]
    assert messages == [
        {"role": "system", "content": "system rules"},
        {"role": "user", "content": "user data"},
    ]


def test_client_from_env_is_offline_without_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("OPENAI_API_KEY", "OPENAI_BASE_URL", "AZURE_OPENAI_ENDPOINT", "AZURE_OPENAI_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    assert vision_client_from_env() is None


def test_client_from_env_talks_to_openai_base_url(
    monkeypatch: pytest.MonkeyPatch, server: FakeOpenAI
) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("AZURE_OPENAI_ENDPOINT", raising=False)
    monkeypatch.setenv("OPENAI_BASE_URL", server.base_url)  # e.g. Ollama: no key needed
    vision = vision_client_from_env()
    assert vision is not None and vision.engine == f"openai:{server.base_url}"
    server.script(chat_reply("from env"))
    assert vision.describe_one(PNG, FEATURE) == "from env"


def test_client_from_env_prefers_azure(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AZURE_OPENAI_ENDPOINT", "https://example.openai.azure.com/")
    monkeypatch.setenv("AZURE_OPENAI_API_KEY", "azure-key")
    monkeypatch.setenv("OPENAI_API_VERSION", "2024-10-21")
    vision = vision_client_from_env()
    assert vision is not None
    assert isinstance(vision.client, openai.AzureOpenAI)
    assert vision.engine == "azure:https://example.openai.azure.com"


def test_offline_the_pipeline_never_imports_the_openai_client() -> None:
    """Importing `openai` costs ~0.7 s, paid by every ingest worker and CLI call that needs no endpoint."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "AZURE_OPENAI_"))}
    code = "import sys, vision_rag_pipeline.definitions; print('openai' in sys.modules)"
    loaded = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert loaded.stdout.strip() == "False"


# --- time budgets, circuit breaker, redaction ---------------------------------------------------


def _limited(server: FakeOpenAI, api_key: str = "test-key", **limits: float) -> VisionClient:
    raw = openai.OpenAI(base_url=server.base_url, api_key=api_key, max_retries=0)
    return VisionClient(raw, engine="openai:test", sleep=lambda _s: None, limits=ProviderLimits(**limits))


def test_a_hanging_endpoint_costs_one_image_budget_not_timeout_times_attempts(server: FakeOpenAI) -> None:
    server.default = HANG
    client = _limited(server, timeout_s=60, image_budget_s=1.5, breaker_failures=10)
    started = time.monotonic()
    with pytest.raises(VisionError, match="time budget spent") as caught:
        client.describe_one(PNG, FEATURE)
    assert caught.value.reason == "timeout"
    assert time.monotonic() - started < 10, "a correctness bound: 60 s x 4 attempts would be 240 s"


def test_repeated_failures_open_the_breaker_for_the_rest_of_the_run(server: FakeOpenAI) -> None:
    server.default = error_reply(503, "overloaded")
    client = _limited(server, max_attempts=2, breaker_failures=3)
    with pytest.raises(VisionError, match="gave up after 2 attempts") as first:
        client.describe_one(PNG, FEATURE)
    assert first.value.reason == "http 503"
    with pytest.raises(VisionError, match="circuit open"):
        client.describe_one(PNG, FEATURE)  # its first attempt is the third failure in a row
    with pytest.raises(VisionError, match="circuit open") as later:
        client.fuse("system", "user", "gpt-4o", {})
    assert later.value.reason == "circuit open"
    assert len(server.requests) == 3, "once open, the endpoint is not asked again"


def test_after_a_failure_no_new_call_starts_while_earlier_calls_are_still_out(server: FakeOpenAI) -> None:
    """A thread whose call failed must not send its next one before the call still hanging in
    another thread has timed out: that timeout opens the breaker (it once cost a second budget)."""
    server.script(HANG, error_reply(503, "overloaded"))
    client = _limited(server, max_attempts=1, timeout_s=2, image_budget_s=5, breaker_failures=2)
    hanging = threading.Thread(target=lambda: pytest.raises(VisionError, client.describe_one, PNG, FEATURE))
    hanging.start()
    while not server.requests:  # the hanging call is out
        time.sleep(0.01)
    with pytest.raises(VisionError, match="overloaded"):
        client.describe_one(PNG, FEATURE)  # the first failure
    with pytest.raises(VisionError, match="circuit open"):
        client.describe_one(PNG, FEATURE)  # waits for the hanging call's timeout, the second failure
    hanging.join()
    assert len(server.requests) == 2, "the endpoint was not asked a third time"


def test_a_success_resets_the_breaker_and_a_refused_image_never_opens_it(server: FakeOpenAI) -> None:
    client = _limited(server, max_attempts=1, breaker_failures=2)
    server.script(error_reply(500), chat_reply("ok"), error_reply(500), *[error_reply(400, "too big")] * 3)
    with pytest.raises(VisionError):
        client.describe_one(PNG, FEATURE)
    assert client.describe_one(PNG, FEATURE) == "ok"
    for _ in range(4):  # one server error, then three refusals of this image: still closed
        with pytest.raises(VisionError, match="gave up|too big"):
            client.describe_one(PNG, FEATURE)
    assert client.breaker.open_reason is None


def test_a_key_echoed_in_an_error_body_is_redacted(server: FakeOpenAI) -> None:
    key = "vr-test-9f2c4b1e77a0d3"
    server.script(echo_key_reply(401), echo_key_reply(500), echo_key_reply(500))
    client = _limited(server, api_key=key, max_attempts=2, breaker_failures=10)
    for _ in range(2):
        with pytest.raises(VisionError) as caught:
            client.describe_one(PNG, FEATURE)
        assert key in server.requests[-1].headers["authorization"], "the fake did see the key"
        assert key not in str(caught.value) and "[REDACTED]" in str(caught.value)
        chained = [caught.value.__cause__, caught.value.__context__]
        assert chained == [None, None], "no unredacted provider exception rides along"


@pytest.mark.parametrize(
    ("text", "secret"),
    [
        ("Incorrect API key provided: sk-proj-AbCdEf0123456789xyz.", "sk-proj-AbCdEf0123456789xyz"),
        (
            "upstream said: Authorization: Bearer eyJhbGciOi.JIUzI1NiJ9-abc_def",
            "eyJhbGciOi.JIUzI1NiJ9-abc_def",
        ),
        ('{"api_key": "my-own-gateway-secret-42"}', "my-own-gateway-secret-42"),
        ("access_token=Zm9vYmFyYmF6cXV4", "Zm9vYmFyYmF6cXV4"),
    ],
)
def test_redact_removes_token_shaped_strings(text: str, secret: str) -> None:
    redacted = redact(text)
    assert secret not in redacted and REDACTED in redacted


def test_redact_keeps_ordinary_error_text() -> None:
    text = "Error code: 503 - model gpt-4o is overloaded, retry after 3 s (request id req_12)"
    assert redact(text, ["unused"]) == text


@settings(max_examples=200, deadline=None)
@given(
    key=st.text(
        alphabet="abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_", min_size=8, max_size=60
    ),
    start=st.integers(0, 60),
    length=st.integers(8, 60),
    upper=st.booleans(),
    around=st.text(alphabet=" .:;,()\n", max_size=5),
)
def test_redact_finds_any_run_of_eight_key_characters_in_any_case(
    key: str, start: int, length: int, upper: bool, around: str
) -> None:
    """A provider that echoes the key re-cased, cut at either end, or its tail only."""
    start = min(start, len(key) - 8)
    fragment = key[start : start + length]
    fragment = fragment.upper() if upper else fragment.lower()
    redacted = redact(f"error{around}{fragment}{around}done", [key])
    assert fragment.lower() not in redacted.lower() and REDACTED in redacted


def test_redact_strips_a_url_password_and_keeps_the_rest_readable() -> None:
    url = "http://user:p@ss:w0rd!@gateway.example:8080/v1"
    assert url_secrets(url) == ("p@ss:w0rd!",)
    assert redact_url(url) == "http://user:[REDACTED]@gateway.example:8080/v1"
    said = redact(f"Connection error to {url}/chat/completions", url_secrets(url))
    assert "w0rd" not in said and "gateway.example:8080/v1/chat/completions" in said
    assert (
        redact_url("postgresql://postgres:@/postgres?host=/tmp/x")
        == "postgresql://postgres:@/postgres?host=/tmp/x"
    )
