"""The vision-LLM client, with the real `openai` client, against a local server speaking the OpenAI API."""

from __future__ import annotations

import base64
import os
import subprocess
import sys
from collections.abc import Iterator

import openai
import pytest

from vision_rag_pipeline.core.config import MllmFeature
from vision_rag_pipeline.enrichment.cost import vision_tokens
from vision_rag_pipeline.enrichment.vlm import VisionClient, VisionError, VisionImage, vision_client_from_env
from vision_rag_pipeline_tests.openai_fake import FakeOpenAI, Reply, chat_reply, error_reply

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
    return VisionClient(raw, engine=f"openai:{server.base_url}", max_attempts=3, sleep=sleeps.append)


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
