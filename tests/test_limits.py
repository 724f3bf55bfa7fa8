"""docs/limits.md at its edges: each limit that no other test checks at its edge, at the limit
accepted and one above refused, with the one line that names the file or field and the limit.

Every test is fast and allocates little: a limit whose real value would need a large input
(256 KiB of YAML, 20,000 YAML nodes, a 64 MiB report, 200,000 traffic steps, a 256 MiB
answer) is tested with the module's constant patched small (the code reads it at call time);
the documented value is the constant's, and where the refusal is cheap it is also checked at
the real value.  No test imports SGLang; the shared store is an in-memory stand-in for Redis.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import re
import select
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import pytest
import yaml

from _loopback import LocalServer, responding
from cache_tools import archive
from cache_tools.stores import redis as remote
from cache_tools.errors import ArchiveError, RemoteError
from cache_tools.fingerprint import current as current_fingerprint
from cache_tools.locations import STAGING_PREFIX
from cache_tools.locations import kind as cache_kind
from cache_tools.locations import resolve as cache_resolve
from cache_tools.archive.reader import ArchiveReader, _framing
from cache_tools.archive.reader import Limits as ReaderLimits
from cache_tools.render import push_warnings
from cache_tools.archive.staging import STALE_AFTER_S, clean_stale
from warmup.coverage import request_logs, traffic
from warmup.errors import PlanError, TransportError, WarmupError
from warmup.observe import triton_hooks
from warmup.plan import expr as E
from warmup.plan import loader, model
from warmup.plan.expand import expand
from warmup.plan.facts import ServerFacts
from warmup.plan.model import WarmupRequest, WarmupStep
from warmup.serve import http as whttp
from warmup.serve import report
from warmup.serve.transport import MAX_IN_FLIGHT, HttpTransport
from warmup.sidecar.endpoints import Limits
from warmup.view import documents, html


def _facts(**change: Any) -> ServerFacts:
    """A server with room for anything these plans send: the limits under test are the
    plan's own, not the server's."""
    base = ServerFacts(
        chunked_prefill_size=None, page_size=1, context_length=10**7, max_req_input_len=None,
        max_running_requests=10**6, max_total_tokens=10**9, max_prefill_tokens=None,
        decode_graph=False, decode_graph_max_bs=None, decode_graph_bs=(),
        prefill_graph_backend="disabled", prefill_graph_buckets=(), prefill_graph_context=None,
        enable_mixed_chunk=False, disable_radix_cache=False, disaggregation_mode="null",
        speculative_algorithm=None, tp_size=1, dp_size=1, tokenizer_worker_num=1,
        vocab_size=32000, model_type=None)
    return dataclasses.replace(base, **change)


def _plan(shape: str = "{class: c, kind: extend, lengths: [219]}", *, top: str = "") -> str:
    """A one-class plan; ``top`` adds top-level lines after ``name`` (line 3 on)."""
    return f"version: 1\nname: x\n{top}phases:\n  - name: p\n    shapes:\n      - {shape}\n"


def _plan_error(text: str) -> PlanError:
    with pytest.raises(PlanError) as info:
        loader.loads(text, "x.yaml")
    return info.value


def _expand_error(text: str, facts: ServerFacts | None = None) -> PlanError:
    with pytest.raises(PlanError) as info:
        expand(loader.loads(text, "x.yaml"), facts or _facts())
    return info.value


# --- plans: the file ---------------------------------------------------------------------------
def test_plan_file_bytes(monkeypatch):
    text = _plan()
    size = len(text.encode())
    monkeypatch.setattr(loader, "MAX_FILE_BYTES", size)
    assert loader.loads(text, "x.yaml").name == "x"
    assert _plan_error(text + "#").message == (
        f"x.yaml:1: <top>: file is {size + 1:,} bytes (limit {size:,})")
    monkeypatch.undo()  # the real limit: refused before anything is parsed
    assert _plan_error("#" * (loader.MAX_FILE_BYTES + 1)).message == (
        "x.yaml:1: <top>: file is 262,145 bytes (limit 262,144)")


def _yaml_nodes(text: str) -> int:
    stack, count = [yaml.compose(text, Loader=yaml.SafeLoader)], 0
    while stack:
        node = stack.pop()
        count += 1
        if isinstance(node, yaml.SequenceNode):
            stack.extend(node.value)
        elif isinstance(node, yaml.MappingNode):
            stack.extend(v for kv in node.value for v in kv)
    return count


def test_plan_yaml_nodes(monkeypatch):
    """20,000 real nodes take seconds to compose in pure-Python YAML: the limit is patched to
    the node count of a small plan."""
    assert loader.MAX_NODES == 20_000
    at_limit = _plan("{class: c, kind: extend, lengths: [1, 2, 3]}")
    limit = _yaml_nodes(at_limit)
    monkeypatch.setattr(loader, "MAX_NODES", limit)
    assert loader.loads(at_limit, "x.yaml").shapes[0].name == "c"
    over = _plan("{class: c, kind: extend, lengths: [1, 2, 3, 4]}")
    assert _yaml_nodes(over) == limit + 1
    assert re.fullmatch(rf"x\.yaml:\d+: <top>: more than {limit} YAML nodes",
                        _plan_error(over).message)


def test_plan_nesting():
    """The root mapping is level 1; ``phases: [[...]]`` adds one level per bracket.  At the
    limit the nesting check passes and the plan is refused for what it is (a list where a
    phase belongs); one level deeper the nesting check refuses it."""
    def nested(levels: int) -> str:
        k = levels - 1
        return "version: 1\nname: x\nphases: " + "[" * k + "]" * k + "\n"

    assert _plan_error(nested(loader.MAX_NESTING)).message == (
        "x.yaml:3: phases[0]: expected a mapping, got a list")
    assert _plan_error(nested(loader.MAX_NESTING + 1)).message == (
        "x.yaml:3: <top>: lists and mappings nested more than 24 levels deep")


@pytest.mark.parametrize("field", ["name", "phases[0].name", "phases[0].shapes[0].class"])
def test_plan_names(field):
    ok, long = "n" * 64, "n" * 65
    texts = {"name": lambda n: _plan().replace("name: x", f"name: {n}"),
             "phases[0].name": lambda n: _plan().replace("name: p", f"name: {n}"),
             "phases[0].shapes[0].class": lambda n: _plan(
                 f"{{class: {n}, kind: extend, lengths: [219]}}")}
    loader.loads(texts[field](ok), "x.yaml")
    err = _plan_error(texts[field](long))
    assert re.fullmatch(rf"x\.yaml:\d: {re.escape(field)}: '{long}' is not a name", err.message)
    assert err.hint.endswith("(start with a letter, <= 64)")


def test_plan_let_names():
    ok, long = "L" * 64, "L" * 65
    assert loader.loads(_plan(top=f"let: {{{ok}: 1}}\n"), "x.yaml").let[0][0] == ok
    err = _plan_error(_plan(top=f"let: {{{long}: 1}}\n"))
    assert err.message == f"x.yaml:3: let.{long}: '{long}' is not a name"
    assert err.hint == "letters, digits and _, starting with a letter"


def test_a_name_ending_in_a_newline_is_not_a_name():
    # `$` alone also matches before a final "\n": names are matched whole
    err = _plan_error(_plan().replace("name: x", 'name: "abc\\n"'))
    assert err.message == "x.yaml:2: name: 'abc\\n' is not a name"
    err = _plan_error(_plan(top='let: {"L\\n": 1}\n'))
    assert err.message.endswith("is not a name")
    from warmup.plan import shipped

    with pytest.raises(PlanError):
        shipped.resolve("default\n")


def test_a_plan_file_is_read_only_to_its_limit(tmp_path, monkeypatch):
    """A plan file above the limit is refused from its size, unread, and the line says the
    size; a FIFO or a device is read to one byte past it (tests/cache_tools/test_inputfile.py)."""
    p = tmp_path / "big.yaml"
    p.write_bytes(b"#" * (loader.MAX_FILE_BYTES * 4))
    opened: list[int] = []
    real_fdopen = os.fdopen
    monkeypatch.setattr(os, "fdopen", lambda fd, *a, **k: opened.append(fd) or real_fdopen(fd, *a, **k))
    with pytest.raises(PlanError) as err:
        loader.load(p)
    assert opened == []
    assert err.value.message == f"{p}:1: <top>: file is 1,048,576 bytes (limit 262,144)"


# --- plans: expressions ------------------------------------------------------------------------
def test_expression_length():
    at_limit = "max(" + ",".join(["1"] * 126) + ")"
    assert len(at_limit) == E.MAX_LENGTH == 256
    plan = loader.loads(_plan(f"{{class: c, kind: extend, lengths: ['{at_limit}']}}"), "x.yaml")
    assert expand(plan, _facts()).num_requests == 1
    over = at_limit + " "
    err = _plan_error(_plan(f"{{class: c, kind: extend, lengths: ['{over}']}}"))
    assert err.message == (f"x.yaml:6: phases[0].shapes[0].lengths[0]: `{over[:57]}...`: "
                           "expression is 257 characters long (limit 256)")


def test_expression_depth():
    """``Expression > UnaryOp > ... > Constant``: n unary minuses reach level n + 1."""
    assert E.parse("-" * (E.MAX_DEPTH - 1) + "1", set()).evaluate({}) == -1
    err = _plan_error(_plan(top=f"let: {{D: '{'-' * E.MAX_DEPTH}1'}}\n"))
    assert err.message == ("x.yaml:3: let.D: `----------------1`: expression is nested more "
                           "than 16 levels deep")


def test_expression_power():
    plan = loader.loads(_plan(top="let: {P: '1 ** 64'}\n"), "x.yaml")
    assert expand(plan, _facts()).num_requests == 1
    assert _expand_error(_plan(top="let: {P: '1 ** 65'}\n")).message == (
        "x.yaml:3: let.P: exponent 65 is above 64")


@pytest.mark.parametrize("sign", ["", "-"])
def test_expression_magnitude(sign):
    assert E.MAX_MAGNITUDE == 2**40
    plan = loader.loads(_plan(top=f"let: {{M: '{sign}(2 ** 40)'}}\n"), "x.yaml")
    assert expand(plan, _facts()).num_requests == 1
    over = "2 ** 40 + 1" if not sign else "-(2 ** 40) - 1"
    assert _expand_error(_plan(top=f"let: {{M: '{over}'}}\n")).message == (
        f"x.yaml:3: let.M: value {sign}1099511627777 is beyond ±2^40")


@pytest.mark.parametrize("shape, top, line, path, shown", [
    ("{class: c, kind: extend, lengths: [%s]}", "", 6, "phases[0].shapes[0].lengths[0]", "`%s`: integer %s"),
    ("{class: c, kind: extend, lengths: ['1 + %s']}", "", 6, "phases[0].shapes[0].lengths[0]",
     "`1 + %s`: integer %s"),
    ("{class: c, kind: extend, lengths: [M]}", "let: {M: '%s'}\n", 3, "let.M", "`%s`: integer %s"),
    ("{class: c, kind: extend, lengths: [1]}", "defaults: {max_new_tokens: %s}\n", 3,
     "defaults.max_new_tokens", "value %s%.0s"),
])
def test_an_integer_literal_past_the_magnitude_is_refused_at_load(shape, top, line, path, shown):
    """Issue "hostile input round three" item 10: a literal beyond ±2^40 (a 29-digit number
    passed `plan check`) is refused when the plan loads, not only skipped at expansion."""
    at, over = 2 ** 40, 2 ** 40 + 1
    fill = (lambda n: shape % n if "%" in shape else shape), (lambda n: top % n if top else "")
    assert loader.loads(_plan(fill[0](at), top=fill[1](at)), "x.yaml").name == "x"
    message = _plan_error(_plan(fill[0](over), top=fill[1](over))).message
    assert message == f"x.yaml:{line}: {path}: " + (shown % (over, over)) + " is beyond ±2^40"
    if "'" not in shape + top:  # a YAML integer past what int() converts: no traceback
        huge = "9" * 5000
        assert _plan_error(_plan(fill[0](huge), top=fill[1](huge))).message.endswith(
            "an integer of 5,000 digits is beyond ±2^40")


def test_sampling_variant_values():
    top = "sampling_variants:\n  v: {temperature: %s}\n"
    assert loader.loads(_plan(top=top % "1099511627776"), "x.yaml").sampling_variants["v"] == \
        {"temperature": 2 ** 40}
    for value, shown in (("1099511627777", "1099511627777"), (".nan", "nan"), ("-.inf", "-inf")):
        assert _plan_error(_plan(top=top % value)).message == (
            f"x.yaml:4: sampling_variants.v.temperature: expected a number from 0 to 2^40, got "
            f"{shown}")


def test_expression_list_items():
    """A list fact (``decode_graph_bs``) is checked where an expression reads it."""
    text = _plan(top="let: {M: 'max(decode_graph_bs)'}\n")
    facts = _facts(decode_graph_bs=tuple(range(1, E.MAX_LIST + 1)))
    assert expand(loader.loads(text, "x.yaml"), facts).num_requests == 1
    facts = _facts(decode_graph_bs=tuple(range(1, E.MAX_LIST + 2)))
    assert _expand_error(text, facts).message == (
        "x.yaml:3: let.M: a list of 1025 items is above the limit of 1024")


# --- plans: expansion --------------------------------------------------------------------------
def test_default_request_limit():
    """Counted before building: a class that would pass the limit is skipped (the default,
    ``limits.over_limit: skip``) or fails the plan (``fail``)."""
    decode = "{{class: d, kind: decode, batch_sizes: [{}]}}"
    at_limit = expand(loader.loads(_plan(decode.format(model.DEFAULT_MAX_REQUESTS)), "x.yaml"),
                      _facts())
    assert at_limit.num_requests == 5000 and at_limit.skipped == ()
    over = expand(loader.loads(_plan(decode.format(5001)), "x.yaml"), _facts())
    assert over.steps == () and [(s.shape_class, s.reason) for s in over.skipped] == [
        ("d", ("expansion limit: 5001 more request(s) would bring the plan to 5001, above the "
               "limit of 5000"))]
    err = _expand_error(_plan(decode.format(5001), top="limits: {over_limit: fail}\n"))
    assert err.message == ("x.yaml:7: phases[0].shapes[0]: class d: expansion limit: 5001 more "
                           "request(s) would bring the plan to 5001, above the limit of 5000")


def test_request_limit_ceiling():
    at = loader.loads(_plan(top=f"limits: {{max_requests: {model.MAX_REQUESTS_CEILING}}}\n"),
                      "x.yaml")
    assert at.max_requests == 50_000
    assert _plan_error(_plan(top="limits: {max_requests: 50001}\n")).message == (
        "x.yaml:3: limits.max_requests: 50001 is above the ceiling of 50000")


def test_size_range_values():
    """``{from, to}`` holds at most ``limits.max_requests`` values (checked before the list is
    made); the class of 10 values is then skipped by the request count, not refused."""
    def text(to: int) -> str:
        return _plan(f"{{class: d, kind: decode, batch_sizes: {{from: 1, to: {to}}}}}",
                     top="limits: {max_requests: 10}\n")

    ok = expand(loader.loads(text(10), "x.yaml"), _facts())
    assert ok.skipped[0].reason.startswith("expansion limit: ")
    assert _expand_error(text(11)).message == (
        "x.yaml:7: phases[0].shapes[0].batch_sizes.to: range 1..11 has more than 10 values")


def test_parallel_samples_in_a_plan():
    text = "{{class: c, kind: extend, lengths: [219], request: {{n: {}}}}}"
    ok = expand(loader.loads(_plan(text.format(model.MAX_PARALLEL_SAMPLES)), "x.yaml"), _facts())
    assert dict(ok.steps[0].requests[0].features)["n"] == 64
    over = expand(loader.loads(_plan(text.format(65)), "x.yaml"), _facts())
    assert [(s.shape_class, s.reason) for s in over.skipped] == [
        ("c", "n = 65 parallel samples: expected 1..64")]


@pytest.mark.parametrize("key", ["top_logprobs_num", "token_ids_logprob", "stop_token_ids"])
@pytest.mark.parametrize("vocab, limit", [(32000, 1024), (500, 500)])
def test_feature_ids_in_a_plan(key, vocab, limit):
    """At most MAX_FEATURE_IDS, and never more than the vocabulary."""
    text = "{{class: c, kind: extend, lengths: [219], request: {{{}: {}}}}}"
    ok = expand(loader.loads(_plan(text.format(key, limit)), "x.yaml"), _facts(vocab_size=vocab))
    assert dict(ok.steps[0].requests[0].features)[key] == limit
    over = expand(loader.loads(_plan(text.format(key, limit + 1)), "x.yaml"),
                  _facts(vocab_size=vocab))
    assert [s.reason for s in over.skipped] == [f"{key} = {limit + 1} is above {limit}"]


# --- traffic files and request logs ------------------------------------------------------------
def _traffic(tmp_path: Path, *lines: str) -> Path:
    p = tmp_path / "t.jsonl"
    p.write_text("".join(line + "\n" for line in lines))
    return p


def _traffic_error(p: Path) -> str:
    with pytest.raises(WarmupError) as err:
        traffic.load(p)
    return err.value.message


def test_traffic_file_bytes(tmp_path, monkeypatch):
    p = _traffic(tmp_path, '{"prompts": [4]}')
    size = p.stat().st_size
    monkeypatch.setattr(traffic, "MAX_FILE_BYTES", size)
    assert len(traffic.load(p)) == 1
    monkeypatch.setattr(traffic, "MAX_FILE_BYTES", size - 1)
    assert _traffic_error(p) == f"{p}: traffic file is {size} bytes (limit {size - 1:,})"


def test_request_log_bytes(tmp_path, monkeypatch):
    p = tmp_path / "log.jsonl"
    p.write_text('{"prompt": "hello world"}\n')
    size = p.stat().st_size
    monkeypatch.setattr(traffic, "MAX_FILE_BYTES", size)
    assert request_logs.convert("openai", p).requests == 1
    monkeypatch.setattr(traffic, "MAX_FILE_BYTES", size - 1)
    with pytest.raises(WarmupError) as err:
        request_logs.convert("openai", p)
    assert err.value.message == f"{p}: request log is {size} bytes (limit {size - 1:,})"


def test_traffic_prompt_tokens(tmp_path):
    (step,) = traffic.load(_traffic(tmp_path, '{"prompts": [10000000]}'))
    assert step.prompts == (traffic.MAX_PROMPT_TOKENS,)
    p = _traffic(tmp_path, '{"prompts": [10000001]}')
    assert _traffic_error(p) == (f"{p}:1: prompts: at most 4,096 prompts of at most "
                                 "10,000,000 tokens each")


def test_traffic_prompts_per_step(tmp_path):
    def burst(n: int) -> str:
        return json.dumps({"kind": "burst", "prompts": [8] * n})

    (step,) = traffic.load(_traffic(tmp_path, burst(traffic.MAX_PROMPTS)))
    assert len(step.prompts) == 4096
    p = _traffic(tmp_path, burst(4097))
    assert _traffic_error(p) == (f"{p}:1: prompts: at most 4,096 prompts of at most "
                                 "10,000,000 tokens each")


def test_traffic_new_tokens(tmp_path):
    """The one refusal here that names its field but not the limit (see docs/limits.md)."""
    (step,) = traffic.load(_traffic(tmp_path, '{"prompts": [4], "max_new_tokens": 1000000}'))
    assert step.max_new_tokens == traffic.MAX_NEW_TOKENS
    p = _traffic(tmp_path, '{"prompts": [4], "max_new_tokens": 1000001}')
    assert _traffic_error(p) == f"{p}:1: max_new_tokens: expected an integer from 1 to 1,000,000"


def test_traffic_steps(tmp_path, monkeypatch):
    """Steps are counted, not lines: blank and comment lines are free."""
    assert traffic.MAX_STEPS == 200_000
    monkeypatch.setattr(traffic, "MAX_STEPS", 3)
    step = '{"prompts": [4]}'
    assert len(traffic.load(_traffic(tmp_path, "# sample", step, "", step, step))) == 3
    p = _traffic(tmp_path, "# sample", step, "", step, step, step)
    assert _traffic_error(p) == f"{p}:6: more than 3 steps"


def test_traffic_label(tmp_path):
    (step,) = traffic.load(_traffic(tmp_path, json.dumps({"prompts": [4], "label": "l" * 200})))
    assert len(step.label) == 200
    p = _traffic(tmp_path, json.dumps({"prompts": [4], "label": "l" * 201}))
    assert _traffic_error(p) == f"{p}:1: label: expected printable text of at most 200 characters"


@pytest.mark.parametrize("key, limit", [("n", 64), ("top_logprobs_num", 1024),
                                        ("token_ids_logprob", 1024), ("stop_token_ids", 1024)])
def test_traffic_features(tmp_path, key, limit):
    (step,) = traffic.load(_traffic(tmp_path, json.dumps({"prompts": [4],
                                                          "features": {key: limit}})))
    assert step.features == {key: limit}
    p = _traffic(tmp_path, json.dumps({"prompts": [4], "features": {key: limit + 1}}))
    low = 1 if key == "n" else 0
    assert _traffic_error(p) == (f"{p}:1: features: {key}: expected an integer from {low} to "
                                 f"{limit:,}")


def test_openai_log_prompt_bounds(tmp_path):
    """A request past MAX_PROMPT_TOKENS or MAX_PROMPTS is left out and counted, not an error."""
    p = tmp_path / "log.jsonl"
    p.write_text("\n".join(json.dumps(d) for d in [
        {"prompt": "x", "prompt_tokens": 10_000_000},
        {"prompt": "x", "prompt_tokens": 10_000_001},
        {"prompt": ["ab"] * 4096},
        {"prompt": ["ab"] * 4097},
    ]) + "\n")
    conv = request_logs.convert("openai", p)
    assert [s.prompts for s in conv.steps] == [(10_000_000,), (1,) * 4096]
    assert conv.skipped == {"above 4,096 prompts or 10,000,000 tokens per prompt": 2}


def test_sglang_log_token_bounds(tmp_path):
    def line(rid: str, prompt: int, completion: int) -> str:
        return json.dumps({"timestamp": "2025-01-01T00:00:00", "event": "request.finished",
                           "rid": rid, "obj": {}, "out": {"meta_info": {
                               "prompt_tokens": prompt, "completion_tokens": completion,
                               "finish_reason": {"type": "length"},
                               "request_received_ts": 1000.0 + len(rid)}}})

    p = tmp_path / "sglang.log"
    p.write_text("\n".join([line("a", 10_000_000, 1_000_000), line("bb", 10_000_001, 1),
                            line("ccc", 1, 1_000_001)]) + "\n")
    conv = request_logs.convert("sglang-log", p)
    assert [(s.prompts, s.max_new_tokens) for s in conv.steps] == [((10_000_000,), 1_000_000)]
    assert conv.skipped == {"above 10,000,000 prompt or 1,000,000 completion tokens": 2}


def test_converted_bursts_and_steps_stay_what_a_traffic_file_holds(tmp_path, monkeypatch):
    """traffic convert never writes what traffic files refuse: a burst of concurrent requests
    is cut at MAX_PROMPTS prompts, and steps past MAX_STEPS are left out and counted."""
    def line(i: int) -> str:
        return json.dumps({"event": "request.finished", "rid": str(i), "out": {"meta_info": {
            "prompt_tokens": 10, "completion_tokens": 2, "request_received_ts": 100.0}}})

    p = tmp_path / "sglang.log"
    p.write_text("\n".join(line(i) for i in range(traffic.MAX_PROMPTS + 1)) + "\n")
    conv = request_logs.convert("sglang-log", p)
    assert [len(s.prompts) for s in conv.steps] == [traffic.MAX_PROMPTS, 1]
    traffic.load(_traffic(tmp_path, *traffic.dump(conv.steps).splitlines()))
    monkeypatch.setattr(request_logs, "MAX_STEPS", 2)
    p.write_text("\n".join(json.dumps({"prompt": "abc"}) for _ in range(3)) + "\n")
    conv = request_logs.convert("openai", p)
    assert (len(conv.steps), conv.requests) == (2, 2)
    assert conv.skipped == {"past the 2 steps a traffic file holds": 1}


def test_sglang_text_log_sampling_params_length(tmp_path):
    """``sampling_params={...}`` of a text log line is parsed only up to 16,384 characters."""
    def line(size: int) -> str:
        head = "{'temperature': 0.5, 'pad': '"
        sp = head + "x" * (size - len(head) - 2) + "'}"
        assert len(sp) == size
        return (f"[2025-01-01 00:00:00] Finish: obj=GenerateReqInput(rid='r', sampling_params="
                f"{sp}), out={{'meta_info': {{'prompt_tokens': 5, 'completion_tokens': 3, "
                "'finish_reason': {'type': 'length'}}}")

    p = tmp_path / "sglang.log"
    p.write_text(line(16384) + "\n")
    assert request_logs.convert("sglang-log", p).steps[0].sampling == {"temperature": 0.5}
    p.write_text(line(16385) + "\n")
    assert request_logs.convert("sglang-log", p).steps[0].sampling == {}


def test_synth_min_prompt():
    """``traffic synth --max-prompt`` is at least MIN_SYNTH_PROMPT (room for a system prompt
    or an agent context plus a turn)."""
    assert len(traffic.synth("chat", steps=2, max_prompt=traffic.MIN_SYNTH_PROMPT)) == 2
    with pytest.raises(WarmupError) as err:
        traffic.synth("chat", steps=2, max_prompt=1599)
    assert err.value.message == "max_prompt 1599 is below 1600 tokens"


def test_synth_steps():
    assert len(traffic.synth("chat", steps=1)) == 1
    for steps in (0, traffic.MAX_STEPS + 1):  # more than load() would read back
        with pytest.raises(WarmupError) as err:
            traffic.synth("chat", steps=steps)
        assert err.value.message == f"steps {steps:,} is not from 1 to {traffic.MAX_STEPS:,}"


# --- saved reports -----------------------------------------------------------------------------
def test_saved_report_bytes(tmp_path, monkeypatch):
    p = tmp_path / "report.json"
    p.write_text(json.dumps({"format": report.FORMAT, "version": report.VERSION, "plan": "x",
                             "classes": []}))
    size = p.stat().st_size
    monkeypatch.setattr(documents, "MAX_BYTES", size)
    assert documents.load(p).kind == documents.RUN
    monkeypatch.setattr(documents, "MAX_BYTES", size - 1)
    with pytest.raises(WarmupError) as err:
        documents.load(p)
    assert err.value.message == f"{p}: file is {size:,} bytes (limit {size - 1:,})"
    monkeypatch.undo()  # the real limit, with a sparse file: one byte more is refused unparsed
    big = tmp_path / "big.json"
    with open(big, "wb") as fh:
        fh.truncate(documents.MAX_BYTES + 1)
    with pytest.raises(WarmupError) as err:
        documents.load(big)
    assert err.value.message == f"{big}: file is 67,108,865 bytes (limit 67,108,864)"


def test_html_chart_rows():
    """Not a refusal: rows past MAX_ROWS are not drawn, and a line says how many."""
    rows = [(f"r{i}", [1.0]) for i in range(html.MAX_ROWS)]
    assert "not drawn" not in html.bars(rows, [("s", "#000")])
    drawn = html.bars(rows + [("last", [1.0])], [("s", "#000")])
    assert '<p class="note">1 more rows not drawn</p>' in drawn and ">last<" not in drawn


# --- compile events (bounded memory, never a refusal) ------------------------------------------
def test_compile_log_line_and_kernel_module_bytes(tmp_path, monkeypatch):
    """A compile-log line at its limit is read, one byte longer is skipped with its warning;
    a kernel module at its limit is checked, one byte larger is not read."""
    from cache_tools import compile_log
    from cache_tools.replay import kernels

    assert compile_log.MAX_LINE_BYTES == 4 * 1024 * 1024
    assert kernels.MAX_MODULE_BYTES == 4 * 1024 * 1024
    monkeypatch.setattr(compile_log, "MAX_LINE_BYTES", 100)
    empty = len(json.dumps({"event": "gc", "pad": ""}))
    at = json.dumps({"event": "gc", "pad": "x" * (100 - empty)})
    above = json.dumps({"event": "gc", "pad": "x" * (101 - empty)})
    assert (len(at), len(above)) == (100, 101)
    path = tmp_path / "compiles-1.jsonl"
    path.write_text(at + "\n" + above + "\n")
    warnings: list[str] = []
    assert len(compile_log.read([path], warnings=warnings)) == 1
    assert warnings == [f"{path}:2: longer than 100 bytes, skipped"]

    monkeypatch.setattr(kernels, "MAX_MODULE_BYTES", 100)
    (tmp_path / "limit_at.py").write_text("#" * 100)
    (tmp_path / "limit_above.py").write_text("#" * 101)
    assert kernels.read_module(tmp_path / "limit_at.py") == "#" * 100
    with pytest.raises(kernels.Unresolved, match=r"limit_above.py is 101 bytes, more than a "
                                                 r"kernel module \(100\)"):
        kernels.read_module(tmp_path / "limit_above.py")


def test_pending_jit_records_and_load_starts():
    """The oldest pending record / load start is dropped past its bound."""
    class Phase:
        phase = "warmup"

    class Inst:
        def phase(self) -> Phase:
            return Phase()

        def count(self, *args: Any) -> None:
            pass

        def measure(self, record: Any) -> None:  # a kernel load's metric: none here
            pass

    hooks = triton_hooks.TritonHooks(Inst())
    sigs = [object() for _ in range(triton_hooks._MAX_PENDING + 1)]
    for s in sigs[:-1]:
        hooks.put_pending({"signature_obj": s})
    assert len(hooks._pending) == 256 and id(sigs[0]) in hooks._pending
    hooks.put_pending({"signature_obj": sigs[-1]})
    assert len(hooks._pending) == 256 and id(sigs[0]) not in hooks._pending
    for i in range(triton_hooks._MAX_LOAD_STARTS):
        hooks.on_load_start("k", str(i))
    assert len(hooks._load_starts) == 1024
    hooks.on_load_start("k", "last")
    assert len(hooks._load_starts) == 1024
    assert (threading.get_ident(), "0") not in hooks._load_starts


# --- the warm-up transport ---------------------------------------------------------------------
@pytest.fixture
def local_server():
    """``local_server(respond)``: a loopback server answering with ``respond(handler)``."""
    started: list[LocalServer] = []

    def start(respond) -> LocalServer:
        started.append(responding(respond))
        return started[-1]

    yield start
    for s in started:
        s.close()


def _send(h: BaseHTTPRequestHandler, status: int, body: bytes, *, sized: bool = True) -> None:
    """An HTTP/1.0 answer: with a Content-Length, or ``sized=False`` ending at the close."""
    h.send_response(status)
    h.send_header("Content-Type", "application/json")
    if not sized:
        h.send_header("Connection", "close")
    else:
        h.send_header("Content-Length", str(len(body)))
    h.end_headers()
    h.wfile.write(body)


def _step(n: int) -> WarmupStep:
    reqs = tuple(WarmupRequest(input_len=8, max_new_tokens=1, sampling_name="t",
                               sampling_params=()) for _ in range(n))
    return WarmupStep(index=0, phase="p", shape_class="c", kind="extend", mode="concurrent",
                      requests=reqs)


def test_in_flight(local_server):
    """Not a refusal: a wider step is sent in waves.  The server holds every request until
    ``limit`` are in flight together, so a step of ``limit`` has all of them in flight at once
    and a step of ``limit + 1`` never more than ``limit``."""
    assert HttpTransport("http://127.0.0.1:1").max_in_flight == MAX_IN_FLIGHT == 1024
    limit = 4
    state = {"in": 0, "max": 0, "arrived": 0}
    cond = threading.Condition()

    def respond(h: BaseHTTPRequestHandler) -> None:
        with cond:
            state["in"] += 1
            state["arrived"] += 1
            state["max"] = max(state["max"], state["in"])
            cond.notify_all()
            cond.wait_for(lambda: state["arrived"] >= limit, 10.0)
            state["in"] -= 1
        _send(h, 200, json.dumps({"meta_info": {"completion_tokens": 1}}).encode())

    srv = local_server(respond)
    t = HttpTransport(srv.url, vocab_size=32000, timeout_s=30, max_in_flight=limit)
    for n in (limit, limit + 1):
        state.update({"in": 0, "max": 0, "arrived": 0})
        assert len(asyncio.run(t.send(_step(n)))) == n
        assert state["max"] == limit


@pytest.mark.parametrize("status, sized", [(200, True), (200, False), (500, True)])
def test_http_response_bytes(local_server, monkeypatch, status, sized):
    """An answer of more than MAX_RESPONSE_BYTES is refused, whether its length is declared
    or not and whatever its status; a health probe only reads up to the limit."""
    monkeypatch.setattr(whttp, "MAX_RESPONSE_BYTES", 1024)

    def respond(h: BaseHTTPRequestHandler) -> None:
        n = int(h.path.rsplit("=", 1)[1])
        _send(h, status, b"x" * n, sized=sized)

    client = whttp.HttpClient(local_server(respond).url, retries=0)
    assert client.request("GET", "/body?n=1024") == (status, b"x" * 1024)
    with pytest.raises(TransportError) as err:
        client.request("GET", "/body?n=1025")
    assert err.value.message == "GET /body?n=1025 answered more than 1,024 bytes"
    assert client.probe("/body?n=5000", 5.0).status == status


def test_http_generate_response_bytes(local_server, monkeypatch):
    monkeypatch.setattr(whttp, "MAX_RESPONSE_BYTES", 1024)
    size = {"n": 1024}

    doc = json.dumps({"meta_info": {}, "pad": ""}).encode()

    def respond(h: BaseHTTPRequestHandler) -> None:
        _send(h, 200, doc.replace(b'""', b'"' + b"x" * (size["n"] - len(doc)) + b'"'))

    client = whttp.HttpClient(local_server(respond).url)
    assert len(client.generate({"input_ids": [1]})[0]["pad"]) == 1024 - len(doc)
    size["n"] = 1025
    with pytest.raises(TransportError) as err:
        client.generate({"input_ids": [1]})
    assert err.value.message == "POST /generate answered more than 1,024 bytes"


def test_http_stream_line_bytes(local_server, monkeypatch):
    """A line of a streamed answer is at most MAX_STREAM_LINE_BYTES, its newline included; an
    HTTP error of a stream is read within MAX_RESPONSE_BYTES."""
    monkeypatch.setattr(whttp, "MAX_STREAM_LINE_BYTES", 1024)
    monkeypatch.setattr(whttp, "MAX_RESPONSE_BYTES", 1024)
    size = {"n": 1024, "status": 200}

    def respond(h: BaseHTTPRequestHandler) -> None:
        if size["status"] != 200:
            _send(h, size["status"], b"e" * 1025)
            return
        head = b'data: {"meta_info": {"completion_tokens": 1}, "pad": "'
        line = head + b"x" * (size["n"] - len(head) - 3) + b'"}\n'
        assert len(line) == size["n"]
        _send(h, 200, line + b"\ndata: [DONE]\n", sized=False)

    client = whttp.HttpClient(local_server(respond).url)
    chunks: list[dict] = []
    last = client.stream({"input_ids": [1], "stream": True}, chunks.append)
    assert last["meta_info"] == {"completion_tokens": 1} and len(chunks) == 1
    size["n"] = 1025
    with pytest.raises(TransportError) as err:
        client.stream({"input_ids": [1], "stream": True}, chunks.append)
    assert err.value.message == "POST /generate (stream) answered a line longer than 1,024 bytes"
    size["status"] = 500
    with pytest.raises(TransportError) as err:
        client.stream({"input_ids": [1], "stream": True}, chunks.append)
    assert err.value.message == "POST /generate answered more than 1,024 bytes"


# --- the sidecar's HTTP server -----------------------------------------------------------------
def _exchange(port: int, data: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(data)
        out = b""
        while chunk := s.recv(65536):
            out += chunk
        return out


def test_sidecar_request_line(endpoint_server):
    """The request line with its CR is at most ``max_request_line`` bytes."""
    port = endpoint_server().server_address[1]
    limit = Limits().max_request_line
    assert limit == 4096

    def line(size: int) -> bytes:
        text = b"GET /" + b"a" * (size - len(b"GET / HTTP/1.1\r")) + b" HTTP/1.1\r"
        assert len(text) == size
        return text + b"\nHost: x\r\n\r\n"

    assert _exchange(port, line(limit)).startswith(b"HTTP/1.1 200 OK\r\n")
    answer = _exchange(port, line(limit + 1))
    assert answer.startswith(b"HTTP/1.1 400 Bad Request\r\n")
    assert answer.endswith(b'{\n "error": "request line too long"\n}\n')


def test_sidecar_head_bytes(endpoint_server):
    """The request line and headers with the blank line that ends them: ``max_head_bytes``."""
    port = endpoint_server().server_address[1]
    limit = Limits().max_head_bytes
    assert limit == 8192

    def head(size: int) -> bytes:
        start, end = b"GET /ready HTTP/1.1\r\nX-Pad: ", b"\r\n\r\n"
        data = start + b"p" * (size - len(start) - len(end)) + end
        assert len(data) == size
        return data

    assert _exchange(port, head(limit)).startswith(b"HTTP/1.1 200 OK\r\n")
    answer = _exchange(port, head(limit + 1))
    assert answer.startswith(b"HTTP/1.1 431 Request Header Fields Too Large\r\n")
    assert answer.endswith(b'{\n "error": "request headers too large"\n}\n')


def test_sidecar_connections(endpoint_server):
    """``max_connections`` open at once are all kept; one more drops the oldest still sending
    its request, and only it (connections are accepted in order, whatever the timing)."""
    assert Limits().max_connections == 512
    limit = 8
    port = endpoint_server(max_connections=limit, head_timeout_s=30.0).server_address[1]
    conns = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(limit + 1)]
    try:
        assert select.select(conns[:1], [], [], 5.0)[0] == conns[:1]
        assert conns[0].recv(1) == b""  # closed by the server
        assert select.select(conns[1:], [], [], 0.2)[0] == []  # the other 8: open, no answer
        conns[1].sendall(b"GET /live HTTP/1.1\r\nHost: x\r\n\r\n")
        assert conns[1].recv(65536).startswith(b"HTTP/1.1 200 OK\r\n")
    finally:
        for s in conns:
            s.close()


# --- the Redis shared store (an in-memory stand-in: STRLEN and SCARD are what is bounded) -----
class _FakeRedis:
    """The few commands the shared store uses, on dicts; ``sizes`` / ``cards`` override what
    STRLEN / SCARD report (a size Redis would report without holding the bytes here)."""

    def __init__(self) -> None:
        self.strings: dict[str, bytes] = {}
        self.sets: dict[str, set[str]] = {}
        self.sizes: dict[str, int] = {}
        self.cards: dict[str, int] = {}

    def strlen(self, key: str) -> int:
        return self.sizes.get(key, len(self.strings.get(key, b"")))

    def get(self, key: str) -> bytes | None:
        return self.strings.get(key)

    def mget(self, keys: list[str]) -> list[bytes | None]:
        return [self.strings.get(k) for k in keys]

    def set(self, key: str, value: bytes | str, nx: bool = False) -> bool | None:
        if nx and key in self.strings:
            return None
        self.strings[key] = value.encode() if isinstance(value, str) else value
        return True

    def sadd(self, key: str, member: str) -> int:
        self.sets.setdefault(key, set()).add(member)
        return 1

    def scard(self, key: str) -> int:
        return self.cards.get(key, len(self.sets.get(key, ())))

    def smembers(self, key: str) -> set[bytes]:
        return {m.encode() for m in self.sets.get(key, ())}

    def pipeline(self, transaction: bool = False) -> _FakeRedis._Pipe:
        return _FakeRedis._Pipe(self)

    class _Pipe:
        def __init__(self, r: _FakeRedis) -> None:
            self.r, self.keys = r, []

        def strlen(self, key: str) -> None:
            self.keys.append(key)

        def execute(self, raise_on_error: bool = True) -> list[int]:
            return [self.r.strlen(k) for k in self.keys]


@pytest.fixture
def store(tmp_path):
    """A fake store holding one pushed TileLang entry ``k`` (a directory of one file)."""
    src = tmp_path / "src"
    (src / "tilelang" / "k").mkdir(parents=True)
    (src / "tilelang" / "k" / "k.so").write_bytes(b"kernel")
    r, fp = _FakeRedis(), current_fingerprint(probe_gpu=False)
    locs = cache_resolve([cache_kind("tilelang")], root=src)
    return r, fp, f"ns:{fp.hash}", locs


def test_store_push_entry_bytes(store):
    """Push: an entry larger than ``max_entry_bytes`` (default MAX_ENTRY_BYTES) is not pushed
    and is named in a warning."""
    r, fp, _, locs = store
    assert remote.MAX_ENTRY_BYTES == 256 << 20
    size = 6  # the entry's bytes on disk (k.so)
    over = remote.push("redis://fake", locs, namespace="ns", fingerprint=fp, client=r,
                       max_entry_bytes=size - 1)
    assert (over.pushed, over.too_large) == (0, ("tilelang:k",))
    assert push_warnings(over) == [("warning: tilelang:k: larger than the per-entry limit; "
                                    "not pushed")]
    at = remote.push("redis://fake", locs, namespace="ns", fingerprint=fp, client=r,
                     max_entry_bytes=size)
    assert (at.pushed, at.too_large) == (1, ())


def test_store_pull_blob_bytes(store, tmp_path):
    """Pull: a blob is refused from its STRLEN before GET when above MAX_ENTRY_BYTES plus the
    tar framing of its files (2,048 bytes per file, plus 8 x 2,048)."""
    r, fp, _, locs = store
    remote.push("redis://fake", locs, namespace="ns", fingerprint=fp, client=r)
    (blob,) = [k for k in r.strings if ":blob:" in k]
    limit = remote.MAX_ENTRY_BYTES + 2048 * (1 + 8)
    r.sizes[blob] = limit + 1
    plan = remote.plan_pull("redis://fake", dest=tmp_path / "d1", namespace="ns", local=fp,
                            client=r)
    with pytest.raises(RemoteError) as err:
        plan.execute()
    assert err.value.message == f"{blob}: {limit + 1} bytes exceeds the limit of {limit} bytes"
    r.sizes[blob] = limit
    plan = remote.plan_pull("redis://fake", dest=tmp_path / "d2", namespace="ns", local=fp,
                            client=r)
    assert [o.status for o in plan.execute().outcomes] == ["added"]
    assert (tmp_path / "d2" / "tilelang" / "k" / "k.so").read_bytes() == b"kernel"


def test_store_meta_bytes(store, tmp_path):
    """The fingerprint record: at most MAX_META_BYTES (padded here with JSON whitespace)."""
    r, fp, prefix, locs = store
    remote.push("redis://fake", locs, namespace="ns", fingerprint=fp, client=r)
    meta = f"{prefix}:meta"
    r.strings[meta] = r.strings[meta].ljust(remote.MAX_META_BYTES)
    assert remote.plan_pull("redis://fake", dest=tmp_path / "d", namespace="ns", local=fp,
                            client=r).fingerprint == fp
    r.strings[meta] += b" "
    with pytest.raises(RemoteError) as err:
        remote.plan_pull("redis://fake", dest=tmp_path / "d", namespace="ns", local=fp, client=r)
    assert err.value.message == f"{meta}: 1048577 bytes exceeds the limit of 1048576 bytes"


def test_store_record_bytes(store, tmp_path):
    """An entry record: at most MAX_RECORD_BYTES, at the real value."""
    r, fp, prefix, locs = store
    remote.push("redis://fake", locs, namespace="ns", fingerprint=fp, client=r)
    key = f"{prefix}:tilelang:k"
    r.strings[key] = r.strings[key].ljust(remote.MAX_RECORD_BYTES)
    plan = remote.plan_pull("redis://fake", dest=tmp_path / "d", namespace="ns", local=fp,
                            client=r)
    assert [i.entry.key for i in plan.items] == ["tilelang:k"]
    r.strings[key] += b" "
    with pytest.raises(RemoteError) as err:
        remote.plan_pull("redis://fake", dest=tmp_path / "d", namespace="ns", local=fp, client=r)
    assert err.value.message == f"{key}: 16777217 bytes exceeds the limit of 16777216 bytes"


def test_store_index_members(store, tmp_path):
    """The index set: its SCARD is checked before SMEMBERS fetches it (the count is
    reported by the stand-in, not 2,000,000 real members)."""
    r, fp, prefix, locs = store
    remote.push("redis://fake", locs, namespace="ns", fingerprint=fp, client=r)
    index = f"{prefix}:index"
    r.cards[index] = remote.MAX_INDEX_ENTRIES
    assert len(remote.plan_pull("redis://fake", dest=tmp_path / "d", namespace="ns", local=fp,
                                client=r).items) == 1
    r.cards[index] = remote.MAX_INDEX_ENTRIES + 1
    with pytest.raises(RemoteError) as err:
        remote.plan_pull("redis://fake", dest=tmp_path / "d", namespace="ns", local=fp, client=r)
    assert err.value.message == f"{index}: 2000001 members exceeds the limit of 2000000"


# --- archives and leftovers --------------------------------------------------------------------
def test_archive_decompressed_bytes(store, tmp_path):
    """The reader reads no more bytes than the manifest declares plus ``max_manifest_bytes``
    and the tar framing (``reader._framing``); trailing zeros count (a sparse file here)."""
    _, fp, _, locs = store
    out = tmp_path / "a.tar"
    archive.pack(out, locs, fingerprint=fp)
    limits = ReaderLimits(max_manifest_bytes=64 << 10)
    with ArchiveReader(out, limits) as reader:
        m = reader.read_manifest()
    budget = m.size + limits.max_manifest_bytes + _framing(m)
    with open(out, "r+b") as fh:
        fh.truncate(budget)
    archive.verify(out, local=fp, limits=limits)
    with open(out, "r+b") as fh:
        fh.truncate(budget + 1)
    with pytest.raises(ArchiveError) as err:
        archive.verify(out, local=fp, limits=limits)
    assert re.fullmatch(rf"archive member '.+': decompressed data exceeds what the manifest "
                        rf"declares \({budget + 1} bytes\); refusing a possible decompression "
                        "bomb", err.value.message), err.value.message


def test_leftovers_of_another_host(tmp_path):
    """A staging directory of another host (a shared filesystem) is removed once it is older
    than STALE_AFTER_S (a minute either side of the edge: the clock moves)."""
    assert STALE_AFTER_S == 24 * 3600
    young, old = (tmp_path / f"{STAGING_PREFIX}elsewhere-{i}-{'a' * 12}" for i in (1, 2))
    for path, age in ((young, STALE_AFTER_S - 60), (old, STALE_AFTER_S + 60)):
        path.mkdir()
        os.utime(path, (time.time() - age, time.time() - age))
    assert clean_stale(tmp_path) == [old]
    assert young.exists() and not old.exists()


def test_audit_file_bytes_and_nesting(tmp_path, monkeypatch):
    from warmup.coverage import audit, audit_file

    p = tmp_path / "audit-1.json"
    p.write_text(json.dumps({"format": audit.FORMAT, "version": audit.VERSION, "steps": [],
                             "facts": _facts().to_dict()}))
    monkeypatch.setattr(audit_file, "MAX_FILE_BYTES", p.stat().st_size)
    assert audit_file.read(p).data["steps"] == []
    p.write_text(p.read_text() + " ")
    with pytest.raises(WarmupError) as err:
        audit_file.read(p)
    size = p.stat().st_size
    assert err.value.message == f"{p}: file is {size:,} bytes (limit {size - 1:,})"
    monkeypatch.setattr(audit_file, "MAX_FILE_BYTES", 1 << 20)
    p.write_text("[" * 100_000)  # nesting: a RecursionError inside json, one line outside
    with pytest.raises(WarmupError) as err:
        audit_file.read(p)
    assert err.value.message == f"{p}: not JSON: nested too deeply"
