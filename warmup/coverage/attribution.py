"""How an audit ties each compile to the traffic step that caused it: one object per mode.

* :class:`CompileLogAttribution` (the server shares its state directory): the phase file names
  the step in flight, and the compile log's records written during the audit carry it.
* :class:`MetricsAttribution` (no shared directory): ``/metrics`` read before and after every
  step; counts only.

Both answer the same five calls of the audit's run loop: ``start``, ``before_step``,
``after_step``, ``end_pass`` / ``close`` and ``results``.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, Protocol, Sequence

from cache_tools import compile_log
from cache_tools.compile_log import is_compile_event
from warmup.coverage.classes import KeyEvents, aggregate
from warmup.coverage.counts import ServingCounts, gc_overlap_ms, serving_counts
from warmup.coverage.traffic import TrafficStep
from warmup.errors import WarmupError
from warmup.observe import gc_pauses
from warmup.observe import phase as phase_mod

CLASS_PREFIX = "audit:"


class Attribution(Protocol):
    """One attribution mode, as the audit's run loop uses it."""

    mode: str
    note: str

    async def start(self) -> None: ...

    async def before_step(self, seq: int, step: TrafficStep) -> None: ...

    async def after_step(self, seq: int) -> None: ...

    def end_pass(self) -> None: ...

    def close(self) -> None: ...

    async def results(self, times: dict[int, float], windows: dict[int, tuple[float, float]],
                      steps: Sequence[TrafficStep]
                      ) -> tuple[dict[int, dict[str, Any]], tuple[KeyEvents, ...], int]:
        """Per sequence number the step's counts (``misses``, ``device_loads`` and, with kernel
        names, ``keys`` and ``gc_ms``), the records no step caused, and the serving compile
        events /metrics counted that the records lack."""


def label(step: TrafficStep) -> str:
    """The phase file's class of an audit step."""
    return CLASS_PREFIX + (step.label or step.kind)


class MetricsAttribution:
    """``/metrics`` deltas of the serving compile events per step (no kernel names)."""

    mode = "metrics"
    note = ("/metrics deltas of sglang_warmup_compile_events_total{phase=\"serving\"} per step "
            "(coarser: counts only, no kernel names; anything else the server does meanwhile is "
            "counted; pass --state-dir for exact attribution)")

    def __init__(self, transport: Any) -> None:
        self.transport = transport
        self.counted: dict[int, tuple[int, int]] = {}
        self._prev: ServingCounts | None = None

    async def start(self) -> None:
        await asyncio.to_thread(serving_counts, self.transport)  # the server exports them

    async def before_step(self, seq: int, step: TrafficStep) -> None:
        self._prev = await asyncio.to_thread(serving_counts, self.transport)

    async def after_step(self, seq: int) -> None:
        after = await asyncio.to_thread(serving_counts, self.transport)
        assert self._prev is not None
        self.counted[seq] = (int(round(after.compile_events - self._prev.compile_events)),
                             int(round(after.kernel_loads - self._prev.kernel_loads)))

    def end_pass(self) -> None:
        pass

    def close(self) -> None:
        pass

    async def results(self, times: dict[int, float], windows: dict[int, tuple[float, float]],
                      steps: Sequence[TrafficStep]
                      ) -> tuple[dict[int, dict[str, Any]], tuple[KeyEvents, ...], int]:
        counts = {seq: {"misses": max(0, self.counted[seq][0]),
                        "device_loads": max(0, self.counted[seq][1])}
                  for seq in range(2 * len(steps))}
        return counts, (), 0


class CompileLogAttribution:
    """The server's compile log, each record naming the audit step in flight."""

    mode = "compile_log"

    def __init__(self, transport: Any, state_dir: Path, notes: list[str]) -> None:
        self.transport, self.state_dir, self.notes = transport, state_dir, notes
        self.note = (f"compile log in {state_dir} (each compile, load and JIT build names its "
                     "step, kernel and hash)")
        self.cursor = compile_log.Cursor(state_dir)
        self.mark: dict[str, int] = {}
        self.before: ServingCounts | None = None

    async def start(self) -> None:
        if not self.state_dir.is_dir():
            raise WarmupError(f"--state-dir {self.state_dir}: no such directory",
                              hint="pass the server's WARMUP_STATE_DIR (`sglang-warmup serve "
                                   "--state-dir`), or leave it out to count from /metrics")
        now = phase_mod.current(state_dir=self.state_dir)
        if now.phase == "warmup":
            raise WarmupError(f"the phase file in {self.state_dir} says the server is still "
                              f"warming up ({now.shape_class})",
                              hint="wait until the server is ready, then audit")
        self.mark = self.cursor.mark()
        try:  # a cross-check, when the server also exports metrics
            self.before = await asyncio.to_thread(serving_counts, self.transport)
        except WarmupError:
            self.before = None

    async def before_step(self, seq: int, step: TrafficStep) -> None:
        phase_mod.set_phase("serving", label(step), seq, state_dir=self.state_dir)

    async def after_step(self, seq: int) -> None:
        pass

    def end_pass(self) -> None:
        phase_mod.set_phase("serving", state_dir=self.state_dir)

    def close(self) -> None:
        # The server is ready: later compiles belong to no audit step.  A phase file that
        # cannot be written is logged by set_phase (the audit's result stands).
        phase_mod.set_phase("serving", state_dir=self.state_dir)

    async def results(self, times: dict[int, float], windows: dict[int, tuple[float, float]],
                      steps: Sequence[TrafficStep]
                      ) -> tuple[dict[int, dict[str, Any]], tuple[KeyEvents, ...], int]:
        # The servers write a collection's record up to gc_pauses.FLUSH_S after it ended.
        await asyncio.sleep(1.5 * gc_pauses.FLUSH_S)
        records = self.cursor.read(self.mark)
        by_seq, other = self._by_step(records, steps)
        pauses = [r for r in records if r.get("event") == compile_log.GC]
        counts = {}
        for seq in range(2 * len(steps)):
            rs = by_seq.get(seq, [])
            counts[seq] = {"misses": sum(1 for r in rs if is_compile_event(r)),
                           "device_loads": sum(1 for r in rs
                                               if r.get("event") == compile_log.LOAD),
                           "keys": tuple(aggregate(rs)),
                           "gc_ms": gc_overlap_ms(pauses, *windows[seq])}
        unseen = await self._unseen(records)
        return counts, tuple(aggregate(other)), unseen

    @staticmethod
    def _by_step(records: list[dict], steps: Sequence[TrafficStep]
                 ) -> tuple[dict[int, list[dict]], list[dict]]:
        """The kernel records of each audit step (by sequence number), and the others."""
        n = len(steps)
        by_seq: dict[int, list[dict]] = {}
        other: list[dict] = []
        for r in records:
            if r.get("event") not in compile_log.KERNEL_EVENTS:
                continue
            seq, cls = r.get("request"), r.get("shape_class")
            if (r.get("phase") == "serving" and isinstance(seq, int) and 0 <= seq < 2 * n
                    and cls == label(steps[seq % n])):
                by_seq.setdefault(seq, []).append(r)
            else:
                other.append(r)
        return by_seq, other

    async def _unseen(self, records: list[dict]) -> int:
        """Serving compile events /metrics counted that the compile log lacks (a state
        directory that is not the server's)."""
        if self.before is None:
            return 0
        try:
            after = await asyncio.to_thread(serving_counts, self.transport)
        except WarmupError:
            return 0
        metric_events = int(round(after.compile_events - self.before.compile_events))
        logged = sum(1 for r in records
                     if r.get("phase") == "serving" and is_compile_event(r)
                     and not (r.get("event") == compile_log.JIT_BUILD
                              and r.get("outcome") == compile_log.FAILED))
        unseen = max(0, metric_events - logged)
        if unseen:
            self.notes.append(f"/metrics counted {unseen} more serving compile event(s) than the "
                              f"compile log in {self.state_dir} recorded: the server may not "
                              "write to this state directory (they count as misses)")
        return unseen
