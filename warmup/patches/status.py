"""The status of one fix in one process: what detection found and what was done about it."""

from __future__ import annotations

from dataclasses import asdict, dataclass

#: Verdicts, in the words of ``sglang-warmup patches status``.
#: needed   - the bug-shaped code is present and the fix would apply (detection-only runs)
#: applied  - the fix is installed in this process and verified
#: upstream - not needed: the installed SGLang has the fix (its code is the fixed shape)
#: absent   - not needed: the function the fix targets does not exist in the installed SGLang
#:            (an older release, e.g. 0.5.17, or another design); nothing here to fix
#: refused  - needed or forced, but it cannot or must not apply here (``reason`` says why)
#: off      - WARMUP_FIX_<N>=off
#: pending  - the target module has not been imported in this process yet
VERDICTS: tuple[str, ...] = ("needed", "applied", "upstream", "absent", "refused", "off",
                             "pending")

#: Verdicts under which a fix's effect is present (or will be, in a detection-only run), or
#: the code it guards does not exist: a fix that depends on it may go ahead.
ACTIVE: frozenset[str] = frozenset({"applied", "upstream", "absent", "needed"})


class Refused(RuntimeError):
    """A fix cannot be built for the installed code; the message is the reason."""


@dataclass(frozen=True)
class Detection:
    """What the detector found in the installed code.

    ``needed``: the bug-shaped code is present.  ``match``: ``exact`` when every inspected
    function's source hash is a known one (0.5.22 for a needed fix, 0.5.23 for a clean one),
    ``structural`` when the decision rests on the structural checks alone.  ``reason``: one
    sentence for the operator.
    """

    needed: bool
    match: str
    reason: str

    @property
    def label(self) -> str:
        return f"{'needed' if self.needed else 'clean'}/{self.match}"


@dataclass(frozen=True)
class FixStatus:
    """One row of ``patches status``.

    ``number``/``name``: the fix.  ``target``: ``module:Class.member`` it patches.  ``mode``:
    ``auto``/``on``/``off`` from WARMUP_FIX_<N>.  ``verdict``: one of ``VERDICTS``.
    ``detected``: the detection label (``needed/exact``, ``clean/structural``, ...), or None
    when detection did not run.  ``reason``: why, in one or two sentences.  ``predicted``: True
    when the row was derived from the source file without importing the target module.
    """

    number: int
    name: str
    target: str
    mode: str
    verdict: str
    detected: str | None
    reason: str
    predicted: bool = False

    @property
    def active(self) -> bool:
        return self.verdict in ACTIVE

    def to_json(self) -> dict:
        return asdict(self)
