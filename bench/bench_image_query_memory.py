"""Memory and time of `vision-rag serve` answering huge image queries and media-enrichment requests.

    PYTHONPATH=$PWD .venv/bin/python bench/bench_image_query_memory.py [--side 6300] [--concurrent 4] [--rounds 2] [--home DIR] [--only NAME...]

Starts `vision-rag serve` on a fresh home (or DIR), warms it with one text search and one small
media-enrichment request, then runs each scenario in turn, sampling the server's RSS every 50 ms:
before, the peak, and 5 s after the last answer; prints each answer's status and seconds.

Scenarios (side x side pixels, a line of text or a dark bar on white; 6300 gives files of 90-360 KB):
- `rgb-search`: `--concurrent` searches at once, each an 8-bit RGB PNG, `--rounds` rounds;
- `png16-search`, `float-search`: one search by a 16-bit greyscale PNG, by a 32-bit float TIFF;
- `enrich-nine-png16`: the media-enrichment request of a small PNG and nine 16-bit PNGs;
- `enrich-two-png16`: two 16-bit PNGs (past the default memory budget of a request at 6300);
- `enrich-png16`, `enrich-float`: media enrichment of one 16-bit PNG, of one float TIFF.
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import psutil
from PIL import Image, ImageDraw
from served import serving, status_of

MB = 2**20


def _send(url: str, body: dict, answers: list[tuple[int, float]]) -> None:
    started = time.perf_counter()
    answers.append((status_of(url, body), round(time.perf_counter() - started, 1)))


def _encoded(image: Image.Image, fmt: str, **options: object) -> str:
    buffer = io.BytesIO()
    image.save(buffer, format=fmt, **options)
    return base64.b64encode(buffer.getvalue()).decode()


def rgb_png(side: int) -> str:
    image = Image.new("RGB", (side, side), "white")
    ImageDraw.Draw(image).text((side // 10, side // 10), "Revenue 4.2M EUR in Q3", fill="black")
    return _encoded(image, "PNG", optimize=True)


def _bar(side: int, dtype: type, ink: float, paper: float) -> np.ndarray:
    pixels = np.full((side, side), paper, dtype=dtype)
    pixels[side // 10 : side // 10 + side // 30, side // 10 : side // 2] = ink
    return pixels


def png16(side: int) -> str:
    return _encoded(Image.fromarray(_bar(side, np.uint16, 1000, 60000)), "PNG", optimize=True)


def float_tiff(side: int) -> str:
    return _encoded(
        Image.fromarray(_bar(side, np.float32, 0.1, 0.9), mode="F"), "TIFF", compression="tiff_deflate"
    )


def _enrichment(*images: str) -> dict:
    return {"images": [{"data": data} for data in images], "features": {"cache": {"enabled": False}}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--side", type=int, default=6300)
    parser.add_argument("--concurrent", type=int, default=4)
    parser.add_argument("--home", type=Path, default=None)
    parser.add_argument("--rounds", type=int, default=2, help="rounds of concurrent RGB queries, 5 s apart")
    parser.add_argument("--only", nargs="+", help="run only these scenarios")
    args = parser.parse_args()
    side = args.side
    small = rgb_png(200)
    scenarios: dict[str, tuple[str, Callable[[], list[dict]], int]] = {  # name: (path, bodies, rounds)
        "rgb-search": ("/search", lambda: [{"image": rgb_png(side), "k": 3}] * args.concurrent, args.rounds),
        "png16-search": ("/search", lambda: [{"image": png16(side), "k": 3}], 1),
        "float-search": ("/search", lambda: [{"image": float_tiff(side), "k": 3}], 1),
        "enrich-nine-png16": (
            "/enrichment-services/media-enrichment",
            lambda: [_enrichment(small, *[png16(side)] * 9)],
            1,
        ),
        "enrich-two-png16": (
            "/enrichment-services/media-enrichment",
            lambda: [_enrichment(*[png16(side)] * 2)],
            1,
        ),
        "enrich-png16": ("/enrichment-services/media-enrichment", lambda: [_enrichment(png16(side))], 1),
        "enrich-float": ("/enrichment-services/media-enrichment", lambda: [_enrichment(float_tiff(side))], 1),
    }
    with serving(args.home, prefix="bench_image_query_") as served:
        url = served.url
        status_of(f"{url}/search", {"query": "revenue"})
        status_of(f"{url}/enrichment-services/media-enrichment", _enrichment(small))
        process = psutil.Process(served.process.pid)
        peak, sampling = 0, True

        def sample() -> None:
            nonlocal peak
            while sampling:
                peak = max(peak, process.memory_info().rss)
                time.sleep(0.05)

        sampler = threading.Thread(target=sample)
        sampler.start()
        for name, (path, make, rounds) in scenarios.items():
            if args.only and name not in args.only:
                continue
            bodies = make()
            size = sum(len(json.dumps(body)) for body in bodies[:1]) * 3 // 4 // 1024
            for round_number in range(1, rounds + 1):
                answers: list[tuple[int, float]] = []
                before = process.memory_info().rss
                peak = before
                started = time.perf_counter()
                threads = [
                    threading.Thread(target=_send, args=(f"{url}{path}", body, answers)) for body in bodies
                ]
                for thread in threads:
                    thread.start()
                for thread in threads:
                    thread.join()
                wall = time.perf_counter() - started
                time.sleep(5)
                after = process.memory_info().rss
                print(
                    f"{name} ({len(bodies)} x ~{size:,} KB) round {round_number}: answers {sorted(answers)} in "
                    f"{wall:.1f} s; server RSS before {before / MB:.0f} MB, peak {peak / MB:.0f} MB "
                    f"(+{(peak - before) / MB:.0f}), 5 s after {after / MB:.0f} MB"
                )
        sampling = False
        sampler.join()


if __name__ == "__main__":
    main()
