"""Progress of long operations (pack, restore, merge, push, pull) on stderr: bytes and rate.

On a terminal one line is rewritten in place; elsewhere (CI logs, ``docker build``) a line is
printed per step and at most every ``interval`` seconds while bytes flow.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

from cache_tools.scan import size_str


class Progress:
    """A byte counter with step lines.  ``Progress.null()`` prints nothing (library use)."""

    def __init__(self, stream: TextIO | None = None, *, interval: float = 2.0,
                 enabled: bool = True) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = enabled
        self.tty = enabled and bool(getattr(self.stream, "isatty", lambda: False)())
        self.interval = 0.2 if self.tty else interval
        self.label = ""
        self.total = 0
        self.done = 0
        self.started = time.monotonic()
        self._last = 0.0
        self._dirty = False

    @classmethod
    def null(cls) -> "Progress":
        return cls(enabled=False)

    def step(self, message: str) -> None:
        """A line that says what happens next (or what just happened)."""
        self._finish_line()
        self._write(message + "\n")

    def start(self, label: str, total: int) -> None:
        """Begin counting ``total`` bytes under ``label``."""
        self._finish_line()
        self.label, self.total, self.done = label, total, 0
        self.started = time.monotonic()
        self._last = self.started

    def advance(self, nbytes: int) -> None:
        self.done += nbytes
        now = time.monotonic()
        if now - self._last >= self.interval:
            self._last = now
            self._emit(now)

    def finish(self, message: str | None = None) -> None:
        """End the byte count with a summary line (bytes, seconds, rate)."""
        now = time.monotonic()
        seconds = max(now - self.started, 1e-9)
        self._finish_line()
        summary = (f"{self.label}: {size_str(self.done)} in {seconds:.1f}s "
                   f"({size_str(int(self.done / seconds))}/s)")
        self._write((message or summary) + "\n")

    def rate_line(self, now: float) -> str:
        seconds = max(now - self.started, 1e-9)
        pct = f" {100 * self.done / self.total:5.1f}%" if self.total else ""
        return (f"{self.label}:{pct} {size_str(self.done)} of {size_str(self.total)} "
                f"({size_str(int(self.done / seconds))}/s)")

    def _emit(self, now: float) -> None:
        if self.tty:
            self._write("\r" + self.rate_line(now) + "\x1b[K")
            self._dirty = True
        else:
            self._write(self.rate_line(now) + "\n")

    def _finish_line(self) -> None:
        if self._dirty:
            self._write("\n")
            self._dirty = False

    def _write(self, text: str) -> None:
        if not self.enabled:
            return
        try:
            self.stream.write(text)
            self.stream.flush()
        except (OSError, ValueError):
            pass  # a closed stderr must not fail a restore
