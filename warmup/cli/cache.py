"""``sglang-warmup cache ...``: thin commands over cache_tools' library calls.

Errors are raised as CacheError and printed by the ``sglang-warmup`` error boundary
(``error: ...`` / ``hint: ...``).  Progress goes to stderr; results to stdout.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import List, Optional

import typer

from cache_tools import archive, fingerprint, locations, prune, remote, render, scan
from cache_tools.errors import CacheError
from cache_tools.progress import Progress

app = typer.Typer(
    help="Persist, verify, relocate and share the JIT caches SGLang uses.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

_KINDS_HELP = "cache kinds (repeat or comma-separate): " + ", ".join(locations.KIND_NAMES)


def _choice(value: str, allowed: tuple[str, ...], option: str) -> str:
    if value not in allowed:
        raise CacheError(f"{option} {value!r}: expected one of {', '.join(allowed)}",
                         hint=f"for example {option} {allowed[0]}")
    return value


def _locations(root: Optional[Path], kinds: Optional[List[str]]):
    return locations.resolve(locations.parse_kinds(kinds), root=root)


def _print_json(data) -> None:
    typer.echo(json.dumps(data, indent=2, sort_keys=True))


@app.command("env")
def env_cmd(
    root: Optional[str] = typer.Option(None, "--root", help="put every kind under this "
                                       "absolute directory"),
    fmt: str = typer.Option("sh", "--format", help="sh | dockerfile | k8s"),
) -> None:
    """Print the variables that pin every cache directory (sh, Dockerfile ENV, k8s env)."""
    _choice(fmt, ("sh", "dockerfile", "k8s"), "--format")
    typer.echo(render.env_text(locations.exports(root), fmt))


@app.command("ls")
def ls_cmd(
    root: Optional[Path] = typer.Option(None, "--root", help="scan the --root layout under DIR "
                                        "instead of where SGLang looks"),
    kinds: Optional[List[str]] = typer.Option(None, "--kinds", help=_KINDS_HELP),
    fmt: str = typer.Option("table", "--format", help="table | json"),
) -> None:
    """List each cache: path, entries, size, last use; problems as warnings."""
    _choice(fmt, ("table", "json"), "--format")
    profile = locations.detect_profile()
    info = scan.scan(_locations(root, kinds))
    if fmt == "json":
        _print_json(render.ls_json(info, profile))
    else:
        typer.echo(render.ls_text(info, profile))


@app.command("fingerprint")
def fingerprint_cmd(fmt: str = typer.Option("table", "--format", help="table | json")) -> None:
    """Show this machine's toolchain fingerprint."""
    _choice(fmt, ("table", "json"), "--format")
    fp = fingerprint.current()
    if fmt == "json":
        _print_json(fp.to_dict())
    else:
        typer.echo(render.fingerprint_text(fp))


@app.command("pack")
def pack_cmd(
    out: Path = typer.Argument(..., help="archive to write (.tar, or .tar.zst with --zstd)"),
    kinds: Optional[List[str]] = typer.Option(None, "--kinds", help=_KINDS_HELP),
    root: Optional[Path] = typer.Option(None, "--root", help="pack the --root layout under DIR"),
    zstd: bool = typer.Option(False, "--zstd", help="compress with zstd (zstandard package)"),
) -> None:
    """Pack complete cache entries into one archive (manifest.json first)."""
    result = archive.pack(out, _locations(root, kinds), zstd=zstd, progress=Progress())
    typer.echo(render.pack_text(result))


@app.command("verify")
def verify_cmd(
    path: Path = typer.Argument(..., help="archive to check"),
    as_json: bool = typer.Option(False, "--json", help="print JSON"),
) -> None:
    """Hash every member against the manifest; show the fingerprint against this machine."""
    report = archive.verify(path, progress=Progress())
    if as_json:
        _print_json(render.verify_json(report))
    else:
        typer.echo(render.verify_text(report))


@app.command("restore")
def restore_cmd(
    path: Path = typer.Argument(..., help="archive to restore"),
    dest: Optional[Path] = typer.Option(None, "--dest", help="restore into the --root layout "
                                        "under DIR instead of where SGLang looks"),
    kinds: Optional[List[str]] = typer.Option(None, "--kinds", help=_KINDS_HELP),
    dry_run: bool = typer.Option(False, "--dry-run", help="print the plan and stop"),
    force: bool = typer.Option(False, "--force", help="restore an archive of another "
                                                      "toolchain"),
    as_json: bool = typer.Option(False, "--json", help="print the plan and outcomes as JSON"),
) -> None:
    """Restore an archive: plan, verify, then move each entry into place atomically."""
    chosen = [k.name for k in locations.parse_kinds(kinds)] if kinds else None
    plan = archive.plan_restore(path, dest=dest, kinds=chosen, force=force)
    if not as_json:
        typer.echo(render.plan_text(plan, str(path)))
    if dry_run:
        if as_json:
            _print_json({"plan": render.plan_json(plan), "outcomes": []})
        return
    # Always executed: it reads and checks the whole archive even when nothing is to write.
    result = plan.execute(progress=Progress())
    if as_json:
        _print_json({"plan": render.plan_json(plan), "outcomes": render.outcomes_json(result)})
    elif not plan.nothing_to_do:
        typer.echo(render.result_text(result))


@app.command("prune")
def prune_cmd(
    root: Optional[Path] = typer.Option(None, "--root", help="prune the --root layout under DIR"),
    kinds: Optional[List[str]] = typer.Option(None, "--kinds", help=_KINDS_HELP),
    fp: Optional[str] = typer.Option(None, "--fingerprint", help="'other': entries built by "
                                     "another toolchain (where the cache records it)"),
    older_than: Optional[str] = typer.Option(None, "--older-than", help="last used longer ago "
                                             "than this (45s, 30m, 12h, 7d, 2w)"),
    max_size: Optional[str] = typer.Option(None, "--max-size", help="delete least recently "
                                           "used entries until the caches fit (500M, 10G)"),
    dry_run: bool = typer.Option(False, "--dry-run", help="print the plan and stop"),
    yes: bool = typer.Option(False, "-y", "--yes", help="do not ask for confirmation"),
) -> None:
    """Delete cache entries, least recently used first."""
    if fp is not None:
        _choice(fp, ("other",), "--fingerprint")
    strategy = prune.plan_prune(
        _locations(root, kinds),
        older_than=prune.parse_duration(older_than) if older_than else None,
        max_size=prune.parse_size(max_size) if max_size is not None else None,
        other_toolchain=fp == "other")
    typer.echo(render.prune_text(strategy))
    if dry_run or not strategy.candidates:
        return
    if not yes and not typer.confirm("Delete these entries?", default=False):
        raise typer.Abort()
    typer.echo(render.prune_result_text(strategy.execute()))


@app.command("merge")
def merge_cmd(
    out: Path = typer.Argument(..., help="archive to write"),
    inputs: List[Path] = typer.Argument(..., help="archives to merge (ranks, nodes)"),
    zstd: bool = typer.Option(False, "--zstd", help="compress with zstd"),
    force: bool = typer.Option(False, "--force", help="merge archives of different "
                                                      "toolchains"),
) -> None:
    """Merge archives (ranks, nodes): identical entries once, conflicting ones an error."""
    result = archive.merge(out, inputs, zstd=zstd, force=force, progress=Progress())
    typer.echo(render.merge_text(result))


@app.command("push")
def push_cmd(
    url: str = typer.Option(..., "--url", help="redis://HOST:PORT/DB"),
    root: Optional[Path] = typer.Option(None, "--root", help="push the --root layout under DIR"),
    kinds: Optional[List[str]] = typer.Option(None, "--kinds", help=_KINDS_HELP),
    namespace: str = typer.Option(remote.NAMESPACE, "--namespace", help="key prefix"),
) -> None:
    """Publish complete local entries to a shared Redis store (create-if-absent)."""
    result = remote.push(url, _locations(root, kinds), namespace=namespace,
                         progress=Progress())
    typer.echo(render.push_text(result))


@app.command("pull")
def pull_cmd(
    url: str = typer.Option(..., "--url", help="redis://HOST:PORT/DB"),
    dest: Optional[Path] = typer.Option(None, "--dest", help="pull into the --root layout "
                                        "under DIR instead of where SGLang looks"),
    kinds: Optional[List[str]] = typer.Option(None, "--kinds", help=_KINDS_HELP),
    fp: Optional[str] = typer.Option(None, "--fingerprint", help="toolchain hash to pull "
                                     "(default: this machine's)"),
    namespace: str = typer.Option(remote.NAMESPACE, "--namespace", help="key prefix"),
    dry_run: bool = typer.Option(False, "--dry-run", help="print the plan and stop"),
    force: bool = typer.Option(False, "--force", help="pull entries of another toolchain"),
) -> None:
    """Fetch entries from a shared Redis store: verified, staged, atomic, never overwriting."""
    chosen = [k.name for k in locations.parse_kinds(kinds)] if kinds else None
    plan = remote.plan_pull(url, dest=dest, kinds=chosen, fingerprint_hash=fp,
                            namespace=namespace, force=force)
    typer.echo(render.plan_text(plan, plan.namespace))
    if dry_run or plan.nothing_to_do:
        return
    result = plan.execute(progress=Progress())
    typer.echo(render.result_text(result, verb="Pulled"))


@app.command("replay")
def replay_cmd(
    manifests: List[Path] = typer.Argument(..., help="compile manifest: compiles-<pid>.jsonl "
                                           "files, their manifest/ directory or the state "
                                           "directory above it"),
    target: Optional[str] = typer.Option(None, "--target", help="replay only records for this "
                                         "target, e.g. cuda:90 (default: every recorded one)"),
    cache_dir: Optional[Path] = typer.Option(None, "--cache-dir", help="Triton cache to write "
                                             "into (default: where SGLang looks)"),
    jobs: Optional[int] = typer.Option(None, "--jobs", "-j", help="compile processes (1: in "
                                       "this process; default: one per CPU)"),
    python: Optional[Path] = typer.Option(None, "--python", help="run the replay in this "
                                          "interpreter (one with the recorded Triton)"),
    dry_run: bool = typer.Option(False, "--dry-run", help="check every record, compile "
                                                          "nothing"),
    strict: bool = typer.Option(False, "--strict", help="exit 1 when a kernel was skipped"),
    as_json: bool = typer.Option(False, "--json", help="print JSON"),
) -> None:
    """Rebuild Triton entries from a recorded compile manifest, without a GPU."""
    from cache_tools import replay as replay_mod

    def progress(result, done: int, total: int) -> None:
        typer.echo(f"[{done}/{total}] {result.status} {result.kernel}", err=True)

    report = replay_mod.replay(manifests, cache_dir=cache_dir, target=target, jobs=jobs,
                               dry_run=dry_run, python=python, on_result=progress)
    if as_json:
        _print_json(report.to_json())
    else:
        typer.echo(replay_mod.report_text(report))
    bad = report.count(replay_mod.FAILED) + (report.count(replay_mod.SKIPPED) if strict else 0)
    if bad:
        raise CacheError(f"{bad} of {len(report.results)} recorded kernels were not rebuilt",
                         hint="the WHY column says why for each; --strict also counts skipped "
                              "ones" if strict else "the failed rows say why")
