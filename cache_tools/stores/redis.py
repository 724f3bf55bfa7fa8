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
from cache_tools.archive import groups
from cache_tools.archive import tarfmt
from cache_tools.archive import read_entry
from cache_tools.errors import ArchiveError, CacheError, RemoteError, os_errors, printable
from cache_tools.fingerprint import Compatibility, Fingerprint
from cache_tools.locations import Location
from cache_tools.archive.manifest import EntryRecord, check_overlaps, is_triton, parse_entry
from cache_tools.progress import Progress
from cache_tools.archive.restore import (EntryPlanView, PlannedEntry, RestoreResult, plan_entry,
                                 restore_roots)
from cache_tools.scan import CacheWarning, scan
from cache_tools.archive.staging import Installer, Outcome, clean_roots, refuse_links
from cache_tools.stores import REDIS_NAMESPACE

#: Redis strings hold at most 512 MiB; entries above this are skipped with a warning
MAX_ENTRY_BYTES = 256 << 20
#: an entry record above this is refused before it is fetched
MAX_RECORD_BYTES = 16 << 20
#: the fingerprint record above this is refused before it is fetched
MAX_META_BYTES = 1 << 20
#: an index with more members than this is refused before it is fetched
MAX_INDEX_ENTRIES = 2_000_000
_HINT_REMOTE = "the shared store holds damaged or foreign data; delete the key and push again"


def connect(url: str, *, timeout_s: float = 30.0) -> Any:
    """A Redis client for ``url`` (redis://, rediss://, unix://), checked with PING."""
    try:
        import redis
    except ImportError:
        raise RemoteError("the redis package is needed for push/pull",
                          hint="pip install 'sglang-warmup[redis]' (or redis)") from None
    try:
        client = redis.Redis.from_url(url, socket_timeout=timeout_s,
                                      socket_connect_timeout=min(timeout_s, 10.0))
    except ValueError as exc:
        raise RemoteError(f"--url {safe_url(url)!r}: {exc}",
                          hint="write redis://HOST:PORT/DB (or rediss://, unix://)") from None
    _Store(client, url).call("PING", "", client.ping)
    return client


def safe_url(url: str) -> str:
    """``url`` with its password replaced by ``***`` (error lines are logged)."""
    from urllib.parse import urlsplit, urlunsplit

    try:
        parts = urlsplit(url)
        if parts.password is None:
            return url
        host = parts.hostname or ""
        netloc = f"{parts.username or ''}:***@{host}" + (f":{parts.port}" if parts.port else "")
        return urlunsplit(parts._replace(netloc=netloc))
    except ValueError:
        return "<the --url>"


def _redis_error(exc: Exception, url: str, command: str, key: str) -> RemoteError:
    """One line for any Redis failure: what, where, and the fix."""
    import redis.exceptions as rx

    url = safe_url(url)
    text = printable(" ".join(str(exc).split())[:300] or type(exc).__name__)
    at = f" ({command} {key})" if key else ""
    if isinstance(exc, (rx.AuthenticationError, rx.AuthorizationError)) or \
            text.startswith(("NOAUTH", "WRONGPASS", "invalid username-password")):
        return RemoteError(f"Redis at {url} refused the credentials{at}: {text}",
                           hint="give them in the URL: redis://USER:PASSWORD@HOST:PORT/DB "
                                "(or redis://:PASSWORD@HOST:PORT/DB)")
    if isinstance(exc, rx.NoPermissionError) or text.startswith("NOPERM"):
        return RemoteError(f"Redis at {url} does not allow {command} {key}: {text}",
                           hint="grant this user read (pull) or read and write (push) access to "
                                "the namespace's keys")
    if isinstance(exc, rx.TimeoutError):
        return RemoteError(f"Redis at {url} did not answer in time{at}: {text}",
                           hint="check the network and the server's load, then rerun (nothing "
                                "partial was installed)")
    if isinstance(exc, rx.ConnectionError):
        if command == "PING":
            return RemoteError(f"cannot reach Redis at {url}: {text}",
                               hint="check the URL, that Redis runs, and that this host may "
                                    "connect")
        return RemoteError(f"lost the connection to Redis at {url}{at}: {text}",
                           hint="check the network and the server, then rerun (nothing "
                                "partial was installed)")
    if text.startswith("WRONGTYPE"):
        return RemoteError(f"{key}: holds another Redis type than sglang-warmup writes "
                           f"({text})", hint=_HINT_REMOTE)
    return RemoteError(f"Redis at {url} refused {command} {key}: {text}",
                       hint="see the server's message (memory limit, read-only replica, ...)")


class _Store:
    """The Redis client with every failure turned into a RemoteError naming the key."""

    def __init__(self, client: Any, url: str) -> None:
        self.client = client
        self.url = url

    def call(self, command: str, key: str, fn: Callable[..., Any], *args: Any, **kw: Any) -> Any:
        try:
            return fn(*args, **kw)
        except Exception as exc:  # redis's own errors, by module (redis is imported lazily)
            if type(exc).__module__.split(".")[0] != "redis":
                raise
            raise _redis_error(exc, self.url, command, key) from None

    def get(self, key: str, limit: int) -> bytes | None:
        """GET, refusing a value above ``limit`` bytes before it is transferred."""
        size = self.call("STRLEN", key, self.client.strlen, key)
        if size > limit:
            raise RemoteError(f"{key}: {size} bytes exceeds the limit of {limit} bytes",
                              hint=_HINT_REMOTE)
        value: bytes | None = self.call("GET", key, self.client.get, key)
        return value

    def mget(self, keys: list[str], limit: int) -> list[bytes | None]:
        if not keys:
            return []
        pipe = self.client.pipeline(transaction=False)
        for k in keys:
            pipe.strlen(k)
        sizes = self.call("STRLEN", keys[0], pipe.execute, raise_on_error=False)
        for k, size in zip(keys, sizes):
            if isinstance(size, Exception):
                raise _redis_error(size, self.url, "STRLEN", k)
            if size > limit:
                raise RemoteError(f"{k}: {size} bytes exceeds the limit of {limit} bytes",
                                  hint=_HINT_REMOTE)
        values: list[bytes | None] = self.call("MGET", keys[0], self.client.mget, keys)
        return values

    def set(self, key: str, value: bytes | str, nx: bool = True) -> Any:
        return self.call("SET", key, self.client.set, key, value, nx=nx)

    def sadd(self, key: str, member: str) -> Any:
        return self.call("SADD", key, self.client.sadd, key, member)

    def members(self, key: str) -> list[str]:
        size = self.call("SCARD", key, self.client.scard, key)
        if size > MAX_INDEX_ENTRIES:
            raise RemoteError(f"{key}: {size} members exceeds the limit of "
                              f"{MAX_INDEX_ENTRIES}", hint=_HINT_REMOTE)
        out = []
        for m in self.call("SMEMBERS", key, self.client.smembers, key):
            try:
                out.append(m.decode("utf-8") if isinstance(m, bytes) else m)
            except UnicodeDecodeError:
                raise RemoteError(f"{key}: member {m[:80]!r} is not UTF-8",
                                  hint=_HINT_REMOTE) from None
        return sorted(out)


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


def push(url: str, locations: Iterable[Location], *, namespace: str = REDIS_NAMESPACE,
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
    existing = r.mget(keys, MAX_RECORD_BYTES)
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
            raw = r.get(key, MAX_RECORD_BYTES)  # another node published it first
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
    except (ValueError, KeyError, TypeError, RecursionError):
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
                blob = r.get(where, self.max_entry_bytes + 2048 * (len(rec.files) + 8))
                if blob is None:
                    raise RemoteError(f"{where}: missing (entry {rec.key} is indexed)",
                                      hint=_HINT_REMOTE)
                fetched += len(blob)
                _stage_blob(installer, rec, item.target,  # type: ignore[arg-type]  # an entry to write has a target
                            blob, where)
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
            data: bytes | memoryview = tar.data(f.size)
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
              namespace: str = REDIS_NAMESPACE, force: bool = False,
              env: Mapping[str, str] | None = None, local: Fingerprint | None = None,
              client: Any = None) -> PullPlan:
    """List what the store holds for a toolchain and compare it with the destination.
    Every record is validated as an archive's manifest entries are (layout, completeness, no
    overlaps); leftovers of killed restores and pulls in the destination are removed."""
    local = local or fp_mod.current()
    r = _Store(client or connect(url), url)
    prefix = _prefix(namespace, fingerprint_hash or local.hash)
    raw_meta = r.get(f"{prefix}:meta", MAX_META_BYTES)
    members = r.members(f"{prefix}:index")
    if raw_meta is None:
        if members:
            raise RemoteError(f"{prefix}:meta: missing while {len(members)} entries are indexed",
                              hint=_HINT_REMOTE)
        return PullPlan(url, prefix, None, None, {}, (), client=r.client)
    try:
        remote_fp = Fingerprint.from_dict(json.loads(raw_meta), f"{prefix}:meta")
    except (ValueError, RecursionError):
        raise RemoteError(f"{prefix}:meta: not valid JSON", hint=_HINT_REMOTE) from None
    except CacheError as exc:
        raise RemoteError(exc.message, hint=_HINT_REMOTE) from None
    compat = fp_mod.require_compatible(remote_fp, local, force=force,
                                       what=f"the shared store {prefix}")
    wanted = set(kinds) if kinds is not None else None
    members = [m for m in members if wanted is None or m.split(":", 1)[0] in wanted]
    raws = r.mget([f"{prefix}:{m}" for m in members], MAX_RECORD_BYTES)
    records: list[EntryRecord] = []
    for m, raw in zip(members, raws):
        where = f"{prefix}:{m}"
        if raw is None:
            raise RemoteError(f"{where}: indexed but missing", hint=_HINT_REMOTE)
        try:
            rec = parse_entry(json.loads(raw), where)
        except (ValueError, RecursionError):
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
    refuse_links(present, records, dest)
    clean_roots(present.values())
    items = tuple(plan_entry(rec, roots.get(rec.kind)) for rec in records)
    return PullPlan(url, prefix, remote_fp, compat, present, items, client=r.client)
