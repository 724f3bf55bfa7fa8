"""restore.py: where entries go (an absolute place, whatever --dest says), and that a restore
always reads and checks the whole archive, also when every entry is already in place."""

from __future__ import annotations

import hashlib
import json
import os
import tarfile
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cache_helpers import compile_into, tree, triton_location
from cache_tools import archive
from cache_tools.errors import ArchiveError
from cache_tools.locations import resolve
from cache_tools.scan import scan_kind


def _pack(src: Path, out: Path, fp) -> Path:
    archive.pack(out, [triton_location(src)], fingerprint=fp)
    return out


def test_a_relative_dest_writes_absolute_group_paths(triton_cache, tmp_path, fp, monkeypatch):
    """Issue 17 item 1: a server started in another working directory hits the entries."""
    tar = _pack(triton_cache, tmp_path / "c.tar", fp)
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    plan = archive.plan_restore(tar, dest="rel/cache", local=fp)
    assert plan.roots == {"triton": work / "rel" / "cache" / "triton"}
    plan.execute()
    restored = work / "rel" / "cache" / "triton"
    for grp in restored.glob("*/__grp__*.json"):
        assert all(os.path.isabs(p) and p == str(grp.parent / c)
                   for c, p in json.loads(grp.read_text())["child_paths"].items())
    elsewhere = tmp_path / "server-cwd"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert compile_into(restored) == [True, True, True]


def test_ls_with_a_relative_root_reports_no_copied_cache(triton_cache, tmp_path, fp,
                                                         monkeypatch):
    """Issue 17 item 11: a restored cache listed through a relative --root is not 'copied'."""
    tar = _pack(triton_cache, tmp_path / "c.tar", fp)
    archive.plan_restore(tar, dest=tmp_path / "root", local=fp).execute()
    monkeypatch.chdir(tmp_path)
    locs = resolve(root="root")
    assert locs[0].path == tmp_path / "root" / "triton"
    info = scan_kind(locs[0])
    assert len(info.complete_entries) == 3 and info.warnings == ()


def _flip_last_byte_of_a_cubin(tar: Path) -> str:
    with tarfile.open(tar) as t:
        member = next(m for m in t.getmembers() if m.name.endswith(".cubin"))
    data = bytearray(tar.read_bytes())
    data[member.offset_data + member.size - 1] ^= 0x01
    tar.write_bytes(data)
    return member.name


def test_a_damaged_archive_is_refused_even_when_every_entry_is_present(triton_cache, tmp_path,
                                                                      fp):
    """Issue 17 item 9: restore reads and checks the payload although it has nothing to
    write; it used to say "nothing to do" and exit 0."""
    tar = _pack(triton_cache, tmp_path / "c.tar", fp)
    dest = tmp_path / "dest"
    archive.plan_restore(tar, dest=dest, local=fp).execute()
    name = _flip_last_byte_of_a_cubin(tar)
    before = tree(dest)
    plan = archive.plan_restore(tar, dest=dest, local=fp)
    assert plan.nothing_to_do
    with pytest.raises(ArchiveError) as err:
        plan.execute()
    assert err.value.message.startswith(f"archive member {name!r}: sha256 mismatch (manifest ")
    assert tree(dest) == before


def test_the_cli_restore_exits_nonzero_on_it(triton_cache, tmp_path, fp):
    """The same through `sglang-warmup cache restore` (the command always executes the plan
    unless --dry-run)."""
    from warmup.cli.cache import app

    tar = _pack(triton_cache, tmp_path / "c.tar", None)
    dest = tmp_path / "dest"
    runner = CliRunner()
    ok = runner.invoke(app, ["restore", str(tar), "--dest", str(dest)])
    assert ok.exit_code == 0, ok.output
    again = runner.invoke(app, ["restore", str(tar), "--dest", str(dest)])
    assert again.exit_code == 0 and "Nothing to do: every entry is already in place." in \
        again.stdout
    _flip_last_byte_of_a_cubin(tar)
    bad = runner.invoke(app, ["restore", str(tar), "--dest", str(dest)])
    assert isinstance(bad.exception, ArchiveError) and bad.exception.exit_code == 3
    dry = runner.invoke(app, ["restore", str(tar), "--dest", str(dest), "--dry-run"])
    assert dry.exit_code == 0       # a dry run reads the manifest only, and says what it plans


def test_large_files_stream_through_pack_and_restore(tmp_path, fp):
    """Files above the reader's whole-member size are streamed in chunks, both ways."""
    from cache_tools.archive.reader import WHOLE

    src = tmp_path / "root"
    op = src / ".cache" / "flashinfer" / "0.2.14" / "90" / "cached_ops" / "big_op"
    op.mkdir(parents=True)
    big = hashlib.sha256(b"seed").digest() * ((WHOLE + (3 << 20)) // 32 + 7)
    (op / "big_op.so").write_bytes(big)
    (op / "build.ninja").write_text("rule link\n")
    os.chmod(op / "big_op.so", 0o755)
    out = tmp_path / "fi.tar"
    packed = archive.pack(out, resolve(root=src), fingerprint=fp)
    assert [(e.kind, e.name) for e in packed.manifest.entries] == [
        ("flashinfer", "0.2.14/90/cached_ops/big_op")]
    archive.verify(out, local=fp)
    dest = tmp_path / "dest"
    result = archive.plan_restore(out, dest=dest, local=fp).execute()
    assert [o.status for o in result.outcomes] == ["added"]
    got = dest / ".cache" / "flashinfer" / "0.2.14" / "90" / "cached_ops" / "big_op"
    assert (got / "big_op.so").read_bytes() == big
    assert os.stat(got / "big_op.so").st_mode & 0o111
    # damaged inside the large member: found by the chunked reader, nothing written
    data = bytearray(out.read_bytes())
    data[len(data) // 2] ^= 0xFF
    out.write_bytes(data)
    fresh = tmp_path / "fresh"
    with pytest.raises(ArchiveError) as err:
        archive.plan_restore(out, dest=fresh, local=fp).execute()
    assert err.value.message.startswith(
        "archive member 'flashinfer/0.2.14/90/cached_ops/big_op/big_op.so': sha256 mismatch")
    assert not fresh.exists()
