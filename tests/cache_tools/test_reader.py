"""reader.py: every limit of docs/cache.md at its edge (at the limit passes, one above is
refused with its one-line error), and the reader reads archives of the old (tarfile) writer."""

from __future__ import annotations

import io
import json
import re
import tarfile
from pathlib import Path

import pytest

import hostile
from cache_helpers import triton_location
from cache_tools import archive
from cache_tools.archive import packer as pack_mod
from cache_tools.archive import writer as writer_mod
from cache_tools.errors import ArchiveError
from cache_tools.archive.groups import MAX_GROUP_BYTES
from cache_tools.archive.manifest import NAME_MAX, PATH_MAX, Manifest
from cache_tools.archive.reader import ArchiveReader, Limits


def _verify(path: Path, fp, **limits) -> str | None:
    """None when ``verify`` accepts ``path`` under ``limits``, else its error message."""
    try:
        archive.verify(path, local=fp, limits=Limits(**limits))
    except ArchiveError as exc:
        return exc.message
    return None


def _facts(path: Path) -> tuple[int, Manifest]:
    with ArchiveReader(path) as reader:
        manifest = reader.read_manifest()
    with tarfile.open(path) as tar:
        size = tar.getmember("manifest.json").size
    return size, manifest


def test_manifest_size(valid_archive, fp):
    size, _ = _facts(valid_archive)
    assert _verify(valid_archive, fp, max_manifest_bytes=size) is None
    assert _verify(valid_archive, fp, max_manifest_bytes=size - 1) == (
        f"archive member 'manifest.json': {size} bytes exceeds the limit of {size - 1} bytes")


def test_file_size_total_entries_and_files(valid_archive, fp):
    _, m = _facts(valid_archive)
    name, _, big = max(m.members(), key=lambda x: x[2].size)
    assert _verify(valid_archive, fp, max_file_bytes=big.size) is None
    assert _verify(valid_archive, fp, max_file_bytes=big.size - 1) == (
        f"archive member {name!r}: {big.size} bytes exceeds the per-file limit of "
        f"{big.size - 1} bytes")
    assert _verify(valid_archive, fp, max_total_bytes=m.size) is None
    assert _verify(valid_archive, fp, max_total_bytes=m.size - 1) == (
        f"manifest.json: the archive declares {m.size} bytes, more than the limit of "
        f"{m.size - 1} bytes")
    assert _verify(valid_archive, fp, max_entries=3) is None
    assert _verify(valid_archive, fp, max_entries=2) == \
        "manifest.json: 3 entries exceed the limit of 2"
    assert _verify(valid_archive, fp, max_files=m.nb_files) is None
    assert _verify(valid_archive, fp, max_files=m.nb_files - 1) == \
        f"manifest.json: {m.nb_files} files exceed the limit of {m.nb_files - 1}"


def test_header_size(tmp_path, fp):
    """A member name longer than 100 characters gets a PAX header; its size is the limit."""
    root = tmp_path / "root"
    long_file = root / ".cache" / "flashinfer" / "cubins" / ("n" * 200) / "kernel.cubin"
    long_file.parent.mkdir(parents=True)
    long_file.write_bytes(b"cubin")
    from cache_tools.locations import resolve

    out = tmp_path / "long.tar"
    archive.pack(out, resolve(root=root), fingerprint=fp)
    member = "flashinfer/cubins/" + "n" * 200 + "/kernel.cubin"
    records = hostile.record("path", member)
    assert _verify(out, fp, max_header_bytes=len(records)) is None
    assert re.fullmatch(
        r"the archive member after 'manifest\.json' \(byte \d+\): PAX header of "
        rf"{len(records)} bytes exceeds the limit of {len(records) - 1} bytes",
        _verify(out, fp, max_header_bytes=len(records) - 1) or "")


def test_compression_ratio(tmp_path, fp):
    """A zstd archive of zeros: refused once past the floor when over the ratio; a floor
    above the decompressed size never checks."""
    zeros = b"\0" * (4 << 20)
    path = hostile.synthetic(tmp_path / "zeros.tar", fp, [("tilelang", "z", True,
                                                          {"zeros.bin": zeros})])
    import zstandard

    zpath = tmp_path / "zeros.tar.zst"
    zpath.write_bytes(zstandard.ZstdCompressor(level=19).compress(path.read_bytes()))
    total = len(path.read_bytes())
    assert _verify(zpath, fp, max_ratio=10, ratio_floor_bytes=total) is None
    msg = _verify(zpath, fp, max_ratio=10, ratio_floor_bytes=1 << 20)
    assert re.fullmatch(r"archive member 'tilelang/z/zeros\.bin': decompression ratio exceeds "
                        r"10:1 \(\d+ bytes from \d+\); refusing a possible decompression bomb",
                        msg or ""), msg
    assert _verify(zpath, fp, max_ratio=100_000, ratio_floor_bytes=1 << 20) is None


def _entry(kind: str, name: str, is_dir: bool, files: dict[str, bytes]) -> dict:
    return hostile.entry_doc(kind, name, is_dir, files)


def _parse(fp, *entries: dict) -> str | None:
    doc = json.loads(Manifest(fp, ()).to_json())
    doc["entries"] = list(entries)
    try:
        Manifest.parse(json.dumps(doc).encode())
    except ArchiveError as exc:
        return exc.message
    return None


def test_name_lengths(fp):
    ok = "c" * NAME_MAX
    assert _parse(fp, _entry("tilelang", ok, True, {"f": b"x"})) is None
    assert _parse(fp, _entry("tilelang", ok + "c", True, {"f": b"x"})) == (
        f"manifest.json: entries[0]: name {('c' * 60)!r}...: a path component is longer than "
        f"{NAME_MAX} bytes")
    # a member name is <kind>/<name>/<path>: cubins/** nests as deep as it likes
    prefix = "flashinfer/cubins/"
    deep = "/".join(["d" * 200] * 20)
    fill = PATH_MAX - len(prefix) - len(deep) - 1
    at_limit = deep + "/" + "f" * fill
    assert len(prefix + at_limit) == PATH_MAX
    assert _parse(fp, _entry("flashinfer", "cubins/" + at_limit, False, {"": b"x"})) is None
    assert _parse(fp, _entry("flashinfer", "cubins/" + at_limit + "f", False, {"": b"x"})) == \
        f"manifest.json: entries[0].files[0]: member name longer than {PATH_MAX} bytes"


def test_group_file_size(fp):
    def grp(n: int) -> bytes:
        doc = json.dumps({"child_paths": {}}).encode()
        return doc + b" " * (n - len(doc))

    assert _parse(fp, _entry("triton", "T", True, {"__grp__k.json": grp(MAX_GROUP_BYTES),
                                                   "k.so": b"x"})) is None
    assert _parse(fp, _entry("triton", "T", True, {"__grp__k.json": grp(MAX_GROUP_BYTES + 1),
                                                   "k.so": b"x"})) == (
        f"manifest.json: entries[0].files[0]: Triton group file of {MAX_GROUP_BYTES + 1} bytes "
        f"exceeds the limit of {MAX_GROUP_BYTES} bytes")


def test_archives_of_the_old_writer_are_read(triton_cache, tmp_path, fp):
    """The writer before this one: tarfile's PAX stream writer, an indented manifest and one
    zstd frame.  Its archives still verify and restore."""
    import zstandard

    new = tmp_path / "new.tar"
    packed = archive.pack(new, [triton_location(triton_cache)], fingerprint=fp)
    members = hostile.read_members(new)
    doc = json.loads(members[0][1])
    hostile.set_manifest(members, json.dumps(doc, sort_keys=True, indent=1,
                                             ensure_ascii=False).encode() + b"\n")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w|", format=tarfile.PAX_FORMAT) as tar:
        for ti, data in members:
            ti.mtime, ti.uid, ti.gid, ti.uname, ti.gname = 0, 0, 0, "", ""
            tar.addfile(ti, io.BytesIO(data))
    old = tmp_path / "old.tar.zst"
    w = zstandard.ZstdCompressor(level=3, write_checksum=True, threads=0)
    old.write_bytes(w.compress(buf.getvalue()))
    assert archive.verify(old, local=fp).manifest == packed.manifest
    result = archive.plan_restore(old, dest=tmp_path / "dest", local=fp).execute()
    assert [o.status for o in result.outcomes] == ["added"] * 3
    # and the new writer's payload (everything after the manifest) is the old one's, byte
    # for byte: only the manifest's spelling changed
    assert _payload(new.read_bytes()) == _payload(buf.getvalue())


def _payload(raw: bytes) -> bytes:
    """The payload members (the end-of-archive padding depends on the manifest's length)."""
    with tarfile.open(fileobj=io.BytesIO(raw)) as tar:
        infos = tar.getmembers()
    last = infos[-1]
    return raw[infos[1].offset:last.offset_data + last.size + (-last.size % 512)]


def test_every_write_is_deterministic_and_zstd_does_not_depend_on_threads(triton_cache,
                                                                          tmp_path, fp):
    loc = [triton_location(triton_cache)]
    a, b, c = tmp_path / "a.tar.zst", tmp_path / "b.tar.zst", tmp_path / "c.tar.zst"
    archive.pack(a, loc, zstd=True, fingerprint=fp, jobs=1)
    archive.pack(b, loc, zstd=True, fingerprint=fp, jobs=4)
    archive.pack(c, loc, zstd=True, fingerprint=fp)
    assert a.read_bytes() == b.read_bytes() == c.read_bytes()


def _forced_workers(monkeypatch) -> None:
    """Forked scan and pack workers for a cache of any size (pytest-xdist's I/O thread is never
    touched by the children)."""
    from cache_tools import forks

    monkeypatch.setattr(forks, "MIN_FILES", 1)
    monkeypatch.setattr(forks, "MIN_BYTES", 1)
    monkeypatch.setattr(forks, "MIN_ENTRIES", 1)
    monkeypatch.setattr(forks, "single_threaded", lambda: True)


def test_forked_scan_and_pack_write_the_archive_one_process_writes(triton_cache, tmp_path, fp,
                                                                   monkeypatch):
    from cache_tools import forks
    from cache_tools.scan import scan

    loc = [triton_location(triton_cache)]
    (triton_cache / "not-a-hash").mkdir()                   # a warning, in walk order
    one = tmp_path / "one.tar"
    archive.pack(one, loc, fingerprint=fp, jobs=1)
    alone = scan(loc)
    _forced_workers(monkeypatch)
    forked = []
    real = forks.run
    monkeypatch.setattr(forks, "run", lambda tasks, advance: forked.append(len(tasks)) or
                        real(tasks, advance))
    assert scan(loc, 3) == alone and forked == [3]
    assert [e.groups for e in scan(loc, 3).entries] == [e.groups for e in alone.entries]
    for jobs in (2, 3):
        forked.clear()
        out = tmp_path / f"{jobs}.tar"
        result = archive.pack(out, loc, fingerprint=fp, jobs=jobs)
        assert forked[0] == jobs and len(forked) == 2 and forked[1] > 1  # scan, then payload
        assert out.read_bytes() == one.read_bytes()
        assert [w.message for w in result.warnings] == [w.message for w in alone.warnings]
    archive.verify(tmp_path / "3.tar", local=fp)


def _frames(path: Path) -> int:
    """How many zstd frames a file holds."""
    import zstandard

    data, n = path.read_bytes(), 0
    while data:
        d = zstandard.ZstdDecompressor().decompressobj()
        d.decompress(data)
        data = d.unused_data
        n += 1
    return n


def test_a_zstd_payload_in_frames_is_the_same_from_workers_and_from_one_process(
        triton_cache, tmp_path, fp, monkeypatch):
    """Frames cut by the entries' sizes alone: the archive is byte for byte the same whether
    forked workers compress runs of frames (one zstd thread each) or one process does (any
    number of threads), and it verifies and restores."""
    loc = [triton_location(triton_cache)]
    monkeypatch.setattr(writer_mod, "FRAME_BYTES", 4096)         # several frames here
    one = tmp_path / "one.tar.zst"
    archive.pack(one, loc, zstd=True, fingerprint=fp, jobs=1)
    cuts = writer_mod.frame_cuts([e.size for e in archive.verify(one, local=fp).manifest.entries])
    assert len(cuts) > 2
    # the manifest's frame, the payload's, the end-of-archive block's, and the empty frame the
    # archive writer's compressor ends with
    assert _frames(one) == 1 + len(cuts) + 2
    _forced_workers(monkeypatch)
    for jobs in (2, 3, 8):
        out = tmp_path / f"{jobs}.tar.zst"
        archive.pack(out, loc, zstd=True, fingerprint=fp, jobs=jobs)
        assert out.read_bytes() == one.read_bytes()
    archive.verify(tmp_path / "3.tar.zst", local=fp)
    result = archive.plan_restore(tmp_path / "3.tar.zst", dest=tmp_path / "dest",
                                  local=fp).execute()
    assert result.count("added") == len(archive.verify(one, local=fp).manifest.entries)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".sgw-")]   # no temporaries


def test_frame_cuts_follow_the_sizes_alone():
    from cache_tools.archive.writer import FRAME_BYTES, frame_cuts

    assert frame_cuts([]) == []
    assert frame_cuts([1, 2, 3]) == [(0, 3)]
    assert frame_cuts([FRAME_BYTES, 1, FRAME_BYTES - 1, 5]) == [(0, 1), (1, 3), (3, 4)]
    assert frame_cuts([3 * FRAME_BYTES, 1]) == [(0, 1), (1, 2)]


@pytest.mark.parametrize("zstd", [False, True])
def test_an_entry_that_vanishes_under_a_forked_pack_is_skipped_as_in_one_process(
        triton_cache, tmp_path, fp, monkeypatch, zstd):
    import shutil

    loc = [triton_location(triton_cache)]
    victim = sorted(p for p in triton_cache.iterdir())[1]
    real = pack_mod._plan_entry

    def plan_then_prune(entry):
        files = real(entry)
        if entry.path == victim:                            # pruned after the scan saw it
            shutil.rmtree(victim)
        return files

    monkeypatch.setattr(pack_mod, "_plan_entry", plan_then_prune)
    monkeypatch.setattr(writer_mod, "FRAME_BYTES", 4096)         # zstd: frames in workers
    _forced_workers(monkeypatch)
    out = tmp_path / ("w.tar.zst" if zstd else "w.tar")
    result = archive.pack(out, loc, fingerprint=fp, jobs=3, zstd=zstd)
    assert [w.message for w in result.warnings] == [
        "vanished while packing (pruned or replaced); skipped"]
    kept = [e.name for e in archive.verify(out, local=fp).manifest.entries]
    assert kept == sorted(p.name for p in triton_cache.iterdir())


def test_a_forked_pack_that_falls_back_counts_its_bytes_once(triton_cache, tmp_path, fp,
                                                             monkeypatch):
    """A worker that fails after the others reported progress: the one-process pack that
    follows counts from zero, so the summary says the payload's size, not more."""
    import io

    from cache_tools import forks
    from cache_tools.progress import Progress
    from cache_tools.scan import size_str

    loc = [triton_location(triton_cache)]
    _forced_workers(monkeypatch)
    real = forks.run
    calls = []

    def payload_fails(tasks, advance):
        calls.append(len(tasks))
        results = real(tasks, advance)              # the workers report all their progress
        return None if len(calls) == 2 else results  # the scan's run, then the payload's

    monkeypatch.setattr(forks, "run", payload_fails)
    stream = io.StringIO()
    result = archive.pack(tmp_path / "f.tar", loc, fingerprint=fp, jobs=2,
                          progress=Progress(stream, interval=0.0))
    payload = result.manifest.size
    summary = [line for line in stream.getvalue().splitlines() if line.startswith("pack: ")]
    assert calls == [2, 2]
    assert summary and summary[-1].startswith(f"pack: {size_str(payload)} in "), summary
