"""Fuzzing the archive reader and the manifest parser (Hypothesis): mutated real archives never
produce a traceback, stay under a memory budget, and never write outside the destination.

Budget: 64 MiB of Python allocations (tracemalloc) per restore of a mutated 70 KiB archive;
the reader's own share is its 1 MiB read chunks and the members it holds whole.  The examples
are derandomized and few, so the suite stays fast and repeatable on two cores.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import tracemalloc
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cache_helpers import tree
from cache_tools import archive
from cache_tools.errors import HintedError
from cache_tools.archive.manifest import Manifest

BUDGET = 64 << 20
FUZZ = settings(max_examples=40, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture,
                                       HealthCheck.too_slow])

# One mutation: (what, where as a fraction of the length, a byte or a length)
mutation = st.tuples(st.sampled_from(["flip", "set", "cut", "insert", "delete", "repeat"]),
                     st.floats(0, 1, allow_nan=False), st.integers(0, 255))


def _mutate(raw: bytes, steps: list[tuple[str, float, int]]) -> bytes:
    data = bytearray(raw)
    for what, where, value in steps:
        if not data:
            break
        i = min(int(where * len(data)), len(data) - 1)
        if what == "flip":
            data[i] ^= 1 << (value % 8)
        elif what == "set":
            data[i] = value
        elif what == "cut":
            del data[i:]
        elif what == "insert":
            data[i:i] = bytes([value]) * (value % 7 + 1)
        elif what == "delete":
            del data[i:i + value % 600 + 1]
        elif what == "repeat":                       # a 512-byte block twice
            start = i - i % 512
            data[start:start] = data[start:start + 512]
    return bytes(data)


def _run(raw: bytes, fp) -> list[str]:
    """Verify and restore ``raw``: a one-line HintedError or success; nothing outside the
    destination; a failed restore leaves the destination as it was.  Returns each outcome
    ("ok" or the error's message)."""
    outcomes = []
    with tempfile.TemporaryDirectory() as tmp:
        box = Path(tmp)
        path = box / "fuzzed.tar"
        path.write_bytes(raw)
        dest = box / "dest"
        (dest / "triton").mkdir(parents=True)
        before = tree(dest)
        tracemalloc.start()
        try:
            for attempt in (lambda: archive.verify(path, local=fp),
                            lambda: archive.plan_restore(path, dest=dest, local=fp,
                                                         force=True).execute()):
                try:
                    attempt()
                    outcomes.append("ok")
                except HintedError as exc:
                    assert exc.message and "\n" not in exc.message, exc.message
                    assert tree(dest) == before
                    outcomes.append(exc.message)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert peak < BUDGET, peak
        assert sorted(os.listdir(box)) == ["dest", "fuzzed.tar"]
        leftovers = [n for n in os.listdir(dest / "triton") if n.startswith(".sgw-")]
        assert leftovers == []
        shutil.rmtree(dest)
    return outcomes


@FUZZ
@given(steps=st.lists(mutation, min_size=1, max_size=4))
def test_mutated_archives(valid_archive, fp, steps):
    _run(_mutate(valid_archive.read_bytes(), steps), fp)


@FUZZ
@given(steps=st.lists(mutation, min_size=1, max_size=3))
def test_mutated_zstd_archives(valid_archive, fp, steps):
    import zstandard

    raw = zstandard.ZstdCompressor(level=3).compress(valid_archive.read_bytes())
    _run(_mutate(raw, steps), fp)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2 ** 70, 2 ** 70) |
    st.floats(allow_nan=True) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                max_size=4),
    max_leaves=12)


@FUZZ
@given(path=st.lists(st.sampled_from(["entries", 0, 1, "files", "name", "kind", "type",
                                      "sha256", "fingerprint", "software", "version", 2, 3]),
                     min_size=1, max_size=5),
       value=json_values)
def test_manifest_fields_replaced_by_anything(valid_archive, path, value):
    """Any value at any place of a real manifest: an ArchiveError or a valid manifest."""
    import tarfile

    with tarfile.open(valid_archive) as tar:
        doc = json.loads(tar.extractfile("manifest.json").read())
    node = doc
    for key in path[:-1]:
        try:
            node = node[key]
        except (KeyError, IndexError, TypeError):
            break
    try:
        node[path[-1]] = value
    except (IndexError, TypeError):
        pass
    data = json.dumps(doc, allow_nan=True).encode()
    try:
        Manifest.parse(data)
    except HintedError as exc:
        assert exc.message and "\n" not in exc.message


def test_the_harness_tells_success_from_refusal(valid_archive, fp):
    raw = valid_archive.read_bytes()
    assert _run(raw, fp) == ["ok", "ok"]
    refused = _run(_mutate(raw, [("flip", 0.999999, 0)]), fp)   # a bit in the end padding
    assert refused[0] == refused[1] and refused[0].startswith(
        "archive holds data after its end-of-archive block (byte ")


# A file record of a directory entry: the plain case and its near misses.
_paths = st.one_of(st.sampled_from(["a", "k.cubin", "__grp__k.json", ".", "..", "...", ".a",
                                    "a/b", "a\\b", "a\x00b", 'a"b', "a\nb", "é", "a\x7f", " ",
                                    "x" * 63, "x" * 64, "", "\ud800"]),
                   st.text(max_size=70))
_sizes = st.one_of(st.integers(-3, 2 ** 70), st.sampled_from([True, False, 1.0, 0.5, None, "1"]))
_shas = st.one_of(st.just("ab" * 32), st.sampled_from(["AB" * 32, "ab" * 31, "ab" * 33, 5]),
                  st.text(alphabet="0123456789abcdefg", min_size=63, max_size=65))
_modes = st.sampled_from([420, 493, 0o777, 0, True, 420.0, "420", None])
_plain = st.tuples(st.text(alphabet="abk._-0", min_size=1, max_size=8),
                   st.integers(0, 2 ** 40), st.just("ab" * 32), st.sampled_from([420, 493]))
_file = st.one_of(_plain.map(list), _plain.map(list), _plain.map(list),
                  st.tuples(_paths, _sizes, _shas, _modes).map(list),
                  st.sampled_from([["a"], ["a", 1, "ab" * 32, 420, 0], {"path": "a"}, None]))
#: sorted by path where it can be (an unsorted list is refused whichever check runs first)
_files = st.lists(_file, min_size=1, max_size=3).map(
    lambda fs: sorted(fs, key=lambda f: str(f[0]) if isinstance(f, list) and f else ""))


def _parsed(raw: dict) -> object:
    from cache_tools.errors import ArchiveError
    from cache_tools.archive.manifest import parse_entry

    try:
        record = parse_entry(raw, "entries[0]")
    except ArchiveError as exc:
        return exc.message
    return record, record.digest


@settings(max_examples=300, deadline=None, derandomize=True, database=None)
@given(files=_files,
       where=st.sampled_from([("triton", "e"), ("inductor", "fxgraph/ab"), ("tilelang", "t")]))
def test_the_one_pattern_check_of_file_lists_accepts_exactly_what_the_field_checks_do(files,
                                                                                      where):
    """parse_entry checks a directory entry's file list with one regular expression over its
    JSON and falls back to the field-by-field check; with the pattern matching nothing every
    list takes the field-by-field check: the two give the same record or the same refusal."""
    import re

    from cache_tools.archive import manifest

    raw = {"kind": where[0], "name": where[1], "type": "dir", "files": files}
    fast = _parsed(raw)
    saved = manifest._PLAIN_FILES
    manifest._PLAIN_FILES = re.compile(r"(?!)")
    try:
        slow = _parsed(raw)
    finally:
        manifest._PLAIN_FILES = saved
    assert fast == slow


def test_plain_file_lists_take_the_one_pattern_check(monkeypatch):
    """The common case never reaches the field-by-field check, and its digest is the one the
    definition gives."""
    from cache_tools.archive import manifest

    def detailed(*args):
        raise AssertionError("field-by-field check used")

    monkeypatch.setattr(manifest, "_parse_file", detailed)
    sha = "0123456789abcdef" * 4
    files = [["__grp__k.json", 120, sha, 420], ["k.cubin", 0, sha, 493], ["k.json", 7, sha, 420]]
    record, digest = _parsed({"kind": "triton", "name": "e", "type": "dir", "files": files})
    assert record.files == tuple(manifest.FileRecord(*f) for f in files)
    assert digest == manifest.slow_content_digest(True, record.files)
