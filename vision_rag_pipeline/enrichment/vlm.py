"""Vision LLM client for any OpenAI-compatible endpoint (OpenAI, Azure OpenAI, Ollama, vLLM).

One chat call per image. The reference allows up to 10 images per call, but batching would
make the user's `max_tokens` a budget shared by ten descriptions (truncated replies), require
the model to answer in a strict JSON array (small local models often do not), and turn one bad
reply into ten failed images. Per-image calls keep the prompt exactly the user's, isolate
failures, and still run concurrently; the extra cost is the prompt text repeated per image,
small next to the image tokens (a 1024-px image costs 765).

The `openai` client runs with `max_retries=0`: retries happen here, with exponential backoff,
jitter and Retry-After, so the attempt bound and the sleep are ours (and testable), inside the
time budgets and circuit breaker of `ProviderLimits` (a hanging endpoint costs a document at most
about one image budget, not 60 s x 4 attempts per image). Error texts are redacted of the key and
of anything shaped like a token before they leave this module. `openai` is
imported only once an endpoint is configured: offline, every ingest worker and CLI call would pay
~0.7 s to import it for nothing.
"""

from __future__ import annotations

import base64
import email.utils
import random
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple

from vision_rag_pipeline.core.config import MllmFeature, ProviderLimits, VisionEndpoint
from vision_rag_pipeline.core.redact import redact, redact_url, url_secrets

if TYPE_CHECKING:
    import openai

RETRIABLE_STATUS = {408, 409, 429}
# Failures that say nothing about the endpoint's health (this image or this request was refused):
# they never open the breaker.
REQUEST_SPECIFIC_STATUS = {400, 413, 415, 422}


class VisionError(RuntimeError):
    """The endpoint could not produce a usable reply; the caller falls back to the offline path.

    `reason` is a short category for the run summary (timeout, http 503, circuit open, ...); the
    message has the detail. Both are redacted of credentials.
    """

    def __init__(self, message: str, reason: str = "error") -> None:
        super().__init__(message)
        self.reason = reason


class VisionImage(NamedTuple):
    data: bytes
    mime: str  # image/png or image/jpeg


def data_url(image: VisionImage | tuple[bytes, str]) -> str:
    data, mime = image
    return f"data:{mime};base64,{base64.b64encode(data).decode('ascii')}"


class _Failure(NamedTuple):
    reason: str  # short category for the run summary
    message: str  # redacted detail
    retriable: bool = False
    retry_after_s: float | None = None
    counts: bool = True  # towards opening the breaker (not when only this request was refused)


class _Breaker:
    """One run's patience with the endpoint: consecutive failures and a deadline, shared by its threads.

    After a failed call, no new call starts while calls begun before it are still out: they are
    about to say whether the endpoint is down (a hanging endpoint times them all out together, and
    a thread starting its next image in between would wait a whole budget again).
    """

    def __init__(self, limits: ProviderLimits, clock: Callable[[], float]) -> None:
        self.limits = limits
        self.clock = clock
        self._verdict = threading.Condition()
        self._failures = 0
        self._in_flight = 0
        self._deadline: float | None = None
        self._first_call: float | None = None
        self._last_return: float | None = None
        self.open_reason: str | None = None

    def deadline(self) -> float:
        with self._verdict:
            if self._deadline is None:
                self._deadline = self.clock() + self.limits.document_budget_s
            return self._deadline

    def await_verdict(self, until: float) -> None:
        """While a call has failed and others are still out, wait (until `until`) for their outcome."""
        with self._verdict:
            while self._failures and self._in_flight and self.open_reason is None:
                remaining = until - self.clock()
                if remaining <= 0:
                    return
                self._verdict.wait(remaining)

    def attempt_started(self) -> None:
        with self._verdict:
            self._in_flight += 1
            self._first_call = self._first_call or self.clock()

    def attempt_ended(self, outcome: str | _Failure | None) -> None:
        """Record one attempt's outcome (None: it raised): success resets the failure count, a failure
        that says something about the endpoint adds to it and may open the breaker."""
        with self._verdict:
            self._in_flight -= 1
            self._last_return = self.clock()
            if isinstance(outcome, str):
                self._failures = 0
            elif outcome is not None and outcome.counts:
                self._failures += 1
                if self._failures >= self.limits.breaker_failures and self.open_reason is None:
                    self.open_reason = f"{self._failures} failed calls in a row (last: {outcome.reason})"
            self._verdict.notify_all()

    def seconds_waited(self) -> float:
        """Wall time from the run's first call to the end of its last: what the endpoint cost it."""
        with self._verdict:
            return (self._last_return or 0.0) - (self._first_call or 0.0)

    def check(self) -> None:
        if self.open_reason is None and self.clock() >= self.deadline():
            self.open_reason = f"document budget of {self.limits.document_budget_s:g}s spent"
        if self.open_reason is not None:
            raise VisionError(
                f"circuit open: {self.open_reason}; offline path for the rest of the run", "circuit open"
            )


class VisionClient:
    """Chat completions with bounded retries, time budgets and a circuit breaker.

    `engine` names the endpoint for cache keys. One client serves one run (a document): its breaker,
    once open, sends every later call of the run straight to the offline path.
    """

    def __init__(
        self,
        client: openai.OpenAI,
        engine: str,
        base_delay_s: float = 1.0,
        max_delay_s: float = 30.0,
        sleep: Callable[[float], None] = time.sleep,
        jitter: Callable[[], float] = random.random,
        max_concurrency: int = 4,
        limits: ProviderLimits | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        limits = limits or ProviderLimits()
        self.client = client
        self.engine = engine
        self.limits = limits
        self.base_delay_s = base_delay_s
        self.max_delay_s = max_delay_s
        self.sleep = sleep
        self.jitter = jitter
        self.clock = clock
        self.max_concurrency = max_concurrency
        self.breaker = _Breaker(limits, clock)
        key = getattr(client, "api_key", None)
        self._secrets = (key,) if isinstance(key, str) else ()
        self._secrets += url_secrets(str(getattr(client, "base_url", "") or ""))

    def describe_one(
        self, image: VisionImage | tuple[bytes, str], feature: MllmFeature, budget_s: float | None = None
    ) -> str:
        """The model's description of one image; raises VisionError on failure."""
        parts = [
            {"type": "text", "text": feature.prompt},
            {"type": "image_url", "image_url": {"url": data_url(image), "detail": feature.detail_mode}},
        ]
        messages = [{"role": "user", "content": parts}]
        return self.complete(feature.model, messages, feature.llm_kwargs, budget_s)

    def fuse(
        self, system: str, user: str, model: str, llm_kwargs: dict[str, Any], budget_s: float | None = None
    ) -> str:
        """A text-only chat completion (used to fuse a VLM description with OCR text)."""
        messages = [{"role": "system", "content": system}, {"role": "user", "content": user}]
        return self.complete(model, messages, llm_kwargs, budget_s)

    def complete(
        self,
        model: str,
        messages: list[dict[str, Any]],
        llm_kwargs: dict[str, Any],
        budget_s: float | None = None,
    ) -> str:
        """The reply text, retrying 429/5xx/timeouts/connection errors within `budget_s` (default: the
        per-image budget) and the run's budget; VisionError once exhausted or the breaker is open."""

        deadline = min(
            self.clock() + (self.limits.image_budget_s if budget_s is None else budget_s),
            self.breaker.deadline(),
        )
        last_error, reason = "no attempt made", "time budget"
        for attempt in range(self.limits.max_attempts):
            self.breaker.await_verdict(deadline)  # returns at once when nothing is in doubt
            self.breaker.check()
            remaining = deadline - self.clock()
            if remaining <= 0:
                break
            self.breaker.attempt_started()
            outcome: str | _Failure | None = None
            try:
                outcome = self._attempt(model, messages, llm_kwargs, min(self.limits.timeout_s, remaining))
            finally:
                self.breaker.attempt_ended(outcome)
            if isinstance(outcome, str):
                return outcome
            reason, last_error = outcome.reason, outcome.message
            if not outcome.retriable:
                raise VisionError(f"{model}: {last_error}", reason)
            if attempt + 1 < self.limits.max_attempts:
                pause = self._backoff_s(attempt, outcome.retry_after_s)
                if self.clock() + pause >= deadline:
                    break  # the budget would run out while waiting: give up now
                self.sleep(pause)
        else:
            raise VisionError(
                f"{model}: gave up after {self.limits.max_attempts} attempts: {last_error}", reason
            )
        raise VisionError(f"{model}: time budget spent ({reason}; last: {last_error})", reason)

    def _attempt(
        self, model: str, messages: list[dict[str, Any]], llm_kwargs: dict[str, Any], timeout_s: float
    ) -> str | _Failure:
        """One HTTP attempt: the reply text or what went wrong, redacted.

        Failures are returned, not raised from the `except` blocks: an exception raised there would
        carry the provider's unredacted exception as its `__context__` into Dagster's error records.
        """
        import openai

        try:
            response = self.client.chat.completions.create(
                model=model, messages=messages, **llm_kwargs, timeout=timeout_s
            )
            text = _reply_text(model, response)
        except openai.APITimeoutError:
            return _Failure("timeout", f"no reply within {timeout_s:.1f}s", retriable=True)
        except openai.APIConnectionError as exc:
            return _Failure("connection error", self._redact(f"{type(exc).__name__}: {exc}"), retriable=True)
        except openai.APIStatusError as exc:
            code = exc.status_code
            retriable = code in RETRIABLE_STATUS or code >= 500
            return _Failure(
                f"http {code}",
                self._redact(exc.message),
                retriable=retriable,
                retry_after_s=_retry_after_s(exc.response.headers) if retriable else None,
                counts=code not in REQUEST_SPECIFIC_STATUS,
            )
        except (openai.OpenAIError, ValueError) as exc:  # a body that is not JSON / not a completion
            return _Failure("malformed reply", self._redact(f"malformed reply: {exc}"), counts=False)
        except VisionError as exc:  # no choices, an empty reply or a refusal
            return _Failure(
                "malformed reply", self._redact(str(exc).removeprefix(f"{model}: ")), counts=False
            )
        return self._redact(text)

    def _redact(self, text: str) -> str:
        return redact(text, self._secrets)

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


def vision_client_from_env(limits: ProviderLimits | None = None) -> VisionClient | None:
    """The configured endpoint (`VisionEndpoint` in core/config.py), or None (offline) when no
    OpenAI/Azure variables are set. With Azure the model name is the deployment name; Ollama and
    vLLM need only the base URL (a placeholder key is sent because the client requires one)."""
    endpoint = VisionEndpoint.from_env()
    if endpoint.azure_endpoint and endpoint.azure_api_key:
        import openai

        client: openai.OpenAI = openai.AzureOpenAI(
            azure_endpoint=endpoint.azure_endpoint,
            api_key=endpoint.azure_api_key,
            api_version=endpoint.api_version,
            max_retries=0,
        )
        return VisionClient(
            client, engine=f"azure:{redact_url(endpoint.azure_endpoint.rstrip('/'))}", limits=limits
        )
    if not (endpoint.api_key or endpoint.base_url):
        return None
    import openai

    client = openai.OpenAI(base_url=endpoint.base_url, api_key=endpoint.api_key or "unused", max_retries=0)
    return VisionClient(
        client, engine=f"openai:{redact_url(str(client.base_url).rstrip('/'))}", limits=limits
    )
