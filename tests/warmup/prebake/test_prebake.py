"""warmup.prebake.bake: the orchestration on CPU with a fake ``sglang.launch_server`` (it serves the
stand-in API and compiles real Triton kernels for sm_90 into TRITON_CACHE_DIR while it runs the
plan), so that the archive produced is real and restorable: restored into a fresh directory,
the same kernels are disk-cache hits."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "sidecar_support"))

from harness import FAKE_SGLANG, PLAN, REPO, free_port, gone  # noqa: E402

from cache_tools import archive, compile_log  # noqa: E402
from warmup.prebake import bake as prebake  # noqa: E402
from warmup.errors import SidecarError  # noqa: E402
from warmup.plan import step_record  # noqa: E402

PY = sys.executable
KINDS = ["triton", "inductor", "sglang_jit", "tvm_ffi", "flashinfer", "deep_gemm", "tilelang",
         "cuda_ptx", "cute_aot", "cute_dsl", "flash_attn_4"]


@pytest.fixture
def env(tmp_path, monkeypatch):
    """The environment of a prebake: the fake SGLang first on PYTHONPATH, caches that point
    elsewhere (prebake must override them), no WARMUP_* variables."""
    e = {k: v for k, v in os.environ.items()
         if not k.startswith("WARMUP_") and k != "PROMETHEUS_MULTIPROC_DIR"}
    e["PYTHONPATH"] = str(FAKE_SGLANG)
    e["TRITON_CACHE_DIR"] = str(tmp_path / "elsewhere" / "triton")
    e["SGL_JIT_CACHE_DIR"] = str(tmp_path / "elsewhere" / "legacy")  # SGLang's legacy spelling
    e["HOME"] = str(tmp_path / "home")
    e["TMPDIR"] = str(tmp_path / "tmp")  # a temporary work directory kept after a failure
    (tmp_path / "tmp").mkdir()
    return e


def run_prebake(env, *args, sglang=("--model-path", "/models/stand-in", "--host", "127.0.0.1"),
                timeout=120):
    return subprocess.run([PY, "-m", "warmup", "prebake", "--plan", str(PLAN), *args, "--",
                           *sglang], env=env, capture_output=True, text=True, timeout=timeout,
                          cwd=str(REPO))


def compile_hits(cache_dir: Path) -> list[bool]:
    """Compile the stand-in's three kernels with TRITON_CACHE_DIR=cache_dir; cache_hit of each."""
    import standin
    import triton
    from triton.backends.compiler import GPUTarget

    hits: list[bool] = []
    prev_listener, prev_dir = triton.knobs.compilation.listener, os.environ.get("TRITON_CACHE_DIR")

    def listener(*, src, metadata, metadata_group, times, cache_hit):
        hits.append(cache_hit)

    os.environ["TRITON_CACHE_DIR"] = str(cache_dir)
    triton.knobs.compilation.listener = listener
    try:
        for block in (16, 64, 256):
            triton.compile(triton.compiler.ASTSource(fn=standin._kernel(), signature={
                "x": "*fp32", "y": "*fp32", "out": "*fp32", "n": "i32"},
                constexprs={"BLOCK": block}), target=GPUTarget("cuda", 90, 32))
    finally:
        triton.knobs.compilation.listener = prev_listener
        if prev_dir is None:
            os.environ.pop("TRITON_CACHE_DIR", None)
        else:
            os.environ["TRITON_CACHE_DIR"] = prev_dir
    return hits


# --- the whole flow ---------------------------------------------------------------------------
def test_prebake_bakes_an_archive_that_restores_into_disk_cache_hits(env, tmp_path):
    out = tmp_path / "out" / "sglang-cache.tar"
    work = tmp_path / "work"
    port = free_port()
    r = run_prebake(env, "--out", str(out), "--port", str(port), "--work-dir", str(work),
                    "--format", "json")
    assert r.returncode == 0, r.stderr
    result = json.loads(r.stdout)
    kinds = {k["kind"]: k for k in result["kinds"]}
    assert list(kinds) == KINDS
    assert kinds["triton"]["entries"] == 3 and kinds["triton"]["path"] == str(work / "cache" / "triton")
    assert all(kinds[k]["entries"] == 0 for k in KINDS[1:])
    assert result["entries"] == 3 and result["stopped_with"] == "SIGTERM"
    assert result["warmup"]["plan"] == "sidecar_test" and result["warmup"]["ok"] is True
    assert result["warmup"]["requests"] == 7
    assert result["warnings"] == [] and result["work_dir"] == str(work)
    # the cold start ran the plan once; a second start from the baked caches ran it twice and
    # learned the record there: the steps that loaded a kernel from disk are its loud ones
    assert "starting SGLang from the baked caches (learning the steps record)" in r.stderr
    baked = json.loads((work / "report.json").read_text())
    again = json.loads((work / "learn-report.json").read_text())
    assert baked.get("coverage") is None and baked["compiles_total"] == 3
    assert again["coverage"] and again["compiles_total"] == 0
    assert sum(c["disk_hits"] for c in again["classes"]) == 3
    assert result["steps"] == str(out) + ".steps.json"
    record = step_record.read(result["steps"])
    assert record.plan == "sidecar_test" and len(record.evidence) == record.steps
    loaded = {e.index for e in record.evidence if e.events}
    assert len(loaded) == 3 and loaded <= set(record.keep)
    assert 0 < record.quiet < record.steps
    # the fake server's environment came from serve and from `cache env --root`
    assert not (tmp_path / "elsewhere").exists()
    # the server and the child in its process group are gone
    child = int((work / "state" / "child.pid").read_text())
    assert gone(child)
    assert "sglang-warmup prebake: server stopped (SIGTERM)" in r.stderr

    # the archive is real: it verifies, and restored into a fresh root the kernels are hits
    report = archive.verify(out)
    assert [e.kind for e in report.manifest.entries] == ["triton"] * 3
    dest = tmp_path / "restored"
    plan = archive.plan_restore(out, dest=dest)
    assert len(plan.to_write) == 3
    plan.execute()
    assert compile_hits(dest / "triton") == [True, True, True]
    assert compile_hits(tmp_path / "cold") == [False, False, False]  # the control


@pytest.mark.skipif(not os.environ.get("WARMUP_TEST_REGISTRY"),
                    reason="WARMUP_TEST_REGISTRY is unset: no OCI registry (scripts/test.sh "
                           "starts Debian's docker-registry and sets it)")
def test_prebake_pushes_the_archive_to_a_registry(env, tmp_path):
    from cache_tools.stores import oci

    ref = f"oci+http://{os.environ['WARMUP_TEST_REGISTRY']}/sgw-test/prebake-{os.getpid()}:baked"
    out = tmp_path / "a.tar"
    r = run_prebake(env, "--out", str(out), "--port", str(free_port()), "--push", ref,
                    "--format", "json")
    assert r.returncode == 0, r.stderr
    pushed = json.loads(r.stdout)["pushed"]
    assert [layer["kind"] for layer in pushed["layers"]] == ["triton"]
    dest = tmp_path / "pulled"
    with oci.plan_pull(pushed["pinned"], dest=dest) as plan:
        plan.execute()
    assert compile_hits(dest / "triton") == [True, True, True]


def test_a_push_that_cannot_happen_stops_before_the_bake(env, tmp_path):
    out = tmp_path / "a.tar"
    r = run_prebake(env, "--out", str(out), "--push", "oci://h/Bad")
    assert (r.returncode, r.stdout) == (1, "")
    assert r.stderr.startswith("error: oci://h/Bad: repository 'Bad' is not a valid name")
    ref = f"oci+http://127.0.0.1:{free_port()}/x/y"          # nothing listens there
    r = run_prebake(env, "--out", str(out), "--push", ref)
    assert (r.returncode, r.stdout) == (5, "")
    assert r.stderr.splitlines()[0] == f"error: {ref}: GET /v2/: connection refused"
    assert not out.exists() and "server" not in r.stderr


def test_the_table_names_every_kind_and_the_temporary_work_dir_is_removed(env, tmp_path):
    out = tmp_path / "a.tar"
    r = run_prebake(env, "--out", str(out), "--port", str(free_port()))
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].split() == ["kind", "entries", "files", "size"]
    assert [line.split()[0] for line in lines[2:2 + len(KINDS)]] == KINDS
    assert re.fullmatch(r"triton\s+3\s+\d+\s+[\d.]+ KiB", lines[2])
    assert re.fullmatch(r"total\s+3\s+\d+\s+[\d.]+ KiB", lines[2 + len(KINDS)])
    assert lines[-2] == f"restore with: sglang-warmup cache restore {out}"
    assert lines[-1] == f"then launch with the same plan and SGLang flags and: --steps {out}.steps.json"
    assert re.fullmatch(rf"steps: [34] of 5 paid a first-time cost in a start from the baked "
                        rf"caches, [12] quiet: {out}.steps.json", lines[-3])
    work = re.search(r"log: (\S+)/server\.log", r.stderr).group(1)
    assert not Path(work).exists()


def launch_from(env, tmp_path, name, triton_dir, record):
    """Start the fake SGLang as ``serve --steps RECORD`` would, on ``triton_dir``; its run
    report once the warm-up ran (the server is stopped then)."""
    import signal

    from warmup import settings

    state = tmp_path / name
    e = dict(env, TRITON_CACHE_DIR=str(triton_dir), **settings.activation_env(
        state_dir=str(state), multiprocess_dir=str(state / "mp"), plan=str(PLAN), name="w",
        report=str(state / "report.json"), steps=str(record)))
    state.mkdir()
    p = subprocess.Popen([PY, "-m", "sglang.launch_server", "--model-path", "m", "--warmups",
                          "w", "--port", str(free_port())], env=e, cwd=str(REPO),
                         start_new_session=True, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 90
        while not (state / "report.json").exists() and p.poll() is None \
                and time.monotonic() < deadline:
            time.sleep(0.1)
        return json.loads((state / "report.json").read_text())
    finally:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()


def test_the_record_trims_a_launch_on_the_restored_archive_and_not_on_a_cold_cache(env,
                                                                                     tmp_path):
    """Real Triton compiles and sglang-warmup's real compile-log hooks: on the restored archive
    the loud steps load their kernels from disk and the quiet ones are left out; on an empty
    cache the loud steps compile, so the quiet ones are sent after them."""
    out = tmp_path / "a.tar"
    r = run_prebake(env, "--out", str(out), "--port", str(free_port()))
    assert r.returncode == 0, r.stderr
    record = step_record.read(str(out) + ".steps.json")
    # the learning start read the cold start's compiles (its Triton misses, at their steps)
    assert record.baked == 3 and "did not read the cold start's compile log" not in r.stdout
    archive.plan_restore(out, dest=tmp_path / "restored").execute()

    restored = launch_from(env, tmp_path, "restored-launch", tmp_path / "restored" / "triton",
                           str(out) + ".steps.json")
    assert restored["quiet_steps"] == record.quiet > 0 and restored["warnings"] == []
    assert restored["compiles_total"] == 0 and len(restored["step_ms"]) == len(record.keep)

    cold = launch_from(env, tmp_path, "cold-launch", tmp_path / "empty", str(out) + ".steps.json")
    assert cold["quiet_steps"] == 0 and cold["compiles_total"] == 3
    assert len(cold["step_ms"]) == record.steps
    assert cold["warnings"][-1].endswith(f"the {record.quiet} quiet steps sent after them")


def test_a_rebake_replaces_the_record_and_ignores_a_launch_record(env, tmp_path):
    """A record the environment names (the runtime image's WARMUP_STEPS) is for launches: the
    bake sends the whole plan and learns anew.  A record left beside the archive a bake
    replaces describes the old cache: a bake that learns none removes it."""
    out = tmp_path / "a.tar"
    stale = tmp_path / "a.tar.steps.json"
    out.write_bytes(b"old archive")
    stale.write_text("{}")
    env["WARMUP_STEPS"] = str(tmp_path / "launch-record.json")        # not there: a warning
    r = run_prebake(env, "--out", str(out), "--port", str(free_port()), "-y", "--format", "json",
                    "--work-dir", str(tmp_path / "work"))
    assert r.returncode == 0, r.stderr
    result = json.loads(r.stdout)
    assert result["warnings"] == [] and result["warmup"]["requests"] == 7
    report = json.loads((tmp_path / "work" / "report.json").read_text())
    assert report["warnings"] == [] and report["quiet_steps"] == 0      # never read
    assert step_record.read(stale).quiet > 0                         # learned: every step sent
    r = run_prebake(env, "--out", str(out), "--port", str(free_port()), "-y", "--no-learn-steps")
    assert r.returncode == 0, r.stderr
    assert out.exists() and not stale.exists()


def test_kernels_the_start_from_the_baked_caches_compiled_again_are_a_warning(env, tmp_path):
    """Where a kernel does not persist in the caches, the start that learns the record compiles
    it again, as every launch from the archive would: the bake says so."""
    env["FAKE_SGLANG_MODE"] = "forget-cache"
    out = tmp_path / "a.tar"
    r = run_prebake(env, "--out", str(out), "--port", str(free_port()), "--format", "json",
                    "--work-dir", str(tmp_path / "work"))
    assert r.returncode == 0, r.stderr
    warnings = json.loads(r.stdout)["warnings"]
    assert warnings == [f"the start from the baked caches compiled 3 kernel(s) again in its "
                        f"warm-up (triton): a launch from this archive compiles them too "
                        f"({tmp_path / 'work' / 'learn-report.json'} names them)"]


def test_a_learning_start_slower_throughout_is_a_warning(env, tmp_path):
    """A host slower while the record was learned makes steps with no cost of their own look
    like first hits: the bake says so, with how many steps were kept on timing alone."""
    env["FAKE_SGLANG_MODE"] = "slow-first-pass"
    plan = tmp_path / "div16.yaml"          # sixteen prompts of one kernel class
    plan.write_text("version: 1\nname: div16\nphases:\n  - name: extends\n    shapes:\n"
                    "      - class: div16\n        kind: extend\n        why: one kernel\n"
                    f"        lengths: {list(range(16, 257, 16))}\n")
    out = tmp_path / "a.tar"
    r = subprocess.run([PY, "-m", "warmup", "prebake", "--plan", str(plan), "--out", str(out),
                        "--port", str(free_port()), "--format", "json", "--work-dir",
                        str(tmp_path / "work"), "--", "--model-path", "/models/stand-in",
                        "--host", "127.0.0.1"], env=env, capture_output=True, text=True,
                       timeout=120, cwd=str(REPO))
    assert r.returncode == 0, r.stderr
    record = step_record.read(str(out) + ".steps.json")
    assert record.drift is not None and record.drift >= step_record.DRIFT_RATIO, record.evidence
    assert json.loads(r.stdout)["warnings"] == list(record.drift_notes)


def test_a_start_from_the_baked_caches_that_fails_keeps_the_archive_and_fails_the_bake(
        env, tmp_path):
    env["FAKE_SGLANG_MODE"] = "exit-on-restart"
    out = tmp_path / "a.tar"
    r = run_prebake(env, "--out", str(out), "--port", str(free_port()))
    assert r.returncode == 1, r.stderr
    error = next(x for x in r.stderr.splitlines() if x.startswith("error: "))
    assert error.endswith(f"; {out} was packed from the cold start, without a steps record")
    assert "SGLang exited with code 3 before it was ready" in error
    assert "--no-learn-steps bakes with one start" in r.stderr
    assert archive.verify(out).manifest.entries and not (tmp_path / "a.tar.steps.json").exists()
    work = re.search(r"log: (\S+)/learn\.log", r.stderr).group(1)
    assert (Path(work) / "learn.log").exists()              # kept to look into


def test_a_directory_where_the_record_goes_is_refused_before_anything_starts(env, tmp_path):
    (tmp_path / "a.tar.steps.json").mkdir()
    r = run_prebake(env, "--out", str(tmp_path / "a.tar"), "--port", str(free_port()))
    assert (r.returncode, r.stdout) == (1, "")
    assert r.stderr.splitlines()[0] == (f"error: {tmp_path}/a.tar.steps.json is a directory or "
                                        "a link")
    assert "starting SGLang" not in r.stderr


def test_a_damaged_run_report_is_one_line_read_bounded(tmp_path, monkeypatch):
    report = tmp_path / "report.json"
    report.write_text("{oops")
    with pytest.raises(SidecarError) as info:
        prebake._read_report(report)
    assert info.value.message.startswith(f"cannot read the run report {report}: not JSON: ")
    monkeypatch.setattr(prebake, "MAX_REPORT_BYTES", 4)
    report.write_text('{"ok": true}')
    with pytest.raises(SidecarError) as info:
        prebake._read_report(report)
    assert info.value.message == (f"cannot read the run report {report}: file is 12 bytes "
                                  f"(limit 4)")


def test_only_what_the_caches_should_have_kept_counts_as_compiled_again(tmp_path):
    """Dynamo traces in every process (nothing on disk keeps them); a compile before the
    warm-up is SGLang's own start; a disk hit is the cache working; a kernel the cold start
    never compiled (only the learning start's second pass met it) is new, not again."""
    def write(state, *records):
        writer = compile_log.Writer(compile_log.directory(state))
        for event, phase, compiler, kernel in records:
            writer.write(dict(compile_log.record(event, phase=phase, shape_class="c", request=0,
                                                 compiler=compiler), hash=kernel))

    miss, hit = compile_log.MISS, compile_log.HIT
    write(tmp_path / "cold", (miss, "warmup", "dynamo", "d"), (miss, "init", "triton", "i"),
          (miss, "warmup", "triton", "a"), (miss, "warmup", "triton", "b"),
          (miss, "warmup", "inductor", "f"))
    write(tmp_path / "learn", (miss, "warmup", "dynamo", "d"), (miss, "init", "triton", "i"),
          (hit, "warmup", "triton", "a"), (miss, "warmup", "triton", "b"),
          (miss, "warmup", "inductor", "f"), (miss, "warmup", "triton", "new"))
    again = prebake._compiled_again(str(tmp_path / "cold"), str(tmp_path / "learn"))
    assert sorted(again) == ["inductor", "triton"]
    assert prebake._compiled_again(str(tmp_path / "cold"), str(tmp_path / "nothing")) == []


def test_a_server_ignoring_sigterm_is_killed_with_its_group(env, tmp_path):
    env["FAKE_SGLANG_MODE"] = "ignore-term"
    work = tmp_path / "work"
    t0 = time.monotonic()
    r = run_prebake(env, "--out", str(tmp_path / "a.tar"), "--port", str(free_port()),
                    "--stop-timeout", "1", "--work-dir", str(work), "--format", "json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["stopped_with"] == "SIGKILL"
    assert time.monotonic() - t0 < 60
    assert gone(int((work / "state" / "child.pid").read_text()))


def test_a_server_exiting_before_ready_fails_with_its_log(env, tmp_path):
    env["FAKE_SGLANG_MODE"] = "exit"
    work = tmp_path / "work"
    r = run_prebake(env, "--out", str(tmp_path / "a.tar"), "--port", str(free_port()),
                    "--work-dir", str(work))
    assert r.returncode == 1
    assert r.stderr.splitlines()[-2:] == [
        f"error: SGLang exited with code 3 before it was ready; log: {work}/server.log",
        "hint: the last log lines are above (a failing plan stops SGLang's startup on purpose: "
        "`sglang-warmup plan check`)"]
    assert "  | fake sglang: failing on purpose before listening" in r.stderr
    assert not (tmp_path / "a.tar").exists()
    assert gone(int((work / "state" / "child.pid").read_text()))


def test_a_server_never_ready_is_stopped_at_the_deadline(env, tmp_path):
    env["FAKE_SGLANG_MODE"] = "never-ready"
    work = tmp_path / "work"
    t0 = time.monotonic()
    r = run_prebake(env, "--out", str(tmp_path / "a.tar"), "--port", str(free_port()),
                    "--deadline", "3", "--work-dir", str(work))
    assert r.returncode == 1
    assert time.monotonic() - t0 < 40
    assert re.fullmatch(r"error: SGLang was not ready within 3 s \(\d+ probes of "
                        r"/health_generate; last: [^)]+\); log: \S+/server\.log",
                        r.stderr.splitlines()[-2]), r.stderr
    assert "sglang-warmup prebake: server stopped (SIGTERM)" in r.stderr
    assert gone(int((work / "state" / "child.pid").read_text()))


def test_a_server_that_did_not_run_the_plan_is_refused(env, tmp_path):
    env["FAKE_SGLANG_MODE"] = "no-report"
    work = tmp_path / "work"
    r = run_prebake(env, "--out", str(tmp_path / "a.tar"), "--port", str(free_port()),
                    "--work-dir", str(work))
    assert r.returncode == 1
    assert r.stderr.splitlines()[-2:] == [
        f"error: the server became ready but the plan did not run in it (no run report at "
        f"{work}/report.json)",
        "hint: install sglang-warmup in the environment that runs SGLang (pip install, so its "
        "plugin entry point loads)"]
    assert not (tmp_path / "a.tar").exists()


def test_dry_run_prints_the_plan_and_creates_nothing(env, tmp_path):
    r = run_prebake(env, "--out", str(tmp_path / "a.tar"), "--port", "31999", "--dry-run")
    assert r.returncode == 0, r.stderr
    text = r.stdout
    work = re.search(r"^work directory: (\S+) \(temporary\)$", text, re.M).group(1)
    assert not Path(work).exists()
    assert "cache directories it would create (empty):" in text.splitlines()
    for k in KINDS:
        assert re.search(rf"^  {k}\s+{re.escape(work)}/cache/", text, re.M), k
    assert f"  TRITON_CACHE_DIR={work}/cache/triton" in text
    assert f"  SGLANG_JIT_CACHE_DIR={work}/cache/jit" in text
    assert "  WARMUP_ENABLE=1" in text and "  WARMUP_NAME=sidecar_test" in text
    assert re.search(r"^command: \S+ -m sglang\.launch_server --model-path /models/stand-in "
                     r"--host 127\.0\.0\.1 --port 31999 --warmups sidecar_test$", text, re.M), text
    assert "ready: http://127.0.0.1:31999/health_generate within 1800 s" in text
    assert text.splitlines()[-1] == (f"then a second start from the baked caches runs the plan "
                                     f"twice; the steps that paid a first-time cost there go to "
                                     f"{tmp_path}/a.tar.steps.json")
    assert "WARMUP_SECOND_PASS" not in text                 # the cold start runs it once
    assert not (tmp_path / "a.tar").exists()


# --- validation (exact messages) ------------------------------------------------------------------
def test_an_existing_archive_needs_yes(tmp_path):
    out = tmp_path / "a.tar"
    out.write_bytes(b"x")
    with pytest.raises(SidecarError) as info:
        prebake.prepare(PLAN, out, ["--model-path", "m"])
    assert (info.value.message, info.value.hint) == (
        f"--out {out} exists", "pass -y to overwrite it, or choose another --out")


def test_a_conflicting_port_is_refused(tmp_path):
    with pytest.raises(SidecarError) as info:
        prebake.prepare(PLAN, tmp_path / "a.tar", ["--model-path", "m", "--port", "30001"],
                        port=30002)
    assert info.value.message == "--port 30002 conflicts with SGLang's --port 30001"


def test_sglang_arguments_are_required(tmp_path):
    with pytest.raises(SidecarError) as info:
        prebake.prepare(PLAN, tmp_path / "a.tar", ["--"])
    assert info.value.message == "no SGLang launch arguments after `--`"


def test_a_non_empty_work_dir_is_refused(tmp_path):
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "old").write_text("x")
    with pytest.raises(SidecarError) as info:
        prebake.prepare(PLAN, tmp_path / "a.tar", ["--model-path", "m"], work_dir=tmp_path / "work")
    assert info.value.message == f"--work-dir {tmp_path / 'work'} is not empty"


def test_a_busy_port_is_refused_before_launching(env, tmp_path):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        r = run_prebake(env, "--out", str(tmp_path / "a.tar"), "--port", str(port))
    assert r.returncode == 1
    assert r.stderr.splitlines()[-2:] == [
        f"error: something already listens on 127.0.0.1:{port}",
        "hint: stop it, or give SGLang another port (--port N)"]
    assert list((tmp_path / "tmp").iterdir()) == []  # nothing ran: no work directory kept


def test_the_environment_pins_every_cache_under_the_root(tmp_path, monkeypatch):
    monkeypatch.setenv("SGL_DG_CACHE_DIR", "/legacy/deep_gemm")
    spec = prebake.prepare(PLAN, tmp_path / "a.tar", ["--model-path", "m"], port=31234)
    try:
        env = spec.launch.env
        root = spec.cache_root
        assert env["SGLANG_CACHE_DIR"] == str(root)
        assert env["TRITON_CACHE_DIR"] == str(root / "triton")
        assert env["SGLANG_DG_CACHE_DIR"] == str(root / "deep_gemm")
        assert "SGL_DG_CACHE_DIR" not in env  # the legacy spelling would win inside SGLang
        assert {loc.kind.name for loc in spec.locations} == set(KINDS)
        assert spec.url == "http://127.0.0.1:31234"
        assert spec.launch.argv[-4:] == ["--port", "31234", "--warmups", "sidecar_test"]
    finally:
        spec.discard()
    assert not spec.work_dir.exists()


def test_the_learning_start_is_told_where_the_cold_start_wrote(tmp_path, monkeypatch):
    """The start that learns the steps record reads the cold start's compile log (a step that
    compiled there is kept); the cold start reads nobody's, whatever the caller's environment
    says."""
    monkeypatch.setenv("WARMUP_BAKED_STATE", "/somewhere/else")
    spec = prebake.prepare(PLAN, tmp_path / "a.tar", ["--model-path", "m"], port=free_port(),
                           work_dir=tmp_path / "work")
    try:
        assert spec.learn.env["WARMUP_BAKED_STATE"] == spec.launch.state_dir
        assert "WARMUP_BAKED_STATE" not in spec.launch.env
    finally:
        spec.discard()


def test_the_record_beside_the_archive_has_both_starts_gemm_load_rows(tmp_path):
    """cuBLAS loads the same kernels in every fresh process: the cold start's sweep and the
    learning start's together name every load row either saw; a cold sweep on another GPU, or
    at rows learned before, adds nothing."""
    spec = prebake.prepare(PLAN, tmp_path / "a.tar", ["--model-path", "m"], port=free_port(),
                           work_dir=tmp_path / "work")
    learned = step_record.from_json({
        "format": "sglang-warmup-steps", "version": 2, "plan": "p", "plan_sha256": "",
        "expansion_digest": "d", "steps": 2, "keep": [1], "ratio": 1.2, "min_ms": 5.0,
        "baked": 4, "gemm": {"blas": "H100", "max_rows": 4096, "reached": 4096,
                             "rows": {"a": [1, 9], "b": []}}})
    learned.write(Path(spec.learn.state_dir) / step_record.STATE_FILE)

    def cold(**changes):
        return {"gemm_sweeps": [{"pid": 1, "blas": "H100", "max_rows": 4096, "learned": 0,
                                 "rows_reached": 4096, "stopped_by_budget": False,
                                 "load_rows": {"a": [9, 17], "b": [3], "c": []}, **changes}]}

    warnings: list[str] = []
    path, line = spec._keep_steps(warnings, cold())
    assert warnings == [] and line.startswith("steps: 1 of 2 paid a first-time cost")
    assert step_record.read(path).gemm.rows == {"a": (1, 9, 17), "b": (3,), "c": ()}
    for other in (cold(blas="H200"), cold(learned=3), {"gemm_sweeps": "x"}, {}):
        path, _ = spec._keep_steps(warnings, other)
        assert step_record.read(path).gemm == learned.gemm
    assert warnings == []
    # a learning start that could not read the cold start's compile log: said
    dataclasses.replace(learned, baked=None).write(Path(spec.learn.state_dir) /
                                                   step_record.STATE_FILE)
    spec._keep_steps(warnings, cold())
    assert warnings == [f"the start that learned the steps record did not read the cold start's "
                        f"compile log ({spec.work_dir / 'learn.log'} says why): a step that "
                        f"batches by timing may have hidden the step that compiles a kernel in "
                        f"plan order, which a launch then meets after ready"]
