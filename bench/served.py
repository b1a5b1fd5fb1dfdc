"""`vision-rag serve` as the benches run it: its own process on a home of its own, on a free port."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

CLI = [sys.executable, "-m", "vision_rag_pipeline.cli"]


@dataclass
class Served:
    url: str
    home: Path
    env: dict[str, str]  # the environment that reaches the same home (for CLI calls beside it)
    process: subprocess.Popen


@contextmanager
def serving(home: Path | None = None, prefix: str = "bench_serve_") -> Iterator[Served]:
    """`serve --no-ingest` on `home` (a fresh temporary one when None), once /health answers 200;
    stopped on the way out, with the embedded Postgres of a home made here."""
    made_here = home is None
    home = home or Path(tempfile.mkdtemp(prefix=prefix))
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = os.environ | {"VISION_RAG_HOME": str(home), "DAGSTER_HOME": str(home / "dagster")}
    process = subprocess.Popen(
        [*CLI, "serve", "--port", str(port), "--no-ingest"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while status_of(f"{url}/health", timeout=5) != 200 and time.monotonic() < deadline:
            time.sleep(0.2)
        yield Served(url, home, env, process)
    finally:
        os.killpg(process.pid, signal.SIGINT)
        process.wait(timeout=30)
        if made_here:
            subprocess.run([*CLI, "db", "stop"], env=env, capture_output=True)


def status_of(url: str, body: dict | None = None, timeout: float = 900) -> int:
    """The HTTP status a GET (or, with `body`, a JSON POST) gets, -1 when no answer comes."""
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data, {"Content-Type": "application/json"} if data else {})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            response.read()
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return -1
