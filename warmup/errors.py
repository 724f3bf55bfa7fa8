"""The WarmupError family: every error the product raises on purpose carries a hint (the fix)."""

from __future__ import annotations

import reprlib
from typing import TYPE_CHECKING, Any

from cache_tools.errors import HintedError, printable

if TYPE_CHECKING:  # an annotation only: the base layer imports nothing above it
    from warmup.serve.report import RunReport

_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxlist, _REPR.maxdict, _REPR.maxstring, _REPR.maxother = 2, 4, 4, 36, 36


def shown(value: Any) -> str:
    """A value for an error line: short (40 characters at most, nesting cut), printable."""
    try:
        text = _REPR.repr(value)
    except ValueError:  # an integer of more digits than int-to-text converts
        return "an integer of more than 4,300 digits"
    text = printable(text)
    return text if len(text) <= 40 else text[:37] + "..."


class WarmupError(HintedError):
    """An expected failure with a one-line message and a hint that says how to fix it.

    The CLI prints ``message`` and ``hint`` (never a traceback unless WARMUP_DEBUG=1) and exits
    with ``exit_code``.
    """


class PlanError(WarmupError):
    """A plan file is invalid; ``message`` starts with ``file:line: key.path:``."""

    exit_code = 2


class FactsError(WarmupError):
    """Server facts could not be obtained or are inconsistent."""

    exit_code = 2


class TransportError(WarmupError):
    """A request could not reach SGLang, or SGLang refused or aborted it."""


class HttpAppError(TransportError):
    """SGLang's HTTP app, called in-process, did not start an answer to a request (no 200): the
    app cannot carry it, which says nothing about the request; the caller sends it another way."""


class DriverError(WarmupError):
    """The warm-up failed in strict mode (a request or the final flush failed).  ``report``:
    the run report so far, set by the driver before it raises."""

    report: RunReport | None = None


class StepsError(WarmupError):
    """A steps record (the loud steps a bake learned) cannot be read or does not hold one."""

    exit_code = 2


class RegistrationError(WarmupError):
    """A plan could not be registered into SGLang's ``--warmups`` registry."""


class PatchError(WarmupError):
    """A patch was forced on where it cannot apply."""


class AuditMissesError(WarmupError):
    """An audit recorded more post-ready compile events than ``--max-misses`` allows."""

    exit_code = 3


class SidecarError(WarmupError):
    """The sidecar (or prebake) cannot start as configured, or cannot reach its server."""
