"""Peak memory and time of loading hostile documents, each in a fresh process, under `limits.documents`.

    PYTHONPATH=$PWD .venv/bin/python bench/bench_document_bombs.py [--unlimited] [--ingest]

The documents (generated, a few KB to 1 MB each): a PDF of 2,000 blank pages; a PDF whose one
content stream inflates to 1 GB; the same with the bomb in an 18,000 x 18,000 image; three pages
of 400 MB content streams; an MHTML archive with 3,000 multipart bodies nested in each other. Each is
loaded by `load_document` in a child process whose peak RSS (`ru_maxrss`) and wall time are printed
with the outcome. `--unlimited` loads them with limits high enough to let them through (what loading
them cost before the limits; the blank pages are cut to 200 there, the rest would take minutes);
`--ingest` runs `vision-rag ingest` on them in a fresh home instead (CLI process peak RSS).

Also imported by the tests, for the documents.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
import zlib
from collections.abc import Callable
from pathlib import Path


def deflated_zeros(size: int, prefix: bytes = b"", chunk: int = 1 << 20) -> bytes:
    """A zlib stream of `prefix` and then `size` zero bytes (a multiple of `chunk`) in about
    size / 1000 bytes, made in a fraction of a second: a full flush after each chunk makes every
    chunk compress to the same bytes."""
    compressor = zlib.compressobj(9)
    head = compressor.compress(prefix) + compressor.flush(zlib.Z_FULL_FLUSH)
    zeros = bytes(chunk)
    repeated = compressor.compress(zeros) + compressor.flush(zlib.Z_FULL_FLUSH)
    low = (
        zlib.adler32(prefix) & 0xFFFF
    )  # Adler-32 after zeros: the low sum stays, the high one adds it a byte
    high = ((zlib.adler32(prefix) >> 16) + low * size) % 65521
    return head + repeated * (size // chunk) + b"\x03\x00" + ((high << 16) | low).to_bytes(4, "big")


def _stream(header: str, data: bytes) -> bytes:
    return f"<< {header} /Length {len(data)} >>\nstream\n".encode() + data + b"\nendstream"


def _pdf(pages: list[tuple[bytes, list[bytes]]], extra: tuple[bytes, ...] = ()) -> bytes:
    """A PDF of pages given as (content stream object, [image XObject objects]); Helvetica as F1;
    the `extra` objects are numbered 4, 5, ... (before the pages' objects)."""
    objects: list[bytes] = [b"", b"", b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>", *extra]
    kids = []
    for content, images in pages:
        names = []
        for number, image in enumerate(images, start=1):
            objects.append(image)
            names.append(f"/Im{number} {len(objects)} 0 R")
        objects.append(content)
        contents = len(objects)
        objects.append(
            f"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents {contents} 0 R "
            f"/Resources << /Font << /F1 3 0 R >> /XObject << {' '.join(names)} >> >> >>".encode()
        )
        kids.append(len(objects))
    objects[0] = b"<< /Type /Catalog /Pages 2 0 R >>"
    objects[1] = (
        f"<< /Type /Pages /Kids [{' '.join(f'{k} 0 R' for k in kids)}] /Count {len(kids)} >>".encode()
    )
    out = bytearray(b"%PDF-1.4\n")
    offsets = []
    for number, body in enumerate(objects, start=1):
        offsets.append(len(out))
        out += f"{number} 0 obj\n".encode() + body + b"\nendobj\n"
    xref = len(out)
    out += f"xref\n0 {len(objects) + 1}\n0000000000 65535 f \n".encode()
    out += "".join(f"{offset:010d} 00000 n \n" for offset in offsets).encode()
    out += f"trailer\n<< /Size {len(objects) + 1} /Root 1 0 R >>\nstartxref\n{xref}\n%%EOF\n".encode()
    return bytes(out)


TEXT = b"BT /F1 12 Tf 72 700 Td (A page with a few words on it.) Tj ET\n"


def blank_pages_pdf(pages: int = 2000) -> bytes:
    """`pages` pages with nothing on them (each would be rendered and OCR'd as a scan)."""
    return _pdf([(_stream("", b""), [])] * pages)


def content_bomb_pdf(inflated: int = 1 << 30, pages: int = 1) -> bytes:
    """Pages with a line of text whose content stream then inflates to `inflated` zero bytes
    (white space to a PDF parser)."""
    content = _stream("/Filter /FlateDecode", deflated_zeros(inflated, prefix=TEXT))
    return _pdf([(content, [])] * pages)


def image_bomb_pdf(side: int = 18_000, indirect_size: bool = False) -> bytes:
    """One page with a line of text and a side x side RGB image whose data inflates to its full size;
    with `indirect_size` its /Width and /Height are references to another object."""
    size = "4 0 R" if indirect_size else str(side)
    image = _stream(
        f"/Type /XObject /Subtype /Image /Width {size} /Height {size} /ColorSpace /DeviceRGB "
        "/BitsPerComponent 8 /Filter /FlateDecode",
        deflated_zeros(side * side * 3),
    )
    content = _stream("", TEXT + b"q 500 0 0 500 50 50 cm /Im1 Do Q")
    return _pdf([(content, [image])], extra=(str(side).encode(),) if indirect_size else ())


def deep_mhtml(depth: int = 3000) -> bytes:
    """An MHTML archive whose page sits inside `depth` multipart bodies nested in each other."""
    lines = [b"From: <Saved by Blink>", b"Subject: nested", b"MIME-Version: 1.0"]
    for level in range(depth):
        lines += [
            f'Content-Type: multipart/related; boundary="level-{level}"'.encode(),
            b"",
            f"--level-{level}".encode(),
        ]
    lines += [
        b"Content-Type: text/html; charset=utf-8",
        b"Content-Location: https://nested.example/",
        b"",
        b"<html><body><p>The page at the bottom.</p></body></html>",
    ]
    lines += [f"--level-{level}--".encode() for level in reversed(range(depth))]
    return b"\r\n".join(lines) + b"\r\n"


DOCUMENTS: dict[str, tuple[str, Callable[[], bytes]]] = {
    "2,000 blank pages": ("blank.pdf", blank_pages_pdf),
    "content stream inflating to 1 GB": ("content-bomb.pdf", content_bomb_pdf),
    "18,000² image inflating to 0.97 GB": ("image-bomb.pdf", image_bomb_pdf),
    "3 pages of 400 MB content streams": ("three-pages.pdf", lambda: content_bomb_pdf(400 << 20, pages=3)),
    "MHTML nested 3,000 deep": ("deep.mhtml", deep_mhtml),
}


def _load_in_child(path: Path, unlimited: bool) -> dict:
    """Load `path` in this (child) process; its outcome, seconds and peak RSS."""
    from vision_rag_pipeline.core.config import DocumentLimits
    from vision_rag_pipeline.documents.loader import load_document

    limits = (
        DocumentLimits(
            max_pages=10**6, max_stream_bytes=2**40, max_document_bytes=2**42, max_mhtml_depth=10**6
        )
        if unlimited
        else DocumentLimits()
    )
    started = time.perf_counter()
    try:
        doc = load_document(path, limits=limits)
        outcome = f"loaded: {doc.pages or 0} pages, {len(doc.images)} images"
    except Exception as exc:  # the outcome is the point: a DocumentError, a RecursionError...
        outcome = f"{type(exc).__name__}: {' '.join(str(exc).split())[:160]}"
    return {
        "outcome": outcome,
        "seconds": round(time.perf_counter() - started, 2),
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--unlimited", action="store_true", help="load with limits that let them through")
    parser.add_argument("--ingest", action="store_true", help="run `vision-rag ingest` on them instead")
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(_load_in_child(args.child, args.unlimited)))
        return
    folder = Path(tempfile.mkdtemp(prefix="document_bombs_"))
    for label, (name, make) in DOCUMENTS.items():
        if args.unlimited and name == "blank.pdf":
            path, label = folder / name, "200 blank pages"
            path.write_bytes(blank_pages_pdf(200))
        else:
            path = folder / name
            path.write_bytes(make())
        if args.ingest:
            home = folder / f"home-{name}"
            env = os.environ | {"VISION_RAG_HOME": str(home), "DAGSTER_HOME": str(home / "dagster")}
            started = time.perf_counter()
            done = subprocess.run(
                [
                    "/usr/bin/time",
                    "-f",
                    "%M",
                    sys.executable,
                    "-m",
                    "vision_rag_pipeline.cli",
                    "ingest",
                    str(path),
                ],
                env=env,
                capture_output=True,
                text=True,
            )
            peak = done.stderr.strip().splitlines()[-1]
            failed = [line for line in done.stderr.splitlines() if line.startswith("FAILED")]
            result = {
                "outcome": f"exit {done.returncode}: {failed[0] if failed else 'ingested'}"[:200],
                "seconds": round(time.perf_counter() - started, 1),
                "peak_rss_mb": int(peak) // 1024 if peak.isdigit() else None,
            }
            subprocess.run(
                [sys.executable, "-m", "vision_rag_pipeline.cli", "db", "stop"], env=env, capture_output=True
            )
        else:
            command = [sys.executable, __file__, "--child", str(path)] + (
                ["--unlimited"] if args.unlimited else []
            )
            try:
                done = subprocess.run(command, capture_output=True, text=True, timeout=900)
                result = json.loads(done.stdout.strip().splitlines()[-1])
            except subprocess.TimeoutExpired:
                result = {"outcome": "not done after 900 s", "seconds": 900, "peak_rss_mb": None}
        size = path.stat().st_size
        print(
            f"{label} ({size / 1024:,.0f} KB): {result['outcome']}; {result['seconds']} s, peak {result['peak_rss_mb']} MB"
        )


if __name__ == "__main__":
    main()
