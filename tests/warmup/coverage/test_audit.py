"""warmup.coverage.audit and ``sglang-warmup audit``: a local HTTP stand-in of SGLang whose forwards
really compile Triton kernels (CPU, sm_90), with warmup.observe.events recording them.

What the sample in ``_sglang_standin.TRAFFIC`` compiles on a fresh stand-in (the extend kernel
is specialized on the computed token count's class, next_power_of_2(bs) and has_prefix; the
sampler on the batch size and the sampling family):

* step 0, single 100 tokens: extend (other, bs 1, no prefix): 1 compile;
* step 1, single 37 tokens: the same specialization: nothing;
* step 2, burst 64 + 80, top-p: extend (div16, bs 1) and the top-p sampler (bs 1): 2 compiles;
* step 3, batch 20 + 30 + 40: extend (other, pow2 4): 1 compile;
* step 4, first prompt of prefix group "doc" (60 tokens, nothing cached): nothing new;
* step 5, 70 tokens on the cached "doc" prefix (2 pages = 32 tokens hit, 38 computed):
  extend with has_prefix: 1 compile.

The second pass sends the same shapes with fresh tokens: every specialization is in the
process already, so it compiles nothing.
"""

from __future__ import annotations

import json

from _cli import cli
import pytest
from _sglang_standin import TRAFFIC, Forward, StandIn, recording, write_traffic  # noqa: F401

from warmup.coverage import audit

from cache_tools import compile_log
from warmup.observe import phase
from warmup.errors import WarmupError

EXPECTED_MISSES = {0: 1, 2: 2, 3: 1, 5: 1}
EXPECTED_KEYS = {
    0: [("standin_extend", "*fp32:16,*fp32:16,i32; BS=1,HAS_PREFIX=0")],
    2: [("standin_extend", "*fp32:16,*fp32:16,i32:16; BS=1,HAS_PREFIX=0"),
        ("standin_sample", "*fp32:16,*fp32:16; bs=1,FAMILY=2")],
    3: [("standin_extend", "*fp32:16,*fp32:16,i32; BS=4,HAS_PREFIX=0")],
    5: [("standin_extend", "*fp32:16,*fp32:16,i32; BS=1,HAS_PREFIX=1")],
}




def test_every_compile_is_attributed_to_its_step(recording, tmp_path, capsys):
    traffic = write_traffic(tmp_path / "traffic.jsonl")
    Forward().run([[5] * 7, [6] * 9], [{"temperature": 0.0}] * 2)  # own traffic (bs 2), before
    before = len(compile_log.read_dir(recording.state_dir))
    assert before == 1
    with StandIn(registry=recording.registry) as server:
        code, out, err = cli(capsys, "audit", "--url", server.url, "--traffic", str(traffic),
                             "--state-dir", str(recording.state_dir), "--json")
        flushes = server.flushes
    report = json.loads(out)
    files = sorted(recording.state_dir.glob("audit-*.json"))
    assert len(files) == 1
    assert code == 3
    assert err.splitlines()[-2:] == [
        "error: 5 post-ready compile event(s) during the audit, above --max-misses 0",
        f"hint: sglang-warmup learn --audits {files[0]} --plan PLAN turns them into plan "
        "classes"]
    assert report["mode"] == "compile_log"
    assert (report["misses"], report["ok"], report["max_misses"]) == (5, False, 0)
    assert report["steps_with_misses"] == [0, 2, 3, 5]
    assert {s["index"]: s["pass1"]["misses"] for s in report["steps"] if s["pass1"]["misses"]} \
        == EXPECTED_MISSES
    assert [s["pass2"]["misses"] for s in report["steps"]] == [0] * 6
    assert report["unattributed"] == [] and report["unseen_events"] == 0
    assert flushes == 2  # between the passes, and after the second
    by_step = {s["index"]: s for s in report["steps"]}
    assert {i: [(k["name"], k["signature"]) for k in by_step[i]["pass1"]["keys"]]
            for i in EXPECTED_MISSES} == EXPECTED_KEYS
    keys = [k for i in EXPECTED_MISSES for k in by_step[i]["pass1"]["keys"]]
    assert all((k["compiled"], k["processes"], k["module"]) == (1, 1, "_sglang_standin")
               for k in keys)
    assert len({k["hash"] for k in keys}) == 5  # five distinct specializations
    assert [by_step[i]["prefix_cached"] for i in range(6)] == [False] * 5 + [True]
    # A step that compiled took longer on its first pass (compiles take tens of ms or more).
    assert all(by_step[i]["pass1"]["ms"] > by_step[i]["pass2"]["ms"] for i in EXPECTED_MISSES)
    assert set(report["slow_first"]) <= set(range(6))
    assert report["facts"]["page_size"] == 16
    assert json.loads(files[0].read_text()) == report
    # After the audit the phase file says plain serving: later compiles belong to no step.
    now = phase.current(state_dir=recording.state_dir)
    assert (now.phase, now.shape_class, now.request) == ("serving", None, None)
    stamped = [(r["phase"], r["shape_class"], r["request"]) for r in
               compile_log.read_dir(recording.state_dir)[before:]]
    assert sorted(stamped) == sorted([("serving", "audit:fresh", 0), ("serving", "audit:burst", 2),
                                      ("serving", "audit:burst", 2),
                                      ("serving", "audit:batch_3", 3), ("serving", "audit:rag", 5)])


def test_table_and_threshold(recording, tmp_path, capsys):
    traffic = write_traffic(tmp_path / "traffic.jsonl")
    with StandIn(registry=recording.registry) as server:
        code, out, err = cli(capsys, "audit", "--url", server.url, "--traffic", str(traffic),
                             "--state-dir", str(recording.state_dir), "--max-misses", "5",
                             "--out", str(tmp_path / "a.json"))
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].startswith(f"audit of {server.url}: 6 traffic steps from {traffic}, sent twice")
    assert lines[2] == ("compiled after ready: 5 compile event(s) in 4 step(s); --max-misses 5: "
                        "ok")
    assert lines[3].split() == ["step", "label", "kind", "prompts", "pass", "1", "ms", "pass",
                                "2", "ms", "x", "miss", "1", "miss", "2", "slow", "because",
                                "kernels"]
    # The table ends at the line counting the quiet steps; when noise made the first pass of
    # every step without a miss slow too, all six are rows and that line is left out.
    first_miss = next(i for i, line in enumerate(lines) if line.startswith("  miss: "))
    end = next((i for i, line in enumerate(lines[:first_miss])
                if line.endswith("first pass within 1.5x of the second")), first_miss)
    rows = {int(line.split()[0]): line for line in lines[5:end]}
    steps = {s["index"]: s for s in json.loads((tmp_path / "a.json").read_text())["steps"]}
    # Steps that missed, and any other step whose first pass happened to be slow (noise).
    assert {i for i, s in steps.items() if s["misses"]} == {0, 2, 3, 5} <= set(rows)
    assert rows[2].split()[:4] == ["2", "burst", "burst", "64+80"]
    assert rows[2].endswith("standin_extend, standin_sample")
    assert rows[5].split()[:6] == ["5", "rag", "single", "70", "(prefix", "40)"]
    # the cause of a slow first pass: the compile the audit attributed to the step
    assert all(s["cause"] == ("compile" if s["slow_first"] else "")
               for i, s in steps.items() if i in (0, 2, 3, 5))
    if len(rows) < 6:
        assert lines[end] == (f"{6 - len(rows)} other step(s): no misses, first pass within "
                              "1.5x of the second") and first_miss == end + 1
    else:
        assert end == first_miss
    miss = lines[first_miss]
    assert miss.startswith("  miss: step 0 fresh pass 1: triton standin_extend [")
    assert miss.endswith("] (*fp32:16,*fp32:16,i32; BS=1,HAS_PREFIX=0): compiled 1, "
                         + miss.rsplit(", ", 1)[1])
    assert miss.rsplit(", ", 1)[1].endswith(" s")
    assert len([line for line in lines if line.startswith("  miss: ")]) == 5
    assert lines[-1] == f"audit file: {tmp_path / 'a.json'}"
    assert json.loads((tmp_path / "a.json").read_text())["ok"] is True
    assert err.splitlines() == ["sglang-warmup audit: pass 1 of 2, 6 steps",
                                "sglang-warmup audit: pass 2 of 2, 6 steps"]


def test_without_a_state_dir_it_counts_metrics_deltas(recording, tmp_path, capsys):
    traffic = write_traffic(tmp_path / "traffic.jsonl")
    with StandIn(registry=recording.registry) as server:
        code, out, _ = cli(capsys, "audit", "--url", server.url, "--traffic", str(traffic),
                           "--json", "--max-misses", "100", "--out", str(tmp_path))
    assert code == 0
    report = json.loads(out)
    assert report["mode"] == "metrics"
    assert report["mode_note"].startswith(
        '/metrics deltas of sglang_warmup_compile_events_total{phase="serving"} per step '
        "(coarser: counts only, no kernel names;")
    assert {s["index"]: s["pass1"]["misses"] for s in report["steps"] if s["pass1"]["misses"]} \
        == EXPECTED_MISSES
    assert all(s["pass1"]["keys"] == [] and s["pass2"]["misses"] == 0 for s in report["steps"])
    assert report["misses"] == 5
    assert [p.name for p in tmp_path.glob("audit-*.json")] == [report["file"].rsplit("/", 1)[1]]


def test_a_state_dir_the_server_does_not_write_is_flagged(recording, tmp_path, capsys):
    traffic = write_traffic(tmp_path / "traffic.jsonl")
    elsewhere = tmp_path / "not-the-servers"
    elsewhere.mkdir()
    with StandIn(registry=recording.registry) as server:
        code, out, _ = cli(capsys, "audit", "--url", server.url, "--traffic", str(traffic),
                           "--state-dir", str(elsewhere), "--json")
    report = json.loads(out)
    assert code == 3
    assert (report["misses"], report["unseen_events"], report["steps_with_misses"]) == (5, 5, [])
    assert report["notes"] == [
        f"/metrics counted 5 more serving compile event(s) than the compile log in {elsewhere} "
        "recorded: the server may not write to this state directory (they count as misses)"]


def test_a_server_error_fails_the_audit(recording, tmp_path, capsys):
    traffic = write_traffic(tmp_path / "traffic.jsonl")
    with StandIn(registry=recording.registry, fail_generate=True) as server:
        code, out, err = cli(capsys, "audit", "--url", server.url, "--traffic", str(traffic),
                             "--state-dir", str(recording.state_dir))
        assert server.requests == 1
    assert code == 1
    assert out == ""
    assert err.splitlines()[-2:] == [
        "error: audit pass 1, step 0 (fresh: single 100): /generate answered HTTP 500: "
        "Internal Server Error", "hint: see the server log"]
    assert list(recording.state_dir.glob("audit-*.json")) == []
    now = phase.current(state_dir=recording.state_dir)
    assert (now.phase, now.shape_class, now.request) == ("serving", None, None)


def test_a_server_that_is_not_ready_is_refused(recording, tmp_path, capsys):
    traffic = write_traffic(tmp_path / "traffic.jsonl")
    with StandIn(registry=recording.registry, healthy=False) as server:
        code, _, err = cli(capsys, "audit", "--url", server.url, "--traffic", str(traffic))
        assert server.requests == 0
    assert code == 1
    assert err.splitlines() == [
        f"error: {server.url}/health_generate did not answer 200: the server is not ready",
        "hint: wait until the server is ready, then audit"]


def test_without_state_dir_or_metrics_it_says_what_to_do(recording, tmp_path, capsys):
    traffic = write_traffic(tmp_path / "traffic.jsonl")
    with StandIn(registry=recording.registry, metrics=False) as server:
        code, _, err = cli(capsys, "audit", "--url", server.url, "--traffic", str(traffic))
        assert server.requests == 0
    assert code == 1
    assert err.splitlines() == [
        f"error: {server.url}/metrics: not found (HTTP 404)",
        "hint: start SGLang with --enable-metrics, or pass --state-dir with the server's state "
        "directory"]


def test_metrics_without_our_counters_are_refused(tmp_path, capsys):
    from prometheus_client import CollectorRegistry, Counter

    registry = CollectorRegistry()
    Counter("sglang_num_requests", "SGLang's own", registry=registry).inc()
    traffic = write_traffic(tmp_path / "traffic.jsonl")
    with StandIn(registry=registry) as server:
        code, _, err = cli(capsys, "audit", "--url", server.url, "--traffic", str(traffic))
    assert code == 1
    assert err.splitlines() == [
        f"error: {server.url}/metrics has no sglang_warmup_ metrics",
        "hint: start the server with `sglang-warmup serve` (or WARMUP_ENABLE=1) so compile "
        "events are counted, or pass --state-dir"]


def test_a_prompt_above_the_servers_limit_is_refused_before_sending(recording, tmp_path, capsys):
    traffic = write_traffic(tmp_path / "traffic.jsonl",
                            TRAFFIC + [{"kind": "single", "prompts": [8100], "label": "long"}])
    with StandIn(registry=recording.registry) as server:
        code, _, err = cli(capsys, "audit", "--url", server.url, "--traffic", str(traffic),
                           "--state-dir", str(recording.state_dir))
        assert server.requests == 0
    assert code == 1
    assert err.splitlines() == [
        "error: traffic step 6 (long): a 8100-token prompt is above the server's longest prompt "
        "(8000)", "hint: regenerate the sample with a smaller --max-prompt"]


def test_a_server_still_warming_up_is_refused(recording, tmp_path):
    phase.set_phase("warmup", "extend_int_classes", 3, state_dir=recording.state_dir)
    with StandIn(registry=recording.registry) as server:
        with pytest.raises(WarmupError) as err:
            audit.run(server.url, [audit.TrafficStep("single", (10,))],
                      state_dir=recording.state_dir)
    assert err.value.message == (f"the phase file in {recording.state_dir} says the server is "
                                 "still warming up (extend_int_classes)")


def test_a_missing_state_dir_is_an_error(tmp_path):
    with StandIn() as server:
        with pytest.raises(WarmupError) as err:
            audit.run(server.url, [audit.TrafficStep("single", (10,))],
                      state_dir=tmp_path / "nope")
    assert err.value.message == f"--state-dir {tmp_path / 'nope'}: no such directory"


def test_parse_metrics_sums_serving_events_only():
    text = "\n".join([
        "# HELP sglang_warmup_compile_events_total Kernel compile events",
        "# TYPE sglang_warmup_compile_events_total counter",
        'sglang_warmup_compile_events_total{compiler="triton",outcome="miss",phase="serving"} 3.0',
        'sglang_warmup_compile_events_total{compiler="triton",outcome="hit",phase="serving"} 2.0',
        'sglang_warmup_compile_events_total{compiler="sglang_jit",outcome="miss",phase="serving"} 1.0',
        'sglang_warmup_compile_events_total{compiler="triton",outcome="miss",phase="warmup"} 40.0',
        # a hostile server's values that are no count: counted as nothing
        'sglang_warmup_compile_events_total{compiler="x",outcome="miss",phase="serving"} +Inf',
        "# HELP sglang_warmup_kernel_loads_total loads",
        "# TYPE sglang_warmup_kernel_loads_total counter",
        'sglang_warmup_kernel_loads_total{phase="serving"} 4.0',
        'sglang_warmup_kernel_loads_total{phase="init"} 9.0',
        'sglang_warmup_kernel_loads_total{compiler="x",phase="serving"} NaN', ""])
    assert audit.parse_metrics(text) == audit.ServingCounts(6.0, 4.0)
    assert audit.parse_metrics("# HELP sglang_x x\n# TYPE sglang_x counter\nsglang_x 1.0\n") is None
    with pytest.raises(WarmupError) as err:
        audit.parse_metrics("sglang_warmup_compile_events_total{phase=serving 1\n")
    assert err.value.message.startswith("/metrics is not Prometheus text: ")


def test_an_existing_out_file_is_refused_before_the_audit_runs(tmp_path, capsys):
    out = tmp_path / "a.json"
    out.write_text("{}")
    traffic = write_traffic(tmp_path / "traffic.jsonl")
    # port 9 (discard): nothing listens; the refusal comes before any request
    code, stdout, err = cli(capsys, "audit", "--url", "http://127.0.0.1:9", "--traffic",
                            str(traffic), "--out", str(out))
    assert (code, stdout) == (1, "")
    assert err.splitlines() == [f"error: --out {out} exists",
                                "hint: pass -y to overwrite it, or choose another --out"]
    assert out.read_text() == "{}"


def _step_audit(first_ms, second_ms, *, keys=(), loads=0, features=None, gc_ms=0.0):
    from warmup.coverage.audit import PassResult, StepAudit
    from warmup.coverage.traffic import TrafficStep

    step = TrafficStep("single", (300,), features=features or {})
    return StepAudit(0, step, False, PassResult(first_ms, misses=len(keys), device_loads=loads,
                                                keys=tuple(keys), gc_ms=gc_ms),
                     PassResult(second_ms))


def test_a_slow_first_pass_is_given_the_cause_the_audit_can_see():
    from warmup.coverage.classes import KeyEvents

    compiled = KeyEvents("triton", "k", "m", "h", "", compiled=1)
    cached = KeyEvents("triton", "k", "m", "h", "", disk_hits=1)
    assert _step_audit(100.0, 10.0, keys=[compiled]).cause == "compile"
    assert _step_audit(100.0, 10.0, keys=[cached]).cause == "cache load"
    assert _step_audit(100.0, 10.0, loads=2).cause == "kernel load"
    assert _step_audit(100.0, 10.0, features={"return_logprob": True, "logprob_start_len": 0,
                                              "n": 2}).cause == (
        "first use of input logprobs, parallel sampling (n > 1), logprobs")
    assert _step_audit(100.0, 10.0).cause == "none found"
    # the server's long garbage collections overlapped the step for most of its extra time
    collected = _step_audit(460.0, 100.0, gc_ms=450.0, features={"n": 2})
    assert collected.cause == "garbage collection (450 ms)"
    assert collected.to_json()["pass1"]["gc_ms"] == 450.0
    assert _step_audit(460.0, 100.0, gc_ms=60.0).cause == "none found"   # too little of it
    fast = _step_audit(12.0, 10.0, keys=[compiled])
    assert fast.cause == "" and fast.to_json()["ratio"] == 1.2


def test_a_first_pass_slower_throughout_is_named_beside_its_cold_steps():
    from dataclasses import replace

    from warmup.coverage.audit import AuditReport
    from warmup.coverage.classes import KeyEvents

    compiled = KeyEvents("triton", "k", "m", "h", "", compiled=1)

    def report(steps):
        return AuditReport(url="u", traffic="t", mode="compile_log", mode_note="", facts={},
                           steps=tuple(replace(s, index=i) for i, s in enumerate(steps)),
                           max_misses=0, created_at=0.0)

    drifting = [_step_audit(121.0, 100.0) for _ in range(6)] + [_step_audit(170.0, 100.0)]
    slow = report(drifting)
    assert slow.median_ratio == pytest.approx(1.21)
    assert "a median 1.21x its second over the 7 steps with nothing recorded" in slow.drift_note
    assert slow.to_json()["median_ratio"] == 1.21
    from warmup.view import html, text
    said = text.audit(slow, width=200).splitlines()
    assert "median step with nothing recorded, pass 1 over pass 2: 1.21x (7 steps)" in said
    assert any(line.startswith("note: the first pass ran slower throughout") for line in said)
    assert "slower throughout" in "".join(html.audit(slow, "a.json"))
    # steps that compiled say nothing of the pass's speed: not counted
    cold = report(drifting[:5] + [_step_audit(900.0, 100.0, keys=[compiled])] * 4)
    assert len(cold.quiet_ratios) == 5 and cold.drift_note == ""
    # a pass at its usual speed, and too few steps to tell, say nothing
    assert report([_step_audit(105.0, 100.0)] * 6 + [_step_audit(170.0, 100.0)]).drift_note == ""
    assert report(drifting[:5]).drift_note == ""
    assert report([]).median_ratio is None
    # a step whose second pass took no time has no ratio: left out, not a division by zero
    assert report(drifting + [_step_audit(5.0, 0.0)]).quiet_ratios == slow.quiet_ratios
    assert slow.to_json()["drift_note"] == slow.drift_note
    assert replace(slow, notes=("kept",)).all_notes == ("kept", slow.drift_note)
    assert cold.all_notes == ()
    loaded = _step_audit(121.0, 100.0)
    loaded = replace(loaded, second=replace(loaded.second, device_loads=1))
    assert len(report(drifting + [loaded]).quiet_ratios) == 7  # a load in either pass: left out


def test_collections_count_where_they_overlap_a_step():
    from warmup.coverage.audit import gc_overlap_ms

    pauses = [{"event": "gc", "time": 10.5, "duration_s": 0.4},     # 10.1-10.5
              {"event": "gc", "time": 12.0, "duration_s": 0.1},     # after the step
              {"event": "gc", "time": "junk", "duration_s": 1},     # unreadable: ignored
              {"event": "gc", "time": 10 ** 400, "duration_s": 1},  # fits no float: ignored
              {"event": "gc", "time": 10.9, "duration_s": float("inf")}]  # not finite: 0 s
    assert gc_overlap_ms(pauses, 10.0, 11.0) == pytest.approx(400.0)
    assert gc_overlap_ms(pauses, 10.3, 10.4) == pytest.approx(100.0)
    assert gc_overlap_ms(pauses, 11.0, 11.5) == 0.0
    # eight schedulers collecting at the same time stall the step once, not eight times
    ranks = [{"event": "gc", "time": 10.5 + i * 0.01, "duration_s": 0.4} for i in range(8)]
    assert gc_overlap_ms(ranks, 10.0, 11.0) == pytest.approx(470.0)


def test_collections_are_not_compile_keys():
    from warmup.coverage.classes import aggregate

    records = [{"event": "gc", "generation": 2, "duration_s": 0.45, "phase": "serving"},
               {"event": "miss", "compiler": "triton", "kernel": {"name": "k"}, "hash": "h"}]
    assert [(k.name, k.compiled) for k in aggregate(records)] == [("k", 1)]
