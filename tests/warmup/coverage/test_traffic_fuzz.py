"""Fuzzing the traffic readers: whatever the bytes, a traffic file, a request log or an audit file
(whose steps are traffic steps) gives steps or one WarmupError line, never a traceback, and the
steps it gives are in range."""

from __future__ import annotations

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from warmup.coverage import audit_file, learn, request_logs, traffic
from warmup.errors import WarmupError
from warmup.plan.facts import from_settings

_SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-10**40, 10**40),
                     st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=20))
_JSON = st.recursive(_SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=5), st.dictionaries(st.sampled_from(
        ["kind", "prompts", "max_new_tokens", "sampling", "prefix", "features", "label", "group",
         "len", "n", "stream", "return_logprob", "logprob_start_len", "top_logprobs_num",
         "messages", "prompt", "role", "content", "body", "url", "usage", "prompt_tokens",
         "logprobs", "top_logprobs", "echo", "temperature", "event", "out", "meta_info", "obj",
         "completion_tokens", "rid", "timestamp", "sampling_params"]), inner, max_size=6)),
    max_leaves=20)
_FUZZ = settings(max_examples=80, deadline=None, suppress_health_check=list(HealthCheck))


def _line(value) -> str:
    return json.dumps(value, allow_nan=True)


def _check(steps) -> None:
    text = traffic.dump(steps)
    for s in steps:
        assert 1 <= max(s.prompts) <= traffic.MAX_PROMPT_TOKENS
        assert 1 <= s.max_new_tokens <= traffic.MAX_NEW_TOKENS
        assert traffic.check_features(s.features, s.prompts) is None
    assert "NaN" not in text and "Infinity" not in text


@_FUZZ
@given(st.lists(_JSON, min_size=1, max_size=4))
def test_traffic_files(tmp_path_factory, values):
    p = tmp_path_factory.mktemp("fuzz") / "t.jsonl"
    p.write_text("\n".join(_line(v) for v in values) + "\n")
    try:
        _check(traffic.load(p))
    except WarmupError as exc:
        assert exc.message.startswith(str(p)) and "\n" not in exc.message


@_FUZZ
@given(st.sampled_from(request_logs.CONVERT_FORMATS), st.lists(_JSON, min_size=1, max_size=4),
       st.booleans())
def test_request_logs(tmp_path_factory, fmt, values, as_event):
    p = tmp_path_factory.mktemp("fuzz") / "log.jsonl"
    lines = []
    for v in values:
        if as_event and isinstance(v, dict):
            v = dict(v, event="request.finished")
        lines.append(_line(v))
    p.write_text("\n".join(lines) + "\n")
    try:
        _check(request_logs.convert(fmt, p).steps)
    except WarmupError as exc:
        assert exc.message.startswith(str(p)) and "\n" not in exc.message


@_FUZZ
@given(st.binary(max_size=300))
def test_raw_bytes(tmp_path_factory, data):
    p = tmp_path_factory.mktemp("fuzz") / "raw.jsonl"
    p.write_bytes(data)
    for read in (traffic.load, lambda q: request_logs.convert("openai", q),
                 lambda q: request_logs.convert("sglang-log", q)):
        try:
            result = read(p)
            _check(result if isinstance(result, list) else result.steps)
        except WarmupError as exc:
            assert exc.message.startswith(str(p))


_TEXT_VALUE = st.one_of(st.integers(-10**30, 10**30).map(str), st.text("0123456789.eE+-", max_size=12),
                        st.integers(4000, 6000).map(lambda n: "9" * n),
                        st.floats(allow_nan=True, allow_infinity=True).map(repr))


@_FUZZ
@given(st.lists(_TEXT_VALUE, min_size=8, max_size=8))
def test_sglang_text_log_numbers(tmp_path_factory, values):
    """SGLang's text format: whatever stands where a number belongs (``1.2.3``, ``e``, 5,000
    digits, ``inf``), the line converts in range or is left out, never a traceback."""
    p = tmp_path_factory.mktemp("fuzz") / "requests.log"
    pt, ct, cached, lat, ts, temp, start, top = values
    p.write_text(f"[2026-01-01 00:00:00] Finish: obj=GenerateReqInput(sampling_params="
                 f"{{'temperature': {temp}, 'x': [}}, return_logprob=True, "
                 f"logprob_start_len={start}, top_logprobs_num={top}), out={{'meta_info': "
                 f"{{'prompt_tokens': {pt}, 'completion_tokens': {ct}, 'cached_tokens': "
                 f"{cached}, 'e2e_latency': {lat}, 'request_received_ts': {ts}}}}}\n")
    try:
        _check(request_logs.convert("sglang-log", p).steps)
    except WarmupError as exc:
        assert exc.message.startswith(str(p)) and "\n" not in exc.message


_FACTS = from_settings({"chunked_prefill_size": 1024, "context_length": 8192}, source="file")
_PLAN = ("version: 1\nname: x\nphases:\n  - name: p\n    shapes:\n"
         "      - {class: c, kind: extend, lengths: [8]}\n")
_STEP = {"index": 0, "kind": "single", "prompts": [100], "max_new_tokens": 8, "sampling": {},
         "label": "", "prefix_cached": False, "pass1": {"misses": 1, "device_loads": 0, "keys": []},
         "pass2": {"misses": 0, "device_loads": 0, "keys": []}}
_STEP_KEYS = st.sampled_from(sorted(_STEP) + ["prefix", "features"])
_FACT_KEYS = st.sampled_from(sorted(_FACTS.to_dict()))


@_FUZZ
@given(st.lists(st.dictionaries(_STEP_KEYS, _JSON, max_size=3), max_size=3),
       st.dictionaries(_FACT_KEYS, _JSON, max_size=2), st.one_of(st.none(), _JSON),
       st.one_of(st.none(), _JSON))
def test_audit_files(tmp_path_factory, changes, facts_changes, unattributed, unseen):
    """learn reads an audit file or refuses it in one line: its steps as traffic steps, its
    facts as a facts file's, its counts bounded."""
    import json

    d = tmp_path_factory.mktemp("fuzz")
    data = {"format": "sglang-warmup-audit", "version": 1,
            "steps": [dict(_STEP, **c) for c in changes],
            "facts": dict(_FACTS.to_dict(), **facts_changes)}
    for key, value in (("unattributed", unattributed), ("unseen_events", unseen)):
        if value is not None:
            data[key] = value
    (d / "audit-1.json").write_text(json.dumps(data, allow_nan=True))
    (d / "plan.yaml").write_text(_PLAN)
    try:
        learn.learn(d / "audit-1.json", d / "plan.yaml")
    except WarmupError as exc:
        assert "\n" not in exc.message
        if exc.message.startswith(str(d / "audit-1.json")):
            return
        audit_file.read(d / "audit-1.json")  # a refusal of learn's own, on a valid file
