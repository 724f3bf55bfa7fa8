"""Hostile and damaged archives for the cache_tools tests, built as generators (no binary test
data): from the members of a real packed archive, or from scratch with ``synthetic`` for
layout lies that pack itself would never write.

Every case names the exact refusal it must get; test_hostile_corpus.py runs each through
``verify`` and ``restore`` and checks the destination is byte for byte what it was.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import io
import json
import pickle
import re
import select
import subprocess
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import pytest
from cache_helpers import tree

from cache_tools import archive, forks
from cache_tools.archive import tarfmt
from cache_tools.errors import ArchiveError
from cache_tools.fingerprint import Fingerprint
from cache_tools.archive.manifest import MANIFEST_NAME, EntryRecord, FileRecord, Manifest
from cache_tools.archive.reader import Limits

Members = list[tuple[tarfile.TarInfo, "bytes | None"]]


# --- building blocks --------------------------------------------------------------------------


def read_members(path: Path) -> Members:
    """Every member of a (valid) archive with its data."""
    out: Members = []
    with tarfile.open(path) as tar:
        for ti in tar.getmembers():
            f = tar.extractfile(ti)
            out.append((ti, f.read() if f else None))
    return out


def tar_bytes(members: list, *, end: bool = True) -> bytes:
    """A tar of ``members``: (TarInfo, data) pairs written by tarfile's PAX writer, or raw
    ``bytes`` inserted as they are (hand-made headers)."""
    buf = io.BytesIO()
    tar = tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT)
    for m in members:
        if isinstance(m, bytes):
            tar.fileobj.write(m)
            tar.offset += len(m)
        else:
            ti, data = m
            tar.addfile(ti, io.BytesIO(data) if data is not None else None)
    if end:
        tar.close()
    else:
        tar.fileobj.flush()
    return buf.getvalue()


def write(path: Path, members: list, *, zstd: bool = False, end: bool = True) -> Path:
    raw = tar_bytes(members, end=end)
    if zstd:
        import zstandard

        raw = zstandard.ZstdCompressor().compress(raw)
    path.write_bytes(raw)
    return path


def manifest_doc(members: Members) -> dict:
    return json.loads(members[0][1])


def set_manifest(members: Members, doc: dict | bytes) -> None:
    data = doc if isinstance(doc, bytes) else json.dumps(doc).encode()
    ti = members[0][0]
    ti.size = len(data)
    members[0] = (ti, data)


def regular(name: str, data: bytes) -> tuple[tarfile.TarInfo, bytes]:
    ti = tarfile.TarInfo(name)
    ti.size = len(data)
    return ti, data


def special(name: str, typ: bytes, linkname: str = "") -> tuple[tarfile.TarInfo, None]:
    ti = tarfile.TarInfo(name)
    ti.type = typ
    ti.linkname = linkname
    return ti, None


def ustar(name: bytes, size: int, typeflag: bytes = b"0") -> bytes:
    """A hand-made ustar header block (any name bytes, any type) with a valid checksum."""
    return tarfmt._block(name, 0o644, size, typeflag)


def pax(records: bytes, typeflag: bytes = b"x", size: int | None = None) -> bytes:
    """A PAX header block followed by ``records`` (padded); ``size`` may lie."""
    n = len(records) if size is None else size
    return ustar(b"././@PaxHeader", n, typeflag) + records + tarfmt.padding(len(records))


def record(key: str, value: str) -> bytes:
    """One PAX record, ``LEN key=value\\n``."""
    return tarfmt._pax_records({key: value})


def entry_doc(kind: str, name: str, is_dir: bool, files: dict[str, bytes]) -> dict:
    recs = tuple(FileRecord(p, len(d), hashlib.sha256(d).hexdigest(), 0o644)
                 for p, d in sorted(files.items()))
    return EntryRecord(kind, name, is_dir, recs).to_dict()


def synthetic(path: Path, fp: Fingerprint, entries: list[tuple[str, str, bool, dict[str, bytes]]]
              ) -> Path:
    """A consistent archive (manifest, members, sizes, hashes) of arbitrary entries, in the
    order given: for layout lies that pack never writes."""
    docs = [entry_doc(*e) for e in entries]
    manifest = Manifest(fp, ()).to_json()
    doc = json.loads(manifest)
    doc["entries"] = docs
    members: list = [regular(MANIFEST_NAME, json.dumps(doc).encode())]
    for kind, name, _is_dir, files in entries:
        for p, data in sorted(files.items()):
            members.append(regular("/".join(x for x in (kind, name, p) if x), data))
    return write(path, members)


# --- the corpus ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    """One hostile archive: ``build(valid, out, fp)`` writes it to ``out``; restore and verify
    must both refuse it with ``expect`` (a string, or a pattern for numbers that vary)."""

    id: str
    build: Callable[[Path, Path, Fingerprint], Path]
    expect: str | re.Pattern
    limits: Limits | None = None


CASES: list[Case] = []


def case(expect: str | re.Pattern, limits: Limits | None = None):
    def register(fn: Callable[[Path, Path, Fingerprint], Path]):
        CASES.append(Case(fn.__name__, fn, expect, limits))
        return fn
    return register


def first_payload(valid: Path) -> str:
    return read_members(valid)[1][0].name


def _insert(valid: Path, out: Path, member, at: int = 1, **kw) -> Path:
    m: list = read_members(valid)
    m.insert(at, member)
    return write(out, m, **kw)


def _replace_first(valid: Path, out: Path, member) -> Path:
    m: list = read_members(valid)
    m[1] = member
    return write(out, m)


def _with_manifest(valid: Path, out: Path, edit: Callable[[dict], object]) -> Path:
    m = read_members(valid)
    doc = manifest_doc(m)
    edit(doc)
    set_manifest(m, doc)
    return write(out, m)


# names

@case("archive member '/etc/evil': absolute path; members must be relative")
def name_absolute(valid, out, fp):
    return _insert(valid, out, regular("/etc/evil", b"x"))


@case("archive member 'triton/../../evil': path leaves the destination ('..')")
def name_dot_dot(valid, out, fp):
    return _insert(valid, out, regular("triton/../../evil", b"x"))


@case("archive member 'triton/a\\x00b': not a plain relative path")
def name_nul(valid, out, fp):
    return _insert(valid, out, pax(record("path", "triton/a\x00b")) + ustar(b"x", 1) + b"x" +
                   bytes(511))


@case(re.compile(r"the archive member after 'manifest\.json' \(byte \d+\): member name is not "
                 r"valid UTF-8 \(b'triton/\\xff\\xfe'\)"))
def name_not_utf8(valid, out, fp):
    return _insert(valid, out, ustar(b"triton/\xff\xfe", 1) + b"x" + bytes(511))


@case("manifest.json: entries[0]: name '\\udc80\\udcff': not valid UTF-8 (a lone surrogate)")
def name_lone_surrogate(valid, out, fp):
    def edit(doc):
        doc["entries"][0]["name"] = "\udc80\udcff"
    return _with_manifest(valid, out, edit)


@case("manifest.json: entries[0]: name " + repr("x" * 60) + "...: a path component is longer "
      "than 255 bytes")
def name_component_overlong(valid, out, fp):
    def edit(doc):
        doc["entries"][0]["name"] = "x" * 256
    return _with_manifest(valid, out, edit)


@case("manifest.json: entries[0].files[0]: member name longer than 4096 bytes")
def name_member_overlong(valid, out, fp):
    deep = "/".join(["d" * 200] * 21)
    return synthetic(out, fp, [("flashinfer", "cubins/" + deep, False, {"": b"x"})])


# links and other member types, in place of a listed member of the same name

def _typed(typ: bytes, link: str = ""):
    def build(valid, out, fp):
        return _replace_first(valid, out, special(first_payload(valid), typ, link))
    return build


#: (tar type, link target, how the refusal names it): every member type but a regular file
MEMBER_TYPES = [
    (tarfile.SYMTYPE, "/etc/passwd", "symbolic link to '/etc/passwd'"),
    (tarfile.LNKTYPE, "../../../etc/passwd", "hard link to '../../../etc/passwd'"),
    (tarfile.CHRTYPE, "", "character device"),
    (tarfile.BLKTYPE, "", "block device"),
    (tarfile.FIFOTYPE, "", "FIFO"),
    (tarfile.DIRTYPE, "", "directory"),
    (tarfile.GNUTYPE_SPARSE, "", "sparse file"),
]
for _typ, _link, _what in MEMBER_TYPES:
    CASES.append(Case(f"type_{_what.split()[0]}", _typed(_typ, _link),
                      re.compile(r"archive member 'triton/[A-Z0-9]+/__grp__\w+\.json': "
                                 + re.escape(_what) + r"; only regular files are allowed")))


@case(re.compile(r"archive member 'triton/[A-Z0-9]+/__grp__\w+\.json': unsupported member "
                 r"type b'7'; only regular files are allowed"))
def type_contiguous(valid, out, fp):
    return _typed(tarfile.CONTTYPE)(valid, out, fp)


# sparse and PAX tricks

@case(re.compile(r"archive member 'triton/[A-Z0-9]+/__grp__\w+\.json': sparse file; only "
                 r"regular files are allowed"))
def pax_sparse_map(valid, out, fp):
    m: list = read_members(valid)
    ti, data = m[1]
    m[1] = (pax(record("GNU.sparse.map", "0,x,y") + record("GNU.sparse.size", "zz"))
            + ustar(ti.name.encode(), len(data)) + data + tarfmt.padding(len(data)))
    return write(out, m)


@case(re.compile(r"the archive member after 'manifest\.json' \(byte \d+\): malformed PAX header "
                 r"\(bad record length\)"))
def pax_bad_length(valid, out, fp):
    return _insert(valid, out, pax(b"99 path=x\n"))


@case(re.compile(r"the archive member after 'manifest\.json' \(byte \d+\): malformed PAX header "
                 r"\(a record without '='\)"))
def pax_no_equals(valid, out, fp):
    return _insert(valid, out, pax(b"8 pathx\n"))


@case(re.compile(r"the archive member after 'manifest\.json' \(byte \d+\): two PAX headers in "
                 r"a row"))
def pax_twice(valid, out, fp):
    return _insert(valid, out, pax(record("path", "a")) + pax(record("path", "b")))


@case(re.compile(r"the archive member after 'manifest\.json' \(byte \d+\): global PAX header"))
def pax_global(valid, out, fp):
    return _insert(valid, out, pax(record("comment", "hi"), typeflag=b"g"))


@case(re.compile(r"the archive member after 'manifest\.json' \(byte \d+\): GNU long-name "
                 r"header \(only ustar/PAX archives are read\)"))
def gnu_long_name(valid, out, fp):
    return _insert(valid, out, ustar(b"././@LongLink", 1 << 31, b"L"))


@case(re.compile(r"the archive member after 'manifest\.json' \(byte \d+\): PAX header of "
                 r"2147483648 bytes exceeds the limit of 65536 bytes"))
def pax_two_gib(valid, out, fp):
    # The header declares 2 GiB of records; the reader must refuse it from its 512 bytes.
    return _insert(valid, out, pax(b"", size=1 << 31))


@case("archive member 'triton/../escape': path leaves the destination ('..')")
def pax_path_escape(valid, out, fp):
    return _insert(valid, out, pax(record("path", "triton/../escape")) + ustar(b"ok", 1) + b"x"
                   + bytes(511))


@case(re.compile(r"archive member 'triton/[A-Z0-9]+/__grp__\w+\.json': \d+ bytes, the manifest "
                 r"lists \d+"))
def pax_size_lie(valid, out, fp):
    m: list = read_members(valid)
    ti, data = m[1]
    m[1] = (pax(record("size", str(len(data) + 512))) + ustar(ti.name.encode(), len(data))
            + data + bytes(512) + tarfmt.padding(len(data)))
    return write(out, m)


# bombs

@case("manifest.json: not valid JSON (nested too deeply)")
def bomb_nested_json(valid, out, fp):
    m = read_members(valid)
    set_manifest(m, b"[" * 100_000 + b"]" * 100_000)
    return write(out, m)


@case(re.compile(r"archive member 'manifest\.json': \d+ bytes exceeds the limit of 100 bytes"),
      Limits(max_manifest_bytes=100))
def bomb_manifest_size(valid, out, fp):
    return valid


@case(re.compile(r"manifest\.json: 3 entries exceed the limit of 2"), Limits(max_entries=2))
def bomb_entry_count(valid, out, fp):
    return valid


@case(re.compile(r"manifest\.json: \d+ files exceed the limit of 10"), Limits(max_files=10))
def bomb_file_count(valid, out, fp):
    return valid


@case("archive member 'triton/0BIG/x.so': 1099511627776 bytes exceeds the per-file limit of "
      "8589934592 bytes")
def bomb_huge_size(valid, out, fp):
    def edit(doc):
        doc["entries"].insert(0, {"kind": "triton", "name": "0BIG", "type": "dir",
                                  "files": [["x.so", 1 << 40, "0" * 64, 420]]})
    return _with_manifest(valid, out, edit)


# manifest lies

@case(re.compile(r"archive member 'triton/[A-Z0-9]+/\w+\.cubin': sha256 mismatch \(manifest "
                 r"[0-9a-f]{16}, content [0-9a-f]{16}\)"))
def lie_hash(valid, out, fp):
    m: list = read_members(valid)
    i = next(i for i, (ti, _) in enumerate(m) if ti.name.endswith(".cubin"))
    ti, data = m[i]
    m[i] = (ti, bytes([data[0] ^ 1]) + data[1:])
    return write(out, m)


@case("archive member 'triton/EXTRA/evil.so' is not listed in the manifest")
def lie_extra_member_at_end(valid, out, fp):
    m: list = read_members(valid)
    m.append(regular("triton/EXTRA/evil.so", b"x"))
    return write(out, m)


@case(re.compile(r"archive is truncated: the manifest lists 'triton/[A-Z0-9]+/\w+\.ttir' but the "
                 r"archive ends before it"))
def lie_missing_member(valid, out, fp):
    m: list = read_members(valid)
    m.pop()
    return write(out, m)


@case(re.compile(r"archive member 'triton/[A-Z0-9]+/__grp__\w+\.json' is out of order "
                 r"\(expected 'triton/[A-Z0-9]+/\w+\.cubin'\)"))
def lie_duplicate_member(valid, out, fp):
    m: list = read_members(valid)
    m.insert(2, m[1])
    return write(out, m)


@case(re.compile(r"manifest\.json: entry triton:[A-Z0-9]+ is listed twice"))
def lie_duplicate_entry(valid, out, fp):
    def edit(doc):
        doc["entries"].insert(1, doc["entries"][0])
    return _with_manifest(valid, out, edit)


@case("manifest.json: entries are not sorted by kind and name")
def lie_unsorted(valid, out, fp):
    def edit(doc):
        doc["entries"].reverse()
    return _with_manifest(valid, out, edit)


@case("manifest.json: entries[0]: sha256 does not match its files")
def lie_entry_digest(valid, out, fp):
    def edit(doc):
        doc["entries"][0]["sha256"] = "0" * 64
    return _with_manifest(valid, out, edit)


@case(re.compile(r"archive member 'triton/[A-Z0-9]+/__grp__\w+\.json' comes first; manifest\.json "
                 r"must be the first member"))
def lie_manifest_not_first(valid, out, fp):
    m: list = read_members(valid)
    m[0], m[1] = m[1], m[0]
    return write(out, m)


@case(re.compile(r"archive holds data after its end-of-archive block \(byte \d+\)"))
def lie_hidden_after_end(valid, out, fp):
    raw = valid.read_bytes() + tar_bytes([regular("triton/hidden/x.so", b"x")])
    out.write_bytes(raw)
    return out


_HIDDEN_IN_PADDING = re.compile(r"the archive member after '[^']+' \(byte \d+\): non-zero bytes "
                                r"in the padding of the previous member \(data hidden outside "
                                r"every member\)")


def _hide_after(valid: Path, out: Path, pick: Callable[[list[tarfile.TarInfo]], tarfile.TarInfo]
                ) -> Path:
    """One byte of data right after the data of the member ``pick`` chooses, in its padding."""
    raw = bytearray(valid.read_bytes())
    with tarfile.open(valid) as tf:
        padded = pick(tf.getmembers())
    assert padded.size % 512, "the member picked has no padding"
    raw[padded.offset_data + padded.size] = 0x41      # the first byte after its data
    out.write_bytes(bytes(raw))
    return out


@case(_HIDDEN_IN_PADDING)
def lie_hidden_in_padding(valid, out, fp):
    return _hide_after(valid, out, lambda ms: next(ti for ti in ms[1:] if ti.size % 512))


# The same at the places where the read workers' ranges meet: after the manifest (before the
# first range), after an entry's last member (a range ends with an entry), after the last member
# (before the tail).
@case(_HIDDEN_IN_PADDING)
def lie_hidden_in_manifest_padding(valid, out, fp):
    return _hide_after(valid, out, lambda ms: ms[0])


@case(_HIDDEN_IN_PADDING)
def lie_hidden_after_an_entry(valid, out, fp):
    def last_of_first_entry(ms):
        entry = ms[1].name.split("/")[1]
        return [ti for ti in ms[1:] if ti.name.split("/")[1] == entry][-1]
    return _hide_after(valid, out, last_of_first_entry)


@case(_HIDDEN_IN_PADDING)
def lie_hidden_after_the_last_member(valid, out, fp):
    return _hide_after(valid, out, lambda ms: ms[-1])


# layout lies (consistent archives of entries pack would never write)

@case("manifest.json: entries cute_aot:fp/a.o and cute_aot:fp/a.o/b.o overlap ('fp/a.o/b.o' lies "
      "inside 'fp/a.o')")
def layout_overlap(valid, out, fp):
    return synthetic(out, fp, [("cute_aot", "fp/a.o", True, {"x": b"outer"}),
                               ("cute_aot", "fp/a.o/b.o", False, {"": b"inner"})])


@case("manifest.json: entries[0]: sglang_jit entry 'sm90/topk/build-k/deps-k' is incomplete: no "
      "sgl_deps.json yet (being built or interrupted)")
def layout_incomplete_sglang_jit(valid, out, fp):
    return synthetic(out, fp, [("sglang_jit", "sm90/topk/build-k/deps-k", True,
                                {"topk.so": b"\x7fELF"})])


@case("manifest.json: entries[0]: flashinfer entry '0.2.14/90/cached_ops/op' is incomplete: no "
      "op.so yet (being built or interrupted)")
def layout_incomplete_flashinfer(valid, out, fp):
    return synthetic(out, fp, [("flashinfer", "0.2.14/90/cached_ops/op", True,
                                {"build.ninja": b"rule"})])


@case("manifest.json: entries[0]: triton entry 'ABC' is incomplete: no __grp__*.json group file "
      "(compile in flight or interrupted)")
def layout_incomplete_triton(valid, out, fp):
    return synthetic(out, fp, [("triton", "ABC", True, {"k.cubin": b"x"})])


@case("manifest.json: entries[0]: unknown kind 'nvcc'")
def layout_unknown_kind(valid, out, fp):
    return synthetic(out, fp, [("nvcc", "x", True, {"a": b"x"})])


@case("manifest.json: entries[0]: 'a/b' is not where a triton entry can be")
def layout_wrong_position(valid, out, fp):
    return synthetic(out, fp, [("triton", "a/b", True, {"k.so": b"x"})])


@case("entry triton:ABC: group file __grp__k.json names 'k.cubin' outside its entry")
def layout_group_outside(valid, out, fp):
    grp = json.dumps({"child_paths": {"k.cubin": "/etc/passwd"}}).encode()
    return synthetic(out, fp, [("triton", "ABC", True, {"__grp__k.json": grp, "k.cubin": b"x"})])


@case("entry triton:ABC: group file __grp__k.json references missing file k.ptx")
def layout_group_missing_child(valid, out, fp):
    grp = json.dumps({"child_paths": {"k.cubin": "k.cubin", "k.ptx": "k.ptx"}}).encode()
    return synthetic(out, fp, [("triton", "ABC", True, {"__grp__k.json": grp, "k.cubin": b"x"})])


@case("entry triton:ABC: unreadable group file __grp__k.json")
def layout_group_not_json(valid, out, fp):
    return synthetic(out, fp, [("triton", "ABC", True, {"__grp__k.json": b"{", "k.cubin": b"x"})])


@case("manifest.json: entries[0].files[0]: Triton group file of 1048578 bytes exceeds the limit "
      "of 1048576 bytes")
def layout_group_too_large(valid, out, fp):
    return synthetic(out, fp, [("triton", "ABC", True, {"__grp__k.json": b" " * (1 << 20) + b"{}",
                                                        "k.so": b"x"})])


# truncations: at every member boundary and inside every part of the first members

# --- files of other tools: what is wrong, not "not a tar" for a tar --------------------------
_OTHER_TAR = r".*: a tar archive of a kind `sglang-warmup cache pack` never writes: "


@case(re.compile(_OTHER_TAR + r"global PAX header"))
def other_git_archive(valid, out, fp):
    """`git archive`: a global PAX header (the commit id) comes first."""
    return _insert(valid, out, pax(record("comment", "0" * 40), typeflag=b"g"), at=0)


@case(re.compile(_OTHER_TAR + r"GNU long-name header \(only ustar/PAX archives are read\)"))
def other_gnu_long_name_first(valid, out, fp):
    """GNU tar's format, a first name longer than 100 bytes."""
    return _insert(valid, out, ustar(b"././@LongLink", 200, b"L") + b"n" * 200 +
                   tarfmt.padding(200), at=0)


@case(re.compile(r"archive member '\.' comes first; manifest\.json must be the first member"))
def other_tar_of_a_directory(valid, out, fp):
    """`tar -cf out.tar -C dir .`: the directory itself comes first."""
    return _insert(valid, out, ustar(b"./", 0, b"5"), at=0)


@case(re.compile(r".*: a gzip file, not a tar or tar\.zst archive"))
def other_gzip(valid, out, fp):
    import gzip

    out.write_bytes(gzip.compress(valid.read_bytes()))
    return out


@case(re.compile(r".*: not a tar or tar\.zst archive \(no tar header at its start\)"))
def other_text(valid, out, fp):
    out.write_bytes(b"this is not a tar archive\n" * 40)
    return out


def truncations(valid: Path) -> list[int]:
    """Cut points: each header start, inside each header, inside and at the end of the data
    and padding of the first members, and before the end-of-archive blocks."""
    with tarfile.open(valid) as tar:
        infos = tar.getmembers()
    cuts = set()
    for ti in infos:
        cuts.update({ti.offset, ti.offset + 100, ti.offset_data + ti.size // 2,
                     ti.offset_data + ti.size})
    last = infos[-1]
    cuts.add(last.offset_data + last.size + (-last.size % 512))
    return sorted(c for c in cuts if 0 < c < valid.stat().st_size)


# --- the check every refusal gets ------------------------------------------------------------
@contextlib.contextmanager
def forked_workers() -> Iterator[None]:
    """Read workers for archives of any size, also in pytest-xdist's worker processes (which
    run an I/O thread that the workers never touch)."""
    saved = forks.MIN_FILES, forks.MIN_BYTES, forks.single_threaded
    forks.MIN_FILES, forks.MIN_BYTES, forks.single_threaded = 1, 1, lambda: True
    try:
        yield
    finally:
        forks.MIN_FILES, forks.MIN_BYTES, forks.single_threaded = saved


def rejects(path: Path, dest: Path, fp: Fingerprint, expect: str | re.Pattern,
            limits: Limits | None = None, *, workers_here: bool = False) -> str:
    """Restore (plan and execute) and verify both refuse ``path`` with ``expect``, in one
    process and with forked workers; ``dest`` is unchanged.  Returns the message.

    The reads with workers run in a light interpreter (``LightProcess``), or in this process
    with ``workers_here``: for a test that watches or patches ``read_workers``, ``writer`` or
    ``forks`` here, or measures this process."""
    before = tree(dest)
    with pytest.raises(ArchiveError) as err:
        archive.plan_restore(path, dest=dest, local=fp, limits=limits).execute(jobs=1)
    got = err.value.message
    if isinstance(expect, re.Pattern):
        assert expect.fullmatch(got), got
    else:
        assert got == expect
    assert tree(dest) == before
    with pytest.raises(ArchiveError) as again:
        archive.verify(path, local=fp, limits=limits, jobs=1)
    assert again.value.message == got
    forked = forked_refusals(path, dest, fp, limits) if workers_here else \
        light_process().call(forked_refusals, path, dest, fp, limits)
    assert forked == {"restore": got, "verify": got}
    assert tree(dest) == before
    assert "\n" not in got
    return got


def forked_refusals(path: Path, dest: Path, fp: Fingerprint,
                    limits: Limits | None) -> dict[str, str | None]:
    """The messages restore and verify refuse ``path`` with when they read it on forked
    workers (None for one that accepted it)."""
    out: dict[str, str | None] = {}
    with forked_workers():
        for name, read in (
                ("restore", lambda: archive.plan_restore(path, dest=dest, local=fp,
                                                         limits=limits).execute(jobs=2)),
                ("verify", lambda: archive.verify(path, local=fp, limits=limits, jobs=2))):
            try:
                read()
                out[name] = None
            except ArchiveError as exc:
                out[name] = exc.message
    return out


class LightProcess:
    """A fresh interpreter kept for this test process that runs calls whose archive reads fork
    workers.  A pytest worker that has imported torch and SGLang (about 850 MB resident)
    spends about 50 ms of CPU on each fork and its exit, page tables copied and torn down;
    this process imports the cache tools and these helpers only, and forks in about 1 ms (the
    corpus forks some 500 workers).  Calls and answers are pickled over its stdin and a copy of
    its stdout (its fd 1 is its stderr, for anything a worker prints); no thread is started
    here (the replay tests need this process single-threaded)."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", _SERVE, json.dumps(sys.path)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        atexit.register(self.close)

    def call(self, fn: Callable, *args, timeout: float = 300.0):
        """``fn(*args)`` there (``fn`` importable by name); its exception's traceback raises an
        AssertionError here.  A call interrupted, or unanswered after ``timeout`` seconds,
        kills the process (the next call starts another: no answer is read out of turn)."""
        try:
            pickle.dump((fn, args), self.proc.stdin)
            self.proc.stdin.flush()
            if not select.select([self.proc.stdout], [], [], timeout)[0]:
                raise TimeoutError(f"the light process gave no answer in {timeout:g} s")
            ok, value = pickle.load(self.proc.stdout)
        except BaseException:
            self.proc.kill()
            self.proc.wait()
            raise
        if not ok:
            raise AssertionError(f"in the light process: {value}")
        return value

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.proc.stdout.close()


_SERVE = """
import json, os, pickle, sys, traceback
sys.path[:] = json.loads(sys.argv[1])
out = os.fdopen(os.dup(1), "wb")
os.dup2(2, 1)
while True:
    try:
        fn, args = pickle.load(sys.stdin.buffer)
    except EOFError:
        break
    try:
        answer = (True, fn(*args))
    except BaseException:
        answer = (False, traceback.format_exc())
    pickle.dump(answer, out)
    out.flush()
"""
_light: LightProcess | None = None


def light_process() -> LightProcess:
    """This test process's ``LightProcess``, started on first use."""
    global _light
    if _light is None or _light.proc.poll() is not None:
        _light = LightProcess()
    return _light
