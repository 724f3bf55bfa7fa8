"""``sglang-warmup cache ...``: the commands over cache_tools' library calls.

Errors are raised as CacheError and printed by the ``sglang-warmup`` error boundary
(``error: ...`` / ``hint: ...``).  Results go to stdout; progress and warnings to stderr.
"""

from __future__ import annotations

from pathlib import Path
from typing import List, Literal, NoReturn, Optional

import typer

# What every command here needs; the OCI client (ssl, http.client), prune and replay are
# imported by their commands: a restore in an init container waits for every import.
from cache_tools import archive, fingerprint, forks, locations, render, scan
from cache_tools.stores import REDIS_NAMESPACE
from cache_tools.errors import CacheError
from warmup.cli import options, output
from warmup.cli.options import Format

app = typer.Typer(
    help="Persist, verify, relocate and share the JIT caches SGLang uses.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


#: ``--jobs`` of the commands that read an archive (verify, restore)
_READ_JOBS = typer.Option(None, "--jobs", "-j", min=1,
                          help="worker processes for a large archive (1: this process only; "
                               f"default: one per usable CPU; at most {forks.MAX_JOBS})")


def _locations(root: Optional[Path], kinds: Optional[List[str]]):
    return locations.resolve(locations.parse_kinds(kinds), root=root)


def _chosen_kinds(kinds: Optional[List[str]]) -> Optional[list[str]]:
    return [k.name for k in locations.parse_kinds(kinds)] if kinds else None


def _json(data) -> None:
    output.data_json(data, sort_keys=True)


@app.command("env")
def env_cmd(
    root: Optional[str] = options.root("put every kind under this absolute directory"),
    fmt: Literal["sh", "dockerfile", "k8s"] = typer.Option(
        "sh", "--format", help="sh | dockerfile (ENV lines) | k8s (a container's env:)"),
) -> None:
    """Print the variables that pin every cache directory (sh, Dockerfile ENV, k8s env)."""
    output.data(render.env_text(locations.exports(root), fmt))


@app.command("ls")
def ls_cmd(
    root: Optional[Path] = options.root("scan the --root layout under DIR instead of where "
                                        "SGLang looks"),
    kinds: Optional[List[str]] = options.KINDS,
    fmt: Format = options.FORMAT,
) -> None:
    """List each cache: path, entries, size, last use; problems as warnings."""
    profile = locations.detect_profile()
    info = scan.scan(_locations(root, kinds))
    if fmt == "json":
        _json(render.ls_json(info, profile))
    else:
        output.data(render.ls_text(info, profile))
    output.warn(render.ls_warnings(info))


@app.command("fingerprint")
def fingerprint_cmd(fmt: Format = options.FORMAT) -> None:
    """Show this machine's toolchain fingerprint."""
    fp = fingerprint.current()
    if fmt == "json":
        _json(fp.to_dict())
    else:
        output.data(render.fingerprint_text(fp))


@app.command("pack")
def pack_cmd(
    out: Path = typer.Argument(..., help="archive to write (.tar, or .tar.zst with --zstd)"),
    kinds: Optional[List[str]] = options.KINDS,
    root: Optional[Path] = options.root("pack the --root layout under DIR"),
    zstd: bool = typer.Option(False, "--zstd", help="compress with zstd (zstandard package)"),
    jobs: Optional[int] = typer.Option(None, "--jobs", "-j", min=1,
                                       help="worker processes that scan, read and compress a "
                                            "large cache (1: this process only; default: one "
                                            f"per usable CPU; at most {forks.MAX_JOBS}); the "
                                            "archive is the same for any number"),
    yes: bool = options.yes("overwrite OUT if it exists"),
    fmt: Format = options.FORMAT,
    quiet: bool = options.QUIET,
) -> None:
    """Pack complete cache entries into one archive (manifest.json first)."""
    output.refuse_overwrite(out, yes, "OUT")
    result = archive.pack(out, _locations(root, kinds), zstd=zstd, jobs=jobs,
                          progress=output.progress(quiet))
    if fmt == "json":
        _json(render.pack_json(result))
    else:
        output.data(render.pack_text(result))
    output.warn(render.pack_warnings(result))


@app.command("verify")
def verify_cmd(
    path: Path = typer.Argument(..., help="archive to check"),
    jobs: Optional[int] = _READ_JOBS,
    fmt: Format = options.FORMAT,
    json_alias: bool = options.JSON_ALIAS,
    quiet: bool = options.QUIET,
) -> None:
    """Hash every member against the manifest; show the fingerprint against this machine."""
    report = archive.verify(path, progress=output.progress(quiet), jobs=jobs)
    if options.output_format(fmt, json_alias) == "json":
        _json(render.verify_json(report))
    else:
        output.data(render.verify_text(report))


@app.command("restore")
def restore_cmd(
    path: Path = typer.Argument(..., help="archive to restore"),
    dest: Optional[Path] = typer.Option(None, "--dest", help="restore into the --root layout "
                                        "under DIR instead of where SGLang looks"),
    kinds: Optional[List[str]] = options.KINDS,
    dry_run: bool = typer.Option(False, "--dry-run", help="print the plan and stop"),
    force: bool = typer.Option(False, "--force", help="restore an archive of another "
                                                      "toolchain"),
    jobs: Optional[int] = _READ_JOBS,
    fmt: Format = options.FORMAT,
    json_alias: bool = options.JSON_ALIAS,
    quiet: bool = options.QUIET,
) -> None:
    """Restore an archive: plan, verify, then move each entry into place atomically.

    Never overwrites: complete entries already in place are kept (no -y needed).  The whole
    archive is read and checked even when every entry is already in place."""
    as_json = options.output_format(fmt, json_alias) == "json"
    plan = archive.plan_restore(path, dest=dest, kinds=_chosen_kinds(kinds), force=force)
    _install(plan, str(path), as_json, dry_run, quiet, verb="Restored", check_all=True,
             jobs=jobs)


@app.command("prune")
def prune_cmd(
    root: Optional[Path] = options.root("prune the --root layout under DIR"),
    kinds: Optional[List[str]] = options.KINDS,
    fp: Optional[Literal["other"]] = typer.Option(
        None, "--fingerprint", help="'other': entries built by another toolchain (where the "
        "cache records it)"),
    older_than: Optional[str] = typer.Option(None, "--older-than", help="last used longer ago "
                                             "than this (45s, 30m, 12h, 7d, 2w)"),
    max_size: Optional[str] = typer.Option(None, "--max-size", help="delete least recently "
                                           "used entries until the caches fit (500M, 10G)"),
    dry_run: bool = typer.Option(False, "--dry-run", help="print the plan and stop"),
    yes: bool = options.yes("do not ask for confirmation"),
    fmt: Format = options.FORMAT,
) -> None:
    """Delete cache entries, least recently used first."""
    from cache_tools import prune

    strategy = prune.plan_prune(
        _locations(root, kinds),
        older_than=prune.parse_duration(older_than) if older_than else None,
        max_size=prune.parse_size(max_size) if max_size is not None else None,
        other_toolchain=fp == "other")
    if fmt == "table":
        output.data(render.prune_text(strategy, dry_run=dry_run))
    result = None
    if not dry_run and strategy.candidates:
        if not yes and not output.confirm("Delete these entries?"):
            raise typer.Abort()
        result = strategy.execute()
    if fmt == "json":
        _json({"plan": render.prune_json(strategy),
               "result": render.prune_result_json(result) if result else None})
    elif result is not None:
        output.data(render.prune_result_text(result))
    if result is not None:
        output.warn(render.prune_result_warnings(result))


@app.command("merge")
def merge_cmd(
    out: Path = typer.Argument(..., help="archive to write"),
    inputs: List[Path] = typer.Argument(..., help="archives to merge (ranks, nodes)"),
    zstd: bool = typer.Option(False, "--zstd", help="compress with zstd"),
    force: bool = typer.Option(False, "--force", help="merge archives of different "
                                                      "toolchains"),
    yes: bool = options.yes("overwrite OUT if it exists"),
    fmt: Format = options.FORMAT,
    quiet: bool = options.QUIET,
) -> None:
    """Merge archives (ranks, nodes): identical entries once, conflicting ones an error."""
    output.refuse_overwrite(out, yes, "OUT")
    result = archive.merge(out, inputs, zstd=zstd, force=force, progress=output.progress(quiet))
    if fmt == "json":
        _json(render.merge_json(result))
    else:
        output.data(render.merge_text(result))


#: click's UsageError, from whichever click this typer raises (exit 2, the usage as the hint)
_UsageError = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "UsageError")


def _usage(ctx: typer.Context, message: str) -> NoReturn:
    raise _UsageError(message, ctx=ctx)


def _redis_only(ctx: typer.Context, root, kinds, namespace: str) -> None:
    """--root, --kinds (push) and --namespace are the Redis store's."""
    used = [name for name, value in (("--root", root), ("--kinds", kinds)) if value] + \
        (["--namespace"] if namespace != REDIS_NAMESPACE else [])
    if used:
        _usage(ctx, f"{', '.join(used)}: for --url redis://... only (an OCI artifact is the "
                    "archive's, tagged by its fingerprint)")


@app.command("push")
def push_cmd(
    ctx: typer.Context,
    archive_path: Optional[Path] = typer.Argument(None, metavar="ARCHIVE",
                                                  help="an archive to push to an OCI registry"),
    ref: Optional[str] = typer.Argument(None, metavar="REF",
                                        help="oci://HOST[:PORT]/REPO[:TAG] (oci+http:// for a "
                                             "plain-HTTP registry on loopback)"),
    url: Optional[str] = typer.Option(None, "--url", help="redis://HOST:PORT/DB: push the "
                                      "complete local entries instead"),
    root: Optional[Path] = options.root("push the --root layout under DIR (Redis)"),
    kinds: Optional[List[str]] = options.KINDS,
    namespace: str = typer.Option(REDIS_NAMESPACE, "--namespace", help="key prefix (Redis)"),
    fmt: Format = options.FORMAT,
    quiet: bool = options.QUIET,
) -> None:
    """Publish caches: an archive to an OCI registry (ARCHIVE oci://...), one layer per kind,
    tagged by its fingerprint; or complete local entries to a Redis store (--url, create-if-absent)."""
    from cache_tools.stores import oci

    if url is None:
        if archive_path is None or ref is None:
            _usage(ctx, "give ARCHIVE and an oci://... REF, or --url redis://...")
        _redis_only(ctx, root, kinds, namespace)
        pushed = oci.push(archive_path, ref, progress=output.progress(quiet))
        if fmt == "json":
            _json(render.oci_push_json(pushed))
        else:
            output.data(render.oci_push_text(pushed, str(archive_path)))
        return
    if archive_path is not None:
        _usage(ctx, "--url pushes the local caches; an ARCHIVE goes to an oci://... registry")
    from cache_tools.stores import redis as remote

    result = remote.push(url, _locations(root, kinds), namespace=namespace,
                         progress=output.progress(quiet))
    if fmt == "json":
        _json(render.push_json(result))
    else:
        output.data(render.push_text(result))
    output.warn(render.push_warnings(result))


@app.command("pull")
def pull_cmd(
    ctx: typer.Context,
    ref: Optional[str] = typer.Argument(None, metavar="REF", help="oci://HOST[:PORT]/REPO"
                                        "[:TAG|@sha256:DIGEST] (default tag: the toolchain's "
                                        "fingerprint hash)"),
    url: Optional[str] = typer.Option(None, "--url", help="redis://HOST:PORT/DB"),
    dest: Optional[Path] = typer.Option(None, "--dest", help="pull into the --root layout "
                                        "under DIR instead of where SGLang looks"),
    kinds: Optional[List[str]] = options.KINDS,
    fp: Optional[str] = typer.Option(None, "--fingerprint", help="toolchain hash to pull "
                                     "(default: this machine's)"),
    namespace: str = typer.Option(REDIS_NAMESPACE, "--namespace", help="key prefix (Redis)"),
    dry_run: bool = typer.Option(False, "--dry-run", help="print the plan and stop"),
    force: bool = typer.Option(False, "--force", help="pull entries of another toolchain"),
    fmt: Format = options.FORMAT,
    quiet: bool = options.QUIET,
) -> None:
    """Fetch caches from an OCI registry (REF) or a Redis store (--url): verified, staged,
    atomic, never overwriting."""
    from cache_tools.stores import oci

    if url is not None and oci.is_reference(url) and ref is None:
        ref, url = url, None
    if ref is not None and url is None:
        _redis_only(ctx, None, None, namespace)
        with oci.plan_pull(ref, dest=dest, kinds=_chosen_kinds(kinds), fingerprint_hash=fp,
                           force=force, progress=output.progress(quiet)) as oci_plan:
            _install(oci_plan, oci_plan.reference, fmt == "json", dry_run, quiet,
                     verb="Pulled", check_all=True)
        return
    if url is None or ref is not None:
        _usage(ctx, "give an oci://... REF or --url redis://..., one of them")
    from cache_tools.stores import redis as remote

    plan = remote.plan_pull(url, dest=dest, kinds=_chosen_kinds(kinds), fingerprint_hash=fp,
                            namespace=namespace, force=force)
    _install(plan, plan.namespace, fmt == "json", dry_run, quiet, verb="Pulled")


def _install(plan, source: str, as_json: bool, dry_run: bool, quiet: bool, *, verb: str,
             check_all: bool = False, jobs: int | None = None) -> None:
    """Print a restore or pull plan, execute it unless there is nothing to do (``check_all``:
    even then, so a restore reads and checks the whole archive), print what happened (JSON:
    ``{"plan": ..., "outcomes": [...]}``)."""
    if not as_json:
        output.data(render.plan_text(plan, source))
    result = None
    if not dry_run and (check_all or not plan.nothing_to_do):
        more = {"jobs": jobs} if jobs is not None else {}   # restore's workers (pull has none)
        result = plan.execute(progress=output.progress(quiet), **more)
    if as_json:
        _json({"plan": render.plan_json(plan),
               "outcomes": render.outcomes_json(result) if result else []})
    elif result is not None and not plan.nothing_to_do:
        output.data(render.result_text(result, verb=verb))
    if result is not None:
        output.warn(render.result_warnings(result))


@app.command("replay")
def replay_cmd(
    logs: List[Path] = typer.Argument(..., metavar="COMPILE_LOG",
                                      help="the compile log: compiles-<pid>.jsonl files, their "
                                           "directory or the state directory above it"),
    target: Optional[str] = typer.Option(None, "--target", help="replay only records for this "
                                         "target, e.g. cuda:90 (default: every recorded one)"),
    cache_dir: Optional[Path] = typer.Option(None, "--cache-dir", help="Triton cache to write "
                                             "into (default: where SGLang looks)"),
    jobs: Optional[int] = typer.Option(None, "--jobs", "-j", help="compile processes (1: in "
                                       "this process; default: one per usable CPU when workers can be "
                                       "forked, else 1)"),
    python: Optional[Path] = typer.Option(None, "--python", help="run the replay in this "
                                          "interpreter (one with the recorded Triton)"),
    dry_run: bool = typer.Option(False, "--dry-run", help="check every record on disk; "
                                                          "import, compile and run nothing"),
    strict: bool = typer.Option(False, "--strict", help="exit 1 when a kernel was skipped"),
    fmt: Format = options.FORMAT,
    json_alias: bool = options.JSON_ALIAS,
    quiet: bool = options.QUIET,
) -> None:
    """Rebuild Triton entries from a recorded compile log, without a GPU."""
    from cache_tools import replay as replay_mod

    def progress(result, done: int, total: int) -> None:
        if not quiet:
            output.note(f"[{done}/{total}] {result.status} {result.kernel}")

    report = replay_mod.replay(logs, cache_dir=cache_dir, target=target, jobs=jobs,
                               dry_run=dry_run, python=python, on_result=progress)
    if options.output_format(fmt, json_alias) == "json":
        _json(report.to_json())
    else:
        output.data(replay_mod.report_text(report))
    bad = report.count(replay_mod.FAILED) + (report.count(replay_mod.SKIPPED) if strict else 0)
    if bad:
        raise CacheError(f"{bad} of {len(report.results)} recorded kernels were not rebuilt",
                         hint="the WHY column says why for each; --strict also counts skipped "
                              "ones" if strict else "the failed rows say why")
