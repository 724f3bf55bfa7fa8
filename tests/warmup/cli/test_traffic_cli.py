"""``sglang-warmup traffic synth | convert``: samples on stdout that ``warmup.coverage.traffic.load``
reads back; SGLang request logs written by SGLang 0.5.22's own RequestLogger."""

from __future__ import annotations

import json
from pathlib import Path

from _cli import cli
import pytest

from warmup.coverage import traffic




def reload(tmp_path: Path, text: str) -> list[traffic.TrafficStep]:
    path = tmp_path / "t.jsonl"
    path.write_text(text)
    return traffic.load(path)


# --- synth -------------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", traffic.KINDS)
def test_synth_writes_a_loadable_deterministic_sample(kind, tmp_path, capsys):
    code, out, _ = cli(capsys, "traffic", "synth", "--kind", kind, "--steps", "6", "--seed", "3",
                       "--max-prompt", "12000")
    assert code == 0
    assert out == traffic.dump(traffic.synth(kind, seed=3, steps=6, max_prompt=12000))
    steps = reload(tmp_path, out)
    assert steps == traffic.synth(kind, seed=3, steps=6, max_prompt=12000)
    assert len(steps) >= 6 and all(max(s.prompts) <= 12000 for s in steps)
    _, again, _ = cli(capsys, "traffic", "synth", "--kind", kind, "--steps", "6", "--seed", "3")
    _, other, _ = cli(capsys, "traffic", "synth", "--kind", kind, "--steps", "6", "--seed", "4")
    assert again == out and other != out


def test_synth_unknown_kind(capsys):
    """A bad --kind is a usage error (exit 2, the usage line), as the CLI documents."""
    code, out, err = cli(capsys, "traffic", "synth", "--kind", "video")
    assert (code, out) == (2, "")
    assert err.splitlines() == [
        "error: invalid value for '--kind': 'video' is not one of chat, rag, agent, batch, "
        "features",
        "hint: usage: sglang-warmup traffic synth [OPTIONS]; see `sglang-warmup traffic synth "
        "--help`"]


def test_synth_help_names_every_kind(capsys):
    code, out, _ = cli(capsys, "traffic", "synth", "--help")
    assert code == 0
    assert "chat | rag | agent | batch | features" in " ".join(out.split())


# --- convert --from openai --------------------------------------------------------------------

SYSTEM = "s" * 400  # 100 tokens at 4 characters a token


def test_convert_openai(tmp_path, capsys):
    lines = [
        {"model": "m", "messages": [{"role": "system", "content": SYSTEM},
                                    {"role": "user", "content": "x" * 40}],
         "max_tokens": 64, "temperature": 0.7, "top_p": 0.9},
        {"model": "m", "messages": [{"role": "system", "content": SYSTEM},
                                    {"role": "user", "content": "y" * 101}],
         "max_completion_tokens": 32, "seed": 7},
        {"model": "m", "prompt": "z" * 401, "max_tokens": 10, "top_k": 20, "stream": True},
        {"model": "m", "prompt": [1, 2, 3, 4, 5]},
        {"model": "m", "prompt": ["a" * 8, "b" * 12], "temperature": 0},
        {"custom_id": "r1", "method": "POST", "url": "/v1/chat/completions",
         "body": {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": [
             {"type": "text", "text": "q" * 80},
             {"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}]}},
        {"messages": [{"role": "user", "content": "hi"}], "usage": {"prompt_tokens": 321}},
        {"model": "m", "input_type": "nothing to convert"},
        {"custom_id": "e1", "method": "POST", "url": "/v1/embeddings",
         "body": {"model": "m", "input": "not a generate request"}},
    ]
    log = tmp_path / "requests.jsonl"
    log.write_text("".join(json.dumps(x) + "\n" for x in lines) + "\n")
    code, out, err = cli(capsys, "traffic", "convert", "--from", "openai", str(log))
    assert code == 0
    steps = reload(tmp_path, out)
    group = steps[0].prefix_group
    assert group is not None and group.startswith("sys-")
    assert steps == [
        traffic.TrafficStep("single", (110,), 64, {"temperature": 0.7, "top_p": 0.9}, group, 100,
                            "chat"),
        traffic.TrafficStep("single", (126,), 32, {"sampling_seed": 7}, group, 100, "chat"),
        traffic.TrafficStep("single", (101,), 10, {"top_k": 20}, None, 0, "completion", {"stream": True}),
        traffic.TrafficStep("single", (5,), 16, {}, None, 0, "completion"),
        traffic.TrafficStep("batch", (2, 3), 16, {"temperature": 0}, None, 0, "completion"),
        traffic.TrafficStep("single", (20,), 5, {}, None, 0, "chat"),
        traffic.TrafficStep("single", (321,), 16, {}, None, 0, "chat"),
    ]
    assert err.splitlines() == [
        "converted 8 request(s) into 7 traffic step(s); left out: 1 embedding requests, 1 "
        "without prompt, messages or token count",
        "note: token counts estimated as ceil(characters / 4) where no token count field was "
        "present; a system message shared by several requests is a prefix group; n, stream, "
        "logprobs, top_logprobs and echo become request features"]


def test_convert_openai_bad_line_names_file_and_line(tmp_path, capsys):
    log = tmp_path / "requests.jsonl"
    log.write_text('{"prompt": "a"}\n{"prompt": \n')
    code, out, err = cli(capsys, "traffic", "convert", "--from", "openai", str(log))
    assert (code, out) == (1, "")
    assert err.splitlines()[0].startswith(f"error: {log}:2: not JSON: ")
    assert err.splitlines()[1] == "hint: one JSON object per line"


def test_convert_unknown_format_and_empty_log(tmp_path, capsys):
    log = tmp_path / "empty.log"
    log.write_text("[2026-11-29 10:00:00] The server is fired up and ready to roll!\n")
    code, _, err = cli(capsys, "traffic", "convert", "--from", "vllm", str(log))
    assert (code, err.splitlines()[0]) == (
        2, "error: invalid value for '--from': 'vllm' is not one of openai, sglang-log")
    code, _, err = cli(capsys, "traffic", "convert", "--from", "sglang-log", str(log))
    assert (code, err.splitlines()[0]) == (1, f"error: {log}: no request could be converted")


# --- convert --from sglang-log (SGLang 0.5.22's RequestLogger) ---------------------------------

@pytest.fixture(scope="module")
def sglang_logging():
    from sglang.srt.managers.io_struct import GenerateReqInput
    from sglang.srt.utils.request_logger import RequestLogger

    return RequestLogger, GenerateReqInput


def write_log(sglang_logging, directory: Path, fmt: str, level: int, requests: list[dict]) -> Path:
    """Log ``requests`` (received, then finished) the way the TokenizerManager does."""
    RequestLogger, GenerateReqInput = sglang_logging
    logger = RequestLogger(log_requests=True, log_requests_level=level, log_requests_format=fmt,
                           log_requests_target=[str(directory)])
    for r in requests:
        obj = GenerateReqInput(input_ids=[11] * r["prompt"], rid=r["rid"],
                               sampling_params=r.get("sampling", {"max_new_tokens": 16}))
        obj.normalize_batch_and_arguments()
        logger.log_received_request(obj)
    for r in requests:
        meta = {"id": r["rid"], "finish_reason": {"type": r.get("finish", "length")},
                "prompt_tokens": r["prompt"], "weight_version": "default", "num_retractions": 0,
                "reasoning_tokens": 0, "completion_tokens": r["completion"],
                "cached_tokens": r.get("cached", 0), "e2e_latency": 0.25}
        if "received_ts" in r:  # --enable-metrics adds the request's arrival time
            meta["request_received_ts"] = r["received_ts"]
        obj = GenerateReqInput(input_ids=[11] * r["prompt"], rid=r["rid"],
                               sampling_params=r.get("sampling", {"max_new_tokens": 16}))
        obj.normalize_batch_and_arguments()
        logger.log_finished_request(obj, {"text": "out", "output_ids": [5] * r["completion"],
                                          "meta_info": meta})
    for target in logger.targets:
        for handler in target.handlers:
            handler.flush()
    (path,) = directory.glob("*.log")
    return path


T0 = 1_795_000_000.0
REQUESTS = [
    {"rid": "a", "prompt": 300, "completion": 20, "received_ts": T0,
     "sampling": {"temperature": 0.7, "top_p": 0.9, "max_new_tokens": 32}},
    {"rid": "b", "prompt": 310, "completion": 7, "received_ts": T0 + 0.004, "cached": 256,
     "sampling": {"temperature": 0.7, "top_p": 0.9, "max_new_tokens": 32}},
    {"rid": "c", "prompt": 5000, "completion": 1, "received_ts": T0 + 1.5,
     "sampling": {"temperature": 0.0, "max_new_tokens": 1}},
    {"rid": "d", "prompt": 40, "completion": 3, "received_ts": T0 + 2.0, "finish": "abort"},
    {"rid": "e", "prompt": 290, "completion": 9, "received_ts": T0 + 2.5, "cached": 256,
     "sampling": {"top_k": 5, "max_new_tokens": 9}},
]


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_convert_sglang_log_with_arrival_times(sglang_logging, tmp_path, capsys, fmt):
    log = write_log(sglang_logging, tmp_path / "logs", fmt, 1, REQUESTS)
    code, out, err = cli(capsys, "traffic", "convert", "--from", "sglang-log", str(log))
    assert code == 0
    assert reload(tmp_path, out) == [
        # a and b arrived 4 ms apart: one burst; only b hit the cache, so no shared prefix
        traffic.TrafficStep("burst", (300, 310), 20, {"temperature": 0.7, "top_p": 0.9}, None, 0,
                            "log_burst"),
        traffic.TrafficStep("single", (5000,), 1, {"temperature": 0.0}, None, 0, "log"),
        traffic.TrafficStep("single", (290,), 9, {"top_k": 5}, "cached256", 256, "log"),
    ]
    assert err.splitlines() == [
        "converted 4 request(s) into 3 traffic step(s); left out: 1 aborted",
        "note: prompt and completion lengths are SGLang's own token counts; a prompt that hit the "
        "radix cache for N tokens shares an N-token prefix group"]


def test_convert_sglang_log_text_without_metrics_replays_one_by_one(sglang_logging, tmp_path,
                                                                    capsys):
    requests = [{k: v for k, v in r.items() if k != "received_ts"} for r in REQUESTS]
    log = write_log(sglang_logging, tmp_path / "logs", "text", 0, requests)  # level 0: no sampling
    code, out, err = cli(capsys, "traffic", "convert", "--from", "sglang-log", str(log))
    assert code == 0
    assert [(s.kind, s.prompts, s.sampling, s.prefix_len) for s in reload(tmp_path, out)] == [
        ("single", (300,), {}, 0), ("single", (310,), {}, 256), ("single", (5000,), {}, 0),
        ("single", (290,), {}, 256)]
    assert err.splitlines()[-1] == (
        "note: 4 request(s) have only whole-second times (text format without --enable-metrics): "
        "they are replayed one by one, not as bursts")


def test_convert_sglang_log_json_joins_arrival_from_received_lines(sglang_logging, tmp_path,
                                                                   capsys):
    # Without --enable-metrics the JSON format still stamps each received line (microseconds):
    # requests received together are one burst.
    requests = [{k: v for k, v in r.items() if k != "received_ts"} for r in REQUESTS[:2]]
    log = write_log(sglang_logging, tmp_path / "logs", "json", 1, requests)
    code, out, _ = cli(capsys, "traffic", "convert", "--from", "sglang-log", str(log),
                       "--burst-window-ms", "1000")
    assert code == 0
    assert [(s.kind, s.prompts) for s in reload(tmp_path, out)] == [("burst", (300, 310))]
