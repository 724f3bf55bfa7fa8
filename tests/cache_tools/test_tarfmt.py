"""tarfmt.py: the writer's headers are byte for byte what tarfile's PAX writer produced (so
archives did not change), and the reader parses what tarfile writes."""

from __future__ import annotations

import io
import random
import string
import tarfile

import pytest

from cache_tools.archive import tarfmt


def _tarfile_header(name: str, size: int, mode: int) -> bytes:
    ti = tarfile.TarInfo(name)
    ti.size, ti.mode, ti.mtime, ti.uid, ti.gid = size, mode, 0, 0, 0
    ti.uname = ti.gname = ""
    return ti.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape")


def _names() -> list[str]:
    rng = random.Random(7)
    alphabet = string.ascii_letters + string.digits + "/._-~é日"
    names = ["manifest.json", "a", "x" * 99, "x" * 100, "x" * 101, "é", "日本/語.so",
             "triton/" + "A" * 52 + "/__grp__matmul_kernel.json", "d/" * 200 + "f"]
    names += ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 300)))
              for _ in range(200)]
    return names


@pytest.mark.parametrize("size", [0, 1, 511, 512, 513, 8 ** 11 - 1, 8 ** 11, 10 ** 13])
def test_headers_are_what_tarfile_writes(size):
    for name in _names():
        for mode in (0o644, 0o755):
            assert tarfmt.header(name, size, mode) == _tarfile_header(name, size, mode), name


@pytest.mark.parametrize("size", [0, 1, 511, 512, 513, 8 ** 11 - 1, 8 ** 11])
def test_entry_span_is_the_bytes_of_its_members(size):
    """The layout pack and the read workers compute offsets from: each member's header,
    data and padding, whatever the name's length or characters (both sides of 100)."""
    for name in _names():
        prefix, _, path = name.rpartition("/")
        if not prefix:
            prefix, path = path, ""
        files = [(path, size, 0o644), (path + "x", size + 3, 0o755)] if path else \
            [(path, size, 0o644)]
        members = [(f"{prefix}/{p}" if p else prefix, s, m) for p, s, m in files]
        expected = sum(len(_tarfile_header(n, s, m)) + s + (-s % 512) for n, s, m in members)
        assert tarfmt.entry_span(prefix, files) == expected, name


def test_layout_places_each_entry_after_the_members_before_it():
    entries = [("triton/a", [("x.json", 10, 0o644), ("x.cubin", 700, 0o644)]),
               ("flashinfer", [("", 3, 0o755)]),
               ("triton/" + "b" * 120, [("y", 0, 0o644)])]        # a PAX-header name
    offsets, end = tarfmt.layout(1536, entries)
    spans = [tarfmt.entry_span(prefix, files) for prefix, files in entries]
    assert offsets == [1536, 1536 + spans[0], 1536 + spans[0] + spans[1]]
    assert end == 1536 + sum(spans) and spans[2] > 1024             # PAX header, ustar, no data
    assert tarfmt.layout(512, []) == ([], 512)


def test_end_blocks_are_what_tarfile_writes():
    for n in (0, 1, 3, 19, 20, 21):
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w|", format=tarfile.PAX_FORMAT) as tar:
            for i in range(n):
                ti = tarfile.TarInfo(f"f{i}")
                ti.size, ti.mtime, ti.uname, ti.gname = 1, 0, "", ""
                tar.addfile(ti, io.BytesIO(b"x"))
        raw = buf.getvalue()
        body = n * 1024
        assert raw[body:] == tarfmt.end(body)


def test_the_reader_reads_what_tarfile_writes():
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in (("a/b.txt", b"hello"), ("é/" + "n" * 150, b"x" * 700)):
            ti = tarfile.TarInfo(name)
            ti.size = len(data)
            tar.addfile(ti, io.BytesIO(data))
    stream = tarfmt.TarStream(io.BytesIO(buf.getvalue()).read, max_header_bytes=4096, chunk=64)
    h = stream.next_header()
    assert (h.name, h.size, h.typeflag, h.pax) == ("a/b.txt", 5, b"0", False)
    assert bytes(stream.data(5)) == b"hello"
    h = stream.next_header()
    assert (h.name, h.size, h.pax) == ("é/" + "n" * 150, 700, True)
    assert b"".join(bytes(c) for c in stream.chunks(700)) == b"x" * 700
    assert stream.next_header() is None and stream.end_block
    assert stream.rest_is_zero() is None


def test_a_bad_checksum_is_a_format_error():
    block = bytearray(tarfmt.header("a", 1, 0o644))
    block[0] ^= 1
    stream = tarfmt.TarStream(io.BytesIO(bytes(block) + bytes(1024)).read,
                              max_header_bytes=4096)
    with pytest.raises(tarfmt.TarFormatError) as err:
        stream.next_header()
    assert (err.value.reason, err.value.offset, err.value.truncated, err.value.no_header) == \
        ("bad header checksum", 0, False, True)
