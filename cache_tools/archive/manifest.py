"""The manifest: the first member of every archive, listing the fingerprint and, per entry, each
file's size, mode and sha256.  Everything a restore writes is checked against it first.

Parsing validates every entry the way scan judges a cache on disk (``parse_entry``, shared with
the Redis store's records): a plain relative UTF-8 name at a position of the kind's layout,
files that make the entry complete by the kind's rule, and no entry inside another.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import hashlib
import json
import re
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, NamedTuple, Sequence

from cache_tools.errors import ArchiveError, CacheError
from cache_tools.fingerprint import Fingerprint, canonical_json
from cache_tools.archive.groups import MAX_GROUP_BYTES, is_group
from cache_tools.locations import KIND_NAMES, EntryRule, kind
from cache_tools.scan import layout_problem

FORMAT = "sglang-warmup-cache-archive"
VERSION = 1
MANIFEST_NAME = "manifest.json"
MODES = (0o644, 0o755)
_HEX64 = re.compile(r"[0-9a-f]{64}")
#: JSON string spelling with ensure_ascii=False, as canonical_json writes strings
_json_str = json.encoder.encode_basestring
_HINT = "the archive is corrupt or was not written by `sglang-warmup cache pack`"
#: the longest path component and member name accepted (Linux NAME_MAX and PATH_MAX, bytes)
NAME_MAX = 255
PATH_MAX = 4096


class FileRecord(NamedTuple):
    """One file of an entry (a named tuple: manifests hold hundreds of thousands of them)."""

    #: path relative to the entry, '/'-separated ('' for a file entry)
    path: str
    size: int
    sha256: str
    #: 0o644, or 0o755 when any execute bit was set
    mode: int = 0o644

    def to_list(self) -> list[Any]:
        return [self.path, self.size, self.sha256, self.mode]


@dataclass(frozen=True)
class EntryRecord:
    """One entry: its kind, its name below the kind's root and its files, sorted by path."""

    kind: str
    name: str
    is_dir: bool
    files: tuple[FileRecord, ...]

    @functools.cached_property
    def digest(self) -> str:
        """Content hash of the entry (files, sizes, modes, hashes), independent of its name:
        identical content has identical digests (dedupe, the shared store's blob key)."""
        return content_digest(self.is_dir, self.files)

    @functools.cached_property
    def size(self) -> int:
        """Bytes of its files (computed once: a plan, its rendering and the workers' weights
        ask for it, entry by entry)."""
        return sum(f.size for f in self.files)

    @functools.cached_property
    def key(self) -> str:
        """``kind:name``: unique within an archive (computed once: it keys every table of a
        restore)."""
        return f"{self.kind}:{self.name}"

    def member(self, f: FileRecord) -> str:
        """The archive member name of file ``f``: ``<kind>/<name>/<path>``."""
        prefix = member_prefix(self.kind, self.name)
        return f"{prefix}/{f.path}" if f.path else prefix

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "name": self.name, "type": "dir" if self.is_dir else "file",
                "sha256": self.digest, "files": [f.to_list() for f in self.files]}


@contextlib.contextmanager
def paused_gc() -> Iterator[None]:
    """The cyclic garbage collector off while a manifest's hundreds of thousands of small
    objects are built or walked (its full collections made parsing superlinear: 40 % of a
    4,000-entry parse); it is back on, as it was, afterwards."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def member_prefix(kind: str, name: str) -> str:
    """What the archive names of an entry's files start with: ``<kind>/<name>``, or ``<kind>``
    for an entry that is the whole directory; a file is ``<prefix>/<path>`` (``<prefix>``
    itself for a file entry's one file, whose path is '')."""
    return f"{kind}/{name}" if name else kind


def entry_rule(entry: EntryRecord) -> EntryRule | None:
    """The layout rule of a directory entry's kind that names it (None for a file entry)."""
    if not entry.is_dir:
        return None
    parts = tuple(entry.name.split("/")) if entry.name else ()
    return kind(entry.kind).layout.entry_rule(parts, True)


def is_triton(entry: EntryRecord) -> bool:
    """Whether ``entry`` is a Triton-style directory (Triton's own cache, or Inductor's nested
    one): its group files name its children and are rewritten on restore."""
    rule = entry_rule(entry)
    return rule is not None and rule.complete == "triton"


def is_built_by_ninja(entry: EntryRecord) -> bool:
    """Whether ``entry``'s library runs ninja on it at each load (FlashInfer's ops)."""
    rule = entry_rule(entry)
    return rule is not None and rule.ninja


def content_digest(is_dir: bool, files: tuple[FileRecord, ...]) -> str:
    """sha256 of ``canonical_json({"type": ..., "files": [[path, size, sha256, mode], ...]})``,
    spelled out here because it runs for every entry of every archive (json.dumps of the
    same object costs several times more; tests check the two agree)."""
    return _digest(_files_json(files), is_dir)


def _digest(files_json: str, is_dir: bool) -> str:
    text = '{"files":%s,"type":"%s"}' % (files_json, "dir" if is_dir else "file")
    return hashlib.sha256(text.encode()).hexdigest()


def content_digest_of(files_json: str, is_dir: bool) -> str:
    """``content_digest`` of an entry whose file list ``files_json`` spells."""
    return _digest(files_json, is_dir)


def _compact_encoder() -> Callable[[Any], str]:
    """``json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)``, minus
    the setup ``json.dumps`` repeats per call (it is called once per entry)."""
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:                        # no C accelerator: the same text, more slowly
        return json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode
    encode = make(None, None, _json_str, None, ":", ",", True, False, True)
    return lambda obj: "".join(encode(obj, 0))


#: a FileRecord tuple as canonical JSON: ``[["path",size,"sha256",mode],...]``
_files_json = _compact_encoder()
# One file of a directory entry in that JSON, in the common case: a path of one component of
# at most NAME_MAX // 4 printable ASCII characters other than '"', '\\' and '/', not '.' or
# '..'; a non-negative integer size; 64 lowercase hex digits; mode 0644 or 0755.  (JSON spells
# every other character, and a bool, float or negative size, differently.)
_PLAIN_FILE = (r'\["(?!\.\.?")[\x20\x21\x23-\x2e\x30-\x5b\x5d-\x7f]{1,%d}",(?:0|[1-9][0-9]*),'
               r'"[0-9a-f]{64}",(?:420|493)\]' % (NAME_MAX // 4))
_PLAIN_FILES = re.compile(r"\[%s(?:,%s)*\]" % (_PLAIN_FILE, _PLAIN_FILE))
#: a FileRecord from a list of its four fields, in C (``FileRecord._make`` also counts them)
_file_record = file_record = functools.partial(tuple.__new__, FileRecord)


def files_json(files: Iterable[tuple[str, int, str, int]]) -> str:
    """An entry's file list, ``(path, size, sha256, mode)`` each, as the manifest spells it
    (``[["path",size,"sha256",mode],...]``: what its digest hashes)."""
    return _files_json(list(files))


def slow_content_digest(is_dir: bool, files: tuple[FileRecord, ...]) -> str:
    """The definition ``content_digest`` implements (for its test)."""
    return hashlib.sha256(canonical_json(
        {"type": "dir" if is_dir else "file", "files": [f.to_list() for f in files]})).hexdigest()


@dataclass(frozen=True)
class Manifest:
    """Fingerprint plus entries, sorted by (kind, name)."""

    fingerprint: Fingerprint
    entries: tuple[EntryRecord, ...]
    created_by: str = "sglang-warmup"

    @functools.cached_property
    def size(self) -> int:
        """Payload bytes (computed once: a restore asks for it several times)."""
        return sum(e.size for e in self.entries)

    @functools.cached_property
    def nb_files(self) -> int:
        return sum(len(e.files) for e in self.entries)

    @functools.cached_property
    def name_chars(self) -> int:
        """Characters of every member name, each counted as ``len(kind) + len(name) +
        len(path) + 2`` (the reader bounds the tar framing with it, once per range it reads)."""
        return sum(len(e.files) * (len(e.kind) + len(e.name) + 2) +
                   sum(len(f.path) for f in e.files) for e in self.entries)

    def members(self) -> Iterator[tuple[str, EntryRecord, FileRecord]]:
        """Every payload member in archive order."""
        for e in self.entries:
            for f in e.files:
                yield e.member(f), e, f

    def to_json(self, encoded: Sequence[str] | None = None) -> bytes:
        """The manifest's bytes: ``json.dumps(doc, sort_keys=True, separators=(",", ":"),
        ensure_ascii=False)`` plus a newline, assembled entry by entry so that each entry's
        file list is encoded once, for its digest and its place (tests check the two agree).
        ``json_size`` gives their length before any file is hashed.  ``encoded``: each entry's
        record as ``entry_json`` spells it, already made (pack's workers make them where they
        hash the files)."""
        kinds: dict[str, dict[str, int]] = {}
        for e in self.entries:
            k = kinds.setdefault(e.kind, {"entries": 0, "bytes": 0})
            k["entries"] += 1
            k["bytes"] += e.size
        before, after = _frame(self.fingerprint, self.created_by, kinds,
                               (len(self.entries), self.nb_files, self.size))
        if encoded is not None:
            if len(encoded) != len(self.entries):
                raise AssertionError("one record per entry")
            return (before + ",".join(encoded) + after).encode()
        parts = []
        for e in self.entries:
            files = _files_json(e.files)
            parts.append(entry_json(e.kind, e.name, e.is_dir, files, _digest(files, e.is_dir)))
        return (before + ",".join(parts) + after).encode()

    @classmethod
    def parse(cls, data: bytes, where: str = MANIFEST_NAME) -> "Manifest":
        """Parse and validate; an ArchiveError naming the offending field otherwise."""
        with paused_gc():
            return cls._parse(data, where)

    @classmethod
    def _parse(cls, data: bytes, where: str) -> "Manifest":
        try:
            doc = json.loads(data.decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as exc:
            raise ArchiveError(f"{where}: not valid JSON ({exc})", hint=_HINT) from None
        except RecursionError:
            raise ArchiveError(f"{where}: not valid JSON (nested too deeply)",
                               hint=_HINT) from None
        if not isinstance(doc, dict) or doc.get("format") != FORMAT:
            raise ArchiveError(f"{where}: not an sglang-warmup cache manifest", hint=_HINT)
        if doc.get("version") != VERSION:
            raise ArchiveError(f"{where}: unsupported version {doc.get('version')!r} "
                               f"(this sglang-warmup reads version {VERSION})",
                               hint="use the sglang-warmup release that wrote the archive")
        try:
            fp = Fingerprint.from_dict(doc.get("fingerprint"), f"{where}: fingerprint")
        except ArchiveError:
            raise
        except CacheError as exc:  # Fingerprint.from_dict's, named by its field
            raise ArchiveError(str(exc), hint=_HINT) from None
        raw_entries = doc.get("entries")
        if not isinstance(raw_entries, list):
            raise ArchiveError(f"{where}: entries: expected a list", hint=_HINT)
        entries = [parse_entry(e, f"{where}: entries[{i}]") for i, e in enumerate(raw_entries)]
        keys = [(e.kind, e.name) for e in entries]
        if keys != sorted(keys):
            raise ArchiveError(f"{where}: entries are not sorted by kind and name", hint=_HINT)
        for a, b in zip(keys, keys[1:]):
            if a == b:
                raise ArchiveError(f"{where}: entry {a[0]}:{a[1]} is listed twice", hint=_HINT)
        check_overlaps(entries, where)
        created_by = doc.get("created_by", "")
        return cls(fp, tuple(entries), created_by if isinstance(created_by, str) else "")


#: one entry of the manifest's JSON: files, kind, name, digest, type (keys sorted)
_ENTRY = '{"files":%s,"kind":%s,"name":%s,"sha256":"%s","type":"%s"}'


def entry_json(kind: str, name: str, is_dir: bool, files_json: str, digest: str) -> str:
    """One entry's record in the manifest's JSON, its file list spelled by ``files_json``."""
    return _ENTRY % (files_json, _json_str(kind), _json_str(name), digest,
                     "dir" if is_dir else "file")


def _frame(fingerprint: Fingerprint, created_by: str, kinds: dict[str, dict[str, int]],
           totals: tuple[int, int, int]) -> tuple[str, str]:
    """The manifest's JSON before its first entry and after its last one."""
    doc = {"format": FORMAT, "version": VERSION, "created_by": created_by,
           "fingerprint": fingerprint.to_dict(),
           "totals": {"entries": totals[0], "files": totals[1], "bytes": totals[2]},
           "kinds": kinds, "entries": []}
    before, mark, after = _files_json(doc).partition('"entries":[]')
    assert mark, "a key sorted before 'entries' spelled the mark"
    return before + '"entries":[', "]" + after + "\n"


def json_size(fingerprint: Fingerprint, created_by: str,
              entries: Iterable[tuple[str, str, bool, Iterable[tuple[str, int, int]]]]) -> int:
    """The length in bytes of ``Manifest(fingerprint, entries, created_by).to_json()`` for
    entries given as (kind, name, is_dir, their files' (path, size, mode)), whatever the files'
    sha256s: every hash, and every entry's digest, is 64 hex digits.  Pack leaves this much
    room for the manifest before it reads a file; counted from names, sizes and modes without
    building the text (tests check it against ``to_json``)."""
    kinds: dict[str, dict[str, int]] = {}
    nb_entries = nb_files = nbytes = 0
    body = 0
    for k, name, is_dir, files in entries:
        count = size = text = 0
        for path, fsize, mode in files:
            # ["<path>",<size>,"<64 hex digits>",<mode>]: 71 bytes besides path, size and mode
            text += len(_json_str(path).encode()) + len(str(fsize)) + len(str(mode)) + 71
            size += fsize
            count += 1
        text += max(count - 1, 0)                          # the commas between files
        kd = kinds.setdefault(k, {"entries": 0, "bytes": 0})
        kd["entries"] += 1
        kd["bytes"] += size
        body += len((_ENTRY % ("[]", _json_str(k), _json_str(name), "", "dir" if is_dir else
                               "file")).encode()) + 64 + text
        nb_entries += 1
        nb_files += count
        nbytes += size
    before, after = _frame(fingerprint, created_by, kinds, (nb_entries, nb_files, nbytes))
    return len(before.encode()) + body + max(nb_entries - 1, 0) + len(after.encode())


def parse_entry(raw: Any, where: str) -> EntryRecord:
    """Validate one entry object (also used for records in the shared store)."""
    if not isinstance(raw, dict):
        raise ArchiveError(f"{where}: expected an object", hint=_HINT)
    k = raw.get("kind")
    if k not in KIND_NAMES:
        raise ArchiveError(f"{where}: unknown kind {k!r}", hint=_HINT)
    name = raw.get("name")
    typ = raw.get("type")
    if not isinstance(name, str) or typ not in ("dir", "file"):
        raise ArchiveError(f"{where}: name must be a string and type 'dir' or 'file'", hint=_HINT)
    parts = tuple(name.split("/")) if name else ()
    _check_parts(parts, name, f"{where}: name")
    is_dir = typ == "dir"
    rule = kind(k).layout.entry_rule(parts, is_dir)
    if rule is None:
        raise ArchiveError(f"{where}: {name!r} is not where a {k} entry can be", hint=_HINT)
    raw_files = raw.get("files")
    if not isinstance(raw_files, list) or not raw_files:
        raise ArchiveError(f"{where}: files: expected a non-empty list", hint=_HINT)
    # The common case, checked on the list's canonical JSON (which the digest needs anyway)
    # by one regular expression; anything unusual gets the detailed check, file by file.
    # Any path this short is within every name limit (bytes are at most 4 per character).
    files_json = None
    if is_dir and len(k) + len(name) < PATH_MAX // 4 - 80:
        try:
            files_json = _files_json(raw_files)
        except (TypeError, ValueError, RecursionError):
            pass                        # not JSON-shaped: the detailed check says what is wrong
    if files_json is not None and _PLAIN_FILES.fullmatch(files_json):
        files = list(map(_file_record, raw_files))     # four fields each: the pattern says so
    else:
        files_json = None
        files = [_parse_file(rf, is_dir, f"{k}/{name}", f"{where}.files[{j}]")
                 for j, rf in enumerate(raw_files)]
    paths = [f.path for f in files]
    if paths != sorted(set(paths)):
        raise ArchiveError(f"{where}: files are not sorted or not unique", hint=_HINT)
    if not is_dir and len(files) != 1:
        raise ArchiveError(f"{where}: a file entry has exactly one file", hint=_HINT)
    problem = layout_problem(rule, parts, paths, is_dir)
    if problem:
        raise ArchiveError(f"{where}: {k} entry {name!r} is incomplete: {problem}",
                           hint="an incomplete entry would block the complete one; pack or "
                                "push again from a complete cache")
    if rule.complete == "triton":
        for j, f in enumerate(files):
            if f.size > MAX_GROUP_BYTES and is_group(f.path):
                raise ArchiveError(f"{where}.files[{j}]: Triton group file of {f.size} bytes "
                                   f"exceeds the limit of {MAX_GROUP_BYTES} bytes", hint=_HINT)
    record = EntryRecord(k, name, is_dir, tuple(files))
    if files_json is not None:          # the text the digest hashes: the files as FileRecords
        record.__dict__["digest"] = _digest(files_json, is_dir)
    if "sha256" in raw and raw["sha256"] != record.digest:
        raise ArchiveError(f"{where}: sha256 does not match its files", hint=_HINT)
    return record


def _parse_file(rf: Any, is_dir: bool, entry: str, fw: str) -> FileRecord:
    if not (isinstance(rf, list) and len(rf) == 4):
        raise ArchiveError(f"{fw}: expected [path, size, sha256, mode]", hint=_HINT)
    path, size, sha, mode = rf
    if not isinstance(path, str):
        raise ArchiveError(f"{fw}: path must be a string", hint=_HINT)
    if is_dir:
        _check_parts(tuple(path.split("/")), path, f"{fw}: path")
    elif path != "":
        raise ArchiveError(f"{fw}: a file entry has exactly one file with path ''", hint=_HINT)
    member = f"{entry}/{path}" if path else entry
    if len(member) > PATH_MAX // 4 and len(member.encode()) > PATH_MAX:
        raise ArchiveError(f"{fw}: member name longer than {PATH_MAX} bytes", hint=_HINT)
    if type(size) is not int or size < 0:
        raise ArchiveError(f"{fw}: size must be a non-negative integer", hint=_HINT)
    if type(sha) is not str or not _HEX64.fullmatch(sha):
        raise ArchiveError(f"{fw}: sha256 must be 64 lowercase hex digits", hint=_HINT)
    if type(mode) is not int or mode not in MODES:
        raise ArchiveError(f"{fw}: mode must be 420 (0644) or 493 (0755)", hint=_HINT)
    return FileRecord(path, size, sha, mode)


def check_overlaps(entries: Iterable[EntryRecord], where: str) -> None:
    """Refuse two entries of one kind where one lies inside the other: committing the outer
    one would carry the inner one's files along (nothing is written before this check)."""
    names: dict[str, set[str]] = {}
    for e in entries:
        names.setdefault(e.kind, set()).add(e.name)
    for k, found in names.items():
        for name in sorted(found):
            parts = name.split("/") if name else []
            for depth in range(len(parts)):
                outer = "/".join(parts[:depth])
                if outer in found:
                    raise ArchiveError(f"{where}: entries {k}:{outer} and {k}:{name} overlap "
                                       f"({name!r} lies inside {outer!r})",
                                       hint="the archive or store is corrupt or hostile; "
                                            "nothing was written")


def _check_parts(parts: tuple[str, ...], text: str, where: str) -> None:
    for p in parts:
        if p in ("", ".", "..") or "\\" in p or "\x00" in p:
            raise ArchiveError(f"{where} {text!r}: not a plain relative path", hint=_HINT)
    try:
        size = len(text.encode("utf-8"))
    except UnicodeEncodeError:
        raise ArchiveError(f"{where} {text!r}: not valid UTF-8 (a lone surrogate)",
                           hint=_HINT) from None
    if size > NAME_MAX and max(len(p.encode()) for p in parts) > NAME_MAX:
        raise ArchiveError(f"{where} {text[:60]!r}...: a path component is longer than "
                           f"{NAME_MAX} bytes", hint=_HINT)
