"""A deadline for work that must end within a budget, a sensor tick above all: it counts from the
start of the work, and each unit of work (a run's record, a page of files, a batch of rows) is begun
only while time is left, so what does not fit waits for the next time instead of overrunning it."""

from __future__ import annotations

import time


class Deadline:
    def __init__(self, budget_s: float, *, ends_at: float | None = None) -> None:
        self.started = time.monotonic()
        self.ends_at = self.started + budget_s if ends_at is None else ends_at

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def left(self) -> float:
        return self.ends_at - time.monotonic()

    def passed(self) -> bool:
        return self.left() <= 0

    def within(self, budget_s: float) -> Deadline:
        """A part of this deadline's time: `budget_s` from now, and never past this one."""
        return Deadline(0, ends_at=min(self.ends_at, time.monotonic() + budget_s))
