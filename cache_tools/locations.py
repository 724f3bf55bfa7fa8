"""Every JIT cache kind SGLang uses: its variable, its default directory, what one entry is, and
which names are in-flight writes or locks.

This is the only module of cache_tools that reads other tools' environment variables
(``TRITON_CACHE_DIR``, ``SGLANG_CACHE_DIR``, ...).  Directories are resolved the way the
installed SGLang resolves them: ``import sglang`` ``setdefault``s a few third-party variables
under ``SGLANG_CACHE_DIR`` (0.5.22 and later; 0.5.17 has no such redirect), the SGLang JIT
ignores ``SGLANG_CACHE_DIR`` (hard-coded ``~/.cache/sglang/jit``), and DeepGEMM's
``DG_JIT_CACHE_DIR`` is overwritten with ``SGLANG_DG_CACHE_DIR``.  Which of these rules apply
is read off the installed SGLang's source files without importing it (see ``SGLangProfile``).

Longer than 500 lines: the table of eleven cache kinds (variable, default, entry layout,
in-flight names) is one piece of data; split, every kind would be described in two places.
"""

from __future__ import annotations

import contextlib
import fnmatch
import functools
import importlib.util
import os
import pwd
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Iterator, Mapping

from cache_tools.errors import CacheError

# Names cache_tools itself creates: restore/pull staging and prune trash inside cache
# directories, pack and merge temporaries beside the output.  Each is
# ``<prefix><host>-<pid>-<12 hex digits>`` (``.tmp`` for pack's files); they are never entries,
# scan reports leftovers, and the next run removes those of dead processes (staging.clean_stale).
STAGING_PREFIX = ".sgw-staging-"
TRASH_PREFIX = ".sgw-trash-"
PACK_PREFIX = ".sgw-pack-"
MERGE_PREFIX = ".sgw-merge-"
OWN_PATTERNS = (STAGING_PREFIX + "*", TRASH_PREFIX + "*")


@dataclass(frozen=True)
class EntryRule:
    """Where entries sit below a kind's root, and when one is complete.

    ``pattern`` holds one ``fnmatch`` glob per path component below the root; an empty pattern
    makes the root itself the single entry, and a final ``"**"`` makes every file at any depth
    below the preceding components an entry.  ``complete`` is ``"any"`` (a file, or a directory
    holding at least one file), ``"triton"`` (Triton's group rule, see scan.py) or
    ``"marker:<glob>"`` (the directory holds a file matching the glob; ``{name}`` stands for the
    entry's own name).  ``ninja``: the library runs ninja on the entry's ``build.ninja`` each
    time it loads it, so an install writes ninja's records for it (``cache_tools.ninja_log``).
    """

    pattern: tuple[str, ...]
    complete: str = "any"
    ninja: bool = False

    def marker(self, name: str) -> str | None:
        """The glob of the marker file of the entry called ``name``; None for a rule without."""
        if not self.complete.startswith("marker:"):
            return None
        # the name is a directory's, from disk: its [ * ? are themselves, not wildcards
        return self.complete[len("marker:"):].replace("{name}", re.sub(r"([*?[])", r"[\1]", name))


@dataclass(frozen=True)
class Layout:
    """The on-disk shape of one cache kind."""

    rules: tuple[EntryRule, ...]
    #: names (globs, any depth) of files/directories being written right now; never packed
    temp: tuple[str, ...] = ()
    #: names (globs, any depth) that are neither entries nor problems: lock files, lock dirs
    ignore: tuple[str, ...] = ()
    #: one sentence: what one entry is
    entry: str = ""

    def is_temp(self, name: str) -> bool:
        return self._temp(name) is not None

    def is_ignored(self, name: str) -> bool:
        return self._ignored(name) is not None

    def may_skip(self, name: str) -> bool:
        """Whether ``name`` may be temporary or ignored (one test for the names scan meets,
        nearly all of them neither: ``is_temp`` and ``is_ignored`` then say which)."""
        return self._either(name) is not None

    # The compiled patterns' match, kept on the layout: scan asks of every file it sees.
    @functools.cached_property
    def _either(self) -> Callable[[str], object]:
        return _matcher(self.temp + self.ignore + OWN_PATTERNS)

    @functools.cached_property
    def _temp(self) -> Callable[[str], object]:
        return _matcher(self.temp)

    @functools.cached_property
    def _ignored(self) -> Callable[[str], object]:
        return _matcher(self.ignore + OWN_PATTERNS)

    def match(self, parts: tuple[str, ...], is_dir: bool) -> tuple[str, EntryRule | None]:
        """Classify a path below the root: ``("entry", rule)``, ``("descend", None)`` or
        ``("unknown", None)`` when no rule covers it."""
        for rule in self.rules:
            verdict = _match_rule(rule.pattern, parts, is_dir)
            if verdict == "entry":
                # Triton and marker entries are directories; a file there is foreign.
                if rule.complete != "any" and not is_dir:
                    return "unknown", None
                return "entry", rule
            if verdict == "descend":
                return "descend", None
        return "unknown", None

    def entry_rule(self, parts: tuple[str, ...], is_dir: bool) -> EntryRule | None:
        """The rule that makes ``parts`` an entry (used to validate archive manifests)."""
        verdict, rule = self.match(parts, is_dir)
        return rule if verdict == "entry" else None


@functools.lru_cache(maxsize=None)
def _matcher(globs: tuple[str, ...]) -> Callable[[str], object]:
    """One compiled test for "the name matches any of these globs" (scan calls it per file):
    a match object, or None."""
    if not globs:
        return _no_match
    return re.compile("|".join(fnmatch.translate(g) for g in globs)).match


def _no_match(name: str) -> None:
    return None


def _globs_match(pattern: tuple[str, ...], parts: tuple[str, ...]) -> bool:
    # "*" matches any name: no pattern to run (every entry of a scan and a manifest asks)
    return len(pattern) == len(parts) and all(
        g == "*" or fnmatch.fnmatchcase(p, g) for p, g in zip(parts, pattern))


def _match_rule(pattern: tuple[str, ...], parts: tuple[str, ...], is_dir: bool) -> str:
    """``entry`` | ``descend`` | ``no`` for one rule."""
    if pattern and pattern[-1] == "**":
        head = pattern[:-1]
        if len(parts) <= len(head):
            return "descend" if _globs_match(head[: len(parts)], parts) else "no"
        if not _globs_match(head, parts[: len(head)]):
            return "no"
        return "descend" if is_dir else "entry"
    if len(parts) > len(pattern) or not _globs_match(pattern[: len(parts)], parts):
        return "no"
    return "entry" if len(parts) == len(pattern) else "descend"


@dataclass(frozen=True)
class CacheKind:
    """One JIT cache SGLang (or a library it runs) keeps on disk."""

    name: str
    title: str
    #: the variable(s) that choose the directory, most important first
    variables: tuple[str, ...]
    #: how the default directory is derived, in words
    default: str
    layout: Layout
    #: (variable, path below --root) pairs that place this kind under a common root
    root_exports: tuple[tuple[str, str], ...]
    #: the kind's directory below --root
    root_subdir: str
    notes: str = ""


def _rules(*rules: tuple[tuple[str, ...], str]) -> tuple[EntryRule, ...]:
    return tuple(EntryRule(p, c) for p, c in rules)


KINDS: tuple[CacheKind, ...] = (
    CacheKind(
        "triton", "Triton kernels",
        ("TRITON_CACHE_DIR", "TRITON_HOME", "SGLANG_CACHE_DIR"),
        "$SGLANG_CACHE_DIR/triton under SGLang >= 0.5.22 (setdefault at import); "
        "Triton's own default $TRITON_HOME/.triton/cache",
        Layout(_rules((("*",), "triton")), temp=("tmp.pid_*",),
               entry="one hash directory: the compiled stages plus __grp__<kernel>.json "
                     "(or a lone launcher .so / autotune .json)"),
        (("TRITON_CACHE_DIR", "triton"),), "triton",
        "Triton writes each file under tmp.pid_<pid>_<uuid>/ and os.replace()s it; the group "
        "file is written last and lists its children by absolute path.",
    ),
    CacheKind(
        "inductor", "torch inductor",
        ("TORCHINDUCTOR_CACHE_DIR", "SGLANG_CACHE_DIR"),
        "$SGLANG_CACHE_DIR/inductor under SGLang >= 0.5.22; torch's own default "
        "$TMPDIR/torchinductor_$USER",
        Layout(_rules((("triton", "*", "*"), "triton"), (("*", "*"), "any")),
               temp=(".*.tmp", "tmp.pid_*"), ignore=("*.lock",),
               entry="one item below a top-level directory (fxgraph/<xx>, <xx>/<code>.py, "
                     "...); nested Triton caches (triton/<device>/<hash>) as for triton"),
        (("TORCHINDUCTOR_CACHE_DIR", "inductor"),), "inductor",
        "torch writes .<pid>.<tid>.tmp then renames; the redirect is a no-op if inductor "
        "called cache_dir() before sglang was imported.",
    ),
    CacheKind(
        "sglang_jit", "SGLang JIT (nvcc builds)",
        ("SGLANG_JIT_CACHE_DIR",),
        "~/.cache/sglang/jit (hard-coded; does not follow SGLANG_CACHE_DIR)",
        Layout(_rules((("*", "*", "build-*", "deps-*"), "marker:sgl_deps.json")),
               temp=(".staging-*",), ignore=(".lock",),
               entry="one published build, <target>/<module>/build-<key>/deps-<key>/ "
                     "(immutable once renamed into place from .staging-<uuid>)"),
        (("SGLANG_JIT_CACHE_DIR", "jit"),), "jit",
        "SGLang >= 0.5.22 content-addressed cache; one flock per variant (.lock).",
    ),
    CacheKind(
        "tvm_ffi", "tvm-ffi modules",
        ("TVM_FFI_CACHE_DIR",),
        "~/.cache/tvm-ffi",
        Layout(_rules((("*",), "marker:*.so")), ignore=("*.lock", "lock"),
               entry="one build directory holding the module's .so"),
        (("TVM_FFI_CACHE_DIR", "tvm-ffi"),), "tvm-ffi",
        "SGLang 0.5.17 builds its JIT kernels here (<module>__arch_<arch>__tvmffi_<ver>/); "
        "in 0.5.22 only DeepGEMM's fallback build uses it.",
    ),
    CacheKind(
        "flashinfer", "FlashInfer JIT",
        ("FLASHINFER_WORKSPACE_BASE", "SGLANG_CACHE_DIR"),
        "$FLASHINFER_WORKSPACE_BASE/.cache/flashinfer; SGLang >= 0.5.22 sets the base to "
        "$SGLANG_CACHE_DIR; FlashInfer's own default base is $HOME",
        Layout((EntryRule(("cubins", "**")),
                EntryRule(("*", "*", "cached_ops", "*"), "marker:{name}.so", ninja=True),
                EntryRule(("*", "*", "generated", "*"))),
               temp=("*.tmp",), ignore=("*.lock", "tmp", ".ninja_lock"),
               entry="one op, <version>/<archs>/cached_ops/<op>/ (complete once <op>.so "
                     "exists) or generated/<op>/; one downloaded file under cubins/"),
        (("FLASHINFER_WORKSPACE_BASE", ""),), ".cache/flashinfer",
        "Resolved when flashinfer is imported: set the base before anything imports it.",
    ),
    CacheKind(
        "deep_gemm", "DeepGEMM JIT",
        ("SGLANG_DG_CACHE_DIR", "DG_JIT_CACHE_DIR", "SGLANG_CACHE_DIR"),
        "$SGLANG_CACHE_DIR/deep_gemm (SGLang 0.5.22; ~/.cache/deep_gemm in 0.5.17); "
        "SGLang overwrites DG_JIT_CACHE_DIR with it",
        Layout(_rules((("cache", "*"), "any")), temp=("tmp",), ignore=("locks", "*.lock"),
               entry="one kernel directory, cache/<kernel>.<hash>/ (layout read from "
                     "DeepGEMM's public sources, not from the sgl-deep-gemm binary)"),
        (("SGLANG_DG_CACHE_DIR", "deep_gemm"), ("DG_JIT_CACHE_DIR", "deep_gemm")), "deep_gemm",
        "Setting DG_JIT_CACHE_DIR alone does nothing under SGLang.",
    ),
    CacheKind(
        "tilelang", "TileLang JIT",
        ("TILELANG_CACHE_DIR", "SGLANG_CACHE_DIR"),
        "$SGLANG_CACHE_DIR/tilelang under SGLang >= 0.5.22; TileLang's own default "
        "~/.tilelang/cache",
        Layout(_rules((("*",), "any")), temp=("*.tmp",), ignore=("*.lock",),
               entry="one top-level file or directory"),
        (("TILELANG_CACHE_DIR", "tilelang"),), "tilelang",
    ),
    CacheKind(
        "cuda_ptx", "NVIDIA driver PTX JIT",
        ("CUDA_CACHE_PATH", "SGLANG_CACHE_DIR"),
        "$SGLANG_CACHE_DIR/nv under SGLang >= 0.5.22; the driver's own default "
        "~/.nv/ComputeCache",
        Layout(_rules(((), "any")),
               entry="the whole directory (the driver keeps one index for all of it)"),
        (("CUDA_CACHE_PATH", "nv"),), "nv",
        "Only used for PTX-shipped code; restored only into an empty or absent directory.",
    ),
    CacheKind(
        "cute_aot", "SGLang CuTe AOT objects",
        ("SGLANG_CUTE_AOT_CACHE_DIR", "SGLANG_CACHE_DIR"),
        "$SGLANG_CACHE_DIR/cute_aot (an empty value keeps compilation process-local)",
        Layout(_rules((("*", "*.o"), "any"), (("*", "*", "*.o"), "any")),
               temp=(".*.tmp.o", ".*.tmp"), ignore=("*.lock",),
               entry="one object file, <source-fingerprint>/[<name>/]<sha256>.o"),
        (("SGLANG_CUTE_AOT_CACHE_DIR", "cute_aot"),), "cute_aot",
    ),
    CacheKind(
        "cute_dsl", "CuTe DSL (cutlass-dsl)",
        ("CUTE_DSL_CACHE_DIR",),
        "$TMPDIR/$USER/cutlass_python_cache (reported default; SGLang does not set it)",
        Layout(_rules((("*",), "any")), temp=("*.tmp",), ignore=("*.lock",),
               entry="one top-level file or directory"),
        (("CUTE_DSL_CACHE_DIR", "cute_dsl"),), "cute_dsl",
    ),
    CacheKind(
        "flash_attn_4", "flash-attn-4 (CuTe)",
        ("FLASH_ATTENTION_CUTE_DSL_CACHE_DIR", "FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED"),
        "$TMPDIR/$USER/flash_attention_cute_dsl_cache, only used when "
        "FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=1",
        Layout(_rules((("*",), "any")), temp=("*.tmp",), ignore=("*.lock",),
               entry="one top-level file or directory"),
        (("FLASH_ATTENTION_CUTE_DSL_CACHE_DIR", "flash_attn_4"),), "flash_attn_4",
        "The persistent cache is off by default; SGLang sets neither variable.",
    ),
)

KIND_NAMES: tuple[str, ...] = tuple(k.name for k in KINDS)
_BY_NAME = {k.name: k for k in KINDS}


def kind(name: str) -> CacheKind:
    """The kind called ``name``; a CacheError listing the known kinds otherwise."""
    try:
        return _BY_NAME[name]
    except KeyError:
        raise CacheError(f"unknown cache kind {name!r}",
                         hint="known kinds: " + ", ".join(KIND_NAMES)) from None


def parse_kinds(values: Iterable[str] | None) -> tuple[CacheKind, ...]:
    """Kinds from CLI values (repeatable, comma-separated); all kinds when none are given."""
    names: list[str] = []
    for value in values or ():
        names.extend(n.strip() for n in value.split(",") if n.strip())
    if not names:
        return KINDS
    chosen = {kind(n).name for n in names}
    return tuple(k for k in KINDS if k.name in chosen)


# --- the installed SGLang ---------------------------------------------------------------------

_REDIRECTABLE = ("TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR", "CUDA_CACHE_PATH",
                 "TILELANG_CACHE_DIR", "FLASHINFER_WORKSPACE_BASE")


@dataclass(frozen=True)
class SGLangProfile:
    """The cache rules of one SGLang release, read off its source files."""

    version: str | None
    #: variables ``import sglang`` setdefaults under SGLANG_CACHE_DIR (empty: no redirect)
    redirect: frozenset[str]
    #: True when the content-addressed SGLang JIT cache (SGLANG_JIT_CACHE_DIR) exists
    sglang_jit: bool
    #: True when SGLang's JIT builds tvm-ffi modules under TVM_FFI_CACHE_DIR (0.5.17)
    tvm_ffi_jit: bool
    #: True when SGLANG_DG_CACHE_DIR defaults under SGLANG_CACHE_DIR (else ~/.cache/deep_gemm)
    deep_gemm_under_cache_dir: bool
    #: True when SGLang keeps CuTe AOT objects (SGLANG_CUTE_AOT_CACHE_DIR)
    cute_aot: bool
    #: True when SGLang is not installed here and the newest known rules were assumed
    assumed: bool = False


#: The rules of SGLang 0.5.22 / 0.5.23, assumed when SGLang is not installed (slim images).
LATEST_KNOWN = SGLangProfile(None, frozenset(_REDIRECTABLE), True, False, True, True, True)
#: The rules of SGLang 0.5.17 (no redirect; tvm-ffi JIT; DeepGEMM under ~/.cache/deep_gemm).
SGLANG_0_5_17 = SGLangProfile("0.5.17", frozenset(), False, True, False, False)


def detect_profile() -> SGLangProfile:
    """Read the installed SGLang's cache rules without importing it."""
    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        return LATEST_KNOWN
    pkg = Path(list(spec.submodule_search_locations)[0])
    environ = _read(pkg / "srt" / "environ.py")
    version = _installed_version(pkg)
    redirect: set[str] = set()
    start = environ.find("def third_party_cache_defaults")
    if start >= 0:
        end = environ.find("\ndef ", start + 1)
        body = environ[start:end if end > 0 else len(environ)]
        redirect = {v for v in _REDIRECTABLE if f'"{v}"' in body or f"'{v}'" in body}
    jit_cache = (pkg / "kernels" / "jit" / "utils" / "compile" / "cache.py").is_file()
    tvm_jit = "TVM_FFI_CACHE_DIR" in _read(pkg / "kernels" / "jit" / "utils" / "compile.py")
    return SGLangProfile(
        version=version,
        redirect=frozenset(redirect),
        sglang_jit=jit_cache,
        tvm_ffi_jit=tvm_jit and not jit_cache,
        deep_gemm_under_cache_dir='_default_cache_subdir("deep_gemm")' in environ,
        cute_aot="SGLANG_CUTE_AOT_CACHE_DIR" in environ,
    )


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""


def _installed_version(pkg: Path) -> str | None:
    # The dist-info next to the package we found (a --target dir may shadow site-packages).
    for meta in sorted(pkg.parent.glob("sglang-*.dist-info")):
        for line in _read(meta / "METADATA").splitlines():
            if line.startswith("Version:"):
                return line.split(":", 1)[1].strip()
    text = _read(pkg / "version.py") + _read(pkg / "_version.py")
    for line in text.splitlines():
        if line.strip().startswith(("__version__", "version")) and "=" in line:
            return line.split("=", 1)[1].strip().strip("'\"") or None
    return None


# --- resolution ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Location:
    """Where one kind's cache lives in this configuration."""

    kind: CacheKind
    #: the directory; None when the kind keeps no persistent cache in this configuration
    path: Path | None
    #: how the path was decided: a variable name, "SGLANG_CACHE_DIR redirect", "default", "--root"
    source: str
    #: False when the owning tool will not use this directory as configured (it may still exist)
    active: bool = True
    note: str = ""


class _Env:
    """Read-only view of an environment mapping with the few helpers path rules need."""

    def __init__(self, env: Mapping[str, str]) -> None:
        self.env = env

    def get(self, name: str) -> str | None:
        value = self.env.get(name)
        return value if value is not None and value != "" else None

    def raw(self, name: str) -> str | None:
        return self.env.get(name)

    def sglang(self, name: str) -> str | None:
        # SGLang rewrites a legacy SGL_<X> variable to SGLANG_<X> at import (it wins).
        legacy = "SGL_" + name[len("SGLANG_"):]
        if legacy in self.env:
            return self.env[legacy]
        return self.env.get(name)

    def home(self) -> str:
        return self.env.get("HOME") or pwd.getpwuid(os.getuid()).pw_dir

    def expand(self, path: str) -> str:
        if path == "~" or path.startswith("~/"):
            return self.home() + path[1:]
        return path

    def tmpdir(self) -> str:
        for name in ("TMPDIR", "TEMP", "TMP"):
            if self.get(name):
                return self.env[name]
        return "/tmp"

    def user(self) -> str:
        for name in ("LOGNAME", "USER", "LNAME", "USERNAME"):
            if self.get(name):
                return self.env[name]
        try:
            return pwd.getpwuid(os.getuid()).pw_name
        except KeyError:
            return f"uid_{os.getuid()}"


def _sglang_base(e: _Env) -> str:
    return e.expand(e.sglang("SGLANG_CACHE_DIR") or "~/.cache/sglang")


def _redirected(e: _Env, p: SGLangProfile, var: str, sub: str, fallback: Callable[[], str]
                ) -> tuple[str, str]:
    """setdefault semantics: a value already set wins, else SGLang's redirect, else the tool."""
    if e.get(var) is not None:
        return e.env[var], var
    if var in p.redirect:
        base = _sglang_base(e)
        return (os.path.join(base, sub) if sub else base), "SGLANG_CACHE_DIR redirect"
    return fallback(), "default"


def _resolve(k: CacheKind, e: _Env, p: SGLangProfile) -> Location:
    n = k.name
    if n == "triton":
        path, src = _redirected(e, p, "TRITON_CACHE_DIR", "triton", lambda: os.path.join(
            e.raw("TRITON_HOME") or e.home() + "/", ".triton", "cache"))
        return Location(k, Path(path), src)
    if n == "inductor":
        path, src = _redirected(e, p, "TORCHINDUCTOR_CACHE_DIR", "inductor", lambda: os.path.join(
            e.tmpdir(), "torchinductor_" + e.user()))
        return Location(k, Path(os.path.abspath(path)), src)
    if n == "sglang_jit":
        value = e.sglang("SGLANG_JIT_CACHE_DIR")
        where = Path(e.expand(value or "~/.cache/sglang/jit"))
        src = "SGLANG_JIT_CACHE_DIR" if value else "default"
        if not p.sglang_jit:
            return Location(k, where, src, active=False,
                            note=f"not used by SGLang {p.version or ''}".strip())
        return Location(k, where, src)
    if n == "tvm_ffi":
        value = e.get("TVM_FFI_CACHE_DIR")
        where = Path(e.expand(value or "~/.cache/tvm-ffi"))
        note = "SGLang's JIT modules" if p.tvm_ffi_jit else "DeepGEMM's fallback builds only"
        return Location(k, where, "TVM_FFI_CACHE_DIR" if value else "default", note=note)
    if n == "flashinfer":
        base, src = _redirected(e, p, "FLASHINFER_WORKSPACE_BASE", "", e.home)
        return Location(k, Path(base) / ".cache" / "flashinfer", src)
    if n == "deep_gemm":
        value = e.sglang("SGLANG_DG_CACHE_DIR")
        if value is not None:
            return Location(k, Path(value), "SGLANG_DG_CACHE_DIR")
        if p.deep_gemm_under_cache_dir:
            return Location(k, Path(_sglang_base(e)) / "deep_gemm", "SGLANG_CACHE_DIR redirect")
        return Location(k, Path(e.home()) / ".cache" / "deep_gemm", "default")
    if n == "tilelang":
        path, src = _redirected(e, p, "TILELANG_CACHE_DIR", "tilelang",
                                lambda: os.path.join(e.home(), ".tilelang", "cache"))
        return Location(k, Path(path), src)
    if n == "cuda_ptx":
        path, src = _redirected(e, p, "CUDA_CACHE_PATH", "nv",
                                lambda: os.path.join(e.home(), ".nv", "ComputeCache"))
        return Location(k, Path(path), src)
    if n == "cute_aot":
        value = e.sglang("SGLANG_CUTE_AOT_CACHE_DIR")
        if value == "":
            return Location(k, None, "SGLANG_CUTE_AOT_CACHE_DIR", active=False,
                            note="empty: compilation stays process-local")
        where = Path(e.expand(value)) if value else Path(_sglang_base(e)) / "cute_aot"
        src = "SGLANG_CUTE_AOT_CACHE_DIR" if value else "SGLANG_CACHE_DIR redirect"
        if not p.cute_aot:
            return Location(k, where, src, active=False,
                            note=f"not used by SGLang {p.version or ''}".strip())
        return Location(k, where, src)
    if n == "cute_dsl":
        value = e.get("CUTE_DSL_CACHE_DIR")
        path = value or os.path.join(e.tmpdir(), e.user(), "cutlass_python_cache")
        return Location(k, Path(path), "CUTE_DSL_CACHE_DIR" if value else "default")
    if n == "flash_attn_4":
        value = e.get("FLASH_ATTENTION_CUTE_DSL_CACHE_DIR")
        path = value or os.path.join(e.tmpdir(), e.user(), "flash_attention_cute_dsl_cache")
        enabled = (e.get("FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED") or "").lower() in (
            "1", "true", "yes", "on")
        return Location(k, Path(path), "FLASH_ATTENTION_CUTE_DSL_CACHE_DIR" if value else
                        "default", active=enabled,
                        note="" if enabled else "off: FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED unset")
    raise AssertionError(n)  # every kind above has a rule


def resolve(kinds: Iterable[CacheKind] | None = None, *, env: Mapping[str, str] | None = None,
            profile: SGLangProfile | None = None, root: str | os.PathLike[str] | None = None
            ) -> tuple[Location, ...]:
    """Where each kind's cache lives: under ``root`` when given, else as the installed SGLang
    resolves it from ``env`` (default: this process's environment)."""
    chosen = tuple(kinds) if kinds is not None else KINDS
    if root is not None:
        # Absolute: restored Triton group files record paths below it, and a server runs in
        # another working directory (a relative root would also misreport copied caches).
        r = Path(os.path.abspath(root))
        return tuple(Location(k, r / k.root_subdir, "--root") for k in chosen)
    e = _Env(os.environ if env is None else env)
    p = profile or detect_profile()
    return tuple(_resolve(k, e, p) for k in chosen)


@dataclass(frozen=True)
class Exports:
    """Environment assignments that pin every kind's directory, with a comment per caveat."""

    pairs: tuple[tuple[str, str], ...]
    comments: tuple[str, ...] = field(default=())


def exports(root: str | None = None, *, env: Mapping[str, str] | None = None,
            profile: SGLangProfile | None = None) -> Exports:
    """The assignments for ``cache env``: every kind under ``root`` (absolute), or the
    currently resolved directories when no root is given."""
    comments = ("flash-attn-4 keeps no persistent cache unless "
                "FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=1 is also set (opt-in)",)
    if root is not None:
        if not os.path.isabs(root):
            raise CacheError(f"--root {root!r} is not an absolute path",
                             hint="environment values are read by other processes from other "
                                  "working directories; give an absolute path like /cache")
        r = root.rstrip("/") or "/"
        pairs: list[tuple[str, str]] = [("SGLANG_CACHE_DIR", r)]
        for k in KINDS:
            for var, sub in k.root_exports:
                pairs.append((var, os.path.join(r, sub) if sub else r))
        return Exports(tuple(pairs), comments)
    e = _Env(os.environ if env is None else env)
    pairs = [("SGLANG_CACHE_DIR", _sglang_base(e))]
    for loc in resolve(env=e.env, profile=profile):
        if loc.path is None:
            continue
        for var, _sub in loc.kind.root_exports:
            value = str(loc.path)
            if loc.kind.name == "flashinfer":
                value = str(loc.path.parent.parent)  # the base, not <base>/.cache/flashinfer
            pairs.append((var, value))
    return Exports(tuple(pairs), comments)


def hf_hub_cache(env: Mapping[str, str] | None = None) -> Path:
    """Where huggingface_hub keeps what it downloaded (its ``constants.HF_HUB_CACHE``):
    ``HF_HUB_CACHE``, else the legacy ``HUGGINGFACE_HUB_CACHE``, else ``HF_HOME/hub``, else
    ``$XDG_CACHE_HOME/huggingface/hub``, else ``~/.cache/huggingface/hub``."""
    e = _Env(os.environ if env is None else env)
    given = e.get("HF_HUB_CACHE") or e.get("HUGGINGFACE_HUB_CACHE")
    if given is None:
        home = e.get("HF_HOME") or os.path.join(e.get("XDG_CACHE_HOME") or e.expand("~/.cache"),
                                                "huggingface")
        given = os.path.join(e.expand(home), "hub")
    return Path(os.path.expandvars(e.expand(given)))


@contextlib.contextmanager
def environment(values: Mapping[str, str | None] | None = None) -> Iterator[None]:
    """Set (or, for None, unset) environment variables for the block; on exit the whole
    environment is put back as it was on entry, including what the block set on its own (SGLang
    redirects its third-party cache variables as it resolves server args; torch sets its
    Inductor cache directory when it first asks for it).  The environment is the process's:
    not for blocks that overlap in threads, nor while another thread sets variables."""
    saved = dict(os.environ)
    try:
        apply(values or {})
        yield
    finally:
        put_back(saved)


def apply(values: Mapping[str, str | None]) -> None:
    """Set environment variables (unset those given None)."""
    for key, value in values.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


def put_back(saved: Mapping[str, str]) -> None:
    """Make the process environment ``saved`` again (only the variables that differ are
    touched)."""
    for key in [k for k in os.environ if k not in saved]:
        del os.environ[key]
    for key, value in saved.items():
        if os.environ.get(key) != value:
            os.environ[key] = value
