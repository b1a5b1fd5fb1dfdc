"""Generate a licence-clean evaluation set whose key facts live only inside images.

Every document is a fictional company's quarterly report (MHTML saved the way Chrome/Blink saves
pages, or PDF written by the small writer below). Its content images (bar, line and pie charts,
light-on-dark dashboards, slides, KPI tables with grid lines, low-contrast screenshots, scanned
pages) carry facts that appear nowhere in the text; its body text carries other facts of its own;
decoration (logo, dividers, a repeated icon, a 1x1 tracker) sits next to them. Each company gets
up to four near-identical reports (Q1..Q4, different numbers) as hard negatives. Every number
shown anywhere in the set is unique, so a hit is unambiguous.

Writes `OUT_DIR/docs/*`, `OUT_DIR/questions.jsonl` (one paraphrased question per fact) and
`OUT_DIR/manifest.json` (per-document images with their expected classifier verdict).

    python bench/evalset.py generate OUT_DIR --docs 40 --seed 7

Rendering uses PIL's built-in scalable font only, so it works on a fresh machine.
"""

from __future__ import annotations

import argparse
import base64
import functools
import hashlib
import html
import io
import json
import math
import quopri
import random
import re
import sys
import time
import zlib
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from email.generator import BytesGenerator
from email.message import Message
from email.policy import compat32
from email.utils import format_datetime
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFilter, ImageFont

CONTENT_KINDS = (
    "bar_outside",
    "bar_inside",
    "line_chart",
    "pie_chart",
    "dashboard",
    "slide",
    "table",
    "screenshot",
    "scan",
)
DEGRADATIONS = ("none", "rotate", "blur", "jpeg", "downscale")
DECORATION_KINDS = ("logo", "divider", "icon", "tracker")

COMPANY_STEMS = (
    "Northwind",
    "Bluefin",
    "Copperleaf",
    "Driftwood",
    "Emberline",
    "Foxglove",
    "Granite Peak",
    "Harborview",
    "Ironbark",
    "Juniper",
    "Kestrel",
    "Lumen Ridge",
    "Marigold",
    "Nettlefield",
    "Oakhurst",
    "Pinecrest",
    "Quillon",
    "Redwater",
    "Silverbirch",
    "Tidewell",
    "Umberfield",
    "Valecrest",
    "Westbrook",
    "Yarrowdale",
    "Zephyrine",
)
COMPANY_TRADES = (
    "Analytics",
    "Robotics",
    "Logistics",
    "Foods",
    "Health",
    "Energy",
    "Textiles",
    "Software",
    "Freight",
    "Labs",
)
PRODUCTS = (
    "Atlas",
    "Beacon",
    "Cobalt",
    "Dynamo",
    "Ember",
    "Falcon",
    "Helix",
    "Indigo",
    "Keystone",
    "Lynx",
    "Meridian",
    "Nova",
    "Orion",
    "Pulse",
    "Quasar",
    "Sierra",
)
REGIONS = ("North", "South", "East", "West", "Central")
MONTHS = (
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
)
CITIES = ("Riverton", "Lakeport", "Ashford", "Millbrook", "Stonegate", "Fairhaven")
PALETTE = ("#1f4e79", "#b03a2e", "#117a65", "#6c3483", "#9a5b0b", "#2e4053")

FILLER = (
    "Management remains focused on disciplined growth and operational efficiency.",
    "The leadership team continued to invest in training and in the customer experience.",
    "Supply conditions were broadly stable and no material disruptions were reported.",
    "The company kept its full-year guidance unchanged and will update it next quarter.",
    "Several process improvements were rolled out across the finance and operations teams.",
    "Customer feedback remained positive, particularly on delivery reliability and support.",
    "The board thanked employees for their continued commitment during the period.",
)


# --------------------------------------------------------------------------------------------
# Specifications: what a document and its images say, decided before anything is rendered.


@dataclass
class Fact:
    fact: str  # the string a hit must contain, e.g. "3.2%"
    question: str  # paraphrases the words the fact is shown with


@dataclass
class ImageSpec:
    name: str  # file name of the image inside the document
    kind: str  # one of CONTENT_KINDS or DECORATION_KINDS
    verdict: str  # VISION or IGNORE: what the classifier should decide
    params: dict = field(default_factory=dict)  # what to draw
    degradation: str = "none"
    render_seed: int = 0
    alt: str = ""
    caption: str = ""
    facts: list[Fact] = field(default_factory=list)


@dataclass
class Block:
    kind: str  # h1, h2, p, figure, scan, divider
    text: str = ""
    image: int | None = None  # index into DocumentSpec.images


@dataclass
class DocumentSpec:
    file_name: str
    format: str  # mhtml or pdf
    company: str
    quarter: int
    year: int
    title: str
    base_url: str
    logo: int
    icon: int
    divider: int
    tracker: int | None
    blocks: list[Block] = field(default_factory=list)
    images: list[ImageSpec] = field(default_factory=list)
    text_facts: list[Fact] = field(default_factory=list)


class NumberPool:
    """Hands out numbers never shown before in the set, so a fact string identifies one place."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.used: set[str] = set()

    def claim(self, core: str) -> bool:
        if core in self.used:
            return False
        self.used.add(core)
        return True

    def draw(self, style: str, low: float, high: float) -> tuple[float, str]:
        """A fresh number in [low, high] as (value, text): count 12,418 · dec1 48.7 · dec2 0.37 ·
        pct1 3.2% · pct2 99.25%."""
        for attempt in range(5000):
            if attempt and attempt % 400 == 0:
                high = high * 1.5  # this range is used up: widen it rather than repeat a number
            if style == "count":
                value = float(self.rng.randint(int(low), int(high)))
                core, text = str(int(value)), f"{int(value):,}"
            elif style in ("dec1", "pct1"):
                value = self.rng.randint(round(low * 10), round(high * 10)) / 10
                core = f"{value:.1f}"
                text = core + ("%" if style == "pct1" else "")
            elif style in ("dec2", "pct2"):
                value = self.rng.randint(round(low * 100), round(high * 100)) / 100
                core = f"{value:.2f}"
                text = core + ("%" if style == "pct2" else "")
            else:
                raise ValueError(f"unknown number style {style!r}")
            if self.claim(core):
                return value, text
        raise RuntimeError(f"no unused {style} number left in [{low}, {high}]")


@dataclass(frozen=True)
class Kpi:
    label: str  # the words in the image
    style: str
    low: float
    high: float
    prefix: str
    suffix: str
    question: str  # paraphrase; {c} company, {q} "Q3 2024"


KPIS = (
    Kpi("Churn rate", "pct1", 1, 9.9, "", "", "What percentage of its customers did {c} lose in {q}?"),
    Kpi("Gross margin", "pct1", 30, 75, "", "", "How large was the gross profit margin at {c} in {q}?"),
    Kpi(
        "Net promoter score", "dec1", 20, 80, "", "", "What customer-loyalty (NPS) rating did {c} get in {q}?"
    ),
    Kpi(
        "Active users",
        "count",
        10_000,
        990_000,
        "",
        "",
        "How many people actively used {c}'s products in {q}?",
    ),
    Kpi(
        "Avg. order value",
        "dec2",
        40,
        400,
        "$",
        "",
        "On average, how much did a single customer purchase at {c} cost in {q}, in dollars?",
    ),
    Kpi(
        "Support tickets",
        "count",
        1_000,
        60_000,
        "",
        "",
        "How many help-desk requests came in at {c} during {q}?",
    ),
    Kpi(
        "Platform uptime",
        "pct2",
        97,
        99.99,
        "",
        "",
        "What service availability did {c}'s platform achieve in {q}?",
    ),
    Kpi(
        "On-time delivery",
        "pct1",
        80,
        99.9,
        "",
        "",
        "What share of {c}'s shipments arrived on schedule in {q}?",
    ),
    Kpi(
        "Customer acquisition cost",
        "dec2",
        50,
        900,
        "$",
        "",
        "How much did {c} spend to win each new client in {q}?",
    ),
    Kpi(
        "Annual recurring revenue",
        "dec1",
        10,
        900,
        "$",
        "M",
        "What yearly subscription revenue run-rate did {c} report for {q}, in millions of dollars?",
    ),
    Kpi(
        "Inventory turnover", "dec1", 2, 15, "", "x", "How many times did {c} cycle through its stock in {q}?"
    ),
    Kpi("Staff attrition", "pct1", 2, 25, "", "", "What proportion of employees left {c} in {q}?"),
    Kpi(
        "Cash on hand",
        "dec1",
        10,
        900,
        "$",
        "M",
        "How much money did {c} hold in the bank at the close of {q}, in millions of dollars?",
    ),
    Kpi("Orders shipped", "count", 5_000, 900_000, "", "", "How many orders did {c} dispatch during {q}?"),
)

TEXT_FACTS = (
    (
        "At the end of the quarter the company employed {v} people.",
        "count",
        200,
        20_000,
        "How many staff were on {c}'s payroll when {q} closed?",
    ),
    (
        "Average warehouse dispatch time came to {v} hours.",
        "dec1",
        1,
        72,
        "How long, in hours, did {c} need on average to get an order out of the warehouse in {q}?",
    ),
    (
        "Capital expenditure for the quarter totalled {v} million dollars.",
        "dec1",
        1,
        300,
        "How much did {c} invest in capital projects during {q}, in millions?",
    ),
    (
        "The {p} pilot programme enrolled {v} households.",
        "count",
        1_000,
        90_000,
        "How many households took part in {c}'s {p} trial in {q}?",
    ),
    (
        "Research and development spending reached {v} million dollars.",
        "dec1",
        1,
        200,
        "How much money went into R&D at {c} in {q}, in millions?",
    ),
    (
        "The employee engagement survey returned a score of {v} out of 100.",
        "dec1",
        40,
        95,
        "What result did {c}'s staff engagement survey give in {q}?",
    ),
    (
        "Energy use across all sites totalled {v} megawatt-hours.",
        "count",
        1_000,
        99_000,
        "How much electricity, in MWh, did {c}'s facilities consume in {q}?",
    ),
)


@dataclass
class DocContext:
    company: str
    quarter: int
    year: int
    products: list[str]
    regions: list[str]
    numbers: NumberPool
    rng: random.Random
    kpis: list[Kpi]  # KPIs not yet shown in this document

    @property
    def period(self) -> str:
        return f"Q{self.quarter} {self.year}"

    def ask(self, template: str, **extra: str) -> str:
        return template.format(c=self.company, q=self.period, **extra)

    def kpi_values(self, count: int) -> list[tuple[Kpi, float, str, str]]:
        """(kpi, value, shown text, fact) for the next `count` KPIs of this document."""
        chosen, self.kpis = self.kpis[:count], self.kpis[count:]
        values = []
        for kpi in chosen:
            value, text = self.numbers.draw(kpi.style, kpi.low, kpi.high)
            values.append((kpi, value, f"{kpi.prefix}{text}{kpi.suffix}", text))
        return values


def _bar_spec(ctx: DocContext, variant: int, inside: bool) -> tuple[dict, list[Fact], str, str]:
    if variant == 0:
        categories, title = ctx.regions[:4], f"Revenue by region, {ctx.period} ($M)"
        question = "How much revenue, in millions of dollars, did {c} book in its {x} region in {q}?"
        alt, caption = "Revenue by region", "Regional revenue for the quarter."
    else:
        categories, title = ctx.products[:4], f"Units sold by product line, {ctx.period} (thousands)"
        question = "How many thousand units of {x} did {c} sell in {q}?"
        alt, caption = "Units by product", "Unit sales per product line."
    values = [ctx.numbers.draw("dec1", 35, 95) for _ in categories]
    facts = [Fact(text, ctx.ask(question, x=cat)) for cat, (_, text) in zip(categories, values, strict=True)]
    params = {
        "title": title,
        "categories": categories,
        "values": [v for v, _ in values],
        "labels": [t for _, t in values],
        "inside": inside,
    }
    return params, facts, alt, caption


def _line_spec(ctx: DocContext, variant: int) -> tuple[dict, list[Fact], str, str]:
    months = list(MONTHS[(ctx.quarter - 1) * 3 : ctx.quarter * 3])
    if variant == 0:
        title, question = (
            f"Monthly active users, {ctx.period} (thousands)",
            ("How many thousand people used {c}'s app in {x} {y}?"),
        )
    else:
        title, question = (
            f"Website visits per month, {ctx.period} (thousands)",
            ("How many thousand visits did {c}'s website receive in {x} {y}?"),
        )
    values = [ctx.numbers.draw("dec1", 150, 800)]
    while len(values) < len(months):  # month to month within -15%..+20%, like a real series
        values.append(ctx.numbers.draw("dec1", values[-1][0] * 0.85, values[-1][0] * 1.2))
    facts = [
        Fact(text, ctx.ask(question, x=month, y=str(ctx.year)))
        for month, (_, text) in zip(months, values, strict=True)
    ]
    params = {
        "title": title,
        "categories": [m[:3] for m in months],
        "values": [v for v, _ in values],
        "labels": [t for _, t in values],
    }
    return params, facts, "Monthly trend", ""


def _pie_spec(ctx: DocContext) -> tuple[dict, list[Fact], str, str]:
    products = ctx.products[:4]
    while True:
        shares = [ctx.rng.randint(100, 400) / 10 for _ in products[:-1]]
        last = round(100 - sum(shares), 1)
        cores = [f"{s:.1f}" for s in [*shares, last]]
        if 5 <= last <= 60 and len(set(cores)) == len(cores) and not (set(cores) & ctx.numbers.used):
            ctx.numbers.used.update(cores)
            break
    labels = [f"{c}%" for c in cores]
    facts = [
        Fact(label, ctx.ask("What share of {c}'s {q} sales came from {x}?", x=product))
        for product, label in zip(products, labels, strict=True)
    ]
    params = {
        "title": f"Revenue mix by product line, {ctx.period}",
        "categories": products,
        "values": [*shares, last],
        "labels": labels,
    }
    return params, facts, "Revenue mix", "Share of revenue per product line."


def _screenshot_spec(ctx: DocContext, variant: int) -> tuple[dict, list[Fact], str, str]:
    if variant == 0:
        (_, a), (_, b) = ctx.numbers.draw("count", 1_000, 90_000), ctx.numbers.draw("count", 1_000, 9_000)
        title = f"{ctx.company} Billing Portal"
        lines = [
            f"Month-end sync finished for {ctx.period}.",
            f"{a} invoices were posted to the general ledger.",
            f"{b} invoices need manual review.",
        ]
        facts = [
            Fact(a, ctx.ask("How many invoices did {c}'s billing system push to the ledger for {q}?")),
            Fact(b, ctx.ask("How many invoices at {c} required a manual check after the {q} sync?")),
        ]
    elif variant == 1:
        (_, a), (_, b) = ctx.numbers.draw("dec1", 100, 990), ctx.numbers.draw("dec1", 10, 99)
        title = f"{ctx.company} Backup Manager"
        lines = [
            f"Backup of the {ctx.period} archive completed.",
            f"{a} GB copied to offsite storage.",
            f"Elapsed time: {b} minutes.",
        ]
        facts = [
            Fact(a, ctx.ask("How many gigabytes did {c}'s backup of the {q} archive copy?")),
            Fact(b, ctx.ask("How long, in minutes, did {c}'s {q} archive backup run?")),
        ]
    else:
        (_, a), (_, b) = ctx.numbers.draw("count", 10_000, 500_000), ctx.numbers.draw("count", 1_000, 9_999)
        title = f"{ctx.company} CRM Import"
        lines = [
            f"Import of {ctx.period} leads finished.",
            f"{a} contacts imported.",
            f"{b} rejected as duplicates.",
        ]
        facts = [
            Fact(a, ctx.ask("How many contacts were loaded into {c}'s CRM from the {q} leads?")),
            Fact(b, ctx.ask("How many duplicate records did {c}'s CRM refuse in the {q} import?")),
        ]
    return {"title": title, "lines": lines}, facts, "Screenshot", ""


def _scan_spec(ctx: DocContext) -> tuple[dict, list[Fact], str, str]:
    (_, dividend), (_, buyback) = ctx.numbers.draw("dec2", 0.05, 0.95), ctx.numbers.draw("dec1", 5, 250)
    _, lease = ctx.numbers.draw("count", 10_000, 400_000)
    city = ctx.rng.choice(CITIES)
    paragraphs = [
        "MEMORANDUM",
        f"To: Board of Directors, {ctx.company}",
        "From: Office of the Chief Financial Officer",
        f"Subject: Resolutions adopted at the {ctx.period} board meeting",
        f"At its meeting the Board approved a quarterly dividend of ${dividend} per share, payable to "
        "shareholders of record at the end of the following month.",
        f"The Board further authorised a share buyback programme of up to ${buyback} million, to be "
        "executed over the next twelve months at management's discretion.",
        f"Finally, the Board approved a lease of {lease} square feet for the new distribution centre in "
        f"{city}. Construction of the fit-out is expected to start next quarter.",
        "Please direct any questions about these resolutions to the company secretary.",
    ]
    facts = [
        Fact(dividend, ctx.ask("What per-share payout to shareholders did {c}'s board approve in {q}?")),
        Fact(
            buyback,
            ctx.ask(
                "Up to how many millions of dollars may {c} spend repurchasing its own stock, "
                "according to the {q} board memo?"
            ),
        ),
        Fact(
            lease,
            ctx.ask(
                "How many square feet does the distribution-centre lease approved by {c}'s board "
                "in {q} cover?"
            ),
        ),
    ]
    return {"paragraphs": paragraphs}, facts, "Scanned memo", "Scanned board memorandum."


def build_content_image(ctx: DocContext, kind: str, variant: int, degradation: str, name: str) -> ImageSpec:
    """The image of `kind` for this document, with its facts and paraphrased questions."""
    if kind in ("bar_outside", "bar_inside"):
        params, facts, alt, caption = _bar_spec(ctx, variant, inside=kind == "bar_inside")
    elif kind == "line_chart":
        params, facts, alt, caption = _line_spec(ctx, variant)
    elif kind == "pie_chart":
        params, facts, alt, caption = _pie_spec(ctx)
    elif kind == "dashboard":
        tiles = ctx.kpi_values(4)
        params = {
            "title": f"{ctx.company} operations dashboard - {ctx.period}",
            "tiles": [(kpi.label, shown) for kpi, _, shown, _ in tiles],
        }
        facts = [Fact(fact, ctx.ask(kpi.question)) for kpi, _, _, fact in tiles]
        alt, caption = "", ""
    elif kind == "slide":
        bullets = ctx.kpi_values(3)
        params = {
            "title": f"{ctx.period} highlights",
            "bullets": [f"{kpi.label} came in at {shown}" for kpi, _, shown, _ in bullets],
        }
        facts = [Fact(fact, ctx.ask(kpi.question)) for kpi, _, _, fact in bullets]
        alt, caption = "Slide", "From the investor presentation."
    elif kind == "table":
        rows = ctx.kpi_values(4)
        table = []
        for kpi, value, shown, _ in rows:
            _, target = ctx.numbers.draw(kpi.style, max(kpi.low, value * 0.85), min(kpi.high, value * 1.15))
            status = ctx.rng.choice(("On track", "Watch", "Ahead"))
            table.append([kpi.label, shown, f"{kpi.prefix}{target}{kpi.suffix}", status])
        params = {
            "title": f"KPI summary, {ctx.period}",
            "header": ["Metric", "Actual", "Target", "Status"],
            "rows": table,
        }
        facts = [Fact(fact, ctx.ask(kpi.question)) for kpi, _, _, fact in rows]
        alt, caption = "KPI table", "Key performance indicators against target."
    elif kind == "screenshot":
        params, facts, alt, caption = _screenshot_spec(ctx, variant)
    elif kind == "scan":
        params, facts, alt, caption = _scan_spec(ctx)
    else:
        raise ValueError(f"unknown content image kind {kind!r}")
    return ImageSpec(
        name=name,
        kind=kind,
        verdict="VISION",
        params=params,
        degradation=degradation,
        render_seed=ctx.rng.randrange(2**31),
        alt=alt,
        caption=caption,
        facts=facts,
    )


SECTION_TITLES = {
    "bar_outside": "Performance by segment",
    "bar_inside": "Performance by segment",
    "line_chart": "Engagement trend",
    "pie_chart": "Product mix",
    "dashboard": "Operations dashboard",
    "slide": "Investor presentation",
    "table": "KPI summary",
    "screenshot": "Systems and operations",
    "scan": "Board matters",
}
SECTION_LEADS = {
    "bar_outside": "The chart below breaks the quarter down by segment.",
    "bar_inside": "The chart below breaks the quarter down by segment.",
    "line_chart": "Engagement over the three months of the quarter is plotted below.",
    "pie_chart": "How sales were split between product lines is shown in the chart below.",
    "dashboard": "The operations team tracks its key indicators on the dashboard reproduced below.",
    "slide": "The following slide was presented to investors on the earnings call.",
    "table": "Our key performance indicators compared with target are listed in the table below.",
    "screenshot": "The screenshot below was captured from an internal system at quarter end.",
    "scan": "The board memorandum for the quarter is attached as a scanned copy.",
}


@dataclass(frozen=True)
class GroupPlan:
    """What the reports of one company share across quarters (the hard negatives)."""

    company: str
    slug: str
    year: int
    products: list[str]
    regions: list[str]
    colour: str
    kinds: list[list[str]]  # content kinds per quarter
    variants: dict[str, int]
    text_facts: list[int]
    hashed_names: bool


def document_spec(
    plan: GroupPlan,
    quarter: int,
    fmt: str,
    numbers: NumberPool,
    rng: random.Random,
    degradations: dict[str, str],
) -> DocumentSpec:
    """One quarterly report: layout shared with its siblings, numbers its own."""
    kpis = list(KPIS)
    rng.shuffle(kpis)
    ctx = DocContext(plan.company, quarter, plan.year, plan.products, plan.regions, numbers, rng, kpis)
    ext = "mhtml" if fmt == "mhtml" else "pdf"
    file_name = f"{plan.slug}_{plan.year}_q{quarter}_report.{ext}"
    base_url = f"https://reports.{plan.slug.replace('_', '-')}.example/{plan.year}/q{quarter}/"

    def image_name(kind: str, index: int, ext: str) -> str:
        if plan.hashed_names:
            digest = hashlib.sha1(f"{file_name}/{kind}/{index}".encode()).hexdigest()[:10]
            return f"img_{digest}.{ext}"
        return f"{kind.replace('_', '-')}-{index}.{ext}"

    images = [
        ImageSpec(
            image_name("logo", 0, "png"),
            "logo",
            "IGNORE",
            {"company": plan.company, "colour": plan.colour},
            alt=f"{plan.company} logo",
        ),
        ImageSpec(image_name("icon", 0, "png"), "icon", "IGNORE", {"colour": plan.colour}),
        ImageSpec(image_name("divider", 0, "png"), "divider", "IGNORE", {"colour": plan.colour}),
    ]
    tracker = None
    if fmt == "mhtml":
        images.append(ImageSpec("pixel.gif", "tracker", "IGNORE"))
        tracker = 3
    doc = DocumentSpec(
        file_name=file_name,
        format=fmt,
        company=plan.company,
        quarter=quarter,
        year=plan.year,
        title=f"{plan.company} Quarterly Report, {ctx.period}",
        base_url=base_url,
        logo=0,
        icon=1,
        divider=2,
        tracker=tracker,
    )
    sentences = []
    for index in plan.text_facts:
        template, style, low, high, question = TEXT_FACTS[index]
        _, text = numbers.draw(style, low, high)
        product = plan.products[-1]
        sentences.append(template.format(v=text, p=product))
        doc.text_facts.append(Fact(text, ctx.ask(question, p=product)))
    fillers = list(FILLER)
    rng.shuffle(fillers)
    doc.blocks.append(Block("h1", doc.title))
    doc.blocks.append(
        Block(
            "p",
            f"This report summarises how {plan.company} performed in {ctx.period}. "
            f"{fillers[0]} {sentences[0]}",
        )
    )
    doc.blocks.append(Block("divider", image=2))
    bar_variants: set[int] = set()
    for position, kind in enumerate(plan.kinds[quarter - 1]):
        variant = plan.variants.get(kind, 0)
        if kind in ("bar_outside", "bar_inside"):
            variant = variant if variant not in bar_variants else 1 - variant  # never ask the same twice
            bar_variants.add(variant)
        spec = build_content_image(
            ctx,
            kind,
            variant,
            degradations[kind],
            image_name(
                kind, position + 1, "jpg" if degradations[kind] == "jpeg" or kind == "scan" else "png"
            ),
        )
        images.append(spec)
        text = f"{SECTION_LEADS[kind]} {fillers[(position + 1) % len(fillers)]}"
        if position + 1 < len(sentences):
            text += f" {sentences[position + 1]}"
        doc.blocks.append(Block("h2", SECTION_TITLES[kind]))
        doc.blocks.append(Block("p", text))
        doc.blocks.append(Block("scan" if kind == "scan" else "figure", image=len(images) - 1))
    doc.blocks.append(Block("divider", image=2))
    doc.blocks.append(Block("h2", "Outlook"))
    doc.blocks.append(Block("p", f"{fillers[-1]} " + " ".join(sentences[len(plan.kinds[quarter - 1]) + 1 :])))
    doc.images = images
    return doc


def plan_groups(docs: int, rng: random.Random) -> list[tuple[GroupPlan, list[int]]]:
    """Companies with up to four quarterly reports each; content kinds and degradations rotate so
    every kind appears in every degradation about equally often."""
    companies = [f"{stem} {trade}" for stem in COMPANY_STEMS for trade in COMPANY_TRADES]
    rng.shuffle(companies)
    plans = []
    kind_cycle = 0
    for group in range((docs + 3) // 4):
        company = companies[group % len(companies)] + (
            f" {group // len(companies) + 1}" if group >= len(companies) else ""
        )
        quarters = list(range(1, min(4, docs - group * 4) + 1))
        shared = CONTENT_KINDS[group % len(CONTENT_KINDS)]
        kinds = []
        for _ in range(4):
            others = []
            while len(others) < 2:
                candidate = CONTENT_KINDS[kind_cycle % len(CONTENT_KINDS)]
                kind_cycle += 1
                if candidate != shared and candidate not in others:
                    others.append(candidate)
            kinds.append([shared, *others])
        products = rng.sample(PRODUCTS, 4)
        regions = rng.sample(REGIONS, 4)
        plan = GroupPlan(
            company=company,
            slug=re.sub(r"[^a-z0-9]+", "_", company.lower()).strip("_"),
            year=rng.choice((2023, 2024, 2025)),
            products=products,
            regions=regions,
            colour=PALETTE[group % len(PALETTE)],
            kinds=kinds,
            variants={
                "bar_outside": rng.randrange(2),
                "bar_inside": rng.randrange(2),
                "line_chart": rng.randrange(2),
                "screenshot": rng.randrange(3),
            },
            text_facts=rng.sample(range(len(TEXT_FACTS)), 3),
            hashed_names=group % 2 == 1,
        )
        plans.append((plan, quarters))
    return plans


def build_specs(docs: int, seed: int) -> list[DocumentSpec]:
    """All document specifications of a set, deterministic for (docs, seed)."""
    rng = random.Random(seed)
    numbers = NumberPool(rng)
    degradation_counter: Counter[str] = Counter()
    specs = []
    for plan, quarters in plan_groups(docs, rng):
        for quarter in quarters:
            degradations = {}
            for kind in plan.kinds[quarter - 1]:
                offset = CONTENT_KINDS.index(kind)  # so small sets still see every degradation
                degradations[kind] = DEGRADATIONS[(degradation_counter[kind] + offset) % len(DEGRADATIONS)]
                degradation_counter[kind] += 1
            fmt = "mhtml" if (len(specs) + quarter // 3) % 2 == 0 else "pdf"
            specs.append(document_spec(plan, quarter, fmt, numbers, rng, degradations))
    return specs


# --------------------------------------------------------------------------------------------
# Rendering: PIL drawing with the built-in scalable font.


@functools.cache
def font(size: int) -> ImageFont.FreeTypeFont:
    return ImageFont.load_default(size=size)


def _text_width(draw: ImageDraw.ImageDraw, text: str, size: int) -> float:
    return draw.textlength(text, font=font(size))


def _wrap(draw: ImageDraw.ImageDraw, text: str, size: int, width: float) -> list[str]:
    lines, current = [], ""
    for word in text.split():
        candidate = f"{current} {word}".strip()
        if current and _text_width(draw, candidate, size) > width:
            lines.append(current)
            current = word
        else:
            current = candidate
    return [*lines, current] if current else lines


def _axis_max(values: list[float]) -> tuple[float, float]:
    """A round axis maximum and tick step, so tick labels are whole numbers."""
    top = max(values) * 1.12
    step = 10 ** max(0, len(str(int(top / 5))) - 1)
    while top / step > 6:
        step *= 2 if str(step)[0] == "1" else 2.5
    step = int(step)
    return float(step * -(-top // step)), float(step)


def _value_axis(
    draw: ImageDraw.ImageDraw, values: list[float], left: int, right: int, top: int, bottom: int
) -> float:
    """Grid lines and tick labels of a chart's value axis; returns the axis maximum."""
    axis_top, step = _axis_max(values)
    tick = 0.0
    while tick <= axis_top:
        y = bottom - (bottom - top) * tick / axis_top
        draw.line((left, y, right, y), fill="#e6e6e6", width=1)
        draw.text((left - 12, y), f"{int(tick)}", anchor="rm", fill="#888888", font=font(16))
        tick += step
    return axis_top


def render_bar_chart(params: dict) -> Image.Image:
    img = Image.new("RGB", (900, 520), "white")
    draw = ImageDraw.Draw(img)
    draw.text((40, 22), params["title"], fill="#222222", font=font(28))
    left, right, top, bottom = 90, 870, 90, 450
    axis_top = _value_axis(draw, params["values"], left, right, top, bottom)
    draw.line((left, bottom, right, bottom), fill="#444444", width=2)
    slot = (right - left) / len(params["values"])
    for index, (category, value, label) in enumerate(
        zip(params["categories"], params["values"], params["labels"], strict=True)
    ):
        x0, x1 = left + slot * index + slot * 0.2, left + slot * (index + 1) - slot * 0.2
        y = bottom - (bottom - top) * value / axis_top
        draw.rectangle((x0, y, x1, bottom), fill=PALETTE[index % len(PALETTE)])
        if params["inside"]:
            draw.text(((x0 + x1) / 2, y + 14), label, anchor="mt", fill="white", font=font(26))
        else:
            draw.text(((x0 + x1) / 2, y - 8), label, anchor="mb", fill="#222222", font=font(26))
        draw.text(((x0 + x1) / 2, bottom + 14), category, anchor="mt", fill="#333333", font=font(22))
    return img


def render_line_chart(params: dict) -> Image.Image:
    img = Image.new("RGB", (900, 520), "white")
    draw = ImageDraw.Draw(img)
    draw.text((40, 22), params["title"], fill="#222222", font=font(28))
    left, right, top, bottom = 90, 860, 110, 450
    axis_top = _value_axis(draw, params["values"], left, right, top, bottom)
    count = len(params["values"])
    points = [
        (left + 60 + (right - left - 120) * i / max(1, count - 1), bottom - (bottom - top) * v / axis_top)
        for i, v in enumerate(params["values"])
    ]
    draw.line(points, fill="#1f4e79", width=4)
    for (x, y), label, category in zip(points, params["labels"], params["categories"], strict=True):
        draw.ellipse((x - 7, y - 7, x + 7, y + 7), fill="#1f4e79")
        left_edge, top_edge, right_edge, bottom_edge = draw.textbbox(
            (x, y - 14), label, anchor="mb", font=font(26)
        )
        draw.rectangle((left_edge - 4, top_edge - 3, right_edge + 4, bottom_edge + 3), fill="white")
        draw.text((x, y - 14), label, anchor="mb", fill="#222222", font=font(26))
        draw.text((x, bottom + 14), category, anchor="mt", fill="#333333", font=font(22))
    return img


def render_pie_chart(params: dict) -> Image.Image:
    img = Image.new("RGB", (900, 520), "white")
    draw = ImageDraw.Draw(img)
    draw.text((40, 22), params["title"], fill="#222222", font=font(28))
    start = -90.0
    for index, value in enumerate(params["values"]):
        end = start + 360 * value / 100
        draw.pieslice(
            (70, 100, 450, 480), start, end, fill=PALETTE[index % len(PALETTE)], outline="white", width=3
        )
        start = end
    for index, (category, label) in enumerate(zip(params["categories"], params["labels"], strict=True)):
        y = 170 + index * 70
        draw.rectangle((520, y, 550, y + 30), fill=PALETTE[index % len(PALETTE)])
        draw.text((570, y + 15), f"{category}  {label}", anchor="lm", fill="#222222", font=font(28))
    return img


def render_dashboard(params: dict) -> Image.Image:
    img = Image.new("RGB", (960, 420), "#141922")
    draw = ImageDraw.Draw(img)
    draw.text((36, 28), params["title"], fill="#c9d3df", font=font(26))
    for index, (label, value) in enumerate(params["tiles"]):
        x0, y0 = 36 + (index % 2) * 450, 90 + (index // 2) * 160
        draw.rounded_rectangle((x0, y0, x0 + 420, y0 + 140), radius=12, fill="#212836")
        draw.text((x0 + 24, y0 + 22), label.upper(), fill="#8fa1b8", font=font(20))
        draw.text((x0 + 24, y0 + 62), value, fill="#4fd1c5" if index % 2 else "#e6f1ff", font=font(46))
    return img


def render_slide(params: dict) -> Image.Image:
    img = Image.new("RGB", (960, 540), "#fbfbf8")
    draw = ImageDraw.Draw(img)
    draw.rectangle((0, 0, 960, 110), fill="#1f4e79")
    draw.text((48, 55), params["title"], anchor="lm", fill="white", font=font(44))
    y = 170
    for bullet in params["bullets"]:
        draw.ellipse((56, y + 8, 70, y + 22), fill="#b03a2e")
        for line in _wrap(draw, bullet, 32, 820):
            draw.text((92, y), line, fill="#1d1d1d", font=font(32))
            y += 44
        y += 40
    draw.text((900, 510), "3", anchor="rm", fill="#999999", font=font(16))
    return img


def render_table(params: dict) -> Image.Image:
    rows = [params["header"], *params["rows"]]
    widths = [330, 190, 190, 160]
    row_height, top = 56, 80
    img = Image.new("RGB", (sum(widths) + 60, top + row_height * len(rows) + 30), "white")
    draw = ImageDraw.Draw(img)
    draw.text((30, 24), params["title"], fill="#222222", font=font(28))
    draw.rectangle((30, top, 30 + sum(widths), top + row_height), fill="#dce6f1")
    for r, row in enumerate(rows):
        x = 30
        for width, cell in zip(widths, row, strict=True):
            draw.text(
                (x + 14, top + r * row_height + row_height / 2),
                cell,
                anchor="lm",
                fill="#111111",
                font=font(24),
            )
            x += width
    for r in range(len(rows) + 1):
        y = top + r * row_height
        draw.line((30, y, 30 + sum(widths), y), fill="#000000", width=2)
    x = 30
    for width in [0, *widths]:
        x += width
        draw.line((x, top, x, top + row_height * len(rows)), fill="#000000", width=2)
    return img


def render_screenshot(params: dict) -> Image.Image:
    img = Image.new("RGB", (820, 420), "#dcdfe3")
    draw = ImageDraw.Draw(img)
    draw.rectangle((60, 50, 760, 370), fill="#eef0f2", outline="#d0d4d9", width=2)
    draw.rectangle((62, 52, 758, 96), fill="#e3e6ea")
    draw.text((84, 74), params["title"], anchor="lm", fill="#8d949c", font=font(22))
    for index, colour in enumerate(("#e8b4b0", "#e8dcb0", "#b8dcb8")):
        draw.ellipse((700 + index * 18, 68, 712 + index * 18, 80), fill=colour)
    y = 130
    for line in params["lines"]:
        draw.text((96, y), line, fill="#9ca3ab", font=font(24))
        y += 50
    for index, label in enumerate(("Details", "OK")):
        x0 = 520 + index * 120
        draw.rounded_rectangle((x0, 310, x0 + 104, 348), radius=6, fill="#c9ced4")
        draw.text((x0 + 52, 329), label, anchor="mm", fill="#f4f5f6", font=font(20))
    return img


def render_scan(params: dict, rng: random.Random) -> Image.Image:
    """A typed page photocopied: slightly rotated, speckled, grey."""
    img = Image.new("L", (850, 1100), 250)
    draw = ImageDraw.Draw(img)
    y = 90
    for index, paragraph in enumerate(params["paragraphs"]):
        size = 30 if index == 0 else 21
        for line in _wrap(draw, paragraph, size, 690):
            draw.text((80, y), line, fill=35, font=font(size))
            y += size + 9
        y += 14 if index < 4 else 24
    img = img.rotate(rng.uniform(-1.8, 1.8), resample=Image.Resampling.BICUBIC, fillcolor=250)
    noise = np.random.default_rng(rng.randrange(2**31)).normal(0, 7, (1100, 850))
    pixels = np.clip(np.asarray(img, dtype=np.float32) + noise, 0, 255).astype(np.uint8)
    return Image.fromarray(pixels, mode="L").filter(ImageFilter.GaussianBlur(0.5))


def render_logo(params: dict) -> Image.Image:
    img = Image.new("RGB", (180, 54), "white")
    draw = ImageDraw.Draw(img)
    draw.rounded_rectangle((2, 4, 48, 50), radius=10, fill=params["colour"])
    initials = "".join(word[0] for word in params["company"].split()[:2])
    draw.text((25, 27), initials, anchor="mm", fill="white", font=font(22))
    draw.text((58, 27), params["company"].split()[0], anchor="lm", fill=params["colour"], font=font(18))
    return img


def render_icon(params: dict) -> Image.Image:
    img = Image.new("RGB", (24, 24), "white")
    draw = ImageDraw.Draw(img)
    draw.ellipse((2, 2, 21, 21), fill=params["colour"])
    draw.polygon(((9, 7), (17, 12), (9, 17)), fill="white")
    return img


def render_divider(params: dict) -> Image.Image:
    gradient = np.linspace(0.0, 1.0, 900, dtype=np.float32)[None, :, None]
    colour = np.array([int(params["colour"][i : i + 2], 16) for i in (1, 3, 5)], dtype=np.float32)
    pixels = (255 - gradient * (255 - colour)) * np.ones((6, 1, 1), dtype=np.float32)
    return Image.fromarray(pixels.astype(np.uint8), mode="RGB")


TRACKER_GIF = base64.b64decode("R0lGODlhAQABAIAAAAAAAP///yH5BAEAAAAALAAAAAABAAEAAAIBRAA7")

RENDERERS = {
    "bar_outside": render_bar_chart,
    "bar_inside": render_bar_chart,
    "line_chart": render_line_chart,
    "pie_chart": render_pie_chart,
    "dashboard": render_dashboard,
    "slide": render_slide,
    "table": render_table,
    "screenshot": render_screenshot,
    "logo": render_logo,
    "icon": render_icon,
    "divider": render_divider,
}


def degrade(img: Image.Image, degradation: str, rng: random.Random) -> Image.Image:
    """The damage real documents do: a crooked scan, a soft photo, a small thumbnail."""
    if degradation == "rotate":
        angle = rng.choice((-1, 1)) * rng.uniform(2.0, 4.5)
        fill = img.getpixel((0, 0))
        return img.rotate(angle, resample=Image.Resampling.BICUBIC, expand=True, fillcolor=fill)
    if degradation == "blur":
        return img.filter(ImageFilter.GaussianBlur(1.4))
    if degradation == "downscale":
        return img.resize((int(img.width * 0.6), int(img.height * 0.6)), Image.Resampling.LANCZOS)
    return img


def render_image(spec: ImageSpec) -> tuple[bytes, str]:
    """The encoded image (bytes, mime) for a spec; JPEG for scans and the `jpeg` degradation."""
    if spec.kind == "tracker":
        return TRACKER_GIF, "image/gif"
    rng = random.Random(spec.render_seed)
    img = render_scan(spec.params, rng) if spec.kind == "scan" else RENDERERS[spec.kind](spec.params)
    img = degrade(img, spec.degradation, rng)
    quality = 30 if spec.degradation == "jpeg" else 55 if spec.kind == "scan" else None
    buffer = io.BytesIO()
    if quality is None:
        img.save(buffer, format="PNG", compress_level=6)
        return buffer.getvalue(), "image/png"
    img.save(buffer, format="JPEG", quality=quality)
    return buffer.getvalue(), "image/jpeg"


# --------------------------------------------------------------------------------------------
# Writers: MHTML as Chrome/Blink saves it, PDF by a writer small enough to read.


def _blink_id(seed: str, length: int = 32) -> str:
    return hashlib.sha256(seed.encode()).hexdigest()[:length].upper()


def document_html(doc: DocumentSpec, urls: list[str]) -> str:
    """The page's HTML; every image is an <img> pointing at its Content-Location."""
    esc = html.escape
    icon = f'<img src="{urls[doc.icon]}" alt="" width="24" height="24" class="icon">'
    out = [
        '<!DOCTYPE html><html><head><meta charset="utf-8">',
        f"<title>{esc(doc.title)}</title>",
        "<style>body{font-family:Arial,sans-serif;max-width:960px;margin:auto}figure{margin:24px 0}"
        "figcaption{color:#666;font-size:13px}.icon{vertical-align:middle;margin-right:8px}</style>",
        "</head><body>",
        f'<header><a href="{doc.base_url}"><img src="{urls[doc.logo]}" alt="{esc(doc.images[doc.logo].alt)}" '
        'width="180" height="54"></a><nav><a href="#">Home</a> | <a href="#">Investors</a> | '
        '<a href="#">Reports</a></nav></header>',
    ]
    figure_number = 0
    for block in doc.blocks:
        if block.kind == "h1":
            out.append(f"<h1>{esc(block.text)}</h1>")
        elif block.kind == "h2":
            out.append(f"<h2>{icon}{esc(block.text)}</h2>")
        elif block.kind == "p":
            out.append(f"<p>{esc(block.text)}</p>")
        elif block.kind == "divider":
            out.append(f'<img src="{urls[block.image]}" alt="" width="900" height="6">')
        else:
            image = doc.images[block.image]
            figure_number += 1
            caption = (
                f"<figcaption>Figure {figure_number}. {esc(image.caption)}</figcaption>"
                if image.caption
                else ""
            )
            out.append(f'<figure><img src="{urls[block.image]}" alt="{esc(image.alt)}">{caption}</figure>')
    out.append(f"<footer><p>Copyright {doc.year} {esc(doc.company)}. All rights reserved.</p>")
    if doc.tracker is not None:
        out.append(f'<img src="{urls[doc.tracker]}" width="1" height="1" alt="" style="display:none">')
    out.append("</footer></body></html>")
    return "\n".join(out)


def mhtml_urls(doc: DocumentSpec) -> list[str]:
    """The Content-Location of each image part, in `doc.images` order."""
    host = doc.base_url.split("://", 1)[1].split("/", 1)[0]
    return [
        "https://stats.example-analytics.net/pixel.gif?r=report"
        if image.kind == "tracker"
        else f"https://cdn.{host}/{doc.year}/q{doc.quarter}/assets/{image.name}"
        for image in doc.images
    ]


def write_mhtml(doc: DocumentSpec, encoded: list[tuple[bytes, str]]) -> bytes:
    """A multipart/related archive with the headers and part layout of a Chrome "Save as MHTML"."""
    urls = mhtml_urls(doc)
    boundary = f"----MultipartBoundary--{_blink_id(doc.file_name, 42)}----"
    archive = Message()
    archive["From"] = "<Saved by Blink>"
    archive["Snapshot-Content-Location"] = doc.base_url
    archive["Subject"] = doc.title
    archive["Date"] = format_datetime(
        datetime(doc.year + (doc.quarter == 4), doc.quarter * 3 % 12 + 1, 2, 9, 30)
    )
    archive["MIME-Version"] = "1.0"
    archive["Content-Type"] = f'multipart/related;\r\n\ttype="text/html";\r\n\tboundary="{boundary}"'
    page = Message()
    page["Content-Type"] = "text/html"
    page["Content-ID"] = f"<frame-{_blink_id(doc.file_name + '/frame')}@mhtml.blink>"
    page["Content-Transfer-Encoding"] = "quoted-printable"
    page["Content-Location"] = doc.base_url
    page.set_payload(quopri.encodestring(document_html(doc, urls).encode("utf-8")).decode("ascii"))
    archive.attach(page)
    return with_image_parts(
        archive, [(url, data, mime) for url, (data, mime) in zip(urls, encoded, strict=True)]
    )


def saved_page(
    base: str, subject: str, boundary: str, page_html: str, images: list[tuple[str, bytes, str]]
) -> bytes:
    """A page and its images as Chrome's "Save as MHTML" writes them, without the Date and frame ID
    headers `write_mhtml` adds."""
    archive = Message()
    archive["From"] = "<Saved by Blink>"
    archive["Snapshot-Content-Location"] = base
    archive["Subject"] = subject
    archive["MIME-Version"] = "1.0"
    archive["Content-Type"] = f'multipart/related;\r\n\ttype="text/html";\r\n\tboundary="{boundary}"'
    page = Message()
    page["Content-Type"] = "text/html"
    page["Content-Transfer-Encoding"] = "quoted-printable"
    page["Content-Location"] = base
    page.set_payload(quopri.encodestring(page_html.encode("utf-8")).decode("ascii"))
    archive.attach(page)
    return with_image_parts(archive, images)


def with_image_parts(archive: Message, images: list[tuple[str, bytes, str]]) -> bytes:
    """The archive (page already attached) with one base64 part per (url, bytes, mime), as Blink writes it."""
    for url, data, mime in images:
        part = Message()
        part["Content-Type"] = mime
        part["Content-Transfer-Encoding"] = "base64"
        part["Content-Location"] = url
        part.set_payload(base64.encodebytes(data).decode("ascii"))
        archive.attach(part)
    buffer = io.BytesIO()
    # Blink never folds headers (long Content-Locations stay on one line) except Content-Type above.
    BytesGenerator(
        buffer, mangle_from_=False, policy=compat32.clone(linesep="\r\n", max_line_length=0)
    ).flatten(archive)
    return buffer.getvalue()


class PdfWriter:
    """Just enough PDF: Helvetica text and JPEG (DCTDecode) / raster (FlateDecode) image XObjects
    placed with `cm`. Coordinates given in points from the page's top-left corner."""

    def __init__(self, width: float = 612.0, height: float = 792.0) -> None:
        self.width, self.height = width, height
        self.pages: list[list[str]] = []
        self.page_images: list[set[str]] = []
        self.images: dict[str, tuple[bytes, bytes]] = {}  # name -> (dictionary, stream)
        self._names_by_digest: dict[str, str] = {}

    def new_page(self) -> int:
        self.pages.append([])
        self.page_images.append(set())
        return len(self.pages)

    def text(self, x: float, top: float, text: str, size: float = 11, bold: bool = False) -> None:
        escaped = text.replace("\\", "\\\\").replace("(", "\\(").replace(")", "\\)")
        baseline = self.height - top - size * 0.8
        self.pages[-1].append(
            f"BT /{'F2' if bold else 'F1'} {size:g} Tf {x:.2f} {baseline:.2f} Td ({escaped}) Tj ET"
        )

    def image(self, data: bytes, x: float, top: float, width: float, height: float) -> None:
        name = self._register(data)
        self.page_images[-1].add(name)
        bottom = self.height - top - height
        self.pages[-1].append(f"q {width:.2f} 0 0 {height:.2f} {x:.2f} {bottom:.2f} cm /{name} Do Q")

    def _register(self, data: bytes) -> str:
        digest = hashlib.sha256(data).hexdigest()
        if digest in self._names_by_digest:
            return self._names_by_digest[digest]
        img = Image.open(io.BytesIO(data))
        if data[:2] == b"\xff\xd8":
            stream, filter_name, mode = data, "DCTDecode", img.mode
        else:
            if img.mode in ("RGBA", "LA", "P"):
                background = Image.new("RGB", img.size, "white")
                background.paste(img.convert("RGBA"), mask=img.convert("RGBA").split()[-1])
                img = background
            img = img if img.mode in ("L", "RGB") else img.convert("RGB")
            stream, filter_name, mode = zlib.compress(img.tobytes(), 6), "FlateDecode", img.mode
        colour_space = "DeviceGray" if mode == "L" else "DeviceRGB"
        dictionary = (
            f"<< /Type /XObject /Subtype /Image /Width {img.width} /Height {img.height} "
            f"/ColorSpace /{colour_space} /BitsPerComponent 8 /Filter /{filter_name} /Length {len(stream)} >>"
        ).encode()
        name = f"Im{len(self.images) + 1}"
        self.images[name] = (dictionary, stream)
        self._names_by_digest[digest] = name
        return name

    def to_bytes(self, title: str, creation: str) -> bytes:
        objects: list[bytes] = [
            b"",
            b"",
            b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica /Encoding /WinAnsiEncoding >>",
            b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica-Bold /Encoding /WinAnsiEncoding >>",
        ]
        image_ids = {}
        for name, (dictionary, stream) in self.images.items():
            objects.append(dictionary + b"\nstream\n" + stream + b"\nendstream")
            image_ids[name] = len(objects)
        page_ids = []
        for operations, names in zip(self.pages, self.page_images, strict=True):
            content = zlib.compress("\n".join(operations).encode("cp1252", errors="replace"), 6)
            objects.append(
                b"<< /Length %d /Filter /FlateDecode >>\nstream\n" % len(content) + content + b"\nendstream"
            )
            xobjects = " ".join(f"/{name} {image_ids[name]} 0 R" for name in sorted(names))
            objects.append(
                f"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 {self.width:g} {self.height:g}] "
                f"/Resources << /Font << /F1 3 0 R /F2 4 0 R >> /XObject << {xobjects} >> >> "
                f"/Contents {len(objects)} 0 R >>".encode()
            )
            page_ids.append(len(objects))
        objects[0] = b"<< /Type /Catalog /Pages 2 0 R >>"
        kids = " ".join(f"{i} 0 R" for i in page_ids)
        objects[1] = f"<< /Type /Pages /Kids [{kids}] /Count {len(page_ids)} >>".encode()
        safe_title = title.replace("\\", "").replace("(", "[").replace(")", "]")
        objects.append(
            f"<< /Title ({safe_title}) /Producer (vision_rag_pipeline bench/evalset.py) "
            f"/CreationDate (D:{creation}) >>".encode()
        )
        out = bytearray(b"%PDF-1.4\n%\xe2\xe3\xcf\xd3\n")
        offsets = []
        for number, body in enumerate(objects, start=1):
            offsets.append(len(out))
            out += b"%d 0 obj\n" % number + body + b"\nendobj\n"
        xref = len(out)
        out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
        out += b"".join(b"%010d 00000 n \n" % offset for offset in offsets)
        out += b"trailer\n<< /Size %d /Root 1 0 R /Info %d 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (
            len(objects) + 1,
            len(objects),
            xref,
        )
        return bytes(out)


def _wrap_chars(text: str, size: float, width: float) -> list[str]:
    """Greedy wrap for Helvetica by an average glyph width (good enough for body text)."""
    limit = max(10, int(width / (size * 0.52)))
    lines, current = [], ""
    for word in text.split():
        if current and len(current) + 1 + len(word) > limit:
            lines.append(current)
            current = word
        else:
            current = f"{current} {word}".strip()
    return [*lines, current] if current else lines


def write_pdf(doc: DocumentSpec, encoded: list[tuple[bytes, str]]) -> tuple[bytes, dict[int, list[dict]]]:
    """The report as a Letter-size PDF; scans become image-only pages. Returns the PDF and, per image
    index, where it was placed ({page, bbox} in points, top-left origin)."""
    pdf = PdfWriter()
    margin, width = 72.0, pdf.width - 144.0
    placements: dict[int, list[dict]] = {}
    state = {"y": 0.0}

    def place(index: int, x: float, top: float, w: float, h: float) -> None:
        pdf.image(encoded[index][0], x, top, w, h)
        placements.setdefault(index, []).append(
            {"page": len(pdf.pages), "bbox": [round(x, 2), round(top, 2), round(x + w, 2), round(top + h, 2)]}
        )

    def start_page() -> None:
        pdf.new_page()
        place(doc.logo, margin, 28, 120, 36)
        pdf.text(pdf.width - margin - 150, 42, f"Quarterly report Q{doc.quarter} {doc.year}", 9)
        state["y"] = 90.0

    def ensure(height: float) -> None:
        if state["y"] + height > pdf.height - margin:
            start_page()

    start_page()
    figure_number = 0
    for block in doc.blocks:
        if block.kind == "h1":
            ensure(40)
            pdf.text(margin, state["y"], block.text, 17, bold=True)
            state["y"] += 34
        elif block.kind == "h2":
            ensure(60)
            place(doc.icon, margin, state["y"] - 2, 16, 16)
            pdf.text(margin + 22, state["y"], block.text, 13, bold=True)
            state["y"] += 24
        elif block.kind == "p":
            for line in _wrap_chars(block.text, 11, width):
                ensure(16)
                pdf.text(margin, state["y"], line, 11)
                state["y"] += 15
            state["y"] += 8
        elif block.kind == "divider":
            ensure(16)
            place(block.image, margin, state["y"], width, 4)
            state["y"] += 16
        elif block.kind == "scan":
            ensure(16)
            pdf.text(margin, state["y"], "The scanned memorandum follows on the next page.", 11)
            pdf.new_page()
            place(block.image, 0, 0, pdf.width, pdf.height)
            state["y"] = math.inf  # the scanned page stays image-only: the next block opens a new page
        else:
            data = encoded[block.image][0]
            with Image.open(io.BytesIO(data)) as img:
                scale = min(width / img.width, 1.0 if img.width < 500 else width / img.width)
                w, h = img.width * scale, img.height * scale
            image = doc.images[block.image]
            ensure(h + (24 if image.caption else 8))
            place(block.image, margin, state["y"], w, h)
            state["y"] += h + 8
            if image.caption:
                figure_number += 1
                pdf.text(margin, state["y"], f"Figure {figure_number}. {image.caption}", 9)
                state["y"] += 18
    if state["y"] != math.inf:
        pdf.text(margin, pdf.height - 48, f"Copyright {doc.year} {doc.company}. All rights reserved.", 8)
    creation = f"{doc.year}{(doc.quarter * 3) % 12 + 1:02d}01093000Z"
    return pdf.to_bytes(doc.title, creation), placements


# --------------------------------------------------------------------------------------------
# Putting a set together.


def build_document(doc: DocumentSpec) -> tuple[bytes, dict]:
    """The document's bytes and its manifest entry (images with expected verdicts and facts)."""
    encoded = [render_image(image) for image in doc.images]
    placements: dict[int, list[dict]] = {}
    if doc.format == "mhtml":
        data = write_mhtml(doc, encoded)
    else:
        data, placements = write_pdf(doc, encoded)
    html_refs = document_html(doc, [f"#{i}" for i in range(len(doc.images))]) if doc.format == "mhtml" else ""
    images = []
    for index, (image, (image_bytes, mime)) in enumerate(zip(doc.images, encoded, strict=True)):
        with Image.open(io.BytesIO(image_bytes)) as img:
            size = img.size
        entry = {
            "name": image.name,
            "kind": image.kind,
            "role": "decoration" if image.kind in DECORATION_KINDS else "content",
            "verdict": image.verdict,
            "degradation": image.degradation,
            "mime": mime,
            "width": size[0],
            "height": size[1],
            "bytes": len(image_bytes),
            "sha256": hashlib.sha256(image_bytes).hexdigest(),
            "alt": image.alt,
            "facts": [fact.fact for fact in image.facts],
        }
        if doc.format == "mhtml":
            entry["url"] = mhtml_urls(doc)[index]
            entry["occurrences"] = html_refs.count(f'src="#{index}"')
        else:
            entry["placements"] = placements.get(index, [])
        images.append(entry)
    manifest = {
        "file": doc.file_name,
        "format": doc.format,
        "company": doc.company,
        "quarter": doc.quarter,
        "year": doc.year,
        "title": doc.title,
        "bytes": len(data),
        "images": images,
        "text_facts": [fact.fact for fact in doc.text_facts],
    }
    return data, manifest


def questions_for(doc: DocumentSpec) -> list[dict]:
    """One question per fact: image facts with the image's kind and degradation, then body-text facts."""
    rows = []
    for image in doc.images:
        for fact in image.facts:
            rows.append(
                {
                    "question": fact.question,
                    "document": doc.file_name,
                    "kind": "image",
                    "fact": fact.fact,
                    "image_kind": image.kind,
                    "degradation": image.degradation,
                    "image": image.name,
                }
            )
    for fact in doc.text_facts:
        rows.append(
            {
                "question": fact.question,
                "document": doc.file_name,
                "kind": "text",
                "fact": fact.fact,
                "image_kind": None,
                "degradation": None,
                "image": None,
            }
        )
    common = {"company": doc.company, "quarter": doc.quarter, "year": doc.year, "format": doc.format}
    return [{**row, **common} for row in rows]


def _build_and_write(args: tuple[DocumentSpec, str]) -> dict:
    doc, directory = args
    data, manifest = build_document(doc)
    (Path(directory) / doc.file_name).write_bytes(data)
    return manifest


def generate(out_dir: Path, docs: int, seed: int, workers: int = 1) -> dict:
    """Write the set under `out_dir` (docs/, questions.jsonl, manifest.json); return the manifest."""
    if docs < 1:
        raise ValueError("--docs must be at least 1")
    specs = build_specs(docs, seed)
    doc_dir = out_dir / "docs"
    doc_dir.mkdir(parents=True, exist_ok=True)
    jobs = [(spec, str(doc_dir)) for spec in specs]
    if workers > 1:
        with ProcessPoolExecutor(workers) as pool:
            documents = list(pool.map(_build_and_write, jobs, chunksize=4))
    else:
        documents = [_build_and_write(job) for job in jobs]
    questions = [row for spec in specs for row in questions_for(spec)]
    for number, row in enumerate(questions, start=1):
        row["id"] = f"q{number:05d}"
    with (out_dir / "questions.jsonl").open("w", encoding="utf-8") as handle:
        for row in questions:
            handle.write(json.dumps(row, ensure_ascii=False) + "\n")
    manifest = {
        "seed": seed,
        "generator": "bench/evalset.py",
        "documents": documents,
        "counts": summarize(documents, questions),
    }
    (out_dir / "manifest.json").write_text(json.dumps(manifest, indent=1), encoding="utf-8")
    return manifest


def summarize(documents: list[dict], questions: list[dict]) -> dict:
    images = [image for doc in documents for image in doc["images"]]
    return {
        "documents": len(documents),
        "documents_by_format": dict(Counter(doc["format"] for doc in documents)),
        "images": len(images),
        "images_by_verdict": dict(Counter(image["verdict"] for image in images)),
        "images_by_kind": dict(sorted(Counter(image["kind"] for image in images).items())),
        "content_images_by_degradation": dict(
            Counter(image["degradation"] for image in images if image["role"] == "content")
        ),
        "questions": len(questions),
        "questions_by_kind": dict(Counter(row["kind"] for row in questions)),
        "image_questions_by_image_kind": dict(
            sorted(Counter(row["image_kind"] for row in questions if row["kind"] == "image").items())
        ),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    gen = commands.add_parser("generate", help="write documents, questions.jsonl and manifest.json")
    gen.add_argument("out_dir", type=Path)
    gen.add_argument("--docs", type=int, default=40)
    gen.add_argument("--seed", type=int, default=7)
    gen.add_argument("--workers", type=int, default=1, help="processes used to render (output is identical)")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    try:
        manifest = generate(args.out_dir, args.docs, args.seed, args.workers)
    except ValueError as error:
        parser.error(str(error))
    counts = manifest["counts"]
    print(json.dumps({**counts, "seconds": round(time.perf_counter() - started, 2)}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
