"""The only reader of WARMUP_* environment variables (and of the few other variables the
warm-up itself, not a cache, depends on).  Each value is read on access, so tests can
set and unset variables with ``monkeypatch.setenv``.  Also the only writer: :func:`activation_env`
is what a launcher puts in SGLang's environment, and :func:`plugin_entry_point` finds the plugin
SGLang's processes load.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Generic, TypeVar

if TYPE_CHECKING:
    from importlib import metadata

T = TypeVar("T")

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


@dataclass(frozen=True)
class EnvVar(Generic[T]):
    """One environment variable: its name, its default and how its text is parsed."""

    name: str
    default: T
    parse: Callable[[str], T]
    doc: str

    def get(self) -> T:
        raw = os.environ.get(self.name)
        if raw is None:
            return self.default
        try:
            return self.parse(raw.strip())
        except ValueError as exc:
            from warmup.errors import WarmupError

            raise WarmupError(
                f"environment variable {self.name}={raw!r}: {exc}",
                hint=f"{self.name}: {self.doc}",
            ) from None

    def is_set(self) -> bool:
        return self.name in os.environ


def _bool(text: str) -> bool:
    low = text.lower()
    if low in _TRUE:
        return True
    if low in _FALSE:
        return False
    raise ValueError("expected one of 1/0, true/false, yes/no, on/off")


def _mode(text: str) -> str:
    low = text.lower() or "auto"
    if low not in ("auto", "on", "off"):
        raise ValueError("expected auto, on or off")
    return low


def _str(text: str) -> str:
    return text


def _float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):        # a NaN budget or timeout would never run out
        raise ValueError("expected a finite number, e.g. 4 or 0.5")
    return value


def _names(text: str) -> tuple[str, ...]:
    names = tuple(dict.fromkeys(n.strip() for n in text.split(",") if n.strip()))
    for n in names:
        if not n.replace("_", "").isalnum() or not n[0].isalpha():
            raise ValueError(f"{n!r} is not a family name (letters, digits and _)")
    return names


# --- activation (the plugin entry point does nothing unless this is set) -------------------
ENABLE = EnvVar("WARMUP_ENABLE", False, _bool,
                "set to 1 to activate sglang-warmup inside SGLang processes (plugin gate)")
DEBUG = EnvVar("WARMUP_DEBUG", False, _bool, "set to 1 to print tracebacks from the CLI")

# --- the warm-up plan registered into --warmups ---------------------------------------------
PLAN = EnvVar("WARMUP_PLAN", "", _str,
              "path of the plan file that the plugin registers as a --warmups entry")
WARMUP_NAME = EnvVar("WARMUP_NAME", "", _str,
                     "name under which the plan is registered in SGLang's --warmups registry "
                     "(default: the plan's own name)")
REPORT = EnvVar("WARMUP_REPORT", "", _str, "path where the run report (JSON) is written")
LENIENT = EnvVar("WARMUP_LENIENT", False, _bool,
                 "set to 1 to warn and continue when a warm-up request or the flush fails")
REQUEST_TIMEOUT_S = EnvVar("WARMUP_REQUEST_TIMEOUT_S", 600.0, _float,
                           "seconds one warm-up request (or group) may take")
FLUSH_TIMEOUT_S = EnvVar("WARMUP_FLUSH_TIMEOUT_S", 60.0, _float,
                         "seconds SGLang may wait for idle before the final cache flush")
SEED = EnvVar("WARMUP_SEED", "0", _str, "seed of the random token ids of warm-up prompts")
SKIP_FAMILIES: EnvVar[tuple[str, ...]] = EnvVar("WARMUP_SKIP_FAMILIES", (), _names,
                       "comma-separated shape families to leave out of the warm-up (a class's "
                       "family, else its kind), e.g. logprobs,stream")

def _lets(text: str) -> tuple[tuple[str, str], ...]:
    """``NAME=EXPR;NAME=EXPR`` (expressions may hold commas) as ordered pairs."""
    out: list[tuple[str, str]] = []
    for item in filter(None, (part.strip() for part in text.split(";"))):
        name, eq, expr = item.partition("=")
        if not eq or not name.strip() or not expr.strip():
            raise ValueError(f"{item!r} is not NAME=EXPRESSION")
        out.append((name.strip(), expr.strip()))
    return tuple(out)


LETS: EnvVar[tuple[tuple[str, str], ...]] = EnvVar("WARMUP_LET", (), _lets,
              "semicolon-separated NAME=EXPRESSION overrides of the plan's let values, e.g. "
              "long_cap=65536")

CACHE_WATCH_S = EnvVar("WARMUP_CACHE_WATCH_S", 1.0, _float,
                       "seconds between two looks of the server's main process at the JIT "
                       "cache directories of the libraries without a hook (DeepGEMM, TileLang, "
                       "FlashInfer, ...); 0: not watched")

#: SGLang's own switch (read, never written): with it off, DeepGEMM builds a kernel the first
#: time a GEMM meets a new M range, after ready as well; no plan can send every M.
DEEPGEMM_PRECOMPILE = EnvVar("SGLANG_JIT_DEEPGEMM_PRECOMPILE", True, _bool,
                             "SGLang's DeepGEMM precompile at startup (SGLang's default: on)")

GEMM_SWEEP_S = EnvVar("WARMUP_GEMM_SWEEP_S", 4.0, _float,
                      "seconds each scheduler may spend after loading the model running its "
                      "dense GEMM shapes at every row count that picks a new cuBLAS kernel "
                      "(docs/first-hits.md); 0: no sweep")
KEEP_ALLOCATOR = EnvVar("WARMUP_KEEP_ALLOCATOR", True, _bool,
                        "the warm-up's final flush leaves PyTorch's caching allocator its blocks, "
                        "so the first requests after ready do not allocate again what the "
                        "warm-up did; 0: the flush empties it, as SGLang's does")
STREAM_OVER_HTTP = EnvVar("WARMUP_STREAM_OVER_HTTP", True, _bool,
                          "the plan's streamed requests go through SGLang's own HTTP app "
                          "(in-process, no socket), so that the first streamed request after "
                          "ready does not pay the event-stream path's first use; 0: through the "
                          "tokenizer manager, as the other requests")

# --- phase and metrics --------------------------------------------------------------------
STATE_DIR = EnvVar("WARMUP_STATE_DIR", "", _str,
                   "directory shared by all SGLang processes: phase file and compile log")
METRICS = EnvVar("WARMUP_METRICS", True, _bool,
                 "set to 0 to install no compile-event hooks in SGLang processes")
PROMETHEUS_MULTIPROC_DIR = EnvVar("PROMETHEUS_MULTIPROC_DIR", "", _str,
                                  "prometheus-client multiprocess directory")
GC_PAUSE_MS = EnvVar("WARMUP_GC_PAUSE_MS", 20.0, _float,
                     "a Python garbage collection at least this long (ms) in an SGLang process "
                     "is written to the compile log (event gc), so audit can name it; 0: none")

# --- coverage and audit -------------------------------------------------------------------
SECOND_PASS = EnvVar("WARMUP_SECOND_PASS", False, _bool,
                     "set to 1 to replay the plan a second time after the warm-up and record "
                     "which classes still compile (coverage.json in the state directory) "
                     "and which steps paid a first-time cost (steps.json there)")
STEPS = EnvVar("WARMUP_STEPS", "", _str,
               "a steps record (prebake's ARCHIVE.steps.json): send only the steps that paid a "
               "first-time cost when the cache was baked; the whole plan where it does not "
               "match this launch")
BAKED_STATE = EnvVar("WARMUP_BAKED_STATE", "", _str,
                     "the state directory of the start that baked the caches (prebake sets it "
                     "for the start that learns the steps record): a step whose warm-up there "
                     "compiled a kernel the caches keep is kept in the record, wherever this "
                     "start loaded that kernel")
FREEZE_GC = EnvVar("WARMUP_FREEZE_GC", True, _bool,
                   "freeze the Python garbage collector of SGLang's tokenizer manager, "
                   "schedulers and detokenizer once the warm-up is done (SGLang's /freeze_gc), "
                   "so that no full collection over what the start and the warm-up left lands "
                   "in serving; set to 0 to leave the collector as it is")
FIRST_HIT_RATIO = EnvVar("WARMUP_FIRST_HIT_RATIO", 1.10, _float,
                         "a plan is closed when, on the second replay, every class's first "
                         "request is at most this many times the same request repeated")
FIRST_HIT_MIN_MS = EnvVar("WARMUP_FIRST_HIT_MIN_MS", 5.0, _float,
                          "a class's first hit within this many milliseconds of its repeat is "
                          "never slow (timing noise)")

# --- sidecar and prebake -------------------------------------------------------------------
API_KEY = EnvVar("WARMUP_API_KEY", "", _str,
                 "the SGLang server's --api-key, sent as a Bearer token by the sidecar "
                 "(an environment variable so it stays out of process listings)")

# --- patches --------------------------------------------------------------------------------
PATCHES = EnvVar("WARMUP_PATCHES", True, _bool,
                 "set to 0 to apply no prefill-graph fixes in SGLang processes")


def fix_mode(number: int) -> str:
    """``auto`` | ``on`` | ``off`` for fix N, from WARMUP_FIX_<N>."""
    return EnvVar(f"WARMUP_FIX_{number}", "auto", _mode,
                  f"auto (apply where needed), on (force) or off for fix {number}").get()


# --- activation: what a launcher sets, and how SGLang finds us ------------------------------
#: SGLang's general-plugin entry-point group, and our entry in it.
ENTRY_POINT_GROUP = "sglang.srt.plugins"
ENTRY_POINT_VALUE = "warmup.serve.plugin:register"


def plugin_entry_point() -> metadata.EntryPoint | None:
    """Our entry point in group ``sglang.srt.plugins``, if the distribution is installed."""
    from importlib import metadata  # here: its import is on every command's start

    for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
        if ep.value == ENTRY_POINT_VALUE:
            return ep
    return None


def activation_env(*, state_dir: str, multiprocess_dir: str, plan: str | None = None,
                   name: str | None = None, lenient: bool = False, second_pass: bool = False,
                   report: str | None = None, skip_families: tuple[str, ...] = (),
                   freeze_gc: bool = True, lets: tuple[tuple[str, str], ...] = (),
                   steps: str | None = None) -> dict[str, str]:
    """The variables that turn sglang-warmup on in every SGLang process: the plugin gate, the
    state directory and the Prometheus multiprocess directory they share, and (with a plan)
    what the ``--warmups`` entry runs.  ``serve``, ``prebake`` and ``doctor`` all use this."""
    env = {ENABLE.name: "1", STATE_DIR.name: state_dir,
           PROMETHEUS_MULTIPROC_DIR.name: multiprocess_dir}
    if plan is not None:
        env.update({PLAN.name: plan, WARMUP_NAME.name: name or "",
                    LENIENT.name: "1" if lenient else "0"})
        if second_pass:
            env[SECOND_PASS.name] = "1"
        env[FREEZE_GC.name] = "1" if freeze_gc else "0"
        if report:
            env[REPORT.name] = report
        if skip_families:
            env[SKIP_FAMILIES.name] = ",".join(skip_families)
        if lets:
            env[LETS.name] = ";".join(f"{k}={v}" for k, v in lets)
        if steps:
            env[STEPS.name] = steps
    return env
