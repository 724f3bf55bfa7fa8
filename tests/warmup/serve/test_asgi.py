"""warmup.serve.asgi: the plan's streamed requests through an HTTP app in-process.

SGLang's own ``http_server`` needs FastAPI, which the CPU profile lacks; the app here is a real
Starlette app (the framework under FastAPI, with the same ``StreamingResponse``) whose
``/generate`` does what SGLang's does for ``stream: true``: a real ``GenerateReqInput`` from the
JSON body, the tokenizer manager's ``generate_request``, one ``data:`` line per output and
``data: [DONE]``.  The tokenizer manager is the suite's stand-in (tests/warmup/conftest.py)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import textwrap
import time
import types
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.background import BackgroundTask
from starlette.middleware import Middleware
from starlette.middleware.base import BaseHTTPMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from _interpreter import python
from warmup import settings
from warmup.errors import HttpAppError, TransportError
from warmup.plan.model import WarmupRequest, WarmupStep
from warmup.serve import asgi, hook
from warmup.serve.transport import InProcessTransport

pytestmark = pytest.mark.usefixtures("warmup_isolated")

VOCAB = 20000


def sglang_like_app(tm: Any, *, api_key: str | None = None, seen: list | None = None,
                    after_answer: list | None = None) -> Starlette:
    """A Starlette app with SGLang's streamed ``/generate`` (http_server.generate_request: its
    background task sleeps 2 s after the answer, then records the request's id in
    ``after_answer``) and, with ``api_key``, a middleware that refuses requests without
    ``Bearer <key>``."""
    from sglang.srt.managers.io_struct import GenerateReqInput

    after_answer = after_answer if after_answer is not None else []

    async def generate(request: Request):
        body = await request.json()
        if seen is not None:
            seen.append(body)
        obj = GenerateReqInput(**body)

        async def stream_results():
            try:
                async for out in tm.generate_request(obj, request):
                    yield b"data: " + json.dumps(out).encode() + b"\n\n"
            except ValueError as e:
                yield b"data: " + json.dumps({"error": {"message": str(e)}}).encode() + b"\n\n"
            yield b"data: [DONE]\n\n"

        async def abort_after_answer():  # TokenizerManager.create_abort_task: 2 s, then abort
            await asyncio.sleep(2)
            after_answer.append(obj.rid)

        return StreamingResponse(stream_results(), media_type="text/event-stream",
                                 background=BackgroundTask(abort_after_answer))

    class ApiKey(BaseHTTPMiddleware):
        async def dispatch(self, request, call_next):
            if request.headers.get("authorization") != f"Bearer {api_key}":
                return JSONResponse({"error": "Unauthorized"}, status_code=401)
            return await call_next(request)

    return Starlette(routes=[Route("/generate", generate, methods=["POST"])],
                     middleware=[Middleware(ApiKey)] if api_key else [])


def req(n: int, *, stream: bool = True, mnt: int = 4) -> WarmupRequest:
    return WarmupRequest(input_len=n, max_new_tokens=mnt, sampling_name="greedy",
                         sampling_params=(("temperature", 0.0),), features=(("stream", True),) if stream else ())


def step(mode: str, requests) -> WarmupStep:
    return WarmupStep(index=0, phase="p", shape_class="streaming", kind="extend", mode=mode,
                      requests=tuple(requests), note="n")


def standin_http_server(monkeypatch, app: Any, tm: Any) -> None:
    """``sglang.srt.entrypoints.http_server`` as SGLang's server process holds it: ``app`` and
    ``_global_state.tokenizer_manager``."""
    module = types.ModuleType(asgi.HTTP_SERVER_MODULE)
    module.app = app
    module._global_state = types.SimpleNamespace(tokenizer_manager=tm)
    monkeypatch.setitem(sys.modules, asgi.HTTP_SERVER_MODULE, module)


def test_streamed_requests_go_through_the_app_and_the_others_do_not(fake_tokenizer_manager):
    tm = fake_tokenizer_manager()
    seen: list = []
    after: list = []
    t = InProcessTransport(tm, vocab_size=VOCAB,
                           http=asgi.AsgiApp(sglang_like_app(tm, seen=seen, after_answer=after)))

    async def send_then_wait_for_the_background():
        t0 = time.perf_counter()
        outs = await t.send(step("concurrent", [req(37), req(38, mnt=2)]))
        answered = time.perf_counter() - t0
        assert len(asgi._running) == 2 and not after    # SGLang's abort task still sleeping
        await asyncio.gather(*asgi._running)
        return outs, answered
    outs, answered = asyncio.run(send_then_wait_for_the_background())
    assert answered < 1.5 and all(o.latency_s < 1.5 for o in outs)   # not the 2 s after it
    assert len(after) == 2 and not asgi._running
    assert [(o.output_tokens, o.finish_reason) for o in outs] == [(4, "length"), (2, "length")]
    assert all(o.server_s is not None for o in outs)          # SGLang's meta_info came through
    assert [len(b["input_ids"]) for b in seen] == [37, 38] and all(b["stream"] for b in seen)
    assert [len(o.input_ids) for o in tm.objs] == [37, 38] and all(o.stream for o in tm.objs)
    asyncio.run(t.send(step("single", [req(39, stream=False)])))
    assert len(seen) == 2 and len(tm.objs) == 3                # not streamed: straight to the TM


def test_an_api_key_is_sent_as_sglang_checks_it(monkeypatch, fake_tokenizer_manager, sglang_server_args):
    tm = fake_tokenizer_manager()
    tm.server_args = types.SimpleNamespace(**vars(sglang_server_args))
    tm.server_args.api_key = "s3cret"
    app = sglang_like_app(tm, api_key="s3cret")
    assert asgi.of_server(tm) is None                          # no HTTP server module here
    standin_http_server(monkeypatch, app, tm)
    http = asgi.of_server(tm)
    assert http is not None and (b"authorization", b"Bearer s3cret") in http.headers
    t = InProcessTransport(tm, vocab_size=VOCAB, http=http)
    assert asyncio.run(t.send(step("single", [req(21)])))[0].output_tokens == 4
    # without the key: SGLang's middleware answers 401, in one line
    with pytest.raises(HttpAppError) as err:
        asyncio.run(asgi.AsgiApp(app).stream("/generate", {"input_ids": [5], "stream": True}))
    assert err.value.message == ('POST /generate (in-process HTTP) answered HTTP 401: '
                                 '{"error":"Unauthorized"}')


def test_an_app_that_cannot_carry_a_request_is_left_for_the_tokenizer_manager(
        fake_tokenizer_manager, caplog):
    """An app that answers no 200 (another SGLang's routes, an auth it did not expect) costs
    the warm-up nothing: that request and the later ones go to the tokenizer manager."""
    tm = fake_tokenizer_manager()
    calls = []

    async def refusing(scope, receive, send):
        calls.append(scope["path"])
        await asyncio.sleep(0)                                 # both requests in flight
        await send(start(404))
        await send(body(b"Not Found", False))
    t = InProcessTransport(tm, vocab_size=VOCAB, http=asgi.AsgiApp(refusing))
    with caplog.at_level("WARNING", logger="sglang_warmup.transport"):
        outs = asyncio.run(t.send(step("concurrent", [req(37), req(38)])))
        outs += asyncio.run(t.send(step("single", [req(39)])))
    assert [o.output_tokens for o in outs] == [4, 4, 4] and len(tm.objs) == 3
    assert calls == ["/generate", "/generate"] and t.http is None    # the two sent at once
    warnings = [r.getMessage() for r in caplog.records]
    assert warnings == ["sglang-warmup: POST /generate (in-process HTTP) answered HTTP 404: Not "
                        "Found; the plan's streamed requests go to the tokenizer manager instead"]


def test_an_error_inside_the_stream_fails_the_request(fake_tokenizer_manager):
    """After a 200 the answer is the request's: SGLang's error is a failure, not a fallback."""
    tm = fake_tokenizer_manager()
    tm.faults[41] = "error"
    t = InProcessTransport(tm, vocab_size=VOCAB, http=asgi.AsgiApp(sglang_like_app(tm)))
    with pytest.raises(TransportError) as err:
        asyncio.run(t.send(step("single", [req(41)])))
    assert not isinstance(err.value, HttpAppError) and t.http is not None
    assert err.value.message.startswith("/generate (stream) answered an error: ")
    assert len(tm.objs) == 1                                   # sent once


def test_the_app_of_another_tokenizer_manager_is_not_used(monkeypatch, fake_tokenizer_manager):
    tm, other = fake_tokenizer_manager(), fake_tokenizer_manager()
    standin_http_server(monkeypatch, sglang_like_app(other), other)
    assert asgi.of_server(tm) is None                          # e.g. a tokenizer worker's
    assert asgi.of_server(other) is not None


def test_the_hook_uses_the_app_unless_turned_off(monkeypatch, fake_tokenizer_manager):
    tm = fake_tokenizer_manager()
    standin_http_server(monkeypatch, sglang_like_app(tm), tm)
    assert settings.STREAM_OVER_HTTP.get() is True
    assert isinstance(hook._http_app(tm), asgi.AsgiApp)
    monkeypatch.setenv("WARMUP_STREAM_OVER_HTTP", "0")
    assert hook._http_app(tm) is None


def app_answering(*messages: dict[str, Any], raises: Exception | None = None):
    async def app(scope, receive, send):
        assert (await receive())["type"] == "http.request"
        for m in messages:
            await send(m)
        if raises is not None:
            raise raises
    return app


def start(status: int = 200) -> dict[str, Any]:
    return {"type": "http.response.start", "status": status, "headers": []}


def body(data: bytes, more: bool = True) -> dict[str, Any]:
    return {"type": "http.response.body", "body": data, "more_body": more}


@pytest.mark.parametrize("app, message, apps_failure", [
    (app_answering(start(), body(b'data: {"error": {"message": "The input (9 tokens) is longer '
                                 b'than the model\'s context length"}}\n\n'), body(b"", False)),
     "/generate (stream) answered an error: The input (9 tokens) is longer than the model's "
     "context length", False),
    (app_answering(start(), body(b"data: {not json\n\n", False)),
     "/generate (stream) answered a chunk that is not JSON", False),
    (app_answering(start(), body(b"data: [DONE]\n\n", False)),
     "POST /generate (in-process HTTP) answered no output", False),
    (app_answering(start(500), body(b"Internal Server Error\x1b[2J", False)),
     "POST /generate (in-process HTTP) answered HTTP 500: Internal Server Error\\x1b[2J", True),
    (app_answering(), "POST /generate (in-process HTTP) answered nothing", True),
    (app_answering(raises=RuntimeError("boom\nsecond line")),
     "POST /generate (in-process HTTP) raised RuntimeError: boom second line", True),
    (app_answering(start(), body(b'data: {"meta_info": {}}\n\n'), raises=KeyError("late")),
     "POST /generate (in-process HTTP) raised KeyError: 'late'", False),
])
def test_failures_are_one_line(app, message, apps_failure):
    with pytest.raises(TransportError) as err:
        asyncio.run(asgi.AsgiApp(app).stream("/generate", {"input_ids": [1]}))
    assert err.value.message == message and "\n" not in str(err.value)
    # no answer started: the app's failure (the request goes another way); after a 200: the request's
    assert isinstance(err.value, HttpAppError) is apps_failure


@pytest.mark.parametrize("body_, detail", [
    ({"input_ids": {1, 2}}, "Object of type set is not JSON serializable"),
    ({"sampling_params": {"temperature": float("nan")}},
     "Out of range float values are not JSON compliant"),
])
def test_a_body_json_cannot_carry_is_the_apps_failure_not_a_crash(body_, detail):
    sent = []

    async def app(scope, receive, send):
        sent.append(scope)
    with pytest.raises(HttpAppError) as err:
        asyncio.run(asgi.AsgiApp(app).stream("/generate", body_))
    assert err.value.message.startswith(f"POST /generate (in-process HTTP): the request is not "
                                        f"JSON ({detail}") and not sent


def test_a_failure_after_the_answer_is_logged_not_raised(caplog):
    out = {"output_ids": [5], "meta_info": {}}

    async def app(scope, receive, send):
        await receive()
        await send(start())
        await send(body(b"data: " + json.dumps(out).encode() + b"\n\n", False))
        await asyncio.sleep(0.05)                              # SGLang's background task
        raise RuntimeError("abort failed")

    async def run():
        got = await asgi.AsgiApp(app).stream("/generate", {})
        await asyncio.gather(*asgi._running, return_exceptions=True)
        return got
    with caplog.at_level("WARNING", logger="sglang_warmup.asgi"):
        assert asyncio.run(run()) == out
    assert [r.getMessage() for r in caplog.records] == [
        "sglang-warmup: POST /generate (in-process HTTP) failed after its answer: RuntimeError: "
        "abort failed"]


def test_chunks_split_anywhere_and_a_last_line_without_its_end():
    out = {"output_ids": [5, 6], "meta_info": {"finish_reason": {"type": "length"}}}
    data = b"data: " + json.dumps({"output_ids": [5]}).encode() + b"\n\ndata: " + json.dumps(out).encode()
    pieces = [body(data[i:i + 7]) for i in range(0, len(data), 7)]
    app = app_answering(start(), *pieces, body(b"", False))
    assert asyncio.run(asgi.AsgiApp(app).stream("/generate", {})) == out


def test_a_line_longer_than_the_limit_is_refused_without_holding_more(monkeypatch):
    monkeypatch.setattr(asgi, "MAX_STREAM_LINE_BYTES", 64)
    app = app_answering(start(), *[body(b"x" * 50)] * 100, body(b"", False))

    async def run():
        with pytest.raises(TransportError) as err:
            await asgi.AsgiApp(app).stream("/generate", {})
        return err.value.message
    assert asyncio.run(run()) == "POST /generate (in-process HTTP) answered a line longer than 64 bytes"


def test_a_timeout_cancels_the_request_inside_the_app(fake_tokenizer_manager):
    tm = fake_tokenizer_manager()
    tm.faults[33] = "hang"
    t = InProcessTransport(tm, timeout_s=0.3, vocab_size=VOCAB,
                           http=asgi.AsgiApp(sglang_like_app(tm)))
    with pytest.raises(asyncio.TimeoutError):
        asyncio.run(t.send(step("single", [req(33)])))
    assert tm.in_flight == 0                                   # the TM saw the cancellation


def test_the_first_stream_pays_the_event_stream_path_before_ready():
    """What the module is for: in a fresh interpreter, a streamed response through Starlette
    imports anyio's asyncio backend (its task group) the first time; after one in-process
    stream through the app, a client's first stream finds it loaded."""
    code = textwrap.dedent("""
        import asyncio, sys
        from starlette.applications import Starlette
        from starlette.responses import StreamingResponse
        from starlette.routing import Route
        from warmup.serve.asgi import AsgiApp

        async def generate(request):
            await request.json()
            async def chunks():
                yield b'data: {"output_ids": [1], "meta_info": {}}\\n\\n'
                yield b"data: [DONE]\\n\\n"
            return StreamingResponse(chunks(), media_type="text/event-stream")

        app = Starlette(routes=[Route("/generate", generate, methods=["POST"])])
        backend = "anyio._backends._asyncio"
        before = backend in sys.modules
        out = asyncio.run(AsgiApp(app).stream("/generate", {"stream": True}))
        print(before, backend in sys.modules, out["output_ids"])
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "True", "[1]"]


REAL_APP_PROBE = """
import asyncio, importlib.util, json, sys, time
from warmup.serve import asgi
from warmup.serve.transport import InProcessTransport
from warmup.plan.model import WarmupRequest, WarmupStep
model_dir, conftest_path, api_key = sys.argv[1:4]
spec = importlib.util.spec_from_file_location("warmup_conftest", conftest_path)
conftest = importlib.util.module_from_spec(spec)
sys.modules["warmup_conftest"] = conftest
spec.loader.exec_module(conftest)
from sglang.srt.server_args import prepare_server_args
from sglang.srt.arg_groups.model_override_base import model_config_of
from sglang.srt.managers.tokenizer_manager import TokenizerManager
import sglang.srt.entrypoints.http_server as http_server
from sglang.srt.utils.auth import add_api_key_middleware

args = ["--model-path", model_dir, "--device", "cuda", "--skip-tokenizer-init", *conftest.TINY_FLAGS]
sa = prepare_server_args(args + (["--api-key", api_key] if api_key else []))
sa.resolve_once()
tm = conftest.FakeTokenizerManager(sa, model_config_of(sa))
tm.create_abort_task = TokenizerManager.create_abort_task.__get__(tm)   # SGLang's own
http_server.set_global_state(http_server._GlobalState(tokenizer_manager=tm, template_manager=None,
                                                      scheduler_info={}))
if api_key:                                     # as SGLang's launch adds it
    add_api_key_middleware(http_server.app, api_key=api_key, admin_api_key=None)
app = asgi.of_server(tm)
transport = InProcessTransport(tm, vocab_size=conftest.TINY_VOCAB, http=app)
def req(n):
    return WarmupRequest(input_len=n, max_new_tokens=3, sampling_name="greedy",
                         sampling_params=(("temperature", 0.0),), features=(("stream", True),))
def step(mode, lengths):
    return WarmupStep(index=0, phase="p", shape_class="streaming", kind="extend", mode=mode,
                      requests=tuple(req(n) for n in lengths), note="n")
backend = "anyio._backends._asyncio"
report = {"found": app is not None, "backend_before": backend in sys.modules}
async def main():
    t0 = time.perf_counter()
    outs = await transport.send(step("single", [37])) + await transport.send(step("concurrent", [38, 39]))
    report["answered_s"] = time.perf_counter() - t0
    report["outs"] = [[o.output_tokens, o.finish_reason, o.server_s is not None] for o in outs]
    report["running_after"] = len(asgi._running)
    await asyncio.gather(*asgi._running)
    report["streamed_to_tm"] = [[len(o.input_ids), o.stream] for o in tm.objs]
    report["aborted"] = tm.aborted
    report["used_app"] = transport.http is not None
    report["bad_key"] = None
    try:
        json_only = ((b"content-type", b"application/json"),)      # no API key
        await asgi.AsgiApp(http_server.app, json_only).stream("/generate", {"input_ids": [5], "stream": True})
    except Exception as exc:
        report["bad_key"] = [type(exc).__name__, exc.message]
asyncio.run(main())
report["backend_after"] = backend in sys.modules
print("REPORT " + json.dumps(report))
"""


def test_sglangs_own_app_carries_the_streamed_requests(tiny_model_dir):
    """SGLang 0.5.22's real ``http_server.app`` (its ``/generate`` route, its contract check,
    SSE encoding, ``StreamingResponse`` with ``create_abort_task``, and the API-key middleware
    SGLang's launch adds for ``--api-key``) with the stand-in tokenizer manager behind it, in a
    fresh interpreter: importing the HTTP server installs uvloop's event loop policy.  The
    warm-up's requests carry the key; one without it is refused with 401."""
    from pathlib import Path

    api_key = "k3y"
    conftest_path = Path(__file__).resolve().parents[1] / "conftest.py"
    done = subprocess.run([python(), "-c", REAL_APP_PROBE, str(tiny_model_dir), str(conftest_path),
                           api_key], capture_output=True, text=True, timeout=300)
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("REPORT ")]
    assert done.returncode == 0 and lines, done.stderr[-3000:]
    report = json.loads(lines[-1][len("REPORT "):])
    assert report["found"] and report["used_app"]
    assert report["outs"] == [[3, "length", True]] * 3
    assert report["streamed_to_tm"] == [[37, True], [38, True], [39, True]]
    assert report["answered_s"] < 1.5 and report["running_after"] == 3   # not SGLang's 2 s after
    assert report["aborted"] == []            # the abort task found every request finished
    assert not report["backend_before"] and report["backend_after"]
    assert report["bad_key"][0] == "HttpAppError"
    assert report["bad_key"][1].startswith("POST /generate (in-process HTTP) answered HTTP 401")
