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
it built the op there: the op's ``build.ninja`` with the old JIT directory replaced by the new
one (FlashInfer writes the same text when it loads the op: its own
``write_if_different``), the outputs' times in build order, one build-log line per output with
the hash of its command as ninja evaluates it, one deps record per compiled object (no
headers: the archive's toolchain check already says the sources are the same).

The formats are learned from the ninja installed here, not assumed: :func:`probe` runs it once
on a one-line build of our own in a scratch directory and keeps the build-log version, the
command hash (MurmurHash64A in logs v5 and v6, rapidhash in v7: whichever reproduces the hash
ninja wrote) and the deps-log version (4).  Without a ninja, or with one whose formats we do
not reproduce, nothing is written and the op is rebuilt at its first load, as before.  The
archive's ``build.ninja`` is data: parsed here, never run; ninja runs only on our own build.
"""

from __future__ import annotations

import functools
import os
import re
import struct
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from cache_tools import atomic, inputfile

#: build.ninja files above this are not FlashInfer's (theirs are a few KiB)
MAX_BUILD_FILE = 1 << 20
#: an evaluated value (a command) above this is not FlashInfer's (theirs are a few KiB)
MAX_VALUE = 256 << 10
#: a deps log above this is left alone (one op adds a few hundred bytes)
MAX_DEPS_LOG = 64 << 20
_DEPS_MAGIC = b"# ninjadeps\n"
_LOG_HEADER = re.compile(rb"# ninja log v(\d+)\n")
_M64 = (1 << 64) - 1


class Unsupported(Exception):
    """Ninja's records cannot be written for this op; the message says why."""


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


# --- build.ninja, as ninja reads it -----------------------------------------------------------
@dataclass(frozen=True)
class Edge:
    outputs: tuple[str, ...]
    inputs: tuple[str, ...]
    command: str
    deps: bool          # deps = gcc: a deps record per output


_VAR = re.compile(r"\$(?:\{([A-Za-z0-9_.-]+)\}|([A-Za-z0-9_-]+)|(.)|$)", re.S)
_SHELL_SAFE = re.compile(r"[A-Za-z0-9_+\-./]*\Z")


def _shell(path: str) -> str:
    """A path in $in/$out as ninja writes it into a command (its GetShellEscapedString)."""
    return path if _SHELL_SAFE.match(path) else "'" + path.replace("'", "'\\''") + "'"


def _evaluate(text: str, lookup: Callable[[str], str]) -> str:
    out, pos, size = [], 0, 0
    for m in _VAR.finditer(text):
        out.append(text[pos:m.start()])
        pos = m.end()
        name = m.group(1) or m.group(2)
        if name:
            out.append(lookup(name))
        elif m.group(3) in ("$", " ", ":"):
            out.append(m.group(3))
        else:
            raise Unsupported(f"build.ninja: an escape ninja would refuse: {m.group(0)!r}")
        size += len(out[-2]) + len(out[-1])
        if size > MAX_VALUE:  # variables that double each other: bounded as they grow
            raise Unsupported(f"build.ninja: a value longer than {MAX_VALUE:,} characters")
    return "".join(out) + text[pos:]


def _logical_lines(text: str) -> list[str]:
    """Lines with ninja's ``$``-newline continuations joined (the next line's indent dropped)."""
    out: list[str] = []
    pending = ""
    for raw in text.split("\n"):
        line = raw.lstrip(" ") if pending else raw
        if re.search(r"(?<!\$)(\$\$)*\$\Z", line):
            pending += line[:-1]
            continue
        out.append(pending + line)
        pending = ""
    if pending:
        out.append(pending)
    return out


def _paths(text: str, scope: dict[str, str]) -> list[str]:
    return [_evaluate(p, lambda n: scope.get(n, ""))
            for p in re.split(r"(?<!\$) +", text.strip()) if p]


def parse(text: str) -> tuple[list[Edge], list[str]]:
    """The edges of a FlashInfer ``build.ninja`` (top-level variables, rules, builds with their
    own bindings, ``default``) with each command evaluated as ninja evaluates it, and the
    default targets.  Anything else (``include``, ``subninja``, pools, response files, implicit
    or order-only dependencies) raises :class:`Unsupported`."""
    scope: dict[str, str] = {}
    rules: dict[str, dict[str, str]] = {}
    builds: list[tuple[list[str], str, list[str], dict[str, str]]] = []
    defaults: list[str] = []
    current: dict[str, str] | None = None
    for line in _logical_lines(text):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        if line.startswith(" "):
            key, eq, value = line.strip().partition("=")
            if current is None or not eq:
                raise Unsupported(f"build.ninja: an indented line outside a rule or build: {line.strip()[:80]!r}")
            current[key.strip()] = value.strip()
            continue
        current = None
        word, _, rest = line.partition(" ")
        if word == "rule":
            current = rules.setdefault(rest.strip(), {})
        elif word == "build":
            colon = re.search(r"(?<!\$):", rest)
            if colon is None:
                raise Unsupported("build.ninja: a build line without ':'")
            head, tail = rest[:colon.start()], rest[colon.end():]
            rule, _, ins = tail.strip().partition(" ")
            if re.search(r"(?<!\$)\|", ins) or re.search(r"(?<!\$)\|", head):
                raise Unsupported("build.ninja: implicit or order-only paths")
            current = {}
            builds.append((_paths(head, scope), rule, _paths(ins, scope), current))
        elif word == "default":
            defaults += _paths(rest, scope)
        elif "=" in line and word not in ("include", "subninja", "pool"):
            key, _, value = line.partition("=")
            scope[key.strip()] = _evaluate(value.strip(), lambda n: scope.get(n, ""))
        else:
            raise Unsupported(f"build.ninja: {word!r} is not what FlashInfer writes")
    return [_edge(outs, rules, rule, ins, binds, scope) for outs, rule, ins, binds in builds
            if rule != "phony"], defaults


def _edge(outs: list[str], rules: dict[str, dict[str, str]], rule_name: str, ins: list[str],
          binds: dict[str, str], scope: dict[str, str]) -> Edge:
    rule = rules.get(rule_name)
    if rule is None:
        raise Unsupported(f"build.ninja: no rule {rule_name!r}")
    if "rspfile" in rule or "generator" in rule or "restat" in rule or "dyndep" in rule:
        raise Unsupported(f"build.ninja: rule {rule_name} has bindings not written here")
    # an edge's own bindings are evaluated where they stand (in the file's scope)
    edge_vars = {k: _evaluate(v, lambda n: scope.get(n, "")) for k, v in binds.items()}

    evaluating: set[str] = set()

    def lookup(name: str) -> str:
        if name == "in":
            return " ".join(_shell(p) for p in ins)
        if name == "out":
            return " ".join(_shell(p) for p in outs)
        if name in edge_vars:
            return edge_vars[name]
        if name in rule:
            if name in evaluating:
                raise Unsupported(f"build.ninja: rule {rule_name}: ${name} refers to itself")
            evaluating.add(name)
            try:
                return _evaluate(rule[name], lookup)
            finally:
                evaluating.discard(name)
        return scope.get(name, "")

    deps = lookup("deps") if "deps" in rule or "deps" in edge_vars else ""
    if deps not in ("", "gcc") or (lookup("depfile") and deps != "gcc"):
        raise Unsupported(f"build.ninja: rule {rule_name}: depfile without deps = gcc")
    return Edge(tuple(outs), tuple(ins), lookup("command"), deps == "gcc")


# --- the records ------------------------------------------------------------------------------
def record_op(op_dir: Path, formats: Formats) -> str:
    """Write ninja's records for the FlashInfer op installed at ``op_dir`` (its build.ninja
    moved to this JIT directory first); returns what was done, one line.  Raises
    :class:`Unsupported` (nothing written then) when the op is not one ninja's records can be
    written for."""
    build_file = op_dir / "build.ninja"
    try:
        text = inputfile.read(build_file, MAX_BUILD_FILE).decode()
    except (OSError, inputfile.TooLarge, UnicodeDecodeError) as exc:  # left alone
        raise Unsupported(f"{build_file}: {exc}") from None
    jit_dir = os.path.realpath(op_dir.parent)
    edges, defaults = parse(text)
    target = f"{op_dir.name}.so"
    if len(defaults) != 1 or Path(defaults[0]).name != target \
            or Path(defaults[0]).parent.name != op_dir.name:
        raise Unsupported(f"{build_file}: its default is not {op_dir.name}/{target}")
    old_dir = str(Path(defaults[0]).parent.parent)
    if old_dir != jit_dir:
        text = text.replace(old_dir + "/", jit_dir + "/")
        edges, defaults = parse(text)
    outputs = [o for e in edges for o in e.outputs]
    if not outputs or any(os.path.dirname(o) != f"{jit_dir}/{op_dir.name}" for o in outputs):
        raise Unsupported(f"{build_file}: an output outside {op_dir}")
    if any(not os.path.isfile(o) for o in outputs):
        raise Unsupported(f"{build_file}: an output is missing from the op")
    if old_dir != jit_dir:
        atomic.write_text(build_file, text, fsync=False)
    times = _touch_in_order(edges)
    workdir = _workdir(op_dir, jit_dir)
    _append_log(Path(workdir, ".ninja_log"), formats, edges, times)
    _append_deps(Path(workdir, ".ninja_deps"), edges, times)
    moved = f", build.ninja moved from {old_dir}" if old_dir != jit_dir else ""
    return f"ninja's records written for {len(outputs)} output(s) in {workdir}{moved}"


def _workdir(op_dir: Path, jit_dir: str) -> str:
    """Where ninja keeps its records for this op: the op's own directory when it holds them
    (FlashInfer 0.6 runs ninja there, one directory per op; the archive carried them, naming
    the bake's paths), else the JIT directory (where earlier FlashInfers run it for every op)."""
    if any(os.path.lexists(op_dir / name) for name in (".ninja_log", ".ninja_deps")):
        return os.path.realpath(op_dir)
    return jit_dir


def _touch_in_order(edges: list[Edge]) -> dict[str, int]:
    """Every output newer than its inputs, in build order: nanosecond times from now on, read
    back as the file system keeps them (what ninja compares)."""
    inputs = [_mtime(p) for e in edges for p in e.inputs if os.path.exists(p)]
    now = max([_now_ns(), *inputs])
    times: dict[str, int] = {}
    for step, edge in enumerate(edges, 1):
        for out in edge.outputs:
            os.utime(out, ns=(now + step * 1000, now + step * 1000))
            times[out] = _mtime(out)
    return times


def _now_ns() -> int:
    return time.time_ns()


def _mtime(path: str) -> int:
    return os.stat(path).st_mtime_ns


def _append_log(path: Path, formats: Formats, edges: list[Edge], times: dict[str, int]) -> None:
    head = b""
    if path.exists():
        with open(path, "rb") as f:
            first = f.readline(64)
        if first != formats.log_header:
            raise Unsupported(f"{path} is another ninja's ({first[:20]!r})")
    else:
        head = formats.log_header
    lines = [head]
    for edge in edges:
        command_hash = formats.hash(edge.command)
        for out in edge.outputs:
            lines.append(f"0\t0\t{times[out]}\t{out}\t{command_hash:x}\n".encode())
    with open(path, "ab") as f:
        f.write(b"".join(lines))


def _append_deps(path: Path, edges: list[Edge], times: dict[str, int]) -> None:
    """A deps record (no headers) for every output of a ``deps = gcc`` edge, after a path
    record for each output the log does not name yet (ids count path records in file
    order; each carries its id's complement as a checksum)."""
    ids: dict[bytes, int] = {}
    data = b""
    if os.path.lexists(path):
        try:
            data = inputfile.read(path, MAX_DEPS_LOG)
        except inputfile.TooLarge as exc:
            raise Unsupported(f"{path}: {exc}") from None
        ids = _path_ids(data, path)
    out = bytearray() if data else bytearray(_DEPS_MAGIC + struct.pack("<I", 4))
    for edge in edges:
        if not edge.deps:
            continue
        for name in edge.outputs:
            key = name.encode()
            if key not in ids:
                ids[key] = len(ids)
                padded = key + b"\0" * (-len(key) % 4)
                out += struct.pack("<I", len(padded) + 4) + padded \
                    + struct.pack("<I", ~ids[key] & 0xFFFFFFFF)
            mtime = times[name]
            out += struct.pack("<IIII", 12 | 0x80000000, ids[key], mtime & 0xFFFFFFFF,
                               (mtime >> 32) & 0xFFFFFFFF)
    with open(path, "ab") as f:
        f.write(bytes(out))


def _path_ids(data: bytes, where: Path) -> dict[bytes, int]:
    if not data.startswith(_DEPS_MAGIC) or len(data) < 16 \
            or struct.unpack_from("<I", data, len(_DEPS_MAGIC))[0] != 4:
        raise Unsupported(f"{where} is not a version-4 ninja deps log")
    ids: dict[bytes, int] = {}
    pos = len(_DEPS_MAGIC) + 4
    count = 0
    while pos + 4 <= len(data):
        (size,) = struct.unpack_from("<I", data, pos)
        body = data[pos + 4:pos + 4 + (size & 0x7FFFFFFF)]
        if len(body) != size & 0x7FFFFFFF:
            raise Unsupported(f"{where} ends inside a record")
        if not size & 0x80000000:
            ids[body[:-4].rstrip(b"\0")] = count
            count += 1
        pos += 4 + (size & 0x7FFFFFFF)
    return ids
