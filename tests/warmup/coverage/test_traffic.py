"""warmup.coverage.traffic: traffic files (load errors with exact text), synthetic samples (deterministic
per seed, within their limits, valid for SGLang), and their conversion to driver steps."""

from __future__ import annotations

import asyncio

import pytest

from warmup.coverage import traffic
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
     "fields: kind, prompts, max_new_tokens, sampling, prefix, label"),
    ('{"kind": "stream", "prompts": [1]}', "kind: 'stream' is not one of single, burst, batch",
     "single (one prompt), burst (concurrent requests) or batch (one request)"),
    ('{"kind": "batch", "prompts": []}', "prompts: expected a non-empty list of positive integers",
     "prompt lengths in tokens"),
    ('{"kind": "batch", "prompts": [4, 0]}', "prompts: expected a non-empty list of positive integers",
     "prompt lengths in tokens"),
    ('{"kind": "batch", "prompts": [true]}', "prompts: expected a non-empty list of positive integers",
     "prompt lengths in tokens"),
    ('{"kind": "single", "prompts": [4, 5]}', "prompts: a single step has one prompt", "use burst or batch"),
    ('{"prompts": [4], "max_new_tokens": 0}', "max_new_tokens: expected a positive integer",
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
    assert err.value.message == (f"{missing}: cannot read traffic file: [Errno 2] No such file or directory: "
                                 f"'{missing}'")
    assert err.value.hint == "pass a JSON-lines file"


# --- synth --------------------------------------------------------------------------------------------
#: synth("rag", seed=1, steps=6) before max_prompt was enforced (the GPU end-to-end sample)
RAG_SEED1 = [(2093, 2103, 2098), (7021,), (2164,), (2305,), (7086, 7025, 7038), (3547,)]
LABELS = {
    "chat": {"chat_turn", "chat_burst", "chat_fresh", "chat_long"},
    "rag": {"rag_query", "rag_burst"},
    "agent": {"agent_turn", "agent_tools"},
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
    assert (err.value.message, err.value.hint) == ("unknown traffic kind 'video'", "one of: chat, rag, agent, batch")
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
