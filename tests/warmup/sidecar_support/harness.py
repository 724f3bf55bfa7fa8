"""Helpers for the sidecar and prebake tests: run the SGLang stand-in as a real process, talk
HTTP, wait for conditions with a bound."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

SUPPORT = Path(__file__).resolve().parent
REPO = SUPPORT.parents[2]
PLAN = SUPPORT / "plan.yaml"
STANDIN = SUPPORT / "standin.py"
FAKE_SGLANG = SUPPORT / "fake_sglang"

#: prompt lengths the test plan sends against the stand-in's settings (one pass)
PLAN_PROMPT_LENS = [1, 16, 16, 16, 37, 64, 100]
PLAN_REQUESTS = 7


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def gone(pid: int) -> bool:
    """Whether process ``pid`` has ended."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    # a zombie not yet reaped by init is gone for our purposes
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"
    except OSError:
        return True


def get(url: str, timeout: float = 5.0) -> tuple[int | None, Any]:
    """GET url -> (status, parsed JSON or text); (None, reason) when nothing answered."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            status, data, ctype = r.status, r.read(), r.headers.get("Content-Type", "")
    except urllib.error.HTTPError as exc:
        status, data, ctype = exc.code, exc.read(), exc.headers.get("Content-Type", "")
    except (urllib.error.URLError, OSError) as exc:
        return None, str(exc)
    text = data.decode(errors="replace")
    return status, json.loads(text) if "json" in ctype else text


def wait_until(pred: Callable[[], Any], timeout: float, what: str, step: float = 0.05) -> Any:
    end = time.monotonic() + timeout
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() > end:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(step)


@dataclass
class Standin:
    proc: subprocess.Popen
    port: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stats(self) -> dict:
        status, body = get(self.url + "/_standin/stats")
        assert status == 200, body
        return body

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)


def start_standin(*args: str, port: int = 0, env: dict[str, str] | None = None,
                  timeout: float = 60.0) -> Standin:
    """Start the stand-in as its own process and wait until it listens."""
    full_env = dict(os.environ if env is None else env)
    full_env["PYTHONUNBUFFERED"] = "1"
    proc = subprocess.Popen([sys.executable, str(STANDIN), "--port", str(port), *args],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=full_env,
                            text=True, cwd=str(REPO))
    end = time.monotonic() + timeout
    assert proc.stdout is not None
    line = proc.stdout.readline()  # "PORT n", or the error that stopped it
    if not line.startswith("PORT ") or time.monotonic() > end:
        proc.kill()
        raise AssertionError(f"stand-in did not start: {line}{proc.stdout.read()}")
    return Standin(proc, int(line.split()[1]))
