"""The sidecar: a readiness gate for an SGLang server started by someone else, as a state
machine (waiting → warming → verifying → ready, or failed) with restarts and an exit policy.

Each attempt waits for ``/health_generate`` (backoff, a deadline), reads ``/server_info``,
expands the plan, drives it over HTTP (:class:`SidecarTransport`) and, with ``second_pass``,
runs it again through :mod:`warmup.coverage.second_pass`; ``/ready``
(:mod:`warmup.sidecar.endpoints`) turns 200 on success.  Once ready it watches ``/health``: a
server that goes away turns ``/ready`` back to 503 and is warmed again when it is back.  After
a failure, ``exit_on_failure`` ends the process with status 1; otherwise the sidecar stays at
503 with the reason and tries again only after the server restarts.  Imports neither torch,
Triton nor SGLang, so it fits a slim image.

Longer than 500 lines (just): one state machine; its states and transitions read best in one
place.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import threading
import time
from collections import deque
from typing import Any

from warmup import settings
from warmup.coverage import second_pass
from warmup.coverage.second_pass import Passes, PassResult
from warmup.errors import SidecarError, TransportError, WarmupError
from warmup.observe import metrics
from warmup.observe import phase as phase_mod
from warmup.plan.model import Expansion, Plan, WarmupStep
from warmup.plan.expand import expand
from warmup.plan.lets import with_lets
from warmup.serve.driver import Driver
from warmup.serve.http import HttpClient, Probe, wait_for_health
from warmup.serve.transport import HttpTransport, Outcome
from warmup.sidecar.config import SidecarConfig
from warmup.sidecar.endpoints import ENDPOINTS, EndpointServer, route
from warmup.sidecar.projection import Pacer, Projection, clock

logger = logging.getLogger("sglang_warmup.sidecar")

#: The sidecar's states, in the order a successful start goes through them.
STATES: tuple[str, ...] = metrics.SIDECAR_STATES
_TIMELINE_MAX = 500  # events kept for /report


class SidecarTransport(HttpTransport):
    """The HTTP transport, counting every step for the projection and refusing new steps once
    the sidecar is stopping."""

    def __init__(self, url: str, *, stop: threading.Event | None = None, **options: Any) -> None:
        super().__init__(url, **options)
        self.stop = stop
        self.pacer: Pacer | None = None

    async def send(self, step: WarmupStep) -> list[Outcome]:
        if self.stop is not None and self.stop.is_set():
            raise TransportError("the sidecar is stopping", hint="")
        try:
            return await super().send(step)
        finally:
            if self.pacer is not None:
                self.pacer.advance(step.num_requests)


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
        self._httpd: EndpointServer | None = None
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
        try:
            self._httpd = EndpointServer(cfg.host, cfg.port, lambda path: route(self, path))
        except OSError as exc:
            raise SidecarError(f"cannot listen on {cfg.host}:{cfg.port}: "
                               f"{exc.strerror or exc}",
                               hint="choose another --port (0: any free port) or --host") from None
        self._http_thread = threading.Thread(target=self._httpd.serve_forever,
                                             name="sglang-warmup-sidecar-http", daemon=True)
        self._http_thread.start()
        logger.info("sglang-warmup sidecar: serving %s on http://%s:%d", " ".join(ENDPOINTS),
                    cfg.host, self.port)
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
                "freeze_gc": cfg.freeze_gc,
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

    def metrics_text(self) -> bytes:
        """The /metrics body: the sidecar's metrics, plus sglang-warmup's metrics from the
        shared multiprocess directory (the SGLang processes' compile events) when there is one."""
        return metrics.sidecar_exposition(self._sample, self.config.mp_dir)

    def _sample(self) -> metrics.SidecarSample:
        with self._lock:
            p = self._projection
            return metrics.SidecarSample(
                state=self._state, runs_ok=self._counts["runs_ok"],
                runs_failed=self._counts["runs_failed"],
                requests_ok=self._counts["requests_ok"],
                requests_failed=self._counts["requests_failed"],
                health_wait_s=self._health_wait_s, warmup_s=self._warmup_s,
                ready_at=self._ready_at, second_pass_misses=self._misses,
                projected_remaining_s=p.remaining_s if p is not None else None)

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
        waited = self._wait_healthy(attempt)
        if waited is not None:
            return waited
        transport = SidecarTransport(cfg.url, stop=self.stop_event, timeout_s=cfg.request_timeout_s,
                                     retries=2, backoff_s=0.5, info_timeout_s=cfg.probe_timeout_s,
                                     flush_slack_s=cfg.flush_slack_s, seed=cfg.seed,
                                     api_key=cfg.api_key)
        try:
            facts = transport.facts_sync()
        except WarmupError as exc:
            return self._fail(f"reading the server's settings failed: {exc.message}", exc.hint)
        try:
            exp = expand(with_lets(self.plan, settings.LETS.get()), facts,
                         skip_families=settings.SKIP_FAMILIES.get())
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
        transport.pacer = Pacer(exp.num_requests * passes, budget_end,
                                every_s=cfg.progress_every_s, on_update=self._on_projection)
        t0 = time.time()
        result = self._drive(transport, exp, attempt)
        error = _our_error(result.first.error)
        if error is not None:
            if self.stop_event.is_set():
                return "stopped"
            return self._fail(f"warm-up failed: {error.message}", error.hint)
        if cfg.second_pass:
            outcome = self._verify(result)
            if outcome != "ready":
                return outcome
        if cfg.freeze_gc:
            self._freeze_gc(transport)
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

    def _wait_healthy(self, attempt: int) -> str | None:
        """Wait for the server's /health_generate; None once healthy, else the attempt's end
        (``stopped``, or the failure)."""
        cfg = self.config
        self._event("waiting", f"attempt {attempt}: waiting for {cfg.url}/health_generate, "
                    f"deadline {cfg.deadline_s:g} s (until "
                    f"{clock(time.time() + cfg.deadline_s)}); backoff {cfg.backoff_initial_s:g} s "
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
        return None


    def _freeze_gc(self, transport: SidecarTransport) -> None:
        """SGLang's /freeze_gc once warm; a failure is a warning (the server is warm anyway)."""
        try:
            transport.client.freeze_gc()
        except WarmupError as exc:
            self._event(None, f"freezing the garbage collector failed: {exc.message}",
                        level=logging.WARNING)
        else:
            self._event(None, "garbage collector frozen (POST /freeze_gc)")

    def _drive(self, transport: SidecarTransport, exp: Expansion, attempt: int) -> Passes:
        """The plan's passes (the second with ``second_pass``) through the one second-pass
        check; each pass's report counts the compiles of that pass only."""
        cfg = self.config

        def driver(repeat: bool = False) -> Driver:
            return Driver(transport, flush_timeout_s=cfg.flush_timeout_s, state_dir=cfg.state_dir,
                          progress=lambda line: logger.info("%s", line), repeat=repeat)

        def on_pass(n: int, result: PassResult) -> None:
            report = result.pass_report
            with self._lock:
                if report is not None:
                    self._counts["requests_ok"] += report.requests_ok
                    self._counts["requests_failed"] += report.requests_failed
                if n == 1:
                    self._run = report.to_dict() if report is not None else None
            if n == 1 and cfg.second_pass and result.error is None and report is not None \
                    and not report.skipped_reason:
                self._event("verifying", "second pass: the same plan again, counting compile "
                            "misses")

        # fresh prompts per attempt: no radix hits across passes; the second pass repeats each
        # step (first hit against repeat, reported in /report, not gated)
        return asyncio.run(second_pass.run_passes(
            driver(), exp, second=driver(repeat=True) if cfg.second_pass else None,
            state_dir=cfg.state_dir, mp_dir=cfg.mp_dir, salt=f"second-pass-{attempt}",
            on_pass=on_pass))

    def _verify(self, result: Passes) -> str:
        """The verdict on the second pass: ``ready`` only when it compiled nothing."""
        second = result.second
        if second is None:  # the plan was skipped on this server (PD disaggregation)
            self._event(None, "second pass: skipped (the plan sent nothing)")
            return "ready"
        check, report = second.check, second.pass_report
        doc: dict[str, Any] = {"check": check.to_dict(),
                               "report": report.to_dict() if report is not None else None}
        if result.coverage is not None:
            doc["coverage"] = result.coverage.to_json()
        with self._lock:
            self._second = doc
            self._misses = check.misses if check.verified else None
        error = _our_error(second.error)
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
                              f"(from the {check.source.replace('_', ' ')})"
                              + (f": {shown}" if shown else ""),
                              "the plan does not reproduce its own shapes, so traffic may compile "
                              "too; see /report for the classes, or drop --second-pass")
        self._event(None, f"second pass: 0 compile misses ({check.detail})")
        return "ready"

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
        # set_phase logs a phase file it cannot write (bookkeeping never stops the sidecar);
        # what else it raises (an unknown phase) is a bug of ours: the work loop reports it
        phase_mod.set_phase(name, state_dir=self.config.state_dir)

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


def _our_error(error: Exception | None) -> WarmupError | None:
    """A pass's error when it is an expected one; anything else is our own bug and raises (the
    work loop turns it into an internal error)."""
    if error is None or isinstance(error, WarmupError):
        return error
    raise error
