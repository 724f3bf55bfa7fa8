"""Long Python garbage collections of an SGLang process, into its compile log (event ``gc``).

A full collection of the tokenizer manager after a large warm-up took 0.45 s on the GPU rig
(docs/first-hits.md): every request in flight waits for it, and nothing compiles.  With this
record ``audit`` can name it as the cause of a slow step (it attributes a collection to the
step whose time it overlaps), and the log shows where it fell.

The callback runs inside the collector, at any allocation of any thread: it takes no lock and
writes nothing, it only appends to a deque.  A daemon thread writes what it finds there about
once a second, through the installation's compile log (stamped with the phase at that moment;
``time`` is the collection's end).
"""

from __future__ import annotations

import collections
import gc
import threading
import time
from typing import Any

from warmup import settings

#: seconds between two writes of what was recorded
FLUSH_S = 1.0


class GcPauses:
    """The recorder of one installation (``events._Installation``)."""

    def __init__(self, inst: Any) -> None:
        self.inst = inst
        self.threshold_s = settings.GC_PAUSE_MS.get() / 1000.0
        self._pending: collections.deque = collections.deque(maxlen=10_000)
        self._started = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def install(self) -> None:
        if self.threshold_s <= 0:
            self.inst.add("gc.callbacks", "missing", "WARMUP_GC_PAUSE_MS=0: not recorded")
            return
        gc.callbacks.append(self._callback)
        self._thread = threading.Thread(target=self._flush_loop, name="sglang-warmup-gc",
                                        daemon=True)
        self._thread.start()
        self.inst.on_uninstall(self.uninstall)
        self.inst.add("gc.callbacks", "installed",
                      f"collections of {self.threshold_s * 1000:g} ms or more")

    def uninstall(self) -> None:
        try:
            gc.callbacks.remove(self._callback)
        except ValueError:
            pass
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self.flush()

    def _callback(self, phase: str, info: dict) -> None:
        # Inside the collector: no lock, no I/O, no allocation beyond one small tuple.
        if phase == "start":
            self._started = time.perf_counter()
            return
        took = time.perf_counter() - self._started
        if took >= self.threshold_s:
            self._pending.append((time.time(), info.get("generation"), took,
                                  info.get("collected")))

    def _flush_loop(self) -> None:
        while not self._stop.wait(FLUSH_S):
            self.flush()

    def flush(self) -> None:
        """Write what was recorded (never raises: a failure is counted)."""
        while self._pending:
            ended, generation, took, collected = self._pending.popleft()
            try:
                rec = self.inst.new_record("gc", self.inst.phase(), "python")
                rec.update(time=ended, generation=generation, duration_s=round(took, 6),
                           collected=collected)
                self.inst.write(rec)
            except Exception as exc:
                self.inst.failed("gc", exc)
