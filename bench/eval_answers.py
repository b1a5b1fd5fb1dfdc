"""Offline answers: is the fact in the answer, and does the answer cite where it is?

`ask` runs with no LLM (the extractive answer) on a home where the documents are ingested.

- A generated set (`bench/evalset.py generate`, ingested by `bench/eval_retrieval.py --home`): per
  image kind and for body text, the share of questions whose answer holds the fact, and whose
  answer holds it with its first citation in the fact's document (for an image fact: on the fact's
  image, by URL for MHTML; any image of the document for PDF).
- `--real`: the read-off questions of the reference corpus (`bench/eval_real.py`'s sets, ingested by
  `bench/eval_real.py --home`), per evidence type: the share whose answer holds every answer string
  (with its first citation in the question's document).

    python bench/eval_retrieval.py /tmp/evalset --home /tmp/evalset/home
    python bench/eval_answers.py /tmp/evalset --home /tmp/evalset/home
    python bench/eval_real.py --home /tmp/real_home
    python bench/eval_answers.py --real --home /tmp/real_home
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from eval_real import DEFAULT_CORPUS, has_answer, mmlongbench_questions, text_questions  # noqa: E402
from eval_retrieval import contains_fact, use_home  # noqa: E402


def generated_questions(out_dir: Path) -> list[dict]:
    """The set's questions with their groups and the answer strings to find."""
    rows = []
    for line in (out_dir / "questions.jsonl").read_text(encoding="utf-8").splitlines():
        question = json.loads(line)
        image = question["kind"] == "image"
        groups = [f"image: {question['image_kind']}", "image (all)"] if image else ["text"]
        rows.append({**question, "groups": groups, "answers": [question["fact"]]})
    return rows


def real_questions(corpus: Path) -> list[dict]:
    """The reference corpus's questions with a read-off answer, grouped by set and evidence type."""
    rows = []
    for question in mmlongbench_questions(corpus) + text_questions(corpus):
        if not question["answers"]:
            continue
        kinds = (
            [f"mmlongbench {kind}" for kind in question["types"]] if question["set"] == "mmlongbench" else []
        )
        rows.append({**question, "kind": "text", "groups": [question["set"], *kinds]})
    return rows


def _cites(question: dict, citation: object) -> bool:
    """The first citation is in the question's document, and for an image fact on the fact's image."""
    if Path(citation.document).name != Path(question["document"]).name:  # type: ignore[attr-defined]
        return False
    if question["kind"] != "image":
        return True
    return bool(citation.image) and (  # type: ignore[attr-defined]
        citation.image.endswith(question["image"]) or question["format"] == "pdf"  # type: ignore[attr-defined]
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "out_dir", type=Path, nargs="?", help="a directory written by `bench/evalset.py generate`"
    )
    parser.add_argument("--real", action="store_true", help="the reference corpus's questions instead")
    parser.add_argument("--corpus", type=Path, default=DEFAULT_CORPUS, help="the reference corpus folder")
    parser.add_argument(
        "--home", type=Path, required=True, help="VISION_RAG_HOME the documents are ingested in"
    )
    parser.add_argument("--json", type=Path, metavar="FILE", help="write every question's answer here")
    args = parser.parse_args(argv)
    if args.real == (args.out_dir is not None):
        parser.error("give a generated set's folder or --real")
    use_home(args.home, fresh=False)
    from vision_rag_pipeline.core.config import config_in_effect
    from vision_rag_pipeline.query.ask import ask

    config = config_in_effect().config
    config = config.model_copy(update={"answer": config.answer.model_copy(update={"use_llm": False})})
    questions = real_questions(args.corpus) if args.real else generated_questions(args.out_dir)
    counts: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])
    rows = []
    for question in questions:
        answer = ask(question["question"], config=config)
        found = answer.answered and (
            has_answer([answer.answer], question["answers"])
            if args.real
            else contains_fact(answer.answer, question["answers"][0])
        )
        cited = found and _cites(question, answer.citations[0])
        for group in question["groups"]:
            counts[group][0] += 1
            counts[group][1] += found
            counts[group][2] += cited
        rows.append({**question, "answer": answer.answer, "found": found, "cited": cited})
    print("| group | questions | answer holds the fact | ... and its first citation is where the fact is |")
    print("|---|---:|---:|---:|")
    for name in sorted(counts, key=lambda n: (n in ("text", "image (all)"), n)):
        n, found, cited = counts[name]
        print(f"| {name} | {n} | {found / n:.3f} | {cited / n:.3f} |")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1, ensure_ascii=False), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
