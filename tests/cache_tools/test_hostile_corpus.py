"""The hostile-archive corpus (hostile.py): every archive is refused by ``verify`` and by
``restore`` with the same one-line error, and the destination is byte for byte what it was."""

from __future__ import annotations

import re
import shutil
import tracemalloc
from pathlib import Path

import pytest

import hostile
from cache_helpers import tree
from cache_tools import archive
from cache_tools.errors import IncompatibleError


@pytest.fixture
def valid(valid_archive) -> Path:
    return valid_archive


@pytest.fixture
def dest(tmp_path, valid, fp) -> Path:
    """A destination holding the restored cache minus one entry (a restore would add it)."""
    d = tmp_path / "dest"
    archive.plan_restore(valid, dest=d, local=fp).execute()
    shutil.rmtree(sorted((d / "triton").iterdir())[0])
    return d




@pytest.mark.parametrize("case", hostile.CASES, ids=[c.id for c in hostile.CASES])
def test_corpus(case, valid, dest, fp, tmp_path):
    path = case.build(valid, tmp_path / f"{case.id}.tar", fp)
    hostile.rejects(path, dest, fp, case.expect, case.limits)


@pytest.mark.parametrize("part", range(4))       # a quarter of the cuts each: in parallel
@pytest.mark.parametrize("zstd", [False, True])
def test_truncated_at_every_boundary(valid, dest, fp, tmp_path, zstd, part):
    raw = valid.read_bytes()
    if zstd:
        import zstandard

        raw = zstandard.ZstdCompressor().compress(raw)
        cuts = sorted({int(len(raw) * f) for f in (0.001, 0.1, 0.3, 0.5, 0.7, 0.9, 0.999)}
                      | {len(raw) - 1, len(raw) - 4})
    else:
        cuts = hostile.truncations(valid)
    assert len(cuts) > 20 or zstd
    pattern = re.compile(r"archive is truncated.*|.*: it ends inside its first tar header: an "
                         r"archive cut short, or not one")
    for cut in cuts[part::4]:
        path = tmp_path / f"cut-{cut}"
        path.write_bytes(raw[:cut])
        hostile.rejects(path, dest, fp, pattern)


def test_a_two_gib_pax_header_costs_no_memory(valid, dest, fp, tmp_path):
    """Issue 17 item 3: a PAX header declaring 2 GiB (a sparse file of that size on disk) is
    refused from its first 512 bytes, naming the member it precedes."""
    m: list = hostile.read_members(valid)
    head = hostile.tar_bytes(m[:1], end=False) + hostile.pax(b"", size=1 << 31)
    path = tmp_path / "sparse.tar"
    with open(path, "wb") as f:
        f.write(head)
        f.truncate(len(head) + (1 << 31) + 1024)       # a hole: costs nothing on disk
    tracemalloc.start()
    try:
        msg = hostile.rejects(path, dest, fp, re.compile(
            r"the archive member after 'manifest\.json' \(byte \d+\): PAX header of 2147483648 "
            r"bytes exceeds the limit of 65536 bytes"), workers_here=True)   # all traced here
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 << 20, (peak, msg)


def test_another_toolchain_is_refused_by_restore_and_reported_by_verify(valid, dest, fp,
                                                                      tmp_path):
    m = hostile.read_members(valid)
    doc = hostile.manifest_doc(m)
    doc["fingerprint"]["software"]["triton"] = "3.6.0"
    doc["fingerprint"].pop("hash")
    doc["fingerprint"].pop("full_hash")
    hostile.set_manifest(m, doc)
    path = hostile.write(tmp_path / "other.tar", m)
    before = tree(dest)
    with pytest.raises(IncompatibleError) as err:
        archive.plan_restore(path, dest=dest, local=fp)
    assert err.value.message == (f"archive {path} was built by another toolchain: triton 3.6.0 "
                                 f"(cache) vs {fp.software_map['triton']} (here)")
    assert tree(dest) == before
    report = archive.verify(path, local=fp)
    assert report.compatibility.mismatches == (("triton", "3.6.0",
                                                fp.software_map["triton"]),)


def test_the_corpus_covers_every_family():
    ids = {c.id.split("_")[0] for c in hostile.CASES}
    assert ids >= {"name", "type", "pax", "gnu", "bomb", "lie", "layout"}
    assert len(hostile.CASES) >= 45
