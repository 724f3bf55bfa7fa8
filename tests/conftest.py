"""Test configuration shared by every package: run from the repository root."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# Helper modules every test package shares (_loopback) sit next to this file.
sys.path.insert(0, str(Path(__file__).resolve().parent))


def pytest_configure(config):
    """Under pytest-xdist the controller starts the test zygote (_interpreter.py) as the run
    begins and its workers share it: one preload of torch, Triton and transformers for the run
    instead of one per worker, started while the workers collect."""
    import _interpreter

    distributed = getattr(config.option, "numprocesses", None) and \
        getattr(config.option, "dist", "no") != "no"
    if distributed and not hasattr(config, "workerinput") and _interpreter.wanted() and \
            not os.environ.get(_interpreter.SHARED):
        _interpreter.start_shared()


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config):
    """A pytest-xdist worker leaves at once when its session is over (its results went with
    ``workerfinished``; xdist ignores the closed connection after that): its exit handlers run
    and its streams are flushed, and the interpreter's teardown of torch, Triton and SGLang
    (about 2 s of CPU a worker, the workers at once, while the controller waits) is skipped,
    with pytest's own cleanups after this hook.  Not while a test's non-daemon thread is still
    alive: the worker then shuts down as usual and waits for it, as before."""
    import threading

    if hasattr(config, "workerinput") and not [
            t for t in threading.enumerate()
            if t is not threading.main_thread() and not t.daemon and t.is_alive()]:
        import atexit

        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


@pytest.fixture(autouse=True, scope="session")
def _repo_root_cwd():
    old = os.getcwd()
    os.chdir(ROOT)
    yield
    os.chdir(old)


#: This process's environment as its tests start (a pytest-xdist worker has set its own
#: variables by the time it imports this file).
_ENVIRONMENT = dict(os.environ)


@pytest.fixture(autouse=True)
def _environment_put_back():
    """Each test ends with the environment the tests started with, whatever a test or a
    fixture of any scope changed without monkeypatch.  Importing SGLang and resolving its
    server args set its third-party cache variables (TORCHINDUCTOR_CACHE_DIR, TRITON_CACHE_DIR,
    ...) in the process; every later test interpreter started with such a variable changed
    could not come from the test zygote's preloaded stages.  (Pytest's PYTEST_CURRENT_TEST,
    set for the test, stays until pytest removes it.)  A fixture that must change the
    environment does so in function scope, through monkeypatch: a wider one's change would
    last only until the end of its first test."""
    from cache_tools.locations import put_back

    yield
    current = os.environ.get("PYTEST_CURRENT_TEST")
    put_back(_ENVIRONMENT if current is None else {**_ENVIRONMENT, "PYTEST_CURRENT_TEST": current})


@pytest.fixture(autouse=True)
def _no_recorders_left_installed():
    """No test leaves the compile-event recorders installed in its pytest worker.  SGLang's
    plugin loading, run in-process by a test with WARMUP_ENABLE=1, installs them for the
    process's life with the state directory of that moment; a later test's ``events.install``
    would then keep those (``already_installed``) and its records would go elsewhere."""
    yield
    events = sys.modules.get("warmup.observe.events")
    if events is not None and events.installed():
        events.uninstall()


@pytest.fixture
def spawn_from_zygote():
    """multiprocessing's ``spawn`` children start through the test zygote (_interpreter.py)
    during the test: for spawned processes that import SGLang."""
    import multiprocessing.spawn

    from _interpreter import python

    before = multiprocessing.spawn.get_executable()
    multiprocessing.set_executable(python())
    yield
    multiprocessing.set_executable(before)


@pytest.fixture
def endpoint_server():
    """The sidecar's EndpointServer on 127.0.0.1 (a free port) answering every path with 200
    ``{"path": ...}``; built with ``endpoint_server(**limits)``, shut down afterwards."""
    import threading

    from warmup.sidecar.endpoints import Answer, EndpointServer, Limits

    started = []

    def start(**limits):
        srv = EndpointServer("127.0.0.1", 0, lambda path: Answer.json(200, {"path": path}),
                             limits=Limits(**limits))
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        started.append(srv)
        return srv

    yield start
    for srv in started:
        srv.shutdown()
        srv.server_close()
