"""Whole-index query latency on the real documents, with `retrieval.pages_within_documents` on and off.

    .venv/bin/python bench/bench_query_real.py [--home /tmp/quality/real_home] [--k 5]

Asks the dev set's 244 questions (`../shared/corpus/qa/mmlongbench_dev`) across the index that
`bench/eval_quality.py` built of the 52 real documents (its `real_home`), warm, in one process:
each question once with the default retrieval settings and once with `pages_within_documents`
off, in turns, so both share the machine's drift. A question whose later hits it reorders searches
some of its documents again (one Postgres round trip each). Prints one JSON object: p50 and p95 of
`search()` in ms for each, and how many questions searched documents again.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from eval_quality import dev_questions  # noqa: E402
from eval_real import DEFAULT_CORPUS  # noqa: E402
from eval_retrieval import stop_embedded_postgres, use_home  # noqa: E402


def percentiles(times: list[float]) -> dict[str, float]:
    ordered = sorted(times)
    return {
        "p50": round(statistics.median(ordered), 1),
        "p95": round(ordered[int(0.95 * (len(ordered) - 1))], 1),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--home", type=Path, default=Path("/tmp/vision_rag_quality/real_home"))
    parser.add_argument("--corpus", type=Path, default=DEFAULT_CORPUS)
    parser.add_argument("--k", type=int, default=5)
    args = parser.parse_args(argv)
    if not (args.home / "pgdata").is_dir():
        parser.error(f"no index at {args.home}: run bench/eval_quality.py --sets dev first")
    home = use_home(args.home, fresh=False)
    from vision_rag_pipeline.core.config import RagConfig, RetrievalConfig
    from vision_rag_pipeline.query import search
    from vision_rag_pipeline.query.search import query_vectors

    ordered = RagConfig()
    alone = RagConfig(retrieval=RetrievalConfig(pages_within_documents=False))
    questions = [q["question"] for q in dev_questions(args.corpus)]
    times: dict[str, list[float]] = {"on": [], "off": []}
    reordered = 0
    try:
        for question in questions[:5]:  # warm: the model, the store, the lexical index
            search(question, k=args.k, config=ordered)
        for question in questions:
            for name, config in (("on", ordered), ("off", alone)):
                query_vectors.cache_clear()  # each search embeds its question, as a new question does
                started = time.perf_counter()
                hits = search(question, k=args.k, config=config)
                times[name].append((time.perf_counter() - started) * 1000)
                if name == "off":
                    later = [hit.document for hit in hits[1:]]
                    reordered += any(later.count(document) > 1 for document in later)
    finally:
        stop_embedded_postgres(home)
    print(
        json.dumps(
            {
                "questions": len(questions),
                "k": args.k,
                "ms_pages_within_documents_on": percentiles(times["on"]),
                "ms_pages_within_documents_off": percentiles(times["off"]),
                "questions_searching_documents_again": reordered,
            },
            indent=1,
        )
    )
    return 0


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    sys.exit(main())
