"""Function source: read it from a live object or from a file's syntax tree, hash it, and
rewrite one exact line of it into a new function (a guarded source rewrite).

Reading from the file (``FileView``) lets the launcher process predict what the scheduler
processes will do without importing the heavy DeepSeek-V4 backend (about 7 s and all of torch's
kernel modules).  Both views return the same text for the same function: the dedented block
that ``inspect.getsource`` returns, decorators included, so one hash table serves both.
"""

from __future__ import annotations

import __future__
import ast
import hashlib
import importlib.util
import inspect
import linecache
import textwrap
from pathlib import Path
from types import FunctionType, ModuleType
from typing import Any, Callable, Mapping

from warmup.patches.status import Refused

#: Attribute set on every function this package installs; its value is the fix number.
MARK = "__sglang_warmup_fix__"

_FUTURE_FLAGS = 0
for _name in __future__.all_feature_names:
    _FUTURE_FLAGS |= getattr(__future__, _name).compiler_flag


class TargetMissing(LookupError):
    """The installed SGLang has no such class, method or function (the message says which)."""


class SourceUnavailable(RuntimeError):
    """The target exists but its source cannot be read (e.g. an image that ships only .pyc)."""


def source_hash(text: str) -> str:
    """First 16 hex digits of the sha256 of a dedented function source."""
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def mark_of(obj: Any) -> int | None:
    """The fix number an installed function carries, or None for SGLang's own code."""
    if isinstance(obj, property):
        obj = obj.fget
    return getattr(obj, MARK, None)


class LiveView:
    """Sources and members of an imported module (``Class.member`` or ``function`` paths)."""

    def __init__(self, module: ModuleType) -> None:
        self.module = module
        self.name = module.__name__

    def _resolve(self, path: str) -> tuple[Any, str, Any]:
        owner: Any = self.module
        parts = path.split(".")
        for part in parts[:-1]:
            owner = getattr(owner, part, None)
            if owner is None:
                raise TargetMissing(f"{self.name} has no {part}")
        name = parts[-1]
        if isinstance(owner, type):
            for klass in owner.__mro__:
                if name in vars(klass):
                    return owner, name, vars(klass)[name]
        elif name in vars(owner):
            return owner, name, vars(owner)[name]
        raise TargetMissing(f"{self.name} has no {path}")

    def member(self, path: str) -> Any:
        """The raw attribute (a ``property`` stays a property)."""
        return self._resolve(path)[2]

    def has(self, path: str) -> bool:
        try:
            self._resolve(path)
        except TargetMissing:
            return False
        return True

    def source(self, path: str) -> str:
        """Dedented source of a function, or of a property's getter."""
        obj = self.member(path)
        if isinstance(obj, property):
            obj = obj.fget
        if isinstance(obj, (staticmethod, classmethod)):
            obj = obj.__func__
        if not callable(obj):
            raise TargetMissing(f"{self.name}.{path} is not a function")
        try:
            return textwrap.dedent(inspect.getsource(obj))
        except (OSError, TypeError) as exc:
            raise SourceUnavailable(f"no source for {self.name}.{path}: {exc}") from None

    def kind(self, path: str) -> str:
        """``property`` | ``function`` | ``other``."""
        obj = self.member(path)
        if isinstance(obj, property):
            return "property"
        return "function" if callable(obj) else "other"

    def fields(self, class_name: str) -> set[str]:
        """Annotated field names of a class and its bases (dataclass fields)."""
        klass = getattr(self.module, class_name, None)
        if not isinstance(klass, type):
            raise TargetMissing(f"{self.name} has no {class_name}")
        names: set[str] = set()
        for base in klass.__mro__:
            names.update(vars(base).get("__annotations__", {}))
        return names

    def global_names(self) -> set[str]:
        return set(vars(self.module))


class FileView:
    """The same questions answered from a module's source file, without importing it."""

    def __init__(self, name: str, path: Path) -> None:
        self.name = name
        self.path = Path(path)
        self.text = self.path.read_text(encoding="utf-8")
        self.lines = self.text.splitlines(keepends=True)
        self.tree = ast.parse(self.text, filename=str(self.path))

    @classmethod
    def of(cls, module_name: str) -> "FileView":
        """Locate ``module_name``'s file from its top-level package, importing nothing else."""
        top, _, rest = module_name.partition(".")
        spec = importlib.util.find_spec(top)
        if spec is None or not spec.submodule_search_locations:
            raise TargetMissing(f"package {top} is not installed")
        rel = Path(*rest.split(".")) if rest else Path()
        for base in spec.submodule_search_locations:
            candidate = Path(base) / rel.with_suffix(".py")
            if candidate.is_file():
                return cls(module_name, candidate)
            package_init = Path(base) / rel / "__init__.py"
            if rest and package_init.is_file():
                return cls(module_name, package_init)
        raise TargetMissing(f"no source file for {module_name}")

    def _node(self, path: str) -> ast.AST:
        body = self.tree.body
        node: ast.AST | None = None
        for part in path.split("."):
            node = next(
                (n for n in body
                 if isinstance(n, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                 and n.name == part),
                None,
            )
            if node is None:
                # Class-level aliases (``name = Other.name``) count as members.
                for n in body:
                    if isinstance(n, ast.Assign) and any(
                        isinstance(t, ast.Name) and t.id == part for t in n.targets
                    ):
                        return n
                raise TargetMissing(f"{self.name} has no {path}")
            body = getattr(node, "body", [])
        assert node is not None
        return node

    def member(self, path: str) -> ast.AST:
        return self._node(path)

    def has(self, path: str) -> bool:
        try:
            self._node(path)
        except TargetMissing:
            return False
        return True

    def source(self, path: str) -> str:
        node = self._node(path)
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            raise TargetMissing(f"{self.name}.{path} is not a function")
        first = min([node.lineno] + [d.lineno for d in node.decorator_list])
        return textwrap.dedent("".join(self.lines[first - 1:node.end_lineno]))

    def kind(self, path: str) -> str:
        node = self._node(path)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            decorators = {d.id for d in node.decorator_list if isinstance(d, ast.Name)}
            return "property" if "property" in decorators else "function"
        return "other"

    def fields(self, class_name: str) -> set[str]:
        node = self._node(class_name)
        return {
            n.target.id for n in getattr(node, "body", [])
            if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)
        }

    def global_names(self) -> set[str]:
        names: set[str] = set()
        for node in self.tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                names.update((a.asname or a.name).split(".")[0] for a in node.names)
            elif isinstance(node, ast.Assign):
                names.update(t.id for t in node.targets if isinstance(t, ast.Name))
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                names.add(node.target.id)
        return names


View = LiveView | FileView


class RewriteRefused(RuntimeError):
    """A guarded rewrite found the source not in the exact expected shape."""


def guarded_rewrite(original: Any, *, what: str, old: str, new: str,
                    inject: Mapping[str, Any], fix: int) -> FunctionType:
    """``rewrite_function`` for a fix's ``build``: any refusal of its guards, or source that no
    longer compiles, becomes ``Refused`` naming ``what`` (the patched attribute)."""
    try:
        return rewrite_function(original, old=old, new=new, inject=inject, fix=fix)
    # the guards' refusals, no source to read (inspect: OSError, TypeError), source that no
    # longer compiles; anything else is a bug the registry's boundary names by its type
    except (RewriteRefused, OSError, TypeError, SyntaxError) as exc:
        raise Refused(f"guarded rewrite of {what} refused: {exc}") from None


def rewrite_function(
    original: FunctionType,
    *,
    old: str,
    new: str,
    inject: Mapping[str, Any],
    fix: int,
) -> FunctionType:
    """A copy of ``original`` whose one line ``old`` reads ``new``.

    Guards: ``old`` must occur exactly once in the dedented source, the function must not use
    a closure or zero-argument ``super()`` (a module-level ``def`` cannot recreate those), and
    every name in ``inject`` must start with ``__sglang_warmup_`` (they are set on the module
    so the new code reads live module globals, exactly like the original).  The new function is
    compiled under a pseudo file name registered in ``linecache`` with the original file's line
    numbering, so tracebacks and ``inspect.getsource`` show the code that actually runs.
    """
    text = textwrap.dedent(inspect.getsource(original))
    count = text.count(old)
    if count != 1:
        raise RewriteRefused(
            f"expected exactly one occurrence of {old.strip()!r} in "
            f"{original.__qualname__}, found {count}"
        )
    if "super()" in text or "__class__" in text:
        raise RewriteRefused(f"{original.__qualname__} uses super() or __class__")
    if original.__closure__:
        raise RewriteRefused(f"{original.__qualname__} uses a closure")
    if old.count("\n") != new.count("\n"):
        raise RewriteRefused("a rewrite must keep the line count (tracebacks stay aligned)")
    for name in inject:
        if not name.startswith("__sglang_warmup_"):
            raise RewriteRefused(f"injected name {name!r} must start with __sglang_warmup_")
    new_text = text.replace(old, new)
    module = inspect.getmodule(original)
    if module is None:
        raise RewriteRefused(f"no module for {original.__qualname__}")
    first_line = original.__code__.co_firstlineno
    source_file = inspect.getsourcefile(original) or original.__code__.co_filename
    pseudo = f"<sglang-warmup fix {fix}: {source_file}>"
    padded = "\n" * (first_line - 1) + new_text
    code = compile(padded, pseudo, "exec",
                   flags=original.__code__.co_flags & _FUTURE_FLAGS, dont_inherit=True)
    linecache.cache[pseudo] = (len(padded), None, padded.splitlines(keepends=True), pseudo)
    for name, value in inject.items():
        setattr(module, name, value)
    namespace: dict[str, Any] = {}
    exec(code, vars(module), namespace)  # noqa: S102 - SGLang's own source, one line changed
    func = namespace[original.__name__]
    func.__qualname__ = original.__qualname__
    func.__module__ = original.__module__
    func.__doc__ = original.__doc__
    func.__defaults__ = original.__defaults__
    func.__kwdefaults__ = original.__kwdefaults__
    func.__dict__.update({k: v for k, v in vars(original).items() if k != MARK})
    setattr(func, MARK, fix)
    func.__sglang_warmup_original__ = original
    return func


def clone(func: FunctionType, *, globals_: Mapping[str, Any] | None = None,
          closure: Mapping[str, Any] | None = None) -> FunctionType:
    """A copy of ``func`` with some globals or closure variables replaced, for behavioural
    probes that must not touch the host's module state."""
    import types

    g = dict(func.__globals__)
    if globals_:
        g.update(globals_)
    cells = func.__closure__
    if closure:
        cells = tuple(
            types.CellType(closure[name]) if name in closure else cell
            for name, cell in zip(func.__code__.co_freevars, func.__closure__ or ())
        )
    copy = FunctionType(func.__code__, g, func.__name__, func.__defaults__, cells)
    copy.__kwdefaults__ = func.__kwdefaults__
    return copy


def call_quietly(fn: Callable[[], Any]) -> tuple[Any, str | None]:
    """``(result, None)`` or ``(None, "Type: message")``: probes never raise."""
    try:
        return fn(), None
    except Exception as exc:  # noqa: BLE001 - a probe reports, it does not fail
        return None, f"{type(exc).__name__}: {exc}"
