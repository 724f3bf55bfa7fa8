#!/usr/bin/env python3
"""Benchmark: the first streamed HTTP response of a process against its repeats, on a bare
FastAPI app served by uvicorn (no SGLang, no GPU), and the modules the first one loads.

SGLang's ``/generate`` answers ``stream: true`` with Starlette's ``StreamingResponse``, as the
app here does.  Each round is a fresh interpreter: two plain requests (the server's first
requests, as SGLang's own warm-up request is), then streamed ones.  The ``warm`` rounds first
send one streamed request through the app in-process over ASGI (``warmup.serve.asgi``, what the
warm-up does before ready) and then the same HTTP requests.

    .venv/bin/python scripts/bench_first_stream.py --rounds 5
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys

CHILD = r"""
import asyncio, http.client, json, socket, sys, threading, time
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse

app = FastAPI()

@app.post("/generate")
async def generate(request: Request):
    body = await request.json()
    if body.get("stream"):
        async def chunks():
            for i in range(3):
                await asyncio.sleep(0)
                yield b"data: " + json.dumps({"output_ids": [i], "meta_info": {}}).encode() + b"\n\n"
            yield b"data: [DONE]\n\n"
        return StreamingResponse(chunks(), media_type="text/event-stream")
    return {"output_ids": [1], "meta_info": {}}

sock = socket.socket(); sock.bind(("127.0.0.1", 0)); port = sock.getsockname()[1]; sock.close()
server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error"))

def run():
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    if sys.argv[1] == "warm":    # the warm-up: one streamed request in-process, before serving
        from warmup.serve.asgi import AsgiApp
        loop.run_until_complete(AsgiApp(app, ((b"content-type", b"application/json"),))
                                .stream("/generate", {"stream": True}))
    loop.run_until_complete(server.serve())

threading.Thread(target=run, daemon=True).start()
while not server.started:
    time.sleep(0.01)

def ms(stream):
    c = http.client.HTTPConnection("127.0.0.1", port)
    t = time.perf_counter()
    c.request("POST", "/generate", body=json.dumps({"stream": stream}),
              headers={"Content-Type": "application/json"})
    c.getresponse().read()
    return (time.perf_counter() - t) * 1e3

plain = [ms(False), ms(False)]
before = set(sys.modules)
first = ms(True)
loaded = sorted(set(sys.modules) - before)
repeats = [ms(True) for _ in range(3)]
print(json.dumps({"plain": plain, "first": first, "repeat": min(repeats), "loaded": loaded}))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    rows = {}
    for mode in ("cold", "warm"):
        runs = []
        for _ in range(args.rounds):
            out = subprocess.run([sys.executable, "-c", CHILD, mode], capture_output=True,
                                 text=True, check=True, timeout=120).stdout
            runs.append(json.loads(out.strip().splitlines()[-1]))
        rows[mode] = runs
    import fastapi
    import starlette
    import uvicorn
    from importlib.metadata import version
    print(f"FastAPI {fastapi.__version__}, Starlette {starlette.__version__}, anyio "
          f"{version('anyio')}, uvicorn {uvicorn.__version__}; {args.rounds} fresh interpreters "
          f"each\n")
    print("| before the port opens | first streamed response (ms) | repeat (ms) | first / repeat "
          "| modules the first one loaded |")
    print("|---|---:|---:|---:|---|")
    for mode, runs in rows.items():
        first = statistics.median(r["first"] for r in runs)
        repeat = statistics.median(r["repeat"] for r in runs)
        loaded = sorted({m for r in runs for m in r["loaded"]})
        label = "nothing" if mode == "cold" else "one in-process stream (warmup.serve.asgi)"
        print(f"| {label} | {first:.1f} ({min(r['first'] for r in runs):.1f}-"
              f"{max(r['first'] for r in runs):.1f}) | {repeat:.1f} | {first / repeat:.1f} "
              f"| {', '.join(loaded) or 'none'} |")


if __name__ == "__main__":
    main()
