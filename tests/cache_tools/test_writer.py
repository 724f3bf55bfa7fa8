"""writer.ZstdFrames: the same frames inline and on a thread, the thread's errors raised in the
caller with the thread stopped, and the caller never far ahead of the compressor."""

from __future__ import annotations

import errno
import os
import threading
import time

import pytest
import zstandard

from cache_tools.archive.reader import CHUNK
from cache_tools.archive.writer import ZstdFrames

# Pieces of every size the pack writes: headers, small files, paddings, large-file chunks.
PIECES = [os.urandom(512), b"x" * 3000, b"", bytes(12), b"y" * (CHUNK + 17), b"z" * 100]


def _write(path, background: bool) -> bytes:
    frames = ZstdFrames(path, 3, background)
    for i, piece in enumerate(PIECES * 3):
        frames.write(piece)
        if i == 7:
            frames.cut()
    frames.close()
    return path.read_bytes()


def test_frames_are_the_same_inline_and_on_a_thread(tmp_path):
    inline = _write(tmp_path / "a", False)
    assert _write(tmp_path / "b", True) == inline
    d = zstandard.ZstdDecompressor().decompressobj()
    first = d.decompress(inline)
    assert d.unused_data                                     # a second frame after the cut
    assert first + zstandard.ZstdDecompressor().decompressobj().decompress(d.unused_data) == \
        b"".join(PIECES * 3)


class _FullDisk:
    def write(self, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    def flush(self, mode):
        pass

    def close(self):
        pass


def test_an_error_of_the_thread_is_raised_and_the_thread_stopped(tmp_path):
    """The thread fails on the first MiB; the caller holds the next bytes, then closes: the
    error is raised there, and the thread is gone (a thread left behind would keep forked
    workers off for the rest of the process)."""
    before = threading.active_count()
    frames = ZstdFrames(tmp_path / "f", 3, True)
    frames._sink = _FullDisk()
    frames.write(b"a" * CHUNK)                     # to the thread, which fails on it
    frames.write(b"b" * 1000)                      # held
    for _ in range(500):                           # the failure is known before the close
        if frames._failed:
            break
        time.sleep(0.01)
    with pytest.raises(OSError) as err:
        frames.close()
    assert err.value.errno == errno.ENOSPC
    assert not frames._thread.is_alive()
    assert threading.active_count() == before


def test_the_thread_gets_a_mib_at_a_time(tmp_path, monkeypatch):
    frames = ZstdFrames(tmp_path / "f", 3, True)
    sizes = []
    real = frames._feed
    monkeypatch.setattr(frames, "_feed", lambda piece: (sizes.append(len(piece)) if
                                                        isinstance(piece, memoryview) else None,
                                                        real(piece))[1])
    frames.write(b"q" * (5 * CHUNK + 3))
    frames.close()
    assert max(sizes) == CHUNK and sum(sizes) == 5 * CHUNK + 3


@pytest.mark.parametrize("most", [1, 7, 512, 1 << 30])
def test_placed_parts_land_in_a_row_whatever_pwritev_takes_at_once(tmp_path, monkeypatch, most):
    """A pack worker's members go to the kernel as parts (headers, data, paddings) of one
    pwritev, not joined first: the bytes land in order at the run's offset even when a call
    writes only part of them (at most ``most`` bytes here), and past IOV_MAX parts."""
    from cache_tools.archive import writer

    real = os.pwritev

    def short(fd, buffers, offset):
        take, out = most, []
        for b in buffers:
            out.append(memoryview(b)[:take])
            take -= len(out[-1])
            if not take:
                break
        return real(fd, out, offset)

    monkeypatch.setattr(writer.os, "pwritev", short)
    fd = os.open(tmp_path / "run.bin", os.O_RDWR | os.O_CREAT)
    try:
        sink = writer.PlacedWriter(fd, 10)
        expected = b""
        for i in range(3000 if most >= 512 else 300):
            parts = [PIECES[i % len(PIECES)][:200 + i % 900], b"", bytes(i % 511)]
            sink.write_parts(parts)
            expected += b"".join(parts)
        sink.write(b"tail")
        sink.flush()
        assert os.pread(fd, len(expected) + 100, 0) == bytes(10) + expected + b"tail"
        assert sink.offset == 10 + len(expected) + 4
    finally:
        os.close(fd)
