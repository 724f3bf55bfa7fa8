"""Server facts from SGLang's own parser and resolution (real 0.5.22), /server_info, files."""

from __future__ import annotations

import json
from pathlib import Path

import _facts_cache
import pytest
from test_model_config import hub_cache

from warmup.plan import facts as F
from warmup.plan.model_config import hub_config_dir
from warmup.plan import facts_file
from warmup.errors import FactsError

DATA = Path(__file__).parents[1] / "data"


@pytest.fixture(scope="module")
def pr_facts() -> F.ServerFacts:
    return _facts_cache.pr44627()


@pytest.fixture(scope="module")
def tiny_dir() -> Path:
    return _facts_cache.tiny_model_dir()


def test_pr_launch_command_resolves_like_sglang(pr_facts):
    f = pr_facts
    assert f.source == "launch_flags"
    assert (f.chunked_prefill_size, f.page_size, f.max_running_requests) == (8192, 256, 16)
    assert f.prefill_graph_backend == "breakable" and f.prefill_graph
    assert f.prefill_graph_buckets == (128, 256, 512, 1024, 2048, 3072, 4096, 6144, 8192)
    assert f.prefill_graph_context == 262144
    assert (f.decode_graph, f.decode_graph_max_bs, f.decode_graph_bs) == (True, 8, (1, 2, 3, 4, 5, 6, 7, 8))
    assert f.model_type == "deepseek_v41"
    assert f.speculative_algorithm == "DSPARK"
    assert (f.enable_mixed_chunk, f.disable_radix_cache, f.disaggregation) == (False, False, False)
    assert f.max_total_tokens is None
    assert any(a.startswith("model config: the shipped stand-in for deepseek-ai/DeepSeek-V4.1-Flash")
               for a in f.assumed)
    assert any(a.startswith("device=cuda") for a in f.assumed)
    assert any(a.startswith("max_total_tokens=unknown") for a in f.assumed)


def test_resolution_leaves_the_environment_as_it_was(tiny_dir, monkeypatch):
    """SGLang's resolution redirects its third-party cache variables in the process; reading
    facts offline sets none of them here."""
    import os

    for name in ("TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR", "CUDA_CACHE_PATH",
                 "DG_JIT_CACHE_DIR", "TILELANG_CACHE_DIR", "FLASHINFER_WORKSPACE_BASE"):
        monkeypatch.delenv(name, raising=False)
    before = dict(os.environ)
    F.from_launch_flags(["--model-path", str(tiny_dir)])
    assert dict(os.environ) == before


def test_small_model_defaults(tiny_dir):
    f = F.from_launch_flags(["--model-path", str(tiny_dir)])
    assert f.page_size == 1 and f.context_length == 8192 and f.max_input_len == 8191
    assert f.chunked_prefill_size and f.chunked_prefill_size > 0
    assert f.vocab_size == 32000 and f.model_type == "qwen3_moe"
    assert f.decode_graph and f.decode_graph_max_bs
    assert "max_running_requests=unknown: derived from GPU memory at startup" in f.assumed


def test_flags_options_change_facts(tiny_dir):
    f = F.from_launch_flags(["--model-path", str(tiny_dir), "--disable-radix-cache", "--enable-mixed-chunk",
                             "--chunked-prefill-size", "2048", "--disable-cuda-graph"])
    assert (f.disable_radix_cache, f.enable_mixed_chunk, f.chunked_prefill_size) == (True, True, 2048)
    assert not f.decode_graph and not f.prefill_graph and f.decode_graph_max_bs is None


def test_hub_model_without_stand_in_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    with pytest.raises(FactsError) as info:
        F.from_launch_flags("--model-path some-org/unknown-model")
    assert info.value.message == (
        f"--model-path some-org/unknown-model: no local directory and no config.json in the "
        f"Hugging Face cache ({tmp_path / 'hub'}); pass --model-config DIR, a directory with the "
        "model's config.json")




@pytest.mark.parametrize("variable, value, hub", [("HF_HUB_CACHE", "hub", "hub"),
                                                  ("HF_HOME", "hf", "hf/hub"),
                                                  ("HOME", "", ".cache/huggingface/hub")])
def test_a_hub_model_id_reads_its_config_from_the_hugging_face_cache(
        tiny_dir, tmp_path, monkeypatch, variable, value, hub):
    """The README's own model id, found offline where huggingface_hub keeps it (HF_HUB_CACHE,
    HF_HOME, or ~/.cache/huggingface/hub)."""
    for name in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(variable, str(tmp_path / value))
    snapshot = hub_cache(tmp_path / hub, "Qwen/Qwen3-30B-A3B", tiny_dir / "config.json")
    assert hub_config_dir("Qwen/Qwen3-30B-A3B") == snapshot
    f = F.from_launch_flags("--model-path Qwen/Qwen3-30B-A3B --tp 2")
    assert f.model_type == "qwen3_moe" and f.vocab_size == 32000
    assert f"model config from the Hugging Face cache: {snapshot}" in f.assumed



def test_bad_flags_are_sglangs_one_line_without_its_usage(tiny_dir, capfd):
    """argparse prints SGLang's whole usage (466 lines) before its one error line: only that
    line is told, nothing else reaches stderr."""
    with pytest.raises(FactsError) as info:
        F.from_launch_flags(["--model-path", str(tiny_dir), "--no-such-flag"])
    assert info.value.message == ("SGLang rejected the launch flags: unrecognized arguments: "
                                  "--no-such-flag")
    assert "usage:" not in capfd.readouterr().err


@pytest.mark.parametrize("flags, problem", [('--model-path "/m', "no closing quotation"),
                                            ("--model-path /m\\", "no escaped character")])
def test_a_shell_slip_in_the_flags_is_one_line(flags, problem):
    with pytest.raises(FactsError) as info:
        F.from_launch_flags(flags)
    assert info.value.message == f"--server-args: {problem} in {flags!r}"


def test_server_info_round_trip(pr_facts):
    info = dict(chunked_prefill_size=8192, page_size=256, context_length=None, max_running_requests=None,
                cuda_graph_config={"decode": {"backend": "full", "max_bs": 8, "bs": [1, 2, 4, 8]},
                                   "prefill": {"backend": "disabled", "bs": [4, 8]}},
                enable_mixed_chunk=True, disable_radix_cache=False, disaggregation_mode="null",
                tp_size=1, dp_size=1, max_total_num_tokens=131072, max_req_input_len=40955,
                internal_states=[{"effective_max_running_requests_per_dp": 48}], version="0.5.17")
    f = F.from_server_info(info)
    assert (f.max_running_requests, f.max_total_tokens, f.max_req_input_len) == (48, 131072, 40955)
    assert f.enable_mixed_chunk and not f.prefill_graph and f.prefill_graph_buckets == ()
    assert f.sglang_version == "0.5.17" and f.source == "server_info"


def test_server_info_that_is_not_sglang():
    with pytest.raises(FactsError) as info:
        F.from_server_info({"hello": "world"})
    assert info.value.message == "the /server_info answer has no server settings"


def test_facts_file_round_trip(pr_facts, tmp_path):
    p = tmp_path / "facts.json"
    p.write_text(F.dump(pr_facts))
    assert facts_file.from_file(p) == pr_facts.__class__(**{**pr_facts.__dict__, "source": "file"})


def test_facts_file_errors(tmp_path):
    bad = tmp_path / "f.yaml"
    bad.write_text("prefill_graph_backend: disabled\nbogus: 1\n")
    with pytest.raises(FactsError) as info:
        facts_file.from_file(bad)
    assert info.value.message == f"{bad}: unknown fact(s): bogus"
    bad.write_text("- 1\n")
    with pytest.raises(FactsError) as info:
        facts_file.from_file(bad)
    assert info.value.message == f"{bad}: a facts file must be a mapping"


def test_flat_settings_file(tmp_path):
    p = tmp_path / "f.yaml"
    p.write_text("chunked_prefill_size: 4096\npage_size: 16\ncontext_length: 32768\nmax_running_requests: 64\n")
    f = facts_file.from_file(p)
    assert (f.chunked_prefill_size, f.page_size, f.context_length, f.max_running_requests) == (4096, 16, 32768, 64)
    assert f.prefill_graph_backend == "disabled"
    assert any(a.startswith("vocab_size=32000") for a in f.assumed)


def test_env_exposes_every_fact_name(pr_facts):
    env = pr_facts.env()
    assert set(env) == set(F.FACT_NAMES)
    json.dumps(env)  # plain values only


# --- hostile facts files: one line naming the file and the fact --------------------------------
_NINES = "9" * 5000


@pytest.mark.parametrize("text, message", [
    ("page_size: .inf", "server setting page_size=inf is not an integer"),
    ("page_size: 0", "page_size: expected an integer from 1 to 2^40, not 0"),
    ("context_length: -5", "context_length: expected an integer from 1 to 2^40, or null, not -5"),
    ("chunked_prefill_size: 100000000000000000000000000000",
     "chunked_prefill_size: expected an integer from 1 to 2^40, or null, not "
     "100000000000000000000000000000"),
    ("cuda_graph_config: 5", "server setting cuda_graph_config=5 is not a mapping"),
    ("cuda_graph_config: {decode: [1]}", "server setting cuda_graph_config.decode=[1] is not a "
                                         "mapping"),
    ("cuda_graph_bs: [a]", "server setting cuda_graph_bs='a' is not an integer"),
    ("cuda_graph_bs: 5", "server setting cuda_graph_bs=5 is not a list of integers"),
    ("cuda_graph_bs: [null]", "server setting cuda_graph_bs=[None] is not a list of integers"),
    ("cuda_graph_config: {decode: {max_bs: x}}", "server setting cuda_graph_max_bs='x' is not an "
                                                 "integer"),
    ("speculative_algorithm: [1]", "speculative_algorithm: expected text, or null, not [1]"),
    (f"page_size: {_NINES}", "not valid YAML/JSON: Exceeds the limit (4300 digits) for integer "
                             "string conversion: value has 5000 digits; use "
                             "sys.set_int_max_str_digits() to increase the limit"),
    ("[" * 100_000, "not valid YAML/JSON: nested too deeply"),
    ("prefill_graph_backend: disabled\npage_size: 1",
     "missing 20 fact(s): chunked_prefill_size, context_length, decode_graph, decode_graph_bs, "
     "decode_graph_max_bs, disable_radix_cache, disaggregation_mode, dp_size, enable_mixed_chunk, "
     "max_prefill_tokens, max_req_input_len, max_running_requests, max_total_tokens, model_type, "
     "prefill_graph_buckets, prefill_graph_context, speculative_algorithm, tokenizer_worker_num, "
     "tp_size, vocab_size"),
    ("context_length: .inf", "server setting context_length=inf is not an integer"),
    ("context_length: .nan", "server setting context_length=nan is not an integer"),
    ("max_req_input_len: 1.5", "server setting max_req_input_len=1.5 is not an integer"),
])
def test_hostile_facts_files_are_one_line(tmp_path, text, message):
    p = tmp_path / "facts.yaml"
    p.write_text(text + "\n")
    with pytest.raises(FactsError) as info:
        facts_file.from_file(p)
    assert info.value.message == f"{p}: {message}"


def test_a_facts_dump_with_a_wrong_value_names_it(pr_facts, tmp_path):
    p = tmp_path / "facts.json"
    for fact, value, what in [("page_size", "x", "an integer from 1 to 2^40"),
                              ("decode_graph_bs", [0], "a list of at most 1,024 integers from 1 "
                                                       "to 2^40"),
                              ("assumed", "x", "a list of texts"), ("tp_size", True,
                                                                    "an integer from 1 to 2^40")]:
        p.write_text(json.dumps(dict(json.loads(F.dump(pr_facts)), **{fact: value})))
        with pytest.raises(FactsError) as info:
            facts_file.from_file(p)
        assert info.value.message == f"{p}: {fact}: expected {what}, not {value!r}"


def test_a_json_facts_file_with_exponent_numbers_reads_them_as_numbers(tmp_path):
    """JSON writers print 5e5; YAML 1.1 would read it as the string '5e5'."""
    p = tmp_path / "facts.json"
    p.write_text('{"context_length": 1.31072e5, "max_total_num_tokens": 5e5, "page_size": 1}')
    f = facts_file.from_file(p)
    assert f.context_length == 131072 and f.max_total_tokens == 500000


@pytest.mark.parametrize("settings,buckets,expected", [
    ({"chunked_prefill_size": 4096, "max_prefill_tokens": 16384}, (), 4096),   # the chunk
    ({"chunked_prefill_size": 8192, "max_prefill_tokens": 6000}, (), 6000),    # max_prefill_tokens
    ({"chunked_prefill_size": 8192, "max_prefill_tokens": 16384}, (16, 2048), 2048),  # the graph
    ({"chunked_prefill_size": -1, "max_prefill_tokens": 20000}, (), 20000),    # chunked prefill off
    ({"chunked_prefill_size": 4096, "max_prefill_tokens": -1}, (), 4096),      # -1 sets no bound
    ({"chunked_prefill_size": 32768}, (), 16384),  # max_prefill_tokens unresolved: SGLang's default
    ({}, (), 16384),
])
def test_prefill_budget_is_the_least_limit_set(settings, buckets, expected):
    """What one prefill forward takes: the least of the chunk, the largest prefill graph and
    max_prefill_tokens (SGLang's default where unresolved, named as assumed); plans read it by
    name, and it stays out of the facts a steps record compares (a derived fact, not a field)."""
    import dataclasses

    f = F.from_settings({"page_size": 256, **settings}, source="server_args",
                        context_length=131072, vocab_size=129280)
    if buckets:
        f = dataclasses.replace(f, prefill_graph_backend="breakable", prefill_graph_buckets=buckets)
    assert f.prefill_budget == expected
    assert f.env()["prefill_budget"] == expected and "prefill_budget" in F.FACT_NAMES
    assert "prefill_budget" not in f.to_dict()
    assert ("max_prefill_tokens=16384: not resolved; SGLang's default" in f.assumed) == (
        "max_prefill_tokens" not in settings)


def test_a_dump_without_max_prefill_tokens_gets_sglangs_default():
    """A facts dump written before the default was assumed (``max_prefill_tokens: null``) reads
    as a facts file lacking it does: SGLang's 16,384, said in ``assumed``."""
    f = F.from_settings({"page_size": 256, "chunked_prefill_size": 32768}, source="file",
                        context_length=131072, vocab_size=129280)
    dumped = {**f.to_dict(), "max_prefill_tokens": None, "assumed": []}
    back = facts_file.from_dump(dumped, "old.json", hint="h")
    assert back.max_prefill_tokens == 16384 and back.prefill_budget == 16384
    assert back.assumed == ("max_prefill_tokens=16384: not resolved; SGLang's default",)
    assert facts_file.from_dump(f.to_dict(), "new.json", hint="h") == f  # a dump reads back
