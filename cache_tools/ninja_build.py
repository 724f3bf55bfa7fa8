"""An op's ``build.ninja``, read as ninja reads it, for :mod:`cache_tools.ninja_log`.

Only what FlashInfer writes (``flashinfer/jit/cpp_ext.py``): top-level variables continued over
lines, rules, builds with their own bindings, ``default``.  Each edge's command is evaluated as
ninja evaluates it (edge bindings, then the rule's, then the file's; ``$in`` and ``$out``
shell-quoted as ninja quotes them), because ninja keys its build log on the command's hash.
The file comes from an archive: it is data, bounded in what it may evaluate, never run.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable

#: characters one build.ninja may evaluate in all (FlashInfer's evaluate some tens of KiB)
MAX_EVALUATED = 4 << 20
#: the bindings ninja allows in a rule (it refuses any other)
RULE_BINDINGS = frozenset({"command", "depfile", "deps", "description", "pool", "restat",
                           "rspfile", "rspfile_content", "generator", "dyndep",
                           "msvc_deps_prefix"})


class Unsupported(Exception):
    """Ninja's records cannot be written for this op; the message says why."""


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


class _Budget:
    """Characters one parse may evaluate in all (variables that repeat each other grow
    without it); past it the op is left alone."""

    def __init__(self, chars: int = MAX_EVALUATED) -> None:
        self.left = chars

    def spend(self, n: int) -> None:
        self.left -= n
        if self.left < 0:
            raise Unsupported(f"build.ninja: more than {MAX_EVALUATED:,} characters evaluated")


def _evaluate(text: str, lookup: Callable[[str], str], budget: _Budget) -> str:
    out, pos = [], 0
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
        budget.spend(len(out[-2]) + len(out[-1]))
    budget.spend(len(text) - pos)
    return "".join(out) + text[pos:]


def _logical_lines(text: str) -> list[str]:
    """Lines with ninja's ``$``-newline continuations joined (the next line's indent dropped)."""
    out: list[str] = []
    pending = ""
    for raw in text.split("\n"):
        line = raw.lstrip(" ") if pending else raw
        if not pending and line.lstrip(" ").startswith("#"):   # a comment runs to its end
            out.append(line)
            continue
        if re.search(r"(?<!\$)(\$\$)*\$\Z", line):
            pending += line[:-1]
            continue
        out.append(pending + line)
        pending = ""
    if pending:
        out.append(pending)
    return out


def _unescaped(text: str, chars: str) -> list[int]:
    """Where ``chars`` stand in ``text`` outside ninja's escapes (``$$``, ``$ ``, ``$:``,
    ``$name``, ``${name}``): the separators ninja sees."""
    found, i = [], 0
    while i < len(text):
        if text[i] == "$":
            i = max(_VAR.match(text, i).end(), i + 1)   # type: ignore[union-attr]
            continue
        if text[i] in chars:
            found.append(i)
        i += 1
    return found


def _paths(text: str, scope: dict[str, str], budget: _Budget) -> list[str]:
    cuts = [-1, *_unescaped(text, " "), len(text)]
    return [_evaluate(p, lambda n: scope.get(n, ""), budget)
            for p in (text[a + 1:b] for a, b in zip(cuts, cuts[1:])) if p]


def parse(text: str) -> tuple[list[Edge], list[str]]:
    """The edges of a FlashInfer ``build.ninja`` (top-level variables, rules, builds with their
    own bindings, ``default``) with each command evaluated as ninja evaluates it, and the
    default targets.  Anything else (``include``, ``subninja``, pools, response files, implicit
    or order-only dependencies) raises :class:`Unsupported`."""
    budget = _Budget()
    scope: dict[str, str] = {}
    rules: dict[str, dict[str, str]] = {}
    builds: list[tuple[list[str], str, list[str], dict[str, str]]] = []
    defaults: list[str] = []
    current: dict[str, str] | None = None
    builds_current: dict[str, str] | None = None   # the bindings of the build line above
    for line in _logical_lines(text):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        if line.startswith(" "):
            # ninja drops the spaces around the name and before the value, not after it
            key, eq, value = line.lstrip(" ").partition("=")
            key, value = key.strip(" "), value.lstrip(" ")
            if current is None or not eq:
                raise Unsupported(f"build.ninja: an indented line outside a rule or build: {line.strip()[:80]!r}")
            if current is builds_current:   # a build's own binding: evaluated where it stands
                current[key] = _evaluate(value, lambda n: scope.get(n, ""), budget)
            elif key not in RULE_BINDINGS:
                raise Unsupported(f"build.ninja: a rule binding ninja refuses: {key[:40]!r}")
            else:
                current[key] = value
            continue
        current = builds_current = None
        word, _, rest = line.partition(" ")
        if word == "rule":
            current = rules.setdefault(rest.strip(), {})
        elif word == "build":
            colons = _unescaped(rest, ":")
            if not colons:
                raise Unsupported("build.ninja: a build line without ':'")
            head, tail = rest[:colons[0]], rest[colons[0] + 1:]
            rule, _, ins = tail.strip(" ").partition(" ")
            if _unescaped(head, "|") or _unescaped(ins, "|"):
                raise Unsupported("build.ninja: implicit or order-only paths")
            current = builds_current = {}
            builds.append((_paths(head, scope, budget), rule, _paths(ins, scope, budget),
                           current))
        elif word == "default":
            defaults += _paths(rest, scope, budget)
        elif "=" in line and word not in ("include", "subninja", "pool"):
            key, _, value = line.partition("=")
            scope[key.strip(" ")] = _evaluate(value.lstrip(" "), lambda n: scope.get(n, ""),
                                              budget)
        else:
            raise Unsupported(f"build.ninja: {word!r} is not what FlashInfer writes")
    return [_edge(outs, rules, rule, ins, binds, scope, budget)
            for outs, rule, ins, binds in builds if rule != "phony"], defaults


def _edge(outs: list[str], rules: dict[str, dict[str, str]], rule_name: str, ins: list[str],
          binds: dict[str, str], scope: dict[str, str], budget: _Budget) -> Edge:
    rule = rules.get(rule_name)
    if rule is None:
        raise Unsupported(f"build.ninja: no rule {rule_name!r}")
    if "rspfile" in rule or "generator" in rule or "restat" in rule or "dyndep" in rule:
        raise Unsupported(f"build.ninja: rule {rule_name} has bindings not written here")
    edge_vars = binds           # evaluated where they stood (in the file's scope then)
    evaluating: set[str] = set()
    evaluated: dict[str, str] = {}   # a rule binding is evaluated once per edge

    def lookup(name: str) -> str:
        if name == "in":
            return " ".join(_shell(p) for p in ins)
        if name == "out":
            return " ".join(_shell(p) for p in outs)
        if name in edge_vars:
            return edge_vars[name]
        if name in rule:
            if name not in evaluated:
                if name in evaluating:
                    raise Unsupported(f"build.ninja: rule {rule_name}: ${name} refers to itself")
                evaluating.add(name)
                evaluated[name] = _evaluate(rule[name], lookup, budget)
                evaluating.discard(name)
            return evaluated[name]
        return scope.get(name, "")

    deps = lookup("deps") if "deps" in rule or "deps" in edge_vars else ""
    if deps not in ("", "gcc"):
        raise Unsupported(f"build.ninja: rule {rule_name}: deps = {deps[:20]!r}, not gcc")
    if lookup("depfile") and deps != "gcc":
        raise Unsupported(f"build.ninja: rule {rule_name}: depfile without deps = gcc")
    return Edge(tuple(outs), tuple(ins), lookup("command"), deps == "gcc")
