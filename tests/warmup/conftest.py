"""Shared fixtures for the driver, transport, registration and launcher tests.

* ``tiny_model_dir`` / ``sglang_server_args`` / ``sglang_model_config``: a config-only tiny Llama
  (``scripts/gpu/gen_tiny_model.py --no-weights``) resolved by SGLang's own parser and
  resolution pipeline, as for ``--device cuda`` (one per session: SGLang imports cost seconds).
* ``fake_tokenizer_manager``: a stand-in at SGLang's ``TokenizerManager`` boundary only.  Every
  request goes through SGLang's real ``GenerateReqInput.normalize_batch_and_arguments``, the
  length checks of ``TokenizerManager._validate_one_request`` and a real ``SamplingParams``
  (``normalize`` + ``verify``), exactly as SGLang 0.5.22 does before scheduling.  It records what
  it saw (objects, items, in-flight counts, event order) and injects faults by prompt length.
* ``tiny_plan_path``: a plan with one shape of every step mode, at small sizes.
* ``warmup_isolated``: no WARMUP_* variables, a fresh state directory, a reset phase.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import pytest

REPO = Path(__file__).resolve().parents[2]
# The test packages below (plan/, serve/, ...) share the helper modules next to this file.
sys.path.insert(0, str(Path(__file__).resolve().parent))

TINY_VOCAB = 20000
TINY_CONTEXT = 4096
TINY_KV_TOKENS = 20000
TINY_MAX_RUNNING = 8
#: The model's generation config; SGLang's ``get_default_sampling_params`` returns it, so the
#: plans' ``default`` sampling variant sends exactly these.
TINY_GENERATION = {"temperature": 0.6, "top_p": 0.95, "top_k": 20}
TINY_FLAGS = ["--chunked-prefill-size", "256", "--enable-mixed-chunk",
              "--max-running-requests", str(TINY_MAX_RUNNING), "--context-length", str(TINY_CONTEXT)]

@pytest.fixture(scope="session", autouse=True)
def _temporary_model_configs_removed():
    """The config-only tiny models written for facts (one per pytest worker) leave nothing in
    the temporary directory once the session ends."""
    yield
    import _facts_cache

    _facts_cache.cleanup()


TINY_PLAN = """\
version: 1
name: tiny_plan
description: one shape of every step mode, at small sizes
let:
  C: default(chunked_prefill_size, 256)
defaults:
  sampling: alternate
  max_new_tokens: 1
phases:
  - name: prefill
    shapes:
      - class: extends
        kind: extend
        why: integer classes 1, div16, other
        lengths: [1, 16, 37]
      - class: chunked
        kind: chunked
        requires: [chunked_prefill]
        lengths: [C + 19]
      - class: prefix_hits
        kind: prefix
        requires: [radix_cache]
        base: 64
        extends: [1, 17]
  - name: batches
    shapes:
      - class: concurrent
        kind: concurrent
        groups: [[19, 32, 45, 58]]
      - class: batched
        kind: batch
        batch_sizes: [3]
        tokens_per_request: 8
        token_classes: [aligned, odd]
      - class: mixed
        kind: mixed
        requires: [mixed_chunk]
        running: [2]
        prompt: C + 19
        decode_tokens: 4
  - name: decode
    shapes:
      - class: decode
        kind: decode
        batch_sizes: [2]
        decode_tokens: 3
      - class: sampling
        kind: sampling
        variants: [greedy, default, top_p, top_k, min_p, penalties]
        prompt: 21
        decode_tokens: 2
"""


# --- SGLang 0.5.22, resolved on CPU ------------------------------------------------------------
@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    """A config-only tiny Llama (vocabulary 20,000) with sampling defaults in its generation config."""
    out = tmp_path_factory.mktemp("tiny-model")
    subprocess.run([sys.executable, str(REPO / "scripts" / "gpu" / "gen_tiny_model.py"), str(out),
                    "--family", "llama", "--layers", "2", "--hidden", "256",
                    "--vocab", str(TINY_VOCAB), "--no-weights"],
                   check=True, capture_output=True, text=True)
    gen_path = out / "generation_config.json"
    gen = json.loads(gen_path.read_text())
    gen.update(do_sample=True, **TINY_GENERATION)
    gen_path.write_text(json.dumps(gen))
    return out


@pytest.fixture(scope="session")
def sglang_server_args(tiny_model_dir):
    """A real SGLang ``ServerArgs``, parsed and resolved by SGLang as for ``--device cuda``."""
    from sglang.srt.server_args import prepare_server_args

    sa = prepare_server_args(["--model-path", str(tiny_model_dir), "--device", "cuda",
                              "--skip-tokenizer-init", *TINY_FLAGS])
    sa.resolve_once()
    return sa


@pytest.fixture(scope="session")
def sglang_model_config(sglang_server_args):
    """SGLang's own ``ModelConfig`` for the tiny model."""
    from sglang.srt.arg_groups.model_override_base import model_config_of

    return model_config_of(sglang_server_args)


# --- the stand-in at the TokenizerManager boundary ----------------------------------------------
@dataclass
class SeenItem:
    """One request item as SGLang would hand it to the scheduler."""

    rid: str
    input_ids: list[int]
    sampling: Any  # sglang.srt.sampling.sampling_params.SamplingParams, normalized and verified
    sampling_dict: dict[str, Any]
    return_logprob: Any
    stream: bool
    batch_size: int  # items in the GenerateReqInput it came in (1: a single request)
    phase: Any = None  # warmup.observe.phase.current() when it arrived


class FakeTokenizerManager:
    """Stands in for SGLang's TokenizerManager; everything behind it is simulated.

    ``faults`` maps a prompt length to ``"abort"`` (output with finish_reason type abort),
    ``"error"`` (a ValueError, as SGLang raises for a rejected request) or ``"hang"`` (never
    answers).  ``flush_fail_ranks`` lists DP ranks whose flush reports failure.
    """

    def __init__(self, server_args: Any, model_config: Any, *, dp_ranks: int = 1,
                 latency_s: float = 0.005, state_dir: str | None = None) -> None:
        self.server_args = server_args
        self.model_config = model_config
        self.context_len = model_config.context_len
        self.max_total_num_tokens = TINY_KV_TOKENS
        # what SGLang's scheduler reports: min(context_len - 1, max_total_num_tokens - 1)
        self.max_req_input_len = min(self.context_len - 1, self.max_total_num_tokens - 1)
        self.dp_ranks = dp_ranks
        self.latency_s = latency_s
        self.state_dir = state_dir
        self.objs: list[Any] = []  # every GenerateReqInput, after SGLang's normalization
        self.items: list[SeenItem] = []
        self.events: list[tuple[str, tuple[str, ...]]] = []  # (start | token | end, rids)
        self.in_flight = 0
        self.max_in_flight = 0
        self.in_flight_at_arrival: list[int] = []  # per GenerateReqInput
        self.faults: dict[int, str] = {}
        self.flush_fail_ranks: set[int] = set()
        self.flush_requests: list[Any] = []
        self.events_at_flush: int | None = None
        self.gc_frozen_after: int | None = None  # events seen when freeze_gc was called
        self.loop_calls = 0
        self.on_admit: Callable[[SeenItem], None] | None = None  # runs as each item is admitted
        self.rid_to_state: dict[str, Any] = {}  # requests in flight (none kept: SGLang's abort task reads it)
        self.aborted: list[str] = []

    # -- what SGLang's TokenizerManager offers
    def abort_request(self, rid: str = "", **_: Any) -> None:
        self.aborted.append(rid)

    def auto_create_handle_loop(self) -> None:
        self.loop_calls += 1

    async def get_internal_state(self) -> list[dict[str, Any]]:
        base = self.server_args.resolved_dict()
        return [dict(base, effective_max_running_requests_per_dp=TINY_MAX_RUNNING,
                     startup_time=1.0, last_gen_throughput=0.0,
                     memory_usage={"weight": 0.1, "kvcache": 0.2, "startup_available": 10.0,
                                   "token_capacity": self.max_total_num_tokens,
                                   "token_capacity_swa": None, "graph": {}})
                for _ in range(self.dp_ranks)]

    async def freeze_gc(self) -> None:
        """SGLang's TokenizerManager.freeze_gc (the schedulers and this process): recorded."""
        self.gc_frozen_after = len(self.events)
        await asyncio.sleep(0)

    async def flush_cache_communicator(self, req: Any) -> list[Any]:
        from sglang.srt.managers.io_struct import FlushCacheReqOutput

        self.flush_requests.append(req)
        self.events_at_flush = len(self.events)
        await asyncio.sleep(0)
        out = []
        for rank in range(self.dp_ranks):
            if rank in self.flush_fail_ranks:
                out.append(FlushCacheReqOutput(success=False, message="Timed out waiting for idle state."))
            elif self.in_flight:
                out.append(FlushCacheReqOutput(success=False, message=f"{self.in_flight} requests running"))
            else:
                out.append(FlushCacheReqOutput(success=True))
        return out

    async def generate_request(self, obj: Any, request: Any = None):
        self.auto_create_handle_loop()
        obj.normalize_batch_and_arguments()
        subs = [obj] if obj.is_single else [obj[i] for i in range(obj.batch_size)]
        seen = [self._admit(sub, obj) for sub in subs]
        self.objs.append(obj)
        rids = tuple(s.rid for s in seen)
        self.in_flight_at_arrival.append(self.in_flight)
        self.in_flight += len(seen)
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        self.events.append(("start", rids))
        try:
            faults = [self.faults.get(len(s.input_ids)) for s in seen]
            if "error" in faults:
                n = len(seen[faults.index("error")].input_ids)
                raise ValueError(f"injected rejection of a {n}-token prompt")
            if "hang" in faults:
                await asyncio.sleep(3600)
            if obj.stream:
                item, fault = seen[0], faults[0]
                steps = 1 if fault == "abort" else max(1, item.sampling.max_new_tokens)
                for k in range(1, steps + 1):
                    await asyncio.sleep(self.latency_s)
                    self.events.append(("token", rids))
                    yield self._output(item, k, final=k == steps, abort=fault == "abort")
            else:
                await asyncio.sleep(self.latency_s)
                outs = [self._output(s, s.sampling.max_new_tokens, final=True, abort=f == "abort")
                        for s, f in zip(seen, faults)]
                yield outs[0] if obj.is_single else outs
        finally:
            self.in_flight -= len(seen)
            self.events.append(("end", rids))

    # -- helpers
    def _admit(self, sub: Any, obj: Any) -> SeenItem:
        """SGLang's per-request checks before a request is scheduled."""
        from sglang.srt.sampling.sampling_params import SamplingParams

        ids = list(sub.input_ids)
        n = len(ids)
        # TokenizerManager._validate_one_request (0.5.22), without auto-truncation
        if n >= self.context_len:
            raise ValueError(f"The input ({n} tokens) is longer than the model's context length "
                             f"({self.context_len} tokens).")
        mnt = sub.sampling_params.get("max_new_tokens")
        if mnt is not None and mnt + n > self.context_len:
            raise ValueError("Requested token count exceeds the model's maximum context length")
        vocab = self.model_config.vocab_size
        bad = [t for t in ids if not 0 <= t < vocab]
        if bad:
            raise ValueError(f"token ids {bad[:3]} are outside the vocabulary [0, {vocab})")
        # TokenizerManager._create_tokenized_object: SamplingParams(**...), normalize, verify
        sp = SamplingParams(**sub.sampling_params)
        sp.normalize(None)
        sp.verify(vocab)
        phase = None
        if self.state_dir is not None:
            from warmup.observe import phase as phase_mod

            phase = phase_mod.current(state_dir=self.state_dir)
        item = SeenItem(rid=sub.rid, input_ids=ids, sampling=sp, sampling_dict=dict(sub.sampling_params),
                        return_logprob=sub.return_logprob, stream=bool(obj.stream),
                        batch_size=1 if obj.is_single else obj.batch_size, phase=phase)
        self.items.append(item)
        if self.on_admit is not None:
            self.on_admit(item)
        return item

    def _output(self, item: SeenItem, k: int, *, final: bool, abort: bool) -> dict[str, Any]:
        if abort:
            finish = {"type": "abort", "message": f"injected abort of a {len(item.input_ids)}-token prompt",
                      "status_code": None, "err_type": None}
        elif final:
            finish = {"type": "length", "length": k}
        else:
            finish = None
        return {"output_ids": [7] * (0 if abort else k),
                "meta_info": {"id": item.rid, "finish_reason": finish,
                              "prompt_tokens": len(item.input_ids), "completion_tokens": 0 if abort else k,
                              "cached_tokens": 0,
                              # SGLang sets its own latency once a request has finished
                              **({"e2e_latency": 0.002} if final and not abort else {})}}

    def starts(self) -> list[tuple[str, ...]]:
        return [rids for kind, rids in self.events if kind == "start"]


@pytest.fixture
def fake_tokenizer_manager(sglang_server_args, sglang_model_config) -> Callable[..., FakeTokenizerManager]:
    """A factory: ``fake_tokenizer_manager(dp_ranks=2, latency_s=0.01, state_dir=...)``."""

    def make(**kwargs: Any) -> FakeTokenizerManager:
        return FakeTokenizerManager(sglang_server_args, sglang_model_config, **kwargs)

    return make


# --- plans and isolation -------------------------------------------------------------------------
@pytest.fixture
def tiny_plan_path(tmp_path) -> Path:
    path = tmp_path / "tiny_plan.yaml"
    path.write_text(TINY_PLAN)
    return path


@pytest.fixture
def warmup_isolated(tmp_path, monkeypatch) -> Path:
    """No WARMUP_* or SGLANG_PLUGINS variables, metrics off, a fresh state directory (returned)
    in WARMUP_STATE_DIR, and a reset phase."""
    from warmup.observe import phase

    for name in list(os.environ):
        if name.startswith("WARMUP_") or name in ("SGLANG_PLUGINS", "PROMETHEUS_MULTIPROC_DIR"):
            monkeypatch.delenv(name, raising=False)
    state = tmp_path / "state"
    state.mkdir()
    monkeypatch.setenv("WARMUP_STATE_DIR", str(state))
    monkeypatch.setenv("WARMUP_METRICS", "0")
    phase.reset()
    yield state
    phase.reset()
