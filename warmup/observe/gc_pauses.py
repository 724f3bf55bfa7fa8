"""Long Python garbage collections of an SGLang process, into its compile log (event ``gc``).

A full collection of the tokenizer manager after a large warm-up took 0.45 s on the GPU rig
(docs/first-hits.md): every request in flight waits for it, and nothing compiles.  With this
record ``audit`` can name it as the cause of a slow step (it attributes a collection to the
step whose time it overlaps), and the log shows where it fell.

The callback runs inside the collector, at any allocation of any thread: it takes no lock and
writes nothing, it only appends to a deque.  A daemon thread writes what it finds there about
once a second, through the installation's compile log (stamped with the phase at that moment;
``time`` is the collection's end).  A process forked from one that records (Inductor's compile
workers) has no such thread: there the callback is taken off.
"""

from __future__ import annotations

import collections
import gc
import logging
import os
import threading
import time
import weakref

from cache_tools import compile_log
from warmup import settings
from warmup.errors import WarmupError
from warmup.observe.recorder import Recorder

logger = logging.getLogger("sglang_warmup.gc")

#: seconds between two writes of what was recorded
FLUSH_S = 1.0
_DEFAULT_MS = 20.0

_RECORDERS: "weakref.WeakSet[GcPauses]" = weakref.WeakSet()


def _off_in_child() -> None:
    # The writer thread does not survive a fork: nothing would ever write what the child queues.
    for recorder in list(_RECORDERS):
        recorder.detach()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_off_in_child)


def threshold_s() -> float:
    """WARMUP_GC_PAUSE_MS in seconds; a value that does not parse warns and keeps the default
    (it must not take the other recorders down with it)."""
    try:
        return max(0.0, settings.GC_PAUSE_MS.get()) / 1000.0
    except WarmupError as exc:
        logger.warning("sglang-warmup: %s; recording collections of %g ms or more",
                       exc.message, _DEFAULT_MS)
        return _DEFAULT_MS / 1000.0


class GcPauses:
    """Long garbage collections, for one installation."""

    def __init__(self, inst: Recorder) -> None:
        self.inst = inst
        self.threshold_s = threshold_s()
        self._pending: collections.deque = collections.deque(maxlen=10_000)
        self._started = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def install(self) -> None:
        if self.threshold_s <= 0:
            self.inst.add("gc.callbacks", "missing", "WARMUP_GC_PAUSE_MS=0: not recorded")
            return
        gc.callbacks.append(self._callback)
        _RECORDERS.add(self)
        self._thread = threading.Thread(target=self._flush_loop, name="sglang-warmup-gc",
                                        daemon=True)
        self._thread.start()
        self.inst.on_uninstall(self.uninstall)
        self.inst.add("gc.callbacks", "installed",
                      f"collections of {self.threshold_s * 1000:g} ms or more")

    def uninstall(self) -> None:
        self.detach()
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self.flush()

    def detach(self) -> None:
        """Take the callback off (and forget what it queued: a forked child)."""
        try:
            gc.callbacks.remove(self._callback)
        except ValueError:
            pass
        _RECORDERS.discard(self)
        if self._thread is not None and not self._thread.is_alive():
            self._pending.clear()

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
        while True:
            try:                            # the thread and uninstall may both be here
                ended, generation, took, collected = self._pending.popleft()
            except IndexError:
                return
            self.inst.note(compile_log.GC, compile_log.PYTHON, time=ended, generation=generation,
                           duration_s=round(took, 6), collected=collected)
