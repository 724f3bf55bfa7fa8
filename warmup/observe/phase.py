"""The phase every compile event is stamped with (init, warmup, serving), shared by all SGLang
processes through one small state file.

The warm-up driver runs in SGLang's main (HTTP) process while kernels compile in the scheduler
processes, so the phase cannot live in a Python variable alone.  The launcher points
``WARMUP_STATE_DIR`` at a directory before SGLang spawns its workers; ``set_phase`` writes
``<state_dir>/phase.json`` atomically (temporary file + ``os.replace``) and every process reads it
back with ``current()``, which costs one ``stat`` per call while the file is unchanged.

Without a state directory the phase is an in-process value only.  Reading never raises: an
unreadable or malformed file yields the last good value.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from cache_tools import atomic
from warmup import settings
from warmup.errors import WarmupError

logger = logging.getLogger("sglang_warmup.phase")

#: The closed set of phase labels, in the order a server goes through them.
PHASES: tuple[str, ...] = ("init", "warmup", "serving")

PHASE_FILE = "phase.json"

#: The ``shape_class`` values the driver itself sets (no plan class may take one:
#: ``warmup.plan.spec.RESERVED_CLASSES`` refuses them).  While the driver's final cache flush is
#: in flight:
FLUSH = "flush"
#: The ``shape_class`` of the ``warmup`` phase after the plan, while SGLang's own start-up
#: (its warm-up request) runs.
SGLANG_STARTUP = "sglang_startup"


@dataclass(frozen=True)
class PhaseState:
    """Where the server stands.

    ``phase``: one of ``PHASES``.  ``shape_class``: the plan's shape class being warmed (only
    during ``warmup``), else None.  ``request``: index of the warm-up request in flight, else
    None.  ``since``: unix time (seconds) at which this state was set.
    """

    phase: str = "init"
    shape_class: str | None = None
    request: int | None = None
    since: float = 0.0

    def to_json(self) -> dict:
        return asdict(self)


_lock = threading.Lock()


def _new_lock_in_child() -> None:
    # A child forked while another thread of the parent held the lock would wait for it forever.
    global _lock
    _lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_new_lock_in_child)
_local = PhaseState()  # the in-process value (always updated by set_phase)
# One cache per phase file: path -> ((st_ino, st_mtime_ns, st_size), PhaseState).
# os.replace gives every version a fresh inode, so the key changes even when two writes
# land in the same mtime tick.
_cache: dict[str, tuple[tuple[int, int, int], PhaseState]] = {}


def resolve_state_dir(explicit: str | os.PathLike | None = None) -> Path | None:
    """The state directory in effect: ``explicit`` if given, else ``WARMUP_STATE_DIR``, else None."""
    if explicit is not None and str(explicit) != "":
        return Path(explicit)
    configured = settings.STATE_DIR.get()
    return Path(configured) if configured else None


def validate(phase: str) -> str:
    """Return ``phase`` if it is one of PHASES, else raise WarmupError."""
    if phase not in PHASES:
        raise WarmupError(
            f"unknown phase {phase!r}: expected one of {', '.join(PHASES)}",
            hint="phases are a closed set so that metric labels stay bounded",
        )
    return phase


def set_phase(phase: str, shape_class: str | None = None, request: int | None = None, *,
              state_dir: str | os.PathLike | None = None) -> PhaseState:
    """Enter ``phase`` (optionally naming the shape class and request in flight) and return the
    new state.

    Always updates the in-process value; also writes ``<state_dir>/phase.json`` when a state
    directory is configured.  A file that cannot be written is logged, not raised: the phase is
    bookkeeping, and the warm-up itself must go on.
    """
    global _local
    validate(phase)
    if request is not None and (isinstance(request, bool) or not isinstance(request, int)):
        raise WarmupError(f"phase request must be an integer or None, got {request!r}",
                          hint="pass the index of the warm-up request in flight")
    new = PhaseState(phase=phase, shape_class=None if shape_class is None else str(shape_class),
                     request=request, since=time.time())
    with _lock:
        _local = new
    directory = resolve_state_dir(state_dir)
    if directory is not None:
        try:
            _write(directory / PHASE_FILE, new)
        except OSError as exc:
            logger.warning("sglang-warmup: cannot write the phase file in %s: %s "
                           "(other processes keep seeing the previous phase)", directory, exc)
    return new


def current(*, state_dir: str | os.PathLike | None = None) -> PhaseState:
    """The phase in effect: the state file when there is one, else the in-process value.

    Costs one ``stat`` while the file is unchanged.  Never raises.
    """
    try:
        directory = resolve_state_dir(state_dir)
    except WarmupError:  # a malformed variable must not break a compile hook
        directory = None
    if directory is None:
        return _local
    path = str(directory / PHASE_FILE)
    try:
        st = os.stat(path)
    except OSError:
        return _cached_or_local(path)
    key = (st.st_ino, st.st_mtime_ns, st.st_size)
    hit = _cache.get(path)
    if hit is not None and hit[0] == key:
        return hit[1]
    try:
        state = _parse(Path(path).read_bytes())
    except (OSError, ValueError) as exc:
        logger.debug("sglang-warmup: unreadable phase file %s: %s", path, exc)
        return _cached_or_local(path)
    _cache[path] = (key, state)
    return state


def reset() -> None:
    """Forget the in-process value and every cached file read (for tests)."""
    global _local
    with _lock:
        _local = PhaseState()
        _cache.clear()


def _cached_or_local(path: str) -> PhaseState:
    hit = _cache.get(path)
    return hit[1] if hit is not None else _local


def _write(path: Path, state: PhaseState) -> None:
    """Atomic write (every process reads it); no fsync: a phase that is lost in a crash of the
    machine is rewritten by the next launch."""
    atomic.write_bytes(path, json.dumps(state.to_json(), sort_keys=True).encode(), fsync=False)


def _parse(raw: bytes) -> PhaseState:
    """A PhaseState from the file's bytes; ValueError when anything is off."""
    data = json.loads(raw)
    if not isinstance(data, dict):
        raise ValueError("not a JSON object")
    phase = data.get("phase")
    if phase not in PHASES:
        raise ValueError(f"unknown phase {phase!r}")
    shape_class = data.get("shape_class")
    request = data.get("request")
    since = data.get("since", 0.0)
    if shape_class is not None and not isinstance(shape_class, str):
        raise ValueError("shape_class is not a string")
    if request is not None and (isinstance(request, bool) or not isinstance(request, int)):
        raise ValueError("request is not an integer")
    if isinstance(since, bool) or not isinstance(since, (int, float)):
        raise ValueError("since is not a number")
    return PhaseState(phase=phase, shape_class=shape_class, request=request, since=float(since))
