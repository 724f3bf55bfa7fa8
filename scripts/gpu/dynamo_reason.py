#!/usr/bin/env python3
"""The compile log's ``reason`` of a ``torch.compile`` recompile, on the GPU image's torch.

Our recorders installed in this process (``warmup.observe.events``), then SGLang's own
``apply_scaling_penalties`` (``torch.compile(dynamic=True)``, Inductor) called on CUDA tensors
as the sampler calls it: a batch of one, a batch of four, a float64 batch (a guard of its own),
and finally Dynamo's callbacks fired for another trigger (a CUDA graph recorded), outside any
compile.  Expected: four ``dynamo`` builds; the first without a reason, the second and third
naming the guard that failed, the last without one (no stale reason of the compile before)
and named by its trigger.

    python3 scripts/gpu/first_hits.py setup --models none && python3 scripts/gpu/dynamo_reason.py

Prints one JSON object and writes it to ``$OUT/dynamo-reason.json``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import first_hits as fh  # noqa: E402

CHILD = r"""
import json, sys, tempfile
from pathlib import Path
from prometheus_client import CollectorRegistry
from cache_tools import compile_log
from warmup.observe import events, phase

state = Path(tempfile.mkdtemp()) / "state"
events.install(registry=CollectorRegistry(), state_dir=state)
phase.set_phase("serving", state_dir=state)
import torch
from torch._dynamo.callback import CallbackTrigger, callback_handler
from sglang.srt.sampling.penaltylib.repetition_penalty import apply_scaling_penalties

for bs, dtype in ((1, torch.float32), (4, torch.float32), (4, torch.float64)):
    logits = torch.randn(bs, 4096, device="cuda", dtype=dtype)
    apply_scaling_penalties(logits, torch.full_like(logits, 1.1))
torch.cuda.synchronize()
with callback_handler.install_callbacks(CallbackTrigger.CUDAGRAPH_RECORDING, "0/9"):
    pass
events.uninstall()
recs = [r for r in compile_log.read_dir(state) if r.get("compiler") == "dynamo"]
print(json.dumps({"torch": torch.__version__,
                  "builds": [{"module_name": r.get("module_name"), "reason": r.get("reason"),
                              "duration_s": r.get("duration_s")} for r in recs]}))
"""


def main() -> None:
    env = fh.base_env()
    env["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp()
    env["TRITON_CACHE_DIR"] = tempfile.mkdtemp()
    done = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True,
                          timeout=400)
    if done.returncode != 0:
        raise SystemExit(done.stderr[-4000:])
    result = json.loads(done.stdout.strip().splitlines()[-1])
    builds = result["builds"]
    result["as_expected"] = (len(builds) == 4 and builds[0]["reason"] is None
                             and all(b["reason"] for b in builds[1:3])
                             and builds[3]["reason"] is None
                             and builds[3]["module_name"].endswith("(cudagraph_recording)"))
    fh.emit("dynamo-reason.json", result)


if __name__ == "__main__":
    main()
