"""Longer than 500 lines: one bake in the order it runs (plan, cold start, pack, the start that
learns the steps record, the record), each step short; the process group's handling has its own
module.

Prebake: run SGLang once with a plan against empty caches, then pack everything it compiled
into one archive with its manifest (for a runtime image, or for a fleet's shared store).

Inspect, plan, execute: :func:`prepare` validates the inputs and computes a
:class:`PrebakePlan` (work directory, cache root, environment, command, URL) without starting
anything; :meth:`PrebakePlan.execute` creates an empty directory for every cache kind under one
root, launches SGLang through the same path as ``serve`` (the plan registered in
``--warmups``), waits for ``/health_generate`` with a deadline, shuts the server down (SIGTERM
to its process group, a bounded wait, then SIGKILL), and packs every kind (``cache_tools``).
Learning the steps record, a second server starts from the baked caches (as a launch from the
archive would) and runs the plan twice; the steps that paid a first-time cost there are kept.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import shlex
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from cache_tools import archive, compile_log, jsonfile, locations
from cache_tools.locations import Location
from cache_tools.progress import Progress
from warmup import settings
from warmup.errors import SidecarError, WarmupError
from warmup.plan import step_record
from warmup.serve import launch
from warmup.serve.launch import Launch
from warmup.serve.report import MAX_REPORT_BYTES
from warmup.serve.http import HttpClient, Probe, wait_for_health
from warmup.prebake.process_group import stop_process_group
from warmup.prebake.result import PrebakeResult, baked_kinds

logger = logging.getLogger("sglang_warmup.prebake")

SGLANG_DEFAULT_PORT = 30000
_LOG_TAIL = 30  # server log lines shown when it fails
#: The start that learns the steps record, in the work directory: its run report and state
LEARN_REPORT, LEARN_STATE = "learn-report.json", "learn-state"


def _arg_value(args: Sequence[str], flag: str) -> str | None:
    """The value of ``--flag V`` / ``--flag=V`` in an argument list (the last one wins)."""
    value = None
    for i, a in enumerate(args):
        if a == flag and i + 1 < len(args):
            value = args[i + 1]
        elif a.startswith(flag + "="):
            value = a.split("=", 1)[1]
    return value


def _loopback(host: str | None) -> str:
    if not host or host in ("0.0.0.0", "::", "[::]"):
        return "127.0.0.1"
    return host


@dataclass(frozen=True)
class _Start:
    """One server start of a bake: what the progress calls it, its launch, log and report."""

    what: str
    launch: Launch
    log: Path
    report: Path


@dataclass(frozen=True)
class PrebakePlan:
    """A prebake, decided but not started.  ``work_dir`` holds ``cache/`` (every kind under one
    root), ``state/`` (phase file, compile manifest, metrics), ``server.log`` and
    ``report.json``; it is removed after a success when it is a temporary directory (unless
    ``keep``), and kept after a failure of the server or the packing (a temporary one is
    removed when the port is busy: nothing ran)."""

    plan_file: str
    plan_name: str
    out: Path
    work_dir: Path
    temporary: bool
    cache_root: Path
    locations: tuple[Location, ...]
    exports: tuple[tuple[str, str], ...]
    launch: launch.Launch
    url: str
    api_key: str | None = field(repr=False)
    deadline_s: float
    stop_timeout_s: float
    zstd: bool
    keep: bool
    warnings: tuple[str, ...] = ()
    #: the second start, from the baked caches, that learns the steps record (None: not learned)
    learn: Launch | None = None

    @property
    def learn_steps(self) -> bool:
        return self.learn is not None

    @property
    def log_path(self) -> Path:
        return self.work_dir / "server.log"

    @property
    def report_path(self) -> Path:
        return self.work_dir / "report.json"

    @property
    def starts(self) -> tuple[_Start, ...]:
        """The server starts of this bake: the cold one that fills the caches, then (learning
        the record) one from those caches, as a launch from the archive starts."""
        bake = _Start("SGLang", self.launch, self.log_path, self.report_path)
        if self.learn is None:
            return (bake,)
        return bake, _Start("SGLang from the baked caches (learning the steps record)",
                            self.learn, self.work_dir / "learn.log",
                            self.work_dir / LEARN_REPORT)

    @property
    def steps_path(self) -> Path:
        return _steps_path(self.out)

    def to_dict(self) -> dict[str, Any]:
        return {"plan": self.plan_file, "out": str(self.out), "work_dir": str(self.work_dir),
                "cache_root": str(self.cache_root),
                "caches": {loc.kind.name: str(loc.path) for loc in self.locations},
                "env": dict(self.exports), "argv": list(self.launch.argv), "url": self.url,
                "deadline_s": self.deadline_s, "stop_timeout_s": self.stop_timeout_s,
                "zstd": self.zstd, "warnings": list(self.warnings),
                "steps": str(self.steps_path) if self.learn_steps else None}

    def describe(self) -> str:
        """The dry-run text: what would be created, set and run."""
        lines = [f"prebake plan {self.plan_name} ({self.plan_file}) into {self.out}",
                 f"work directory: {self.work_dir}" + (" (temporary)" if self.temporary else ""),
                 "cache directories it would create (empty):"]
        lines += [f"  {loc.kind.name:<13} {loc.path}" for loc in self.locations]
        lines.append("environment:")
        lines += [f"  {k}={shlex.quote(v)}" for k, v in self.exports]
        shown = {k: v for k, v in self.launch.env.items()
                 if k.startswith("WARMUP_") or k == "PROMETHEUS_MULTIPROC_DIR"}
        lines += [f"  {k}={shlex.quote(v)}" for k, v in sorted(shown.items())]
        lines.append("command: " + shlex.join(self.launch.argv))
        lines.append(f"ready: {self.url}/health_generate within {self.deadline_s:g} s; stop: "
                     f"SIGTERM to the process group, SIGKILL after {self.stop_timeout_s:g} s")
        if self.learn_steps:
            lines.append(f"then a second start from the baked caches runs the plan twice; the "
                         f"steps that paid a first-time cost there go to {self.steps_path}")
        return "\n".join(lines)

    def discard(self) -> None:
        """Remove the work directory if it is temporary (after a dry run)."""
        if self.temporary:
            shutil.rmtree(self.work_dir, ignore_errors=True)

    # --- execute --------------------------------------------------------------------------------
    def execute(self, *, progress: Progress | None = None,
                echo: Callable[[str], None] | None = None) -> PrebakeResult:
        """Create the caches, run the server to ready, stop it, pack.  Raises WarmupError
        (server not ready in time, exited, plan not run) or CacheError (packing); the server is
        stopped on every path, and the work directory is kept after a failure once the server
        started."""
        say = echo or (lambda line: logger.info("%s", line))
        progress = progress or Progress.null()
        started = time.monotonic()
        try:  # nothing has run yet: a busy port leaves no work directory to look into
            _check_port_free(self.url)
        except SidecarError:
            self.discard()
            raise
        for loc in self.locations:
            if loc.path is not None:
                loc.path.mkdir(parents=True, exist_ok=True)
        # a record beside the archive this bake replaces describes the old cache: gone, whether
        # or not this bake learns a new one
        self.steps_path.unlink(missing_ok=True)
        bake, *learn = self.starts
        report, ready_s, stopped_with = self._serve(bake, say, progress)
        learn_failed: WarmupError | None = None
        if learn:
            try:
                self._serve(learn[0], say, progress)
            except WarmupError as exc:  # the cold start's caches are packed all the same
                learn_failed = exc
        progress.step(f"packing {self.cache_root} into {self.out}")
        result = archive.pack(self.out, self.locations, zstd=self.zstd, progress=progress)
        archive.verify(self.out, progress=progress)
        kinds = baked_kinds(self.locations, result.manifest.entries)
        created = {loc.path for loc in self.locations if loc.path is not None}
        warnings = list(self.warnings) + [
            str(w) for w in result.warnings
            if not (w.path in created and w.path.is_dir() and not any(w.path.iterdir()))]
        if not result.manifest.entries:
            raise WarmupError(f"SGLang compiled nothing into the cache directories under "
                              f"{self.cache_root}; {self.out} holds no entry",
                              hint="is SGLang honouring the cache variables (`sglang-warmup "
                                   "prebake --dry-run` lists them)? a remote Triton cache "
                                   "(TRITON_CACHE_MANAGER) bypasses the directories")
        if learn_failed is not None:       # the work directory stays, with learn.log
            raise SidecarError(
                f"{learn_failed.message}; {self.out} was packed from the cold start, without a "
                f"steps record", hint=f"{learn_failed.hint} (a server that cannot start from "
                f"these caches is worth knowing before an image ships them; --no-learn-steps "
                f"bakes with one start)") from learn_failed
        steps, steps_line = self._keep_steps(warnings, report)
        kept: Path | None = self.work_dir
        if self.temporary and not self.keep:
            shutil.rmtree(self.work_dir, ignore_errors=True)
            kept = None
        return PrebakeResult(self.out, result.archive_bytes, kinds, ready_s,
                             time.monotonic() - started, stopped_with, report, tuple(warnings),
                             kept, steps, steps_line)

    def _serve(self, start: _Start, say: Callable[[str], None],
               progress: Progress) -> tuple[dict[str, Any], float, str]:
        """Start ``start``'s server, wait until ready, read its run report, stop it: the
        report, seconds to ready, and how it stopped."""
        launch.prepare_state_dir(start.launch)
        say(f"sglang-warmup prebake: starting {start.what} (log: {start.log})")
        with open(start.log, "ab") as log, _TermAsExit():
            proc = subprocess.Popen(start.launch.argv, env=start.launch.env, stdout=log,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    start_new_session=True)
            try:
                ready_s = self._wait_ready(proc, start.log, say, progress)
                report = _read_report(start.report)
                say(f"sglang-warmup prebake: ready in {ready_s:.1f} s; warm-up "
                    f"{report.get('plan')}: {report.get('requests')} requests in "
                    f"{float(report.get('duration_s') or 0):.1f} s")
            finally:
                stopped_with = stop_process_group(proc, self.stop_timeout_s)
                say(f"sglang-warmup prebake: server stopped ({stopped_with})")
        return report, ready_s, stopped_with

    def _keep_steps(self, warnings: list[str],
                    cold: Mapping[str, Any]) -> tuple[Path | None, str]:
        """The steps record the second start learned, copied beside the archive (a missing or
        unreadable one is a warning: the archive is good without it), with the GEMM load rows
        of both starts' sweeps (``cold``: the cold start's run report)."""
        if self.learn is None:
            return None, ""
        path = Path(self.learn.state_dir) / step_record.STATE_FILE
        try:
            record = step_record.read(path)
            sweeps = cold.get("gemm_sweeps")
            if record.gemm is not None and isinstance(sweeps, list):
                record = replace(record, gemm=record.gemm.merged(step_record.gemm_rows(
                    [s for s in sweeps if isinstance(s, Mapping)])))
            record.write(self.steps_path)
        except (WarmupError, OSError) as exc:
            warnings.append(f"no steps record: {exc}; a launch from this archive sends the "
                            f"whole plan")
            return None, ""
        warnings.extend(record.drift_notes)
        if record.baked is None:
            warnings.append(f"the start that learned the steps record did not read the cold "
                            f"start's compile log ({self.work_dir / 'learn.log'} says why): a "
                            f"step that batches by timing may have hidden the step that compiles "
                            f"a kernel in plan order, which a launch then meets after ready")
        again = _compiled_again(self.launch.state_dir, self.learn.state_dir)
        if again:
            warnings.append(f"the start from the baked caches compiled {len(again)} kernel(s) "
                            f"again in its warm-up ({', '.join(sorted(set(again)))}): a launch "
                            f"from this archive compiles them too "
                            f"({self.work_dir / LEARN_REPORT} names them)")
        return self.steps_path, (f"steps: {len(record.keep)} of {record.steps} paid a "
                                 f"first-time cost in a start from the baked caches, "
                                 f"{record.quiet} quiet: {self.steps_path}")

    def _wait_ready(self, proc: subprocess.Popen, log: Path, say: Callable[[str], None],
                    progress: Progress) -> float:
        say(f"sglang-warmup prebake: waiting for {self.url}/health_generate, deadline "
            f"{self.deadline_s:g} s")

        def alive() -> str | None:
            rc = proc.poll()
            return None if rc is None else f"exited with code {rc}"

        client = HttpClient(self.url, api_key=self.api_key)

        def probe(timeout: float) -> Probe:
            return client.probe("/health_generate", timeout)

        # On a terminal one line ticks with the server log's last line instead of a log line
        # every 30 s (which would break the line rewritten in place).
        with progress.ticking("SGLang loading and warming up",
                              detail=lambda: "".join(_tail(log, 1))):
            hw = wait_for_health(probe, self.deadline_s, initial_s=0.25, max_s=10.0,
                                 probe_timeout_s=30.0, alive=alive, what="SGLang",
                                 log_every_s=float("inf") if progress.tty else 30.0)
        if hw.ok:
            return hw.waited_s
        tail = _tail(log, _LOG_TAIL)
        for line in tail:
            say(f"  | {line}")
        if hw.ended == "deadline":
            raise SidecarError(f"SGLang was not ready within {self.deadline_s:g} s "
                               f"({hw.attempts} probes of /health_generate; last: {hw.last}); "
                               f"log: {log}",
                               hint="raise --deadline if the model loads slowly; the last log "
                                    "lines are above")
        raise SidecarError(f"SGLang {hw.ended} before it was ready; log: {log}",
                           hint="the last log lines are above (a failing plan stops SGLang's "
                                "startup on purpose: `sglang-warmup plan check`)")


def _read_report(path: Path) -> dict[str, Any]:
    if not path.exists():
        raise SidecarError(f"the server became ready but the plan did not run in it (no run "
                           f"report at {path})",
                           hint="install sglang-warmup in the environment that runs SGLang "
                                "(pip install, so its plugin entry point loads)")
    try:
        report = jsonfile.load(path, MAX_REPORT_BYTES)
    except jsonfile.JsonFileError as exc:
        raise SidecarError(f"cannot read the run report {path}: {exc}",
                           hint="see the server log") from None
    if not isinstance(report, dict):
        raise SidecarError(f"{path} is not a run report",
                           hint="see the server log")
    if not report.get("ok", False):
        raise SidecarError(f"the warm-up reported failures: "
                           f"{'; '.join(report.get('failures') or []) or 'see the report'}",
                           hint=f"see {path} and the server log")
    return report


def prepare(plan: str | os.PathLike[str], out: str | os.PathLike[str],
            sglang_args: Sequence[str], *, port: int | None = None, deadline_s: float = 1800.0,
            stop_timeout_s: float = 60.0, work_dir: str | os.PathLike[str] | None = None,
            zstd: bool = False, keep: bool = False, overwrite: bool = False,
            environ: Mapping[str, str] | None = None, learn_steps: bool = True) -> PrebakePlan:
    """Validate and decide a prebake; creates only the work directory (and ``serve``'s state
    directory in it).  Raises WarmupError / PlanError / CacheError on bad input.
    ``learn_steps``: once the caches are baked and the server stopped, a second server starts
    from them and runs the plan twice (the second-pass check); the steps that paid a first-time
    cost in that start are written beside the archive (``ARCHIVE.steps.json``)."""
    out_path = Path(out).resolve()
    if out_path.is_dir():
        raise SidecarError(f"--out {out} is a directory", hint="give the archive's file name, "
                           "e.g. --out prebake/sglang-cache.tar")
    if out_path.exists() and not overwrite:
        raise SidecarError(f"--out {out} exists", hint="pass -y to overwrite it, or choose "
                           "another --out")
    steps_path = _steps_path(out_path)
    if steps_path.is_dir() or steps_path.is_symlink():
        raise SidecarError(f"{steps_path} is a directory or a link",
                           hint="the archive's steps record goes there: move it away")
    if zstd and importlib.util.find_spec("zstandard") is None:
        raise SidecarError("--zstd needs the zstandard package, which is not installed",
                           hint="pip install 'sglang-warmup[zstd]', or drop --zstd")
    for name, seconds in (("--deadline", deadline_s), ("--stop-timeout", stop_timeout_s)):
        if not seconds > 0:
            raise SidecarError(f"{name} {seconds:g} must be a positive number of seconds",
                               hint=f"e.g. {name} 600")
    args = list(sglang_args)
    if args and args[0] == "--":
        args = args[1:]
    if not args:
        raise SidecarError("no SGLang launch arguments after `--`",
                           hint="sglang-warmup prebake --plan PLAN --out ARCHIVE -- "
                                "--model-path MODEL [sglang flags]")
    given = _arg_value(args, "--port")
    if port is not None:
        if not 1 <= port <= 65535:
            raise SidecarError(f"--port {port} is not a TCP port", hint="1-65535")
        if given is not None and given != str(port):
            raise SidecarError(f"--port {port} conflicts with SGLang's --port {given}",
                               hint="give the port once")
        if given is None:
            args += ["--port", str(port)]
    final_port = port if port is not None else int(given or SGLANG_DEFAULT_PORT)
    url = f"http://{_url_host(_loopback(_arg_value(args, '--host')))}:{final_port}"

    temporary = work_dir is None
    if work_dir is None:
        wd = Path(tempfile.mkdtemp(prefix="sglang-warmup-prebake-"))
    else:
        wd = Path(work_dir).resolve()
        if wd.exists() and any(wd.iterdir()):
            raise SidecarError(f"--work-dir {work_dir} is not empty",
                               hint="a prebake starts from empty caches; give a new or empty "
                                    "directory")
        wd.mkdir(parents=True, exist_ok=True)
    try:
        cache_root = wd / "cache"
        exported = locations.exports(str(cache_root))
        env, warnings = _bake_env(os.environ if environ is None else environ, exported.pairs,
                                  cache_root)
        spec = launch.plan_launch(str(plan), args, report=str(wd / "report.json"),
                                  state_dir=str(wd / "state"), environ=env)
        # the learning start reads the cold start's compile log (docs/coverage.md)
        learn = launch.plan_launch(
            str(plan), args, report=str(wd / LEARN_REPORT), state_dir=str(wd / LEARN_STATE),
            second_pass=True, environ={**env, settings.BAKED_STATE.name: spec.state_dir},
        ) if learn_steps else None
    except BaseException:  # cleanup on any way out (Ctrl-C too), then raised as it was
        if temporary:
            shutil.rmtree(wd, ignore_errors=True)
        raise
    return PrebakePlan(
        plan_file=str(plan), plan_name=spec.name, out=out_path, work_dir=wd,
        temporary=temporary, cache_root=cache_root,
        locations=locations.resolve(root=cache_root), exports=exported.pairs, launch=spec,
        url=url, api_key=_arg_value(args, "--api-key"), deadline_s=deadline_s,
        stop_timeout_s=stop_timeout_s, zstd=zstd, keep=keep, warnings=tuple(warnings),
        learn=learn)


def _steps_path(out: Path) -> Path:
    """Where the steps record goes: beside the archive, ``ARCHIVE.steps.json``."""
    return out.with_name(out.name + ".steps.json")


def _compiled_again(cold_state: str, learn_state: str) -> list[str]:
    """The compilers of what the start from the baked caches compiled again in its warm-up
    (one per kernel that the cold start's warm-up had compiled too): what the caches did not
    keep.  A kernel only the second pass of that start met is new, not again (the pack keeps
    it); Dynamo's traces live in the process (:func:`compile_log.is_kept_miss`)."""
    try:
        cold, learned = compile_log.read_dir(cold_state), compile_log.read_dir(learn_state)
    except OSError:  # the record is still good; this check is a courtesy
        return []

    def kept_misses(records: list[dict[str, Any]]) -> dict[tuple[str, str], str]:
        return {(str(r.get("compiler")), str(r.get("hash") or compile_log.kernel_name(r))):
                str(r.get("compiler") or "?") for r in records
                if compile_log.is_kept_miss(r) and r.get("phase") == "warmup"}

    before = kept_misses(cold)
    return [compiler for key, compiler in kept_misses(learned).items() if key in before]


def _bake_env(environ: Mapping[str, str], exported: Sequence[tuple[str, str]],
              cache_root: Path) -> tuple[dict[str, str], list[str]]:
    """The server's environment (``environ`` with the cache variables under ``cache_root``)
    and the warnings it deserves."""
    env = dict(environ)
    for var, value in exported:
        env[var] = value
        if var.startswith("SGLANG_"):  # SGLang's legacy SGL_<X> spelling would win
            env.pop("SGL_" + var[len("SGLANG_"):], None)
    # the bake sends the whole plan (a record the environment names is for launches), and names
    # its own cold start to the start that learns the record
    for var in (settings.STEPS.name, settings.BAKED_STATE.name):
        env.pop(var, None)
    warnings = [f"{var}={env[var]} is set: Triton may keep kernels outside {cache_root} and "
                f"they would not be baked"
                for var in ("TRITON_CACHE_MANAGER", "TRITON_REMOTE_CACHE_BACKEND") if env.get(var)]
    return env, warnings


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def _check_port_free(url: str) -> None:
    """Refuse to start when something already answers on the server's port: the readiness
    probe would talk to it instead."""
    import urllib.parse

    parsed = urllib.parse.urlparse(url)
    try:
        with socket.create_connection((parsed.hostname, parsed.port), timeout=1.0):
            pass
    except OSError:
        return
    raise SidecarError(f"something already listens on {parsed.hostname}:{parsed.port}",
                       hint="stop it, or give SGLang another port (--port N)")


def _tail(path: Path, n: int) -> list[str]:
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - 64 * 1024))
            return fh.read().decode(errors="replace").splitlines()[-n:]
    except OSError:
        return []


class _TermAsExit:
    """While active in the main thread, SIGTERM raises SystemExit(143) so that ``finally``
    blocks run (the server gets stopped when the prebake itself is stopped)."""

    def __enter__(self) -> "_TermAsExit":
        self._previous = None
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGTERM, self._raise)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)

    @staticmethod
    def _raise(signum: int, frame: Any) -> None:
        raise SystemExit(128 + signum)
