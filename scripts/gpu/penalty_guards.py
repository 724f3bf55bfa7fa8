#!/usr/bin/env python3
"""Which request shapes make SGLang's ``torch.compile``'d penalties compile a new graph?

``apply_scaling_penalties`` (``penaltylib/repetition_penalty.py``, ``dynamic=True``) is traced
again for every guard set its arguments fail.  This sends probes to a server launched by
``first_hits.py`` (best without a warm-up: ``qwen-default-A``), one at a time, each a single
prompt or a burst of prompts sent at once with a penalizing sampler and a logprob mode, and
after each reads the ``dynamo`` builds our plugin wrote to the compile log: the graph compiled
and the guard of an earlier graph that failed (``reason``).  The order matters (a probe
compiles only what no earlier probe did); the probes go from the plain cases to the mixed ones.

    python3 scripts/gpu/first_hits.py setup --models qwen \\
      && python3 scripts/gpu/first_hits.py launch qwen-default-A \\
      && python3 scripts/gpu/penalty_guards.py qwen-default-A

``--probes chunked`` sends, to a server that ran a plan (``qwen-default-C``), bursts that hold
a prompt longer than the chunk beside short and one-token prompts (a request whose prefill is
split shares its first chunk's batch with the others), then the DeepSeek-V4 traffic step that
compiled a graph after ready under the plan (a 5-, 1- and 6,000-token burst, sampled with a
repetition penalty, input logprobs from 0 with top-20), and variations of it: what compiles
first names the missing guard set.  Lengths past the chunk are read off the server's
``chunked_prefill_size``.

``--probes tiny`` sends tiny prompts (two to five, a few tokens in all), first as one batched
request (one batch whatever the timing; labels ``batched-*``), then as bursts: a breakable
prefill graph runs a batch eager when padding it would more than double it, so on a server
whose smallest captured size is 16 such a batch meets the eager metadata kernels with its
real token count.  Sent to a launch without a warm-up they should compile (the cause
confirmed); to a launch with the plan, nothing should.

Writes ``$OUT/penalty-guards[-SET].json`` and prints one line per probe.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import first_hits as fh  # noqa: E402

PENALIZED = {"temperature": 0, "repetition_penalty": 1.05, "frequency_penalty": 0.1}
SAMPLED_PENALIZED = {"temperature": 0.7, "repetition_penalty": 1.1}

#: (label, prompts, max_new_tokens, sampling, logprob mode of first_hits.LOGPROBS)
PROBES = [
    ("single-none-prefill", [219], 1, PENALIZED, "none"),
    ("burst2-none-prefill", [219, 220], 1, PENALIZED, "none"),
    ("single-none-decode", [221], 4, PENALIZED, "none"),
    ("burst2-none-decode", [222, 223], 4, PENALIZED, "none"),
    ("single-token_ids-prefill", [224], 1, PENALIZED, "token_ids"),
    ("burst2-token_ids-prefill", [225, 226], 1, PENALIZED, "token_ids"),
    ("burst2-token_ids-decode", [227, 228], 4, PENALIZED, "token_ids"),
    ("single-1tok-token_ids-prefill", [1], 1, PENALIZED, "token_ids"),
    ("burst-428+1-token_ids-prefill", [428, 1], 1, PENALIZED, "token_ids"),
    ("burst-428+1-token_ids-decode16", [429, 1], 16, PENALIZED, "token_ids"),
    ("burst-428+1-none-decode16", [430, 1], 16, PENALIZED, "none"),
    ("burst-1+1-token_ids", [1, 1], 4, PENALIZED, "token_ids"),
    ("single-input0-prefill", [231], 1, PENALIZED, "input_from_0"),
    ("burst2-input0-decode", [232, 233], 4, PENALIZED, "input_from_0"),
    ("burst-428+1-input0", [431, 1], 4, PENALIZED, "input_from_0"),
    ("burst-428+1-output_top", [432, 1], 4, PENALIZED, "output_top"),
    ("burst-428+1-offset_top", [433, 1], 4, PENALIZED, "input_offset_top"),
    ("burst3-mixed-token_ids", [61, 1, 824], 8, PENALIZED, "token_ids"),
    ("burst-428+1-sampled-rep-token_ids", [434, 1], 16, SAMPLED_PENALIZED, "token_ids"),
    ("burst4-mixed-none", [5, 1, 300, 2000], 8, SAMPLED_PENALIZED, "none"),
]

#: as PROBES, a length given as ("C", k) is the server's chunked_prefill_size plus k
INPUT0_TOP = "input0_top"
CHUNKED_PROBES = [
    ("chunk3-rep-output_top", [("C", 219), 220, 1], 2, SAMPLED_PENALIZED, "output_top"),
    ("chunk3-rep-input0", [("C", 219), 220, 1], 2, SAMPLED_PENALIZED, "input_from_0"),
    ("chunk3-rep-token_ids", [("C", 219), 220, 1], 2, SAMPLED_PENALIZED, "token_ids"),
    ("chunk3-greedypen-input0", [("C", 219), 220, 1], 2, PENALIZED, "input_from_0"),
    ("chunk3-greedypen-output_top", [("C", 219), 220, 1], 2, PENALIZED, "output_top"),
    ("chunk3-rep-input0_top", [("C", 219), 220, 1], 2, SAMPLED_PENALIZED, INPUT0_TOP),
    ("dsv4-step19", [5, 1, ("C", 1904)], 32, SAMPLED_PENALIZED, INPUT0_TOP),
    ("var-3+1+chunk-greedypen-output_top", [3, 1, ("C", 500)], 16, PENALIZED, "output_top"),
    ("var-1+2000+chunk+9-rep-token_ids", [1, 2000, ("C", 100), 9], 8, SAMPLED_PENALIZED, "token_ids"),
    ("var-chunk+1-rep-input0", [("C", 219), 1], 4, SAMPLED_PENALIZED, "input_from_0"),
    ("var-1+2chunks-greedypen-input0", [1, ("C", 4000)], 4, PENALIZED, "input_from_0"),
    ("var-chunk-alone-rep-input0_top", [("C", 37)], 4, SAMPLED_PENALIZED, INPUT0_TOP),
]
#: tiny prompts: on a breakable-graph server a batch below half the smallest captured size runs
#: eager (SGLang 0.5.17 pads no more than 2x), so two tiny prompts taken as a batch of their own
#: meet the eager metadata kernels with their real token count
TINY_PROBES = [
    # one batched request first: the scheduler takes it as one batch whatever the timing
    ("batched-tiny2-greedypen-input0_top", [3, 1], 16, PENALIZED, INPUT0_TOP),
    ("batched-tiny3-rep-none", [2, 1, 1], 4, SAMPLED_PENALIZED, "none"),
    ("tiny2-rep-input0_top", [5, 1], 32, SAMPLED_PENALIZED, INPUT0_TOP),
    ("tiny2-greedypen-input0_top", [3, 1], 16, PENALIZED, INPUT0_TOP),
    ("tiny2-rep-none", [4, 3], 4, SAMPLED_PENALIZED, "none"),
    ("tiny3-greedypen-none", [2, 1, 1], 4, PENALIZED, "none"),
    ("tiny5-rep-token_ids", [1, 1, 2, 1, 1], 4, SAMPLED_PENALIZED, "token_ids"),
    ("tiny2-div16-greedypen-output_top", [7, 9], 4, PENALIZED, "output_top"),
    ("dsv4-16180-step18", [3, 1, 14], 16, PENALIZED, INPUT0_TOP),
    ("dsv4-step19", [5, 1, ("C", 1904)], 32, SAMPLED_PENALIZED, INPUT0_TOP),
]
PROBE_SETS = {"plain": PROBES, "chunked": CHUNKED_PROBES, "tiny": TINY_PROBES}


def _miss(rec: dict) -> dict:
    """A Triton miss with the specialization it compiled (which key no earlier request had)."""
    return {k: rec.get(k) for k in ("name", "phase", "t", "attrs", "constexprs", "signature")}


def main() -> None:
    from warmup.coverage.traffic import TrafficStep
    from warmup.serve.transport import HttpTransport

    ap = argparse.ArgumentParser()
    ap.add_argument("name")
    ap.add_argument("--probes", choices=sorted(PROBE_SETS), default="plain")
    args = ap.parse_args()
    name = args.name
    if not fh.wait_ready([name], 400):
        raise SystemExit(f"{name} not ready: {fh.tail(fh.load_state()[name], 20)}")
    s = fh.load_state()[name]
    state_dir = Path(s["base"]) / "state"
    tr = HttpTransport(f"http://127.0.0.1:{s['port']}", timeout_s=300, seed="guards")
    facts = tr.facts_sync()
    chunk = facts.chunked_prefill_size
    if args.probes != "plain" and not chunk:
        raise SystemExit(f"{name}: --probes {args.probes} needs chunked prefill (no chunked_prefill_size)")
    longest = facts.max_req_input_len
    rows = []
    for i, (label, spec, new, sampling, mode) in enumerate(PROBE_SETS[args.probes]):
        prompts = [chunk + n[1] if isinstance(n, tuple) else n for n in spec]
        if longest is not None and max(prompts) + new > longest:
            fh.log(f"{label}: skipped, {max(prompts)} + {new} tokens is past the server's "
                   f"longest prompt ({longest})")
            continue
        feats = (dict(return_logprob=True, logprob_start_len=0, top_logprobs_num=20)
                 if mode == INPUT0_TOP else dict(fh.LOGPROBS[mode]))
        if feats.get("logprob_start_len") == -1:
            feats["logprob_start_len"] = max(0, min(prompts) // 2)
        kind = "single" if len(prompts) == 1 else "batch" if label.startswith("batched-") \
            else "burst"
        step = TrafficStep(kind=kind, prompts=prompts,
                           max_new_tokens=new, sampling=dict(sampling), features=feats,
                           label=label)
        mark = fh.log_mark(state_dir)
        sent = fh.send_step(tr, step.to_step(i))
        fh.settle(state_dir)  # the compile log's lines land up to a second after the request
        recs = fh.compile_records(state_dir, mark)
        new_recs = [r for r in recs if r["compiler"] == "dynamo"]
        row = {"probe": label, "prompts": prompts, "max_new_tokens": new, "logprobs": mode,
               **sent, "graphs": [{"name": r["name"], "seconds": r["seconds"],
                                   "reason": r.get("reason")} for r in new_recs],
               "misses": [_miss(r) for r in recs if r["event"] == "miss"]}
        rows.append(row)
        fh.log(f"{label}: {sent.get('ms')} ms"
               + "".join(f"\n    {g['name']} {g['seconds']} s: {g['reason']}" for g in row["graphs"])
               + (f"\n    Triton misses: {[m['name'] for m in row['misses']]}" if row["misses"] else "")
               + (f" ERROR {sent['error']}" if sent.get("error") else ""))
    every = fh.compile_records(state_dir)
    every_graph = [{"name": r["name"], "phase": r["phase"], "reason": r.get("reason")}
                   for r in every if r["compiler"] == "dynamo"]
    misses = [_miss(r) for r in every if r["event"] == "miss"]
    suffix = "" if args.probes == "plain" else f"-{args.probes}"
    fh.emit(f"penalty-guards{suffix}.json", {"launch": name, "chunk": chunk, "probes": rows,
                                            "dynamo_builds": every_graph,
                                            "triton_misses": misses})


if __name__ == "__main__":
    main()
