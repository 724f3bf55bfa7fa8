"""warmup.coverage.learn and ``sglang-warmup learn``: plan classes from audited post-ready misses.

The first tests learn from a real audit (the SGLang stand-in compiling real Triton kernels, see
test_audit); the others from audit files written in the documented format, for the cases a
small stand-in cannot produce (chunked prompts, bursts above the request cap, batches above
the one-forward budget)."""

from __future__ import annotations

import difflib
import json
from pathlib import Path

from _cli import cli
import pytest
from _sglang_standin import StandIn, recording, write_traffic  # noqa: F401 (fixture)

from warmup.coverage import audit, learn, traffic
from warmup.coverage.audit_file import read as read_audit

from warmup.plan import loader
from warmup.errors import WarmupError
from warmup.plan.expand import expand

ROOT = Path(__file__).resolve().parents[3]

SMALL = """\
# A small plan: one extend class.
version: 1
name: small
phases:
  - name: extends
    shapes:
      - class: lengths
        kind: extend
        lengths: [1, 100]   # 100 is in the sample
"""




def real_audit(recording, tmp_path) -> Path:
    steps = traffic.load(write_traffic(tmp_path / "traffic.jsonl"))
    with StandIn(registry=recording.registry) as server:
        report = audit.run(server.url, steps, state_dir=recording.state_dir)
    return Path(audit.write(report, recording.state_dir).file)


def test_learned_yaml_from_a_real_audit(recording, tmp_path, capsys):
    file = real_audit(recording, tmp_path)
    plan = tmp_path / "small.yaml"
    plan.write_text(SMALL)
    code, out, err = cli(capsys, "learn", "--audits", str(recording.state_dir), "--plan", str(plan))
    assert code == 0, err
    name = file.name
    assert out == f"""\
# sglang-warmup learn: 5 post-ready compile event(s) in 4 traffic step(s) from {name}
# merge into {plan}: the phase below goes at the end of `phases:`, the variants under `sampling_variants:`
sampling_variants:
  learned_temperature_top_p: {{temperature: 0.7, top_p: 0.95}}
phases:
  - name: learned
    shapes:
      - class: learned_prefix_32
        kind: prefix
        requires: [radix_cache]
        why: learned extends on a cached 32-token prefix, compiled after ready at step(s) 5 (rag) of {name}
        base: 32
        extends: [38]
      - class: learned_concurrent
        kind: concurrent
        why: learned concurrent prompts (the tokens each request computes), compiled after ready at step(s) 2 (burst) of {name}
        groups:
          - [64, 80]
      - class: learned_batch_30
        kind: batch
        why: learned batches of about 30 tokens a request, compiled after ready at step(s) 3 (batch_3) of {name}
        batch_sizes: [3]
        tokens_per_request: 30
        token_classes: [odd]
      - class: learned_sampling
        kind: sampling
        why: learned sampling parameters, compiled after ready at step(s) 2 (burst) of {name}
        variants: [learned_temperature_top_p]
        prompt: 64
        decode_tokens: 4
        concurrency: [2]
"""
    assert err.splitlines() == [
        "learn: 5 post-ready compile event(s) in 4 step(s); 4 new class(es) in phase 'learned', "
        "1 new sampling variant(s); +9 warm-up requests on the audited server",
        f"  already in the plan: {name} step 0 (fresh): a 100-token prompt in class lengths",
        f"  unexplained: {name} step 0 (fresh): 1 compile event(s) (standin_extend); the plan "
        "already sends every shape of this step: if the audited server was warmed with this "
        "plan, what compiled depends on something plan format v1 cannot express"]


def test_the_merged_plan_loads_expands_and_keeps_the_original_text(recording, tmp_path, capsys):
    file = real_audit(recording, tmp_path)
    facts = read_audit(file).facts
    for source in (tmp_path / "small.yaml", ROOT / "plans" / "default.yaml"):
        if source.name == "small.yaml":
            source.write_text(SMALL)
        out = tmp_path / f"merged-{source.name}"
        code, _, err = cli(capsys, "learn", "--audits", str(file), "--plan", str(source),
                           "--write", str(out))
        assert code == 0
        assert err.splitlines()[-1] == f"wrote {out} (4 learned class(es))"
        merged = loader.load(out)  # the merged plan loads ...
        assert [p.name for p in merged.phases][-1] == "learned"
        exp = expand(merged, facts)  # ... and expands on the audited server
        learned = [s for s in exp.steps if s.phase == "learned"]
        assert [(s.shape_class, s.mode, [r.input_len for r in s.requests]) for s in learned] == [
            ("learned_prefix_32", "single", [32]), ("learned_prefix_32", "single", [70]),
            ("learned_concurrent", "concurrent", [64, 80]),
            ("learned_batch_30", "batch", [30, 30, 30]),  # total 90: odd
            ("learned_sampling", "concurrent", [64, 65])]
        assert learned[1].requests[0].prefix_len == 32
        assert learned[-1].requests[0].sampling == {"temperature": 0.7, "top_p": 0.95}
        # Only insertions: every original line, comments included, is still there.
        original = source.read_text().splitlines()
        ops = difflib.SequenceMatcher(a=original, b=out.read_text().splitlines()).get_opcodes()
        assert {op[0] for op in ops} == {"equal", "insert"}
        # Learning again from the merged plan finds nothing new.
        again = learn.learn(file, out)
        assert again.empty and again.merged_text == out.read_text()
        code, text, err = cli(capsys, "learn", "--audits", str(file), "--plan", str(out),
                              "--write", str(tmp_path / "again.yaml"))
        assert code == 0 and text == ""
        assert err.splitlines()[-1] == f"{tmp_path / 'again.yaml'} not written: nothing to learn"
        assert not (tmp_path / "again.yaml").exists()


def test_diff_and_json(recording, tmp_path, capsys):
    file = real_audit(recording, tmp_path)
    plan = tmp_path / "small.yaml"
    plan.write_text(SMALL)
    code, out, _ = cli(capsys, "learn", "--audits", str(file), "--plan", str(plan), "--diff")
    assert code == 0
    lines = out.splitlines()
    assert lines[:3] == ["--- a/small.yaml", "+++ b/small.yaml", "@@ -1,9 +1,37 @@"]
    assert lines[6:8] == ["+sampling_variants:",
                          "+  learned_temperature_top_p: {temperature: 0.7, top_p: 0.95}"]
    assert lines[14] == "+  - name: learned"
    assert all(line[0] in " +" for line in lines[3:])
    code, out, _ = cli(capsys, "learn", "--audits", str(file), "--plan", str(plan), "--json")
    data = json.loads(out)
    assert [s["class"] for s in data["shapes"]] == ["learned_prefix_32", "learned_concurrent",
                                                    "learned_batch_30", "learned_sampling"]
    assert data["sampling_variants"] == {"learned_temperature_top_p":
                                         {"temperature": 0.7, "top_p": 0.95}}
    assert [(m["index"], m["events"], m["kernels"]) for m in data["misses"]] == [
        (0, 1, ["standin_extend"]), (2, 2, ["standin_extend", "standin_sample"]),
        (3, 1, ["standin_extend"]), (5, 1, ["standin_extend"])]
    assert data["written"] is None and data["added_requests"] == 9


# --- audit files in the documented format ------------------------------------------------------

FACTS = {"chunked_prefill_size": 1024, "page_size": 64, "context_length": 16384,
         "max_req_input_len": 16000, "max_running_requests": 4, "max_total_tokens": 500000,
         "max_prefill_tokens": 16384, "decode_graph": True, "decode_graph_max_bs": 8,
         "decode_graph_bs": [1, 2, 4, 8], "prefill_graph_backend": "disabled",
         "prefill_graph_buckets": [], "prefill_graph_context": None, "enable_mixed_chunk": False,
         "disable_radix_cache": False, "disaggregation_mode": "null",
         "speculative_algorithm": None, "tp_size": 1, "dp_size": 1, "tokenizer_worker_num": 1,
         "vocab_size": 32000, "model_type": None, "default_sampling_params": {},
         "sglang_version": "0.5.22", "source": "server_info", "assumed": []}


def step(index, kind, prompts, misses=1, *, prefix=None, cached=False, sampling=None,
         label="", second=0):
    s = {"index": index, "kind": kind, "prompts": prompts, "max_new_tokens": 8,
         "sampling": sampling or {"temperature": 0.0}, "label": label, "prefix_cached": cached,
         "pass1": {"ms": 50.0, "misses": misses, "device_loads": 0, "keys": []},
         "pass2": {"ms": 10.0, "misses": second, "device_loads": 0, "keys": []}}
    if prefix:
        s["prefix"] = {"group": "g", "len": prefix}
    return s


def audit_file(path: Path, steps, **extra) -> Path:
    data = {"format": "sglang-warmup-audit", "version": 1, "mode": "metrics", "steps": steps,
            "facts": FACTS, "unattributed": [], "unseen_events": 0, **extra}
    path.write_text(json.dumps(data))
    return path


def test_shapes_follow_the_servers_chunk_page_and_request_cap(tmp_path):
    plan = tmp_path / "small.yaml"
    plan.write_text(SMALL)
    file = audit_file(tmp_path / "audit-1.json", [
        step(0, "single", [3000], label="long"),                         # above the chunk
        step(1, "burst", [200, 300, 400, 500, 600, 700], label="wide"),  # above the cap (4)
        step(2, "burst", [900, 950], prefix=700, cached=True),           # cached 640 (10 pages)
        step(3, "batch", [900] * 20, label="big"),                       # above the budget
        step(4, "single", [100], misses=0, second=1, label="late"),      # only pass 2 missed
        step(5, "single", [50], misses=0),                               # no miss: ignored
    ], unattributed=[{"compiled": 2, "disk_hits": 1}])
    got = learn.learn(file, plan)
    shapes = {s["class"]: s for s in got.shapes}
    assert list(shapes) == ["learned_chunked", "learned_prefix_640", "learned_concurrent",
                            "learned_batch_252"]
    assert shapes["learned_chunked"]["lengths"] == [3000]
    assert shapes["learned_chunked"]["requires"] == ["chunked_prefill"]
    # 700 prefix tokens, 64-token pages: 640 cached; the extends are what each prompt computes.
    assert shapes["learned_prefix_640"]["extends"] == [260, 310]
    # Six concurrent requests on a server that runs 4 at once; then the two prefix hits.
    assert shapes["learned_concurrent"]["groups"] == [[200, 300, 400, 500], [600, 700],
                                                      [260, 310]]
    # 4 x 252 in whole 64-token pages is 4 x 256: the 1,024-token budget, as the scheduler counts
    batch = shapes["learned_batch_252"]
    assert (batch["batch_sizes"], batch["tokens_per_request"], batch["token_classes"]) == \
        ([4], 252, ["aligned"])
    assert got.notes == (
        "audit-1.json step 3 (big): a batch of 20 is above max_running_requests (4); learned "
        "as batches of 4",
        "audit-1.json step 3 (big): a batch of 4 x 900 tokens is above the one-forward budget "
        "(1024, in whole pages of 64); learned with 252 per request")
    assert got.covered == ("audit-1.json step 4 (late): a 100-token prompt in class lengths",)
    assert len(got.unexplained) == 1 and got.unexplained[0].startswith(
        "audit-1.json step 4 (late): 1 compile event(s) (no kernel names: metrics mode); ")
    assert got.unattributed == 3
    assert got.skipped == ()
    assert "  3 compile event(s) during the audits had no traffic step: learn cannot derive " \
           "shapes for them" in got.summary().splitlines()


def test_a_learned_batch_is_cut_only_where_one_prefill_cannot_hold_it(tmp_path):
    plan = tmp_path / "small.yaml"
    plan.write_text(SMALL)
    # 4 x 256 in 64-token pages is exactly the 1,024-token chunk: learned as it was sent
    fits = learn.learn(audit_file(tmp_path / "audit-1.json", [step(0, "batch", [256] * 4)]), plan)
    assert [(s["batch_sizes"], s["tokens_per_request"]) for s in fits.shapes] == [([4], 256)]
    assert fits.notes == ()
    # 20 short prompts under a cap of 64 with 256-token pages: the scheduler charges each a
    # whole page, so 4 of them fill the 1,024-token chunk
    wide = learn.learn(audit_file(tmp_path / "audit-2.json", [step(0, "batch", [2] * 20)],
                                  facts=dict(FACTS, max_running_requests=64, page_size=256)), plan)
    assert [(s["batch_sizes"], s["tokens_per_request"]) for s in wide.shapes] == [([4], 2)]
    assert wide.notes == ("audit-2.json step 0 (batch): a batch of 20 is above what one prefill "
                          "holds (4 requests of whole 256-token pages in 1024); learned as "
                          "batches of 4",)


def test_custom_variants_merge_into_existing_sampling_variants(tmp_path):
    plan = tmp_path / "p.yaml"
    plan.write_text("version: 1\nname: p\nsampling_variants:\n    mine: {temperature: 0.5}\n"
                    "phases:\n- name: a\n  shapes:\n  - class: x\n    kind: extend\n"
                    "    lengths: [8]")  # indentless lists, no final newline
    file = audit_file(tmp_path / "audit-1.json", [
        step(0, "single", [8], sampling={"temperature": 0.5}),            # the plan's own
        step(1, "single", [9], sampling={"temperature": 0.8, "top_k": 40}),  # built-in top_k
        step(2, "single", [10], sampling={"temperature": 0.9, "top_k": 5}),
        step(3, "single", [11], sampling={"temperature": 0.9, "top_k": 7})])
    got = learn.learn(file, plan)
    assert got.sampling_variants == {"learned_temperature_top_k": {"temperature": 0.9, "top_k": 5},
                                     "learned_temperature_top_k_2":
                                         {"temperature": 0.9, "top_k": 7}}
    assert got.merged_text == (
        "version: 1\nname: p\nsampling_variants:\n    mine: {temperature: 0.5}\n"
        "    learned_temperature_top_k: {temperature: 0.9, top_k: 5}\n"
        "    learned_temperature_top_k_2: {temperature: 0.9, top_k: 7}\n"
        "phases:\n- name: a\n  shapes:\n  - class: x\n    kind: extend\n    lengths: [8]\n"
        "- name: learned\n  shapes:\n    - class: learned_extends\n      kind: extend\n"
        "      why: learned prompt lengths, compiled after ready at step(s) 1 (single), "
        "2 (single), 3 (single) of audit-1.json\n      lengths: [9, 10, 11]\n"
        "    - class: learned_sampling\n      kind: sampling\n      why: learned sampling "
        "parameters, compiled after ready at step(s) 0 (single), 1 (single), 2 (single), "
        "3 (single) of audit-1.json\n"
        # the plan defines `mine` but never sends it; top_k is built in
        "      variants: [mine, top_k, learned_temperature_top_k, learned_temperature_top_k_2]\n"
        "      prompt: 8\n      decode_tokens: 8\n      concurrency: [1]\n")
    merged = loader.loads(got.merged_text, "merged.yaml")
    assert set(merged.sampling_variants) == {"mine", "learned_temperature_top_k",
                                             "learned_temperature_top_k_2"}


def test_errors_name_the_input_and_the_fix(tmp_path):
    plan = tmp_path / "small.yaml"
    plan.write_text(SMALL)
    manifest = tmp_path / "state" / "compile_log"
    manifest.mkdir(parents=True)
    (manifest / "compiles-1.jsonl").write_text("{}\n")
    cases = [
        (manifest / "compiles-1.jsonl",
         f"{manifest / 'compiles-1.jsonl'}: a compile log holds no traffic shapes"),
        (tmp_path / "state", f"{tmp_path / 'state'}: a compile log but no audit-*.json"),
        (tmp_path / "nope", f"{tmp_path / 'nope'}: no such file or directory"),
        (plan, f"{plan}: not JSON: Expecting value: line 1 column 1 (char 0)"),
    ]
    (tmp_path / "other.json").write_text('{"format": "x"}')
    cases.append((tmp_path / "other.json",
                  f"{tmp_path / 'other.json'}: not an audit file (no \"format\": "
                  "\"sglang-warmup-audit\")"))
    for source, message in cases:
        with pytest.raises(WarmupError) as err:
            learn.learn(source, plan)
        assert err.value.message == message
    with pytest.raises(WarmupError) as err:
        learn.merge_text("version: 1\nname: x\nphases: [{name: a, shapes: []}]\n",
                         {"name": "learned", "shapes": []}, {}, where="x.yaml")
    assert err.value.message == "x.yaml: phases is not a block list; learn cannot add to it"


def test_a_merged_plan_above_the_request_limit_is_refused(tmp_path):
    plan = tmp_path / "p.yaml"
    plan.write_text(SMALL.replace("version: 1\n", "version: 1\nlimits: {max_requests: 3}\n"))
    file = audit_file(tmp_path / "audit-1.json", [step(0, "burst", [10, 20, 30])])
    with pytest.raises(WarmupError) as err:
        learn.learn(file, plan)
    assert err.value.message == (f"the merged plan does not expand on the audited server: {plan}:13: "
                                 "phases[1].shapes[0]: class learned_concurrent: expansion limit: "
                                 "3 more request(s) would bring the plan to 5, above the limit of 3")


def test_write_refuses_an_existing_file_without_yes_and_the_old_flag_still_works(tmp_path,
                                                                                 capsys):
    plan = tmp_path / "small.yaml"
    plan.write_text(SMALL)
    file = audit_file(tmp_path / "audit-1.json", [step(0, "single", [3000], label="long")])
    code, out, err = cli(capsys, "learn", "--audits", str(file), "--plan", str(plan),
                         "--write", str(plan))
    assert (code, out) == (1, "")
    assert err.splitlines() == [f"error: --write {plan} exists",
                                "hint: pass -y to overwrite it, or choose another --write"]
    assert plan.read_text() == SMALL
    # --manifest, the old name of --audits, still works and says so; -y extends the plan in place
    code, out, err = cli(capsys, "learn", "--manifest", str(file), "--plan", str(plan),
                         "--write", str(plan), "-y", "--format", "json")
    assert code == 0, err
    assert err.splitlines() == ["note: --manifest is deprecated: it is spelled --audits now"]
    data = json.loads(out)
    assert data["written"] == str(plan) and [s["class"] for s in data["shapes"]] == [
        "learned_chunked"]
    assert "learned_chunked" in plan.read_text() and plan.read_text().startswith(SMALL)


# --- hostile audit files: one line naming the file, the step and the field ---------------------
_HOSTILE_AUDITS = [
    # prompt lengths a traffic file refuses are refused here too (one validator)
    ({"steps": [step(0, "single", [True])]},
     "steps[0]: prompts: expected a non-empty list of positive integers"),
    ({"steps": [step(0, "single", [1e308])]},
     "steps[0]: prompts: expected a non-empty list of positive integers"),
    ({"steps": [step(0, "single", [-5])]},
     "steps[0]: prompts: expected a non-empty list of positive integers"),
    ({"steps": [step(0, "single", [10**15])]},
     "steps[0]: prompts: at most 4,096 prompts of at most 10,000,000 tokens each"),
    ({"steps": [step(0, "burst", [5], sampling={"temperature": "hot"})]},
     "steps[0]: sampling.temperature: expected a finite number"),
    ({"steps": [step(0, "single", [5], prefix=5)]},
     "steps[0]: prefix: every prompt must be longer than the prefix (5)"),
    ({"steps": [dict(step(0, "single", [5]), index=-1)]},
     "steps[0]: index: expected an integer from 0 to 400,000"),
    ({"steps": [dict(step(0, "single", [5]), prefix_cached="yes")]},
     "steps[0]: prefix_cached: expected true or false"),
    ({"steps": [dict(step(0, "single", [5]), pass1={"misses": 10**30})]},
     "steps[0].pass1.misses: expected an integer from 0 to 1,000,000,000"),
    ({"steps": [dict(step(0, "single", [5]), pass2=[1])]}, "steps[0].pass2: expected an object"),
    ({"steps": [dict(step(0, "single", [5]), pass1={"misses": 1, "keys": [3]})]},
     "steps[0].pass1.keys: expected a list of objects"),
    ({"steps": ["x"]}, "steps[0]: expected an object"),
    ({"unattributed": [5]}, "unattributed: expected a list of objects"),
    ({"unattributed": [{"compiled": -1}]}, "unattributed.compiled: expected an integer from 0 to "
                                           "1,000,000,000"),
    ({"unseen_events": "many"}, "unseen_events: expected an integer from 0 to 1,000,000,000"),
    # facts: the names of what is missing or wrong, not ServerFacts' TypeError
    ({"facts": {}}, "facts: missing 22 fact(s): chunked_prefill_size, context_length, "
                    "decode_graph, decode_graph_bs, decode_graph_max_bs, disable_radix_cache, "
                    "disaggregation_mode, dp_size, enable_mixed_chunk, max_prefill_tokens, "
                    "max_req_input_len, max_running_requests, max_total_tokens, model_type, "
                    "page_size, prefill_graph_backend, prefill_graph_buckets, "
                    "prefill_graph_context, speculative_algorithm, tokenizer_worker_num, "
                    "tp_size, vocab_size"),
    ({"facts": dict(FACTS, page_size="x")},
     "facts: page_size: expected an integer from 1 to 2^40, not 'x'"),
    ({"facts": dict(FACTS, decode_graph_bs=5)},
     "facts: decode_graph_bs: expected a list of at most 1,024 integers from 1 to 2^40, not 5"),
    ({"facts": dict(FACTS, decode_graph="yes")}, "facts: decode_graph: expected true or false, "
                                                 "not 'yes'"),
    ({"facts": dict(FACTS, default_sampling_params={"temperature": "hot"})},
     "facts: default_sampling_params: expected an object of sampling parameters (finite "
     "numbers), not {'temperature': 'hot'}"),
    ({"facts": dict(FACTS, bogus=1)}, "facts: unknown fact(s): bogus"),
]


@pytest.mark.parametrize("change, message", _HOSTILE_AUDITS)
def test_a_hostile_audit_file_is_one_line_naming_the_field(tmp_path, capsys, change, message):
    plan = tmp_path / "small.yaml"
    plan.write_text(SMALL)
    file = audit_file(tmp_path / "audit-1.json", [step(0, "single", [5])])
    file.write_text(json.dumps(dict(json.loads(file.read_text()), **change)))
    code, out, err = cli(capsys, "learn", "--audits", str(file), "--plan", str(plan))
    assert (code, out) == (1, "")
    assert err.splitlines()[0] == f"error: {file}: {message}"
    assert len(err.splitlines()) == 2 and err.splitlines()[1].startswith("hint: ")


def test_the_plan_index_files_each_prompt_by_what_the_server_computes():
    """A chained prompt is a prefix hit on what the cache holds of it (the first width of the
    chain, which hits nothing, an extend); a prefix class's base an extend, its extends hits."""
    import _facts_cache

    from warmup.plan.expand import expand
    from warmup.plan.shipped import path as shipped

    facts = _facts_cache.resolve(("--model-path", "deepseek-ai/DeepSeek-V4.1-Flash",
                                  "--chunked-prefill-size", "4096", "--context-length", "131072",
                                  "--disable-prefill-cuda-graph"))
    index = learn._PlanIndex(expand(loader.load(shipped("deepseek_v4_serving_shapes")), facts))
    assert index.extend[4133] == "c128_widths"          # the chain's first: nothing to hit
    assert index.prefix[(8192, 16549)] == "c128_widths"  # hits 8,357's whole chunks
    assert index.prefix[(65536, 67621)] == "c128_widths"
    assert (16384, 16549) not in index.prefix and 16549 not in index.extend
    # the prefix class: its 4,096-token base computes whole (an extend), its extends hit it
    assert index.prefix[(4096, 4097)] == index.prefix[(4096, 8229)] == "prefix_hits"
    assert 4096 in index.extend
