"""Every Prometheus metric of sglang-warmup, multiprocess-aware, with an injectable registry.

SGLang runs one process per scheduler rank plus a main process, so counts are only meaningful
aggregated.  When ``PROMETHEUS_MULTIPROC_DIR`` is set (SGLang's ``--enable-metrics`` uses the
same variable) prometheus-client writes every value to per-process files in that directory;
``collect`` and ``render`` aggregate them.  Our metric names all start with ``sglang_warmup_``,
so they sit next to SGLang's own in the same directory without clashing.

prometheus-client picks its value class (in-memory or file-backed) when it is first imported.
Nothing here imports it at module import time, and ``events.install`` creates the metrics on
the first event, so that importing sglang-warmup early in SGLang's main process cannot freeze
prometheus-client in single-process mode before SGLang sets the variable.

Labels are closed sets (``PHASES``, ``COMPILERS``, ...).  Kernel names go to logs and to the
compile log, never to labels.
"""

from __future__ import annotations

import os
import threading
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping

from cache_tools import compile_log
from warmup.observe.phase import PHASES

if TYPE_CHECKING:  # pragma: no cover
    from prometheus_client import CollectorRegistry

PREFIX = "sglang_warmup_"

#: Who compiled (the compile log's ``compiler`` names: Triton, SGLang's nvcc JIT, tvm-ffi, the
#: libraries seen through their cache directories, ``torch.compile``).
COMPILERS: tuple[str, ...] = compile_log.COMPILERS
#: A compile event either built the artifact (miss) or reused one from the disk cache (hit).
COMPILE_OUTCOMES: tuple[str, ...] = (compile_log.MISS, compile_log.HIT)
#: A JIT build: built now, reused from the cache, or failed to build.
JIT_BUILD_OUTCOMES: tuple[str, ...] = compile_log.JIT_OUTCOMES
#: One warm-up request of the plan: completed, failed (error or timeout), or not sent.
PLAN_REQUEST_OUTCOMES: tuple[str, ...] = ("ok", "failed", "skipped")
#: The state of a plan's shape class at the end of the warm-up.
PLAN_CLASS_STATES: tuple[str, ...] = ("done", "skipped", "failed")
#: The hook (or our own step) whose recording failed.
HOOKS: tuple[str, ...] = ("compilation_listener", "jit_cache_hook", "jit_post_compile_hook",
                          "kernel_load_start_hook", "kernel_load_end_hook", "compile_log",
                          "metrics", "cache_watch") + COMPILERS

#: The sidecar's states, in the order a successful start goes through them.
SIDECAR_STATES: tuple[str, ...] = ("starting", "waiting", "warming", "verifying", "ready",
                                   "failed", "stopped")
#: A sidecar's warm-up attempt, or one of its requests: succeeded or failed.
SIDECAR_OUTCOMES: tuple[str, ...] = ("ok", "failed")

#: Compile durations (seconds): from 10 ms (a small kernel, or a disk hit) to 120 s (a large
#: autotuned kernel or an nvcc build of a CUTLASS template).
COMPILE_BUCKETS: tuple[float, ...] = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
                                      20.0, 30.0, 60.0, 120.0)


class Metrics:
    """The metric objects of one registry, with recording methods that check their labels.

    One per registry: use ``for_registry(registry)`` (or ``default()``), which creates it on
    first use; the default registry is prometheus-client's ``REGISTRY`` (what SGLang's
    ``/metrics`` exposes in multiprocess mode).  Recording methods raise ValueError on a label outside its closed set.
    """

    def __init__(self, registry: "CollectorRegistry | None" = None) -> None:
        from prometheus_client import REGISTRY, Counter, Gauge, Histogram

        if registry is None:
            registry = REGISTRY
        self.registry = registry
        mp_dir = multiprocess_dir()
        if mp_dir:
            # prometheus-client opens its per-process files there on the first value.
            os.makedirs(mp_dir, exist_ok=True)
        self.compile_events = Counter(
            "sglang_warmup_compile_events",
            "Kernel compile events seen in SGLang processes: miss = compiled now, "
            "hit = loaded from the disk cache.",
            ["phase", "compiler", "outcome"], registry=registry)
        self.compile_seconds = Histogram(
            "sglang_warmup_compile_seconds",
            "Time spent compiling one kernel (misses only), in seconds.",
            ["phase", "compiler"], buckets=COMPILE_BUCKETS, registry=registry)
        self.specializations = Counter(
            "sglang_warmup_specializations",
            "Triton specializations used for the first time in a process (jit_cache_hook), "
            "whether compiled or loaded from the disk cache.",
            ["phase"], registry=registry)
        self.kernel_loads = Counter(
            "sglang_warmup_kernel_loads",
            "Triton kernels loaded onto a device (first launch of a kernel in a process).",
            ["phase"], registry=registry)
        self.kernel_load_min_free_bytes = Gauge(
            "sglang_warmup_kernel_load_min_free_bytes",
            "Lowest free device memory seen when a Triton kernel load started, in bytes "
            "(only where CUDA was initialised).",
            ["phase"], multiprocess_mode="min", registry=registry)
        self.jit_builds = Counter(
            "sglang_warmup_jit_builds",
            "SGLang nvcc JIT modules: built now, reused from the JIT cache, or failed.",
            ["phase", "outcome"], registry=registry)
        # Created at the first ready(): a gauge exposed before it is known would read 0, a
        # time that never happened.
        self.ready_timestamp: Any = None
        self.class_seconds = Gauge(
            "sglang_warmup_class_seconds",
            "Warm-up time of one shape class of the plan, in seconds (the class label is bounded "
            "by the plan).",
            ["shape_class"], multiprocess_mode="mostrecent", registry=registry)
        self.class_first_hit = Gauge(
            "sglang_warmup_class_first_hit_ratio",
            "On the second replay of the plan, a class's first requests after the warm-up over "
            "the same requests repeated (1.0: as fast as warm).",
            ["shape_class"], multiprocess_mode="mostrecent", registry=registry)
        self.build_info = Gauge(
            "sglang_warmup_build_info",
            "sglang-warmup's version and the SGLang it runs with (value 1).",
            ["version", "sglang"], multiprocess_mode="mostrecent", registry=registry)
        self.build_info.labels(_version("sglang-warmup"), _version("sglang")).set(1)
        self.plan_requests = Counter(
            "sglang_warmup_plan_requests",
            "Warm-up requests of the plan by outcome.",
            ["outcome"], registry=registry)
        self.plan_classes = Gauge(
            "sglang_warmup_plan_classes",
            "Shape classes of the plan by state at the end of the warm-up.",
            ["state"], multiprocess_mode="mostrecent", registry=registry)
        self.hook_errors = Counter(
            "sglang_warmup_hook_errors",
            "Failures of sglang-warmup's own recording inside SGLang processes "
            "(the host call always went on).",
            ["hook"], registry=registry)
        self._min_free: dict[str, float] = {}
        self._lock = threading.Lock()

    # --- compile events -------------------------------------------------------------------
    def compile_event(self, phase: str, compiler: str, outcome: str,
                      duration_s: float | None = None) -> None:
        """Count one compile (``miss``, with its duration) or one disk-cache ``hit``."""
        _check("phase", phase, PHASES)
        _check("compiler", compiler, COMPILERS)
        _check("outcome", outcome, COMPILE_OUTCOMES)
        self.compile_events.labels(phase, compiler, outcome).inc()
        if outcome == compile_log.MISS and duration_s is not None:
            self.compile_seconds.labels(phase, compiler).observe(max(0.0, float(duration_s)))

    def specialization(self, phase: str) -> None:
        """Count the first in-process use of a Triton specialization."""
        _check("phase", phase, PHASES)
        self.specializations.labels(phase).inc()

    def kernel_load(self, phase: str, free_bytes: float | None = None) -> None:
        """Count one device load; keep the lowest free device memory seen at a load."""
        _check("phase", phase, PHASES)
        self.kernel_loads.labels(phase).inc()
        if free_bytes is not None:
            with self._lock:
                low = self._min_free.get(phase)
                if low is None or free_bytes < low:
                    self._min_free[phase] = float(free_bytes)
                    self.kernel_load_min_free_bytes.labels(phase).set(float(free_bytes))

    def jit_build(self, phase: str, outcome: str, duration_s: float | None = None,
                  compiler: str = "sglang_jit") -> None:
        """Count one JIT build (or cache hit) of ``compiler``; builds also count as compile
        events."""
        _check("phase", phase, PHASES)
        _check("outcome", outcome, JIT_BUILD_OUTCOMES)
        _check("compiler", compiler, COMPILERS)
        self.jit_builds.labels(phase, outcome).inc()
        if outcome == compile_log.BUILT:
            self.compile_event(phase, compiler, compile_log.MISS, duration_s)
        elif outcome == compile_log.CACHED:
            self.compile_event(phase, compiler, compile_log.HIT)

    def hook_error(self, hook: str) -> None:
        """Count one failure of our own recording."""
        _check("hook", hook, HOOKS)
        self.hook_errors.labels(hook).inc()

    # --- the warm-up driver's side --------------------------------------------------------
    def ready(self, timestamp: float) -> None:
        """Record the unix time at which the server was declared ready."""
        with self._lock:
            if self.ready_timestamp is None:
                from prometheus_client import Gauge

                self.ready_timestamp = Gauge(
                    "sglang_warmup_ready_timestamp_seconds",
                    "Unix time at which the warm-up finished and the server was declared ready.",
                    multiprocess_mode="max", registry=self.registry)
        self.ready_timestamp.set(float(timestamp))

    def class_time(self, shape_class: str, seconds: float) -> None:
        """Record how long one class of the plan took in the warm-up."""
        self.class_seconds.labels(shape_class).set(max(0.0, float(seconds)))

    def class_first_hit_ratio(self, shape_class: str, ratio: float) -> None:
        """Record a class's first-hit over repeat latency on the second replay."""
        self.class_first_hit.labels(shape_class).set(float(ratio))

    def plan_request(self, outcome: str, amount: int = 1) -> None:
        """Count warm-up requests by outcome."""
        _check("outcome", outcome, PLAN_REQUEST_OUTCOMES)
        self.plan_requests.labels(outcome).inc(amount)

    def plan_coverage(self, *, done: int, skipped: int, failed: int) -> None:
        """Set how many shape classes of the plan ended done, skipped and failed."""
        for state, value in (("done", done), ("skipped", skipped), ("failed", failed)):
            self.plan_classes.labels(state).set(int(value))


def _version(dist: str) -> str:
    """An installed distribution's version from its metadata, "unknown" when absent."""
    from cache_tools.versions import dist_version

    return dist_version(dist) or "unknown"


_by_registry: "weakref.WeakKeyDictionary[Any, Metrics]" = weakref.WeakKeyDictionary()
_by_registry_lock = threading.Lock()


def for_registry(registry: "CollectorRegistry | None" = None) -> Metrics:
    """The one Metrics of ``registry`` (default: prometheus-client's ``REGISTRY``), created on
    first use; a registry cannot hold two metrics of the same name."""
    if registry is None:
        from prometheus_client import REGISTRY

        registry = REGISTRY
    with _by_registry_lock:
        found = _by_registry.get(registry)
        if found is None:
            found = _by_registry[registry] = Metrics(registry)
        return found


def default() -> Metrics:
    """The process-wide Metrics on prometheus-client's default registry, created on first use."""
    return for_registry(None)


def multiprocess_dir() -> str:
    """``PROMETHEUS_MULTIPROC_DIR`` if set (multiprocess mode), else the empty string."""
    from warmup import settings

    return settings.PROMETHEUS_MULTIPROC_DIR.get()


@dataclass(frozen=True)
class Sample:
    """One aggregated sample: its full name (``..._total``, ``..._bucket``), labels and value."""

    name: str
    labels: Mapping[str, str]
    value: float


def collect(path: str | os.PathLike | None = None, *, prefix: str = PREFIX) -> dict[str, list[dict]]:
    """Aggregate a multiprocess directory (default: ``PROMETHEUS_MULTIPROC_DIR``) into
    ``{sample name: [{"labels": {...}, "value": float}, ...]}``, our metrics only.

    Values are aggregated across processes the way prometheus-client serves them (counters and
    histograms summed; gauges by their multiprocess mode).
    """
    out: dict[str, list[dict]] = {}
    for sample in samples(path, prefix=prefix):
        out.setdefault(sample.name, []).append({"labels": dict(sample.labels),
                                                "value": sample.value})
    return out


def samples(path: str | os.PathLike | None = None, *, prefix: str = PREFIX) -> list[Sample]:
    """The aggregated samples of a multiprocess directory whose names start with ``prefix``."""
    from prometheus_client.multiprocess import MultiProcessCollector

    directory = _mp_path(path)
    collector = MultiProcessCollector(None, path=directory)
    result: list[Sample] = []
    for family in collector.collect():
        if not family.name.startswith(prefix):
            continue
        for s in family.samples:
            result.append(Sample(s.name, dict(s.labels), float(s.value)))
    result.sort(key=lambda s: (s.name, sorted(s.labels.items())))
    return result


def total(collected: Mapping[str, list[dict]], name: str, **labels: str) -> float:
    """Sum the values of sample ``name`` in a ``collect`` result whose labels match ``labels``."""
    return sum(entry["value"] for entry in collected.get(name, ())
               if all(entry["labels"].get(k) == v for k, v in labels.items()))


def render(path: str | os.PathLike | None = None, *, prefix: str | None = PREFIX) -> bytes:
    """The Prometheus text exposition of a multiprocess directory, aggregated across processes
    (``generate_latest`` over a ``MultiProcessCollector``).  ``prefix=None`` keeps every metric
    in the directory, SGLang's included."""
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.multiprocess import MultiProcessCollector

    directory = _mp_path(path)
    registry = CollectorRegistry()
    if prefix is None:
        MultiProcessCollector(registry, path=directory)
    else:
        registry.register(_PrefixCollector(MultiProcessCollector(None, path=directory), prefix))
    return generate_latest(registry)


def compile_misses(path: str | os.PathLike | None) -> float | None:
    """Compile misses summed over every process of a multiprocess directory; None when there
    is no such directory or it holds no sglang-warmup compile metrics yet."""
    if not path or not os.path.isdir(path) or not any(Path(path).glob("*.db")):
        return None
    collected = collect(path)
    name = "sglang_warmup_compile_events_total"
    if name not in collected:
        return None
    return total(collected, name, outcome=compile_log.MISS)


# --- the sidecar's metrics ------------------------------------------------------------------
@dataclass(frozen=True)
class SidecarSample:
    """The sidecar's values at one scrape.  ``runs_*``: warm-up attempts; ``requests_*``:
    warm-up requests sent; the optional gauges are left out while None."""

    state: str
    runs_ok: int = 0
    runs_failed: int = 0
    requests_ok: int = 0
    requests_failed: int = 0
    health_wait_s: float | None = None
    warmup_s: float | None = None
    ready_at: float | None = None
    second_pass_misses: int | None = None
    projected_remaining_s: float | None = None


class SidecarCollector:
    """The sidecar's own metrics, computed from ``sample()`` at scrape time.  No metric
    objects: prometheus-client may be in multiprocess mode in that process, and the sidecar's
    values must not land in SGLang's directory."""

    def __init__(self, sample: Callable[[], SidecarSample]) -> None:
        self.sample = sample

    def collect(self) -> Iterable[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        v = self.sample()
        _check("state", v.state, SIDECAR_STATES)
        yield GaugeMetricFamily("sglang_warmup_sidecar_ready",
                                "1 while the sidecar's /ready answers 200.",
                                value=1.0 if v.state == "ready" else 0.0)
        state = GaugeMetricFamily("sglang_warmup_sidecar_state",
                                  "The sidecar's state (1 for the current one).", labels=["state"])
        for s in SIDECAR_STATES:
            state.add_metric([s], 1.0 if s == v.state else 0.0)
        yield state
        runs = CounterMetricFamily("sglang_warmup_sidecar_runs",
                                   "Warm-up attempts by outcome.", labels=["outcome"])
        runs.add_metric(["ok"], v.runs_ok)
        runs.add_metric(["failed"], v.runs_failed)
        yield runs
        reqs = CounterMetricFamily("sglang_warmup_sidecar_requests",
                                   "Warm-up requests sent by the sidecar, by outcome.",
                                   labels=["outcome"])
        reqs.add_metric(["ok"], v.requests_ok)
        reqs.add_metric(["failed"], v.requests_failed)
        yield reqs
        for name, value, text in (
                ("sglang_warmup_sidecar_health_wait_seconds", v.health_wait_s,
                 "Seconds the last attempt waited for /health_generate."),
                ("sglang_warmup_sidecar_warmup_seconds", v.warmup_s,
                 "Seconds the last successful warm-up took (both passes with --second-pass)."),
                ("sglang_warmup_sidecar_ready_timestamp_seconds", v.ready_at,
                 "Unix time at which /ready last turned 200."),
                ("sglang_warmup_sidecar_second_pass_misses", v.second_pass_misses,
                 "Compile misses seen during the last second pass."),
                ("sglang_warmup_sidecar_projected_remaining_seconds", v.projected_remaining_s,
                 "Projected seconds until the warm-up ends, at the rate so far.")):
            if value is not None:
                yield GaugeMetricFamily(name, text, value=float(value))


def sidecar_exposition(sample: Callable[[], SidecarSample], mp_dir: str | None) -> bytes:
    """The sidecar's ``/metrics`` body: its own metrics, then sglang-warmup's metrics from the
    multiprocess directory the SGLang processes share (their compile events), if any."""
    from prometheus_client import CollectorRegistry, generate_latest

    registry = CollectorRegistry(auto_describe=False)
    registry.register(SidecarCollector(sample))
    out = generate_latest(registry)
    if mp_dir and os.path.isdir(mp_dir) and any(Path(mp_dir).glob("*.db")):
        try:
            out += render(mp_dir)
        except Exception as exc:  # a torn file must not take /metrics down
            out += f"# sglang-warmup sidecar: cannot read {mp_dir}: {exc}\n".encode()
    return out


class _PrefixCollector:
    """Only the metric families of an inner collector whose names start with a prefix."""

    def __init__(self, inner: Any, prefix: str) -> None:
        self._inner = inner
        self._prefix = prefix

    def collect(self) -> Iterable[Any]:
        return [f for f in self._inner.collect() if f.name.startswith(self._prefix)]


def _mp_path(path: str | os.PathLike | None) -> str:
    directory = str(path) if path is not None else multiprocess_dir()
    if not directory:
        from warmup.errors import WarmupError

        raise WarmupError("no Prometheus multiprocess directory to read",
                          hint="set PROMETHEUS_MULTIPROC_DIR (the directory SGLang's processes "
                               "write their metrics to) or pass the directory explicitly")
    if not os.path.isdir(directory):
        from warmup.errors import WarmupError

        raise WarmupError(f"Prometheus multiprocess directory {directory} does not exist",
                          hint="point PROMETHEUS_MULTIPROC_DIR at the directory the server's "
                               "processes write to")
    return directory


def _check(label: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ValueError(f"label {label}={value!r} is not one of {', '.join(allowed)}")
