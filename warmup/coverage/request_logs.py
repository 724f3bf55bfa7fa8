"""Traffic from request logs: OpenAI-style request bodies (JSON lines, the batch API's input
lines included) or SGLang's own request log (``--log-requests``, text or JSON format), as
:class:`~warmup.coverage.traffic.TrafficStep`s: lengths, sampling and request features, never
text.  Every field is type-checked and bounded before use (a log line is untrusted input)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from warmup.coverage.traffic import (MAX_NEW_TOKENS, MAX_PROMPT_TOKENS, MAX_PROMPTS, MAX_STEPS,
                                     TrafficStep, _count, _json_line, _number, _read_lines,
                                     check_features)
from warmup.errors import WarmupError
from warmup.plan.model import MAX_FEATURE_IDS, MAX_PARALLEL_SAMPLES, SAMPLING_KEYS

CONVERT_FORMATS = ("openai", "sglang-log")
#: OpenAI request fields that become SGLang sampling parameters.
_OPENAI_SAMPLING = {"temperature": "temperature", "top_p": "top_p", "top_k": "top_k",
                    "min_p": "min_p", "frequency_penalty": "frequency_penalty",
                    "presence_penalty": "presence_penalty",
                    "repetition_penalty": "repetition_penalty", "seed": "sampling_seed"}
#: Fields that carry an exact prompt token count, looked up in this order.
_TOKEN_FIELDS = (("prompt_tokens",), ("input_tokens",), ("num_prompt_tokens",),
                 ("usage", "prompt_tokens"), ("response", "body", "usage", "prompt_tokens"))


@dataclass(frozen=True)
class Conversion:
    """Steps converted from a request log, what was left out (reason -> count), and notes."""

    steps: tuple[TrafficStep, ...]
    requests: int
    skipped: dict[str, int]
    notes: tuple[str, ...] = ()

    def within(self, max_steps: int) -> "Conversion":
        """At most ``max_steps`` steps (what a traffic file holds); the requests of the steps
        past them are counted as left out."""
        if len(self.steps) <= max_steps:
            return self
        dropped = sum(len(s.prompts) for s in self.steps[max_steps:])
        why = f"past the {max_steps:,} steps a traffic file holds"
        return Conversion(self.steps[:max_steps], self.requests - dropped,
                          {**self.skipped, why: dropped}, self.notes)

    def summary(self) -> str:
        text = f"converted {self.requests} request(s) into {len(self.steps)} traffic step(s)"
        if self.skipped:
            text += "; left out: " + ", ".join(f"{n} {why}" for why, n in sorted(self.skipped.items()))
        return "\n".join([text] + [f"note: {n}" for n in self.notes])


def convert(fmt: str, path: str | Path, *, burst_window_ms: float = 10.0) -> Conversion:
    """Traffic steps from a request log: ``openai`` (JSON lines of OpenAI-style request bodies)
    or ``sglang-log`` (what SGLang writes with ``--log-requests``).  Lengths only."""
    if fmt not in CONVERT_FORMATS:
        raise WarmupError(f"unknown log format {fmt!r}", hint="one of: " + ", ".join(CONVERT_FORMATS))
    p = Path(path)
    lines = _read_lines(p, "request log", errors="replace")
    conv = (_from_openai(lines, str(p)) if fmt == "openai" else
            _from_sglang_log(lines, burst_window_ms / 1000.0)).within(MAX_STEPS)
    if not conv.steps:
        raise WarmupError(f"{p}: no request could be converted"
                          + (f" ({', '.join(f'{n} {w}' for w, n in sorted(conv.skipped.items()))})"
                             if conv.skipped else ""),
                          hint="openai: one JSON request body per line; sglang-log: a log written "
                               "with --log-requests (text or json format)")
    return conv


def _tokens(chars: int) -> int:
    """Tokens estimated from characters (about 4 per token for English text)."""
    return max(1, math.ceil(chars / 4))


def _dig(d: Any, path: tuple[str, ...]) -> Any:
    for k in path:
        if not isinstance(d, dict):
            return None
        d = d.get(k)
    return d


def _text_chars(content: Any) -> int:
    """Characters of a message's text: a string, or the text parts of a list of content parts
    (a part whose ``text`` is not a string counts nothing)."""
    if isinstance(content, str):
        return len(content)
    if isinstance(content, list):
        return sum(len(p["text"]) for p in content
                   if isinstance(p, dict) and isinstance(p.get("text"), str))
    return 0


def _from_openai(lines: list[str], where: str) -> Conversion:
    import hashlib

    rows: list[tuple[tuple[int, ...], str, int | None, dict, str | None, int, dict[str, Any]]] = []
    skipped: dict[str, int] = {}
    requests = 0
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        d = _json_line(line, f"{where}:{i}")
        if not isinstance(d, dict):
            raise WarmupError(f"{where}:{i}: expected a JSON object", hint="one request body per line")
        body = d["body"] if isinstance(d.get("body"), dict) else d  # batch-API input lines
        if str(d.get("url") or "").endswith("/embeddings"):
            skipped["embedding requests"] = skipped.get("embedding requests", 0) + 1
            continue
        count = next((v for v in (_dig(d, f) if _dig(d, f) is not None else _dig(body, f)
                                  for f in _TOKEN_FIELDS)
                      if isinstance(v, int) and not isinstance(v, bool) and v > 0), None)
        prompts: tuple[int, ...] = ()
        system_key, system_len, label = None, 0, "completion"
        messages = body.get("messages")
        prompt = body.get("prompt", body.get("input"))
        if isinstance(messages, list) and messages:
            label = "chat"
            prompts = (count or _tokens(sum(_text_chars(m.get("content")) for m in messages
                                            if isinstance(m, dict))),)
            first = messages[0] if isinstance(messages[0], dict) else {}
            if first.get("role") in ("system", "developer") and _text_chars(first.get("content")):
                text = json.dumps(first.get("content"), sort_keys=True)
                system_key = "sys-" + hashlib.sha256(text.encode()).hexdigest()[:8]
                system_len = _tokens(_text_chars(first.get("content")))
        elif isinstance(prompt, str):
            prompts = (count or _tokens(len(prompt)),)
        elif isinstance(prompt, list) and prompt and all(isinstance(x, int) for x in prompt):
            prompts = (len(prompt),)  # token ids: exact
        elif isinstance(prompt, list) and prompt and all(isinstance(x, str) for x in prompt):
            prompts = tuple(_tokens(len(x)) for x in prompt)
        elif isinstance(prompt, list) and prompt and all(isinstance(x, list) for x in prompt):
            prompts = tuple(max(1, len(x)) for x in prompt)
        elif count:
            prompts = (count,)
        if not prompts:
            skipped["without prompt, messages or token count"] = \
                skipped.get("without prompt, messages or token count", 0) + 1
            continue
        if len(prompts) > MAX_PROMPTS or max(prompts) > MAX_PROMPT_TOKENS:
            why = f"above {MAX_PROMPTS:,} prompts or {MAX_PROMPT_TOKENS:,} tokens per prompt"
            skipped[why] = skipped.get(why, 0) + 1
            continue
        requests += len(prompts)
        sampling = {ours: body[theirs] for theirs, ours in _OPENAI_SAMPLING.items()
                    if _number(body.get(theirs))}
        mnt = next((body[k] for k in ("max_completion_tokens", "max_tokens", "max_new_tokens")
                    if _count(body.get(k), MAX_NEW_TOKENS)), None)
        rows.append((prompts, label, mnt, sampling, system_key, system_len,
                     _openai_features(body, prompts)))
    shared: dict[str, int] = {}
    for _, _, _, _, key, _, _ in rows:
        if key:
            shared[key] = shared.get(key, 0) + 1
    steps = []
    for prompts, label, mnt, sampling, key, plen, features in rows:
        group = key if key and shared[key] > 1 and all(n > plen for n in prompts) else None
        steps.append(TrafficStep("single" if len(prompts) == 1 else "batch", prompts,
                                 mnt or 16, sampling, group, plen if group else 0, label, features))
    notes = ("token counts estimated as ceil(characters / 4) where no token count field was "
             "present; a system message shared by several requests is a prefix group; n, "
             "stream, logprobs, top_logprobs and echo become request features",)
    return Conversion(tuple(steps), requests, skipped, notes)


def _openai_features(body: dict, prompts: tuple[int, ...]) -> dict[str, Any]:
    """Request features of an OpenAI request body: ``n``, ``stream``, chat ``logprobs`` /
    ``top_logprobs``, completions ``logprobs: k`` (with ``echo``: the prompt's logprobs too).
    Values out of SGLang's range are left out."""
    out: dict[str, Any] = {}
    if _count(body.get("n"), MAX_PARALLEL_SAMPLES) and body["n"] > 1:
        out["n"] = body["n"]
    if body.get("stream") is True:
        out["stream"] = True
    logprobs, top = body.get("logprobs"), body.get("top_logprobs")
    if logprobs is True or _count(logprobs, MAX_FEATURE_IDS, minimum=0):
        out["return_logprob"] = True
        k = top if _count(top, MAX_FEATURE_IDS) else (
            logprobs if not isinstance(logprobs, bool) and logprobs else None)
        if k:
            out["top_logprobs_num"] = k
        if body.get("echo") is True:
            out["logprob_start_len"] = 0
    return out if check_features(out, prompts) is None else {}


# SGLang's request logger (srt/utils/request_logger.py, 0.5.17-0.5.23): text lines
# "[time] Finish: obj=GenerateReqInput(...), out={... 'meta_info': {...}}" or JSON lines
# {"timestamp": iso, "event": "request.finished", "rid": ..., "obj": {...}, "out": {...}}.
_META_INT = ("prompt_tokens", "completion_tokens", "cached_tokens")
_META_FLOAT = ("e2e_latency", "request_received_ts")
#: A number of the text format, as the patterns below capture it: digits alone, or what
#: ``float()`` parses (``1.2.3`` and a lone ``e`` are not matched, so never converted).
_INT = r"(\d+)"
_FLOAT = r"(-?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)"
#: Digits kept of an integer of the text format: more is past every bound (and past what
#: ``int()`` converts at all: 4,300 digits).
_INT_DIGITS = 18


def _log_int(digits: str) -> int:
    """An integer of the text format; one with more than :data:`_INT_DIGITS` digits counts as
    ``10**18``, past every bound, so that the request is left out as too large."""
    return int(digits) if len(digits) <= _INT_DIGITS else 10 ** _INT_DIGITS


def _log_float(text: str) -> float | None:
    """A finite number of the text format (matched by :data:`_FLOAT`), else None."""
    value = float(text)
    return value if math.isfinite(value) else None


def _balanced(text: str, start: int) -> str | None:
    """The ``{...}`` starting at ``start``, respecting Python string quotes."""
    depth, quote, i = 0, "", start
    while i < len(text):
        c = text[i]
        if quote:
            if c == "\\":
                i += 2
                continue
            if c == quote:
                quote = ""
        elif c in "'\"":
            quote = c
        elif c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return text[start:i + 1]
        i += 1
    return None


def _loose_json(text: str) -> Any:
    """A JSON value from a log line, or None when it is not one (never raises)."""
    try:
        return json.loads(text, parse_constant=lambda name: None)
    except (ValueError, RecursionError):
        return None


def _log_features(obj: dict, sampling: Any) -> dict[str, Any]:
    """Request features of a logged ``GenerateReqInput``."""
    out: dict[str, Any] = {}
    if obj.get("return_logprob") is True:
        out["return_logprob"] = True
        for k in ("logprob_start_len", "top_logprobs_num"):
            if _count(obj.get(k), MAX_PROMPT_TOKENS, minimum=0):
                out[k] = obj[k]
    if obj.get("stream") is True:
        out["stream"] = True
    n = sampling.get("n") if isinstance(sampling, dict) else None
    if _count(n, MAX_PARALLEL_SAMPLES) and n > 1:
        out["n"] = n
    return out


def _parse_log_line(line: str) -> dict | None:
    """One finished request of an SGLang request log: prompt/completion/cached tokens, sampling,
    arrival time (seconds) and its precision; a received request's arrival; None for other
    lines."""
    brace = line.find("{")
    if '"request.finished"' in line and brace >= 0:
        return _json_finished(line[brace:])
    if '"request.received"' in line and brace >= 0:
        return _json_received(line[brace:])
    return _text_finished(line)


def _when(value: Any) -> float | None:
    """An ISO time as seconds since the epoch; None when it is not one."""
    from datetime import datetime

    try:
        return datetime.fromisoformat(str(value)).timestamp()
    except (ValueError, OverflowError, OSError):
        return None


def _json_finished(text: str) -> dict | None:
    """The JSON format's ``request.finished`` record."""
    d = _loose_json(text)
    if not isinstance(d, dict):
        return None
    out, obj = d.get("out") or {}, d.get("obj") or {}
    meta = out.get("meta_info") if isinstance(out, dict) else None
    if not isinstance(meta, dict):
        return None
    rec: dict[str, Any] = {k: meta.get(k) if _count(meta.get(k), 1 << 62, minimum=0) else None
                           for k in _META_INT}
    rec.update({k: float(meta[k]) if _number(meta.get(k)) else None for k in _META_FLOAT})
    fr = meta.get("finish_reason")
    rec["finish"] = fr.get("type") if isinstance(fr, dict) else fr
    sp = obj.get("sampling_params") if isinstance(obj, dict) else None
    rec["sampling"] = sp if isinstance(sp, dict) else None
    rec["features"] = _log_features(obj if isinstance(obj, dict) else {}, sp)
    rid = d.get("rid")
    rec["rid"] = rid if isinstance(rid, (str, int)) and not isinstance(rid, bool) else None
    rec["logged"] = _when(d.get("timestamp"))
    rec["precise"] = True
    return rec


def _json_received(text: str) -> dict | None:
    """The JSON format's ``request.received`` record: its arrival."""
    d = _loose_json(text)
    if not isinstance(d, dict) or not isinstance(d.get("rid"), (str, int)):
        return None
    received = _when(d.get("timestamp"))
    return None if received is None else {"received_rid": d["rid"], "received": received}


def _text_finished(line: str) -> dict | None:
    """The text format's ``Finish: obj=... meta_info`` line (whole-second times)."""
    import re
    from datetime import datetime

    at = line.find("Finish: obj=")
    meta_at = line.rfind("'meta_info': {") if at >= 0 else -1
    if meta_at < 0:
        return None
    meta = line[meta_at:]
    rec: dict[str, Any] = {}
    for k in _META_INT:
        m = re.search(rf"'{k}': {_INT}\b", meta)
        rec[k] = _log_int(m.group(1)) if m else None
    for k in _META_FLOAT:
        m = re.search(rf"'{k}': {_FLOAT}(?![\w.])", meta)
        rec[k] = _log_float(m.group(1)) if m else None
    m = re.search(r"'finish_reason': \{'type': '(\w+)'", meta)
    rec["finish"] = m.group(1) if m else None
    rec["sampling"] = _text_sampling(line, at, meta_at)
    rec["features"] = _text_features(line[at:meta_at])
    m = re.match(r"\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)", line)
    try:
        rec["logged"] = datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S").timestamp() if m else None
    except ValueError:
        rec["logged"] = None
    rec["precise"] = False  # the text format stamps whole seconds
    rec["rid"] = None
    return rec


def _text_sampling(line: str, at: int, meta_at: int) -> dict | None:
    """The ``sampling_params={...}`` of a text-format line, read as a literal (never run)."""
    import ast
    import re

    sp_at = line.find("sampling_params={", at, meta_at)
    if sp_at < 0:
        return None
    raw = _balanced(line, sp_at + len("sampling_params="))
    try:
        # Bounded before it is parsed: sampling parameters are a few dozen short fields.
        value = ast.literal_eval(raw) if raw and len(raw) <= 16384 else None
        return value if isinstance(value, dict) else None
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        found = re.findall(rf"'(\w+)': {_FLOAT}(?![\w.])", raw or "")
        return {k: v for k, v in ((k, _log_float(t)) for k, t in found) if v is not None}


def _text_features(head: str) -> dict[str, Any]:
    """The request features a text-format line shows (logprobs, streaming)."""
    import re

    feats: dict[str, Any] = {}
    if re.search(r"\breturn_logprob=True", head):
        feats["return_logprob"] = True
        for k in ("logprob_start_len", "top_logprobs_num"):
            m = re.search(rf"\b{k}={_INT}\b", head)
            if m:
                feats[k] = _log_int(m.group(1))
    if re.search(r"\bstream=True", head):
        feats["stream"] = True
    return feats


def _from_sglang_log(lines: list[str], window_s: float) -> Conversion:
    received: dict[str, float] = {}
    finished: list[dict] = []
    skipped: dict[str, int] = {}

    def skip(why: str) -> None:
        skipped[why] = skipped.get(why, 0) + 1

    for line in lines:
        rec = _parse_log_line(line)
        if rec is None:
            continue
        if "received_rid" in rec:
            if rec["received_rid"] is not None:
                received[str(rec["received_rid"])] = rec["received"]
            continue
        finished.append(rec)
    # arrival, precise, prompt tokens, completion tokens, sampling, cached tokens, features
    rows: list[tuple[float | None, bool, int, int, dict[str, Any], int, dict[str, Any]]] = []
    imprecise = 0
    for rec in finished:
        if rec["finish"] == "abort":
            skip("aborted")
            continue
        if rec["completion_tokens"] is None:
            skip("not generate requests (no completion_tokens)")
            continue
        if not rec["prompt_tokens"]:
            skip("without prompt_tokens")
            continue
        arrival, precise = None, False
        if rec["request_received_ts"]:
            arrival, precise = rec["request_received_ts"], True
        elif rec["rid"] is not None and str(rec["rid"]) in received:
            arrival, precise = received[str(rec["rid"])], True
        elif rec["logged"] is not None:
            arrival = rec["logged"] - (rec["e2e_latency"] or 0.0)
            precise = rec["precise"]
        if not precise:
            imprecise += 1
        if rec["prompt_tokens"] > MAX_PROMPT_TOKENS or rec["completion_tokens"] > MAX_NEW_TOKENS:
            skip(f"above {MAX_PROMPT_TOKENS:,} prompt or {MAX_NEW_TOKENS:,} completion tokens")
            continue
        sampling = {k: v for k, v in (rec["sampling"] or {}).items()
                    if k in SAMPLING_KEYS and _number(v)}
        cached = int(rec["cached_tokens"] or 0)
        features = rec.get("features") or {}
        if check_features(features, (rec["prompt_tokens"],)) is not None:
            features = {}
        rows.append((arrival, precise, int(rec["prompt_tokens"]), max(1, int(rec["completion_tokens"])),
                     sampling, cached if 0 < cached < rec["prompt_tokens"] else 0, features))
    rows.sort(key=lambda r: (r[0] is None, r[0] or 0.0))
    steps: list[TrafficStep] = []
    i = 0
    while i < len(rows):
        group = [rows[i]]
        first = rows[i][0]
        if rows[i][1] and first is not None:
            while i + len(group) < len(rows) and len(group) < MAX_PROMPTS:
                nxt, nxt_precise = rows[i + len(group)][:2]
                if not nxt_precise or nxt is None or nxt - first > window_s:
                    break
                group.append(rows[i + len(group)])
        i += len(group)
        prefixes = {g[5] for g in group}
        plen = prefixes.pop() if len(prefixes) == 1 else 0
        steps.append(TrafficStep("single" if len(group) == 1 else "burst",
                                 tuple(g[2] for g in group), max(g[3] for g in group), group[0][4],
                                 f"cached{plen}" if plen else None, plen,
                                 "log" if len(group) == 1 else "log_burst", group[0][6]))
    notes = ["prompt and completion lengths are SGLang's own token counts; a prompt that hit "
             "the radix cache for N tokens shares an N-token prefix group"]
    if imprecise:
        notes.append(f"{imprecise} request(s) have only whole-second times (text format without "
                     "--enable-metrics): they are replayed one by one, not as bursts")
    return Conversion(tuple(steps), len(rows), skipped, tuple(notes))
