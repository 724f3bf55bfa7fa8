"""warmup.coverage.classes and warmup.coverage.second_pass: compile keys per plan class over two
replays of a plan, from records that warmup.observe.events writes for real Triton compiles (CPU,
sm_90), through the real Driver; and the --warmups hook running the second pass."""

from __future__ import annotations

import asyncio
import json

import pytest
from _sglang_standin import Forward, recording, standin_sample  # noqa: F401 (fixture)

from warmup.coverage import classes as coverage
from warmup.coverage import second_pass

from warmup.plan import facts as facts_mod, loader
from warmup.cli import main
from warmup.serve.driver import Driver
from warmup.view.text import coverage as render_coverage, coverage_summary
from warmup.view.text import run_report as render
from warmup.errors import WarmupError
from warmup.plan.expand import expand
from warmup.serve.transport import Outcome, TokenMaker

PLAN = """\
version: 1
name: cov
phases:
  - name: p
    shapes:
      - class: lengths
        kind: extend
        lengths: [1, 16, 100, 128]
      - class: hits
        kind: prefix
        base: 64
        extends: [1, 37]
      - class: batches
        kind: batch
        batch_sizes: [2, 3]
        tokens_per_request: 32
"""

FACTS = {"chunked_prefill_size": 2048, "page_size": 16, "context_length": 8192,
         "max_running_requests": 16, "max_total_tokens": 200000}


class ForwardTransport:
    """Sends a driver step through the stand-in's forward, in this process (like the
    in-process transport inside SGLang).  ``leak``: classes whose every request also compiles
    a kernel keyed on a call counter (a specialization that never settles)."""

    def __init__(self, forward: Forward, leak: tuple[str, ...] = ()) -> None:
        self.forward = forward
        self.tokens = TokenMaker(32000, "coverage")
        self.leak = leak
        self.calls = 0

    async def send(self, step):
        from triton.runtime.jit import MockTensor
        import triton.language as tl

        from warmup.observe.doctor import compile_only_target

        reqs = step.requests + step.background
        if step.mode == "batch":
            self.forward.run([self.tokens.ids(step, i, r) for i, r in enumerate(reqs)],
                             [r.sampling for r in reqs])
        else:
            for i, r in enumerate(reqs):
                self.forward.run([self.tokens.ids(step, i, r)], [r.sampling])
        if step.shape_class in self.leak:
            self.calls += 1
            with compile_only_target():
                standin_sample.warmup(MockTensor(tl.float32), MockTensor(tl.float32), 5,
                                      FAMILY=100 + self.calls, grid=(1,))
        return [Outcome(1, "length", 0.0) for _ in reqs]

    async def flush(self, timeout_s: float) -> str:
        self.forward.flush()
        return "flushed"


def expansion():
    return expand(loader.loads(PLAN, "cov.yaml"), facts_mod.from_settings(FACTS, source="file",
                                                                          vocab_size=32000))


def keys(cls) -> list[tuple[str, str]]:
    return [(k.name, k.signature) for k in cls.first]


@pytest.fixture(autouse=True)
def _no_timing_gate(monkeypatch):
    """The integration tests below check compile keys; the first-hit latency gate has its own
    deterministic test (timings of a loaded test machine are noise)."""
    monkeypatch.setenv("WARMUP_FIRST_HIT_MIN_MS", "1000000")


def test_a_second_replay_that_compiles_nothing_closes_the_plan(recording):
    driver = Driver(ForwardTransport(Forward()), state_dir=str(recording.state_dir),
                    progress=lambda line: None)
    result = asyncio.run(second_pass.run(driver, expansion(), second_pass=True))
    report = result.run
    cov = coverage.Coverage.from_json(result.to_dict()["coverage"])
    assert result.coverage.to_json() == cov.to_json()
    assert cov.closed and cov.open_classes == ()
    by = {c.shape_class: c for c in cov.classes}
    assert list(by) == ["lengths", "hits", "batches"]
    # alternate sampling: greedy, then the server's defaults (temperature 1: the sampler).
    assert keys(by["lengths"]) == [
        ("standin_extend", "*fp32:16,*fp32:16; n_tokens=1,BS=1,HAS_PREFIX=0"),
        ("standin_extend", "*fp32:16,*fp32:16,i32:16; BS=1,HAS_PREFIX=0"),
        ("standin_sample", "*fp32:16,*fp32:16; bs=1,FAMILY=7"),
        ("standin_extend", "*fp32:16,*fp32:16,i32; BS=1,HAS_PREFIX=0")]
    # base 64 is computed like a 16-multiple prompt (already compiled); the extends of 1 and
    # 37 tokens on the cached 64 are new (has_prefix).
    assert keys(by["hits"]) == [
        ("standin_extend", "*fp32:16,*fp32:16; n_tokens=1,BS=1,HAS_PREFIX=1"),
        ("standin_extend", "*fp32:16,*fp32:16,i32; BS=1,HAS_PREFIX=1")]
    # bs 2 and 3 (pow2 2 and 4) x totals 64/65 and 96/97; the sampler at bs 2 (and 3: the
    # same integer class).
    assert keys(by["batches"]) == [
        ("standin_extend", "*fp32:16,*fp32:16,i32:16; BS=2,HAS_PREFIX=0"),
        ("standin_sample", "*fp32:16,*fp32:16,i32; FAMILY=7"),
        ("standin_extend", "*fp32:16,*fp32:16,i32; BS=2,HAS_PREFIX=0"),
        ("standin_extend", "*fp32:16,*fp32:16,i32:16; BS=4,HAS_PREFIX=0"),
        ("standin_extend", "*fp32:16,*fp32:16,i32; BS=4,HAS_PREFIX=0")]
    assert all(k.compiled == 1 and k.processes == 1 for c in cov.classes for k in c.first)
    assert cov.outside_first == () and cov.outside_second == ()
    assert coverage_summary(cov) == ("plan cov closed: a second replay in the same server compiled and "
                             "loaded nothing and every class's first hit within 1.1x of its "
                             "repeat")
    # the second replay sent every step twice and timed both
    assert all(c.latency is not None and c.latency.repeat_ms > 0 for c in cov.classes)
    # The result's JSON is the first replay's report plus the coverage; the state directory
    # has coverage.json.
    assert result.to_dict()["coverage"] == cov.to_json()
    assert {k: v for k, v in result.to_dict().items() if k != "coverage"} == report.to_dict()
    assert json.loads((recording.state_dir / "coverage.json").read_text()) == cov.to_json()
    assert [(c.shape_class, c.compiles) for c in report.classes] == [
        ("lengths", 4), ("hits", 2), ("batches", 5)]
    text = render(report).splitlines() + render_coverage(cov).splitlines()
    assert coverage_summary(cov) in text


def test_what_still_compiles_on_the_second_replay_is_listed(recording, capsys):
    transport = ForwardTransport(Forward(), leak=("hits",))
    driver = Driver(transport, state_dir=str(recording.state_dir), progress=lambda line: None)
    result = asyncio.run(second_pass.run(driver, expansion(), second_pass=True))
    cov = coverage.Coverage.from_json(result.to_dict()["coverage"])
    assert not cov.closed and cov.open_classes == ("hits",)
    by = {c.shape_class: c for c in cov.classes}
    # three steps in hits (base, +1, +37): a new counter-keyed compile per step and replay
    assert [k.signature for k in by["hits"].first if k.name == "standin_sample"] == [
        f"*fp32:16,*fp32:16,i32; FAMILY={n}" for n in (101, 102, 103)]
    # the second replay sends each step twice (first hit, repeat): six more compiles
    assert [(k.name, k.signature) for k in by["hits"].second] == [
        ("standin_sample", f"*fp32:16,*fp32:16,i32; FAMILY={n}") for n in range(104, 110)]
    assert all(c.closed for c in cov.classes if c.shape_class != "hits")
    assert coverage_summary(cov) == ("plan cov NOT closed: 6 compile key(s) still triggered on a second "
                             "replay (hits)")
    # `sglang-warmup coverage STATE_DIR` shows the same.
    main(["coverage", str(recording.state_dir)])
    out = capsys.readouterr().out.splitlines()
    assert out[0] == coverage_summary(cov)
    assert out[1].split() == ["class", "keys", "compiled", "disk", "loads", "2nd", "replay",
                              "first/repeat", "state"]
    assert out[3].split()[:6] + out[3].split()[-1:] == ["lengths", "4", "4", "0", "0", "0",
                                                        "closed"]
    assert out[4].split()[:6] + out[4].split()[-1:] == ["hits", "5", "5", "0", "0", "6", "OPEN"]
    assert out[6].startswith("  still triggered by hits: standin_sample [")
    assert out[6].endswith("] (*fp32:16,*fp32:16,i32; FAMILY=104) (compiled 1)")
    assert [line.split("[")[0] for line in out[7:9]] == ["  still triggered by hits: standin_sample "] * 2
    main(["coverage", str(recording.state_dir / "coverage.json"), "--json"])
    assert json.loads(capsys.readouterr().out) == cov.to_json()


def rec(event, cls, *, phase="warmup", name="k", h="h1", pid=1, **extra):
    r = {"event": event, "time": 1.0, "pid": pid, "phase": phase, "shape_class": cls,
         "request": 0, "compiler": extra.pop("compiler", "triton")}
    if event == "jit_build":
        r.update({"module_name": name, "outcome": extra.pop("outcome", "built"),
                  "duration_s": 2.0, "cache_hit": False})
    else:
        r.update({"kernel": {"module": "m", "name": name, "qualname": name}, "hash": h})
        if event == "miss":
            r.update({"signature": {"x": "*bf16", "n": "i32", "B": "constexpr"},
                      "constexprs": [{"path": [2], "name": "B", "value": 64}],
                      "attrs": [{"path": [0], "name": "x", "attrs": [["tt.divisibility", 16]]}],
                      "duration_s": 0.5})
    r.update(extra)
    return r


def test_compute_groups_records_by_key_class_and_replay():
    first = [rec("miss", "a", pid=1), rec("miss", "a", pid=2),  # one key on two TP ranks
             rec("load", "a", pid=1), rec("jit_build", "a", name="mhc_post", compiler="sglang_jit"),
             rec("hit", "b", name="k2", h="h2"),
             rec("miss", "flush", name="k3", h="h3"),              # the driver's flush step
             rec("miss", None, phase="serving", name="k4", h="h4")]  # someone else's traffic
    second = [rec("jit_build", "a", name="mhc_post", compiler="sglang_jit", outcome="hit")]
    cov = coverage.compute(first, second, classes=["a", "b", "c"], plan="p")
    a, b, c = cov.classes
    assert [(k.compiler, k.name, k.hash, k.signature, k.compiled, k.disk_hits, k.device_loads,
             k.processes, k.seconds) for k in a.first] == [
        ("triton", "k", "h1", "*bf16:16,i32; B=64", 2, 0, 1, 2, 1.0),
        ("sglang_jit", "mhc_post", None, "", 1, 0, 0, 1, 2.0)]
    assert [(k.name, k.disk_hits) for k in a.second] == [("mhc_post", 1)]
    assert [(k.name, k.disk_hits) for k in b.first] == [("k2", 1)] and b.closed
    assert c.first == () and c.closed
    assert [k.name for k in cov.outside_first] == ["k3", "k4"] and cov.outside_second == ()
    assert cov.open_classes == ("a",) and not cov.closed
    assert coverage.Coverage.from_json(json.loads(json.dumps(cov.to_json()))) == cov


def test_without_a_state_dir_the_second_replay_is_skipped(recording, monkeypatch):
    transport = ForwardTransport(Forward())
    driver = Driver(transport, progress=lambda line: None)
    monkeypatch.setenv("WARMUP_SECOND_PASS", "1")
    result = asyncio.run(second_pass.run(driver, expansion()))  # second_pass from the variable
    assert result.to_dict()["coverage"]["note"] == (
        "no state directory: the compile log that coverage reads is not written; second replay "
        "skipped")
    assert result.to_dict()["coverage"]["classes"] == []


def test_without_second_pass_it_is_the_plain_driver_run(recording, monkeypatch):
    monkeypatch.setenv("WARMUP_SECOND_PASS", "0")
    driver = Driver(ForwardTransport(Forward()), state_dir=str(recording.state_dir),
                    progress=lambda line: None)
    result = asyncio.run(second_pass.run(driver, expansion()))
    assert result.coverage is None and result.run.ok
    assert result.to_dict()["coverage"] is None
    assert not (recording.state_dir / "coverage.json").exists()


def test_load_says_how_to_record_coverage(tmp_path):
    with pytest.raises(WarmupError) as err:
        coverage.load(tmp_path)
    assert err.value.message == f"{tmp_path / 'coverage.json'}: no coverage recorded"
    assert err.value.hint == ("run the warm-up with WARMUP_SECOND_PASS=1 (a second replay "
                              "measures coverage)")
    (tmp_path / "report.json").write_text(json.dumps({"plan": "x", "coverage": None}))
    with pytest.raises(WarmupError) as err:
        coverage.load(tmp_path / "report.json")
    assert err.value.message == f"{tmp_path / 'report.json'}: not a coverage record"


def test_the_first_hit_gate_closes_or_opens_the_plan():
    """Closed means no compile left AND every class's first hit after the warm-up within
    max_ratio of its repeat (and more than min_ms slower; below that, noise)."""
    lat = {"fast": coverage.ClassLatency(104.0, 100.0, 1.04),
           "slow": coverage.ClassLatency(300.0, 100.0, 4.2),
           "tiny": coverage.ClassLatency(4.0, 1.0, 4.0)}  # 4x, but 3 ms: noise
    cov = coverage.compute((), (), classes=["fast", "slow", "tiny"], plan="p", latency=lat)
    assert not cov.closed and cov.open_classes == () and cov.slow_classes == ("slow",)
    assert coverage_summary(cov) == "plan p NOT closed: first hit over 1.1x its repeat in slow"
    again = coverage.Coverage.from_json(cov.to_json())
    assert again.to_json() == cov.to_json() and again.slow_classes == ("slow",)
    relaxed = coverage.compute((), (), classes=["fast", "slow", "tiny"], plan="p", latency=lat,
                               max_ratio=5.0)
    assert relaxed.closed
    rows = {line.split()[0]: line.split() for line in render_coverage(cov).splitlines()[3:6]}
    assert rows["slow"][-2:] == ["3.00x", "SLOW"] and rows["fast"][-2:] == ["1.04x", "closed"]


def test_hostile_compile_log_records_aggregate_without_tracebacks():
    """Records read from a compile log are someone else's bytes: a duration of 10**400 or a
    list for a pid count nothing, never a traceback of the coverage."""
    recs = [{"event": "miss", "compiler": "triton", "name": "k", "hash": "h", "pid": [1],
             "duration_s": 10 ** 400, "phase": "warmup", "shape_class": "c"},
            {"event": "jit_build", "compiler": "sglang_jit", "name": "m", "pid": 7,
             "duration_s": float("nan"), "phase": "warmup", "shape_class": "c"}]
    keys = coverage.aggregate(recs)
    assert [(k.compiler, k.compiled, k.seconds, k.processes) for k in keys] == [
        ("triton", 1, 0.0, 0), ("sglang_jit", 1, 0.0, 1)]


def test_a_recompiled_graph_shows_the_guard_that_failed():
    """A ``torch.compile`` graph compiled again carries Dynamo's reason in the compile log; the
    reports show it where a Triton key shows its signature.  A reason that is not text shows
    nothing."""
    from warmup.view.text import key_label

    recs = [{"event": "jit_build", "compiler": "dynamo", "outcome": "built", "pid": 7,
             "module_name": "repetition_penalty.py:apply_scaling_penalties [4/0]"},
            {"event": "jit_build", "compiler": "dynamo", "outcome": "built", "pid": 7,
             "module_name": "repetition_penalty.py:apply_scaling_penalties [4/2]",
             "reason": "4/0: 'NoneType' object has no attribute 'size'"},
            {"event": "jit_build", "compiler": "dynamo", "outcome": "built", "pid": 7,
             "module_name": "x.py:f [5/1]", "reason": ["not", "text"]},
            {"event": "jit_build", "compiler": "dynamo", "outcome": "built", "pid": 7,
             "module_name": "x.py:f [5/2]", "reason": "a\x1b[2Jb\n" + "z" * 10_000}]
    keys = coverage.aggregate(recs)
    assert [k.signature for k in keys][:3] == [
        "", "guard failed: 4/0: 'NoneType' object has no attribute 'size'", ""]
    assert keys[3].signature == "guard failed: a\x1b[2Jb\n" + "z" * 505   # 512 characters
    assert key_label(keys[3]) == "x.py:f [5/2] (guard failed: a\\x1b[2Jb " + "z" * 505 + ")"


def test_a_compile_key_from_a_hostile_log_is_printed_printable():
    """Names, hashes and signatures come from compile logs (data): the terminal label of a
    key carries no control character of theirs."""
    from warmup.view.text import key_label

    recs = [{"event": "jit_build", "compiler": "dynamo", "outcome": "built", "pid": 1,
             "module_name": "x\x1b[2J.py:f [0/1]", "reason": "ok \x1b[31m"},
            {"event": "miss", "compiler": "triton", "pid": 1, "hash": "h\x07ash",
             "kernel": {"name": "k\rern"}}]
    labels = [key_label(k) for k in coverage.aggregate(recs)]
    assert all(label.isprintable() for label in labels), labels
    assert labels[0] == "x\\x1b[2J.py:f [0/1] (guard failed: ok \\x1b[31m)"
