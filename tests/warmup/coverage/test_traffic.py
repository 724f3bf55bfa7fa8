"""warmup.coverage.traffic: traffic files (load errors with exact text), synthetic samples (deterministic
per seed, within their limits, valid for SGLang), and their conversion to driver steps."""

from __future__ import annotations

import asyncio

import pytest

from warmup.coverage import request_logs, traffic
from warmup.errors import WarmupError
from warmup.coverage.traffic import TrafficStep
from warmup.serve.transport import InProcessTransport, sampling_params


def write(tmp_path, *lines: str):
    p = tmp_path / "traffic.jsonl"
    p.write_text("".join(line + "\n" for line in lines))
    return p


# --- load ---------------------------------------------------------------------------------------------
def test_load_reads_steps_skipping_comments_and_blank_lines(tmp_path):
    p = write(tmp_path,
              "# a sample",
              '{"kind": "single", "prompts": [700], "prefix": {"group": "sys", "len": 512}, "label": "turn"}',
              "",
              '{"kind": "burst", "prompts": [30, 40], "max_new_tokens": 4, "sampling": {"temperature": 0}}',
              '{"prompts": [9]}')
    steps = traffic.load(p)
    assert steps == [
        TrafficStep("single", (700,), 16, {}, "sys", 512, "turn"),
        TrafficStep("burst", (30, 40), 4, {"temperature": 0}, None, 0, ""),
        TrafficStep("single", (9,), 16, {}, None, 0, ""),
    ]


@pytest.mark.parametrize("line, message, hint", [
    ('{oops', "not JSON: Expecting property name enclosed in double quotes: line 1 column 2 (char 1)",
     "one JSON object per line"),
    ('[1, 2]', "expected an object", "see `sglang-warmup traffic synth`"),
    ('{"prompts": [1], "zzz": 2, "bogus": 1}', "unknown field(s) bogus, zzz",
     "fields: kind, prompts, max_new_tokens, sampling, prefix, features, label"),
    ('{"kind": "stream", "prompts": [1]}', "kind: 'stream' is not one of single, burst, batch",
     "single (one prompt), burst (concurrent requests) or batch (one request)"),
    ('{"kind": "batch", "prompts": []}', "prompts: expected a non-empty list of positive integers",
     "prompt lengths in tokens"),
    ('{"kind": "batch", "prompts": [4, 0]}', "prompts: expected a non-empty list of positive integers",
     "prompt lengths in tokens"),
    ('{"kind": "batch", "prompts": [true]}', "prompts: expected a non-empty list of positive integers",
     "prompt lengths in tokens"),
    ('{"kind": "single", "prompts": [4, 5]}', "prompts: a single step has one prompt", "use burst or batch"),
    ('{"prompts": [4], "max_new_tokens": 0}', "max_new_tokens: expected an integer from 1 to 1,000,000",
     "tokens to generate per prompt, e.g. 16"),
    ('{"prompts": [4], "sampling": {"temp": 1}}',
     "sampling: keys must be among frequency_penalty, min_p, presence_penalty, repetition_penalty, "
     "sampling_seed, temperature, top_k, top_p", 'SGLang sampling parameters, e.g. {"temperature": 0.7}'),
    ('{"prompts": [40], "prefix": {"group": 1, "len": 4}}', 'prefix: expected {"group": str, "len": n}',
     'e.g. "prefix": {"group": "system", "len": 512}'),
    ('{"prompts": [40], "prefix": {"group": "g", "len": 0}}', 'prefix: expected {"group": str, "len": n}',
     'e.g. "prefix": {"group": "system", "len": 512}'),
    ('{"prompts": [40], "prefix": {"group": "g", "len": true}}', 'prefix: expected {"group": str, "len": n}',
     'e.g. "prefix": {"group": "system", "len": 512}'),
    ('{"prompts": [40], "prefix": "sys"}', 'prefix: expected {"group": str, "len": n}',
     'e.g. "prefix": {"group": "system", "len": 512}'),
    ('{"kind": "burst", "prompts": [200, 100], "prefix": {"group": "g", "len": 100}}',
     "prefix: every prompt must be longer than the prefix (100)", "prompt lengths include the shared prefix"),
])
def test_load_errors_name_the_line_and_the_field(tmp_path, line, message, hint):
    p = write(tmp_path, '{"prompts": [3]}', line)
    with pytest.raises(WarmupError) as err:
        traffic.load(p)
    assert (err.value.message, err.value.hint) == (f"{p}:2: {message}", hint)


def test_load_an_empty_or_missing_file(tmp_path):
    p = write(tmp_path, "# nothing yet", "")
    with pytest.raises(WarmupError) as err:
        traffic.load(p)
    assert (err.value.message, err.value.hint) == (f"{p}: no traffic steps",
                                                   "`sglang-warmup traffic synth` writes a sample")
    missing = tmp_path / "missing.jsonl"
    with pytest.raises(WarmupError) as err:
        traffic.load(missing)
    assert err.value.message == f"{missing}: cannot read traffic file: No such file or directory"
    assert err.value.hint == "check the path"


# --- synth --------------------------------------------------------------------------------------------
#: synth("rag", seed=1, steps=6) before max_prompt was enforced (the GPU end-to-end sample)
RAG_SEED1 = [(2093, 2103, 2098), (7021,), (2164,), (2305,), (7086, 7025, 7038), (3547,)]
LABELS = {
    "chat": {"chat_turn", "chat_burst", "chat_fresh", "chat_long"},
    "rag": {"rag_query", "rag_burst"},
    "agent": {"agent_turn", "agent_tools"},
    "features": {"logprobs_from_0", "logprobs_offset_top", "output_logprobs_ids", "parallel_n",
                 "long_decode", "chunk_boundary", "long_prefix"} | {f"burst_{k}" for k in range(20, 65)},
}


@pytest.mark.parametrize("kind", traffic.KINDS)
def test_synth_is_deterministic_per_seed(kind):
    a = traffic.synth(kind, seed=3)
    assert a == traffic.synth(kind, seed=3)
    assert traffic.dump(a) == traffic.dump(traffic.synth(kind, seed=3))
    assert a != traffic.synth(kind, seed=4)
    labels = {s.label for s in a}
    if kind == "batch":
        assert all(s.kind == "batch" and s.label == f"batch_{len(s.prompts)}" for s in a)
        assert all(2 <= len(s.prompts) <= 24 for s in a)
    else:
        assert labels <= LABELS[kind] and len(labels) >= 2
    # agent adds a tool-call burst every fifth turn
    assert len(a) == (24 + 24 // 5 if kind == "agent" else 24)


@pytest.mark.parametrize("kind", traffic.KINDS)
def test_synth_round_trips_through_a_traffic_file(kind, tmp_path):
    steps = traffic.synth(kind, seed=1, steps=12)
    p = tmp_path / f"{kind}.jsonl"
    p.write_text(traffic.dump(steps))
    assert traffic.load(p) == steps


@pytest.mark.parametrize("max_prompt", [1600, 2048, 4096, 12000])
@pytest.mark.parametrize("kind", traffic.KINDS)
def test_synth_stays_within_max_prompt(kind, max_prompt):
    for seed in range(4):
        for s in traffic.synth(kind, seed=seed, max_prompt=max_prompt):
            assert max(s.prompts) <= max_prompt, (seed, s)
            assert all(n > s.prefix_len for n in s.prompts)


def test_synth_refuses_an_unknown_kind_or_a_tiny_max_prompt():
    with pytest.raises(WarmupError) as err:
        traffic.synth("video")
    assert (err.value.message, err.value.hint) == ("unknown traffic kind 'video'",
                                                   "one of: chat, rag, agent, batch, features")
    with pytest.raises(WarmupError) as err:
        traffic.synth("chat", max_prompt=1599)
    assert (err.value.message, err.value.hint) == (
        "max_prompt 1599 is below 1600 tokens",
        "a sample needs room for a system prompt or an agent context plus a turn")


def test_synth_at_the_default_limit_is_unchanged():
    """The limits above change nothing at the default max_prompt: a recorded sample replays."""
    assert [s.prompts for s in traffic.synth("rag", seed=1, steps=6)] == RAG_SEED1


def test_synth_steps_do_not_share_mutable_sampling():
    a = traffic.synth("chat", seed=0)
    a[0].sampling["temperature"] = 99
    assert all(s.sampling.get("temperature") != 99 for s in traffic.synth("chat", seed=0))


# --- to_step --------------------------------------------------------------------------------------------
def test_to_step_modes_and_requests():
    single = TrafficStep("single", (700,), 8, {"temperature": 0}, "sys", 512, "turn").to_step(3)
    assert (single.index, single.phase, single.shape_class, single.kind, single.mode) == (3, "traffic", "turn",
                                                                                          "traffic", "single")
    (r,) = single.requests
    assert (r.input_len, r.max_new_tokens, r.prefix_key, r.prefix_len, r.ignore_eos) == (700, 8, "sys", 512, True)
    assert (r.sampling_name, r.sampling) == ("greedy", {"temperature": 0})
    assert single.note == "single 700"

    burst = TrafficStep("burst", (30, 40, 50), 4, {"temperature": 0.7, "top_p": 0.95}).to_step(0)
    assert burst.mode == "concurrent" and burst.shape_class == "burst"
    assert [q.input_len for q in burst.requests] == [30, 40, 50]
    assert {q.sampling_name for q in burst.requests} == {"custom"}
    assert all(q.prefix_key is None and q.prefix_len == 0 for q in burst.requests)
    assert burst.note == "burst 30+40+50"

    batch = TrafficStep("batch", (8, 9), 2, {}, label="batch_2").to_step(1)
    assert (batch.mode, batch.num_requests, batch.shape_class) == ("batch", 2, "batch_2")


@pytest.mark.parametrize("kind", traffic.KINDS)
def test_synth_steps_are_valid_sglang_requests(kind):
    from sglang.srt.sampling.sampling_params import SamplingParams

    for i, s in enumerate(traffic.synth(kind, seed=2, steps=10)):
        for r in s.to_step(i).requests:
            sp = SamplingParams(**sampling_params(r))
            sp.normalize(None)
            sp.verify(20000)


def test_a_synth_sample_replays_through_the_in_process_transport(fake_tokenizer_manager):
    tm = fake_tokenizer_manager()
    steps = traffic.synth("chat", seed=5, steps=10, max_prompt=3000)
    transport = InProcessTransport(tm, vocab_size=20000)
    for i, s in enumerate(steps):
        asyncio.run(transport.send(s.to_step(i)))
    assert len(tm.items) == sum(len(s.prompts) for s in steps)
    assert [o.is_single for o in tm.objs] == [True] * len(tm.objs)  # no batch in a chat sample
    flat = [(s, n) for s in steps for n in s.prompts]
    assert [len(i.input_ids) for i in tm.items] == [n for _, n in flat]
    # every request of the "system" group starts with the same system-prompt tokens
    grouped = [(i, s.prefix_len) for i, (s, _) in zip(tm.items, flat) if s.prefix_group == "system"]
    assert len(grouped) >= 2
    assert len({tuple(i.input_ids[:plen]) for i, plen in grouped}) == 1


# --- request features and hostile lines ------------------------------------------------------------
def test_features_round_trip_and_reach_the_driver_step(tmp_path):
    line = ('{"kind": "burst", "prompts": [300, 400], "features": {"return_logprob": true, '
            '"logprob_start_len": 100, "top_logprobs_num": 5, "n": 2, "stream": true}}')
    (step,) = traffic.load(write(tmp_path, line))
    assert step.features == {"return_logprob": True, "logprob_start_len": 100,
                             "top_logprobs_num": 5, "n": 2, "stream": True}
    assert traffic.load(write(tmp_path, traffic.dump([step]).strip())) == [step]
    ws = step.to_step(0)
    assert [dict(r.features) for r in ws.requests] == [step.features] * 2
    assert ws.sequences == 4


@pytest.mark.parametrize("line, message", [
    ('{"prompts": [4], "features": {"logprobs": 1}}',
     "features: unknown feature(s) logprobs (known: logprob_start_len, top_logprobs_num, "
     "token_ids_logprob, n, stop_token_ids, return_logprob, stream)"),
    ('{"prompts": [4], "features": {"n": 0}}', "features: n: expected an integer from 1 to 64"),
    ('{"prompts": [4], "features": {"stream": "yes"}}', "features: stream: expected true or false"),
    ('{"prompts": [4], "features": {"logprob_start_len": 4}}',
     "features: logprob_start_len: 4 is not below every prompt's length"),
    ('{"prompts": [4], "features": [1]}', "features: expected an object of request features"),
    ('{"prompts": [4], "sampling": {"temperature": NaN}}',
     "not JSON: NaN is not a number JSON allows"),
    ('{"prompts": [4], "sampling": {"temperature": "hot"}}',
     "sampling.temperature: expected a finite number"),
    ('{"prompts": [1000000000000000000000000000000]}',
     "prompts: at most 4,096 prompts of at most 10,000,000 tokens each"),
    ('{"prompts": [4], "max_new_tokens": 1e400}', "max_new_tokens: expected an integer from 1 to 1,000,000"),
    ('{"prompts": [4], "kind": ["single"]}',
     "kind: ['single'] is not one of single, burst, batch"),
    ('{"prompts": [4], "label": "a\\u0007b"}',
     "label: expected printable text of at most 200 characters"),
    ("[" * 100000, "not JSON: nested too deeply"),
])
def test_hostile_traffic_lines_get_one_line_errors(tmp_path, line, message):
    p = write(tmp_path, line)
    with pytest.raises(WarmupError) as err:
        traffic.load(p)
    assert err.value.message == f"{p}:1: {message}"


def test_a_traffic_file_above_the_size_limit_is_refused_before_reading(tmp_path, monkeypatch):
    monkeypatch.setattr(traffic, "MAX_FILE_BYTES", 100)
    p = write(tmp_path, '{"prompts": [4]}' * 10)
    with pytest.raises(WarmupError) as err:
        traffic.load(p)
    assert err.value.message == f"{p}: traffic file is {p.stat().st_size} bytes (limit 100)"


def test_the_features_sample_covers_every_family():
    steps = traffic.synth("features", seed=3, steps=40, max_prompt=12000, chunk=2048)
    keys = {k for s in steps for k in s.features}
    assert {"return_logprob", "logprob_start_len", "top_logprobs_num", "token_ids_logprob", "n",
            "stream", "stop_token_ids"} <= keys
    assert any(s.kind == "burst" and 20 <= len(s.prompts) <= 64 for s in steps)
    assert any(s.max_new_tokens >= 256 for s in steps)
    assert {p for s in steps if s.label == "chunk_boundary" for p in s.prompts} & {2047, 2048, 2049}
    assert all(max(s.prompts) <= 12000 for s in steps)


# --- hostile request logs: never a traceback, nothing out of range written ---------------------
_HOSTILE_OPENAI = [
    '{"messages": [1, null, "x"], "max_tokens": 1e400}',
    '{"messages": [{"role": "system", "content": {"deep": [[[["x"]]]]}}, {"role": "user"}]}',
    '{"prompt": [1, 2, "x"], "temperature": Infinity}',
    '{"prompt_tokens": 1000000000000000000000000000000}',
    '{"prompt": "abc", "n": 1e10, "logprobs": "yes", "top_logprobs": -3, "stream": "true"}',
    '{"prompt": "abc", "temperature": 1e400, "top_p": true}',
    '{"body": [1, 2], "url": 7}',
    '{"messages": {"role": "user"}, "usage": {"prompt_tokens": "many"}}',
    '"just a string"',
    '{"prompt": [[1, 2], 3]}',
    '{"prompt": "' + "x" * 100 + '", "logprobs": 3, "echo": true, "n": 2, "stream": true}',
    '{"messages": [{"role": "system", "content": [{"type": "text", "text": 5}]}, '
    '{"role": "user", "content": [{"text": ["x"]}, {"text": {"a": 1}}, {"text": null}]}]}',
]


def _text_log(meta: str, head: str = "") -> str:
    """A finished request of SGLang's text log format with these meta_info fields."""
    return (f"[2026-01-01 00:00:00] Finish: obj=GenerateReqInput({head}), "
            f"out={{'meta_info': {{{meta}}}}}")


#: Numbers of the text format that are not numbers, or past what int() converts.
_TEXT_NUMBERS = ["1.2.3", "e", "-", ".", "1e", "9" * 5000, "1e999", "-1e999"]
_HOSTILE_SGLANG = [
    '{"event": "request.finished", "rid": [1], "obj": [], "out": {"meta_info": []}}',
    '{"event": "request.finished", "out": {"meta_info": {"prompt_tokens": "10", '
    '"completion_tokens": [3]}}}',
    '{"event": "request.finished", "timestamp": "99999-01-01", "out": {"meta_info": '
    '{"prompt_tokens": 10, "completion_tokens": 3, "e2e_latency": "slow"}}}',
    '{"event": "request.finished", "obj": {"sampling_params": "hot", "return_logprob": true, '
    '"logprob_start_len": 99}, "out": {"meta_info": {"prompt_tokens": 10, "completion_tokens": 3, '
    '"request_received_ts": 5.0}}}',
    '{"event": "request.finished", "out": {"meta_info": {"prompt_tokens": 1e400, '
    '"completion_tokens": 3}}}',
    '{"event": "request.finished", "out": {"meta_info": {"prompt_tokens": 99999999999999, '
    '"completion_tokens": 3}}}',
    '{"event": "request.received", "rid": {"a": 1}, "timestamp": 3}',
    '[2026-01-01 00:00:00] Finish: obj=GenerateReqInput(sampling_params={' + "[" * 5000
    + '}, return_logprob=True, top_logprobs_num=5), out={\'meta_info\': {\'prompt_tokens\': 12, '
    "'completion_tokens': 4}}",
    "[2026-01-01 00:00:00] Finish: obj=GenerateReqInput(stream=True), out={'meta_info': "
    "{'prompt_tokens': 1000000000000000000000000000000, 'completion_tokens': 4}}",
    '{"event": "request.finished", "out": {"meta_info": {"prompt_tokens": 20, "completion_tokens": 2}}}',
    *(_text_log(f"'prompt_tokens': {v}, 'completion_tokens': {v}, 'cached_tokens': {v}, "
                f"'e2e_latency': {v}, 'request_received_ts': {v}",
                f"sampling_params={{'temperature': {v}, 'bad': [}}, return_logprob=True, "
                f"logprob_start_len={v}, top_logprobs_num={v}") for v in _TEXT_NUMBERS),
    _text_log("'prompt_tokens': 12, 'completion_tokens': 4, 'e2e_latency': 1.2.3",
              "sampling_params={'temperature': 1.2.3, 'top_p': e, [}"),
]


@pytest.mark.parametrize("fmt, lines", [("openai", _HOSTILE_OPENAI), ("sglang-log", _HOSTILE_SGLANG)])
def test_hostile_request_logs_convert_without_tracebacks_or_wild_values(tmp_path, fmt, lines):
    import json as _json

    for i, line in enumerate(lines):
        p = tmp_path / f"log{i}.jsonl"
        p.write_text(line + "\n")
        try:
            conv = request_logs.convert(fmt, p)
        except WarmupError as exc:
            assert exc.message.startswith(str(p)) and "\n" not in exc.message
            continue
        text = traffic.dump(conv.steps)  # allow_nan=False: raises on NaN/Infinity
        for s in traffic.load(write(tmp_path, *text.splitlines())):
            assert max(s.prompts) <= traffic.MAX_PROMPT_TOKENS
            assert s.max_new_tokens <= traffic.MAX_NEW_TOKENS
            assert traffic.check_features(s.features, s.prompts) is None
        assert "NaN" not in text and "Infinity" not in text
        _json.loads(text.splitlines()[0])


def test_openai_features_become_request_features(tmp_path):
    p = tmp_path / "log.jsonl"
    p.write_text('{"prompt": "' + "x" * 100 + '", "logprobs": 3, "echo": true, "n": 2, '
                 '"stream": true}\n{"messages": [{"role": "user", "content": "hi"}], '
                 '"logprobs": true, "top_logprobs": 4}\n')
    conv = request_logs.convert("openai", p)
    assert [s.features for s in conv.steps] == [
        {"n": 2, "stream": True, "return_logprob": True, "top_logprobs_num": 3,
         "logprob_start_len": 0},
        {"return_logprob": True, "top_logprobs_num": 4}]


def test_text_log_numbers_that_are_not_numbers(tmp_path):
    """``1.2.3`` or ``e`` where SGLang's text log has a number is no number (the request keeps
    its lengths); 5,000 digits of prompt tokens leave the request out as too long."""
    p = tmp_path / "requests.log"
    p.write_text(_text_log("'prompt_tokens': 12, 'completion_tokens': 4, 'e2e_latency': 1.2.3",
                           "sampling_params={'temperature': e, 'top_p': 0.5, 'x': [}") + "\n"
                 + _text_log(f"'prompt_tokens': {'9' * 5000}, 'completion_tokens': 4") + "\n")
    conv = request_logs.convert("sglang-log", p)
    assert [(s.prompts, s.max_new_tokens, s.sampling) for s in conv.steps] == \
        [((12,), 4, {"top_p": 0.5})]
    assert conv.skipped == {"above 10,000,000 prompt or 1,000,000 completion tokens": 1}
