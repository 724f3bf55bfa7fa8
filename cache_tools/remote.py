"""A shared store for fleets: push complete cache entries to Redis, pull them on other nodes.

Keys (``<ns>`` defaults to ``sglang-warmup``, ``<fp>`` is the toolchain hash of fingerprint.py):

* ``<ns>:<fp>:meta`` - the fingerprint (JSON), written once;
* ``<ns>:<fp>:<kind>:<entry>`` - the entry record (files, sizes, sha256; its content hash),
  written with ``SET NX``: the first node to publish an entry defines it, nobody overwrites it;
* ``<ns>:<fp>:blob:<content sha256>`` - the entry's files as a small deterministic tar, also
  ``SET NX``; identical content is stored once (content-addressed);
* ``<ns>:<fp>:index`` - a set of ``<kind>:<entry>``, added to after blob and record exist.

Pull verifies every byte against the record before anything is moved into place, with the same
staged, atomic install as ``cache restore`` (including the Triton group rewrite).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

from cache_tools import fingerprint as fp_mod
from cache_tools import groups, tarfmt
from cache_tools.archive import read_entry
from cache_tools.errors import ArchiveError, RemoteError, os_errors
from cache_tools.fingerprint import Compatibility, Fingerprint
from cache_tools.locations import Location
from cache_tools.manifest import EntryRecord, check_overlaps, is_triton, parse_entry
from cache_tools.progress import Progress
from cache_tools.restore import (EntryPlanView, PlannedEntry, RestoreResult, plan_entry,
                                 restore_roots)
from cache_tools.scan import CacheWarning, scan
from cache_tools.staging import Installer, Outcome

NAMESPACE = "sglang-warmup"
#: Redis strings hold at most 512 MiB; entries above this are skipped with a warning
MAX_ENTRY_BYTES = 256 << 20
_HINT_REMOTE = "the shared store holds damaged or foreign data; delete the key and push again"


def connect(url: str):
    """A Redis client for ``url`` (redis://, rediss://, unix://), checked with PING."""
    try:
        import redis
    except ImportError:
        raise RemoteError("the redis package is needed for push/pull",
                          hint="pip install 'sglang-warmup[redis]' (or redis)") from None
    try:
        client = redis.Redis.from_url(url, socket_timeout=30, socket_connect_timeout=10)
        client.ping()
    except ValueError as exc:
        raise RemoteError(f"--url {url!r}: {exc}",
                          hint="write redis://HOST:PORT/DB (or rediss://, unix://)") from None
    except redis.exceptions.RedisError as exc:
        raise RemoteError(f"cannot reach Redis at {url}: {exc}",
                          hint="check the URL, that Redis runs, and that this host may connect"
                          ) from None
    return client


class _Store:
    """The Redis client, with the few calls push and pull make."""

    def __init__(self, client: Any, url: str) -> None:
        self.client = client
        self.url = url

    def get(self, key: str) -> bytes | None:
        return self.client.get(key)

    def mget(self, keys: list[str]) -> list[bytes | None]:
        return self.client.mget(keys) if keys else []

    def set(self, key: str, value: bytes | str, nx: bool = True) -> Any:
        return self.client.set(key, value, nx=nx)

    def sadd(self, key: str, member: str) -> Any:
        return self.client.sadd(key, member)

    def members(self, key: str) -> list[str]:
        return sorted(m.decode() if isinstance(m, bytes) else m
                      for m in self.client.smembers(key))


def _prefix(namespace: str, fp_hash: str) -> str:
    return f"{namespace}:{fp_hash}"


def entry_blob(record: EntryRecord, datas: list[bytes]) -> bytes:
    """The entry's files as a deterministic tar (members named by path within the entry,
    ``_`` for a file entry)."""
    out = io.BytesIO()
    for f, data in zip(record.files, datas):
        out.write(tarfmt.header(f.path or "_", f.size, f.mode))
        out.write(data)
        out.write(tarfmt.padding(f.size))
    out.write(tarfmt.end(out.tell()))
    return out.getvalue()


@dataclass(frozen=True)
class PushResult:
    """What ``push`` did."""

    namespace: str
    pushed: int
    present: int
    bytes_sent: int
    #: entries the store already holds with different content (the store's copy is kept)
    conflicts: tuple[str, ...]
    #: entries larger than the per-entry limit (not pushed)
    too_large: tuple[str, ...]
    warnings: tuple[CacheWarning, ...]
    seconds: float


def push(url: str, locations: Iterable[Location], *, namespace: str = NAMESPACE,
         fingerprint: Fingerprint | None = None, max_entry_bytes: int = MAX_ENTRY_BYTES,
         progress: Progress | None = None, client: Any = None) -> PushResult:
    """Publish every complete local entry that the store does not hold yet."""
    with os_errors("push", "check that the cache files are readable"):
        return _push(url, list(locations), namespace, fingerprint, max_entry_bytes,
                     progress or Progress.null(), client)


def _push(url: str, locations: list[Location], namespace: str, fingerprint: Fingerprint | None,
          max_entry_bytes: int, progress: Progress, client: Any) -> PushResult:
    started = time.monotonic()
    fp = fingerprint or fp_mod.current()
    r = _Store(client or connect(url), url)
    info = scan(list(locations))
    warnings = list(info.warnings)
    entries = sorted((e for e in info.entries if e.complete), key=lambda e: (e.kind, e.name))
    prefix = _prefix(namespace, fp.hash)
    r.set(f"{prefix}:meta", json.dumps(fp.to_dict(), sort_keys=True))
    keys = [f"{prefix}:{e.kind}:{e.name}" for e in entries]
    existing = r.mget(keys)
    pushed = present = sent = 0
    conflicts: list[str] = []
    too_large: list[str] = []
    progress.start("push", sum(e.size_on_disk for e in entries))
    for e, key, raw in zip(entries, keys, existing):
        name = f"{e.kind}:{e.name}"
        if raw is None and e.size_on_disk > max_entry_bytes:
            too_large.append(name)
            continue
        try:
            rec, datas = read_entry(e)
        except FileNotFoundError:
            warnings.append(CacheWarning(e.kind, e.path, "vanished while pushing (pruned or "
                                                         "replaced); skipped"))
            continue
        if raw is None:
            blob = entry_blob(rec, datas)
            r.set(f"{prefix}:blob:{rec.digest}", blob)
            if r.set(key, json.dumps(rec.to_dict(), sort_keys=True)):
                r.sadd(f"{prefix}:index", rec.key)
                pushed += 1
                sent += len(blob)
                progress.advance(e.size_on_disk)
                continue
            raw = r.get(key)  # another node published it first
        if _digest_of(raw) == rec.digest:
            r.sadd(f"{prefix}:index", rec.key)  # heal an index left behind by a killed push
            present += 1
        else:
            conflicts.append(rec.key)
        progress.advance(e.size_on_disk)
    progress.finish()
    return PushResult(f"{prefix}", pushed, present, sent, tuple(conflicts), tuple(too_large),
                      tuple(warnings), time.monotonic() - started)


def _digest_of(raw: bytes | None) -> str | None:
    try:
        return json.loads(raw)["sha256"] if raw is not None else None
    except (ValueError, KeyError, TypeError):
        return None


@dataclass(frozen=True)
class PullPlan(EntryPlanView):
    """What a pull would do; nothing has been written yet.  ``execute()`` does it."""

    url: str
    namespace: str
    fingerprint: Fingerprint | None
    compatibility: Compatibility | None
    roots: Mapping[str, Path]
    items: tuple[PlannedEntry, ...]
    max_entry_bytes: int = MAX_ENTRY_BYTES
    client: Any = field(default=None, compare=False, repr=False)

    def execute(self, *, progress: Progress | None = None,
                on_entry: Callable[[Outcome], None] | None = None) -> RestoreResult:
        """Fetch and verify every entry to write into staging, then move each into place."""
        with os_errors("pull", "check free space and permissions of the destination; no "
                               "partial entry is visible, rerun to finish"):
            return self._execute(progress or Progress.null(), on_entry)

    def _execute(self, progress: Progress, on_entry: Callable[[Outcome], None] | None
                 ) -> RestoreResult:
        started = time.monotonic()
        installer = Installer(self.roots)
        installer.clean_stale()
        outcomes: list[Outcome] = []
        fetched = 0
        try:
            to_write = self.to_write
            if to_write:
                r = _Store(self.client or connect(self.url), self.url)
            progress.start("pull", self.bytes_to_write)
            for item in to_write:
                rec = item.entry
                where = f"{self.namespace}:blob:{rec.digest}"
                blob = r.get(where)
                if blob is None:
                    raise RemoteError(f"{where}: missing (entry {rec.key} is indexed)",
                                      hint=_HINT_REMOTE)
                if len(blob) > self.max_entry_bytes + 2048 * (len(rec.files) + 8):
                    raise RemoteError(f"{where}: {len(blob)} bytes exceeds the per-entry limit",
                                      hint=_HINT_REMOTE)
                fetched += len(blob)
                _stage_blob(installer, rec, item.target, blob, where)  # type: ignore[arg-type]
                progress.advance(rec.size)
            progress.finish()
            outcomes.extend(installer.commit_all(on_entry))
        finally:
            installer.cleanup()
        return RestoreResult(tuple(outcomes), time.monotonic() - started, fetched)


def _stage_blob(installer: Installer, rec: EntryRecord, target: Path, blob: bytes,
                where: str) -> None:
    """Check a blob completely (names, sizes, sha256, Triton groups) and only then stage it."""
    chunks = [blob]
    tar = tarfmt.TarStream(lambda n: chunks.pop() if chunks else b"",
                           max_header_bytes=64 << 10, chunk=len(blob) or 1)
    triton = is_triton(rec)
    paths = {f.path for f in rec.files}
    datas: list[bytes | memoryview] = []
    try:
        for f in rec.files:
            expected = f.path or "_"
            h = tar.next_header()
            if h is None or h.name != expected or h.typeflag not in (b"0", b"\0") or \
                    h.sparse or h.size != f.size:
                raise RemoteError(f"{where}: files do not match the record of {rec.key}",
                                  hint=_HINT_REMOTE)
            data = tar.data(f.size)
            if hashlib.sha256(data).hexdigest() != f.sha256:
                raise RemoteError(f"{where}: file {expected!r} of {rec.key} fails its sha256 "
                                  "check", hint=_HINT_REMOTE)
            if triton and groups.is_group(f.path):
                try:
                    children = groups.check(data, f.path, paths, rec.key)
                except ArchiveError as exc:
                    raise RemoteError(f"{where}: {exc.message}", hint=_HINT_REMOTE) from None
                data = groups.relocate(children, target)
            datas.append(data)
        if tar.next_header() is not None or tar.rest_is_zero() is not None:
            raise RemoteError(f"{where}: files do not match the record of {rec.key}",
                              hint=_HINT_REMOTE)
    except tarfmt.TarFormatError as exc:
        raise RemoteError(f"{where}: not a valid entry blob ({exc.reason})",
                          hint=_HINT_REMOTE) from None
    staged = installer.stage(rec)
    try:
        for f, data in zip(rec.files, datas):
            staged.write(f, data)
    finally:
        staged.close()


def plan_pull(url: str, *, dest: str | os.PathLike[str] | None = None,
              kinds: Iterable[str] | None = None, fingerprint_hash: str | None = None,
              namespace: str = NAMESPACE, force: bool = False,
              env: Mapping[str, str] | None = None, local: Fingerprint | None = None,
              client: Any = None) -> PullPlan:
    """List what the store holds for a toolchain and compare it with the destination.
    Every record is validated as an archive's manifest entries are (layout, completeness, no
    overlaps)."""
    local = local or fp_mod.current()
    r = _Store(client or connect(url), url)
    prefix = _prefix(namespace, fingerprint_hash or local.hash)
    raw_meta = r.get(f"{prefix}:meta")
    members = r.members(f"{prefix}:index")
    if raw_meta is None:
        if members:
            raise RemoteError(f"{prefix}:meta: missing while {len(members)} entries are indexed",
                              hint=_HINT_REMOTE)
        return PullPlan(url, prefix, None, None, {}, (), client=r.client)
    try:
        remote_fp = Fingerprint.from_dict(json.loads(raw_meta), f"{prefix}:meta")
    except ValueError:
        raise RemoteError(f"{prefix}:meta: not valid JSON", hint=_HINT_REMOTE) from None
    compat = fp_mod.require_compatible(remote_fp, local, force=force,
                                       what=f"the shared store {prefix}")
    wanted = set(kinds) if kinds is not None else None
    members = [m for m in members if wanted is None or m.split(":", 1)[0] in wanted]
    raws = r.mget([f"{prefix}:{m}" for m in members])
    records: list[EntryRecord] = []
    for m, raw in zip(members, raws):
        where = f"{prefix}:{m}"
        if raw is None:
            raise RemoteError(f"{where}: indexed but missing", hint=_HINT_REMOTE)
        try:
            rec = parse_entry(json.loads(raw), where)
        except ValueError:
            raise RemoteError(f"{where}: not valid JSON", hint=_HINT_REMOTE) from None
        except ArchiveError as exc:
            raise RemoteError(exc.message, hint=_HINT_REMOTE) from None
        if rec.key != m:
            raise RemoteError(f"{where}: the record describes {rec.key}", hint=_HINT_REMOTE)
        records.append(rec)
    try:
        check_overlaps(records, f"{prefix}:index")
    except ArchiveError as exc:
        raise RemoteError(exc.message, hint=_HINT_REMOTE) from None
    roots = restore_roots((rec.kind for rec in records), dest, env)
    present = {k: v for k, v in roots.items() if v is not None}
    items = tuple(plan_entry(rec, roots.get(rec.kind)) for rec in records)
    return PullPlan(url, prefix, remote_fp, compat, present, items, client=r.client)
