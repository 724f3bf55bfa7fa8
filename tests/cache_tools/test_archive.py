"""cache_tools.archive: pack, verify, restore and merge real Triton caches; a relocated restore hits."""

from __future__ import annotations

import hashlib
import io
import json
import shutil
import tarfile
from pathlib import Path

import pytest

from cache_helpers import compile_into, tree, triton_location
from cache_tools import archive
from cache_tools.errors import ArchiveError, IncompatibleError
from cache_tools.fingerprint import Fingerprint
from cache_tools.archive.manifest import MANIFEST_NAME
from cache_tools.progress import Progress
from cache_tools.render import (merge_text, pack_text, pack_warnings, plan_text, result_text,
                                verify_text)
from cache_tools.scan import scan_kind


def _pack(src: Path, out: Path, fp: Fingerprint, **kw) -> archive.PackResult:
    return archive.pack(out, [triton_location(src)], fingerprint=fp, **kw)


def _restore(path: Path, dest: Path, **kw) -> archive.RestoreResult:
    return archive.plan_restore(path, dest=dest, **kw).execute()


def _other_toolchain(fp: Fingerprint, **changes) -> Fingerprint:
    soft = fp.software_map | changes
    return Fingerprint(tuple(sorted(soft.items())), fp.hardware)


def test_relocated_restore_is_a_triton_cache_hit(triton_cache, tmp_path, fp):
    out = tmp_path / "cache.tar"
    result = _pack(triton_cache, out, fp)
    assert len(result.manifest.entries) == 3 and not result.warnings
    shutil.rmtree(triton_cache)   # nothing may point back at the source
    dest = tmp_path / "elsewhere"
    done = _restore(out, dest)
    assert [o.status for o in done.outcomes] == ["added"] * 3
    for grp in (dest / "triton").glob("*/__grp__*.json"):
        children = json.loads(grp.read_text())["child_paths"]
        assert all(p == str(grp.parent / name) for name, p in children.items())
    assert compile_into(dest / "triton") == [True, True, True]
    assert not list((dest / "triton").glob(".sgw-*"))


def test_restore_without_dest_goes_where_triton_looks(triton_cache, tmp_path, fp, monkeypatch):
    out = tmp_path / "cache.tar"
    _pack(triton_cache, out, fp)
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "live"))
    plan = archive.plan_restore(out, local=fp)
    assert plan.roots == {"triton": tmp_path / "live"}
    plan.execute()
    assert compile_into(tmp_path / "live") == [True, True, True]


def test_same_cache_packs_to_the_same_bytes(triton_cache, tmp_path, fp):
    for zstd in (False, True):
        a, b = tmp_path / f"a{zstd}", tmp_path / f"b{zstd}"
        _pack(triton_cache, a, fp, zstd=zstd)
        _pack(triton_cache, b, fp, zstd=zstd)
        assert a.read_bytes() == b.read_bytes()
    with tarfile.open(tmp_path / "aFalse") as tar:
        members = tar.getmembers()
    assert members[0].name == MANIFEST_NAME
    assert {(m.mtime, m.uid, m.gid, m.uname, m.gname) for m in members} == {(0, 0, 0, "", "")}
    assert {m.mode for m in members} <= {0o644, 0o755}
    # The archive form of a group names its children relative to the entry.
    grp = next(m for m in members if "__grp__" in m.name)
    with tarfile.open(tmp_path / "aFalse") as tar:
        children = json.loads(tar.extractfile(grp).read())["child_paths"]
    assert all(name == rel for name, rel in children.items())


def test_verify_checks_every_member_and_shows_the_fingerprint(triton_cache, tmp_path, fp):
    out = tmp_path / "c.tar.zst"
    _pack(triton_cache, out, fp, zstd=True)
    report = archive.verify(out, local=fp)
    assert report.compressed and report.compatibility.ok
    assert len(report.manifest.entries) == 3
    text = verify_text(report)
    assert text.splitlines()[0].startswith(f"{out}: OK - 3 entries, ")
    assert "fingerprint: matches this machine" in text


def test_verify_detects_a_flipped_byte(triton_cache, tmp_path, fp):
    out = tmp_path / "c.tar"
    result = _pack(triton_cache, out, fp)
    name, _, frec = next(m for m in result.manifest.members() if m[0].endswith(".cubin"))
    with tarfile.open(out) as tar:
        offset = tar.getmember(name).offset_data
    data = bytearray(out.read_bytes())
    data[offset + 100] ^= 0x01
    out.write_bytes(data)
    content = bytes(data[offset:offset + frec.size])
    expected = (f"archive member {name!r}: sha256 mismatch (manifest {frec.sha256[:16]}, "
                f"content {hashlib.sha256(content).hexdigest()[:16]})")
    with pytest.raises(ArchiveError) as err:
        archive.verify(out, local=fp)
    assert err.value.message == expected
    dest = tmp_path / "dest"
    plan = archive.plan_restore(out, dest=dest, local=fp)   # the manifest itself is intact
    with pytest.raises(ArchiveError) as err:
        plan.execute()
    assert err.value.message == expected
    assert not dest.exists()   # nothing written, not even the kind directory


def test_complete_entries_are_never_overwritten(triton_cache, tmp_path, fp):
    out = tmp_path / "c.tar"
    _pack(triton_cache, out, fp)
    dest = tmp_path / "dest"
    _restore(out, dest, local=fp)
    ttir = next((dest / "triton").glob("*/*.ttir"))
    ttir.write_text(ttir.read_text() + "\n// local edit\n")
    before = tree(dest)
    plan = archive.plan_restore(out, dest=dest, local=fp)
    assert [i.action for i in plan.items] == ["skip"] * 3 and plan.nothing_to_do
    assert plan_text(plan, "c.tar").splitlines()[-1] == \
        "Nothing to do: every entry is already in place."
    assert plan.execute().outcomes == ()
    assert tree(dest) == before


def test_an_incomplete_triton_entry_is_completed(triton_cache, tmp_path, fp):
    out = tmp_path / "c.tar"
    _pack(triton_cache, out, fp)
    dest = tmp_path / "dest"
    _restore(out, dest, local=fp)
    victim = sorted((dest / "triton").iterdir())[1]
    next(victim.glob("__grp__*.json")).unlink()          # as after an interrupted compile
    next(victim.glob("*.ptx")).unlink()
    plan = archive.plan_restore(out, dest=dest, local=fp)
    assert sorted(i.action for i in plan.items) == ["fill", "skip", "skip"]
    result = plan.execute()
    assert [(o.target, o.status) for o in result.outcomes] == [(victim, "completed")]
    assert compile_into(dest / "triton") == [True, True, True]


def test_pack_leaves_out_incomplete_entries_and_temp_files(triton_cache, tmp_path, fp):
    a, b, _ = sorted(p for p in triton_cache.iterdir())
    next(a.glob("__grp__*.json")).unlink()
    (b / "tmp.pid_7_abc").mkdir()
    (b / "tmp.pid_7_abc" / "k.cubin").write_bytes(b"half")
    result = _pack(triton_cache, tmp_path / "c.tar", fp)
    assert [e.name for e in result.manifest.entries] == sorted(
        p.name for p in triton_cache.iterdir() if p != a)
    assert not any("tmp.pid" in name for name, _, _ in result.manifest.members())
    assert sorted(w.message for w in result.warnings) == [
        "in-flight or abandoned temporary file; skipped",
        "incomplete: no __grp__*.json group file (compile in flight or interrupted)"]
    assert pack_warnings(result)[0].startswith("warning: triton: ")


def test_an_archive_of_another_toolchain_is_refused_unless_forced(triton_cache, tmp_path, fp):
    out = tmp_path / "old.tar"
    _pack(triton_cache, out, _other_toolchain(fp, triton="3.6.0"))
    with pytest.raises(IncompatibleError) as err:
        archive.plan_restore(out, dest=tmp_path / "d", local=fp)
    assert err.value.message == (f"archive {out} was built by another toolchain: triton 3.6.0 "
                                 "(cache) vs 3.8.0 (here)")
    assert err.value.exit_code == 4
    plan = archive.plan_restore(out, dest=tmp_path / "d", local=fp, force=True)
    assert plan.compatibility.mismatches == (("triton", "3.6.0", "3.8.0"),)
    assert "mismatch: triton 3.6.0 (archive) vs 3.8.0 (here)" in plan_text(plan, "old.tar")


def test_empty_cache_packs_an_empty_archive_and_says_so(tmp_path, fp):
    result = _pack(tmp_path / "nothing", tmp_path / "e.tar", fp)
    assert result.is_empty
    assert pack_text(result).startswith("No complete cache entries found; wrote an empty archive")
    plan = archive.plan_restore(tmp_path / "e.tar", dest=tmp_path / "d", local=fp)
    assert plan_text(plan, "e.tar") == "Nothing to restore: e.tar holds no entries."


def test_zstd_without_zstandard_fails_before_the_scan(triton_cache, tmp_path, fp, monkeypatch):
    import sys

    from cache_tools import errors

    monkeypatch.setitem(sys.modules, "zstandard", None)  # not installed, as Python sees it
    lines: list[str] = []
    progress = Progress(io.StringIO())
    progress.step = lines.append  # the first thing pack says is "scanning …"
    with pytest.raises(errors.CacheError) as err:
        _pack(triton_cache, tmp_path / "c.tar.zst", fp, zstd=True, progress=progress)
    assert str(err.value) == "the zstandard package is needed to write a zstd-compressed archive"
    assert lines == [] and list(tmp_path.glob("c.tar*")) == []


def test_progress_lines_on_a_non_tty(triton_cache, tmp_path, fp):
    stream = io.StringIO()
    _pack(triton_cache, tmp_path / "c.tar", fp, progress=Progress(stream))
    lines = stream.getvalue().splitlines()
    assert lines[0] == "scanning triton"
    assert lines[1].startswith("packing 3 entries (")
    assert lines[1].endswith(f") into {tmp_path / 'c.tar'}")
    assert lines[2].startswith("pack: ") and "/s)" in lines[2]
    assert len(lines) == 3     # one pass: each file is read, hashed and written once
    stream = io.StringIO()
    plan = archive.plan_restore(tmp_path / "c.tar", dest=tmp_path / "d", local=fp)
    result = plan.execute(progress=Progress(stream))
    assert stream.getvalue().startswith("restore: ")
    assert result_text(result).startswith("Restored 3 entries (")


def test_merge_dedupes_identical_entries(tmp_path, fp):
    import cache_kernels

    a, b = tmp_path / "a" / "triton", tmp_path / "b" / "triton"
    compile_into(a, cache_kernels.SPECS[:2])
    compile_into(b, cache_kernels.SPECS[1:])
    _pack(a, tmp_path / "a.tar", fp)
    _pack(b, tmp_path / "b.tar", fp, zstd=True)
    merged = archive.merge(tmp_path / "m.tar", [tmp_path / "a.tar", tmp_path / "b.tar"])
    assert len(merged.manifest.entries) == 3 and merged.duplicates == 1
    assert merge_text(merged).startswith(f"Merged into {tmp_path / 'm.tar'}: 3 entries")
    again = archive.merge(tmp_path / "m2.tar", [tmp_path / "a.tar", tmp_path / "b.tar"])
    assert (tmp_path / "m.tar").read_bytes() == (tmp_path / "m2.tar").read_bytes()
    assert archive.verify(tmp_path / "m.tar", local=fp).manifest == again.manifest
    _restore(tmp_path / "m.tar", tmp_path / "dest", local=fp)
    assert compile_into(tmp_path / "dest" / "triton") == [True, True, True]


def test_merge_refuses_conflicting_content_naming_the_entry(triton_cache, tmp_path, fp):
    _pack(triton_cache, tmp_path / "a.tar", fp)
    victim = sorted(triton_cache.iterdir())[0]
    ttir = next(victim.glob("*.ttir"))
    ttir.write_text(ttir.read_text() + "\n")
    _pack(triton_cache, tmp_path / "b.tar", fp)
    with archive.ArchiveReader(tmp_path / "a.tar") as ra, \
            archive.ArchiveReader(tmp_path / "b.tar") as rb:
        a_rec, b_rec = ra.read_manifest().entries[0], rb.read_manifest().entries[0]
    with pytest.raises(ArchiveError) as err:
        archive.merge(tmp_path / "m.tar", [tmp_path / "a.tar", tmp_path / "b.tar"])
    assert err.value.message == (
        f"conflicting content for entry triton:{victim.name}: {tmp_path / 'a.tar'} has sha256 "
        f"{a_rec.digest[:16]}, {tmp_path / 'b.tar'} has {b_rec.digest[:16]}")
    assert not (tmp_path / "m.tar").exists()


def test_merge_refuses_another_toolchain_unless_forced(triton_cache, tmp_path, fp):
    _pack(triton_cache, tmp_path / "a.tar", fp)
    _pack(triton_cache, tmp_path / "b.tar", _other_toolchain(fp, sglang="0.5.17"))
    with pytest.raises(IncompatibleError) as err:
        archive.merge(tmp_path / "m.tar", [tmp_path / "a.tar", tmp_path / "b.tar"])
    assert err.value.message == (f"{tmp_path / 'b.tar'} was built by another toolchain than "
                                 f"{tmp_path / 'a.tar'}: sglang 0.5.17 (cache) vs "
                                 f"{fp.software_map['sglang']} (a.tar)")
    merged = archive.merge(tmp_path / "m.tar", [tmp_path / "a.tar", tmp_path / "b.tar"],
                           force=True)
    assert merged.duplicates == 3


def test_scan_after_restore_is_clean(triton_cache, tmp_path, fp):
    _pack(triton_cache, tmp_path / "c.tar", fp)
    _restore(tmp_path / "c.tar", tmp_path / "dest", local=fp)
    info = scan_kind(triton_location(tmp_path / "dest" / "triton"))
    assert len(info.complete_entries) == 3 and not info.warnings


def test_other_kinds_round_trip_by_their_layouts(tmp_path, fp):
    """Layout fixtures (no nvcc, CuTe or driver here): an SGLang JIT build, a CuTe AOT object
    (a file entry) and the driver's cache (one whole-directory entry) pack and restore under
    another root, executable bits kept, lock files left out."""
    import os

    from cache_tools.locations import resolve

    src = tmp_path / "root"
    leaf = src / "jit" / "sm90" / "topk" / "build-k1" / "deps-d1"
    leaf.mkdir(parents=True)
    (leaf / "sgl_deps.json").write_text("[]")
    (leaf / "topk.so").write_bytes(b"\x7fELF" + bytes(200))
    os.chmod(leaf / "topk.so", 0o755)
    (leaf.parent / ".lock").write_text("")
    aot = src / "cute_aot" / "fp1"
    aot.mkdir(parents=True)
    (aot / "abc.o").write_bytes(b"object")
    (aot / "abc.lock").write_text("")
    nv = src / "nv"
    (nv / "a" / "b").mkdir(parents=True)
    (nv / "index").write_bytes(b"index")
    (nv / "a" / "b" / "blob").write_bytes(b"blob")
    out = tmp_path / "o.tar"
    packed = archive.pack(out, resolve(root=src), fingerprint=fp)
    assert [(e.kind, e.name, e.is_dir) for e in packed.manifest.entries] == [
        ("cuda_ptx", "", True), ("cute_aot", "fp1/abc.o", False),
        ("sglang_jit", "sm90/topk/build-k1/deps-d1", True)]
    dest = tmp_path / "dest"
    result = archive.plan_restore(out, dest=dest, local=fp).execute()
    assert [o.status for o in result.outcomes] == ["added"] * 3
    assert tree(dest / "nv") == tree(nv)
    assert tree(dest / "cute_aot") == {"fp1": None, "fp1/abc.o": b"object"}
    restored = dest / "jit" / "sm90" / "topk" / "build-k1" / "deps-d1"
    assert tree(restored) == tree(leaf)
    assert os.stat(restored / "topk.so").st_mode & 0o100   # owner-executable, as packed
    assert os.stat(restored / "sgl_deps.json").st_mode & 0o111 == 0
    plan = archive.plan_restore(out, dest=dest, local=fp)
    assert [i.action for i in plan.items] == ["skip"] * 3
    (dest / "cute_aot" / "fp1" / "abc.o").unlink()
    assert [o.status for o in archive.plan_restore(out, dest=dest, local=fp).execute().outcomes] \
        == ["added"]


def test_filesystem_errors_are_cache_errors_and_leave_no_partial_entry(triton_cache, tmp_path,
                                                                        fp):
    from cache_tools.errors import CacheError

    _pack(triton_cache, tmp_path / "c.tar", fp)
    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / "triton").write_text("a file where the cache directory should be")
    before = tree(dest)
    with pytest.raises(CacheError) as err:
        archive.plan_restore(tmp_path / "c.tar", dest=dest, local=fp).execute()
    assert err.value.message == f"restore failed: {dest / 'triton'}: File exists"
    assert tree(dest) == before
