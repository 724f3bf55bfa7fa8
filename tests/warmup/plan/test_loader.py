"""Plan loading: every bad input gets one precise `file:line: key.path: what` error and a hint."""

from __future__ import annotations

import pytest

from warmup.plan import loader
from warmup.errors import PlanError

BASE = """version: 1
name: t
phases:
  - name: p
    shapes:
      - class: c
        kind: extend
        lengths: [1, 219]
"""
EXPR_HINT = ("expressions use integers, + - * // %, comparisons, and/or/not, x if c else y, server "
             "facts and: abs, align_down, align_up, batch_buckets, ceil_div, default, len, max, min, "
             "next_pow2, odd, pow2_classes, scale")
SIZE_HINT = "a size is a positive integer or an expression such as `chunked_prefill_size + 219`"

CASES = {
    "unknown top-level key": (
        BASE + "colour: red\n",
        "p.yaml:9: colour: unknown key 'colour'",
        "valid keys: version, name, description, let, defaults, limits, sampling_variants, flush, phases"),
    "unknown shape key (typo)": (
        BASE.replace("lengths: [1, 219]", "lenghts: [1, 219]"),
        "p.yaml:8: phases[0].shapes[0].lenghts: unknown key 'lenghts' for kind 'extend'",
        "did you mean 'lengths'? valid keys: class, kind, why, when, requires, sampling, "
        "max_new_tokens, request, family, covers_up_to, reaches, lengths"),
    "key of another kind": (
        BASE.replace("lengths: [1, 219]", "lengths: [1]\n        base: 4096"),
        "p.yaml:9: phases[0].shapes[0].base: unknown key 'base' for kind 'extend'",
        "valid keys: class, kind, why, when, requires, sampling, max_new_tokens, request, family, "
        "covers_up_to, reaches, lengths"),
    "wrong type": (
        BASE.replace("lengths: [1, 219]", "lengths: 5"),
        "p.yaml:8: phases[0].shapes[0].lengths: expected a list, got integer 5",
        "write a YAML list, e.g. [1, 219, 256]"),
    "zero size": (
        BASE.replace("[1, 219]", "[0, 219]"),
        "p.yaml:8: phases[0].shapes[0].lengths[0]: sizes must be positive, got 0", SIZE_HINT),
    "negative size": (
        BASE.replace("[1, 219]", "[-3]"),
        "p.yaml:8: phases[0].shapes[0].lengths[0]: sizes must be positive, got -3", SIZE_HINT),
    "float size": (
        BASE.replace("[1, 219]", "[1.5]"),
        "p.yaml:8: phases[0].shapes[0].lengths[0]: expected an integer or an expression, got number 1.5",
        SIZE_HINT),
    "unknown fact": (
        BASE.replace("[1, 219]", "[chunked_prefil_size]"),
        "p.yaml:8: phases[0].shapes[0].lengths[0]: `chunked_prefil_size`: unknown name 'chunked_prefil_size'",
        "did you mean 'chunked_prefill_size'? `sglang-warmup plan facts` lists the server facts"),
    "literal division by zero": (
        BASE.replace("[1, 219]", "['page_size // 0']"),
        "p.yaml:8: phases[0].shapes[0].lengths[0]: `page_size // 0`: division by zero", EXPR_HINT),
    "over-long expression": (
        BASE.replace("[1, 219]", "['" + "+".join(["1"] * 200) + "']"),
        "p.yaml:8: phases[0].shapes[0].lengths[0]: `1+1+1+1+1+1+1+1+1+1+1+1+1+1+1+1+1+1+1+1+1+1+1+1+1+1+1+1+1...`: "
        "expression is 399 characters long (limit 256)", EXPR_HINT),
    "deeply nested expression": (
        BASE.replace("[1, 219]", "['" + "-" * 30 + "1']"),
        "p.yaml:8: phases[0].shapes[0].lengths[0]: `------------------------------1`: "
        "expression is nested more than 16 levels deep", EXPR_HINT),
    "function call outside the list": (
        BASE.replace("[1, 219]", "['__import__(1)']"),
        "p.yaml:8: phases[0].shapes[0].lengths[0]: `__import__(1)`: only the functions abs, align_down, "
        "align_up, batch_buckets, ceil_div, default, len, max, min, next_pow2, odd, pow2_classes, scale may be called",
        EXPR_HINT),
    "attribute access": (
        BASE.replace("[1, 219]", "['page_size.real']"),
        "p.yaml:8: phases[0].shapes[0].lengths[0]: `page_size.real`: 'Attribute' is not allowed in plan "
        "expressions", EXPR_HINT),
    "YAML alias": (
        BASE.replace("lengths: [1, 219]", "lengths: &a [1, 219]\n      - class: d\n        kind: extend\n"
                     "        lengths: *a"),
        "p.yaml:11: <top>: YAML alias *a is not allowed in plans",
        "write the value out; aliases can expand exponentially"),
    "alias bomb": (
        "a: &a [x, x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]\n"
        "c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b]\nd: [*c, *c, *c, *c, *c, *c, *c, *c, *c]\n",
        "p.yaml:2: <top>: YAML alias *a is not allowed in plans",
        "write the value out; aliases can expand exponentially"),
    "python tag": (
        BASE.replace("[1, 219]", "[!!python/object/apply:os.system ['echo hi']]"),
        "p.yaml:8: <top>: YAML tag !!python/object/apply:os.system is not allowed",
        "plans hold plain values only (numbers, text, lists, mappings)"),
    "duplicate key": (
        BASE + "name: u\n", "p.yaml:9: name: duplicate key (first at line 2)", "keep one of them"),
    "duplicate class": (
        BASE + "      - class: c\n        kind: extend\n        lengths: [7]\n",
        "p.yaml:9: phases[0].shapes[1].class: duplicate class 'c' (first at line 6)",
        "class names are unique in a plan"),
    "class named like the driver's flush": (
        BASE.replace("class: c", "class: flush"),
        "p.yaml:6: phases[0].shapes[0].class: 'flush' is reserved: the phase file names the "
        "driver's own steps so", "rename the class"),
    "class named like SGLang's start-up": (
        BASE.replace("class: c", "class: sglang_startup"),
        "p.yaml:6: phases[0].shapes[0].class: 'sglang_startup' is reserved: the phase file "
        "names the driver's own steps so", "rename the class"),
    "tab": (
        BASE.replace("        lengths", "\tlengths"), "p.yaml:8: <top>: tab character (column 1)",
        "indent YAML with spaces only"),
    "empty file": ("", "p.yaml:1: <top>: the plan is empty", "start from a shipped plan: sglang-warmup plan list"),
    "only comments": ("# nothing here\n\n", "p.yaml:1: <top>: the plan is empty",
                      "start from a shipped plan: sglang-warmup plan list"),
    "unsupported version": (
        BASE.replace("version: 1", "version: 2"), "p.yaml:1: version: unsupported plan version 2",
        "this sglang-warmup reads version: 1"),
    "unknown kind": (
        BASE.replace("kind: extend", "kind: extned"),
        "p.yaml:7: phases[0].shapes[0].kind: unknown kind 'extned'",
        "did you mean 'extend'? choose one of: extend, chunked, prefix, concurrent, batch, mixed, decode, "
        "long_context, sampling"),
    "missing required key": (
        BASE.replace("        lengths: [1, 219]\n", ""),
        "p.yaml:6: phases[0].shapes[0].lengths: required key is missing",
        "prompt lengths, each one forward (<= chunk)"),
    "unknown feature": (
        BASE.replace("kind: extend", "kind: extend\n        requires: [radix]"),
        "p.yaml:8: phases[0].shapes[0].requires[0]: unknown feature 'radix'",
        "did you mean 'radix_cache'? choose one of: chunked_prefill, radix_cache, mixed_chunk, "
        "prefill_graph, decode_graph, prefill_graph_context"),
    "let shadows a fact": (
        BASE.replace("phases:", "let:\n  page_size: 4\nphases:"),
        "p.yaml:4: let.page_size: 'page_size' shadows a server fact or function", "choose another name"),
    "bad name": (
        BASE.replace("name: t", "name: My Plan"),
        "p.yaml:2: name: 'My Plan' is not a name",
        "use lower-case letters, digits and _ (start with a letter, <= 64)"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_plan_gets_one_precise_error(case: str) -> None:
    text, message, hint = CASES[case]
    with pytest.raises(PlanError) as info:
        loader.loads(text, "p.yaml")
    assert info.value.message == message
    assert info.value.hint == hint
    assert info.value.exit_code == 2


def test_non_utf8_bytes_name_the_line() -> None:
    with pytest.raises(PlanError) as info:
        loader.loads(b"version: 1\nname: \xff\n", "p.yaml")
    assert info.value.message == "p.yaml:2: <top>: byte 0xff is not UTF-8"
    assert info.value.hint == "save the plan as UTF-8"


def test_oversized_file_is_refused_before_parsing() -> None:
    with pytest.raises(PlanError) as info:
        loader.loads("#" * (loader.MAX_FILE_BYTES + 1), "big.yaml")
    assert info.value.message == "big.yaml:1: <top>: file is 262,145 bytes (limit 262,144)"


def test_missing_file(tmp_path) -> None:
    with pytest.raises(PlanError) as info:
        loader.load(tmp_path / "nope.yaml")
    assert info.value.message == f"{tmp_path / 'nope.yaml'}: cannot read plan: No such file or directory"


def test_shipped_plans_load() -> None:
    for path in ("plans/default.yaml", "plans/deepseek_v4_serving_shapes.yaml"):
        plan = loader.load(path)
        assert plan.name and plan.shapes
        assert len({s.name for s in plan.shapes}) == len(plan.shapes)


def test_the_reserved_class_names_are_the_drivers_own_steps():
    """The plan layer may not import the phase module: the two spellings are kept equal here."""
    from warmup.observe import phase
    from warmup.plan.spec import RESERVED_CLASSES

    assert set(RESERVED_CLASSES) == {phase.FLUSH, phase.SGLANG_STARTUP}
