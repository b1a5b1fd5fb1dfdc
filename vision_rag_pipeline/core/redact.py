"""Keep credentials out of everything we store: a provider's error body or reply may echo the
request's key, whole, re-cased or cut, and an endpoint URL may carry a password.

Error texts and replies travel into Dagster's event log, compute logs, step-output values, asset
metadata, the enrichment cache and chunk text (so the lexical index); `redact` runs on them where
they leave the provider client, before any of that. `redact_url` strips a URL's password before the
URL is named anywhere (an engine label, a log line).
"""

from __future__ import annotations

import re
from urllib.parse import unquote, urlsplit

REDACTED = "[REDACTED]"
MIN_SECRET_CHARS = 6  # a shorter "key" (a placeholder such as "unused") would blank ordinary words
MIN_FRAGMENT_CHARS = 8  # any run of this many of a secret's characters, in any case, is redacted

_TOKEN_PATTERNS = (
    re.compile(r"\bsk-[A-Za-z0-9_\-]{8,}"),  # OpenAI-style keys (sk-..., sk-proj-...)
    re.compile(r"(?i)\b(bearer|basic)\s+[A-Za-z0-9._~+/\-]+=*"),  # Authorization header values
    re.compile(r"(?i)\b(api[_-]?key|access[_-]?token|authorization)(['\"]?\s*[:=]\s*['\"]?)[^\s'\",}]{6,}"),
)
# scheme://user:password@host: the password (never empty here) up to the last @ before the host
_URL_PASSWORD = re.compile(r"(?i)\b([a-z][a-z0-9+.\-]*://[^\s/:@]*:)([^\s/]+)@")
_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")


def redact(text: str, secrets: tuple[str, ...] | list[str] = ()) -> str:
    """`text` with each secret, and anything shaped like a bearer token, an API key or a URL's password,
    replaced. A secret is found in any letter case, and so is any run of `MIN_FRAGMENT_CHARS` or more
    of its characters (a provider that echoes the key upper-cased, or its tail only)."""
    text = _URL_PASSWORD.sub(lambda m: f"{m.group(1)}{REDACTED}@", text)
    text = _TOKEN_PATTERNS[0].sub(REDACTED, text)
    text = _TOKEN_PATTERNS[1].sub(lambda m: f"{m.group(1)} {REDACTED}", text)
    text = _TOKEN_PATTERNS[2].sub(lambda m: f"{m.group(1)}{m.group(2)}{REDACTED}", text)
    for secret in secrets:
        if secret and len(secret) >= MIN_SECRET_CHARS:
            text = _redact_fragments(text, secret)
    return text


def _redact_fragments(text: str, secret: str) -> str:
    """Replace every stretch of `text` covered by windows of `MIN_FRAGMENT_CHARS` characters that
    occur in `secret` (ASCII case ignored); a secret shorter than a window must occur whole."""
    folded_text, folded_secret = text.translate(_ASCII_LOWER), secret.translate(_ASCII_LOWER)
    width = min(MIN_FRAGMENT_CHARS, len(folded_secret))
    windows = {folded_secret[i : i + width] for i in range(len(folded_secret) - width + 1)}
    covered_until, spans = -1, []
    for start in range(len(folded_text) - width + 1):
        if folded_text[start : start + width] in windows:
            if spans and start <= covered_until:
                spans[-1][1] = start + width
            else:
                spans.append([start, start + width])
            covered_until = start + width
    for start, end in reversed(spans):
        text = text[:start] + REDACTED + text[end:]
    return text


def url_secrets(url: str | None) -> tuple[str, ...]:
    """The password a URL carries (as written and decoded), to redact wherever it is echoed."""
    if not url:
        return ()
    try:
        password = urlsplit(url).password
    except ValueError:
        return ()
    return tuple({password, unquote(password)}) if password else ()


def redact_url(url: str) -> str:
    """`url` without its password: what a log line, an engine label or metadata may say of it."""
    return _URL_PASSWORD.sub(lambda m: f"{m.group(1)}{REDACTED}@", url)
