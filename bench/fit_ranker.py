"""Fit the search's ranker (vision_rag_pipeline/query/ranker.json) and score it out of fold.

Every question with a known answer gives the search's candidates for it, each described by the
ranker's features (query/features.py) and labelled: on an evidence page of the question's document
(the real sets), or in the question's document and holding its fact (the generated sets). Each
question is searched twice, within its document and across its whole index, and both searches are
examples. Two logistic regressions (scikit-learn) learn the weights, every question counting alike:
one pointwise (does this candidate answer?), one pairwise (of two candidates of one search, one
answering and one not, which comes first?: RankNet's question, asked with a linear model), and the
shipped weights are a fixed mix of the two (`PAIRWISE_SHARE`), so they stay one weighted sum.

Out of fold: documents are split into folds (grouped k-fold, a document's questions all in one
fold), each fold's questions are ranked by weights fitted on the other folds' documents only, and
the quality figures (bench/eval_quality.py) are computed from those rankings. The shipped weights
are fitted on every example.

    python bench/eval_quality.py --out /tmp/q                       # ingests, collects, fits, reports
    python bench/eval_quality.py --out /tmp/q --skip-ingest --write-ranker   # refit the shipped weights
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

FOLDS = 5
REGULARIZATION = 1.0  # scikit-learn's C; the features are on 0..1 scales
PAIRWISE_SHARE = 0.25  # of the shipped weights from the pairwise fit (BENCHMARKS.md, retrieval quality)
SHIPPED = Path(__file__).resolve().parents[1] / "vision_rag_pipeline" / "query" / "ranker.json"


@dataclass
class Example:
    """One search of one question: its candidates (features, scores to come) and their labels."""

    key: str  # "<set>:<question index>:<within|whole>"
    group: str  # the question's document: the fold unit
    scored: object  # query.search.Scored, its candidates' vectors dropped
    labels: np.ndarray  # 1 where the candidate answers


def zero_ranker():
    from vision_rag_pipeline.query.features import FEATURES
    from vision_rag_pipeline.query.ranker import Ranker

    return Ranker(version="collect", features=list(FEATURES), weights=[0.0] * len(FEATURES))


def collect(
    key: str,
    group: str,
    question: str,
    document: str | None,
    answers: Callable[[object], bool],
    mode: str = "hybrid",
) -> Example:
    """The candidates of one search (within `document`, or the whole index when None), labelled by
    `answers(chunk)`."""
    from vision_rag_pipeline.query.search import Filters, Scored, score_candidates

    scored = score_candidates(
        [(question, 1.0)],
        mode,
        filters=Filters(documents=[document] if document else None),
        ranker=zero_ranker(),
    )
    if scored is None:
        raise SystemExit(f"{document}: not in the index")
    pool = scored.pool
    pool.embeddings.clear()
    labels = np.array([answers(pool.chunks[cid]) for cid in scored.features.ids], dtype=float)
    return Example(key, group, Scored(pool, scored.features, scored.scores), labels)


def fit(examples: Iterable[Example], version: str = "fold", fitted_on: str = ""):
    """The pointwise and the pairwise logistic regressions over the examples' candidates, mixed.

    Pointwise, each question weighs the same: its positives together as much as its negatives
    together. Pairwise, each (positive, negative) pair of one search is a difference of feature
    rows, and each search's pairs together weigh one. A search with no answer among its candidates,
    or nothing else, teaches nothing and is left out."""
    from sklearn.linear_model import LogisticRegression

    from vision_rag_pipeline.query.features import FEATURES
    from vision_rag_pipeline.query.ranker import Ranker

    rows, labels, weights, differences, pair_weights = [], [], [], [], []
    for example in examples:
        positives = example.labels.sum()
        if positives == 0 or positives == len(example.labels):
            continue
        matrix = example.scored.features.matrix
        rows.append(matrix)
        labels.append(example.labels)
        weights.append(np.where(example.labels > 0, 0.5 / positives, 0.5 / (len(example.labels) - positives)))
        answering, other = matrix[example.labels > 0], matrix[example.labels <= 0]
        pairs = (answering[:, None, :] - other[None, :, :]).reshape(-1, matrix.shape[1])
        differences.append(pairs)
        pair_weights.append(np.full(len(pairs), 1.0 / len(pairs)))
    pointwise = LogisticRegression(C=REGULARIZATION, max_iter=2000)
    pointwise.fit(np.concatenate(rows), np.concatenate(labels), sample_weight=np.concatenate(weights))
    pairs, pair_weight = np.concatenate(differences), np.concatenate(pair_weights) * len(differences)
    pairwise = LogisticRegression(C=REGULARIZATION, max_iter=2000, fit_intercept=False)
    pairwise.fit(
        np.concatenate([pairs, -pairs]),
        np.concatenate([np.ones(len(pairs)), np.zeros(len(pairs))]),
        sample_weight=np.concatenate([pair_weight, pair_weight]),
    )
    mixed = (1 - PAIRWISE_SHARE) * pointwise.coef_[0] + PAIRWISE_SHARE * pairwise.coef_[0]
    return Ranker(
        version=version,
        features=list(FEATURES),
        weights=[round(float(w), 4) for w in mixed],
        bias=round(float((1 - PAIRWISE_SHARE) * pointwise.intercept_[0]), 4),
        fitted_on=fitted_on,
    )


def folds_of(groups: list[str], folds: int = FOLDS) -> dict[str, int]:
    """Each document's fold: documents sorted by name, dealt round-robin (a deterministic grouped
    k-fold)."""
    return {group: index % folds for index, group in enumerate(sorted(set(groups)))}


def out_of_fold(examples: list[Example], folds: int = FOLDS) -> dict[str, np.ndarray]:
    """Each example's candidate scores from the ranker fitted on the other folds' documents."""
    fold = folds_of([example.group for example in examples], folds)
    scores: dict[str, np.ndarray] = {}
    for held_out in range(folds):
        ranker = fit(example for example in examples if fold[example.group] != held_out)
        for example in examples:
            if fold[example.group] == held_out:
                scores[example.key] = ranker.score(example.scored.features.matrix)
    return scores


def write_shipped(examples: list[Example], described: str, path: Path = SHIPPED) -> None:
    version = datetime.now(UTC).strftime("%Y-%m-%d")
    ranker = fit(examples, version=version, fitted_on=described)
    path.write_text(json.dumps(ranker.model_dump(), indent=1) + "\n", encoding="utf-8")
    print(f"wrote {path}: {dict(zip(ranker.features, ranker.weights, strict=True))}", file=sys.stderr)
