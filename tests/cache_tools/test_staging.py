"""staging.py: restores racing each other and a Triton compile into one directory, and a restore
killed with SIGKILL, never leave a partial entry visible."""

from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import cache_kernels
import cache_workers
from cache_helpers import HERE, compile_into, tree, triton_location
from cache_tools import archive
from cache_tools.errors import CacheError
from cache_tools.scan import scan_kind
from cache_tools.archive.staging import clean_stale, own_name
from cache_tools.locations import STAGING_PREFIX


def _pack(src: Path, out: Path, fp) -> Path:
    archive.pack(out, [triton_location(src)], fingerprint=fp)
    return out


def test_concurrent_restores_while_triton_compiles(triton_cache, tmp_path, fp):
    tar = _pack(triton_cache, tmp_path / "c.tar", fp)
    dest = tmp_path / "shared"
    ctx = multiprocessing.get_context("spawn")
    go = ctx.Event()
    results = ctx.Queue()
    procs = [ctx.Process(target=cache_workers.restore_worker, args=(str(tar), str(dest), go, 3))
             for _ in range(3)]
    procs.append(ctx.Process(target=cache_workers.compile_worker,
                             args=(str(dest / "triton"), go, results)))
    for p in procs:
        p.start()
    go.set()
    hits = results.get(timeout=240)
    for p in procs:
        p.join(240)
    assert [p.exitcode for p in procs] == [0, 0, 0, 0]
    assert len(hits) == 4 and hits[3] is False        # EXTRA is in no archive: compiled
    info = scan_kind(triton_location(dest / "triton"))
    assert [e.problem for e in info.entries if not e.complete] == []
    assert len(info.entries) == 4 and not info.warnings
    assert not [p for p in (dest / "triton").iterdir() if p.name.startswith(".sgw-")]
    specs = cache_kernels.SPECS + cache_kernels.EXTRA
    assert compile_into(dest / "triton", specs) == [True, True, True, True]


def _killed_after_first_commit(tar: Path, dest: Path) -> str:
    """Restore ``tar`` into ``dest`` in a child process, SIGKILLed right after its first
    committed entry; returns the line that reported that entry."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(HERE.parents[1]), str(HERE)]))
    proc = subprocess.Popen([sys.executable, str(HERE / "cache_workers.py"), str(tar),
                             str(dest), "60"], stdout=subprocess.PIPE, text=True, env=env)
    try:
        first = proc.stdout.readline()
        assert first.startswith("committed ") and first.endswith(" added\n"), first
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(30)
    assert proc.returncode == -signal.SIGKILL
    return first


def test_sigkill_mid_restore_leaves_no_partial_entry_and_a_rerun_completes(
        triton_cache, tmp_path, fp):
    tar = _pack(triton_cache, tmp_path / "c.tar", fp)
    dest = tmp_path / "dest"
    root = dest / "triton"
    root.mkdir(parents=True)                 # the directory exists: one rename per entry
    first = _killed_after_first_commit(tar, dest)
    info = scan_kind(triton_location(root))
    assert [(e.name, e.complete) for e in info.entries] == [(first.split()[1], True)]
    leftovers = [p for p in root.iterdir() if p.name.startswith(STAGING_PREFIX)]
    assert len(leftovers) == 1
    assert [w.message for w in info.warnings] == [
        "restore staging directory (a restore is running or was interrupted; the next restore "
        "removes it)"]
    plan = archive.plan_restore(tar, dest=dest, local=fp)
    assert sorted(i.action for i in plan.items) == ["add", "add", "skip"]
    assert [o.status for o in plan.execute().outcomes] == ["added", "added"]
    assert not [p for p in root.iterdir() if p.name.startswith(STAGING_PREFIX)]
    assert compile_into(root) == [True, True, True]


def test_a_new_directory_moves_in_whole_and_a_killed_restore_leaves_it_complete(
        triton_cache, tmp_path, fp, monkeypatch):
    tar = _pack(triton_cache, tmp_path / "c.tar", fp)
    dest = tmp_path / "dest"
    root = dest / "triton"                   # absent: staged beside it, moved in with one rename
    _killed_after_first_commit(tar, dest)
    info = scan_kind(triton_location(root))
    assert [e.complete for e in info.entries] == [True, True, True] and not info.warnings
    assert len([p for p in dest.iterdir() if p.name.startswith(STAGING_PREFIX)]) == 1
    plan = archive.plan_restore(tar, dest=dest, local=fp)   # removes the dead run's staging
    assert [i.action for i in plan.items] == ["skip", "skip", "skip"]
    assert [p.name for p in dest.iterdir()] == ["triton"]
    assert compile_into(root) == [True, True, True]
    # A directory that appears between staging and commit gets the entries one by one.
    import shutil

    from cache_tools.archive.staging import Installer

    shutil.rmtree(dest)
    plan = archive.plan_restore(tar, dest=dest, local=fp)
    real = Installer.commit_all

    def appear_first(self, on_entry=None):
        (root / "other").mkdir(parents=True)
        return real(self, on_entry)

    monkeypatch.setattr(Installer, "commit_all", appear_first)
    outcomes = plan.execute(jobs=1).outcomes
    assert [o.status for o in outcomes] == ["added", "added", "added"]
    assert sorted(p.name for p in root.iterdir()) == sorted(
        [o.entry.name for o in outcomes] + ["other"])
    assert [p.name for p in dest.iterdir()] == ["triton"]
    assert compile_into(root) == [True, True, True]


def test_only_dead_processes_staging_is_cleaned(tmp_path):
    mine = tmp_path / own_name(STAGING_PREFIX)           # this (live) process... but
    mine.mkdir()                                              # same pid: treated as a leftover
    alive_pid = os.getppid()
    theirs = tmp_path / mine.name.replace(f"-{os.getpid()}-", f"-{alive_pid}-")
    theirs.mkdir()
    assert clean_stale(tmp_path) == [mine]
    assert theirs.exists()


# --- symbolic links where restore would write: refused, nothing written ---------------------
def _flashinfer_archive(tmp_path: Path, fp) -> Path:
    """An archive of one FlashInfer entry, ``0.2.14/90/cached_ops/op`` (a name of directories)."""
    from cache_tools.locations import resolve

    op = tmp_path / "root" / ".cache" / "flashinfer" / "0.2.14" / "90" / "cached_ops" / "op"
    op.mkdir(parents=True)
    (op / "op.so").write_bytes(b"kernel")
    archive.pack(tmp_path / "fi.tar", resolve(root=tmp_path / "root"), fingerprint=fp)
    return tmp_path / "fi.tar"


@pytest.mark.parametrize("link", [".cache", ".cache/flashinfer", ".cache/flashinfer/0.2.14",
                                  ".cache/flashinfer/0.2.14/90/cached_ops"])
def test_restore_refuses_a_link_below_dest(tmp_path, fp, link):
    """A link between --dest and the kind's directory, the kind's directory itself or a
    directory of an entry's name: one line naming it, nothing written through it or beside."""
    tar = _flashinfer_archive(tmp_path, fp)
    dest, elsewhere = tmp_path / "dest", tmp_path / "elsewhere"
    elsewhere.mkdir()
    (dest / link).parent.mkdir(parents=True, exist_ok=True)
    (dest / link).symlink_to(elsewhere)
    before = tree(dest)
    with pytest.raises(CacheError) as err:
        archive.plan_restore(tar, dest=dest, local=fp)
    assert err.value.message == f"{dest / link}: a symbolic link (to {elsewhere}); nothing was " \
                                "written"
    assert list(elsewhere.iterdir()) == [] and tree(dest) == before


def test_restore_refuses_a_linked_kind_directory_and_accepts_a_linked_dest(triton_cache,
                                                                           tmp_path, fp, capsys):
    from warmup.cli import main

    tar = _pack(triton_cache, tmp_path / "c.tar", fp)
    dest, elsewhere = tmp_path / "dest", tmp_path / "elsewhere"
    dest.mkdir()
    elsewhere.mkdir()
    (dest / "triton").symlink_to(elsewhere)
    with pytest.raises(SystemExit) as exit_:
        main(["cache", "restore", str(tar), "--dest", str(dest), "-q"])
    out, err = capsys.readouterr()
    assert (exit_.value.code, out) == (1, "")
    assert err.splitlines()[0] == (f"error: {dest / 'triton'}: a symbolic link (to {elsewhere}); "
                                   "nothing was written")
    assert list(elsewhere.iterdir()) == []
    (tmp_path / "linked").symlink_to(elsewhere)     # --dest itself is the user's choice
    archive.plan_restore(tar, dest=tmp_path / "linked", local=fp).execute()
    assert len(list((elsewhere / "triton").iterdir())) == 3
