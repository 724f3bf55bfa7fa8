"""Read workers (cache_tools.archive.read_workers): forked processes check and stage what one process
checks and stages, or hand the archive back to the sequential reader; never anything else.  The
hostile corpus runs through them too (hostile.rejects restores and verifies with one job and
with two)."""

from __future__ import annotations

import hashlib
import io
import os
import re
import shutil
import tarfile
import threading
from pathlib import Path

import pytest

import hostile
from cache_helpers import tree
from cache_tools import archive, forks
from cache_tools.archive import read_workers
from cache_tools.locations import resolve
from cache_tools.archive.reader import WHOLE, ArchiveReader, Limits


def _returns(monkeypatch, name: str) -> list[bool]:
    """What each call of ``read_workers.<name>`` returns, as it returns it."""
    seen: list[bool] = []
    real = getattr(read_workers, name)

    def spy(*args, **kwargs):
        seen.append(real(*args, **kwargs))
        return seen[-1]

    monkeypatch.setattr(read_workers, name, spy)
    return seen


@pytest.fixture
def stages(monkeypatch) -> list[bool]:
    """What each call of read_workers.stage returned (True: the workers staged it all)."""
    return _returns(monkeypatch, "stage")


def _restore(path: Path, dest: Path, fp, jobs: int):
    shutil.rmtree(dest, ignore_errors=True)
    result = archive.plan_restore(path, dest=dest, local=fp).execute(jobs=jobs)
    return [(o.entry.key, o.status) for o in result.outcomes], tree(dest)


def test_workers_restore_what_one_process_restores(valid_archive, fp, tmp_path, stages):
    dest = tmp_path / "dest"               # one place: restored group files name it
    one = _restore(valid_archive, dest, fp, jobs=1)
    with hostile.forked_workers():
        for jobs in (2, 3, 8):             # 3 entries: 2 and 3 workers, and more than entries
            assert _restore(valid_archive, dest, fp, jobs=jobs) == one
    assert stages == [True, True, True]
    assert len(one[0]) == 3 and {s for _, s in one[0]} == {"added"}


def test_a_tar_another_writer_laid_out_is_read_sequentially(valid_archive, fp, tmp_path, stages):
    # The same members, rewritten by Python's tarfile with other header bytes (owner names, a
    # time): the sequential reader accepts them through its careful parse; the workers find a
    # header that is not theirs and hand the archive back.
    other = tmp_path / "other.tar"
    with tarfile.open(valid_archive) as src, tarfile.open(other, "w", format=tarfile.PAX_FORMAT) as out:
        for member in src.getmembers():
            data = src.extractfile(member).read()
            member.mtime, member.uname = 1_700_000_000, "someone"
            out.addfile(member, io.BytesIO(data))
    dest = tmp_path / "dest"
    one = _restore(other, dest, fp, jobs=1)
    with hostile.forked_workers():
        assert _restore(other, dest, fp, jobs=2) == one
    assert stages == [False]


@pytest.fixture
def checks(monkeypatch) -> list[bool]:
    """What each call of read_workers.check returned (True: the workers checked it all)."""
    return _returns(monkeypatch, "check")


def test_workers_verify_what_one_process_verifies(valid_archive, fp, tmp_path, checks):
    one = archive.verify(valid_archive, local=fp, jobs=1)
    with hostile.forked_workers():
        for jobs in (2, 3, 8):
            got = archive.verify(valid_archive, local=fp, jobs=jobs)
            assert (got.manifest, got.archive_bytes, got.compressed) == \
                (one.manifest, one.archive_bytes, one.compressed)
    assert checks == [True, True, True]


def test_a_verify_the_workers_give_up_on_is_read_in_one_process(valid_archive, fp, tmp_path,
                                                                 checks):
    other = tmp_path / "other.tar"          # another writer's headers: the careful parse
    with tarfile.open(valid_archive) as src, tarfile.open(other, "w", format=tarfile.PAX_FORMAT) as out:
        for member in src.getmembers():
            data = src.extractfile(member).read()
            member.uname = "someone"
            out.addfile(member, io.BytesIO(data))
    with hostile.forked_workers():
        assert archive.verify(other, local=fp, jobs=2).manifest.nb_files == \
            archive.verify(valid_archive, local=fp, jobs=1).manifest.nb_files
    assert checks == [False]


def _large_archive(tmp_path: Path, fp) -> Path:
    """Three FlashInfer-like entries, two of them above the reader's whole-member size."""
    src = tmp_path / "root"
    ops = src / ".cache" / "flashinfer" / "0.2.14" / "90" / "cached_ops"
    for i, size in enumerate((WHOLE + (3 << 20), 1000, WHOLE + 17)):
        op = ops / f"op{i}"
        op.mkdir(parents=True)
        (op / f"op{i}.so").write_bytes(hashlib.sha256(b"%d" % i).digest() * (size // 32 + 1))
        (op / "build.ninja").write_text("rule link\n")
    out = tmp_path / "fi.tar"
    archive.pack(out, resolve(root=src), fingerprint=fp)
    return out


def test_large_members_stream_through_the_workers(tmp_path, fp, stages):
    out = _large_archive(tmp_path, fp)
    dest = tmp_path / "dest"
    one = _restore(out, dest, fp, jobs=1)
    with hostile.forked_workers():
        assert _restore(out, dest, fp, jobs=2) == one
    assert stages == [True]
    # damaged inside a large member of the second half: refused as one process refuses it
    data = bytearray(out.read_bytes())
    data[-(WHOLE // 2)] ^= 0xFF
    out.write_bytes(data)
    hostile.rejects(out, dest, fp, re.compile(r"archive member '.*/op2/op2\.so': sha256 "
                                              r"mismatch \(manifest \w+, content \w+\)"))


def test_the_layout_gives_every_entrys_first_header_and_the_end_the_writer_wrote(valid_archive):
    with ArchiveReader(valid_archive) as reader:
        manifest = reader.read_manifest()
        offsets, end = read_workers.layout(manifest, reader.payload_start())
    with tarfile.open(valid_archive) as tar:
        members = tar.getmembers()
    first_of = {m.name: m.offset for m in members}
    assert offsets == [first_of[e.member(e.files[0])] for e in manifest.entries]
    last = members[-1]
    assert end == last.offset_data + last.size + (-last.size % 512)


def test_workers_are_used_only_where_safe(valid_archive, tmp_path):
    with ArchiveReader(valid_archive) as reader:
        manifest = reader.read_manifest()
        assert manifest.nb_files < forks.MIN_FILES and manifest.size < forks.MIN_BYTES
        assert not read_workers.usable(reader, manifest, 8)          # too small
        with hostile.forked_workers():
            assert read_workers.usable(reader, manifest, 2)
            assert not read_workers.usable(reader, manifest, 1)      # one job
    import zstandard

    zst = tmp_path / "valid.tar.zst"
    zst.write_bytes(zstandard.ZstdCompressor().compress(valid_archive.read_bytes()))
    with ArchiveReader(zst) as reader, hostile.forked_workers():
        assert not read_workers.usable(reader, reader.read_manifest(), 2)  # no offsets
    stop = threading.Event()
    other = threading.Thread(target=stop.wait)
    other.start()
    try:
        assert not forks.single_threaded()
    finally:
        stop.set()
        other.join()
    assert 1 <= forks.default_jobs() <= min(os.cpu_count() or 1, forks.MAX_JOBS)


def test_the_cli_passes_jobs_through(valid_archive, tmp_path, stages):
    from typer.testing import CliRunner

    from warmup.cli.cache import app

    runner = CliRunner()
    dest = tmp_path / "dest"
    with hostile.forked_workers():
        done = runner.invoke(app, ["restore", str(valid_archive), "--dest", str(dest), "-j", "2"])
        assert done.exit_code == 0, done.output
        shutil.rmtree(dest)
        one = runner.invoke(app, ["restore", str(valid_archive), "--dest", str(dest),
                                  "--jobs", "1"])
        assert one.exit_code == 0, one.output
    assert stages == [True]          # --jobs 1 never forks
    bad = runner.invoke(app, ["restore", str(valid_archive), "--dest", str(dest), "--jobs", "0"])
    assert bad.exit_code == 2


def test_a_fork_that_fails_leaves_the_restore_to_one_process(valid_archive, fp, tmp_path, stages,
                                                             monkeypatch):
    dest = tmp_path / "dest"
    one = _restore(valid_archive, dest, fp, jobs=1)
    forks = []
    real_fork = os.fork

    def fork_once():
        if forks:
            raise BlockingIOError(11, "Resource temporarily unavailable")
        forks.append(real_fork())
        return forks[-1]

    monkeypatch.setattr(os, "fork", fork_once)
    with hostile.forked_workers():
        assert _restore(valid_archive, dest, fp, jobs=2) == one
    assert stages == [False] and len(forks) == 1     # the first worker was stopped and reaped


def _payload_end(path: Path) -> int:
    with tarfile.open(path) as tar:
        last = tar.getmembers()[-1]
    return last.offset_data + last.size + (-last.size % 512)


def test_a_bad_tail_is_refused_also_when_every_entry_is_already_in_place(valid_archive, fp,
                                                                         tmp_path, stages):
    from cache_tools.archive import tarfmt

    raw = valid_archive.read_bytes()
    end = _payload_end(valid_archive)
    bad = tmp_path / "bad.tar"
    bad.write_bytes(raw[:end] + tarfmt.header("junk", 0, 0o644) + tarfmt.end(end + 512))
    dest = tmp_path / "dest"
    archive.plan_restore(valid_archive, dest=dest, local=fp).execute(jobs=1)  # all in place
    hostile.rejects(bad, dest, fp, "archive member 'junk' is not listed in the manifest",
                    workers_here=True)
    assert stages == [False]        # the workers saw the bad tail and handed the archive back


def test_the_size_budget_counts_what_the_workers_read(fp, tmp_path):
    from cache_tools.archive.reader import Limits

    big = _large_archive(tmp_path, fp)                # about 11 MiB of payload
    padded = tmp_path / "padded.tar"
    padded.write_bytes(big.read_bytes() + bytes(6 << 20))   # zeros after the end, past the budget
    hostile.rejects(padded, tmp_path / "dest", fp,
                    re.compile(r"archive member .*: decompressed data exceeds what the manifest "
                               r"declares \(\d+ bytes\); refusing a possible decompression bomb"),
                    Limits(max_manifest_bytes=1 << 20))


def test_workers_whose_exit_status_cannot_be_read_leave_it_to_one_process(valid_archive, fp,
                                                                          tmp_path, stages):
    import signal

    dest = tmp_path / "dest"
    one = _restore(valid_archive, dest, fp, jobs=1)
    old = signal.signal(signal.SIGCHLD, signal.SIG_IGN)   # children reaped by the kernel
    try:
        with hostile.forked_workers():
            assert _restore(valid_archive, dest, fp, jobs=2) == one
    finally:
        signal.signal(signal.SIGCHLD, old)
    assert stages == [False]


# --- zstd archives in pack's frames ------------------------------------------------------------


@pytest.fixture
def framed(triton_cache, tmp_path, fp, monkeypatch) -> Path:
    """A zstd archive of the three entries in one frame each (FRAME_BYTES made small, here
    and for the readers), with forced workers."""
    from cache_helpers import triton_location
    from cache_tools.archive import writer

    monkeypatch.setattr(writer, "FRAME_BYTES", 1)             # a frame per entry
    out = tmp_path / "framed.tar.zst"
    archive.pack(out, [triton_location(triton_cache)], zstd=True, fingerprint=fp, jobs=1)
    return out


def _frames(path: Path) -> list[bytes]:
    """The decompressed content of each zstd frame of ``path``."""
    import zstandard

    data, out = path.read_bytes(), []
    while data:
        d = zstandard.ZstdDecompressor().decompressobj()
        out.append(d.decompress(data))
        data = d.unused_data
    return out


def _reframe(frames: list[bytes], out: Path) -> Path:
    import zstandard

    out.write_bytes(b"".join(zstandard.ZstdCompressor().compress(f) for f in frames))
    return out


def test_workers_read_a_framed_zstd_archive_as_one_process_does(framed, fp, tmp_path, stages,
                                                                 checks):
    assert len(_frames(framed)) == 1 + 3 + 2      # manifest, an entry each, the end (and empty)
    one = _restore(framed, tmp_path / "dest", fp, jobs=1)
    alone = archive.verify(framed, local=fp, jobs=1)
    with hostile.forked_workers():
        assert _restore(framed, tmp_path / "dest", fp, jobs=2) == one
        assert archive.verify(framed, local=fp, jobs=3).manifest == alone.manifest
    assert stages == [True] and checks == [True]


def test_a_zstd_archive_in_other_frames_is_read_in_one_process(valid_archive, fp, tmp_path,
                                                              stages, checks):
    import zstandard

    one = tmp_path / "one-frame.tar.zst"                     # an older pack's, a merge's
    one.write_bytes(zstandard.ZstdCompressor().compress(valid_archive.read_bytes()))
    with hostile.forked_workers():
        archive.verify(one, local=fp, jobs=2)
        _restore(one, tmp_path / "dest", fp, jobs=2)
    assert checks == [] and stages == []                     # never tried: not pack's frames


@pytest.mark.parametrize("where", ["manifest", "entry", "tail"])
def test_data_a_frame_holds_beyond_its_part_is_refused_by_workers_as_by_one_process(
        framed, fp, tmp_path, where, stages):
    """A frame that holds more than its part of the tar stream (the manifest's, an entry's,
    the end's): one process refuses it, and the workers leave it to one process."""
    frames = _frames(framed)
    at = {"manifest": 0, "entry": 1, "tail": 4}[where]
    frames[at] += b"\x01" * 512
    hostile.rejects(_reframe(frames, tmp_path / f"{where}.tar.zst"), tmp_path / "dest", fp,
                    re.compile(r".+"), workers_here=True)
    assert True not in stages


def test_a_damaged_frame_is_refused_by_workers_as_by_one_process(framed, fp, tmp_path, stages):
    from cache_tools.archive.reader import ArchiveReader

    with ArchiveReader(framed) as reader:
        second = reader.zstd_frames[2]               # the second entry's frame
    raw = bytearray(framed.read_bytes())
    raw[second + 40] ^= 0xFF
    bad = tmp_path / "damaged.tar.zst"
    bad.write_bytes(bytes(raw))
    hostile.rejects(bad, tmp_path / "dest", fp, re.compile(r"archive is truncated or damaged.*"),
                    workers_here=True)
    assert True not in stages


def test_a_skippable_frame_is_refused_before_any_worker(framed, fp, tmp_path):
    """A skippable frame (which a walk that skipped it 4 bytes short used to misplace) is
    refused when the archive is opened, by every path alike: pack writes none."""
    from cache_tools.archive.reader import ArchiveReader

    with ArchiveReader(framed) as reader:
        second = reader.zstd_frames[2]
    raw = framed.read_bytes()
    bad = tmp_path / "skippable.tar.zst"
    bad.write_bytes(raw[:second] + (0x184D2A50).to_bytes(4, "little") + (4).to_bytes(4, "little")
                    + b"\x28\xb5\x2f\xfd" + raw[second:])
    hostile.rejects(bad, tmp_path / "dest", fp, re.compile(
        rf"archive is truncated or damaged: skippable zstd frame at byte {second} \(an archive "
        r"of ours has none\)"))


def test_the_decompression_ratio_counts_from_the_archives_start_in_workers(tmp_path, fp,
                                                                         monkeypatch, stages):
    """Frames of zeros, each under the ratio's floor, together far above it: one process
    refuses the archive, and workers, which weigh what was decompressed before their frame
    too, do not accept it."""
    from cache_tools.archive import writer

    monkeypatch.setattr(writer, "FRAME_BYTES", 1)
    src = tmp_path / "root"
    ops = src / ".cache" / "flashinfer" / "0.2.14" / "90" / "cached_ops"
    for i in range(5):
        (ops / f"op{i}").mkdir(parents=True)
        (ops / f"op{i}" / f"op{i}.so").write_bytes(bytes(1 << 20))
    out = tmp_path / "zeros.tar.zst"
    archive.pack(out, resolve(root=src), zstd=True, fingerprint=fp, jobs=1)
    hostile.rejects(out, tmp_path / "dest", fp,
                    re.compile(r"archive member '.+': decompression ratio exceeds 50:1 .*"),
                    Limits(max_ratio=50, ratio_floor_bytes=2 << 20), workers_here=True)
    assert True not in stages
