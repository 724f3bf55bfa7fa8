"""A server's serving compile counts read from ``/metrics``, and the time recorded garbage
collections overlapped a step: what an audit measures besides latency."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from warmup.errors import TransportError, WarmupError
from warmup.serve.http import snippet
from warmup.serve.report import as_number

COMPILE_METRIC = "sglang_warmup_compile_events"
LOAD_METRIC = "sglang_warmup_kernel_loads"


@dataclass(frozen=True)
class ServingCounts:
    """Serving-phase totals read from ``/metrics``: compile events and device loads."""

    compile_events: float
    kernel_loads: float


def parse_metrics(text: str) -> ServingCounts | None:
    """Serving compile events and kernel loads from Prometheus text; None when the text has no
    ``sglang_warmup_`` metric at all (the server does not run our hooks)."""
    from prometheus_client.parser import text_string_to_metric_families

    found = False
    events = loads = 0.0
    try:
        families = list(text_string_to_metric_families(text))
    except ValueError as exc:
        raise WarmupError(f"/metrics is not Prometheus text: {exc}",
                          hint="is --url an SGLang server started with --enable-metrics?") from None
    for fam in families:
        if not fam.name.startswith("sglang_warmup_"):
            continue
        found = True
        for s in fam.samples:
            if s.labels.get("phase") != "serving":
                continue
            if fam.name == COMPILE_METRIC and s.name == COMPILE_METRIC + "_total":
                events += as_number(s.value)
            elif fam.name == LOAD_METRIC and s.name == LOAD_METRIC + "_total":
                loads += as_number(s.value)
    return ServingCounts(events, loads) if found else None


def _read_metrics(transport: Any) -> tuple[int, str]:
    status, payload = transport.client.request("GET", "/metrics", retry=True, timeout=30)
    return status, payload.decode(errors="replace")


def serving_counts(transport: Any) -> ServingCounts:
    """The server's serving-phase totals; errors say how to make them available."""
    status, text = _read_metrics(transport)
    if status == 404:
        raise WarmupError(f"{transport.url}/metrics: not found (HTTP 404)",
                          hint="start SGLang with --enable-metrics, or pass --state-dir with the "
                               "server's state directory")
    if status != 200:
        raise TransportError(f"{transport.url}/metrics answered HTTP {status}: {snippet(text)}",
                             hint=transport.client.hint(status))
    counts = parse_metrics(text)
    if counts is None:
        raise WarmupError(f"{transport.url}/metrics has no sglang_warmup_ metrics",
                          hint="start the server with `sglang-warmup serve` (or WARMUP_ENABLE=1) "
                               "so compile events are counted, or pass --state-dir")
    return counts



def gc_overlap_ms(pauses: Sequence[Mapping[str, Any]], start: float, end: float) -> float:
    """Milliseconds of the window ``start``-``end`` (wall clock) during which at least one of the
    recorded garbage collections (compile-log ``gc`` records: ``time`` their end,
    ``duration_s``) ran: collections of several processes at once count once."""
    spans = []
    for r in pauses:
        ended, took = as_number(r.get("time")), as_number(r.get("duration_s"))
        lo, hi = max(start, ended - took), min(end, ended)
        if hi > lo:
            spans.append((lo, hi))
    total, reach = 0.0, start
    for lo, hi in sorted(spans):
        if hi > reach:
            total += hi - max(lo, reach)
            reach = hi
    return total * 1000
