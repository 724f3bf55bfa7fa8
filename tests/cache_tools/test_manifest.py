"""The manifest's bytes: ``to_json`` is canonical JSON of the document, entry digests are what
their definition says, and ``json_size`` (the room pack leaves before hashing) is the length of
``to_json`` for any hashes, for names and paths of any characters."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cache_tools.archive import groups
from cache_tools.errors import ArchiveError
from cache_tools.locations import KIND_NAMES
from cache_tools.archive.manifest import (EntryRecord, FileRecord, Manifest, content_digest_of,
                                  entry_json, files_json, json_size, slow_content_digest)

# Any text that UTF-8 can carry (what a manifest holds): quotes, backslashes, control
# characters and non-ASCII letters all change how long their JSON spelling is.
_text = st.text(st.characters(exclude_categories=("Cs",)), max_size=12)
_hex = st.text(alphabet="0123456789abcdef", min_size=64, max_size=64)
_files = st.lists(st.builds(FileRecord, _text, st.integers(0, 2 ** 70), _hex,
                            st.sampled_from([0o644, 0o755])), min_size=1, max_size=4)
_entries = st.lists(st.builds(EntryRecord, st.sampled_from(sorted(KIND_NAMES)), _text,
                              st.booleans(), _files.map(tuple)), max_size=5)
EXAMPLES = settings(max_examples=150, deadline=None, derandomize=True, database=None)


def _document(m: Manifest) -> bytes:
    kinds: dict[str, dict[str, int]] = {}
    for e in m.entries:
        k = kinds.setdefault(e.kind, {"entries": 0, "bytes": 0})
        k["entries"] += 1
        k["bytes"] += e.size
    doc = {"format": "sglang-warmup-cache-archive", "version": 1, "created_by": m.created_by,
           "fingerprint": m.fingerprint.to_dict(),
           "totals": {"entries": len(m.entries), "files": m.nb_files, "bytes": m.size},
           "kinds": kinds, "entries": [e.to_dict() for e in m.entries]}
    return (json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
            + "\n").encode()


@EXAMPLES
@given(entries=_entries, created_by=_text)
def test_to_json_is_canonical_json_of_the_document(fp, entries, created_by):
    m = Manifest(fp, tuple(entries), created_by)
    assert m.to_json() == _document(m)
    for e in entries:
        assert e.digest == slow_content_digest(e.is_dir, e.files)


@EXAMPLES
@given(entries=_entries, created_by=_text, hashes=st.lists(_hex, min_size=4, max_size=4))
def test_json_size_is_the_length_of_to_json_whatever_the_hashes(fp, entries, created_by,
                                                                hashes):
    """Counted from names, sizes and modes: the same for every choice of hashes."""
    m = Manifest(fp, tuple(entries), created_by)
    size = json_size(fp, created_by, ((e.kind, e.name, e.is_dir,
                                       ((f.path, f.size, f.mode) for f in e.files))
                                      for e in entries))
    assert size == len(m.to_json())
    rehashed = tuple(EntryRecord(e.kind, e.name, e.is_dir,
                                 tuple(f._replace(sha256=hashes[i % 4])
                                       for i, f in enumerate(e.files))) for e in entries)
    assert size == len(Manifest(fp, rehashed, created_by).to_json())


def test_json_size_of_a_real_shaped_manifest(fp):
    files = (FileRecord("__grp__k.json", 120, "a" * 64, 0o644),
             FileRecord("k.cubin", 123456, "b" * 64, 0o755))
    entries = (EntryRecord("triton", "ABCDEF", True, files),
               EntryRecord("flashinfer", "cubins/x é.so", False, (FileRecord("", 9, "c" * 64),)))
    m = Manifest(fp, entries, "sglang-warmup 1.0")
    assert json_size(fp, "sglang-warmup 1.0", ((e.kind, e.name, e.is_dir,
                                                 ((f.path, f.size, f.mode) for f in e.files))
                                                for e in entries)) == len(m.to_json())
    assert json_size(fp, "", ()) == len(Manifest(fp, (), "").to_json())


@EXAMPLES
@given(entries=_entries, created_by=_text)
def test_records_made_elsewhere_join_into_the_same_bytes(fp, entries, created_by):
    """Pack's workers spell each entry's record (``entry_json`` of ``files_json``) where they
    hash its files; the parent joins them: the same bytes as ``to_json`` builds."""
    m = Manifest(fp, tuple(entries), created_by)
    made = []
    for e in entries:
        listed = files_json(tuple(f) for f in e.files)
        made.append(entry_json(e.kind, e.name, e.is_dir, listed,
                               content_digest_of(listed, e.is_dir)))
    assert m.to_json(made) == m.to_json() == _document(m)


@EXAMPLES
@given(children=st.lists(_text, max_size=6))
def test_a_group_files_archive_size_is_its_length(children):
    assert groups.archive_size(children) == len(groups.archive_form(children))


def test_a_fingerprint_the_hash_cannot_spell_is_an_archive_error(fp):
    """The manifest's reader narrows what it turns into an ArchiveError to the fingerprint's
    CacheError; a lone surrogate (JSON's \\ud800) in a field is one, naming the field."""
    doc = json.loads(Manifest(fp, (), "test").to_json())
    doc["fingerprint"]["software"]["triton"] = "\ud800"
    with pytest.raises(ArchiveError) as err:
        Manifest.parse(json.dumps(doc).encode())
    assert err.value.message == \
        "manifest.json: fingerprint.software: expected an object of strings"
