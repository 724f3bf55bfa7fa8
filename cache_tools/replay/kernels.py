"""The installed kernel a compile-log record names, found and checked before anything runs.

A record names its kernel by module, qualified name and the sha256 of the kernel's source as
Triton holds it (``JITFunction.src``).  Replay runs only code that is already installed: the
module's file is looked up on the installed search path (``sys.path`` without the working
directory) without importing it, parsed (never executed) to see that it defines a Triton kernel
of that name, and the kernel's source is cut from the file the way ``inspect.getsourcelines``
and Triton cut it and hashed.  Only when that hash equals the recorded one is the module
imported, and the imported kernel's ``src`` is hashed again.  Source text carried by a record
is never executed, compiled or imported.
"""

from __future__ import annotations

import ast
import contextlib
import hashlib
import importlib
import inspect
import os
import re
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from cache_tools.replay.report import NOT_A_KERNEL, NOT_INSTALLED, SOURCE_MISMATCH

#: A kernel module's file is read whole to check it: larger files are not kernel modules.
MAX_MODULE_BYTES = 4 * 1024 * 1024
#: Decorators (their last dotted name) that make a function a Triton kernel.
KERNEL_DECORATORS = frozenset({"jit", "autotune", "heuristics"})
_MODULE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*){0,31}")
_DEF = re.compile(r"^def\s+\w+\s*\(", re.MULTILINE)


class Unresolved(LookupError):
    """A record's kernel cannot be used here: ``reason`` (one word) and ``detail``."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(reason, detail)
        self.reason, self.detail = reason, detail


@dataclass(frozen=True)
class InstalledKernel:
    """A kernel found on disk: the module's file, and the sha256 of the kernel's source."""

    module: str
    qualname: str
    path: Path
    source_sha256: str


def source_sha256(text: str) -> str:
    """The hash a record carries for a kernel source text (``JITFunction.src``)."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def search_path() -> list[str]:
    """The directories installed code is imported from: ``sys.path`` without ``''`` and
    without the working directory where it first appears (``python -m`` and ``-c`` put it
    first); relative entries and non-directories left out.  The working directory listed
    again later (an editable install's ``.pth`` entry, ``PYTHONPATH``) stays."""
    cwd = os.path.realpath(os.getcwd())
    out, dropped = [], False
    for entry in sys.path:
        if not entry or not os.path.isabs(entry) or not os.path.isdir(entry):
            continue
        if not dropped and os.path.realpath(entry) == cwd:
            dropped = True
            continue
        out.append(entry)
    return out


def locate(module: str) -> Path:
    """The source file of ``module`` on the installed search path, found without importing
    anything (the module already imported here: its file).  Raises :class:`Unresolved`."""
    if not isinstance(module, str) or not _MODULE_NAME.fullmatch(module):
        raise Unresolved(NOT_INSTALLED, f"{str(module)[:80]!r} is not a module name")
    loaded = sys.modules.get(module)
    if loaded is not None:
        file = getattr(loaded, "__file__", None)
        if isinstance(file, str) and file.endswith(".py"):
            return Path(file)
        raise Unresolved(NOT_INSTALLED, f"{module} is loaded here but not from a Python file")
    parts = module.split(".")
    for root in search_path():
        found = _find_in(Path(root), parts)
        if found is not None:
            return found
    raise Unresolved(NOT_INSTALLED, f"{module} is not installed here (looked on the installed "
                                    "search path, never in the working directory)")


def _find_in(root: Path, parts: list[str]) -> Path | None:
    """``root/a/b/c.py`` or ``root/a/b/c/__init__.py`` for ``a.b.c``; each parent a package
    directory (regular or namespace)."""
    base = root.joinpath(*parts[:-1])
    if not base.is_dir():
        return None
    for candidate in (base / f"{parts[-1]}.py", base / parts[-1] / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def read_module(path: Path) -> str:
    """A kernel module's text, bounded before it is read."""
    try:
        size = path.stat().st_size
        if size > MAX_MODULE_BYTES:
            raise Unresolved(NOT_A_KERNEL, f"{path} is {size} bytes, more than a kernel module "
                                           f"({MAX_MODULE_BYTES})")
        with open(path, "rb") as f:
            data = f.read(MAX_MODULE_BYTES + 1)
        return data.decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise Unresolved(NOT_INSTALLED, f"{path} cannot be read: {exc}") from None


def _decorator_name(node: ast.expr) -> str:
    """``jit`` for ``@triton.jit``, ``@jit`` or ``@triton.jit(...)``."""
    target = node.func if isinstance(node, ast.Call) else node
    if isinstance(target, ast.Attribute):
        return target.attr
    return target.id if isinstance(target, ast.Name) else ""


def find_definition(tree: ast.Module, qualname: str) -> ast.FunctionDef:
    """The ``def`` of ``qualname`` (module level, or inside classes), decorated as a Triton
    kernel.  Raises :class:`Unresolved`."""
    scope: list[ast.stmt] = list(tree.body)
    names = qualname.split(".")
    for depth, name in enumerate(names):
        last = depth == len(names) - 1
        match: ast.FunctionDef | ast.ClassDef | None = None
        for node in scope:
            if last and isinstance(node, ast.FunctionDef) and node.name == name:
                match = node
            elif not last and isinstance(node, ast.ClassDef) and node.name == name:
                match = node
        if match is None:
            raise Unresolved(NOT_A_KERNEL, f"no def of {qualname} in the installed module (a "
                                           "different release of its package than recorded?)")
        if last:
            assert isinstance(match, ast.FunctionDef)
            if not any(_decorator_name(d) in KERNEL_DECORATORS for d in match.decorator_list):
                raise Unresolved(NOT_A_KERNEL, f"{qualname} is not decorated as a Triton kernel "
                                               "(@triton.jit, @triton.autotune, "
                                               "@triton.heuristics)")
            return match
        scope = list(match.body)
    raise AssertionError("unreachable")


def kernel_source(text: str, node: ast.FunctionDef) -> str:
    """The kernel's source as Triton holds it: the lines ``inspect.getsourcelines`` gives for
    the function (from its first decorator to the end of its block), dedented, from the
    ``def`` on."""
    first = min([node.lineno] + [d.lineno for d in node.decorator_list])
    lines = text.splitlines(keepends=True)
    block = inspect.getblock(lines[first - 1:])
    src = textwrap.dedent("".join(block))
    found = _DEF.search(src)
    return src[found.start():] if found else src


def find(module: str, qualname: str, recorded_sha256: Any) -> InstalledKernel:
    """The installed kernel ``module:qualname`` whose source hashes to ``recorded_sha256``,
    checked without running anything.  Raises :class:`Unresolved`."""
    path = locate(module)
    text = read_module(path)
    try:
        tree = ast.parse(text, filename=str(path))
    except (SyntaxError, ValueError) as exc:
        raise Unresolved(NOT_A_KERNEL, f"{path} does not parse: {exc}") from None
    node = find_definition(tree, qualname)
    digest = source_sha256(kernel_source(text, node))
    if digest != recorded_sha256:
        raise Unresolved(SOURCE_MISMATCH,
                         f"the installed {module}:{qualname} ({path}) hashes to {digest[:12]}, "
                         f"recorded {str(recorded_sha256)[:12]}: another release of its package "
                         "than the recording machine's")
    return InstalledKernel(module, qualname, path, digest)


@contextlib.contextmanager
def _installed_path_only() -> Iterator[None]:
    """``sys.path`` without the working directory while a kernel module is imported."""
    saved = list(sys.path)
    sys.path[:] = search_path()
    try:
        yield
    finally:
        sys.path[:] = saved


def load(kernel: InstalledKernel) -> Any:
    """Import the checked kernel's module (installed code) and return the object its qualified
    name names; the imported module must be the file that was checked.  Raises
    :class:`Unresolved`."""
    try:
        with _installed_path_only():
            module = importlib.import_module(kernel.module)
    except BaseException as exc:  # an installed module may raise anything on import
        if isinstance(exc, KeyboardInterrupt):
            raise
        first = (str(exc).splitlines() or [""])[0][:300]
        raise Unresolved(NOT_INSTALLED, f"import {kernel.module} failed: "
                                        f"{type(exc).__name__}: {first}") from None
    file = getattr(module, "__file__", None)
    if not file or os.path.realpath(file) != os.path.realpath(kernel.path):
        raise Unresolved(NOT_INSTALLED, f"{kernel.module} imported from {file}, not from the "
                                        f"checked {kernel.path}")
    obj: Any = module
    for part in kernel.qualname.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            raise Unresolved(NOT_A_KERNEL, f"{kernel.module} has no {kernel.qualname} once "
                                           "imported")
    return obj


def check_loaded(kernel: InstalledKernel, src: str) -> None:
    """The imported kernel's own source must hash to what was checked on disk."""
    digest = source_sha256(src)
    if digest != kernel.source_sha256:
        raise Unresolved(SOURCE_MISMATCH, f"the imported {kernel.module}:{kernel.qualname} "
                                          f"hashes to {digest[:12]}, its file to "
                                          f"{kernel.source_sha256[:12]}")
