"""Fuzzing plans: whatever the text, the loader gives a Plan or one PlanError line; whatever the
expression, evaluation gives a value or one expression error, within a memory budget; a loaded
plan expands within its request limit; and a facts file gives facts a plan expands against, or
one FactsError line."""

from __future__ import annotations

import tracemalloc

import _facts_cache
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from warmup.errors import FactsError, PlanError
from warmup.plan import expr as E
from warmup.plan import facts_file, loader, shipped
from warmup.plan.expand import expand

_FUZZ = settings(max_examples=120, deadline=None, suppress_health_check=list(HealthCheck))
#: What evaluating one expression may allocate at most (bytes, traced by tracemalloc).
EXPR_MEMORY_BUDGET = 2 * 1024 * 1024

_TOKENS = ["1", "0", "16", "219", "10", "40", "64", "2", "-", "+", "*", "//", "%", "**", "(", ")",
           "[", "]", ",", "<", "==", "and", "or", "not", "if", "else", "in", "min(", "max(",
           "len(", "odd(", "align_up(", "ceil_div(", "next_pow2(", "default(", "batch_buckets(", "scale(",
           "page_size", "chunked_prefill_size", "decode_graph_bs", "max_running_requests",
           "context_length", "x", "True", "9999999999", "'a'", "lambda", ".", "__class__"]


@_FUZZ
@given(st.lists(st.sampled_from(_TOKENS), min_size=1, max_size=24))
def test_expressions_evaluate_or_fail_in_one_line_within_budget(tokens):
    text = " ".join(tokens)
    names = {"page_size", "chunked_prefill_size", "decode_graph_bs", "max_running_requests",
             "context_length", "x"}
    env = {"page_size": 256, "chunked_prefill_size": 8192, "decode_graph_bs": [1, 2, 4, 8],
           "max_running_requests": 1 << 40, "context_length": None, "x": 3}
    try:
        parsed = E.parse(text, names)
    except E.ExprSyntaxError as exc:
        assert "\n" not in str(exc)
        return
    tracemalloc.start()
    try:
        value = parsed.evaluate(env)
    except (E.ExprEvalError, E.Undefined) as exc:
        assert "\n" not in str(exc)
        value = None
    finally:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    assert peak < EXPR_MEMORY_BUDGET
    if isinstance(value, int) and not isinstance(value, bool):
        assert abs(value) <= E.MAX_MAGNITUDE
    if isinstance(value, list):
        assert len(value) <= E.MAX_LIST


_KEYS = st.sampled_from(["version", "name", "phases", "shapes", "class", "kind", "lengths",
                         "batch_sizes", "from", "to", "request", "n", "let", "limits",
                         "max_requests", "over_limit", "extends", "base", "prompt", "groups",
                         "when", "family", "decode_tokens", "running", "variants"])
_VALUES = st.recursive(
    st.one_of(st.integers(-5, 10**13), st.integers(-10**30, 10**30), st.booleans(), st.none(),
              st.sampled_from(["extend", "decode", "batch", "prefix", "x", "p", "skip", "fail",
                               "page_size * 2", "max_running_requests", "1 // 0",
                               "batch_buckets(decode_graph_bs, 1, 10**9)", "[0] * 10**9"])),
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(_KEYS, inner, max_size=5)),
    max_leaves=25)


@_FUZZ
@given(st.dictionaries(_KEYS, _VALUES, max_size=6), st.booleans())
def test_plans_load_and_expand_or_fail_in_one_line(doc, valid_head):
    if valid_head:
        doc = {"version": 1, "name": "fuzz", **{k: v for k, v in doc.items()
                                                  if k not in ("version", "name")}}
    text = yaml.safe_dump(doc)
    try:
        plan = loader.loads(text, "fuzz.yaml")
    except PlanError as exc:
        assert exc.message.startswith("fuzz.yaml:") and "\n" not in exc.message
        return
    try:
        exp = expand(plan, _facts_cache.pr44627())
    except PlanError as exc:
        assert "\n" not in exc.message
        return
    assert exp.num_requests <= plan.max_requests


@_FUZZ
@given(st.binary(max_size=400))
def test_plan_bytes(data):
    try:
        loader.loads(data, "raw.yaml")
    except PlanError as exc:
        assert exc.message.startswith("raw.yaml:") and "\n" not in exc.message


_FACT_KEYS = st.sampled_from(sorted(_facts_cache.pr44627().to_dict()) + [
    "cuda_graph_config", "cuda_graph_bs", "cuda_graph_max_bs", "disable_cuda_graph", "decode",
    "prefill", "bs", "max_bs", "backend", "max_seq_len", "max_total_num_tokens"])
_FACT_VALUES = st.recursive(
    st.one_of(st.integers(-10**30, 10**30), st.floats(allow_nan=True, allow_infinity=True),
              st.booleans(), st.none(), st.sampled_from(["x", "1", "disabled", "full", "1e30"])),
    lambda inner: st.one_of(st.lists(inner, max_size=4),
                            st.dictionaries(_FACT_KEYS, inner, max_size=4)),
    max_leaves=12)


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))  # expansion: 0.1 s
@given(st.dictionaries(_FACT_KEYS, _FACT_VALUES, max_size=8), st.booleans(), st.booleans())
def test_facts_files(tmp_path_factory, changes, as_dump, as_json):
    """A facts file (a dump of every fact, or a flat mapping of server settings) with any
    values: facts the default plan expands against (or refuses in one PlanError line), or one
    FactsError line naming the file."""
    import json

    base = _facts_cache.pr44627().to_dict() if as_dump else {}
    p = tmp_path_factory.mktemp("fuzz") / "facts.json"
    doc = {**base, **changes}
    p.write_text(json.dumps(doc, allow_nan=True) if as_json else yaml.safe_dump(doc))
    try:
        facts = facts_file.from_file(p)
    except FactsError as exc:
        assert exc.message.startswith(f"{p}: ") and "\n" not in exc.message
        return
    try:
        expand(loader.load(shipped.resolve("default")), facts)
    except PlanError as exc:
        assert "\n" not in exc.message
