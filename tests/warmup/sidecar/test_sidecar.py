"""warmup.sidecar (config, machine, projection): the readiness gate against a local stand-in of
SGLang's HTTP API (a real process, real HTTP), with faults: never healthy, dies mid-warm-up, HTTP
500/400, an error body with HTTP 200, hangs; the exit policy; the second pass with real Triton
compiles and sglang-warmup's real event hooks; SGLang's own managed-sidecar runner."""

from __future__ import annotations

import json
import multiprocessing
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "sidecar_support"))

from harness import (PLAN, PLAN_PROMPT_LENS, PLAN_REQUESTS, REPO, free_port, get,  # noqa: E402
                     start_standin, wait_until)

from warmup.observe import phase  # noqa: E402
from warmup.errors import SidecarError  # noqa: E402
from warmup.sidecar.config import SidecarConfig  # noqa: E402
from warmup.sidecar.machine import Sidecar  # noqa: E402
from warmup.sidecar.projection import Projection, project  # noqa: E402

PY = sys.executable


# --- fixtures -----------------------------------------------------------------------------------
@pytest.fixture(autouse=True)
def isolated(tmp_path, monkeypatch):
    """No WARMUP_* / Prometheus variables; Triton's cache in tmp; a reset phase."""
    for name in list(os.environ):
        if name.startswith("WARMUP_") or name in ("PROMETHEUS_MULTIPROC_DIR", "TRITON_CACHE_DIR"):
            monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton"))
    phase.reset()
    yield
    phase.reset()


@pytest.fixture
def standins():
    """Start stand-ins (``standins(*args, port=..., env=...)``); all are killed afterwards."""
    started = []

    def start(*args, **kwargs):
        s = start_standin(*args, **kwargs)
        started.append(s)
        return s

    yield start
    for s in started:
        s.kill()


@pytest.fixture
def sidecars():
    """Build and start sidecars with fast timings (``sidecars(url, **config)``); closed after."""
    started = []

    def start(url: str, **overrides) -> Sidecar:
        cfg = dict(plan=str(PLAN), url=url, port=0, host="127.0.0.1", deadline_s=10.0,
                   backoff_initial_s=0.05, backoff_max_s=0.2, probe_timeout_s=2.0,
                   watch_interval_s=0.2, watch_failures=2, request_timeout_s=5.0,
                   flush_timeout_s=2.0, flush_slack_s=1.0, progress_every_s=0.0)
        cfg.update(overrides)
        sc = Sidecar(SidecarConfig(**cfg))
        sc.start()
        started.append(sc)
        return sc

    yield start
    for sc in started:
        sc.close(join_s=10)


def base(sc: Sidecar) -> str:
    return f"http://127.0.0.1:{sc.port}"


def wait_state(sc: Sidecar, state: str, timeout: float = 20.0) -> dict:
    return wait_until(lambda: (lambda r: r if r[1]["state"] == state else None)(
        get(base(sc) + "/report")), timeout, f"state {state}")[1]


def mp_env(tmp_path: Path) -> tuple[dict[str, str], Path, Path]:
    """The environment SGLang runs with when it shares the sidecar's state directory."""
    state, mp = tmp_path / "state", tmp_path / "state" / "prometheus"
    mp.mkdir(parents=True)
    env = dict(os.environ, WARMUP_ENABLE="1", WARMUP_STATE_DIR=str(state),
               PROMETHEUS_MULTIPROC_DIR=str(mp))
    return env, state, mp


# --- the happy path ---------------------------------------------------------------------------
def test_ready_turns_200_after_the_warmup_and_reports_it(standins, sidecars):
    server = standins("--healthy-after", "1.0")
    sc = sidecars(server.url)
    status, body = get(base(sc) + "/ready")
    assert status == 503 and body["ready"] is False and body["state"] in ("starting", "waiting")
    assert get(base(sc) + "/live")[0] == 200

    report = wait_state(sc, "ready")
    status, body = get(base(sc) + "/ready")
    assert (status, body) == (200, {"ready": True, "state": "ready", "reason": None})

    # what reached the server: the plan's prompts once, one flush, after /health_generate
    stats = server.stats()
    assert sorted(stats["prompt_lens"]) == PLAN_PROMPT_LENS
    assert stats["flushes"] == 1
    assert stats["counts"]["/freeze_gc"] == 1  # on by default
    assert stats["counts"]["/health_generate"] >= 2  # 503 while starting, then 200
    assert stats["counts"]["/server_info"] == 1

    run = report["run"]
    assert run["ok"] is True and run["requests"] == PLAN_REQUESTS
    assert run["transport"] == "SidecarTransport"
    assert [c["shape_class"] for c in run["classes"]] == ["short_prompts", "concurrent_pair",
                                                          "batched"]
    assert run["flush"].startswith("Cache flushed.")
    assert report["expansion"] == {"steps": 5, "requests": 7, "classes": 3, "skipped": 0,
                                   "digest": run["expansion_digest"], "passes": 1}
    assert report["attempt"] == 1 and report["reason"] is None
    assert report["projection"]["done"] == report["projection"]["total"] == 7
    states = [e["state"] for e in report["timeline"]]
    assert states[0] == "waiting" and "warming" in states and states[-1] == "ready"
    assert report["timeline"][-1]["message"].startswith("ready: /ready answers 200 (warm-up ")

    status, text = get(base(sc) + "/metrics")
    assert status == 200
    assert "sglang_warmup_sidecar_ready 1.0" in text
    assert 'sglang_warmup_sidecar_state{state="ready"} 1.0' in text
    assert 'sglang_warmup_sidecar_runs_total{outcome="ok"} 1.0' in text
    assert 'sglang_warmup_sidecar_requests_total{outcome="ok"} 7.0' in text
    assert "sglang_warmup_sidecar_warmup_seconds " in text
    # the in-process phase went warmup -> serving (no state directory configured)
    assert phase.current().phase == "serving"
    assert get(base(sc) + "/nope")[0] == 404


@pytest.mark.parametrize("code", [200, 500])
def test_freeze_gc_runs_once_warm_and_a_refusal_only_warns(standins, sidecars, code):
    server = standins("--freeze-status", str(code))
    sc = sidecars(server.url, freeze_gc=True)
    report = wait_state(sc, "ready")
    assert server.stats()["counts"]["/freeze_gc"] == 1 and report["freeze_gc"] is True
    messages = [e["message"] for e in report["timeline"]]
    expected = ("garbage collector frozen (POST /freeze_gc)" if code == 200 else
                "freezing the garbage collector failed: /freeze_gc answered HTTP 500: "
                "Internal Server Error")
    assert expected in messages
    assert messages.index(expected) < len(messages) - 1 and messages[-1].startswith("ready: ")


def test_the_startup_budget_projection_is_logged(standins, sidecars, caplog):
    server = standins()
    with caplog.at_level("INFO", logger="sglang_warmup.sidecar"):
        sc = sidecars(server.url, startup_budget_s=600.0)
        wait_state(sc, "ready")
    lines = [r.getMessage() for r in caplog.records]
    assert any(re.fullmatch(r"sglang-warmup sidecar: warming plan sidecar_test: 5 steps, 7 "
                            r"requests, 3 classes \(x1 pass\); startup budget 600 s, \d+ s left",
                            m) for m in lines), lines
    assert any(re.fullmatch(r"sglang-warmup sidecar: 7/7 requests in [\d.]+ s; projected finish "
                            r"in 0 s at \d\d:\d\d:\d\d, \d+ s inside the startup budget "
                            r"\(ends \d\d:\d\d:\d\d\)", m) for m in lines), lines
    assert any(re.match(r"sglang-warmup sidecar: attempt 1: waiting for http://127\.0\.0\.1:\d+/"
                        r"health_generate, deadline 10 s \(until \d\d:\d\d:\d\d\)", m)
               for m in lines), lines


# --- faults -------------------------------------------------------------------------------------
def test_a_server_that_never_becomes_healthy_fails_at_the_deadline(standins, sidecars):
    server = standins("--never-healthy")
    t0 = time.monotonic()
    sc = sidecars(server.url, deadline_s=1.5)
    report = wait_state(sc, "failed", timeout=10)
    assert time.monotonic() - t0 < 6
    assert re.fullmatch(rf"the server at {re.escape(server.url)} was not healthy within 1\.5 s "
                        r"\(\d+ probes of /health_generate; last: HTTP 503\)", report["reason"])
    assert report["hint"] == "check the server's log; raise --deadline if its start takes longer"
    status, body = get(base(sc) + "/ready")
    assert status == 503 and body["state"] == "failed" and body["reason"] == report["reason"]
    assert server.stats()["counts"].get("/generate") is None
    assert "sglang_warmup_sidecar_ready 0.0" in get(base(sc) + "/metrics")[1]


def test_nothing_listening_is_reported_as_connection_refused(sidecars):
    url = f"http://127.0.0.1:{free_port()}"
    sc = sidecars(url, deadline_s=0.5)
    report = wait_state(sc, "failed", timeout=10)
    assert report["reason"].endswith("last: connection refused)")


def test_a_server_dying_mid_warmup_keeps_ready_503_then_rewarms_after_its_restart(
        standins, sidecars):
    server = standins("--die-at", "3")
    sc = sidecars(server.url)
    report = wait_state(sc, "failed")
    assert re.fullmatch(
        r"warm-up failed: warm-up request failed: class short_prompts, step 2 \(single: 100 "
        r"tokens \(other\)\): POST http://127\.0\.0\.1:\d+/generate failed: Remote end closed "
        r"connection without response", report["reason"]), report["reason"]
    assert report["run"]["ok"] is False and report["run"]["failures"]
    assert get(base(sc) + "/ready")[0] == 503
    server.proc.wait(10)
    # the same server comes back on the same port: the sidecar warms it and turns ready
    again = standins(port=server.port)
    report = wait_state(sc, "ready", timeout=30)
    assert report["attempt"] == 2 and report["run"]["ok"] is True
    assert sorted(again.stats()["prompt_lens"]) == PLAN_PROMPT_LENS
    messages = [e["message"] for e in report["timeline"]]
    assert "the server answers again; starting a new attempt" in messages


@pytest.mark.parametrize("code", [500, 400])
def test_an_error_status_on_generate_fails_the_warmup_without_retrying(standins, sidecars, code):
    server = standins("--generate-status", str(code), "--fail-at", "2")
    sc = sidecars(server.url)
    report = wait_state(sc, "failed")
    assert report["reason"] == (
        f"warm-up failed: warm-up request failed: class short_prompts, step 1 (single: 16 tokens "
        f"(div16)): /generate answered HTTP {code}: "
        f'{{"error": {{"message": "injected HTTP {code} on /generate #2"}}}}')
    assert report["hint"] == "fix the server or the plan; --lenient warns and goes on"
    time.sleep(1.0)  # a server that stays up is not hammered: no retry until it restarts
    assert server.stats()["counts"]["/generate"] == 2
    assert get(base(sc) + "/ready")[0] == 503


def test_an_error_body_with_http_200_fails_the_warmup_with_the_text_made_printable(
        standins, sidecars):
    # a proxy in front of SGLang answers 200 with {"error": ...}; its text carries a terminal
    # escape and a carriage return, which must not reach the log or the reason raw
    server = standins("--generate-error", "upstream overloaded\x1b[31m\rretry later",
                      "--fail-at", "3")
    sc = sidecars(server.url)
    report = wait_state(sc, "failed")
    assert report["reason"] == (
        "warm-up failed: warm-up request failed: class short_prompts, step 2 (single: 100 tokens "
        "(other)): /generate answered an error: upstream overloaded\\x1b[31m retry later")
    assert report["hint"] == "fix the server or the plan; --lenient warns and goes on"
    assert report["run"]["ok"] is False
    assert report["counts"]["requests_ok"] == 2 and report["counts"]["requests_failed"] == 1
    assert get(base(sc) + "/ready")[0] == 503
    assert 'sglang_warmup_sidecar_requests_total{outcome="failed"} 1.0' in get(
        base(sc) + "/metrics")[1]


@pytest.mark.parametrize("code,text", [
    (400, "Cache not flushed. Please check for pending requests. (There are running or waiting "
          "requests.)"),
    (500, "Internal Server Error")])
def test_a_failed_flush_fails_the_warmup(standins, sidecars, code, text):
    server = standins("--flush-status", str(code))
    sc = sidecars(server.url)
    report = wait_state(sc, "failed")
    assert report["reason"] == (f"warm-up failed: warm-up sidecar_test: cache flush failed: "
                                f"/flush_cache answered HTTP {code}: {text}")
    assert server.stats()["counts"]["/generate"] == 6  # every request went through first


@pytest.mark.parametrize("path,expected", [
    ("/generate", r"warm-up failed: warm-up request failed: class short_prompts, step 0 "
                  r"\(single: 1 tokens \(1\)\): POST http://127\.0\.0\.1:\d+/generate failed: "
                  r"timed out"),
    ("/flush_cache", r"warm-up failed: warm-up sidecar_test: cache flush failed: POST "
                     r"http://127\.0\.0\.1:\d+/flush_cache\?timeout=0\.5 failed: timed out"),
    ("/server_info", r"reading the server's settings failed: GET http://127\.0\.0\.1:\d+/"
                     r"server_info failed: timed out"),
])
def test_a_hanging_server_is_bounded_by_the_timeouts(standins, sidecars, path, expected):
    server = standins("--hang", path)
    t0 = time.monotonic()
    sc = sidecars(server.url, request_timeout_s=1.0, flush_timeout_s=0.5, flush_slack_s=0.5,
                  probe_timeout_s=0.5)
    report = wait_state(sc, "failed", timeout=20)
    assert time.monotonic() - t0 < 10
    assert re.fullmatch(expected, report["reason"]), report["reason"]
    assert get(base(sc) + "/ready")[0] == 503


def test_a_hanging_health_endpoint_is_bounded_by_the_deadline(standins, sidecars):
    server = standins("--hang", "/health_generate")
    t0 = time.monotonic()
    sc = sidecars(server.url, deadline_s=1.5, probe_timeout_s=0.4)
    report = wait_state(sc, "failed", timeout=10)
    assert time.monotonic() - t0 < 5
    assert re.search(r"last: no answer within 0\.\d+ s\)$", report["reason"]), report["reason"]


def test_a_server_going_away_after_ready_turns_ready_503_until_it_is_warm_again(
        standins, sidecars, tmp_path):
    state = tmp_path / "state"
    server = standins()
    sc = sidecars(server.url, state_dir=str(state))
    wait_state(sc, "ready")
    assert phase.current(state_dir=state).phase == "serving"
    server.kill()
    report = wait_state(sc, "waiting", timeout=10)
    assert report["reason"] == "the server stopped answering /health; the warm-up runs again when it is back"
    assert get(base(sc) + "/ready")[0] == 503
    assert phase.current(state_dir=state).phase == "init"  # a new server's init is not serving
    standins(port=server.port)
    report = wait_state(sc, "ready", timeout=30)
    assert report["attempt"] == 2


# --- the exit policy (the real command line) ------------------------------------------------------
def _sidecar_cli(url: str, *extra: str, tmp_path: Path) -> subprocess.Popen:
    log = open(tmp_path / "sidecar.log", "w")
    return subprocess.Popen([PY, "-m", "warmup", "sidecar", "--plan", str(PLAN), "--url", url,
                             "--port", "0", "--host", "127.0.0.1", *extra],
                            stdout=log, stderr=subprocess.STDOUT, cwd=str(REPO))


def test_exit_on_failure_exits_1_with_the_reason(standins, tmp_path):
    server = standins("--never-healthy")
    proc = _sidecar_cli(server.url, "--deadline", "1", "--exit-on-failure", tmp_path=tmp_path)
    assert proc.wait(30) == 1
    log = (tmp_path / "sidecar.log").read_text()
    assert re.search(rf"ERROR sglang-warmup sidecar: warm-up FAILED: the server at "
                     rf"{re.escape(server.url)} was not healthy within 1 s \(\d+ probes of "
                     r"/health_generate; last: HTTP 503\)", log), log
    assert "sglang-warmup sidecar: exiting with status 1 (--exit-on-failure)" in log
    assert re.search(rf"\nerror: the warm-up failed and --exit-on-failure is set: the server at "
                     rf"{re.escape(server.url)} was not healthy within 1 s \(\d+ probes of "
                     r"/health_generate; last: HTTP 503\)\nhint: check the server's log; raise "
                     r"--deadline if its start takes longer\n$", log), log


def test_stay_keeps_serving_503_and_sigterm_exits_0(standins, tmp_path):
    server = standins("--generate-status", "500")
    proc = _sidecar_cli(server.url, "--deadline", "5", "--stay", tmp_path=tmp_path)
    try:
        log_path = tmp_path / "sidecar.log"
        port = int(wait_until(lambda: re.search(r"on http://127\.0\.0\.1:(\d+)",
                                                log_path.read_text()), 20, "the port").group(1))
        url = f"http://127.0.0.1:{port}"
        wait_until(lambda: get(url + "/report")[1]["state"] == "failed", 20, "failure")
        time.sleep(0.5)
        assert proc.poll() is None  # it stays
        assert get(url + "/ready")[0] == 503
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(15) == 0
        assert "sglang-warmup sidecar: SIGTERM received; stopping" in log_path.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()


def test_bad_options_are_refused_before_anything_starts(tmp_path):
    out = subprocess.run([PY, "-m", "warmup", "sidecar", "--plan", str(PLAN), "--url",
                          "localhost:30000"], capture_output=True, text=True, cwd=str(REPO))
    assert out.returncode == 1
    assert out.stderr.splitlines()[-2:] == [
        "error: --url 'localhost:30000' is not an http(s) URL",
        "hint: the SGLang server's base URL, e.g. --url http://127.0.0.1:30000"]


def test_a_busy_port_is_refused(standins):
    server = standins()
    sc = Sidecar(SidecarConfig(plan=str(PLAN), url=server.url, port=server.port, host="127.0.0.1"))
    with pytest.raises(SidecarError) as info:
        sc.start()
    assert info.value.message == f"cannot listen on 127.0.0.1:{server.port}: Address already in use"
    assert info.value.hint == "choose another --port (0: any free port) or --host"


# --- the second pass ----------------------------------------------------------------------------
def test_second_pass_is_refused_at_start_without_a_shared_state_directory():
    cfg = SidecarConfig(plan=str(PLAN), url="http://127.0.0.1:30000", second_pass=True)
    with pytest.raises(SidecarError) as info:
        cfg.check()
    assert info.value.message == (
        "--second-pass cannot be verified: the sidecar shares no state directory with SGLang, "
        "so it cannot see the compile misses of the SGLang processes")
    assert info.value.hint.startswith("run SGLang with WARMUP_ENABLE=1 and WARMUP_STATE_DIR=DIR")


def test_second_pass_with_real_compiles_turns_ready_on_zero_misses(standins, sidecars, tmp_path):
    env, state, mp = mp_env(tmp_path)
    server = standins("--compile", env=env)
    sc = sidecars(server.url, state_dir=str(state), mp_dir=str(mp), second_pass=True)
    report = wait_state(sc, "ready", timeout=60)
    check = report["second_pass_run"]["check"]
    assert check["verified"] is True and check["misses"] == 0 and check["source"] == "compile_log"
    # the first pass compiled three kernels (BLOCK 16, 64, 256), each stamped with its class
    assert server.stats()["compiled"] == [16, 256, 64]
    by_class = {c["shape_class"]: c for c in report["run"]["classes"]}
    assert {k: (c["compiles"], c["kernels"]) for k, c in by_class.items()} == {
        "short_prompts": (2, ["standin_add"]), "concurrent_pair": (1, ["standin_add"]),
        "batched": (0, [])}
    assert report["run"]["compiles_by_phase"] == {"warmup": 3}
    second = report["second_pass_run"]["report"]
    assert second["compiles_total"] == 0 and second["requests"] == PLAN_REQUESTS
    cov = report["second_pass_run"]["coverage"]
    # no compile left; each class's first hit timed against its repeat (reported, not gated)
    assert cov["open_classes"] == [] and cov["closed"] is (cov["slow_classes"] == [])
    assert all(c["latency"]["repeat_ms"] > 0 for c in cov["classes"])
    # the second pass sends each step twice: its first hit, then the repeat
    assert sorted(server.stats()["prompt_lens"]) == sorted(PLAN_PROMPT_LENS * 3)
    assert server.stats()["flushes"] == 2
    assert phase.current(state_dir=state).phase == "serving"
    text = get(base(sc) + "/metrics")[1]
    # the stand-in's (SGLang's) compile events, aggregated from the multiprocess directory
    assert ('sglang_warmup_compile_events_total{compiler="triton",outcome="miss",phase="warmup"}'
            ' 3.0') in text
    assert "sglang_warmup_sidecar_second_pass_misses 0.0" in text
    assert 'sglang_warmup_sidecar_requests_total{outcome="ok"} 14.0' in text


def test_second_pass_misses_keep_ready_503_and_name_the_kernels(standins, sidecars, tmp_path):
    env, state, mp = mp_env(tmp_path)
    server = standins("--compile", "--drift-after-flush", env=env)
    sc = sidecars(server.url, state_dir=str(state), mp_dir=str(mp), second_pass=True)
    report = wait_state(sc, "failed", timeout=60)
    assert report["reason"] == (
        "the second pass compiled 3 kernel(s) (from the compile log): short_prompts: standin_add "
        "(triton); short_prompts: standin_add (triton); concurrent_pair: standin_add (triton)")
    assert report["hint"].startswith("the plan does not reproduce its own shapes")
    assert report["second_pass_run"]["coverage"]["open_classes"] == ["short_prompts",
                                                                     "concurrent_pair"]
    assert get(base(sc) + "/ready")[0] == 503
    assert "sglang_warmup_sidecar_second_pass_misses 3.0" in get(base(sc) + "/metrics")[1]


def test_second_pass_from_metrics_alone(standins, sidecars, tmp_path):
    # SGLang shares only the Prometheus directory: misses are read from its counters
    env, state, mp = mp_env(tmp_path)
    env["WARMUP_STATE_DIR"] = str(tmp_path / "sglang-only-state")
    server = standins("--compile", "--drift-after-flush", env=env)
    sc = sidecars(server.url, state_dir=str(state), mp_dir=str(mp), second_pass=True)
    report = wait_state(sc, "failed", timeout=60)
    assert report["reason"] == "the second pass compiled 3 kernel(s) (from the metrics)"


def test_second_pass_that_sees_nothing_shared_cannot_verify(standins, sidecars, tmp_path):
    state = tmp_path / "state"
    server = standins()  # writes no compile log and no metrics
    sc = sidecars(server.url, state_dir=str(state), mp_dir=str(state / "prometheus"),
                  second_pass=True)
    report = wait_state(sc, "failed")
    assert report["reason"] == (
        f"--second-pass cannot be verified: no compile log under {state}/compile_log; no "
        f"sglang-warmup compile metrics in {state}/prometheus")


# --- SGLang's managed sidecar ----------------------------------------------------------------------
def test_runs_as_sglangs_managed_sidecar_and_stops_cleanly(standins, tmp_path, spawn_from_zygote):
    """SGLang 0.5.22's own runner (``_run_sidecar``: main(argv) in a spawned process, stopped
    with terminate()) drives ``warmup.cli.sidecar.main``."""
    from sglang.srt.entrypoints.sidecar import _parse_sidecar_args, _run_sidecar

    server = standins()
    port = free_port()
    sidecar_args = ["--plan", str(PLAN), "--url", server.url, "--port", str(port),
                    "--host", "127.0.0.1", "--sidecar-shutdown-timeout", "20"]
    args, shutdown_timeout = _parse_sidecar_args(sidecar_args)  # SGLang consumes its own flag
    assert shutdown_timeout == 20.0
    proc = multiprocessing.get_context("spawn").Process(
        target=_run_sidecar, args=("warmup.cli.sidecar", args, "127.0.0.1:1"))
    proc.start()
    try:
        wait_until(lambda: get(f"http://127.0.0.1:{port}/ready")[0] == 200, 90, "ready")
        proc.terminate()  # what Sidecar.stop() does
        proc.join(shutdown_timeout)
        assert proc.exitcode == 0  # SGLang's watchdog treats anything else as a crash
    finally:
        if proc.is_alive():
            proc.kill()


# --- pieces -----------------------------------------------------------------------------------------
def test_projection_from_the_rate_so_far(monkeypatch):
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    try:
        p = project(10, 40, 20.0, 100.0)
        assert (p.remaining_s, p.margin_s) == (60.0, 40.0)
        assert p.describe(now=0.0) == ("10/40 requests in 20.0 s; projected finish in 60 s at "
                                       "00:01:00, 40 s inside the startup budget (ends 00:01:40)")
        late = project(10, 40, 20.0, 30.0)
        assert late.describe(now=0.0) == ("10/40 requests in 20.0 s; projected finish in 60 s at "
                                          "00:01:00, 30 s PAST the startup budget (ends 00:00:30)")
        assert project(0, 40, 0.0, None).describe(now=0.0) == "0/40 requests in 0.0 s; no rate yet"
        assert project(5, 5, 2.0, None).to_dict() == {"done": 5, "total": 5, "elapsed_s": 2.0,
                                                      "remaining_s": 0.0, "budget_left_s": None,
                                                      "margin_s": None}
        assert isinstance(p, Projection)
    finally:
        monkeypatch.delenv("TZ")
        time.tzset()


def test_report_is_json_and_states_the_configuration(standins, sidecars):
    server = standins()
    sc = sidecars(server.url, startup_budget_s=120.0)
    report = wait_state(sc, "ready")
    json.dumps(report)
    assert {k: report[k] for k in ("url", "deadline_s", "startup_budget_s", "second_pass",
                                   "exit_on_failure")} == {
        "url": server.url, "deadline_s": 10.0, "startup_budget_s": 120.0, "second_pass": False,
        "exit_on_failure": False}
    assert report["plan"] == {"file": str(PLAN), "name": "sidecar_test"}
