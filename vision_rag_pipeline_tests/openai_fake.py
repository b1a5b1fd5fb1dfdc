"""A real HTTP server on 127.0.0.1 speaking the OpenAI chat-completions API, for tests.

Responses are scripted (status, JSON body, headers) and served in order; once the script is
used up, `default` is served. Every request is recorded with its path, headers and JSON body,
so tests can check exactly what the real `openai` client sent. A reply can hang (`delay_s`, the
way an overloaded endpoint holds a connection) or echo the request's API key in its error body
(`echo_key`, the way some proxies and gateways do).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Reply:
    status: int = 200
    body: Any = None  # dict -> JSON; str -> sent as is (for malformed replies)
    headers: dict[str, str] = field(default_factory=dict)
    delay_s: float = 0.0  # hold the connection this long before answering (cut short on shutdown)
    echo_key: bool = False  # body: an error message quoting the Authorization header and the bare key
    # body made from the bare key: an error message saying it (status >= 400) or a reply containing it
    echo: Callable[[str], str] | None = None


@dataclass
class RecordedRequest:
    path: str
    headers: dict[str, str]  # names lower-cased
    body: dict[str, Any]
    at: float = 0.0  # time.monotonic() when the request arrived


HANG = Reply(delay_s=3600.0)


def echo_key_reply(status: int = 401) -> Reply:
    return Reply(status=status, echo_key=True)


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
        self._closing = threading.Event()
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
                headers = {k.lower(): v for k, v in self.headers.items()}
                reply = fake._next_reply(RecordedRequest(self.path, headers, body, time.monotonic()))
                if reply.delay_s and fake._closing.wait(reply.delay_s):
                    return
                payload = reply.body if isinstance(reply.body, str) else json.dumps(reply.body)
                if reply.echo_key:
                    authorization = headers.get("authorization", "")
                    key = authorization.removeprefix("Bearer ")
                    message = f"Incorrect API key provided: {key} (sent as Authorization: {authorization})"
                    payload = json.dumps({"error": {"message": message, "type": "invalid_request_error"}})
                if reply.echo:
                    said = reply.echo(headers.get("authorization", "").removeprefix("Bearer "))
                    payload = json.dumps(
                        chat_reply(said).body
                        if reply.status < 400
                        else {"error": {"message": f"rejected: {said}", "type": "invalid_request_error"}}
                    )
                data = payload.encode()
                try:
                    self.send_response(reply.status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    for name, value in reply.headers.items():
                        self.send_header(name, value)
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):  # the client gave up waiting
                    return

            def log_message(self, format: str, *args: Any) -> None:  # keep test output quiet
                return

        return Handler

    def __enter__(self) -> FakeOpenAI:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._closing.set()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
