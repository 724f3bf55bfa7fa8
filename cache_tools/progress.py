"""Progress of long operations on stderr: bytes and rate (pack, restore, merge, push, pull),
and the elapsed time of a step whose length is unknown (SGLang's import, a server's start).

On a terminal one line is rewritten in place; elsewhere (CI logs, ``docker build``) a line is
printed per step and at most every ``interval`` seconds while bytes flow, and a step of unknown
length that passes a few seconds prints two step lines: when it passes them, and when it ends.
"""

from __future__ import annotations

import sys
import threading
import time
from contextlib import contextmanager
from typing import Callable, Iterator, TextIO

from cache_tools.scan import size_str

#: Longest ticking line (a wider one would wrap and break the in-place rewrite).
_WIDTH = 120


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

    @contextmanager
    def ticking(self, label: str, *, after_s: float = 2.0, every_s: float = 0.5,
                detail: Callable[[], str] | None = None) -> Iterator[None]:
        """A step of unknown length.  On a terminal, once it has run ``after_s``: one line with
        the seconds so far (and ``detail()``, e.g. the last line of a server log), rewritten
        every ``every_s``, closed by ``label: done in N s``.  Off a terminal, once it has run
        ``after_s``: the step line ``label ...``, and ``label: done in N s`` when it ends (no
        line per tick: a log would be buried in them).  A shorter step prints nothing."""
        if not self.enabled:
            yield
            return
        self._finish_line()
        started = time.monotonic()
        stop = threading.Event()
        shown = threading.Event()

        def tick() -> None:
            if stop.wait(after_s):
                return
            if not self.tty:  # a log: the step line once
                self._write(f"{label} ...\n")
                shown.set()
                return
            while True:
                line = f"{label} ({time.monotonic() - started:.0f} s)"
                if detail is not None:
                    try:
                        extra = " ".join(str(detail()).split())
                    except Exception:  # a detail is decoration; it never fails the step
                        extra = ""
                    if extra:
                        line += ": " + extra
                self._write("\r" + line[:_WIDTH] + "\x1b[K")
                shown.set()
                if stop.wait(every_s):
                    return

        ticker = threading.Thread(target=tick, name="progress-tick", daemon=True)
        ticker.start()
        ended = "failed after"
        try:
            yield
            ended = "done in"
        finally:
            stop.set()
            ticker.join()
            if shown.is_set():
                end = f"{label}: {ended} {time.monotonic() - started:.1f} s"
                self._write(f"\r{end}\x1b[K\n" if self.tty else end + "\n")

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
