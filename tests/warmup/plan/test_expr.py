"""Plan expressions: a safe evaluator (no eval), with undefined facts and bounded values."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from warmup.plan import expr as E

NAMES = {"a", "b", "none"}


def ev(text: str, **env):
    return E.parse(text, NAMES).evaluate({"a": 10, "b": 16, "none": None, **env})


@pytest.mark.parametrize("text,value", [
    ("a + b * 2", 42), ("b // 3", 5), ("b % 5", 1), ("2 ** 10", 1024), ("-a", -10),
    ("a if a > b else b", 16), ("a < b and b > 0", True), ("not a", False), ("a in [1, 10]", True),
    ("min(a, b, 3)", 3), ("max([a, b])", 16), ("len([1, 2, 3])", 3), ("ceil_div(a, 3)", 4),
    ("align_up(a, 16)", 16), ("align_down(b + 5, 16)", 16), ("next_pow2(a)", 16), ("next_pow2(1)", 1),
    ("odd(b)", 17), ("odd(a)", 10), ("odd(0)", 2), ("default(none, 7)", 7), ("default(a, 7)", 10),
    ("1 < a < b", True),
])
def test_values(text, value):
    assert ev(text) == value


def test_undefined_fact_names_itself():
    with pytest.raises(E.Undefined) as info:
        ev("none + 1")
    assert info.value.name == "none"


def test_short_circuit_skips_undefined():
    assert ev("a > 100 and none > 1") is False


@pytest.mark.parametrize("text,message", [
    ("a // (b - 16)", "division by zero in 'a // (b - 16)'"),
    ("ceil_div(a, b - 16)", "division by zero in 'ceil_div(a, b - 16)'"),
    ("2 ** 100", "exponent 100 is above 64"),
    ("b ** 12", "value 281474976710656 is beyond ±2^40"),
    ("max([])", "max() of an empty list"),
])
def test_eval_errors(text, message):
    with pytest.raises(E.ExprEvalError) as info:
        ev(text)
    assert str(info.value) == message


@pytest.mark.parametrize("text,message", [
    ("open('x')", "only the functions abs, align_down, align_up, batch_buckets, ceil_div, default, "
                  "len, max, min, next_pow2, odd, pow2_classes, scale may be called"),
    ("c + 1", "unknown name 'c'"),
    ("a.real", "'Attribute' is not allowed in plan expressions"),
    ("[x for x in [1]]", "'ListComp' is not allowed in plan expressions"),
    ("lambda: 1", "'Lambda' is not allowed in plan expressions"),
    ("'text'", "only integers and booleans are allowed, not 'text'"),
    ("1.5", "only integers and booleans are allowed, not 1.5"),
    ("a[0]", "'Subscript' is not allowed in plan expressions"),
    ("min(a, key=b)", "keyword arguments are not allowed"),
    ("ceil_div(a)", "ceil_div() takes 2 argument(s), got 1"),
    ("a // 0", "division by zero"),
    ("a +", "not a valid expression: invalid syntax"),
    ("x" * 300, "expression is 300 characters long (limit 256)"),
])
def test_syntax_errors(text, message):
    with pytest.raises(E.ExprSyntaxError) as info:
        E.parse(text, NAMES)
    assert str(info.value) == message


def test_names_are_recorded():
    assert E.parse("min(a, b) + default(none, 1)", NAMES).names == {"a", "b", "none"}


@pytest.mark.parametrize("text,message", [
    ("[0] * 10**9", "lists take no arithmetic; use min(), max(), len() or `in`"),
    ("[1] + [2]", "lists take no arithmetic; use min(), max(), len() or `in`"),
    ("decode_graph_bs * 2", "lists take no arithmetic; use min(), max(), len() or `in`"),
    ("2 ** 41", "value 2199023255552 is beyond ±2^40"),
    ("(2 ** 40) ** 64", "value of 771 digits is beyond ±2^40"),
])
def test_evaluation_is_bounded_for_every_operator(text, message):
    env = {"decode_graph_bs": [1, 2, 4]}
    with pytest.raises(E.ExprEvalError) as info:
        E.parse(text, {"decode_graph_bs"}).evaluate(env)
    assert str(info.value) == message


def test_a_list_fact_above_the_list_limit_is_refused():
    with pytest.raises(E.ExprEvalError) as info:
        E.parse("max(xs)", {"xs"}).evaluate({"xs": list(range(E.MAX_LIST + 1))})
    # The list is a fact, not built by the expression: it is checked where it is used.
    assert str(info.value) == f"a list of {E.MAX_LIST + 1} items is above the limit of {E.MAX_LIST}"


def test_scale_maps_a_list_and_stays_bounded():
    parse = lambda t: E.parse(t, {"w"})  # noqa: E731
    assert parse("scale(batch_buckets([], 2, w), 128, 37)").evaluate({"w": 8}) == [
        293, 421, 549, 677, 1061]
    assert parse("scale([], 2, 1)").evaluate({"w": 0}) == []
    with pytest.raises(E.ExprEvalError, match=r"scale\(\) needs a list as its first argument, not 3"):
        parse("scale(w, 2, 1)").evaluate({"w": 3})
    with pytest.raises(E.ExprEvalError, match="beyond ±2\\^40"):
        parse("scale([w], 2 ** 39, 0)").evaluate({"w": 1 << 20})


@pytest.mark.parametrize("buckets,lo,cap,expected", [
    ([1, 2, 4, 8], 1, 16, [1, 2, 3, 4, 5, 8, 9, 16]),
    ([1, 2, 4, 8], 9, 16, [9, 16]),
    ([1, 2, 4, 8], 1, 8, [1, 2, 3, 4, 5, 8]),
    ([], 1, 16, [1, 2, 3, 4, 5, 8, 9, 16]),
    ([1, 2, 4, 8, 16, 24, 32, 48, 64], 1, 256,
     [1, 2, 3, 4, 5, 8, 9, 16, 17, 32, 33, 64, 65, 80, 129, 144]),
    ([1, 2, 4, 8], 9, 96, [9, 16, 17, 32, 33, 48, 65, 80]),
    ([8], 1, 0, []),
])
def test_batch_buckets_picks_a_few_sizes_per_power_of_two_range(buckets, lo, cap, expected):
    got = E.parse("batch_buckets(b, lo, cap)", {"b", "lo", "cap"}).evaluate(
        {"b": buckets, "lo": lo, "cap": cap})
    assert got == expected


def _key(x: int) -> tuple[int, str]:
    """What a Triton kernel specialized on ``next_power_of_2(x)`` and x's integer class sees."""
    return 1 << (x - 1).bit_length(), "1" if x == 1 else "div16" if x % 16 == 0 else "other"


@pytest.mark.parametrize("lo,cap,expected", [
    (1, 16, [1, 2, 3, 5, 9, 16]),
    (2, 1023, [2, 3, 5, 9, 16, 17, 32, 33, 48, 65, 80, 129, 144, 257, 272, 513, 528]),
    (9, 16, [9, 16]),
    (17, 100, [17, 32, 33, 48, 65, 80]),
    (20, 40, [20, 32, 33]),
    (16, 16, [16]),
    (5, 4, []),
])
def test_pow2_classes_picks_the_smallest_size_of_each_key(lo, cap, expected):
    assert E.parse("pow2_classes(lo, cap)", {"lo", "cap"}).evaluate(
        {"lo": lo, "cap": cap}) == expected


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 600), st.integers(0, 700))
def test_pow2_classes_meets_every_key_of_its_range_at_its_smallest_size(lo, cap):
    got = E.parse("pow2_classes(lo, cap)", {"lo", "cap"}).evaluate({"lo": lo, "cap": cap})
    sizes = range(lo, cap + 1)
    assert got == sorted(set(got)) and all(lo <= x <= cap for x in got)
    assert {_key(x) for x in got} == {_key(x) for x in sizes} and len(got) == len(set(map(_key, got)))
    assert all(x == min(y for y in sizes if _key(y) == _key(x)) for x in got)


def test_a_spurious_ast_error_of_cpython_3_11_is_parsed_again(monkeypatch):
    """CPython 3.11's AST builder can raise ``AST constructor recursion depth mismatch`` when
    another thread parses at the same moment: the same text parses again; any other
    ``SystemError``, or the mismatch every time, goes through."""
    import ast as real_ast

    from warmup.plan import expr

    real = real_ast.parse
    raised: list[str] = []

    def flaky(text, mode="exec"):
        if not raised:
            raised.append(text)
            raise SystemError("AST constructor recursion depth mismatch (before=174, after=226)")
        return real(text, mode=mode)

    monkeypatch.setattr(expr.ast, "parse", flaky)
    assert expr.parse("2 * x", {"x"}).evaluate({"x": 3}) == 6 and raised == ["2 * x"]

    def always(text, mode="exec"):
        raise SystemError("AST constructor recursion depth mismatch (before=1, after=2)")

    monkeypatch.setattr(expr.ast, "parse", always)
    with pytest.raises(SystemError, match="depth mismatch"):
        expr.parse("1", set())

    def other(text, mode="exec"):
        raise SystemError("something else")

    monkeypatch.setattr(expr.ast, "parse", other)
    with pytest.raises(SystemError, match="something else"):
        expr.parse("1", set())
