"""Stage three of a search: one score per candidate, a weighted sum of its features.

The weights are not set by hand. `bench/fit_ranker.py` fits them (logistic regressions: is this
candidate on a page that answers the question, and which of two candidates of a search comes
first?) on every evaluation set with known answers, and
reports every quality figure out of fold, documents as groups, so no document's questions train
the weights scored on them. The fitted weights ship as `ranker.json` beside this module, with the
command and the data that produced them; `retrieval.ranker` names another such file.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import numpy as np
from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

from vision_rag_pipeline.query.features import FEATURES

SHIPPED_WEIGHTS = Path(__file__).with_name("ranker.json")


class Ranker(BaseModel):
    """A linear model over FEATURES: score = bias + sum of weight x feature (a logit)."""

    model_config = ConfigDict(frozen=True)

    version: str
    features: list[str]
    weights: list[float]
    bias: float = 0.0
    fitted_on: str = ""  # which questions, how many, and the command that refits it

    @model_validator(mode="after")
    def _matches_features(self) -> Ranker:
        if self.features != list(FEATURES):
            missing = sorted(set(FEATURES) - set(self.features))
            unknown = sorted(set(self.features) - set(FEATURES))
            raise ValueError(
                f"ranker {self.version}: its features are not this version's"
                f" (missing {missing}, unknown {unknown}); refit it with bench/fit_ranker.py"
            )
        if len(self.weights) != len(self.features):
            raise ValueError(
                f"ranker {self.version}: {len(self.weights)} weights for {len(self.features)} features"
            )
        return self

    def score(self, matrix: np.ndarray) -> np.ndarray:
        """The logit of each row; order by it."""
        if not len(matrix):
            return np.zeros(0)
        return matrix @ np.asarray(self.weights) + self.bias


@lru_cache(maxsize=8)
def load_ranker(path: str | None = None) -> Ranker:
    """The ranker in `path` (a JSON file), or the shipped one; read once per process."""
    file = Path(path) if path else SHIPPED_WEIGHTS
    try:
        text = file.read_text(encoding="utf-8")
    except OSError as exc:
        raise ValueError(f"{file}: cannot read the ranker's weights: {exc.strerror}") from exc
    try:
        return Ranker.model_validate_json(text)
    except ValidationError as exc:
        reason = exc.errors()[0]["msg"].removeprefix("Value error, ")
        raise ValueError(f"{file}: {reason}") from None
