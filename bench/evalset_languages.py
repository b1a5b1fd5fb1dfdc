"""Generate Chinese and Russian reports whose facts live only inside images, with questions in the
same language: the multilingual counterpart of bench/evalset.py, in the same layout, so
bench/eval_retrieval.py scores it.

Per company and language: an MHTML report (a slide and a bar chart, captions and body text in the
language) and a scanned-looking one-page PDF (a photographed memo: grey paper, a slight tilt,
noise). Every number appears once in the whole set. Rendering needs fonts-noto-cjk (Chinese) and
DejaVu Sans (Russian), both installed by scripts/setup.sh.

    python bench/evalset_languages.py generate OUT_DIR --companies 8 --seed 7
    python bench/eval_retrieval.py OUT_DIR --k 5 --no-classifier

Default settings read it (OCR languages `auto`). `OUT_DIR/config.json` is the default config with
the OCR languages listed instead (eng, chi_sim, rus): run with `VISION_RAG_CONFIG=OUT_DIR/config.json`
to compare.
"""

from __future__ import annotations

import argparse
import io
import json
import random
import sys
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from evalset import saved_page  # bench/ is on the path: scripts run from it, tests add it
from PIL import Image, ImageDraw, ImageFilter, ImageFont

FONTS = {
    "zh": "/usr/share/fonts/opentype/noto/NotoSansCJK-Regular.ttc",
    "ru": "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
}
OCR_LANGUAGES = ["eng", "chi_sim", "rus"]

COMPANIES = {
    "zh": ["北辰科技", "华岳能源", "青松物流", "金桥制造", "星河医药", "海川食品", "云杉软件", "红枫零售"],
    "ru": [
        "Северный ветер",
        "Уральские машины",
        "Волжская энергия",
        "Байкал Логистик",
        "Сибирский кедр",
        "Балтийские верфи",
        "Алтай Фарм",
        "Невский текстиль",
    ],
}
# (metric, unit, low, high, decimals); Russian questions ask in the genitive (GENITIVE), as people do
METRICS = {
    "zh": [
        ("营业收入", "亿元", 10, 99, 1),
        ("净利润", "亿元", 1, 9, 2),
        ("毛利率", "%", 20, 60, 1),
        ("客户满意度", "分", 70, 99, 1),
        ("研发投入", "亿元", 1, 9, 2),
        ("员工人数", "人", 1200, 9800, 0),
        ("订单量", "万单", 100, 999, 0),
        ("市场份额", "%", 3, 30, 1),
    ],
    "ru": [
        ("Выручка", "млн руб.", 100, 999, 1),
        ("Чистая прибыль", "млн руб.", 10, 99, 1),
        ("Валовая маржа", "%", 20, 60, 1),
        ("Удовлетворённость клиентов", "баллов", 70, 99, 1),
        ("Расходы на НИОКР", "млн руб.", 10, 99, 2),
        ("Численность персонала", "человек", 1200, 9800, 0),
        ("Количество заказов", "тыс.", 100, 999, 0),
        ("Доля рынка", "%", 3, 30, 1),
    ],
}
GENITIVE = {
    "Выручка": "выручки",
    "Чистая прибыль": "чистой прибыли",
    "Валовая маржа": "валовой маржи",
    "Удовлетворённость клиентов": "удовлетворённости клиентов",
    "Расходы на НИОКР": "расходов на НИОКР",
    "Численность персонала": "численности персонала",
    "Количество заказов": "количества заказов",
    "Доля рынка": "доли рынка",
}
REGIONS = {"zh": ["华东", "华南", "华北", "西部"], "ru": ["Центр", "Север", "Юг", "Урал"]}
TEXT = {
    "zh": {
        "title": "{company}{year}年第{quarter}季度经营报告",
        "slide_title": "{year}年第{quarter}季度经营概况",
        "chart_title": "{year}年第{quarter}季度各地区销售额（百万元）",
        "scan_title": "{company}{year}年第{quarter}季度内部备忘录",
        "body": "本报告介绍{company}{year}年第{quarter}季度的经营情况、各地区销售和管理层意见。",
        "slide_caption": "图1. 经营概况",
        "chart_caption": "图2. 各地区销售额",
        "scan_line": "本季度{metric}为{value}{unit}。",
        "metric_question": "{company}{year}年第{quarter}季度的{metric}是多少？",
        "region_question": "{company}{year}年第{quarter}季度{region}地区的销售额是多少？",
    },
    "ru": {
        "title": "{company}: отчёт о деятельности за {quarter} квартал {year} года",
        "slide_title": "Итоги {quarter} квартала {year} года",
        "chart_title": "Продажи по регионам, {quarter} кв. {year}, млн руб.",
        "scan_title": "{company}: служебная записка за {quarter} кв. {year} г.",
        "body": "В отчёте описаны результаты компании «{company}» за {quarter} квартал {year} года, "
        "продажи по регионам и комментарии руководства.",
        "slide_caption": "Рис. 1. Основные показатели",
        "chart_caption": "Рис. 2. Продажи по регионам",
        "scan_line": "{metric} за квартал — {value} {unit}",
        "metric_question": "Каким было значение {metric_genitive} компании «{company}» за {quarter} квартал {year} года?",
        "region_question": "Каковы продажи компании «{company}» в регионе {region} за {quarter} квартал {year} года?",
    },
}


@dataclass
class Report:
    language: str
    company: str
    year: int
    quarter: int
    slide: list[tuple[str, str, str]] = field(default_factory=list)  # metric, value, unit
    chart: list[tuple[str, str]] = field(default_factory=list)  # region, value
    scan: list[tuple[str, str, str]] = field(default_factory=list)


class Numbers:
    """Numbers never used before in the set, written the language's way (decimal comma in Russian)."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.used: set[str] = set()

    def draw(self, low: float, high: float, decimals: int, language: str) -> str:
        while True:
            value = f"{self.rng.uniform(low, high):.{decimals}f}"
            if value not in self.used and not value.endswith("0"):
                self.used.add(value)
                return value.replace(".", ",") if language == "ru" else value


def plan(companies: int, seed: int) -> list[Report]:
    rng = random.Random(seed)
    numbers = Numbers(rng)
    reports = []
    for language in ("zh", "ru"):
        for company in COMPANIES[language][:companies]:
            report = Report(language, company, rng.choice([2023, 2024]), rng.randint(1, 4))
            metrics = rng.sample(METRICS[language], 7)
            report.slide = [(m, numbers.draw(lo, hi, d, language), u) for m, u, lo, hi, d in metrics[:4]]
            report.scan = [(m, numbers.draw(lo, hi, d, language), u) for m, u, lo, hi, d in metrics[4:]]
            report.chart = [(region, numbers.draw(20, 480, 1, language)) for region in REGIONS[language]]
            reports.append(report)
    return reports


def _font(language: str, size: int) -> ImageFont.FreeTypeFont:
    return ImageFont.truetype(FONTS[language], size)


def _fitting_font(
    draw: ImageDraw.ImageDraw, text: str, language: str, size: int, width: int
) -> ImageFont.FreeTypeFont:
    """The font at `size`, or smaller so the line fits in `width` px (a line running off the page
    would be lost to OCR, not misread)."""
    while size > 12 and draw.textlength(text, font=_font(language, size)) > width:
        size -= 2
    return _font(language, size)


def render_slide(report: Report) -> Image.Image:
    """A presentation slide: a coloured title band and one bullet per metric."""
    text = TEXT[report.language]
    img = Image.new("RGB", (1280, 720), "#f7f7f2")
    draw = ImageDraw.Draw(img)
    draw.rectangle((0, 0, 1280, 120), fill="#1f4e79")
    title = text["slide_title"].format(year=report.year, quarter=report.quarter)
    draw.text((60, 34), title, font=_font(report.language, 46), fill="white")
    for row, (metric, value, unit) in enumerate(report.slide):
        y = 190 + row * 120
        draw.ellipse((70, y + 18, 90, y + 38), fill="#c55a11")
        draw.text(
            (120, y),
            f"{metric}：{value}{unit}" if report.language == "zh" else f"{metric}: {value} {unit}",
            font=_font(report.language, 44),
            fill="#222222",
        )
    return img


def render_chart(report: Report) -> Image.Image:
    """A bar chart: region names under the bars, values above them."""
    text = TEXT[report.language]
    img = Image.new("RGB", (900, 600), "white")
    draw = ImageDraw.Draw(img)
    draw.text(
        (40, 20),
        text["chart_title"].format(year=report.year, quarter=report.quarter),
        font=_font(report.language, 28),
        fill="#111111",
    )
    top = max(float(v.replace(",", ".")) for _, v in report.chart)
    draw.line((80, 520, 860, 520), fill="#444444", width=2)
    for i, (region, value) in enumerate(report.chart):
        height = 380 * float(value.replace(",", ".")) / top
        left = 120 + i * 190
        draw.rectangle(
            (left, 520 - height, left + 110, 520), fill=("#4472c4", "#ed7d31", "#70ad47", "#ffc000")[i]
        )
        draw.text((left + 5, 520 - height - 40), value, font=_font(report.language, 26), fill="#111111")
        draw.text((left + 10, 535), region, font=_font(report.language, 26), fill="#111111")
    return img


def render_scan(report: Report, rng: random.Random) -> Image.Image:
    """A memo printed, photographed and saved as a page image: grey paper, tilt, noise, blur."""
    text = TEXT[report.language]
    img = Image.new("L", (1240, 1754), 236)
    draw = ImageDraw.Draw(img)
    title = text["scan_title"].format(company=report.company, year=report.year, quarter=report.quarter)
    draw.text((110, 140), title, font=_fitting_font(draw, title, report.language, 44, 1020), fill=30)
    y = 280
    for metric, value, unit in report.scan:
        line = text["scan_line"].format(metric=metric, value=value, unit=unit)
        draw.text((110, y), line, font=_fitting_font(draw, line, report.language, 34, 1020), fill=40)
        y += 90
    img = img.rotate(rng.uniform(-1.5, 1.5), resample=Image.Resampling.BICUBIC, fillcolor=236)
    noise = np.random.default_rng(rng.randint(0, 2**31)).normal(0, 12, (img.height, img.width))
    pixels = np.clip(np.asarray(img, dtype=np.float32) + noise, 0, 255).astype(np.uint8)
    return Image.fromarray(pixels).filter(ImageFilter.GaussianBlur(0.8))


def _png(img: Image.Image) -> bytes:
    buffer = io.BytesIO()
    img.save(buffer, "PNG")
    return buffer.getvalue()


def write_mhtml(report: Report, slide: bytes, chart: bytes) -> bytes:
    """A Chrome-style "Save as MHTML" archive: the page and its two images."""
    text = TEXT[report.language]
    fmt = {"company": report.company, "year": report.year, "quarter": report.quarter}
    base = f"https://reports.example.com/{report.language}/{zlib.crc32(report.company.encode()):08x}/"
    urls = [base + "slide.png", base + "chart.png"]
    page_html = (
        f'<!DOCTYPE html><html lang="{report.language}"><head><meta charset="utf-8">'
        f"<title>{text['title'].format(**fmt)}</title></head><body>"
        f"<h1>{text['title'].format(**fmt)}</h1><p>{text['body'].format(**fmt)}</p>"
        f'<figure><img src="{urls[0]}" alt="{text["slide_caption"]}"><figcaption>{text["slide_caption"]}</figcaption></figure>'
        f'<figure><img src="{urls[1]}" alt="{text["chart_caption"]}"><figcaption>{text["chart_caption"]}</figcaption></figure>'
        "</body></html>"
    )
    boundary = "----MultipartBoundary--languages----"
    pictures = [(urls[0], slide, "image/png"), (urls[1], chart, "image/png")]
    return saved_page(base, text["title"].format(**fmt), boundary, page_html, pictures)


def questions_for(report: Report, mhtml: str, pdf: str) -> list[dict]:
    text = TEXT[report.language]
    fmt = {"company": report.company, "year": report.year, "quarter": report.quarter}
    rows = []
    for kind, document, facts in (("slide", mhtml, report.slide), ("scan", pdf, report.scan)):
        for metric, value, _ in facts:
            question = text["metric_question"].format(
                metric=metric, metric_genitive=GENITIVE.get(metric), **fmt
            )
            rows.append({"question": question, "fact": value, "document": document, "image_kind": kind})
    for region, value in report.chart:
        question = text["region_question"].format(region=region, **fmt)
        rows.append({"question": question, "fact": value, "document": mhtml, "image_kind": "bar_chart"})
    # eval_retrieval groups by image kind and by "degradation": here that is the language
    return [
        {
            **row,
            "kind": "image",
            "image_kind": f"{report.language} {row['image_kind']}",
            "degradation": report.language,
            "language": report.language,
        }
        for row in rows
    ]


def generate(out_dir: Path, companies: int, seed: int) -> dict:
    missing = [path for path in FONTS.values() if not Path(path).exists()]
    if missing:
        raise SystemExit(f"fonts missing: {missing} (scripts/setup.sh installs fonts-noto-cjk)")
    docs = out_dir / "docs"
    docs.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed + 1)
    questions: list[dict] = []
    files: list[dict] = []
    for number, report in enumerate(plan(companies, seed)):
        stem = f"{report.language}_{number:02d}"
        mhtml, pdf = f"{stem}_report.mhtml", f"{stem}_memo.pdf"
        (docs / mhtml).write_bytes(
            write_mhtml(report, _png(render_slide(report)), _png(render_chart(report)))
        )
        render_scan(report, rng).save(docs / pdf, "PDF", resolution=150.0)
        questions.extend(questions_for(report, mhtml, pdf))
        files += [{"file": mhtml, "format": "mhtml"}, {"file": pdf, "format": "pdf"}]
    with (out_dir / "questions.jsonl").open("w", encoding="utf-8") as out:
        for row in questions:
            out.write(json.dumps(row, ensure_ascii=False) + "\n")
    (out_dir / "manifest.json").write_text(json.dumps({"documents": files}, indent=1), encoding="utf-8")
    config = {"media_enrichment": {"ocr": {"languages": OCR_LANGUAGES}}}
    (out_dir / "config.json").write_text(json.dumps(config, indent=1), encoding="utf-8")
    return {"documents": len(list(docs.iterdir())), "questions": len(questions)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    gen = sub.add_parser("generate")
    gen.add_argument("out_dir", type=Path)
    gen.add_argument("--companies", type=int, default=8, help="reports per language (at most 8)")
    gen.add_argument("--seed", type=int, default=7)
    args = parser.parse_args(argv)
    print(json.dumps(generate(args.out_dir, min(args.companies, 8), args.seed), ensure_ascii=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
