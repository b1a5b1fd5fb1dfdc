"""Regenerate the bundled demo documents in vision_rag_pipeline/samples/ (used by `vision-rag demo`).

Same renderers and writers as the evaluation set (bench/evalset.py), with fixed, hand-picked facts
so the demo's questions have known answers, most of them only inside images:

    python bench/make_samples.py
"""

from __future__ import annotations

import sys
from pathlib import Path

from evalset import Block, DocumentSpec, Fact, ImageSpec, build_document

SAMPLES = Path(__file__).resolve().parents[1] / "vision_rag_pipeline" / "samples"
COMPANY = "Larkspur Robotics"
COLOUR = "#1f4e79"


def _decoration(slug: str) -> list[ImageSpec]:
    return [
        ImageSpec(
            f"{slug}-logo.png",
            "logo",
            "IGNORE",
            {"company": COMPANY, "colour": COLOUR},
            alt=f"{COMPANY} logo",
        ),
        ImageSpec("section-icon.png", "icon", "IGNORE", {"colour": COLOUR}),
        ImageSpec("divider.png", "divider", "IGNORE", {"colour": COLOUR}),
    ]


def quarterly_report() -> DocumentSpec:
    """MHTML page: body text with its own facts, a revenue bar chart, a logo, dividers and a tracker."""
    chart = ImageSpec(
        "quarterly-revenue-2024.png",
        "bar_outside",
        "VISION",
        {
            "title": "Quarterly revenue 2024 ($M)",
            "categories": ["Q1", "Q2", "Q3"],
            "values": [38.2, 41.7, 45.9],
            "labels": ["38.2", "41.7", "45.9"],
            "inside": False,
        },
        alt="Quarterly revenue chart",
        caption="Revenue by quarter.",
        facts=[
            Fact("45.9", "What was revenue in Q3?"),
            Fact("38.2", "How much revenue did Larkspur make in Q1?"),
        ],
    )
    doc = DocumentSpec(
        file_name="larkspur_q3_2024_report.mhtml",
        format="mhtml",
        company=COMPANY,
        quarter=3,
        year=2024,
        title=f"{COMPANY} Quarterly Report, Q3 2024",
        base_url="https://investors.larkspur-robotics.example/2024/q3/",
        logo=0,
        icon=1,
        divider=2,
        tracker=3,
        images=[*_decoration("larkspur"), ImageSpec("pixel.gif", "tracker", "IGNORE"), chart],
    )
    doc.blocks = [
        Block("h1", doc.title),
        Block(
            "p",
            "Larkspur Robotics builds autonomous carts for warehouses. At the end of the third quarter the "
            "company employed 412 people and opened a new service centre in Lakeport.",
        ),
        Block("divider", image=2),
        Block("h2", "Revenue"),
        Block("p", "Revenue grew every quarter this year; the chart below shows the quarterly figures."),
        Block("figure", image=4),
        Block("divider", image=2),
        Block("h2", "Outlook"),
        Block(
            "p",
            "The board expects demand from grocery distributors to stay strong. A second production line "
            "in Ashford is planned for the spring.",
        ),
    ]
    doc.text_facts = [Fact("412", "How many employees did Larkspur have at the end of Q3?")]
    return doc


def operations_review() -> DocumentSpec:
    """PDF: two pages of text, a KPI table rendered as an image, and a scanned (image-only) memo page."""
    table = ImageSpec(
        "kpi-table.png",
        "table",
        "VISION",
        {
            "title": "KPI summary, Q3 2024",
            "header": ["Metric", "Actual", "Target", "Status"],
            "rows": [
                ["On-time delivery", "96.4%", "95.0%", "Ahead"],
                ["Churn rate", "2.1%", "2.5%", "On track"],
                ["Support tickets", "1,284", "1,400", "On track"],
                ["Net promoter score", "58.3", "55.0", "Ahead"],
            ],
        },
        caption="Key performance indicators against target.",
        facts=[
            Fact("96.4%", "What share of deliveries arrived on time in Q3?"),
            Fact("2.1%", "What was churn?"),
        ],
    )
    scan = ImageSpec(
        "board-memo.jpg",
        "scan",
        "VISION",
        {
            "paragraphs": [
                "MEMORANDUM",
                f"To: Board of Directors, {COMPANY}",
                "From: Office of the Chief Financial Officer",
                "Subject: Resolutions adopted at the Q3 2024 board meeting",
                "At its meeting the Board approved a quarterly dividend of $0.42 per share, payable to "
                "shareholders of record at the end of the following month.",
                "The Board further authorised a share buyback programme of up to $25.5 million over the next "
                "twelve months.",
                "Finally, the Board approved a lease of 48,500 square feet for the new distribution "
                "centre in Lakeport.",
            ]
        },
        render_seed=3,
        facts=[Fact("0.42", "What dividend per share did the board approve?")],
    )
    doc = DocumentSpec(
        file_name="larkspur_q3_2024_operations_review.pdf",
        format="pdf",
        company=COMPANY,
        quarter=3,
        year=2024,
        title=f"{COMPANY} Operations Review, Q3 2024",
        base_url="",
        logo=0,
        icon=1,
        divider=2,
        tracker=None,
        images=[*_decoration("larkspur"), table, scan],
    )
    background = [
        "Larkspur Robotics designs, builds and services autonomous carts that move totes between picking "
        "stations in grocery and apparel warehouses. This review covers the operations of the third quarter.",
        "The fleet in service reached 1,950 carts across 37 customer sites. Average cart availability was "
        "high throughout the quarter, and the field team completed its planned battery replacements.",
        "Warehouse customers asked for faster changeovers between shifts. The software team shipped a "
        "scheduling update that lets site managers plan charging windows around peak picking hours.",
        "Spare-parts stock was rebalanced between the Ashford and Lakeport depots so that every site can be "
        "reached within one working day.",
    ]
    people = [
        "The field service organisation grew by eleven technicians, most of them hired in Lakeport to "
        "support the new service centre. New hires complete a four-week certification before working "
        "on live sites.",
        "Safety remained the first priority. Every site passed its quarterly inspection, and the cart "
        "firmware now slows automatically when a person is detected within two metres.",
        "Two customers renewed their contracts early and asked for additional carts for the holiday peak. "
        "Deliveries for those orders are scheduled for the first weeks of the next quarter.",
        "Training material for site managers was rewritten in plain language and translated into Spanish and "
        "Polish, following requests from customers with multilingual teams.",
        "The procurement team agreed longer-term prices for motors and battery cells, which reduces the "
        "exposure of the bill of materials to short-term price swings.",
    ]
    doc.blocks = [
        Block("h1", doc.title),
        *(Block("p", text) for text in background),
        Block("divider", image=2),
        Block("h2", "Service quality"),
        Block("p", "Our key performance indicators compared with target are listed in the table below."),
        Block("figure", image=3),
        Block("h2", "People and sites"),
        *(Block("p", text) for text in people),
        Block("h2", "Board matters"),
        Block("p", "The board memorandum for the quarter is attached as a scanned copy."),
        Block("scan", image=4),
    ]
    doc.text_facts = [Fact("1,950", "How many carts were in service?")]
    return doc


def main() -> int:
    SAMPLES.mkdir(parents=True, exist_ok=True)
    for spec in (quarterly_report(), operations_review()):
        data, manifest = build_document(spec)
        (SAMPLES / spec.file_name).write_bytes(data)
        sizes = ", ".join(f"{image['name']} {image['bytes'] // 1024} KB" for image in manifest["images"])
        print(f"{spec.file_name}: {len(data) // 1024} KB ({sizes})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
