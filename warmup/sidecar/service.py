"""The sidecar: a readiness gate for an SGLang server started by someone else.

It waits for the server's ``/health_generate`` (bounded exponential backoff, a stated deadline),
reads ``/server_info``, expands the plan against those facts, drives it over HTTP (the
:class:`~warmup.serve.driver.Driver` over :class:`SidecarTransport`), lets the driver flush, and serves
on its own port:

* ``/ready``: 200 once the warm-up succeeded (with ``second_pass``: once a second pass of the
  plan compiled nothing); 503 before, after a failure, and while the server is away;
* ``/live``: 200 while the sidecar's own work loop runs;
* ``/metrics``: the sidecar's state, plus the SGLang processes' compile metrics when they share
  the Prometheus multiprocess directory;
* ``/report``: the status document (state, reason, timeline, run reports, projection) as JSON.

After a success it keeps watching ``/health``: a server that stops answering (a restart) turns
``/ready`` back to 503, and the warm-up runs again once the server is back.  After a failure the
exit policy decides: ``exit_on_failure`` ends the process with status 1; otherwise the sidecar
stays, keeps ``/ready`` at 503 with the reason, and tries again only after the server restarts.

Runs as its own process (a container next to SGLang) or as SGLang's managed sidecar
(``--sidecar warmup.sidecar.service --sidecar-args '[...]'``) through :func:`main`.  Imports neither
torch, Triton nor SGLang, so it fits a slim image.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import socket
import threading
import time
import urllib.parse
from collections import deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

from warmup.plan import loader
from warmup.observe import phase as phase_mod
from cache_tools import compile_log
from cache_tools.compile_log import is_miss, kernel_name
from warmup.serve.driver import Driver, RunReport
from warmup.errors import SidecarError, TransportError, WarmupError
from warmup.plan.model import Expansion, Plan, WarmupStep, expand
from warmup.serve.http import HttpClient, Probe, wait_for_health
from warmup.serve.transport import HttpTransport, Outcome

logger = logging.getLogger("sglang_warmup.sidecar")

DEFAULT_PORT = 8090
#: The sidecar's states, in the order a successful start goes through them.
STATES: tuple[str, ...] = ("starting", "waiting", "warming", "verifying", "ready", "failed",
                           "stopped")
ENDPOINTS: tuple[str, ...] = ("/ready", "/live", "/metrics", "/report")
_TIMELINE_MAX = 500  # events kept for /report


# --- the startup-budget projection ------------------------------------------------------------
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
                 f"{_clock(now + self.remaining_s)}")
        margin = self.margin_s
        if margin is None:
            return text + " (no startup budget given)"
        end = _clock(now + (self.budget_left_s or 0.0))
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


def _clock(t: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(t))


class _Pacer:
    """Counts the requests sent and logs the projection at most every ``every_s`` seconds."""

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


# --- the transport ------------------------------------------------------------------------------
class SidecarTransport(HttpTransport):
    """HttpTransport with the sidecar's bounds (``/server_info`` and ``/flush_cache`` within
    stated timeouts), every step counted for the projection and refused once the sidecar is
    stopping."""

    def __init__(self, url: str, *, request_timeout_s: float, info_timeout_s: float = 30.0,
                 flush_slack_s: float = 10.0, seed: str = "0", api_key: str | None = None,
                 stop: threading.Event | None = None) -> None:
        super().__init__(url, timeout_s=request_timeout_s, retries=2, backoff_s=0.5, seed=seed,
                         api_key=api_key, info_timeout_s=info_timeout_s,
                         flush_slack_s=flush_slack_s)
        self.stop = stop
        self.pacer: _Pacer | None = None

    async def send(self, step: WarmupStep) -> list[Outcome]:
        if self.stop is not None and self.stop.is_set():
            raise TransportError("the sidecar is stopping", hint="")
        try:
            return await super().send(step)
        finally:
            if self.pacer is not None:
                self.pacer.advance(step.num_requests)


# --- second-pass verification -------------------------------------------------------------------
@dataclass(frozen=True)
class PassCheck:
    """The compile misses of one pass, read from what the SGLang processes wrote.

    ``verified``: False when nothing shared could be read (then ``misses`` means nothing).
    ``source``: ``compile_log`` (``<state_dir>/compile_log``) or ``metrics`` (the
    multiprocess directory).  ``kernels``: ``class: kernel (compiler)`` per miss, from the
    compile log only.
    """

    verified: bool
    misses: int
    source: str
    kernels: tuple[str, ...] = ()
    detail: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"verified": self.verified, "misses": self.misses, "source": self.source,
                "kernels": list(self.kernels), "detail": self.detail}


def miss_total(mp_dir: str | None) -> float | None:
    """Compile misses summed over every process of a multiprocess directory; None when the
    directory holds no sglang-warmup compile metrics."""
    if not mp_dir or not os.path.isdir(mp_dir) or not any(Path(mp_dir).glob("*.db")):
        return None
    from warmup.observe import metrics

    collected = metrics.collect(mp_dir)
    name = "sglang_warmup_compile_events_total"
    if name not in collected:
        return None
    return metrics.total(collected, name, outcome="miss")


class PassWindow:
    """What the SGLang processes wrote during one pass: the new bytes of the compile log
    (a :class:`cache_tools.compile_log.Cursor`, so no clock is compared across processes) and
    the multiprocess miss counter before and after."""

    def __init__(self, state_dir: str | None, mp_dir: str | None) -> None:
        self.state_dir = state_dir
        self.mp_dir = mp_dir
        self.cursor = compile_log.Cursor(state_dir) if state_dir else None
        self.start = self.cursor.mark() if self.cursor is not None else {}
        self.end: dict[str, int] | None = None
        self.misses_before = miss_total(mp_dir)
        self.misses_after: float | None = None

    def close(self) -> "PassWindow":
        if self.cursor is not None:
            self.end = self.cursor.mark()
        self.misses_after = miss_total(self.mp_dir)
        return self

    @property
    def shared_log(self) -> bool:
        """True when some process wrote a compile log into the state directory."""
        return bool(self.state_dir) and bool(compile_log.files(self.state_dir))

    def records(self) -> list[dict] | None:
        """The compile-log records of the pass; None without a shared compile log."""
        if self.cursor is None or not self.shared_log:
            return None
        return self.cursor.read(self.start, self.end)

    def check(self) -> PassCheck:
        """The misses of the pass: from the compile log when SGLang writes one into the shared
        state directory, else from the multiprocess metrics."""
        records = self.records()
        if records is not None:
            misses = [r for r in records if is_miss(r)]
            kernels = tuple(f"{r.get('shape_class') or r.get('phase') or '?'}: "
                            f"{kernel_name(r)} ({r.get('compiler') or '?'})" for r in misses)
            return PassCheck(True, len(misses), "compile_log", kernels,
                             f"{len(records)} records of the pass in "
                             f"{compile_log.directory(self.state_dir)}")
        if self.misses_after is not None:  # none before the pass: none had been counted yet
            before = self.misses_before or 0.0
            return PassCheck(True, int(round(self.misses_after - before)), "metrics",
                             (), f"sglang_warmup_compile_events_total{{outcome=\"miss\"}} in "
                             f"{self.mp_dir}")
        where = [f"no compile log under {compile_log.directory(self.state_dir)}" if self.state_dir
                 else "no shared state directory",
                 f"no sglang-warmup compile metrics in {self.mp_dir}" if self.mp_dir
                 else "no Prometheus multiprocess directory"]
        return PassCheck(False, 0, "", (), "; ".join(where))


def _attach_window(report: RunReport, records: Iterable[Mapping[str, Any]] | None) -> None:
    """Replace the report's compile counts by those of its own pass (the driver counts every
    record of the compile log: earlier passes and earlier server lifetimes included)."""
    if records is not None:
        report.count_compiles(records)


# --- configuration ------------------------------------------------------------------------------
@dataclass(frozen=True)
class SidecarConfig:
    """Everything the sidecar does, decided before it starts.

    ``deadline_s``: how long to wait for ``/health_generate`` per attempt.  ``startup_budget_s``:
    the time the orchestrator allows for the whole start (e.g. a Kubernetes startup probe's
    ``failureThreshold * periodSeconds``), counted from the sidecar's start; the projection is
    logged against it.  ``watch_interval_s``: seconds between ``/health`` probes once ready (0:
    no watching).  ``mp_dir``: the Prometheus multiprocess directory the SGLang processes write
    to (None: none shared).
    """

    plan: str
    url: str
    port: int = DEFAULT_PORT
    bind: str = "0.0.0.0"
    deadline_s: float = 1800.0
    second_pass: bool = False
    exit_on_failure: bool = False
    state_dir: str | None = None
    mp_dir: str | None = None
    startup_budget_s: float | None = None
    request_timeout_s: float = 600.0
    flush_timeout_s: float = 60.0
    flush_slack_s: float = 10.0
    probe_timeout_s: float = 30.0
    backoff_initial_s: float = 0.5
    backoff_max_s: float = 10.0
    watch_interval_s: float = 10.0
    watch_failures: int = 3
    progress_every_s: float = 10.0
    seed: str = "0"
    api_key: str | None = field(default=None, repr=False)

    def check(self) -> Plan:
        """Validate everything that can be checked before the server is reachable; return the
        loaded plan.  Raises SidecarError (or the plan's PlanError)."""
        parsed = urllib.parse.urlparse(self.url)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise SidecarError(f"--url {self.url!r} is not an http(s) URL",
                               hint="the SGLang server's base URL, e.g. --url http://127.0.0.1:30000")
        if not 0 <= self.port <= 65535:
            raise SidecarError(f"--port {self.port} is not a TCP port",
                               hint="0-65535 (0: any free port)")
        for name, value in (("--deadline", self.deadline_s),
                            ("--request-timeout", self.request_timeout_s),
                            ("--flush-timeout", self.flush_timeout_s)):
            if not value > 0:
                raise SidecarError(f"{name} {value:g} must be a positive number of seconds",
                                   hint=f"e.g. {name} 600")
        if self.startup_budget_s is not None and not self.startup_budget_s > 0:
            raise SidecarError(f"--startup-budget {self.startup_budget_s:g} must be a positive "
                               "number of seconds",
                               hint="the orchestrator's startup allowance, e.g. --startup-budget 1800")
        if self.watch_interval_s < 0:
            raise SidecarError(f"--watch-interval {self.watch_interval_s:g} must be >= 0",
                               hint="0 turns watching off")
        if self.second_pass and not self.state_dir and not self.mp_dir:
            raise SidecarError(
                "--second-pass cannot be verified: the sidecar shares no state directory with "
                "SGLang, so it cannot see the compile misses of the SGLang processes",
                hint="run SGLang with WARMUP_ENABLE=1 and WARMUP_STATE_DIR=DIR (sglang-warmup "
                     "installed in its environment) and give the sidecar --state-dir DIR, "
                     "e.g. a shared emptyDir in Kubernetes")
        if self.state_dir:
            try:
                Path(self.state_dir).mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise SidecarError(f"--state-dir {self.state_dir}: {exc.strerror or exc}",
                                   hint="a directory both SGLang and the sidecar can write") from None
        return loader.load(self.plan)


# --- the sidecar --------------------------------------------------------------------------------
class Sidecar:
    """One sidecar: a work loop (wait, warm, verify, watch) and an HTTP server for its state."""

    def __init__(self, config: SidecarConfig, plan: Plan | None = None) -> None:
        self.config = config
        self.plan = plan if plan is not None else config.check()
        self.client = HttpClient(config.url, api_key=config.api_key)
        self.stop_event = threading.Event()
        self.exit_code = 0
        self.started_at = time.time()
        self._started_mono = time.monotonic()
        self._lock = threading.Lock()
        self._state = "starting"
        self._reason: str | None = None
        self._hint: str | None = None
        self._timeline: deque[dict[str, Any]] = deque(maxlen=_TIMELINE_MAX)
        self._attempt = 0
        self._run: dict[str, Any] | None = None
        self._second: dict[str, Any] | None = None
        self._projection: Projection | None = None
        self._expansion: dict[str, Any] | None = None
        self._counts = {"runs_ok": 0, "runs_failed": 0, "requests_ok": 0, "requests_failed": 0}
        self._health_wait_s: float | None = None
        self._warmup_s: float | None = None
        self._ready_at: float | None = None
        self._misses: int | None = None
        self._crash: str | None = None
        self._httpd: ThreadingHTTPServer | None = None
        self._http_thread: threading.Thread | None = None
        self._worker: threading.Thread | None = None

    # --- lifecycle ------------------------------------------------------------------------------
    @property
    def port(self) -> int:
        """The port the HTTP server listens on (the chosen one when configured as 0)."""
        if self._httpd is None:
            raise SidecarError("the sidecar is not listening yet", hint="call start() first")
        return int(self._httpd.server_address[1])

    def start(self) -> None:
        """Listen on the configured address, then start the work loop (both in threads)."""
        cfg = self.config
        server_cls = _HTTPServer6 if ":" in cfg.bind else _HTTPServer
        try:
            self._httpd = server_cls((cfg.bind, cfg.port), _Handler)
        except OSError as exc:
            raise SidecarError(f"cannot listen on {cfg.bind}:{cfg.port}: "
                               f"{exc.strerror or exc}",
                               hint="choose another --port (0: any free port) or --bind") from None
        self._httpd.sidecar = self  # type: ignore[attr-defined]
        self._http_thread = threading.Thread(target=self._httpd.serve_forever,
                                             kwargs={"poll_interval": 0.2},
                                             name="sglang-warmup-sidecar-http", daemon=True)
        self._http_thread.start()
        logger.info("sglang-warmup sidecar: serving %s on http://%s:%d", " ".join(ENDPOINTS),
                    cfg.bind, self.port)
        self._worker = threading.Thread(target=self._work, name="sglang-warmup-sidecar",
                                        daemon=True)
        self._worker.start()

    def stop(self) -> None:
        """Ask the work loop to end (it ends at its next wait or step)."""
        self.stop_event.set()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the sidecar is asked to stop (a signal, ``stop()``, or a failure with
        ``exit_on_failure``); True if it was."""
        return self.stop_event.wait(timeout)

    def close(self, join_s: float = 5.0) -> None:
        """Stop, close the HTTP server and give the work loop ``join_s`` seconds to end."""
        self.stop_event.set()
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
        if self._worker is not None:
            self._worker.join(join_s)
        with self._lock:
            if self._state != "failed" or self.exit_code == 0:
                self._state = "stopped"

    @property
    def busy(self) -> bool:
        """True while the work loop is still running (e.g. a request in flight after close)."""
        return self._worker is not None and self._worker.is_alive()

    def run(self) -> int:
        """start(), wait for SIGTERM/SIGINT or a failure with ``exit_on_failure``, close();
        returns the exit status.  Signal handlers are installed only in the main thread."""
        self.start()
        previous = {}
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                previous[sig] = signal.signal(sig, self._on_signal)
        try:
            while not self.wait(1.0):
                pass
        finally:
            self.close()
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        return self.exit_code

    def _on_signal(self, signum: int, frame: Any) -> None:
        logger.info("sglang-warmup sidecar: %s received; stopping", signal.Signals(signum).name)
        self.stop_event.set()

    # --- state ----------------------------------------------------------------------------------
    def _event(self, state: str | None, message: str, *, level: int = logging.INFO) -> None:
        now = time.time()
        with self._lock:
            if state is not None:
                self._state = state
            self._timeline.append({"time": round(now, 3),
                                   "elapsed_s": round(now - self.started_at, 3),
                                   "state": self._state, "message": message})
        logger.log(level, "sglang-warmup sidecar: %s", message)

    @property
    def state(self) -> str:
        with self._lock:
            return self._state

    @property
    def ready(self) -> bool:
        return self.state == "ready"

    @property
    def live(self) -> bool:
        return self._crash is None

    def status(self) -> dict[str, Any]:
        """The /report document."""
        cfg = self.config
        with self._lock:
            return {
                "state": self._state,
                "ready": self._state == "ready",
                "reason": self._reason,
                "hint": self._hint,
                "url": cfg.url,
                "plan": {"file": cfg.plan, "name": self.plan.name},
                "attempt": self._attempt,
                "started_at": self.started_at,
                "ready_at": self._ready_at,
                "deadline_s": cfg.deadline_s,
                "startup_budget_s": cfg.startup_budget_s,
                "second_pass": cfg.second_pass,
                "exit_on_failure": cfg.exit_on_failure,
                "state_dir": cfg.state_dir,
                "multiprocess_dir": cfg.mp_dir,
                "health_wait_s": self._health_wait_s,
                "warmup_s": self._warmup_s,
                "expansion": self._expansion,
                "projection": self._projection.to_dict() if self._projection else None,
                "run": self._run,
                "second_pass_run": self._second,
                "counts": dict(self._counts),
                "timeline": list(self._timeline),
            }

    # --- the work loop --------------------------------------------------------------------------
    def _work(self) -> None:
        try:
            self._loop()
        except Exception as exc:  # our own bug: say so, turn /live to 503, honour the policy
            self._crash = f"{type(exc).__name__}: {exc}"
            logger.exception("sglang-warmup sidecar: internal error")
            with self._lock:
                self._reason = f"internal error: {self._crash}"
                self._hint = "report this with the log; /live answers 503 so the container restarts"
            self._event("failed", f"internal error: {self._crash}", level=logging.ERROR)
            if self.config.exit_on_failure:
                self.exit_code = 1
                self.stop_event.set()

    def _loop(self) -> None:
        while not self.stop_event.is_set():
            self._attempt += 1
            outcome = self._cycle(self._attempt)
            if self.stop_event.is_set():
                return
            if outcome == "ready":
                if not self._watch():
                    return
                self._set_phase("init")  # the next server's init compiles are not serving ones
                with self._lock:
                    self._reason = ("the server stopped answering /health; the warm-up runs "
                                    "again when it is back")
                    self._hint = None
                self._event("waiting", f"the server at {self.config.url} stopped answering "
                            f"/health ({self.config.watch_failures} probes in a row); /ready "
                            "answers 503 until it is back and warm", level=logging.WARNING)
                continue
            if self.config.exit_on_failure:
                logger.error("sglang-warmup sidecar: exiting with status 1 (--exit-on-failure)")
                self.exit_code = 1
                self.stop_event.set()
                return
            logger.warning("sglang-warmup sidecar: /ready stays 503; a new attempt starts when "
                           "the server restarts (--exit-on-failure to exit instead)")
            if not self._wait_for_restart(down_already=outcome == "unhealthy"):
                return

    def _cycle(self, attempt: int) -> str:
        """One attempt: wait, facts, expand, warm, verify.  Returns ``ready``, ``unhealthy``
        (failed, and the server does not answer: it never came up or it died), ``failed``
        (failed while the server is up) or ``stopped``."""
        cfg = self.config
        anchor = self._started_mono if attempt == 1 else time.monotonic()
        budget_end = anchor + cfg.startup_budget_s if cfg.startup_budget_s else None
        with self._lock:  # the reason of the previous attempt stays until this one ends
            self._run = self._second = None
            self._projection = None
            self._ready_at = None
        self._event("waiting", f"attempt {attempt}: waiting for {cfg.url}/health_generate, "
                    f"deadline {cfg.deadline_s:g} s (until "
                    f"{_clock(time.time() + cfg.deadline_s)}); backoff {cfg.backoff_initial_s:g} s "
                    f"doubling to {cfg.backoff_max_s:g} s")
        hw = wait_for_health(self._probe_generate, cfg.deadline_s,
                             initial_s=cfg.backoff_initial_s, max_s=cfg.backoff_max_s,
                             probe_timeout_s=cfg.probe_timeout_s, stop=self.stop_event,
                             what=f"{cfg.url}/health_generate", log=logger)
        with self._lock:
            self._health_wait_s = round(hw.waited_s, 3)
        if hw.ended == "stopped":
            return "stopped"
        if not hw.ok:
            return self._fail(f"the server at {cfg.url} was not healthy within "
                              f"{cfg.deadline_s:g} s ({hw.attempts} probes of /health_generate; "
                              f"last: {hw.last})",
                              "check the server's log; raise --deadline if its start takes longer",
                              server_gone=True)
        self._event(None, f"healthy after {hw.waited_s:.1f} s ({hw.attempts} probes)")

        transport = SidecarTransport(cfg.url, request_timeout_s=cfg.request_timeout_s,
                                     info_timeout_s=cfg.probe_timeout_s,
                                     flush_slack_s=cfg.flush_slack_s, seed=cfg.seed,
                                     api_key=cfg.api_key, stop=self.stop_event)
        try:
            facts = transport.facts_sync()
        except WarmupError as exc:
            return self._fail(f"reading the server's settings failed: {exc.message}", exc.hint)
        try:
            exp = expand(self.plan, facts)
        except WarmupError as exc:
            return self._fail(f"the plan does not expand on this server: {exc.message}", exc.hint)
        passes = 2 if cfg.second_pass else 1
        with self._lock:
            self._expansion = {"steps": len(exp.steps), "requests": exp.num_requests,
                               "classes": len(exp.classes), "skipped": len(exp.skipped),
                               "digest": exp.digest(), "passes": passes}
        budget = ""
        if budget_end is not None:
            budget = (f"; startup budget {cfg.startup_budget_s:g} s, "
                      f"{budget_end - time.monotonic():.0f} s left")
        self._event("warming", f"warming plan {self.plan.name}: {len(exp.steps)} steps, "
                    f"{exp.num_requests} requests, {len(exp.classes)} classes "
                    f"(x{passes} pass{'es' if passes > 1 else ''}){budget}")
        transport.pacer = _Pacer(exp.num_requests * passes, budget_end,
                                 every_s=cfg.progress_every_s, on_update=self._on_projection)
        t0 = time.time()
        report, error, first = self._drive(transport, exp)
        with self._lock:
            self._run = report.to_dict() if report is not None else None
        if error is not None:
            if self.stop_event.is_set():
                return "stopped"
            return self._fail(f"warm-up failed: {error.message}", error.hint)
        if cfg.second_pass:
            outcome = self._second_pass(transport, exp, attempt, first)
            if outcome != "ready":
                return outcome
        warm_s = time.time() - t0
        with self._lock:
            self._reason, self._hint = None, None
            self._warmup_s = round(warm_s, 3)
            self._ready_at = time.time()
            self._counts["runs_ok"] += 1
        extra = "; second pass: 0 compile misses" if cfg.second_pass else ""
        self._event("ready", f"ready: /ready answers 200 (warm-up {warm_s:.1f} s, "
                    f"{exp.num_requests * passes} requests{extra})")
        return "ready"

    def _second_pass(self, transport: SidecarTransport, exp: Expansion, attempt: int,
                     first: PassWindow) -> str:
        self._event("verifying", "second pass: the same plan again, counting compile misses")
        transport.tokens.salt = f"second-pass-{attempt}"  # fresh prompts: no radix hits across passes
        report, error, window = self._drive(transport, exp)
        check = window.check()
        second: dict[str, Any] = {"check": check.to_dict(),
                                  "report": report.to_dict() if report is not None else None}
        records1, records2 = first.records(), window.records()
        if records1 is not None and records2 is not None:
            from warmup.coverage import classes as coverage

            cov = coverage.compute(records1, records2, classes=list(exp.classes), plan=exp.plan)
            second["coverage"] = cov.to_json()
        with self._lock:
            self._second = second
            self._misses = check.misses if check.verified else None
        if error is not None:
            if self.stop_event.is_set():
                return "stopped"
            return self._fail(f"second pass failed: {error.message}", error.hint)
        if not check.verified:
            return self._fail(f"--second-pass cannot be verified: {check.detail}",
                              "run SGLang with WARMUP_ENABLE=1 and WARMUP_STATE_DIR set to the "
                              "sidecar's --state-dir (sglang-warmup installed in its environment)")
        if check.misses:
            shown = "; ".join(check.kernels[:10]) + (" …" if len(check.kernels) > 10 else "")
            return self._fail(f"the second pass compiled {check.misses} kernel(s) "
                              f"(from the {check.source.replace('_', ' ')})" + (f": {shown}" if shown else ""),
                              "the plan does not reproduce its own shapes, so traffic may compile "
                              "too; see /report for the classes, or drop --second-pass")
        self._event(None, f"second pass: 0 compile misses ({check.detail})")
        return "ready"

    def _drive(self, transport: SidecarTransport, exp: Expansion
               ) -> tuple[RunReport | None, WarmupError | None, PassWindow]:
        """One pass of the plan through the Driver; the report has this pass's compile counts."""
        cfg = self.config
        window = PassWindow(cfg.state_dir, cfg.mp_dir)
        driver = Driver(transport, flush_timeout_s=cfg.flush_timeout_s, state_dir=cfg.state_dir,
                        progress=lambda line: logger.info("%s", line))
        report: RunReport | None
        error: WarmupError | None = None
        try:
            report = asyncio.run(driver.run(exp))
        except WarmupError as exc:
            report, error = getattr(exc, "report", None), exc
        window.close()
        if report is not None:
            try:
                _attach_window(report, window.records())
            except Exception as exc:  # bookkeeping never decides the outcome
                logger.debug("sglang-warmup sidecar: compile counts not attached: %s", exc)
            ok = sum(c.requests - c.failures for c in report.classes)
            failed = sum(c.failures for c in report.classes)
            with self._lock:
                self._counts["requests_ok"] += ok
                self._counts["requests_failed"] += failed
        return report, error, window

    def _fail(self, reason: str, hint: str = "", *, server_gone: bool | None = None) -> str:
        """Record a failure; returns ``unhealthy`` when the server does not answer ``/health``
        now (it died or never came up: the next attempt waits for it to answer again) or
        ``failed`` (it is up: the next attempt waits for a restart)."""
        if server_gone is None:
            server_gone = not self._probe_health(min(self.config.probe_timeout_s, 5.0)).ok
        with self._lock:
            self._reason, self._hint = reason, hint or None
            self._counts["runs_failed"] += 1
        self._event("failed", f"warm-up FAILED: {reason}" + (f" (hint: {hint})" if hint else ""),
                    level=logging.ERROR)
        if server_gone:
            self._set_phase("init")  # what the next server compiles first is its init
            return "unhealthy"
        self._set_phase("serving")  # whatever reaches the server now is not our plan
        return "failed"

    def _on_projection(self, p: Projection) -> None:
        with self._lock:
            self._projection = p

    def _set_phase(self, name: str) -> None:
        try:
            phase_mod.set_phase(name, state_dir=self.config.state_dir)
        except Exception as exc:  # bookkeeping never stops the sidecar
            logger.debug("sglang-warmup sidecar: phase not recorded: %s", exc)

    def _probe_generate(self, timeout: float) -> Probe:
        return self.client.probe("/health_generate", timeout)

    def _probe_health(self, timeout: float) -> Probe:
        return self.client.probe("/health", timeout)

    def _watch(self) -> bool:
        """Probe ``/health`` every ``watch_interval_s``; True once ``watch_failures`` probes in a
        row failed (the server went away), False when stopping."""
        cfg = self.config
        if cfg.watch_interval_s <= 0:
            self.stop_event.wait()
            return False
        failures = 0
        timeout = max(1.0, min(cfg.probe_timeout_s, cfg.watch_interval_s * 2))
        while not self.stop_event.wait(cfg.watch_interval_s):
            p = self._probe_health(timeout)
            if p.ok:
                failures = 0
                continue
            failures += 1
            logger.warning("sglang-warmup sidecar: /health probe failed (%s), %d of %d",
                           p.detail, failures, cfg.watch_failures)
            if failures >= cfg.watch_failures:
                return True
        return False

    def _wait_for_restart(self, *, down_already: bool) -> bool:
        """After a failure: wait until the server has gone away (unless it already was) and
        answers ``/health_generate`` again.  False when stopping."""
        cfg = self.config
        interval = max(cfg.watch_interval_s, cfg.backoff_initial_s) if cfg.watch_interval_s \
            else cfg.backoff_max_s
        timeout = max(1.0, min(cfg.probe_timeout_s, interval * 2))
        failures = 0
        while not down_already:
            if self.stop_event.wait(interval):
                return False
            p = self._probe_health(timeout)
            failures = 0 if p.ok else failures + 1
            if failures >= cfg.watch_failures:
                down_already = True
                self._set_phase("init")
                self._event(None, "the server went away; waiting for it to come back")
        while not self.stop_event.wait(interval):
            if self._probe_generate(timeout).ok:
                self._event(None, "the server answers again; starting a new attempt")
                return True
        return False

    # --- /metrics -------------------------------------------------------------------------------
    def metrics_text(self) -> bytes:
        """The sidecar's metrics, plus sglang-warmup's metrics from the shared multiprocess
        directory (the SGLang processes' compile events) when there is one."""
        from prometheus_client import CollectorRegistry, generate_latest

        registry = CollectorRegistry(auto_describe=False)
        registry.register(_SidecarCollector(self))
        out = generate_latest(registry)
        mp = self.config.mp_dir
        if mp and os.path.isdir(mp) and any(Path(mp).glob("*.db")):
            from warmup.observe import metrics

            try:
                out += metrics.render(mp)
            except Exception as exc:  # a torn file must not take /metrics down
                out += f"# sglang-warmup sidecar: cannot read {mp}: {exc}\n".encode()
        return out

    def _metric_values(self) -> dict[str, Any]:
        with self._lock:
            return {"state": self._state, "counts": dict(self._counts),
                    "health_wait_s": self._health_wait_s, "warmup_s": self._warmup_s,
                    "ready_at": self._ready_at, "misses": self._misses,
                    "projection": self._projection}


class _SidecarCollector:
    """The sidecar's own metrics, computed from its state at scrape time (no metric objects:
    prometheus-client may be in multiprocess mode in this process, and the sidecar's values
    must not land in SGLang's directory)."""

    def __init__(self, sidecar: Sidecar) -> None:
        self.sidecar = sidecar

    def collect(self) -> Iterable[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        v = self.sidecar._metric_values()
        yield GaugeMetricFamily("sglang_warmup_sidecar_ready",
                                "1 while the sidecar's /ready answers 200.",
                                value=1.0 if v["state"] == "ready" else 0.0)
        state = GaugeMetricFamily("sglang_warmup_sidecar_state",
                                  "The sidecar's state (1 for the current one).", labels=["state"])
        for s in STATES:
            state.add_metric([s], 1.0 if s == v["state"] else 0.0)
        yield state
        runs = CounterMetricFamily("sglang_warmup_sidecar_runs",
                                   "Warm-up attempts by outcome.", labels=["outcome"])
        runs.add_metric(["ok"], v["counts"]["runs_ok"])
        runs.add_metric(["failed"], v["counts"]["runs_failed"])
        yield runs
        reqs = CounterMetricFamily("sglang_warmup_sidecar_requests",
                                   "Warm-up requests sent by the sidecar, by outcome.",
                                   labels=["outcome"])
        reqs.add_metric(["ok"], v["counts"]["requests_ok"])
        reqs.add_metric(["failed"], v["counts"]["requests_failed"])
        yield reqs
        for name, key, text in (
                ("sglang_warmup_sidecar_health_wait_seconds", "health_wait_s",
                 "Seconds the last attempt waited for /health_generate."),
                ("sglang_warmup_sidecar_warmup_seconds", "warmup_s",
                 "Seconds the last successful warm-up took (both passes with --second-pass)."),
                ("sglang_warmup_sidecar_ready_timestamp_seconds", "ready_at",
                 "Unix time at which /ready last turned 200."),
                ("sglang_warmup_sidecar_second_pass_misses", "misses",
                 "Compile misses seen during the last second pass.")):
            if v[key] is not None:
                yield GaugeMetricFamily(name, text, value=float(v[key]))
        p: Projection | None = v["projection"]
        if p is not None and p.remaining_s is not None:
            yield GaugeMetricFamily("sglang_warmup_sidecar_projected_remaining_seconds",
                                    "Projected seconds until the warm-up ends, at the rate so far.",
                                    value=float(p.remaining_s))


# --- HTTP ---------------------------------------------------------------------------------------
class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True


class _HTTPServer6(_HTTPServer):
    address_family = socket.AF_INET6


class _Handler(BaseHTTPRequestHandler):
    server_version = "sglang-warmup-sidecar"
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
        sidecar: Sidecar = self.server.sidecar  # type: ignore[attr-defined]
        path = urllib.parse.urlparse(self.path).path.rstrip("/") or "/"
        try:
            if path == "/ready":
                st = sidecar.status()
                body = {"ready": st["ready"], "state": st["state"], "reason": st["reason"]}
                self._json(200 if st["ready"] else 503, body)
            elif path == "/live":
                live = sidecar.live
                self._json(200 if live else 503, {"live": live, "state": sidecar.state})
            elif path == "/report":
                self._json(200, sidecar.status())
            elif path == "/metrics":
                from prometheus_client import CONTENT_TYPE_LATEST

                self._send(200, sidecar.metrics_text(), CONTENT_TYPE_LATEST)
            else:
                self._json(404, {"error": f"no such endpoint {path}",
                                 "endpoints": list(ENDPOINTS)})
        except Exception as exc:  # answer something rather than drop the connection
            logger.warning("sglang-warmup sidecar: %s failed: %r", path, exc)
            self._json(500, {"error": f"{type(exc).__name__}: {exc}"})

    def _json(self, status: int, body: Any) -> None:
        self._send(status, (json.dumps(body, indent=1, default=str) + "\n").encode(),
                   "application/json")

    def _send(self, status: int, data: bytes, ctype: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the stdlib's name
        logger.debug("sglang-warmup sidecar: %s %s", self.address_string(), format % args)


# --- SGLang's managed sidecar -------------------------------------------------------------------
def main(argv: list[str] | None = None) -> None:
    """Entry point for SGLang's managed sidecar: ``--sidecar warmup.sidecar.service --sidecar-args
    '["--plan", "P", "--url", "http://127.0.0.1:30000", ...]'``.  Same options as
    ``sglang-warmup sidecar``; exits with the sidecar's status (0 after SIGTERM)."""
    import sys

    from warmup.cli import main as cli_main

    cli_main(["sidecar", *(sys.argv[1:] if argv is None else list(argv))])
