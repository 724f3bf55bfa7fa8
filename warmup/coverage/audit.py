"""Audit: replay a traffic sample against a ready server and attribute every compile it causes
after ready to the traffic step that caused it.

The sample is sent twice (fresh token ids each time, the radix cache flushed between), so each
step has a first-hit latency and a steady-state latency.  Attribution has two modes:

* ``compile_log`` (the server shares its state directory with us): before each step the phase
  file says ``serving`` with ``shape_class = audit:<step label>`` and ``request = <sequence>``
  (pass 1: 0..N-1, pass 2: N..2N-1), so the server's compile log names, for each compile,
  disk-cache load, device load and JIT build, the step that caused it, with kernel and hash.
  Only compile-log bytes written during this audit are read (offsets, not clocks).
* ``metrics`` (no shared state directory): the server's ``/metrics`` is read before and after
  every step, and the delta of ``sglang_warmup_compile_events_total{phase="serving"}`` is the
  step's count.  No kernel names; anything else the server does meanwhile is counted too.

The result is written to ``audit-<time>.json`` (steps with their shapes, latencies and misses),
which ``sglang-warmup learn`` turns into plan classes.

Longer than 500 lines: the audit file's types, its two attribution modes and its one run loop
read one another's state; split, the run loop would reach into three modules.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from warmup.observe import gc_pauses
from warmup.observe import phase as phase_mod
from cache_tools import atomic, compile_log
from cache_tools.compile_log import is_compile_event
from warmup.coverage.classes import KeyEvents, aggregate
from warmup.errors import TransportError, WarmupError
from cache_tools.render import table
from warmup.coverage.traffic import TrafficStep
from warmup.serve.http import snippet
from warmup.serve.report import as_number

logger = logging.getLogger("sglang_warmup.audit")

FORMAT = "sglang-warmup-audit"
VERSION = 1
CLASS_PREFIX = "audit:"
#: A first pass this much slower than the second (and by more than SLOW_MIN_MS) is a cold step.
SLOW_RATIO = 1.5
SLOW_MIN_MS = 5.0
#: Request features, in the words the audit names a first use with.
FEATURE_WORDS = {"return_logprob": "logprobs", "logprob_start_len": "input logprobs",
                 "top_logprobs_num": "top logprobs", "token_ids_logprob": "token-id logprobs",
                 "n": "parallel sampling (n > 1)", "stop_token_ids": "stop token ids",
                 "stream": "streaming"}
COMPILE_METRIC = "sglang_warmup_compile_events"
LOAD_METRIC = "sglang_warmup_kernel_loads"


@dataclass(frozen=True)
class PassResult:
    """One step in one pass: wall time of the step (ms), compile events attributed to it
    (``misses``), device loads, the compile keys, and the time long garbage collections of the
    server overlapped the step (``gc_ms``) (the last two in compile_log mode only)."""

    ms: float
    misses: int = 0
    device_loads: int = 0
    keys: tuple[KeyEvents, ...] = ()
    gc_ms: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {"ms": round(self.ms, 2), "misses": self.misses, "device_loads": self.device_loads,
                "keys": [k.to_json() for k in self.keys], "gc_ms": round(self.gc_ms, 2)}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "PassResult":
        return cls(ms=float(d.get("ms") or 0.0), misses=int(d.get("misses") or 0),
                   device_loads=int(d.get("device_loads") or 0),
                   keys=tuple(KeyEvents.from_json(k) for k in d.get("keys") or ()),
                   gc_ms=float(d.get("gc_ms") or 0.0))


@dataclass(frozen=True)
class StepAudit:
    """One traffic step: its shape, whether its prefix group was already cached in that pass
    (an earlier step of the same pass used the group), and both passes."""

    index: int
    step: TrafficStep
    prefix_cached: bool
    first: PassResult
    second: PassResult

    @property
    def misses(self) -> int:
        return self.first.misses + self.second.misses

    @property
    def slow_first(self) -> bool:
        return (self.first.ms > SLOW_RATIO * self.second.ms
                and self.first.ms - self.second.ms > SLOW_MIN_MS)

    @property
    def ratio(self) -> float | None:
        """First pass over second pass (None when the second took no time)."""
        return self.first.ms / self.second.ms if self.second.ms > 0 else None

    @property
    def cause(self) -> str:
        """What the audit can see behind a slow first pass: ``compile`` (a kernel compiled or
        JIT-built for this step), ``cache load`` (loaded from the disk cache), ``kernel load``
        (a first launch on the device), ``garbage collection (N ms)`` (the server's long
        collections overlapped the step for at least half of its extra time), ``first use of
        …`` (request features this step was the first to send, e.g. logprobs or n > 1), or
        ``none found``; empty when the step was not slow."""
        if not self.slow_first:
            return ""
        keys = self.first.keys
        if any(k.compiled for k in keys):
            return "compile"
        if any(k.disk_hits for k in keys):
            return "cache load"
        if self.first.device_loads or any(k.device_loads for k in keys):
            return "kernel load"
        if self.first.gc_ms and self.first.gc_ms >= 0.5 * (self.first.ms - self.second.ms):
            return f"garbage collection ({self.first.gc_ms:.0f} ms)"
        # logprob_start_len 0 (input logprobs from the first token) counts; other zeros do not
        features = [FEATURE_WORDS[k] for k, v in sorted(self.step.features.items())
                    if k in FEATURE_WORDS and v is not False
                    and (v is True or v > 0 or k == "logprob_start_len")]
        if features:
            return "first use of " + ", ".join(dict.fromkeys(features))
        return "none found"

    def to_json(self) -> dict[str, Any]:
        return {"index": self.index, **self.step.to_json(), "prefix_cached": self.prefix_cached,
                "pass1": self.first.to_json(), "pass2": self.second.to_json(),
                "misses": self.misses, "slow_first": self.slow_first,
                "ratio": None if self.ratio is None else round(self.ratio, 3),
                "cause": self.cause}


@dataclass(frozen=True)
class AuditReport:
    """The outcome of one audit (JSON via :meth:`to_json`, text via :meth:`render`).

    ``unattributed``: compile keys recorded during the audit that carry no audit step (other
    traffic, or a server process that does not read our phase file).  ``unseen_events``:
    serving compile events that ``/metrics`` counted during the audit but the compile log did not
    record (compile_log mode; nonzero means the state directory is not the server's).
    """

    url: str
    traffic: str
    mode: str
    mode_note: str
    facts: Mapping[str, Any]
    steps: tuple[StepAudit, ...]
    max_misses: int
    created_at: float
    unattributed: tuple[KeyEvents, ...] = ()
    unseen_events: int = 0
    flushes: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    file: str | None = None

    @property
    def misses(self) -> int:
        """Compile events during the audit: attributed, unattributed and unseen."""
        return (sum(s.misses for s in self.steps) + sum(k.events for k in self.unattributed)
                + self.unseen_events)

    @property
    def ok(self) -> bool:
        return self.misses <= self.max_misses

    def to_json(self) -> dict[str, Any]:
        return {"format": FORMAT, "version": VERSION, "created_at": self.created_at,
                "url": self.url, "traffic": self.traffic, "mode": self.mode,
                "mode_note": self.mode_note, "max_misses": self.max_misses,
                "misses": self.misses, "ok": self.ok,
                "steps_with_misses": [s.index for s in self.steps if s.misses],
                "slow_first": [s.index for s in self.steps if s.slow_first],
                "pass1_ms": round(sum(s.first.ms for s in self.steps), 1),
                "pass2_ms": round(sum(s.second.ms for s in self.steps), 1),
                "steps": [s.to_json() for s in self.steps],
                "unattributed": [k.to_json() for k in self.unattributed],
                "unseen_events": self.unseen_events, "flushes": list(self.flushes),
                "notes": list(self.notes), "file": self.file, "facts": dict(self.facts)}

    def render(self) -> str:
        n = len(self.steps)
        missed = [s for s in self.steps if s.misses]
        head = [f"audit of {self.url}: {n} traffic steps from {self.traffic}, sent twice "
                f"(pass 1 {sum(s.first.ms for s in self.steps):,.0f} ms, pass 2 "
                f"{sum(s.second.ms for s in self.steps):,.0f} ms)",
                f"attribution: {self.mode_note}",
                f"post-ready misses: {self.misses} compile event(s)"
                + (f" in {len(missed)} step(s)" if missed else "")
                + f"; --max-misses {self.max_misses}: {'ok' if self.ok else 'FAILED'}"]
        shown = [s for s in self.steps if s.misses or s.slow_first]
        if shown:
            rows = []
            for s in shown:
                keys = ", ".join(dict.fromkeys(k.name for k in s.first.keys + s.second.keys))
                rows.append([s.index, s.step.label or s.step.kind, s.step.kind,
                             _prompts(s.step), round(s.first.ms, 1), round(s.second.ms, 1),
                             round(s.ratio, 1) if s.ratio is not None else None,
                             s.first.misses, s.second.misses, s.cause or "-", keys or "-"])
            head.append(table(["step", "label", "kind", "prompts", "pass 1 ms", "pass 2 ms",
                               "x", "miss 1", "miss 2", "slow because", "kernels"], rows,
                              align="rllrrrrrrll"))
        quiet = n - len(shown)
        if quiet:
            head.append(f"{quiet} other step(s): no misses, first pass within "
                        f"{SLOW_RATIO:g}x of the second")
        for s in missed:
            for number, p in ((1, s.first), (2, s.second)):
                for k in p.keys:
                    head.append(f"  miss: step {s.index} {s.step.label or s.step.kind} pass "
                                f"{number}: {k.compiler} {k.label}: {k.what()}"
                                + (f" in {k.processes} processes" if k.processes > 1 else "")
                                + (f", {k.seconds:.2f} s" if k.seconds else ""))
        for k in self.unattributed:
            head.append(f"  unattributed: {k.compiler} {k.label}: {k.what()}")
        if self.unseen_events:
            head.append(f"  /metrics counted {self.unseen_events} serving compile event(s) the "
                        "compile log did not record")
        for note in self.notes:
            head.append(f"note: {note}")
        if self.file:
            head.append(f"audit file: {self.file}")
        return "\n".join(head)


def _prompts(step: TrafficStep, limit: int = 5) -> str:
    p = [str(n) for n in step.prompts]
    text = "+".join(p[:limit]) + ("+…" if len(p) > limit else "")
    if step.prefix_group:
        text += f" (prefix {step.prefix_len})"
    return text


# --------------------------------------------------------------------------------------------
# /metrics
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ServingCounts:
    """Serving-phase totals read from ``/metrics``: compile events and device loads."""

    compile_events: float
    kernel_loads: float


def parse_metrics(text: str) -> ServingCounts | None:
    """Serving compile events and kernel loads from Prometheus text; None when the text has no
    ``sglang_warmup_`` metric at all (the server does not run our hooks)."""
    from prometheus_client.parser import text_string_to_metric_families

    found = False
    events = loads = 0.0
    try:
        families = list(text_string_to_metric_families(text))
    except ValueError as exc:
        raise WarmupError(f"/metrics is not Prometheus text: {exc}",
                          hint="is --url an SGLang server started with --enable-metrics?") from None
    for fam in families:
        if not fam.name.startswith("sglang_warmup_"):
            continue
        found = True
        for s in fam.samples:
            if s.labels.get("phase") != "serving":
                continue
            if fam.name == COMPILE_METRIC and s.name == COMPILE_METRIC + "_total":
                events += as_number(s.value)
            elif fam.name == LOAD_METRIC and s.name == LOAD_METRIC + "_total":
                loads += as_number(s.value)
    return ServingCounts(events, loads) if found else None


def _read_metrics(transport: Any) -> tuple[int, str]:
    status, payload = transport.client.request("GET", "/metrics", retry=True, timeout=30)
    return status, payload.decode(errors="replace")


def serving_counts(transport: Any) -> ServingCounts:
    """The server's serving-phase totals; errors say how to make them available."""
    status, text = _read_metrics(transport)
    if status == 404:
        raise WarmupError(f"{transport.url}/metrics: not found (HTTP 404)",
                          hint="start SGLang with --enable-metrics, or pass --state-dir with the "
                               "server's state directory")
    if status != 200:
        raise TransportError(f"{transport.url}/metrics answered HTTP {status}: {snippet(text)}",
                             hint=transport.client.hint(status))
    counts = parse_metrics(text)
    if counts is None:
        raise WarmupError(f"{transport.url}/metrics has no sglang_warmup_ metrics",
                          hint="start the server with `sglang-warmup serve` (or WARMUP_ENABLE=1) "
                               "so compile events are counted, or pass --state-dir")
    return counts


# --------------------------------------------------------------------------------------------
# the audit
# --------------------------------------------------------------------------------------------

def check_fits(steps: Sequence[TrafficStep], facts: Any) -> None:
    """Refuse a sample the server would reject (a prompt longer than it accepts)."""
    limit = facts.max_input_len
    ctx = facts.context_length
    for i, s in enumerate(steps):
        for n in s.prompts:
            if limit is not None and n > limit:
                raise WarmupError(f"traffic step {i} ({s.label or s.kind}): a {n}-token prompt is "
                                  f"above the server's longest prompt ({limit})",
                                  hint="regenerate the sample with a smaller --max-prompt")
            if ctx is not None and n + s.max_new_tokens > ctx:
                raise WarmupError(f"traffic step {i} ({s.label or s.kind}): {n}+{s.max_new_tokens} "
                                  f"tokens is above the context length ({ctx})",
                                  hint="regenerate the sample with a smaller --max-prompt")


def run(url: str, steps: Sequence[TrafficStep], *, state_dir: str | os.PathLike[str] | None = None,
        max_misses: int = 0, traffic_name: str = "", timeout_s: float = 600.0,
        flush_timeout_s: float = 60.0, api_key: str | None = None, seed: str = "audit",
        progress: Callable[[str], None] | None = None, transport: Any = None) -> AuditReport:
    """Audit ``steps`` against the ready server at ``url`` (see the module docstring)."""
    return asyncio.run(_Audit(url, list(steps), state_dir=state_dir, max_misses=max_misses,
                              traffic_name=traffic_name, timeout_s=timeout_s,
                              flush_timeout_s=flush_timeout_s, api_key=api_key, seed=seed,
                              progress=progress, transport=transport).run())


class _Audit:
    def __init__(self, url: str, steps: list[TrafficStep], *, state_dir: Any, max_misses: int,
                 traffic_name: str, timeout_s: float, flush_timeout_s: float,
                 api_key: str | None, seed: str, progress: Callable[[str], None] | None,
                 transport: Any) -> None:
        from warmup.serve.transport import HttpTransport

        if not steps:
            raise WarmupError("the traffic sample has no steps",
                              hint="`sglang-warmup traffic synth` writes a sample")
        if max_misses < 0:
            raise WarmupError(f"--max-misses must be >= 0, got {max_misses}", hint="")
        self.transport = transport or HttpTransport(url, timeout_s=timeout_s, api_key=api_key,
                                                    seed=seed)
        self.url = self.transport.url
        self.steps = steps
        self.state_dir = Path(state_dir) if state_dir else None
        self.max_misses = max_misses
        self.traffic_name = traffic_name
        self.flush_timeout_s = flush_timeout_s
        self.progress = progress or (lambda line: logger.info("%s", line))
        self.notes: list[str] = []

    async def run(self) -> AuditReport:
        t = self.transport
        if not await asyncio.to_thread(t.health):
            raise TransportError(f"{self.url}/health_generate did not answer 200: the server is "
                                 "not ready", hint="wait until the server is ready, then audit")
        facts = await asyncio.to_thread(t.facts_sync)
        check_fits(self.steps, facts)
        cursor = mark = None
        before: ServingCounts | None = None
        if self.state_dir is not None:
            if not self.state_dir.is_dir():
                raise WarmupError(f"--state-dir {self.state_dir}: no such directory",
                                  hint="pass the server's WARMUP_STATE_DIR (`sglang-warmup serve "
                                       "--state-dir`), or leave it out to count from /metrics")
            now = phase_mod.current(state_dir=self.state_dir)
            if now.phase == "warmup":
                raise WarmupError(f"the phase file in {self.state_dir} says the server is still "
                                  f"warming up ({now.shape_class})",
                                  hint="wait until the server is ready, then audit")
            mode = "compile_log"
            mode_note = (f"compile log in {self.state_dir} (each compile, load and JIT build "
                         "names its step, kernel and hash)")
            cursor = compile_log.Cursor(self.state_dir)
            mark = cursor.mark()
            try:  # a cross-check, when the server also exports metrics
                before = await asyncio.to_thread(serving_counts, t)
            except WarmupError:
                before = None
        else:
            mode = "metrics"
            mode_note = ("/metrics deltas of sglang_warmup_compile_events_total{phase=\"serving\"} "
                         "per step (coarser: counts only, no kernel names; anything else the "
                         "server does meanwhile is counted; pass --state-dir for exact attribution)")
            before = await asyncio.to_thread(serving_counts, t)

        n = len(self.steps)
        times: dict[int, float] = {}
        windows: dict[int, tuple[float, float]] = {}
        counted: dict[int, tuple[int, int]] = {}
        cached: dict[int, bool] = {}
        flushes: list[str] = []
        base_salt = f"{int(time.time() * 1000)}"
        created = time.time()
        try:
            for number in (1, 2):
                t.tokens.salt = f"audit-{base_salt}-{number}"
                seen: set[str] = set()
                self.progress(f"sglang-warmup audit: pass {number} of 2, {n} steps")
                for i, step in enumerate(self.steps):
                    seq = (number - 1) * n + i
                    if number == 1:
                        cached[i] = bool(step.prefix_group and step.prefix_group in seen)
                    if step.prefix_group:
                        seen.add(step.prefix_group)
                    prev = None
                    if mode == "compile_log":
                        phase_mod.set_phase("serving", CLASS_PREFIX + (step.label or step.kind), seq,
                                            state_dir=self.state_dir)
                    else:
                        prev = await asyncio.to_thread(serving_counts, t)
                    t0 = time.perf_counter()
                    wall = time.time()
                    try:
                        await t.send(step.to_step(i))
                    except TransportError as exc:
                        raise TransportError(f"audit pass {number}, step {i} "
                                             f"({step.label or step.kind}: {step.kind} "
                                             f"{_prompts(step)}): {exc.message}",
                                             hint=exc.hint) from None
                    times[seq] = (time.perf_counter() - t0) * 1000
                    windows[seq] = (wall, wall + times[seq] / 1000)
                    if prev is not None:
                        after = await asyncio.to_thread(serving_counts, t)
                        counted[seq] = (int(round(after.compile_events - prev.compile_events)),
                                        int(round(after.kernel_loads - prev.kernel_loads)))
                if mode == "compile_log":
                    phase_mod.set_phase("serving", state_dir=self.state_dir)
                flushes.append(await t.flush(self.flush_timeout_s))
        finally:
            if mode == "compile_log":
                try:  # the server is ready: later compiles belong to no audit step
                    phase_mod.set_phase("serving", state_dir=self.state_dir)
                except Exception as exc:
                    logger.warning("sglang-warmup: could not reset the phase file: %s", exc)

        unattributed: tuple[KeyEvents, ...] = ()
        unseen = 0
        passes: dict[int, PassResult]
        if mode == "compile_log":
            assert cursor is not None and mark is not None
            # The servers write a collection's record up to gc_pauses.FLUSH_S after it ended.
            await asyncio.sleep(1.5 * gc_pauses.FLUSH_S)
            records = cursor.read(mark)
            by_seq: dict[int, list[dict]] = {}
            other: list[dict] = []
            pauses = [r for r in records if r.get("event") == compile_log.GC]
            for r in records:
                if r.get("event") not in compile_log.KERNEL_EVENTS:
                    continue
                seq = r.get("request")
                cls = r.get("shape_class")
                if (r.get("phase") == "serving" and isinstance(cls, str)
                        and cls.startswith(CLASS_PREFIX) and isinstance(seq, int)
                        and 0 <= seq < 2 * n and cls == CLASS_PREFIX + (self.steps[seq % n].label
                                                                        or self.steps[seq % n].kind)):
                    by_seq.setdefault(seq, []).append(r)
                else:
                    other.append(r)
            passes = {}
            for seq in range(2 * n):
                rs = by_seq.get(seq, [])
                passes[seq] = PassResult(ms=times[seq], misses=sum(1 for r in rs if is_compile_event(r)),
                                         device_loads=sum(1 for r in rs if r.get("event") == compile_log.LOAD),
                                         keys=tuple(aggregate(rs)),
                                         gc_ms=gc_overlap_ms(pauses, *windows[seq]))
            unattributed = tuple(aggregate(other))
            if before is not None:
                try:
                    after = await asyncio.to_thread(serving_counts, t)
                    metric_events = int(round(after.compile_events - before.compile_events))
                    logged_events = sum(1 for r in records
                                          if r.get("phase") == "serving" and is_compile_event(r)
                                          and not (r.get("event") == compile_log.JIT_BUILD
                                                   and r.get("outcome") == compile_log.FAILED))
                    unseen = max(0, metric_events - logged_events)
                except WarmupError:
                    pass
            if unseen:
                self.notes.append(f"/metrics counted {unseen} more serving compile event(s) than "
                                  f"the compile log in {self.state_dir} recorded: the server may not "
                                  "write to this state directory (they count as misses)")
        else:
            passes = {seq: PassResult(ms=times[seq], misses=max(0, counted[seq][0]),
                                      device_loads=max(0, counted[seq][1]))
                      for seq in range(2 * n)}
        results = tuple(StepAudit(index=i, step=s, prefix_cached=cached[i], first=passes[i],
                                  second=passes[n + i]) for i, s in enumerate(self.steps))
        return AuditReport(url=self.url, traffic=self.traffic_name, mode=mode, mode_note=mode_note,
                           facts=facts.to_dict(), steps=results, max_misses=self.max_misses,
                           created_at=created, unattributed=unattributed, unseen_events=unseen,
                           flushes=tuple(flushes), notes=tuple(self.notes))


def gc_overlap_ms(pauses: Sequence[Mapping[str, Any]], start: float, end: float) -> float:
    """Milliseconds of the window ``start``-``end`` (wall clock) during which at least one of the
    recorded garbage collections (compile-log ``gc`` records: ``time`` their end,
    ``duration_s``) ran: collections of several processes at once count once."""
    spans = []
    for r in pauses:
        ended, took = as_number(r.get("time")), as_number(r.get("duration_s"))
        lo, hi = max(start, ended - took), min(end, ended)
        if hi > lo:
            spans.append((lo, hi))
    total, reach = 0.0, start
    for lo, hi in sorted(spans):
        if hi > reach:
            total += hi - max(lo, reach)
            reach = hi
    return total * 1000


# --------------------------------------------------------------------------------------------
# the audit file
# --------------------------------------------------------------------------------------------

def write(report: AuditReport, out: str | os.PathLike[str] | None = None) -> AuditReport:
    """Write ``audit-<time>.json`` into ``out`` (a directory, or a ``.json`` file path);
    returns the report with ``file`` set.  The write is atomic."""
    stamp = time.strftime("%Y%m%dT%H%M%S", time.localtime(report.created_at))
    stamp += f"-{int(report.created_at * 1000) % 1000:03d}"
    target = Path(out) if out is not None else Path.cwd()
    if target.suffix == ".json" and not target.is_dir():
        path = target
    else:
        path = target / f"audit-{stamp}.json"
    from dataclasses import replace

    done = replace(report, file=str(path))
    try:
        atomic.write_text(path, json.dumps(done.to_json(), indent=1) + "\n")
    except OSError as exc:
        raise WarmupError(f"cannot write the audit file {path}: {exc.strerror or exc}",
                          hint="pass a writable --out directory") from None
    return done
