"""The steps record end to end on the fake tokenizer manager: the second-pass check learns which
steps paid a first-time cost (compile-log records stamped with the step, or a first send slower
than its replay), a launch with the record sends only those, and a record of another
expansion or server is not applied."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import json
import logging

import pytest

from cache_tools import compile_log
from warmup.coverage import quiet_steps, second_pass
from warmup.observe import phase
from warmup.plan import facts as facts_mod
from warmup.plan import loader, step_record
from warmup.plan.expand import expand
from warmup.serve import hook
from warmup.serve.driver import Driver
from warmup.serve.report import RunReport
from warmup.serve.transport import InProcessTransport
from warmup.view.text import run_report as render

pytestmark = pytest.mark.usefixtures("warmup_isolated")


def tiny_expansion(tm, plan_path, **fact_changes):
    """The tiny plan against the facts the registered warm-up reads from ``tm``."""
    facts = asyncio.run(facts_mod.from_tokenizer_manager(tm))
    return expand(loader.load(plan_path), dataclasses.replace(facts, **fact_changes))


def compiling(tm, state: str, cached: frozenset[int] = frozenset()) -> None:
    """Make the fake server write a compile-log miss, stamped with the step in flight, the
    first time it meets a prompt length (the way a kernel specializes on a new size); a disk
    hit for the lengths in ``cached`` (a server on a restored cache)."""
    writer = compile_log.Writer(compile_log.directory(state))
    seen: set[int] = set()

    def admit(item) -> None:
        n = len(item.input_ids)
        if n in seen:
            return
        seen.add(n)
        now = phase.current(state_dir=state)
        event = compile_log.HIT if n in cached else compile_log.MISS
        rec = compile_log.record(event, phase=now.phase, shape_class=now.shape_class,
                                 request=now.request, compiler="triton")
        writer.write(dict(rec, kernel=f"k{n}"))

    tm.on_admit = admit


def lengths(exp) -> set[int]:
    return {r.input_len for s in exp.steps for r in (*s.requests, *s.background)}


def learned(tm, exp, state: str) -> step_record.StepRecord:
    driver = Driver(InProcessTransport(tm, vocab_size=exp.facts.vocab_size), state_dir=state,
                    serving_at_end=False, progress=lambda line: None)
    asyncio.run(second_pass.run(driver, exp, second_pass=True, state_dir=state))
    return step_record.read(f"{state}/{step_record.STATE_FILE}")


def test_the_second_pass_learns_the_loud_steps_and_a_launch_sends_only_those(
        fake_tokenizer_manager, tiny_plan_path, warmup_isolated, monkeypatch):
    state = str(warmup_isolated)
    tm = fake_tokenizer_manager(state_dir=state)
    compiling(tm, state)
    exp = tiny_expansion(tm, tiny_plan_path)
    # the records decide here: a busy test machine's timing makes no step loud
    monkeypatch.setattr(quiet_steps, "learn", functools.partial(quiet_steps.learn, min_ms=1e6))
    record = learned(tm, exp, state)

    # a step is loud where the first pass met a new prompt length; the sampling steps send
    # the same 21-token prompt six times: the first compiled, the other five are quiet
    lengths: set[int] = set()
    loud = set()
    for s in exp.steps:
        sizes = {r.input_len for r in (*s.background, *s.requests)}
        if sizes - lengths:
            loud.add(s.index)
        lengths |= sizes
    assert set(record.keep) == loud and 13 not in loud and record.quiet > 0
    assert (record.steps, record.quiet) == (len(exp.steps), len(exp.steps) - len(loud))
    assert record.expansion_digest == exp.digest() and record.mismatch(exp) is None
    assert [e.index for e in record.evidence] == [s.index for s in exp.steps]
    assert all((e.events > 0) == (e.index in loud) for e in record.evidence)

    # the next launch on that cache: only the loud steps reach the server
    monkeypatch.setenv("WARMUP_STEPS", f"{state}/{step_record.STATE_FILE}")
    skip, note, warning = hook.quiet_steps(exp)
    assert skip == frozenset(s.index for s in exp.steps) - loud and warning == ""
    tm2 = fake_tokenizer_manager(state_dir=state)
    driver = Driver(InProcessTransport(tm2, vocab_size=exp.facts.vocab_size), state_dir=state,
                    skip_steps=skip, steps_note=note)
    report = asyncio.run(driver.run(exp))
    assert {i.phase.request for i in tm2.items} == loud
    assert report.quiet_steps == len(skip) and [i for i, _ in report.step_ms] == sorted(loud)
    assert f"not sent: {len(skip)} steps quiet when the cache was baked ({note})" in render(report)
    back = RunReport.from_json(json.loads(json.dumps(report.to_dict())))
    assert (back.quiet_steps, back.steps_record, [i for i, _ in back.step_ms]) == \
        (report.quiet_steps, note, sorted(loud))


def test_a_run_that_left_steps_out_learns_nothing(fake_tokenizer_manager, tiny_plan_path,
                                                   warmup_isolated):
    """Learned from a trimmed first pass, a record would call the steps it never sent quiet."""
    state = str(warmup_isolated)
    tm = fake_tokenizer_manager(state_dir=state)
    exp = tiny_expansion(tm, tiny_plan_path)
    driver = Driver(InProcessTransport(tm, vocab_size=exp.facts.vocab_size), state_dir=state,
                    skip_steps=frozenset({12, 13}), progress=lambda line: None)
    asyncio.run(second_pass.run(driver, exp, second_pass=True, state_dir=state))
    assert not (warmup_isolated / step_record.STATE_FILE).exists()


def _report(exp, ms: dict[int, float]) -> RunReport:
    return RunReport(plan=exp.plan, plan_sha256="", expansion_digest=exp.digest(),
                     transport="t", started_at=0.0, step_ms=tuple(ms.items()))


def test_timing_failures_and_prefixes_make_a_step_loud(fake_tokenizer_manager, tiny_plan_path):
    exp = tiny_expansion(fake_tokenizer_manager(), tiny_plan_path)
    steady = {s.index: 50.0 for s in exp.steps}
    first = dict(steady)
    first[1] = 61.0            # 1.22x and 11 ms more: loud
    first[2] = 59.0            # 1.18x: quiet
    first[3] = 54.9            # under 5 ms more: quiet
    del first[12]              # failed in the first pass: loud
    replay = dict(steady)
    del replay[14]             # failed in the replay: loud
    first[6] = 200.0           # a prefix extend: loud, and its base (step 4) with it
    record = quiet_steps.learn(exp, _report(exp, first), [], _report(exp, replay))
    assert record.keep == (1, 4, 6, 12, 14)
    # a replay far slower than the first send: a step that hits a prefix met a colder cache
    # there (its timing tells nothing: loud); any other step is only slow on the replay
    assert quiet_steps.hitting(exp) == {5, 6}
    replay[5] = replay[0] = 120.0
    record = quiet_steps.learn(exp, _report(exp, first), [], _report(exp, replay))
    assert record.keep == (1, 4, 5, 6, 12, 14)
    # a record of other steps (a record stamped with a step of another class) counts nothing
    other = compile_log.record(compile_log.MISS, phase="warmup", shape_class="sampling",
                               request=0, compiler="triton")
    sweep = compile_log.record(compile_log.GEMM_SWEEP, phase="warmup", shape_class="extends",
                               request=0, compiler="cublas")
    record = quiet_steps.learn(exp, _report(exp, steady), [other, sweep], _report(exp, steady))
    assert record.keep == ()


def test_a_record_of_another_expansion_or_server_is_not_applied(
        fake_tokenizer_manager, tiny_plan_path, tmp_path, monkeypatch, caplog):
    tm = fake_tokenizer_manager()
    exp = tiny_expansion(tm, tiny_plan_path)
    record = quiet_steps.learn(exp, _report(exp, {}), [], _report(exp, {}))
    path = tmp_path / "a.tar.steps.json"
    dataclasses.replace(record, keep=(0,)).write(path)
    monkeypatch.setenv("WARMUP_STEPS", str(path))
    assert len(hook.quiet_steps(exp)[0]) == len(exp.steps) - 1

    # another chunk size: other steps
    other = tiny_expansion(tm, tiny_plan_path, chunked_prefill_size=512)
    with caplog.at_level(logging.WARNING, logger="sglang_warmup.hook"):
        skip, note, warning = hook.quiet_steps(other)
    assert (skip, note) == (frozenset(), "")
    assert warning.startswith(f"steps record {path} does not apply: it was learned on another "
                              f"expansion (plan tiny_plan, {len(exp.steps)} steps, digest ")
    assert warning.endswith("; every step sent") and warning in caplog.text
    # the same steps on another SGLang
    later = dataclasses.replace(exp, facts=dataclasses.replace(exp.facts, sglang_version="9.9"))
    assert "whose sglang_version was" in hook.quiet_steps(later)[2]
    # the KV pool, the request cap and the longest prompt it implies (where the pool is
    # shorter than the context) move from start to start: not compared
    moved = dataclasses.replace(exp, facts=dataclasses.replace(
        exp.facts, max_total_tokens=exp.facts.max_total_tokens - 256,
        max_req_input_len=exp.facts.max_req_input_len - 256,
        max_running_requests=exp.facts.max_running_requests - 1))
    assert hook.quiet_steps(moved)[2] == ""
    # another GPU
    assert dataclasses.replace(record, device="NVIDIA H100").mismatch(exp, "NVIDIA H200") == \
        "it was learned on a NVIDIA H100, this server runs on a NVIDIA H200"
    assert dataclasses.replace(record, device="NVIDIA H100").mismatch(exp, "") is None
    # another version of the plan file that sends the same requests: the record stands; one
    # that keeps a sampling name and changes a parameter behind it: another expansion
    assert dataclasses.replace(record, plan_sha256="a" * 64).mismatch(
        dataclasses.replace(exp, plan_sha256="b" * 64)) is None
    first = exp.steps[0]
    penalized = dataclasses.replace(first, requests=tuple(
        dataclasses.replace(r, sampling_params=(*r.sampling_params, ("repetition_penalty", 1.3)))
        for r in first.requests))
    edited = dataclasses.replace(exp, steps=(penalized, *exp.steps[1:]))
    assert edited.digest() != exp.digest()
    assert record.mismatch(edited).startswith("it was learned on another expansion (plan tiny_plan")
    # other server arguments
    args = {"attention_backend": "1", "dtype": "2", "page_size": "3", "quantization": "4"}
    learned_on = dataclasses.replace(record, server_args=args)
    assert learned_on.mismatch(dataclasses.replace(exp, server_args=args)) is None
    assert learned_on.mismatch(dataclasses.replace(exp, server_args={**args, "dtype": "9"})) \
        == "it was learned on a server launched with other dtype"
    assert learned_on.mismatch(dataclasses.replace(exp, server_args={
        k: "0" for k in args})) == ("it was learned on a server launched with other "
                                    "attention_backend, dtype, page_size and 1 more")
    assert learned_on.mismatch(exp) is None     # arguments not known here: the facts decide
    # a bug of ours while reading: a warning, every step, never a failed launch
    monkeypatch.setattr(step_record, "read", lambda p: 1 / 0)
    with caplog.at_level(logging.ERROR, logger="sglang_warmup.hook"):
        assert hook.quiet_steps(exp) == (frozenset(), "", f"{path}: reading the steps record "
                                         "failed (ZeroDivisionError): every step sent")
    monkeypatch.undo()
    monkeypatch.setenv("WARMUP_STEPS", str(path))
    # a damaged file: a warning, every step
    path.write_text("{")
    skip, note, warning = hook.quiet_steps(exp)
    assert skip == frozenset() and warning.startswith(f"{path}: not JSON")


@pytest.mark.parametrize("wrong", [False, True])
def test_a_second_pass_over_a_trimmed_warm_up_checks_the_record(
        fake_tokenizer_manager, tiny_plan_path, warmup_isolated, wrong):
    """``serve --steps --second-pass``: the first replay sends the loud steps, the second the
    whole plan; a step the record wrongly called quiet compiles in the second and leaves its
    class open, a right record leaves the plan closed."""
    state = str(warmup_isolated)
    tm = fake_tokenizer_manager(state_dir=state)
    compiling(tm, state)
    exp = tiny_expansion(tm, tiny_plan_path)
    record = learned(tm, exp, state)
    keep = set(record.keep) - ({0} if wrong else set())
    skip = frozenset(s.index for s in exp.steps if s.index not in keep)

    fresh = fake_tokenizer_manager(state_dir=state)     # a new server on the same caches
    compiling(fresh, state, cached=frozenset(lengths(exp)))
    driver = Driver(InProcessTransport(fresh, vocab_size=exp.facts.vocab_size), state_dir=state,
                    serving_at_end=False, progress=lambda line: None, skip_steps=skip)
    result = asyncio.run(second_pass.run(driver, exp, second_pass=True, state_dir=state))
    assert result.run.quiet_steps == len(skip)
    assert result.coverage is not None
    open_classes = {c.shape_class for c in result.coverage.classes if not c.closed}
    assert open_classes == ({exp.steps[0].shape_class} if wrong else set())


def test_a_bug_while_learning_never_fails_the_warm_up(fake_tokenizer_manager, tiny_plan_path,
                                                      warmup_isolated, monkeypatch, caplog):
    state = str(warmup_isolated)
    tm = fake_tokenizer_manager(state_dir=state)
    compiling(tm, state)
    exp = tiny_expansion(tm, tiny_plan_path)
    monkeypatch.setattr(quiet_steps, "learn", lambda *a, **k: {}["boom"])
    driver = Driver(InProcessTransport(tm, vocab_size=exp.facts.vocab_size), state_dir=state,
                    serving_at_end=False, progress=lambda line: None)
    with caplog.at_level(logging.ERROR, logger="sglang_warmup.coverage"):
        result = asyncio.run(second_pass.run(driver, exp, second_pass=True, state_dir=state))
    assert result.coverage is not None and result.run.ok
    assert not (warmup_isolated / step_record.STATE_FILE).exists()
    assert "learning the steps record failed; none written" in caplog.text


def test_a_record_on_a_cache_it_was_not_learned_on_sends_the_rest_of_the_plan(
        fake_tokenizer_manager, tiny_plan_path, warmup_isolated, caplog):
    """The record matches the launch, but the cache is cold (a volume over the baked one, a
    pull that failed): the steps it keeps compile what a restored cache would have loaded, so
    the quiet steps are sent after them, before ready."""
    state = str(warmup_isolated)
    tm = fake_tokenizer_manager(state_dir=state)
    compiling(tm, state)
    exp = tiny_expansion(tm, tiny_plan_path)
    record = learned(tm, exp, state)
    skip = record.skip(exp)
    for cached, sent in ((frozenset(lengths(exp)), set(record.keep)),      # restored: trimmed
                         (frozenset(), {s.index for s in exp.steps})):      # cold: everything
        cold = fake_tokenizer_manager(state_dir=state)
        compiling(cold, state, cached=cached)
        driver = Driver(InProcessTransport(cold, vocab_size=exp.facts.vocab_size),
                        state_dir=state, skip_steps=skip, steps_note="r.json: 5 of 20 quiet",
                        progress=lambda line: None)
        with caplog.at_level(logging.WARNING, logger="sglang_warmup.driver"):
            report = asyncio.run(driver.run(exp))
        assert {i.phase.request for i in cold.items} == sent
        assert {i for i, _ in report.step_ms} == sent
    assert report.quiet_steps == 0 and report.ok
    assert report.steps_record == "r.json: 5 of 20 quiet (not applied)"
    assert report.warnings[-1].startswith("r.json: 5 of 20 quiet: not applied: the steps sent "
                                          "compiled ")
    assert report.warnings[-1].endswith(f"the {len(skip)} quiet steps sent after them")
    assert report.warnings[-1] in caplog.text


def test_a_warm_up_that_sent_the_quiet_steps_late_learns_no_record(
        fake_tokenizer_manager, tiny_plan_path, tmp_path):
    """Sent out of order (the loud steps, then the quiet ones), a first pass is not the plan a
    record describes: the second-pass check learns nothing from it."""
    bake, launch = str(tmp_path / "bake"), str(tmp_path / "launch")
    tm = fake_tokenizer_manager(state_dir=bake)
    compiling(tm, bake)
    exp = tiny_expansion(tm, tiny_plan_path)
    record = learned(tm, exp, bake)
    cold = fake_tokenizer_manager(state_dir=launch)
    compiling(cold, launch)
    driver = Driver(InProcessTransport(cold, vocab_size=exp.facts.vocab_size), state_dir=launch,
                    serving_at_end=False, skip_steps=record.skip(exp), steps_note="r.json",
                    progress=lambda line: None)
    result = asyncio.run(second_pass.run(driver, exp, second_pass=True, state_dir=launch))
    assert result.run.quiet_steps == 0 and result.run.steps_record == "r.json (not applied)"
    assert result.coverage is not None
    assert not (tmp_path / "launch" / step_record.STATE_FILE).exists()


def _sweep(**changes):
    return {"pid": 7, "max_rows": 4096, "rows_reached": 4096, "blas": "H100 sm_90, torch 2.11.0",
            "learned": 0, "stopped_by_budget": False, "load_rows": {"a": [1, 9], "b": []},
            **changes}


def test_the_record_keeps_the_load_rows_of_the_sweeps_up_to_where_they_all_reached(
        fake_tokenizer_manager, tiny_plan_path):
    """Every scheduler's load rows together, per shape, up to the row count the shortest sweep
    reached; none (a later start sweeps whole) where a sweep ran learned rows, or the
    schedulers disagree on the GPU, libraries or row limit."""
    exp = tiny_expansion(fake_tokenizer_manager(), tiny_plan_path)
    steady = {s.index: 50.0 for s in exp.steps}
    first = dataclasses.replace(_report(exp, steady), gemm_sweeps=(
        _sweep(), _sweep(pid=8, load_rows={"a": [9, 17], "c": [3]})))
    record = quiet_steps.learn(exp, first, [], _report(exp, steady))
    assert record.gemm == step_record.GemmRows("H100 sm_90, torch 2.11.0", 4096, 4096,
                                               {"a": (1, 9, 17), "b": (), "c": (3,)})
    assert step_record.from_json(record.to_json()) == record
    cut = step_record.gemm_rows([_sweep(load_rows={"a": [1, 9, 17, 4000]}),
                                 _sweep(rows_reached=16, stopped_by_budget=True)])
    assert (cut.reached, cut.rows) == (16, {"a": (1, 9), "b": ()})  # one budget stopped at 16
    for bad in [_sweep(learned=2), _sweep(max_rows=8192), _sweep(rows_reached=0),
                _sweep(blas="H200 sm_90, torch 2.11.0"), _sweep(load_rows=None), _sweep(blas="")]:
        assert step_record.gemm_rows([_sweep(), bad]) is None, bad
    assert step_record.gemm_rows([]) is None
    assert quiet_steps.learn(exp, _report(exp, steady), [], _report(exp, steady)).gemm is None


def test_a_step_that_compiled_in_the_baking_start_is_kept(fake_tokenizer_manager,
                                                            tiny_plan_path):
    """The start that baked the caches compiled a kernel at step 3, the learning start loaded
    it first at step 1 (a step that batches by timing): step 3 ran quiet there, yet a launch
    whose step 1 batches otherwise meets the kernel at step 3, or after ready.  Kept; what the
    caches do not keep (Dynamo's traces), other phases and other steps' records are not."""
    exp = tiny_expansion(fake_tokenizer_manager(), tiny_plan_path)
    steady = {s.index: 50.0 for s in exp.steps}
    cls = {s.index: s.shape_class for s in exp.steps}

    def rec(event, index, **more):
        return compile_log.record(event, phase=more.pop("phase", "warmup"),
                                  shape_class=more.pop("shape_class", cls[index]),
                                  request=index, compiler=more.pop("compiler", "triton"))

    learning = [rec(compile_log.HIT, 1)]
    baked = [rec(compile_log.MISS, 3), rec(compile_log.MISS, 7, compiler="dynamo"),
             rec(compile_log.MISS, 8, phase="init"), rec(compile_log.HIT, 9),
             rec(compile_log.MISS, 10, shape_class="other"),
             dict(compile_log.record(compile_log.JIT_BUILD, phase="warmup", shape_class=cls[11],
                                     request=11, compiler="deep_gemm"), outcome=compile_log.BUILT)]
    record = quiet_steps.learn(exp, _report(exp, steady), learning, _report(exp, steady),
                               baked=baked)
    assert record.keep == tuple(sorted(step_record.prefix_closure(exp, {1, 3, 11})))
    assert record.baked == 2 and step_record.from_json(record.to_json()).baked == 2
    assert {e.index: e.events for e in record.evidence if e.events} == {1: 1, 3: 1, 11: 1}
    # without the baking start's records, step 3 and 11 are quiet
    alone = quiet_steps.learn(exp, _report(exp, steady), learning, _report(exp, steady))
    assert 3 not in alone.keep and 11 not in alone.keep and alone.baked is None
    assert "baked" not in alone.to_json()


def test_the_learning_start_reads_the_baking_starts_records_of_its_own_expansion(
        fake_tokenizer_manager, tiny_plan_path, tmp_path, monkeypatch, caplog):
    exp = tiny_expansion(fake_tokenizer_manager(), tiny_plan_path)
    baked = tmp_path / "state"
    writer = compile_log.Writer(compile_log.directory(str(baked)))
    miss = compile_log.record(compile_log.MISS, phase="warmup", shape_class=exp.steps[2].shape_class,
                              request=2, compiler="triton")
    writer.write(miss)
    writer.close()
    assert second_pass._baked_records(exp) is None        # not set: nothing read
    monkeypatch.setenv("WARMUP_BAKED_STATE", str(baked))
    with caplog.at_level(logging.WARNING, logger="sglang_warmup.coverage"):
        assert second_pass._baked_records(exp) is None    # no run report there
    assert f"the baking start's records ({baked}) are not used for the steps record: " \
           "cannot read" in caplog.text
    (baked / "report.json").write_text(json.dumps({"expansion_digest": "0" * 16}))
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="sglang_warmup.coverage"):
        assert second_pass._baked_records(exp) is None    # another expansion's step indices
    assert f"its run report names expansion '{'0' * 16}', this start's is {exp.digest()}" \
        in caplog.text
    (baked / "report.json").write_text(json.dumps({"expansion_digest": exp.digest()}))
    got = second_pass._baked_records(exp)
    assert [(r["event"], r["request"]) for r in got] == [(compile_log.MISS, 2)]
    (baked / "report.json").write_text("[1, 2]")        # JSON, not a report
    assert second_pass._baked_records(exp) is None


def test_the_digest_takes_a_numpy_scalar_as_its_number(fake_tokenizer_manager, tiny_plan_path):
    """A model's generation config may hand a numpy scalar: the digest reads it as the number
    (the same digest as the plain float), and an object it cannot read as a number makes a
    digest of its own."""
    import numpy as np

    exp = tiny_expansion(fake_tokenizer_manager(), tiny_plan_path)
    first = exp.steps[0]

    def with_temperature(value):
        reqs = tuple(dataclasses.replace(r, sampling_params=(("temperature", value),))
                     for r in first.requests)
        return dataclasses.replace(exp, steps=(dataclasses.replace(first, requests=reqs),
                                               *exp.steps[1:])).digest()

    assert with_temperature(np.float64(0.7)) == with_temperature(0.7) != with_temperature(0.8)
    assert with_temperature(object()) != with_temperature(object())
