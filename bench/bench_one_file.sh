#!/usr/bin/env bash
# One new small file end to end, as a user runs it: writes a scanned-style PDF nobody ingested before
# (a paragraph and a bar chart with random figures, so no cache knows it) and runs `vision-rag ingest`
# on it into HOME (default /tmp/bench_one_file_home; a first call creates it). Time it from outside:
#   hyperfine -w 1 -r 6 'bash bench/bench_one_file.sh'      (peak RSS: /usr/bin/time -v bash bench/bench_one_file.sh)
# With CODE=<another checkout> the same command runs that checkout's code (for an A/B of two checkouts).
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
home="${1:-/tmp/bench_one_file_home}"
pdf="$(mktemp --suffix=.pdf)"
trap 'rm -f "$pdf"' EXIT
"$repo/.venv/bin/python" - "$pdf" <<'PY'
import random, sys
from PIL import Image, ImageDraw, ImageFont
rng = random.Random()
values = [round(rng.uniform(10, 90), 1) for _ in range(4)]
page = Image.new("RGB", (850, 1100), "white")
draw = ImageDraw.Draw(page)
font = ImageFont.truetype("DejaVuSans.ttf", 18)
draw.text((72, 72), f"Shipment report {rng.randint(10**5, 10**6)}: units moved across four regions.", fill="black", font=font)
draw.text((72, 100), f"The largest region moved {max(values)} thousand units this period.", fill="black", font=font)
draw.text((200, 280), f"Units shipped per region, batch {rng.randint(1000, 9999)}", fill="black", font=font)
for i, value in enumerate(values):
    x = 120 + i * 160
    draw.rectangle([x, 700 - value * 4, x + 90, 700], fill=(40, 90, 160))
    draw.text((x + 15, 672 - value * 4), f"{value}", fill="black", font=font)
    draw.text((x + 5, 708), f"Region {i + 1}", fill="black", font=font)
page.save(sys.argv[1], "PDF", resolution=100)
PY
cd /  # `python -m` puts the working directory first on sys.path, before CODE
VISION_RAG_HOME="$home" PYTHONPATH="${CODE:-$repo}" "$repo/.venv/bin/python" -m vision_rag_pipeline.cli ingest "$pdf" >/dev/null
