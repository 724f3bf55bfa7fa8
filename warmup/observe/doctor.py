"""``sglang-warmup doctor``: prove, on this machine, that compile events are seen and counted
the way they will be inside SGLang.

The check runs in a child process started the way SGLang starts a scheduler: multiprocessing
``spawn``, the environment inherited (``WARMUP_ENABLE=1``), then SGLang's own
``sglang.srt.plugins.load_plugins()`` (which calls ``warmup.serve.plugin.register()`` through the
``sglang.srt.plugins`` entry point) and SGLang's ``triton_load_watch.install()`` after it, as
the scheduler's event loop does.  The child compiles a real Triton kernel (for the local GPU, or
for ``cuda:90`` without one) into an empty temporary cache while this process holds the phase
at ``warmup`` (a miss), then, after this process switched the phase file to ``serving``, again
with fresh in-process state (a disk hit).  This process then reads the counts back from the
Prometheus multiprocess directory and the compile log.

Longer than 500 lines: the child process's side and the parent's side of one check, kept
together so that what the child writes and what the parent reads stay in step.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import time
from dataclasses import asdict, dataclass
from importlib import metadata as _metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

from cache_tools import compile_log
from cache_tools.locations import environment
from cache_tools.versions import dist_version as _dist_version
from warmup import settings

if TYPE_CHECKING:  # the probe kernel's globals; bound by _probe_kernel() in the child
    import triton.language as tl

ENTRY_POINT_GROUP, ENTRY_POINT_VALUE = settings.ENTRY_POINT_GROUP, settings.ENTRY_POINT_VALUE
#: Where the check compiles when this machine has no GPU (an H100/H200: sm_90, 32-lane warps).
FALLBACK_TARGET = ("cuda", 90, 32)
DEFAULT_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class Check:
    """One verdict: ``name``, whether it passed, and what was seen."""

    name: str
    ok: bool
    detail: str


@dataclass(frozen=True)
class DoctorReport:
    """Everything the doctor saw.  ``ok`` is True when every check passed."""

    ok: bool
    checks: tuple[Check, ...]
    triton_version: str | None
    sglang_version: str | None
    target: str | None
    plugin: dict
    hooks: tuple[dict, ...]
    caches: tuple[dict, ...]
    counts: dict
    compile_log: tuple[dict, ...]
    notes: tuple[str, ...] = ()
    duration_s: float = 0.0
    child_log_tail: str = ""

    def to_json(self) -> dict:
        data = asdict(self)
        data["checks"] = [asdict(c) for c in self.checks]
        return data


# --------------------------------------------------------------------------------------------
# the library call
# --------------------------------------------------------------------------------------------

def run(*, timeout_s: float = DEFAULT_TIMEOUT_S, keep_dir: str | None = None) -> DoctorReport:
    """Run the check (see the module docstring) and return what was seen; a failed check is
    ``report.ok == False``, not an exception.  ``keep_dir``: a new or empty directory to keep
    the check's files in (WarmupError otherwise)."""
    started = time.monotonic()
    notes: list[str] = []
    plugin = plugin_entry_point()
    with contextlib.ExitStack() as stack:
        if keep_dir:
            root = Path(keep_dir)
            if root.exists() and (not root.is_dir() or any(root.iterdir())):
                from warmup.errors import WarmupError

                raise WarmupError(f"--keep-dir {keep_dir}: not an empty directory",
                                  hint="give a new or empty directory: the check needs an "
                                       "empty Triton cache to see a real compile")
            root.mkdir(parents=True, exist_ok=True)
        else:
            root = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="sglang-warmup-doctor-")))
        dirs = {name: root / name for name in ("caches", "state", "prometheus")}
        for d in dirs.values():
            d.mkdir(parents=True, exist_ok=True)
        cache_env, triton_dir = _cache_environment(dirs["caches"], notes)
        env = {**cache_env, **_child_environment(dirs, notes)}
        missing = _missing_triton()
        child: dict[str, Any] = ({"ok": False, "error": missing} if missing
                 else _run_child(root, env, dirs["state"], timeout_s))
        counts, log_records = _read_back(dirs, notes)
        checks = _verdicts(child, counts, log_records, triton_dir, plugin)
        hooks = tuple(child.get("install", {}).get("hooks", ()))
        report = DoctorReport(
            ok=all(c.ok for c in checks),
            checks=tuple(checks),
            triton_version=child.get("triton_version") or _dist_version("triton"),
            sglang_version=_dist_version("sglang"),
            target=child.get("target"),
            plugin={**plugin, "loaded_by": child.get("plugin_loader")},
            hooks=hooks,
            caches=tuple(cache_locations()),
            counts=counts,
            compile_log=tuple(_log_summary(log_records)),
            notes=tuple(notes + list(child.get("notes", ()))),
            duration_s=round(time.monotonic() - started, 3),
            child_log_tail=child.get("log_tail", "") if not all(c.ok for c in checks) else "",
        )
    return report


def plugin_entry_point() -> dict:
    """Whether ``sglang.srt.plugins`` → ``warmup.serve.plugin:register`` is registered."""
    try:
        eps = _metadata.entry_points(group=ENTRY_POINT_GROUP)
    except Exception as exc:  # broken metadata (any kind) is the check's finding
        return {"registered": False, "name": None, "distribution": None, "detail": repr(exc)}
    for ep in eps:
        if ep.value == ENTRY_POINT_VALUE:
            dist = getattr(getattr(ep, "dist", None), "name", None)
            return {"registered": True, "name": ep.name, "distribution": dist, "detail": ""}
    return {"registered": False, "name": None, "distribution": None,
            "detail": f"no entry point {ENTRY_POINT_VALUE} in group {ENTRY_POINT_GROUP}"}


def cache_locations() -> list[dict]:
    """The JIT cache directories in effect for SGLang here (``cache_tools.locations``)."""
    try:
        from cache_tools import locations
    except ImportError as exc:
        return [{"kind": "all", "path": None, "source": "", "active": False,
                 "note": f"cache_tools.locations unavailable: {exc}"}]
    try:
        return [{"kind": loc.kind.name, "path": str(loc.path) if loc.path is not None else None,
                 "source": loc.source, "active": loc.active, "note": loc.note}
                for loc in locations.resolve()]
    except Exception as exc:  # the self-check reports what it cannot resolve; it does not fail
        return [{"kind": "all", "path": None, "source": "", "active": False,
                 "note": f"cache locations could not be resolved: {exc}"}]


@contextlib.contextmanager
def compile_only_target(target: tuple[str, int | str, int] = FALLBACK_TARGET) -> Iterator[Any]:
    """Make Triton compile for ``target`` in a process without a GPU.

    ``@triton.jit`` kernels ask the active driver for the current target, device and stream
    before compiling (``kernel.warmup(..., grid=...)`` compiles without launching).  Triton has
    no driver without a GPU, so this sets, through ``triton.runtime.driver.set_active``, a
    driver that answers those three questions and nothing else; launching is impossible.  The
    previous driver is put back on exit.  Yields the ``GPUTarget``.
    """
    from triton.backends.compiler import GPUTarget
    from triton.runtime import driver

    gpu_target = GPUTarget(*target)

    class CompileOnlyDriver:
        """Answers Triton's target/device/stream questions for compiling; cannot launch."""

        def get_current_target(self):
            return gpu_target

        def get_current_device(self):
            return 0

        def get_current_stream(self, device=None):
            return 0

        def get_active_torch_device(self):
            raise RuntimeError("compile-only target: no device to run on")

    previous = getattr(driver, "_active", None)
    driver.set_active(CompileOnlyDriver())
    try:
        yield gpu_target
    finally:
        driver.set_active(previous)


# --------------------------------------------------------------------------------------------
# the child (runs in a spawned interpreter)
# --------------------------------------------------------------------------------------------

def _doctor_probe(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    tl.store(y_ptr + offsets, tl.load(x_ptr + offsets, mask=mask) * 2.0 + 1.0, mask=mask)


def _probe_kernel() -> Any:
    """``_doctor_probe`` as a ``@triton.jit`` kernel (Triton imported only here)."""
    global tl
    import triton
    import triton.language as tl  # noqa: F811  (the kernel body resolves ``tl`` at compile time)

    return triton.jit(_doctor_probe)


def _child_main(conn: Any, result_path: str, log_path: str) -> None:
    """Entry of the check process: be an SGLang worker, compile twice, write what was seen."""
    log = open(log_path, "ab", buffering=0)
    os.dup2(log.fileno(), 1)
    os.dup2(log.fileno(), 2)
    result: dict[str, Any] = {"notes": []}
    try:
        result["plugin_loader"] = _load_plugins_like_sglang(result["notes"])
        _install_sglang_watch(result["notes"])
        from warmup.observe import events

        report = events.status()
        result["install"] = report.to_json() if report is not None else {"hooks": []}
        result["hooks_installed"] = report is not None
        import triton

        result["triton_version"] = triton.__version__
        with _target(result) as _:
            kernel = _probe_kernel()
            from triton.runtime.jit import MockTensor

            args = (MockTensor(tl.float32), MockTensor(tl.float32), 4096)
            first = kernel.warmup(*args, BLOCK=256, grid=(1,))
            result["hash"] = first.hash
            conn.send("compiled")
            if not conn.poll(120):
                raise TimeoutError("the parent did not switch the phase within 120 s")
            conn.recv()
            kernel.device_caches.clear()  # fresh in-process state: only the disk cache is left
            second = kernel.warmup(*args, BLOCK=256, grid=(1,))
            result["second_hash"] = second.hash
            if result.get("launch"):
                _launch(kernel, result)
        after = events.status()
        if after is not None:
            result["install"] = after.to_json()
        result["ok"] = True
    except BaseException as exc:  # the child reports every way it ends in its result file
        import traceback

        result["ok"] = False
        result["error"] = f"{type(exc).__name__}: {exc}"
        result["traceback"] = traceback.format_exc()
        try:
            conn.send("failed")
        except (OSError, ValueError):  # the parent is gone: the result file says it all
            pass
    finally:
        Path(result_path).write_text(json.dumps(result, default=str))


def _load_plugins_like_sglang(notes: list[str]) -> str:
    """Load the general plugins the way SGLang's processes do; return which way was used."""
    try:
        from sglang.srt.plugins import load_plugins
    except Exception as exc:  # SGLang's import may raise anything: noted, the entry point then
        notes.append(f"SGLang not importable here ({type(exc).__name__}: {exc}); "
                     "the plugin was loaded from its entry point directly")
        for ep in _metadata.entry_points(group=ENTRY_POINT_GROUP):
            if ep.value == ENTRY_POINT_VALUE:
                ep.load()()
        return "importlib.metadata entry point"
    load_plugins()
    return "sglang.srt.plugins.load_plugins"


def _install_sglang_watch(notes: list[str]) -> None:
    """SGLang's scheduler installs its Triton load watch after the plugins; do the same."""
    try:
        from sglang.srt.utils import triton_load_watch
    except Exception as exc:  # SGLang's import may raise anything: noted, not exercised
        notes.append(f"sglang.srt.utils.triton_load_watch not importable ({exc}); "
                     "chaining with it not exercised")
        return
    triton_load_watch.install()


@contextlib.contextmanager
def _target(result: dict) -> Iterator[None]:
    """The local GPU when Triton has a driver for it, else a compile-only ``cuda:90``."""
    from triton.runtime import driver

    try:
        target = driver.active.get_current_target()
    except Exception as exc:  # no GPU: Triton raises what its release raises; compile only
        with compile_only_target(FALLBACK_TARGET) as target:
            result["target"] = f"{target.backend}:{target.arch} (compile only: {_no_driver(exc)})"
            result["launch"] = False
            yield
        return
    result["target"] = f"{target.backend}:{target.arch} (local GPU)"
    result["launch"] = True
    yield


def _no_driver(exc: Exception) -> str:
    """Why Triton has no driver, in our words: its own "0 active drivers ([]). There should
    only be one." means that it sees no GPU."""
    text = " ".join(str(exc).split())
    if "active drivers" in text:
        return "no GPU is visible to Triton here; kernels are compiled, not launched"
    return f"no GPU driver: {text[:200]}"


def _launch(kernel: Any, result: dict) -> None:
    """On a GPU, launch the kernel once so that its device load is seen too."""
    try:
        import torch

        x = torch.zeros(4096, device="cuda", dtype=torch.float32)
        y = torch.empty_like(x)
        kernel[(16,)](x, y, 4096, BLOCK=256)
        torch.cuda.synchronize()
        result["launched"] = bool(torch.all(y == 1.0).item())
    except Exception as exc:  # a launch that fails is the self-check's note, not its failure
        result["notes"].append(f"kernel launch not exercised: {type(exc).__name__}: {exc}")


# --------------------------------------------------------------------------------------------
# the parent's side
# --------------------------------------------------------------------------------------------

def _child_environment(dirs: dict[str, Path], notes: list[str]) -> dict[str, str | None]:
    """Variables the child inherits (None: unset): the operator's environment plus what the
    launcher sets (the plugin gate, a state directory, a multiprocess directory) and an empty
    Triton cache.  Everything else (WARMUP_METRICS, SGLANG_PLUGINS, ...) is left as configured,
    so a setting that would keep the hooks out of SGLang fails the check here too."""
    env: dict[str, str | None] = dict(settings.activation_env(
        state_dir=str(dirs["state"]), multiprocess_dir=str(dirs["prometheus"])))
    if not _has_attr("warmup.patches", "activate"):
        env["WARMUP_PATCHES"] = "0"
        notes.append("warmup.patches.activate is not available: the check ran with "
                     "WARMUP_PATCHES=0")
    if not _has_attr("warmup.serve.hook", "register_from_env"):
        env["WARMUP_PLAN"] = None
        notes.append("warmup.serve.hook.register_from_env is not available: the check ran with "
                     "WARMUP_PLAN unset")
    return env


def _cache_environment(root: Path, notes: list[str]) -> tuple[dict[str, str | None], Path]:
    """Every JIT cache of the check process pinned under ``root`` (empty, so the first compile
    is a real one and the operator's caches are left alone); returns the variables and the
    Triton cache directory."""
    try:
        from cache_tools import locations

        pairs = dict(locations.exports(str(root)).pairs)
        (triton,) = locations.resolve([locations.kind("triton")], root=root)
        if triton.path is None:
            raise ValueError("no Triton cache directory under the root")
        return dict(pairs), Path(triton.path)
    except Exception as exc:  # the self-check notes it and pins the Triton cache alone
        notes.append(f"cache_tools.locations unusable ({exc}); only the Triton cache was "
                     "pinned to the check's directory")
        return {"TRITON_CACHE_DIR": str(root / "triton")}, root / "triton"


def _has_attr(module: str, attr: str) -> bool:
    import importlib

    try:
        return hasattr(importlib.import_module(module), attr)
    except Exception:  # an import of SGLang's may raise anything: not there, then
        return False


def _run_child(root: Path, env: dict[str, str | None], state_dir: Path,
               timeout_s: float) -> dict:
    """Start the check process, drive the phase through it, return what it wrote."""
    import multiprocessing

    from warmup.observe import phase

    ctx = multiprocessing.get_context("spawn")
    result_path = root / "child-result.json"
    log_path = root / "child.log"
    parent_conn, child_conn = ctx.Pipe()
    deadline = time.monotonic() + timeout_s
    phase.set_phase("warmup", shape_class="doctor", request=0, state_dir=state_dir)
    process = ctx.Process(target=_child_main, args=(child_conn, str(result_path), str(log_path)),
                          name="sglang-warmup-doctor", daemon=True)
    with environment(env):
        process.start()
    child_conn.close()
    problem = ""
    try:
        if parent_conn.poll(max(0.0, deadline - time.monotonic())):
            message = parent_conn.recv()
            if message == "compiled":
                phase.set_phase("serving", state_dir=state_dir)
                parent_conn.send("go")
        else:
            problem = f"the check process did not compile within {timeout_s:.0f} s"
    except (EOFError, OSError):
        pass  # the child died; its result file (if any) says why
    process.join(max(0.0, deadline - time.monotonic()))
    if process.is_alive():
        process.kill()
        process.join(5)
        problem = problem or f"the check process did not finish within {timeout_s:.0f} s"
    try:
        result = json.loads(result_path.read_text())
    except (OSError, ValueError):
        result = {"ok": False, "error": problem or
                  f"the check process exited with code {process.exitcode} and no result"}
    if problem:
        result["ok"] = False
        result["error"] = problem
    result["exitcode"] = process.exitcode
    result["log_tail"] = _tail(log_path)
    return result


def _missing_triton() -> str:
    """Why the check process cannot run here (Triton absent or broken), or ''."""
    import importlib.util

    try:
        found = importlib.util.find_spec("triton") is not None
    except (ImportError, ValueError) as exc:
        return f"Triton cannot be found here ({type(exc).__name__}: {exc})"
    return "" if found else ("Triton is not installed in this environment; install the "
                             "version the installed SGLang pins (it comes with torch)")


def _read_back(dirs: dict[str, Path], notes: list[str]) -> tuple[dict, list[dict]]:
    from warmup.observe import metrics

    try:
        counts = metrics.collect(dirs["prometheus"])
    except Exception as exc:  # prometheus_client's reader of a torn file: the check's note
        notes.append(f"metrics could not be read back: {exc}")
        counts = {}
    try:
        log_records = compile_log.read_dir(dirs["state"])
    except OSError as exc:
        notes.append(f"compile log could not be read back: {exc}")
        log_records = []
    return counts, log_records


def _verdicts(child: dict, counts: dict, log_records: list[dict], cache_dir: Path,
              plugin: dict) -> list[Check]:
    from warmup.observe import metrics

    checks = [Check("plugin entry point", bool(plugin.get("registered")),
                    f"{ENTRY_POINT_GROUP}: {plugin.get('name')} -> {ENTRY_POINT_VALUE}"
                    if plugin.get("registered") else plugin.get("detail", ""))]
    ok = bool(child.get("ok"))
    checks.append(Check("check process", ok, "compiled twice" if ok else
                        child.get("error", "failed")))
    if not ok:  # every check below reads what the check process wrote: one cause, one line
        return checks
    hooks = {h["name"]: h for h in child.get("install", {}).get("hooks", ())}
    wanted = ("triton.knobs.compilation.listener", "triton.knobs.runtime.jit_cache_hook",
              "triton.knobs.runtime.jit_post_compile_hook")
    missing = [n for n in wanted if hooks.get(n, {}).get("state") not in ("installed", "chained")]
    checks.append(Check(
        "hooks installed by the plugin", not missing,
        "listener: " + hooks.get(wanted[0], {}).get("detail", "?") if not missing else
        ("not installed: " + ", ".join(missing) + (
            "" if hooks else " (the plugin did not install events: is WARMUP_METRICS=0 or "
                             "SGLANG_PLUGINS set without sglang_warmup?)"))))
    binaries = [p.name for p in cache_dir.rglob("*") if p.suffix in (".cubin", ".hsaco")]
    binary = Check("kernel binary in the Triton cache", bool(binaries),
                   ", ".join(sorted(binaries)) or f"no .cubin/.hsaco under {cache_dir}")
    if missing:  # without the hooks nothing is counted or logged: the cause, not its echoes
        return checks + [binary]

    def n(name: str, **labels: str) -> float:
        return metrics.total(counts, name, **labels)

    miss = n("sglang_warmup_compile_events_total", phase="warmup", compiler="triton",
             outcome="miss")
    hit = n("sglang_warmup_compile_events_total", phase="serving", compiler="triton",
            outcome="hit")
    all_triton = n("sglang_warmup_compile_events_total", compiler="triton")
    checks.append(Check("miss counted in phase warmup", miss == 1 and all_triton == 2,
                        f"compile_events{{phase=warmup,outcome=miss}} = {miss:g}, "
                        f"all Triton events = {all_triton:g} (expected 1 of 2)"))
    checks.append(Check("hit counted in phase serving", hit == 1 and all_triton == 2,
                        f"compile_events{{phase=serving,outcome=hit}} = {hit:g} (expected 1)"))
    spec_w = n("sglang_warmup_specializations_total", phase="warmup")
    spec_s = n("sglang_warmup_specializations_total", phase="serving")
    checks.append(Check("jit_cache_hook seen", spec_w == 1 and spec_s == 1,
                        f"specializations warmup = {spec_w:g}, serving = {spec_s:g} "
                        "(expected 1 and 1)"))
    misses = [r for r in log_records
              if r.get("event") == compile_log.MISS and r.get("compiler") == compile_log.TRITON]
    hits = [r for r in log_records
            if r.get("event") == compile_log.HIT and r.get("compiler") == compile_log.TRITON]
    joined = bool(misses) and all(
        (r.get("specialization") or {}).get("specialization_data") for r in misses)
    good = (len(misses) == 1 and len(hits) == 1 and misses[0].get("phase") == "warmup"
            and hits[0].get("phase") == "serving" and joined
            and misses[0].get("kernel", {}).get("qualname") == "_doctor_probe"
            and misses[0].get("hash") == hits[0].get("hash") == child.get("hash"))
    checks.append(Check("compile log", good,
                        f"{len(misses)} miss and {len(hits)} hit line(s)"
                        + ("; the miss carries the jit_cache_hook record" if joined else
                           "; the miss lacks the jit_cache_hook record")))
    checks.append(binary)
    if child.get("launch"):
        loads = n("sglang_warmup_kernel_loads_total")
        checks.append(Check("device load counted", loads >= 1 and bool(child.get("launched")),
                            f"kernel_loads_total = {loads:g}"))
    errors = n("sglang_warmup_hook_errors_total")
    checks.append(Check("no recording errors", errors == 0,
                        f"hook_errors_total = {errors:g}"))
    return checks


def _log_summary(log_records: list[dict]) -> list[dict]:
    return [{"event": r.get("event"), "phase": r.get("phase"), "compiler": r.get("compiler"),
             "kernel": (r.get("kernel") or {}).get("name") or r.get("module_name"),
             "hash": r.get("hash"), "duration_s": r.get("duration_s")} for r in log_records]


def _tail(path: Path, limit: int = 4000) -> str:
    try:
        data = path.read_bytes()
    except OSError:
        return ""
    return data[-limit:].decode("utf-8", errors="replace")


# --------------------------------------------------------------------------------------------
# rendering (the command is warmup/cli/doctor.py)
# --------------------------------------------------------------------------------------------

#: Checks whose failure makes the counting and compile-log checks meaningless (not run then).
_CAUSES = ("check process", "hooks installed by the plugin")


def render_text(report: DoctorReport) -> str:
    """The report for people."""
    lines = [f"sglang-warmup doctor: {'OK' if report.ok else 'FAILED'} "
             f"({report.duration_s:.1f} s)",
             f"  triton {report.triton_version or 'not installed'}, "
             f"sglang {report.sglang_version or 'not installed'}, target {report.target or '?'}",
             "  plugin entry point: "
             + (f"{report.plugin.get('name')} -> {ENTRY_POINT_VALUE} "
                f"({report.plugin.get('distribution')}), loaded by "
                f"{report.plugin.get('loaded_by') or '?'}"
                if report.plugin.get("registered") else "NOT registered"),
             "", "checks:"]
    for c in report.checks:
        lines.append(f"  [{'ok' if c.ok else 'FAIL'}] {c.name}: {c.detail}")
    cause = next((c.name for c in report.checks if not c.ok and c.name in _CAUSES), None)
    if cause:
        lines.append(f"  (the checks not shown need what \"{cause}\" checks: fix that first)")
    lines += ["", "hooks (in the check process):"]
    for h in report.hooks or ({"name": "none", "state": "", "detail": ""},):
        detail = f" ({h.get('detail')})" if h.get("detail") else ""
        lines.append(f"  {h.get('state', ''):9} {h.get('name')}{detail}")
    lines += ["", "cache locations:"]
    for loc in report.caches:
        flag = "" if loc.get("active", True) else " [inactive]"
        note = f" - {loc['note']}" if loc.get("note") else ""
        lines.append(f"  {loc.get('kind'):13} {loc.get('path')} ({loc.get('source')}){flag}{note}")
    if report.notes:
        lines += ["", "notes:"] + [f"  - {n}" for n in report.notes]
    if report.child_log_tail:
        lines += ["", "check process output (tail):", report.child_log_tail.rstrip()]
    return "\n".join(lines)


def render_json(report: DoctorReport) -> str:
    """The report for scripts."""
    return json.dumps(report.to_json(), indent=2, sort_keys=True, default=str)
