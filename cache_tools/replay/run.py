"""One replay from start to report: read the compile logs, check each distinct entry, compile
what is worth compiling, and say what happened to every entry.

``replay(..., python=PATH)`` runs the whole replay in another interpreter (one with the Triton
the logs were recorded with) as ``PATH -m cache_tools.replay ... --json`` and reads its report.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Sequence

from cache_tools import locations
from cache_tools.forks import fork_is_safe
from cache_tools.errors import CacheError
from cache_tools.replay import entries as recorded
from cache_tools.replay.entries import (Entry, Target, distinct_entries, is_triton_compile,
                                        kernel_label, log_files, parse_target, precheck,
                                        read_records)
from cache_tools.replay.pool import Pool, default_jobs
from cache_tools.replay.report import (KEY_MISMATCH, PLANNED, PRESENT, REBUILT, SKIPPED,
                                       KernelResult, ReplayReport)
from cache_tools.replay.toolchain import Toolchain


def default_cache_dir() -> Path:
    """Where a serving process on this machine would look for Triton entries."""
    (location,) = locations.resolve([locations.kind("triton")])
    if location.path is None:
        raise CacheError("no Triton cache directory is configured here",
                         hint="pass --cache-dir DIR")
    return location.path


def replay(logs: Sequence[str | os.PathLike[str]], *,
           cache_dir: str | os.PathLike[str] | None = None, target: str | None = None,
           jobs: int | None = None, dry_run: bool = False,
           python: str | os.PathLike[str] | None = None,
           on_result: Callable[[KernelResult, int, int], None] | None = None) -> ReplayReport:
    """Rebuild every Triton entry recorded in the compile logs ``logs`` into ``cache_dir``.

    ``logs``: ``compiles-<pid>.jsonl`` files, directories of them or state directories;
    ``target``: only records for this target (``cuda:90``); ``jobs``: compile processes (1:
    this process; default: :func:`~cache_tools.replay.pool.default_jobs`); ``dry_run``:
    resolve and check every record, compile nothing; ``python``: run the whole replay in that
    interpreter instead (one with the Triton the logs were recorded with);
    ``on_result(result, done, total)``: called as each entry finishes (progress).
    """
    started = time.perf_counter()
    if jobs is not None and jobs < 1:
        raise CacheError(f"--jobs {jobs}: expected 1 or more",
                         hint="--jobs 1 compiles in this process; more use worker processes")
    directory = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    wanted = parse_target(target) if target else None
    files = log_files(logs)
    if python is not None:
        return _replay_elsewhere(Path(python), files, cache_dir=directory, target=target,
                                 jobs=jobs, dry_run=dry_run)
    records, warnings = read_records(files)
    run = _Run(distinct_entries(records), on_result)
    toolchain = Toolchain.here()
    if not dry_run:
        _make(directory)
    directory = directory.resolve() if directory.exists() else directory.absolute()
    todo = run.check(wanted, toolchain)
    if dry_run:  # nothing is imported, compiled or executed: checks on disk only
        run.dry_run(todo, directory)
        todo = []
    workers = jobs if jobs is not None else default_jobs(len(todo), fork=fork_is_safe())
    pool = Pool(workers, len(todo))
    run.compile(pool, todo, directory, toolchain)
    warnings.extend(_autotune_warnings(run.entries, run.tuning))
    warnings.extend(_toolchain_warnings(run.done))
    return ReplayReport(
        logs=tuple(str(f) for f in files), cache_dir=str(directory),
        target=target, python=sys.executable, triton_version=toolchain.triton_version,
        dry_run=dry_run, jobs=workers, results=tuple(run.done), ignored=run.ignored(records),
        warnings=tuple(warnings), seconds=time.perf_counter() - started, pool=pool.kind)


def _make(directory: Path) -> None:
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise CacheError(f"{directory}: cannot create the cache directory: "
                         f"{exc.strerror or exc}", hint="pass a writable --cache-dir") from None


class _Run:
    """One replay's entries and their results, filled in as each entry is decided."""

    def __init__(self, entries: list[Entry],
                 on_result: Callable[[KernelResult, int, int], None] | None) -> None:
        self.entries = entries
        self.results: list[KernelResult | None] = [None] * len(entries)
        self.tuning: dict[int, dict[str, Any]] = {}
        self.finished = 0
        self.on_result = on_result

    @property
    def done(self) -> list[KernelResult]:
        return [r for r in self.results if r is not None]

    @staticmethod
    def ignored(records: Sequence[dict[str, Any]]) -> int:
        """Lines that are not Triton compiles (device loads, JIT builds, ...)."""
        return sum(1 for r in records if not is_triton_compile(r))

    def finish(self, index: int, result: KernelResult) -> None:
        self.results[index] = result
        self.finished += 1
        if self.on_result is not None:
            self.on_result(result, self.finished, len(self.entries))

    def check(self, wanted: Target | None, toolchain: Toolchain) -> list[int]:
        """Skip what the checks without Triton refuse; the indexes worth a try."""
        todo = []
        for index, entry in enumerate(self.entries):
            problem = precheck(entry.record, target=wanted,
                               triton_version=toolchain.triton_version)
            if problem is None:
                todo.append(index)
            else:
                self.finish(index, entry.result(status=SKIPPED, reason=problem[0],
                                                detail=problem[1]))
        return todo

    def dry_run(self, todo: list[int], directory: Path) -> None:
        for index in todo:
            status, reason, detail = recorded.dry_run(self.entries[index].record, directory)
            self.finish(index, self.entries[index].result(status=status, reason=reason,
                                                          detail=detail))

    def compile(self, pool: Pool, todo: list[int], directory: Path,
                toolchain: Toolchain) -> None:
        records = [self.entries[i].record for i in todo]
        for position, outcome in pool.run(records, cache_dir=str(directory),
                                          toolchain=toolchain):
            index = todo[position]
            if outcome.get("autotune"):
                self.tuning[index] = outcome["autotune"]
            self.finish(index, self.entries[index].result(
                status=outcome["status"], reason=outcome.get("reason", ""),
                detail=outcome.get("detail", ""), seconds=float(outcome.get("seconds", 0.0))))


def _toolchain_warnings(results: Sequence[KernelResult]) -> list[str]:
    """One warning when every key that was checked differs: the toolchain, not the kernels."""
    mismatched = sum(1 for r in results if r.reason == KEY_MISMATCH)
    if mismatched > 1 and not any(r.status in (REBUILT, PRESENT, PLANNED) for r in results):
        return [f"all {mismatched} recomputed cache keys differ from the recorded ones: the "
                "toolchain differs from the recording machine's (the Triton wheel or Python "
                "version, ptxas, the cache-invalidating environment), not single kernels"]
    return []


def _autotune_warnings(entries: Sequence[Entry], tuning: dict[int, dict[str, Any]]) -> list[str]:
    """One warning per autotuned specialization whose compile log lacks some of its configs:
    a cold serving process benchmarks every config, and the unrecorded ones compile there."""
    groups: dict[tuple[str, str], tuple[int, set[int]]] = {}
    for index, info in tuning.items():
        label = kernel_label(entries[index].record)
        configs, seen = groups.get((label, info["group"]), (info["configs"], set()))
        if info.get("match") is not None:
            seen.add(int(info["match"]))
        groups[(label, info["group"])] = (configs, seen)
    out = []
    for (label, _group), (configs, seen) in groups.items():
        if len(seen) < configs:
            out.append(f"{label}: autotuned, {len(seen)} of its {configs} configs recorded for "
                       "one specialization; a cold serving process that benchmarks the others "
                       "compiles them (fewer if the autotuner prunes its configs)")
    return out


def _replay_elsewhere(python: Path, files: Sequence[Path], *, cache_dir: Path,
                      target: str | None, jobs: int | None, dry_run: bool) -> ReplayReport:
    """Run the replay as ``PYTHON -m cache_tools.replay ... --json`` and read its report."""
    if not (python.is_file() and os.access(python, os.X_OK)):
        raise CacheError(f"--python {python}: not an executable file",
                         hint="pass the interpreter of an environment with the recorded "
                              "Triton, e.g. .deps/replay-py312/bin/python")
    argv = [str(python), "-m", "cache_tools.replay", *(str(f.absolute()) for f in files),
            "--cache-dir", str(cache_dir.absolute()), "--json"]
    if target:
        argv += ["--target", target]
    if jobs is not None:
        argv += ["--jobs", str(jobs)]
    if dry_run:
        argv.append("--dry-run")
    env = dict(os.environ)
    # cache_tools is standard-library-only: appended, it cannot shadow that interpreter's
    # Triton or SGLang.
    here = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (env.get("PYTHONPATH"), here) if p)
    done = subprocess.run(argv, env=env, stdout=subprocess.PIPE, stderr=None, text=True,
                          check=False)
    if done.returncode not in (0, 1) or not done.stdout.strip():
        raise CacheError(f"the replay in {python} exited with status {done.returncode}",
                         hint="its error is printed above; run the same command with that "
                              "interpreter directly to see more")
    try:
        data: Any = json.loads(done.stdout)
        return ReplayReport.from_json(data)
    except (ValueError, KeyError, TypeError) as exc:
        raise CacheError(f"the replay in {python} printed no report: {exc}",
                         hint="does that interpreter run this version of sglang-warmup's "
                              "cache_tools?") from None
