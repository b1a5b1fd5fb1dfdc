"""Generate report series: each company's four quarterly reports on one template, with facts that
differ by quarter and by site, and questions that name both.

Every report of a company has the same sections, sentences and images; only names and numbers
change from quarter to quarter. The quarter is written where real reports write it: the title, a
running header on each PDF page and the opening line; the site sections never repeat it. So a
question such as "Who led the Q1 2025 safety audit at Glimmerfield Solar's Gdansk site?" meets the
same sentence in all four reports, and only the report's period tells them apart. Questions write
the period as reports and readers do: "Q3 2025", "the third quarter of 2025", "3Q25".

Facts: per site, who led its safety audit and what it shipped (body text); its availability (a
scorecard table image) and the energy it sold (a bar chart image). Every number and name is unique
across the set. Half the reports are PDF, half MHTML.

    python bench/evalset_series.py generate OUT_DIR [--companies 3] [--seed 7]
    python bench/eval_retrieval.py OUT_DIR --k 5
"""

from __future__ import annotations

import argparse
import html
import io
import json
import random
import sys
from dataclasses import dataclass
from pathlib import Path

from evalset import PdfWriter, font, saved_page  # bench/ is on the path
from PIL import Image, ImageDraw

SYLLABLES = ("glim", "mer", "field", "cor", "van", "tal", "bri", "ston", "quel", "dar", "wyn", "ash", "oro")
TRADES = ("Solar", "Cement", "Foods", "Logistics", "Metals", "Paper")
SITES = (
    "Gdansk",
    "Porto",
    "Leeds",
    "Ghent",
    "Tampere",
    "Brno",
    "Lyon",
    "Graz",
    "Malmo",
    "Bilbao",
    "Aarhus",
    "Turin",
    "Cork",
    "Poznan",
    "Utrecht",
    "Linz",
)
FIRST = (
    "Maria",
    "Jonas",
    "Ines",
    "Tomasz",
    "Claire",
    "Pieter",
    "Aino",
    "Luca",
    "Sofia",
    "Marek",
    "Elin",
    "Hugo",
)
LAST = (
    "Kowalska",
    "Berger",
    "Duarte",
    "Nowak",
    "Lefevre",
    "Janssen",
    "Virtanen",
    "Rossi",
    "Lindqvist",
    "Horak",
    "Moreau",
    "Svensson",
    "Keane",
    "Navarro",
    "Vos",
    "Weber",
)
ORDINALS = ("first", "second", "third", "fourth")


@dataclass
class Report:
    company: str
    year: int
    quarter: int
    fmt: str
    sites: list[str]
    auditors: dict[str, str]
    shipped: dict[str, str]  # tonnes
    availability: dict[str, str]  # percent
    energy: dict[str, str]  # GWh

    @property
    def period(self) -> str:
        return f"Q{self.quarter} {self.year}"

    @property
    def title(self) -> str:
        return f"{self.company} Operations Review {self.period}"

    @property
    def file_name(self) -> str:
        slug = self.company.lower().replace(" ", "_")
        return f"{slug}_ops_{self.year}_{self.quarter}.{'pdf' if self.fmt == 'pdf' else 'mhtml'}"


def _unique(rng: random.Random, used: set[str], make) -> str:
    while True:
        value = make()
        if value not in used:
            used.add(value)
            return value


def build_reports(companies: int, seed: int) -> list[Report]:
    rng = random.Random(seed)
    used: set[str] = set()
    reports = []
    for number in range(companies):
        stem = _unique(rng, used, lambda: "".join(rng.sample(SYLLABLES, 2)).capitalize())
        company = f"{stem} {TRADES[number % len(TRADES)]}"
        sites = rng.sample(SITES, 4)
        year = rng.choice((2024, 2025))
        for quarter in range(1, 5):
            people = rng.sample([f"{f} {last}" for f in FIRST for last in LAST], 4)
            reports.append(
                Report(
                    company=company,
                    year=year,
                    quarter=quarter,
                    fmt="pdf" if (number + quarter) % 2 else "mhtml",
                    sites=sites,
                    auditors=dict(zip(sites, people, strict=True)),
                    shipped={
                        s: _unique(rng, used, lambda: f"{rng.randrange(1_000, 99_000):,}") for s in sites
                    },
                    availability={
                        s: _unique(rng, used, lambda: f"{rng.uniform(80, 99.9):.1f}%") for s in sites
                    },
                    energy={s: _unique(rng, used, lambda: f"{rng.uniform(10, 99):.1f}") for s in sites},
                )
            )
    return reports


def scorecard(report: Report) -> Image.Image:
    """The site scorecard: one row per site, availability and a grade."""
    img = Image.new("RGB", (760, 110 + 52 * len(report.sites)), "white")
    draw = ImageDraw.Draw(img)
    draw.text((28, 20), "Site scorecard", fill="#1d1d1d", font=font(30))
    draw.text((28, 70), "Site", fill="#555555", font=font(22))
    draw.text((330, 70), "Availability", fill="#555555", font=font(22))
    for row, site in enumerate(report.sites):
        y = 110 + row * 52
        draw.line((28, y - 6, 732, y - 6), fill="#bbbbbb", width=1)
        draw.text((28, y + 6), site, fill="#111111", font=font(26))
        draw.text((330, y + 6), report.availability[site], fill="#111111", font=font(26))
    return img


def energy_chart(report: Report) -> Image.Image:
    """Energy sold per site: bars with their value above them."""
    img = Image.new("RGB", (880, 500), "white")
    draw = ImageDraw.Draw(img)
    draw.text((30, 20), "Energy sold by site (GWh)", fill="#1d1d1d", font=font(28))
    values = [float(report.energy[s]) for s in report.sites]
    top, bottom, slot = 90, 420, 800 / len(values)
    for index, (site, value) in enumerate(zip(report.sites, values, strict=True)):
        x0, x1 = 50 + slot * index + 30, 50 + slot * (index + 1) - 30
        y = bottom - (bottom - top) * value / 110
        draw.rectangle((x0, y, x1, bottom), fill="#2e6f95")
        draw.text(((x0 + x1) / 2, y - 8), report.energy[site], anchor="mb", fill="#111111", font=font(26))
        draw.text(((x0 + x1) / 2, bottom + 14), site, anchor="mt", fill="#333333", font=font(22))
    return img


def _png(img: Image.Image) -> bytes:
    buffer = io.BytesIO()
    img.save(buffer, "PNG")
    return buffer.getvalue()


def paragraphs(report: Report) -> list[tuple[str, str]]:
    """(kind, text) blocks in reading order; kind is h1, h2, p or an image name."""
    blocks = [
        ("h1", report.title),
        (
            "p",
            f"This review covers the {ORDINALS[report.quarter - 1]} quarter of {report.year} at "
            f"{report.company}'s {len(report.sites)} sites: output, availability, energy and safety.",
        ),
        ("h2", "Sites at a glance"),
        ("scorecard", ""),
        ("energy", ""),
    ]
    for site in report.sites:
        blocks.append(("h2", f"{site} site"))
        blocks.append(
            (
                "p",
                f"The safety audit at the {site} site was led by {report.auditors[site]}. "
                f"{site} shipped {report.shipped[site]} tonnes of product, and its maintenance crews "
                f"closed every open work order before the audit.",
            )
        )
    return blocks


def write_pdf(report: Report) -> bytes:
    pdf = PdfWriter()
    margin, y = 72.0, 0.0
    images = {"scorecard": _png(scorecard(report)), "energy": _png(energy_chart(report))}

    def new_page() -> float:
        pdf.new_page()
        pdf.text(margin, 30, f"{report.company} | Operations Review {report.period}", 8)
        return 70.0

    y = new_page()
    for kind, text in paragraphs(report):
        if kind in images:
            with Image.open(io.BytesIO(images[kind])) as img:
                w, h = 468.0, 468.0 * img.height / img.width
            if y + h > 720:
                y = new_page()
            pdf.image(images[kind], margin, y, w, h)
            y += h + 14
            continue
        size = {"h1": 18, "h2": 13}.get(kind, 11)
        words, line = text.split(), ""
        for word in words:
            if len(line) + len(word) > 80:
                if y > 720:
                    y = new_page()
                pdf.text(margin, y, line, size, bold=kind != "p")
                y, line = y + size + 5, ""
            line = f"{line} {word}".strip()
        if y > 720:
            y = new_page()
        pdf.text(margin, y, line, size, bold=kind != "p")
        y += size + 12
    return pdf.to_bytes(report.title, f"{report.year}{report.quarter * 3:02d}28120000Z")


def write_mhtml(report: Report) -> bytes:
    base = (
        f"https://{report.company.lower().replace(' ', '')}.example/reports/{report.year}-q{report.quarter}/"
    )
    urls = {"scorecard": base + "scorecard.png", "energy": base + "energy.png"}
    body = []
    for kind, text in paragraphs(report):
        if kind in urls:
            body.append(f'<figure><img src="{urls[kind]}" alt=""></figure>')
        else:
            tag = kind if kind in ("h1", "h2") else "p"
            body.append(f"<{tag}>{html.escape(text)}</{tag}>")
    page_html = (
        f'<!DOCTYPE html><html><head><meta charset="utf-8"><title>{html.escape(report.title)}</title>'
        f"</head><body>{''.join(body)}</body></html>"
    )
    boundary = f"----MultipartBoundary--series{report.year}{report.quarter}----"
    pictures = [(urls["scorecard"], _png(scorecard(report)), "image/png")]
    pictures.append((urls["energy"], _png(energy_chart(report)), "image/png"))
    return saved_page(base, report.title, boundary, page_html, pictures)


def period_phrase(report: Report, style: int) -> str:
    """The quarter as a question writes it, in one of three ways."""
    if style == 0:
        return report.period
    if style == 1:
        return f"the {ORDINALS[report.quarter - 1]} quarter of {report.year}"
    return f"{report.quarter}Q{report.year % 100:02d}"


def questions_for(report: Report, rng: random.Random) -> list[dict]:
    rows = []
    for site in report.sites:
        asked = [
            (
                "text",
                f"Who led the {{p}} safety audit at {report.company}'s {site} site?",
                report.auditors[site],
            ),
            (
                "text",
                f"How many tonnes did {report.company}'s {site} site ship in {{p}}?",
                report.shipped[site],
            ),
            (
                "image",
                f"What availability did the {site} site of {report.company} reach in {{p}}?",
                report.availability[site],
            ),
            (
                "image",
                f"How much energy, in GWh, did {report.company} sell from {site} in {{p}}?",
                report.energy[site],
            ),
        ]
        for kind, template, fact in asked:
            rows.append(
                {
                    "question": template.format(p=period_phrase(report, rng.randrange(3))),
                    "document": report.file_name,
                    "kind": kind,
                    "fact": fact,
                    "image_kind": "table"
                    if "availability" in template
                    else ("bar_outside" if kind == "image" else None),
                    "degradation": "none" if kind == "image" else None,
                    "image": None,
                    "company": report.company,
                    "quarter": report.quarter,
                    "year": report.year,
                    "format": report.fmt,
                }
            )
    return rows


def generate(out_dir: Path, companies: int, seed: int) -> dict:
    reports = build_reports(companies, seed)
    rng = random.Random(seed + 1)
    (out_dir / "docs").mkdir(parents=True, exist_ok=True)
    documents, questions = [], []
    for report in reports:
        data = write_pdf(report) if report.fmt == "pdf" else write_mhtml(report)
        (out_dir / "docs" / report.file_name).write_bytes(data)
        documents.append(
            {"file": report.file_name, "format": report.fmt, "title": report.title, "images": []}
        )
        questions += questions_for(report, rng)
    for number, row in enumerate(questions, start=1):
        row["id"] = f"s{number:05d}"
    (out_dir / "questions.jsonl").write_text(
        "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in questions), encoding="utf-8"
    )
    manifest = {"seed": seed, "generator": "bench/evalset_series.py", "documents": documents}
    (out_dir / "manifest.json").write_text(json.dumps(manifest, indent=1), encoding="utf-8")
    return {"documents": len(documents), "questions": len(questions)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    gen = commands.add_parser("generate", help="write docs/, questions.jsonl and manifest.json")
    gen.add_argument("out_dir", type=Path)
    gen.add_argument("--companies", type=int, default=3)
    gen.add_argument("--seed", type=int, default=7)
    args = parser.parse_args(argv)
    print(json.dumps(generate(args.out_dir, args.companies, args.seed)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
