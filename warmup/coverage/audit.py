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

The two modes are :mod:`warmup.coverage.attribution`; what is read from ``/metrics``,
:mod:`warmup.coverage.counts`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

from cache_tools import atomic
from warmup.coverage.attribution import (Attribution, CompileLogAttribution,
                                         MetricsAttribution)
from warmup.coverage.classes import (KeyEvents, RecordError, read_amount, read_object,
                                     read_objects)
from warmup.coverage.counts import (COMPILE_METRIC, LOAD_METRIC, ServingCounts,  # noqa: F401
                                    gc_overlap_ms, parse_metrics, serving_counts)
from warmup.coverage.traffic import STEP_FIELDS, TrafficStep, parse_step
from warmup.errors import TransportError, WarmupError
from warmup.plan import step_record

if TYPE_CHECKING:  # an annotation only: the transport is imported when an audit runs
    from warmup.serve.transport import HttpTransport

logger = logging.getLogger("sglang_warmup.audit")

FORMAT = "sglang-warmup-audit"
VERSION = 1
#: A first pass this much slower than the second (and by more than SLOW_MIN_MS) is a cold step.
SLOW_RATIO = 1.5
SLOW_MIN_MS = 5.0
#: Request features, in the words the audit names a first use with.
FEATURE_WORDS = {"return_logprob": "logprobs", "logprob_start_len": "input logprobs",
                 "top_logprobs_num": "top logprobs", "token_ids_logprob": "token-id logprobs",
                 "n": "parallel sampling (n > 1)", "stop_token_ids": "stop token ids",
                 "stream": "streaming"}


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
    def from_json(cls, d: Any, where: str = "pass") -> "PassResult":
        """A pass read back from an audit file; RecordError names the field that is wrong."""
        d = read_object(d, where)
        return cls(ms=read_amount(d, "ms", where, float), misses=read_amount(d, "misses", where),
                   device_loads=read_amount(d, "device_loads", where),
                   keys=tuple(KeyEvents.from_json(k, f"{where}.keys[{i}]")
                              for i, k in enumerate(read_objects(d.get("keys"), f"{where}.keys"))),
                   gc_ms=read_amount(d, "gc_ms", where, float))


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

    @classmethod
    def from_json(cls, d: Any, where: str = "step") -> "StepAudit":
        """A step read back from an audit file: its shape as a traffic file's line, both passes
        checked; RecordError names the field that is wrong."""
        d = read_object(d, where)
        try:
            step = parse_step({k: d[k] for k in STEP_FIELDS if k in d}, where)
        except WarmupError as exc:
            raise RecordError(exc.message) from None
        return cls(index=read_amount(d, "index", where), step=step,
                   prefix_cached=d.get("prefix_cached") is True,
                   first=PassResult.from_json(d.get("pass1") or {}, f"{where}.pass1"),
                   second=PassResult.from_json(d.get("pass2") or {}, f"{where}.pass2"))

    def to_json(self) -> dict[str, Any]:
        return {"index": self.index, **self.step.to_json(), "prefix_cached": self.prefix_cached,
                "pass1": self.first.to_json(), "pass2": self.second.to_json(),
                "misses": self.misses, "slow_first": self.slow_first,
                "ratio": None if self.ratio is None else round(self.ratio, 3),
                "cause": self.cause}


@dataclass(frozen=True)
class AuditReport:
    """The outcome of one audit (JSON via :meth:`to_json`, read back by :meth:`from_json`; text
    and HTML in ``warmup/view/``).

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

    @property
    def quiet_ratios(self) -> list[float]:
        """First pass over second of the steps with nothing recorded (no compile, cache or
        device load in either pass): what the pass's speed alone made of them."""
        return [s.ratio for s in self.steps if s.ratio is not None and not s.misses
                and not any(p.keys or p.device_loads for p in (s.first, s.second))]

    @property
    def median_ratio(self) -> float | None:
        """The median of :attr:`quiet_ratios` (None when no step has nothing recorded)."""
        ratios = self.quiet_ratios
        return statistics.median(ratios) if ratios else None

    @property
    def drift_note(self) -> str:
        """What a first pass slower throughout (:func:`step_record.slower_throughout` of the
        steps with nothing recorded) means for its cold steps; empty otherwise."""
        ratios = self.quiet_ratios
        median = step_record.slower_throughout(ratios)
        if median is None:
            return ""
        return (f"the first pass ran slower throughout: a median {median:.2f}x its second over "
                f"the {len(ratios)} steps with nothing recorded; a cold step whose cause is 'none "
                "found' or a first use may owe most of its ratio to that (audit again on a "
                "quiet host to tell)")

    @property
    def all_notes(self) -> tuple[str, ...]:
        """The notes the audit wrote, then the drift note when there is one."""
        drift = self.drift_note
        return self.notes + ((drift,) if drift else ())

    def to_json(self) -> dict[str, Any]:
        return {"format": FORMAT, "version": VERSION, "created_at": self.created_at,
                "url": self.url, "traffic": self.traffic, "mode": self.mode,
                "mode_note": self.mode_note, "max_misses": self.max_misses,
                "misses": self.misses, "ok": self.ok,
                "steps_with_misses": [s.index for s in self.steps if s.misses],
                "slow_first": [s.index for s in self.steps if s.slow_first],
                "pass1_ms": round(sum(s.first.ms for s in self.steps), 1),
                "pass2_ms": round(sum(s.second.ms for s in self.steps), 1),
                "median_ratio": (None if self.median_ratio is None
                                 else round(self.median_ratio, 3)),
                "drift_note": self.drift_note,
                "steps": [s.to_json() for s in self.steps],
                "unattributed": [k.to_json() for k in self.unattributed],
                "unseen_events": self.unseen_events, "flushes": list(self.flushes),
                "notes": list(self.notes), "file": self.file, "facts": dict(self.facts)}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "AuditReport":
        """An audit read back from its file; RecordError names the field that is wrong (the
        caller names the file).  ``ok`` and the totals are computed again from the steps."""
        steps = tuple(StepAudit.from_json(s, f"steps[{i}]")
                      for i, s in enumerate(read_objects(d.get("steps"), "steps")))
        return cls(url=str(d.get("url") or ""), traffic=str(d.get("traffic") or ""),
                   mode=str(d.get("mode") or ""), mode_note=str(d.get("mode_note") or ""),
                   facts=dict(d["facts"]) if isinstance(d.get("facts"), Mapping) else {},
                   steps=steps, max_misses=read_amount(d, "max_misses", ""),
                   created_at=read_amount(d, "created_at", "", float),
                   unattributed=tuple(KeyEvents.from_json(k, f"unattributed[{i}]")
                                      for i, k in enumerate(read_objects(d.get("unattributed"),
                                                                         "unattributed"))),
                   unseen_events=read_amount(d, "unseen_events", ""),
                   flushes=_texts(d.get("flushes")), notes=_texts(d.get("notes")),
                   file=None if d.get("file") is None else str(d.get("file")))


def _texts(value: Any) -> tuple[str, ...]:
    return tuple(map(str, value)) if isinstance(value, list) else ()


def _prompts(step: TrafficStep, limit: int = 5) -> str:
    p = [str(n) for n in step.prompts]
    text = "+".join(p[:limit]) + ("+…" if len(p) > limit else "")
    if step.prefix_group:
        text += f" (prefix {step.prefix_len})"
    return text


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
        progress: Callable[[str], None] | None = None,
        transport: HttpTransport | None = None) -> AuditReport:
    """Audit ``steps`` against the ready server at ``url`` (see the module docstring)."""
    return asyncio.run(_Audit(url, list(steps), state_dir=state_dir, max_misses=max_misses,
                              traffic_name=traffic_name, timeout_s=timeout_s,
                              flush_timeout_s=flush_timeout_s, api_key=api_key, seed=seed,
                              progress=progress, transport=transport).run())


class _Audit:
    def __init__(self, url: str, steps: list[TrafficStep], *, state_dir: Any, max_misses: int,
                 traffic_name: str, timeout_s: float, flush_timeout_s: float,
                 api_key: str | None, seed: str, progress: Callable[[str], None] | None,
                 transport: HttpTransport | None) -> None:
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
        """Check the server, replay the sample twice under the attribution mode, build the
        report."""
        t = self.transport
        if not await asyncio.to_thread(t.health):
            raise TransportError(f"{self.url}/health_generate did not answer 200: the server is "
                                 "not ready", hint="wait until the server is ready, then audit")
        facts = await asyncio.to_thread(t.facts_sync)
        check_fits(self.steps, facts)
        attribution: Attribution = (
            CompileLogAttribution(t, self.state_dir, self.notes) if self.state_dir is not None
            else MetricsAttribution(t))
        await attribution.start()
        created = time.time()
        try:
            times, windows, flushes = await self._passes(attribution)
        finally:
            attribution.close()
        counted, unattributed, unseen = await attribution.results(times, windows, self.steps)
        passes = {seq: PassResult(ms=times[seq], **counts) for seq, counts in counted.items()}
        n = len(self.steps)
        results = tuple(StepAudit(index=i, step=s, prefix_cached=self._cached(i),
                                  first=passes[i], second=passes[n + i])
                        for i, s in enumerate(self.steps))
        return AuditReport(url=self.url, traffic=self.traffic_name, mode=attribution.mode,
                           mode_note=attribution.note, facts=facts.to_dict(), steps=results,
                           max_misses=self.max_misses, created_at=created,
                           unattributed=unattributed, unseen_events=unseen,
                           flushes=tuple(flushes), notes=tuple(self.notes))

    def _cached(self, i: int) -> bool:
        """Whether step ``i`` meets its prefix group already sent by an earlier step."""
        group = self.steps[i].prefix_group
        return bool(group) and any(s.prefix_group == group for s in self.steps[:i])

    async def _passes(self, attribution: Attribution
                      ) -> tuple[dict[int, float], dict[int, tuple[float, float]], list[str]]:
        """The sample sent twice (fresh token ids each pass, a flush after each): each step's
        milliseconds and wall-clock window by sequence number, and the flushes' answers."""
        t, n = self.transport, len(self.steps)
        times: dict[int, float] = {}
        windows: dict[int, tuple[float, float]] = {}
        flushes: list[str] = []
        base_salt = f"{int(time.time() * 1000)}"
        for number in (1, 2):
            t.tokens.salt = f"audit-{base_salt}-{number}"
            self.progress(f"sglang-warmup audit: pass {number} of 2, {n} steps")
            for i, step in enumerate(self.steps):
                seq = (number - 1) * n + i
                await attribution.before_step(seq, step)
                t0, wall = time.perf_counter(), time.time()
                try:
                    await t.send(step.to_step(i))
                except TransportError as exc:
                    raise TransportError(f"audit pass {number}, step {i} "
                                         f"({step.label or step.kind}: {step.kind} "
                                         f"{_prompts(step)}): {exc.message}",
                                         hint=exc.hint) from None
                times[seq] = (time.perf_counter() - t0) * 1000
                windows[seq] = (wall, wall + times[seq] / 1000)
                await attribution.after_step(seq)
            attribution.end_pass()
            flushes.append(await t.flush(self.flush_timeout_s))
        return times, windows, flushes


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
