"""Start the noida-db Elasticsearch-API emulator (dev dependency `noida-db==0.2.3`) for tests.

The wheel ships a native binary inside the `noida_db` package; we run it in the foreground with only
the Elasticsearch service, on a free loopback port and a throwaway data directory, and stop it after.
"""

from __future__ import annotations

import os
import signal
import socket
import stat
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from importlib import resources
from pathlib import Path

START_TIMEOUT_S = 15.0


class EmulatorUnavailable(RuntimeError):
    """The emulator is not installed or did not start; tests skip with this reason."""


def noida_binary() -> Path:
    try:
        binary = Path(str(resources.files("noida_db").joinpath("noida-db")))
    except ModuleNotFoundError as exc:
        raise EmulatorUnavailable("noida-db is not installed (pip install 'noida-db==0.2.3')") from exc
    if not binary.is_file():
        raise EmulatorUnavailable(f"noida-db binary missing at {binary}")
    if not os.access(binary, os.X_OK):
        binary.chmod(binary.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return binary


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False


def _stop_with_parent() -> None:
    """Ask Linux to SIGTERM the emulator if the test process dies without tearing down."""
    import ctypes

    pr_set_pdeathsig = 1
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)


@contextmanager
def noida_elasticsearch(data_dir: Path) -> Iterator[str]:
    """Yield the URL of a running emulator; it is terminated when the block exits."""
    binary = noida_binary()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    data_dir.mkdir(parents=True, exist_ok=True)
    log_path = data_dir / "noida.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [
                str(binary),
                "start",
                "--data-dir",
                str(data_dir / "data"),
                "--host",
                "127.0.0.1",
                "--only",
                "elasticsearch",
                "--elasticsearch-port",
                str(port),
            ],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_stop_with_parent if sys.platform == "linux" else None,
        )
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not _answers(url):
            if process.poll() is not None or time.monotonic() > deadline:
                output = log_path.read_text(errors="replace").strip().splitlines()[-3:]
                raise EmulatorUnavailable(f"noida-db did not start on {url}: {' | '.join(output)}")
            time.sleep(0.05)
        yield url
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGINT)  # its documented way to stop ("Ctrl-C stops it")
            try:
                process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
