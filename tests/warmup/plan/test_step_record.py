"""warmup.plan.step_record: a steps record is data.  Every damaged or hostile file is refused in
one line naming the file and the field, bounded before it is read; ``serve --steps`` refuses a
bad one before anything starts and passes a good one to the server."""

from __future__ import annotations

import json
import os
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from warmup.cli import main
from warmup.errors import StepsError, shown
from warmup.plan import step_record
from warmup.serve import launch

GOOD = {"format": "sglang-warmup-steps", "version": 2, "plan": "p", "plan_sha256": "ab",
        "expansion_digest": "0123456789abcdef", "steps": 4, "keep": [2, 0], "ratio": 1.2,
        "min_ms": 5.0, "facts": {"chunked_prefill_size": 8192, "decode_graph_bs": [1, 2],
                                 "default_sampling_params": {"temperature": 1.0}},
        "device": "NVIDIA H200", "learned_at": 1796300000.5,
        "evidence": [[0, 80.1, 50.0, 2], [1, 50.0, 49.0, 0], [2, None, 40.0, 0],
                     [3, 30.0, None, 0]],
        "server_args": {"attention_backend": "5f0c9e1d2a3b", "dtype": "0a1b2c3d4e5f"}}


def test_a_record_reads_back_as_written(tmp_path):
    record = step_record.from_json(GOOD)
    assert record.keep == (0, 2) and record.quiet == 2 and record.device == "NVIDIA H200"
    path = tmp_path / "r.json"
    record.write(path)
    assert step_record.read(path) == record
    assert json.loads(path.read_text())["keep"] == [0, 2]


def test_a_record_of_the_earlier_version_is_read_and_never_applied():
    """Version 1 digested each request's sampling family by name: such a record is a record
    (a launch that names it starts), and says why it does not apply."""
    old = step_record.from_json(_with(version=1))
    assert old.version == 1 and step_record.from_json(GOOD).version == 2
    assert old.mismatch(None) == (  # type: ignore[arg-type]  # decided before the expansion
        "it was learned by an earlier release (record version 1, whose digest named each "
        "request's sampling family, not its parameters): bake again to send only the loud steps")
    assert old.to_json()["version"] == 1  # written back as it was read


def _with(**changes):
    return {**GOOD, **changes}


def _without(name):
    return {k: v for k, v in GOOD.items() if k != name}


#: 10**400 as a refusal shows it: JSON allows integers no float holds (math.isfinite raises).
SHOWN_BIG = shown(10**400)

# (document, the refusal's message after "FILE: ")
CORPUS = [
    ([], "a steps record is a JSON object"),
    (_with(format="sglang-warmup-run"), "format: expected 'sglang-warmup-steps', not "
                                        "'sglang-warmup-run'"),
    (_with(version=3), "version: expected one of 1, 2, not 3"),
    (_with(version=True), "version: expected one of 1, 2, not True"),
    (_with(baked=-1), "baked: expected an integer from 0 to 10,000,000, not -1"),
    (_with(baked=True), "baked: expected an integer from 0 to 10,000,000, not True"),
    (_without("steps"), "steps: expected an integer from 0 to 100,000, not None"),
    (_with(steps=10**9), "steps: expected an integer from 0 to 100,000, not 1000000000"),
    (_with(steps=True), "steps: expected an integer from 0 to 100,000, not True"),
    (_with(keep="0,2"), "keep: expected a list of at most 4 step indices"),
    (_with(keep=[0, 1, 2, 3, 3]), "keep: expected a list of at most 4 step indices"),
    (_with(keep=[0, 4]), "keep[1]: expected a step index from 0 to 3, not 4"),
    (_with(keep=[-1]), "keep[0]: expected a step index from 0 to 3, not -1"),
    (_with(keep=[1.0]), "keep[0]: expected a step index from 0 to 3, not 1.0"),
    (_with(keep=[1, 1]), "keep: a step index is listed twice"),
    (_with(ratio=float("nan")), "ratio: expected a number from 1 to 1000, not nan"),
    (_with(ratio="1.2"), "ratio: expected a number from 1 to 1000, not '1.2'"),
    (_with(min_ms=-1), "min_ms: expected a number from 0 to 1e+06, not -1"),
    (_with(plan=None), "plan: expected a text, not None"),
    (_with(plan="x" * 5000), "plan: expected a text, not 'xxxxxxxxxxxxxxx...xxxxxxxxxxxxxxxx'"),
    (_with(expansion_digest=7), "expansion_digest: expected a text, not 7"),
    (_with(facts=[]), "facts: expected an object of at most 256 server facts"),
    (_with(facts={"tp_size": {"a": [1]}}), "facts.'tp_size': expected a value, a list or an "
                                           "object of values"),
    (_with(device=["H200"]), "device: expected a text, not ['H200']"),
    (_with(learned_at=float("inf")), "learned_at: expected a number from 0 to 1e+11, not inf"),
    (_with(ratio=10**400), "ratio: expected a number from 1 to 1000, not " + SHOWN_BIG),
    (_with(learned_at=-10**400), "learned_at: expected a number from 0 to 1e+11, not "
                                 + shown(-10**400)),
    (_with(evidence=[[0, 10**400, 1.0, 0]]), "evidence[0]: expected [index, first_ms, "
                                             "replay_ms, events], not "
                                             + shown([0, 10**400, 1.0, 0])),
    (_with(evidence={}), "evidence: expected a list of at most 4 steps"),
    (_with(server_args={"dtype": 1}), "server_args: expected an object of at most 4096 "
                                      "argument names and their hashes"),
    (_with(server_args=["dtype"]), "server_args: expected an object of at most 4096 "
                                   "argument names and their hashes"),
    (_with(evidence=[[0, 1.0, 1.0]]), "evidence[0]: expected [index, first_ms, replay_ms, "
                                      "events], not [0, 1.0, 1.0]"),
    (_with(evidence=[[9, 1.0, 1.0, 0]]), "evidence[0]: expected [index, first_ms, replay_ms, "
                                         "events], not [9, 1.0, 1.0, 0]"),
    (_with(evidence=[[0, -5, 1.0, 0]]), "evidence[0]: expected [index, first_ms, replay_ms, "
                                        "events], not [0, -5, 1.0, 0]"),
    (_with(evidence=[[0, 1.0, 1.0, -1]]), "evidence[0]: expected [index, first_ms, replay_ms, "
                                          "events], not [0, 1.0, 1.0, -1]"),
    (_with(gemm=[]), "gemm: expected an object, not []"),
    (_with(gemm={"blas": "b", "max_rows": 8, "reached": 8}), "gemm.rows: expected an object of "
                                                             "at most 1024 shapes"),
    (_with(gemm={"blas": "b", "max_rows": 8, "reached": 8, "rows": {"k": [0]}}),
     "gemm.rows.'k': expected a list of at most 65,536 row counts from 1 to 16,777,216"),
    (_with(gemm={"blas": "b", "max_rows": 8, "reached": 8, "rows": {"k": [True]}}),
     "gemm.rows.'k': expected a list of at most 65,536 row counts from 1 to 16,777,216"),
    (_with(gemm={"blas": "b", "max_rows": 8, "reached": 8,
                      "rows": {"k": list(range(1, 70_000))}}),
     "gemm.rows.'k': expected a list of at most 65,536 row counts from 1 to 16,777,216"),
    (_with(gemm={"blas": "b", "max_rows": 8, "reached": 8, "rows": {"k" * 301: []}}),
     "gemm.rows: a shape key of 301 characters (limit 300): 'kkkkkkkkkkkkkkk...kkkkkkkkkkkkkkkk'"),
    (_with(gemm={"blas": 3, "max_rows": 8, "reached": 8, "rows": {}}),
     "gemm.blas: expected a text, not 3"),
    (_with(gemm={"blas": "b", "max_rows": 0, "reached": 8, "rows": {}}),
     "gemm.max_rows: expected an integer from 1 to 16,777,216, not 0"),
    (_with(gemm={"blas": "b", "max_rows": 8, "reached": 9, "rows": {}}),
     "gemm.reached: expected an integer from 1 to 8, not 9"),
    (_with(gemm={"blas": "b", "max_rows": 8, "rows": {}}),
     "gemm.reached: expected an integer from 1 to 8, not None"),
]


def test_two_starts_rows_are_merged_up_to_where_both_reached():
    """A shape one start names past where the other's sweep stopped is known there from one
    start only, which may have failed it or run out of budget: those rows are left to the
    launch's whole sweep above the smaller reach."""
    learn = step_record.GemmRows("H100", 8192, 8192, {"a": (1, 9, 4000), "x": (1, 5, 600)})
    cold = step_record.GemmRows("H100", 8192, 512, {"a": (9, 17), "y": (3,)})
    assert learn.merged(cold) == step_record.GemmRows(
        "H100", 8192, 512, {"a": (1, 9, 17), "x": (1, 5), "y": (3,)})
    assert learn.merged(step_record.GemmRows("H200", 8192, 8192, {})) == learn
    assert learn.merged(None) == learn


def _sweep(**changes):
    return {"blas": "H100", "max_rows": 4096, "rows_reached": 4096, "learned": 0,
            "load_rows": {"a": [1, 9]}, **changes}


@pytest.mark.parametrize("sweeps,rows", [
    ([_sweep(blas=["H100"])], None),                          # unhashable: refused, no error
    ([_sweep(), _sweep(max_rows={"x": 1})], None),
    ([_sweep(rows_reached=True)], None),
    ([_sweep(load_rows={"a": [1, 9], "b": "?"})], {"a": (1, 9)}),   # not a list: swept whole
    ([_sweep(load_rows={"a": [1], "k" * 301: [2]})], {"a": (1,)}),  # no record could hold it
    ([_sweep(load_rows={"a": [1, "2", 2.0, -3, 9999]})], {"a": (1,)}),
    ([_sweep(load_rows={str(i): [] for i in range(1025)})], None),
])
def test_the_rows_a_start_learned_are_what_a_record_can_hold(sweeps, rows):
    got = step_record.gemm_rows(sweeps)
    assert (got.rows if got is not None else None) == rows
    if got is not None:
        assert step_record.from_json(_with(gemm=got.to_json())).gemm == got


def test_the_gemm_load_rows_read_back_sorted_and_unique(tmp_path):
    doc = _with(gemm={"blas": "H100 sm_90", "max_rows": 4096, "reached": 2048,
                      "rows": {"linear 64x32 torch.bfloat16 False M": [9, 1, 9, 72], "b": []}})
    record = step_record.from_json(doc)
    assert record.gemm == step_record.GemmRows("H100 sm_90", 4096, 2048, {
        "linear 64x32 torch.bfloat16 False M": (1, 9, 72), "b": ()})
    record.write(tmp_path / "r.json")
    assert step_record.read(tmp_path / "r.json") == record
    assert step_record.from_json(GOOD).gemm is None          # a record of before: none


@pytest.mark.parametrize("doc,message", CORPUS)
def test_every_damaged_field_is_named(tmp_path, doc, message):
    path = tmp_path / "r.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(StepsError) as err:
        step_record.read(path)
    assert err.value.message == f"{path}: {message}"
    assert "\n" not in err.value.message and err.value.hint


def test_files_that_hold_no_record_are_refused_in_one_line(tmp_path):
    cases = {"not-json": (b"{", "not JSON: "),
             "latin1": (b'{"plan": "\xe9"}', "not UTF-8 JSON: invalid continuation byte at byte 10"),
             "deep": (b"[" * 100_000 + b"]" * 100_000, "not JSON: nested too deeply"),
             "huge-int": (b'{"steps": ' + b"9" * 5000 + b"}", "not JSON: ")}
    for name, (data, message) in cases.items():
        path = tmp_path / name
        path.write_bytes(data)
        with pytest.raises(StepsError) as err:
            step_record.read(path)
        assert err.value.message.startswith(f"{path}: {message}"), name
        assert "\n" not in err.value.message
    with pytest.raises(StepsError) as err:
        step_record.read(tmp_path / "missing.json")
    assert err.value.message == (f"{tmp_path}/missing.json: cannot read: "
                                 "No such file or directory")
    with pytest.raises(StepsError) as err:
        step_record.read(tmp_path)
    assert err.value.message.startswith(f"{tmp_path}: cannot read: ")


def test_a_huge_file_is_refused_before_it_is_read(tmp_path, monkeypatch):
    path = tmp_path / "big.json"
    with open(path, "wb") as f:
        f.truncate(step_record.MAX_FILE_BYTES + 1)  # sparse: nothing to read if it tried
    reads = []
    real = os.read
    monkeypatch.setattr(os, "read", lambda fd, n: reads.append(n) or real(fd, n))
    with pytest.raises(StepsError) as err:
        step_record.read(path)
    assert err.value.message == f"{path}: file is 8,388,609 bytes (limit 8,388,608)"
    assert reads == []


JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
                    lambda inner: st.lists(inner, max_size=4)
                    | st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=20)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(st.sampled_from(sorted({*GOOD, "gemm"})), JSON, max_size=len(GOOD)),
       st.data())
def test_any_document_is_a_record_or_one_refusal(changes, data):
    """Any mix of valid and arbitrary fields: a StepRecord whose keep indices are steps, or a
    StepsError of one line; never another exception."""
    doc = {**GOOD, **changes}
    if data.draw(st.booleans()):
        doc.pop(data.draw(st.sampled_from(sorted(GOOD))), None)
    try:
        record = step_record.from_json(doc)
    except StepsError as exc:
        assert "\n" not in exc.message
        return
    assert all(0 <= k < record.steps for k in record.keep)
    assert len(set(record.keep)) == len(record.keep) <= record.steps


# --- serve --steps ------------------------------------------------------------------------------
def test_serve_refuses_a_bad_record_before_anything_starts(tiny_plan_path, tmp_path, monkeypatch,
                                                           capsys):
    monkeypatch.setattr(launch, "exec_launch", lambda spec: pytest.fail("SGLang started"))
    bad = tmp_path / "a.tar.steps.json"
    bad.write_text(json.dumps(_with(keep=[7])))
    with pytest.raises(SystemExit) as exc:
        main(["serve", "--plan", str(tiny_plan_path), "--state-dir", str(tmp_path / "st"),
              "--steps", str(bad), "--", "--model-path", "/models/m"])
    assert exc.value.code == 2
    err = capsys.readouterr().err.splitlines()
    assert err[0] == f"error: {bad}: keep[0]: expected a step index from 0 to 3, not 7"
    assert err[1].startswith("hint: learn it again: `sglang-warmup prebake` writes")
    assert not (tmp_path / "st").exists()


def test_serve_hands_a_good_record_to_the_server(tiny_plan_path, tmp_path, monkeypatch, capsys):
    started = []
    monkeypatch.setattr(launch, "exec_launch", started.append)
    good = tmp_path / "a.tar.steps.json"
    good.write_text(json.dumps(GOOD))
    monkeypatch.chdir(tmp_path)
    main(["serve", "--plan", str(tiny_plan_path), "--state-dir", str(tmp_path / "st"),
          "--steps", "a.tar.steps.json", "--", "--model-path", "/models/m"])
    (spec,) = started
    assert spec.env["WARMUP_STEPS"] == str(good.resolve())
    assert spec.argv[:3] == [sys.executable, "-m", "sglang.launch_server"]


def test_the_server_arguments_that_shape_kernels_are_compared_by_hash(tiny_model_dir, tmp_path):
    """On SGLang's own resolved ServerArgs: an argument that changes a kernel (the attention
    backend, the KV dtype) makes a record of the other launch not apply; where the server
    listens, its seed, its secrets and what it logs do not, and no value is kept."""
    from sglang.srt.server_args import prepare_server_args

    def hashed(*flags, model=tiny_model_dir):
        sa = prepare_server_args(["--model-path", str(model), "--device", "cuda",
                                  "--skip-tokenizer-init", *flags])
        sa.resolve_once()
        return step_record.server_args_of(sa)

    base = hashed()
    assert len(base) > 100 and "attention_backend" in base and "kv_cache_dtype" in base
    for name in ("host", "port", "random_seed", "api_key", "admin_api_key", "log_level",
                 "enable_metrics", "served_model_name", "warmups", "ssl_keyfile",
                 "watchdog_timeout", "download_dir"):
        assert name not in base, name
    assert all(len(v) == 12 for v in base.values())
    assert str(tiny_model_dir) not in json.dumps(base)
    assert hashed("--port", "31001", "--host", "0.0.0.0", "--random-seed", "7", "--api-key",
                  "s3cret", "--log-level", "debug", "--enable-metrics",
                  "--mem-fraction-static", "0.5", "--base-gpu-id", "1") == base
    import shutil                         # the image mounts the model elsewhere than the bake
    assert hashed(model=shutil.copytree(tiny_model_dir, tmp_path / "mounted")) == base
    moved = hashed("--kv-cache-dtype", "fp8_e4m3", "--attention-backend", "flashinfer")
    assert sorted(n for n in base if base[n] != moved.get(n)) == \
        ["attention_backend", "kv_cache_dtype"]
    # sampling parameters SGLang merges into every request that leaves them unset (a penalty
    # there switches on the penalties' kernels for a greedy request): compared
    preferred = hashed("--preferred-sampling-params", '{"repetition_penalty": 1.2}')
    assert sorted(n for n in base if base[n] != preferred.get(n)) == ["preferred_sampling_params"]
    assert step_record.server_args_of(object()) == {} == step_record.server_args_of(None)


def test_an_argument_json_cannot_hold_is_hashed_by_content_or_left_out():
    class Args:
        def __init__(self, **kw):
            self.__dict__.update(kw)

    a = step_record.server_args_of(Args(tags={"b", "a"}, fn=len, mixed={1: 1, "a": 2}, dtype="bf16"))
    b = step_record.server_args_of(Args(tags={"a", "b"}, fn=len, mixed={1: 1, "a": 2}, dtype="bf16"))
    assert a == b and set(a) == {"tags", "fn", "dtype"}          # mixed keys: left out
    assert step_record.server_args_of(Args(tags={"a"}, fn=len, dtype="bf16"))["tags"] != a["tags"]


@pytest.mark.parametrize("name, keep, hashed", [("dsv4-eager-C-steps.json", 125, 0),
                                                ("dsv4-eager-C-steps-learned-on-restart.json",
                                                 124, 385),
                                                ("dsv4-eager-C-chained-steps.json", 49, 348)])
def test_the_records_learned_on_the_gpu_read_back(name, keep, hashed):
    """Two records a DeepSeek-V4 prebake wrote (docs/benchmarks.md): the earlier one, learned
    in the cold start and without server arguments, still reads (it compares the facts)."""
    from pathlib import Path

    record = step_record.read(Path(__file__).parents[3] / "docs" / "data" / name)
    assert (record.steps, len(record.keep), len(record.server_args)) == (225, keep, hashed)
    assert record.plan == "deepseek_v4_serving_shapes" and len(record.evidence) == 225


def test_a_chained_prompt_keeps_the_prompt_it_hits(tmp_path):
    """The chained record the GPU bake learned, closed again over the cache hits: width 8,357
    (step 217) hits the whole chunks of width 8,229 (step 216), which the bake's closure (of
    each stream's first step only) had left out; every step a kept step hits is kept, and so
    on down the chain."""
    from pathlib import Path

    from warmup.coverage import quiet_steps
    from warmup.plan import facts_file, loader, shipped
    from warmup.plan.expand import expand

    path = Path(__file__).parents[3] / "docs" / "data" / "dsv4-eager-C-chained-steps.json"
    record = step_record.read(path)
    # the plan as that bake ran it: its c128 widths were each power-of-two range's top and
    # smallest "other" width, up to the context (pow2_classes came after)
    text = shipped.path(record.plan).read_text()
    new = ('lengths: ["scale(pow2_classes(2, min(max_input_len - 64, long_cap) // 128), 128, 37)"]',
           "        reaches: min(max_input_len - 64, long_cap) // 128 * 128 + 127\n")
    assert new[0] in text and new[1] in text
    baked = tmp_path / "deepseek_v4_serving_shapes.yaml"
    baked.write_text(text.replace(new[0], new[0].replace("pow2_classes(", "batch_buckets([], "))
                     .replace(new[1], ""))
    exp = expand(loader.load(baked), facts_file.from_dump(dict(record.facts), str(path), hint="-"))
    # the same steps as the bake's (its digest predates the token scheme's part in it)
    import hashlib
    steps = json.dumps(exp.to_dict()["steps"], sort_keys=True).encode()
    assert hashlib.sha256(steps).hexdigest()[:16] == record.expansion_digest
    loud = quiet_steps.loud(record.evidence, hitting=quiet_steps.hitting(exp))
    keep = step_record.prefix_closure(exp, loud)
    assert keep == set(record.keep) | {216}
    hits = exp.prefix_hits()
    assert {(i, h.source, h.tokens) for (i, _), h in hits.items() if i >= 216} == {
        (216, 214, 4096), (217, 216, 8192), (218, 216, 8192), (219, 218, 16384),
        (220, 218, 16384), (221, 220, 32768), (222, 220, 32768), (223, 222, 65536),
        (224, 222, 65536)}
    assert all(h.source in keep for (i, _), h in hits.items() if i in keep)
    # down the chain: the longest width alone keeps every width it stands on
    assert step_record.prefix_closure(exp, {224}) == {224, 222, 220, 218, 216, 214}


def _evidence(ratios, events=0, start=0):
    return [step_record.StepEvidence(start + i, 100.0 * r, 100.0, events)
            for i, r in enumerate(ratios)]


def test_a_learning_start_slower_throughout_is_named_with_the_steps_kept_on_timing():
    """The median first-over-replay of the steps with nothing recorded: 1.15x or more over six
    such steps says the whole first pass ran slower, and the record says what that means."""
    quiet = _evidence([1.1, 1.2, 1.2, 1.25, 1.3, 1.4, 2.0])          # median 1.25
    loud = _evidence([3.0, 0.5], events=2, start=7)                   # recorded: left out
    record = step_record.from_json({**GOOD, "steps": 9, "keep": [6, 7, 8], "evidence": [
        e.to_json() for e in quiet + loud]})
    assert record.drift == pytest.approx(1.25)
    assert record.drift_notes == (
        "the start that learned the steps record ran its first pass slower throughout (a "
        "median 1.25x its replay over the steps with nothing recorded), so the 1 steps of the "
        "3 kept for their timing alone may be kept for the host's speed rather than a "
        "first-time cost, which makes the warm-up longer; bake on a quieter host for a shorter "
        "record",)
    usual = step_record.from_json({**GOOD, "steps": 7, "keep": [6], "evidence": [
        e.to_json() for e in _evidence([0.9, 1.0, 1.0, 1.05, 1.1, 1.3, 2.0])]})
    assert usual.drift is None and usual.drift_notes == ()
    few = step_record.from_json({**GOOD, "steps": 5, "keep": [], "evidence": [
        e.to_json() for e in _evidence([1.3] * 5)]})
    assert few.drift is None                                           # five steps say nothing
    assert step_record.from_json(GOOD).drift is None                  # failed sends left out


@pytest.mark.parametrize("name, drift", [("dsv4-eager-C-steps.json", 1.186),
                                         ("dsv4-eager-C-steps-learned-on-restart.json", 1.193),
                                         ("dsv4-eager-C-chained-steps.json", None),
                                         ("dsv4-eager-C-learned-rows-steps.json", None),
                                         ("dsv4-eager-C-host-probe-steps.json", None),
                                         ("dsv4-bcg-C-record-steps.json", None),
                                         ("dsv4-eager-C-reserve-steps.json", None),
                                         ("dsv4-eager-C-sites-steps.json", None)])
def test_the_gpu_records_learned_on_a_slower_host_say_so(name, drift):
    """The records that kept 124-125 steps (an H200 and a slower H100 host) drift; those of the
    hosts whose record kept 49, 60, 72 and 77 steps do not, nor the breakable graph's of 52
    (docs/benchmarks.md)."""
    from pathlib import Path

    record = step_record.read(Path(__file__).parents[3] / "docs" / "data" / name)
    assert record.drift == (None if drift is None else pytest.approx(drift, abs=5e-4))
    assert bool(record.drift_notes) == (drift is not None)
