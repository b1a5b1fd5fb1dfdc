"""A real HTTP server on 127.0.0.1 speaking the OpenAI chat-completions API, for tests.

Responses are scripted (status, JSON body, headers) and served in order; once the script is
used up, `default` is served. Every request is recorded with its path, headers and JSON body,
so tests can check exactly what the real `openai` client sent.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Reply:
    status: int = 200
    body: Any = None  # dict -> JSON; str -> sent as is (for malformed replies)
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class RecordedRequest:
    path: str
    headers: dict[str, str]  # names lower-cased
    body: dict[str, Any]


def chat_reply(text: str | None, model: str = "fake-vision") -> Reply:
    """A well-formed chat completion whose single choice says `text`."""
    return Reply(
        body={
            "id": "chatcmpl-fake",
            "object": "chat.completion",
            "created": 0,
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": text},
                    "finish_reason": "stop",
                }
            ],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
        }
    )


def error_reply(status: int, message: str = "fake error", headers: dict[str, str] | None = None) -> Reply:
    return Reply(status=status, body={"error": {"message": message, "type": "fake"}}, headers=headers or {})


class FakeOpenAI:
    """Start with `with FakeOpenAI() as server:`; point the client at `server.base_url`."""

    def __init__(self, default: Reply | None = None) -> None:
        self.default = default or chat_reply("A fake description.")
        self.requests: list[RecordedRequest] = []
        self._script: list[Reply] = []
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler_class())
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    @property
    def base_url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}/v1"

    def script(self, *replies: Reply) -> None:
        with self._lock:
            self._script.extend(replies)

    def _next_reply(self, request: RecordedRequest) -> Reply:
        with self._lock:
            self.requests.append(request)
            return self._script.pop(0) if self._script else self.default

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server naming)
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length)
                body = json.loads(raw) if raw else {}
                reply = fake._next_reply(
                    RecordedRequest(self.path, {k.lower(): v for k, v in self.headers.items()}, body)
                )
                payload = reply.body if isinstance(reply.body, str) else json.dumps(reply.body)
                data = payload.encode()
                self.send_response(reply.status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for name, value in reply.headers.items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:  # keep test output quiet
                return

        return Handler

    def __enter__(self) -> FakeOpenAI:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
