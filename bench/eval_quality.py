"""Retrieval quality in one command, on every yardstick at once, beside a naive page baseline.

The real documents decide; the generated sets are checks beside them:

- **dev**: `../shared/corpus/qa/mmlongbench_dev`, 43 real PDFs (994 pages) and 244 third-party
  questions with evidence pages and answer terms (its README). The main yardstick.
- **seven**: the 7 PDFs of `qa/mmlongbench` and their answerable questions.
- **text**: `bench/real_text_questions.json`, questions on real born-digital PDFs.
- **generated**: `bench/evalset.py` (seed 7, 40 reports of 10 companies x 4 quarters).
- **series**: `bench/evalset_series.py`, one company's four quarterly reports on one template,
  questions naming a quarter and a site.

The real sets' documents go into one index (the whole index); each question is asked within its
own document and across the whole index. Every figure of ours is out of fold (bench/fit_ranker.py):
the ranker that orders a question's candidates was fitted on the other folds' documents only, with
grouped k-fold over the documents of every set at once. Page recall@k is read two ways: an evidence
page (of the right document) among the first k distinct pages of the hits, and among the pages of
the k hits themselves (what a caller asking for k results gets). Answer recall@k: every answer term
is in the text of the first k hits (dev: the set's `answer_terms` of its short answers; seven and text: read-off
answers). Rows split the dev set by where its answer is (`text`: in the evidence pages' text layer;
`image`: only in pixels, or worked out) and by the benchmark's evidence source. The baseline ranks
whole pages by their PDF text layer: BM25 and MiniLM cosine, fused by reciprocal rank (k=60),
within the document and across every page of the index, computed in the same run.

    python bench/eval_quality.py                                  # ingest everything, then ask
    python bench/eval_quality.py --out /tmp/q --skip-ingest       # ask what --out already holds
    python bench/eval_quality.py --sets dev,seven --json /tmp/q.json
    python bench/eval_quality.py --out /tmp/q --skip-ingest --write-ranker  # refit the shipped weights
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import pickle
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from eval_real import (  # noqa: E402
    DEFAULT_CORPUS,
    RRF_K,
    _tokens,
    bm25_scores,
    distinct_pages,
    has_answer,
    mmlongbench_questions,
    page_texts,
    text_questions,
)
from eval_retrieval import (  # noqa: E402
    answer_rank,
    contains_fact,
    grouped_scores,
    hit_dict,
    ingest,
    stop_embedded_postgres,
    use_home,
)
from fit_ranker import FOLDS, Example, collect, out_of_fold, write_shipped  # noqa: E402

from vision_rag_pipeline.core.config import RetrievalConfig  # noqa: E402

REAL_SETS = ("dev", "seven", "text")
GENERATED_SETS = ("generated", "series")
HIT_POOL = 40  # chunks fetched per question: enough to fill k distinct pages


def dev_questions(corpus: Path) -> list[dict]:
    """The dev set's questions in the shape the other real sets use."""
    folder = corpus / "qa" / "mmlongbench_dev"
    rows = json.loads((folder / "questions.json").read_text(encoding="utf-8"))
    return [
        {
            "set": "dev",
            "id": row["id"],
            "document": str(folder / "docs" / row["doc"]),
            "question": row["question"],
            "pages": row["pages"],
            "where": row["where"],
            "sources": row["where_source"],
            "answers": row["answer_terms"] if row["short_answer"] else None,
        }
        for row in rows
    ]


def real_questions(corpus: Path, sets: list[str]) -> list[dict]:
    questions: list[dict] = []
    if "dev" in sets:
        questions += dev_questions(corpus)
    if "seven" in sets:
        questions += [
            {**q, "set": "seven", "sources": q["types"], "where": None} for q in mmlongbench_questions(corpus)
        ]
    if "text" in sets:
        questions += [{**q, "sources": [], "where": "text"} for q in text_questions(corpus)]
    return questions


# --- ours ------------------------------------------------------------------------------------------


def real_examples(questions: list[dict], mode: str) -> list[Example]:
    """Each question's candidates within its document and across the whole index, labelled by its
    evidence pages."""
    examples = []
    for index, question in enumerate(questions):
        name, pages = Path(question["document"]).name, set(question["pages"])

        def answers(chunk, name=name, pages=pages) -> bool:
            return Path(str(chunk.metadata.get("source", ""))).name == name and chunk.page in pages

        for context, document in (("within", question["document"]), ("whole", None)):
            key = f"{question['set']}:{index}:{context}"
            examples.append(collect(key, name, question["question"], document, answers, mode))
    return examples


def hits_of(example: Example, scores: np.ndarray | None, k: int, unit: str) -> list[dict]:
    """The example's hits of `unit`, ranked by `scores` (out of fold) or by the shipped ranker (None)."""
    from vision_rag_pipeline.query.ranker import load_ranker
    from vision_rag_pipeline.query.search import Scored, ranked

    scored = example.scored
    if scores is None:
        scores = load_ranker().score(scored.features.matrix)
    return [hit_dict(hit) for hit in ranked(Scored(scored.pool, scored.features, scores), k, unit)]


def real_rows(
    questions: list[dict], examples: list[Example], scores: dict | None, k: int, unit: str
) -> list[dict]:
    """Per question: its distinct pages within the document, the pages and texts of its first k hits
    there, and the (document, page) pairs across the index, each from out-of-fold scores."""
    by_key = {example.key: example for example in examples}
    rows = []
    for index, question in enumerate(questions):
        within, whole = (by_key[f"{question['set']}:{index}:{c}"] for c in ("within", "whole"))
        within_hits = hits_of(within, scores and scores[within.key], HIT_POOL, unit)
        whole_hits = hits_of(whole, scores and scores[whole.key], HIT_POOL, unit)
        rows.append(
            {
                "pages": distinct_pages([hit["page"] for hit in within_hits]),
                "hit_pages": [hit["page"] for hit in within_hits[:k]],
                "texts": [hit["text"] or "" for hit in within_hits[:k]],
                "index_pages": list(dict.fromkeys((hit["document"], hit["page"]) for hit in whole_hits)),
                "index_hit_pages": [(hit["document"], hit["page"]) for hit in whole_hits[:k]],
                "repeats": repeats(within_hits[:k]),
            }
        )
    return rows


def repeats(hits: list[dict]) -> dict[str, int]:
    """How many of the hits repeat a picture, or a page, an earlier hit already holds (a page hit
    holds the pictures of its passages)."""
    held = [[hit, *hit.get("passages", [])] for hit in hits]
    pictures = list(
        {(part["document"], part["image"]) for part in parts if part.get("image")} for parts in held
    )
    pictures = [picture for found in pictures for picture in found]
    pages = [(hit["document"], hit["page"]) for hit in hits]
    return {"picture": len(pictures) - len(set(pictures)), "page": len(pages) - len(set(pages))}


# --- the naive page baseline -------------------------------------------------------------------


class PageBaseline:
    """Every page of every document as one unit: its PDF text layer, BM25 and MiniLM over it."""

    def __init__(self, documents: list[str], cache: Path) -> None:
        from vision_rag_pipeline.core.config import config_in_effect
        from vision_rag_pipeline.embeddings.encoder import encode

        self.model = config_in_effect().config.embedding.model
        self.encode = encode
        self.units: list[tuple[str, int]] = []
        self.texts: list[str] = []
        vectors = []
        cache.mkdir(parents=True, exist_ok=True)
        for document in documents:
            texts = page_texts(document)
            digest = hashlib.sha256(Path(document).read_bytes()).hexdigest()[:16]
            stored = cache / f"{digest}-{self.model.replace('/', '_')}.npy"
            if stored.is_file():
                page_vectors = np.load(stored)
            else:
                page_vectors = encode(texts, self.model)
                np.save(stored, page_vectors)
            self.units += [(document, page) for page in range(1, len(texts) + 1)]
            self.texts += texts
            vectors.append(page_vectors)
        self.vectors = np.concatenate(vectors)
        self.tokens = [_tokens(text) for text in self.texts]

    def rank(self, question: str, document: str | None) -> list[int]:
        """Unit indexes, best first, over one document's pages or over every page."""
        chosen = [i for i, (doc, _) in enumerate(self.units) if document is None or doc == document]
        lexical = np.asarray(bm25_scores(question, [self.tokens[i] for i in chosen]))
        dense = self.vectors[chosen] @ self.encode([question], self.model)[0]
        fused = np.zeros(len(chosen))
        for scores in (lexical, dense):
            for rank, position in enumerate(np.argsort(-scores, kind="stable"), start=1):
                fused[position] += 1 / (RRF_K + rank)
        return [chosen[int(i)] for i in np.argsort(-fused, kind="stable")]

    def ask(self, questions: list[dict], k: int) -> list[dict]:
        rows = []
        for question in questions:
            within = self.rank(question["question"], question["document"])
            whole = self.rank(question["question"], None)
            rows.append(
                {
                    "pages": [self.units[i][1] for i in within],
                    "hit_pages": [self.units[i][1] for i in within[:k]],
                    "texts": [self.texts[i] for i in within[:k]],
                    "index_pages": [self.units[i] for i in whole[:HIT_POOL]],
                    "index_hit_pages": [self.units[i] for i in whole[:k]],
                }
            )
        return rows


# --- scores ------------------------------------------------------------------------------------


def _found_at(pages: list, wanted: set) -> int | None:
    return next((rank for rank, page in enumerate(pages, 1) if page in wanted), None)


def score(questions: list[dict], rows: list[dict], k: int) -> dict:
    """Page recall@1 and @k within the document and across the index, each read off the first k
    distinct pages and off the k hits themselves; answer recall@k."""

    def named(pairs: list) -> list:
        return [(Path(str(doc)).name, page) for doc, page in pairs]

    def wanted_pairs(q: dict) -> set:
        return {(Path(q["document"]).name, page) for page in q["pages"]}

    within = [_found_at(r["pages"], set(q["pages"])) for q, r in zip(questions, rows, strict=True)]
    hits = [_found_at(r["hit_pages"], set(q["pages"])) for q, r in zip(questions, rows, strict=True)]
    whole = [
        _found_at(named(r["index_pages"]), wanted_pairs(q)) for q, r in zip(questions, rows, strict=True)
    ]
    whole_hits = [
        _found_at(named(r["index_hit_pages"]), wanted_pairs(q)) for q, r in zip(questions, rows, strict=True)
    ]
    answerable = [(q, r) for q, r in zip(questions, rows, strict=True) if q["answers"]]
    n = len(questions)

    def share(ranks: list, depth: int) -> float:
        return sum(rank is not None and rank <= depth for rank in ranks) / n

    return {
        "n": n,
        "R@1": share(within, 1),
        "R@k": share(within, k),
        "hits R@k": share(hits, k),
        "index R@1": share(whole, 1),
        "index R@k": share(whole, k),
        "index hits R@k": share(whole_hits, k),
        "answers": len(answerable),
        "answer R@k": (
            sum(has_answer(r["texts"], q["answers"]) for q, r in answerable) / len(answerable)
            if answerable
            else None
        ),
        "repeated pictures": sum(r.get("repeats", {}).get("picture", 0) for r in rows) / n,
        "repeated pages": sum(r.get("repeats", {}).get("page", 0) for r in rows) / n,
    }


def groups(questions: list[dict]) -> dict[str, list[int]]:
    """Question indexes per row of the report: each set, and the dev set by where and by source."""
    named: dict[str, list[int]] = defaultdict(list)
    for index, question in enumerate(questions):
        named[question["set"]].append(index)
        if question["set"] == "dev":
            named[f"dev: {question['where']}"].append(index)
            for source in question["sources"]:
                named[f"dev source: {source}"].append(index)
        if question["set"] == "seven":
            for source in question["sources"]:
                named[f"seven: {source}"].append(index)
    return named


def real_table(questions: list[dict], ours: list[dict], baseline: list[dict], k: int) -> dict[str, dict]:
    table = {}
    for name, indexes in groups(questions).items():
        picked = [questions[i] for i in indexes]
        table[name] = {
            "ours": score(picked, [ours[i] for i in indexes], k),
            "baseline": score(picked, [baseline[i] for i in indexes], k),
        }
    return table


def _cell(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f}"


def markdown(real: dict[str, dict], generated: dict[str, dict], k: int) -> str:
    lines = [
        f"| set | n | within the document: R@1 / R@{k} pages / R@{k} hits | baseline "
        f"| whole index: R@1 / R@{k} pages / R@{k} hits | baseline | answer R@{k} (n) | baseline "
        f"| repeats in {k} hits: picture / page |",
        "|---|---:|---|---|---|---|---|---|---|",
    ]
    order = ("dev", "dev: text", "dev: image", "seven", "text")
    names = [n for n in order if n in real] + sorted(n for n in real if n not in order)
    for name in names:
        ours, base = real[name]["ours"], real[name]["baseline"]
        lines.append(
            f"| {name} | {ours['n']} | **{_cell(ours['R@1'])} / {_cell(ours['R@k'])} / {_cell(ours['hits R@k'])}** "
            f"| {_cell(base['R@1'])} / {_cell(base['R@k'])} / {_cell(base['hits R@k'])} "
            f"| {_cell(ours['index R@1'])} / {_cell(ours['index R@k'])} / {_cell(ours['index hits R@k'])} "
            f"| {_cell(base['index R@1'])} / {_cell(base['index R@k'])} / {_cell(base['index hits R@k'])} "
            f"| {_cell(ours['answer R@k'])} ({ours['answers']}) | {_cell(base['answer R@k'])} "
            f"| {ours['repeated pictures']:.2f} / {ours['repeated pages']:.2f} |"
        )
    if generated:
        lines += ["", f"| generated set | group | n | R@1 | R@{k} | MRR |", "|---|---|---:|---:|---:|---:|"]
        for set_name, table in generated.items():
            for group, row in table.items():
                if group.startswith(("image (all)", "text")) or set_name == "series":
                    lines.append(
                        f"| {set_name} | {group} | {row['questions']} | {row['R@1']:.3f} "
                        f"| {row[f'R@{k}']:.3f} | {row['MRR']:.3f} |"
                    )
    return "\n".join(lines)


# --- the generated sets ------------------------------------------------------------------------


def generated_examples(
    name: str, out: Path, mode: str, skip_ingest: bool
) -> tuple[list[dict], list[Example]]:
    """Generate the set (once), ingest it into its own home, and collect each question's candidates
    across that index, labelled by the question's fact."""
    folder = out / name
    script = "evalset.py" if name == "generated" else "evalset_series.py"
    if not (folder / "questions.jsonl").is_file():
        arguments = ["--docs", "40", "--seed", "7"] if name == "generated" else ["--seed", "7"]
        subprocess.run(
            [sys.executable, str(Path(__file__).with_name(script)), "generate", str(folder), *arguments],
            check=True,
        )
    manifest = json.loads((folder / "manifest.json").read_text(encoding="utf-8"))
    questions = [json.loads(line) for line in (folder / "questions.jsonl").read_text().splitlines() if line]
    home = use_home(folder / "home", fresh=not skip_ingest)
    examples = []
    try:
        if not skip_ingest:
            print(f"{name}: ingesting {len(manifest['documents'])} documents ...", file=sys.stderr)
            report = ingest([folder / "docs" / doc["file"] for doc in manifest["documents"]], home)
            if report.get("failed"):
                print(f"{name}: failed {report['failed']}", file=sys.stderr)
        print(f"{name}: collecting {len(questions)} questions ...", file=sys.stderr)
        for index, question in enumerate(questions):

            def answers(chunk, question=question) -> bool:
                return str(chunk.metadata.get("source", "")).endswith(question["document"]) and contains_fact(
                    chunk.text, question["fact"]
                )

            key = f"{name}:{index}:whole"
            examples.append(
                collect(key, f"{name}/{question['document']}", question["question"], None, answers, mode)
            )
    finally:
        stop_embedded_postgres(home)
    return questions, examples


def generated_scores(
    questions: list[dict], examples: list[Example], scores: dict | None, k: int, unit: str = "chunk"
) -> tuple[dict[str, dict], list[dict]]:
    """Fact recall of each question's hits across its set's index. With unit "chunk" (the default
    here) a hit must hold the fact itself; a page hit holds every passage of its page."""
    results = []
    for question, example in zip(questions, examples, strict=True):
        hits = hits_of(example, scores and scores[example.key], k, unit)
        top = hits[0] if hits else {}
        results.append(
            {
                **question,
                "rank": answer_rank(hits, question),
                "top_document": Path(str(top.get("document", ""))).name,
                "top_kind": top.get("kind"),
                "top_text": " ".join(str(top.get("text", "")).split())[:300],
            }
        )
    return grouped_scores(results, k), results


# --- main --------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", type=Path, default=DEFAULT_CORPUS, help="the reference corpus folder")
    parser.add_argument("--out", type=Path, default=Path("/tmp/vision_rag_quality"), help="homes and results")
    parser.add_argument("--sets", default=",".join(REAL_SETS + GENERATED_SETS), help="comma-separated")
    parser.add_argument("--k", type=int, default=5)
    parser.add_argument("--mode", choices=("hybrid", "vector", "lexical"), default="hybrid")
    parser.add_argument("--skip-ingest", action="store_true", help="ask what the homes under --out hold")
    parser.add_argument(
        "--json", type=Path, metavar="FILE", help="write the scores and every question's ranks"
    )
    parser.add_argument(
        "--write-ranker", action="store_true", help="refit the shipped ranker on every question and write it"
    )
    args = parser.parse_args(argv)
    sets = [name.strip() for name in args.sets.split(",") if name.strip()]
    if unknown := set(sets) - set(REAL_SETS + GENERATED_SETS):
        parser.error(f"unknown sets {sorted(unknown)}")
    args.out.mkdir(parents=True, exist_ok=True)
    report: dict = {"k": args.k, "mode": args.mode, "sets": sets}

    real_qs: list[dict] = []
    examples: list[Example] = []
    documents: list[str] = []
    wanted_real = [name for name in sets if name in REAL_SETS]
    if wanted_real and not (args.corpus / "qa" / "mmlongbench_dev" / "questions.json").is_file():
        print(f"real sets skipped: no reference corpus at {args.corpus}", file=sys.stderr)
        wanted_real = []
    if wanted_real:
        # every real document in one index, whichever sets are asked, so "whole index" means one thing
        every = real_questions(args.corpus, list(REAL_SETS))
        documents = sorted({q["document"] for q in every})
        real_qs = [q for q in every if q["set"] in wanted_real]
        home = use_home(args.out / "real_home", fresh=not args.skip_ingest)
        try:
            if not args.skip_ingest:
                print(f"real: ingesting {len(documents)} documents into {home} ...", file=sys.stderr)
                report["ingest"] = ingest([Path(d) for d in documents], home)
                if report["ingest"].get("failed"):
                    print(f"real: failed {report['ingest']['failed']}", file=sys.stderr)
            print(f"real: collecting {len(real_qs)} questions twice ...", file=sys.stderr)
            examples += real_examples(real_qs, args.mode)
        finally:
            stop_embedded_postgres(home)
    generated_sets = {
        name: generated_examples(name, args.out, args.mode, args.skip_ingest)
        for name in sets
        if name in GENERATED_SETS
    }
    for _, set_examples in generated_sets.values():
        examples += set_examples
    with (args.out / "examples.pkl").open("wb") as file:  # for fit_ranker experiments without a re-run
        pickle.dump(
            {"real": real_qs, "documents": documents, "generated": generated_sets, "examples": examples}, file
        )
    print(f"fitting {FOLDS} folds over {len({e.group for e in examples})} documents ...", file=sys.stderr)
    oof = out_of_fold(examples)
    if args.write_ranker:
        described = (
            f"{len(examples)} searches of {len(real_qs) + sum(len(q) for q, _ in generated_sets.values())}"
            f" questions ({', '.join(sets)}) within their documents and across their indexes; refit:"
            f" python bench/eval_quality.py --out DIR --write-ranker"
        )
        write_shipped(examples, described)
        from vision_rag_pipeline.query.ranker import load_ranker

        load_ranker.cache_clear()

    unit = RetrievalConfig().unit
    real: dict[str, dict] = {}
    if real_qs:
        ours = real_rows(real_qs, examples, oof, args.k, unit)
        print("real: the page baseline ...", file=sys.stderr)
        baseline = PageBaseline(documents, args.out / "baseline_vectors").ask(real_qs, args.k)
        real = real_table(real_qs, ours, baseline, args.k)
        report["real"] = real
        report["real_chunk_unit"] = real_table(
            real_qs, real_rows(real_qs, examples, oof, args.k, "chunk"), baseline, args.k
        )
        report["real_shipped"] = real_table(
            real_qs, real_rows(real_qs, examples, None, args.k, unit), baseline, args.k
        )
        report["questions"] = [
            {
                **q,
                "ours_pages": o["pages"][: args.k],
                "ours_hit_pages": o["hit_pages"],
                "baseline_pages": b["pages"][: args.k],
                "ours_index": o["index_pages"][: args.k],
            }
            for q, o, b in zip(real_qs, ours, baseline, strict=True)
        ]
    generated, shipped = {}, {}
    for name, (questions, set_examples) in generated_sets.items():
        generated[name], results = generated_scores(questions, set_examples, oof, args.k)
        report[f"{name}_{unit}_unit"] = generated_scores(questions, set_examples, oof, args.k, unit)[0]
        shipped[name] = generated_scores(questions, set_examples, None, args.k)[0]
        (args.out / name / "results.jsonl").write_text(
            "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in results), encoding="utf-8"
        )
    report["generated"] = generated
    report["generated_shipped"] = shipped
    print(f"Out of fold (grouped by document, {FOLDS} folds); real sets with unit {unit!r} (the default),")
    print("generated sets with unit 'chunk' (a hit must hold the fact):")
    print(markdown(real, generated, args.k))
    if real_qs:
        print("\nOut of fold, real sets with unit 'chunk':")
        print(markdown(report["real_chunk_unit"], {}, args.k))
    for name in generated:
        image, text = (
            report[f"{name}_{unit}_unit"].get(g, {}).get(f"R@{args.k}") for g in ("image (all)", "text")
        )
        print(f"{name} with unit {unit!r}: image R@{args.k} {image:.3f}, text R@{args.k} {text:.3f}")
    print("\nThe shipped ranker (fitted on every question: a training score):")
    print(markdown(report.get("real_shipped", {}), shipped, args.k))
    if args.json:
        args.json.write_text(json.dumps(report, indent=1, ensure_ascii=False, default=str), encoding="utf-8")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    sys.exit(main())
