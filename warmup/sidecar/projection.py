"""The startup projection: where a warm-up stands against the orchestrator's startup budget,
projected from the request rate so far, and the pacer that logs it while the plan runs."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any, Callable

logger = logging.getLogger("sglang_warmup.sidecar")


@dataclass(frozen=True)
class Projection:
    """Where the warm-up stands against the startup budget.

    ``done`` / ``total``: requests sent / to send (both passes with a second pass).
    ``elapsed_s``: seconds since the first request.  ``remaining_s``: projected seconds to the
    end at the rate so far (None before the first request finished).  ``budget_left_s``: seconds
    of the startup budget left now (None without a budget).
    """

    done: int
    total: int
    elapsed_s: float
    remaining_s: float | None
    budget_left_s: float | None

    @property
    def margin_s(self) -> float | None:
        """Budget left at the projected finish; negative: the finish is past the budget."""
        if self.remaining_s is None or self.budget_left_s is None:
            return None
        return self.budget_left_s - self.remaining_s

    def describe(self, now: float | None = None) -> str:
        now = time.time() if now is None else now
        text = f"{self.done}/{self.total} requests in {self.elapsed_s:.1f} s"
        if self.remaining_s is None:
            return text + "; no rate yet"
        text += (f"; projected finish in {self.remaining_s:.0f} s at "
                 f"{clock(now + self.remaining_s)}")
        margin = self.margin_s
        if margin is None:
            return text + " (no startup budget given)"
        end = clock(now + (self.budget_left_s or 0.0))
        if margin >= 0:
            return text + f", {margin:.0f} s inside the startup budget (ends {end})"
        return text + f", {-margin:.0f} s PAST the startup budget (ends {end})"

    def to_dict(self) -> dict[str, Any]:
        return {"done": self.done, "total": self.total, "elapsed_s": round(self.elapsed_s, 3),
                "remaining_s": None if self.remaining_s is None else round(self.remaining_s, 1),
                "budget_left_s": None if self.budget_left_s is None else round(self.budget_left_s, 1),
                "margin_s": None if self.margin_s is None else round(self.margin_s, 1)}


def project(done: int, total: int, elapsed_s: float, budget_left_s: float | None) -> Projection:
    """Project the finish from the request rate so far (requests per second since the first
    request); pure."""
    remaining: float | None = None
    if done > 0 and elapsed_s > 0:
        remaining = max(0, total - done) * elapsed_s / done
    elif done >= total:
        remaining = 0.0
    return Projection(done, total, elapsed_s, remaining, budget_left_s)


def clock(t: float) -> str:
    """A unix time as local ``HH:MM:SS`` (for log lines)."""
    return time.strftime("%H:%M:%S", time.localtime(t))


class Pacer:
    """Counts the requests sent and logs the projection at most every ``every_s`` seconds
    (a warning when the projected finish is past the budget)."""

    def __init__(self, total: int, budget_end: float | None, *, every_s: float = 10.0,
                 on_update: Callable[[Projection], None] | None = None) -> None:
        self.total = total
        self.budget_end = budget_end  # monotonic time at which the startup budget ends
        self.every_s = every_s
        self.on_update = on_update
        self.done = 0
        self.started = time.monotonic()
        self._next_log = 0.0
        self.last: Projection | None = None

    def advance(self, n: int) -> Projection:
        self.done += n
        now = time.monotonic()
        left = None if self.budget_end is None else self.budget_end - now
        p = project(self.done, self.total, now - self.started, left)
        self.last = p
        if self.on_update is not None:
            self.on_update(p)
        if now >= self._next_log or self.done >= self.total:
            self._next_log = now + self.every_s
            margin = p.margin_s
            log = logger.warning if margin is not None and margin < 0 else logger.info
            log("sglang-warmup sidecar: %s", p.describe())
        return p
