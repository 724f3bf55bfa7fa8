"""The steps record: which steps of an expansion paid a first-time cost when a server ran them,
learned by a bake (:mod:`warmup.coverage.quiet_steps`, in a server started from the caches it
baked) and read by a launch from those caches, which then sends only those (``serve --steps
FILE``).

A step that compiled, loaded, traced or built nothing and ran as fast as its replay added
nothing that the steps before it had not: a launch from the same caches, sending the same steps
in the same order, gets the same first-time costs (a kernel is loaded from disk at the same
step, a ``torch.compile`` graph is traced at the same step) from the loud steps alone.  The
record holds the loud steps (closed over the prefix steps they hit) and each step's evidence; it
applies only to the expansion it was learned on (its digest: every request as the driver sends
it, sampling parameters by value) on the same server (its facts, its server arguments, its
GPU), and to nothing else.  An edit of the plan file that sends the same requests on this
server (a comment, a class this server skips) leaves the record in force; the plan's sha256
is kept in the record for the reader, not compared.

The file is data (JSON, read bounded, every field checked); a damaged or foreign record is
refused in one line naming the file and the field, and the launch then sends the whole plan.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Mapping

from cache_tools import atomic, jsonfile
from warmup.errors import StepsError, shown

if TYPE_CHECKING:
    from warmup.plan.model import Expansion

FORMAT = "sglang-warmup-steps"
#: The record's name in a server's state directory (the second-pass check writes it there).
STATE_FILE = "steps.json"
#: 2: the expansion digest takes each request's sampling parameters (1: their family's name,
#: with the plan file's sha256 compared beside it); a version-1 record is read, never applied
VERSION = 2
READABLE = (1, 2)
#: A record of the shipped plans is some 30 KiB; a plan may have at most this many steps.
MAX_FILE_BYTES = 8 * 1024 * 1024
MAX_STEPS = 100_000
#: the cold start's compiles a record may count (a shipped plan's bake: some 100)
MAX_BAKED = 10_000_000
#: Facts never compared: where the facts came from, and the capacities SGLang sizes from the
#: GPU's free memory at each start (the KV pool, the request cap it implies), which move a little
#: from launch to launch; where they change the steps, the digest differs.
_NOT_COMPARED = frozenset({"source", "assumed", "max_total_tokens", "max_running_requests",
                           "max_req_input_len"})  # min(context, KV pool) - a few: moves too
#: Server arguments never compared: where the server listens and logs, what it measures, its
#: secrets and timeouts, its seed (SGLang draws one when none is given), which GPU index, node
#: and network devices it uses, where its files live (the model's path: an image mounts it
#: elsewhere than the bake; the facts and the kernel-shaping arguments name the model), its
#: front end's parsers and queue, and the memory sizing whose facts are not compared either
#: (_NOT_COMPARED): none of them changes a kernel, and a bake usually runs with other ones than
#: the image it is for.  A record holds a hash of each other argument, never its value.
_OPERATIONAL = re.compile(
    r"^(host|random_seed|served_model_name|warmups|skip_server_warmup"
    r"|mem_fraction_static|max_total_tokens|max_running_requests|base_gpu_id|gpu_id_step"
    r"|dist_init_addr|stream_interval|fastapi_root_path|stat_loggers|node_rank|nnodes"
    r"|hf_chat_template_name|chat_template|completion_template|enable_cache_report"
    r"|max_queued_requests|show_time_cost|tool_call_parser|reasoning_parser)$"
    r"|(^|_)ports?$|timeout|_secs$|key|password|secret|^log_|ssl|metric|bucket|otlp|trace"
    r"|uvicorn|dump|_log_interval|watchdog|watermark|_paths?$|_dir$|_file$|_folder$|_socket$"
    r"|endpoint|_urls?$|_ip$|_addr$|ib_device|numa_node|weight_loader_prefetch")
#: bounds of a record's GEMM rows: shapes, rows per shape, the largest row count
MAX_GEMM_SHAPES = 1024
MAX_GEMM_ROWS = 65_536
MAX_ROW = 1 << 24
MAX_KEY = 300
#: the longest text a record holds (a device name, a BLAS id)
MAX_TEXT = 4096
_HINT = "learn it again: `sglang-warmup prebake` writes ARCHIVE.steps.json beside the archive"
#: A first pass ran slower throughout when the median first-over-second ratio of its steps
#: with nothing recorded is this or more (a slower stretch of the host: steps with no cost of
#: their own then look like first hits) ...
DRIFT_RATIO = 1.15
#: ... over at least this many such steps (fewer say nothing of a whole pass)
DRIFT_MIN_STEPS = 6


def slower(a: float, b: float, ratio: float, min_ms: float) -> bool:
    """The timing rule of a record: ``a`` ms took ``ratio`` times and ``min_ms`` more than
    ``b`` ms."""
    return a > ratio * b and a - b >= min_ms


def slower_throughout(ratios: Iterable[float]) -> float | None:
    """The median of ``ratios`` (first pass over second, of the steps with nothing recorded)
    where it says the whole first pass ran slower: ``DRIFT_RATIO`` or more over
    ``DRIFT_MIN_STEPS`` steps or more; None otherwise."""
    values = list(ratios)
    if len(values) < DRIFT_MIN_STEPS:
        return None
    median = statistics.median(values)
    return median if median >= DRIFT_RATIO else None


@dataclass(frozen=True)
class StepEvidence:
    """One step as the bake saw it: its first send and its replay (ms; None when it failed or
    was not replayed) and the compile-log records stamped with it (compiles, disk hits, builds,
    traces, first uses in the learning start; what the cold start compiled there and the caches
    keep)."""

    index: int
    first_ms: float | None
    replay_ms: float | None
    events: int

    def to_json(self) -> list[Any]:
        return [self.index, _ms(self.first_ms), _ms(self.replay_ms), self.events]


@dataclass(frozen=True)
class GemmRows:
    """Where the GEMM sweep of a start from the baked caches met cuBLAS loading a kernel: per
    dense GEMM shape (:attr:`warmup.serve.gemm_shapes.Shape.key_text`), the row counts up to
    ``reached`` (where the sweep's budget stopped it, or its row limit) whose call held the CPU
    while it loaded one.  A later start on the same GPU and libraries (``blas``) with the same
    row limit (``max_rows``) sweeps only those up to ``reached``: the others loaded nothing."""

    blas: str
    max_rows: int
    reached: int
    rows: Mapping[str, tuple[int, ...]]

    def to_json(self) -> dict[str, Any]:
        return {"blas": self.blas, "max_rows": self.max_rows, "reached": self.reached,
                "rows": {k: list(v) for k, v in self.rows.items()}}

    def merged(self, other: GemmRows | None) -> GemmRows:
        """These rows and ``other``'s (another start's sweep on the same GPU, libraries and row
        limit: cuBLAS loads the same kernels in every fresh process, and a call the timing
        missed in one start is seen in the other), up to the row count both reached; these
        alone where ``other`` differs."""
        if other is None or (other.blas, other.max_rows) != (self.blas, self.max_rows):
            return self
        top = min(self.reached, other.reached)
        keys = dict.fromkeys([*self.rows, *other.rows])
        return GemmRows(self.blas, self.max_rows, top, {
            k: tuple(sorted(x for x in {*self.rows.get(k, ()), *other.rows.get(k, ())}
                            if x <= top)) for k in keys})


def gemm_rows(sweeps: Iterable[Mapping[str, Any]]) -> GemmRows | None:
    """The GEMM sweeps' load rows of one start, every scheduler's together, up to the row count
    the shortest of them reached, when each swept every row count (none at rows learned before)
    on the same libraries and row limit; None otherwise (a later start then sweeps whole).  A
    shape whose rows are not a list, or that a record could not hold (:data:`MAX_GEMM_SHAPES`,
    :data:`MAX_GEMM_ROWS`, a key of more than :data:`MAX_KEY` characters), is left out: a
    later start sweeps it whole."""
    sweeps = list(sweeps)
    if not sweeps or any(s.get("learned") or not isinstance(s.get("load_rows"), Mapping)
                         for s in sweeps):
        return None
    b, m = sweeps[0].get("blas"), sweeps[0].get("max_rows")
    tops = [r for r in (s.get("rows_reached") for s in sweeps)
            if isinstance(r, int) and not isinstance(r, bool)]
    if not isinstance(b, str) or not b or len(b) > MAX_TEXT or not isinstance(m, int) \
            or isinstance(m, bool) or not 1 <= m <= MAX_ROW or len(tops) != len(sweeps) \
            or not all(s.get("blas") == b and s.get("max_rows") == m for s in sweeps) \
            or not all(1 <= r <= m for r in tops):
        return None
    top = min(tops)
    rows: dict[str, set[int]] = {}
    unknown: set[str] = set()
    for s in sweeps:
        for key, xs in s["load_rows"].items():
            if not isinstance(xs, list):
                unknown.add(str(key))
                continue
            rows.setdefault(str(key), set()).update(x for x in xs if _is_int(x) and 1 <= x <= top)
    kept = {k: tuple(sorted(v)) for k, v in rows.items()
            if k not in unknown and len(k) <= MAX_KEY and len(v) <= MAX_GEMM_ROWS}
    if len(kept) > MAX_GEMM_SHAPES:
        return None
    return GemmRows(blas=b, max_rows=m, reached=top, rows=kept)


@dataclass(frozen=True)
class StepRecord:
    """The loud steps of one expansion on one server (``keep``, sorted step indices) and the
    rule they were picked by (``ratio``, ``min_ms``: a step is loud when its first send took
    both ``ratio`` times and ``min_ms`` more than its replay)."""

    plan: str
    plan_sha256: str
    expansion_digest: str
    steps: int
    keep: tuple[int, ...]
    ratio: float
    min_ms: float
    facts: Mapping[str, Any] = field(default_factory=dict)
    device: str = ""
    learned_at: float = 0.0
    evidence: tuple[StepEvidence, ...] = ()
    #: the bake's server arguments as :func:`server_args_of` hashes them (empty: not compared)
    server_args: Mapping[str, str] = field(default_factory=dict)
    #: the GEMM sweep's load rows in that start (None: not learned; the sweep runs whole)
    gemm: GemmRows | None = None
    #: the format version it was written in (:data:`VERSION`; an earlier one never applies)
    version: int = VERSION
    #: the cold start's compiles counted in ``evidence`` (None: its compile log was not read)
    baked: int | None = None

    @property
    def quiet(self) -> int:
        return self.steps - len(self.keep)

    @property
    def drift(self) -> float | None:
        """How much slower the learning start's first pass ran throughout than its replay
        (:func:`slower_throughout` of the steps with nothing recorded); None: not slower."""
        return slower_throughout(e.first_ms / e.replay_ms for e in self.evidence
                                 if not e.events and e.first_ms is not None and e.replay_ms)

    @property
    def drift_notes(self) -> tuple[str, ...]:
        """What a learning start slower throughout (:attr:`drift`) means for this record: how
        many of its kept steps the timing rule alone kept."""
        drift = self.drift
        if drift is None:
            return ()
        kept = set(self.keep)
        timed = sum(1 for e in self.evidence if e.index in kept and not e.events
                    and e.first_ms is not None and e.replay_ms is not None
                    and slower(e.first_ms, e.replay_ms, self.ratio, self.min_ms))
        return (f"the start that learned the steps record ran its first pass slower throughout "
                f"(a median {drift:.2f}x its replay over the steps with nothing recorded), so "
                f"the {timed} steps of the {len(self.keep)} kept for their timing alone may be "
                f"kept for the host's speed rather than a first-time cost, which makes the "
                f"warm-up longer; bake on a quieter host for a shorter record",)

    def to_json(self) -> dict[str, Any]:
        return {"format": FORMAT, "version": self.version, "plan": self.plan,
                "plan_sha256": self.plan_sha256, "expansion_digest": self.expansion_digest,
                "steps": self.steps, "keep": list(self.keep), "ratio": self.ratio,
                "min_ms": self.min_ms, "facts": dict(self.facts), "device": self.device,
                "learned_at": self.learned_at, "server_args": dict(self.server_args),
                "evidence": [e.to_json() for e in self.evidence],
                **({"gemm": self.gemm.to_json()} if self.gemm is not None else {}),
                **({"baked": self.baked} if self.baked is not None else {})}

    def write(self, path: str | os.PathLike[str]) -> None:
        atomic.write_text(path, json.dumps(self.to_json(), indent=1) + "\n")

    def mismatch(self, exp: Expansion, device: str = "") -> str | None:
        """Why this record does not apply to ``exp`` on this server (None: it applies)."""
        if self.version != VERSION:
            return (f"it was learned by an earlier release (record version {self.version}, whose "
                    f"digest named each request's sampling family, not its parameters): bake "
                    f"again to send only the loud steps")
        digest = exp.digest()  # a hash of every request: once
        if self.expansion_digest != digest or self.steps != len(exp.steps):
            return (f"it was learned on another expansion (plan {self.plan}, "
                    f"{self.steps} steps, digest {self.expansion_digest}; this launch: plan "
                    f"{exp.plan}, {len(exp.steps)} steps, digest {digest})")
        here = exp.facts.to_dict()
        for name in sorted(set(self.facts) | set(here)):
            if name in _NOT_COMPARED:
                continue
            if self.facts.get(name) != here.get(name):
                return (f"it was learned on a server whose {name} was "
                        f"{shown(self.facts.get(name))}, here {shown(here.get(name))}")
        if self.server_args and exp.server_args:
            differ = sorted(n for n in set(self.server_args) | set(exp.server_args)
                            if self.server_args.get(n) != exp.server_args.get(n))
            if differ:
                more = f" and {len(differ) - 3} more" if len(differ) > 3 else ""
                return (f"it was learned on a server launched with other {', '.join(differ[:3])}"
                        f"{more}")
        if self.device and device and self.device != device:
            return f"it was learned on a {self.device}, this server runs on a {device}"
        return None

    def skip(self, exp: Expansion) -> frozenset[int]:
        """The indices of ``exp``'s steps that this record leaves out (call :meth:`mismatch`
        first)."""
        keep = set(self.keep)
        return frozenset(s.index for s in exp.steps if s.index not in keep)


def this_device() -> str:
    """The GPU this process already runs on, as torch names it; empty where torch is not loaded
    (the warm-up never imports it) or has not initialized CUDA in this process (asking would
    initialize it: SGLang's main process leaves that to its schedulers)."""
    torch = sys.modules.get("torch")
    try:
        return str(torch.cuda.get_device_name()) if torch is not None \
            and torch.cuda.is_initialized() else ""
    except Exception:  # a driver error: the record names no device
        return ""


def server_args_of(server_args: Any) -> dict[str, str]:
    """SGLang's resolved server arguments, each as a short hash of its value (a record keeps
    no value, so no path or secret leaks into it), less the operational ones; empty where they
    cannot be read."""
    try:
        values = server_args.resolved_dict() if hasattr(server_args, "resolved_dict") \
            else dict(vars(server_args))
    except Exception:  # an SGLang we do not know: the record then compares the facts alone
        return {}
    out = {}
    for name, value in values.items():
        if _OPERATIONAL.search(str(name)):
            continue
        try:
            text = json.dumps(value, sort_keys=True, default=_plain)
        except (TypeError, ValueError, RecursionError):  # keys of mixed types, a cycle: unsaid
            continue
        out[str(name)] = hashlib.sha256(text.encode()).hexdigest()[:12]
    return out


def _plain(o: Any) -> Any:
    """A value JSON cannot hold, as something that compares by content across processes."""
    if isinstance(o, (set, frozenset)):
        return sorted(repr(x) for x in o)
    text = repr(o)
    return type(o).__name__ if " at 0x" in text else text  # an address differs every start


def _ms(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


def prefix_closure(exp: Expansion, keep: set[int]) -> set[int]:
    """``keep`` with every step whose request put in the cache the prefix a kept step's request
    hits (:meth:`~warmup.plan.model.Expansion.prefix_hits`: a prefix class's base, a chained
    prompt's predecessor), and so on for the steps so added: left out, a kept step would
    compute what it hit when the record was learned."""
    sources: dict[int, set[int]] = {}
    for (index, _pos), hit in exp.prefix_hits().items():
        sources.setdefault(index, set()).add(hit.source)
    out = set(keep)
    todo = list(keep)
    while todo:
        for source in sources.get(todo.pop(), ()):
            if source not in out:
                out.add(source)
                todo.append(source)
    return out


# --- reading ------------------------------------------------------------------------------------
def read(path: str | os.PathLike[str]) -> StepRecord:
    """The record in ``path``; StepsError names the file and the field that is wrong."""
    p = Path(path)
    try:
        data = jsonfile.load(p, MAX_FILE_BYTES)
    except jsonfile.JsonFileError as exc:
        raise StepsError(f"{p}: {exc}", hint=_HINT) from None
    try:
        return from_json(data)
    except StepsError as exc:
        raise StepsError(f"{p}: {exc.message}", hint=exc.hint) from None


def from_json(d: Any) -> StepRecord:
    """A record from its JSON document; StepsError names the first field that is wrong."""
    if not isinstance(d, dict):
        raise StepsError("a steps record is a JSON object", hint=_HINT)
    if d.get("format") != FORMAT:
        raise StepsError(f"format: expected {FORMAT!r}, not {shown(d.get('format'))}", hint=_HINT)
    if d.get("version") not in READABLE or isinstance(d.get("version"), bool):
        raise StepsError(f"version: expected one of {', '.join(map(str, READABLE))}, not "
                         f"{shown(d.get('version'))}", hint=_HINT)
    steps = _int(d, "steps", 0, MAX_STEPS)
    keep = d.get("keep")
    if not isinstance(keep, list) or len(keep) > steps:
        raise StepsError(f"keep: expected a list of at most {steps} step indices", hint=_HINT)
    for i, k in enumerate(keep):
        if not _is_int(k) or not 0 <= k < steps:
            raise StepsError(f"keep[{i}]: expected a step index from 0 to {steps - 1}, "
                             f"not {shown(k)}", hint=_HINT)
    if len(set(keep)) != len(keep):
        raise StepsError("keep: a step index is listed twice", hint=_HINT)
    facts = d.get("facts", {})
    if not isinstance(facts, dict) or len(facts) > 256:
        raise StepsError("facts: expected an object of at most 256 server facts", hint=_HINT)
    return StepRecord(plan=_text(d, "plan"), plan_sha256=_text(d, "plan_sha256"),
                      expansion_digest=_text(d, "expansion_digest"), steps=steps,
                      keep=tuple(sorted(keep)), ratio=_number(d, "ratio", 1.0, 1000.0),
                      min_ms=_number(d, "min_ms", 0.0, 1e6),
                      facts={str(k): _fact(k, v) for k, v in facts.items()},
                      device=_text(d, "device", required=False),
                      learned_at=_number(d, "learned_at", 0.0, 1e11, required=False),
                      evidence=_evidence(d.get("evidence", []), steps),
                      server_args=_hashes(d.get("server_args", {})),
                      gemm=_gemm(d.get("gemm")), version=int(d["version"]),
                      baked=None if d.get("baked") is None else _int(d, "baked", 0, MAX_BAKED))


def _gemm(value: Any) -> GemmRows | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise StepsError(f"gemm: expected an object, not {shown(value)}", hint=_HINT)
    rows = value.get("rows")
    if not isinstance(rows, dict) or len(rows) > MAX_GEMM_SHAPES:
        raise StepsError(f"gemm.rows: expected an object of at most {MAX_GEMM_SHAPES} shapes",
                         hint=_HINT)
    out: dict[str, tuple[int, ...]] = {}
    for key, xs in rows.items():
        if len(key) > MAX_KEY:
            raise StepsError(f"gemm.rows: a shape key of {len(key):,} characters (limit "
                             f"{MAX_KEY}): {shown(key[:MAX_KEY])}", hint=_HINT)
        if not isinstance(xs, list) or len(xs) > MAX_GEMM_ROWS \
                or not all(_is_int(x) and 1 <= x <= MAX_ROW for x in xs):
            raise StepsError(f"gemm.rows.{shown(key)}: expected a list of at most "
                             f"{MAX_GEMM_ROWS:,} row counts from 1 to {MAX_ROW:,}", hint=_HINT)
        out[key] = tuple(sorted(set(xs)))
    blas = _text(value, "blas", where="gemm.")
    max_rows = _int(value, "max_rows", 1, MAX_ROW, where="gemm.")
    reached = _int(value, "reached", 1, max_rows, where="gemm.")
    return GemmRows(blas=blas, max_rows=max_rows, reached=reached, rows=out)


def _evidence(value: Any, steps: int) -> tuple[StepEvidence, ...]:
    if not isinstance(value, list) or len(value) > steps:
        raise StepsError(f"evidence: expected a list of at most {steps} steps", hint=_HINT)
    out = []
    for i, e in enumerate(value):
        if not (isinstance(e, list) and len(e) == 4 and _is_int(e[0]) and 0 <= e[0] < steps
                and all(x is None or _finite(x, 0.0, 1e9) for x in e[1:3])
                and _is_int(e[3]) and 0 <= e[3] <= 1 << 31):
            raise StepsError(f"evidence[{i}]: expected [index, first_ms, replay_ms, events], "
                             f"not {shown(e)}", hint=_HINT)
        out.append(StepEvidence(e[0], e[1], e[2], e[3]))
    return tuple(out)


def _hashes(value: Any) -> dict[str, str]:
    if not (isinstance(value, dict) and len(value) <= 4096
            and all(len(k) <= 200 and isinstance(v, str) and len(v) <= 64
                    for k, v in value.items())):
        raise StepsError("server_args: expected an object of at most 4096 argument names and "
                         "their hashes", hint=_HINT)
    return dict(value)


def _fact(name: Any, value: Any) -> Any:
    """A fact as JSON holds it: a scalar, or a short list or object of scalars."""
    scalars = (str, int, float, bool, type(None))
    ok = isinstance(value, scalars) or (
        isinstance(value, list) and len(value) <= 1024 and all(isinstance(x, scalars) for x in value)
    ) or (isinstance(value, dict) and len(value) <= 1024
          and all(isinstance(x, scalars) for x in value.values()))
    if not ok:
        raise StepsError(f"facts.{shown(name)}: expected a value, a list or an object of values",
                         hint=_HINT)
    return value


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _finite(v: Any, lo: float, hi: float) -> bool:
    """A number from ``lo`` to ``hi``: compared before anything converts it, so an integer too
    large for a float (JSON allows 10**400) is out of range, never an OverflowError."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and lo <= v <= hi


def _int(d: dict, name: str, lo: int, hi: int, *, where: str = "") -> int:
    v = d.get(name)
    if not isinstance(v, int) or isinstance(v, bool) or not lo <= v <= hi:
        raise StepsError(f"{where}{name}: expected an integer from {lo} to {hi:,}, not "
                         f"{shown(v)}", hint=_HINT)
    return v


def _number(d: dict, name: str, lo: float, hi: float, *, required: bool = True) -> float:
    v = d.get(name)
    if v is None and not required:
        return lo
    if not isinstance(v, (int, float)) or not _finite(v, lo, hi):
        raise StepsError(f"{name}: expected a number from {lo:g} to {hi:g}, not {shown(v)}",
                         hint=_HINT)
    return float(v)


def _text(d: dict, name: str, *, required: bool = True, where: str = "") -> str:
    v = d.get(name)
    if v is None and not required:
        return ""
    if not isinstance(v, str) or len(v) > MAX_TEXT:
        raise StepsError(f"{where}{name}: expected a text, not {shown(v)}", hint=_HINT)
    return v
