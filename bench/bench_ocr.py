"""OCR and classifier throughput on generated 800x600 report images.

    .venv/bin/python bench/bench_ocr.py [--images 24] [--workers 2]

Prints OCR images/s in one process and across a process pool, and classifier ms/image.
"""

from __future__ import annotations

import argparse
import io
import time
from concurrent.futures import ProcessPoolExecutor

from PIL import Image, ImageDraw, ImageFont

from vision_rag_pipeline.core.config import ClassifierFeature
from vision_rag_pipeline.documents.model import DocumentImage
from vision_rag_pipeline.enrichment.classifier import classify_images
from vision_rag_pipeline.enrichment.ocr import ocr_image


def _font(size: int) -> ImageFont.FreeTypeFont:
    return ImageFont.load_default(size=size)


def report_image(index: int) -> Image.Image:
    """Cycle through the kinds the issue measured: text, dark dashboard, KPI table, bar chart."""
    kind = index % 4
    dark = kind == 1
    img = Image.new("RGB", (800, 600), "#1b2330" if dark else "white")
    draw = ImageDraw.Draw(img)
    ink = "#e8e8e8" if dark else "black"
    if kind in (0, 1):
        for row in range(8):
            revenue = 4000 + 37 * row + index
            line = f"Region {row + index}: revenue {revenue:,} units, margin {row + 10}.{index % 10}%"
            draw.text((30, 40 + row * 60), line, fill=ink, font=_font(22))
    elif kind == 2:
        columns = [30, 260, 440, 620, 780]
        for r in range(7):
            draw.line([(30, 40 + r * 70), (780, 40 + r * 70)], fill="black", width=2)
        for x in columns:
            draw.line([(x, 40), (x, 460)], fill="black", width=2)
        for r in range(6):
            cells = [f"Metric {r + index}"] + [f"{1000 + 17 * r * c + index:,}" for c in range(1, 4)]
            for c, value in enumerate(cells):
                draw.text((columns[c] + 10, 60 + r * 70), value, fill="black", font=_font(22))
    else:
        for r in range(5):
            y = 60 + r * 105
            draw.rectangle(
                [160, y, 160 + 90 * (r + 3), y + 70], fill=("#1f3b73", "#7a1f1f", "#1f5f2a")[r % 3]
            )
            draw.text((20, y + 22), f"Area {r + index}", fill="black", font=_font(22))
            draw.text((175, y + 22), f"{300 + 41 * r + index} units", fill="white", font=_font(22))
    return img


def _ocr(index: int) -> int:
    return len(ocr_image(report_image(index), ["eng"]).text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=24)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    indexes = list(range(args.images))

    start = time.perf_counter()
    for index in indexes:
        _ocr(index)
    single = args.images / (time.perf_counter() - start)
    print(f"OCR, 1 process: {single:.2f} images/s ({1000 / single:.0f} ms/image)")

    with ProcessPoolExecutor(args.workers) as pool:
        list(pool.map(_ocr, range(args.workers)))  # warm the workers up
        start = time.perf_counter()
        list(pool.map(_ocr, indexes))
        pooled = args.images / (time.perf_counter() - start)
    print(f"OCR, {args.workers}-process pool: {pooled:.2f} images/s")

    documents = []
    for index in indexes:
        buffer = io.BytesIO()
        report_image(index).save(buffer, format="PNG")
        documents.append(
            DocumentImage(url=f"i{index}.png", name=f"i{index}.png", mime="image/png", data=buffer.getvalue())
        )
    decoration = Image.new("RGB", (120, 60), "white")
    ImageDraw.Draw(decoration).ellipse([5, 5, 55, 55], fill="#0a5")
    buffer = io.BytesIO()
    decoration.save(buffer, format="PNG")
    documents += [
        DocumentImage(url=f"logo{i}.png", name=f"logo{i}.png", mime="image/png", data=buffer.getvalue())
        for i in range(2)
    ]
    start = time.perf_counter()
    verdicts = classify_images(documents, ClassifierFeature())
    elapsed = time.perf_counter() - start
    counts = {v: sum(1 for x in verdicts if x.verdict == v) for v in ("VISION", "IGNORE")}
    print(f"classifier: {1000 * elapsed / len(documents):.1f} ms/image over {len(documents)} images {counts}")


if __name__ == "__main__":
    main()
