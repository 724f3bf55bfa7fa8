"""warmup.serve.allocator: SGLang's real ``Scheduler.flush_cache`` (compiled from the 0.5.22 and
0.5.23 sources; the scheduler module itself does not import on the CPU profile) keeps the
caching allocator's blocks on the warm-up's flush and on no other; the driver names that flush
in the phase file a scheduler process reads."""

from __future__ import annotations

import ast
import asyncio
import logging
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


def _scheduler(module, idle: bool = True):
    self = mock.MagicMock(name="scheduler")
    self.is_fully_idle.return_value = idle
    self._engine_paused = False
    return self


@SITES
def test_the_warmup_flush_resets_the_pools_and_keeps_the_allocator(site, caplog):
    module, emptied = _scheduler_module(site)
    allocator._wrap(module)
    self = _scheduler(module)
    phase.set_phase("warmup", phase.FLUSH)
    with caplog.at_level(logging.INFO, logger="sglang_warmup.allocator"):
        assert module.Scheduler.flush_cache(self) is True
    self.tree_cache.reset.assert_called_once_with()
    self.req_to_token_pool.clear.assert_called_once_with()
    self.token_to_kv_pool_allocator.clear.assert_called_once_with()
    assert emptied == []
    assert "the warm-up's flush kept the caching allocator's blocks" in caplog.text
    assert "WARMUP_KEEP_ALLOCATOR=0" in caplog.text


@SITES
def test_the_kept_blocks_reach_the_run_report_of_this_run_only(site, tmp_path):
    """The scheduler's record goes to the compile log the driver reads after its flush; a
    record of an earlier start in the same state directory is not this run's."""
    from prometheus_client import CollectorRegistry

    from cache_tools import compile_log
    from warmup.observe import events
    from warmup.serve.report import RunReport, render

    module, _ = _scheduler_module(site)
    allocator._wrap(module)
    started = 1_000_000.0
    try:
        events.install(registry=CollectorRegistry(), state_dir=tmp_path)
        events.note(compile_log.ALLOCATOR, "torch", kept_bytes=9 << 30, time=started - 3600)
        phase.set_phase("warmup", phase.FLUSH, state_dir=str(tmp_path))
        with mock.patch.object(allocator, "reserved_bytes", return_value=3390 << 20):
            assert module.Scheduler.flush_cache(_scheduler(module)) is True
        phase.set_phase("serving", state_dir=str(tmp_path))
        assert module.Scheduler.flush_cache(_scheduler(module)) is True    # an operator's
    finally:
        events.uninstall()
        phase.reset()
    records = compile_log.read_dir(tmp_path)
    kept = [r for r in records if r["event"] == compile_log.ALLOCATOR]   # (a long GC may add one)
    assert [(r["event"], r["phase"], r["shape_class"], r["kept_bytes"]) for r in kept] == [
        ("allocator", "init", None, 9 << 30), ("allocator", "warmup", phase.FLUSH, 3390 << 20)]
    report = RunReport("p", "0" * 64, "d", "in-process", started).with_compiles(records)
    assert report.allocator_kept == ({"pid": kept[1]["pid"], "kept_bytes": 3390 << 20},)
    assert report.compiles_total == 0                                       # not a compile
    assert render(report).splitlines()[-1] == (
        "the warm-up's flush kept the caching allocator's blocks in 1 scheduler(s), at most "
        "3,390 MiB in one (WARMUP_KEEP_ALLOCATOR=0 empties them)")
    assert report.to_dict()["allocator_kept"][0]["kept_bytes"] == 3390 << 20


@SITES
@pytest.mark.parametrize("state", [("init", None), ("warmup", "extends"),
                                   ("warmup", "sglang_startup"), ("serving", None)])
def test_every_other_flush_empties_the_allocator_as_sglang_does(site, state):
    module, emptied = _scheduler_module(site)
    allocator._wrap(module)
    phase.set_phase(*state)
    assert module.Scheduler.flush_cache(_scheduler(module)) is True
    assert emptied == ["platform"]


@SITES
def test_a_caller_that_chooses_keeps_its_choice_during_the_flush(site):
    module, emptied = _scheduler_module(site)
    allocator._wrap(module)
    phase.set_phase("warmup", phase.FLUSH)
    module.Scheduler.flush_cache(_scheduler(module), empty_cache=True)
    module.Scheduler.flush_cache(_scheduler(module), True)
    assert emptied == ["platform", "platform"]


@SITES
def test_a_busy_scheduler_flushes_nothing_and_says_nothing(site, caplog):
    module, emptied = _scheduler_module(site)
    allocator._wrap(module)
    phase.set_phase("warmup", phase.FLUSH)
    self = _scheduler(module, idle=False)
    with caplog.at_level(logging.INFO, logger="sglang_warmup.allocator"):
        assert module.Scheduler.flush_cache(self) is False
    self.tree_cache.reset.assert_not_called()
    assert emptied == [] and "kept" not in caplog.text


@SITES
def test_sglangs_flush_handler_calls_the_method_the_scheduler_bound_at_construction(site):
    """What the wrap relies on, read from the source: the scheduler hands ``self.flush_cache``
    to its flush handler when it is built (after the plugin wrapped the class), and the handler
    calls it without arguments, so the default ``empty_cache=True`` applies unless we choose."""
    tree = _source(site, "sglang/srt/managers/scheduler.py")
    bound = [k for n in ast.walk(tree) if isinstance(n, ast.Call) for k in n.keywords
             if k.arg == "flush_cache" and isinstance(k.value, ast.Attribute)
             and k.value.attr == "flush_cache"]
    assert bound
    handler = _source(site, "sglang/srt/managers/scheduler_components/flush_wrapper.py")
    calls = [n for n in ast.walk(handler) if isinstance(n, ast.Call)
             and isinstance(n.func, ast.Attribute) and n.func.attr == "_flush_cache"]
    assert calls and all(not c.args and not c.keywords for c in calls)


def test_a_flush_cache_without_the_choice_is_left_alone(caplog):
    def flush_cache(self):
        return True

    module = types.ModuleType("old_scheduler")
    module.Scheduler = type("Scheduler", (), {"flush_cache": flush_cache})
    with caplog.at_level(logging.WARNING, logger="sglang_warmup.allocator"):
        allocator._wrap(module)
    assert module.Scheduler.flush_cache is flush_cache
    assert "takes no empty_cache" in caplog.text


def test_wrapping_twice_wraps_once():
    calls = []

    def flush_cache(self, empty_cache: bool = True):
        calls.append(empty_cache)
        return True

    module = types.ModuleType("scheduler")
    module.Scheduler = type("Scheduler", (), {"flush_cache": flush_cache})
    allocator._wrap(module)
    first = module.Scheduler.flush_cache
    allocator._wrap(module)
    assert module.Scheduler.flush_cache is first and first.__wrapped__ is flush_cache
    phase.set_phase("warmup", phase.FLUSH)
    module.Scheduler().flush_cache()
    assert calls == [False]


def test_an_unreadable_phase_flushes_as_sglang_does(monkeypatch):
    calls = []

    def flush_cache(self, empty_cache: bool = True):
        calls.append(empty_cache)
        return True

    def broken():
        raise OSError("state directory gone")

    monkeypatch.setattr(phase, "current", broken)
    wrapped = allocator.keeping(flush_cache)
    assert wrapped(object()) is True and calls == [True]


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
