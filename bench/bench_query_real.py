"""Query latency on the real documents: across the whole index and within one document.

    .venv/bin/python bench/bench_query_real.py [--home /tmp/vision_rag_quality/real_home] [--k 5]

Asks the dev set's 244 questions (`../shared/corpus/qa/mmlongbench_dev`) of the index that
`bench/eval_quality.py` built of the 52 real documents (its `real_home`), warm, in one process:
each question across the whole index and within its own document, in turns, so both share the
machine's drift; each question embedded afresh. Prints one JSON object: p50 and p95 of `search()`
in ms for each.
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
        raise SystemExit(
            f"{args.home}: no index here; run bench/eval_quality.py --out {args.home.parent} first"
        )
    home = use_home(args.home, fresh=False)
    from vision_rag_pipeline.query import search
    from vision_rag_pipeline.query.candidates import query_vectors

    questions = dev_questions(args.corpus)
    times: dict[str, list[float]] = {"whole_index": [], "within_document": []}
    try:
        search(text="warm-up query", k=args.k)
        for question in questions:
            for name, documents in (("whole_index", None), ("within_document", [question["document"]])):
                query_vectors.cache_clear()
                started = time.perf_counter()
                search(text=question["question"], k=args.k, document_ids=documents)
                times[name].append((time.perf_counter() - started) * 1000)
    finally:
        stop_embedded_postgres(home)
    report = {name: percentiles(values) for name, values in times.items()}
    report |= {"questions": len(questions), "load_average": [round(x, 2) for x in os.getloadavg()]}
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    sys.exit(main())
