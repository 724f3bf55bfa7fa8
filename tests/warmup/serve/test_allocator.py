"""warmup.serve.allocator: SGLang's real flush request path (its ``SchedulerFlushWrapper`` and
``Scheduler.flush_cache``, from the 0.5.22 and 0.5.23 sources; the scheduler module itself does
not import on the CPU profile) keeps the caching allocator's blocks on the warm-up's flush and on
no other flush; the driver names that flush in the phase file a scheduler process reads."""

from __future__ import annotations

import ast
import asyncio
import inspect
import logging
import time
import types
from pathlib import Path
from unittest import mock

import pytest

from warmup.observe import phase
from warmup.serve import allocator

ROOT = Path(__file__).resolve().parents[3]
SITES = pytest.mark.parametrize("site", [
    ROOT / ".venv/lib/python3.11/site-packages", ROOT / ".deps/sglang-0.5.23"],
    ids=["0.5.22", "0.5.23"])

pytestmark = pytest.mark.usefixtures("warmup_isolated")


def _source(site: Path, relative: str) -> ast.Module:
    path = site / relative
    if not path.exists():
        pytest.skip(f"{path} not installed")
    return ast.parse(path.read_text())


def _scheduler_module(site: Path) -> tuple[types.ModuleType, list[str]]:
    """A module holding ``Scheduler`` with SGLang's own ``flush_cache``, compiled from the
    installed source; ``current_platform.empty_cache`` records its calls in the returned list."""
    tree = _source(site, "sglang/srt/managers/scheduler.py")
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Scheduler")
    method = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "flush_cache")
    emptied: list[str] = []
    module = types.ModuleType("sglang_scheduler_under_test")
    module.__dict__.update(
        logging=logging, logger=logging.getLogger("sglang.scheduler"),
        torch=types.SimpleNamespace(cuda=types.SimpleNamespace(empty_cache=lambda: emptied.append("torch"))),
        current_platform=types.SimpleNamespace(empty_cache=lambda: emptied.append("platform")))
    body = ast.Module(body=[ast.ClassDef(name="Scheduler", bases=[], keywords=[], body=[method],
                                         decorator_list=[], type_params=[])], type_ignores=[])
    exec(compile(ast.fix_missing_locations(body), str(site), "exec"), module.__dict__)
    return module, emptied


def _flush_wrapper_module(site: Path) -> types.ModuleType:
    """SGLang's ``flush_wrapper`` module of ``site``, executed from its source (its imports are
    the installed SGLang's: the request and reply types it names exist in both)."""
    path = site / "sglang/srt/managers/scheduler_components/flush_wrapper.py"
    if not path.exists():
        pytest.skip(f"{path} not installed")
    module = types.ModuleType(allocator.FLUSH_WRAPPER)
    exec(compile(path.read_text(), str(path), "exec"), module.__dict__)
    return module


def _scheduler(idle: bool = True):
    self = mock.MagicMock(name="scheduler")
    self.is_fully_idle.return_value = idle
    self._engine_paused = False
    return self


def _server(site: Path, idle: bool = True):
    """A scheduler's flush path as SGLang builds it after the plugin armed: SGLang's own
    ``flush_cache`` bound to a scheduler, handed to SGLang's own ``SchedulerFlushWrapper``."""
    sched_module, emptied = _scheduler_module(site)
    fw_module = _flush_wrapper_module(site)
    allocator._wrap(fw_module)
    self = _scheduler(idle)
    flush_cache = types.MethodType(sched_module.Scheduler.flush_cache, self)
    # The reply channel differs by version (0.5.22: ipc_channels, 0.5.23: send_output).
    others = {name: mock.MagicMock(name=name) for name in
              inspect.signature(fw_module.SchedulerFlushWrapper.__init__).parameters
              if name not in ("self", "flush_cache", "is_fully_idle")}
    wrapper = fw_module.SchedulerFlushWrapper(flush_cache=flush_cache,
                                              is_fully_idle=self.is_fully_idle, **others)
    return wrapper, fw_module, self, flush_cache, emptied


def _recording_flush():
    """A ``flush_cache(empty_cache=True)`` that records the choice it was called with."""
    calls: list[bool] = []

    def flush_cache(empty_cache: bool = True):
        calls.append(empty_cache)
        return True

    return flush_cache, calls


def _request(fw_module, timeout_s: float = 0.0):
    return fw_module.FlushCacheReqInput(timeout_s=timeout_s)


@SITES
def test_the_warmup_flush_resets_the_pools_and_keeps_the_allocator(site, caplog):
    wrapper, fw, self, _, emptied = _server(site)
    phase.set_phase("warmup", phase.FLUSH)
    with caplog.at_level(logging.INFO, logger="sglang_warmup.allocator"):
        assert wrapper.handle(_request(fw)).success is True
    self.tree_cache.reset.assert_called_once_with()
    self.req_to_token_pool.clear.assert_called_once_with()
    self.token_to_kv_pool_allocator.clear.assert_called_once_with()
    assert emptied == []
    assert "the warm-up's flush kept the caching allocator's blocks" in caplog.text
    assert "WARMUP_KEEP_ALLOCATOR=0" in caplog.text


@SITES
def test_a_flush_that_waited_for_an_idle_scheduler_keeps_them_too(site):
    wrapper, fw, self, _, emptied = _server(site, idle=False)
    phase.set_phase("warmup", phase.FLUSH)
    assert wrapper.handle(_request(fw, timeout_s=30.0)) is None      # deferred until idle
    self.is_fully_idle.return_value = True
    wrapper.check_pending()
    self.tree_cache.reset.assert_called_once_with()
    assert emptied == []


@SITES
@pytest.mark.parametrize("state", [("init", None), ("warmup", "extends"),
                                   ("warmup", "sglang_startup"), ("serving", None)])
def test_every_other_flush_request_empties_the_allocator_as_sglang_does(site, state):
    wrapper, fw, _, _, emptied = _server(site)
    phase.set_phase(*state)
    assert wrapper.handle(_request(fw)).success is True
    assert emptied == ["platform"]


@SITES
@pytest.mark.parametrize("age, kept", [
    (0.0, True), (allocator.MIN_WAIT_S + allocator.SLACK_S, True),
    (allocator.MIN_WAIT_S + allocator.SLACK_S + 1, False),       # a driver that died mid-flush
    (-allocator.SLACK_S, True), (-allocator.SLACK_S - 1, False)])  # another host's clock
def test_a_stale_flush_phase_counts_for_nothing(site, monkeypatch, caplog, age, kept):
    wrapper, fw, _, _, emptied = _server(site)
    set_at = phase.set_phase("warmup", phase.FLUSH).since
    monkeypatch.setattr(allocator, "time", types.SimpleNamespace(time=lambda: set_at + age))
    with caplog.at_level(logging.WARNING, logger="sglang_warmup.allocator"):
        assert wrapper.handle(_request(fw)).success is True
    assert emptied == ([] if kept else ["platform"])
    assert ("stale" in caplog.text) is not kept


@SITES
def test_the_schedulers_other_callers_are_never_touched(site):
    """The scheduler hands every other component (weight updates, memory release) its own
    ``self.flush_cache``, and only the flush wrapper's copy is wrapped: the scheduler's own
    method empties the allocator even while the warm-up flushes."""
    tree = _source(site, "sglang/srt/managers/scheduler.py")
    handed = [k.value for n in ast.walk(tree) if isinstance(n, ast.Call) for k in n.keywords
              if k.arg == "flush_cache"]
    assert len(handed) >= 2 and all(isinstance(v, ast.Attribute) and v.attr == "flush_cache"
                                    and getattr(v.value, "id", None) == "self" for v in handed)
    _, _, _, flush_cache, emptied = _server(site)
    phase.set_phase("warmup", phase.FLUSH)
    assert flush_cache() is True
    assert emptied == ["platform"]


@SITES
def test_the_plugin_is_loaded_before_the_scheduler_builds_its_flush_wrapper(site):
    """What arming relies on, read from the source: ``run_scheduler_process`` loads the plugins
    before it builds the ``Scheduler``, and the scheduler module imports the flush wrapper's
    class at its top (so the class the plugin patches is the one the scheduler builds)."""
    tree = _source(site, "sglang/srt/managers/scheduler.py")
    run = next(n for n in tree.body if isinstance(n, ast.FunctionDef)
               and n.name == "run_scheduler_process")
    calls = sorted(((n.lineno, getattr(n.func, "id", getattr(n.func, "attr", ""))) for n in
                    ast.walk(run) if isinstance(n, ast.Call)))
    names = [name for _, name in calls]
    assert "load_plugins" in names and "Scheduler" in names
    assert names.index("load_plugins") < names.index("Scheduler")
    assert any(isinstance(n, ast.ImportFrom) and n.module == allocator.FLUSH_WRAPPER
               and any(a.name == "SchedulerFlushWrapper" for a in n.names) for n in tree.body)


def test_arming_patches_the_loaded_flush_wrapper_in_place(monkeypatch):
    """The branch a scheduler takes: SGLang's flush wrapper module is already imported when the
    plugin arms."""
    real = pytest.importorskip(allocator.FLUSH_WRAPPER)
    monkeypatch.setattr(real.SchedulerFlushWrapper, "__init__", real.SchedulerFlushWrapper.__init__)
    allocator.arm()
    assert getattr(real.SchedulerFlushWrapper.__init__, "__sglang_warmup__", False)


def test_a_caller_that_passes_arguments_is_passed_through():
    flush_cache, calls = _recording_flush()

    phase.set_phase("warmup", phase.FLUSH)
    flush = allocator.keeping(flush_cache)
    assert flush(empty_cache=True) is True and flush(True) is True and flush() is True
    assert calls == [True, True, False]


def test_a_flush_cache_handed_over_by_position_is_wrapped_too():
    flush_cache, calls = _recording_flush()

    module = types.ModuleType("flush_wrapper")

    def init(self, flush_cache, is_fully_idle=None):
        self.f = flush_cache

    module.SchedulerFlushWrapper = type("SchedulerFlushWrapper", (), {"__init__": init})
    allocator._wrap(module)
    phase.set_phase("warmup", phase.FLUSH)
    module.SchedulerFlushWrapper(flush_cache).f()
    with pytest.raises(TypeError):                  # SGLang's own error for a wrong call
        module.SchedulerFlushWrapper()
    assert calls == [False]


@SITES
def test_a_busy_scheduler_flushes_nothing_and_says_nothing(site, caplog):
    wrapper, fw, self, _, emptied = _server(site, idle=False)
    phase.set_phase("warmup", phase.FLUSH)
    with caplog.at_level(logging.INFO, logger="sglang_warmup.allocator"):
        assert wrapper.handle(_request(fw)).success is False
    self.tree_cache.reset.assert_not_called()
    assert emptied == [] and "kept" not in caplog.text


@SITES
def test_sglang_hands_the_flush_wrapper_the_bound_method_and_calls_it_without_arguments(site):
    """What the wrap relies on, read from the source: the scheduler builds its flush wrapper
    with ``flush_cache=self.flush_cache`` (after the plugin armed), and the wrapper calls it
    without arguments, so the default ``empty_cache=True`` applies unless we choose."""
    tree = _source(site, "sglang/srt/managers/scheduler.py")
    built = [n for n in ast.walk(tree) if isinstance(n, ast.Call)
             and getattr(n.func, "id", getattr(n.func, "attr", None)) == "SchedulerFlushWrapper"]
    assert built and all(any(k.arg == "flush_cache" and isinstance(k.value, ast.Attribute)
                             and k.value.attr == "flush_cache" for k in c.keywords)
                         for c in built)
    handler = _source(site, "sglang/srt/managers/scheduler_components/flush_wrapper.py")
    calls = [n for n in ast.walk(handler) if isinstance(n, ast.Call)
             and isinstance(n.func, ast.Attribute) and n.func.attr == "_flush_cache"]
    assert calls and all(not c.args and not c.keywords for c in calls)


@SITES
def test_the_kept_blocks_reach_the_run_report_of_this_run_only(site, warmup_isolated):
    """The scheduler's record goes to the compile log the driver reads after its flush; a
    record of an earlier start in the same state directory is not this run's."""
    from prometheus_client import CollectorRegistry

    from cache_tools import compile_log
    from warmup.observe import events
    from warmup.serve.report import RunReport
    from warmup.view.text import run_report as render

    wrapper, fw, _, _, _ = _server(site)
    started = time.time() - 1
    try:
        events.install(registry=CollectorRegistry(), state_dir=warmup_isolated)
        events.note(compile_log.ALLOCATOR, "torch", kept_bytes=9 << 30, time=started - 3600)
        phase.set_phase("warmup", phase.FLUSH)
        phase.reset()               # the scheduler reads the file, as another process does
        with mock.patch.object(allocator, "cached_free_bytes", return_value=3390 << 20):
            assert wrapper.handle(_request(fw)).success is True
        phase.set_phase("serving")
        assert wrapper.handle(_request(fw)).success is True                # an operator's
    finally:
        events.uninstall()
        phase.reset()
    records = compile_log.read_dir(warmup_isolated)
    kept = [r for r in records if r["event"] == compile_log.ALLOCATOR]   # (a long GC may add one)
    assert [(r["event"], r["phase"], r["shape_class"], r["kept_bytes"]) for r in kept] == [
        ("allocator", "init", None, 9 << 30), ("allocator", "warmup", phase.FLUSH, 3390 << 20)]
    report = RunReport("p", "0" * 64, "d", "in-process", started).with_compiles(records)
    assert report.allocator_kept == ({"pid": kept[1]["pid"], "kept_bytes": 3390 << 20},)
    assert report.compiles_total == 0                                       # not a compile
    assert render(report).splitlines()[-1] == (
        "the warm-up's flush kept the caching allocator's blocks in 1 scheduler(s), at most "
        "3,390 MiB cached and unused in one (WARMUP_KEEP_ALLOCATOR=0 empties them)")
    assert report.to_dict()["allocator_kept"][0]["kept_bytes"] == 3390 << 20


def test_an_sglang_without_the_choice_is_left_alone(caplog):
    def flush_cache(self):
        return True

    module = types.ModuleType("old_flush_wrapper")
    module.SchedulerFlushWrapper = type("SchedulerFlushWrapper", (), {
        "__init__": lambda self, *, flush_cache: setattr(self, "f", flush_cache)})
    allocator._wrap(module)
    old = module.SchedulerFlushWrapper(flush_cache=types.MethodType(flush_cache, object()))
    assert old.f.__name__ == "flush_cache" and not hasattr(old.f, "__sglang_warmup__")
    other = types.ModuleType("other_flush_wrapper")
    init = lambda self, flush: None  # noqa: E731  (no flush_cache argument at all)
    other.SchedulerFlushWrapper = type("SchedulerFlushWrapper", (), {"__init__": init})
    with caplog.at_level(logging.WARNING, logger="sglang_warmup.allocator"):
        allocator._wrap(other)
    assert other.SchedulerFlushWrapper.__init__ is init
    assert "takes no empty_cache" in caplog.text and "takes no flush_cache" in caplog.text


def test_a_flush_wrapper_module_without_the_class_is_named_as_such(caplog):
    """Not 'its SchedulerFlushWrapper takes no flush_cache' (what None's own ``__init__``,
    looked up on a missing class, used to say)."""
    module = types.ModuleType("flush_wrapper")
    with caplog.at_level(logging.WARNING, logger="sglang_warmup.allocator"):
        allocator._wrap(module)
    assert "flush_wrapper has no SchedulerFlushWrapper" in caplog.text
    assert "takes no flush_cache" not in caplog.text


def test_wrapping_twice_wraps_once():
    flush_cache, calls = _recording_flush()

    module = types.ModuleType("flush_wrapper")
    module.SchedulerFlushWrapper = type("SchedulerFlushWrapper", (), {
        "__init__": lambda self, *, flush_cache: setattr(self, "f", flush_cache)})
    allocator._wrap(module)
    first = module.SchedulerFlushWrapper.__init__
    allocator._wrap(module)
    assert module.SchedulerFlushWrapper.__init__ is first
    phase.set_phase("warmup", phase.FLUSH)
    module.SchedulerFlushWrapper(flush_cache=flush_cache).f()
    assert calls == [False]


def test_a_phase_read_that_raises_flushes_as_sglang_does(monkeypatch):
    """``phase.current`` is written never to raise; should it, SGLang's flush runs."""
    flush_cache, calls = _recording_flush()

    def broken():
        raise OSError("state directory gone")

    monkeypatch.setattr(phase, "current", broken)
    assert allocator.keeping(flush_cache)() is True and calls == [True]


def test_without_a_state_directory_nothing_is_wrapped(monkeypatch, caplog):
    from warmup.observe.importer import finder

    monkeypatch.delenv("WARMUP_STATE_DIR")
    monkeypatch.delitem(__import__("sys").modules, allocator.FLUSH_WRAPPER, raising=False)
    with caplog.at_level(logging.INFO, logger="sglang_warmup.allocator"):
        allocator.arm()
    assert allocator.FLUSH_WRAPPER not in finder().watched
    assert "no state directory" in caplog.text


def test_the_driver_names_its_flush_in_the_phase_a_scheduler_reads(fake_tokenizer_manager,
                                                                   tiny_plan_path, warmup_isolated):
    """The driver's flush request arrives while the phase file says warm-up flush; a scheduler
    process, which shares only the state directory, sees it so."""
    from warmup.plan import facts as facts_mod, loader
    from warmup.plan.expand import expand
    from warmup.serve.driver import Driver
    from warmup.serve.transport import InProcessTransport

    tm = fake_tokenizer_manager()
    seen = []
    original = tm.flush_cache_communicator

    async def flush(req):
        phase.reset()  # forget this process's value: read the file as another process does
        seen.append(allocator.is_warmup_flush())
        return await original(req)

    tm.flush_cache_communicator = flush
    facts = asyncio.run(facts_mod.from_tokenizer_manager(tm))
    exp = expand(loader.load(tiny_plan_path), facts)
    report = asyncio.run(Driver(InProcessTransport(tm)).run(exp))
    assert report.ok and seen == [True]
    assert not allocator.is_warmup_flush()  # the phase moved on
