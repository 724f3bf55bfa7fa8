"""Fresh Python interpreters for the tests, forked from a warm one (a "zygote").

Most of the slow tests start a Python process (``python -c``, ``python -m``, a multiprocessing
``spawn`` child) that imports SGLang, and most of such a start (6-10 s on a 2-core CI machine)
goes to SGLang's third-party dependencies: torch, transformers, triton, openai, ...  A zygote
imports those once and forks a child per start; the child becomes the interpreter that was
asked for, and imports SGLang and the code under test itself, so what they do at import time
(plugin hooks, patches, variables read at import) still happens in the child, per test.

Use: ``python()`` is the path of a launcher that stands in for ``sys.executable`` in a command
line (``subprocess.run([python(), "-c", code, ...])``, ``Popen``) and, through the
``spawn_from_zygote`` fixture (tests/conftest.py), for multiprocessing's ``spawn``.  The
launcher hands its argv, environment, working directory, umask, ignored signals and open file
descriptors (0-2 and any others, at the same numbers) to the zygote; the child gets all of them,
``sys.path`` as a fresh interpreter builds it (the script's directory or '' and PYTHONPATH first)
and a new ``__main__``, runs the code and exits through the interpreter's normal shutdown.  The
launcher forwards SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1 and SIGUSR2 to the child and exits
as the child did (its code, or killed by the same signal); killing the launcher kills the
child's process group.

The zygote never imports SGLang, sglang-warmup, cache_tools, prometheus_client (which reads
PROMETHEUS_MULTIPROC_DIR at import) or the tests.  It preloads in two stages (``STAGES``), each
serving on its own socket: ``base`` (torch, transformers, triton, openai, ...) and ``compiler``
(+ torch._dynamo and Inductor, which read and set TORCHINDUCTOR_CACHE_DIR at import), so that a
start with its own TORCHINDUCTOR_CACHE_DIR (the doctor's check process) still gets ``base``.

A start runs as a real fresh interpreter (the launcher execs ``sys.executable``) whenever a
child could differ from one:

* a command line other than ``-c CODE``, ``-m MODULE`` or a script file (``-I``, ``-S``, ``-X``);
* an environment that differs from the zygote's in a variable the preload read (recorded while
  it imported: HOME, TMPDIR, XDG_CACHE_HOME, ...), in one whose prefix a preloaded module scans
  the environment for (``_SCANNED``), or in one the interpreter or the native libraries read
  when they load (``_AT_LOAD``: PYTHON* other than PYTHONPATH, LD_*, LC_*, OMP_*, ...);
  variables the preload itself set are set in the child (they would be by the same imports);
* a ``sys.path`` (its first entry, PYTHONPATH) that would find a preloaded module somewhere
  other than where the zygote found it;
* a descriptor number the preload holds, or any unforeseen scan of the environment while
  preloading (then every start is fresh: the zygote's log says why).

Known differences from a fresh interpreter, which the tests that use it do not depend on: the
preloaded modules are in ``sys.modules`` from the start (SGLang's own processes import torch
before sglang-warmup's plugin too); the child's parent is the zygote and it leads its own
process group; its hash seed is the zygote's; multiprocessing's ``spawn`` in a child goes
through the launcher too (``sys.executable`` stays the real one).

One zygote per test run: under pytest-xdist the controller starts it as the run begins
(``start_shared``, from tests/conftest.py) and the workers share it; otherwise the first
``python()`` of the process starts it.  It stops when the process that started it exits (the
zygote watches a pipe from it); a worker whose shared zygote died starts its own.  Its log
(each start: forked or fresh, and why) is ``zygote.log`` in its directory (``directory()``).
``WARMUP_TEST_ZYGOTE=0`` turns it off: ``python()`` is ``sys.executable``.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time

TESTS = os.path.dirname(os.path.abspath(__file__))

#: What importing SGLang 0.5.22 imports from outside SGLang (the roots of ``python -X importtime
#: -c "import sglang.srt.server_args, sglang.srt.plugins, sglang.kernels.jit.utils.compile.loader,
#: sglang.srt.layers.attention.deepseek_v4_backend"``), in that order; ``compiler`` is what
#: imports torch._dynamo.  A module missing here is imported by the child, as without a zygote.
STAGES = (
    ("base", ("numpy", "psutil", "requests", "torch", "triton", "PIL.Image", "starlette.routing",
              "msgspec", "pydantic", "zmq", "transformers",
              "transformers.generation.configuration_utils", "IPython.display", "aiohttp",
              "openai.types.responses", "fsspec", "gguf")),
    ("compiler", ("transformers.models.auto.tokenization_auto", "compressed_tensors.config",
                  "transformers.modeling_gguf_pytorch_utils",
                  "transformers.image_processing_utils", "transformers.activations",
                  "transformers.modeling_layers", "torch._dynamo.repro.after_dynamo",
                  "torch._inductor.compile_fx")),
)
#: Never preloaded: the code under test, and what must see its environment at import.
_NEVER = ("sglang", "warmup", "cache_tools", "prometheus_client", "tests")
#: Modules that scan the whole environment at import (file of the scan: prefixes it keeps).
_SCANNED = {"tqdm/utils.py": ("TQDM_",), "fsspec/config.py": ("FSSPEC_",),
            "networkx/utils/backends.py": ("NETWORKX_",)}
#: Read by the interpreter at start-up or by native libraries when they load (not seen by the
#: recording of os.environ): a start that changes one of these is a fresh interpreter.
_AT_LOAD = ("PYTHON", "LD_", "LC_", "LANG", "OMP_", "GOMP_", "KMP_", "MKL_", "OPENBLAS_",
            "MALLOC_", "CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "TORCH_", "PYTORCH_")
#: Set by the preload to the value it then uses (torch's Inductor cache directory): a start
#: whose environment already holds that value gets the same state from the same imports.
_SETTLED = ("TORCHINDUCTOR_CACHE_DIR",)
_FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1,
              signal.SIGUSR2)
#: The environment of this process before any test changed it (the zygote's environment).
_ENVIRONMENT = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
_HEADER = struct.Struct("!Q")


# --- the test process's side -------------------------------------------------------------------
_zygote: _Zygote | None = None


#: Where pytest-xdist's controller started the zygote its workers share (``start_shared``).
SHARED = "WARMUP_TEST_ZYGOTE_DIR"
#: Read as this module is imported (a worker imports it while pytest configures, before any
#: test): a test that clears or replaces the environment must not make the worker start a zygote
#: of its own (a second preload, ~12 CPU seconds).
_SHARED_DIR = os.environ.get(SHARED)


def python() -> str:
    """The launcher to use where a test would run ``sys.executable`` (starts the zygote, or
    joins the one the pytest-xdist controller started)."""
    global _zygote
    if not wanted():
        return sys.executable
    if _zygote is None:
        _zygote = (_joined(_SHARED_DIR) if _SHARED_DIR else None) or _Zygote()
    return _zygote.launcher


def wanted() -> bool:
    """Whether test interpreters come from a zygote here (not with WARMUP_TEST_ZYGOTE=0, not
    on a GPU machine)."""
    return os.environ.get("WARMUP_TEST_ZYGOTE") != "0" and not _has_gpu()


def start_shared() -> None:
    """Start the zygote in this process (pytest-xdist's controller, which outlives its workers)
    without waiting for it, and name it to the workers, which share it (``python``): one
    preload for the whole run instead of one per worker."""
    global _zygote
    _zygote = _Zygote(wait=False)
    os.environ[SHARED] = _zygote.directory


class _Shared:
    """A zygote another process started and stops (see ``start_shared``)."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.launcher = os.path.join(directory, "python")


def _joined(directory: str) -> _Shared | None:
    """The shared zygote once each stage listens; None when it died first (this process then
    starts its own)."""
    try:
        with open(os.path.join(directory, "zygote.pid")) as fh:
            pid = int(fh.read())
    except (OSError, ValueError):
        return None
    sockets = [os.path.join(directory, f"stage-{n}.sock") for n in range(len(STAGES))]
    deadline = time.monotonic() + 600
    while not all(os.path.exists(s) for s in sockets):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        if time.monotonic() > deadline:
            return None
        time.sleep(0.05)
    return _Shared(directory)


def _has_gpu() -> bool:
    """A CUDA or ROCm device: a child must not inherit a preload that may have touched it."""
    return os.path.exists("/dev/nvidiactl") or os.path.exists("/dev/kfd")


def directory() -> str | None:
    """The zygote's directory (sockets, launcher, zygote.log); None before it starts."""
    return _zygote.directory if _zygote else None


class _Zygote:
    def __init__(self, wait: bool = True) -> None:
        self.directory = tempfile.mkdtemp(prefix="sgw-zygote-",
                                          dir="/tmp" if os.path.isdir("/tmp") else None)
        self.launcher = os.path.join(self.directory, "python")
        with open(self.launcher, "w") as fh:
            fh.write(f"#!{sys.executable} -IS\nimport sys\nsys.path.insert(0, {TESTS!r})\n"
                     f"from _interpreter import launch\nlaunch({self.directory!r}, "
                     f"{len(STAGES)}, {sys.executable!r})\n")
        os.chmod(self.launcher, 0o755)
        boot = (f"import sys; sys.path.append({TESTS!r}); import _interpreter; "
                f"sys.path.remove({TESTS!r}); _interpreter.zygote({self.directory!r})")
        with open(os.path.join(self.directory, "zygote.log"), "ab") as log:
            self.proc = subprocess.Popen([sys.executable, "-c", boot], stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, stderr=log,
                                         cwd=self.directory, env=_ENVIRONMENT)
        with open(os.path.join(self.directory, "zygote.pid"), "w") as fh:
            fh.write(str(self.proc.pid))
        atexit.register(self.stop)
        if wait:
            self.wait_ready()

    def wait_ready(self) -> None:
        ready = set()
        deadline = time.monotonic() + 600
        while len(ready) < len(STAGES):
            line = self.proc.stdout.readline().decode()
            if not line.startswith("ready ") or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the test zygote did not start ({line!r}); its log: "
                                   f"{self.directory}/zygote.log")
            ready.add(line.split()[1])

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()  # the lifeline: the zygote exits and kills its children
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        if os.environ.get("WARMUP_TEST_ZYGOTE_KEEP") != "1":
            shutil.rmtree(self.directory, ignore_errors=True)


# --- the launcher (runs with -I -S: standard library only, nothing slow) -----------------------
def launch(directory: str, stages: int, executable: str) -> None:
    """Run ``sys.argv[1:]`` in a child of the deepest zygote stage that takes it, else exec a
    fresh interpreter with it."""
    argv = sys.argv[1:]
    fds = []
    for name in os.listdir("/proc/self/fd"):
        try:
            os.fstat(int(name))
        except OSError:
            continue  # the listing's own descriptor, closed by now
        fds.append(int(name))
    umask = os.umask(0)
    os.umask(umask)
    request = json.dumps({
        "argv": argv, "env": dict(os.environ), "cwd": os.getcwd(), "fds": fds, "umask": umask,
        "ignored": [int(s) for s in signal.valid_signals()
                    if s not in (signal.SIGPIPE, signal.SIGXFSZ)
                    and signal.getsignal(s) == signal.SIG_IGN],
        "blocked": [int(s) for s in signal.pthread_sigmask(signal.SIG_BLOCK, [])],
    }, ensure_ascii=False).encode("utf-8", "surrogatepass")
    payload = _HEADER.pack(len(request)) + request
    for stage in reversed(range(stages)):
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            conn.connect(os.path.join(directory, f"stage-{stage}.sock"))
            sent = socket.send_fds(conn, [payload], fds)
            conn.sendall(payload[sent:])
            reply = conn.makefile("rb")
            first = reply.readline().split()
        except OSError:
            conn.close()
            continue
        if first[:1] == [b"pid"]:
            _wait_for(int(first[1]), reply)
        conn.close()
    os.execv(executable, [executable, *argv])


def _wait_for(pid: int, reply) -> None:
    def forward(signum, frame):
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass

    for signum in _FORWARDED:
        if signal.getsignal(signum) != signal.SIG_IGN:
            signal.signal(signum, forward)
    line = reply.readline().split()
    if line[:1] != [b"exit"]:
        os.write(2, b"launcher: the test zygote went away before its child exited\n")
        os._exit(255)
    status = int(line[1])
    if os.WIFSIGNALED(status):
        signum = os.WTERMSIG(status)
        signal.signal(signum, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, [signum])
        os.kill(os.getpid(), signum)
        os._exit(128 + signum)
    os._exit(os.waitstatus_to_exitcode(status))


# --- the zygote ---------------------------------------------------------------------------------
def zygote(directory: str) -> None:
    """Preload ``STAGES``, forking a server per stage; serve until the lifeline (stdin) closes.
    Returns only in a forked child, as the interpreter it was asked to be; exits with its code."""
    recorder = _Recorder()
    stage = None
    for number, (name, modules) in enumerate(STAGES):
        if stage is not None:
            if os.fork():
                break  # the parent serves the previous stage, the child preloads the next one
            stage.listener.close()
        recorder.preload(name, modules)
        stage = _Stage(number, name, directory, recorder)
    job = stage.serve()
    job.finish(job.run())


class _Recorder:
    """What the preload read from, scanned in and wrote to ``os.environ``."""

    def __init__(self) -> None:
        self.initial = dict(os.environ)
        self.read: set[str] = set()
        self.written: dict[str, str | None] = {}
        self.scanned: set[str] = set()
        self.problem = ""

    def preload(self, name: str, modules: tuple[str, ...]) -> None:
        cls = type(os.environ)
        originals = cls.__getitem__, cls.__setitem__, cls.__delitem__, cls.__iter__
        recorder = self

        def site(frame) -> str:
            while frame is not None and frame.f_code.co_filename.startswith(
                    ("<frozen os>", "<frozen _collections_abc>", os.__file__)):
                frame = frame.f_back
            return frame.f_code.co_filename if frame is not None else "?"

        def scan_of(filename: str) -> tuple[str, ...] | None:
            return next((p for f, p in _SCANNED.items() if filename.endswith(f)), None)

        def getitem(self, key):
            frame = sys._getframe(1)
            if not (frame.f_code.co_name == "__iter__" and "_collections_abc" in
                    frame.f_code.co_filename) and scan_of(site(frame)) is None:
                recorder.read.add(os.fsdecode(key))
            return originals[0](self, key)

        def setitem(self, key, value):
            recorder.written[os.fsdecode(key)] = os.fsdecode(value)
            return originals[1](self, key, value)

        def delitem(self, key):
            recorder.written[os.fsdecode(key)] = None
            return originals[2](self, key)

        def iterate(self):
            where = site(sys._getframe(1))
            prefixes = scan_of(where)
            if prefixes is None:
                recorder.problem = recorder.problem or f"{where} scanned the whole environment"
            else:
                recorder.scanned.update(prefixes)
            return originals[3](self)

        cls.__getitem__, cls.__setitem__, cls.__delitem__, cls.__iter__ = (
            getitem, setitem, delitem, iterate)
        try:
            for module in modules:
                started = time.monotonic()
                try:
                    __import__(module)
                except Exception as exc:  # the child imports it then, as without a zygote
                    _log(f"[{name}] preloading {module} failed: {exc!r}")
                _log(f"[{name}] {module}: {time.monotonic() - started:.2f} s")
        finally:
            cls.__getitem__, cls.__setitem__, cls.__delitem__, cls.__iter__ = originals
        leaked = sorted(m for m in sys.modules if m.split(".")[0] in _NEVER)
        if leaked:
            self.problem = self.problem or f"the preload imported {leaked[:5]}"


class _Stage:
    """One preloaded stage: its socket, its rules, its children."""

    def __init__(self, number: int, name: str, directory: str, recorder: _Recorder) -> None:
        self.number, self.name, self.recorder = number, name, recorder
        self.base_path = sys.path[1:]  # without the zygote's own '' (its empty directory)
        self.reserved = {int(f) for f in os.listdir("/proc/self/fd")} - {0, 1, 2}
        self.reserved = {f for f in self.reserved if _is_open(f)}
        self.found_in = _preloaded_locations()
        self.address = os.path.join(directory, f"stage-{number}.sock")
        self.launcher = os.path.join(directory, "python")
        # options a command line may repeat: those that give this interpreter's own flags
        self.options = {o for o in subprocess._args_from_interpreter_flags()
                        if o.startswith("-") and len(o) == 2 and o not in ("-W", "-X")}
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(self.address)
        self.listener.listen(64)
        os.write(1, f"ready {name}\n".encode())
        _log(f"[{name}] ready: {len(sys.modules)} modules, read {len(recorder.read)} "
             f"variables, set {sorted(recorder.written)}, problem: {recorder.problem or 'none'}")

    def serve(self) -> _Job:
        import gc
        import selectors

        gc.collect()  # what the preload left is old: a child's young collections skip it
        sel = selectors.DefaultSelector()
        sel.register(self.listener, selectors.EVENT_READ, ("accept",))
        sel.register(0, selectors.EVENT_READ, ("lifeline",))
        running: dict[int, tuple[socket.socket, int]] = {}
        while True:
            for key, _ in sel.select():
                what = key.data
                if what[0] == "accept":
                    conn, _ = self.listener.accept()
                    try:
                        job = self.answer(conn)
                    except Exception as exc:  # a broken request: the launcher runs fresh
                        _log(f"[{self.name}] request failed: {exc!r}")
                        conn.close()
                        continue
                    if job is None:
                        continue
                    if job.pid == 0:  # the child: drop the server, become the interpreter
                        sel.close()
                        self.listener.close()
                        for other, pidfd in running.values():
                            other.close()
                            os.close(pidfd)
                        return job
                    pidfd = os.pidfd_open(job.pid)
                    running[job.pid] = (conn, pidfd)
                    sel.register(pidfd, selectors.EVENT_READ, ("exit", job.pid))
                    sel.register(conn, selectors.EVENT_READ, ("launcher", job.pid))
                elif what[0] == "lifeline":
                    if not os.read(0, 4096):
                        for pid in running:
                            _kill_group(pid)
                        os.unlink(self.address)
                        os._exit(0)
                elif what[0] == "exit":
                    conn, pidfd = running.pop(what[1])
                    _, status = os.waitpid(what[1], 0)
                    sel.unregister(pidfd)
                    os.close(pidfd)
                    if conn.fileno() in sel.get_map():
                        sel.unregister(conn)
                    try:
                        conn.sendall(f"exit {status}\n".encode())
                    except OSError:
                        pass
                    conn.close()
                elif what[0] == "launcher":  # it went away (killed): so does the child
                    _kill_group(what[1])
                    sel.unregister(key.fileobj)

    def answer(self, conn: socket.socket) -> _Job | None:
        conn.settimeout(30)
        data, fds, _, _ = socket.recv_fds(conn, 1 << 16, 1024)
        try:
            while len(data) < _HEADER.size or len(data) < _HEADER.size + _HEADER.unpack_from(
                    data)[0]:
                more = conn.recv(1 << 20)
                if not more:
                    raise EOFError("the launcher closed its request")
                data += more
            request = json.loads(data[_HEADER.size:].decode("utf-8", "surrogatepass"))
            job = _Job(request, fds, self.options)
            refusal = self.refusal(job)
        except BaseException:
            for fd in fds:
                os.close(fd)
            raise
        conn.settimeout(None)
        if refusal:
            _log(f"[{self.name}] fresh interpreter for {job.describe()}: {refusal}")
            for fd in fds:
                os.close(fd)
            conn.sendall(f"fresh {refusal}\n".encode())
            conn.close()
            return None
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        pid = os.fork()
        if pid == 0:
            conn.close()
            job.pid = 0
            job.env.update({k: v for k, v in self.recorder.written.items() if v is not None})
            for k in [k for k, v in self.recorder.written.items() if v is None]:
                job.env.pop(k, None)
            job.base_path, job.reserved, job.launcher = self.base_path, self.reserved, self.launcher
            return job
        try:
            os.setpgid(pid, pid)
        except OSError:
            pass  # it did so itself, or already exited
        for fd in fds:
            os.close(fd)
        job.pid = pid
        conn.sendall(f"pid {pid}\n".encode())
        _log(f"[{self.name}] pid {pid}: {job.describe()}")
        return job

    def refusal(self, job: _Job) -> str:
        """Why ``job`` must be a fresh interpreter; '' when a child of this stage is one."""
        if job.kind is None:
            return f"the command line {job.argv[:2]} is not [{' '.join(self.options)}] -c, -m or a script"
        if self.recorder.problem:
            return self.recorder.problem
        initial, env = self.recorder.initial, job.env
        written = self.recorder.written
        for key in sorted(self.recorder.read):
            if key == "PYTHONPATH" or env.get(key) == initial.get(key) or (
                    key in _SETTLED and key in written and env.get(key) == written[key]):
                continue
            return f"{key} differs from the zygote's (the preload read it)"
        watched = _AT_LOAD + tuple(self.recorder.scanned)
        for key in sorted(set(env) | set(initial)):
            if (key.startswith(watched) and key != "PYTHONPATH"
                    and env.get(key) != initial.get(key)):
                return f"{key} differs from the zygote's (read at start-up or scanned)"
        taken = self.reserved & set(job.fds)
        if taken:
            return f"descriptors {sorted(taken)} are held by the preload"
        return self.shadowing(job)

    def shadowing(self, job: _Job) -> str:
        """A preloaded module that the child's sys.path would find elsewhere, if any."""
        for entry in job.leading_path():
            if entry in self.base_path:
                continue
            try:
                names = os.listdir(entry or job.cwd)
            except OSError:
                continue
            for name in names:
                top = name.split(".")[0]
                place = self.found_in.get(top)
                if place is not None and place != os.path.abspath(entry or job.cwd) and (
                        name.endswith((".py", ".so")) or os.path.isfile(
                            os.path.join(entry or job.cwd, name, "__init__.py"))):
                    return f"{os.path.join(entry or job.cwd, name)} would shadow the preloaded {top}"
        return ""


class _Job:
    """One start: the request, and in the child, becoming that interpreter."""

    def __init__(self, request: dict, fds: list[int], options: set[str]) -> None:
        self.argv: list[str] = request["argv"]
        self.env: dict[str, str] = request["env"]
        self.cwd: str = request["cwd"]
        self.fds: list[int] = request["fds"]
        self.received = fds
        self.request = request
        self.pid = -1
        self.base_path: list[str] = []
        self.reserved: set[int] = set()
        self.launcher = ""
        self.kind, self.target, self.args = None, "", []
        if len(self.fds) != len(fds):
            raise ValueError(f"{len(fds)} descriptors for {len(self.fds)} numbers")
        argv = self.argv
        while argv and argv[0] in options:
            argv = argv[1:]
        if len(argv) >= 2 and argv[0] in ("-c", "-m"):
            self.kind, self.target, self.args = argv[0], argv[1], argv[2:]
        elif argv and not argv[0].startswith("-") and os.path.isfile(
                os.path.join(self.cwd, argv[0])):
            self.kind, self.target, self.args = "script", argv[0], argv[1:]

    def describe(self) -> str:
        shown = self.target if self.kind != "-c" else (self.target.strip() or "?").splitlines()[0][:60]
        return f"{self.kind} {shown!r} {' '.join(self.args)[:100]}"

    def leading_path(self) -> list[str]:
        """sys.path before the interpreter's own entries: the first entry, then PYTHONPATH."""
        if self.kind == "-c":
            first = ""
        elif self.kind == "-m":
            first = self.cwd
        else:
            first = os.path.dirname(os.path.realpath(os.path.join(self.cwd, self.target)))
        extra = []
        for entry in self.env.get("PYTHONPATH", "").split(os.pathsep):
            if entry:
                entry = os.path.normpath(os.path.join(self.cwd, entry))
                if entry not in extra:
                    extra.append(entry)
        return [first, *extra]

    # in the child
    def run(self) -> int:
        self._become()
        import builtins
        import importlib.machinery
        import runpy
        import types

        main = types.ModuleType("__main__")
        main.__builtins__, main.__loader__ = builtins, importlib.machinery.BuiltinImporter
        sys.modules["__main__"] = main
        try:
            if self.kind == "-c":
                sys.argv = ["-c", *self.args]
                exec(compile(self.target, "<string>", "exec"), main.__dict__)
            elif self.kind == "-m":
                sys.argv = ["-m", *self.args]
                runpy._run_module_as_main(self.target, alter_argv=True)
            else:
                path = os.path.abspath(self.target)
                sys.argv = [self.target, *self.args]
                main.__file__, main.__cached__ = path, None
                with open(path, "rb") as fh:
                    code = compile(fh.read(), path, "exec")
                exec(code, main.__dict__)
        except SystemExit as exc:
            if exc.code is None:
                return 0
            if isinstance(exc.code, int):
                return exc.code
            print(exc.code, file=sys.stderr)
            return 1
        except BaseException as exc:
            tb = exc.__traceback__
            while tb is not None and tb.tb_frame.f_code.co_filename == __file__:
                tb = tb.tb_next
            sys.excepthook(type(exc), exc.with_traceback(tb), tb)
            return 1
        return 0

    def _become(self) -> None:
        os.setpgid(0, 0)
        # descriptors: the launcher's at their numbers, nothing else but what the preload holds
        top = max(self.fds + self.received + [2]) + 1
        moved = [_dup_above(fd, top) for fd in self.received]
        for fd in self.received:
            os.close(fd)
        for number, fd in zip(self.fds, moved):
            os.dup2(fd, number)
            os.close(fd)
        keep = set(self.fds) | self.reserved
        for name in os.listdir("/proc/self/fd"):
            if int(name) not in keep:
                try:
                    os.close(int(name))
                except OSError:
                    pass
        # signals, mask, umask, environment, working directory
        for signum in self.request["ignored"]:
            signal.signal(signum, signal.SIG_IGN)
        signal.pthread_sigmask(signal.SIG_SETMASK, self.request["blocked"])
        os.umask(self.request["umask"])
        os.environ.clear()
        os.environ.update(self.env)
        os.chdir(self.cwd)
        # the interpreter: argv, path, streams, per-process state
        sys.orig_argv = [sys.executable, *self.argv]
        sys.path[:] = [*self.leading_path(), *self.base_path]
        sys.path_importer_cache.clear()
        import importlib

        importlib.invalidate_caches()
        sys.modules.pop("_interpreter", None)
        if os.isatty(1):
            sys.stdout.reconfigure(line_buffering=True)
        if "numpy.random" in sys.modules:
            sys.modules["numpy.random"].seed()
        if "multiprocessing.process" in sys.modules:
            import multiprocessing

            multiprocessing.current_process().authkey = os.urandom(32)
            multiprocessing.set_executable(self.launcher)


    def finish(self, code: int) -> None:
        """Exit as the interpreter does (threads joined, atexit handlers, ``__main__``'s objects
        finalized, the streams flushed) but without tearing down every module: for the
        preloaded ones that costs 2 s of copy-on-write and changes nothing outside."""
        import atexit
        import gc
        import threading

        threading._shutdown()
        atexit._run_exitfuncs()
        sys.modules["__main__"].__dict__.clear()
        gc.collect(1)
        for stream in (sys.stdout, sys.stderr):
            try:
                if stream is not None and not stream.closed:
                    stream.flush()
            except Exception:
                code = 120
        os._exit(code)


def _dup_above(fd: int, top: int) -> int:
    import fcntl

    return fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, top)


def _is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _preloaded_locations() -> dict[str, str]:
    """Top-level preloaded module -> the sys.path directory it came from (regular modules and
    packages; built-in and namespace ones cannot be shadowed by a file of the same name)."""
    found = {}
    for name, module in list(sys.modules.items()):
        if "." in name or module is None:
            continue
        path = getattr(module, "__file__", None)
        if not path:
            continue
        path = os.path.abspath(path)
        found[name] = os.path.dirname(os.path.dirname(path) if os.path.basename(path).startswith(
            "__init__.") else path)
    return found


def _log(message: str) -> None:
    os.write(2, f"{time.strftime('%H:%M:%S')} {os.getpid()} {message}\n".encode(
        "utf-8", "replace"))
