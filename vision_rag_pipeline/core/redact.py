"""Keep credentials out of everything we store: a provider's error body may echo the request's key.

Error texts travel into Dagster's event log, compute logs, step-output pickles, asset metadata and
the enrichment cache; `redact` runs on them where they leave the provider client, before any of that.
"""

from __future__ import annotations

import re

REDACTED = "[REDACTED]"
MIN_SECRET_CHARS = 6  # a shorter "key" (a placeholder such as "unused") would blank ordinary words

_TOKEN_PATTERNS = (
    re.compile(r"\bsk-[A-Za-z0-9_\-]{8,}"),  # OpenAI-style keys (sk-..., sk-proj-...)
    re.compile(r"(?i)\b(bearer|basic)\s+[A-Za-z0-9._~+/\-]+=*"),  # Authorization header values
    re.compile(r"(?i)\b(api[_-]?key|access[_-]?token|authorization)(['\"]?\s*[:=]\s*['\"]?)[^\s'\",}]{6,}"),
)


def redact(text: str, secrets: tuple[str, ...] | list[str] = ()) -> str:
    """`text` with each secret, and anything shaped like a bearer token or an API key, replaced."""
    text = _TOKEN_PATTERNS[0].sub(REDACTED, text)
    text = _TOKEN_PATTERNS[1].sub(lambda m: f"{m.group(1)} {REDACTED}", text)
    text = _TOKEN_PATTERNS[2].sub(lambda m: f"{m.group(1)}{m.group(2)}{REDACTED}", text)
    for secret in secrets:
        if secret and len(secret) >= MIN_SECRET_CHARS:
            text = text.replace(secret, REDACTED)
    return text
