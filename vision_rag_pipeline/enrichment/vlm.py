"""Vision LLM client for any OpenAI-compatible endpoint (OpenAI, Azure OpenAI, Ollama, vLLM).

One chat call per image. The reference allows up to 10 images per call, but batching would
make the user's `max_tokens` a budget shared by ten descriptions (truncated replies), require
the model to answer in a strict JSON array (small local models often do not), and turn one bad
reply into ten failed images. Per-image calls keep the prompt exactly the user's, isolate
failures, and still run concurrently; the extra cost is the prompt text repeated per image,
small next to the image tokens (a 1024-px image costs 765).

The `openai` client runs with `max_retries=0`: retries happen here, with exponential backoff,
jitter and Retry-After, so the attempt bound and the sleep are ours (and testable). `openai` is
imported only once an endpoint is configured: offline, every ingest worker and CLI call would pay
~0.7 s to import it for nothing.
"""

from __future__ import annotations

import base64
import email.utils
import os
import random
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple

from vision_rag_pipeline.core.config import MllmFeature

if TYPE_CHECKING:
    import openai

DEFAULT_TIMEOUT_S = 60.0
RETRIABLE_STATUS = {408, 409, 429}


class VisionError(RuntimeError):
    """The endpoint could not produce a usable reply; the caller falls back to the offline path."""


class VisionImage(NamedTuple):
    data: bytes
    mime: str  # image/png or image/jpeg


def data_url(image: VisionImage | tuple[bytes, str]) -> str:
    data, mime = image
    return f"data:{mime};base64,{base64.b64encode(data).decode('ascii')}"


class VisionClient:
    """Chat completions with bounded retries; `engine` names the endpoint for cache keys."""

    def __init__(
        self,
        client: openai.OpenAI,
        engine: str,
        max_attempts: int = 4,
        base_delay_s: float = 1.0,
        max_delay_s: float = 30.0,
        sleep: Callable[[float], None] = time.sleep,
        jitter: Callable[[], float] = random.random,
        max_concurrency: int = 4,
    ) -> None:
        if max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")
        self.client = client
        self.engine = engine
        self.max_attempts = max_attempts
        self.base_delay_s = base_delay_s
        self.max_delay_s = max_delay_s
        self.sleep = sleep
        self.jitter = jitter
        self.max_concurrency = max_concurrency

    def describe_one(self, image: VisionImage | tuple[bytes, str], feature: MllmFeature) -> str:
        """The model's description of one image; raises VisionError on failure."""
        parts = [
            {"type": "text", "text": feature.prompt},
            {"type": "image_url", "image_url": {"url": data_url(image), "detail": feature.detail_mode}},
        ]
        return self.complete(feature.model, [{"role": "user", "content": parts}], feature.llm_kwargs)

    def fuse(self, system: str, user: str, model: str, llm_kwargs: dict[str, Any]) -> str:
        """A text-only chat completion (used to fuse a VLM description with OCR text)."""
        messages = [{"role": "system", "content": system}, {"role": "user", "content": user}]
        return self.complete(model, messages, llm_kwargs)

    def complete(self, model: str, messages: list[dict[str, Any]], llm_kwargs: dict[str, Any]) -> str:
        """The reply text, retrying 429/5xx/timeouts/connection errors; VisionError once exhausted."""
        import openai

        last_error: Exception | None = None
        for attempt in range(self.max_attempts):
            try:
                response = self.client.chat.completions.create(model=model, messages=messages, **llm_kwargs)
            except (openai.APITimeoutError, openai.APIConnectionError) as exc:
                last_error, delay = exc, None
            except openai.APIStatusError as exc:
                if exc.status_code not in RETRIABLE_STATUS and exc.status_code < 500:
                    raise VisionError(f"{model}: {exc.message}") from exc
                last_error, delay = exc, _retry_after_s(exc.response.headers)
            except (openai.OpenAIError, ValueError) as exc:  # a body that is not JSON / not a completion
                raise VisionError(f"{model}: malformed reply: {exc}") from exc
            else:
                return _reply_text(model, response)
            if attempt + 1 < self.max_attempts:
                self.sleep(self._backoff_s(attempt, delay))
        raise VisionError(f"{model}: gave up after {self.max_attempts} attempts: {_error_text(last_error)}")

    def _backoff_s(self, attempt: int, retry_after_s: float | None) -> float:
        if retry_after_s is not None:
            return min(retry_after_s, self.max_delay_s)
        ceiling = min(self.max_delay_s, self.base_delay_s * 2**attempt)
        return ceiling / 2 + self.jitter() * ceiling / 2  # "equal jitter": never zero, never in lockstep


def _reply_text(model: str, response: Any) -> str:
    choices = getattr(response, "choices", None)
    if not choices:
        raise VisionError(f"{model}: malformed reply: no choices")
    message = choices[0].message
    text = (message.content or "").strip() if message is not None else ""
    if not text:
        refusal = getattr(message, "refusal", None)
        raise VisionError(f"{model}: empty reply" + (f" (refusal: {refusal})" if refusal else ""))
    return text


def _retry_after_s(headers: Any) -> float | None:
    """Seconds the server asked us to wait (`retry-after-ms`, `Retry-After` seconds or HTTP date)."""
    millis = headers.get("retry-after-ms")
    if millis:
        try:
            return max(0.0, float(millis) / 1000)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        when = email.utils.parsedate_to_datetime(value) if email.utils.parsedate(value) else None
        return max(0.0, when.timestamp() - time.time()) if when else None


def _error_text(exc: Exception | None) -> str:
    import openai

    if isinstance(exc, openai.APIStatusError):
        return exc.message
    return f"{type(exc).__name__}: {exc}"


def vision_client_from_env(timeout_s: float = DEFAULT_TIMEOUT_S) -> VisionClient | None:
    """The configured endpoint, or None (offline) when no OpenAI/Azure variables are set.

    Azure OpenAI: AZURE_OPENAI_ENDPOINT + AZURE_OPENAI_API_KEY (+ OPENAI_API_VERSION); the model
    name is the deployment name. Otherwise OPENAI_API_KEY and/or OPENAI_BASE_URL (Ollama and vLLM
    need only the base URL; a placeholder key is sent because the client requires one).
    """
    azure_endpoint = os.environ.get("AZURE_OPENAI_ENDPOINT")
    azure_key = os.environ.get("AZURE_OPENAI_API_KEY")
    if azure_endpoint and azure_key:
        import openai

        client: openai.OpenAI = openai.AzureOpenAI(
            azure_endpoint=azure_endpoint,
            api_key=azure_key,
            api_version=os.environ.get("OPENAI_API_VERSION") or "2024-10-21",
            max_retries=0,
            timeout=timeout_s,
        )
        return VisionClient(client, engine=f"azure:{azure_endpoint.rstrip('/')}")
    api_key = os.environ.get("OPENAI_API_KEY")
    base_url = os.environ.get("OPENAI_BASE_URL")
    if not (api_key or base_url):
        return None
    import openai

    client = openai.OpenAI(base_url=base_url, api_key=api_key or "unused", max_retries=0, timeout=timeout_s)
    return VisionClient(client, engine=f"openai:{str(client.base_url).rstrip('/')}")
