"""Memory and time of `vision-rag serve` answering huge image queries, several at once.

    PYTHONPATH=$PWD .venv/bin/python bench/bench_image_query_memory.py [--side 6300] [--concurrent 4] [--home DIR]

Starts `vision-rag serve` on a fresh home (or DIR), warms it with one text search, then sends
`--concurrent` searches at once, each a PNG of side x side pixels with a line of text (6300 gives a
~360 KB file, the size that took 20 s and 1.2 GB before queries were bounded). Samples the server's
RSS every 50 ms: before, the peak, and 5 s after the last answer; prints each answer's status and
seconds.
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import psutil
from PIL import Image, ImageDraw


def _post(url: str, body: dict, timeout: float = 600) -> int:
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            response.read()
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code


def _png(side: int) -> str:
    image = Image.new("RGB", (side, side), "white")
    ImageDraw.Draw(image).text((side // 10, side // 10), "Revenue 4.2M EUR in Q3", fill="black")
    buffer = io.BytesIO()
    image.save(buffer, format="PNG", optimize=True)
    return base64.b64encode(buffer.getvalue()).decode()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--side", type=int, default=6300)
    parser.add_argument("--concurrent", type=int, default=4)
    parser.add_argument("--home", type=Path, default=None)
    parser.add_argument("--rounds", type=int, default=2, help="rounds of concurrent queries, 5 s apart")
    args = parser.parse_args()
    home = args.home or Path(tempfile.mkdtemp(prefix="bench_image_query_"))
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = os.environ | {"VISION_RAG_HOME": str(home), "DAGSTER_HOME": str(home / "dagster")}
    server = subprocess.Popen(
        [sys.executable, "-m", "vision_rag_pipeline.cli", "serve", "--port", str(port), "--no-ingest"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                if urllib.request.urlopen(f"{url}/health", timeout=5).status == 200:
                    break
            except OSError:
                time.sleep(0.2)
        _post(f"{url}/search", {"query": "revenue"})
        process = psutil.Process(server.pid)
        image = _png(args.side)
        print(f"image: {args.side}x{args.side} PNG, {len(image) * 3 // 4 // 1024} KB")
        baseline = process.memory_info().rss
        peak, sampling = baseline, True

        def sample() -> None:
            nonlocal peak
            while sampling:
                peak = max(peak, process.memory_info().rss)
                time.sleep(0.05)

        sampler = threading.Thread(target=sample)
        sampler.start()
        answers: list[tuple[int, float]] = []

        def query() -> None:
            started = time.perf_counter()
            answers.append((_post(f"{url}/search", {"image": image, "k": 3}), time.perf_counter() - started))

        mb = 2**20
        for round_number in range(1, args.rounds + 1):
            answers.clear()
            peak = process.memory_info().rss
            started = time.perf_counter()
            threads = [threading.Thread(target=query) for _ in range(args.concurrent)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            wall = time.perf_counter() - started
            time.sleep(5)
            after = process.memory_info().rss
            said = sorted((status, round(seconds, 1)) for status, seconds in answers)
            print(f"round {round_number}: answers (status, seconds) {said}, all in {wall:.1f} s")
            print(
                f"  server RSS: before {baseline / mb:.0f} MB, peak {peak / mb:.0f} MB, 5 s after {after / mb:.0f} MB"
            )
        sampling = False
        sampler.join()
    finally:
        os.killpg(server.pid, signal.SIGINT)
        server.wait(timeout=30)


if __name__ == "__main__":
    main()
