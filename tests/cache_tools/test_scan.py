"""scan.py: inventory of real Triton caches; incomplete and in-flight entries are warnings."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from cache_helpers import triton_location
from cache_tools.locations import Location, kind, resolve
from cache_tools.render import ls_json, ls_text
from cache_tools.scan import scan, scan_kind, size_str


def _hash_dirs(cache: Path) -> list[Path]:
    return sorted(p for p in cache.iterdir() if p.is_dir())


def test_complete_triton_entries_with_sizes_and_last_use(triton_cache):
    info = scan_kind(triton_location(triton_cache))
    assert info.exists and not info.warnings
    assert [e.name for e in info.entries] == [p.name for p in _hash_dirs(triton_cache)]
    assert len(info.complete_entries) == 3
    for e in info.entries:
        on_disk = sorted(p.name for p in e.path.iterdir())
        assert list(e.files) == on_disk
        assert any(f.startswith("__grp__") for f in e.files)
        assert any(f.endswith(".cubin") for f in e.files)
        assert e.size_on_disk == sum((e.path / f).stat().st_size for f in e.files)
        assert e.last_used >= max((e.path / f).stat().st_mtime for f in e.files)
    assert info.size_on_disk == sum(e.size_on_disk for e in info.entries)


def test_interrupted_compiles_are_warnings_not_crashes(triton_cache):
    a, b, c = _hash_dirs(triton_cache)
    # Triton writes the group file last: without it the compile was interrupted.
    next(a.glob("__grp__*.json")).unlink()
    # A group whose child is gone.
    gone = next(b.glob("*.cubin"))
    gone.unlink()
    # An in-flight write (Triton's put(): tmp.pid_<pid>_<uuid>/<file>, then os.replace).
    (c / "tmp.pid_4242_0000").mkdir()
    (c / "tmp.pid_4242_0000" / "x.cubin").write_bytes(b"partial")
    # An empty hash directory: FileCacheManager.__init__ has run, nothing written yet.
    (triton_cache / "EMPTY").mkdir()
    info = scan_kind(triton_location(triton_cache))
    problems = {e.name: e.problem for e in info.entries if not e.complete}
    assert problems == {
        a.name: "no __grp__*.json group file (compile in flight or interrupted)",
        b.name: f"group file {next(b.glob('__grp__*.json')).name} references missing file "
                f"{gone.name}",
        "EMPTY": "empty directory (being written or interrupted)",
    }
    messages = sorted(str(w) for w in info.warnings)
    assert f"triton: {c / 'tmp.pid_4242_0000'}: in-flight or abandoned temporary file; " \
           "skipped" in messages
    assert f"triton: {a}: incomplete: no __grp__*.json group file (compile in flight or " \
           "interrupted)" in messages
    assert [e.complete for e in info.entries if e.name == c.name] == [True]


def test_lone_triton_artifacts_are_complete_entries(triton_cache):
    # Triton stores compiled launchers (runtime/build.py) as a lone .so without a group.
    lone = triton_cache / "LAUNCHER"
    lone.mkdir()
    shutil.copyfile(next(triton_cache.glob("*/*.cubin")), lone / "cuda_utils.so")
    entry = [e for e in scan_kind(triton_location(triton_cache)).entries if e.name == "LAUNCHER"]
    assert entry[0].complete


def test_copied_cache_is_flagged_because_triton_would_miss_it(triton_cache, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(triton_cache, copy)
    info = scan_kind(triton_location(copy))
    assert len(info.complete_entries) == 3
    assert len(info.warnings) == 3
    assert all(w.message.startswith("Triton group file records another directory")
               for w in info.warnings)


def test_foreign_names_links_and_staging_leftovers(triton_cache):
    (triton_cache / "README").write_text("x")
    (triton_cache / "LINK").symlink_to("/etc")
    staging = triton_cache / ".sgw-staging-host-1-abc"
    staging.mkdir()
    info = scan_kind(triton_location(triton_cache))
    assert len(info.complete_entries) == 3
    messages = sorted(w.message for w in info.warnings)
    assert messages == [
        "not part of the known triton layout; left alone",
        "restore staging directory (a restore is running or was interrupted; the next restore "
        "removes it)",
        "symbolic link; never packed",
    ]


def test_nothing_cached_is_a_sentence(tmp_path):
    info = scan(resolve(root=tmp_path / "none"))
    assert info.is_empty
    text = ls_text(info)
    assert text.splitlines()[-1] == "No JIT cache entries found in the 11 locations checked."


def test_ls_text_and_json(triton_cache):
    info = scan([triton_location(triton_cache)])
    text = ls_text(info)
    row = text.splitlines()[2].split()
    total = info.size_on_disk
    assert row[:6] == ["triton", str(triton_cache), "3", *size_str(total).split(), str(total)]
    assert text.splitlines()[4] == f"3 complete entries, {size_str(total)} ({total} bytes) in " \
                                   "total."
    data = json.loads(json.dumps(ls_json(info)))
    assert data["kinds"][0]["entries"] == 3 and data["kinds"][0]["size_on_disk"] == total
    assert len(data["kinds"][0]["items"]) == 3


def test_sglang_jit_layout(tmp_path):
    """Layout only (no nvcc here): directories shaped like SGLang's published builds."""
    root = tmp_path / "jit"
    leaf = root / "sm90" / "topk" / "build-k1" / "deps-d1"
    leaf.mkdir(parents=True)
    (leaf / "sgl_deps.json").write_text("[]")
    (leaf / "topk.so").write_bytes(b"\x7fELF")
    (root / "sm90" / "topk" / "build-k1" / ".lock").write_text("")
    (root / "sm90" / "topk" / "build-k1" / ".staging-0a0b").mkdir()
    info = scan_kind(Location(kind("sglang_jit"), root, "test"))
    assert [(e.name, e.complete) for e in info.entries] == [("sm90/topk/build-k1/deps-d1", True)]
    assert [w.message for w in info.warnings] == [
        "in-flight or abandoned temporary file; skipped"]
