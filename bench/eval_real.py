"""Retrieval quality on real documents, beside a naive text-layer baseline.

Two sets, both from the reference corpus (`../shared/corpus`, skipped cleanly when absent):

- `qa/mmlongbench`: 7 real PDFs (two image-only slide decks) and third-party questions with
  evidence pages and evidence types (chart, figure, table, text, layout); the "Not answerable"
  ones are left out.
- `bench/real_text_questions.json`: questions written by hand from the text layer of real
  born-digital PDFs (the IBM Redpaper, the ACL paper, the Pew report, the annual report), each
  with the page(s) that answer it and an answer string on that page.

Every question is asked within its own document. Page recall@k: an evidence page is among the
first k distinct pages of the ranked hits. Answer recall@k: the answer string (every item of a
list answer) is in the text of the top k hits; counted only for answers read off the page
(formats Float, Str, List), not counts or yes/no a reader works out. The baseline ranks each
page of the document by its PDF text layer (pypdfium2): BM25 and MiniLM cosine over the whole
page text, fused by reciprocal rank (k=60), the same k; its answer recall reads the top k pages.

    python bench/eval_real.py                          # ingest into a fresh home, then ask
    python bench/eval_real.py --home /tmp/real_home    # keep the home ...
    python bench/eval_real.py --home /tmp/real_home --skip-ingest   # ... and re-ask it
"""

from __future__ import annotations

import argparse
import ast
import json
import math
import re
import sys
from collections import Counter, defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from eval_retrieval import contains_fact, hit_dict, ingest, stop_embedded_postgres, use_home  # noqa: E402

# ../shared/corpus beside the checkout (or beside any folder above it, for a worktree)
DEFAULT_CORPUS = next(
    (
        folder / "shared" / "corpus"
        for folder in Path(__file__).resolve().parents
        if (folder / "shared" / "corpus").is_dir()
    ),
    Path(__file__).resolve().parents[2] / "shared" / "corpus",
)
TEXT_QUESTIONS = Path(__file__).resolve().parent / "real_text_questions.json"
EVIDENCE_TYPES = {
    "Chart": "chart",
    "Figure": "figure",
    "Table": "table",
    "Pure-text (Plain-text)": "text",
    "Generalized-text (Layout)": "layout",
}
READ_OFF_FORMATS = ("Float", "Str", "List")
HIT_POOL = 40  # chunks fetched per question: enough to fill k distinct pages
RRF_K = 60


def mmlongbench_questions(corpus: Path) -> list[dict]:
    """The answerable mmlongbench questions: document, question, evidence pages and types, answers."""
    folder = corpus / "qa" / "mmlongbench"
    questions = []
    for row in json.loads((folder / "samples_subset.json").read_text(encoding="utf-8")):
        if row["answer"] == "Not answerable":
            continue
        answer = row["answer"]
        parts = ast.literal_eval(answer) if row["answer_format"] == "List" else [answer]
        questions.append(
            {
                "set": "mmlongbench",
                "document": str(folder / row["doc_id"]),
                "question": row["question"],
                "pages": ast.literal_eval(row["evidence_pages"]),
                "types": sorted({EVIDENCE_TYPES[t] for t in ast.literal_eval(row["evidence_sources"])}),
                "answers": [str(part).strip() for part in parts]
                if row["answer_format"] in READ_OFF_FORMATS
                else None,
            }
        )
    return questions


def text_questions(corpus: Path) -> list[dict]:
    """The hand-written text-layer questions (bench/real_text_questions.json)."""
    rows = json.loads(TEXT_QUESTIONS.read_text(encoding="utf-8"))["questions"]
    return [
        {
            "set": "text",
            "document": str(corpus / row["document"]),
            "question": row["question"],
            "pages": row["pages"],
            "types": ["text"],
            "answers": [row["answer"]],
        }
        for row in rows
    ]


def has_answer(texts: list[str], answers: list[str]) -> bool:
    joined = "\n".join(texts)
    return all(contains_fact(joined, answer) for answer in answers)


def distinct_pages(pages: list[int | None]) -> list[int]:
    return [page for page in dict.fromkeys(pages) if page is not None]


def ask_pipeline(questions: list[dict], k: int, mode: str) -> list[dict]:
    """Rank pages and excerpts with `vision_rag_pipeline.query.search`, within each question's document."""
    from vision_rag_pipeline.query import search

    rows = []
    for question in questions:
        hits = [
            hit_dict(hit)
            for hit in search(
                text=question["question"], k=HIT_POOL, mode=mode, document_ids=[question["document"]]
            )
        ]
        rows.append(
            {
                "pages": distinct_pages([hit["page"] for hit in hits]),
                "top_texts": [hit["text"] or "" for hit in hits[:k]],
            }
        )
    return rows


def page_texts(pdf_path: str) -> list[str]:
    import pypdfium2 as pdfium

    pdf = pdfium.PdfDocument(pdf_path)
    try:
        return [pdf[index].get_textpage().get_text_range() for index in range(len(pdf))]
    finally:
        pdf.close()


def _tokens(text: str) -> list[str]:
    return re.findall(r"\w+", text.lower())


def bm25_scores(query: str, documents: list[list[str]], k1: float = 1.2, b: float = 0.75) -> list[float]:
    """Okapi BM25 of one query against tokenized documents (idf with the usual +1 smoothing)."""
    count = len(documents)
    average = sum(map(len, documents)) / count if count else 0.0
    frequency = Counter(term for document in documents for term in set(document))
    scores = []
    for document in documents:
        terms = Counter(document)
        score = 0.0
        for term in set(_tokens(query)):
            if term not in terms:
                continue
            idf = math.log(1 + (count - frequency[term] + 0.5) / (frequency[term] + 0.5))
            tf = terms[term]
            score += idf * tf * (k1 + 1) / (tf + k1 * (1 - b + b * len(document) / (average or 1)))
        scores.append(score)
    return scores


def ask_baseline(questions: list[dict], k: int) -> list[dict]:
    """Rank each document's pages by BM25 + MiniLM over their text layer, fused by reciprocal rank."""
    import numpy as np

    from vision_rag_pipeline.core.config import config_in_effect
    from vision_rag_pipeline.embeddings.encoder import encode

    model = config_in_effect().config.embedding.model
    pages_of: dict[str, tuple[list[str], list[list[str]], np.ndarray]] = {}
    rows = []
    for question in questions:
        if question["document"] not in pages_of:
            texts = page_texts(question["document"])
            pages_of[question["document"]] = (texts, [_tokens(t) for t in texts], encode(texts, model))
        texts, tokenized, vectors = pages_of[question["document"]]
        lexical = bm25_scores(question["question"], tokenized)
        dense = vectors @ encode([question["question"]], model)[0]
        fused = np.zeros(len(texts))
        for scores in (lexical, dense):
            for rank, index in enumerate(np.argsort(-np.asarray(scores), kind="stable"), start=1):
                fused[index] += 1 / (RRF_K + rank)
        order = [int(i) + 1 for i in np.argsort(-fused, kind="stable")]
        rows.append({"pages": order, "top_texts": [texts[page - 1] for page in order[:k]]})
    return rows


def score(questions: list[dict], rows: list[dict], k: int) -> dict:
    """Page recall@1 and @k, and answer recall@k over the questions with a read-off answer."""
    found_at = [
        next((rank for rank, page in enumerate(row["pages"], 1) if page in q["pages"]), None)
        for q, row in zip(questions, rows, strict=True)
    ]
    answerable = [(q, row) for q, row in zip(questions, rows, strict=True) if q["answers"]]
    return {
        "n": len(questions),
        "page R@1": sum(rank == 1 for rank in found_at) / len(questions),
        f"page R@{k}": sum(rank is not None and rank <= k for rank in found_at) / len(questions),
        "answers": len(answerable),
        f"answer R@{k}": (
            sum(has_answer(row["top_texts"], q["answers"]) for q, row in answerable) / len(answerable)
            if answerable
            else None
        ),
    }


def grouped(questions: list[dict], ours: list[dict], baseline: list[dict], k: int) -> dict[str, dict]:
    """Scores for every set and evidence type (a question counts under each of its types)."""
    groups: dict[str, list[int]] = defaultdict(list)
    for index, question in enumerate(questions):
        groups[question["set"]].append(index)
        if question["set"] == "mmlongbench":
            for kind in question["types"]:
                groups[f"mmlongbench {kind}"].append(index)
    table = {}
    for name, indexes in groups.items():
        picked = [questions[i] for i in indexes]
        table[name] = {
            "ours": score(picked, [ours[i] for i in indexes], k),
            "baseline": score(picked, [baseline[i] for i in indexes], k),
        }
    return table


def markdown(table: dict[str, dict], k: int) -> str:
    def cell(value: float | None) -> str:
        return "–" if value is None else f"{value:.2f}"

    lines = [
        f"| set | n | ours page R@1 / R@{k} | text-layer baseline page R@1 / R@{k} "
        f"| ours answer R@{k} | baseline answer R@{k} (n) |",
        "|---|---:|---|---|---:|---:|",
    ]
    order = sorted(table, key=lambda name: (name.split()[0] != "mmlongbench", name.count(" "), name))
    for name in order:
        ours, base = table[name]["ours"], table[name]["baseline"]
        lines.append(
            f"| {name} | {ours['n']} | {cell(ours['page R@1'])} / {cell(ours[f'page R@{k}'])} "
            f"| {cell(base['page R@1'])} / {cell(base[f'page R@{k}'])} | {cell(ours[f'answer R@{k}'])} "
            f"| {cell(base[f'answer R@{k}'])} ({ours['answers']}) |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", type=Path, default=DEFAULT_CORPUS, help="the reference corpus folder")
    parser.add_argument("--k", type=int, default=5)
    parser.add_argument("--mode", choices=("hybrid", "vector", "lexical"), default="hybrid")
    parser.add_argument("--home", type=Path, help="VISION_RAG_HOME to keep (default: a fresh one under /tmp)")
    parser.add_argument("--skip-ingest", action="store_true", help="query what --home already holds")
    parser.add_argument(
        "--json", type=Path, metavar="FILE", help="write the scores and every question's ranks"
    )
    args = parser.parse_args(argv)
    if args.skip_ingest and not args.home:
        parser.error("--skip-ingest needs --home")
    if not (args.corpus / "qa" / "mmlongbench" / "samples_subset.json").is_file():
        print(f"skipped: no reference corpus at {args.corpus}")
        return 0
    questions = mmlongbench_questions(args.corpus) + text_questions(args.corpus)
    documents = sorted({q["document"] for q in questions})

    owns_home = args.home is None
    home = use_home(args.home or Path("/tmp/vision_rag_eval_real"), fresh=not args.skip_ingest)
    report: dict = {"home": str(home), "k": args.k, "mode": args.mode}
    try:
        if not args.skip_ingest:
            print(f"ingesting {len(documents)} documents into {home} ...", file=sys.stderr)
            report["ingest"] = ingest([Path(d) for d in documents], home)
            if report["ingest"].get("failed"):
                print(f"failed: {report['ingest']['failed']}", file=sys.stderr)
        print(f"asking {len(questions)} questions ...", file=sys.stderr)
        ours = ask_pipeline(questions, args.k, args.mode)
    finally:
        if owns_home:
            stop_embedded_postgres(home)
    baseline = ask_baseline(questions, args.k)
    table = grouped(questions, ours, baseline, args.k)
    report["scores"] = table
    print(markdown(table, args.k))
    if args.json:
        report["questions"] = [
            {**q, "ours_pages": o["pages"][: args.k], "baseline_pages": b["pages"][: args.k]}
            for q, o, b in zip(questions, ours, baseline, strict=True)
        ]
        args.json.write_text(json.dumps(report, indent=1, ensure_ascii=False), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
