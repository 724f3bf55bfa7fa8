"""The map in docs/architecture.md stays true: every module is on it, imports go only in the
allowed directions, there is no import circle, and a long module says why at its top; a broad
``except`` says why on its line."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("warmup", "cache_tools")
#: What each part may import (besides itself and the standard library / third parties).  The
#: order is the one-way data flow: plan -> facts -> expansion -> driver -> transport -> report.
LAYERS = {
    "cache_tools": set(),
    "warmup.base": {"cache_tools"},
    "warmup.plan": {"cache_tools", "warmup.base"},
    "warmup.observe": {"cache_tools", "warmup.base"},
    "warmup.patches": {"cache_tools", "warmup.base", "warmup.observe"},
    "warmup.serve": {"cache_tools", "warmup.base", "warmup.plan", "warmup.observe"},
    "warmup.coverage": {"cache_tools", "warmup.base", "warmup.plan", "warmup.observe",
                        "warmup.serve"},
    "warmup.sidecar": {"cache_tools", "warmup.base", "warmup.plan", "warmup.observe",
                       "warmup.serve", "warmup.coverage"},
    "warmup.prebake": {"cache_tools", "warmup.base", "warmup.plan", "warmup.observe",
                       "warmup.serve"},
    "warmup.view": {"cache_tools", "warmup.base", "warmup.serve", "warmup.coverage"},
    "warmup.cli": {"cache_tools", "warmup.base", "warmup.plan", "warmup.observe",
                   "warmup.patches", "warmup.serve", "warmup.coverage", "warmup.sidecar",
                   "warmup.prebake", "warmup.view"},
}
#: Imports against the layers, each with the reason it is allowed (kept short on purpose).
EXCEPTIONS = {
    # The plugin is SGLang's entry point into every process: it wires the layers together
    # (events, patches, the --warmups hook with the view's text for its log lines and, with
    # WARMUP_SECOND_PASS, the second pass).
    ("warmup.serve.plugin", "warmup.patches"): "entry point",
    ("warmup.serve.plugin", "warmup.coverage"): "entry point",
    ("warmup.serve.plugin", "warmup.view"): "entry point",
}
#: Modules that may import the CLI: the package's ``python -m`` entry.
CLI_IMPORTERS = {"warmup.__main__"}
LONG = 500  # lines; a module above this says why at its top ("Longer than 500 lines: ...")


def modules() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for path in sorted((REPO / pkg).rglob("*.py")):
            rel = path.relative_to(REPO).with_suffix("")
            parts = list(rel.parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


MODULES = modules()
#: every module's text and syntax tree, read once at collection: CPython 3.11's ``ast.parse``
#: can fail with "AST constructor recursion depth mismatch" while a thread that an earlier test
#: left behind compiles code, so nothing here parses once tests have started
TEXTS = {name: path.read_text(encoding="utf-8") for name, path in MODULES.items()}
TREES = {name: ast.parse(text) for name, text in TEXTS.items()}


def group(name: str) -> str:
    if name.startswith("cache_tools"):
        return "cache_tools"
    parts = name.split(".")
    if name == "warmup.__main__":  # ``python -m warmup``: the command line
        return "warmup.cli"
    if len(parts) == 1 or parts[1] in ("errors", "settings"):
        return "warmup.base"
    return ".".join(parts[:2])


def imports(name: str, *, annotations: bool = False) -> set[str]:
    """The project modules ``name`` imports, at module level or inside functions (with
    ``annotations``, under ``if TYPE_CHECKING:`` too)."""
    tree = TREES[name]
    is_pkg = MODULES[name].name == "__init__.py"
    found: set[str] = set()
    for node in (ast.walk(tree) if annotations else _runtime_nodes(tree)):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".") if is_pkg else name.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            targets = [mod] + [f"{mod}.{a.name}" for a in node.names]
        else:
            continue
        for t in targets:
            while t and t not in MODULES:
                t = t.rpartition(".")[0]
            if t and t != name and t.split(".")[0] in PACKAGES:
                found.add(t)
    return found


def _runtime_nodes(tree: ast.AST):
    """Every node but those under ``if TYPE_CHECKING:`` (annotations only: not an import)."""
    todo = [tree]
    while todo:
        node = todo.pop()
        yield node
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                todo.extend(child.orelse)
                continue
            todo.append(child)


GRAPH = {name: imports(name) for name in MODULES}
#: Every file's imports, the ones for annotations alone included: a file-level circle.
FILE_GRAPH = {name: imports(name, annotations=True) for name in MODULES}


def test_every_module_is_on_the_map():
    """Each module is named on the map: as its path (``cache_tools/archive/reader.py``,
    ``plan/expr.py`` inside ``warmup/``) or, for a package, its folder."""
    text = (REPO / "docs" / "architecture.md").read_text(encoding="utf-8")

    def named(n: str) -> bool:
        rel = MODULES[n].relative_to(REPO)
        forms = {f"`{rel}`", f"`{rel.relative_to(rel.parts[0])}`"}
        if rel.name == "__init__.py":
            forms |= {f"`{rel.parent}/`", f"`{rel.parent.relative_to(rel.parts[0])}/`"}
        return any(f in text for f in forms)

    missing = [n for n in MODULES if n not in PACKAGES and n.rsplit(".", 1)[-1] != "__main__"
               and not named(n)]
    assert not missing, f"add these modules to docs/architecture.md: {missing}"


def test_imports_go_only_in_the_allowed_directions():
    wrong, used = [], set()
    for name, targets in GRAPH.items():
        g = group(name)
        for t in targets:
            tg = group(t)
            if tg == g or tg in LAYERS[g]:
                continue
            if (name, tg) in EXCEPTIONS:
                used.add((name, tg))
                continue
            wrong.append(f"{name} -> {t}")
    assert not wrong, "imports against the layers (docs/architecture.md):\n" + "\n".join(wrong)
    assert used == set(EXCEPTIONS), f"exceptions no longer needed: {set(EXCEPTIONS) - used}"


def test_nothing_imports_the_cli_and_libraries_never_import_typer():
    cli = [f"{n} -> {t}" for n, ts in GRAPH.items() for t in ts
           if t.startswith("warmup.cli") and not n.startswith("warmup.cli")
           and n not in CLI_IMPORTERS]
    assert not cli, cli
    typer_users = [n for n, p in MODULES.items() if not n.startswith("warmup.cli")
                   and re.search(r"^\s*(import typer|from typer|import click|from click)",
                                 p.read_text(encoding="utf-8"), re.M)]
    assert not typer_users, typer_users


def test_cache_tools_never_imports_warmup():
    assert not [f"{n} -> {t}" for n, ts in GRAPH.items() if n.startswith("cache_tools")
                for t in ts if t.startswith("warmup")]


def test_no_import_circles():
    """Tarjan over every import of every file (function-level ones too: a lazy import is still
    a circle; and those under ``if TYPE_CHECKING:``: a file that names another's type for its
    annotations depends on it)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    circles: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(FILE_GRAPH[v]):
            # a package's __init__ that imports its own submodules is not a circle
            if w.startswith(v + "."):
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                circles.append(sorted(comp))

    for v in sorted(FILE_GRAPH):
        if v not in index:
            visit(v)
    assert not circles, f"import circles: {circles}"


@pytest.mark.parametrize("name", sorted(MODULES))
def test_a_long_module_says_why(name):
    lines = TEXTS[name].count("\n")
    if lines <= LONG:
        return
    doc = ast.get_docstring(TREES[name]) or ""
    assert "Longer than 500 lines" in doc, (
        f"{MODULES[name].relative_to(REPO)} has {lines} lines: split it, or say at its top why "
        "not (\"Longer than 500 lines: ...\")")


#: The most lines a function may have without a reason written above it.
MAX_FUNCTION_LINES = 80


def test_no_long_function_without_a_reason():
    """A function above MAX_FUNCTION_LINES lines (decorators and docstring included) says why
    in a comment right above it, starting ``# Longer than 80 lines:``."""
    long = []
    for name, path in MODULES.items():
        lines = TEXTS[name].splitlines()
        for node in ast.walk(TREES[name]):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            first = min([node.lineno] + [d.lineno for d in node.decorator_list])
            if node.end_lineno - first + 1 <= MAX_FUNCTION_LINES:
                continue
            above = lines[first - 2].strip() if first >= 2 else ""
            if not above.startswith("# Longer than 80 lines:"):
                long.append(f"{path.relative_to(REPO)}:{node.lineno} {node.name} "
                            f"({node.end_lineno - first + 1} lines)")
    assert not long, "split these functions into named steps, or say why above them:\n" + \
        "\n".join(long)


#: A handler that catches these catches our own bugs as readily as the failure it is for.
BROAD = ("Exception", "BaseException")
_NOQA = re.compile(r"noqa(:\s*[A-Z]+[0-9]+(\s*,\s*[A-Z]+[0-9]+)*)?", re.IGNORECASE)


def broad_excepts_without_a_reason(text: str, tree: ast.AST | None = None) -> list[int]:
    """The lines of ``except Exception`` / ``except BaseException`` (alone or in a tuple, or a
    bare ``except:``) that carry no reason: a comment on the ``except`` line with words besides
    a ``noqa`` code."""
    import io
    import tokenize

    comments = {tok.start[0]: tok.string
                for tok in tokenize.generate_tokens(io.StringIO(text).readline)
                if tok.type == tokenize.COMMENT}
    silent = []
    for node in ast.walk(tree if tree is not None else ast.parse(text)):
        if not isinstance(node, ast.ExceptHandler):
            continue
        types = node.type.elts if isinstance(node.type, ast.Tuple) else [node.type]
        if node.type is not None and not any(isinstance(t, ast.Name) and t.id in BROAD
                                             for t in types):
            continue
        reason = _NOQA.sub("", comments.get(node.lineno, "").lstrip("#"))
        if len(re.findall(r"[^\W\d_]{2,}", reason)) < 2:  # two words at least
            silent.append(node.lineno)
    return sorted(silent)


def test_the_reason_check_reads_the_except_line():
    text = ("try:\n    pass\n"
            "except Exception:\n    pass\n"                                   # 3: none
            "try:\n    pass\n"
            "except BaseException:  # noqa: BLE001\n    raise\n"             # 7: a code alone
            "try:\n    pass\n"
            "except (OSError, Exception) as exc:  # x\n    pass\n"           # 11: no words
            "try:\n    pass\n"
            "except:\n    pass\n"                                            # 15: bare
            "try:\n    pass\n"
            "except Exception:  # noqa: BLE001 - a guest never raises\n    pass\n"
            "try:\n    pass\n"
            "except BaseException:  # cleanup, then raised\n    raise\n"
            "try:\n    pass\n"
            "except ValueError:\n    s = '# not a comment: except Exception'\n")
    assert broad_excepts_without_a_reason(text) == [3, 7, 11, 15]


def test_a_broad_except_says_why_on_its_line():
    """``except Exception`` and ``except BaseException`` only where a guest's failure must not
    break its host, a cleanup raises again, or a failure becomes a reported result, with the
    reason in a comment on the ``except`` line; where the exceptions are known, catch those
    (bugs surface instead of being swallowed)."""
    silent = []
    for name, path in MODULES.items():
        lines = TEXTS[name].splitlines()
        silent += [f"{path.relative_to(REPO)}:{n}: {lines[n - 1].strip()}"
                   for n in broad_excepts_without_a_reason(TEXTS[name], TREES[name])]
    assert not silent, ("catch what you expect, or say on the line why everything must be "
                        "caught here:\n" + "\n".join(silent))
