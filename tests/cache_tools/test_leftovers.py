"""kill -9 at each step of pack, restore, pull and prune, then a rerun (issue 17 item 10): no
partial entry or archive is ever visible, and after the rerun nothing of ours is left behind
(the next run removes what a killed one left, by a name no user file has, pid checked)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from cache_helpers import HERE, compile_into, triton_location
from cache_tools import archive, prune
from cache_tools.stores import redis as remote
from cache_tools.scan import scan_kind

URL = os.environ.get("WARMUP_TEST_REDIS_URL")


def _killed(op: str, point: str, **args) -> None:
    """Run ``op`` in a subprocess that SIGKILLs itself at ``point``."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(HERE.parents[1]), str(HERE)]))
    proc = subprocess.run([sys.executable, str(HERE / "cache_workers.py"), "kill", op, point,
                           json.dumps({k: str(v) for k, v in args.items()})],
                          capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == -signal.SIGKILL, (proc.returncode, proc.stdout, proc.stderr)
    assert "finished" not in proc.stdout


def _ours(*dirs: Path) -> list[str]:
    """Every name of ours (staging, trash, pack/merge temporaries) below ``dirs``."""
    found = []
    for d in dirs:
        for root, subdirs, files in os.walk(d):
            found += [os.path.join(root, n) for n in subdirs + files if n.startswith(".sgw-")]
    return found


def _no_partial_entry(root: Path) -> None:
    info = scan_kind(triton_location(root))
    assert [e.name for e in info.entries if not e.complete] == []


@pytest.mark.parametrize("op,point", [("pack", "stream"), ("pack", "rename"),
                                      ("pack-zstd", "stream"), ("pack-zstd", "rename")])
def test_pack(triton_cache, tmp_path, fp, op, point):
    out = tmp_path / "out" / "c.tar"
    _killed(op, point, src=triton_cache, out=out)
    assert not out.exists()                      # never half an archive under its name
    assert _ours(out.parent)                     # the killed run's temporary file is there
    archive.pack(out, [triton_location(triton_cache)], zstd=op == "pack-zstd", fingerprint=fp)
    assert _ours(out.parent) == []
    assert len(archive.verify(out, local=fp).manifest.entries) == 3


@pytest.mark.parametrize("point", ["stream", "commit"])
def test_restore(triton_cache, tmp_path, fp, point):
    tar = tmp_path / "c.tar"
    archive.pack(tar, [triton_location(triton_cache)], fingerprint=fp)
    dest = tmp_path / "dest"
    _killed("restore", point, archive=tar, dest=dest)
    _no_partial_entry(dest / "triton")
    assert _ours(dest)
    # The kind's directory did not exist: the restore staged it whole beside it.  Killed
    # while reading, it left that copy there, and a scan says so (the next restore removes
    # it); killed after the first commit, the one rename had moved all of it in.
    left = [w for w in scan_kind(triton_location(dest / "triton")).warnings
            if "restore staging directory" in w.message]
    assert [w.path.parent.parent for w in left] == ([dest] if point == "stream" else []), left
    plan = archive.plan_restore(tar, dest=dest, local=fp)
    plan.execute()
    assert _ours(dest) == []
    again = archive.plan_restore(tar, dest=dest, local=fp)
    assert again.nothing_to_do
    assert compile_into(dest / "triton") == [True, True, True]


def test_a_nothing_to_do_plan_removes_staging_of_a_killed_restore(triton_cache, tmp_path, fp):
    tar = tmp_path / "c.tar"
    archive.pack(tar, [triton_location(triton_cache)], fingerprint=fp)
    dest = tmp_path / "dest"
    archive.plan_restore(tar, dest=dest, local=fp).execute()
    victim = sorted((dest / "triton").iterdir())[0]
    import shutil

    shutil.rmtree(victim)
    _killed("restore", "stream", archive=tar, dest=dest)
    assert _ours(dest)
    shutil.copytree(triton_cache / victim.name, victim)     # now every entry is present
    plan = archive.plan_restore(tar, dest=dest, local=fp)   # a dry run plans, nothing more
    assert plan.nothing_to_do and _ours(dest) == []


@pytest.mark.skipif(not URL, reason="WARMUP_TEST_REDIS_URL is unset: no Redis to test against")
@pytest.mark.parametrize("point", ["stream", "commit"])
def test_pull(triton_cache, tmp_path, fp, point):
    import redis

    ns = f"sgw-test-{uuid.uuid4().hex[:12]}"
    try:
        remote.push(URL, [triton_location(triton_cache)], namespace=ns)
        dest = tmp_path / "dest"
        _killed("pull", point, url=URL, dest=dest, ns=ns)
        _no_partial_entry(dest / "triton")
        remote.plan_pull(URL, dest=dest, namespace=ns).execute()
        assert _ours(dest) == []
        assert compile_into(dest / "triton") == [True, True, True]
    finally:
        client = redis.Redis.from_url(URL)
        keys = list(client.scan_iter(f"{ns}:*"))
        if keys:
            client.delete(*keys)


@pytest.mark.parametrize("point", ["trash", "rmtree"])
def test_prune(triton_cache, tmp_path, point):
    before = {p.name for p in triton_cache.iterdir()}
    _killed("prune", point, src=triton_cache)
    _no_partial_entry(triton_cache)                # entries are whole or gone
    assert _ours(triton_cache)
    left = {p.name for p in triton_cache.iterdir() if not p.name.startswith(".sgw-")}
    assert left < before
    strategy = prune.plan_prune([triton_location(triton_cache)], older_than=0.0)
    assert _ours(triton_cache) == []               # planning removed the dead run's trash
    strategy.execute()
    assert list(triton_cache.iterdir()) == []


def test_user_files_that_look_like_ours_are_never_removed(tmp_path):
    from cache_tools.archive.staging import clean_stale

    d = tmp_path / "cache"
    d.mkdir()
    keep = [".sgw-staging-notes.txt", ".sgw-pack-x", ".sgw-trash-host-1-xyz",
            ".sgw-staging-host-1-0123456789ab-extra"]
    for name in keep:
        (d / name).write_text("user data")
    assert clean_stale(d) == []
    assert sorted(p.name for p in d.iterdir()) == sorted(keep)
