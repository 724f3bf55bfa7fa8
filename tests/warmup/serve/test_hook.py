"""warmup.serve.hook: plans registered into SGLang 0.5.22's real ``--warmups`` registry and run by its
real ``execute_warmups`` (through our guard), against the TokenizerManager stand-in."""

from __future__ import annotations

import asyncio
import enum
import json
import logging
import multiprocessing
import sys
import time

import pytest

from warmup.serve import hook

#: SGLang's ``tokenizer_manager.ServerStatus`` (0.5.17 to 0.5.23: Up, Starting, UnHealthy); its
#: module imports fastapi, which the CPU profile does not install.
ServerStatus = enum.Enum("ServerStatus", ["Up", "Starting", "UnHealthy"])

from warmup.observe import phase  # noqa: E402 (after the stand-in above)
from warmup.errors import DriverError, PlanError, RegistrationError  # noqa: E402

pytestmark = pytest.mark.usefixtures("warmup_isolated")

SGLANG_BUILTINS = "prefill_shapes, voice_chat, whisper_autodetect"


@pytest.fixture
def sglang_warmups():
    """SGLang's warmup module, with its registry, ``execute_warmups`` and our module state
    restored afterwards."""
    from sglang.srt.entrypoints import warmup as w

    registry = dict(w._warmup_registry)
    execute = w.execute_warmups
    http = sys.modules.get("sglang.srt.entrypoints.http_server")
    http_execute = getattr(http, "execute_warmups", None)
    registered, failed = dict(hook._registered), list(hook._failed)
    hook._registered.clear()
    hook._failed.clear()
    yield w
    w._warmup_registry.clear()
    w._warmup_registry.update(registry)
    w.execute_warmups = execute
    if http is not None:
        http.execute_warmups = http_execute
    hook._registered.clear()
    hook._registered.update(registered)
    hook._failed[:] = failed


# --- registration ----------------------------------------------------------------------------------
def test_registering_a_plan_adds_it_to_sglangs_registry(sglang_warmups, tiny_plan_path):
    w = sglang_warmups
    original = w.execute_warmups
    assert hook.register(tiny_plan_path) == "tiny_plan"
    fn = w._warmup_registry["tiny_plan"]
    assert fn.__sglang_warmup__ is True and fn.__qualname__ == "sglang_warmup[tiny_plan]"
    assert hook.registered() == {"tiny_plan": str(tiny_plan_path)}
    # SGLang's built-ins stay; the guard now wraps SGLang's execute_warmups, once
    assert {"prefill_shapes", "voice_chat", "whisper_autodetect"} < set(w._warmup_registry)
    assert w.execute_warmups.__sglang_warmup_guard__ is True
    assert w.execute_warmups.__wrapped__ is original
    hook.guard_execute_warmups()
    assert w.execute_warmups.__wrapped__ is original


def test_registering_under_another_name(sglang_warmups, tiny_plan_path):
    assert hook.register(tiny_plan_path, name="prod_shapes") == "prod_shapes"
    assert "prod_shapes" in sglang_warmups._warmup_registry
    assert "tiny_plan" not in sglang_warmups._warmup_registry
    # registering again (e.g. a second plugin call) replaces our own entry
    assert hook.register(tiny_plan_path, name="prod_shapes") == "prod_shapes"


def test_a_name_taken_by_sglang_is_refused(sglang_warmups, tiny_plan_path):
    builtin = sglang_warmups._warmup_registry["prefill_shapes"]
    with pytest.raises(RegistrationError) as err:
        hook.register(tiny_plan_path, name="prefill_shapes")
    assert err.value.message == ("--warmups name 'prefill_shapes' is already taken by SGLang's "
                                 "sglang.srt.entrypoints.warmup.prefill_shapes")
    assert err.value.hint == "rename the plan (its `name:`) or set WARMUP_NAME"
    assert sglang_warmups._warmup_registry["prefill_shapes"] is builtin


def test_a_bad_plan_path_fails_with_the_plan_error(sglang_warmups, tmp_path):
    before = dict(sglang_warmups._warmup_registry)
    missing = tmp_path / "missing.yaml"
    with pytest.raises(PlanError) as err:
        hook.register(missing)
    assert (err.value.message, err.value.hint) == (f"{missing}: cannot read plan: No such file or directory",
                                                   "check the path")
    bad = tmp_path / "bad.yaml"
    bad.write_text("version: 1\nname: bad\nphases: []\nbogus: 1\n")
    with pytest.raises(PlanError) as err:
        hook.register(bad)
    assert err.value.message.startswith(f"{bad}:")
    assert sglang_warmups._warmup_registry == before and hook.registered() == {}


# --- the guard around SGLang's execute_warmups ----------------------------------------------------------
def test_the_guard_raises_for_an_unknown_name(sglang_warmups, fake_tokenizer_manager):
    hook.guard_execute_warmups()
    tm = fake_tokenizer_manager()
    with pytest.raises(RegistrationError) as err:
        asyncio.run(sglang_warmups.execute_warmups("null", ["nope"], tm))
    assert err.value.message == f"--warmups lists nope, which no plugin registered (known: {SGLANG_BUILTINS})"
    assert err.value.hint == "set WARMUP_ENABLE=1 and WARMUP_PLAN, or launch with `sglang-warmup serve`"
    assert tm.objs == []


def test_the_guard_raises_for_a_registered_plan_missing_from_warmups(sglang_warmups, tiny_plan_path,
                                                                     fake_tokenizer_manager):
    hook.register(tiny_plan_path)
    tm = fake_tokenizer_manager()
    with pytest.raises(RegistrationError) as err:
        asyncio.run(sglang_warmups.execute_warmups("null", [""], tm))
    assert err.value.message == ("plan(s) tiny_plan registered but not listed in --warmups; the server "
                                 "would start cold")
    assert err.value.hint == "add --warmups tiny_plan"
    assert tm.objs == []


def test_sglang_runs_the_registered_plan(sglang_warmups, tiny_plan_path, fake_tokenizer_manager,
                                         warmup_isolated, tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("WARMUP_REPORT", str(tmp_path / "reports" / "run.json"))
    hook.register(tiny_plan_path)
    tm = fake_tokenizer_manager(state_dir=str(warmup_isolated))
    with caplog.at_level(logging.INFO):
        # exactly what SGLang's lifespan does: "--warmups tiny_plan" split on commas
        asyncio.run(sglang_warmups.execute_warmups("null", " tiny_plan".split(","), tm))
    messages = [r.getMessage() for r in caplog.records]
    assert "Running warmup tiny_plan" in messages  # SGLang's own log line
    assert "sglang-warmup: tiny_plan: 18 steps, 28 requests (0 items skipped by the expansion)" in messages
    report = json.loads((tmp_path / "reports" / "run.json").read_text())
    assert report["ok"] is True and report["requests"] == 28 == len(tm.items)
    assert report["flush"] == "flushed on 1 rank(s)"
    assert report["facts"]["max_total_tokens"] == 20000
    assert json.loads((warmup_isolated / "report.json").read_text()) == report
    assert phase.current(state_dir=str(warmup_isolated)).phase == "serving"


def test_sglang_runs_the_plan_with_the_environment_settings(sglang_warmups, tiny_plan_path,
                                                            fake_tokenizer_manager, monkeypatch):
    monkeypatch.setenv("WARMUP_FLUSH_TIMEOUT_S", "7.5")
    monkeypatch.setenv("WARMUP_SEED", "s1")
    hook.register(tiny_plan_path)
    first = fake_tokenizer_manager()
    asyncio.run(sglang_warmups.execute_warmups("null", ["tiny_plan"], first))
    second = fake_tokenizer_manager()
    asyncio.run(sglang_warmups.execute_warmups("null", ["tiny_plan"], second))
    assert [r.timeout_s for r in first.flush_requests] == [7.5]
    assert [i.input_ids for i in first.items if not i.stream] == [i.input_ids for i in second.items
                                                                  if not i.stream]
    monkeypatch.setenv("WARMUP_SEED", "s2")
    third = fake_tokenizer_manager()
    asyncio.run(sglang_warmups.execute_warmups("null", ["tiny_plan"], third))
    assert third.items[0].input_ids != first.items[0].input_ids


def test_the_gc_is_frozen_after_the_warmup_and_its_flush(sglang_warmups, tiny_plan_path,
                                                        fake_tokenizer_manager, monkeypatch, caplog):
    # SGLang 0.5.17 (the GPU image's) has no freeze of its own after its warm-up request.
    monkeypatch.setattr(hook, "sglang_freezes_after_warmup", lambda: False)
    hook.register(tiny_plan_path)
    monkeypatch.setenv("WARMUP_FREEZE_GC", "0")
    tm = fake_tokenizer_manager()
    asyncio.run(sglang_warmups.execute_warmups("null", ["tiny_plan"], tm))
    assert tm.gc_frozen_after is None  # turned off
    monkeypatch.delenv("WARMUP_FREEZE_GC")  # on by default
    tm = fake_tokenizer_manager()
    with caplog.at_level(logging.INFO):
        asyncio.run(sglang_warmups.execute_warmups("null", ["tiny_plan"], tm))
    assert tm.gc_frozen_after == len(tm.events) and tm.events_at_flush <= tm.gc_frozen_after
    assert ("sglang-warmup: garbage collector frozen (tokenizer manager, schedulers, detokenizer)"
            in [r.getMessage() for r in caplog.records])

    async def broken() -> None:
        raise RuntimeError("scheduler gone")

    tm = fake_tokenizer_manager()
    tm.freeze_gc = broken
    caplog.clear()
    with caplog.at_level(logging.INFO):
        asyncio.run(sglang_warmups.execute_warmups("null", ["tiny_plan"], tm))  # still starts
    assert ("sglang-warmup: freezing the garbage collector failed: scheduler gone"
            in [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING])


def test_an_sglang_that_freezes_after_its_own_warmup_is_left_to_it(sglang_warmups, tiny_plan_path,
                                                                  fake_tokenizer_manager, caplog,
                                                                  monkeypatch):
    # The pinned SGLang freezes in http_server._freeze_gc_after_server_warmup, after its own
    # warm-up request (which runs after ours): freezing here would be done twice.  The full
    # collection still runs here, so that SGLang's freeze keeps what is alive, not garbage.
    assert hook.sglang_freezes_after_warmup()
    collections: list[int] = []
    real_collect = hook.gc.collect
    monkeypatch.setattr(hook.gc, "collect", lambda *a: collections.append(1) or real_collect(*a))
    hook.register(tiny_plan_path)
    tm = fake_tokenizer_manager()
    with caplog.at_level(logging.INFO):
        asyncio.run(sglang_warmups.execute_warmups("null", ["tiny_plan"], tm))
    assert tm.gc_frozen_after is None and collections == [1]
    assert any("SGLang freezes the garbage collector after its own warm-up request" in r.getMessage()
               for r in caplog.records)


def test_the_phase_turns_serving_when_sglang_is_up_not_when_the_plan_ends(
        sglang_warmups, tiny_plan_path, fake_tokenizer_manager, warmup_isolated):
    # SGLang sends its own warm-up request after the --warmups entries; a kernel it compiles is
    # compiled before ready, so the phase stays warmup until the tokenizer manager says Up.
    from warmup.serve.driver import AFTER_PLAN

    hook.register(tiny_plan_path)
    tm = fake_tokenizer_manager()
    tm.server_status = ServerStatus.Starting
    asyncio.run(sglang_warmups.execute_warmups("null", ["tiny_plan"], tm))
    state = phase.current(state_dir=str(warmup_isolated))
    assert (state.phase, state.shape_class) == ("warmup", AFTER_PLAN)
    tm.server_status = ServerStatus.Up  # SGLang's own warm-up request answered
    deadline = time.monotonic() + 10
    while phase.current(state_dir=str(warmup_isolated)).phase != "serving":
        assert time.monotonic() < deadline, "the phase never turned serving"
        time.sleep(0.02)


def test_serving_when_up_marks_at_once_without_a_status_and_waits_through_unhealthy(
        monkeypatch):
    marks: list[str] = []
    assert hook.serving_when_up(object(), lambda: marks.append("now")) is None
    assert marks == ["now"]

    class Starting:
        server_status = ServerStatus.Starting

    monkeypatch.setenv("SGLANG_RUST_SERVER", "1")   # SGLang never sets the status there
    assert hook.serving_when_up(Starting(), lambda: None) is None
    monkeypatch.delenv("SGLANG_RUST_SERVER")

    class Tm:
        server_status = ServerStatus.UnHealthy       # a PD warm-up that failed

    thread = hook.serving_when_up(Tm(), lambda: marks.append("up"), poll_s=0.01, limit_s=30)
    time.sleep(0.1)
    assert thread.is_alive() and marks == ["now"]   # still waiting
    Tm.server_status = ServerStatus.Up              # a later health check brought it up
    thread.join(5)
    assert not thread.is_alive() and marks == ["now", "up"]
    Tm.server_status = ServerStatus.Starting
    thread = hook.serving_when_up(Tm(), lambda: marks.append("late"), poll_s=0.01, limit_s=0.05)
    thread.join(5)
    assert marks == ["now", "up", "late"]           # past the limit the phase turns serving anyway


def test_the_wait_follows_sglangs_warmup_timeout(monkeypatch):
    monkeypatch.delenv("SGLANG_WARMUP_TIMEOUT", raising=False)
    assert hook.ready_wait_s() == 1800 + hook.READY_SLACK_S
    monkeypatch.setenv("SGLANG_WARMUP_TIMEOUT", "3600")
    assert hook.ready_wait_s() == 3600 + hook.READY_SLACK_S
    monkeypatch.setenv("SGLANG_WARMUP_TIMEOUT", "soon")
    assert hook.ready_wait_s() == 1800 + hook.READY_SLACK_S


def test_a_failed_warmup_fails_sglangs_startup(sglang_warmups, tiny_plan_path, fake_tokenizer_manager,
                                               warmup_isolated):
    hook.register(tiny_plan_path)
    tm = fake_tokenizer_manager()
    tm.faults[37] = "abort"
    with pytest.raises(DriverError) as err:
        asyncio.run(sglang_warmups.execute_warmups("null", ["tiny_plan"], tm))
    assert err.value.message.startswith("warm-up request failed: class extends, step 2 ")
    report = json.loads((warmup_isolated / "report.json").read_text())
    assert report["ok"] is False and len(report["failures"]) == 1


def test_lenient_from_the_environment(sglang_warmups, tiny_plan_path, fake_tokenizer_manager,
                                      warmup_isolated, monkeypatch):
    monkeypatch.setenv("WARMUP_LENIENT", "1")
    hook.register(tiny_plan_path)
    tm = fake_tokenizer_manager()
    tm.faults[37] = "abort"
    asyncio.run(sglang_warmups.execute_warmups("null", ["tiny_plan"], tm))
    report = json.loads((warmup_isolated / "report.json").read_text())
    assert report["ok"] is False and report["requests"] == 28


def test_pd_disaggregation_from_sglang_skips_the_plan(sglang_warmups, tiny_plan_path, fake_tokenizer_manager,
                                                      warmup_isolated):
    hook.register(tiny_plan_path)
    tm = fake_tokenizer_manager()
    asyncio.run(sglang_warmups.execute_warmups("decode", ["tiny_plan"], tm))
    report = json.loads((warmup_isolated / "report.json").read_text())
    assert report["skipped_reason"] == "PD disaggregation (decode): warm-up requests would need a bootstrap peer"
    assert tm.objs == [] and tm.flush_requests == []


def test_a_runner_decides_how_the_plan_runs_and_what_is_written(sglang_warmups, tiny_plan_path,
                                                                fake_tokenizer_manager,
                                                                warmup_isolated, caplog):
    """The hook runs the plan with the runner it was given (the layer above it measures
    around the driver's report) and writes the runner's document; the log shows the report."""
    from dataclasses import dataclass

    from warmup.serve.report import RunReport

    @dataclass(frozen=True)
    class Measured:
        run: RunReport
        note: str

        def to_dict(self):
            return {**self.run.to_dict(), "note": self.note}

    seen = []

    async def runner(driver, exp):
        seen.append((type(driver).__name__, exp.plan))
        return Measured(await driver.run(exp), "measured around the report")

    hook.register(tiny_plan_path, runner=runner, describe=lambda r: f"described {r.plan}\nline 2")
    tm = fake_tokenizer_manager()
    with caplog.at_level(logging.INFO):
        asyncio.run(sglang_warmups.execute_warmups("null", ["tiny_plan"], tm))
    assert seen == [("Driver", "tiny_plan")]
    report = json.loads((warmup_isolated / "report.json").read_text())
    assert report["note"] == "measured around the report"
    assert report["ok"] is True and report["requests"] == 28
    messages = [r.getMessage() for r in caplog.records]
    assert ["described tiny_plan", "line 2"] == [m for m in messages
                                                 if m in ("described tiny_plan", "line 2")]


def test_the_plugin_hands_the_second_pass_to_the_hook(sglang_warmups, tiny_plan_path,
                                                     fake_tokenizer_manager, warmup_isolated,
                                                     monkeypatch, caplog):
    """WARMUP_SECOND_PASS=1: the plugin wires warmup.coverage.second_pass into the hook (which
    imports nothing above it); the report gets the coverage, the plan is sent twice.  The log
    lines are the view's text of the run report and of the coverage (the hook and the second
    pass render nothing themselves)."""
    from warmup.serve import plugin

    monkeypatch.setenv("WARMUP_PLAN", str(tiny_plan_path))
    monkeypatch.setenv("WARMUP_SECOND_PASS", "1")
    monkeypatch.setattr(sys, "argv", ["sglang.launch_server", "--model-path", "/models/m"])
    plugin._register_plan()
    tm = fake_tokenizer_manager()
    with caplog.at_level(logging.INFO):
        asyncio.run(sglang_warmups.execute_warmups("null", ["tiny_plan"], tm))
    messages = [r.getMessage() for r in caplog.records]
    assert any(m.startswith("warm-up tiny_plan: ok, 28 requests in ") for m in messages), messages
    assert any(m.startswith("compiled after ready: not measured") for m in messages)
    assert any(m.startswith("plan tiny_plan ") and "closed" in m for m in messages), messages
    report = json.loads((warmup_isolated / "report.json").read_text())
    # the first replay sends the plan once, the second twice (each step's first hit, repeat)
    assert report["ok"] is True and report["requests"] == 28 and len(tm.items) == 84
    assert report["coverage"]["plan"] == "tiny_plan" and report["coverage"]["closed"] is True
    assert (warmup_isolated / "coverage.json").exists()
    assert len(tm.flush_requests) == 2


# --- from the environment (the plugin's step) --------------------------------------------------------
def test_register_from_env_registers_and_lists_the_plan(sglang_warmups, tiny_plan_path, monkeypatch):
    monkeypatch.setenv("WARMUP_PLAN", str(tiny_plan_path))
    monkeypatch.setattr(sys, "argv", ["sglang.launch_server", "--model-path", "/models/m"])
    assert hook.register_from_env() == "tiny_plan"
    assert sys.argv == ["sglang.launch_server", "--model-path", "/models/m", "--warmups", "tiny_plan"]
    assert "tiny_plan" in sglang_warmups._warmup_registry


def test_register_from_env_does_nothing_without_a_plan(sglang_warmups, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["sglang.launch_server", "--model-path", "/models/m"])
    assert hook.register_from_env() is None
    assert sys.argv == ["sglang.launch_server", "--model-path", "/models/m"]


def test_the_prs_launch_line_finds_the_shipped_plan_by_name(sglang_warmups, monkeypatch):
    """PR #44627's `--warmups deepseek_v4_serving_shapes` with WARMUP_ENABLE=1 and no
    WARMUP_PLAN: the shipped plan is registered under that name (SGLang alone would warn and
    start cold)."""
    monkeypatch.delenv("WARMUP_PLAN", raising=False)
    argv = ["sglang.launch_server", "--model-path", "/m", "--warmups",
            "deepseek_v4_serving_shapes"]
    monkeypatch.setattr(sys, "argv", list(argv))
    assert hook.register_from_env() == "deepseek_v4_serving_shapes"
    assert sys.argv == argv
    assert hook.registered()["deepseek_v4_serving_shapes"] == "deepseek_v4_serving_shapes"
    assert "deepseek_v4_serving_shapes" in sglang_warmups._warmup_registry


def test_a_shipped_plan_named_as_warmup_plan(sglang_warmups, monkeypatch):
    monkeypatch.setenv("WARMUP_PLAN", "default")
    monkeypatch.setattr(sys, "argv", ["sglang.launch_server", "--model-path", "/m"])
    assert hook.register_from_env() == "default"
    assert sys.argv[-2:] == ["--warmups", "default"]


def test_register_from_env_with_a_bad_plan_fails_startup(sglang_warmups, tmp_path, monkeypatch,
                                                         fake_tokenizer_manager):
    missing = tmp_path / "missing.yaml"
    monkeypatch.setenv("WARMUP_PLAN", str(missing))
    monkeypatch.setattr(sys, "argv", ["sglang.launch_server", "--model-path", "/models/m"])
    with pytest.raises(PlanError):
        hook.register_from_env()
    # a name is listed anyway, so SGLang calls execute_warmups and the guard stops the startup
    assert sys.argv[-2:] == ["--warmups", "sglang_warmup"]
    with pytest.raises(RegistrationError) as err:
        asyncio.run(sglang_warmups.execute_warmups("null", ["sglang_warmup"], fake_tokenizer_manager()))
    assert err.value.message == (f"sglang-warmup could not register its plan: {missing}: cannot read plan: "
                                 "No such file or directory (check the path)")
    assert err.value.hint == "fix the plan (`sglang-warmup plan check`), then restart"


def _child_register_from_env(out) -> None:
    """Runs in a spawned child (like SGLang's schedulers): WARMUP_PLAN is inherited."""
    import os
    import sys as child_sys

    from warmup.serve import hook as child_hook

    before = list(child_sys.argv)
    result = child_hook.register_from_env()
    out.put({"result": result, "argv_changed": child_sys.argv != before,
             "plan": os.environ.get("WARMUP_PLAN"), "registered": child_hook.registered(),
             "sglang_imported": "sglang.srt.entrypoints.warmup" in child_sys.modules})


def test_register_from_env_does_nothing_in_a_spawned_child(tiny_plan_path, monkeypatch):
    monkeypatch.setenv("WARMUP_PLAN", str(tiny_plan_path))
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    child = ctx.Process(target=_child_register_from_env, args=(out,))
    child.start()
    got = out.get(timeout=60)
    child.join(30)
    assert child.exitcode == 0
    assert got == {"result": None, "argv_changed": False, "plan": str(tiny_plan_path), "registered": {},
                   "sglang_imported": False}


# --- ensure_listed ---------------------------------------------------------------------------------
@pytest.mark.parametrize("argv, changed, expected", [
    (["--model-path", "m"], True, ["--model-path", "m", "--warmups", "p"]),
    (["--model-path", "m", "--warmups", "a"], True, ["--model-path", "m", "--warmups", "a,p"]),
    (["--model-path=m", "--warmups=a,b"], True, ["--model-path=m", "--warmups=a,b,p"]),
    (["--model", "m", "--warmups", "p,a"], False, ["--model", "m", "--warmups", "p,a"]),
    (["--model-path", "m", "--warmups=a,p"], False, ["--model-path", "m", "--warmups=a,p"]),
    (["--model-path", "m", "--warmups", "a,,"], True, ["--model-path", "m", "--warmups", "a,p"]),
    (["-m", "pytest", "tests"], False, ["-m", "pytest", "tests"]),
    ([], False, []),
])
def test_ensure_listed(argv, changed, expected):
    argv = list(argv)
    assert hook.ensure_listed("p", argv) is changed
    assert argv == expected


def test_ensure_listed_keeps_the_warmups_of_a_config_file(tmp_path):
    """SGLang's --config YAML: a --warmups flag on the command line replaces the file's list, so
    the file's names are carried over; checked with SGLang's own parser."""
    from sglang.srt.server_args import prepare_server_args

    cfg = tmp_path / "server.yaml"
    cfg.write_text("model-path: /models/m\nwarmups: prefill_shapes\n")
    argv = ["--config", str(cfg)]
    assert hook.ensure_listed("p", argv) is True
    assert argv == ["--config", str(cfg), "--warmups", "prefill_shapes,p"]
    assert prepare_server_args(argv).warmups == "prefill_shapes,p"

    cfg.write_text("model-path: /models/m\nwarmups: p,prefill_shapes\n")
    argv = ["--config", str(cfg)]
    assert hook.ensure_listed("p", argv) is False and argv == ["--config", str(cfg)]
    assert prepare_server_args(argv).warmups == "p,prefill_shapes"

    cfg.write_text("model-path: /models/m\n")
    argv = ["--config", str(cfg)]
    assert hook.ensure_listed("p", argv) is True
    assert prepare_server_args(argv).warmups == "p"
