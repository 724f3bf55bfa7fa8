"""warmup.serve.driver: a plan expanded against a real resolved SGLang 0.5.22 server config, sent
through the in-process transport to a stand-in at SGLang's TokenizerManager boundary (every
request normalized and verified by SGLang's own classes), with faults injected there."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
from dataclasses import replace

import pytest

from warmup.plan import facts as facts_mod
from warmup.plan import loader
from warmup.observe import phase
from warmup.serve.driver import Driver
from warmup.serve.report import ClassReport, RunReport
from warmup.view.text import run_report as render
from warmup.errors import DriverError
from warmup.plan.expand import expand
from warmup.serve.transport import InProcessTransport, sampling_params

pytestmark = pytest.mark.usefixtures("warmup_isolated")

# The tiny server (tests/warmup/conftest.py): context 4096, KV capacity 20,000 tokens, at most 8
# running requests, vocabulary 20,000, generation-config sampling defaults below.
TINY_CONTEXT, TINY_KV_TOKENS, TINY_MAX_RUNNING, TINY_VOCAB = 4096, 20000, 8, 20000
TINY_GENERATION = {"temperature": 0.6, "top_p": 0.95, "top_k": 20}

# The tiny plan against the tiny server: (index, class, mode, prompt lengths, background lengths).
EXPECTED_STEPS = [
    (0, "extends", "single", [1], []),
    (1, "extends", "single", [16], []),
    (2, "extends", "single", [37], []),
    (3, "chunked", "single", [275], []),
    (4, "prefix_hits", "single", [64], []),
    (5, "prefix_hits", "single", [65], []),
    (6, "prefix_hits", "single", [81], []),
    (7, "concurrent", "concurrent", [19, 32, 45, 58], []),
    (8, "batched", "batch", [8, 8, 16], []),
    (9, "batched", "batch", [8, 8, 8], []),
    (10, "mixed", "mixed", [275], [32, 32]),
    (11, "decode", "concurrent", [16, 17], []),
    (12, "sampling", "single", [21], []),
    (13, "sampling", "single", [21], []),
    (14, "sampling", "single", [21], []),
    (15, "sampling", "single", [21], []),
    (16, "sampling", "single", [21], []),
    (17, "sampling", "single", [21], []),
]
CLASSES = ["extends", "chunked", "prefix_hits", "concurrent", "batched", "mixed", "decode", "sampling"]


def tiny_expansion(tm, plan_path, *, only=None, **fact_changes):
    """The tiny plan expanded against the facts the registered warm-up reads in-process."""
    facts = asyncio.run(facts_mod.from_tokenizer_manager(tm))
    if fact_changes:
        facts = replace(facts, **fact_changes)
    exp = expand(loader.load(plan_path), facts)
    if only is not None:
        exp = replace(exp, steps=tuple(s for s in exp.steps if s.shape_class in only))
    return exp


def run(driver: Driver, exp) -> RunReport:
    return asyncio.run(driver.run(exp))


# --- what the driver sends ------------------------------------------------------------------------
def test_facts_come_from_the_live_tokenizer_manager(fake_tokenizer_manager):
    tm = fake_tokenizer_manager()
    f = asyncio.run(facts_mod.from_tokenizer_manager(tm))
    assert f.source == "server_args"
    assert f.sglang_version == "0.5.22"
    assert (f.chunked_prefill_size, f.enable_mixed_chunk, f.page_size) == (256, True, 1)
    assert (f.context_length, f.max_req_input_len, f.max_input_len) == (TINY_CONTEXT, TINY_CONTEXT - 1,
                                                                       TINY_CONTEXT - 1)
    assert f.max_running_requests == TINY_MAX_RUNNING
    # SGLang reports the KV capacity per rank as memory_usage.token_capacity
    assert f.max_total_tokens == TINY_KV_TOKENS
    assert (f.vocab_size, f.model_type) == (TINY_VOCAB, "llama")
    assert dict(f.default_sampling_params) == TINY_GENERATION
    assert f.disaggregation_mode == "null"


def test_a_plan_runs_as_sglang_requests_in_order_then_flushes(fake_tokenizer_manager, tiny_plan_path,
                                                              warmup_isolated):
    state = str(warmup_isolated)
    tm = fake_tokenizer_manager(state_dir=state)
    exp = tiny_expansion(tm, tiny_plan_path)
    assert [(s.index, s.shape_class, s.mode, [r.input_len for r in s.requests],
             [r.input_len for r in s.background]) for s in exp.steps] == EXPECTED_STEPS
    lines: list[str] = []
    driver = Driver(InProcessTransport(tm, vocab_size=exp.facts.vocab_size), state_dir=state,
                    progress=lines.append)
    report = run(driver, exp)

    assert report.ok and report.failures == () and report.skipped_reason is None
    assert report.requests == exp.num_requests == len(tm.items) == 28
    assert [c.shape_class for c in report.classes] == CLASSES
    # one GenerateReqInput per request, except a batch: one per step
    assert len(tm.objs) == 28 - 2 * 2
    # every item: SGLang normalized it, SamplingParams verified it, no logprobs
    assert all(i.return_logprob is False for i in tm.items)
    assert all(1000 <= t < TINY_VOCAB for i in tm.items for t in i.input_ids)
    # each step's items carry the step's sampling and are stamped with its class and index
    for step in exp.steps:
        got = sorted((len(i.input_ids), json.dumps(i.sampling_dict, sort_keys=True))
                     for i in tm.items if i.phase.request == step.index)
        want = sorted((r.input_len, json.dumps(sampling_params(r), sort_keys=True))
                      for r in step.background + step.requests)
        assert got == want, step
        assert {(i.phase.phase, i.phase.shape_class) for i in tm.items if i.phase.request == step.index} \
            == {("warmup", step.shape_class)}
    # the flush comes last, once, with the driver's timeout, when nothing is running
    assert [r.timeout_s for r in tm.flush_requests] == [60.0]
    assert tm.events_at_flush == len(tm.events) and tm.in_flight == 0
    assert report.flush == "flushed on 1 rank(s)"
    assert phase.current(state_dir=state).phase == "serving"
    assert lines[0] == "sglang-warmup [1/3] phase prefill: 7 steps, 7 requests"
    assert lines[2] == "sglang-warmup [2/3] phase batches: 4 steps, 13 requests"
    assert lines[-1] == "sglang-warmup: cache flush: flushed on 1 rank(s)"


def test_sampling_variants_reach_sglang_as_planned(fake_tokenizer_manager, tiny_plan_path):
    tm = fake_tokenizer_manager()
    exp = tiny_expansion(tm, tiny_plan_path, only={"sampling"})
    run(Driver(InProcessTransport(tm, vocab_size=TINY_VOCAB)), exp)
    sp = [i.sampling for i in tm.items]
    # greedy: SGLang turns temperature 0 into top_k 1 (its argmax path)
    assert (sp[0].temperature, sp[0].top_k) == (1.0, 1)
    # default: the model's generation config, as SGLang's get_default_sampling_params returns it
    assert (sp[1].temperature, sp[1].top_p, sp[1].top_k) == (0.6, 0.95, 20)
    assert (sp[2].temperature, sp[2].top_p) == (0.8, 0.9)
    assert (sp[3].temperature, sp[3].top_k) == (0.8, 40)
    assert (sp[4].temperature, sp[4].min_p) == (0.8, 0.05)
    assert (sp[5].frequency_penalty, sp[5].presence_penalty, sp[5].repetition_penalty) == (0.5, 0.5, 1.1)
    assert all(s.max_new_tokens == 2 and s.ignore_eos for s in sp)


def test_prefix_requests_share_their_prefix_tokens(fake_tokenizer_manager, tiny_plan_path):
    tm = fake_tokenizer_manager()
    exp = tiny_expansion(tm, tiny_plan_path, only={"prefix_hits"})
    run(Driver(InProcessTransport(tm, vocab_size=TINY_VOCAB)), exp)
    base, plus1, plus17 = (i.input_ids for i in tm.items)
    assert (len(base), len(plus1), len(plus17)) == (64, 65, 81)
    assert plus1[:64] == base and plus17[:64] == base


# --- concurrency, batching, mixed --------------------------------------------------------------
def test_a_concurrent_step_has_all_its_requests_in_flight_at_once(fake_tokenizer_manager, tiny_plan_path):
    tm = fake_tokenizer_manager(latency_s=0.02)
    exp = tiny_expansion(tm, tiny_plan_path, only={"concurrent"})
    run(Driver(InProcessTransport(tm, vocab_size=TINY_VOCAB)), exp)
    assert len(tm.objs) == 4 and all(o.is_single for o in tm.objs)
    assert tm.max_in_flight == 4
    assert [kind for kind, _ in tm.events] == ["start"] * 4 + ["end"] * 4
    assert tm.in_flight_at_arrival == [0, 1, 2, 3]


def test_a_batch_step_is_one_request_carrying_all_prompts(fake_tokenizer_manager, tiny_plan_path):
    tm = fake_tokenizer_manager()
    exp = tiny_expansion(tm, tiny_plan_path, only={"batched"})
    report = run(Driver(InProcessTransport(tm, vocab_size=TINY_VOCAB)), exp)
    assert len(tm.objs) == 2
    for obj, step in zip(tm.objs, exp.steps):
        assert not obj.is_single and obj.batch_size == 3
        assert [len(ids) for ids in obj.input_ids] == [r.input_len for r in step.requests]
        assert obj.sampling_params == [sampling_params(r) for r in step.requests]
        assert obj.return_logprob == [False, False, False]
        assert len(set(obj.rid)) == 3
    assert tm.in_flight_at_arrival == [0, 0]
    assert report.classes[0].requests == 6 and report.classes[0].steps == 2


def test_the_mixed_mode_starts_the_decoders_before_the_prompt(fake_tokenizer_manager, tiny_plan_path):
    tm = fake_tokenizer_manager(latency_s=0.01)
    exp = tiny_expansion(tm, tiny_plan_path, only={"mixed"})
    report = run(Driver(InProcessTransport(tm, vocab_size=TINY_VOCAB)), exp)
    assert report.ok and report.requests == 3
    decoders = [i for i in tm.items if i.stream]
    prompt = [i for i in tm.items if not i.stream]
    assert [len(i.input_ids) for i in decoders] == [32, 32]
    assert [i.sampling.max_new_tokens for i in decoders] == [4, 4]
    assert all(i.sampling.ignore_eos for i in decoders)
    assert [len(i.input_ids) for i in prompt] == [275]
    order = [(kind, rids[0]) for kind, rids in tm.events]
    p = order.index(("start", prompt[0].rid))
    for d in decoders:
        # started, produced a token (it is in the running batch), still decoding
        assert order.index(("start", d.rid)) < order.index(("token", d.rid)) < p < order.index(("end", d.rid))
    assert tm.in_flight_at_arrival[-1] == 2


# --- faults -----------------------------------------------------------------------------------
def test_strict_abort_fails_naming_the_class_and_step(fake_tokenizer_manager, tiny_plan_path):
    tm = fake_tokenizer_manager()
    tm.faults[37] = "abort"
    exp = tiny_expansion(tm, tiny_plan_path)
    with pytest.raises(DriverError) as err:
        run(Driver(InProcessTransport(tm, vocab_size=TINY_VOCAB)), exp)
    assert err.value.message == ("warm-up request failed: class extends, step 2 (single: 37 tokens "
                                 "(other)): SGLang aborted the request: injected abort of a 37-token prompt")
    assert err.value.hint == "fix the server or the plan; --lenient warns and goes on"
    assert [len(i.input_ids) for i in tm.items] == [1, 16, 37]  # nothing sent after the failure
    assert tm.flush_requests == []
    rep = err.value.report
    assert rep.ok is False and len(rep.failures) == 1
    assert [(c.shape_class, c.requests, c.failures) for c in rep.classes] == [("extends", 3, 1)]


def test_strict_exception_in_a_concurrent_group(fake_tokenizer_manager, tiny_plan_path):
    tm = fake_tokenizer_manager()
    tm.faults[45] = "error"
    exp = tiny_expansion(tm, tiny_plan_path)
    with pytest.raises(DriverError) as err:
        run(Driver(InProcessTransport(tm, vocab_size=TINY_VOCAB)), exp)
    assert err.value.message == ("warm-up request failed: class concurrent, step 7 (concurrent: 4 at once: "
                                 "19+32+45+58 = 154 tokens): ValueError: injected rejection of a "
                                 "45-token prompt")
    assert err.value.report.classes[-1].failures == 4


def test_strict_hang_past_the_timeout(fake_tokenizer_manager, tiny_plan_path):
    tm = fake_tokenizer_manager()
    tm.faults[16] = "hang"
    exp = tiny_expansion(tm, tiny_plan_path)
    with pytest.raises(DriverError) as err:
        run(Driver(InProcessTransport(tm, timeout_s=0.2, vocab_size=TINY_VOCAB)), exp)
    assert err.value.message == "warm-up request failed: class extends, step 1 (single: 16 tokens (div16)): timed out"
    assert tm.in_flight == 0  # the hung request was cancelled, not left behind


def test_lenient_warns_and_goes_on(fake_tokenizer_manager, tiny_plan_path, caplog):
    tm = fake_tokenizer_manager()
    tm.faults.update({1: "hang", 37: "abort", 45: "error"})
    exp = tiny_expansion(tm, tiny_plan_path)
    with caplog.at_level(logging.WARNING, logger="sglang_warmup.driver"):
        report = run(Driver(InProcessTransport(tm, timeout_s=0.2, vocab_size=TINY_VOCAB), lenient=True), exp)
    failures = [
        "class extends, step 0 (single: 1 tokens (1)): timed out",
        "class extends, step 2 (single: 37 tokens (other)): SGLang aborted the request: injected abort "
        "of a 37-token prompt",
        "class concurrent, step 7 (concurrent: 4 at once: 19+32+45+58 = 154 tokens): ValueError: "
        "injected rejection of a 45-token prompt",
    ]
    assert report.ok is False and report.failures == tuple(failures)
    assert [r.getMessage() for r in caplog.records] == [f"sglang-warmup: {f} (lenient: going on)" for f in failures]
    # every step was still sent, and the flush ran
    assert len(tm.starts()) == len(tm.objs) == 24
    assert report.flush == "flushed on 1 rank(s)"
    by_class = {c.shape_class: c for c in report.classes}
    assert (by_class["extends"].requests, by_class["extends"].failures) == (3, 2)
    assert (by_class["concurrent"].requests, by_class["concurrent"].failures) == (4, 4)
    assert by_class["extends"].errors == tuple(failures[:2])
    assert sum(c.failures for c in report.classes) == 6
    # the failed group's other requests were withdrawn: nothing of step 7 is still running
    # when the first batch (object 11) arrives
    assert [len(i.input_ids) for i in tm.items[11:14]] == [8, 8, 16]
    assert tm.in_flight_at_arrival[11] == 0


def test_flush_failure_on_one_dp_rank_of_two_is_fatal_when_strict(fake_tokenizer_manager, tiny_plan_path,
                                                                   warmup_isolated):
    tm = fake_tokenizer_manager(dp_ranks=2)
    tm.flush_fail_ranks = {1}
    exp = tiny_expansion(tm, tiny_plan_path, only={"extends"})
    with pytest.raises(DriverError) as err:
        run(Driver(InProcessTransport(tm, vocab_size=TINY_VOCAB), state_dir=str(warmup_isolated)), exp)
    assert err.value.message == ("warm-up tiny_plan: cache flush failed: cache flush failed on 1 of 2 "
                                 "rank(s): rank 1: Timed out waiting for idle state.")
    assert err.value.hint.startswith("the server would start with warm-up prefixes in its cache")
    assert err.value.report.ok is False and err.value.report.flush is None
    assert len(tm.flush_requests) == 1
    # the phase says the flush is what was in progress
    assert phase.current(state_dir=str(warmup_isolated)).shape_class == "flush"


def test_flush_failure_when_lenient_is_reported(fake_tokenizer_manager, tiny_plan_path, warmup_isolated):
    tm = fake_tokenizer_manager(dp_ranks=2)
    tm.flush_fail_ranks = {1}
    exp = tiny_expansion(tm, tiny_plan_path, only={"extends"})
    report = run(Driver(InProcessTransport(tm, vocab_size=TINY_VOCAB), lenient=True,
                        state_dir=str(warmup_isolated)), exp)
    assert report.ok is False and report.flush is None
    assert report.failures == ("cache flush failed: cache flush failed on 1 of 2 rank(s): rank 1: "
                               "Timed out waiting for idle state.",)
    assert phase.current(state_dir=str(warmup_isolated)).phase == "serving"


# --- PD disaggregation -----------------------------------------------------------------------------
def test_pd_disaggregation_is_skipped_with_one_log_line(fake_tokenizer_manager, tiny_plan_path, caplog,
                                                        warmup_isolated):
    tm = fake_tokenizer_manager()
    exp = tiny_expansion(tm, tiny_plan_path, disaggregation_mode="prefill")
    with caplog.at_level(logging.DEBUG, logger="sglang_warmup"):
        report = run(Driver(InProcessTransport(tm, vocab_size=TINY_VOCAB), state_dir=str(warmup_isolated)), exp)
    assert [r.getMessage() for r in caplog.records] == [
        "sglang-warmup: PD disaggregation (prefill): warm-up requests would need a bootstrap peer; not warming"]
    assert report.skipped_reason == "PD disaggregation (prefill): warm-up requests would need a bootstrap peer"
    assert report.ok and report.classes == () and report.requests == 0
    assert tm.objs == [] and tm.flush_requests == []
    assert render(report) == ("warm-up tiny_plan: skipped (PD disaggregation (prefill): warm-up requests "
                               "would need a bootstrap peer)")
    assert phase.current(state_dir=str(warmup_isolated)).phase == "serving"


# --- the run report -----------------------------------------------------------------------------
def test_the_run_report_as_json_and_table(fake_tokenizer_manager, tiny_plan_path, tmp_path):
    tm = fake_tokenizer_manager()
    tm.faults[37] = "abort"
    exp = tiny_expansion(tm, tiny_plan_path)
    report = run(Driver(InProcessTransport(tm, vocab_size=TINY_VOCAB), lenient=True), exp)
    d = report.to_dict()
    assert d["plan"] == "tiny_plan" and d["transport"] == "InProcessTransport"
    assert d["expansion_digest"] == exp.digest() and d["requests"] == 28
    assert d["facts"]["chunked_prefill_size"] == 256
    rows = {c["shape_class"]: c for c in d["classes"]}
    assert list(rows) == CLASSES
    ext = rows["extends"]
    assert (ext["phase"], ext["kind"], ext["steps"], ext["requests"], ext["failures"]) == ("prefill", "extend",
                                                                                          3, 3, 1)
    assert ext["total_ms"] > 0 and ext["ms_per_request"] == round(ext["total_ms"] / 3, 2)
    assert ext["max_step_ms"] <= ext["total_ms"]
    assert rows["mixed"]["requests"] == 3 and rows["batched"]["requests"] == 6
    path = tmp_path / "out" / "report.json"
    report.write(path)
    assert json.loads(path.read_text()) == json.loads(json.dumps(d))

    lines = render(report).splitlines()
    assert lines[0].startswith("warm-up tiny_plan: FAILED, 28 requests in ")
    assert lines[0].endswith(" s via InProcessTransport; flush: flushed on 1 rank(s)")
    assert lines[1].split() == ["phase", "class", "requests", "ms", "ms/request", "failed", "compiles", "jit",
                                "disk", "hits", "first/repeat"]
    table_rows = [ln.split() for ln in lines[3:3 + len(CLASSES)]]
    assert [(r[0], r[1], r[2], r[5]) for r in table_rows] == [
        ("prefill", "extends", "3", "1"), ("prefill", "chunked", "1", "0"), ("prefill", "prefix_hits", "3", "0"),
        ("batches", "concurrent", "4", "0"), ("batches", "batched", "6", "0"), ("batches", "mixed", "3", "0"),
        ("decode", "decode", "2", "0"), ("decode", "sampling", "6", "0")]
    assert lines[-1] == ("failure: class extends, step 2 (single: 37 tokens (other)): SGLang aborted the "
                         "request: injected abort of a 37-token prompt")


def test_real_compiles_during_a_step_are_counted_for_its_class(fake_tokenizer_manager, tiny_plan_path,
                                                               warmup_isolated, tmp_path, monkeypatch):
    """The scheduler side is simulated by a real Triton compile (CPU, sm_90) while a request of
    the class ``chunked`` is admitted; the compile-event recorder stamps it with the phase file."""
    import triton
    import triton.language as tl
    from prometheus_client import CollectorRegistry
    from triton.backends.compiler import GPUTarget

    from warmup.observe import events

    @triton.jit
    def warm_add_kernel(x, y, out, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        tl.store(out + offs, tl.load(x + offs, mask=mask) + tl.load(y + offs, mask=mask), mask=mask)

    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton"))
    state = str(warmup_isolated)
    tm = fake_tokenizer_manager(state_dir=state)

    def compile_for_chunked(item):
        if len(item.input_ids) == 275 and not any(i.stream for i in tm.items):
            triton.compile(triton.compiler.ASTSource(
                fn=warm_add_kernel, signature={"x": "*fp32", "y": "*fp32", "out": "*fp32", "n": "i32"},
                constexprs={"BLOCK": 64}), target=GPUTarget("cuda", 90, 32))

    tm.on_admit = compile_for_chunked
    events.uninstall()
    events.install(registry=CollectorRegistry(), state_dir=state)
    try:
        exp = tiny_expansion(tm, tiny_plan_path, only={"extends", "chunked"})
        report = run(Driver(InProcessTransport(tm, vocab_size=TINY_VOCAB), state_dir=state), exp)
    finally:
        events.uninstall()
    by_class = {c.shape_class: c for c in report.classes}
    assert (by_class["chunked"].compiles, by_class["chunked"].kernels) == (1, ("warm_add_kernel",))
    assert by_class["extends"].compiles == 0
    assert report.compiles_by_phase == {"warmup": 1} and report.compiles_total == 1
    assert "compiles by phase: warmup=1" in render(report)


def test_count_compiles_from_manifest_records():
    """The one counting rule the driver (whole manifest) and the sidecar (its own pass) share:
    misses and nvcc builds per phase; per class only the warm-up's; counts are replaced."""
    report = RunReport(plan="p", plan_sha256="", expansion_digest="", transport="t", started_at=0,
                       classes=(ClassReport("a", "ph", "extend", compiles=7),  # from an earlier
                                ClassReport("b", "ph", "batch")))          # count: replaced
    records = [
        {"event": "miss", "phase": "init", "kernel": {"name": "capture_k"}},
        {"event": "miss", "phase": "warmup", "shape_class": "a", "kernel": {"name": "k1"}},
        {"event": "miss", "phase": "warmup", "shape_class": "a", "kernel": {"name": "k1"}},
        {"event": "hit", "phase": "warmup", "shape_class": "a", "kernel": {"name": "k2"}},
        {"event": "jit_build", "outcome": "built", "phase": "warmup", "shape_class": "b",
         "module_name": "sgl_kernel_jit_x"},
        {"event": "jit_build", "outcome": "hit", "phase": "warmup", "shape_class": "b",
         "module_name": "sgl_kernel_jit_y"},
        {"event": "load", "phase": "warmup", "shape_class": "b"},
        {"event": "miss", "phase": "serving", "shape_class": "b", "kernel": {"name": "late"}},
        {"event": "miss", "phase": "warmup", "shape_class": "flush", "kernel": {"name": "f"}},
    ]
    counted = report.with_compiles(records)
    a, b = counted.classes
    assert (a.compiles, a.jit_builds, a.disk_hits, a.kernels) == (2, 0, 1, ("k1",))
    assert (b.compiles, b.jit_builds, b.disk_hits, b.kernels) == (0, 1, 0, ("sgl_kernel_jit_x",))
    assert counted.compiles_by_phase == {"init": 1, "warmup": 4, "serving": 1}
    assert counted.compiles_total == 6
    # the report itself is frozen and unchanged: a copy carries the counts
    assert report.classes[0].compiles == 7 and report.compiles_total == 0
    with pytest.raises(dataclasses.FrozenInstanceError):
        report.ok = False  # type: ignore[misc]


# --- the seams: the second pass's replay, an unreadable compile log ------------------------------
def test_the_replay_driver_is_lenient_repeating_and_records_no_metrics(fake_tokenizer_manager):
    """What the second pass replays with (second_pass.PassDriver.replay): the same transport,
    flush timeout, state directory, progress and readiness; lenient, repeating, no metrics."""
    from typing import Any

    transport = InProcessTransport(fake_tokenizer_manager(), vocab_size=TINY_VOCAB)
    lines: list[str] = []
    metrics: Any = object()  # never called: the replay records none
    driver = Driver(transport, flush_timeout_s=7.0, state_dir="/state", metrics=metrics,
                    progress=lines.append, serving_at_end=False)
    replay = driver.replay()
    assert type(replay) is Driver and replay is not driver
    assert (replay.transport, replay.flush_timeout_s, replay.state_dir, replay.progress,
            replay.serving_at_end) == (transport, 7.0, "/state", lines.append, False)
    assert (replay.lenient, replay.repeat, replay.metrics) == (True, True, None)


def test_an_unreadable_compile_log_leaves_the_compiles_uncounted_with_a_warning(
        fake_tokenizer_manager, tiny_plan_path, warmup_isolated, caplog):
    """The driver narrows what it forgives to the compile log's OSError (a FIFO where a log
    file should be): the report stands without counts, and the log says why."""
    import os

    logs = warmup_isolated / "compile_log"
    logs.mkdir(parents=True, exist_ok=True)
    os.mkfifo(logs / "compiles-1.jsonl")
    tm = fake_tokenizer_manager()
    exp = tiny_expansion(tm, tiny_plan_path, only={"extends"})
    with caplog.at_level(logging.WARNING, logger="sglang_warmup"):
        report = run(Driver(InProcessTransport(tm, vocab_size=TINY_VOCAB),
                            state_dir=str(warmup_isolated), progress=lambda line: None), exp)
    assert report.ok and report.compiles_total == 0
    assert [r.getMessage() for r in caplog.records
            if "compile log" in r.getMessage()] == [
        f"sglang-warmup: compile log not read, compiles not counted: "
        f"[Errno 22] not a regular file (a FIFO): '{logs / 'compiles-1.jsonl'}'"]
