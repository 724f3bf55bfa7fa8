"""Ninja's records of a restored FlashInfer op, so that ninja does not build it again.

FlashInfer runs ninja on the op's ``build.ninja`` every time it loads a JIT op: in the op's
own directory (FlashInfer 0.6) or in the JIT directory that holds every op (earlier ones).
Ninja rebuilds an output it has no record of: its build log (``.ninja_log``, the hash of the
command that made each output) and its deps log (``.ninja_deps``, the headers each object
read) in that working directory name every output by its absolute path, which a restore under
another directory changes (and in the JIT directory no archive carries them at all).
Measured on the H200: every launch from a restored prebake rebuilt FlashInfer's ``norm`` op
(two nvcc objects) before it could serve; loaded alone, its first call took 34 s restored
against 31 s in the bake.

After a FlashInfer op is installed, :func:`record_op` writes what ninja would have written had
it built the op there: the op's ``build.ninja`` with the bake's workspace paths replaced by
this one's (the text FlashInfer 0.6 writes when it loads the op, which its
``write_if_different`` then keeps), the outputs' times in build order, one build-log line per output with
the hash of its command as ninja evaluates it, one deps record per compiled object naming the
headers its compile read (taken from the bake's deps log, moved with the op), all appended to
the records the op carried.  An op that carried no records of its own (a FlashInfer that keeps
them in the JIT directory), or whose sources or headers are not all here, is left as it is:
ninja builds it again, as it would have.

The formats are learned from the ninja installed here, not assumed: :func:`probe` runs it once
on a one-line build of our own in a scratch directory and keeps the build-log version, the
command hash (MurmurHash64A in logs v5 and v6, rapidhash in v7: whichever reproduces the hash
ninja wrote) and the deps-log version (4).  Without a ninja, or with one whose formats we do
not reproduce, nothing is written and the op is rebuilt at its first load, as before.  The
archive's ``build.ninja`` is data: parsed here, never run; ninja runs only on our own build.
"""

from __future__ import annotations

import errno
import functools
import os
import re
import stat
import struct
import time
from dataclasses import dataclass
from pathlib import Path

from cache_tools import atomic, inputfile
from cache_tools.ninja_build import Edge, Unsupported, parse

#: build.ninja files above this are not FlashInfer's (theirs are a few KiB)
MAX_BUILD_FILE = 1 << 20
#: a deps log above this is left alone (one op adds a few hundred bytes)
MAX_DEPS_LOG = 64 << 20
_DEPS_MAGIC = b"# ninjadeps\n"
_LOG_HEADER = re.compile(rb"# ninja log v(\d+)\n")
_M64 = (1 << 64) - 1


# --- the two command hashes ninja has used ----------------------------------------------------
def murmur64a(data: bytes, seed: int = 0xDECAFBADDECAFBAD) -> int:
    """MurmurHash64A, ninja's command hash in build logs v5 and v6."""
    m, r = 0xC6A4A7935BD1E995, 47
    h = (seed ^ (len(data) * m)) & _M64
    whole = len(data) // 8
    for i in range(whole):
        k = (int.from_bytes(data[8 * i:8 * i + 8], "little") * m) & _M64
        k = ((k ^ (k >> r)) * m) & _M64
        h = ((h ^ k) * m) & _M64
    tail = data[8 * whole:]
    if tail:
        h = ((h ^ int.from_bytes(tail, "little")) * m) & _M64
    h = ((h ^ (h >> r)) * m) & _M64
    return h ^ (h >> r)


_RAPID_SECRET = (0x2D358DCCAA6C78A5, 0x8BB84B93962EACC9, 0x4B33A62ED433D4A3)


def _mum(a: int, b: int) -> tuple[int, int]:
    r = a * b
    return r & _M64, r >> 64


def _mix(a: int, b: int) -> int:
    lo, hi = _mum(a, b)
    return lo ^ hi


def rapidhash(data: bytes, seed: int = 0xBDD89AA982704029) -> int:
    """rapidhash (V1, default secrets), ninja's command hash in build log v7."""
    s, n = _RAPID_SECRET, len(data)

    def r64(i: int) -> int:
        return int.from_bytes(data[i:i + 8], "little")

    def r32(i: int) -> int:
        return int.from_bytes(data[i:i + 4], "little")

    seed ^= _mix(seed ^ s[0], s[1]) ^ n
    if n <= 16:
        if n >= 4:
            delta = (n & 24) >> (n >> 3)
            a = (r32(0) << 32) | r32(n - 4)
            b = (r32(delta) << 32) | r32(n - 4 - delta)
        elif n > 0:
            a, b = (data[0] << 56) | (data[n >> 1] << 32) | data[n - 1], 0
        else:
            a = b = 0
    else:
        i, o = n, 0
        if i > 48:
            see1 = see2 = seed
            while i >= 48:
                seed = _mix(r64(o) ^ s[0], r64(o + 8) ^ seed)
                see1 = _mix(r64(o + 16) ^ s[1], r64(o + 24) ^ see1)
                see2 = _mix(r64(o + 32) ^ s[2], r64(o + 40) ^ see2)
                o, i = o + 48, i - 48
            seed ^= see1 ^ see2
        if i > 16:
            seed = _mix(r64(o) ^ s[2], r64(o + 8) ^ seed ^ s[1])
            if i > 32:
                seed = _mix(r64(o + 16) ^ s[2], r64(o + 24) ^ seed)
        a, b = r64(o + i - 16), r64(o + i - 8)
    a, b = _mum(a ^ s[1], b ^ seed)
    return _mix(a ^ s[0] ^ n, b ^ s[1])


_HASHES = {"murmur64a": murmur64a, "rapidhash": rapidhash}


# --- what the installed ninja writes ----------------------------------------------------------
@dataclass(frozen=True)
class Formats:
    """The record formats of one ninja: its build-log header and command hash, its deps-log
    version."""

    ninja: str
    log_header: bytes
    hash_name: str
    deps_version: int

    def hash(self, command: str) -> int:
        return _HASHES[self.hash_name](command.encode())


_PROBE_COMMAND = "touch out && echo out: > out.d"
_PROBE_BUILD = f"""rule mk
  command = {_PROBE_COMMAND}
  depfile = $out.d
  deps = gcc
build out: mk
default out
"""


@functools.lru_cache(maxsize=None)
def probe(ninja: str | None = None) -> Formats | None:
    """The formats of ``ninja`` (else the one on PATH, the one FlashInfer runs), learned from
    one build of our own in a scratch directory; None when there is no ninja or its records
    are not in a format reproduced here."""
    import shutil  # here: a cache command that installs no FlashInfer op never runs ninja
    import subprocess
    import tempfile

    exe = ninja or shutil.which("ninja")
    if exe is None:
        return None
    with tempfile.TemporaryDirectory(prefix="sglang-warmup-ninja-") as scratch:
        Path(scratch, "build.ninja").write_text(_PROBE_BUILD)
        try:
            done = subprocess.run([exe, "-C", scratch], capture_output=True, timeout=30,
                                  env=dict(os.environ, NINJA_STATUS=""))
        except (OSError, subprocess.SubprocessError):
            return None
        if done.returncode != 0:
            return None
        try:
            log = Path(scratch, ".ninja_log").read_bytes()
            deps = Path(scratch, ".ninja_deps").read_bytes()
        except OSError:
            return None
    header = _LOG_HEADER.match(log)
    lines = log[header.end():].splitlines() if header else []
    fields = lines[-1].split(b"\t") if lines else []
    if not header or len(fields) != 5 or fields[3] != b"out":
        return None
    written = int(fields[4], 16)
    hash_name = next((n for n, f in _HASHES.items() if f(_PROBE_COMMAND.encode()) == written),
                     None)
    if hash_name is None or not deps.startswith(_DEPS_MAGIC) or len(deps) < 16:
        return None
    version = struct.unpack_from("<I", deps, len(_DEPS_MAGIC))[0]
    if version != 4:
        return None
    return Formats(exe, header.group(0), hash_name, version)


# --- the records ------------------------------------------------------------------------------
@dataclass
class _DepsLog:
    """A version-4 deps log read whole: its paths by id, the last record of each output."""

    paths: list[bytes]
    ids: dict[bytes, int]
    deps: dict[int, list[int]]


def record_op(op_dir: Path, formats: Formats) -> str:
    """Write ninja's records for the FlashInfer op installed at ``op_dir``; returns what was
    done, one line.  Everything is checked before anything is written: :class:`Unsupported`
    (the op left as installed) when the op is not one whose records can be written."""
    # the path as FlashInfer spells it (its workspace, unresolved), not through its links
    op = os.path.abspath(op_dir)
    build_file = Path(op, "build.ninja")
    _regular(build_file, "build file")
    try:
        text = inputfile.read(build_file, MAX_BUILD_FILE, follow_links=False).decode()
    except (OSError, inputfile.TooLarge, UnicodeDecodeError) as exc:  # left alone
        raise Unsupported(f"{build_file}: {_why(exc)}") from None
    edges, defaults = parse(text)
    name = os.path.basename(op)
    if len(defaults) != 1 or not os.path.isabs(defaults[0]) \
            or not defaults[0].endswith(f"/{name}/{name}.so") \
            or all(defaults[0] not in e.outputs for e in edges):
        raise Unsupported(f"{build_file}: its default is not the output <JIT dir>/{name}/{name}.so")
    # the bake's <workspace>/<version>/<archs> (cached_ops/ and generated/ are below it)
    old_base = os.path.dirname(os.path.dirname(os.path.dirname(defaults[0])))
    base = os.path.dirname(os.path.dirname(op))
    if os.path.basename(os.path.dirname(os.path.dirname(defaults[0]))) != \
            os.path.basename(os.path.dirname(op)):
        raise Unsupported(f"{build_file}: its default is not under {os.path.dirname(op)}")
    if old_base != base:
        text = text.replace(old_base + "/", base + "/")
        edges, _ = parse(text)
    _check_edges(edges, op, build_file)
    log_path, deps_path = Path(op, ".ninja_log"), Path(op, ".ninja_deps")
    _check_log(log_path, formats)
    deps = _read_deps(deps_path)
    headers = {out: _headers(out, deps, old_base, base, deps_path)
               for e in edges if e.deps for out in e.outputs}
    # checked: now written (build.ninja as FlashInfer writes it for this place first)
    if old_base != base:
        atomic.write_text(build_file, text, fsync=False)
    times = _touch_in_order(edges, [h for hs in headers.values() for h in hs])
    _append(log_path, _log_lines(formats, edges, times))
    _append(deps_path, _deps_records(deps, headers, times))
    moved = f", build.ninja moved from {old_base}" if old_base != base else ""
    return f"ninja's records written for {len(times)} output(s) in {op}{moved}"


def _check_edges(edges: list[Edge], op: str, build_file: Path) -> None:
    outputs = [o for e in edges for o in e.outputs]
    if not outputs or any(os.path.dirname(o) != op for o in outputs):
        raise Unsupported(f"{build_file}: an output outside {op}")
    if any(not os.path.isfile(o) for o in outputs):
        raise Unsupported(f"{build_file}: an output is missing from the op")
    missing = next((i for e in edges for i in e.inputs if not os.path.isfile(i)), None)
    if missing is not None:   # a generated source not restored, a package not installed here
        raise Unsupported(f"{build_file}: its input {missing} is not here")


def _regular(path: Path, what: str) -> None:
    """``path`` is a regular file of the op (not a link, a FIFO or a directory)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        if what == "build file":
            raise Unsupported(f"the op carries no {path.name}: not an op FlashInfer built "
                              "with ninja") from None
        raise Unsupported(f"the op carries no {what} ({path.name}): a FlashInfer that keeps "
                          "ninja's records outside the op's directory") from None
    if not stat.S_ISREG(st.st_mode):
        raise Unsupported(f"{path} is not a regular file")


def _why(exc: Exception) -> str:
    """What went wrong reading a record, without repeating its path."""
    if isinstance(exc, OSError):
        if exc.errno == errno.ELOOP:  # O_NOFOLLOW: a link put there after _regular()
            return "is a symbolic link"
        return exc.strerror or str(exc)
    return str(exc)


def _check_log(path: Path, formats: Formats) -> None:
    _regular(path, "build log")
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        first = os.read(fd, 64).split(b"\n", 1)[0] + b"\n"
        tail = os.pread(fd, 1, max(os.fstat(fd).st_size - 1, 0))
    finally:
        os.close(fd)
    if first == b"\n":
        raise Unsupported(f"{path} is empty: ninja writes its header first")
    if first != formats.log_header:
        raise Unsupported(f"{path} is another ninja's ({first[:20]!r}, here "
                          f"{formats.log_header[:20]!r})")
    if tail not in (b"\n", b""):
        raise Unsupported(f"{path} does not end with a whole line")


def _read_deps(path: Path) -> _DepsLog:
    _regular(path, "deps log")
    try:
        data = inputfile.read(path, MAX_DEPS_LOG, follow_links=False)
    except (OSError, inputfile.TooLarge) as exc:
        raise Unsupported(f"{path}: {_why(exc)}") from None
    if not data.startswith(_DEPS_MAGIC) or len(data) < 16 \
            or struct.unpack_from("<I", data, len(_DEPS_MAGIC))[0] != 4:
        raise Unsupported(f"{path} is not a version-4 ninja deps log")
    log = _DepsLog([], {}, {})
    pos = len(_DEPS_MAGIC) + 4
    while pos < len(data):
        if pos + 4 > len(data):
            raise Unsupported(f"{path} ends inside a record")
        (size,) = struct.unpack_from("<I", data, pos)
        body = data[pos + 4:pos + 4 + (size & 0x7FFFFFFF)]
        pos += 4 + (size & 0x7FFFFFFF)
        if len(body) != size & 0x7FFFFFFF or len(body) % 4 or len(body) < 4:
            raise Unsupported(f"{path} has a damaged record")
        if size & 0x80000000:
            out, *inputs = struct.unpack_from(f"<{len(body) // 4}I", body)
            log.deps[out] = inputs[2:]                # after the output's mtime (two words)
        else:
            (check,) = struct.unpack_from("<I", body, len(body) - 4)
            if check != ~len(log.paths) & 0xFFFFFFFF:
                raise Unsupported(f"{path} has a path record out of order")
            log.ids[body[:-4].rstrip(b"\0")] = len(log.paths)
            log.paths.append(body[:-4].rstrip(b"\0"))
    return log


def _headers(out: str, deps: _DepsLog, old_base: str, base: str, where: Path) -> list[str]:
    """The files the bake's compile of ``out`` read, as the deps log names them, moved with
    the op: each must be here, or ninja could not see it change."""
    old_out = old_base + out[len(base):] if out.startswith(base + "/") else out
    record = deps.deps.get(deps.ids.get(old_out.encode(), -1))
    if record is None:
        raise Unsupported(f"{where} has no record of the files {os.path.basename(out)} read")
    paths = []
    for i in record:
        if i >= len(deps.paths):
            raise Unsupported(f"{where} names a path it does not hold")
        p = deps.paths[i].decode(errors="surrogateescape")
        p = base + p[len(old_base):] if p.startswith(old_base + "/") else p
        if not os.path.isfile(p):
            raise Unsupported(f"{os.path.basename(out)} read {p}, which is not here")
        paths.append(p)
    return paths


def _touch_in_order(edges: list[Edge], headers: list[str]) -> dict[str, int]:
    """Every output newer than its inputs and the headers they read, in build order:
    nanosecond times from now on, read back as the file system keeps them (what ninja
    compares)."""
    inputs = [_mtime(p) for p in [*(i for e in edges for i in e.inputs), *headers]]
    now = max([time.time_ns(), *inputs])
    times: dict[str, int] = {}
    for step, edge in enumerate(edges, 1):
        for out in edge.outputs:
            os.utime(out, ns=(now + step * 1000, now + step * 1000))
            times[out] = _mtime(out)
    return times


def _mtime(path: str) -> int:
    return os.stat(path).st_mtime_ns


def _log_lines(formats: Formats, edges: list[Edge], times: dict[str, int]) -> bytes:
    lines = []
    for edge in edges:
        command_hash = formats.hash(edge.command)
        lines += [f"0\t0\t{times[out]}\t{out}\t{command_hash:x}\n" for out in edge.outputs]
    return "".join(lines).encode()


def _deps_records(deps: _DepsLog, headers: dict[str, list[str]], times: dict[str, int]) -> bytes:
    """A path record for each path the log does not hold yet (ids count path records in file
    order; each carries its id's complement), then a deps record per compiled object: its
    mtime and the headers its compile read."""
    out = bytearray()

    def path_id(p: str) -> int:
        key = p.encode(errors="surrogateescape")
        if key not in deps.ids:
            deps.ids[key] = len(deps.paths)
            deps.paths.append(key)
            padded = key + b"\0" * (-len(key) % 4)
            out.extend(struct.pack("<I", len(padded) + 4) + padded
                       + struct.pack("<I", ~deps.ids[key] & 0xFFFFFFFF))
        return deps.ids[key]

    for obj, read in headers.items():
        ids = [path_id(obj), *(path_id(h) for h in read)]
        mtime = times[obj]
        out += struct.pack("<4I", (4 * (3 + len(read))) | 0x80000000, ids[0],
                           mtime & 0xFFFFFFFF, (mtime >> 32) & 0xFFFFFFFF)
        out += struct.pack(f"<{len(read)}I", *ids[1:])
    return bytes(out)


def _append(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    finally:
        os.close(fd)
