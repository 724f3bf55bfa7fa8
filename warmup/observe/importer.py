"""A post-import hook: run a callback right after a named module finishes executing, before
the ``import`` statement that loaded it returns.

Installed as the first entry of ``sys.meta_path``.  For a watched name it asks the other
finders for the real spec and wraps the spec's loader; after the real ``exec_module`` the
module's ``__loader__`` is set back to the real loader and the callback runs.  Nothing is
imported on our account, so a process that never loads the DeepSeek-V4 backend never pays for
it.  The finder removes itself once every watched module has loaded.

One finder serves the whole process (``finder()``): the patches, the compile events (SGLang's
JIT builders) and the Inductor worker hook each watch their modules through it.  A name may
have several callbacks; ``watch`` returns the undo of that one watch.
"""

from __future__ import annotations

import importlib.abc
import logging
import sys
import threading
from types import ModuleType
from typing import Callable

logger = logging.getLogger("sglang_warmup.importer")

Callback = Callable[[ModuleType], None]


class _Loader(importlib.abc.Loader):
    """Delegates to the real loader, then runs the callback once the module is executed."""

    def __init__(self, loader: importlib.abc.Loader, finder: "PostImportFinder") -> None:
        self._loader = loader
        self._finder = finder

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        try:
            self._loader.exec_module(module)
        finally:
            module.__loader__ = self._loader
            spec = getattr(module, "__spec__", None)
            if spec is not None:
                spec.loader = self._loader
        self._finder.loaded(module)

    def __getattr__(self, name: str):
        return getattr(self._loader, name)


class PostImportFinder(importlib.abc.MetaPathFinder):
    """Watches module names; see the module docstring."""

    def __init__(self) -> None:
        self._callbacks: dict[str, list[Callback]] = {}
        self._resolving: set[str] = set()
        self._lock = threading.RLock()

    @property
    def watched(self) -> frozenset[str]:
        return frozenset(self._callbacks)

    def watch(self, name: str, callback: Callback) -> Callable[[], None]:
        """Run ``callback(module)`` once ``name`` has executed; returns the undo of this watch."""
        with self._lock:
            self._callbacks.setdefault(name, []).append(callback)
            if self not in sys.meta_path:
                sys.meta_path.insert(0, self)
        return lambda: self.unwatch(name, callback)

    def unwatch(self, name: str, callback: Callback) -> None:
        with self._lock:
            callbacks = self._callbacks.get(name, [])
            if callback in callbacks:
                callbacks.remove(callback)
            if not callbacks:
                self._callbacks.pop(name, None)
            if not self._callbacks:
                self._remove()

    def unwatch_all(self) -> None:
        with self._lock:
            self._callbacks.clear()
            self._remove()

    def _remove(self) -> None:
        try:
            sys.meta_path.remove(self)
        except ValueError:
            pass

    def find_spec(self, fullname, path=None, target=None):
        with self._lock:
            if fullname not in self._callbacks or fullname in self._resolving:
                return None
            self._resolving.add(fullname)
        try:
            for finder in list(sys.meta_path):
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(fullname, path, target)
                if spec is not None:
                    break
            else:
                return None
        finally:
            with self._lock:
                self._resolving.discard(fullname)
        loader = spec.loader
        if loader is None or not hasattr(loader, "exec_module"):
            logger.warning("sglang-warmup: cannot watch %s (loader %r); patches for it stand "
                           "aside", fullname, loader)
            return spec
        spec.loader = _Loader(loader, self)
        return spec

    def loaded(self, module: ModuleType) -> None:
        with self._lock:
            callbacks = self._callbacks.pop(module.__name__, [])
            if not self._callbacks:
                self._remove()
        for callback in callbacks:
            try:
                callback(module)
            except Exception:  # noqa: BLE001 - a guest never raises into its host's import
                logger.exception("sglang-warmup: post-import callback for %s failed",
                                 module.__name__)


_finder: PostImportFinder | None = None


def finder() -> PostImportFinder:
    """The process-wide finder (created on first use, installed on first ``watch``)."""
    global _finder
    if _finder is None:
        _finder = PostImportFinder()
    return _finder
