"""Registers plans into SGLang's ``--warmups`` registry, so they run inside the server's main
process before the HTTP port opens, and makes sure they really run.

SGLang only logs a warning for an unknown ``--warmups`` name and starts cold.  We refuse to:
``guard_execute_warmups`` wraps SGLang's ``execute_warmups`` so that an unknown name, or a
configured plan missing from ``--warmups``, raises inside the lifespan and startup fails.

The registered warm-up runs the plan with a *runner*: ``Driver.run`` unless the caller passes
another (the plugin passes the second-pass check of :mod:`warmup.coverage.second_pass` with
``WARMUP_SECOND_PASS=1``), so this layer never imports the layers above it.
"""

from __future__ import annotations

import gc
import importlib.util
import logging
import multiprocessing
import os
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Awaitable, Callable

import yaml

from cache_tools import inputfile
from warmup import settings
from warmup.errors import DriverError, RegistrationError, WarmupError
from warmup.plan import loader, shipped
from warmup.serve.report import RunReport, write_json

if TYPE_CHECKING:  # annotations only: the driver and the transports load when the plan runs
    from warmup.plan.model import Expansion
    from warmup.serve.driver import Driver
    from warmup.serve.transport import InProcessTransport

logger = logging.getLogger("sglang_warmup.hook")

_GUARD_MARK = "__sglang_warmup_guard__"
#: SGLang's ``--config`` YAML read for its ``warmups`` (larger: not read; SGLang reads it).
_MAX_CONFIG_BYTES = 1024 * 1024
_registered: dict[str, str] = {}  # name -> plan file
_failed: list[str] = []  # registrations that failed in this process, with the reason

#: Runs an expansion with a driver: ``(driver, expansion) -> awaitable result``.  The result is
#: the RunReport, or an object around it with ``.run`` (the RunReport) and ``.to_dict()`` (the
#: JSON document written as the report); a DriverError carries ``.report`` either way.
Runner = Callable[["Driver", "Expansion"], Awaitable[Any]]
#: The run report as text for SGLang's log (the plugin passes the view's, warmup/view/text.py;
#: this layer renders nothing itself).
Describe = Callable[[RunReport], str]


def register(plan_path: str | os.PathLike[str], *, name: str | None = None,
             report_path: str | None = None, lenient: bool | None = None,
             runner: Runner | None = None, describe: Describe | None = None) -> str:
    """Load ``plan_path`` (it is validated now, not at warm-up time) and register it as a
    ``--warmups`` entry; return the name.  Verifies that SGLang's registry holds it.
    ``runner``: how the expansion is run (default: the driver alone); ``describe``: the run
    report's text, logged line by line when the warm-up ends (default: none)."""
    plan = loader.load(plan_path)
    entry = name or plan.name
    from sglang.srt.entrypoints import warmup as sglang_warmup

    async def run_plan(disaggregation_mode: str, tokenizer_manager: Any) -> None:
        await _run(plan, entry, disaggregation_mode, tokenizer_manager,
                   report_path=report_path if report_path is not None else settings.REPORT.get(),
                   lenient=lenient if lenient is not None else settings.LENIENT.get(),
                   runner=runner, describe=describe)

    run_plan.__qualname__ = f"sglang_warmup[{entry}]"
    registry = getattr(sglang_warmup, "_warmup_registry", None)
    decorator = getattr(sglang_warmup, "warmup", None)
    if registry is None or decorator is None:
        raise RegistrationError("this SGLang has no --warmups registry",
                                hint="use SGLang 0.5.13 or later, or the sidecar (HTTP) instead")
    if entry in registry and not getattr(registry[entry], "__sglang_warmup__", False):
        raise RegistrationError(f"--warmups name '{entry}' is already taken by SGLang's "
                                f"{registry[entry].__module__}.{registry[entry].__name__}",
                                hint="rename the plan (its `name:`) or set WARMUP_NAME")
    run_plan.__sglang_warmup__ = True  # type: ignore[attr-defined]
    decorator(entry)(run_plan)
    if registry.get(entry) is not run_plan:
        raise RegistrationError(f"registering '{entry}' into SGLang's --warmups registry did not "
                                "take effect", hint="report this with your SGLang version")
    _registered[entry] = str(plan_path)
    guard_execute_warmups()
    logger.info("sglang-warmup: plan %s registered as --warmups %s (%d phases, %d classes)",
                plan_path, entry, len(plan.phases), len(plan.shapes))
    return entry


def register_from_env(runner: Runner | None = None,
                      describe: Describe | None = None) -> str | None:
    """The plugin's step: register WARMUP_PLAN (a file or a shipped plan's name) in SGLang's
    main process (not in its spawned workers) with ``runner``, and make sure the launch command
    lists it in ``--warmups``.  Without WARMUP_PLAN, a ``--warmups`` name of a shipped plan
    (PR #44627's ``--warmups deepseek_v4_serving_shapes``) registers that plan."""
    if multiprocessing.parent_process() is not None:
        return None
    plan_path = settings.PLAN.get()
    if not plan_path:
        return _register_listed_shipped(runner, describe)
    # Guard first: if the plan cannot be registered, SGLang must not start cold silently
    # (SGLang's plugin loader only logs exceptions raised here).
    guard_execute_warmups()
    try:
        name = register(plan_path, name=settings.WARMUP_NAME.get() or None, runner=runner,
                        describe=describe)
    except WarmupError as exc:
        _failed.append(f"{exc.message}" + (f" ({exc.hint})" if exc.hint else ""))
        logger.error("sglang-warmup: %s", exc.message)
        # List a name anyway, so SGLang calls execute_warmups and the guard fails the startup.
        ensure_listed(settings.WARMUP_NAME.get() or "sglang_warmup", sys.argv)
        raise
    ensure_listed(name, sys.argv)
    return name


def _register_listed_shipped(runner: Runner | None,
                             describe: Describe | None = None) -> str | None:
    """Register every shipped plan that the launch command names in ``--warmups``."""
    names = [n for n in listed_warmups(sys.argv) if shipped.path(n) is not None]
    if not names:
        return None
    guard_execute_warmups()
    for name in names:
        try:
            register(name, name=name, runner=runner, describe=describe)
        except WarmupError as exc:
            _failed.append(f"{exc.message}" + (f" ({exc.hint})" if exc.hint else ""))
            logger.error("sglang-warmup: %s", exc.message)
            raise
    return names[0]


def listed_warmups(argv: list[str]) -> list[str]:
    """The ``--warmups`` names of an SGLang launch command (its ``--config`` file's when the
    command line has none)."""
    for i, a in enumerate(argv):
        if a == "--warmups" and i + 1 < len(argv):
            return [n.strip() for n in argv[i + 1].split(",") if n.strip()]
        if a.startswith("--warmups="):
            return [n.strip() for n in a.split("=", 1)[1].split(",") if n.strip()]
    return _config_warmups(argv) if "--config" in argv else []


def ensure_listed(name: str, argv: list[str]) -> bool:
    """If ``argv`` is an SGLang launch command, make its ``--warmups`` list include ``name``
    (SGLang parses ``sys.argv`` after the plugins ran).  Returns True if argv was changed."""
    if not any(a in ("--model-path", "--model", "--config") or a.startswith(("--model-path=", "--model="))
               for a in argv):
        return False
    for i, a in enumerate(argv):
        if a == "--warmups" and i + 1 < len(argv):
            names = [n for n in argv[i + 1].split(",") if n]
            if name in names:
                return False
            argv[i + 1] = ",".join(names + [name])
            break
        if a.startswith("--warmups="):
            names = [n for n in a.split("=", 1)[1].split(",") if n]
            if name in names:
                return False
            argv[i] = "--warmups=" + ",".join(names + [name])
            break
    else:
        # A --warmups flag replaces the list of a --config file (SGLang: command line over
        # config), so the config's own names are carried over.
        names = _config_warmups(argv)
        if name in names:
            return False
        argv.extend(["--warmups", ",".join(names + [name])])
    logger.info("sglang-warmup: added %s to --warmups (WARMUP_PLAN is set)", name)
    return True


def _config_warmups(argv: list[str]) -> list[str]:
    """The ``warmups`` names of the SGLang ``--config`` YAML file in ``argv`` (none when there is
    no such file or it cannot be read: SGLang reports that itself)."""
    try:
        raw = inputfile.read(argv[argv.index("--config") + 1], _MAX_CONFIG_BYTES)
        data = yaml.safe_load(raw.decode("utf-8"))
    except (ValueError, IndexError, OSError, RecursionError, yaml.YAMLError):
        return []
    value = data.get("warmups") if isinstance(data, dict) else None
    items = value if isinstance(value, list) else str(value or "").split(",")
    return [str(n).strip() for n in items if str(n).strip()]


def guard_execute_warmups() -> None:
    """Wrap SGLang's ``execute_warmups`` (idempotent): unknown names and a registered plan
    missing from the list raise instead of being skipped with a warning."""
    from sglang.srt.entrypoints import warmup as sglang_warmup

    original = sglang_warmup.execute_warmups
    if getattr(original, _GUARD_MARK, False):
        return

    async def execute_warmups(disaggregation_mode: str, warmup_names: list[str],
                              tokenizer_manager: Any) -> Any:
        if _failed:
            raise RegistrationError("sglang-warmup could not register its plan: " + "; ".join(_failed),
                                    hint="fix the plan (`sglang-warmup plan check`), then restart")
        names = [n.strip() for n in warmup_names if n and n.strip()]
        registry = sglang_warmup._warmup_registry
        unknown = [n for n in names if n not in registry]
        if unknown:
            raise RegistrationError(
                f"--warmups lists {', '.join(unknown)}, which no plugin registered "
                f"(known: {', '.join(sorted(registry))})",
                hint="set WARMUP_ENABLE=1 and WARMUP_PLAN, or launch with `sglang-warmup serve`")
        missing = [n for n in _registered if n not in names]
        if missing:
            raise RegistrationError(f"plan(s) {', '.join(missing)} registered but not listed in "
                                    "--warmups; the server would start cold",
                                    hint=f"add --warmups {','.join(missing)}")
        return await original(disaggregation_mode, names, tokenizer_manager)

    setattr(execute_warmups, _GUARD_MARK, True)
    execute_warmups.__wrapped__ = original  # type: ignore[attr-defined]
    sglang_warmup.execute_warmups = execute_warmups
    # http_server imports the name at its own import; reach it there too when already loaded.
    http: Any = sys.modules.get("sglang.srt.entrypoints.http_server")     # SGLang's, untyped
    if http is not None and getattr(http, "execute_warmups", None) is original:
        http.execute_warmups = execute_warmups


async def _run(plan: Any, entry: str, disaggregation_mode: str, tokenizer_manager: Any, *,
               report_path: str, lenient: bool, runner: Runner | None = None,
               describe: Describe | None = None) -> None:
    """The registered warm-up: facts from the live server, expansion, driver, report."""
    from warmup.plan import facts as facts_mod
    from warmup.plan.expand import expand
    from warmup.plan.lets import with_lets
    from warmup.serve.driver import Driver
    from warmup.serve.transport import InProcessTransport

    t0 = time.perf_counter()
    plan = with_lets(plan, settings.LETS.get())
    facts = await facts_mod.from_tokenizer_manager(tokenizer_manager)
    if disaggregation_mode and disaggregation_mode != facts.disaggregation_mode:
        facts = replace(facts, disaggregation_mode=str(disaggregation_mode))
    exp = expand(plan, facts, skip_families=settings.SKIP_FAMILIES.get())
    exp = replace(exp, warnings=exp.warnings + launch_warnings())
    logger.info("sglang-warmup: %s: %d steps, %d requests (%d items skipped by the expansion)",
                entry, len(exp.steps), exp.num_requests, len(exp.skipped))
    for skip in exp.skipped:
        if not skip.item:  # whole classes: the limit, a family turned off, a feature that is off
            logger.info("sglang-warmup: class %s skipped: %s", skip.shape_class, skip.reason)
        elif ".." in skip.item:  # a range of prompt lengths a capped class leaves unwarmed
            logger.warning("sglang-warmup: class %s: %s", skip.shape_class, skip.reason)
    for warning in exp.warnings:
        logger.warning("sglang-warmup: %s", warning)
    transport = InProcessTransport(tokenizer_manager, timeout_s=settings.REQUEST_TIMEOUT_S.get(),
                                   seed=settings.SEED.get(), vocab_size=facts.vocab_size,
                                   http=_http_app(tokenizer_manager))
    metrics = None
    if settings.METRICS.get():
        try:
            from warmup.observe import metrics as metrics_mod

            metrics = metrics_mod.default()
        except Exception as exc:  # in SGLang's process metrics are optional: warned, warm-up on
            logger.warning("sglang-warmup: metrics unavailable: %s", exc)
    from warmup.plan.step_record import server_args_of

    exp = replace(exp, server_args=server_args_of(getattr(tokenizer_manager, "server_args", None)))
    quiet, note, warning = quiet_steps(exp)
    if warning:
        exp = replace(exp, warnings=exp.warnings + (warning,))
    driver = Driver(transport, lenient=lenient, flush_timeout_s=settings.FLUSH_TIMEOUT_S.get(),
                    state_dir=settings.STATE_DIR.get() or None, metrics=metrics,
                    serving_at_end=False, skip_steps=quiet, steps_note=note)
    result: Any = None
    try:
        result = await (runner(driver, exp) if runner is not None else driver.run(exp))
    except DriverError as exc:  # strict mode: the report so far is written all the same
        result = exc.report
        raise
    finally:
        if result is not None:
            report = result if isinstance(result, RunReport) else result.run
            _write_report(result.to_dict(), report_path)
            for line in (describe(report) if describe is not None else "").splitlines():
                logger.info("%s", line)
    if settings.FREEZE_GC.get():
        await _freeze_gc(transport)
    serving_when_up(tokenizer_manager, driver.mark_serving)
    logger.info("sglang-warmup: %s finished in %.1f s", entry, time.perf_counter() - t0)


def quiet_steps(exp: Expansion) -> tuple[frozenset[int], str, str]:
    """The steps of ``exp`` that WARMUP_STEPS's record found quiet when the cache was baked, a
    line that names the record, and a warning for the report; none (the whole plan) without a
    record, or with one that cannot be read or was learned on another expansion or server (a
    warning: a launch never fails for it)."""
    from warmup.plan import step_record

    path = settings.STEPS.get()
    if not path:
        return frozenset(), "", ""
    try:
        record = step_record.read(path)
        why = record.mismatch(exp, step_record.this_device())
    except WarmupError as exc:
        warning = f"{exc.message}: every step sent"
    except Exception as exc:  # a bug of ours reading it must not stop the server: warm it all
        logger.exception("sglang-warmup: reading the steps record %s failed", path)
        warning = f"{path}: reading the steps record failed ({type(exc).__name__}): every step sent"
    else:
        if why is None:
            skip = record.skip(exp)
            logger.info("sglang-warmup: sending %d of %d steps: the %d others were quiet when "
                        "the cache was baked (%s)", len(exp.steps) - len(skip), len(exp.steps),
                        len(skip), path)
            return skip, (f"{path}: {len(skip)} of {len(exp.steps)} steps quiet when the cache "
                          f"was baked"), ""
        warning = f"steps record {path} does not apply: {why}; every step sent"
    logger.warning("sglang-warmup: %s", warning)
    return frozenset(), "", warning


def launch_warnings() -> tuple[str, ...]:
    """What this launch will compile after ready that no plan class can warm."""
    out = []
    if not settings.DEEPGEMM_PRECOMPILE.get():
        out.append("SGLANG_JIT_DEEPGEMM_PRECOMPILE is off: where the model runs DeepGEMM GEMMs "
                   "(FP8 block-quantized models on SM90+, DeepSeek-V3/V4 among them), DeepGEMM "
                   "builds a kernel with nvcc (2-4 s on an H200) the first time a GEMM meets a "
                   "new M range, after ready too, and no plan can send every M; keep SGLang's "
                   "default (on) and prebake SGLANG_DG_CACHE_DIR (docs/first-hits.md)")
    return tuple(out)


def _http_app(tokenizer_manager: Any) -> Any:
    """SGLang's HTTP app for the plan's streamed requests (:mod:`warmup.serve.asgi`), or None:
    turned off, or not in this process (they go to the tokenizer manager then)."""
    if not settings.STREAM_OVER_HTTP.get():
        return None
    from warmup.serve import asgi

    app = asgi.of_server(tokenizer_manager)
    if app is None:
        logger.info("sglang-warmup: SGLang's HTTP app does not serve this tokenizer manager in "
                    "this process: the plan's streamed requests go to the tokenizer manager, and "
                    "the first streamed request after ready warms the HTTP event stream")
    return app


def sglang_freezes_after_warmup() -> bool:
    """Whether this SGLang freezes the garbage collector itself once its own warm-up request is
    done (``http_server._freeze_gc_after_server_warmup``, releases after 0.5.17).  Read from the
    loaded module, or from its source where it is not loaded (it imports FastAPI)."""
    name = "sglang.srt.entrypoints.http_server"
    module = sys.modules.get(name)
    if module is not None:
        return callable(getattr(module, "_freeze_gc_after_server_warmup", None))
    try:
        spec = importlib.util.find_spec(name)
        source = Path(spec.origin).read_text(encoding="utf-8") if spec and spec.origin else ""
    except (ImportError, ValueError, OSError, UnicodeDecodeError):  # no server to ask: freeze here
        return False
    return "def _freeze_gc_after_server_warmup(" in source


async def _freeze_gc(transport: InProcessTransport) -> None:
    """After the warm-up: one full collection in this process (the tokenizer manager's; SGLang's
    freeze does not collect, and what it freezes is never collected), then SGLang's own
    freeze_gc, so that no full collection over the objects the start and the warm-up left lands
    in serving.  The freeze is left to SGLang where it does it itself after its own warm-up
    request.  A failure is a warning: the server is warm."""
    gc.collect()
    if sglang_freezes_after_warmup():
        logger.info("sglang-warmup: SGLang freezes the garbage collector after its own warm-up "
                    "request; not freezing here")
        return
    try:
        await transport.freeze_gc()
    except Exception as exc:  # the server is warm: SGLang's freeze failing any way is a warning
        logger.warning("sglang-warmup: freezing the garbage collector failed: %s", exc)
    else:
        logger.info("sglang-warmup: garbage collector frozen (tokenizer manager, schedulers, "
                    "detokenizer)")


#: Seconds the phase waits for SGLang's readiness beyond SGLang's own warm-up timeout
#: (``SGLANG_WARMUP_TIMEOUT``, else 1,800 s, its longest default, PD's); past it the phase turns
#: ``serving`` anyway.
READY_SLACK_S = 300.0


def ready_wait_s() -> float:
    """How long :func:`serving_when_up` waits at most."""
    try:
        timeout = float(os.environ.get("SGLANG_WARMUP_TIMEOUT", "") or -1)
    except ValueError:
        timeout = -1.0
    return (timeout if timeout > 0 else 1800.0) + READY_SLACK_S


def serving_when_up(tokenizer_manager: Any, mark_serving: Callable[[], object], *,
                    poll_s: float = 0.05, limit_s: float | None = None) -> threading.Thread | None:
    """Call ``mark_serving`` when SGLang reports itself up (``server_status`` turns ``Up`` after
    its own warm-up request, which runs after the ``--warmups`` entries and can still compile):
    at once where the tokenizer manager has no status or never gets one (SGLang's Rust server
    front end, ``SGLANG_RUST_SERVER``), from a daemon thread otherwise.  ``UnHealthy`` (a PD
    warm-up that failed) keeps the watch going: a later health check can bring the server
    ``Up``.  Past ``limit_s`` (default :func:`ready_wait_s`) the phase turns ``serving``."""
    rust_front = os.environ.get("SGLANG_RUST_SERVER", "").strip().lower() in ("true", "1", "yes",
                                                                            "y")  # SGLang's EnvBool
    if getattr(tokenizer_manager, "server_status", None) is None or rust_front:
        mark_serving()
        return None

    wait_s = ready_wait_s() if limit_s is None else limit_s

    def watch() -> None:
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            state = getattr(getattr(tokenizer_manager, "server_status", None), "name", None)
            if state == "Up":
                break
            time.sleep(poll_s)
        else:
            logger.warning("sglang-warmup: SGLang did not report itself up within %.0f s of the "
                           "warm-up; compile events count as serving from now", wait_s)
        mark_serving()

    thread = threading.Thread(target=watch, name="sglang-warmup-ready", daemon=True)
    thread.start()
    return thread


def _write_report(document: dict[str, Any], report_path: str) -> None:
    targets = [report_path] if report_path else []
    state_dir = settings.STATE_DIR.get()
    if state_dir:
        targets.append(str(Path(state_dir) / "report.json"))
    for target in targets:
        try:
            write_json(document, target)
        except OSError as exc:
            logger.warning("sglang-warmup: cannot write the run report to %s: %s", target, exc)


def registered() -> dict[str, str]:
    """Names registered by this process, with their plan files."""
    return dict(_registered)


Hook = Callable[..., Any]
