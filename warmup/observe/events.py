"""Compile, load and JIT-build events: one installation of sglang-warmup's recorders per process.

``install()`` puts our recorders on every hook the installed Triton and SGLang offer, in the
process it runs in (the plugin calls it first thing in every SGLang process):

* Triton's compilation listener, JIT cache hooks and kernel-load chains
  (:mod:`warmup.observe.triton_hooks`; each compile's record is built by
  :mod:`warmup.observe.triton_record`);
* SGLang's nvcc JIT and tvm-ffi's ninja builds (:mod:`warmup.observe.jit_hooks`), patched when
  their modules get imported, so nothing heavy is imported here;
* ``torch.compile`` (Dynamo) compiles (:mod:`warmup.observe.dynamo_hooks`), armed for when
  torch._dynamo is imported;
* long Python garbage collections (:mod:`warmup.observe.gc_pauses`), written to the compile log
  so that a slow step with no compile can still be explained.

The libraries without a hook (DeepGEMM, TileLang, FlashInfer, ...) are watched through their
cache directories by :mod:`warmup.observe.cache_watch`, a thread the plugin starts in the
server's main process only.

Single slots are wrapped, never replaced: our wrapper calls the previous hook, returns its
result, and records after it.  A hook installed later that chains (SGLang's
``triton_load_watch.install()``) keeps calling ours.  Recording never raises into the host: a
failure is logged and counted in ``sglang_warmup_hook_errors_total``.

This module holds what every source shares: the phase each event is stamped with, the metrics,
the compile log (:mod:`cache_tools.compile_log`; every Triton miss becomes one line with what a
later rebuild on a CPU machine needs, and disk hits, device loads and JIT builds are written
there too, field ``event``), the error count and the report of what was installed.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from cache_tools import compile_log
from warmup.observe import (dynamo_hooks, gc_pauses, jit_hooks, metrics, triton_hooks,
                            triton_record)
from warmup.observe import phase as _phase
from warmup.observe.metrics import Metrics

logger = logging.getLogger("sglang_warmup.events")

# Our own failures are logged at WARNING this many times per process, then at DEBUG.
_MAX_ERROR_LOGS = 5


@dataclass(frozen=True)
class HookStatus:
    """One hook point: ``name`` (where it lives), ``state`` and a human ``detail``.

    ``state``: ``installed`` (ours, nothing was there), ``chained`` (ours, wrapping what was
    there), ``armed`` (its module is not imported yet; patched on import), ``missing`` (this
    Triton/SGLang has no such hook) or ``failed`` (installing raised; see detail).
    """

    name: str
    state: str
    detail: str = ""

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class InstallReport:
    """What ``install()`` found and did.

    ``already_installed``: True when an earlier ``install()`` in this process did the work and
    this call changed nothing.  ``state_dir``: where the phase file and the compile log live
    (None: phase in-process only, no compile log).  ``multiprocess_dir``: the Prometheus
    multiprocess directory (None: single-process metrics).
    """

    triton_version: str | None
    sglang_jit_layout: str
    hooks: tuple[HookStatus, ...]
    already_installed: bool = False
    state_dir: str | None = None
    multiprocess_dir: str | None = None

    @property
    def found(self) -> tuple[str, ...]:
        return tuple(h.name for h in self.hooks if h.state not in ("missing",))

    @property
    def installed(self) -> tuple[str, ...]:
        return tuple(h.name for h in self.hooks if h.state in ("installed", "chained", "armed"))

    @property
    def missing(self) -> tuple[str, ...]:
        return tuple(h.name for h in self.hooks if h.state == "missing")

    @property
    def failed(self) -> tuple[str, ...]:
        return tuple(h.name for h in self.hooks if h.state == "failed")

    def to_json(self) -> dict:
        return {
            "triton_version": self.triton_version,
            "sglang_jit_layout": self.sglang_jit_layout,
            "already_installed": self.already_installed,
            "state_dir": self.state_dir,
            "multiprocess_dir": self.multiprocess_dir,
            "hooks": [h.to_json() for h in self.hooks],
        }


# --------------------------------------------------------------------------------------------
# the one installation of this process
# --------------------------------------------------------------------------------------------

_install_lock = threading.RLock()
_installation: "_Installation | None" = None
_error_logs = 0


def install(*, registry: Any = None, state_dir: str | os.PathLike | None = None) -> InstallReport:
    """Install the recorders on every hook found; idempotent; never raises.

    ``registry``: a prometheus-client CollectorRegistry for our metrics (tests pass a fresh
    one); by default the metrics go to the default registry, created on the first event.
    ``state_dir``: directory of the phase file and the compile log; by default
    ``WARMUP_STATE_DIR``.  A second call returns the first call's report with
    ``already_installed=True`` (call ``uninstall()`` first to change the arguments).
    """
    global _installation
    with _install_lock:
        if _installation is not None:
            return dataclasses.replace(_installation.report, already_installed=True)
        inst = None
        try:
            inst = _Installation(registry=registry, state_dir=state_dir)
            inst.install()
        except Exception as exc:  # a guest never raises into its host
            if inst is not None:
                inst.uninstall()  # take off whatever got placed before the failure
            logger.warning("sglang-warmup: compile-event hooks not installed: %s", exc)
            return InstallReport(triton_version=None, sglang_jit_layout="unknown",
                                 hooks=(HookStatus("events", "failed", repr(exc)),))
        _installation = inst
        return inst.report


def uninstall() -> None:
    """Take our recorders off every hook (for tests).

    A single-slot hook that someone wrapped after us cannot be taken out of their chain; our
    wrapper there turns into a pass-through that only calls the hook it wrapped.
    """
    global _installation
    with _install_lock:
        inst = _installation
        _installation = None
        if inst is not None:
            inst.uninstall()


def installed() -> bool:
    """True while an installation is active in this process."""
    return _installation is not None


def status() -> InstallReport | None:
    """The active installation's report, with the current position of our single-slot hooks
    (ours on top, chained by SGLang's ``triton_load_watch``, or displaced); None when not
    installed."""
    inst = _installation
    if inst is None:
        return None
    return inst.current_report()


def record_build(outcome: str, module_name: str | None, duration_s: float | None, *,
                 compiler: str, path: str | None = None, error: str | None = None,
                 reason: str | None = None, state: _phase.PhaseState | None = None) -> None:
    """Count and log one JIT build of ``compiler`` (``built``, ``hit`` or ``failed``) in
    ``state`` (default: the current phase) and write its compile-log line (nothing when the
    recorders are not installed); never raises."""
    inst = _installation
    if inst is not None:
        inst.build(outcome, module_name, duration_s, compiler=compiler, path=path, error=error,
                   reason=reason, state=state)


def note(event: str, compiler: str, **fields: Any) -> None:
    """Append one record of ``event``, stamped with the current phase and holding ``fields``,
    to this process's compile log (nothing when the recorders are not installed); never
    raises."""
    inst = _installation
    if inst is not None:
        inst.note(event, compiler, **fields)


class _Installation:
    """One active set of recorders: the hooks each source placed and the state they share
    (phase, metrics, compile log, the steps that take the hooks off again)."""

    def __init__(self, *, registry: Any, state_dir: str | os.PathLike | None) -> None:
        self.active = True
        self._metrics = metrics.for_registry(registry) if registry is not None else None
        resolved = _phase.resolve_state_dir(state_dir)
        self.state_dir: Path | None = resolved
        self.log = (compile_log.Writer(compile_log.directory(resolved),
                                       default=triton_record.jsonable)
                    if resolved is not None else None)
        self._undo: list[Callable[[], None]] = []
        self._hooks: list[HookStatus] = []
        self.report: InstallReport = InstallReport(None, "unknown", ())
        self.triton = triton_hooks.TritonHooks(self)
        self.jit = jit_hooks.JitHooks(self)
        self.gc = gc_pauses.GcPauses(self)
        self.dynamo = dynamo_hooks.DynamoHooks(self)

    # --- what the sources share ---------------------------------------------------------------
    @property
    def metrics(self) -> Metrics:
        # The default registry's metrics are made on the first event, not at install: see
        # warmup.observe.metrics on prometheus-client's multiprocess mode.
        if self._metrics is None:
            self._metrics = metrics.default()
        return self._metrics

    def phase(self) -> _phase.PhaseState:
        return _phase.current(state_dir=self.state_dir)

    def new_record(self, event: str, state: _phase.PhaseState, compiler: str) -> dict:
        """A compile-log record of ``event`` stamped with the phase ``state``."""
        return compile_log.record(event, phase=state.phase, shape_class=state.shape_class,
                                  request=state.request, compiler=compiler)

    def note(self, event: str, compiler: str, **fields: Any) -> None:
        """Write one record of ``event`` stamped with the phase of now, holding ``fields``
        (which may set ``time``); a failure is counted, not raised."""
        try:
            rec = self.new_record(event, self.phase(), compiler)
            rec.update(fields)
            self.write(rec)
        except Exception as exc:  # a guest never raises into its host: counted, logged
            self.failed(event, exc)

    def build(self, outcome: str, module_name: str | None, duration_s: float | None, *,
              compiler: str, path: str | None = None, error: str | None = None,
              reason: str | None = None, state: _phase.PhaseState | None = None) -> None:
        """Count and log one JIT build (``built``, ``hit`` or ``failed``) and write its
        compile-log line (``reason``: why it was built again, where the compiler says;
        ``state``: the phase it began in, default the current one); a failure of ours is
        counted, never raised."""
        try:
            state = state or self.phase()
            self.measure(lambda m: m.jit_build(state.phase, outcome, duration_s,
                                               compiler=compiler))
            if outcome != compile_log.CACHED:
                log = logger.warning if state.phase == "serving" or outcome == "failed" \
                    else logger.debug
                log("sglang-warmup: %s build %s %s in %.3f s (phase %s)%s", compiler,
                    module_name, outcome, duration_s or 0.0, state.phase,
                    f": {reason}" if reason else "")
            rec = self.new_record(compile_log.JIT_BUILD, state, compiler)
            rec.update({"outcome": outcome, "module_name": module_name,
                        "duration_s": duration_s, "path": path, "cache_hit": outcome == compile_log.CACHED})
            if error is not None:
                rec["error"] = error
            if reason is not None:
                rec["reason"] = reason
            self.write(rec)
        except Exception as exc:  # a guest never raises into its host
            self.failed(compiler, exc)

    def failed(self, hook: str, exc: BaseException) -> None:
        """Log and count a failure of our own recording; never raises."""
        global _error_logs
        try:
            _error_logs += 1
            log = logger.warning if _error_logs <= _MAX_ERROR_LOGS else logger.debug
            log("sglang-warmup: recording in %s failed (the host call went on): %r", hook, exc)
            self.metrics.hook_error(hook)
        except Exception as again:  # counting a guest's failure never raises into its host
            logger.debug("sglang-warmup: the failure in %s was not counted: %r", hook, again)

    def measure(self, record: Callable[[Metrics], None]) -> None:
        """Record one sample through our metrics (``record(metrics)``); a failure is counted,
        not raised."""
        try:
            record(self.metrics)
        except Exception as exc:  # a guest never raises into its host
            self.failed("metrics", exc)

    def write(self, record: dict) -> None:
        """Append ``record`` to this process's compile log (if there is one)."""
        if self.log is None:
            return
        try:
            self.log.write(record)
        except Exception as exc:  # a guest never raises into its host: counted, logged
            self.failed("compile_log", exc)

    def add(self, name: str, state: str, detail: str = "") -> None:
        """Report one hook point (see :class:`HookStatus`)."""
        self._hooks.append(HookStatus(name, state, detail))

    def on_uninstall(self, undo: Callable[[], None]) -> None:
        """Run ``undo`` at uninstall (in reverse order of registration)."""
        self._undo.append(undo)

    # --- install / uninstall ------------------------------------------------------------------
    def install(self) -> None:
        triton_version = self.triton.install()
        layout = self.jit.install()
        self.gc.install()
        self.dynamo.install()
        self.report = InstallReport(
            triton_version=triton_version,
            sglang_jit_layout=layout,
            hooks=tuple(self._hooks),
            state_dir=str(self.state_dir) if self.state_dir is not None else None,
            multiprocess_dir=metrics.multiprocess_dir() or None,
        )

    def uninstall(self) -> None:
        self.active = False
        for undo in reversed(self._undo):
            try:
                undo()
            except Exception as exc:  # best-effort cleanup: the other steps still run, logged
                logger.debug("sglang-warmup: uninstall step failed: %r", exc)
        self._undo.clear()
        if self.log is not None:
            self.log.close()

    def current_report(self) -> InstallReport:
        hooks = []
        for h in self.report.hooks:
            position = self.triton.position(h.name)
            if position is not None:
                hooks.append(HookStatus(h.name, h.state, position))
            elif h.state == "armed":
                module = h.name.rsplit(".", 1)[0]
                now = "patched" if module in sys.modules else "not imported yet"
                hooks.append(HookStatus(h.name, h.state, now))
            else:
                hooks.append(h)
        return dataclasses.replace(self.report, hooks=tuple(hooks))
