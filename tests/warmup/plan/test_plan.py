"""Expansion: pure, deterministic, within the server's limits; golden against real SGLang facts."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import _facts_cache
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from warmup.plan import loader
from warmup.errors import PlanError
from warmup.plan.facts import ServerFacts, from_settings
from warmup.plan.expand import expand, over_budget

GOLDEN = Path(__file__).parents[1] / "golden"
PLANS = {"default": "plans/default.yaml", "dsv4": "plans/deepseek_v4_serving_shapes.yaml"}


def summary(exp) -> dict:
    """The golden form of an expansion: every step and skip, without the facts."""
    return {"steps": [[s.index, s.phase, s.shape_class, s.mode, [r.input_len for r in s.requests],
                       [r.input_len for r in s.background], [r.sampling_name for r in s.requests],
                       s.note] for s in exp.steps],
            "skipped": [[k.phase, k.shape_class, k.item, k.reason] for k in exp.skipped],
            "requests": exp.num_requests}


@pytest.mark.parametrize("plan", sorted(PLANS))
@pytest.mark.parametrize("facts", ["pr44627", "small_model"])
def test_golden_expansion(plan, facts):
    exp = expand(loader.load(PLANS[plan]), getattr(_facts_cache, facts)())
    path = GOLDEN / f"{plan}__{facts}.json"
    got = summary(exp)
    if os.environ.get("WARMUP_UPDATE_GOLDEN") == "1":  # regenerate after a deliberate change
        lines = ["{", f'"requests": {got["requests"]},', '"steps": [']
        lines += [json.dumps(x) + "," for x in got["steps"]]
        lines[-1] = lines[-1].rstrip(",")
        lines += ["],", '"skipped": [']
        lines += [json.dumps(x) + "," for x in got["skipped"]]
        if got["skipped"]:
            lines[-1] = lines[-1].rstrip(",")
        lines += ["]", "}"]
        path.write_text("\n".join(lines) + "\n")
    assert got == json.loads(path.read_text())


def test_dsv4_plan_reproduces_pr44627_classes():
    """sglang.md §D.3's example: the class table of PR #44627's warm-up with its launch flags."""
    exp = expand(loader.load(PLANS["dsv4"]), _facts_cache.pr44627())
    by = {}
    for s in exp.steps:
        by.setdefault(s.shape_class, []).append(s)
    lens = lambda cls: [r.input_len for s in by[cls] for r in s.requests]  # noqa: E731
    assert lens("extend_int_classes") == [1, 219, 256, 4096, 5000, 8192]           # class 1
    assert lens("chunked_prompt") == [8192 + 219]                                   # class 2
    assert lens("prefix_hits") == [4096, 4097, 4096 + 37, 4096 + 4096 + 37]         # class 3
    # class 4, and multi-request extends of 2-5 mixed prompts
    assert [len(s.requests) for s in by["concurrent_prefills"]] == [2, 2, 3, 4, 4, 5, 4, 5]
    # class 5: the PR sends every batch size 1-16; the kernels key on next_power_of_2(bs) and on
    # the Triton integer class of bs, so each power-of-two range's top and one "other" size do
    sizes = sorted({len(s.requests) for s in by["batched_extends"]})
    assert sizes == [1, 2, 3, 4, 5, 8, 9, 16]
    assert {1 << (b - 1).bit_length() for b in sizes} == {1, 2, 4, 8, 16}
    totals = [sum(r.input_len for r in s.requests) % 16 == 0 for s in by["batched_extends"]]
    assert totals.count(False) >= len(sizes) - 1 and totals.count(True) >= len(sizes)  # both token classes
    assert [len(s.requests) for s in by["eager_decode"]] == [9, 16]                 # class 7
    # the ratio-128 index combine kernel keys on next_power_of_2(seq_len // 128) and on the
    # integer class of seq_len // 128: every power-of-two range up to the context (1,048,576
    # here), "other" in each and a multiple of 16 in each that holds one, each the smallest
    widths = [n // 128 for n in lens("c128_widths")]
    assert {1 << (w - 1).bit_length() for w in widths} == {2 ** j for j in range(1, 14)}
    assert all(p // 2 + 1 in widths for p in (2 ** j for j in range(2, 14)))
    assert all(p // 2 + 16 in widths for p in (2 ** j for j in range(6, 14))) and 16 in widths
    assert max(lens("c128_widths")) == (4096 + 16) * 128 + 37  # half the context's tokens
    assert "c128_widths" not in {k.shape_class for k in exp.skipped}  # they stand for the rest
    # class 8: a prompt 219 past the 262,144 bucket, then extends that compute exactly 1, 37
    # and 4,133 tokens on its page-aligned radix hit (page 256: the hit is 262,144).
    assert lens("past_context_bucket") == [262144 + 219, 262144 + 1, 262144 + 37, 262144 + 4133]
    assert "33 chunks" in by["past_context_bucket"][0].note
    assert [s.note for s in by["past_context_bucket"][1:]] == [
        "hit on 262144 + extend 1 (1)", "hit on 262144 + extend 37 (other)",
        "hit on 262144 + extend 4133 (other)"]
    first, *extends = [r for s in by["past_context_bucket"] for r in s.requests]
    assert {(r.prefix_key, r.prefix_len) for r in extends} == {(first.prefix_key, 262144)}
    # class 6 (off), and the batches past 16 requests (the request cap is 16)
    assert [k.shape_class for k in exp.skipped] == ["wide_batches", "mixed_batches",
                                                    "graph_decode_batches"]
    assert exp.skipped[1].reason == "mixed chunk is off (--enable-mixed-chunk, needs chunked prefill)"
    names = [r.sampling_name for s in exp.steps for r in (*s.background, *s.requests)]
    assert names[:4] == ["greedy", "default", "greedy", "default"]
    assert exp.flush


def test_mixed_chunk_class_appears_when_on():
    f = dataclasses.replace(_facts_cache.pr44627(), enable_mixed_chunk=True)
    exp = expand(loader.load(PLANS["dsv4"]), f)
    mixed = [s for s in exp.steps if s.shape_class == "mixed_batches"]
    assert [len(s.background) for s in mixed] == [1, 3, 15]
    assert all(s.mode == "mixed" and s.requests[0].input_len == 8192 + 219 for s in mixed)
    assert all(r.ignore_eos and r.max_new_tokens == 48 for s in mixed for r in s.background)


@pytest.mark.parametrize("change,cls,reason", [
    ({"disable_radix_cache": True}, "prefix_hits", "the radix cache is disabled (--disable-radix-cache)"),
    ({"prefill_graph_backend": "disabled", "prefill_graph_buckets": (), "prefill_graph_context": None},
     "past_context_bucket", "the prefill CUDA graph is disabled"),
    ({"chunked_prefill_size": None}, "chunked_prompt",
     "chunked prefill is off (--chunked-prefill-size unset or <= 0)"),
    ({"max_running_requests": 8}, "eager_decode",
     "condition `max_running_requests > decode_graph_max_bs` is false on this server"),
])
def test_features_off_skip_with_reason(change, cls, reason):
    f = dataclasses.replace(_facts_cache.pr44627(), **change)
    exp = expand(loader.load(PLANS["dsv4"]), f)
    assert cls not in exp.classes
    assert [k.reason for k in exp.skipped if k.shape_class == cls and not k.item] == [reason]


def test_expansion_is_deterministic_and_pure():
    plan, f = loader.load(PLANS["default"]), _facts_cache.small_model()
    a, b = expand(plan, f), expand(plan, f)
    assert a == b and a.digest() == b.digest()


def test_expansion_limit_fails_the_plan_when_it_asks_for_fail(tmp_path):
    p = tmp_path / "big.yaml"
    p.write_text("version: 1\nname: big\nlimits: {max_requests: 10, over_limit: fail}\nphases:\n"
                 "  - name: p\n    shapes:\n"
                 "      - class: b\n        kind: decode\n        batch_sizes: [8, 9]\n")
    with pytest.raises(PlanError) as info:
        expand(loader.load(p), _facts_cache.pr44627())
    assert info.value.message == (f"{p}:7: phases[0].shapes[0]: class b: expansion limit: 9 more "
                                  "request(s) would bring the plan to 17, above the limit of 10")
    assert info.value.hint == ("shrink the plan's sizes, raise limits.max_requests, or set "
                               "limits.over_limit: skip")


def test_expansion_over_the_limit_skips_the_classes_that_do_not_fit(tmp_path):
    """The default: a server at start-up runs the classes that fit and names the rest."""
    p = tmp_path / "big.yaml"
    p.write_text("version: 1\nname: big\nlimits: {max_requests: 10}\nphases:\n  - name: p\n"
                 "    shapes:\n"
                 "      - class: wide\n        kind: decode\n        batch_sizes: [8, 9]\n"
                 "      - class: small\n        kind: extend\n        lengths: [5, 6]\n")
    exp = expand(loader.load(p), _facts_cache.pr44627())
    assert exp.classes == ("small",) and exp.num_requests == 2
    (skip,) = exp.skipped
    assert (skip.shape_class, skip.item, skip.reason) == (
        "wide", "", "expansion limit: 9 more request(s) would bring the plan to 17, above the "
        "limit of 10")


def test_expansion_counts_before_it_builds(monkeypatch):
    """A request cap of 10^6 and a class asking for every batch size up to it: refused after
    building at most the limit, not 5*10^11 requests."""
    from dataclasses import replace

    from warmup.plan import expand as expand_mod

    built = []
    real = expand_mod._Expander.request

    def counting(self, *args, **kwargs):
        built.append(1)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(expand_mod._Expander, "request", counting)
    plan = loader.loads("version: 1\nname: huge\nphases:\n  - name: p\n    shapes:\n"
                        "      - class: d\n        kind: decode\n"
                        "        batch_sizes: [max_running_requests]\n", "huge.yaml")
    facts = replace(_facts_cache.pr44627(), max_running_requests=10**6, max_total_tokens=10**9)
    exp = expand(plan, facts)
    assert exp.num_requests == 0 and exp.skipped[0].reason.startswith(
        "expansion limit: 1000000 more request(s) would bring the plan to 1000000")
    assert built == []


def test_a_plan_cannot_raise_its_limit_past_the_ceiling():
    with pytest.raises(PlanError) as info:
        loader.loads("version: 1\nname: x\nlimits: {max_requests: 1000000000000}\nphases:\n"
                     "  - name: p\n    shapes:\n      - {class: c, kind: extend, lengths: [1]}\n",
                     "x.yaml")
    assert info.value.message == ("x.yaml:3: limits.max_requests: 1000000000000 is above the "
                                  "ceiling of 50000")


def test_deeply_nested_yaml_is_refused_before_it_is_built():
    text = "version: 1\nname: x\nphases: " + "[" * 100 + "]" * 100 + "\n"
    with pytest.raises(PlanError) as info:
        loader.loads(text, "nest.yaml")
    assert info.value.message == ("nest.yaml:3: <top>: lists and mappings nested more than 24 "
                                  "levels deep")


def test_list_valued_sizes_are_spliced_into_batch_sizes():
    plan = loader.loads("version: 1\nname: x\nphases:\n  - name: p\n    shapes:\n"
                        "      - class: d\n        kind: decode\n"
                        "        batch_sizes: ['batch_buckets(decode_graph_bs, 1, 16)', 16]\n",
                        "x.yaml")
    exp = expand(plan, _facts_cache.pr44627())
    assert [s.num_requests for s in exp.steps] == [1, 2, 3, 4, 5, 8, 9, 16]


def test_division_by_zero_at_expansion_names_the_line(tmp_path):
    p = tmp_path / "z.yaml"
    p.write_text("version: 1\nname: z\nphases:\n  - name: p\n    shapes:\n      - class: c\n"
                 "        kind: extend\n        lengths: ['page_size // (tp_size - 4)']\n")
    with pytest.raises(PlanError) as info:
        expand(loader.load(p), _facts_cache.pr44627())
    assert info.value.message == (f"{p}:8: phases[0].shapes[0].lengths[0]: "
                                  "division by zero in 'page_size // (tp_size - 4)'")


def test_undefined_fact_skips_only_that_item(tmp_path):
    p = tmp_path / "u.yaml"
    p.write_text("version: 1\nname: u\nphases:\n  - name: p\n    shapes:\n      - class: c\n"
                 "        kind: extend\n        lengths: [7, max_total_tokens]\n")
    exp = expand(loader.load(p), _facts_cache.pr44627())
    assert [s.requests[0].input_len for s in exp.steps] == [7]
    assert exp.skipped[0].item == "max_total_tokens"
    assert exp.skipped[0].reason == ("phases[0].shapes[0].lengths[1] needs max_total_tokens, which is "
                                     "not set on this server")


# --- properties -------------------------------------------------------------------------------
@st.composite
def server(draw) -> ServerFacts:
    ctx = draw(st.sampled_from([2048, 4096, 8192, 32768, 131072, 1048576]))
    chunk = draw(st.one_of(st.none(), st.sampled_from([512, 2048, 4096, 8192, 16384])))
    page = draw(st.sampled_from([1, 16, 64, 256]))
    mrr = draw(st.one_of(st.none(), st.integers(1, 64)))
    bd = draw(st.one_of(st.none(), st.integers(1, 64)))
    graph = draw(st.booleans())
    settings_ = {
        "chunked_prefill_size": chunk, "page_size": page,
        "enable_mixed_chunk": draw(st.booleans()), "disable_radix_cache": draw(st.booleans()),
        "cuda_graph_config": {"decode": {"backend": "full" if bd else "disabled", "max_bs": bd},
                              "prefill": {"backend": "breakable" if graph else "disabled",
                                          "bs": [128, 256, 512, 1024],
                                          "max_seq_len": draw(st.sampled_from([1024, 16384]))}},
    }
    cap = draw(st.one_of(st.none(), st.integers(4096, 1 << 20)))
    return from_settings(settings_, source="file", context_length=ctx, max_running_requests=mrr,
                         max_total_tokens=cap, vocab_size=32000)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(f=server(), plan=st.sampled_from(sorted(PLANS)))
def test_expansion_never_exceeds_the_server(f, plan):
    p = loader.load(PLANS[plan])
    exp = expand(p, f)
    assert exp == expand(p, f)  # deterministic
    assert exp.num_requests <= p.max_requests
    for s in exp.steps:
        for r in (*s.requests, *s.background):
            assert 1 <= r.input_len <= f.max_input_len
            assert r.input_len + r.max_new_tokens <= f.context_length
            assert "logprob" not in json.dumps(r.sampling)
        if f.max_running_requests is not None:
            assert s.num_requests <= f.max_running_requests
        if f.max_total_tokens is not None:
            assert sum(r.input_len + r.max_new_tokens for r in (*s.requests, *s.background)) <= f.max_total_tokens
        if s.mode == "batch" and f.chunked_prefill_size:
            assert s.tokens <= f.chunked_prefill_size
    for k in exp.skipped:
        assert k.reason


@pytest.mark.parametrize("cap,expected", [
    (None, [9, 16, 17, 32, 33, 48, 65, 80, 129, 144]),  # SGLang resolves 256
    (96, [9, 16, 17, 32, 33, 48, 65, 80]),
    (97, [9, 16, 17, 32, 33, 48, 65, 80]),
    (2048, [9, 16, 17, 32, 33, 48, 65, 80, 129, 144, 257, 272]),
])
def test_dsv4_eager_decode_stays_small_at_every_request_cap(cap, expected):
    """PR #44627's flags with another request cap, resolved by SGLang's own argument parser: the
    eager-decode class grows with log2 of the cap, not its square, reaches the cap's
    power-of-two range (at most 512's) with both integer classes in each range, and the plan
    expands."""
    flags = (_facts_cache.DATA / "pr44627.flags").read_text().split()
    i = flags.index("--max-running-requests")
    del flags[i:i + 2]
    if cap is not None:
        flags += ["--max-running-requests", str(cap)]
    facts = _facts_cache.resolve(tuple(flags))
    exp = expand(loader.load(PLANS["dsv4"]), facts)
    sizes = [len(s.requests) for s in exp.steps if s.shape_class == "eager_decode"]
    assert sizes == expected
    top = min(facts.max_running_requests, 512)
    assert (max(sizes) - 1).bit_length() == (top - 1).bit_length()
    assert "eager_decode" not in {k.shape_class for k in exp.skipped}
    # with the batches past 16 requests the plan stays within its own request limit
    assert exp.num_requests < loader.load(PLANS["dsv4"]).max_requests


@pytest.mark.parametrize("cap,chunk,graph,expected", [
    ("16", "8192", True, None),           # PR #44627's launch: 16 requests
    ("64", "4096", True, None),           # 4,096 / 256-token pages: 16 requests per prefill
    ("17", "8192", True, [17]),
    ("64", "16384", True, [17, 32]),      # its largest prefill graph, 8,192 tokens: 32 requests
    ("", "16384", False, [17, 32, 33, 48]),  # the cap resolves to 256; 16,384 / 256 = 64
    ("2048", "262144", False, [17, 32, 33, 48, 65, 80, 129, 144, 257, 272]),  # 512's range
])
def test_dsv4_wide_batches_reach_what_one_prefill_holds(cap, chunk, graph, expected):
    """Prefill batches past the 16 requests batched_extends stops at: each power-of-two range's
    smallest size of each integer class up to the most requests one prefill holds (the request
    cap; the chunk, max_prefill_tokens and the largest prefill graph in whole 256-token pages:
    SGLang's scheduler charges each request whole pages), each as one batched request in both
    total classes; none where that is 16 or less, with the reason."""
    facts = _facts_cache.resolve(_pr_flags(max_running_requests=cap, chunked_prefill_size=chunk))
    if not graph:
        facts = dataclasses.replace(facts, prefill_graph_backend="disabled",
                                    prefill_graph_buckets=(), max_prefill_tokens=int(chunk))
    exp = expand(loader.load(PLANS["dsv4"]), facts)
    steps = [s for s in exp.steps if s.shape_class == "wide_batches"]
    if expected is None:
        assert not steps
        assert [k.reason for k in exp.skipped if k.shape_class == "wide_batches"] == [
            "condition `min(max_running_requests, prefill_reqs) > 16` is false on this server"]
        return
    assert [len(s.requests) for s in steps] == [bs for bs in expected for _ in (0, 1)]
    for odd, aligned in zip(steps[::2], steps[1::2]):
        assert sum(r.input_len for r in odd.requests) % 16 != 0
        assert sum(r.input_len for r in aligned.requests) % 16 == 0
    page = facts.page_size
    for s in steps:  # one prefill: whole pages of every prompt within the chunk
        assert s.mode == "batch" and all(r.input_len >= 1 for r in s.requests)
        assert sum(-(-r.input_len // page) * page for r in s.requests) <= facts.chunked_prefill_size
    assert "wide_batches" not in {k.shape_class for k in exp.skipped}


@pytest.mark.parametrize("cap,graphs,expected", [
    ("16", "8", None),                    # PR #44627's launch
    ("96", "16", None),                   # no graph past 16
    ("16", "64", None),                   # no request past 16
    ("96", "64", [17, 32, 33, 64]),       # graphs 17..64, then eager_decode from 65
    ("2048", "256", [17, 32, 33, 64, 65, 128, 129, 256]),
])
def test_dsv4_graph_decode_batches_cover_the_graphs_past_16(cap, graphs, expected):
    """Decode batches past 16 requests that replay a decode graph: the largest captured size of
    each power-of-two range and its smallest "other" size, from 17 up to the largest graph
    within the request cap; the eager-decode class goes on from there, with no size in both."""
    facts = _facts_cache.resolve(_pr_flags(max_running_requests=cap,
                                           cuda_graph_max_bs_decode=graphs))
    exp = expand(loader.load(PLANS["dsv4"]), facts)
    sizes = [len(s.requests) for s in exp.steps if s.shape_class == "graph_decode_batches"]
    eager = [len(s.requests) for s in exp.steps if s.shape_class == "eager_decode"]
    if expected is None:
        assert sizes == [] and "graph_decode_batches" in {k.shape_class for k in exp.skipped}
        return
    assert sizes == expected
    assert max(sizes) <= facts.decode_graph_max_bs < min(eager, default=facts.decode_graph_max_bs + 1)
    assert all(b in facts.decode_graph_bs or b % 16 for b in sizes)  # a graph, or "other"


def _pr_flags(**changes: str) -> tuple[str, ...]:
    flags = (_facts_cache.DATA / "pr44627.flags").read_text().split()
    for flag, value in changes.items():
        flag = "--" + flag.replace("_", "-")
        if flag in flags:
            i = flags.index(flag)
            del flags[i:i + 2]
        if value:
            flags += [flag, value] if value != "on" else [flag]
    return tuple(flags)


def test_the_mixed_class_reaches_past_16_decoders_when_the_cap_allows():
    facts = _facts_cache.resolve(_pr_flags(enable_mixed_chunk="on", max_running_requests="64"))
    exp = expand(loader.load(PLANS["dsv4"]), facts)
    mixed = [s for s in exp.steps if s.shape_class == "mixed_batches"]
    assert [len(s.background) for s in mixed] == [1, 3, 15, 63]
    assert exp.warnings == ()  # 8,192 is a captured prefill-graph size


def test_a_chunk_size_outside_the_prefill_graph_sizes_is_warned():
    facts = _facts_cache.resolve(_pr_flags(enable_mixed_chunk="on", chunked_prefill_size="4000"))
    exp = expand(loader.load(PLANS["dsv4"]), facts)
    assert exp.warnings == (
        "mixed_batches: a steady mixed step is 4000 tokens (chunked_prefill_size), not a captured "
        "prefill-graph size, so it pads to the 4096-token graph; add 4000 to "
        "--cuda-graph-bs-prefill",)


FEATURE_PLAN = """\
version: 1
name: feats
phases:
  - name: f
    shapes:
      - class: logp
        kind: extend
        family: logprobs
        lengths: [219, 2253]
        request: {logprob_start_len: "input_len // 2", top_logprobs_num: 5}
      - class: par
        kind: extend
        family: parallel_sampling
        lengths: [219]
        max_new_tokens: 8
        request: {n: 4, stream: true, stop_token_ids: 2}
"""


def test_request_features_are_evaluated_per_prompt():
    exp = expand(loader.loads(FEATURE_PLAN, "f.yaml"), _facts_cache.pr44627())
    feats = [(s.shape_class, r.input_len, dict(r.features)) for s in exp.steps for r in s.requests]
    assert feats == [
        ("logp", 219, {"logprob_start_len": 109, "top_logprobs_num": 5, "return_logprob": True}),
        ("logp", 2253, {"logprob_start_len": 1126, "top_logprobs_num": 5, "return_logprob": True}),
        ("par", 219, {"n": 4, "stream": True, "stop_token_ids": 2})]
    assert [s.sequences for s in exp.steps] == [1, 1, 4]
    assert exp.to_dict()["steps"][2]["requests"][0]["features"] == {
        "n": 4, "stop_token_ids": 2, "stream": True}


def test_a_family_turned_off_is_skipped_and_an_unknown_one_is_warned():
    exp = expand(loader.loads(FEATURE_PLAN, "f.yaml"), _facts_cache.pr44627(),
                 skip_families=["logprobs", "logprob"])
    assert exp.classes == ("par",)
    assert [(k.shape_class, k.reason) for k in exp.skipped] == [
        ("logp", "family 'logprobs' is turned off")]
    assert exp.warnings == ("family 'logprob' was turned off, but no class of the plan is in it "
                            "(families: logprobs, parallel_sampling)",)


@pytest.mark.parametrize("request_text,reason", [
    ("{logprob_start_len: input_len}", "logprob_start_len 219 is not below the prompt length 219"),
    ("{n: 65}", "n = 65 parallel samples: expected 1..64"),
    ("{n: 17}", "with n parallel samples, 17 requests at once is above max_running_requests (16)"),
    ("{top_logprobs_num: 5000}", "top_logprobs_num = 5000 is above 1024"),
])
def test_features_the_server_would_refuse_skip_the_class(request_text, reason):
    text = ("version: 1\nname: x\nphases:\n  - name: p\n    shapes:\n      - class: c\n"
            f"        kind: extend\n        lengths: [219]\n        request: {request_text}\n")
    exp = expand(loader.loads(text, "x.yaml"), _facts_cache.pr44627())
    assert exp.steps == () and [(k.shape_class, k.reason) for k in exp.skipped] == [("c", reason)]


@pytest.mark.parametrize("request_text,message", [
    ("{logprobs: 1}", "x.yaml:9: phases[0].shapes[0].request.logprobs: unknown key 'logprobs'"),
    ("{n: -1}", "x.yaml:9: phases[0].shapes[0].request.n: sizes must be >= 0, got -1"),
    ("{stream: 1}", "x.yaml:9: phases[0].shapes[0].request.stream: expected true or false, got 1"),
    ("{n: bs}", "x.yaml:9: phases[0].shapes[0].request.n: `bs`: unknown name 'bs'"),
])
def test_bad_request_features_are_refused_at_load(request_text, message):
    text = ("version: 1\nname: x\nphases:\n  - name: p\n    shapes:\n      - class: c\n"
            f"        kind: extend\n        lengths: [219]\n        request: {request_text}\n")
    with pytest.raises(PlanError) as info:
        loader.loads(text, "x.yaml")
    assert info.value.message == message


def test_shipped_plans_warm_every_request_feature():
    """Both plans send logprobs (from 0, from an offset, top-k, token ids), n > 1, streaming,
    stop ids and long decodes, against PR #44627's facts."""
    for name in PLANS:
        exp = expand(loader.load(PLANS[name]), _facts_cache.pr44627())
        seen = {k for s in exp.steps for r in s.requests for k, _ in r.features}
        assert {"return_logprob", "logprob_start_len", "top_logprobs_num", "token_ids_logprob",
                "n", "stream", "stop_token_ids"} <= seen, name
        starts = {dict(r.features).get("logprob_start_len") for s in exp.steps for r in s.requests}
        assert 0 in starts and any(v for v in starts if v), name
        assert max(r.max_new_tokens for s in exp.steps for r in s.requests) >= 128, name


def _c128_key(seq_len: int) -> tuple[int, str]:
    """What the ratio-128 index combine kernel (``_combine_topk_swa_indices_kernel``, built in
    SGLang's ``ensure_c128``) is specialized on: ``PADDED_TOP_K = next_power_of_2(w)`` and the
    Triton integer class of the row stride ``w = max(max_seq_len // 128, 1)``."""
    w = max(seq_len // 128, 1)
    return 1 << (w - 1).bit_length(), "1" if w == 1 else "div16" if w % 16 == 0 else "other"


@pytest.mark.parametrize("flags", [
    None,  # PR #44627's launch
    ("--model-path", "deepseek-ai/DeepSeek-V4.1-Flash", "--chunked-prefill-size", "4096",
     "--max-running-requests", "16", "--cuda-graph-max-bs-decode", "8",
     "--disable-prefill-cuda-graph", "--context-length", "131072"),  # the H200 run's
])
def test_dsv4_plan_meets_every_c128_key_of_a_prompt_up_to_long_cap(flags):
    """On the H200 every Triton kernel compiled after ready under this plan was that combine
    kernel, at a width the plan's prompts had not reached.  Now any one prompt up to long_cap
    (its chunk boundaries and its last chunk) meets only keys that the warm-up met before."""
    facts = _facts_cache.pr44627() if flags is None else _facts_cache.resolve(flags)
    exp = expand(loader.load(PLANS["dsv4"]), facts)
    chunk = facts.chunked_prefill_size

    def keys(n: int, chunked: bool = True, hit: int = 0) -> set:
        """The keys of the forwards an ``n``-token prompt runs, ``hit`` tokens in the cache."""
        ends = [min(k * chunk, n) for k in range(hit // chunk + 1, -(-n // chunk) + 1)] \
            if chunked else [n]
        return {_c128_key(e) for e in ends}

    hits = exp.prefix_hits()  # what the radix cache holds of each prompt (chained widths)
    met: set = set()
    sent = computed = 0  # the c128 widths' prompt tokens, and those not from the cache
    for s in exp.steps:
        for pos, r in enumerate(s.requests):
            hit = hits[(s.index, pos)].tokens if (s.index, pos) in hits else 0
            met |= keys(r.input_len, s.kind in ("chunked", "extend"), hit)
            if s.shape_class == "c128_widths":
                sent, computed = sent + r.input_len, computed + r.input_len - hit
    # chained, the widths compute the longest prompt's tokens once, not the sum of them all
    longest = max(r.input_len for s in exp.steps if s.shape_class == "c128_widths"
                  for r in s.requests)
    assert computed < longest + 2 * chunk * 20 < sent
    cap = min(facts.max_input_len - 64, 131072)
    lengths = [*range(1, cap + 1, 29), *(m * 128 + d for m in range(1, cap // 128) for d in (0, 127))]
    missing = sorted({n for n in lengths if n <= cap and not keys(n) <= met})
    assert not missing, f"{len(missing)} prompt lengths meet a new key, e.g. {missing[:5]}"


MIXED_PLAN = """version: 1
name: m
phases:
  - name: p
    shapes:
      - class: s
        kind: sampling
        variants: [greedy]
        prompt: 219
        decode_tokens: 2
        concurrency: [1, 2, 3]
        mixed_prompt: 1
        request: {logprob_start_len: "input_len // 2", top_logprobs_num: 5}
"""


def test_a_mixed_prompt_is_sent_alone_and_in_place_of_one_prompt_of_every_burst():
    """A one-token prompt with logprobs is a path of its own (a guard set of the penalties'
    torch.compile graph on the GPU): each concurrency sends its burst, then the burst with its
    last prompt of the mixed length; the features are worked out per prompt."""
    exp = expand(loader.loads(MIXED_PLAN, "m.yaml"), _facts_cache.pr44627())
    assert [[r.input_len for r in s.requests] for s in exp.steps] == [
        [219], [1], [219, 220], [219, 1], [219, 220, 221], [219, 220, 1]]
    assert [s.mode for s in exp.steps] == ["single", "single", *["concurrent"] * 4]
    assert [s.note for s in exp.steps][:2] == ["greedy x1, 2 decode steps",
                                               "greedy x1 with 1, 2 decode steps"]
    one = exp.steps[1].requests[0]
    assert dict(one.features)["logprob_start_len"] == 0


def test_a_mixed_prompt_the_server_refuses_skips_only_its_steps():
    text = MIXED_PLAN.replace("mixed_prompt: 1", "mixed_prompt: 10 ** 9")
    exp = expand(loader.loads(text, "m.yaml"), _facts_cache.pr44627())
    assert [[r.input_len for r in s.requests] for s in exp.steps] == [
        [219], [219, 220], [219, 220, 221]]
    assert [s.item for s in exp.skipped] == ["greedy x1 with 1000000000",
                                            "greedy x2 with 1000000000",
                                            "greedy x3 with 1000000000"]
    assert "above the longest accepted prompt" in exp.skipped[0].reason


@pytest.mark.parametrize("change, reason", [
    # a feature the one-token prompt cannot take (logprobs from position 5 of 1 token)
    ({"request: {logprob_start_len: \"input_len // 2\", top_logprobs_num: 5}":
      "request: {logprob_start_len: 5}"}, "logprob_start_len 5 is not below the prompt length 1"),
    # a fact this server does not set
    ({"mixed_prompt: 1": "mixed_prompt: max_req_input_len"}, "needs max_req_input_len"),
])
def test_a_mixed_prompt_that_cannot_be_sent_skips_its_steps_by_name(change, reason):
    text = MIXED_PLAN
    for old, new in change.items():
        assert old in text
        text = text.replace(old, new)
    exp = expand(loader.loads(text, "m.yaml"), _facts_cache.pr44627())
    assert [[r.input_len for r in s.requests] for s in exp.steps] == [
        [219], [219, 220], [219, 220, 221]]
    assert [s.item.split(" with ")[0] for s in exp.skipped] == ["greedy x1", "greedy x2",
                                                                "greedy x3"]
    assert all(" with " in s.item and reason in s.reason for s in exp.skipped)


def test_a_mixed_prompt_of_the_class_length_adds_no_repeated_step():
    exp = expand(loader.loads(MIXED_PLAN.replace("mixed_prompt: 1", "mixed_prompt: 219"),
                              "m.yaml"), _facts_cache.pr44627())
    assert [[r.input_len for r in s.requests] for s in exp.steps] == [
        [219], [219, 220], [219, 219], [219, 220, 221], [219, 220, 219]]


@pytest.mark.parametrize("plan", sorted(PLANS))
def test_eager_batches_are_below_half_the_smallest_graph_size_with_penalties(plan):
    """Both shipped plans send batches a prefill-graph server runs eager (padding them to its
    smallest captured size would more than double them), as separate requests and as one
    batched request: batch sizes 2, 3 and 5 with an "other" and a 16-divisible total, greedy
    with penalties and top-20 input logprobs; a server without a prefill graph skips both."""
    facts = _facts_cache.pr44627()
    assert facts.prefill_graph
    classes = ("eager_bursts", "eager_batches")
    steps = [s for s in expand(loader.load(PLANS[plan]), facts).steps if s.shape_class in classes]
    for cls, mode in zip(classes, ("concurrent", "batch")):  # separate requests, and one batch
        mine = [s for s in steps if s.shape_class == cls]
        assert mine and {s.mode for s in mine if len(s.requests) > 1} == {mode}
        totals = {(len(s.requests), sum(r.input_len for r in s.requests) % 16 == 0) for s in mine}
        assert {(2, False), (2, True), (3, False), (3, True), (5, False), (5, True)} <= totals
    smallest = min(facts.prefill_graph_buckets)
    assert all(2 * sum(r.input_len for r in s.requests) < smallest for s in steps)
    # a server whose smallest bucket is 16 runs only batches under 8 tokens eager: the batched
    # ones still reach next_power_of_2(bs) = 2, 4 and 8 there, whatever the timing
    rig = dataclasses.replace(facts, prefill_graph_buckets=(16, 32, 64, 128, 256, 4096))
    pow2 = {1 << (len(s.requests) - 1).bit_length()
            for s in expand(loader.load(PLANS[plan]), rig).steps
            if s.shape_class == "eager_batches" and 2 * sum(r.input_len for r in s.requests) < 16}
    assert pow2 == {2, 4, 8}
    # past 16 when the eager region is wider: under a 128-token bucket a batch of up to 63
    # one-token prompts runs eager, but SGLang's scheduler charges each request whole pages of
    # the chunk (256-token pages, an 8,192-token chunk: 32 requests), so the batched sizes
    # reach next_power_of_2(bs) 32 and stop at what one prefill holds; the request cap still
    # bounds them, and the sizes past it are skipped with the reason
    for cap, top, pow2s in ((256, 32, {2, 4, 8, 16, 32}), (40, 32, {2, 4, 8, 16, 32}),
                            (16, 16, {2, 4, 8, 16})):
        wide = dataclasses.replace(facts, max_running_requests=cap)
        exp = expand(loader.load(PLANS[plan]), wide)
        sizes = {len(s.requests) for s in exp.steps if s.shape_class == "eager_batches"}
        assert (min(sizes), max(sizes)) == (2, top)
        assert {1 << (n - 1).bit_length() for n in sizes} == pow2s
        # the DeepSeek-V4 plan stops at what one prefill holds (its let prefill_reqs); the
        # default plan sends the larger sizes and the expansion skips them with the reason
        split = [k.reason for k in exp.skipped if k.shape_class == "eager_batches"]
        assert all("in whole pages of 256: the scheduler would split it" in r for r in split)
        assert bool(split) == (cap > 32 and plan == "default")
    # a prefill graph whose sizes the facts do not name: up to 16, never skipped
    unknown = dataclasses.replace(facts, max_running_requests=256, prefill_graph_buckets=())
    assert max(len(s.requests) for s in expand(loader.load(PLANS[plan]), unknown).steps
               if s.shape_class == "eager_batches") == 16
    for r in (r for s in steps for r in s.requests):
        assert dict(r.features) == {"return_logprob": True, "top_logprobs_num": 20,
                                    "logprob_start_len": 0}
        assert (r.sampling_name, r.max_new_tokens) == ("greedy_penalized", 2)
    eager = dataclasses.replace(facts, prefill_graph_backend="disabled", prefill_graph_buckets=())
    exp = expand(loader.load(PLANS[plan]), eager)
    assert not [s for s in exp.steps if s.shape_class in classes]
    assert [k.reason for k in exp.skipped if k.shape_class in classes] \
        == ["the prefill CUDA graph is disabled"] * 2


@pytest.mark.parametrize("version, refused", [("0.5.17", True), ("0.5.21.post1", True),
                                              ("0.5.22", False), ("0.5.23rc1", False),
                                              (None, False), ("main", False)])
def test_logprob_classes_are_skipped_where_sglang_aborts_them_under_dflash(version, refused):
    """SGLang before 0.5.22 aborts every logprob request under DFLASH-family speculative
    decoding (PR #44627's launch uses DSPARK): there the classes that ask for logprobs are
    skipped with the reason, never sent to fail the launch; other servers keep them."""
    facts = dataclasses.replace(_facts_cache.pr44627(), sglang_version=version)
    assert facts.speculative_algorithm == "DSPARK"
    exp = expand(loader.load(PLANS["dsv4"]), facts)
    asked = [r for s in exp.steps for r in s.requests if dict(r.features).get("return_logprob")]
    reasons = {k.shape_class: k.reason for k in exp.skipped}
    if refused:
        assert not asked
        for cls in ("sampler_x_output_logprobs", "input_logprobs", "eager_batches"):
            assert reasons[cls] == (f"SGLang {version} aborts requests with logprobs under DSPARK "
                                    "speculative decoding (accepted from 0.5.22)")
        assert any(s.shape_class == "sampling_families" for s in exp.steps)
    else:
        assert asked and "input_logprobs" not in reasons


CHAIN_PLAN = """version: 1
name: c
phases:
  - name: p
    shapes:
      - class: w
        kind: chunked
        lengths: [100, chunked_prefill_size + 5, 2 * chunked_prefill_size + 7,
                  chunked_prefill_size + 9, 2 * chunked_prefill_size, 3 * chunked_prefill_size + 1]
        chain: {chain}
"""


def test_a_chained_class_starts_each_prompt_with_the_whole_chunks_sent_before():
    """``chain``: each prompt takes its whole chunks before its last token from the class's one
    token stream, so the radix cache holds the previous prompts' whole chunks for it (out of
    order too); a prompt of one chunk or less, a server without the radix cache or chunked
    prefill, a chunk that is not whole pages, a class with logprobs and ``chain: false`` send
    fresh prompts."""
    facts = _facts_cache.pr44627()
    c = facts.chunked_prefill_size
    exp = expand(loader.loads(CHAIN_PLAN.format(chain="true"), "c.yaml"), facts)
    got = [(r.prefix_key, r.prefix_len) for s in exp.steps for r in s.requests]
    # 2c tokens: one whole chunk before its last token (the match never covers that)
    assert got == [(None, 0), ("w/chain", c), ("w/chain", 2 * c), ("w/chain", c),
                   ("w/chain", c), ("w/chain", 3 * c)]
    hits = {i: h.tokens for (i, _), h in exp.prefix_hits().items()}
    assert hits == {2: c, 3: c, 4: c, 5: 2 * c}
    assert all(h.source == (1 if i < 5 else 2) for (i, _), h in exp.prefix_hits().items())
    notes = [s.note for s in exp.steps]
    assert notes[1] == f"{c + 5} tokens = 2 chunks of <= {c}"
    for i in (2, 3, 4):
        assert notes[i].endswith("the first 1 from the cache (the previous prompts)")
    assert notes[5].endswith("the first 2 from the cache (the previous prompts)")
    plain = CHAIN_PLAN.format(chain="true")
    for other, text in ((dataclasses.replace(facts, disable_radix_cache=True), plain),
                        (dataclasses.replace(facts, chunked_prefill_size=None), plain),
                        (dataclasses.replace(facts, chunked_prefill_size=c + 100), plain),
                        (facts, plain + "        request: {logprob_start_len: 50}\n"),
                        (facts, CHAIN_PLAN.format(chain="false"))):
        fresh = expand(loader.loads(text, "c.yaml"), other)
        assert len(fresh.steps) == (6 if other.chunked_prefill_size else 1)  # sizes need it
        assert all(r.prefix_key is None for s in fresh.steps for r in s.requests)
        assert not fresh.prefix_hits()
    with pytest.raises(PlanError, match=r"phases\[0\]\.shapes\[0\]\.chain"):
        loader.loads(CHAIN_PLAN.format(chain="2"), "c.yaml")
    with pytest.raises(PlanError, match="chain"):
        loader.loads(CHAIN_PLAN.format(chain="true").replace("chunked", "extend"), "c.yaml")


def test_the_tokens_sent_share_what_the_hit_model_says():
    """The transports' tokens against :meth:`Expansion.prefix_hits`: each chained prompt, and
    each prefix-class extend, shares with the earlier prompts exactly the tokens the model
    says the cache holds (to the page), never its last token."""
    from warmup.serve.transport import TokenMaker

    dsv4 = _facts_cache.resolve(("--model-path", "deepseek-ai/DeepSeek-V4.1-Flash",
                                 "--chunked-prefill-size", "4096", "--context-length", "131072",
                                 "--disable-prefill-cuda-graph"))
    for plan, facts in (("dsv4", dsv4), ("default", _facts_cache.small_model()),
                        ("dsv4", _facts_cache.pr44627())):  # 256-token pages, long_context
        exp = expand(loader.load(PLANS[plan]), facts)
        hits, page = exp.prefix_hits(), facts.page_size
        assert hits, plan
        tm = TokenMaker(facts.vocab_size or 32000, seed="t")
        sent: dict[str, list[list[int]]] = {}
        for s in exp.steps:
            ids = [tm.ids(s, pos, r) for pos, r in enumerate(s.requests)]
            for pos, r in enumerate(s.requests):
                if not r.prefix_key:
                    continue
                shared = max((_common(ids[pos], old) for old in sent.get(r.prefix_key, [])),
                             default=0)
                want = hits[(s.index, pos)].tokens if (s.index, pos) in hits else 0
                assert min(shared, r.input_len - 1) // page * page == want, (s.index, s.note)
            for pos, r in enumerate(s.requests):
                if r.prefix_key:
                    sent.setdefault(r.prefix_key, []).append(ids[pos])


def _common(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def test_the_hit_model_follows_sglangs_match():
    """Whole pages of what the earlier prompt holds of the stream (its ``min(prefix_len,
    input_len)``), never the prompt's last token, never past ``logprob_start_len`` with
    logprobs, nothing from a request of the same step or without the radix cache."""
    from warmup.plan.model import Expansion, WarmupRequest, WarmupStep

    facts = _facts_cache.pr44627()
    page = facts.page_size
    assert page > 1

    def req(n, plen, **features):
        return WarmupRequest(input_len=n, max_new_tokens=1, sampling_name="greedy",
                             sampling_params=(), prefix_key="k", prefix_len=plen,
                             features=tuple(features.items()))

    def step(i, *reqs):
        return WarmupStep(index=i, phase="p", shape_class="c", kind="chunked",
                          mode="concurrent" if len(reqs) > 1 else "single", requests=reqs,
                          note="")

    steps = (step(0, req(300, 2000)),                       # holds 300 tokens of the stream
             step(1, req(3000, 2048)),                      # hits 300: one page
             step(2, req(3000, 2048, return_logprob=True, logprob_start_len=600)),
             step(3, req(2048, 2048)),                      # the whole prompt is cached
             step(4, req(9000, 8000), req(9000, 8000)))     # together: no hit on each other
    exp = Expansion(plan="p", steps=steps, skipped=(), flush=False, facts=facts)
    got = {i: (h.tokens, h.source) for (i, _), h in exp.prefix_hits().items()}
    assert got == {1: (page, 0), 2: (600 // page * page, 1), 3: (2047 // page * page, 1),
                   4: (2048, 1)}
    import dataclasses
    off = dataclasses.replace(exp, facts=dataclasses.replace(facts, disable_radix_cache=True))
    assert off.prefix_hits() == {}


def test_a_batch_counts_against_one_forward_in_whole_pages():
    """As SGLang's scheduler charges it: each prompt in whole pages against the chunk; no
    budget, no limit; a page below one token counts as one."""
    assert over_budget([256] * 4, 1024, 64) is None               # 4 x 4 pages: exactly the chunk
    assert over_budget([1] * 17, 4096, 256) == (
        "takes 4352 tokens of the one-forward budget (4096) in whole pages of 256: the "
        "scheduler would split it")
    assert over_budget([3000, 2000], 4096, 1) == (
        "total 5000 tokens is above the one-forward budget (4096)")
    assert over_budget([10**6], None, 256) is None
    assert over_budget([3, 3], 4, 0) is not None and over_budget([1, 1], 2, None) is None
