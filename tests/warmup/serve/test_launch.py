"""warmup.serve.launch / ``sglang-warmup serve``: the launch command and environment, the install checks,
and the ``python -m sglang.launch_server`` path through SGLang's real plugin loader."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from _interpreter import python

from warmup.serve import launch

from warmup.observe import phase
from warmup.cli import main
from warmup.errors import PlanError, WarmupError

pytestmark = pytest.mark.usefixtures("warmup_isolated")


# --- build() ------------------------------------------------------------------------------------------
def test_build_prepares_the_environment_and_the_command(tiny_plan_path, tmp_path):
    state = tmp_path / "run-state"
    spec = launch.plan_launch(str(tiny_plan_path), ["--model-path", "/models/m", "--tp", "2"],
                        report=str(tmp_path / "r.json"), state_dir=str(state),
                        environ={"PATH": "/usr/bin", "HOME": "/home/x"}, python="/venv/bin/python")
    assert spec.argv == ["/venv/bin/python", "-m", "sglang.launch_server", "--model-path", "/models/m", "--tp",
                         "2", "--warmups", "tiny_plan"]
    assert spec.name == "tiny_plan" and spec.state_dir == str(state.resolve())
    assert spec.env == {
        "PATH": "/usr/bin", "HOME": "/home/x",
        "WARMUP_ENABLE": "1",
        "WARMUP_PLAN": str(tiny_plan_path.resolve()),
        "WARMUP_NAME": "tiny_plan",
        "WARMUP_STATE_DIR": str(state.resolve()),
        "WARMUP_LENIENT": "0",
        "WARMUP_FREEZE_GC": "1",
        "WARMUP_REPORT": str((tmp_path / "r.json").resolve()),
        "PROMETHEUS_MULTIPROC_DIR": str(state.resolve() / "prometheus"),
    }
    assert not state.exists()  # planning writes nothing (serve --dry-run)
    launch.prepare_state_dir(spec)
    assert (state / "prometheus").is_dir()
    # a reused state directory starts over at "init"
    assert phase.current(state_dir=str(state)).phase == "init"


def test_prepare_starts_a_reused_state_dir_over(tiny_plan_path, tmp_path):
    state = tmp_path / "s"
    for old in ("compile_log", "manifest"):
        (state / old).mkdir(parents=True)
        (state / old / "compiles-1.jsonl").write_text("{}\n")
    (state / "prometheus").mkdir()
    (state / "prometheus" / "counter_1.db").write_text("")
    spec = launch.plan_launch(str(tiny_plan_path), ["--model-path", "m"], state_dir=str(state),
                              environ={})
    launch.prepare_state_dir(spec)
    assert sorted(p.name for p in state.iterdir()) == ["phase.json", "prometheus"]
    assert list((state / "prometheus").iterdir()) == []


def test_families_turned_off_reach_the_server(tiny_plan_path, tmp_path):
    spec = launch.plan_launch(str(tiny_plan_path), ["--model-path", "m"], state_dir=str(tmp_path),
                              environ={}, skip_families=("logprobs", "stream"))
    assert spec.env["WARMUP_SKIP_FAMILIES"] == "logprobs,stream"


def test_freeze_gc_and_the_second_pass_reach_the_server(tiny_plan_path, tmp_path):
    spec = launch.plan_launch(str(tiny_plan_path), ["--model-path", "m"], state_dir=str(tmp_path),
                              environ={}, freeze_gc=False, second_pass=True)
    assert (spec.env["WARMUP_FREEZE_GC"], spec.env["WARMUP_SECOND_PASS"]) == ("0", "1")
    plain = launch.plan_launch(str(tiny_plan_path), ["--model-path", "m"], state_dir=str(tmp_path),
                               environ={})
    assert plain.env["WARMUP_FREEZE_GC"] == "1"  # on by default
    assert "WARMUP_SECOND_PASS" not in plain.env


def test_build_merges_into_an_existing_warmups_list(tiny_plan_path, tmp_path):
    spec = launch.plan_launch(str(tiny_plan_path), ["--model-path", "m", "--warmups=prefill_shapes"],
                        state_dir=str(tmp_path / "s"), environ={}, name="prod", lenient=True)
    assert spec.argv[3:] == ["--model-path", "m", "--warmups=prefill_shapes,prod"]
    assert (spec.env["WARMUP_NAME"], spec.env["WARMUP_LENIENT"]) == ("prod", "1")
    assert "WARMUP_REPORT" not in spec.env


def test_build_lists_the_plan_for_a_config_file_launch(tiny_plan_path, tmp_path):
    cfg = tmp_path / "server.yaml"
    cfg.write_text("model-path: /models/m\ntp-size: 2\nwarmups: prefill_shapes\n")
    spec = launch.plan_launch(str(tiny_plan_path), ["--config", str(cfg)], state_dir=str(tmp_path / "s"), environ={})
    assert spec.argv[3:] == ["--config", str(cfg), "--warmups", "prefill_shapes,tiny_plan"]


def test_build_keeps_a_given_multiprocess_dir_and_state_dir(tiny_plan_path, tmp_path):
    mp = tmp_path / "prom"
    state = tmp_path / "from-env"
    spec = launch.plan_launch(str(tiny_plan_path), ["--model-path", "m"],
                        environ={"PROMETHEUS_MULTIPROC_DIR": str(mp), "WARMUP_STATE_DIR": str(state)})
    launch.prepare_state_dir(spec)
    assert spec.env["PROMETHEUS_MULTIPROC_DIR"] == str(mp) and mp.is_dir()
    assert spec.state_dir == str(state.resolve()) and state.is_dir()


def test_build_makes_a_fresh_state_dir_when_none_is_given(tiny_plan_path, tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)
    spec = launch.plan_launch(str(tiny_plan_path), ["--model-path", "m"], environ={})
    assert Path(spec.state_dir).parent == tmp_path.resolve()
    assert Path(spec.state_dir).name.startswith("sglang-warmup-")


def test_the_plugin_entry_point_is_installed():
    ep = launch.settings.plugin_entry_point()
    assert ep is not None
    assert (ep.name, ep.value, ep.group) == ("sglang_warmup", "warmup.serve.plugin:register", "sglang.srt.plugins")
    from warmup.serve.plugin import register

    assert ep.load() is register


def test_build_refuses_without_the_entry_point(tiny_plan_path, tmp_path, monkeypatch):
    monkeypatch.setattr(launch.settings, "plugin_entry_point", lambda: None)
    with pytest.raises(WarmupError) as err:
        launch.plan_launch(str(tiny_plan_path), ["--model-path", "m"], state_dir=str(tmp_path / "s"), environ={})
    assert err.value.message == ("the sglang-warmup plugin entry point is not installed, so SGLang's worker "
                                 "processes would not load it")
    assert err.value.hint == "pip install sglang-warmup (not just put it on PYTHONPATH)"
    assert not (tmp_path / "s").exists()


def test_build_honours_the_sglang_plugins_whitelist(tiny_plan_path, tmp_path):
    with pytest.raises(WarmupError) as err:
        launch.plan_launch(str(tiny_plan_path), ["--model-path", "m"], state_dir=str(tmp_path / "s"),
                     environ={"SGLANG_PLUGINS": "other_plugin"})
    assert err.value.message == "SGLANG_PLUGINS='other_plugin' does not list 'sglang_warmup'"
    assert err.value.hint == "add it: SGLANG_PLUGINS=other_plugin,sglang_warmup"
    assert not (tmp_path / "s").exists()
    spec = launch.plan_launch(str(tiny_plan_path), ["--model-path", "m"], state_dir=str(tmp_path / "s"),
                        environ={"SGLANG_PLUGINS": "other_plugin, sglang_warmup"})
    assert spec.env["SGLANG_PLUGINS"] == "other_plugin, sglang_warmup"


def test_a_bad_plan_is_refused_before_anything_starts(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("version: 1\nname: bad\nphases:\n  - name: p\n    shapes:\n      - class: x\n        kind: nope\n")
    with pytest.raises(PlanError) as err:
        launch.plan_launch(str(bad), ["--model-path", "m"], state_dir=str(tmp_path / "s"), environ={})
    assert err.value.message.startswith(f"{bad}:7: phases[0].shapes[0].kind: ")
    assert not (tmp_path / "s").exists()


def test_build_needs_sglang_arguments(tiny_plan_path, tmp_path):
    with pytest.raises(WarmupError) as err:
        launch.plan_launch(str(tiny_plan_path), [], state_dir=str(tmp_path / "s"), environ={})
    assert (err.value.message, err.value.hint) == (
        "no SGLang launch arguments after `--`",
        "sglang-warmup serve --plan PLAN -- --model-path MODEL [sglang flags]")
    assert not (tmp_path / "s").exists()


# --- the CLI ----------------------------------------------------------------------------------------
def test_serve_dry_run_prints_the_command_and_does_not_start(tiny_plan_path, tmp_path, monkeypatch, capsys):
    def must_not_exec(spec):
        raise AssertionError("serve --dry-run started SGLang")

    monkeypatch.setattr(launch, "exec_launch", must_not_exec)
    monkeypatch.delenv("WARMUP_METRICS")  # the isolation fixture's; the command shows every WARMUP_*
    state = tmp_path / "st"
    main(["serve", "--plan", str(tiny_plan_path), "--state-dir", str(state), "--lenient", "--dry-run",
          "--", "--model-path", "/models/m", "--warmups", "prefill_shapes"])
    err = capsys.readouterr().err.splitlines()
    s = state.resolve()
    assert err == [
        f"sglang-warmup: PROMETHEUS_MULTIPROC_DIR={s}/prometheus WARMUP_ENABLE=1 WARMUP_FREEZE_GC=1 "
        "WARMUP_LENIENT=1 "
        f"WARMUP_NAME=tiny_plan WARMUP_PLAN={tiny_plan_path.resolve()} WARMUP_STATE_DIR={s}",
        f"sglang-warmup: exec {sys.executable} -m sglang.launch_server --model-path /models/m "
        "--warmups prefill_shapes,tiny_plan",
    ]


def test_serve_does_not_print_secrets(tiny_plan_path, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("WARMUP_API_KEY", "sk-very-secret")
    main(["serve", "--plan", str(tiny_plan_path), "--state-dir", str(tmp_path / "st"), "--dry-run",
          "--", "--model-path", "/models/m"])
    err = capsys.readouterr().err
    assert "sk-very-secret" not in err and " WARMUP_API_KEY=<redacted> " in err


def test_serve_execs_sglang_with_the_built_launch(tiny_plan_path, tmp_path, monkeypatch, capsys):
    started = []
    monkeypatch.setattr(launch, "exec_launch", started.append)
    main(["serve", "--plan", str(tiny_plan_path), "--state-dir", str(tmp_path / "st"), "--name", "w1",
          "--", "--model-path", "/models/m"])
    (spec,) = started
    assert spec.argv[-2:] == ["--warmups", "w1"] and spec.env["WARMUP_NAME"] == "w1"


def test_serve_with_a_bad_plan_exits_with_the_plan_error(tmp_path, capsys):
    missing = tmp_path / "missing.yaml"
    with pytest.raises(SystemExit) as exc:
        main(["serve", "--plan", str(missing), "--dry-run", "--", "--model-path", "m"])
    assert exc.value.code == 2
    assert capsys.readouterr().err.splitlines() == [
        f"error: {missing}: cannot read plan: No such file or directory", "hint: check the path"]


def test_serve_without_sglang_arguments(tiny_plan_path, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["serve", "--plan", str(tiny_plan_path), "--dry-run"])
    assert exc.value.code == 1
    assert capsys.readouterr().err.splitlines() == [
        "error: no SGLang launch arguments after `--`",
        "hint: sglang-warmup serve --plan PLAN -- --model-path MODEL [sglang flags]"]


# --- the plugin gate ------------------------------------------------------------------------------
def test_the_plugin_does_nothing_unless_enabled(tiny_plan_path, monkeypatch):
    from warmup.serve import plugin

    monkeypatch.setattr(plugin, "_registered", False)
    monkeypatch.setenv("WARMUP_PLAN", str(tiny_plan_path))
    monkeypatch.setattr(sys, "argv", ["launch_server", "--model-path", "m"])
    plugin.register()
    assert plugin._registered is False and sys.argv == ["launch_server", "--model-path", "m"]


# --- python -m sglang.launch_server, with SGLang's real plugin loader -------------------------------------
LAUNCH_SERVER_PROBE = textwrap.dedent("""
    import json, runpy, sys, types

    # Run SGLang's real `python -m sglang.launch_server` entry (load_plugins(), then
    # prepare_server_args(sys.argv[1:]), then resolution), stopping where the HTTP server
    # would start: no GPU here.
    probe = types.ModuleType("sglang.srt.entrypoints.http_server")

    def launch_server(server_args):
        from sglang.srt.entrypoints import warmup as w
        from warmup.serve import hook
        print("PROBE " + json.dumps({
            "warmups": server_args.warmups,
            "argv": sys.argv[1:],
            "registered": hook.registered(),
            "in_registry": "tiny_plan" in w._warmup_registry,
            "guarded": getattr(w.execute_warmups, "__sglang_warmup_guard__", False),
        }))

    probe.launch_server = launch_server
    sys.modules[probe.__name__] = probe
    sys.argv = ["launch_server"] + sys.argv[1:]
    runpy.run_module("sglang.launch_server", run_name="__main__", alter_sys=True)
""")


def test_python_m_sglang_launch_server_registers_and_lists_the_plan(tiny_plan_path, tiny_model_dir, tmp_path):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("WARMUP_") and k not in ("SGLANG_PLUGINS", "PROMETHEUS_MULTIPROC_DIR")}
    env.update(WARMUP_ENABLE="1", WARMUP_PLAN=str(tiny_plan_path), WARMUP_STATE_DIR=str(tmp_path / "state"))
    proc = subprocess.run([python(), "-c", LAUNCH_SERVER_PROBE, "--model-path", str(tiny_model_dir),
                           "--device", "cuda", "--skip-tokenizer-init"],
                          env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    probe = [ln for ln in proc.stdout.splitlines() if ln.startswith("PROBE ")]
    assert proc.returncode == 0 and probe, proc.stdout + proc.stderr
    got = json.loads(probe[0][len("PROBE "):])
    assert got == {
        "warmups": "tiny_plan",
        "argv": ["--model-path", str(tiny_model_dir), "--device", "cuda", "--skip-tokenizer-init",
                 "--warmups", "tiny_plan"],
        "registered": {"tiny_plan": str(tiny_plan_path)},
        "in_registry": True,
        "guarded": True,
    }


def test_let_overrides_are_checked_at_launch_and_reach_the_server(tiny_plan_path, tmp_path):
    from warmup.errors import PlanError

    spec = launch.plan_launch(str(tiny_plan_path), ["--model-path", "m"], state_dir=str(tmp_path),
                              environ={}, lets=(("C", "min(chunked_prefill_size, 128)"),))
    assert spec.env["WARMUP_LET"] == "C=min(chunked_prefill_size, 128)"
    with pytest.raises(PlanError) as err:
        launch.plan_launch(str(tiny_plan_path), ["--model-path", "m"], state_dir=str(tmp_path),
                           environ={}, lets=(("D", "1"),))
    assert err.value.message == "--let: D: the plan tiny_plan defines no let 'D'"


def test_a_jit_precompile_turned_off_is_a_warning_of_the_run(monkeypatch):
    from warmup.serve import hook

    monkeypatch.delenv("SGLANG_JIT_DEEPGEMM_PRECOMPILE", raising=False)
    assert hook.launch_warnings() == ()
    monkeypatch.setenv("SGLANG_JIT_DEEPGEMM_PRECOMPILE", "0")
    [warning] = hook.launch_warnings()
    assert warning.startswith("SGLANG_JIT_DEEPGEMM_PRECOMPILE is off: ")
    assert "no plan can send every M" in warning
