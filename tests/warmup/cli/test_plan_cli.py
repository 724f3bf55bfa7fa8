"""`sglang-warmup plan …` through the real CLI entry point (one error boundary, exit codes)."""

from __future__ import annotations

import json

import _facts_cache
import pytest

from _cli import cli as run

from warmup.plan import facts as F


@pytest.fixture()
def pr_facts_file(tmp_path):
    p = tmp_path / "facts.json"
    p.write_text(F.dump(_facts_cache.pr44627()))
    return p


def test_check_ok(capsys):
    code, out, _ = run(capsys, "plan", "check", "default", "plans/deepseek_v4_serving_shapes.yaml")
    assert code == 0
    assert out.splitlines() == [
        "default: ok (default: 8 phases, 27 shape classes)",
        "plans/deepseek_v4_serving_shapes.yaml: ok (deepseek_v4_serving_shapes: 8 phases, 23 shape classes)"]


def test_check_bad_plan_is_one_line_and_exit_2(capsys, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("version: 1\nname: b\nphases:\n  - name: p\n    shapes:\n      - class: c\n"
                   "        kind: extend\n        lengths: [chunk]\n")
    code, out, err = run(capsys, "plan", "check", str(bad))
    assert code == 2 and out == ""
    assert err.splitlines() == [
        f"error: {bad}:8: phases[0].shapes[0].lengths[0]: `chunk`: unknown name 'chunk'",
        "hint: `sglang-warmup plan facts` lists the server facts"]


def test_show_table_lists_every_pr_class(capsys, pr_facts_file):
    code, out, _ = run(capsys, "plan", "show", "deepseek_v4_serving_shapes", "--facts", str(pr_facts_file))
    assert code == 0
    # what the radix cache holds of the prompts (prefix hits, the chained c128 widths) is not
    # computed again
    assert out.splitlines()[0] == ("plan deepseek_v4_serving_shapes: 257 steps, 651 requests, "
                                   "3,316,454 prompt tokens (961,254 computed, the rest cache "
                                   "hits); then flush the cache")
    for cls in ("extend_int_classes", "chunked_prompt", "prefix_hits", "concurrent_prefills", "batched_extends",
                "eager_decode", "past_context_bucket", "mixed_batches", "c128_widths",
                "sampling_families", "sampler_x_input_logprobs", "sampler_x_token_ids_logprobs"):
        assert cls in out
    assert "1, 219, 256, 4096, 5000, 8192" in out
    assert "524453, 526373" in out  # c128 widths: the smallest of each class of the 1M context


def test_the_tables_fit_the_terminal(capsys, pr_facts_file, monkeypatch):
    """On an 80-column terminal: total tokens, requests/step and phase go first, long cells are
    cut, the facts line wraps; off a terminal every column is kept."""
    from warmup.cli import output

    monkeypatch.setattr(output, "width", lambda: 80)
    code, out, _ = run(capsys, "plan", "show", "deepseek_v4_serving_shapes", "--facts",
                       str(pr_facts_file))
    assert code == 0 and max(map(len, out.splitlines())) <= 80, out
    assert any(x.split() == ["class", "kind", "steps", "requests", "prompt", "tokens"]
               for x in out.splitlines())
    monkeypatch.setattr(output, "width", lambda: None)
    code, wide, _ = run(capsys, "plan", "show", "deepseek_v4_serving_shapes", "--facts",
                        str(pr_facts_file))
    assert max(map(len, wide.splitlines())) > 150 and "requests/step" in wide


def test_a_capped_let_names_the_prompt_lengths_left_unwarmed(capsys, pr_facts_file):
    code, out, _ = run(capsys, "plan", "show", "deepseek_v4_serving_shapes", "--facts",
                       str(pr_facts_file), "--let", "long_cap=65536")
    assert code == 0
    # widths up to 512 (65,573 tokens, reached by 272's 34,853): they stand for every prompt
    # whose width is at most 512, up to 65,663 tokens
    assert "34853" in out and "65573" not in out and "65701" not in out
    line = next(x for x in out.splitlines() if x.startswith("long_context") and "65664.." in x)
    assert line.split(None, 3)[2] == "65664..1048448"
    assert line.split(None, 3)[3] == (
        "prompts of 65664..1048448 tokens are not warmed: the class covers prompts up to 65663 "
        "(a cap in the plan or --let); they compile at serving time")
    code, _, err = run(capsys, "plan", "show", "deepseek_v4_serving_shapes", "--facts",
                       str(pr_facts_file), "--let", "nope=1")
    assert code == 2
    assert err.splitlines() == ["error: --let: nope: the plan deepseek_v4_serving_shapes "
                                "defines no let 'nope'",
                                "hint: its lets: K, C, small_odd, above_K, long_cap, prefill_reqs"]


def test_show_json_is_the_expansion(capsys, pr_facts_file):
    code, out, _ = run(capsys, "plan", "show", "default", "--facts", str(pr_facts_file), "--format", "json")
    d = json.loads(out)
    assert code == 0 and d["plan"] == "default" and d["num_requests"] == sum(
        len(s["requests"]) + len(s["background"]) for s in d["steps"])


def test_show_needs_exactly_one_source(capsys):
    code, _, err = run(capsys, "plan", "show", "default")
    assert code == 2
    assert err.splitlines()[0] == "error: give exactly one of --server-args, --facts or --url"


def test_schema_command(capsys):
    code, out, _ = run(capsys, "plan", "schema")
    assert code == 0 and json.loads(out)["title"] == "sglang-warmup shape plan"


def test_plan_list_names_the_shipped_plans(capsys):
    code, out, _ = run(capsys, "plan", "list")
    assert code == 0
    lines = out.splitlines()
    assert lines[0].split() == ["name", "phases", "classes", "description"]
    assert [line.split()[0] for line in lines[2:]] == ["deepseek_v4_serving_shapes", "default"]
    code, out, _ = run(capsys, "plan", "list", "--format", "json")
    assert [p["name"] for p in json.loads(out)] == ["deepseek_v4_serving_shapes", "default"]


def test_an_unknown_plan_name_lists_the_shipped_ones(capsys):
    code, out, err = run(capsys, "plan", "check", "defualt")
    assert (code, out) == (2, "")
    assert err.splitlines() == [
        "error: defualt: no plan file, and no shipped plan of that name",
        "hint: shipped plans: deepseek_v4_serving_shapes, default (sglang-warmup plan list); "
        "or pass the path of a plan file"]


def test_the_readme_main_command_prints_the_expansion_and_nothing_of_sglangs(capsys):
    # README: plan show deepseek_v4_serving_shapes --server-args "$(cat …/pr44627.flags)".
    # SGLang's resolution warns ("Setting KV cache dtype to fp8_e4m3 …") and configures the root
    # logger; neither may reach our output without --verbose.
    import logging

    flags = (_facts_cache.DATA / "pr44627.flags").read_text()
    handlers = list(logging.getLogger().handlers)
    code, out, err = run(capsys, "plan", "show", "deepseek_v4_serving_shapes",
                         "--server-args", flags)
    assert code == 0, err
    assert out.startswith("plan deepseek_v4_serving_shapes: ")
    assert "eager_decode" in out and "facts (launch_flags): chunk=8192" in out
    # off a terminal, only the step's own lines (when it passed 2 s)
    assert [line for line in err.splitlines() if not line.startswith(RESOLVING)] == []
    assert logging.getLogger().handlers == handlers
    assert logging.getLogger("sglang").level == logging.NOTSET


RESOLVING = "resolving the launch flags with SGLang's parser"


def test_a_long_step_prints_step_lines_off_a_terminal(capsys, monkeypatch):
    """docs/architecture.md, Progress: off a terminal (CI logs) a step that passes 2 s prints
    its step line and its end; here every step counts as long."""
    from cache_tools.progress import Progress

    ticking = Progress.ticking
    monkeypatch.setattr(Progress, "ticking",
                        lambda self, label, **kw: ticking(self, label, **{**kw, "after_s": 0.0}))
    flags = f"--model-path {_facts_cache.tiny_model_dir()}"
    code, out, err = run(capsys, "plan", "show", "default", "--server-args", flags)
    assert code == 0, err
    lines = err.splitlines()
    assert lines[0] == RESOLVING + " ..." and lines[1].startswith(RESOLVING + ": done in ")
    assert len(lines) == 2 and "\r" not in err
    code, out, err = run(capsys, "plan", "show", "default", "--server-args", flags, "-q")
    assert code == 0 and err == ""  # --quiet: none


@pytest.mark.parametrize("command", [("plan", "show", "default"), ("plan", "facts")])
def test_an_unbalanced_quote_in_the_server_args_is_one_line(capsys, command):
    code, out, err = run(capsys, *command, "--server-args", '--model-path "/models/llama --tp 2')
    assert (code, out) == (2, "")
    assert err.splitlines() == [
        "error: --server-args: no closing quotation in '--model-path \"/models/llama --tp 2'",
        'hint: close the quote, e.g. --server-args "--model-path /m --tp 2"']
