"""The recorder every source of compile events writes through: the seam between the sources
(Triton's hooks, SGLang's JIT, Dynamo, garbage collections) and the one installation of a
process (:class:`warmup.observe.events._Installation` implements it)."""

from __future__ import annotations

from typing import Any, Callable, Protocol

from warmup.observe import metrics
from warmup.observe.phase import PhaseState


class Recorder(Protocol):
    """What a source of events may ask of the installation it belongs to."""

    #: False once the installation was taken off: a late hook call then records nothing.
    active: bool
    #: This process's compile-log writer, or None without a state directory.
    log: Any

    def phase(self) -> PhaseState:
        """The phase of now."""

    def new_record(self, event: str, state: PhaseState, compiler: str) -> Any:
        """A compile-log record of ``event`` stamped with the phase ``state``."""

    def write(self, record: Any) -> None:
        """Append a record to this process's compile log."""

    def note(self, event: str, compiler: str, **fields: Any) -> None:
        """Write one record of ``event`` stamped with the phase of now."""

    def build(self, outcome: str, module_name: str | None, duration_s: float | None, *,
              compiler: str, path: str | None = None, error: str | None = None,
              reason: str | None = None, state: PhaseState | None = None) -> None:
        """Count, log and write one JIT build (in ``state``, default the current phase)."""

    def measure(self, record: Callable[[metrics.Metrics], None]) -> None:
        """Record one sample through the metrics."""

    def failed(self, hook: str, exc: BaseException) -> None:
        """Log and count a failure of our own recording."""

    def add(self, name: str, state: str, detail: str = "") -> None:
        """Report one hook point."""

    def on_uninstall(self, undo: Callable[[], None]) -> None:
        """Run ``undo`` when the installation is taken off."""
