"""The post-import hook, on small modules written for the test."""

from __future__ import annotations

import importlib
import importlib.machinery
import logging
import sys

import pytest

from warmup.observe.importer import PostImportFinder


@pytest.fixture
def package(tmp_path, monkeypatch):
    """A fresh importable package ``pih_<test>`` with helpers to add modules to it."""
    name = f"pih_{abs(hash(str(tmp_path))) % 10**8}"
    root = tmp_path / name
    root.mkdir()
    (root / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    finder = PostImportFinder()
    yield name, root, finder
    finder.unwatch_all()
    for mod in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
        del sys.modules[mod]


def test_callback_runs_after_the_body_and_before_import_returns(package):
    name, root, finder = package
    (root / "target.py").write_text("VALUE = 41\n")
    seen = []

    def callback(module):
        seen.append(module.VALUE)
        module.VALUE += 1

    finder.watch(f"{name}.target", callback)
    assert sys.meta_path[0] is finder
    from_import = importlib.import_module(f"{name}.target")
    assert seen == [41] and from_import.VALUE == 42
    assert isinstance(from_import.__loader__, importlib.machinery.SourceFileLoader)
    assert from_import.__spec__.loader is from_import.__loader__
    assert finder not in sys.meta_path  # nothing left to watch


def test_unwatched_modules_are_not_touched(package):
    name, root, finder = package
    (root / "other.py").write_text("X = 1\n")
    finder.watch(f"{name}.target", lambda module: None)
    module = importlib.import_module(f"{name}.other")
    assert isinstance(module.__loader__, importlib.machinery.SourceFileLoader)
    assert finder.watched == {f"{name}.target"}


def test_a_failing_callback_never_breaks_the_import(package, caplog):
    name, root, finder = package
    (root / "target.py").write_text("VALUE = 1\n")

    def callback(module):
        raise RuntimeError("boom")

    finder.watch(f"{name}.target", callback)
    with caplog.at_level(logging.ERROR, logger="sglang_warmup.importer"):
        module = importlib.import_module(f"{name}.target")
    assert module.VALUE == 1
    assert [r.getMessage() for r in caplog.records] == [
        f"sglang-warmup: post-import callback for {name}.target failed"]


def test_a_module_that_fails_to_import_keeps_its_watch(package):
    name, root, finder = package
    (root / "target.py").write_text("raise ImportError('not today')\n")
    calls = []
    finder.watch(f"{name}.target", calls.append)
    with pytest.raises(ImportError, match="not today"):
        importlib.import_module(f"{name}.target")
    assert calls == [] and finder.watched == {f"{name}.target"}
    (root / "target.py").write_text("VALUE = 2\n")
    importlib.invalidate_caches()
    module = importlib.import_module(f"{name}.target")
    assert calls == [module]


def test_several_watchers_of_one_module_and_their_own_undo(package):
    name, root, finder = package
    (root / "target.py").write_text("VALUE = 1\n")
    first, second, third = [], [], []
    finder.watch(f"{name}.target", first.append)
    undo_second = finder.watch(f"{name}.target", second.append)
    finder.watch(f"{name}.target", third.append)
    undo_second()  # only that watch goes
    assert finder.watched == {f"{name}.target"} and finder in sys.meta_path
    module = importlib.import_module(f"{name}.target")
    assert (first, second, third) == ([module], [], [module])
    assert finder not in sys.meta_path


def test_the_last_undo_removes_the_finder(package):
    name, root, finder = package
    undo = finder.watch(f"{name}.target", lambda module: None)
    assert sys.meta_path[0] is finder
    undo()
    undo()  # twice is harmless
    assert finder.watched == frozenset() and finder not in sys.meta_path


def test_reverting_the_patches_leaves_other_watches_in_place(package):
    """The patch registry removes its own watches, not the compile events' or Inductor's."""
    from warmup.observe import importer
    from warmup import patches

    name, root, _ = package
    (root / "target.py").write_text("VALUE = 1\n")
    seen = []
    undo = importer.finder().watch(f"{name}.target", seen.append)
    try:
        patches.activate()
        patches.revert()
        assert f"{name}.target" in importer.finder().watched
        module = importlib.import_module(f"{name}.target")
        assert seen == [module]
    finally:
        undo()
