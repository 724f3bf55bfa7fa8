"""cache_tools.archive against hostile and damaged archives: each is rejected with an error naming the
member, and the destination is left exactly as it was (validation precedes the first rename)."""

from __future__ import annotations

import json
import re
import tarfile
from pathlib import Path


import pytest

import hostile
from cache_helpers import tree, triton_location
from cache_tools import archive
from cache_tools.archive import Limits
from cache_tools.errors import ArchiveError

Members = list[tuple[tarfile.TarInfo, bytes | None]]


@pytest.fixture
def valid(triton_cache, tmp_path, fp) -> Path:
    out = tmp_path / "valid.tar"
    archive.pack(out, [triton_location(triton_cache)], fingerprint=fp)
    return out


@pytest.fixture
def dest(tmp_path, valid, fp) -> Path:
    """A destination that already holds a restored cache (it must stay untouched)."""
    d = tmp_path / "dest"
    archive.plan_restore(valid, dest=d, local=fp).execute()
    first = sorted((d / "triton").iterdir())[0]
    import shutil

    shutil.rmtree(first)     # so a restore would have something to add
    return d


def _first_payload(members: Members) -> str:
    return members[1][0].name


def test_absolute_path(valid, dest, fp, tmp_path):
    m = hostile.read_members(valid)
    m.insert(1, hostile.regular("/etc/evil", b"x"))
    hostile.rejects(hostile.write(tmp_path / "h.tar", m), dest, fp,
             "archive member '/etc/evil': absolute path; members must be relative")


def test_dot_dot(valid, dest, fp, tmp_path):
    m = hostile.read_members(valid)
    m.insert(1, hostile.regular("triton/../../evil", b"x"))
    hostile.rejects(hostile.write(tmp_path / "h.tar", m), dest, fp,
             "archive member 'triton/../../evil': path leaves the destination ('..')")


@pytest.mark.parametrize("kind,link,what", hostile.MEMBER_TYPES)
def test_links_devices_and_fifos(valid, dest, fp, tmp_path, kind, link, what):
    m = hostile.read_members(valid)
    name = _first_payload(m)
    m[1] = hostile.special(name, kind, link)   # in place of a listed member, same name
    hostile.rejects(hostile.write(tmp_path / "h.tar", m), dest, fp,
             f"archive member {name!r}: {what}; only regular files are allowed")


def test_oversize_member(valid, dest, fp):
    m = hostile.read_members(valid)
    sizes = {ti.name: ti.size for ti, _ in m[1:]}
    first_big = next(n for n, s in sizes.items() if s > 1000)
    hostile.rejects(valid, dest, fp, f"archive member {first_big!r}: {sizes[first_big]} bytes exceeds "
             "the per-file limit of 1000 bytes", limits=Limits(max_file_bytes=1000))


def test_declared_total_over_the_limit(valid, dest, fp):
    with archive.ArchiveReader(valid) as reader:
        total = reader.read_manifest().size
    hostile.rejects(valid, dest, fp, f"manifest.json: the archive declares {total} bytes, more than "
             "the limit of 4096 bytes", limits=Limits(max_total_bytes=4096))


def test_decompression_bomb(valid, dest, fp, tmp_path):
    m = hostile.read_members(valid)
    doc = hostile.manifest_doc(m)
    zeros = b"\0" * (8 << 20)
    import hashlib

    # A lone launcher .so: a complete Triton entry without a group file.
    bomb = {"kind": "triton", "name": "BOMB", "type": "dir",
            "files": [["zeros.so", len(zeros), hashlib.sha256(zeros).hexdigest(), 420]]}
    doc["entries"].insert(0, bomb)
    hostile.set_manifest(m, doc)
    m.insert(1, hostile.regular("triton/BOMB/zeros.so", zeros))
    path = hostile.write(tmp_path / "bomb.tar.zst", m, zstd=True)
    assert path.stat().st_size < 200_000
    hostile.rejects(path, dest, fp, re.compile(
        r"archive member 'triton/BOMB/zeros\.so': decompression ratio exceeds 50:1 "
        r"\(\d+ bytes from \d+\); refusing a possible decompression bomb"),
        limits=Limits(max_ratio=50, ratio_floor_bytes=1 << 20))


def test_tar_header_larger_than_the_manifest_says(valid, dest, fp, tmp_path):
    m = hostile.read_members(valid)
    ti, data = m[1]
    m[1] = hostile.regular(ti.name, data + b"more")
    hostile.rejects(hostile.write(tmp_path / "h.tar", m), dest, fp,
             f"archive member {ti.name!r}: {len(data) + 4} bytes, the manifest lists "
             f"{len(data)}")


@pytest.mark.parametrize("fraction", [0.3, 0.6, 0.95])
@pytest.mark.parametrize("zstd", [False, True])
def test_truncated_archive(valid, dest, fp, tmp_path, fraction, zstd):
    raw = hostile.write(tmp_path / "full", hostile.read_members(valid), zstd=zstd).read_bytes()
    path = tmp_path / "cut"
    path.write_bytes(raw[: int(len(raw) * fraction)])
    hostile.rejects(path, dest, fp, re.compile(r"archive is truncated.*"))


def test_member_not_listed_in_the_manifest(valid, dest, fp, tmp_path):
    m = hostile.read_members(valid)
    m.append(hostile.regular("triton/EXTRA/evil.so", b"x"))
    hostile.rejects(hostile.write(tmp_path / "h.tar", m), dest, fp,
             "archive member 'triton/EXTRA/evil.so' is not listed in the manifest")


def test_manifest_lists_a_member_the_archive_lacks(valid, dest, fp, tmp_path):
    m = hostile.read_members(valid)
    last = m.pop()[0].name
    hostile.rejects(hostile.write(tmp_path / "h.tar", m), dest, fp,
             f"archive is truncated: the manifest lists {last!r} but the archive ends before it")


def test_members_out_of_order(valid, dest, fp, tmp_path):
    m = hostile.read_members(valid)
    m[1], m[2] = m[2], m[1]
    hostile.rejects(hostile.write(tmp_path / "h.tar", m), dest, fp,
             f"archive member {m[1][0].name!r} is out of order (expected {m[2][0].name!r})")


def test_manifest_not_first(valid, dest, fp, tmp_path):
    m = hostile.read_members(valid)
    m[0], m[1] = m[1], m[0]
    hostile.rejects(hostile.write(tmp_path / "h.tar", m), dest, fp,
             f"archive member {m[0][0].name!r} comes first; manifest.json must be the first "
             "member")


def test_manifest_entry_outside_the_layout(valid, dest, fp, tmp_path):
    m = hostile.read_members(valid)
    doc = hostile.manifest_doc(m)
    doc["entries"][0]["name"] = "../escape"
    hostile.set_manifest(m, doc)
    hostile.rejects(hostile.write(tmp_path / "h.tar", m), dest, fp,
             "manifest.json: entries[0]: name '../escape': not a plain relative path")
    doc["entries"][0]["name"] = "a/b"
    hostile.set_manifest(m, doc)
    hostile.rejects(hostile.write(tmp_path / "h2.tar", m), dest, fp,
             "manifest.json: entries[0]: 'a/b' is not where a triton entry can be")


def test_group_file_pointing_outside_its_entry(valid, dest, fp, tmp_path):
    import hashlib

    m = hostile.read_members(valid)
    doc = hostile.manifest_doc(m)
    idx = next(i for i, (ti, _) in enumerate(m) if "__grp__" in ti.name)
    ti, data = m[idx]
    children = json.loads(data)["child_paths"]
    child = sorted(children)[0]
    children[child] = "/etc/passwd"
    evil = json.dumps({"child_paths": children}).encode()
    m[idx] = hostile.regular(ti.name, evil)
    entry_name, file_name = ti.name.split("/")[1], ti.name.split("/")[2]
    for e in doc["entries"]:
        if e["name"] == entry_name:
            e.pop("sha256")
            for f in e["files"]:
                if f[0] == file_name:
                    f[1], f[2] = len(evil), hashlib.sha256(evil).hexdigest()
    hostile.set_manifest(m, doc)
    path = hostile.write(tmp_path / "h.tar", m)
    before = tree(dest)
    with pytest.raises(ArchiveError) as err:
        archive.plan_restore(path, dest=dest, local=fp).execute()
    assert err.value.message == (f"entry triton:{entry_name}: group file {file_name} names "
                                 f"{child!r} outside its entry")
    assert tree(dest) == before


def test_not_an_archive(dest, fp, tmp_path):
    path = tmp_path / "junk.tar"
    path.write_bytes(b"this is not a tar archive" * 40)
    before = tree(dest)
    with pytest.raises(ArchiveError) as err:
        archive.plan_restore(path, dest=dest, local=fp)
    assert err.value.message.startswith(f"{path}: not a tar or tar.zst archive (")
    assert tree(dest) == before


def test_hostile_input_never_touches_a_fresh_destination(valid, fp, tmp_path):
    m = hostile.read_members(valid)
    m.append(hostile.regular("triton/EXTRA/evil.so", b"x"))
    fresh = tmp_path / "fresh"
    with pytest.raises(ArchiveError):
        archive.plan_restore(hostile.write(tmp_path / "h.tar", m), dest=fresh, local=fp).execute()
    assert not fresh.exists()


