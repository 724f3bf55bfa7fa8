"""The sidecar's configuration: everything it does, decided and checked before it starts."""

from __future__ import annotations

import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path

from warmup.errors import SidecarError
from warmup.plan import loader
from warmup.plan.model import Plan

DEFAULT_PORT = 8090
#: Loopback: nothing outside the machine (or pod) reaches the endpoints unless ``--host`` says
#: so; in Kubernetes the kubelet probes the pod's own address, so the manifest binds that.
DEFAULT_HOST = "127.0.0.1"


@dataclass(frozen=True)
class SidecarConfig:
    """Everything the sidecar does, decided before it starts.

    ``host`` / ``port``: where ``/ready`` ``/live`` ``/metrics`` ``/report`` listen (port 0: any
    free one).  ``deadline_s``: how long to wait for ``/health_generate`` per attempt.
    ``startup_budget_s``: the time the orchestrator allows for the whole start (e.g. a
    Kubernetes startup probe's ``failureThreshold * periodSeconds``), counted from the sidecar's
    start; the projection is logged against it.  ``watch_interval_s``: seconds between
    ``/health`` probes once ready (0: no watching).  ``mp_dir``: the Prometheus multiprocess
    directory the SGLang processes write to (None: none shared).
    """

    plan: str
    url: str
    port: int = DEFAULT_PORT
    host: str = DEFAULT_HOST
    deadline_s: float = 1800.0
    second_pass: bool = False
    freeze_gc: bool = True
    exit_on_failure: bool = False
    state_dir: str | None = None
    mp_dir: str | None = None
    startup_budget_s: float | None = None
    request_timeout_s: float = 600.0
    flush_timeout_s: float = 60.0
    flush_slack_s: float = 10.0
    probe_timeout_s: float = 30.0
    backoff_initial_s: float = 0.5
    backoff_max_s: float = 10.0
    watch_interval_s: float = 10.0
    watch_failures: int = 3
    progress_every_s: float = 10.0
    seed: str = "0"
    api_key: str | None = field(default=None, repr=False)

    def check(self) -> Plan:
        """Validate everything that can be checked before the server is reachable; return the
        loaded plan.  Raises SidecarError (or the plan's PlanError)."""
        parsed = urllib.parse.urlparse(self.url)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise SidecarError(f"--url {self.url!r} is not an http(s) URL",
                               hint="the SGLang server's base URL, e.g. --url http://127.0.0.1:30000")
        if not 0 <= self.port <= 65535:
            raise SidecarError(f"--port {self.port} is not a TCP port",
                               hint="0-65535 (0: any free port)")
        if not self.host:
            raise SidecarError("--host is empty",
                               hint="an address to listen on, e.g. --host 127.0.0.1 (or 0.0.0.0 "
                                    "for every interface)")
        for name, value in (("--deadline", self.deadline_s),
                            ("--request-timeout", self.request_timeout_s),
                            ("--flush-timeout", self.flush_timeout_s)):
            if not value > 0:
                raise SidecarError(f"{name} {value:g} must be a positive number of seconds",
                                   hint=f"e.g. {name} 600")
        if self.startup_budget_s is not None and not self.startup_budget_s > 0:
            raise SidecarError(f"--startup-budget {self.startup_budget_s:g} must be a positive "
                               "number of seconds",
                               hint="the orchestrator's startup allowance, e.g. --startup-budget 1800")
        if self.watch_interval_s < 0:
            raise SidecarError(f"--watch-interval {self.watch_interval_s:g} must be >= 0",
                               hint="0 turns watching off")
        if self.second_pass and not self.state_dir and not self.mp_dir:
            raise SidecarError(
                "--second-pass cannot be verified: the sidecar shares no state directory with "
                "SGLang, so it cannot see the compile misses of the SGLang processes",
                hint="run SGLang with WARMUP_ENABLE=1 and WARMUP_STATE_DIR=DIR (sglang-warmup "
                     "installed in its environment) and give the sidecar --state-dir DIR, "
                     "e.g. a shared emptyDir in Kubernetes")
        if self.state_dir:
            try:
                Path(self.state_dir).mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise SidecarError(f"--state-dir {self.state_dir}: {exc.strerror or exc}",
                                   hint="a directory both SGLang and the sidecar can write") from None
        return loader.load(self.plan)
