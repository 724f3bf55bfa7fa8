"""Plan expressions: a tiny, safe arithmetic over named server facts (never ``eval``).

An expression is parsed once with :func:`ast.parse` and checked against a whitelist of node
types; evaluation walks the tree itself.  Supported: integers, booleans, ``+ - * // % **``
(``**`` only with a small exponent), comparisons, ``and or not``, ``a if c else b``, names
(server facts and the plan's ``let`` values), list literals and the functions in
:data:`FUNCTIONS`.  Evaluation is bounded whatever the input: every integer result stays within
±2^40, every list within :data:`MAX_LIST` items, and lists take no arithmetic (``[0] * 10**9``
is an error, not an allocation).
A fact that the server does not have (``None``) makes the expression *undefined*: a
condition is then false and a size skips its shape, with the fact named in the reason.
"""

from __future__ import annotations

import ast
import math
from dataclasses import dataclass
from typing import Any, Callable, Mapping

MAX_LENGTH = 256  # characters of one expression
MAX_DEPTH = 16  # nesting of the syntax tree
MAX_POWER = 64  # largest exponent of ``**``
MAX_MAGNITUDE = 1 << 40  # results beyond this are a plan error, not a huge allocation
MAX_LIST = 1024  # items of one list value (server facts such as decode_graph_bs are far shorter)


class ExprSyntaxError(ValueError):
    """The expression text is not in the plan language (found at load time)."""


class ExprEvalError(ValueError):
    """The expression is well-formed but cannot be evaluated (division by zero, overflow, …)."""


class Undefined(Exception):
    """A fact the expression needs is not set on this server."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.name = name


def _next_pow2(x: int) -> int:
    x = int(x)
    return 1 if x <= 1 else 1 << (x - 1).bit_length()


def _ceil_div(a: int, b: int) -> int:
    if b == 0:
        raise ZeroDivisionError
    return -(-a // b)


def _align_up(x: int, m: int) -> int:
    return _ceil_div(x, m) * m


def _align_down(x: int, m: int) -> int:
    if m == 0:
        raise ZeroDivisionError
    return (x // m) * m


def _odd(x: int) -> int:
    """The smallest integer >= x (and >= 2) that is not divisible by 16: Triton's 'other' class."""
    x = max(int(x), 2)
    return x + 1 if x % 16 == 0 else x


def _batch_buckets(buckets: Any, lo_size: int, cap: int) -> list[int]:
    """A few batch sizes per power-of-two range up to ``cap``: in each range (2^(k-1), 2^k] the
    largest captured bucket (or the range's top), and one size in Triton's "other" integer
    class, the range's smallest (lo + 1: a burst costs per request, and every "other" size of
    the range meets the same kernels); sizes above the largest bucket run eager, so the range top
    and the size just above the largest bucket are added there (in the range that holds it, that size is the "other"
    one).  When buckets are given, a range wholly above them runs eager at every size: its two
    integer classes are its smallest sizes, lo + 1 and the first multiple of 16.
    Sorted, unique, every size in [lo_size, cap]."""
    cap, lo_size = int(cap), max(int(lo_size), 1)
    if cap < lo_size:
        return []
    graphs = sorted({int(b) for b in (buckets or []) if 1 <= int(b) <= cap})
    largest = graphs[-1] if graphs else 0
    out: set[int] = {1}
    lo = 1
    while lo < cap:
        hi = min(lo * 2, cap)
        if graphs and lo >= largest and lo >= 16:
            # the same kernels (next_power_of_2 and integer class) as the range top, cheaper
            out.update({lo + 1, min(lo + 16 - lo % 16, hi)})
            lo = hi
            continue
        inside = [b for b in graphs if lo < b <= hi]
        out.add(inside[-1] if inside else hi)
        if lo < largest + 1 <= hi and (largest + 1) % 16:
            other = largest + 1  # the first eager size is this range's "other" size
        else:
            other = lo + 1       # the smallest: the same kernels as any other "other" size
        if other <= hi and other % 16:
            out.add(other)
        if hi > largest:
            out.add(hi)
        lo = hi
    if largest and largest < cap:
        out.add(largest + 1)
    return sorted(x for x in out if lo_size <= x <= cap)


def _pow2_classes(lo_size: int, cap: int) -> list[int]:
    """The smallest size of each Triton integer class in each power-of-two range of
    ``[lo_size, cap]``: 1, and in each range (2^(k-1), 2^k] its smallest size not divisible by
    16 ("other") and its smallest multiple of 16, where the range holds them.  A kernel
    specialized on ``next_power_of_2(x)`` and on x's integer class meets at these sizes every
    key that any size in ``[lo_size, cap]`` meets, at the least cost where the cost grows with
    the size (a prompt's length).  Sorted, unique."""
    cap, lo_size = int(cap), max(int(lo_size), 1)
    out = [1] if lo_size == 1 <= cap else []
    lo = 1
    while lo < cap:
        hi = min(lo * 2, cap)
        start = max(lo + 1, lo_size)
        other = start + 1 if start % 16 == 0 else start
        div16 = -(-start // 16) * 16
        out += sorted(x for x in {other, div16} if x <= hi)
        lo = hi
    return out


def _scale(xs: Any, k: int, b: int) -> list[int]:
    """``[x * k + b for x in xs]``: sizes in other units (widths in tokens, say)."""
    if not isinstance(xs, (list, tuple)):
        raise ExprEvalError(f"scale() needs a list as its first argument, not {xs!r}")
    return [int(x) * int(k) + int(b) for x in xs]


def _seq_or_args(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    def call(*args: Any) -> Any:
        if len(args) == 1 and isinstance(args[0], (list, tuple)):
            if not args[0]:
                raise ExprEvalError(f"{name}() of an empty list")
            return fn(args[0])
        if not args:
            raise ExprEvalError(f"{name}() needs at least one argument")
        return fn(args)

    return call


#: Functions a plan expression may call, with their arity (None = variadic).
FUNCTIONS: dict[str, tuple[Callable[..., Any], int | None]] = {
    "min": (_seq_or_args("min", min), None),
    "max": (_seq_or_args("max", max), None),
    "len": (lambda xs: len(xs), 1),
    "ceil_div": (_ceil_div, 2),
    "align_up": (_align_up, 2),
    "align_down": (_align_down, 2),
    "next_pow2": (_next_pow2, 1),
    "odd": (_odd, 1),
    "abs": (abs, 1),
    # batch_buckets(decode_graph_bs, lo, hi): a few batch sizes per power-of-two range in [lo, hi]
    "batch_buckets": (_batch_buckets, 3),
    # pow2_classes(lo, hi): the smallest size of each integer class per power-of-two range
    "pow2_classes": (_pow2_classes, 2),
    # scale(xs, k, b): every item of a list times k plus b
    "scale": (_scale, 3),
    # default(x, y): x, or y when x is not set on this server (x is evaluated lazily)
    "default": (lambda x, y: x, 2),
}

_BINOPS: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: lambda a, b: a + b,
    ast.Sub: lambda a, b: a - b,
    ast.Mult: lambda a, b: a * b,
    ast.FloorDiv: lambda a, b: a // b,
    ast.Mod: lambda a, b: a % b,
    ast.Pow: lambda a, b: a**b,
}
_CMPOPS: dict[type, Callable[[Any, Any], bool]] = {
    ast.Eq: lambda a, b: a == b,
    ast.NotEq: lambda a, b: a != b,
    ast.Lt: lambda a, b: a < b,
    ast.LtE: lambda a, b: a <= b,
    ast.Gt: lambda a, b: a > b,
    ast.GtE: lambda a, b: a >= b,
    ast.In: lambda a, b: a in b,
    ast.NotIn: lambda a, b: a not in b,
}
_ALLOWED = (
    ast.Expression, ast.BinOp, ast.UnaryOp, ast.BoolOp, ast.Compare, ast.IfExp, ast.Call,
    ast.Name, ast.Load, ast.Constant, ast.List, ast.Tuple,
    ast.And, ast.Or, ast.Not, ast.USub, ast.UAdd,
    *_BINOPS, *_CMPOPS,
)


@dataclass(frozen=True)
class Expr:
    """A checked expression: its source text and the names it reads."""

    text: str
    names: frozenset[str]
    _tree: ast.Expression

    def evaluate(self, env: Mapping[str, Any]) -> Any:
        """Evaluate against ``env``; raises Undefined, ExprEvalError."""
        try:
            value = _eval(self._tree.body, env)
        except ZeroDivisionError:
            raise ExprEvalError(f"division by zero in {self.text!r}") from None
        except (TypeError, OverflowError) as exc:
            raise ExprEvalError(f"cannot evaluate {self.text!r}: {exc}") from None
        return value

    def __str__(self) -> str:
        return self.text


#: parses of one expression before a spurious AST error is let through (below)
_PARSE_TRIES = 3


def _syntax_tree(text: str) -> ast.Expression:
    """``ast.parse(text, mode="eval")``, again where CPython 3.11 raised its spurious
    ``SystemError: AST constructor recursion depth mismatch``: its AST builder keeps one depth
    counter per interpreter, which another thread's parse can move while this one runs
    (python/cpython#106905); the text is the same, so a second parse gives its tree."""
    for _ in range(_PARSE_TRIES - 1):
        try:
            return ast.parse(text, mode="eval")
        except SystemError as exc:
            if "recursion depth mismatch" not in str(exc):
                raise
    return ast.parse(text, mode="eval")


def parse(text: str, known_names: frozenset[str] | set[str]) -> Expr:
    """Check ``text`` against the plan language and the names it may read."""
    if len(text) > MAX_LENGTH:
        raise ExprSyntaxError(f"expression is {len(text)} characters long (limit {MAX_LENGTH})")
    try:
        tree = _syntax_tree(text.strip())
    except SyntaxError as exc:
        raise ExprSyntaxError(f"not a valid expression: {exc.msg}") from None
    names: set[str] = set()
    _check(tree, 0, names, frozenset(known_names))
    return Expr(text=text.strip(), names=frozenset(names), _tree=tree)


def _check(node: ast.AST, depth: int, names: set[str], known: frozenset[str]) -> None:
    if depth > MAX_DEPTH:
        raise ExprSyntaxError(f"expression is nested more than {MAX_DEPTH} levels deep")
    if not isinstance(node, _ALLOWED):
        raise ExprSyntaxError(f"'{type(node).__name__}' is not allowed in plan expressions")
    if isinstance(node, ast.Constant):
        value = node.value
        if not isinstance(value, (int, bool)):
            raise ExprSyntaxError(f"only integers and booleans are allowed, not {value!r}")
        if abs(value) > MAX_MAGNITUDE:
            raise ExprSyntaxError(f"integer {digits(value)} is beyond ±2^40")
    if isinstance(node, ast.Name):
        if node.id not in known and node.id not in FUNCTIONS:
            raise ExprSyntaxError(f"unknown name {node.id!r}")
        names.add(node.id)
    if isinstance(node, ast.Call):
        if not isinstance(node.func, ast.Name) or node.func.id not in FUNCTIONS:
            raise ExprSyntaxError("only the functions " + ", ".join(sorted(FUNCTIONS))
                                  + " may be called")
        if node.keywords:
            raise ExprSyntaxError("keyword arguments are not allowed")
        _, arity = FUNCTIONS[node.func.id]
        if arity is not None and len(node.args) != arity:
            raise ExprSyntaxError(f"{node.func.id}() takes {arity} argument(s), got {len(node.args)}")
        for arg in node.args:
            _check(arg, depth + 1, names, known)
        return
    if isinstance(node, ast.BinOp) and isinstance(node.right, ast.Constant):
        if isinstance(node.op, (ast.FloorDiv, ast.Mod)) and node.right.value == 0:
            raise ExprSyntaxError("division by zero")
    for child in ast.iter_child_nodes(node):
        _check(child, depth + 1, names, known)


def _eval(node: ast.AST, env: Mapping[str, Any]) -> Any:
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name):
        if node.id in FUNCTIONS:
            raise ExprEvalError(f"{node.id} is a function; call it")
        value = env.get(node.id)
        if value is None:
            raise Undefined(node.id)
        return _bounded(value)
    if isinstance(node, (ast.List, ast.Tuple)):
        return _bounded([_eval(e, env) for e in node.elts])
    if isinstance(node, ast.UnaryOp):
        value = _eval(node.operand, env)
        if isinstance(node.op, ast.Not):
            return not value
        return -value if isinstance(node.op, ast.USub) else +value
    if isinstance(node, ast.BoolOp):
        if isinstance(node.op, ast.And):
            result: Any = True
            for v in node.values:
                result = _eval(v, env)
                if not result:
                    return result
            return result
        result = False
        for v in node.values:
            result = _eval(v, env)
            if result:
                return result
        return result
    if isinstance(node, ast.BinOp):
        left, right = _eval(node.left, env), _eval(node.right, env)
        if isinstance(left, (list, tuple)) or isinstance(right, (list, tuple)):
            raise ExprEvalError("lists take no arithmetic; use min(), max(), len() or `in`")
        if isinstance(node.op, ast.Pow) and (not isinstance(right, int) or right > MAX_POWER):
            raise ExprEvalError(f"exponent {right!r} is above {MAX_POWER}")
        return _bounded(_BINOPS[type(node.op)](left, right))
    if isinstance(node, ast.Compare):
        left = _eval(node.left, env)
        for op, comp in zip(node.ops, node.comparators):
            right = _eval(comp, env)
            if not _CMPOPS[type(op)](left, right):
                return False
            left = right
        return True
    if isinstance(node, ast.IfExp):
        return _eval(node.body, env) if _eval(node.test, env) else _eval(node.orelse, env)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):  # _check lets no other call through
        if node.func.id == "default":
            try:
                return _eval(node.args[0], env)
            except Undefined:
                return _eval(node.args[1], env)
        fn, _ = FUNCTIONS[node.func.id]
        return _bounded(fn(*[_eval(a, env) for a in node.args]))
    raise ExprEvalError(f"unsupported node {type(node).__name__}")  # unreachable after _check


def _bounded(value: Any) -> Any:
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_MAGNITUDE:
        raise ExprEvalError(f"value {digits(value)} is beyond ±2^40")
    if isinstance(value, (list, tuple)):
        if len(value) > MAX_LIST:
            raise ExprEvalError(f"a list of {len(value)} items is above the limit of {MAX_LIST}")
        for item in value:
            _bounded(item)
    return value


def digits(value: int) -> str:
    """An integer for an error line: short ones whole, long ones by their digit count."""
    if value.bit_length() < 200:
        return str(value)
    return f"of {math.floor(math.log10(abs(value))) + 1:,} digits"  # str() stops at 4,300
