"""The fix registry: which fixes exist, in which order they are decided, how their modes and
dependencies combine into a verdict, and what this process has applied.

Per target module the fixes are decided in a fixed order when the module is imported:
``sparse_prefill_utils`` -> fix 3; ``deepseek_v4_backend`` -> fix 2, fix 1, fix 4 (fix 1 only
with fix 2); ``deepseek_v4_hook`` -> fix 5 (only with fixes 1 and 2, read from the backend's
source file when the backend is not imported in this process).  Each decision is: mode
(WARMUP_FIX_<N>) -> detect -> dependencies -> build -> install -> verify (detect again); a
fix that fails verification is removed again.  Nothing here raises into SGLang.
"""

from __future__ import annotations

import importlib
import logging
import sys
import threading
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, Callable, Iterable

from warmup import settings
from warmup.errors import WarmupError
from warmup.patches import (
    fix1_low_ratio_window as fix1,
    fix2_live_rows as fix2,
    fix3_async_lengths as fix3,
    fix4_hoisted_rows as fix4,
    fix5_context_cap as fix5,
)
from warmup.observe.importer import finder
from warmup.patches.source import FileView, LiveView, TargetMissing, mark_of
from warmup.patches.status import FixStatus, Refused

logger = logging.getLogger("sglang_warmup.patches")

FIXES = (fix1, fix2, fix3, fix4, fix5)
BY_NUMBER = {fix.NUMBER: fix for fix in FIXES}
#: Target module -> fix numbers, in decision order.
ORDER: dict[str, tuple[int, ...]] = {
    fix3.MODULE: (3,),
    fix1.MODULE: (2, 1, 4),
    fix5.MODULE: (5,),
}


@dataclass
class _State:
    """This process's patches: verdicts, the attributes replaced, the last cap decision."""

    statuses: dict[int, FixStatus] = field(default_factory=dict)
    originals: dict[int, tuple[Any, str, bool, Any]] = field(default_factory=dict)
    cap: tuple[bool, str] | None = None
    armed: bool = False
    #: the undo of each post-import watch this registry placed
    unwatch: list[Callable[[], None]] = field(default_factory=list)
    lock: threading.RLock = field(default_factory=threading.RLock)


_state = _State()
_views: dict[str, FileView] = {}


def mode_of(number: int) -> str:
    """WARMUP_FIX_<N> (``auto`` | ``on`` | ``off``); raises WarmupError on a bad value."""
    return settings.fix_mode(number)


class Context:
    """What one fix's decision may consult: modes, and the status of the other fixes.

    ``statuses`` holds decisions made in this run; a fix not decided there is read from the
    process registry, else predicted from its module's source file (nothing imported).
    """

    def __init__(self, statuses: dict[int, FixStatus] | None = None) -> None:
        self.statuses = _state.statuses if statuses is None else statuses

    def mode(self, number: int) -> str:
        try:
            return mode_of(number)
        except WarmupError:
            return "off"

    def status(self, number: int) -> FixStatus:
        found = self.statuses.get(number) or _state.statuses.get(number)
        if found is not None and found.verdict != "pending":
            return found
        return predict(number, self)

    def is_active(self, number: int) -> bool:
        return self.status(number).active

    def record_cap(self, lift: bool, reason: str) -> None:
        _state.cap = (lift, reason)


def _row(fix: Any, mode: str, verdict: str, detected: str | None, reason: str,
         predicted: bool = False) -> FixStatus:
    return FixStatus(number=fix.NUMBER, name=fix.NAME, target=fix.TARGET, mode=mode,
                     verdict=verdict, detected=detected, reason=reason, predicted=predicted)


def _owner(fix: Any, module: ModuleType) -> Any:
    if fix.CLASS is None:
        return module
    owner = getattr(module, fix.CLASS, None)
    if not isinstance(owner, type):
        raise TargetMissing(f"{module.__name__} has no class {fix.CLASS}")
    return owner


def evaluate(fix: Any, view: LiveView | FileView, ctx: Context, *, apply: bool) -> FixStatus:
    """Decide one fix against one view; with ``apply`` (live views only) install it."""
    module = view.module if isinstance(view, LiveView) else None
    predicted = module is None
    try:
        mode = mode_of(fix.NUMBER)
    except WarmupError as exc:
        return _row(fix, "invalid", "refused", None, f"{exc.message} ({exc.hint})", predicted)
    if mode == "off":
        return _row(fix, mode, "off", None, f"WARMUP_FIX_{fix.NUMBER}=off", predicted)
    try:
        if module is not None:
            owner = _owner(fix, module)
            if mark_of(vars(owner).get(fix.ATTR)) == fix.NUMBER:
                return _row(fix, mode, "applied", None, "already applied in this process")
        detection = fix.detect(view, ctx)
    except TargetMissing as exc:
        if mode == "on":
            return _row(fix, mode, "refused", None,
                        f"forced on, but the target is missing: {exc}", predicted)
        return _row(fix, mode, "absent", None,
                    f"nothing to fix: {exc} (this release predates the code the fix targets, "
                    "or has another design)", predicted)
    except Exception as exc:  # noqa: BLE001 - detection reads SGLang's code: any failure refuses
        return _row(fix, mode, "refused", None,
                    f"detection failed: {type(exc).__name__}: {exc}", predicted)
    if not detection.needed and mode == "auto":
        return _row(fix, mode, "upstream", detection.label, detection.reason, predicted)
    detected = detection.label if detection.needed else f"forced ({detection.label})"
    requires = getattr(fix, "requires", None)
    problem = requires(ctx) if requires else None
    if problem:
        return _row(fix, mode, "refused", detected, problem, predicted)
    if not apply or module is None:
        return _row(fix, mode, "needed", detected, detection.reason, predicted)
    return _install(fix, module, mode, detected, detection.reason, ctx)


def _install(fix: Any, module: ModuleType, mode: str, detected: str, why: str,
             ctx: Context) -> FixStatus:
    owner = _owner(fix, module)
    own = fix.ATTR in vars(owner)
    original = vars(owner)[fix.ATTR] if own else getattr(owner, fix.ATTR)
    try:
        replacement = fix.build(module, original, ctx)
    except Refused as exc:
        return _row(fix, mode, "refused", detected, str(exc))
    except Exception as exc:  # noqa: BLE001 - a build against SGLang's code: any failure refuses
        return _row(fix, mode, "refused", detected,
                    f"could not build the patch: {type(exc).__name__}: {exc}")
    setattr(owner, fix.ATTR, replacement)
    _state.originals[fix.NUMBER] = (owner, fix.ATTR, own, original)
    try:
        note = fix.verify(module, replacement, original)
    except Exception as exc:  # noqa: BLE001 - a patch that fails its check is taken off, reported
        _restore(fix.NUMBER)
        return _row(fix, mode, "refused", detected,
                    f"verification failed, patch removed: {type(exc).__name__}: {exc}")
    return _row(fix, mode, "applied", detected, f"{why}; {note}")


def _restore(number: int) -> None:
    entry = _state.originals.pop(number, None)
    if entry is None:
        return
    owner, attr, own, original = entry
    if own:
        setattr(owner, attr, original)
    else:
        delattr(owner, attr)


def predict(number: int, ctx: Context | None = None) -> FixStatus:
    """The verdict fix ``number`` would get, read from its module's source file."""
    fix = BY_NUMBER[number]
    try:
        view = _views.get(fix.MODULE)
        if view is None:
            view = _views[fix.MODULE] = FileView.of(fix.MODULE)
    except Exception as exc:  # noqa: BLE001 - no source, no prediction
        return _row(fix, Context().mode(number), "refused", None,
                    f"cannot read the source of {fix.MODULE}: {exc}", predicted=True)
    return evaluate(fix, view, ctx or Context({}), apply=False)


def _log(status: FixStatus) -> None:
    level = logging.WARNING if status.verdict == "refused" else logging.INFO
    detected = f" [{status.detected}]" if status.detected else ""
    logger.log(level, "sglang-warmup: fix %d (%s): %s%s: %s", status.number, status.name,
               status.verdict, detected, status.reason)


def on_import(module: ModuleType) -> None:
    """Decide (and apply) every fix that targets ``module``; never raises."""
    for number in ORDER.get(module.__name__, ()):
        fix = BY_NUMBER[number]
        try:
            with _state.lock:
                status = evaluate(fix, LiveView(module), Context(), apply=True)
                _state.statuses[number] = status
        except Exception as exc:  # noqa: BLE001 - a guest never raises into its host
            status = _row(fix, "auto", "refused", None,
                          f"internal error: {type(exc).__name__}: {exc}")
            _state.statuses[number] = status
        _log(status)


def activate() -> None:
    """Arm every fix in this process: patch targets already imported, watch the others."""
    try:
        with _state.lock:
            if _state.armed:
                return
            _state.armed = True
        for name in ORDER:
            module = sys.modules.get(name)
            if module is not None:
                on_import(module)
            else:
                _state.unwatch.append(finder().watch(name, on_import))
    except Exception as exc:  # noqa: BLE001 - a guest never raises into its host: warned
        logger.warning("sglang-warmup: patches not armed: %s: %s", type(exc).__name__, exc)


def status() -> list[FixStatus]:
    """One row per fix for this process (``pending`` where the target is not imported)."""
    rows = []
    for fix in FIXES:
        found = _state.statuses.get(fix.NUMBER)
        if found is None:
            why = ("the target module is not imported in this process" if _state.armed
                   else "patches are not activated in this process")
            found = _row(fix, Context().mode(fix.NUMBER), "pending", None, why)
        elif fix.NUMBER == fix5.NUMBER and found.verdict == "applied" and _state.cap:
            lift, reason = _state.cap
            found = _row(fix, found.mode, found.verdict, found.detected,
                         f"{found.reason}; last validation {'lifted' if lift else 'kept'} "
                         f"the cap: {reason}")
        rows.append(found)
    return rows


def inspect_installed(*, apply: bool, modules: Iterable[str] = tuple(ORDER)) -> list[FixStatus]:
    """Import the target modules and decide every fix.

    ``apply=True`` activates the patches in this process (they are installed and verified
    exactly as in a server process) and returns ``status()``; ``apply=False`` only detects,
    so fixes that would apply read ``needed``.  Import errors propagate (the caller reports).
    """
    if apply:
        activate()
        for name in modules:
            importlib.import_module(name)
        return status()
    local: dict[int, FixStatus] = {}
    ctx = Context(local)
    for name in modules:
        module = importlib.import_module(name)
        for number in ORDER[name]:
            fix = BY_NUMBER[number]
            if _state.statuses.get(number) is not None:
                local[number] = _state.statuses[number]
                continue
            local[number] = evaluate(fix, LiveView(module), ctx, apply=False)
    return [local[fix.NUMBER] for fix in FIXES if fix.NUMBER in local]


def is_active(number: int) -> bool:
    return Context().is_active(number)


def revert() -> None:
    """Remove every patch of this process and forget all decisions (tests, deactivation)."""
    with _state.lock:
        for number in sorted(_state.originals, reverse=True):
            _restore(number)
        _state.statuses.clear()
        _state.cap = None
        _state.armed = False
        for undo in _state.unwatch:
            undo()
        _state.unwatch.clear()
        _views.clear()
